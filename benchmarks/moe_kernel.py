"""MoE expert kernels on one GPU: Qwen3-30B-A3B's and Mixtral-8x7B's expert shapes (read from
configs/*.json) at 64, 1,024 and 8,192 tokens, bf16 and FP8 experts, uniform random routing
(k distinct experts per token), dummy weights.

Candidates (benchmarks/moe_candidates.py): ``triton`` (worker.kernels.fused_moe),
``triton-tile`` and ``triton-fast`` (the same with ``fp8_sums`` "tile" and "fast": FP8 cells only), ``flashinfer`` (cutlass_fused_moe;
in a child process, since its first call JIT-builds for minutes and may fail: the child gets
what is left of ``--budget-s`` and its result, or why there is none, is reported), ``loop``
(torch loop over experts, FP8 through torch._scaled_mm: the speed baseline). Every candidate's
error, the loop's included, is measured against worker.kernels.moe.experts_loop (float32 sums,
FP8 products exact); ``--truth`` adds each one's error against the float64 truth (the same
weights, nothing rounded or quantized between the GEMMs) beside the loop's own, as the norm
ratio ||got - truth|| / ||truth|| and the max ratio: how much of the FP8 error is the kernel's.
``--kernels`` adds, for the Triton candidates, the time of each GPU kernel of one call (align,
quantization, the two GEMMs, the sum: torch.profiler), to see where a call's time goes.

Per cell: median of ``--reps`` calls between CUDA events after 3 warm-up calls, replayed from
a CUDA graph where the call captures (the loop syncs on the host, so it runs eagerly);
TFLOP/s counts 2 * T * k * (H * 2I + I * H); weight TB/s counts the bytes of the experts at
least one token selected (``active``, from the routing). Prints one JSON line per row as it
goes, a Markdown table last, and writes everything with ``--out``.

    python benchmarks/moe_kernel.py --out moe.json                        # ~3 min on an H200
    python benchmarks/moe_kernel.py --candidates flashinfer --budget-s 570  # its JIT build, a call of its own
    python benchmarks/moe_kernel.py --sweep --models qwen3-30b-a3b --dtypes bf16   # Triton tiles per cell
    python benchmarks/moe_kernel.py --sweep --wide --candidates triton-tile,triton-fast --dtypes fp8 \
        --tokens 1024,8192 --write-tiles moe_tiles.json     # RADIXQ_MOE_TILES=moe_tiles.json uses them
    python benchmarks/moe_kernel.py --sweep --swap --dtypes fp8 --tokens 64,1024  # transposed decode tiles
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from model_shape import ModelShape  # noqa: E402
from moe_candidates import (  # noqa: E402
    FP8_ONLY,
    GRAPHED,
    PREPARE,
    TRITON_SUMS,
    ExpertShape,
    Inputs,
    Layer,
    kernel_times,
    oracle,
    time_call,
    truth,
)

from tests.moe_oracle import relative_error, truth_errors  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODELS = ("qwen3-30b-a3b", "mixtral-8x7b")


def expert_shape(model: str) -> ExpertShape:
    shape = ModelShape.from_config(json.loads((REPO / "configs" / f"{model}.json").read_text()))
    return ExpertShape(shape.num_experts, shape.top_k, shape.hidden, shape.expert_intermediate)


def measure(args: argparse.Namespace, model: str, layer: Layer, inputs: Inputs, reference: torch.Tensor,
            candidate: str, tiles: object = None, exact: tuple | None = None) -> dict:  # fmt: skip
    """One row: the candidate's time and rates on these inputs, or why it has none; with
    ``exact`` (the float64 truth and the loop's errors against it) its errors against that too."""
    shape, tokens = layer.shape, inputs.x.shape[0]
    row = {"model": model, "dtype": "fp8" if layer.fp8 else "bf16", "tokens": tokens, "candidate": candidate,
           "active_experts": inputs.active_experts}  # fmt: skip
    try:
        call = PREPARE[candidate](layer, inputs, tiles) if tiles else PREPARE[candidate](layer, inputs)
        got = call()
        row["rel_err"] = relative_error(got, reference)
        if exact is not None:
            truth_64, (row["loop_truth_rms"], row["loop_truth_max"]) = exact
            row["truth_rms"], row["truth_max"] = truth_errors(got, truth_64)
        del got
        ms, row["mode"] = time_call(call, args.reps, GRAPHED[candidate])
        if args.kernels and candidate in TRITON_SUMS:
            row["kernels_us"] = kernel_times(call)
            print(f"kernels {candidate} {model} {row['dtype']} {tokens}: " + ", ".join(
                f"{name} {us:,.1f} us" for name, us in row["kernels_us"].items()), flush=True)  # fmt: skip
    except Exception as e:  # noqa: BLE001 - a candidate that fails is reported, the rest go on
        torch.cuda.synchronize()
        return {**row, "status": f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    seconds = ms * 1e-3
    weight_bytes = row["active_experts"] * shape.expert_bytes(layer.fp8)
    return {**row, "status": "ok", "time_us": ms * 1e3, "tflops": shape.flops(tokens) / seconds / 1e12,
            "weight_tbps": weight_bytes / seconds / 1e12}  # fmt: skip


def truth_cell(layer: Layer, inputs: Inputs, reference: torch.Tensor) -> tuple:
    """(the float64 truth of this cell, the loop's (rms, max) errors against it): once a cell."""
    exact = truth(layer, inputs)
    return exact, truth_errors(reference, exact)


def bench(args: argparse.Namespace, candidates: list[str], deadline: float, emit) -> None:
    """Every (model, dtype, tokens) cell for these candidates, until the deadline."""
    for model in args.models.split(","):
        shape = expert_shape(model)
        for dtype in args.dtypes.split(","):
            layer = Layer.random(shape, fp8=dtype == "fp8")
            for tokens in (int(t) for t in args.tokens.split(",")):
                if time.perf_counter() > deadline:
                    for c in candidates:
                        emit({"model": model, "dtype": dtype, "tokens": tokens, "candidate": c,
                              "status": "skipped: --budget-s spent"})  # fmt: skip
                    continue
                inputs = Inputs.random(shape, tokens, seed=tokens)
                reference = oracle(layer, inputs)
                exact = truth_cell(layer, inputs, reference) if args.truth else None
                for candidate in candidates:
                    if candidate in FP8_ONLY and not layer.fp8:
                        continue
                    if candidate in TRITON_SUMS and args.sweep:
                        sweep(args, model, layer, inputs, reference, emit, candidate)
                    else:
                        emit(measure(args, model, layer, inputs, reference, candidate, exact=exact))
                del inputs, reference, exact
            del layer
            torch.cuda.empty_cache()


def sweep(
    args: argparse.Namespace,
    model: str,
    layer: Layer,
    inputs: Inputs,
    reference: torch.Tensor,
    emit,
    candidate: str = "triton",
) -> None:
    """A Triton candidate under the tiles moe_tiles picks for this cell now, then each tile
    configuration of moe_tiles.sweep_tiles; the best last."""
    from worker.kernels.moe_tiles import moe_tiles, sweep_tiles, tile_kind

    rows = []
    kind = tile_kind(layer.fp8, TRITON_SUMS[candidate])
    shape = layer.shape
    picked = moe_tiles(shape.num_experts, shape.hidden, shape.inter, inputs.x.shape[0] * shape.top_k, kind)
    candidates = dict.fromkeys([picked, *sweep_tiles(kind, wide=args.wide, swap=args.swap)])
    for tiles in candidates:
        row = {**measure(args, model, layer, inputs, reference, candidate, tiles), "tiles": asdict(tiles)}
        rows.append(row)
        took = f"{row['time_us']:,.1f} us" if row["status"] == "ok" else row["status"]
        print(f"sweep {candidate} {model} {row['dtype']} {row['tokens']} tokens, {tiles}: {took}", flush=True)
    ok = [r for r in rows if r["status"] == "ok"]
    best = min(ok, key=lambda r: r["time_us"]) if ok else rows[0]
    emit({**best, "candidate": f"{candidate} (best tiles)", "best_tiles": best.get("tiles")})


def write_tiles(rows: list[dict], path: str) -> None:
    """The sweep's best tiles as a RADIXQ_MOE_TILES table (worker.kernels.moe_tiles): per
    model and kind, the best of each token count up to its rows per expert; below the smallest
    count and above the largest, the buckets moe_tiles uses now (a decode-sized sweep leaves
    prefill's tiles as they are)."""
    from worker.kernels.moe_tiles import MoeTiles, table_to_json, tile_kind, tile_table

    best: dict[tuple, list[tuple[float, MoeTiles]]] = {}
    for r in rows:
        if r.get("best_tiles") and r.get("status") == "ok":
            shape = expert_shape(r["model"])
            kind = tile_kind(r["dtype"] == "fp8", TRITON_SUMS[r["candidate"].split(" ")[0]])
            key = (shape.num_experts, shape.hidden, shape.inter, kind)
            tiles = MoeTiles(**r["best_tiles"])
            best.setdefault(key, []).append((r["tokens"] * shape.top_k / shape.num_experts, tiles))
    tables = {}
    for key, measured in best.items():
        measured.sort(key=lambda item: item[0])
        now = tile_table(key)
        below = [(b, t) for b, t in now if b < measured[0][0]]
        above = [(b, t) for b, t in now if b > measured[-1][0]]  # ends unbounded: every table does
        tables[key] = (*below, *measured, *above)
    Path(path).write_text(table_to_json(tables))
    print(f"moe_kernel: wrote {len(tables)} measured tables to {path}", flush=True)


def run_flashinfer(args: argparse.Namespace, seconds: float) -> list[dict]:
    """The flashinfer candidate in a child process of at most ``seconds`` (its JIT build may
    take longer, or fail); its rows, or one row saying why there are none."""
    if seconds < 30:
        return [{"candidate": "flashinfer", "status": "skipped: no time left (run --candidates flashinfer)"}]
    out = Path(args.work_dir) / "moe_flashinfer_rows.json"
    log = Path(args.work_dir) / "moe_flashinfer.log"
    out.unlink(missing_ok=True)
    env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": str(REPO / ".cache" / "flashinfer-moe")}
    command = [sys.executable, __file__, "--child-out", str(out), "--candidates", "flashinfer",
               "--budget-s", str(seconds - 10), "--models", args.models, "--dtypes", args.dtypes,
               "--tokens", args.tokens, "--reps", str(args.reps)]  # fmt: skip
    start = time.perf_counter()
    with open(log, "w") as log_file:
        child = subprocess.Popen(
            command, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            child.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGTERM)  # NOTE: its whole group: the JIT's ninja and nvcc too
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    rows = json.loads(out.read_text()) if out.exists() else []
    tail = log.read_text(errors="replace").strip().splitlines()[-8:] if log.exists() else []
    if not rows:
        why = (
            "build or first call not finished"
            if child.returncode in (-15, -9)
            else f"exit {child.returncode}"
        )
        rows = [
            {
                "candidate": "flashinfer",
                "status": f"no result after {time.perf_counter() - start:.0f} s: {why}",
            }
        ]
        print("flashinfer child log (last lines):\n  " + "\n  ".join(tail), flush=True)
    return rows


def child_build(args: argparse.Namespace) -> None:
    """In the child: the first flashinfer call (its JIT build, timed), then the cells."""
    shape = expert_shape(args.models.split(",")[0])
    start = time.perf_counter()
    layer = Layer.random(ExpertShape(shape.num_experts, shape.top_k, shape.hidden, 256), fp8=False)
    PREPARE["flashinfer"](layer, Inputs.random(layer.shape, 4, seed=0))()
    torch.cuda.synchronize()
    print(f"flashinfer: cutlass_fused_moe built and ran in {time.perf_counter() - start:.1f} s", flush=True)


def print_table(rows: list[dict]) -> None:
    loop_us = {(r["model"], r["dtype"], r["tokens"]): r["time_us"] for r in rows
               if r.get("candidate") == "loop" and r.get("status") == "ok"}  # fmt: skip
    print(
        "\n| model | experts | tokens | kernel | mode | time (us) | TFLOP/s | weight TB/s | active experts | vs loop "
        "| error vs experts_loop | vs float64 (rms, max) | loop vs float64 (rms, max) |"
    )
    print("| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        head = (
            f"| {r.get('model', '-')} | {r.get('dtype', '-')} | {r.get('tokens', '-')} | {r['candidate']} |"
        )
        if r.get("status") != "ok":
            print(f"{head} - | {r['status']} | | | | | | | |")
            continue
        loop = loop_us.get((r["model"], r["dtype"], r["tokens"]))
        speedup = f"{loop / r['time_us']:.1f}x" if loop else "-"
        print(
            f"{head} {r['mode']} | {r['time_us']:,.1f} | {r['tflops']:.1f} | {r['weight_tbps']:.2f} | "
            f"{r['active_experts']} | {speedup} | {r['rel_err']:.1e} | {_truth(r, '')} | {_truth(r, 'loop_')} |"
        )


def _truth(row: dict, prefix: str) -> str:
    if f"{prefix}truth_rms" not in row:
        return "-"
    return f"{row[prefix + 'truth_rms']:.2e}, {row[prefix + 'truth_max']:.1e}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(MODELS), help="configs/NAME.json with MoE layers")
    parser.add_argument("--dtypes", default="bf16,fp8")
    parser.add_argument("--tokens", default="64,1024,8192")
    parser.add_argument("--candidates", default="triton,triton-fast,loop,flashinfer")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--budget-s", type=float, default=170.0, help="cells past it are skipped")
    parser.add_argument("--sweep", action="store_true", help="time the Triton kernel under every sweep tile")
    parser.add_argument("--wide", action="store_true", help="--sweep: also other block_k and stage counts")
    parser.add_argument(
        "--swap", action="store_true", help="--sweep: the rule's tiles and transposed (swap_ab) ones"
    )
    parser.add_argument(
        "--write-tiles", default=None, help="--sweep: write the best tiles for RADIXQ_MOE_TILES"
    )
    parser.add_argument("--truth", action="store_true", help="errors against the float64 truth too")
    parser.add_argument(
        "--kernels", action="store_true", help="Triton candidates: time per GPU kernel of a call"
    )
    parser.add_argument(
        "--work-dir", default=os.environ.get("OUT", "/tmp"), help="the flashinfer child's log"
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)  # the flashinfer child's rows
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    began = time.perf_counter()
    deadline = began + args.budget_s
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.child_out:  # after every row: a child cut off at its limit keeps what ended
            Path(args.child_out).write_text(json.dumps(rows))

    print(f"moe_kernel: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    candidates = [c for c in args.candidates.split(",") if c]
    if args.child_out:
        child_build(args)
        bench(args, candidates, deadline, emit)
        return rows
    bench(args, [c for c in candidates if c != "flashinfer"], deadline - 10, emit)
    if "flashinfer" in candidates:
        for row in run_flashinfer(args, deadline - time.perf_counter()):
            emit(row)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "args": vars(args)}, indent=1))
    if args.write_tiles:
        write_tiles(rows, args.write_tiles)
    print(f"\nmoe_kernel: {time.perf_counter() - began:.0f} s")
    print_table(rows)
    return rows


if __name__ == "__main__":
    main()

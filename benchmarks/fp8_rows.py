"""The per-row FP8 quantizer (worker.kernels.ops.quantize_fp8_rows) as the engine launches it
against the schedule it replaced, interleaved, at the shapes the engine quantizes:

    now       rows of at most 4,096 values read once, several rows a program (768 wide: four)
    before    one row a program, read twice (its maximum, then its values): what every width
              ran until 2026-12-05, and what rows wider than 4,096 still run

Shapes (rows x width): 8192x768 and 65536x768 are Qwen3-30B-A3B's MoE intermediate at decode's
1,024 tokens and at a prefill chunk of 8,192 (x top-8); 1024x4096 and 8192x4096 the input of
Llama-3.1-8B's O projection at decode and prefill; 2048x14336 Mixtral-8x7B's intermediate at
decode (two passes either way: the control). Each cell: GPU us per call (20 calls in one CUDA
graph, median of ``--reps`` replays), bytes moved per second (bf16 in, e4m3 and a scale out),
and whether the two write the same bytes.

    python benchmarks/fp8_rows.py
    TRITON_INTERPRET=1 python benchmarks/fp8_rows.py --device cpu --shapes 6x96,3x5000 --reps 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_timing import captured, event_ms  # noqa: E402

from worker.kernels import ops  # noqa: E402

SHAPES = "8192x768,65536x768,1024x4096,8192x4096,2048x14336"
CALLS = 20


def before(x: torch.Tensor) -> ops.Fp8Rows:
    """The replaced schedule: one program a row, two passes over it."""
    return ops._fp8_rows(ops._triton(), x, x.shape[1], act=None, two_pass=True)


VARIANTS: dict[str, Callable[[torch.Tensor], ops.Fp8Rows]] = {"now": ops.quantize_fp8_rows, "before": before}


def timer(fn: Callable[[], object]) -> Callable[[], float]:
    """us per call: a CUDA graph of CALLS calls replayed between events (CUDA), or one call's
    wall time (CPU)."""
    if not torch.cuda.is_available():
        return lambda: event_ms(fn) * 1e3
    graph, _ = captured(lambda: [fn() for _ in range(CALLS)])
    return lambda: event_ms(graph.replay) * 1e3 / CALLS


def bench(rows: int, width: int, reps: int, device: str) -> dict:
    gen = torch.Generator(device=device).manual_seed(rows + width)
    x = (3 * torch.randn(rows, width, device=device, generator=gen)).bfloat16()
    now, old = (fn(x) for fn in VARIANTS.values())
    same = torch.equal(now.data.view(torch.uint8), old.data.view(torch.uint8)) and torch.equal(
        now.scale, old.scale
    )
    timers = {name: timer(lambda fn=fn: fn(x)) for name, fn in VARIANTS.items()}
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(reps):  # interleaved
        for name, time_one in timers.items():
            times[name].append(time_one())
    moved = rows * width * 3 + rows * 4  # bf16 in, e4m3 out, a float32 scale a row
    row: dict = {"rows": rows, "width": width, "same_bytes": same}
    for name, t in times.items():
        row[f"{name}_us"] = statistics.median(t)
        row[f"{name}_TBps"] = moved / (row[f"{name}_us"] * 1e-6) / 1e12
    row["before_over_now"] = row["before_us"] / row["now_us"]
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=SHAPES, help="comma list of ROWSxWIDTH")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if ops._kernels_for(torch.empty(0, device=args.device)) is None:
        parser.error("needs the Triton kernels: CUDA, or --device cpu under TRITON_INTERPRET=1")
    results = []
    print("| rows x width | now (us) | before (us) | before / now | now TB/s | before TB/s | same bytes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for shape in args.shapes.split(","):
        rows, width = (int(v) for v in shape.split("x"))
        r = bench(rows, width, args.reps, args.device)
        results.append(r)
        print(f"| {rows}x{width} | {r['now_us']:.1f} | {r['before_us']:.1f} | {r['before_over_now']:.2f} | "
              f"{r['now_TBps']:.2f} | {r['before_TBps']:.2f} | {r['same_bytes']} |", flush=True)  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()

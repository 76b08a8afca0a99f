"""The at-scale benchmark: 1,024 requests x 1,000 prompt / 1,000 output tokens (issue 13).

Random prompt ids in [0, 10000] (``random.Random(seed + round)``: every round draws fresh
prompts, so no run hits another's cached prefixes; checked), ``max_tokens`` 1,000, EOS
ignored, temperature 0.6, dummy bf16 weights. The figure is output tokens / wall seconds of
the timed region, after a warm-up outside it.

Variants are ``MODE[:KV[:WEIGHTS]]``: MODE ``engine`` (``worker.LLM`` in this process) or
``queue`` (redis-server -> ``radixq worker`` -> collector, from the first XADD to the last
result written); KV, when given, is passed as the engine option ``kv_cache_dtype`` (``auto``,
``fp8_e4m3``); without it the option is not passed at all (``--kv-cache-dtype`` sets it
for every variant); WEIGHTS is the engine option ``quantization`` (``none``, ``fp8``;
``--quantization`` sets it for every variant that names none). Protocol: ``--rounds N`` rounds, each running every variant once in
turn (interleaved, one engine at a time, each built afresh); the median counts. By default
(``--rounds 0``) N is 3 when every run of the first round took over 30 s, else 5 (issue
13). Beside each figure: the floor of the shape (benchmarks/floor.py: weights x steps + KV reads + prefill
FLOPs at 4.3 TB/s and 790 TFLOP/s) with at most ``max_running_reqs`` running, and the floor
with the KV pool the engine actually had.

    python benchmarks/at_scale.py --preset llama-3.1-8b
    python benchmarks/at_scale.py --preset qwen3-0.6b --variants engine:auto,engine:fp8_e4m3
    python benchmarks/at_scale.py --preset llama-3.1-8b --kv-cache-dtype fp8_e4m3 --variants engine,queue
    python benchmarks/at_scale.py --preset llama-3.1-8b --variants engine:fp8_e4m3:fp8,engine:fp8_e4m3:none
    python benchmarks/at_scale.py --preset tiny --variants engine,queue       # CPU, seconds

``--deadline-s S`` skips a run that would end past S seconds from the start (judged by that
variant's last run), so a device call with a hard limit still prints its table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor import KV_BYTES, Floor, ModelShape, shape_floor  # noqa: E402
from offline import Workload  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Preset:
    model: str  # a config.json for dummy weights
    num_requests: int
    prompt_len: int
    output_len: int
    max_running_reqs: int
    max_prefill_tokens: int = 8192
    token_id_high: int = 10000  # prompt ids are drawn from [0, token_id_high]

    def describe(self) -> str:
        return f"{self.num_requests} requests x {self.prompt_len}/{self.output_len} tokens"

    @property
    def max_seq_len(self) -> int:
        """Room for the longest request, in whole 16-token pages (keeps the slot tables small)."""
        return -(-(self.prompt_len + self.output_len) // 16) * 16


PRESETS = {
    "llama-3.1-8b": Preset(str(REPO / "configs/llama-3.1-8b.json"), 1024, 1000, 1000, 1024),
    "qwen3-0.6b": Preset(str(REPO / "configs/qwen3-0.6b.json"), 1024, 1000, 1000, 1024),
    # CPU: seconds end to end, every path exercised (more requests than slots: admission waits)
    "tiny": Preset(str(REPO / "configs/tiny-llama.json"), 6, 36, 12, 4, 256, token_id_high=500),
}


@dataclass(frozen=True)
class Variant:
    mode: str  # "engine" | "queue"
    kv_cache_dtype: str | None
    quantization: str | None = None

    @classmethod
    def parse(cls, text: str, default_kv: str | None, default_quantization: str | None = None) -> Variant:
        mode, _, rest = text.strip().partition(":")
        kv, _, quantization = rest.partition(":")
        if mode not in ("engine", "queue"):
            raise ValueError(f"variant {text!r}: MODE must be engine or queue")
        return cls(mode, kv or default_kv, quantization or default_quantization)

    @property
    def name(self) -> str:
        return (
            self.mode
            + (f" kv={self.kv_cache_dtype}" if self.kv_cache_dtype else "")
            + (f" w={self.quantization}" if self.quantization else "")
        )

    @property
    def engine(self) -> Variant:
        """The engine-alone variant of the same KV and weights (a queue run's baseline)."""
        return Variant("engine", self.kv_cache_dtype, self.quantization)


def at_scale_workload(preset: Preset, seed: int) -> Workload:
    rng = random.Random(seed)
    prompts = [
        [rng.randint(0, preset.token_id_high) for _ in range(preset.prompt_len)]
        for _ in range(preset.num_requests)
    ]
    return Workload(prompts, [preset.output_len] * preset.num_requests)


def engine_options(
    args: argparse.Namespace, preset: Preset, kv_cache_dtype: str | None, quantization: str | None = None
) -> dict[str, Any]:
    """Engine and scheduler options of a run; ``kv_cache_dtype`` and ``quantization`` only when given."""
    max_running = args.max_running_reqs or preset.max_running_reqs
    options: dict[str, Any] = {
        "load_format": "dummy",
        "max_running_reqs": max_running,
        "cuda_graph_max_bs": args.cuda_graph_max_bs or max_running,
        "max_prefill_tokens": args.max_prefill_tokens or preset.max_prefill_tokens,
        "max_seq_len": preset.max_seq_len,
        "page_size": args.page_size,
    }
    optional = {
        "mem_fraction": args.mem_fraction,
        "num_pages": args.num_pages,
        "device": args.device,
        "attention": args.attention,
        "kv_cache_dtype": kv_cache_dtype,
        "quantization": quantization,
    }
    options.update({k: v for k, v in optional.items() if v is not None})
    return options


def floors(
    preset: Preset, kv: str | None, max_running: int, pool_tokens: int | None, fp8_weights: bool = False
) -> tuple[Floor, Floor | None]:
    """The shape's floor (at most ``max_running`` at once) and the floor with this KV pool."""
    shape = ModelShape.from_config(json.loads(Path(preset.model).read_text()))
    prompts = [preset.prompt_len] * preset.num_requests
    outputs = [preset.output_len] * preset.num_requests
    kv_bytes = KV_BYTES.get(kv or "auto", 2)
    common = dict(kv_bytes=kv_bytes, fp8_weights=fp8_weights, max_running=max_running)
    ideal = shape_floor(shape, prompts, outputs, **common)  # type: ignore[arg-type]
    if pool_tokens is None or pool_tokens < preset.prompt_len + preset.output_len:
        return ideal, None
    pooled = shape_floor(shape, prompts, outputs, kv_capacity_tokens=pool_tokens, **common)  # type: ignore[arg-type]
    return ideal, pooled


def protocol_rounds(first_round_s: list[float]) -> int:
    """Issue 13's protocol: a median of at least 5, or 3 when every run takes over 30 s."""
    return 3 if first_round_s and min(first_round_s) > 30 else 5


def summarize(
    args: argparse.Namespace, preset: Preset, variants: list[Variant], records: list, rounds: int
) -> list[dict]:
    """Print the table (stdout is what comes back from a device run) and return its rows."""
    max_running = args.max_running_reqs or preset.max_running_reqs
    rows = []
    for v in variants:
        runs = [r for r in records if r.variant == v.name]
        if not runs:
            continue
        median_s = statistics.median(r.seconds for r in runs)
        engine_name = v.engine.name  # a queue run's pool: its engine's
        pages = [r for r in records if r.variant == engine_name and r.kv_pages]
        pool_tokens = pages[0].kv_pages * pages[0].page_size if pages else None
        ideal, pooled = floors(preset, v.kv_cache_dtype, max_running, pool_tokens, v.quantization == "fp8")
        tokens = runs[0].output_tokens
        row = {
            "variant": v.name,
            "runs_s": [round(r.seconds, 3) for r in runs],
            "median_s": median_s,
            "tok_per_s": tokens / median_s,
            "floor_s": ideal.total_s,
            "pool_floor_s": pooled.total_s if pooled else None,
            "pool_tokens": pool_tokens,
            "max_decode_batch": max((r.max_decode_batch or 0) for r in runs) or None,
            "retractions": max((r.retractions or 0) for r in runs)
            if runs[0].retractions is not None
            else None,
            "startup_s": statistics.median(r.startup_s for r in runs),
            "graph_max_bs": max((r.graph_batch_sizes or [0])[-1] for r in runs) or None,
            "eager_decode_steps": max((r.eager_decode_steps or 0) for r in runs)
            if runs[0].eager_decode_steps is not None
            else None,
            "eager_batch_max": max((r.eager_batch_max or 0) for r in runs) or None,
        }
        rows.append(row)
    print(
        f"\nat-scale {args.preset}: {preset.describe()}, temperature {args.temperature}, "
        f"max_running_reqs {max_running}, seed {args.seed}, {rounds} round(s) interleaved"
    )
    print(
        f"{'variant':<22} {'n':>2} {'median s':>9} {'tok/s':>8} {'floor s':>8} {'of fl.':>6} "
        f"{'pool fl.':>8} {'of pf.':>6} {'max B':>6} {'retr':>5} {'vs 1st':>7}"
    )
    for row in rows:
        pool = row["pool_floor_s"]
        print(
            f"{row['variant']:<22} {len(row['runs_s']):>2} {row['median_s']:>9.2f} {row['tok_per_s']:>8.0f} "
            f"{row['floor_s']:>8.2f} {row['floor_s'] / row['median_s']:>6.0%} "
            + (f"{pool:>8.2f} {pool / row['median_s']:>6.0%} " if pool else f"{'-':>8} {'-':>6} ")
            + f"{row['max_decode_batch'] or '-':>6} {row['retractions'] if row['retractions'] is not None else '-':>5} "
            f"{row['tok_per_s'] / rows[0]['tok_per_s']:>7.3f}"
        )
    for row in rows:
        eager = (
            f"; graphs to {row['graph_max_bs']}, eager decode steps {row['eager_decode_steps']}"
            + (f" (batches up to {row['eager_batch_max']})" if row["eager_batch_max"] else "")
            if row["eager_decode_steps"] is not None
            else ""
        )
        print(f"  {row['variant']}: runs {row['runs_s']} s; startup median {row['startup_s']:.1f} s"
              + (f"; KV pool {row['pool_tokens']:,} tokens" if row["pool_tokens"] else "") + eager)  # fmt: skip
    by_name = {row["variant"]: row for row in rows}
    for v in variants:
        engine = by_name.get(v.engine.name)
        if v.mode == "queue" and v.name in by_name and engine:
            overhead = by_name[v.name]["median_s"] / engine["median_s"] - 1
            by_name[v.name]["overhead"] = overhead
            print(
                f"queue overhead ({v.name} vs {engine['variant']}): {100 * overhead:+.2f}% of the engine alone"
            )
    return rows


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _device() -> str:
    import torch

    if not torch.cuda.is_available():
        return f"cpu, torch {torch.__version__}"
    return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama-3.1-8b")
    parser.add_argument("--variants", default="engine", help="comma list of MODE[:KV] (module docstring)")
    parser.add_argument(
        "--kv-cache-dtype", default=None, help="KV for variants that name none (auto, fp8_e4m3)"
    )
    parser.add_argument(
        "--quantization", default=None, help="weights for variants that name none (none, fp8)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="interleaved rounds, the median counts (0: 3 if runs take > 30 s, else 5)",
    )
    parser.add_argument("--seed", type=int, default=0, help="round r draws its prompts with seed + r")
    parser.add_argument("--num-requests", type=int, default=None, help="override the preset's")
    parser.add_argument("--max-running-reqs", type=int, default=None, help="default: the preset's (1024)")
    parser.add_argument("--cuda-graph-max-bs", type=int, default=None, help="default: max_running_reqs")
    parser.add_argument("--max-prefill-tokens", type=int, default=None)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--mem-fraction", type=float, default=None)
    parser.add_argument("--num-pages", type=int, default=None, help="fix the KV pool (default: from memory)")
    parser.add_argument("--device", default=None, help="engine device (default: auto)")
    parser.add_argument("--attention", default=None, help="auto | flashinfer | torch")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--deadline-s", type=float, default=None, help="skip runs that would end past this")
    parser.add_argument("--timeout-s", type=float, default=900, help="queue runs: longest wait for results")
    parser.add_argument("--work-dir", default=None, help="queue runs: worker configs, logs, result files")
    parser.add_argument("--out", default=None, help="write every run and the table as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    from at_scale_runs import run_engine, run_queue, warmup_workload

    preset = PRESETS[args.preset]
    if args.num_requests:
        preset = Preset(**{**preset.__dict__, "num_requests": args.num_requests})
    variants = [
        Variant.parse(t, args.kv_cache_dtype, args.quantization)
        for t in args.variants.split(",")
        if t.strip()
    ]
    if len({v.name for v in variants}) != len(variants):
        raise SystemExit(f"--variants {args.variants!r} names a variant twice")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="radixq-atscale-"))
    work.mkdir(parents=True, exist_ok=True)
    warmup = warmup_workload(preset.prompt_len, preset.output_len)
    print(
        f"at_scale: commit {_commit()}, {_device()}, {preset.describe()}, variants {[v.name for v in variants]}"
    )
    redis = None
    if any(v.mode == "queue" for v in variants):
        from producer.local_redis import LocalRedis

        redis = LocalRedis(use_server=True, fsync="everysec").start()
    records: list = []
    last_wall: dict[str, float] = {}
    began = time.perf_counter()
    try:
        rounds, round_ = args.rounds or 1, 0
        while round_ < rounds:
            workload = at_scale_workload(preset, args.seed + round_)
            for v in variants:
                elapsed = time.perf_counter() - began
                if args.deadline_s and elapsed + last_wall.get(v.name, 0.0) > args.deadline_s:
                    print(f"deadline: round {round_} {v.name} skipped at {elapsed:.0f} s")
                    continue
                options = engine_options(args, preset, v.kv_cache_dtype, v.quantization)
                start = time.perf_counter()
                if v.mode == "engine":
                    record = run_engine(
                        v.name, round_, preset.model, options, workload, warmup, args.temperature
                    )
                else:
                    pinned = [r for r in records if r.variant == v.engine.name]
                    if pinned and args.num_pages is None:  # NOTE: the same KV pool as the engine alone
                        options["num_pages"] = pinned[-1].kv_pages
                    assert redis is not None
                    record = run_queue(
                        v.name, round_, preset.model, options, workload, warmup, args.temperature,
                        redis.url, work, args.timeout_s,
                    )  # fmt: skip
                last_wall[v.name] = time.perf_counter() - start
                records.append(record)
                if args.out:  # after every run: a call cut off at its time limit keeps what ended
                    _write(args.out, args, records, None)
                print(
                    f"round {round_} {v.name}: {record.seconds:.2f} s, {record.tok_per_s:,.0f} tok/s "
                    f"(startup {record.startup_s:.1f} s; max decode batch {record.max_decode_batch}, "
                    f"prefill steps {record.prefill_steps}, retractions {record.retractions}, "
                    f"KV pages {record.kv_pages}; graphs to "
                    f"{record.graph_batch_sizes[-1] if record.graph_batch_sizes else None}, "
                    f"eager decode steps {record.eager_decode_steps}"
                    + (f" up to batch {record.eager_batch_max}" if record.eager_batch_max else "")
                    + ")",
                    flush=True,
                )
            if round_ == 0 and not args.rounds:
                rounds = protocol_rounds([r.seconds for r in records])
                print(
                    f"protocol: {rounds} rounds (median of {rounds}; first-round runs {'all' if rounds == 3 else 'not all'} over 30 s)"
                )
            round_ += 1
    finally:
        if redis is not None:
            redis.stop()
    rows = summarize(args, preset, variants, records, rounds)
    if args.out:
        _write(args.out, args, records, rows)
    return rows


def _write(path: str, args: argparse.Namespace, records: list, rows: list[dict] | None) -> None:
    report = {"args": vars(args), "runs": [r.to_json() for r in records], "table": rows}
    Path(path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

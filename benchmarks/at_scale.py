"""The at-scale benchmark: 1,024 requests x 1,000 prompt / 1,000 output tokens (issue 13).

Random prompt ids in [0, 10000] (``random.Random(seed + round)``: every round draws fresh
prompts, so no run hits another's cached prefixes; checked), ``max_tokens`` 1,000, EOS
ignored, temperature 0.6, dummy bf16 weights. The figure is output tokens / wall seconds of
the timed region, after a warm-up outside it. ``--preset`` takes a comma list of models
(presets below: Llama-3.1-8B, Qwen3-0.6B, and the published shapes of Qwen3-30B-A3B,
Mixtral-8x7B, Gemma-3-12B, Mistral-7B-v0.3, Phi-4); their runs interleave too.

Variants are ``MODE[:KV[:WEIGHTS]]``: MODE ``engine`` (``worker.LLM`` in this process) or
``queue`` (redis-server -> ``radixq worker`` -> collector, from the first XADD to the last
result written), ``queue-tpN`` (one worker whose model is split over N GPUs: tensor
parallelism) or ``queue-Nw`` (N workers on the one queue, a GPU each: a pool; ``queue-tpN-Mw``
both); KV, when given, is passed as the engine option ``kv_cache_dtype`` (``auto``,
``fp8_e4m3``); without it the option is not passed at all (``--kv-cache-dtype`` sets it
for every variant); WEIGHTS is the engine option ``quantization`` (``none``, ``fp8``;
``--quantization`` sets it for every variant that names none); further ``:KEY=VALUE`` fields
are engine options of that variant alone (``engine:fp8_e4m3:fp8:moe_fp8_sums=tile``; VALUE
read as JSON when it parses, else as a string). Protocol: ``--rounds N`` rounds, each running every variant once in
turn (interleaved, one engine at a time, each built afresh; with several presets, every
variant of the first, then of the next, in each round); the median counts. By default
(``--rounds 0``) N is 3 when every run of the first round took over 30 s, else 5 (issue
13). Beside each figure: the floor of the shape (benchmarks/floor.py: weights x steps + KV reads + prefill
FLOPs at 4.3 TB/s and 790 TFLOP/s, the H200's) with at most ``max_running_reqs`` running, the floor
with the KV pool the engine actually had, and the first at this card's copy bandwidth and bf16
GEMM rate, measured after the runs (floor.measure_ceilings: on an H100, what "of floor" means there).

    python benchmarks/at_scale.py --preset llama-3.1-8b
    python benchmarks/at_scale.py --preset qwen3-0.6b --variants engine:auto,engine:fp8_e4m3
    python benchmarks/at_scale.py --preset llama-3.1-8b --kv-cache-dtype fp8_e4m3 --variants engine,queue
    python benchmarks/at_scale.py --preset llama-3.1-8b --variants engine:fp8_e4m3:fp8,engine:fp8_e4m3:none
    python benchmarks/at_scale.py --preset qwen3-30b-a3b,llama-3.1-8b --variants engine:fp8_e4m3:fp8 --rounds 3
    python benchmarks/at_scale.py --preset tiny --variants engine,queue       # CPU, seconds

``--profile-steps`` watches each engine run with the scheduler's StepProfiler (CUDA events
around every pass) and prints, per variant, the median GPU ms of a decode step at its largest
batch, of prefill per 8,192 tokens (mixed steps: their decode rows included), the host ms of a
full decode step and the GPU's busy share: the per-step breakdown beside the figure.

``--deadline-s S`` skips a run that would end past S seconds from the start (judged by that
variant's last run), so a device call with a hard limit still prints its table.
``--same-workers`` (with ``--rounds N``) starts a queue variant's workers once for all its N
rounds, run back to back (fresh prompts each round, as always; with several presets, preset
by preset), which saves N - 1 start-ups and gives up the interleaving. Tensor parallelism
against a pool, on two GPUs:

    python benchmarks/at_scale.py --preset llama-3.1-8b --kv-cache-dtype fp8_e4m3 --quantization fp8 \
        --variants queue,queue-tp2,queue-2w --rounds 3 --same-workers
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from at_scale_report import print_presets_table, summarize  # noqa: E402
from floor import measure_ceilings  # noqa: E402
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


def _at_scale(config: str) -> Preset:
    """1,024 requests x 1,000 prompt / 1,000 output tokens, 1,024 running, on configs/CONFIG.json."""
    return Preset(str(REPO / "configs" / f"{config}.json"), 1024, 1000, 1000, 1024)


PRESETS = {
    "llama-3.1-8b": _at_scale("llama-3.1-8b"),
    "qwen3-0.6b": _at_scale("qwen3-0.6b"),
    "qwen3-30b-a3b": _at_scale("qwen3-30b-a3b"),  # MoE: 128 experts, top-8
    "mixtral-8x7b": _at_scale("mixtral-8x7b"),  # MoE: 8 experts, top-2; 47B (FP8 weights fit one GPU)
    "gemma-3-12b": _at_scale("gemma-3-12b"),  # the text part of Gemma3ForConditionalGeneration
    "mistral-7b": _at_scale("mistral-7b-v0.3"),
    "phi-4": _at_scale("phi-4"),
    # CPU: seconds end to end, every path exercised (more requests than slots: admission waits)
    "tiny": Preset(str(REPO / "configs/tiny-llama.json"), 6, 36, 12, 4, 256, token_id_high=500),
}


QUEUE_MODE = re.compile(r"queue(?:-tp(?P<tp>[1-9]\d*))?(?:-(?P<workers>[1-9]\d*)w)?")


@dataclass(frozen=True)
class Variant:
    mode: str  # "engine" | "queue" | "queue-tpN" | "queue-Nw" | "queue-tpN-Mw"
    kv_cache_dtype: str | None
    quantization: str | None = None
    options: tuple[tuple[str, Any], ...] = ()  # further engine options, KEY=VALUE fields

    @classmethod
    def parse(cls, text: str, default_kv: str | None, default_quantization: str | None = None) -> Variant:
        parts = text.strip().split(":")
        mode, kv, quantization, fields = parts[0], "".join(parts[1:2]), "".join(parts[2:3]), parts[3:]
        if mode != "engine" and not QUEUE_MODE.fullmatch(mode):
            raise ValueError(f"variant {text!r}: MODE must be engine or queue (queue-tpN, queue-Nw)")
        options = []
        for field in fields:
            key, sep, value = field.partition("=")
            if not sep or not key:
                raise ValueError(f"variant {text!r}: {field!r} is not KEY=VALUE")
            try:
                options.append((key, json.loads(value)))
            except json.JSONDecodeError:
                options.append((key, value))
        return cls(mode, kv or default_kv, quantization or default_quantization, tuple(options))

    @property
    def tp(self) -> int:
        """Tensor-parallel ranks of each worker (GPUs one model is split over)."""
        match = QUEUE_MODE.fullmatch(self.mode)
        return int(match["tp"] or 1) if match else 1

    @property
    def workers(self) -> int:
        """``radixq worker`` processes on the variant's queue (0: the engine in this process)."""
        match = QUEUE_MODE.fullmatch(self.mode)
        return int(match["workers"] or 1) if match else 0

    @property
    def plain_queue(self) -> bool:
        """One TP=1 worker: the engine alone's counterpart (its KV pool, its overhead)."""
        return self.mode == "queue"

    @property
    def name(self) -> str:
        return (
            self.mode
            + (f" kv={self.kv_cache_dtype}" if self.kv_cache_dtype else "")
            + (f" w={self.quantization}" if self.quantization else "")
            + "".join(f" {key}={value}" for key, value in self.options)
        )

    @property
    def engine(self) -> Variant:
        """The engine-alone variant of the same KV and weights (a queue run's baseline)."""
        return Variant("engine", self.kv_cache_dtype, self.quantization, self.options)


def at_scale_workload(preset: Preset, seed: int) -> Workload:
    rng = random.Random(seed)
    prompts = [
        [rng.randint(0, preset.token_id_high) for _ in range(preset.prompt_len)]
        for _ in range(preset.num_requests)
    ]
    return Workload(prompts, [preset.output_len] * preset.num_requests)


def engine_options(
    args: argparse.Namespace,
    preset: Preset,
    kv_cache_dtype: str | None,
    quantization: str | None = None,
    tp: int = 1,
) -> dict[str, Any]:
    """Engine and scheduler options of a run; ``kv_cache_dtype``, ``quantization`` and the
    tensor-parallel size only when given (or > 1)."""
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
        "tensor_parallel_size": tp if tp > 1 else None,
    }
    options.update({k: v for k, v in optional.items() if v is not None})
    return options


def protocol_rounds(first_round_s: list[float]) -> int:
    """Issue 13's protocol: a median of at least 5, or 3 when every run takes over 30 s."""
    return 3 if first_round_s and min(first_round_s) > 30 else 5


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
    parser.add_argument(
        "--preset", default="llama-3.1-8b", help=f"comma list of presets, interleaved: {', '.join(PRESETS)}"
    )
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
    parser.add_argument("--prompt-len", type=int, default=None, help="override the preset's")
    parser.add_argument("--output-len", type=int, default=None, help="override the preset's")
    parser.add_argument(
        "--same-workers",
        action="store_true",
        help="queue variants: one start of their workers for every round (needs --rounds; not interleaved)",
    )
    parser.add_argument("--max-running-reqs", type=int, default=None, help="default: the preset's (1024)")
    parser.add_argument("--cuda-graph-max-bs", type=int, default=None, help="default: max_running_reqs")
    parser.add_argument("--max-prefill-tokens", type=int, default=None)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--mem-fraction", type=float, default=None)
    parser.add_argument("--num-pages", type=int, default=None, help="fix the KV pool (default: from memory)")
    parser.add_argument("--device", default=None, help="engine device (default: auto)")
    parser.add_argument("--attention", default=None, help="auto | flashinfer | torch")
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument(
        "--profile-steps", action="store_true",
        help="engine runs: GPU ms of a decode step at the largest batch and of prefill per 8,192 tokens "
        "(worker.scheduler.profile; CUDA events per step)",
    )  # fmt: skip
    parser.add_argument("--deadline-s", type=float, default=None, help="skip runs that would end past this")
    parser.add_argument("--timeout-s", type=float, default=900, help="queue runs: longest wait for results")
    parser.add_argument("--work-dir", default=None, help="queue runs: worker configs, logs, result files")
    parser.add_argument("--out", default=None, help="write every run and the table as JSON here")
    return parser.parse_args(argv)


def preset_of(args: argparse.Namespace, name: str) -> Preset:
    """The named preset with the command line's overrides (requests, prompt and output lengths)."""
    overrides = {
        "num_requests": args.num_requests,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
    }
    return Preset(**{**PRESETS[name].__dict__, **{k: v for k, v in overrides.items() if v}})


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    names = [n.strip() for n in args.preset.split(",") if n.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if unknown or not names or len(set(names)) != len(names):
        raise SystemExit(f"--preset {args.preset!r}: name each of {', '.join(PRESETS)} at most once")
    variants = [
        Variant.parse(t, args.kv_cache_dtype, args.quantization)
        for t in args.variants.split(",")
        if t.strip()
    ]
    if len({v.name for v in variants}) != len(variants):
        raise SystemExit(f"--variants {args.variants!r} names a variant twice")
    if args.same_workers and not args.rounds:
        raise SystemExit("--same-workers needs --rounds (the protocol's count is known only after a round)")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="radixq-atscale-"))
    work.mkdir(parents=True, exist_ok=True)
    shapes = ", ".join(f"{n} {preset_of(args, n).describe()}" for n in names)
    print(f"at_scale: commit {_commit()}, {_device()}, {shapes}, variants {[v.name for v in variants]}")
    redis = None
    if any(v.workers for v in variants):
        from producer.local_redis import LocalRedis

        redis = LocalRedis(use_server=True, fsync="everysec").start()
    records: list = []
    last_wall: dict[tuple[str, str], float] = {}
    began = time.perf_counter()

    def run(name: str, v: Variant, rounds: list[int]) -> None:
        """Run ``rounds`` of ``v`` on preset ``name`` (one start of its workers), unless the
        deadline says no."""
        label = _label(names, name, v)
        elapsed = time.perf_counter() - began
        if args.deadline_s and elapsed + last_wall.get((name, v.name), 0.0) * len(rounds) > args.deadline_s:
            print(f"deadline: round {', '.join(map(str, rounds))} {label} skipped at {elapsed:.0f} s")
            return
        start = time.perf_counter()
        redis_url = redis.url if redis else None
        for record in _run_variant(args, name, label, v, rounds, records, redis_url, work):
            records.append(record)
            if args.out:  # after every run: a call cut off at its time limit keeps what ended
                _write(args.out, args, records, None)
            print(
                f"round {record.round} {label}: {record.seconds:.2f} s, {record.tok_per_s:,.0f} tok/s "
                f"(startup {record.startup_s:.1f} s; max decode batch {record.max_decode_batch}, "
                f"prefill steps {record.prefill_steps}, retractions {record.retractions}, "
                f"KV pages {record.kv_pages}; graphs to "
                f"{record.graph_batch_sizes[-1] if record.graph_batch_sizes else None}, "
                f"eager decode steps {record.eager_decode_steps}"
                + (f" up to batch {record.eager_batch_max}" if record.eager_batch_max else "")
                + (f", split decode passes {record.split_passes}" if record.split_passes is not None else "")
                + ")",
                flush=True,
            )
        last_wall[(name, v.name)] = (time.perf_counter() - start) / len(rounds)

    try:
        rounds, round_ = args.rounds or 1, 0
        if args.same_workers:  # every round of a variant on one start; presets, variants in turn
            for name in names:
                for v in variants:
                    run(name, v, list(range(rounds)))
        while round_ < rounds and not args.same_workers:  # interleaved: round by round
            for name in names:
                for v in variants:
                    run(name, v, [round_])
            if round_ == 0 and not args.rounds:
                rounds = protocol_rounds([r.seconds for r in records])
                print(
                    f"protocol: {rounds} rounds (median of {rounds}; first-round runs {'all' if rounds == 3 else 'not all'} over 30 s)"
                )
            round_ += 1
    finally:
        if redis is not None:
            redis.stop()
    ceilings = None
    try:  # NOTE: after the runs, so its buffers never shrink a KV pool; a failure costs only its column
        ceilings = measure_ceilings() if records else None
    except RuntimeError as exc:
        print(f"this card's ceilings not measured: {str(exc).splitlines()[0][:200]}")
    if ceilings:
        bandwidth, peak = ceilings
        print(f"this card: copy {bandwidth / 1e12:.2f} TB/s, bf16 GEMM {peak / 1e12:.0f} TFLOP/s (measured)")
    rows = [
        row
        for n in names
        for row in summarize(args, n, preset_of(args, n), variants, records, rounds, ceilings)
    ]
    if len(names) > 1:
        print_presets_table(rows)
    if args.out:
        _write(args.out, args, records, rows)
    return rows


def _label(names: list[str], name: str, v: Variant) -> str:
    return f"{name} {v.name}" if len(names) > 1 else v.name


def _run_variant(
    args: argparse.Namespace,
    name: str,
    label: str,
    v: Variant,
    rounds: list[int],
    records: list,
    redis_url: str | None,
    work: Path,
) -> list:
    """The records of ``rounds`` of variant ``v`` on preset ``name``: an engine built afresh for
    each round, or the variant's workers started once for all of them (on a queue named after
    ``label``: one of its own per preset)."""
    from at_scale_runs import run_engine, run_queue, warmup_workload

    preset = preset_of(args, name)
    warmup = warmup_workload(preset.prompt_len, preset.output_len)
    options = {**engine_options(args, preset, v.kv_cache_dtype, v.quantization, v.tp), **dict(v.options)}
    workloads = [(r, at_scale_workload(preset, args.seed + r)) for r in rounds]
    if not v.workers:
        done = [
            run_engine(
                v.name, r, preset.model, options, workload, warmup, args.temperature, args.profile_steps
            )
            for r, workload in workloads
        ]
    else:
        pinned = [r for r in records if r.preset == name and r.variant == v.engine.name]
        if v.plain_queue and pinned and args.num_pages is None:  # NOTE: the same KV pool as the engine alone
            options["num_pages"] = pinned[-1].kv_pages
        assert redis_url is not None
        done = run_queue(
            v.name, workloads, preset.model, options, warmup, args.temperature, redis_url, work,
            args.timeout_s, workers=v.workers, label=label,
        )  # fmt: skip
    for record in done:
        record.preset = name
    return done


def _write(path: str, args: argparse.Namespace, records: list, rows: list[dict] | None) -> None:
    report = {"args": vars(args), "runs": [r.to_json() for r in records], "table": rows}
    Path(path).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

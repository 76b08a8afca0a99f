"""The fused sampler (worker.kernels.sampling) on one GPU: microseconds per call and the logits'
bytes per second, for decode batches of the benchmarks' models (rows x vocabulary), every row
sampling at temperature 0.6 or every row greedy, logits in bf16 (the model's dtype) and float32.
The torch path of worker.engine.sampler (``Sampler.sample_torch``) runs on the same
logits, interleaved, as the baseline; its draws must equal the kernel's except where a
uniform lands within float rounding of a token boundary (counted and printed). The kernel's
previous schedule (``two_pass``: each chunk read twice where a row samples) runs interleaved
too ("before"), and must draw the same tokens as the kernel.

Per cell: median of ``--reps`` calls between CUDA events after 3 warm-up calls, alternating the
two paths.

    python benchmarks/sampling.py                       # ~20 s on an H200
    python benchmarks/sampling.py --shapes 256x151936 --reps 50
    TRITON_INTERPRET=1 python benchmarks/sampling.py --device cpu --shapes 3x9000 --reps 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_timing import event_ms  # noqa: E402

from wire.schema import SamplingParams  # noqa: E402
from worker.engine.sampler import Sampler  # noqa: E402
from worker.kernels.ops import _kernels_for  # noqa: E402
from worker.kernels.sampling import sample_unfiltered  # noqa: E402
from worker.scheduler.prepare import sampling_tensors  # noqa: E402

# Qwen3-0.6B (the standard benchmark: 256 running), Llama-3.1-8B at scale (1,024 running)
SHAPES = "256x151936,1024x128256,64x151936"


def cell(rows: int, vocab: int, dtype: torch.dtype, greedy: bool, reps: int, device: str = "cuda") -> dict:
    gen = torch.Generator(device=device).manual_seed(rows)
    logits = (torch.randn(rows, vocab, device=device, generator=gen) * 3).to(dtype)
    params = [SamplingParams(temperature=0.0 if greedy else 0.6, seed=i + 1) for i in range(rows)]
    t = sampling_tensors(params, [100 + i for i in range(rows)], device)
    fused = lambda: sample_unfiltered(logits, t.temperature, t.seeds, t.steps, t.greedy)  # noqa: E731
    before = lambda: sample_unfiltered(logits, t.temperature, t.seeds, t.steps, t.greedy, two_pass=True)  # noqa: E731
    baseline = lambda: Sampler().sample_torch(logits, t)  # noqa: E731
    paths = {"kernel": fused, "before": before, "torch": baseline}
    for _ in range(3):
        for fn in paths.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(reps):  # interleaved
        for name, fn in paths.items():
            times[name].append(event_ms(fn) * 1e3)
    got, old, want = fused(), before(), baseline()
    kernel_us = statistics.median(times["kernel"])
    row = {"rows": rows, "vocab": vocab, "dtype": str(dtype).removeprefix("torch."), "greedy": greedy,
           "kernel_us": kernel_us, "logits_tbps": logits.numel() * logits.element_size() / kernel_us / 1e6,
           "before_us": statistics.median(times["before"]), "torch_us": statistics.median(times["torch"])}  # fmt: skip
    row["draws_differ"] = int((got.long() != want.long()).sum())
    row["before_differs"] = int((got.long() != old.long()).sum())
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=SHAPES, help="comma list of ROWSxVOCAB")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument(
        "--device", default="cuda", help="cuda, or cpu under TRITON_INTERPRET=1 (a smoke run)"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if _kernels_for(torch.empty(0, device=args.device)) is None:
        parser.error("needs the Triton kernels: CUDA, or --device cpu under TRITON_INTERPRET=1")
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (interpreter)"
    print(f"sampling: {name}, torch {torch.__version__}", flush=True)
    rows_out = []
    for shape in args.shapes.split(","):
        rows, vocab = (int(v) for v in shape.split("x"))
        for dtype in (torch.bfloat16, torch.float32):
            for greedy in (False, True):
                row = cell(rows, vocab, dtype, greedy, args.reps, args.device)
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    print("\n| rows x vocab | logits | rows | kernel us | logits TB/s | before us | before / kernel "
          "| torch path us | draws differing (torch, before) |")  # fmt: skip
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows_out:
        print(f"| {r['rows']} x {r['vocab']} | {r['dtype']} | {'greedy' if r['greedy'] else 'T 0.6'} | "
              f"{r['kernel_us']:,.1f} | {r['logits_tbps']:.2f} | {r['before_us']:,.1f} | "
              f"{r['before_us'] / r['kernel_us']:.2f} | {r['torch_us']:,.1f} | "
              f"{r['draws_differ']}, {r['before_differs']} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(rows_out, indent=1))
    return rows_out


if __name__ == "__main__":
    main()

"""The fused sampler (worker.kernels.sampling) on one GPU: microseconds per call and the logits'
bytes per second, for decode batches of the benchmarks' models (rows x vocabulary), every row
sampling at temperature 0.6 or every row greedy, logits in bf16 (the model's dtype) and float32.
The torch path of worker.engine.sampler (``Sampler.sample_torch``) runs on the same
logits, interleaved, as the baseline; its draws must equal the kernel's except where a
uniform lands within float rounding of a token boundary (counted and printed).

Per cell: median of ``--reps`` calls between CUDA events after 3 warm-up calls, alternating the
two paths.

    python benchmarks/sampling.py                       # ~20 s on an H200
    python benchmarks/sampling.py --shapes 256x151936 --reps 50
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
from worker.kernels.sampling import sample_unfiltered  # noqa: E402
from worker.scheduler.prepare import sampling_tensors  # noqa: E402

# Qwen3-0.6B (the standard benchmark: 256 running), Llama-3.1-8B at scale (1,024 running)
SHAPES = "256x151936,1024x128256,64x151936"


def cell(rows: int, vocab: int, dtype: torch.dtype, greedy: bool, reps: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(rows)
    logits = (torch.randn(rows, vocab, device="cuda", generator=gen) * 3).to(dtype)
    params = [SamplingParams(temperature=0.0 if greedy else 0.6, seed=i + 1) for i in range(rows)]
    t = sampling_tensors(params, [100 + i for i in range(rows)], "cuda")
    fused = lambda: sample_unfiltered(logits, t.temperature, t.seeds, t.steps, t.greedy)  # noqa: E731
    baseline = lambda: Sampler().sample_torch(logits, t)  # noqa: E731
    for _ in range(3):
        fused()
        baseline()
    kernel_us, torch_us = [], []
    for _ in range(reps):  # interleaved
        kernel_us.append(event_ms(fused) * 1e3)
        torch_us.append(event_ms(baseline) * 1e3)
    got, want = fused(), baseline()
    row = {"rows": rows, "vocab": vocab, "dtype": str(dtype).removeprefix("torch."), "greedy": greedy,
           "kernel_us": statistics.median(kernel_us),
           "logits_tbps": logits.numel() * logits.element_size() / statistics.median(kernel_us) / 1e6}  # fmt: skip
    row["torch_us"] = statistics.median(torch_us)
    row["draws_differ"] = int((got.long() != want.long()).sum())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=SHAPES, help="comma list of ROWSxVOCAB")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    print(f"sampling: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows_out = []
    for shape in args.shapes.split(","):
        rows, vocab = (int(v) for v in shape.split("x"))
        for dtype in (torch.bfloat16, torch.float32):
            for greedy in (False, True):
                row = cell(rows, vocab, dtype, greedy, args.reps)
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    print("\n| rows x vocab | logits | rows | kernel us | logits TB/s | torch path us | draws differing |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows_out:
        print(f"| {r['rows']} x {r['vocab']} | {r['dtype']} | {'greedy' if r['greedy'] else 'T 0.6'} | "
              f"{r['kernel_us']:,.1f} | {r['logits_tbps']:.2f} | {r.get('torch_us', float('nan')):,.1f} | "
              f"{r.get('draws_differ', '-')} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()

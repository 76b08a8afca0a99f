"""One decode step's linear layers on CPU: torch's F.linear (MKL) against oneDNN's kernels.

SmolLM2-135M's four projections (qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536) for
each of 30 layers, each layer with weights of its own, so they stream from memory as in the
model; float32, ``--rows`` rows of input. Prints the median milliseconds of a whole pass
over the 30 layers for each path and each row count, and the largest difference between them.

    python benchmarks/cpu_linear.py --rows 1 16 216 700
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from worker.kernels.cpu_linear import linear, use_onednn  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) of one layer


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 216, 700])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    weights = [[torch.randn(o, i, generator=gen) * 0.02 for o, i in SHAPES] for _ in range(args.layers)]
    use_onednn(True)
    report = []
    for rows in args.rows:
        inputs = {i: torch.randn(rows, i, generator=gen) for i in (576, 1536)}

        def run(op: Callable[..., torch.Tensor], inputs: dict[int, torch.Tensor] = inputs) -> None:
            for layer in weights:
                for w in layer:
                    op(inputs[w.shape[1]], w)

        w = weights[0][2]
        diff = (linear(inputs[576], w) - F.linear(inputs[576], w)).abs().max().item()
        report.append(
            {
                "rows": rows,
                "mkl_ms": round(median_ms(lambda: run(F.linear), args.repeat), 1),
                "onednn_ms": round(median_ms(lambda: run(linear), args.repeat), 1),
                "max_abs_diff": diff,
            }
        )
        print(json.dumps(report[-1]))
    print(json.dumps({"threads": torch.get_num_threads(), "layers": args.layers, "runs": report}))


if __name__ == "__main__":
    main()

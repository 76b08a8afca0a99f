"""The quality cost of loading block-wise FP8 checkpoints (Qwen's, DeepSeek's: 128 x 128
weight blocks, one scale each) by re-scaling per output channel at load
(worker.models.fp8_checkpoint.to_per_channel), on CPU.

For each weight W: the publisher's block quantization Wb = blockdeq(blockquant(W)); radixq's
re-scaled W' = per-channel requantization of Wb. Reported, as relative Frobenius errors:

    rescale   |W' - Wb| / |Wb|          what re-scaling costs (the figure that matters)
    block     |Wb - W| / |W|            what the publisher's block quantization cost
    total     |W' - W| / |W|            both, against the original weights
    channel   |Wc - W| / |W|            per-channel quantization of the original (quantization fp8)
    y rescale |x W'^T - x Wb^T| / |x Wb^T|   a layer's output on x ~ N(0, 1) [256, in]
    y block   |x Wb^T - x W^T| / |x W^T|

Weights: SmolLM2-135M-Instruct's projections (real trained weights, as dequantized from the
bundled Q4_1 GGUF: 576 x 576 ... 1536 x 576, partial edge blocks), and synthetic 4096-wide
ones with the structure that makes block scales differ: heavy tails (Student t, 4 degrees of
freedom) and outlier input channels (log-normal column scales, sigma 0.5 and 1.0).

    python benchmarks/fp8_block_rescale.py [--no-smollm2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.models.checkpoint_quant import Fp8Scheme  # noqa: E402
from worker.models.fp8 import quantize_channels  # noqa: E402
from worker.models.fp8_checkpoint import dequantize, to_per_channel  # noqa: E402

E4M3_MAX = 448.0
BLOCK = (128, 128)
SCHEME = Fp8Scheme("fp8", "block", "weight_scale_inv", BLOCK)


def block_quant(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The publisher's side: one scale per 128 x 128 block (edges partial), max|block| / 448."""
    bn, bk = BLOCK
    out, cols = w.shape
    rows_b, cols_b = -(-out // bn), -(-cols // bk)
    padded = torch.zeros(rows_b * bn, cols_b * bk)
    padded[:out, :cols] = w.float()
    tiles = padded.view(rows_b, bn, cols_b, bk)
    scale = (tiles.abs().amax(dim=(1, 3)) / E4M3_MAX).clamp(min=1e-12)
    data = (tiles / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return data.view(rows_b * bn, cols_b * bk)[:out, :cols].contiguous(), scale


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def measure(w: torch.Tensor, gen: torch.Generator) -> dict[str, float]:
    data, scale = block_quant(w)
    wb = dequantize(data, scale, SCHEME, "w")
    new_data, channel = to_per_channel(data, scale, SCHEME, "w")
    w_re = new_data.float() * channel[:, None]
    c_data, c_scale = quantize_channels(w)
    wc = c_data.float() * c_scale[:, None]
    x = torch.randn(256, w.shape[1], generator=gen)
    yb, y = x @ wb.t(), x @ w.float().t()
    return {
        "rescale": rel(w_re, wb),
        "block": rel(wb, w),
        "total": rel(w_re, w),
        "channel": rel(wc, w),
        "y rescale": rel(x @ w_re.t(), yb),
        "y block": rel(yb, y),
    }


def synthetic(out: int, cols: int, sigma: float, gen: torch.Generator) -> torch.Tensor:
    t = torch.distributions.StudentT(4.0).sample((out, cols))  # uses the global generator
    columns = torch.exp(sigma * torch.randn(cols, generator=gen))
    return 0.02 * t * columns


def smollm2_weights():
    from safetensors import safe_open

    from worker.models.aliases import ALIASES
    from worker.models.gguf import ensure_converted

    path = ensure_converted(ALIASES["smollm2-135m"].locate(), name="smollm2-135m")
    (file,) = sorted(path.glob("*.safetensors"))
    with safe_open(str(file), framework="pt") as f:
        for name in f.keys():
            if name.endswith("proj.weight"):
                yield name, f.get_tensor(name).float()


def row(label: str, figures: list[dict[str, float]]) -> str:
    keys = ("rescale", "block", "total", "channel", "y rescale", "y block")
    cells = []
    for key in keys:
        values = [f[key] for f in figures]
        cells.append(f"{100 * statistics.fmean(values):.2f}% ({100 * max(values):.2f}%)")
    return f"| {label} | " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-smollm2", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    print("| weights (mean (max) over matrices) | rescale | block | total | channel | y rescale | y block |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    if not args.no_smollm2:
        figures = [measure(w, gen) for _, w in smollm2_weights()]
        print(row(f"SmolLM2-135M, {len(figures)} projections", figures))
    for sigma in (0.0, 0.5, 1.0):
        for out, cols in ((4096, 4096), (14336, 4096), (4096, 14336)):
            figures = [measure(synthetic(out, cols, sigma, gen), gen)]
            print(row(f"t(4) {out} x {cols}, column sigma {sigma}", figures))


if __name__ == "__main__":
    main()

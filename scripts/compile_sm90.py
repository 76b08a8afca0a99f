"""Compile radixq's Triton kernels for an H200 (sm90) on a machine without a GPU, and say which
tensor-core instructions each one got.

Triton compiles to PTX and runs its bundled ptxas without a driver: a stub driver reports the
sm90 target, and every launch in the code paths below becomes ``warmup()`` (compile only; CPU
tensors stand in for the GPU's, their values unused). Use the device's Triton version to catch
what would fail to compile there before a device call is spent on it:

    pip install --no-deps --target /tmp/triton-device triton==3.6.0     # the device's (scripts/device)
    PYTHONPATH=/tmp/triton-device python scripts/compile_sm90.py moe sample gemm rows

``moe``: fused_moe's kernels under every transposed tile of ``sweep_tiles(kind, swap=True)``
(FP8 fast, tile, exact; bf16) and the tiles moe_tiles picks for Qwen3-30B-A3B's decode and
prefill; ``moe-wide``: FP8 fast under every transposed tile of ``sweep_tiles(kind, swap=True,
wide=True)`` (what ``moe_kernel.py --sweep --swap --wide`` times); ``moe-mixtral``: FP8 fast
at Mixtral-8x7B's experts under the tiles moe_tiles picks and every tile of ``sweep_tiles``
(what ``moe_kernel.py --sweep --models mixtral-8x7b`` times); ``sample``: the fused sampler
(bf16 and float32 logits); ``gemm``: the bounded GEMM (worker.kernels.bounded_gemm, bf16 and
FP8) at Llama-3.1-8B's decode shapes; ``rows``: the per-row FP8 quantizer (worker.kernels.ops
``quantize_fp8_rows``, and SiLU-mul / GELU-mul with ``fp8=True``) at the MoE intermediate's and
Llama-3.1-8B's widths. Prints one line per compiled
kernel variant: its name, tiles, and its MMA instructions (wgmma with operand types, or
mma.sync); exits 1 if any launch fails to compile, or if a MoE tile that moe_tiles picks spills
registers.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402


class _Sm90:
    """A driver that only answers what compiling asks: the target, device 0, stream 0."""

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


driver.set_active(_Sm90())

from worker.kernels import (  # noqa: E402
    bounded_gemm,
    bounded_gemm_triton,
    moe_triton,
    ops,
    sampling,
    sampling_triton,
    triton_kernels,
)
from worker.kernels import fused_moe as fused_moe_module  # noqa: E402

compiled: list[tuple[str, str]] = []


class _CompileOnly:
    """``kernel[grid](...)`` as ``kernel.warmup(..., grid=grid)``, recording the PTX's MMAs."""

    def __init__(self, fn: triton.runtime.jit.JITFunction, name: str) -> None:
        self.fn, self.name = fn, name

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            kernel = self.fn.warmup(*args, grid=grid, **kwargs)
            ptx = kernel.asm["ptx"]
            compiled.append((self.name, f"{mma_summary(ptx)}; {resources(ptx, kernel.metadata.shared)}"))

        return launch


def resources(ptx: str, shared: int) -> str:
    """Registers and spills per thread (Triton's bundled ptxas -v for sm_90a), shared memory."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        out = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                             capture_output=True, text=True).stderr  # fmt: skip
    registers = re.search(r"Used (\d+) registers", out)
    spills = re.search(r"(\d+) bytes spill stores", out)
    return (f"{registers.group(1) if registers else '?'} registers, "
            f"{spills.group(1) if spills else '?'} B spilled, {shared // 1024} KiB shared")  # fmt: skip


def mma_summary(ptx: str) -> str:
    found = collections.Counter(
        re.sub(r"m64n\d+k", "m64nNk", m) for m in re.findall(r"(?:wgmma\.mma_async|mma\.sync)[\w.]*", ptx)
    )
    loads = " (TMA loads)" if "cp.async.bulk.tensor" in ptx else ""
    return (", ".join(sorted(found)) or "no MMA") + loads


def attempt(
    label: str, launch: Callable[[], object], only: tuple[str, ...] = (), spill_fails: bool = False
) -> int:
    """Run ``launch`` (its kernels compile, nothing runs) and print each kernel it compiled (those
    named in ``only`` where given) after ``label``, or FAILED with the reason; with
    ``spill_fails`` a kernel that spills registers fails too. The failures (0, 1)."""
    before = len(compiled)
    try:
        launch()
    except Exception as exc:  # noqa: BLE001 - every failure is reported, the rest go on
        print(f"FAILED {label}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        return 1
    failed = 0
    for name, summary in compiled[before:]:
        if not only or name in only:
            spills = re.search(r"(\d+) B spilled", summary)
            if spill_fails and spills and int(spills.group(1)):
                print(f"FAILED {label} {name}: spills, {summary}", flush=True)
                failed = 1
            else:
                print(f"{label} {name}: {summary}", flush=True)
    return failed


for _module in (moe_triton, triton_kernels, sampling_triton, bounded_gemm_triton):
    for _name in dir(_module):
        _obj = getattr(_module, _name)
        if isinstance(_obj, triton.runtime.jit.JITFunction) and _name.endswith("_kernel"):
            setattr(_module, _name, _CompileOnly(_obj, _name))
# NOTE: the launch paths take CPU tensors where they would refuse them: triton's kernels for any
# tensor, and fused_moe's device check passed while it runs (not DOT_F32: that reads the
# variable at launch, when it is unset again)
ops._kernels_for = sampling._kernels_for = bounded_gemm._kernels_for = lambda x: triton_kernels
_check = fused_moe_module._check


def _check_on_cpu(*args):
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        return _check(*args)
    finally:
        os.environ.pop("TRITON_INTERPRET")


fused_moe_module._check = _check_on_cpu


def compile_moe(wide: bool = False, mixtral: bool = False) -> int:
    from worker.kernels.fused_moe import fused_moe
    from worker.kernels.moe_tiles import moe_tiles, sweep_tiles

    # Qwen3-30B-A3B's experts, or Mixtral-8x7B's
    experts, hidden, inter, top_k = (8, 4096, 14336, 2) if mixtral else (128, 2048, 768, 8)
    tokens = 64
    x = torch.zeros(tokens, hidden, dtype=torch.bfloat16)
    ids = torch.randint(0, experts, (tokens, top_k), dtype=torch.int32)
    weights = torch.rand(tokens, top_k)
    fp8 = {
        "w13": torch.zeros(experts, 2 * inter, hidden, dtype=torch.float8_e4m3fn),
        "w2": torch.zeros(experts, hidden, inter, dtype=torch.float8_e4m3fn),
        "w13_scale": torch.ones(experts, 2 * inter),
        "w2_scale": torch.ones(experts, hidden),
    }
    bf16 = {
        "w13": torch.zeros(experts, 2 * inter, hidden, dtype=torch.bfloat16),
        "w2": torch.zeros(experts, hidden, inter, dtype=torch.bfloat16),
    }
    failures = 0
    kinds = (
        (("fp8-fast", "fast"),)
        if wide or mixtral
        else (("fp8-fast", "fast"), ("fp8-tile", "tile"), ("fp8", "exact"), ("bf16", None))
    )
    for kind, sums in kinds:
        picked = [moe_tiles(experts, hidden, inter, n * top_k, kind) for n in (1024, 8192)]
        if mixtral:  # what moe_kernel.py --sweep times for it (256 and 2,048 rows an expert)
            others = sweep_tiles(kind)
        else:
            others = [t for t in sweep_tiles(kind, swap=True, wide=wide) if t.swap_ab]
        weights_of = fp8 if sums else bf16
        scales = (
            {"w13_scale": fp8["w13_scale"], "w2_scale": fp8["w2_scale"], "fp8_sums": sums} if sums else {}
        )
        for tiles in dict.fromkeys([*picked, *others]):  # NOTE: a tile moe_tiles picks must not spill
            failures += attempt(
                f"{kind:8s} {tiles}",
                lambda tiles=tiles, w=weights_of, s=scales: fused_moe(
                    x, w["w13"], w["w2"], weights, ids, tiles=tiles, **s
                ),
                only=("moe_gate_up_kernel", "moe_down_kernel"),
                spill_fails=tiles in picked,
            )
    return failures


def compile_sampler() -> int:
    from wire.schema import SamplingParams
    from worker.kernels.sampling import sample_unfiltered
    from worker.scheduler.prepare import sampling_tensors

    failures = 0
    params = [SamplingParams(temperature=0.6, seed=i + 1) for i in range(256)]
    t = sampling_tensors(params, list(range(256)), "cpu")
    for dtype in (torch.bfloat16, torch.float32):
        for two_pass in (False, True):  # the schedule and the one benchmarks/sampling.py times it against
            logits = torch.zeros(256, 151936, dtype=dtype)
            failures += attempt(
                f"sampler  logits {dtype}{' two-pass' if two_pass else ''}",
                lambda logits=logits, two_pass=two_pass: sample_unfiltered(
                    logits, t.temperature, t.seeds, t.steps, t.greedy, two_pass=two_pass
                ),
            )
    return failures


def compile_gemm() -> int:
    """The bounded GEMM (worker.kernels.bounded_gemm) at Llama-3.1-8B's decode shapes: bf16 and
    FP8, a whole batch of 1,024 rows, a half of 512, and 64 rows; per-thread loads and TMA."""
    from worker.kernels.bounded_gemm import bounded_linear

    failures = 0
    for fp8 in (False, True):
        dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        for rows, cols, depth in ((1024, 28672, 4096), (512, 4096, 14336), (64, 6144, 4096)):
            x, w = torch.zeros(rows, depth, dtype=dtype), torch.zeros(cols, depth, dtype=dtype)
            scales = {"x_scale": torch.ones(rows), "w_scale": torch.ones(cols), "out_dtype": torch.bfloat16}
            for tma in (False, True):
                failures += attempt(
                    f"gemm     {str(dtype)[6:]} {rows}x{cols}x{depth} tma={tma}",
                    lambda x=x, w=w, tma=tma, fp8=fp8, scales=scales: bounded_linear(
                        x, w, programs=66, tma=tma, **(scales if fp8 else {})
                    ),
                )
    return failures


def compile_rows() -> int:
    """The row quantizer at widths that take its one-pass tiles (768: four rows a program; 4,096:
    one) and its two-pass loop (a gated 14,336), bf16 inputs."""
    failures = 0
    cases = (
        ("rows", 8192, 768, None), ("rows", 65536, 768, None), ("rows", 1024, 4096, None),
        ("silu", 1024, 14336, "silu"), ("gelu", 1024, 15360, "gelu_pytorch_tanh"),
    )  # fmt: skip
    for label, rows, width, act in cases:
        if act is None:
            x = torch.zeros(rows, width, dtype=torch.bfloat16)
            failures += attempt(f"{label:8s} {rows}x{width}", lambda x=x: ops.quantize_fp8_rows(x))
        else:
            x = torch.zeros(rows, 2 * width, dtype=torch.bfloat16)
            failures += attempt(
                f"{label:8s} {rows}x{width}", lambda x=x, act=act: ops.act_and_mul(x, act, fp8=True)
            )
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "what",
        nargs="*",
        default=["moe", "sample", "gemm", "rows"],
        help=f"of {', '.join(TARGETS)} (all but moe-wide and moe-mixtral by default)",
    )
    args = parser.parse_args()
    if set(args.what) - set(TARGETS):
        parser.error(f"what: {args.what}, expected some of {', '.join(TARGETS)}")
    print(f"compile_sm90: triton {triton.__version__} ({Path(triton.__file__).parent})", flush=True)
    failures = sum(TARGETS[w]() for w in args.what)
    print(f"compile_sm90: {len(compiled)} launches compiled, {failures} failed")
    sys.exit(1 if failures else 0)


TARGETS = {
    "moe": compile_moe,
    "moe-wide": lambda: compile_moe(wide=True),
    "moe-mixtral": lambda: compile_moe(mixtral=True),
    "sample": compile_sampler,
    "gemm": compile_gemm,
    "rows": compile_rows,
}

if __name__ == "__main__":
    main()

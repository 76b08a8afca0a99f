"""Build (or load from ~/.cache/flashinfer) every FlashInfer module radixq uses, and time it.

bf16 queries over bf16 and FP8 (e4m3) KV pages, head_dim 128, q/kv heads 16/8 and 32/8 (and the
GPU tests' 4/2 and 8/2), page sizes 1 and 16: ragged prefill (fa2), decode on tensor cores (the
same fa2 prefill module), decode on CUDA cores, and XQA decode (page 16; its module is built per
query heads per KV head). Then the variants of per-layer attention options (ModelConfig.
layer_attention), each a module of its own: sliding window (Mistral-7B's 32/8 heads, head_dim
128; Gemma 3's sliding layers), head_dim 256 (Gemma-3-12B's 16/8 heads, sliding and global
layers), logit soft-cap with and without a window (Gemma 2, head_dim 256, bf16 and FP8; XQA has
no soft-cap, so those decode through FA2), and XQA with a window. Each group of modules builds in
its own process, ``--jobs`` at a time (FlashInfer compiles a module on first use; its files are
keyed by module: a prefill module by KV dtype, head_dim, window yes/no and soft-cap yes/no, a
CUDA-core decode module likewise, an XQA module by KV dtype, page size, head_dim, q heads per KV
head and window yes/no; no two groups build one). Prefill over FP8 pages
(worker.attention.flashinfer_fp8_prefill) also runs the bf16 prefill module of its kind (its
ragged part: one module serves ragged and paged runs) and FlashInfer's cascade module
(merge_state_in_place, built by the group "merge-state"): an FP8 tensor-core group starts only
once the groups that build those have finished (``Group.after``; asking for a group brings in
what it waits for), so it loads them and builds only its own. With ``--pack DIR`` it then writes the cache as
DIR/flashinfer_cache.tgz.part00, part01, ... (15 MiB each: the modules' .so files alone, in
FlashInfer's AOT layout); ``cat`` them, in name order, into .fi_cache/flashinfer_cache.tgz,
which scripts/device/prelude.sh unpacks into the installed package's AOT folder.

    source scripts/device/prelude.sh && python3 scripts/device/warm_flashinfer.py --pack $OUT
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

PART_BYTES = 15 * 2**20
HEADS = ((16, 8), (32, 8), (4, 2), (8, 2))
GEMMA3_12B, MISTRAL_7B = ((16, 8),), ((32, 8),)  # (q heads, kv heads)
PLAIN, WINDOW, SOFTCAP, WINDOW_SOFTCAP = (0, 0.0), (32, 0.0), (0, 50.0), (32, 50.0)  # (window, soft-cap)


class Group(NamedTuple):
    """What one process builds: every (kind, heads, page size) pass of these settings."""

    kv: str  # "bf16" or "fp8" pages
    kernel: str  # decode kernel: "fa2" or "xqa"
    use_tc: bool | None  # FA2 decode on tensor cores (and prefill: the same module) or CUDA cores
    page_sizes: tuple[int, ...]
    heads: tuple[tuple[int, int], ...]
    head_dim: int = 128
    kinds: tuple[tuple[int, float], ...] = (PLAIN,)  # (sliding window, logit soft-cap) of every layer
    after: tuple[str, ...] = ()  # groups that build modules this one loads: they run first
    ragged: str | None = None  # FP8 prefill's ragged kernel ("fa3"): fresh prompts alone, its module alone


# group -> one process each
GROUPS = {
    "merge-state": Group("bf16", "merge", None, (), ()),  # FlashInfer's cascade module alone
    "bf16-tc": Group("bf16", "fa2", True, (1, 16), HEADS),
    "bf16-cc": Group("bf16", "fa2", False, (1, 16), HEADS),
    "fp8-tc": Group("fp8", "fa2", True, (16,), HEADS, after=("bf16-tc", "merge-state")),
    "fp8-cc": Group("fp8", "fa2", False, (16,), HEADS),
    "xqa-fp8-g2": Group("fp8", "xqa", None, (16,), ((16, 8), (4, 2))),
    "xqa-fp8-g4": Group("fp8", "xqa", None, (16,), ((32, 8), (8, 2))),
    "xqa-bf16-g2": Group("bf16", "xqa", None, (16,), ((16, 8),)),
    "xqa-bf16-g4": Group("bf16", "xqa", None, (16,), ((32, 8),)),
    "xqa-fp8-g8": Group("fp8", "xqa", None, (16,), ((32, 4),)),  # Qwen3-30B-A3B
    # FA3 for the split prefill's ragged part (engine option prefill_ragged_kernel="fa3"): not
    # warmed unless named (--groups): each took 7.4-9.5 min to build on the device (2026-12-05)
    "fa3-ragged": Group("fp8", "fa2", True, (16,), ((32, 8),), ragged="fa3"),
    "fa3-ragged-window": Group("fp8", "fa2", True, (16,), MISTRAL_7B, kinds=(WINDOW,), ragged="fa3"),
    "fa3-ragged-d256": Group("fp8", "fa2", True, (16,), GEMMA3_12B, 256, (PLAIN, WINDOW), ragged="fa3"),
    "fa3-ragged-d256-softcap": Group(
        "fp8", "fa2", True, (16,), GEMMA3_12B, 256, (SOFTCAP, WINDOW_SOFTCAP), ragged="fa3"
    ),
    # per-layer attention options (tests/gpu/test_flashinfer_backend.py runs these same modules)
    "bf16-window-tc": Group("bf16", "fa2", True, (16,), MISTRAL_7B, kinds=(WINDOW,)),
    # a windowed group attends prefixed rows whole (no merge): it loads only bf16-window-tc's module
    "fp8-window-tc": Group("fp8", "fa2", True, (16,), MISTRAL_7B, kinds=(WINDOW,), after=("bf16-window-tc",)),
    "xqa-fp8-g4-window": Group("fp8", "xqa", None, (16,), MISTRAL_7B, kinds=(WINDOW,)),
    "bf16-d256-tc": Group("bf16", "fa2", True, (16,), GEMMA3_12B, 256, (PLAIN, WINDOW)),
    "bf16-d256-cc": Group("bf16", "fa2", False, (16,), GEMMA3_12B, 256, (PLAIN, WINDOW)),
    "fp8-d256-tc": Group(
        "fp8", "fa2", True, (16,), GEMMA3_12B, 256, (PLAIN, WINDOW), after=("bf16-d256-tc", "merge-state")
    ),
    "xqa-fp8-d256-g2": Group("fp8", "xqa", None, (16,), GEMMA3_12B, 256),
    "xqa-fp8-d256-g2-window": Group("fp8", "xqa", None, (16,), GEMMA3_12B, 256, (WINDOW,)),
    "bf16-d256-softcap-tc": Group("bf16", "fa2", True, (16,), GEMMA3_12B, 256, (SOFTCAP, WINDOW_SOFTCAP)),
    "bf16-d256-softcap-cc": Group("bf16", "fa2", False, (16,), GEMMA3_12B, 256, (SOFTCAP, WINDOW_SOFTCAP)),
    "fp8-d256-softcap-tc": Group(
        "fp8",
        "fa2",
        True,
        (16,),
        GEMMA3_12B,
        256,
        (SOFTCAP, WINDOW_SOFTCAP),
        after=("bf16-d256-softcap-tc", "merge-state"),
    ),
}

DEFAULT_GROUPS = [name for name, group in GROUPS.items() if group.ragged is None]


def warm_group(name: str) -> None:
    import torch
    from attention_backend import build

    from worker.models.config import LayerAttention

    group = GROUPS[name]
    cache_dtype = torch.float8_e4m3fn if group.kv == "fp8" else None
    t0 = time.perf_counter()
    if group.kernel == "merge":
        from flashinfer import merge_state_in_place

        v, s = torch.zeros(4, 2, 128, dtype=torch.bfloat16, device="cuda"), torch.zeros(4, 2, device="cuda")
        merge_state_in_place(v, s, v.clone(), s.clone())
        torch.cuda.synchronize()
    for window, softcap in group.kinds:
        attention = LayerAttention(sliding_window=window, logit_softcap=softcap)
        for q_heads, kv_heads in group.heads:
            for page_size in group.page_sizes:
                # NOTE: prefill (the second batch) only in the tensor-core groups, which own the fa2
                # prefill module of their dtype and kind: two processes never build one module.
                batches = ([(5, 1), (40, 1)], [(0, 20), (17, 3)]) if group.use_tc else ([(5, 1), (40, 1)],)
                if group.ragged:  # fresh prompts: the ragged part alone, no FA2 module of another group
                    batches = ([(0, 20), (0, 17)],)
                for specs in batches:
                    backend, layout = build(
                        specs, q_heads, kv_heads, page_size, use_tensor_cores=group.use_tc,
                        cache_dtype=cache_dtype, decode_kernel=group.kernel, head_dim=group.head_dim,
                        attention=attention, ragged_backend=group.ragged,
                    )  # fmt: skip
                    shape = (layout.num_tokens, q_heads, group.head_dim)
                    q = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
                    meta = backend.plan(layout)
                    new_kv = None
                    if backend.wants_new_kv(meta):  # FP8 prefill: the pass's own K/V in bf16
                        kv_shape = (layout.num_tokens, kv_heads, group.head_dim)
                        new_kv = tuple(
                            torch.randn(kv_shape, dtype=torch.bfloat16, device="cuda") for _ in "kv"
                        )
                    backend.forward(q, 0, meta, new_kv)
                    torch.cuda.synchronize()
    print(f"warm {name}: {time.perf_counter() - t0:.1f} s", flush=True)


def with_dependencies(groups: list[str]) -> list[str]:
    """The groups and, before each, those it waits for (Group.after), each once."""
    ordered: list[str] = []

    def add(name: str) -> None:
        if name not in ordered:
            for dependency in GROUPS[name].after:
                add(dependency)
            ordered.append(name)

    for name in groups:
        add(name)
    return ordered


def warm(groups: list[str], jobs: int) -> None:
    t0 = time.perf_counter()
    pending = with_dependencies(groups)
    running: list[tuple[str, subprocess.Popen]] = []
    finished: set[str] = set()
    failed = []
    while pending or running:
        # NOTE: a group starts only after those it loads modules from: no module builds twice
        for name in [n for n in pending if finished.issuperset(GROUPS[n].after)]:
            if len(running) >= jobs:
                break
            pending.remove(name)
            running.append((name, subprocess.Popen([sys.executable, __file__, "--group", name])))
        time.sleep(0.5)
        for entry in list(running):
            if entry[1].poll() is not None:
                running.remove(entry)
                finished.add(entry[0])
                if entry[1].returncode:
                    failed.append(entry[0])
    print(f"warm total {time.perf_counter() - t0:.1f} s" + (f"; FAILED: {failed}" if failed else ""))


def pack(out_dir: Path) -> None:
    """The built modules' shared objects as a gzipped tar laid out as FlashInfer's AOT folder
    (NAME/NAME.so), in parts of PART_BYTES. FlashInfer loads a module found there as it is,
    without ninja or its object files, which is what keeps the archive small enough to carry.
    Modules already in the AOT folder (an older archive that prelude.sh unpacked, so this run
    built only what it lacked) go in too: the new archive holds every module."""
    from flashinfer.jit import env

    buffer = io.BytesIO()
    by_name = {lib.name: lib for lib in Path(env.FLASHINFER_AOT_DIR).glob("*/*.so")}
    by_name.update({lib.name: lib for lib in Path(env.FLASHINFER_JIT_DIR).glob("*/*.so")})
    libraries = [by_name[name] for name in sorted(by_name)]
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for library in libraries:
            tar.add(library, arcname=f"{library.parent.name}/{library.name}")
    data = buffer.getvalue()
    out_dir.mkdir(parents=True, exist_ok=True)
    for index, start in enumerate(range(0, len(data), PART_BYTES)):
        (out_dir / f"flashinfer_cache.tgz.part{index:02d}").write_bytes(data[start : start + PART_BYTES])
    print(
        f"packed {len(libraries)} modules, {len(data) / 2**20:.1f} MiB, into {out_dir}/flashinfer_cache.tgz.part*"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pack", type=Path, default=None, help="write the cache archive's parts here")
    parser.add_argument("--jobs", type=int, default=4, help="groups built at once")
    parser.add_argument(
        "--groups",
        default=",".join(DEFAULT_GROUPS),
        help="comma list of groups to warm (default: all but FA3's)",
    )
    parser.add_argument("--group", default=None, help=argparse.SUPPRESS)  # one group, in this process
    args = parser.parse_args()
    if args.group:
        warm_group(args.group)
        return
    warm([g for g in args.groups.split(",") if g], args.jobs)
    if args.pack is not None:
        pack(args.pack)


if __name__ == "__main__":
    main()

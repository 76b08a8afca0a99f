"""Where the decode time of the standard offline benchmark goes, step by step (GPU only).

The standard workload (benchmarks/offline.py) decodes for ~1,024 steps; at step t the
requests with ``max_tokens > t`` are running, each with ``prompt + t`` tokens of KV. This
rebuilds the batch of a few sampled steps exactly (lengths and a realistic KV placement:
each prompt contiguous, decode tokens interleaved step by step as the allocator hands them
out), times it on the GPU and integrates over all decode steps (trapezoid rule).

    python benchmarks/decode_breakdown.py engine      # the engine's captured decode graph + sampler,
                                                      # GPU time by kernel family
    python benchmarks/decode_breakdown.py attention   # one layer of decode attention per kernel
                                                      # variant (FlashInfer fa2 CUDA cores / tensor
                                                      # cores, page sizes, layouts, XQA)

Figures are GPU times from CUDA events (median of repeats) after warm-up; the integral is
the decode part of the benchmark's wall time when the host is hidden (overlap scheduling).
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

from offline import standard_workload  # noqa: E402

STEP_POINTS = (0, 64, 128, 256, 384, 512, 640, 768, 896, 1000)


def step_batch(prompt_lens: list[int], max_tokens: list[int], t: int) -> tuple[list[int], list[int]]:
    """(request indices running at decode step t, their KV lengths including this step's token)."""
    active = [i for i, n in enumerate(max_tokens) if n > t]
    return active, [prompt_lens[i] + t + 1 for i in active]


def token_locations(prompt_lens: list[int], max_tokens: list[int], page_size: int = 1) -> list[list[int]]:
    """KV location of every token of every request, as the allocator hands pages out: each
    prompt on consecutive pages, then decode step by step (request order), a request taking
    the next free page whenever its last page is full."""
    rows: list[list[int]] = []
    next_page = 0

    def extend(row: list[int], n: int) -> None:
        nonlocal next_page
        for _ in range(n):
            if len(row) % page_size == 0:
                row.append(next_page * page_size)
                next_page += 1
            else:
                row.append(row[-1] + 1)

    for n in prompt_lens:
        rows.append([])
        extend(rows[-1], n)
    for t in range(max(max_tokens)):
        for i, n in enumerate(max_tokens):
            if n > t:
                extend(rows[i], 1)
    return rows


def integrate(points: list[int], values: list[float], last_step: int) -> float:
    """Sum over steps 0..last_step of a per-step value known at ``points`` (trapezoid rule)."""
    total = 0.0
    xs, ys = [*points, last_step], [*values, values[-1]]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True), strict=False):
        total += (y0 + y1) / 2 * (x1 - x0)
    return total + ys[-1]


def gpu_median_ms(fn: Callable[[], object], reps: int = 10, inner: int = 1) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    return statistics.median(times)


def profiled_kernels(fn: Callable[[], object], calls: int) -> list[tuple[float, float, str]]:
    """(GPU us, launches, kernel name) per call of fn, over ``calls`` profiled calls, largest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = [
        ((getattr(e, "device_time_total", 0) or 0) / calls, e.count / calls, e.key[:100])
        for e in prof.key_averages()
    ]
    return sorted((r for r in rows if r[0] > 0), reverse=True)


def kernel_family(name: str) -> str:
    lowered = name.lower()
    attention = ("batchdecode", "batchprefill", "xqa", "kernel_mha", "merge_state", "mergestate", "attention")
    if any(s in lowered for s in attention):
        return "attention"
    if any(s in lowered for s in ("gemm", "nvjet", "xmma", "cutlass", "cublas", "splitk")):
        return "gemm"
    if any(s in lowered for s in ("rms_norm", "qk_norm", "norm_rope", "silu", "act_and_mul", "sample_")):
        return "triton"
    if "memcpy" in lowered or "memset" in lowered:
        return "copy"
    return "other"


def run_engine(args: argparse.Namespace) -> dict:
    import torch

    from wire.schema import SamplingParams
    from worker.engine.config import EngineConfig
    from worker.engine.engine import Engine
    from worker.forward import BatchLayout
    from worker.scheduler.prepare import sampling_tensors

    workload = standard_workload()
    prompt_lens = [len(p) for p in workload.prompts]
    config = EngineConfig(model=args.model, load_format="dummy", page_size=args.page_size, max_seq_len=4096)
    engine = Engine(config)
    runner = engine.graph_runner
    locations = token_locations(prompt_lens, workload.max_tokens, args.page_size)
    rows = torch.zeros((len(locations), max(len(r) for r in locations)), dtype=torch.int32)
    for i, r in enumerate(locations):
        rows[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
    if rows.max() >= engine.dummy_loc:
        raise RuntimeError(f"KV pool of {engine.dummy_loc} locations is too small for {rows.max() + 1}")
    engine.page_table[: rows.shape[0], : rows.shape[1]].copy_(rows)
    vocab = engine.model_config.vocab_size
    engine.token_pool.random_(0, min(vocab, 10000))
    results = []
    for t in args.steps:
        active, seq_lens = step_batch(prompt_lens, workload.max_tokens, t)
        batch = len(active)
        bs = runner.batch_size_for(batch)
        slots = torch.tensor(active, dtype=torch.int32)
        seq = torch.tensor(seq_lens, dtype=torch.int32)
        layout = BatchLayout(
            slots_cpu=slots.pin_memory(),
            cached_lens_cpu=(seq - 1).pin_memory(),
            extend_lens_cpu=torch.ones(batch, dtype=torch.int32).pin_memory(),
        )
        params = [SamplingParams(max_tokens=16, temperature=0.6)] * batch
        sampling = sampling_tensors(params, [t] * batch, engine.device, seeds=list(range(batch)))
        engine.backend.plan_for_replay(layout, bs)
        inputs = runner._inputs  # NOTE: the benchmark drives the graph's static rows directly
        inputs[0].fill_(engine.page_table.shape[0] - 1)
        inputs[1].zero_()
        inputs[2].fill_(engine.dummy_loc)  # this pass's K/V go to the dummy page
        inputs[0, :batch].copy_(slots.to(engine.device, torch.int64))
        inputs[1, :batch].copy_((seq - 1).to(engine.device, torch.int64))

        def step(graph=runner._graphs[bs], logits=runner._logits[bs][:batch], sampling=sampling) -> None:
            graph.replay()
            engine.sampler.sample(logits, sampling)

        ms = gpu_median_ms(step, reps=args.reps)
        kernels = profiled_kernels(step, calls=5)
        families: dict[str, list[float]] = {}
        for us, count, name in kernels:
            entry = families.setdefault(kernel_family(name), [0.0, 0.0])
            entry[0] += us / 1e3
            entry[1] += count
        if t in args.show_kernels:
            for us, count, name in kernels[:20]:
                print(f"    {us:8.1f} us {count:5.0f}x  {name}")
        kv_gb = (
            sum(seq_lens)
            * engine.kv.bytes_per_location(
                engine.model_config.num_layers, engine.kv.num_kv_heads, engine.kv.head_dim, engine.dtype
            )
            / 1e9
        )
        row = {"step": t, "batch": batch, "graph_bs": bs, "ms": ms, "kv_gb": kv_gb, "families": families}
        results.append(row)
        fam = "  ".join(f"{k} {v[0]:.3f} ms/{v[1]:.0f} kernels" for k, v in sorted(families.items()))
        print(f"step {t:5d} B {batch:3d} (graph {bs:3d}) {ms:7.3f} ms  KV {kv_gb:6.2f} GB  {fam}", flush=True)
    prefill = _prefill_step(engine, prompt_lens, rows, args.prefill_tokens) if args.prefill_tokens else None
    last = max(workload.max_tokens) - 1
    points = [r["step"] for r in results]
    total = integrate(points, [r["ms"] for r in results], last) / 1e3
    by_family = {
        name: integrate(points, [r["families"].get(name, [0.0])[0] for r in results], last) / 1e3
        for name in sorted({k for r in results for k in r["families"]})
    }
    print(f"decode GPU time over {last + 1} steps: {total:.2f} s; by kernel family (profiled):")
    for name, seconds in by_family.items():
        print(f"  {name:<10} {seconds:6.2f} s")
    return {"steps": results, "decode_s": total, "by_family_s": by_family, "prefill": prefill}


def _prefill_step(engine, prompt_lens: list[int], rows, num_tokens: int) -> dict:
    """One eager prefill pass of the first prompts (fresh, nothing cached) up to num_tokens."""
    import torch

    from worker.forward import BatchLayout, ForwardBatch

    lens, total = [], 0
    for n in prompt_lens:
        take = min(n, num_tokens - total)
        if take <= 0:
            break
        lens.append(take)
        total += take
    device = engine.device
    ext = torch.tensor(lens, dtype=torch.int32)
    layout = BatchLayout(
        slots_cpu=torch.arange(len(lens), dtype=torch.int32).pin_memory(),
        cached_lens_cpu=torch.zeros(len(lens), dtype=torch.int32).pin_memory(),
        extend_lens_cpu=ext.pin_memory(),
    )
    positions = torch.cat([torch.arange(n) for n in lens]).to(device)
    out_loc = torch.cat([rows[i, :n].long() for i, n in enumerate(lens)]).to(device)

    def step() -> None:
        batch = ForwardBatch(
            input_ids=torch.randint(0, 10000, (total,), device=device),
            positions=positions,
            out_loc=out_loc,
            sample_idx=(torch.cumsum(ext, 0) - 1).to(device),
            layout=layout,
            backend=engine.backend,
            attn_meta=engine.backend.plan(layout),
            kv=engine.kv,
        )
        engine.model(batch)

    with torch.inference_mode():
        ms = gpu_median_ms(step, reps=5)
        kernels = profiled_kernels(step, calls=1)
    print(f"prefill of {total} tokens ({len(lens)} prompts): {ms:.2f} ms (GPU, eager, plan included)")
    for us, count, name in kernels[:16]:
        print(f"    {us:8.1f} us {count:5.0f}x  {name}")
    return {"tokens": total, "ms": ms, "kernels": kernels[:40]}


def run_attention(args: argparse.Namespace) -> dict:
    import torch

    workload = standard_workload()
    prompt_lens = [len(p) for p in workload.prompts]
    locations = token_locations(prompt_lens, workload.max_tokens)
    num_locs = sum(len(r) for r in locations)
    q_heads, kv_heads, head_dim, layers = args.q_heads, args.kv_heads, 128, 2
    sm_scale = head_dim**-0.5
    device = torch.device("cuda")
    flat = [
        (torch.randn(num_locs + 4096, kv_heads, head_dim, dtype=torch.bfloat16, device=device),
         torch.randn(num_locs + 4096, kv_heads, head_dim, dtype=torch.bfloat16, device=device))
        for _ in range(layers)
    ]  # fmt: skip
    workspace = torch.zeros(256 * 1024 * 1024, dtype=torch.uint8, device=device)
    results: dict[str, list[float]] = {}
    for variant in args.variants:
        kind, page_size, layout = variant.split("-")
        page_size = int(page_size[1:])
        try:
            times = []
            for t in args.steps:
                active, seq_lens = step_batch(prompt_lens, workload.max_tokens, t)
                run = _attention_variant(
                    kind, page_size, layout, flat, locations, active, seq_lens, q_heads, kv_heads, head_dim,
                    sm_scale, workspace,
                )  # fmt: skip
                q = torch.randn(len(active), q_heads, head_dim, dtype=torch.bfloat16, device=device)
                ms = gpu_median_ms(
                    lambda q=q, run=run: [run(q, layer % layers) for layer in range(28)], args.reps
                )
                times.append(ms / 28)
                kv_bytes = sum(seq_lens) * kv_heads * head_dim * 2 * 2
                print(
                    f"{variant:<16} step {t:5d} B {len(active):3d} {1e3 * times[-1]:8.1f} us/layer "
                    f"{kv_bytes / (times[-1] / 1e3) / 1e12:5.2f} TB/s",
                    flush=True,
                )
            results[variant] = times
        except Exception as exc:  # noqa: BLE001  # NOTE: one failing variant must not hide the others
            print(f"{variant}: failed: {type(exc).__name__}: {exc}", flush=True)
    last = max(workload.max_tokens) - 1
    summary = {v: integrate(list(args.steps), ms, last) * 28 / 1e3 for v, ms in results.items()}
    print(f"decode attention over {last + 1} steps x 28 layers ({q_heads}/{kv_heads} heads):")
    for variant, seconds in summary.items():
        print(f"  {variant:<16} {seconds:6.2f} s")
    return {"per_layer_ms": results, "total_s": summary}


def _attention_variant(kind, page_size, layout, flat, locations, active, seq_lens, q_heads, kv_heads, head_dim,
                       sm_scale, workspace):  # fmt: skip
    """A callable q, layer -> out for one kernel variant over this batch (planned here)."""
    import flashinfer
    import torch

    device = workspace.device
    batch = len(active)
    if page_size == 1:
        caches = [(k.view(-1, 1, kv_heads, head_dim), v.view(-1, 1, kv_heads, head_dim)) for k, v in flat]
        page_ids = [
            torch.tensor(locations[i][:n], dtype=torch.int32) for i, n in zip(active, seq_lens, strict=True)
        ]
    else:
        # Pages of page_size tokens, each request on its own pages in a shuffled order.
        pages_per_req = [-(-n // page_size) for n in seq_lens]
        total_pages = sum(pages_per_req)
        num_pages = flat[0][0].shape[0] // page_size
        if total_pages > num_pages:
            raise RuntimeError("KV buffer too small")
        perm = torch.randperm(num_pages)[:total_pages].to(torch.int32)
        page_ids = list(perm.split(pages_per_req))
        shape = (
            (num_pages, page_size, kv_heads, head_dim)
            if layout == "nhd"
            else (num_pages, kv_heads, page_size, head_dim)
        )
        caches = [
            (k[: num_pages * page_size].view(shape), v[: num_pages * page_size].view(shape)) for k, v in flat
        ]
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    if kind == "xqa":
        max_pages = max(len(p) for p in page_ids)
        table = torch.zeros(batch, max_pages, dtype=torch.int32)
        for r, p in enumerate(page_ids):
            table[r, : len(p)] = p
        table, seq_gpu = table.to(device), seq.to(device)
        max_len = max_pages * page_size
        workspace.zero_()

        def run_xqa(q, layer):
            return flashinfer.decode.trtllm_batch_decode_with_kv_cache(
                q, caches[layer], workspace, table, seq_gpu, max_len, bmm1_scale=sm_scale, bmm2_scale=1.0,
                kv_layout=layout.upper(), backend="xqa",
            )  # fmt: skip

        return run_xqa
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor([len(p) for p in page_ids]), 0)
    indices = torch.cat(page_ids).to(device)
    last_page_len = seq - (torch.tensor([len(p) for p in page_ids]) - 1) * page_size
    backend, use_tc = {
        "cc": ("fa2", False),
        "tc": ("fa2", True),
        "tcns": ("fa2", True),
        "fa3": ("fa3", True),
    }[kind]
    no_split = {"disable_split_kv": True} if kind == "tcns" else {}
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, layout.upper(), use_tensor_cores=use_tc, backend=backend
    )
    wrapper.plan(
        indptr, indices, last_page_len.to(torch.int32), q_heads, kv_heads, head_dim, page_size,
        sm_scale=sm_scale, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, **no_split,
    )  # fmt: skip

    def run_fi(q, layer):
        return wrapper.run(q, caches[layer])

    return run_fi


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=["engine", "attention"])
    parser.add_argument("--model", default="configs/qwen3-0.6b.json")
    parser.add_argument("--steps", default=",".join(map(str, STEP_POINTS)))
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument(
        "--variants", default="cc-p1-nhd,tc-p1-nhd,tc-p16-hnd,cc-p16-hnd,xqa-p16-nhd,xqa-p16-hnd,fa3-p1-nhd",
        help="attention: kind-pPAGE-layout with kind cc (fa2 CUDA cores) | tc (fa2 tensor cores) | tcns (tc without"
        " split-KV) | fa3 | xqa",
    )  # fmt: skip
    parser.add_argument("--page-size", type=int, default=16, help="engine: the engine's page size")
    parser.add_argument(
        "--prefill-tokens", type=int, default=8192, help="engine: also profile a prefill pass"
    )
    parser.add_argument("--show-kernels", default="0,768", help="engine: steps whose top kernels to list")
    parser.add_argument("--q-heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.steps = [int(s) for s in args.steps.split(",")]
    args.show_kernels = [int(s) for s in args.show_kernels.split(",") if s]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    result = run_engine(args) if args.mode == "engine" else run_attention(args)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

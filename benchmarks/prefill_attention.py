"""Prefill attention of one Llama-3.1-8B-shaped pass over FP8 pages, on the device: the split path
(worker.attention.flashinfer_fp8_prefill: the pass's own K/V in bf16 through FlashInfer's ragged
prefill, cached prefixes from the FP8 pages, merged) against the paged path (FA2 over the FP8
pages whole, ``fp8_prefill="paged"``: what ran before).

32 layers, 32 q / 8 kv heads, head_dim 128, page 16, FP8 e4m3 pages with per-layer scales; each
workload is one pass of 8,192 new tokens (prompt lengths as the standard benchmark draws them,
``randint(100, 1024)``, the last one cut to fit):

    fresh     prompts with nothing cached: the prefill of an at-scale run
    prefixed  the same prompts, each over a cached prefix of randint(100, 1024) tokens
    ride      prompts of 7,936 tokens and 256 decode rows (cached randint(100, 1024)) riding along
    chunk     one 8,192-token chunk of a long prompt over 8,192 cached tokens

Per layer each path runs what the model runs: the fused qk-norm/rope/store kernel (the split
path with ``new_k``, the bf16 keys it attends) and the attention. ``store`` and ``store+k`` time
the kernel alone, without and with ``new_k``, so ``attn ms`` (path minus its kernel) and the
TFLOP/s (4 * q_heads * head_dim a visible query-key pair, causal) are the attention's own. GPU
time with CUDA events around the 32 layers, queued behind a sleep so that host launch gaps do not
count (``launch_ms``: the host time to issue them; the engine hides it behind the GEMMs), planned
before (``plan_ms``: the plan's host time), median of ``--repeat`` runs, the variants interleaved
within each repeat. ``err``: layer 0's output against float32 attention over the bf16 K/V the
pool was filled from (prefixes) and the model computed (the pass's own), on up to 256 rows of up
to 4 requests.

    source scripts/device/prelude.sh && python3 benchmarks/prefill_attention.py --repeat 5

``--paths`` picks the paths: ``paged``, ``split``, and ``split-fa3`` (the split path with FA3's
ragged kernel for the pass's own bf16 K/V, ``ragged_backend="fa3"``; the prefix part stays FA2).
A path FlashInfer cannot plan or run on a workload is printed as failed and left out.
"""

from __future__ import annotations

import argparse
import functools
import gc
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from worker.attention.registry import create_backend  # noqa: E402
from worker.forward import BatchLayout  # noqa: E402
from worker.kernels import ops  # noqa: E402
from worker.kvcache.pool import KVPool  # noqa: E402
from worker.models.rope import RotaryEmbedding  # noqa: E402

LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 32, 8, 128, 16
TOKENS = 8192
SCALE = 4.5 / 224  # |k|, |v| <= ~4.5 at headroom 2 (worker.kvcache.pool.HEADROOM)
ERR_ROWS, ERR_REQUESTS = 256, 4


def prompts(total: int, rng: random.Random) -> list[int]:
    lengths: list[int] = []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(100, 1024), total - sum(lengths)))
    return lengths


def workload(name: str) -> list[tuple[int, int]]:
    """(cached_len, extend_len) a request."""
    rng = random.Random(0)
    if name == "fresh":
        return [(0, e) for e in prompts(TOKENS, rng)]
    if name == "prefixed":
        return [(rng.randint(100, 1024), e) for e in prompts(TOKENS, rng)]
    if name == "ride":
        return [(0, e) for e in prompts(TOKENS - 256, rng)] + [
            (rng.randint(100, 1024), 1) for _ in range(256)
        ]
    if name == "chunk":
        return [(TOKENS, TOKENS)]
    raise ValueError(f"unknown workload {name!r}")


class Pass:
    """An FP8 pool holding the workload's requests on random pages, and the pass's inputs."""

    def __init__(self, specs: list[tuple[int, int]]) -> None:
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.specs = specs
        seq_lens = [c + e for c, e in specs]
        num_pages = sum(-(-n // PAGE) for n in seq_lens) + 1
        self.kv = KVPool(
            LAYERS, num_pages, PAGE, KV_HEADS, HEAD_DIM, torch.bfloat16, "cuda", torch.float8_e4m3fn
        )
        self.kv.set_scales([SCALE] * LAYERS, [SCALE] * LAYERS)
        for layer in range(LAYERS):
            for pages in (self.kv.k_buffer(layer), self.kv.v_buffer(layer)):
                for part in pages.split(max(1, pages.shape[0] // 16)):
                    raw = torch.randn(part.shape, device="cuda", generator=gen) / SCALE
                    part.copy_(raw.clamp_(-448, 448).to(part.dtype))
        self.page_table = torch.zeros(len(specs), max(seq_lens), dtype=torch.int32, device="cuda")
        perm = torch.randperm(num_pages - 1, device="cuda", generator=gen) + 1
        used, positions, out_loc = 0, [], []
        for slot, (cached, extend) in enumerate(specs):
            n = cached + extend
            pages = perm[used : used + -(-n // PAGE)]
            used += pages.numel()
            locs = (pages[:, None] * PAGE + torch.arange(PAGE, device="cuda")).flatten()[:n]
            self.page_table[slot, :n] = locs.to(torch.int32)
            positions.append(torch.arange(cached, n, device="cuda"))
            out_loc.append(locs[cached:])
        self.positions, self.out_loc = torch.cat(positions), torch.cat(out_loc)
        self.layout = BatchLayout(
            slots_cpu=torch.arange(len(specs), dtype=torch.int32).pin_memory(),
            cached_lens_cpu=torch.tensor([c for c, _ in specs], dtype=torch.int32).pin_memory(),
            extend_lens_cpu=torch.tensor([e for _, e in specs], dtype=torch.int32).pin_memory(),
        )
        rows = self.layout.num_tokens
        self.qkv = torch.randn(
            rows, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, device="cuda", generator=gen
        ).bfloat16()
        self.rope = RotaryEmbedding(HEAD_DIM, 2 * TOKENS + 1024, 500000.0, None, "cuda")
        self.new_k = torch.empty(rows, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        self.new_v = self.qkv[:, (Q_HEADS + KV_HEADS) * HEAD_DIM :].view(rows, KV_HEADS, HEAD_DIM)
        self.prefix_kv = self._true_prefixes(gen)

    def _true_prefixes(self, gen: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Layer 0's cached prefixes as bf16 values, stored into the pool as the engine stores them."""
        out = []
        for slot, (cached, _) in enumerate(self.specs):
            k, v = (
                torch.randn(cached, KV_HEADS, HEAD_DIM, device="cuda", generator=gen).bfloat16() for _ in "kv"
            )
            self.kv.store(0, self.page_table[slot, :cached].long(), k, v)
            out.append((k, v))
        return out

    def store(self, layer: int, keep_k: bool) -> torch.Tensor:
        """The fused qk-norm/rope/store kernel of one layer; q back, new_k written when asked."""
        q = ops.qk_norm_rope_store(
            self.qkv, self.positions, self.rope.cos_cache, self.rope.sin_cache, None, None, 1e-6,
            self.kv.k_buffer(layer), self.kv.v_buffer(layer), self.out_loc, Q_HEADS, KV_HEADS,
            SCALE, SCALE, self.new_k if keep_k else None,
        )  # fmt: skip
        assert q is not None, "the fused kernel runs on CUDA"
        return q

    def backend(self, path: str):
        """``paged``, ``split`` or ``split-fa3`` (the split path with FA3's ragged kernel)."""
        fp8_prefill, _, ragged = path.partition("-")
        return create_backend(
            "flashinfer", kv=self.kv, page_table=self.page_table, model_config=SimpleNamespace(num_q_heads=Q_HEADS),
            page_size=PAGE, device="cuda", fp8_prefill=fp8_prefill, ragged_backend=ragged or None,
        )  # fmt: skip

    def layer(self, backend, meta, layer: int) -> torch.Tensor:
        """One layer as the model runs it: store (and keep bf16 K), then attend."""
        wants = backend is not None and backend.wants_new_kv(meta)
        q = self.store(layer, wants)
        if backend is None:
            return q
        return backend.forward(q, layer, meta, (self.new_k, self.new_v) if wants else None)

    def pairs(self) -> int:
        """Visible (query, key) pairs of the pass, causal."""
        return sum(e * c + e * (e + 1) // 2 for c, e in self.specs)

    def error(self, out: torch.Tensor) -> float:
        """Layer 0: ‖out - float32 attention on bf16 K/V‖ / ‖reference‖ on a sample of rows."""
        cos, sin = self.rope.cos_cache, self.rope.sin_cache
        q_all, k_all, v_all = self.qkv.split(
            [Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1
        )
        num, den, start = 0.0, 0.0, 0
        for i, (cached, extend) in enumerate(self.specs):
            rows = slice(start, start + extend)
            start += extend
            if i >= ERR_REQUESTS:
                continue
            pos = self.positions[rows]
            q = ops.rope_ref(q_all[rows].reshape(extend, Q_HEADS, HEAD_DIM), pos, cos, sin)
            k_new = ops.rope_ref(k_all[rows].reshape(extend, KV_HEADS, HEAD_DIM), pos, cos, sin)
            k = torch.cat([self.prefix_kv[i][0], k_new]).float().repeat_interleave(Q_HEADS // KV_HEADS, 1)
            v = torch.cat([self.prefix_kv[i][1], v_all[rows].reshape(extend, KV_HEADS, HEAD_DIM)])
            v = v.float().repeat_interleave(Q_HEADS // KV_HEADS, 1)
            take = slice(max(0, extend - ERR_ROWS), extend)  # the last rows: the most keys
            scores = torch.einsum("ehd,shd->hes", q[take].float(), k) * HEAD_DIM**-0.5
            hidden = torch.arange(cached + extend, device="cuda")[None, :] > pos[take][:, None]
            ref = torch.einsum("hes,shd->ehd", scores.masked_fill(hidden, float("-inf")).softmax(-1), v)
            num += float((out[rows][take].float() - ref).norm() ** 2)
            den += float(ref.norm() ** 2)
        return (num / den) ** 0.5


def gpu_ms(fn) -> tuple[float, float]:
    """(GPU ms of fn's work, host ms to launch it). The stream first sleeps ~50 ms, so fn's
    launches are all queued before its work starts: the events time the GPU, not the host."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(100_000_000)
    start.record()
    t0 = time.perf_counter()
    fn()
    launch_ms = (time.perf_counter() - t0) * 1e3
    end.record()
    end.synchronize()
    return start.elapsed_time(end), launch_ms


def plan_ms(backend, layout: BatchLayout, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        backend.plan(layout)
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def bench(name: str, repeat: int, paths: list[str]) -> list[dict]:
    p = Pass(workload(name))
    backends, metas, errors = {}, {}, {}
    for path in paths:
        try:  # a kernel family FlashInfer cannot plan or run on this shape is reported, not fatal
            backends[path] = p.backend(path)
            metas[path] = backends[path].plan(p.layout)
            errors[path] = p.error(p.layer(backends[path], metas[path], 0))
        except Exception as exc:  # noqa: BLE001
            print(
                f"{name} {path}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True
            )
            backends.pop(path, None)
    variants = {
        path: functools.partial(
            lambda b, m: [p.layer(b, m, i) for i in range(LAYERS)], backends[path], metas[path]
        )
        for path in backends
    }
    variants["store"] = lambda: [p.store(i, False) for i in range(LAYERS)]
    variants["store+k"] = lambda: [p.store(i, True) for i in range(LAYERS)]
    for fn in variants.values():  # warm-up: modules loaded, allocator settled
        fn()
    times: dict[str, list[float]] = {v: [] for v in variants}
    launches: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(repeat):
        for variant, fn in variants.items():
            gpu, launch = gpu_ms(fn)
            times[variant].append(gpu)
            launches[variant].append(launch)
    ms = {v: statistics.median(t) for v, t in times.items()}
    flops = 4 * Q_HEADS * HEAD_DIM * p.pairs() * LAYERS
    rows = []
    for path in backends:
        store = "store" if path == "paged" else "store+k"
        attn = ms[path] - ms[store]
        rows.append({
            "workload": name, "requests": len(p.specs), "prefixed": sum(c > 0 for c, _ in p.specs),
            "path": path, "ms": ms[path], "store_ms": ms[store], "attn_ms": attn,
            "TFLOPs": flops / (attn * 1e-3) / 1e12, "plan_ms": plan_ms(backends[path], p.layout),
            "launch_ms": statistics.median(launches[path]), "err": errors[path],
            "runs": " ".join(f"{t:.2f}" for t in times[path]),
        })  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workloads", default="fresh,prefixed,ride,chunk")
    parser.add_argument(
        "--paths",
        default="paged,split,split-fa3",
        help="comma list: paged, split, split-fa3 (FA3's ragged part)",
    )
    args = parser.parse_args()
    rows = []
    for name in args.workloads.split(","):
        rows += bench(name, args.repeat, args.paths.split(","))
        gc.collect()  # NOTE: the last workload's pool goes before the next one's is filled
        torch.cuda.empty_cache()
    cols = [
        "workload",
        "requests",
        "prefixed",
        "path",
        "ms",
        "store_ms",
        "attn_ms",
        "TFLOPs",
        "plan_ms",
        "err",
    ]
    print("| " + " | ".join(cols) + " |")
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    for name in dict.fromkeys(r["workload"] for r in rows):
        ran = {r["path"]: r for r in rows if r["workload"] == name}
        base = ran.get("paged")
        for path, r in ran.items():
            if base is not None and path != "paged":
                print(
                    f"{name}: {path} / paged per pass {r['ms'] / base['ms']:.3f}, attention {r['attn_ms'] / base['attn_ms']:.3f}"
                )


if __name__ == "__main__":
    main()

"""FlashInfer prefill over FP8 pages (worker.attention.flashinfer_fp8_prefill) on a GPU.

1. What the design rests on: FlashInfer's window keeps key k for query row i when
   ``k >= kv_len - qo_len + i - window_left`` even without the causal mask, so a prefix-only
   part would misplace a window by qo_len (why windowed groups attend prefixed rows whole).
2. The split path (the pass's own K/V ragged, cached prefixes from the FP8 pages, merged)
   against the dense float32 oracle of tests/gpu/test_flashinfer_backend.py, which reads the
   pool; the pass's own K/V are handed in as the pool holds them (v strided, as the model hands
   it from its qkv projection), so any difference is the kernels' or the plumbing's. Chunked
   prompts, radix hits and decode rows riding along, requests with a prefix scattered through
   the batch or consecutive (a gather or a slice of rows), none at all; plain, windowed,
   soft-capped and mixed layer groups.
3. Numerics against float32 attention over the model's own bf16 K/V (not e4m3-representable),
   stored into the FP8 pool as the engine stores them: the split path, which attends the pass's
   K/V unrounded, is nearer than the paged path (benchmarks/prefill_attention.py prints both).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.gpu.test_flashinfer_backend import (  # noqa: E402
    Q_MULT,
    SOFTCAP_REL_ERR,
    SOFTCAPPED,
    WINDOWED,
    Case,
    assert_matches,
    make_backend,
    relative_error,
)
from worker.attention.registry import create_backend  # noqa: E402
from worker.forward import BatchLayout  # noqa: E402
from worker.kvcache.pool import KVPool  # noqa: E402

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn

# name -> (q heads, kv heads, head_dim, attention of layers 0 and 1, q_mult, rel_err or None)
MODELS = {
    "llama": (32, 8, 128, (), 1.0, None),
    "mistral": (*WINDOWED["mistral"], 1.0, None),  # every layer slides: whole rows only
    "gemma3": (*WINDOWED["gemma3"], 1.0, None),  # a sliding and a global group
    "gemma2": (*SOFTCAPPED, Q_MULT, SOFTCAP_REL_ERR),  # soft-cap and scale, a window on one
}
# (cached_len, extend_len) a request; the 40-token windows reach into the prefixes
SPECS = {
    # chunks over earlier chunks, radix hits, decode rows, fresh prompts: gathered rows
    "scattered": [(0, 64), (64, 64), (0, 72), (48, 1), (200, 30), (0, 50), (33, 1), (500, 17)],
    "consecutive": [(0, 40), (96, 80), (300, 1), (17, 33), (0, 120)],  # one slice of rows
    "fresh": [(0, 200), (0, 1), (0, 77), (0, 300)],  # the ragged part alone
}


@pytest.fixture(scope="module")
def device() -> str:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import flashinfer  # noqa: F401  (on a GPU machine a missing FlashInfer is an error, not a skip)

    return "cuda"


def dense(q, k, v, keep: torch.Tensor, scale: float) -> torch.Tensor:
    """float32 softmax attention; q [E, Hq, D], k/v [S, Hkv, D], keep [E, S]."""
    group = q.shape[1] // k.shape[1]
    k, v = (x.float().repeat_interleave(group, dim=1) for x in (k, v))
    scores = torch.einsum("ehd,shd->hes", q.float(), k) * scale
    return torch.einsum("hes,shd->ehd", scores.masked_fill(~keep, float("-inf")).softmax(-1), v)


def test_flashinfer_window_counts_from_the_end_of_the_kv(device: str) -> None:
    """Rows over a prefix of kv_len keys, not causal, window_left 39: FlashInfer keeps key k for
    row i when k >= kv_len - qo_len + i - 39, not from the rows' true positions kv_len + i."""
    from flashinfer import BatchPrefillWithRaggedKVCacheWrapper

    gen = torch.Generator(device=device).manual_seed(0)
    qo_len, kv_len, window_left = 30, 100, 39
    q = torch.randn(qo_len, 32, 128, device=device, generator=gen).bfloat16()
    k, v = (torch.randn(kv_len, 8, 128, device=device, generator=gen).bfloat16() for _ in range(2))
    wrapper = BatchPrefillWithRaggedKVCacheWrapper(
        torch.empty(128 * 2**20, dtype=torch.uint8, device=device), "NHD", backend="fa2"
    )
    wrapper.plan(
        torch.tensor([0, qo_len], dtype=torch.int32), torch.tensor([0, kv_len], dtype=torch.int32),
        32, 8, 128, causal=False, window_left=window_left, q_data_type=torch.bfloat16,
    )  # fmt: skip
    out = wrapper.run(q, k, v)
    row, key = torch.arange(qo_len, device=device)[:, None], torch.arange(kv_len, device=device)[None, :]

    def windowed(first_row_at: int) -> torch.Tensor:
        return dense(q, k, v, key >= first_row_at + row - window_left, 128**-0.5)

    torch.testing.assert_close(out.float(), windowed(kv_len - qo_len), atol=1e-2, rtol=2e-2)
    assert relative_error(out, windowed(kv_len)) > 0.1


@pytest.mark.parametrize("ragged", ["fa2", "fa3"])
@pytest.mark.parametrize("specs", list(SPECS))
@pytest.mark.parametrize("name", list(MODELS))
def test_split_prefill_matches_dense_oracle(device: str, name: str, specs: str, ragged: str) -> None:
    """The pass's own bf16 K/V through FA2 or FA3 (``ragged_backend``, Hopper), the prefixes
    through FA2 over the FP8 pages, merged: against float32 attention."""
    q_heads, kv_heads, head_dim, attentions, q_mult, rel_err = MODELS[name]
    case = Case(
        SPECS[specs], q_heads, kv_heads, 16, device, head_dim=head_dim, attentions=attentions,
        q_mult=q_mult, cache_dtype=FP8,
    )  # fmt: skip
    backend = make_backend(case, device, ragged_backend=ragged)
    batch = case.batch()
    meta = backend.plan(batch.layout)
    assert backend.wants_new_kv(meta) and type(meta).__name__ == "Fp8PrefillMeta"
    assert (meta.rows is None) == (specs == "fresh")
    if meta.rows is not None:
        assert (meta.rows.span is not None) == (specs == "consecutive")
    for layer in range(len(case.attentions)):
        k, v = case.new_kv(batch, layer)
        qkv = torch.cat([k, k, v], dim=1)  # v strided, as the model hands it over
        out = backend.forward(batch.q, layer, meta, (k, qkv[:, 2 * kv_heads :]))
        assert out.shape == batch.q.shape and bool(torch.isfinite(out).all())
        assert_matches(out, case.oracle(batch, layer), False, rel_err)


def test_split_prefill_is_nearer_to_bf16_attention(device: str) -> None:
    """Keys and values as the model computes them (bf16), stored into FP8 pages with calibrated
    scales as the engine stores them; float32 attention over the bf16 values is the reference.
    The split path attends the pass's own K/V unrounded, the paged path reads them back from
    e4m3: the split path's error is the smaller, by far for requests without a prefix."""
    gen = torch.Generator(device=device).manual_seed(3)
    q_heads, kv_heads, head_dim, page_size = 32, 8, 128, 16
    specs = [(0, 512), (256, 256), (0, 300), (700, 100), (0, 1)]
    seq_lens = [c + e for c, e in specs]
    num_pages = sum(-(-n // page_size) for n in seq_lens) + 1
    kv = KVPool(1, num_pages, page_size, kv_heads, head_dim, torch.bfloat16, device, FP8)
    k_all, v_all = (
        torch.randn(sum(seq_lens), kv_heads, head_dim, device=device, generator=gen) for _ in range(2)
    )
    k_all, v_all = k_all.bfloat16(), (0.5 * v_all).bfloat16()
    kv.set_scales([float(k_all.abs().max()) / 224], [float(v_all.abs().max()) / 224])  # HEADROOM 2
    page_table = torch.zeros(len(specs), max(seq_lens), dtype=torch.int32, device=device)
    perm = torch.randperm(num_pages - 1, device=device, generator=gen) + 1
    start = pages_used = 0
    new_rows, refs = [], []
    q = (torch.randn(sum(e for _, e in specs), q_heads, head_dim, device=device, generator=gen)).bfloat16()
    for slot, (cached, extend) in enumerate(specs):
        n = cached + extend
        pages = perm[pages_used : pages_used + -(-n // page_size)]
        pages_used += pages.numel()
        locs = (pages[:, None] * page_size + torch.arange(page_size, device=device)).flatten()[:n]
        page_table[slot, :n] = locs.to(torch.int32)
        k, v = k_all[start : start + n], v_all[start : start + n]
        kv.store(0, locs, k, v)
        new_rows.append(torch.arange(start + cached, start + n, device=device))
        rows = q[sum(e for _, e in specs[:slot]) :][:extend]
        pos = torch.arange(cached, n, device=device)[:, None]
        refs.append(dense(rows, k, v, torch.arange(n, device=device)[None, :] <= pos, head_dim**-0.5))
        start += n
    ref = torch.cat(refs)
    new = torch.cat(new_rows)
    layout = BatchLayout(
        slots_cpu=torch.arange(len(specs), dtype=torch.int32).pin_memory(),
        cached_lens_cpu=torch.tensor([c for c, _ in specs], dtype=torch.int32).pin_memory(),
        extend_lens_cpu=torch.tensor([e for _, e in specs], dtype=torch.int32).pin_memory(),
    )
    errors = {}
    for path in ("split", "paged"):
        backend = create_backend(
            "flashinfer", kv=kv, page_table=page_table, model_config=SimpleNamespace(num_q_heads=q_heads),
            page_size=page_size, device=device, fp8_prefill=path,
        )  # fmt: skip
        meta = backend.plan(layout)
        new_kv = (k_all[new], v_all[new]) if backend.wants_new_kv(meta) else None
        errors[path] = relative_error(backend.forward(q, 0, meta, new_kv), ref)
    print(f"relative error against float32 attention on bf16 K/V: {errors}")
    assert errors["split"] < 0.5 * errors["paged"] and errors["split"] < 0.02, errors

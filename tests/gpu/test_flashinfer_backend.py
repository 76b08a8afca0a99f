"""FlashInferBackend against a dense attention oracle (and the torch reference backend).

Each case builds a KV pool filled with random bf16 K/V, scatters every request's tokens
over randomly chosen pages (some requests share prefix pages, as the radix cache makes
them), and checks the backend's output against causal softmax attention computed densely
in fp32 from the same locations. Per-layer attention options (ModelConfig.layer_attention:
sliding window, logit soft-cap, scale) are applied by the oracle as plain torch masks and
formulas written from LayerAttention's meaning, independent of any backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from worker.engine.graph import fitting_batch_size  # noqa: E402
from worker.forward import BatchLayout  # noqa: E402
from worker.kvcache.pool import FP8_E4M3_MAX, KVPool  # noqa: E402
from worker.models.config import LayerAttention  # noqa: E402

pytestmark = pytest.mark.gpu

HEADS = [(16, 8), (32, 8)]  # (q heads, kv heads): Qwen3-0.6B and Llama-3-8B shapes
HEAD_DIM = 128
NUM_LAYERS = 2
MAX_SEQ_LEN = 1024
ATOL, RTOL = 1e-2, 2e-2  # bf16 output rounding of values of magnitude <= ~1


@dataclass(frozen=True)
class Batch:
    """One forward pass over some of a case's requests."""

    layout: BatchLayout
    specs: list[tuple[int, int]]  # (cached_len, extend_len) a request
    q: torch.Tensor  # [T, q_heads, head_dim] bf16


class Case:
    """A KV pool and page table holding requests given as (cached_len, extend_len)."""

    def __init__(
        self,
        specs: list[tuple[int, int]],
        q_heads: int,
        kv_heads: int,
        page_size: int,
        device: str,
        seed: int = 0,
        share_prefix: bool = True,
        cache_dtype: torch.dtype | None = None,
        head_dim: int = HEAD_DIM,
        attentions: tuple[LayerAttention, ...] = (),
        q_mult: float = 1.0,
    ) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.specs, self.page_size, self.q_heads, self.device = specs, page_size, q_heads, device
        self.head_dim, self.q_mult = head_dim, q_mult  # q_mult scales the queries: larger logits
        self.attentions = attentions or (LayerAttention(),) * NUM_LAYERS
        seq_lens = [c + e for c, e in specs]
        pages_needed = sum(-(-n // page_size) for n in seq_lens) + 3
        self.kv = KVPool(
            NUM_LAYERS, pages_needed, page_size, kv_heads, head_dim, torch.bfloat16, device, cache_dtype
        )
        if self.kv.quantized:  # pages hold k / k_scale: scales other than 1 must reach the kernel
            self.kv.set_scales([0.01 * (1 + layer) for layer in range(NUM_LAYERS)], [0.02, 0.005])
        for layer in range(NUM_LAYERS):
            for cache, scale in (
                (self.kv.k_buffer(layer), self.kv.k_scale[layer]),
                (self.kv.v_buffer(layer), self.kv.v_scale[layer]),
            ):
                values = torch.randn(cache.shape, generator=self.gen) / (scale if self.kv.quantized else 1.0)
                if self.kv.quantized:
                    # NOTE: torch's cast turns values past +-448 into NaN (e4m3fn has no inf); at
                    # v_scale 0.005 one value in 40 is past it, which made NaN outputs. The engine
                    # saturates as it stores (KVPool.store, the fused store kernel); so does this.
                    values = values.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
                cache.copy_(values.to(cache.dtype))
        num_slots = 2 * len(specs) + 3
        page_table = torch.full((num_slots, MAX_SEQ_LEN), -1, dtype=torch.int32)
        self.slots = torch.randperm(num_slots, generator=self.gen)[: len(specs)].to(torch.int32)
        free_pages = torch.randperm(pages_needed, generator=self.gen).tolist()
        first_row: torch.Tensor | None = None
        for i, n in enumerate(seq_lens):
            pages = [free_pages.pop() for _ in range(-(-n // page_size))]
            row = (torch.tensor(pages)[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
            if share_prefix and first_row is not None and i % 2 == 1:
                # Requests at odd positions reuse whole pages of request 0's prefix.
                shared = min(n, len(first_row)) // page_size * page_size
                row[:shared] = first_row[:shared]
            if first_row is None:
                first_row = row.clone()
            page_table[self.slots[i], :n] = row.to(torch.int32)
        self.page_table = page_table.to(device)
        self.model_config = SimpleNamespace(
            num_q_heads=q_heads, num_kv_heads=kv_heads, head_dim=head_dim, layer_attention=attentions
        )

    def batch(self, requests: list[int] | None = None) -> Batch:
        """A pass over the given requests (default: all), with fresh random queries."""
        idx = list(range(len(self.specs))) if requests is None else requests
        specs = [self.specs[i] for i in idx]
        pin = self.device == "cuda"

        def host(values: list[int]) -> torch.Tensor:
            t = torch.tensor(values, dtype=torch.int32)
            return t.pin_memory() if pin else t

        layout = BatchLayout(
            slots_cpu=host([int(self.slots[i]) for i in idx]),
            cached_lens_cpu=host([c for c, _ in specs]),
            extend_lens_cpu=host([e for _, e in specs]),
        )
        num_tokens = sum(e for _, e in specs)
        q = (self.q_mult * torch.randn(num_tokens, self.q_heads, self.head_dim, generator=self.gen)).to(
            torch.bfloat16
        )
        return Batch(layout, specs, q.to(self.device))

    def new_kv(self, batch: Batch, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The pass's own K/V as the pool holds them (model dtype, [T, kv heads, dim] each, the
        pass's rows): what an FP8 prefill (AttentionBackend.wants_new_kv) is handed here, so
        that the oracle, which reads the pool, covers it too."""
        locs = [
            self.page_table[slot, cached : cached + extend].long()
            for slot, (cached, extend) in zip(batch.layout.slots_cpu.tolist(), batch.specs, strict=True)
        ]
        return self.kv.gather(layer_id, torch.cat(locs))

    def oracle(self, batch: Batch, layer_id: int, attention: LayerAttention | None = None) -> torch.Tensor:
        """Dense causal attention in fp32, each request read from its page-table locations, as
        the layer's LayerAttention says (or ``attention``): query at position p sees keys
        p - sliding_window + 1 .. p; scores are q.k * scale, then soft-capped."""
        attention = self.attentions[layer_id] if attention is None else attention
        group = self.q_heads // self.kv.num_kv_heads
        outs, start = [], 0
        for slot, (cached, extend) in zip(batch.layout.slots_cpu.tolist(), batch.specs, strict=True):
            locs = self.page_table[slot, : cached + extend].long()
            assert bool((locs >= 0).all()), "test bug: request reads an unset page-table entry"
            k, v = (
                x.float().repeat_interleave(group, dim=1) for x in self.kv.gather(layer_id, locs)
            )  # [S, Hq, D]
            q = batch.q[start : start + extend].float()  # [E, Hq, D]
            scores = torch.einsum("ehd,shd->hes", q, k) * attention.scale_for(self.head_dim)
            if attention.logit_softcap:
                scores = attention.logit_softcap * torch.tanh(scores / attention.logit_softcap)
            q_pos = cached + torch.arange(extend, device=q.device)[None, :, None]
            k_pos = torch.arange(cached + extend, device=q.device)[None, None, :]
            hidden = k_pos > q_pos
            if attention.sliding_window:
                hidden |= k_pos <= q_pos - attention.sliding_window
            scores = scores.masked_fill(hidden, float("-inf"))
            outs.append(torch.einsum("hes,shd->ehd", scores.softmax(-1), v))
            start += extend
        return torch.cat(outs)


def make_backend(case: Case, device: str, **kw):
    from worker.attention.registry import create_backend

    return create_backend(
        "flashinfer",
        kv=case.kv,
        page_table=case.page_table,
        model_config=case.model_config,
        page_size=case.page_size,
        device=device,
        **kw,
    )


# XQA's FP8 kernel rounds the queries and the softmax probabilities to e4m3 (3 mantissa bits)
# for its FP8 MMAs, so its output sits a few percent from the exact one; a wrong scale or page
# lands at 30% and more.
XQA_REL_ERR = 0.05


# FlashInfer soft-caps with PTX tanh.approx.f32 (relative error up to 2^-11): at a cap of 50 a
# logit moves by up to ~0.025, a few percent of a softmax weight, so soft-capped outputs are
# compared in norm; ignoring the cap or the scale lands far beyond (assert_bites).
SOFTCAP_REL_ERR = 0.03


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).norm() / ref.norm())


def assert_matches(out: torch.Tensor, ref: torch.Tensor, xqa: bool, rel_err: float | None = None) -> None:
    """Elementwise within bf16 rounding, or (XQA over FP8 pages, or ``rel_err`` given) within
    that relative error in norm."""
    if xqa or rel_err is not None:
        bound = max(XQA_REL_ERR if xqa else 0.0, rel_err or 0.0)
        rel = relative_error(out, ref)
        assert rel < bound, f"relative error {rel:.4f}"
    else:
        torch.testing.assert_close(out.float(), ref, atol=ATOL, rtol=RTOL)


def check_eager(case: Case, device: str, rel_err: float | None = None, **kw) -> set[str]:
    """All requests, then (re-planning the same backend) every other one; the meta types seen."""
    backend = make_backend(case, device, **kw)
    seen = set()
    for requests in (None, list(range(0, len(case.specs), 2))):
        batch = case.batch(requests)
        meta = backend.plan(batch.layout)
        xqa = type(meta).__name__ == "XqaMeta"
        seen.add(type(meta).__name__)
        for layer in range(NUM_LAYERS):
            new_kv = case.new_kv(batch, layer) if backend.wants_new_kv(meta) else None
            out = backend.forward(batch.q, layer, meta, new_kv)
            assert out.shape == batch.q.shape and out.dtype == torch.bfloat16
            assert_matches(out, case.oracle(batch, layer), xqa, rel_err)
    return seen


def mixed_specs(page_size: int) -> list[tuple[int, int]]:
    """Prefill with cached prefixes, fresh prompts and decode rows in one batch."""
    return [(0, 37), (3 * page_size, 1), (100, 200), (33, 1), (5 * page_size, 17), (0, 1), (250, 130)]


def decode_specs(batch_size: int, seed: int) -> list[tuple[int, int]]:
    gen = torch.Generator().manual_seed(seed)
    return [(int(n) - 1, 1) for n in torch.randint(1, 700, (batch_size,), generator=gen)]


@pytest.fixture(scope="module")
def device() -> str:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import flashinfer  # noqa: F401  (on a GPU machine a missing FlashInfer is an error, not a skip)

    return "cuda"


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", HEADS)
def test_mixed_prefill_matches_dense_oracle(device: str, heads: tuple[int, int], page_size: int) -> None:
    """Ragged causal prefill over cached prefixes, shared pages and 1-token rows."""
    check_eager(Case(mixed_specs(page_size), *heads, page_size, device), device)


@pytest.mark.parametrize("page_size", [1, 16])
def test_fresh_prefill_matches_dense_oracle(device: str, page_size: int) -> None:
    """Prompts with nothing cached (cached_len 0), one of them spanning many pages."""
    specs = [(0, 513), (0, 1), (0, 64), (0, 300)]
    check_eager(Case(specs, 16, 8, page_size, device, share_prefix=False), device)


@pytest.mark.parametrize("use_tensor_cores", [True, False])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", HEADS)
def test_decode_matches_dense_oracle(
    device: str, heads: tuple[int, int], page_size: int, use_tensor_cores: bool
) -> None:
    """Pure decode batch (every extend_len == 1) through the decode wrapper."""
    case = Case(decode_specs(13, seed=page_size), *heads, page_size, device)
    assert case.batch().layout.is_decode
    check_eager(case, device, use_tensor_cores=use_tensor_cores)


@pytest.mark.parametrize("batch_size", [13, 150])
def test_decode_kernel_choice_by_batch_size(device: str, batch_size: int) -> None:
    """Default: CUDA-core decode for small batches, tensor cores for large ones (both exact)."""
    case = Case(decode_specs(batch_size, seed=batch_size), 16, 8, 16, device)
    backend = make_backend(case, device)
    assert backend.decode_uses_tensor_cores(batch_size) == (batch_size >= 64)
    check_eager(case, device)


def check_graph_replay(
    case: Case, backend, sizes: list[int], request_sets: list[list[int]], rel_err: float | None = None
) -> None:
    """Capture one decode graph per size on dummy data, then replay each request set (padded
    to the smallest size that holds it) and compare every layer with the dense oracle."""
    backend.init_cuda_graphs(sizes, max_seq_len=MAX_SEQ_LEN)
    graphs = {}
    for bs in sorted(sizes, reverse=True):
        q_static = torch.zeros(bs, case.q_heads, case.head_dim, dtype=torch.bfloat16, device=case.device)
        meta = backend.capture_meta(bs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture: every layer (group, module)
            for layer in range(NUM_LAYERS):
                backend.forward(q_static, layer, meta)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [backend.forward(q_static, layer, meta) for layer in range(NUM_LAYERS)]
        graphs[bs] = (graph, q_static, outs)
    for requests in request_sets:
        batch = case.batch(requests)
        bs = fitting_batch_size(backend.graph_batch_sizes, batch.layout.batch_size)
        graph, q_static, outs = graphs[bs]
        meta = backend.plan_for_replay(batch.layout, bs)
        q_static.zero_()
        q_static[: len(requests)].copy_(batch.q)
        graph.replay()
        for layer in range(NUM_LAYERS):
            got = outs[layer][: len(requests)]
            assert bool(torch.isfinite(got).all()), f"non-finite output in layer {layer}"
            assert_matches(got, case.oracle(batch, layer), type(meta).__name__ == "XqaMeta", rel_err)


@pytest.mark.parametrize("use_tensor_cores", [True, False, None])
@pytest.mark.parametrize("page_size", [1, 16])
def test_cuda_graph_replay_matches_dense_oracle(
    device: str, page_size: int, use_tensor_cores: bool | None
) -> None:
    """Decode graphs captured on dummy data replay correctly for new, padded batches."""
    case = Case(decode_specs(16, seed=7), 16, 8, page_size, device, seed=7)
    backend = make_backend(case, device, use_tensor_cores=use_tensor_cores)
    assert backend.supports_cuda_graphs
    check_graph_replay(case, backend, [8, 4], [[0, 3, 5, 9, 12], list(range(8, 16)), [15, 2, 7], [4]])
    assert backend.graph_batch_sizes == [4, 8]
    assert fitting_batch_size(backend.graph_batch_sizes, 1) == 4
    assert fitting_batch_size(backend.graph_batch_sizes, 5) == 8
    assert fitting_batch_size(backend.graph_batch_sizes, 9) is None


def test_matches_torch_reference_backend(device: str) -> None:
    """Same batch through the torch reference backend (the CPU-side oracle of the engine)."""
    from worker.attention import torch_ref

    case = Case(mixed_specs(16), 16, 8, 16, device)
    batch = case.batch()
    flash = make_backend(case, device)
    ref = torch_ref.create(
        kv=case.kv, page_table=case.page_table, model_config=case.model_config, page_size=16, device=device
    )
    meta_f, meta_r = flash.plan(batch.layout), ref.plan(batch.layout)
    for layer in range(NUM_LAYERS):
        torch.testing.assert_close(
            flash.forward(batch.q, layer, meta_f).float(),
            ref.forward(batch.q, layer, meta_r).float(),
            atol=ATOL,
            rtol=RTOL,
        )


@pytest.mark.parametrize("use_tensor_cores", [True, False])
def test_fp8_kv_matches_dense_oracle(device: str, use_tensor_cores: bool) -> None:
    """FP8 (e4m3) pages with per-layer scales, bf16 queries: prefill over cached prefixes and
    decode through FA2, against the dense oracle on the pool's dequantized K/V (KVPool.gather)."""
    fp8 = torch.float8_e4m3fn
    check_eager(Case(mixed_specs(16), 16, 8, 16, device, cache_dtype=fp8), device, decode_kernel="fa2")
    case = Case(decode_specs(80, seed=3), 32, 8, 16, device, cache_dtype=fp8)
    check_eager(case, device, use_tensor_cores=use_tensor_cores, decode_kernel="fa2")


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("page_size", [16, 32])
def test_fp8_kv_xqa_decode_matches_dense_oracle(device: str, heads: tuple[int, int], page_size: int) -> None:
    """The default FP8 decode kernel (XQA) over shared and scattered pages; prefill rows in the
    same case still go through FA2."""
    fp8 = torch.float8_e4m3fn
    case = Case(decode_specs(37, seed=11), *heads, page_size, device, seed=11, cache_dtype=fp8)
    backend = make_backend(case, device)
    assert type(backend.plan(case.batch().layout)).__name__ == "XqaMeta"
    check_eager(case, device)
    check_eager(Case(mixed_specs(page_size), *heads, page_size, device, cache_dtype=fp8), device)


@pytest.mark.parametrize("decode_kernel", ["fa2", "auto"])
def test_fp8_kv_cuda_graph_replay(device: str, decode_kernel: str) -> None:
    """The scales are baked into captured decode graphs: replays still match the oracle and
    hold no NaN (FA2, and XQA by default)."""
    case = Case(decode_specs(16, seed=5), 16, 8, 16, device, seed=5, cache_dtype=torch.float8_e4m3fn)
    backend = make_backend(case, device, decode_kernel=decode_kernel)
    check_graph_replay(case, backend, [8], [[0, 3, 5, 9, 12], list(range(8, 16))])


def test_large_graph_batches_plan_without_split_kv(device: str) -> None:
    """1,024-request graphs at 32/8 heads fit the 256 MiB workspace (their split-KV scratch,
    335,282,176 bytes as FlashInfer counted it when it overflowed, turns split-KV off) and still
    replay exactly; a 16-request graph keeps split-KV."""
    from worker.attention.flashinfer import split_scratch_bytes

    assert split_scratch_bytes(1024, 32, 8, 128) > 335_282_176  # tmp_v alone is that
    case = Case(decode_specs(40, seed=9), 32, 8, 16, device, seed=9)
    backend = make_backend(case, device)
    check_graph_replay(case, backend, [16, 1024], [list(range(40)), list(range(10))])
    assert (
        backend._graph_wrappers[1024][0]._radixq_no_split
        and not backend._graph_wrappers[16][0]._radixq_no_split
    )


# ---- per-layer attention options (ModelConfig.layer_attention) --------------------------------

WINDOW = 40  # tokens a query sees, itself included: not a multiple of the page size
GLOBAL = LayerAttention()
# name -> (q heads, kv heads, head_dim, attention of layers 0 and 1)
WINDOWED = {
    # Gemma-3-12B's shape: a sliding layer and a global one (two plan groups), head_dim 256
    "gemma3": (16, 8, 256, (LayerAttention(sliding_window=WINDOW), GLOBAL)),
    # Mistral-7B's shape: every layer slides (one group), head_dim 128
    "mistral": (32, 8, 128, (LayerAttention(sliding_window=WINDOW),) * 2),
}
# Gemma 2: soft-cap 50 on every layer, a sliding and a global one, its own scale (head_dim 256)
SOFTCAP, SCALE = 50.0, 0.1
SOFTCAPPED = (
    16,
    8,
    256,
    (
        LayerAttention(sliding_window=WINDOW, logit_softcap=SOFTCAP, scale=SCALE),
        LayerAttention(logit_softcap=SOFTCAP, scale=SCALE),
    ),
)
Q_MULT = 25.0  # logits of standard deviation ~40 at scale 0.1: the cap bites hard


def chunked_specs() -> list[tuple[int, int]]:
    """Chunks of long prompts over their earlier chunks (cached_len > 0, as chunked prefill and
    radix hits leave them), fresh prompts and decode rows; windows reach into the prefixes."""
    return [(0, 64), (64, 64), (128, 72), (48, 1), (200, 30), (7, 50), (33, 1), (500, 17)]


def assert_bites(case: Case, layer: int, other: LayerAttention, min_rel: float) -> None:
    """The case is one where the option matters: attending as ``other`` instead of the layer's
    own LayerAttention moves the oracle's output by more than ``min_rel`` (norm)."""
    batch = case.batch()
    rel = relative_error(case.oracle(batch, layer, other), case.oracle(batch, layer))
    assert rel > min_rel, f"layer {layer}: {other} is only {rel:.3f} away; the case does not test the option"


@pytest.mark.parametrize("name", list(WINDOWED))
def test_sliding_window_prefill_over_cached_prefixes(device: str, name: str) -> None:
    """Chunked prefill with a window shorter than the sequences: each query sees its own
    WINDOW positions, cached prefix included, in the sliding layers; the global layer all."""
    q_heads, kv_heads, head_dim, attentions = WINDOWED[name]
    case = Case(chunked_specs(), q_heads, kv_heads, 16, device, head_dim=head_dim, attentions=attentions)
    assert_bites(case, 0, GLOBAL, 0.2)
    check_eager(case, device)


@pytest.mark.parametrize(
    ("name", "use_tensor_cores"), [("gemma3", False), ("gemma3", True), ("mistral", None)]
)
def test_sliding_window_decode_longer_than_the_window(
    device: str, name: str, use_tensor_cores: bool | None
) -> None:
    """Decode rows of up to 700 tokens against a 40-token window, on CUDA cores and tensor cores."""
    q_heads, kv_heads, head_dim, attentions = WINDOWED[name]
    specs = decode_specs(70, seed=13)
    case = Case(specs, q_heads, kv_heads, 16, device, seed=13, head_dim=head_dim, attentions=attentions)
    assert_bites(case, 0, GLOBAL, 0.2)
    check_eager(case, device, use_tensor_cores=use_tensor_cores)


@pytest.mark.parametrize("name", list(WINDOWED))
def test_sliding_window_cuda_graph_replay(device: str, name: str) -> None:
    """Captured decode graphs of every layer group replay windows correctly for new batches."""
    q_heads, kv_heads, head_dim, attentions = WINDOWED[name]
    case = Case(
        decode_specs(16, seed=17), q_heads, kv_heads, 16, device, 17, head_dim=head_dim, attentions=attentions
    )
    backend = make_backend(case, device)
    assert len(backend._prefills) == len(set(attentions))  # one plan group per distinct attention
    check_graph_replay(case, backend, [8, 4], [[0, 3, 5, 9, 12], list(range(8, 16)), [15, 2, 7]])


@pytest.mark.parametrize("name", list(WINDOWED))
def test_sliding_window_fp8_kv(device: str, name: str) -> None:
    """FP8 pages: windowed prefill through FA2, windowed decode through XQA (its sliding-window
    module), eager and replayed from graphs."""
    q_heads, kv_heads, head_dim, attentions = WINDOWED[name]
    options = dict(head_dim=head_dim, attentions=attentions, cache_dtype=torch.float8_e4m3fn)
    check_eager(Case(chunked_specs(), q_heads, kv_heads, 16, device, **options), device)
    case = Case(decode_specs(37, seed=19), q_heads, kv_heads, 16, device, 19, **options)
    assert check_eager(case, device) == {"XqaMeta"}
    check_graph_replay(case, make_backend(case, device), [8], [[0, 3, 5, 9, 12], list(range(8, 16))])


@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_soft_cap_and_scale(device: str, use_tensor_cores: bool) -> None:
    """Gemma 2's options with large logits: soft-cap 50 and scale 0.1 on both layers, a window on
    one; prefill over cached prefixes and decode, eager and (decode) replayed from graphs."""
    q_heads, kv_heads, head_dim, attentions = SOFTCAPPED
    options = dict(head_dim=head_dim, attentions=attentions, q_mult=Q_MULT)
    prefill = Case(chunked_specs(), q_heads, kv_heads, 16, device, **options)
    for layer, attention in enumerate(attentions):
        assert_bites(
            prefill, layer, LayerAttention(sliding_window=attention.sliding_window, scale=SCALE), 0.2
        )
        # the same layer with the default scale: head_dim ** -0.5 = 0.0625
        assert_bites(prefill, layer, LayerAttention(attention.sliding_window, logit_softcap=SOFTCAP), 0.05)
    check_eager(prefill, device, SOFTCAP_REL_ERR, use_tensor_cores=use_tensor_cores)
    decode = Case(decode_specs(24, seed=23), q_heads, kv_heads, 16, device, 23, **options)
    check_eager(decode, device, SOFTCAP_REL_ERR, use_tensor_cores=use_tensor_cores)
    backend = make_backend(decode, device, use_tensor_cores=use_tensor_cores)
    check_graph_replay(decode, backend, [8], [[0, 3, 5, 9, 12], list(range(8, 16))], SOFTCAP_REL_ERR)


def test_soft_cap_fp8_kv_decodes_through_fa2(device: str) -> None:
    """FP8 pages with soft-capped layers: XQA has no soft-cap, so "auto" decodes through FA2
    (here on tensor cores) and stays exact; asking for XQA is refused with the reason."""
    q_heads, kv_heads, head_dim, attentions = SOFTCAPPED
    options = dict(head_dim=head_dim, attentions=attentions, q_mult=Q_MULT, cache_dtype=torch.float8_e4m3fn)
    check_eager(Case(chunked_specs(), q_heads, kv_heads, 16, device, **options), device, SOFTCAP_REL_ERR)
    case = Case(decode_specs(24, seed=29), q_heads, kv_heads, 16, device, 29, **options)
    assert check_eager(case, device, SOFTCAP_REL_ERR, use_tensor_cores=True) == {"FlashInferMeta"}
    with pytest.raises(ValueError, match="soft-cap"):
        make_backend(case, device, decode_kernel="xqa")

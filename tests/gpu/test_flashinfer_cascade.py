"""FlashInferCascadeBackend on a GPU: against the torch reference, the plain FlashInfer path
and, through the engine, transformers.

Rows of grouped requests begin with the same bf16 KV pages (tests/cascade_scenario.py); the
cascade backend reads those once per group and merges with flashinfer.merge_state. Oracles:
TorchRefBackend (float32 math on the same bf16 KV) and FlashInferBackend's plain path on the
layout without groups. Eager passes only: cascade steps are never replayed from CUDA graphs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.cascade_scenario import DECODE, PREFILL, scenario  # noqa: E402
from worker.attention.torch_ref import TorchRefBackend  # noqa: E402

pytestmark = pytest.mark.gpu
HEAD_DIM = 128
ATOL, RTOL = 1e-2, 2e-2  # bf16 output rounding of values of magnitude <= ~1 (as test_flashinfer_backend)


@pytest.fixture(scope="module")
def device() -> str:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import flashinfer  # noqa: F401  (on a GPU machine a missing FlashInfer is an error, not a skip)

    return "cuda"


def _backends(kv, page_table, q_heads: int, page_size: int, **kw):
    from worker.attention.flashinfer import FlashInferBackend
    from worker.attention.flashinfer_cascade import FlashInferCascadeBackend

    config = SimpleNamespace(num_q_heads=q_heads)
    return (
        FlashInferCascadeBackend(kv, page_table, config, page_size, "cuda", **kw),
        FlashInferBackend(kv, page_table, config, page_size, "cuda", **kw),
        TorchRefBackend(kv, page_table, q_heads, HEAD_DIM, page_size),
    )


def _check(requests, page_size: int, heads: tuple[int, int], prefix_pages=None, **kw) -> None:
    from worker.attention.flashinfer_cascade import CascadeMeta

    kv, page_table, plain, grouped, q, layer = scenario(
        requests, page_size, *heads, seed=page_size, prefix_pages=prefix_pages,
        head_dim=HEAD_DIM, dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip
    cascade, flash, ref = _backends(kv, page_table, heads[0], page_size, **kw)
    meta = cascade.plan(grouped)
    assert isinstance(meta, CascadeMeta)
    got = cascade.forward(q, layer, meta)
    assert got.shape == q.shape and got.dtype == torch.bfloat16
    expected = ref.forward(q, layer, ref.plan(plain)).float()
    torch.testing.assert_close(got.float(), expected, atol=ATOL, rtol=RTOL)
    plain_flash = flash.forward(q, layer, flash.plan(plain)).float()
    torch.testing.assert_close(got.float(), plain_flash, atol=ATOL, rtol=RTOL)
    # the same backend, planned without groups, is the plain path
    torch.testing.assert_close(
        cascade.forward(q, layer, cascade.plan(plain)).float(), plain_flash, atol=0, rtol=0
    )


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", [(16, 8), (32, 8)])
@pytest.mark.parametrize(
    "requests", [DECODE, PREFILL, DECODE[:3] + PREFILL[:4]], ids=["decode", "prefill", "mixed"]
)
def test_cascade_matches_reference_and_plain_path(device, requests, page_size, heads) -> None:
    """Two groups (members apart in the batch), requests in none; decode, prefill over a
    cached prefix, and both in one pass."""
    _check(requests, page_size, heads)


@pytest.mark.parametrize("use_tensor_cores", [True, False])
def test_large_decode_batch_with_long_prefixes(device, use_tensor_cores: bool) -> None:
    """96 decoding requests in 6 groups sharing 512-token prefixes, plus 8 in none: both
    decode kernels as the suffix pass."""
    prefix_pages = {g: 32 for g in range(6)}
    gen = torch.Generator().manual_seed(3)
    extras = torch.randint(0, 150, (96,), generator=gen).tolist()
    requests = [(i % 6, extras[i], 1) for i in range(96)]
    requests += [(None, 100 + 13 * i, 1) for i in range(8)]
    _check(requests, 16, (16, 8), prefix_pages=prefix_pages, use_tensor_cores=use_tensor_cores)


def test_engine_cascade_tokens_match_transformers(device, tmp_path) -> None:
    """A shared-prefix workload through LLM with cascade on (threshold 0, CUDA graphs on):
    cascade passes ran (and none with it off), and the greedy tokens of both runs agree with
    transformers' up to bf16 near-ties (tests/gpu/test_engine_gpu.py's margin rule)."""
    from tests.gpu.test_engine_gpu import _assert_matches_oracle
    from tests.model_fixtures import tiny_hf_model
    from wire.schema import SamplingParams
    from worker import LLM

    hf = tiny_hf_model(
        "qwen3", spread=0.05, vocab_size=512, hidden_size=256, intermediate_size=512,
        head_dim=128, max_position_embeddings=1024,
    )  # fmt: skip
    hf.save_pretrained(tmp_path)
    oracle = hf.to(torch.bfloat16).float().cuda()
    gen = torch.Generator().manual_seed(5)
    systems = [torch.randint(0, 500, (200,), generator=gen).tolist() for _ in range(3)]
    prompts = [
        s + torch.randint(0, 500, (5 + 3 * k,), generator=gen).tolist() for k in range(6) for s in systems
    ]
    greedy = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    outputs = {}
    for cascade in (False, True):
        llm = LLM(
            str(tmp_path), dtype="bfloat16", max_running_reqs=32, num_pages=4096, max_seq_len=512,
            cascade_attention=cascade, cascade_min_saved_mib=0.0,
        )  # fmt: skip
        planned: list = []  # each eager pass's prefix groups (replayed graphs do not plan)
        plan = llm.engine.backend.plan

        def spy(layout, plan=plan, planned=planned):
            planned.append(layout.prefix_groups)
            return plan(layout)

        llm.engine.backend.plan = spy
        llm.generate(systems, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        results = llm.generate(prompts, greedy)
        assert all(r.error is None for r in results)
        outputs[cascade] = [r.choices[0].token_ids for r in results]
        assert any(g is not None for g in planned) == cascade
        del llm
        torch.cuda.empty_cache()
    # bf16 sums in another order may flip a near-tie: both runs answer to the oracle's margin rule
    for mode in (True, False):
        for prompt, tokens in zip(prompts, outputs[mode], strict=True):
            _assert_matches_oracle(oracle, prompt, tokens, greedy.max_tokens)

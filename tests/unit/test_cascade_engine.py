"""Cascade attention through the whole engine: same greedy tokens with it on and off.

A shared-prefix workload on a tiny random Llama (transformers' greedy generate is the
oracle for both runs): three system prompts are cached first, then many requests with
unique tails on each, plus requests that share nothing, run together. A spy on the attention
backend proves the cascade really ran on decode and on prefill passes over a cached prefix.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.model_fixtures import hf_greedy, tiny_hf_model
from wire.schema import SamplingParams
from worker.attention.torch_cascade import TorchCascadeBackend
from worker.forward import BatchLayout
from worker.llm import LLM

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cascade-llama")
    tiny_hf_model("llama", spread=0.2).save_pretrained(path)
    return path


def _workload(page_size: int) -> tuple[list[list[int]], list[list[int]]]:
    """(system prompts to cache first, the batch): 3 systems x 4 tails, and 2 loners."""
    gen = torch.Generator().manual_seed(page_size)
    systems = [torch.randint(1, 250, (2 * page_size + 5,), generator=gen).tolist() for _ in range(3)]
    batch = []
    for k in range(4):
        for system in systems:
            batch.append(system + torch.randint(1, 250, (3 + 2 * k,), generator=gen).tolist())
    batch += [torch.randint(1, 250, (n,), generator=gen).tolist() for n in (9, 21)]
    return systems, batch


class _Spy:
    """Counts the passes a backend planned with prefix groups, by kind."""

    def __init__(self, backend: TorchCascadeBackend) -> None:
        self.decode_groups = 0
        self.prefill_groups = 0
        plan = backend.plan

        def spy(layout: BatchLayout):
            if layout.prefix_groups is not None:
                if layout.is_decode:
                    self.decode_groups += 1
                else:
                    self.prefill_groups += 1
            return plan(layout)

        backend.plan = spy  # type: ignore[method-assign]


def _run(
    path: Path, page_size: int, overlap: bool, cascade: bool, **options
) -> tuple[list[list[int]], _Spy | None]:
    llm = LLM(
        str(path),
        device="cpu",
        attention="torch",
        page_size=page_size,
        overlap=overlap,
        cascade_attention=cascade,
        cascade_min_saved_mib=0.0,
        **options,
    )
    spy = None
    if cascade:
        assert isinstance(llm.engine.backend, TorchCascadeBackend)
        spy = _Spy(llm.engine.backend)
    systems, batch = _workload(page_size)
    llm.generate(systems, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    results = llm.generate(batch, GREEDY)
    assert all(r.error is None for r in results)
    assert sum(r.usage.cached_tokens > 0 for r in results) >= 12
    llm.scheduler.check_integrity()
    return [r.choices[0].token_ids for r in results], spy


@pytest.mark.parametrize(
    ("page_size", "overlap", "options"),
    [(1, True, {}), (16, False, {}), (16, True, {}), (4, True, {"max_prefill_tokens": 16})],
    ids=["page1", "page16", "page16-overlap", "page4-chunked"],
)
def test_cascade_on_equals_off_and_hf(model_dir: Path, page_size: int, overlap: bool, options: dict) -> None:
    """Groups on decode and prefill passes (chunked prefill too); tokens equal the plain
    engine's and transformers'."""
    plain, _ = _run(model_dir, page_size, overlap, cascade=False, **options)
    cascade, spy = _run(model_dir, page_size, overlap, cascade=True, **options)
    assert cascade == plain
    assert spy is not None and spy.decode_groups >= 1 and spy.prefill_groups >= 1
    # every step after the prompts' first decodes with groups (mixed steps count as prefill)
    assert spy.decode_groups + spy.prefill_groups >= GREEDY.max_tokens
    hf = tiny_hf_model("llama", spread=0.2)
    _, batch = _workload(page_size)
    for prompt, tokens in list(zip(batch, cascade, strict=True))[::3]:
        assert tokens == hf_greedy(hf, prompt, GREEDY.max_tokens)


def test_n_choices_form_a_group(model_dir: Path) -> None:
    """n = 4 greedy choices of one prompt share its KV: they decode as one group, and every
    choice equals transformers' greedy continuation."""
    llm = LLM(
        str(model_dir), device="cpu", attention="torch", page_size=4,
        cascade_attention=True, cascade_min_saved_mib=0.0,
    )  # fmt: skip
    spy = _Spy(llm.engine.backend)  # type: ignore[arg-type]
    prompt = _workload(4)[1][0]
    sampling = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, n=4)
    result = llm.generate([prompt], sampling)[0]
    assert spy.decode_groups >= 1
    expected = hf_greedy(tiny_hf_model("llama", spread=0.2), prompt, 8)
    assert [c.token_ids for c in result.choices] == [expected] * 4


def test_cost_rule_keeps_small_groups_on_the_plain_path(model_dir: Path) -> None:
    """At the default threshold (32 MiB a layer) a tiny model's groups never pay: no pass is
    planned with groups, and the tokens are the same."""
    llm = LLM(str(model_dir), device="cpu", attention="torch", page_size=16, cascade_attention=True)
    spy = _Spy(llm.engine.backend)  # type: ignore[arg-type]
    systems, batch = _workload(16)
    llm.generate(systems, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    results = llm.generate(batch[:6], GREEDY)
    assert spy.decode_groups == spy.prefill_groups == 0
    hf = tiny_hf_model("llama", spread=0.2)
    assert results[0].choices[0].token_ids == hf_greedy(hf, batch[0], GREEDY.max_tokens)

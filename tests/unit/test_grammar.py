"""Structured output's building blocks: the token bitmask against a torch reference (CPU, and
the device path against the CPU path), the sampler drawing only allowed tokens, and the grammar
engine (cache, per-job errors, choice lists) on SmolLM2's tokenizer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.model_fixtures import smollm2_dir  # noqa: F401  (fixture)
from wire.schema import SamplingParams
from worker.engine import grammar as grammar_module
from worker.engine.grammar import GrammarError, Grammars, apply_token_bitmask
from worker.engine.sampler import Sampler
from worker.scheduler.prepare import sampling_tensors

VOCAB = 1000  # not a multiple of 32: the last word is partly padding


def reference_mask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """The documented rule written out: bit j of word w allows token 32 * w + j."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask.cpu().unsqueeze(-1) >> shifts) & 1
    allowed = bits.reshape(bitmask.shape[0], -1)[:, : logits.shape[-1]].bool()
    return logits.cpu().masked_fill(~allowed, float("-inf"))


def random_case(batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, VOCAB, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31, (batch, -(-VOCAB // 32)), generator=gen, dtype=torch.int64)
    bitmask = bitmask.to(torch.int32)
    bitmask[0] = -1  # a row allowing everything (an unconstrained request)
    return logits, bitmask


def test_bitmask_on_cpu_matches_reference() -> None:
    logits, bitmask = random_case(6, seed=0)
    masked = logits.clone()
    apply_token_bitmask(masked, bitmask)
    assert torch.equal(masked, reference_mask(logits, bitmask))
    assert torch.equal(masked[0], logits[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_on_device_matches_cpu(dtype: torch.dtype) -> None:
    logits, bitmask = random_case(64, seed=1)
    logits = logits.to(dtype)
    on_cpu = logits.clone()
    apply_token_bitmask(on_cpu, bitmask)
    on_gpu = logits.cuda()
    apply_token_bitmask(on_gpu, bitmask.cuda())
    assert torch.equal(on_gpu.cpu(), on_cpu)
    assert torch.equal(on_cpu.float(), reference_mask(logits.float(), bitmask))


def test_sampler_draws_only_allowed_tokens() -> None:
    """Greedy and sampled rows (with top-k/top-p filters and without) never leave the mask."""
    logits, bitmask = random_case(48, seed=2)
    bitmask[0] = 0
    bitmask[0, 3] = 1 << 5  # row 0 allows exactly token 3 * 32 + 5
    allowed = reference_mask(torch.zeros(48, VOCAB), bitmask) == 0
    for params in (
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.5),
        SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
    ):
        tensors = sampling_tensors([params] * 48, [0] * 48, "cpu", seeds=list(range(48)))
        tokens = Sampler().sample(logits.clone(), tensors, bitmask).long()
        assert allowed.gather(1, tokens.unsqueeze(1)).all(), params
        assert tokens[0] == 3 * 32 + 5


@pytest.fixture(scope="module")
def grammars(smollm2_dir: Path) -> Grammars:  # noqa: F811
    loaded = grammar_module.load_grammars(str(smollm2_dir), vocab_size=49152, stop_token_ids=[2])
    assert loaded is not None
    return loaded


@pytest.mark.model
def test_compiled_grammars_are_cached_by_key(grammars: Grammars, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    first = grammars.compile(SamplingParams(json_schema=schema))
    hits = grammars.cache_hits
    assert grammars.compile(SamplingParams(json_schema=dict(schema))) is first
    assert grammars.cache_hits == hits + 1
    monkeypatch.setattr(grammar_module, "GRAMMAR_CACHE_SIZE", 2)
    for pattern in ("a+", "b+", "c+"):
        grammars.compile(SamplingParams(regex=pattern))
    misses = grammars.cache_misses
    grammars.compile(SamplingParams(json_schema=schema))  # evicted (least recently used)
    assert grammars.cache_misses == misses + 1


@pytest.mark.model
@pytest.mark.parametrize(
    ("sampling", "field", "why"),
    [
        (SamplingParams(json_schema={"type": "objectx"}), "json_schema", "objectx"),
        (SamplingParams(json_schema={"$ref": "#/$defs/missing"}), "json_schema", "missing"),
        (SamplingParams(regex="a(("), "regex", "parenthesis"),
    ],
)
def test_invalid_constraint_names_field(
    grammars: Grammars, sampling: SamplingParams, field: str, why: str
) -> None:
    with pytest.raises(GrammarError) as info:
        grammars.compile(sampling)
    message = str(info.value)
    assert info.value.field == field and message.startswith(f"{field}: ") and why in message
    assert ".cc:" not in message  # xgrammar's source location is not the user's business


@pytest.mark.model
def test_choice_list_accepts_exactly_its_options(grammars: Grammars, smollm2_dir: Path) -> None:  # noqa: F811
    from worker.models.tokenizer import load_tokenizer_or_none

    tokenizer = load_tokenizer_or_none(str(smollm2_dir))
    options = ["yes", 'say "no"', "back\\slash", "two\nlines", "café ☃"]
    compiled = grammars.compile(SamplingParams(choice=options))
    for option in options:
        matcher = grammars.matcher(compiled)
        for token in tokenizer.encode(option, add_special_tokens=False):
            matcher.accept(token)
        assert not matcher.rejected, option
        matcher.accept(2)  # EOS: the grammar is complete
        assert matcher.terminated, option
    matcher = grammars.matcher(compiled)
    for token in tokenizer.encode("nope", add_special_tokens=False):
        matcher.accept(token)
    assert matcher.rejected and matcher.done


@pytest.mark.model
def test_token_bitmask_rows(grammars: Grammars) -> None:
    """Unconstrained and finished rows allow everything; a JSON row allows '{' and not EOS."""
    assert grammars.token_bitmask([None, None]) is None
    compiled = grammars.compile(SamplingParams(json_object=True))
    live, finished = grammars.matcher(compiled), grammars.matcher(compiled)
    finished.accept(2)  # EOS before any JSON: rejected, so done
    bitmask = grammars.token_bitmask([None, live, finished])
    assert bitmask is not None and bitmask.shape == (3, 49152 // 32)
    assert (bitmask[0] == -1).all() and (bitmask[2] == -1).all()
    allowed = reference_mask(torch.zeros(1, 49152), bitmask[1:2])[0] == 0
    assert not allowed[2]
    assert 0 < int(allowed.sum()) < 49152


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_mask_allowing_only_stop_tokens_wins_over_min_tokens(temperature: float) -> None:
    """Row 0's grammar allows only EOS (token 2) while min_tokens masks it: the grammar wins
    and EOS is drawn. Row 1 allows EOS and token 40: min_tokens holds, 40 is drawn. Row 2
    (no grammar) never draws EOS while min_tokens holds."""
    from worker.engine.penalties import build_penalties, penalty_row

    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(4))
    bitmask = torch.full((3, -(-VOCAB // 32)), -1, dtype=torch.int32)
    bitmask[:2] = 0
    bitmask[:2, 0] = 1 << 2
    bitmask[1, 1] |= 1 << 8  # token 40
    params = SamplingParams(temperature=temperature, min_tokens=5, seed=0)
    rows = [penalty_row(params, [2], VOCAB)] * 3
    pool = torch.zeros(3, 16, dtype=torch.int32)
    penalties = build_penalties(rows, [0, 1, 2], [4] * 3, [5] * 3, pool)
    tensors = sampling_tensors([params] * 3, [1] * 3, "cpu", seeds=[0, 1, 2])
    tensors = dataclasses.replace(tensors, penalties=penalties)
    for _ in range(3):
        tokens = Sampler().sample(logits.clone(), tensors, bitmask).tolist()
        assert tokens[:2] == [2, 40] and tokens[2] != 2

"""Structured output on SmolLM2-135M-Instruct (GGUF, CPU) through the offline LLM API.

Oracles: ``jsonschema`` validates every JSON output that ended on "stop"; ``re.fullmatch`` and
the choice list check the others; transformers' greedy ``generate`` with a logits processor
written here (its own xgrammar matcher, the bitmask unpacked with torch) gives the exact tokens
of constrained greedy decoding, with overlap scheduling on and off."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from tests.model_fixtures import smollm2_dir  # noqa: F401  (fixture)
from wire.schema import SamplingParams
from worker.llm import LLM

pytestmark = pytest.mark.model
MAX_TOKENS = 64
EOS = 2

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
    {
        "type": "object",
        "properties": {
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 12},
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["tags"],
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string", "maxLength": 20}, "zip": {"type": "integer"}},
                "required": ["street", "zip"],
            },
        },
        "required": ["city", "address"],
    },
    {
        "type": "object",
        "properties": {"is_open": {"type": "boolean"}, "rating": {"type": "number"}},
        "required": ["is_open", "rating"],
    },
    {
        "type": "object",
        "properties": {"scores": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}},
        "required": ["scores"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 10}, "qty": {"type": "integer"}},
                    "required": ["name", "qty"],
                },
            }
        },
        "required": ["items"],
    },
    {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}},
        "required": ["code"],
    },
    {
        "type": "object",
        "properties": {"status": {"const": "ok"}, "id": {"type": "integer"}},
        "required": ["status", "id"],
    },
    {
        "type": "object",
        "properties": {
            "nickname": {"type": ["string", "null"], "maxLength": 16},
            "level": {"enum": [1, 2, 3]},
        },
        "required": ["nickname", "level"],
    },
    {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 30}, "year": {"type": "integer"}},
        "required": ["title"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3},
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 16},
                    "roles": {"type": "array", "items": {"enum": ["admin", "dev", "guest"]}, "maxItems": 2},
                },
                "required": ["name", "roles"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    {
        "type": "object",
        "properties": {"temperature": {"type": "number"}, "unit": {"enum": ["C", "F"]}},
        "required": ["temperature", "unit"],
    },
]


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def llm(smollm2_dir: Path) -> LLM:  # noqa: F811
    return LLM(str(smollm2_dir), device="cpu", attention="torch", page_size=16, max_seq_len=1024)


def test_json_schemas_validate(llm: LLM) -> None:
    """Every output that ends on "stop" parses and validates; cut ones are counted, a majority
    finishes. Half the jobs are greedy, half sampled (seeded)."""
    prompts = [_chat(f"Reply with a JSON value matching this schema: {json.dumps(s)}") for s in SCHEMAS]
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, json_schema=s, temperature=0.0 if i % 2 else 0.7, seed=i)
        for i, s in enumerate(SCHEMAS)
    ]
    results = llm.generate(prompts, params)
    finished = {"stop": 0, "length": 0}
    for schema, result in zip(SCHEMAS, results, strict=True):
        assert result.error is None
        choice = result.choices[0]
        finished[choice.finish_reason] += 1
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.text), schema)
        else:
            assert len(choice.token_ids) == MAX_TOKENS
    print(f"json_schema outputs: {finished['stop']} stop, {finished['length']} cut at length")
    assert finished["stop"] > len(SCHEMAS) // 2


def test_regex_choice_object_and_errors_in_one_batch(llm: LLM) -> None:
    """Each kind of constraint in one batch with unconstrained jobs and two invalid ones: the
    invalid ones get their own invalid_job error, the others are unaffected."""
    plain = SamplingParams(max_tokens=12, temperature=0.0)
    regex = r"[A-Z][a-z]{2,8} (is|was) [0-9]{1,3}"
    jobs = [
        (
            _chat("Give a name and an age."),
            SamplingParams(max_tokens=24, temperature=0.7, seed=3, regex=regex),
        ),
        (
            _chat("Is the sky blue?"),
            SamplingParams(max_tokens=8, temperature=0.0, choice=["yes", "no", "not sure"]),
        ),
        (
            _chat("Pick a fruit."),
            SamplingParams(max_tokens=8, temperature=1.0, seed=5, choice=["apple", "kiwi"]),
        ),
        (
            _chat("Describe a dog in JSON."),
            SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, json_object=True),
        ),
        (_chat("Count to five."), plain),
        (_chat("Hi"), SamplingParams(max_tokens=8, json_schema={"type": "objectx"})),
        (_chat("Hi"), SamplingParams(max_tokens=8, regex="(unclosed")),
    ]
    results = llm.generate([p for p, _ in jobs], [s for _, s in jobs])
    texts = [r.choices[0].text if r.choices else None for r in results]
    reasons = [r.choices[0].finish_reason if r.choices else None for r in results]
    assert reasons[0] == "length" or re.fullmatch(regex, texts[0]), texts[0]
    assert reasons[0] == "length" or len(results[0].choices[0].token_ids) < 24
    assert reasons[1] == "stop" and texts[1] in ("yes", "no", "not sure")
    assert reasons[2] == "stop" and texts[2] in ("apple", "kiwi")
    if reasons[3] == "stop":
        assert isinstance(json.loads(texts[3]), dict)
    print(f"regex: {reasons[0]} {texts[0]!r}; json_object: {reasons[3]} {texts[3]!r}")
    alone = llm.generate([jobs[4][0]], plain)[0]
    assert results[4].choices[0].token_ids == alone.choices[0].token_ids
    for result, field in zip(results[5:], ("json_schema", "regex"), strict=True):
        assert result.error is not None and result.error.code == "invalid_job"
        assert result.error.message.startswith(f"{field}: ")


def _hf_constrained_greedy(
    hf: Any, tokenizer: Any, schema: dict[str, Any], prompt_ids: list[int]
) -> list[int]:
    """transformers' greedy generate with a logits processor that masks with its own matcher."""
    import xgrammar as xgr

    vocab = hf.config.vocab_size
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=[EOS])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    shifts = torch.arange(32, dtype=torch.int32)

    def processor(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] > len(prompt_ids):
            assert matcher.accept_token(int(input_ids[0, -1]))
        matcher.fill_next_token_bitmask(bitmask)
        allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(1, -1)[:, :vocab].bool()
        return scores.masked_fill(~allowed, float("-inf"))

    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            logits_processor=[processor],
            eos_token_id=EOS,
        )
    tokens = out[0, len(prompt_ids) :].tolist()
    return tokens[: tokens.index(EOS)] if EOS in tokens else tokens


@pytest.mark.parametrize("overlap", [True, False])
def test_greedy_constrained_tokens_match_transformers(llm: LLM, smollm2_dir: Path, overlap: bool) -> None:  # noqa: F811
    from transformers import AutoModelForCausalLM

    engine = (
        llm
        if overlap
        else LLM(str(smollm2_dir), device="cpu", attention="torch", page_size=16, overlap=False)
    )
    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    schemas = [SCHEMAS[0], SCHEMAS[6]]
    prompts = [_chat(f"Reply in JSON matching: {json.dumps(s)}") for s in schemas]
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, json_schema=s) for s in schemas]
    results = engine.generate(prompts, params)
    for prompt, schema, result in zip(prompts, schemas, results, strict=True):
        expected = _hf_constrained_greedy(hf, engine.tokenizer, schema, engine.encode(prompt))
        assert result.choices[0].token_ids == expected

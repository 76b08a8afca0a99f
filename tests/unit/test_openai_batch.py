"""OpenAI Batch request lines onto jobs, and results back as response lines.

The oracle for the response shapes is the ``openai`` package's own types, validated strictly;
the conformance table is checked against the request parameter types of the same package."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from openai.types import Completion
from openai.types import completion_create_params as completion_params
from openai.types.chat import ChatCompletion
from openai.types.chat import completion_create_params as chat_params

from producer.jsonl import parse_line, read_jobs
from producer.openai_request import CHAT_URL, COMPLETIONS_URL, FIELDS, conformance_table
from producer.output_lines import output_record
from wire.schema import (
    ChatMessage,
    Choice,
    ErrorInfo,
    JobError,
    Result,
    Timings,
    TokenLogprob,
    TopLogprob,
    Usage,
)

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def _line(url: str, body: dict[str, Any], custom_id: str = "r1") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def _chat(**body: Any) -> str:
    return _line(CHAT_URL, {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})


def _completion(**body: Any) -> str:
    return _line(COMPLETIONS_URL, {"model": "m", "prompt": "once", **body})


def _rejected(line: str) -> JobError:
    with pytest.raises(JobError) as caught:
        parse_line(line, 1)
    return caught.value


# ---- the conformance table ------------------------------------------------------------------


def _openai_fields(params: Any) -> set[str]:
    return set(params.CompletionCreateParamsBase.__annotations__) | set(
        params.CompletionCreateParamsNonStreaming.__annotations__
    )


@pytest.mark.parametrize(("url", "params"), [(CHAT_URL, chat_params), (COMPLETIONS_URL, completion_params)])
def test_every_openai_request_field_has_a_row(url: str, params: Any) -> None:
    """Every body field the openai package declares for the endpoint is classified for it."""
    missing = sorted(
        name for name in _openai_fields(params) if name not in FIELDS or url not in FIELDS[name].urls
    )
    assert missing == []


def test_the_guide_holds_the_conformance_table() -> None:
    assert conformance_table() in GUIDE.read_text()


# ---- request fields, row by row -------------------------------------------------------------


def _example(name: str) -> Any:
    """A value of the field that is not its default (what a user would send to use it)."""
    return {
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": "auto",
        "functions": [{"name": "f"}],
        "function_call": "auto",
        "modalities": ["text", "audio"],
        "best_of": 2,
        "echo": True,
        "suffix": "end",
        "parallel_tool_calls": True,
        "store": True,
        "metadata": {"k": "v"},
    }.get(name, "x")


def _rows(status: str) -> list[tuple[str, str]]:
    return [(name, url) for name, row in FIELDS.items() if row.status == status for url in row.urls]


@pytest.mark.parametrize(("name", "url"), _rows("rejected"))
def test_rejected_fields_reject_the_line_naming_the_field(name: str, url: str) -> None:
    line = _chat(**{name: _example(name)}) if url == CHAT_URL else _completion(**{name: _example(name)})
    error = _rejected(line)
    assert error.field == f"body.{name}" and "not supported" in error.reason
    for harmless in (None, *FIELDS[name].harmless):  # the default's values are accepted
        line = _chat(**{name: harmless}) if url == CHAT_URL else _completion(**{name: harmless})
        parse_line(line, 1)


@pytest.mark.parametrize(("name", "url"), _rows("ignored"))
def test_ignored_fields_are_accepted_and_noted(name: str, url: str, tmp_path: Path) -> None:
    line = _chat(**{name: _example(name)}) if url == CHAT_URL else _completion(**{name: _example(name)})
    plain = _chat() if url == CHAT_URL else _completion()
    path = tmp_path / "in.jsonl"
    path.write_text(line + "\n" + plain.replace('"r1"', '"r2"') + "\n")
    parsed = read_jobs(path)
    assert parsed.rejected == [] and len(parsed.jobs) == 2
    assert parsed.ignored == {name: 1}
    assert parsed.jobs[0].sampling == parsed.jobs[1].sampling  # no effect
    assert parsed.notes() and f"body.{name} on 1 line:" in parsed.notes()[0]


def test_unknown_and_wrong_endpoint_fields_are_rejected() -> None:
    assert _rejected(_chat(temprature=0.5)).field == "body.temprature"
    assert _rejected(_chat(prompt="x")).field == "body.prompt"  # a completions field
    assert _rejected(_completion(max_completion_tokens=3)).field == "body.max_completion_tokens"


@pytest.mark.parametrize(("url", "make"), [(CHAT_URL, _chat), (COMPLETIONS_URL, _completion)])
def test_nulls_mean_defaults(url: str, make: Any) -> None:
    """Every field but the prompt itself, null: the job is the one without those fields."""
    nulls = {
        name: None for name, row in FIELDS.items() if url in row.urls and name not in ("messages", "prompt")
    }
    job = parse_line(make(**nulls), 1)
    assert job == parse_line(make(model=None), 1)


# ---- request mapping ------------------------------------------------------------------------


def test_chat_request_maps_onto_the_job_contract() -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {
            "role": "user",
            "name": "ann",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        },
        {"role": "assistant", "content": "ok", "tool_calls": None},
        {"role": "user", "content": "again"},
    ]
    body = {
        "messages": messages,
        "model": "gpt-4o-mini",
        "max_tokens": 50,
        "max_completion_tokens": 7,
        "temperature": None,
        "top_p": 0.9,
        "n": 2,
        "seed": 3,
        "stop": ["x", "y"],
        "frequency_penalty": 0.5,
        "presence_penalty": -0.5,
        "logit_bias": {"42": -100, "7": 2.5},
        "logprobs": True,
        "top_logprobs": 5,
        "response_format": {"type": "json_object"},
        "user": "u",
    }
    job = parse_line(_line(CHAT_URL, body), 1)
    assert job.model == "gpt-4o-mini"
    assert job.messages == [
        ChatMessage("system", "be brief"),
        ChatMessage("user", "a\nb", "ann"),
        ChatMessage("assistant", "ok"),
        ChatMessage("user", "again"),
    ]
    s = job.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.n, s.seed, s.stop) == (7, 1.0, 0.9, 2, 3, ["x", "y"])
    assert (s.frequency_penalty, s.presence_penalty, s.logit_bias) == (0.5, -0.5, {"42": -100.0, "7": 2.5})
    assert (s.logprobs, s.top_logprobs, s.json_object, s.structured) == (True, 5, True, "json_object")


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, "json_object"),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "p", "strict": True, "schema": {"type": "object"}},
            },
            "json_schema",
        ),
    ],
)
def test_response_format(response_format: dict[str, Any], expected: str | None) -> None:
    for line in (_chat(response_format=response_format), _completion(response_format=response_format)):
        sampling = parse_line(line, 1).sampling
        assert sampling.structured == expected
        if expected == "json_schema":
            assert sampling.json_schema == {"type": "object"}


def test_completions_logprobs_is_the_top_count() -> None:
    assert parse_line(_completion(logprobs=3), 1).sampling.top_logprobs == 3
    zero = parse_line(_completion(logprobs=0), 1).sampling
    assert zero.logprobs and zero.top_logprobs == 0
    assert not parse_line(_chat(logprobs=False), 1).sampling.logprobs


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        (_chat(logprobs=1), "body.logprobs", "true or false"),
        (_completion(logprobs=True), "body.logprobs", "integer"),
        (_completion(logprobs=21), "top_logprobs", "[0, 20]"),
        (_chat(top_logprobs=3), "top_logprobs", "needs logprobs"),
        (_chat(frequency_penalty=2.5), "frequency_penalty", "[-2, 2]"),
        (_chat(logit_bias={"x": 1}), "logit_bias['x']", "token ids"),
        (_chat(stream=True), "body.stream", "streaming"),
        (_chat(response_format={"type": "xml"}), "body.response_format", "json_schema"),
        (
            _chat(response_format={"type": "json_schema", "json_schema": {"name": "n"}}),
            "body.response_format.json_schema.schema",
            "JSON schema",
        ),
        (
            _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]),
            "body.messages[0].content[0].type",
            "only text",
        ),
        (
            _chat(messages=[{"role": "tool", "content": "r", "tool_call_id": "c"}]),
            "body.messages[0].tool_call_id",
            "tool",
        ),
        (_chat(messages=[{"role": "tool", "content": "r"}]), "body.messages[0].role", "must be one of"),
        (
            _chat(messages=[{"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]),
            "body.messages[0].tool_calls",
            "tool",
        ),
        (_chat(model=3), "body.model", "string"),
    ],
)
def test_bad_request_fields_name_the_field(line: str, field: str, reason: str) -> None:
    error = _rejected(line)
    assert (error.field, error.job_id or "r1") == (field, "r1")
    assert reason in error.reason


def test_a_bad_line_is_rejected_alone(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(
        "\n".join(
            [
                _chat(),
                _chat(tools=[{"type": "function"}]).replace("r1", "r2"),
                _completion().replace("r1", "r3"),
            ]
        )
    )
    parsed = read_jobs(path)
    assert [job.id for job in parsed.jobs] == ["r1", "r3"]
    assert (
        len(parsed.rejected) == 1
        and parsed.rejected[0].line_no == 2
        and "body.tools" in parsed.rejected[0].reason
    )


def test_unreadable_lines_of_an_openai_file_are_openai_error_lines(tmp_path: Path) -> None:
    """In a file of OpenAI request lines, a line that is not JSON, one that is not an object
    and one with an unusable custom_id come back as OpenAI error lines with a null custom_id,
    like OpenAI's error file; each still has one row (known by its radixq id). In a native
    file the same garbage line stays a native error row."""
    path = tmp_path / "in.jsonl"
    good, repeated = _chat(), _completion().replace("r1", "r9")
    path.write_text(
        "\n".join([good, "{not json", "[1, 2]", _chat().replace('"r1"', "7"), repeated, repeated])
    )
    parsed = read_jobs(path)
    assert [job.id for job in parsed.jobs] == ["r1", "r9"]
    lines = [output_record(row.error_result()) for row in parsed.rejected]
    assert [line["custom_id"] for line in lines] == [None, None, None, None]
    assert all(line["response"] is None and line["error"]["code"] == "invalid_job" for line in lines)
    assert [line["id"] for line in lines] == [row.job_id for row in parsed.rejected]
    assert len({line["id"] for line in lines}) == 4 and "line 2: json" in lines[0]["error"]["message"]

    native = tmp_path / "native.jsonl"
    native.write_text(json.dumps({"id": "a", "prompt": "x"}) + "\n{not json\n")
    (row,) = read_jobs(native).rejected
    record = output_record(row.error_result())
    assert "custom_id" not in record and record["id"] == row.job_id and record["choices"] == []


# ---- responses ------------------------------------------------------------------------------


def _token(token_id: int, text: str, logprob: float, tops: list[tuple[int, str, float]]) -> TokenLogprob:
    top = [TopLogprob(token_id=i, token=t, logprob=lp) for i, t, lp in tops]
    return TokenLogprob(token_id=token_id, token=text, logprob=logprob, top_logprobs=top)


_LOGPROBS = [
    _token(5, "Hé", -0.25, [(5, "Hé", -0.25), (9, "Hi", -1.5), (11, "Hé", -3.0)]),
    _token(6, " there", -float("inf"), [(7, " you", -0.1), (6, " there", -float("inf"))]),
]


def _result(job_line: str, logprobs: list[TokenLogprob] | None, n: int = 1) -> Result:
    job = parse_line(job_line, 1)
    choices = [
        Choice(index=i, text="Hé there", token_ids=[5, 6], finish_reason="stop", logprobs=logprobs)
        for i in range(n)
    ]
    return Result(
        id=job.id,
        choices=choices,
        usage=Usage(prompt_tokens=4, completion_tokens=2 * n, cached_tokens=1),
        metadata=job.metadata,
        model="smollm2-135m",
        timings=Timings(finished_at_ms=1_700_000_000_000),
    )


def test_chat_response_validates_strictly_without_logprobs() -> None:
    out = output_record(_result(_chat(n=2), None, n=2))
    body = out["response"]["body"]
    parsed = ChatCompletion.model_validate(body, strict=True)
    assert parsed.model == "smollm2-135m" and parsed.system_fingerprint
    assert [c.logprobs for c in parsed.choices] == [None, None]
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hé there", "refusal": None}
    assert parsed.usage is not None and parsed.usage.total_tokens == 8


def test_chat_response_logprobs_in_openais_shape() -> None:
    body = output_record(_result(_chat(logprobs=True, top_logprobs=3), _LOGPROBS))["response"]["body"]
    parsed = ChatCompletion.model_validate(body, strict=True)
    content = parsed.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == len(_LOGPROBS)
    for got, want in zip(content, _LOGPROBS, strict=True):
        assert got.token == want.token and got.bytes == list(want.token.encode("utf-8"))
        assert got.logprob == (want.logprob if math.isfinite(want.logprob) else -9999.0)
        assert [t.token for t in got.top_logprobs] == [t.token for t in want.top_logprobs]
        assert all(math.isfinite(t.logprob) for t in got.top_logprobs)
    assert body["choices"][0]["logprobs"]["refusal"] is None


def test_completion_response_logprobs_in_openais_shape() -> None:
    body = output_record(_result(_completion(logprobs=3), _LOGPROBS))["response"]["body"]
    parsed = Completion.model_validate(body, strict=True)
    logprobs = parsed.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == ["Hé", " there"] and logprobs.token_logprobs == [-0.25, -9999.0]
    assert logprobs.text_offset == [0, len("Hé")]
    assert logprobs.top_logprobs == [{"Hé": -0.25, "Hi": -1.5}, {" you": -0.1, " there": -9999.0}]
    plain = Completion.model_validate(
        output_record(_result(_completion(), None))["response"]["body"], strict=True
    )
    assert plain.choices[0].logprobs is None and plain.system_fingerprint


def test_error_and_errored_choice_lines() -> None:
    job = parse_line(_chat(), 1)
    failed = output_record(
        Result(id="r1", metadata=job.metadata, error=ErrorInfo(code="internal", message="m"))
    )
    assert failed["response"] is None and failed["error"] == {"code": "internal", "message": "m"}
    broken = Choice(index=0, text="", token_ids=[], finish_reason="error")
    out = output_record(Result(id="r1", metadata=job.metadata, choices=[broken]))
    assert out["response"] is None and out["error"]["code"] == "internal"


def test_completions_prompt_forms() -> None:
    assert parse_line(_completion(prompt=["a", "b"]), 1).prompts == ["a", "b"]
    assert parse_line(_completion(prompt=["a"]), 1).prompt == "a"
    assert parse_line(_completion(prompt=[[1, 2]]), 1).input_ids == [1, 2]
    for bad in ([[1], [2]], [], ["a", 1], [""], {"p": 1}):
        assert _rejected(_completion(prompt=bad)).field in ("body.prompt", "prompt", "prompts[0]")

"""Fuzzing both doors a job comes in by: decode_job (stream payloads) and parse_line (input
lines). Whatever they are given, they return a Job or raise JobError, never anything else
(nor the JobError of an unexpected exception, "unreadable: ..."); every job they accept
survives encode_job/decode_job unchanged, and a result carrying its metadata encodes as
msgpack and JSON."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producer.jsonl import parse_line
from wire.nesting import json_outline, msgpack_outline
from wire.schema import (
    SCHEMA_VERSION,
    Job,
    JobError,
    Result,
    SamplingParams,
    decode_job,
    decode_result,
    encode,
    encode_job,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SAMPLING_FIELDS = list(SamplingParams.__struct_fields__)
JOB_FIELDS = ["id", "prompt", "messages", "input_ids", "metadata", "enqueued_at_ms", "v", "sampling", "extra"]

EDGE_INTS = [0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), 1 << 20, (1 << 20) + 1]
BIG_INTS = [2**64, -(2**63) - 1, 10**40, -(10**40)]
EDGE_FLOATS = [0.0, -0.0, 1e-45, 1e-5, 1e4, 1.5e4, 1e308, 5e-324]


def _scalars(msgpack: bool) -> st.SearchStrategy[Any]:
    if msgpack:
        ints = st.integers(-(2**63), 2**64 - 1) | st.sampled_from(EDGE_INTS)
        floats = st.floats() | st.sampled_from([*EDGE_FLOATS, float("nan"), float("inf")])
        extra = st.binary(max_size=8) | st.builds(
            msgspec.msgpack.Ext, st.integers(0, 127), st.binary(max_size=4)
        )
    else:
        ints = st.integers() | st.sampled_from(EDGE_INTS + BIG_INTS)
        floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(EDGE_FLOATS)
        extra = st.nothing()
    return st.none() | st.booleans() | ints | floats | st.text(max_size=12) | extra


def _values(msgpack: bool) -> st.SearchStrategy[Any]:
    keys = st.text(max_size=6)
    if msgpack:
        keys = keys | st.integers(-5, 5) | st.none() | st.booleans()
    return st.recursive(
        _scalars(msgpack),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
        max_leaves=16,
    )


def _deep_msgpack(depth: int, maps: bool) -> bytes:
    return (b"\x81\xa1k" if maps else b"\x91") * depth + b"\x01"


def _deep_json(depth: int, maps: bool) -> str:
    return ('{"k": ' if maps else "[") * depth + "1" + ("}" if maps else "]") * depth


# A field's value as encoded bytes: a random structure, or one nested up to 3,000 deep (what
# msgspec cannot decode, and what Python's encoders cannot even write).
MSGPACK_VALUE = _values(msgpack=True).map(msgspec.msgpack.encode) | st.builds(
    _deep_msgpack, st.integers(0, 3000), st.booleans()
)
JSON_VALUE = _values(msgpack=False).map(json.dumps) | st.builds(
    _deep_json, st.integers(0, 3000), st.booleans()
)


def _msgpack_map(items: dict[str, bytes]) -> bytes:
    assert len(items) < 16
    return bytes([0x80 | len(items)]) + b"".join(msgspec.msgpack.encode(k) + v for k, v in items.items())


def _json_object(items: dict[str, str]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in items.items()) + "}"


VALID_JOB = {
    "id": "job-1",
    "prompt": "Hello",
    "sampling": {"max_tokens": 4, "temperature": 0.5, "stop": ["x"], "seed": 3},
    "metadata": {"row": 1, "tags": ["a", {"b": None}]},
    "v": SCHEMA_VERSION,
}


def check_accepted(job: Job) -> None:
    assert decode_job(encode_job(job)) == job
    result = Result(id=job.id, metadata=job.metadata)
    assert decode_result(encode(result)) == result
    assert json.loads(msgspec.json.encode(result.metadata)) is not None


def decode_or_job_error(data: bytes) -> None:
    try:
        job = decode_job(data)
    except JobError as exc:
        assert not exc.reason.startswith("unreadable"), exc
        return
    check_accepted(job)


def parse_or_job_error(text: str) -> None:
    try:
        job = parse_line(text, 7)
    except JobError as exc:
        assert not exc.reason.startswith("unreadable"), exc
        return
    check_accepted(job)


@FUZZ
@given(st.binary(max_size=300))
def test_decode_job_random_bytes(data: bytes) -> None:
    decode_or_job_error(data)


@FUZZ
@given(MSGPACK_VALUE)
def test_decode_job_random_msgpack(data: bytes) -> None:
    decode_or_job_error(data)


@FUZZ
@given(st.sampled_from(JOB_FIELDS), MSGPACK_VALUE)
def test_decode_job_valid_job_with_one_field_mutated(field: str, value: bytes) -> None:
    items = {key: msgspec.msgpack.encode(v) for key, v in VALID_JOB.items()}
    decode_or_job_error(_msgpack_map({**items, field: value}))


@FUZZ
@given(st.sampled_from(SAMPLING_FIELDS), MSGPACK_VALUE)
def test_decode_job_valid_job_with_one_sampling_field_mutated(field: str, value: bytes) -> None:
    sampling = {key: msgspec.msgpack.encode(v) for key, v in VALID_JOB["sampling"].items()}
    items = {key: msgspec.msgpack.encode(v) for key, v in VALID_JOB.items()}
    decode_or_job_error(_msgpack_map({**items, "sampling": _msgpack_map({**sampling, field: value})}))


@FUZZ
@given(st.text(max_size=200) | JSON_VALUE)
def test_parse_line_random_text_and_json(text: str) -> None:
    parse_or_job_error(text)


NATIVE_LINE = {"id": "q", "prompt": "Hi", "max_tokens": 4, "temperature": 0, "metadata": {"k": [1]}}
LINE_FIELDS = [*SAMPLING_FIELDS, "id", "prompt", "messages", "input_ids", "metadata", "unknown"]


@FUZZ
@given(st.sampled_from(LINE_FIELDS), JSON_VALUE)
def test_parse_line_native_line_with_one_field_mutated(field: str, value: str) -> None:
    items = {key: json.dumps(v) for key, v in NATIVE_LINE.items()}
    parse_or_job_error(_json_object({**items, field: value}))


BATCH_BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
BODY_FIELDS = [*SAMPLING_FIELDS, "messages", "max_completion_tokens", "metadata", "stop", "model", "prompt"]


@FUZZ
@given(st.sampled_from(BODY_FIELDS), JSON_VALUE)
def test_parse_line_batch_line_with_one_body_field_mutated(field: str, value: str) -> None:
    body = _json_object({**{key: json.dumps(v) for key, v in BATCH_BODY.items()}, field: value})
    line = '{"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": ' + body + "}"
    parse_or_job_error(line)


@pytest.mark.parametrize("depth", [985, 1000, 5000, 100_000])
@pytest.mark.parametrize("field", ["metadata", "messages", "stop", "prompt"])
def test_parse_line_deep_values_name_their_field(depth: int, field: str) -> None:
    line = _json_object({"id": '"deep"', "prompt": '"p"', field: _deep_json(depth, maps=field == "metadata")})
    with pytest.raises(JobError) as caught:
        parse_line(line, 1)
    assert (caught.value.job_id, caught.value.field) == ("deep", field)


def test_parse_line_rejects_lone_surrogates() -> None:
    with pytest.raises(JobError) as caught:
        parse_line('{"id": "x", "prompt": "\ud800"}', 1)
    assert caught.value.field == "encoding" and "surrogate" in caught.value.reason


@FUZZ
@given(st.binary(max_size=200).map(lambda tail: b"\x84" + tail) | MSGPACK_VALUE)
def test_msgpack_outline_never_raises_and_finds_top_level_keys(data: bytes) -> None:
    outline = msgpack_outline(data)
    try:
        decoded = msgspec.msgpack.decode(data)
    except Exception:
        return
    if isinstance(decoded, dict):
        assert set(outline) == {key for key in decoded if isinstance(key, str)}


@FUZZ
@given(st.text(max_size=200) | JSON_VALUE)
def test_json_outline_never_raises(text: str) -> None:
    outline = json_outline(text)
    try:
        decoded = json.loads(text)
    except (ValueError, RecursionError):
        return
    if isinstance(decoded, dict):
        assert set(outline) == set(decoded)

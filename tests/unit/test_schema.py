"""The wire contract: what decode_job accepts and refuses at intake, and round trips."""

from __future__ import annotations

import msgspec
import pytest

from producer.schema import (
    MAX_JOB_BYTES,
    SCHEMA_VERSION,
    ChatMessage,
    Choice,
    ErrorInfo,
    Job,
    JobError,
    Result,
    SamplingParams,
    decode_job,
    decode_result,
    encode,
    encode_job,
    error_result,
)


def raw(**fields: object) -> bytes:
    return msgspec.msgpack.encode({"id": "j", "prompt": "p", "v": SCHEMA_VERSION, **fields})


def test_job_and_result_round_trip() -> None:
    job = Job(
        id="a",
        messages=[ChatMessage("user", "hi")],
        sampling=SamplingParams(n=2, stop=["x"]),
        metadata={"k": [1]},
    )
    assert decode_job(encode_job(job)) == job
    result = Result(id="a", choices=[Choice(index=0, text="t", token_ids=[1], finish_reason="stop")])
    assert decode_result(encode(result)) == result
    failed = error_result("a", "internal", "boom", worker="w")
    assert decode_result(encode(failed)).error == ErrorInfo(code="internal", message="boom") and not failed.ok


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (raw(v=SCHEMA_VERSION + 1), "v", "unsupported schema version"),
        (raw(sampling={"temperature": -1.0}), "sampling.temperature", "must be >= 0"),
        (raw(sampling={"max_tokens": "9"}), "sampling.max_tokens", "Expected `int`"),
        (raw(prompt=None), "prompt", "exactly one of"),
        (raw(extra=1), "job", "unknown field"),
        (raw(input_ids=[1, -3], prompt=None), "input_ids", ">= 0"),
        (b"\xc1", "payload", "not a msgpack job"),
        (b"x" * (MAX_JOB_BYTES + 1), "payload", "exceeds the limit"),
    ],
)
def test_decode_job_names_field_and_reason(data: bytes, field: str, words: str) -> None:
    with pytest.raises(JobError) as caught:
        decode_job(data)
    assert caught.value.field == field
    assert words in caught.value.reason


def test_decode_job_error_names_the_job_when_it_can() -> None:
    with pytest.raises(JobError) as caught:
        decode_job(raw(id="job-7", sampling={"n": 0}))
    assert caught.value.job_id == "job-7"
    assert str(caught.value).startswith("job 'job-7': sampling.n=0")


def test_encode_job_refuses_oversized_payload() -> None:
    with pytest.raises(JobError, match="exceeds the limit"):
        encode_job(Job(id="big", prompt="x" * MAX_JOB_BYTES))

"""The wire contract: what decode_job accepts and refuses at intake, and round trips."""

from __future__ import annotations

import json

import msgspec
import pytest

from wire.bounds import TOKEN_ID_LIMIT
from wire.schema import (
    GREEDY_EPSILON,
    MAX_JOB_BYTES,
    MAX_METADATA_DEPTH,
    MAX_N,
    MAX_PROMPTS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPERATURE,
    MAX_TOKENS_LIMIT,
    MAX_TOP_K,
    MIN_TOP_P,
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
        (
            raw(sampling={"temperature": -1.0}),
            "sampling.temperature",
            "must be a finite number in [0, 10000]",
        ),
        (raw(sampling={"max_tokens": "9"}), "sampling.max_tokens", "Expected `int`"),
        (raw(prompt=None), "prompt", "exactly one of"),
        (raw(extra=1), "job", "unknown field"),
        (raw(input_ids=[1, -3], prompt=None), "input_ids[1]", "must be integers in [0, 2**31)"),
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


def nested(depth: int, leaf: object = 1) -> object:
    """``depth`` dicts, one inside the other, around ``leaf``."""
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def deep_msgpack_job(depth: int, field: str = "metadata") -> bytes:
    """A job payload whose ``field`` is ``depth`` maps deep, written byte by byte (msgspec
    itself cannot encode what is too deep to decode)."""
    head = b"\x84\xa2id\xa5job-9\xa1v\x01\xa6prompt\xa1p" + msgspec.msgpack.encode(field)
    return head + b"\x81\xa1a" * depth + b"\x01"


# Each bound of the contract, one past it: decode_job (intake) names the field path and why.
@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"sampling": {"top_k": 2**63}}, "sampling.top_k", f"must be an integer in [1, {MAX_TOP_K}]"),
        ({"sampling": {"top_k": MAX_TOP_K + 1}}, "sampling.top_k", "or -1/0 for off"),
        ({"sampling": {"top_k": -2}}, "sampling.top_k", "or -1/0 for off"),
        ({"sampling": {"seed": 2**63}}, "sampling.seed", "must be an integer in [0, 2**63)"),
        ({"sampling": {"stop_token_ids": [3, 2**31]}}, "sampling.stop_token_ids[1]", "in [0, 2**31)"),
        ({"sampling": {"stop_token_ids": [1] * 1025}}, "sampling.stop_token_ids", "of 0 to 1024 items"),
        ({"sampling": {"stop": ["x"] * 65}}, "sampling.stop", "of 0 to 64 items"),
        ({"sampling": {"stop": ["ok", "x" * 1025]}}, "sampling.stop[1]", "at most 1024 characters"),
        ({"sampling": {"temperature": float("nan")}}, "sampling.temperature", "finite number"),
        ({"sampling": {"temperature": float("inf")}}, "sampling.temperature", "finite number"),
        ({"sampling": {"temperature": 10001.0}}, "sampling.temperature", "in [0, 10000]"),
        ({"sampling": {"top_p": float("nan")}}, "sampling.top_p", "must be in (0, 1]"),
        ({"sampling": {"top_p": 1e-40}}, "sampling.top_p", "and at least 1.2e-38"),
        ({"sampling": {"min_p": float("-inf")}}, "sampling.min_p", "finite number in [0, 1]"),
        ({"sampling": {"max_tokens": 2**64 - 1}}, "sampling.max_tokens", "in [1, 1048576]"),
        ({"sampling": {"n": 65}}, "sampling.n", "in [1, 64]"),
        ({"input_ids": [5, 2**64 - 1], "prompt": None}, "input_ids[1]", "in [0, 2**31)"),
        ({"enqueued_at_ms": 2**63}, "enqueued_at_ms", "integer in [0, 9223372036854775807]"),
        ({"metadata": {"deep": nested(32)}}, "metadata", "nested more than 32 levels deep"),
        ({"metadata": {"k": [{"x": {1: 2}}]}}, "metadata.k[0].x", "object keys must be strings"),
        ({"metadata": {"k": [1.0, float("nan")]}}, "metadata.k[1]", "numbers must be finite"),
        ({"metadata": {"k": b"raw"}}, "metadata.k", "must hold JSON values only"),
        ({"metadata": {"k": msgspec.msgpack.Ext(1, b"x")}}, "metadata.k", "must hold JSON values only"),
        (
            {"messages": [{"role": "", "content": "c"}], "prompt": None},
            "messages[0].role",
            "must be one of system, user, assistant",
        ),
        (
            {"messages": [{"role": "user", "content": "c", "name": ""}], "prompt": None},
            "messages[0].name",
            "non-empty string of at most 256",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content",
            "content parts (images, audio) are not supported",
        ),
        ({"model": ""}, "model", "non-empty string of at most 256"),
        ({"model": "m" * 257}, "model", "non-empty string of at most 256"),
        ({"prompts": ["a"]}, "prompt", "exactly one of prompt, messages, input_ids, prompts"),
        ({"prompts": [], "prompt": None}, "prompts", f"of 1 to {MAX_PROMPTS} items"),
        ({"prompts": ["a"] * (MAX_PROMPTS + 1), "prompt": None}, "prompts", f"of 1 to {MAX_PROMPTS} items"),
        ({"prompts": ["a", ""], "prompt": None}, "prompts[1]", "non-empty"),
    ],
)
def test_decode_job_enforces_every_bound(fields: dict, field: str, reason: str) -> None:
    with pytest.raises(JobError) as caught:
        decode_job(raw(id="job-1", **fields))
    assert (caught.value.job_id, caught.value.field) == ("job-1", field)
    assert reason in caught.value.reason


def test_values_at_every_bound_are_accepted_and_their_result_encodes() -> None:
    sampling = SamplingParams(
        max_tokens=MAX_TOKENS_LIMIT,
        temperature=MAX_TEMPERATURE,
        top_p=MIN_TOP_P,
        top_k=MAX_TOP_K,
        min_p=1.0,
        seed=2**63 - 1,
        stop=["s" * MAX_STOP_CHARS] * MAX_STOP_STRINGS,
        stop_token_ids=[TOKEN_ID_LIMIT - 1] * MAX_STOP_TOKEN_IDS,
        n=MAX_N,
    )
    metadata = {"deep": nested(MAX_METADATA_DEPTH - 2, [2**64 - 1, -(2**63), 1e308, None, "é"])}
    for job in (
        Job(id="x" * 256, input_ids=[0, TOKEN_ID_LIMIT - 1], sampling=sampling, metadata=metadata),
        Job(id="y", messages=[ChatMessage("user", "")], enqueued_at_ms=2**63 - 1),
    ):
        assert decode_job(encode_job(job)) == job
        result = Result(id=job.id, metadata=job.metadata)
        assert decode_result(encode(result)) == result


@pytest.mark.parametrize("depth", [33, 985, 1000, 5000, 200_000])
def test_deep_payloads_name_the_field_not_a_recursion_error(depth: int) -> None:
    data = deep_msgpack_job(depth)
    with pytest.raises(JobError) as caught:
        decode_job(data)
    assert (caught.value.job_id, caught.value.field) == ("job-9", "metadata")
    assert caught.value.reason == "nested more than 32 levels deep"
    if depth > 33:
        with pytest.raises(JobError) as caught:
            decode_job(deep_msgpack_job(depth, field="messages"))
        assert (caught.value.job_id, caught.value.field) == ("job-9", "messages")


def test_a_deep_map_key_after_deep_metadata_is_outlined_not_decoded() -> None:
    data = bytearray(deep_msgpack_job(5000))
    data[0] += 1  # one more entry: a key that is itself 5000 arrays deep
    data += b"\x91" * 5000 + b"\xc0" + b"\x01"
    with pytest.raises(JobError) as caught:
        decode_job(bytes(data))
    assert (caught.value.job_id, caught.value.field) == ("job-9", "metadata")


def test_non_utf8_strings_in_a_payload_are_a_job_error() -> None:
    with pytest.raises(JobError) as caught:
        decode_job(b"\x82\xa2id\xa2\xff\xfe\xa6prompt\xa1p")
    assert caught.value.field == "payload" and "Invalid UTF-8" in caught.value.reason


def test_one_greedy_rule() -> None:
    assert SamplingParams(temperature=0.0).greedy and SamplingParams(temperature=1e-45).greedy
    assert SamplingParams(temperature=GREEDY_EPSILON / 2).greedy
    assert not SamplingParams(temperature=GREEDY_EPSILON).greedy
    assert SamplingParams(temperature=1.5, top_k=1).greedy and not SamplingParams(top_k=2).greedy


def test_top_k_keeping_the_whole_vocabulary_is_off() -> None:
    assert [SamplingParams(top_k=k).top_k_for(100) for k in (-1, 0, 1, 99, 100, MAX_TOP_K)] == [
        0,
        0,
        1,
        99,
        0,
        0,
    ]


def test_new_optional_fields_round_trip_and_leave_messages_unchanged_without_a_name() -> None:
    """model, prompts and a message's name travel; a message without a name encodes as it did
    before names existed (role and content only), so older readers still take it."""
    job = Job(id="j", prompts=["a", "b"], model="smol", metadata={"k": 1})
    assert decode_job(encode_job(job)) == job
    named = Job(id="c", messages=[ChatMessage("user", "hi", "ann"), ChatMessage("system", "s")])
    assert decode_job(encode_job(named)) == named
    assert msgspec.msgpack.encode(ChatMessage("user", "hi")) == msgspec.msgpack.encode(
        {"role": "user", "content": "hi"}
    )
    assert job.prompt_kind == "prompts" and named.prompt_kind == "messages"


def test_a_chat_role_a_template_does_not_know_is_refused_at_enqueue_and_at_intake() -> None:
    """Roles are system, user, assistant; "wizard" (which ran before, as whatever the chat
    template made of it) is that job's error, read from a file or from the stream."""
    from producer.jsonl import parse_line
    from wire.schema import CHAT_ROLES, decode_job

    assert CHAT_ROLES == ("system", "user", "assistant")
    for role in CHAT_ROLES:
        job = parse_line(json.dumps({"id": "ok", "messages": [{"role": role, "content": "x"}]}), 1)
        assert job.messages is not None and job.messages[0].role == role
    line = json.dumps(
        {"id": "w", "messages": [{"role": "user", "content": "x"}, {"role": "wizard", "content": "y"}]}
    )
    with pytest.raises(
        JobError, match=r"^job 'w': messages\[1\]\.role='wizard': must be one of system, user, assistant$"
    ):
        parse_line(line, 1)
    raw = msgspec.msgpack.encode({"id": "w", "messages": [{"role": "wizard", "content": "y"}], "v": 1})
    with pytest.raises(JobError, match="must be one of system, user, assistant"):
        decode_job(raw)

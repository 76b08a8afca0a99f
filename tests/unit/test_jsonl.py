"""Input lines -> Jobs, Results -> output lines, in the native and the OpenAI Batch format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from producer.jsonl import derive_id, output_record, parse_line, read_jobs, written_ids
from producer.openai_batch import RESERVED_KEY
from producer.schema import ChatMessage, Choice, ErrorInfo, JobError, Result, SamplingParams, Timings, Usage


def test_native_lines_of_each_kind() -> None:
    job = parse_line(
        json.dumps(
            {
                "id": "q1",
                "prompt": "hi",
                "max_tokens": 7,
                "temperature": 0,
                "stop": ["\n"],
                "metadata": {"k": 1},
            }
        ),
        1,
    )
    assert (job.id, job.prompt, job.metadata) == ("q1", "hi", {"k": 1})
    assert job.sampling == SamplingParams(max_tokens=7, temperature=0.0, stop=["\n"])
    chat = parse_line('{"id": "q2", "messages": [{"role": "user", "content": "yo"}], "n": 3, "seed": 5}', 2)
    assert chat.messages == [ChatMessage("user", "yo")] and chat.sampling.n == 3 and chat.sampling.seed == 5
    ids = parse_line('{"id": "q3", "input_ids": [1, 2, 3], "top_k": 4, "min_p": 0.1, "ignore_eos": true}', 3)
    assert ids.input_ids == [1, 2, 3] and ids.sampling.top_k == 4 and ids.sampling.ignore_eos


def test_missing_ids_are_deterministic_per_line_and_content(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "same"}\n{"prompt": "same"}\n\n{"prompt": "other"}\n')
    first = [job.id for job in read_jobs(path).jobs]
    assert first == [job.id for job in read_jobs(path).jobs]
    assert len(set(first)) == 3  # same content on another line is another job
    assert first[0] == derive_id('{"prompt": "same"}', 1)
    assert first[2].startswith("L4-")  # blank lines keep their numbers


def test_duplicate_ids_in_one_file_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    parsed = read_jobs(path)
    assert [job.prompt for job in parsed.jobs] == ["x"]
    assert str(parsed.rejected[0]) == "line 2: job 'a': id: duplicate of line 1"


@pytest.mark.parametrize(
    ("line", "field", "reason"),
    [
        ('{"id": "x", "prompt": "p", "top_k": -2}', "top_k", "must be >= 1"),
        ('{"id": "x", "prompt": "p", "min_p": 2}', "min_p", "must be in [0, 1]"),
        ('{"id": "x", "prompt": "p", "stop": [""]}', "stop", "non-empty"),
        ('{"id": "x", "prompt": "p", "seed": -1}', "seed", "must be in [0, 2**63)"),
        ('{"id": "x", "prompt": ""}', "prompt", "must be non-empty"),
        ('{"id": "", "prompt": "p"}', "id", "non-empty string"),
        ('{"id": "x", "prompt": "p", "metadata": {"_radixq": 1}}', "metadata._radixq", "reserved"),
        ('"just a string"', "json", "must be a JSON object"),
    ],
)
def test_bad_lines_name_field_and_reason(line: str, field: str, reason: str) -> None:
    with pytest.raises(JobError) as caught:
        parse_line(line, 1)
    assert caught.value.field == field
    assert reason in caught.value.reason


def test_openai_chat_request_roundtrip() -> None:
    line = {
        "custom_id": "req-1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "smollm2",
            "messages": [{"role": "user", "content": "hello"}],
            "max_completion_tokens": 9,
            "stop": "END",
            "temperature": 0.2,
            "metadata": {"user_tag": "t"},
        },
    }
    job = parse_line(json.dumps(line), 1)
    assert job.id == "req-1" and job.messages == [ChatMessage("user", "hello")]
    assert job.sampling.max_tokens == 9 and job.sampling.stop == ["END"] and job.sampling.temperature == 0.2
    assert job.metadata[RESERVED_KEY]["url"] == "/v1/chat/completions"

    result = Result(
        id=job.id,
        choices=[Choice(index=0, text="hi there", token_ids=[5, 6], finish_reason="stop")],
        usage=Usage(prompt_tokens=4, completion_tokens=2, cached_tokens=1),
        metadata=job.metadata,
        model="smollm2-135m",
        timings=Timings(finished_at_ms=1_700_000_000_000),
    )
    out = output_record(result)
    assert out["custom_id"] == "req-1" and out["error"] is None
    assert out["response"]["status_code"] == 200
    body = out["response"]["body"]
    assert body["object"] == "chat.completion" and body["created"] == 1_700_000_000
    assert body["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "hi there"}, "finish_reason": "stop"}
    ]
    assert body["usage"]["total_tokens"] == 6 and body["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 1
    }
    assert body["metadata"] == {"user_tag": "t"}  # the reserved key is stripped

    failed = output_record(
        Result(id="req-1", metadata=job.metadata, error=ErrorInfo(code="internal", message="m"))
    )
    assert failed["response"] is None and failed["error"] == {"code": "internal", "message": "m"}


def test_openai_completions_request_and_output() -> None:
    line = {
        "custom_id": "c1",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"prompt": ["Once"], "max_tokens": 3},
    }
    job = parse_line(json.dumps(line), 1)
    assert job.prompt == "Once" and job.sampling.max_tokens == 3
    tokens = parse_line(json.dumps({**line, "body": {"prompt": [1, 2]}}), 2)
    assert tokens.input_ids == [1, 2]
    result = Result(
        id="c1",
        choices=[Choice(index=0, text=" upon", token_ids=[1], finish_reason="length")],
        metadata=job.metadata,
    )
    body = output_record(result)["response"]["body"]
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == " upon"
    with pytest.raises(JobError, match="body.logit_bias"):
        parse_line(json.dumps({**line, "body": {"prompt": "x", "logit_bias": {}}}), 3)


def test_native_output_record_fields() -> None:
    result = Result(
        id="a",
        choices=[Choice(index=0, text="t", token_ids=[1], finish_reason="length")],
        metadata={"m": [1]},
    )
    assert output_record(result) == {
        "id": "a",
        "choices": [{"index": 0, "text": "t", "token_ids": [1], "finish_reason": "length"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0},
        "metadata": {"m": [1]},
        "error": None,
    }


def test_written_ids_cuts_a_torn_last_line(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a"}\n{"custom_id": "b", "id": "batch_x"}\n{"id": "c", "cho')
    assert written_ids(out) == {"a", "b"}
    assert out.read_text() == '{"id": "a"}\n{"custom_id": "b", "id": "batch_x"}\n'
    assert written_ids(tmp_path / "missing.jsonl") == set()

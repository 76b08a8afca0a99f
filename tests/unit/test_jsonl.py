"""Input lines -> Jobs, Results -> output lines, in the native and the OpenAI Batch format."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest

from producer.input_rows import derive_id
from producer.jsonl import parse_line, read_jobs
from producer.openai_batch import RESERVED_KEY
from producer.output_lines import output_line, output_record, written_ids
from wire.schema import (
    MAX_JOB_BYTES,
    ChatMessage,
    Choice,
    ErrorInfo,
    JobError,
    Result,
    SamplingParams,
    Timings,
    Usage,
    decode_job,
    decode_result,
    encode,
    encode_job,
)


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
        ('{"id": "x", "prompt": "p", "top_k": -2}', "top_k", "or -1/0 for off"),
        ('{"id": "x", "prompt": "p", "min_p": 2}', "min_p", "must be a finite number in [0, 1]"),
        ('{"id": "x", "prompt": "p", "stop": [""]}', "stop[0]", "non-empty"),
        ('{"id": "x", "prompt": "p", "seed": -1}', "seed", "must be an integer in [0, 2**63)"),
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
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi there", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
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
    with pytest.raises(JobError, match="body.echo"):
        parse_line(json.dumps({**line, "body": {"prompt": "x", "echo": True}}), 3)


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


def _deep(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def test_out_of_range_and_deep_lines_are_rejected_alone(tmp_path: Path) -> None:
    """Regression (issue 8, point 3): each of these aborted the whole file, or was silently
    changed; now each is its own line's rejection and every other line is read."""
    lines = [
        b'{"id": "ok-1", "prompt": "a"}',
        b'{"id":"POISON","prompt":"Hi","max_tokens":4,"top_k":9223372036854775808}',
        b'{"id": "t64", "prompt": "a", "top_k": 18446744073709551616}',
        b'{"id": "s64", "prompt": "a", "stop_token_ids": [18446744073709551616]}',
        b'{"id": "i64", "input_ids": [1, 18446744073709551616]}',
        b'{"id": "m64", "prompt": "a", "metadata": {"n": 18446744073709551616}}',
        b'{"id": "d985", "prompt": "a", "metadata": ' + _deep(985).encode() + b"}",
        b'{"id": "d5000", "prompt": "a", "metadata": ' + _deep(5000).encode() + b"}",
        b'{"id": "latin1", "prompt": "caf\xe9"}',
        b"",
        b'{"id": "ok-2", "prompt": "caf\xc3\xa9", "metadata": ' + _deep(31).encode() + b"}",
    ]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    parsed = read_jobs(path)
    assert [(job.id, job.prompt) for job in parsed.jobs] == [("ok-1", "a"), ("ok-2", "café")]
    off = "must be an integer in [1, 1048576], or -1/0 for off"
    token = "token ids must be integers in [0, 2**31)"
    deep = "metadata: nested more than 32 levels deep"
    assert [str(rejected) for rejected in parsed.rejected] == [
        f"line 2: job 'POISON': top_k=9223372036854775808: {off}",
        f"line 3: job 't64': top_k=18446744073709551616: {off}",
        f"line 4: job 's64': stop_token_ids[0]=18446744073709551616: {token}",
        f"line 5: job 'i64': input_ids[1]=18446744073709551616: {token}",
        "line 6: job 'm64': metadata.n=18446744073709551616: integers must be in [-2**63, 2**64)",
        f"line 7: job 'd985': {deep}",
        f"line 8: job 'd5000': {deep}",
        "line 9: encoding: not valid UTF-8: byte 32 is 0xe9",
    ]


def test_a_byte_order_mark_on_the_first_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "x"}\r\n{"id": "b", "prompt": "\xef\xbb\xbfy"}\r\n')
    parsed = read_jobs(path)
    assert parsed.rejected == []
    assert [(job.id, job.prompt) for job in parsed.jobs] == [
        (derive_id('{"prompt": "x"}', 1), "x"),
        ("b", "\ufeffy"),  # only the first line's mark is the file's; this one is content
    ]


def test_gzip_files_are_read_by_their_magic_bytes(tmp_path: Path) -> None:
    lines = b'\xef\xbb\xbf{"id": "g1", "prompt": "x"}\n\n{"id": "g2", "input_ids": [1]}\n{"id": 3}\n'
    for name in ("in.jsonl.gz", "in.jsonl", "no-suffix"):
        path = tmp_path / name
        path.write_bytes(gzip.compress(lines))
        parsed = read_jobs(path)
        assert [job.id for job in parsed.jobs] == ["g1", "g2"]
        assert [r.line_no for r in parsed.rejected] == [4]
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_bytes(lines)  # the suffix alone does not make a file gzip
    assert [job.id for job in read_jobs(plain).jobs] == ["g1", "g2"]


def test_a_truncated_gzip_keeps_the_lines_before_the_damage(tmp_path: Path) -> None:
    body = b"".join(b'{"id": "j%d", "prompt": "x"}\n' % i for i in range(2000))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress(body)[:-100])
    parsed = read_jobs(path)
    assert 1000 < len(parsed.jobs) < 2000
    assert [job.id for job in parsed.jobs] == [f"j{i}" for i in range(len(parsed.jobs))]
    [rejected] = parsed.rejected
    assert rejected.line_no > len(parsed.jobs)
    assert rejected.reason.startswith("file: cannot be read from here on: Compressed file ended")


@pytest.mark.parametrize("compress", [False, True])
def test_an_over_long_line_is_rejected_in_bounded_memory(tmp_path: Path, compress: bool) -> None:
    size = 16 * MAX_JOB_BYTES
    body = b'{"id": "a", "prompt": "x"}\n{"prompt": "' + b"y" * size + b'"}\n{"id": "c", "prompt": "z"}\n'
    path = tmp_path / "long.jsonl"
    path.write_bytes(gzip.compress(body) if compress else body)
    tracemalloc.start()
    try:
        parsed = read_jobs(path)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [job.id for job in parsed.jobs] == ["a", "c"]
    assert [str(r) for r in parsed.rejected] == [
        f"line 2: payload='{size + 15} bytes': line exceeds the limit of {MAX_JOB_BYTES} bytes"
    ]
    assert peak_bytes < 4 * MAX_JOB_BYTES, peak_bytes


def test_every_accepted_line_round_trips_and_its_result_encodes(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(
        '{"id": "a", "prompt": "p", "seed": 9223372036854775807, "top_k": 1048576,'
        ' "metadata": {"big": 18446744073709551615, "small": -9223372036854775808, "f": 1e308}}\n'
    )
    [job] = read_jobs(path).jobs
    assert decode_job(encode_job(job)) == job
    result = Result(id=job.id, metadata=job.metadata)
    assert decode_result(encode(result)) == result
    assert json.loads(output_line(result))["metadata"] == job.metadata


def test_sampling_seen_before_is_checked_as_the_line_gives_it() -> None:
    # NOTE: lines share their SamplingParams (validated once); 1, 1.0 and true are equal in Python
    assert parse_line('{"id": "a", "prompt": "x", "n": 1, "ignore_eos": true}', 1).sampling == SamplingParams(
        ignore_eos=True
    )
    with pytest.raises(JobError, match="n"):
        parse_line('{"id": "b", "prompt": "x", "n": true, "ignore_eos": true}', 2)
    with pytest.raises(JobError, match="ignore_eos"):
        parse_line('{"id": "c", "prompt": "x", "n": 1, "ignore_eos": 1}', 3)
    first = parse_line('{"id": "d", "prompt": "x", "temperature": 0.5}', 4)
    again = parse_line('{"id": "e", "prompt": "y", "temperature": 0.5}', 5)
    assert again.sampling == first.sampling == SamplingParams(temperature=0.5)

"""service.lines: an uploaded batch file's lines checked as they stream in, whatever the pieces
they arrive in; and service.finalize's rows as OpenAI lines."""

from __future__ import annotations

import io
import json

import pytest

from service.errors import ApiError
from service.finalize import EXPIRED_MESSAGE, openai_row
from service.lines import LineCheck

CHAT = "/v1/chat/completions"


def line(custom_id: object, **body: object) -> bytes:
    body = {"messages": [{"role": "user", "content": "hi"}], **body}
    return (json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}) + "\n").encode()


def checked(data: bytes, piece: int) -> LineCheck:
    check = LineCheck()
    for start in range(0, len(data), piece):
        check.feed(data[start : start + piece])
    check.finish(io.BytesIO(data))
    return check


@pytest.mark.parametrize("piece", [1, 7, 1 << 20])
def test_requests_counted_invalid_ones_kept_models_and_urls_noted(piece: int) -> None:
    data = (
        b"\xef\xbb\xbf"
        + line("a", model="m1")
        + b"\n"
        + line("b", temperature=9)
        + line("c", model="m2").rstrip(b"\n")
    )
    check = checked(data, piece)
    assert (check.lines, check.invalid, check.models, check.urls) == (3, 1, {"m1", "m2"}, {CHAT})
    assert (
        check.first_error is not None and "line 3" in check.first_error and "temperature" in check.first_error
    )


@pytest.mark.parametrize(
    ("data", "code", "where"),
    [
        (line("a") + b"{nope\n", "invalid_json_line", "line 2"),
        (line("a") + b"[1, 2]\n", "invalid_json_line", "line 2"),
        (line(""), "missing_custom_id", "line 1"),
        (line(7), "missing_custom_id", "line 1"),
        (line("x" * 300), "invalid_custom_id", "line 1"),
        (line("a").replace(b'"POST"', b'"GET"'), "invalid_method", "line 1"),
        (line("a").replace(CHAT.encode(), b"/v1/embeddings"), "invalid_url", "line 1"),
        (line("a") + b"\xff\xfe\n", "invalid_json_line", "line 2"),
        (b"\n\n", "empty_file", "no request"),
    ],
)
def test_a_line_that_cannot_be_a_request_refuses_the_upload(data: bytes, code: str, where: str) -> None:
    with pytest.raises(ApiError) as caught:
        checked(data, 5)
    assert (caught.value.status, caught.value.code) == (400, code) and where in caught.value.message


def test_duplicate_custom_ids_are_found_among_many_and_named_with_both_lines() -> None:
    ids = [f"id-{i}" for i in range(5000)]
    data = b"".join(line(i) for i in ids) + line("id-1234")
    with pytest.raises(ApiError) as caught:
        checked(data, 1 << 16)
    assert caught.value.code == "duplicate_custom_id"
    assert "line 5001" in caught.value.message and "line 1235" in caught.value.message
    assert checked(b"".join(line(i) for i in ids), 1 << 16).lines == 5000  # no false duplicate


def test_an_over_long_line_is_refused_before_its_end_arrives() -> None:
    check = LineCheck()
    check.feed(line("a"))
    with pytest.raises(ApiError) as caught:
        for _ in range(20):
            check.feed(b"x" * (1 << 20))
    assert caught.value.code == "line_too_long" and "line 2" in caught.value.message


def test_rows_get_their_custom_id_back_and_openai_codes() -> None:
    prefix = "batch_abc/"
    row = {"id": "batch_req_1", "custom_id": prefix + "r1", "response": None, "job_digest": "d",
           "error": {"code": "model_not_served", "message": f"job '{prefix}r1': model 'x' is not served"}}  # fmt: skip
    out = openai_row(row, prefix, expired=False)
    assert out == {"id": "batch_req_1", "custom_id": "r1", "response": None,
                   "error": {"code": "model_not_found", "message": "job 'r1': model 'x' is not served"}}  # fmt: skip
    cancelled = {"custom_id": prefix + "r2", "error": {"code": "batch_cancelled", "message": "m"}}
    assert openai_row(dict(cancelled), prefix, expired=False)["error"]["code"] == "batch_cancelled"
    expired = openai_row({**cancelled, "error": dict(cancelled["error"])}, prefix, expired=True)["error"]  # type: ignore[dict-item]
    assert expired == {"code": "batch_expired", "message": EXPIRED_MESSAGE}

"""The OpenAI Batch file format: request lines in, response lines out.

A request line is ``{"custom_id", "method": "POST", "url", "body"}`` with url
``/v1/chat/completions`` or ``/v1/completions``; its body is read by producer.openai_request.
The format travels with the job in
``metadata[RESERVED_KEY]`` so the result can be written back as an OpenAI batch output line;
the reserved key never reaches the user's metadata in the output.
"""

from __future__ import annotations

import hashlib
from typing import Any

from producer.openai_request import CHAT_URL, COMPLETIONS_URL, body_fields
from producer.openai_response import response_body
from wire.schema import CANCELLED, JobError, Result

RESERVED_KEY = "_radixq"
# radixq error codes OpenAI's Batch API spells otherwise: a request its batch's cancel stopped
_OPENAI_CODES = {CANCELLED: "batch_cancelled"}


def is_batch_request(raw: dict[str, Any]) -> bool:
    return "custom_id" in raw or "body" in raw


def job_fields(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The native job fields (id, prompt|messages|input_ids, sampling fields, model, metadata)
    of one OpenAI batch request line, and the body fields it carries that radixq ignores;
    raises JobError naming the field."""
    unknown = sorted(set(raw) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise JobError(unknown[0], None, "unknown field in an OpenAI batch request line")
    custom_id = raw.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise JobError("custom_id", custom_id, "must be a non-empty string")
    if raw.get("method", "POST") != "POST":
        raise JobError("method", raw.get("method"), "only POST is supported")
    url = raw.get("url")
    if url not in (CHAT_URL, COMPLETIONS_URL):
        raise JobError("url", url, f"must be {CHAT_URL} or {COMPLETIONS_URL}")
    body = raw.get("body")
    if not isinstance(body, dict):
        raise JobError("body", body, "must be an object")
    fields, ignored = body_fields(url, body)
    fields["id"] = custom_id
    fields["metadata"] = {
        **fields.get("metadata", {}),
        RESERVED_KEY: {"format": "openai", "url": url, "model": fields.get("model", "")},
    }
    return fields, ignored


def response_line(result: Result, format_info: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI batch output line for ``result`` (a job that came in as a batch request)."""
    request_id = (
        "req_" + hashlib.sha1(f"{result.id}/{result.timings.finished_at_ms}".encode()).hexdigest()[:24]
    )
    # NOTE: a line that gave no readable custom_id has a null one (as OpenAI's error lines);
    # its row is known by its radixq id then, in ``id``
    unnamed = bool(format_info.get("unnamed"))
    line: dict[str, Any] = {
        "id": result.id if unnamed else f"batch_{request_id}",
        "custom_id": None if unnamed else result.id,
        "response": None,
        "error": None,
    }
    if result.error is not None:
        code = _OPENAI_CODES.get(result.error.code, result.error.code)
        line["error"] = {"code": code, "message": result.error.message}
        return line
    broken = [choice.index for choice in result.choices if choice.finish_reason == "error"]
    if broken:  # NOTE: OpenAI's shapes have no such finish_reason: the line reports the error
        line["error"] = {"code": "internal", "message": f"choices {broken} ended with an error"}
        return line
    model = result.model or format_info.get("model", "")
    body = response_body(result, format_info.get("url", COMPLETIONS_URL), request_id, model)
    if metadata:
        body["metadata"] = metadata
    line["response"] = {"status_code": 200, "request_id": request_id, "body": body}
    return line

"""The OpenAI Batch file format: request lines in, response lines out.

A request line is ``{"custom_id", "method": "POST", "url", "body"}`` with url
``/v1/chat/completions`` or ``/v1/completions``. The format travels with the job in
``metadata[RESERVED_KEY]`` so the result can be written back as an OpenAI batch output line;
the reserved key never reaches the user's metadata in the output.
"""

from __future__ import annotations

import hashlib
from typing import Any

from producer.schema import JobError, Result

RESERVED_KEY = "_radixq"
CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop_token_ids", "ignore_eos", "n")
# Accepted and not used for generation: which model a worker runs is the worker's choice.
_IGNORED_FIELDS = ("model", "user", "stream")
_BODY_FIELDS = {
    CHAT_URL: {"messages", "max_tokens", "max_completion_tokens", "stop", "metadata", *_SAMPLING_FIELDS},
    COMPLETIONS_URL: {"prompt", "max_tokens", "stop", "metadata", *_SAMPLING_FIELDS},
}


def is_batch_request(raw: dict[str, Any]) -> bool:
    return "custom_id" in raw or "body" in raw


def job_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The native job fields (id, prompt|messages|input_ids, sampling fields, metadata) of one
    OpenAI batch request line; raises JobError naming the field."""
    unknown = sorted(set(raw) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise JobError(unknown[0], None, "unknown field in an OpenAI batch request line")
    custom_id = raw.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise JobError("custom_id", custom_id, "must be a non-empty string")
    if raw.get("method", "POST") != "POST":
        raise JobError("method", raw.get("method"), "only POST is supported")
    url = raw.get("url")
    if url not in _BODY_FIELDS:
        raise JobError("url", url, f"must be {CHAT_URL} or {COMPLETIONS_URL}")
    body = raw.get("body")
    if not isinstance(body, dict):
        raise JobError("body", body, "must be an object")
    if body.get("stream"):
        raise JobError("body.stream", body["stream"], "streaming is not supported in a batch")
    unknown = sorted(set(body) - _BODY_FIELDS[url] - set(_IGNORED_FIELDS))
    if unknown:
        raise JobError(f"body.{unknown[0]}", body[unknown[0]], "not supported")

    fields: dict[str, Any] = {key: body[key] for key in _SAMPLING_FIELDS if key in body}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    if "stop" in body and body["stop"] is not None:
        fields["stop"] = [body["stop"]] if isinstance(body["stop"], str) else body["stop"]
    if url == CHAT_URL:
        fields["messages"] = body.get("messages")
    else:
        fields.update(_completion_prompt(body.get("prompt")))
    user_metadata = body.get("metadata") or {}
    if not isinstance(user_metadata, dict):
        raise JobError("body.metadata", user_metadata, "must be an object")
    fields["id"] = custom_id
    fields["metadata"] = {
        **user_metadata,
        RESERVED_KEY: {"format": "openai", "url": url, "model": body.get("model") or ""},
    }
    return fields


def _completion_prompt(prompt: Any) -> dict[str, Any]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
        return {"input_ids": prompt}
    raise JobError("body.prompt", prompt, "must be a string, a list of token ids, or a list of one of those")


def response_line(result: Result, format_info: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI batch output line for ``result`` (a job that came in as a batch request)."""
    request_id = (
        "req_" + hashlib.sha1(f"{result.id}/{result.timings.finished_at_ms}".encode()).hexdigest()[:24]
    )
    line: dict[str, Any] = {
        "id": f"batch_{request_id}",
        "custom_id": result.id,
        "response": None,
        "error": None,
    }
    if result.error is not None:
        line["error"] = {"code": result.error.code, "message": result.error.message}
        return line
    created_s = result.timings.finished_at_ms // 1000
    model = result.model or format_info.get("model", "")
    usage = {
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "total_tokens": result.usage.prompt_tokens + result.usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.usage.cached_tokens},
    }
    if format_info.get("url") == CHAT_URL:
        body: dict[str, Any] = {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "created": created_s,
            "model": model,
            "choices": [
                {
                    "index": choice.index,
                    "message": {"role": "assistant", "content": choice.text},
                    "finish_reason": choice.finish_reason,
                }
                for choice in result.choices
            ],
            "usage": usage,
        }
    else:
        body = {
            "id": f"cmpl-{request_id}",
            "object": "text_completion",
            "created": created_s,
            "model": model,
            "choices": [
                {"index": choice.index, "text": choice.text, "finish_reason": choice.finish_reason}
                for choice in result.choices
            ],
            "usage": usage,
        }
    if metadata:
        body["metadata"] = metadata
    line["response"] = {"status_code": 200, "request_id": request_id, "body": body}
    return line

"""OpenAI request bodies (``/v1/chat/completions`` and ``/v1/completions``) as radixq job fields.

FIELDS holds every body field of the two endpoints and what radixq does with it:

- ``supported``: mapped onto the job (an OpenAI field, or a radixq extension named as the
  native job field is);
- ``ignored``: accepted and without effect; enqueue and run print one note per field with the
  number of lines that carried it;
- ``rejected``: the line is rejected with an error naming the field (only that line), unless
  the value is one that means the field's default (``tools: []``, ``echo: false``).

A null value means the field's default, for every field. A field in no row is rejected too.
The conformance table of docs/guide.md is rendered from FIELDS (``conformance_table``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from wire.schema import JobError

MAX_OPENAI_TEMPERATURE = 2.0  # OpenAI's bound; a native job's is wire.schema.MAX_TEMPERATURE
CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
CHAT = (CHAT_URL,)
COMPLETIONS = (COMPLETIONS_URL,)
BOTH = (CHAT_URL, COMPLETIONS_URL)

Status = Literal["supported", "ignored", "rejected"]


@dataclass(frozen=True)
class BodyField:
    status: Status
    urls: tuple[str, ...]
    note: str
    harmless: tuple[Any, ...] = ()  # values of a rejected field that mean its default: accepted
    extension: bool = False  # a radixq field, not OpenAI's


def _native(note: str) -> BodyField:
    return BodyField("supported", BOTH, note, extension=True)


def _ignored(note: str, urls: tuple[str, ...] = CHAT) -> BodyField:
    return BodyField("ignored", urls, note)


def _rejected(note: str, urls: tuple[str, ...] = CHAT, harmless: tuple[Any, ...] = ()) -> BodyField:
    return BodyField("rejected", urls, note, harmless)


_NO_TOOLS = "radixq has no tool calling"
FIELDS: dict[str, BodyField] = {
    "messages": BodyField(
        "supported",
        CHAT,
        "roles `system`, `developer` (read as `system`), `user`, `assistant`; `content` a string or "
        "an array of `text` parts (joined with newlines); `name` is passed to the chat template",
    ),
    "prompt": BodyField(
        "supported",
        COMPLETIONS,
        "a string, an array of strings (one response line, choice `i * n + c` for prompt `i`'s "
        "choice `c`, as OpenAI numbers them), an array of token ids, or an array holding one array of "
        "token ids (several are rejected: one request line each)",
    ),
    "model": BodyField(
        "supported",
        BOTH,
        "a worker given served names (`--served-model-name`, `served_model_names`) answers a job "
        "naming one of them under that name, and a job naming another with a `model_not_served` "
        "error; without served names any name runs on the worker's model, which the reply names, "
        "and `run` notes each such name",
    ),
    "max_completion_tokens": BodyField("supported", CHAT, "wins over `max_tokens`"),
    "max_tokens": BodyField("supported", BOTH, "radixq's default when neither is given: 128"),
    "temperature": BodyField("supported", BOTH, "0 to 2, as OpenAI (a native job takes up to 10,000)"),
    "top_p": BodyField("supported", BOTH, ""),
    "n": BodyField("supported", BOTH, "1 to 64"),
    "seed": BodyField("supported", BOTH, "0 to 2^63 - 1"),
    "stop": BodyField("supported", BOTH, "a string or an array of strings"),
    "frequency_penalty": BodyField("supported", BOTH, "-2 to 2, over the generated tokens"),
    "presence_penalty": BodyField("supported", BOTH, "-2 to 2, over the generated tokens"),
    "logit_bias": BodyField("supported", BOTH, "token id (as a string) -> -100 to 100"),
    "logprobs": BodyField(
        "supported", BOTH, "chat: true/false; completions: the number of top tokens per position (0 to 20)"
    ),
    "top_logprobs": BodyField("supported", CHAT, "0 to 20, with `logprobs: true`"),
    "response_format": BodyField(
        "supported",
        BOTH,
        "`text`, `json_object`, `json_schema` (its `schema` is enforced, `strict` or not; `name` and "
        "`description` are not used); on completions a radixq extension",
    ),
    "metadata": BodyField(
        "supported",
        BOTH,
        "any JSON object; returned in the response body's `metadata` (on completions a radixq extension)",
    ),
    "stream": BodyField("supported", BOTH, "false only: a batch does not stream"),
    "top_k": _native("radixq extension: -1 or 0 (off), or 1 and up"),
    "min_p": _native("radixq extension: 0 to 1"),
    "min_tokens": _native("radixq extension: EOS and stop tokens are masked until this many tokens"),
    "repetition_penalty": _native("radixq extension: over prompt and output (transformers' semantics)"),
    "stop_token_ids": _native("radixq extension"),
    "ignore_eos": _native("radixq extension"),
    "regex": _native("radixq extension: the completion matches this regular expression"),
    "choice": _native("radixq extension: the completion is one of these strings"),
    "user": _ignored("no effect in radixq", BOTH),
    "store": _ignored("nothing is stored: results go to the output file"),
    "service_tier": _ignored("one tier: the queue's workers"),
    "parallel_tool_calls": _ignored(_NO_TOOLS + " (`tools` is rejected)"),
    "prompt_cache_key": _ignored("radixq's prefix cache needs no key"),
    "prompt_cache_retention": _ignored("radixq's prefix cache is the worker's"),
    "prompt_cache_options": _ignored("radixq's prefix cache is the worker's"),
    "safety_identifier": _ignored("no effect in radixq"),
    "stream_options": _ignored("a batch does not stream", BOTH),
    "tools": _rejected(_NO_TOOLS, harmless=([],)),
    "tool_choice": _rejected(_NO_TOOLS, harmless=("none",)),
    "functions": _rejected(_NO_TOOLS, harmless=([],)),
    "function_call": _rejected(_NO_TOOLS, harmless=("none",)),
    "audio": _rejected("text output only"),
    "modalities": _rejected("text output only", harmless=(["text"],)),
    "prediction": _rejected("no predicted outputs"),
    "reasoning_effort": _rejected("no reasoning-effort control"),
    "verbosity": _rejected("no verbosity control"),
    "web_search_options": _rejected("no web search"),
    "moderation": _rejected("no moderation"),
    "best_of": _rejected("only 1 (use `n`)", COMPLETIONS, harmless=(1,)),
    "echo": _rejected("the prompt is not echoed", COMPLETIONS, harmless=(False,)),
    "suffix": _rejected("no insertion (suffix)", COMPLETIONS, harmless=("",)),
}

# Job fields a request field maps onto unchanged.
_SAME_NAME = (
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "top_logprobs",
    *(name for name, row in FIELDS.items() if row.extension),
)
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_MESSAGE_KEYS = {"role", "content", "name"}


def body_fields(url: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The native job fields of one request body (prompt|messages|input_ids, sampling fields,
    model, and the user's metadata under ``metadata``), and the names of the ignored fields it
    carries. Raises JobError naming the field (``body.<field>``) and why."""
    given = {key: value for key, value in body.items() if value is not None}
    ignored = []
    for key, value in given.items():
        row = FIELDS.get(key)
        if row is None or url not in row.urls:
            raise JobError(f"body.{key}", value, f"not a field of {url} requests that radixq knows")
        if row.status == "ignored":
            ignored.append(key)
        elif row.status == "rejected" and not _is_harmless(value, row.harmless):
            raise JobError(f"body.{key}", value, f"not supported: {row.note}")
    fields: dict[str, Any] = {key: given[key] for key in _SAME_NAME if key in given}
    for key, mapper in _MAPPERS.items():
        if key in given:
            fields.update(mapper(given[key], url))
    temperature = given.get("temperature")
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool):
        if not 0 <= temperature <= MAX_OPENAI_TEMPERATURE:
            raise JobError(
                "body.temperature", temperature, f"must be in [0, {MAX_OPENAI_TEMPERATURE:g}], as OpenAI's"
            )
    if "max_completion_tokens" in given:
        fields["max_tokens"] = given["max_completion_tokens"]
    if url == CHAT_URL:
        fields["messages"] = _messages(given.get("messages"))
    else:
        fields.update(_completion_prompt(given.get("prompt")))
    return fields, ignored


def _is_harmless(value: Any, harmless: tuple[Any, ...]) -> bool:
    return any(type(value) is type(default) and value == default for default in harmless)


def _model(value: Any, url: str) -> dict[str, Any]:
    if not isinstance(value, str):
        raise JobError("body.model", value, "must be a string")
    return {"model": value} if value else {}


def _stop(value: Any, url: str) -> dict[str, Any]:
    return {"stop": [value] if isinstance(value, str) else value}


def _logprobs(value: Any, url: str) -> dict[str, Any]:
    if url == CHAT_URL:
        if not isinstance(value, bool):
            raise JobError("body.logprobs", value, "must be true or false")
        return {"logprobs": value}
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobError("body.logprobs", value, "must be an integer: how many top tokens per position")
    return {"logprobs": True, "top_logprobs": value}


def _stream(value: Any, url: str) -> dict[str, Any]:
    if value is not False:
        raise JobError("body.stream", value, "streaming is not supported in a batch")
    return {}


def _metadata(value: Any, url: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise JobError("body.metadata", value, "must be an object")
    return {"metadata": value}


def _response_format(value: Any, url: str) -> dict[str, Any]:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise JobError(
                "body.response_format.json_schema.schema", spec, "must be an object (a JSON schema)"
            )
        return {"json_schema": spec["schema"]}
    raise JobError(
        "body.response_format", value, 'must be {"type": "text" | "json_object" | "json_schema", ...}'
    )


_MAPPERS: dict[str, Callable[[Any, str], dict[str, Any]]] = {
    "model": _model,
    "stop": _stop,
    "logprobs": _logprobs,
    "stream": _stream,
    "metadata": _metadata,
    "response_format": _response_format,
}


def _messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise JobError("body.messages", messages, "must be an array of messages")
    return [_message(message, f"body.messages[{index}]") for index, message in enumerate(messages)]


def _message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise JobError(where, message, "must be an object")
    given = {key: value for key, value in message.items() if value is not None}
    unknown = sorted(set(given) - _MESSAGE_KEYS)
    if unknown:
        reason = "not supported: radixq has no tool calling" if "tool" in unknown[0] else "not supported"
        raise JobError(f"{where}.{unknown[0]}", given[unknown[0]], reason)
    role = given.get("role")
    if role not in _ROLES:
        raise JobError(f"{where}.role", role, "must be one of " + ", ".join(_ROLES))
    out = {"role": _ROLES[role], "content": _content(given.get("content"), f"{where}.content")}
    if "name" in given:
        out["name"] = given["name"]
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise JobError(where, content, "must be a string or an array of text parts")
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise JobError(f"{where}[{index}].type", kind, "not supported: only text parts")
        text = part.get("text")
        if not isinstance(text, str):
            raise JobError(f"{where}[{index}].text", text, "must be a string")
        texts.append(text)
    return "\n".join(texts)


def _completion_prompt(prompt: Any) -> dict[str, Any]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if isinstance(prompt, list) and prompt and all(isinstance(token, int) for token in prompt):
        return {"input_ids": prompt}
    if isinstance(prompt, list) and prompt and all(isinstance(text, str) for text in prompt):
        return {"prompts": prompt}
    reason = (
        "must be a string, an array of strings, an array of token ids, or an array holding one array of those"
    )
    raise JobError("body.prompt", prompt, reason)


def conformance_table() -> str:
    """The guide's table: every request body field, per endpoint, and what radixq does."""
    rows = [
        "| field | chat | completions | note |",
        "| --- | --- | --- | --- |",
    ]
    for name, row in FIELDS.items():
        cells = [row.status if url in row.urls else "—" for url in BOTH]
        note = row.note
        if row.harmless:
            note += " (accepted: " + ", ".join(_json(value) for value in row.harmless) + ")"
        rows.append(f"| `{name}` | {cells[0]} | {cells[1]} | {note} |")
    return "\n".join(rows)


def _json(value: Any) -> str:
    return f"`{json.dumps(value)}`"

"""OpenAI response bodies (``chat.completion``, ``text_completion``) from a radixq Result.

The shapes are the ones the ``openai`` package's types validate strictly
(``ChatCompletion``, ``Completion``): ``message.refusal`` and ``choices[].logprobs`` are always
present (null when the job did not ask for logprobs, or the worker returned none), and
``system_fingerprint`` names radixq and the model that ran.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
from pathlib import Path
from typing import Any

from producer.openai_request import CHAT_URL
from wire.schema import Choice, Result, TokenLogprob


def package_version() -> str:
    """radixq's version: the installed distribution's, or, run from a source checkout that was
    never pip-installed, the one its pyproject.toml names ("unknown" without either)."""
    try:
        return importlib.metadata.version("radixq")
    except importlib.metadata.PackageNotFoundError:
        try:
            import tomllib
        except ImportError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"]) + "+source"
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


_VERSION = package_version()
# OpenAI reports a log-probability of minus infinity as this (JSON has no infinity).
LOGPROB_FLOOR = -9999.0


def response_body(result: Result, url: str, request_id: str, model: str) -> dict[str, Any]:
    """The response body for a result with choices (an error has no body)."""
    chat = url == CHAT_URL
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{request_id}",
        "object": "chat.completion" if chat else "text_completion",
        "created": result.timings.finished_at_ms // 1000,
        "model": model,
        "system_fingerprint": system_fingerprint(model),
        "choices": [chat_choice(choice) if chat else completion_choice(choice) for choice in result.choices],
        "usage": {
            "prompt_tokens": result.usage.prompt_tokens,
            "completion_tokens": result.usage.completion_tokens,
            "total_tokens": result.usage.prompt_tokens + result.usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.usage.cached_tokens},
        },
    }


def system_fingerprint(model: str) -> str:
    """Names the backend configuration that ran (radixq's version and the model), as OpenAI's
    does: equal fingerprints, equal setup."""
    return "fp_" + hashlib.sha1(f"radixq {_VERSION} {model}".encode()).hexdigest()[:10]


def chat_choice(choice: Choice) -> dict[str, Any]:
    logprobs = None
    if choice.logprobs is not None:
        logprobs = {"content": [_chat_token(entry) for entry in choice.logprobs], "refusal": None}
    return {
        "index": choice.index,
        "message": {"role": "assistant", "content": choice.text, "refusal": None},
        "logprobs": logprobs,
        "finish_reason": choice.finish_reason,
    }


def _chat_token(entry: TokenLogprob) -> dict[str, Any]:
    return {
        "token": entry.token,
        "logprob": _finite(entry.logprob),
        "bytes": list(entry.token.encode()),
        "top_logprobs": [
            {"token": top.token, "logprob": _finite(top.logprob), "bytes": list(top.token.encode())}
            for top in entry.top_logprobs
        ],
    }


def completion_choice(choice: Choice) -> dict[str, Any]:
    logprobs = None
    if choice.logprobs is not None:
        offsets, offset = [], 0
        for entry in choice.logprobs:
            offsets.append(offset)
            offset += len(entry.token)
        logprobs = {
            "tokens": [entry.token for entry in choice.logprobs],
            "token_logprobs": [_finite(entry.logprob) for entry in choice.logprobs],
            "top_logprobs": [_top_mapping(entry) for entry in choice.logprobs],
            "text_offset": offsets,
        }
    return {
        "index": choice.index,
        "text": choice.text,
        "logprobs": logprobs,
        "finish_reason": choice.finish_reason,
    }


def _top_mapping(entry: TokenLogprob) -> dict[str, float]:
    """token text -> logprob, most likely first. NOTE: tokens that decode to the same text keep
    the most likely one: OpenAI's completions shape cannot hold both."""
    mapping: dict[str, float] = {}
    for top in entry.top_logprobs:
        mapping.setdefault(top.token, _finite(top.logprob))
    return mapping


def _finite(logprob: float) -> float:
    return max(float(logprob), LOGPROB_FLOOR) if not math.isnan(logprob) else LOGPROB_FLOOR

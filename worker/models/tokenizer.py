"""Tokenizer loading and prompt encoding (chat template or plain text)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wire.schema import CONTENT_PARTS_REASON

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The HF tokenizer of a model directory; aliases and GGUF files resolve to the cached
    converted directory (see worker.models.loader.resolve_model_dir)."""
    from transformers import AutoTokenizer

    model_dir = Path(path)
    if not (model_dir.is_dir() and (model_dir / "config.json").is_file()):
        from worker.models.loader import resolve_model_dir

        model_dir, _ = resolve_model_dir(path)
    return AutoTokenizer.from_pretrained(str(model_dir))


class NoTokenizer:
    """Stands in for the tokenizer of a model that ships none (dummy weights): token ids go
    in, no text comes out."""

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def load_tokenizer_or_none(path: str) -> PreTrainedTokenizerBase | None:
    """The model directory's tokenizer, or None when it has none (dummy or random models)."""
    try:
        return load_tokenizer(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("no tokenizer at %s (%s): token ids only, no text", path, exc)
        return None


def detokenizer(tokenizer: Any) -> Callable[[list[int]], str] | None:
    """The text of token ids (special tokens skipped) through ``tokenizer``, as the scheduler
    matches stop strings; None without a tokenizer (stop strings then never match)."""
    if tokenizer is None:
        return None

    def detokenize(token_ids: list[int]) -> str:
        return str(tokenizer.decode(token_ids, skip_special_tokens=True))

    return detokenize


def _message_dict(message: Any, index: int) -> dict[str, str]:
    """The message as the chat template reads it; ``name`` only when the message has one."""
    if isinstance(message, dict):
        role, content, name = message.get("role"), message.get("content"), message.get("name")
    else:
        role, content = getattr(message, "role", None), getattr(message, "content", None)
        name = getattr(message, "name", None)
    if isinstance(content, list):
        raise ValueError(f"messages[{index}].content {CONTENT_PARTS_REASON}")
    if not isinstance(role, str) or not isinstance(content, str):
        raise ValueError(f"messages[{index}] needs string 'role' and 'content', got {message!r}")
    return {"role": role, "content": content} | ({"name": name} if isinstance(name, str) else {})


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    *,
    prompt: str | None = None,
    messages: Sequence[Any] | None = None,
) -> list[int]:
    """Token ids for exactly one of ``prompt`` (plain encode, special tokens such as BOS added
    as the tokenizer does for HF generate) or ``messages`` (dicts or ChatMessage structs,
    rendered with the chat template and add_generation_prompt=True)."""
    if (prompt is None) == (messages is None):
        raise ValueError("pass exactly one of prompt= or messages=")
    if prompt is not None:
        return list(tokenizer(prompt)["input_ids"])
    assert messages is not None
    if not messages:
        raise ValueError("messages must not be empty")
    if tokenizer.chat_template is None:
        raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
    chat = [_message_dict(m, i) for i, m in enumerate(messages)]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])

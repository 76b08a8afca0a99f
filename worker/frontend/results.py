"""Turning the scheduler's finished requests into Results: detokenize, trim stop strings."""

from __future__ import annotations

from typing import Any, Protocol

from producer.schema import Choice, ErrorInfo, Result, Timings, Usage
from worker.scheduler.messages import ChoiceOutput, RequestFinished


class Detokenizer(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def choice_text(tokenizer: Detokenizer, choice: ChoiceOutput) -> str:
    """The choice's text; a matched stop string and everything after it are cut off."""
    text = tokenizer.decode(choice.token_ids, skip_special_tokens=True)
    if choice.matched_stop:
        cut = text.find(choice.matched_stop)
        if cut >= 0:
            text = text[:cut]
    return text


def build_result(
    job_id: str,
    finished: RequestFinished,
    tokenizer: Detokenizer,
    *,
    metadata: dict[str, Any] | None = None,
    model: str = "",
    worker: str = "",
    timings: Timings | None = None,
) -> Result:
    """The Result of one job from the scheduler's answer (choices, or the error it reported)."""
    error = None
    if finished.error_code is not None:
        error = ErrorInfo(code=finished.error_code, message=finished.error_message or finished.error_code)
    choices = [
        Choice(
            index=c.index,
            text=choice_text(tokenizer, c),
            token_ids=list(c.token_ids),
            finish_reason=c.finish_reason,
        )
        for c in sorted(finished.choices, key=lambda c: c.index)
    ]
    usage = Usage(
        prompt_tokens=finished.prompt_tokens,
        completion_tokens=sum(len(c.token_ids) for c in choices),
        cached_tokens=finished.cached_tokens,
    )
    return Result(
        id=job_id,
        choices=choices,
        usage=usage,
        metadata=metadata or {},
        error=error,
        model=model,
        worker=worker,
        timings=timings or Timings(),
    )

"""Turning the scheduler's finished requests into Results: detokenize, trim stop strings, logprobs."""

from __future__ import annotations

from typing import Protocol

from wire.schema import Choice, ErrorInfo, Result, Timings, TokenLogprob, TopLogprob, Usage
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


def choice_logprobs(tokenizer: Detokenizer, choice: ChoiceOutput) -> list[TokenLogprob] | None:
    """The choice's logprobs with each token's text (the token decoded alone, special tokens
    kept), or None when the request did not ask for them."""
    if choice.logprobs is None:
        return None
    texts: dict[int, str] = {}

    def text(token_id: int) -> str:
        if token_id not in texts:
            texts[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
        return texts[token_id]

    return [
        TokenLogprob(
            token_id=token_id,
            token=text(token_id),
            logprob=entry.logprob,
            top_logprobs=[
                TopLogprob(token_id=top_id, token=text(top_id), logprob=logprob)
                for top_id, logprob in zip(entry.top_ids, entry.top_logprobs, strict=True)
            ],
        )
        for token_id, entry in zip(choice.token_ids, choice.logprobs, strict=True)
    ]


def build_result(
    job_id: str,
    finished: RequestFinished,
    tokenizer: Detokenizer,
    *,
    model: str = "",
    timings: Timings | None = None,
) -> Result:
    """The Result of one job from the scheduler's answer (choices, or the error it reported).
    On the queue path the consumer fills the envelope (metadata, model, worker, timings:
    worker.queue.held.envelope); ``timings`` carries only the engine's first token there."""
    error = None
    if finished.error_code is not None:
        error = ErrorInfo(code=finished.error_code, message=finished.error_message or finished.error_code)
    choices = [
        Choice(
            index=c.index,
            text=choice_text(tokenizer, c),
            token_ids=list(c.token_ids),
            finish_reason=c.finish_reason,
            logprobs=choice_logprobs(tokenizer, c),
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
        error=error,
        model=model,
        timings=timings or Timings(),
    )

"""Stop conditions of a choice, checked on the host after each appended token."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from wire.schema import SamplingParams
from worker.scheduler.req import Req

Detokenize = Callable[[list[int]], str]
_STOP_WINDOW_SLACK = 4  # tokens decoded beyond the longest stop string, for multi-byte merges


class Stop(NamedTuple):
    finish_reason: str  # "stop" | "length" | "error" (a token its grammar rejected)
    matched_stop: str | None
    drop_last: bool  # the ending token id is not part of the output (EOS, stop_token_ids)


def check_stop(req: Req, eos_token_ids: frozenset[int], detokenize: Detokenize | None) -> Stop | None:
    """Why the choice ends after its newest token, or None to go on.

    Before ``min_tokens`` tokens only the length ends it: EOS and stop ids were masked on the
    device (worker.engine.penalties) and stop strings wait too (as vLLM). A structured-output
    choice ends when its grammar is complete (or broke), first. Reads the newest tokens only:
    a step checks every running request this way (worker.scheduler.ledger.StopRows picks which).
    """
    grammar = req.pending.grammar
    if grammar is not None and grammar.done:  # structured output: complete (stop token) or broken
        return Stop("error" if grammar.rejected else "stop", None, True)
    ids, prompt_len = req.input_ids, req.prompt_len
    output_len = len(ids) - prompt_len
    if output_len >= req.sampling.min_tokens:
        stop = _matched_stop(ids, prompt_len, req.sampling, eos_token_ids, detokenize)
        if stop is not None:
            return stop
    if output_len >= req.max_tokens:
        return Stop("length", None, False)
    return None


def _matched_stop(
    ids: list[int],
    prompt_len: int,
    sampling: SamplingParams,
    eos_token_ids: frozenset[int],
    detokenize: Detokenize | None,
) -> Stop | None:
    """The stop the newest token ``ids[-1]`` (an output token: past ``prompt_len``) makes."""
    token = ids[-1]
    if token in sampling.stop_token_ids or (not sampling.ignore_eos and token in eos_token_ids):
        return Stop("stop", None, True)
    if sampling.stop and detokenize is not None:
        window = max(len(s) for s in sampling.stop) + _STOP_WINDOW_SLACK
        tail = detokenize(ids[max(prompt_len, len(ids) - window) :])
        for stop in sampling.stop:
            if stop in tail:
                return Stop("stop", stop, False)
    return None

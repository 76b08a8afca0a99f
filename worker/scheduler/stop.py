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
    choice ends when its grammar is complete (or broke), first."""
    output = req.output_ids
    grammar = req.pending.grammar
    if grammar is not None and grammar.done:  # structured output: complete (stop token) or broken
        return Stop("error" if grammar.rejected else "stop", None, True)
    if len(output) >= req.sampling.min_tokens:
        stop = _matched_stop(output, req.sampling, eos_token_ids, detokenize)
        if stop is not None:
            return stop
    if len(output) >= req.max_tokens:
        return Stop("length", None, False)
    return None


def _matched_stop(
    output: list[int], sampling: SamplingParams, eos_token_ids: frozenset[int], detokenize: Detokenize | None
) -> Stop | None:
    token = output[-1]
    if token in sampling.stop_token_ids or (not sampling.ignore_eos and token in eos_token_ids):
        return Stop("stop", None, True)
    if sampling.stop and detokenize is not None:
        window = max(len(s) for s in sampling.stop) + _STOP_WINDOW_SLACK
        tail = detokenize(output[-window:])
        for stop in sampling.stop:
            if stop in tail:
                return Stop("stop", stop, False)
    return None

"""Messages between the front end and the scheduler process (msgspec, tagged unions).

The front end validates and tokenizes jobs and sends GenerateRequest; the scheduler answers
each one with exactly one RequestFinished (all n choices, or an error). These cross a ZMQ
socket as msgpack, or an in-memory queue for tests and the offline API.
"""

from __future__ import annotations

from typing import Literal, Protocol

import msgspec

from wire.schema import SamplingParams


class GenerateRequest(msgspec.Struct, tag="generate", frozen=True):
    uid: str
    input_ids: list[int]
    sampling: SamplingParams


class AbortRequest(msgspec.Struct, tag="abort", frozen=True):
    uid: str


class ShutdownRequest(msgspec.Struct, tag="shutdown", frozen=True):
    pass


Inbound = GenerateRequest | AbortRequest | ShutdownRequest


class TokenLogprobs(msgspec.Struct, frozen=True, array_like=True):
    """One generated token's raw logprob and the top ones (worker.engine.logprobs)."""

    logprob: float
    top_ids: list[int]  # most likely first
    top_logprobs: list[float]


class ChoiceOutput(msgspec.Struct, frozen=True):
    index: int
    token_ids: list[int]  # generated tokens; a stop token id that ended it is not included
    finish_reason: Literal["stop", "length", "error"]
    matched_stop: str | None = None  # the stop string that ended it, for trimming the text
    logprobs: list[TokenLogprobs] | None = None  # one per token id, when the request asked


class RequestFinished(msgspec.Struct, tag="finished", frozen=True):
    uid: str
    choices: list[ChoiceOutput]
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache (first admission)
    error_code: str | None = None  # e.g. "prompt_too_long"; choices empty then
    error_message: str | None = None
    first_token_at_ms: int = 0  # wall clock when its first output token reached the host
    # The scheduler's load when this was sent (the worker's metrics gauges show the latest):
    running_reqs: int = 0  # requests it holds, running or waiting
    pages_used: int = 0  # KV pages not free (running requests and the prefix cache)
    step_s: float = 0.0  # how long the step that sent it took
    batch_reqs: int = 0  # requests (choices) in the running batch: decoding, or a prompt in chunks
    waiting_reqs: int = 0  # requests (choices) waiting for admission


class SchedulerReady(msgspec.Struct, tag="ready", frozen=True):
    """Sent once when the scheduler process has loaded the model."""

    max_running_reqs: int
    max_seq_len: int
    num_pages: int
    page_size: int
    model_name: str = ""
    model_path: str = ""  # local HF-style directory: the front end loads the tokenizer from it


class SchedulerFailed(msgspec.Struct, tag="failed", frozen=True):
    """Sent once, just before the scheduler process exits on an error it cannot contain.

    ``suspect_uids``: the requests of the step that failed (the front end re-runs them one at
    a time to find the culprit); empty when the failure is not tied to a step, e.g. while
    loading the model (``loading`` is then true and the worker cannot start)."""

    error: str
    suspect_uids: list[str] = []
    loading: bool = False


Outbound = RequestFinished | SchedulerReady | SchedulerFailed

# The scheduler process's exit status when a tensor-parallel follower died (worker.scheduler.tp):
# the group is gone, no job of it is to blame
RANK_LOST_EXIT = 3

inbound_decoder = msgspec.msgpack.Decoder(Inbound)
outbound_decoder = msgspec.msgpack.Decoder(Outbound)
encoder = msgspec.msgpack.Encoder()


class SchedulerIO(Protocol):
    """How the scheduler talks to its front end.

    ``receive(block)`` returns every inbound message available now; with ``block`` it waits
    until at least one arrives (the scheduler blocks only when it has nothing to run).
    ``send`` delivers outbound messages in order.
    """

    def receive(self, block: bool) -> list[Inbound]: ...

    def send(self, messages: list[Outbound]) -> None: ...

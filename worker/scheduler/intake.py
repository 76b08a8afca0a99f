"""Intake: turning a GenerateRequest into a RequestGroup of PendingReqs, or a reason to refuse it."""

from __future__ import annotations

import random

import msgspec

from wire.schema import SamplingParams
from worker.engine.penalties import bias_refusal
from worker.scheduler.messages import GenerateRequest
from worker.scheduler.req import PendingReq, RequestGroup


def refusal(msg: GenerateRequest, max_seq_len: int, vocab_size: int) -> tuple[str, str] | None:
    """(error_code, message) when the request cannot run on this engine, else None.

    ``msg.sampling`` already holds SamplingParams' bounds (checked when it was decoded); what
    depends on the model is checked here (token ids of the prompt and of logit_bias). Stop token
    ids outside the vocabulary are accepted:
    they can never match a sampled token, so they are harmless."""
    prompt_len = len(msg.input_ids)
    if prompt_len == 0:
        return "invalid_job", "input_ids: empty prompt"
    bad = next((t for t in msg.input_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        return "invalid_job", f"input_ids: token {bad} not in [0, {vocab_size})"
    bias_error = bias_refusal(msg.sampling, vocab_size)
    if bias_error is not None:
        return "invalid_job", bias_error
    if prompt_len >= max_seq_len:
        return (
            "prompt_too_long",
            f"prompt of {prompt_len} tokens leaves no room in the context of {max_seq_len} tokens",
        )
    return None


def choice_seed(sampling: SamplingParams) -> int:
    """The seed a choice samples with: its own, else one drawn now (its draws then depend on
    (seed, step) only, never on the batch it lands in)."""
    return sampling.seed if sampling.seed is not None else random.getrandbits(63)


def make_group(msg: GenerateRequest, max_seq_len: int) -> tuple[RequestGroup, list[PendingReq]]:
    """The group and its n choices. max_tokens is clamped to the context (finish "length").

    Choice i samples with seed + i when a seed is given, else with a seed of its own drawn
    here (choice_seed)."""
    prompt_len = len(msg.input_ids)
    max_device_len = prompt_len + min(msg.sampling.max_tokens, max_seq_len - prompt_len)
    group = RequestGroup(uid=msg.uid, prompt_len=prompt_len, n=msg.sampling.n)
    choices = []
    for index in range(group.n):
        sampling = msg.sampling
        if sampling.seed is not None and index > 0:
            sampling = msgspec.structs.replace(sampling, seed=(sampling.seed + index) % 2**63)
        choices.append(
            PendingReq(group, index, list(msg.input_ids), sampling, max_device_len, choice_seed(sampling))
        )
    return group, choices

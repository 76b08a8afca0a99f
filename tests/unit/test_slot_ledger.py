"""The SlotLedger (worker.scheduler.ledger): a step's bulk reads and writes agree with the
per-request ledger they replace. The oracle for stops is ``check_stop``, one request at a time;
for lengths, each Req's own ``complete_forward``."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from wire.schema import SamplingParams
from worker.scheduler.ledger import STOP_IDS, SlotLedger
from worker.scheduler.req import PendingReq, Req, RequestGroup
from worker.scheduler.stop import check_stop

EOS = frozenset({2, 7})
VOCAB = 12


def _req(
    ledger: SlotLedger | None, slot: int, prompt: list[int], output: list[int], sampling: SamplingParams
) -> Req:
    group = RequestGroup(uid=f"g{slot}", prompt_len=len(prompt), n=1)
    max_device_len = len(prompt) + sampling.max_tokens
    pending = PendingReq(group, 0, prompt + output, sampling, max_device_len, seed=slot)
    device_len = len(prompt) + len(output)
    return Req(pending, slot, device_len - 1, device_len, max_device_len, None, 0, 16, ledger)


request = st.fixed_dictionaries(
    {
        "prompt_len": st.integers(1, 4),
        "output": st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
        "extra": st.integers(0, 3),  # max_tokens beyond the output so far
        "min_tokens": st.integers(0, 6),
        "ignore_eos": st.booleans(),
        "stop_token_ids": st.lists(st.integers(0, VOCAB - 1), max_size=STOP_IDS + 2),
        "stop": st.sampled_from([[], ["ab"]]),
    }
)


@settings(max_examples=60, deadline=None)
@given(requests=st.lists(request, min_size=1, max_size=8))
def test_stop_candidates_are_the_rows_check_stop_ends(requests: list[dict]) -> None:
    """Rows without stop strings and with few stop ids are candidates exactly when check_stop
    ends them; the others are always candidates (check_stop judges them each step)."""
    ledger = SlotLedger(len(requests) + 1, VOCAB)
    reqs = []
    for slot, r in enumerate(requests):
        max_tokens = len(r["output"]) + r["extra"]
        sampling = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min(r["min_tokens"], max_tokens),
            ignore_eos=r["ignore_eos"],
            stop_token_ids=r["stop_token_ids"],
            stop=r["stop"],
        )
        reqs.append(_req(ledger, slot, [1] * r["prompt_len"], r["output"], sampling))
    slots = np.arange(len(reqs), dtype=np.int64)
    tokens = np.array([req.input_ids[-1] for req in reqs], dtype=np.int32)
    candidates = set(ledger.stop_rows(slots).candidates(tokens, np.array(sorted(EOS))).tolist())
    detokenize = lambda ids: "".join("ab"[t % 2] for t in ids)  # noqa: E731
    for row, req in enumerate(reqs):
        ends = check_stop(req, EOS, detokenize) is not None
        slow = bool(req.sampling.stop) or len(req.sampling.stop_token_ids) > STOP_IDS
        assert (row in candidates) == (ends or slow), (row, req.sampling, req.output_ids)


def test_bulk_complete_forward_moves_lengths_as_each_request_does() -> None:
    rng = random.Random(3)
    shared = SlotLedger(9)
    pairs = []
    for slot in (4, 0, 7, 2):
        prompt = [1] * rng.randint(1, 5)
        output = [3] * rng.randint(1, 5)
        sampling = SamplingParams(max_tokens=len(output) + 10)
        pairs.append(
            (_req(shared, slot, prompt, output, sampling), _req(None, slot, prompt, output, sampling))
        )
    shared.complete_forward(np.array([4, 0, 7, 2], dtype=np.int64))
    for bulk, alone in pairs:
        alone.complete_forward()
        assert (bulk.cached_len, bulk.device_len) == (alone.cached_len, alone.device_len)
        assert bulk.cached_len == bulk.device_len - 1


def test_a_released_request_keeps_its_lengths_when_its_slot_is_reused() -> None:
    ledger = SlotLedger(3)
    old = _req(ledger, 1, [1, 1, 1], [5, 6], SamplingParams(max_tokens=9))
    old.detach()
    new = _req(ledger, 1, [4], [8], SamplingParams(max_tokens=3, ignore_eos=True))
    assert (old.cached_len, old.device_len, old.max_device_len, old.max_tokens) == (4, 5, 12, 9)
    assert (new.cached_len, new.device_len, new.max_device_len) == (1, 2, 4)
    old.complete_forward()  # moves its own copy only
    assert (old.device_len, new.device_len) == (6, 2)

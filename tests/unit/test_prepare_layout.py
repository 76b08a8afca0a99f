"""BatchPreparer's packed layout: every ForwardInput and SamplingTensors view holds what the
engine expects, against values worked out here from the requests' lengths and parameters."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from wire.schema import SamplingParams
from worker.kvcache.table import TableManager
from worker.scheduler.ledger import SlotLedger
from worker.scheduler.prepare import PASS_FLOAT32, PASS_INT64, BatchPreparer, sampling_tensors
from worker.scheduler.req import ChunkedReq, PendingReq, Req, RequestGroup

MAX_REQS, ROW_LEN, VOCAB = 8, 32, 100
DUMMY_LOC = 9999


def _location(slot: int, position: int) -> int:
    return 1000 * slot + position  # what the test writes into the page table


def _preparer(graph_bs: int | None = None) -> BatchPreparer:
    """A preparer over CPU tables; the requests of a batch bind its ledger (``_req``)."""
    shape = (MAX_REQS + 1, ROW_LEN)
    tables = TableManager(
        MAX_REQS, torch.zeros(shape, dtype=torch.int32), torch.zeros(shape, dtype=torch.int32)
    )
    for slot in range(MAX_REQS):
        tables.write_locations(slot, 0, torch.tensor([_location(slot, i) for i in range(ROW_LEN)]))
    engine = SimpleNamespace(
        device=torch.device("cpu"),
        scheduler_stream=None,
        stream=None,
        graph_batch_size=lambda b: graph_bs or None,
        dummy_loc=DUMMY_LOC,
        vocab_size=VOCAB,
        eos_token_ids=frozenset({2}),
    )
    return BatchPreparer(engine, tables, SlotLedger(MAX_REQS + 1, VOCAB))  # type: ignore[arg-type]


def _req(ledger, slot, prompt_len, generated, cached_len, device_len, sampling, seed, cls=Req) -> Req:
    group = RequestGroup(uid=f"g{slot}", prompt_len=prompt_len, n=1)
    input_ids = list(range(1, prompt_len + generated + 1))
    pending = PendingReq(group, 0, input_ids, sampling, prompt_len + 20, seed)
    return cls(pending, slot, cached_len, device_len, prompt_len + 20, None, 0, ROW_LEN, ledger)


PARAMS = [
    SamplingParams(temperature=0.0, seed=11),  # greedy
    SamplingParams(temperature=0.7, top_k=5, seed=12),
    SamplingParams(temperature=1.3, top_p=0.9, min_p=0.05),  # unseeded: the request's own seed
    SamplingParams(temperature=0.5, top_k=VOCAB + 5, seed=14),  # top_k over the vocabulary: off
]


def _mixed_batch(ledger: SlotLedger) -> list[Req]:
    """A fresh prompt, a prompt over a cached prefix, a non-final chunk, and a retracted
    request prefilled again with 3 generated tokens (its output position is 3)."""
    # (slot, prompt_len, generated, cached_len, device_len, sampling, seed)
    return [
        _req(ledger, 2, 5, 0, 0, 5, PARAMS[0], 11),
        _req(ledger, 0, 6, 0, 4, 6, PARAMS[1], 12),
        _req(ledger, 5, 10, 0, 0, 3, PARAMS[2], 77, ChunkedReq),
        _req(ledger, 7, 4, 3, 2, 7, PARAMS[3], 14),
    ]


def _as_list(t: torch.Tensor) -> list:
    return t.tolist()


def test_prefill_views_hold_each_field() -> None:
    preparer = _preparer(graph_bs=16)
    fi = preparer.prepare(_mixed_batch(preparer.ledger))  # a prefill never replays a graph
    spans = [(2, 0, 5), (0, 4, 6), (5, 0, 3), (7, 2, 7)]  # (slot, first position, end)
    assert _as_list(fi.load_slots) == [s for s, a, b in spans for _ in range(a, b)]
    assert _as_list(fi.positions) == [p for _, a, b in spans for p in range(a, b)]
    assert _as_list(fi.out_loc) == [_location(s, p) for s, a, b in spans for p in range(a, b)]
    assert _as_list(fi.sample_idx) == [4, 6, 9, 14]  # last new token of each request
    assert _as_list(fi.write_slots) == [2, 0, MAX_REQS, 7]  # the chunk writes to the dummy slot
    assert _as_list(fi.write_pos) == [5, 6, 0, 7]
    assert fi.graph_bs is None and fi.layout.num_tokens == 15
    assert _as_list(fi.layout.slots_cpu) == [2, 0, 5, 7]
    assert _as_list(fi.layout.cached_lens_cpu) == [0, 4, 0, 2]
    assert _as_list(fi.layout.extend_lens_cpu) == [5, 2, 3, 5]
    t = fi.sampling
    assert _as_list(t.seeds) == [11, 12, 77, 14]
    assert _as_list(t.steps) == [0, 0, 0, 3]
    assert _as_list(t.top_k) == [0, 5, 0, 0]
    assert _as_list(t.greedy) == [True, False, False, False] and t.greedy.dtype == torch.bool
    assert _as_list(t.temperature) == pytest.approx([1.0, 0.7, 1.3, 0.5])
    assert _as_list(t.top_p) == pytest.approx([1.0, 1.0, 0.9, 1.0])
    assert _as_list(t.min_p) == pytest.approx([0.0, 0.0, 0.05, 0.0])
    assert (t.all_greedy, t.use_top_k, t.use_top_p, t.use_min_p) == (False, True, True, True)


def test_decode_views_are_padded_to_the_graph_size() -> None:
    preparer = _preparer(graph_bs=4)
    ledger = preparer.ledger
    reqs = [_req(ledger, 3, 5, 4, 8, 9, PARAMS[0], 11), _req(ledger, 1, 7, 1, 7, 8, PARAMS[3], 14)]
    fi = preparer.prepare(reqs)
    assert fi.graph_bs == 4 and fi.batch_size == 2
    assert _as_list(fi.load_slots) == [3, 1, MAX_REQS, MAX_REQS]
    assert _as_list(fi.positions) == [8, 7, 0, 0]
    assert _as_list(fi.out_loc) == [_location(3, 8), _location(1, 7), DUMMY_LOC, DUMMY_LOC]
    assert _as_list(fi.sample_idx) == [0, 1]
    assert _as_list(fi.write_slots) == [3, 1] and _as_list(fi.write_pos) == [9, 8]
    assert _as_list(fi.sampling.steps) == [4, 1] and _as_list(fi.sampling.seeds) == [11, 14]
    assert (fi.sampling.use_top_k, fi.sampling.use_top_p, fi.sampling.use_min_p) == (False, False, False)


def test_greedy_rows_switch_no_filter_on() -> None:
    """Filters on greedy rows only: no filter runs, and an all-greedy batch says so."""
    greedy = [SamplingParams(temperature=0.0, top_k=5, top_p=0.5, min_p=0.2), SamplingParams(top_k=1)]
    t = sampling_tensors(greedy, [0, 0], "cpu", seeds=[1, 2], vocab_size=VOCAB)
    assert t.all_greedy and not (t.use_top_k or t.use_top_p or t.use_min_p)


def test_sampling_tensors_outside_a_pass_equal_the_pass_ones() -> None:
    preparer = _preparer()
    fi = preparer.prepare(_mixed_batch(preparer.ledger))
    alone = sampling_tensors(PARAMS, [0, 0, 0, 3], "cpu", seeds=[11, 12, 77, 14], vocab_size=VOCAB)
    for name in ("temperature", "top_p", "top_k", "min_p", "seeds", "steps", "greedy"):
        assert torch.equal(getattr(alone, name), getattr(fi.sampling, name)), name
    flags = ("all_greedy", "use_top_k", "use_top_p", "use_min_p")
    assert [getattr(alone, f) for f in flags] == [getattr(fi.sampling, f) for f in flags]


def test_every_field_is_packed_once() -> None:
    names = [name for name, _ in PASS_INT64.fields + PASS_FLOAT32.fields]
    assert len(names) == len(set(names)) == 13
    assert PASS_INT64.sizes(num_rows=7, batch_size=3) == [7, 7, 7] + [3] * 7


def test_the_schedulers_slots_give_the_same_pass() -> None:
    """The scheduler hands its slot array and the count of leading prefills (the rest are
    running requests); the pass equals the one built from the requests alone."""
    preparer = _preparer()
    reqs = _mixed_batch(preparer.ledger)
    alone = preparer.prepare(reqs)
    slots = torch.tensor([r.slot for r in reqs]).numpy()
    told = preparer.prepare(reqs, slots, num_prefills=3)  # the chunk is among the prefills
    for name in ("load_slots", "positions", "out_loc", "sample_idx", "write_slots", "write_pos"):
        assert torch.equal(getattr(alone, name), getattr(told, name)), name
    for name in ("seeds", "steps", "top_k", "greedy", "temperature", "top_p", "min_p"):
        assert torch.equal(getattr(alone.sampling, name), getattr(told.sampling, name)), name

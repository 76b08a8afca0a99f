"""BatchPreparer's packed layout: every ForwardInput and SamplingTensors view holds what the
engine expects, against values worked out here from the requests' lengths and parameters."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from wire.schema import SamplingParams
from worker.kvcache.table import TableManager
from worker.scheduler.prepare import PASS_FLOAT32, PASS_INT64, BatchPreparer, sampling_tensors
from worker.scheduler.req import ChunkedReq, PendingReq, Req, RequestGroup

MAX_REQS, ROW_LEN, VOCAB = 8, 32, 100
DUMMY_LOC = 9999


def _location(slot: int, position: int) -> int:
    return 1000 * slot + position  # what the test writes into the page table


def _preparer(graph_bs: int | None = None) -> BatchPreparer:
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
    return BatchPreparer(engine, tables)  # type: ignore[arg-type]


def _req(slot, prompt_len, generated, cached_len, device_len, sampling, seed, cls=Req) -> Req:
    group = RequestGroup(uid=f"g{slot}", prompt_len=prompt_len, n=1)
    input_ids = list(range(1, prompt_len + generated + 1))
    pending = PendingReq(group, 0, input_ids, sampling, prompt_len + 20, seed)
    return cls(pending, slot, cached_len, device_len, prompt_len + 20, None, 0, ROW_LEN)


PARAMS = [
    SamplingParams(temperature=0.0, seed=11),  # greedy
    SamplingParams(temperature=0.7, top_k=5, seed=12),
    SamplingParams(temperature=1.3, top_p=0.9, min_p=0.05),  # unseeded: the request's own seed
    SamplingParams(temperature=0.5, top_k=VOCAB + 5, seed=14),  # top_k over the vocabulary: off
]


def _mixed_batch() -> list[Req]:
    """A fresh prompt, a prompt over a cached prefix, a non-final chunk, and a retracted
    request prefilled again with 3 generated tokens (its output position is 3)."""
    return [
        _req(slot=2, prompt_len=5, generated=0, cached_len=0, device_len=5, sampling=PARAMS[0], seed=11),
        _req(slot=0, prompt_len=6, generated=0, cached_len=4, device_len=6, sampling=PARAMS[1], seed=12),
        _req(
            slot=5,
            prompt_len=10,
            generated=0,
            cached_len=0,
            device_len=3,
            sampling=PARAMS[2],
            seed=77,
            cls=ChunkedReq,
        ),
        _req(slot=7, prompt_len=4, generated=3, cached_len=2, device_len=7, sampling=PARAMS[3], seed=14),
    ]


def _as_list(t: torch.Tensor) -> list:
    return t.tolist()


def test_prefill_views_hold_each_field() -> None:
    fi = _preparer(graph_bs=16).prepare(_mixed_batch())  # a prefill never replays a graph
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
    reqs = [
        _req(slot=3, prompt_len=5, generated=4, cached_len=8, device_len=9, sampling=PARAMS[0], seed=11),
        _req(slot=1, prompt_len=7, generated=1, cached_len=7, device_len=8, sampling=PARAMS[3], seed=14),
    ]
    fi = _preparer(graph_bs=4).prepare(reqs)
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
    fi = _preparer().prepare(_mixed_batch())
    alone = sampling_tensors(PARAMS, [0, 0, 0, 3], "cpu", seeds=[11, 12, 77, 14], vocab_size=VOCAB)
    for name in ("temperature", "top_p", "top_k", "min_p", "seeds", "steps", "greedy"):
        assert torch.equal(getattr(alone, name), getattr(fi.sampling, name)), name
    flags = ("all_greedy", "use_top_k", "use_top_p", "use_min_p")
    assert [getattr(alone, f) for f in flags] == [getattr(fi.sampling, f) for f in flags]


def test_every_field_is_packed_once() -> None:
    names = [name for name, _ in PASS_INT64.fields + PASS_FLOAT32.fields]
    assert len(names) == len(set(names)) == 13
    assert PASS_INT64.sizes(num_rows=7, batch_size=3) == [7, 7, 7] + [3] * 7

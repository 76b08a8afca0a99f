"""worker.attention.prefix_rows: which rows of a prefill pass attend to a cached prefix."""

from __future__ import annotations

import pytest
import torch

from worker.attention.prefix_rows import prefix_rows
from worker.forward import BatchLayout


def layout(specs: list[tuple[int, int]], slots: list[int] | None = None) -> BatchLayout:
    return BatchLayout(
        slots_cpu=torch.tensor(slots or [10 + i for i in range(len(specs))], dtype=torch.int32),
        cached_lens_cpu=torch.tensor([c for c, _ in specs], dtype=torch.int32),
        extend_lens_cpu=torch.tensor([e for _, e in specs], dtype=torch.int32),
    )


def rows_by_request(specs: list[tuple[int, int]]) -> list[int]:
    """The oracle: walk the requests, their rows one after another, keep those with a prefix."""
    rows, start = [], 0
    for cached, extend in specs:
        if cached > 0:
            rows.extend(range(start, start + extend))
        start += extend
    return rows


def test_a_pass_without_prefixes_has_no_prefix_part() -> None:
    assert prefix_rows(layout([(0, 7), (0, 1), (0, 30)])) is None


@pytest.mark.parametrize(
    "specs",
    [
        [(5, 3), (0, 4), (9, 1), (0, 2), (17, 6)],  # scattered, decode rows among them
        [(0, 4), (12, 8), (0, 1), (3, 1)],
        [(1, 1), (0, 9), (0, 9), (40, 1)],  # the first and the last
    ],
)
def test_scattered_requests_gather_their_rows_in_order(specs) -> None:
    rows = prefix_rows(layout(specs))
    assert rows is not None and rows.span is None and rows.rows_cpu is not None
    assert rows.rows_cpu.tolist() == rows_by_request(specs)
    assert rows.num_rows == len(rows_by_request(specs))
    with_prefix = [i for i, (c, _) in enumerate(specs) if c > 0]
    assert rows.requests_cpu.tolist() == with_prefix
    assert rows.slots_cpu.tolist() == [10 + i for i in with_prefix]
    assert rows.cached_lens_cpu.tolist() == [specs[i][0] for i in with_prefix]
    assert rows.extend_lens_cpu.tolist() == [specs[i][1] for i in with_prefix]
    assert rows.seq_lens_cpu.tolist() == [sum(specs[i]) for i in with_prefix]


@pytest.mark.parametrize(
    "specs",
    [
        [(0, 4), (12, 8), (3, 1), (7, 5), (0, 2)],  # consecutive in the middle
        [(30, 100)],  # one chunk of a long prompt
        [(8, 2), (9, 1), (4, 4)],  # every request
        [(0, 6), (0, 3), (2, 2)],  # the last
    ],
)
def test_consecutive_requests_are_one_slice_of_rows(specs) -> None:
    rows = prefix_rows(layout(specs))
    assert rows is not None and rows.rows_cpu is None
    expected = rows_by_request(specs)
    assert rows.span == (expected[0], expected[-1] + 1) and rows.num_rows == len(expected)

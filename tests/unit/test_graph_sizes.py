"""Which decode batch sizes get a CUDA graph, and which graph a batch replays (hand-computed)."""

from __future__ import annotations

from worker.engine.graph import fitting_batch_size, graph_batch_sizes


def test_captured_sizes_are_powers_of_two_then_multiples_of_16():
    assert graph_batch_sizes(256) == [1, 2, 4, 8, *range(16, 257, 16)]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(1) == [1]


def test_a_batch_replays_the_smallest_graph_that_holds_it():
    sizes = graph_batch_sizes(40)  # 1, 2, 4, 8, 16, 32, 40
    expected = {1: 1, 2: 2, 3: 4, 5: 8, 9: 16, 16: 16, 17: 32, 33: 40, 40: 40, 41: None}
    assert {b: fitting_batch_size(sizes, b) for b in expected} == expected

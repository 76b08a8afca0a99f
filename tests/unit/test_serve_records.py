"""service.records on fakeredis: pages of batches newest first (``after``, ``limit``,
``has_more``), status moves only from the statuses they start from, a final batch leaves the
active set and keeps its final counts."""

from __future__ import annotations

import fakeredis

from service.records import ACTIVE, BatchRecord, Records
from wire.keys import QueueKeys


def batch(i: int, status: str = "validating") -> BatchRecord:
    return BatchRecord(
        id=f"batch_{i}", endpoint="/v1/chat/completions", input_file_id="file-1", completion_window="24h",
        status=status, created_at=1_000 + i, expires_at=90_000, total=10,
    )  # fmt: skip


def test_batches_page_newest_first_after_an_id() -> None:
    records = Records(fakeredis.FakeRedis(), QueueKeys("q"))
    for i in range(5):
        records.create_batch(batch(i))
    first, more = records.batches(None, 2)
    assert [b.id for b in first] == ["batch_4", "batch_3"] and more
    second, more = records.batches("batch_3", 2)
    assert [b.id for b in second] == ["batch_2", "batch_1"] and more
    last, more = records.batches("batch_1", 2)
    assert [b.id for b in last] == ["batch_0"] and not more
    assert records.active() == [f"batch_{i}" for i in range(5)]


def test_a_move_happens_only_from_its_statuses_and_a_final_batch_leaves_the_active_set() -> None:
    records = Records(fakeredis.FakeRedis(), QueueKeys("q"))
    records.create_batch(batch(1))
    records.set_counts("batch_1", 3, 1)
    assert records.counts(["batch_1", "batch_9"]) == {"batch_1": (3, 1)}

    def cancelling(r: BatchRecord) -> None:
        r.status = "cancelling"

    moved, changed = records.move("batch_1", frozenset({"validating", "in_progress"}), cancelling)
    assert changed and moved is not None and moved.status == "cancelling"
    again, changed = records.move("batch_1", frozenset({"validating", "in_progress"}), cancelling)
    assert not changed and again is not None and again.status == "cancelling"

    def cancelled(r: BatchRecord) -> None:
        r.status, r.completed, r.failed = "cancelled", 4, 6

    final, changed = records.move("batch_1", ACTIVE, cancelled)
    assert changed and records.active() == [] and records.counts(["batch_1"]) == {}
    assert final is not None and final.to_openai((99, 99))["request_counts"] == {
        "total": 10,
        "completed": 4,
        "failed": 6,
    }
    assert records.move("batch_nope", ACTIVE, cancelled) == (None, False)

"""Write each job's counted result exactly once to an output JSONL file.

The results stream may hold several results for one job id (redelivery races, a dead letter
that was requeued). The one that counts is the one whose ``entry`` equals the job's field in
the ``done`` hash; the others are ignored. Output follows the given id order (enqueue order by
default), so results are buffered until every earlier job has been written. An existing output
file is resumed: ids already in it are not written again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import redis

from producer.jsonl import output_line, written_ids
from producer.keys import DEFAULT_QUEUE, FIELD_ENTRY, FIELD_ID, FIELD_RESULT, QueueKeys
from producer.schema import Result, decode_result

_READ_COUNT = 5000


@dataclass(frozen=True)
class CollectReport:
    written: int  # lines this call appended
    already: int  # ids found in the output file before this call
    missing: list[str]  # expected ids with no counted result yet (when it stopped waiting)


class Collector:
    def __init__(self, client: redis.Redis, queue: str = DEFAULT_QUEUE) -> None:
        self.redis = client
        self.keys = QueueKeys(queue)
        self._last_entry = "0-0"
        self._counted: dict[str, Result] = {}

    def collect(
        self,
        out: str | Path,
        *,
        ids: list[str] | None = None,
        wait: bool = True,
        timeout_s: float | None = None,
        poll_s: float = 0.5,
        should_stop: Callable[[], bool] | None = None,
    ) -> CollectReport:
        """Append the results of ``ids`` (default: every enqueued id, in order) to ``out``.

        With ``wait`` it blocks until all of them are written, ``timeout_s`` passes or
        ``should_stop()`` says so; without it, it writes what is there now and returns.
        With ``ids`` None, results of jobs that were never enqueued through a Client (written
        straight to the stream) are appended after the ordered ones.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        already = written_ids(out)
        done_ids = set(already)
        written = 0
        cursor = 0
        expected = ids
        with open(out, "ab") as sink:
            while True:
                if ids is None:
                    expected = self._extend_order(expected or [])
                assert expected is not None
                self._read_results(block_ms=0)
                while cursor < len(expected):
                    job_id = expected[cursor]
                    if job_id not in done_ids:
                        result = self._counted.get(job_id)
                        if result is None:
                            break
                        sink.write(output_line(result))
                        done_ids.add(job_id)
                        written += 1
                    cursor += 1
                sink.flush()
                finished = cursor == len(expected)
                stopping = (
                    finished
                    or not wait
                    or (deadline is not None and time.monotonic() >= deadline)
                    or (should_stop is not None and should_stop())
                )
                if stopping:
                    written += self._write_rest(sink, expected, done_ids, unlisted=ids is None)
                    missing = [job_id for job_id in expected if job_id not in done_ids]
                    return CollectReport(written=written, already=len(already), missing=missing)
                self._read_results(block_ms=int(poll_s * 1000))

    def _write_rest(self, sink: BinaryIO, expected: list[str], done_ids: set[str], unlisted: bool) -> int:
        # Out of order from here on: what arrived behind a job that is still missing, and (with
        # unlisted) results for ids that were never in the order list.
        wanted = set(expected)
        rest = [job_id for job_id in expected if job_id not in done_ids and job_id in self._counted]
        if unlisted:
            rest += [job_id for job_id in self._counted if job_id not in wanted and job_id not in done_ids]
        for job_id in rest:
            sink.write(output_line(self._counted[job_id]))
            done_ids.add(job_id)
        sink.flush()
        return len(rest)

    def _extend_order(self, known: list[str]) -> list[str]:
        """``known`` plus the ids enqueued since (the order list only grows)."""
        items: Any = self.redis.lrange(self.keys.order, len(known), -1)
        return known + [item.decode() for item in items]

    def _read_results(self, block_ms: int) -> None:
        """Read the results stream up to its end; keep the results that count."""
        block: int | None = block_ms or None
        while True:
            reply: Any = self.redis.xread(
                {self.keys.results: self._last_entry}, count=_READ_COUNT, block=block
            )
            if not reply:
                return
            entries = reply[0][1]
            self._last_entry = entries[-1][0].decode()
            job_ids = [fields[FIELD_ID.encode()].decode() for _, fields in entries]
            marks = self.redis.hmget(self.keys.done, job_ids)
            for (_, fields), job_id, mark in zip(entries, job_ids, marks, strict=True):
                if (
                    mark is not None
                    and mark == fields.get(FIELD_ENTRY.encode())
                    and job_id not in self._counted
                ):
                    self._counted[job_id] = decode_result(fields[FIELD_RESULT.encode()])
            if len(entries) < _READ_COUNT:
                return
            block = None

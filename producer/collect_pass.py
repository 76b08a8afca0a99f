"""One collect call: the ids in scope, what its output file and its spill hold, what is due.

producer.collector reads Redis and hands each chunk of results here (``counted``); everything
this module does is local (the output file, the spill), so a chunk is taken whole or not at
all. Rows are appended from the spill in the scope's order, up to the first id with no result
yet (``advance``); ``report`` says what the call did and what is still missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from producer.outfile import OutputFile, result_line
from producer.progress import Progress
from producer.spill import Spill, SpillRow, append_rows, replace_rows
from wire.keys import FIELD_ENTRY, FIELD_EPOCH, FIELD_RESULT


@dataclass(frozen=True)
class CollectReport:
    written: int  # lines this call appended
    already: int  # ids found in the output file before this call
    missing: list[str]  # ids in scope with no (current) row and no result in the spill when it stopped
    failed: int = 0  # ids in scope whose row (or spilled result) is an error
    replaced: int = 0  # error rows of requeued jobs replaced in place by their new result
    trimmed: list[str] = field(default_factory=list)  # of missing: collected earlier, then trimmed
    lost: str | None = None  # Redis lost the queue's data while this collect ran (what it saw)
    stopped: str | None = None  # Redis unavailable past the retry timeout, or a fatal error
    duplicates: list[str] = field(default_factory=list)  # ids on several rows of the file as found
    forgotten_elsewhere: int = 0  # ids Redis forgot before this call, more than the file had rows
    held: list[str] = field(default_factory=list)  # ids in scope whose result waits in the spill
    spill: Path | None = None  # where the spill is (it exists while ``held`` is not empty)
    short: str | None = None  # what ``WaitFor`` asked for that had not come when it stopped


@dataclass(frozen=True)
class WaitFor:
    """What a waiting collect waits for besides the ids enqueued so far (each 0: not asked):
    ``jobs`` ids enqueued on the queue in all (``status``'s enqueued, forgotten ones included),
    ``enqueues`` finished ``radixq enqueue`` commands (wire.enqueues), and ``idle_s`` seconds
    with nothing new enqueued once everything enqueued is written."""

    jobs: int = 0
    enqueues: int = 0
    idle_s: float = 0.0

    def short(self, order_len: int, enqueues: int) -> str | None:
        """What has not come yet, as one line (None: everything asked for came)."""
        if order_len < self.jobs:
            return f"{order_len} of the {self.jobs} jobs expected (--expect) were enqueued"
        if enqueues < self.enqueues:
            return f"{enqueues} of the {self.enqueues} enqueues expected (--expect-enqueues) finished"
        return None


@dataclass
class CollectPass:
    """The state of one collect call."""

    output: OutputFile
    spill: Spill
    expected: list[str]  # ids in scope, in output order
    listed: bool  # ids were given: results of other ids are not this call's
    clock: Callable[[], float]
    progress: Progress | None = None
    scope: set[str] = field(default_factory=set)
    cursor: int = 0  # expected[:cursor] have a row (or are trimmed)
    base: int = 0  # order position of expected[0] (ids forgotten before this call: producer.forget)
    already: int = 0  # rows in the output file when the call began
    written: int = 0
    superseded: set[str] = field(default_factory=set)  # rows to replace when the new result comes
    replacing: set[str] = field(default_factory=set)  # of those: the new result is in the spill
    replaced: int = 0
    trimmed: set[str] = field(default_factory=set)
    lost: str | None = None  # what Redis lost, once seen
    order_len: int = 0  # ids ever enqueued on the queue, as of the last round
    enqueues: int = 0  # finished enqueues, as of the last round
    changed_at: float = 0.0  # when the order list last grew or a row was last written
    file_ordered: bool | None = None  # the file's rows in scope come first, in order (None: unchecked)

    def __post_init__(self) -> None:
        self.scope = set(self.expected) if self.listed else set()
        self.already = len(self.output.ids)
        self.changed_at = self.clock()
        self.replaced = self.spill.settle(self.output)
        if self.progress is not None:
            rows = self.output.ids | self.spill.ids
            rows = rows & self.scope if self.listed else rows
            failed = sum(i in self.output.errors or i in self.spill.failed for i in rows)
            self.progress.begin(len(self.expected), len(rows), failed)

    @property
    def caught_up(self) -> bool:
        """Every id in scope so far has its row (or was trimmed), none waits to be replaced."""
        return self.cursor == len(self.expected) and not self.superseded

    def waited(self, until: WaitFor) -> bool:
        """Caught up: whether what ``until`` asks for has come too."""
        if until.short(self.order_len, self.enqueues) is not None:
            return False
        return self.clock() - self.changed_at >= until.idle_s

    def ordered(self) -> bool:
        """Whether the file's rows of ids in scope are its first ids, in order, as a collect
        writes them (rows of other ids, forgotten or never in the order list, may be anywhere):
        only then may the records of the ids written be forgotten (producer.forget: a forgotten
        id's place is its row's place)."""
        if self.file_ordered is None:
            wanted = set(self.expected)
            listed = [job_id for job_id in self.output.order if job_id in wanted]
            self.file_ordered = listed == self.expected[: len(listed)]
        return self.file_ordered

    def counted(
        self, entries: list[Any], job_ids: list[str], marks: list[Any], digests: list[Any], epoch: bytes | None,
        stale: Callable[[bytes], str],
    ) -> list[SpillRow]:  # fmt: skip
        """The spill rows of a chunk's results that count (the ``done`` mark names them) and
        are this call's to write; a result of another epoch than the queue's (``epoch``) sets
        ``lost`` (``stale`` says it) and is never written."""
        rows: dict[str, SpillRow] = {}
        for (_, fields), job_id, mark, raw_digest in zip(entries, job_ids, marks, digests, strict=True):
            if mark is None or mark != fields.get(FIELD_ENTRY.encode()):
                continue  # not the result that counts
            written_for = fields.get(FIELD_EPOCH.encode())
            if written_for is not None and written_for != epoch:
                self.lost = self.lost or stale(written_for)
                continue  # NOTE: written into this Redis for a queue it no longer has
            replaces = job_id in self.superseded
            if not replaces and (job_id in self.output.ids or job_id in self.spill.ids or job_id in rows):
                continue
            if not replaces and self.listed and job_id not in self.scope:
                continue
            raw = fields.get(FIELD_RESULT.encode(), b"")
            digest = raw_digest.decode() if raw_digest is not None else None
            line, code = result_line(job_id, raw, digest)
            rows[job_id] = SpillRow(job_id, line, code, digest, replaces)
            if replaces:
                self.replacing.add(job_id)
            elif self.progress is not None:
                self.progress.result(raw)
        return list(rows.values())

    def replace(self) -> None:
        """Put the new rows of superseded ids, now in the spill, in place of their old rows."""
        if self.replacing:
            rows = list(self.spill.rows(sorted(self.replacing)).values())
            self.replaced += replace_rows(self.output, self.spill, rows)
            self.superseded -= self.replacing
            self.replacing.clear()

    def advance(self) -> None:
        """Write the due rows from the spill: in order, up to the first id with no result yet."""
        due: list[str] = []
        while self.cursor < len(self.expected):
            job_id = self.expected[self.cursor]
            if job_id not in self.output.ids and job_id not in self.trimmed:
                if job_id not in self.spill.ids:
                    break
                due.append(job_id)
            self.cursor += 1
        if due:
            self.written += append_rows(self.output, self.spill, due)
            self.changed_at = self.clock()

    def finish(self, out_of_order: bool) -> None:
        """The end of the call: the rows due written; with ``out_of_order`` what waits in the
        spill behind a missing id too (in scope order, then every other spilled row), else,
        once every id is written (ids None), the results of ids never in the order list; a file
        complete at last is put in order (rows appended out of order by `run` or an older
        collect; forgotten ids first)."""
        self.replace()
        self.advance()
        if out_of_order:
            rest = [i for i in self.expected[self.cursor :] if i in self.spill.ids]
        elif not self.listed and self.caught_up:
            rest = []
        else:
            rest = None
        if rest is not None:
            others = sorted(self.spill.ids - set(rest) - set(self.expected))
            if rest or others:
                self.written += append_rows(self.output, self.spill, rest + others)
        if not self.listed and self.lost is None and not self.missing() and not self.held():
            self.output.reorder(self.expected, others_first=self.base > 0)
            self.file_ordered = True

    def missing(self) -> list[str]:
        return [i for i in self.expected if i not in self.output.ids and i not in self.spill.ids] + sorted(
            self.superseded
        )

    def held(self) -> list[str]:
        return [i for i in self.expected if i in self.spill.ids]

    def report(self, stopped: str | None, until: WaitFor) -> CollectReport:
        in_scope = self.output.ids | self.spill.ids if not self.listed else self.scope
        held = self.held()
        return CollectReport(
            written=self.written,
            already=self.already,
            missing=self.missing(),
            failed=sum(i in self.output.errors or i in self.spill.failed for i in in_scope),
            replaced=self.replaced,
            trimmed=[i for i in self.expected if i in self.trimmed and i not in self.output.ids],
            lost=self.lost,
            stopped=stopped,
            duplicates=self.output.duplicates,
            forgotten_elsewhere=max(0, self.base - self.already) if not self.listed else 0,
            held=held,
            spill=self.spill.path if held else None,
            short=until.short(self.order_len, self.enqueues) if self.lost is None else None,
        )

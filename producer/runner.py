"""``radixq run``: one file in, one file out - enqueue, start workers, collect, shut down.

Workers are ``radixq worker`` subprocesses (``python -m radixq worker``) in sessions of
their own (wire.lifetime), so a Ctrl-C in the terminal reaches ``run`` alone and ``run``
decides how they stop. With no Redis URL a private Redis is started for the run (LocalRedis:
loopback only, a random password) and removed afterwards. Workers get the URL through their
environment (RADIXQ_REDIS_URL), never on their command line, where ``ps`` would show it.

Stopping early (SIGINT, SIGTERM or ``timeout_s``): ``run`` sends the workers SIGTERM (they stop
reading, finish what they hold within the drain timeout and put the rest back) and keeps
collecting while they drain, so every result they write reaches the output; the private Redis
and its folder go last. A second signal hurries the workers (a second SIGTERM: they write what
is done and put the rest back); a worker still there after that is killed. The whole shutdown
takes at most the drain timeout plus a few seconds (worker_pool.GRACE_S per harder step, and
for stopping Redis). A signal during enqueue takes effect when enqueue is done.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import redis

from producer.client import Client, ContentChanged, EnqueueStopped
from producer.collector import Collector
from producer.datasets import NATIVE_COLUMNS, ColumnMapping, input_columns, read_input
from producer.digest import changed_ids, changed_line
from producer.input_rows import InputFile, Rejected
from producer.local_redis import LocalRedis
from producer.outfile import OutputFileError, os_error_line, row_keys
from producer.outlock import OutputBusy, output_lock
from producer.output_lines import written_ids
from producer.progress import Progress
from producer.rewrite import put_in_order, split_errors
from producer.signals import Signals, signals_counted
from producer.spill import flush_spill
from producer.tables import is_parquet, rows_path, write_parquet
from producer.worker_pool import GRACE_S, Readiness, WorkerPool, relay_output
from wire import exits
from wire.keys import DEFAULT_QUEUE, REDIS_URL_ENVS
from wire.lifetime import start_child
from wire.redis_errors import FatalRedisError, describe, redact
from wire.routing import DEFAULT_PARTITIONS
from wire.schema import Job, Result

POLL_S = 0.2  # how soon collecting notices a signal or an exited worker


@dataclass(frozen=True)
class RunOptions:
    input_path: Path
    output_path: Path
    # How to start one `radixq worker` (the composition root, radixq.cli, says): the queue,
    # name and worker_args are appended
    worker_command: list[str]
    queue: str = DEFAULT_QUEUE
    redis_url: str | None = None  # None: a private Redis for this run
    num_workers: int = 1
    worker_args: list[str] = field(default_factory=list)  # passed to each `radixq worker`
    timeout_s: float | None = None
    drain_timeout_s: float = 30.0
    quiet: bool = False  # no progress display
    progress_interval_s: float = 10.0  # plain progress lines when stderr is not a terminal
    metrics_port: int = 0  # >0: worker i serves /metrics on metrics_port + i
    partitions: int = DEFAULT_PARTITIONS  # partition streams of a new queue (0: no routing; wire.routing)
    mapping: ColumnMapping = NATIVE_COLUMNS
    errors_path: Path | None = None  # rejected rows go here instead of into the output
    join_input: bool = False  # Parquet output: joined to the input's columns
    rerun_changed: bool = False  # rows whose content changed since their row was written run again
    served_models: tuple[str, ...] = ()  # the model names the workers answer to (empty: any)


@dataclass(frozen=True)
class RunReport:
    parsed: InputFile
    expected: list[str]  # ids with a row due in the output file, in input order
    enqueued: int
    skipped: int
    resumed: int  # ids already in the output file, not run again
    written: int  # lines this run appended to the output file (with errors_path: before the split)
    in_output: int  # jobs of the input with a line in the output file (or the errors file) now
    failed: list[str]  # jobs of the input whose line in the output file is an error
    stopped: str | None = None  # why it stopped before every job had a result
    worker_codes: list[int | None] = field(default_factory=list)
    moved: int = 0  # of ``written``: error rows moved to the errors file (errors_path)

    @property
    def missing(self) -> int:
        return len(self.expected) - self.in_output

    def exit_code(self) -> int:
        """0: every line ran without error (an empty input: nothing to do, as for enqueue);
        2: nothing could run (every worker exited with a usage error); 1: anything else."""
        if self.missing and self.worker_codes and all(code == exits.USAGE for code in self.worker_codes):
            return exits.USAGE
        if self.missing or self.failed or self.parsed.rejected:
            return exits.JOBS_FAILED
        return exits.OK


class RunError(Exception):
    """Nothing (more) could be done: a usage, configuration or connection error. ``str()`` is
    the one line to show."""


def worker_command(base: list[str], queue: str, name: str, extra: list[str]) -> list[str]:
    """One ``radixq worker`` command line (``base``: how to start the command); its Redis URL
    goes in its environment (worker_env)."""
    return [*base, "--queue", queue, "--name", name, *extra]


def worker_env(redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in REDIS_URL_ENVS}
    env.pop("RADIXQ_METRICS_PORT", None)  # run gives each worker its own (RunOptions.metrics_port)
    env[REDIS_URL_ENVS[0]] = redis_url
    return env


def run_file(options: RunOptions, say: Callable[[str], None] = print) -> RunReport:
    """Run every row of the input file not yet in the output file; append the results (a
    rejected row's invalid_job row too, unless ``errors_path`` takes it) in input order.

    SIGINT and SIGTERM (from the main thread) stop the run as the module docstring says; it
    returns normally then, with ``stopped`` set. Raises RunError when nothing (more) can be
    done; the workers, the private Redis and its folder are gone by then.
    """
    out = options.output_path
    if out.is_dir() or not out.parent.is_dir():
        raise RunError(f"cannot write {out}: {'it is a folder' if out.is_dir() else 'no such folder'}")
    if options.join_input and not is_parquet(out):
        raise RunError("--join-input needs a Parquet output (-o OUT.parquet)")
    try:
        with output_lock(rows_path(out)):  # NOTE: held for the whole run; its collects take it again
            return _run_locked(options, say)
    except OutputBusy as exc:
        raise RunError(str(exc)) from None
    except OSError as exc:  # an unreadable input, a full disk
        raise RunError(os_error_line(exc)) from None


def _run_locked(options: RunOptions, say: Callable[[str], None]) -> RunReport:
    out = options.output_path
    try:
        parsed = read_input(options.input_path, options.mapping)
    except ValueError as exc:  # pyarrow: not a Parquet/CSV file, or a damaged one
        raise RunError(f"cannot read {options.input_path}: {exc}") from None
    for rejected in parsed.rejected:
        say(f"rejected {options.input_path}:{rejected}")
    for note in parsed.notes() + model_notes(parsed.jobs, options.served_models):
        say(f"note {options.input_path}: {note}")
    rows: list[Job | Result] = [
        row.error_result() if isinstance(row, Rejected) else row
        for row in parsed.rows
        if options.errors_path is None or isinstance(row, Job)
    ]
    expected = [row.id for row in rows]
    input_order = [row.id if isinstance(row, Job) else row.job_id for row in parsed.rows]
    rows_file = rows_path(out)
    flush_spill(rows_file)  # NOTE: what a run killed mid-way had read is in OUT before the resume counts it
    already = written_ids(rows_file)
    if options.errors_path is not None:
        split_errors(rows_file, options.errors_path, parsed.rejected, input_order)
        already |= written_ids(options.errors_path)  # run-time error rows moved there earlier
    written = row_keys(rows_file) + (row_keys(options.errors_path) if options.errors_path else [])
    changed = changed_ids(rows, {key.job_id: key.digest for key in written if key.digest is not None})
    if changed and not options.rerun_changed:
        raise RunError(
            f"{changed_line(changed, f'their rows were written to {rows_file}')}: --rerun-changed runs "
            "them again and replaces their rows, or remove those rows"
        )
    jobs = [row for row in rows if row.id not in already or row.id in changed]
    if already:
        say(f"resuming: {len(rows) - len(jobs)} jobs already in {rows_file}")
    outcome = _Outcome()
    if jobs:
        with signals_counted() as signals:
            try:
                _run_jobs(options, rows_file, jobs, len(parsed.rejected), signals, outcome, say)
            except FatalRedisError as exc:
                raise RunError(str(exc)) from None
            except redis.RedisError as exc:
                raise RunError(describe(exc, outcome.redis_url or "the private redis")) from None
    errors = _output_errors(rows_file)
    if all(job_id in errors for job_id in expected):
        put_in_order(rows_file, expected)
    moved = 0
    if options.errors_path is not None:
        moved = split_errors(rows_file, options.errors_path, parsed.rejected, input_order)
        errors = {**_output_errors(options.errors_path), **_output_errors(rows_file)}
    if is_parquet(out):
        try:
            write_parquet(
                rows_file, out, input_columns(options.input_path, parsed) if options.join_input else None
            )
        except OutputFileError as exc:
            raise RunError(str(exc)) from None
    in_output = [job_id for job_id in expected if job_id in errors]
    rejected_ids = {row.job_id for row in parsed.rejected}
    return RunReport(
        parsed=parsed,
        expected=expected,
        enqueued=outcome.enqueued,
        skipped=outcome.skipped,
        resumed=len(rows) - len(jobs),
        written=outcome.written,
        moved=moved,
        in_output=len(in_output),
        failed=[job_id for job_id in in_output if errors[job_id] and job_id not in rejected_ids],
        stopped=outcome.stopped,
        worker_codes=outcome.worker_codes,
    )


def model_notes(jobs: list[Job], served: tuple[str, ...]) -> list[str]:
    """One note per model name the jobs ask for that the workers will not answer to as asked:
    run by their own model (no served names), or refused (model_not_served)."""
    asked: dict[str, int] = {}
    for job in jobs:
        if job.model is not None and job.model not in served:
            asked[job.model] = asked.get(job.model, 0) + 1
    lines = "line{}".format
    if served:
        names = ", ".join(served)
        return [
            f"model {name!r} on {count} {lines('s' * (count != 1))}: not served (--served-model-name {names}): "
            "those rows get model_not_served errors"
            for name, count in asked.items()
        ]
    return [
        f"model {name!r} on {count} {lines('s' * (count != 1))}: run by the workers' model, which the "
        "reply names (--served-model-name makes workers answer to given names only)"
        for name, count in asked.items()
    ]


@dataclass
class _Outcome:
    redis_url: str | None = None
    enqueued: int = 0
    skipped: int = 0
    written: int = 0
    stopped: str | None = None
    worker_codes: list[int | None] = field(default_factory=list)


def _run_jobs(
    options: RunOptions,
    out: Path,
    jobs: list[Job | Result],
    num_rejected: int,
    signals: Signals,
    outcome: _Outcome,
    say: Callable[[str], None],
) -> None:
    with ExitStack() as stack:  # NOTE: unwinds in reverse: workers, client, then Redis and its folder
        redis_url = options.redis_url
        if redis_url is None:
            local = LocalRedis(appendonly=False, with_password=True)
            stack.callback(local.stop, timeout_s=GRACE_S)  # removes its folder too
            try:
                local.start()
            except RuntimeError as exc:
                raise RunError(f"could not start a private Redis for the run: {exc}") from None
            redis_url = local.url
            say(f"started a private {local.kind} at {redact(redis_url)}")
        outcome.redis_url = redis_url
        client = Client.from_url(redis_url, options.queue, partitions=options.partitions)
        stack.callback(client.close)
        try:
            report = client.enqueue(jobs, rerun_changed=options.rerun_changed, refuse_changed=True)
        except ContentChanged as exc:  # a shared Redis holds them with other content
            raise RunError(f"{exc} on queue {options.queue!r}: --rerun-changed runs them again") from None
        except EnqueueStopped as stop:
            why = describe(stop.cause, redis_url)
            went_in = len(stop.report.enqueued)
            raise RunError(
                f"enqueued {went_in} of {len(jobs)} jobs, then stopped: {why}" if went_in else why
            ) from None
        finished = {row.id for row in jobs if isinstance(row, Result)}  # rejected rows
        outcome.enqueued = sum(i not in finished for i in report.enqueued)
        outcome.skipped = sum(i not in finished for i in report.skipped)
        say(
            f"enqueued {outcome.enqueued}, skipped {outcome.skipped} (already enqueued), "
            f"rejected {num_rejected}"
            + (f", run again {len(report.rerun)} (changed)" if report.rerun else "")
        )
        if report.changed:
            say(f"{changed_line(report.changed, 'they were enqueued')}: kept (not done yet)")
        if signals.count:
            outcome.stopped = "interrupted"
            return
        runnable = any(isinstance(row, Job) for row in jobs)  # else: only rejected rows to write
        # NOTE: the display first: the workers' log lines go through it, above its live line
        progress = stack.enter_context(Progress(quiet=options.quiet, interval_s=options.progress_interval_s))
        procs = _start_workers(options, redis_url, private=options.redis_url is None) if runnable else []
        relays = [relay_output(proc, f"[worker {i}] ", progress.log) for i, proc in enumerate(procs)]
        for relay in relays:  # NOTE: unwound after the workers stop: their last lines shown
            stack.callback(relay.join, GRACE_S)
        pool = WorkerPool(procs, options.drain_timeout_s)
        stack.callback(lambda: outcome.worker_codes.extend(pool.stop(lambda: 1 + signals.count)))
        say = progress.log
        ready = Readiness(client.redis, options.queue, [name for _, name in _worker_names(options)], progress)
        ids = [job.id for job in jobs]
        collector = Collector(client.redis, options.queue)
        trim = options.redis_url is None  # NOTE: the run's own Redis: no other reader of its results
        first = collector.collect(
            out,
            ids=ids,
            wait=True,
            timeout_s=options.timeout_s,
            poll_s=POLL_S,
            should_stop=lambda: ready.check() or signals.count > 0 or pool.exited(),
            progress=progress,
            trim=trim,
            flush_rest=True,
        )
        outcome.written = first.written
        if not first.missing:
            return
        if pool.exited():
            outcome.stopped = f"all workers exited (codes {pool.codes()})"
        else:
            by_signal = signals.count > 0
            outcome.stopped = "interrupted" if by_signal else f"timed out after {options.timeout_s:g}s"
            say(
                f"{outcome.stopped}: stopping the workers (they finish what they hold within "
                f"{options.drain_timeout_s:g}s and put the rest back; Ctrl-C again to hurry them)"
            )
            outcome.written += collector.collect(
                out,
                ids=ids,
                wait=True,
                poll_s=POLL_S,
                should_stop=lambda: pool.advance(1 + signals.count - by_signal),
                progress=progress,
                trim=trim,
                flush_rest=True,
            ).written
        outcome.written += collector.collect(
            out, ids=ids, wait=False, progress=progress, trim=trim, flush_rest=True
        ).written


def _worker_names(options: RunOptions) -> list[tuple[int, str]]:
    return [(i, f"run-{os.getpid()}-{i}") for i in range(options.num_workers)]


def _start_workers(options: RunOptions, redis_url: str, private: bool) -> list[subprocess.Popen[bytes]]:
    # NOTE: if run dies without stopping them (kill -9), a private Redis dies with it, so its
    # workers have nothing left to drain into: they are killed. Workers of a shared Redis get
    # SIGTERM and drain, putting back what they hold. Their output comes through run (a pipe
    # each: relay_output), so on a terminal it never lands inside the progress line.
    return [
        start_child(
            worker_command(
                options.worker_command,
                options.queue,
                name,
                [
                    *options.worker_args,
                    "--drain-timeout-s",
                    f"{options.drain_timeout_s:g}",
                    *(["--metrics-port", str(options.metrics_port + i)] if options.metrics_port else []),
                ],
            ),
            death_signal=signal.SIGKILL if private else signal.SIGTERM,
            env=worker_env(redis_url),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for i, name in _worker_names(options)
    ]


def _output_errors(path: Path) -> dict[str, bool]:
    """Each id in an output file (``custom_id`` for OpenAI lines): whether its line is an error."""
    rows: dict[str, bool] = {}
    if not path.exists():
        return rows
    with open(path, "rb") as lines:
        for line in lines:
            if line.strip():
                record = msgspec.json.decode(line)
                rows[record.get("custom_id") or record["id"]] = record.get("error") is not None
    return rows

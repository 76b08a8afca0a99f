"""The radixq command line (typer): the client commands (enqueue, collect, status, dlq) and
what every command shares (the app, the queue and Redis options, one-line errors).

The console script is radixq.cli:main (the composition root), which adds the worker-side commands (worker, run) to
this app: producer never imports worker (the layering tests check it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup, TyperOption

from wire import exits
from wire.exits import fail
from wire.keys import DEFAULT_QUEUE, DEFAULT_REDIS_URL, QUEUE_ENV, REDIS_URL_ENVS
from wire.routing import DEFAULT_PARTITIONS, MAX_PARTITIONS, NO_ROUTING

if TYPE_CHECKING:
    from producer.client import Client
    from producer.datasets import ColumnMapping
    from producer.jsonl import InputFile
    from wire.schema import Job, Result
    from wire.status import ConsumerStatus, Heartbeat


class FlagsUntagged(TyperGroup):
    """A command group whose help shows no type tag beside a flag that takes no value (typer
    shows ``--help <bool>`` otherwise), in its own options and its commands'."""

    def get_params(self, ctx: Any) -> list[Any]:
        return [_untagged(param) for param in super().get_params(ctx)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        for param in command.get_params(ctx) if command is not None else []:  # its help option too
            _untagged(param)
        return command


def _untagged(param: Any) -> Any:
    if isinstance(param, TyperOption) and param.is_flag:
        param.metavar = ""  # NOTE: typer's help shows a metavar when there is one, else the type
    return param


app = typer.Typer(
    cls=FlagsUntagged,
    name="radixq",
    help="Batch LLM generation on a Redis Streams queue.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
dlq_app = typer.Typer(
    cls=FlagsUntagged, help="Dead letters: jobs delivered more than max_attempts times.", no_args_is_help=True
)
app.add_typer(dlq_app, name="dlq")

QueueOption = Annotated[str, typer.Option("--queue", "-q", envvar=QUEUE_ENV, help="Queue name.")]
RedisUrlOption = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar=list(REDIS_URL_ENVS),
        help=f"Redis URL (env {' or '.join(REDIS_URL_ENVS)}; default {DEFAULT_REDIS_URL}).",
    ),
]
PartitionsOption = Annotated[
    int,
    typer.Option(
        "--partitions",
        min=NO_ROUTING,
        max=MAX_PARTITIONS,
        help=f"Partition streams of a new queue (default {DEFAULT_PARTITIONS}): jobs sharing a prefix go to "
        "one worker, which owns their partition (docs/guide.md, Routing); 0: no routing, one stream.",
    ),
]
NoRoutingOption = Annotated[
    bool, typer.Option("--no-routing", help="A new queue of one stream, not routed (--partitions 0).")
]

RetryTimeoutOption = Annotated[
    float,
    typer.Option(
        "--retry-timeout-s",
        envvar="RADIXQ_RETRY_TIMEOUT_S",
        help="Wait this long for an unavailable Redis (connection lost, LOADING, OOM, READONLY) "
        "before giving up.",
    ),
]

QuietOption = Annotated[bool, typer.Option("--quiet", help="No progress display.")]
ProgressIntervalOption = Annotated[
    float,
    typer.Option(
        "--progress-interval",
        min=0.1,
        help="When stderr is not a terminal: seconds between plain progress lines "
        "(on a terminal the display is live).",
    ),
]


PromptColumnOption = Annotated[
    str | None, typer.Option("--prompt-column", help="Column holding the prompt text (dataset files).")
]
MessagesColumnOption = Annotated[
    str | None,
    typer.Option("--messages-column", help="Column holding the chat messages (a list, or its JSON text)."),
]
IdColumnOption = Annotated[
    str | None,
    typer.Option("--id-column", help="Column holding the job id (default: id, else derived from the row)."),
]
TemplateOption = Annotated[
    str | None,
    typer.Option(
        "--template",
        help='Prompt template filled from the row\'s columns, e.g. "Q: {question}\\nA:" '
        "(\\n: a newline, \\t: a tab, \\\\: a backslash).",
    ),
]
InputArgument = Annotated[
    str,
    typer.Argument(
        help="Input file: JSONL (.gz), Parquet or CSV; a path or a URL (https://, s3://, gs://).",
        metavar="FILE",
    ),
]
ErrorsOption = Annotated[
    str | None,
    typer.Option(
        "--errors",
        help="Write the rows rejected at enqueue to this JSONL file (OpenAI Batch error-file style) "
        "instead of as invalid_job error rows in the output.",
    ),
]


RerunChangedOption = Annotated[
    bool,
    typer.Option(
        "--rerun-changed",
        help="Run again the rows whose id has a result for other content (a changed prompt, sampling, "
        "model or metadata); their rows are replaced. Without it such rows stop the command first.",
    ),
]


def column_mapping(
    prompt_column: str | None, messages_column: str | None, id_column: str | None, template: str | None
) -> ColumnMapping:
    from producer.datasets import ColumnMapping, unescape_template

    if template is not None:
        template = unescape_template(template)
    mapping = ColumnMapping(prompt_column, messages_column, id_column, template)
    try:
        mapping.check()
    except ValueError as exc:
        fail(str(exc), exits.USAGE)
    return mapping


@contextmanager
def staged(
    source: str | None, output: str | None = None, errors: str | None = None
) -> Iterator[tuple[Path | None, Path | None, Path | None]]:
    """Local paths for an input file, an output file and an errors file, each a path or a
    URL (producer.remote: a URL is downloaded first, an output uploaded when the block ends);
    a local input must be a file. One ``error:`` line and exit 2 for what cannot be."""
    from producer.remote import RemoteError, is_url, local_input, local_output
    from producer.tables import is_parquet

    if source is not None and not is_url(source):
        path = Path(source)
        if not path.exists() or path.is_dir():
            fail(
                f"{source}: {'is a folder, not an input file' if path.is_dir() else 'no such file'}",
                exits.USAGE,
            )
    # NOTE: the spill (producer.spill) resumes a collect as much as the rows do
    companions = (
        (".rows.jsonl", ".rows.jsonl.spill") if output is not None and is_parquet(output) else (".spill",)
    )
    try:
        with (
            local_input(source) as local,
            local_output(output, companions) as out,
            local_output(errors) as err,
        ):
            yield local, out, err
    except RemoteError as exc:
        fail(str(exc), exits.USAGE)


def load_input(path: Path, mapping: ColumnMapping) -> InputFile:
    """Every row of a dataset file, or one ``error:`` line and exit 2 when it cannot be read."""
    from producer.datasets import read_input

    try:
        return read_input(path, mapping)
    except OSError as exc:
        fail(f"{path}: {exc.strerror or exc}", exits.USAGE)
    except ValueError as exc:  # pyarrow: not a Parquet/CSV file, or a damaged one
        fail(f"cannot read {path}: {exc}", exits.USAGE)


def queued_rows(
    path: Path,
    mapping: ColumnMapping,
    parsed: InputFile,
    errors: Path | None,
    *,
    say: bool = True,
    shown: str | None = None,
) -> Iterator[Job | Result]:
    """What enqueue puts in the queue, in input order, as the file is read: the jobs, and the
    rejected rows (each said on stderr, unless ``say`` is false, as ``shown`` or the path) as
    ``invalid_job`` results unless they go to the ``errors`` file. The file is opened, and its
    first row read, before this returns: a file that cannot be read fails here (one ``error:``
    line), before Redis is touched."""
    import itertools

    from producer.datasets import iter_input
    from producer.jsonl import Rejected

    def rows() -> Iterator[Job | Result]:
        try:
            for row in iter_input(path, mapping, parsed):
                if isinstance(row, Rejected):
                    if say:
                        warn(f"rejected {shown or path}:{row}")
                    if errors is None:
                        yield row.error_result()
                    continue
                yield row
        except OSError as exc:
            fail(f"{path}: {exc.strerror or exc}", exits.USAGE)
        except ValueError as exc:  # pyarrow: not a Parquet/CSV file, or a damaged one
            fail(f"cannot read {path}: {exc}", exits.USAGE)

    stream = rows()
    first = list(itertools.islice(stream, 1))
    return itertools.chain(first, stream)


def write_table(rows_file: Path, output: Path, join_input: Path | None, mapping: ColumnMapping) -> None:
    """Write the Parquet output from its JSONL rows, joined to ``join_input``'s rows if given."""
    from producer.datasets import input_columns
    from producer.tables import write_parquet

    inputs = input_columns(join_input, load_input(join_input, mapping)) if join_input is not None else None
    write_parquet(rows_file, output, inputs)


def resolve_redis_url(url: str | None) -> str:
    return url or DEFAULT_REDIS_URL


def counted(count: int, noun: str = "job") -> str:
    """``count`` and the noun in the number it takes: "1 job", "2 jobs", "1 row", "3 rows"."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def warn(line: str) -> None:
    typer.echo(line, err=True)


@contextmanager
def expected_errors(url: str) -> Iterator[None]:
    """Expected failures as one line on stderr and exit code 2, never a traceback."""
    import redis

    from producer.client import UnknownQueueError
    from producer.outfile import OutputFileError, os_error_line
    from producer.outlock import OutputBusy
    from wire.redis_errors import describe
    from wire.retry import RedisUnavailable
    from wire.routing import RoutingCorrupt

    try:
        yield
    except (UnknownQueueError, OutputFileError, OutputBusy, RoutingCorrupt) as exc:
        fail(str(exc), exits.USAGE)
    except RedisUnavailable as exc:
        fail(
            describe(exc.cause, url) + (f" (unavailable for {exc.waited_s:.0f} s)" if exc.waited_s else ""),
            exits.USAGE,
        )
    except redis.RedisError as exc:
        fail(describe(exc, url), exits.USAGE)
    except OSError as exc:
        fail(os_error_line(exc), exits.USAGE)


def open_client(url: str, queue: str, **options: Any) -> Client:
    from producer.client import Client

    try:
        return Client.from_url(url, queue, **options)
    except ValueError as exc:  # a malformed URL
        from wire.redis_errors import redact

        fail(f"--redis-url {redact(url)!r}: {exc}", exits.USAGE)


def holds_no_known_id(client: Client, source: Path, mapping: ColumnMapping) -> bool:
    """True when a JSONL file (native columns) names no id the queue holds a digest for: then
    no row can have changed (producer.idscan), and the full check's pass over the file is not
    needed. False when it names one, or when this cannot tell."""
    from producer.datasets import file_format
    from producer.idscan import Unreadable, named_ids

    if mapping.given or file_format(source) != "jsonl":
        return False
    try:
        return not client.knows_any(named_ids(source))
    except (Unreadable, OSError):
        return False


@app.command()
def enqueue(
    input_path: InputArgument,
    queue: QueueOption = DEFAULT_QUEUE,
    redis_url: RedisUrlOption = None,
    retry_timeout_s: RetryTimeoutOption = 60.0,
    partitions: PartitionsOption = DEFAULT_PARTITIONS,
    no_routing: NoRoutingOption = False,
    prefix_chars: Annotated[
        int,
        typer.Option(
            "--prefix-chars", min=1, help="Characters of a prompt that make its prefix key (new queue)."
        ),
    ] = 256,
    prompt_column: PromptColumnOption = None,
    messages_column: MessagesColumnOption = None,
    id_column: IdColumnOption = None,
    template: TemplateOption = None,
    errors: ErrorsOption = None,
    rerun_changed: RerunChangedOption = False,
    tag: Annotated[
        str | None,
        typer.Option("--tag", help="Tag the jobs (a batch id, say): `radixq cancel --tag` cancels them."),
    ] = None,
) -> None:
    """Validate every row of FILE, then enqueue them (idempotent by job id). A rejected row
    is enqueued as its invalid_job error result (collect writes it in its place), or written
    to the --errors file. An id enqueued before with other content stops the enqueue before
    anything is written, unless --rerun-changed.

    Exit 0: all rows enqueued (or already there); 1: some rows rejected (the valid ones are
    enqueued); 2: unreadable file, Redis unavailable or refusing (prints how many went in;
    run it again)."""
    url = resolve_redis_url(redis_url)
    mapping = column_mapping(prompt_column, messages_column, id_column, template)
    if tag is not None:
        checked_tag(tag)
    with staged(input_path, errors=errors) as (source, _, errors_file), expected_errors(url):
        assert source is not None
        enqueue_file(
            source, input_path, mapping, errors_file, url, queue, retry_timeout_s,
            NO_ROUTING if no_routing else partitions, prefix_chars,
            rerun_changed, tag,
        )  # fmt: skip


def enqueue_file(
    source: Path,
    shown: str,
    mapping: ColumnMapping,
    errors_file: Path | None,
    url: str,
    queue: str,
    retry_timeout_s: float,
    partitions: int | None,
    prefix_chars: int,
    rerun_changed: bool,
    tag: str | None = None,
) -> None:
    """The enqueue command on a local file (``shown``: the name the user gave, a path or URL).

    The file is read as it goes, one batch in memory. Without --rerun-changed a regular file is
    read twice: first for the ids whose content changed since they were enqueued (the command
    stops before anything is written when there are any), then for the enqueue; an input read
    once only (a pipe) stops before the batch that holds such an id."""
    from producer.client import ContentChanged, EnqueueStopped
    from producer.digest import changed_line
    from producer.insert import QueueLost
    from producer.jsonl import InputFile
    from producer.outfile import write_rejected
    from wire.enqueues import finish_enqueue
    from wire.redis_errors import classify, describe

    client = open_client(
        url,
        queue,
        retry_timeout_s=retry_timeout_s,
        say=warn,
        partitions=partitions,
        prefix_chars=prefix_chars,
    )
    parsed, scanned = InputFile(keep_rows=False), InputFile(keep_rows=False)  # the enqueue's, the check's
    try:
        with expected_errors(url):
            once = not source.is_file()
            if not rerun_changed and not once and not holds_no_known_id(client, source, mapping):
                first_pass = queued_rows(source, mapping, scanned, errors_file, say=False)
                changed = client.find_changed(first_pass)
                if changed:
                    raise ContentChanged(changed)
            rows = queued_rows(source, mapping, parsed, errors_file, shown=shown)
            report = client.enqueue(
                rows,
                rerun_changed=rerun_changed,
                stop_on_changed=once and not rerun_changed,
                keep_ids=False,
                tag=tag,
            )
            client.backoff.call(
                lambda: finish_enqueue(client.redis, client.keys)
            )  # collect --expect-enqueues
    except ContentChanged as exc:
        before = exc.report.jobs_enqueued if exc.report is not None else 0
        what = (
            f"the {before} jobs read before them were enqueued, none after"
            if before
            else "nothing was enqueued"
        )
        fail(
            f"{exc}; {what}: --rerun-changed runs them again (collect replaces their rows), or give them new ids",
            exits.USAGE,
        )
    except EnqueueStopped as stop:
        done = stop.report
        maybe = f" (and up to {stop.uncertain} more whose reply was lost)" if stop.uncertain else ""
        then = (
            "run the same command again"
            if classify(stop.cause) == "transient" or isinstance(stop.cause, QueueLost)
            else "fix that, then run it again"
        )
        fail(
            f"enqueued {done.jobs_enqueued} ({done.jobs_skipped} already enqueued) of "
            f"{parsed.num_jobs or scanned.num_jobs} "
            f"valid jobs read{maybe}, then stopped: {describe(stop.cause, url)}; {then} to continue "
            "(ids already enqueued are skipped)",
            exits.USAGE,
        )
    finally:
        client.close()
    if errors_file is not None:
        with expected_errors(url):
            write_rejected(errors_file, parsed.rejected)
    for note in parsed.notes():
        warn(f"note {shown}: {note}")
    where = f"to {errors_file}" if errors_file is not None else "as invalid_job error rows"
    typer.echo(
        f"enqueued {report.jobs_enqueued}, skipped {report.jobs_skipped} (already enqueued), "
        f"rejected {len(parsed.rejected)}"
        + (f" (written {where})" if parsed.rejected else "")
        + (f", run again {len(report.rerun)} (changed)" if report.rerun else "")
    )
    if report.changed:  # still queued or running with their first content, or enqueued meanwhile
        warn(
            f"{changed_line(report.changed, 'they were enqueued')}; kept as enqueued (not done yet): "
            "run this again with --rerun-changed once they are done"
        )
    if parsed.rejected or report.changed:
        raise typer.Exit(exits.JOBS_FAILED)


@app.command()
def collect(
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            help="Output file: JSONL (appended to, resumable) or .parquet (rows kept in OUT.rows.jsonl); "
            "a path or a URL (s3://, gs://, https:// with PUT).",
        ),
    ],
    queue: QueueOption = DEFAULT_QUEUE,
    redis_url: RedisUrlOption = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait until every enqueued job has a result.")
    ] = True,
    timeout_s: Annotated[
        float | None, typer.Option("--timeout", help="Stop waiting after this many seconds.")
    ] = None,
    trim: Annotated[
        bool,
        typer.Option(
            "--trim/--keep-results",
            help="Trim results from Redis once written and fsynced (one collector per queue).",
        ),
    ] = True,
    retry_timeout_s: RetryTimeoutOption = 60.0,
    quiet: QuietOption = False,
    progress_interval_s: ProgressIntervalOption = 10.0,
    join_input: Annotated[
        str | None,
        typer.Option(
            "--join-input",
            help="Parquet output only: one row per row of this input file (as enqueued, with the same "
            "column options), its columns joined to the result columns.",
        ),
    ] = None,
    prompt_column: PromptColumnOption = None,
    messages_column: MessagesColumnOption = None,
    id_column: IdColumnOption = None,
    template: TemplateOption = None,
    expect: Annotated[
        int,
        typer.Option(
            "--expect",
            min=0,
            help="With --wait: also wait until the queue has N jobs enqueued in all (producers still running).",
        ),
    ] = 0,
    expect_enqueues: Annotated[
        int,
        typer.Option(
            "--expect-enqueues",
            min=0,
            help="With --wait: also wait until K `radixq enqueue` commands on the queue have finished.",
        ),
    ] = 0,
    idle_timeout_s: Annotated[
        float,
        typer.Option(
            "--idle-timeout",
            min=0,
            help="With --wait: once every job enqueued is written, wait this many seconds for more to be "
            "enqueued before stopping.",
        ),
    ] = 0.0,
) -> None:
    """Write each job's result exactly once, in enqueue order, error rows included. With
    --wait, progress goes to stderr (docs/guide.md, Progress). Ctrl-C or
    SIGTERM: what was read is kept (written in order, the rest in OUT.spill for the next collect).

    Exit 0: every job has a row and none is an error; 1: some jobs failed, have no result,
    or Redis lost the queue; 2: unknown queue, Redis unavailable or refusing; 130/143: stopped
    by SIGINT/SIGTERM."""
    from producer.collector import Collector, WaitFor
    from producer.progress import Progress
    from producer.signals import signals_counted
    from producer.tables import is_parquet, rows_path

    url = resolve_redis_url(redis_url)
    mapping = column_mapping(prompt_column, messages_column, id_column, template)
    if join_input is not None and not is_parquet(output):
        fail("--join-input needs a Parquet output (-o OUT.parquet)", exits.USAGE)
    if not wait and (expect or expect_enqueues or idle_timeout_s):
        fail("--expect, --expect-enqueues and --idle-timeout wait: they need --wait", exits.USAGE)
    until = WaitFor(jobs=expect, enqueues=expect_enqueues, idle_s=idle_timeout_s)
    client = open_client(url, queue)
    with staged(join_input, output) as (joined, local_out, _), signals_counted() as signals:
        assert local_out is not None
        rows_file = rows_path(local_out)
        try:
            with (
                expected_errors(url),
                Progress(quiet=quiet or not wait, interval_s=progress_interval_s) as shown,
            ):
                collector = Collector(client.redis, queue, say=shown.log, retry_timeout_s=retry_timeout_s)
                report = collector.collect(
                    rows_file,
                    wait=wait,
                    timeout_s=timeout_s,
                    trim=trim,
                    progress=shown,
                    should_stop=lambda: signals.count > 0,
                    until=until,
                    watch_consumers=wait,
                )
        finally:
            client.close()
        if is_parquet(output) and not signals.count:
            with expected_errors(url):
                write_table(rows_file, local_out, joined, mapping)
    shown_rows = rows_path(output) if local_out != Path(output) else rows_file
    if signals.count:
        held = (
            f"; {counted(len(report.held), 'result')} read behind a job still missing wait in {shown_rows}.spill"
            if report.held
            else ""
        )
        fail(
            f"interrupted: wrote {report.written} results to {shown_rows} in enqueue order "
            f"({report.already} already there){held}: run the same command to resume",
            signals.exit_code,
        )
    typer.echo(f"wrote {report.written} results to {output} ({report.already} already there)")
    if report.held:
        warn(
            f"{counted(len(report.held), 'result')} that arrived behind a job still missing "
            f"{'waits' if len(report.held) == 1 else 'wait'} in {shown_rows}.spill: the collect that gets "
            "that job writes them in their turn"
        )
    if report.replaced:
        typer.echo(
            f"replaced {counted(report.replaced, 'row')} with new results (requeued dead letters, "
            "jobs run again with changed content)"
        )
    if report.duplicates:
        warn(
            f"{rows_file} holds {len(report.duplicates)} rows of ids it already had (e.g. "
            f"{', '.join(report.duplicates[:3])}), written by collects that ran at once before they "
            "took a lock: keep the first row of each id"
        )
    if report.stopped:
        fail(f"stopped: {report.stopped}; run the same command again to continue", exits.USAGE)
    if report.lost:
        fail(
            f"{report.lost}. {len(report.missing)} jobs of this queue have no result in {output}. "
            f"To finish them, enqueue the same input file again (radixq enqueue FILE --queue {queue}) "
            f"and collect again into the same output (radixq collect -o {output}): ids already in "
            "it are skipped, so each id is still written once.",
            exits.JOBS_FAILED,
        )
    if report.forgotten_elsewhere:
        warn(
            f"{report.forgotten_elsewhere} jobs were collected earlier by a trimming collect into another "
            "output and Redis forgot them (their rows are in that output)"
        )
    if report.trimmed:
        warn(
            f"{counted(len(report.trimmed))} {'was' if len(report.trimmed) == 1 else 'were'} collected earlier "
            "and trimmed from Redis (their rows are "
            f"in the output of that collect), e.g. {', '.join(report.trimmed[:3])}"
        )
    others = len(report.missing) - len(report.trimmed)
    if others:
        warn(
            f"{counted(others)} {'has' if others == 1 else 'have'} no result yet, e.g. {', '.join(report.missing[:3])}"
        )
    if report.short:
        warn(f"stopped before what it was to wait for: {report.short}")
    if report.failed:
        warn(f"{counted(report.failed)} failed (error rows in {output})")
    if report.missing or report.held or report.failed or report.forgotten_elsewhere or report.short:
        raise typer.Exit(exits.JOBS_FAILED)


@app.command()
def cancel(
    queue: QueueOption = DEFAULT_QUEUE,
    redis_url: RedisUrlOption = None,
    ids_file: Annotated[
        str | None,
        typer.Option(
            "--ids",
            help="Cancel only these jobs: a file of job ids, one a line, or of JSONL rows (their custom_id "
            "or id); '-' reads stdin.",
            metavar="FILE",
        ),
    ] = None,
    tag: Annotated[
        str | None, typer.Option("--tag", help="Cancel only the jobs enqueued with this tag (enqueue --tag).")
    ] = None,
    retry_timeout_s: RetryTimeoutOption = 60.0,
) -> None:
    """Cancel the queue's jobs that have no result yet (all, --ids or --tag): each gets one
    `cancelled` error result, which collect writes as an error row (--errors: in the errors
    file); jobs that have a result keep it. Workers never run a cancelled job and abort those
    they hold. Safe to run again, beside workers and a collect.

    Exit 0: done; 1: some ids given are unknown to the queue (named); 2: bad options, unknown
    queue, Redis unavailable or refusing (run it again: nothing is cancelled twice)."""
    from producer.cancel import CancelLost, read_ids

    if ids_file is not None and tag is not None:
        fail("--ids and --tag: give one of them (neither: the whole queue)", exits.USAGE)
    if tag is not None:
        checked_tag(tag)
    ids = None
    if ids_file is not None:
        try:
            ids = read_ids(ids_file)
        except (OSError, ValueError) as exc:
            fail(f"--ids {ids_file}: {exc.strerror if isinstance(exc, OSError) else exc}", exits.USAGE)
    url = resolve_redis_url(redis_url)
    client = open_client(url, queue, retry_timeout_s=retry_timeout_s, say=warn)
    try:
        with expected_errors(url):
            report = client.cancel(ids, tag=tag)
    except CancelLost as exc:
        fail(str(exc), exits.USAGE)
    finally:
        client.close()
    what = (
        f"tag {tag!r}" if tag is not None else (f"{ids_file}" if ids_file is not None else f"queue {queue}")
    )
    typer.echo(
        f"cancelled {counted(report.cancelled)} of {report.scope} in {what} (the others have a result already)"
    )
    if report.without_entry:
        warn(
            f"{counted(report.without_entry)} had no entry in the queue's streams: cancelled without metadata"
        )
    if report.unknown:
        fail(
            f"{counted(len(report.unknown), 'id')} unknown to queue {queue} (never enqueued, or collected and "
            f"forgotten): {', '.join(report.unknown[:10])}" + (", ..." if len(report.unknown) > 10 else ""),
            exits.JOBS_FAILED,
        )


def checked_tag(tag: str) -> str:
    from producer.tags import check_tag

    try:
        return check_tag(tag)
    except ValueError as exc:
        fail(f"--tag: {exc}", exits.USAGE)


@app.command()
def status(
    queue: QueueOption = DEFAULT_QUEUE,
    redis_url: RedisUrlOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    prometheus: Annotated[
        bool, typer.Option("--prometheus", help="Print the queue's gauges in Prometheus's text format.")
    ] = False,
) -> None:
    """Queued, in flight (per consumer, alive or dead), done, failed and dead-lettered jobs,
    rate, ETA and queue lag (docs/operations.md, Status, explains every field).

    Exit 0, or 2: unknown queue, Redis unavailable or refusing."""
    url = resolve_redis_url(redis_url)
    client = open_client(url, queue)
    try:
        with expected_errors(url):
            snapshot = client.status()
    finally:
        client.close()
    if as_json:
        typer.echo(json.dumps(snapshot.to_dict(), indent=2))
        return
    if prometheus:
        from wire.status import exposition

        typer.echo(exposition(snapshot), nl=False)
        return
    epoch = (
        f"epoch {snapshot.epoch}"
        if snapshot.epoch
        else "no epoch: not enqueued with radixq, or Redis lost it"
    )
    typer.echo(f"queue {snapshot.queue}: {snapshot.enqueued} enqueued ({epoch})")
    typer.echo(f"  queued        {snapshot.queued}")
    typer.echo(f"  in flight     {snapshot.in_flight}")
    typer.echo(f"  done          {snapshot.done - snapshot.failed}")
    typer.echo(f"  failed        {snapshot.failed}")
    typer.echo(f"  dead-lettered {snapshot.dead_lettered}")
    if snapshot.cancelled:
        typer.echo(f"  cancelled     {snapshot.cancelled}")
    typer.echo(f"  results kept  {snapshot.results_kept}")
    eta = "-" if snapshot.eta_s is None else f"{snapshot.eta_s:.0f} s"
    lag = "-" if snapshot.queue_lag_s is None else f"{snapshot.queue_lag_s:.1f} s"
    typer.echo(f"  rate          {snapshot.jobs_per_s:.2f} jobs/s (live workers, last minute)")
    typer.echo(f"  ETA           {eta}")
    typer.echo(f"  queue lag     {lag} (oldest job not yet delivered)")
    if snapshot.partitions > 1:
        typer.echo(f"  partitions    {snapshot.partitions}")
    for consumer in snapshot.consumers:
        typer.echo(f"  consumer {consumer.name}: {describe_consumer(consumer)}")


def describe_consumer(consumer: ConsumerStatus) -> str:
    beat, age_s = consumer.heartbeat, consumer.heartbeat_age_s
    seen = f"last heartbeat {age_s:.0f} s ago" if age_s is not None else "no heartbeat"
    if not consumer.alive:
        return f"dead: {seen}, idle {consumer.idle_ms / 1000:.0f} s, holds {consumer.in_flight} jobs"
    state = beat.state if beat is not None else "no heartbeat"
    model = f", model {beat.model}" if beat is not None and beat.model else ""
    heard = f", heartbeat {age_s:.1f} s ago" if age_s is not None else ""
    rate = f", {beat.jobs_per_s:.2f} jobs/s, {beat.completed} done" if beat is not None else ""
    return (
        f"{state}, {consumer.in_flight} in flight, idle {consumer.idle_ms} ms{heard}{model}{rate}"
        f"{describe_cache(beat)}"
    )


def describe_cache(beat: Heartbeat | None) -> str:
    """The worker's prefix cache as its heartbeat tells it ("" before its first finished job)."""
    if beat is None or beat.hit_rate is None:
        return ""
    owns = f", owns partitions {','.join(map(str, beat.partitions))}" if beat.partitions else ""
    return (
        f"; cache hits {beat.hit_rate:.0%} ({beat.cached_tokens} of {beat.prompt_tokens} prompt tokens), "
        f"{beat.prefix_keys} prefix keys{owns}"
    )


@dlq_app.command("list")
def dlq_list(
    queue: QueueOption = DEFAULT_QUEUE,
    redis_url: RedisUrlOption = None,
    count: Annotated[int, typer.Option("--count", "-n")] = 100,
) -> None:
    """Show dead letters: job id, deliveries and reason. Exit 0, or 2: unknown queue, Redis
    unavailable or refusing."""
    from producer.client import UnknownQueueError

    url = resolve_redis_url(redis_url)
    client = open_client(url, queue)
    try:
        with expected_errors(url):
            if not client.known():
                raise UnknownQueueError(queue)
            letters = client.dead_letters(count)
    finally:
        client.close()
    for letter in letters:
        typer.echo(f"{letter.job_id}\tattempts={letter.attempts}\t{letter.reason}")
    typer.echo(f"{len(letters)} dead letters", err=True)


@dlq_app.command("requeue")
def dlq_requeue(
    job_ids: Annotated[list[str] | None, typer.Argument(help="Job ids to requeue (default: all).")] = None,
    queue: QueueOption = DEFAULT_QUEUE,
    redis_url: RedisUrlOption = None,
    retry_timeout_s: RetryTimeoutOption = 60.0,
) -> None:
    """Put dead letters back on the queue with a fresh delivery count; a resumed collect
    replaces their dead-letter rows with the new results.

    Exit 0; 1: some given ids have no dead letter (named); 2: unknown queue, Redis unavailable
    or refusing (run it again: requeued letters have left the dead-letter stream)."""
    from producer.client import UnknownQueueError

    url = resolve_redis_url(redis_url)
    client = open_client(url, queue, retry_timeout_s=retry_timeout_s, say=warn)
    try:
        with expected_errors(url):
            if not client.backoff.call(client.known):
                raise UnknownQueueError(queue)
            requeued = client.requeue_dead(job_ids or None)
    finally:
        client.close()
    typer.echo(f"requeued {counted(len(requeued))}")
    absent = sorted(set(job_ids or []) - set(requeued))
    if absent:
        fail(f"no dead letter for {counted(len(absent), 'id')}: {', '.join(absent)}", exits.JOBS_FAILED)


if __name__ == "__main__":
    app()

"""``radixq collect``: each job's result written once, in enqueue order, into an output file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from producer.cli_common import (
    column_mapping,
    counted,
    expected_errors,
    open_client,
    resolve_redis_url,
    staged,
    warn,
    write_table,
)
from producer.cli_options import (
    IdColumnOption,
    MessagesColumnOption,
    ProgressIntervalOption,
    PromptColumnOption,
    QueueOption,
    QuietOption,
    RedisUrlOption,
    RetryTimeoutOption,
    TemplateOption,
)
from wire import exits
from wire.exits import fail
from wire.keys import DEFAULT_QUEUE


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

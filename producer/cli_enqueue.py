"""``radixq enqueue``: every row of a file checked, then enqueued (idempotent by job id)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from producer.cli_common import (
    checked_tag,
    column_mapping,
    expected_errors,
    holds_no_known_id,
    open_client,
    queued_rows,
    resolve_redis_url,
    staged,
    warn,
)
from producer.cli_options import (
    ErrorsOption,
    IdColumnOption,
    InputArgument,
    MessagesColumnOption,
    NoRoutingOption,
    PartitionsOption,
    PromptColumnOption,
    QueueOption,
    RedisUrlOption,
    RerunChangedOption,
    RetryTimeoutOption,
    TemplateOption,
)
from wire import exits
from wire.exits import fail
from wire.keys import DEFAULT_QUEUE
from wire.routing import DEFAULT_PARTITIONS, NO_ROUTING

if TYPE_CHECKING:
    from producer.datasets import ColumnMapping


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
    from producer.input_rows import InputFile
    from producer.insert import QueueLost
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

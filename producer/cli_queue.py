"""The commands on a queue's jobs once enqueued: ``radixq cancel``, ``radixq status`` and the
``radixq dlq`` subcommands (``list``, ``requeue``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from producer.cli_common import checked_tag, counted, expected_errors, open_client, resolve_redis_url, warn
from producer.cli_options import QueueOption, RedisUrlOption, RetryTimeoutOption
from wire import exits
from wire.exits import fail
from wire.keys import DEFAULT_QUEUE

if TYPE_CHECKING:
    from wire.status import ConsumerStatus, Heartbeat


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

"""The radixq command line (typer). ``main`` is the console script.

Client commands live here (enqueue, collect, status, dlq); the worker-side commands (worker,
run) come from worker.cli and are registered lazily in ``main``, so this module imports
neither the worker package nor torch.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Annotated, NoReturn

import typer

DEFAULT_REDIS_URL = "redis://localhost:6379/0"

app = typer.Typer(
    name="radixq",
    help="Batch LLM generation on a Redis Streams queue.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
dlq_app = typer.Typer(help="Dead letters: jobs delivered more than max_attempts times.", no_args_is_help=True)
app.add_typer(dlq_app, name="dlq")

QueueOption = Annotated[str, typer.Option("--queue", "-q", envvar="RADIXQ_QUEUE", help="Queue name.")]
RedisUrlOption = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar=["RADIXQ_REDIS_URL", "REDIS_URL"],
        help=f"Redis URL (env RADIXQ_REDIS_URL or REDIS_URL; default {DEFAULT_REDIS_URL}).",
    ),
]


def resolve_redis_url(url: str | None) -> str:
    return url or DEFAULT_REDIS_URL


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@app.command()
def enqueue(
    input_path: Annotated[Path, typer.Argument(help="Input JSONL file.", exists=True, dir_okay=False)],
    queue: QueueOption = "default",
    redis_url: RedisUrlOption = None,
) -> None:
    """Validate every line of FILE, then enqueue the valid ones (idempotent by job id)."""
    from producer.client import Client
    from producer.jsonl import read_jobs

    parsed = read_jobs(input_path)
    for rejected in parsed.rejected:
        typer.echo(f"rejected {input_path}:{rejected}", err=True)
    client = Client.from_url(resolve_redis_url(redis_url), queue)
    try:
        report = client.enqueue(parsed.jobs)
    finally:
        client.close()
    typer.echo(
        f"enqueued {len(report.enqueued)}, skipped {len(report.skipped)} (already enqueued), "
        f"rejected {len(parsed.rejected)}"
    )
    if parsed.rejected and not parsed.jobs:
        raise typer.Exit(2)


@app.command()
def collect(
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Output JSONL file (appended to, resumable).")
    ],
    queue: QueueOption = "default",
    redis_url: RedisUrlOption = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait until every enqueued job has a result.")
    ] = True,
    timeout_s: Annotated[
        float | None, typer.Option("--timeout", help="Stop waiting after this many seconds.")
    ] = None,
) -> None:
    """Write each job's result exactly once, in enqueue order, error rows included."""
    from producer.client import connect
    from producer.collector import Collector

    client = connect(resolve_redis_url(redis_url))
    try:
        report = Collector(client, queue).collect(output, wait=wait, timeout_s=timeout_s)
    finally:
        client.close()
    typer.echo(f"wrote {report.written} results to {output} ({report.already} already there)")
    if report.missing:
        typer.echo(f"{len(report.missing)} jobs have no result yet", err=True)
        if wait:
            raise typer.Exit(1)


@app.command()
def status(
    queue: QueueOption = "default",
    redis_url: RedisUrlOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Queued, in flight (per consumer), done, failed and dead-lettered jobs."""
    from producer.client import Client
    from producer.status import now_ms

    client = Client.from_url(resolve_redis_url(redis_url), queue)
    try:
        snapshot = client.status()
    finally:
        client.close()
    if as_json:
        typer.echo(json.dumps(snapshot.to_dict(), indent=2))
        return
    typer.echo(f"queue {snapshot.queue}: {snapshot.enqueued} enqueued")
    typer.echo(f"  queued        {snapshot.queued}")
    typer.echo(f"  in flight     {snapshot.in_flight}")
    typer.echo(f"  done          {snapshot.done - snapshot.failed}")
    typer.echo(f"  failed        {snapshot.failed}")
    typer.echo(f"  dead-lettered {snapshot.dead_lettered}")
    for consumer in snapshot.consumers:
        beat = consumer.heartbeat
        seen = (
            f"{(now_ms() - beat.last_seen_ms) / 1000:.1f}s ago, {beat.state}, model {beat.model}"
            if beat
            else "no heartbeat"
        )
        typer.echo(
            f"  consumer {consumer.name}: {consumer.in_flight} in flight, idle {consumer.idle_ms} ms ({seen})"
        )


@dlq_app.command("list")
def dlq_list(
    queue: QueueOption = "default",
    redis_url: RedisUrlOption = None,
    count: Annotated[int, typer.Option("--count", "-n")] = 100,
) -> None:
    """Show dead letters: job id, deliveries and reason."""
    from producer.client import Client

    client = Client.from_url(resolve_redis_url(redis_url), queue)
    try:
        letters = client.dead_letters(count)
    finally:
        client.close()
    for letter in letters:
        typer.echo(f"{letter.job_id}\tattempts={letter.attempts}\t{letter.reason}")
    typer.echo(f"{len(letters)} dead letters", err=True)


@dlq_app.command("requeue")
def dlq_requeue(
    job_ids: Annotated[list[str] | None, typer.Argument(help="Job ids to requeue (default: all).")] = None,
    queue: QueueOption = "default",
    redis_url: RedisUrlOption = None,
) -> None:
    """Put dead letters back on the queue with a fresh delivery count."""
    from producer.client import Client

    client = Client.from_url(resolve_redis_url(redis_url), queue)
    try:
        requeued = client.requeue_dead(job_ids or None)
    finally:
        client.close()
    typer.echo(f"requeued {len(requeued)} jobs")


def main() -> None:
    """Console script: register the worker-side commands, then run the app."""
    importlib.import_module("worker.cli").register(app)
    app()


if __name__ == "__main__":
    main()

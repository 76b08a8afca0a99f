"""The worker-side CLI commands, registered into the radixq app by producer.cli.main.

Nothing heavy is imported here at module level: the backend (and with it torch) loads only
when a worker starts.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Annotated

import typer

from producer.cli import QueueOption, RedisUrlOption, fail, resolve_redis_url

BackendOption = Annotated[
    str,
    typer.Option("--backend", envvar="RADIXQ_BACKEND", help="'engine' or a module:callable backend factory."),
]
ModelOption = Annotated[str | None, typer.Option("--model", "-m", help="Model directory or hub id.")]
DeviceOption = Annotated[
    str | None, typer.Option("--device", help="auto | cpu | cuda (default: the config's, else auto)")
]
ConfigOption = Annotated[Path | None, typer.Option("--config", help="Worker TOML config file.")]
MinIdleOption = Annotated[
    float,
    typer.Option(
        "--min-idle-s", envvar="RADIXQ_MIN_IDLE_S", help="Reclaim entries idle this long (dead consumer)."
    ),
]
MaxAttemptsOption = Annotated[
    int,
    typer.Option("--max-attempts", envvar="RADIXQ_MAX_ATTEMPTS", help="Deliveries before dead-lettering."),
]
DrainOption = Annotated[
    float, typer.Option("--drain-timeout-s", envvar="RADIXQ_DRAIN_TIMEOUT_S", help="Graceful drain limit.")
]


ReadWindowOption = Annotated[
    int,
    typer.Option(
        "--read-window",
        envvar="RADIXQ_READ_WINDOW",
        help="Most jobs held at once (0: as many as the engine can run now).",
    ),
]
TrimJobsOption = Annotated[
    bool,
    typer.Option(
        "--trim-jobs/--keep-jobs",
        envvar="RADIXQ_TRIM_JOBS",
        help="Trim acknowledged entries from the jobs stream (results and dead letters keep what counts).",
    ),
]


def worker(
    queue: QueueOption = "default",
    redis_url: RedisUrlOption = None,
    model: ModelOption = None,
    device: DeviceOption = None,
    config: ConfigOption = None,
    name: Annotated[str | None, typer.Option("--name", help="Consumer name (default host-pid).")] = None,
    backend: BackendOption = "engine",
    min_idle_s: MinIdleOption = 60.0,
    max_attempts: MaxAttemptsOption = 3,
    drain_timeout_s: DrainOption = 30.0,
    read_window: ReadWindowOption = 0,
    trim_jobs: TrimJobsOption = True,
    log_level: Annotated[str, typer.Option("--log-level", envvar="RADIXQ_LOG_LEVEL")] = "INFO",
) -> None:
    """Consume jobs until SIGINT/SIGTERM, then drain (within --drain-timeout-s) and exit 0.

    Exit codes: 0 after a drain; 1 when the engine could not be kept running; 2 for usage,
    configuration or Redis connection errors (wrong password, ACL, TLS)."""
    from producer import exits
    from producer.client import connect
    from producer.redis_errors import classify, describe
    from worker.frontend.process import EngineStartError
    from worker.queue.config import ConsumerConfig, default_worker_name
    from worker.queue.consumer import Consumer
    from worker.queue.factory import GeneratorOptions, create_generator
    from worker.queue.generator import GeneratorUnavailable
    from worker.queue.jobqueue import QueueRefused
    from worker.queue.streams import RedisJobQueue

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config is not None and not config.is_file():
        fail(f"--config {config}: no such file", exits.USAGE)
    url = resolve_redis_url(redis_url)
    try:
        consumer_config = ConsumerConfig(
            queue=queue,
            name=name or default_worker_name(),
            min_idle_s=min_idle_s,
            max_attempts=max_attempts,
            drain_timeout_s=drain_timeout_s,
            read_window=read_window,
            trim_jobs=trim_jobs,
        )
    except ValueError as exc:
        fail(str(exc), exits.USAGE)
    client = connect(url)
    try:  # before loading a model for minutes: a Redis that will never let us in
        client.ping()
    except Exception as exc:
        if classify(exc) == "fatal":
            fail(describe(exc, url), exits.USAGE)
        logging.getLogger("radixq.worker").warning(
            "%s; the worker retries once it has started", describe(exc, url)
        )
    options = GeneratorOptions(
        model=model, device=device, config=str(config) if config else None, worker_name=consumer_config.name
    )
    try:
        generator = create_generator(backend, options)
    except (EngineStartError, ValueError, TypeError, ImportError) as exc:
        fail(str(exc), exits.USAGE)
    except KeyboardInterrupt:
        fail("interrupted while the engine was starting", exits.JOBS_FAILED)
    queue_side = RedisJobQueue(
        client, queue, consumer_config.name, consumer_config.min_idle_ms, consumer_config.dead_after_ms
    )
    consumer = Consumer(queue_side, generator, consumer_config)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: consumer.request_stop())
    try:
        consumer.run()
    except QueueRefused as exc:
        fail(str(exc), exits.USAGE)
    except GeneratorUnavailable as exc:
        fail(f"the engine could not be kept running: {exc}", exits.JOBS_FAILED)


RunDrainOption = Annotated[
    float,
    typer.Option(
        "--drain-timeout-s",
        min=0,
        help="On Ctrl-C, SIGTERM or --timeout: how long workers may finish what they hold "
        "(passed to each worker); the shutdown takes at most this plus a few seconds.",
    ),
]


def run(
    input_path: Annotated[Path, typer.Argument(help="Input JSONL file.", exists=True, dir_okay=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output JSONL file (resumed if it exists).")],
    model: ModelOption = None,
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Worker processes.")] = 1,
    queue: QueueOption = "default",
    redis_url: Annotated[
        str | None,
        typer.Option(
            "--redis-url",
            envvar="RADIXQ_REDIS_URL",
            help="Use this Redis (not read from the generic REDIS_URL). Default: a private one for the run.",
        ),
    ] = None,
    device: DeviceOption = None,
    config: ConfigOption = None,
    backend: BackendOption = "engine",
    timeout_s: Annotated[
        float | None, typer.Option("--timeout", help="Give up after this many seconds.")
    ] = None,
    drain_timeout_s: RunDrainOption = 30.0,
) -> None:
    """Enqueue FILE, start worker(s), collect into OUT, shut everything down.

    Exit code 0: every job has a result without error; 1: some line was rejected, some job
    failed or has no result (interrupted: run the same command again to resume); 2: usage,
    configuration or connection error.
    """
    from producer import exits
    from producer.runner import RunError, RunOptions, run_file

    worker_args = ["--backend", backend]
    if device:
        worker_args += ["--device", device]
    if model:
        worker_args += ["--model", model]
    if config:
        worker_args += ["--config", str(config)]
    options = RunOptions(
        input_path=input_path,
        output_path=output,
        queue=queue,
        redis_url=redis_url,
        num_workers=workers,
        worker_args=worker_args,
        timeout_s=timeout_s,
        drain_timeout_s=drain_timeout_s,
    )
    try:
        report = run_file(options, say=lambda text: typer.echo(text, err=True))
    except RunError as exc:
        fail(str(exc), exits.USAGE)
    typer.echo(f"wrote {report.written} results to {output} ({report.resumed} were already there)", err=True)
    if not report.parsed.jobs:
        fail(f"no valid jobs in {input_path}", report.exit_code())
    if report.failed:
        typer.echo(
            f"{len(report.failed)} jobs failed (error lines in {output}), e.g. {report.failed[:3]}", err=True
        )
    if report.parsed.rejected:
        typer.echo(f"{len(report.parsed.rejected)} lines of {input_path} were rejected", err=True)
    if report.missing:
        typer.echo(
            f"{report.stopped or 'stopped'}: wrote {report.in_output} of {len(report.parsed.jobs)} results "
            f"to {output}; run the same command again to resume",
            err=True,
        )
    raise typer.Exit(report.exit_code())


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
    app.command("run")(run)

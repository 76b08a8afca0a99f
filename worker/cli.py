"""The console script ``radixq`` (``main``): producer.cli's app plus the worker-side commands.

Nothing heavy is imported here at module level: the backend (and with it torch) loads only
when a worker starts.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from producer.cli import (
    ErrorsOption,
    IdColumnOption,
    InputArgument,
    MessagesColumnOption,
    ProgressIntervalOption,
    PromptColumnOption,
    QueueOption,
    QuietOption,
    RedisUrlOption,
    RerunChangedOption,
    TemplateOption,
    app,
    column_mapping,
    counted,
    fail,
    staged,
)

ModelOption = Annotated[
    str | None, typer.Option("--model", "-m", help="Model: alias, directory, .gguf file or hub id.")
]
DeviceOption = Annotated[str | None, typer.Option("--device", help="auto | cpu | cuda.")]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="Worker TOML file: \\[worker], \\[queue], \\[engine] tables.")
]
ServedModelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--served-model-name",
        help="A model name the workers answer to (repeat for several): replies name it, and a job "
        "naming another model gets a model_not_served error (default: any name runs).",
    ),
]
GeneratorOption = Annotated[
    str | None,
    typer.Option("--generator", "--backend", help="'engine', or a module:callable generator factory."),
]


def worker(
    config: ConfigOption = None,
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Queue name.")] = None,
    redis_url: Annotated[str | None, typer.Option("--redis-url", help="Redis URL.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Consumer name (default hostname-pid).")] = None,
    generator: GeneratorOption = None,
    model: ModelOption = None,
    device: DeviceOption = None,
    min_idle_s: Annotated[
        float | None, typer.Option("--min-idle-s", help="Reclaim entries idle this long (their worker died).")
    ] = None,
    max_attempts: Annotated[
        int | None,
        typer.Option("--max-attempts", help="Deliveries (or engine crashes alone) before dead-lettering."),
    ] = None,
    drain_timeout_s: Annotated[
        float | None, typer.Option("--drain-timeout-s", help="SIGTERM to exit, all of it.")
    ] = None,
    read_window: Annotated[
        int | None,
        typer.Option(
            "--read-window", help="Most jobs held at once (0: what the engine takes, up to a fair share)."
        ),
    ] = None,
    trim_jobs: Annotated[
        bool | None,
        typer.Option("--trim-jobs/--keep-jobs", help="Trim acknowledged entries from the jobs stream."),
    ] = None,
    log_level: Annotated[str | None, typer.Option("--log-level", help="DEBUG, INFO, WARNING, ERROR.")] = None,
    metrics_port: Annotated[
        int | None, typer.Option("--metrics-port", help="Serve Prometheus /metrics on this port (0: off).")
    ] = None,
    connect_timeout_s: Annotated[
        float | None,
        typer.Option("--connect-timeout-s", help="At start-up, wait this long for Redis before exiting 2."),
    ] = None,
    served_model_name: ServedModelOption = None,
    cpu_threads: Annotated[
        int | None,
        typer.Option(
            "--cpu-threads", min=0, help="Torch threads of a CPU engine (0: every core it may use)."
        ),
    ] = None,
) -> None:
    """Consume jobs until SIGINT/SIGTERM, then drain (within the drain timeout) and exit 0.

    Settings come from --config's \\[worker], \\[queue] and \\[engine] tables, then RADIXQ_*
    environment variables, then these flags (README: "Worker settings").
    Exit codes: 0 after a drain; 1 when the engine could not be kept running; 2 for usage,
    configuration or Redis connection errors (wrong password, ACL, TLS)."""
    import redis

    from wire import exits
    from wire.cluster import upgrade
    from wire.redis_errors import describe
    from wire.retry import RedisUnavailable
    from wire.streams import connect
    from worker.config import ConfigError, load_worker_config
    from worker.preflight import PreflightError, check_model, wait_for_redis
    from worker.queue.consumer import Consumer
    from worker.queue.factory import create_generator
    from worker.queue.generator import GeneratorUnavailable
    from worker.queue.jobqueue import QueueRefused
    from worker.queue.streams import RedisJobQueue

    flags = {
        "worker.queue": queue,
        "worker.redis_url": redis_url,
        "worker.name": name,
        "worker.generator": generator,
        "worker.log_level": log_level,
        "worker.metrics_port": metrics_port,
        "worker.connect_timeout_s": connect_timeout_s,
        "worker.served_model_names": ",".join(served_model_name) if served_model_name else None,
        "engine.model": model,
        "engine.device": device,
        "engine.cpu_threads": cpu_threads,
        "queue.min_idle_s": min_idle_s,
        "queue.max_attempts": max_attempts,
        "queue.drain_timeout_s": drain_timeout_s,
        "queue.read_window": read_window,
        "queue.trim_jobs": trim_jobs,
    }
    try:
        settings = load_worker_config(config, os.environ, flags)
    except ConfigError as exc:
        fail(str(exc), exits.USAGE)
    logging.basicConfig(
        level=settings.worker.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log = logging.getLogger("radixq.worker")
    url = settings.worker.redis_url
    # NOTE: before loading a model for minutes: a model that is not there, a Redis that never
    # answers or will not let us in, a metrics port that is taken
    try:
        if settings.worker.generator == "engine":
            check_model(settings.engine)
        client = connect(url)
        wait_for_redis(client, url, settings.worker.connect_timeout_s, log.warning)
        client = upgrade(client, url)  # NOTE: Redis may have answered only just now
    except PreflightError as exc:
        fail(str(exc), exits.USAGE)
    except RedisUnavailable as exc:
        fail(
            f"Redis never answered at start-up (waited {exc.waited_s:.0f} s, --connect-timeout-s): "
            f"{describe(exc.cause, url)}",
            exits.USAGE,
        )
    except redis.RedisError as exc:
        fail(describe(exc, url), exits.USAGE)
    registry = None
    if settings.worker.metrics_port:
        from worker.metrics import serve_registry

        try:
            registry = serve_registry(settings.worker.metrics_port)
        except OSError as exc:
            fail(f"--metrics-port {settings.worker.metrics_port}: {exc.strerror or exc}", exits.USAGE)
    if settings.worker.generator == "engine" and settings.engine.device == "auto":
        # NOTE: resolved here, not in the engine: a CPU worker's limits depend on it
        settings = settings.for_device(settings.engine.resolved().device)
    from worker.frontend.process import EngineStartError  # NOTE: imports torch: after the checks

    try:
        generation = create_generator(settings)
    except (EngineStartError, ValueError, TypeError, ImportError) as exc:
        fail(str(exc), exits.USAGE)
    except KeyboardInterrupt:
        fail("interrupted while the engine was starting", exits.JOBS_FAILED)
    consumer_config = settings.queue
    queue_side = RedisJobQueue(
        client,
        consumer_config.queue,
        consumer_config.name,
        consumer_config.min_idle_ms,
        consumer_config.dead_after_ms,
        steal_after_s=consumer_config.steal_after_s,
    )
    metrics = None
    if registry is not None:
        from worker.metrics import WorkerMetrics

        served = settings.worker.served_models
        metrics = WorkerMetrics(
            consumer_config.queue, served[0] if served else generation.model_name, registry
        )
    consumer = Consumer(
        queue_side, generation, consumer_config, metrics=metrics, served_models=settings.worker.served_models
    )
    if metrics is not None:
        metrics.gauges(lambda: consumer.held, generation)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: consumer.request_stop())
    try:
        consumer.run()
    except QueueRefused as exc:
        fail(str(exc), exits.USAGE)
    except GeneratorUnavailable as exc:
        fail(f"the engine could not be kept running: {exc}", exits.JOBS_FAILED)
    # NOTE: the drain deadline covers finishing, giving back and stopping the engine; the
    # interpreter's own teardown (about a second with torch loaded) would overrun it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exits.OK)


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
    input_path: InputArgument,
    output: Annotated[
        str,
        typer.Option(
            "--output",
            "-o",
            help="Output file, JSONL or .parquet (resumed if it exists); a path or a URL (s3://, gs://, "
            "https:// with PUT).",
        ),
    ],
    model: ModelOption = None,
    workers: Annotated[int, typer.Option("--workers", "-w", min=1, help="Worker processes.")] = 1,
    queue: QueueOption = "default",
    redis_url: RedisUrlOption = None,
    device: DeviceOption = None,
    config: ConfigOption = None,
    generator: GeneratorOption = None,
    timeout_s: Annotated[
        float | None, typer.Option("--timeout", help="Give up after this many seconds.")
    ] = None,
    drain_timeout_s: RunDrainOption = 30.0,
    quiet: QuietOption = False,
    progress_interval_s: ProgressIntervalOption = 10.0,
    metrics_port: Annotated[
        int,
        typer.Option(
            "--metrics-port",
            min=0,
            envvar="RADIXQ_METRICS_PORT",
            help="Worker i serves Prometheus /metrics on this port + i (0: none).",
        ),
    ] = 0,
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions", min=1, max=1024, help="Partition streams of a new queue (README Routing)."
        ),
    ] = 1,
    prompt_column: PromptColumnOption = None,
    messages_column: MessagesColumnOption = None,
    id_column: IdColumnOption = None,
    template: TemplateOption = None,
    errors: ErrorsOption = None,
    join_input: Annotated[
        bool,
        typer.Option("--join-input", help="Parquet output: the input's columns joined to the results."),
    ] = False,
    rerun_changed: RerunChangedOption = False,
    served_model_name: ServedModelOption = None,
) -> None:
    """Enqueue FILE, start worker(s), collect into OUT, shut everything down. One output row
    per input row, in input order: a rejected row gets an invalid_job error row (or a line in
    the --errors file).

    Exit code 0: every job has a result without error; 1: some row was rejected, some job
    failed or has no result (interrupted: run the same command again to resume); 2: usage,
    configuration or connection error, unreadable input.
    """
    from producer.runner import RunError, RunOptions, run_file, worker_env
    from wire import exits
    from wire.redis_errors import check_url
    from worker.preflight import PreflightError, check_run

    if redis_url is not None:
        try:
            check_url(redis_url)
        except ValueError as exc:
            fail(f"--redis-url {exc}", exits.USAGE)
    mapping = column_mapping(prompt_column, messages_column, id_column, template)
    served = ",".join(served_model_name) if served_model_name else None
    try:  # NOTE: before a Redis starts and jobs go in: what would stop every worker at start
        settings = check_run(
            config,
            worker_env("redis://127.0.0.1:1/0"),
            {
                "worker.generator": generator,
                "worker.served_model_names": served,
                "engine.device": device,
                "engine.model": model,
            },
            [metrics_port + i for i in range(workers)] if metrics_port else [],
        )
    except PreflightError as exc:
        fail(str(exc), exits.USAGE)
    worker_args = ["--generator", generator] if generator else []
    for name in served_model_name or []:
        worker_args += ["--served-model-name", name]
    if device:
        worker_args += ["--device", device]
    if model:
        worker_args += ["--model", model]
    if config:
        worker_args += ["--config", str(config)]
    worker_args += _cpu_threads_args(workers, config)
    problem = None
    with staged(input_path, output, errors) as (source, local_out, errors_file):
        assert source is not None and local_out is not None
        options = RunOptions(
            input_path=source,
            output_path=local_out,
            queue=queue,
            redis_url=redis_url,
            num_workers=workers,
            worker_args=worker_args,
            timeout_s=timeout_s,
            drain_timeout_s=drain_timeout_s,
            quiet=quiet,
            progress_interval_s=progress_interval_s,
            metrics_port=metrics_port,
            partitions=partitions,
            mapping=mapping,
            errors_path=errors_file,
            join_input=join_input,
            rerun_changed=rerun_changed,
            served_models=settings.worker.served_models,
        )
        try:
            report = run_file(options, say=lambda text: typer.echo(text, err=True))
        except RunError as exc:
            problem = str(exc)
    if problem is not None:
        fail(problem, exits.USAGE)
    typer.echo(f"wrote {report.written} results to {output} ({report.resumed} were already there)", err=True)
    if not report.parsed.jobs and not report.parsed.rejected:
        typer.echo(f"{input_path} has no rows: nothing to run", err=True)
    elif not report.parsed.jobs:
        fail(f"no valid jobs in {input_path}", report.exit_code())
    if report.failed:
        typer.echo(
            f"{counted(len(report.failed))} failed (error lines in {output}), e.g. {report.failed[:3]}",
            err=True,
        )
    if report.parsed.rejected:
        where = f"in {errors}" if errors is not None else f"invalid_job rows in {output}"
        rejected = len(report.parsed.rejected)
        typer.echo(
            f"{counted(rejected, 'row')} of {input_path} {'was' if rejected == 1 else 'were'} rejected ({where})",
            err=True,
        )
    if report.missing:
        then = (
            "the workers could not start (their error is above): fix that, then run the same command again"
            if report.exit_code() == exits.USAGE
            else "run the same command again to resume"
        )
        typer.echo(
            f"{report.stopped or 'stopped'}: wrote {report.in_output} of {len(report.expected)} rows "
            f"to {output}; {then}",
            err=True,
        )
    raise typer.Exit(report.exit_code())


def _cpu_threads_args(workers: int, config: Path | None) -> list[str]:
    """``--cpu-threads`` for each of ``workers`` (> 1) workers on this host: its cores shared
    out, so no two engines' threads contend for a core; none when the file or the environment
    sets ``cpu_threads`` to a count (0 is "auto": the share; the workers report a bad file)."""
    from worker.config import ConfigError, load_worker_config
    from worker.engine.threads import share_per_worker

    if workers == 1:
        return []
    try:
        asked = load_worker_config(config, os.environ).engine.cpu_threads
    except ConfigError:
        return []
    return [] if asked else ["--cpu-threads", str(share_per_worker(workers))]


def build_app() -> typer.Typer:
    """producer.cli's app with the worker-side commands added (once)."""
    if not any(info.name == "worker" for info in app.registered_commands):
        app.command("worker")(worker)
        app.command("run")(run)
    return app


def main() -> None:
    """The console script ``radixq``: the client commands of producer.cli plus worker and run."""
    build_app()()


if __name__ == "__main__":
    main()

"""The composition root: the console script ``radixq`` (``main``, ``python -m radixq``).

It builds the one CLI: producer.cli's client commands (enqueue, collect, status, dlq, ...),
worker.cli's ``worker``, and ``run``, which joins both sides (producer.runner starts
``radixq worker`` processes with the command line given here). The only module that imports
both ``producer`` and ``worker``. Nothing heavy is imported at module level.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from producer.cli import (
    ErrorsOption,
    IdColumnOption,
    InputArgument,
    MessagesColumnOption,
    NoRoutingOption,
    PartitionsOption,
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
    staged,
)
from wire.exits import fail
from wire.keys import DEFAULT_QUEUE
from wire.routing import DEFAULT_PARTITIONS, NO_ROUTING
from worker.cli import (
    BackendOption,
    ConfigOption,
    DeviceOption,
    GeneratorOption,
    ModelOption,
    ServedModelOption,
    generator_of,
    worker_args,
    worker_command,
    worker_flags,
)

# How run starts a worker: this root's own ``worker`` command, in a fresh interpreter.
WORKER_COMMAND = [sys.executable, "-m", "radixq", "worker"]


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
    queue: QueueOption = DEFAULT_QUEUE,
    redis_url: RedisUrlOption = None,
    device: DeviceOption = None,
    config: ConfigOption = None,
    generator: GeneratorOption = None,
    backend: BackendOption = None,
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
    partitions: PartitionsOption = DEFAULT_PARTITIONS,
    no_routing: NoRoutingOption = False,
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
    from worker.config import deprecation_warnings
    from worker.preflight import PreflightError, check_run

    generator = generator_of(generator, backend)
    for line in deprecation_warnings(os.environ):
        typer.echo(line, err=True)
    if redis_url is not None:
        try:
            check_url(redis_url)
        except ValueError as exc:
            fail(f"--redis-url {exc}", exits.USAGE)
    mapping = column_mapping(prompt_column, messages_column, id_column, template)
    # The worker flags run takes (and --config), by parameter name: checked here as each
    # worker will read them, then passed on to each
    forwarded = {
        "generator": generator,
        "served_model_names": served_model_name,
        "device": device,
        "model": model,
    }
    try:  # NOTE: before a Redis starts and jobs go in: what would stop every worker at start
        settings = check_run(
            config,
            worker_env("redis://127.0.0.1:1/0"),
            worker_flags(forwarded),
            [metrics_port + i for i in range(workers)] if metrics_port else [],
            say=lambda line: typer.echo(line, err=True),
        )
    except PreflightError as exc:
        fail(str(exc), exits.USAGE)
    args = [
        *worker_args(forwarded),
        *(["--config", str(config)] if config else []),
        *_cpu_threads_args(workers, config),
    ]
    problem = None
    with staged(input_path, output, errors) as (source, local_out, errors_file):
        assert source is not None and local_out is not None
        options = RunOptions(
            input_path=source,
            output_path=local_out,
            worker_command=WORKER_COMMAND,
            queue=queue,
            redis_url=redis_url,
            num_workers=workers,
            worker_args=args,
            timeout_s=timeout_s,
            drain_timeout_s=drain_timeout_s,
            quiet=quiet,
            progress_interval_s=progress_interval_s,
            metrics_port=metrics_port,
            partitions=NO_ROUTING if no_routing else partitions,
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
    # NOTE: with --errors, the error rows this run wrote went on to ERR: each file gets its own count
    to_errors = f" and {report.moved} to {errors}" if errors is not None else ""
    typer.echo(
        f"wrote {report.written - report.moved} results to {output}{to_errors} "
        f"({report.resumed} were already there)",
        err=True,
    )
    if not report.parsed.jobs and not report.parsed.rejected:
        typer.echo(f"{input_path} has no rows: nothing to run", err=True)
    elif not report.parsed.jobs:
        fail(f"no valid jobs in {input_path}", report.exit_code())
    if report.failed:
        typer.echo(
            f"{counted(len(report.failed))} failed (error lines in {errors or output}), e.g. {report.failed[:3]}",
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
            f"to {output}{f' and {errors}' if errors is not None else ''}; {then}",
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


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"radixq {version('radixq')}")
        except PackageNotFoundError:  # NOTE: a source tree on PYTHONPATH, not installed
            typer.echo("radixq (not installed: no version)")
        raise typer.Exit()


def root(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_version, help="Print radixq's version and exit."),
    ] = False,
) -> None:
    """Batch LLM generation on a Redis Streams queue."""


def build_app() -> typer.Typer:
    """producer.cli's app with the worker-side commands and ``--version`` added (once)."""
    if not any(info.name == "worker" for info in app.registered_commands):
        app.callback()(root)
        app.command("worker")(worker_command())
        app.command("run")(run)
        from service.cli import serve

        app.command("serve")(serve)
    return app


def main() -> None:
    """The console script ``radixq``: the client commands of producer.cli plus worker, run and serve."""
    build_app()(prog_name="radixq")

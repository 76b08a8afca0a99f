"""The ``radixq worker`` command and the worker-side option types ``run`` shares (registered by
radixq.cli, the composition root).

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

from wire.exits import fail

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
    tensor_parallel_size: Annotated[
        int | None,
        typer.Option(
            "--tensor-parallel-size", "--tp", min=1, help="Processes (GPUs) the model is split over."
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            help="GPUs of this worker (sets CUDA_VISIBLE_DEVICES, e.g. 2,3); a TP group takes the first ones.",
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
    from worker.frontend.contract import GeneratorUnavailable
    from worker.preflight import PreflightError, check_model, wait_for_redis
    from worker.queue.consumer import Consumer
    from worker.queue.factory import create_generator
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
        "engine.tensor_parallel_size": tensor_parallel_size,
        "queue.min_idle_s": min_idle_s,
        "queue.max_attempts": max_attempts,
        "queue.drain_timeout_s": drain_timeout_s,
        "queue.read_window": read_window,
        "queue.trim_jobs": trim_jobs,
    }
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus  # NOTE: before torch is imported; children inherit it
    try:
        settings = load_worker_config(config, os.environ, flags)
    except ConfigError as exc:
        fail(str(exc), exits.USAGE)
    group_gpus = [g for g in (gpus or "").split(",") if g.strip()]
    if group_gpus and settings.engine.tensor_parallel_size > len(group_gpus):
        fail(
            f"--gpus {gpus} names {len(group_gpus)} GPUs for tensor_parallel_size="
            f"{settings.engine.tensor_parallel_size}",
            exits.USAGE,
        )
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

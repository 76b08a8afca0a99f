"""The ``radixq worker`` command and the worker-side option types ``run`` shares (registered by
radixq.cli, the composition root).

Nothing heavy is imported here at module level: the generator (and with it torch) loads only
when a worker starts.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from wire.exits import fail

if TYPE_CHECKING:
    from worker.config import Setting

ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="Worker TOML file: \\[worker], \\[queue], \\[engine] tables.")
]
BackendOption = Annotated[
    str | None, typer.Option("--backend", hidden=True, help="Deprecated: the older name of --generator.")
]


def setting_option(dotted: str) -> Any:
    """The typer option of the setting ``dotted`` (worker.config.settings): its flags and help."""
    from worker.config import settings

    (setting,) = [s for s in settings() if s.dotted == dotted]
    return _option(setting)


def _option(setting: Setting) -> Any:
    flags = setting.flags
    if setting.type is bool and len(flags) == 1 and "/" not in flags[0]:
        flags = (f"{flags[0]}/--no-{flags[0].removeprefix('--')}",)
    help_text = setting.spec.help.replace("[", "\\[")
    if setting.spec.repeat:
        help_text += " (repeat the flag for several)"
    if setting.spec.choices:
        help_text += f" [one of: {', '.join(setting.spec.choices)}]".replace("[", "\\[")
    # NOTE: the flag's own default is None ("not given"): the setting's default is shown instead
    if setting.type is bool:
        on, _, off = flags[0].partition("/")
        help_text += f" \\[default: {on if setting.default else off}]"
    elif setting.shown_default:
        help_text += f" \\[default: {setting.shown_default}]"
    return typer.Option(*flags, help=help_text, show_default=False)


def _flag_type(setting: Setting) -> Any:
    """What its flag parses: the field's type without None (None is "not given"), a list when
    the flag repeats."""
    if setting.spec.repeat:
        return list[str] | None
    kinds = [t for t in typing.get_args(setting.type) if t is not type(None)] or [setting.type]
    return kinds[0] | None


def generator_of(generator: str | None, backend: str | None) -> str | None:
    """--generator, or the deprecated --backend (with a warning)."""
    if backend is None:
        return generator
    typer.echo(
        "warning: --backend is deprecated: use --generator (backend names the attention backend, "
        "[engine] attention)",
        err=True,
    )
    return generator if generator is not None else backend


GpusOption = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        help="GPUs of this worker (sets CUDA_VISIBLE_DEVICES, e.g. 2,3); a TP group takes the first ones.",
    ),
]
ModelOption = Annotated[str | None, setting_option("engine.model")]
DeviceOption = Annotated[str | None, setting_option("engine.device")]
ServedModelOption = Annotated[list[str] | None, setting_option("worker.served_model_names")]
GeneratorOption = Annotated[str | None, setting_option("worker.generator")]


def worker_command() -> Callable[..., None]:
    """The ``worker`` command: ``--config`` and one flag per setting (worker.config.settings),
    each None unless given."""
    from worker.config import settings

    known = settings()
    params = [
        inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ConfigOption),
        inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=BackendOption),
        inspect.Parameter("gpus", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=GpusOption),
    ]
    for s in known:
        annotation = Annotated[_flag_type(s), _option(s)]  # type: ignore[valid-type]
        params.append(
            inspect.Parameter(s.key, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
        )

    def worker(**given: Any) -> None:
        config, backend, gpus = given.pop("config"), given.pop("backend"), given.pop("gpus")
        if gpus is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpus  # NOTE: before torch is imported; children inherit it
        flags = worker_flags(given)
        flags["worker.generator"] = generator_of(flags["worker.generator"], backend)
        run_worker(config, flags)

    worker.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    worker.__doc__ = run_worker.__doc__
    return worker


def worker_flags(given: Mapping[str, Any]) -> dict[str, Any]:
    """The settings (dotted keys, as load_worker_config takes them) of the ``worker`` command's
    parsed flags ``given`` (by parameter name; None: not given)."""
    from worker.config import settings

    flags: dict[str, Any] = {}
    for s in settings():
        value = given.get(s.key)
        if s.spec.repeat:
            value = ",".join(value) if value else None
        flags[s.dotted] = value
    return flags


def worker_args(given: Mapping[str, Any]) -> list[str]:
    """The ``radixq worker`` arguments that parse to ``given`` (by parameter name, as
    worker_flags takes them; None: not given; a repeated flag's values as a list): the worker
    command lines ``run`` builds."""
    from worker.config import settings

    args: list[str] = []
    for s in settings():
        value = given.get(s.key)
        if value is None:
            continue
        if s.type is bool:
            on, _, off = s.flags[0].partition("/")
            args.append(on if value else off or f"--no-{on.removeprefix('--')}")
        elif s.spec.repeat:
            args += [arg for item in value for arg in (s.flag, str(item))]
        else:
            args += [s.flag, str(value)]
    return args


def run_worker(config: Path | None, flags: dict[str, Any]) -> None:
    """Consume jobs until SIGINT/SIGTERM, then drain (within the drain timeout) and exit 0.

    Settings come from --config's \\[worker], \\[queue] and \\[engine] tables, then RADIXQ_*
    environment variables, then these flags (docs/configuration.md).
    Exit codes: 0 after a drain; 1 when the engine could not be kept running; 2 for usage,
    configuration or Redis connection errors (wrong password, ACL, TLS)."""
    import redis

    from wire import exits
    from wire.cluster import upgrade
    from wire.redis_errors import describe
    from wire.retry import RedisUnavailable
    from wire.status import Heartbeat
    from wire.streams import connect
    from worker.config import ConfigError, deprecation_warnings, load_worker_config
    from worker.frontend.contract import GeneratorUnavailable
    from worker.frontend.generators import create_generator
    from worker.preflight import PreflightError, check_model, wait_for_redis
    from worker.queue.consumer import Consumer
    from worker.queue.jobqueue import QueueRefused
    from worker.queue.loading import loading_heartbeats
    from worker.queue.streams import RedisJobQueue

    for line in deprecation_warnings(os.environ):
        typer.echo(line, err=True)
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
    engine = settings.worker.generator == "engine"
    try:
        if engine:
            check_model(settings.engine, download=False)  # NOTE: a hub id is fetched below, beating
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
    consumer_config = settings.queue
    served_registry = None
    if settings.worker.metrics_port:
        from worker.metrics import serve_registry

        try:
            served_registry = serve_registry(settings.worker.metrics_port, consumer_config.queue)
        except OSError as exc:
            fail(f"--metrics-port {settings.worker.metrics_port}: {exc.strerror or exc}", exits.USAGE)
    queue_side = RedisJobQueue(
        client,
        consumer_config.queue,
        consumer_config.name,
        consumer_config.min_idle_ms,
        consumer_config.dead_after_ms,
        steal_after_s=consumer_config.steal_after_s,
    )
    loading = Heartbeat(
        name=consumer_config.name,
        pid=os.getpid(),
        model=settings.engine.model if engine else settings.worker.generator,
        served_models=list(settings.worker.served_models),
        device=settings.engine.device if engine and settings.engine.device != "auto" else "",
    )
    with loading_heartbeats(queue_side, loading, consumer_config.heartbeat_s):
        if engine:
            try:
                check_model(settings.engine, log.info)  # NOTE: downloads a hub id that is not cached
            except PreflightError as exc:
                fail(str(exc), exits.USAGE)
        if engine and settings.engine.device == "auto":
            # NOTE: resolved here, not in the engine: a CPU worker's limits depend on it
            settings = settings.for_device(settings.engine.resolved().device)
        from worker.frontend.process import EngineStartError  # NOTE: imports torch: after the checks

        try:
            generation = create_generator(settings)
        except (EngineStartError, ValueError, TypeError, ImportError) as exc:
            fail(str(exc), exits.USAGE)
        except KeyboardInterrupt:
            fail("interrupted while the engine was starting", exits.JOBS_FAILED)
    metrics = None
    if served_registry is not None:
        from worker.metrics import WorkerMetrics

        served = settings.worker.served_models
        metrics = WorkerMetrics(
            consumer_config.queue, served[0] if served else generation.model_name, served_registry.registry
        )
    device = settings.engine.device if settings.worker.generator == "engine" else ""
    consumer = Consumer(
        queue_side,
        generation,
        consumer_config,
        metrics=metrics,
        served_models=settings.worker.served_models,
        device=device,
    )
    if metrics is not None and served_registry is not None:
        metrics.gauges(lambda: consumer.held, generation)
        served_registry.loaded()
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

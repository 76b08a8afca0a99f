"""What ``radixq worker`` and ``radixq run`` check before anything slow starts (a Redis, the
enqueue, a model load of minutes): the settings, the model's source, the metrics ports, and
for a worker that its Redis answers. Each failure is one line (PreflightError) and exit 2.

Nothing here imports torch: the model check reads the file system and the Hugging Face cache,
and downloads a hub id that is not cached (worker.models.hub), so every worker of a ``run``
finds it there; worker.models.loader does the rest.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import redis

from wire.retry import Backoff
from worker.config import ConfigError, WorkerConfig, load_worker_config
from worker.engine.config import EngineConfig
from worker.models.architectures import UnsupportedModel, check_config_file

_PATH_SUFFIXES = (".gguf", ".json", ".safetensors")


class PreflightError(Exception):
    """A setup that cannot work; ``str()`` is the one line to show."""


def check_model(
    engine: EngineConfig, say: Callable[[str], None] | None = None, download: bool = True
) -> None:
    """The model source is there: a path that looks like one (absolute, ``./``, ``~``, a
    ``.gguf``/``.json`` name, two slashes) exists, an alias's package is installed, and an
    ``org/name`` hub id is in the local Hugging Face cache or is downloaded into it now
    (worker.models.hub: ``say`` gets a line first; without ``download`` an id that is not
    cached passes, for a later call to fetch); any other name is refused at once. A
    config.json found (in the folder, the file itself, the snapshot) names an architecture
    radixq runs and no quantization scheme it cannot (worker.models.architectures)."""
    from worker.models import hub
    from worker.models.aliases import ALIASES

    model = engine.model
    path = Path(model).expanduser()
    if path.exists():
        if engine.load_format == "dummy" and path.is_dir() and not (path / "config.json").is_file():
            raise PreflightError(
                f"--model {model!r}: load_format dummy needs a config.json, and {path} has none"
            )
        config = path / "config.json" if path.is_dir() else path
        if config.suffix == ".json" and config.is_file():
            _check_config(model, config)
        return
    looks_like_path = (
        model.startswith(("/", ".", "~")) or model.lower().endswith(_PATH_SUFFIXES) or model.count("/") > 1
    )
    if looks_like_path or engine.load_format == "dummy":
        raise PreflightError(f"--model {model!r}: no such file or folder")
    if model in ALIASES:
        try:
            ALIASES[model].locate()
        except FileNotFoundError as exc:
            raise PreflightError(f"--model {model!r}: {exc}") from None
        return
    if not hub.is_hub_id(model):
        if hub.cached(model) is None:  # NOTE: an older hub id without an org, already cached, runs
            raise PreflightError(
                f"--model {model!r}: not a file or folder, an alias ({', '.join(sorted(ALIASES))}) "
                "or a Hugging Face id (org/name)"
            )
        return
    if download:
        try:
            snapshot = hub.snapshot(model, say)  # the cached one, else downloaded
        except hub.HubUnavailable as exc:
            raise PreflightError(str(exc)) from None
    else:
        found = hub.cached(model)
        if found is None:
            return
        snapshot = found
    if (snapshot / "config.json").is_file():
        _check_config(model, snapshot / "config.json")


def _check_config(model: str, config: Path) -> None:
    try:
        check_config_file(config)
    except UnsupportedModel as exc:
        raise PreflightError(f"--model {model!r}: {exc}") from None


def check_ports(ports: list[int], what: str = "--metrics-port") -> None:
    """Each port can be listened on (all interfaces, as the metrics server does)."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server does
            try:
                probe.bind(("", port))
            except OSError as exc:
                raise PreflightError(f"{what} {port}: {exc.strerror or exc}") from None


def wait_for_redis(client: redis.Redis, url: str, timeout_s: float, say: Callable[[str], None]) -> None:
    """Ping until Redis answers, for up to ``timeout_s`` (a worker started beside its Redis
    waits for it); raises wire.retry.RedisUnavailable after that, and fatal errors (a wrong
    password, ACL, TLS) at once."""
    backoff = Backoff(url, give_up_s=timeout_s, say=say, max_wait_s=1.0)
    backoff.reached = True  # NOTE: "refused" is an outage to wait out here, not a wrong URL at once
    backoff.call(client.ping)


def check_run(
    config_path: Path | None,
    environ: dict[str, str],
    flags: dict[str, object],
    metrics_ports: list[int],
    say: Callable[[str], None] | None = None,
) -> WorkerConfig:
    """What ``radixq run`` checks before it starts a Redis: the settings its workers will read
    (file, environment, the flags it passes on), their metrics ports, their model (an uncached
    hub id is downloaded here, once for every worker; ``say`` gets a line first)."""
    try:
        settings = load_worker_config(config_path, environ, flags)
    except ConfigError as exc:
        raise PreflightError(str(exc)) from None
    check_ports(metrics_ports)  # NOTE: before a download of the model
    if settings.worker.generator == "engine":
        check_model(settings.engine, say)
    else:
        from worker.frontend.generators import GENERATORS
        from worker.lazy import load_callable

        try:
            load_callable(settings.worker.generator, GENERATORS, "generator")
        except (ValueError, ImportError) as exc:
            raise PreflightError(f"--generator {settings.worker.generator!r}: {exc}") from None
    return settings

"""What ``radixq worker`` and ``radixq run`` check before anything slow starts (a Redis, the
enqueue, a model load of minutes): the settings, the model's source, the metrics ports, and
for a worker that its Redis answers. Each failure is one line (PreflightError) and exit 2.

Nothing here imports torch: the model check reads the file system and the Hugging Face cache
only, as far as that tells without loading (worker.models.loader does the rest).
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


def check_model(engine: EngineConfig) -> None:
    """The model source exists: a path that looks like one (absolute, ``./``, ``~``, a
    ``.gguf``/``.json`` name) is there, and an ``org/name`` hub id is in the local Hugging
    Face cache. A bare name is an alias, checked by the loader. A config.json found (in the
    folder, the file itself, the hub cache) names an architecture radixq runs and no
    quantization scheme it cannot (worker.models.architectures)."""
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
    if model.count("/") == 1:
        cached = _hub_cache_config(model)
        if cached is None:
            raise PreflightError(
                f"--model {model!r}: no such file or folder, and not a model in the local Hugging Face "
                "cache (radixq downloads nothing: fetch it first, e.g. huggingface-cli download)"
            )
        if isinstance(cached, Path):
            _check_config(model, cached)


def _check_config(model: str, config: Path) -> None:
    try:
        check_config_file(config)
    except UnsupportedModel as exc:
        raise PreflightError(f"--model {model!r}: {exc}") from None


def _hub_cache_config(repo_id: str) -> Path | bool | None:
    """The cached config.json of a hub id; None when it is not cached, True when that cannot
    be told here (the loader's error will say)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # NOTE: the loader will say what is missing
        return True
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # a name the hub library refuses: the loader's error names it
        return True
    return Path(found) if isinstance(found, str) else None


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
    config_path: Path | None, environ: dict[str, str], flags: dict[str, object], metrics_ports: list[int]
) -> WorkerConfig:
    """What ``radixq run`` checks before it starts a Redis: the settings its workers will read
    (file, environment, the flags it passes on), their model, their metrics ports."""
    try:
        settings = load_worker_config(config_path, environ, flags)
    except ConfigError as exc:
        raise PreflightError(str(exc)) from None
    if settings.worker.generator == "engine":
        check_model(settings.engine)
    else:
        from worker.frontend.generators import GENERATORS
        from worker.lazy import load_callable

        try:
            load_callable(settings.worker.generator, GENERATORS, "generator")
        except (ValueError, ImportError) as exc:
            raise PreflightError(f"--generator {settings.worker.generator!r}: {exc}") from None
    check_ports(metrics_ports)
    return settings

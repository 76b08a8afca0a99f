"""Engine options from a worker TOML file plus command-line overrides, frozen once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from worker.engine.config import EngineConfig

DEFAULT_MODEL = "smollm2-135m"


def read_toml(path: str | Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def engine_config_from(options: dict[str, Any]) -> EngineConfig:
    """EngineConfig from ``options``: ``config`` names a TOML file whose [engine] table is
    read first; every other key overrides it (``model`` included)."""
    merged: dict[str, Any] = {}
    rest = dict(options)
    config_path = rest.pop("config", None)
    if config_path is not None:
        merged.update(read_toml(config_path).get("engine", {}))
    merged.update(rest)
    model = str(merged.pop("model", DEFAULT_MODEL))
    return EngineConfig.from_options(model, **merged)

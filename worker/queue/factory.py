"""Which Generator a worker drives, chosen by a spec string, built from frozen options.

``"engine"`` is the real engine front end (``worker.frontend:create_generator``); any other spec
is a ``"module:callable"`` import path (tests use ``tests.fake_generator:create_generator``). The
module is imported only when the backend is built, so nothing heavy loads before that.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

from worker.queue.generator import Generator

ENGINE_SPEC = "worker.frontend:create_generator"


@dataclass(frozen=True)
class GeneratorOptions:
    """What the worker CLI passes through; the factory receives it as a read-only mapping
    with these keys (None: not given, the backend's default applies)."""

    model: str | None = None  # a Hugging Face directory or hub id
    device: str | None = None  # auto | cpu | cuda
    config: str | None = None  # path of a worker TOML file
    worker_name: str = ""

    def as_mapping(self) -> Mapping[str, Any]:
        return MappingProxyType(asdict(self))


def resolve_spec(spec: str) -> str:
    return ENGINE_SPEC if spec == "engine" else spec


def create_generator(spec: str, options: GeneratorOptions) -> Generator:
    """Import the factory named by ``spec`` and call it with ``options.as_mapping()``."""
    target = resolve_spec(spec)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"generator spec {spec!r}: expected 'engine' or 'module:callable'")
    module = importlib.import_module(module_name)
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ValueError(f"generator spec {spec!r}: {module_name} has no callable {attr!r}")
    return factory(options.as_mapping())

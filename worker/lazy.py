"""One registry style for everything chosen by name: a name -> ``"module:callable"`` table,
imported only when chosen (attention backends, prefix caches, generators)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def load_callable(name: str, table: Mapping[str, str], kind: str) -> Callable[..., Any]:
    """The callable ``table[name]`` names, or ``name`` itself when it is a ``module:callable``
    path. ValueError names the choices; ImportError says what is missing and how to get it."""
    target = table.get(name, name)
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        choices = ", ".join(sorted(table))
        raise ValueError(f"unknown {kind} {name!r}: choose from {choices}, or give a module:callable")
    module = importlib.import_module(module_name)
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ValueError(f"{kind} {name!r}: {module_name} has no callable {attr!r}")
    return factory


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's ``__getattr__`` that imports ``exports[name]`` (its module) on first use, so
    importing one torch-free module of the package (its ``names``) loads nothing heavy."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__

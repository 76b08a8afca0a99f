"""The GPU side of radixq: queue consumer, front end, scheduler, engine, models.

``from worker import LLM`` is the offline API (imported lazily: torch loads on first use).
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from worker.llm import LLM

        return LLM
    raise AttributeError(f"module 'worker' has no attribute {name!r}")

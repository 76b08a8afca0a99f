"""Which Generator a worker drives: ``[worker] generator`` names its factory.

``"engine"`` is the real engine front end (``worker.frontend.engine_generator:create_engine_generator``); any other
value is a ``"module:callable"`` import path (tests use ``tests.fake_generator:create_generator``).
The module is imported only when the generator is built, so nothing heavy loads before that.
A factory takes the worker's frozen configuration (worker.config.WorkerConfig). What it builds
is wrapped in worker.frontend.prompts.PromptLists, which runs jobs with several prompts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.frontend.prompts import PromptLists
from worker.lazy import load_callable

if TYPE_CHECKING:
    from worker.config import WorkerConfig
    from worker.frontend.contract import Generator

GENERATORS = {"engine": "worker.frontend.engine_generator:create_engine_generator"}


def create_generator(config: WorkerConfig) -> Generator:
    """Import the factory named by ``config.worker.generator`` and call it with ``config``."""
    factory = load_callable(config.worker.generator, GENERATORS, "generator")
    return PromptLists(factory(config))

"""The worker's front end: tokenization, the supervised scheduler process, Results."""

from worker.frontend.engine_generator import EngineGenerator, create_engine_generator
from worker.frontend.process import EngineStartError

__all__ = ["EngineGenerator", "EngineStartError", "create_engine_generator"]

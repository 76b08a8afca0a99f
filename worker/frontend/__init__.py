"""The worker's front end: tokenization, the supervised scheduler process, Results."""

from worker.frontend.backend import EngineBackend, create_backend
from worker.frontend.process import EngineStartError

__all__ = ["EngineBackend", "EngineStartError", "create_backend"]

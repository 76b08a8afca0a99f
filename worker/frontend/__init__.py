"""The worker's front end: tokenization, the scheduler process, Results."""

from worker.frontend.backend import EngineBackend, create_backend

__all__ = ["EngineBackend", "create_backend"]

"""The scheduler: request ledger, managers, the loop, and its I/O (messages.py is the contract).
Re-exported lazily: the torch-free ``worker.scheduler.names`` imports no torch."""

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

if TYPE_CHECKING:
    from worker.scheduler.io import InMemoryIO
    from worker.scheduler.run import build_scheduler, run_scheduler
    from worker.scheduler.scheduler import Scheduler

__all__ = ["InMemoryIO", "Scheduler", "build_scheduler", "run_scheduler"]
__getattr__ = lazy_exports(
    __name__,
    {
        "InMemoryIO": "worker.scheduler.io",
        "build_scheduler": "worker.scheduler.run",
        "run_scheduler": "worker.scheduler.run",
        "Scheduler": "worker.scheduler.scheduler",
    },
)

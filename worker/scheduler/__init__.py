"""The scheduler: request ledger, managers, the loop, and its I/O (messages.py is the contract)."""

from worker.scheduler.io import InMemoryIO
from worker.scheduler.run import build_scheduler, run_scheduler
from worker.scheduler.scheduler import Scheduler

__all__ = ["InMemoryIO", "Scheduler", "build_scheduler", "run_scheduler"]

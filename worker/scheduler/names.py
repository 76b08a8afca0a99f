"""The scheduler's policies by name, torch-free (the setting ``schedule_policy`` takes its
choices from here; worker.scheduler.waiting implements them)."""

from __future__ import annotations

SCHEDULE_POLICIES = ("lpm", "fcfs")

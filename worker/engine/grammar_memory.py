"""The grammar compiler's memory bound: a compile may add ``limit_mib`` to the child's size at rest.

xgrammar's memory grows with some grammars without end (a JSON schema ``anyOf`` of 2,000
branches took the child past 10 GB before the time limit stopped it), and one compile is one C++
call that Python cannot interrupt. Two bounds, from outside the call:

- ``MemoryWatch`` (the parent): a thread reads the child's resident size every WATCH_S and kills
  it once it is more than ``limit_mib`` above its size when it became ready; the key being
  compiled fails with the limit named. It is the one that normally acts: the child cannot
  stop it, even while a compile holds the child's GIL.
- ``cap_address_space`` (the child, once loaded): RLIMIT_AS at its address space then plus the
  limit and BACKSTOP_MIB, for a growth too fast for the watch; an allocation past it fails
  (MemoryError, or the child aborts), which fails the key too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

WATCH_S = 0.02  # between two reads of the child's resident size
BACKSTOP_MIB = 1024  # the address-space cap's room above the watch's bound (arenas, stacks, maps)
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes(pid: int) -> int | None:
    """Resident size of ``pid`` (None: gone, or no /proc here)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def address_space_bytes() -> int | None:
    """This process's virtual size now (None: no /proc here)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[0]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def cap_address_space(limit_mib: int) -> None:
    """In the child: no allocation past its address space now + ``limit_mib`` + BACKSTOP_MIB."""
    import resource

    now = address_space_bytes()
    if now is None:
        return
    cap = now + (limit_mib + BACKSTOP_MIB) * (1 << 20)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


class MemoryWatch:
    """Kills ``pid`` (with ``kill``) once its resident size is ``limit_mib`` above what it was
    when the watch started. ``exceeded``: the resident size that made it act, else None."""

    def __init__(self, pid: int, limit_mib: int, kill: Callable[[], None]) -> None:
        self.pid = pid
        self.limit_mib = limit_mib
        self.baseline_bytes = resident_bytes(pid) or 0
        self.exceeded: int | None = None
        self._kill = kill
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="grammar-memory", daemon=True).start()

    @property
    def bound_bytes(self) -> int:
        return self.baseline_bytes + self.limit_mib * (1 << 20)

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            size = resident_bytes(self.pid)
            if size is None:
                return
            if size > self.bound_bytes:
                self.exceeded = size
                self._kill()
                return

    def stop(self) -> None:
        self._stop.set()

    def reason(self) -> str:
        return (
            f"the grammar compiler went over its memory limit of {self.limit_mib} MiB above its "
            f"{self.baseline_bytes >> 20} MiB at rest (grammar_memory_mib)"
        )

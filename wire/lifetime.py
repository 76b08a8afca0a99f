"""Child processes that live and die with their parent.

``start_child`` runs a command in its own session (so a Ctrl-C meant for the parent's process
group does not reach it: the parent decides how and when the child stops) and, on Linux, with
a parent-death signal (the kernel signals the child the moment its parent dies, ``kill -9``
included). ``die_with_parent`` does the same from inside a child that was not started this way
(a process started by multiprocessing). Elsewhere than Linux the parent-death part is a no-op;
children then rely on watching their parent's pid.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int = signal.SIGKILL, parent_pid: int | None = None) -> None:
    """Ask the kernel to send ``signum`` to this process when its parent dies.

    ``parent_pid``: the parent as the caller knew it; if it is already gone (the parent died
    before this call), exit now instead of waiting for a signal that will never come."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


def start_child(
    args: Sequence[str], *, death_signal: int = signal.SIGTERM, **popen: Any
) -> subprocess.Popen[bytes]:
    """Popen in a new session that gets ``death_signal`` when this process dies."""
    parent_pid = os.getpid()

    def _in_child() -> None:  # NOTE: runs between fork and exec; no locks, no allocation-heavy work
        die_with_parent(death_signal, parent_pid)

    return subprocess.Popen(list(args), start_new_session=True, preexec_fn=_in_child, **popen)

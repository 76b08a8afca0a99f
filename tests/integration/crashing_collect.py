"""`radixq collect` that kills itself with SIGKILL at one chosen point, for the crash tests.

    python -m tests.integration.crashing_collect POINT collect -o OUT --redis-url URL ...

POINT is where the process dies, the first time it gets there (nothing runs after: no
``finally``, no flush, as with ``kill -9`` from outside):

    spilled    a chunk is committed to the spill, the results stream not yet trimmed
    trimmed    the results stream was trimmed past that chunk, no row appended yet
    appended   rows were appended to the output file and fsynced, the spill still holds them
    replaced   a superseded row was replaced in the output file, the spill still holds the new one
    reordered  the file put in order is written beside the output, not yet renamed over it
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from producer import outfile, spill, trim


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def wrap(owner: Any, name: str, *, before: bool, when: Callable[..., bool]) -> None:
    """``owner.name`` made to die just before (or just after) its first call that ``when``
    accepts (given the call's arguments)."""
    original = getattr(owner, name)

    def wrapped(*args: Any) -> Any:
        if before and when(*args):
            die()
        value = original(*args)
        if not before and when(*args):
            die()
        return value

    setattr(owner, name, wrapped)


def always(*args: Any) -> bool:
    return True


POINTS = {  # point: (owner, name, before the call (else after), which call)
    "spilled": (trim.Trimmer, "trim_to", True, always),
    "trimmed": (trim.Trimmer, "trim_to", False, always),
    "appended": (spill.Spill, "drop", True, lambda self, ids: bool(ids)),
    "replaced": (outfile.OutputFile, "replace", False, always),
    "reordered": (outfile.os, "replace", True, always),
}


if __name__ == "__main__":
    owner, name, before, when = POINTS[sys.argv[1]]
    wrap(owner, name, before=before, when=when)
    from producer.cli import app

    app(sys.argv[2:], prog_name="radixq")

"""One writer per output file: ``OUT.lock``, held (``flock``) while a collect or run writes OUT.

Two collects appending to one file would each write every id (each reads the results stream
on its own), so the second one refuses with the holder's pid, host and start time, read from
the lock file. The lock is the kernel's: it goes with its process, ``kill -9`` included, and a
lock file left behind by one is simply taken over. Within one thread the lock is re-entrant
(``run`` holds it for the whole run while each of its collect passes takes it again); another
thread of the same process is refused like another process.

    NOTE: the file is removed on release. A process that opened it just before that holds a
    lock on a file no longer in the folder; so after taking the lock, a writer checks that
    the path still names the file it locked, and opens it again if not.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class OutputBusy(Exception):
    """Another process is writing this output file; ``str()`` is the one line, naming it."""


_held: dict[str, list[int]] = {}  # lock path -> [fd, depth, thread id]: re-entrance within a thread


def lock_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".lock")


@contextmanager
def output_lock(path: str | Path) -> Iterator[None]:
    """Hold the output file's lock; OutputBusy at once when another process holds it."""
    where = lock_path(path)
    key = str(where.resolve())
    if key in _held and _held[key][2] == threading.get_ident():
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    fd = _acquire(where, Path(path))
    _held[key] = [fd, 1, threading.get_ident()]
    try:
        yield
    finally:
        del _held[key]
        where.unlink(missing_ok=True)
        os.close(fd)  # NOTE: after the unlink, so nobody takes a file that is about to go


def _acquire(where: Path, path: Path) -> int:
    while True:
        fd = os.open(where, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise OutputBusy(
                f"{path} is being written by another collect or run ({_holder(where)}): wait for it to "
                "finish or stop it, then run this again (ids already in it are skipped)"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(where).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # locked a file its holder removed on release: take the new one
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n".encode())
    return fd


def _holder(where: Path) -> str:
    try:
        text = where.read_text(errors="replace").strip()
    except OSError:
        text = ""
    return text or f"it holds {where}"

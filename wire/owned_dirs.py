"""Private temp folders marked with their owner process, and the removal of those whose owner
died without removing them (``kill -9``): a local Redis's data folder, a scheduler's sockets."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

OWNER_FILE = "owner.pid"


def process_tag(pid: int) -> str | None:
    """``"PID START"`` for a live process (START: its start time, so that a reused pid does
    not pass for the old process); None for one that is gone or a zombie. Without /proc
    (not Linux) the tag is just ``"PID"``."""
    if not Path("/proc/self/stat").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return str(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # NOTE: the name in parentheses may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return f"{pid} {fields[19]}"  # field 22 of proc(5): starttime


def _owner_alive(owner: str) -> bool:
    pid, _, start = owner.partition(" ")
    tag = process_tag(int(pid))
    return tag is not None and (not start or tag == owner)


def owned_dir(prefix: str) -> Path:
    """A new private folder in the temp directory (``prefix`` + random), marked as this
    process's: ``remove_stale_dirs(prefix=prefix)`` removes it once this process is gone
    (after a ``kill -9``, which leaves no chance to remove it)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    (folder / OWNER_FILE).write_text(f"{process_tag(os.getpid())}\n")
    return folder


def remove_stale_dirs(prefix: str, parent: Path | None = None) -> list[Path]:
    """Remove this user's ``prefix*`` folders whose owner
    process is gone; return them.

    A folder without a readable owner file (made by an older radixq, or being made right
    now) is left alone."""
    removed = []
    for folder in Path(parent or tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            if folder.stat().st_uid != os.getuid():
                continue
            owner = (folder / OWNER_FILE).read_text().strip()
        except OSError:
            continue
        if re.fullmatch(r"\d+( \d+)?", owner) and not _owner_alive(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed

"""One writer per output file (producer.outlock): a second OutputFile on the same path is
refused naming the first (pid, host), the lock is re-entrant within one process, goes with its
holder and leaves no file behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from producer.outfile import OutputFile
from producer.outlock import OutputBusy, lock_path, output_lock
from tests.waiting import wait_until


def test_a_second_writer_is_refused_naming_the_first(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    refused: list[BaseException] = []

    def second() -> None:
        try:
            OutputFile(out)
        except OutputBusy as exc:
            refused.append(exc)

    with OutputFile(out):
        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
        assert len(refused) == 1
        assert f"pid {os.getpid()} on {socket.gethostname()}" in str(refused[0])
        assert str(out) in str(refused[0])
    assert not lock_path(out).exists()
    with OutputFile(out) as again:  # free once the first closed
        again.append("a", b'{"id": "a"}\n', None)
    assert out.read_text() == '{"id": "a"}\n'


def test_the_lock_is_reentrant_within_one_process(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with output_lock(out):
        with OutputFile(out):
            pass
        with OutputFile(out):  # run's second collect pass
            pass
        assert lock_path(out).exists()
    assert not lock_path(out).exists()


def test_the_lock_goes_with_a_killed_holder(tmp_path: Path) -> None:
    """A holder killed with SIGKILL leaves its lock file, which the next writer takes over."""
    out = tmp_path / "out.jsonl"
    code = (
        "import sys, time\n"
        "from producer.outfile import OutputFile\n"
        f"f = OutputFile({str(out)!r})\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    root = Path(__file__).resolve().parents[2]
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(OutputBusy, match=f"pid {holder.pid} "):
            OutputFile(out)
    finally:
        holder.kill()
        holder.wait()
    assert lock_path(out).exists()  # left behind by the kill

    def opens() -> bool:
        try:
            with OutputFile(out):
                return True
        except OutputBusy:  # NOTE: the kernel drops a dead process's locks as it reaps it
            return False

    wait_until(opens, "the killed holder's lock to go", poll_s=0.05)
    assert not lock_path(out).exists()


def test_existing_duplicate_rows_are_reported(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "a"}\n')
    with OutputFile(out) as output:
        assert output.duplicates == ["a"] and output.ids == {"a", "b"}


def test_a_full_disk_names_the_output_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that finds the disk full fails naming the file (its error line reads
    "OUT: No space left on device"), where the OS error alone names none."""
    import errno

    from producer import outfile

    out = tmp_path / "out.jsonl"
    with OutputFile(out) as output:
        output.append("a", b'{"id": "a"}\n', None)

        def full(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(outfile.os, "fsync", full)
        with pytest.raises(OSError) as raised:
            output.sync()
        monkeypatch.undo()
    assert raised.value.filename == str(out) and raised.value.errno == errno.ENOSPC
    assert outfile.os_error_line(raised.value) == f"{out}: No space left on device"

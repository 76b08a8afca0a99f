"""A private Redis for one run or one test: a redis-server child on a free loopback port, or,
when no redis-server binary exists, fakeredis's TCP server in a background thread."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from fakeredis import TcpFakeServer


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalRedis:
    """Start, stop, kill and restart one private Redis. Use as a context manager.

    With ``appendonly`` (the default) a redis-server keeps an AOF under ``data_dir``; with
    ``fsync="always"`` (the default) a restart on the same port and directory loses no
    acknowledged write. The fakeredis fallback lives in memory only and cannot be restarted.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: Path | None = None,
        appendonly: bool = True,
        fsync: str = "always",
        use_server: bool | None = None,
        ready_timeout_s: float = 10.0,
    ) -> None:
        self.port = port or free_port()
        self.appendonly = appendonly
        self.fsync = fsync
        self.ready_timeout_s = ready_timeout_s
        binary = shutil.which("redis-server")
        self.binary = binary if use_server is not False else None
        if use_server and binary is None:
            raise RuntimeError("redis-server was asked for but is not on PATH")
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="radixq-redis-")
            data_dir = Path(self._tmp.name)
        self.data_dir = data_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._fake: TcpFakeServer | None = None
        self._fake_thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def kind(self) -> str:
        return "redis-server" if self.binary else "fakeredis"

    def start(self) -> LocalRedis:
        if self.binary:
            self._start_server()
        else:
            self._start_fake()
        self._wait_ready()
        return self

    def _start_server(self) -> None:
        assert self.binary is not None
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.fsync,
            "--maxmemory-policy", "noeviction",
            "--protected-mode", "no",
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 - owned by the child
        self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def _start_fake(self) -> None:
        from fakeredis import TcpFakeServer

        fake = TcpFakeServer(("127.0.0.1", self.port), server_type="redis")
        fake.daemon_threads = True
        self._fake = fake
        self._fake_thread = threading.Thread(target=fake.serve_forever, name="fakeredis", daemon=True)
        self._fake_thread.start()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                if self._proc is not None and self._proc.poll() is not None:
                    log = (self.data_dir / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited with {self._proc.returncode}: {log}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.kind} on port {self.port} not ready after {self.ready_timeout_s}s"
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (no shutdown save): what a crash looks like."""
        if self._proc is None:
            raise RuntimeError("only a redis-server child can be killed")
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait()
        self._proc = None

    def restart(self) -> None:
        """Start again on the same port and data directory (after kill or stop)."""
        if self._proc is not None:
            self.stop(cleanup=False)
        self.start()

    def stop(self, cleanup: bool = True) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._fake is not None:
            self._fake.shutdown()
            self._fake.server_close()
            self._fake = None
        if cleanup and self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

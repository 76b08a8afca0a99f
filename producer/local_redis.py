"""A private Redis for one run or one test: a redis-server child on a free loopback port, or,
when no redis-server binary exists, fakeredis's TCP server in a background thread.

The redis-server child runs in its own session (a Ctrl-C meant for its owner does not reach
it) and gets SIGTERM when its owner dies, ``kill -9`` included (NOTE: the kernel sends it when
the *thread* that started the server ends: start it from a thread that outlives it). A temporary folder made for it
holds an ``owner.pid`` file; a folder whose owner died without removing it (``kill -9``) is
removed by the next LocalRedis that makes a folder of its own.
"""

from __future__ import annotations

import errno
import os
import secrets
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
from redis.backoff import NoBackoff
from redis.retry import Retry

from wire.lifetime import start_child
from wire.owned_dirs import OWNER_FILE, process_tag, remove_stale_dirs

if TYPE_CHECKING:
    from fakeredis import TcpFakeServer

DIR_PREFIX = "radixq-redis-"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PORT_ATTEMPTS = 3  # free ports tried when another process takes the one chosen before Redis binds it


class PortTaken(RuntimeError):
    """redis-server could not bind its port: something else listens there."""


class LocalRedis:
    """Start, stop, kill and restart one private Redis. Use as a context manager.

    It listens on 127.0.0.1 only, with protected mode on. With ``with_password`` a
    redis-server requires a random password, which ``url`` carries (it is given to the server
    on stdin, so no command line shows it). With ``appendonly`` (the default) a redis-server
    keeps an AOF under ``data_dir``; with ``fsync="always"`` (the default) a restart on the
    same port and directory loses no acknowledged write. The fakeredis fallback lives in
    memory only, cannot be restarted and takes no password (see ``_start_fake``).

    ``stop`` leaves no server and, unless told otherwise, no folder of its own behind; a
    ``start`` that fails stops the server it started.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: Path | None = None,
        appendonly: bool = True,
        fsync: str = "always",
        use_server: bool | None = None,
        with_password: bool = False,
        ready_timeout_s: float = 10.0,
    ) -> None:
        self.port = port or free_port()
        self._port_given = port is not None
        self.appendonly = appendonly
        self.fsync = fsync
        self.ready_timeout_s = ready_timeout_s
        binary = shutil.which("redis-server")
        self.binary = binary if use_server is not False else None
        if use_server and binary is None:
            raise RuntimeError("redis-server was asked for but is not on PATH")
        self.password = secrets.token_urlsafe(24) if with_password and self.binary else None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            remove_stale_dirs(DIR_PREFIX)
            self._tmp = tempfile.TemporaryDirectory(prefix=DIR_PREFIX, ignore_cleanup_errors=True)
            data_dir = Path(self._tmp.name)
            (data_dir / OWNER_FILE).write_text(f"{process_tag(os.getpid())}\n")
        self.data_dir = data_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._fake: TcpFakeServer | None = None
        self._fake_thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def kind(self) -> str:
        return "redis-server" if self.binary else "fakeredis"

    @property
    def pid(self) -> int | None:
        """The redis-server's pid while it runs (None for fakeredis)."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> LocalRedis:
        for attempt in range(PORT_ATTEMPTS):
            try:
                if self.binary:
                    self._start_server()
                else:
                    self._start_fake()
                self._wait_ready()
                return self
            except PortTaken:
                # NOTE: another process bound the free port first; a port of our own choosing is
                # chosen again (a port the caller named is not)
                self.stop(cleanup=False)
                if self._port_given or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.port = free_port()
            except BaseException:
                self.stop(cleanup=False)
                raise
        raise AssertionError("unreachable")

    def _config(self) -> str:
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            "protected-mode yes",
            f"dir {self.data_dir}",
            'save ""',
            f"appendonly {'yes' if self.appendonly else 'no'}",
            f"appendfsync {self.fsync}",
            "maxmemory-policy noeviction",
            "daemonize no",
            "loglevel warning",
        ]
        if self.password:
            lines.append(f"requirepass {self.password}")
        return "\n".join(lines) + "\n"

    def _start_server(self) -> None:
        assert self.binary is not None
        with open(self.data_dir / "redis.log", "ab") as log:
            # "-": the configuration (password included) comes on stdin, not on the command line
            self._proc = start_child(
                [self.binary, "-"],
                death_signal=signal.SIGTERM,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(self._config().encode())
            self._proc.stdin.close()
        except BrokenPipeError:
            pass  # it exited at once; _wait_ready reports its log

    def _start_fake(self) -> None:
        from fakeredis import TcpFakeServer

        # NOTE: fakeredis's TCP server accepts every client (it does not enforce requirepass),
        # so the fallback has no password; it listens on the loopback interface only.
        try:
            fake = TcpFakeServer(("127.0.0.1", self.port), server_type="redis")
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortTaken(f"fakeredis could not listen on port {self.port}: {exc}") from exc
            raise
        fake.daemon_threads = True
        self._fake = fake
        self._fake_thread = threading.Thread(target=fake.serve_forever, name="fakeredis", daemon=True)
        self._fake_thread.start()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        client = redis.Redis(
            port=self.port,
            password=self.password,
            socket_connect_timeout=0.5,
            socket_timeout=0.5,
            retry=Retry(NoBackoff(), 0),  # this loop is the retry (redis-py's own backs off for seconds)
        )
        try:
            while True:
                if self._proc is not None and self._proc.poll() is not None:
                    log = (self.data_dir / "redis.log").read_text(errors="replace").splitlines()
                    last = " | ".join(line.strip() for line in log[-3:] if line.strip())
                    error = PortTaken if "Address already in use" in last else RuntimeError
                    raise error(f"redis-server exited with {self._proc.returncode}: {last}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError):  # includes LOADING
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

    def stop(self, cleanup: bool = True, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM; SIGKILL after ``timeout_s``); with ``cleanup``, then
        remove the folder this LocalRedis made (a ``data_dir`` given to it is left)."""
        try:
            if self._proc is not None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
                self._proc = None
            if self._fake is not None:
                self._fake.shutdown()
                self._fake.server_close()
                self._fake = None
        finally:
            if cleanup and self._tmp is not None:
                self._tmp.cleanup()
                self._tmp = None

    def __enter__(self) -> LocalRedis:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

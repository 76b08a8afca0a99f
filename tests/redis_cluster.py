"""A local Redis Cluster for tests: three redis-server nodes (``--cluster-enabled yes``) on
free loopback ports, joined by ``redis-cli --cluster create`` (no replicas); a node can be killed and restarted."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.cluster import RedisCluster

from producer.local_redis import free_port
from tests.waiting import LIVENESS_S, wait_until


class LocalCluster:
    """Masters on loopback ports; ``kill`` (SIGKILL) and ``restart`` one of them, which comes
    back with its nodes.conf (same id and slots) and, with ``aof``, its data."""

    def __init__(self, ports: list[int], folder: str, aof: bool) -> None:
        self.ports = ports
        self.folder = folder
        self.aof = aof
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, port: int) -> None:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else ["--appendonly", "no"]
        )
        self.procs[port] = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{port}.conf",
                "--cluster-node-timeout",
                "2000",
                *persistence,
                "--appenddirname",
                f"aof-{port}",
                "--save",
                "",
                "--dir",
                self.folder,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait()

    def restart(self, port: int) -> None:
        self.start(port)
        assert _wait_ping(port, self.procs[port]), f"the node on port {port} did not start again"
        _wait_ok(port)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def running_cluster(nodes: int = 3, aof: bool = False) -> Iterator[LocalCluster]:
    """A running cluster of ``nodes`` masters (no replicas); stopped and removed on exit."""
    cluster = LocalCluster(
        [_cluster_port() for _ in range(nodes)], tempfile.mkdtemp(prefix="radixq-cluster-"), aof
    )
    try:
        for port in cluster.ports:
            cluster.start(port)
        for i, port in enumerate(cluster.ports):
            while not _wait_ping(port, cluster.procs[port]):
                # NOTE: another process took the free port before the node bound it: a new one
                del cluster.procs[port]
                port = cluster.ports[i] = _cluster_port()
                cluster.start(port)
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{p}" for p in cluster.ports],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        for port in cluster.ports:
            _wait_ok(port)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.folder, ignore_errors=True)


@contextmanager
def local_cluster(nodes: int = 3) -> Iterator[list[int]]:
    """The ports of a running cluster of ``nodes`` masters; stopped and removed on exit."""
    with running_cluster(nodes) as cluster:
        yield cluster.ports


def _cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is a valid port and free too."""
    while True:
        port = free_port()
        if port + 10000 < 65536 and _free(port + 10000):
            return port


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_ping(port: int, proc: subprocess.Popen[bytes], timeout_s: float = LIVENESS_S) -> bool:
    """True once the node on ``port`` answers; False when its process ended first (it could
    not bind the port)."""
    answered = False

    def answers_or_ended() -> bool:
        nonlocal answered
        try:
            answered = bool(redis.Redis(host="127.0.0.1", port=port).ping())
        except redis.ConnectionError:
            return proc.poll() is not None
        return True

    wait_until(answers_or_ended, f"the node on port {port} to answer", timeout_s=timeout_s, poll_s=0.05)
    return answered


def _cluster_state(port: int) -> str:
    """``ok`` or ``fail`` as the node on ``port`` sees the cluster ("" when it does not answer)."""
    info = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "cluster", "info"],
        capture_output=True,
        text=True,
    ).stdout
    states = [
        line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("cluster_state:")
    ]
    return states[0] if states else ""


def _wait_ok(port: int, timeout_s: float = LIVENESS_S) -> None:
    wait_until(
        lambda: _cluster_state(port) == "ok", "the cluster to come up", timeout_s=timeout_s, poll_s=0.1
    )


def wait_failed(port: int) -> None:
    """Until the node on ``port`` sees the cluster failed: a node it cannot reach is past the
    node timeout and the slots it served are no longer served."""
    wait_until(lambda: _cluster_state(port) == "fail", f"the node on port {port} to mark the cluster failed")


def cluster_client(ports: list[int]) -> RedisCluster:
    return RedisCluster(host="127.0.0.1", port=ports[0])

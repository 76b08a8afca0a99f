"""A local Redis Cluster for tests: three redis-server nodes (``--cluster-enabled yes``) on
free loopback ports, joined by ``redis-cli --cluster create`` (no replicas)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from redis.cluster import RedisCluster

from producer.local_redis import free_port


@contextmanager
def local_cluster(nodes: int = 3) -> Iterator[list[int]]:
    """The ports of a running cluster of ``nodes`` masters; stopped and removed on exit."""
    ports = [_cluster_port() for _ in range(nodes)]
    folder = tempfile.mkdtemp(prefix="radixq-cluster-")
    procs = []
    try:
        for port in ports:
            procs.append(
                subprocess.Popen(
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
                        "--appendonly",
                        "no",
                        "--save",
                        "",
                        "--dir",
                        folder,
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        for port in ports:
            _wait_ping(port)
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *[f"127.0.0.1:{p}" for p in ports],
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        _wait_ok(ports[0])
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


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


def _wait_ping(port: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            redis.Redis(host="127.0.0.1", port=port).ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _wait_ok(port: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        info = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "cluster", "info"],
            capture_output=True,
            text=True,
        ).stdout
        if "cluster_state:ok" in info:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the cluster did not come up: {info!r}")
        time.sleep(0.1)


def cluster_client(ports: list[int]) -> RedisCluster:
    return RedisCluster(host="127.0.0.1", port=ports[0])

"""A TLS Redis whose certificate the client does not trust: one line and exit code 2, at once
(no retries), for the producer commands and the worker; with the CA given, everything works."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from producer.local_redis import free_port
from tests.conftest import require_redis_server
from tests.integration.procs import radixq, start_worker, subprocess_env
from tests.waiting import LIVENESS_S, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A redis-server speaking TLS only, with a self-signed certificate; (port, cert path)."""
    require_redis_server()
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "2", "-subj", "/CN=localhost"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"]
        + ["--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert)]
        + ["--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    trusted = redis.Redis(host="localhost", port=port, ssl=True, ssl_ca_certs=str(cert))

    def answers() -> bool:
        try:
            return bool(trusted.ping())
        except redis.ConnectionError:
            return False

    wait_until(answers, "the TLS redis-server to start", poll_s=0.05)
    yield port, cert
    server.kill()
    server.wait()


def test_untrusted_certificate_is_one_line_and_exit_2(tls_redis: tuple[int, Path], tmp_path: Path) -> None:
    port, cert = tls_redis
    url = f"rediss://localhost:{port}/0"
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"id": "a", "prompt": "x"}\n')
    for args in (
        ["enqueue", str(jobs)],
        ["status"],
        ["collect", "-o", str(tmp_path / "o.jsonl")],
        ["dlq", "list"],
    ):
        # NOTE: no waiting out a "transient" error: with a retry budget of 600 s, a client that
        # took the refusal for an outage would still be retrying when radixq() gives up (120 s)
        done = radixq(*args, "--redis-url", url, env=subprocess_env(RADIXQ_RETRY_TIMEOUT_S="600"))
        assert done.returncode == 2, (args, done.stderr)
        (line,) = done.stderr.strip().splitlines()
        assert "certificate verify failed" in line and "not trusted" in line, line
    worker = start_worker(url, "w", tmp_path / "w.log")
    assert worker.wait(timeout=LIVENESS_S) == 2
    text = (tmp_path / "w.log").read_text()
    assert "Traceback" not in text
    (line,) = [line for line in text.splitlines() if line.startswith("error: ")]
    assert "certificate verify failed" in line

    trusted = f"{url}?ssl_ca_certs={cert}"
    assert radixq("enqueue", str(jobs), "--redis-url", trusted).returncode == 0

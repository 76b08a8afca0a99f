"""`radixq serve` as a subprocess for the tests, and the OpenAI batch lines they send it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import redis

from producer.local_redis import free_port
from tests.integration.procs import REPO_ROOT, STARTED, subprocess_env
from tests.waiting import wait_until

API_KEY = "sk-radixq-test-key"
PERMISSIONS_PAGE = REPO_ROOT / "docs" / "permissions.md"
CHAT = "/v1/chat/completions"
FINAL = ("completed", "failed", "expired", "cancelled")


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    data_dir: Path

    def client(self, key: str | None = API_KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key or "none", max_retries=0)

    def lock_holder(self, batch_id: str) -> int | None:
        """The pid of the service that holds the batch's lock (producer.outlock's lock file)."""
        try:
            text = (self.data_dir / "work" / f"{batch_id}.rows.jsonl.lock").read_text()
        except OSError:
            return None
        return int(text.split()[1]) if text.startswith("pid ") else None


def least_privilege(redis_url: str) -> str:
    """A URL of ``redis_url``'s server as a user with exactly the serve row of
    docs/permissions.md (on radixq's keys only)."""
    (row,) = [line for line in PERMISSIONS_PAGE.read_text().splitlines() if line.startswith("| serve |")]
    rule = re.split(r"(?<!\\)\|", row)[2].strip().strip("`").replace("\\|", "|").split()
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("ACL", "SETUSER", "rq-serve", "reset", "on", ">serve-password", "~radixq:*",
                          "resetchannels", "-@all", *rule)  # fmt: skip
    admin.close()
    return redis_url.replace("redis://", "redis://rq-serve:serve-password@")


def start_service(
    redis_url: str,
    data_dir: Path,
    log: Path,
    *args: str,
    key: str | None = API_KEY,
    env: dict[str, str] | None = None,
) -> Service:
    """`radixq serve` on a free loopback port, once /health answers."""
    port = free_port()
    keys = ["--api-key", key] if key else []
    with open(log, "ab") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "radixq", "serve", "--redis-url", redis_url, "--port", str(port)]
            + ["--data-dir", str(data_dir), "--poll-s", "0.1", *keys, *args],
            cwd=REPO_ROOT,
            env=subprocess_env(**(env or {})),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    STARTED.append(proc)  # type: ignore[arg-type]
    service = Service(proc, f"http://127.0.0.1:{port}", log, data_dir)

    def healthy() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(service.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, "radixq serve to answer /health", log)
    return service


def request_line(custom_id: str, body: dict[str, Any], url: str = CHAT) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def chat_body(text: str, **fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 4, **fields}


def wait_final(client: openai.OpenAI, batch_id: str, log: Path) -> Any:
    """The batch once its status is final."""
    seen: list[Any] = []

    def final() -> bool:
        seen[:] = [client.batches.retrieve(batch_id)]
        return seen[0].status in FINAL

    wait_until(final, f"batch {batch_id} to end", log, poll_s=0.1)
    return seen[0]


def rows(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def wait_counts(client: openai.OpenAI, batch_id: str, at_least: int, log: Path) -> None:
    """Until the batch's live request counts show ``at_least`` finished requests."""

    def enough() -> bool:
        counts = client.batches.retrieve(batch_id).request_counts
        return counts is not None and counts.completed + counts.failed >= at_least

    wait_until(enough, f"{at_least} requests of {batch_id} to finish", log, poll_s=0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

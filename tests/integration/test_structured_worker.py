"""Structured-output jobs through a real worker (SmolLM2 on CPU, a real redis-server): a
grammar that compiles past ``grammar_timeout_s`` and an invalid regex fail alone with their
field named; a choice job, a JSON job cut by max_tokens and a plain job in the same queue are
answered; the grammar compiler runs as a child of the scheduler process and is gone once the
worker has drained and exited.

Oracles: the rows `collect` writes, ``re``/the choice list/jsonschema on their texts, and the
process table for the compiler."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.procs import REPO_ROOT, cmdline, descendants, radixq, still_running, subprocess_env
from tests.model_fixtures import smollm2_dir  # noqa: F401  (fixture)
from tests.waiting import LIVENESS_S

pytestmark = [pytest.mark.integration, pytest.mark.model]

SLOW_SCHEMA = {
    "type": "object",
    "properties": {f"p{i}": {"type": "string", "pattern": "(a|b){5000}"} for i in range(8)},
}

LONG_SCHEMA = {  # needs more than 3 tokens: cut by max_tokens
    "type": "object",
    "properties": {"story": {"type": "string", "minLength": 200}},
    "required": ["story"],
}


def test_grammar_jobs_fail_alone_and_the_compiler_leaves_with_the_worker(
    redis_url: str,
    tmp_path: Path,
    smollm2_dir: Path,  # noqa: F811
) -> None:
    chat = [{"role": "user", "content": "Is the sky blue?"}]
    jobs = [
        {"id": "slow", "messages": chat, "max_tokens": 8, "json_schema": SLOW_SCHEMA},
        {"id": "badregex", "messages": chat, "max_tokens": 8, "regex": "a(("},
        {"id": "choice", "messages": chat, "max_tokens": 8, "temperature": 0, "choice": ["yes", "no"]},
        {"id": "cut", "messages": chat, "max_tokens": 3, "json_schema": LONG_SCHEMA},
        {"id": "plain", "messages": chat, "max_tokens": 6, "temperature": 0},
    ]
    source = tmp_path / "jobs.jsonl"
    source.write_text("".join(json.dumps(job) + "\n" for job in jobs))
    assert radixq("enqueue", str(source), "--redis-url", redis_url).returncode == 0
    log_path = tmp_path / "worker.log"
    env = subprocess_env(RADIXQ_GRAMMAR_TIMEOUT_S="3")
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "radixq", "worker", "--redis-url", redis_url, "--device", "cpu"],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        out = tmp_path / "out.jsonl"
        collected = radixq(
            "collect", "-o", str(out), "--redis-url", redis_url, "--timeout", "300", timeout_s=320
        )
        assert collected.returncode == 1, collected.stderr + log_path.read_text()  # two error rows
        compilers = {
            pid: started
            for pid, started in descendants(worker.pid).items()
            if "worker.engine.grammar_compiler" in cmdline(pid)
        }
        assert compilers, "no grammar compiler process under the worker"
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0, log_path.read_text()
    assert still_running(compilers) == []

    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    slow, bad = rows["slow"]["error"], rows["badregex"]["error"]
    assert slow["code"] == "invalid_job" and "json_schema: did not compile within 3 s" in slow["message"]
    assert bad["code"] == "invalid_job" and "regex: " in bad["message"]
    choice = rows["choice"]["choices"][0]
    assert rows["choice"]["error"] is None and choice["text"] in ("yes", "no")
    assert choice["finish_reason"] == "stop"
    cut = rows["cut"]["choices"][0]
    assert cut["finish_reason"] == "length" and len(cut["token_ids"]) == 3 and cut["text"].startswith('{"')
    assert rows["plain"]["error"] is None and rows["plain"]["choices"][0]["text"]

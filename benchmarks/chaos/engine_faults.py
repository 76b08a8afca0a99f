"""Engine scenarios: `radixq worker` with the real engine on CPU (a tiny random Llama saved by
tests.model_fixtures) against a private redis-server, faults injected into its scheduler
process with RADIXQ_FAULT (worker/engine/faults.py) or written straight into the jobs
stream. Each returns what it observed (benchmarks.chaos.lab.Observed).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
import redis

from benchmarks.chaos.lab import KEYS, Lab
from benchmarks.chaos.row import Observed
from producer.client import Client
from tests.jobs_stream import pending_count
from wire.keys import FIELD_ID, FIELD_JOB
from wire.schema import Job, SamplingParams
from wire.status import Heartbeat, now_ms

POISON_TOKEN = 77  # the token id RADIXQ_FAULT's raise-on-token rule reacts to
LOAD_TIMEOUT_S = 240  # an engine worker loads in ~10 s alone on 2 cores; more beside others


def save_tiny_model(path: Path) -> Path:
    """A tiny random Llama (no tokenizer: jobs send input_ids), saved for `--model`."""
    from tests.model_fixtures import tiny_hf_model

    tiny_hf_model("llama", spread=0.2, max_position_embeddings=256).save_pretrained(path)
    return path


def job_line(job_id: str, input_ids: list[int], max_tokens: int) -> dict[str, Any]:
    return {
        "id": job_id,
        "input_ids": input_ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }


def innocents(count: int, max_tokens: int) -> list[dict[str, Any]]:
    """Jobs whose prompts never hold POISON_TOKEN."""
    return [job_line(f"j{i:02d}", [5 + i, 6, 7], max_tokens) for i in range(count)]


def poison_line(max_tokens: int = 6) -> dict[str, Any]:
    return job_line("poison", [3, POISON_TOKEN, 4], max_tokens)


def write_lines(path: Path, lines: list[dict[str, Any]]) -> list[str]:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return [line["id"] for line in lines]


def collect(lab: Lab, url: str, out: Path, expect_code: int, label: str = "collect") -> None:
    code = lab.radixq(label, "collect", "-o", out, "--redis-url", url, "--timeout", "300", timeout_s=330)
    lab.expect(code == expect_code, f"{label} exited {code}, expected {expect_code}: {lab.log(label)[-300:]}")


def fresh_heartbeats(lab: Lab, url: str) -> dict[str, Heartbeat]:
    """Every worker's heartbeat, once each was written after this call began (every 2 s)."""
    since_ms = now_ms()
    client = redis.Redis.from_url(url)
    try:
        lab.wait_for(
            lambda: all(beat.last_seen_ms > since_ms for beat in lab.heartbeats(client).values()),
            10,
            "fresh heartbeats",
        )
        return lab.heartbeats(client)
    finally:
        client.close()


def engine_counters(beats: dict[str, Heartbeat]) -> str:
    return ", ".join(
        f"{name}: {beat.engine_restarts} engine restarts, {beat.unattributed_crashes} unblamed crashes"
        for name, beat in sorted(beats.items())
    )


def worker_signal(
    lab: Lab,
    model_dir: Path,
    how: str = "sigint",
    jobs: int = 12,
    max_tokens: int = 40,
    drain_timeout_s: float = 20.0,
) -> Observed:
    """A worker running jobs (4 at a time, each engine step 30 ms slower) gets Ctrl-C (SIGINT
    to its process group) or SIGTERM: within ``drain_timeout_s`` it finishes what it can, gives
    the rest back and exits 0; a second worker then runs the rest."""
    server = lab.redis()
    source, out = lab.dir / "in.jsonl", lab.dir / "out.jsonl"
    ids = write_lines(source, innocents(jobs, max_tokens))
    lab.expect(lab.radixq("enqueue", "enqueue", source, "--redis-url", server.url) == 0, "enqueue failed")
    first = lab.engine_worker(
        server.url,
        model_dir,
        "a",
        "--read-window",
        "4",
        "--drain-timeout-s",
        f"{drain_timeout_s:g}",
        fault="sleep-per-step:30",
    )
    admin = redis.Redis.from_url(server.url)
    lab.wait_for(
        lambda: admin.hlen(KEYS.done) >= 2 and pending_count(admin, KEYS) > 0,
        LOAD_TIMEOUT_S,
        "jobs done while others are held",
    )
    lab.sweep(force=True)  # its scheduler process is tracked before the signal
    held, done = pending_count(admin, KEYS), admin.hlen(KEYS.done)
    signalled = time.monotonic()
    if how == "sigint":
        os.killpg(first.pid, signal.SIGINT)  # what Ctrl-C in its terminal does
    else:
        first.send_signal(signal.SIGTERM)
    lab.wait_for(lambda: first.poll() is not None, 40, f"worker a to exit after {how}")
    took_s = time.monotonic() - signalled
    lab.expect(first.returncode == 0, f"worker a exited {first.returncode} after {how}")
    lab.expect(
        took_s < drain_timeout_s + 1.5, f"drain took {took_s:.1f} s for --drain-timeout-s {drain_timeout_s:g}"
    )
    lab.expect("Traceback" not in lab.log("a"), "worker a logged a traceback")
    lab.expect(pending_count(admin, KEYS) == 0, "jobs left pending on the stopped worker")
    finished = admin.hlen(KEYS.done) - done
    admin.close()
    lab.notes.append(
        f"worker a (--drain-timeout-s {drain_timeout_s:g}) exited {first.returncode} {took_s:.1f} s after "
        f"{how.upper()}, holding {held} jobs: "
        f"{finished} finished while draining, {held - finished} given back"
    )
    lab.engine_worker(server.url, model_dir, "b")
    collect(lab, server.url, out, 0)
    lab.expect(lab.stop("b") == 0, "worker b did not drain and exit 0")
    return Observed(out, ids)


def poison_worker(
    lab: Lab, model_dir: Path, jobs: int = 12, workers: int = 2, max_attempts: int = 2
) -> Observed:
    """A job that crashes the engine (RADIXQ_FAULT=raise-on-token) among innocent ones, under
    `radixq worker`: it alone is dead-lettered, every other job completes."""
    server = lab.redis()
    source, out = lab.dir / "in.jsonl", lab.dir / "out.jsonl"
    lines = innocents(jobs, 6)
    ids = write_lines(source, [*lines[: jobs // 2], poison_line(), *lines[jobs // 2 :]])
    lab.expect(lab.radixq("enqueue", "enqueue", source, "--redis-url", server.url) == 0, "enqueue failed")
    fault = f"raise-on-token:{POISON_TOKEN}"
    for i in range(workers):
        lab.engine_worker(server.url, model_dir, f"e{i}", "--max-attempts", str(max_attempts), fault=fault)
    collect(lab, server.url, out, 1)  # exit 1: the poison's row is an error
    lab.notes.append(f"max_attempts {max_attempts}; {engine_counters(fresh_heartbeats(lab, server.url))}")
    return Observed(out, ids, culprits=["poison"])


def workload_shape(lab: Lab, model_dir: Path, jobs: int = 12, batch: int = 4) -> Observed:
    """The engine crashes on any step of ``batch`` or more requests (RADIXQ_FAULT=raise-on-batch):
    no single job reproduces it, so nobody is blamed and every job completes."""
    server = lab.redis()
    source, out = lab.dir / "in.jsonl", lab.dir / "out.jsonl"
    ids = write_lines(source, innocents(jobs, 6))
    lab.expect(lab.radixq("enqueue", "enqueue", source, "--redis-url", server.url) == 0, "enqueue failed")
    lab.engine_worker(server.url, model_dir, "e0", fault=f"raise-on-batch:{batch}")
    collect(lab, server.url, out, 0)
    beats = fresh_heartbeats(lab, server.url)
    unblamed = beats["e0"].unattributed_crashes if "e0" in beats else 0
    lab.expect(unblamed >= 1, f"no crash counted as a workload shape: {beats}")
    lab.notes.append(engine_counters(beats))
    return Observed(out, ids)


def deep_metadata_job(job_id: str, depth: int) -> bytes:
    """A msgpack job whose metadata is ``depth`` maps deep, written byte by byte (msgspec cannot
    encode what is too deep to decode)."""
    head = msgspec.msgpack.encode({"id": job_id, "v": 1, "input_ids": [1, 2, 3]})
    return (
        bytes([head[0] + 1]) + head[1:] + msgspec.msgpack.encode("metadata") + b"\x81\xa1a" * depth + b"\x01"
    )


# Written straight to the jobs stream, not through enqueue (issue 8, points 1 and 2).
BAD_ID = b"bad\xff\xfe"  # not UTF-8
BAD_ID_SHOWN = "bad\\xff\\xfe"  # how the worker names it in its result
BAD_ENTRIES: list[tuple[bytes, bytes]] = [
    (BAD_ID, msgspec.msgpack.encode({"id": "bad", "v": 1, "input_ids": [1, 2]})),
    (b"deep", deep_metadata_job("deep", 5000)),
    (
        b"POISON",
        msgspec.msgpack.encode(
            {"id": "POISON", "v": 1, "prompt": "Hi", "sampling": {"max_tokens": 4, "top_k": 2**63}}
        ),
    ),
]


def bad_entries(lab: Lab, model_dir: Path, jobs: int = 8) -> Observed:
    """Bad entries XADDed between valid jobs: a non-UTF-8 id, metadata 5,000 deep, top_k 2**63.
    Each gets its own invalid_job row; the valid jobs complete; nothing is dead-lettered."""
    server = lab.redis()
    out = lab.dir / "out.jsonl"
    client = Client.from_url(server.url)
    sampling = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    valid = [Job(id=f"j{i:02d}", input_ids=[5 + i, 6, 7], sampling=sampling) for i in range(jobs)]
    client.enqueue(valid[: jobs // 2])
    for job_id, data in BAD_ENTRIES:
        client.redis.xadd(KEYS.jobs, {FIELD_ID: job_id, FIELD_JOB: data})
    client.enqueue(valid[jobs // 2 :])
    lab.engine_worker(server.url, model_dir, "e0")
    total = jobs + len(BAD_ENTRIES)
    lab.wait_for(lambda: client.redis.hlen(KEYS.done) == total, LOAD_TIMEOUT_S, "every entry answered")
    client.close()
    collect(lab, server.url, out, 1)  # exit 1: the bad entries' rows are errors
    expected = {BAD_ID_SHOWN: "invalid_job", "deep": "invalid_job", "POISON": "invalid_job"}
    return Observed(out, [job.id for job in valid], expected_errors=expected)

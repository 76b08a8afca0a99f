"""`radixq cancel` against a real redis-server and real `radixq worker` processes (the fake
generator with latency, so cancels land mid-run): every id ends with exactly one result - the
real one, or ``cancelled`` - written once into the results stream, and collect writes each id
once, in order. The oracle is the list of ids each test enqueued and the ids it chose to cancel.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from producer.client import Client
from producer.collector import Collector
from tests.integration.procs import REPO_ROOT, radixq, start_worker, subprocess_env
from tests.redis_cluster import cluster_client, running_cluster
from tests.waiting import LIVENESS_S, wait_until
from wire import exits
from wire.keys import QueueKeys
from wire.routing import NO_ROUTING, read_routing
from wire.schema import Job, decode_result

pytestmark = pytest.mark.integration
QUEUE = "cq"
KEYS = QueueKeys(QUEUE)
# 2 workers x 4 jobs at a time x 50 ms: 1,000 jobs would take about 6 s, so a cancel lands mid-run
SLOW = {"RADIXQ_FAKE_CAPACITY": "4", "RADIXQ_FAKE_LATENCY_S": "0.05", "RADIXQ_FAKE_LOG": "1"}


def jobs_of(count: int, prefix: str = "j") -> list[Job]:
    return [Job(id=f"{prefix}{i:04d}", prompt=f"prompt {i}", metadata={"row": i}) for i in range(count)]


def enqueued(redis_url: str, count: int, **options: int) -> tuple[redis.Redis, list[str]]:
    """A client of the test's Redis, and the ids of ``count`` jobs enqueued on QUEUE."""
    client = redis.Redis.from_url(redis_url)
    jobs = jobs_of(count)
    Client(client, QUEUE, **options).enqueue(jobs)
    return client, [job.id for job in jobs]


@contextmanager
def workers(redis_url: str, tmp_path: Path, count: int = 2, **env: str) -> Iterator[list[Path]]:
    """``count`` fake workers on QUEUE (a heartbeat every 0.2 s: the cancel count is looked at
    with it); stopped with SIGTERM at the end, each exiting 0."""
    logs = [tmp_path / f"w{i}.log" for i in range(count)]
    settings = {"RADIXQ_HEARTBEAT_S": "0.2", **SLOW, **env}
    procs = [start_worker(redis_url, f"w{i}", log, "-q", QUEUE, **settings) for i, log in enumerate(logs)]
    try:
        yield logs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in zip(procs, logs, strict=True):
            assert proc.wait(timeout=LIVENESS_S) == 0, log.read_text()[-3000:]


def done(client: redis.Redis) -> int:
    return int(client.hlen(KEYS.done))


def pending(client: redis.Redis) -> int:
    """Entries delivered and not acknowledged, or not delivered yet, over every partition."""
    total = 0
    for stream in KEYS.partitions(read_routing(client, KEYS)[0]):
        for group in client.xinfo_groups(stream) if client.exists(stream) else []:
            total += int(group["pending"]) + int(group["lag"] or 0)
    return total


def results_stream_ids(client: redis.Redis) -> list[str]:
    return [decode_result(fields[b"result"]).id for _, fields in client.xrange(KEYS.results)]


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def cancel(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return radixq("cancel", "-q", QUEUE, "--redis-url", redis_url, *args)


def cancelled_count(proc: subprocess.CompletedProcess[str]) -> int:
    assert proc.stdout.startswith("cancelled "), proc.stdout + proc.stderr
    return int(proc.stdout.split()[1])


def logged(logs: list[Path], what: str) -> list[str]:
    """Job ids the fake generators logged as ``what`` ("finished", "aborted")."""
    marker = f"{what} job "
    return [
        line.split(marker)[1].strip()
        for log in logs
        for line in log.read_text().splitlines()
        if marker in line
    ]


def collect(redis_url: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return radixq("collect", "-q", QUEUE, "--redis-url", redis_url, "-o", str(out), "--quiet", *args)


def check_rows(out: Path, ids: list[str]) -> tuple[set[str], set[str]]:
    """Every id once, in enqueue order; returns (ids with a real result, ids cancelled)."""
    rows = rows_of(out)
    assert [row["id"] for row in rows] == ids
    ok = {row["id"] for row in rows if row["error"] is None}
    cancelled = {
        row["id"] for row in rows if row["error"] is not None and row["error"]["code"] == "cancelled"
    }
    assert ok | cancelled == set(ids), [row for row in rows if row["id"] not in ok | cancelled][:3]
    for row in rows:
        assert row["metadata"] == {"row": int(row["id"][-4:])}, row  # cancelled rows keep their metadata
    return ok, cancelled


def test_cancel_of_a_1000_job_queue_mid_run_with_two_workers_accounts_for_every_id_once(
    redis_url: str, tmp_path: Path
) -> None:
    client, ids = enqueued(redis_url, 1000)
    out = tmp_path / "out.jsonl"
    collecting = subprocess.Popen(  # a collect that waits, running beside the cancel
        [sys.executable, "-m", "radixq", "collect", "-q", QUEUE, "--redis-url", redis_url]
        + ["-o", str(out), "--quiet", "--keep-results"],
        cwd=REPO_ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stuck = ids[:3]  # they run for minutes: held when the cancel comes, so the workers abort them
    slow = {"RADIXQ_FAKE_CAPACITY": "6", "RADIXQ_FAKE_SLOW_IDS": ",".join(stuck), "RADIXQ_FAKE_SLOW_S": "600"}
    try:
        with workers(redis_url, tmp_path, **slow) as logs:
            wait_until(
                lambda: done(client) >= 100 and set(stuck) <= held(client), "100 done, the stuck ones held"
            )
            first = cancel(redis_url)
            assert first.returncode == exits.OK, first.stderr
            assert cancel(redis_url).stdout.startswith("cancelled 0 jobs of 1000")  # idempotent
            _, err = collecting.communicate(timeout=LIVENESS_S)
            assert collecting.returncode == exits.JOBS_FAILED, err  # error rows: the cancelled
            wait_until(lambda: pending(client) == 0, "the workers to acknowledge every entry")
    finally:
        if collecting.poll() is None:
            collecting.kill()
    ok, cancelled = check_rows(out, ids)
    assert len(cancelled) == cancelled_count(first) and ok and cancelled  # it struck mid-run
    assert sorted(results_stream_ids(client)) == ids  # one result each was ever written
    aborted = set(logged(logs, "aborted"))
    assert set(stuck) <= aborted <= cancelled  # the running ones were stopped, and cancelled
    assert len(logged(logs, "finished")) < len(ids)  # and they did not run everything


def test_cancel_ids_cancels_only_those_and_the_others_run(redis_url: str, tmp_path: Path) -> None:
    client, ids = enqueued(redis_url, 1000, partitions=NO_ROUTING)  # one stream: read in order
    chosen = ids[-100:]  # the last: still queued when the cancel comes
    (tmp_path / "ids.txt").write_text("\n".join(chosen) + "\n")
    out = tmp_path / "out.jsonl"
    with workers(redis_url, tmp_path):
        wait_until(lambda: done(client) >= 50, "50 jobs done")
        proc = cancel(redis_url, "--ids", str(tmp_path / "ids.txt"))
        assert proc.returncode == exits.OK and cancelled_count(proc) == 100, proc.stdout + proc.stderr
        assert collect(redis_url, out).returncode == exits.JOBS_FAILED
    ok, cancelled = check_rows(out, ids)
    assert cancelled == set(chosen) and ok == set(ids[:-100])


def test_cancel_by_tag_cancels_that_batch_alone(redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    first, second = jobs_of(200, "a"), jobs_of(200, "b")
    for name, jobs in (("a", first), ("b", second)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text(
            "".join(json.dumps({"id": j.id, "prompt": j.prompt, "metadata": j.metadata}) + "\n" for j in jobs)
        )
        enqueued = radixq(
            "enqueue", str(path), "-q", QUEUE, "--redis-url", redis_url, "--tag", f"batch_{name}"
        )
        assert enqueued.returncode == exits.OK, enqueued.stderr
    out = tmp_path / "out.jsonl"
    with workers(redis_url, tmp_path):
        wait_until(lambda: done(client) >= 50, "50 jobs done")
        proc = cancel(redis_url, "--tag", "batch_b")
        assert proc.returncode == exits.OK, proc.stderr
        assert "of 200 in tag 'batch_b'" in proc.stdout
        assert collect(redis_url, out).returncode == exits.JOBS_FAILED
    ok, cancelled = check_rows(out, [j.id for j in first + second])
    assert ok >= {j.id for j in first} and cancelled and cancelled <= {j.id for j in second}
    assert len(cancelled) == cancelled_count(proc)


def test_cancels_racing_workers_that_complete_the_same_jobs_write_one_result_each(
    redis_url: str, tmp_path: Path
) -> None:
    """Fast workers (no latency) finish jobs while three cancels of the whole queue scan and
    write at once: whichever script runs first for an id writes its one result."""
    client, ids = enqueued(redis_url, 2000)
    counts: list[int] = []
    with workers(redis_url, tmp_path, RADIXQ_FAKE_LATENCY_S="0", RADIXQ_FAKE_CAPACITY="16"):
        wait_until(lambda: done(client) >= 1, "the workers at work")

        def cancel_all() -> None:
            counts.append(Client.from_url(redis_url, QUEUE).cancel().cancelled)

        threads = [threading.Thread(target=cancel_all) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=LIVENESS_S)
        wait_until(lambda: pending(client) == 0, "the workers to acknowledge every entry")
    assert sorted(results_stream_ids(client)) == ids  # one result each, never two
    codes = [client.hget(KEYS.failed, i) for i in ids]
    assert sum(counts) == codes.count(b"cancelled") and 0 < sum(counts) < len(ids), counts


def test_a_cancelled_job_a_crashed_worker_held_is_not_run_by_the_worker_that_reclaims_it(
    redis_url: str, tmp_path: Path
) -> None:
    client, ids = enqueued(redis_url, 12)
    doomed = start_worker(
        redis_url, "doomed", tmp_path / "doomed.log", "-q", QUEUE,
        RADIXQ_FAKE_CAPACITY="4", RADIXQ_FAKE_LATENCY_S=str(10 * LIVENESS_S),
    )  # fmt: skip
    wait_until(lambda: len(client.hgetall(KEYS.workers)) == 1 and pending(client) == 12, "the first worker")
    wait_until(lambda: doomed_holds(client) > 0, "the first worker holding jobs")
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=LIVENESS_S)
    assert cancelled_count(cancel(redis_url)) == 12
    with workers(redis_url, tmp_path, count=1, RADIXQ_MIN_IDLE_S="1", RADIXQ_FAKE_LATENCY_S="0") as logs:
        wait_until(lambda: pending(client) == 0, "the reclaiming worker to acknowledge every entry", logs[0])
    assert logged(logs, "finished") == []
    assert sorted(results_stream_ids(client)) == ids


def held(client: redis.Redis) -> set[str]:
    """Ids of the jobs whose entries are delivered and not acknowledged."""
    found = set()
    for stream in KEYS.partitions(read_routing(client, KEYS)[0]):
        if not client.exists(stream):
            continue
        for pending in client.xpending_range(stream, KEYS.group, "-", "+", 1000):
            entry = pending["message_id"]
            found |= {fields[b"id"].decode() for _, fields in client.xrange(stream, entry, entry)}
    return found


def doomed_holds(client: redis.Redis) -> int:
    return sum(
        len(client.xpending_range(stream, KEYS.group, "-", "+", 100, consumername="doomed"))
        for stream in KEYS.partitions(read_routing(client, KEYS)[0])
        if client.exists(stream)
    )


def test_cancel_command_errors_are_one_line(redis_url: str, tmp_path: Path) -> None:
    both = cancel(redis_url, "--ids", "x", "--tag", "t")
    assert both.returncode == exits.USAGE and both.stderr.startswith("error: --ids and --tag")
    unknown = cancel(redis_url)
    assert unknown.returncode == exits.USAGE and "unknown queue 'cq'" in unknown.stderr
    Client.from_url(redis_url, QUEUE).enqueue(jobs_of(2))
    missing = cancel(redis_url, "--ids", str(tmp_path / "nope"))
    assert missing.returncode == exits.USAGE and "No such file" in missing.stderr
    (tmp_path / "ids").write_text("j0000\nnosuch\n")
    named = cancel(redis_url, "--ids", str(tmp_path / "ids"))
    assert named.returncode == exits.JOBS_FAILED and "cancelled 1 job of 2" in named.stdout
    assert "1 id unknown to queue cq" in named.stderr and "nosuch" in named.stderr
    bad_tag = radixq("enqueue", str(tmp_path / "ids"), "--tag", "", "--redis-url", redis_url)
    assert bad_tag.returncode == exits.USAGE and "--tag: a tag must not be empty" in bad_tag.stderr
    for proc in (both, unknown, missing, named, bad_tag):
        assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_cancel_on_a_redis_cluster_reads_partitions_of_other_slots(tmp_path: Path) -> None:
    """On a 3-node cluster, partition streams 1..15 live in slots of their own: cancel reads
    them from here (XRANGE, then the checks on the queue's slot) and writes on the queue's."""
    with running_cluster(3) as nodes:
        client = cluster_client(nodes.ports)
        producer = Client(client, QUEUE, partitions=16)
        tagged, others = jobs_of(40, "t"), jobs_of(40, "o")
        producer.enqueue(tagged, tag="T")
        producer.enqueue(others)
        assert producer.cancel(tag="T").cancelled == 40
        assert producer.cancel([j.id for j in others[:10]]).cancelled == 10
        assert producer.cancel().cancelled == 30
        report = Collector(client, QUEUE).collect(tmp_path / "out.jsonl", wait=False)
        assert report.missing == [] and report.failed == 80
        _, cancelled = check_rows(tmp_path / "out.jsonl", [j.id for j in tagged + others])
        assert len(cancelled) == 80

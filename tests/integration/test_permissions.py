"""Least privilege (docs/permissions.md): a real redis-server with exactly the users that page's
table lists, every radixq command run by its own user (a worker killed holding jobs, so the
other reclaims and dead-letters them, which `dlq` then requeues; `cancel` in each of its three
scopes while a worker holds some of the jobs, which it aborts); then one permission taken from
each rule, and the command stops with one line that names it (exit 2).

The table is read from the page itself, so a change to a row (collect's, say) is tested as
written."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.procs import FAKE_GENERATOR, REPO_ROOT, radixq, start_worker
from tests.jobs_stream import pending_count, total_len
from tests.waiting import LIVENESS_S, wait_until
from wire import exits
from wire.keys import QueueKeys

pytestmark = pytest.mark.integration
KEYS = QueueKeys()
PAGE = REPO_ROOT / "docs" / "permissions.md"
PASSWORD = "least-privilege"
COMMANDS = ("enqueue", "worker", "collect", "status", "dlq", "cancel", "run")


def page_rules() -> dict[str, list[str]]:
    """radixq command -> the Redis permissions of its rule, as the page's table gives them
    (``run``: the rules of the commands its row names)."""
    rules: dict[str, list[str]] = {}
    named: dict[str, list[str]] = {}
    for line in PAGE.read_text().splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 2 or cells[0] not in COMMANDS:
            continue
        if cells[1].startswith("`+"):
            rules[cells[0]] = cells[1].strip("`").replace("\\|", "|").split()
        else:
            named[cells[0]] = re.findall(r"\b(?:" + "|".join(COMMANDS) + r")\b", cells[1].split("(")[0])
    for command, parts in named.items():
        rules[command] = sorted({permission for part in parts for permission in rules[part]})
    assert sorted(rules) == sorted(COMMANDS), rules
    return rules


def set_user(admin: redis.Redis, name: str, permissions: list[str]) -> str:
    admin.execute_command(
        "ACL",
        "SETUSER",
        name,
        "reset",
        "on",
        f">{PASSWORD}",
        "~radixq:*",
        "resetchannels",
        "-@all",
        *permissions,
    )
    return name


@pytest.fixture
def users(redis_url: str) -> Iterator[tuple[redis.Redis, dict[str, str]]]:
    """An admin client, and each command's URL with a user of exactly its rule."""
    admin = redis.Redis.from_url(redis_url)
    rules = page_rules()
    urls = {
        command: redis_url.replace(
            "redis://", f"redis://{set_user(admin, f'rq-{command}', rule)}:{PASSWORD}@"
        )
        for command, rule in rules.items()
    }
    try:
        yield admin, urls
    finally:
        for command in rules:
            admin.execute_command("ACL", "DELUSER", f"rq-{command}")
        admin.execute_command("ACL", "DELUSER", "rq-lacking")
        admin.close()


def running(proc: subprocess.Popen[bytes], condition: Callable[[], bool], what: str, log: Path) -> None:
    """Wait for ``condition`` while ``proc`` runs; a process that exits first fails the test."""
    wait_until(lambda: proc.poll() is not None or condition(), what, log)
    assert proc.poll() is None, log.read_text()[-3000:]


def write_jobs(path: Path, prefix: str, count: int, start: int = 0) -> list[str]:
    ids = [f"{prefix}{i:03d}" for i in range(start, start + count)]
    with path.open("w") as out:
        for i, job_id in enumerate(ids):
            out.write(
                json.dumps(
                    {"id": job_id, "prompt": f"group {i % 4} opens this prompt. " * 8, "max_tokens": 4}
                )
            )
            out.write("\n")
    return ids


def test_each_command_runs_with_exactly_its_rule(
    users: tuple[redis.Redis, dict[str, str]], tmp_path: Path
) -> None:
    admin, urls = users
    source = tmp_path / "in.jsonl"
    ids = write_jobs(source, "p", 40)
    with source.open("a") as out:
        out.write("not json\n")  # its invalid_job row goes in with the jobs (the script's results branch)
    slow = ids[:2]
    for _ in range(2):  # the second time every id is skipped
        enqueued = radixq("enqueue", str(source), "--redis-url", urls["enqueue"])
        assert enqueued.returncode == exits.JOBS_FAILED and "rejected 1" in enqueued.stdout, enqueued.stderr

    fast = {"RADIXQ_HEARTBEAT_S": "0.2", "RADIXQ_FAKE_CAPACITY": "8"}
    holder = start_worker(
        urls["worker"], "holder", tmp_path / "holder.log", "--max-attempts", "1",
        RADIXQ_FAKE_SLOW_IDS=",".join(slow), RADIXQ_FAKE_SLOW_S="600", **fast,
    )  # fmt: skip
    running(
        holder, lambda: admin.hlen(KEYS.done) == 39, "every job but the slow two", tmp_path / "holder.log"
    )
    holder.send_signal(signal.SIGKILL)  # dies holding the slow two
    holder.wait(timeout=LIVENESS_S)
    log = tmp_path / "w.log"
    worker = start_worker(urls["worker"], "w", log, "--max-attempts", "1", "--min-idle-s", "1", **fast)
    try:
        # reclaimed past max_attempts: dead-lettered, then requeued by dlq and run by the worker
        running(worker, lambda: admin.xlen(KEYS.dead) == 2, "the slow two dead-lettered", log)
        listed = radixq("dlq", "list", "--redis-url", urls["dlq"])
        assert listed.returncode == exits.OK and all(i in listed.stdout for i in slow), listed.stderr
        requeued = radixq("dlq", "requeue", "--redis-url", urls["dlq"])
        assert requeued.returncode == exits.OK and "requeued 2" in requeued.stdout, requeued.stderr
        running(worker, lambda: admin.hlen(KEYS.done) == 41, "the requeued two done", log)
        status = radixq("status", "--json", "--redis-url", urls["status"])
        assert status.returncode == exits.OK, status.stderr
        assert (json.loads(status.stdout)["enqueued"], json.loads(status.stdout)["done"]) == (41, 41)
    finally:
        worker.terminate()
        assert worker.wait(timeout=LIVENESS_S) == exits.OK, log.read_text()[-3000:]
    out = tmp_path / "out.jsonl"
    collected = radixq("collect", "-o", str(out), "--redis-url", urls["collect"], "--quiet")
    assert collected.returncode == exits.JOBS_FAILED, collected.stderr  # the invalid_job row
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows[:40]] == ids and rows[40]["error"]["code"] == "invalid_job"

    small = tmp_path / "small.jsonl"
    run_ids = write_jobs(small, "r", 8)
    ran = tmp_path / "ran.jsonl"
    run = radixq(
        "run", str(small), "-o", str(ran), "-q", "run-queue", "--redis-url", urls["run"],
        "--generator", FAKE_GENERATOR, "--timeout", "120", "--quiet",
    )  # fmt: skip
    assert run.returncode == exits.OK, run.stderr
    assert [json.loads(line)["id"] for line in ran.read_text().splitlines()] == run_ids


def test_cancel_runs_with_exactly_its_rule(users: tuple[redis.Redis, dict[str, str]], tmp_path: Path) -> None:
    """`cancel --ids`, `--tag` and the whole queue, each by the cancel user, while a worker (its
    own user) holds some of the jobs: every job ends as one `cancelled` row, and the worker
    aborts those it holds (it reads the cancel counter and the done marks with its rule)."""
    admin, urls = users
    keys = QueueKeys("cq")
    tagged, untagged = tmp_path / "tagged.jsonl", tmp_path / "untagged.jsonl"
    ids = write_jobs(tagged, "c", 6) + write_jobs(untagged, "c", 6, start=6)
    for source, tag in ((tagged, ["--tag", "batch-1"]), (untagged, [])):
        enqueued = radixq("enqueue", str(source), "-q", "cq", *tag, "--redis-url", urls["enqueue"])
        assert enqueued.returncode == exits.OK, enqueued.stderr
    log = tmp_path / "w.log"
    worker = start_worker(
        urls["worker"], "w", log, "-q", "cq", "--heartbeat-s", "0.2",
        RADIXQ_FAKE_SLOW_IDS=",".join(ids), RADIXQ_FAKE_SLOW_S="600", RADIXQ_FAKE_CAPACITY="2",
    )  # fmt: skip
    try:
        running(worker, lambda: pending_count(admin, keys) > 0, "the worker holding jobs", log)
        chosen = tmp_path / "ids.txt"
        chosen.write_text(f"{ids[0]}\n{ids[6]}\nnever-enqueued\n")
        by_ids = radixq("cancel", "-q", "cq", "--ids", str(chosen), "--redis-url", urls["cancel"])
        assert by_ids.returncode == exits.JOBS_FAILED and "never-enqueued" in by_ids.stderr, by_ids.stderr
        assert "cancelled 2 jobs of 3" in by_ids.stdout, by_ids.stdout
        by_tag = radixq("cancel", "-q", "cq", "--tag", "batch-1", "--redis-url", urls["cancel"])
        assert by_tag.returncode == exits.OK and "cancelled 5 jobs of 6" in by_tag.stdout, by_tag.stderr
        whole = radixq("cancel", "-q", "cq", "--redis-url", urls["cancel"])
        assert whole.returncode == exits.OK and "cancelled 5 jobs of 12" in whole.stdout, whole.stderr
        running(worker, lambda: pending_count(admin, keys) == 0, "the held jobs aborted", log)
        assert "aborting" in log.read_text()
    finally:
        worker.terminate()
        assert worker.wait(timeout=LIVENESS_S) == exits.OK, log.read_text()[-3000:]
    out = tmp_path / "cancelled.jsonl"
    collected = radixq("collect", "-o", str(out), "-q", "cq", "--redis-url", urls["collect"], "--quiet")
    assert collected.returncode == exits.JOBS_FAILED, collected.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == ids
    assert {row["error"]["code"] for row in rows} == {"cancelled"}


# one permission each command needs, taken away: (command, permission, how to run it)
LACKING = [
    ("enqueue", "+rpush", ("enqueue", "{source}")),  # its last write: the batch writes nothing
    ("collect", "+xread", ("collect", "-o", "{out}", "--no-wait")),
    ("status", "+time", ("status",)),
    ("dlq", "+xrange", ("dlq", "list")),
    ("cancel", "+sadd", ("cancel", "--ids", "{ids}")),  # its first step: nothing cancelled yet
]


def one_error_line(text: str) -> str:
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, text[-3000:]
    return errors[0]


def test_a_rule_without_one_permission_stops_with_one_line_naming_it(
    users: tuple[redis.Redis, dict[str, str]], tmp_path: Path
) -> None:
    admin, urls = users
    rules = page_rules()
    source = tmp_path / "in.jsonl"
    write_jobs(source, "p", 5)
    assert radixq("enqueue", str(source), "--redis-url", urls["enqueue"]).returncode == exits.OK
    lacking_url = urls["enqueue"].replace("rq-enqueue", "rq-lacking")
    other = tmp_path / "other.jsonl"
    write_jobs(other, "o", 5)
    ids = tmp_path / "ids.txt"
    ids.write_text("p000\n")
    for command, permission, args in LACKING:
        set_user(admin, "rq-lacking", [p for p in rules[command] if p != permission])
        filled = [arg.format(source=other, out=tmp_path / "out.jsonl", ids=ids) for arg in args]
        proc = radixq(*filled, "--redis-url", lacking_url)  # NOTE: a denial is not retried
        assert proc.returncode == exits.USAGE, (command, proc.stdout, proc.stderr)
        line = one_error_line(proc.stderr)
        assert "no permissions to run the" in line and f"radixq needs: {permission} " in line, line
        assert PASSWORD not in line
    # the enqueue denied its RPUSH wrote nothing of its batch: no record, no entry
    assert admin.hlen(KEYS.enqueued) == total_len(admin) == 5
    assert admin.hlen(KEYS.done) == 0  # the cancel denied its SADD cancelled nothing

    set_user(admin, "rq-lacking", [p for p in rules["worker"] if p != "+xreadgroup"])
    log = tmp_path / "w.log"
    worker = start_worker(lacking_url, "w", log)
    assert worker.wait(timeout=LIVENESS_S) == exits.USAGE
    line = one_error_line(log.read_text())
    assert "no permissions to run the" in line and "radixq needs: +xreadgroup " in line, line

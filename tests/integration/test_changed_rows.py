"""A changed row under a known id is detected and reported, never silently kept (issue 17,
item 3; issue 21's "an id enqueued again with different content").

The fake generator counts a prompt's words as its prompt tokens, so a row's usage tells which
prompt it answered; each row's ``job_digest`` is checked against producer.digest of the job
the test wrote.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from producer.digest import job_digest
from producer.jsonl import parse_line
from tests.integration.procs import FAKE_GENERATOR, radixq, start_worker
from tests.waiting import LIVENESS_S
from wire import exits

pytestmark = pytest.mark.integration


def write(path: Path, prompts: dict[str, str]) -> list[str]:
    lines = [
        json.dumps({"id": job_id, "prompt": prompt, "max_tokens": 4}) for job_id, prompt in prompts.items()
    ]
    path.write_text("\n".join(lines) + "\n")
    return lines


def rows(path: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    return {row["id"]: row for row in map(json.loads, path.read_text().splitlines())}


def test_run_refuses_a_changed_prompt_then_reruns_it_on_request(tmp_path: Path) -> None:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(source, {"a": "one", "b": "two words", "c": "three more words"})
    args = ["run", str(source), "-o", str(out), "--generator", FAKE_GENERATOR, "--timeout", "60"]
    assert radixq(*args).returncode == 0
    before = out.read_text()

    lines = write(source, {"a": "one", "b": "now it has five words", "c": "three more words"})
    refused = radixq(*args)
    assert refused.returncode == exits.USAGE, refused.stderr
    (line,) = refused.stderr.strip().splitlines()  # one line, before any Redis started
    assert line.startswith("error: 1 id changed") and ": b:" in line and "--rerun-changed" in line
    assert out.read_text() == before

    rerun = radixq(*args, "--rerun-changed")
    assert rerun.returncode == 0, rerun.stderr
    after = rows(out)
    assert list(after) == ["a", "b", "c"]  # in input order, each id once
    assert after["b"]["usage"]["prompt_tokens"] == 5
    assert after["b"]["job_digest"] == job_digest(parse_line(lines[1], 2))
    assert [after[i] for i in "ac"] == [
        json.loads(x) for x in before.splitlines() if json.loads(x)["id"] in "ac"
    ]


def test_enqueue_refuses_changed_content_and_reruns_it_on_request(redis_url: str, tmp_path: Path) -> None:
    """While Redis holds a job's records (a collect with --keep-results), an id enqueued again
    with other content is refused, then run again with --rerun-changed."""
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(source, {"a": "one", "b": "two words"})
    enqueue = ["enqueue", str(source), "--redis-url", redis_url]
    collect = ["collect", "-o", str(out), "--redis-url", redis_url, "--timeout", "60", "--keep-results"]
    worker = start_worker(redis_url, "w", tmp_path / "w.log")
    try:
        assert radixq(*enqueue).returncode == 0
        assert radixq(*collect).returncode == 0
        write(source, {"a": "one now has more", "b": "two words"})
        refused = radixq(*enqueue)
        assert refused.returncode == exits.USAGE
        assert "1 id changed" in refused.stderr and "nothing was enqueued" in refused.stderr
        rerun = radixq(*enqueue, "--rerun-changed")
        assert rerun.returncode == 0, rerun.stderr
        assert "enqueued 0, skipped 1 (already enqueued), rejected 0, run again 1 (changed)" in rerun.stdout
        resumed = radixq(*collect)
        assert resumed.returncode == 0, resumed.stderr
        assert "replaced 1 row with new results" in resumed.stdout
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0
    after = rows(out)
    assert list(after) == ["a", "b"] and after["a"]["usage"]["prompt_tokens"] == 4


def test_after_a_trimming_collect_a_changed_job_runs_again_and_replaces_its_row(
    redis_url: str, tmp_path: Path
) -> None:
    """A trimming collect (the default) forgets the jobs it wrote (producer.forget), their
    digests too: enqueueing the file again runs every job again, nothing to refuse. The row of
    the changed one is replaced (its digest differs from its row's), the others kept."""
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(source, {"a": "one", "b": "two words"})
    enqueue = ["enqueue", str(source), "--redis-url", redis_url]
    collect = ["collect", "-o", str(out), "--redis-url", redis_url, "--timeout", "60"]
    worker = start_worker(redis_url, "w", tmp_path / "w.log")
    try:
        assert radixq(*enqueue).returncode == 0
        assert radixq(*collect).returncode == 0
        lines = write(source, {"a": "one now has more", "b": "two words"})
        again = radixq(*enqueue)
        assert again.returncode == 0 and "enqueued 2, skipped 0" in again.stdout, again.stderr
        resumed = radixq(*collect)
        assert resumed.returncode == 0, resumed.stderr
        assert "replaced 1 row with new results" in resumed.stdout
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=LIVENESS_S) == 0
    after = rows(out)
    assert list(after) == ["a", "b"] and after["a"]["usage"]["prompt_tokens"] == 4
    assert after["a"]["job_digest"] == job_digest(parse_line(lines[0], 1))

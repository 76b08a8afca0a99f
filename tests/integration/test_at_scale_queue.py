"""benchmarks/at_scale.py's through-the-queue variant on CPU, as a device run would start it:
the script itself, the tiny preset, the engine alone and a real redis-server -> `radixq worker`
-> collector, interleaved over two rounds. Every queue result is checked by the script (no
error, max_tokens tokens, nothing served from an earlier round's cache); here the report must
hold every run, the queue runs on the engine's KV pool, and the overhead line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_redis_server
from tests.integration.procs import REPO_ROOT, subprocess_env

pytestmark = pytest.mark.integration


def test_tiny_preset_through_the_queue(tmp_path: Path):
    require_redis_server()
    out = tmp_path / "at_scale.json"
    command = [sys.executable, "benchmarks/at_scale.py", "--preset", "tiny", "--variants", "engine,queue"]
    command += [
        "--rounds",
        "2",
        "--work-dir",
        str(tmp_path / "work"),
        "--out",
        str(out),
        "--timeout-s",
        "120",
    ]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [(r["variant"], r["round"]) for r in runs] == [
        ("engine", 0),
        ("queue", 0),
        ("engine", 1),
        ("queue", 1),
    ]
    assert {r["output_tokens"] for r in runs} == {6 * 12}
    # the queue's worker ran on the engine-alone run's KV pool (its TOML pins num_pages)
    toml = (tmp_path / "work" / "atscale-1-queue.toml").read_text()
    assert f"num_pages = {runs[0]['kv_pages']}" in toml
    rows = {row["variant"]: row for row in report["table"]}
    queue, engine = rows["queue"], rows["engine"]
    assert queue["overhead"] == pytest.approx(queue["median_s"] / engine["median_s"] - 1)
    assert "queue overhead (queue vs engine):" in done.stdout
    assert done.stdout.count("round ") == 4  # one line per run as it ends


def test_tensor_parallel_and_pool_variants_on_one_start(tmp_path: Path):
    """queue-tp2 (one worker, its model over two ranks) and queue-2w (two workers on one queue),
    two rounds back to back on one start each (--same-workers): every result checked by the
    script, both workers up before the clock starts, the TOML naming the ranks."""
    require_redis_server()
    out = tmp_path / "at_scale.json"
    command = [sys.executable, "benchmarks/at_scale.py", "--preset", "tiny"]
    command += ["--variants", "queue-tp2,queue-2w", "--rounds", "2", "--same-workers"]
    command += ["--work-dir", str(tmp_path / "work"), "--out", str(out)]
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [(r["variant"], r["round"]) for r in runs] == [
        ("queue-tp2", 0),
        ("queue-tp2", 1),
        ("queue-2w", 0),
        ("queue-2w", 1),
    ]
    assert {r["output_tokens"] for r in runs} == {6 * 12}
    assert "tensor_parallel_size = 2" in (tmp_path / "work" / "atscale-0-queue-tp2.toml").read_text()
    log = (tmp_path / "work" / "atscale-0-queue-2w.log").read_text()
    assert "worker atscale-0-queue-2w-0 consuming" in log and "worker atscale-0-queue-2w-1 consuming" in log
    assert "back to back on one start of each variant" in done.stdout


def test_several_presets_through_the_queue_each_on_its_own_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Two presets in one call (the driver in this process, a second preset of another shape
    added to PRESETS): each preset's queue run has a queue, TOML and log of its own, pinned to
    its own engine-alone run's KV pool, and returns its own shape's tokens (the script checks
    every result: one left on a shared queue by the other preset would fail it)."""
    require_redis_server()
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import at_scale

    tiny = at_scale.PRESETS["tiny"]
    monkeypatch.setitem(
        at_scale.PRESETS, "tiny-b", at_scale.Preset(tiny.model, 3, 20, 6, 2, 256, token_id_high=500)
    )
    monkeypatch.setenv("PYTHONPATH", subprocess_env()["PYTHONPATH"])
    work, out = tmp_path / "work", tmp_path / "at_scale.json"
    argv = ["--preset", "tiny,tiny-b", "--variants", "engine,queue", "--rounds", "1"]
    at_scale.main([*argv, "--work-dir", str(work), "--out", str(out), "--timeout-s", "120"])
    runs = json.loads(out.read_text())["runs"]
    assert [(r["preset"], r["variant"]) for r in runs] == [
        ("tiny", "engine"),
        ("tiny", "queue"),
        ("tiny-b", "engine"),
        ("tiny-b", "queue"),
    ]
    assert [r["output_tokens"] for r in runs] == [6 * 12, 6 * 12, 3 * 6, 3 * 6]
    for name, max_seq_len, engine in (("tiny", 48, runs[0]), ("tiny-b", 32, runs[2])):
        toml = (work / f"atscale-0-{name}-queue.toml").read_text()
        assert f"max_seq_len = {max_seq_len}" in toml and f"num_pages = {engine['kv_pages']}" in toml
        assert (
            f"worker atscale-0-{name}-queue-0 consuming" in (work / f"atscale-0-{name}-queue.log").read_text()
        )

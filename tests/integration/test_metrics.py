"""Prometheus metrics: a running worker's /metrics (fake generator, real redis-server) counts
what happened, as Redis and the collected output record it; `status --prometheus` parses as
the exposition format; every metric the example Grafana dashboard queries exists; `status`
shows rate, ETA and queue lag."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from producer.client import Client
from producer.local_redis import free_port
from tests.integration.procs import REPO_ROOT, radixq, start_worker
from tests.waiting import wait_until
from wire.keys import QueueKeys
from wire.schema import Job, SamplingParams, decode_result
from wire.status import serving

pytestmark = pytest.mark.integration

DASHBOARD = REPO_ROOT / "examples" / "grafana-dashboard.json"


def scrape(port: int) -> dict[str, float]:
    """Every sample of /metrics: 'name{label="v",...}' (labels sorted, queue and model left out) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return samples(reply.read().decode())


def samples(text: str) -> dict[str, float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(
                f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k not in ("queue", "model")
            )
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def names(text: str) -> set[str]:
    """The names a query can use: families and their samples (x_total, x_bucket, x_count...)."""
    found = set()
    for family in text_string_to_metric_families(text):
        found |= {family.name, *(sample.name for sample in family.samples)}
    return found


def enqueue(redis_url: str, jobs: list[Job]) -> None:
    client = Client.from_url(redis_url, "default", partitions=0)  # one stream: a ghost reads it below
    try:
        client.enqueue(jobs)
    finally:
        client.close()


def test_worker_metrics_count_what_happened(redis_url: str, tmp_path: Path) -> None:
    failing = {"m4", "m9", "m13"}
    jobs = [
        Job(
            id=f"m{i}",
            prompt="a b c " * (i % 3 + 1),
            metadata={"fake_error": "internal"} if f"m{i}" in failing else {},
        )
        for i in range(20)
    ]
    enqueue(redis_url, jobs)
    keys = QueueKeys()
    client = redis.Redis.from_url(redis_url)
    # A consumer that reads the first two entries and vanishes: with --max-attempts 1 the
    # worker dead-letters them when it reclaims them (their second delivery).
    client.xreadgroup(keys.group, "ghost", {keys.jobs: ">"}, count=2)
    port = free_port()
    start_worker(
        redis_url,
        "w",
        tmp_path / "w.log",
        *("--metrics-port", str(port), "--max-attempts", "1", "--min-idle-s", "0.2"),
        RADIXQ_FAKE_LATENCY_S="0.05",
    )
    wait_until(lambda: client.hlen(keys.done) == len(jobs), "every job done")
    out = tmp_path / "out.jsonl"
    assert radixq("collect", "-o", str(out), "--redis-url", redis_url, "--keep-results").returncode == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ok = [row for row in rows if not row.get("error")]
    metrics = scrape(port)
    dead = [row["id"] for row in rows if (row.get("error") or {}).get("code") == "dead_letter"]
    assert sorted(dead) == ["m0", "m1"] and client.xlen(keys.dead) == 2
    assert metrics["radixq_jobs_started_total"] == len(jobs) - len(dead)
    assert metrics["radixq_jobs_finished_total"] == len(ok) == len(jobs) - len(failing) - len(dead)
    assert metrics['radixq_jobs_failed_total{code="internal"}'] == len(failing)
    assert metrics['radixq_jobs_failed_total{code="dead_letter"}'] == len(dead)
    assert metrics["radixq_jobs_dead_lettered_total"] == len(dead)
    assert client.hlen(keys.failed) == len(failing) + len(dead)
    assert metrics["radixq_prompt_tokens_total"] == sum(row["usage"]["prompt_tokens"] for row in ok)
    assert metrics["radixq_output_tokens_total"] == sum(row["usage"]["completion_tokens"] for row in ok)
    assert metrics["radixq_cached_tokens_total"] == sum(row["usage"]["cached_tokens"] for row in ok)
    assert metrics["radixq_job_queue_wait_seconds_count"] == len(jobs) - len(dead)
    assert metrics["radixq_job_latency_seconds_count"] == len(ok)
    stored = [decode_result(fields[b"result"]) for _, fields in client.xrange(keys.results)]
    latencies = [
        (r.timings.finished_at_ms - r.timings.started_at_ms) / 1000 for r in stored if r.error is None
    ]
    assert len(latencies) == len(ok)
    assert metrics["radixq_job_latency_seconds_sum"] == pytest.approx(sum(latencies), abs=1e-6)
    assert metrics['radixq_job_latency_seconds_bucket{le="0.01"}'] == sum(t <= 0.01 for t in latencies) == 0
    assert metrics["radixq_running_jobs"] == 0

    # The dashboard names only metrics that exist: the worker's and status --prometheus's.
    status = radixq("status", "--redis-url", redis_url, "--prometheus")
    assert status.returncode == 0, status.stderr
    queue = samples(status.stdout)
    assert queue["radixq_queue_done"] == len(jobs) and queue["radixq_queue_failed"] == len(failing) + 2
    assert queue["radixq_queue_dead_lettered"] == 2
    workers = queue['radixq_queue_workers{state="alive"}'] + queue['radixq_queue_workers{state="dead"}']
    assert workers == 2 and queue['radixq_queue_workers{state="alive"}'] >= 1  # w, and the ghost
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        known = names(reply.read().decode()) | names(status.stdout)
    exprs = [
        target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for target in panel["targets"]
    ]
    named = {
        re.sub(r"_(bucket|count|sum|total)$", "", name)
        for e in exprs
        for name in re.findall(r"radixq_\w+", e)
    }
    assert len(named) >= 10
    assert named <= known, f"the dashboard queries metrics no one exports: {sorted(named - known)}"


def test_status_shows_rate_eta_and_queue_lag(redis_url: str, tmp_path: Path) -> None:
    enqueue(redis_url, [Job(id=f"s{i}", prompt="x") for i in range(120)])
    time.sleep(0.5)  # simulated latency: the queued jobs wait 0.5 s for a worker
    before = json.loads(radixq("status", "--redis-url", redis_url, "--json").stdout)
    assert before["queue_lag_s"] >= 0.5 and before["eta_s"] is None and before["jobs_per_s"] == 0
    start_worker(redis_url, "w", tmp_path / "w.log", RADIXQ_FAKE_LATENCY_S="0.2", RADIXQ_FAKE_CAPACITY="2")
    client = redis.Redis.from_url(redis_url)
    snaps: list[dict] = []

    def rate_shown() -> bool:  # a heartbeat (every 2 s) carries the rate of the jobs done so far
        snaps.append(json.loads(radixq("status", "--redis-url", redis_url, "--json").stdout))
        return (
            client.hlen(QueueKeys().done) >= 16 and snaps[-1]["consumers"][0]["heartbeat"]["jobs_per_s"] > 0
        )

    wait_until(rate_shown, "a heartbeat with the rate", tmp_path / "w.log", poll_s=0.2)
    snap = snaps[-1]
    rate = snap["consumers"][0]["heartbeat"]["jobs_per_s"]
    assert 0 < rate <= 11  # two at a time, 0.2 s each: 10 jobs/s at most (a loaded box gives fewer)
    assert snap["jobs_per_s"] == rate
    left = snap["queued"] + snap["in_flight"]
    assert left > 0 and snap["eta_s"] == pytest.approx(left / rate)
    assert snap["queue_lag_s"] > 0.5
    text = radixq("status", "--redis-url", redis_url).stdout
    assert re.search(r"rate +[\d.]+ jobs/s", text) and re.search(r"ETA +\d+ s", text), text
    assert re.search(r"queue lag +[\d.]+ s", text) and re.search(
        r"consumer w: running, .* jobs/s, \d+ done", text
    )


def test_engine_worker_exports_ttft_tpot_running_waiting_and_its_model(
    redis_url: str, tmp_path: Path
) -> None:
    """Issue 17, item 6, on a live scrape of a real engine worker (a tiny random Llama on CPU,
    the torch backend): before any job its gauges read the pool it was given (not 0); after
    the jobs, the TTFT and TPOT histograms hold one sample per finished job whose sums agree
    with the timings in the results the worker wrote, each first token falls between the
    job's start and its end, and every sample carries the served model name."""
    from tests.integration.procs import start_engine_worker
    from tests.model_fixtures import tiny_hf_model

    model_dir = tmp_path / "tiny"
    tiny_hf_model("llama", max_position_embeddings=256).save_pretrained(model_dir)
    port = free_port()
    log_path = tmp_path / "w.log"
    start_engine_worker(
        redis_url,
        model_dir,
        log_path,
        *("--metrics-port", str(port), "--served-model-name", "tiny-served"),
        RADIXQ_NUM_PAGES="96",
        RADIXQ_PAGE_SIZE="4",
        RADIXQ_MAX_RUNNING_REQS="3",
    )
    client = redis.Redis.from_url(redis_url)
    keys = QueueKeys()
    wait_until(lambda: len(serving(client, keys)) == 1, "the engine worker's heartbeat, its model loaded")
    idle = scrape(port)
    assert idle["radixq_kv_pool_pages"] == 96 and idle["radixq_requests_waiting"] == 0
    sampling = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    jobs = [Job(id=f"e{i}", input_ids=[5 + i, 6, 7, 8], sampling=sampling) for i in range(8)]
    enqueue(redis_url, jobs)
    wait_until(lambda: client.hlen(keys.done) == len(jobs), "every job done")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    metrics = samples(text)
    stored = [decode_result(fields[b"result"]) for _, fields in client.xrange(keys.results)]
    assert len(stored) == len(jobs) and all(r.error is None and r.model == "tiny-served" for r in stored)
    timings = [r.timings for r in stored]
    assert all(t.started_at_ms <= t.first_token_at_ms <= t.finished_at_ms for t in timings)
    ttft = [(t.first_token_at_ms - t.started_at_ms) / 1000 for t in timings]
    tpot = [(t.finished_at_ms - t.first_token_at_ms) / 1000 / 11 for t in timings]
    assert metrics["radixq_time_to_first_token_seconds_count"] == len(jobs)
    assert metrics["radixq_time_to_first_token_seconds_sum"] == pytest.approx(sum(ttft), abs=1e-6)
    assert metrics["radixq_time_per_output_token_seconds_count"] == len(jobs)
    assert metrics["radixq_time_per_output_token_seconds_sum"] == pytest.approx(sum(tpot), abs=1e-6)
    assert metrics["radixq_requests_running"] == 0 and metrics["radixq_requests_waiting"] == 0
    assert metrics["radixq_kv_pool_pages"] == 96 and metrics["radixq_kv_pages_used"] > 0
    families = list(text_string_to_metric_families(text))
    # NOTE: radixq_worker_loading alone has no model label: it is served before the model is known
    radixq_samples = [
        s
        for f in families
        if f.name.startswith("radixq_") and f.name != "radixq_worker_loading"
        for s in f.samples
    ]
    assert metrics["radixq_worker_loading"] == 0
    assert radixq_samples and all(s.labels.get("model") == "tiny-served" for s in radixq_samples)

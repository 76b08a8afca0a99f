"""A tensor-parallel worker (TP=2 on CPU over gloo) behind a real redis-server: kill -9 of the
follower rank mid-run stops the group (the leader's watchdog), the worker starts a new group,
every job is answered exactly once with the tokens transformers gives, and no rank is left
behind (kill -9 of a leader takes its follower along); at the drain, both ranks leave the
group the normal way (worker.distributed.close_tp: destroyed)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from producer.client import Client
from tests.integration.procs import children, descendants, start_engine_worker, still_running
from tests.integration.tp_kill import (
    READY_LINE,
    assert_drained_cleanly,
    kill_rank1_mid_run,
    results_once,
    stop_worker,
)
from tests.model_fixtures import hf_from_dir, hf_greedy, tiny_hf_model
from tests.waiting import wait_until
from wire.schema import Job, SamplingParams

pytestmark = pytest.mark.integration

TP_SHAPE = dict(
    hidden_size=96, num_attention_heads=12, num_key_value_heads=6, head_dim=8, intermediate_size=192
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tp-worker-llama")
    tiny_hf_model("llama", spread=0.2, **TP_SHAPE).save_pretrained(path)
    return path


def test_kill_9_of_a_follower_rank_restarts_the_group_and_loses_nothing(
    redis_url: str, model_dir: Path, tmp_path: Path
) -> None:
    prompts = [[3 + i, 40 + i, 7, 9 + 2 * i, 100 + i] for i in range(10)]
    sampling = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    work = [Job(id=f"j{i}", input_ids=p, sampling=sampling) for i, p in enumerate(prompts)]
    client = Client.from_url(redis_url)
    client.enqueue(work)
    log_path = tmp_path / "w.log"
    # 3 at a time, each step 40 ms longer (the leader only): the kill lands mid-run
    worker = start_engine_worker(
        redis_url,
        model_dir,
        log_path,
        "--tp",
        "2",
        "--read-window",
        "3",
        fault="sleep-per-step:40",
        RADIXQ_NUM_PAGES="64",
        RADIXQ_PAGE_SIZE="4",
        RADIXQ_CPU_THREADS="1",
    )
    try:
        restart = kill_rank1_mid_run(client, worker, log_path, len(work))
        print(restart.describe())
        assert "tensor-parallel rank 1 exited (signal SIGKILL)" in log_path.read_text()
        results = results_once(client, [j.id for j in work])
        (new_leader,) = children(worker.pid, "worker.scheduler.main")
        assert new_leader != restart.leader and len(children(new_leader, "worker.scheduler.follower")) == 1
        # the leader killed in turn: its follower dies with it (parent-death signal), no orphan
        (new_follower,) = children(new_leader, "worker.scheduler.follower")
        new_group = descendants(new_leader) | {new_leader: descendants(worker.pid)[new_leader]}
        os.kill(new_leader, signal.SIGKILL)
        wait_until(
            lambda: not still_running(new_group),
            f"follower {new_follower} to die with its leader",
            log_path=log_path,
        )
        hf = hf_from_dir(model_dir)
        for result in results:  # the jobs that ran again too: the tokens one engine gives
            prompt = prompts[int(result.id[1:])]
            assert result.choices[0].token_ids == hf_greedy(hf, prompt, 12), result.id
        wait_until(  # the third group serves (the drain below then meets a loaded group)
            lambda: log_path.read_text().count(READY_LINE) >= 2,
            "the group started after the leader's kill to be ready",
            log_path=log_path,
        )
    finally:
        everything = stop_worker(worker)
    assert_drained_cleanly(worker, everything, log_path)

"""The scheduling policy: cached prefixes first, siblings together, wanted prefixes evicted
last, an age bound, work per step independent of the number waiting; and, end to end on the
scheduler, shuffled arrival served as well as grouped arrival (one miss per prefix group)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tests.model_fixtures import hf_greedy, tiny_hf_model
from wire.schema import SamplingParams
from worker.kvcache.allocator import PageAllocator
from worker.kvcache.radix import RadixCache
from worker.scheduler import InMemoryIO, build_scheduler
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import GenerateRequest, RequestFinished
from worker.scheduler.req import PendingReq, RequestGroup
from worker.scheduler.waiting import WaitQueue

KEY_LEN = 4


def _pending(uid: str, input_ids: list[int]) -> PendingReq:
    group = RequestGroup(uid=uid, prompt_len=len(input_ids), n=1)
    return PendingReq(group, 0, input_ids, SamplingParams(max_tokens=1), len(input_ids) + 1, 0)


def _first_offered(queue: WaitQueue) -> PendingReq:
    offer = queue.offer()
    bucket = next(offer)
    head = bucket.reqs[0]
    offer.close()
    return head


def _admit_head(queue: WaitQueue) -> PendingReq:
    offer = queue.offer()
    bucket = next(offer)
    head = bucket.reqs[0]
    queue.take(bucket, None, 0)
    offer.close()
    return head


def test_cached_bucket_goes_first_longest_first() -> None:
    cache = RadixCache(1)
    queue = WaitQueue("lpm", KEY_LEN, max_overtakes=100, cache=cache)
    old = _pending("old", [9, 9, 9, 9, 1])
    short = _pending("short", [1, 2, 3, 4, 5])
    long = _pending("long", [5, 6, 7, 8, 9])
    for p in (old, short, long):
        queue.add(p)
    assert _first_offered(queue) is old  # nothing cached: oldest bucket first
    cache.insert([1, 2, 3, 4], torch.arange(4, dtype=torch.int32))
    cache.insert([5, 6, 7, 8, 9, 10], torch.arange(4, 10, dtype=torch.int32))
    queue.cached(_pending("x", [1, 2, 3, 4, 0]), cache.match([1, 2, 3, 4]).handle, 4)
    queue.cached(_pending("y", [5, 6, 7, 8, 0]), cache.match([5, 6, 7, 8, 9, 10]).handle, 6)
    offered = list(queue.offer())
    assert [b.reqs[0] for b in offered] == [long, short, old]


def test_fcfs_keeps_arrival_order() -> None:
    cache = RadixCache(1)
    queue = WaitQueue("fcfs", KEY_LEN, max_overtakes=100, cache=cache)
    reqs = [_pending(str(i), [i % 2] * 5 + [i]) for i in range(6)]
    for p in reqs:
        queue.add(p)
    queue.cached(reqs[1], None, 5)  # ignored under fcfs
    assert [_admit_head(queue) for _ in reqs] == reqs


def test_age_bound_serves_the_oldest_after_max_overtakes() -> None:
    """A cached bucket that keeps getting new members may overtake the oldest request only
    ``max_overtakes`` times."""
    cache = RadixCache(1)
    cache.insert([1, 2, 3, 4], torch.arange(4, dtype=torch.int32))
    queue = WaitQueue("lpm", KEY_LEN, max_overtakes=3, cache=cache)
    oldest = _pending("cold", [7, 7, 7, 7, 7])
    queue.add(oldest)
    admitted = []
    for i in range(8):
        hot = _pending(f"hot{i}", [1, 2, 3, 4, 10 + i])
        queue.add(hot)
        queue.cached(hot, cache.match([1, 2, 3, 4]).handle, 4)
        admitted.append(_admit_head(queue))
        if admitted[-1] is oldest:
            break
    assert admitted[-1] is oldest and len(admitted) == 5  # 4 overtakes > 3, then the oldest


def test_wanted_prefixes_are_evicted_last() -> None:
    cache, alloc = RadixCache(2), PageAllocator(8, 2)
    for tokens in ([1, 1, 1, 1], [2, 2, 2, 2]):
        locs = alloc.allocate(2)
        cache.insert(tokens, locs)
    wanted = cache.match([1, 1, 1, 1])  # also the least recently used once [2, ...] is touched
    cache.match([2, 2, 2, 2])
    cache.want(wanted.handle)
    evicted = cache.evict(4)
    assert sorted(evicted.tolist()) != sorted(wanted.locations.tolist())
    assert cache.match([1, 1, 1, 1]).length == 4 and cache.match([2, 2, 2, 2]).length == 0
    cache.unwant(wanted.handle)
    assert cache.evict(4).numel() == 4 and cache.num_cached_tokens == 0


def test_offer_work_does_not_grow_with_the_number_waiting() -> None:
    """With 10,000 cold buckets waiting, a cached bucket is offered first and choosing it
    touches only that bucket (no scan of everything waiting)."""
    cache = RadixCache(1)
    queue = WaitQueue("lpm", KEY_LEN, max_overtakes=10**6, cache=cache)
    rng = random.Random(0)
    for i in range(10_000):
        queue.add(_pending(f"cold{i}", [rng.randrange(10, 10**6) for _ in range(KEY_LEN + 1)]))
    cache.insert([1, 2, 3, 4], torch.arange(4, dtype=torch.int32))
    hot = _pending("hot", [1, 2, 3, 4, 5])
    queue.add(hot)
    queue.cached(hot, cache.match([1, 2, 3, 4]).handle, 4)
    assert _admit_head(queue) is hot
    assert len(queue) == 10_000 and "hot" not in {p.group.uid for b in queue.buckets.values() for p in b.reqs}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("policy-llama")
    tiny_hf_model("llama", spread=0.2).save_pretrained(path)
    return path


def test_shuffled_groups_hit_the_cache_like_grouped_ones(tiny_dir: Path) -> None:
    """4 groups x 3 jobs sharing a 40-token prefix, shuffled, on a pool that holds about two
    prefixes: lpm misses each prefix once (siblings follow their group's first job, whose
    prefix is computed once in the batch); every output equals HF greedy."""
    rng = random.Random(3)
    prefixes = [[rng.randrange(1, 250) for _ in range(40)] for _ in range(4)]
    prompts = [p + [rng.randrange(1, 250) for _ in range(4)] for p in prefixes for _ in range(3)]
    rng.shuffle(prompts)
    config = SchedulerProcessConfig.from_options(
        str(tiny_dir),
        device="cpu",
        attention="torch",
        page_size=4,
        num_pages=30,
        max_prefill_tokens=256,
    )
    io = InMemoryIO()
    scheduler = build_scheduler(config, io)
    sampling = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        io.put(GenerateRequest(uid=str(i), input_ids=prompt, sampling=sampling))
    last = None
    for _ in range(500):
        last = scheduler.step(last, block=False)
        scheduler.check_integrity(last)
        if last is None and scheduler.idle:
            break
    finished = {m.uid: m for m in io.take_all() if isinstance(m, RequestFinished)}
    assert sum(m.cached_tokens for m in finished.values()) == 4 * 2 * 40  # one miss per group
    model = tiny_hf_model("llama", spread=0.2)
    for i, prompt in enumerate(prompts):
        assert finished[str(i)].choices[0].token_ids == hf_greedy(model, prompt, 3)

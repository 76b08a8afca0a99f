"""Shared-prefix groups (worker.scheduler.groups): the choice of groups and the cost rule.

The radix tests check the property cascade attention relies on against the cache's own
locations: every member of a group holds the same KV locations for the group's prefix, and
that prefix is the longest common whole-page prefix of the members' cached tokens.
"""

from __future__ import annotations

import pytest
import torch

from worker.kvcache.naive import NaiveCache
from worker.kvcache.radix import RadixCache
from worker.scheduler.groups import Group, cascade_pays, choose_groups, saved_kv_tokens, to_prefix_groups


def test_one_shared_node_makes_one_group():
    """Three requests under node P (48 tokens) with their own tails, one request elsewhere."""
    paths = [[("P", 48), ("t0", 64)], [("P", 48), ("t1", 80)], [("Q", 16)], [("P", 48)]]
    groups = choose_groups(paths)
    assert groups == [Group(48, (0, 1, 3))]
    assert saved_kv_tokens(groups) == 48 * 2


def test_subgroups_win_when_they_save_more():
    """Under a short common node, two long sub-prefixes: two groups save more than one."""
    paths = [[("R", 16), ("A", 400)]] * 2 + [[("R", 16), ("B", 320)]] * 3
    groups = choose_groups(paths)
    assert groups == [Group(400, (0, 1)), Group(320, (2, 3, 4))]
    assert saved_kv_tokens(groups) == 400 + 2 * 320 > 16 * 4


def test_one_group_when_splitting_saves_less():
    """Under a long node, two short sub-prefixes: one group over all of them."""
    paths = [[("R", 960), ("A", 976)]] * 2 + [[("R", 960), ("B", 992)], [("R", 960)]]
    assert choose_groups(paths) == [Group(960, (0, 1, 2, 3))]


def test_limits_keep_prefixes_within_cached_tokens():
    """A request may only share what it has cached: its path is cut at its limit."""
    paths = [[("P", 32), ("S", 64)], [("P", 32), ("S", 64)], [("P", 32), ("S", 64)]]
    assert choose_groups(paths) == [Group(64, (0, 1, 2))]
    # request 2 has only 40 tokens cached: it can share P but not S. The pair under S saves
    # 64 x 1, all three under P 32 x 2: a tie, which goes to the one group at the upper node
    assert choose_groups(paths, [64, 64, 40]) == [Group(32, (0, 1, 2))]
    assert choose_groups(paths, [64, 64, 48]) == [Group(32, (0, 1, 2))]
    # with 16 cached it shares nothing; the other two share all of S
    assert choose_groups(paths, [64, 64, 16]) == [Group(64, (0, 1))]


def test_no_groups_without_sharing():
    assert choose_groups([[], [("A", 16)], [("B", 16)]]) == []
    assert choose_groups([]) == []
    assert saved_kv_tokens([]) == 0


@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_paths_group_requests_that_share_pages(page_size):
    """Prompts from a radix cache: group members share their prefix's locations, and the
    prefix is their longest common cached prefix in whole pages (computed from the tokens)."""
    gen = torch.Generator().manual_seed(page_size)
    cache = RadixCache(page_size)
    system_a = torch.randint(0, 1000, (3 * page_size + 2,), generator=gen).tolist()
    system_b = torch.randint(1000, 2000, (2 * page_size,), generator=gen).tolist()
    prompts = [
        system_a + torch.randint(2000, 3000, (page_size * k,), generator=gen).tolist() for k in (1, 2, 3)
    ]
    prompts += [system_b + torch.randint(3000, 4000, (page_size,), generator=gen).tolist() for _ in range(2)]
    prompts.append(torch.randint(4000, 5000, (2 * page_size,), generator=gen).tolist())
    next_loc = 0
    for prompt in prompts:  # cache each prompt's whole pages, as finished requests leave them
        n = len(prompt) - len(prompt) % page_size
        cache.insert(prompt[:n], torch.arange(next_loc, next_loc + n, dtype=torch.int32))
        next_loc += n
    matches = [cache.match(p) for p in prompts]
    paths = [cache.prefix_path(m.handle) for m in matches]
    assert [p[-1][1] if p else 0 for p in paths] == [m.length for m in matches]
    groups = choose_groups(paths, [m.length for m in matches])
    assert [g.members for g in groups] == [(0, 1, 2), (3, 4)]
    for group in groups:
        first = matches[group.members[0]].locations[: group.prefix_len]
        for i in group.members:
            assert torch.equal(matches[i].locations[: group.prefix_len], first)
        common = min(len(prompts[i]) for i in group.members)
        for n in range(common):
            if len({prompts[i][n] for i in group.members}) > 1:
                common = n
                break
        assert group.prefix_len == common - common % page_size
    layout_groups = to_prefix_groups(groups, len(prompts))
    assert layout_groups.group_ids_cpu.tolist() == [0, 0, 0, 1, 1, -1]
    assert layout_groups.members() == [[0, 1, 2], [3, 4]]
    assert layout_groups.prefix_lens_cpu.tolist()[5] == 0


def test_naive_cache_shares_nothing():
    cache = NaiveCache(16)
    assert cache.prefix_path(cache.match(list(range(40))).handle) == []


def test_cost_rule():
    """Saved bytes per layer = saved tokens x bytes a token; cascade runs at the threshold."""
    kv_bytes = 4096  # 8 KV heads x 128 dims x K,V x 2 bytes
    mib = 2**20
    assert cascade_pays(mib // kv_bytes * 32, kv_bytes, 32.0)
    assert not cascade_pays(mib // kv_bytes * 32 - 1, kv_bytes, 32.0)
    assert cascade_pays(1, kv_bytes, 0.0)
    assert not cascade_pays(0, kv_bytes, 0.0)  # nothing shared, nothing to gain
    # the workload: 16 groups of 16 running requests sharing 3,000 tokens
    groups = [Group(3000, tuple(range(16 * g, 16 * g + 16))) for g in range(16)]
    assert cascade_pays(saved_kv_tokens(groups), kv_bytes, 32.0)
    # a pair sharing one 16-token page does not pay
    assert not cascade_pays(saved_kv_tokens([Group(16, (0, 1))]), kv_bytes, 32.0)

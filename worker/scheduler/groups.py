"""Shared-prefix groups of one pass, for cascade attention (EngineConfig.cascade_attention).

Requests whose prefix-cache matches run through the same radix nodes hold the very same KV
pages at the head of their page_table rows. A *group* is a set of at least two requests of
the batch with a common prefix of ``prefix_len`` tokens (whole pages, ending on a radix
node); a cascade backend attends to that prefix once for all the group's queries and to each
request's remaining tokens separately (worker.attention.base.PrefixGroups).

Which groups: each request's path of radix nodes (PrefixCache.prefix_path) forms a tree. At
a node reached by n requests the choice is one group at that node's length L (saves
L x (n - 1) KV-token reads), or the best choices among its children (requests whose path ends
at the node join none). ``choose_groups`` takes the larger saving, the single group on ties.

Whether at all: ``cascade_pays``, the cost rule, below.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import torch

from worker.forward import PrefixGroups

# A request's path: (node, tokens from the root to the end of that node), root's child first.
Path = Sequence[tuple[Hashable, int]]

# The cost rule's threshold is SchedulerConfig.cascade_min_saved_mib (default 32): KV MiB a step
# must save per layer before cascade attention runs. The cascade adds, per layer, one attention
# launch over the groups' prefixes plus a gather and a log-sum-exp merge over the grouped
# queries (~10 us on an H200 at the benchmarks' shapes: an estimate, not yet measured);
# 32 MiB take ~8 us to read at the ~4 TB/s that decode attention reaches there.


class Group(NamedTuple):
    prefix_len: int  # tokens of shared prefix (whole pages)
    members: tuple[int, ...]  # indices into the batch, ascending


def _trim(path: Path, limit: int) -> list[tuple[Hashable, int]]:
    return [(node, end) for node, end in path if end <= limit]


def choose_groups(paths: Sequence[Path], limits: Sequence[int] | None = None) -> list[Group]:
    """The groups that save the most KV reads (module docstring) for these requests' paths.

    ``limits[i]``: request i may share at most this many tokens (its cached_len: every query
    of a request must see the whole shared prefix). Groups come ordered by first member."""
    trimmed = [_trim(p, limits[i]) if limits is not None else list(p) for i, p in enumerate(paths)]

    def best(members: list[int], depth: int, length: int) -> tuple[int, list[Group]]:
        by_child: dict[Hashable, list[int]] = {}
        ends: dict[Hashable, int] = {}
        for i in members:
            if len(trimmed[i]) > depth:
                node, end = trimmed[i][depth]
                by_child.setdefault(node, []).append(i)
                ends[node] = end
        split_saved, split_groups = 0, []
        for node, child in by_child.items():
            if len(child) >= 2:
                saved, groups = best(child, depth + 1, ends[node])
                split_saved += saved
                split_groups += groups
        whole_saved = length * (len(members) - 1)
        if length > 0 and whole_saved >= split_saved:
            return whole_saved, [Group(length, tuple(members))]
        return split_saved, split_groups

    _, groups = best(list(range(len(paths))), 0, 0)
    return sorted(groups, key=lambda g: g.members[0])


def saved_kv_tokens(groups: Sequence[Group]) -> int:
    """KV-token reads per layer that attending each group's prefix once saves."""
    return sum(g.prefix_len * (len(g.members) - 1) for g in groups)


def cascade_pays(saved_tokens: int, kv_bytes_per_token: int, min_saved_mib: float) -> bool:
    """The cost rule: cascade when the KV bytes it saves per layer reach ``min_saved_mib`` MiB.

    ``kv_bytes_per_token``: one token's K and V in one layer. The saving scales with prefix
    length x (group size - 1); the cascade's own cost is close to fixed per step (one more
    launch and a merge a layer), hence one threshold. 0 MiB: whenever any group exists."""
    return saved_tokens > 0 and saved_tokens * kv_bytes_per_token >= min_saved_mib * 2**20


def to_prefix_groups(groups: Sequence[Group], batch_size: int) -> PrefixGroups:
    """The host-side form that BatchLayout carries: per request a group id (-1: none) and the
    group's prefix length in tokens (0: none)."""
    group_ids = [-1] * batch_size
    prefix_lens = [0] * batch_size
    for g, group in enumerate(groups):
        for i in group.members:
            group_ids[i], prefix_lens[i] = g, group.prefix_len
    return PrefixGroups(
        group_ids_cpu=torch.tensor(group_ids, dtype=torch.int32),
        prefix_lens_cpu=torch.tensor(prefix_lens, dtype=torch.int32),
    )

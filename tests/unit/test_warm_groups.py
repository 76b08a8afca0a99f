"""scripts/device/warm_flashinfer.py's groups: a group that loads another's FlashInfer modules runs
after it (two processes must never build one module)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device" / "warm_flashinfer.py"


def load_script():
    spec = importlib.util.spec_from_file_location("warm_flashinfer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fp8_prefill_groups_wait_for_the_modules_they_load() -> None:
    """An FP8 group that prefills (tensor cores) runs its ragged part on the bf16 prefill module
    of its head_dim and kinds, and merges through the cascade module when a kind has no window."""
    warm = load_script()
    for name, group in warm.GROUPS.items():
        if group.kv != "fp8" or not group.use_tc or group.ragged:
            continue
        owners = [
            other
            for other, g in warm.GROUPS.items()
            if g.kv == "bf16"
            and g.use_tc
            and g.head_dim == group.head_dim
            and set(group.kinds) <= set(g.kinds)
        ]
        assert len(owners) == 1 and owners[0] in group.after, (name, owners, group.after)
        merges = any(window == 0 for window, _ in group.kinds)
        assert ("merge-state" in group.after) == merges, name


def test_a_group_brings_in_what_it_waits_for_first() -> None:
    warm = load_script()
    order = warm.with_dependencies(["fp8-d256-tc", "xqa-fp8-g2", "fp8-tc"])
    assert order == ["bf16-d256-tc", "merge-state", "fp8-d256-tc", "xqa-fp8-g2", "bf16-tc", "fp8-tc"]
    everything = warm.with_dependencies(list(warm.GROUPS))
    assert sorted(everything) == sorted(warm.GROUPS)
    for name in everything:
        assert all(everything.index(dep) < everything.index(name) for dep in warm.GROUPS[name].after)


def test_fa3_groups_build_their_own_module_alone() -> None:
    """A ragged-FA3 group prefills fresh prompts only (no FA2 prefix part, no merge): it waits for
    nothing, and no two of them share a module (head_dim and kind)."""
    warm = load_script()
    keys = []
    for name, group in warm.GROUPS.items():
        if group.ragged is None:
            continue
        assert group.ragged == "fa3" and group.after == (), name
        keys += [(group.head_dim, kind) for kind in group.kinds]
    assert keys and len(keys) == len(set(keys))

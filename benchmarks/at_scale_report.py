"""The at-scale benchmark's report (benchmarks/at_scale.py): each preset's table of medians
beside their floors (benchmarks/floor.py), and the presets of one call side by side."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor import KV_BYTES, Floor, ModelShape, shape_floor  # noqa: E402

if TYPE_CHECKING:
    from at_scale import Preset, Variant


def floors(
    preset: Preset,
    kv: str | None,
    max_running: int,
    pool_tokens: int | None,
    fp8_weights: bool = False,
    ceilings: tuple[float, float] | None = None,
) -> tuple[Floor, Floor | None, Floor | None]:
    """The shape's floor (at most ``max_running`` at once), the floor with this KV pool, and
    the first again at ``ceilings`` (this card's bandwidth and bf16 peak) when given."""
    shape = ModelShape.from_config(json.loads(Path(preset.model).read_text()))
    prompts = [preset.prompt_len] * preset.num_requests
    outputs = [preset.output_len] * preset.num_requests
    kv_bytes = KV_BYTES.get(kv or "auto", 2)
    common = dict(kv_bytes=kv_bytes, fp8_weights=fp8_weights, max_running=max_running)
    ideal = shape_floor(shape, prompts, outputs, **common)  # type: ignore[arg-type]
    card = None
    if ceilings is not None:
        bandwidth, peak = ceilings
        card = shape_floor(shape, prompts, outputs, bandwidth=bandwidth, peak=peak, **common)  # type: ignore[arg-type]
    if pool_tokens is None or pool_tokens < preset.prompt_len + preset.output_len:
        return ideal, None, card
    pooled = shape_floor(shape, prompts, outputs, kv_capacity_tokens=pool_tokens, **common)  # type: ignore[arg-type]
    return ideal, pooled, card


def summarize(
    args: argparse.Namespace,
    name: str,
    preset: Preset,
    variants: list[Variant],
    records: list,
    rounds: int,
    ceilings: tuple[float, float] | None = None,
) -> list[dict]:
    """Print preset ``name``'s table (stdout is what comes back from a device run) and return
    its rows; with ``ceilings`` (floor.measure_ceilings) each beside this card's floor too."""
    max_running = args.max_running_reqs or preset.max_running_reqs
    records = [r for r in records if r.preset == name]
    rows = []
    for v in variants:
        runs = [r for r in records if r.variant == v.name]
        if not runs:
            continue
        median_s = statistics.median(r.seconds for r in runs)
        engine_name = v.engine.name  # a queue run's pool: its engine's
        pages = [r for r in records if r.variant == engine_name and r.kv_pages]
        pool_tokens = pages[0].kv_pages * pages[0].page_size if pages else None
        ideal, pooled, card = floors(
            preset, v.kv_cache_dtype, max_running, pool_tokens, v.quantization == "fp8", ceilings
        )
        tokens = runs[0].output_tokens
        row = {
            "preset": name,
            "variant": v.name,
            "runs_s": [round(r.seconds, 3) for r in runs],
            "median_s": median_s,
            "tok_per_s": tokens / median_s,
            "floor_s": ideal.total_s,
            "pool_floor_s": pooled.total_s if pooled else None,
            "card_floor_s": card.total_s if card else None,
            "pool_tokens": pool_tokens,
            "max_decode_batch": max((r.max_decode_batch or 0) for r in runs) or None,
            "retractions": max((r.retractions or 0) for r in runs)
            if runs[0].retractions is not None
            else None,
            "startup_s": statistics.median(r.startup_s for r in runs),
            "graph_max_bs": max((r.graph_batch_sizes or [0])[-1] for r in runs) or None,
            "eager_decode_steps": max((r.eager_decode_steps or 0) for r in runs)
            if runs[0].eager_decode_steps is not None
            else None,
            "eager_batch_max": max((r.eager_batch_max or 0) for r in runs) or None,
            "step_profile": step_medians([r.step_profile for r in runs if r.step_profile]),
        }
        rows.append(row)
    print(
        f"\nat-scale {name}: {preset.describe()}, temperature {args.temperature}, "
        f"max_running_reqs {max_running}, seed {args.seed}, {rounds} round(s) "
        + ("back to back on one start of each variant" if args.same_workers else "interleaved")
    )
    print(
        f"{'variant':<22} {'n':>2} {'median s':>9} {'tok/s':>8} {'floor s':>8} {'of fl.':>6} "
        f"{'pool fl.':>8} {'of pf.':>6} {'max B':>6} {'retr':>5} {'vs 1st':>7}"
    )
    for row in rows:
        pool = row["pool_floor_s"]
        print(
            f"{row['variant']:<22} {len(row['runs_s']):>2} {row['median_s']:>9.2f} {row['tok_per_s']:>8.0f} "
            f"{row['floor_s']:>8.2f} {row['floor_s'] / row['median_s']:>6.0%} "
            + (f"{pool:>8.2f} {pool / row['median_s']:>6.0%} " if pool else f"{'-':>8} {'-':>6} ")
            + f"{row['max_decode_batch'] or '-':>6} {row['retractions'] if row['retractions'] is not None else '-':>5} "
            f"{row['tok_per_s'] / rows[0]['tok_per_s']:>7.3f}"
        )
    for row in rows:
        if row["card_floor_s"]:
            bandwidth, peak = ceilings or (0.0, 0.0)
            print(
                f"  {row['variant']}: this card's floor (copy {bandwidth / 1e12:.2f} TB/s, bf16 GEMM "
                f"{peak / 1e12:.0f} TFLOP/s, measured) {row['card_floor_s']:.2f} s: "
                f"{row['card_floor_s'] / row['median_s']:.0%} of it"
            )
    for row in rows:
        eager = (
            f"; graphs to {row['graph_max_bs']}, eager decode steps {row['eager_decode_steps']}"
            + (f" (batches up to {row['eager_batch_max']})" if row["eager_batch_max"] else "")
            if row["eager_decode_steps"] is not None
            else ""
        )
        print(f"  {row['variant']}: runs {row['runs_s']} s; startup median {row['startup_s']:.1f} s"
              + (f"; KV pool {row['pool_tokens']:,} tokens" if row["pool_tokens"] else "") + eager)  # fmt: skip
    for row in rows:
        if row["step_profile"]:
            print(f"  {row['variant']}: {describe_steps(row['step_profile'])}")
    by_name = {row["variant"]: row for row in rows}
    for v in variants:
        engine = by_name.get(v.engine.name)
        if v.plain_queue and v.name in by_name and engine:
            overhead = by_name[v.name]["median_s"] / engine["median_s"] - 1
            by_name[v.name]["overhead"] = overhead
            print(
                f"queue overhead ({v.name} vs {engine['variant']}): {100 * overhead:+.2f}% of the engine alone"
            )
    return rows


def print_presets_table(rows: list[dict]) -> None:
    """The presets of one call side by side (Markdown): median, its floor and the share."""
    print(
        "\n| preset | variant | runs | median s | tok/s | floor tok/s | of floor | pool floor tok/s | of pool floor "
        "| this card's floor tok/s | of it |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        tokens = row["tok_per_s"] * row["median_s"]
        pool, card = row["pool_floor_s"], row.get("card_floor_s")
        pooled = f"{tokens / pool:,.0f} | {pool / row['median_s']:.0%}" if pool else "- | -"
        carded = f"{tokens / card:,.0f} | {card / row['median_s']:.0%}" if card else "- | -"
        print(
            f"| {row['preset']} | {row['variant']} | {len(row['runs_s'])} | {row['median_s']:.2f} | "
            f"{row['tok_per_s']:,.0f} | {tokens / row['floor_s']:,.0f} | {row['floor_s'] / row['median_s']:.0%} | {pooled} | "
            f"{carded} |"
        )


def step_medians(profiles: list[dict]) -> dict | None:
    """Each field of the runs' step breakdowns (at_scale_runs.step_breakdown), its median over
    the runs that have it; None without profiles."""
    if not profiles:
        return None
    out = {}
    for key in profiles[0]:
        values = [p[key] for p in profiles if p.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


def describe_steps(profile: dict) -> str:
    """One line of a variant's step breakdown (medians over its runs)."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} ms"

    busy = profile.get("gpu_busy_share")
    return (
        f"decode step at {profile['decode_batch']}: GPU {ms(profile['decode_gpu_ms_p50'])} p50, host "
        f"{ms(profile['decode_host_ms_p50'])}; prefill: GPU {ms(profile['prefill_gpu_ms_per_8192_tokens'])} "
        f"per 8,192 tokens over {profile['prefill_steps']} steps"
        + (f"; GPU busy {busy:.1%}" if busy is not None else "")
    )

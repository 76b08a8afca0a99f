"""benchmarks/at_scale.py on CPU: the workload, the engine options each variant passes (the KV
dtype only when one is named), the worker's TOML giving the same SchedulerProcessConfig as the engine-alone
run, and the tiny preset end to end through ``worker.LLM`` (the queue variant:
tests/integration/test_at_scale_queue.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from at_scale import (  # noqa: E402
    PRESETS,
    Variant,
    at_scale_workload,
    engine_options,
    main,
    parse_args,
    protocol_rounds,
)
from at_scale_runs import engine_toml  # noqa: E402


def test_at_scale_workload_is_seeded_and_shaped():
    preset = PRESETS["llama-3.1-8b"]
    first = at_scale_workload(preset, seed=0)
    assert len(first.prompts) == 1024 and {len(p) for p in first.prompts} == {1000}
    assert first.max_tokens == [1000] * 1024 and first.num_output_tokens == 1_024_000
    assert all(0 <= t <= 10000 for p in first.prompts for t in p)
    assert at_scale_workload(preset, seed=0) == first
    second = at_scale_workload(preset, seed=1)
    # a fresh round shares no 16-token page with the first round's prompts
    pages = {tuple(p[:16]) for p in first.prompts}
    assert not pages & {tuple(p[:16]) for p in second.prompts}


def test_kv_cache_dtype_is_passed_only_when_named():
    args = parse_args(["--preset", "llama-3.1-8b"])
    preset = PRESETS["llama-3.1-8b"]
    plain = engine_options(args, preset, Variant.parse("engine", None).kv_cache_dtype)
    assert "kv_cache_dtype" not in plain
    assert plain["max_running_reqs"] == 1024 and plain["cuda_graph_max_bs"] == 1024
    assert plain["max_seq_len"] == 2000 and plain["load_format"] == "dummy"
    fp8 = engine_options(args, preset, Variant.parse("engine:fp8_e4m3", None).kv_cache_dtype)
    assert fp8 == {**plain, "kv_cache_dtype": "fp8_e4m3"}
    # --kv-cache-dtype names the KV of every variant that names none
    assert Variant.parse("queue", "fp8_e4m3") == Variant("queue", "fp8_e4m3")
    assert Variant.parse("queue:auto", "fp8_e4m3").name == "queue kv=auto"
    with pytest.raises(ValueError, match="engine or queue"):
        Variant.parse("offline", None)
    capped = parse_args(["--max-running-reqs", "512", "--cuda-graph-max-bs", "256", "--mem-fraction", "0.8"])
    options = engine_options(capped, preset, None)
    assert (options["max_running_reqs"], options["cuda_graph_max_bs"], options["mem_fraction"]) == (
        512,
        256,
        0.8,
    )


def test_worker_toml_builds_the_engine_alone_config(tmp_path: Path):
    from worker.config import load_worker_config
    from worker.scheduler.config import SchedulerProcessConfig

    preset = PRESETS["tiny"]
    options = {**engine_options(parse_args(["--preset", "tiny"]), preset, None), "num_pages": 40}
    path = tmp_path / "worker.toml"
    path.write_text(engine_toml(preset.model, options))
    worker = load_worker_config(path).for_device("cpu").process_config
    alone = SchedulerProcessConfig.from_options(preset.model, **options)
    assert worker == alone.replace(device="cpu")
    assert "kv_cache_dtype" not in path.read_text()


def test_tiny_preset_runs_end_to_end_on_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "at_scale.json"
    rows = main(["--preset", "tiny", "--variants", "engine", "--rounds", "2", "--out", str(out)])
    printed = capsys.readouterr().out
    preset = PRESETS["tiny"]
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [r["round"] for r in runs] == [0, 1]
    for run in runs:
        assert run["output_tokens"] == preset.num_requests * preset.output_len
        # 6 requests, 4 slots: the decode batch fills the slots and never passes them
        assert 2 <= run["max_decode_batch"] <= preset.max_running_reqs
        assert run["prefill_steps"] >= 2  # the last two requests wait for slots
        assert run["split_passes"] is None  # no decode_split_sms
    (row,) = rows
    assert row["variant"] == "engine" and row["runs_s"] == [round(r["seconds"], 3) for r in runs]
    assert row["median_s"] == pytest.approx(sum(r["seconds"] for r in runs) / 2)
    assert row["floor_s"] > 0 and row["pool_tokens"] == runs[0]["kv_pages"] * runs[0]["page_size"]
    assert row["card_floor_s"] > 0  # beside this machine's measured ceilings (here the CPU's)
    assert "at-scale tiny: 6 requests x 36/12 tokens" in printed
    assert "this card: copy" in printed and "  engine: this card's floor (copy" in printed
    assert printed.rstrip().splitlines()[-1].startswith("  engine: runs")


def test_profile_steps_reports_each_runs_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """--profile-steps: each engine run's step breakdown (the decode steps at its largest batch,
    its prefill steps; no GPU times on CPU) and the table's line of medians."""
    out = tmp_path / "at_scale.json"
    (row,) = main(
        ["--preset", "tiny", "--variants", "engine", "--rounds", "1", "--profile-steps", "--out", str(out)]
    )
    (run,) = json.loads(out.read_text())["runs"]
    profile = run["step_profile"]
    assert profile["decode_batch"] == run["max_decode_batch"]
    assert profile["prefill_steps"] == run["prefill_steps"]
    assert profile["decode_host_ms_p50"] > 0 and profile["decode_gpu_ms_p50"] is None
    assert row["step_profile"] == profile  # the median of one run
    assert f"decode step at {run['max_decode_batch']}: GPU - p50" in capsys.readouterr().out


def test_protocol_rounds_follow_the_issue():
    assert protocol_rounds([31.0, 58.2]) == 3  # every run over 30 s: a median of 3
    assert protocol_rounds([29.5, 58.2]) == 5  # else a median of 5
    assert protocol_rounds([]) == 5


def test_deadline_skips_a_run_that_would_end_past_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "at_scale.json"
    # no --rounds: round 0 picks 5 (its run is short); later rounds are judged by round 0's wall
    main(["--preset", "tiny", "--deadline-s", "0.01", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "protocol: 5 rounds" in printed
    assert [f"deadline: round {r} engine skipped" in printed for r in range(1, 6)] == [True] * 4 + [False]
    assert [r["round"] for r in json.loads(out.read_text())["runs"]] == [0]


@pytest.fixture
def tiny_b(monkeypatch: pytest.MonkeyPatch) -> str:
    """A second CPU preset beside ``tiny``, of another shape: 3 requests x 20/6 tokens."""
    import at_scale

    tiny = PRESETS["tiny"]
    preset = at_scale.Preset(tiny.model, 3, 20, 6, 2, 256, token_id_high=500)
    monkeypatch.setitem(at_scale.PRESETS, "tiny-b", preset)
    return "tiny-b"


def test_presets_interleave_in_one_call(tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_b: str):
    """Two presets, two rounds: every round runs the first preset's variants, then the second's;
    each gets its own table beside its own floor, and a side-by-side table comes last."""
    out = tmp_path / "at_scale.json"
    rows = main(["--preset", "tiny,tiny-b", "--variants", "engine", "--rounds", "2", "--out", str(out)])
    runs = json.loads(out.read_text())["runs"]
    assert [(r["preset"], r["round"]) for r in runs] == [
        ("tiny", 0),
        ("tiny-b", 0),
        ("tiny", 1),
        ("tiny-b", 1),
    ]
    assert [r["output_tokens"] for r in runs] == [6 * 12, 3 * 6] * 2
    assert [row["preset"] for row in rows] == ["tiny", "tiny-b"]
    assert rows[0]["floor_s"] != rows[1]["floor_s"]  # each beside the floor of its own shape
    printed = capsys.readouterr().out
    assert "at-scale tiny-b: 3 requests x 20/6 tokens" in printed
    last = printed.rstrip().splitlines()
    assert last[-2].startswith("| tiny | engine | 2 |") and last[-1].startswith("| tiny-b | engine | 2 |")
    with pytest.raises(SystemExit, match="at most once"):
        main(["--preset", "tiny,tiny"])
    with pytest.raises(SystemExit, match="qwen3-30b-a3b"):
        main(["--preset", "no-such-model"])


def test_moe_presets_point_at_the_published_shapes():
    from floor import ModelShape

    for name in ("qwen3-30b-a3b", "mixtral-8x7b", "gemma-3-12b", "mistral-7b", "phi-4"):
        preset = PRESETS[name]
        assert (preset.num_requests, preset.prompt_len, preset.output_len, preset.max_running_reqs) == (
            1024, 1000, 1000, 1024,
        )  # fmt: skip
        assert ModelShape.from_config(json.loads(Path(preset.model).read_text())).layers > 0


def test_variant_fields_past_the_weights_are_engine_options():
    """engine:KV:WEIGHTS:KEY=VALUE...: options of that variant alone, JSON values where they
    parse; the EngineConfig accepts them as given (or refuses them, naming the option)."""
    from worker.engine.config import EngineConfig

    v = Variant.parse("engine:fp8_e4m3:fp8:moe_fp8_sums=tile:max_running_reqs=12", None)
    assert v.options == (("moe_fp8_sums", "tile"), ("max_running_reqs", 12))
    assert v.name == "engine kv=fp8_e4m3 w=fp8 moe_fp8_sums=tile max_running_reqs=12"
    assert Variant.parse("queue::fp8:moe_fp8_sums=fast", None).engine.options == (("moe_fp8_sums", "fast"),)
    assert EngineConfig(**dict(v.options)).moe_fp8_sums == "tile"
    with pytest.raises(ValueError, match="moe_fp8_sums"):
        EngineConfig(moe_fp8_sums="fastest")
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        Variant.parse("engine:auto:none:moe_fp8_sums", None)


def test_queue_variants_name_their_workers_and_ranks(monkeypatch: pytest.MonkeyPatch):
    """queue-tpN: one worker over N GPUs (tensor_parallel_size passed); queue-Nw: N workers, a
    GPU each, in the order this process sees them."""
    import at_scale_runs

    tp2, pool, both = (Variant.parse(t, "fp8_e4m3", "fp8") for t in ("queue-tp2", "queue-2w", "queue-tp2-2w"))
    assert (tp2.tp, tp2.workers, pool.tp, pool.workers, both.tp, both.workers) == (2, 1, 1, 2, 2, 2)
    assert tp2.name == "queue-tp2 kv=fp8_e4m3 w=fp8" and not tp2.plain_queue
    assert Variant.parse("queue", None).plain_queue
    assert (Variant.parse("engine", None).workers, Variant.parse("queue", None).workers) == (0, 1)
    for bad in ("queue-tp0", "queue-2", "queue-w2", "queue-tp2x"):
        with pytest.raises(ValueError, match="MODE must be"):
            Variant.parse(bad, None)
    options = engine_options(parse_args([]), PRESETS["llama-3.1-8b"], None, None, tp2.tp)
    assert options["tensor_parallel_size"] == 2
    assert "tensor_parallel_size" not in engine_options(parse_args([]), PRESETS["llama-3.1-8b"], None)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert at_scale_runs.worker_gpus(2, 1) == ["4", "5"]
    assert at_scale_runs.worker_gpus(2, 2) == ["4,5", "6,7"]
    assert at_scale_runs.worker_gpus(1, 2) is None  # one worker sees what the benchmark sees
    with pytest.raises(RuntimeError, match="need 6 GPUs, 4 visible"):
        at_scale_runs.worker_gpus(3, 2)


def test_length_overrides_and_same_workers_with_several_presets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_b: str
):
    """--prompt-len/--output-len override every preset of the call (preset_of); --same-workers
    runs every round of a variant back to back, preset by preset, and needs --rounds."""
    with pytest.raises(SystemExit, match="--same-workers needs --rounds"):
        main(["--preset", "tiny", "--same-workers"])
    out = tmp_path / "at_scale.json"
    argv = ["--preset", "tiny,tiny-b", "--prompt-len", "20", "--output-len", "5", "--rounds", "2"]
    rows = main([*argv, "--same-workers", "--out", str(out)])
    runs = json.loads(out.read_text())["runs"]
    assert [(r["preset"], r["round"]) for r in runs] == [
        ("tiny", 0),
        ("tiny", 1),
        ("tiny-b", 0),
        ("tiny-b", 1),
    ]
    assert [r["output_tokens"] for r in runs] == [6 * 5] * 2 + [3 * 5] * 2
    printed = capsys.readouterr().out
    assert "tiny 6 requests x 20/5 tokens, tiny-b 3 requests x 20/5 tokens" in printed
    assert "at-scale tiny-b: 3 requests x 20/5 tokens" in printed
    assert printed.count("2 round(s) back to back on one start of each variant") == 2
    assert [(row["preset"], row["variant"]) for row in rows] == [("tiny", "engine"), ("tiny-b", "engine")]

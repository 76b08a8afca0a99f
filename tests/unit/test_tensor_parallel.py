"""Tensor parallelism on CPU over gloo (the real collective path): TP=2 and TP=3 generate what
TP=1 generates, through chunked prefill, the radix cache and retraction under a tight KV pool.

Tokens must be equal. Logprobs are compared within 1e-4 (float32): a row-parallel layer adds
its ranks' partial sums in another order than one GEMM's dot products (and gloo's ring adds
the ranks in its own order), so the logits differ in the last bits; 1e-4 is ~100x the
differences seen and far below any margin a greedy choice is decided by here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.model_fixtures import smollm2_dir, tiny_hf_model  # noqa: F401  (a fixture)
from tests.tp_harness import assert_left_cleanly, assert_same_generation, greedy, run_workload
from worker.models.config import ModelConfig
from worker.models.loader import rank_shard
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import GenerateRequest

LOGPROB_ATOL = 1e-4
# 12 query heads, 6 KV heads, intermediate 192: divisible by 2 and by 3
TP_SHAPE = dict(
    hidden_size=96, num_attention_heads=12, num_key_value_heads=6, head_dim=8, intermediate_size=192
)


@pytest.fixture(scope="module")
def tp_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tp-llama")
    tiny_hf_model("llama", spread=0.2, **TP_SHAPE).save_pretrained(path)
    return path


def workload() -> list[GenerateRequest]:
    """Shared 24-token prefixes (the radix cache), 60-token prompts over a 32-token prefill
    budget (chunked), n=2 siblings, more output than a 48-page pool holds at once (retraction)."""
    gen = torch.Generator().manual_seed(7)
    prefix = torch.randint(0, 256, (24,), generator=gen).tolist()
    requests = []
    for i in range(8):
        suffix_len = 36 if i % 3 == 0 else 8
        suffix = torch.randint(0, 256, (suffix_len,), generator=gen).tolist()
        requests.append(
            GenerateRequest(uid=f"r{i}", input_ids=prefix + suffix, sampling=greedy(20, n=2 if i == 1 else 1))
        )
    return requests


def engine_config(model_dir: Path, tp: int) -> SchedulerProcessConfig:
    return SchedulerProcessConfig.from_options(
        str(model_dir),
        device="cpu",
        tensor_parallel_size=tp,
        page_size=4,
        num_pages=48,
        max_running_reqs=8,
        max_prefill_tokens=32,
        output_reserve_ratio=0.0,
        cpu_threads=1,
    )


@pytest.fixture(scope="module")
def reference(tp_model_dir: Path):
    outcome = run_workload(engine_config(tp_model_dir, 1), workload())
    # the workload exercises what it claims to
    assert outcome.retractions > 0 and outcome.cached_tokens > 0 and outcome.chunked
    return outcome


@pytest.mark.parametrize("tp", [2, 3])
def test_tp_generates_what_tp1_generates(tp_model_dir: Path, reference, tp: int) -> None:
    """Greedy tokens equal, logprobs within LOGPROB_ATOL; the group retracts and caches the
    same as one engine (same batches), every rank leaves the group the normal way (destroyed,
    not aborted) and its followers are gone afterwards."""
    outcome = run_workload(engine_config(tp_model_dir, tp), workload())
    assert_same_generation(outcome, reference, LOGPROB_ATOL)
    assert (outcome.retractions, outcome.cached_tokens) == (reference.retractions, reference.cached_tokens)
    assert len(outcome.follower_pids) == tp - 1
    assert_left_cleanly(outcome)
    assert not [pid for pid in outcome.follower_pids if Path(f"/proc/{pid}").exists()]


def test_shard_names_the_field_that_does_not_divide(tp_model_dir: Path) -> None:
    cfg = ModelConfig.from_hf_dir(tp_model_dir)
    with pytest.raises(ValueError, match="tensor_parallel_size=4: the model's num_kv_heads=6"):
        cfg.shard(4)
    sharded = cfg.shard(3)
    assert (sharded.num_q_heads, sharded.num_kv_heads, sharded.intermediate_size) == (4, 2, 64)


def test_rank_shards_put_back_together_are_the_tensor() -> None:
    """Column-parallel slices stack on rows, row-parallel ones on columns; a row-parallel bias
    is rank 0's alone (added once after the all-reduce); the rest is replicated."""
    w = torch.randn(12, 6)
    q = [rank_shard("model.layers.0.self_attn.q_proj.weight", w, r, 3) for r in range(3)]
    o = [rank_shard("model.layers.0.self_attn.o_proj.weight", w, r, 3) for r in range(3)]
    assert torch.equal(torch.cat(q, dim=0), w) and torch.equal(torch.cat(o, dim=1), w)
    b = torch.randn(12)
    biases = [rank_shard("model.layers.0.self_attn.o_proj.bias", b, r, 3) for r in range(3)]
    assert torch.equal(sum(biases), b)  # type: ignore[arg-type]
    assert rank_shard("model.embed_tokens.weight", w, 2, 3) is w


def test_structured_output_is_refused_with_tp(tp_model_dir: Path) -> None:
    """A grammar is admitted when its compile is done, which differs between ranks: refused."""
    from wire.schema import SamplingParams

    sampling = SamplingParams(max_tokens=4, regex="[ab]+")
    outcome = run_workload(engine_config(tp_model_dir, 2), [GenerateRequest("g", [1, 2, 3], sampling)])
    finished = outcome.finished["g"]
    assert finished.error_code == "invalid_job"
    assert "tensor_parallel_size > 1" in (finished.error_message or "")


def test_dummy_weights_are_the_same_for_every_tp_size(tp_model_dir: Path) -> None:
    """Dummy weights are drawn whole and sliced: a rank's share is the slice of TP=1's."""
    from worker.models.loader import load_model

    config = tp_model_dir / "config.json"
    whole = dict(load_model(str(config), load_format="dummy").model.named_parameters())
    share = dict(load_model(str(config), load_format="dummy", tp_rank=1, tp_size=2).model.named_parameters())
    o = "model.layers.1.self_attn.o_proj.weight"
    assert torch.equal(share[o], whole[o].chunk(2, dim=1)[1])
    up = "model.layers.0.mlp.gate_up_proj.weight"
    gate_w, up_w = whole[up].chunk(2, dim=0)
    assert torch.equal(share[up], torch.cat([gate_w.chunk(2)[1], up_w.chunk(2)[1]]))


def test_compose_places_a_tp_group_on_consecutive_gpus() -> None:
    """docker/gpu-services.py --tp 2 on 4 GPUs: two workers, each reserving its two GPUs."""
    import importlib.util

    from tests.unit.docker_files import GPU_SERVICES

    spec = importlib.util.spec_from_file_location("gpu_services", GPU_SERVICES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    services = module.compose_override([0, 1, 2, 3], tp=2)["services"]
    assert sorted(services) == ["worker-gpu0-1", "worker-gpu2-3"]
    worker = services["worker-gpu2-3"]
    assert worker["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] == ["2", "3"]
    assert worker["command"][-2:] == ["--tensor-parallel-size", "2"]
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        module.compose_override([0, 1, 2, 3], tp=3)


@pytest.mark.model
def test_smollm2_tp3_generates_what_tp1_generates(smollm2_dir: Path) -> None:  # noqa: F811
    """SmolLM2-135M (9 query heads, 3 KV heads, intermediate 1536) split over 3 ranks: same
    greedy tokens, logprobs within 1e-3 (30 layers of reordered float32 sums), through chunked
    prefill, shared prefixes and retraction."""
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(1000, 20000, (20,), generator=gen).tolist()
    requests = [
        GenerateRequest(
            uid=f"s{i}",
            input_ids=prefix + torch.randint(1000, 20000, (24 if i % 2 else 4,), generator=gen).tolist(),
            sampling=greedy(16),
        )
        for i in range(4)
    ]

    def config(tp: int) -> SchedulerProcessConfig:
        return SchedulerProcessConfig.from_options(
            str(smollm2_dir), device="cpu", tensor_parallel_size=tp, page_size=4, num_pages=24,
            max_running_reqs=4, max_prefill_tokens=32, output_reserve_ratio=0.0, cpu_threads=1,
        )  # fmt: skip

    want = run_workload(config(1), requests)
    assert want.retractions > 0 and want.cached_tokens > 0 and want.chunked
    got = run_workload(config(3), requests)
    assert_same_generation(got, want, logprob_atol=1e-3)
    assert (got.retractions, got.cached_tokens) == (want.retractions, want.cached_tokens)


def test_fp8_weights_quantize_each_ranks_share(tp_model_dir: Path) -> None:
    """quantization="fp8" after sharding: every projection of rank 1 is an Fp8Linear whose
    dequantized weight is rank 1's slice of the float weight, within e4m3's rounding (3
    mantissa bits: 1/16 of the channel's largest magnitude at most, per element)."""
    from worker.models.fp8 import Fp8Linear
    from worker.models.loader import load_model

    whole = dict(load_model(str(tp_model_dir)).model.named_parameters())
    share = load_model(str(tp_model_dir), quantization="fp8", tp_rank=1, tp_size=2).model
    attn, mlp = share.model.layers[0].self_attn, share.model.layers[0].mlp
    for module, name, dim in [(attn.o_proj, "self_attn.o_proj", 1), (mlp.down_proj, "mlp.down_proj", 1)]:
        assert isinstance(module, Fp8Linear)
        want = whole[f"model.layers.0.{name}.weight"].chunk(2, dim=dim)[1]
        got = module.weight.float() * module.weight_scale[:, None]
        bound = want.abs().amax(dim=1, keepdim=True) / 16
        assert ((got - want).abs() <= bound).all()
    assert isinstance(attn.qkv_proj, Fp8Linear) and attn.qkv_proj.out_features == (6 + 3 + 3) * 8
    assert isinstance(mlp.gate_up_proj, Fp8Linear) and mlp.gate_up_proj.out_features == 2 * 96

"""What the family shapes of tests/family_fixtures.py exercise, and the checkpoint forms each
family loads.

- Each feature bites: transformers' own logits move when the feature is switched off in its
  config (so radixq matching transformers with it on, tests/unit/test_families.py, means
  radixq implements it).
- Checkpoint forms: Gemma 3's multimodal checkpoint as transformers 5 keeps it in memory
  (``model.language_model.*``) besides the published form, the vision tower present and
  skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.family_fixtures import FAMILIES, VOCAB_SIZE, WINDOW, family_dir, save_tokenizer, tiny_model
from tests.model_fixtures import PagedRunner
from worker.models.loader import load_model

PROMPT = torch.randint(16, VOCAB_SIZE, (1, 3 * WINDOW + 5), generator=torch.Generator().manual_seed(11))


def last_logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(PROMPT).logits[0, -1]


def assert_loads_as(hf: torch.nn.Module, *paths: Path) -> None:
    """Each checkpoint directory loads into radixq with transformers' prefill logits."""
    prompts = [PROMPT[0, :7].tolist(), PROMPT[0].tolist()]
    with torch.no_grad():
        want = [hf(torch.tensor([p])).logits[0, -1] for p in prompts]
    for path in paths:
        runner = PagedRunner(load_model(str(path)), page_size=4)
        got = runner.step([(i, 0, p) for i, p in enumerate(prompts)])
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("kind", "feature_off"),
    [
        ("mistral", dict(sliding_window=None)),
        ("mixtral", dict(sliding_window=None)),
        ("gemma2", dict(sliding_window=10_000)),
        ("gemma2", dict(attn_logit_softcapping=None)),
        ("gemma2", dict(final_logit_softcapping=None)),
        ("gemma2", dict(query_pre_attn_scalar=16)),
        ("gemma3_text", dict(sliding_window=10_000)),
        ("gemma3_text", dict(rope_local_base_freq=10000.0)),
        ("gemma3_text", dict(rope_scaling=None)),
        ("phi3", dict(rope_scaling=None)),
        ("qwen3_moe", dict(norm_topk_prob=False)),
    ],
)
def test_each_feature_bites(kind: str, feature_off: dict) -> None:
    """The same weights with the feature switched off give other logits (beyond float noise)."""
    with_it, without = tiny_model(kind), tiny_model(kind, **feature_off)
    without.load_state_dict(with_it.state_dict())
    assert (last_logits(with_it) - last_logits(without)).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["qwen3_moe", "mixtral"])
def test_moe_checkpoints_with_fused_experts_load(kind: str, tmp_path: Path) -> None:
    """Experts stored fused (transformers 5's in-memory ``mlp.experts.gate_up_proj`` [E, 2I, H]
    and ``down_proj`` [E, H, I]) load like the per-expert names save_pretrained writes."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    per_expert = tmp_path / "per-expert"
    hf = family_dir(kind, per_expert)
    with safe_open(str(per_expert / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in names or (
        "model.layers.0.block_sparse_moe.experts.0.w1.weight" in names
    )
    fused = tmp_path / "fused"
    fused.mkdir()
    state = hf.state_dict()
    assert state["model.layers.0.mlp.experts.gate_up_proj"].dim() == 3
    save_file({k: v.contiguous() for k, v in state.items()}, str(fused / "model.safetensors"))
    (fused / "config.json").write_text((per_expert / "config.json").read_text())
    assert_loads_as(hf, per_expert, fused)


def test_gemma3_multimodal_checkpoint_in_transformers5_names(tmp_path: Path) -> None:
    """``model.language_model.*`` names (transformers 5's own) load like the published ones;
    the vision tower's tensors are in the file and skipped."""
    from safetensors.torch import save_file

    published = tmp_path / "published"
    hf = family_dir("gemma3", published)
    state = hf.state_dict()
    assert any(k.startswith("model.language_model.") for k in state)
    assert any(k.startswith("model.vision_tower.") for k in state)
    native = tmp_path / "native"
    native.mkdir()
    save_file(
        {k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"},
        str(native / "model.safetensors"),
    )
    (native / "config.json").write_text((published / "config.json").read_text())
    save_tokenizer(FAMILIES["gemma3"].tokens, native)
    assert_loads_as(hf, published, native)


def test_image_content_is_refused_per_job(tmp_path: Path) -> None:
    """A Gemma 3 image-text checkpoint runs text: a chat with an image part gets its own
    error, the text job beside it runs."""
    from wire.schema import SamplingParams
    from worker.llm import LLM

    family_dir("gemma3", tmp_path)
    llm = LLM(str(tmp_path), device="cpu")
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///cat.png"}}]}]
    refused, ran = llm.generate([image, "Hello"], SamplingParams(max_tokens=3, temperature=0.0))
    assert refused.error is not None and refused.error.code == "invalid_job"
    assert "content parts (images, audio) are not supported" in refused.error.message
    assert ran.error is None and len(ran.choices[0].token_ids) == 3


PARTIAL_ROPE = {  # Phi-4-mini's form: half of each head rotates, longrope on those dims
    "rope_type": "longrope",
    "partial_rotary_factor": 0.5,
    "short_factor": [1.0, 1.5, 2.0, 3.0],
    "long_factor": [4.0, 5.0, 6.0, 8.0],
}


def test_phi3_partial_rotary_matches_transformers(tmp_path: Path) -> None:
    """partial_rotary_factor 0.5: the q/k rows reordered at load (rope.rotary_permutation)
    rotate as transformers rotates the first half of each head, in prefill and over a cached
    prefix."""
    hf = family_dir("phi3", tmp_path, rope_scaling=PARTIAL_ROPE)
    loaded = load_model(str(tmp_path))
    assert loaded.config.rotary_dim == 8
    prompt = PROMPT[0].tolist()
    runner = PagedRunner(loaded, page_size=4)
    first = runner.step([(0, 0, prompt[:20])])[0]
    second = runner.step([(0, 20, prompt[20:])])[0]
    with torch.no_grad():
        torch.testing.assert_close(first, hf(torch.tensor([prompt[:20]])).logits[0, -1], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(second, hf(PROMPT).logits[0, -1], atol=2e-5, rtol=1e-5)
    unpermuted = tiny_model(
        "phi3",
        rope_scaling={
            **PARTIAL_ROPE,
            "partial_rotary_factor": 1.0,
            "short_factor": [1.0] * 8,
            "long_factor": [1.0] * 8,
        },
    )
    unpermuted.load_state_dict(hf.state_dict())
    assert (last_logits(hf) - last_logits(unpermuted)).abs().max() > 1e-2  # partial rotary bites


def test_longrope_tables_short_below_the_original_context_long_from_it() -> None:
    """radixq's cos/sin per position: transformers' short-factor tables below
    original_max_position_embeddings, its long-factor tables (what it uses once a sequence is
    longer) from there on; both times the attention factor."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    from worker.models.rope import RotaryEmbedding

    config = tiny_model("phi3").config
    scaling = dict(config.rope_parameters)
    table = RotaryEmbedding(16, 256, scaling["rope_theta"], scaling, "cpu")
    hf_rope = Phi3RotaryEmbedding(config)
    x = torch.zeros(1, dtype=torch.float32)
    original = scaling["original_max_position_embeddings"]
    short_cos, short_sin = hf_rope(x, torch.arange(original)[None])
    long_cos, long_sin = hf_rope(x, torch.arange(256)[None])
    assert hf_rope.attention_scaling > 1.0
    torch.testing.assert_close(table.cos_cache[:original], short_cos[0, :, :8])
    torch.testing.assert_close(table.sin_cache[:original], short_sin[0, :, :8])
    torch.testing.assert_close(table.cos_cache[original:], long_cos[0, original:, :8])
    torch.testing.assert_close(table.sin_cache[original:], long_sin[0, original:, :8])


@pytest.mark.parametrize(
    ("kind", "biases"), [("llama", (True, True)), ("qwen3", (True, True)), ("qwen2", (True, False))]
)
def test_attention_bias_rules_match_transformers(
    kind: str, biases: tuple[bool, bool], tmp_path: Path
) -> None:
    """attention_bias covers q, k, v and o for Llama and Qwen3 (Qwen2: q, k, v only)."""
    from tests.model_fixtures import tiny_hf_model

    hf = tiny_hf_model(kind, spread=0.05, vocab_size=VOCAB_SIZE, attention_bias=True)
    hf.save_pretrained(tmp_path)
    config = load_model(str(tmp_path)).config
    assert (config.attention_bias, config.o_proj_bias) == biases
    assert_loads_as(hf, tmp_path)

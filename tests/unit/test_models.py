"""Our decoder vs Hugging Face transformers on the same (small, random) weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

# NOTE: makes `tests.model_fixtures` importable under bare `pytest` (no pythonpath setting yet).
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.model_fixtures import PagedRunner, check_new_kv_handed_over, tiny_hf_model  # noqa: E402
from worker.models.config import ModelConfig  # noqa: E402
from worker.models.loader import load_model  # noqa: E402

PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [3, 11], list(range(20, 61))]


def _hf_model(kind: str):
    """Every parameter perturbed, so biases and norm weights are not their trivial init values."""
    if kind == "llama3-rope":
        scaling = dict(
            rope_type="llama3",
            factor=4.0,
            low_freq_factor=1.0,
            high_freq_factor=2.0,
            original_max_position_embeddings=16,
        )
        return tiny_hf_model(
            "llama",
            spread=0.05,
            vocab_size=128,
            tie_word_embeddings=True,
            rope_theta=500.0,
            rope_scaling=scaling,
        )
    extra = {"rope_theta": 10000.0} if kind == "llama" else {}
    return tiny_hf_model(kind, spread=0.05, vocab_size=128, **extra)


@pytest.fixture(scope="module", params=["llama", "llama3-rope", "qwen2", "qwen3"])
def hf_and_dir(request, tmp_path_factory):
    torch.manual_seed(0)
    model = _hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, model, path


@pytest.mark.parametrize("page_size", [1, 16])
def test_prefill_logits_match_hf(hf_and_dir, page_size):
    """Batched prefill of prompts of different lengths gives HF's last-token logits."""
    kind, hf, path = hf_and_dir
    loaded = load_model(str(path))
    assert loaded.config.qk_norm == (kind == "qwen3")
    assert loaded.config.attention_bias == (kind == "qwen2")
    runner = PagedRunner(loaded, page_size=page_size)
    logits = runner.step([(slot, 0, prompt) for slot, prompt in enumerate(PROMPTS)])
    assert logits.dtype == torch.float32 and logits.shape == (len(PROMPTS), 128)
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            expected = hf(torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(logits[i], expected, atol=2e-5, rtol=1e-5)


def test_the_model_hands_its_new_kv_to_a_backend_that_asks(hf_and_dir):
    """The unfused path (CPU): ForwardBatch.attention passes the k/v it stored;
    tests/unit/test_kernels_interpret.py checks the fused kernel's path."""
    check_new_kv_handed_over(load_model(str(hf_and_dir[2])))


def test_logits_into_a_given_buffer_match_hf(hf_and_dir):
    """The CUDA graphs' path: logits written into a slice of one shared buffer (logits_out)."""
    _, hf, path = hf_and_dir
    runner = PagedRunner(load_model(str(path)), page_size=4)
    runner.step([(slot, 0, prompt) for slot, prompt in enumerate(PROMPTS)])
    buffer = torch.full((len(PROMPTS) + 3, 128), float("nan"))
    with torch.inference_mode():
        got = runner.loaded.model(runner.last_batch, logits_out=buffer[: len(PROMPTS)])
    assert got.data_ptr() == buffer.data_ptr() and buffer[len(PROMPTS) :].isnan().all()
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            torch.testing.assert_close(
                buffer[i], hf(torch.tensor([prompt])).logits[0, -1], atol=2e-5, rtol=1e-5
            )


@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_decode_matches_hf_generate(hf_and_dir, page_size):
    """Batched paged greedy decoding reproduces HF generate(do_sample=False) token for token."""
    _, hf, path = hf_and_dir
    runner = PagedRunner(load_model(str(path)), page_size=page_size)
    ours = runner.greedy(PROMPTS, max_new_tokens=6)
    for prompt, tokens in zip(PROMPTS, ours, strict=True):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, min_new_tokens=6)
        assert tokens == out[0, len(prompt) :].tolist()


def test_chunked_prefill_mixed_with_decode(hf_and_dir):
    """A prompt prefilled in two chunks (second chunk reads a cached prefix) while another
    request decodes in the same batch gives HF's logits for both."""
    _, hf, path = hf_and_dir
    runner = PagedRunner(load_model(str(path)), page_size=4)
    long_prompt, short_prompt = PROMPTS[2], PROMPTS[0]
    first = runner.step([(0, 0, long_prompt[:13]), (1, 0, short_prompt)])
    next_short = int(first[1].argmax())
    mixed = runner.step([(1, len(short_prompt), [next_short]), (0, 13, long_prompt[13:])])
    with torch.no_grad():
        torch.testing.assert_close(
            mixed[1], hf(torch.tensor([long_prompt])).logits[0, -1], atol=2e-5, rtol=1e-5
        )
        expected_short = hf(torch.tensor([short_prompt + [next_short]])).logits[0, -1]
        torch.testing.assert_close(mixed[0], expected_short, atol=2e-5, rtol=1e-5)


def test_dummy_load_from_tiny_config(tmp_path):
    """load_format="dummy" builds random finite weights from a bare config.json."""
    config = json.loads((REPO / "configs" / "qwen3-0.6b.json").read_text())
    config.update(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
    config.update(num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=64)
    file = tmp_path / "tiny-qwen3.json"
    file.write_text(json.dumps(config))
    loaded = load_model(str(file), load_format="dummy")
    assert loaded.name == "tiny-qwen3" and loaded.config.num_layers == 2
    norms = [p for n, p in loaded.model.named_parameters() if n.endswith("norm.weight")]
    assert all(bool((p == 1).all()) for p in norms)
    logits = PagedRunner(loaded, page_size=4).step([(0, 0, [1, 2, 3]), (1, 0, [4])])
    assert logits.shape == (2, 64) and bool(torch.isfinite(logits).all())


def test_dummy_load_accepts_directory_and_dtype(tmp_path):
    config = json.loads((REPO / "configs" / "llama-3.1-8b.json").read_text())
    config.update(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4)
    config.update(num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=64)
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_model(str(tmp_path), load_format="dummy", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    logits = PagedRunner(loaded, page_size=2).step([(0, 0, [1, 2, 3])])
    assert logits.dtype == torch.bfloat16 and bool(torch.isfinite(logits).all())  # the model dtype


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "qwen3-0.6b",
            dict(
                num_layers=28,
                hidden_size=1024,
                num_q_heads=16,
                num_kv_heads=8,
                head_dim=128,
                intermediate_size=3072,
                vocab_size=151936,
                tie_word_embeddings=True,
                rope_theta=1e6,
                qk_norm=True,
            ),
        ),
        (
            "qwen3-8b",
            dict(
                num_layers=36,
                hidden_size=4096,
                num_q_heads=32,
                num_kv_heads=8,
                head_dim=128,
                intermediate_size=12288,
                vocab_size=151936,
                tie_word_embeddings=False,
                qk_norm=True,
            ),
        ),
        (
            "llama-3.1-8b",
            dict(
                num_layers=32,
                hidden_size=4096,
                num_q_heads=32,
                num_kv_heads=8,
                head_dim=128,
                intermediate_size=14336,
                vocab_size=128256,
                rope_theta=500000.0,
                qk_norm=False,
            ),
        ),
    ],
)
def test_bundled_configs(name, expected):
    """The benchmark configs carry the published model shapes."""
    config = ModelConfig.from_hf_dir(REPO / "configs" / f"{name}.json")
    for field, value in expected.items():
        assert getattr(config, field) == value, field
    if name == "llama-3.1-8b":
        assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "llama3"


def test_rope_llama3_matches_hf():
    """llama3 rope scaling gives HF's inverse frequencies."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from worker.models.config import ModelConfig
    from worker.models.rope import inverse_frequencies

    config = ModelConfig.from_hf_dir(REPO / "configs" / "llama-3.1-8b.json")
    hf_config = LlamaConfig(**json.loads((REPO / "configs" / "llama-3.1-8b.json").read_text()))
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    ours = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    torch.testing.assert_close(ours, expected.float())


def test_missing_weights_and_bad_paths_raise(tmp_path, hf_and_dir, monkeypatch):
    _, _, path = hf_and_dir
    from safetensors.torch import load_file, save_file

    state = load_file(str(next(Path(path).glob("*.safetensors"))))
    state.pop("model.layers.1.mlp.up_proj.weight")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((Path(path) / "config.json").read_text())
    save_file(state, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="lacks weights"):
        load_model(str(broken))
    from huggingface_hub import constants

    monkeypatch.setattr(
        constants, "HF_HUB_OFFLINE", True
    )  # NOTE: a download is tests/integration/test_hub_models.py's
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError, match="not a known alias .* HF_HUB_OFFLINE is set"):
        load_model("no-such-org/no-such-model")
    with pytest.raises(FileNotFoundError, match="no model config.json"):
        load_model(str(tmp_path / "nothing.json"), load_format="dummy")

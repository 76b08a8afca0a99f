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
    ],
)
def test_each_feature_bites(kind: str, feature_off: dict) -> None:
    """The same weights with the feature switched off give other logits (beyond float noise)."""
    with_it, without = tiny_model(kind), tiny_model(kind, **feature_off)
    without.load_state_dict(with_it.state_dict())
    assert (last_logits(with_it) - last_logits(without)).abs().max() > 1e-2


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
    prompts = [PROMPT[0, :7].tolist(), PROMPT[0].tolist()]
    with torch.no_grad():
        want = [hf(torch.tensor([p])).logits[0, -1] for p in prompts]
    for path in (published, native):
        runner = PagedRunner(load_model(str(path)), page_size=4)
        got = runner.step([(i, 0, p) for i, p in enumerate(prompts)])
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


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

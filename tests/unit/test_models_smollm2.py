"""The real default model (SmolLM2-135M-Instruct GGUF) through our paged decoder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.model_fixtures import PagedRunner, smollm2_dir  # noqa: E402, F401  (fixture)
from worker.models.loader import load_model  # noqa: E402
from worker.models.tokenizer import load_tokenizer, prompt_ids  # noqa: E402

pytestmark = pytest.mark.model

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _greedy_until_eos(
    runner: PagedRunner, prompt: list[int], eos: tuple[int, ...], max_new_tokens: int
) -> list[int]:
    tokens: list[int] = []
    pending, cached_len = prompt, 0
    for _ in range(max_new_tokens):
        next_id = int(runner.step([(0, cached_len, pending)])[0].argmax())
        tokens.append(next_id)
        if next_id in eos:
            break
        cached_len, pending = cached_len + len(pending), [next_id]
    return tokens


def test_smollm2_greedy_chat_matches_hf(smollm2_dir, monkeypatch):  # noqa: F811
    """Greedy chat answer is Paris, token for token what transformers generates; the alias
    loads the converted copy the fixture left in the cache, without converting it again
    (how long that load takes is benchmarks/model_load.py's figure, not a test's)."""
    from transformers import AutoModelForCausalLM

    from worker.models import gguf

    def no_second_conversion(*args: object) -> None:
        raise AssertionError("the cached conversion was not used: the GGUF was converted again")

    monkeypatch.setattr(gguf, "_convert", no_second_conversion)
    loaded = load_model("smollm2-135m")
    assert Path(loaded.path) == smollm2_dir
    config = loaded.config
    assert (config.architecture, config.num_layers, config.hidden_size, config.vocab_size) == (
        "LlamaForCausalLM",
        30,
        576,
        49152,
    )
    assert config.tie_word_embeddings
    tokenizer = load_tokenizer(loaded.path)
    ids = prompt_ids(tokenizer, messages=QUESTION)
    ours = _greedy_until_eos(PagedRunner(loaded, page_size=16, max_reqs=1), ids, config.eos_token_ids, 24)
    assert tokenizer.decode(ours, skip_special_tokens=True).startswith("The capital of France is Paris")

    hf = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    assert ours == out[0, len(ids) :].tolist()


def test_smollm2_tokenizer_helpers(smollm2_dir):  # noqa: F811
    """prompt_ids follows the HF chat template and plain encoding; aliases resolve to the cache."""
    tokenizer = load_tokenizer("smollm2-135m")
    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert text.rstrip().endswith("assistant")
    expected = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert prompt_ids(tokenizer, messages=QUESTION) == list(expected)
    assert prompt_ids(tokenizer, prompt="Hello world") == list(tokenizer("Hello world")["input_ids"])


def test_message_name_reaches_the_chat_template(smollm2_dir):  # noqa: F811
    """A message's ``name`` (OpenAI's) is handed to the chat template; without one the template
    sees no ``name`` key. The expected text is written out here, independently of the template."""
    from wire.schema import ChatMessage

    tokenizer = load_tokenizer(str(smollm2_dir))
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m.role }}{% if 'name' in m %}({{ m.name }}){% endif %}: "
        "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )
    messages = [ChatMessage("system", "be brief"), ChatMessage("user", "hi", "ann")]
    expected = "system: be brief\nuser(ann): hi\nassistant:"
    assert (
        prompt_ids(tokenizer, messages=messages) == tokenizer(expected, add_special_tokens=False)["input_ids"]
    )

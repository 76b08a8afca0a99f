"""Tiny random models of each supported family, saved as Hugging Face directories with an
offline tokenizer and the family's chat template (import from test modules).

``family_dir(kind, path)`` writes config.json, safetensors (transformers' ``save_pretrained``)
and tokenizer files into ``path`` and returns transformers' model (float32, eval mode), the
oracle. Each shape exercises its family's features: sliding windows shorter than the test
prompts, soft-caps that bite, top-2 of 8 experts, interleaved sliding/global layers with their
own rope bases, longrope past the original context. The tokenizer is a character-level
``tokenizers`` BPE over printable ASCII plus the family's special tokens; nothing downloads.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

VOCAB_SIZE = 160  # >= every tokenizer below; ids past the tokenizer are never-seen tokens
SHAPE = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
WINDOW = 8  # sliding windows: shorter than most test prompts

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['content'] }}\n\n{% endif %}{% endfor %}"
)
GEMMA = (
    "{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
PHI3 = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class Tokens:
    """The special tokens of a family's tokenizer (ids 0.. in this order) and its template."""

    specials: tuple[str, ...]
    bos: str | None
    eos: str
    template: str


CHATML_TOKENS = Tokens(("<|endoftext|>", "<|im_start|>", "<|im_end|>"), None, "<|im_end|>", CHATML)
MISTRAL_TOKENS = Tokens(("<unk>", "<s>", "</s>", "[INST]", "[/INST]"), "<s>", "</s>", MISTRAL)
GEMMA_TOKENS = Tokens(
    ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"), "<bos>", "<eos>", GEMMA
)
PHI3_TOKENS = Tokens(
    ("<unk>", "<s>", "<|endoftext|>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"),
    "<s>",
    "<|end|>",
    PHI3,
)


@dataclass(frozen=True)
class Family:
    model_type: str
    tokens: Tokens
    config: dict[str, Any] = field(default_factory=dict)
    window: int = 0  # the sliding window the shape sets (0: none)
    text_of: str = ""  # a multimodal config: its text_config is this family's, plus ``outer``
    outer: dict[str, Any] = field(default_factory=dict)


GEMMA3_TEXT = dict(
    num_hidden_layers=4, sliding_window=WINDOW, sliding_window_pattern=2, rope_local_base_freq=100.0,
    rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}, query_pre_attn_scalar=24,
    tie_word_embeddings=True, final_logit_softcapping=None, attn_logit_softcapping=None,
)  # fmt: skip


FAMILIES: dict[str, Family] = {
    "mistral": Family("mistral", MISTRAL_TOKENS, dict(sliding_window=WINDOW), WINDOW),
    "qwen3_moe": Family(
        "qwen3_moe",
        CHATML_TOKENS,
        dict(
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
        ),
    ),  # fmt: skip
    "mixtral": Family(
        "mixtral",
        MISTRAL_TOKENS,
        dict(num_local_experts=8, num_experts_per_tok=2, sliding_window=WINDOW),
        WINDOW,
    ),
    "gemma3_text": Family("gemma3_text", GEMMA_TOKENS, GEMMA3_TEXT, WINDOW),
    "gemma3": Family(
        "gemma3",
        GEMMA_TOKENS,
        GEMMA3_TEXT,
        WINDOW,
        text_of="gemma3_text",
        outer=dict(
            vision_config=dict(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=14,
            ),
            mm_tokens_per_image=4,
            boi_token_index=VOCAB_SIZE - 3,
            eoi_token_index=VOCAB_SIZE - 2,
            image_token_index=VOCAB_SIZE - 1,
            tie_word_embeddings=True,
        ),
    ),
    "gemma2": Family(
        "gemma2",
        GEMMA_TOKENS,
        dict(
            sliding_window=WINDOW,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=4.0,
            query_pre_attn_scalar=24,
            tie_word_embeddings=True,
        ),
        WINDOW,
    ),  # fmt: skip
    "phi3": Family(
        "phi3",
        PHI3_TOKENS,
        dict(
            max_position_embeddings=256,
            original_max_position_embeddings=96,  # test sequences stay below it (phi3.py says why)
            rope_scaling={
                "type": "longrope",
                "short_factor": [1.0 + 0.3 * i for i in range(8)],
                "long_factor": [2.0 + 0.5 * i for i in range(8)],
            },
        ),
    ),  # fmt: skip
}


def tiny_config(kind: str, **overrides: Any) -> Any:
    """transformers' config of the tiny ``kind`` model (FAMILIES' shape, then ``overrides``)."""
    from transformers import AutoConfig

    family = FAMILIES[kind]
    fields = {**SHAPE, **family.config, **overrides}
    tokens = family.tokens
    fields.setdefault("eos_token_id", tokens.specials.index(tokens.eos))
    fields.setdefault("bos_token_id", tokens.specials.index(tokens.bos) if tokens.bos else None)
    fields.setdefault("pad_token_id", 0)
    if family.text_of:
        text = AutoConfig.for_model(family.text_of, **fields).to_dict()
        return AutoConfig.for_model(family.model_type, text_config=text, **family.outer)
    return AutoConfig.for_model(family.model_type, **fields)


def tiny_model(kind: str, *, spread: float = 0.1, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A random transformers model of ``kind`` in float32, eval mode; ``spread``: seeded noise
    on every weight (norms and routers too), so logits spread and greedy choices avoid ties."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    torch.manual_seed(seed)
    auto = AutoModelForImageTextToText if FAMILIES[kind].text_of else AutoModelForCausalLM
    model = auto.from_config(tiny_config(kind, **overrides), dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(spread * torch.randn(param.shape, generator=gen))
    return model.eval()


def save_tokenizer(tokens: Tokens, path: Path) -> Any:
    """A character-level tokenizer with ``tokens``' specials and chat template (in
    tokenizer_config.json, as published models carry it), saved in ``path``; returns it."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = list(string.printable[:95]) + ["\n"]
    vocab = {token: i for i, token in enumerate([*tokens.specials, *chars])}
    assert len(vocab) <= VOCAB_SIZE
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=tokens.specials[0]))
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(tokens.specials))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=tokens.bos, eos_token=tokens.eos, unk_token=tokens.specials[0]
    )
    tokenizer.save_pretrained(path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = tokens.template
    config_file.write_text(json.dumps(config, indent=2))
    return tokenizer


def family_dir(kind: str, path: Path, **overrides: Any) -> torch.nn.Module:
    """Save the tiny ``kind`` model and its tokenizer in ``path``; returns the HF model."""
    model = tiny_model(kind, **overrides)
    model.save_pretrained(path)
    save_tokenizer(FAMILIES[kind].tokens, path)
    return model


def family_prompts(seed: int, window: int) -> list[list[int]]:
    """8 prompts of token ids (no special tokens): lengths from 3 to 45, most longer than
    ``window``; prompt 6 repeats prompt 3's first 24 tokens (a radix hit when they run in
    separate rounds), prompt 7 repeats prompt 1 whole."""
    gen = torch.Generator().manual_seed(seed)
    first = 16  # past the specials of every tokenizer
    lengths = (3, 13, 45, 30, max(window + 3, 9), 21, 0, 0)
    prompts = [torch.randint(first, VOCAB_SIZE, (n,), generator=gen).tolist() for n in lengths[:6]]
    prompts.append(prompts[3][:24] + torch.randint(first, VOCAB_SIZE, (5,), generator=gen).tolist())
    prompts.append(list(prompts[1]))
    return prompts

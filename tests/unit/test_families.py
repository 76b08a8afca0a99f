"""Each supported family against transformers on the same tiny random weights, through the
real engine and scheduler (the offline LLM API): greedy tokens identical on 8 prompts x 32
tokens, logprobs within 1e-3 (float32), through chunked prefill (16-token chunks), a radix
hit (a second round repeats prefixes of the first), prefills longer than the sliding window;
the family's chat template runs; dummy weights, FP8 weights (against transformers under the same
FP8 scheme), FP8 KV, structured output and penalties run.

The models and their directories come from tests/family_fixtures.py (one per family and
session). Families that need more (MoE routing, soft-caps, longrope) add their own checks in
tests/unit/test_family_*.py.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.family_fixtures import FAMILIES, family_dir, family_prompts
from tests.unit.test_fp8_weights import PROJECTIONS, fake_quant_rows
from wire.schema import SamplingParams
from worker.llm import LLM

KINDS = ["mistral", "qwen3_moe", "mixtral", "gemma2", "gemma3_text", "gemma3", "phi3"]
MAX_TOKENS = 32
CHUNK = 16  # max_prefill_tokens: every prompt longer than this is prefilled in chunks
FP8_PROJECTIONS = (*PROJECTIONS, "qkv_proj", "gate_up_proj")  # Phi-3 keeps them fused
GREEDY = SamplingParams(
    max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=2
)


class Oracle:
    """A tiny model of one family, saved; transformers' greedy tokens and logprobs, memoised."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind, self.path = kind, path
        self.model = family_dir(kind, path)
        self._memo: dict[tuple[int, ...], tuple[list[int], torch.Tensor]] = {}

    def greedy(self, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
        """(MAX_TOKENS greedy tokens, their log-softmax rows [MAX_TOKENS, vocab])."""
        key = tuple(prompt)
        if key not in self._memo:
            self._memo[key] = greedy_rows(self.model, prompt, MAX_TOKENS)
        return self._memo[key]


def greedy_rows(model: torch.nn.Module, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy decoding with its own KV cache, no EOS rule and no logits
    processors (what an engine with ignore_eos does): (tokens, log-softmax rows [steps,
    vocab] in float64)."""
    tokens, rows = [], []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        for _ in range(steps):
            logits = out.logits[0, -1].double()
            rows.append(torch.log_softmax(logits, dim=-1))
            tokens.append(int(logits.argmax()))
            name = "cache" if "cache" in out else "past_key_values"  # transformers >= 5.2x: cache
            out = model(torch.tensor([tokens[-1:]]), **{name: out[name]}, use_cache=True)
    return tokens, torch.stack(rows)


@pytest.fixture(scope="module", params=KINDS)
def oracle(request, tmp_path_factory) -> Oracle:
    return Oracle(request.param, tmp_path_factory.mktemp(request.param))


def assert_matches(oracle: Oracle, llm: LLM, prompts: list[list[int]]) -> list:
    results = llm.generate(prompts, GREEDY)
    for i, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        assert result.error is None, result.error
        tokens, logprobs = oracle.greedy(prompt)
        (choice,) = result.choices
        assert choice.token_ids == tokens, f"{oracle.kind}: prompt {i} ({len(prompt)} tokens)"
        assert choice.logprobs is not None
        worst = max(
            abs(alt.logprob - float(row[alt.token_id]))
            for entry, row in zip(choice.logprobs, logprobs, strict=True)
            for alt in (entry, *entry.top_logprobs)
        )
        assert worst < 1e-3, f"{oracle.kind}: prompt {i}: logprob off by {worst}"
    llm.scheduler.check_integrity()
    return results


def test_greedy_and_logprobs_match_transformers(oracle: Oracle) -> None:
    """The CPU default backend (sdpa) for every family; the reference backend too for Gemma 2,
    whose layers use every attention option (test_attention_options checks both backends
    option by option)."""
    window = FAMILIES[oracle.kind].window
    prompts = family_prompts(seed=3, window=window)
    assert max(len(p) for p in prompts) > CHUNK, "some prompt must be prefilled in chunks"
    if window:
        assert sum(len(p) > window for p in prompts) >= 6, "prefills must cross the window"
    for attention in ("sdpa", "torch") if oracle.kind == "gemma2" else ("sdpa",):
        llm = LLM(str(oracle.path), device="cpu", attention=attention, page_size=4, max_prefill_tokens=CHUNK)
        assert_matches(oracle, llm, prompts[:6])
        second = assert_matches(oracle, llm, prompts[6:])
        assert [r.usage.cached_tokens for r in second] == [24, 12], "the second round hits the radix cache"


def test_chat_template_runs_through_the_family_template(oracle: Oracle) -> None:
    """A chat job is rendered by the model directory's own template (its special tokens are
    in the ids the engine ran) and generates what transformers generates from those ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(oracle.path)
    messages = [{"role": "user", "content": "Name three colours."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    specials = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    assert specials & set(ids), "the template adds the family's special tokens"
    llm = LLM(str(oracle.path), device="cpu")
    assert llm.encode(messages) == ids
    (result,) = llm.generate([messages], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert result.error is None and result.choices[0].token_ids == oracle.greedy(ids)[0][:8]


def test_dummy_weights_run(oracle: Oracle, tmp_path: Path) -> None:
    """load_format dummy: the family's model from its config.json alone, finite logits."""
    (tmp_path / "config.json").write_text((oracle.path / "config.json").read_text())
    llm = LLM(str(tmp_path), device="cpu", load_format="dummy", page_size=4)
    (result,) = llm.generate(
        [[20, 21, 22, 23] * 5], SamplingParams(max_tokens=4, temperature=0.0, logprobs=True)
    )
    assert result.error is None and len(result.choices[0].token_ids) == 4
    assert all(e.logprob == e.logprob and e.logprob <= 0 for e in result.choices[0].logprobs or [])


def fp8_oracle(path: Path) -> torch.nn.Module:
    """transformers' model of ``path`` running the FP8 scheme through hooks
    (tests/unit/test_fp8_weights.py's oracle; fused qkv/gate-up quantize per row the same)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for name, module in hf.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in FP8_PROJECTIONS:
            with torch.no_grad():
                module.weight.copy_(fake_quant_rows(module.weight))
            module.register_forward_pre_hook(lambda _m, args: (fake_quant_rows(args[0]),))
        elif name.endswith(".experts"):  # stacked experts [E, N, K]: rows are output channels
            with torch.no_grad():
                module.gate_up_proj.copy_(fake_quant_rows(module.gate_up_proj))
                module.down_proj.copy_(fake_quant_rows(module.down_proj))
            module.forward = types.MethodType(_fp8_experts_forward, module)
    return hf


def _fp8_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """transformers' expert loop with the FP8 scheme: weights per output channel (quantized
    once, below), each GEMM's input per token."""
    out = torch.zeros_like(hidden_states)
    for e in range(self.gate_up_proj.shape[0]):
        token, slot = torch.where(top_k_index == e)
        if token.numel() == 0:
            continue
        gate, up = F.linear(fake_quant_rows(hidden_states[token]), self.gate_up_proj[e]).chunk(2, dim=-1)
        y = F.linear(fake_quant_rows(self.act_fn(gate) * up), self.down_proj[e])
        out.index_add_(0, token, y * top_k_weights[token, slot, None])
    return out


def test_fp8_weights_match_the_fp8_oracle(oracle: Oracle) -> None:
    """quantization fp8: greedy tokens equal transformers' under the same FP8 scheme."""
    hf = fp8_oracle(oracle.path)
    llm = LLM(str(oracle.path), device="cpu", quantization="fp8", page_size=4, max_prefill_tokens=CHUNK)
    prompts = family_prompts(seed=3, window=FAMILIES[oracle.kind].window)[:4]
    results = llm.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    for prompt, result in zip(prompts, results, strict=True):
        want, _ = greedy_rows(hf, prompt, 8)
        assert result.choices[0].token_ids == want


def test_config_is_read_as_transformers_reads_it(oracle: Oracle) -> None:
    from worker.models.config import ModelConfig

    cfg = ModelConfig.from_hf_dir(oracle.path)
    raw = json.loads((oracle.path / "config.json").read_text())
    assert cfg.architecture == raw["architectures"][0]
    window = FAMILIES[oracle.kind].window
    hf_config = getattr(oracle.model.config, "text_config", oracle.model.config)
    layer_types = getattr(hf_config, "layer_types", None) or ["sliding_attention"] * cfg.num_layers
    want = [window if kind == "sliding_attention" else 0 for kind in layer_types]
    assert [cfg.attention_of(i).sliding_window for i in range(cfg.num_layers)] == want


def test_the_other_engine_features_run(oracle: Oracle) -> None:
    """FP8 KV pages (scales calibrated by a prefill over a chat rendered with the family's
    template), structured output through the family's tokenizer, penalties and seeded
    sampling, in one batch: every job finishes, the regex holds, the logprobs are finite."""
    import re

    llm = LLM(str(oracle.path), device="cpu", kv_cache_dtype="fp8_e4m3", page_size=4)
    assert llm.engine.kv.quantized
    prompts = ["The sea is", [{"role": "user", "content": "Say yes."}], "Count: 1 2 3"]
    params = [
        SamplingParams(max_tokens=8, temperature=0.0, regex="[a-c]{3,6}"),
        SamplingParams(max_tokens=8, temperature=0.8, seed=5, repetition_penalty=1.3, presence_penalty=0.5),
        SamplingParams(max_tokens=8, temperature=0.0, frequency_penalty=1.0, logprobs=True, ignore_eos=True),
    ]
    structured, sampled, penalised = llm.generate(prompts, params)
    assert all(r.error is None for r in (structured, sampled, penalised))
    assert re.fullmatch("[a-c]{3,6}", structured.choices[0].text)
    assert len(penalised.choices[0].token_ids) == 8
    assert all(-1e9 < e.logprob <= 0 for e in penalised.choices[0].logprobs or [])

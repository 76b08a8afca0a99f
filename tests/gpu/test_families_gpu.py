"""Each family's GPU path (bf16, FlashInfer with the layers' windows and soft-caps, the fused
MoE kernel, CUDA graphs for decode) against a CPU oracle, teacher-forced: the GPU engine's
greedy continuation of 8 prompts, then the oracle's argmax at every position of that same
sequence; they agree on >= 99% of positions. bf16 against transformers (float32, CPU); FP8
weights against radixq's CPU FP8 emulation (float32).

The tiny models are trained a little on a synthetic Markov language first (on the GPU), so
their next-token choices have the wide margins of a real language model's and bf16 rounding
rarely decides an argmax (tests/model_fixtures.py trained_tiny_model says more).
Run: pytest -m gpu tests/gpu/test_families_gpu.py (about 3-4 minutes on one H200).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.family_fixtures import FAMILIES, VOCAB_SIZE, save_tokenizer, tiny_model
from tests.model_fixtures import markov_chain, markov_sequences
from wire.schema import SamplingParams
from worker.llm import LLM

pytestmark = pytest.mark.gpu
KINDS = ["mistral", "qwen3_moe", "mixtral", "gemma2", "gemma3_text", "gemma3", "phi3"]
STEPS = 32
AGREEMENT = 0.99
# head_dim 128, as the GPU kernels are built for (the CPU tests' 16 is below FlashInfer's range)
GPU_SHAPE = dict(
    hidden_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=128, intermediate_size=512
)
PER_KIND = {
    "qwen3_moe": dict(moe_intermediate_size=128),
    "mixtral": dict(intermediate_size=256),
    "phi3": dict(
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0 + 0.02 * i for i in range(64)],
            "long_factor": [2.0 + 0.1 * i for i in range(64)],
        }
    ),
}


def trained_dir(kind: str, path: Path) -> torch.nn.Module:
    """The tiny ``kind`` model after 150 AdamW steps on markov_chain(VOCAB_SIZE), saved with
    its tokenizer; returned in float32 on the CPU."""
    model = tiny_model(kind, spread=0.0, **{**GPU_SHAPE, **PER_KIND.get(kind, {})}).cuda().train()
    chain = markov_chain(VOCAB_SIZE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(150):
        batch = markov_sequences(chain, 32, 64, seed=1000 + step).cuda()
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model = model.cpu().eval()
    model.save_pretrained(path)
    save_tokenizer(FAMILIES[kind].tokens, path)
    return model


def prompts() -> list[list[int]]:
    """8 Markov prompts of 12 to 47 tokens: past every sliding window, past one page."""
    chain = markov_chain(VOCAB_SIZE)
    return [markov_sequences(chain, 1, 12 + 5 * i, seed=50 + i)[0].tolist() for i in range(8)]


def agreement(sequences: list[list[int]], prompt_lens: list[int], oracle_argmax) -> float:
    """Share of generated positions whose token is the oracle's argmax given the same prefix."""
    hits = total = 0
    for seq, n in zip(sequences, prompt_lens, strict=True):
        want = oracle_argmax(seq)  # argmax after each prefix seq[:j + 1], j >= n - 1
        got = seq[n:]
        hits += sum(int(a == b) for a, b in zip(got, want[n - 1 : -1], strict=True))
        total += len(got)
    return hits / total


def gpu_continuations(path: Path, **options) -> list[list[int]]:
    llm = LLM(str(path), device="cuda", num_pages=1024, max_running_reqs=8, cuda_graph_max_bs=8, **options)
    params = SamplingParams(max_tokens=STEPS, temperature=0.0, ignore_eos=True)
    results = llm.generate(prompts(), params)
    assert all(r.error is None for r in results)
    return [p + r.choices[0].token_ids for p, r in zip(prompts(), results, strict=True)]


@pytest.fixture(scope="module", params=KINDS)
def trained(request, tmp_path_factory) -> tuple[str, Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, trained_dir(request.param, path)


def test_bf16_gpu_agrees_with_transformers_on_cpu(trained) -> None:
    kind, path, hf = trained

    def oracle(seq: list[int]) -> list[int]:
        with torch.no_grad():
            return hf(torch.tensor([seq])).logits[0].argmax(-1).tolist()

    share = agreement(gpu_continuations(path, dtype="bfloat16"), [len(p) for p in prompts()], oracle)
    print(f"{kind} bf16: teacher-forced argmax agreement {share:.4f}")
    assert share >= AGREEMENT


def test_fp8_gpu_agrees_with_the_cpu_fp8_emulation(trained) -> None:
    from tests.model_fixtures import PagedRunner
    from worker.models.loader import load_model

    kind, path, _ = trained
    cpu = load_model(str(path), device="cpu", dtype=torch.float32, quantization="fp8")

    def oracle(seq: list[int]) -> list[int]:
        # every position's argmax: prefill one token at a time over the cached prefix
        runner = PagedRunner(cpu, page_size=4, max_reqs=1, max_len=len(seq) + 4)
        return [int(runner.step([(0, j, [seq[j]])])[0].argmax()) for j in range(len(seq))]

    # MoE families: each FP8 gate/up arithmetic of the fused kernel (the engine's moe_fp8_sums;
    # the prefill's ~60 rows per expert take wgmma tiles, where the three differ)
    for sums in ("exact", "tile", "fast") if kind in ("qwen3_moe", "mixtral") else ("exact",):
        continuations = gpu_continuations(path, quantization="fp8", moe_fp8_sums=sums)
        share = agreement(continuations, [len(p) for p in prompts()], oracle)
        print(
            f"{kind} fp8 ({sums} MoE sums): teacher-forced argmax agreement against the CPU emulation {share:.4f}"
        )
        assert share >= AGREEMENT, sums

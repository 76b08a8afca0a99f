"""Model fixtures and a tiny paged runner for tests (import from test modules).

``PagedRunner`` drives a CausalLM through a KVPool + TorchRefBackend the way the engine
does: per request a slot, page_table rows of KV locations (pages handed out in a shuffled
order so they are not contiguous), ForwardBatch built by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from worker.attention.torch_ref import TorchRefBackend
from worker.forward import BatchLayout, ForwardBatch
from worker.kvcache.pool import KVPool
from worker.models.loader import LoadedModel

if TYPE_CHECKING:
    from worker.engine.grammar import Grammars

TINY_SHAPE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    eos_token_id=None,
)


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate`` on one prompt: the oracle for radixq's greedy tokens."""
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def hf_from_dir(path: Path) -> torch.nn.Module:
    """The transformers model saved in ``path`` (float32, eval mode)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def tiny_hf_model(kind: str = "llama", *, spread: float = 0.0, **overrides: object) -> torch.nn.Module:
    """A tiny random transformers model of ``kind`` ("llama", "qwen2", "qwen3"), in eval mode.

    ``spread`` adds seeded noise of that scale to every weight, so logits are spread out and
    greedy choices sit far from ties; ``overrides`` change TINY_SHAPE's config values."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM, {"tie_word_embeddings": False}),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, {"tie_word_embeddings": True}),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"tie_word_embeddings": False, "head_dim": 32}),
    }
    config_cls, model_cls, defaults = classes[kind]
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**TINY_SHAPE, **defaults, **overrides}))
    if spread:
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(spread * torch.randn(param.shape, generator=gen))
    return model.eval()


def markov_chain(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A low-entropy synthetic language: each token has 3 successors, taken with probability
    0.85 / 0.10 / 0.05. Returns (successors [vocab, 3], their probabilities [3])."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (vocab, 3), generator=gen), torch.tensor([0.85, 0.10, 0.05])


def markov_sequences(
    chain: tuple[torch.Tensor, torch.Tensor], n: int, length: int, seed: int
) -> torch.Tensor:
    """n sequences of ``length`` tokens drawn from the chain, int64 [n, length]."""
    successors, probs = chain
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(n, length, dtype=torch.long)
    out[:, 0] = torch.randint(0, successors.shape[0], (n,), generator=gen)
    for t in range(1, length):
        pick = torch.multinomial(probs.expand(n, -1), 1, generator=gen).squeeze(1)
        out[:, t] = successors[out[:, t - 1], pick]
    return out


def trained_tiny_model(
    kind: str, *, steps: int = 150, device: str = "cpu", **overrides: object
) -> torch.nn.Module:
    """tiny_hf_model trained (AdamW, seeded) on markov_chain(vocab): unlike a random model, its
    next-token choices are decided by wide logit margins (a median of ~2 where the language
    is certain), as a real language model's are, so rounding noise rarely flips an argmax."""
    torch.manual_seed(0)
    model = tiny_hf_model(kind, **overrides).to(device).train()
    chain = markov_chain(model.config.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(steps):
        batch = markov_sequences(chain, 32, 64, seed=1000 + step).to(device)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.cpu().eval()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The SmolLM2-135M-Instruct GGUF converted to a HF directory (cached across runs)."""
    from worker.models.aliases import ALIASES
    from worker.models.gguf import ensure_converted

    return ensure_converted(ALIASES["smollm2-135m"].locate(), name="smollm2-135m")


@pytest.fixture(scope="session")
def tp_gpu_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Llama for tensor parallelism on two GPUs (skips with fewer): head_dim 128, as
    FlashInfer's JIT cache holds; 8 query / 4 KV heads split over 2 ranks."""
    if torch.cuda.device_count() < 2:
        pytest.skip("tensor parallelism over NCCL needs two visible GPUs")
    path = tmp_path_factory.mktemp("tp-gpu-llama")
    tiny_hf_model(
        "llama", spread=0.05, hidden_size=1024, num_attention_heads=8, num_key_value_heads=4,
        head_dim=128, intermediate_size=2048,
    ).save_pretrained(path)  # fmt: skip
    return path


@dataclass
class PagedRunner:
    loaded: LoadedModel
    page_size: int
    max_reqs: int = 8
    max_len: int = 128
    seed: int = 0
    kv: KVPool = field(init=False)
    page_table: torch.Tensor = field(init=False)
    backend: TorchRefBackend = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.loaded.config
        pages_per_req = -(-self.max_len // self.page_size)
        num_pages = self.max_reqs * pages_per_req + 3
        dtype = next(self.loaded.model.parameters()).dtype
        device = next(self.loaded.model.parameters()).device
        self.kv = KVPool(
            cfg.num_layers, num_pages, self.page_size, cfg.num_kv_heads, cfg.head_dim, dtype, device
        )
        self.page_table = torch.zeros(self.max_reqs, self.max_len, dtype=torch.int32, device=device)
        self.backend = TorchRefBackend(
            self.kv, self.page_table, cfg.num_q_heads, cfg.head_dim, self.page_size, cfg.layer_attention
        )
        gen = torch.Generator().manual_seed(self.seed)
        self._free_pages = torch.randperm(num_pages, generator=gen).tolist()
        self._pages: dict[int, list[int]] = {}
        self.device = device

    def _locations(self, slot: int, start: int, end: int) -> list[int]:
        pages = self._pages.setdefault(slot, [])
        while len(pages) * self.page_size < end:
            pages.append(self._free_pages.pop())
        return [pages[i // self.page_size] * self.page_size + i % self.page_size for i in range(start, end)]

    def step(self, requests: list[tuple[int, int, list[int]]]) -> torch.Tensor:
        """One pass; each request is (slot, cached_len, new token ids). Returns logits [B, V]."""
        input_ids, positions, out_loc, sample_idx = [], [], [], []
        for slot, cached_len, tokens in requests:
            locs = self._locations(slot, cached_len, cached_len + len(tokens))
            self.page_table[slot, cached_len : cached_len + len(tokens)] = torch.tensor(
                locs, dtype=torch.int32
            )
            input_ids += tokens
            positions += range(cached_len, cached_len + len(tokens))
            out_loc += locs
            sample_idx.append(len(input_ids) - 1)
        layout = BatchLayout(
            slots_cpu=torch.tensor([r[0] for r in requests], dtype=torch.int32),
            cached_lens_cpu=torch.tensor([r[1] for r in requests], dtype=torch.int32),
            extend_lens_cpu=torch.tensor([len(r[2]) for r in requests], dtype=torch.int32),
        )

        def dev(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        batch = ForwardBatch(
            input_ids=dev(input_ids),
            positions=dev(positions),
            out_loc=dev(out_loc),
            sample_idx=dev(sample_idx),
            layout=layout,
            backend=self.backend,
            attn_meta=self.backend.plan(layout),
            kv=self.kv,
        )
        self.last_batch = batch
        with torch.inference_mode():
            return self.loaded.model(batch)

    def greedy(self, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """Batched greedy decoding: prefill all prompts in one pass, then decode together."""
        slots = list(range(len(prompts)))
        lens = [0] * len(prompts)
        outputs: list[list[int]] = [[] for _ in prompts]
        pending = [list(p) for p in prompts]
        for _ in range(max_new_tokens):
            logits = self.step([(s, lens[s], pending[s]) for s in slots])
            next_ids = logits.argmax(-1).tolist()
            for s in slots:
                lens[s] += len(pending[s])
                outputs[s].append(next_ids[s])
                pending[s] = [next_ids[s]]
        return outputs


class NewKvProbe(TorchRefBackend):
    """TorchRefBackend that asks for each pass's own K/V (AttentionBackend.wants_new_kv, as
    FlashInfer's FP8 prefill does) and keeps what every layer hands it, in layer order."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def wants_new_kv(self, meta) -> bool:
        return True

    def forward(self, q, layer_id, meta, new_kv=None):
        assert new_kv is not None, "the model did not hand over the K/V it was asked for"
        self.seen.append((new_kv[0].clone(), new_kv[1].clone()))
        return super().forward(q, layer_id, meta)


def check_new_kv_handed_over(loaded: LoadedModel) -> None:
    """A backend that wants the pass's own K/V gets, every layer, exactly what the pool stored
    at the pass's locations (a float32 pool: the same values); the logits do not change."""
    requests = [(0, 0, [5, 17, 33, 2, 90, 41, 7]), (1, 0, [3, 11]), (2, 0, list(range(20, 61)))]
    expected = PagedRunner(loaded, page_size=4).step(requests)
    runner = PagedRunner(loaded, page_size=4)
    cfg = loaded.config
    runner.backend = probe = NewKvProbe(runner.kv, runner.page_table, cfg.num_q_heads, cfg.head_dim, 4)
    torch.testing.assert_close(runner.step(requests), expected)
    assert len(probe.seen) == cfg.num_layers
    for layer, (k, v) in enumerate(probe.seen):
        k_pool, v_pool = runner.kv.gather(layer, runner.last_batch.out_loc)
        assert torch.equal(k, k_pool) and torch.equal(v, v_pool), f"layer {layer}"


def load_grammars(model_path: str, vocab_size: int, stop_token_ids: list[int]) -> Grammars | None:
    """The grammar engine (compiling on this thread) for the model directory's tokenizer;
    None when it has none (the engine compiles in its child process: worker.engine.grammar_compiler)."""
    from worker.engine.grammar import Grammars
    from worker.models.tokenizer import load_tokenizer_or_none

    tokenizer = load_tokenizer_or_none(model_path)
    return None if tokenizer is None else Grammars.from_tokenizer(tokenizer, vocab_size, stop_token_ids)

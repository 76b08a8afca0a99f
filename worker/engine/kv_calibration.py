"""FP8 KV scales fitted at load: one prefill pass over a calibration text, per layer the
largest |k| and |v| it stores, scale = amax * HEADROOM / 448 (worker.kvcache.pool).

Why at load and per layer: FlashInfer takes one K and one V scale a layer, fixed for the
captured CUDA graphs, so scales cannot follow the traffic; and one fixed scale of 1.0 for
every layer wastes the FP8 range where values are small (SmolLM2's first layer keeps 41%
of its |v| under 2^-6, e4m3's subnormal range). docs/performance.md has the measured
agreement of both choices against the unquantised cache.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from worker.forward import BatchLayout, ForwardBatch
from worker.kvcache.pool import FP8_E4M3_MAX, HEADROOM, KVPool

if TYPE_CHECKING:
    from worker.engine.engine import Engine

log = logging.getLogger(__name__)

CALIBRATION_TOKENS = 512
# A short mix of what batch jobs send: prose, a question, numbers, code, a list.
_CALIBRATION_CHAT = [
    {"role": "system", "content": "You are a careful assistant. Answer briefly and exactly."},
    {
        "role": "user",
        "content": (
            "Summarise the following notes, then answer the question at the end.\n"
            "1. The river rose 2.4 metres overnight after 63 mm of rain fell on the hills.\n"
            "2. Shops on Mill Street opened late; the bakery handed out 150 free loaves.\n"
            "3. Engineers say the 1891 stone bridge is safe, but the footpath stays shut.\n"
            "def flood_level(rain_mm: float, base_m: float = 1.2) -> float:\n"
            "    return base_m + 0.038 * rain_mm  # fitted on 2019-2024 gauge data\n"
            "Question: what level does the formula give for 63 mm, and is the bridge open?"
        ),
    },
    {
        "role": "assistant",
        "content": (
            "Heavy rain raised the river, businesses adapted, and the old bridge held. "
            "The formula gives 1.2 + 0.038 x 63 = 3.594 metres. The bridge is safe, but "
            "its footpath is closed, so walkers must use the Station Road crossing."
        ),
    },
]


def calibration_ids(engine: Engine) -> list[int]:
    """The calibration text in the model's tokens, up to CALIBRATION_TOKENS (repeated to
    fill them); seeded random ids for a model without a tokenizer (dummy weights)."""
    from worker.models.tokenizer import load_tokenizer_or_none, prompt_ids

    limit = min(CALIBRATION_TOKENS, engine.max_seq_len)
    tokenizer = load_tokenizer_or_none(str(engine.loaded.path))
    if tokenizer is None or tokenizer.chat_template is None:
        generator = torch.Generator().manual_seed(0)
        vocab = engine.model_config.vocab_size
        return torch.randint(0, vocab, (limit,), generator=generator).tolist()
    ids = prompt_ids(tokenizer, messages=_CALIBRATION_CHAT)
    return (ids * (-(-limit // len(ids))))[:limit]


@torch.inference_mode()
def calibrate_kv_scales(engine: Engine, token_ids: list[int]) -> tuple[list[float], list[float]]:
    """Fit and set the engine's FP8 KV scales from one prefill pass over ``token_ids``.

    The pass runs on a private model-dtype pool with the torch reference attention, so every
    layer sees the exact K/V of the layers before it (not their FP8 rounding); the largest
    |k| and |v| of each layer are then read from that pool. Returns (k_scale, v_scale)."""
    from worker.attention.torch_ref import TorchRefBackend

    kv, n, page_size = engine.kv, len(token_ids), engine.page_size
    device = engine.device
    if n < 1:
        raise ValueError("no calibration tokens")
    pages = -(-n // page_size)
    pool = KVPool(kv.num_layers, pages, page_size, kv.num_kv_heads, kv.head_dim, kv.model_dtype, device)
    page_table = torch.arange(pages * page_size, dtype=torch.int32, device=device).unsqueeze(0)
    backend = TorchRefBackend(pool, page_table, engine.model_config.num_q_heads, kv.head_dim, page_size)
    layout = BatchLayout(
        slots_cpu=torch.zeros(1, dtype=torch.int32),
        cached_lens_cpu=torch.zeros(1, dtype=torch.int32),
        extend_lens_cpu=torch.tensor([n], dtype=torch.int32),
    )
    locations = torch.arange(n, device=device)
    engine.model(
        ForwardBatch(
            input_ids=torch.tensor(token_ids, dtype=torch.int64, device=device),
            positions=locations,
            out_loc=locations,
            sample_idx=torch.tensor([n - 1], device=device),
            layout=layout,
            backend=backend,
            attn_meta=backend.plan(layout),
            kv=pool,
        )
    )
    # unused slots of the last page hold zeros, which never raise a maximum
    k_amax = [pool.k_buffer(layer).abs().amax().item() for layer in range(kv.num_layers)]
    v_amax = [pool.v_buffer(layer).abs().amax().item() for layer in range(kv.num_layers)]
    k_scale = [_scale(a) for a in k_amax]
    v_scale = [_scale(a) for a in v_amax]
    kv.set_scales(k_scale, v_scale)
    log.info(
        "FP8 KV scales from %d calibration tokens: k %.3g-%.3g, v %.3g-%.3g",
        n, min(k_scale), max(k_scale), min(v_scale), max(v_scale),
    )  # fmt: skip
    return k_scale, v_scale


def _scale(amax: float) -> float:
    """The scale that maps amax to FP8_E4M3_MAX / HEADROOM; 1.0 for a layer that stored zeros."""
    return amax * HEADROOM / FP8_E4M3_MAX if amax > 0 and amax == amax else 1.0

"""Log-probabilities of the sampled tokens and of the most likely ones, on the device.

Which logprobs: the log-softmax, in float32, of the model's raw logits, before penalties,
logit_bias, min_tokens, temperature and the top-k/top-p/min-p filters (vLLM's default,
"raw_logprobs"; OpenAI reports the model's distribution the same way). A token's logprob is
therefore what the model gave it, whatever the sampling settings did to the draw.

Only the rows that ask for logprobs are computed. The results ride in the same device-to-host
copy as the sampled tokens: one int32 buffer holding the tokens, then the sampled tokens'
logprobs, the top ids and the top logprobs (floats stored by their bits), so asking for
logprobs adds no synchronisation.

    [ tokens (B) | sampled logprob (P) | top ids (P*K) | top logprobs (P*K) ]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True)
class LogprobRows:
    """The rows of a batch that want logprobs: ``rows`` on the device, ``rows_cpu`` and each
    one's number of top logprobs ``top_cpu`` on the host; ``top_k`` is their largest."""

    rows: torch.Tensor  # int64 [P]
    rows_cpu: tuple[int, ...]
    top_cpu: tuple[int, ...]
    top_k: int


def logprob_rows(top_logprobs: Sequence[int | None], device: torch.device) -> LogprobRows | None:
    """``top_logprobs[i]``: how many top logprobs row i wants, None when it wants no logprobs.
    None when no row wants any."""
    picked = [i for i, top in enumerate(top_logprobs) if top is not None]
    if not picked:
        return None
    top = tuple(int(top_logprobs[i]) for i in picked)  # type: ignore[arg-type]
    host = torch.tensor(picked, dtype=torch.int64)
    rows = host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host
    return LogprobRows(rows, tuple(picked), top, max(top))


class RawLogprobs(NamedTuple):
    """log_softmax of the raw logits of the chosen rows, and their top_k (device)."""

    logprobs: torch.Tensor  # float32 [P, vocab]
    top_values: torch.Tensor  # float32 [P, K]
    top_ids: torch.Tensor  # int64 [P, K]


def raw_logprobs(logits: torch.Tensor, lr: LogprobRows) -> RawLogprobs:
    """Computed from ``logits`` [B, vocab] before anything changes them."""
    logprobs = torch.log_softmax(logits.index_select(0, lr.rows).float(), dim=-1)
    top_values, top_ids = logprobs.topk(lr.top_k, dim=-1)
    return RawLogprobs(logprobs, top_values, top_ids)


def pack_with_tokens(tokens: torch.Tensor, raw: RawLogprobs | None, lr: LogprobRows | None) -> torch.Tensor:
    """int32 [B + P + 2*P*K]: the layout of the module docstring (just ``tokens`` without logprobs)."""
    tokens = tokens.to(torch.int32)
    if raw is None or lr is None:
        return tokens
    sampled = raw.logprobs.gather(1, tokens.index_select(0, lr.rows).long().unsqueeze(1)).squeeze(1)
    parts = [
        tokens,
        sampled.view(torch.int32),
        raw.top_ids.to(torch.int32).flatten(),
        raw.top_values.contiguous().view(torch.int32).flatten(),
    ]
    return torch.cat(parts)


class HostLogprobs(NamedTuple):
    """Views of the host copy (read them once the copy is done)."""

    rows: tuple[int, ...]  # batch rows, as LogprobRows.rows_cpu
    top: tuple[int, ...]  # top logprobs each row wants
    sampled: torch.Tensor  # float32 [P]
    top_ids: torch.Tensor  # int32 [P, K]
    top_values: torch.Tensor  # float32 [P, K]

    def by_row(self) -> dict[int, tuple[float, list[int], list[float]]]:
        """Batch row -> (sampled token's logprob, top ids, top logprobs), most likely first."""
        sampled = self.sampled.tolist()
        ids, values = self.top_ids.tolist(), self.top_values.tolist()
        return {
            row: (sampled[j], ids[j][:k], values[j][:k])
            for j, (row, k) in enumerate(zip(self.rows, self.top, strict=True))
        }


def unpack(
    host: torch.Tensor, batch_size: int, lr: LogprobRows | None
) -> tuple[torch.Tensor, HostLogprobs | None]:
    """The tokens [B] and logprobs of a packed host buffer (views, nothing read)."""
    tokens = host[:batch_size]
    if lr is None:
        return tokens, None
    p, k = len(lr.rows_cpu), lr.top_k
    sampled, top_ids, top_values = host[batch_size:].split([p, p * k, p * k])
    return tokens, HostLogprobs(
        lr.rows_cpu,
        lr.top_cpu,
        sampled.view(torch.float32),
        top_ids.view(p, k),
        top_values.view(torch.float32).view(p, k),
    )

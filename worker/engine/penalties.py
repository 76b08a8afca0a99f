"""Penalties, logit_bias and min_tokens, on the device, for the rows of a batch that use them.

They change the model's logits (in float32) in this order, before temperature and the
top-k/top-p/min-p filters, greedy rows included:

1. ``repetition_penalty`` r (transformers' RepetitionPenaltyLogitsProcessor): every token that
   occurs in the prompt or the output so far: ``logit / r`` where the logit is positive,
   ``logit * r`` otherwise (once per token, however often it occurs).
2. ``frequency_penalty`` f and ``presence_penalty`` p (OpenAI, vLLM): with ``c`` the number of
   times a token occurs in the output so far (the prompt not counted),
   ``logit - f * c - p * (c > 0)``.
3. ``logit_bias``: ``logit + bias[token]`` (a key given twice: the last one counts).
4. ``min_tokens``: while fewer than min_tokens tokens were generated, the EOS ids (unless
   ignore_eos) and ``stop_token_ids`` get ``-inf``.

The token history is read on the device from the engine's token pool (row = the request's
slot, positions [0, len)), so the host never uploads it; the scheduler writes a penalised
request's whole prompt there, prefix-cache hits included. A batch in which no request uses
any of these carries no Penalties and runs none of this (no extra kernel, copy or sync).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

if TYPE_CHECKING:
    from wire.schema import SamplingParams


class PenaltyRow(NamedTuple):
    """One request's penalty settings as the device applies them; constant while it runs."""

    frequency: float
    presence: float
    repetition: float
    bias: dict[int, float]  # token id -> bias, ids in the vocabulary
    min_tokens: int
    stop_tokens: tuple[int, ...]  # masked while fewer than min_tokens tokens were generated
    bias_tokens: np.ndarray  # int64: bias's keys, and its values (float32), as a step adds them
    bias_values: np.ndarray
    stop_array: np.ndarray  # int64 stop_tokens, and as many float32 -inf
    stop_values: np.ndarray

    @property
    def needs_history(self) -> bool:
        return self.repetition != 1.0 or self.frequency != 0.0 or self.presence != 0.0


def needs_token_history(params: SamplingParams) -> bool:
    """Whether the request's penalties read its tokens (then its whole prompt must be in the
    token pool, prefix-cache hits included)."""
    return (
        params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
    )


def penalty_row(params: SamplingParams, eos_token_ids: Collection[int], vocab_size: int) -> PenaltyRow | None:
    """The request's PenaltyRow, or None when it uses none of them (the fast path).

    logit_bias ids must already be in the vocabulary (intake refuses others); stop ids
    outside it are dropped (they can never be sampled)."""
    bias = {int(key): float(value) for key, value in params.logit_bias.items()}
    stops: tuple[int, ...] = ()
    if params.min_tokens > 0:
        candidates = [*params.stop_token_ids, *(() if params.ignore_eos else sorted(eos_token_ids))]
        stops = tuple(dict.fromkeys(t for t in candidates if 0 <= t < vocab_size))
    row = PenaltyRow(
        params.frequency_penalty,
        params.presence_penalty,
        params.repetition_penalty,
        bias,
        params.min_tokens if stops else 0,
        stops,
        np.fromiter(bias.keys(), dtype=np.int64, count=len(bias)),
        np.fromiter(bias.values(), dtype=np.float32, count=len(bias)),
        np.asarray(stops, dtype=np.int64),
        np.full(len(stops), -np.inf, dtype=np.float32),
    )
    return row if (row.needs_history or row.bias or row.min_tokens) else None


def bias_refusal(params: SamplingParams, vocab_size: int) -> str | None:
    """Why the request's logit_bias cannot run on a vocabulary of ``vocab_size``, or None."""
    bad = next((key for key in params.logit_bias if int(key) >= vocab_size), None)
    if bad is None:
        return None
    return f"logit_bias: token {bad} not in [0, {vocab_size})"


@dataclass(frozen=True)
class Penalties:
    """The penalty work of one batch, for its P rows that use any (device tensors).

    ``rows`` index the batch; request j's tokens are ``token_pool[slots[j], :lens[j]]``,
    the first ``prompt_lens[j]`` of them its prompt. ``sparse_*`` list N additions
    (logit_bias, and -inf for min_tokens) as (row j, token, value)."""

    rows: torch.Tensor  # int64 [P]
    slots: torch.Tensor  # int64 [P]
    prompt_lens: torch.Tensor  # int64 [P]
    lens: torch.Tensor  # int64 [P]
    sparse_rows: torch.Tensor  # int64 [N], in [0, P)
    sparse_tokens: torch.Tensor  # int64 [N]
    frequency: torch.Tensor  # float32 [P]
    presence: torch.Tensor  # float32 [P]
    repetition: torch.Tensor  # float32 [P]
    sparse_values: torch.Tensor  # float32 [N]
    token_pool: torch.Tensor  # the engine's [slots, max_seq_len] int32 token table
    history_len: int  # tokens of history to read: 0 when no row needs any
    use_repetition: bool
    use_frequency_presence: bool

    @property
    def buffers(self) -> tuple[torch.Tensor, ...]:
        """One view of each host-to-device copy (for record_stream)."""
        return self.rows, self.frequency


def _to_device(values: np.ndarray, device: torch.device) -> torch.Tensor:
    host = torch.from_numpy(values)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


def build_penalties(
    rows: Sequence[PenaltyRow | None],
    slots: Sequence[int],
    prompt_lens: Sequence[int],
    lens: Sequence[int],
    token_pool: torch.Tensor,
) -> Penalties | None:
    """The Penalties of a batch (one entry per request in each argument), or None when no
    request does anything at this step. ``lens[i]``: tokens request i holds before this pass
    (prompt + generated). Copies are queued on the current stream without waiting."""
    picked = [i for i, row in enumerate(rows) if row is not None]
    chosen = [row for row in rows if row is not None]
    # NOTE: each row's additions are arrays built once (PenaltyRow): a step concatenates them
    # instead of looping over up to MAX_LOGIT_BIAS entries per request in Python
    counts: list[int] = []
    tokens: list[np.ndarray] = []
    values: list[np.ndarray] = []
    history_len = 0
    for i, row in zip(picked, chosen, strict=True):
        if row.needs_history:
            history_len = max(history_len, lens[i])
        masked = lens[i] - prompt_lens[i] < row.min_tokens
        tokens += [row.bias_tokens, row.stop_array] if masked else [row.bias_tokens]
        values += [row.bias_values, row.stop_values] if masked else [row.bias_values]
        counts.append(len(row.bias_tokens) + (len(row.stop_tokens) if masked else 0))
    sparse_rows = np.repeat(np.arange(len(picked), dtype=np.int64), counts)
    if not (history_len or len(sparse_rows)):
        return None
    device = token_pool.device
    header = [
        *picked,
        *(slots[i] for i in picked),
        *(prompt_lens[i] for i in picked),
        *(lens[i] for i in picked),
    ]
    ints = _to_device(np.concatenate([np.asarray(header, dtype=np.int64), sparse_rows, *tokens]), device)
    params = [r.frequency for r in chosen] + [r.presence for r in chosen] + [r.repetition for r in chosen]
    floats = _to_device(np.concatenate([np.asarray(params, dtype=np.float32), *values]), device)
    p, n = len(picked), len(sparse_rows)
    rows_d, slots_d, prompt_d, lens_d, sparse_rows_d, sparse_tokens_d = ints.split([p, p, p, p, n, n])
    freq_d, pres_d, rep_d, values_d = floats.split([p, p, p, n])
    return Penalties(
        rows=rows_d,
        slots=slots_d,
        prompt_lens=prompt_d,
        lens=lens_d,
        sparse_rows=sparse_rows_d,
        sparse_tokens=sparse_tokens_d,
        frequency=freq_d,
        presence=pres_d,
        repetition=rep_d,
        sparse_values=values_d,
        token_pool=token_pool,
        history_len=history_len,
        use_repetition=any(r.repetition != 1.0 for r in chosen),
        use_frequency_presence=any(r.frequency or r.presence for r in chosen),
    )


def _token_counts(tokens: torch.Tensor, mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 [P, vocab]: how often each token occurs in ``tokens`` [P, L] where ``mask``."""
    index = tokens.masked_fill(~mask, vocab)  # NOTE: masked-out entries land in a spare column
    counts = torch.zeros(tokens.shape[0], vocab + 1, dtype=torch.float32, device=tokens.device)
    counts.scatter_add_(1, index, mask.float())
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, p: Penalties) -> torch.Tensor:
    """float32 logits [B, vocab] with the penalties applied to ``p.rows`` (rules: module
    docstring); ``logits`` itself is left as it was."""
    vocab = logits.shape[-1]
    x = logits.index_select(0, p.rows).float()
    if p.history_len:
        positions = torch.arange(p.history_len, device=logits.device)
        tokens = p.token_pool[:, : p.history_len].index_select(0, p.slots).long()
        known = positions.unsqueeze(0) < p.lens.unsqueeze(1)
        if p.use_repetition:
            seen = _token_counts(tokens, known, vocab) > 0
            penalty = p.repetition.unsqueeze(1)
            x = torch.where(seen, torch.where(x > 0, x / penalty, x * penalty), x)
        if p.use_frequency_presence:
            output = known & (positions.unsqueeze(0) >= p.prompt_lens.unsqueeze(1))
            counts = _token_counts(tokens, output, vocab)
            x = x - p.frequency.unsqueeze(1) * counts - p.presence.unsqueeze(1) * (counts > 0)
    if p.sparse_rows.numel():
        x.index_put_((p.sparse_rows, p.sparse_tokens), p.sparse_values, accumulate=True)
    return logits.float().index_copy(0, p.rows, x)

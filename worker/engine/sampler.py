"""Token sampling on the device: greedy, temperature, top-k, top-p, min-p, per-request seeds.

Sampling is by inverse CDF: each row draws one uniform ``u`` from a counter-based hash of
(seed, step) computed with torch integer ops, and picks the first token whose cumulative
probability exceeds ``u`` (times the row's total mass). A seeded request therefore draws
the same token at the same output position whatever else shares its batch, every row costs
O(vocab) memory traffic, and nothing here synchronises with the host.

Penalties, logit_bias and min_tokens change the logits first (worker.engine.penalties), after
structured output's mask; a row they leave without any allowed token (min_tokens masking the
EOS that a complete grammar alone allows) keeps the mask's logits: the grammar wins.
Filters apply in this order, each on the survivors of the previous one: top-k (the k most
likely tokens), top-p (the smallest prefix, by probability, whose mass after renormalising
reaches top_p; the most likely token always survives), min-p (tokens whose probability is
below min_p times the largest). Excluded tokens get probability 0 and are never drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.logprobs import LogprobRows
from worker.engine.penalties import Penalties, apply_penalties

_MASK32 = 0xFFFFFFFF
# Multipliers stay below 2**31 so products of 32-bit values never overflow int64.
_MUL_A = 0x7FEB352D
_MUL_B = 0x68E31DA5
_SALT = 0x27D4EB2F


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mix of int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL_A) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL_B) & _MASK32
    return x ^ (x >> 16)


def row_uniforms(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """float64 [B] uniforms in (0, 1) with 53 random bits, a pure function of (seed, step)."""
    seed_lo, seed_hi = seeds & _MASK32, (seeds >> 32) & _MASK32
    key = _mix32(seed_lo ^ _mix32(seed_hi ^ _mix32(steps & _MASK32)))
    high = _mix32(key ^ _SALT)  # 32 bits
    low = _mix32(high ^ key) >> 11  # 21 bits
    return ((high << 21) | low).double().add(0.5).mul(2.0**-53)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index of the first column whose running mass exceeds u * total, per row."""
    cdf = probs.double().cumsum(dim=-1)
    target = (u * cdf[:, -1]).unsqueeze(1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return index.clamp_max(probs.shape[-1] - 1)


@dataclass(frozen=True)
class SamplingTensors:
    """Per-request sampling parameters as device tensors [B]; flags say which filters run.

    ``steps`` is each request's output position (0 for its first generated token);
    ``top_k`` holds vocab-independent "off" as 0. Built by the scheduler's batch preparer
    (worker.scheduler.prepare; ``sampling_tensors`` there for a batch outside a pass).
    """

    temperature: torch.Tensor  # float32, 1.0 where greedy (unused there)
    top_p: torch.Tensor  # float32
    top_k: torch.Tensor  # int64, 0 = off
    min_p: torch.Tensor  # float32
    seeds: torch.Tensor  # int64
    steps: torch.Tensor  # int64
    greedy: torch.Tensor  # bool
    all_greedy: bool
    use_top_k: bool
    use_top_p: bool
    use_min_p: bool
    # None unless a request of the batch uses them (worker.engine.penalties, .logprobs)
    penalties: Penalties | None = None
    logprobs: LogprobRows | None = None

    @property
    def side_buffers(self) -> tuple[torch.Tensor, ...]:
        """Device tensors copied for penalties and logprobs (for record_stream)."""
        penalties = self.penalties.buffers if self.penalties is not None else ()
        return penalties + ((self.logprobs.rows,) if self.logprobs is not None else ())


class Sampler:
    """Turns logits [B, vocab] (any float dtype) into int32 tokens [B] on the same device."""

    def sample(
        self, logits: torch.Tensor, t: SamplingTensors, token_bitmask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``token_bitmask`` (structured output, on logits' device): tokens whose bit is clear
        are never drawn; the logits are masked in place before anything else."""
        if token_bitmask is not None:
            from worker.engine.grammar import apply_token_bitmask

            apply_token_bitmask(logits, token_bitmask)
        if t.penalties is not None:
            penalized = apply_penalties(logits, t.penalties)
            if token_bitmask is not None:
                # NOTE: min_tokens' -inf on the stop tokens leaves a row whose grammar is complete
                # (it allows EOS only) no token at all: the grammar wins, that row keeps its
                # masked logits and may end (vLLM's logits processors would draw garbage there)
                stuck = torch.isneginf(penalized).all(dim=-1, keepdim=True)
                penalized = torch.where(stuck, logits.float(), penalized)
            logits = penalized
        if not (t.all_greedy or t.use_top_k or t.use_top_p or t.use_min_p) and logits.is_cuda:
            from worker.kernels.sampling import sample_unfiltered

            # one fused kernel on CUDA: the same draw rule as below (worker.kernels.sampling)
            fused = sample_unfiltered(logits, t.temperature, t.seeds, t.steps, t.greedy)
            if fused is not None:
                return fused
        return self.sample_torch(logits, t)

    def sample_torch(self, logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
        """The draw in torch operations (any device): the rule the fused kernel follows, and
        the only path for top-k/top-p/min-p rows, all-greedy batches and the CPU."""
        greedy_tokens = logits.argmax(dim=-1)
        if t.all_greedy:
            return greedy_tokens.to(torch.int32)
        scaled = logits.float() / t.temperature.unsqueeze(1)
        u = row_uniforms(t.seeds, t.steps)
        if t.use_top_k or t.use_top_p or t.use_min_p:
            sorted_logits, order = scaled.sort(dim=-1, descending=True)
            probs = torch.softmax(self._filter_sorted(sorted_logits, t), dim=-1)
            sampled = order.gather(1, _inverse_cdf(probs, u).unsqueeze(1)).squeeze(1)
        else:
            sampled = _inverse_cdf(torch.softmax(scaled, dim=-1), u)
        return torch.where(t.greedy, greedy_tokens, sampled).to(torch.int32)

    @staticmethod
    def _filter_sorted(sorted_logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
        """Logits sorted descending, with excluded tokens set to -inf (rules: module docstring)."""
        vocab = sorted_logits.shape[-1]
        rank = torch.arange(vocab, device=sorted_logits.device).unsqueeze(0)
        excluded = torch.zeros_like(sorted_logits, dtype=torch.bool)
        if t.use_top_k:
            k = torch.where(t.top_k > 0, t.top_k, vocab).unsqueeze(1)
            excluded |= rank >= k
        if t.use_top_p:
            probs = torch.softmax(sorted_logits.masked_fill(excluded, float("-inf")), dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            excluded |= (mass_before >= t.top_p.unsqueeze(1)) & (t.top_p < 1.0).unsqueeze(1)
        if t.use_min_p:
            probs = torch.softmax(sorted_logits.masked_fill(excluded, float("-inf")), dim=-1)
            excluded |= probs < t.min_p.unsqueeze(1) * probs[:, :1]
        return sorted_logits.masked_fill(excluded, float("-inf"))

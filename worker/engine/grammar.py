"""Structured output: grammars compiled by xgrammar, one matcher per choice, a token bitmask per step.

A job constrained by ``json_schema``, ``json_object``, ``regex`` or ``choice``
(producer.schema.SamplingParams) gets a grammar when it is admitted: compiled once per
canonical key and kept in a bounded LRU cache (``Grammars.compile``), then one ``Matcher`` per
choice. Each step that samples a constrained choice, the host fills one bitmask row per
request from the matchers (``Grammars.token_bitmask``: 32 tokens per int32 word, a set bit
allows the token; unconstrained rows allow every token), the sampler applies it to the logits
(``apply_token_bitmask``: disallowed tokens get -inf, CPU and CUDA alike) and the scheduler
feeds the sampled token back into the matcher. The model's EOS tokens are the grammar's stop
tokens: they are allowed only where the grammar is complete, and a matcher that accepted one
is terminated, which ends the choice with finish_reason "stop".

JSON is generated without free whitespace (xgrammar's ``any_whitespace=False``: separators
``", "`` and ``": "``), so a model can never wander in whitespace instead of closing the object.
A choice list is the grammar ``root ::= "a" | "b" | ...``.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from producer.schema import SamplingParams

GRAMMAR_CACHE_SIZE = 256  # compiled grammars kept by the scheduler process (least recently used go)
_XGRAMMAR_PREFIX = re.compile(r"^\[[^\]]*\] \S+:\d+: ")  # "[06:12:14] /project/cpp/x.cc:94: "


class GrammarError(ValueError):
    """A structured-output constraint that cannot be compiled: names the field and why."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


def grammar_key(sampling: SamplingParams) -> tuple[str, str] | None:
    """(field, canonical text) of the job's constraint, the compiled-grammar cache key; None
    when the job is unconstrained. Schemas differing only in whitespace share a key; the order
    of keys is kept (properties are generated in the order the schema lists them)."""
    field = sampling.structured
    if field == "json_schema":
        return field, json.dumps(sampling.json_schema, separators=(",", ":"))
    if field == "json_object":
        return field, ""
    if field == "regex":
        assert sampling.regex is not None
        return field, sampling.regex
    if field == "choice":
        assert sampling.choice is not None
        return field, "root ::= " + " | ".join(json.dumps(option) for option in sampling.choice)
    return None


class Matcher:
    """One choice's position in its grammar; the scheduler feeds it every sampled token."""

    def __init__(self, matcher: Any) -> None:
        self.xgr = matcher  # xgrammar.GrammarMatcher
        self.rejected = False  # a token the grammar did not allow arrived (cannot happen when masked)

    def accept(self, token_id: int) -> None:
        if not self.rejected and not self.xgr.accept_token(token_id):
            self.rejected = True

    @property
    def terminated(self) -> bool:
        """The grammar is complete and a stop token was accepted."""
        return bool(self.xgr.is_terminated())

    @property
    def done(self) -> bool:
        return self.rejected or self.terminated


class Grammars:
    """The scheduler process's grammar engine for one model: compiles, caches, makes matchers,
    fills bitmasks. ``vocab_size`` is the logits' width (the model's, which may exceed the
    tokenizer's); ``stop_token_ids`` the model's EOS tokens."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Collection[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids)
        )
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=False)  # NOTE: cached here, by key
        self._batch = xgr.BatchGrammarMatcher()
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.cache_hits = 0
        self.cache_misses = 0

    def compile(self, sampling: SamplingParams) -> Any:
        """The job's compiled grammar (xgrammar.CompiledGrammar), from the cache when its key was
        seen. Raises GrammarError naming the field when it cannot be compiled."""
        key = grammar_key(sampling)
        assert key is not None, "compile() of an unconstrained job"
        compiled = self._cache.get(key)
        if compiled is not None:
            self._cache.move_to_end(key)
            self.cache_hits += 1
            return compiled
        self.cache_misses += 1
        field, text = key
        try:
            if field == "json_schema":
                compiled = self._compiler.compile_json_schema(text, any_whitespace=False)
            elif field == "json_object":
                compiled = self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            elif field == "regex":
                compiled = self._compiler.compile_regex(text)
            else:
                compiled = self._compiler.compile_grammar(text)
        except Exception as exc:  # NOTE: xgrammar raises RuntimeError (C++) and others; all the job's
            raise GrammarError(field, _xgrammar_reason(exc)) from None
        self._cache[key] = compiled
        if len(self._cache) > GRAMMAR_CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: Any) -> Matcher:
        return Matcher(self._xgr.GrammarMatcher(compiled))

    def token_bitmask(self, matchers: Sequence[Matcher | None]) -> torch.Tensor | None:
        """int32 [B, ceil(vocab/32)] host bitmask for a batch (row i: request i), or None when no
        row is constrained. Rows of None or done matchers allow every token (those tokens are
        ignored or unconstrained). Pinned when CUDA is available: the engine copies it
        without waiting."""
        rows = [i for i, m in enumerate(matchers) if m is not None and not m.done]
        if not rows:
            return None
        shape = (len(matchers), -(-self.vocab_size // 32))
        bitmask = torch.full(shape, -1, dtype=torch.int32, pin_memory=torch.cuda.is_available())
        live = [matchers[i].xgr for i in rows]  # type: ignore[union-attr]
        self._batch.batch_fill_next_token_bitmask(live, bitmask, indices=rows)
        return bitmask


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set logits [B, vocab] of tokens whose bit is clear in ``bitmask`` (int32 [B, words], on
    logits' device) to -inf, in place: xgrammar's kernel on CUDA, its C++ loop on CPU."""
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1])


def load_grammars(model_path: str, vocab_size: int, stop_token_ids: Collection[int]) -> Grammars | None:
    """The grammar engine for the model directory's tokenizer; None when it has none."""
    from worker.models.tokenizer import load_tokenizer_or_none

    tokenizer = load_tokenizer_or_none(model_path)
    return None if tokenizer is None else Grammars(tokenizer, vocab_size, stop_token_ids)


def _xgrammar_reason(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return _XGRAMMAR_PREFIX.sub("", text)

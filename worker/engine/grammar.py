"""Structured output: grammars compiled by xgrammar, one matcher per choice, a token bitmask per step.

A job constrained by ``json_schema``, ``json_object``, ``regex`` or ``choice``
(wire.schema.SamplingParams) gets a grammar before it is admitted: compiled once per
canonical key, in a child process off the scheduler's loop and within a time limit
(worker.engine.grammar_compiler; ``Grammars.submit`` / ``poll``), and kept in a bounded LRU
cache, then one ``Matcher`` per choice. Each step that samples a constrained choice, the host fills one bitmask row per
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
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import torch

from worker.engine.grammar_compiler import (
    DEFAULT_MEMORY_LIMIT_MIB,
    BackgroundCompiler,
    compile_text,
    xgrammar_reason,
)

if TYPE_CHECKING:
    from wire.schema import SamplingParams

GRAMMAR_CACHE_SIZE = 256  # compiled grammars kept by the scheduler process (least recently used go)
GRAMMAR_CACHE_BYTES = 1 << 30  # and at most this much of them (xgrammar's memory_size_bytes)


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
    tokenizer's). Built by ``from_tokenizer`` (compiles here, ``compile``) or ``in_background``
    (compiles in the child process, ``submit``/``poll``; the tokenizer is loaded there too and
    its xgrammar TokenizerInfo arrives with the child's first reply, so the scheduler's
    thread never loads it)."""

    def __init__(
        self, vocab_size: int, info: Any = None, background: BackgroundCompiler | None = None
    ) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        self._info = info  # xgrammar.TokenizerInfo
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=False) if info is not None else None
        self._batch = xgr.BatchGrammarMatcher()
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()  # NOTE: xgrammar's cache is off
        self._cache_bytes = 0
        self._failed: OrderedDict[tuple[str, str], str] = OrderedDict()  # key -> why its compile failed
        self.cache_hits = 0
        self.cache_misses = 0
        self.background = background

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, vocab_size: int, stop_token_ids: Collection[int]) -> Grammars:
        """Compiling on the caller's thread; ``stop_token_ids`` are the model's EOS tokens."""
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids)
        )
        return cls(vocab_size, info)

    @classmethod
    def in_background(
        cls,
        model_path: str,
        vocab_size: int,
        stop_token_ids: Collection[int],
        timeout_s: float,
        memory_limit_mib: int = DEFAULT_MEMORY_LIMIT_MIB,
    ) -> Grammars:
        """Compiling in a child process that reads the tokenizer of ``model_path``; a compile
        that runs past ``timeout_s`` or grows the child by more than ``memory_limit_mib`` is
        stopped and fails its jobs."""
        background = BackgroundCompiler(model_path, vocab_size, stop_token_ids, timeout_s, memory_limit_mib)
        return cls(vocab_size, background=background)

    def cached(self, sampling: SamplingParams) -> Any | None:
        """The job's compiled grammar when its key is in the cache, else None."""
        key = grammar_key(sampling)
        assert key is not None, "a grammar for an unconstrained job"
        compiled = self._cache.get(key)
        if compiled is not None:
            self._cache.move_to_end(key)
            self.cache_hits += 1
        return compiled

    def compile(self, sampling: SamplingParams) -> Any:
        """The job's compiled grammar (xgrammar.CompiledGrammar), compiled here, on this thread,
        when its key is not cached. Raises GrammarError naming the field when it cannot be
        compiled. The scheduler uses ``submit``/``poll`` instead: no limit on time here."""
        compiled = self.cached(sampling)
        if compiled is not None:
            return compiled
        assert self._compiler is not None, "compile() without a tokenizer (in_background: submit/poll)"
        self.cache_misses += 1
        key = grammar_key(sampling)
        assert key is not None
        try:
            compiled = compile_text(self._compiler, *key)
        except Exception as exc:  # NOTE: xgrammar raises RuntimeError (C++) and others; all the job's
            raise GrammarError(key[0], xgrammar_reason(exc)) from None
        return self._keep(key, compiled)

    def submit(self, uid: str, sampling: SamplingParams) -> Any | None:
        """The job's compiled grammar when cached; else None, and its key goes to the background
        compiler: ``poll`` answers ``uid`` later. Raises GrammarError at once for a key whose
        compile failed before (invalid, too slow, crashed the compiler): it is not tried again."""
        compiled = self.cached(sampling)
        if compiled is None:
            assert self.background is not None, "submit() without a background compiler"
            key = grammar_key(sampling)
            assert key is not None
            failed = self._failed.get(key)
            if failed is not None:
                self._failed.move_to_end(key)
                raise GrammarError(key[0], failed)
            self.cache_misses += 1
            self.background.submit(uid, key)
        return compiled

    def poll(self) -> list[tuple[str, Any]]:
        """(uid, compiled grammar or GrammarError) for each submitted job whose compile ended."""
        if self.background is None:
            return []
        done: list[tuple[str, Any]] = []
        finished = self.background.poll()
        if self._info is None:
            self._info = self.background.tokenizer_info
        for uid, key, compiled, error, of_key in finished:
            if compiled is not None:
                compiled = self._keep(key, compiled)
            if compiled is None and of_key:
                self._failed[key] = str(error)
                if len(self._failed) > GRAMMAR_CACHE_SIZE:
                    self._failed.popitem(last=False)
            done.append((uid, compiled if compiled is not None else GrammarError(key[0], str(error))))
        return done

    def cancel(self, uid: str) -> None:
        if self.background is not None:
            self.background.cancel(uid)

    def close(self) -> None:
        if self.background is not None:
            self.background.close()

    def _keep(self, key: tuple[str, str], compiled: Any) -> Any:
        """Cache ``compiled``: at most GRAMMAR_CACHE_SIZE grammars and GRAMMAR_CACHE_BYTES of
        them (the least recently used go; the newest always stays)."""
        if key not in self._cache:
            self._cache[key] = compiled
            self._cache_bytes += _size_bytes(compiled)
        while len(self._cache) > 1 and (
            len(self._cache) > GRAMMAR_CACHE_SIZE or self._cache_bytes > GRAMMAR_CACHE_BYTES
        ):
            _, dropped = self._cache.popitem(last=False)
            self._cache_bytes -= _size_bytes(dropped)
        return self._cache[key]

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


def _size_bytes(compiled: Any) -> int:
    return int(getattr(compiled, "memory_size_bytes", 0))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set logits [B, vocab] of tokens whose bit is clear in ``bitmask`` (int32 [B, words], on
    logits' device) to -inf, in place: xgrammar's kernel on CUDA, its C++ loop on CPU."""
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[-1])


def load_grammars(model_path: str, vocab_size: int, stop_token_ids: Collection[int]) -> Grammars | None:
    """The grammar engine (compiling on this thread) for the model directory's tokenizer;
    None when it has none."""
    from worker.models.tokenizer import load_tokenizer_or_none

    tokenizer = load_tokenizer_or_none(model_path)
    return None if tokenizer is None else Grammars.from_tokenizer(tokenizer, vocab_size, stop_token_ids)

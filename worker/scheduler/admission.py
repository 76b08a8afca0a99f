"""Admission: a GenerateRequest becomes a running group (now, or once its grammar compiles) or
an error answer; an aborted group leaves wherever it is (compiling, waiting, running or
retracted). Each refusal is a RequestFinished with an error, appended to ``outgoing``."""

from __future__ import annotations

import logging
from typing import Any

from worker.engine.engine import Engine
from worker.kvcache.manager import CacheManager
from worker.kvcache.table import TableManager
from worker.scheduler.decode import DecodeManager
from worker.scheduler.intake import make_group, refusal
from worker.scheduler.messages import GenerateRequest, Outbound, RequestFinished
from worker.scheduler.prefill import PrefillManager
from worker.scheduler.release import release
from worker.scheduler.req import RequestGroup
from worker.scheduler.retract import Retractions
from worker.scheduler.structured import GrammarWaits

logger = logging.getLogger(__name__)


class Admission:
    """Admits into ``groups`` (uid -> the groups not yet answered) and ``prefill``; the
    scheduler owns both, and ``outgoing``, the answers sent at the end of the iteration."""

    def __init__(
        self,
        engine: Engine,
        cache: CacheManager,
        tables: TableManager,
        prefill: PrefillManager,
        decode: DecodeManager,
        retractions: Retractions,
        grammar_waits: GrammarWaits,
        groups: dict[str, RequestGroup],
        outgoing: list[Outbound],
    ) -> None:
        self.engine = engine
        self.cache = cache
        self.tables = tables
        self.prefill = prefill
        self.decode = decode
        self.retractions = retractions
        self.grammar_waits = grammar_waits
        self.groups = groups
        self.outgoing = outgoing

    def admit(self, msg: GenerateRequest) -> None:
        try:
            self._admit_request(msg)
        except Exception as exc:  # one request's surprise is that request's error
            logger.exception("request %s could not be admitted", msg.uid)
            self.groups.pop(msg.uid, None)
            self.reject(msg.uid, len(msg.input_ids), "internal", f"could not be admitted: {exc}")

    def reject(self, uid: str, prompt_len: int, code: str, why: str) -> None:
        self.outgoing.append(
            RequestFinished(
                uid=uid,
                choices=[],
                prompt_tokens=prompt_len,
                cached_tokens=0,
                error_code=code,
                error_message=why,
            )
        )

    def _admit_request(self, msg: GenerateRequest) -> None:
        if msg.uid in self.groups or msg.uid in self.grammar_waits:
            refused: tuple[str, str] | None = ("invalid_job", f"request {msg.uid!r} is already running")
        else:
            refused = refusal(msg, self.engine.max_seq_len, self.engine.vocab_size)
        if (
            refused is None
            and msg.sampling.structured is not None
            and self.engine.config.tensor_parallel_size > 1
        ):
            # NOTE: a grammar compiles in the background and is admitted when it is done, which
            # differs between ranks: their batches would part ways (worker.scheduler.tp)
            refused = ("invalid_job", "structured output is not supported with tensor_parallel_size > 1")
        compiled = None
        if refused is None and msg.sampling.structured is not None:
            compiled, refused = self.grammar_waits.submit(msg)
            if msg.uid in self.grammar_waits:
                return None  # admitted once its grammar is compiled (admit_compiled)
        if refused is not None:
            return self.reject(msg.uid, len(msg.input_ids), *refused)
        self._start_group(msg, compiled)

    def _start_group(self, msg: GenerateRequest, compiled: Any) -> None:
        group, choices = make_group(msg, self.engine.max_seq_len)
        if msg.sampling.structured is not None:
            assert self.grammar_waits.grammars is not None
            for choice in choices:
                choice.grammar = self.grammar_waits.grammars.matcher(compiled)
        self.groups[msg.uid] = group
        self.prefill.add(choices[0])
        group.held_back = choices[1:]  # NOTE: admitted once the first choice's prompt KV is cached

    def admit_compiled(self, wait_s: float) -> None:
        """Admit the requests whose grammar compiled, refuse those whose grammar failed; waits
        up to ``wait_s`` for the compiler when nothing else is to do."""
        for msg, compiled, refused in self.grammar_waits.finished(wait_s):
            if refused is not None:
                self.reject(msg.uid, len(msg.input_ids), *refused)
                continue
            try:
                self._start_group(msg, compiled)
            except Exception as exc:  # one request's surprise is that request's error
                logger.exception("request %s could not be admitted", msg.uid)
                self.groups.pop(msg.uid, None)
                self.reject(msg.uid, len(msg.input_ids), "internal", f"could not be admitted: {exc}")

    def fail_unschedulable(self) -> None:
        """Nothing is in flight and nothing could be launched although requests wait: the one
        running request, or the head of the queue, cannot get its pages even with the whole
        pool. Answer it with an error rather than spin (the engine's limits are meant to make
        this unreachable)."""
        if self.decode.runnable:
            group = self.decode.running[0].pending.group
        else:
            head = self.prefill.head()
            if head is None:
                return
            group = head.group
        capacity = self.cache.num_pages * self.cache.page_size
        why = f"request does not fit the KV pool ({capacity} tokens) even when nothing else runs"
        logger.error("%s: %s", group.uid, why)
        self.abort(group.uid, code="internal", why=why)

    def abort(self, uid: str, code: str = "aborted", why: str = "aborted by the front end") -> None:
        compiling = self.grammar_waits.abort(uid)
        if compiling is not None:
            return self.reject(uid, len(compiling.input_ids), code, why)
        group = self.groups.pop(uid, None)
        if group is None:
            return
        for pending in self.prefill.remove(group):
            if pending.chunk is not None:
                release(pending.chunk, self.cache, self.tables)
                pending.chunk = None
        for req in [r for r in self.decode.running + self.retractions.reqs if r.pending.group is group]:
            req.finished = True
            self.decode.remove(req)
            release(req, self.cache, self.tables)
        self.reject(uid, group.prompt_len, code, why)

"""Scheduler: wires the managers; a step prefills what the token budget admits, else decodes
every running request; while a long prompt is being chunked (``mixed_batches``), each step
decodes every running request and adds the prefills, so a long prompt never stalls them.

One iteration (the same code with overlap on or off):

    receive messages -> schedule + launch step N -> process step N-1 (overlap) or N (plain)
                     -> finish retractions -> send finished requests

Under overlap, step N runs while the host processes step N-1's tokens: the scheduler plans
from lengths (device_len runs ahead of input_ids) and the engine reads the next input ids
from token_pool, so nothing waits for token values except ``_process``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import msgspec
import numpy as np

from worker.engine.engine import Engine
from worker.engine.faults import Fault
from worker.forward import ForwardInput, ForwardOutput
from worker.kvcache.manager import CacheManager
from worker.kvcache.table import TableManager
from worker.scheduler.config import SchedulerConfig
from worker.scheduler.decode import NO_SLOTS, DecodeManager
from worker.scheduler.hooks import StepHooks
from worker.scheduler.intake import make_group, refusal
from worker.scheduler.ledger import SlotLedger, StopRows
from worker.scheduler.messages import (
    AbortRequest,
    ChoiceOutput,
    GenerateRequest,
    Inbound,
    Outbound,
    RequestFinished,
    SchedulerIO,
    ShutdownRequest,
    TokenLogprobs,
)
from worker.scheduler.prefill import PrefillManager
from worker.scheduler.prepare import BatchPreparer
from worker.scheduler.req import ChunkedReq, Req, RequestGroup
from worker.scheduler.stop import Detokenize, Stop, check_stop
from worker.scheduler.structured import GrammarWaits

logger = logging.getLogger(__name__)


class Step(NamedTuple):
    reqs: list[Req]
    is_prefill: bool
    input: ForwardInput
    output: ForwardOutput | None  # None while a constrained step waits to sample (_sample_constrained)
    logits: Any = None  # that step's logits on the device, until then
    stops: StopRows | None = None  # the rows' stop conditions, gathered at launch


class Stats(msgspec.Struct):
    prefill_tokens: int = 0  # tokens computed by prefill passes (chunks included)
    decode_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache at admission
    steps: int = 0
    retractions: int = 0
    decode_steps: int = 0  # steps without prefill rows
    # decode steps run eagerly (no captured graph holds their batch), by batch size
    eager_decode_batches: dict[int, int] = msgspec.field(default_factory=dict)

    def eager_summary(self) -> str:
        """One line: how many decode steps ran eagerly, and their batch sizes."""
        eager = sum(self.eager_decode_batches.values())
        if not eager:
            return f"eager decode steps: 0 of {self.decode_steps}"
        sizes = sorted(self.eager_decode_batches)
        return f"eager decode steps: {eager} of {self.decode_steps} (batch sizes {sizes[0]}-{sizes[-1]})"


class Scheduler:
    def __init__(
        self, engine: Engine, config: SchedulerConfig, io: SchedulerIO, detokenize: Detokenize | None = None
    ) -> None:
        self.engine = engine
        self.config = config
        self.io = io
        self.detokenize = detokenize
        self.tables = TableManager(engine.config.max_running_reqs, engine.page_table, engine.token_pool)
        self.cache = CacheManager(engine.num_pages, engine.page_size, config.cache, self.tables)
        # the running requests' lengths, stop conditions and sampling parameters, by slot
        self.ledger = SlotLedger(self.tables.max_running_reqs + 1, engine.vocab_size)
        self.prefill = PrefillManager(
            self.cache, self.tables, self.ledger, config.output_reserve_ratio, config.schedule_policy
        )
        self.decode = DecodeManager(self.ledger)
        self.preparer = BatchPreparer(engine, self.tables, self.ledger)
        self._eos_token_ids = np.fromiter(engine.eos_token_ids, dtype=np.int64)
        self.groups: dict[str, RequestGroup] = {}
        self.retracting: list[Req] = []
        self.outgoing: list[Outbound] = []  # answers sent to the front end at the end of this iteration
        self.stats = Stats()
        self.shutdown = False
        self.fault: Fault | None = None  # injected failures (tests only)
        self.hooks: StepHooks | None = None  # step observer (profiling), worker.scheduler.hooks
        self.grammar_waits = GrammarWaits(  # structured output's waiting room
            engine, config.grammar_timeout_s, config.grammar_memory_mib
        )
        self._launching: list[Req] = []  # NOTE: the requests of the step under way, named if it fails
        self._processing: list[Req] = []
        # NOTE: the step returned by the last call, kept here too: a caller that drops it (a loop
        # given up, a test that timed out) would leak the pages of the requests that finished in
        # it, which only its processing frees; the next call processes it instead
        self._in_flight: Step | None = None

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        """Loop until a ShutdownRequest arrives (blocking receive only when idle)."""
        last: Step | None = None
        while not (self.shutdown and last is None):
            last = self.step(last)

    def run_until_idle(self) -> None:
        """Serve what has arrived until every request is answered (the offline API's loop)."""
        last: Step | None = None
        while True:
            last = self.step(last, block=False)
            if last is None and self.idle and not self.retracting:
                return

    def step(self, last: Step | None = None, block: bool = True) -> Step | None:
        """One iteration; returns the step still to be processed (overlap) or None.

        ``last``: what the previous call returned (None: that step all the same; the scheduler
        keeps it). Blocks for messages only when ``block`` and nothing is running or waiting."""
        if last is None:
            last = self._in_flight
        assert last is self._in_flight, "step() was given a step other than the one it returned last"
        self._in_flight = None  # NOTE: from here on ``last`` is this call's to process
        busy = last is not None or self.prefill.runnable or self.decode.runnable
        for message in self.io.receive(
            block=block and not (busy or self.grammar_waits) and not self.shutdown
        ):
            self._handle(message)
        if self.grammar_waits:
            self._admit_compiled(wait_s=0.0 if busy else 0.01)
        started_s = time.perf_counter()
        self._launching = []
        self._processing = last.reqs if last is not None else []
        current = None if self.shutdown else self._launch()
        if current is None and last is None and not self.shutdown:
            self._fail_unschedulable()
        if self.engine.config.overlap:
            self._process(last)
        current = self._sample_constrained(current)
        if not self.engine.config.overlap:
            self._process(current)
            current = None
        self._finish_retractions()
        if self.outgoing:
            self.io.send(self._with_load(self.outgoing, time.perf_counter() - started_s))
            self.outgoing = []
        if current is None and not self.prefill.runnable and not self.decode.runnable:
            self.cache.check_integrity([])
        self._in_flight = current
        return current

    def _with_load(self, messages: list[Outbound], step_s: float) -> list[Outbound]:
        """The messages with the scheduler's load stamped on each RequestFinished."""
        load = {
            "running_reqs": len(self.groups),
            "pages_used": self.engine.num_pages - self.cache.allocator.num_free_pages,
            "step_s": step_s,
            "batch_reqs": self.decode.num_running + (self.prefill.chunked is not None),
            "waiting_reqs": len(self.prefill.waiting),
        }
        return [msgspec.structs.replace(m, **load) if isinstance(m, RequestFinished) else m for m in messages]

    @property
    def idle(self) -> bool:
        return not (
            self.prefill.runnable
            or self.decode.runnable
            or self.groups
            or self.grammar_waits
            or self._in_flight
        )

    def failing_uids(self) -> list[str]:
        """The requests of the step under way: the suspects when a step raises."""
        uids = {r.pending.group.uid: None for r in self._launching + self._processing}
        return list(uids)

    # ---- messages -------------------------------------------------------------------------

    def _handle(self, message: Inbound) -> None:
        match message:
            case GenerateRequest():
                try:
                    self._admit_request(message)
                except Exception as exc:  # one request's surprise is that request's error
                    logger.exception("request %s could not be admitted", message.uid)
                    self.groups.pop(message.uid, None)
                    self._reject(
                        message.uid, len(message.input_ids), "internal", f"could not be admitted: {exc}"
                    )
            case AbortRequest(uid=uid):
                self._abort(uid)
            case ShutdownRequest():
                self.shutdown = True

    def _reject(self, uid: str, prompt_len: int, code: str, why: str) -> None:
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
                return None  # admitted once its grammar is compiled (_admit_compiled)
        if refused is not None:
            return self._reject(msg.uid, len(msg.input_ids), *refused)
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

    def _admit_compiled(self, wait_s: float) -> None:
        """Admit the requests whose grammar compiled, refuse those whose grammar failed; waits
        up to ``wait_s`` for the compiler when nothing else is to do."""
        for msg, compiled, refused in self.grammar_waits.finished(wait_s):
            if refused is not None:
                self._reject(msg.uid, len(msg.input_ids), *refused)
                continue
            try:
                self._start_group(msg, compiled)
            except Exception as exc:  # one request's surprise is that request's error
                logger.exception("request %s could not be admitted", msg.uid)
                self.groups.pop(msg.uid, None)
                self._reject(msg.uid, len(msg.input_ids), "internal", f"could not be admitted: {exc}")

    def close(self) -> None:
        """Stop the grammar compiler's process, if one was started."""
        self.grammar_waits.close()

    def _fail_unschedulable(self) -> None:
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
        self._abort(group.uid, code="internal", why=why)

    def _abort(self, uid: str, code: str = "aborted", why: str = "aborted by the front end") -> None:
        compiling = self.grammar_waits.abort(uid)
        if compiling is not None:
            return self._reject(uid, len(compiling.input_ids), code, why)
        group = self.groups.pop(uid, None)
        if group is None:
            return
        for pending in self.prefill.remove(group):
            if pending.chunk is not None:
                self._release(pending.chunk)
                pending.chunk = None
        for req in [r for r in self.decode.running + self.retracting if r.pending.group is group]:
            req.finished = True
            self.decode.remove(req)
            self._release(req)
        self._reject(uid, group.prompt_len, code, why)

    # ---- scheduling -----------------------------------------------------------------------

    def _launch(self) -> Step | None:
        hooks = self.hooks
        if hooks is not None:
            hooks.launch_started()
        reserved = self.decode.reserved_tokens(self.config.output_reserve_ratio)
        budget = self.config.max_prefill_tokens
        # NOTE: mixed only while a prompt is chunked: a mixed step's decode rows run outside the
        # CUDA graphs, which cost 2% on the standard benchmark when every step was mixed
        if self.config.mixed_batches and self.prefill.chunked is not None:
            decoding, decode_slots, decode_pages = self._decode_batch()
            reserved += decode_pages * self.cache.page_size
            prefills = self.prefill.schedule(budget, reserved, decode_pages)
        else:
            prefills = self.prefill.schedule(budget, reserved)
            decoding, decode_slots, _ = ([], NO_SLOTS, 0) if prefills else self._decode_batch()
        reqs = prefills + decoding
        if not reqs:
            return None
        is_prefill = bool(prefills)
        prefill_tokens = sum(r.extend_len for r in prefills)
        self._launching = reqs
        if self.fault is not None:
            self.fault.check([r.pending.input_ids[: r.pending.group.prompt_len] for r in reqs])
        ledger = self.ledger
        slots = decode_slots
        if prefills:
            prefill_slots = np.fromiter((r.slot for r in prefills), dtype=np.int64, count=len(prefills))
            slots = np.concatenate([prefill_slots, decode_slots])
        ledger.alloc_len[slots] = self.cache.allocate(
            slots, ledger.device_len[slots], ledger.alloc_len[slots]
        )
        fi = self.preparer.prepare(reqs, slots, len(prefills))
        if hooks is not None:
            hooks.forward_started(fi)
        output, logits = None, None
        if ledger.slow_stop[slots].any() and any(r.pending.grammar is not None for r in reqs):
            logits = self.engine.forward_logits(fi)  # sampled by _sample_constrained
        else:
            output = self.engine.forward(fi)
            if hooks is not None:
                hooks.forward_finished(fi, output)
        for req in prefills:
            req.complete_forward()
        ledger.complete_forward(decode_slots)
        stops = ledger.stop_rows(slots)
        self._cache_prefills(prefills)
        self.decode.update(prefills, decode_slots)
        self.stats.prefill_tokens += prefill_tokens
        self.stats.decode_tokens += len(decoding)
        self.stats.steps += 1
        if not prefills:
            self.stats.decode_steps += 1
            if fi.graph_bs is None:
                eager = self.stats.eager_decode_batches
                eager[len(reqs)] = eager.get(len(reqs), 0) + 1
        step = Step(reqs, is_prefill, fi, output, logits, stops)
        if hooks is not None and output is not None:
            hooks.launch_finished(step)
        return step

    def _sample_constrained(self, step: Step | None) -> Step | None:
        """Sample a step that holds constrained requests, once every token before it is in its
        matcher (under overlap: after the previous step was processed). The host fills the
        bitmask while the pass may still run on the device; masking and sampling queue behind it."""
        if step is None or step.output is not None:
            return step
        grammars = self.grammar_waits.grammars
        assert grammars is not None
        matchers = [r.pending.grammar if r.produces_token and not r.finished else None for r in step.reqs]
        bitmask = grammars.token_bitmask(matchers)
        output = self.engine.sample(step.input, step.logits, bitmask)
        step = step._replace(output=output, logits=None)
        if self.hooks is not None:
            self.hooks.forward_finished(step.input, output)
            self.hooks.launch_finished(step)
        return step

    def _cache_prefills(self, reqs: list[Req]) -> None:
        """Put the prompt KV of this pass into the prefix cache as soon as it is launched.

        NOTE: the KV is being computed by the pass just launched; only later passes, which
        run after it, can match it. Held-back siblings (n > 1) are admitted from here."""
        for req in reqs:
            self.cache.cache_req(req, finished=False)
            self.prefill.cached(req)
            group = req.pending.group
            if req.produces_token and req.pending.index == 0 and group.held_back:
                self.prefill.add_front(group.held_back)
                group.held_back = []

    def _decode_batch(self) -> tuple[list[Req], np.ndarray, int]:
        """Every running request, with their slots and the pages they take this step. While the
        pool cannot hold a token each, first drop a half-prefilled prompt's pages (its computed
        chunks stay cached), then retract the newest running requests. Empty when even one
        cannot get its page (pages held by the step in flight come back once it is processed)."""
        running, slots = self.decode.running, self.decode.slots()
        ledger = self.ledger
        grow = self.cache.pages_to_grow(ledger.device_len[slots], ledger.alloc_len[slots])
        count, pages = len(running), int(grow.sum())
        while count and pages > self.cache.available_pages:
            chunk = self.prefill.drop_chunk()
            if chunk is not None:
                self._release(chunk)
            elif count > 1:
                count -= 1
                pages -= int(grow[count])
                self._retract(running[count])
            else:
                return [], NO_SLOTS, 0
        return running[:count], slots[:count], pages

    def _retract(self, req: Req) -> None:
        """Send a decoding request back to pending; its computed KV stays in the prefix cache."""
        self.decode.remove(req)
        self._release(req)
        self.retracting.append(req)
        self.stats.retractions += 1
        logger.info("retracted %s at %d tokens (KV pool full)", req.rid, req.cached_len)

    def _finish_retractions(self) -> None:
        """Requeue retracted requests once their in-flight token (if any) has been appended."""
        back = [r.pending for r in self.retracting if not r.finished]
        for pending in back:
            pending.chunk = None
        self.prefill.add_front(back)
        self.retracting = []

    def _release(self, req: Req) -> None:
        if req.released:
            return
        req.released = True
        self.cache.cache_req(req, finished=True)
        req.detach()  # NOTE: before its slot can be handed out again
        self.tables.free(req.slot)
        req.pending.group.slots -= 1

    # ---- results --------------------------------------------------------------------------

    def _process(self, step: Step | None) -> None:
        if step is None:
            return
        hooks = self.hooks
        assert step.output is not None, "a step processed before it was sampled"
        if hooks is not None:
            hooks.process_started(step)
        if step.output.copy_done is not None:
            step.output.copy_done.synchronize()
        if hooks is not None:
            hooks.tokens_arrived(step)
        reqs, stops = step.reqs, step.stops
        assert stops is not None
        tokens = step.output.next_tokens_cpu.numpy()
        assert len(tokens) == len(reqs), f"{len(tokens)} tokens for {len(reqs)} requests"
        # NOTE: under overlap a finished request can sit in one more batch: its token is dropped
        for req, token in zip(reqs, tokens.tolist(), strict=True):
            if req.produces_token and not req.finished:
                req.append_host(token)
        if step.output.logprobs_cpu is not None:
            for row, logprob in step.output.logprobs_cpu.by_row().items():
                req = reqs[row]
                if req.produces_token and not req.finished:
                    req.pending.logprobs.append(TokenLogprobs(*logprob))
        for row in np.flatnonzero(stops.lens - stops.prompt_len == 1).tolist():  # first tokens
            req = reqs[row]
            if req.produces_token and not req.finished and not req.pending.group.first_token_at_ms:
                req.pending.group.first_token_at_ms = int(time.time() * 1000)  # a metric (TTFT)
        eos_token_ids = self.engine.eos_token_ids
        for row in stops.candidates(tokens, self._eos_token_ids).tolist():
            req = reqs[row]
            if req.produces_token and not req.finished:
                stop = check_stop(req, eos_token_ids, self.detokenize)
                if stop is not None:
                    self._finish(req, stop)
        if hooks is not None:
            hooks.process_finished(step)

    def _finish(self, req: Req, stop: Stop) -> None:
        req.finished = True
        self.decode.remove(req)
        self._release(req)
        output = req.output_ids[:-1] if stop.drop_last else req.output_ids
        group = req.pending.group
        group.choices[req.pending.index] = ChoiceOutput(
            index=req.pending.index,
            token_ids=list(output),
            finish_reason=stop.finish_reason,  # type: ignore[arg-type]
            matched_stop=stop.matched_stop,
            logprobs=req.pending.logprobs[: len(output)] if req.sampling.logprobs else None,
        )
        if group.done and self.groups.pop(group.uid, None) is not None:
            self.stats.cached_tokens += group.cached_tokens or 0
            self.outgoing.append(
                RequestFinished(
                    uid=group.uid,
                    choices=[group.choices[i] for i in range(group.n)],
                    prompt_tokens=group.prompt_len,
                    cached_tokens=group.cached_tokens or 0,
                    first_token_at_ms=group.first_token_at_ms,
                )
            )

    def check_integrity(self, in_flight: Step | None = None) -> None:
        """Pages: free + cached + private == total, no page in two places (tests, idle); every
        running request's lengths are its slot's row of the ledger.

        ``in_flight``: the step returned by ``step`` under overlap (default: the one the
        scheduler keeps), whose requests may have left the running set (length reached) but
        still hold pages until processed."""
        in_flight = in_flight or self._in_flight
        holders = list(self.decode.running)
        for req in holders:
            assert req.reads_row(self.ledger), f"{req.rid}: its lengths are not its slot's ledger row"
        holders += in_flight.reqs if in_flight is not None else []
        unique = {id(r): r for r in holders if not r.released and not isinstance(r, ChunkedReq)}
        chunked = self.prefill.chunked
        if chunked is not None and chunked.chunk is not None:
            unique[id(chunked.chunk)] = chunked.chunk
        self.cache.check_integrity(list(unique.values()))

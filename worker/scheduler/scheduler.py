"""Scheduler: wires the managers; a step prefills what the token budget admits, else decodes
every running request; while a long prompt is being chunked (``mixed_batches``), each step
decodes every running request and adds the prefills, so a long prompt never stalls them.

One iteration (the same code with overlap on or off):

    receive messages -> schedule + launch step N -> process step N-1 (overlap) or N (plain)
                     -> finish retractions -> send finished requests

Under overlap, step N runs while the host processes step N-1's tokens: the scheduler plans
from lengths (device_len runs ahead of input_ids) and the engine reads the next input ids
from token_pool, so nothing waits for token values except ``Results.process`` (results.py).
"""

from __future__ import annotations

import time

import msgspec
import numpy as np

from worker.engine.engine import Engine
from worker.engine.faults import Fault
from worker.kvcache.manager import CacheManager
from worker.kvcache.table import TableManager
from worker.scheduler.admission import Admission
from worker.scheduler.config import SchedulerConfig
from worker.scheduler.decode import NO_SLOTS, DecodeManager
from worker.scheduler.hooks import StepHooks
from worker.scheduler.ledger import SlotLedger
from worker.scheduler.messages import (
    AbortRequest,
    GenerateRequest,
    Inbound,
    Outbound,
    RequestFinished,
    SchedulerIO,
    ShutdownRequest,
)
from worker.scheduler.prefill import PrefillManager
from worker.scheduler.prepare import BatchPreparer
from worker.scheduler.req import ChunkedReq, Req, RequestGroup
from worker.scheduler.results import Results
from worker.scheduler.retract import Retractions
from worker.scheduler.step import Stats, Step
from worker.scheduler.stop import Detokenize
from worker.scheduler.structured import GrammarWaits


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
        self.groups: dict[str, RequestGroup] = {}
        self.outgoing: list[Outbound] = []  # answers sent to the front end at the end of this iteration
        self.stats = Stats()
        self.shutdown = False
        self.fault: Fault | None = None  # injected failures (tests only)
        self.hooks: StepHooks | None = None  # step observer (profiling), worker.scheduler.hooks
        self.grammar_waits = GrammarWaits(  # structured output's waiting room
            engine, config.grammar_timeout_s, config.grammar_memory_mib
        )
        self.retractions = Retractions(
            self.cache, self.tables, self.ledger, self.prefill, self.decode, self.stats
        )
        self.admission = Admission(
            engine,
            self.cache,
            self.tables,
            self.prefill,
            self.decode,
            self.retractions,
            self.grammar_waits,
            self.groups,
            self.outgoing,
        )
        self.results = Results(
            engine, self.cache, self.tables, self.decode, self.groups, self.stats, self.outgoing
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
            if last is None and self.idle and not self.retractions.reqs:
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
            self.admission.admit_compiled(wait_s=0.0 if busy else 0.01)
        started_s = time.perf_counter()
        self._launching = []
        self._processing = last.reqs if last is not None else []
        current = None if self.shutdown else self._launch()
        if current is None and last is None and not self.shutdown:
            self.admission.fail_unschedulable()
        if self.engine.config.overlap:
            self.results.process(last, self.hooks, self.detokenize)
        current = self._sample_constrained(current)
        if not self.engine.config.overlap:
            self.results.process(current, self.hooks, self.detokenize)
            current = None
        self.retractions.requeue()
        if self.outgoing:
            self.io.send(self._with_load(self.outgoing, time.perf_counter() - started_s))
            self.outgoing.clear()  # NOTE: the list Admission and Results append to
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

    def _handle(self, message: Inbound) -> None:
        match message:
            case GenerateRequest():
                self.admission.admit(message)
            case AbortRequest(uid=uid):
                self.admission.abort(uid)
            case ShutdownRequest():
                self.shutdown = True

    def close(self) -> None:
        """Stop the grammar compiler's process, if one was started."""
        self.grammar_waits.close()

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
            decoding, decode_slots, decode_pages = self.retractions.decode_batch()
            reserved += decode_pages * self.cache.page_size
            prefills = self.prefill.schedule(budget, reserved, decode_pages)
        else:
            prefills = self.prefill.schedule(budget, reserved)
            decoding, decode_slots, _ = ([], NO_SLOTS, 0) if prefills else self.retractions.decode_batch()
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

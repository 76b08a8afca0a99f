"""Results: a step's sampled tokens into its requests; the stop rules end them, and a group is
answered (a RequestFinished appended to ``outgoing``) once all its choices are done."""

from __future__ import annotations

import time

import numpy as np

from worker.engine.engine import Engine
from worker.kvcache.manager import CacheManager
from worker.kvcache.table import TableManager
from worker.scheduler.decode import DecodeManager
from worker.scheduler.hooks import StepHooks
from worker.scheduler.messages import ChoiceOutput, Outbound, RequestFinished, TokenLogprobs
from worker.scheduler.release import release
from worker.scheduler.req import Req, RequestGroup
from worker.scheduler.step import Stats, Step
from worker.scheduler.stop import Detokenize, Stop, check_stop


class Results:
    """Finishes into ``groups`` (uid -> the groups not yet answered), ``stats`` and
    ``outgoing``, which the scheduler owns."""

    def __init__(
        self,
        engine: Engine,
        cache: CacheManager,
        tables: TableManager,
        decode: DecodeManager,
        groups: dict[str, RequestGroup],
        stats: Stats,
        outgoing: list[Outbound],
    ) -> None:
        self.engine = engine
        self.cache = cache
        self.tables = tables
        self.decode = decode
        self.groups = groups
        self.stats = stats
        self.outgoing = outgoing
        self._eos_token_ids = np.fromiter(engine.eos_token_ids, dtype=np.int64)

    def process(self, step: Step | None, hooks: StepHooks | None, detokenize: Detokenize | None) -> None:
        """Wait for ``step``'s tokens, append them, finish the requests a stop rule ends.

        ``hooks`` and ``detokenize``: the scheduler's, which may be set after it is built."""
        if step is None:
            return
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
                stop = check_stop(req, eos_token_ids, detokenize)
                if stop is not None:
                    self._finish(req, stop)
        if hooks is not None:
            hooks.process_finished(step)

    def _finish(self, req: Req, stop: Stop) -> None:
        req.finished = True
        self.decode.remove(req)
        release(req, self.cache, self.tables)
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

"""The scheduler's waiting room for structured-output requests: they wait here, holding no
slot or page, while their grammar compiles in the background (worker.engine.grammar_compiler),
and leave it admitted (their compiled grammar) or refused (why), one answer each."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from worker.scheduler.messages import GenerateRequest

if TYPE_CHECKING:
    from worker.engine.engine import Engine
    from worker.engine.grammar import Grammars

logger = logging.getLogger(__name__)

Refusal = tuple[str, str]  # (error code, message)


class GrammarWaits:
    """``grammars`` is built with the first constrained request (the compiler's child starts
    then); ``waiting`` maps uid -> the requests whose grammar is being compiled."""

    def __init__(self, engine: Engine, timeout_s: float, memory_limit_mib: int) -> None:
        self.engine = engine
        self.timeout_s = timeout_s
        self.memory_limit_mib = memory_limit_mib
        self.grammars: Grammars | None = None
        self.waiting: dict[str, GenerateRequest] = {}

    def __contains__(self, uid: str) -> bool:
        return uid in self.waiting

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def submit(self, msg: GenerateRequest) -> tuple[Any, Refusal | None]:
        """(compiled grammar, None) when it is cached; (None, refusal) when its compile failed
        before; else (None, None): the request waits here until ``finished`` hands it back."""
        from worker.engine.grammar import GrammarError, Grammars

        if self.grammars is None:
            engine = self.engine
            self.grammars = Grammars.in_background(
                str(engine.loaded.path),
                engine.vocab_size,
                engine.eos_token_ids,
                self.timeout_s,
                self.memory_limit_mib,
            )
        try:
            compiled = self.grammars.submit(msg.uid, msg.sampling)
        except GrammarError as exc:  # its compile failed before: not tried again
            return None, ("invalid_job", str(exc))
        if compiled is None:
            self.waiting[msg.uid] = msg
        return compiled, None

    def finished(self, wait_s: float) -> list[tuple[GenerateRequest, Any, Refusal | None]]:
        """(request, compiled grammar, None) or (request, None, refusal) for each request whose
        compile ended; waits up to ``wait_s`` for the compiler first. A surprise inside the
        grammar engine refuses every waiting request (a new engine serves the next one)."""
        from worker.engine.grammar import GrammarError

        assert self.grammars is not None and self.grammars.background is not None
        if wait_s > 0:
            self.grammars.background.wait(wait_s)
        try:
            ended = self.grammars.poll()
        except Exception as exc:  # NOTE: the waiting requests' error, not the scheduler loop's
            logger.exception("the grammar compiler failed")
            self.close()
            self.grammars = None
            why: Refusal = ("internal", f"the grammar compiler failed: {exc}")
            refused: list[tuple[GenerateRequest, Any, Refusal | None]] = [
                (msg, None, why) for msg in self.waiting.values()
            ]
            self.waiting.clear()
            return refused
        done: list[tuple[GenerateRequest, Any, Refusal | None]] = []
        for uid, outcome in ended:
            msg = self.waiting.pop(uid, None)
            if msg is None:
                continue  # aborted while compiling
            if isinstance(outcome, GrammarError):
                done.append((msg, None, ("invalid_job", str(outcome))))
            else:
                done.append((msg, outcome, None))
        return done

    def abort(self, uid: str) -> GenerateRequest | None:
        """Forget a waiting request (its compile stops if no other request waits for it)."""
        msg = self.waiting.pop(uid, None)
        if msg is not None and self.grammars is not None:
            self.grammars.cancel(uid)
        return msg

    def close(self) -> None:
        """Stop the compiler's process, if one was started."""
        if self.grammars is not None:
            self.grammars.close()

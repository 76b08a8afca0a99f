"""Fault injection, for the failure-isolation tests: make the scheduler fail on purpose.

The engine setting ``fault`` (``RADIXQ_FAULT`` for a worker, like every setting) holds one rule:

    raise-on-token:N   a step whose batch holds a request with token id N in its prompt raises
                       (a Python error inside a step: the scheduler reports the step's requests)
    exit-on-token:N    the same step kills the process at once (a hard crash: no report)
    raise-on-batch:K   a step with K or more requests raises, whatever they hold (a workload
                       shape: no single job reproduces it)
    sleep-per-step:MS  every step takes MS milliseconds longer (a slow engine, for drain tests)

Unset (always, outside tests) it costs one ``is None`` check a step.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_KINDS = ("raise-on-token", "exit-on-token", "raise-on-batch", "sleep-per-step")


class InjectedFault(RuntimeError):
    """The error an injected fault raises."""


@dataclass(frozen=True)
class Fault:
    kind: str
    value: int

    @classmethod
    def parse(cls, spec: str) -> Fault | None:
        """The rule ``spec`` names ("" for none); ValueError when it is not one."""
        spec = spec.strip()
        if not spec:
            return None
        kind, _, value = spec.partition(":")
        if kind not in _KINDS or not value.isdigit():
            raise ValueError(f"fault={spec!r}: expected one of {', '.join(_KINDS)} followed by :N")
        return cls(kind, int(value))

    def check(self, prompts: list[list[int]]) -> None:
        """Called with the prompts of the step about to launch."""
        if self.kind == "sleep-per-step":
            time.sleep(self.value / 1000)
            return
        if self.kind == "raise-on-batch":
            if len(prompts) >= self.value:
                raise InjectedFault(f"injected fault: a batch of {len(prompts)} requests")
            return
        if any(self.value in prompt for prompt in prompts):
            if self.kind == "exit-on-token":
                os._exit(70)
            raise InjectedFault(f"injected fault: token {self.value} in a batch of {len(prompts)}")

"""StepHooks: an observer of the scheduler's step phases, for profiling.

Set ``Scheduler.hooks`` to an instance (worker.scheduler.profile.StepProfiler is one); with
None, the default, the scheduler makes no call at all. For each launched step the calls come
in this order, on the scheduler's thread:

    launch_started            before the batch is chosen (also when none is launched)
    forward_started(fi)       the pass is about to be enqueued on the engine
    forward_finished(fi, out) it is enqueued (the GPU may still be running it)
    launch_finished(step)     the step's bookkeeping is done
      ... under overlap the next step's launch calls come here ...
    process_started(step)     before the host waits for the step's tokens
    tokens_arrived(step)      the tokens are on the host
    process_finished(step)    stops checked, finished requests answered

A step holding structured-output requests samples later (Scheduler._sample_constrained):
its forward_finished and launch_finished come after the previous step was processed.

Hooks observe: they must not change the step, its requests or the engine's tensors.
``HookGroup`` lets several observers watch one scheduler (each call goes to each, in order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from worker.forward import ForwardInput, ForwardOutput
    from worker.scheduler.step import Step


class StepHooks:
    """Every hook does nothing here; a subclass overrides the ones it needs."""

    def launch_started(self) -> None:
        pass

    def forward_started(self, fi: ForwardInput) -> None:
        pass

    def forward_finished(self, fi: ForwardInput, output: ForwardOutput) -> None:
        pass

    def launch_finished(self, step: Step) -> None:
        pass

    def process_started(self, step: Step) -> None:
        pass

    def tokens_arrived(self, step: Step) -> None:
        pass

    def process_finished(self, step: Step) -> None:
        pass


class HookGroup(StepHooks):
    """Several observers as one ``Scheduler.hooks``: every call goes to each of them, in order."""

    def __init__(self, *hooks: StepHooks) -> None:
        self.hooks = hooks

    def launch_started(self) -> None:
        for hook in self.hooks:
            hook.launch_started()

    def forward_started(self, fi: ForwardInput) -> None:
        for hook in self.hooks:
            hook.forward_started(fi)

    def forward_finished(self, fi: ForwardInput, output: ForwardOutput) -> None:
        for hook in self.hooks:
            hook.forward_finished(fi, output)

    def launch_finished(self, step: Step) -> None:
        for hook in self.hooks:
            hook.launch_finished(step)

    def process_started(self, step: Step) -> None:
        for hook in self.hooks:
            hook.process_started(step)

    def tokens_arrived(self, step: Step) -> None:
        for hook in self.hooks:
            hook.tokens_arrived(step)

    def process_finished(self, step: Step) -> None:
        for hook in self.hooks:
            hook.process_finished(step)

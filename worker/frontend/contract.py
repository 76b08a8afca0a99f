"""The generation side of a worker, as the queue consumer drives it (the engine, or a fake)."""

from __future__ import annotations

from typing import Protocol

from wire.schema import Job, Result

ENGINE_CRASH = "engine_crash"  # error code: the job crashed the engine while it ran alone
ABORTED = "aborted"  # error code: the job was aborted (Generator.abort) before it finished


class GeneratorUnavailable(RuntimeError):
    """The generator cannot run anything any more (its engine could not be restarted); the
    consumer gives its jobs back to the queue and the worker exits."""


class Generator(Protocol):
    """A front end to an engine, as the queue consumer drives it.

    Contract:
    - ``slots`` is how many jobs it runs at once: by default the consumer holds no more than
      that (its read window), so a worker does not take jobs a sibling could start now.
    - ``free_capacity()`` says how many more jobs ``submit`` will take now (0 while it cannot
      take any, e.g. restarting its engine); the consumer never submits more (backpressure).
    - ``submit(job)`` never raises for a bad job: it reports an error Result through
      ``poll`` instead (e.g. a prompt longer than the context), so one job cannot stop others.
    - ``poll(timeout_s)`` returns the Results finished since the last call, waiting up to
      ``timeout_s`` for the first one; each submitted job yields exactly one Result. A Result
      with error code ENGINE_CRASH means the job crashed the engine when it ran alone (its
      message says how the engine failed): the consumer counts an attempt and either submits
      it again or dead-letters it. ``poll``
      raises GeneratorUnavailable when the engine is gone for good.
    - ``abort(job_id)`` stops a submitted job that has not returned its Result yet (one that
      waits is dropped, one that runs is stopped where the engine can): it still yields
      exactly one Result, an ``aborted`` error or, when it finished first, its real one. The
      consumer aborts the jobs it holds whose result was written elsewhere (``radixq cancel``,
      another worker). A generator that cannot stop a job lets it finish.
    - ``close(timeout_s)`` stops within ``timeout_s`` (then kills) and releases processes and
      memory; jobs not yet returned are abandoned (the consumer gives them back to the queue).
    - ``restarts`` and ``unattributed_crashes`` count engine restarts and crashes that no
      single job reproduced (shown in the worker's heartbeat).
    """

    @property
    def model_name(self) -> str: ...

    @property
    def slots(self) -> int: ...

    @property
    def restarts(self) -> int: ...

    @property
    def unattributed_crashes(self) -> int: ...

    def free_capacity(self) -> int: ...

    def submit(self, job: Job) -> None: ...

    def poll(self, timeout_s: float) -> list[Result]: ...

    def abort(self, job_id: str) -> None: ...

    def close(self, timeout_s: float = ...) -> None: ...

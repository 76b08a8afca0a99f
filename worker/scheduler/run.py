"""The scheduler process's entry point: load the engine, announce readiness, loop."""

from __future__ import annotations

import gc
import json
import logging
import os
import traceback
from collections.abc import Callable
from typing import Protocol

import torch

from worker.distributed import LEFT_ALONE, LEFT_DESTROYED, close_tp, init_tp, teardown_stuck, tp_info
from worker.engine.engine import Engine, rank_device
from worker.engine.faults import Fault
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import SchedulerFailed, SchedulerIO, SchedulerReady
from worker.scheduler.scheduler import Scheduler
from worker.scheduler.stop import Detokenize
from worker.scheduler.tp import LeaderIO, TPGroup, check_shardable

logger = logging.getLogger(__name__)


def build_scheduler(
    config: SchedulerProcessConfig, io: SchedulerIO, detokenize: Detokenize | None = None
) -> Scheduler:
    """Load the model and wire a Scheduler to ``io`` (no message sent yet)."""
    return Scheduler(Engine(config.engine.resolved()), config.scheduler, io, detokenize)


def ready_message(scheduler: Scheduler) -> SchedulerReady:
    engine = scheduler.engine
    return SchedulerReady(
        max_running_reqs=engine.config.max_running_reqs,
        max_seq_len=engine.max_seq_len,
        num_pages=engine.num_pages,
        page_size=engine.page_size,
        model_name=engine.loaded.name,
        model_path=str(engine.loaded.path),
    )


class LoadError(Exception):
    """The engine could not be built (model, options, device): the worker cannot start."""


def one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _lead_group(
    config: SchedulerProcessConfig, io: SchedulerIO, log_level: str
) -> tuple[SchedulerIO, TPGroup | None]:
    """With tensor_parallel_size > 1 in a process not yet in a group: start the followers,
    join the group as rank 0, and forward every receive to them (worker.scheduler.tp)."""
    size = config.engine.tensor_parallel_size
    if size == 1 or tp_info().size > 1:
        return io, None
    check_shardable(config.engine)
    group = TPGroup(config, log_level)
    try:
        init_tp(0, size, group.init_method, str(rank_device(config.engine.device, 0, size)))
    except BaseException:
        group.kill()
        raise
    return LeaderIO(io, group), group


def run_scheduler(
    config: SchedulerProcessConfig,
    io: SchedulerIO,
    detokenize: Detokenize | None = None,
    log_level: str = "INFO",
) -> None:
    """Load the engine, send SchedulerReady, then serve until a ShutdownRequest.

    Without ``detokenize`` the model directory's tokenizer is loaded for stop strings. An
    error it cannot contain is reported (SchedulerFailed, naming the failing step's requests)
    before it propagates; a failure to load raises LoadError after reporting it. With
    tensor_parallel_size > 1 this process leads the group (or follows, when worker.scheduler
    .follower put it in one first), and leaves it through ``leave_group`` on every way out."""
    group: TPGroup | None = None
    scheduler: Scheduler | None = None
    clean = False
    try:
        try:
            config = config.resolved()
            io, group = _lead_group(config, io, log_level)
            scheduler = build_scheduler(config, io, detokenize)
            if scheduler.detokenize is None:
                from worker.models.tokenizer import detokenizer, load_tokenizer_or_none

                scheduler.detokenize = detokenizer(load_tokenizer_or_none(str(scheduler.engine.loaded.path)))
            # NOTE: injected failures fire on the leader only (a follower's would read as a lost rank)
            scheduler.fault = Fault.parse(config.scheduler.fault) if tp_info().leader else None
        except Exception as exc:
            io.send([SchedulerFailed(error=one_line(exc), loading=True)])
            raise LoadError(one_line(exc)) from exc
        _serve_loaded(config, scheduler, io, group)
        clean = True
    finally:
        leave_group(scheduler, group, clean)


def _serve_loaded(
    config: SchedulerProcessConfig, scheduler: Scheduler, io: SchedulerIO, group: TPGroup | None
) -> None:
    profiler = None
    if config.scheduler.step_profile:  # profiling runs only: records every step
        from worker.scheduler.profile import StepProfiler

        profiler = StepProfiler.install(scheduler)
    # The loop allocates a little every step; a full collection walking the loaded model's and
    # the caches' objects would stall it for tens of ms. Frozen objects are never walked.
    gc.collect()
    gc.freeze()
    io.send([ready_message(scheduler)])
    try:
        with torch.inference_mode():
            scheduler.run()
    except Exception as exc:
        if group is not None:
            group.exit_if_a_rank_is_lost()  # a collective that failed because a follower died
        io.send([SchedulerFailed(error=one_line(exc), suspect_uids=scheduler.failing_uids())])
        raise
    finally:
        gc.unfreeze()  # let shutdown collect them (frozen objects read as leaks to nanobind at exit)
        if profiler is not None:
            logger.warning("step profile: %s", json.dumps(profiler.summary()))


def leave_group(scheduler: Scheduler | None, group: TPGroup | None, clean: bool) -> str:
    """How every rank ends, on every path (a ShutdownRequest, a drain, a crash, a failed load):
    the scheduler and its engine's CUDA graphs first, then the tensor-parallel group
    (worker.distributed.close_tp: destroyed when ``clean`` and every rank is there, else
    aborted; bounded either way); rank 0 then waits for its followers' processes (``clean``)
    or kills them (before its own abort: they may be blocked in a collective). Returns how
    the group was left (LEFT_ALONE with TP=1)."""
    rank = tp_info().rank
    if scheduler is not None:
        try:
            scheduler.close()
            scheduler.engine.close()
        except Exception:  # a broken device may refuse; the group is left all the same
            logger.exception("closing the scheduler failed")
    if group is not None:
        group.stop_watching()  # NOTE: from here on a follower that exits is leaving, not lost
        if not clean:
            group.kill()
    how = close_tp(peer_lost=not clean)
    if group is not None:
        group.stop()
    if how != LEFT_ALONE:
        level = logging.INFO if how == LEFT_DESTROYED else logging.WARNING
        logger.log(level, "tensor-parallel rank %d left its group: %s", rank, how)
    return how


class ClosableIO(SchedulerIO, Protocol):
    def close(self) -> None: ...


def serve(
    config: SchedulerProcessConfig, io: ClosableIO, log_level: str, join: Callable[[], object] | None = None
) -> int:
    """A scheduler process's life (worker.scheduler.main, worker.scheduler.follower):
    ``join`` (a follower joining its group) then run_scheduler; the process's exit code: 0 after
    a ShutdownRequest, 2 when the engine cannot be built (already reported on ``io``), 1 on a
    crash (its traceback printed). A rank whose group teardown never returned ends here with
    os._exit (the interpreter's own exit could wait on it)."""
    code = 0
    try:
        if join is not None:
            join()
        run_scheduler(config, io, log_level=log_level)
    except LoadError:
        code = 2
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        io.close()
    if teardown_stuck():
        logging.shutdown()
        os._exit(code)
    return code

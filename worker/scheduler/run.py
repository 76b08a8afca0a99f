"""The scheduler process's entry point: load the engine, announce readiness, loop."""

from __future__ import annotations

import gc
import json
import logging

import torch

from worker.engine.config import EngineConfig
from worker.engine.engine import Engine
from worker.engine.faults import Fault
from worker.scheduler.messages import SchedulerFailed, SchedulerIO, SchedulerReady
from worker.scheduler.scheduler import Scheduler
from worker.scheduler.stop import Detokenize

logger = logging.getLogger(__name__)


def build_scheduler(config: EngineConfig, io: SchedulerIO, detokenize: Detokenize | None = None) -> Scheduler:
    """Load the model and wire a Scheduler to ``io`` (no message sent yet)."""
    config = config.resolved()
    return Scheduler(Engine(config), config, io, detokenize)


def ready_message(scheduler: Scheduler) -> SchedulerReady:
    engine = scheduler.engine
    return SchedulerReady(
        max_running_reqs=scheduler.config.max_running_reqs,
        max_seq_len=engine.max_seq_len,
        num_pages=engine.num_pages,
        page_size=engine.page_size,
        model_name=engine.loaded.name,
        model_path=str(engine.loaded.path),
    )


def tokenizer_detokenize(model_path: str) -> Detokenize | None:
    """A detokenize callable from the model directory's tokenizer, or None when it has none."""
    from worker.models.tokenizer import load_tokenizer_or_none

    tokenizer = load_tokenizer_or_none(model_path)
    if tokenizer is None:
        return None

    def detokenize(token_ids: list[int]) -> str:
        return str(tokenizer.decode(token_ids, skip_special_tokens=True))

    return detokenize


class LoadError(Exception):
    """The engine could not be built (model, options, device): the worker cannot start."""


def one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def run_scheduler(config: EngineConfig, io: SchedulerIO, detokenize: Detokenize | None = None) -> None:
    """Load the engine, send SchedulerReady, then serve until a ShutdownRequest.

    Without ``detokenize`` the model directory's tokenizer is loaded for stop strings. An
    error it cannot contain is reported (SchedulerFailed, naming the failing step's requests)
    before it propagates; a failure to load raises LoadError after reporting it."""
    try:
        scheduler = build_scheduler(config, io, detokenize)
        if scheduler.detokenize is None:
            scheduler.detokenize = tokenizer_detokenize(str(scheduler.engine.loaded.path))
        scheduler.fault = Fault.parse(config.fault)
    except Exception as exc:
        io.send([SchedulerFailed(error=one_line(exc), loading=True)])
        raise LoadError(one_line(exc)) from exc
    profiler = None
    if config.step_profile:  # profiling runs only: records every step
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
        io.send([SchedulerFailed(error=one_line(exc), suspect_uids=scheduler.failing_uids())])
        raise
    finally:
        scheduler.close()
        gc.unfreeze()  # let shutdown collect them (frozen objects read as leaks to nanobind at exit)
        if profiler is not None:
            logger.warning("step profile: %s", json.dumps(profiler.summary()))

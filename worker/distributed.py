"""Tensor parallelism's process group: which rank this process is, and the collectives it needs.

One process per rank; rank 0 schedules and the others follow (worker.scheduler.tp). The group
is torch.distributed over NCCL on CUDA and gloo on CPU (so the CPU tests run the real
collective path). A process that never calls ``init_tp`` is rank 0 of a group of one, where
every collective is the identity. Every rank leaves through ``close_tp``, on every path: a
bounded handshake in the group's store, then destroy when all ranks are there, abort when not.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

# NOTE: NVLink multicast stays off in every process of a group (issue 19: NVLS hangs seen on the device)
NVLS_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0


_tp = TPInfo()


def tp_info() -> TPInfo:
    """This process's place in its tensor-parallel group (rank 0 of 1 unless ``init_tp`` ran)."""
    return _tp


def free_loopback_address() -> str:
    """``tcp://127.0.0.1:PORT`` on a port free now (the group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def backend_for(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_tp(rank: int, size: int, init_method: str, device: str, timeout_s: float = 600.0) -> TPInfo:
    """Join the group (blocks until all ``size`` ranks have called it with ``init_method``)."""
    global _tp
    if size > 1:
        import torch.distributed as dist

        for name, value in NVLS_OFF_ENV.items():
            os.environ.setdefault(name, value)
        backend = backend_for(device)
        options: dict = {}
        if backend == "nccl":
            options["device_id"] = torch.device(device)
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **options,
        )
    _tp = TPInfo(rank, size)
    return _tp


# How a rank left its group: close_tp's answer.
LEFT_ALONE = "alone"  # there was no group (TP=1, or it was left already)
LEFT_DESTROYED = "destroyed"  # every rank said it was leaving: the communicators were destroyed
LEFT_ABORTED = "aborted"  # a peer was lost or did not say it in time: the communicators were aborted
LEFT_STUCK = "stuck"  # even the local teardown did not end in time: end the process, no more cleanup

PEER_WAIT_S = 6.0  # the most a rank waits on its peers while leaving (all of close_tp's steps)
TEARDOWN_S = 3.0  # the most the local destroy, or abort, may take
_LEAVING = "radixq/leaving"  # store keys: _LEAVING/{rank}, then _LEAVING/left/{rank}
_stuck = False


def close_tp(
    peer_lost: bool = False, peer_wait_s: float = PEER_WAIT_S, teardown_s: float = TEARDOWN_S
) -> str:
    """Leave the group. Every rank calls it on every way out, after ``Engine.close()``.

    NOTE: NCCL frees a communicator only once every CUDA graph that captured one of its
    collectives is gone (its finalize polls their count down to zero, with no timeout): a
    rank that still holds its graphs blocks in destroy_process_group forever (issue 34).

    The same steps, in the same order, for every rank and every path:
      1. say "leaving" in the group's store and wait for every other rank to say it (the
         store, never a collective: the communicators are not used again);
      2. all said it: destroy the communicators (NCCL finalize + destroy, now local); the
         followers then say "left", and rank 0, whose process serves the store, waits for
         that before it returns, so the store outlives every follower's teardown;
      3. a rank missing (dead, stalled, still inside a collective) or ``peer_lost``: abort the
         communicators instead (ncclCommAbort through torch: local, waits on no peer).
    The waits on peers share one ``peer_wait_s`` deadline and the teardown has its own
    ``teardown_s``; each runs on a helper thread joined under its bound, so this returns
    within about ``peer_wait_s + teardown_s`` on every path. Returns LEFT_ALONE,
    LEFT_DESTROYED, LEFT_ABORTED, or LEFT_STUCK (a teardown that never returned:
    ``teardown_stuck()`` is then true, and the process should end with ``os._exit``)."""
    global _tp
    import torch.distributed as dist

    me, _tp = _tp, TPInfo()
    if me.size == 1 or not (dist.is_available() and dist.is_initialized()):
        return LEFT_ALONE
    deadline = time.monotonic() + peer_wait_s
    # NOTE: this reference keeps the store's client (and rank 0's server) alive past destroy
    store = dist.distributed_c10d._get_default_store()
    everyone = [f"{_LEAVING}/{r}" for r in range(me.size)]
    said = not peer_lost and _within(
        deadline, lambda: _say_and_wait(store, f"{_LEAVING}/{me.rank}", everyone, deadline)
    )
    if said and _within(time.monotonic() + teardown_s, dist.destroy_process_group):
        if me.leader:
            left = [f"{_LEAVING}/left/{r}" for r in range(1, me.size)]
            _within(deadline, lambda: store.wait(left, _remaining(deadline)))
        else:
            _within(deadline, lambda: store.set(f"{_LEAVING}/left/{me.rank}", "1"))
        return LEFT_DESTROYED
    if said:
        why = f"its destroy failed or did not end within {teardown_s:.0f} s"
    else:
        why = "a peer was lost" if peer_lost else "a peer did not say it was leaving (gone, stalled or late)"
    log.warning("tensor-parallel rank %d: %s; aborting its communicators", me.rank, why)
    if _within(time.monotonic() + teardown_s, _abort):
        return LEFT_ABORTED
    global _stuck
    _stuck = True
    log.error("tensor-parallel rank %d: aborting the group did not end within %.0f s", me.rank, teardown_s)
    return LEFT_STUCK


def teardown_stuck() -> bool:
    """A close_tp teardown never returned (its thread still waits in torch or NCCL): ending the
    process normally could wait on it too (the group's destructors), so end it with os._exit."""
    return _stuck


def _remaining(deadline: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(0.001, deadline - time.monotonic()))


def _say_and_wait(store: object, mine: str, everyone: list[str], deadline: float) -> None:
    store.set(mine, b"1")  # type: ignore[attr-defined]
    store.wait(everyone, _remaining(deadline))  # type: ignore[attr-defined]


def _abort() -> None:
    import torch.distributed as dist

    if dist.is_initialized():  # NOTE: a destroy that raised may have gone part of the way
        dist.distributed_c10d._abort_process_group()


def _within(deadline: float, step: Callable[[], object]) -> bool:
    """Run ``step`` on a daemon thread; True when it returned (without raising) by ``deadline``.
    NOTE: a step still running then is left to finish or to die with the process."""
    done = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            step()
        except BaseException as exc:  # a peer gone shows here: connection reset, store timeout
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="tp-leave", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        return False
    if failed:
        log.info("tensor-parallel leave step failed: %s: %s", type(failed[0]).__name__, failed[0])
    return not failed


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the group, in place (returned for chaining)."""
    if _tp.size > 1:
        import torch.distributed as dist

        dist.all_reduce(x)
    return x


def broadcast(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's ``x`` on every rank, in place."""
    if _tp.size > 1:
        import torch.distributed as dist

        dist.broadcast(x, src=0)
    return x


def all_reduce_min(value: int, device: str | torch.device) -> int:
    """The smallest ``value`` over the group (e.g. num_pages: every rank can hold that many)."""
    if _tp.size == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())

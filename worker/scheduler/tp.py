"""A tensor-parallel group of scheduler processes: rank 0 leads, the others follow its batches.

    front end --ZMQ--> rank 0: Scheduler (real I/O) --PUSH, one per rank--> rank r: Scheduler (FollowerIO)
                          |  every receive()'s messages, one frame        | same messages, same
                          +---- gloo / NCCL collectives in each pass -----+ order: same batches

The leader's scheduler is the real one. Each time it receives (a step's inbound messages,
an empty list included) it forwards the same list to every follower, whose identical
scheduler receives exactly that list at the same point of its loop and drops what it would
send. The scheduler decides only from the messages it receives and the tokens it samples
(rank 0's, broadcast: worker.engine.engine), so every rank builds the same batches and
joins the same collectives. Structured output is refused with TP > 1: when a grammar's
compile finishes is a matter of time, not of the messages.

Supervision: followers run with SIGKILL as parent-death signal (no orphan when the leader
dies); a watchdog thread of the leader sees a follower that exited, kills the rest and
ends the leader with RANK_LOST_EXIT (its main thread may be blocked in a collective that
will never complete), which the front end reads as "the group lost a rank". The group
ends there without a destroy: the process's end frees what the communicators held (an
abort could not finish while the main thread's CUDA graphs hold them). Every other way out
goes through worker.scheduler.run.leave_group on every rank (worker.distributed.close_tp).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import zmq

from wire.lifetime import start_child
from worker.distributed import NVLS_OFF_ENV, free_loopback_address
from worker.engine.config import EngineConfig
from worker.scheduler.config import SchedulerProcessConfig
from worker.scheduler.messages import RANK_LOST_EXIT, Inbound, Outbound, SchedulerIO, encoder

log = logging.getLogger(__name__)

_WATCH_S = 0.1
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
frames_decoder = msgspec.msgpack.Decoder(list[Inbound])


def check_shardable(config: EngineConfig) -> None:
    """Raise ValueError (naming the field) when the model's heads or MLP do not divide by
    tensor_parallel_size: said by the leader, before any follower is started."""
    from worker.models.config import ModelConfig, config_json_path
    from worker.models.loader import resolve_model_dir

    if config.load_format == "dummy":
        model_config = ModelConfig.from_hf_dir(config_json_path(config.model))
    else:
        model_dir, _ = resolve_model_dir(config.model, config.load_format, config.cache_dir or None)
        model_config = ModelConfig.from_hf_dir(model_dir)
    model_config.shard(config.tensor_parallel_size)


class TPGroup:
    """The leader's side: the follower processes, the frame socket and the watchdog."""

    def __init__(self, config: SchedulerProcessConfig, log_level: str = "INFO") -> None:
        self.size = config.engine.tensor_parallel_size
        self.init_method = free_loopback_address()
        self._ctx = zmq.Context()
        # NOTE: one PUSH socket per follower: a PUSH with several peers deals frames out round-robin
        self._pushes: list[zmq.Socket] = []
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH", "")]))
        env.update({k: v for k, v in NVLS_OFF_ENV.items() if k not in env})
        config_json = config.to_json()
        self.followers: dict[int, subprocess.Popen[bytes]] = {}
        for rank in range(1, self.size):
            push = self._ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.SNDHWM, 0)  # NOTE: never blocks; a dead follower is the watchdog's
            frames_addr = f"tcp://127.0.0.1:{push.bind_to_random_port('tcp://127.0.0.1')}"
            self._pushes.append(push)
            args = [sys.executable, "-m", "worker.scheduler.follower", str(rank), str(self.size)]
            args += [self.init_method, frames_addr, config_json, log_level]
            # NOTE: started from the main thread: the parent-death signal follows the thread that forked
            self.followers[rank] = start_child(
                args, death_signal=signal.SIGKILL, env=env, stdin=subprocess.DEVNULL
            )
        self._stopping = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="tp-watchdog", daemon=True)
        self._watchdog.start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.followers.values()]

    def forward(self, messages: list[Inbound]) -> None:
        frame = encoder.encode(messages)
        for push in self._pushes:
            push.send(frame)

    def _watch(self) -> None:
        while not self._stopping.wait(_WATCH_S):
            if not self._stopping.is_set():
                self._exit_if_a_rank_exited()

    def _exit_if_a_rank_exited(self) -> None:
        for rank, proc in self.followers.items():
            code = proc.poll()
            if code is None:
                continue
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
            log.error("tensor-parallel rank %d exited (%s): stopping the group", rank, how)
            self.kill()
            os._exit(RANK_LOST_EXIT)

    def exit_if_a_rank_is_lost(self, grace_s: float = 5.0) -> None:
        """After the leader's step failed: when a follower exited (or exits within ``grace_s``),
        end as the watchdog does (RANK_LOST_EXIT). A collective fails at once when its peer dies,
        often before the watchdog's next look; that failure is the lost rank's, not a request's."""
        deadline = time.monotonic() + grace_s
        while True:
            self._exit_if_a_rank_exited()
            if time.monotonic() > deadline:
                return
            time.sleep(_WATCH_S / 4)

    def kill(self) -> None:
        for proc in self.followers.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.followers.values():
            proc.wait()

    def stop_watching(self) -> None:
        """The group is being left (worker.scheduler.run.leave_group): a follower that exits
        from now on is leaving, not lost."""
        self._stopping.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """After the group was left: wait for the followers, kill what is left, close the sockets."""
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        for proc in self.followers.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        for push in self._pushes:
            push.close(linger=0)
        self._ctx.term()


class LeaderIO:
    """The leader scheduler's I/O: the front end's, with every receive forwarded to the group."""

    def __init__(self, inner: SchedulerIO, group: TPGroup) -> None:
        self.inner = inner
        self.group = group

    def receive(self, block: bool) -> list[Inbound]:
        messages = self.inner.receive(block)
        self.group.forward(messages)
        return messages

    def send(self, messages: list[Outbound]) -> None:
        self.inner.send(messages)


class FollowerIO:
    """A follower scheduler's I/O: each receive is the leader's next frame; sends go nowhere."""

    def __init__(self, frames_addr: str) -> None:
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.connect(frames_addr)

    def receive(self, block: bool) -> list[Inbound]:
        # NOTE: blocks whatever ``block`` says: the leader's receive at this point of the loop
        # decided what this one returns
        return frames_decoder.decode(self._pull.recv())

    def send(self, messages: list[Outbound]) -> None:
        pass

    def close(self) -> None:
        self._pull.close(linger=0)
        self._ctx.term()

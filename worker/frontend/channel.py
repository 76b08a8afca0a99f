"""ZMQ sockets joining the front end (binds) and the scheduler process (connects).

    front end  --PUSH  ipc://.../in   PULL-->  scheduler   (GenerateRequest, Abort, Shutdown)
    front end  <--PULL ipc://.../out  PUSH--   scheduler   (SchedulerReady, RequestFinished)

Both directions carry msgpack frames of worker.scheduler.messages, one message a frame.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import zmq

from worker.scheduler.messages import (
    Inbound,
    Outbound,
    encoder,
    inbound_decoder,
    outbound_decoder,
)

_PARENT_CHECK_MS = 1000


def _drain(socket: zmq.Socket, decoder: msgspec.msgpack.Decoder) -> list[Any]:
    """Every message waiting on ``socket`` now, decoded, without blocking."""
    messages = []
    while True:
        try:
            frame = socket.recv(zmq.NOBLOCK)
        except zmq.Again:
            return messages
        messages.append(decoder.decode(frame))


class FrontendChannel:
    """The front end's side: binds both sockets in ``socket_dir``."""

    def __init__(self, socket_dir: str) -> None:
        self.inbound_addr = f"ipc://{socket_dir}/in"
        self.outbound_addr = f"ipc://{socket_dir}/out"
        self._ctx = zmq.Context()
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.bind(self.inbound_addr)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.bind(self.outbound_addr)

    def send(self, message: Inbound) -> None:
        self._push.send(encoder.encode(message))

    def receive(self, timeout_s: float) -> list[Outbound]:
        """Every message available, waiting up to ``timeout_s`` for the first."""
        if not self._pull.poll(int(timeout_s * 1000)):
            return []
        return _drain(self._pull, outbound_decoder)

    def close(self) -> None:
        self._push.close(linger=0)
        self._pull.close(linger=0)
        self._ctx.term()


class ZmqSchedulerIO:
    """The scheduler's side (implements worker.scheduler.messages.SchedulerIO).

    A blocking receive wakes up every second to check that the front end still lives, so a
    scheduler whose parent died exits instead of holding the GPU forever.
    """

    def __init__(self, inbound_addr: str, outbound_addr: str) -> None:
        self._parent_pid = os.getppid()
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.connect(inbound_addr)
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.connect(outbound_addr)

    def receive(self, block: bool) -> list[Inbound]:
        while block and not self._pull.poll(_PARENT_CHECK_MS):
            if os.getppid() != self._parent_pid:
                raise SystemExit("front end went away")
        return _drain(self._pull, inbound_decoder)

    def send(self, messages: list[Outbound]) -> None:
        for message in messages:
            self._push.send(encoder.encode(message))

    def close(self) -> None:
        self._pull.close(linger=0)
        self._push.close(linger=1000)
        self._ctx.term()

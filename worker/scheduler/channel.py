"""ZMQ sockets joining the front end (binds) and the scheduler process (connects).

    front end  --PUSH  ipc://.../in   PULL-->  scheduler   (GenerateRequest, Abort, Shutdown)
    front end  <--PULL ipc://.../out  PUSH--   scheduler   (SchedulerReady, RequestFinished)

Both directions carry msgpack frames of worker.scheduler.messages, one message a frame.
Neither side ever blocks on a peer that died: a PUSH with no peer would wait forever, so
sends time out and the sender checks whether its peer still lives.
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
_SEND_TIMEOUT_MS = 1000


class PeerGone(ConnectionError):
    """The other end of the channel is not taking messages (its process died)."""


def _drain(socket: zmq.Socket, decoder: msgspec.msgpack.Decoder) -> list[Any]:
    """Every message waiting on ``socket`` now, decoded, without blocking."""
    messages: list[Any] = []
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
        self._push.setsockopt(zmq.SNDHWM, 0)  # NOTE: no limit, so a full queue never reads as a dead peer
        self._push.bind(self.inbound_addr)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.bind(self.outbound_addr)

    def send(self, message: Inbound) -> None:
        """Queue one message for the scheduler; PeerGone when none is connected to take it."""
        try:
            self._push.send(encoder.encode(message), zmq.NOBLOCK)
        except zmq.Again:
            raise PeerGone("the scheduler process is not connected") from None

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
        self._push.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)
        self._push.connect(outbound_addr)

    def _check_parent(self) -> None:
        if os.getppid() != self._parent_pid:
            raise SystemExit("front end went away")

    def receive(self, block: bool) -> list[Inbound]:
        while block and not self._pull.poll(_PARENT_CHECK_MS):
            self._check_parent()
        return _drain(self._pull, inbound_decoder)

    def send(self, messages: list[Outbound]) -> None:
        for message in messages:
            frame = encoder.encode(message)
            while True:
                try:
                    self._push.send(frame)
                    break
                except zmq.Again:
                    self._check_parent()

    def close(self) -> None:
        self._pull.close(linger=0)
        self._push.close(linger=1000)
        self._ctx.term()

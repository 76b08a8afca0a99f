"""One rank of a bare tensor-parallel group on gloo, driven line by line, for the tests of how a
rank leaves its group (worker.distributed.close_tp) while a peer is dead, stalled or busy.

    python -m tests.tp_leave_rank RANK SIZE INIT_METHOD

It joins the group (init_tp on the CPU, torch's default 600 s timeout: a wait that falls back
on it outlasts any test deadline), runs one all-reduce to show the group works, prints
``ready``, then reads commands from stdin, one a line:

    collective    an all-reduce; prints ``collective done`` or ``collective failed``
    leave         close_tp(); prints ``left HOW SECONDS``
    leave-lost    close_tp(peer_lost=True); the same
    exit          ends the process (status 0)
"""

from __future__ import annotations

import sys
import time

import torch

from worker.distributed import all_reduce, close_tp, init_tp


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str]) -> int:
    rank, size, init_method = int(argv[0]), int(argv[1]), argv[2]
    init_tp(rank, size, init_method, "cpu")
    ones = all_reduce(torch.ones(4))
    assert ones.tolist() == [float(size)] * 4, ones
    say("ready")
    for line in sys.stdin:
        command = line.strip()
        if command == "collective":
            try:
                all_reduce(torch.ones(4))
                say("collective done")
            except Exception as exc:  # a peer gone or aborted: gloo says so
                say(f"collective failed {type(exc).__name__}")
        elif command in ("leave", "leave-lost"):
            start = time.monotonic()
            how = close_tp(peer_lost=command == "leave-lost")
            say(f"left {how} {time.monotonic() - start:.2f}")
        elif command == "exit":
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

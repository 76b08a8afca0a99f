"""A follower rank: ``python -m worker.scheduler.follower RANK SIZE INIT_METHOD FRAMES CONFIG_JSON LOG_LEVEL``.

Started by its group's leader (worker.scheduler.tp.TPGroup) with SIGKILL as parent-death
signal. It joins the group, builds the same engine and scheduler as rank 0 on its share of
the model, and runs the leader's inbound messages until the leader forwards a ShutdownRequest.
Exit codes as worker.scheduler.main's.
"""

from __future__ import annotations

import logging
import sys


def main(argv: list[str]) -> int:
    rank, size, init_method, frames_addr, config_json, log_level = argv
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s[rank {rank}]: %(message)s",
    )
    from worker.distributed import init_tp
    from worker.engine.engine import rank_device
    from worker.scheduler.config import SchedulerProcessConfig
    from worker.scheduler.run import serve
    from worker.scheduler.tp import FollowerIO

    config = SchedulerProcessConfig.from_json(config_json).resolved()
    device = str(rank_device(config.engine.device, int(rank), int(size)))
    return serve(
        config,
        FollowerIO(frames_addr),
        log_level,
        join=lambda: init_tp(int(rank), int(size), init_method, device),
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A follower rank: ``python -m worker.scheduler.follower RANK SIZE INIT_METHOD FRAMES CONFIG_JSON LOG_LEVEL``.

Started by its group's leader (worker.scheduler.tp.TPGroup) with SIGKILL as parent-death
signal. It joins the group, builds the same engine and scheduler as rank 0 on its share of
the model, and runs the leader's inbound messages until the leader forwards a ShutdownRequest.
Exit codes as worker.frontend.scheduler_main's.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback

from worker.engine.config import EngineConfig


def main(argv: list[str]) -> int:
    rank, size, init_method, frames_addr, config_json, log_level = argv
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s[rank {rank}]: %(message)s",
    )
    from worker.distributed import init_tp
    from worker.engine.engine import rank_device
    from worker.scheduler.run import LoadError, run_scheduler
    from worker.scheduler.tp import FollowerIO

    config = EngineConfig(**json.loads(config_json)).resolved()
    io = FollowerIO(frames_addr)
    try:
        init_tp(int(rank), int(size), init_method, str(rank_device(config.device, int(rank), int(size))))
        run_scheduler(config, io, log_level=log_level)
    except LoadError:
        return 2
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        io.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The scheduler process: ``python -m worker.scheduler.main INBOUND OUTBOUND CONFIG_JSON LOG_LEVEL``.

Started by the front end (worker.frontend.process) in a session of its own with a parent-death
signal: a Ctrl-C meant for the worker never reaches it, and it never outlives the worker.
Exit codes: 0 after a ShutdownRequest, 2 when the engine cannot be built, 1 on a crash, 3
(messages.RANK_LOST_EXIT) when a tensor-parallel follower died (worker.scheduler.tp).
"""

from __future__ import annotations

import logging
import sys


def main(argv: list[str]) -> int:
    inbound_addr, outbound_addr, config_json, log_level = argv
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s[scheduler]: %(message)s",
    )
    from worker.scheduler.channel import ZmqSchedulerIO
    from worker.scheduler.config import SchedulerProcessConfig
    from worker.scheduler.run import serve

    return serve(
        SchedulerProcessConfig.from_json(config_json), ZmqSchedulerIO(inbound_addr, outbound_addr), log_level
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

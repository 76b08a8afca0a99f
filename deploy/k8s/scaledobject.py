"""Write the KEDA ScaledObject that scales the radixq worker Deployment on a queue's backlog.

    python3 deploy/k8s/scaledobject.py                         # deploy/k8s/scaledobject.yaml
    python3 deploy/k8s/scaledobject.py --queue q --partitions 64 -o -    # to stdout

What it measures: one ``redis-streams`` trigger per partition stream of the queue, each the
stream's length (XLEN), summed by a ``scalingModifiers`` formula into one metric, the queue's
outstanding jobs; the HPA asks for ``ceil(outstanding / target)`` workers, KEDA wakes the
Deployment from zero when the sum exceeds ``activationTarget`` and puts it back to zero after
``cooldownPeriod`` seconds at or below it.

    NOTE: XLEN, not the consumer group's pending entries or lag. Workers trim every acknowledged
    entry (queue.trim_jobs, on by default) every few seconds, so a stream holds exactly what is
    not finished yet: never-delivered entries and those pending in a worker (or in a dead
    one's name until reclaimed). Pending entries alone are 0 with no worker running (nothing
    can wake the Deployment); the group's lag is nil after Redis restarts from its AOF
    (worker/queue/streams/lag.py), which KEDA reads as 0 or -1: an idle verdict with jobs
    queued. XLEN needs no group, so the triggers name none: a ``consumerGroup`` would switch
    KEDA's scaler to XPENDING or lag.

    NOTE: a sum, not one trigger per partition alone: KEDA gives the HPA the largest of several
    triggers' replica counts, which for jobs spread over P partitions asks for P times too few.
    Streams the queue does not have (partitions past its count) read 0, so covering more
    partitions than the queue has is harmless; covering fewer leaves jobs unseen.

The stream names come from wire.keys, the target (jobs per worker) from the worker's own
window: HELD_PER_SLOT jobs per running slot, what one worker holds when all of them are busy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run from a checkout: producer and worker import from it
    sys.path.insert(0, str(REPO_ROOT))

from wire.keys import DEFAULT_QUEUE, QueueKeys  # noqa: E402
from wire.routing import MAX_PARTITIONS  # noqa: E402
from worker.engine.config import EngineConfig  # noqa: E402
from worker.models.aliases import DEFAULT_MODEL  # noqa: E402
from worker.queue.consumer import HELD_PER_SLOT  # noqa: E402

DEFAULT_OUTPUT = REPO_ROOT / "deploy" / "k8s" / "scaledobject.yaml"
NAMESPACE = "radixq"
DEPLOYMENT = "radixq-worker"
# The Redis of deploy/k8s/redis.yaml as KEDA's operator (in its own namespace) reaches it.
REDIS_ADDRESS = f"radixq-redis.{NAMESPACE}.svc.cluster.local:6379"
# Partition streams covered: at least the queue's (its `partitions`, fixed at its first enqueue).
COVERED_PARTITIONS = 16
# Jobs per worker: one worker's default window (queue.read_window 0) of the default engine.
TARGET_JOBS_PER_WORKER = HELD_PER_SLOT * EngineConfig(DEFAULT_MODEL).max_running_reqs
MAX_REPLICAS = 8  # GPUs the pool may take (one per worker)
POLLING_INTERVAL_S = 15
COOLDOWN_S = 300  # idle this long (every stream empty) before scaling to zero


def trigger_name(partition: int) -> str:
    """A formula variable (letters and digits: expr-lang reads '-' as minus)."""
    return f"p{partition}"


def scaled_object(
    queue: str = DEFAULT_QUEUE,
    partitions: int = COVERED_PARTITIONS,
    redis_address: str = REDIS_ADDRESS,
    database: int = 0,
    cluster: bool = False,
    target: int = TARGET_JOBS_PER_WORKER,
    max_replicas: int = MAX_REPLICAS,
) -> dict[str, Any]:
    """The ScaledObject for ``queue``'s first ``partitions`` partition streams."""
    keys = QueueKeys(queue)
    triggers = []
    for partition, stream in enumerate(keys.partitions(partitions)):
        metadata = {"stream": stream, "streamLength": str(target)}
        if cluster:  # KEDA's cluster client follows MOVED itself; no database on a cluster
            metadata = {"addresses": redis_address, **metadata}
        else:
            metadata = {"address": redis_address, "databaseIndex": str(database), **metadata}
        triggers.append(
            {
                "type": "redis-cluster-streams" if cluster else "redis-streams",
                "name": trigger_name(partition),
                "metadata": metadata,
            }
        )
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": DEPLOYMENT,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": "radixq", "app.kubernetes.io/component": "worker"},
        },
        "spec": {
            "scaleTargetRef": {"name": DEPLOYMENT},
            "pollingInterval": POLLING_INTERVAL_S,
            "cooldownPeriod": COOLDOWN_S,
            "minReplicaCount": 0,
            "maxReplicaCount": max_replicas,
            "advanced": {
                "scalingModifiers": {
                    "formula": " + ".join(trigger_name(p) for p in range(partitions)),
                    "target": str(target),
                    "activationTarget": "0",
                    "metricType": "AverageValue",
                },
                # one worker at a time, a minute apart: each drains (finishes or gives back its
                # jobs) before the next goes
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": 300,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                        }
                    }
                },
            },
            "triggers": triggers,
        },
    }


def render(obj: dict[str, Any], command: str) -> str:
    header = (
        "# Generated by deploy/k8s/scaledobject.py (its docstring says why XLEN, summed):\n"
        f"#   {command}\n"
        "# Do not edit by hand: change the script or its flags and write it again.\n"
    )
    return header + yaml.safe_dump(obj, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", default=DEFAULT_QUEUE, help="queue name (RADIXQ_QUEUE of the workers)")
    parser.add_argument(
        "--partitions",
        type=int,
        default=COVERED_PARTITIONS,
        help="partition streams covered: at least the queue's (radixq status shows them)",
    )
    parser.add_argument("--redis-address", default=REDIS_ADDRESS, help="host:port as KEDA reaches Redis")
    parser.add_argument("--database", type=int, default=0, help="the database of the workers' Redis URL")
    parser.add_argument("--cluster", action="store_true", help="Redis Cluster (redis-cluster-streams)")
    parser.add_argument("--target", type=int, default=TARGET_JOBS_PER_WORKER, help="jobs per worker")
    parser.add_argument("--max-replicas", type=int, default=MAX_REPLICAS, help="most workers (GPUs)")
    parser.add_argument("-o", "--output", default=str(DEFAULT_OUTPUT), help="file to write, - for stdout")
    args = parser.parse_args(argv)
    if not 1 <= args.partitions <= MAX_PARTITIONS or args.target < 1 or args.max_replicas < 1:
        print(
            f"error: --partitions in [1, {MAX_PARTITIONS}], --target and --max-replicas >= 1", file=sys.stderr
        )
        return 2
    obj = scaled_object(
        args.queue,
        args.partitions,
        args.redis_address,
        args.database,
        args.cluster,
        args.target,
        args.max_replicas,
    )
    given = argv if argv is not None else sys.argv[1:]
    flags = [
        a
        for i, a in enumerate(given)
        if a not in ("-o", "--output") and given[i - 1 : i] not in (["-o"], ["--output"])
    ]
    text = render(obj, " ".join(["python3 deploy/k8s/scaledobject.py", *flags]))
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

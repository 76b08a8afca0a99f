"""End to end through the queue: the standard offline workload as jobs, through a real
redis-server, one ``radixq worker`` process and the collector; compared with the engine alone.

    python benchmarks/queue_e2e_gpu.py --baseline-json out/bench_default.json

Steps: start a private redis-server (AOF on, fsync everysec); start ``radixq worker`` with a
TOML naming the model and ``load_format = "dummy"``; run 8 warm-up jobs through it (this
also waits out model load and CUDA-graph capture); then enqueue the 256 jobs (input_ids,
ignore_eos, max_tokens, temperature 0.6) and time from the first XADD to the last result
written by the collector, ``--repeat`` times with fresh prompt ids each (offline.fresh_copy:
no run hits another's cached prefixes; checked). Every result is checked (no error,
max_tokens tokens). The overhead is median e2e seconds / median engine-only seconds - 1, the
engine-only runs being the radixq[default] runs of an offline.py JSON of the same workload
(``--baseline-json``, best made with the same ``--repeat``) when given.

``--partitions 16,0`` compares queue layouts in the same call: one queue and one worker per
count (0: one unrouted stream), the KV pool split between the workers (``--mem-fraction``
each), runs interleaved (setting A run 1, setting B run 1, ...); each count gets its median.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from offline import Workload, fresh_copy, standard_workload, warmup_workload  # noqa: E402


def make_jobs(prefix: str, workload: Workload, temperature: float) -> list:
    from wire.schema import Job, SamplingParams

    return [
        Job(
            id=f"{prefix}{i}",
            input_ids=list(prompt),
            sampling=SamplingParams(max_tokens=n, temperature=temperature, ignore_eos=True),
        )
        for i, (prompt, n) in enumerate(zip(workload.prompts, workload.max_tokens, strict=True))
    ]


def run_jobs(client, collector, jobs: list, out: Path, timeout_s: float) -> float:
    start = time.perf_counter()
    client.enqueue(jobs)
    report = collector.collect(out, ids=[j.id for j in jobs], wait=True, timeout_s=timeout_s, poll_s=0.05)
    elapsed = time.perf_counter() - start
    if report.missing:
        raise RuntimeError(f"{len(report.missing)} jobs have no result after {timeout_s} s")
    return elapsed


def check_results(out: Path, jobs: list) -> int:
    """Every job answered once, without error, with exactly max_tokens tokens; returns the total."""
    want = {j.id: j.sampling.max_tokens for j in jobs}
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    got = {r["id"]: r for r in rows}
    assert set(got) == set(want), (
        f"{len(set(want) - set(got))} missing, {len(set(got) - set(want))} unexpected"
    )
    total = 0
    for job_id, n in want.items():
        row = got[job_id]
        assert row.get("error") is None, f"job {job_id}: {row.get('error')}"
        cached = row.get("usage", {}).get("cached_tokens", 0)
        assert cached == 0, f"job {job_id}: {cached} prompt tokens came from an earlier run's cache"
        tokens = row["choices"][0]["token_ids"]
        assert len(tokens) == n, f"job {job_id}: {len(tokens)} tokens, expected {n}"
        total += len(tokens)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="configs/qwen3-0.6b.json")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--device", default=None, help="worker --device (default: auto)")
    parser.add_argument("--baseline-json", default=None, help="offline.py --out JSON of the same workload")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed runs, fresh prompt ids each (the median counts)"
    )
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument(
        "--worker-args", default="", help="more `radixq worker` arguments, e.g. '--read-window 512'"
    )
    parser.add_argument(
        "--partitions",
        default=None,
        help="comma list of queue partition counts, one worker each (0: unrouted)",
    )
    parser.add_argument("--mem-fraction", type=float, default=None, help="each worker's engine mem_fraction")
    args = parser.parse_args()
    if args.partitions is not None:
        compare_partitions(args, [int(p) for p in args.partitions.split(",")])
        return

    from producer.client import Client
    from producer.collector import Collector
    from producer.local_redis import LocalRedis
    from producer.runner import worker_command, worker_env
    from radixq.cli import WORKER_COMMAND

    workload = standard_workload(args.num_requests)
    work = Path(tempfile.mkdtemp(prefix="radixq-e2e-"))
    config = work / "worker.toml"
    config.write_text(f'[engine]\nmodel = "{Path(args.model).resolve()}"\nload_format = "dummy"\n')
    with LocalRedis(use_server=True, fsync="everysec") as redis_server:
        extra = ["--config", str(config)] + (["--device", args.device] if args.device else [])
        extra += args.worker_args.split()
        worker = subprocess.Popen(
            worker_command(WORKER_COMMAND, "e2e", "e2e-0", extra), env=worker_env(redis_server.url)
        )
        try:
            client = Client.from_url(redis_server.url, "e2e")
            collector = Collector(client.redis, "e2e")
            warm_s = run_jobs(
                client,
                collector,
                make_jobs("w", warmup_workload(), args.temperature),
                work / "warm.jsonl",
                args.timeout_s,
            )
            runs_s = []
            for r in range(args.repeat):
                jobs = make_jobs(f"j{r}-", fresh_copy(workload, r), args.temperature)
                runs_s.append(run_jobs(client, collector, jobs, work / f"out{r}.jsonl", args.timeout_s))
                tokens = check_results(work / f"out{r}.jsonl", jobs)
            e2e_s = statistics.median(runs_s)
            client.close()
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
    result = {
        "model": args.model,
        "worker_args": args.worker_args,
        "requests": len(jobs),
        "output_tokens": tokens,
        "startup_and_warmup_s": warm_s,
        "e2e_s": e2e_s,
        "e2e_runs_s": runs_s,
        "e2e_tok_per_s": tokens / e2e_s,
    }
    if args.baseline_json:
        runs = json.loads(Path(args.baseline_json).read_text())
        engine_runs = [
            r for r in (runs if isinstance(runs, list) else [runs]) if r["engine"] == "radixq[default]"
        ]
        result["engine_s"] = statistics.median(
            t for r in engine_runs for t in r.get("runs_s", [r["seconds"]])
        )
        result["overhead"] = e2e_s / result["engine_s"] - 1
    print(json.dumps(result))
    print(
        f"queue e2e: {tokens} tokens in {e2e_s:.2f} s = {tokens / e2e_s:.0f} tok/s (warm-up incl. load {warm_s:.1f} s)"
    )
    if "overhead" in result:
        print(f"engine alone {result['engine_s']:.2f} s -> queue overhead {100 * result['overhead']:+.1f}%")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


def compare_partitions(args: argparse.Namespace, counts: list[int]) -> None:
    """One queue and one worker per partition count, runs interleaved; the median of each."""
    from producer.client import Client
    from producer.collector import Collector
    from producer.local_redis import LocalRedis
    from producer.runner import worker_command, worker_env
    from radixq.cli import WORKER_COMMAND

    workload = standard_workload(args.num_requests)
    work = Path(tempfile.mkdtemp(prefix="radixq-e2e-"))
    config = work / "worker.toml"
    fraction = args.mem_fraction if args.mem_fraction is not None else 0.8 / len(counts)
    config.write_text(
        f'[engine]\nmodel = "{Path(args.model).resolve()}"\nload_format = "dummy"\nmem_fraction = {fraction}\n'
    )
    with LocalRedis(use_server=True, fsync="everysec") as redis_server:
        workers, clients = [], []
        try:
            for n in counts:
                queue = f"e2e-p{n}"
                extra = ["--config", str(config)] + (["--device", args.device] if args.device else [])
                extra += args.worker_args.split()
                env = worker_env(redis_server.url)
                workers.append(
                    subprocess.Popen(worker_command(WORKER_COMMAND, queue, f"{queue}-0", extra), env=env)
                )
                client = Client.from_url(redis_server.url, queue, partitions=n)
                clients.append((client, Collector(client.redis, queue)))
                # one at a time: the second engine sizes its pool after the first took its share
                run_jobs(client, clients[-1][1], make_jobs("w", warmup_workload(), args.temperature),
                         work / f"warm{n}.jsonl", args.timeout_s)  # fmt: skip
            runs: dict[int, list[float]] = {n: [] for n in counts}
            shift = 0
            for r in range(args.repeat):
                for n, (client, collector) in zip(counts, clients, strict=True):
                    jobs = make_jobs(f"j{r}-", fresh_copy(workload, shift), args.temperature)
                    shift += 1
                    out = work / f"out{n}-{r}.jsonl"
                    runs[n].append(run_jobs(client, collector, jobs, out, args.timeout_s))
                    tokens = check_results(out, jobs)
            for client, _ in clients:
                client.close()
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    worker.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    worker.kill()
    result = {
        "model": args.model,
        "worker_args": args.worker_args,
        "mem_fraction": fraction,
        "output_tokens": tokens,
        "runs_s": {str(n): runs[n] for n in counts},
        "median_s": {str(n): statistics.median(runs[n]) for n in counts},
    }
    print(json.dumps(result))
    base = statistics.median(runs[counts[0]])
    for n in counts:
        med = statistics.median(runs[n])
        print(
            f"partitions {n}: median {med:.3f} s of {runs[n]} ({tokens / med:.0f} tok/s), {med / base:.3f} x the first"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

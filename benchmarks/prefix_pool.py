"""A pool of workers on prefix-group jobs: cached tokens against the ideal, and wall time.

From a seed: G groups x K jobs, a random P-token prefix per group and a unique random tail per
job (input_ids: the model is a dummy), shuffled, temperature 0, EOS ignored. They go through a
private redis-server to N ``radixq worker`` processes; the collector waits for every result.
The ideal is one miss per prefix group: (K - 1) x the prefix's whole pages per group. Each
configuration (partitions x workers) runs on a queue of its own: warm-up jobs first (model
load, heartbeats, the queue's partitions), then the timed run, from the first enqueue to the
last result collected.

    # CPU, the issue's pool: 2 workers, each KV pool holding about half of 24 prefixes
    python benchmarks/prefix_pool.py --workers 2 --partitions 1,16

    # issue 20, as a new user runs it: 2 workers, 24 groups x 16 jobs, 600-token prefixes, half-
    # sized caches, the queue made with no routing flag ("default"); then one worker, routed
    # (default) against unrouted (0), 5 rounds interleaved
    python benchmarks/prefix_pool.py --preset newuser --workers 2 --partitions default
    python benchmarks/prefix_pool.py --preset newuser --workers 1 --partitions default,0 --repeat 5

    # two GPUs: one worker per GPU, Qwen3-0.6B (dummy weights), 512 jobs, 16 groups,
    # 3,000-token prefixes, 2,000 pages per worker; 1 worker against 2
    python benchmarks/prefix_pool.py --preset h200 --workers 1,2 --partitions 16 --num-pages 2000
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from producer.client import Client  # noqa: E402
from producer.collector import Collector  # noqa: E402
from producer.local_redis import LocalRedis  # noqa: E402
from producer.runner import worker_command, worker_env  # noqa: E402
from radixq.cli import WORKER_COMMAND  # noqa: E402
from wire.keys import QueueKeys  # noqa: E402
from wire.schema import Job, SamplingParams  # noqa: E402
from wire.status import serving  # noqa: E402

# A tiny Llama for CPU runs (random weights: ``load_format = "dummy"``).
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PRESETS = {
    "cpu": {"groups": 24, "per_group": 4, "prefix_tokens": 256, "tail_tokens": 16, "max_tokens": 4},
    "newuser": {"groups": 24, "per_group": 16, "prefix_tokens": 600, "tail_tokens": 16, "max_tokens": 4},
    "h200": {
        "groups": 16,
        "per_group": 32,
        "prefix_tokens": 3000,
        "tail_tokens": 200,
        "max_tokens": 64,
        "model": "configs/qwen3-0.6b.json",
        "device": "cuda",
        "max_running_reqs": 256,
        "max_prefill_tokens": 8192,
    },
}


def make_jobs(args: argparse.Namespace, tag: str, seed: int, vocab: int) -> list[Job]:
    rng = random.Random(seed)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    jobs = []
    for g in range(args.groups):
        prefix = [rng.randrange(10, vocab) for _ in range(args.prefix_tokens)]
        for k in range(args.per_group):
            tail = [rng.randrange(10, vocab) for _ in range(args.tail_tokens)]
            jobs.append(Job(id=f"{tag}g{g}-{k}", input_ids=prefix + tail, sampling=sampling))
    rng.shuffle(jobs)
    return jobs


def ideal_cached(args: argparse.Namespace) -> int:
    whole_pages = args.prefix_tokens // args.page_size * args.page_size
    return args.groups * (args.per_group - 1) * whole_pages


def default_pages(args: argparse.Namespace) -> int:
    """About half of the groups' prefixes, plus the running requests' own pages."""
    prefix_pages = -(-args.prefix_tokens // args.page_size)
    own_pages = -(-(args.tail_tokens + args.max_tokens) // args.page_size) + 1
    return args.groups * prefix_pages // 2 + args.max_running_reqs * own_pages


def run_pool(
    args: argparse.Namespace, model: str, redis_url: str, partitions: str, workers: int, round_no: int = 0
) -> dict:
    """``partitions``: a count for ``Client(partitions=...)``, or "default": no argument, as the
    CLI makes a queue with no routing flag."""
    queue = f"pool-p{partitions}-w{workers}-r{round_no}"
    work = Path(tempfile.mkdtemp(prefix="radixq-pool-"))
    config = work / "worker.toml"
    config.write_text(
        "[engine]\n"
        f'model = "{model}"\nload_format = "dummy"\ndevice = "{args.device}"\n'
        f"num_pages = {args.num_pages}\npage_size = {args.page_size}\n"
        f"max_running_reqs = {args.max_running_reqs}\nmax_prefill_tokens = {args.max_prefill_tokens}\n"
    )
    procs = []
    for w in range(workers):
        env = worker_env(redis_url)
        if args.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(w)  # one worker per GPU
        extra = ["--config", str(config), *args.worker_args.split()]
        log = open(work / f"worker{w}.log", "wb")  # noqa: SIM115 (closed with the process)
        procs.append(subprocess.Popen(worker_command(WORKER_COMMAND, queue, f"w{w}", extra), env=env, stdout=log, stderr=log))
    routing = {} if partitions == "default" else {"partitions": int(partitions)}
    client = Client.from_url(redis_url, queue, **routing)
    collector = Collector(client.redis, queue)
    try:
        deadline = time.monotonic() + args.timeout_s
        while len(serving(client.redis, QueueKeys(queue))) < workers:  # NOTE: loaded: beats past LOADING
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"workers did not come up; logs in {work}")
            time.sleep(0.2)
        vocab = TINY_LLAMA["vocab_size"] if args.model is None else args.vocab
        warm = make_jobs(
            argparse.Namespace(**{**vars(args), "groups": 2 * workers, "per_group": 2}), "w", 999, vocab
        )
        client.enqueue(warm)
        collector.collect(work / "warm.jsonl", ids=[j.id for j in warm], wait=True, timeout_s=args.timeout_s)
        time.sleep(1.0)  # every worker surveys the queue (partitions, live workers)
        jobs = make_jobs(args, "j", args.seed, vocab)
        start = time.perf_counter()
        client.enqueue(jobs)
        report = collector.collect(
            work / "out.jsonl", ids=[j.id for j in jobs], wait=True, timeout_s=args.timeout_s, poll_s=0.05
        )
        wall_s = time.perf_counter() - start
        if report.missing:
            raise RuntimeError(f"{len(report.missing)} jobs have no result; logs in {work}")
        rows = [json.loads(line) for line in (work / "out.jsonl").read_text().splitlines()]
        errors = [r["id"] for r in rows if r.get("error")]
        if errors:
            raise RuntimeError(f"{len(errors)} jobs failed, e.g. {errors[0]}; logs in {work}")
        cached = sum(r["usage"]["cached_tokens"] for r in rows)
        status = client.status()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        client.close()
    per_worker = {
        c.name: {"hit_rate": c.heartbeat.hit_rate, "prefix_keys": c.heartbeat.prefix_keys}
        for c in status.consumers
        if c.heartbeat is not None
    }
    return {
        "partitions": partitions,
        "queue_partitions": status.partitions,
        "round": round_no,
        "workers": workers,
        "jobs": len(jobs),
        "wall_s": round(wall_s, 3),
        "cached_tokens": cached,
        "ideal_cached_tokens": ideal_cached(args),
        "of_ideal": round(cached / ideal_cached(args), 4),
        "per_worker": per_worker,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--workers", default="2", help="comma-separated pool sizes to run")
    parser.add_argument(
        "--partitions",
        default="16",
        help='comma-separated partition counts to run ("default": the queue a new user gets, no flag)',
    )
    parser.add_argument("--repeat", type=int, default=1, help="rounds, the configurations interleaved")
    parser.add_argument("--groups", type=int)
    parser.add_argument("--per-group", type=int)
    parser.add_argument("--prefix-tokens", type=int)
    parser.add_argument("--tail-tokens", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--model", default=None, help="model config JSON (default: a tiny Llama on CPU)")
    parser.add_argument("--vocab", type=int, default=151936, help="token ids drawn below this (--model)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--num-pages", type=int, default=None, help="per worker (default: half the prefixes)")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--max-running-reqs", type=int)
    parser.add_argument("--max-prefill-tokens", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("--worker-args", default="", help="more `radixq worker` arguments")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    preset = PRESETS[args.preset]
    defaults = {"device": "cpu", "max_running_reqs": 8, "max_prefill_tokens": 2048, **preset}
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    args.num_pages = args.num_pages or default_pages(args)
    work = Path(tempfile.mkdtemp(prefix="radixq-pool-model-"))
    if args.model is None:
        (work / "config.json").write_text(json.dumps(TINY_LLAMA))
        model = str(work / "config.json")
    else:
        model = str(Path(args.model).resolve())
    results = []
    with LocalRedis(use_server=True) as redis_server:
        for round_no in range(args.repeat):
            for partitions in args.partitions.split(","):
                for workers in [int(w) for w in args.workers.split(",")]:
                    result = run_pool(args, model, redis_server.url, partitions, workers, round_no)
                    print(json.dumps(result), flush=True)
                    results.append(result)
    meta = {k: getattr(args, k) for k in ("preset", "groups", "per_group", "prefix_tokens", "tail_tokens")}
    meta.update(num_pages=args.num_pages, max_running_reqs=args.max_running_reqs, device=args.device)
    for r in results:
        print(
            f"partitions {r['partitions']:>7} ({r['queue_partitions']} streams), workers {r['workers']}, "
            f"round {r['round']}: {r['wall_s']:.2f} s, "
            f"cached {r['cached_tokens']} of ideal {r['ideal_cached_tokens']} = {100 * r['of_ideal']:.1f}%"
        )
    if args.repeat > 1:
        for config in sorted({(r["partitions"], r["workers"]) for r in results}):
            walls = [r["wall_s"] for r in results if (r["partitions"], r["workers"]) == config]
            print(
                f"partitions {config[0]}, workers {config[1]}: median {statistics.median(walls):.2f} s of {walls}"
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"settings": meta, "runs": results}, indent=1))


if __name__ == "__main__":
    main()

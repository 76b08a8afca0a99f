"""Host time of one batch preparation (BatchPreparer.prepare), the scheduler's hot path, on CPU.

A decode step of ``--batch`` running requests (the standard workload's 256 by default), each
``--seq-len`` tokens long, sampled (temperature 0.6) so every sampling column is built; padded
to a captured graph size as on CUDA (``--graph-bs``, 0 for no graph). No model runs: the
engine is a stand-in holding what the preparer reads. Prints the median and quartiles of
``--reps`` calls in microseconds.

    python benchmarks/prepare_host.py --batch 256 --reps 2000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from wire.schema import SamplingParams  # noqa: E402
from worker.kvcache.table import TableManager  # noqa: E402
from worker.scheduler.intake import make_group  # noqa: E402
from worker.scheduler.ledger import SlotLedger  # noqa: E402
from worker.scheduler.messages import GenerateRequest  # noqa: E402
from worker.scheduler.prepare import BatchPreparer  # noqa: E402
from worker.scheduler.req import Req  # noqa: E402


def decode_batch(batch: int, seq_len: int, graph_bs: int) -> tuple[BatchPreparer, list[Req]]:
    """A preparer over CPU tables and ``batch`` requests in their decode phase."""
    page_size = 16
    shape = (batch + 1, seq_len + page_size)
    tables = TableManager(batch, torch.zeros(shape, dtype=torch.int32), torch.zeros(shape, dtype=torch.int32))
    dummy_loc = batch * shape[1]
    engine = SimpleNamespace(
        device=torch.device("cpu"),
        scheduler_stream=None,
        stream=None,
        graph_batch_size=lambda b: graph_bs or None,
        dummy_loc=dummy_loc,
        vocab_size=151_936,
    )
    preparer = BatchPreparer(engine, tables, SlotLedger(batch + 1, 151_936))  # type: ignore[arg-type]
    reqs = []
    prompt_len = seq_len // 2
    for i in range(batch):
        msg = GenerateRequest(
            uid=f"r{i}",
            input_ids=[1] * prompt_len,
            sampling=SamplingParams(max_tokens=seq_len, temperature=0.6, ignore_eos=True),
        )
        _, (pending,) = make_group(msg, max_seq_len=2 * seq_len)
        slot = tables.allocate()
        row = torch.arange(slot * shape[1], (slot + 1) * shape[1], dtype=torch.int32)
        tables.write_locations(slot, 0, row)
        pending.input_ids.extend([2] * (seq_len - prompt_len - 1))
        reqs.append(
            Req(
                pending=pending,
                slot=slot,
                cached_len=seq_len - 1,
                device_len=seq_len,
                max_device_len=pending.max_device_len,
                handle=None,
                matched_len=0,
                alloc_len=shape[1],
                ledger=preparer.ledger,
            )
        )
    return preparer, reqs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--graph-bs", type=int, default=256, help="captured size the batch pads to; 0: none")
    parser.add_argument("--reps", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    preparer, reqs = decode_batch(args.batch, args.seq_len, args.graph_bs)
    for _ in range(50):
        preparer.prepare(reqs)
    times_us = []
    for _ in range(args.reps):
        start = time.perf_counter()
        preparer.prepare(reqs)
        times_us.append((time.perf_counter() - start) * 1e6)
    q1, median, q3 = statistics.quantiles(times_us, n=4)
    print(json.dumps({"batch": args.batch, "reps": args.reps, "p25_us": q1, "p50_us": median, "p75_us": q3}))


if __name__ == "__main__":
    main()

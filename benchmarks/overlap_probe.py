"""Does a decode step's attention overlap its GEMMs when the batch is cut in two? (issue 31
item 2: the measured plan before any nano-batch path is built)

One decode step of a model config, with dummy weights: per layer the QKV projection, attention
over B requests of about L cached tokens (the attention backend's kernels on its paged KV, bf16
or FP8 pages), the O projection, gate/up, SiLU-mul and down, each layer's output feeding the
next (norms, RoPE, residuals and the LM head left out: the same in every variant). The GEMMs
are bf16, or with ``--weights fp8`` the engine's FP8 ones (activations quantized per row,
e4m3 weights with per-channel scales, ``torch._scaled_mm``). Captured in CUDA graphs and
timed these ways, interleaved, median of ``--reps`` replays:

    whole     every layer over all B rows (today's step)
    halves    two nano-batches of B/2, one after the other on one stream
    overlap   the same two nano-batches on two streams of one graph (fork, join), each its own
              chain of layers: one's attention may run beside the other's GEMMs
    attention / gemms   the whole batch's attention alone, its GEMMs alone
    overlap@S, gemms@S  (``--gemm-sms``) the same with every GEMM the bounded one
              (worker.kernels.bounded_gemm) on at most S SMs, leaving the others to attention;
              S/tma: its operands read by TMA (``--gemm-loads``)
    carve@C   (``--carveout``, CUDA) overlap with cuBLAS told to leave C SMs free
              (torch's SM carve-out, set while the graph is captured)
    overlap/prio, overlap/prio-attention   the two nano-batches' chains again, each op on a
              stream of its kind: GEMMs on a high-priority stream and attention on a normal one
              (or the reverse). PyTorch instantiates its graphs with
              cudaGraphInstantiateFlagUseNodePriority, so each kernel keeps the priority of the
              stream it was captured on: as SMs free, the ready kernel of higher priority takes
              them first. ``prio_agree``: how far half A's output on those streams is from its
              output on one stream (eager; 0 unless the streams race)
    attention@greenA, overlap/greenA   (``--green-sms``, CUDA 12.8+) launched op by op: the whole
              batch's attention with every kernel held to A SMs by a green context, and the two
              halves with their attention held there and their GEMMs on high-priority streams
              (free to use any SM); beside them whole/eager and attention/eager, the same ops
              launched the same way. Does attention keep its bandwidth on fewer SMs, and do the
              GEMMs fill the rest? A failure (an old torch, a driver) is reported as green_error
    attention@splitA, gemms@splitR, overlap/splitA   (``--split-sms``, CUDA, cuda-python) the
              device cut in two disjoint green contexts, A SMs (the driver rounds up to 8) for
              attention and the other R for GEMMs: each part alone, then the two halves with
              every attention on the first and every GEMM on the second, launched op by op
              (``split_agree@A``: half A's output so against one stream, 0 unless they race);
              with ``--split-graph`` also overlap/splitA/graph, the same captured in a CUDA graph
              (a failure is reported as split_graph_error). Unlike greenA, neither part can take
              the other's SMs: the NanoFlow plan, attention keeping its bandwidth on A SMs while
              the GEMMs compute on the rest

``overlap`` below ``whole`` is what nano-batching could gain on that shape; at best it reaches
max(attention, gemms). The two halves read distinct KV pools and weights of the same shapes
(so nothing is shared between the streams but the GPU). Each bounded S also reports how far
its output is from cuBLAS's on the first layer's projections (``agree@S``, the largest relative
error: the kernel is checked where it is timed).

    python benchmarks/overlap_probe.py                                      # Qwen3-0.6B, 256 x 850, bf16 and FP8 KV
    python benchmarks/overlap_probe.py --model configs/llama-3.1-8b.json --batch 1024 --length 1500 --kv fp8 --weights fp8
    python benchmarks/overlap_probe.py --device cpu --attention torch --layers 2 --batch 4 --length 40 --hidden 64  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from attention_backend import POOL_LAYERS, build  # noqa: E402
from gpu_timing import captured, event_ms  # noqa: E402
from model_shape import ModelShape  # noqa: E402

from worker.engine.split import green_streams  # noqa: E402
from worker.kernels.bounded_gemm import bounded_linear  # noqa: E402
from worker.kernels.ops import quantize_fp8_rows  # noqa: E402
from worker.models.fp8 import Fp8Linear, quantize_channels  # noqa: E402

VARIANTS = ("whole", "halves", "overlap", "attention", "gemms", "overlap/prio", "overlap/prio-attention")
# and overlap@S, gemms@S, carve@C


@dataclass
class Half:
    """One nano-batch (or the whole batch): its attention backend and pass metadata, its rows'
    activations, and every layer's projection weights."""

    backend: object
    layout: object
    meta: object
    x: torch.Tensor  # [rows, hidden]
    layers: list[dict[str, torch.Tensor | Fp8Linear]]


def weights(
    shape: ModelShape, layers: int, device: str, seed: int, fp8: bool = False
) -> list[dict[str, torch.Tensor | Fp8Linear]]:
    """Each layer's projections: bf16 [N, K], or with ``fp8`` the engine's Fp8Linear of them."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim

    def w(n: int, k: int) -> torch.Tensor | Fp8Linear:
        weight = (torch.randn(n, k, device=device, generator=gen) / k**0.5).to(torch.bfloat16)
        return Fp8Linear(*quantize_channels(weight), None, torch.bfloat16) if fp8 else weight

    return [
        {"qkv": w(q + 2 * kv, shape.hidden), "o": w(shape.hidden, q),
         "gate_up": w(2 * shape.intermediate, shape.hidden), "down": w(shape.hidden, shape.intermediate)}
        for _ in range(layers)
    ]  # fmt: skip


def half(args: argparse.Namespace, shape: ModelShape, rows: int, seed: int) -> Half:
    gen = torch.Generator().manual_seed(seed)
    spread = max(1, args.length // 10)
    lens = torch.randint(args.length - spread, args.length + spread + 1, (rows,), generator=gen)
    cache_dtype = torch.float8_e4m3fn if args.kv == "fp8" else None
    backend, layout = build(
        [(int(n) - 1, 1) for n in lens], shape.heads, shape.kv_heads, args.page_size, seed=seed,
        cache_dtype=cache_dtype, head_dim=shape.head_dim, backend_name=args.attention, device=args.device,
    )  # fmt: skip
    x = torch.randn(rows, shape.hidden, device=args.device).to(torch.bfloat16)
    fp8 = args.weights == "fp8"
    return Half(backend, layout, None, x, weights(shape, args.layers, args.device, seed, fp8))


@dataclass(frozen=True)
class Bound:
    """The bounded GEMM on at most ``sms`` SMs, its operands read by TMA or per thread."""

    sms: int
    tma: bool = False

    def __str__(self) -> str:
        return f"{self.sms}/tma" if self.tma else str(self.sms)


def linear(bound: Bound | None) -> Callable[[torch.Tensor, torch.Tensor | Fp8Linear], torch.Tensor]:
    """x @ w^T for a bf16 weight or an Fp8Linear: cuBLAS (``bound`` None; FP8 as the engine runs
    it), else the bounded GEMM."""

    def run(x: torch.Tensor, w: torch.Tensor | Fp8Linear) -> torch.Tensor:
        if bound is None:
            return w(x) if isinstance(w, Fp8Linear) else torch.nn.functional.linear(x, w)
        if isinstance(w, torch.Tensor):
            return bounded_linear(x, w, programs=bound.sms, tma=bound.tma)
        rows = quantize_fp8_rows(x)
        scales = {"x_scale": rows.scale, "w_scale": w.weight_scale, "out_dtype": w.out_dtype}
        return bounded_linear(rows.data, w.weight, programs=bound.sms, tma=bound.tma, **scales)

    return run


class Lanes:
    """Where one nano-batch's ops run: its GEMMs on one stream and its attention on another (CUDA;
    None: every op runs in turn on the host), each op after the one before it (the chain stays a
    chain)."""

    def __init__(self, gemm: torch.cuda.Stream | None, attention: torch.cuda.Stream | None) -> None:
        self.streams = {"gemm": gemm, "attention": attention}
        self.last: torch.cuda.Stream | None = None

    @classmethod
    def prioritized(cls, gemm_priority: int, attention_priority: int) -> Lanes:
        """Two new streams of these priorities (lower is higher, as CUDA's)."""
        if not torch.cuda.is_available():
            return cls(None, None)
        return cls(torch.cuda.Stream(priority=gemm_priority), torch.cuda.Stream(priority=attention_priority))

    @contextmanager
    def on(self, kind: str) -> Iterator[None]:
        stream = self.streams[kind]
        if stream is None:
            yield
            return
        stream.wait_stream(self.last or torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            yield
        self.last = stream

    def join(self) -> None:
        """The current stream waits for both (a capture's forked streams must rejoin it)."""
        for stream in self.streams.values():
            if stream is not None:
                torch.cuda.current_stream().wait_stream(stream)
        self.last = None


_GREEN_CONTEXTS: list[object] = []  # NOTE: a green context must outlive the streams it handed out


def green_stream(sms: int) -> torch.cuda.Stream:
    """A stream whose kernels run on at most ``sms`` SMs: one of a green context's
    (torch.cuda.green_contexts, beta: CUDA 12.8+, and a torch whose GreenContext hands out
    streams); RuntimeError where there is none."""
    from torch.cuda import green_contexts

    if not green_contexts.SUPPORTED:
        raise RuntimeError(f"torch {torch.__version__} was built without green contexts")
    context = green_contexts.GreenContext.create(num_sms=sms)
    if not hasattr(context, "Stream"):
        raise RuntimeError(f"torch {torch.__version__}: GreenContext has no Stream()")
    _GREEN_CONTEXTS.append(context)
    return context.Stream()


def step(
    h: Half,
    shape: ModelShape,
    attention: bool = True,
    gemms: bool = True,
    bound: Bound | None = None,
    lanes: Lanes | None = None,
) -> torch.Tensor:
    """The layers' chain over one nano-batch (module docstring); either part alone when asked;
    GEMMs as ``linear(bound)``; each op on its stream of ``lanes`` when given (the caller joins)."""
    x = h.x
    mm = linear(bound)
    rows, q_dim = x.shape[0], shape.heads * shape.head_dim

    def on(kind: str) -> AbstractContextManager[None]:
        return lanes.on(kind) if lanes is not None else nullcontext()

    q = torch.zeros(rows, shape.heads, shape.head_dim, dtype=x.dtype, device=x.device)
    for i, w in enumerate(h.layers):
        if gemms:
            with on("gemm"):
                qkv = mm(x, w["qkv"])
                q = qkv[:, :q_dim].reshape(rows, shape.heads, shape.head_dim)
        if attention:
            with on("attention"):
                q = h.backend.forward(q.contiguous(), i % POOL_LAYERS, h.meta).reshape(rows, shape.heads, -1)
        if gemms:
            with on("gemm"):
                x = mm(q.reshape(rows, q_dim), w["o"])
                gate, up = mm(x, w["gate_up"]).chunk(2, dim=-1)
                x = mm(torch.nn.functional.silu(gate) * up, w["down"])
    return x


def agreement(h: Half, bound: Bound) -> float:
    """The largest relative error (Frobenius) of the bounded GEMM against cuBLAS over the first
    layer's four projections, each given the same random input of its width."""
    gen = torch.Generator(device=h.x.device).manual_seed(7)
    worst = 0.0
    for w in h.layers[0].values():
        depth = w.in_features if isinstance(w, Fp8Linear) else w.shape[1]
        x = torch.randn(h.x.shape[0], depth, device=h.x.device, generator=gen).to(torch.bfloat16)
        reference = linear(None)(x, w).float()
        worst = max(worst, float((linear(bound)(x, w).float() - reference).norm() / reference.norm()))
    return worst


def replan(h_list: list[Half]) -> None:
    """Each backend's plan for its rows, before a replay or an eager run (CUDA)."""
    if torch.cuda.is_available():
        for h in h_list:
            h.backend.plan_for_replay(h.layout, h.x.shape[0])


def split_agreement(h: Half, shape: ModelShape, lanes: Lanes) -> float:
    """The largest difference between one half's output with its ops on ``lanes`` and on one
    stream, run eagerly (the same kernels on the same inputs: 0 unless the streams race)."""
    replan([h])
    alone = step(h, shape)
    split = step(h, shape, lanes=lanes)
    lanes.join()
    return float((split.float() - alone.float()).abs().max())


def eager(h_list: list[Half], run: Callable[[], object]) -> Callable[[], None]:
    """``run`` launched op by op (for streams a graph may not capture), after each backend's plan."""

    def launch() -> None:
        replan(h_list)
        run()

    return launch


def graphed(h_list: list[Half], run: Callable[[], object], carveout: int | None = None) -> Callable[[], None]:
    """A CUDA graph of ``run`` (after a warm-up on a side stream), replayed after each backend's
    replay plan; on CPU, ``run`` itself. ``carveout``: cuBLAS leaves that many SMs free in the
    graph's GEMMs (torch's experimental SM carve-out, read when each GEMM is launched, which
    only cuBLASLt honours: torch is told to prefer it for bf16 GEMMs meanwhile)."""
    if not torch.cuda.is_available():

        def eager() -> None:
            run()

        return eager
    library = torch.backends.cuda.preferred_blas_library()
    if carveout is not None:
        torch.backends.cuda.preferred_blas_library("cublaslt")
    torch._C._set_sm_carveout_experimental(carveout)
    try:
        graph, _ = captured(run)
    finally:
        torch._C._set_sm_carveout_experimental(None)
        torch.backends.cuda.preferred_blas_library(library)

    def replay() -> None:
        replan(h_list)
        graph.replay()

    return replay


def two_streams(
    a: Callable[[], object], b: Callable[[], object], side: torch.cuda.Stream | None
) -> Callable[[], None]:
    """``a`` on the current stream and ``b`` on ``side``, forked and joined (inside a capture too)."""

    def run() -> None:
        if side is None:
            a(), b()
            return
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            b()
        a()
        main.wait_stream(side)

    return run


def prepare(h: Half) -> None:
    """Graph-mode metadata for this nano-batch's size (CUDA), or an eager plan (CPU)."""
    rows = h.x.shape[0]
    if torch.cuda.is_available():
        h.backend.init_cuda_graphs([rows], max_seq_len=int(h.layout.seq_lens_cpu.max()))
        h.meta = h.backend.capture_meta(rows)
        h.backend.plan_for_replay(h.layout, rows)
    else:
        h.meta = h.backend.plan(h.layout)


def failure(exc: BaseException) -> str:
    """An exception in one line of a result row."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def split_runs(
    whole: Half, a: Half, b: Half, shape: ModelShape, sms: int, row: dict, graph: bool
) -> dict[str, Callable[[], None]]:
    """The split variants for one cut (module docstring): each half's attention on its own stream
    of the attention part and its GEMMs on its own stream of the rest, so the halves' chains
    interleave; checked against one stream (``split_agree@A``) and run once before timing."""
    attention, gemms, attention_sms, gemm_sms = green_streams(sms)
    lanes = (Lanes(gemms[0], attention[0]), Lanes(gemms[1], attention[1]))

    def alone(attention: bool) -> Callable[[], None]:
        def run() -> None:
            step(whole, shape, attention=attention, gemms=not attention, lanes=lanes[0])
            lanes[0].join()

        return eager([whole], run)

    def both() -> None:
        step(a, shape, lanes=lanes[0]), step(b, shape, lanes=lanes[1])
        for lane in lanes:
            lane.join()

    runs = {
        f"attention@split{attention_sms}": alone(attention=True),
        f"gemms@split{gemm_sms}": alone(attention=False),
        f"overlap/split{attention_sms}": eager([a, b], both),
    }
    row[f"split_agree@{attention_sms}"] = split_agreement(a, shape, lanes[0])
    for fn in runs.values():
        event_ms(fn)  # a first call: what fails, fails here
    if graph:
        try:
            runs[f"overlap/split{attention_sms}/graph"] = graphed([a, b], both)
        except Exception as exc:  # noqa: BLE001
            row[f"split_graph_error@{attention_sms}"] = failure(exc)
    return runs


def probe(args: argparse.Namespace, shape: ModelShape) -> dict:
    """Median ms per step of each variant (module docstring) for one KV dtype."""
    whole = half(args, shape, args.batch, 1)
    a, b = half(args, shape, args.batch // 2, 2), half(args, shape, args.batch // 2, 3)
    for h in (whole, a, b):
        prepare(h)
    side = torch.cuda.Stream() if torch.cuda.is_available() else None

    def overlap(bound: Bound | None = None) -> Callable[[], None]:
        return two_streams(lambda: step(a, shape, bound=bound), lambda: step(b, shape, bound=bound), side)

    def split(lanes: tuple[Lanes, Lanes]) -> Callable[[], None]:
        """The two halves, each op on its half's lanes, both joined at the end."""

        def run() -> None:
            step(a, shape, lanes=lanes[0]), step(b, shape, lanes=lanes[1])
            for lane in lanes:
                lane.join()

        return run

    def prioritized(gemm_priority: int, attention_priority: int) -> Callable[[], None]:
        return split((Lanes.prioritized(gemm_priority, attention_priority),
                      Lanes.prioritized(gemm_priority, attention_priority)))  # fmt: skip

    high = -100  # torch.cuda.Stream maps a priority past the device's range to its highest

    runs = {
        "whole": graphed([whole], lambda: step(whole, shape)),
        "halves": graphed([a, b], lambda: (step(a, shape), step(b, shape))),
        "overlap": graphed([a, b], overlap()),
        "attention": graphed([whole], lambda: step(whole, shape, gemms=False)),
        "gemms": graphed([whole], lambda: step(whole, shape, attention=False)),
        "overlap/prio": graphed([a, b], prioritized(high, 0)),
        "overlap/prio-attention": graphed([a, b], prioritized(0, high)),
    }  # fmt: skip
    row = {"kv": args.kv, "weights": args.weights, "batch": args.batch, "length": args.length,
           "layers": args.layers, "prio_agree": split_agreement(a, shape, Lanes.prioritized(high, 0))}  # fmt: skip
    for bound in (Bound(sms, load == "tma") for sms in args.gemm_sms for load in args.gemm_loads):
        runs[f"overlap@{bound}"] = graphed([a, b], overlap(bound))
        runs[f"gemms@{bound}"] = graphed(
            [whole], lambda bound=bound: step(whole, shape, attention=False, bound=bound)
        )
        row[f"agree@{bound}"] = agreement(whole, bound)
    for free in args.carveout if side is not None else ():
        runs[f"carve@{free}"] = graphed([a, b], overlap(), carveout=free)
    if args.green_sms or args.split_sms:
        runs["whole/eager"] = eager([whole], lambda: step(whole, shape))
        runs["attention/eager"] = eager([whole], lambda: step(whole, shape, gemms=False))
    if args.green_sms:
        try:  # NOTE: green contexts are beta in torch: a failure is reported in the row, the rest go on
            green: dict[str, Callable[[], None]] = {}
            for sms in args.green_sms:
                alone = Lanes(None, green_stream(sms))
                green[f"attention@green{sms}"] = eager(
                    [whole], lambda lanes=alone: (step(whole, shape, gemms=False, lanes=lanes), lanes.join())
                )
                halves = (
                    Lanes(torch.cuda.Stream(priority=high), green_stream(sms)),
                    Lanes(torch.cuda.Stream(priority=high), green_stream(sms)),
                )
                green[f"overlap/green{sms}"] = eager([a, b], split(halves))
            for fn in green.values():
                event_ms(fn)  # a first call: what fails, fails here
            runs.update(green)
        except Exception as exc:  # noqa: BLE001
            row["green_error"] = failure(exc)
    for sms in args.split_sms:
        try:  # NOTE: as green contexts: a failure is reported in the row, the rest go on
            runs.update(split_runs(whole, a, b, shape, sms, row, args.split_graph))
        except Exception as exc:  # noqa: BLE001
            row[f"split_error@{sms}"] = failure(exc)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(args.reps):  # interleaved
        if rep >= 3 and args.deadline is not None and time.monotonic() > args.deadline:
            break  # --budget-s spent: the medians of the rounds so far (at least 3)
        for name, fn in runs.items():
            times[name].append(event_ms(fn))
    row["reps"] = len(times["whole"])
    row.update({f"{name}_ms": statistics.median(t) for name, t in times.items()})
    row["overlap_vs_whole"] = row["overlap_ms"] / row["whole_ms"]
    row["best_possible_ms"] = max(row["attention_ms"], row["gemms_ms"])
    return row


def table(rows: list[dict]) -> str:
    """One markdown row per (KV dtype, variant): ms and its ratio to ``whole``."""
    lines = [
        "| KV | weights | variant | ms | / whole | agree (bounded vs cuBLAS) |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        for key in (k for k in r if k.endswith("_ms") and k != "best_possible_ms"):
            name = key[:-3]
            agree = r.get(f"agree@{name.split('@')[1]}") if name.startswith("gemms@") else None
            lines.append(f"| {r['kv']} | {r['weights']} | {name} | {r[key]:.3f} | {r[key] / r['whole_ms']:.3f} | "
                         f"{'' if agree is None else f'{agree:.1e}'} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="configs/qwen3-0.6b.json", help="a config.json (its shape only)")
    parser.add_argument("--batch", type=int, default=256, help="requests decoding (cut in two halves)")
    parser.add_argument("--length", type=int, default=850, help="cached tokens per request, about")
    parser.add_argument("--kv", default="bf16,fp8", help="comma list: bf16, fp8")
    parser.add_argument("--layers", type=int, default=None, help="layers (default: the model's)")
    parser.add_argument(
        "--hidden", type=int, default=None, help="override hidden and intermediate/3 (smoke runs)"
    )
    parser.add_argument("--weights", default="bf16", choices=("bf16", "fp8"), help="the GEMMs' weights")
    parser.add_argument(
        "--gemm-sms", default=None,
        help="comma list: SMs the bounded GEMM may hold in overlap@S / gemms@S (default 66,88,110,132 on CUDA: 132 is the whole H200, "
        "none on CPU, where it needs TRITON_INTERPRET=1; '' for none)",
    )  # fmt: skip
    parser.add_argument(
        "--gemm-loads",
        default="ptr,tma",
        help="comma list: how the bounded GEMM reads its operands: ptr (per thread), tma",
    )
    parser.add_argument(
        "--carveout", default="44,66", help="comma list: SMs cuBLAS leaves free in carve@C (CUDA)"
    )
    parser.add_argument(
        "--green-sms",
        default="",
        help="comma list: SMs of the green contexts of attention@greenA, overlap/greenA (CUDA)",
    )
    parser.add_argument(
        "--split-sms",
        default="",
        help="comma list: SMs of attention's part in attention@splitA, gemms@splitR, overlap/splitA (CUDA, cuda-python)",
    )
    parser.add_argument(
        "--split-graph",
        action="store_true",
        help="also overlap/splitA/graph: the split captured in a CUDA graph",
    )
    parser.add_argument("--attention", default="flashinfer", help="attention backend: flashinfer, torch")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument(
        "--budget-s", type=float, default=None,
        help="stop timing a KV dtype's rounds once this many seconds have passed since the start (at least 3 rounds)",
    )  # fmt: skip
    parser.add_argument("--out", default=None, help="JSON of the rows, rewritten as each KV dtype ends")
    args = parser.parse_args(argv)
    args.deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    shape = ModelShape.from_config(json.loads(Path(args.model).read_text()))
    if args.hidden:
        shape = replace(shape, hidden=args.hidden, intermediate=3 * args.hidden)
    args.layers = args.layers or shape.layers
    if args.gemm_sms is None:
        args.gemm_sms = "66,88,110,132" if args.device == "cuda" else ""
    args.gemm_sms = [int(v) for v in args.gemm_sms.split(",") if v]
    args.gemm_loads = args.gemm_loads.split(",")
    if set(args.gemm_loads) - {"ptr", "tma"}:
        parser.error(f"--gemm-loads: {args.gemm_loads}, expected ptr and/or tma")
    args.carveout = [int(v) for v in args.carveout.split(",") if v]
    args.green_sms = [int(v) for v in args.green_sms.split(",") if v]
    args.split_sms = [int(v) for v in args.split_sms.split(",") if v]
    if (args.green_sms or args.split_sms) and args.device != "cuda":
        parser.error("--green-sms and --split-sms need CUDA (green contexts hold kernels to a set of SMs)")
    if args.gemm_sms and args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error(
            "--gemm-sms on CPU needs TRITON_INTERPRET=1 (the bounded GEMM is a Triton kernel); pass --gemm-sms ''"
        )
    rows = []
    for kv in args.kv.split(","):
        row = probe(argparse.Namespace(**{**vars(args), "kv": kv}), shape)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.out:  # NOTE: each row as it ends, so a call cut short keeps what it measured
            Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"\n{args.model}: one decode step, {args.layers} layers, {args.batch} x ~{args.length} tokens")
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()

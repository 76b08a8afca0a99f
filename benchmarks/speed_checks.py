"""The speed figures the test suite used to assert, measured on purpose (issue 18, step 4).

A test checks what happens, never how fast: a bound on a loaded box is a flake. Each figure
here was a test's wall-clock bound; the bound it held is printed beside it as the target.

    python benchmarks/speed_checks.py penalties          # build_penalties, 256 rows x 1,024 biases
    python benchmarks/speed_checks.py model-load         # SmolLM2 from its converted cache
    python benchmarks/speed_checks.py model-load --model configs/qwen3-0.6b.json --dummy --device cuda
    python benchmarks/speed_checks.py grammar-readback   # longest poll while a 57 MB grammar is read back
    python benchmarks/speed_checks.py grammar-step       # longest scheduler step while a slow grammar compiles

Exit 0 when the figure meets the old bound, 1 otherwise. Record figures in docs/performance.md
with the date, the commit and the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))


def penalties(repeat: int) -> tuple[float, float, str]:
    """Milliseconds to build one batch's penalties (was tests/unit/test_penalties.py: < 8 ms)."""
    import torch

    from wire.schema import MAX_LOGIT_BIAS, SamplingParams
    from worker.engine.penalties import build_penalties, penalty_row

    eos = (5, 7)
    rows = []
    for i in range(256):
        bias = {str((i * 7 + j * 40) % 49152): float(j % 200 - 100) for j in range(MAX_LOGIT_BIAS)}
        rows.append(penalty_row(SamplingParams(logit_bias=bias, min_tokens=9), eos, 49152))
    pool = torch.zeros(256, 16, dtype=torch.int32)
    build_penalties(rows, list(range(256)), [4] * 256, [5] * 256, pool)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        build_penalties(rows, list(range(256)), [4] * 256, [5] * 256, pool)
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times), 8.0, f"ms (median of {repeat}), 256 rows x {MAX_LOGIT_BIAS} biases"


def model_load(model: str, dummy: bool, device: str) -> tuple[float, float, str]:
    """Seconds to load a model (was test_models_smollm2.py: cached SmolLM2 < 10 s on CPU;
    tests/gpu/test_models_gpu.py: dummy real-size weights < 120 s on the GPU)."""
    from worker.models import load_model

    kwargs: dict[str, object] = {"device": device}
    if dummy:
        kwargs["load_format"] = "dummy"
    if model == "smollm2-135m":
        load_model(model, **kwargs)  # NOTE: converts the GGUF once if the cache is empty
    started = time.perf_counter()
    load_model(model, **kwargs)
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
    load_s = time.perf_counter() - started
    return load_s, 120.0 if dummy else 10.0, f"s to load {model} on {device}"


def grammar_readback() -> tuple[float, float, str]:
    """The longest poll of the background compiler while it reads back a 57 MB grammar (was
    test_grammar_compiler.py: < 0.5 s)."""
    from wire.schema import SamplingParams
    from worker.engine.grammar import Grammars
    from worker.models.aliases import ALIASES
    from worker.models.gguf import ensure_converted

    model_dir = ensure_converted(ALIASES["smollm2-135m"].locate(), name="smollm2-135m")
    schema = SamplingParams(json_schema={"enum": [f"value{i}" for i in range(20000)]})
    grammars = Grammars.in_background(str(model_dir), 49152, [2], timeout_s=120.0)
    try:
        assert grammars.submit("big", schema) is None and grammars.background is not None
        done: list[tuple[str, object]] = []
        longest_s = 0.0
        while not done:
            started = time.perf_counter()
            done += grammars.poll()
            longest_s = max(longest_s, time.perf_counter() - started)
            grammars.background.wait(0.02)
    finally:
        grammars.close()
    return longest_s, 0.5, "s, the longest poll while the grammar was read back"


def grammar_step() -> tuple[float, float, str]:
    """The longest scheduler step while another job's slow grammar compiles (was
    test_grammar_isolation.py: < 0.8 x its 5 s grammar_timeout_s)."""
    from tests.unit.test_grammar_isolation import SLOW_SCHEMA, TIMEOUT_S, _run
    from wire.schema import SamplingParams
    from worker.llm import LLM
    from worker.models.aliases import ALIASES
    from worker.models.gguf import ensure_converted
    from worker.scheduler.messages import GenerateRequest

    model_dir = ensure_converted(ALIASES["smollm2-135m"].locate(), name="smollm2-135m")
    llm = LLM(
        str(model_dir),
        device="cpu",
        attention="torch",
        page_size=16,
        max_seq_len=512,
        grammar_timeout_s=TIMEOUT_S,
    )
    llm.generate("Hello", SamplingParams(max_tokens=2))
    prompt = llm.encode([{"role": "user", "content": "Count from one to fifty in words."}])
    window = _run(
        llm,
        GenerateRequest("plain", prompt, SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)),
        GenerateRequest("slow", prompt, SamplingParams(max_tokens=8, json_schema=SLOW_SCHEMA)),
        GenerateRequest("after", prompt, SamplingParams(max_tokens=8, choice=["yes", "no"])),
    )
    what = f"s, the longest step ({window.decode_tokens} tokens decoded while the grammar compiled)"
    return window.longest_step_s, 0.8 * TIMEOUT_S, what


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("check", choices=["penalties", "model-load", "grammar-readback", "grammar-step"])
    parser.add_argument("--repeat", type=int, default=20, help="penalties: builds timed")
    parser.add_argument("--model", default="smollm2-135m", help="model-load: an alias, folder or config")
    parser.add_argument("--dummy", action="store_true", help="model-load: dummy weights (load_format)")
    parser.add_argument("--device", default="cpu", help="model-load: cpu or cuda")
    args = parser.parse_args()
    if args.check == "penalties":
        figure, bound, what = penalties(args.repeat)
    elif args.check == "model-load":
        figure, bound, what = model_load(args.model, args.dummy, args.device)
    elif args.check == "grammar-readback":
        figure, bound, what = grammar_readback()
    else:
        figure, bound, what = grammar_step()
    print(f"{args.check}: {figure:.3f} {what}; the old test bound: {bound:g}")
    return 0 if figure < bound else 1


if __name__ == "__main__":
    raise SystemExit(main())

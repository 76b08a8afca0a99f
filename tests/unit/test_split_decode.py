"""The split decode path (worker.engine.split) on CPU: a decode pass cut in two halves whose
layers interleave computes what the whole pass computes. On CPU the lanes hold no streams, so
the halves run in turn: this checks the cut (each half's layout, token rows and KV writes, a
second attention backend's plan, the final norm and LM head over the joined rows) against
transformers' greedy tokens and logprobs on the same tiny weights (test_families' oracle), not
its speed; tests/gpu/test_split_decode_gpu.py runs it on green contexts."""

from __future__ import annotations

import pytest
import torch

from tests.family_fixtures import FAMILIES, family_prompts
from tests.unit.test_families import CHUNK, Oracle, assert_matches
from worker.engine.engine import StartupError
from worker.engine.split import Lanes, SplitDecode, halve
from worker.forward import BatchLayout
from worker.llm import LLM

# a MoE family, one with sliding-window layers, pre/post norms and a scaled embedding, and a
# plain dense one
KINDS = ["qwen3_moe", "gemma3", "mistral"]


@pytest.fixture(scope="module", params=KINDS)
def oracle(request, tmp_path_factory) -> Oracle:
    return Oracle(request.param, tmp_path_factory.mktemp(request.param))


def test_split_passes_match_transformers(oracle: Oracle) -> None:
    """Six requests decode as halves of 3 + 3, five as 2 + 3, the second round's two as 1 + 1
    (a radix hit first); every decode pass of two or more requests is split."""
    prompts = family_prompts(seed=3, window=FAMILIES[oracle.kind].window)
    llm = LLM(str(oracle.path), device="cpu", page_size=4, max_prefill_tokens=CHUNK)
    split = SplitDecode(llm.engine.new_attention_backend(), (Lanes(), Lanes()), min_batch=2)
    llm.engine.split = split
    assert_matches(oracle, llm, prompts[:6])
    after_six = split.passes
    assert after_six >= 25  # 31 passes after the prefills, less the steps that ride with a prefill chunk
    assert_matches(oracle, llm, prompts[:5])
    assert_matches(oracle, llm, prompts[6:])
    assert split.passes >= after_six + 50


def test_halves_of_a_layout() -> None:
    layout = BatchLayout(
        torch.tensor([4, 0, 7, 2, 9], dtype=torch.int32),
        torch.tensor([10, 3, 8, 1, 6], dtype=torch.int32),
        torch.ones(5, dtype=torch.int32),
    )
    first, second = halve(layout, 2)
    assert first.slots_cpu.tolist() == [4, 0] and second.slots_cpu.tolist() == [7, 2, 9]
    assert first.seq_lens_cpu.tolist() == [11, 4] and second.seq_lens_cpu.tolist() == [9, 2, 7]
    assert first.is_decode and second.batch_size == 3


def test_split_needs_one_cuda_gpu(tmp_path) -> None:
    from tests.family_fixtures import family_dir

    family_dir("mistral", tmp_path)
    with pytest.raises(StartupError, match=r"decode_split_sms=64 needs one CUDA GPU \(device cpu"):
        LLM(str(tmp_path), device="cpu", decode_split_sms=64)


class FakeStream:
    """Records the waits a Lanes asks of it (CPU: no CUDA streams)."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(f"{self.name} waits {other.name}")


def test_lanes_keep_a_half_in_order(monkeypatch) -> None:
    """A layer on the GEMM lane with its attention nested on the attention lane: the attention
    waits for the QKV projection, the O projection for the attention, the next layer runs on
    without a wait, and the pass joins the current stream at the end."""
    from contextlib import contextmanager

    log: list[str] = []
    main, gemm, attention = (FakeStream(name, log) for name in ("main", "gemm", "attention"))
    current = [main]

    @contextmanager
    def on_stream(stream):
        outer, current[0] = current[0], stream
        try:
            yield
        finally:
            current[0] = outer

    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current[0])
    lanes = Lanes(gemm, attention)

    def kernel(name: str) -> None:
        log.append(f"{name} on {current[0].name}")

    with lanes.on("gemm"):
        kernel("qkv")
        with lanes.on("attention"):
            kernel("attend")
        kernel("o_proj")
    with lanes.on("gemm"):
        kernel("next layer")
    lanes.join()
    assert log == [
        "gemm waits main", "qkv on gemm",
        "attention waits gemm", "attend on attention",
        "gemm waits attention", "o_proj on gemm",
        "next layer on gemm",
        "main waits gemm",
    ]  # fmt: skip

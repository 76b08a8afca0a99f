"""Models, the torch reference backend and the sampler on CUDA (run with -m gpu)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.model_fixtures import PagedRunner, tiny_hf_model  # noqa: E402
from wire.schema import SamplingParams  # noqa: E402
from worker.engine.sampler import Sampler  # noqa: E402
from worker.models.loader import load_model  # noqa: E402
from worker.scheduler.prepare import sampling_tensors  # noqa: E402

pytestmark = pytest.mark.gpu
PROMPTS = [[5, 17, 33, 2, 90, 41, 7], [3, 11], list(range(20, 61))]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny_dir(request, tmp_path_factory):
    # HF's own defaults for tying and head_dim, as the CUDA paths are checked with them.
    defaults = {"llama": {}, "qwen2": {"tie_word_embeddings": False}, "qwen3": {"head_dim": 128}}
    model = tiny_hf_model(request.param, spread=0.05, vocab_size=128, **defaults[request.param])
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return model, path


def test_cuda_fp32_matches_hf_cpu(tiny_dir):
    """Paged prefill + greedy decode on CUDA equals HF on CPU (fp32)."""
    hf, path = tiny_dir
    runner = PagedRunner(load_model(str(path), device="cuda", dtype=torch.float32), page_size=16)
    logits = runner.step([(slot, 0, prompt) for slot, prompt in enumerate(PROMPTS)])
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            expected = hf(torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(logits[i].cpu(), expected, atol=1e-4, rtol=1e-4)
    runner = PagedRunner(load_model(str(path), device="cuda", dtype=torch.float32), page_size=1)
    for prompt, tokens in zip(PROMPTS, runner.greedy(PROMPTS, 6), strict=True):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=6, min_new_tokens=6, do_sample=False)
        assert tokens == out[0, len(prompt) :].tolist()


def test_cuda_bf16_default_close_to_fp32(tiny_dir):
    hf, path = tiny_dir
    loaded = load_model(str(path), device="cuda")
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    logits = PagedRunner(loaded, page_size=16).step([(slot, 0, p) for slot, p in enumerate(PROMPTS)])
    assert logits.dtype == torch.bfloat16  # the model dtype
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            expected = hf(torch.tensor([prompt])).logits[0, -1]
            cosine = torch.nn.functional.cosine_similarity(logits[i].float().cpu(), expected, dim=0)
            assert float(cosine) > 0.99


def test_forward_and_sampler_capture_in_cuda_graph(tiny_dir):
    """No host sync in forward or sample: a CUDA graph captures them and replays to eager results."""
    _, path = tiny_dir
    runner = PagedRunner(load_model(str(path), device="cuda", dtype=torch.bfloat16), page_size=4)
    lens = [len(p) for p in PROMPTS]
    first = runner.step([(slot, 0, p) for slot, p in enumerate(PROMPTS)]).argmax(-1).tolist()
    eager = runner.step([(slot, lens[slot], [first[slot]]) for slot in range(len(PROMPTS))])
    batch = runner.last_batch
    sampling = sampling_tensors(
        [SamplingParams(seed=1, top_p=0.9), SamplingParams(temperature=0.0), SamplingParams(top_k=5)],
        [1, 1, 1],
        "cuda",
    )
    sampler = Sampler()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(2):
            runner.loaded.model(batch)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        logits = runner.loaded.model(batch)
        tokens = sampler.sample(logits, sampling)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(logits, eager)
    assert torch.equal(tokens, sampler.sample(eager, sampling))


def test_sampler_cuda_matches_cpu():
    """The counter-based noise is the same on both devices, so seeded draws agree."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 1000, generator=gen) * 3
    params = [
        SamplingParams(seed=i, temperature=0.8, top_k=(50 if i % 2 else -1), min_p=0.01 * (i % 3))
        for i in range(16)
    ]
    steps = list(range(16))
    cpu = Sampler().sample(logits, sampling_tensors(params, steps, "cpu"))
    gpu = Sampler().sample(logits.cuda(), sampling_tensors(params, steps, "cuda"))
    assert gpu.dtype == torch.int32 and gpu.device.type == "cuda"
    assert torch.equal(cpu, gpu.cpu())


@pytest.mark.parametrize("name", ["qwen3-0.6b", "llama-3.1-8b"])
def test_dummy_real_size_loads_and_runs(name):
    """Dummy weights at real size load and run one prefill + decode pass on the GPU (the load
    time is printed; `python benchmarks/speed_checks.py model-load` measures it on purpose)."""
    start_s = time.monotonic()
    loaded = load_model(str(REPO / "configs" / f"{name}.json"), load_format="dummy", device="cuda")
    torch.cuda.synchronize()
    load_s = time.monotonic() - start_s
    print(f"{name}: dummy load {load_s:.1f}s")
    runner = PagedRunner(loaded, page_size=16, max_reqs=2, max_len=512)
    logits = runner.step([(0, 0, list(range(1, 500))), (1, 0, [7])])
    logits = runner.step([(0, 499, [3]), (1, 1, [4])])
    assert logits.shape == (2, loaded.config.vocab_size) and bool(torch.isfinite(logits).all())
    del loaded, runner
    torch.cuda.empty_cache()

"""Weight loading paths: sharded safetensors, the GGUF conversion cache, aliases."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.model_fixtures import PagedRunner, tiny_hf_model  # noqa: E402
from worker.models import gguf
from worker.models.aliases import ALIASES, cache_root  # noqa: E402
from worker.models.loader import load_model  # noqa: E402


def test_sharded_safetensors_match_hf(tmp_path):
    """A checkpoint split over several shards loads completely and gives HF's logits."""
    hf = tiny_hf_model(
        "qwen3",
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    loaded = load_model(str(tmp_path))
    prompt = [4, 8, 15, 16, 23, 42]
    logits = PagedRunner(loaded, page_size=2).step([(0, 0, prompt)])
    with torch.no_grad():
        torch.testing.assert_close(logits[0], hf(torch.tensor([prompt])).logits[0, -1], atol=2e-5, rtol=1e-5)


def _fake_convert(calls: list[int], barrier: threading.Barrier | None):
    def convert(gguf_path: Path, out_dir: Path) -> None:
        calls.append(1)
        if barrier is not None:
            barrier.wait(timeout=10)
        (out_dir / "config.json").write_text("{}")
        (out_dir / gguf.COMPLETE_MARKER).write_text("{}")

    return convert


def test_conversion_is_cached_and_atomic(tmp_path, monkeypatch):
    """Concurrent first conversions leave one complete directory and no temporary ones;
    later calls reuse it without converting."""
    cache = tmp_path / "cache"
    assert cache_root(cache) == cache
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    calls: list[int] = []
    monkeypatch.setattr(gguf, "_convert", _fake_convert(calls, threading.Barrier(2)))
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(gguf.ensure_converted(source, "m", cache)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [tmp_path / "cache" / "m"] * 2 and len(calls) == 2
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["m"]
    monkeypatch.setattr(gguf, "_convert", _fake_convert(calls, None))
    assert gguf.ensure_converted(source, "m", cache) == tmp_path / "cache" / "m"
    assert len(calls) == 2
    unnamed = gguf.ensure_converted(source, cache_dir=cache)
    assert unnamed.parent == tmp_path / "cache" and unnamed.name.startswith("model-")


def test_alias_and_missing_gguf():
    assert ALIASES["smollm2-135m"].locate().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        gguf.ensure_converted("/nonexistent/x.gguf")

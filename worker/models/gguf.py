"""GGUF -> Hugging Face safetensors directory, converted once and cached.

Dequantising a GGUF through transformers takes tens of seconds; the cached directory
(config.json, generation_config.json, model.safetensors, tokenizer files) loads in a few.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from worker.models.aliases import cache_root

log = logging.getLogger(__name__)

COMPLETE_MARKER = "radixq_converted.json"


def cache_dir_for(gguf_path: Path, name: str | None = None, cache_dir: str | Path | None = None) -> Path:
    """The cache directory of a GGUF file: ``<cache_root>/<name>``, or stem + content key."""
    if name is None:
        stat = gguf_path.stat()
        key = hashlib.sha1(f"{gguf_path.resolve()}:{stat.st_size}".encode()).hexdigest()[:10]
        name = f"{gguf_path.stem}-{key}"
    return cache_root(cache_dir) / name


def ensure_converted(
    gguf_path: str | Path, name: str | None = None, cache_dir: str | Path | None = None
) -> Path:
    """Return the cached HF directory for ``gguf_path``, converting it first if needed.

    NOTE: the directory is written under a temporary name and renamed into place, so a
    concurrent worker sees either no directory or a complete one; the loser of the race
    discards its copy.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    out_dir = cache_dir_for(gguf_path, name, cache_dir)
    if (out_dir / COMPLETE_MARKER).is_file():
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        log.info("converting %s to %s (one-off)", gguf_path, out_dir)
        _convert(gguf_path, tmp_dir)
        try:
            os.rename(tmp_dir, out_dir)
        except OSError:
            if not (out_dir / COMPLETE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir


def _convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, filename = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=filename, dtype=torch.float32)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config["architectures"] = [type(model).__name__]
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    model.generation_config.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / COMPLETE_MARKER).write_text(json.dumps({"source": str(gguf_path.resolve())}))

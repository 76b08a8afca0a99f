"""A newcomer's path with a model of a new family: `radixq run prompts.jsonl --model DIR` on
CPU, DIR a tiny Gemma 3 (the image-text checkpoint form) or Qwen3-MoE directory with its own
chat template (tests/family_fixtures.py). Chat rows are rendered by that template and the
greedy tokens are transformers' on the rendered ids; a plain prompt runs beside them; an
image part is that row's error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.family_fixtures import family_dir
from tests.integration.procs import radixq
from tests.unit.test_families import greedy_rows

pytestmark = pytest.mark.integration
MAX_TOKENS = 6


def run_on_cpu(source: Path, out: Path, model_dir: Path):
    """`radixq run SOURCE -o OUT --model DIR` on the CPU, as a newcomer types it."""
    return radixq(
        "run",
        str(source),
        "-o",
        str(out),
        "--model",
        str(model_dir),
        "--device",
        "cpu",
        "--timeout",
        "200",
        timeout_s=300,
    )


@pytest.mark.parametrize("kind", ["gemma3", "qwen3_moe"])
def test_run_a_family_directory_with_its_chat_template(kind: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    model_dir = tmp_path / kind
    hf = family_dir(kind, model_dir)
    chats = [
        [{"role": "user", "content": "Write a haiku about the sea."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}],
    ]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///x.png"}}]}]
    rows = [{"id": f"chat{i}", "messages": m} for i, m in enumerate(chats)]
    rows += [{"id": "plain", "prompt": "Once upon a time"}, {"id": "image", "messages": image}]
    source = tmp_path / "prompts.jsonl"
    source.write_text(
        "".join(json.dumps({**r, "max_tokens": MAX_TOKENS, "temperature": 0.0}) + "\n" for r in rows)
    )
    out = tmp_path / "out.jsonl"
    done = run_on_cpu(source, out, model_dir)
    assert done.returncode == 1, done.stderr[-3000:]  # the image row is an error row
    got = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert list(got) == [r["id"] for r in rows]
    assert "content parts (images, audio) are not supported" in got["image"]["error"]["message"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = hf.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    for i, messages in enumerate(chats):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        want, _ = greedy_rows(hf, ids, MAX_TOKENS)
        cut = next((j for j, t in enumerate(want) if t in eos), len(want))  # stops at EOS, excluded
        choice = got[f"chat{i}"]["choices"][0]
        assert got[f"chat{i}"]["error"] is None and choice["token_ids"] == want[:cut]
        assert got[f"chat{i}"]["usage"]["prompt_tokens"] == len(ids)
    assert got["plain"]["error"] is None and got["plain"]["choices"][0]["token_ids"]


def test_run_a_compressed_tensors_fp8_directory(tmp_path: Path) -> None:
    """`radixq run --model DIR` on a Qwen3-MoE checkpoint published in FP8 (compressed-tensors
    per channel, written by tests/fp8_checkpoints.py): it runs in FP8 with no setting (the
    default quantization "auto"), experts included, and its greedy tokens are transformers'
    on the dequantized weights with per-token activation rounding."""
    import shutil

    from transformers import AutoTokenizer

    from tests.fp8_checkpoints import write_fp8_checkpoint
    from tests.unit.test_families import fp8_oracle

    original, model_dir = tmp_path / "original", tmp_path / "fp8"
    family_dir("qwen3_moe", original)
    shutil.copytree(original, model_dir)
    write_fp8_checkpoint(model_dir, "channel")
    chats = [[{"role": "user", "content": "Write a haiku about the sea."}]]
    source = tmp_path / "prompts.jsonl"
    source.write_text(
        json.dumps({"id": "c", "messages": chats[0], "max_tokens": MAX_TOKENS, "temperature": 0}) + "\n"
    )
    out = tmp_path / "out.jsonl"
    done = run_on_cpu(source, out, model_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "12 projections in FP8, published compressed-tensors channel" in done.stderr  # the worker's log
    (row,) = map(json.loads, out.read_text().splitlines())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = tokenizer.apply_chat_template(chats[0], tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    oracle = fp8_oracle(original)
    want, _ = greedy_rows(oracle, ids, MAX_TOKENS)
    eos = oracle.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    cut = next((j for j, t in enumerate(want) if t in eos), len(want))
    assert row["error"] is None and row["choices"][0]["token_ids"] == want[:cut]

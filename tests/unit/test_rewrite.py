"""Whole-file rewrites of an output file: into input order, error rows split off (--errors).
The oracle is the rows as the test wrote them, compared line for line."""

from __future__ import annotations

import json
from pathlib import Path

from producer.input_rows import Rejected
from producer.rewrite import put_in_order, split_errors


def row(job_id: str, error: str | None = None) -> str:
    err = {"code": error, "message": f"{job_id} failed"} if error else None
    return (
        json.dumps({"id": job_id, "choices": [], "usage": {}, "metadata": {"n": job_id}, "error": err}) + "\n"
    )


def test_rows_are_put_in_order_and_others_kept_after(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text(row("a") + row("d") + row("x") + row("b") + row("c") + row("y"))
    assert put_in_order(out, ["a", "b", "c", "d"])
    assert out.read_text() == row("a") + row("b") + row("c") + row("d") + row("x") + row("y")
    before = out.stat().st_mtime_ns, out.stat().st_ino
    assert not put_in_order(out, ["a", "b", "c", "d"])  # already in order: not rewritten
    assert (out.stat().st_mtime_ns, out.stat().st_ino) == before


def test_error_rows_move_to_the_errors_file_in_input_order(tmp_path: Path) -> None:
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    order = ["a", "r", "b", "c", "d"]
    rejected = [Rejected(2, "prompt: must be non-empty", "r")]
    out.write_text(row("a") + row("c", "internal") + row("b"))
    errors.write_text(row("d", "prompt_too_long") + row("b", "internal"))  # an earlier run's; b ran since
    assert split_errors(out, errors, rejected, order) == 1
    assert out.read_text() == row("a") + row("b")
    kept = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [(line["id"], line["error"]["code"]) for line in kept] == [
        ("r", "invalid_job"),
        ("c", "internal"),
        ("d", "prompt_too_long"),
    ]
    assert "line 2: prompt: must be non-empty" in kept[0]["error"]["message"]
    assert split_errors(out, errors, rejected, order) == 0  # again: the same files
    assert [json.loads(line)["id"] for line in errors.read_text().splitlines()] == ["r", "c", "d"]

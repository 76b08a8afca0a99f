"""The spill on its own: what ``settle`` makes of one left by a collect that stopped anywhere."""

from __future__ import annotations

import json
from pathlib import Path

from producer.outfile import OutputFile
from producer.spill import Spill, SpillRow, spill_path
from tests.integration.results import spilled


def line(job_id: str, text: str) -> bytes:
    return json.dumps({"id": job_id, "text": text, "error": None}).encode() + b"\n"


def test_settle_drops_what_was_appended_and_applies_replacements(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(line("a", "old a") + line("b", "b") + line("c", "c"))
    with Spill(spill_path(out)) as spill:  # as a collect killed mid-way left it
        spill.put(
            [
                SpillRow("b", line("b", "b"), None, None, False),  # appended, then the crash
                SpillRow("d", line("d", "d"), None, None, False),  # waits behind a missing id
                SpillRow("a", line("a", "new a"), None, None, True),  # replaced, then the crash
                SpillRow("e", line("e", "e"), None, None, True),  # its old row went meanwhile
            ]
        )
    with OutputFile(out) as output, Spill(spill_path(out)) as spill:
        assert spill.settle(output) == 1
        assert spill.ids == {"d", "e"}
    assert [json.loads(row)["text"] for row in out.read_text().splitlines()] == ["new a", "b", "c"]
    assert spilled(out) == ["d", "e"]
    with OutputFile(out) as output, Spill(spill_path(out)) as spill:
        assert spill.settle(output) == 0  # settling again changes nothing
    assert spilled(out) == ["d", "e"] and len(out.read_text().splitlines()) == 3


def test_an_empty_spill_leaves_no_file(tmp_path: Path) -> None:
    path = spill_path(tmp_path / "out.jsonl")
    with Spill(path) as spill:
        spill.put([SpillRow("a", line("a", "a"), None, None, False)])
        spill.commit()
        spill.drop(["a"])
    assert not path.exists() and not Path(f"{path}-wal").exists()

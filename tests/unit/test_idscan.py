"""The ids a JSONL file names, read without validating it (producer.idscan), and the check
enqueue makes with them before it reads the file a second time."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import fakeredis
import pytest

from producer.cli import holds_no_known_id
from producer.client import Client
from producer.datasets import NATIVE_COLUMNS, ColumnMapping
from producer.idscan import Unreadable, named_ids
from wire.schema import Job

LINES = [
    json.dumps({"id": "a", "prompt": "x"}),
    json.dumps({"prompt": "no id: derived from the line"}),
    "",
    json.dumps({"custom_id": "req-1", "method": "POST", "url": "/v1/chat/completions", "body": {}}),
    json.dumps({"id": 7, "prompt": "not a string id: the row gets a derived one"}),
    json.dumps({"id": "b", "prompt": "y", "metadata": {"deep": [[[["z"]]]]}}),
]


def write(path: Path, lines: list[str], *, compress: bool = False) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


@pytest.mark.parametrize("compress", [False, True])
def test_the_named_ids_in_line_order(tmp_path: Path, compress: bool) -> None:
    source = write(tmp_path / "in.jsonl", LINES, compress=compress)
    with source.open("ab") as out:
        if not compress:
            out.write(b'{"id": "\xff"}\n')  # not UTF-8: a rejected row, with a derived id
    assert list(named_ids(source)) == ["a", "req-1", "b"]


def test_a_line_that_is_not_an_object_leaves_it_to_the_full_check(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", [LINES[0], "[1, 2]"])
    with pytest.raises(Unreadable):
        list(named_ids(source))


def test_the_full_check_is_needed_only_when_the_queue_knows_a_named_id(
    fake_redis: fakeredis.FakeRedis, tmp_path: Path
) -> None:
    source = write(tmp_path / "in.jsonl", LINES)
    client = Client(fake_redis)
    assert holds_no_known_id(client, source, NATIVE_COLUMNS)  # a new queue
    client.enqueue([Job(id="other", prompt="x")])
    assert holds_no_known_id(client, source, NATIVE_COLUMNS)
    client.enqueue([Job(id="req-1", prompt="x")])
    assert not holds_no_known_id(client, source, NATIVE_COLUMNS)
    fresh = Client(fakeredis.FakeRedis(), "fresh")
    assert not holds_no_known_id(fresh, source, ColumnMapping(id_column="key"))  # ids from a column
    assert not holds_no_known_id(fresh, write(tmp_path / "bad.jsonl", ["[]"]), NATIVE_COLUMNS)

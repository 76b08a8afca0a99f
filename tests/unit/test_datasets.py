"""Dataset files in (Parquet, CSV, JSONL/JSONL.gz with a column mapping) and Parquet out.

The expected jobs are built independently in each test (Python's own str.format for the
template, the records as written); files are written with pyarrow / the csv module.
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from producer.datasets import ColumnMapping, input_columns, read_input
from producer.input_rows import Rejected
from producer.jsonl import read_jobs
from producer.output_lines import output_line, output_record
from producer.tables import RESULT_COLUMNS, write_parquet
from wire.schema import Choice, Job, Result, Usage

RECORDS = [
    {"qid": 7, "question": "What is 2+2?", "topic": "math"},
    {"qid": 8, "question": None, "topic": "empty"},
    {"qid": 9, "question": "Capital of France?", "topic": "geo"},
]
TEMPLATE = "Topic: {topic}\nQ: {question}\nA:"


def write_parquet_records(path: Path, records: list[dict]) -> None:  # type: ignore[type-arg]
    pq.write_table(pa.Table.from_pylist(records), path)


def test_parquet_with_template_and_id_column(tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    write_parquet_records(source, RECORDS)
    parsed = read_input(source, ColumnMapping(id_column="qid", template=TEMPLATE))
    assert [job.id for job in parsed.jobs] == ["7", "9"]
    assert [job.prompt for job in parsed.jobs] == [
        TEMPLATE.format(**RECORDS[0]),
        TEMPLATE.format(**RECORDS[2]),
    ]
    (rejected,) = parsed.rejected
    # A row that cannot be a job keeps its place, its row number and its own id.
    assert (rejected.line_no, rejected.job_id, rejected.unit) == (2, "8", "row")
    assert "question" in rejected.reason and "empty" in rejected.reason
    assert [row.id if isinstance(row, Job) else row.job_id for row in parsed.rows] == ["7", "8", "9"]


def test_prompt_column_and_derived_ids_are_deterministic(tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    write_parquet_records(source, [r for r in RECORDS if r["question"]])
    first = read_input(source, ColumnMapping(prompt_column="question"))
    again = read_input(source, ColumnMapping(prompt_column="question"))
    assert [job.prompt for job in first.jobs] == ["What is 2+2?", "Capital of France?"]
    assert [job.id for job in first.jobs] == [job.id for job in again.jobs]
    assert len({job.id for job in first.jobs}) == 2 and all(job.id.startswith("L") for job in first.jobs)


def test_native_columns_and_sampling_columns(tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    rows = [
        {"id": "a", "prompt": "x", "max_tokens": 5, "temperature": 0.0, "note": "kept for joins"},
        {"id": "b", "prompt": "y", "max_tokens": -3, "temperature": 0.0, "note": ""},
    ]
    write_parquet_records(source, rows)
    parsed = read_input(source)
    (job,) = parsed.jobs
    assert (job.id, job.prompt, job.sampling.max_tokens, job.sampling.temperature) == ("a", "x", 5, 0.0)
    (rejected,) = parsed.rejected
    assert rejected.job_id == "b" and "max_tokens" in rejected.reason


def test_csv_cells_are_text_until_the_job_converts_them(tmp_path: Path) -> None:
    source = tmp_path / "in.csv"
    with open(source, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["key", "messages", "max_tokens"])
        writer.writerow(["007", json.dumps([{"role": "user", "content": "hi, there"}]), "16"])
        writer.writerow(["008", "not json", "16"])
        writer.writerow(["009", "", "4"])
    parsed = read_input(source, ColumnMapping(messages_column="messages", id_column="key"))
    (job,) = parsed.jobs
    assert job.id == "007" and job.sampling.max_tokens == 16
    assert job.messages is not None and job.messages[0].content == "hi, there"
    assert [(r.line_no, r.job_id) for r in parsed.rejected] == [(2, "008"), (3, "009")]
    assert "not valid JSON" in parsed.rejected[0].reason and "empty" in parsed.rejected[1].reason


def test_jsonl_gz_with_a_mapping_and_an_unknown_template_column(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl.gz"
    lines = [{"q": "one"}, {"q": "two"}]
    source.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in lines).encode() + b"{broken\n"))
    parsed = read_input(source, ColumnMapping(template="Q: {q}"))
    assert [job.prompt for job in parsed.jobs] == ["Q: one", "Q: two"]
    assert [(r.line_no, r.unit) for r in parsed.rejected] == [(3, "line")]
    bad = read_input(source, ColumnMapping(template="Q: {question}"))
    assert not bad.jobs and all("names no column" in r.reason for r in bad.rejected[:2])


def test_conflicting_mapping_is_refused() -> None:
    with pytest.raises(ValueError, match="one of"):
        read_input("x.parquet", ColumnMapping(prompt_column="a", template="{b}"))


def test_a_rejected_openai_line_keeps_its_custom_id_and_format(tmp_path: Path) -> None:
    source = tmp_path / "batch.jsonl"
    good = {"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}}
    bad = {"custom_id": "r2", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p", "n": 0}}
    source.write_text(
        json.dumps(good) + "\n" + json.dumps(bad) + "\n" + '{"custom_id": 5}\n' + json.dumps(good) + "\n"
    )
    parsed = read_jobs(source)
    first, second, duplicate = parsed.rejected
    assert isinstance(first, Rejected) and (first.job_id, first.openai_url) == ("r2", "/v1/completions")
    record = output_record(first.error_result())
    assert record["custom_id"] == "r2" and record["response"] is None
    assert record["error"]["code"] == "invalid_job" and record["error"]["message"].startswith("line 2: ")
    # custom_id itself is the error: the row gets a derived id, still in the OpenAI shape, its
    # custom_id null (it gave none that could be read) and the row known by its id.
    unnamed = output_record(second.error_result())
    assert second.job_id.startswith("L3-") and (unnamed["custom_id"], unnamed["id"]) == (None, second.job_id)


def result_for(job_id: str, text: str) -> Result:
    choice = Choice(index=0, text=text, token_ids=[1, 2], finish_reason="stop")
    return Result(id=job_id, choices=[choice], usage=Usage(prompt_tokens=3, completion_tokens=2))


def test_parquet_output_joined_to_the_input_round_trips(tmp_path: Path) -> None:
    source = tmp_path / "in.parquet"
    write_parquet_records(source, RECORDS)
    mapping = ColumnMapping(id_column="qid", template=TEMPLATE)
    parsed = read_input(source, mapping)
    rows_file = tmp_path / "out.parquet.rows.jsonl"
    with open(rows_file, "wb") as out:
        out.write(output_line(result_for("9", "Paris")))  # out of input order on purpose
        out.write(output_line(parsed.rejected[0].error_result()))
        out.write(output_line(result_for("7", "4")))
    out_path = tmp_path / "out.parquet"
    assert write_parquet(rows_file, out_path, input_columns(source, parsed)) == 3
    table = pq.read_table(out_path).to_pylist()
    for row, record in zip(table, RECORDS, strict=True):
        assert {k: row[k] for k in record} == record  # the input's columns, in input order
        assert row["id"] == str(record["qid"])
    assert [row["text"] for row in table] == ["4", None, "Paris"]
    assert [row["error"] for row in table] == [None, "invalid_job", None]
    assert table[0]["prompt_tokens"] == 3 and table[0]["texts"] == ["4"]
    plain = tmp_path / "plain.parquet"
    write_parquet(rows_file, plain)
    assert pq.read_table(plain).column_names == list(RESULT_COLUMNS)
    assert [row["id"] for row in pq.read_table(plain).to_pylist()] == ["9", "8", "7"]


def test_openai_rows_become_the_same_columns(tmp_path: Path) -> None:
    job = msgspec.json.encode(
        {
            "custom_id": "c1",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "hi"}]},
        }
    )
    source = tmp_path / "b.jsonl"
    source.write_bytes(job + b"\n")
    (parsed,) = read_jobs(source).jobs
    result = result_for("c1", "hello")
    result = msgspec.structs.replace(result, metadata=parsed.metadata)
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_bytes(output_line(result))
    write_parquet(rows_file, tmp_path / "o.parquet")
    (row,) = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert (row["id"], row["text"], row["finish_reason"], row["completion_tokens"]) == (
        "c1",
        "hello",
        "stop",
        2,
    )


def test_a_joined_column_of_mixed_types_is_written_as_text(tmp_path: Path) -> None:
    """A JSONL column holding 1, "two", an object and nothing has no one Arrow type: it is
    written as text (JSON text for non-strings, null kept); the other columns keep theirs."""
    source = tmp_path / "in.jsonl"
    rows = [{"q": "a", "x": 1}, {"q": "b", "x": "two"}, {"q": "c"}, {"q": "d", "x": {"k": [1]}}]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    parsed = read_input(source, ColumnMapping(prompt_column="q"))
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_bytes(b"".join(output_line(result_for(job.id, "t")) for job in parsed.jobs))
    write_parquet(rows_file, tmp_path / "o.parquet", input_columns(source, parsed))
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.column("x").to_pylist() == ["1", "two", None, json.dumps({"k": [1]})]
    assert table.schema.field("x").type == pa.string()
    assert table.column("q").to_pylist() == ["a", "b", "c", "d"]
    assert table.column("completion_tokens").type == pa.int64()


def test_a_template_that_fails_on_one_row_rejects_that_row_only(tmp_path: Path) -> None:
    """JSONL rows may hold any type per row: a format spec that one row's value cannot take
    (a list given a format code: TypeError) rejects that row naming the template, and the
    other rows become jobs. An empty value is named as its column, not as a bad template."""
    path = tmp_path / "rows.jsonl"
    rows = [{"q": "first", "n": 1}, {"q": "second", "n": [2]}, {"q": "third", "n": None}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    parsed = read_input(path, ColumnMapping(template="Q: {q} #{n:d}"))
    texts = [str(row) for row in parsed.rows]
    assert parsed.rows[0].prompt == "Q: first #1"  # type: ignore[union-attr]
    assert "2: template" in texts[1] and "list" in texts[1]
    assert "3: n: is empty in this row" in texts[2]
    assert len(parsed.jobs) == 1


def test_template_fields_name_columns_verbatim(tmp_path: Path) -> None:
    """A column whose name holds a dot (flattened Parquet structs) is a template field as
    written; no attribute of a value is reachable through a template."""
    path = tmp_path / "dotted.parquet"
    pq.write_table(pa.table({"user.name": ["ada"], "q": ["hi"]}), path)
    parsed = read_input(path, ColumnMapping(template="{user.name} asks: {q}"))
    assert parsed.rows[0].prompt == "ada asks: hi"  # type: ignore[union-attr]
    parsed = read_input(path, ColumnMapping(template="{q.__class__}"))
    assert "names no column" in str(parsed.rows[0])


def test_a_csv_cell_that_is_not_utf8_rejects_its_row_only(tmp_path: Path) -> None:
    """One byte that is not UTF-8 in one cell rejects that row naming the column (the file is
    otherwise read, every row in its place); before, Arrow refused the whole file."""
    path = tmp_path / "mixed.csv"
    path.write_bytes(b"id,prompt,max_tokens\na,hello,4\nb,caf\xe9,4\nc,world,4\n")
    parsed = read_input(path)
    assert [type(row).__name__ for row in parsed.rows] == ["Job", "Rejected", "Job"]
    assert [job.prompt for job in parsed.jobs] == ["hello", "world"]
    rejected = parsed.rejected[0]
    assert rejected.line_no == 2 and "prompt" in rejected.reason and "UTF-8" in rejected.reason
    columns = input_columns(path, parsed)
    assert columns[0] == ("a", {"id": "a", "prompt": "hello", "max_tokens": "4"}) and columns[1][1] == {}


def test_an_empty_or_blank_template_value_rejects_its_row(tmp_path: Path) -> None:
    """docs/guide.md "Running a dataset job": a row with an empty `question` is an invalid_job row,
    whether the cell is missing, null, "" or only spaces."""
    path = tmp_path / "rows.jsonl"
    rows = [{"q": "fine"}, {"q": ""}, {"q": "   "}, {"q": None}, {}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    parsed = read_input(path, ColumnMapping(template="Q: {q}\nA:"))
    assert [type(row).__name__ for row in parsed.rows] == [
        "Job",
        "Rejected",
        "Rejected",
        "Rejected",
        "Rejected",
    ]
    assert [("empty in this row" in str(row), "names no column" in str(row)) for row in parsed.rejected] == [
        (True, False),
        (True, False),
        (True, False),
        (False, True),
    ]


def test_the_cli_template_reads_shell_escapes() -> None:
    """A shell's double quotes keep \\n as two characters; the guide's
    --template "Topic: {topic}\\nQ: {question}\\nA:" means newlines."""
    from producer.cli import column_mapping

    typed = r"Topic: {topic}\nQ: {question}\tA: \\n \x"
    mapping = column_mapping(None, None, None, typed)
    assert mapping.template == "Topic: {topic}\nQ: {question}\tA: \\n \\x"
    assert column_mapping(None, None, None, None).template is None


def test_a_ragged_csv_row_rejects_that_row_only(tmp_path: Path) -> None:
    """A row with more cells than the header, and one with fewer, are those rows' errors
    (their number and both counts named); the other rows, blank lines and a quoted newline
    around them, keep their places. Before, the whole file was refused ("Expected 2 columns,
    got 4")."""
    path = tmp_path / "ragged.csv"
    path.write_text('id,prompt\na,hello\n\nb,world,extra,cells\n"c","two\nlines"\nd\ne,fine\n')
    parsed = read_input(path)
    assert [type(row).__name__ for row in parsed.rows] == ["Job", "Rejected", "Job", "Rejected", "Job"]
    assert [job.id for job in parsed.jobs] == ["a", "c", "e"] and parsed.jobs[1].prompt == "two\nlines"
    too_many, too_few = parsed.rejected
    assert (too_many.line_no, too_few.line_no) == (2, 4)
    assert too_many.reason == "csv: has 4 cells, the header has 2"
    assert too_few.reason == "csv: has 1 cell, the header has 2"
    assert too_many.error_result().error.code == "invalid_job"  # type: ignore[union-attr]
    columns = input_columns(path, parsed)
    assert [job_id for job_id, _ in columns][::2] == ["a", "c", "e"] and columns[1][1] == {}

"""What the client commands share beside their options: the input, output and errors files
staged, the rows read, the client opened, one-line errors (an expected failure is one
``error:`` line and an exit code, never a traceback)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from wire import exits
from wire.exits import fail
from wire.keys import DEFAULT_REDIS_URL

if TYPE_CHECKING:
    from producer.client import Client
    from producer.datasets import ColumnMapping
    from producer.input_rows import InputFile
    from wire.schema import Job, Result


def column_mapping(
    prompt_column: str | None, messages_column: str | None, id_column: str | None, template: str | None
) -> ColumnMapping:
    from producer.datasets import ColumnMapping, unescape_template

    if template is not None:
        template = unescape_template(template)
    mapping = ColumnMapping(prompt_column, messages_column, id_column, template)
    try:
        mapping.check()
    except ValueError as exc:
        fail(str(exc), exits.USAGE)
    return mapping


@contextmanager
def staged(
    source: str | None, output: str | None = None, errors: str | None = None
) -> Iterator[tuple[Path | None, Path | None, Path | None]]:
    """Local paths for an input file, an output file and an errors file, each a path or a
    URL (producer.remote: a URL is downloaded first, an output uploaded when the block ends);
    a local input must be a file. One ``error:`` line and exit 2 for what cannot be."""
    from producer.remote import RemoteError, is_url, local_input, local_output
    from producer.tables import is_parquet

    if source is not None and not is_url(source):
        path = Path(source)
        if not path.exists() or path.is_dir():
            fail(
                f"{source}: {'is a folder, not an input file' if path.is_dir() else 'no such file'}",
                exits.USAGE,
            )
    # NOTE: the spill (producer.spill) resumes a collect as much as the rows do
    companions = (
        (".rows.jsonl", ".rows.jsonl.spill") if output is not None and is_parquet(output) else (".spill",)
    )
    try:
        with (
            local_input(source) as local,
            local_output(output, companions) as out,
            local_output(errors) as err,
        ):
            yield local, out, err
    except RemoteError as exc:
        fail(str(exc), exits.USAGE)


def load_input(path: Path, mapping: ColumnMapping) -> InputFile:
    """Every row of a dataset file, or one ``error:`` line and exit 2 when it cannot be read."""
    from producer.datasets import read_input

    try:
        return read_input(path, mapping)
    except OSError as exc:
        fail(f"{path}: {exc.strerror or exc}", exits.USAGE)
    except ValueError as exc:  # pyarrow: not a Parquet/CSV file, or a damaged one
        fail(f"cannot read {path}: {exc}", exits.USAGE)


def queued_rows(
    path: Path,
    mapping: ColumnMapping,
    parsed: InputFile,
    errors: Path | None,
    *,
    say: bool = True,
    shown: str | None = None,
) -> Iterator[Job | Result]:
    """What enqueue puts in the queue, in input order, as the file is read: the jobs, and the
    rejected rows (each said on stderr, unless ``say`` is false, as ``shown`` or the path) as
    ``invalid_job`` results unless they go to the ``errors`` file. The file is opened, and its
    first row read, before this returns: a file that cannot be read fails here (one ``error:``
    line), before Redis is touched."""
    import itertools

    from producer.datasets import iter_input
    from producer.input_rows import Rejected

    def rows() -> Iterator[Job | Result]:
        try:
            for row in iter_input(path, mapping, parsed):
                if isinstance(row, Rejected):
                    if say:
                        warn(f"rejected {shown or path}:{row}")
                    if errors is None:
                        yield row.error_result()
                    continue
                yield row
        except OSError as exc:
            fail(f"{path}: {exc.strerror or exc}", exits.USAGE)
        except ValueError as exc:  # pyarrow: not a Parquet/CSV file, or a damaged one
            fail(f"cannot read {path}: {exc}", exits.USAGE)

    stream = rows()
    first = list(itertools.islice(stream, 1))
    return itertools.chain(first, stream)


def write_table(rows_file: Path, output: Path, join_input: Path | None, mapping: ColumnMapping) -> None:
    """Write the Parquet output from its JSONL rows, joined to ``join_input``'s rows if given."""
    from producer.datasets import input_columns
    from producer.tables import write_parquet

    inputs = input_columns(join_input, load_input(join_input, mapping)) if join_input is not None else None
    write_parquet(rows_file, output, inputs)


def resolve_redis_url(url: str | None) -> str:
    return url or DEFAULT_REDIS_URL


def counted(count: int, noun: str = "job") -> str:
    """``count`` and the noun in the number it takes: "1 job", "2 jobs", "1 row", "3 rows"."""
    return f"{count} {noun}" + ("" if count == 1 else "s")


def warn(line: str) -> None:
    typer.echo(line, err=True)


@contextmanager
def expected_errors(url: str) -> Iterator[None]:
    """Expected failures as one line on stderr and exit code 2, never a traceback."""
    import redis

    from producer.client import UnknownQueueError
    from producer.outfile import OutputFileError, os_error_line
    from producer.outlock import OutputBusy
    from wire.redis_errors import describe
    from wire.retry import RedisUnavailable
    from wire.routing import RoutingCorrupt

    try:
        yield
    except (UnknownQueueError, OutputFileError, OutputBusy, RoutingCorrupt) as exc:
        fail(str(exc), exits.USAGE)
    except RedisUnavailable as exc:
        fail(
            describe(exc.cause, url) + (f" (unavailable for {exc.waited_s:.0f} s)" if exc.waited_s else ""),
            exits.USAGE,
        )
    except redis.RedisError as exc:
        fail(describe(exc, url), exits.USAGE)
    except OSError as exc:
        fail(os_error_line(exc), exits.USAGE)


def open_client(url: str, queue: str, **options: Any) -> Client:
    from producer.client import Client

    try:
        return Client.from_url(url, queue, **options)
    except ValueError as exc:  # a malformed URL
        from wire.redis_errors import redact

        fail(f"--redis-url {redact(url)!r}: {exc}", exits.USAGE)


def holds_no_known_id(client: Client, source: Path, mapping: ColumnMapping) -> bool:
    """True when a JSONL file (native columns) names no id the queue holds a digest for: then
    no row can have changed (producer.idscan), and the full check's pass over the file is not
    needed. False when it names one, or when this cannot tell."""
    from producer.datasets import file_format
    from producer.idscan import Unreadable, named_ids

    if mapping.given or file_format(source) != "jsonl":
        return False
    try:
        return not client.knows_any(named_ids(source))
    except (Unreadable, OSError):
        return False


def checked_tag(tag: str) -> str:
    from producer.tags import check_tag

    try:
        return check_tag(tag)
    except ValueError as exc:
        fail(f"--tag: {exc}", exits.USAGE)

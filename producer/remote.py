"""Input and output files by URL: ``https://``, ``s3://``, ``gs://`` or any fsspec filesystem.

radixq reads and writes local files (it resumes, fsyncs and replaces rows in place), so a URL
is staged in a private folder: an input is downloaded before it is read; an output is
downloaded first when it exists (that is what resumes) and uploaded back when the command
ends, stopped early or not, together with its companion ``OUT.parquet.rows.jsonl`` for a
Parquet output. The remote copy is the durable one; the folder goes when the command ends.

Credentials and endpoints come from each filesystem's own environment (``AWS_*`` and
``AWS_ENDPOINT_URL`` for s3fs, ``GOOGLE_APPLICATION_CREDENTIALS`` for gcsfs); an ``http(s)``
output is written with a PUT. Failures are RemoteError, one line naming the URL.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

_CHUNK = 1 << 20


class RemoteError(Exception):
    """A URL that cannot be read or written; ``str()`` is the one line to show."""


def is_url(name: str | Path) -> bool:
    """A ``scheme://`` name other than ``file://`` (a local path stays a path)."""
    text = str(name)
    scheme = urlsplit(text).scheme
    return "://" in text and len(scheme) > 1 and scheme != "file"


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import fsspec

        return fsspec.core.url_to_fs(url)
    except ImportError as exc:  # NOTE: fsspec names the package to install (s3fs, gcsfs)
        raise RemoteError(f"{url}: {exc}") from None
    except (ValueError, TypeError) as exc:
        raise RemoteError(f"{url}: not a URL radixq can read ({exc})") from None


def _local_name(url: str) -> str:
    """The file name of a URL's path (its extension tells the format), else ``input``."""
    return Path(urlsplit(url).path).name or "input"


def download(url: str, folder: Path) -> Path:
    """``url`` copied into ``folder`` (its own file name kept); RemoteError when it cannot be."""
    fs, path = _filesystem(url)
    local = folder / _local_name(url)
    try:
        with fs.open(path, "rb") as source, open(local, "wb") as target:
            shutil.copyfileobj(source, target, _CHUNK)
    except FileNotFoundError:
        raise RemoteError(f"{url}: no such file") from None
    except Exception as exc:  # NOTE: the network boundary: aiohttp, botocore, ... errors
        raise RemoteError(f"cannot read {url}: {type(exc).__name__}: {exc}") from None
    return local


def _exists(url: str) -> bool:
    fs, path = _filesystem(url)
    try:
        return bool(fs.exists(path))
    except Exception as exc:
        raise RemoteError(f"cannot look up {url}: {type(exc).__name__}: {exc}") from None


def upload(local: Path, url: str) -> None:
    """``local`` written to ``url`` whole (a PUT for http(s)); RemoteError when it cannot be."""
    fs, path = _filesystem(url)
    options = {"method": "put"} if urlsplit(url).scheme in ("http", "https") else {}
    try:
        fs.put_file(str(local), path, **options)
    except Exception as exc:
        raise RemoteError(f"cannot write {url}: {type(exc).__name__}: {exc}") from None


@contextmanager
def local_input(name: str | Path | None) -> Iterator[Path | None]:
    """A local path for an input file or URL (a URL is downloaded into a private folder)."""
    if name is None or not is_url(name):
        yield Path(name) if name is not None else None
        return
    folder = Path(tempfile.mkdtemp(prefix="radixq-in-"))
    try:
        yield download(str(name), folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def local_output(name: str | Path | None, companions: tuple[str, ...] = ()) -> Iterator[Path | None]:
    """A local path for an output file or URL. A URL's file (and ``URL + suffix`` for each
    of ``companions``) is downloaded first when it exists, and uploaded when the block ends:
    a failed upload raises RemoteError, unless the block itself raised (then the block's
    exception goes on, and the failed upload is said on stderr)."""
    if name is None or not is_url(name):
        yield Path(name) if name is not None else None
        return
    url = str(name)
    folder = Path(tempfile.mkdtemp(prefix="radixq-out-"))
    local = folder / _local_name(url)
    pairs = [(local, url)] + [(Path(f"{local}{suffix}"), url + suffix) for suffix in companions]
    try:
        for path, remote in pairs:
            if _exists(remote):
                shutil.move(download(remote, folder), path)
        try:
            yield local
        except BaseException:
            try:
                _upload_all(pairs)
            except RemoteError as exc:
                print(f"error: {exc}", file=sys.stderr, flush=True)
            raise
        _upload_all(pairs)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _upload_all(pairs: list[tuple[Path, str]]) -> None:
    for path, remote in reversed(pairs):  # NOTE: the rows file first: it is what resumes
        if path.exists():
            upload(path, remote)

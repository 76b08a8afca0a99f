"""File bytes: a local folder (the default) or any fsspec URL (``s3://bucket/prefix``), through
the URL I/O the producer has (producer.remote for staging a copy to read).

A file is written under a temporary name and renamed when whole, so a reader never sees half a
file, and a crash leaves only a ``.part`` that nothing names.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from producer.remote import RemoteError, download, is_url

_CHUNK = 1 << 20


class Storage:
    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.remote = is_url(root)
        self._fs: Any = None
        if self.remote:
            import fsspec

            self._fs, self._base = fsspec.core.url_to_fs(self.root)
        else:
            Path(root).mkdir(parents=True, exist_ok=True)

    def where(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _path(self, name: str) -> str:
        return f"{self._base}/{name}" if self.remote else os.path.join(self.root, name)

    @contextmanager
    def writer(self, name: str) -> Iterator[IO[bytes]]:
        """A binary file to write ``name`` into; it appears under that name when the block ends
        without an exception, else the partial copy is removed."""
        final, part = self._path(name), self._path(name + ".part")
        sink: IO[bytes] = self._fs.open(part, "wb") if self.remote else open(part, "wb")  # noqa: SIM115
        try:
            with sink:
                yield sink
                if not self.remote:
                    sink.flush()
                    os.fsync(sink.fileno())
            if self.remote:
                self._fs.mv(part, final)
            else:
                os.replace(part, final)
        except BaseException:
            self._remove(part)
            raise

    def put(self, local: Path, name: str) -> None:
        """Copy a local file into storage as ``name``."""
        with open(local, "rb") as source, self.writer(name) as sink:
            shutil.copyfileobj(source, sink, _CHUNK)

    def reader(self, name: str) -> IO[bytes]:
        """``name`` open for reading; FileNotFoundError when it is not there."""
        if self.remote:
            try:
                return self._fs.open(self._path(name), "rb")  # type: ignore[no-any-return]
            except FileNotFoundError:
                raise
            except Exception as exc:
                raise RemoteError(f"cannot read {self.where(name)}: {type(exc).__name__}: {exc}") from None
        return open(self._path(name), "rb")  # noqa: SIM115 - the caller closes it

    @contextmanager
    def local(self, name: str, folder: Path) -> Iterator[Path]:
        """A local path holding ``name``: its own path in a local folder, else a copy in
        ``folder`` that goes when the block ends."""
        if not self.remote:
            path = Path(self._path(name))
            if not path.exists():
                raise FileNotFoundError(str(path))
            yield path
            return
        folder.mkdir(parents=True, exist_ok=True)
        copy = download(self.where(name), folder)
        try:
            yield copy
        finally:
            copy.unlink(missing_ok=True)

    def size(self, name: str) -> int:
        if self.remote:
            return int(self._fs.size(self._path(name)))
        return Path(self._path(name)).stat().st_size

    def delete(self, name: str) -> None:
        self._remove(self._path(name))

    def _remove(self, path: str) -> None:
        if self.remote:
            try:
                self._fs.rm(path)
            except FileNotFoundError:
                pass
        else:
            Path(path).unlink(missing_ok=True)

"""Exit codes of every radixq command (documented in docs/guide.md, Exit codes)."""

from __future__ import annotations

from typing import NoReturn

import typer

OK = 0  # everything asked for is done
JOBS_FAILED = 1  # some jobs failed, were rejected, dead-lettered, lost or have no result yet
USAGE = 2  # usage, configuration or connection error: nothing (more) could be done


def fail(message: str, code: int = JOBS_FAILED) -> NoReturn:
    """End a command: ``error: message`` on stderr, exit ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)

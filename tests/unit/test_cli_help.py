"""What `radixq --help` and `radixq worker --help` show (issue 32, defect 4), read through
typer's CliRunner: every worker setting's default (from its declaration, worker.config), no
type tag beside a flag that takes no value (`--help <bool>`), and `radixq --version` prints the
installed distribution's version (importlib.metadata, the oracle)."""

from __future__ import annotations

import re
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from radixq.cli import build_app
from worker.config import settings

# Wide enough that no help line wraps inside "[default: ...]".
RUNNER = CliRunner(env={"COLUMNS": "400", "TERMINAL_WIDTH": "400", "NO_COLOR": "1"})


def help_of(*command: str) -> str:
    done = RUNNER.invoke(build_app(), [*command, "--help"])
    assert done.exit_code == 0, done.output
    return re.sub(r"\s+", " ", done.output.replace("│", " "))  # one line: the table's cells joined


@pytest.mark.parametrize(
    "command", [(), ("worker",), ("run",), ("enqueue",), ("collect",), ("status",), ("dlq",), ("dlq", "list")]
)
def test_no_flag_shows_a_type_tag(command: tuple[str, ...]) -> None:
    text = help_of(*command)
    assert "--help" in text and "<bool>" not in text


def test_worker_help_shows_each_settings_default() -> None:
    text = help_of("worker")
    for s in settings():
        if s.type is bool:
            on, _, off = (
                s.flags[0] if "/" in s.flags[0] else f"{s.flags[0]}/--no-{s.flags[0][2:]}"
            ).partition("/")
            shown = on if s.default else off
        else:
            shown = s.shown_default
        if shown:
            assert f"[default: {shown}]" in text, s.dotted


def test_version_prints_the_installed_version() -> None:
    done = RUNNER.invoke(build_app(), ["--version"])
    assert done.exit_code == 0 and done.output == f"radixq {version('radixq')}\n"

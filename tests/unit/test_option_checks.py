"""The checks settings declare (worker.options.at_least, above, within) hold exactly on their
bound, pass None ("not set"), and a failing value is named with its reason."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from worker.options import above, at_least, check_options, option, within


@pytest.mark.parametrize(
    ("check", "good", "bad", "why"),
    [
        (at_least(1), [1, 2, 10**9, None], [0, -1], "must be >= 1"),
        (at_least(0, "0: every core"), [0, 0.0, 3, None], [-1, -0.5], "must be >= 0 (0: every core)"),
        (above(0), [1e-9, 1, None], [0, -1], "must be > 0"),
        (within(0, 1), [0, 0.5, 1, None], [-0.01, 1.01], "must be in [0, 1]"),
        (within(0, 1, low_open=True), [1e-9, 1, None], [0, 1.5], "must be in (0, 1]"),
        (within(0, 65535, note="a port"), [0, 65535], [-1, 65536], "must be in [0, 65535] (a port)"),
    ],
)
def test_a_check_holds_on_its_bound_and_says_why_it_fails(check, good, bad, why) -> None:  # type: ignore[no-untyped-def]
    holds, reason = check
    assert all(holds(v) for v in good)
    assert not any(holds(v) for v in bad)
    assert reason == why


def test_check_options_names_the_setting_its_value_and_the_reason() -> None:
    @dataclasses.dataclass(frozen=True)
    class Table:
        widgets: int = option(4, "widgets per step", check=at_least(1))

        def __post_init__(self) -> None:
            check_options(self)

    assert Table(1).widgets == 1
    with pytest.raises(ValueError, match=r"^widgets=0: must be >= 1$"):
        Table(0)


def test_settings_declare_checks_with_the_helpers() -> None:
    """No setting hand-writes its check as a lambda: one rule, one wording (at_least, above,
    within)."""
    root = Path(__file__).resolve().parents[2] / "worker"
    offenders = [
        f"{path.relative_to(root.parent)}:{n}"
        for path in sorted(root.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"check=\(?\s*lambda", line)
    ]
    assert offenders == []

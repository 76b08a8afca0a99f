"""Settings declared once, next to their owner: a field of a config dataclass made by
``option(default, help, ...)`` carries its type (the annotation), default, allowed choices,
check and help. Everything else is read from there: the TOML loader and the ``RADIXQ_<KEY>``
environment variables (worker.config), the ``radixq worker`` flags (worker.cli) and the
table of settings in docs/configuration.md (``worker.config.settings_table``, checked by a test).

Torch-free: the choices are name lists their owners declare in torch-free modules
(worker.attention.names, worker.kvcache.names, worker.models.names, worker.scheduler.names).

Adding a setting is one field::

    max_widgets: int = option(4, "widgets per step", check=at_least(1))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_SPEC = "radixq.option"

Check = tuple[Callable[[Any], bool], str]  # (holds for a good value, why otherwise)


def _why(rule: str, note: str) -> str:
    return f"must be {rule}" + (f" ({note})" if note else "")


def at_least(low: float, note: str = "") -> Check:
    """The check "value >= ``low``"; ``note`` says what a special value means ("0: every core").
    None passes: it is "not set" where the annotation admits it."""
    return (lambda v: v is None or v >= low, _why(f">= {low:g}", note))


def above(low: float) -> Check:
    """The check "value > ``low``" (None passes, as in at_least)."""
    return (lambda v: v is None or v > low, _why(f"> {low:g}", ""))


def within(low: float, high: float, *, low_open: bool = False, note: str = "") -> Check:
    """The check "value in [low, high]", or (low, high] with ``low_open`` (None passes)."""
    if low_open:
        return (lambda v: v is None or low < v <= high, _why(f"in ({low:g}, {high:g}]", note))
    return (lambda v: v is None or low <= v <= high, _why(f"in [{low:g}, {high:g}]", note))


@dataclass(frozen=True)
class Spec:
    """What the loader, the CLI and the settings table know about one setting besides its type and default."""

    help: str
    choices: tuple[str, ...] = ()  # allowed values (from the owner's name list); () any
    check: Check | None = None  # at_least, above, within
    flags: tuple[str, ...] = ()  # flag declarations of `radixq worker`; () "--" + the key in dashes
    repeat: bool = False  # a flag given once per value; the setting is the values joined by ","
    env: tuple[str, ...] = ()  # other environment variables read after RADIXQ_<KEY>
    deprecated_env: tuple[str, ...] = ()  # older variables still read, with a warning
    shown_default: str | None = None  # the table's default when the field's would mislead


def option(
    default: Any,
    help: str,
    *,
    choices: Sequence[str] = (),
    check: Check | None = None,
    flags: Sequence[str] = (),
    repeat: bool = False,
    env: Sequence[str] = (),
    deprecated_env: Sequence[str] = (),
    shown_default: str | None = None,
) -> Any:
    """A dataclass field that is a setting (see the module docstring)."""
    spec = Spec(
        help, tuple(choices), check, tuple(flags), repeat, tuple(env), tuple(deprecated_env), shown_default
    )
    return dataclasses.field(default=default, metadata={_SPEC: spec})


def spec_of(f: dataclasses.Field[Any]) -> Spec | None:
    """The setting declared by field ``f``; None for a field that is not one."""
    spec = f.metadata.get(_SPEC)
    return spec if isinstance(spec, Spec) else None


def one_of(choices: Sequence[str]) -> str:
    """ "'a', 'b' or 'c'" """
    quoted = [repr(c) for c in choices]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def check_options(config: Any) -> None:
    """Raise ValueError("key=value: reason") for the first setting of the dataclass instance
    ``config`` outside its choices or failing its check (the loader names where it came from)."""
    for f in dataclasses.fields(config):
        spec = spec_of(f)
        if spec is None:
            continue
        value = getattr(config, f.name)
        if spec.choices and value not in spec.choices:
            raise ValueError(f"{f.name}={value!r}: must be {one_of(spec.choices)}")
        if spec.check is not None and not spec.check[0](value):
            raise ValueError(f"{f.name}={value!r}: {spec.check[1]}")

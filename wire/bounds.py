"""Bounds checks on job fields: JobError, which names the field and why, and the checks that
raise it, none of which recurses (a value may be nested as deep as its payload allows)."""

from __future__ import annotations

import math
import reprlib
from typing import Any

INT_MIN = -(2**63)  # msgpack's integer range: int64 and uint64
INT_MAX = 2**64 - 1
TOKEN_ID_LIMIT = 1 << 31  # token ids are in [0, TOKEN_ID_LIMIT)


_REPR = reprlib.Repr()  # NOTE: bounded depth and size: a value may nest as deep as its payload allows
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 4, 80, 80


def _shown(value: Any) -> str:
    shown = _REPR.repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


class JobError(ValueError):
    """A job (or a line of an input file) that cannot be run, with the field and the reason."""

    def __init__(self, field: str, value: Any, reason: str, job_id: str | None = None) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        self.job_id = job_id
        where = f"job {_shown(job_id)}: " if job_id is not None else ""
        what = f"{field}={_shown(value)}" if value is not None else field
        super().__init__(f"{where}{what}: {reason}")


def check(ok: bool, field: str, value: Any, reason: str) -> None:
    if not ok:
        raise JobError(field, value, reason)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# NOTE: the checks below run for every job at enqueue and at intake: each returns after one
# type test and one comparison when the value is fine, and builds its message only when not.


def check_int(value: Any, field: str, low: int, high: int, reason: str = "") -> None:
    if type(value) is int and low <= value <= high:
        return
    check(
        is_int(value) and low <= value <= high,
        field,
        value,
        reason or f"must be an integer in [{low}, {high}]",
    )


def check_number(value: Any, field: str, low: float, high: float, reason: str = "") -> None:
    """``value`` in [low, high], both finite (so NaN and infinities fail the comparison)."""
    if (type(value) is float or type(value) is int) and low <= value <= high:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high
    check(ok, field, value, reason or f"must be a finite number in [{low:g}, {high:g}]")


def check_list(value: Any, field: str, min_len: int, max_len: int) -> None:
    if type(value) is list and min_len <= len(value) <= max_len:
        return
    ok = isinstance(value, list) and min_len <= len(value) <= max_len
    check(ok, field, None, f"must be a list of {min_len} to {max_len} items")


def check_token_ids(token_ids: list[int], field: str) -> None:
    """Each id an int in [0, TOKEN_ID_LIMIT): one pass in C for the common case, then the culprit."""
    if all(type(t) is int for t in token_ids) and 0 <= min(token_ids) and max(token_ids) < TOKEN_ID_LIMIT:
        return
    for index, token_id in enumerate(token_ids):
        check(
            is_int(token_id) and 0 <= token_id < TOKEN_ID_LIMIT,
            f"{field}[{index}]",
            token_id,
            "token ids must be integers in [0, 2**31)",
        )


def check_json_value(value: Any, field: str, max_depth: int) -> None:
    """Raise JobError for the first part of ``value`` that is not plain JSON that msgpack can
    carry, walking it with an explicit stack (never recursing). Plain: dicts with string keys,
    lists (and tuples), strings, bools, None, integers in msgpack's range, finite floats; at
    most ``max_depth`` dicts and lists deep, ``value`` itself counting as one. The error names
    ``field`` plus the path (``.key``, ``[index]``); a depth error names ``field`` alone."""
    problem = _json_value_problem(value, max_depth)
    if problem is not None:
        path, shown, reason = problem
        raise JobError(f"{field}{path}", shown, reason)


# Where an item sits: (where its container sits, its key or index); None for the top value.
_Where = tuple[Any, str | int] | None


def _json_value_problem(value: Any, max_depth: int) -> tuple[str, Any, str] | None:
    stack: list[tuple[Any, int, _Where]] = [(value, 1, None)]
    while stack:
        container, depth, where = stack.pop()
        if depth > max_depth:
            return "", None, f"nested more than {max_depth} levels deep"
        if isinstance(container, dict):
            for key in container:
                if type(key) is not str and not isinstance(key, str):
                    return _path(where), key, "object keys must be strings"
            children: Any = container.items()
        else:
            children = enumerate(container)
        for key, child in children:
            kind = type(child)
            if kind is str or kind is bool or child is None:
                continue
            if kind is dict or kind is list or isinstance(child, (dict, list, tuple)):
                stack.append((child, depth + 1, (where, key)))
                continue
            reason = _scalar_problem(child)
            if reason is not None:
                shown = type(child).__name__ if reason == _NOT_JSON else child
                return _path((where, key)), shown, reason
    return None


_NOT_JSON = "must hold JSON values only"


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, (str, bool)):
        return None
    if isinstance(value, int):
        return None if INT_MIN <= value <= INT_MAX else "integers must be in [-2**63, 2**64)"
    if isinstance(value, float):
        return None if math.isfinite(value) else "numbers must be finite"
    return _NOT_JSON


def _path(where: _Where) -> str:
    parts: list[str] = []
    while where is not None:
        where, key = where
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts))

"""Outlines of payloads too deeply nested for msgspec to decode, read without recursion.

msgspec decodes recursively and raises RecursionError near Python's recursion limit (about
1,000 levels, less when called from deep in a stack), so a payload that deep cannot be decoded
to find out which field is at fault. The outlines here scan the raw text or bytes with an
explicit stack instead; they run only after a decode failed, and are best effort on input
that is malformed anyway.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

# top-level key -> (nesting depth of its value in dicts/lists, 0 for a scalar; the value when
# it is a scalar that could be read, else None)
Outline = dict[str, tuple[int, Any]]


_JSON_TOKEN = re.compile(r'("(?:[^"\\]|\\.)*")(\s*:)?|([\[\]{}])')


def json_outline(text: str) -> Outline:
    """The outline of a JSON object's text, scanned token by token without recursion."""
    outline: Outline = {}
    depth = 0
    key: str | None = None
    for match in _JSON_TOKEN.finditer(text):
        string, colon, bracket = match.groups()
        if bracket in ("{", "["):
            depth += 1
            if depth > 1 and key is not None:
                outline[key] = (max(outline[key][0], depth - 1), None)
        elif bracket is not None:
            depth -= 1
        elif depth == 1 and colon:
            key = _json_string(string)
            if key is not None:
                outline[key] = (0, None)
        elif depth == 1 and key is not None:
            outline[key] = (0, _json_string(string))
    return outline


def _json_string(token: str) -> str | None:
    try:
        value = msgspec.json.decode(token)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, str) else None


def msgpack_outline(data: bytes) -> Outline:
    """The outline of a msgpack map, walked item by item without recursion."""
    outline: Outline = {}
    if not data or data[0] not in _MAP_BYTES:
        return outline
    try:
        pos, count = _head(data, 0)
        for _ in range(count // 2):
            key_end, key_depth = _skip(data, pos)
            key = _scalar(data[pos:key_end]) if key_depth == 0 else None
            value_end, depth = _skip(data, key_end)
            if isinstance(key, str):
                outline[key] = (depth, _scalar(data[key_end:value_end]) if depth == 0 else None)
            pos = value_end
    except (IndexError, ValueError):
        pass  # NOTE: truncated or malformed: the keys read so far are still the best answer
    return outline


def _scalar(item: bytes) -> Any:
    """A scalar item's value, or None when it cannot be read (an outline never raises)."""
    try:
        return msgspec.msgpack.decode(item)
    except Exception:
        return None


def _skip(data: bytes, pos: int) -> tuple[int, int]:
    """(end offset, nesting depth) of the msgpack item at ``pos``."""
    unread = [1]  # items still to read at each open level
    depth = 0
    while unread:
        if unread[-1] == 0:
            unread.pop()
            continue
        unread[-1] -= 1
        size, count = _head(data, pos)
        pos += size
        if count >= 0:
            unread.append(count)
            depth = max(depth, len(unread) - 1)
    if pos > len(data):
        raise ValueError("truncated")
    return pos, depth


# first byte -> bytes of a scalar of fixed size (nil, bools, floats, ints, fixext)
_FIXED = {0xC0: 1, 0xC2: 1, 0xC3: 1, 0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9}
_FIXED |= {0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9, 0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18}
# first byte -> (width of the length field, bytes between it and the payload): bin, ext, str
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)}
_SIZED |= {0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0)}
# first byte -> (width of the count field, items per count): array16/32, map16/32
_COUNTED = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
_MAP_BYTES = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


def _head(data: bytes, pos: int) -> tuple[int, int]:
    """(bytes of the item at ``pos`` without its elements, number of elements: -1 for a scalar)."""
    first = data[pos]
    if first <= 0x7F or first >= 0xE0:
        return 1, -1
    if first <= 0x8F:
        return 1, 2 * (first & 0x0F)
    if first <= 0x9F:
        return 1, first & 0x0F
    if first <= 0xBF:
        return 1 + (first & 0x1F), -1
    if first in _FIXED:
        return _FIXED[first], -1
    if first in _SIZED:
        width, gap = _SIZED[first]
        return 1 + width + gap + int.from_bytes(data[pos + 1 : pos + 1 + width], "big"), -1
    if first in _COUNTED:
        width, per_item = _COUNTED[first]
        return 1 + width, per_item * int.from_bytes(data[pos + 1 : pos + 1 + width], "big")
    raise ValueError(f"not a msgpack type byte: {first:#x}")

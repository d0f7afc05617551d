"""JSON structure without a parser, for the Kineto reader's slow paths: where each bracket
outside strings is and how deep it is, in numpy over the whole text at once.

msgspec decodes nested values by recursion, so a value nested about a thousand levels deep
raises ``RecursionError`` with no position; and it cannot say where a value ends when the text
ends inside it. This scan never recurses and is linear in the text, so it finds where a deep
value ends (to skip it), where it is deepest (to report it) and whether a value is complete.
It assumes the scan starts outside any string, which holds at every entry's first byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_QUOTE, _BACKSLASH = 0x22, 0x5C
_WHITESPACE = np.frombuffer(b" \t\r\n", dtype=np.uint8)
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[[ord("{"), ord("[")]] = 1
_DELTA[[ord("}"), ord("]")]] = -1


@dataclass
class Structure:
    """The brackets of ``text`` outside strings: their positions, the nesting depth after each
    (the text's start is depth 0), and whether the text ends inside a string."""

    pos: np.ndarray
    depth: np.ndarray
    in_string_at_end: bool


def structure(text: bytes | memoryview) -> Structure:
    """Brackets outside strings, in one vectorized pass (escaped quotes respected)."""
    a = np.frombuffer(text, dtype=np.uint8)
    quotes = np.flatnonzero(a == _QUOTE)
    if quotes.size:
        quotes = quotes[~_escaped(a, quotes)]
    delta = _DELTA[a]
    br = np.flatnonzero(delta)
    # a bracket is inside a string when an odd number of real quotes precede it
    outside = (np.searchsorted(quotes, br) & 1) == 0
    br = br[outside]
    depth = np.cumsum(delta[br], dtype=np.int64)
    return Structure(br, depth, bool(quotes.size & 1))


def _escaped(a: np.ndarray, quotes: np.ndarray) -> np.ndarray:
    """Which quotes follow an odd run of backslashes (``\\"`` is in a string, ``\\\\"`` ends it)."""
    after_bs = quotes[(quotes > 0)]
    after_bs = after_bs[a[after_bs - 1] == _BACKSLASH]
    out = np.zeros(quotes.size, dtype=bool)
    if not after_bs.size:
        return out
    bs = np.flatnonzero(a == _BACKSLASH)
    run_start = np.ones(bs.size, dtype=bool)
    run_start[1:] = bs[1:] != bs[:-1] + 1
    first_of_run = np.maximum.accumulate(np.where(run_start, bs, 0))
    k = np.searchsorted(bs, after_bs - 1)
    run = after_bs - first_of_run[k]  # backslashes right before the quote
    out[np.searchsorted(quotes, after_bs)] = (run & 1) == 1
    return out


def value_end(text: bytes | memoryview) -> int | None:
    """Where the object or array that ``text`` starts with ends (one past its last bracket),
    or None when the text ends first."""
    s = structure(text)
    closed = np.flatnonzero(s.depth == 0)
    return int(s.pos[closed[0]]) + 1 if closed.size else None


def extent(text: bytes | memoryview) -> int | None:
    """Where the JSON value ``text`` starts with ends, whatever is wrong inside it, as long as
    its brackets and quotes balance: an object or array at its closing bracket, a string at
    its closing quote, anything else before the next ``,``, ``}`` or ``]``. None when the text
    ends first."""
    a = np.frombuffer(text, dtype=np.uint8)
    if not a.size:
        return None
    if a[0] in (ord("{"), ord("[")):
        return value_end(text)
    if a[0] == _QUOTE:
        quotes = np.flatnonzero(a == _QUOTE)
        quotes = quotes[~_escaped(a, quotes)]
        return int(quotes[1]) + 1 if quotes.size > 1 else None
    stops = np.flatnonzero((a == ord(",")) | (a == ord("}")) | (a == ord("]")))
    return int(stops[0]) if stops.size else None


def count_items(text: bytes | memoryview) -> int:
    """How many items the JSON array ``text`` holds, by its commas at depth 1 outside
    strings (0 when ``text`` is not an array or is empty)."""
    a = np.frombuffer(text, dtype=np.uint8)
    if not a.size or a[0] != ord("["):
        return 0
    filled = np.flatnonzero(~np.isin(a[1:], _WHITESPACE))
    if not filled.size or a[1 + filled[0]] == ord("]"):
        return 0
    s = structure(text)
    commas = np.flatnonzero(a == ord(","))
    quotes = np.flatnonzero(a == _QUOTE)
    if quotes.size:
        quotes = quotes[~_escaped(a, quotes)]
    commas = commas[(np.searchsorted(quotes, commas) & 1) == 0]
    k = np.searchsorted(s.pos, commas) - 1
    level = np.where(k >= 0, s.depth[np.maximum(k, 0)], 0)
    return int((level == 1).sum()) + 1


def deepest(text: bytes | memoryview) -> tuple[int, int]:
    """(depth, offset of the first bracket reaching it) of the deepest point of ``text``."""
    s = structure(text)
    if not s.depth.size:
        return 0, 0
    k = int(np.argmax(s.depth))
    return int(s.depth[k]), int(s.pos[k])


def first_top_comma(text: bytes | memoryview) -> int | None:
    """The first ``,`` outside strings and brackets in ``text`` (which starts outside both), or
    None: where the entry that ``text`` starts with would end if its own damage left the
    brackets and quotes around it intact."""
    a = np.frombuffer(text, dtype=np.uint8)
    commas = np.flatnonzero(a == ord(","))
    if not commas.size:
        return None
    s = structure(text)
    quotes = np.flatnonzero(a == _QUOTE)
    if quotes.size:
        quotes = quotes[~_escaped(a, quotes)]
    commas = commas[(np.searchsorted(quotes, commas) & 1) == 0]
    below = np.flatnonzero(s.depth < 0)  # the container's end: nothing after it is the entry's
    if below.size:
        commas = commas[commas < s.pos[below[0]]]
    k = np.searchsorted(s.pos, commas) - 1  # the last bracket before each comma
    level = np.where(k >= 0, s.depth[np.maximum(k, 0)], 0)
    top = commas[level == 0]
    return int(top[0]) if top.size else None

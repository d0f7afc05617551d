"""One JSON value at a time, for the Kineto reader's slow paths: where a value ends, what is
wrong with it and where, without ever recursing in Python or re-reading more than the value.

msgspec is the parser: decoding the text from a value's first byte as ``msgspec.Raw`` checks
the value's syntax and, through the "trailing characters (byte N)" it reports, says where the
value ends — in C, in time proportional to the value. The structure scan (``scan.py``) covers
the two things msgspec cannot say: where a value too deep for its recursion ends, and whether a
value the text ends inside is merely cut off.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import msgspec

from xpuprof.formats.kineto import scan

_RAW = msgspec.json.Decoder(msgspec.Raw)
_STR = msgspec.json.Decoder(str)
_WS = b" \t\r\n"
_BYTE = re.compile(r"\(byte (\d+)\)")
_INDEX = re.compile(r"\$\[(\d+)\]")


def float_hook(text: str) -> Any:
    """Floats beyond float64 (``1e400``) stay the text they were, instead of failing the whole
    decode: a value a column cannot hold is then left out of that column, not fatal."""
    f = float(text)
    return f if math.isfinite(f) else text


#: Any JSON value, floats beyond float64 kept as their text.
ANY_DEC = msgspec.json.Decoder(float_hook=float_hook)


def err_offset(e: Exception) -> int | None:
    """The byte offset msgspec names in an error, if any."""
    m = _BYTE.search(str(e))
    return int(m.group(1)) if m else None


def err_index(e: Exception) -> int | None:
    """The list position msgspec names in a validation error (``$[12]``), if any."""
    m = _INDEX.search(str(e))
    return int(m.group(1)) if m else None


def err_text(e: Exception) -> str:
    """msgspec's message without its position suffixes (we give our own, absolute ones)."""
    s = str(e).split(" (byte")[0].split(" - at `")[0]
    return s.removeprefix("JSON is malformed: ")


class Damage(Exception):
    """A value that is not valid JSON: what is wrong, and where (relative to the text given)."""

    def __init__(self, message: str, offset: int, *, truncated: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset
        self.truncated = truncated


class Incomplete(Exception):
    """The text ends inside the value and more text may follow: read more and try again."""


class TooDeep(Exception):
    """A value nested too deeply for the decoder: its depth, where that depth is first reached
    and where the value ends (None: the text ends first), relative to the text given."""

    def __init__(self, depth: int, offset: int, end: int | None) -> None:
        super().__init__(f"JSON nested {depth} levels deep, deeper than the decoder can follow")
        self.message = str(self)
        self.depth = depth
        self.offset = offset
        self.end = end


def skip_ws(buf: bytes | memoryview, pos: int, stop: int) -> int:
    """The first position at or after ``pos`` (before ``stop``) that is not JSON whitespace."""
    while pos < stop and buf[pos] in _WS:
        pos += 1
    return pos


def value_end(buf: bytes, start: int, stop: int, *, eof: bool) -> int:
    """Where the JSON value at ``buf[start]`` (not whitespace) ends: the position of the first
    non-whitespace byte after it, or ``stop``.

    Raises :class:`Incomplete` when ``buf[start:stop]`` ends inside the value and ``eof`` is
    false, :class:`Damage` for text that is not a JSON value (``truncated`` when the file ends
    inside it), :class:`TooDeep` for a value deeper than msgspec can follow.
    """
    view = memoryview(buf)[start:stop]
    scalar = buf[start] not in b'{["'
    try:
        _RAW.decode(view)
    except msgspec.DecodeError as e:
        off = err_offset(e)
        if off is not None and "trailing characters" in str(e):
            return start + off - 1  # msgspec names the byte after the first one left over
        if not eof and (off is None or scalar and off >= len(view) - 1):
            raise Incomplete from None
        if off is None and "truncated" in str(e):
            if _closes(view):  # msgspec says "truncated" for a lone surrogate escape at the end
                raise Damage(f"malformed JSON ({err_text(e)})", start) from None
            raise Damage(
                "truncated JSON: the file ends inside a value", stop, truncated=True
            ) from None
        raise Damage(f"malformed JSON ({err_text(e)})", start + (off or 0)) from None
    except RecursionError:
        depth, at = scan.deepest(view)
        end = scan.value_end(view)
        if end is None and not eof:
            raise Incomplete from None
        raise TooDeep(depth, start + at, None if end is None else start + end) from None
    if scalar and not eof:
        raise Incomplete  # a number may go on in the text not read yet
    return stop


def _closes(view: memoryview) -> bool:
    if view[0:1] not in (b"{", b"["):
        return view[0:1] == b'"' and len(view) > 1 and view[-1:] == b'"'
    return scan.value_end(view) is not None


def utf8_error(buf: bytes | memoryview, start: int, stop: int) -> int | None:
    """Offset of the first byte of ``buf[start:stop]`` that is not valid UTF-8, or None."""
    try:
        bytes(buf[start:stop]).decode("utf-8")
    except UnicodeDecodeError as e:
        return start + e.start
    return None


def decode_any(buf: bytes, start: int, stop: int) -> Any:
    """Decode one JSON value as Python objects; any failure as :class:`Damage` at the place
    (invalid UTF-8 at its byte; too deep at its deepest point; otherwise msgspec's offset)."""
    view = memoryview(buf)[start:stop]
    try:
        return ANY_DEC.decode(view)
    except RecursionError:
        depth, at = scan.deepest(view)
        raise Damage(TooDeep(depth, at, None).message, start + at) from None
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        bad = utf8_error(buf, start, stop)
        if bad is not None:
            raise Damage("invalid UTF-8 in a string", bad) from None
        off = err_offset(e)
        raise Damage(f"malformed JSON ({err_text(e)})", start + (off or 0)) from None


def members(
    buf: bytes,
    pos: int,
    stop: int,
    *,
    eof: bool,
    after_comma: bool = False,
    events_key: bool = True,
    on_bad: Callable[[str, Damage | TooDeep, int, int], None] | None = None,
    out: list[tuple[str, int, int]] | None = None,
) -> tuple[list[tuple[str, int, int]], int, bool]:
    """The members of the JSON object whose ``{`` (or, ``after_comma``, a ``,`` between two
    members) was just before ``pos``: ``(key, value start, value end)`` each, appended to
    ``out`` as they are read, up to the object's ``}`` or, with ``events_key``, a
    ``traceEvents`` key (whose value must be an array: returned with its ``[`` as start and
    end).

    Returns the members, the position after the last byte read and whether a ``traceEvents``
    array was reached. Raises :class:`Incomplete`, :class:`Damage` or :class:`TooDeep` as
    :func:`value_end` does, except that with ``on_bad`` a value that is damaged or too deep
    but whose own extent is clear (``scan.extent``) is handed to it (key, error, start, end)
    and left out.
    """
    out = [] if out is None else out
    first = not after_comma
    while True:
        pos = _need(buf, skip_ws(buf, pos, stop), stop, eof)
        c = buf[pos]
        if c == ord("}") and first:
            return out, pos + 1, False
        if c != ord('"'):
            raise Damage(f"malformed JSON (expected a key, found {_show(c)})", pos)
        kend = value_end(buf, pos, stop, eof=eof)
        try:
            key = _STR.decode(memoryview(buf)[pos:kend])
        except msgspec.DecodeError as e:
            bad = utf8_error(buf, pos, kend)
            raise Damage(f"malformed key ({err_text(e)})", pos if bad is None else bad) from None
        colon = _need(buf, kend, stop, eof)
        if buf[colon] != ord(":"):
            raise Damage(f"malformed JSON (expected ':', found {_show(buf[colon])})", colon)
        vstart = _need(buf, skip_ws(buf, colon + 1, stop), stop, eof)
        if key == "traceEvents" and events_key:
            if buf[vstart] != ord("["):
                raise Damage("not a Chrome trace: traceEvents is not an array", vstart)
            out.append((key, vstart, vstart))
            return out, vstart + 1, True
        try:
            vend = value_end(buf, vstart, stop, eof=eof)
            out.append((key, vstart, vend))
        except (Damage, TooDeep) as bad:
            if on_bad is None or getattr(bad, "truncated", False):
                raise
            size = scan.extent(memoryview(buf)[vstart:stop])
            if size is None:
                raise
            on_bad(key, bad, vstart, vstart + size)
            vend = skip_ws(buf, vstart + size, stop)
        after = _need(buf, vend, stop, eof)
        if buf[after] == ord("}"):
            return out, after + 1, False
        if buf[after] != ord(","):
            raise Damage(f"malformed JSON (expected ',' or '}}', found {_show(buf[after])})", after)
        pos, first = after + 1, False


def _need(buf: bytes, pos: int, stop: int, eof: bool) -> int:
    """``pos`` when there is a byte there; else more text is needed, or the file is cut."""
    if pos < stop:
        return pos
    if not eof:
        raise Incomplete
    raise Damage("truncated JSON: the file ends inside the top-level object", stop, truncated=True)


def _show(c: int) -> str:
    return repr(chr(c)) if 32 <= c < 127 else f"byte 0x{c:02x}"

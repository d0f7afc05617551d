"""The top level of a Kineto / Chrome-trace file: the keys before the event list (read up to
its ``[``) and what follows the list's ``]``, member by member with exact offsets.

Every top-level value is decoded on its own, so a bad one (invalid UTF-8, nested too deep) is
named with its key and byte, and a lenient read leaves out just that key. A second
``traceEvents`` key is an error: JSON objects hold one value per key, a decoder keeps either
list silently, and xpuprof will not guess which one the writer meant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xpuprof.formats.kineto import scan
from xpuprof.formats.kineto.values import (
    Damage,
    Incomplete,
    TooDeep,
    decode_any,
    members,
    skip_ws,
)

if TYPE_CHECKING:
    from xpuprof.formats.kineto.decode import Decoder
    from xpuprof.formats.kineto.stream import Text


def read_top(dec: Decoder, text: Text, top: dict[str, Any]) -> str:
    """Read up to the event list; return its layout (``"object"``: ``{"traceEvents": [``,
    ``"array"``: the file is a list of events) with ``text`` just after the list's ``[``, and
    the keys before it decoded into ``top``."""
    while True:
        b, buf = text.base, text.buf
        p = skip_ws(buf, b, len(buf))
        if p >= len(buf):
            if text.more():
                continue
            _nothing_read(dec)
        c = buf[p]
        if c == ord("["):
            text.advance(p + 1 - b)
            return "array"
        if c != ord("{"):
            dec.fail(
                f"not a trace: the top-level JSON value starts with {bytes([c])!r}",
                offset=text.offset + p - b,
            )
        bad: list[Bad] = []
        try:
            found, end, has_list = members(
                buf, p + 1, len(buf), eof=text.eof, on_bad=_collect(dec, bad)
            )
        except Incomplete:
            text.more()
            continue
        except (Damage, TooDeep) as d:
            if getattr(d, "truncated", False):
                _nothing_read(dec, "truncated JSON: the file ends before the event list",
                              text.offset + len(buf) - b)  # fmt: skip
            dec.fail(d.message, offset=text.offset + d.offset - b)
        if not has_list:
            dec.fail(
                "not a Chrome trace: the top-level object has no traceEvents",
                offset=text.offset + end - 1 - b,
            )
        _bad_keys(dec, bad, text.offset - b)
        _decode_members(dec, buf, found[:-1], top, text.offset - b)
        text.advance(end - b)
        return "object"


def _nothing_read(dec: Decoder, message: str = "empty file: no JSON value", at=None) -> None:
    """The file ends before the event list: blame gzip damage when there was some."""
    if dec.gzip is not None:
        raise_gzip(dec)
    dec.fail(message, offset=at)


def raise_gzip(dec: Decoder) -> None:
    """Fail with the gzip damage that cut the text short (nothing before it is usable)."""
    from xpuprof.core.errors import TraceFormatError

    g = dec.gzip
    assert g is not None
    raise TraceFormatError(dec.path, g.reason.split(": the rest")[0], offset=g.file_offset)


#: A top-level member whose value is damaged: key, what is wrong, where the value lies.
Bad = tuple[str, "Damage | TooDeep", int, int]


def _collect(dec: Decoder, bad: list[Bad]):
    """``members``' hook for a value that is damaged or too deep to decode: strict reads
    stop, lenient ones note the key and go on after its value."""

    def on_bad(key: str, d: Damage | TooDeep, start: int, end: int) -> None:
        if not dec.lenient:
            raise d
        bad.append((key, d, start, end))

    return on_bad


def _bad_keys(dec: Decoder, bad: list[Bad], shift: int, buf: bytes | None = None) -> None:
    """Report damaged top-level values; after the event list (``buf`` given), a damaged
    second ``traceEvents`` is reported as the duplicate it is, with its entries counted."""
    for key, d, start, end in bad:
        if key == "traceEvents" and buf is not None:
            _duplicate_list(dec, buf, start, end, shift)
            continue
        dec.damage(f"top-level key {key!r}: {d.message}", offset=shift + d.offset, events=0)


def _decode_members(
    dec: Decoder, buf: bytes, found: list[tuple[str, int, int]], top: dict[str, Any], shift: int
) -> None:
    """Decode top-level values into ``top``; a value that does not decode is named (strict)
    or left out and listed (lenient). ``shift`` turns buffer positions into text offsets."""
    for key, vs, ve in found:
        try:
            top[key] = decode_any(buf, vs, ve)
        except Damage as d:
            dec.damage(f"top-level key {key!r}: {d.message}", offset=shift + d.offset, events=0)


def read_remainder(dec: Decoder, text: Text, layout: str, top: dict[str, Any]) -> None:
    """What follows the event list's ``]``: the rest of the top-level object (its keys into
    ``top``), then nothing but whitespace."""
    while text.more():
        pass
    b, buf = text.base, text.buf
    stop = len(buf)
    shift = text.offset - b
    p = skip_ws(buf, b, stop)
    if layout == "array":
        if p < stop:
            dec.damage("malformed JSON (text after the event list)", offset=shift + p, events=0)
        return
    if p >= stop:
        dec.truncated = True
        dec.damage(
            "truncated JSON: the file ends before the top-level object closes",
            offset=shift + p, events=0,
        )  # fmt: skip
        return
    found: list[tuple[str, int, int]] = []
    bad: list[Bad] = []
    damage: Damage | TooDeep | None = None
    end = p + 1
    try:
        if buf[p] == ord(","):
            _, end, _ = members(buf, p + 1, stop, eof=True, after_comma=True, events_key=False,
                                on_bad=_collect(dec, bad), out=found)  # fmt: skip
        elif buf[p] != ord("}"):
            raise Damage("malformed JSON (expected ',' or '}' after the event list)", p)
    except (Damage, TooDeep) as d:
        damage = d
    _bad_keys(dec, bad, shift, buf)
    for key, vs, ve in found:
        if key == "traceEvents":
            _duplicate_list(dec, buf, vs, ve, shift)
        else:
            _decode_members(dec, buf, [(key, vs, ve)], top, shift)
    if damage is not None:
        dec.truncated = dec.truncated or getattr(damage, "truncated", False)
        dec.damage(damage.message, offset=shift + damage.offset, events=0)
        return
    after = skip_ws(buf, end, stop)
    if after < stop:
        dec.damage(
            "malformed JSON (text after the top-level object)", offset=shift + after, events=0
        )


def _duplicate_list(dec: Decoder, buf: bytes, vs: int, ve: int, shift: int) -> None:
    """A second ``traceEvents`` key: an error, or (lenient) its entries counted as dropped
    (by structure: they need not decode to be counted)."""
    n = scan.count_items(memoryview(buf)[vs:ve])
    message = (
        "a second traceEvents key: a JSON object holds one value per key, so which event list "
        "is meant is unknown"
    )
    if dec.lenient:
        message += f"; only the first is read, the second's {n} entries are not"
    dec.damage(message, offset=shift + vs, events=n)

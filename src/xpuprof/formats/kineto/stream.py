"""Bytes in, for the Kineto reader: the decompressed text of a file block by block (on a
thread of its own, so gunzip overlaps decoding), and the top level of the JSON up to the
event list."""

from __future__ import annotations

import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from xpuprof.core.errors import TraceFormatError

#: Bytes read from the file at a time.
BLOCK_BYTES = 1 << 20

OBJ_DEC = msgspec.json.Decoder(dict[str, msgspec.Raw])


def file_blocks(
    path: Path, hasher: Any, on_damage: Callable[[str, int], None] | None = None
) -> Iterator[bytes]:
    """Yield the decompressed text of ``path`` block by block (gzip detected by magic bytes).

    Damaged gzip raises, or with ``on_damage`` (lenient imports) is reported there and ends
    the text early, so what decompressed before the damage is still read.
    """

    def damaged(message: str, offset: int) -> None:
        if on_damage is None:
            raise TraceFormatError(path, message, offset=offset)
        on_damage(message, offset)

    with open(path, "rb") as f:
        magic = f.read(2)
        f.seek(0)
        if magic != b"\x1f\x8b":
            while block := f.read(BLOCK_BYTES):
                hasher.update(block)
                yield block
            return
        dec = zlib.decompressobj(wbits=31)
        fed = False
        pos = 0  # compressed offset of the next byte read
        while block := f.read(BLOCK_BYTES):
            hasher.update(block)
            data, base = block, pos
            pos += len(block)
            while data:
                try:
                    out = dec.decompress(data)
                except zlib.error as e:
                    damaged(f"corrupt gzip data ({e})", base)
                    return
                fed = True
                if out:
                    yield out
                if not dec.eof:
                    break
                # Concatenated gzip members are legal: start a new one on what is left.
                rest = dec.unused_data
                base += len(data) - len(rest)
                data = rest
                dec = zlib.decompressobj(wbits=31)
                fed = False
        if fed and not dec.eof:
            if out := dec.flush():
                yield out
            damaged("truncated gzip stream (the file ends inside compressed data)", pos)


def threaded(gen: Iterator[bytes], depth: int = 4) -> Iterator[bytes]:
    """Run a block generator in a thread: zlib and file reads release the GIL, so gunzip
    overlaps with decoding on another core."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def run() -> None:
        try:
            for item in gen:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # handed to the consumer, which re-raises it
            q.put(e)

    t = threading.Thread(target=run, name="xpuprof-read", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


# ----------------------------------------------------------------------------------------------
# Top-level structure
# ----------------------------------------------------------------------------------------------

_STRUCT = re.compile(rb'[{}\[\]",:]')
_STRING_END = re.compile(rb'(?:[^"\\]|\\.)*"', re.S)
_WS = b" \t\r\n"


class NeedMore(Exception):
    pass


def find_events_array(buf: bytes) -> tuple[str, int, int]:
    """Locate the event list in the first bytes of a file.

    Returns ``(layout, prefix_end, body_start)``: layout ``"object"`` (``{"traceEvents": [``) or
    ``"array"`` (the whole file is a list of events); ``prefix_end`` is where the
    ``"traceEvents"`` key starts (object layout), ``body_start`` the byte after its ``[``.
    Raises ``NeedMore`` when ``buf`` ends before the answer is known, ``ValueError`` with a
    message and offset when the file is not a trace.
    """
    i = 0
    n = len(buf)
    while i < n and buf[i] in _WS:
        i += 1
    if i >= n:
        raise NeedMore
    first = buf[i : i + 1]
    if first == b"[":
        return "array", i, i + 1
    if first != b"{":
        raise ValueError(f"not a trace: the top-level JSON value starts with {first!r}", i)
    depth = 0
    pos = i
    last_string: tuple[int, int] | None = None
    while True:
        m = _STRUCT.search(buf, pos)
        if m is None:
            raise NeedMore
        c = m.group()
        p = m.start()
        if c == b'"':
            e = _STRING_END.match(buf, p + 1)
            if e is None:
                raise NeedMore
            last_string = (p, e.end())
            pos = e.end()
            continue
        if c in b"{[":
            depth += 1
        elif c in b"}]":
            depth -= 1
            if depth == 0:
                raise ValueError("not a Chrome trace: the top-level object has no traceEvents", p)
        elif c == b":" and depth == 1 and last_string is not None:
            key = buf[last_string[0] + 1 : last_string[1] - 1]
            if key == b"traceEvents":
                j = p + 1
                while j < n and buf[j] in _WS:
                    j += 1
                if j >= n:
                    raise NeedMore
                if buf[j : j + 1] != b"[":
                    raise ValueError("not a Chrome trace: traceEvents is not an array", j)
                return "object", last_string[0], j + 1
        last_string = None
        pos = p + 1


def decode_prefix(prefix: bytes) -> dict[str, msgspec.Raw]:
    """Decode the top-level keys written before traceEvents (``{ "a": 1, `` → ``{"a": 1}``)."""
    text = prefix.rstrip()
    if text.endswith(b","):
        text = text[:-1]
    return OBJ_DEC.decode(text + b"}")

"""Layer spans stamped by torch's own profiler: the names xpuprof's module hooks give torch's
record functions, and how a profiler segment's trace file turns those events into layer spans.

Why: at the ``op`` and ``full`` levels torch's profiler stamps every aten op with its clock
(the CPU's time-stamp counter, converted to Unix time by a converter calibrated at the
profiler's start and stop). Layer spans read the same counter in our hooks but had to be
converted by a converter of their own, calibrated at other moments; on a loaded machine the
two conversions disagreed by up to tens of microseconds (measured: 1.3–40 µs between markers
stamped by both), so an op near a module's boundary seemed to start inside the module's span
and end after it. So while torch's profiler records, each module call is also a torch record
function (``torch._C._profiler._RecordFunctionFast``, 0.4 µs more per call than reading the
clock), named by :func:`layer_mark`; torch stamps it exactly as it stamps the ops inside it, and
:func:`marks_to_spans` rewrites those events of the exported trace as xpuprof layer spans
(category ``xpuprof_layer``, named by module path, args ``module`` and ``pass``: the same
events ``LayerSpans.to_raw`` writes when there is no profiler), keeping torch's ``ts``/``dur``
text as it is. Layer spans and ops then nest exactly.

The rewrite is in place: a marker event as torch writes it is longer than the layer span that
replaces it (its name holds the path, type and pass; torch adds ids and whitespace), so each
event is overwritten and padded with spaces (whitespace between JSON values) through a
memory map: the file is neither read whole nor copied, and the work is proportional to the
number of layer spans, not to the file's size. Should a replacement ever be longer (another
torch's layout), the file is rewritten through a copy instead. A marker whose event cannot be
read as one (never seen) is left as torch wrote it and counted.
"""

from __future__ import annotations

import mmap
import os
import re
from pathlib import Path
from typing import Any

import msgspec

from xpuprof.core.names import CATEGORY_LAYER

#: The start of every marker's name.
MARK = "xpuprof_layer|"

_NEEDLE = b'"' + MARK.encode()
#: An event object holding at most one flat object (its args), as torch writes a marker: found
#: with one match; anything else (braces inside strings) by :data:`_TOKENS`.
_FLAT_EVENT = re.compile(rb"\{[^{}]*(?:\{[^{}]*\}[^{}]*)?\}")
#: JSON strings (skipped whole, escapes included) and braces: enough to find where any event
#: object ends.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}]', re.S)
#: The most bytes one marker event may take (torch writes about 300).
_MAX_EVENT = 1 << 16
_MISSING = msgspec.Raw(b"")


def layer_mark(path: str, kind: str, phase: str) -> str:
    """The record function's name for one module's ``phase`` (forward/backward) calls:
    ``xpuprof_layer|forward|6:Linear|blocks.0.mlp.0``. The type's length makes the name
    unambiguous whatever characters a module's name holds."""
    return f"{MARK}{phase}|{len(kind)}:{kind}|{path}"


def parse_mark(name: str) -> tuple[str, str, str] | None:
    """(path, kind, phase) of a marker name, or None if it is not one."""
    if not name.startswith(MARK):
        return None
    phase, sep, rest = name[len(MARK) :].partition("|")
    size, colon, rest = rest.partition(":")
    if not sep or not colon or not size.isdigit() or len(rest) <= int(size):
        return None
    n = int(size)
    if rest[n] != "|":
        return None
    return rest[n + 1 :], rest[:n], phase


class _Marked(msgspec.Struct, gc=False):
    """The fields of a marker event that the layer span keeps (times and ids as their text)."""

    ph: Any = None
    name: Any = None
    pid: msgspec.Raw = _MISSING
    tid: msgspec.Raw = _MISSING
    ts: msgspec.Raw = _MISSING
    dur: msgspec.Raw = _MISSING


_DECODE = msgspec.json.Decoder(_Marked)
_ENCODE = msgspec.json.Encoder()


def _event_at(buf: Any, at: int, flat: bool = True) -> tuple[int, int] | None:
    """Bounds of the event object whose name starts at ``at`` (the needle's quote); ``flat``:
    first try the one-match way."""
    start = buf.rfind(b"{", max(0, at - _MAX_EVENT), at)
    if start < 0:
        return None
    if flat:
        m = _FLAT_EVENT.match(buf, start, min(len(buf), start + _MAX_EVENT))
        if m is not None and m.end() > at:
            return start, m.end()
    depth = 0
    for m in _TOKENS.finditer(buf, start, min(len(buf), start + _MAX_EVENT)):
        tok = m.group()
        if tok == b"{":
            depth += 1
        elif tok == b"}":
            depth -= 1
            if depth == 0:
                return start, m.end()
    return None


def _span(text: bytes) -> bytes | None:
    """The layer span replacing one marker event, or None if ``text`` is not one."""
    try:
        ev = _DECODE.decode(text)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    parsed = parse_mark(ev.name) if isinstance(ev.name, str) else None
    if parsed is None or ev.ph != "X" or _MISSING in (ev.ts, ev.dur, ev.pid, ev.tid):
        return None
    path, kind, phase = parsed
    return _ENCODE.encode(
        {
            "ph": "X",
            "cat": CATEGORY_LAYER,
            "name": path,
            "pid": ev.pid,
            "tid": ev.tid,
            "ts": ev.ts,
            "dur": ev.dur,
            "args": {"module": kind, "pass": phase},
        }
    )


def marks_to_spans(path: str | Path) -> tuple[int, int]:
    """Rewrite the marker events of one exported trace file as layer spans, in place.

    Returns (spans written, markers left as they were)."""
    with open(path, "r+b") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return 0, 0
        with mmap.mmap(f.fileno(), 0) as buf:
            edits: list[tuple[int, int, bytes]] = []
            left = 0
            at = buf.find(_NEEDLE)
            while at >= 0:
                bounds = _event_at(buf, at)
                new = _span(buf[bounds[0] : bounds[1]]) if bounds is not None else None
                if new is None:  # braces inside its strings: read it token by token
                    bounds = _event_at(buf, at, flat=False)
                    new = _span(buf[bounds[0] : bounds[1]]) if bounds is not None else None
                if bounds is None or new is None or (edits and bounds[0] < edits[-1][1]):
                    left += 1
                    at = buf.find(_NEEDLE, at + 1)
                    continue
                edits.append((bounds[0], bounds[1], new))
                at = buf.find(_NEEDLE, bounds[1])
            if not edits:
                return 0, left
            if all(len(new) <= end - start for start, end, new in edits):
                for start, end, new in edits:
                    buf[start:end] = new + b" " * (end - start - len(new))
                return len(edits), left  # (no msync: readers see the page cache)
            _rewrite_copy(Path(path), buf, edits)
    return len(edits), left


def _rewrite_copy(path: Path, buf: Any, edits: list[tuple[int, int, bytes]]) -> None:
    """The file with ``edits`` applied, written beside it and renamed over it."""
    tmp = path.with_name(path.name + ".layers.tmp")
    try:
        with open(tmp, "wb") as out:
            pos = 0
            for start, end, new in edits:
                out.write(buf[pos:start])
                out.write(new)
                pos = end
            out.write(buf[pos:])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

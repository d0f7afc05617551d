"""Decoding one uncompressed Kineto file in byte ranges on several processes, then putting the
pieces together into the same :class:`~xpuprof.core.raw.RawTrace` a one-piece decode gives.

Why: one big file is otherwise one process's work, however many cores a machine has.

How the ranges are cut, and why that is sound without scanning the whole file first:

* ``plan`` reads the top level up to the event list's ``[`` and then, at even shares of the
  rest, the first ``}`` + ``,`` + ``{`` whose ``{`` starts what looks like an event (a
  *candidate* boundary: it may still lie inside a string or a nested value, since nothing
  before it has been read).
* ``decode_piece`` decodes one range with the one-piece decoder (``decode.Decoder``: fast
  chunks, the walker where they fail), as a list of its own: ``[`` + the range's bytes + ``]``.
  A range *succeeds* when that list decodes to its end with nothing dropped or damaged.
* A range that starts at a real entry boundary and succeeds ends at one too: its bytes parse
  from that boundary as whole entries separated by commas, so the real text is at list level
  right after the last one. The first range starts right after the real ``[``; hence, by
  induction, when *every* range succeeds every cut was a real boundary, and the pieces hold
  exactly the entries a one-piece decode reads, in the same order. A cut inside a string or a
  nested value makes the range before it fail (its text ends inside that string or value), and
  ``combine`` then returns None: the caller decodes the file in one piece, which gives the
  same tables, errors and lenient drops as always. Likewise anything a piece would drop,
  note, or number differently (damage, truncation, lenient drops) fails the piece: every
  error is reported by the one-piece decode, with its true place.
  A real negative pid/tid that a piece's own code for a string could be mistaken for
  (-1 … -number of strings) also leaves the file to the one-piece decode.

What is renumbered when the pieces are put together: ``index`` (position in ``traceEvents``:
a piece counts from 0, so piece k's is shifted by the entries of the pieces before it), the
negative codes of string pids/tids (each piece numbers its own strings from -1 in order of
first appearance; the combined map numbers them in order of first appearance in the file, as
the one-piece decode does) and the first event of the negative-``ts``/``dur`` notes. Category
and phase counts add up, keys kept in order of first appearance.

Pieces pass their columns through Arrow IPC stream files in a folder the caller gives (the
store's staging folder: the workers see it), written as they are decoded, so a worker holds at
most a few chunks of its range; ``combine`` reads them back and deletes them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.errors import TraceFormatError
from xpuprof.core.raw import KINDS, RAW_SCHEMA, RawTrace
from xpuprof.formats.gz import MAGIC
from xpuprof.formats.kineto import fields
from xpuprof.formats.kineto.columns import IdMaps
from xpuprof.formats.kineto.decode import Decoder
from xpuprof.formats.kineto.stream import BLOCK_BYTES, Text, threaded
from xpuprof.formats.kineto.top import read_remainder, read_top
from xpuprof.formats.kineto.values import Damage, Incomplete, TooDeep, value_end

#: A range is at least this long (bytes): below it the cost of a piece outweighs its share.
MIN_PIECE_BYTES = 64 << 20
#: Decoded columns a piece holds before it writes them to its IPC files.
SPILL_BYTES = 64 << 20
#: How far past a cut's nominal place the first candidate boundary is looked for.
_MAX_SEARCH = 64 << 20

#: How a piece's IPC file is opened to be combined: mapped, not read (the batches are the
#: file's pages, no copy), where the mapping outlives the file's name (POSIX); else read.
_OPEN_SPILLED = pa.memory_map if os.name == "posix" else pa.OSFile

_SEP = re.compile(rb"\}\s*,\s*\{")
_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])


@dataclass
class Plan:
    """Where one file is cut: ``ranges`` are (start, end) byte offsets of the file, each from
    an entry's first byte (the first: just after the list's ``[``) to just after a ``}`` (the
    last: None, the file's end); ``top`` the top-level keys before the event list."""

    path: str
    size: int
    mtime_ns: int
    layout: str
    top: dict[str, Any]
    ranges: list[tuple[int, int | None]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def splittable(path: str | Path) -> bool:
    """True for a file this module can cut: plain (not gzip) JSON text."""
    try:
        with open(path, "rb") as f:
            return f.read(2) != MAGIC
    except OSError:
        return False


def plan(path: str | Path, pieces: int) -> Plan | None:
    """Cut ``path`` into up to ``pieces`` ranges of the event list (at least
    ``MIN_PIECE_BYTES`` each); None when it cannot or need not be cut (gzip, a damaged or
    unusual top level, too small, no candidate boundary): the caller decodes it in one piece."""
    p = Path(path)
    if pieces < 2 or not splittable(p):
        return None
    st = p.stat()
    dec = Decoder(p, False, None)
    text = Text(_blocks(p, 0, None))
    top: dict[str, Any] = {}
    try:
        layout = read_top(dec, text, top)
    except TraceFormatError:
        return None  # the one-piece decode says what is wrong, and where
    start = text.offset
    span = st.st_size - start
    pieces = min(pieces, span // MIN_PIECE_BYTES)
    if pieces < 2:
        return None
    ranges: list[tuple[int, int | None]] = []
    origin = start
    with open(p, "rb") as f:
        for k in range(1, pieces):
            cut = _candidate(f, origin + k * span // pieces, st.st_size)
            if cut is None or cut[0] <= start:
                continue  # no boundary there, or one entry spans past this cut's place
            ranges.append((start, cut[0]))
            start = cut[1]
    if not ranges:
        return None
    ranges.append((start, None))
    return Plan(str(p), st.st_size, st.st_mtime_ns, layout, top, ranges)


def _candidate(f: Any, at: int, size: int) -> tuple[int, int] | None:
    """The first ``}``, ``,``, ``{`` at or after byte ``at`` whose ``{`` starts what looks like
    an event (:func:`_starts_event`): (just after its ``}``, its ``{``), or None when there is
    none in the next ``_MAX_SEARCH`` bytes. Looking skips most separators inside strings and
    nested values, each a cut that would fail and cost a one-piece decode; the pieces' own
    success is what proves a cut right (module docstring)."""
    width = 1 << 16
    pos = 0
    while True:
        f.seek(at)
        buf = f.read(width)
        eof = at + len(buf) >= size
        for m in _SEP.finditer(buf, pos):
            try:
                if _starts_event(buf, m.end() - 1, eof):
                    return at + m.start() + 1, at + m.end() - 1
            except Incomplete:
                break  # read more and look at this one again
            pos = m.end() - 1
        if width >= _MAX_SEARCH or eof:
            return None
        width *= 4


def _starts_event(buf: bytes, start: int, eof: bool) -> bool:
    """True when ``buf[start:]`` starts with a JSON object holding a ``ph`` key, followed by
    ``,`` or ``]``: an entry of the event list, or a rare lookalike. Raises ``Incomplete``
    when ``buf`` ends first and more may follow."""
    try:
        end = value_end(buf, start, len(buf), eof=eof)
    except (Damage, TooDeep):
        return False
    if end >= len(buf):
        if eof:
            return False
        raise Incomplete
    if buf[end] not in b",]":
        return False
    try:
        return "ph" in _MEMBERS.decode(memoryview(buf)[start:end])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False


def _blocks(path: Path, start: int, end: int | None) -> Iterator[bytes]:
    """The bytes ``[start, end)`` of the file block by block (``end`` None: to its end)."""
    with open(path, "rb") as f:
        f.seek(start)
        left = None if end is None else end - start
        while left is None or left > 0:
            block = f.read(BLOCK_BYTES if left is None else min(BLOCK_BYTES, left))
            if not block:
                return
            if left is not None:
                left -= len(block)
            yield block


def _closed(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """A range's bytes, then the ``]`` that makes them a list of their own."""
    yield from blocks
    yield b"]"


class _PieceIds(IdMaps):
    """The pid/tid maps of one piece, which also keep the real negative pid or tid closest to
    zero (Kineto writes some thread ids negative): one that a piece-local code could be mistaken
    for makes the piece unusable (``combine``)."""

    def __init__(self) -> None:
        super().__init__()
        self.real_negative: dict[str, int | None] = {"pid": None, "tid": None}

    def _note(self, kind: str, value: int | None) -> None:
        if value is not None:
            seen = self.real_negative[kind]
            self.real_negative[kind] = value if seen is None else max(seen, value)

    def saw_ints(self, kind: str, values: np.ndarray) -> None:
        neg = values[values < 0]
        self._note(kind, int(neg.max()) if len(neg) else None)

    def ids(self, kind: str, values: list[Any]) -> pa.Array:
        try:
            arr = pa.array(values, pa.int64())
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            neg = [v for v in values if type(v) is int and v < 0]
            self._note(kind, max(neg) if neg else None)
            return super().ids(kind, values)
        self.saw_ints(kind, pc.drop_null(arr).to_numpy())
        return arr


class _PieceDecoder(Decoder):
    """The one-piece decoder over one range, writing its columns to IPC files as it goes."""

    def __init__(self, path: Path, lenient: bool, spill: Path, tag: str) -> None:
        super().__init__(path, lenient, None)
        self.ctx = _PieceIds()
        self.spill = spill
        self.tag = tag
        self.held = 0
        self.writers: dict[str, Any] = {}
        self.files: dict[str, str] = {}

    def split(self, batch: pa.RecordBatch) -> None:
        super().split(batch)
        self.held += batch.nbytes
        if self.held >= SPILL_BYTES:
            self.write()

    def write(self) -> None:
        """Append the columns held to this piece's IPC files (one per kind of entry)."""
        for kind, batches in self.batches.items():
            if not batches:
                continue
            w = self.writers.get(kind)
            if w is None:
                name = f"{self.tag}-{kind}.arrows"
                w = self.writers[kind] = pa.ipc.new_stream(str(self.spill / name), RAW_SCHEMA)
                self.files[kind] = name
            for b in batches:
                w.write_batch(b)
            batches.clear()
        self.held = 0

    def close(self) -> None:
        for w in self.writers.values():
            w.close()
        self.writers = {}


def decode_piece(
    path: str,
    start: int,
    end: int | None,
    first: bool,
    layout: str,
    spill_dir: str,
    tag: str,
    lenient: bool = False,
) -> dict[str, Any]:
    """Decode the entries in bytes ``[start, end)`` of ``path`` (``end`` None: to the end of
    the file, the top-level keys after the list included); write their columns under
    ``spill_dir`` (files named from ``tag``) and return what ``combine`` needs, as plain data.
    ``ok`` is False when the range cannot be used as it is (see the module's docstring); its
    files are then removed."""
    p = Path(path)
    spill = Path(spill_dir)
    dec = _PieceDecoder(p, lenient, spill, tag)
    dec.after_comma = not first
    top: dict[str, Any] = {}
    ok = False
    try:
        blocks = _blocks(p, start, end)
        text = Text(threaded(blocks if end is None else _closed(blocks)))
        text.offset = start
        ended = dec.event_list(text) or dec.tail(text)
        if end is None:
            if ended:
                read_remainder(dec, text, layout, top)
        else:
            ended = ended and not text.rest().strip()
        dec.write()
        ok = ended and not dec.dropped and not dec.truncated
    except (TraceFormatError, OSError):
        ok = False
    finally:
        dec.close()
        fields.trim()
        if not ok:
            _remove(spill, dec.files.values())
        dec.batches = {}
        # hand what the piece freed back to the system: the worker that puts the pieces
        # together may be another process, and the peak is summed over all of them
        pa.default_memory_pool().release_unused()
    return {
        "ok": ok,
        "entries": dec.index,
        "files": dec.files if ok else {},
        "read_phase": dec.read_phase,
        "read_category": dec.read_category,
        "string_ids": {k: list(v) for k, v in dec.ctx.string_ids.items()},
        "real_negative": dec.ctx.real_negative,
        "negative": dec.negative,
        "top": top,
    }


def _remove(folder: Path, names: Any) -> None:
    for name in names:
        try:
            os.unlink(folder / name)
        except FileNotFoundError:
            pass


def discard(spill_dir: str, pieces: list[dict[str, Any]]) -> None:
    """Remove the IPC files of pieces that will not be combined."""
    for piece in pieces:
        _remove(Path(spill_dir), piece["files"].values())


def combine(
    plan_: dict[str, Any], pieces: list[dict[str, Any]], spill_dir: str, sha256: str
) -> RawTrace | None:
    """The RawTrace of the whole file from its pieces (in file order), identical to a
    one-piece decode's; None when a piece failed or the file changed since it was planned
    (the caller then decodes it in one piece). The pieces' files are removed either way."""
    folder = Path(spill_dir)
    try:
        p = Path(plan_["path"])
        st = p.stat()
        same = st.st_size == plan_["size"] and st.st_mtime_ns == plan_["mtime_ns"]
        if not same or not all(piece["ok"] for piece in pieces):
            return None
        dec = Decoder(p, False, None)
        maps = dec.ctx.string_ids
        shift = 0
        luts: list[dict[str, np.ndarray | None]] = []
        for piece in pieces:
            lut: dict[str, np.ndarray | None] = {}
            for kind, keys in piece["string_ids"].items():
                table = maps[kind]
                codes = [table.setdefault(key, -(len(table) + 1)) for key in keys]
                if codes == [-(i + 1) for i in range(len(keys))]:
                    lut[kind] = None  # numbered as the one-piece decode numbers them
                    continue
                real = piece["real_negative"][kind]
                if real is not None and real >= -len(keys):
                    return None  # a real id that looks like a piece's code: no telling apart
                lut[kind] = np.asarray(codes, dtype=np.int64)
            luts.append(lut)
            for counts, got in ((dec.read_phase, piece["read_phase"]),
                                (dec.read_category, piece["read_category"])):  # fmt: skip
                for key, n in got.items():
                    counts[key] = counts.get(key, 0) + n
            for name, (count, first) in piece["negative"].items():
                seen = dec.negative[name]
                if count and not seen[0]:
                    seen[1] = shift + first
                seen[0] += count
            shift += piece["entries"]
        shift = 0
        for piece, lut in zip(pieces, luts, strict=True):
            for kind in KINDS:
                name = piece["files"].get(kind)
                if name is None:
                    continue
                with _OPEN_SPILLED(str(folder / name), "rb") as f:
                    for batch in pa.ipc.open_stream(f):
                        dec.batches[kind].append(_renumber(batch, shift, lut))
                os.unlink(folder / name)
            shift += piece["entries"]
        top = dict(plan_["top"])
        top.update(pieces[-1]["top"])
        return dec.finish(top, plan_["size"], sha256)
    finally:
        discard(spill_dir, pieces)


def _renumber(
    batch: pa.RecordBatch, shift: int, lut: dict[str, np.ndarray | None]
) -> pa.RecordBatch:
    """A piece's batch with its file-wide ``index`` and pid/tid codes."""
    names = batch.schema.names
    if shift:
        i = names.index("index")
        batch = batch.set_column(i, "index", pc.add(batch.column(i), shift))
    for kind, codes in lut.items():
        if codes is None:
            continue
        i = names.index(kind)
        col = batch.column(i)
        local = pc.and_(pc.less(col, 0), pc.greater_equal(col, -len(codes)))
        if not pc.any(local).as_py():
            continue
        # a local code -k becomes codes[k - 1]; no real id lies in that range (``combine``)
        at = pc.subtract(pc.negate(pc.if_else(local, col, -1)), 1)
        batch = batch.set_column(i, kind, pc.if_else(local, pc.take(pa.array(codes), at), col))
    return batch


__all__ = ["MIN_PIECE_BYTES", "Plan", "combine", "decode_piece", "discard", "plan", "splittable"]

"""The Kineto reader's decoder: the top level of the file, then the event list a few megabytes
at a time into raw tables; damage is reported with the byte offset or event index, or
(lenient) left out entry by entry and listed.

Fast path: a chunk ends at the first ``}`` + ``,`` + ``{`` after ``CHUNK_BYTES``; if that spot
is inside a string or a nested value, msgspec rejects the chunk, so a chunk that decodes is
exactly a run of whole entries. Anything else — a bad split, damage, an entry that is not an
event, a value too deep to decode — hands the chunk to the walker (``walk.py``), which reads
one entry at a time from the chunk's start to the first entry boundary past ``CHUNK_BYTES``,
decoding the good entries in runs and naming the bad ones. Each byte is decoded a bounded number
of times, so the time is linear in the file whatever it holds.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.errors import TraceFormatError
from xpuprof.core.raw import KINDS, RAW_SCHEMA, Dropped, RawTrace
from xpuprof.formats.kineto import fields
from xpuprof.formats.kineto.columns import Event, IdMaps, columns, events_from_dicts, us_text_to_ns
from xpuprof.formats.kineto.errors import DECODE_ERRORS
from xpuprof.formats.kineto.stream import Text, file_blocks, threaded
from xpuprof.formats.kineto.top import read_remainder, read_top
from xpuprof.formats.kineto.values import (
    Damage,
    Incomplete,
    TooDeep,
    err_index,
    float_hook,
    skip_ws,
    value_end,
)
from xpuprof.formats.kineto.walk import walk

#: JSON text decoded per chunk; large enough to amortise per-call costs, small enough to bound RSS.
CHUNK_BYTES = 4 << 20

_SEP = re.compile(rb"\}\s*,\s*\{")

_EVENTS_DEC = msgspec.json.Decoder(list[Event], float_hook=float_hook)
_DICTS_DEC = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])

_KIND_OF_PHASE = {"s": 1, "t": 1, "f": 1, "C": 2, "M": 3}


class Decoder:
    """One file's decoding: the state shared by its chunks, and what a lenient read keeps."""

    def __init__(
        self,
        path: Path,
        lenient: bool,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.path = path
        self.lenient = lenient
        self.progress = progress
        self.ctx = IdMaps()
        self.batches: dict[str, list[pa.RecordBatch]] = {k: [] for k in KINDS}
        self.read_phase: dict[str, int] = {}
        self.read_category: dict[str, int] = {}
        self.index = 0  # position in the event list of the next entry
        self.dropped: list[Dropped] = []
        self.notes: list[str] = []
        self.negative: dict[str, list[int]] = {"ts": [0, -1], "dur": [0, -1]}
        self.compressed = False
        self.truncated = False
        self.gzip: Dropped | None = None  # damage to the gzip stream, if any
        self.after_comma = False  # the entry at the text's base follows a "," (not the "[")

    # -- errors ----------------------------------------------------------------------------------

    def fail(self, message: str, *, offset: int | None = None, index: int | None = None):
        raise TraceFormatError(
            self.path, message, offset=offset, event_index=index, compressed=self.compressed
        )

    def damage(
        self, message: str, *, offset: int | None, index: int | None = None, events: int = 1
    ) -> None:
        """Damage a lenient read survives (recorded: what, where, how many entries it cost;
        consecutive entries dropped for the same reason are one record, with the first one's
        place) and a strict one does not."""
        if not self.lenient:
            self.fail(message, offset=offset, index=index)
        last = self.dropped[-1] if self.dropped else None
        if (
            last is not None
            and index is not None
            and last.event_index is not None
            and last.reason == message
            and last.event_index + last.events == index
        ):
            last.events += events  # a run of entries dropped for one reason: one record
            return
        self.dropped.append(Dropped(message, events, offset=offset, event_index=index))

    def gzip_damage(self, message: str, file_offset: int) -> None:
        """Lenient reads: damaged gzip ends the text early; reported with the file's byte."""
        self.truncated = True
        self.gzip = Dropped(f"{message}: the rest of the file is lost", 0, file_offset=file_offset)

    # -- decoding of one run of entries ----------------------------------------------------------

    def decode_events(self, text: bytes | memoryview) -> int:
        """Decode ``[entry, …]`` text, numbered from ``self.index``, and keep it; return the
        number of entries. Raises one of ``DECODE_ERRORS`` (having kept nothing) when an entry
        is bad, or :class:`TraceFormatError` when a strict read meets an event it rejects.
        The compiled scanner (``fields.py``) reads the run when it is built and takes it."""
        batch = fields.batch(text, self.index, self.ctx)
        if batch is not None:
            if batch.num_rows:
                self.keep(batch, batch.num_rows)
            return batch.num_rows
        try:
            evs = _EVENTS_DEC.decode(text)
            extra = None
        except msgspec.ValidationError as e:
            if "unknown field" not in str(e):
                raise
            evs, extra = events_from_dicts(_DICTS_DEC.decode(text))
        if evs:
            self.keep(columns(evs, self.index, self.ctx, extra), len(evs))
        return len(evs)

    def fast(self, text: bytes | memoryview) -> bool:
        """Decode a run of entries the fast way; False (nothing kept) when something in it
        needs the walker."""
        try:
            n = self.decode_events(text)
        except DECODE_ERRORS:
            return False
        self.index += n
        return True

    def first_bad(self, text: bytes) -> int | None:
        """The entry of a run that msgspec names as the first one it cannot decode, if any."""
        try:
            _EVENTS_DEC.decode(text)
        except msgspec.ValidationError as e:
            if "unknown field" not in str(e):
                return err_index(e)
        except DECODE_ERRORS:
            pass
        return None

    def keep(self, batch: pa.RecordBatch, n: int) -> None:
        """Check a decoded batch (entries ``self.index``…), drop what a lenient read cannot
        keep, note negative times, and file the rest."""
        ts_text, dur_text = batch.column("ts"), batch.column("dur")
        ts, bad_ts = us_text_to_ns(ts_text)
        dur, bad_dur = us_text_to_ns(dur_text)
        batch = batch.set_column(6, "ts", ts).set_column(7, "dur", dur)
        ph = batch.column("ph")
        no_ts = np.asarray(pc.fill_null(pc.and_(pc.is_null(ts), pc.not_equal(ph, "M")), False))
        if bad_ts is not None:
            no_ts = no_ts & ~bad_ts
        checks = [
            (np.asarray(pc.is_null(ph)), "event has no ph", None),
            (bad_ts, "ts is not a number in range", ts_text),
            (bad_dur, "dur is not a number in range", dur_text),
            (no_ts, "event has no ts", None),
        ]
        drop = np.zeros(n, dtype=bool)
        for mask, what, text in checks:
            if mask is None:
                continue
            mask = mask & ~drop  # an entry is dropped once, for the first reason found
            if not mask.any():
                continue
            first = int(np.flatnonzero(mask)[0])
            if text is not None:
                what = f"{what} ({text[first].as_py()!r})"
            if not self.lenient:
                self.fail(what, index=self.index + first)
            self.dropped.append(Dropped(what, int(mask.sum()), event_index=self.index + first))
            drop |= mask
        self.count_negative(ts, dur, drop)
        if drop.any():
            batch = batch.filter(pa.array(~drop))
        self.split(batch)

    def count_negative(self, ts: pa.Array, dur: pa.Array, drop: np.ndarray) -> None:
        """Count kept entries with a negative ts or dur (and the first one), for the notes."""
        for name, col in (("ts", ts), ("dur", dur)):
            neg = np.asarray(pc.fill_null(pc.less(col, 0), False)) & ~drop
            if neg.any():
                seen = self.negative[name]
                if not seen[0]:
                    seen[1] = self.index + int(np.flatnonzero(neg)[0])
                seen[0] += int(neg.sum())

    def split(self, batch: pa.RecordBatch) -> None:
        """Count the chunk's entries, then file each under the table it will feed: splitting
        chunk by chunk keeps a huge file from ever existing twice in memory."""
        ph = batch.column("ph")
        for counts, col in ((self.read_phase, ph), (self.read_category, batch.column("cat"))):
            for row in pc.value_counts(col).to_pylist():
                key = "" if row["values"] is None else row["values"]
                counts[key] = counts.get(key, 0) + row["counts"]
        codes = pa.array(
            [_KIND_OF_PHASE.get(v, 0) for v in ph.dictionary.to_pylist()], pa.int8()
        ).take(ph.indices)
        kinds = np.asarray(codes.to_numpy(zero_copy_only=False))
        present = np.unique(kinds)
        if len(present) == 1:
            self.batches[KINDS[int(present[0])]].append(batch)
            return
        for k in present.tolist():
            self.batches[KINDS[k]].append(batch.filter(pa.array(kinds == k)))

    # -- the file --------------------------------------------------------------------------------

    def read(self) -> RawTrace:
        hasher = hashlib.sha256()
        size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            self.compressed = f.read(2) == b"\x1f\x8b"
        on_damage = self.gzip_damage if self.lenient else None
        text = Text(threaded(file_blocks(self.path, hasher, on_damage)))
        top: dict[str, Any] = {}
        layout = read_top(self, text, top)
        ended = self.event_list(text) or self.tail(text)
        if ended:
            read_remainder(self, text, layout, top)
        if self.gzip is not None:
            self.gzip.offset = text.offset + text.avail
            self.dropped.insert(0, self.gzip)
        if self.progress:
            self.progress(text.offset + text.avail)
        return self.finish(top, size, hasher.hexdigest())

    def event_list(self, text: Text) -> bool:
        """Decode the event list chunk by chunk, up to the last ``CHUNK_BYTES`` or so (the
        tail, which holds the list's end). True when the list's end was reached on the way
        (``text`` then stands just after its ``]``)."""
        while True:
            text.fill(2 * CHUNK_BYTES)
            if text.eof:
                return False
            m = _SEP.search(text.buf, text.base + CHUNK_BYTES)
            if m is None:
                text.more()
                continue
            end = m.start() + 1
            chunk = b"".join((b"[", memoryview(text.buf)[text.base : end], b"]"))
            if self.fast(chunk):
                text.advance(m.end() - 1 - text.base)
                self.after_comma = True
            elif walk(self, text, stop=CHUNK_BYTES):
                return True
            if self.progress:
                self.progress(text.offset)

    def tail(self, text: Text) -> bool:
        """The rest of the event list, once the whole file is read: one decode when it is
        sound, else the walker. True when the list's ``]`` was reached."""
        rest = text.rest()
        p = skip_ws(rest, 0, len(rest))
        first = rest[p : p + 1]
        if first and not (self.after_comma and first == b"]"):
            body = b"[" + rest
            try:
                end = value_end(body, 0, len(body), eof=True)
            except (Damage, Incomplete, TooDeep):
                end = None
            if end is not None and self.fast(memoryview(body)[:end]):
                text.advance(end - 1)
                return True
        return walk(self, text, stop=None)

    def finish(self, top: dict[str, Any], size: int, digest: str) -> RawTrace:
        tables = {
            k: pa.Table.from_batches(b, schema=RAW_SCHEMA) if b else RAW_SCHEMA.empty_table()
            for k, b in self.batches.items()
        }
        self.batches = {}
        for name, (count, first) in self.negative.items():
            if count:
                self.notes.append(
                    f"{count} event(s) have a negative {name} (the first: event {first} of "
                    + (
                        "traceEvents): kept, with no duration (null dur; the source's value is "
                        "in extra), as a profiler writes for an event it never saw end"
                        if name == "dur"
                        else "traceEvents): kept as they are (times before the trace's zero)"
                    )
                )
        return RawTrace(
            path=str(self.path),
            tables=tables,
            read_phase=self.read_phase,
            read_category=self.read_category,
            top=top,
            string_ids={
                k: {str(code): key for key, code in v.items()}
                for k, v in self.ctx.string_ids.items()
            },
            size=size,
            sha256=digest,
            compressed=self.compressed,
            dropped=self.dropped,
            truncated=self.truncated,
            format="kineto",
            notes=self.notes,
        )


def read(
    path: str | Path,
    *,
    lenient: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RawTrace:
    """``formats.kineto.read_kineto``, once the decoder is imported."""
    p = Path(path)
    if not p.is_file():
        raise TraceFormatError(p, "no such file")
    try:
        return Decoder(p, lenient, progress).read()
    finally:
        fields.trim()  # the scanner's scratch memory: held while a file is read, not after

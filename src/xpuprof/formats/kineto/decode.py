"""The Kineto reader's decoder: the event list, a few megabytes at a time, into raw tables;
damage reported with the byte offset or event index, or (lenient) salvaged event by event.

The split of the event array into chunks needs no JSON tokenizer of our own: a chunk ends at a
``}`` followed by ``,`` and ``{``; if that spot was inside a string or a nested value, msgspec
rejects the chunk at its very end and the next candidate is tried, so a chunk that decodes is
exactly a run of whole events.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.errors import TraceFormatError
from xpuprof.core.raw import KINDS, RAW_SCHEMA, Dropped, RawTrace
from xpuprof.formats.kineto.columns import (
    ANY_DEC,
    Event,
    IdMaps,
    columns,
    events_from_dicts,
    us_text_to_ns,
)
from xpuprof.formats.kineto.stream import (
    BLOCK_BYTES,
    OBJ_DEC,
    NeedMore,
    decode_prefix,
    file_blocks,
    find_events_array,
    threaded,
)

#: JSON text decoded per chunk; large enough to amortise per-call costs, small enough to bound RSS.
CHUNK_BYTES = 4 << 20

_SEP = re.compile(rb"\}\s*,\s*\{")

_EVENTS_DEC = msgspec.json.Decoder(list[Event])
_DICTS_DEC = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])

_KIND_OF_PHASE = {"s": 1, "t": 1, "f": 1, "C": 2, "M": 3}


def _err_offset(e: Exception) -> int | None:
    m = re.search(r"\(byte (\d+)\)", str(e))
    return int(m.group(1)) if m else None


def _err_index(e: Exception) -> int | None:
    m = re.search(r"\$\[(\d+)\]", str(e))
    return int(m.group(1)) if m else None


class _Text:
    """The decompressed text read so far; ``buf[base:]`` is what is not decoded yet."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks = blocks
        self.buf = b""
        self.base = 0
        self.eof = False

    def fill(self, target: int) -> None:
        """Make ``buf[base:]`` at least ``target`` bytes long (or hold the rest of the file),
        copying the kept part once rather than once per block."""
        parts: list[Any] = [memoryview(self.buf)[self.base :]]
        have = len(self.buf) - self.base
        while have < target and not self.eof:
            try:
                block = next(self.blocks)
            except StopIteration:
                self.eof = True
                break
            parts.append(block)
            have += len(block)
        if len(parts) > 1:
            self.buf = b"".join(parts)
            self.base = 0


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
        self.index = 0
        self.dropped: list[Dropped] = []
        self.compressed = False
        self.truncated = False

    def fail(self, message: str, *, offset: int | None = None, index: int | None = None):
        raise TraceFormatError(
            self.path, message, offset=offset, event_index=index, compressed=self.compressed
        )

    # -- decoding of one run of events ---------------------------------------------------------

    def decode_run(self, text: bytes, abs_offset: int, *, final: bool) -> bool:
        """Decode ``[ev, ev, …]`` text; return False when the split point was bad (retry).

        ``abs_offset`` is the position in the file's JSON of ``text[1]`` (after our ``[``).
        """
        try:
            evs = _EVENTS_DEC.decode(text)
            extra = None
        except msgspec.ValidationError as e:
            if "unknown field" not in str(e):
                idx = _err_index(e)
                if idx is None:
                    return self.bad_text(text, abs_offset, e, final)
                return self.bad_entry(text, abs_offset, e, idx)
            try:
                evs, extra = events_from_dicts(_DICTS_DEC.decode(text))
            except msgspec.ValidationError as e2:
                idx = _err_index(e2)
                if idx is None:
                    return self.bad_text(text, abs_offset, e2, final)
                return self.bad_entry(text, abs_offset, e2, idx)
            except msgspec.DecodeError as e2:
                return self.bad_text(text, abs_offset, e2, final)
        except msgspec.DecodeError as e:
            return self.bad_text(text, abs_offset, e, final)
        self.add(evs, extra)
        return True

    def bad_text(self, text: bytes, abs_offset: int, e: Exception, final: bool) -> bool:
        off = _err_offset(e)
        at_end = off is None or off >= len(text) - 1
        if at_end and not final:
            return False  # the split landed inside a string or a nested value
        where = abs_offset + (off - 1 if off is not None else len(text) - 2)
        if off is None and "truncated" in str(e):
            msg = "truncated JSON: the file ends inside the event list"
            where = abs_offset + len(text) - 2
            self.truncated = True
        else:
            msg = f"malformed JSON ({str(e).split(' (byte')[0]})"
        if not self.lenient:
            self.fail(msg, offset=where)
        self.salvage(text[1:-1], abs_offset, final)
        return True

    def bad_entry(self, text: bytes, abs_offset: int, e: Exception, idx: int) -> bool:
        msg = f"traceEvents entry is not an event ({str(e).split(' - at')[0]})"
        if not self.lenient:
            self.fail(msg, index=self.index + idx)
        self.salvage(text[1:-1], abs_offset, final=True)
        return True

    def salvage(self, body: bytes, abs_offset: int, final: bool) -> None:
        """Lenient mode: decode a damaged run event by event, keep what parses.

        Pieces are cut at every ``}, {``; a piece that does not decode is retried joined with
        the next ones (the cut may have been inside a value) before it is dropped and reported.
        """
        cuts = list(_SEP.finditer(body))
        starts = [0] + [m.end() - 1 for m in cuts]
        ends = [m.start() + 1 for m in cuts] + [len(body)]
        run: list[Event] = []
        extra: list[bytes | None] = []
        i = 0
        while i < len(starts):
            got = None
            rest = None
            for j in range(i, min(i + 16, len(starts))):
                piece = body[starts[i] : ends[j]]
                if final and j == len(starts) - 1:
                    piece = _close_partial(piece)
                try:
                    got = OBJ_DEC.decode(piece)
                except msgspec.DecodeError as e:
                    # a whole event followed by junk: keep the event, report only the junk,
                    # and go on with whatever events follow the junk in the same piece
                    cut = _err_offset(e) if j == i else None
                    cut = piece.rfind(b"}", 0, cut + 1) + 1 if cut else 0
                    if not cut:
                        continue
                    try:
                        got = OBJ_DEC.decode(piece[:cut])
                    except msgspec.DecodeError:
                        continue
                    junk = cut + len(piece[cut:]) - len(piece[cut:].lstrip())
                    self.dropped.append(
                        Dropped(
                            "unparseable text between events",
                            0,
                            offset=abs_offset + starts[i] + junk,
                        )
                    )
                    m = re.compile(rb",\s*\{").search(body, starts[i] + cut, ends[j])
                    if m:
                        rest = (m.end() - 1, ends[j])
                i_next = j + 1
                break
            if got is None:
                self.add(run, extra)
                run, extra = [], []
                reason = "unparseable JSON (damaged or truncated)"
                if final and i == len(starts) - 1:
                    reason = "truncated JSON (the last, partial event)"
                self.dropped.append(
                    Dropped(reason, 1, offset=abs_offset + starts[i], event_index=self.index)
                )
                self.index += 1
                i += 1
                continue
            evs, ex = events_from_dicts([got])
            run.extend(evs)
            extra.extend(ex)
            if rest is not None:
                self.add(run, extra)
                run, extra = [], []
                self.salvage(
                    body[rest[0] : rest[1]],
                    abs_offset + rest[0],
                    final and i_next == len(starts),
                )
            i = i_next
        self.add(run, extra)

    def add(self, evs: list[Event], extra: list | None) -> None:
        if not evs:
            return
        batch = columns(evs, self.index, self.ctx, extra)
        n = len(evs)
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
            if mask is None or not mask.any():
                continue
            first = int(np.flatnonzero(mask)[0])
            if text is not None:
                what = f"{what} ({text[first].as_py()!r})"
            if not self.lenient:
                self.fail(what, index=self.index + first)
            self.dropped.append(Dropped(what, int(mask.sum()), event_index=self.index + first))
            drop |= mask
        if drop.any():
            batch = batch.filter(pa.array(~drop))
        self.split(batch)
        self.index += n

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
        text = _Text(threaded(file_blocks(self.path, hasher, on_damage)))
        top: dict[str, Any] = {}
        layout, consumed = self.top_level(text, top)
        consumed = self.event_list(text, consumed)
        buf = text.buf[text.base :]
        # the tail: the last events and whatever closes the file
        self.read_tail(buf, consumed, layout, top)
        if self.progress:
            self.progress(consumed + len(buf))
        return self.finish(top, size, hasher.hexdigest())

    def gzip_damage(self, message: str, offset: int) -> None:
        """Lenient reads: damaged gzip ends the text early, and is reported."""
        self.truncated = True
        self.dropped.append(Dropped(f"{message} at compressed byte {offset}: the rest is lost", 0))

    def top_level(self, text: _Text, top: dict[str, Any]) -> tuple[str, int]:
        """Read up to the event list (its layout and the top-level keys before it); return the
        layout and the offset of the list's first byte, where ``text.base`` now stands."""
        while True:
            try:
                layout, prefix_end, body_start = find_events_array(text.buf)
                break
            except NeedMore:
                before = len(text.buf)
                text.fill(before + 1)
                if len(text.buf) == before:  # the file ended before the answer
                    if not text.buf.strip():
                        self.fail("empty file: no JSON value")
                    self.fail("truncated JSON: the file ends before the event list", offset=before)
            except ValueError as e:
                self.fail(e.args[0], offset=e.args[1])
        if layout == "object":
            try:
                top.update(decode_prefix(text.buf[:prefix_end]))
            except msgspec.DecodeError as e:
                off = _err_offset(e)
                self.fail(f"malformed JSON before traceEvents ({e})", offset=off)
        text.base = body_start
        return layout, body_start

    def event_list(self, text: _Text, consumed: int) -> int:
        """Decode the event list chunk by chunk, up to the last ``CHUNK_BYTES`` or so (the
        tail, which holds the list's end); return the offset of ``text.base``."""
        while True:
            text.fill(2 * CHUNK_BYTES)
            if text.eof:
                return consumed
            base = text.base
            pos = base + CHUNK_BYTES
            while True:
                m = _SEP.search(text.buf, pos)
                if m is None:
                    before = len(text.buf) - base
                    text.fill(before + BLOCK_BYTES)
                    base = text.base
                    if len(text.buf) - base == before:
                        break
                    pos = base + before - 8
                    continue
                end = m.start() + 1
                chunk = b"".join((b"[", memoryview(text.buf)[base:end], b"]"))
                if self.decode_run(chunk, consumed, final=False):
                    nxt = m.end() - 1
                    consumed += nxt - base
                    text.base = nxt
                    if self.progress:
                        self.progress(consumed)
                    break
                pos = m.end()
            if text.eof:
                return consumed

    def finish(self, top: dict[str, Any], size: int, digest: str) -> RawTrace:
        decoded_top = {k: ANY_DEC.decode(v) for k, v in top.items() if k != "traceEvents"}
        tables = {
            k: pa.Table.from_batches(b, schema=RAW_SCHEMA) if b else RAW_SCHEMA.empty_table()
            for k, b in self.batches.items()
        }
        self.batches = {}
        return RawTrace(
            path=str(self.path),
            tables=tables,
            read_phase=self.read_phase,
            read_category=self.read_category,
            top=decoded_top,
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
        )

    def read_tail(self, buf: bytes, consumed: int, layout: str, top: dict) -> None:
        head = b'{"traceEvents":[' if layout == "object" else b"["
        text = head + buf
        try:
            if layout == "object":
                rest = OBJ_DEC.decode(text)
                events_raw = bytes(rest.pop("traceEvents"))
                top.update(rest)
            else:
                events_raw = text
            self.decode_run(events_raw, consumed, final=True)
        except msgspec.DecodeError as e:
            off = _err_offset(e)
            if "truncated" in str(e):
                msg = "truncated JSON: the file ends inside the event list"
                where = consumed + len(buf)
                self.truncated = True
            else:
                msg = f"malformed JSON ({str(e).split(' (byte')[0]})"
                where = consumed + (off - len(head) if off is not None else len(buf))
            if not self.lenient:
                self.fail(msg, offset=where)
            self.truncated = self.truncated or "truncated" in msg
            self.salvage(buf, consumed, final=True)


def _close_partial(piece: bytes) -> bytes:
    """Strip what may close the list (``]``, the top-level ``}`` and keys after it) from the
    last piece of a lenient salvage, so a whole final event decodes on its own."""
    text = piece.strip()
    # The last event of a well-formed tail is followed by "]" and maybe more top-level keys.
    k = text.rfind(b"]")
    while k != -1:
        cand = text[:k].rstrip()
        if cand.endswith(b"}"):
            try:
                msgspec.json.decode(cand)
                return cand
            except msgspec.DecodeError:
                pass
        k = text.rfind(b"]", 0, k)
    return text


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
    return Decoder(p, lenient, progress).read()

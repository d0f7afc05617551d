"""Reader for PyTorch profiler (Kineto) and other Chrome-trace JSON files.

Why it looks the way it does:

* **Speed.** Events are decoded with msgspec into small typed structs, a few megabytes of JSON
  at a time, and turned into Arrow columns at once, so no per-event Python dict is ever built and
  memory stays bounded by the chunk size plus the columns (a 2 GB file fits in a few GB).
* **Exact time.** Kineto writes microseconds as decimals carrying nanoseconds
  (``1712195495519689.047``); a float64 cannot hold that, so ``ts``/``dur`` are kept as their raw
  JSON text and converted to integer nanoseconds through Arrow's decimal cast.
* **Lossless.** Every entry of ``traceEvents`` becomes a row; its ``args`` object is kept as its
  original JSON text, unknown top-level keys of an entry go to ``extra``, string pids/tids are
  mapped to negative integers with the mapping kept, and every other top-level key of the file
  (``deviceProperties``, ``distributedInfo``, …) is returned as ``top``.
* **Clear errors.** Damage is reported with the file and the byte offset (of the decompressed
  text for ``.gz``) or the event index; with ``lenient=True`` what parses is kept and every
  dropped piece is reported with its reason.

The split of the event array into chunks needs no JSON tokenizer of our own: a chunk ends at a
``}`` followed by ``,`` and ``{``; if that spot was inside a string or a nested value, msgspec
rejects the chunk at its very end and the next candidate is tried, so a chunk that decodes is
exactly a run of whole events.
"""

from __future__ import annotations

import hashlib
import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.errors import TraceFormatError
from xpuprof.core.raw import DICT_STRING, KINDS, RAW_SCHEMA, Dropped, RawTrace

#: JSON text decoded per chunk; large enough to amortise per-call costs, small enough to bound RSS.
CHUNK_BYTES = 4 << 20
#: Bytes read from the file at a time.
BLOCK_BYTES = 1 << 20

_MISSING = msgspec.Raw(b"")
_SEP = re.compile(rb"\}\s*,\s*\{")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class _Event(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The fields of a Chrome-trace event that we read; anything else takes the slow path."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = _MISSING
    dur: msgspec.Raw = _MISSING
    id: Any = None
    bp: Any = None
    s: Any = None
    args: msgspec.Raw = _MISSING


_KNOWN_KEYS = frozenset(_Event.__struct_fields__)


class _ArgSel(msgspec.Struct, gc=False):
    """The few args the data model lifts into typed columns; the whole object stays in ``args``."""

    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_2021: Any = msgspec.field(default=None, name="external id")
    device: Any = None
    stream: Any = None
    bytes: Any = None


_EVENTS_DEC = msgspec.json.Decoder(list[_Event])
_DICTS_DEC = msgspec.json.Decoder(list[dict[str, msgspec.Raw]])
_OBJ_DEC = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ARGS_DEC = msgspec.json.Decoder(list[_ArgSel | None])
_ANY_DEC = msgspec.json.Decoder()


_KIND_OF_PHASE = {"s": 1, "t": 1, "f": 1, "C": 2, "M": 3}


# ----------------------------------------------------------------------------------------------
# Bytes in
# ----------------------------------------------------------------------------------------------


def _file_blocks(
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


def _threaded(gen: Iterator[bytes], depth: int = 4) -> Iterator[bytes]:
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


class _NeedMore(Exception):
    pass


def _find_events_array(buf: bytes) -> tuple[str, int, int]:
    """Locate the event list in the first bytes of a file.

    Returns ``(layout, prefix_end, body_start)``: layout ``"object"`` (``{"traceEvents": [``) or
    ``"array"`` (the whole file is a list of events); ``prefix_end`` is where the
    ``"traceEvents"`` key starts (object layout), ``body_start`` the byte after its ``[``.
    Raises ``_NeedMore`` when ``buf`` ends before the answer is known, ``ValueError`` with a
    message and offset when the file is not a trace.
    """
    i = 0
    n = len(buf)
    while i < n and buf[i] in _WS:
        i += 1
    if i >= n:
        raise _NeedMore
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
            raise _NeedMore
        c = m.group()
        p = m.start()
        if c == b'"':
            e = _STRING_END.match(buf, p + 1)
            if e is None:
                raise _NeedMore
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
                    raise _NeedMore
                if buf[j : j + 1] != b"[":
                    raise ValueError("not a Chrome trace: traceEvents is not an array", j)
                return "object", last_string[0], j + 1
        last_string = None
        pos = p + 1


def _decode_prefix(prefix: bytes) -> dict[str, msgspec.Raw]:
    """Decode the top-level keys written before traceEvents (``{ "a": 1, `` → ``{"a": 1}``)."""
    text = prefix.rstrip()
    if text.endswith(b","):
        text = text[:-1]
    return _OBJ_DEC.decode(text + b"}")


# ----------------------------------------------------------------------------------------------
# Columns out
# ----------------------------------------------------------------------------------------------


def _raw_strings(raws: list[Any]) -> pa.LargeStringArray:
    """Build a string array from raw JSON slices without a Python object per element."""
    n = len(raws)
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = b"".join(raws)
    valid = lens > 0
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(data), validity, null_count=int(n - valid.sum())
    )


def _us_text_to_ns(text: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """Convert microsecond decimal text to int64 nanoseconds exactly (no float round trip).

    Returns the values and, when some text is not a finite number in range, a mask of those
    entries (their value is null).
    """
    try:
        dec = text.cast(pa.decimal128(24, 3))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        try:
            dec = pc.round(text.cast(pa.decimal128(38, 9)), ndigits=3).cast(pa.decimal128(38, 3))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _us_text_to_ns_slow(text)
    n = len(dec)
    if n == 0:
        return pa.array([], pa.int64()), None
    words = np.frombuffer(dec.buffers()[1], dtype=np.int64, count=2 * (n + dec.offset))
    low = words[2 * dec.offset :: 2]
    high = words[2 * dec.offset + 1 :: 2]
    # The value fits in int64 when the high word is the sign extension of the low word.
    if not np.array_equal(high, np.where(low < 0, -1, 0)):
        return _us_text_to_ns_slow(text)
    return pa.array(low.copy(), pa.int64(), mask=np.asarray(dec.is_null())), None


def _us_text_to_ns_slow(text: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """Per-value fallback for spellings Arrow's decimal cast rejects (quoted numbers, NaN,
    values beyond int64 nanoseconds): each bad one is flagged, not fatal, so the caller can
    name the event or, when lenient, drop just that event."""
    from decimal import Decimal, InvalidOperation

    out: list[int | None] = []
    bad = np.zeros(len(text), dtype=bool)
    for i, v in enumerate(text.to_pylist()):
        if v is None:
            out.append(None)
            continue
        try:
            d = Decimal(v.strip().strip('"'))
        except InvalidOperation:
            d = None
        ns = int((d * 1000).to_integral_value()) if d is not None and d.is_finite() else None
        if ns is None or not _INT64_MIN <= ns <= _INT64_MAX:
            bad[i] = True
            ns = None
        out.append(ns)
    return pa.array(out, pa.int64()), bad if bad.any() else None


def _int64_column(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        out = []
        for v in values:
            if isinstance(v, bool):
                v = int(v)
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if isinstance(v, str):
                try:
                    v = int(v)
                except ValueError:
                    v = None
            out.append(v if isinstance(v, int) and _INT64_MIN <= v <= _INT64_MAX else None)
        return pa.array(out, pa.int64())


def _float_column(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        out = []
        for v in values:
            try:
                out.append(None if v is None or isinstance(v, bool) else float(v))
            except (TypeError, ValueError):
                out.append(None)
        return pa.array(out, pa.float64())


def _string_column(values: list[Any], typ: pa.DataType | None = None) -> pa.Array:
    """Strings as they come; anything else (a number as a name, say) as its JSON text.
    Repetitive columns are built as dictionaries right away: a name then costs 4 bytes."""
    typ = typ or pa.string()
    try:
        return pa.array(values, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array(
            [
                v if v is None or isinstance(v, str) else msgspec.json.encode(v).decode()
                for v in values
            ],
            typ,
        )


def _id_column(values: list[Any]) -> pa.Array:
    """Flow ids are integers in Kineto and strings in other tools: store their text."""
    try:
        return pa.array(values).cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return _string_column(values)


class _Ctx:
    """Per-file state shared by all chunks: the string → id maps for pid and tid."""

    def __init__(self) -> None:
        self.string_ids: dict[str, dict[Any, int]] = {"pid": {}, "tid": {}}

    def ids(self, kind: str, values: list[Any]) -> pa.Array:
        try:
            return pa.array(values, pa.int64())
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
        table = self.string_ids[kind]
        out = list(values)
        for i, v in enumerate(out):
            if v is None or type(v) is int and _INT64_MIN <= v <= _INT64_MAX:
                continue
            if isinstance(v, str) and v.isdigit() and len(v) < 19:
                # 2021 traces quote thread ids ("25738"): keep them the numbers they are.
                out[i] = int(v)
                continue
            key = v if isinstance(v, str) else msgspec.json.encode(v).decode()
            code = table.get(key)
            if code is None:
                # Names (and oddities: floats, huge ints) get ids below zero; real pids and tids
                # are never negative, and the map travels with the store.
                code = -(len(table) + 1)
                table[key] = code
            out[i] = code
        return pa.array(out, pa.int64())


def _columns(
    evs: list[_Event], index0: int, ctx: _Ctx, extra: list[bytes | None] | None = None
) -> pa.RecordBatch:
    n = len(evs)
    ph = [e.ph for e in evs]
    args = [e.args for e in evs]
    sel = _ARGS_DEC.decode(b"[" + b",".join([a or b"null" for a in args]) + b"]")
    cols: dict[str, pa.Array] = {
        "index": pa.array(np.arange(index0, index0 + n, dtype=np.int64)),
        "ph": _string_column(ph, DICT_STRING),
        "cat": _string_column([e.cat for e in evs], DICT_STRING),
        "name": _string_column([e.name for e in evs], DICT_STRING),
        "pid": ctx.ids("pid", [e.pid for e in evs]),
        "tid": ctx.ids("tid", [e.tid for e in evs]),
        "ts": _raw_strings([e.ts for e in evs]),
        "dur": _raw_strings([e.dur for e in evs]),
        "flow_id": _id_column([e.id for e in evs]),
        "bp": _string_column([e.bp for e in evs], DICT_STRING),
        "scope": _string_column([e.s for e in evs], DICT_STRING),
        "args": _raw_strings(args),
        "extra": pa.array(extra if extra is not None else [None] * n, pa.large_string()),
    }
    ext = [s.external_id if s is not None else None for s in sel]
    if any(v is None for v in ext):
        ext = [
            v if v is not None else (s.external_id_2021 if s is not None else None)
            for v, s in zip(ext, sel, strict=True)
        ]
    cols["correlation"] = _int64_column([s.correlation if s else None for s in sel])
    cols["external_id"] = _int64_column(ext)
    cols["device_arg"] = _int64_column([s.device if s else None for s in sel])
    cols["stream_arg"] = _int64_column([s.stream if s else None for s in sel])
    cols["bytes_arg"] = _float_column([s.bytes if s else None for s in sel])
    return pa.RecordBatch.from_pydict(cols)


def _events_from_dicts(dicts: list[dict[str, msgspec.Raw]]) -> tuple[list[_Event], list]:
    """Slow path for entries with keys beyond ``_Event``: keep the unknown keys in ``extra``."""
    evs = []
    extra: list[bytes | None] = []
    for d in dicts:
        kw: dict[str, Any] = {}
        rest: dict[str, msgspec.Raw] = {}
        for k, v in d.items():
            if k in ("ts", "dur", "args"):
                kw[k] = v
            elif k in _KNOWN_KEYS:
                kw[k] = _ANY_DEC.decode(v)
            else:
                rest[k] = v
        evs.append(_Event(**kw))
        extra.append(msgspec.json.encode(rest).decode() if rest else None)
    return evs, extra


# ----------------------------------------------------------------------------------------------
# The reader
# ----------------------------------------------------------------------------------------------


def _err_offset(e: Exception) -> int | None:
    m = re.search(r"\(byte (\d+)\)", str(e))
    return int(m.group(1)) if m else None


def _err_index(e: Exception) -> int | None:
    m = re.search(r"\$\[(\d+)\]", str(e))
    return int(m.group(1)) if m else None


class _Reader:
    def __init__(
        self,
        path: Path,
        lenient: bool,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.path = path
        self.lenient = lenient
        self.progress = progress
        self.ctx = _Ctx()
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
                evs, extra = _events_from_dicts(_DICTS_DEC.decode(text))
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
        run: list[_Event] = []
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
                    got = _OBJ_DEC.decode(piece)
                except msgspec.DecodeError as e:
                    # a whole event followed by junk: keep the event, report only the junk,
                    # and go on with whatever events follow the junk in the same piece
                    cut = _err_offset(e) if j == i else None
                    cut = piece.rfind(b"}", 0, cut + 1) + 1 if cut else 0
                    if not cut:
                        continue
                    try:
                        got = _OBJ_DEC.decode(piece[:cut])
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
            evs, ex = _events_from_dicts([got])
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

    def add(self, evs: list[_Event], extra: list | None) -> None:
        if not evs:
            return
        batch = _columns(evs, self.index, self.ctx, extra)
        n = len(evs)
        ts_text, dur_text = batch.column("ts"), batch.column("dur")
        ts, bad_ts = _us_text_to_ns(ts_text)
        dur, bad_dur = _us_text_to_ns(dur_text)
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

        def gzip_damage(message: str, offset: int) -> None:
            self.truncated = True
            self.dropped.append(
                Dropped(f"{message} at compressed byte {offset}: the rest is lost", 0)
            )

        blocks = _threaded(_file_blocks(self.path, hasher, gzip_damage if self.lenient else None))
        buf = b""
        eof = False
        consumed = 0  # absolute offset of buf[0] in the decompressed text

        def fill(target: int) -> None:
            """Make ``buf[base:]`` at least ``target`` bytes long (or hold the rest of the
            file), copying the kept part once rather than once per block."""
            nonlocal buf, base, eof
            parts: list[Any] = [memoryview(buf)[base:]]
            have = len(buf) - base
            while have < target and not eof:
                try:
                    block = next(blocks)
                except StopIteration:
                    eof = True
                    break
                parts.append(block)
                have += len(block)
            if len(parts) > 1:
                buf = b"".join(parts)
                base = 0

        base = 0
        top: dict[str, Any] = {}
        # 1. the top level, up to the event list
        while True:
            try:
                layout, prefix_end, body_start = _find_events_array(buf)
                break
            except _NeedMore:
                before = len(buf)
                fill(before + 1)
                if len(buf) == before:  # the file ended before the answer
                    if not buf.strip():
                        self.fail("empty file: no JSON value")
                    self.fail(
                        "truncated JSON: the file ends before the event list", offset=len(buf)
                    )
            except ValueError as e:
                self.fail(e.args[0], offset=e.args[1])
        if layout == "object":
            try:
                top.update(_decode_prefix(buf[:prefix_end]))
            except msgspec.DecodeError as e:
                off = _err_offset(e)
                self.fail(f"malformed JSON before traceEvents ({e})", offset=off)
        base = body_start
        consumed = body_start  # absolute offset of buf[base] in the decompressed text
        # 2. the event list, chunk by chunk
        while True:
            fill(2 * CHUNK_BYTES)
            if eof:
                break
            pos = base + CHUNK_BYTES
            while True:
                m = _SEP.search(buf, pos)
                if m is None:
                    before = len(buf) - base
                    fill(before + BLOCK_BYTES)
                    if len(buf) - base == before:
                        break
                    pos = base + before - 8
                    continue
                end = m.start() + 1
                text = b"".join((b"[", memoryview(buf)[base:end], b"]"))
                if self.decode_run(text, consumed, final=False):
                    nxt = m.end() - 1
                    consumed += nxt - base
                    base = nxt
                    if self.progress:
                        self.progress(consumed)
                    break
                pos = m.end()
            if eof:
                break
        buf = buf[base:]
        # 3. the tail: the last events and whatever closes the file
        self.read_tail(buf, consumed, layout, top)
        if self.progress:
            self.progress(consumed + len(buf))
        decoded_top = {}
        for k, v in top.items():
            if k == "traceEvents":
                continue
            decoded_top[k] = _ANY_DEC.decode(v)
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
            sha256=hasher.hexdigest(),
            compressed=self.compressed,
            dropped=self.dropped,
            truncated=self.truncated,
        )

    def read_tail(self, buf: bytes, consumed: int, layout: str, top: dict) -> None:
        head = b'{"traceEvents":[' if layout == "object" else b"["
        text = head + buf
        try:
            if layout == "object":
                rest = _OBJ_DEC.decode(text)
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


def read_kineto(
    path: str | Path,
    *,
    lenient: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RawTrace:
    """Read one Kineto / Chrome-trace JSON file (plain or gzip) into raw columns.

    ``progress`` is called with the number of decompressed bytes consumed so far.
    Raises :class:`~xpuprof.core.errors.TraceFormatError` on damage unless ``lenient``.
    """
    p = Path(path)
    if not p.is_file():
        raise TraceFormatError(p, "no such file")
    return _Reader(p, lenient, progress).read()

"""Write a store back out as Chrome-trace JSON (opens in Perfetto and chrome://tracing).

Why it looks the way it does:

* **The store is the source of truth.** Every entry of each source file's ``traceEvents`` is
  rebuilt from the normalized tables alone, in its original position (``index``): ``events``
  (X, i/I, B/E, …), ``flows`` (s/t/f), ``counters`` (C, one entry per distinct index; its
  ``args`` column holds the original object) and ``metadata`` (M). A ``B`` row with a duration
  was a B/E pair: the ``E`` comes back from the row's ``extra["end"]`` (its index, args and
  extra). Re-importing the output therefore gives the same counts per table, phase, category
  and level, the same nanosecond times and the same args.
* **Exact and lossless.** ``ts``/``dur`` are int64 nanoseconds written as microsecond decimal
  text by integer arithmetic (``1712195495519689047`` → ``1712195495519689.047``; whole
  microseconds stay integers), never through a float. ``args`` and ``extra`` hold the source's
  own JSON text and are spliced in verbatim, so integers beyond 2**63, key order and float
  spelling survive. String pids/tids (stored as negative ids) get their strings back from the
  manifest's ``string_ids``; flow ids that are all digits are written as numbers, as Kineto
  writes them.
* **Speed and bounded memory.** Nothing is done per event in Python: strings are JSON-escaped
  once per distinct value (Arrow dictionaries), pids/tids once per distinct id, and each entry's
  text is assembled with Arrow's vectorized string kernels. Entries are rendered a chunk of
  ``CHUNK_ENTRIES`` at a time by a few threads and gzip runs in another (Arrow and zlib release
  the GIL), so a store of millions of events streams out on every core, with memory bounded by
  one part's columns plus a few chunks of text (1.6 M entries: about 0.5 GB peak).
* **Several parts (ranks).** When ``path`` is an existing directory or ends with ``/``, one file
  per part is written there (``rank{R}.pt.trace.json.gz``, or ``part{N}…`` when the rank is
  unknown), each with its own source's top-level keys: the per-rank layout every Kineto tool
  expects. Otherwise all parts go into one file, which a viewer shows as one timeline. Then each
  part's pids become strings ``"rank R/pid P"`` (``"part N/pid P"`` without a rank,
  ``"rank R part N/pid P"`` when ranks repeat) so that processes of different ranks never
  merge; ``process_name`` metadata becomes ``"rank R: NAME"``; the numeric flow ids of the
  k-th part (in rank order) grow by ``k * 10**d`` (``d``: digits of the largest id in the store)
  so that no arrow joins two ranks (they stay numbers: Perfetto reads a string flow id as hex).
  Top-level keys equal in every source (``schemaVersion``, ``deviceProperties`` of a homogeneous
  job, …) are kept; the per-source ones (``distributedInfo``, …) go to ``xpuprofSources`` (one
  object per part with its path, part, rank and top-level keys), so a merged file is never
  mistaken for one rank's trace. Parts follow each other in rank order, each in source order.
* **Atomic.** Each file is written under a temporary name and renamed at the end; on error
  nothing is left behind (neither temporary files nor a directory this call created).

``formats/`` sits left of ``trace/`` in the pipeline, so this module only uses what a ``Trace``
exposes (``sources`` and ``table()``) and imports nothing from ``xpuprof.trace`` at run time.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import uuid
import zlib
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.errors import XpuprofError

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

__all__ = ["export_chrome", "CHUNK_ENTRIES", "GZIP_LEVEL"]

#: Entries rendered and written at a time (bounds the text held in memory).
CHUNK_ENTRIES = 1 << 16
#: Threads rendering chunks ahead of the writer.
RENDER_THREADS = min(4, os.cpu_count() or 1)
#: zlib level for ``.gz`` output. Measured on 1.6 M Kineto entries (414 MB of JSON): level 3
#: wrote 39.5 MB in half the time of level 6 (31.5 MB), where the compressor sets the pace;
#: level 1 saved no time (rendering does) and wrote 10 % more.
GZIP_LEVEL = 3

_L = pa.large_string()
_NUMBER = r"^-?(?:0|[1-9][0-9]*)$"
_NATURAL = r"^(?:0|[1-9][0-9]*)$"
_enc = msgspec.json.Encoder()

#: Output key order of an entry; each key is written only when its value is not null.
_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s", "args")
_PREFIX = {k: pa.scalar(f'"{k}":', _L) for k in _KEYS}
_EMPTY = pa.scalar("", _L)
_COMMA = pa.scalar(",", _L)
_OPEN = pa.scalar(",\n{", _L)
_CLOSE = pa.scalar("}", _L)


# ----------------------------------------------------------------------------------------------
# column preparation (once per part)
# ----------------------------------------------------------------------------------------------


def _escape_values(values: list[Any]) -> pa.Array:
    """JSON text of each (distinct) string value."""
    return pa.array([None if v is None else _enc.encode(v).decode() for v in values], _L)


def _json_strings(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
    """A string (or dictionary) column as a dictionary column of JSON string literals, escaped
    once per distinct value."""
    if isinstance(col, pa.Array):
        col = pa.chunked_array([col])
    out = []
    for chunk in col.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        esc = _escape_values(chunk.dictionary.to_pylist())
        out.append(pa.DictionaryArray.from_arrays(chunk.indices, esc))
    return pa.chunked_array(out, pa.dictionary(pa.int32(), _L)) if out else _null_text(0)


def _null_text(n: int) -> pa.ChunkedArray:
    return pa.chunked_array([pa.nulls(n, _L)])


def _const_text(text: str, n: int) -> pa.ChunkedArray:
    arr = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([text], _L))
    return pa.chunked_array([arr])


def _id_text(col: pa.ChunkedArray, names: dict[str, str], who: str | None) -> pa.ChunkedArray:
    """pid/tid ids as JSON text: numbers as numbers, negative ids as their original strings
    (``names``), and, when ``who`` is given (pids of a merged export), the string
    ``"{who}/pid {P}"``."""
    out = []
    for chunk in col.chunks:
        enc = pc.dictionary_encode(chunk)
        texts = []
        for v in enc.dictionary.to_pylist():
            if v is None:
                texts.append(None)
                continue
            original: Any = names.get(str(v), v) if v < 0 else v
            value = original if who is None else f"{who}/pid {original}"
            texts.append(_enc.encode(value).decode())
        out.append(pa.DictionaryArray.from_arrays(enc.indices, pa.array(texts, _L)))
    return pa.chunked_array(out, pa.dictionary(pa.int32(), _L))


def _flow_id_text(col: pa.ChunkedArray, who: str | None, offset: int) -> pa.ChunkedArray:
    """Flow ids as JSON text: all digits → a JSON number (Kineto's ids are integers, and
    Perfetto reads a string id as hex), anything else a JSON string.

    In a merged export (``who`` given) ids must not meet ids of another rank: numbers get
    ``offset`` added, other ids become ``"{who}/{id}"``.
    """
    out = []
    for chunk in col.chunks:
        chunk = chunk.cast(_L)
        is_num = pc.fill_null(pc.match_substring_regex(chunk, _NUMBER), True)
        if who is not None:
            missing = pc.is_null(chunk)  # no id: nothing to write
            natural = pc.fill_null(pc.match_substring_regex(chunk, _NATURAL), False)
            shifted = _shift_ids(chunk, natural, offset)
            if shifted is None:  # beyond int64 once shifted: keep them apart as strings
                is_num = missing
            else:
                chunk, is_num = shifted, pc.or_(natural, missing)
        if pc.all(is_num).as_py():
            out.append(chunk)
            continue
        other = pc.invert(is_num)
        values = chunk.filter(other).to_pylist()
        if who is not None:
            values = [f"{who}/{v}" for v in values]
        out.append(pc.replace_with_mask(chunk, other, _escape_values(values)))
    return pa.chunked_array(out, _L)


def _shift_ids(chunk: pa.Array, num: pa.Array, offset: int) -> pa.Array | None:
    """``chunk`` with ``offset`` added to its decimal ids (where ``num``), or None when a
    result would not fit in int64."""
    if offset == 0:
        return chunk
    nums = chunk.filter(num)
    try:
        vals = np.asarray(nums.cast(pa.int64()).to_numpy(zero_copy_only=False), np.int64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if len(vals) and int(vals.max()) > np.iinfo(np.int64).max - offset:
        return None
    return pc.replace_with_mask(chunk, num, pa.array(vals + offset).cast(_L))


def _id_digits(trace: Trace) -> int:
    """Decimal digits of the largest non-negative numeric flow id in the store."""
    ids = trace.table("flows", columns=["flow_id"])["flow_id"]
    num = ids.filter(pc.fill_null(pc.match_substring_regex(ids, _NATURAL), False))
    if not len(num):
        return 1
    return int(pc.max(pc.utf8_length(num)).as_py())


class _Block:
    """One table of one part, ready to render: ``index`` plus JSON-text columns by output key."""

    def __init__(self, index: np.ndarray, cols: dict[str, Any], extra: Any = None) -> None:
        order = np.argsort(index, kind="stable")
        if np.any(order != np.arange(len(index))):
            take = pa.array(order)
            index = index[order]
            cols = {k: v.take(take) for k, v in cols.items()}
            extra = extra.take(take) if extra is not None else None
        self.index = index
        self.cols = cols
        self.extra = extra

    def __len__(self) -> int:
        return len(self.index)

    def render(self, lo: int, hi: int) -> tuple[np.ndarray, pa.Array] | None:
        """The rows with ``lo <= index < hi``: their indices and entry texts."""
        a, b = np.searchsorted(self.index, [lo, hi], side="left")
        if a >= b:
            return None
        n = int(b - a)
        frags = []
        for key in _KEYS:
            col = self.cols.get(key)
            if col is None:
                continue
            part = col.slice(a, n)
            if key in ("ts", "dur"):
                text = _us_text(part)
            else:
                text = _flat(part.cast(_L) if pa.types.is_dictionary(part.type) else part)
            frags.append(pc.binary_join_element_wise(_PREFIX[key], text, _EMPTY))
        if self.extra is not None:
            ex = _flat(self.extra.slice(a, n))
            if ex.null_count < n:
                inner = pc.utf8_slice_codeunits(pc.utf8_trim_whitespace(ex), 1, -1)
                frags.append(pc.if_else(pc.equal(inner, ""), pa.scalar(None, _L), inner))
        body = pc.binary_join_element_wise(*frags, _COMMA, null_handling="skip")
        entry = pc.binary_join_element_wise(_OPEN, body, _CLOSE, _EMPTY)
        return self.index[a:b], entry


def _flat(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _us_text(ns: pa.ChunkedArray | pa.Array) -> pa.Array:
    """int64 nanoseconds → microsecond decimal text, exactly (integer arithmetic only)."""
    ns = _flat(ns)
    valid = np.asarray(ns.is_valid())
    v = np.asarray(pc.fill_null(ns, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    neg = v < 0
    a = np.abs(v)
    q, r = np.divmod(a, 1000)
    mask = ~valid
    qs = pa.array(q, mask=mask).cast(_L)
    frac = pc.utf8_rtrim(pc.utf8_lpad(pa.array(r).cast(_L), 3, "0"), "0")
    text = pc.if_else(
        pa.array(r == 0), qs, pc.binary_join_element_wise(qs, frac, pa.scalar(".", _L))
    )
    if neg.any():
        text = pc.if_else(
            pa.array(neg), pc.binary_join_element_wise(pa.scalar("-", _L), text, _EMPTY), text
        )
    return text


# ----------------------------------------------------------------------------------------------
# tables → blocks
# ----------------------------------------------------------------------------------------------


def _np_int(col: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.fill_null(col, 0).to_numpy(), dtype=np.int64)


def _blocks(
    trace: Trace, source: dict[str, Any], who: str | None = None, id_offset: int = 0
) -> list[_Block]:
    """Read one part's tables and prepare one block per table (plus one for the ``E`` ends of
    B/E pairs). ``who`` (a merged export): the label that makes this part's pids and flow ids
    distinct from the other parts', with numeric flow ids shifted by ``id_offset``."""
    part = source["part"]
    meta = source.get("meta") or {}
    sids = meta.get("string_ids") or {}
    pid_names, tid_names = sids.get("pid") or {}, sids.get("tid") or {}
    flt = [("part", "=", part)]

    def ids(t: pa.Table) -> dict[str, Any]:
        return {
            "pid": _id_text(t["pid"], pid_names, who),
            "tid": _id_text(t["tid"], tid_names, None),
        }

    blocks: list[_Block] = []

    # events (X, i/I, B/E, …)
    ev = trace.table(
        "events",
        columns=["index", "phase", "scope", "pid", "tid", "category", "name", "ts", "dur",
                 "args", "extra"],
        filters=flt,
    )  # fmt: skip
    ends = None
    dur, extra = ev["dur"], ev["extra"]
    paired = pc.and_(pc.equal(ev["phase"].cast(pa.string()), "B"), pc.is_valid(dur))
    if ev.num_rows and pc.any(paired).as_py():
        rows = np.flatnonzero(np.asarray(paired.to_numpy(zero_copy_only=False), dtype=bool))
        dur, extra, ends = _split_pairs(ev, rows, pid_names, tid_names, who)
    blocks.append(
        _Block(
            _np_int(ev["index"]),
            {
                "ph": _json_strings(ev["phase"]),
                "cat": _json_strings(ev["category"]),
                "name": _json_strings(ev["name"]),
                **ids(ev),
                "ts": ev["ts"],
                "dur": dur,
                "s": _json_strings(ev["scope"]),
                "args": ev["args"],
            },
            extra,
        )
    )
    if ends is not None:
        blocks.append(ends)
    del ev

    # flows (s/t/f)
    fl = trace.table(
        "flows",
        columns=["index", "phase", "category", "name", "flow_id", "pid", "tid", "ts", "bp",
                 "args", "extra"],
        filters=flt,
    )  # fmt: skip
    if fl.num_rows:
        blocks.append(
            _Block(
                _np_int(fl["index"]),
                {
                    "ph": _json_strings(fl["phase"]),
                    "cat": _json_strings(fl["category"]),
                    "name": _json_strings(fl["name"]),
                    **ids(fl),
                    "ts": fl["ts"],
                    "id": _flow_id_text(fl["flow_id"], who, id_offset),
                    "bp": _json_strings(fl["bp"]),
                    "args": fl["args"],
                },
                fl["extra"],
            )
        )

    # counters (C): one entry per distinct index, the whole args object on every series row
    co = trace.table(
        "counters",
        columns=["index", "pid", "tid", "category", "name", "ts", "args", "extra"],
        filters=flt,
    )
    if co.num_rows:
        _, first = np.unique(_np_int(co["index"]), return_index=True)
        co = co.take(pa.array(first))
        blocks.append(
            _Block(
                _np_int(co["index"]),
                {
                    "ph": _const_text('"C"', co.num_rows),
                    "cat": _json_strings(co["category"]),
                    "name": _json_strings(co["name"]),
                    **ids(co),
                    "ts": co["ts"],
                    "args": co["args"],
                },
                co["extra"],
            )
        )

    # metadata (M)
    md = trace.table(
        "metadata",
        columns=["index", "category", "name", "pid", "tid", "ts", "args", "extra"],
        filters=flt,
    )
    if md.num_rows:
        args = md["args"]
        if who is not None:
            args = _rename_processes(md, who)
        blocks.append(
            _Block(
                _np_int(md["index"]),
                {
                    "ph": _const_text('"M"', md.num_rows),
                    "cat": _json_strings(md["category"]),
                    "name": _json_strings(md["name"]),
                    **ids(md),
                    "ts": md["ts"],
                    "args": args,
                },
                md["extra"],
            )
        )
    return blocks


def _split_pairs(
    ev: pa.Table,
    rows: np.ndarray,
    pid_names: dict[str, str],
    tid_names: dict[str, str],
    who: str | None,
) -> tuple[pa.ChunkedArray, pa.ChunkedArray, _Block | None]:
    """Undo the B/E pairing of the importer for the given ``B`` rows.

    Returns the events' ``dur`` (null on the ``B`` of a pair: a ``B`` carries no duration),
    their ``extra`` (without ``end``) and a block with the ``E`` entries. A ``B`` whose extra
    has no ``end`` had a ``dur`` of its own in the source and is left as it is.
    """
    take = pa.array(rows)
    sub = ev.select(["index", "pid", "tid", "ts", "dur", "extra"]).take(take).to_pydict()
    keep_dur = np.ones(ev.num_rows, dtype=bool)
    new_extra: list[str | None] = []
    keys = ("index", "pid", "tid", "ts", "cat", "name", "args", "extra")
    e_rows: dict[str, list[Any]] = {k: [] for k in keys}
    fixed = []
    raw_obj = dict[str, msgspec.Raw]
    for k, row in enumerate(rows.tolist()):
        text = sub["extra"][k]
        # Raw values: the E's args and extra come back exactly as the source spelled them
        ex = msgspec.json.decode(text, type=raw_obj) if text else None
        end_raw = ex.pop("end", None) if ex is not None else None
        end = msgspec.json.decode(end_raw, type=raw_obj) if end_raw is not None else None
        if not end or "index" not in end:
            continue
        fixed.append(row)
        keep_dur[row] = False
        new_extra.append(_enc.encode(ex).decode() if ex else None)
        e_rows["index"].append(msgspec.json.decode(end["index"]))
        e_rows["pid"].append(sub["pid"][k])
        e_rows["tid"].append(sub["tid"][k])
        e_rows["ts"].append(sub["ts"][k] + sub["dur"][k])
        for key in ("cat", "name"):
            e_rows[key].append(msgspec.json.decode(end[key]) if key in end else None)
        for key in ("args", "extra"):
            e_rows[key].append(bytes(end[key]).decode() if key in end else None)
    if not fixed:
        return ev["dur"], ev["extra"], None
    mask = np.zeros(ev.num_rows, dtype=bool)
    mask[fixed] = True
    dur = pa.array(
        _np_int(ev["dur"]), pa.int64(), mask=~(np.asarray(ev["dur"].is_valid()) & keep_dur)
    )
    extra = pc.replace_with_mask(
        ev["extra"].combine_chunks(), pa.array(mask), pa.array(new_extra, _L)
    )
    n = len(fixed)
    e_tab = pa.table(
        {
            "pid": pa.array(e_rows["pid"], pa.int64()),
            "tid": pa.array(e_rows["tid"], pa.int64()),
        }
    )
    ends = _Block(
        np.asarray(e_rows["index"], dtype=np.int64),
        {
            "ph": _const_text('"E"', n),
            "cat": _json_strings(pa.array(e_rows["cat"], pa.string())),
            "name": _json_strings(pa.array(e_rows["name"], pa.string())),
            "pid": _id_text(e_tab["pid"], pid_names, who),
            "tid": _id_text(e_tab["tid"], tid_names, None),
            "ts": pa.array(e_rows["ts"], pa.int64()),
            "args": pa.array(e_rows["args"], _L),
        },
        pa.array(e_rows["extra"], _L),
    )
    return pa.chunked_array([dur]), pa.chunked_array([extra]), ends


def _rename_processes(md: pa.Table, who: str) -> pa.Array:
    """Merged export: ``process_name`` metadata names become ``"rank R: NAME"``."""
    names = md["name"].cast(pa.string()).to_pylist()
    args = md["args"].to_pylist()
    for i, (name, text) in enumerate(zip(names, args, strict=True)):
        if name != "process_name" or not text:
            continue
        obj = msgspec.json.decode(text)
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            obj["name"] = f"{who}: {obj['name']}"
            args[i] = _enc.encode(obj).decode()
    return pa.array(args, _L)


# ----------------------------------------------------------------------------------------------
# output
# ----------------------------------------------------------------------------------------------


def _render_range(blocks: list[_Block], lo: int, hi: int) -> pa.Array | None:
    """Entry texts of the entries with ``lo <= index < hi``, in index order."""
    idx_parts, text_parts = [], []
    for b in blocks:
        got = b.render(lo, hi)
        if got is not None:
            idx_parts.append(got[0])
            text_parts.append(got[1])
    if not text_parts:
        return None
    if len(text_parts) == 1:
        return text_parts[0]
    order = np.argsort(np.concatenate(idx_parts), kind="stable")
    return pa.concat_arrays(text_parts).take(pa.array(order))


def _chunks(blocks: list[_Block]) -> Iterator[pa.Array]:
    """Entry texts of all blocks in source order, ``CHUNK_ENTRIES`` at a time.

    Chunks are rendered ahead in a small thread pool: Arrow's kernels release the GIL, so
    rendering uses the other cores while this thread hands finished chunks to the writer.
    """
    if not blocks:
        return
    allidx = np.sort(np.concatenate([b.index for b in blocks]))
    if not len(allidx):
        return
    bounds = allidx[::CHUNK_ENTRIES].tolist() + [int(allidx[-1]) + 1]
    ranges = iter(zip(bounds[:-1], bounds[1:], strict=True))
    workers = max(1, min(RENDER_THREADS, len(bounds) - 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="xpuprof-render") as pool:
        pending = deque(
            pool.submit(_render_range, blocks, lo, hi) for lo, hi in islice(ranges, workers + 1)
        )
        try:
            while pending:
                arr = pending.popleft().result()
                nxt = next(ranges, None)
                if nxt is not None:
                    pending.append(pool.submit(_render_range, blocks, *nxt))
                if arr is not None:
                    yield arr
        finally:
            for f in pending:
                f.cancel()


def _text_bytes(arr: pa.Array) -> memoryview:
    """The concatenated UTF-8 bytes of a large_string array without copying them."""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)
    lo, hi = int(offsets[arr.offset]), int(offsets[arr.offset + len(arr)])
    data = arr.buffers()[2]
    return memoryview(data)[lo:hi] if data is not None else memoryview(b"")


class _Sink:
    """Writes bytes to a file, gzip-compressed when asked; compression and writes run in a
    background thread so that rendering the next chunk overlaps them."""

    def __init__(self, path: Path, gz: bool) -> None:
        self.f = open(path, "wb")
        self.z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31) if gz else None
        self.q: queue.Queue[Any] = queue.Queue(maxsize=4)
        self.error: BaseException | None = None
        self.t = threading.Thread(target=self._run, name="xpuprof-export", daemon=True)
        self.t.start()

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            if self.error is not None:
                continue
            try:
                data = item[0]
                self.f.write(self.z.compress(data) if self.z else data)
            except BaseException as e:  # re-raised in the caller's thread
                self.error = e

    def write(self, data: bytes | memoryview, keep: Any = None) -> None:
        """Queue ``data``; ``keep`` holds the object that owns its memory until written."""
        if self.error is not None:
            raise self.error
        self.q.put((data, keep))

    def close(self) -> None:
        self.q.put(None)
        self.t.join()
        try:
            if self.error is None and self.z is not None:
                self.f.write(self.z.flush())
        finally:
            self.f.close()
        if self.error is not None:
            raise self.error

    def abort(self) -> None:
        self.q.put(None)
        self.t.join()
        self.f.close()


def _top_keys(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k not in ("string_ids", "traceEvents")}


def _write_file(
    path: Path, parts: Iterable[Callable[[], list[_Block]]], top: dict[str, Any], gz: bool
) -> tuple[int, int]:
    """Write one trace file at ``path`` (the caller's temporary name); ``parts`` yields the
    blocks of one part at a time, so only one part's columns are in memory. Returns (entries
    written, bytes on disk)."""
    sink = _Sink(path, gz)
    entries = 0
    try:
        head = b"".join(_enc.encode(k) + b":" + _enc.encode(v) + b"," for k, v in top.items())
        sink.write(b"{" + head + b'"traceEvents":[')
        first = True
        for load in parts:
            for arr in _chunks(load()):
                data = _text_bytes(arr)
                if first:
                    data = data[1:]  # the first entry has no comma before it
                    first = False
                sink.write(data, arr)
                entries += len(arr)
        sink.write(b"\n]}\n")
        sink.close()
    except BaseException:
        sink.abort()
        raise
    return entries, path.stat().st_size


def _temp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _file_name(source: dict[str, Any], taken: set[str]) -> str:
    rank, part = source.get("rank"), source["part"]
    name = f"rank{rank}.pt.trace.json.gz" if rank is not None else f"part{part}.pt.trace.json.gz"
    if name in taken:
        name = f"rank{rank}.part{part}.pt.trace.json.gz"
    taken.add(name)
    return name


def export_chrome(trace: Trace, path: str | Path) -> dict[str, Any]:
    """Write ``trace`` as Chrome-trace JSON (gzip when ``path`` ends with ``.gz``).

    ``path`` an existing directory or ending with ``/``: one file per part in it; otherwise one
    file with all parts (pids made distinct per rank). Returns a summary: ``path``,
    ``sources`` (parts written), ``events`` (trace entries written), ``bytes`` (on disk) and,
    for a directory, ``files``.
    """
    text = os.fspath(path)
    out = Path(text)
    sources = sorted(trace.sources, key=lambda s: s["part"])
    to_dir = out.is_dir() or text.endswith(("/", os.sep))
    if to_dir:
        return _export_dir(trace, out, sources)
    if not out.parent.is_dir():
        raise XpuprofError(f"{out}: the folder {out.parent} does not exist")
    if len(sources) > 1:
        # rank order; numeric flow ids of the k-th source are shifted by k * 10**digits
        sources.sort(key=lambda s: (s.get("rank") is None, s.get("rank") or 0, s["part"]))
        step = 10 ** _id_digits(trace)
        labels = _labels(sources)
        parts = [
            partial(_blocks, trace, s, who, k * step)
            for k, (s, who) in enumerate(zip(sources, labels, strict=True))
        ]
        top = _merged_top(sources)
    else:
        parts = [partial(_blocks, trace, s) for s in sources]
        top = _top_keys(sources[0].get("meta") or {}) if sources else {}
    tmp = _temp_name(out)
    try:
        entries, size = _write_file(tmp, parts, top, gz=out.name.endswith(".gz"))
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return {"path": str(out), "sources": len(sources), "events": entries, "bytes": size}


def _labels(sources: list[dict[str, Any]]) -> list[str]:
    """The label of each part in a merged file: ``rank R``, or ``rank R part P`` when two parts
    have the same rank, or ``part P`` when the rank is unknown."""
    ranks = Counter(s.get("rank") for s in sources)
    out = []
    for s in sources:
        rank, part = s.get("rank"), s["part"]
        if rank is None:
            out.append(f"part {part}")
        elif ranks[rank] > 1:
            out.append(f"rank {rank} part {part}")
        else:
            out.append(f"rank {rank}")
    return out


def _merged_top(sources: list[dict[str, Any]]) -> dict[str, Any]:
    """Top-level keys of a merged file: those equal in every source, plus one object per
    source with its own."""
    tops = [_top_keys(s.get("meta") or {}) for s in sources]
    common = {k: v for k, v in tops[0].items() if all(k in t and t[k] == v for t in tops[1:])}
    common["xpuprofSources"] = [
        {"path": s.get("path"), "part": s["part"], "rank": s.get("rank"), "meta": t}
        for s, t in zip(sources, tops, strict=True)
    ]
    return common


def _export_dir(trace: Trace, out: Path, sources: list[dict[str, Any]]) -> dict[str, Any]:
    """One file per part in ``out``; all are written under temporary names first and renamed
    only when every one is complete."""
    if out.exists() and not out.is_dir():
        raise XpuprofError(f"{out}: exists and is not a directory")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    renamed: list[Path] = []
    total = size = 0
    taken: set[str] = set()
    try:
        for s in sources:
            final = out / _file_name(s, taken)
            tmp = _temp_name(final)
            staged.append((tmp, final))
            load = partial(_blocks, trace, s)
            n, b = _write_file(tmp, [load], _top_keys(s.get("meta") or {}), gz=True)
            total += n
            size += b
        for tmp, final in staged:
            os.replace(tmp, final)
            renamed.append(final)
    except BaseException:
        for tmp, _final in staged:
            tmp.unlink(missing_ok=True)
        if created:
            for final in renamed:
                final.unlink(missing_ok=True)
            shutil.rmtree(out, ignore_errors=True)
        raise
    return {
        "path": str(out),
        "sources": len(sources),
        "events": total,
        "bytes": size,
        "files": [str(final) for _, final in staged],
    }

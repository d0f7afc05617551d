"""Write a store back out as Chrome-trace JSON (opens in Perfetto and chrome://tracing).

Every entry of each source file's ``traceEvents`` is rebuilt from the normalized tables alone,
in its original position, exactly (integer nanoseconds as microsecond decimals, the source's own
``args`` text), one file per part (rank) into a directory or all parts merged into one file
with distinct pids and flow ids. Rendering is vectorized (``export/jsontext.py``), chunked and
threaded, and each file is written under a temporary name and renamed when complete.
``docs/export.md`` gives the rules.
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
from dataclasses import dataclass
from functools import partial
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.errors import XpuprofError
from xpuprof.export.jsontext import (
    NATURAL_ID,
    Block,
    const_text,
    flow_id_text,
    id_text,
    json_strings,
)
from xpuprof.export.overlay import Marks, parse_overlays

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

__all__ = ["export_chrome", "parse_overlays", "CHUNK_ENTRIES", "GZIP_LEVEL"]

#: Entries rendered and written at a time (bounds the text held in memory).
CHUNK_ENTRIES = 1 << 16
#: Threads rendering chunks ahead of the writer.
RENDER_THREADS = min(4, os.cpu_count() or 1)
#: zlib level for ``.gz`` output. Measured on 1.6 M Kineto entries (414 MB of JSON): level 3
#: wrote 39.5 MB in half the time of level 6 (31.5 MB), where the compressor sets the pace;
#: level 1 saved no time (rendering does) and wrote 10 % more.
GZIP_LEVEL = 3

_enc = msgspec.json.Encoder()
_L = pa.large_string()


def _id_digits(trace: Trace) -> int:
    """Decimal digits of the largest non-negative numeric flow id in the store."""
    ids = trace.table("flows", columns=["flow_id"])["flow_id"]
    num = ids.filter(pc.fill_null(pc.match_substring_regex(ids, NATURAL_ID), False))
    if not len(num):
        return 1
    return int(pc.max(pc.utf8_length(num)).as_py())


# ----------------------------------------------------------------------------------------------
# tables → blocks
# ----------------------------------------------------------------------------------------------


def _np_int(col: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.fill_null(col, 0).to_numpy(), dtype=np.int64)


@dataclass
class _Part:
    """One part (source file) being exported: its row filter, the original strings of its
    string pids/tids, and in a merged export (``who`` given) the label that keeps its pids and
    flow ids apart from the other parts', numeric flow ids shifted by ``id_offset``."""

    part: int
    pid_names: dict[str, str]
    tid_names: dict[str, str]
    who: str | None
    id_offset: int

    @classmethod
    def of(cls, source: dict[str, Any], who: str | None, id_offset: int) -> _Part:
        sids = (source.get("meta") or {}).get("string_ids") or {}
        return cls(source["part"], sids.get("pid") or {}, sids.get("tid") or {}, who, id_offset)

    def read(self, trace: Trace, table: str, columns: list[str]) -> pa.Table:
        return trace.table(table, columns=columns, filters=[("part", "=", self.part)])

    def ids(self, t: pa.Table) -> dict[str, Any]:
        """The ``pid`` and ``tid`` text columns of table ``t``."""
        return {
            "pid": id_text(t["pid"], self.pid_names, self.who),
            "tid": id_text(t["tid"], self.tid_names, None),
        }


def _blocks(
    trace: Trace,
    source: dict[str, Any],
    who: str | None = None,
    id_offset: int = 0,
    marks: Marks | None = None,
    flow_base: int = 0,
) -> list[Block]:
    """Read one part's tables and prepare one block per table (plus one for the ``E`` ends of
    B/E pairs). ``who`` (a merged export): the label that makes this part's pids and flow ids
    distinct from the other parts', with numeric flow ids shifted by ``id_offset``.
    ``marks``: the overlay (``export/overlay.py``), its arrows numbered from ``flow_base``."""
    part = _Part.of(source, who, id_offset)
    blocks = _event_blocks(trace, part)
    for make in (_flow_block, _counter_block, _metadata_block):
        block = make(trace, part)
        if block is not None:
            blocks.append(block)
    if marks is not None:
        block = marks.block(part.part, part.pid_names, part.tid_names, who, flow_base)
        if block is not None:
            blocks.append(block)
    return blocks


def _event_blocks(trace: Trace, part: _Part) -> list[Block]:
    """Events (X, i/I, B/E, …): one block, and one more for the ``E`` of B/E pairs."""
    ev = part.read(
        trace,
        "events",
        ["index", "phase", "scope", "pid", "tid", "category", "name", "ts", "dur", "args",
         "extra"],
    )  # fmt: skip
    ends = None
    dur, extra = ev["dur"], ev["extra"]
    paired = pc.and_(pc.equal(ev["phase"].cast(pa.string()), "B"), pc.is_valid(dur))
    if ev.num_rows and pc.any(paired).as_py():
        rows = np.flatnonzero(np.asarray(paired.to_numpy(zero_copy_only=False), dtype=bool))
        dur, extra, ends = _split_pairs(ev, rows, part)
    cols = {
        "ph": json_strings(ev["phase"]),
        "cat": json_strings(ev["category"]),
        "name": json_strings(ev["name"]),
        **part.ids(ev),
        "ts": ev["ts"],
        "dur": dur,
        "s": json_strings(ev["scope"]),
        "args": ev["args"],
    }
    blocks = [Block(_np_int(ev["index"]), cols, extra)]
    if ends is not None:
        blocks.append(ends)
    return blocks


def _flow_block(trace: Trace, part: _Part) -> Block | None:
    """Flows (s/t/f)."""
    fl = part.read(
        trace,
        "flows",
        ["index", "phase", "category", "name", "flow_id", "pid", "tid", "ts", "bp", "args",
         "extra"],
    )  # fmt: skip
    if not fl.num_rows:
        return None
    cols = {
        "ph": json_strings(fl["phase"]),
        "cat": json_strings(fl["category"]),
        "name": json_strings(fl["name"]),
        **part.ids(fl),
        "ts": fl["ts"],
        "id": flow_id_text(fl["flow_id"], part.who, part.id_offset),
        "bp": json_strings(fl["bp"]),
        "args": fl["args"],
    }
    return Block(_np_int(fl["index"]), cols, fl["extra"])


def _counter_block(trace: Trace, part: _Part) -> Block | None:
    """Counters (C): one entry per distinct index, the whole args object on every series row."""
    co = part.read(
        trace, "counters", ["index", "pid", "tid", "category", "name", "ts", "args", "extra"]
    )
    if not co.num_rows:
        return None
    _, first = np.unique(_np_int(co["index"]), return_index=True)
    co = co.take(pa.array(first))
    cols = {
        "ph": const_text('"C"', co.num_rows),
        "cat": json_strings(co["category"]),
        "name": json_strings(co["name"]),
        **part.ids(co),
        "ts": co["ts"],
        "args": co["args"],
    }
    return Block(_np_int(co["index"]), cols, co["extra"])


def _metadata_block(trace: Trace, part: _Part) -> Block | None:
    """Metadata (M); in a merged export process names say which part they belong to."""
    md = part.read(
        trace, "metadata", ["index", "category", "name", "pid", "tid", "ts", "args", "extra"]
    )
    if not md.num_rows:
        return None
    cols = {
        "ph": const_text('"M"', md.num_rows),
        "cat": json_strings(md["category"]),
        "name": json_strings(md["name"]),
        **part.ids(md),
        "ts": md["ts"],
        "args": md["args"] if part.who is None else _rename_processes(md, part.who),
    }
    return Block(_np_int(md["index"]), cols, md["extra"])


def _split_pairs(
    ev: pa.Table, rows: np.ndarray, part: _Part
) -> tuple[pa.ChunkedArray, pa.ChunkedArray, Block | None]:
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
    ends = Block(
        np.asarray(e_rows["index"], dtype=np.int64),
        {
            "ph": const_text('"E"', n),
            "cat": json_strings(pa.array(e_rows["cat"], pa.string())),
            "name": json_strings(pa.array(e_rows["name"], pa.string())),
            **part.ids(e_tab),
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


def _render_range(blocks: list[Block], lo: int, hi: int) -> pa.Array | None:
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


def _chunks(blocks: list[Block]) -> Iterator[pa.Array]:
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
    path: Path, parts: Iterable[Callable[[], list[Block]]], top: dict[str, Any], gz: bool
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


def export_chrome(
    trace: Trace, path: str | Path, *, overlays: tuple[str, ...] | str | None = ()
) -> dict[str, Any]:
    """Write ``trace`` as Chrome-trace JSON (gzip when ``path`` ends with ``.gz``).

    ``path`` an existing directory or ending with ``/``: one file per part in it; otherwise one
    file with all parts (pids made distinct per rank). ``overlays``: ``critical-path`` and/or
    ``findings`` (``export/overlay.py``) to mark what xpuprof found. Returns a summary: ``path``,
    ``sources`` (parts written), ``events`` (trace entries written), ``bytes`` (on disk), for
    a directory ``files``, and with overlays ``overlays`` (entries marked per overlay).
    """
    text = os.fspath(path)
    out = Path(text)
    which = parse_overlays(overlays) if isinstance(overlays, str) else tuple(overlays or ())
    sources = sorted(trace.sources, key=lambda s: s["part"])
    to_dir = out.is_dir() or text.endswith(("/", os.sep))
    if not to_dir and not out.parent.is_dir():
        raise XpuprofError(f"{out}: the folder {out.parent} does not exist")
    marks = Marks(trace, which) if which else None
    # flow ids are shifted per part in a merged file, and overlay arrows go above them all;
    # a plain export of one file or a folder needs neither (no read of the flows table)
    step = 10 ** _id_digits(trace) if marks is not None or (len(sources) > 1 and not to_dir) else 1
    flow_base = (len(sources) + 1) * step
    if to_dir:
        summary = _export_dir(trace, out, sources, marks, flow_base)
    else:
        if len(sources) > 1:
            # rank order; numeric flow ids of the k-th source are shifted by k * 10**digits
            sources.sort(key=lambda s: (s.get("rank") is None, s.get("rank") or 0, s["part"]))
            labels = _labels(sources)
            parts = [
                partial(_blocks, trace, s, who, k * step, marks, flow_base + k * OVERLAY_FLOWS)
                for k, (s, who) in enumerate(zip(sources, labels, strict=True))
            ]
            top = _merged_top(sources)
        else:
            parts = [partial(_blocks, trace, s, None, 0, marks, flow_base) for s in sources]
            top = _top_keys(sources[0].get("meta") or {}) if sources else {}
        tmp = _temp_name(out)
        try:
            entries, size = _write_file(tmp, parts, top, gz=out.name.endswith(".gz"))
            os.replace(tmp, out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        summary = {"path": str(out), "sources": len(sources), "events": entries, "bytes": size}
    if marks is not None:
        summary["overlays"] = dict(marks.counts)
    return summary


#: Overlay arrows numbered per part in a merged file (a part's arrows never reach this many).
OVERLAY_FLOWS = 10**7


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


def _export_dir(
    trace: Trace, out: Path, sources: list[dict[str, Any]], marks: Marks | None, flow_base: int
) -> dict[str, Any]:
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
            load = partial(_blocks, trace, s, None, 0, marks, flow_base)
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

"""Building the viewer's zoom tiers from a store (the layout is in ``docs/view.md``).

The store's events are re-organised for one question — what lies in a time window at a given
resolution — in files a query maps into memory and slices with a binary search:

* **tracks**: one per host thread (part, pid, tid), device stream (part, device, stream) and
  counter series (part, pid, name, series), numbered in display order;
* **events** with only the columns the viewer draws (id, depth, ts, dur, name code, level
  code), partitioned by **duration class** (class k: dur in [4^k, 4^(k+1)) ns; class 0 also
  holds instants), then by track, sorted by start inside each (class, track) segment (the
  track of a row is that of its segment: ``ev_start`` holds where each segment begins).
  A window reads class k of a track only from ``ts0 - maxdur(k, track)``, and only the classes
  that can hold an event at least a pixel wide, or thin ones no summary level covers;
* **summary levels** (``view/levels.py``): for bucket widths 4^L ns, per (track, depth,
  bucket) the count, busy time and dominant name (by time) of the events thinner than the
  bucket (classes < L). A level is written only where it summarises enough events and at
  least halves their rows; elsewhere a query reads the events themselves, which are then few;
* **links** as the rows of both ends in the event tier, sorted by source id (and a
  permutation by destination id); **counters** sorted by (track, ts); the **step** spans; and
  the event rows sorted by (name, ts) for search.

Everything is streamed from the store a quarter of a row group at a time into memory-mapped
``.npy`` files, each column in the narrowest integer type that holds it, so building a
10 M-event store stays under 1 GB of memory (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xpuprof.core.names import LEVELS
from xpuprof.core.raw import decode_json
from xpuprof.view.levels import BASE, fit, save, write_levels

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from xpuprof.trace.trace import Trace

#: Stands for a null pid, tid or stream in a track's key.
NULL = -(1 << 62)
#: Events read from the store at a time (a row group of the store is 2^20 rows; a quarter of
#: it keeps the build's memory well under a gigabyte on a 10 M-event store).
BATCH = 1 << 18
#: The columns of each tier table: their types, or None where the type is the narrowest that
#: holds the values (``fit``).
EV_COLUMNS = {"id": np.int64, "depth": None, "ts": np.int64, "dur": None, "name": np.int32,
              "level": np.int8}  # fmt: skip
LINK_COLUMNS = {"kind": np.int16, "src": np.int64, "src_row": None, "dst_row": None}
COUNTER_COLUMNS = {"ts": np.int64, "value": np.float64}
_KEY = ["part", "dev", "a", "b"]
_READ = ["id", "part", "rank", "pid", "tid", "device", "stream", "level", "name", "ts", "dur",
         "depth"]  # fmt: skip


def duration_class(dur: np.ndarray) -> np.ndarray:
    """Class of each duration: k for dur in [4^k, 4^(k+1)) ns, 0 for dur < 4 (instants too)."""
    d = np.asarray(dur, np.int64)
    _, e = np.frexp(np.maximum(d, 1).astype(np.float64))
    return np.where(d < BASE, 0, (e.astype(np.int64) - 1) // 2)


# ----------------------------------------------------------------------------------------------
# reading the store in batches
# ----------------------------------------------------------------------------------------------


def _batches(trace: Trace, table: str, columns: list[str]) -> Any:
    """Record batches of one table, file by file, row group by row group."""
    import pyarrow.parquet as pq

    for f in trace.files(table):
        pf = pq.ParquetFile(f)
        yield from pf.iter_batches(batch_size=BATCH, columns=columns)


def _int(col: pa.Array, fill: int) -> np.ndarray:
    import pyarrow.compute as pc

    if col.null_count:
        col = pc.fill_null(col, fill)
    return np.asarray(col.to_numpy(zero_copy_only=False), np.int64)


def _codes(col: pa.Array, table: dict[Any, int], *, add: bool, other: int = -1) -> np.ndarray:
    """Codes of a (dictionary) string column in ``table`` (value → code; new values added
    when ``add``, else ``other``); null → -1."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    values = col.dictionary.to_pylist()
    if add:
        for v in values:
            table.setdefault(v, len(table))
    lookup = np.array([table.get(v, other) for v in values] + [-1], np.int64)
    idx = _int(col.indices, len(values))
    return lookup[idx]


def _columns(b: pa.RecordBatch) -> dict[str, np.ndarray]:
    """The numeric columns of an events batch, nulls filled, with each event's track key
    (part, dev, a, b), end and duration class."""
    c = {k: _int(b.column(k), NULL) for k in ("part", "pid", "tid", "stream")}
    c["rank"] = _int(b.column("rank"), -1)
    c["device"] = _int(b.column("device"), -1)
    c["depth"] = np.maximum(_int(b.column("depth"), 0), 0)
    c["ts"] = _int(b.column("ts"), 0)
    c["dur"] = np.maximum(_int(b.column("dur"), 0), 0)
    c["dev"] = c["device"] >= 0
    c["a"] = np.where(c["dev"], c["device"], c["pid"])
    c["b"] = np.where(c["dev"], c["stream"], c["tid"])
    c["end1"] = c["ts"] + np.maximum(c["dur"], 1)
    c["cls"] = duration_class(c["dur"])
    return c


# ----------------------------------------------------------------------------------------------
# pass 1: tracks, segment sizes, names
# ----------------------------------------------------------------------------------------------


def _scan(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame, dict[Any, int]]:
    """One pass over the events: per track key its rank, count, deepest level, pid/tid and
    time span; per (track key, class) the count and longest duration; the distinct names."""
    import pandas as pd

    tracks, segs, names = [], [], {}
    for b in _batches(trace, "events", _READ):
        c = _columns(b)
        _codes(b.column("name"), names, add=True)
        df = pd.DataFrame({k: c[k] for k in (*_KEY, "rank", "depth", "pid", "tid", "ts", "end1",
                                             "cls", "dur")})  # fmt: skip
        g = df.groupby(_KEY, sort=False)
        tracks.append(g.agg(rank=("rank", "min"), n=("ts", "size"), lanes=("depth", "max"),
                            pid=("pid", "min"), tid=("tid", "min"), t0=("ts", "min"),
                            t1=("end1", "max")))  # fmt: skip
        segs.append(
            df.groupby([*_KEY, "cls"], sort=False).agg(n=("ts", "size"), maxdur=("dur", "max"))
        )
    if not tracks:
        cols = ["rank", "n", "lanes", "pid", "tid", "t0", "t1"]
        empty = pd.DataFrame(columns=[*_KEY, *cols], dtype=np.int64).set_index(_KEY)
        seg = pd.DataFrame(columns=[*_KEY, "cls", "n", "maxdur"], dtype=np.int64)
        return empty, seg.set_index([*_KEY, "cls"]), names
    t = pd.concat(tracks).groupby(level=_KEY).agg(
        {"rank": "min", "n": "sum", "lanes": "max", "pid": "min", "tid": "min", "t0": "min",
         "t1": "max"})  # fmt: skip
    s = pd.concat(segs).groupby(level=[*_KEY, "cls"]).agg({"n": "sum", "maxdur": "max"})
    return t, s, names


def _counter_tracks(trace: Trace) -> pd.DataFrame:
    """Counter series: per (part, pid, name, series) the rank and the number of samples."""
    import pandas as pd

    tb = trace.table("counters", columns=["part", "rank", "pid", "name", "series"])
    if not tb.num_rows:
        return pd.DataFrame(columns=["part", "pid", "name", "series", "rank", "n"])
    df = pd.DataFrame({
        "part": _int(tb["part"].combine_chunks(), NULL),
        "pid": _int(tb["pid"].combine_chunks(), NULL),
        "rank": _int(tb["rank"].combine_chunks(), -1),
        "name": tb["name"].cast("string").fill_null("").to_pylist(),
        "series": tb["series"].cast("string").fill_null("").to_pylist(),
    })  # fmt: skip
    g = df.groupby(["part", "pid", "name", "series"], sort=False)
    return g.agg(rank=("rank", "min"), n=("rank", "size")).reset_index()


def _labels(trace: Trace) -> tuple[dict, dict]:
    """Thread names per (part, pid, tid) and process labels per (part, pid) from the
    ``M`` entries (``thread_name``, ``process_labels``, else ``process_name``)."""
    tb = trace.table("metadata", columns=["part", "name", "pid", "tid", "args"])
    threads: dict[tuple, str] = {}
    procs: dict[tuple, str] = {}
    rows = zip(*(tb[c].to_pylist() for c in ("part", "name", "pid", "tid", "args")), strict=True)
    for part, name, pid, tid, args in rows:
        a = decode_json(args, {})
        if not isinstance(a, dict):
            continue
        if name == "thread_name" and isinstance(a.get("name"), str):
            threads[(part, pid, tid)] = a["name"].strip()
        elif name == "process_labels" and isinstance(a.get("labels"), str):
            procs[(part, pid)] = a["labels"].strip()
        elif name == "process_name" and isinstance(a.get("name"), str):
            procs.setdefault((part, pid), a["name"].strip())
    return threads, procs


def _spelled(trace: Trace, part: int, kind: str, value: int) -> str | None:
    """The string a pid or tid stood for in the source (strings, the empty one too, became
    negative numbers on import: ``meta.string_ids``), or None for a numeric one."""
    src = next((s for s in trace.sources if s["part"] == part), None)
    ids = ((src or {}).get("meta") or {}).get("string_ids") or {}
    got = (ids.get(kind) or {}).get(str(value))
    return got.strip() if isinstance(got, str) else None


def _host_name(trace: Trace, part: int, pid: int) -> str:
    """A host process as the group's name says it: ``host 4512``; a string pid as the source
    spelled it (Kineto's ``Traces``, ``Spans``), an empty one ``(unnamed process)``."""
    if pid == NULL:
        return "host ?"
    text = _spelled(trace, part, "pid", pid)
    return f"host {pid}" if text is None else (text or "(unnamed process)")


def _thread_name(trace: Trace, part: int, tid: int) -> str:
    """A host thread without a ``thread_name``: ``thread 4517``; a string tid as the source
    spelled it (``PyTorch Profiler``), an empty one ``(unnamed thread)``."""
    if tid == NULL:
        return "thread ?"
    text = _spelled(trace, part, "tid", tid)
    return f"thread {tid}" if text is None else (text or "(unnamed thread)")


def _after_numbers(value: int) -> tuple[int, int]:
    """Sort key of a pid or tid: numeric ones first (the real processes and threads), then
    the string ones (negative: -1, -2… in the order the source named them), then null."""
    return (0, value) if value >= 0 else (1, -value)


def track_table(trace: Trace, ev: pd.DataFrame, ct: pd.DataFrame) -> list[dict[str, Any]]:
    """Every track as the viewer's ``tracks()`` lists it, in display order (by rank and part;
    host threads, then device streams, then counters), with its key (``key``) for the build.

    Length: one record per kind of track, with its labels; splitting it would only move the
    three dict literals apart."""
    threads, procs = _labels(trace)
    parts_of_rank: dict[int, set[int]] = {}
    for (part, *_), r in zip(ev.index, ev["rank"], strict=True):
        parts_of_rank.setdefault(int(r), set()).add(int(part))
    for part, r in zip(ct["part"], ct["rank"], strict=True):
        parts_of_rank.setdefault(int(r), set()).add(int(part))

    def group(rank: int, part: int, what: str) -> str:
        many = len(parts_of_rank.get(rank, ())) > 1
        return f"rank {rank}{f' (part {part})' if many else ''} · {what}"

    out = []
    for (part, dev, a, b), row in ev.iterrows():
        part, a, b, rank = int(part), int(a), int(b), int(row["rank"])
        pid = int(row["pid"])
        rec = {"rank": rank, "lanes": int(row["lanes"]) + 1, "events": int(row["n"]),
               "key": [part, int(bool(dev)), a, b]}  # fmt: skip
        if dev:
            tid = int(row["tid"])
            what = procs.get((part, pid)) or f"device {a}"
            if not what.lower().startswith(("gpu", "tpu", "device", "npu", "xpu")):
                what = f"device {a}"
            label = threads.get((part, pid, tid)) or f"stream {'?' if b == NULL else b}"
            rec |= {"kind": "stream", "pid": pid, "tid": None, "device": a,
                    "stream": None if b == NULL else b, "group": group(rank, part, what),
                    "label": label, "order": (rank, part, 1, (0, a), (0, b), "")}  # fmt: skip
        else:
            label = threads.get((part, a, b)) or _thread_name(trace, part, b)
            rec |= {"kind": "thread", "pid": None if a == NULL else a,
                    "tid": None if b == NULL else b, "device": -1, "stream": None,
                    "group": group(rank, part, _host_name(trace, part, a)), "label": label,
                    "order": (rank, part, 0, _after_numbers(a), _after_numbers(b), "")}  # fmt: skip
        out.append(rec)
    for _, row in ct.iterrows():
        part, pid, rank = int(row["part"]), int(row["pid"]), int(row["rank"])
        label = f"{row['name']}: {row['series']}" if row["series"] else str(row["name"])
        out.append(
            {
                "rank": rank,
                "kind": "counter",
                "pid": None if pid == NULL else pid,
                "tid": None,
                "device": -1,
                "stream": None,
                "group": group(rank, part, "counters"),
                "label": label,
                "lanes": 1,
                "events": int(row["n"]),
                "key": [part, pid, row["name"], row["series"]],
                "order": (rank, part, 2, (0, pid), (0, 0), f"{row['name']}\0{row['series']}"),
            }
        )
    out.sort(key=lambda r: r.pop("order"))
    for i, r in enumerate(out):
        r["track"] = i
    return out


# ----------------------------------------------------------------------------------------------
# pass 2: the events, by (class, track, ts)
# ----------------------------------------------------------------------------------------------


def _track_index(tracks: list[dict[str, Any]]) -> Any:
    import pandas as pd

    keys = [tuple(t["key"]) for t in tracks if t["kind"] != "counter"]
    ids = [t["track"] for t in tracks if t["kind"] != "counter"]
    if not keys:
        return pd.MultiIndex.from_arrays([[]] * 4, names=_KEY), np.empty(0, np.int64)
    return pd.MultiIndex.from_tuples(keys, names=_KEY), np.array(ids, np.int64)


def _fill(trace: Trace, out: Path, tracks: list[dict[str, Any]], seg: pd.DataFrame,
          names: dict[Any, int], n: int,
          depth_max: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
    """Write every event into its (class, track) segment (memory-mapped columns), then sort
    each segment by start. Returns the segment starts (class-major, ``C * T + 1``) and the
    step spans seen (id, part, step)."""
    import pandas as pd

    n_tracks = len(tracks)
    index, ids = _track_index(tracks)
    classes = int(seg.index.get_level_values("cls").max()) + 1 if len(seg) else 1
    counts = np.zeros(classes * n_tracks, np.int64)
    if len(seg):
        k = seg.index.droplevel("cls")
        tr = ids[index.get_indexer(k)]
        counts[seg.index.get_level_values("cls").to_numpy() * n_tracks + tr] = seg["n"].to_numpy()
    start = np.concatenate([[0], np.cumsum(counts)])
    top = {"depth": int(depth_max), "dur": int(seg["maxdur"].max()) if len(seg) else 0}
    cols = {c: np.lib.format.open_memmap(out / f"ev_{c}.npy", mode="w+", shape=(n,),
                                         dtype=t if t is not None else fit(top[c]))
            for c, t in EV_COLUMNS.items()}  # fmt: skip
    cursor = np.zeros(classes * n_tracks, np.int64)
    levels = {lv: i for i, lv in enumerate(LEVELS)}
    steps: dict[str, list[np.ndarray]] = {"id": [], "part": [], "step": []}
    for b in _batches(trace, "events", [*_READ, "step"]):
        c = _columns(b)
        key = pd.MultiIndex.from_arrays([c[k] for k in _KEY], names=_KEY)
        track = ids[index.get_indexer(key)]
        g = c["cls"] * n_tracks + track
        order = np.argsort(g, kind="stable")
        gs = g[order]
        uniq, first, cnt = np.unique(gs, return_index=True, return_counts=True)
        dest = start[gs] + cursor[gs] + (np.arange(len(gs)) - np.repeat(first, cnt))
        cursor[uniq] += cnt
        level = _codes(b.column("level"), levels, add=False, other=levels["other"])
        vals = {"id": _int(b.column("id"), -1), "depth": c["depth"],
                "ts": c["ts"], "dur": c["dur"], "name": _codes(b.column("name"), names, add=False),
                "level": level}  # fmt: skip
        for k, v in vals.items():
            cols[k][dest] = v[order]
        st = np.flatnonzero(level == levels["step"])
        if st.size:
            steps["id"].append(vals["id"][st])
            steps["part"].append(c["part"][st])
            steps["step"].append(_int(b.column("step"), -1)[st])
    for g in np.flatnonzero(counts > 1):
        a, e = start[g], start[g + 1]
        ts = cols["ts"][a:e]
        if (ts[1:] >= ts[:-1]).all():
            continue
        order = np.lexsort((cols["id"][a:e], ts))
        for v in cols.values():
            v[a:e] = v[a:e][order]
    for v in cols.values():
        v.flush()
    del cols
    return start, {k: np.concatenate(v) if v else np.empty(0, np.int64) for k, v in steps.items()}


# ----------------------------------------------------------------------------------------------
# the rest: search order, summary levels, links, counters
# ----------------------------------------------------------------------------------------------


def _by_name(out: Path, n_names: int) -> None:
    """Rows sorted by (name, ts): ``name_rows`` and each name's range in it (``name_off``)."""
    name = np.load(out / "ev_name.npy", mmap_mode="r")
    ts = np.load(out / "ev_ts.npy", mmap_mode="r")
    order = np.lexsort((ts, name)) if len(name) else np.empty(0, np.int64)
    save(out, "name_rows", order, fit(len(order)))
    save(out, "name_off", np.searchsorted(np.asarray(name)[order], np.arange(n_names + 1)),
         np.int64)  # fmt: skip


def _arrow(out: Path, a: int, e: int, track: np.ndarray) -> pa.Table:
    """Rows [a, e) of the event tier as an Arrow table over the mapped files (no copy), with
    their ``track``."""
    import pyarrow as pa

    cols = {"track": pa.array(track)}
    for c in ("depth", "ts", "dur", "name"):
        v = np.load(out / f"ev_{c}.npy", mmap_mode="r")[a:e]
        typ = pa.from_numpy_dtype(v.dtype)
        cols[c] = pa.Array.from_buffers(typ, len(v), [None, pa.py_buffer(v)])
    return pa.table(cols)


class _Rows:
    """id → row of the event tier (for links and steps), built once."""

    def __init__(self, out: Path) -> None:
        ids = np.load(out / "ev_id.npy", mmap_mode="r")
        self.order = np.argsort(ids, kind="stable").astype(fit(len(ids)))
        self.sorted = np.asarray(ids)[self.order]

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        if not len(self.sorted):
            return np.full(len(ids), -1, np.int64)
        pos = np.clip(np.searchsorted(self.sorted, ids), 0, len(self.sorted) - 1)
        return np.where(self.sorted[pos] == ids, self.order[pos], -1)


def _links(trace: Trace, out: Path, rows: _Rows) -> list[str]:
    """Links whose two ends are events, with both ends' rows in the event tier; sorted by
    source id, with ``lk_bydst`` the order by destination id (``lk_dstsorted`` those ids).
    Returns the link kinds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kinds: dict[Any, int] = {}
    got: dict[str, list[np.ndarray]] = {"kind": [], "src": [], "dst": []}
    for b in _batches(trace, "links", ["kind", "src", "dst"]):
        src, dst = _int(b.column("src"), -1), _int(b.column("dst"), -1)
        kind = b.column("kind")
        if pa.types.is_dictionary(kind.type):
            kind = kind.dictionary_decode()
        kind = pc.utf8_lower(kind.cast(pa.string()))
        code = _codes(kind, kinds, add=True)
        ok = (src >= 0) & (dst >= 0)
        for k, v in (("kind", code), ("src", src), ("dst", dst)):
            got[k].append(v[ok])
    lk = {k: np.concatenate(v) if v else np.empty(0, np.int64) for k, v in got.items()}
    rs, rd = rows(lk["src"]), rows(lk["dst"])
    ok = (rs >= 0) & (rd >= 0)
    lk = {k: v[ok] for k, v in lk.items()}
    lk["src_row"], lk["dst_row"] = rs[ok], rd[ok]
    order = np.argsort(lk["src"], kind="stable")
    lk = {k: v[order] for k, v in lk.items()}
    for k, t in LINK_COLUMNS.items():
        save(out, f"lk_{k}", lk[k], t)
    bydst = np.argsort(lk["dst"], kind="stable")
    save(out, "lk_bydst", bydst)
    save(out, "lk_dstsorted", lk["dst"][bydst], np.int64)
    return [str(k) if k is not None else "" for k in kinds]


def _counters(trace: Trace, out: Path, tracks: list[dict[str, Any]]) -> tuple[int, int] | None:
    """Counter samples sorted by (track, ts), and each track's range (``ct_off``); the span
    of the samples (None: no samples)."""
    import pandas as pd

    keys = {tuple(t["key"]): t["track"] for t in tracks if t["kind"] == "counter"}
    tb = trace.table("counters", columns=["part", "pid", "name", "series", "ts", "value"])
    if keys and tb.num_rows:
        df = pd.DataFrame({
            "part": _int(tb["part"].combine_chunks(), NULL),
            "pid": _int(tb["pid"].combine_chunks(), NULL),
            "name": tb["name"].cast("string").fill_null("").to_pylist(),
            "series": tb["series"].cast("string").fill_null("").to_pylist(),
        })  # fmt: skip
        idx = pd.MultiIndex.from_tuples(list(keys))
        track = np.array(list(keys.values()), np.int64)[
            idx.get_indexer(pd.MultiIndex.from_frame(df))
        ]
        ts = _int(tb["ts"].combine_chunks(), 0)
        value = tb["value"].combine_chunks().to_numpy(zero_copy_only=False).astype(np.float64)
    else:
        track, ts, value = (np.empty(0, np.int64),) * 2 + (np.empty(0, np.float64),)
    order = np.lexsort((ts, track))
    save(out, "ct_ts", ts[order], np.int64)
    save(out, "ct_value", value[order], np.float64)
    save(out, "ct_off", np.searchsorted(track[order], np.arange(len(tracks) + 1)), np.int64)
    return (int(ts.min()), int(ts.max()) + 1) if len(ts) else None


def build(trace: Trace, out: Path, digest: str) -> dict[str, Any]:
    """Write the tiers of ``trace`` into the folder ``out`` (``meta.json`` last); their meta."""
    ev, seg, names = _scan(trace)
    ct = _counter_tracks(trace)
    tracks = track_table(trace, ev, ct)
    n = int(ev["n"].sum()) if len(ev) else 0
    start, steps = _fill(
        trace, out, tracks, seg, names, n, int(ev["lanes"].max()) if len(ev) else 0
    )
    _by_name(out, len(names))
    t0 = int(ev["t0"].min()) if len(ev) else 0
    t1 = int(ev["t1"].max()) if len(ev) else 0
    n_tracks = len(tracks)
    classes = (len(start) - 1) // n_tracks if n_tracks else 0
    maxdur = np.zeros(len(start) - 1, np.int64)
    if len(seg):
        index, ids = _track_index(tracks)
        tr = ids[index.get_indexer(seg.index.droplevel("cls"))]
        maxdur[seg.index.get_level_values("cls").to_numpy() * n_tracks + tr] = seg["maxdur"]
    save(out, "ev_start", start, np.int64)
    save(out, "ev_maxdur", maxdur, np.int64)
    rows = _Rows(out)
    kinds = _links(trace, out, rows)
    step_rows = rows(steps["id"])
    ok = step_rows >= 0
    save(out, "st_part", steps["part"][ok], np.int64)
    save(out, "st_step", steps["step"][ok], np.int64)
    save(out, "st_row", step_rows[ok], np.int64)
    del rows
    span = _counters(trace, out, tracks)
    levels = write_levels(out, start, n_tracks, t0, t1, len(names))
    origin = t0
    if span is not None:
        t0, t1 = (span[0], span[1]) if not n else (min(t0, span[0]), max(t1, span[1]))
    meta = {"version": 1, "digest": digest, "t0": t0, "t1": t1, "events": n, "tracks": n_tracks,
            "classes": classes, "levels": levels, "kinds": kinds, "origin": origin}  # fmt: skip
    (out / "names.json").write_text(json.dumps(list(names)))
    (out / "tracks.json").write_text(json.dumps(tracks))
    (out / "meta.json").write_text(json.dumps(meta))
    return meta

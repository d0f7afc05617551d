"""The summary levels of the zoom tiers: per (track, depth, bucket of 4^L ns) the count, busy
time and dominant name of the events thinner than the bucket (``docs/view.md``).

A level is made track by track from the event tier (every event of a track, sorted by start:
a merge of its duration classes), so the bucket of consecutive events is non-decreasing and
the grouping sort runs over nearly sorted keys. The same two helpers (sums over segments, the
dominant name of a segment) aggregate a window's pixels at query time (``view/window.py``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

#: Ratio of the duration classes and of the bucket ladder.
BASE = 4
#: A summary level is written only when it has at most this share of the rows it summarises…
COMPRESSION = 0.5
#: …and summarises at least this many events (fewer are read as they are, in milliseconds).
MIN_THIN = 50_000
#: The columns of a level: their types, or None where the type is the narrowest that holds
#: the values (``build.fit``).
SUM_COLUMNS = {"ts": np.int64, "depth": None, "count": None, "busy": None, "name": np.int32,
               "top": None}  # fmt: skip


def fit(top: int) -> Any:
    """The narrowest type for values in [0, top] (a row number, a depth, a duration)."""
    for t in (np.int16, np.uint32):
        if top <= np.iinfo(t).max:
            return t
    return np.int64


def save(folder: Path, name: str, values: np.ndarray, dtype: Any = None) -> None:
    values = np.asarray(values)
    if dtype is None:
        dtype = fit(int(values.max()) if values.size else 0)
    np.save(folder / f"{name}.npy", np.ascontiguousarray(values, dtype=dtype))


def segment_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums of the segments of ``values`` that begin at ``starts`` (increasing, from 0): from
    one cumulative sum, several times faster than ``np.add.reduceat`` on many segments."""
    cs = np.cumsum(values, dtype=np.int64)
    ends = np.r_[starts[1:], len(values)] - 1
    return cs[ends] - np.r_[0, cs][starts]


def dominant(first: np.ndarray, top: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    """Per segment of groups (segments start at ``first``; groups sorted by name inside),
    the group with the most time, then the most events, then the first: O(n), no sort."""
    n = len(top)
    seg = np.repeat(np.arange(len(first)), np.diff(np.r_[first, n]))
    best = top == np.maximum.reduceat(top, first)[seg]
    c = np.where(best, cnt, -1)
    best &= c == np.maximum.reduceat(c, first)[seg]
    idx = np.flatnonzero(best)
    return idx[np.r_[True, seg[idx][1:] != seg[idx][:-1]]]


def bucket(ts: np.ndarray, dur: np.ndarray, depth: np.ndarray, name: np.ndarray, width: int,
           origin: int, n_names: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Events of one track (sorted by start) summarised per (bucket of ``width`` ns, depth):
    count, busy time, dominant name (most time, then most events, then the first name) and
    that name's time; rows sorted by (bucket, depth)."""
    b = (ts - origin) // width
    n_depth = int(depth.max()) + 1
    k1 = b * n_depth + depth
    if (int(k1.max()) + 1) * n_names < 1 << 62:
        o = np.argsort(k1 * n_names + name + 1, kind="stable")  # nearly sorted: cheap
    else:
        o = np.lexsort((name, k1))
    k1, nm = k1[o], name[o]
    g = np.flatnonzero(np.r_[True, (k1[1:] != k1[:-1]) | (nm[1:] != nm[:-1])])
    cnt = np.diff(np.r_[g, len(k1)])
    d = segment_sums(dur[o], g)
    gk, gn = k1[g], nm[g]
    f = np.flatnonzero(np.r_[True, gk[1:] != gk[:-1]])
    dom = dominant(f, d, cnt)
    return {"ts": origin + (gk[f] // n_depth) * width,
            "depth": (gk[f] % n_depth).astype(np.int32),
            "count": segment_sums(cnt, f).astype(np.int32), "busy": segment_sums(d, f),
            "name": gn[dom].astype(np.int32), "top": d[dom]}  # fmt: skip


def _track_events(out: Path, start: np.ndarray, n_tracks: int, track: int) -> dict[str, np.ndarray]:
    """All events of one track, sorted by start, with their duration class."""
    classes = (len(start) - 1) // n_tracks
    ev = {c: np.load(out / f"ev_{c}.npy", mmap_mode="r") for c in ("ts", "dur", "depth", "name")}
    spans = [(c, int(start[c * n_tracks + track]), int(start[c * n_tracks + track + 1]))
             for c in range(classes)]  # fmt: skip
    spans = [x for x in spans if x[2] > x[1]]
    if not spans:
        return {k: np.empty(0, np.int64) for k in ("ts", "dur", "depth", "name", "cls")}
    got = {k: np.concatenate([np.asarray(v[a:e]) for _, a, e in spans]).astype(np.int64)
           for k, v in ev.items()}  # fmt: skip
    got["cls"] = np.repeat([c for c, _, _ in spans], [e - a for _, a, e in spans])
    o = np.argsort(got["ts"], kind="stable")  # a merge of sorted runs
    return {k: v[o] for k, v in got.items()}


def write_levels(out: Path, start: np.ndarray, n_tracks: int, t0: int, t1: int,
            n_names: int) -> list[int]:  # fmt: skip
    """Write the summary levels that pay (``sum{L}_*.npy``): level L holds, per (track, depth,
    bucket of 4^L ns), the count, busy time and dominant name of the events of classes < L.

    A level is written when it summarises at least ``MIN_THIN`` events in at most
    ``COMPRESSION`` as many rows. Levels are made track by track, coarsest first; a level
    whose rows pass that bound is dropped on the spot, with every finer one (they compress
    worse), so neither time nor memory goes into levels that would not be written."""
    classes = (len(start) - 1) // max(n_tracks, 1)
    if not n_tracks or not classes:
        return []
    top = max(1, math.ceil(math.log(max(t1 - t0, 1) + 1, BASE)) + 1)
    thin = {lv: int(start[min(lv, classes) * n_tracks]) for lv in range(1, top + 1)}
    alive = [lv for lv in range(top, 0, -1) if thin[lv] >= MIN_THIN]  # coarsest first
    got: dict[int, list[dict[str, np.ndarray]]] = {lv: [] for lv in alive}
    rows = dict.fromkeys(alive, 0)
    for track in range(n_tracks):
        if not alive:
            break
        ev = _track_events(out, start, n_tracks, track)
        if not len(ev["ts"]):
            continue
        for lv in list(alive):
            m = ev["cls"] < lv
            if not m.any():
                continue
            r = bucket(ev["ts"][m], ev["dur"][m], ev["depth"][m], ev["name"][m], BASE**lv, t0,
                       n_names + 1)  # fmt: skip
            rows[lv] += len(r["ts"])
            if rows[lv] > COMPRESSION * thin[lv]:
                for finer in [x for x in alive if x <= lv]:
                    alive.remove(finer)
                    del got[finer]
                break
            r["track"] = np.full(len(r["ts"]), track, np.int32)
            got[lv].append(r)
    for lv in alive:
        cols = {c: np.concatenate([r[c] for r in got[lv]]) for c in (*SUM_COLUMNS, "track")}
        for k, t in SUM_COLUMNS.items():
            save(out, f"sum{lv}_{k}", cols[k], t)  # t None: the narrowest type
        save(out, f"sum{lv}_off", np.searchsorted(cols["track"], np.arange(n_tracks + 1)),
             np.int64)  # fmt: skip
    return sorted(alive)

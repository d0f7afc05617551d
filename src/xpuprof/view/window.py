"""The viewer's tracks and its window query: what lies in ``[ts0, ts1)`` at ``width_px``.

An event at least one pixel wide (``dur >= ns_per_px``) that overlaps the window is returned as
it is. Everything thinner is merged per pixel per lane (a lane: one depth of one track) into a
summary: how many events, the busy fraction of the pixel (their summed duration over the
pixel's width, at most 1) and the dominant name (the name with the most time; ties: more
events, then the first name). Adjacent pixels of a lane with the same dominant name are merged
into one summary (run-length), and when the answer would still hold 50,000 items or more the
pixels are made 2, 4, 8… times wider (``summary_px``): events narrower than the wider pixel
join the summaries. Counters are lanes of samples, kept whole when there are few, else the
minimum and maximum sample of each pixel (so spikes survive) plus the first and last. Flows
(launch → kernel, forward → backward) are those of the events returned, at most 5,000.

What a query reads (``view/build.py``): the events of the duration classes that can be a
pixel wide, from ``ts0 - maxdur`` of each (class, track) segment, and for the thinner ones the
coarsest written summary level whose buckets are no wider than a pixel — re-aggregated into
pixels here. Where no level is written below the pixel, the thin events themselves are read:
a level is missing only where it would not have had fewer rows than those events. A pixel made
of buckets takes its dominant name among the buckets' dominant names (weighted by their
time): exact when it is made of events, an approximation when made of buckets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from xpuprof.core.names import LEVELS
from xpuprof.view.errors import NotFound, ViewError
from xpuprof.view.levels import BASE, dominant, segment_sums
from xpuprof.view.tiers import Tiers, open_tiers

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: An answer holds fewer items than this (events, summaries, counter samples and flows).
BUDGET = 50_000
#: At most this many flows per answer (``flows_cut`` says when there were more).
FLOW_LIMIT = 5_000
#: The widest window in pixels a client may ask for.
MAX_WIDTH = 16_384
_LEVEL_NAMES = np.array(LEVELS, dtype=object)
_NO_BUCKETS = {c: np.empty(0, np.int64) for c in ("track", "depth", "ts", "count", "busy",
                                                  "name", "top")}  # fmt: skip


def integer(name: str, value: Any) -> int:
    """A parameter that must be an integer: an int, a float with no fraction (what a
    JavaScript client sends), or the text of an integer; else ``ViewError``."""
    if isinstance(value, bool):
        raise ViewError(f"{name} must be an integer, not {value!r}")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and value == int(value):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ViewError(f"{name} must be an integer, not {value!r}")


def tracks(trace: Trace, *, sim: bool = False) -> dict[str, Any]:
    """The trace's span (``t0``, ``t1``: every event and sample lies in ``[t0, t1)``) and its
    tracks in display order (``docs/view.md``); with ``sim``, each replayed thread and stream
    followed by its simulated twin (:func:`xpuprof.view.simulated.tracks`)."""
    tv = open_tiers(trace)
    if sim:
        from xpuprof.view import simulated

        return simulated.tracks(trace, tv)
    return {"t0": tv.meta["t0"], "t1": tv.meta["t1"], "tracks": [dict(t) for t in tv.public]}


def select(tv: Tiers, wanted: Iterable[Any] | None) -> np.ndarray:
    """Track numbers asked for (None: all), checked."""
    if wanted is None:
        return np.arange(tv.n_tracks, dtype=np.int64)
    if isinstance(wanted, (str, bytes)) or not isinstance(wanted, Iterable):
        raise ViewError(f"tracks must be a list of track numbers, not {wanted!r}")
    ids = [integer("track", t) for t in wanted]
    bad = [t for t in ids if not 0 <= t < tv.n_tracks]
    if bad:
        raise NotFound(f"no track {bad[0]} in this trace (tracks are 0..{tv.n_tracks - 1})")
    return np.unique(np.array(ids, np.int64))


def expand(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """All positions of the ranges [lo, hi), concatenated."""
    n = np.maximum(hi - lo, 0)
    total = int(n.sum())
    if not total:
        return np.empty(0, np.int64)
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(n)[:-1]]), n)
    return starts + np.arange(total)


def _gather(cols: dict[str, np.ndarray], names: Iterable[str], ranges: list[tuple[int, int]],
            tracks: list[int]) -> dict[str, np.ndarray]:  # fmt: skip
    """Columns of the row ranges, concatenated, with each row's ``track``."""
    out = {c: np.concatenate([cols[c][a:b] for a, b in ranges]) if ranges
           else np.empty(0, cols[c].dtype) for c in names}  # fmt: skip
    n = [b - a for a, b in ranges]
    out["track"] = np.repeat(np.array(tracks, np.int64), n) if ranges else np.empty(0, np.int64)
    return out


def read_events(
    tv: Tiers, sel: np.ndarray, ts0: int, ts1: int, c_min: int
) -> dict[str, np.ndarray]:
    """Events of classes >= ``c_min`` of the tracks ``sel`` that overlap [ts0, ts1) (an
    instant: ts0 <= ts < ts1), with their ``track`` and duration class ``cls``."""
    ranges, tracks, classes = [], [], []
    ts = tv.ev["ts"]
    for c in range(c_min, tv.classes):
        g = c * tv.n_tracks + sel
        a, e = tv.start[g], tv.start[g + 1]
        for i in np.flatnonzero(a < e):
            lo = ts0 - max(int(tv.maxdur[g[i]]), 1) + 1
            x, y = np.searchsorted(ts[a[i] : e[i]], [lo, ts1])
            if y > x:
                ranges.append((int(a[i] + x), int(a[i] + y)))
                tracks.append(int(sel[i]))
                classes.append(c)
    got = _gather(tv.ev, tv.ev.keys(), ranges, tracks)
    got["cls"] = np.repeat(np.array(classes, np.int64), [b - a for a, b in ranges])
    keep = got["ts"] + np.maximum(got["dur"], 1) > ts0
    return got if keep.all() else {k: v[keep] for k, v in got.items()}


def _bucket_ranges(tv: Tiers, level: int, sel: np.ndarray, ts0: int,
                   ts1: int) -> tuple[list[tuple[int, int]], list[int]]:  # fmt: skip
    lv = tv.levels[level]
    w = BASE**level
    ranges, tracks = [], []
    a, e = lv["off"][sel], lv["off"][sel + 1]
    for i in np.flatnonzero(a < e):
        x, y = np.searchsorted(lv["ts"][a[i] : e[i]], [ts0 - w + 1, ts1])
        if y > x:
            ranges.append((int(a[i] + x), int(a[i] + y)))
            tracks.append(int(sel[i]))
    return ranges, tracks


def read_buckets(
    tv: Tiers, level: int, sel: np.ndarray, ts0: int, ts1: int
) -> dict[str, np.ndarray]:
    """Buckets of a summary level of the tracks ``sel`` that overlap [ts0, ts1)."""
    ranges, tracks = _bucket_ranges(tv, level, sel, ts0, ts1)
    return _gather(tv.levels[level], ("depth", "ts", "count", "busy", "name", "top"), ranges,
                   tracks)  # fmt: skip


def count_buckets(tv: Tiers, level: int, sel: np.ndarray, ts0: int, ts1: int) -> int:
    """How many buckets ``read_buckets`` would read."""
    return sum(b - a for a, b in _bucket_ranges(tv, level, sel, ts0, ts1)[0]) if level else 0


def level_for(tv: Tiers, px_ns: float) -> int:
    """The coarsest written summary level whose buckets are no wider than a pixel (0: none)."""
    return max((lv for lv in tv.levels if BASE**lv <= px_ns), default=0)


def _thin(rows: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    """Thin events as one-event buckets."""
    out = {c: rows[c][mask] for c in ("track", "depth", "ts", "name")}
    out["count"] = np.ones(len(out["ts"]), np.int64)
    out["busy"] = out["top"] = rows["dur"][mask]
    return out


def summarise(tv: Tiers, parts: list[dict[str, np.ndarray]], ts0: int, px_ns: float,
              npx: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Per-pixel summaries of thin events and buckets (each a dict of ``track``, ``depth``,
    ``ts`` (start), ``count``, ``busy``, ``name``, ``top`` (the name's time)), merged along
    each lane where adjacent pixels share their dominant name."""
    cols = ("track", "depth", "ts", "count", "busy", "name", "top")
    x = {c: np.concatenate([p[c] for p in parts]) for c in cols}
    if not len(x["ts"]):
        return {c: np.empty(0, np.int64) for c in ("track", "depth", "ts", "dur", "count",
                                                  "busy", "name")}  # fmt: skip
    lane = tv.lane_base[x["track"]] + x["depth"]
    px = np.clip(((x["ts"] - ts0) * (1.0 / px_ns)).astype(np.int64), 0, npx - 1)
    px[x["ts"] < ts0] = 0  # truncation rounds the negatives up: they start before the window
    key = lane * npx + px
    n_names = len(tv.names) + 1
    name = x["name"].astype(np.int64)
    if int(key.max()) < (1 << 62) // n_names:
        order = np.argsort(key * n_names + name + 1, kind="stable")
    else:
        order = np.lexsort((name, key))
    key, name = key[order], name[order]
    grp = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]) | (name[1:] != name[:-1])])
    cnt, busy, top = (segment_sums(x[c][order], grp) for c in ("count", "busy", "top"))
    gkey, gname = key[grp], name[grp]
    first = np.flatnonzero(np.r_[True, gkey[1:] != gkey[:-1]])
    dom = dominant(first, top, cnt)
    pk = gkey[first]
    pname = gname[dom]
    pcnt, pbusy = segment_sums(cnt, first), segment_sums(busy, first)
    plane, ppx = pk // npx, pk % npx
    run = np.flatnonzero(np.r_[True, (plane[1:] != plane[:-1]) | (ppx[1:] != ppx[:-1] + 1)
                               | (pname[1:] != pname[:-1])])  # fmt: skip
    last = np.r_[run[1:], len(pk)] - 1
    track = tv.lane_track[plane[run]]
    a = np.round(ts0 + ppx[run] * px_ns).astype(np.int64)
    b = np.round(ts0 + (ppx[last] + 1) * px_ns).astype(np.int64)
    width = (ppx[last] + 1 - ppx[run]) * px_ns
    return {
        "track": track,
        "depth": plane[run] - tv.lane_base[track],
        "ts": a,
        "dur": b - a,
        "count": segment_sums(pcnt, run),
        "busy": np.minimum(segment_sums(pbusy, run) / width, 1.0),
        "name": pname[run],
    }


def counters(tv: Tiers, sel: np.ndarray, ts0: int, ts1: int, px_ns: float,
             npx: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Samples of the counter tracks ``sel`` in the window, with the one before it and the one
    after it (the line reaches both edges); per pixel only its minimum and maximum when the
    track has more than two samples per pixel."""
    out: dict[str, list[np.ndarray]] = {"track": [], "ts": [], "value": []}
    ts_all, val_all = tv.counters["ts"], tv.counters["value"]
    for t in sel:
        a, e = int(tv.ct_off[t]), int(tv.ct_off[t + 1])
        if a == e:
            continue
        seg = ts_all[a:e]
        i0 = max(int(np.searchsorted(seg, ts0, "right")) - 1, 0)
        i1 = min(int(np.searchsorted(seg, ts1, "left")) + 1, e - a)
        ts, v = np.asarray(seg[i0:i1]), np.asarray(val_all[a + i0 : a + i1])
        ok = ~np.isnan(v)
        ts, v = ts[ok], v[ok]
        if len(ts) > 2 * npx:
            px = np.clip(((ts - ts0) * (1.0 / px_ns)).astype(np.int64), 0, npx - 1)
            px[ts < ts0] = 0
            first = np.flatnonzero(np.r_[True, px[1:] != px[:-1]])
            seg = np.repeat(np.arange(len(first)), np.diff(np.r_[first, len(px)]))
            lo = np.flatnonzero(v == np.minimum.reduceat(v, first)[seg])
            hi = np.flatnonzero(v == np.maximum.reduceat(v, first)[seg])
            lo = lo[np.r_[True, seg[lo][1:] != seg[lo][:-1]]]
            hi = hi[np.r_[True, seg[hi][1:] != seg[hi][:-1]]]
            keep = np.unique(np.concatenate([lo, hi, [0, len(ts) - 1]]))
            ts, v = ts[keep], v[keep]
        out["track"].append(np.full(len(ts), t, np.int64))
        out["ts"].append(ts)
        out["value"].append(v)
    return {k: np.concatenate(v) if v else np.empty(0) for k, v in out.items()}


def count_samples(tv: Tiers, sel: np.ndarray, ts0: int, ts1: int) -> int:
    """How many samples of the counter tracks ``sel`` lie in the window (with the edges)."""
    n = 0
    for t in sel:
        a, e = int(tv.ct_off[t]), int(tv.ct_off[t + 1])
        x, y = np.searchsorted(tv.counters["ts"][a:e], [ts0, ts1])
        n += int(y - x) + 2
    return n


def _unique(a: np.ndarray) -> np.ndarray:
    a = np.sort(a)
    return a[np.r_[True, a[1:] != a[:-1]]] if len(a) else a


def flows(tv: Tiers, ids: np.ndarray, limit: int = FLOW_LIMIT) -> tuple[np.ndarray, int]:
    """Rows of the links with an end among ``ids``, the earliest ``limit`` (by source start),
    and how many there were."""
    src = tv.links["src"]
    if not len(ids) or not len(src):
        return np.empty(0, np.int64), 0
    ids = _unique(np.asarray(ids, np.int64))
    out = expand(np.searchsorted(src, ids, "left"), np.searchsorted(src, ids, "right"))
    d = tv.links_dst_sorted
    pos = expand(np.searchsorted(d, ids, "left"), np.searchsorted(d, ids, "right"))
    rows = _unique(np.concatenate([out, np.asarray(tv.links_by_dst[pos], np.int64)]))
    total = len(rows)
    if total > limit:
        ts = np.asarray(tv.ev["ts"][np.asarray(tv.links["src_row"][rows], np.int64)])
        rows = np.sort(rows[np.argsort(ts, kind="stable")[:limit]])
    return rows, total


def next_scale(dur: np.ndarray, px_ns: float, summaries: int, others: int,
               budget: int = BUDGET) -> int:  # fmt: skip
    """How many times wider the pixels must be after an answer over ``budget``: the smallest
    power of two at which the events still a pixel wide, plus the summaries shrunk in
    proportion, fit in it (2 at least)."""
    k = 2
    while k < 1 << 20:
        if int((dur >= px_ns * k).sum()) + summaries / k + others < budget:
            return k
        k *= 2
    return k


def start_scale(tv: Tiers, rows: dict[str, np.ndarray], buckets: Any, ts0: int, ns: float,
                width: int, n_samples: int, n_counters: int,
                budget: int = BUDGET) -> int:  # fmt: skip
    """The finest pixel scale (1, 2, 4…) at which the answer is likely under ``budget``, so
    that the summaries are aggregated once, rarely twice, rather than at every scale.

    When the rows read cannot exceed the budget, 1. Else the scales are tried from the
    coarsest down, each on the summary level of its own pixel (so coarse tries read few
    buckets): the events at least a pixel wide are counted, and the summaries estimated on a
    map of lanes × pixels holding one name per occupied pixel (one of its names, standing for
    the dominant one): one summary per run of occupied pixels with that name."""
    if len(rows["ts"]) + buckets(level_for(tv, ns), count=True) + n_samples < budget:
        return 1
    dense = np.full(int(tv.lane_base[-1]) + 1, -1, np.int64)

    def estimate(s: int) -> int:
        npx, px_ns = math.ceil(width / s), ns * s
        level = level_for(tv, px_ns)
        keep = rows["cls"] >= level
        wide = keep & (rows["dur"] >= px_ns)
        thin = keep & ~wide
        parts = [{c: rows[c][thin] for c in ("track", "depth", "ts", "name")}, buckets(level)]
        lane = np.concatenate([tv.lane_base[p["track"]] + p["depth"] for p in parts])
        if not len(lane):
            return int(wide.sum())
        present = np.unique(lane)
        if len(present) * npx > 20_000_000:
            return budget  # too large a map: take it as too many
        dense[present] = np.arange(len(present))
        ts = np.concatenate([p["ts"] for p in parts])
        px = np.clip(((ts - ts0) * (1.0 / px_ns)).astype(np.int64), 0, npx - 1)
        px[ts < ts0] = 0
        rep = np.full((len(present), npx), -2, np.int64)
        rep[dense[lane], px] = np.concatenate([p["name"] for p in parts])
        occ = rep != -2
        runs = int(occ[:, 0].sum() + (occ[:, 1:] & (rep[:, 1:] != rep[:, :-1])).sum())
        return int(wide.sum()) + runs + min(n_samples, 2 * npx * n_counters)

    s = 1 << max(0, math.ceil(math.log2(width)))
    while s > 1 and estimate(s // 2) < budget:
        s //= 2
    return s


def _check(ts0: Any, ts1: Any, width_px: Any) -> tuple[int, int, int]:
    ts0, ts1, width = integer("ts0", ts0), integer("ts1", ts1), integer("width_px", width_px)
    if ts1 <= ts0:
        raise ViewError(f"the window must end after it starts (ts0={ts0}, ts1={ts1})")
    if not 1 <= width <= MAX_WIDTH:
        raise ViewError(f"width_px must be 1..{MAX_WIDTH}, not {width}")
    if ts0 < -(1 << 62) or ts1 > (1 << 62):
        raise ViewError(f"the window [{ts0}, {ts1}) is out of range (times are int64 ns)")
    return ts0, ts1, width


def window(trace: Trace, ts0: Any, ts1: Any, width_px: Any, tracks: Iterable[Any] | None = None,
           *, sim: bool = False) -> dict[str, Any]:  # fmt: skip
    """What lies in [ts0, ts1) at ``width_px`` pixels, on the tracks asked for (None: all):
    events at least a pixel wide as they are, thinner ones merged per pixel, counters and
    flows (module docstring; the contract is in ``docs/view.md``). With ``sim``, the tracks
    are numbered as ``tracks(trace, sim=True)`` numbers them, simulated ones included."""
    start = time.perf_counter()
    ts0, ts1, width = _check(ts0, ts1, width_px)
    tv = open_tiers(trace)
    if not sim:
        return answer(tv, ts0, ts1, width, select(tv, tracks), BUDGET, start)
    from xpuprof.view.simulated import both, sim_tiers

    return both(tv, sim_tiers(trace), ts0, ts1, width, tracks, start)


def answer(tv: Tiers, ts0: int, ts1: int, width: int, sel: np.ndarray, budget: int,
           start: float) -> dict[str, Any]:  # fmt: skip
    """:func:`window` on one set of tiers, the tracks ``sel`` (checked), in fewer than
    ``budget`` items.

    Length: the coarsening loop and the answer's four column groups read best in one
    place."""
    is_counter = tv.kind[sel] == "counter"
    sel_ev, sel_ct = sel[~is_counter], sel[is_counter]
    ns = (ts1 - ts0) / width
    level = level_for(tv, ns)
    rows = read_events(tv, sel_ev, ts0, ts1, level)
    got: dict[int, dict[str, np.ndarray]] = {}

    def buckets(lv: int, count: bool = False) -> Any:
        if count:
            return count_buckets(tv, lv, sel_ev, ts0, ts1)
        if lv not in got:
            got[lv] = read_buckets(tv, lv, sel_ev, ts0, ts1) if lv else _NO_BUCKETS
        return got[lv]

    s = start_scale(tv, rows, buckets, ts0, ns, width, count_samples(tv, sel_ct, ts0, ts1),
                    len(sel_ct), budget)  # fmt: skip
    while True:
        px_ns, npx = ns * s, math.ceil(width / s)
        level = level_for(tv, px_ns)
        rows = {k: v[rows["cls"] >= level] for k, v in rows.items()}
        wide = rows["dur"] >= px_ns
        parts = [_thin(rows, ~wide), buckets(level)]
        sm = summarise(tv, parts, ts0, px_ns, npx)
        ct = counters(tv, sel_ct, ts0, ts1, px_ns, npx)
        ev_rows = np.flatnonzero(wide)
        fl, n_flows = flows(tv, rows["id"][ev_rows], FLOW_LIMIT * budget // BUDGET)
        items = len(ev_rows) + len(sm["ts"]) + len(ct["ts"]) + len(fl)
        if items < budget or npx <= 1:
            break
        s *= next_scale(rows["dur"], ns * s, len(sm["ts"]), len(ct["ts"]) + len(fl), budget)
    tv.trim()
    order = ev_rows[np.lexsort((rows["ts"][ev_rows], rows["track"][ev_rows]))]
    ev = {c: rows[c][order] for c in rows}
    lk = tv.ends(fl)
    return {
        "ts0": ts0, "ts1": ts1, "width_px": width, "ns_per_px": ns,
        "tier": f"summaries of {BASE**level} ns + events" if level else "events",
        "summary_px": s,
        "events": {"id": ev["id"].tolist(), "track": ev["track"].tolist(),
                   "depth": ev["depth"].tolist(), "ts": ev["ts"].tolist(),
                   "dur": ev["dur"].tolist(), "name": tv.names_arr[ev["name"]].tolist(),
                   "level": _LEVEL_NAMES[ev["level"]].tolist()},
        "summaries": {"track": sm["track"].tolist(), "depth": sm["depth"].tolist(),
                      "ts": sm["ts"].tolist(), "dur": sm["dur"].tolist(),
                      "count": sm["count"].tolist(),
                      "busy": np.round(np.asarray(sm["busy"], np.float64), 4).tolist(),
                      "name": tv.names_arr[sm["name"]].tolist()},
        "counters": {"track": ct["track"].astype(np.int64).tolist(),
                     "ts": ct["ts"].astype(np.int64).tolist(), "value": ct["value"].tolist()},
        "flows": {k: v.tolist() for k, v in lk.items()},
        "flows_total": n_flows,
        "flows_cut": n_flows > len(fl),
        "items": items,
        "elapsed_ms": round((time.perf_counter() - start) * 1000, 3),
    }  # fmt: skip

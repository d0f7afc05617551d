"""Diagnosis: per rank and step, where the critical path spends its time, and the one sentence
that says what bounds the run.

The critical path of each part comes from the dependency graph with inferred host waits
(:mod:`xpuprof.analysis.path_time`), computed once over the whole part and cut at step
boundaries, so a trace of hundreds of steps costs one longest-path query per rank. Each
piece of a step is one of :data:`~xpuprof.analysis.path_time.CATEGORIES`; the bottleneck of a
rank is the category with the most time per step (``device_gap``, the µs between queued
kernels, is never one). ``docs/advise.md`` defines the categories and the headline.

Step windows are the rank's host step spans (``level = 'step'``), started earlier where the
input a ``step``/``layer`` capture finds between step spans belongs to the step
(``input_pipeline.step_starts``); a rank whose steps lie on
device lines only (XLA module runs) has each device's own windows; a rank without any is one
window from its first to its last event. A rank with several devices and no host work linked
to them (an XPlane host with its TPU chips) is judged **per device**: each chip's timeline
is its own path, and the rows of the tables carry the ``device`` (-1: the rank as a whole).
Time of a step the path does not cover (before its first node, after its last) is
``off_path``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.analysis.common import Result, StepSelection, step_mode
from xpuprof.analysis.input_pipeline import step_starts
from xpuprof.analysis.path_events import describe, name_codes, names_of  # noqa: F401 - re-exported
from xpuprof.analysis.path_time import CATEGORIES, PathTime, device_path_times, path_times
from xpuprof.core.text import human_time

#: A duration in words (``760.8 ms``): the terminal's own format, so a sentence and the
#: tables under it agree.
fmt_ns = human_time

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from xpuprof.trace.trace import Trace

#: What each category means, as a headline names it.
DESCRIPTION = {
    "input": "waiting for input",
    "cpu": "CPU-bound framework work",
    "outside_ops": "host time outside framework ops (Python, untraced code)",
    "runtime": "runtime calls that neither launch nor wait (allocation, setup)",
    "launch": "kernel-launch overhead",
    "sync": "host blocked on the device while it idles",
    "compute": "device compute",
    "memcpy": "memory copies",
    "memset": "memory sets",
    "communication": "communication (transfer)",
    "comm_wait": "communication waiting for another rank",
    "device_gap": "gaps between queued device work",
    "other": "other device work",
    "device_idle": "device idle, no host work linked to it",
    "off_path": "step time the critical path does not cover",
}
#: How the overview's ``bottleneck`` column names each category.
BOTTLENECK_LABEL = {
    "input": "input-bound", "cpu": "host-bound (framework CPU work)",
    "outside_ops": "host-bound (outside framework ops)", "runtime": "host-bound (runtime calls)",
    "launch": "launch-bound", "sync": "host blocked on the device", "compute": "device-bound",
    "memcpy": "copy-bound", "memset": "device-bound (memory sets)",
    "communication": "communication-bound", "comm_wait": "waiting for a late rank",
    "other": "device-bound (other work)", "device_idle": "device idle (cause not linked)",
    "off_path": "not on the critical path",
}  # fmt: skip
#: Categories that can be a bottleneck.
BOTTLENECKS = tuple(c for c in CATEGORIES if c != "device_gap")
COLUMNS = [f"{c}_ns" for c in (*CATEGORIES, "off_path")]


def diagnosis(
    trace: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None,
    top: int = 5,
) -> Result:  # fmt: skip
    """Where the critical path of each selected rank and step spends its time.

    Tables: ``steps`` (one row per rank, device and step: ``step_ns`` and ns per category,
    the step's ``bottleneck``), ``summary`` (per rank, device and category: mean ``time_ns``
    per step, ``share`` of the mean step, in descending order, the slowest device of each
    rank first), ``events`` (per rank, device and category, the ``top`` events the path is
    charged to: ``time_ns`` in all selected steps, ``per_step_ns``, the ``steps`` they appear
    in and their ids). ``device`` is -1 where the rank is judged as a whole (its host steps
    and one path), else the device whose timeline was judged. Facts: ``headline``,
    ``bottleneck`` (a category), ``bottleneck_rank``, ``bottleneck_device`` (None: the rank
    as a whole), ``bottleneck_ns_per_step``, ``bottleneck_share``, ``steps``, ``path``
    (``graph``, or ``device`` when no host work is linked to the device).
    """
    return _memoised(trace, ranks, steps, top, lambda: _diagnosis(trace, ranks, steps, top))


def _memoised(trace: Trace, ranks: Iterable[int] | None, steps: StepSelection, top: int,
              make: Callable[[], Result]) -> Result:  # fmt: skip
    """The diagnosis of this selection kept on ``trace.memo`` (made by ``make`` the first
    time), as a copy the caller may change."""
    mode, numbers = step_mode(steps)
    key = ("analysis.diagnosis", None if ranks is None else tuple(sorted(int(r) for r in ranks)),
           mode, None if numbers is None else tuple(numbers), int(top))  # fmt: skip
    if key not in trace.memo:
        trace.memo[key] = make()
    done = trace.memo[key]
    return Result(tables=dict(done.tables), notes=list(done.notes), facts=dict(done.facts))


def from_parts(trace: Trace, got: list[Any], *, ranks: Iterable[int] | None = None,
               steps: StepSelection = None, top: int = 5) -> Result:  # fmt: skip
    """The diagnosis made of :func:`part_diagnosis` answers that another tool's per-rank
    tasks computed (``got``: the answers of groups of parts, in the parts' order; the
    overview runs both in one task per group, so a rank is opened once), memoised as
    :func:`diagnosis` itself would be."""
    return _memoised(
        trace,
        ranks,
        steps,
        top,
        lambda: _result(trace, Result(facts={"steps": 0}), *_joined(got)),
    )


def step_times(trace: Trace, *, ranks: Iterable[int] | None = None,
               steps: StepSelection = None, workers: int | None = None,
               scheduler: str | None = None) -> pd.DataFrame:  # fmt: skip
    """The ``steps`` table of :func:`diagnosis` alone (ns per category per rank, device and
    step), without the events and the headline: what a cross-rank view needs of each rank.
    Group of ranks by group for many ranks (:func:`xpuprof.analysis.per_rank.grouped`)."""
    from xpuprof.analysis.per_rank import grouped, map_groups, selected_parts

    parts = selected_parts(trace, ranks)
    if not parts:
        return pd.DataFrame()
    if grouped(trace, parts, workers, scheduler):
        got = map_groups(trace, "xpuprof.analysis.diagnosis:step_times", parts,
                         kwargs={"steps": steps}, workers=workers,
                         scheduler=scheduler)  # fmt: skip
        frames = [g for g in got if len(g)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    paths = path_times(trace, parts)
    rows = [_per_step(pt, w)[0] for pt, w in _units(trace, parts, steps, paths)]
    if not rows:
        return pd.DataFrame()
    per_step = pd.concat(rows, ignore_index=True)
    return per_step[[c for c in per_step.columns if not c.startswith("_idle_")]]


def _diagnosis(trace: Trace, ranks, steps: StepSelection, top: int) -> Result:
    from xpuprof.analysis.per_rank import grouped, selected_parts

    res = Result(facts={"steps": 0})
    parts = selected_parts(trace, ranks)
    if not parts:
        res.notes.append("no rank selected: nothing to diagnose")
        return res
    if grouped(trace, parts):
        per_step, events, notes = _on_ranks(trace, parts, steps, top)
    else:
        per_step, events, notes = _of_parts(trace, parts, steps, top)
    return _result(trace, res, per_step, events, notes)


def _result(trace: Trace, res: Result, per_step: pd.DataFrame | None, events: pd.DataFrame,
            notes: list[str]) -> Result:  # fmt: skip
    """The diagnosis' tables and facts from its per-step table and events (all parts)."""
    from xpuprof.analysis.headline import facts  # it reads this module's tables

    res.notes += notes
    if per_step is None:
        res.notes.append("no steps selected and no events: nothing to diagnose")
        return res
    res.tables["summary"] = path_summary(per_step)
    per_step = per_step[[c for c in per_step.columns if not c.startswith("_idle_")]]
    res.tables["steps"] = per_step
    res.tables["events"] = events
    res.facts = facts(trace, res.tables)
    return res


def _of_parts(trace: Trace, parts: list[int], steps: StepSelection,
              top: int) -> tuple[pd.DataFrame | None, pd.DataFrame, list[str]]:  # fmt: skip
    """The per-step table (with its ``_idle_`` columns), the events table and the paths'
    notes of ``parts``, in this process."""
    paths = path_times(trace, parts)
    notes: list[str] = []
    for p in parts:
        notes += [n for n in paths[p].notes if n not in notes]
    rows, evs = [], []
    for pt, w in _units(trace, parts, steps, paths):
        r, e = _per_step(pt, w)
        rows.append(r)
        evs.append(e)
    if not rows:
        return None, pd.DataFrame(), notes
    per_step = pd.concat(rows, ignore_index=True)
    events = _events(trace, pd.concat(evs, ignore_index=True), per_step, top)
    return per_step, events, notes


def part_diagnosis(
    trace: Trace, steps: StepSelection = None, top: int = 5
) -> tuple[pd.DataFrame | None, pd.DataFrame, list[str]]:
    """:func:`_of_parts` of every part of a Trace (a task of :func:`_on_ranks`: one group of
    ranks)."""
    return _of_parts(trace, [int(s["part"]) for s in trace.sources], steps, top)


def _on_ranks(trace: Trace, parts: list[int], steps: StepSelection,
              top: int) -> tuple[pd.DataFrame | None, pd.DataFrame, list[str]]:  # fmt: skip
    """:func:`_of_parts` group of ranks by group (:func:`xpuprof.analysis.per_rank.map_groups`:
    Dask tasks, or here for bounded memory): every table is per part, so the groups' answers
    are concatenated; the one input that crosses ranks, the collectives' waits, is computed
    here and handed to each task."""
    from xpuprof.analysis.per_rank import map_groups

    got = map_groups(trace, "xpuprof.analysis.diagnosis:part_diagnosis", parts,
                     kwargs={"steps": steps, "top": top})  # fmt: skip
    return _joined(got)


def _joined(got: list[Any]) -> tuple[pd.DataFrame | None, pd.DataFrame, list[str]]:
    """The answers of :func:`part_diagnosis` for groups of parts, in the parts' order, as
    one answer (every table is per part: concatenated; notes once each)."""
    notes: list[str] = []
    rows, evs = [], []
    for r, e, n in got:
        notes += [x for x in n if x not in notes]
        if r is not None:
            rows.append(r)
            evs.append(e)
    if not rows:
        return None, pd.DataFrame(), notes
    return pd.concat(rows, ignore_index=True), pd.concat(evs, ignore_index=True), notes


# ---------------------------------------------------------------------------- step windows


def _units(trace: Trace, parts: list[int], steps: StepSelection,
           paths: dict[int, PathTime]) -> list[tuple[PathTime, pd.DataFrame]]:  # fmt: skip
    """What is judged, each with its selected step windows (``step``, ``ts``, ``end``,
    disjoint and sorted): per part, its one path cut at its host step spans; where the part's
    steps lie on device lines only (XLA module runs), each device's windows; and a part with
    one path per device (:func:`~xpuprof.analysis.path_time.device_path_times`) once per
    device. A part without any step span is one window over all its events."""
    mode, numbers = step_mode(steps)
    sql = ", ".join(map(str, parts))
    st = trace.sql(
        "select part, greatest(device, -1) as device, step, min(ts) as ts, max(ts + dur) as end "
        f"from events where level = 'step' and dur > 0 and part in ({sql}) "
        "group by all order by 1, 2, 4"
    )
    out: list[tuple[PathTime, pd.DataFrame]] = []
    lone = []
    lead = _lead_inputs(trace, parts)
    for p in parts:
        pt, per_device = paths[p], device_path_times(trace, p)
        mine = st[st.part == p]
        host = mine[mine.device < 0]
        if len(host):
            host = host.assign(ts=step_starts(host, lead, by="part"))
            w = _select(host, mode, numbers)
            out += [(d, w) for d in per_device.values()] if per_device else [(pt, w)]
        elif len(mine):
            for d, g in mine.groupby("device"):  # each device's windows cut its path
                path = per_device.get(int(d)) or replace(pt, device=int(d))
                out.append((path, _select(g, mode, numbers)))
        else:
            lone.append(p)
    if lone and mode != "list":
        span = trace.sql(
            "select part, min(ts) as ts, max(ts + coalesce(dur, 0)) as end from events where "
            f"part in ({', '.join(map(str, lone))}) and level != 'other' group by part"
        )
        for r in span.itertuples(index=False):
            w = pd.DataFrame({"step": pd.array([pd.NA], "Int64"), "ts": [int(r.ts)],
                              "end": [int(r.end)]})  # fmt: skip
            per_device = device_path_times(trace, int(r.part))
            out += ([(d, w) for d in per_device.values()] if per_device
                    else [(paths[int(r.part)], w)])  # fmt: skip
    return [(pt, w) for pt, w in out if len(w)]


def _lead_inputs(trace: Trace, parts: list[int]) -> pd.DataFrame | None:
    """The parts' input spans (``analysis.inputs``), whose ``between-ops`` rows start a step
    before its span (``input_pipeline.step_starts``: a ``step``/``layer`` capture fetches
    the batch between step spans)."""
    from xpuprof.analysis.inputs import input_spans_by_part

    spans = [g for g in input_spans_by_part(trace, parts).values() if len(g)]
    return pd.concat(spans, ignore_index=True) if spans else None


def _select(g: pd.DataFrame, mode: str, numbers: list[int] | None) -> pd.DataFrame:
    """The selected windows of one timeline's step spans (sorted by start): the last one
    dropped (``drop-last``) or the listed ones; nested or overlapping spans are cut so that
    no time is counted twice."""
    g = g.reset_index(drop=True)
    if mode == "drop-last" and len(g) >= 2:
        g = g[g.step != g.step.max()]
    elif mode == "list":
        g = g[g.step.isin(numbers or [])]
    ts, end = g.ts.to_numpy(np.int64), g.end.to_numpy(np.int64).copy()
    end[:-1] = np.minimum(end[:-1], ts[1:])
    return pd.DataFrame({"step": pd.array(g.step.to_numpy(), "Int64"), "ts": ts, "end": end})


def _per_step(pt: PathTime, w: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Cut the path's pieces at the windows: ns per category per window, and per (window,
    category, event)."""
    w0, w1 = w.ts.to_numpy(np.int64), w.end.to_numpy(np.int64)
    c = np.unique(np.r_[w0, w1])
    s, e = pt.start, pt.end
    lo = np.searchsorted(c, s, side="right")
    hi = np.searchsorted(c, e, side="left")
    n_cuts = np.maximum(hi - lo, 0)
    piece = np.repeat(np.arange(len(s)), n_cuts + 1)
    j = np.arange(len(piece)) - np.r_[0, np.cumsum(n_cuts + 1)[:-1]][piece]
    inner = c[np.minimum(lo[piece] + j - 1, len(c) - 1)] if len(c) else s[piece]
    ps = np.where(j == 0, s[piece], inner)
    pe = np.where(j == n_cuts[piece], e[piece], np.r_[ps[1:], 0])
    k = np.searchsorted(w0, ps, side="right") - 1
    inside = (k >= 0) & (pe <= w1[np.maximum(k, 0)]) & (pe > ps)
    k, length = k[inside], (pe - ps)[inside]
    cat, event = pt.category[piece][inside], pt.event[piece][inside]
    n_cat = len(CATEGORIES)
    grid = np.bincount(k * n_cat + cat, weights=length, minlength=len(w) * n_cat)
    grid = grid.reshape(len(w), n_cat).astype(np.int64)
    idle = ~pt.device_busy[piece][inside]
    idle_grid = np.bincount(k[idle] * n_cat + cat[idle], weights=length[idle],
                            minlength=len(w) * n_cat).reshape(len(w), n_cat)  # fmt: skip
    step_ns = w1 - w0
    df = pd.DataFrame(grid, columns=[f"{c}_ns" for c in CATEGORIES])
    df["off_path_ns"] = np.maximum(step_ns - grid.sum(axis=1), 0)
    cands = df[[f"{c}_ns" for c in BOTTLENECKS] + ["off_path_ns"]].to_numpy()
    names = np.array([*BOTTLENECKS, "off_path"], dtype=object)
    head = pd.DataFrame({"rank": pd.array([pt.rank] * len(w), "Int64"), "part": pt.part,
                         "device": pt.device, "step": pd.array(w.step.to_numpy(), "Int64"),
                         "ts": w0, "step_ns": step_ns})  # fmt: skip
    out = pd.concat([head, df], axis=1)
    out["bottleneck"] = names[cands.argmax(axis=1)] if len(out) else []
    for i, c in enumerate(CATEGORIES):  # how much of it the device idled (summary only)
        out[f"_idle_{c}"] = idle_grid[:, i].astype(np.int64)
    ev = _group_pieces(k, cat, event, length)
    ev["step"] = pd.array(w.step.to_numpy(), "Int64")[ev.window.to_numpy()]
    ev["rank"], ev["part"], ev["device"] = pt.rank, pt.part, pt.device
    return out, ev


def _group_pieces(k: np.ndarray, cat: np.ndarray, event: np.ndarray,
                  length: np.ndarray) -> pd.DataFrame:  # fmt: skip
    """Per (window, category, event), in that order: the path time (``ns``) and the number of
    pieces (``segments``), as a groupby would give them (one sort, no hashing)."""
    o = np.lexsort((event, cat, k))
    k, cat, event, length = k[o], cat[o], event[o], length[o]
    new = np.r_[True, (k[1:] != k[:-1]) | (cat[1:] != cat[:-1]) | (event[1:] != event[:-1])]
    first = np.flatnonzero(new[: len(k)])
    return pd.DataFrame({
        "window": k[first], "category": cat[first], "event": event[first],
        "ns": np.add.reduceat(length, first) if len(first) else length[:0],
        "segments": np.diff(np.r_[first, len(k)]).astype(np.int64),
    })  # fmt: skip


# ---------------------------------------------------------------------------------- tables


def path_summary(per_step: pd.DataFrame) -> pd.DataFrame:
    """The ``summary`` table of the per-step table: per part, device and category, the mean
    time per step and its share (the slowest device of each part first)."""
    rows = []
    for (part, device), g in per_step.groupby(["part", "device"]):
        mean = float(g.step_ns.mean())
        busy = mean - float((g.device_idle_ns + g.off_path_ns).mean())
        for c in (*CATEGORIES, "off_path"):
            t = float(g[f"{c}_ns"].mean())
            if t > 0:
                idle = g[f"_idle_{c}"].sum() / g[f"{c}_ns"].sum() if c != "off_path" else 1.0
                rows.append({"rank": g["rank"].iloc[0], "part": part, "device": device,
                             "category": c, "description": DESCRIPTION[c], "time_ns": t,
                             "share": t / mean if mean else 0.0, "device_idle": float(idle),
                             "steps": len(g), "_mean": mean, "_busy": busy})  # fmt: skip
    out = pd.DataFrame(rows, columns=["rank", "part", "device", "category", "description",
                                      "time_ns", "share", "device_idle", "steps", "_mean",
                                      "_busy"])  # fmt: skip
    out["rank"] = out["rank"].astype("Int64")
    out["device"] = out["device"].astype(np.int64)
    # per rank, the device judged first (as :func:`judged` picks it), then by time
    order = ["part", "_mean", "_busy", "device", "time_ns"]
    out = out.sort_values(order, ascending=[True, False, False, True, False], ignore_index=True)
    return out.drop(columns=["_mean", "_busy"])


#: How many event ids an ``events`` row lists (the web UI links them into the timeline).
MAX_IDS = 20


def _events(trace: Trace, ev: pd.DataFrame, per_step: pd.DataFrame, top: int) -> pd.DataFrame:
    """Per part, device and category, the ``top`` names the path is charged to by time, with
    the steps they appear in, (up to :data:`MAX_IDS`) the ids of their events, and the one
    event with the most path time (``top_event``, ``top_event_ns``: one slow call is not the
    same finding as many short ones)."""
    cols = ["rank", "part", "device", "category", "name", "time_ns", "per_step_ns", "events",
            "steps", "ids", "top_event", "top_event_ns"]  # fmt: skip
    if ev.empty:
        return pd.DataFrame(columns=cols)
    n_steps = per_step.groupby(["part", "device"]).size()
    # by a code of the name, in the names' order (hashing strings per row costs the most)
    code, names = name_codes(trace, ev.event.to_numpy(np.int64))
    ev = ev.assign(name=code)
    k = ["part", "device", "category", "name"]
    g = ev.groupby(k, as_index=False, sort=False).agg(rank=("rank", "first"), time_ns=("ns", "sum"))
    g = g.sort_values(["part", "device", "category", "time_ns"],
                      ascending=[True, True, True, False])  # fmt: skip
    g = g.groupby(["part", "device", "category"]).head(max(int(top), 1)).reset_index(drop=True)
    keep = ev.merge(g[k], on=k)
    steps = keep.dropna(subset=["step"]).drop_duplicates([*k, "step"]).sort_values("step")
    steps = steps.groupby(k).step.agg(lambda x: [int(v) for v in x])
    one = keep[keep.event >= 0].groupby([*k, "event"], as_index=False).ns.sum()
    ids = one.sort_values("event").groupby(k).event.agg(lambda x: x.head(MAX_IDS).tolist())
    count = one.groupby(k).size()
    # the longest; on a tie the first event (a stable rule: ranks analysed apart agree)
    top1 = one.sort_values(["ns", "event"], ascending=[True, False], kind="stable")
    top1 = top1.groupby(k).tail(1).set_index(k)
    idx = pd.MultiIndex.from_frame(g[k])
    g["steps"] = [v if isinstance(v, list) else [] for v in steps.reindex(idx).tolist()]
    g["ids"] = [v if isinstance(v, list) else [] for v in ids.reindex(idx).tolist()]
    g["events"] = count.reindex(idx).fillna(0).astype(int).to_numpy()
    g["top_event"] = top1.event.reindex(idx).to_numpy()
    g["top_event_ns"] = top1.ns.reindex(idx).to_numpy()
    unit = pd.MultiIndex.from_frame(g[["part", "device"]])
    g["per_step_ns"] = g.time_ns.to_numpy() / n_steps.reindex(unit).to_numpy()
    g["category"] = np.asarray(CATEGORIES, dtype=object)[g.category.to_numpy(np.int64)]
    g["name"] = pd.Series(names[g.name.to_numpy(np.int64)], index=g.index)  # as grouped
    g["rank"] = g["rank"].astype("Int64")
    return g[cols]

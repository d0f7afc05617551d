"""Overview: step time, where each step's time goes, and what bounds the run.

Breakdown of a step (per rank), on the device timeline of that rank, each instant counted once
with this priority so that the parts add up to the step time (device work classified by
:func:`xpuprof.analysis.common.work_class`, the classifier every tool shares: MTIA's DMA and
XLA's async copies are copies):

* **compute** — some computation kernel runs;
* **communication** — a collective runs and no computation (communication not hidden);
* **memcpy**, **memset** — copies or sets run and none of the above;
* **other** — other device work only (syncs, annotations on the device are not work);
* **input** — the device is idle while the host is in an input span (``analysis.inputs``);
* **host-bound idle** — the device is idle otherwise: the host did not feed it in time.

Where the steps lie on device lines (XLA module runs on each chip of a TPU host, which one
process drives as one rank), each device is its own row: its steps, measured on its own work.

A rank without device events is a CPU run: the host's framework ops are its compute and the
same rules apply to them (column ``host_only`` of the summary, and a note); without ops either
(an xpuprof capture at level ``layer``), its layer spans are. At the ``step`` and ``layer``
levels a step's time starts where the input fetched before its span starts
(``input_pipeline.step_starts``), as in every tool.

These fractions are aggregates: they say how busy the device was, not why. The
**bottleneck** of each rank and the headline come from the critical path
(:func:`xpuprof.analysis.diagnosis.diagnosis`): the category with the most time per step on
it (``diagnosis.BOTTLENECK_LABEL`` names it); device compute is told apart as
**memory-bandwidth-bound** when at least half of the computation time with a known roofline
position is in memory-bound work, **compute-bound** otherwise, and **device-bound** when no
FLOPs are known to tell them apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import (
    DEVICE_LEVELS,
    Result,
    StepSelection,
    intersection_length,
    merge_intervals,
    missing_ranks_note,
    where_clause,
    work_class,
)
from xpuprof.analysis.input_pipeline import step_starts
from xpuprof.core.errors import XpuprofError
from xpuprof.core.result import Presentation

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

MEMORY_BOUND_SHARE = 0.5
#: From this many ranks the summary lists the slowest first and the terminal shows a
#: screenful of them (``--limit``/``--json`` for all).
MANY_RANKS = 32

PARTS = ("compute", "communication", "memcpy", "memset", "other", "input", "host_idle")


def _clip_union(s: np.ndarray, e: np.ndarray, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
    s, e = np.clip(s, t0, t1), np.clip(e, t0, t1)
    keep = e > s
    return merge_intervals(s[keep], e[keep])


def _minus(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of union(a) minus its overlap with union(b) (both merged)."""
    return int((a[1] - a[0]).sum()) - intersection_length(a, b)


def _union2(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple:
    return merge_intervals(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def _step_parts(
    t0: int, t1: int, groups: dict[str, tuple[np.ndarray, np.ndarray]], inputs: tuple
) -> dict[str, int]:
    """The breakdown of one step window (see the module docstring)."""
    parts: dict[str, int] = {}
    covered = (np.empty(0, np.int64), np.empty(0, np.int64))
    for name in ("compute", "communication", "memcpy", "memset", "other"):
        g = _clip_union(*groups[name], t0, t1)
        parts[name] = _minus(g, covered)
        covered = _union2(covered, g)
    busy = int((covered[1] - covered[0]).sum())
    idle = (t1 - t0) - busy
    inp = _clip_union(*inputs, t0, t1)
    parts["input"] = _minus(inp, covered) if idle > 0 else 0
    parts["host_idle"] = idle - parts["input"]
    return parts


def overview(
    trace: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None,
    top: int = 10,
) -> Result:  # fmt: skip
    """Step statistics, the per-step breakdown, device utilisation, top ops and kernels and the
    bottleneck of each rank. Tables: ``summary`` (one row per rank; ``host_only`` says the
    rank has no device events, so its host ops were taken as compute), ``steps``, ``top_ops``,
    ``top_kernels``.

    Facts: ``ranks``, ``steps`` (step windows summarised), ``host_only`` (no selected rank has
    device events: a CPU run), and of the rank with the slowest mean step: ``step_ms_mean``,
    ``bottleneck`` and ``headline`` (the diagnosis' sentence)."""
    if top < 0:
        raise XpuprofError(f"top: ops and kernels to list, 0 or more, not {top}")
    res = Result()
    absent = missing_ranks_note(trace)
    if absent:
        res.notes.append(absent)
    w = where_clause(ranks, steps)
    step_rows, whole = _step_rows(trace, w)
    if whole:
        res.notes.append(
            "no step spans (ProfilerStep#N or xpuprof.step): the whole trace is taken as one "
            "step per rank"
        )
    if step_rows.empty:
        res.notes.append("no events selected: nothing to summarise")
        res.facts = {"ranks": 0, "steps": 0, "host_only": False}
        return res
    from xpuprof.analysis.per_rank import grouped, selected_parts

    parts = selected_parts(trace, ranks)
    if grouped(trace, parts):
        per_step, host_only, dx, shares, sums = _on_ranks(trace, parts, ranks, steps)
    else:
        per_step, host_only = _per_step(trace, w, step_rows)
        dx = _diagnosis(trace, ranks, steps)
        # the roofline tells memory- from compute-bound device work: needed (and paid for)
        # only on ranks whose critical path is mostly device compute
        computing = [k for k, v in _bottlenecks(dx).items() if v == "compute" and k is not None]
        shares = _memory_shares(trace, computing, steps) if computing and not host_only else {}
        sums = _top_sums(trace, ranks, steps)
    if host_only:
        n = trace.sql(
            "select count(*) filter (where level = 'op') as ops, count(*) filter "
            f"(where level = 'layer') as layers from events where {w}"
        ).iloc[0]
        res.notes.append("no device events: a CPU run; " + (
            "the host's framework ops are its compute" if n.ops else
            "no framework ops recorded (capture level step or layer): the host's layer spans "
            "are its compute" if n.layers else "no framework ops or layer spans recorded "
            "(capture level step): its compute cannot be told from the rest"))  # fmt: skip
    res.tables["steps"] = per_step
    summary = _summary(per_step, host_only, shares, dx)
    if len(summary) >= MANY_RANKS and "device" not in summary:
        # a row per rank of a big job: the slowest first, so a screenful shows the ones to
        # look at (the ranks tool compares them step by step)
        summary = summary.sort_values("step_ms_mean", ascending=False, kind="stable")
        summary = summary.reset_index(drop=True)
        res.present["summary"] = Presentation(
            title=f"summary — {len(summary)} ranks, the slowest mean step first"
        )
    res.tables["summary"] = summary
    if "device" in summary:  # one column per device: name them by it, not by their one rank
        res.present["summary"] = Presentation(layout="transpose", label="device", all_rows=True)
    if per_step["step"].isna().all():  # no steps: its "step" is the whole trace, say so
        whole = "summary (no step spans: each rank's whole trace is its one step)"
        res.present["summary"] = Presentation(layout="transpose", label="rank", all_rows=True,
                                              title=whole)  # fmt: skip
        res.present["steps"] = Presentation(title="the whole trace of each rank, as one step")
    res.tables["top_ops"], res.tables["top_kernels"] = _top(*sums, top)
    res.facts = {"ranks": len(summary), "steps": 0, "host_only": False}
    if len(summary):
        res.facts["steps"] = int(summary["steps"].sum())
        res.facts["host_only"] = bool(summary["host_only"].all())
        worst = summary.sort_values("step_ms_mean", ascending=False).iloc[0]
        res.facts |= {"step_ms_mean": float(worst.step_ms_mean), "bottleneck": worst.bottleneck}
    if dx is not None and dx.facts.get("headline"):
        res.facts["headline"] = dx.facts["headline"]
    return res


def _step_rows(trace: Trace, w: str) -> tuple[pd.DataFrame, bool]:
    """The step windows summarised (``rank``, ``device``, ``step``, ``ts``, ``dur``) of the
    events ``w`` selects; without any step span, each rank's whole trace as its one step
    (then True)."""
    step_rows = trace.sql(
        "select rank, device, step, ts, dur from events where level = 'step' and "
        f"{w} order by rank, device, ts"
    )
    if not step_rows.empty:
        return step_rows, False
    span = trace.sql(
        f"select rank, min(ts) as ts, max(ts + coalesce(dur, 0)) - min(ts) as dur "
        f"from events where {w} group by rank"
    )
    span["step"] = pd.array([pd.NA] * len(span), dtype="Int64")  # no step: shown as "-"
    span["device"] = -1
    return span[["rank", "device", "step", "ts", "dur"]], True


def _on_ranks(
    trace: Trace, parts: list[int], ranks: Iterable[int] | None, steps: StepSelection
) -> tuple[pd.DataFrame, set[int], Result | None, dict[int | None, float], tuple]:
    """The overview's per-rank work group of ranks by group
    (:func:`xpuprof.analysis.per_rank.map_groups`: Dask tasks, or here for bounded memory):
    each task opens its ranks alone and returns their step breakdown, their diagnosis
    (:func:`~xpuprof.analysis.diagnosis.part_diagnosis`), their memory-bound shares and
    their ops' and kernels' sums by name; they are joined here, and the diagnosis made of
    them is memoised for the tools that ask for it next (advise)."""
    from xpuprof.analysis.diagnosis import from_parts
    from xpuprof.analysis.per_rank import map_groups

    got = map_groups(trace, "xpuprof.analysis.overview:part_overview", parts,
                     kwargs={"steps": steps})  # fmt: skip
    dx = from_parts(trace, [g["diagnosis"] for g in got], ranks=ranks, steps=steps)
    frames = [g["steps"] for g in got if len(g["steps"])]
    per_step = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if len(per_step):  # by rank (and device) over all groups, as one process lists them
        units = [c for c in ("rank", "device") if c in per_step]
        per_step = per_step.sort_values(units, kind="stable", na_position="last")
        per_step = per_step.reset_index(drop=True)
    host_only = {k for g in got for k in g["host_only"]}
    shares = {k: v for g in got for k, v in g["shares"].items()}
    ops = pd.concat([g["sums"][0] for g in got], ignore_index=True)
    kernels = pd.concat([g["sums"][1] for g in got], ignore_index=True)
    return per_step, host_only, dx, shares, (ops, kernels)


def part_overview(trace: Trace, steps: StepSelection = None) -> dict[str, object]:
    """The overview's per-rank work on a Trace of a group of parts (a task of
    :func:`_on_ranks`): ``steps`` (the breakdown per step), ``host_only``, ``diagnosis``
    (its :func:`~xpuprof.analysis.diagnosis.part_diagnosis`), ``shares`` (memory-bound
    share of each rank whose path is mostly device compute) and ``sums``
    (:func:`_top_sums`)."""
    from xpuprof.analysis.diagnosis import part_diagnosis, path_summary

    w = where_clause(None, steps)
    step_rows, _ = _step_rows(trace, w)
    per_step, host_only = (pd.DataFrame(), set()) if step_rows.empty else (
        _per_step(trace, w, step_rows))  # fmt: skip
    mine = part_diagnosis(trace, steps)
    # these ranks' bottlenecks, as the joined diagnosis will name them (its summary is per
    # part); the roofline of the ranks with device work whose path is mostly compute
    dx = Result(tables={} if mine[0] is None else {"summary": path_summary(mine[0])})
    computing = [k for k, v in _bottlenecks(dx).items()
                 if v == "compute" and k is not None and k not in host_only]  # fmt: skip
    shares = _memory_shares(trace, computing, steps) if computing else {}
    return {"steps": per_step, "host_only": host_only, "diagnosis": mine, "shares": shares,
            "sums": _top_sums(trace, None, steps)}  # fmt: skip


def _diagnosis(trace: Trace, ranks: Iterable[int] | None, steps: StepSelection) -> Result | None:
    """The critical-path diagnosis the bottleneck is read from (None if it cannot be made:
    the overview's numbers stand without it, and a note says so)."""
    from xpuprof.analysis.diagnosis import diagnosis

    return diagnosis(trace, ranks=ranks, steps=steps)


def _rank_key(rank: object) -> int:
    return -1 if pd.isna(rank) else int(rank)  # type: ignore[arg-type, call-overload]


def _per_step(trace: Trace, w: str, step_rows: pd.DataFrame) -> tuple[pd.DataFrame, set[int]]:
    """The breakdown of each step window, and the ranks without device events (keys as
    :func:`_rank_key`)."""
    cols = "select id, rank, device, level, name, ts, dur from events where dur is not null and "
    ev = _device_work(trace, w)
    # framework ops are the compute of ranks without device events only (a CPU run): read
    # them for those ranks alone (they are most of a GPU trace's rows)
    cpu = sorted(set(step_rows["rank"].dropna().astype(int)) - set(ev["rank"].dropna().astype(int)))
    if cpu:
        ops = trace.sql(f"{cols}level = 'op' and rank in ({', '.join(map(str, cpu))}) and {w}")
        # no framework ops either (an xpuprof capture at level layer): its layer spans are
        # the framework's work as that level sees it
        bare = sorted(set(cpu) - set(ops["rank"].dropna().astype(int)))
        if bare:
            layers = trace.sql(f"{cols}level = 'layer' and rank in "
                               f"({', '.join(map(str, bare))}) and {w}")  # fmt: skip
            ops = pd.concat([ops, layers], ignore_index=True) if len(ops) else layers
        ev = pd.concat([ev, ops], ignore_index=True) if len(ev) else ops
    # steps on device lines (XLA module runs on each chip of a TPU host): each device's steps
    # are measured on that device's work alone, one row per device and step
    per_device = bool((step_rows["device"] >= 0).any())
    inp = _input_spans(trace, w)
    # a step/layer capture fetches each batch between step spans: the step starts there
    host = (step_rows["device"] < 0).to_numpy()
    if host.any():
        starts = step_starts(step_rows[host], inp)
        step_rows = step_rows.copy()
        end = (step_rows.ts + step_rows.dur)[host]
        step_rows.loc[host, "ts"] = starts
        step_rows.loc[host, "dur"] = end.to_numpy() - starts
    ev_rank = ev["rank"].fillna(-1)
    inp_rank = inp["rank"].fillna(-1)
    host_coll, host_members = _host_collectives(trace)
    rows = []
    host_only: set[int] = set()
    units = ["rank", "device"] if per_device else ["rank"]
    for unit, rsteps in step_rows.groupby(units, dropna=False):
        rank = unit[0]
        key = _rank_key(rank)
        re_ = ev[ev_rank == key]
        dev = re_[re_.level.isin(DEVICE_LEVELS)]
        if per_device and unit[1] >= 0:
            dev = dev[dev.device == unit[1]]
        if dev.empty:
            host_only.add(key)
            dev = re_[re_.level.isin(["op", "layer"])]
            kinds = np.full(len(dev), "compute", dtype=object)
            # its host collectives (gloo spans, analysis.comm.host) are its communication
            hc = host_coll[host_coll["rank"] == key]
            if "id" in dev:  # a c10d op chosen as the collective, and what runs inside it
                kinds[dev["id"].isin(host_members["id"]).to_numpy()] = "communication"
            dev = pd.concat([dev, hc[dev.columns.intersection(hc.columns)]], ignore_index=True)
            kinds = np.r_[kinds, np.full(len(hc), "communication", dtype=object)]
        else:
            kinds = dev.work.to_numpy()
        groups = _groups(dev, kinds)
        ri = inp[inp_rank == key]
        start = ri.ts.to_numpy(np.int64)
        inputs = (start, start + ri.dur.fillna(0).to_numpy(np.int64))
        for st in rsteps.itertuples(index=False):
            t0, t1 = int(st.ts), int(st.ts + st.dur)
            parts = _step_parts(t0, t1, groups, inputs)
            rows.append({"rank": rank, **({"device": unit[1]} if per_device else {}),
                         "step": st.step, "step_ns": t1 - t0,
                         **{f"{p}_ns": parts[p] for p in PARTS}})  # fmt: skip
    return pd.DataFrame(rows), host_only


def _host_collectives(trace: Trace) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The host collectives (``analysis.comm.host``) with their rank (-1: none), and the ids
    of the host events that are theirs (``host_collective_members``)."""
    from xpuprof.analysis.comm.host import host_collective_ids, host_collective_members

    hc = host_collective_ids(trace)
    rank_of = {int(s["part"]): s.get("rank") for s in trace.sources}
    r = hc["part"].map(lambda p: rank_of.get(int(p)))
    hc = hc.assign(rank=r.fillna(-1).astype(np.int64) if len(hc) else r)
    return hc, host_collective_members(trace)


def _device_work(trace: Trace, w: str) -> pd.DataFrame:
    """The selected device events with a duration (``rank``, ``device``, ``level``, ``ts``,
    ``dur``, ``work``: the work class): with no selection, from the rows the diagnosis reads
    and classifies anyway (``path_state.kind_rows``); else one query."""
    if w != "true":
        ev = trace.sql(
            "select rank, device, level, name, ts, dur from events where dur is not "
            f"null and level in ('kernel', 'collective', 'memcpy', 'memset') and {w}"
        )
        return ev.assign(work=work_class(ev.level, ev.name).to_numpy()).drop(columns="name")
    from xpuprof.analysis.path_state import NO_DUR, kind_rows

    r = kind_rows(trace)
    keep = ~r.runtime & (r.dur != NO_DUR)
    rank_of = {int(s["part"]): s["rank"] for s in trace.sources}
    parts, inv = np.unique(r.part[keep], return_inverse=True)
    ranks = np.array([rank_of.get(int(p)) for p in parts] or [None], dtype=object)
    level = np.r_[r.levels, np.array([None], object)][r.level[keep]]
    return pd.DataFrame({
        "rank": pd.array(ranks[inv.reshape(-1)], dtype="Float64"), "device": r.device[keep],
        "level": level, "ts": r.ts[keep], "dur": r.dur[keep], "work": r.work[keep],
    })  # fmt: skip


def _input_spans(trace: Trace, w: str) -> pd.DataFrame:
    """Host spans of input loading (``analysis.inputs``: the diagnosis' own), with ranks."""
    from xpuprof.analysis.inputs import input_spans_by_part

    rank_of = {s["part"]: s["rank"] for s in trace.sources}
    spans = input_spans_by_part(trace, list(rank_of))
    if not spans:
        return pd.DataFrame({"rank": [], "ts": [], "dur": [], "step": [], "kind": []})
    df = pd.concat([g.assign(rank=rank_of[p]) for p, g in spans.items()], ignore_index=True)
    df["rank"] = df["rank"].astype("Float64")
    return df[["rank", "ts", "dur", "step", "kind"]]


def _groups(dev: pd.DataFrame, kinds: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(starts, ends) of the device work of each part that device work can fill (``kinds``:
    the work class of each event)."""
    s = dev.ts.to_numpy(np.int64)
    e = s + dev.dur.to_numpy(np.int64)
    k = np.asarray(kinds).astype(str)
    names = ("compute", "communication", "memcpy", "memset", "other")
    return {name: (s[k == name], e[k == name]) for name in names}


def _summary(
    per_step: pd.DataFrame, host_only: set[int], shares: dict[int | None, float],
    dx: Result | None,
) -> pd.DataFrame:  # fmt: skip
    """One row per rank (per rank and device, where steps are on device lines): step
    statistics, the fractions of the parts, the bottleneck."""
    tops = _bottlenecks(dx)
    summary = []
    units = ["rank", "device"] if "device" in per_step else ["rank"]
    for unit, g in per_step.groupby(units, dropna=False):
        rank = unit[0]
        total = g.step_ns.sum()
        frac = {p: g[f"{p}_ns"].sum() / total if total else 0.0 for p in PARTS}
        cpu = _rank_key(rank) in host_only
        row = {
            "rank": rank,
            **({"device": unit[1]} if len(units) > 1 else {}),
            "steps": len(g),
            "step_ms_mean": g.step_ns.mean() / 1e6,
            "step_ms_p50": g.step_ns.median() / 1e6,
            "step_ms_p90": g.step_ns.quantile(0.9) / 1e6,
            **{f"{p}_fraction": frac[p] for p in PARTS},
            "device_utilization": 1 - frac["input"] - frac["host_idle"],
            "host_only": cpu,
        }
        key = None if pd.isna(rank) else int(rank)
        top = tops.get(key)
        row["bottleneck"] = ("compute-bound (CPU ops)" if cpu and top == "cpu" else
                             _bottleneck(top, shares.get(key)))  # fmt: skip
        summary.append(row)
    return pd.DataFrame(summary)


def _bottlenecks(dx: Result | None) -> dict[int | None, str]:
    """Per rank, the category with the most time per step on its critical path."""
    out: dict[int | None, str] = {}
    s = None if dx is None else dx.tables.get("summary")
    if s is None or s.empty:
        return out
    from xpuprof.analysis.diagnosis import BOTTLENECKS

    s = s[s.category.isin(BOTTLENECKS)]
    for rank, g in s.groupby("rank", dropna=False, sort=False):
        out.setdefault(None if pd.isna(rank) else int(rank), str(g.category.iloc[0]))
    return out


def _top_sums(
    trace: Trace, ranks: Iterable[int] | None, steps: StepSelection
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per framework-op name, calls and total and self ns; per device-work name and level,
    calls and total ns (and the durations' count): sums that add up across ranks, so ranks
    analysed apart give the same top lists as one query over all."""
    we = where_clause(ranks, steps, alias="e")
    ops = trace.sql(
        "with c as (select parent, sum(dur) as d from events where parent is not null "
        "group by parent) "
        "select e.name as op, count(*) as calls, sum(e.dur) as total_ns, "
        "sum(e.dur - coalesce(c.d, 0)) as self_ns from events e "
        f"left join c on c.parent = e.id where e.level = 'op' and {we} group by e.name"
    )
    kernels = trace.sql(
        "select name as kernel, level, count(*) as calls, sum(dur) as total_ns, "
        "count(dur) as timed from events where level in "
        f"('kernel', 'collective', 'memcpy', 'memset') and {where_clause(ranks, steps)} "
        "group by name, level"
    )
    return ops, kernels


def _top(ops: pd.DataFrame, kernels: pd.DataFrame, top: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ``top`` framework ops by self time and device kernels by total time, from
    :func:`_top_sums` (of one or many ranks)."""
    ops = ops.groupby("op", as_index=False, dropna=False).sum(min_count=1)
    ops["total_ms"] = ops["total_ns"] / 1e6
    ops["self_ms"] = ops["self_ns"] / 1e6
    ops = ops.sort_values(["self_ms", "op"], ascending=[False, True], na_position="last")
    k = kernels.groupby(["kernel", "level"], as_index=False, dropna=False).sum(min_count=1)
    k["total_ms"] = k["total_ns"] / 1e6
    k["mean_us"] = k["total_ns"] / k["timed"].where(k["timed"] > 0) / 1e3
    k = k.sort_values(["total_ms", "kernel", "level"], ascending=[False, True, True],
                      na_position="last")  # fmt: skip
    return (
        ops.head(int(top))[["op", "calls", "total_ms", "self_ms"]].reset_index(drop=True),
        k.head(int(top))[["kernel", "level", "calls", "total_ms", "mean_us"]].reset_index(
            drop=True
        ),
    )


def _memory_shares(
    trace: Trace, ranks: Iterable[int] | None, steps: StepSelection
) -> dict[int | None, float]:
    """Per rank, the share of timed work with a known roofline position that is
    memory-bound (below the device's ridge point); ranks with none known are absent. One
    roofline run for all ranks."""
    ranks = None if ranks is None else sorted({int(r) for r in ranks})
    every = [s["rank"] for s in trace.sources]
    if ranks is not None and None not in every and ranks == sorted({int(r) for r in every}):
        ranks = None  # every rank: the event tree the diagnosis built already serves
    try:
        from xpuprof.analysis.roofline import roofline

        r = roofline(trace, ranks=ranks, steps=steps)
    except Exception:  # noqa: BLE001 - the overview must not fail on an optional refinement
        return {}
    out: dict[int | None, float] = {}
    for name in ("kernels", "ops"):  # device kernels first: they are what runs
        df = r.tables.get(name)
        if df is None or not len(df) or not {"bound", "time_ns", "rank"} <= set(df.columns):
            continue
        known = df[df.bound.isin(["memory", "compute"])]
        for rank, g in known.groupby("rank", dropna=False):
            key = None if pd.isna(rank) else int(rank)
            if key not in out and g.time_ns.sum() > 0:
                out[key] = float(g.time_ns[g.bound == "memory"].sum() / g.time_ns.sum())
    return out


def _bottleneck(category: str | None, memory_share: float | None) -> str:
    """The overview's words for a rank's bottleneck category (``compute`` told apart by the
    roofline: memory-bandwidth-bound, compute-bound, or device-bound without FLOPs)."""
    from xpuprof.analysis.diagnosis import BOTTLENECK_LABEL

    if category is None:
        return "-"
    if category == "compute" and memory_share is not None:
        return "memory-bandwidth-bound" if memory_share >= MEMORY_BOUND_SHARE else "compute-bound"
    return BOTTLENECK_LABEL.get(category, category)

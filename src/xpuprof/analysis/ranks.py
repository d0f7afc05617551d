"""Cross-rank views: which rank holds the job back in each step, and why.

In a synchronous job every rank waits at each collective for the last one to arrive, so the
step times of all ranks come out nearly equal and the rank with the *shortest* step is often
the culprit: it waited least because the others waited for it. This tool therefore judges a
step by who the others waited for, not by whose step was longest.

Definitions (times in ns; clocks aligned as the comm tool aligns them, ``docs/comm.md``):

- ``steps`` (one row per rank and step; the heat-map data): ``start`` (the step's start on
  the aligned clock), ``step_ns`` (its duration), ``comm_wait_ns`` (time its critical path
  spent in collectives waiting for the last participant, :mod:`diagnosis`), ``busy_ns`` =
  ``step_ns`` − ``comm_wait_ns``, ``late_start_ns`` (its aligned start − the median of the
  other ranks' aligned starts in that step), ``caused_ns`` (the waits of the other ranks'
  collectives in this step whose last participant was this rank: the time it held the others
  back) and ``last`` (in how many of the step's collectives it arrived last).
- ``slowest`` (one row per step): the **holder** is the rank with the most ``caused_ns``
  (``basis`` ``waited for``); in a step without matched collectives, the rank with the longest
  step (``basis`` ``longest step``). What made it slow is its row against the **median rank**
  (the median over the other ranks of each quantity, in that step; with two ranks, the
  other): its late start, and per critical-path
  category (``docs/advise.md``; waiting for others excluded, since that is the effect, not
  the cause) the excess of its time over the median's. ``cause`` is the largest positive one.
- ``causes``: the holder's time per category against the median rank's, per step.
- ``outliers`` (one row per rank and step, two steps or more): steps in which a rank held the
  others back more than it usually does — its ``caused_ns`` against its own median over the
  steps (``usual_ns``), at least twice the usual and, per other rank, at least 50 µs and 1 %
  of the step. A rank late in every step is the holder of every step; the one-off straggler (a
  node slow for a moment) is found here.
- ``waits`` (one row per rank): its collectives, their time, how much of it was waiting for
  the last participant (``wait_ns``, the comm tool's per-collective wait) and how much was
  transfer (``transfer_ns`` = time − wait), how often it was last, and ``caused_ns`` over the
  window.

A late start cannot be explained from the step itself: the previous step (often outside the
capture window), the input pipeline or the launcher held the rank, and the note says so. The
cross-rank critical path (which rank's which operation bounds the whole job, through the
collectives' rendezvous) needs the replay and is added by the ``ranks`` tool
(:func:`xpuprof.sim.paths.job_path`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import Result, missing_ranks_note
from xpuprof.analysis.diagnosis import DESCRIPTION, step_times
from xpuprof.core.result import Presentation
from xpuprof.core.text import human_time

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.analysis.common import StepSelection
    from xpuprof.trace.trace import Trace

STEP_COLUMNS = ["rank", "part", "step", "start", "step_ns", "comm_wait_ns", "busy_ns",
                "late_start_ns", "caused_ns", "last"]  # fmt: skip
SLOWEST_COLUMNS = ["step", "holder", "basis", "caused_ns", "last", "collectives",
                   "holder_step_ns", "median_step_ns", "late_start_ns", "cause", "cause_ns",
                   "ranks"]  # fmt: skip
OUTLIER_COLUMNS = ["rank", "part", "step", "caused_ns", "usual_ns", "excess_ns", "late_start_ns",
                   "busy_ns"]  # fmt: skip
CAUSE_COLUMNS = ["step", "holder", "category", "holder_ns", "median_ns", "excess_ns"]
WAIT_COLUMNS = ["rank", "part", "collectives", "collective_ns", "wait_ns", "transfer_ns",
                "wait_pct", "times_last", "caused_ns"]  # fmt: skip

#: Categories of the critical path that are the effect of another rank, not a cause.
_EFFECTS = ("comm_wait", "device_gap")
#: Below this much waiting caused, per other rank, nobody held the step back (jitter).
HOLD_FLOOR_NS = 50_000
#: A one-off straggler must cost each other rank at least this share of the step.
OUTLIER_SHARE = 0.01


def rank_steps(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    workers: int | None = None,
    scheduler: str | None = None,
) -> Result:
    """Step time per rank and step, the rank holding each step back and why, and collective
    wait vs transfer per rank (module docstring). The per-rank critical paths are Dask tasks,
    one rank each, for many ranks or when ``workers``/``scheduler`` say so
    (:mod:`xpuprof.analysis.per_rank`). Facts: ``headline``, ``holder`` (the rank holding back
    the most steps), ``held_steps``, ``steps``, ``ranks``."""
    res = Result()
    per = step_times(trace, ranks=ranks, steps=steps, workers=workers, scheduler=scheduler)
    if per is None or per.empty:
        res.notes.append("no steps to compare across ranks")
        return res
    per = per[per["device"] == -1] if (per["device"] == -1).any() else per
    if per["part"].nunique() < 2:
        res.notes.append("one rank: nothing to compare across ranks (import every rank's "
                         "trace of the job into one store)")  # fmt: skip
        return res
    offsets = clock_offsets(trace)
    unknown = sorted(p for p, o in offsets.items() if o is None)
    shift = per["part"].map(offsets).astype("Int64")
    rows = per.assign(start=per["ts"].astype("Int64") - shift)
    rows = rows.assign(busy_ns=rows["step_ns"] - rows["comm_wait_ns"])
    # medians of offsets from the earliest start: a float64 of a ~1.7e18 ns time is off by µs
    rel = (rows["start"] - rows["start"].min()).astype("Float64")
    rows["late_start_ns"] = rel.groupby(rows["step"]).transform(_minus_median_of_others)
    held = _held(trace, rows)
    rows = rows.merge(held, on=["part", "step"], how="left")
    rows[["caused_ns", "last"]] = rows[["caused_ns", "last"]].fillna(0).astype(np.int64)
    rows["late_start_ns"] = rows["late_start_ns"].round().astype("Int64")
    step_table = rows[STEP_COLUMNS].sort_values(["step", "rank", "part"]).reset_index(drop=True)
    slowest, causes = _slowest(rows)
    outliers = _outliers(rows)
    heat = _heatmap(step_table)
    res.present["heatmap"] = Presentation(
        title="step time, rank × step", units=tuple((c, "ns") for c in heat.columns[1:])
    )
    res.tables = {
        "steps": step_table,
        "heatmap": heat,
        "slowest": slowest,
        "causes": causes,
        "outliers": outliers,
        "waits": _waits(trace, rows),
    }
    absent = missing_ranks_note(trace)
    if absent:
        res.notes.append(absent)
    if unknown:
        names = ", ".join(f"rank {r}" if (r := _rank(trace, p)) is not None else f"part {p}"
                          for p in unknown)  # fmt: skip
        res.notes.append(f"the clock of {names} could not be aligned (no collective matched "
                         "with another rank): its start and late start are left blank")  # fmt: skip
    res.notes += _notes(slowest)
    res.facts = _facts(slowest, step_table, outliers)
    return res


def clock_offsets(trace: Trace) -> dict[int, int | None]:
    """Per part, the ns to subtract from its times to put it on the common clock (the comm
    tool's alignment, :func:`xpuprof.analysis.comm.clocks.clock_offsets`); None for a part
    whose collectives match no other's (its clock is unknown: it is left out of the
    comparisons of starts)."""
    from xpuprof.analysis.comm.clocks import clock_offsets as solved

    table = solved(trace)
    return {int(p): (None if pd.isna(o) else int(o))
            for p, o in zip(table["part"], table["offset_ns"], strict=True)}  # fmt: skip


def _rank(trace: Trace, part: int) -> int | None:
    return next((s.get("rank") for s in trace.sources if int(s["part"]) == part), None)


def _held(trace: Trace, rows: pd.DataFrame) -> pd.DataFrame:
    """Per part and step: ``caused_ns`` (the other participants' waits in the step's
    collectives that this part arrived last at) and ``last`` (how many)."""
    from xpuprof.analysis.comm import collective_waits

    w = collective_waits(trace)
    if w.empty:
        return pd.DataFrame(columns=["part", "step", "caused_ns", "last"])
    w = _in_steps(w, rows)
    part_of_rank = rows.drop_duplicates("part").set_index("rank")["part"]
    keys = ["step", "process_group", "seq"]
    first = w.drop_duplicates(keys)
    last_part = first["last_rank"].map(part_of_rank)
    count = pd.DataFrame({"part": last_part, "step": first["step"]}).dropna()
    count = count.groupby(["part", "step"]).size().rename("last")
    caused = w.assign(lp=w["last_rank"].map(part_of_rank)).dropna(subset=["lp"])
    caused = caused[caused["lp"] != caused["part"]]
    caused = caused.groupby(["lp", "step"])["wait_ns"].sum().rename("caused_ns")
    caused.index = caused.index.set_names(["part", "step"])
    out = pd.concat([caused, count], axis=1).fillna(0).reset_index()
    out["part"] = out["part"].astype(np.int64)
    out["step"] = out["step"].astype("Int64")
    return out


def _in_steps(w: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The collective rows ``w`` with the step whose window (on their part's own clock) holds
    their start; rows outside every step are dropped."""
    out = []
    windows = dict(list(rows.groupby("part", sort=False)))  # (one pass: hundreds of ranks)
    for p, g in w.groupby("part"):
        win = windows.get(p)
        if win is None or win.empty:
            continue
        win = win.sort_values("ts")
        ts = win["ts"].to_numpy(np.int64)
        at = g["ts"].to_numpy(np.int64)
        k = np.searchsorted(ts, at, side="right") - 1
        ends = ts + win["step_ns"].to_numpy(np.int64)
        inside = (k >= 0) & (at < ends[np.maximum(k, 0)])
        out.append(g[inside].assign(step=win["step"].to_numpy()[k[inside]]))
    return pd.concat(out, ignore_index=True) if out else w.iloc[:0].assign(step=pd.NA)


def _slowest(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per step naming its holder and its main cause, and the holder's categories
    against the median rank's."""
    cats = [c[:-3] for c in rows.columns
            if c.endswith("_ns") and c[:-3] in DESCRIPTION and c[:-3] not in _EFFECTS]  # fmt: skip
    out, causes = [], []
    for step, g in rows.groupby("step", sort=True):
        others = len(g) - 1
        held = g["caused_ns"].to_numpy()
        if held.max() >= HOLD_FLOOR_NS * others:
            h, basis = g.iloc[int(np.argmax(held))], "waited for"
        else:
            h, basis = g.iloc[int(np.argmax(g["step_ns"].to_numpy()))], "longest step"
        # the median of the *other* ranks: with two ranks, the other one
        rest = g[g["part"] != h["part"]]
        med = rest[[f"{c}_ns" for c in cats]].median()
        excess = {c: float(h[f"{c}_ns"] - med[f"{c}_ns"]) for c in cats}
        late = None if pd.isna(h["late_start_ns"]) else int(h["late_start_ns"])
        excess["late start"] = 0.0 if late is None else float(late)
        cause = max(excess, key=excess.__getitem__)
        causes += [{"step": step, "holder": h["rank"], "category": c,
                    "holder_ns": int(h[f"{c}_ns"]), "median_ns": int(round(med[f"{c}_ns"])),
                    "excess_ns": int(round(excess[c]))} for c in cats]  # fmt: skip
        if late is not None:
            causes.append({"step": step, "holder": h["rank"], "category": "late start",
                           "holder_ns": int(late), "median_ns": 0,
                           "excess_ns": int(late)})  # fmt: skip
        out.append({
            "step": step, "holder": h["rank"], "basis": basis, "caused_ns": int(h["caused_ns"]),
            "last": int(h["last"]), "collectives": int(g["last"].sum()),
            "holder_step_ns": int(h["step_ns"]), "median_step_ns": int(g["step_ns"].median()),
            "late_start_ns": late,
            "cause": cause if excess[cause] > 0 else None,
            "cause_ns": int(round(excess[cause])) if excess[cause] > 0 else 0,
            "ranks": len(g),
        })  # fmt: skip
    slowest = pd.DataFrame(out, columns=SLOWEST_COLUMNS)
    slowest["holder"] = slowest["holder"].astype("Int64")
    slowest["late_start_ns"] = slowest["late_start_ns"].astype("Int64")
    causes_df = pd.DataFrame(causes, columns=CAUSE_COLUMNS)
    causes_df = causes_df[causes_df["excess_ns"] != 0].sort_values(
        ["step", "excess_ns"], ascending=[True, False]).reset_index(drop=True)  # fmt: skip
    causes_df["holder"] = causes_df["holder"].astype("Int64")
    return slowest, causes_df


def _outliers(rows: pd.DataFrame) -> pd.DataFrame:
    """Steps in which a rank held the others back more than it usually does: its
    ``caused_ns`` against its own median over the selected steps (``usual_ns``), where the
    excess reaches, per other rank, :data:`HOLD_FLOOR_NS` and :data:`OUTLIER_SHARE` of the
    step's median time, and the usual (at least twice what it usually causes); largest excess
    first. A rank that
    is late every step is the step's holder (``slowest``); this finds the one-off straggler
    (a slow node for a moment, a preempted process, a page-cache miss) that a persistent
    holder would hide. Needs two steps or more."""
    if rows["step"].nunique() < 2:
        return pd.DataFrame(columns=OUTLIER_COLUMNS)
    usual = rows.groupby("part")["caused_ns"].transform("median")
    others = rows.groupby("step")["part"].transform("size") - 1
    out = rows.assign(usual_ns=usual.round().astype(np.int64))
    out["excess_ns"] = out["caused_ns"] - out["usual_ns"]
    # a one-off: per other rank at least the floor and 1 % of the step (less costs the job
    # nothing worth a look), and at least twice its usual (a rank late in every step varies
    # from step to step; that is not a one-off)
    step_ns = rows.groupby("step")["step_ns"].transform("median")
    floor = np.maximum(HOLD_FLOOR_NS, OUTLIER_SHARE * step_ns) * others
    out = out[(out["excess_ns"] >= floor) & (out["excess_ns"] >= out["usual_ns"])]
    out = out.sort_values(["excess_ns", "step", "rank"], ascending=[False, True, True])
    return out[OUTLIER_COLUMNS].reset_index(drop=True)


def _minus_median_of_others(x: pd.Series) -> pd.Series:
    """Each value minus the median of the *other* values of its group (NA stays NA, and is
    nobody's other): with two ranks, the difference to the other one."""
    out = pd.Series(pd.NA, index=x.index, dtype="Float64")
    known = x.dropna()
    n = len(known)
    if n < 2:
        return out
    v = known.to_numpy(np.float64)
    order = np.argsort(v, kind="stable")
    sv = v[order]
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    m = n - 1  # values left once a rank's own is taken out

    def nth(j: int) -> np.ndarray:  # the j-th smallest of the others, for every rank at once
        return sv[j + (j >= pos)]

    med = nth(m // 2) if m % 2 else (nth(m // 2 - 1) + nth(m // 2)) / 2
    out[known.index] = v - med
    return out


def _heatmap(steps: pd.DataFrame) -> pd.DataFrame:
    """Step time, one row per rank and one column per step (``step N``, ns)."""
    wide = steps.pivot_table(index="rank", columns="step", values="step_ns", aggfunc="first")
    wide.columns = [f"step {int(s)}" for s in wide.columns]
    return wide.reset_index()


def _waits(trace: Trace, rows: pd.DataFrame) -> pd.DataFrame:
    """Per rank: its collectives in the selected steps, wait vs transfer, times last and the
    wait it caused."""
    from xpuprof.analysis.comm import collective_waits

    w = collective_waits(trace)
    base = rows.groupby(["rank", "part"], dropna=False)["caused_ns"].sum().reset_index()
    if w.empty:
        return pd.DataFrame(columns=WAIT_COLUMNS)
    w = _in_steps(w, rows)
    per = w.groupby("part").agg(collectives=("id", "size"), collective_ns=("dur", "sum"),
                                wait_ns=("wait_ns", "sum"))  # fmt: skip
    per["transfer_ns"] = per["collective_ns"] - per["wait_ns"]
    firsts = w.drop_duplicates(["step", "process_group", "seq"])
    part_of_rank = rows.drop_duplicates("part").set_index("rank")["part"]
    per["times_last"] = firsts["last_rank"].map(part_of_rank).value_counts()
    out = base.merge(per.reset_index(), on="part", how="left")
    out[["collectives", "collective_ns", "wait_ns", "transfer_ns", "times_last"]] = (
        out[["collectives", "collective_ns", "wait_ns", "transfer_ns", "times_last"]]
        .fillna(0)
        .astype(np.int64)
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        out["wait_pct"] = np.where(out["collective_ns"] > 0,
                                   100 * out["wait_ns"] / out["collective_ns"], np.nan)  # fmt: skip
    return out[WAIT_COLUMNS].sort_values("caused_ns", ascending=False).reset_index(drop=True)


def _notes(slowest: pd.DataFrame) -> list[str]:
    notes = []
    late = slowest[slowest["cause"] == "late start"]
    if len(late):
        notes.append(
            f"in {len(late)} step(s) the rank holding the job back started its step late: what "
            "delayed it lies before the step (the previous step, possibly outside the capture "
            "window, the input pipeline, or the launcher); its work inside the step was not "
            "longer than the median rank's by more than that."
        )
    if (slowest["basis"] == "longest step").any():
        notes.append("steps without matched collectives (or where nobody waited more than "
                     f"{human_time(HOLD_FLOOR_NS)} per rank) name the rank with the longest "
                     "step instead of the one waited for.")  # fmt: skip
    return notes


def _facts(slowest: pd.DataFrame, steps: pd.DataFrame,
           outliers: pd.DataFrame) -> dict[str, object]:  # fmt: skip
    n_ranks = int(steps["part"].nunique())
    facts: dict[str, object] = {"steps": len(slowest), "ranks": n_ranks}
    one_off = ""
    if len(outliers):
        o = outliers.iloc[0]
        facts["outlier_rank"] = None if pd.isna(o["rank"]) else int(o["rank"])
        facts["outlier_step"] = None if pd.isna(o["step"]) else int(o["step"])
        facts["outlier_excess_ns"] = int(o["excess_ns"])
        one_off = (f" Rank {facts['outlier_rank']} in step {facts['outlier_step']} held the "
                   f"others back {human_time(o['excess_ns'])} more in all than it usually "
                   "does (a one-off straggler).")  # fmt: skip
    waited = slowest[slowest["basis"] == "waited for"]
    if waited.empty:
        facts["headline"] = (f"No rank held the others back in {len(slowest)} step(s) "
                             f"of {facts['ranks']} ranks: nobody waited more than "
                             f"{human_time(HOLD_FLOOR_NS)} per rank for another.")  # fmt: skip
        facts["holder"] = None
        facts["held_steps"] = 0
        facts["headline"] += one_off
        return facts
    counts = waited["holder"].value_counts()
    holder = int(counts.index[0])
    mine = waited[waited["holder"] == holder]
    facts["holder"] = holder
    facts["held_steps"] = int(len(mine))
    per_step = mine["caused_ns"].sum() / len(mine)
    cause = mine["cause"].mode()
    why = ""
    if len(cause):
        c = cause.iloc[0]
        ns = mine.loc[mine["cause"] == c, "cause_ns"].mean()
        why = (f"; it started its step {human_time(ns)} after the median rank" if c == "late start"
               else f"; its {DESCRIPTION.get(c, c)} took {human_time(ns)} more than the median "
               "rank's")  # fmt: skip
    # caused_ns sums the waits of every other rank: with 63 of them it can exceed the step
    # itself, so the headline says so and gives the mean per rank beside it
    others = max(1, n_ranks - 1)
    facts["headline"] = (
        f"Rank {holder} held the job back in {len(mine)} of {len(slowest)} step(s): the other "
        f"{others} rank(s) waited {human_time(per_step)} per step for it in their collectives "
        f"({human_time(per_step / others)} each on average){why}." + one_off
    )
    return facts

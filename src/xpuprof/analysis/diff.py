"""Diff of two traces: what changed between a baseline run and a new one.

Ops and device work are matched by name (the same op or kernel in both runs), so a change of
code shows as names added or removed, and a change of speed as time deltas on the same names.
Counts and times are totals over the whole trace (or the chosen steps); the step-time delta
compares the mean step of each run, which is what a user changed the code to move.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import pandas as pd

from xpuprof.analysis.common import DEVICE_LEVELS, Result, StepSelection, where_clause

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

_GROUPS = {
    "ops": ("op",),
    "kernels": DEVICE_LEVELS,
}


def _totals(trace: Trace, levels: tuple[str, ...], where: str) -> pd.DataFrame:
    lv = ", ".join(f"'{x}'" for x in levels)
    return trace.sql(
        "select name, count(*) as count, sum(dur) as time_ns from events "
        f"where {where} and level in ({lv}) and dur is not null group by name"
    )


def _side_by_side(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    m = a.merge(b, on="name", how="outer", suffixes=("_a", "_b"))
    for c in ("count_a", "count_b", "time_ns_a", "time_ns_b"):
        m[c] = m[c].fillna(0).astype("int64")
    m["count_delta"] = m.count_b - m.count_a
    m["time_delta_ns"] = m.time_ns_b - m.time_ns_a
    m["status"] = "same"
    m.loc[(m.count_a == 0), "status"] = "added"
    m.loc[(m.count_b == 0), "status"] = "removed"
    changed = (m.status == "same") & ((m.count_delta != 0) | (m.time_delta_ns != 0))
    m.loc[changed, "status"] = "changed"
    order = m.time_delta_ns.abs().sort_values(ascending=False).index
    return m.loc[order].reset_index(drop=True)


def _step_times(trace: Trace, where: str) -> pd.Series:
    df = trace.sql(f"select dur from events where level = 'step' and {where}")
    return df.dur.astype("int64")


def diff(
    a: Trace, b: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None
) -> Result:
    """Compare trace ``b`` against baseline ``a``: tables ``ops``, ``kernels`` (per name:
    counts, times, deltas, status added/removed/changed/same, largest change first) and
    ``steps`` (mean and median step time of each, and the delta). ``ranks`` and ``steps``
    select the same ranks and steps in both."""
    res = Result()
    w = where_clause(ranks, steps)
    for table, levels in _GROUPS.items():
        ta, tb = _totals(a, levels, w), _totals(b, levels, w)
        if ta.empty and tb.empty:
            res.notes.append(f"neither trace has {table} ({', '.join(levels)} events)")
            continue
        res.tables[table] = _side_by_side(ta, tb)
    sa, sb = _step_times(a, w), _step_times(b, w)
    if sa.empty or sb.empty:
        which = " and ".join(n for n, s in (("the baseline", sa), ("the new trace", sb)) if s.empty)
        res.notes.append(f"no step spans in {which}: no step-time delta")
    else:
        res.tables["steps"] = pd.DataFrame(
            [
                {
                    "steps_a": len(sa),
                    "steps_b": len(sb),
                    "mean_ns_a": float(sa.mean()),
                    "mean_ns_b": float(sb.mean()),
                    "median_ns_a": float(sa.median()),
                    "median_ns_b": float(sb.median()),
                    "mean_delta_ns": float(sb.mean() - sa.mean()),
                    "mean_delta_fraction": float(sb.mean() / sa.mean() - 1),
                }
            ]
        )
    return res

"""Diff of two traces: what changed between a baseline run (``a``) and a new one (``b``).

First the step time: the mean step of each run (what a user changed the code to move) and the
same mean split into where a step's time goes — compute, communication, memcpy, memset, other
device work, input, host idle — as :func:`xpuprof.analysis.overview.overview` splits it, so the
parts of the delta add up to the delta of the step. A run without step spans is compared as one
window per rank (its whole trace), and a note says so.

Then ops and device work, matched by name (the same op or kernel in both runs), so a change of
code shows as names added or removed and a change of speed as time deltas on the same names.
Counts and times are totals over the chosen ranks and steps.

Before any of it, what makes the comparison suspect: the runs were recorded on different devices,
with different world sizes, or the ranks compared are not the same ranks (notes, and the facts
``same_devices``, ``same_world_size``, ``same_ranks``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.analysis.common import DEVICE_LEVELS, Result, StepSelection, where_clause

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

_GROUPS = {
    "ops": ("op",),
    "kernels": DEVICE_LEVELS,
}

#: How each part of a step reads in a sentence.
PART_WORDS = {"step": "step", "host_idle": "host idle", "memcpy": "memcpy", "memset": "memset"}


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


def _per_step(trace: Trace, ranks: Iterable[int] | None, steps: StepSelection) -> pd.DataFrame:
    """The overview's per-step split (one row per rank and step window; ``step_ns`` and one
    ``<part>_ns`` column per part), or an empty frame."""
    from xpuprof.analysis.overview import overview

    table = overview(trace, ranks=ranks, steps=steps, top=0).tables.get("steps")
    return table if table is not None else pd.DataFrame()


def _steps_table(sa: pd.DataFrame, sb: pd.DataFrame) -> pd.DataFrame:
    """One row for the step and one per part: the mean per step of each run, its median, the
    delta and the delta as a fraction of the baseline's mean step."""
    parts = ["step_ns"] + [c for c in sa.columns if c.endswith("_ns") and c != "step_ns"
                           and c in sb.columns]  # fmt: skip
    base = float(sa["step_ns"].mean())
    rows = []
    for col in parts:
        a, b = sa[col].astype("float64"), sb[col].astype("float64")
        if col != "step_ns" and not (a.any() or b.any()):
            continue  # a part neither run has: no row
        rows.append({
            "part": col.removesuffix("_ns"),
            "mean_ns_a": float(a.mean()), "mean_ns_b": float(b.mean()),
            "mean_delta_ns": float(b.mean() - a.mean()),
            "mean_delta_fraction": float(b.mean() - a.mean()) / base if base else np.nan,
            "median_ns_a": float(a.median()), "median_ns_b": float(b.median()),
            "steps_a": len(sa), "steps_b": len(sb),
        })  # fmt: skip
    return pd.DataFrame(rows)


def _devices(meta: dict[str, Any]) -> list[str]:
    """The device names a source's meta records: Kineto's deviceProperties, XPlane's device
    planes."""
    names = [d.get("name") for d in meta.get("deviceProperties") or [] if isinstance(d, dict)]
    for plane in meta.get("planes") or []:
        if isinstance(plane, dict) and plane.get("kind") == "device":
            names.append((plane.get("stats") or {}).get("device_type_string"))
    return sorted({str(n) for n in names if n})


def _describe(trace: Trace, ranks: Iterable[int] | None) -> dict[str, Any]:
    """Devices, world size and ranks of the chosen ranks' sources."""
    wanted = None if ranks is None else {int(r) for r in ranks}
    devices: set[str] = set()
    worlds: set[int] = set()
    have: set[int] = set()
    for s in trace.meta["sources"]:
        rank = s.get("rank")
        if wanted is not None and rank not in wanted:
            continue
        if rank is not None:
            have.add(int(rank))
        meta = s.get("meta") or {}
        devices.update(_devices(meta))
        dist = meta.get("distributedInfo")
        if isinstance(dist, dict) and isinstance(dist.get("world_size"), int):
            worlds.add(dist["world_size"])
    return {"devices": sorted(devices), "world": sorted(worlds), "ranks": sorted(have)}


def _mismatches(
    a: Trace, b: Trace, ranks: Iterable[int] | None
) -> tuple[list[str], list[str], dict[str, Any]]:
    """Notes on what differs between the runs' setups, what differs (``devices``…), and the
    facts ``same_*``."""
    da, db = _describe(a, ranks), _describe(b, ranks)
    notes, differ, facts = [], [], {}
    for key, what in (("devices", "devices"), ("world", "world sizes"), ("ranks", "ranks")):
        x, y = da[key], db[key]
        known = bool(x) and bool(y)
        facts[f"same_{'world_size' if key == 'world' else key}"] = (x == y) if known else None
        if known and x != y:
            differ.append(what)
            show = ", ".join(map(str, x)), ", ".join(map(str, y))
            notes.append(f"the runs differ in {what}: baseline {show[0]}, new {show[1]}; "
                         "their times may differ for that reason alone")  # fmt: skip
    return notes, differ, facts


def _duration(ns: float) -> str:
    """``42_300_000`` → ``42.3 ms`` (four significant digits in ns, µs, ms or s)."""
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(ns) >= scale:
            return f"{ns / scale:.4g} {unit}"
    return f"{ns:.0f} ns"


def _headline(steps: pd.DataFrame, whole: bool, differ: list[str]) -> str:
    row = steps.iloc[0]
    what = "Traced time per rank" if whole else "Step time"
    if row.mean_delta_ns == 0:
        return f"{what} unchanged: {_duration(row.mean_ns_a)} in both runs" + _differ(differ)
    change = f"{_signed(row.mean_delta_ns)}, {_signed_share(row.mean_delta_fraction)}"
    line = f"{what} {_duration(row.mean_ns_a)} → {_duration(row.mean_ns_b)} ({change})"
    parts = steps.iloc[1:]
    big = parts[parts.mean_delta_ns.abs() >= max(abs(row.mean_delta_ns) * 0.1, 1000.0)]
    big = big.reindex(big.mean_delta_ns.abs().sort_values(ascending=False).index).head(3)
    if len(big):
        line += ": " + ", ".join(
            f"{PART_WORDS.get(p, p)} {_signed(d)}"
            for p, d in zip(big.part, big.mean_delta_ns, strict=True)
        )
    return line + _differ(differ)


def _differ(what: list[str]) -> str:
    """`` — but the runs differ in devices, world sizes and ranks``, or nothing."""
    if not what:
        return ""
    listed = what[0] if len(what) == 1 else ", ".join(what[:-1]) + " and " + what[-1]
    return " — but the runs differ in " + listed


def _signed(ns: float) -> str:
    return ("+" if ns >= 0 else "−") + _duration(abs(ns))


def _signed_share(x: float) -> str:
    return "" if x != x else ("+" if x >= 0 else "−") + f"{abs(x):.1%}"


def diff(
    a: Trace, b: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None
) -> Result:
    """Compare trace ``b`` against baseline ``a``. Tables: ``steps`` (first row ``step``: the
    mean step of each run; then one row per part of a step, as the overview splits it: the
    mean per step of each run, ``mean_delta_ns``, ``mean_delta_fraction`` — the delta as a
    fraction of the baseline's mean step, so the parts' fractions add up to the step's — the
    medians and the number of steps), ``ops`` and ``kernels`` (per name: counts, times, deltas,
    status added/removed/changed/same, largest change first). ``ranks`` and ``steps`` select the
    same ranks and steps in both. Facts: ``headline``, ``step_delta_ns``,
    ``step_delta_fraction``, ``same_devices``, ``same_world_size``, ``same_ranks`` (None when
    a run does not record it)."""
    res = Result()
    mismatch, differ, res.facts = _mismatches(a, b, ranks)
    res.notes += mismatch
    sa, sb = _per_step(a, ranks, steps), _per_step(b, ranks, steps)
    if sa.empty or sb.empty:
        which = " and ".join(n for n, s in (("the baseline", sa), ("the new trace", sb)) if s.empty)
        res.notes.append(f"no events selected in {which}: no step-time delta")
    else:
        whole = bool(sa["step"].isna().all() or sb["step"].isna().all())
        if whole:
            res.notes.append("no step spans in one of the runs: each rank's whole trace is "
                             "compared as one window")  # fmt: skip
        res.tables["steps"] = table = _steps_table(sa, sb)
        res.facts |= {
            "step_delta_ns": float(table.mean_delta_ns.iloc[0]),
            "step_delta_fraction": float(table.mean_delta_fraction.iloc[0]),
        }
        res.facts = {"headline": _headline(table, whole, differ), **res.facts}
    w = where_clause(ranks, steps)
    for name, levels in _GROUPS.items():
        ta, tb = _totals(a, levels, w), _totals(b, levels, w)
        if ta.empty and tb.empty:
            res.notes.append(f"neither trace has {name} ({', '.join(levels)} events)")
            continue
        res.tables[name] = _side_by_side(ta, tb)
    return res

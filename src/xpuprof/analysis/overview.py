"""Overview: step time, where each step's time goes, and what bounds the run.

Breakdown of a step (per rank), on the device timeline of that rank, each instant counted once
with this priority so that the parts add up to the step time:

* **compute** — some computation kernel runs;
* **communication** — a collective runs and no computation (communication not hidden);
* **memcpy**, **memset** — copies or sets run and none of the above;
* **other** — other device work only (syncs, annotations on the device are not work);
* **input** — the device is idle while the host is in an input span (DataLoader, load_batch);
* **host-bound idle** — the device is idle otherwise: the host did not feed it in time.

A trace without device events is a CPU run: the host's framework ops are its compute and the
same rules apply to them (said in the notes).

Bottleneck, first match wins (thresholds from XProf's input-pipeline analyzer and its
smart-suggestion rules, see REFERENCE.md):

1. input ≥ 20 % of the step: **input-bound (highly)**; ≥ 5 %: **input-bound (moderately)**;
2. communication not hidden ≥ 30 %: **communication-bound**;
3. host-bound idle ≥ 10 %: **host/launch-bound** (on a CPU run: **host-bound**, the time
   between framework ops: Python code and dispatch);
4. else the device: **memory-bandwidth-bound** when at least half of the computation time
   with a known roofline position is in memory-bound work, **compute-bound** otherwise, and
   **device-bound** when no FLOPs are known to tell them apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import (
    COMMUNICATION,
    COMPUTATION,
    DEVICE_LEVELS,
    MEMORY,
    Result,
    kernel_type,
    merge_intervals,
    where_clause,
)
from xpuprof.analysis.input_pipeline import INPUT_NAME

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

INPUT_HIGH, INPUT_MODERATE = 0.20, 0.05
COMMUNICATION_BOUND = 0.30
HOST_BOUND = 0.10
MEMORY_BOUND_SHARE = 0.5

PARTS = ("compute", "communication", "memcpy", "memset", "other", "input", "host_idle")


def _clip_union(s: np.ndarray, e: np.ndarray, t0: int, t1: int) -> tuple[np.ndarray, np.ndarray]:
    s, e = np.clip(s, t0, t1), np.clip(e, t0, t1)
    keep = e > s
    return merge_intervals(s[keep], e[keep])


def _minus(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of union(a) minus its overlap with union(b) (both merged)."""
    from xpuprof.analysis.common import intersection_length

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
    trace: Trace, ranks: list[int] | None = None, steps: list[int] | None = None, top: int = 10
) -> Result:
    """Step statistics, the per-step breakdown, device utilisation, top ops and kernels and the
    bottleneck of each rank. Tables: ``summary``, ``steps``, ``top_ops``, ``top_kernels``."""
    res = Result()
    w = where_clause(ranks, steps)
    step_rows = trace.sql(
        f"select rank, step, ts, dur from events where level = 'step' and {w} order by rank, ts"
    )
    ev = trace.sql(
        "select rank, level, name, ts, dur, flops, bytes from events where dur is not null "
        f"and level in ('kernel', 'collective', 'memcpy', 'memset', 'op') and {w}"
    )
    inputs_names = trace.sql(
        f"select distinct name from events where level in ('op', 'annotation', 'python') and {w}"
    ).name
    wanted = [n for n in inputs_names if isinstance(n, str) and INPUT_NAME.search(n)]
    if wanted:
        lst = ", ".join("'" + n.replace("'", "''") + "'" for n in wanted)
        inp = trace.sql(f"select rank, ts, dur from events where name in ({lst}) and {w}")
    else:
        inp = pd.DataFrame({"rank": [], "ts": [], "dur": []})
    if step_rows.empty:
        res.notes.append(
            "no step spans (ProfilerStep#N or xpuprof.step): the whole trace is taken as one "
            "step per rank"
        )
        span = trace.sql(
            f"select rank, min(ts) as ts, max(ts + coalesce(dur, 0)) - min(ts) as dur "
            f"from events where {w} group by rank"
        )
        span["step"] = -1
        step_rows = span[["rank", "step", "ts", "dur"]]
    shares = _memory_shares(trace, ranks, steps)
    rows = []
    bound_notes = set()
    for rank, rsteps in step_rows.groupby("rank", dropna=False):
        re_ = ev[ev["rank"].fillna(-1) == (-1 if pd.isna(rank) else rank)]
        dev = re_[re_.level.isin(DEVICE_LEVELS)]
        if dev.empty:
            bound_notes.add("no device events: a CPU run; the host's framework ops are its compute")
            dev = re_[re_.level == "op"]
            kinds = pd.Series(COMPUTATION, index=dev.index)
        else:
            kinds = kernel_type(dev.level, dev.name)
        s = dev.ts.to_numpy(np.int64)
        e = s + dev.dur.to_numpy(np.int64)
        lv = dev.level.astype(str).to_numpy()
        k = kinds.astype(str).to_numpy()
        groups = {
            "compute": (s[k == COMPUTATION], e[k == COMPUTATION]),
            "communication": (s[k == COMMUNICATION], e[k == COMMUNICATION]),
            "memcpy": (s[(k == MEMORY) & (lv == "memcpy")], e[(k == MEMORY) & (lv == "memcpy")]),
            "memset": (s[(k == MEMORY) & (lv == "memset")], e[(k == MEMORY) & (lv == "memset")]),
            "other": (s[k == "OTHER"], e[k == "OTHER"]),
        }
        ri = inp[inp["rank"].fillna(-1) == (-1 if pd.isna(rank) else rank)]
        inputs = (
            ri.ts.to_numpy(np.int64),
            ri.ts.to_numpy(np.int64) + ri.dur.fillna(0).to_numpy(np.int64),
        )
        for st in rsteps.itertuples(index=False):
            t0, t1 = int(st.ts), int(st.ts + st.dur)
            parts = _step_parts(t0, t1, groups, inputs)
            rows.append({"rank": rank, "step": st.step, "step_ns": t1 - t0, **{
                f"{p}_ns": parts[p] for p in PARTS}})  # fmt: skip
    per_step = pd.DataFrame(rows)
    res.notes.extend(sorted(bound_notes))
    res.tables["steps"] = per_step
    summary = []
    for rank, g in per_step.groupby("rank", dropna=False):
        total = g.step_ns.sum()
        frac = {p: g[f"{p}_ns"].sum() / total if total else 0.0 for p in PARTS}
        busy = 1 - frac["input"] - frac["host_idle"]
        row = {
            "rank": rank,
            "steps": len(g),
            "step_ms_mean": g.step_ns.mean() / 1e6,
            "step_ms_p50": g.step_ns.median() / 1e6,
            "step_ms_p90": g.step_ns.quantile(0.9) / 1e6,
            **{f"{p}_fraction": frac[p] for p in PARTS},
            "device_utilization": busy,
        }
        row["bottleneck"] = _bottleneck(
            frac, shares.get(None if pd.isna(rank) else int(rank)), cpu_run=bool(bound_notes)
        )
        summary.append(row)
    res.tables["summary"] = pd.DataFrame(summary)
    we = where_clause(ranks, steps, alias="e")
    res.tables["top_ops"] = trace.sql(
        "with c as (select parent, sum(dur) as d from events group by parent) "
        "select e.name as op, count(*) as calls, sum(e.dur) / 1e6 as total_ms, "
        "sum(e.dur - coalesce(c.d, 0)) / 1e6 as self_ms from events e "
        f"left join c on c.parent = e.id where e.level = 'op' and {we} "
        f"group by e.name order by self_ms desc limit {int(top)}"
    )
    res.tables["top_kernels"] = trace.sql(
        "select name as kernel, level, count(*) as calls, sum(dur) / 1e6 as total_ms, "
        "avg(dur) / 1e3 as mean_us from events where level in "
        f"('kernel', 'collective', 'memcpy', 'memset') and {w} group by name, level "
        f"order by total_ms desc limit {int(top)}"
    )
    return res


def _memory_shares(
    trace: Trace, ranks: list[int] | None, steps: list[int] | None
) -> dict[int | None, float]:
    """Per rank, the share of timed work with a known roofline position that is
    memory-bound (below the device's ridge point); ranks with none known are absent. One
    roofline run for all ranks."""
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


def _bottleneck(frac: dict[str, float], memory_share: float | None, cpu_run: bool = False) -> str:
    if frac["input"] >= INPUT_HIGH:
        return "input-bound (highly)"
    if frac["input"] >= INPUT_MODERATE:
        return "input-bound (moderately)"
    if frac["communication"] >= COMMUNICATION_BOUND:
        return "communication-bound"
    if frac["host_idle"] >= HOST_BOUND:
        # on a CPU run there are no launches: the time is Python and dispatch between ops
        return "host-bound (time outside framework ops)" if cpu_run else "host/launch-bound"
    if memory_share is None:
        return "device-bound"
    return "memory-bandwidth-bound" if memory_share >= MEMORY_BOUND_SHARE else "compute-bound"

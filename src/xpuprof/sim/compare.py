"""The what-if's comparison tables: the baseline (the identity replay) against the changed
schedule, per step and per rank (``docs/whatif.md``, "What is printed")."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.sim.paths import step_nodes

if TYPE_CHECKING:
    from xpuprof.sim.graph import ReplayGraph
    from xpuprof.sim.replay import Replay

SUMMARY_COLUMNS = ["rank", "part", "steps", "baseline_ns", "predicted_ns", "speedup",
                   "baseline_with_device_ns", "predicted_with_device_ns",
                   "speedup_with_device"]  # fmt: skip


def steps_table(base: Replay, time: np.ndarray) -> pd.DataFrame:
    """Per step: the baseline (the identity replay) and the prediction."""
    st = base.steps
    cols = ["rank", "part", "step", "name", "baseline_ns", "predicted_ns", "change_pct"]
    if st.empty:
        return pd.DataFrame(columns=cols)
    g = base.graph
    node_of = step_nodes(g, base.step_ids)
    out = st[["rank", "part", "step", "name"]].copy()
    out["baseline_ns"] = st["simulated_ns"].to_numpy()
    s, e = node_of
    out["predicted_ns"] = time[e] - time[s]
    out["baseline_with_device_ns"] = st["with_device_simulated_ns"].to_numpy()
    dev = device_end(g, base, time, st)
    out["predicted_with_device_ns"] = np.fmax(time[e], dev) - time[s]
    out["predicted_with_device_ns"] = out["predicted_with_device_ns"].astype("int64")
    out["change_pct"] = pct(out["predicted_ns"], out["baseline_ns"]).round(3)
    return out


def device_end(g: ReplayGraph, base: Replay, time: np.ndarray, st: pd.DataFrame) -> np.ndarray:
    """Per step, the latest simulated end of the device work launched in it (-inf: none)."""
    ev = base.device_steps
    if ev.empty:
        return np.full(len(st), -np.inf)
    per = pd.DataFrame({"part": ev["part"], "step": ev["step"], "t": time[ev["node"]]})
    last = per.groupby(["part", "step"])["t"].max()
    keys = pd.MultiIndex.from_arrays([st["part"], st["step"]])
    return last.reindex(keys).to_numpy(float)


def summary_table(base: Replay, steps: pd.DataFrame) -> pd.DataFrame:
    if steps.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    g = steps.groupby(["part"], sort=True)
    out = g.agg(
        rank=("rank", "first"),
        steps=("step", "size"),
        baseline_ns=("baseline_ns", "mean"),
        predicted_ns=("predicted_ns", "mean"),
        baseline_with_device_ns=("baseline_with_device_ns", "mean"),
        predicted_with_device_ns=("predicted_with_device_ns", "mean"),
    ).reset_index()
    out["speedup"] = (out["baseline_ns"] / out["predicted_ns"]).round(4)
    out["speedup_with_device"] = (out["baseline_with_device_ns"]
                                  / out["predicted_with_device_ns"]).round(4)  # fmt: skip
    for c in ("baseline_ns", "predicted_ns", "baseline_with_device_ns", "predicted_with_device_ns"):
        out[c] = out[c].round().astype("int64")
    out["rank"] = out["rank"].astype("Int64")
    return out[SUMMARY_COLUMNS]


def span_summary(base: Replay, time: np.ndarray) -> pd.DataFrame:
    """Without steps: each rank's span (its first point to its last, device work included),
    in the identity replay and with the changes (``steps`` 0 says so)."""
    g = base.graph
    part = g.nodes.part
    rows = []
    for p in g.parts:
        mine = part == p
        if not mine.any():
            continue
        b = int(base.time[mine].max() - base.time[mine].min())
        c = int(time[mine].max() - time[mine].min())
        rows.append({"rank": g.ranks.get(p), "part": p, "steps": 0, "baseline_ns": b,
                     "predicted_ns": c, "speedup": round(b / c, 4) if c > 0 else None,
                     "baseline_with_device_ns": b, "predicted_with_device_ns": c,
                     "speedup_with_device": round(b / c, 4) if c > 0 else None})  # fmt: skip
    out = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    out["rank"] = out["rank"].astype("Int64")
    return out


def pct(a: pd.Series | float, b: pd.Series | float) -> pd.Series | float:
    return 100.0 * (a - b) / b

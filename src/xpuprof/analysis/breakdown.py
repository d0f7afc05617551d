"""How the device spends its time: HTA's temporal breakdown (span, idle, compute, non-compute
per rank), kernel-type breakdown (time during which exactly a set of kernel types runs, and
per-kernel statistics) and communication/computation overlap.

Every step by default, like every tool; ``steps="drop-last"`` (or ``hta_compatible`` with no
``steps``) leaves out the last step as HTA does by default. Times are exact nanoseconds and
device work is what the schema calls device work; ``hta_compatible=True`` (or a set of
:data:`~xpuprof.analysis.device.QUIRKS`) reproduces HTA's own selection and rounding instead.
The definitions, and each difference from HTA with its reason: ``docs/breakdown.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import (
    COMMUNICATION,
    COMPUTATION,
    MEMORY,
    Result,
    StepSelection,
    intersection_length,
    merge_intervals,
)
from xpuprof.analysis.device import QUIRKS, DeviceWork, device_work, out_rank, rank_name
from xpuprof.analysis.hta import hta_frame, hta_kernel_type
from xpuprof.core.text import human_time

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: Re-exported: the selection and HTA's behaviours live in analysis.device and analysis.hta.
__all__ = [
    "QUIRKS",
    "DeviceWork",
    "device_work",
    "hta_frame",
    "hta_kernel_type",
    "temporal_breakdown",
    "kernel_breakdown",
    "comm_overlap",
    "breakdown",
    "headline",
]

# -------------------------------------------------------------------------------- analyses


def _union(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return merge_intervals(ts, end)


def _temporal_rows(dw: DeviceWork) -> pd.DataFrame:
    rows = []
    df = dw.df
    for r, g in df.groupby("rank", sort=True):
        ts, end = g["ts"].to_numpy(), g["end"].to_numpy()
        s, e = _union(ts, end)
        span = int(e[-1] - s[0])
        busy = int((e - s).sum())
        comp = g["ktype"].to_numpy() == COMPUTATION
        cs, ce = _union(ts[comp], end[comp])
        compute = int((ce - cs).sum())
        idle = span - busy
        rows.append(
            {
                "rank": r,
                "idle_ns": idle,
                "compute_ns": compute,
                "non_compute_ns": span - compute - idle,
                "span_ns": span,
                "device_events": len(g),
            }
        )
    cols = ["rank", "idle_ns", "compute_ns", "non_compute_ns", "span_ns", "device_events"]
    out = pd.DataFrame(rows, columns=cols)
    for c in ("idle", "compute", "non_compute"):
        with np.errstate(divide="ignore", invalid="ignore"):
            out[f"{c}_pct"] = 100.0 * out[f"{c}_ns"] / out["span_ns"].replace(0, np.nan)
    out["rank"] = out_rank(out["rank"])
    return out


def temporal_breakdown(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    hta_compatible: bool | Iterable[str] = False,
) -> Result:
    """Per rank: idle, compute and non-compute time of the device and their percentages of
    the span from the first device event's start to the last one's end (HTA's
    ``get_temporal_breakdown``; see the module docstring).

    Table ``temporal``: ``rank``, ``idle_ns``, ``compute_ns``, ``non_compute_ns``,
    ``span_ns`` (HTA's "kernel_time"), ``device_events``, ``idle_pct``, ``compute_pct``,
    ``non_compute_pct``. Notes: what was dropped, ranks without device events. Facts:
    ``headline`` (:func:`headline`), ``device_events``, ``steps``, ``hta_compatible``.
    """
    dw = device_work(trace, ranks, steps, hta_compatible=hta_compatible)
    temporal = _temporal_rows(dw)
    facts = _facts(dw)
    line = headline(temporal)
    if line:
        facts["headline"] = line
    return Result(tables={"temporal": temporal}, notes=dw.notes, facts=facts)


def headline(temporal: pd.DataFrame) -> str | None:
    """The temporal breakdown in one sentence: the share of the span the device computes,
    runs other work and is idle (one rank), or their ranges and the most idle rank (several);
    None without device work."""
    t = temporal
    if not len(t):
        return None
    if len(t) == 1:
        r = t.iloc[0]
        on = "" if pd.isna(r["rank"]) else f" on rank {int(r['rank'])}"
        return (f"The device computes {r.compute_pct:.0f}% of the {human_time(r.span_ns)} "
                f"traced{on}, runs other work (communication, memory) "
                f"{r.non_compute_pct:.0f}% and is idle {r.idle_pct:.0f}%")  # fmt: skip
    worst = t.loc[t.idle_pct.idxmax()]
    return (f"Across {len(t)} ranks the devices compute {t.compute_pct.min():.0f}–"
            f"{t.compute_pct.max():.0f}% of the time traced, run other work (communication, "
            f"memory) {t.non_compute_pct.min():.0f}–{t.non_compute_pct.max():.0f}% and are idle "
            f"{t.idle_pct.min():.0f}–{t.idle_pct.max():.0f}% (most idle: rank "
            f"{int(worst['rank'])}, {worst.idle_pct:.0f}%)")  # fmt: skip


def _facts(dw: DeviceWork) -> dict[str, int | str | bool]:
    """What every breakdown states: how many device events it read, which steps."""
    return {"device_events": len(dw.df), "steps": dw.steps, "hta_compatible": dw.hta_compatible}


def _type_sweep(g: pd.DataFrame, types: tuple[str, ...]) -> dict[str, int]:
    """Time during which exactly each combination of kernel types runs (HTA's
    ``_get_gpu_kernel_type_time``), each type's intervals merged first."""
    times, deltas = [], []
    for i, t in enumerate(types):
        m = g["ktype"].to_numpy() == t
        if not m.any():
            continue
        s, e = _union(g["ts"].to_numpy()[m], g["end"].to_numpy()[m])
        times += [s, e]
        deltas += [np.full(len(s), 1 << i, np.int64), np.full(len(e), -(1 << i), np.int64)]
    if not times:
        return {}
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    o = np.argsort(t, kind="stable")
    t, d = t[o], d[o]
    running = np.cumsum(d)
    seg = np.diff(t)
    mask = running[:-1]
    out: dict[str, int] = {}
    for m in np.unique(mask[mask > 0]):
        label = " overlapping ".join(ty for i, ty in enumerate(types) if m & (1 << i))
        out[label] = out.get(label, 0) + int(seg[mask == m].sum())
    return out


def _kernel_stats(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    g = df.groupby(keys, sort=False, observed=True)["dur"]
    out = g.agg(
        count="count", sum_ns="sum", mean_ns="mean", min_ns="min", max_ns="max", std_ns="std"
    ).reset_index()
    out["std_ns"] = out["std_ns"].fillna(0.0)
    return out


def _top(k: pd.DataFrame, sq: pd.DataFrame, top: int) -> pd.DataFrame:
    """Keep the ``top`` names by time per (rank, type); fold the rest into "others" with
    statistics of their kernels (count-weighted mean, pooled std)."""
    k = k.sort_values(["rank", "kernel_type", "sum_ns"], ascending=[True, True, False])
    k["_pos"] = k.groupby(["rank", "kernel_type"]).cumcount()
    k = k.merge(sq, on=["rank", "kernel_type", "name"], how="left")
    keep, rest = k[k["_pos"] < top], k[k["_pos"] >= top]
    if rest.empty:
        return keep.drop(columns=["_pos", "_sq"])
    agg = (
        rest.groupby(["rank", "kernel_type"])
        .agg(
            count=("count", "sum"),
            sum_ns=("sum_ns", "sum"),
            min_ns=("min_ns", "min"),
            max_ns=("max_ns", "max"),
            _sq=("_sq", "sum"),
        )
        .reset_index()
    )
    agg["name"] = "others"
    agg["mean_ns"] = agg["sum_ns"] / agg["count"]
    n = agg["count"].astype(float)
    var = (agg["_sq"] - n * agg["mean_ns"] ** 2) / (n - 1).where(n > 1, np.nan)
    agg["std_ns"] = np.sqrt(var.clip(lower=0)).fillna(0.0)
    return pd.concat([keep, agg], ignore_index=True).drop(columns=["_pos", "_sq"])


def _hta_aggr(g: pd.DataFrame, num_kernels: int, duration_ratio: float) -> pd.DataFrame:
    """HTA's ``_aggr_gpu_kernel_time``, quirks included (see the module docstring)."""
    t = g.groupby("name")["dur"].agg(["sum", "max", "min", "mean", "std"]).reset_index()
    t = t.sort_values("sum", ascending=False, ignore_index=True, kind="stable")
    t["std"] = t["std"].fillna(0)
    if len(t) > num_kernels:
        cs = t["sum"].cumsum()
        q = cs.quantile(duration_ratio)
        t.loc[cs > q, "name"] = "others"
        t.loc[t.index >= num_kernels, "name"] = "others"
        t = t.groupby("name")["sum"].agg(["sum", "max", "min", "mean", "std"]).reset_index()
        t["std"] = t["std"].fillna(0)
    return t


def kernel_breakdown(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    top: int | None = None,
    include_memory: bool = True,
    hta_compatible: bool | Iterable[str] = False,
    num_kernels: int = 10,
    duration_ratio: float = 0.8,
) -> Result:
    """Time by kernel type and by kernel (HTA's ``get_gpu_kernel_breakdown``).

    Tables:

    * ``types``: over all selected ranks, ``kernel_type`` (a type, or "A overlapping B" for
      time during which kernels of both run), ``time_ns`` and ``percentage`` of the total;
      each type's intervals are merged first, so concurrent kernels of one type count once.
      COMPUTATION, COMMUNICATION and (``include_memory``) MEMORY, as HTA.
    * ``types_by_rank``: per rank and type: ``count``, ``sum_ns`` (sum of durations),
      ``busy_ns`` (their union) and ``percentage`` of the rank's summed device time.
    * ``kernels``: per rank, type and name: ``count``, ``sum_ns``, ``mean_ns``, ``min_ns``,
      ``max_ns``, ``std_ns`` (sample, 0 for one kernel), ``percentage`` of the rank's time in
      that type; all names, or the ``top`` names per (rank, type) plus "others".

    With ``hta_compatible=True`` the ``kernels`` table is HTA's instead (its columns ``sum``,
    ``max``, ``min``, ``mean``, ``std`` in ns, ``num_kernels``/``duration_ratio`` folding).
    """
    dw = device_work(trace, ranks, steps, hta_compatible=hta_compatible)
    res = Result(notes=dw.notes, facts=_facts(dw))
    df = dw.df
    types = (COMPUTATION, COMMUNICATION) + ((MEMORY,) if include_memory else ())
    res.tables["types"] = _types_table(df, types)
    res.tables["types_by_rank"] = _types_by_rank(df[df["ktype"].isin(types)] if dw.quirks else df)
    if dw.quirks:
        k = _hta_kernels(df, types, num_kernels, duration_ratio)
    else:
        k = _kernels(df, top)
    k["rank"] = out_rank(k["rank"])
    res.tables["kernels"] = k  # without device work, the selection's notes say why
    return res


def _types_table(df: pd.DataFrame, types: tuple[str, ...]) -> pd.DataFrame:
    """Time during which exactly each combination of types runs, summed over ranks."""
    acc: dict[str, int] = {}
    for _, g in df.groupby("rank", sort=True):
        for k, v in _type_sweep(g, types).items():
            acc[k] = acc.get(k, 0) + v
    tt = pd.DataFrame({"kernel_type": list(acc), "time_ns": list(acc.values())})
    tt = tt.sort_values("time_ns", ascending=False, ignore_index=True)
    total = tt["time_ns"].sum()
    tt["percentage"] = 100.0 * tt["time_ns"] / total if total else np.nan
    return tt


def _types_by_rank(sel: pd.DataFrame) -> pd.DataFrame:
    by = sel.groupby(["rank", "ktype"], sort=True)
    tr = by["dur"].agg(count="count", sum_ns="sum").reset_index()
    tr["busy_ns"] = [
        int(np.diff(np.vstack(_union(g["ts"].to_numpy(), g["end"].to_numpy())), axis=0).sum())
        for _, g in by
    ]
    rank_tot = tr.groupby("rank")["sum_ns"].transform("sum")
    tr["percentage"] = 100.0 * tr["sum_ns"] / rank_tot.replace(0, np.nan)
    tr = tr.rename(columns={"ktype": "kernel_type"})
    tr["rank"] = out_rank(tr["rank"])
    return tr


def _hta_kernels(
    df: pd.DataFrame, types: tuple[str, ...], num_kernels: int, duration_ratio: float
) -> pd.DataFrame:
    """HTA's per-kernel table, per rank and type (see :func:`_hta_aggr`)."""
    parts = []
    for r, g in df.groupby("rank", sort=True):
        for t in types:
            a = _hta_aggr(g[g["ktype"] == t], num_kernels, duration_ratio)
            a["kernel_type"], a["rank"] = t, r
            parts.append(a)
    cols = ["name", "sum", "max", "min", "std", "mean", "kernel_type", "rank"]
    k = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)
    return k.sort_values(["kernel_type", "name", "rank"], ignore_index=True)


def _kernels(df: pd.DataFrame, top: int | None) -> pd.DataFrame:
    """Our per-kernel table: statistics of the kernels themselves, ``top`` names per (rank,
    type) plus "others"."""
    sel = df.rename(columns={"ktype": "kernel_type"})
    k = _kernel_stats(sel, ["rank", "kernel_type", "name"])
    if top is not None:
        sq = (
            sel.assign(_sq=sel["dur"].astype(float) ** 2)
            .groupby(["rank", "kernel_type", "name"], observed=True)["_sq"]
            .sum()
            .reset_index()
        )
        k = _top(k, sq, int(top))
    tot = k.groupby(["rank", "kernel_type"])["sum_ns"].transform("sum")
    k["percentage"] = 100.0 * k["sum_ns"] / tot.replace(0, np.nan)
    k = k.sort_values(
        ["rank", "kernel_type", "sum_ns"], ascending=[True, True, False], ignore_index=True
    )
    k["name"] = k["name"].astype(str)
    return k


def comm_overlap(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    hta_compatible: bool | Iterable[str] = False,
) -> Result:
    """Per rank: how much of the communication time computation runs alongside (HTA's
    ``get_comm_comp_overlap``): ``comm_ns`` (union of communication kernels), ``compute_ns``
    (union of computation kernels), ``overlap_ns`` (their intersection), ``overlap_ratio``
    = overlap ÷ comm and ``overlap_pct`` (table ``overlap``). A rank without communication
    has NaN ratio, and a note."""
    dw = device_work(trace, ranks, steps, hta_compatible=hta_compatible)
    notes = list(dw.notes)
    rows = []
    for r, g in dw.df.groupby("rank", sort=True):
        kt = g["ktype"].to_numpy()
        ts, end = g["ts"].to_numpy(), g["end"].to_numpy()
        comm = _union(ts[kt == COMMUNICATION], end[kt == COMMUNICATION])
        comp = _union(ts[kt == COMPUTATION], end[kt == COMPUTATION])
        comm_ns = int((comm[1] - comm[0]).sum())
        comp_ns = int((comp[1] - comp[0]).sum())
        ov = intersection_length(comm, comp)
        if comm_ns == 0:
            notes.append(f"{rank_name(r)}: no communication kernels, overlap undefined")
        rows.append(
            {
                "rank": r,
                "comm_ns": comm_ns,
                "compute_ns": comp_ns,
                "overlap_ns": ov,
                "overlap_ratio": ov / comm_ns if comm_ns else np.nan,
            }
        )
    out = pd.DataFrame(
        rows, columns=["rank", "comm_ns", "compute_ns", "overlap_ns", "overlap_ratio"]
    )
    out["overlap_pct"] = 100.0 * out["overlap_ratio"]
    out["rank"] = out_rank(out["rank"])
    return Result(tables={"overlap": out}, notes=notes, facts=_facts(dw))


def breakdown(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    top: int | None = 10,
    hta_compatible: bool | Iterable[str] = False,
) -> Result:
    """The temporal breakdown, kernel-type breakdown and comm/compute overlap as one
    :class:`Result` (tables ``temporal``, ``types``, ``types_by_rank``, ``kernels`` with the
    ``top`` kernels per rank and type, ``overlap``), over one selection of device work.

    Facts: ``headline`` (the temporal breakdown's, :func:`headline`), ``device_events``
    (selected), ``steps`` (the selection applied: ``all``, ``drop-last`` or ``list``),
    ``hta_compatible``."""
    kw = {"ranks": ranks, "steps": steps, "hta_compatible": hta_compatible}
    parts = (temporal_breakdown(trace, **kw), kernel_breakdown(trace, top=top, **kw),
             comm_overlap(trace, **kw))  # fmt: skip
    tables = {name: df for part in parts for name, df in part.tables.items()}
    notes = list(dict.fromkeys(n for part in parts for n in part.notes))
    return Result(tables=tables, notes=notes, facts=parts[0].facts)

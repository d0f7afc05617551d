"""Idle time of each device stream and why (host wait, kernel wait, other), kernel launch
delays, short kernels and the launch queue length, as Holistic Trace Analysis 0.5.0 defines
them (kernel wait below 30 µs, runtime outliers above 50 µs, launch delays above 100 µs, the
launch-queue limit of 1024).

Every step by default, like every tool; ``steps="drop-last"`` (or ``hta_compatible`` with no
``steps``) leaves out the last step as HTA does by default. The device work is
:func:`xpuprof.analysis.device.device_work`, shared with the breakdown. The definitions, and
each difference from HTA with its reason: ``docs/breakdown.md``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import Result, StepSelection
from xpuprof.analysis.device import DeviceWork, device_work, out_rank
from xpuprof.analysis.hta import HTA_IDLE_CATEGORIES
from xpuprof.core.text import human_time, plural

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

HOST_WAIT, KERNEL_WAIT, OTHER_WAIT = "host_wait", "kernel_wait", "other"
CATEGORIES = (HOST_WAIT, KERNEL_WAIT, OTHER_WAIT)

#: HTA's thresholds (``TraceAnalysis.get_idle_time_breakdown``: consecutive_kernel_delay=30 in
#: trace µs; ``get_cuda_kernel_launch_stats``: runtime_cutoff=50 µs, launch_delay_cutoff=100 µs).
KERNEL_WAIT_NS = 30_000
RUNTIME_CUTOFF_NS = 50_000
LAUNCH_DELAY_CUTOFF_NS = 100_000
#: CUDA's launch queue per stream (``hta/common/constants.py``: CUDA_MAX_LAUNCH_QUEUE_PER_STREAM).
MAX_QUEUE = 1024

#: Runtime calls HTA counts as launches (``cuda_kernel_launch_stats``; queue length adds more).
HTA_LAUNCH_NAMES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "runFunction - job_prep_and_submit_for_execution",
)
HTA_MEMORY_LAUNCH_NAMES = ("cudaMemcpyAsync", "cudaMemsetAsync")
HTA_QUEUE_NAMES = (
    "cudaMemsetAsync",
    "cudaMemcpyAsync",
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "runFunction - job_prep_and_submit_for_execution",
    "hipLaunchKernel",
    "hipExtModuleLaunchKernel",
    "hipMemsetAsync",
    "hipMemcpyAsync",
    "hipMemcpyWithStream",
)


def _group_start(keys: list[np.ndarray]) -> np.ndarray:
    """True where a row starts a new group (rows sorted by the keys)."""
    n = len(keys[0])
    new = np.zeros(n, dtype=bool)
    if n:
        new[0] = True
        for k in keys:
            new[1:] |= k[1:] != k[:-1]
    return new


def _segmented_cummax(x: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Running maximum restarted at each group start, vectorized: shift each group above all
    earlier ones, take one global running maximum, shift back."""
    if not len(x):
        return x
    gid = np.cumsum(new) - 1
    lo = x.min()
    width = int(x.max() - lo) + 1
    y = (x - lo) + gid.astype(np.int64) * width
    return np.maximum.accumulate(y) - gid.astype(np.int64) * width + lo


def _idle_breakdown(
    dw: DeviceWork, kernel_wait_ns: int, streams: Iterable[int] | None
) -> pd.DataFrame:
    q = dw.quirks
    df = dw.df
    if "stream_arg" in q:
        df = df[df["category"].isin(HTA_IDLE_CATEGORIES)]
    if streams is not None:
        df = df[df["stream"].isin([int(s) for s in streams])]
    keys = ["rank", "stream"] if "stream_arg" in q else ["rank", "device", "stream"]
    if "sort_ties" in q:
        # HTA sorts each stream's events (in file order) by time with pandas' default
        # quicksort; equal times keep the order that sort gives them
        df = df.sort_values(["part", "index"], kind="stable")
        parts = [g.sort_values("ts") for _, g in df.groupby(keys, sort=True)]
        df = pd.concat(parts) if parts else df
    else:
        df = df.sort_values([*keys, "ts"], kind="stable")
    k = [df[c].fillna(-1).to_numpy(np.int64) for c in keys]
    new = _group_start(k)
    ts = df["ts"].to_numpy(np.int64)
    end = df["end"].to_numpy(np.int64)
    if "prev_end" in q:
        prev_end = np.r_[0, end[:-1]]  # HTA: the previous event's end (shift(1))
    else:
        prev_end = np.r_[0, _segmented_cummax(end, new)[:-1]]  # the latest end so far
    gap = ts - prev_end
    valid = ~new
    if "prev_end" not in q:
        valid &= gap > 0
    host = df["has_launch"].to_numpy(bool) & (df["launch_ts"].to_numpy(np.int64) > prev_end)
    cat = np.where(host, 0, np.where(gap < kernel_wait_ns, 1, 2))
    g = pd.DataFrame({c: kk[valid] for c, kk in zip(keys, k, strict=True)})
    g["cat"] = cat[valid]
    g["gap"] = gap[valid]
    s = g.groupby([*keys, "cat"])["gap"].sum()
    # one row per stream and category, zeros included
    streams_df = pd.DataFrame({c: kk[new] for c, kk in zip(keys, k, strict=True)})
    if "device" not in keys:
        dev = pd.DataFrame({c: kk for c, kk in zip(keys, k, strict=True)})
        dev["device"] = df["device"].to_numpy()
        dev = dev.groupby(keys)["device"].first().reset_index()
        streams_df = streams_df.merge(dev, on=keys, how="left")
    full = streams_df.merge(pd.DataFrame({"cat": [0, 1, 2]}), how="cross")
    full = full.merge(s.rename("idle_ns").reset_index(), on=[*keys, "cat"], how="left")
    full["idle_ns"] = full["idle_ns"].fillna(0).astype(np.int64)
    full["idle_category"] = np.array(CATEGORIES, dtype=object)[full["cat"].to_numpy()]
    tot = full.groupby(keys)["idle_ns"].transform("sum")
    full["idle_ratio"] = full["idle_ns"] / tot.replace(0, np.nan)
    full["rank"] = out_rank(full["rank"])
    full["device"] = full["device"].astype("Int64")
    full["stream"] = full["stream"].astype("Int64")
    return full[["rank", "device", "stream", "idle_category", "idle_ns", "idle_ratio"]]


def _hta_rows(dw: DeviceWork) -> pd.DataFrame:
    """HTA's (filtered) trace rows that launch analyses join: kept host rows with a
    correlation or a launch name, and the selected device rows; ``dev`` marks the latter."""
    assert dw.host is not None
    cols = ["rank", "part", "index", "device", "name", "ts", "dur", "correlation"]
    host = dw.host[dw.host["correlation"] != -1][cols].assign(dev=False, stream=-1)
    dev = dw.df[[*cols, "stream"]].assign(dev=True)
    return pd.concat([host, dev], ignore_index=True)


def _launches(dw: DeviceWork) -> pd.DataFrame:
    """One row per (launch call, device event): rank, device, stream, name, cpu_ns, gpu_ns,
    launch_delay_ns, launch_ts, ts."""
    if "launch_names" not in dw.quirks:
        d = dw.df[dw.df["has_launch"]]
        out = pd.DataFrame(
            {
                "rank": d["rank"].to_numpy(),
                "device": d["device"].to_numpy(),
                "stream": d["stream"].to_numpy(),
                "name": d["name"].to_numpy(),
                "launch_name": d["launch_name"].to_numpy(),
                "launch_ts": d["launch_ts"].to_numpy(np.int64),
                "cpu_ns": d["launch_dur"].to_numpy(np.int64),
                "ts": d["ts"].to_numpy(np.int64),
                "gpu_ns": d["dur"].to_numpy(np.int64),
            }
        )
    else:
        # HTA: host events and device events whose correlation is that of a named launch
        # call, joined on correlation (every pair)
        f = _hta_rows(dw)
        names = HTA_LAUNCH_NAMES + HTA_MEMORY_LAUNCH_NAMES
        corr = f[f["name"].isin(names)][["part", "correlation"]].drop_duplicates()
        f = f.merge(corr, on=["part", "correlation"], how="inner")
        j = f[~f["dev"]].merge(f[f["dev"]], on=["part", "correlation"], suffixes=("_c", "_g"))
        out = pd.DataFrame(
            {
                "rank": j["rank_g"].to_numpy(),
                "device": j["device_g"].to_numpy(),
                "stream": j["stream_g"].to_numpy(),
                "name": j["name_g"].to_numpy(),
                "launch_name": j["name_c"].to_numpy(),
                "launch_ts": j["ts_c"].to_numpy(np.int64),
                "cpu_ns": j["dur_c"].to_numpy(np.int64),
                "ts": j["ts_g"].to_numpy(np.int64),
                "gpu_ns": j["dur_g"].to_numpy(np.int64),
            }
        )
    out["launch_delay_ns"] = np.clip(out["ts"] - out["launch_ts"] - out["cpu_ns"], 0, None)
    return out


def _launch_summary(
    la: pd.DataFrame, runtime_cutoff_ns: int, launch_delay_cutoff_ns: int
) -> pd.DataFrame:
    la = la.assign(
        short=(la["cpu_ns"] <= runtime_cutoff_ns) & (la["gpu_ns"] < la["cpu_ns"]),
        rt_out=la["cpu_ns"] > runtime_cutoff_ns,
        ld_out=la["launch_delay_ns"] > launch_delay_cutoff_ns,
    )
    g = la.groupby("rank", sort=True)
    out = g.agg(
        launches=("cpu_ns", "size"),
        cpu_ns=("cpu_ns", "sum"),
        gpu_ns=("gpu_ns", "sum"),
        launch_delay_ns=("launch_delay_ns", "sum"),
        launch_delay_mean_ns=("launch_delay_ns", "mean"),
        launch_delay_p50_ns=("launch_delay_ns", "median"),
        launch_delay_p90_ns=("launch_delay_ns", lambda x: float(np.percentile(x, 90))),
        launch_delay_max_ns=("launch_delay_ns", "max"),
        runtime_outliers=("rt_out", "sum"),
        launch_delay_outliers=("ld_out", "sum"),
        short_kernels=("short", "sum"),
    ).reset_index()
    out["rank"] = out_rank(out["rank"])
    return out


def _short_kernels(la: pd.DataFrame, runtime_cutoff_ns: int) -> pd.DataFrame:
    s = la[(la["cpu_ns"] <= runtime_cutoff_ns) & (la["gpu_ns"] < la["cpu_ns"])]
    out = (
        s.assign(name=s["name"].astype(object))
        .groupby(["rank", "name"], sort=False)
        .agg(count=("gpu_ns", "size"), gpu_ns=("gpu_ns", "sum"), cpu_ns=("cpu_ns", "sum"))
        .reset_index()
        .sort_values(["rank", "count", "gpu_ns"], ascending=[True, False, False], ignore_index=True)
    )
    out["rank"] = out_rank(out["rank"])
    return out


def _queue(dw: DeviceWork, la: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Queue length change points per stream and their summary."""
    q = dw.quirks
    keys = ["rank", "stream"] if "stream_arg" in q else ["rank", "device", "stream"]
    if "launch_names" in q:
        ev = _queue_events_hta(dw)
    else:
        ev = pd.concat(
            [
                pd.DataFrame(
                    {
                        "rank": la["rank"],
                        "device": la["device"],
                        "stream": la["stream"],
                        "ts": la["launch_ts"],
                        "d": 1,
                        "o": 0,
                    }
                ),
                pd.DataFrame(
                    {
                        "rank": la["rank"],
                        "device": la["device"],
                        "stream": la["stream"],
                        "ts": la["ts"],
                        "d": -1,
                        "o": 1,
                    }
                ),
            ],
            ignore_index=True,
        )
    for c in keys:
        ev[c] = ev[c].fillna(-1).astype(np.int64)
    if "sort_ties" in q:
        # HTA: one pandas quicksort on time per rank over launches-then-device-events, then
        # grouped by stream (the order of equal times is the one that sort leaves)
        ev = ev.sort_values(["o"], kind="stable")
        parts = [g.sort_values("ts") for _, g in ev.groupby("rank", sort=True)]
        ev = pd.concat(parts, ignore_index=True) if parts else ev
        ev = ev.sort_values(keys, kind="stable", ignore_index=True)
    else:
        # at equal times an enqueue comes first (a launch precedes the work it launches)
        ev = ev.sort_values(
            [*keys, "ts", "d"],
            ascending=[*[True] * len(keys), True, False],
            kind="stable",
            ignore_index=True,
        )
    return _queue_summary(ev, keys)


def _queue_events_hta(dw: DeviceWork) -> pd.DataFrame:
    """HTA's queue events: launch calls (by name) that HTA linked to a device event (before
    its step filter), +1 on the stream of their device events; those device events, −1."""
    assert dw.frame is not None
    fr = dw.frame
    linked = fr[fr["gpu_filter"] & (fr["correlation"] != -1)][["part", "correlation"]]
    f = _hta_rows(dw)
    rt = f[~f["dev"] & f["name"].isin(HTA_QUEUE_NAMES)]
    rt = rt.merge(linked.drop_duplicates(), on=["part", "correlation"], how="inner")
    rt = rt.sort_values(["part", "index"], kind="stable")
    gpu = f[f["dev"]].sort_values(["part", "index"], kind="stable")
    rtj = rt[["rank", "part", "ts", "correlation"]].merge(
        gpu[["part", "correlation", "stream", "device"]], on=["part", "correlation"], how="left"
    )
    key = ["part", "correlation"]
    gk = gpu[gpu.set_index(key).index.isin(rt.set_index(key).index)]
    return pd.concat(
        [
            pd.DataFrame(
                {
                    "rank": rtj["rank"],
                    "device": rtj["device"],
                    "stream": rtj["stream"],
                    "ts": rtj["ts"],
                    "d": 1,
                    "o": 0,
                }
            ),
            pd.DataFrame(
                {
                    "rank": gk["rank"],
                    "device": gk["device"],
                    "stream": gk["stream"],
                    "ts": gk["ts"],
                    "d": -1,
                    "o": 1,
                }
            ),
        ],
        ignore_index=True,
    ).dropna(subset=["stream"])


def _queue_summary(ev: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Queue length after each change (rows grouped by ``keys``, in time order within each
    group), HTA's summary of it, and the time-weighted mean and time at the limit."""
    if ev.empty:
        cols = [
            *keys,
            "count",
            "mean",
            "std",
            "min",
            "p25",
            "p50",
            "p75",
            "max",
            "mean_time_weighted",
            "time_at_max_ns",
        ]
        return pd.DataFrame(columns=cols), pd.DataFrame(columns=[*keys, "ts", "queue_length"])
    k = [ev[c].to_numpy() for c in keys]
    new = _group_start(k)
    gid = np.cumsum(new) - 1
    cs = np.cumsum(ev["d"].to_numpy(np.int64))
    base = np.r_[0, cs][np.flatnonzero(new)]  # cumsum before each group
    ql = cs - base[gid]
    ev = ev.assign(queue_length=ql)
    ts = ev["ts"].to_numpy(np.int64)
    last = np.r_[new[1:], True]
    held = np.where(last, 0, np.r_[ts[1:], 0] - ts)  # how long each value holds
    ev["held_ns"] = held
    ev["at_max"] = np.where(ql >= MAX_QUEUE, held, 0)
    ev["weighted"] = ql * held
    g = ev.groupby(keys, sort=True)
    # HTA's summary is pandas' describe(); the same statistics, without a Python call per group
    summ = g["queue_length"].agg(["count", "mean", "std", "min"])
    qs = g["queue_length"].quantile([0.25, 0.5, 0.75]).unstack()
    summ[["p25", "p50", "p75"]] = qs.to_numpy(float)
    summ["max"] = g["queue_length"].max()
    summ = summ.astype(float).reset_index()
    extra = g.agg(
        held=("held_ns", "sum"), w=("weighted", "sum"), time_at_max_ns=("at_max", "sum")
    ).reset_index()
    extra["mean_time_weighted"] = extra["w"] / extra["held"].replace(0, np.nan)
    summ = summ.merge(extra[[*keys, "mean_time_weighted", "time_at_max_ns"]], on=keys)
    summ["count"] = summ["count"].astype(np.int64)
    summ["rank"] = out_rank(summ["rank"])
    if "device" in summ:
        summ["device"] = summ["device"].astype("Int64")
    series = ev[[*keys, "ts", "queue_length"]].copy()
    series["rank"] = out_rank(series["rank"])
    return summ, series


def idle_time(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    streams: Iterable[int] | None = None,
    kernel_wait_ns: int = KERNEL_WAIT_NS,
    runtime_cutoff_ns: int = RUNTIME_CUTOFF_NS,
    launch_delay_cutoff_ns: int = LAUNCH_DELAY_CUTOFF_NS,
    per_event: bool = False,
    hta_compatible: bool | Iterable[str] = False,
) -> Result:
    """Why each device stream is idle, and how work gets to it (see the module docstring).

    Tables:

    * ``breakdown``: per rank, device and stream, one row per ``idle_category`` (host_wait,
      kernel_wait, other) with ``idle_ns`` and ``idle_ratio`` of the stream's idle time;
    * ``launch_summary``: per rank, launches (runtime call → device event pairs), summed
      ``cpu_ns``/``gpu_ns``, launch delay sum, mean, p50, p90 and max, and the counts of
      runtime outliers, launch-delay outliers and short kernels;
    * ``short_kernels``: per rank and kernel name, how many launches took longer on the host
      than the kernel on the device (``count``, ``gpu_ns``, ``cpu_ns``), most frequent first;
    * ``queue_length``: per rank, device and stream, HTA's summary of the queue length
      (``count``, ``mean``, ``std``, ``min``, ``p25``, ``p50``, ``p75``, ``max``) plus
      ``mean_time_weighted`` and ``time_at_max_ns`` (time with ≥ 1024 launches queued);
    * with ``per_event=True`` also ``launches`` (one row per launch) and ``queue_series``
      (every change of a stream's queue length).

    Facts: ``headline`` (:func:`headline`), ``device_events`` (selected), ``launches``
    (runtime call → device event pairs), ``steps`` (the selection applied: ``all``,
    ``drop-last`` or ``list``), ``hta_compatible``.
    """
    dw = device_work(trace, ranks, steps, hta_compatible=hta_compatible)
    res = Result(notes=dw.notes)
    res.tables["breakdown"] = _idle_breakdown(dw, kernel_wait_ns, streams)
    la = _launches(dw)
    if streams is not None:
        la = la[la["stream"].isin([int(s) for s in streams])]
    if not dw.df.empty and la.empty:
        res.notes.append(
            "no device event is linked to the runtime call that launched it (no correlation "
            "ids): host_wait, launch delays, short kernels and queue length cannot be computed"
        )
    elif not dw.df.empty and not dw.df["has_launch"].all() and not dw.quirks:
        n = int((~dw.df["has_launch"]).sum())
        res.notes.append(
            f"{n:,} of {len(dw.df):,} device events have no launching runtime call in the "
            "trace: their gaps are never host_wait, and they have no launch delay"
        )
    res.tables["launch_summary"] = _launch_summary(la, runtime_cutoff_ns, launch_delay_cutoff_ns)
    res.tables["short_kernels"] = _short_kernels(la, runtime_cutoff_ns)
    summ, series = _queue(dw, la)
    res.tables["queue_length"] = summ
    res.facts = {"device_events": len(dw.df), "launches": len(la), "steps": dw.steps,
                 "hta_compatible": dw.hta_compatible}  # fmt: skip
    line = headline(res.tables["breakdown"])
    if line:
        res.facts["headline"] = line
    if per_event:
        la = la.copy()
        la["rank"] = out_rank(la["rank"])
        res.tables["launches"] = la.reset_index(drop=True)
        res.tables["queue_series"] = series
    return res


#: How the headline names each idle category.
IDLE_WORDS = {
    HOST_WAIT: "waiting for the host to queue work",
    KERNEL_WAIT: "in short gaps between queued kernels",
    OTHER_WAIT: "other",
}


def headline(breakdown: pd.DataFrame) -> str | None:
    """The idle time in one sentence: its total over the streams and each category's share,
    largest first (the ``breakdown`` table of :func:`idle_time`); None when no stream idles."""
    t = breakdown
    if not len(t) or not t.idle_ns.sum():
        return None
    by = t.groupby("idle_category").idle_ns.sum().sort_values(ascending=False)
    total = float(by.sum())
    streams = len(t.drop_duplicates(["rank", "device", "stream"]))
    parts = ", ".join(f"{v / total:.0%} {IDLE_WORDS.get(k, k)}" for k, v in by.items() if v)
    return (
        f"Device streams are idle {human_time(total)} in all ({plural(streams, 'stream')}): {parts}"
    )

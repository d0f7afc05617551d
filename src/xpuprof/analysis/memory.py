"""Memory: the allocation timeline of each device, its peak, and what is live at the peak.

Read from the ``[memory]`` allocator events of PyTorch's profiler (``profile_memory=True``);
live allocations are attributed to the op, top op, layer and annotation around them through the
event tree. ``docs/memory.md`` defines the timeline, the peak, the pairing of allocations with
frees and the step selection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.analysis.common import Result, steps_where, trace_start, where_clause
from xpuprof.core.errors import XpuprofError
from xpuprof.core.text import human_bytes, human_time

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.analysis.common import StepSelection
    from xpuprof.trace.trace import Trace

#: c10::DeviceType codes (c10/core/DeviceType.h) → short names.
DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip",
                7: "fpga", 8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps",
                14: "meta", 15: "hpu", 16: "ve", 17: "lazy", 18: "ipu", 19: "mtia",
                20: "privateuseone"}  # fmt: skip

TIMELINE_COLUMNS = ["rank", "part", "device", "ts", "bytes", "total_allocated",
                    "total_reserved", "addr", "event"]  # fmt: skip
PEAK_COLUMNS = ["rank", "part", "device", "device_type", "device_id", "events", "allocs", "frees",
                "peak_allocated", "peak_ts", "reserved_at_peak", "peak_reserved",
                "live_allocations", "live_bytes", "unattributed_bytes",
                "frees_of_earlier_allocations", "bytes_freed_of_earlier_allocations",
                "peak_event"]  # fmt: skip
LIVE_COLUMNS = ["rank", "part", "device", "addr", "bytes", "ts", "age_ns", "op", "top_op",
                "layer", "annotation", "event"]  # fmt: skip
BY_OP_COLUMNS = ["rank", "part", "device", "top_op", "op", "layer", "bytes", "allocations"]


# -- reading the allocator events -------------------------------------------------------------


def _device_filter(device: Any) -> tuple[int | None, int | None]:
    """``device`` → (device type code, device id): None, "cuda", "cuda:1", "cpu", 1."""
    if device is None:
        return None, None
    if isinstance(device, (int, np.integer)):
        return None, int(device)
    s = str(device).strip().lower()
    if s.isdigit():  # an index, as the command line spells it
        return None, int(s)
    kind, _, num = s.partition(":")
    codes = {v: k for k, v in DEVICE_TYPES.items()}
    if kind not in codes or not (num.isdigit() or not num):
        raise XpuprofError(f"device {device!r}: expected e.g. 'cuda', 'cuda:0', 'cpu' or an index")
    return codes[kind], (int(num) if num else None)


def _events(
    trace: Trace, ranks: Iterable[int] | None, steps: StepSelection, device: Any
) -> pd.DataFrame:
    """The ``[memory]`` events of the selected ranks and device in trace order, with a
    ``selected`` column for the step selection."""
    dev_type, dev_id = _device_filter(device)
    df = trace.sql(
        f"""
        select id, part, rank, ts, "index" as idx,
            try_cast(json_extract(args, '$."Device Type"') as bigint) as device_type,
            try_cast(json_extract(args, '$."Device Id"') as bigint) as device_id,
            try_cast(json_extract(args, '$."Addr"') as bigint) as addr,
            try_cast(json_extract(args, '$."Bytes"') as bigint) as bytes,
            try_cast(json_extract(args, '$."Total Allocated"') as bigint) as total_allocated,
            try_cast(json_extract(args, '$."Total Reserved"') as bigint) as total_reserved,
            ({steps_where(steps)}) as selected
        from events where {where_clause(ranks=ranks)} and name = '[memory]'
        order by part, ts, "index"
        """
    )
    if dev_type is not None:
        df = df[df["device_type"] == dev_type]
    if dev_id is not None:
        df = df[df["device_id"] == dev_id]
    return df


def _prepare(df: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    """Drop events without Bytes, name the devices, fill missing totals (running sums)."""
    bad = df["bytes"].isna()
    if bad.any():
        notes.append(f"{int(bad.sum())} [memory] events have no numeric Bytes: left out.")
        df = df[~bad]
    df = df.reset_index(drop=True)
    df["selected"] = df["selected"].fillna(False).astype(bool)
    df["device_type"] = df["device_type"].fillna(-1).astype("int64")
    df["device_id"] = df["device_id"].fillna(-1).astype("int64")
    df["device_kind"] = df["device_type"].map(DEVICE_TYPES).fillna("unknown")
    df["device_name"] = np.where(
        df["device_id"] >= 0,
        df["device_kind"] + ":" + df["device_id"].astype(str),
        df["device_kind"],
    )
    # one group per (source file, device type, device id), in trace order
    df["group"] = df.groupby(["part", "device_type", "device_id"], sort=True).ngroup()
    if df["total_allocated"].isna().any():
        notes.append(
            "some [memory] events have no Total Allocated (older profilers): the running sum "
            "of Bytes per device, from zero at the first event, is used for them, so their "
            "peaks do not include memory already in use when the trace started."
        )
        running = df["bytes"].astype("int64").groupby(df["group"]).cumsum()
        df["total_allocated"] = df["total_allocated"].fillna(running).astype("int64")
    return df


# -- pairing and the live set -----------------------------------------------------------------


def _pairs(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Allocations paired with frees by address, over every event of each device.

    Returns per event: ``addr`` (events without one get an address of their own), ``end``
    (row of an allocation's free; int64 max when never freed), ``freed_before`` (a free of
    memory allocated before the trace); per group: ``no_addr`` (devices whose events lack
    addresses: no live set)."""
    n = len(df)
    g = df["group"].to_numpy()
    has_addr = df["addr"].notna().to_numpy()
    addr = np.where(has_addr, df["addr"].fillna(-1).to_numpy(np.int64), -1 - np.arange(n))
    order = np.arange(n)  # rows are in trace order
    srt = np.lexsort((order, addr, g))
    same_next = np.zeros(n, bool)
    same_next[:-1] = (g[srt][1:] == g[srt][:-1]) & (addr[srt][1:] == addr[srt][:-1])
    nxt = np.full(n, -1, np.int64)
    nxt[srt[:-1][same_next[:-1]]] = srt[1:][same_next[:-1]]
    prv = np.full(n, -1, np.int64)
    prv[srt[1:][same_next[:-1]]] = srt[:-1][same_next[:-1]]
    nbytes = df["bytes"].to_numpy(np.int64)
    is_alloc = nbytes > 0
    return {
        "addr": addr,
        "has_addr": has_addr,
        "end": np.where(is_alloc & (nxt >= 0), nxt, np.iinfo(np.int64).max),
        "freed_before": (nbytes < 0) & ((prv < 0) | ~is_alloc[np.maximum(prv, 0)]),
        "no_addr": pd.Series(~has_addr).groupby(g).any().to_numpy(),
    }


def _attribute(trace: Trace, ranks: Iterable[int] | None, ids: np.ndarray) -> dict[str, Any]:
    """Op, top op, layer and annotation around each event (strict ancestors on its thread)."""
    t = trace.tree(ranks)
    rows = t.rows_of(ids)
    return {
        "op": t.names_of(t.ancestor_at("op", rows, strict=True)),
        "top_op": t.names_of(t.ancestor_at("op", rows, farthest=True, strict=True)),
        "layer": t.names_of(t.ancestor_at("layer", rows, strict=True)),
        "annotation": t.names_of(t.ancestor_at("annotation", rows, strict=True)),
    }


def _live_table(
    df: pd.DataFrame, p: dict[str, np.ndarray], peak_of_group: np.ndarray,
    around: dict[str, Any], live_idx: np.ndarray,
) -> pd.DataFrame:  # fmt: skip
    """One row per allocation live at its device's peak, largest first."""
    g = df["group"].to_numpy()
    ts = df["ts"].to_numpy()
    live = pd.DataFrame(
        {
            "rank": df["rank"].to_numpy()[live_idx],
            "part": df["part"].to_numpy()[live_idx],
            "device": df["device_name"].to_numpy()[live_idx],
            "addr": p["addr"][live_idx],
            "bytes": df["bytes"].to_numpy(np.int64)[live_idx],
            "ts": ts[live_idx],
            "age_ns": ts[peak_of_group[g[live_idx]]] - ts[live_idx],
            **around,
            "event": df["id"].to_numpy()[live_idx],
        }
    )
    live = live.sort_values(["part", "device", "bytes"], ascending=[True, True, False],
                            kind="stable")  # fmt: skip
    return live.reset_index(drop=True)


def _peaks_table(
    df: pd.DataFrame, p: dict[str, np.ndarray], groups: np.ndarray, peak_pos: np.ndarray,
    live: np.ndarray,
) -> pd.DataFrame:  # fmt: skip
    """One row per device group with selected events (``groups``, and their ``peak_pos``)."""
    g = df["group"].to_numpy()
    sel = df["selected"].to_numpy()
    nbytes = df["bytes"].to_numpy(np.int64)
    total = df["total_allocated"].to_numpy(np.int64)

    def per_group(values: np.ndarray, how: str = "sum") -> np.ndarray:
        return pd.Series(values[sel]).groupby(g[sel]).agg(how).reindex(groups).to_numpy()

    first = pd.Series(np.flatnonzero(sel)).groupby(g[sel]).min().reindex(groups).to_numpy()
    live_sum = pd.Series(np.where(live, nbytes, 0)).groupby(g).sum().to_numpy().astype(float)
    live_n = pd.Series(live).groupby(g).sum().to_numpy().astype(float)
    no_addr = p["no_addr"]
    live_sum[no_addr], live_n[no_addr] = np.nan, np.nan
    live_sum, live_n = live_sum[groups], live_n[groups]
    col = {c: df[c].to_numpy()[first] for c in ("rank", "part", "device_type", "device_id")}
    return pd.DataFrame(
        {
            "rank": col["rank"],
            "part": col["part"],
            "device": df["device_name"].to_numpy()[first],
            "device_type": col["device_type"],
            "device_id": col["device_id"],
            "events": per_group(np.ones(len(df), np.int64)),
            "allocs": per_group(nbytes > 0),
            "frees": per_group(nbytes < 0),
            "peak_allocated": total[peak_pos],
            "peak_ts": df["ts"].to_numpy()[peak_pos],
            "reserved_at_peak": df["total_reserved"].to_numpy()[peak_pos],
            "peak_reserved": per_group(df["total_reserved"].to_numpy(), "max"),
            "live_allocations": live_n,
            "live_bytes": live_sum,
            "unattributed_bytes": total[peak_pos] - live_sum,
            "frees_of_earlier_allocations": per_group(p["freed_before"]),
            "bytes_freed_of_earlier_allocations": per_group(np.where(p["freed_before"],
                                                                     -nbytes, 0)),
            "peak_event": df["id"].to_numpy()[peak_pos],
        }
    )  # fmt: skip


def _by_op(live: pd.DataFrame) -> pd.DataFrame:
    """The live set grouped by top op, op and layer, largest first."""
    if not len(live):
        return pd.DataFrame(columns=BY_OP_COLUMNS)
    return (
        live.assign(
            top_op=live["top_op"].fillna("(no op)"),
            op=live["op"].fillna("(no op)"),
            layer=live["layer"].fillna(""),
        )
        .groupby(["rank", "part", "device", "top_op", "op", "layer"], dropna=False)
        .agg(bytes=("bytes", "sum"), allocations=("bytes", "size"))
        .reset_index()
        .sort_values(["part", "device", "bytes"], ascending=[True, True, False])
        .reset_index(drop=True)
    )


def _empty(notes: list[str]) -> Result:
    return Result(
        tables={
            "timeline": pd.DataFrame(columns=TIMELINE_COLUMNS),
            "peaks": pd.DataFrame(columns=PEAK_COLUMNS),
            "live": pd.DataFrame(columns=LIVE_COLUMNS),
            "live_by_op": pd.DataFrame(columns=BY_OP_COLUMNS),
        },
        notes=notes,
    )


# -- the tool ---------------------------------------------------------------------------------


def memory(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    device: Any = None,
) -> Result:
    """Allocation timeline, peak and live set at the peak of each device (``docs/memory.md``).

    ``device``: None (all), a kind (``"cuda"``, ``"cpu"``), ``"cuda:1"`` or a device index.
    Tables: ``timeline`` (every selected ``[memory]`` event: rank, device, ts, bytes, totals,
    addr), ``peaks`` (one row per device), ``live`` (allocations live at each peak, attributed
    to op, top op, layer and annotation) and ``live_by_op`` (the live set grouped by top op,
    op and layer, largest first). Facts: ``headline`` (:func:`headline`), when there is a peak.
    """
    notes: list[str] = []
    ranks = None if ranks is None else [int(r) for r in ranks]
    df = _events(trace, ranks, steps, device)
    what = "" if device is None else f" for device {device!r}"
    if df.empty:
        notes.append(
            f"no [memory] events{what}: the trace was recorded without memory profiling "
            "(torch.profiler profile_memory=True, or xpuprof.profile(level='full')); no "
            "timeline, peak or live set can be computed."
        )
        return _empty(notes)
    df = _prepare(df, notes)
    if not df["selected"].any():
        if len(df):
            notes.append(f"no [memory] events{what} in the selected steps: no timeline or peak.")
        return _empty(notes)
    g = df["group"].to_numpy()
    sel = df["selected"].to_numpy()
    total = df["total_allocated"].to_numpy(np.int64)
    # peak per group: the first maximum among the selected events, in trace order
    peak_of = pd.Series(np.where(sel, total, np.iinfo(np.int64).min)).groupby(g).idxmax()
    groups = np.unique(g[sel])
    peak_pos = peak_of.reindex(groups).to_numpy()
    p = _pairs(df)
    pg = np.full(g.max() + 1, -1, np.int64)
    pg[groups] = peak_pos
    order = np.arange(len(df))
    live = (
        (df["bytes"].to_numpy() > 0) & p["has_addr"] & (pg[g] >= 0) & (order <= pg[g])
        & (p["end"] > pg[g]) & ~p["no_addr"][g]
    )  # fmt: skip
    live_idx = np.flatnonzero(live)
    around = _attribute(trace, ranks, df["id"].to_numpy()[live_idx])
    live_df = _live_table(df, p, pg, around, live_idx)
    peaks = _peaks_table(df, p, groups, peak_pos, live)
    timeline = df[sel][["rank", "part", "device_name", "ts", "bytes", "total_allocated",
                        "total_reserved", "addr", "id"]]  # fmt: skip
    timeline = timeline.rename(columns={"device_name": "device", "id": "event"})
    if p["no_addr"][groups].any():
        notes.append(
            "[memory] events without Addr (older profilers): their device's timeline and peak "
            "are reported, but allocations cannot be paired with frees, so its live set is "
            "unknown (live_bytes is left empty)."
        )
    if (peaks["unattributed_bytes"] > 0).any():
        notes.append(
            "part of the memory live at some peaks was allocated before the trace started "
            "(unattributed_bytes: Total Allocated at the peak minus the live allocations the "
            "trace records); it cannot be attributed to an op."
        )
    t = trace.tree(ranks)
    if not (t.is_level("layer") & np.isin(t.part, df["part"].unique())).any():
        notes.append(
            "no layer spans in the trace (record with xpuprof.profile(level='layer' or deeper) "
            "or torch.profiler with_modules): live memory is attributed to ops only."
        )
    by_op = _by_op(live_df)
    line = headline(peaks, by_op, trace_start(trace))
    return Result(
        tables={"timeline": timeline.reset_index(drop=True), "peaks": peaks, "live": live_df,
                "live_by_op": by_op},
        notes=notes,
        facts={"headline": line} if line else {},
    )  # fmt: skip


def headline(peaks: pd.DataFrame, by_op: pd.DataFrame, start: int | None) -> str | None:
    """The memory in one sentence: the highest peak of allocated memory, its device, rank and
    time from ``start`` (the trace's first event), and the op under which the most is live
    at it (the ``peaks`` and ``live_by_op`` tables of :func:`memory`); None without a peak."""
    if not len(peaks) or peaks.peak_allocated.isna().all():
        return None
    top = peaks.loc[peaks.peak_allocated.idxmax()]
    on = "" if pd.isna(top["rank"]) else f" on rank {int(top['rank'])}"
    when = (f" at {human_time(top.peak_ts - start)} into the trace"
            if start is not None and top.peak_ts == top.peak_ts else "")  # fmt: skip
    line = f"Peak memory {human_bytes(top.peak_allocated)} allocated on {top.device}{on}{when}"
    same = by_op[(by_op.device == top.device) & (by_op.part == top.part)]
    if len(same):
        big = same.loc[same.bytes.idxmax()]
        line += f"; the most live at the peak under {big.top_op} ({human_bytes(big.bytes)})"
    return line


#: The name the CLI and earlier releases use.
memory_timeline = memory

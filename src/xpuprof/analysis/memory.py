"""Memory: the allocation timeline of each device, its peak, and what is live at the peak.

Source: the ``[memory]`` instant events PyTorch's profiler writes with ``profile_memory=True``
(category ``cpu_instant_event``), one per allocator call, with args ``Device Type`` (c10's
``DeviceType``: 0 CPU, 1 CUDA — ROCm builds report HIP memory as CUDA too —, 12 XPU, 13 MPS,
19 MTIA, 20 PrivateUse1, …), ``Device Id`` (−1 for the CPU), ``Addr``, ``Bytes`` (positive =
allocation, negative = free), ``Total Allocated`` and ``Total Reserved`` (the caching
allocator's own counters *after* the call).

Rules:

* **Timeline**: every event of a device (source file × device type × device id) in trace order
  (``ts``, then position in the file), with the allocator's totals. When a source has no
  ``Total Allocated`` the running sum of ``Bytes`` is used instead (and a note says so).
* **Peak**: the first event where ``Total Allocated`` reaches its maximum; ``Total Reserved`` at
  that moment and its own maximum are reported beside it.
* **Live at the peak**: allocations made at or before the peak event and not freed before it.
  An allocation is matched to its free by address: the caching allocator hands an address out
  again only after it was freed, so at one address events alternate alloc, free, alloc, …; an
  allocation's free is the next event at its address when that is a free (negative ``Bytes``).
  Two allocations in a row at one address (a free the profiler did not record) end the first at
  the second. A free with no allocation before it at its address was allocated before the trace
  started: such memory is live at the peak without being attributable, so each peak also reports
  ``unattributed_bytes`` = ``Total Allocated`` at the peak − the live bytes the trace explains.
* **Attribution**: the event's enclosing spans on its own thread (``parent`` chain): ``op`` is
  the innermost framework op (usually ``aten::empty``/``empty_strided``), ``top_op`` the
  outermost (``aten::linear``, an autograd node), ``layer`` the innermost model layer
  (``xpuprof`` layer spans, ``nn.Module`` python events), ``annotation`` the innermost user
  annotation. Allocations made on autograd threads have no layer in their own thread's chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.analysis.common import Result

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: c10::DeviceType codes (c10/core/DeviceType.h) → short names.
DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip",
                7: "fpga", 8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps",
                14: "meta", 15: "hpu", 16: "ve", 17: "lazy", 18: "ipu", 19: "mtia",
                20: "privateuseone"}  # fmt: skip


# -- parent-chain helpers (shared with roofline and comm) ------------------------------------


def parent_rows(ids: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each row's parent as a row position (−1 when it has none or it is not in ``ids``)."""
    ids = np.asarray(ids, np.int64)
    par = np.asarray(parent, np.int64)
    if not len(ids):
        return np.full(len(par), -1, np.int64)
    order = np.argsort(ids, kind="stable")
    sid = ids[order]
    pos = np.clip(np.searchsorted(sid, par), 0, len(ids) - 1)
    return np.where((par >= 0) & (sid[pos] == par), order[pos], -1)


def rows_of(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row positions of ``wanted`` event ids in ``ids`` (−1 when absent)."""
    ids = np.asarray(ids, np.int64)
    wanted = np.asarray(wanted, np.int64)
    if not len(ids):
        return np.full(len(wanted), -1, np.int64)
    order = np.argsort(ids, kind="stable")
    sid = ids[order]
    pos = np.clip(np.searchsorted(sid, wanted), 0, len(ids) - 1)
    return np.where(sid[pos] == wanted, order[pos], -1)


def ancestor(
    par: np.ndarray,
    start: np.ndarray,
    target: np.ndarray,
    *,
    outermost: bool = False,
    include_self: bool = False,
    max_depth: int = 512,
) -> np.ndarray:
    """For each start row, the nearest (or with ``outermost`` the farthest) ancestor row where
    ``target`` is true; −1 when there is none. One vectorized step per nesting level."""
    start = np.asarray(start, np.int64)
    out = np.full(len(start), -1, np.int64)
    cur = start.copy() if include_self else np.where(start >= 0, par[np.maximum(start, 0)], -1)
    idx = np.flatnonzero(cur >= 0)
    cur = cur[idx]
    for _ in range(max_depth):
        if not len(idx):
            break
        hit = target[cur]
        out[idx[hit]] = cur[hit]
        if not outermost:
            keep = ~hit
            idx, cur = idx[keep], cur[keep]
        cur = par[cur]
        live = cur >= 0
        idx, cur = idx[live], cur[live]
    return out


def host_tree(
    trace: Trace, parts: list[int] | None = None, columns: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Host-side events (device −1) of the given parts: ids, parent rows, level and name codes,
    with the dictionaries to decode them — enough to walk any event's ancestry — plus the
    requested extra ``columns`` as numpy arrays (nulls: −1 for ids/ints, NaN for floats)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    base = ["id", "part", "parent", "level", "name", "device"]
    t = trace.table("events", columns=base + [c for c in columns if c not in base])
    mask = pc.equal(t["device"], -1)
    if parts is not None:
        mask = pc.and_(mask, pc.is_in(t["part"], pa.array(parts, pa.int32())))
    t = t.filter(mask)
    ids = t["id"].to_numpy()
    par = t["parent"].fill_null(-1).to_numpy()

    def codes(col: Any) -> tuple[np.ndarray, np.ndarray]:
        c = col.combine_chunks() if hasattr(col, "combine_chunks") else col
        if not pa.types.is_dictionary(c.type):
            c = c.dictionary_encode()
        idx = c.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        return idx, np.asarray(c.dictionary.to_pylist(), dtype=object)

    lv, lv_dict = codes(t["level"])
    nm, nm_dict = codes(t["name"])
    out: dict[str, Any] = {
        "id": ids,
        "par": parent_rows(ids, par),
        "level": lv,
        "level_dict": lv_dict,
        "name": nm,
        "name_dict": nm_dict,
        "part": t["part"].to_numpy(),
    }
    for c in columns:
        col = t[c]
        if pa.types.is_floating(col.type):
            out[c] = col.to_numpy(zero_copy_only=False)
        elif pa.types.is_integer(col.type):
            out[c] = col.fill_null(-1).to_numpy()
        else:
            out[c] = np.asarray(col.to_pylist(), dtype=object)
    return out


def level_mask(tree: dict[str, np.ndarray], *levels: str) -> np.ndarray:
    want = [i for i, v in enumerate(tree["level_dict"]) if v in levels]
    return np.isin(tree["level"], want)


def names_of(tree: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Names of the given rows (None for −1)."""
    out = np.full(len(rows), None, dtype=object)
    ok = rows >= 0
    codes = tree["name"][rows[ok]]
    vals = np.where(codes >= 0, tree["name_dict"][np.maximum(codes, 0)], None)
    out[ok] = vals
    return out


# -- the tool --------------------------------------------------------------------------------


def _device_filter(device: Any) -> tuple[int | None, int | None]:
    """``device`` → (device type code, device id): None, "cuda", "cuda:1", "cpu", 1."""
    if device is None:
        return None, None
    if isinstance(device, (int, np.integer)):
        return None, int(device)
    s = str(device).strip().lower()
    kind, _, num = s.partition(":")
    codes = {v: k for k, v in DEVICE_TYPES.items()}
    if kind not in codes:
        raise ValueError(f"device {device!r}: expected e.g. 'cuda', 'cuda:0', 'cpu' or an index")
    return codes[kind], (int(num) if num else None)


def memory_timeline(trace: Trace, device: Any = None, *, ranks: list[int] | None = None) -> Result:
    """Allocation timeline, peak and live set at the peak of each device (module docstring).

    Tables: ``timeline`` (every ``[memory]`` event: rank, device, ts, bytes, totals, addr),
    ``peaks`` (one row per device), ``live`` (allocations live at each peak, attributed to op,
    top op, layer and annotation) and ``live_by_op`` (the live set grouped by top op, op and
    layer, largest first).
    """
    from xpuprof.analysis.common import where_clause

    res = Result()
    dev_type, dev_id = _device_filter(device)
    conds = [where_clause(ranks=ranks), "name = '[memory]'"]
    df = trace.sql(
        f"""
        select id, part, rank, ts, "index" as idx,
            try_cast(json_extract(args, '$."Device Type"') as bigint) as device_type,
            try_cast(json_extract(args, '$."Device Id"') as bigint) as device_id,
            try_cast(json_extract(args, '$."Addr"') as bigint) as addr,
            try_cast(json_extract(args, '$."Bytes"') as bigint) as bytes,
            try_cast(json_extract(args, '$."Total Allocated"') as bigint) as total_allocated,
            try_cast(json_extract(args, '$."Total Reserved"') as bigint) as total_reserved
        from events where {" and ".join(conds)}
        order by part, ts, "index"
        """
    )
    if dev_type is not None:
        df = df[df["device_type"] == dev_type]
    if dev_id is not None:
        df = df[df["device_id"] == dev_id]
    empty_tables(res)
    if df.empty:
        res.notes.append(
            "no [memory] events"
            + (f" for device {device!r}" if device is not None else "")
            + ": the trace was recorded without memory profiling (torch.profiler "
            "profile_memory=True, or xpuprof.profile(level='full')); no timeline, peak or live "
            "set can be computed."
        )
        return res
    bad = df["bytes"].isna()
    if bad.any():
        res.notes.append(f"{int(bad.sum())} [memory] events have no numeric Bytes: left out.")
        df = df[~bad]
    df = df.reset_index(drop=True)
    df["device_type"] = df["device_type"].fillna(-1).astype("int64")
    df["device_id"] = df["device_id"].fillna(-1).astype("int64")
    df["device_kind"] = df["device_type"].map(DEVICE_TYPES).fillna("unknown")
    df["device_name"] = np.where(
        df["device_id"] >= 0,
        df["device_kind"] + ":" + df["device_id"].astype(str),
        df["device_kind"],
    )
    # one group per (source file, device type, device id), in trace order
    g = df.groupby(["part", "device_type", "device_id"], sort=True).ngroup().to_numpy()
    n = len(df)
    order = np.arange(n)  # already sorted by part, ts, index
    nbytes = df["bytes"].to_numpy(np.int64)
    if df["total_allocated"].isna().any():
        res.notes.append(
            "some [memory] events have no Total Allocated (older profilers): the running sum "
            "of Bytes per device, from zero at the first event, is used for them, so their "
            "peaks do not include memory already in use when the trace started."
        )
        running = pd.Series(nbytes).groupby(g).cumsum().to_numpy()
        df["total_allocated"] = df["total_allocated"].fillna(pd.Series(running)).astype("int64")
    total = df["total_allocated"].to_numpy(np.int64)

    # peak per group: first maximum in trace order
    gs = pd.Series(total).groupby(g)
    peak_pos = gs.idxmax().to_numpy()  # first occurrence of the maximum within each group

    # pair allocations with frees by address
    # events without an address (2021 traces) count in the totals but cannot be paired: each
    # gets an address of its own, and devices with such events get no live set
    has_addr = df["addr"].notna().to_numpy()
    addr = df["addr"].fillna(-1).to_numpy(np.int64)
    addr = np.where(has_addr, addr, -1 - np.arange(n))
    no_addr_group = pd.Series(~has_addr).groupby(g).any().to_numpy()
    srt = np.lexsort((order, addr, g))
    same_next = np.zeros(n, bool)
    same_next[:-1] = (g[srt][1:] == g[srt][:-1]) & (addr[srt][1:] == addr[srt][:-1])
    same_prev = np.zeros(n, bool)
    same_prev[1:] = same_next[:-1]
    nxt = np.full(n, -1, np.int64)
    nxt[srt[:-1][same_next[:-1]]] = srt[1:][same_next[:-1]]
    prv = np.full(n, -1, np.int64)
    prv[srt[1:][same_prev[1:]]] = srt[:-1][same_prev[1:]]
    is_alloc = nbytes > 0
    is_free = nbytes < 0
    end = np.where(is_alloc & (nxt >= 0), nxt, np.iinfo(np.int64).max)  # row of its free
    freed_before = is_free & ((prv < 0) | ~is_alloc[np.maximum(prv, 0)])
    unmatched_free = pd.Series(freed_before).groupby(g).sum().to_numpy()
    unmatched_free_bytes = pd.Series(np.where(freed_before, -nbytes, 0)).groupby(g).sum()

    pg = peak_pos[g]  # each row's group peak position
    live = is_alloc & has_addr & (order <= pg) & (end > pg) & ~no_addr_group[g]

    # attribution of live allocations
    live_idx = np.flatnonzero(live)
    parts = sorted(int(p) for p in df["part"].unique())
    tree = host_tree(trace, parts)
    ev_rows = rows_of(tree["id"], df["id"].to_numpy()[live_idx])
    op_mask = level_mask(tree, "op")
    op_row = ancestor(tree["par"], ev_rows, op_mask)
    top_row = ancestor(tree["par"], ev_rows, op_mask, outermost=True)
    layer_row = ancestor(tree["par"], ev_rows, level_mask(tree, "layer"))
    ann_row = ancestor(tree["par"], ev_rows, level_mask(tree, "annotation"))
    peak_ts = df["ts"].to_numpy()[peak_pos]
    live_df = pd.DataFrame(
        {
            "rank": df["rank"].to_numpy()[live_idx],
            "part": df["part"].to_numpy()[live_idx],
            "device": df["device_name"].to_numpy()[live_idx],
            "addr": addr[live_idx],
            "bytes": nbytes[live_idx],
            "ts": df["ts"].to_numpy()[live_idx],
            "age_ns": peak_ts[g[live_idx]] - df["ts"].to_numpy()[live_idx],
            "op": names_of(tree, op_row),
            "top_op": names_of(tree, top_row),
            "layer": names_of(tree, layer_row),
            "annotation": names_of(tree, ann_row),
            "event": df["id"].to_numpy()[live_idx],
        }
    ).sort_values(["part", "device", "bytes"], ascending=[True, True, False], kind="stable")
    res.tables["live"] = live_df.reset_index(drop=True)

    live_sum = pd.Series(np.where(live, nbytes, 0)).groupby(g).sum().to_numpy().astype(float)
    live_sum[no_addr_group] = np.nan
    if no_addr_group.any():
        res.notes.append(
            "[memory] events without Addr (older profilers): their device's timeline and peak "
            "are reported, but allocations cannot be paired with frees, so its live set is "
            "unknown (live_bytes NaN)."
        )
    first = pd.Series(order).groupby(g).min().to_numpy()
    reserved = df["total_reserved"]
    peaks = pd.DataFrame(
        {
            "rank": df["rank"].to_numpy()[first],
            "part": df["part"].to_numpy()[first],
            "device": df["device_name"].to_numpy()[first],
            "device_type": df["device_type"].to_numpy()[first],
            "device_id": df["device_id"].to_numpy()[first],
            "events": pd.Series(order).groupby(g).size().to_numpy(),
            "allocs": pd.Series(is_alloc).groupby(g).sum().to_numpy(),
            "frees": pd.Series(is_free).groupby(g).sum().to_numpy(),
            "peak_allocated": total[peak_pos],
            "peak_ts": peak_ts,
            "reserved_at_peak": reserved.to_numpy()[peak_pos],
            "peak_reserved": reserved.groupby(g).max().to_numpy(),
            "live_allocations": np.where(
                no_addr_group, np.nan, pd.Series(live).groupby(g).sum().to_numpy()
            ),
            "live_bytes": live_sum,
            "unattributed_bytes": total[peak_pos] - live_sum,
            "frees_of_earlier_allocations": unmatched_free,
            "bytes_freed_of_earlier_allocations": unmatched_free_bytes.to_numpy(),
            "peak_event": df["id"].to_numpy()[peak_pos],
        }
    )
    res.tables["peaks"] = peaks
    res.tables["timeline"] = df[
        ["rank", "part", "device_name", "ts", "bytes", "total_allocated", "total_reserved",
         "addr", "id"]
    ].rename(columns={"device_name": "device", "id": "event"})  # fmt: skip

    if len(live_df):
        by = (
            live_df.assign(
                top_op=live_df["top_op"].fillna("(no op)"),
                op=live_df["op"].fillna("(no op)"),
                layer=live_df["layer"].fillna(""),
            )
            .groupby(["rank", "part", "device", "top_op", "op", "layer"], dropna=False)
            .agg(bytes=("bytes", "sum"), allocations=("bytes", "size"))
            .reset_index()
            .sort_values(["part", "device", "bytes"], ascending=[True, True, False])
            .reset_index(drop=True)
        )
        res.tables["live_by_op"] = by
    if (peaks["unattributed_bytes"] > 0).any():
        res.notes.append(
            "part of the memory live at some peaks was allocated before the trace started "
            "(unattributed_bytes: Total Allocated at the peak minus the live allocations the "
            "trace records); it cannot be attributed to an op."
        )
    if not level_mask(tree, "layer").any():
        res.notes.append(
            "no layer spans in the trace (record with xpuprof.profile(level='layer' or deeper) "
            "or torch.profiler with_modules): live memory is attributed to ops only."
        )
    return res


def empty_tables(res: Result) -> None:
    res.tables["timeline"] = pd.DataFrame(
        columns=[
            "rank",
            "part",
            "device",
            "ts",
            "bytes",
            "total_allocated",
            "total_reserved",
            "addr",
            "event",
        ]
    )
    res.tables["peaks"] = pd.DataFrame(
        columns=[
            "rank",
            "part",
            "device",
            "device_type",
            "device_id",
            "events",
            "allocs",
            "frees",
            "peak_allocated",
            "peak_ts",
            "reserved_at_peak",
            "peak_reserved",
            "live_allocations",
            "live_bytes",
            "unattributed_bytes",
            "frees_of_earlier_allocations",
            "bytes_freed_of_earlier_allocations",
            "peak_event",
        ]
    )
    res.tables["live"] = pd.DataFrame(
        columns=[
            "rank",
            "part",
            "device",
            "addr",
            "bytes",
            "ts",
            "age_ns",
            "op",
            "top_op",
            "layer",
            "annotation",
            "event",
        ]
    )
    res.tables["live_by_op"] = pd.DataFrame(
        columns=["rank", "part", "device", "top_op", "op", "layer", "bytes", "allocations"]
    )

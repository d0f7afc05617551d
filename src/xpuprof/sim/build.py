"""Building a :class:`~xpuprof.sim.graph.ReplayGraph` from the store: four scans (host
events, device work, ``cuda_sync`` events, ``fwdbwd`` flows) for all parts, then numpy per
part; the synchronisation rules are the critical-path graph's (``trace/graph_build.py``
helpers); collectives across parts are matched in ``sim/collectives.py``. The edge kinds and
delays are defined in ``sim/graph.py`` and ``docs/replay.md``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.core.names import DEVICE_LEVELS
from xpuprof.sim.collectives import add_collectives
from xpuprof.sim.graph import (
    DEVICE,
    DEVICE_COMMUNICATION,
    DEVICE_END,
    DEVICE_START,
    DEVICE_WORK,
    FWDBWD,
    HANDOFF,
    HOST,
    HOST_END,
    HOST_GAP,
    HOST_START,
    HOST_WORK,
    LAUNCH,
    STREAM_ORDER,
    STREAM_WAIT_EVENT,
    SYNC,
    Builder,
    ReplayGraph,
)
from xpuprof.trace import graph_build as gb
from xpuprof.trace.graph import WHOLE_TRACE

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

HOST_LEVELS = ("step", "annotation", "op", "runtime")
HOST_SQL = (
    "select part, id, parent, pid, tid, ts, dur, depth, correlation, level, "
    "level = 'runtime' as is_runtime, level in ('op', 'runtime') as is_op, "
    "coalesce(name = 'cudaEventRecord', false) as is_record, "
    f"coalesce(name in {gb.BLOCKING_CALLS}, false) as is_blocking, "
    "coalesce(contains(lower(name), 'synchronize'), false) as is_synchronize, "
    "coalesce(contains(lower(name), 'memcpy'), false) as is_copy_call, "
    "coalesce(contains(name, 'StreamWaitEvent'), false) as is_stream_wait, "
    "coalesce(starts_with(name, 'c10d::'), false) as is_c10d "
    "from events where part in ({parts}) and device < 0 and dur is not null and dur >= 0 "
    f"and level in {HOST_LEVELS} order by id"
)
DEVICE_SQL = (
    "select part, id, device, stream, ts as t, dur, correlation, level, "
    "level = 'collective' or coalesce(contains(lower(name), 'nccl') "
    "or contains(lower(name), 'rccl'), false) as comm, "
    "coalesce(name = 'event_wait', false) as is_event_wait "
    f"from events where part in ({{parts}}) and dur is not null and level in {DEVICE_LEVELS} "
    "order by part, device, stream, t, id"
)
_FWDBWD_SQL = (
    "select s.part, s.event as src, f.event as dst from flows s join flows f "
    "on s.part = f.part and s.flow_id = f.flow_id and s.category = f.category "
    "where s.part in ({parts}) and lower(s.category) = 'fwdbwd' and s.phase = 's' "
    "and f.phase = 'f' and s.event is not null and f.event is not null"
)


def build(
    trace: Trace,
    parts: list[int] | None = None,
    windows: dict[int, tuple[int, int]] | None = None,
    align: str = "auto",
    plan: tuple[int, pd.DataFrame] | None = None,
    fetched: tuple[pd.DataFrame, ...] | None = None,
) -> ReplayGraph:
    """The replay graph of ``parts`` (default: all) over host events starting in each part's
    window (inclusive ns, the part's own clock; absent: all) and the device work they launched
    (device work without a launch: starting in the window): ``graph.replay_graph``. ``plan``:
    (clock offset, matched collectives) of the one part in ``parts``, planned over the whole
    job (``sim/job_parts.py``), instead of matching the collectives among ``parts``.
    ``fetched``: :func:`fetch_parts` of parts that include ``parts`` (a task building the
    graphs of a group of parts one by one queries the store once for them all)."""
    ranks = {int(s["part"]): s.get("rank") for s in trace.sources}
    parts = sorted(ranks) if parts is None else sorted(int(p) for p in parts)
    windows = windows or {}
    host_all, dev_all, sync_all, fb_all = fetched or fetch_parts(trace, parts)
    b = Builder()
    from xpuprof.analysis.comm.host import host_collective_ids

    hc = host_collective_ids(trace)
    for p in parts:
        _add_part(b, p, _rows(host_all, p), _rows(dev_all, p), _rows(sync_all, p),
                  _rows(fb_all, p), windows.get(p, WHOLE_TRACE),
                  hc.loc[hc["part"] == p, "id"].to_numpy(np.int64))  # fmt: skip
    if plan is not None:
        from xpuprof.sim.collectives import add_planned

        add_planned(b, plan[1])
        offsets = {p: plan[0] for p in parts}
    else:
        offsets = add_collectives(b, trace, parts, align)
    return b.finish(tuple(parts), {p: ranks.get(p) for p in parts}, offsets)


def fetch_parts(trace: Trace, parts: list[int]) -> tuple[pd.DataFrame, ...]:
    """The rows :func:`build` reads of ``parts``: host events, device work, synchronisations,
    forward/backward links."""
    sql = ", ".join(map(str, parts)) or "null"
    return tuple(gb.fetch(trace, q.replace("{parts}", sql))
                 for q in (HOST_SQL, DEVICE_SQL, gb.SYNC_QUERY, _FWDBWD_SQL))  # fmt: skip


def _rows(df: pd.DataFrame, part: int) -> pd.DataFrame:
    if df.empty:
        return df
    return df[df["part"].to_numpy() == part].reset_index(drop=True)


# -- one part ------------------------------------------------------------------------------------


def _add_part(b: Builder, part: int, h: pd.DataFrame, d: pd.DataFrame, s: pd.DataFrame,
              fb: pd.DataFrame, window: tuple[int, int],
              host_coll: np.ndarray | None = None) -> None:  # fmt: skip
    lo, hi = window
    if h.empty and d.empty:
        b.notes.append(f"part {part}: no host or device events to replay")
        return
    ts, dur = gb.i64(h.ts), gb.i64(h.dur)
    in_win = (ts >= lo) & (ts <= hi)
    ids = gb.i64(h.id)
    host = gb.HostCalls(
        id=ids, pid=gb.i64(h.pid), tid=gb.i64(h.tid), ts=ts, end=ts + dur,
        depth=gb.i64(h.depth), correlation=gb.i64(h.correlation),
        is_runtime=h.is_runtime.to_numpy(bool), is_record=h.is_record.to_numpy(bool),
        is_blocking=h.is_blocking.to_numpy(bool), in_graph=in_win,
        graph_parent=gb.nearest_graph_ancestor(ids, gb.i64(h.parent), in_win),
    )  # fmt: skip
    # host nodes: start and end of each in-window host event, thread by thread
    rows = np.flatnonzero(in_win)
    hs = _host_nodes(b, part, host, rows, h.level.isin(("step", "annotation")).to_numpy())
    # device work: launched by an in-window call, or (no launch) starting in the window
    call_of = gb.first_runtime_call(host) if len(h) else pd.Series(dtype=np.int64)
    call = gb.i64(d.correlation.map(call_of)) if len(d) else np.empty(0, np.int64)
    t = gb.i64(d.t) if len(d) else np.empty(0, np.int64)
    keep = np.where(call >= 0, in_win[np.maximum(call, 0)] if len(h) else False,
                    (t >= lo) & (t <= hi))  # fmt: skip
    d, call = _lanes(d[keep].reset_index(drop=True), call[keep])
    if d.empty:
        b.notes.append(f"part {part}: no device events: the host side is replayed alone")
    ds = _device_nodes(b, part, d)
    launched = np.flatnonzero(call >= 0)
    # a launch is submitted when its call returns, if the work started only after that (a
    # long call: lazy module loading, a pageable copy staged by the host), else at its start
    after = gb.i64(d.t)[launched] >= host.end[call[launched]]
    l_src = np.where(after, hs["end"][call[launched]], hs["start"][call[launched]])
    l_dst = ds["start"][launched]
    work = gb.launched_work(d, host, call_of) if len(launched) else pd.DataFrame()
    if len(work):
        work["submit_ts"] = np.where(after, host.end[call[launched]], work.call_ts.to_numpy())
    sync_src, sync_dst, sw_src, sw_dst = _syncs(b, part, h, s, host, call_of, work,
                                                ds["start"][launched], hs)  # fmt: skip
    f_src, f_dst = _fwdbwd(fb, ids, hs)
    h_src, h_dst = _handoffs(hs["points"])
    if len(h_src):
        b.notes.append(f"part {part}: {len(h_src)} hand-offs between host threads inferred (a "
                       "thread that resumes after an idle gap right after another thread of its "
                       "process ends an event: the autograd thread and the main thread, a "
                       "worker and its caller)")  # fmt: skip
    # typical delays of this part (medians of clean observations)
    typ = _typical(b, part, work, d, ds, launched, sync_src, sync_dst, host.end)
    if s.empty and len(work):
        w_src, w_dst = _inferred_stream_waits(b, part, h, host, work, ds, launched, typ)
        sw_src, sw_dst = np.r_[sw_src, w_src], np.r_[sw_dst, w_dst]
    b.add_edges(l_src, l_dst, LAUNCH, typ["launch_ns"], False)
    b.add_edges(sync_src, sync_dst, SYNC, typ["wake_ns"], False)
    b.add_edges(sw_src, sw_dst, STREAM_WAIT_EVENT, 0, False)
    b.add_edges(f_src, f_dst, FWDBWD, 0, False)
    b.add_edges(h_src, h_dst, HANDOFF, 0, False)
    b.add_edges(ds["gap_src"], ds["gap_dst"], STREAM_ORDER, typ["queue_gap_ns"], True)
    ew = d.is_event_wait.to_numpy(bool) if len(d) else np.empty(0, bool)
    b.unmodel(part, "stream wait", gb.i64(d.id)[ew] if len(d) else ew, "a device-side "
              "event_wait (MTIA): the event it waits for is not identified in the trace, so the "
              "wait runs as measured")  # fmt: skip
    long = np.flatnonzero(call < 0)
    if len(long) and len(launched):
        b.notes.append(f"part {part}: {len(long)} device events have no launch in the trace: "
                       "they follow their stream's order only")  # fmt: skip
    _collective_nodes(b, part, d, ds, h, host, hs, host_coll)


def _collective_nodes(
    b: Builder, part: int, d: pd.DataFrame, ds: dict, h: pd.DataFrame, host: gb.HostCalls,
    hs: dict, host_coll: np.ndarray | None,
) -> None:  # fmt: skip
    """The part's collectives for ``sim/collectives.py`` to match across parts
    (``b.coll_nodes``: id, start node, end node, measured duration, on the host or not):
    its collective kernels, then its host collectives (:func:`_host_collectives`) with
    their hand-off edges."""
    comm = d.comm.to_numpy(bool) if len(d) else np.empty(0, bool)
    dev_coll = pd.DataFrame(
        {
            "id": gb.i64(d.id)[comm] if len(d) else np.empty(0, np.int64),
            "start": ds["start"][comm],
            "end": ds["start"][comm] + 1,
            "dur": ds["dur"][comm],
            "host": False,
        }
    )
    hcoll, w_src, w_dst = _host_collectives(host, h, hs, host_coll)
    b.add_edges(w_src, w_dst, HANDOFF, 0, False)
    if len(w_src):
        b.notes.append(f"part {part}: {len(w_src)} hand-offs between gloo's collective spans "
                       "and the thread that enqueued each (its c10d op's start → the span's "
                       "start; its end → the thread's resumption from its wait)")  # fmt: skip
    b.coll_nodes[part] = pd.concat([dev_coll, hcoll], ignore_index=True) if len(hcoll) else dev_coll


def _host_collectives(
    host: gb.HostCalls, h: pd.DataFrame, hs: dict, ids: np.ndarray | None
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The part's host collectives (``analysis.comm.host``: gloo's spans on its worker
    threads, else the ``c10d::`` ops of a synchronous backend) that are replayed, as
    collective nodes (id, start node, end node, measured duration), and hand-off edges
    between each gloo span and its caller, the last ``c10d::`` op its process started on
    another thread before the span (the op that enqueued it; with several collectives in
    flight, possibly a later one's: a constraint the trace respects, looser than the truth
    only in a what-if): the op's start → the span's start (a worker cannot take work before
    it is enqueued), and the span's end → the caller's next start, when the caller was idle
    at the span's end (waiting in ``Work.wait()``, which the trace does not record) and
    resumed within :data:`HANDOFF_NS` — whatever the gap, unlike :func:`_handoffs`."""
    e = np.empty(0, np.int64)
    empty = pd.DataFrame({"id": e, "start": e, "end": e, "dur": e, "host": e.astype(bool)})
    if ids is None or not len(ids) or not len(host.id):
        return empty, e, e
    row = np.flatnonzero(np.isin(host.id, ids) & host.in_graph)
    row = row[(hs["start"][row] >= 0) & (hs["end"][row] >= 0)]
    if not len(row):
        return empty, e, e
    coll = pd.DataFrame({"id": host.id[row], "start": hs["start"][row], "end": hs["end"][row],
                         "dur": host.end[row] - host.ts[row], "host": True})  # fmt: skip
    src, dst = [], []
    pts = hs["points"]
    c10d = np.flatnonzero(h.is_c10d.to_numpy(bool))
    c10d = c10d[np.argsort(host.ts[c10d], kind="stable")]
    spans = row[~h.is_c10d.to_numpy(bool)[row]]  # gloo's worker spans, not c10d calls
    threads: dict[tuple[int, int], np.ndarray] = {}  # (pid, tid) -> its points, once
    if pts is not None and len(c10d):
        for r in spans.tolist():
            mine = c10d[(host.pid[c10d] == host.pid[r]) & (host.tid[c10d] != host.tid[r])]
            k = np.searchsorted(host.ts[mine], host.ts[r], side="right") - 1
            if k < 0:
                continue
            if hs["start"][mine[k]] >= 0:
                src.append(hs["start"][mine[k]])
                dst.append(hs["start"][r])
            tid, end = host.tid[mine[k]], host.end[r]
            key = (int(host.pid[r]), int(tid))
            if key not in threads:
                threads[key] = np.flatnonzero((pts["pid"] == key[0]) & (pts["tid"] == key[1]))
            on = threads[key]
            j = np.searchsorted(pts["time"][on], end, side="left")
            if j >= len(on) or j == 0:
                continue
            nxt, prev = on[j], on[j - 1]
            if (pts["is_start"][nxt] and not pts["is_start"][prev]
                    and pts["time"][nxt] - end <= HANDOFF_NS):  # fmt: skip
                src.append(hs["end"][r])
                dst.append(pts["node"][nxt])
    return coll, np.asarray(src, np.int64), np.asarray(dst, np.int64)


def _host_nodes(b: Builder, part: int, host: gb.HostCalls, rows: np.ndarray,
                is_span: np.ndarray) -> dict:  # fmt: skip
    """Start and end nodes of the host events ``rows``, thread by thread in time order (at
    equal times ends first, inner ends before outer ones, then zero-length events, then
    starts, outer before inner)."""
    start_of = np.full(len(host.id), -1, np.int64)
    end_of = np.full(len(host.id), -1, np.int64)
    if not len(rows):
        return {"start": start_of, "end": end_of, "points": None}
    pid, tid, depth = (np.tile(a[rows], 2) for a in (host.pid, host.tid, host.depth))
    is_start = np.repeat([True, False], len(rows))
    time = np.r_[host.ts[rows], host.end[rows]]
    row = np.r_[rows, rows]
    # at equal times: ends of events with a duration (inner first), then zero-length events
    # (each start right before its own end), then starts (outer first)
    zero = np.tile(host.end[rows] == host.ts[rows], 2)
    cls = np.where(zero, 1, np.where(is_start, 2, 0))
    sub = np.where(zero, 2 * row + ~is_start, np.where(is_start, depth, -depth))
    o = np.lexsort((sub, cls, time, tid, pid))
    time, is_start, row, pid, tid = time[o], is_start[o], row[o], pid[o], tid[o]
    first = np.r_[True, (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])]
    base = b.add_nodes(host.id[row], np.where(is_start, HOST_START, HOST_END), part, time, first,
                       {"kind": np.full(len(time), HOST), "part": np.full(len(time), part),
                        "pid": pid, "tid": tid, "device": np.full(len(time), -1),
                        "stream": np.full(len(time), -1)})  # fmt: skip
    node = base + np.arange(len(time))
    start_of[row[is_start]] = node[is_start]
    end_of[row[~is_start]] = node[~is_start]
    # how many events are open before each point (per thread): a start with none is top-level
    step = np.where(is_start, 1, -1)
    open_after = np.cumsum(step)
    head = np.maximum.accumulate(np.where(first, np.arange(len(time)), 0))
    open_before = open_after - step - (open_after - step)[head]
    kind = np.where(is_start & (open_before <= 0), HOST_GAP, HOST_WORK)
    # whose CPU time each edge is (HTA's attribution): after a start, that event's; before a
    # start, its parent's; between two ends, the one ending
    prev_start, prev_row = np.r_[False, is_start[:-1]], np.r_[0, row[:-1]]
    charged = np.where(prev_start, prev_row, np.where(is_start, host.graph_parent[row], row))
    event = np.where((charged >= 0) & (kind == HOST_WORK), host.id[np.maximum(charged, 0)], -1)
    inner = ~first
    b.add_edges(node[inner] - 1, node[inner], kind[inner], 0, True, event[inner])
    # a start the thread may have waited for: its first, or one after a stretch in no op or
    # runtime call (between top-level events, or inside a step or annotation span only)
    idle = np.where(kind == HOST_GAP, True, (charged >= 0) & is_span[np.maximum(charged, 0)])
    gap = np.where(first, np.iinfo(np.int64).max, np.r_[0, np.diff(time)])
    return {"start": start_of, "end": end_of,
            "points": {"node": node, "time": time, "pid": pid, "tid": tid, "is_start": is_start,
                       "after_gap": is_start & (first | idle), "gap": gap}}  # fmt: skip


def _device_nodes(b: Builder, part: int, d: pd.DataFrame) -> dict:
    """Start and end nodes of the device work ``d`` (sorted by device, stream, lane, start;
    one timeline per lane, see :func:`_lanes`)."""
    k = len(d)
    if not k:
        e = np.empty(0, np.int64)
        return {"start": e, "dur": e, "gap_src": e, "gap_dst": e, "prev_end": e}
    start, dur = gb.i64(d.t), np.maximum(gb.i64(d.dur), 0)
    dev, stream, lane = gb.i64(d.device), gb.i64(d.stream), gb.i64(d.lane)
    new = np.r_[True, (dev[1:] != dev[:-1]) | (stream[1:] != stream[:-1])
                | (lane[1:] != lane[:-1])]  # fmt: skip
    time = np.c_[start, start + dur].ravel()
    first = np.c_[new, np.zeros(k, bool)].ravel()
    kinds = np.tile([DEVICE_START, DEVICE_END], k)
    base = b.add_nodes(np.repeat(gb.i64(d.id), 2), kinds, part, time, first,
                       {"kind": np.full(2 * k, DEVICE), "part": np.full(2 * k, part),
                        "pid": np.full(2 * k, -1), "tid": np.full(2 * k, -1),
                        "device": np.repeat(dev, 2), "stream": np.repeat(stream, 2)})  # fmt: skip
    s_node = base + 2 * np.arange(k)
    comm = d.comm.to_numpy(bool)
    b.add_edges(s_node, s_node + 1, np.where(comm, DEVICE_COMMUNICATION, DEVICE_WORK), dur, True,
                gb.i64(d.id))  # fmt: skip
    follow = np.flatnonzero(~new)
    prev_end = np.full(k, np.iinfo(np.int64).min)
    prev_end[follow] = (start + dur)[follow - 1]
    return {
        "start": s_node,
        "dur": dur,
        "gap_src": s_node[follow] - 1,
        "gap_dst": s_node[follow],
        "prev_end": prev_end,
    }


def _inferred_syncs(host: gb.HostCalls, h: pd.DataFrame, dl: pd.DataFrame,
                    node_of_work: np.ndarray, hs: dict) -> tuple:  # fmt: skip
    """Without ``cuda_sync`` events: per ``*Synchronize`` call, the work launched by its
    process before the call started that ends last before the call ends (it ended inside the
    call: the call waited for it; before: the call did not wait, but would have, had the work
    run longer). Unknown: nothing was launched before the call."""
    calls = np.flatnonzero(h.is_synchronize.to_numpy(bool) & host.in_graph)
    if not len(calls) or dl.empty:
        return np.empty(0, np.int64), np.empty(0, np.int64), host.id[calls]
    w_end = gb.i64(dl.t) + gb.i64(dl.dur)
    w_call_ts = host.ts[dl.call]
    w_pid = host.pid[dl.call]
    order = np.argsort(w_end, kind="stable")
    src, dst, unknown = [], [], []
    e_sorted = w_end[order]
    for c in calls.tolist():
        hi_i = np.searchsorted(e_sorted, host.end[c], "right")
        cand = order[:hi_i]
        cand = cand[(w_call_ts[cand] < host.ts[c]) & (w_pid[cand] == host.pid[c])]
        if len(cand):
            src.append(node_of_work[cand[-1]] + 1)
            dst.append(hs["end"][c])
        else:
            unknown.append(host.id[c])
    return np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(unknown, np.int64)


def _typical(b: Builder, part: int, work: pd.DataFrame, d: pd.DataFrame, ds: dict,
             launched: np.ndarray, sync_src: np.ndarray, sync_dst: np.ndarray,
             call_end: np.ndarray) -> dict:  # fmt: skip
    """Per-part medians of clean observations: launch latency (from the launch's submission:
    its call's start, or its end for work that started after the call returned) of work
    launched onto an empty queue of an idle stream; gap between work and the work queued
    behind it; wake-up of a host call after the work it waited for (work end to call end, of
    calls that waited)."""
    launch = gap = 0
    if len(work):
        t = gb.i64(work.t)
        call_ts, submit = work.call_ts.to_numpy(), work.submit_ts.to_numpy()
        pe = ds["prev_end"][launched]
        # (a copy its call waited for was staged by the host: not a launch latency)
        staged = ((work.level.to_numpy(object) == "memcpy")
                  & (t + gb.i64(work.dur) <= call_end[work.call.to_numpy()]))  # fmt: skip
        idle = work.onto_empty_queue.to_numpy(bool) & (pe < call_ts) & ~staged
        if idle.any():
            launch = int(np.median(np.maximum(t[idle] - submit[idle], 0)))
        queued = (pe > call_ts) & (pe > np.iinfo(np.int64).min)
        if queued.any():
            gap = int(np.median(np.maximum(t[queued] - pe[queued], 0)))
    wake = 0
    if len(sync_src):
        times = np.concatenate([x["time"] for x in b.node_parts])  # by node number so far
        # only calls that waited (the work ended after the point before the call's end) say
        # how long waking up takes; the others say how late the host came
        waited = times[sync_src] > times[sync_dst - 1]
        w = (times[sync_dst] - times[sync_src])[waited]
        if (w >= 0).any():
            wake = int(np.median(w[w >= 0]))
    row = {"part": part, "launch_ns": launch, "queue_gap_ns": gap, "wake_ns": wake}
    b.typical.append(row)
    return row


def _syncs(
    b: Builder, part: int, h: pd.DataFrame, s: pd.DataFrame, host: gb.HostCalls,
    call_of: pd.Series, work: pd.DataFrame, node_of_work: np.ndarray, hs: dict,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """(sync src, sync dst, stream-wait src, stream-wait dst) node numbers: ``cuda_sync``
    events by the critical-path graph's rules, copies that end inside the call that issued
    them, and (without ``cuda_sync`` events) inferred ``*Synchronize`` waits. ``work``: the
    launched work (rows in order of ``node_of_work``, their start nodes)."""
    e = np.empty(0, np.int64)
    if work.empty:
        return e, e, e, e
    sync_src, sync_dst, sw_src, sw_dst = e, e, e, e
    if len(s):
        s = s.assign(call=gb.i64(s.correlation.map(call_of)))
        recorded = gb.recorded_work(s, work, host)
        waits = gb.stream_wait_events(recorded, work, host)
        if len(waits):
            sw_src, sw_dst = node_of_work[waits[:, 0]] + 1, node_of_work[waits[:, 1]]
        in_graph = work.sort_values(["device", "stream", "t"], kind="stable")
        awaited, waiting, _kind = gb.host_syncs(s, recorded, in_graph, host)
        sync_src, sync_dst = node_of_work[awaited] + 1, hs["end"][waiting]
    # a copy that ends inside the call that issued it: the host waited for it
    call = work.call.to_numpy()
    is_copy = (work.level.to_numpy(object) == "memcpy") & h.is_copy_call.to_numpy(bool)[call]
    w_end = gb.i64(work.t) + gb.i64(work.dur)
    sync_copy = is_copy & (w_end <= host.end[call]) & (w_end > host.ts[call])
    sync_src = np.r_[sync_src, node_of_work[sync_copy] + 1]
    sync_dst = np.r_[sync_dst, hs["end"][call[sync_copy]]]
    if s.empty:
        src2, dst2, unknown = _inferred_syncs(host, h, work, node_of_work, hs)
        sync_src, sync_dst = np.r_[sync_src, src2], np.r_[sync_dst, dst2]
        if len(src2):
            b.notes.append(f"part {part}: no cuda_sync events: the waits of {len(src2)} "
                           "*Synchronize calls are inferred (each waits for the work launched "
                           "before it that ends last)")  # fmt: skip
        b.unmodel(part, "sync", unknown, "a *Synchronize call with no cuda_sync event and no "
                  "work launched before it: what it waits for is unknown")  # fmt: skip
    keep = (sync_src >= 0) & (sync_dst >= 0)
    return sync_src[keep], sync_dst[keep], sw_src, sw_dst


def _fwdbwd(fb: pd.DataFrame, ids: np.ndarray, hs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(forward op end node, backward op start node) per ``fwdbwd`` flow whose two ops are
    both replayed."""
    e = np.empty(0, np.int64)
    if fb.empty:
        return e, e
    pos = pd.Series(np.arange(len(ids)), index=ids)
    a, z = gb.i64(fb.src.map(pos)), gb.i64(fb.dst.map(pos))
    ok = (a >= 0) & (z >= 0)
    a, z = a[ok], z[ok]
    ok = (hs["end"][a] >= 0) & (hs["start"][z] >= 0) & (a != z)
    return hs["end"][a[ok]], hs["start"][z[ok]]


def _inferred_stream_waits(
    b: Builder, part: int, h: pd.DataFrame, host: gb.HostCalls, work: pd.DataFrame,
    ds: dict, launched: np.ndarray, typ: dict,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Without ``cuda_sync`` events, the stream waits (``cudaStreamWaitEvent``) a trace shows
    only by their effect: work that starts much later than its launch and its stream allow
    (more than ``tol`` = max(2 × typical launch latency, 10 µs) after both), right after
    (within min(tol, max(4 × typical queue gap, 10 µs))) work of another stream of its device
    ends, when its process called ``*StreamWaitEvent`` between the launches of the two.
    Returns (end node of that work, start node of the waiting work) per inference."""
    e = np.empty(0, np.int64)
    t, dur = gb.i64(work.t), np.maximum(gb.i64(work.dur), 0)
    call_ts, submit = work.call_ts.to_numpy(), work.submit_ts.to_numpy()
    pe = ds["prev_end"][launched]
    tol = max(2 * typ["launch_ns"], 10_000)
    near = min(tol, max(4 * typ["queue_gap_ns"], 10_000))
    late = np.flatnonzero((t - np.maximum(submit + typ["launch_ns"], pe + typ["queue_gap_ns"]))
                          > tol)  # fmt: skip
    waits = np.flatnonzero(h.is_stream_wait.to_numpy(bool) & host.in_graph)
    if not len(late) or not len(waits):
        return e, e
    end = t + dur
    dev, stream = gb.i64(work.device), gb.i64(work.stream)
    by_end = np.argsort(end, kind="stable")
    end_sorted = end[by_end]
    w_pid = host.pid[waits]
    w_ts = host.ts[waits]
    pid = work.pid.to_numpy()
    src, dst = [], []
    for k in late.tolist():
        lo_i = np.searchsorted(end_sorted, t[k] - near, "left")
        cand = by_end[lo_i : np.searchsorted(end_sorted, t[k], "right")]
        cand = cand[(dev[cand] == dev[k]) & (stream[cand] != stream[k])]
        if not len(cand):
            continue
        w = int(cand[np.argmax(end[cand])])
        # the wait may be called on another thread of the process (forward vs autograd)
        called = (w_pid == pid[k]) & (w_ts >= call_ts[w]) & (w_ts <= call_ts[k])
        if called.any():
            src.append(ds["start"][launched[w]] + 1)
            dst.append(ds["start"][launched[k]])
    if src:
        b.notes.append(
            f"part {part}: no cuda_sync events: {len(src)} stream waits inferred (work that "
            "started right after another stream's work ended, long after its launch, with a "
            "*StreamWaitEvent call in its process between the two launches)"
        )
    return np.asarray(src, np.int64), np.asarray(dst, np.int64)


def _lanes(d: pd.DataFrame, call: np.ndarray) -> tuple[pd.DataFrame, np.ndarray]:
    """``d`` (sorted by device, stream, start) with a ``lane`` column and sorted by device,
    stream, lane, start: work that overlaps earlier work of its stream (XLA's async copies on
    one TPU line, a source that puts concurrent work on one "stream") goes to the first lane
    of the stream free at its start, so each lane is a timeline that runs one thing at a
    time. Most streams have one lane; only streams with an overlap take a Python step per
    item."""
    if d.empty:
        return d.assign(lane=np.zeros(0, np.int64)), call
    start = gb.i64(d.t)
    end = start + np.maximum(gb.i64(d.dur), 0)
    key = gb.i64(d.device) * (1 << 40) + gb.i64(d.stream) % (1 << 40)
    prev_max = pd.Series(end).groupby(key).cummax().groupby(key).shift(1).to_numpy()
    overlap = start < np.nan_to_num(prev_max, nan=-np.inf)
    lane = np.zeros(len(d), np.int64)
    for k in np.unique(key[overlap]).tolist():
        free: list[int] = []  # end of the last item of each lane
        for i in np.flatnonzero(key == k).tolist():
            j = next((j for j, e in enumerate(free) if e <= start[i]), len(free))
            if j == len(free):
                free.append(end[i])
            else:
                free[j] = end[i]
            lane[i] = j
    if not overlap.any():
        return d.assign(lane=lane), call
    o = np.lexsort((gb.i64(d.id), start, lane, gb.i64(d.stream), gb.i64(d.device)))
    return d.iloc[o].reset_index(drop=True).assign(lane=lane[o]), call[o]


#: A thread resumes at most this long after another thread's event ends (the wake-up: 160 µs
#: from the main thread's grad seed to the autograd thread's first backward op in the 2021
#: ResNet-50 traces)…
HANDOFF_NS = 1_000_000
#: …after an idle stretch at least this long (so that a thread's own short pauses are not
#: read as waiting for another).
HANDOFF_GAP_NS = 1_000_000


def _handoffs(points: dict | None) -> tuple[np.ndarray, np.ndarray]:
    """Hand-offs between host threads that the trace records only by their timing: a
    top-level event that starts after an idle gap of at least :data:`HANDOFF_GAP_NS` on its
    thread, within :data:`HANDOFF_NS` after an event of another thread of the same process
    ended (the latest such end). The autograd thread starting the backward pass when the main
    thread's forward ends, and the main thread resuming when the backward pass ends, without
    ``fwdbwd`` flows (older traces) or any flow at all (the return). Returns (end node, start
    node) pairs."""
    e = np.empty(0, np.int64)
    if points is None:
        return e, e
    node, time, pid, tid = points["node"], points["time"], points["pid"], points["tid"]
    cand = np.flatnonzero(points["after_gap"] & (points["gap"] >= HANDOFF_GAP_NS))
    ends = np.flatnonzero(~points["is_start"])
    if not len(cand) or not len(ends):
        return e, e
    src, dst = [], []
    for p in np.unique(pid[cand]).tolist():
        mine_e = ends[pid[ends] == p]
        mine_e = mine_e[np.argsort(time[mine_e], kind="stable")]
        mine_c = cand[pid[cand] == p]
        # the last end of the process at or before each candidate's start
        pos = np.searchsorted(time[mine_e], time[mine_c], "right") - 1
        ok = pos >= 0
        j = mine_e[np.maximum(pos, 0)]
        ok &= (tid[j] != tid[mine_c]) & (time[mine_c] - time[j] <= HANDOFF_NS)
        src.append(node[j[ok]])
        dst.append(node[mine_c[ok]])
    return np.concatenate(src), np.concatenate(dst)

"""Building a :class:`~xpuprof.trace.graph.DependencyGraph` from the events of one part.

Three scans of the store (host events, device work with a correlation id, ``cuda_sync``
events), then numpy and ``pandas.merge_asof`` only: no Python loop over events. The rules are
HTA 0.5.0's (``hta/analyzers/critical_path_analysis.py``); ``docs/graph.md`` explains each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.core.names import DEVICE_LEVELS
from xpuprof.trace.graph import (
    BLOCKING_CALLS,
    DependencyGraph,
    EdgeKind,
    Edges,
    NodeKind,
    Nodes,
    Timelines,
)
from xpuprof.trace.tree import rows_in, walk_up

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: Host events with a duration (rows in id order), device work with a correlation id,
#: ``cuda_sync`` events — of some parts ({parts}), one scan each for all of them.
_HOST_QUERY = (
    "select part, id, parent, pid, tid, ts, dur, depth, correlation, "
    "coalesce(level = 'runtime', false) as is_runtime, "
    "coalesce(level in ('op', 'runtime'), false) as is_op, "
    "coalesce(name = 'cudaEventRecord', false) as is_record, "
    f"coalesce(name in {BLOCKING_CALLS}, false) as is_blocking "
    "from events where part in ({parts}) and dur is not null and device < 0 order by id"
)
#: ``comm``: HTA's communication kernels (as ``analysis.common.kernel_type``).
_DEVICE_QUERY = (
    "select part, id, device, stream, ts as t, dur, correlation, level = 'collective' or "
    "coalesce(contains(lower(name), 'nccl'), false) as comm from events where part in ({parts}) "
    f"and dur is not null and level in {DEVICE_LEVELS} and correlation is not null "
    "order by t, id"
)
SYNC_QUERY = (
    "select part, name, device, stream, ts + dur as e, correlation, "
    "try_cast(args->>'wait_on_stream' as bigint) as wait_stream, "
    "try_cast(args->>'wait_on_cuda_event_record_corr_id' as bigint) as record_correlation "
    "from events where part in ({parts}) and dur is not null and lower(category) = 'cuda_sync' "
    "order by id"
)


@dataclass(frozen=True)
class HostCalls:
    """Host events of a part that have a duration, one row each in id order."""

    id: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    ts: np.ndarray
    end: np.ndarray
    depth: np.ndarray
    correlation: np.ndarray  # -1: none
    is_runtime: np.ndarray
    is_record: np.ndarray  # cudaEventRecord
    is_blocking: np.ndarray  # one of BLOCKING_CALLS
    in_graph: np.ndarray  # an op or runtime call, dur > 0, starting in the window
    graph_parent: np.ndarray  # row of the nearest enclosing in-graph event, -1: none


def build_all(
    trace: Trace, windows: dict[int, tuple[int, int]], ranks: dict[int, int | None]
) -> dict[int, DependencyGraph]:
    """The graph of each part in ``windows`` over host events starting in its window."""
    parts = [int(p) for p in windows]
    sql = ", ".join(map(str, parts)) or "null"
    tables = [_by_part(fetch(trace, q.replace("{parts}", sql)), parts)
              for q in (_HOST_QUERY, _DEVICE_QUERY, SYNC_QUERY)]  # fmt: skip
    return {p: build(p, ranks.get(p), w, *(t[p] for t in tables)) for p, w in windows.items()}


def fetch(trace: Trace, query: str) -> pd.DataFrame:
    """``query``'s rows with plain numpy columns (integers -1 where missing, as :func:`i64`
    reads them): through Arrow, not DuckDB's pandas conversion of nullable columns. Any
    DuckDB error is left to ``trace.sql`` to word."""
    import duckdb
    import pyarrow as pa

    try:
        t = trace.con.sql(query).to_arrow_table()
    except duckdb.Error:
        return trace.sql(query)
    cols = {}
    for name, col in zip(t.column_names, t.columns, strict=True):
        if pa.types.is_integer(col.type):
            cols[name] = col.fill_null(-1).to_numpy().astype(np.int64)
        else:
            cols[name] = col.to_numpy(zero_copy_only=False)
    return pd.DataFrame(cols)


def _by_part(df: pd.DataFrame, parts: list[int]) -> dict[int, pd.DataFrame]:
    """The rows of each part, in their order, with a fresh index."""
    if len(parts) == 1:
        return {parts[0]: df}
    groups = {int(p): g.reset_index(drop=True) for p, g in df.groupby("part", sort=False)}
    return {p: groups.get(p, df.iloc[:0]) for p in parts}


def build(
    part: int,
    rank: int | None,
    window: tuple[int, int],
    host_df: pd.DataFrame,
    device_df: pd.DataFrame,
    sync_df: pd.DataFrame,
) -> DependencyGraph:
    """The graph of ``part`` over host events starting in ``window``, from its rows of the
    three queries (see ``graph.py``)."""
    host = _host_calls(host_df, window)
    if host is None:
        note = f"part {part}: no host ops or runtime calls in the window: the graph is empty"
        no = _no_nodes()
        return _assemble(part, rank, window, no, no, ((),) * 5, [note])
    notes: list[str] = []
    call_of = first_runtime_call(host)
    work = launched_work(device_df, host, call_of)
    if work.empty:
        notes.append(f"part {part}: no device work linked to a launch: the graph is host-only")
    if sync_df.empty:
        notes.append(
            f"part {part}: no cuda_sync events (PyTorch ≥ 2.1 records them): host "
            "waits on the device are invisible; GPU time may be under-counted"
        )
    sync_df = sync_df.assign(call=i64(sync_df.correlation.map(call_of)))
    in_graph = work[work.in_graph].sort_values(["device", "stream", "t"], kind="stable")
    recorded = recorded_work(sync_df, work, host)
    waits = stream_wait_events(recorded, work, host)
    syncs = host_syncs(sync_df, recorded, in_graph, host)
    host_nodes = _host_nodes(host)
    device_nodes = _device_nodes(in_graph, waits, len(host_nodes["time"]))
    cross = _cross_edges(host, host_nodes, device_nodes, syncs, notes)
    return _assemble(part, rank, window, host_nodes, device_nodes, cross, notes)


# -- host events ---------------------------------------------------------------------------------


def _host_calls(h: pd.DataFrame, window: tuple[int, int]) -> HostCalls | None:
    ids, ts, dur = i64(h.id), i64(h.ts), i64(h.dur)
    in_graph = h.is_op.to_numpy(bool) & (dur > 0) & (ts >= window[0]) & (ts <= window[1])
    if not in_graph.any():
        return None
    return HostCalls(
        id=ids, pid=i64(h.pid), tid=i64(h.tid), ts=ts, end=ts + dur, depth=i64(h.depth),
        correlation=i64(h.correlation), is_runtime=h.is_runtime.to_numpy(bool),
        is_record=h.is_record.to_numpy(bool), is_blocking=h.is_blocking.to_numpy(bool),
        in_graph=in_graph, graph_parent=nearest_graph_ancestor(ids, i64(h.parent), in_graph),
    )  # fmt: skip


def nearest_graph_ancestor(ids: np.ndarray, parent: np.ndarray, in_graph: np.ndarray) -> np.ndarray:
    """Row of each row's nearest ancestor that is in the graph (-1: none), ``ids`` sorted.
    HTA's call stacks hold graph events only, so an op inside an annotation hangs from the op
    around the annotation. One vectorized step per nesting level."""
    parent_row = rows_in(ids, parent, is_sorted=True)
    return walk_up(parent_row, np.arange(len(ids)), in_graph, strict=True)


def first_runtime_call(host: HostCalls) -> pd.Series:
    """Correlation id -> row of the first runtime call (in id order) carrying it."""
    rows = np.flatnonzero(host.is_runtime & (host.correlation >= 0))
    return pd.Series(rows, index=host.correlation[rows]).groupby(level=0).first()


def _host_nodes(host: HostCalls) -> dict[str, np.ndarray]:
    """Start and end nodes of the in-graph host events, thread by thread in time order (at
    equal times ends first, inner ends before outer ones, outer starts before inner ones),
    each with the timeline edge into it."""
    rows = np.flatnonzero(host.in_graph)
    pid, tid, depth = (np.tile(a[rows], 2) for a in (host.pid, host.tid, host.depth))
    is_start = np.repeat([True, False], len(rows))
    time = np.r_[host.ts[rows], host.end[rows]]
    o = np.lexsort((np.where(is_start, depth, -depth), is_start, time, tid, pid))
    time, is_start, row, pid, tid = time[o], is_start[o], np.r_[rows, rows][o], pid[o], tid[o]
    first = np.r_[True, (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])]
    parent = host.graph_parent[row]
    kind = np.where(is_start & (parent < 0), EdgeKind.HOST_GAP,
                    np.where(~is_start & host.is_blocking[row], EdgeKind.HOST_WAIT,
                             EdgeKind.HOST_WORK))  # fmt: skip
    # HTA's attribution of CPU time: after a start, to that event; before a start, to its
    # parent; between two ends, to the one ending
    prev_is_start, prev_row = np.r_[False, is_start[:-1]], np.r_[0, row[:-1]]
    charged = np.where(prev_is_start, prev_row, np.where(is_start, parent, row))
    charged = np.where(kind == EdgeKind.HOST_WORK, charged, row)
    charged = np.where(kind == EdgeKind.HOST_GAP, -1, charged)
    since_previous = time - np.r_[time[:1], time[:-1]]
    none = np.full(len(time), -1)
    return {
        "event": host.id[row], "time": time, "first": first, "row": row,
        "order_time": time, "order_class": np.ones(len(time), np.int64),
        "node_kind": np.where(is_start, NodeKind.HOST_START, NodeKind.HOST_END),
        "has_edge": ~first, "kind": kind,
        "weight": np.where(~first & (kind == EdgeKind.HOST_WORK), since_previous, 0),
        "charged": np.where(charged >= 0, host.id[charged], -1),
        "pid": pid, "tid": tid, "stream": none, "device": none,
    }  # fmt: skip


# -- device work and synchronisation ------------------------------------------------------------


def launched_work(d: pd.DataFrame, host: HostCalls, call_of: pd.Series) -> pd.DataFrame:
    """Device work whose correlation id names a runtime call (``call``: its row), with the
    call's start and thread, whether that call is in the graph, and HTA's queue test."""
    d = d.assign(call=i64(d.correlation.map(call_of)))
    d = d[d.call >= 0].reset_index(drop=True)
    call = d.call.to_numpy()
    d = d.assign(row=np.arange(len(d)), call_ts=host.ts[call], pid=host.pid[call],
                 tid=host.tid[call], in_graph=host.in_graph[call])  # fmt: skip
    # HTA's queue length per stream: +1 at a launch, -1 when its work starts (whole trace)
    q = pd.DataFrame({"device": np.tile(d.device, 2), "stream": np.tile(d.stream, 2),
                      "t": np.r_[d.call_ts, d.t], "k": np.repeat([1, -1], len(d))})  # fmt: skip
    q = q.sort_values(["device", "stream", "t", "k"], ascending=[1, 1, 1, 0], kind="stable")
    length = q.k.groupby([q.device, q.stream]).cumsum().sort_index().to_numpy()
    d["onto_empty_queue"] = (length[: len(d)] == 1) & (length[len(d) :] == 0)
    return d


def recorded_work(s: pd.DataFrame, work: pd.DataFrame, host: HostCalls) -> pd.DataFrame:
    """Event Sync and Stream Wait Event rows, with ``work``: the row of the in-graph work
    launched last onto ``wait_stream`` up to the ``cudaEventRecord`` they wait on."""
    rec = np.flatnonzero(host.is_record & (host.correlation >= 0))
    record_ts = pd.Series(host.ts[rec], index=host.correlation[rec]).groupby(level=0).first()
    s = s.assign(t=s.record_correlation.map(record_ts))
    ev = s[s.name.isin(["Event Sync", "Stream Wait Event"]) & s.t.notna() & (s.call >= 0)]
    launches = work[["device", "stream", "row"]].assign(t=work.call_ts)
    k = _asof(ev[["device", "wait_stream", "t"]].rename(columns={"wait_stream": "stream"}),
              launches)  # fmt: skip
    ok = np.r_[work.in_graph.to_numpy(bool), False][k]
    return ev[ok].assign(work=k[ok])


def stream_wait_events(recorded: pd.DataFrame, work: pd.DataFrame, host: HostCalls) -> np.ndarray:
    """(recorded work row, waiting work row, cudaStreamWaitEvent id) per Stream Wait Event:
    the waiting work is the next launch by the waiting thread onto the waiting stream."""
    ww = recorded[recorded.name == "Stream Wait Event"]
    call = ww.call.to_numpy()
    left = pd.DataFrame({"pid": host.pid[call], "tid": host.tid[call], "device": i64(ww.device),
                         "stream": i64(ww.stream), "t": host.ts[call]})  # fmt: skip
    launches = work[["pid", "tid", "device", "stream", "row"]].assign(t=work.call_ts)
    nxt = _asof(left, launches, forward=True, exact=False)
    ok = np.r_[work.in_graph.to_numpy(bool), False][nxt]
    return np.c_[ww.work, nxt, host.id[call]][ok].astype(np.int64)


def host_syncs(
    s: pd.DataFrame, recorded: pd.DataFrame, in_graph: pd.DataFrame, host: HostCalls
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(awaited work row, waiting call row, edge kind) of the sync edges into host calls:
    Event Sync from the recorded work; Stream Sync from the last in-graph work that started
    on the stream before the sync ended; Context Sync the same for each stream of the device."""
    es = recorded[(recorded.name == "Event Sync") & host.in_graph[recorded.call.to_numpy()]]
    ss = s[s.name.isin(["Stream Sync", "Context Sync"]) & (s.call >= 0)]
    ss = ss[host.in_graph[ss.call.to_numpy()]]
    ctx = ss[ss.name == "Context Sync"].drop(columns="stream")
    streams = in_graph[["device", "stream"]].drop_duplicates()
    one = pd.concat([ss[ss.name == "Stream Sync"], ctx.merge(streams, on="device")])
    last = _asof(one[["device", "stream", "e"]].rename(columns={"e": "t"}),
                 in_graph[["device", "stream", "t", "row"]], exact=False)  # fmt: skip
    found = last >= 0
    kind = np.where(one.name.to_numpy(object)[found] == "Stream Sync", EdgeKind.STREAM_SYNC,
                    EdgeKind.CONTEXT_SYNC)  # fmt: skip
    return (np.r_[es.work, last[found]].astype(np.int64),
            np.r_[es.call, one.call.to_numpy()[found]].astype(np.int64),
            np.r_[np.full(len(es), EdgeKind.EVENT_SYNC), kind].astype(np.int8))  # fmt: skip


def _device_nodes(d: pd.DataFrame, waits: np.ndarray, first_node: int) -> dict[str, np.ndarray]:
    """Start and end nodes of the in-graph device work ``d`` (sorted by device, stream,
    start), numbered from ``first_node``; HTA's choice for each start: a launch edge (idle
    stream, empty queue, awaited work done before the launch), else a kernel gap edge from the
    previous work on the stream (if an awaited kernel did not end after that), else neither."""
    start, end, ids, dur = i64(d.t), i64(d.t + d.dur), i64(d.id), i64(d.dur)
    stream_key = i64(d.device) * (1 << 40) + i64(d.stream) % (1 << 40)
    same = np.zeros(len(d), bool)  # on the same stream as the previous work
    same[1:] = stream_key[1:] == stream_key[:-1]
    prev_end = np.where(same, np.r_[0, end][: len(d)], -1)
    index_of = np.full(int(d.row.max()) + 1 if len(d) else 0, -1)  # work row -> index in d
    index_of[d.row] = np.arange(len(d))
    awaited, wait_call = np.full(len(d), -1), np.full(len(d), -1)
    awaited[index_of[waits[:, 1]]] = index_of[waits[:, 0]]
    wait_call[index_of[waits[:, 1]]] = waits[:, 2]
    waits_for = awaited >= 0
    awaited_end, call_ts = np.where(waits_for, end[awaited], -1), d.call_ts.to_numpy()
    launch = (d.onto_empty_queue.to_numpy(bool) & (~same | (prev_end < call_ts))
              & (~waits_for | (awaited_end < call_ts)))  # fmt: skip
    queued = ~launch & same & (~waits_for | (awaited_end < prev_end))
    time = np.c_[start, end].ravel()
    order_time = pd.Series(time).groupby(np.repeat(stream_key, 2)).cummax().to_numpy()
    node = first_node + 2 * np.arange(len(d))  # start nodes; end nodes are node + 1
    run = np.where(d.comm.to_numpy(bool), EdgeKind.DEVICE_COMMUNICATION, EdgeKind.DEVICE_WORK)
    return {
        "event": np.repeat(ids, 2), "time": time, "order_time": order_time,
        "order_class": np.c_[np.full(len(d), 2), np.where(order_time[1::2] > order_time[::2],
                                                          0, 2)].ravel(),
        "first": np.c_[~same, np.zeros(len(d), bool)].ravel(),
        "node_kind": np.tile([NodeKind.DEVICE_START, NodeKind.DEVICE_END], len(d)),
        "has_edge": np.c_[queued, np.ones(len(d), bool)].ravel(),
        "kind": np.c_[np.full(len(d), EdgeKind.KERNEL_GAP), run].ravel(),
        "weight": np.c_[np.where(queued, np.maximum(start - prev_end, 0), 0), dur].ravel(),
        "charged": np.c_[np.r_[-1, ids][: len(d)], ids].ravel(),
        "pid": np.full(2 * len(d), -1), "tid": np.full(2 * len(d), -1),
        "device": np.repeat(i64(d.device), 2), "stream": np.repeat(i64(d.stream), 2),
        "launch": np.flatnonzero(launch), "call": d.call.to_numpy(), "call_ts": call_ts,
        "start": start, "node": node, "awaited": awaited, "wait_call": wait_call,
        "index_of": index_of,
    }  # fmt: skip


def _cross_edges(host: HostCalls, hn: dict, dn: dict, syncs: tuple, notes: list[str]) -> tuple:
    """(src, dst, kind, weight, event) of the launch, stream-wait and host sync edges."""
    start_node, end_node = np.full(len(host.id), -1), np.full(len(host.id), -1)
    is_start = hn["node_kind"] == NodeKind.HOST_START
    start_node[hn["row"][is_start]] = np.flatnonzero(is_start)
    end_node[hn["row"][~is_start]] = np.flatnonzero(~is_start)
    launched, call = dn["launch"], dn["call"]
    delay = dn["start"][launched] - dn["call_ts"][launched]
    if (delay < 0).any():
        notes.append(f"{(delay < 0).sum()} kernels start before their launch call (clock skew): "
                     "their launch delay counts as 0")  # fmt: skip
    waiting = np.flatnonzero(dn["awaited"] >= 0)
    awaited_row, call_row, sync_kind = syncs
    awaited = dn["index_of"][awaited_row]
    node = dn["node"]  # start node of each work; its end node is one more
    src = np.r_[start_node[call[launched]], node[dn["awaited"][waiting]] + 1, node[awaited] + 1]
    dst = np.r_[node[launched], node[waiting], end_node[call_row]]
    kind = np.r_[np.full(len(launched), EdgeKind.LAUNCH),
                 np.full(len(waiting), EdgeKind.STREAM_WAIT_EVENT), sync_kind]  # fmt: skip
    weight = np.r_[np.maximum(delay, 0), np.zeros(len(waiting) + len(call_row), np.int64)]
    event = np.r_[host.id[call[launched]], dn["wait_call"][waiting], host.id[call_row]]
    return src, dst, kind, weight, event


# -- the graph -----------------------------------------------------------------------------------

#: Per-node arrays that ``_host_nodes`` and ``_device_nodes`` both give.
_NODE_FIELDS = ("event", "node_kind", "time", "order_time", "order_class", "first", "has_edge",
                "kind", "weight", "charged", "pid", "tid", "device", "stream")  # fmt: skip


def _assemble(part: int, rank: int | None, window: tuple[int, int], hn: dict, dn: dict,
              cross: tuple, notes: list[str]) -> DependencyGraph:  # fmt: skip
    """Nodes, timelines and edges from the node arrays (host, then device) and the cross
    edges; cross edges that go back in the topological order are left out."""

    def both(f: str, mask: str | None = None, dtype: type = np.int64) -> np.ndarray:
        a, b = (x[f] if mask is None else x[f][x[mask].astype(bool)] for x in (hn, dn))
        return np.concatenate([a, b]).astype(dtype, copy=False)

    first_of = both("first", dtype=bool)
    first = np.flatnonzero(first_of)
    n = len(first_of)
    where = {f: both(f, "first") for f in ("device", "pid", "tid", "stream")}
    timelines = Timelines(first=first, stop=np.r_[first[1:], n].astype(np.int64), **where)
    nodes = Nodes(event=both("event"), kind=both("node_kind", dtype=np.int8), time=both("time"),
                  timeline=np.cumsum(first_of) - 1, order_time=both("order_time"),
                  order_class=both("order_class", dtype=np.int8))  # fmt: skip
    x_src, x_dst, x_kind, x_weight, x_event = (np.asarray(a, np.int64) for a in cross)
    back = _goes_back(nodes, x_src, x_dst)
    if back.any():
        notes.append(f"{back.sum()} launch/sync edges point back in time (clock skew between "
                     "host and device) and were left out")  # fmt: skip
    keep = ~back
    dst = np.flatnonzero(both("has_edge", dtype=bool))
    src = np.r_[dst - 1, x_src[keep]]
    dst = np.r_[dst, x_dst[keep]]
    edges = Edges(
        src=src, dst=dst,
        kind=np.r_[both("kind", "has_edge"), x_kind[keep]].astype(np.int8),
        weight=np.r_[both("weight", "has_edge"), x_weight[keep]],
        duration=nodes.time[dst] - nodes.time[src],
        event=np.r_[both("charged", "has_edge"), x_event[keep]],
    )  # fmt: skip
    for table in (nodes, edges, timelines):  # the graph is cached and shared: read-only
        for a in vars(table).values():
            a.flags.writeable = False
    return DependencyGraph(part=part, rank=rank, window=window, nodes=nodes, edges=edges,
                           timelines=timelines, notes=tuple(notes))  # fmt: skip


def _goes_back(nodes: Nodes, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Whether ``src`` comes after ``dst`` in the order (order_time, order_class, node)."""
    ts, td = nodes.order_time[src], nodes.order_time[dst]
    cs, cd = nodes.order_class[src], nodes.order_class[dst]
    return (ts > td) | ((ts == td) & ((cs > cd) | ((cs == cd) & (src > dst))))


def _no_nodes() -> dict[str, np.ndarray]:
    return {f: np.empty(0, np.int64) for f in _NODE_FIELDS}


def i64(s: pd.Series | np.ndarray) -> np.ndarray:
    """int64 values, -1 for missing ones."""
    return pd.Series(s).fillna(-1).to_numpy(np.int64)


def _asof(left: pd.DataFrame, right: pd.DataFrame, forward: bool = False,
          exact: bool = True) -> np.ndarray:  # fmt: skip
    """Per ``left`` row, ``right.row`` of the last right row with equal other columns and
    ``t`` ≤ (< unless ``exact``; first ≥ / > if ``forward``) left ``t``; else -1."""
    if left.empty or right.empty:
        return np.full(len(left), -1, np.int64)
    by, way = list(left.columns[:-1]), "forward" if forward else "backward"
    left, right = (x.reset_index(drop=True).fillna(-1).astype(np.int64) for x in (left, right))
    m = pd.merge_asof(left.assign(_i=left.index).sort_values("t"), right.sort_values("t"),
                      on="t", by=by, direction=way, allow_exact_matches=exact)  # fmt: skip
    out = np.full(len(left), -1, np.int64)
    out[m._i.to_numpy()] = m.row.fillna(-1).to_numpy(np.int64)
    return out

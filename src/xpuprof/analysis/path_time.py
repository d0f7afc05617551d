"""The critical path of one part as a labelled timeline: consecutive pieces of time, each with
the category of what bounded the run then and the event it is charged to.

Built on the dependency graph (:mod:`xpuprof.trace.graph`, HTA's edges) plus one kind of edge
HTA's graph only has when PyTorch recorded ``cuda_sync`` events: a host call that blocks (a
synchronize, a synchronous copy) ends after the device work that ended last inside it, so the
path may go through that work and come back to the host (*inferred sync edges*, weight 0,
like HTA's own sync edges). Without them, the longest path through a trace of many steps
cannot leave the host, and every device-bound step would read as host time.

The longest path is then cut into pieces labelled with :data:`CATEGORIES`
(``docs/advise.md`` defines each): host time is ``cpu`` (framework ops), ``outside_ops``
(between top-level ops), ``runtime`` (runtime calls that neither launch nor wait),
``launch`` (launch calls and the launch latency of work onto an idle stream), ``sync`` (blocked
in a synchronising call), or ``input`` when it lies inside an input span; device time is the
work class of the work (``analysis.common.work_class``), ``communication`` split into
``comm_wait`` (the start of a collective, until the last participant arrived) and transfer,
and ``device_gap`` (gaps between queued work). A ``sync`` piece during which the device ran
work is that work's class: the host was waiting for it, so the device bounded the run.

Device "kernels" that only synchronise streams (MTIA's ``event_wait``, :data:`DEVICE_WAITS`)
are no work: on the path they are gaps, charged to the work they wait for.

A part with device work but no host calls linked to it (XPlane TPU traces) has no graph
path: its timeline is the device's own (work classes, and ``device_idle``), one per device
when it has several (:func:`device_path_times`). A part with neither framework ops, runtime
calls nor device work (an xpuprof capture at level ``step`` or ``layer``) has the host's own
timeline: ``input``, ``cpu`` in layer spans, ``outside_ops`` (:func:`_host_only`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import merge_intervals
from xpuprof.analysis.path_state import (
    CATEGORIES,
    CODE,
    DEVICE_WAITS,
    Claims,
    DeviceState,
    covered,
    device_events,
    innermost,
    inside,
    kind_rows,
    unique_sorted,
)
from xpuprof.trace.graph import (
    BLOCKING_CALLS,
    DependencyGraph,
    EdgeKind,
    Edges,
    NodeKind,
    dependency_graphs,
    longest_path,
)

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

__all__ = ["CATEGORIES", "CODE", "DEVICE_WAITS", "PathTime", "device_path_times", "path_times"]

#: Categories of host time (the ones an input span can claim).
HOST = frozenset({"cpu", "outside_ops", "runtime", "launch", "sync"})

#: Host calls that wait for the device, on every platform: HTA's CUDA list, the driver API,
#: HIP, and MTIA's runtime. ``cudaEventQuery`` polls (HTA lists it; it waits only as long as
#: it takes).
SYNC_CALLS = frozenset(BLOCKING_CALLS) | {
    "cudaMemcpy2D", "cudaMemcpy2DAsync", "cudaMemcpy3D", "cudaMemcpyPeer",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemcpyDtoH",
    "cuMemcpyDtoHAsync", "cuMemcpyHtoD", "cuMemcpy",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy",
    "hipMemcpyAsync", "hipMemcpyWithStream", "hipMemcpyDtoH", "hipMemcpyDtoHAsync",
    "hipMemcpyHtoD", "synchronize", "synchronizeStream",
}  # fmt: skip
#: Runtime calls that put work on a device queue (kernels, graphs, async copies and sets).
LAUNCH_CALL = re.compile(r"Launch|MemsetAsync|^enqueueCommand|^runFunction", re.IGNORECASE)


@dataclass(frozen=True)
class PathTime:
    """One part's critical path as pieces ``[start, end)`` (ns, disjoint, in time order),
    each with a ``category`` code (:data:`CATEGORIES`) and the ``event`` it is charged to
    (-1: none). ``source``: ``"graph"`` (the dependency graph's longest path), ``"device"``
    (no host→device links: the device timeline) or ``"host"`` (no ops, runtime calls or
    device work: the host timeline of a ``step``/``layer`` capture). ``inferred``: sync edges added.
    ``device_busy``: whether a device of the part worked at the piece's start (what a rule
    asks of host time: did the device wait for it?). ``device``: the device whose timeline
    the path is (a part with several devices and no host links gets one path per device,
    :func:`device_path_times`), -1 for the part's path."""

    part: int
    rank: int | None
    start: np.ndarray
    end: np.ndarray
    category: np.ndarray
    event: np.ndarray
    device_busy: np.ndarray  # bool: some device of the part runs work at the piece's start
    source: str
    inferred: int
    notes: tuple[str, ...]
    device: int = -1


def path_times(trace: Trace, parts: list[int]) -> dict[int, PathTime]:
    """The labelled critical path of each part, cached on ``trace.memo``."""
    memo = trace.memo.setdefault("analysis.path_time", {})
    per_device = trace.memo.setdefault("analysis.path_time.devices", {})
    todo = [p for p in parts if p not in memo]
    if todo:
        graphs = dependency_graphs(trace, {p: None for p in todo})
        dev = device_events(trace, todo)
        inputs = _input_claims(trace, todo)
        host_comm = _host_collectives(trace, todo)
        comm_waits = _comm_waits(trace, todo)
        host_waits = _comm_waits(trace, todo, "host")
        for p in todo:
            d = dev.get(p)
            state = DeviceState.of(d, comm_waits.get(p))
            hw = host_waits.get(p)
            memo[p] = _path_time(trace, graphs[p], state, inputs.get(p), host_comm.get(p),
                                 None if hw is None else merge_intervals(*hw))  # fmt: skip
            per_device[p] = {}
            if memo[p].source == "device" and d is not None and d.device.nunique() > 1:
                # several chips and no host links: each chip's timeline is its own path (a
                # merged one would call a step "compute" whenever any chip computes)
                for k, g in d.groupby("device"):
                    s = DeviceState.of(g, comm_waits.get(p))
                    per_device[p][int(k)] = _device_only(
                        graphs[p], s, list(graphs[p].notes), inputs.get(p), host_comm.get(p),
                        device=int(k))  # fmt: skip
    return {p: memo[p] for p in parts}


def device_path_times(trace: Trace, part: int) -> dict[int, PathTime]:
    """Per device, the path of a part that has several devices and no host work linked to
    them (an XPlane host with its TPU chips): each device's own timeline. Empty for any
    other part (its one path, :func:`path_times`, stands for all its devices)."""
    path_times(trace, [part])
    return trace.memo["analysis.path_time.devices"][part]


# ------------------------------------------------------------------------- device state


@dataclass(frozen=True)
class HostState:
    """What the host threads of a part run at each instant, from the graph's host edges of
    every thread: elementary intervals labelled with a category code (-1: no thread in an op
    or call), framework CPU work first, then launches, other runtime calls, blocking calls;
    and per label the edges' intervals and charged events, to name what ran."""

    bounds: np.ndarray
    label: np.ndarray
    by_label: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]

    @classmethod
    def of(cls, g: DependencyGraph, info: CallInfo) -> HostState:
        e, t = g.edges, g.nodes.time
        host = np.flatnonzero(np.isin(e.kind, [EdgeKind.HOST_WORK, EdgeKind.HOST_WAIT]))
        s, en = t[e.src[host]], t[e.dst[host]]
        ok = en > s
        host, s, en = host[ok], s[ok], en[ok]
        cat = _base_category(e.kind[host], e.event[host], info)
        o = np.argsort(s, kind="stable")  # one sort: each label's rows stay in start order
        s, en, cat, ev = s[o], en[o], cat[o], e.event[host][o].astype(np.int64)
        by_label, groups = {}, []
        for c in ("cpu", "launch", "runtime", "sync"):
            m = cat == CODE[c]
            by_label[CODE[c]] = (s[m], en[m], ev[m])
            groups.append((CODE[c], merge_intervals(s[m], en[m])))
        bounds = unique_sorted(np.concatenate([np.r_[a, b] for _, (a, b) in groups] or [[0]]))
        label = np.full(max(len(bounds) - 1, 0), -1, np.int64)
        for code, (a, b) in reversed(groups):
            label[covered(bounds, a, b)] = code
        return cls(bounds, label, by_label)

    def at(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(label, charged event) at each instant ``t`` (-1, -1: no thread busy)."""
        lab = DeviceState.at(self, t)  # type: ignore[arg-type]
        return lab, DeviceState.events_at(self, t, lab)  # type: ignore[arg-type]


def _input_claims(trace: Trace, parts: list[int]) -> dict[int, Claims | None]:
    """Input spans of each part (``analysis.inputs.input_spans_by_part``)."""
    from xpuprof.analysis.inputs import input_spans_by_part

    return {p: Claims.of(g) for p, g in input_spans_by_part(trace, parts).items()}


def _host_collectives(trace: Trace, parts: list[int]) -> dict[int, Claims | None]:
    """Collectives that run on the host, as the comm tool chooses them
    (``analysis.comm.host``: gloo's ``gloo:<collective>`` spans on its worker threads, else
    the ``c10d::`` ops of a synchronous backend): while one runs, untraced time of the path
    waits for it, and a ``c10d::`` op chosen as the collective is communication itself."""
    from xpuprof.analysis.comm.host import host_collective_ids

    df = host_collective_ids(trace)
    df = df[df["part"].isin(parts) & (df["dur"] > 0)]
    return {int(p): Claims.of(g) for p, g in df.groupby("part")}


def _host_collective_events(trace: Trace, part: int) -> np.ndarray:
    """The ids of the part's host collectives and of the events inside them on their
    thread (``analysis.comm.host.host_collective_members``), sorted: time charged to any
    of them is the collective's."""
    from xpuprof.analysis.comm.host import host_collective_members

    df = host_collective_members(trace)
    return np.sort(df.loc[df["part"] == part, "id"].to_numpy(np.int64))


def _comm_waits(trace: Trace, parts: list[int],
                where: str = "device") -> dict[int, tuple[np.ndarray, np.ndarray]]:  # fmt: skip
    """Per part, the intervals where its collectives (those running ``where``: ``device``
    or ``host``) waited for the last participant."""
    from xpuprof.analysis.comm import collective_waits

    w = collective_waits(trace)
    if w.empty:
        return {}
    w = w[(w.wait_ns > 0) & (w["where"] == where)]
    out = {}
    for p, g in w.groupby("part"):
        if int(p) in parts:
            s = g.ts.to_numpy(np.int64)
            out[int(p)] = (s, s + g.wait_ns.to_numpy(np.int64))
    return out


# ------------------------------------------------------------------------------- the path


def _path_time(trace: Trace, g: DependencyGraph, state: DeviceState, inputs: Claims | None,
               host_comm: Claims | None,
               host_waits: tuple[np.ndarray, np.ndarray] | None = None) -> PathTime:  # fmt: skip
    """Longest path of ``g`` (with inferred sync edges), cut into labelled pieces."""
    notes = list(g.notes)
    if not len(g.nodes) or not (g.nodes.kind >= NodeKind.DEVICE_START).any():
        if len(state.label):  # device work the graph cannot reach: the device timeline
            return _device_only(g, state, notes, inputs, host_comm)
    if not len(g.nodes):
        return _host_only(trace, g, notes, inputs)
    info = _call_info(trace, g)
    aug, inferred = with_inferred_syncs(g, info)
    if inferred:
        notes = [n for n in notes if "no cuda_sync events" not in n]
        notes.append(f"part {g.part}: {inferred:,} host waits without cuda_sync records were "
                     "joined to the device work that ended last inside them")  # fmt: skip
    path = longest_path(aug)
    e, t = aug.edges, aug.nodes.time
    times = np.maximum.accumulate(np.r_[t[e.src[path[:1]]], t[e.dst[path]]])
    start, end = times[:-1], times[1:]
    cat = _base_category(e.kind[path], e.event[path], info)
    event = e.event[path].astype(np.int64)
    latency = e.kind[path] == EdgeKind.LAUNCH
    if len(start):  # before and after the path the host runs nothing the trace shows
        start, end = np.r_[_FAR, start, end[-1]], np.r_[start[0], end, -_FAR]
        cat = np.r_[CODE["outside_ops"], cat, CODE["outside_ops"]]
        event, latency = np.r_[-1, event, -1], np.r_[False, latency, False]
    threads = HostState.of(g, info)
    own = _host_collective_events(trace, g.part) if host_comm is not None else None
    start, end, cat, event = _refine(start, end, cat, event, latency, state, threads, inputs,
                                     host_comm, host_waits, own)  # fmt: skip
    busy = state.at(start) >= 0
    return PathTime(g.part, g.rank, start, end, cat, event, busy, "graph", inferred,
                    tuple(notes))  # fmt: skip


def _device_only(g: DependencyGraph, state: DeviceState, notes: list[str],
                 inputs: Claims | None, host_comm: Claims | None,
                 device: int = -1) -> PathTime:  # fmt: skip
    """The device timeline as the path (of one ``device``, or of all the part's devices
    together), each piece charged to the work running then; its idle time inside an input
    span (or a host collective) is what the device waited for."""
    cuts = [state.bounds, state.event_bounds] + [x for c in (inputs, host_comm) if c is not None
                                                 for x in (c.lo, c.hi)]  # fmt: skip
    b = unique_sorted(np.concatenate(cuts))
    lab = state.at(b[:-1])
    cat = np.where(lab < 0, CODE["device_idle"], lab)
    ev = state.events_at(b[:-1], lab)
    for claims, code in ((host_comm, CODE["communication"]), (inputs, CODE["input"])):
        if claims is not None:
            on = (lab < 0) & claims.covers(b[:-1])
            cat[on], ev[on] = code, claims.id_at(b[:-1][on])
    busy = ~np.isin(cat, [CODE["device_idle"], CODE["input"]])
    notes = [n for n in notes if "cuda_sync" not in n and "graph is empty" not in n]
    notes.append(f"part {g.part}: no host calls linked to device work (no launches or "
                 "correlation ids): its path is the device timeline, and device idle time "
                 "cannot be attributed to the host")  # fmt: skip
    idle = CODE["device_idle"]
    start, end = np.r_[_FAR, b[:-1], b[-1]], np.r_[b[0], b[1:], -_FAR]
    cat, ev, busy = np.r_[idle, cat, idle], np.r_[-1, ev, -1], np.r_[False, busy, False]
    return PathTime(g.part, g.rank, start, end, cat, ev, busy, "device", 0, tuple(notes),
                    device)  # fmt: skip


#: Host spans that show what a host without framework ops runs: layer spans (module calls)
#: are the framework's work; the others name the code around it.
_HOST_SPANS = ("layer", "annotation", "python", "step")


def _host_only(trace: Trace, g: DependencyGraph, notes: list[str],
               inputs: Claims | None) -> PathTime:  # fmt: skip
    """The host timeline as the path of a part with no framework ops, runtime calls or
    device work (an xpuprof capture at level ``step`` or ``layer``): each instant is
    ``input`` in an input span (the ``between-ops`` input of ``input_pipeline.input_spans``:
    where the loop fetches its batch), else ``cpu`` in a layer span (the framework's work as
    this level sees it, charged to the innermost layer span: its own time), else
    ``outside_ops`` (the loss, and the backward pass and optimizer when they have no layer
    spans; charged to the innermost annotation, Python frame or step span around it)."""
    levels = ", ".join(f"'{x}'" for x in _HOST_SPANS)
    df = trace.sql(
        "select id, pid, tid, level, depth, ts, ts + dur as e from events where "
        f"part = {g.part} and device < 0 and dur > 0 and level in ({levels})"
    )
    if df.empty and inputs is None:
        empty = np.empty(0, np.int64)
        return PathTime(g.part, g.rank, empty, empty, empty, empty, empty.astype(bool), "graph",
                        0, tuple(notes))  # fmt: skip
    cuts = [df.ts.to_numpy(np.int64), df.e.to_numpy(np.int64)]
    if inputs is not None:
        cuts += [inputs.lo, inputs.hi]
    b = unique_sorted(np.concatenate(cuts))
    start, end = np.r_[_FAR, b], np.r_[b, -_FAR]
    layer = df.level == "layer"
    cat = np.full(len(start), CODE["outside_ops"], np.int64)
    event = innermost(df[~layer], start)
    own = innermost(df[layer], start)
    cat[own >= 0], event[own >= 0] = CODE["cpu"], own[own >= 0]
    if inputs is not None:
        on = inputs.covers(start)
        cat[on], event[on] = CODE["input"], inputs.id_at(start[on])
    level = next((s.get("meta", {}).get("xpuprof_capture", {}).get("level") for s in
                  trace.sources if s["part"] == g.part), None)  # fmt: skip
    notes = [n for n in notes if "graph is empty" not in n]
    notes.append(f"part {g.part}: no framework ops, runtime calls or device work recorded"
                 f"{f' (capture level {level})' if level else ''}: its path is the host "
                 "timeline (input between steps and in input spans, CPU work in layer spans, "
                 "the rest outside ops: the loss, backward and optimizer are not told apart "
                 "at this level)")  # fmt: skip
    return PathTime(g.part, g.rank, start, end, cat, event, np.zeros(len(start), bool), "host",
                    0, tuple(notes))  # fmt: skip


@dataclass(frozen=True)
class CallInfo:
    """Per event id met on the graph: whether it is a sync call, a launch call, another
    runtime call, and the work class code of device work (-1 for host events)."""

    ids: np.ndarray  # sorted
    sync: np.ndarray
    launch: np.ndarray
    runtime: np.ndarray
    work: np.ndarray

    def rows(self, ids: np.ndarray) -> np.ndarray:
        if not len(self.ids):
            return np.full(len(ids), -1, np.int64)
        k = np.clip(np.searchsorted(self.ids, ids), 0, len(self.ids) - 1)
        return np.where(self.ids[k] == ids, k, -1)

    def get(self, field: str, rows: np.ndarray, default=False) -> np.ndarray:
        """``field`` at each row (``default`` where the row is -1)."""
        a = getattr(self, field)
        if not len(a):
            return np.full(len(rows), default, dtype=type(default) if default is not False
                           else bool)  # fmt: skip
        return np.where(rows >= 0, a[np.maximum(rows, 0)], default)


def _call_info(trace: Trace, g: DependencyGraph) -> CallInfo:
    """What each event of ``g`` is (sync, launch or other runtime call; work class of device
    work), from the part's runtime and device events classified once per distinct name."""
    df = _kinds(trace).get(g.part)
    if df is None:
        empty = np.empty(0, np.int64)
        return CallInfo(empty, empty.astype(bool), empty.astype(bool), empty.astype(bool), empty)
    return CallInfo(df.id, df.sync, df.launch, df.runtime, df.work)


@dataclass(frozen=True)
class _Kinds:
    id: np.ndarray
    sync: np.ndarray
    launch: np.ndarray
    runtime: np.ndarray
    work: np.ndarray


def _kinds(trace: Trace) -> dict[int, _Kinds]:
    """Per part, every runtime call and device event, classified (cached on the trace), from
    the rows :func:`kind_rows` read once; each distinct name matched once."""
    key = ("analysis.path_time.kinds",)
    if key in trace.memo:
        return trace.memo[key]
    r = kind_rows(trace)
    cats = pd.Series(r.names).astype(str)
    codes = r.name
    is_sync = cats.isin(SYNC_CALLS).to_numpy()
    is_launch = cats.str.contains(LAUNCH_CALL).to_numpy() & ~is_sync
    rt = r.runtime
    sync = rt & np.r_[is_sync, False][codes]  # code -1 (no name): the last, False
    launch = rt & np.r_[is_launch, False][codes]
    work = np.full(len(rt), -1, np.int64)
    dev = ~rt
    if dev.any():
        classes, inv = np.unique(r.work[dev].astype(str), return_inverse=True)
        work[dev] = pd.Series(classes).map(CODE).to_numpy(np.int64)[inv.reshape(-1)]
        waits = cats.isin(DEVICE_WAITS).to_numpy()
        work[dev & np.r_[waits, False][codes]] = CODE["device_gap"]
    out = {}
    ids, part = r.id, r.part
    o = np.lexsort((ids, part))
    bounds = np.searchsorted(part[o], np.unique(part), side="left").tolist() + [len(o)]
    for i, p in enumerate(np.unique(part).tolist()):
        rows = o[bounds[i] : bounds[i + 1]]
        out[int(p)] = _Kinds(ids[rows], sync[rows], launch[rows],
                             (rt & ~sync & ~launch)[rows], work[rows])  # fmt: skip
    trace.memo[key] = out
    return out


def with_inferred_syncs(g: DependencyGraph, info: CallInfo) -> tuple[DependencyGraph, int]:
    """``g`` plus an edge (kind ``context_sync``, weight 0, charged to the call) from the
    device work that ended last inside each blocking call to the call's end, for the calls no
    ``cuda_sync`` edge already joins; and how many were added (module docstring)."""
    n, e = g.nodes, g.edges
    ends = np.flatnonzero(n.kind == NodeKind.HOST_END)
    r = info.rows(n.event[ends])
    ends = ends[info.get("sync", r).astype(bool)]
    synced = e.dst[np.isin(e.kind, [EdgeKind.STREAM_SYNC, EdgeKind.CONTEXT_SYNC,
                                    EdgeKind.EVENT_SYNC])]  # fmt: skip
    ends = ends[~np.isin(ends, synced)]
    dev_end = np.flatnonzero(n.kind == NodeKind.DEVICE_END)
    if not len(ends) or not len(dev_end):
        return g, 0
    dev_end = dev_end[np.argsort(n.order_time[dev_end], kind="stable")]
    # the call's start: the host start node of the same event on the same timeline
    starts = np.flatnonzero(n.kind == NodeKind.HOST_START)  # one per host event
    o = np.argsort(n.event[starts], kind="stable")
    k = np.clip(np.searchsorted(n.event[starts][o], n.event[ends]), 0, max(len(o) - 1, 0))
    call_start = n.time[starts][o][k]
    k = np.searchsorted(n.order_time[dev_end], n.time[ends], side="right") - 1
    src = dev_end[np.maximum(k, 0)]
    ok = (k >= 0) & (n.time[src] > call_start)
    src, dst = src[ok], ends[ok]
    if not len(src):
        return g, 0
    edges = Edges(
        src=np.r_[e.src, src], dst=np.r_[e.dst, dst],
        kind=np.r_[e.kind, np.full(len(src), EdgeKind.CONTEXT_SYNC, np.int8)].astype(np.int8),
        weight=np.r_[e.weight, np.zeros(len(src), np.int64)],
        duration=np.r_[e.duration, n.time[dst] - n.time[src]],
        event=np.r_[e.event, n.event[dst]],
    )  # fmt: skip
    return replace(g, edges=edges), len(src)


_FAR = -(2**62)  # the path's ends extend to here (and its negative) on each side
_SYNC_EDGES = (EdgeKind.STREAM_SYNC, EdgeKind.CONTEXT_SYNC, EdgeKind.EVENT_SYNC)


def _base_category(kind: np.ndarray, event: np.ndarray, info: CallInfo) -> np.ndarray:
    """The category of each path edge from its kind and charged event (module docstring)."""
    r = info.rows(event)
    sync = info.get("sync", r).astype(bool)
    launch = info.get("launch", r).astype(bool)
    runtime = info.get("runtime", r).astype(bool)
    work = info.get("work", r, -1).astype(np.int64)
    out = np.full(len(kind), CODE["cpu"], np.int64)
    host_work = kind == EdgeKind.HOST_WORK
    out[host_work & sync] = CODE["sync"]
    out[host_work & launch] = CODE["launch"]
    out[host_work & runtime] = CODE["runtime"]
    out[kind == EdgeKind.HOST_GAP] = CODE["outside_ops"]
    out[kind == EdgeKind.HOST_WAIT] = CODE["sync"]
    dev = kind == EdgeKind.DEVICE_WORK
    out[dev] = np.where(work[dev] >= 0, work[dev], CODE["compute"])
    out[kind == EdgeKind.DEVICE_COMMUNICATION] = CODE["communication"]
    out[kind == EdgeKind.KERNEL_GAP] = CODE["device_gap"]
    out[kind == EdgeKind.STREAM_WAIT_EVENT] = CODE["device_gap"]
    out[kind == EdgeKind.LAUNCH] = np.where(sync[kind == EdgeKind.LAUNCH], CODE["sync"],
                                            CODE["launch"])  # fmt: skip
    out[np.isin(kind, _SYNC_EDGES)] = CODE["sync"]
    return out


def _refine(start, end, cat, event, latency, state: DeviceState, threads: HostState,
            inputs: Claims | None, host_comm: Claims | None,
            host_waits: tuple[np.ndarray, np.ndarray] | None = None,
            host_ids: np.ndarray | None = None) -> tuple:  # fmt: skip
    """Cut host, gap and collective pieces at the boundaries of the other threads' work,
    input spans, host collectives and device states, and relabel them, in this order:

    1. time outside ops while another thread of the process runs an op or a call is what
       that thread runs (the backward pass on autograd's thread, a pin-memory thread);
    2. untraced host time while a host collective (gloo) runs, and the time of a host op
       chosen as the collective itself (``c10d::``, synchronous backends), is
       ``communication`` — ``comm_wait`` while it waits for the last participant
       (``host_waits``);
    3. host time inside an input span is ``input`` (a blocking call excepted: it is the more
       precise answer);
    4. blocked time, time in other runtime calls (many synchronise implicitly: ``cudaFree``,
       MTIA's execution calls), gaps between queued device work and the delay from a launch
       to its work (``latency``: launch edges), while the device works, are that work: what
       the host or the queued work waits for (a dependency on another stream the trace does
       not record); collective time while waiting for the last participant is
       ``comm_wait``.

    Claimed pieces are charged to the claiming event."""
    keep = end > start
    start, end, cat, event = start[keep], end[keep], cat[keep], event[keep]
    latency = latency[keep]
    is_host = np.isin(cat, [CODE[c] for c in HOST]) & ~latency
    refine = is_host | latency | np.isin(cat, [CODE["communication"], CODE["device_gap"]])
    claims = [c for c in (inputs, host_comm) if c is not None]
    hw = [] if host_waits is None else list(host_waits)
    c = unique_sorted(np.concatenate([state.bounds, *state.waits, *hw, threads.bounds,
                                  *(x for cl in claims for x in (cl.lo, cl.hi))]))  # fmt: skip
    lo = np.searchsorted(c, start, side="right")
    hi = np.searchsorted(c, end, side="left")
    n_cuts = np.where(refine, np.maximum(hi - lo, 0), 0)
    piece_of = np.repeat(np.arange(len(start)), n_cuts + 1)
    j = np.arange(len(piece_of)) - np.r_[0, np.cumsum(n_cuts + 1)[:-1]][piece_of]
    inner = c[np.clip(lo[piece_of] + j - 1, 0, max(len(c) - 1, 0))] if len(c) else start[piece_of]
    p_start = np.where(j == 0, start[piece_of], inner)
    p_end = np.where(j == n_cuts[piece_of], end[piece_of], np.r_[p_start[1:], 0])
    p_cat, p_event = cat[piece_of].copy(), event[piece_of].copy()
    host = is_host[piece_of]
    gap = host & (p_cat == CODE["outside_ops"])
    lab, ev = threads.at(p_start)
    on = gap & (lab >= 0)
    p_cat[on], p_event[on] = lab[on], ev[on]
    if host_comm is not None:
        on = host & (p_cat == CODE["outside_ops"]) & host_comm.covers(p_start)
        p_cat[on], p_event[on] = CODE["communication"], host_comm.id_at(p_start[on])
        if host_ids is not None:  # the collective's own span (a c10d op, a gloo span)
            p_cat[host & np.isin(p_event, host_ids)] = CODE["communication"]
        if host_waits is not None:
            on = (p_cat == CODE["communication"]) & host & inside(*host_waits, p_start)
            p_cat[on] = CODE["comm_wait"]
    if inputs is not None:
        on = host & np.isin(p_cat, [CODE[x] for x in HOST - {"sync"}]) & inputs.covers(p_start)
        p_cat[on], p_event[on] = CODE["input"], inputs.id_at(p_start[on])
    dev = state.at(p_start)
    waiting = (np.isin(p_cat, [CODE["sync"], CODE["runtime"], CODE["device_gap"]])
               | latency[piece_of]) & (dev >= 0)  # fmt: skip
    p_cat[waiting] = dev[waiting]
    comm = cat[piece_of] == CODE["communication"]
    p_cat[comm & state.waiting(p_start)] = CODE["comm_wait"]
    # what a waiting piece waits for: each piece of device work that runs through it
    s, e, i, ev = state.charge(p_start, p_end, p_cat, waiting)
    p_start, p_end, p_cat = s, e, p_cat[i]
    p_event = np.where(waiting[i], ev, p_event[i])
    ok = p_end > p_start
    return p_start[ok], p_end[ok], p_cat[ok], p_event[ok]

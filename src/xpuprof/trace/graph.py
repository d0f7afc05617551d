"""The dependency graph of one part (source file ≈ rank) of a trace, and its longest path.

It is HTA 0.5.0's critical-path graph (``CPGraph``), edge for edge, held in numpy arrays; the
simulator replays it and ``analysis.critical_path`` is a longest-path query over it. The model,
HTA's rules and where xpuprof deviates are in ``docs/graph.md``.

**Nodes** (:class:`NodeKind`) are points in time. ``host_start``/``host_end``: start and end of
each host op or runtime call with ``dur > 0`` that starts inside the window. ``device_start``/
``device_end``: start and end of each kernel, copy, set or collective launched (by correlation
id) by one of those calls. Nodes are numbered timeline by timeline (host threads, then device
streams), in time order within each.

**Edges** (:class:`EdgeKind`) have a ``weight`` (the time they add to a path), a ``duration``
(clock time from source to target) and the ``event`` they are charged to (-1: none).
Timeline edges join consecutive nodes of one thread or stream (node i - 1 → node i):

- ``host_work``: CPU time of the innermost open op/call; weight = duration; charged to that op.
- ``host_gap``: into the start of a top-level op (no enclosing op in the graph); weight 0.
- ``host_wait``: into the end of a blocking call (:data:`BLOCKING_CALLS`): the host waits for
  the device; weight 0, charged to the call.
- ``device_work`` / ``device_communication``: a kernel (copy, set) / an NCCL-RCCL collective
  running, start → end; weight = duration, charged to it.
- ``kernel_gap``: end of the previous kernel on the stream → start of the next, when the next
  one was queued behind it; weight = max(gap, 0), charged to the previous kernel.

Cross edges:

- ``launch``: runtime call start → start of the work it launched onto an idle stream's empty
  queue; weight = the launch delay (≥ 0), charged to the call.
- ``stream_sync`` / ``context_sync`` / ``event_sync``: from the ``cuda_sync`` event of the
  waiting call: end of the last kernel on the stream / on each stream of the device / launched
  before the ``cudaEventRecord`` it waits on → end of the waiting call; weight 0, charged to
  the call.
- ``stream_wait_event``: end of the recorded kernel → start of the next kernel the waiting
  thread launches onto the waiting stream; weight 0, charged to ``cudaStreamWaitEvent``.

(``order_time``, ``order_class``, node number) sorts the nodes topologically: cross edges that
would go back in it (clock skew between host and device) are left out, with a note.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from collections.abc import Mapping

    from xpuprof.trace.trace import Trace

#: Host calls that wait for the device (HTA's ``CPGraph.BLOCKING_SYNC_CALLS``).
BLOCKING_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventQuery",
                  "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync")  # fmt: skip
#: The whole trace as a window.
WHOLE_TRACE = (-(2**63), 2**63 - 1)


class NodeKind(IntEnum):
    """What point in time a node is."""

    HOST_START = 0
    HOST_END = 1
    DEVICE_START = 2
    DEVICE_END = 3


class EdgeKind(IntEnum):
    """What an edge stands for (defined in the module docstring)."""

    HOST_WORK = 0
    HOST_GAP = 1
    HOST_WAIT = 2
    DEVICE_WORK = 3
    DEVICE_COMMUNICATION = 4
    KERNEL_GAP = 5
    LAUNCH = 6
    STREAM_SYNC = 7
    CONTEXT_SYNC = 8
    EVENT_SYNC = 9
    STREAM_WAIT_EVENT = 10


NODE_KINDS: tuple[str, ...] = tuple(k.name.lower() for k in NodeKind)
EDGE_KINDS: tuple[str, ...] = tuple(k.name.lower() for k in EdgeKind)
#: Edges that join consecutive nodes of one timeline (node i - 1 → node i).
TIMELINE_EDGES: frozenset[EdgeKind] = frozenset(EdgeKind) - {
    EdgeKind.LAUNCH, EdgeKind.STREAM_SYNC, EdgeKind.CONTEXT_SYNC, EdgeKind.EVENT_SYNC,
    EdgeKind.STREAM_WAIT_EVENT}  # fmt: skip

_IS_TIMELINE_EDGE = np.isin(np.arange(len(EdgeKind)), list(TIMELINE_EDGES))
_STARTS, _ALONG = -1, -2  # how a longest path reaches an anchor (else: by a cross edge)


class _Columns:
    """Equal-length numpy columns of a dataclass, viewable as a DataFrame."""

    def __len__(self) -> int:
        return len(getattr(self, fields(self)[0].name))  # type: ignore[arg-type]

    def frame(self) -> pd.DataFrame:
        """The columns as a DataFrame (``kind`` as names, for reading and printing)."""
        cols = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        names = NODE_KINDS if isinstance(self, Nodes) else EDGE_KINDS
        if "kind" in cols:
            cols["kind"] = pd.Categorical.from_codes(cols["kind"], names)
        return pd.DataFrame(cols)


@dataclass(frozen=True)
class Nodes(_Columns):
    """One row per node (int64 unless said). ``order_time`` is ``time``, except along a device
    stream, where it never goes back (overlapping kernels: a running maximum); ``order_class``
    breaks ties at equal ``order_time``: device ends (0), host nodes (1), device starts (2; a
    zero-length kernel's end too)."""

    event: np.ndarray
    kind: np.ndarray  # int8 NodeKind
    time: np.ndarray
    timeline: np.ndarray  # row of DependencyGraph.timelines
    order_time: np.ndarray
    order_class: np.ndarray  # int8


@dataclass(frozen=True)
class Edges(_Columns):
    """One row per edge: timeline edges in target order, then the cross edges (launch, wait
    and sync edges, in that order). ``src``/``dst`` are node numbers; ``event`` -1 is none."""

    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray  # int8 EdgeKind
    weight: np.ndarray
    duration: np.ndarray
    event: np.ndarray


@dataclass(frozen=True)
class Timelines(_Columns):
    """A host thread (``device`` -1, ``pid``/``tid``) or a device stream (``device``,
    ``stream``; ``pid``/``tid`` -1): its nodes are ``first`` to ``stop`` - 1."""

    first: np.ndarray
    stop: np.ndarray
    device: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    stream: np.ndarray


@dataclass(frozen=True)
class DependencyGraph:
    """The dependency graph of one part of a trace over a window of host start times (ns)."""

    part: int
    rank: int | None
    window: tuple[int, int]
    nodes: Nodes
    edges: Edges
    timelines: Timelines
    notes: tuple[str, ...]

    def edge_counts(self) -> dict[str, int]:
        """Number of edges of each kind (every kind, zeros included)."""
        n = np.bincount(self.edges.kind, minlength=len(EDGE_KINDS))
        return dict(zip(EDGE_KINDS, n.tolist(), strict=True))

    def summary(self) -> pd.DataFrame:
        """Per edge kind: ``edges``, summed ``weight`` and ``duration`` (ns)."""
        k, m = self.edges.kind, len(EDGE_KINDS)
        return pd.DataFrame({
            "kind": EDGE_KINDS,
            "edges": np.bincount(k, minlength=m),
            "weight": np.bincount(k, self.edges.weight, m).astype(np.int64),
            "duration": np.bincount(k, self.edges.duration, m).astype(np.int64),
        })  # fmt: skip


def dependency_graph(
    trace: Trace, part: int, *, window: tuple[int, int] | None = None
) -> DependencyGraph:
    """The graph of ``part`` over host events starting in ``window`` (inclusive ns; None:
    the whole trace), cached on ``trace.memo``."""
    return dependency_graphs(trace, {part: window})[int(part)]


def dependency_graphs(
    trace: Trace, windows: Mapping[int, tuple[int, int] | None]
) -> dict[int, DependencyGraph]:
    """The graphs of several parts (part -> window, as :func:`dependency_graph`), built with
    one scan of the store for all of them; each cached on ``trace.memo``."""
    key = {
        int(p): ("dependency_graph", int(p), WHOLE_TRACE if w is None else (int(w[0]), int(w[1])))
        for p, w in windows.items()
    }
    todo = {p: k[2] for p, k in key.items() if k not in trace.memo}
    if todo:
        from xpuprof.trace.graph_build import build_all

        ranks = {s["part"]: s["rank"] for s in trace.sources}
        for p, graph in build_all(trace, todo, ranks).items():
            trace.memo[key[p]] = graph
    return {p: trace.memo[k] for p, k in key.items()}


def longest_path(graph: DependencyGraph) -> np.ndarray:
    """Edge numbers (rows of ``graph.edges``) of a path with the largest summed weight, in
    order.

    Nodes are numbered timeline by timeline, so along a timeline a distance is a prefix sum
    plus the best entry. Only *anchors* (nodes without a timeline edge into them, ends of
    cross edges) take a Python step, in topological order; the rest is numpy. Ties: the
    timeline edge wins over cross edges, an earlier cross edge over a later one, and of
    equally long paths the one ending first.
    """
    nodes, edges = graph.nodes, graph.edges
    n = len(nodes)
    if n == 0:
        return np.empty(0, np.int64)
    along = _IS_TIMELINE_EDGE[edges.kind]
    into = np.full(n, -1, np.int64)  # the timeline edge into each node
    into[edges.dst[along]] = np.flatnonzero(along)
    weight_in = np.zeros(n, np.int64)
    weight_in[edges.dst[along]] = edges.weight[along]
    head = into < 0
    cross = np.flatnonzero(~along)
    c_src, c_dst, c_weight = edges.src[cross], edges.dst[cross], edges.weight[cross]
    anchor = head.copy()
    anchor[np.r_[c_src, c_dst]] = True
    anchors = np.flatnonzero(anchor)
    anchor_of = np.cumsum(anchor) - 1  # last anchor at or before each node
    order = np.lexsort((anchors, nodes.order_class[anchors], nodes.order_time[anchors]))
    src_anchor, dst_anchor = anchor_of[c_src], anchor_of[c_dst]
    by_dst = np.argsort(dst_anchor, kind="stable")  # cross edges grouped by target anchor
    lo = np.searchsorted(dst_anchor[by_dst], np.arange(len(anchors)), "left").tolist()
    hi = np.searchsorted(dst_anchor[by_dst], np.arange(len(anchors)), "right").tolist()
    prefix = np.cumsum(weight_in)
    pre_a, head_a = prefix[anchors].tolist(), head[anchors].tolist()
    x_src, x_weight = src_anchor[by_dst].tolist(), c_weight[by_dst].tolist()
    x_id = by_dst.tolist()
    # per anchor: the longest distance to it, and how: _STARTS there, _ALONG its timeline from
    # the previous anchor, or the number of the cross edge into it
    dist, how = [0] * len(anchors), [_STARTS] * len(anchors)
    for k in order.tolist():
        if head_a[k]:
            best, via = 0, _STARTS
        else:
            best, via = dist[k - 1] + pre_a[k] - pre_a[k - 1], _ALONG
        for j in range(lo[k], hi[k]):
            if (d := dist[x_src[j]] + x_weight[j]) > best:
                best, via = d, x_id[j]
        dist[k], how[k] = best, via
    full = np.asarray(dist)[anchor_of] + prefix - prefix[anchors][anchor_of]
    top = np.flatnonzero(full == full.max())
    v = int(top[np.argmin(nodes.order_time[top])])  # ends where its last work ends
    seq: list[np.ndarray] = []  # walking back: edge numbers
    while True:
        k = int(anchor_of[v])
        seq.append(into[np.arange(v, anchors[k] - (how[k] == _ALONG), -1)])
        if how[k] == _STARTS:
            break
        if how[k] >= 0:
            seq.append(cross[[how[k]]])
        v = anchors[k] - 1 if how[k] == _ALONG else int(c_src[how[k]])
    path = np.concatenate(seq)[::-1].astype(np.int64)
    assert edges.weight[path].sum() == full.max()
    return path

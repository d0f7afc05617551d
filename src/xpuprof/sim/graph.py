"""The replay graph: every host op, runtime call, step and device work of the replayed ranks as
two points in time (start, end), joined by the dependencies the trace records.

It extends the critical-path graph of ``trace/graph.py`` (same launch and synchronisation
rules, built by the same helpers of ``trace/graph_build.py``) in what a replay needs that a
longest-path query does not: every launch (not only those onto an idle stream), device work
without a launch, profiler steps, forward → backward hand-offs, and collectives matched across
ranks. ``docs/replay.md`` defines each edge kind and how its delay is set; in short:

*Timeline edges* join consecutive points of one host thread or device stream (node i - 1 → i):

- ``host_work``: CPU time inside a host event (the innermost one open); measured.
- ``host_gap``: into the start of a top-level host event: the measured gap between top-level
  events, kept as host work (Python, dispatch: real CPU time).
- ``device_work`` / ``device_communication``: a kernel, copy or set / a collective running.
- ``stream_order``: end of the previous work on a stream → start of the next.

*Cross edges*:

- ``launch``: runtime call start → start of the work it launched (correlation id).
- ``sync``: end of device work → end of a host call that waits for it (``cuda_sync`` events:
  stream, context and event syncs; a copy that ends inside the call that issued it, i.e. a
  synchronous or pageable copy; a ``*Synchronize`` call without ``cuda_sync`` events: the last
  work launched before it that ends inside it, "inferred").
- ``stream_wait_event``: end of the recorded work → start of the waiting stream's next work.
- ``fwdbwd``: end of a forward op → start of its backward op (Kineto's ``fwdbwd`` flows).
- ``collective``: each participant's collective start → a *rendezvous* node of the matched
  collective (delay 0), rendezvous → each participant's end (delay: the transfer time, the
  duration of the kernel of the participant that arrived last).

*Delays* ("measured" costs, ``sim/costs.py``): timeline edges of host threads carry the measured
time between their points. A point with several inputs (a kernel start: its launch, the previous
work on its stream, a stream wait; a host call end: the call itself and the work it waits for)
was, in the trace, set by one of them: the *binding* input, the one whose source time plus a
typical delay of its kind is latest. The binding input carries the measured gap, the others
the smaller of the measured gap and the typical delay of their kind (per rank medians:
launch latency of kernels launched onto an idle stream, gap between queued kernels, wake-up
after a sync). So the identity replay reproduces the trace where the graph is complete, and a
change (a slower host, a faster kernel) moves each point by what its dependencies allow.
Collectives are the exception: their end is modelled (last arrival + transfer), never copied.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

NODE_KINDS = ("host_start", "host_end", "device_start", "device_end", "rendezvous")
HOST_START, HOST_END, DEVICE_START, DEVICE_END, RENDEZVOUS = range(5)

EDGE_KINDS = ("host_work", "host_gap", "device_work", "device_communication", "stream_order",
              "launch", "sync", "stream_wait_event", "fwdbwd", "collective",
              "handoff")  # fmt: skip
(HOST_WORK, HOST_GAP, DEVICE_WORK, DEVICE_COMMUNICATION, STREAM_ORDER, LAUNCH, SYNC,
 STREAM_WAIT_EVENT, FWDBWD, COLLECTIVE, HANDOFF) = range(len(EDGE_KINDS))  # fmt: skip

#: One line per edge kind, for the replay's edge table.
EDGE_MEANING = {
    "host_work": "CPU time inside a host event (program order on its thread)",
    "host_gap": "measured host time between top-level host events (Python, dispatch)",
    "device_work": "a kernel, copy or set running",
    "device_communication": "a collective kernel running (its transfer time)",
    "stream_order": "previous work on the stream → next work (program order on the stream)",
    "launch": "runtime call → the work it launched, delay: the launch latency",
    "sync": "device work → end of the host call waiting for it",
    "stream_wait_event": "recorded work → the waiting stream's next work",
    "fwdbwd": "forward op → its backward op",
    "collective": "each participant's start → rendezvous → each participant's end",
    "handoff": "an event of one host thread → the next event of another (inferred)",
}

#: Timeline kinds.
HOST, DEVICE, VIRTUAL = 0, 1, 2


class _Columns:
    def __len__(self) -> int:
        return len(getattr(self, fields(self)[0].name))  # type: ignore[arg-type]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({f.name: getattr(self, f.name) for f in fields(self)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Nodes(_Columns):
    """One row per point: ``event`` (-1 for a rendezvous), ``kind`` (:data:`NODE_KINDS`),
    ``part`` (-1 for a rendezvous), ``time`` (measured, ns, the part's own clock; a
    rendezvous: the last participant's start on the reference clock), ``timeline``."""

    event: np.ndarray
    kind: np.ndarray
    part: np.ndarray
    time: np.ndarray
    timeline: np.ndarray


@dataclass(frozen=True)
class Edges(_Columns):
    """One row per edge (in no particular order): ``src``/``dst`` node numbers, ``kind``
    (:data:`EDGE_KINDS`),
    ``delay`` (ns; what the measured cost model gives), ``slack`` (measured time from source
    to target, ns, on the aligned clock), ``timeline`` (True: a timeline edge, node i-1 → i),
    ``binding`` (the input that set the target's time in the trace), ``event`` (whose work
    the edge is: a ``host_work`` edge, the innermost host event open over it; a device run,
    that work; -1 for every other edge)."""

    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray
    delay: np.ndarray
    slack: np.ndarray
    timeline: np.ndarray
    binding: np.ndarray
    event: np.ndarray


@dataclass(frozen=True)
class Timelines(_Columns):
    """A host thread (``kind`` 0: ``pid``/``tid``), a device stream (1: ``device``/``stream``)
    or a rendezvous (2); its nodes are ``first`` to ``stop`` - 1."""

    first: np.ndarray
    stop: np.ndarray
    kind: np.ndarray
    part: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    device: np.ndarray
    stream: np.ndarray


@dataclass(frozen=True)
class ReplayGraph:
    """The replay graph of some parts (ranks) of a trace; see the module docstring."""

    parts: tuple[int, ...]
    ranks: dict[int, int | None]
    nodes: Nodes
    edges: Edges
    timelines: Timelines
    offsets: dict[int, int]  # part -> ns subtracted from its times to align clocks
    typical: pd.DataFrame  # per part: launch_ns, queue_gap_ns, wake_ns
    unmodelled: pd.DataFrame  # part, what, event, reason
    notes: tuple[str, ...]

    def edge_counts(self) -> dict[str, int]:
        """Edges of each kind (every kind, zeros included)."""
        n = np.bincount(self.edges.kind, minlength=len(EDGE_KINDS))
        return dict(zip(EDGE_KINDS, n.tolist(), strict=True))

    @property
    def aligned(self) -> np.ndarray:
        """Measured node times on the aligned clock (ns)."""
        off = np.zeros(len(self.nodes), np.int64)
        part = self.nodes.part
        for p, o in self.offsets.items():
            off[part == p] = o
        return self.nodes.time - off


UNMODELLED_COLUMNS = ["part", "what", "event", "reason"]


class Builder:
    """Accumulates nodes, timelines and raw edges (with their model delay) part by part."""

    def __init__(self) -> None:
        self.node_parts: list[dict[str, np.ndarray]] = []
        self.tl_parts: list[dict[str, np.ndarray]] = []
        self.edge_parts: list[dict[str, np.ndarray]] = []
        self.n = 0
        self.n_tl = 0
        self.unmodelled: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.typical: list[dict[str, Any]] = []
        self.coll_nodes: dict[int, pd.DataFrame] = {}  # part -> id, start node, end node, dur

    def add_nodes(self, event: np.ndarray, kind: np.ndarray, part: int, time: np.ndarray,
                  tl_first: np.ndarray, tl: dict[str, np.ndarray]) -> int:  # fmt: skip
        """Append nodes (grouped by timeline; ``tl_first`` marks each timeline's first node)
        and their timelines; returns the number of the first node."""
        base = self.n
        k = len(event)
        first = np.flatnonzero(tl_first)
        timeline = self.n_tl + np.cumsum(tl_first) - 1
        self.node_parts.append({"event": event, "kind": kind, "part": np.full(k, part),
                                "time": time, "timeline": timeline})  # fmt: skip
        self.tl_parts.append({"first": base + first, "stop": base + np.r_[first[1:], k],
                              **{c: np.asarray(v)[first] for c, v in tl.items()}})  # fmt: skip
        self.n += k
        self.n_tl += len(first)
        return base

    def add_edges(self, src: np.ndarray, dst: np.ndarray, kind: int | np.ndarray,
                  model: np.ndarray | int, timeline: bool,
                  event: np.ndarray | int = -1) -> None:  # fmt: skip
        src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        k = len(src)
        self.edge_parts.append({
            "src": src, "dst": dst, "kind": np.broadcast_to(np.asarray(kind, np.int8), k),
            "model": np.broadcast_to(np.asarray(model, np.int64), k),
            "timeline": np.full(k, timeline),
            "event": np.broadcast_to(np.asarray(event, np.int64), k),
        })  # fmt: skip

    def unmodel(self, part: int, what: str, events: np.ndarray, reason: str) -> None:
        for e in np.asarray(events).tolist():
            self.unmodelled.append({"part": part, "what": what, "event": int(e), "reason": reason})

    def finish(self, parts: tuple[int, ...], ranks: dict[int, int | None],
               offsets: dict[int, int]) -> ReplayGraph:  # fmt: skip
        def cat(items: list[dict[str, np.ndarray]], key: str, dtype: Any = np.int64) -> np.ndarray:
            if not items:
                return np.empty(0, dtype)
            return np.concatenate([np.asarray(x[key]) for x in items]).astype(dtype, copy=False)

        nodes = Nodes(event=cat(self.node_parts, "event"),
                      kind=cat(self.node_parts, "kind", np.int8),
                      part=cat(self.node_parts, "part"), time=cat(self.node_parts, "time"),
                      timeline=cat(self.node_parts, "timeline"))  # fmt: skip
        tl = Timelines(**{f.name: cat(self.tl_parts, f.name) for f in fields(Timelines)})
        src, dst = cat(self.edge_parts, "src"), cat(self.edge_parts, "dst")
        kind, model = cat(self.edge_parts, "kind", np.int8), cat(self.edge_parts, "model")
        along = cat(self.edge_parts, "timeline", bool)
        off = np.zeros(len(nodes), np.int64)
        for p, o in offsets.items():
            off[nodes.part == p] = o
        aligned = nodes.time - off
        slack = aligned[dst] - aligned[src]
        delay, binding = calibrate(dst, kind, along, model, slack, aligned[src], len(nodes))
        edges = Edges(src=src, dst=dst, kind=kind, delay=delay, slack=slack, timeline=along,
                      binding=binding, event=cat(self.edge_parts, "event"))  # fmt: skip
        typical = pd.DataFrame(self.typical, columns=["part", "launch_ns", "queue_gap_ns",
                                                      "wake_ns"])  # fmt: skip
        un = pd.DataFrame(self.unmodelled, columns=UNMODELLED_COLUMNS)
        return ReplayGraph(parts=parts, ranks=ranks, nodes=nodes, edges=edges, timelines=tl,
                           offsets=offsets, typical=typical, unmodelled=un,
                           notes=tuple(self.notes))  # fmt: skip


def calibrate(
    dst: np.ndarray, kind: np.ndarray, along: np.ndarray, model: np.ndarray,
    slack: np.ndarray, src_time: np.ndarray, n: int,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Each edge's delay and whether it binds (module docstring): per target node, the input
    with the latest source time + model delay binds and carries its measured slack; the others
    carry min(slack, model). Collective edges keep their model delay (``model`` ≥ 0 is used
    as given for them). Ties: the timeline edge, then the earlier edge."""
    m = len(dst)
    if m == 0:
        return np.empty(0, np.int64), np.empty(0, bool)
    binding = np.ones(m, bool)
    # only targets with several inputs need a choice (most points have one)
    several = np.flatnonzero(np.bincount(dst, minlength=n)[dst] > 1)
    if len(several):
        d = dst[several]
        score = src_time[several] + model[several]
        o = np.lexsort((several, ~along[several], -score, d))
        first = np.r_[True, d[o][1:] != d[o][:-1]]
        binding[several] = False
        binding[several[o[first]]] = True
    delay = np.where(binding, slack, np.minimum(slack, model))
    # a matched collective's end: last arrival + transfer, and its own run the transfer too
    coll = kind == COLLECTIVE
    transfer = np.full(n, -1, np.int64)
    transfer[dst[coll]] = model[coll]
    run = (kind == DEVICE_COMMUNICATION) & along & (transfer[dst] >= 0)
    delay = np.where(coll, model, np.where(run, transfer[dst], delay))
    return delay.astype(np.int64), binding


def replay_graph(
    trace: Trace,
    parts: list[int] | None = None,
    windows: dict[int, tuple[int, int]] | None = None,
    align: str = "auto",
) -> ReplayGraph:
    """The replay graph of ``parts`` (default: all) over host events starting in each part's
    window (inclusive ns, the part's own clock; absent: all) and the device work they launched
    (device work without a launch: starting in the window), the parts' clocks aligned as
    ``align`` says (the comm tool's option). Built by ``sim/build.py``."""
    from xpuprof.sim.build import build

    return build(trace, parts, windows, align)

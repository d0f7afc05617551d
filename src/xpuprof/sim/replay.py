"""Replay a trace: build its replay graph, schedule it with a cost model, and compare the
simulated timeline with the measured one (``docs/replay.md``).

Step time, measured: the duration of the profiler step span (``ProfilerStep#N``, the host
span that torch.profiler and HTA call a step); simulated: the time between the simulated start
and end of that span. Span: first start to last end of everything replayed on a rank.
Error: (simulated − measured) / measured, in percent. Deviations: the replayed events whose
simulated start is furthest from their measured start (aligned clocks), with the input that set
their simulated start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.core.result import Presentation, Result
from xpuprof.sim import engine
from xpuprof.sim.costs import CostModel, resolve
from xpuprof.sim.graph import (
    DEVICE_END,
    DEVICE_START,
    EDGE_KINDS,
    EDGE_MEANING,
    HOST_END,
    HOST_START,
    ReplayGraph,
    replay_graph,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.analysis.common import StepSelection
    from xpuprof.trace.trace import Trace

STEP_COLUMNS = ["rank", "part", "step", "name", "measured_ns", "simulated_ns", "error_pct",
                "with_device_measured_ns", "with_device_simulated_ns",
                "with_device_error_pct"]  # fmt: skip
SUMMARY_COLUMNS = ["rank", "part", "steps", "measured_ns", "simulated_ns", "error_pct",
                   "span_measured_ns", "span_simulated_ns", "span_error_pct"]  # fmt: skip
DEVIATION_COLUMNS = ["rank", "part", "name", "level", "point", "deviation_ns", "cause",
                     "measured", "simulated", "event"]  # fmt: skip
UNMODELLED_COLUMNS = ["rank", "part", "what", "event", "name", "reason"]
EVENT_COLUMNS = ["id", "part", "rank", "pid", "tid", "device", "stream", "level", "category",
                 "name", "ts", "dur", "sim_ts", "sim_dur"]  # fmt: skip


@dataclass
class Replay:
    """A replayed trace: the graph, the schedule and the comparison tables (module docstring).
    ``time``: simulated time of each graph node, on its part's own clock (ns)."""

    trace: Trace = field(repr=False)
    graph: ReplayGraph
    time: np.ndarray
    steps: pd.DataFrame
    summary: pd.DataFrame
    edges: pd.DataFrame
    unmodelled: pd.DataFrame
    deviations: pd.DataFrame
    notes: list[str]
    step_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # rows of steps
    device_steps: pd.DataFrame = field(default_factory=pd.DataFrame)  # node, part, step
    schedule: engine.Schedule | None = field(default=None, repr=False)  # aligned clock

    def events(self) -> pd.DataFrame:
        """One row per replayed event: where it ran, its measured ``ts``/``dur`` and its
        simulated ``sim_ts``/``sim_dur`` (ns, the part's own clock)."""
        nodes = self.graph.nodes
        real = nodes.event >= 0
        is_start = np.isin(nodes.kind, (HOST_START, DEVICE_START)) & real
        is_end = np.isin(nodes.kind, (HOST_END, DEVICE_END)) & real
        s = pd.DataFrame({"id": nodes.event[is_start], "ts": nodes.time[is_start],
                          "sim_ts": self.time[is_start]})  # fmt: skip
        e = pd.DataFrame({"id": nodes.event[is_end], "end": nodes.time[is_end],
                          "sim_end": self.time[is_end]})  # fmt: skip
        df = s.merge(e, on="id", how="inner")
        df["dur"] = df["end"] - df["ts"]
        df["sim_dur"] = df["sim_end"] - df["sim_ts"]
        info = _event_info(self.trace, df["id"].to_numpy())
        df = df.merge(info, on="id", how="left")
        return (
            df[EVENT_COLUMNS]
            .sort_values(["part", "ts", "id"], kind="stable")
            .reset_index(drop=True)
        )

    def result(self) -> Result:
        """The tables as a tool's :class:`Result` (``xpuprof replay``)."""
        err = self.steps["error_pct"] if len(self.steps) else self.summary["span_error_pct"]
        err = pd.to_numeric(err, errors="coerce").abs().dropna()
        facts: dict[str, Any] = {
            "nodes": len(self.graph.nodes), "edges": len(self.graph.edges),
            "median_error_pct": round(float(err.median()), 3) if len(err) else None,
            "worst_error_pct": round(float(err.max()), 3) if len(err) else None,
            "error_of": "steps" if len(self.steps) else "span",
        }  # fmt: skip
        if len(err):
            facts["headline"] = (
                f"Replay reproduces the measured {facts['error_of']} within "
                f"{facts['median_error_pct']:.2f} % (median), {facts['worst_error_pct']:.2f} % "
                f"(worst) over {_count(len(err), facts['error_of'])}; "
                f"{facts['nodes']:,} nodes, {facts['edges']:,} edges"
            )
        tables = {"summary": self.summary, "steps": self.steps, "edges": self.edges,
                  "unmodelled": self.unmodelled, "deviations": self.deviations}  # fmt: skip
        if not np.isin(self.graph.nodes.kind, (DEVICE_START, DEVICE_END)).any():
            with_device = [c for c in STEP_COLUMNS if c.startswith("with_device")]
            tables["steps"] = self.steps.drop(columns=with_device)  # the host steps again
        ranks = list(self.graph.ranks.values())
        if None not in ranks and len(set(ranks)) == len(ranks):  # part says nothing more
            tables = {k: v.drop(columns="part", errors="ignore") for k, v in tables.items()}
        return Result(
            tables=tables,
            notes=list(self.notes), facts=facts,
            present={
                "summary": Presentation(title="simulated vs measured, per rank", all_rows=True,
                                        units=(("measured_ns", "ns"), ("simulated_ns", "ns"),
                                               ("error_pct", "%"), ("span_measured_ns", "ns"),
                                               ("span_simulated_ns", "ns"),
                                               ("span_error_pct", "%"))),
                "steps": Presentation(title="simulated vs measured, per step",
                                      units=(("measured_ns", "ns"), ("simulated_ns", "ns"),
                                             ("error_pct", "%"),
                                             ("with_device_measured_ns", "ns"),
                                             ("with_device_simulated_ns", "ns"),
                                             ("with_device_error_pct", "%"))),
                "edges": Presentation(title="replay graph: edges per kind", all_rows=True),
                "unmodelled": Presentation(title="what could not be modelled"),
                "deviations": Presentation(title="where the largest deviations arise",
                                           units=(("measured", "ts"), ("simulated", "ts"),
                                                  ("deviation_ns", "ns"))),
            },
        )  # fmt: skip


def replay(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    costs: str | CostModel = "measured",
    top: int = 20,
    align: str = "auto",
) -> Replay:
    """Replay ``trace`` (the ranks and steps selected; default all) with a cost model
    (``"measured"``: the identity replay) and compare it with what was measured. ``align``:
    how the ranks' clocks are aligned before their collectives are matched, as the comm
    tool's option (``auto``: none on one host, else ``end``; ``none``; ``end``)."""
    from xpuprof.analysis.comm.skew import ALIGN

    if align not in ALIGN:
        from xpuprof.core.errors import XpuprofError

        raise XpuprofError(f"align={align!r}: expected one of {', '.join(ALIGN)}")
    parts = replayed_parts(trace, ranks)
    windows = step_windows(trace, parts, steps)
    key = ("sim.replay_graph", tuple(parts), tuple(sorted(windows.items())), align)
    if key not in trace.memo:
        trace.memo[key] = replay_graph(trace, parts, windows, align)
    graph: ReplayGraph = trace.memo[key]
    delays = np.asarray(resolve(costs).delays(graph), np.int64)
    sched = run(graph, delays)
    return _compare(trace, graph, sched, top)


def run(graph: ReplayGraph, delays: np.ndarray | None = None,
        keep: np.ndarray | None = None) -> engine.Schedule:  # fmt: skip
    """Schedule ``graph`` with ``delays`` (default: its own) using only the edges ``keep``
    (a boolean mask; default all). Times on the aligned clock."""
    e = graph.edges
    d = e.delay if delays is None else np.asarray(delays, np.int64)
    keep = np.ones(len(e), bool) if keep is None else np.asarray(keep, bool)
    n = len(graph.nodes)
    chain = np.zeros(n, np.int64)
    along = e.timeline & keep
    chain[e.dst[along]] = d[along]
    cross = ~e.timeline & keep
    return engine.simulate(n, graph.timelines.first, chain, graph.aligned, e.src[cross],
                           e.dst[cross], d[cross])  # fmt: skip


def replayed_parts(trace: Trace, ranks: Iterable[int] | None) -> list[int]:
    """The parts of the ranks ``ranks`` (None: all); no such rank: an error naming them."""
    from xpuprof.core.errors import XpuprofError

    parts = [(int(s["part"]), s.get("rank")) for s in trace.sources]
    if ranks is None:
        return [p for p, _ in parts]
    want = {int(r) for r in ranks}
    out = [p for p, r in parts if r is not None and int(r) in want]
    if not out:
        have = sorted({r for _, r in parts if r is not None})
        raise XpuprofError(f"no rank {sorted(want)} in the store (ranks: {have or 'none'})")
    return out


def step_windows(
    trace: Trace, parts: list[int], steps: StepSelection
) -> dict[int, tuple[int, int]]:
    """Per part, the window of host start times of the selected steps (none: no window)."""
    from xpuprof.analysis.common import step_mode

    mode, numbers = step_mode(steps)
    if mode == "all":
        return {}
    df = trace.sql(
        "select part, step, ts, ts + dur as e from events where level = 'step' and part in "
        f"({', '.join(map(str, parts)) or 'null'}) order by part, ts"
    )
    out: dict[int, tuple[int, int]] = {}
    for p, g in df.groupby("part"):
        if mode == "list":
            g = g[g["step"].isin(numbers or [])]
        elif len(g) >= 2:
            g = g.iloc[:-1]
        if len(g):
            out[int(p)] = (int(g["ts"].min()), int(g["e"].max()))
        else:
            out[int(p)] = (1, 0)  # an empty window
    return out


def _event_info(trace: Trace, ids: np.ndarray) -> pd.DataFrame:
    """Names and places of the events ``ids`` (one join in DuckDB)."""
    import pyarrow as pa

    con = trace.con
    con.register("_xp_replay_ids", pa.table({"id": pa.array(ids, pa.int64())}))
    try:
        return trace.sql(
            "select e.id, e.part, e.rank, e.pid, e.tid, e.device, e.stream, e.level, "
            "e.category, e.name from events e join _xp_replay_ids i on e.id = i.id"
        )
    finally:
        con.unregister("_xp_replay_ids")


def _compare(trace: Trace, g: ReplayGraph, sched: engine.Schedule, top: int) -> Replay:
    nodes = g.nodes
    aligned = g.aligned
    off = nodes.time - aligned
    time = sched.time + off  # back on each part's own clock
    notes = list(g.notes)
    # steps: step spans replayed (their start and end nodes)
    step_ids = trace.sql(
        "select id, part, rank, step, name, dur from events where level = 'step' and part in "
        f"({', '.join(map(str, g.parts)) or 'null'})"
    )
    is_start = nodes.kind == HOST_START
    is_end = nodes.kind == HOST_END
    s_node = pd.Series(np.flatnonzero(is_start), index=nodes.event[is_start])
    e_node = pd.Series(np.flatnonzero(is_end), index=nodes.event[is_end])
    st = step_ids[step_ids["id"].isin(s_node.index)].copy()
    sn, en = s_node.reindex(st["id"]).to_numpy(), e_node.reindex(st["id"]).to_numpy()
    st["measured_ns"] = nodes.time[en] - nodes.time[sn]
    st["simulated_ns"] = sched.time[en] - sched.time[sn]
    st["error_pct"] = _pct(st["simulated_ns"], st["measured_ns"])
    dev_steps = _device_step_nodes(trace, g)
    _with_device(g, dev_steps, time, st, sn, en)
    st = st.sort_values(["part", "step"]).reset_index(drop=True)
    step_event_ids = st["id"].to_numpy(np.int64) if len(st) else np.empty(0, np.int64)
    steps = st[STEP_COLUMNS] if len(st) else pd.DataFrame(columns=STEP_COLUMNS)
    # per part: steps and span
    rows = []
    for p in g.parts:
        mine = nodes.part == p
        if not mine.any():
            continue
        ps = steps[steps["part"] == p]
        m_span = int(nodes.time[mine].max() - nodes.time[mine].min())
        s_span = int(time[mine].max() - time[mine].min())
        meas, sim = int(ps["measured_ns"].sum()), int(ps["simulated_ns"].sum())
        rows.append({"rank": g.ranks.get(p), "part": p, "steps": len(ps),
                     "measured_ns": meas if len(ps) else None,
                     "simulated_ns": sim if len(ps) else None,
                     "error_pct": _pct1(sim, meas) if len(ps) else None,
                     "span_measured_ns": m_span, "span_simulated_ns": s_span,
                     "span_error_pct": _pct1(s_span, m_span)})  # fmt: skip
    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    if len(summary):
        summary["rank"] = summary["rank"].astype("Int64")
    if not len(steps) and len(summary):
        notes.append("no profiler steps in the replayed window: errors are of each rank's span "
                     "(first start to last end)")  # fmt: skip
    counts = g.edge_counts()
    kinds = list(EDGE_KINDS) if len(nodes) else []  # nothing replayed: no table of zeros
    edges = pd.DataFrame({"kind": kinds, "edges": [counts[k] for k in kinds],
                          "meaning": [EDGE_MEANING[k] for k in kinds]})  # fmt: skip
    unmodelled = _unmodelled(trace, g)
    for cycle in sched.cycles:
        ev = sorted(
            {
                int(x)
                for e in cycle
                for x in (nodes.event[_cross(g)[0][e]], nodes.event[_cross(g)[1][e]])
                if x >= 0
            }
        )
        notes.append("a cycle in the recorded dependencies was cut (its cross edges left out): "
                     f"events {', '.join(map(str, ev[:20]))}")  # fmt: skip
    deviations = _deviations(trace, g, sched, aligned, top)
    return Replay(trace=trace, graph=g, time=time, steps=steps, summary=summary, edges=edges,
                  schedule=sched,
                  step_ids=step_event_ids, device_steps=dev_steps,
                  unmodelled=unmodelled, deviations=deviations, notes=notes)  # fmt: skip


def _device_step_nodes(trace: Trace, g: ReplayGraph) -> pd.DataFrame:
    """The end point of each replayed device work with a step (the store's ``step`` of a device
    event is its launch's): ``node``, ``part``, ``step``."""
    nodes = g.nodes
    dev_end = np.flatnonzero(nodes.kind == DEVICE_END)
    if not len(dev_end):
        return pd.DataFrame({"node": [], "part": [], "step": []}, dtype=np.int64)
    import pyarrow as pa

    ids = nodes.event[dev_end]
    trace.con.register("_xp_replay_dev", pa.table({"id": pa.array(ids, pa.int64())}))
    try:
        step_of = trace.sql("select e.id, e.step from events e join _xp_replay_dev d "
                            "on e.id = d.id where e.step is not null")  # fmt: skip
    finally:
        trace.con.unregister("_xp_replay_dev")
    node = pd.Series(dev_end, index=ids).reindex(step_of["id"]).to_numpy()
    return pd.DataFrame({"node": node, "part": nodes.part[node],
                         "step": step_of["step"].to_numpy(np.int64)})  # fmt: skip


def _with_device(g: ReplayGraph, dev_steps: pd.DataFrame, time: np.ndarray, st: pd.DataFrame,
                 sn: np.ndarray, en: np.ndarray) -> None:  # fmt: skip
    """Add each step's time up to the later of its host end and the end of the device work
    launched in it, measured and simulated: a device-bound step whose host never waits ends
    there, not at its host end."""
    nodes = g.nodes
    st["with_device_measured_ns"] = st["measured_ns"]
    st["with_device_simulated_ns"] = st["simulated_ns"]
    if len(dev_steps) and len(st):
        node = dev_steps["node"].to_numpy()
        per = pd.DataFrame({"part": dev_steps["part"], "step": dev_steps["step"],
                            "m": nodes.time[node], "s": time[node]})  # fmt: skip
        last = per.groupby(["part", "step"]).max()
        keys = pd.MultiIndex.from_arrays([st["part"], st["step"]])
        m_end = last["m"].reindex(keys).to_numpy(float)
        s_end = last["s"].reindex(keys).to_numpy(float)
        m0, s0 = nodes.time[sn], time[sn]
        st["with_device_measured_ns"] = np.fmax(nodes.time[en], m_end) - m0
        st["with_device_simulated_ns"] = np.fmax(time[en], s_end) - s0
    st["with_device_measured_ns"] = st["with_device_measured_ns"].astype("int64")
    st["with_device_simulated_ns"] = st["with_device_simulated_ns"].astype("int64")
    st["with_device_error_pct"] = _pct(st["with_device_simulated_ns"],
                                       st["with_device_measured_ns"])  # fmt: skip


def _count(n: int, what: str) -> str:
    """``3 steps``, ``1 step``, ``2 spans``."""
    return f"{n} {what if n != 1 else what.rstrip('s')}"


def _cross(g: ReplayGraph) -> tuple[np.ndarray, np.ndarray]:
    c = ~g.edges.timeline
    return g.edges.src[c], g.edges.dst[c]


def _pct(a: pd.Series, b: pd.Series) -> pd.Series:
    b = b.astype(float)
    return (100.0 * (a.astype(float) - b) / b.where(b > 0)).round(4)


def _pct1(a: int, b: int) -> float | None:
    return round(100.0 * (a - b) / b, 4) if b > 0 else None


def _unmodelled(trace: Trace, g: ReplayGraph) -> pd.DataFrame:
    u = g.unmodelled
    if u.empty:
        return pd.DataFrame(columns=UNMODELLED_COLUMNS)
    names = _event_info(trace, u["event"].to_numpy())[["id", "name"]]
    u = u.merge(names, left_on="event", right_on="id", how="left")
    u["rank"] = u["part"].map(g.ranks).astype("Int64")
    return u[UNMODELLED_COLUMNS].reset_index(drop=True)


def _deviations(trace: Trace, g: ReplayGraph, sched: engine.Schedule, aligned: np.ndarray,
                top: int) -> pd.DataFrame:  # fmt: skip
    """The points where a deviation from the measured timeline *arises* (its own deviation
    differs from that of the input that set it; points that only inherit one are left out),
    largest first, with that input."""
    nodes, e = g.nodes, g.edges
    n = len(nodes)
    dev = sched.time - aligned
    src, _dst = _cross(g)
    kinds = e.kind[~e.timeline]
    via = sched.via
    head = np.zeros(n, bool)
    head[g.timelines.first] = True
    chain_kind = np.full(n, -1)
    chain_kind[e.dst[e.timeline]] = e.kind[e.timeline]
    inp = np.where(via >= 0, src[np.maximum(via, 0)] if len(src) else -1,
                   np.where(head, -1, np.arange(n) - 1))  # fmt: skip
    own = dev - np.where(inp >= 0, dev[np.maximum(inp, 0)], 0)
    cand = np.flatnonzero((nodes.event >= 0) & (own != 0))
    pick = cand[np.argsort(-np.abs(dev[cand]), kind="stable")[:top]]
    if not len(pick):
        return pd.DataFrame(columns=DEVIATION_COLUMNS)
    cause = []
    for v in pick.tolist():
        if via[v] >= 0:
            s_ = src[via[v]]
            who = "a rendezvous" if nodes.event[s_] < 0 else f"event {int(nodes.event[s_])}"
            other = nodes.part[s_] >= 0 and nodes.part[s_] != nodes.part[v]
            cause.append(f"{EDGE_KINDS[kinds[via[v]]]} edge from {who}"
                         + (f" (part {int(nodes.part[s_])})" if other else ""))  # fmt: skip
        elif head[v]:
            cause.append("first point of its timeline")
        else:
            cause.append(f"its {EDGE_KINDS[chain_kind[v]]} edge (program order)")
    ev = nodes.event[pick]
    info = _event_info(trace, ev).drop_duplicates("id").set_index("id")
    is_start = np.isin(nodes.kind[pick], (HOST_START, DEVICE_START))
    return pd.DataFrame({
        "rank": pd.array([g.ranks.get(int(p)) for p in nodes.part[pick]], dtype="Int64"),
        "part": nodes.part[pick],
        "name": info["name"].reindex(ev).to_numpy(object),
        "level": info["level"].reindex(ev).to_numpy(object),
        "point": np.where(is_start, "start", "end"),
        "deviation_ns": dev[pick], "cause": cause,
        "measured": nodes.time[pick],
        "simulated": sched.time[pick] + (nodes.time[pick] - aligned[pick]),
        "event": ev,
    })  # fmt: skip

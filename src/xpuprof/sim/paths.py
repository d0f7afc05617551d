"""Critical paths through a replay's schedule, by category of work: what the what-if reports
as the path's shift (``docs/whatif.md``). A point's critical input is the one that set its
simulated time (the engine's ``via``: a cross edge, or its timeline predecessor); the path into
a point follows those inputs back."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.sim.graph import EDGE_KINDS, ReplayGraph

if TYPE_CHECKING:
    from xpuprof.sim import engine
    from xpuprof.sim.replay import Replay
    from xpuprof.trace.trace import Trace

#: Edge kinds → the category of work the critical path reports.
CATEGORY = {
    "host_work": "host", "host_gap": "host", "launch": "launch",
    "device_work": "device compute", "device_communication": "communication",
    "collective": "communication", "sync": "waiting", "stream_wait_event": "waiting",
    "stream_order": "waiting", "fwdbwd": "waiting", "handoff": "waiting",
}  # fmt: skip
CATEGORIES = ("host", "launch", "device compute", "communication", "waiting", "late start")


def critical_paths(g: ReplayGraph, base: Replay, before: engine.Schedule,
                   after: engine.Schedule, keep: np.ndarray,
                   after_graph: ReplayGraph | None = None) -> pd.DataFrame:  # fmt: skip
    """Per part, time per category on the critical path from the start of its first step to
    the end of its last (without steps: from its first point to its last), before and after
    the change (``after_graph``: the changed graph where a change rewired edges; same
    nodes)."""
    rows = []
    st = base.steps
    span: dict[int, tuple[int, int]] = {}
    if len(st):
        s_node, e_node = step_nodes(g, base.step_ids)
        parts, step = st["part"].to_numpy(), st["step"].to_numpy()
        for p in np.unique(parts).tolist():
            mine = np.flatnonzero(parts == p)
            span[p] = (int(s_node[mine[np.argmin(step[mine])]]),
                       int(e_node[mine[np.argmax(step[mine])]]))  # fmt: skip
    walk_before = Walk(g, before, np.ones(len(g.edges), bool))
    walk_after = Walk(after_graph or g, after, keep)
    for p in g.parts:
        if p not in span:
            mine = np.flatnonzero(g.nodes.part == p)
            if not len(mine):
                continue
            t = g.nodes.time[mine]
            span[p] = (int(mine[np.argmin(t)]), int(mine[np.argmax(t)]))
        a, z = span[p]
        b = walk_before.by_category(z, int(before.time[a]))
        c = walk_after.by_category(z, int(after.time[a]))
        for cat in CATEGORIES:
            rows.append({"rank": g.ranks.get(p), "part": p, "category": cat,
                         "baseline_ns": b.get(cat, 0), "predicted_ns": c.get(cat, 0),
                         "shift_ns": c.get(cat, 0) - b.get(cat, 0)})  # fmt: skip
    out = pd.DataFrame(rows, columns=["rank", "part", "category", "baseline_ns", "predicted_ns",
                                      "shift_ns"])  # fmt: skip
    out["rank"] = out["rank"].astype("Int64")
    return out


class Walk:
    """Critical paths through a schedule: each point's *setting input* (its cross edge, or its
    timeline predecessor; none at a timeline's first point) as flat arrays, made once."""

    def __init__(self, g: ReplayGraph, sched: engine.Schedule, keep: np.ndarray) -> None:
        e = g.edges
        cross = np.flatnonzero(~e.timeline & keep)
        n = len(g.nodes)
        head = np.zeros(n, bool)
        head[g.timelines.first] = True
        chain_kind = np.full(n, -1)
        chain_kind[e.dst[e.timeline]] = e.kind[e.timeline]
        via = sched.via
        by_cross = via >= 0
        pred = np.where(head, -1, np.arange(n) - 1)
        kind = chain_kind.copy()
        pred[by_cross] = e.src[cross[via[by_cross]]]
        kind[by_cross] = e.kind[cross[via[by_cross]]]
        self.time = sched.time
        self.pred = pred
        self.cat = np.array([CATEGORIES.index(CATEGORY[k]) for k in EDGE_KINDS] +
                            [CATEGORIES.index("waiting")])[kind]  # kind -1: waiting  # fmt: skip
        self.pred_list = pred.tolist()
        self.time_list = sched.time.tolist()

    def by_category(self, v: int, since: int) -> dict[str, int]:
        """Time per category on the critical path into point ``v`` back to the time ``since``
        (the last edge clipped there); a path that reaches the first point of a thread or
        stream (maybe another rank's, through a collective) later than ``since`` counts the
        rest as ``late start``. The categories sum to the time from ``since`` to ``v``."""
        pred, t = self.pred_list, self.time_list
        path = []
        while t[v] > since and pred[v] >= 0:
            path.append(v)
            v = pred[v]
        out: dict[str, int] = {}
        if path:
            p = np.asarray(path)
            span = self.time[p] - np.maximum(self.time[self.pred[p]], since)
            per = np.bincount(self.cat[p], span, minlength=len(CATEGORIES))
            out = {c: int(x) for c, x in zip(CATEGORIES, per, strict=True) if x}
        if t[v] > since:  # a thread or stream that began after ``since``
            out["late start"] = out.get("late start", 0) + t[v] - since
        return out


def step_nodes(g: ReplayGraph, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end points of the host events ``ids`` (step spans)."""
    n = g.nodes
    s = pd.Series(np.flatnonzero(n.kind == 0), index=n.event[n.kind == 0])
    e = pd.Series(np.flatnonzero(n.kind == 1), index=n.event[n.kind == 1])
    return s.reindex(ids).to_numpy(), e.reindex(ids).to_numpy()


JOB_PATH_COLUMNS = ["rank", "part", "category", "event", "start", "end", "ns"]


def job_path(rep: Replay) -> pd.DataFrame:
    """The critical path of the whole job through the identity replay's schedule: from the end
    of the last step to end on any rank (or its last point without steps) back to the start of
    the earliest first step, across ranks wherever a collective's rendezvous was set by its
    last participant. One row per segment, in time order: the ``rank``/``part`` whose timeline
    it lies on (a rendezvous is charged to the participant that arrived last), its
    ``category`` (:data:`CATEGORIES`), the ``event`` whose work it is (-1: none), ``start``
    and ``end`` (ns, the aligned clock) and ``ns``. Empty when nothing was replayed."""
    g, sched = rep.graph, rep.schedule
    if sched is None or not len(g.nodes):
        return pd.DataFrame(columns=JOB_PATH_COLUMNS)
    walk = Walk(g, sched, np.ones(len(g.edges), bool))
    e = g.edges
    n = len(g.nodes)
    event = np.full(n, -1, np.int64)
    event[e.dst[e.timeline]] = e.event[e.timeline]
    cross = np.flatnonzero(~e.timeline)
    by_cross = sched.via >= 0
    event[by_cross] = e.event[cross[sched.via[by_cross]]]
    if len(rep.steps):
        s_node, e_node = step_nodes(g, rep.step_ids)
        ok = (s_node >= 0) & (e_node >= 0)
        z = int(e_node[ok][np.argmax(sched.time[e_node[ok]])])
        since = int(sched.time[s_node[ok]].min())
    else:
        real = np.flatnonzero(g.nodes.part >= 0)
        z = int(real[np.argmax(sched.time[real])])
        since = int(sched.time[real].min())
    pred, t = walk.pred_list, walk.time_list
    path = []
    v = z
    while t[v] > since and pred[v] >= 0:
        path.append(v)
        v = pred[v]
    if not path:
        return pd.DataFrame(columns=JOB_PATH_COLUMNS)
    late = None
    if t[v] > since:  # the path begins on a timeline that started after the job did
        late = {"rank": g.ranks.get(int(g.nodes.part[v])), "part": int(g.nodes.part[v]),
                "category": "late start", "event": -1, "start": since, "end": t[v],
                "ns": t[v] - since}  # fmt: skip
    p = np.asarray(path[::-1])
    src = walk.pred[p]
    part = g.nodes.part[p].copy()
    virtual = part < 0  # a rendezvous: charged to the participant whose start set it
    part[virtual] = g.nodes.part[src[virtual]]
    start = np.maximum(sched.time[src], since)
    out = pd.DataFrame({
        "rank": pd.array([g.ranks.get(int(x)) for x in part], "Int64"), "part": part,
        "category": np.asarray(CATEGORIES, dtype=object)[walk.cat[p]],
        "event": event[p], "start": start, "end": sched.time[p],
    })  # fmt: skip
    out["ns"] = out["end"] - out["start"]
    out = out[out["ns"] > 0]
    if late is not None:
        out = pd.concat([pd.DataFrame([late]).astype({"rank": "Int64"}), out])
    return out.reset_index(drop=True)[JOB_PATH_COLUMNS]


def job_path_tables(
    rep: Replay, top: int = 10
) -> tuple[dict[str, pd.DataFrame], dict[str, object]]:
    """:func:`job_path` of the replay ``rep`` summarised by :func:`path_tables`."""
    return path_tables(job_path(rep), rep.trace, rep.graph.ranks, top)


def _named_events(seg: pd.DataFrame, trace: Trace, total: int, top: int) -> pd.DataFrame:
    """The ``top`` (rank, name, category) the path spends most time in, summed over their
    events (a job's path passes the same op once per step: one row, with ``count`` events
    and the longest one's time on the path, ``max_ns``). Names of the events on the path
    come from one query on their ids."""
    ev = seg[seg["event"] >= 0].groupby(["rank", "event", "category"], dropna=False)["ns"]
    ev = ev.sum().reset_index()
    ids = ", ".join(map(str, ev["event"].unique().tolist())) or "null"
    names = trace.sql(f"select id as event, name from events where id in ({ids})")
    ev = ev.merge(names, on="event", how="left")
    ev["name"] = ev["name"].astype(object).where(ev["name"].notna(), "(unnamed)")
    out = ev.groupby(["rank", "name", "category"], dropna=False).agg(
        time_ns=("ns", "sum"), count=("ns", "size"), max_ns=("ns", "max")
    )
    out = out.reset_index().sort_values(["time_ns", "rank"], ascending=[False, True]).head(top)
    out["share_pct"] = 100 * out["time_ns"] / total
    return out.reset_index(drop=True)


def path_tables(
    seg: pd.DataFrame, trace: Trace, ranks: dict[int, int | None], top: int = 10
) -> tuple[dict[str, pd.DataFrame], dict[str, object]]:
    """The job's critical path ``seg`` (:data:`JOB_PATH_COLUMNS`: the whole replay's
    :func:`job_path`, or the partitioned ``sim.job_parts.job_path_parts``) summarised:
    ``path`` (per rank and category: ns on the job's critical path and its share of the
    path), ``path_events`` (the ``top`` ops, kernels and other events by rank and name
    that the path spends most time in, :func:`_named_events`), ``path_ranks`` (the path as
    runs of one rank: where it crosses to another rank through a collective), and facts
    ``path_ns``, ``path_rank`` (the rank holding most of it; ``ranks``: part → rank),
    ``path_rank_share`` (%), ``path_crossings``."""
    if seg.empty:
        return {}, {}
    total = int(seg["ns"].sum())
    per = seg.groupby(["rank", "part", "category"], dropna=False)["ns"].sum().reset_index()
    per["share_pct"] = 100 * per["ns"] / total
    per = per.sort_values("ns", ascending=False).reset_index(drop=True)
    ev = _named_events(seg, trace, total, top)
    change = np.r_[True, seg["part"].to_numpy()[1:] != seg["part"].to_numpy()[:-1]]
    run = np.cumsum(change) - 1
    runs = seg.groupby(run).agg(rank=("rank", "first"), part=("part", "first"),
                                start=("start", "min"), end=("end", "max"),
                                ns=("ns", "sum"))  # fmt: skip
    by_rank = per.groupby("part")["ns"].sum().sort_values(ascending=False)
    top_part = int(by_rank.index[0])
    facts: dict[str, object] = {
        "path_ns": total,
        "path_rank": ranks.get(top_part),
        "path_rank_share": round(100 * float(by_rank.iloc[0]) / total, 1),
        "path_crossings": int(len(runs) - 1),
    }
    per = per.rename(columns={"ns": "time_ns"})
    runs = runs.rename(columns={"ns": "time_ns"}).reset_index(drop=True)
    return {
        "path": per[["rank", "part", "category", "time_ns", "share_pct"]],
        "path_events": ev[["rank", "name", "category", "time_ns", "share_pct", "count", "max_ns"]],
        "path_ranks": runs,
    }, facts

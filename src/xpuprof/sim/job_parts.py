"""The job's critical path (:func:`xpuprof.sim.paths.job_path`) computed part by part, so that
no process holds more than one rank's replay graph (``docs/replay.md``, "hundreds of ranks").

The whole-job identity replay couples the ranks only through the rendezvous of their matched
collectives: a rendezvous's time is the latest of its participants' simulated starts, and each
participant's end is the rendezvous + the transfer time. The simulated starts are not the
measured ones (a collective's end is modelled, so what follows it moves by a few µs), so the
partition solves the coupling exactly, in three rounds:

1. *Plan* (this process, small tables): the comm tool's matched collectives and clock offsets,
   as :func:`xpuprof.sim.collectives.add_collectives` uses them: per collective key
   (process group # position) its participants, its last one by aligned measured start
   (ties as ``_rendezvous`` breaks them), the transfer time (that one's duration).
2. *Terms* (a task per group of parts, :func:`part_terms`; each part's graph built in
   turn): the part's replay graph alone, each
   rendezvous a free variable ``R_k``; one pass of the engine's order over the graph with a
   vector per point gives every collective start and step start/end of the part as
   ``max(c, max_k R_k + L_k)`` (max-plus: ``c`` the time set by the part's own pinned starts,
   ``L_k`` the longest path from rendezvous k, none where none leads there).
3. *Solve* (this process): ``R_k`` = the latest of its participants' starts, in the order of
   the keys' dependencies (Kahn over keys; a cycle across ranks: no partitioned answer). This
   is the whole replay's schedule at every rendezvous, so ``since`` (the earliest simulated
   first-step start) and the step end that ends last are known too.
4. *Walks* (the parts that set a rendezvous or hold the last step end, by groups: no other part
   can be on the path; :func:`part_walks`): the part's graph with each rendezvous fed
   by its own starts and a pinned node at the solved ``R_k``: its identity replay is the job
   replay's schedule on that part. Walks back (as :class:`~xpuprof.sim.paths.Walk`) from the
   last step end (the part holding it) and from each start that set a rendezvous, each until a
   rendezvous (a jump to the participant that set it), ``since`` or a timeline head (a late
   start); each returns its segments (small).
5. *Stitch* (this process): from the last step end, following the jumps, into
   :data:`~xpuprof.sim.paths.JOB_PATH_COLUMNS`: the same rows as the whole replay's.

Stores with host collectives (gloo spans and their hand-off edges) are not partitioned
(:class:`NotPartitioned`); nor are traces without profiler steps.

Length: the five rounds are one algorithm over one data layout (the plan's keys, the terms'
columns), each round reading what the one before wrote; apart they would share it by import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.core.errors import XpuprofError
from xpuprof.sim.paths import CATEGORIES, JOB_PATH_COLUMNS, Walk, step_nodes

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from xpuprof.analysis.common import StepSelection
    from xpuprof.sim.graph import ReplayGraph
    from xpuprof.trace.trace import Trace

#: The memo entry of a task's seeds (``analysis/per_rank.py``): part → its plan and clock.
SEED = ("sim.job_parts", "seed")
#: "No path": a time before every real one (the engine's value of no input).
NONE = np.iinfo(np.int64).min // 4
_LOW = NONE // 2  # anything below was built on NONE
#: The per-point vectors of :func:`terms` are computed in blocks of at most this many
#: anchors × columns (int64: 8 bytes each), bounding a task's memory whatever the collectives.
BLOCK_CELLS = 20_000_000


class NotPartitioned(XpuprofError):
    """The job path cannot be computed part by part for this store (the reason says why)."""


def job_path_parts(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    align: str = "auto",
    workers: int | None = None,
    scheduler: str | None = None,
) -> pd.DataFrame:
    """The job's critical path (:func:`xpuprof.sim.paths.job_path` of the identity replay of
    the same ranks and steps), one Dask task per group of parts (module docstring). Raises
    :class:`NotPartitioned` where that is not possible."""
    from xpuprof.sim.replay import replayed_parts, step_windows

    parts = replayed_parts(trace, ranks)
    windows = step_windows(trace, parts, steps)
    offsets, rows = plan(trace, parts, windows, align)
    keys = rows.drop_duplicates("key").set_index("key")

    def seed(p: int, arrival: pd.Series | None, **more: Any) -> dict[Any, Any]:
        mine = rows[rows["part"] == p]
        pl = mine[["id", "key"]].assign(
            transfer_ns=keys["transfer_ns"].reindex(mine["key"]).to_numpy(np.int64),
            rendezvous_ns=keys["rendezvous_ns"].reindex(mine["key"]).to_numpy(np.int64),
        )
        pl["arrival_ns"] = (pl["rendezvous_ns"] if arrival is None
                            else arrival.reindex(pl["key"]).to_numpy(np.int64))  # fmt: skip
        return {"offset": int(offsets.get(p, 0)), "plan": pl.reset_index(drop=True),
                "window": windows.get(p), "align": align, **more}  # fmt: skip

    terms = _by_groups(trace, "part_terms", {p: seed(p, None) for p in parts}, workers,
                       scheduler)  # fmt: skip
    solved = solve(rows, terms)
    st = solved["setters"]
    # only the parts that set a rendezvous or hold the last step end can be on the path
    on_path = sorted({int(p) for p in st["setter_part"]} | {solved["z_part"]})
    walks = _by_groups(trace, "part_walks",
                       {p: seed(p, solved["rendezvous"],
                                setters=st[st["setter_part"] == p]["setter"].tolist(),
                                since=solved["since"],
                                z=solved["z"] if solved["z_part"] == p else None)
                        for p in on_path}, workers, scheduler)  # fmt: skip
    ranks_of = {int(s["part"]): s.get("rank") for s in trace.sources}
    return stitch(walks, solved, ranks_of)


def _by_groups(trace: Trace, target: str, seeds: dict[int, dict[str, Any]],
               workers: int | None, scheduler: str | None) -> dict[int, Any]:  # fmt: skip
    """``target`` (:func:`part_terms` or :func:`part_walks`) of the parts ``seeds`` holds, a
    task per group of parts (``analysis.per_rank.map_groups``), each seeded with its parts'
    seeds; part → answer."""
    from xpuprof.analysis.per_rank import map_groups

    got = map_groups(
        trace,
        f"{__name__}:{target}",
        sorted(seeds),
        workers=workers,
        scheduler=scheduler,
        seeds=lambda groups: [{SEED: {p: seeds[p] for p in g}} for g in groups],
    )
    return {p: answer for group in got for p, answer in group.items()}


# -- 1. plan -------------------------------------------------------------------------------------


def plan(
    trace: Trace, parts: list[int], windows: dict[int, tuple[int, int]], align: str
) -> tuple[dict[int, int], pd.DataFrame]:
    """Clock offsets per part and the matched collectives the replay graph of ``parts`` has:
    one row per participant (``id``, ``part``, ``key``, ``astart``: aligned measured start,
    ``transfer_ns`` and ``rendezvous_ns`` of its key: the duration and aligned start of the
    key's last participant), in the order ``_rendezvous`` sorts them (key, aligned start,
    part, then the graph's own order), as :func:`~xpuprof.sim.collectives.add_collectives`
    and :func:`~xpuprof.sim.build.build` decide them."""
    from xpuprof.analysis.comm.host import host_collective_ids
    from xpuprof.sim.collectives import match_collectives

    hc = host_collective_ids(trace)
    if len(hc) and hc["part"].isin(parts).any():
        raise NotPartitioned("the store has host collectives (gloo or c10d spans), whose "
                             "hand-offs are replayed in one process only")  # fmt: skip
    ours = graph_collectives(trace, parts, windows)
    cols = ["id", "part", "key", "astart", "transfer_ns", "rendezvous_ns"]
    if ours.empty:
        return {p: 0 for p in parts}, pd.DataFrame(columns=cols)
    m, offsets = match_collectives(trace, parts, ours, align)
    m = m[m["matched"].to_numpy(bool)].copy()
    m["astart"] = m["ts"].to_numpy(np.int64) - m["part"].map(offsets).to_numpy(np.int64)
    m = m.sort_values(["key", "astart", "part"], kind="stable")
    last = m.groupby("key", sort=True).tail(1).set_index("key")
    m["transfer_ns"] = last["dur"].reindex(m["key"]).to_numpy(np.int64)
    m["rendezvous_ns"] = last["astart"].reindex(m["key"]).to_numpy(np.int64)
    return offsets, m[cols].reset_index(drop=True)


def graph_collectives(
    trace: Trace, parts: list[int], windows: dict[int, tuple[int, int]]
) -> pd.DataFrame:
    """The collective kernels the replay graph of ``parts`` holds (``sim/build.py``: device
    work of the replayed levels, launched by a runtime call in the part's window, or without
    a launch, starting in it): ``id``, ``part``, ``ts``, ``dur`` (≥ 0), in the graph's order
    (part, device, stream, start, id)."""
    from xpuprof.sim.build import DEVICE_SQL, HOST_SQL

    sql = ", ".join(map(str, parts)) or "null"
    dev = DEVICE_SQL.replace("{parts}", sql).split(" order by ")[0]
    host = HOST_SQL.replace("{parts}", sql).split(" order by ")[0]
    df = trace.sql(
        f"with d as ({dev}), h as ({host}), "
        "c as (select part, correlation, arg_min(ts, id) as call_ts from h "
        "where is_runtime and correlation is not null and correlation >= 0 "
        "group by part, correlation) "
        "select d.id, d.part, d.device, d.stream, d.t as ts, greatest(d.dur, 0) as dur, "
        "c.call_ts from d left join c on d.part = c.part and d.correlation = c.correlation "
        "where d.comm order by d.part, d.device, d.stream, d.t, d.id"
    )
    if windows and len(df):
        lo = df["part"].map(lambda p: windows.get(int(p), (None, None))[0])
        hi = df["part"].map(lambda p: windows.get(int(p), (None, None))[1])
        when = df["call_ts"].where(df["call_ts"].notna(), df["ts"])
        inside = lo.isna() | ((when >= lo) & (when <= hi))
        df = df[inside.to_numpy(bool)]
    return df[["id", "part", "ts", "dur"]].reset_index(drop=True)


# -- 2. terms (a task) ---------------------------------------------------------------------------


def _each_part(trace: Trace, one: Callable[..., dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """``one(trace, part, seed, fetched, steps)`` for each part seeded in the task's memo (a
    group of parts: ``analysis.per_rank.map_groups``), keyed by part: the rows the replay
    graphs are built of (``sim.build.fetch_parts``) and the step spans are queried once for
    the group, each part's graph is built alone, one after another (a task holds one replay
    graph at a time). Per part, opening the store and querying its one small file cost as
    much as building its graph."""
    from xpuprof.sim.build import fetch_parts

    seeds = trace.memo[SEED]
    parts = sorted(seeds)
    fetched = fetch_parts(trace, parts)
    steps = trace.sql("select id, step, part from events where level = 'step' and part in "
                      f"({', '.join(map(str, parts))})")  # fmt: skip
    return {p: one(trace, p, seeds[p], fetched, steps) for p in parts}


def _graph(trace: Trace, part: int, seed: dict[str, Any],
           fetched: tuple[pd.DataFrame, ...]) -> ReplayGraph:  # fmt: skip
    from xpuprof.sim.build import build

    window = seed["window"]
    return build(trace, [part], {part: window} if window else None, seed["align"],
                 plan=(seed["offset"], seed["plan"]), fetched=fetched)  # fmt: skip


def _rendezvous_nodes(g: ReplayGraph, keys: np.ndarray) -> np.ndarray:
    """The rendezvous node of each key, in ``keys`` order (``add_planned`` adds them first,
    in its plan's key order, then the foreign nodes)."""
    from xpuprof.sim.graph import RENDEZVOUS

    rz = np.flatnonzero(g.nodes.kind == RENDEZVOUS)
    return rz[: len(keys)]


def part_terms(trace: Trace) -> dict[int, dict[str, Any]]:
    """Per part of the task: its collective starts and step starts/ends as max-plus terms of
    its rendezvous (module docstring, round 2): ``keys`` (the columns after ``c``), ``coll``
    (the plan's collective ids), ``steps`` (``id``, ``step``, ``part`` of its replayed step
    spans) and the terms of their starts (those collectives', then the steps' starts, then
    their ends), pruned (:func:`prune`) and sparse (:func:`sparse`)."""
    return _each_part(trace, _terms)


def _terms(trace: Trace, part: int, seed: dict[str, Any], fetched: tuple[pd.DataFrame, ...],
           steps: pd.DataFrame) -> dict[str, Any]:  # fmt: skip
    from xpuprof.sim.graph import COLLECTIVE

    plan = seed["plan"]
    keys = pd.unique(plan["key"]) if len(plan) else np.empty(0, object)
    g = _graph(trace, part, seed, fetched)
    rz = _rendezvous_nodes(g, keys)
    n = g.nodes
    # the starts that feed each rendezvous (collective edges into it)
    e = g.edges
    into = (e.kind == COLLECTIVE) & np.isin(e.dst, rz) & (n.part[e.src] >= 0)
    start_of = pd.Series(e.src[into], index=n.event[e.src[into]])
    start_of = start_of[~start_of.index.duplicated()]
    coll = plan["id"].to_numpy(np.int64)
    c_nodes = start_of.reindex(coll).to_numpy()
    if np.isnan(c_nodes.astype(float)).any():
        raise XpuprofError(f"part {part}: a planned collective is not in its replay graph")
    st = steps.loc[steps["part"].to_numpy() == part, ["id", "step"]].reset_index(drop=True)
    s_n, e_n = step_nodes(g, st["id"].to_numpy(np.int64))
    ok = ~(np.isnan(s_n.astype(float)) | np.isnan(e_n.astype(float)))
    st = st[ok].reset_index(drop=True)
    s_n, e_n = s_n[ok].astype(np.int64), e_n[ok].astype(np.int64)
    targets = np.r_[c_nodes.astype(np.int64), s_n, e_n]
    key_col = pd.Series(np.arange(len(keys)), index=keys).reindex(plan["key"]).to_numpy()
    t = prune(terms(g, rz, targets), key_col.astype(np.int64))
    return {"part": part, "keys": list(keys), "coll": coll, "steps": st.assign(part=part),
            **sparse(t)}  # fmt: skip


def prune(t: np.ndarray, key_col: np.ndarray) -> np.ndarray:
    """``t`` (:func:`terms`; its first ``len(key_col)`` rows the part's own collective
    starts, of the keys ``key_col``) without the terms another always bounds: the part's own
    start i of key k' comes at least L_i(k) after R_k, and R_k' ≥ that start, so
    R_k + L_j(k) ≤ R_k' + L_j(k') whenever L_i(k) + L_j(k') ≥ L_j(k). Such a k precedes k'
    (a path leads from R_k to R_k'), so the latest of a chain is kept and the solve's values do
    not change; what is left is mostly each target's latest rendezvous (the returned terms, and
    the calling process's memory, grow with the collectives, not their square)."""
    m, k = len(key_col), t.shape[1] - 1
    if not m or not k:
        return t
    L = t[:, 1:]
    own = L[:m]  # own[i, k]: from R_k to the part's own start i
    out = t.copy()
    rows = max(1, BLOCK_CELLS // (m * k))
    for j0 in range(0, len(L), rows):
        blk = L[j0 : j0 + rows]
        best = (blk[:, key_col][:, :, None] + own[None, :, :]).max(axis=1)
        out[j0 : j0 + rows, 1:][(blk > _LOW) & (best > _LOW) & (best >= blk)] = NONE
    return out


def sparse(t: np.ndarray) -> dict[str, np.ndarray]:
    """Terms rows as ``c`` and, per row ``i``, the columns ``col[ptr[i]:ptr[i + 1]]`` (0 =
    the first rendezvous) with a path and its length ``val``."""
    have = t[:, 1:] > _LOW
    r, c = np.nonzero(have)
    ptr = np.r_[0, np.cumsum(have.sum(axis=1))].astype(np.int64)
    return {"c": t[:, 0].copy(), "ptr": ptr, "col": c.astype(np.int64),
            "val": t[:, 1:][r, c]}  # fmt: skip


def terms(g: ReplayGraph, sources: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Max-plus terms of the identity replay's time at ``targets`` (node numbers) in the
    nodes ``sources`` (free variables: their inputs are ignored): row i is ``[c, L_0, …]``,
    time = max(c, max_j source_j + L_j), :data:`NONE` where no path leads. The engine's
    order (``sim/engine.py``: anchors in a topological order, a prefix sum between them),
    one vector per anchor, in blocks of columns of at most :data:`BLOCK_CELLS` cells."""
    e = g.edges
    n = len(g.nodes)
    d = e.delay
    chain = np.zeros(n, np.int64)
    chain[e.dst[e.timeline]] = d[e.timeline]
    is_src = np.zeros(n, bool)
    is_src[sources] = True
    cross = ~e.timeline & ~is_src[e.dst]
    src, dst, delay = e.src[cross], e.dst[cross], d[cross]
    first = g.timelines.first
    head = np.zeros(n, bool)
    head[first] = True
    has_in = np.zeros(n, bool)
    has_in[dst] = True
    anchors = np.flatnonzero(head | has_in)
    a_of = np.cumsum(head | has_in) - 1
    prefix = np.cumsum(np.where(head, 0, chain).astype(np.int64))
    n_a = len(anchors)
    e_src_a = a_of[src]
    e_off = (prefix[src] - prefix[anchors[e_src_a]] + delay).tolist()
    e_dst_a = a_of[dst]
    order = _topo(n_a, head[anchors], e_src_a, e_dst_a)
    step = np.r_[prefix[anchors[1:]] - prefix[anchors[:-1]], 0].tolist()
    same_prev = np.r_[False, ~head[anchors[1:]]].tolist()
    by_dst = np.argsort(e_dst_a, kind="stable")
    lo = np.searchsorted(e_dst_a[by_dst], np.arange(n_a), "left").tolist()
    hi = np.searchsorted(e_dst_a[by_dst], np.arange(n_a), "right").tolist()
    by_dst_l, e_src_l = by_dst.tolist(), e_src_a.tolist()
    pinned = head[anchors] & ~has_in[anchors]
    start = g.aligned[anchors]
    src_col = np.full(n_a, -1)
    src_col[a_of[sources]] = np.arange(len(sources))
    t_a = a_of[targets]
    t_off = prefix[targets] - prefix[anchors[t_a]]
    k = len(sources)
    out = np.full((len(targets), 1 + k), NONE, np.int64)
    width = max(1, BLOCK_CELLS // max(n_a, 1) - 1)
    for c0 in range(0, max(k, 1), width):
        cols = np.arange(c0, min(k, c0 + width))
        w = 1 + len(cols)
        col_of = np.full(k, -1)
        col_of[cols] = 1 + np.arange(len(cols))
        val = np.full((n_a, w), NONE, np.int64)
        for a in order:
            if same_prev[a]:
                best = val[a - 1] + step[a - 1]
            else:
                best = np.full(w, NONE, np.int64)
                if src_col[a] >= 0:
                    if col_of[src_col[a]] > 0:
                        best[col_of[src_col[a]]] = 0
                elif pinned[a]:
                    best[0] = start[a]
            for j in range(lo[a], hi[a]):
                x = by_dst_l[j]
                np.maximum(best, val[e_src_l[x]] + e_off[x], out=best)
            val[a] = best
        got = val[t_a] + t_off[:, None]
        got[got < _LOW] = NONE
        out[:, 0] = got[:, 0]
        out[:, 1 + cols] = got[:, 1:]
    return out


def _topo(n_a: int, head: np.ndarray, e_src_a: np.ndarray, e_dst_a: np.ndarray) -> list[int]:
    """Anchors in a topological order (Kahn): each after its timeline predecessor and the
    sources of its cross inputs. A cycle: :class:`NotPartitioned` (the whole replay cuts it)."""
    indeg = (~head).astype(np.int64) + np.bincount(e_dst_a, minlength=n_a)
    by_src = np.argsort(e_src_a, kind="stable")
    lo = np.searchsorted(e_src_a[by_src], np.arange(n_a), "left").tolist()
    hi = np.searchsorted(e_src_a[by_src], np.arange(n_a), "right").tolist()
    nxt = np.r_[~head[1:], False].tolist()
    dst_l, by_src_l, deg = e_dst_a.tolist(), by_src.tolist(), indeg.tolist()
    ready = [a for a in range(n_a - 1, -1, -1) if deg[a] == 0]
    order = []
    while ready:
        a = ready.pop()
        order.append(a)
        if nxt[a]:
            deg[a + 1] -= 1
            if deg[a + 1] == 0:
                ready.append(a + 1)
        for j in range(lo[a], hi[a]):
            m = dst_l[by_src_l[j]]
            deg[m] -= 1
            if deg[m] == 0:
                ready.append(m)
    if len(order) < n_a:
        raise NotPartitioned("a cycle in a rank's recorded dependencies (the whole replay "
                             "cuts it)")  # fmt: skip
    return order


# -- 3. solve ------------------------------------------------------------------------------------


def solve(rows: pd.DataFrame, terms: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Every rendezvous's time (the latest start of its participants, in the keys' dependency
    order), the participant that set it (the first in ``rows``' order among the latest: the
    engine's tie rule over the rendezvous inputs), ``since`` and the last step end."""
    keys = sorted(set(rows["key"])) if len(rows) else []
    kix = {k: i for i, k in enumerate(keys)}
    R = np.full(len(keys), NONE, np.int64)
    # per participant row: its part's terms row and the global index of its columns
    where: dict[int, tuple[int, int]] = {}
    gcols: dict[int, np.ndarray] = {}
    for p, t in terms.items():
        gcols[p] = np.array([kix[k] for k in t["keys"]], np.int64)
        for i, cid in enumerate(t["coll"].tolist()):
            where[int(cid)] = (p, i)
    deps: list[set[int]] = [set() for _ in keys]
    members: list[list[int]] = [[] for _ in keys]
    for cid, key in zip(rows["id"].tolist(), rows["key"].tolist(), strict=True):
        k = kix[key]
        members[k].append(int(cid))
        p, i = where[int(cid)]
        t = terms[p]
        deps[k].update(gcols[p][t["col"][t["ptr"][i] : t["ptr"][i + 1]]].tolist())
    order = _key_order(deps)
    start = {}
    for k in order:
        for cid in members[k]:
            p, i = where[cid]
            start[cid] = term_value(terms[p], i, R, gcols[p])
        R[k] = max(start[c] for c in members[k])
    setter_id = [next(c for c in members[k] if start[c] == R[k]) for k in range(len(keys))]
    part_of = rows.set_index("id")["part"]
    setters = pd.DataFrame({"key": keys, "setter": setter_id,
                            "setter_part": part_of.reindex(setter_id).to_numpy()})  # fmt: skip
    steps = []
    for p, t in terms.items():
        st = t["steps"]
        if not len(st):
            continue
        k0, ns = len(t["coll"]), len(st)
        s_t = [term_value(t, k0 + i, R, gcols[p]) for i in range(ns)]
        e_t = [term_value(t, k0 + ns + i, R, gcols[p]) for i in range(ns)]
        steps.append(st.assign(s=np.array(s_t, np.int64), e=np.array(e_t, np.int64)))
    if not steps:
        raise NotPartitioned("no profiler step was replayed")
    st = pd.concat(steps).sort_values(["part", "step"], kind="stable").reset_index(drop=True)
    z = int(np.argmax(st["e"].to_numpy()))
    return {"rendezvous": pd.Series(R, index=keys), "setters": setters,
            "since": int(st["s"].min()), "z": int(st["id"].iloc[z]),
            "z_part": int(st["part"].iloc[z])}  # fmt: skip


def term_value(t: dict[str, Any], i: int, R: np.ndarray, gcols: np.ndarray) -> int:
    """``max(c, max_j R_j + L_j)`` of row ``i`` of a part's terms (:func:`sparse`)."""
    a, b = t["ptr"][i], t["ptr"][i + 1]
    best = int(t["c"][i])
    if b > a:
        best = max(best, int((R[gcols[t["col"][a:b]]] + t["val"][a:b]).max()))
    return best


def _key_order(deps: list[set[int]]) -> list[int]:
    """Keys after the keys their participants' starts depend on (Kahn); a cycle across ranks:
    :class:`NotPartitioned`."""
    users: list[list[int]] = [[] for _ in deps]
    indeg = [0] * len(deps)
    for k, ds in enumerate(deps):
        for j in ds:
            if j == k:
                raise NotPartitioned("a collective's start depends on its own rendezvous")
            users[j].append(k)
            indeg[k] += 1
    ready = [k for k in range(len(deps) - 1, -1, -1) if indeg[k] == 0]
    order = []
    while ready:
        k = ready.pop()
        order.append(k)
        for m in users[k]:
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    if len(order) < len(deps):
        raise NotPartitioned("the collectives' dependencies across ranks form a cycle (the "
                             "whole replay cuts it)")  # fmt: skip
    return order


# -- 4. walks (a task) ---------------------------------------------------------------------------


def part_walks(trace: Trace) -> dict[int, dict[str, Any]]:
    """Per part of the task, its stretches of the job's critical path (module docstring,
    round 4): per entry (``"z"``: the last step end, if this part holds it; a collective id:
    its start, where it set its rendezvous) the segments back to a rendezvous, ``since`` or a
    timeline head, and how the walk ended (``("jump", key)``, ``("since",)`` or
    ``("late", time)``)."""
    return _each_part(trace, _walks)


def _walks(trace: Trace, part: int, seed: dict[str, Any], fetched: tuple[pd.DataFrame, ...],
           steps: pd.DataFrame) -> dict[str, Any]:  # fmt: skip
    from xpuprof.sim.replay import run

    plan, since, z = seed["plan"], seed["since"], seed["z"]
    keys = pd.unique(plan["key"]) if len(plan) else np.empty(0, object)
    g = _graph(trace, part, seed, fetched)
    sched = run(g)
    rz = _rendezvous_nodes(g, keys)
    want = plan.drop_duplicates("key").set_index("key")["arrival_ns"].reindex(keys)
    if len(rz) and not np.array_equal(sched.time[rz], want.to_numpy(np.int64)):
        raise XpuprofError(f"part {part}: a rendezvous moved from its solved time (a bug: the "
                           "partitioned job path would differ from the whole replay)")  # fmt: skip
    walk = Walk(g, sched, np.ones(len(g.edges), bool))
    e = g.edges
    event = np.full(len(g.nodes), -1, np.int64)
    event[e.dst[e.timeline]] = e.event[e.timeline]
    cross = np.flatnonzero(~e.timeline)
    by_cross = sched.via >= 0
    event[by_cross] = e.event[cross[sched.via[by_cross]]]
    key_of = dict(zip(rz.tolist(), list(keys), strict=True))
    entries: dict[Any, Any] = {}
    if z is not None:
        _, ze = step_nodes(g, np.array([z], np.int64))
        entries["z"] = _walk(walk, event, int(ze[0]), since, key_of, part)
    if seed["setters"]:
        from xpuprof.sim.graph import COLLECTIVE

        into = (e.kind == COLLECTIVE) & np.isin(e.dst, rz) & (g.nodes.part[e.src] >= 0)
        start_of = pd.Series(e.src[into], index=g.nodes.event[e.src[into]])
        start_of = start_of[~start_of.index.duplicated()]
        for cid in seed["setters"]:
            v = int(start_of[int(cid)])
            entries[int(cid)] = _walk(walk, event, v, since, key_of, part)
    return {"part": part, "entries": entries}


def _walk(walk: Walk, event: np.ndarray, v: int, since: int, key_of: dict[int, Any],
          part: int) -> tuple[pd.DataFrame, tuple]:  # fmt: skip
    """Segments (``job_path``'s rows, time order) from point ``v`` back until a rendezvous,
    ``since`` or a head, and how it ended."""
    pred, t = walk.pred_list, walk.time_list
    path = []
    end: tuple = ("since",)
    while t[v] > since:
        if v in key_of:
            end = ("jump", key_of[v])
            break
        if pred[v] < 0:
            end = ("late", int(t[v]))
            break
        path.append(v)
        v = pred[v]
    p = np.asarray(path[::-1], np.int64)
    src = walk.pred[p]
    start = np.maximum(walk.time[src], since)
    seg = pd.DataFrame({"part": np.full(len(p), part, np.int64),
                        "category": np.asarray(CATEGORIES, dtype=object)[walk.cat[p]],
                        "event": event[p], "start": start, "end": walk.time[p]})  # fmt: skip
    return seg, end


# -- 5. stitch -----------------------------------------------------------------------------------


def stitch(walks: dict[int, dict[str, Any]], solved: dict[str, Any],
           ranks_of: dict[int, int | None]) -> pd.DataFrame:  # fmt: skip
    """The job path's rows from the tasks' stretches: from the last step end back along the
    jumps (module docstring, round 5)."""
    setters = solved["setters"].set_index("key")
    pieces = []
    part = solved["z_part"]
    seg, end = walks[part]["entries"]["z"]
    pieces.append(seg)
    late = None
    for _ in range(len(setters) + 1):
        if end[0] != "jump":
            break
        s = setters.loc[end[1]]
        part = int(s["setter_part"])
        seg, end = walks[part]["entries"][int(s["setter"])]
        pieces.append(seg)
    else:
        raise XpuprofError("the job path's stretches do not end (a bug)")
    if end[0] == "late":
        late = {"part": part, "category": "late start",
                "event": -1, "start": solved["since"], "end": end[1]}  # fmt: skip
    rows = [p for p in pieces[::-1] if len(p)]
    out = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(
        columns=["part", "category", "event", "start", "end"])  # fmt: skip
    if late is not None:
        out = pd.concat([pd.DataFrame([late]), out], ignore_index=True)
    if out.empty:
        return pd.DataFrame(columns=JOB_PATH_COLUMNS)
    out["ns"] = out["end"] - out["start"]
    out = out[(out["ns"] > 0) | (out["category"] == "late start")]
    out["rank"] = pd.array([ranks_of.get(int(x)) for x in out["part"]], "Int64")
    for c in ("part", "event", "start", "end", "ns"):
        out[c] = out[c].astype(np.int64)
    return out.reset_index(drop=True)[JOB_PATH_COLUMNS]

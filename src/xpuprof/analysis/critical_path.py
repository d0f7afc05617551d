"""Critical path: the longest chain of dependent work through host and device events.

The graph is HTA's (``hta/analyzers/critical_path_analysis.py``, 0.5.0), built with numpy from
the events table. Each host op or runtime call (``dur > 0``) starting in the window, and each
device activity one of them launched, gives two nodes: its start and its end. Edges weigh the
time they add to a path:

- host chain, per thread in call-stack order: node to next node is CPU work of the innermost
  op (``cpu_bound``), except inside a blocking call (cudaStreamSynchronize, cudaMemcpy…: the
  host waits, ``sync``) and between top-level ops (``host_gap``), both weight 0 as in HTA;
- device chain, per stream: kernel start → end (``gpu_compute``; ``gpu_communication`` for
  NCCL/RCCL), previous end → next start (``kernel_gap``); but a kernel launched onto an empty
  queue of an idle stream hangs from its launch call's start instead (``launch_overhead``);
- ``sync`` edges (weight 0) from ``cuda_sync`` events: Stream Sync, from the last kernel on the
  stream, Context Sync, from the last kernel of each stream, Event Sync, from the kernel
  launched before the ``cudaEventRecord`` named by ``wait_on_cuda_event_record_corr_id`` onto
  ``wait_on_stream`` — each to the end of the waiting host call; Stream Wait Event, from that
  kernel to the next kernel the waiting thread launches onto the waiting stream.

The critical path maximises the summed weights (the length); ``duration`` is clock time, so
waits and gaps show there only. Longest path without recursion: nodes are numbered chain by
chain, so along a chain a distance is a prefix sum plus the best entry. Only *anchors* (chain
heads, ends of launch and sync edges) take a Python step, in time order — topological, as
edges go forward in time (ties: device ends, host nodes, device starts); the rest is numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import DEVICE_LEVELS, Result

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: Host calls that wait for the device (HTA's ``CPGraph.BLOCKING_SYNC_CALLS``).
BLOCKING = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventQuery",
            "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync")  # fmt: skip
ATTRIBUTIONS = ("cpu_bound", "gpu_compute", "gpu_communication", "launch_overhead",
                "kernel_gap", "sync", "host_gap")  # fmt: skip
CPU, GPU, COMM, LAUNCH, GAP, SYNC, HOSTGAP = range(7)
COLUMNS = ["rank", "part", "start", "end", "duration", "weight", "attribution", "event", "name",
           "src", "dst"]  # fmt: skip


def critical_path(
    trace: Trace,
    rank: int | None = None,
    steps: list[int] | None = None,
    annotation: str | None = None,
    instance: int | tuple[int, int] = 0,
) -> Result:
    """Critical path of each source file (a rank; only ``rank``'s if given), over the whole
    trace, the profiler ``steps``, or — as HTA's ``critical_path_analysis`` — ``instance`` (or
    an inclusive range) of the host spans whose name contains ``annotation``.

    ``path``: the segments in order — ``start``, ``end``, ``duration`` (clock), ``weight``
    (what it adds to the length), ``attribution``, the charged ``event`` and its ``name``, the
    ``src`` and ``dst`` events it joins. ``summary``: per attribution the summed ``time``
    (weight) and ``wall`` (duration), ``percent`` of the length; row ``total``: the length and
    the span.
    """  # fmt: skip
    notes: list[str] = []
    paths, srcs = [], [s for s in trace.sources if rank is None or s["rank"] == rank]
    q = f"from events where part in ({', '.join(str(s['part']) for s in srcs) or 'null'})"
    tables = [trace.sql(sql.format(q)) for sql in _QUERIES]  # one scan each, all parts
    for src in srcs:
        window = _window(trace, src["part"], steps, annotation, instance, notes)
        if window:
            h, d, s = (t[t.part == src["part"]].reset_index(drop=True) for t in tables)
            p = _path(h, d, s, window, notes, src["part"])
            if p is not None:
                paths.append(p.assign(rank=src["rank"], part=src["part"]))
    if not paths:
        notes.append("no host ops or runtime calls in the window: no critical path")
    path = pd.concat(paths, ignore_index=True) if paths else pd.DataFrame(columns=COLUMNS)
    path["name"] = path.event.map(_names(trace, path.event.dropna().unique()))
    return Result({"path": path[COLUMNS], "summary": _summary(path)}, notes)


def _names(trace: Trace, ids) -> pd.Series:
    import pyarrow as pa

    trace.con.register("_cp_ids", pa.table({"id": pa.array(ids, pa.int64())}))
    try:
        df = trace.sql("select id, name from events where id in (select id from _cp_ids)")
    finally:
        trace.con.unregister("_cp_ids")
    return pd.Series(df.name.to_numpy(), index=df.id.to_numpy())


def _summary(path: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (r, part), g in path.groupby(["rank", "part"], dropna=False):
        for a in ATTRIBUTIONS:
            s = g[g.attribution == a]
            rows.append((r, part, a, s.weight.sum(), s.duration.sum(), len(s)))
        rows.append((r, part, "total", g.weight.sum(), g.end.max() - g.start.min(), len(g)))
    out = pd.DataFrame(rows, columns=["rank", "part", "attribution", "time", "wall", "segments"])
    out[["time", "wall"]] = out[["time", "wall"]].astype(np.int64)
    length = out.groupby(["rank", "part"], dropna=False).time.transform("max")
    out["percent"] = 100.0 * out.time / length.where(length > 0)
    return out


def _window(trace, part, steps, annotation, instance, notes) -> tuple[int, int] | None:
    """(lo, hi) ns: host events starting in [lo, hi] are in the graph."""
    if steps is not None:
        where = f"level = 'step' and step in ({', '.join(str(int(s)) for s in steps) or 'null'})"
    elif annotation:
        where = f"dur > 0 and contains(name, '{annotation.replace(chr(39), chr(39) * 2)}')"
    else:
        return -(2**63), 2**63 - 1
    spans = trace.sql(f"select ts, ts + coalesce(dur, 0) as e from events where part = {part} "
                      f"and device < 0 and {where} order by ts")  # fmt: skip
    if steps is None:
        a, b = instance if isinstance(instance, tuple) else (instance, instance)
        spans = spans.iloc[a : b + 1]
    if spans.empty:
        what = f"steps {list(steps)}" if steps is not None else f"{annotation!r} #{instance}"
        notes.append(f"part {part}: no {what} in this trace, so no critical path for it")
        return None
    return int(spans.ts.min()), int(spans.e.max())


def _i64(s) -> np.ndarray:
    return pd.Series(s).fillna(-1).to_numpy(np.int64)


def _asof(left: pd.DataFrame, right: pd.DataFrame, forward=False, exact=True) -> np.ndarray:
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


#: host events, device work with a correlation id, cuda_sync events ({} = from … where …)
_QUERIES = (
    "select part, id, parent, pid, tid, ts, dur, depth, correlation, "
    "coalesce(level = 'runtime', false) as rt, coalesce(level in ('op', 'runtime'), false) as op, "
    "coalesce(name = 'cudaEventRecord', false) as record, coalesce(name in " + str(BLOCKING)
    + ", false) as blocking {} and dur is not null and device < 0 order by part, id",
    # comm: HTA's communication kernels (as analysis.common.kernel_type)
    "select part, id, device, stream, ts as t, dur, correlation, level = 'collective' or "
    "coalesce(contains(lower(name), 'nccl'), false) as comm {} and dur is not null and level in "
    + str(DEVICE_LEVELS) + " and correlation is not null order by part, t, id",
    "select part, name, device, stream, ts + dur as e, correlation, "
    "try_cast(args->>'wait_on_stream' as bigint) as ws, "
    "try_cast(args->>'wait_on_cuda_event_record_corr_id' as bigint) as rc "
    "{} and dur is not null and lower(category) = 'cuda_sync'",
)  # fmt: skip


def _path(h, d, s, window: tuple[int, int], notes: list, part: int) -> pd.DataFrame | None:
    H = {c: (h[c].to_numpy(bool) if h[c].dtype == bool else _i64(h[c])) for c in h.columns}
    ing = H["op"] & (H["dur"] > 0) & (H["ts"] >= window[0]) & (H["ts"] <= window[1])
    if not ing.any():
        return None
    # nearest ancestor in the graph: HTA's call stacks hold graph events only
    hid, hpar, hts, hcorr = H["id"], H["parent"], H["ts"], H["correlation"]
    par = np.minimum(np.searchsorted(hid, hpar), len(hid) - 1)
    par = np.where((hpar >= 0) & (hid[par] == hpar), par, -1)
    ep = par.copy()
    while (m := (ep >= 0) & ~ing[np.maximum(ep, 0)]).any():
        ep[m] = par[ep[m]]
    # device work and cuda_sync events -> the runtime call with their correlation id
    rt = np.flatnonzero(H["rt"] & (hcorr >= 0))
    rt_of = pd.Series(rt, index=hcorr[rt]).groupby(level=0).first()
    d["rt"], s["rt"] = _i64(d.correlation.map(rt_of)), _i64(s.correlation.map(rt_of))
    d = d[d.rt >= 0].reset_index(drop=True)
    r = d.rt.to_numpy()
    d["row"], d["ts_rt"], d["pid"], d["tid"] = d.index, hts[r], H["pid"][r], H["tid"][r]
    if d.empty:
        notes.append(f"part {part}: no device work linked to a launch: the path is host-only")
    if s.empty:
        notes.append(
            f"part {part}: no cuda_sync events (PyTorch ≥ 2.1 records them): host "
            "waits on the device are invisible; GPU time may be under-counted"
        )
    # HTA's queue length per stream: +1 at a launch, -1 when its work starts (whole trace)
    q = pd.DataFrame({"dev": np.tile(d.device, 2), "str": np.tile(d.stream, 2),
                      "t": np.r_[d.ts_rt, d.t], "k": np.repeat([1, -1], len(d))})  # fmt: skip
    q = q.sort_values(["dev", "str", "t", "k"], ascending=[1, 1, 1, 0], kind="stable")
    ql = q.k.groupby([q.dev, q.str]).cumsum().sort_index().to_numpy()
    d["launch_ok"] = (ql[: len(d)] == 1) & (ql[len(d) :] == 0)
    g = np.r_[ing[r], False]  # launched from the window (index -1: no kernel)
    # awaited kernel of an event: the last launch onto the recorded stream up to the record
    rec = np.flatnonzero(H["record"] & (hcorr >= 0))
    s["t"] = s.rc.map(pd.Series(hts[rec], index=hcorr[rec]).groupby(level=0).first())
    ev = s[s.name.isin(["Event Sync", "Stream Wait Event"]) & s.t.notna() & (s.rt >= 0)]
    right = d[["device", "stream", "row"]].assign(t=d.ts_rt)
    k = _asof(ev[["device", "ws", "t"]].rename(columns={"ws": "stream"}), right)
    ev = ev[g[k]].assign(k=k[g[k]])
    es = ev[(ev.name == "Event Sync") & ing[ev.rt.to_numpy()]]
    ww = ev[ev.name == "Stream Wait Event"]  # -> next launch by that thread onto that stream
    wr = ww.rt.to_numpy()
    left = pd.DataFrame({"pid": H["pid"][wr], "tid": H["tid"][wr], "device": _i64(ww.device),
                         "stream": _i64(ww.stream), "t": hts[wr]})  # fmt: skip
    dst = _asof(left, d[["pid", "tid", "device", "stream", "row"]].assign(t=d.ts_rt), True, False)
    waits = np.c_[ww.k, dst, hid[wr]][g[dst]].astype(np.int64)
    # Stream / Context Sync: the last kernel of the stream(s) that started before the call ended
    ss = s[s.name.isin(["Stream Sync", "Context Sync"]) & (s.rt >= 0)]
    ss, gd = ss[ing[ss.rt.to_numpy()]], d[g[:-1]]
    ctx = ss[ss.name == "Context Sync"].drop(columns="stream")
    one = pd.concat(
        [
            ss[ss.name == "Stream Sync"],
            ctx.merge(gd[["device", "stream"]].drop_duplicates(), on="device"),
        ]
    )
    last = _asof(one[["device", "stream", "e"]].rename(columns={"e": "t"}),
                 gd[["device", "stream", "t", "row"]], exact=False)  # fmt: skip
    syncs = np.c_[np.r_[es.k, last[last >= 0]], np.r_[es.rt, one.rt.to_numpy()[last >= 0]]]
    return _graph(H, gd, ep, np.flatnonzero(ing), syncs.astype(np.int64), waits, notes)


def _graph(H, d, ep, hs, syncs, waits, notes) -> pd.DataFrame:
    """Nodes chain by chain (host threads, then device streams), each with the weight,
    attribution and event of the chain edge into it; plus the cross edges."""
    pid, tid, dep = (np.tile(H[c][hs], 2) for c in ("pid", "tid", "depth"))
    st, t = np.repeat([True, False], len(hs)), np.r_[H["ts"][hs], (H["ts"] + H["dur"])[hs]]
    o = np.lexsort((np.where(st, dep, -dep), st, t, tid, pid))
    t, st, row = t[o], st[o], np.r_[hs, hs][o]
    head = np.r_[True, (pid[o][1:] != pid[o][:-1]) | (tid[o][1:] != tid[o][:-1])]
    attr = np.where(st & (ep[row] < 0), HOSTGAP, np.where(~st & H["blocking"][row], SYNC, CPU))
    pst, prow = np.r_[False, st[:-1]], np.r_[0, row[:-1]]
    erow = np.where(attr == CPU, np.where(pst, prow, np.where(st, ep[row], row)), row)
    erow = np.where(attr == HOSTGAP, -1, erow)
    w = np.where(head | (attr != CPU), 0, t - np.r_[t[:1], t[:-1]])
    node = np.full((len(H["id"]), 2), -1)  # host row -> (start node, end node)
    node[row, (~st).astype(int)] = np.arange(len(t))
    # device: kernels per stream in start order; kernel i -> nodes n + 2i, n + 2i + 1
    d = d.sort_values(["device", "stream", "t"], kind="stable")
    kts, kend, kid, kdur = _i64(d.t), _i64(d.t + d.dur), _i64(d.id), _i64(d.dur)
    sk = _i64(d.device) * (1 << 40) + _i64(d.stream) % (1 << 40)
    same = np.r_[False, sk[1:] == sk[:-1]]
    prev_end = np.where(same, np.r_[0, kend[:-1]], -1)
    kpos = np.full(d.row.max() + 1 if len(d) else 0, -1)  # row in d -> kernel index
    kpos[d.row] = np.arange(len(d))
    wsrc, wcall = np.full(len(d), -1), np.full(len(d), -1)
    wsrc[kpos[waits[:, 1]]], wcall[kpos[waits[:, 1]]] = kpos[waits[:, 0]], waits[:, 2]
    wend, hw, ts_rt = np.where(wsrc >= 0, kend[wsrc], -1), wsrc >= 0, d.ts_rt.to_numpy()
    launch = d.launch_ok.to_numpy() & (~same | (prev_end < ts_rt)) & (~hw | (wend < ts_rt))
    kk = ~launch & same & (~hw | (wend < prev_end))
    n, dt = len(t), np.c_[kts, kend].ravel()
    ot = pd.Series(dt).groupby(np.repeat(sk, 2)).cummax().to_numpy()  # overlaps clamped
    # cross edges: launch -> kernel, kernel -> kernel (stream wait), kernel -> host call end
    li, rtk = np.flatnonzero(launch), d.rt.to_numpy()
    xw = np.r_[kts[li] - ts_rt[li], np.zeros(hw.sum() + len(syncs), np.int64)]
    if (xw < 0).any():
        notes.append(f"{(xw < 0).sum()} kernels start before their launch call (clock skew): "
                     "their launch delay counts as 0")  # fmt: skip
    cross = {
        "s": np.r_[node[rtk[li], 0], n + 2 * wsrc[hw] + 1, n + 2 * kpos[syncs[:, 0]] + 1],
        "d": np.r_[n + 2 * li, n + 2 * np.flatnonzero(hw), node[syncs[:, 1], 1]],
        "w": np.maximum(xw, 0), "a": np.where(np.arange(len(xw)) < len(li), LAUNCH, SYNC),
        "e": np.r_[H["id"][rtk[li]], wcall[hw], H["id"][syncs[:, 1]]],
    }  # fmt: skip
    nodes = {
        "t": np.r_[t, dt], "ot": np.r_[t, ot], "head": np.r_[head, np.c_[~kk, 0 * kk].ravel()],
        "cls": np.r_[np.ones(n, int), np.c_[2 + 0 * kk, np.where(ot[1::2] > ot[::2], 0, 2)]
                     .ravel()],
        "w": np.r_[w, np.c_[np.where(kk, np.maximum(kts - prev_end, 0), 0), kdur].ravel()],
        "a": np.r_[attr, np.c_[GAP + 0 * kk, np.where(d.comm, COMM, GPU)].ravel()],
        "e": np.r_[np.where(erow >= 0, H["id"][erow], -1), np.repeat(kid, 2)],
        "ev": np.r_[H["id"][row], np.repeat(kid, 2)],
    }  # fmt: skip
    return _longest(nodes, cross, notes)


def _longest(nodes: dict, cross: dict, notes: list) -> pd.DataFrame:
    """Longest path: one Python step per anchor in time order, prefix sums between them."""
    anchor = nodes["head"].astype(bool)
    anchor[np.r_[cross["s"], cross["d"]]] = True
    A = np.flatnonzero(anchor)
    aix = np.cumsum(anchor) - 1  # last anchor at or before each node
    order = np.lexsort((A, nodes["cls"][A], nodes["ot"][A]))
    pos = np.empty(len(A), np.int64)
    pos[order] = np.arange(len(A))
    cs, cd = aix[cross["s"]], aix[cross["d"]]
    if (back := pos[cs] >= pos[cd]).any():
        notes.append(f"{back.sum()} launch/sync edges point back in time (clock skew between "
                     "host and device) and were left out")  # fmt: skip
    x = np.flatnonzero(~back)[np.argsort(cd[~back], kind="stable")]  # cross edges by dst
    lo, hi = (np.searchsorted(cd[x], np.arange(len(A)), s).tolist() for s in ("left", "right"))
    pre = np.cumsum(nodes["w"])
    preA, headA = pre[A].tolist(), nodes["head"][A].astype(bool).tolist()
    xcs, xw, xid = cs[x].tolist(), cross["w"][x].tolist(), x.tolist()
    dist, how = [0] * len(A), [-1] * len(A)  # how: -1 path start, -2 chain, else cross edge
    for k in order.tolist():
        best, via = (0, -1) if headA[k] else (dist[k - 1] + preA[k] - preA[k - 1], -2)
        for j in range(lo[k], hi[k]):
            if (c := dist[xcs[j]] + xw[j]) > best:
                best, via = c, xid[j]
        dist[k], how[k] = best, via
    full = np.asarray(dist)[aix] + pre - pre[A][aix]
    top = np.flatnonzero(full == full.max())
    v = int(top[np.argmin(nodes["ot"][top])])  # ends where its last work ends
    seq = []  # walking back: node ids (the chain edge into them), -1 - c for cross edge c
    while True:
        k = int(aix[v])
        seq.append(np.arange(v, A[k] - (how[k] == -2), -1))
        if how[k] == -1:
            break
        if how[k] >= 0:
            seq.append([-1 - how[k]])
        v = A[k] - 1 if how[k] == -2 else int(cross["s"][how[k]])
    seq = np.concatenate(seq)[::-1]
    isx, nd, c = seq < 0, np.maximum(seq, 0), np.maximum(-1 - seq, 0)
    col = {f: np.where(isx, np.r_[cross[f], 0][c], nodes[f][nd]) for f in "wae"}
    src = np.where(isx, np.r_[cross["s"], 0][c], nd - 1)
    dst = np.where(isx, np.r_[cross["d"], 0][c], nd)
    t, ev = nodes["t"], nodes["ev"]
    p = pd.DataFrame({"start": t[src], "end": t[dst], "duration": t[dst] - t[src],
                      "weight": col["w"], "attribution": pd.Categorical.from_codes(
                          col["a"], ATTRIBUTIONS), "event": pd.array(col["e"], "Int64"),
                      "src": ev[src], "dst": ev[dst]})  # fmt: skip
    p.loc[p.event < 0, "event"] = pd.NA
    assert p.weight.sum() == full.max()
    return p

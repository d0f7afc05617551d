"""Chakra execution traces (``.et``): the replay graph written in MLCommons Chakra's protobuf
format, one file per rank, for ASTRA-sim and Chakra's own tools (``docs/chakra.md``).

A Chakra ET file is a sequence of length-prefixed protobuf messages (a varint byte count, then
the message, as Chakra's ``protolib.encodeMessage`` writes them): one ``GlobalMetadata``, then
one ``Node`` per operation. Our schema is ``formats/proto/et_def.proto`` (same field numbers as
Chakra's ``schema/protobuf/et_def.proto``).

The mapping, from a :class:`xpuprof.sim.Replay` (its graph of start/end points):

* **one node per replayed event** (``rp.events()``), ``id`` = the store's event id. Device
  kernels, copies and sets are ``COMP_NODE``; collective kernels (level ``collective``, or an
  NCCL/RCCL name) ``COMM_COLL_NODE`` with ``comm_type``, ``comm_size`` (bytes) and ``pg_name``
  from the comm tool, or ``COMM_SEND_NODE``/``COMM_RECV_NODE`` for a point-to-point send or
  receive; host ops, runtime calls and steps are ``COMP_NODE`` with ``is_cpu_op`` true.
  Copies stay ``COMP_NODE`` (as in Chakra's PyTorch converter): ``MEM_LOAD``/``MEM_STORE`` are
  accesses to ASTRA-sim's memory model, not PCIe copies.
* **durations**: a device node its measured ``dur``; a host node its *self* time (its ``dur``
  less that of the host events directly inside it on its thread), because a parent runs before
  its children in Chakra's order (below), as Chakra's converter does with ``exclusive_dur``.
* **data_deps** (what simulators schedule by: a node starts when all of them have finished):
  ``u → v`` for two events of one rank when a path of replay-graph edges leaves a point of u
  and reaches v's start, passing only through *end* points on the way (:func:`data_deps`):
  a parent's start → its first child's start; a runtime call → the work it launched; a
  child's end → its parent's end → the next op's start (the next op waits for both); a
  kernel's end → the end of the ``cudaStreamSynchronize`` waiting for it → what follows the
  call. (A zero-length event starts at the first of its two points.)
  Every pair goes forward in the graph's order of starts, so the result has no cycle; mapping
  every point-to-point edge to its two events instead would (a child's end → its parent's
  end runs against the parent's start → the child's start). Rendezvous points are virtual: a
  collective's cross-rank edges give no dependency; ranks meet through their
  ``COMM_COLL_NODE`` nodes with equal ``pg_name``, as Chakra intends.
* **host gaps**: the time between top-level host events (``host_gap`` edges: Python, dispatch)
  becomes a ``[host gap]`` CPU node of its own between the two events, so a simulator spends
  it too (:func:`_with_host_gaps`).
* **ctrl_deps** (Chakra's caller → callee relation, which simulators do not schedule by): a host
  event's enclosing host event on its thread, a device event's launching runtime call.

:func:`chakra_tables` makes the two tables, :func:`write_chakra` writes them (atomically: all
files under temporary names, renamed when every one is complete), :func:`read_chakra` reads a
file back, :func:`export_chakra` does all of it for a store.

Length: the adaptor, the writer and the reader of one format, each short; kept together
because the mapping above is what all three share.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.core.errors import TraceFormatError, XpuprofError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.trace.trace import Trace

#: The Chakra schema version written into ``GlobalMetadata.version`` (what Chakra's PyTorch
#: converter writes for this schema).
CHAKRA_VERSION = "0.0.4"

#: Point kinds of the replay graph (``xpuprof.sim.graph.NODE_KINDS``).
_HOST_START, _HOST_END, _DEVICE_START, _DEVICE_END = range(4)

#: Our collective types (``analysis.comm.normalize_collective``) → Chakra ``CollectiveCommType``.
#: ``send_recv`` of unknown direction is Chakra's converter's choice for a bare SendRecv kernel.
COMM_TYPES: dict[str, str] = {
    "all_reduce": "ALL_REDUCE", "reduce": "REDUCE", "all_gather": "ALL_GATHER",
    "gather": "GATHER", "scatter": "SCATTER", "broadcast": "BROADCAST",
    "all_to_all": "ALL_TO_ALL", "send_recv": "ALL_TO_ALL", "reduce_scatter": "REDUCE_SCATTER",
    "barrier": "BARRIER",
}  # fmt: skip

NODE_COLUMNS = ["part", "rank", "id", "name", "type", "is_cpu_op", "level", "tid", "stream",
                "ts", "dur", "start_micros", "duration_micros", "comm_type", "comm_size",
                "pg_name"]  # fmt: skip
EDGE_COLUMNS = ["part", "src", "dst", "dep", "via"]


def _pb() -> Any:
    from xpuprof.formats.proto import et_def_pb2

    return et_def_pb2


# -- tables --------------------------------------------------------------------------------------


def chakra_tables(
    rp: Any, trace: Trace | None = None, *, times: str = "measured"
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The Chakra nodes and edges of a replay (module docstring).

    ``trace`` (default: ``rp.trace``) gives the host nesting (the store's ``parent``) and the
    collectives' sizes and process groups (``analysis.comm.collectives``). ``times``:
    ``"measured"`` (the trace's ``ts``/``dur``) or ``"simulated"`` (the replay's
    ``sim_ts``/``sim_dur``).

    ``nodes``: one row per replayed event (:data:`NODE_COLUMNS`; ``type`` a Chakra
    ``NodeType`` name, ``comm_type`` a ``CollectiveCommType`` name or None,
    ``duration_micros`` what is written: a host event's self time). ``edges``: one row per
    dependency (:data:`EDGE_COLUMNS`): ``dep`` ``"data"`` or ``"ctrl"``, ``src`` → ``dst``
    event ids (``dst`` lists ``src`` in its ``data_deps``/``ctrl_deps``), ``via`` for data
    the replay edge kind that leaves ``src``'s point, for ctrl ``"parent"`` or ``"launch"``.
    """
    if times not in ("measured", "simulated"):
        raise XpuprofError(f"times={times!r}: expected 'measured' or 'simulated'")
    if trace is None:
        trace = getattr(rp, "trace", None)
    ev = rp.events().reset_index(drop=True)
    graph = rp.graph
    ids = ev["id"].to_numpy(np.int64)
    if len(np.unique(ids)) != len(ids):
        raise XpuprofError("replay events: event ids repeat; cannot number Chakra nodes")
    row_of = pd.Series(np.arange(len(ids)), index=ids)
    p_event = np.asarray(graph.nodes.event, np.int64)
    p_row = np.full(len(p_event), -1, np.int64)
    real = p_event >= 0
    p_row[real] = row_of.reindex(p_event[real]).fillna(-1).to_numpy(np.int64)
    src = np.asarray(graph.edges.src, np.int64)
    dst = np.asarray(graph.edges.dst, np.int64)
    kind = np.asarray(graph.edges.kind, np.int64)
    names = np.asarray(_edge_kind_names(), object)
    p_kind = _first_is_start(p_row, np.asarray(graph.nodes.kind, np.int64))
    d_src, d_dst, d_kind = data_deps(p_row, p_kind, src, dst, kind)

    # ctrl: the enclosing replayed host event; for device work the call that launched it
    is_host = ev["device"].to_numpy(np.int64) < 0
    parent = _host_parents(trace, ids, is_host)
    launch = np.flatnonzero(names[kind] == "launch")
    l_src, l_dst = p_row[src[launch]], p_row[dst[launch]]
    ok = (l_src >= 0) & (l_dst >= 0) & ~is_host[np.maximum(l_dst, 0)]
    parent[l_dst[ok]] = l_src[ok]

    ts_col, dur_col = ("ts", "dur") if times == "measured" else ("sim_ts", "sim_dur")
    ts = ev[ts_col].to_numpy(np.int64)
    dur = np.maximum(ev[dur_col].to_numpy(np.int64), 0)
    child = np.flatnonzero((parent >= 0) & is_host)
    inner = np.bincount(parent[child], dur[child], minlength=len(ev)).astype(np.int64)
    own = np.where(is_host, np.maximum(dur - inner, 0), dur)

    nodes = _node_frame(ev, trace, is_host, ts, dur, own)
    part = ev["part"].to_numpy(np.int64)
    c = np.flatnonzero(parent >= 0)
    edges = pd.DataFrame(
        {
            "part": np.r_[part[d_dst], part[c]],
            "src": np.r_[ids[d_src], ids[parent[c]]],
            "dst": np.r_[ids[d_dst], ids[c]],
            "dep": np.r_[np.full(len(d_src), "data", object), np.full(len(c), "ctrl", object)],
            "via": np.r_[names[d_kind], np.where(is_host[c], "parent", "launch").astype(object)],
        }
    )
    point_time = graph.nodes.time if times == "measured" else rp.time
    return _with_host_gaps(nodes, edges[EDGE_COLUMNS], ev, p_row, src, dst, kind, point_time)


def _with_host_gaps(
    nodes: pd.DataFrame, edges: pd.DataFrame, ev: pd.DataFrame, p_row: np.ndarray,
    src: np.ndarray, dst: np.ndarray, kind: np.ndarray, point_time: np.ndarray,
) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """The host time between top-level host events (the replay graph's ``host_gap`` edges:
    Python, dispatch) as nodes of their own — ``[host gap]``, a CPU ``COMP_NODE`` lasting the
    gap — between the event before and the one after (``u → gap → v`` replaces ``u → v``), so
    a simulator fed the file spends that time too. Ids follow the largest event id."""
    names = np.asarray(_edge_kind_names(), object)
    g = np.flatnonzero(names[kind] == "host_gap")
    u, v = p_row[src[g]], p_row[dst[g]]
    length = point_time[dst[g]] - point_time[src[g]]
    ok = (u >= 0) & (v >= 0) & (u != v) & (length > 0)
    g, u, v, length = g[ok], u[ok], v[ok], length[ok]
    if not len(g):
        return nodes, edges
    ids = ev["id"].to_numpy(np.int64)
    gid = ids.max(initial=0) + 1 + np.arange(len(g))
    start = point_time[src[g]]
    part = ev["part"].to_numpy(np.int64)[v]
    gaps = pd.DataFrame({
        "part": part, "rank": ev["rank"].astype("Int64").to_numpy()[v], "id": gid,
        "name": "[host gap]", "type": "COMP_NODE", "is_cpu_op": True, "level": "host_gap",
        "tid": ev["tid"].fillna(-1).to_numpy(np.int64)[v], "stream": -1, "ts": start,
        "dur": length, "start_micros": _micros(start), "duration_micros": _micros(length),
        "comm_type": None, "comm_size": pd.array([pd.NA] * len(g), dtype="Int64"),
        "pg_name": None,
    })[NODE_COLUMNS]  # fmt: skip
    pair = set(zip(ids[u].tolist(), ids[v].tolist(), strict=True))
    direct = (edges["dep"] == "data").to_numpy().copy()
    direct &= np.array([(a, b) in pair for a, b in zip(edges["src"], edges["dst"], strict=True)],
                       bool)  # fmt: skip
    through = pd.DataFrame({
        "part": np.r_[part, part], "src": np.r_[ids[u], gid], "dst": np.r_[gid, ids[v]],
        "dep": "data", "via": "host_gap",
    })[EDGE_COLUMNS]  # fmt: skip
    return (pd.concat([nodes, gaps], ignore_index=True),
            pd.concat([edges[~direct], through], ignore_index=True))  # fmt: skip


def _edge_kind_names() -> tuple[str, ...]:
    from xpuprof.sim.graph import EDGE_KINDS

    return tuple(EDGE_KINDS)


def _first_is_start(p_row: np.ndarray, p_kind: np.ndarray) -> np.ndarray:
    """Point kinds with start and end swapped for the events whose end point comes first on
    their timeline: zero-length host events, whose end the graph puts before their start (at
    equal times ends go first). For the mapping an event's first point is where it starts;
    otherwise two zero-length events at one instant would depend on each other."""
    kind = p_kind.copy()
    pts = np.flatnonzero(p_row >= 0)
    if not len(pts):
        return kind
    starts = np.isin(kind[pts], (_HOST_START, _DEVICE_START))
    first = np.full(int(p_row.max()) + 1, np.iinfo(np.int64).max)
    np.minimum.at(first, p_row[pts], pts)
    is_first = first[p_row[pts]] == pts
    flip = pts[starts != is_first]  # a start that is not first, an end that is
    swap = {_HOST_START: _HOST_END, _HOST_END: _HOST_START,
            _DEVICE_START: _DEVICE_END, _DEVICE_END: _DEVICE_START}  # fmt: skip
    kind[flip] = [swap[int(k)] for k in kind[flip]]
    return kind


def data_deps(
    p_row: np.ndarray, p_kind: np.ndarray, src: np.ndarray, dst: np.ndarray, kind: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Event-level dependencies from the replay graph's points: ``u → v`` (rows of the events
    table, ``p_row`` per point, -1 for a rendezvous) when an edge leaves a point of u and a
    path of edges from it reaches v's start passing only through *end* points (of any event)
    on the way. Each pair once, with the kind of the first edge of the first such path.

    Why end points only: an end is not something that can wait for anything after it, so
    ``B end → A end → C start`` says C waits for B; a start is where an event's dependencies
    end, so a path stops there. Every pair goes forward in the graph's order of starts (a
    path from u leaves a point at or after u's start and ends at v's start), so the result
    has no cycle when the graph has none."""
    is_start = (p_kind == _HOST_START) | (p_kind == _DEVICE_START)
    is_end = (p_kind == _HOST_END) | (p_kind == _DEVICE_END)
    order = np.argsort(src, kind="stable")
    s_sorted = src[order]
    seed = np.flatnonzero(p_row[src] >= 0)
    u, q, k = p_row[src[seed]], dst[seed], kind[seed]
    out_u, out_v, out_k = [], [], []
    seen = np.empty(0, np.int64)  # (u, q) pairs already expanded, as u * n + q
    n = len(p_row)
    while len(u):
        keep = (p_row[q] >= 0) & (p_row[q] != u)  # not a rendezvous, not u's own point
        u, q, k = u[keep], q[keep], k[keep]
        hit = is_start[q]
        out_u.append(u[hit])
        out_v.append(p_row[q[hit]])
        out_k.append(k[hit])
        go = is_end[q]
        u, q, k = u[go], q[go], k[go]
        key = u * n + q
        first = np.unique(key, return_index=True)[1]
        fresh = first[~np.isin(key[first], seen)]
        u, q, k = u[fresh], q[fresh], k[fresh]
        seen = np.union1d(seen, key[fresh])
        if not len(u):
            break
        lo = np.searchsorted(s_sorted, q, "left")
        cnt = np.searchsorted(s_sorted, q, "right") - lo
        rep = np.repeat(np.arange(len(q)), cnt)
        at = np.repeat(lo - np.r_[0, np.cumsum(cnt)[:-1]], cnt) + np.arange(int(cnt.sum()))
        u, q, k = u[rep], dst[order[at]], k[rep]
    if not out_u:
        e = np.empty(0, np.int64)
        return e, e, e
    a, b, c = np.concatenate(out_u), np.concatenate(out_v), np.concatenate(out_k)
    o = np.lexsort((c, b, a))
    a, b, c = a[o], b[o], c[o]
    first_of = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])] if len(a) else np.empty(0, bool)
    return a[first_of], b[first_of], c[first_of]


def _host_parents(trace: Trace | None, ids: np.ndarray, is_host: np.ndarray) -> np.ndarray:
    """Per event row: the row of the nearest enclosing host event that is replayed too (the
    store's ``parent``, walked up past events the replay leaves out, such as annotations);
    -1 when none, or without a trace."""
    parent = np.full(len(ids), -1, np.int64)
    if trace is None or not is_host.any():
        return parent
    import pyarrow as pa

    con = trace.con
    con.register("_xp_chakra_ids", pa.table({"id": pa.array(ids[is_host], pa.int64())}))
    try:
        # every host event of the parts concerned: the chain up may pass unreplayed ones
        up = trace.sql(
            "select id, parent from events where device < 0 and part in "
            "(select distinct e.part from events e join _xp_chakra_ids i on e.id = i.id)"
        )
    finally:
        con.unregister("_xp_chakra_ids")
    up_of = pd.Series(up["parent"].fillna(-1).to_numpy(np.int64), index=up["id"].to_numpy())
    row_of = pd.Series(np.arange(len(ids)), index=ids)
    rows = np.flatnonzero(is_host)
    cur = up_of.reindex(ids[rows]).fillna(-1).to_numpy(np.int64)
    for _ in range(10_000):  # nesting depth; a cycle in `parent` would be a damaged store
        found = row_of.reindex(cur).fillna(-1).to_numpy(np.int64)
        done = (found >= 0) | (cur < 0)
        parent[rows[done & (found >= 0)]] = found[done & (found >= 0)]
        rows, cur = rows[~done], cur[~done]
        if not len(rows):
            break
        cur = up_of.reindex(cur).fillna(-1).to_numpy(np.int64)
    return parent


def _node_frame(
    ev: pd.DataFrame,
    trace: Trace | None,
    is_host: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    own: np.ndarray,
) -> pd.DataFrame:
    """One row per event: Chakra type, times in µs, and the collective attributes."""
    level = ev["level"].astype(object).to_numpy()
    name = ev["name"].astype(object).fillna("").to_numpy()
    comm = ~is_host & (level == "collective")
    dev = np.flatnonzero(~is_host)
    if len(dev):  # an NCCL/RCCL name, tested once per distinct name
        codes, uniq = pd.factorize(name[dev])
        hit = np.array([("nccl" in str(u).lower()) or ("rccl" in str(u).lower()) for u in uniq])
        comm[dev] |= hit[codes]
    kinds = np.full(len(ev), None, object)
    size = np.full(len(ev), -1, np.int64)
    pg = np.full(len(ev), None, object)
    if comm.any():
        from xpuprof.analysis.comm import kernel_parts, normalize_collective

        if trace is not None:
            table = _collective_table(trace)
            if len(table):
                m = table.set_index("id").reindex(ev["id"].to_numpy()[comm])
                kinds[comm] = m["collective"].to_numpy(object)
                b = pd.to_numeric(m["bytes"], errors="coerce").to_numpy(float)
                size[comm] = np.where(np.isfinite(b), np.round(b), -1).astype(np.int64)
                # the comm tool names a PyTorch group "pg NAME": Chakra wants NAME itself
                # ("default": no group known, so none is named, as Chakra's converter does)
                pg[comm] = [
                    v.removeprefix("pg ") if isinstance(v, str) and v != "default" else None
                    for v in m["process_group"].to_numpy(object)
                ]
        for i in np.flatnonzero(comm & pd.isna(kinds)):
            kinds[i] = kernel_parts(name[i])["collective"] or normalize_collective(name[i])
    # send/recv: point to point; a collective of unknown type stays COMP_NODE (Chakra needs
    # a comm_type for COMM_COLL_NODE)
    node_type = np.full(len(ev), "COMP_NODE", object)
    node_type[comm & (kinds == "send")] = "COMM_SEND_NODE"
    node_type[comm & (kinds == "recv")] = "COMM_RECV_NODE"
    coll = comm & np.isin(kinds, list(COMM_TYPES))
    node_type[coll] = "COMM_COLL_NODE"
    comm_type = np.full(len(ev), None, object)
    comm_type[coll] = [COMM_TYPES[k] for k in kinds[coll]]
    is_comm = coll | (node_type == "COMM_SEND_NODE") | (node_type == "COMM_RECV_NODE")
    return pd.DataFrame(
        {
            "part": ev["part"].to_numpy(np.int64),
            "rank": ev["rank"].astype("Int64"),
            "id": ev["id"].to_numpy(np.int64),
            "name": name,
            "type": node_type,
            "is_cpu_op": is_host,
            "level": level,
            "tid": np.where(is_host, ev["tid"].fillna(-1).to_numpy(np.int64), -1),
            "stream": np.where(is_host, -1, ev["stream"].fillna(-1).to_numpy(np.int64)),
            "ts": ts,
            "dur": dur,
            "start_micros": _micros(ts),
            "duration_micros": _micros(own),
            "comm_type": comm_type,
            "comm_size": pd.arrays.IntegerArray(np.maximum(size, 0), ~(is_comm & (size >= 0))),
            "pg_name": np.where(is_comm, pg, None),
        }
    )[NODE_COLUMNS]


def _collective_table(trace: Trace) -> pd.DataFrame:
    from xpuprof.analysis.comm import collectives

    t = collectives(trace).tables.get("collectives")
    if t is None or t.empty:
        return pd.DataFrame(columns=["id", "collective", "bytes", "process_group"])
    return t[["id", "collective", "bytes", "process_group"]].drop_duplicates("id")


def _micros(ns: np.ndarray) -> np.ndarray:
    """ns → µs, rounded to the nearest (half up), never below 0 (Chakra's fields are uint64)."""
    ns = np.asarray(ns, np.int64)
    return np.maximum((ns + 500) // 1000, 0)


# -- writing -------------------------------------------------------------------------------------


def _attr(pb: Any, name: str, value: Any) -> Any:
    """An AttributeProto in the value field Chakra's readers expect for ``name``."""
    if isinstance(value, (bool, np.bool_)):
        return pb.AttributeProto(name=name, bool_val=bool(value))
    if isinstance(value, str):
        return pb.AttributeProto(name=name, string_val=value)
    if name in ("comm_src", "comm_dst", "comm_tag", "comm_priority"):
        return pb.AttributeProto(name=name, int32_val=int(value))
    return pb.AttributeProto(name=name, int64_val=int(value))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _frame(message: Any) -> bytes:
    data = message.SerializeToString()
    return _varint(len(data)) + data


def file_name(prefix: str, rank: int) -> str:
    """``{prefix}.{rank}.et``: the names ASTRA-sim opens for a workload prefix."""
    return f"{prefix}.{rank}.et"


def _file_ranks(nodes: pd.DataFrame) -> dict[int, int]:
    """part → the number in its file name: its rank, or its part when ranks are unknown or
    repeat (two parts of one rank)."""
    pr = nodes[["part", "rank"]].drop_duplicates("part")
    ranks = pr["rank"]
    if ranks.isna().any() or ranks.duplicated().any():
        return {int(p): int(p) for p in pr["part"]}
    return {int(p): int(r) for p, r in zip(pr["part"], ranks, strict=True)}


def write_chakra(
    nodes: pd.DataFrame,
    edges: pd.DataFrame,
    directory: str | Path,
    *,
    prefix: str = "trace",
    version: str = CHAKRA_VERSION,
    metadata: dict[int, dict[str, Any]] | None = None,
) -> list[Path]:
    """Write one Chakra ET file per part of ``nodes`` (:func:`chakra_tables`) into
    ``directory`` (created if missing), named ``{prefix}.{rank}.et``; returns the paths in
    rank order.

    ``metadata``: per part, extra ``GlobalMetadata`` attributes (name → int, str or bool).
    Every file is written under a temporary name and renamed only when all are complete: on
    any error no file is left behind, nor the directory when this call created it.
    """
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise XpuprofError(f"{out}: exists and is not a directory")
    if not prefix or os.sep in prefix or "/" in prefix:
        raise XpuprofError(f"prefix {prefix!r}: expected a plain file-name prefix")
    names = _file_ranks(nodes) if len(nodes) else {}
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise XpuprofError(f"{out}: cannot create the output directory ({e.strerror})") from e
    staged: list[tuple[Path, Path]] = []
    renamed: list[Path] = []
    try:
        by_part = dict(tuple(nodes.groupby("part", sort=True))) if len(nodes) else {}
        e_by_part = dict(tuple(edges.groupby("part", sort=True))) if len(edges) else {}
        for part in sorted(by_part, key=lambda p: (names[int(p)], p)):
            final = out / file_name(prefix, names[int(part)])
            tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            staged.append((tmp, final))
            extra = {"part": int(part), **((metadata or {}).get(int(part)) or {})}
            rank = by_part[part]["rank"].iloc[0]
            if not pd.isna(rank):
                extra.setdefault("rank", int(rank))
            _write_file(tmp, by_part[part], e_by_part.get(part), version, extra)
        for tmp, final in staged:
            os.replace(tmp, final)
            renamed.append(final)
    except OSError as e:
        _clean(staged, renamed, out, created)
        where = e.filename or out
        raise XpuprofError(f"{where}: cannot write the Chakra trace ({e.strerror or e})") from e
    except BaseException:
        _clean(staged, renamed, out, created)
        raise
    return [final for _, final in staged]


def _clean(staged: list[tuple[Path, Path]], renamed: list[Path], out: Path, created: bool) -> None:
    for tmp, _final in staged:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    if created:
        for final in renamed:
            with contextlib.suppress(OSError):
                final.unlink(missing_ok=True)
        shutil.rmtree(out, ignore_errors=True)


def _write_file(
    path: Path,
    nodes: pd.DataFrame,
    edges: pd.DataFrame | None,
    version: str,
    extra: dict[str, Any],
) -> None:
    """One rank's file: GlobalMetadata, then its nodes in start order (ties: id)."""
    pb = _pb()
    nodes = nodes.sort_values(["start_micros", "ts", "id"], kind="stable")
    data: dict[int, list[int]] = {}
    ctrl: dict[int, list[int]] = {}
    if edges is not None and len(edges):
        for dep, target in (("data", data), ("ctrl", ctrl)):
            e = edges[edges["dep"].to_numpy() == dep].sort_values(["dst", "src"], kind="stable")
            if len(e):
                d = e["dst"].to_numpy(np.int64)
                s = e["src"].to_numpy(np.int64)
                cut = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
                d_list, s_list = d.tolist(), s.tolist()
                for lo, hi in zip(cut.tolist(), np.r_[cut[1:], len(d)].tolist(), strict=True):
                    target[d_list[lo]] = s_list[lo:hi]
    meta = pb.GlobalMetadata(version=version)
    meta.attr.extend(_attr(pb, k, v) for k, v in {"schema": "xpuprof", **extra}.items())
    # a node's attributes repeat (is_cpu_op + tid/stream, a collective's type, size and
    # group): each distinct set is serialized once and appended to the node's other fields,
    # which is the same encoding (field 10 is the last field of Node)
    is_cpu = nodes["is_cpu_op"].to_numpy(bool)
    place = np.where(is_cpu, nodes["tid"].to_numpy(np.int64), nodes["stream"].to_numpy(np.int64))
    size = nodes["comm_size"].to_numpy(np.float64, na_value=np.nan)
    attr_key = list(
        zip(
            is_cpu.tolist(),
            place.tolist(),
            nodes["comm_type"].to_numpy(object).tolist(),
            np.where(np.isnan(size), -1, size).astype(np.int64).tolist(),
            nodes["pg_name"].to_numpy(object).tolist(),
            strict=True,
        )
    )
    attr_bytes: dict[tuple, bytes] = {}
    node_type = [pb.NodeType.Value(t) for t in nodes["type"].to_numpy(object)]
    ids = nodes["id"].to_numpy(np.int64).tolist()
    names = nodes["name"].to_numpy(object).tolist()
    start = nodes["start_micros"].to_numpy(np.int64).tolist()
    length = nodes["duration_micros"].to_numpy(np.int64).tolist()
    with open(path, "wb") as f:
        f.write(_frame(meta))
        buf: list[bytes] = []
        for i, nid in enumerate(ids):
            key = attr_key[i]
            tail = attr_bytes.get(key)
            if tail is None:
                tail = attr_bytes[key] = _attr_bytes(pb, *key)
            head = pb.Node(
                id=nid,
                name=str(names[i]),
                type=node_type[i],
                ctrl_deps=ctrl.get(nid, ()),
                data_deps=data.get(nid, ()),
                start_time_micros=start[i],
                duration_micros=length[i],
            ).SerializeToString()
            buf.append(_varint(len(head) + len(tail)) + head + tail)
            if len(buf) >= 4096:
                f.write(b"".join(buf))
                buf.clear()
        f.write(b"".join(buf))


def _attr_bytes(
    pb: Any, is_cpu: bool, place: int, comm_type: Any, comm_size: int, pg_name: Any
) -> bytes:
    """The serialized ``attr`` entries of a node: is_cpu_op, then tid (host) or stream
    (device), then for communication comm_type, comm_size and pg_name when known."""
    node = pb.Node()
    node.attr.append(_attr(pb, "is_cpu_op", is_cpu))
    node.attr.append(_attr(pb, "tid" if is_cpu else "stream", place))
    if isinstance(comm_type, str):
        node.attr.append(_attr(pb, "comm_type", pb.CollectiveCommType.Value(comm_type)))
    if comm_size >= 0:
        node.attr.append(_attr(pb, "comm_size", comm_size))
    if isinstance(pg_name, str) and pg_name:
        node.attr.append(_attr(pb, "pg_name", pg_name))
    return node.SerializeToString()


# -- reading -------------------------------------------------------------------------------------


def read_chakra(path: str | Path) -> tuple[Any, list[Any]]:
    """``(GlobalMetadata, [Node, ...])`` of a Chakra ET file (plain or gzipped), decoded with
    our compiled schema; a truncated or damaged file raises :class:`TraceFormatError` with the
    byte offset of the message that fails."""
    pb = _pb()
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise XpuprofError(f"{p}: cannot read ({e.strerror or e})") from e
    compressed = raw[:2] == b"\x1f\x8b"
    if compressed:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise TraceFormatError(p, f"damaged gzip data ({e})") from e
    meta = None
    nodes: list[Any] = []
    pos = 0
    end = len(raw)
    while pos < end:
        at = pos
        size = shift = 0
        while True:
            if pos >= end:
                raise TraceFormatError(p, "truncated length prefix", offset=at,
                                       compressed=compressed)  # fmt: skip
            b = raw[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise TraceFormatError(p, "bad length prefix", offset=at, compressed=compressed)
        if pos + size > end:
            raise TraceFormatError(
                p, f"truncated message: {size} bytes announced, {end - pos} left",
                offset=at, compressed=compressed,
            )  # fmt: skip
        msg = pb.GlobalMetadata() if meta is None else pb.Node()
        try:
            msg.ParseFromString(raw[pos : pos + size])
        except Exception as e:  # protobuf's DecodeError
            what = "GlobalMetadata" if meta is None else f"node {len(nodes)}"
            raise TraceFormatError(p, f"cannot decode {what} ({e})", offset=at,
                                   compressed=compressed) from e  # fmt: skip
        pos += size
        if meta is None:
            meta = msg
        else:
            nodes.append(msg)
    if meta is None:
        raise TraceFormatError(p, "empty file: no GlobalMetadata message")
    return meta, nodes


def attrs(message: Any) -> dict[str, Any]:
    """A node's (or GlobalMetadata's) attributes as ``{name: value}`` (the set value field)."""
    out = {}
    for a in message.attr:
        which = a.WhichOneof("value")
        out[a.name] = getattr(a, which) if which else None
    return out


# -- the whole export ----------------------------------------------------------------------------


def export_chakra(
    trace: Trace,
    directory: str | Path,
    ranks: Iterable[int] | None = None,
    *,
    steps: Any = None,
    prefix: str = "trace",
    times: str = "measured",
) -> list[Path]:
    """Replay ``trace`` (``ranks``/``steps`` as :func:`xpuprof.sim.replay`) and write its
    Chakra ET files into ``directory``, one per rank (:func:`write_chakra`)."""
    from xpuprof.sim import replay

    rp = replay(trace, ranks=ranks, steps=steps)
    nodes, edges = chakra_tables(rp, trace, times=times)
    if nodes.empty:
        raise XpuprofError(f"{getattr(trace, 'path', 'the store')}: no replayed events to export")
    offsets = getattr(rp.graph, "offsets", {}) or {}
    meta = {
        int(p): {"times": times, "clock_offset_ns": int(offsets.get(int(p), 0))}
        for p in nodes["part"].unique()
    }
    return write_chakra(nodes, edges, directory, prefix=prefix, metadata=meta)

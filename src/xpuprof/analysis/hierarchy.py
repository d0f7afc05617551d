"""Across-stack hierarchy (the XSP idea): every event's ancestry, step → layer → op → runtime
call → device activity, and device time attributed up that tree.

How each event finds its ancestors
----------------------------------

* **Host events** climb their own track: ``parent`` (the store's innermost enclosing event on
  the same pid/tid) is followed up to the top. On the way each level keeps its nearest
  ancestor-or-self: ``step`` (the step span), ``layer`` (the *innermost* layer span: a module
  path or an ``nn.Module: …`` Python event), ``leaf_op`` (the *innermost* framework op),
  ``op`` (the *outermost* framework op), ``runtime`` and ``annotation``.
* **Layers** are matched by time where two clocks meet. xpuprof's layer spans come from module
  hooks on Python's clock, the ops from the profiler's; converting one to the other is off by
  about a microsecond, enough for an op to seem to end after its module's span and so be
  nested (by ``parent``) in the module above. Since a module call is synchronous, an op
  belongs to the innermost layer span of its thread that contains its *start*; that rule is
  applied to the events whose parent is a layer or step span (or none) and everything below
  them inherits through ``parent``, so an op and its callees are always in one layer.
* **Device events** (kernel, memcpy, memset, collective) are launched by a host call: the
  ``links`` of kind ``ac2g``/``async`` (launch → kernel), else the host event of the same part
  with the same ``correlation`` (a runtime call first). They take that call's ancestry:
  ``runtime`` is the call, ``leaf_op`` the op that launched it (the innermost op around the
  call), ``op``, ``layer``, ``step`` its enclosing ones. ``via`` says which join was used.
* **Backward ops** run outside the layer spans of the forward pass (on autograd threads on
  GPUs, after the forward on CPUs). A *backward root* is the target of a ``fwdbwd`` link
  (forward op → backward op; Kineto binds it to ``XBackward0``, and the enclosing
  ``autograd::engine::evaluate_function: XBackward0`` is taken as a root too). Where a trace
  has backward ops without links, their ``Sequence number`` is matched to the forward op with
  the same number in the same part (the latest one starting before the backward op: the op
  that created the autograd node). Everything under a backward root gets ``fwd_op`` (that
  forward op), ``pass = "backward"`` and the forward op's layer (a backward layer span around
  it is used only where the forward op has none).
* ``pass`` is ``backward`` under a backward root or in a backward layer span, ``forward`` in a
  forward layer span or under an op that is the source of a ``fwdbwd`` link, null elsewhere
  (optimizer, data loading).
* ``step`` is the store's ``step`` column (host events by time within their process, device
  events through their launch), so ops on autograd threads have a step too.

Everything is vectorized: the tree is walked one depth at a time (a few dozen numpy steps for
any number of events), and attribution up the tree expands (event, ancestor) pairs one level
at a time. Nothing loops over events in Python.

Attribution
-----------

:func:`attribute` sums device time up the tree. For a node (a layer, an op, a step, a module
type) **inclusive** time is the device time launched anywhere under it, **exclusive** the time
not under a child node of the same level (for a layer: kernels whose innermost layer is this
one). Aggregated by name, a device event counts once per name even where the name nests in
itself (a Sequential inside a Sequential), so inclusive times never exceed the device total.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.analysis.common import DEVICE_LEVELS, where_clause
from xpuprof.core.errors import XpuprofError
from xpuprof.core.names import LAUNCH_FLOW_KINDS, LEVELS

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.trace.trace import Trace

LEVEL_CODE = {lv: i for i, lv in enumerate(LEVELS)}
_STEP, _LAYER, _OP, _RUNTIME = (LEVEL_CODE[x] for x in ("step", "layer", "op", "runtime"))
_ANNOTATION = LEVEL_CODE["annotation"]
_DEVICE_CODES = np.array([LEVEL_CODE[x] for x in DEVICE_LEVELS], np.int8)

BACKWARD_KIND = "fwdbwd"
EVALUATE_PREFIX = "autograd::engine::evaluate_function: "
_BACKWARD_NAME = re.compile(r"Backward\d*$")
_MODULE_EVENT = re.compile(r"^nn\.Module: (.*?)(?:_\d+)?$")

#: ``pass`` codes.
PASSES = ("forward", "backward")
_FWD, _BWD = 1, 2

#: ``via``: how a device event found its launch.
VIA = ("link", "correlation")

BY = ("layer", "module_type", "op", "step", "runtime")


# ----------------------------------------------------------------------------------------------
# the tree
# ----------------------------------------------------------------------------------------------


def _codes(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, values) of a dictionary (or plain string) column; null → -1."""
    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    arr = col.unify_dictionaries().combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if isinstance(arr, pa.ChunkedArray):  # an empty column
        arr = pa.array([], pa.dictionary(pa.int32(), pa.string()))
    codes = np.asarray(pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False), np.int64)
    values = np.asarray(arr.dictionary.to_pylist(), dtype=object)
    return codes, values


def _int(col: pa.ChunkedArray, fill: int = -1) -> np.ndarray:
    if col.null_count == 0:
        return np.asarray(col.to_numpy(), np.int64)
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), np.int64)


def _rows_of(ids: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Row of each wanted id in the sorted ``ids`` (-1: absent or null)."""
    if not len(ids):
        return np.full(len(want), -1, np.int64)
    pos = np.clip(np.searchsorted(ids, want), 0, len(ids) - 1)
    return np.where((want >= 0) & (ids[pos] == want), pos, -1)


@dataclass
class Tree:
    """The events of a store (optionally some ranks) as numpy arrays in id order, with every
    event's ancestry resolved. Row numbers index every array; -1 means none."""

    ids: np.ndarray
    part: np.ndarray
    rank: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    level: np.ndarray
    name: np.ndarray
    names: np.ndarray
    ts: np.ndarray
    dur: np.ndarray  # 0 where null
    has_dur: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    corr: np.ndarray
    step: np.ndarray  # step number, -1 where null
    flops: np.ndarray
    # resolved ancestry (rows)
    step_row: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    layer: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    leaf_op: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    op: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    runtime: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    annotation: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    launch: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    via: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))
    fwd_op: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    passes: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))
    # per node: the enclosing node of the same kind (layer spans: layer; ops: op)
    layer_up: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    op_up: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # layer spans: pass of the span itself, module type code
    layer_pass: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))
    module_type: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    module_types: np.ndarray = field(default_factory=lambda: np.empty(0, object))
    is_bwd_root: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    notes: list[str] = field(default_factory=list)
    _groups: list[np.ndarray] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.ids)

    def is_device(self) -> np.ndarray:
        return np.isin(self.level, _DEVICE_CODES)

    # -- walking the tree --------------------------------------------------------------------

    def inherit(self, own: np.ndarray) -> np.ndarray:
        """Nearest ancestor-or-self value: ``own[i]`` where it is set (>= 0), else the
        parent's result, recursively (one numpy step per depth)."""
        out = own.astype(np.int64, copy=True)
        par = self.parent
        for rows in self._groups[1:]:
            unset = rows[out[rows] < 0]
            if unset.size:
                p = par[unset]
                ok = p >= 0
                out[unset[ok]] = out[p[ok]]
        return out

    def outermost(self, own: np.ndarray) -> np.ndarray:
        """Farthest ancestor-or-self value: the parent's result where it is set, else
        ``own[i]``."""
        out = own.astype(np.int64, copy=True)
        par = self.parent
        for rows in self._groups[1:]:
            p = par[rows]
            ok = p >= 0
            up = np.full(len(rows), -1, np.int64)
            up[ok] = out[p[ok]]
            hit = up >= 0
            out[rows[hit]] = up[hit]
        return out

    def above(self, inherited: np.ndarray) -> np.ndarray:
        """For each row, the inherited value of its parent (strict ancestors only)."""
        out = np.full(self.n, -1, np.int64)
        ok = self.parent >= 0
        out[ok] = inherited[self.parent[ok]]
        return out


def _depth_groups(parent: np.ndarray, depth: np.ndarray) -> list[np.ndarray]:
    """Rows grouped by depth, so that parents are always settled before their children."""
    if len(depth) and (depth.min() < 0 or int(depth.max()) > 10_000):
        depth = np.zeros(len(parent), np.int64)
    ok = parent >= 0
    if ok.any() and not (depth[parent[ok]] + 1 == depth[ok]).all():
        from xpuprof.trace.normalize import depths

        depth = depths(parent).astype(np.int64)
    if not len(depth):
        return []
    order = np.argsort(depth, kind="stable")
    bounds = np.flatnonzero(np.diff(depth[order])) + 1
    return np.split(order, bounds)


_CACHE: weakref.WeakKeyDictionary[Any, dict[Any, Tree]] = weakref.WeakKeyDictionary()


def tree(trace: Trace, ranks: Iterable[int] | None = None) -> Tree:
    """The resolved tree of a store (cached per Trace object and rank selection: a store
    never changes once written)."""
    key = None if ranks is None else tuple(sorted(int(r) for r in ranks))
    per = _CACHE.setdefault(trace, {})
    if key not in per:
        per[key] = _build(trace, None if key is None else list(key))
    return per[key]


_COLUMNS = ["id", "part", "rank", "pid", "tid", "level", "name", "ts", "dur", "parent",
            "depth", "correlation", "step", "flops"]  # fmt: skip


def _build(trace: Trace, ranks: list[int] | None) -> Tree:
    filters = [("rank", "in", ranks)] if ranks is not None else None
    tb = trace.table("events", columns=_COLUMNS, filters=filters)
    ids = _int(tb["id"])
    if len(ids) > 1 and not (np.diff(ids) > 0).all():
        tb = tb.take(pa.array(np.argsort(ids, kind="stable")))
        ids = _int(tb["id"])
    lv_codes, lv_values = _codes(tb["level"])
    lv_map = np.array([LEVEL_CODE.get(v, LEVEL_CODE["other"]) for v in lv_values], np.int8)
    level = lv_map[lv_codes] if len(lv_map) else np.zeros(len(ids), np.int8)
    name, names = _codes(tb["name"])
    dur_raw = tb["dur"]
    t = Tree(
        ids=ids,
        part=_int(tb["part"]),
        rank=_int(tb["rank"]),
        pid=_int(tb["pid"]),
        tid=_int(tb["tid"]),
        level=level,
        name=name,
        names=names,
        ts=_int(tb["ts"], 0),
        dur=np.maximum(_int(dur_raw, 0), 0),
        has_dur=np.asarray(pc.is_valid(dur_raw).to_numpy(zero_copy_only=False), bool),
        parent=_rows_of(ids, _int(tb["parent"])),
        depth=_int(tb["depth"], 0),
        corr=_int(tb["correlation"]),
        step=_int(tb["step"]),
        flops=np.asarray(pc.fill_null(tb["flops"], np.nan).to_numpy(zero_copy_only=False)),
    )
    del tb
    t._groups = _depth_groups(t.parent, t.depth)
    _resolve(trace, t, ranks)
    return t


def _layer_info(trace: Trace, t: Tree, ranks: list[int] | None) -> None:
    """Pass and module type of each layer span (args of xpuprof's spans; the class name in
    ``nn.Module: Linear_0`` Python events)."""
    t.layer_pass = np.zeros(t.n, np.int8)
    t.module_type = np.full(t.n, -1, np.int64)
    rows = np.flatnonzero(t.level == _LAYER)
    if not rows.size:
        t.module_types = np.empty(0, object)
        return
    info = trace.sql(
        "select id, args->>'$.module' as module, args->>'$.pass' as pass from events "
        f"where level = 'layer' and {where_clause(ranks)}"
    )
    r = _rows_of(t.ids, info["id"].to_numpy(np.int64))
    keep = r >= 0
    info, r = info[keep], r[keep]
    module = info["module"].astype(object).to_numpy()
    span_names = t.names[t.name[r]] if len(r) else np.empty(0, object)
    types = []
    for m, nm in zip(module, span_names, strict=True):
        if isinstance(m, str) and m:
            types.append(m)
            continue
        hit = _MODULE_EVENT.match(nm) if isinstance(nm, str) else None
        types.append(hit.group(1) if hit else (nm if isinstance(nm, str) else None))
    codes, uniq = pd.factorize(pd.Series(types, dtype=object), use_na_sentinel=True)
    t.module_type[r] = codes
    t.module_types = np.asarray(uniq, dtype=object)
    p = info["pass"].astype(object).to_numpy()
    t.layer_pass[r] = np.where(p == "backward", _BWD, _FWD)


def _launches(trace: Trace, t: Tree, links: pd.DataFrame) -> None:
    """Host event that launched each device event: a launch link, else the same correlation."""
    dev = t.is_device()
    t.launch = np.full(t.n, -1, np.int64)
    t.via = np.full(t.n, -1, np.int8)
    host = ~dev
    lk = links[links.kind.isin(LAUNCH_FLOW_KINDS)]
    if len(lk):
        s = _rows_of(t.ids, lk.src.to_numpy(np.int64))
        d = _rows_of(t.ids, lk.dst.to_numpy(np.int64))
        ok = (s >= 0) & (d >= 0)
        s, d = s[ok], d[ok]
        ok = dev[d] & host[s]
        s, d = s[ok][::-1], d[ok][::-1]  # first link wins
        t.launch[d] = s
        t.via[d] = 0
    need = np.flatnonzero(dev & (t.launch < 0) & (t.corr >= 0))
    if need.size:
        cand = np.flatnonzero(host & (t.corr >= 0))
        if cand.size:
            h = pd.DataFrame(
                {
                    "part": t.part[cand],
                    "corr": t.corr[cand],
                    "pri": (t.level[cand] != _RUNTIME).astype(np.int8),
                    "row": cand,
                }
            )
            h = h.sort_values(["part", "corr", "pri", "row"]).drop_duplicates(["part", "corr"])
            q = pd.DataFrame({"part": t.part[need], "corr": t.corr[need], "q": need})
            m = q.merge(h[["part", "corr", "row"]], on=["part", "corr"], how="inner")
            t.launch[m.q.to_numpy()] = m.row.to_numpy()
            t.via[m.q.to_numpy()] = 1


def _backward(trace: Trace, t: Tree, links: pd.DataFrame, ranks: list[int] | None) -> tuple:
    """(fwd_of, is_fwd_src): forward op of each backward root, and the forward ops."""
    fwd_of = np.full(t.n, -1, np.int64)
    is_src = np.zeros(t.n, bool)
    lk = links[links.kind == BACKWARD_KIND]
    is_op = t.level == _OP
    if len(lk):
        s = _rows_of(t.ids, lk.src.to_numpy(np.int64))
        d = _rows_of(t.ids, lk.dst.to_numpy(np.int64))
        ok = (s >= 0) & (d >= 0)
        s, d = s[ok], d[ok]
        fwd_of[d[::-1]] = s[::-1]
        is_src[s] = True
        # the evaluate_function wrapper around a linked XBackward0 is a root too
        p = t.parent[d]
        okp = p >= 0
        d2, p2 = d[okp], p[okp]
        if d2.size:
            want = np.array([EVALUATE_PREFIX + str(x) for x in t.names[t.name[d2]]], object)
            got = t.names[t.name[p2]]
            hit = (got == want) & is_op[p2] & (fwd_of[p2] < 0)
            fwd_of[p2[hit]] = fwd_of[d2[hit]]
    # backward ops that no link covers: match sequence numbers
    bwd_name = np.array(
        [bool(_BACKWARD_NAME.search(v)) if isinstance(v, str) else False for v in t.names], bool
    )
    is_bwd = is_op & (bwd_name[t.name] if len(bwd_name) else np.zeros(t.n, bool))
    covered = t.inherit(np.where(fwd_of >= 0, np.arange(t.n), -1)) >= 0
    todo = is_bwd & ~covered
    if todo.any():
        seq = trace.sql(
            "select id, try_cast(args->>'$.\"Sequence number\"' as bigint) as seq from events "
            f"where level = 'op' and {where_clause(ranks)} and args like '%Sequence number%'"
        )
        seq = seq[seq.seq.notna()]
        r = _rows_of(t.ids, seq["id"].to_numpy(np.int64))
        sq = seq.seq.to_numpy(np.int64)
        ok = r >= 0
        r, sq = r[ok], sq[ok]
        fw = ~is_bwd[r]
        fwd = pd.DataFrame({"part": t.part[r[fw]], "seq": sq[fw], "ts": t.ts[r[fw]],
                            "depth": t.depth[r[fw]], "fwd": r[fw]})  # fmt: skip
        bw = todo[r]
        q = pd.DataFrame({"part": t.part[r[bw]], "seq": sq[bw], "ts": t.ts[r[bw]], "q": r[bw]})
        if len(fwd) and len(q):
            # the latest forward op with this number starting before the backward op
            fwd = fwd.sort_values(["ts", "depth"])
            q = q.sort_values("ts")
            m = pd.merge_asof(q, fwd, on="ts", by=["part", "seq"], direction="backward")
            m = m[m.fwd.notna()]
            fwd_of[m.q.to_numpy(np.int64)] = m.fwd.to_numpy(np.int64)
            is_src[m.fwd.to_numpy(np.int64)] = True
            n_seq = len(m)
        else:
            n_seq = 0
        if n_seq:
            t.notes.append(
                f"{n_seq:,} backward op(s) without a fwdbwd link were matched to their "
                "forward op by sequence number"
            )
    return fwd_of, is_src


def _layers(t: Tree) -> np.ndarray:
    """Innermost layer span of every event (itself for a layer span); sets ``t.layer_up``.

    Layer spans are nested among themselves by time (they share one clock). An event is in the
    innermost span of its track that contains its *start*: a module call is synchronous, so
    whatever starts inside its forward belongs to it, even where converting between the
    profiler's clock and the layer spans' clock (xpuprof's hooks) makes an op seem to end a
    microsecond after the span. The rule is applied where the clocks meet — events whose
    parent is a layer or step span, or none — and everything below inherits through
    ``parent``, so an op's subtree stays in one layer.
    """
    from xpuprof.trace.normalize import nest

    n = t.n
    lv = t.level
    spans = np.flatnonzero((lv == _LAYER) & t.has_dur)
    t.layer_up = np.full(n, -1, np.int64)
    own = np.where(lv == _LAYER, np.arange(n, dtype=np.int64), -1)
    if not spans.size:
        return t.inherit(own)
    order, ppos, _, _ = nest(t.pid[spans], t.tid[spans], t.ts[spans], t.dur[spans],
                             np.ones(spans.size, bool))  # fmt: skip
    srow = spans[order]  # spans sorted by (pid, tid, start, longest first)
    s_up = np.where(ppos >= 0, srow[np.maximum(ppos, 0)], -1)
    t.layer_up[srow] = s_up
    s_ts, s_end = t.ts[srow], t.ts[srow] + t.dur[srow]
    pos_of = np.full(n, -1, np.int64)
    pos_of[srow] = np.arange(srow.size)
    par = t.parent
    plv = np.where(par >= 0, lv[np.maximum(par, 0)], -1)
    anchor = (lv != _LAYER) & ~t.is_device() & ((par < 0) | (plv == _LAYER) | (plv == _STEP))
    tracks = pd.DataFrame({"pid": t.pid[srow], "tid": t.tid[srow], "i": np.arange(srow.size)})
    bounds = tracks.groupby(["pid", "tid"], sort=False)["i"].agg(["min", "max"])
    for (p, tid), (lo, hi) in bounds.iterrows():
        q = np.flatnonzero(anchor & (t.pid == p) & (t.tid == tid))
        if not q.size:
            continue
        x = t.ts[q]
        c = lo + np.searchsorted(s_ts[lo : hi + 1], x, side="right") - 1
        c = np.where(c >= lo, c, -1)
        live = np.flatnonzero(c >= 0)
        while live.size:  # climb to the innermost span that still contains x
            cc = c[live]
            bad = s_end[cc] <= x[live]
            up = s_up[cc[bad]]
            c[live[bad]] = np.where(up >= 0, pos_of[np.maximum(up, 0)], -1)
            live = live[bad]
            live = live[c[live] >= 0]
        hit = c >= 0
        own[q[hit]] = srow[c[hit]]
    return t.inherit(own)


def _resolve(trace: Trace, t: Tree, ranks: list[int] | None) -> None:
    n = t.n
    rows = np.arange(n, dtype=np.int64)
    lv = t.level
    links = trace.table("links", columns=["kind", "src", "dst", "rank"]).to_pandas()
    if ranks is not None:
        links = links[links["rank"].isin(ranks)]
    links["kind"] = links["kind"].astype(object).str.lower()
    _layer_info(trace, t, ranks)
    step_row = t.inherit(np.where(lv == _STEP, rows, -1))
    layer_own = _layers(t)
    leaf = t.inherit(np.where(lv == _OP, rows, -1))
    outer = t.outermost(np.where(lv == _OP, rows, -1))
    runtime = t.inherit(np.where(lv == _RUNTIME, rows, -1))
    annotation = t.inherit(np.where(lv == _ANNOTATION, rows, -1))
    t.op_up = t.above(leaf)

    fwd_of, is_src = _backward(trace, t, links, ranks)
    t.is_bwd_root = fwd_of >= 0
    fwd_op = t.inherit(fwd_of)
    in_src = t.inherit(np.where(is_src, rows, -1)) >= 0

    layer = layer_own.copy()
    b = np.flatnonzero(fwd_op >= 0)
    via_fwd = layer_own[fwd_op[b]]
    layer[b] = np.where(via_fwd >= 0, via_fwd, layer_own[b])
    passes = np.zeros(n, np.int8)
    has_layer = layer_own >= 0
    passes[has_layer] = t.layer_pass[layer_own[has_layer]]
    passes[(passes == 0) & in_src] = _FWD
    passes[fwd_op >= 0] = _BWD

    # device events take the ancestry of the host call that launched them
    _launches(trace, t, links)
    d = np.flatnonzero(t.launch >= 0)
    src = t.launch[d]
    for arr in (step_row, layer, leaf, outer, runtime, fwd_op, passes):
        arr[d] = arr[src]
    ann_dev = annotation[src]
    annotation[d] = np.where(ann_dev >= 0, ann_dev, annotation[d])
    # device events with no launch: nothing above them but their own track's annotations
    lost = np.flatnonzero(t.is_device() & (t.launch < 0))
    for arr in (step_row, layer, leaf, outer, runtime, fwd_op):
        arr[lost] = -1
    passes[lost] = 0
    # step spans on other threads: by (part, step number)
    miss = np.flatnonzero((step_row < 0) & (t.step >= 0))
    srows = np.flatnonzero(lv == _STEP)
    if miss.size and srows.size:
        s = pd.DataFrame({"part": t.part[srows], "step": t.step[srows], "row": srows})
        s = s.sort_values("row").drop_duplicates(["part", "step"])
        q = pd.DataFrame({"part": t.part[miss], "step": t.step[miss], "q": miss})
        m = q.merge(s, on=["part", "step"])
        step_row[m.q.to_numpy()] = m.row.to_numpy()
    t.step_row, t.layer, t.leaf_op, t.op = step_row, layer, leaf, outer
    t.runtime, t.annotation, t.fwd_op, t.passes = runtime, annotation, fwd_op, passes


# ----------------------------------------------------------------------------------------------
# ancestry
# ----------------------------------------------------------------------------------------------


def _cat(t: Tree, rows: np.ndarray) -> pd.Categorical:
    codes = np.where(rows >= 0, t.name[np.maximum(rows, 0)], -1)
    return pd.Categorical.from_codes(codes, categories=pd.Index(t.names, dtype=object))


def _opt_int(values: np.ndarray, valid: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(np.where(valid, values, 0).astype(np.int64, copy=False), ~valid)


def _id(t: Tree, rows: np.ndarray) -> pd.arrays.IntegerArray:
    return _opt_int(t.ids[np.maximum(rows, 0)] if len(rows) else rows, rows >= 0)


def _select(
    t: Tree,
    steps: Iterable[int] | None,
    levels: Iterable[str] | None,
) -> np.ndarray:
    mask = np.ones(t.n, bool)
    if levels is not None:
        want = [LEVEL_CODE[lv] for lv in levels if lv in LEVEL_CODE]
        unknown = [lv for lv in levels if lv not in LEVEL_CODE]
        if unknown:
            raise XpuprofError(f"unknown level(s) {unknown}; levels are: {', '.join(LEVELS)}")
        mask &= np.isin(t.level, np.array(want, np.int8))
    if steps is not None:
        mask &= np.isin(t.step, np.array([int(s) for s in steps], np.int64))
    return np.flatnonzero(mask)


def ancestry(
    trace: Trace,
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    levels: Iterable[str] | None = None,
) -> pd.DataFrame:
    """One row per event (optionally only some ranks, steps, levels) with its ancestry.

    Columns: ``id``, ``rank``, ``level``, ``name``, ``ts``, ``dur``, ``step`` (number) and, as
    ids and names, ``step_id``; ``layer_id``/``layer`` (innermost layer span; a backward op's
    is its forward op's), ``module_type``; ``op_id``/``op`` (outermost framework op);
    ``leaf_op_id``/``leaf_op`` (innermost: for device work, the op that launched it);
    ``runtime_id``/``runtime``; ``annotation_id``/``annotation`` (innermost user annotation);
    ``launch_id`` and ``via`` (device work: the host call that launched it and whether a link
    or the correlation id found it); ``fwd_op_id``/``fwd_op`` (under a backward op: the
    forward op it differentiates); ``pass`` (forward/backward/null). An event is its own
    ancestor at its level (an op's ``leaf_op`` is itself).
    """
    t = tree(trace, ranks)
    sel = _select(t, steps, levels)
    lt = t.layer[sel]
    mt = np.where(lt >= 0, t.module_type[np.maximum(lt, 0)], -1) if len(sel) else lt
    df = pd.DataFrame(
        {
            "id": t.ids[sel],
            "rank": _opt_int(t.rank[sel], t.rank[sel] >= 0),
            "level": pd.Categorical.from_codes(t.level[sel].astype(np.int64), LEVELS),
            "name": _cat(t, sel),
            "ts": t.ts[sel],
            "dur": _opt_int(t.dur[sel], t.has_dur[sel]),
            "step": _opt_int(t.step[sel], t.step[sel] >= 0),
            "step_id": _id(t, t.step_row[sel]),
            "layer_id": _id(t, lt),
            "layer": _cat(t, lt),
            "module_type": pd.Categorical.from_codes(
                mt, categories=pd.Index(t.module_types, dtype=object)
            ),
            "op_id": _id(t, t.op[sel]),
            "op": _cat(t, t.op[sel]),
            "leaf_op_id": _id(t, t.leaf_op[sel]),
            "leaf_op": _cat(t, t.leaf_op[sel]),
            "runtime_id": _id(t, t.runtime[sel]),
            "runtime": _cat(t, t.runtime[sel]),
            "annotation_id": _id(t, t.annotation[sel]),
            "annotation": _cat(t, t.annotation[sel]),
            "launch_id": _id(t, t.launch[sel]),
            "via": pd.Categorical.from_codes(t.via[sel].astype(np.int64), VIA),
            "fwd_op_id": _id(t, t.fwd_op[sel]),
            "fwd_op": _cat(t, t.fwd_op[sel]),
            "pass": pd.Categorical.from_codes(t.passes[sel].astype(np.int64) - 1, PASSES),
        },
        copy=False,
    )
    df.attrs["notes"] = list(t.notes)
    return df


# ----------------------------------------------------------------------------------------------
# attribution
# ----------------------------------------------------------------------------------------------


def _expand(start: np.ndarray, up: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item, node, round) for every node on each item's chain: ``start[i]`` then ``up`` of
    it, recursively (round 0 is the item's own node)."""
    items, nodes, rounds = [], [], []
    idx = np.flatnonzero(start >= 0)
    cur = start[idx]
    k = 0
    while idx.size:
        items.append(idx)
        nodes.append(cur)
        rounds.append(np.full(idx.size, k, np.int32))
        nxt = up[cur]
        ok = nxt >= 0
        idx, cur = idx[ok], nxt[ok]
        k += 1
        if k > 10_000:
            raise XpuprofError("the event tree has a cycle (corrupt parent column)")
    if not items:
        e = np.empty(0, np.int64)
        return e, e, np.empty(0, np.int32)
    return np.concatenate(items), np.concatenate(nodes), np.concatenate(rounds)


@dataclass
class Rollup:
    """Device time of items rolled up a chain of nodes, per key (a name, a module type...)."""

    inclusive: np.ndarray
    count: np.ndarray
    exclusive: np.ndarray
    exclusive_count: np.ndarray
    item: np.ndarray  # (item, key) pairs, each pair once
    key: np.ndarray


def roll_up(
    start: np.ndarray, up: np.ndarray, key_of: np.ndarray, n_keys: int, weight: np.ndarray
) -> Rollup:
    """Sum ``weight`` of items up their chain (``start[i]``, then ``up`` of it...): each item
    counts once per key however often the key recurs on its chain (inclusive), and once for
    the key of its own node (exclusive). ``key_of`` maps nodes to keys (-1: skip the node but
    keep climbing)."""
    item, node, _ = _expand(start, up)
    key = key_of[node]
    ok = key >= 0
    item, key = item[ok], key[ok]
    if len(item):
        _, first = np.unique(item.astype(np.int64) * max(n_keys, 1) + key, return_index=True)
        item, key = item[first], key[first]
    s = np.flatnonzero(start >= 0)
    k0 = key_of[start[s]]
    ok0 = k0 >= 0
    w = np.asarray(weight, np.float64)
    return Rollup(
        inclusive=np.bincount(key, weights=w[item], minlength=n_keys)[:n_keys],
        count=np.bincount(key, minlength=n_keys)[:n_keys].astype(np.int64),
        exclusive=np.bincount(k0[ok0], weights=w[s[ok0]], minlength=n_keys)[:n_keys],
        exclusive_count=np.bincount(k0[ok0], minlength=n_keys)[:n_keys].astype(np.int64),
        item=item,
        key=key,
    )


def _rank_keys(t: Tree, rows: np.ndarray, per_rank: bool) -> tuple[np.ndarray, np.ndarray]:
    """(rank index of each row, the ranks): one bucket when not per rank."""
    if not per_rank:
        return np.zeros(len(rows), np.int64), np.array([-1], np.int64)
    ranks, idx = np.unique(t.rank, return_inverse=True)
    return idx.reshape(-1)[rows].astype(np.int64), ranks


def attribute(
    trace: Trace,
    by: str = "layer",
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    levels: Iterable[str] = DEVICE_LEVELS,
    per_rank: bool = False,
) -> pd.DataFrame:
    """Device time attributed up the tree, one row per node name (``by`` = ``layer``: module
    path; ``module_type``; ``op``: op name; ``step``: step number; ``runtime``: runtime call).

    Columns: the key (and ``rank`` with ``per_rank``), ``calls`` (instances of the node),
    ``device_ns`` (inclusive: device time under it, each device event once per key),
    ``device_exclusive_ns`` (not under a child of the same level), ``kernels`` and
    ``kernels_exclusive`` (device events counted the same ways), ``forward_ns`` and
    ``backward_ns`` (inclusive time split by pass), ``device_pct`` (inclusive share of the
    selected device time). Layers also get ``module_type`` and ``parent`` (the enclosing
    module path). ``attrs`` holds ``device_ns`` (all selected device time),
    ``unattributed_ns`` (device time with no node of this level above it) and ``notes``.
    """
    if by not in BY:
        raise XpuprofError(f"unknown attribution level {by!r}; choose one of: {', '.join(BY)}")
    t = tree(trace, ranks)
    dev = _select(t, steps, levels)
    dev = dev[t.has_dur[dev]]
    w = t.dur[dev].astype(np.float64)
    total = float(w.sum())
    notes = list(t.notes)
    if not len(dev):
        notes.append("no device events (kernels, copies, collectives) in the selection: "
                     "there is no device time to attribute")  # fmt: skip
    none = np.full(t.n, -1, np.int64)
    if by in ("layer", "module_type"):
        start, up, nodes = t.layer[dev], t.layer_up, np.flatnonzero(t.level == _LAYER)
        base_key, labels = (t.name, t.names) if by == "layer" else (t.module_type, t.module_types)
        if not nodes.size:
            notes.append("no layer spans in this trace: capture with xpuprof.profile("
                         "level='layer' or 'op', model=...) or with_stack=True")  # fmt: skip
    elif by == "op":
        start, up, nodes = t.leaf_op[dev], t.op_up, np.flatnonzero(t.level == _OP)
        base_key, labels = t.name, t.names
    elif by == "runtime":
        start, up, nodes = t.runtime[dev], none, np.flatnonzero(t.level == _RUNTIME)
        base_key, labels = t.name, t.names
    else:  # step: keyed by the step number, whatever thread the work ran on
        return _attribute_steps(t, dev, w, total, steps, per_rank, notes)
    if steps is not None:
        nodes = nodes[np.isin(t.step[nodes], np.array([int(s) for s in steps], np.int64))]
    n_labels = max(len(labels), 1)
    rk, rank_values = _rank_keys(t, np.arange(t.n), per_rank)
    key_of = np.where(base_key >= 0, rk * n_labels + base_key, -1)
    n_keys = n_labels * len(rank_values)
    r = roll_up(start, up, key_of, n_keys, w)
    calls = np.bincount(key_of[nodes][key_of[nodes] >= 0], minlength=n_keys)[:n_keys]
    passes = t.passes[dev]
    fwd = np.bincount(r.key, weights=(w * (passes == _FWD))[r.item], minlength=n_keys)[:n_keys]
    bwd = np.bincount(r.key, weights=(w * (passes == _BWD))[r.item], minlength=n_keys)[:n_keys]
    keys = np.flatnonzero((calls > 0) | (r.count > 0))
    out = pd.DataFrame(
        {
            by: pd.Series(labels[keys % n_labels] if len(labels) else [], dtype=object),
            "calls": calls[keys].astype(np.int64),
            "kernels": r.count[keys],
            "kernels_exclusive": r.exclusive_count[keys],
            "device_ns": r.inclusive[keys].round().astype(np.int64),
            "device_exclusive_ns": r.exclusive[keys].round().astype(np.int64),
            "forward_ns": fwd[keys].round().astype(np.int64),
            "backward_ns": bwd[keys].round().astype(np.int64),
            "device_pct": 100.0 * r.inclusive[keys] / total if total else np.nan,
        }
    )
    if per_rank:
        out.insert(1, "rank", rank_values[keys // n_labels])
    if by == "layer":
        # module type and enclosing path of each name's first span
        first = pd.DataFrame({"key": key_of[nodes], "row": nodes}).drop_duplicates("key")
        f = dict(zip(first.key.to_numpy(), first.row.to_numpy(), strict=True))
        rows = np.array([f.get(k, -1) for k in keys], np.int64)
        mt = np.where(rows >= 0, t.module_type[np.maximum(rows, 0)], -1)
        up_rows = np.where(rows >= 0, t.layer_up[np.maximum(rows, 0)], -1)
        out.insert(1, "module_type", [t.module_types[m] if m >= 0 else None for m in mt])
        out.insert(2, "parent", [t.names[t.name[u]] if u >= 0 else None for u in up_rows])
    attributed = float(w[start >= 0].sum())
    out = out.sort_values(["device_ns", "calls"], ascending=False, kind="stable")
    out = out.reset_index(drop=True)
    out.attrs.update(device_ns=int(total), unattributed_ns=int(round(total - attributed)),
                     notes=notes)  # fmt: skip
    if total and total - attributed > 0:
        notes.append(
            f"{100 * (total - attributed) / total:.1f} % of device time has no {by} above it "
            "(launched outside any, or its launch is not in the trace)"
        )
    return out


def _attribute_steps(
    t: Tree,
    dev: np.ndarray,
    w: np.ndarray,
    total: float,
    steps: Iterable[int] | None,
    per_rank: bool,
    notes: list[str],
) -> pd.DataFrame:
    srows = np.flatnonzero(t.level == _STEP)
    if steps is not None:
        srows = srows[np.isin(t.step[srows], np.array([int(s) for s in steps], np.int64))]
    keys = ["rank", "step"] if per_rank else ["step"]
    d = pd.DataFrame(
        {
            "rank": t.rank[dev],
            "step": t.step[dev],
            "w": w,
            "fwd": w * (t.passes[dev] == _FWD),
            "bwd": w * (t.passes[dev] == _BWD),
        }
    )
    d = d[d.step >= 0]  # fmt: skip
    g = d.groupby(keys).agg(kernels=("w", "size"), device_ns=("w", "sum"),
                            forward_ns=("fwd", "sum"), backward_ns=("bwd", "sum"))  # fmt: skip
    s = pd.DataFrame({"rank": t.rank[srows], "step": t.step[srows], "dur": t.dur[srows]})
    c = s.groupby(keys).agg(calls=("dur", "size"), step_ns=("dur", "sum"))
    out = c.join(g, how="outer").reset_index()
    for col in ("calls", "kernels", "step_ns", "device_ns", "forward_ns", "backward_ns"):
        out[col] = out[col].fillna(0).round().astype(np.int64)
    out["kernels_exclusive"] = out["kernels"]
    out["device_exclusive_ns"] = out["device_ns"]
    out["device_pct"] = 100.0 * out.device_ns / total if total else np.nan
    cols = [*keys, "calls", "step_ns", "kernels", "kernels_exclusive", "device_ns",
            "device_exclusive_ns", "forward_ns", "backward_ns", "device_pct"]  # fmt: skip
    out = out[cols].sort_values(keys).reset_index(drop=True)
    if "rank" in out:
        out["rank"] = out["rank"].where(out["rank"] >= 0)
    attributed = float(d.w.sum())
    if not len(srows):
        notes.append("no step spans in this trace: steps are unknown")
    out.attrs.update(device_ns=int(total), unattributed_ns=int(round(total - attributed)),
                     notes=notes)  # fmt: skip
    return out


def hierarchy(
    trace: Trace,
    by: str = "layer",
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    per_rank: bool = False,
) -> Any:
    """``attribute`` as a :class:`~xpuprof.analysis.common.Result` (table ``by``, plus notes):
    what ``xpuprof hierarchy STORE --by layer`` prints."""
    from xpuprof.analysis.common import Result

    df = attribute(trace, by=by, ranks=ranks, steps=steps, per_rank=per_rank)
    notes = list(df.attrs.get("notes", []))
    total = df.attrs.get("device_ns", 0)
    if total:
        lost = df.attrs.get("unattributed_ns", 0)
        notes.insert(0, f"device time {total / 1e6:,.3f} ms ({lost / 1e6:,.3f} ms with no {by})")
    df.attrs.clear()
    return Result(tables={by: df}, notes=notes)

"""Across-stack hierarchy (the XSP idea): every event's ancestry, step → layer → op → runtime
call → device activity, and device time attributed up that tree.

Built on the one event tree (``Trace.tree``); what this module adds is resolved here and cached
on the Trace: layers matched by time across clocks, launches of device work, backward roots and
passes. ``docs/hierarchy.md`` defines every rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.analysis.common import DEVICE_LEVELS, Result, select_rows, steps_mask, where_clause
from xpuprof.core.errors import XpuprofError
from xpuprof.core.names import LAUNCH_FLOW_KINDS, LEVELS
from xpuprof.trace.tree import LEVEL_CODE, roll_up

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.analysis.common import StepSelection
    from xpuprof.trace.trace import Trace
    from xpuprof.trace.tree import EventTree

_STEP, _LAYER, _OP, _RUNTIME = (LEVEL_CODE[x] for x in ("step", "layer", "op", "runtime"))
_ANNOTATION = LEVEL_CODE["annotation"]

BACKWARD_KIND = "fwdbwd"
EVALUATE_PREFIX = "autograd::engine::evaluate_function: "
_BACKWARD_NAME = re.compile(r"Backward\d*$")
_MODULE_EVENT = re.compile(r"^nn\.Module: (.*?)(?:_\d+)?$")

#: ``pass`` values, and their codes in ``Ancestry.passes`` (0: neither).
PASSES = ("forward", "backward")
FORWARD, BACKWARD = 1, 2

#: ``via``: how a device event found its launch.
VIA = ("link", "correlation")

BY = ("layer", "module_type", "op", "step", "runtime")
_COLUMNS = ("pid", "tid", "ts", "dur", "correlation", "step", "flops")  # read with the tree


# ----------------------------------------------------------------------------------------------
# the resolved ancestry
# ----------------------------------------------------------------------------------------------


def _none(dtype: Any = np.int64) -> Any:
    return field(default_factory=lambda: np.empty(0, dtype))


@dataclass(eq=False)
class Ancestry:
    """Every event's resolved ancestry over an event tree: arrays indexed by the tree's rows,
    each a row (-1: none) unless said otherwise. ``layer``: innermost layer (a backward op's:
    its forward op's); ``leaf_op``/``op``: innermost/outermost op; ``launch``: for device
    events, the host call; ``via``: index into ``VIA``; ``passes``: FORWARD/BACKWARD/0;
    ``layer_up``/``op_up``: for a node, the enclosing node of its kind; ``layer_pass`` and
    ``module_type`` (codes into ``module_types``): of each layer span."""

    tree: EventTree
    step_row: np.ndarray = _none()
    layer: np.ndarray = _none()
    leaf_op: np.ndarray = _none()
    op: np.ndarray = _none()
    runtime: np.ndarray = _none()
    annotation: np.ndarray = _none()
    launch: np.ndarray = _none()
    via: np.ndarray = _none(np.int8)
    fwd_op: np.ndarray = _none()
    passes: np.ndarray = _none(np.int8)
    layer_up: np.ndarray = _none()
    op_up: np.ndarray = _none()
    layer_pass: np.ndarray = _none(np.int8)
    module_type: np.ndarray = _none()
    module_types: np.ndarray = _none(object)
    is_bwd_root: np.ndarray = _none(bool)
    notes: list[str] = field(default_factory=list)


def resolve(trace: Trace, ranks: Iterable[int] | None = None) -> Ancestry:
    """The resolved ancestry of a store's events (some ranks, or all), cached on the Trace."""
    key = ("hierarchy", None if ranks is None else tuple(sorted({int(r) for r in ranks})))
    if key not in trace.memo:
        a = Ancestry(tree=trace.tree(key[1], columns=_COLUMNS))
        _resolve(trace, a, None if key[1] is None else list(key[1]))
        trace.memo[key] = a
    return trace.memo[key]


def _layer_info(trace: Trace, a: Ancestry, ranks: list[int] | None) -> None:
    """Pass and module type of each layer span (args of xpuprof's spans; the class name in
    ``nn.Module: Linear_0`` Python events)."""
    t = a.tree
    a.layer_pass = np.zeros(t.n, np.int8)
    a.module_type = np.full(t.n, -1, np.int64)
    rows = np.flatnonzero(t.level == _LAYER)
    if not rows.size:
        return
    info = trace.sql(
        "select id, args->>'$.module' as module, args->>'$.pass' as pass from events "
        f"where level = 'layer' and {where_clause(ranks)}"
    )
    r = t.rows_of(info["id"].to_numpy(np.int64))
    keep = r >= 0
    info, r = info[keep], r[keep]
    module = info["module"].astype(object).reset_index(drop=True)
    names = pd.Series(t.names_of(r), dtype=object)
    from_name = names.str.extract(_MODULE_EVENT, expand=False).fillna(names)
    types = module.where(module.notna() & (module != ""), from_name)
    codes, uniq = pd.factorize(types, use_na_sentinel=True)
    a.module_type[r] = codes
    a.module_types = np.asarray(uniq, dtype=object)
    p = info["pass"].astype(object).to_numpy()
    a.layer_pass[r] = np.where(p == "backward", BACKWARD, FORWARD)


def _launches(a: Ancestry, links: pd.DataFrame) -> None:
    """Host event that launched each device event: a launch link, else the same correlation."""
    t = a.tree
    dev = t.is_device
    a.launch = np.full(t.n, -1, np.int64)
    a.via = np.full(t.n, -1, np.int8)
    lk = links[links.kind.isin(LAUNCH_FLOW_KINDS)]
    if len(lk):
        s = t.rows_of(lk.src.to_numpy(np.int64))
        d = t.rows_of(lk.dst.to_numpy(np.int64))
        ok = (s >= 0) & (d >= 0)
        s, d = s[ok], d[ok]
        ok = dev[d] & ~dev[s]
        s, d = s[ok][::-1], d[ok][::-1]  # first link wins
        a.launch[d] = s
        a.via[d] = 0
    need = np.flatnonzero(dev & (a.launch < 0) & (t.correlation >= 0))
    if need.size:
        got = t.host_calls(t.part[need], t.correlation[need])
        ok = got >= 0
        a.launch[need[ok]] = got[ok]
        a.via[need[ok]] = 1


def _link_roots(a: Ancestry, links: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(fwd_of, is_src) from ``fwdbwd`` links: forward op of each backward root."""
    t = a.tree
    fwd_of = np.full(t.n, -1, np.int64)
    is_src = np.zeros(t.n, bool)
    lk = links[links.kind == BACKWARD_KIND]
    if not len(lk):
        return fwd_of, is_src
    s = t.rows_of(lk.src.to_numpy(np.int64))
    d = t.rows_of(lk.dst.to_numpy(np.int64))
    ok = (s >= 0) & (d >= 0)
    s, d = s[ok], d[ok]
    fwd_of[d[::-1]] = s[::-1]
    is_src[s] = True
    # the evaluate_function wrapper around a linked XBackward0 is a root too
    p = t.parent[d]
    okp = p >= 0
    d2, p2 = d[okp], p[okp]
    if d2.size:
        want = np.array([EVALUATE_PREFIX + str(x) for x in t.names_of(d2)], object)
        hit = (t.names_of(p2) == want) & (t.level[p2] == _OP) & (fwd_of[p2] < 0)
        fwd_of[p2[hit]] = fwd_of[d2[hit]]
    return fwd_of, is_src


def _backward(
    trace: Trace, a: Ancestry, links: pd.DataFrame, ranks: list[int] | None
) -> tuple[np.ndarray, np.ndarray]:
    """(fwd_of, is_fwd_src): forward op of each backward root, and the forward ops."""
    t = a.tree
    fwd_of, is_src = _link_roots(a, links)
    # backward ops that no link covers: match sequence numbers
    is_bwd = (t.level == _OP) & t.name_mask(_BACKWARD_NAME.search)
    covered = t.inherit(np.where(fwd_of >= 0, np.arange(t.n), -1)) >= 0
    todo = is_bwd & ~covered
    if not todo.any():
        return fwd_of, is_src
    seq = trace.sql(
        "select id, try_cast(args->>'$.\"Sequence number\"' as bigint) as seq from events "
        f"where level = 'op' and {where_clause(ranks)} and args like '%Sequence number%'"
    )
    seq = seq[seq.seq.notna()]
    r = t.rows_of(seq["id"].to_numpy(np.int64))
    sq = seq.seq.to_numpy(np.int64)
    ok = r >= 0
    r, sq = r[ok], sq[ok]
    fw = ~is_bwd[r]
    fwd = pd.DataFrame({"part": t.part[r[fw]], "seq": sq[fw], "ts": t.ts[r[fw]],
                        "depth": t.depth[r[fw]], "fwd": r[fw]})  # fmt: skip
    bw = todo[r]
    q = pd.DataFrame({"part": t.part[r[bw]], "seq": sq[bw], "ts": t.ts[r[bw]], "q": r[bw]})
    if not len(fwd) or not len(q):
        return fwd_of, is_src
    # the latest forward op with this number starting before the backward op
    m = pd.merge_asof(q.sort_values("ts"), fwd.sort_values(["ts", "depth"]), on="ts",
                      by=["part", "seq"], direction="backward")  # fmt: skip
    m = m[m.fwd.notna()]
    fwd_of[m.q.to_numpy(np.int64)] = m.fwd.to_numpy(np.int64)
    is_src[m.fwd.to_numpy(np.int64)] = True
    if len(m):
        a.notes.append(
            f"{len(m):,} backward op(s) without a fwdbwd link were matched to their "
            "forward op by sequence number"
        )
    return fwd_of, is_src


def _layers(a: Ancestry) -> np.ndarray:
    """Innermost layer span of every event (itself for a layer span); sets ``a.layer_up``.

    Layer spans are nested among themselves by time (they share one clock). An event is in the
    innermost span of its track that contains its *start* (``docs/hierarchy.md``); the rule is
    applied where the clocks meet — events whose parent is a layer or step span, or none — and
    everything below inherits through ``parent``, so an op's subtree stays in one layer.
    """
    from xpuprof.trace.nesting import nest

    t = a.tree
    n, lv = t.n, t.level
    spans = np.flatnonzero((lv == _LAYER) & t.has_dur)
    a.layer_up = np.full(n, -1, np.int64)
    own = np.where(lv == _LAYER, np.arange(n, dtype=np.int64), -1)
    if not spans.size:
        return t.inherit(own)
    order, ppos, _, _ = nest(t.pid[spans], t.tid[spans], t.ts[spans], t.dur[spans],
                             np.ones(spans.size, bool))  # fmt: skip
    srow = spans[order]  # spans sorted by (pid, tid, start, longest first)
    s_up = np.where(ppos >= 0, srow[np.maximum(ppos, 0)], -1)
    a.layer_up[srow] = s_up
    s_ts, s_end = t.ts[srow], t.ts[srow] + t.dur[srow]
    pos_of = np.full(n, -1, np.int64)
    pos_of[srow] = np.arange(srow.size)
    par = t.parent
    plv = np.where(par >= 0, lv[np.maximum(par, 0)], -1)
    anchor = (lv != _LAYER) & ~t.is_device & ((par < 0) | (plv == _LAYER) | (plv == _STEP))
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


def _resolve(trace: Trace, a: Ancestry, ranks: list[int] | None) -> None:
    t = a.tree
    rows, lv = np.arange(t.n, dtype=np.int64), t.level
    links = trace.table("links", columns=["kind", "src", "dst", "rank"]).to_pandas()
    if ranks is not None:
        links = links[links["rank"].isin(ranks)]
    links["kind"] = links["kind"].astype(object).str.lower()
    _layer_info(trace, a, ranks)
    step_row = t.inherit(np.where(lv == _STEP, rows, -1))
    layer_own = _layers(a)
    leaf = t.inherit(np.where(lv == _OP, rows, -1))
    outer = t.outermost(np.where(lv == _OP, rows, -1))
    runtime = t.inherit(np.where(lv == _RUNTIME, rows, -1))
    annotation = t.inherit(np.where(lv == _ANNOTATION, rows, -1))
    a.op_up = t.above(leaf)

    fwd_of, is_src = _backward(trace, a, links, ranks)
    a.is_bwd_root = fwd_of >= 0
    fwd_op = t.inherit(fwd_of)
    in_src = t.inherit(np.where(is_src, rows, -1)) >= 0

    layer = layer_own.copy()
    b = np.flatnonzero(fwd_op >= 0)
    via_fwd = layer_own[fwd_op[b]]
    layer[b] = np.where(via_fwd >= 0, via_fwd, layer_own[b])
    passes = np.zeros(t.n, np.int8)
    has_layer = layer_own >= 0
    passes[has_layer] = a.layer_pass[layer_own[has_layer]]
    passes[(passes == 0) & in_src] = FORWARD
    passes[fwd_op >= 0] = BACKWARD

    # device events take the ancestry of the host call that launched them
    _launches(a, links)
    d = np.flatnonzero(a.launch >= 0)
    src = a.launch[d]
    for arr in (step_row, layer, leaf, outer, runtime, fwd_op, passes):
        arr[d] = arr[src]
    ann_dev = annotation[src]
    annotation[d] = np.where(ann_dev >= 0, ann_dev, annotation[d])
    # device events with no launch: nothing above them but their own track's annotations
    lost = np.flatnonzero(t.is_device & (a.launch < 0))
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
    a.step_row, a.layer, a.leaf_op, a.op = step_row, layer, leaf, outer
    a.runtime, a.annotation, a.fwd_op, a.passes = runtime, annotation, fwd_op, passes


# ----------------------------------------------------------------------------------------------
# ancestry
# ----------------------------------------------------------------------------------------------


def _cat(t: EventTree, rows: np.ndarray) -> pd.Categorical:
    codes = np.where(rows >= 0, t.name[np.maximum(rows, 0)], -1)
    return pd.Categorical.from_codes(codes, categories=pd.Index(t.names, dtype=object))


def _opt_int(values: np.ndarray, valid: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(np.where(valid, values, 0).astype(np.int64, copy=False), ~valid)


def _id(t: EventTree, rows: np.ndarray) -> pd.arrays.IntegerArray:
    return _opt_int(t.ids[np.maximum(rows, 0)] if len(rows) else rows, rows >= 0)


def ancestry(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    levels: Iterable[str] | None = None,
) -> Result:
    """One row per event (optionally only some ranks, steps, levels) with its ancestry: table
    ``ancestry``, and the notes of the resolution.

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
    a = resolve(trace, ranks)
    t = a.tree
    sel = select_rows(t, steps, levels)
    lt = a.layer[sel]
    mt = np.where(lt >= 0, a.module_type[np.maximum(lt, 0)], -1) if len(sel) else lt
    cols = {
        "id": t.ids[sel],
        "rank": _opt_int(t.rank[sel], t.rank[sel] >= 0),
        "level": pd.Categorical.from_codes(t.level[sel].astype(np.int64), LEVELS),
        "name": _cat(t, sel),
        "ts": t.ts[sel],
        "dur": _opt_int(t.dur[sel], t.has_dur[sel]),
        "step": _opt_int(t.step[sel], t.step[sel] >= 0),
        "step_id": _id(t, a.step_row[sel]),
    }
    for col, rows in (("layer", lt), ("op", a.op[sel]), ("leaf_op", a.leaf_op[sel]),
                      ("runtime", a.runtime[sel]), ("annotation", a.annotation[sel])):  # fmt: skip
        cols[f"{col}_id"], cols[col] = _id(t, rows), _cat(t, rows)
        if col == "layer":
            types = pd.Index(a.module_types, dtype=object)
            cols["module_type"] = pd.Categorical.from_codes(mt, categories=types)
    cols["launch_id"] = _id(t, a.launch[sel])
    cols["via"] = pd.Categorical.from_codes(a.via[sel].astype(np.int64), VIA)
    cols["fwd_op_id"], cols["fwd_op"] = _id(t, a.fwd_op[sel]), _cat(t, a.fwd_op[sel])
    cols["pass"] = pd.Categorical.from_codes(a.passes[sel].astype(np.int64) - 1, PASSES)
    df = pd.DataFrame(cols, copy=False)
    return Result(tables={"ancestry": df}, notes=list(a.notes))


# ----------------------------------------------------------------------------------------------
# attribution
# ----------------------------------------------------------------------------------------------


def _chain(a: Ancestry, by: str, dev: np.ndarray, notes: list[str]) -> tuple:
    """(start, up, nodes, key, labels) of the node chain of level ``by``."""
    t = a.tree
    if by in ("layer", "module_type"):
        nodes = np.flatnonzero(t.level == _LAYER)
        if not nodes.size:
            notes.append("no layer spans in this trace: capture with xpuprof.profile("
                         "level='layer' or 'op', model=...) or with_stack=True; by='op' "
                         "(--by op) attributes device time to framework ops instead")  # fmt: skip
        key, labels = (t.name, t.names) if by == "layer" else (a.module_type, a.module_types)
        return a.layer[dev], a.layer_up, nodes, key, labels
    if by == "op":
        return a.leaf_op[dev], a.op_up, np.flatnonzero(t.level == _OP), t.name, t.names
    none = np.full(t.n, -1, np.int64)
    return a.runtime[dev], none, np.flatnonzero(t.level == _RUNTIME), t.name, t.names


def _layer_columns(a: Ancestry, out: pd.DataFrame, key_of: np.ndarray, nodes: np.ndarray,
                   keys: np.ndarray) -> None:  # fmt: skip
    """Module type and enclosing path of each layer name's first span, as columns 1 and 2."""
    t = a.tree
    first = pd.DataFrame({"key": key_of[nodes], "row": nodes}).drop_duplicates("key")
    f = dict(zip(first.key.to_numpy(), first.row.to_numpy(), strict=True))
    rows = np.array([f.get(k, -1) for k in keys], np.int64)
    mt = np.where(rows >= 0, a.module_type[np.maximum(rows, 0)], -1)
    up_rows = np.where(rows >= 0, a.layer_up[np.maximum(rows, 0)], -1)
    out.insert(1, "module_type", [a.module_types[m] if m >= 0 else None for m in mt])
    out.insert(2, "parent", t.names_of(up_rows))


def attribute(
    trace: Trace,
    *,
    by: str = "layer",
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    levels: Iterable[str] = DEVICE_LEVELS,
    per_rank: bool = False,
) -> Result:
    """Device time attributed up the tree, one row per node name (``by`` = ``layer``: module
    path; ``module_type``; ``op``: op name; ``step``: step number; ``runtime``: runtime call):
    table ``by``, facts ``device_ns`` and ``unattributed_ns`` (``docs/hierarchy.md``).

    Columns: the key (and ``rank`` with ``per_rank``), ``calls`` (instances of the node),
    ``device_ns`` (inclusive: device time under it, each device event once per key),
    ``device_exclusive_ns`` (not under a child of the same level), ``kernels`` and
    ``kernels_exclusive`` (device events counted the same ways), ``forward_ns`` and
    ``backward_ns`` (inclusive time split by pass), ``device_pct`` (inclusive share of the
    selected device time). Layers also get ``module_type`` and ``parent`` (the enclosing
    module path).
    """
    if by not in BY:
        raise XpuprofError(f"unknown attribution level {by!r}; choose one of: {', '.join(BY)}")
    a = resolve(trace, ranks)
    t = a.tree
    dev = select_rows(t, steps, levels)
    dev = dev[t.has_dur[dev]]
    w = t.dur[dev].astype(np.float64)
    total = float(w.sum())
    notes = list(a.notes)
    if not len(dev):
        notes.append("no device events (kernels, copies, collectives) in the selection: "
                     "there is no device time to attribute")  # fmt: skip
    if by == "step":  # keyed by the step number, whatever thread the work ran on
        out, attributed = _attribute_steps(a, dev, w, total, steps, per_rank, notes)
    else:
        out, attributed = _attribute_nodes(a, by, dev, w, total, steps, per_rank, notes)
    return Result(
        tables={by: out},
        notes=notes,
        facts={"device_ns": int(total), "unattributed_ns": int(round(total - attributed))},
    )


def _attribute_nodes(
    a: Ancestry,
    by: str,
    dev: np.ndarray,
    w: np.ndarray,
    total: float,
    steps: StepSelection,
    per_rank: bool,
    notes: list[str],
) -> tuple[pd.DataFrame, float]:
    """``attribute`` by layer, module type, op or runtime call: (table, attributed time)."""
    t = a.tree
    start, up, nodes, base_key, labels = _chain(a, by, dev, notes)
    nodes = nodes[steps_mask(t, steps)[nodes]]
    n_labels = max(len(labels), 1)
    rank_values, rk = np.array([-1], np.int64), np.zeros(t.n, np.int64)  # one bucket
    if per_rank:
        rank_values, rk = np.unique(t.rank, return_inverse=True)
    key_of = np.where(base_key >= 0, rk * n_labels + base_key, -1)
    n_keys = n_labels * len(rank_values)
    r = roll_up(start, up, key_of, n_keys, w)
    calls = np.bincount(key_of[nodes][key_of[nodes] >= 0], minlength=n_keys)[:n_keys]
    passes = a.passes[dev]

    def by_pass(code: int) -> np.ndarray:
        return np.bincount(r.key, weights=(w * (passes == code))[r.item], minlength=n_keys)

    fwd, bwd = by_pass(FORWARD)[:n_keys], by_pass(BACKWARD)[:n_keys]
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
        _layer_columns(a, out, key_of, nodes, keys)
    out = out.sort_values(["device_ns", "calls"], ascending=False, kind="stable")
    attributed = float(w[start >= 0].sum())
    if total and total - attributed > 0:
        notes.append(
            f"{100 * (total - attributed) / total:.1f} % of device time has no {by} above it "
            "(launched outside any, or its launch is not in the trace)"
        )
    return out.reset_index(drop=True), attributed


def _attribute_steps(
    a: Ancestry,
    dev: np.ndarray,
    w: np.ndarray,
    total: float,
    steps: StepSelection,
    per_rank: bool,
    notes: list[str],
) -> tuple[pd.DataFrame, float]:
    """``attribute(by="step")``: (table, attributed device time)."""
    t = a.tree
    srows = select_rows(t, steps, ["step"])
    keys = ["rank", "step"] if per_rank else ["step"]
    d = pd.DataFrame(
        {
            "rank": t.rank[dev],
            "step": t.step[dev],
            "w": w,
            "fwd": w * (a.passes[dev] == FORWARD),
            "bwd": w * (a.passes[dev] == BACKWARD),
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
    if not len(srows):
        notes.append("no step spans in this trace: steps are unknown")
    return out, float(d.w.sum())


def hierarchy(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    by: str = "layer",
    per_rank: bool = False,
) -> Result:
    """The hierarchy tool (``xpuprof hierarchy STORE --by layer``): :func:`attribute` with a
    first note that sums it up."""
    res = attribute(trace, by=by, ranks=ranks, steps=steps, per_rank=per_rank)
    total, lost = int(res.facts["device_ns"] or 0), int(res.facts["unattributed_ns"] or 0)
    if total:
        res.notes.insert(
            0, f"device time {total / 1e6:,.3f} ms ({lost / 1e6:,.3f} ms with no {by})"
        )
    return res

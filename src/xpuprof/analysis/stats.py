"""Statistics per framework op (torch's ``key_averages``), per device kernel (XProf's kernel
stats) and per model layer, read from the event tree and its resolved ancestry.

``docs/stats.md`` defines every column (self time, device time, outermost FLOPs, the tensor-core
rule, backward time per layer).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import DEVICE_LEVELS, Result, select_rows, steps_mask, where_clause
from xpuprof.analysis.hierarchy import BACKWARD, FORWARD, Ancestry, attribute, resolve
from xpuprof.core.errors import XpuprofError
from xpuprof.core.text import human_time, plural, short_name
from xpuprof.trace.tree import chain_pairs, outermost, roll_up

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.analysis.common import StepSelection
    from xpuprof.trace.trace import Trace
    from xpuprof.trace.tree import EventTree

#: XProf's tensor-core kernel name patterns (kTensorCoreKernelNamePatterns), then ours.
XPROF_TENSOR_CORE_PATTERNS = (
    "16816", "c1688", "conv1x1", "conv2d_c1_k1", "dgrad_1x1_stride_2x2", "direct_group",
    "first_layer_wgrad_kernel", "h1688", "h884", "hmma", "i16832", "i8816", "s884", "s1688",
    "xmma_gemm", "xmma_implicit_gemm", "xmma_sparse_conv", "xmma_sparse_gemm",
    "xmma_warp_specialized_implicit_gemm",
)  # fmt: skip
EXTRA_TENSOR_CORE_PATTERNS = ("tensorop", "xmma", "gmma", "nvjet")
_TENSOR_CORE = re.compile("|".join(map(re.escape, XPROF_TENSOR_CORE_PATTERNS
                                       + EXTRA_TENSOR_CORE_PATTERNS)))  # fmt: skip

#: Levels whose events are looked through when finding an op's children for its self time.
TRANSPARENT_LEVELS = ("layer", "python")


def uses_tensor_cores(kernel_name: str) -> bool:
    """Whether a kernel's name says it runs on tensor cores (``docs/stats.md``)."""
    return bool(_TENSOR_CORE.search(kernel_name or ""))


def _ranks_list(ranks: Iterable[int] | None) -> list[int] | None:
    return None if ranks is None else [int(r) for r in ranks]


# ----------------------------------------------------------------------------------------------
# ops
# ----------------------------------------------------------------------------------------------


def children_time(t: EventTree) -> np.ndarray:
    """Per row, the summed duration of its children on its track, looking through
    ``TRANSPARENT_LEVELS`` (their own children count instead)."""
    rows = np.arange(t.n, dtype=np.int64)
    transparent = t.is_level(*TRANSPARENT_LEVELS)
    solid = t.inherit(np.where(transparent, -1, rows))
    up = t.above(solid)
    ok = (up >= 0) & ~transparent
    return np.bincount(up[ok], weights=t.dur[ok].astype(np.float64), minlength=t.n)


def _op_device_time(a: Ancestry, dev: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per op row: device time launched under it, by itself, and the count under it."""
    n = a.tree.n
    w = a.tree.dur[dev].astype(np.float64)
    item, node, _ = chain_pairs(a.leaf_op[dev], a.op_up)
    incl = np.bincount(node, weights=w[item], minlength=n)
    n_incl = np.bincount(node, minlength=n)
    own = a.leaf_op[dev]
    ok = own >= 0
    excl = np.bincount(own[ok], weights=w[ok], minlength=n)
    return incl, excl, n_incl


def _op_rows(trace: Trace, a: Ancestry, steps: StepSelection) -> tuple[pd.DataFrame, bool]:
    """One row per op call (name, rank, dur, self, device, self_device, kernels, flops,
    flops_outer), and whether any device event was selected."""
    t = a.tree
    ops = select_rows(t, steps, ["op"])
    ops = ops[t.has_dur[ops]]
    child = children_time(t)
    dev = select_rows(t, steps, DEVICE_LEVELS)
    dev = dev[t.has_dur[dev]]
    incl, excl, n_incl = _op_device_time(a, dev)
    outer = outermost(~np.isnan(t.flops), t.parent)
    df = pd.DataFrame(
        {
            "name": pd.Categorical.from_codes(t.name[ops], pd.Index(t.names, dtype=object)),
            "rank": t.rank[ops],
            "dur": t.dur[ops],
            "self": t.dur[ops] - child[ops],
            "device": incl[ops],
            "self_device": excl[ops],
            "kernels": n_incl[ops],
            "flops": t.flops[ops],
            "flops_outer": np.where(outer[ops], t.flops[ops], np.nan),
        }
    )
    df.index = ops
    return df, bool(len(dev))


def _input_shapes(trace: Trace, t: EventTree, ops: np.ndarray, ranks: list[int] | None,
                  steps: StepSelection) -> np.ndarray:  # fmt: skip
    """``Input Dims`` of each op row, as the JSON text torch recorded (None: none)."""
    dims = trace.sql(
        "select id, cast(args->'$.\"Input Dims\"' as varchar) as dims from events "
        f"where level = 'op' and {where_clause(ranks, steps)}"
    )
    r = t.rows_of(dims["id"].to_numpy(np.int64))
    shape_of = np.full(t.n, None, dtype=object)
    shape_of[r[r >= 0]] = dims["dims"].to_numpy(dtype=object)[r >= 0]
    return shape_of[ops]


def _op_table(
    trace: Trace,
    ranks: list[int] | None,
    steps: StepSelection,
    shapes: bool,
    per_rank: bool,
) -> tuple[pd.DataFrame, list[str]]:
    """``op_stats`` and its notes."""
    a = resolve(trace, ranks)
    df, any_dev = _op_rows(trace, a, steps)
    notes: list[str] = []
    keys = ["name"]
    if shapes:
        df["input_shapes"] = _input_shapes(trace, a.tree, df.index.to_numpy(), ranks, steps)
        keys.append("input_shapes")
        if df["input_shapes"].isna().all() and len(df):
            notes.append("no op has recorded input shapes (profile with record_shapes=True)")
    if per_rank:
        keys.append("rank")
    if not len(df):
        notes.append("no framework ops (cpu_op / Operator events) in the selection")
    if not any_dev:
        notes.append("no device events: device_ns and self_device_ns are 0")
    if len(df) and df["flops"].isna().all():
        notes.append("no op has FLOPs (they are derived from input shapes: record_shapes=True)")
    out = (
        df.groupby(keys, observed=True, dropna=False, sort=False)
        .agg(
            count=("dur", "size"),
            total_ns=("dur", "sum"),
            self_ns=("self", "sum"),
            min_ns=("dur", "min"),
            max_ns=("dur", "max"),
            device_ns=("device", "sum"),
            self_device_ns=("self_device", "sum"),
            kernels=("kernels", "sum"),
            flops=("flops", lambda s: s.sum(min_count=1)),
            flops_outermost=("flops_outer", lambda s: s.sum(min_count=1)),
        )
        .reset_index()
    )
    out["name"] = out["name"].astype(object)
    if shapes:
        out["input_shapes"] = (
            out["input_shapes"].astype(object).where(out["input_shapes"].notna(), None)
        )
    out["mean_ns"] = out.total_ns / out["count"]
    out["self_mean_ns"] = out.self_ns / out["count"]
    for c in ("device_ns", "self_device_ns", "self_ns"):
        out[c] = out[c].round().astype(np.int64)
    basis = np.where(out.device_ns > 0, out.device_ns, out.total_ns).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["flops_per_s"] = np.where(basis > 0, out.flops / basis * 1e9, np.nan)
    if per_rank:
        out["rank"] = out["rank"].where(out["rank"] >= 0)
    cols = [*keys, "count", "total_ns", "self_ns", "mean_ns", "self_mean_ns", "min_ns",
            "max_ns", "device_ns", "self_device_ns", "kernels", "flops", "flops_outermost",
            "flops_per_s"]  # fmt: skip
    out = out[cols].sort_values(["self_ns", "total_ns"], ascending=False, kind="stable")
    return out.reset_index(drop=True), notes


def op_stats(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    shapes: bool = False,
    per_rank: bool = False,
) -> pd.DataFrame:
    """Framework ops: one row per name (``shapes``: per name and ``Input Dims``; ``per_rank``:
    per rank too) with ``count``, ``total_ns``, ``self_ns``, ``mean_ns``, ``min_ns``,
    ``max_ns``, ``self_mean_ns``, ``device_ns``, ``self_device_ns``, ``kernels``, ``flops``,
    ``flops_outermost``, ``flops_per_s``; most self time first (``docs/stats.md``). The notes
    come with :func:`stats`."""
    return _op_table(trace, _ranks_list(ranks), steps, shapes, per_rank)[0]


# ----------------------------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------------------------

_KERNEL_ARGS = {
    "grid": "args->>'$.grid'",
    "block": "args->>'$.block'",
    "registers_per_thread": "try_cast(args->>'$.\"registers per thread\"' as bigint)",
    "shared_memory": "try_cast(args->>'$.\"shared memory\"' as bigint)",
    "blocks_per_sm": "try_cast(args->>'$.\"blocks per SM\"' as double)",
    "warps_per_sm": "try_cast(args->>'$.\"warps per SM\"' as double)",
    "occupancy_pct": "try_cast(args->>'$.\"est. achieved occupancy %\"' as double)",
}


def _kernel_table(
    trace: Trace,
    ranks: list[int] | None,
    steps: StepSelection,
    levels: tuple[str, ...],
    by_op: bool,
    per_rank: bool,
) -> tuple[pd.DataFrame, list[str]]:
    """``kernel_stats`` and its notes."""
    sel = ", ".join(f"{v} as {k}" for k, v in _KERNEL_ARGS.items())
    df = trace.sql(
        f"select id, rank, level, name, dur, {sel} from events "
        f"where {where_clause(ranks, steps, levels)} and dur is not null"
    )
    keys = ["name", "grid", "block", "registers_per_thread", "shared_memory"]
    notes: list[str] = []
    if by_op:
        a = resolve(trace, ranks)
        r = a.tree.rows_of(df["id"].to_numpy(np.int64))
        df["op"] = a.tree.names_of(np.where(r >= 0, a.leaf_op[np.maximum(r, 0)], -1))
        keys.append("op")
    if per_rank:
        keys.append("rank")
    if df.empty:
        notes.append(f"no device events of level {', '.join(levels)} in the selection")
    for k in ("name", "level"):
        df[k] = df[k].astype(object)
    g = df.groupby(keys, dropna=False, sort=False)
    out = g.agg(
        level=("level", "first"),
        count=("dur", "size"),
        total_ns=("dur", "sum"),
        min_ns=("dur", "min"),
        max_ns=("dur", "max"),
        blocks_per_sm=("blocks_per_sm", "mean"),
        warps_per_sm=("warps_per_sm", "mean"),
        occupancy_pct=("occupancy_pct", "mean"),
    ).reset_index()
    out["mean_ns"] = out.total_ns / out["count"]
    tc = {n: uses_tensor_cores(n) for n in out["name"].unique() if isinstance(n, str)}
    out["tensor_core"] = out["name"].map(tc).fillna(False).astype(bool)
    total = float(out.total_ns.sum())
    out["pct"] = 100.0 * out.total_ns / total if total else np.nan
    cols = [*keys, "level", "count", "total_ns", "mean_ns", "min_ns", "max_ns", "blocks_per_sm",
            "warps_per_sm", "occupancy_pct", "tensor_core", "pct"]  # fmt: skip
    out = out[cols].sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)
    if len(out) and out[["grid", "block"]].isna().all().all():
        notes.append("no kernel has launch details (grid, block, registers): the trace's "
                     "kernels carry no such args")  # fmt: skip
    return out, notes


def kernel_stats(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    levels: Iterable[str] = ("kernel", "collective"),
    by_op: bool = False,
    per_rank: bool = False,
) -> pd.DataFrame:
    """Device kernels: one row per name and launch configuration (``grid``, ``block``,
    ``registers_per_thread``, ``shared_memory``; with ``by_op`` per launching op — the
    innermost op around the runtime call — and with ``per_rank`` per rank), with ``level``,
    ``count``, ``total_ns``, ``mean_ns``, ``min_ns``, ``max_ns``, ``blocks_per_sm``,
    ``warps_per_sm``, ``occupancy_pct`` (means over the launches), ``tensor_core`` (name
    rule, ``docs/stats.md``) and ``pct`` of the selected device time; longest total first.
    The notes come with :func:`stats`."""
    return _kernel_table(trace, _ranks_list(ranks), steps, tuple(levels), by_op, per_rank)[0]


# ----------------------------------------------------------------------------------------------
# layers
# ----------------------------------------------------------------------------------------------


def _same_type_nested(a: Ancestry, spans: np.ndarray) -> np.ndarray:
    """For each span, whether an enclosing layer span has the same module type."""
    item, node, _ = chain_pairs(a.layer_up[spans], a.layer_up)
    hit = a.module_type[node] == a.module_type[spans[item]]
    out = np.zeros(len(spans), bool)
    out[item[hit & (a.module_type[node] >= 0)]] = True
    return out


def _autograd_backward(
    a: Ancestry, key_of: np.ndarray, n_keys: int, steps: StepSelection
) -> tuple[np.ndarray, np.ndarray]:
    """(host time, calls) per key of the backward ops of each module's forward ops: the
    outermost backward roots, rolled up the layers."""
    t = a.tree
    roots = np.flatnonzero(a.is_bwd_root & steps_mask(t, steps))
    nested_root = t.nearest(a.is_bwd_root, strict=True)
    roots = roots[nested_root[roots] < 0]
    r = roll_up(a.layer[roots], a.layer_up, key_of, n_keys, t.dur[roots])
    return r.inclusive, r.count


def _span_table(
    a: Ancestry, by: str, steps: StepSelection
) -> tuple[pd.DataFrame, np.ndarray, bool]:
    """The span columns of ``layer_stats`` (calls, forward, self, backward), the spans, and
    whether any backward time was found (spans or autograd)."""
    t = a.tree
    spans = select_rows(t, steps, ["layer"])
    spans = spans[t.has_dur[spans]]
    fwd = spans[a.layer_pass[spans] == FORWARD]
    bwd = spans[a.layer_pass[spans] == BACKWARD]
    child = np.zeros(t.n)  # self time: minus child layer spans
    up = a.layer_up[spans]
    np.add.at(child, up[up >= 0], t.dur[spans[up >= 0]].astype(np.float64))
    if by == "layer":
        key_of, labels = t.name, t.names
        counted_f, counted_b = fwd, bwd
    else:
        key_of, labels = a.module_type, a.module_types
        counted_f = fwd[~_same_type_nested(a, fwd)]
        counted_b = bwd[~_same_type_nested(a, bwd)]
    n_keys = max(len(labels), 1)

    def per_key(rows: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
        k = key_of[rows]
        ok = k >= 0
        return np.bincount(k[ok], weights=None if w is None else w[ok], minlength=n_keys)

    calls = per_key(fwd)
    f_ns = per_key(counted_f, t.dur[counted_f].astype(np.float64))
    f_self = per_key(fwd, (t.dur[fwd] - child[fwd]).astype(np.float64))
    b_calls = per_key(bwd)
    b_ns = per_key(counted_b, t.dur[counted_b].astype(np.float64))
    source = np.where(b_calls > 0, "spans", None).astype(object)
    auto_ns, auto_calls = _autograd_backward(a, key_of, n_keys, steps)
    auto = (b_calls == 0) & (auto_calls > 0)
    b_ns = np.where(auto, auto_ns, b_ns)
    b_calls = np.where(auto, auto_calls, b_calls)
    source[auto] = "autograd"
    keys = np.flatnonzero((calls > 0) | (b_calls > 0))
    out = pd.DataFrame(
        {
            by: labels[keys] if len(labels) else np.empty(0, object),
            "calls": calls[keys].astype(np.int64),
            "forward_ns": f_ns[keys].round().astype(np.int64),
            "forward_mean_ns": np.where(calls[keys] > 0, f_ns[keys] / np.maximum(calls[keys], 1),
                                        np.nan),
            "forward_self_ns": f_self[keys].round().astype(np.int64),
            "backward_calls": b_calls[keys].astype(np.int64),
            "backward_ns": b_ns[keys].round().astype(np.int64),
            "backward_from": source[keys],
        }
    )  # fmt: skip
    if by == "layer" and len(out):
        first = pd.DataFrame({"k": key_of[spans], "row": spans}).drop_duplicates("k")
        f = dict(zip(first.k.to_numpy(), first.row.to_numpy(), strict=True))
        fr = np.array([f.get(k, -1) for k in keys], np.int64)
        mt = a.module_type[np.maximum(fr, 0)]
        out.insert(1, "module_type", [a.module_types[m] if m >= 0 else None for m in mt])
        out.insert(2, "parent", t.names_of(a.layer_up[np.maximum(fr, 0)]))
    return out, spans, bool(bwd.size or auto_calls.any())


def _layer_table(
    trace: Trace, by: str, ranks: list[int] | None, steps: StepSelection
) -> tuple[pd.DataFrame, list[str]]:
    """``layer_stats`` and its notes."""
    if by not in ("layer", "module_type"):
        raise XpuprofError(f"layer_stats by {by!r}: choose layer or module_type")
    a = resolve(trace, ranks)
    out, spans, has_backward = _span_table(a, by, steps)
    notes = list(a.notes)
    if not spans.size:
        notes.append("no layer spans: capture with xpuprof.profile(level='layer' or 'op', "
                     "model=...) or torch.profiler(with_stack=True)")  # fmt: skip
    elif not has_backward:
        notes.append("no backward time per layer: no backward layer spans and no fwdbwd links")
    att = attribute(trace, by=by, ranks=ranks, steps=steps).tables[by]
    att = att[[by, "device_ns", "forward_ns", "backward_ns", "kernels"]].rename(
        columns={"forward_ns": "device_forward_ns", "backward_ns": "device_backward_ns"}
    )
    out = out.merge(att, on=by, how="left")
    for c in ("device_ns", "device_forward_ns", "device_backward_ns", "kernels"):
        out[c] = out[c].fillna(0).astype(np.int64)
    out = out.sort_values(["forward_ns", "device_ns"], ascending=False, kind="stable")
    return out.reset_index(drop=True), notes


def layer_stats(
    trace: Trace,
    *,
    by: str = "layer",
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
) -> pd.DataFrame:
    """Model layers, per module path (``by="layer"``) or per module type
    (``by="module_type"``): ``calls`` and ``forward_ns`` (forward spans), ``forward_mean_ns``,
    ``forward_self_ns`` (minus the child modules' spans), ``backward_calls``/``backward_ns``
    and ``backward_from`` (``spans``: backward layer spans; ``autograd``: host time of the
    backward ops of the module's forward ops, via fwdbwd links / sequence numbers), and
    ``device_ns``, ``device_forward_ns``, ``device_backward_ns``, ``kernels`` (device time
    under the module, from ``hierarchy.attribute``). The notes come with :func:`stats`."""
    return _layer_table(trace, by, _ranks_list(ranks), steps)[0]


# ----------------------------------------------------------------------------------------------
# the tool
# ----------------------------------------------------------------------------------------------


def stats(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    ops: bool = True,
    kernels: bool = True,
    layers: bool = True,
    shapes: bool = False,
    by_op: bool = False,
) -> Result:
    """The stats tool (``xpuprof stats STORE``): tables ``ops``, ``kernels``, ``layers`` and
    ``layer_types`` (each where asked for) and the notes of all of them. Facts: ``headline``
    (:func:`headline`), when there are ops or kernels with time."""
    ranks = _ranks_list(ranks)
    res = Result()

    def add(name: str, table: tuple[pd.DataFrame, list[str]]) -> None:
        res.tables[name] = table[0]
        res.notes.extend(n for n in table[1] if n not in res.notes)

    if ops:
        add("ops", _op_table(trace, ranks, steps, shapes, False))
    if kernels:
        add("kernels", _kernel_table(trace, ranks, steps, ("kernel", "collective"), by_op, False))
    if layers:
        add("layers", _layer_table(trace, "layer", ranks, steps))
        add("layer_types", _layer_table(trace, "module_type", ranks, steps))
    line = headline(res.tables.get("ops"), res.tables.get("kernels"))
    if line:
        res.facts["headline"] = line
    return res


def headline(ops: pd.DataFrame | None, kernels: pd.DataFrame | None) -> str | None:
    """The stats in one sentence: the op with the most self time and the kernel with the most
    device time, each with its share and calls (the ``ops`` and ``kernels`` tables of
    :func:`stats`, either may be None); None when neither has any time."""
    said = []
    for what, df, col in (("op self", ops, "self_ns"), ("device", kernels, "total_ns")):
        if df is not None and len(df) and df[col].sum() > 0:
            r = df.loc[df[col].idxmax()]
            said.append(
                f"most {what} time in {short_name(str(r['name']))} ({human_time(r[col])}, "
                f"{r[col] / df[col].sum():.0%} of all, {plural(int(r['count']), 'call')})"
            )
    line = "; ".join(said)
    return line[:1].upper() + line[1:] if line else None

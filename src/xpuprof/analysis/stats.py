"""Statistics per framework op, per device kernel and per model layer.

Op stats (what torch.profiler's ``key_averages()`` and XProf's op profile show)
------------------------------------------------------------------------------

One row per op name (optionally per name and input shapes, per rank):

* ``total_ns``: sum of the op's host durations (inclusive of the ops it calls);
* ``self_ns``: each call's duration minus the durations of its children on the same track (the
  store's ``parent`` column). xpuprof's own layer spans and Python-tracer events are looked
  through: the ops inside them count as the children, as they do for torch, which never sees
  those spans. Runtime calls, annotations and nested ops all count as children.
* ``device_ns``: device time of the kernels, copies and collectives launched under the op
  (by any op it calls), ``self_device_ns`` only those it launched itself — per call, then
  summed per name, as torch does (an op nested in an op of the same name counts in both);
* ``flops``: the op's FLOPs (the store's ``flops``, derived from input shapes; inclusive, so
  ``aten::linear`` and its ``aten::addmm`` both carry the GEMM) and ``flops_outermost``: only
  calls with no ancestor that has FLOPs (``trace/flops.outermost``), so that this column sums
  to the program's FLOPs over all rows. ``flops_per_s`` = ``flops`` / device time, or / host
  time where the op launched no device work (CPU runs).

Kernel stats (what XProf's kernel stats page shows)
---------------------------------------------------

One row per kernel name and launch configuration (grid, block, registers per thread, shared
memory; optionally per launching op and rank): count, total/mean/min/max duration, the mean of
Kineto's ``blocks per SM``, ``warps per SM`` and ``est. achieved occupancy %``, and
``tensor_core``: whether the kernel name says it runs on tensor cores. The rule is XProf's
(``xprof/utils/kernel_stats_utils.cc``, ``IsKernelUsingTensorCore``: the name contains one of
its patterns — ``16816``, ``h884``, ``s1688``, ``hmma``, ``xmma_gemm``…) extended with marks
XProf's list misses: CUTLASS ``tensorop``, any ``xmma`` (NVIDIA's tensor-core kernel library;
XProf lists ``xmma_gemm`` and ``xmma_implicit_gemm`` but not cuDNN's
``sm80_xmma_fprop_implicit_gemm_…tf32``), Hopper ``gmma``/``wgmma`` and cuBLAS ``nvjet``.
A guess from the name: a kernel that uses tensor cores under a name without those marks reads
as False.

Layer stats
-----------

Per module path (or per module type): forward calls and time (the layer spans of an xpuprof
capture, or ``nn.Module`` Python events), self forward time (minus the child modules' spans),
backward time (backward layer spans where the capture recorded them, else the host time of the
backward ops whose forward op ran in the module, found through ``fwdbwd`` links), and the
device time under the module (``hierarchy.attribute``). Per module type, a span nested in a
span of the same type is not added again (a ``Sequential`` inside a ``Sequential``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import DEVICE_LEVELS, Result, where_clause
from xpuprof.analysis.hierarchy import (
    _BWD,
    _FWD,
    LEVEL_CODE,
    Tree,
    _expand,
    _rows_of,
    _select,
    attribute,
    roll_up,
    tree,
)
from xpuprof.core.errors import XpuprofError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.trace.trace import Trace

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
    """Whether a kernel's name says it runs on tensor cores (see the module docstring)."""
    return bool(_TENSOR_CORE.search(kernel_name or ""))


def _steps_list(steps: Iterable[int] | None) -> list[int] | None:
    return None if steps is None else [int(s) for s in steps]


def _ranks_list(ranks: Iterable[int] | None) -> list[int] | None:
    return None if ranks is None else [int(r) for r in ranks]


# ----------------------------------------------------------------------------------------------
# ops
# ----------------------------------------------------------------------------------------------


def children_time(t: Tree) -> np.ndarray:
    """Per row, the summed duration of its children on its track, looking through
    ``TRANSPARENT_LEVELS`` (their own children count instead)."""
    rows = np.arange(t.n, dtype=np.int64)
    transparent = np.isin(t.level, np.array([LEVEL_CODE[x] for x in TRANSPARENT_LEVELS]))
    solid = t.inherit(np.where(transparent, -1, rows))
    up = t.above(solid)
    ok = (up >= 0) & ~transparent
    return np.bincount(up[ok], weights=t.dur[ok].astype(np.float64), minlength=t.n)


def _device_rows(t: Tree, steps: list[int] | None) -> np.ndarray:
    dev = _select(t, steps, DEVICE_LEVELS)
    return dev[t.has_dur[dev]]


def _op_device_time(t: Tree, dev: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per op row: device time launched under it, by itself, and the counts."""
    w = t.dur[dev].astype(np.float64)
    item, node, _ = _expand(t.leaf_op[dev], t.op_up)
    incl = np.bincount(node, weights=w[item], minlength=t.n)
    n_incl = np.bincount(node, minlength=t.n)
    own = t.leaf_op[dev]
    ok = own >= 0
    excl = np.bincount(own[ok], weights=w[ok], minlength=t.n)
    return incl, excl, n_incl


def op_stats(
    trace: Trace,
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    shapes: bool = False,
    per_rank: bool = False,
) -> pd.DataFrame:
    """Framework ops: one row per name (``shapes``: per name and ``Input Dims``; ``per_rank``:
    per rank too) with ``count``, ``total_ns``, ``self_ns``, ``mean_ns``, ``min_ns``,
    ``max_ns``, ``self_mean_ns``, ``device_ns``, ``self_device_ns``, ``kernels``, ``flops``,
    ``flops_outermost``, ``flops_per_s``; most self time first. See the module docstring for
    the rules; ``attrs["notes"]`` says what could not be computed."""
    from xpuprof.trace.tree import outermost

    ranks, steps = _ranks_list(ranks), _steps_list(steps)
    t = tree(trace, ranks)
    notes: list[str] = []
    ops = _select(t, steps, ["op"])
    ops = ops[t.has_dur[ops]]
    child = children_time(t)
    dev = _device_rows(t, steps)
    incl, excl, n_incl = _op_device_time(t, dev)
    has_flops = ~np.isnan(t.flops)
    outer = outermost(has_flops, t.parent)
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
    keys = ["name"]
    if shapes:
        dims = trace.sql(
            "select id, cast(args->'$.\"Input Dims\"' as varchar) as dims from events "
            f"where level = 'op' and {where_clause(ranks, steps)}"
        )
        r = _rows_of(t.ids, dims["id"].to_numpy(np.int64))
        shape_of = np.full(t.n, None, dtype=object)
        shape_of[r[r >= 0]] = dims["dims"].to_numpy(dtype=object)[r >= 0]
        df["input_shapes"] = shape_of[ops]
        keys.append("input_shapes")
        if df["input_shapes"].isna().all() and len(df):
            notes.append("no op has recorded input shapes (profile with record_shapes=True)")
    if per_rank:
        keys.append("rank")
    if not len(ops):
        notes.append("no framework ops (cpu_op / Operator events) in the selection")
    if not len(dev):
        notes.append("no device events: device_ns and self_device_ns are 0")
    if len(ops) and not has_flops[ops].any():
        notes.append("no op has FLOPs (they are derived from input shapes: record_shapes=True)")
    g = df.groupby(keys, observed=True, dropna=False, sort=False)
    out = g.agg(
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
    ).reset_index()
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
    out = out.reset_index(drop=True)
    out.attrs["notes"] = notes
    return out


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


def kernel_stats(
    trace: Trace,
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    levels: Iterable[str] = ("kernel", "collective"),
    by_op: bool = False,
    per_rank: bool = False,
) -> pd.DataFrame:
    """Device kernels: one row per name and launch configuration (``grid``, ``block``,
    ``registers_per_thread``, ``shared_memory``; with ``by_op`` per launching op — the
    innermost op around the runtime call — and with ``per_rank`` per rank), with ``level``,
    ``count``, ``total_ns``, ``mean_ns``, ``min_ns``, ``max_ns``, ``blocks_per_sm``,
    ``warps_per_sm``, ``occupancy_pct`` (means over the launches), ``tensor_core`` (name
    rule, module docstring) and ``pct`` of the selected device time; longest total first."""
    ranks, steps = _ranks_list(ranks), _steps_list(steps)
    levels = tuple(levels)
    sel = ", ".join(f"{v} as {k}" for k, v in _KERNEL_ARGS.items())
    df = trace.sql(
        f"select id, rank, level, name, dur, {sel} from events "
        f"where {where_clause(ranks, steps, levels)} and dur is not null"
    )
    keys = ["name", "grid", "block", "registers_per_thread", "shared_memory"]
    notes: list[str] = []
    if by_op:
        t = tree(trace, ranks)
        r = _rows_of(t.ids, df["id"].to_numpy(np.int64))
        op = np.where(r >= 0, t.leaf_op[np.maximum(r, 0)], -1)
        df["op"] = np.where(op >= 0, t.names[t.name[np.maximum(op, 0)]], None)
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
    out.attrs["notes"] = notes
    return out


# ----------------------------------------------------------------------------------------------
# layers
# ----------------------------------------------------------------------------------------------


def _same_type_nested(t: Tree, spans: np.ndarray) -> np.ndarray:
    """For each span, whether an enclosing layer span has the same module type."""
    item, node, _ = _expand(t.layer_up[spans], t.layer_up)
    hit = t.module_type[node] == t.module_type[spans[item]]
    out = np.zeros(len(spans), bool)
    out[item[hit & (t.module_type[node] >= 0)]] = True
    return out


def layer_stats(
    trace: Trace,
    by: str = "layer",
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
) -> pd.DataFrame:
    """Model layers, per module path (``by="layer"``) or per module type
    (``by="module_type"``): ``calls`` and ``forward_ns`` (forward spans), ``forward_mean_ns``,
    ``forward_self_ns`` (minus the child modules' spans), ``backward_calls``/``backward_ns``
    and ``backward_from`` (``spans``: backward layer spans; ``autograd``: host time of the
    backward ops of the module's forward ops, via fwdbwd links / sequence numbers), and
    ``device_ns``, ``device_forward_ns``, ``device_backward_ns``, ``kernels`` (device time
    under the module, from ``hierarchy.attribute``)."""
    if by not in ("layer", "module_type"):
        raise XpuprofError(f"layer_stats by {by!r}: choose layer or module_type")
    ranks, steps = _ranks_list(ranks), _steps_list(steps)
    t = tree(trace, ranks)
    spans = _select(t, steps, ["layer"])
    spans = spans[t.has_dur[spans]]
    notes = list(t.notes)
    if not spans.size:
        notes.append("no layer spans: capture with xpuprof.profile(level='layer' or 'op', "
                     "model=...) or torch.profiler(with_stack=True)")  # fmt: skip
    fwd = spans[t.layer_pass[spans] == _FWD]
    bwd = spans[t.layer_pass[spans] == _BWD]
    # self time: minus child layer spans
    child = np.zeros(t.n)
    up = t.layer_up[spans]
    ok = up >= 0
    np.add.at(child, up[ok], t.dur[spans[ok]].astype(np.float64))
    if by == "layer":
        key_of, labels = t.name, t.names
        counted_f, counted_b = fwd, bwd
    else:
        key_of, labels = t.module_type, t.module_types
        counted_f = fwd[~_same_type_nested(t, fwd)]
        counted_b = bwd[~_same_type_nested(t, bwd)]
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
    # backward host time through autograd: the outermost backward roots, rolled up the layers
    roots = np.flatnonzero(t.is_bwd_root)
    if steps is not None:
        roots = roots[np.isin(t.step[roots], np.array(steps, np.int64))]
    rows = np.arange(t.n, dtype=np.int64)
    nested_root = t.above(t.inherit(np.where(t.is_bwd_root, rows, -1)))
    roots = roots[nested_root[roots] < 0]
    r = roll_up(t.layer[roots], t.layer_up, key_of, n_keys, t.dur[roots])
    auto = (b_calls == 0) & (r.count > 0)
    b_ns = np.where(auto, r.inclusive, b_ns)
    b_calls = np.where(auto, r.count, b_calls)
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
        mt = t.module_type[np.maximum(fr, 0)]
        out.insert(1, "module_type", [t.module_types[m] if m >= 0 else None for m in mt])
        lu = t.layer_up[np.maximum(fr, 0)]
        out.insert(2, "parent", [t.names[t.name[u]] if u >= 0 else None for u in lu])
    if len(spans) and not bwd.size and not r.count.any():
        notes.append("no backward time per layer: no backward layer spans and no fwdbwd links")
    att = attribute(trace, by=by, ranks=ranks, steps=steps)
    att = att[[by, "device_ns", "forward_ns", "backward_ns", "kernels"]].rename(
        columns={"forward_ns": "device_forward_ns", "backward_ns": "device_backward_ns"}
    )
    out = out.merge(att, on=by, how="left")
    for c in ("device_ns", "device_forward_ns", "device_backward_ns", "kernels"):
        out[c] = out[c].fillna(0).astype(np.int64)
    out = out.sort_values(["forward_ns", "device_ns"], ascending=False, kind="stable")
    out = out.reset_index(drop=True)
    out.attrs["notes"] = notes
    return out


# ----------------------------------------------------------------------------------------------
# one call for the CLI
# ----------------------------------------------------------------------------------------------


def stats(
    trace: Trace,
    ops: bool = True,
    kernels: bool = True,
    layers: bool = True,
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    shapes: bool = False,
    by_op: bool = False,
) -> Result:
    """The stats tables as one :class:`Result` (what ``xpuprof stats STORE`` prints): ``ops``,
    ``kernels``, ``layers`` and ``layer_types``, each where it has rows, and the notes."""
    res = Result()

    def add(name: str, df: pd.DataFrame) -> None:
        for n in df.attrs.get("notes", []):
            if n not in res.notes:
                res.notes.append(n)
        df.attrs.clear()
        res.tables[name] = df

    if ops:
        add("ops", op_stats(trace, ranks=ranks, steps=steps, shapes=shapes))
    if kernels:
        add("kernels", kernel_stats(trace, ranks=ranks, steps=steps, by_op=by_op))
    if layers:
        add("layers", layer_stats(trace, "layer", ranks=ranks, steps=steps))
        add("layer_types", layer_stats(trace, "module_type", ranks=ranks, steps=steps))
    return res

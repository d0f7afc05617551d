"""Fusion what-ifs: a chain of elementwise ops, or everything inside a host span, run as one op.

``fuse-elementwise[:REGEX]`` — every *chain* (optionally only inside host spans whose name
matches REGEX: a module's layer span, an annotation) becomes one op. A chain is a run of two or
more consecutive outermost framework ops of one host thread, each of roofline class
``elementwise`` (``costmodel/elementwise.py``: not ``softmax``, ``norm`` or ``reduction``, whose
reductions a pointwise fuser does not absorb), where each op *consumes the previous one's
output*: the previous op's output signature (shape and dtype: the broadcast of its tensor
inputs, or its first input for an in-place ``op_``) is one of its tensor inputs. The trace has
no data-flow edges, so adjacency plus a matching signature is the approximation: no other op
lies between them on the thread but views (ops with no FLOPs and no bytes: ``select``,
``view``, ``expand``; they move no data), and on a device all their kernels run back to back on
one stream. An op of unknown cost (no rule) or of another class ends a chain.

``fuse:REGEX`` — everything inside each outermost host span (level ``layer``, ``annotation``,
``op`` or ``step``) whose name matches REGEX becomes one op, as a hand-written fused kernel or
``scaled_dot_product_attention`` replaces a module's manual attention.

**External bytes** B_ext (what the fused op reads and writes; the intermediates stay in
registers or caches): the ops with work in the region (FLOPs or bytes > 0; views move nothing)
are read in order; each op's tensor inputs (``Input Dims``/``Input type``) are read bytes
unless they match the signature of an output produced earlier in the region — at most as many
inputs of one op per signature as ops have produced it so far — plus the bytes of the last
op's output (numel × item size; for an op whose output shape xpuprof does not derive, its
costed bytes less its inputs). An outside tensor read by two ops of the region counts twice (the
trace does not say they are one tensor): B_ext is then an upper bound; an outside tensor with
the signature of an intermediate counts as internal (a lower bound).

**Time** t: the roofline of the fused op (``sim/costs/roofline.py``, calibrated on the trace),
max(F/(η_c·P), B_ext/(η_m·W)), with F the region's FLOPs summed, at the efficiencies of its
class — a chain: ``elementwise``; a span: the class of its ops holding the most FLOPs
(``matmul``, ``attention``, …) — and the peaks P, W of its device. On the trace's own device W
cancels for a memory-bound chain: t = B_ext · ΣT / ΣB over the class's ops. An op of unknown
cost (no rule) inside a ``fuse:`` span on the CPU adds its duration less o to t; on a device
the span cannot be priced (an error says which ops).

**The compute floor** C = Σ max(0, T_i − o − B_i/W*) over the region's ops (W*: the highest,
over op names, of the median achieved bandwidth B/T of that name's ops in the trace): each op's
time beyond dispatch and beyond streaming its bytes at the best bandwidth the trace shows is
work that fusion does not remove — the arithmetic (transcendentals, which count one FLOP per
element), the reductions of a softmax — since a fused kernel saves memory traffic and calls,
not operations. The model time is max(t, C): on a GPU, whose elementwise kernels stream at
near the roof, C ≈ 0 and t decides; on a CPU core, whose elementwise ops are bound by
instruction throughput rather than by DRAM, C decides. It reads every slowness beyond the best
bandwidth as work that stays: it over-estimates where an op was slow from memory stalls that
fusion removes, or where a fused kernel vectorises the chain's arithmetic.

**One op's fixed overhead**: on a device the fused kernel is launched by the op that launched
the region's first kernel, whose host time and launch are kept; the other ops' host time
(their dispatch and launch calls), the host time between them (the Python that called them)
and their launch latencies go (their launch edges are dropped), and their kernels take no time,
the first taking max(t, C) (o = 0 there: T_i is kernel time). On the CPU the region's host
time (first op's start to last op's end on its thread) becomes max(t, C) + o, spread over its
edges in proportion to their delays so far, where o is the median duration of the trace's
ops that do no work and call no other op (views, ``as_strided``: an op call's dispatch
cost); 0 when it has none.

Errors: no input shapes (``record_shapes``), a REGEX matching no host span (those there are
listed), no chain, a span whose ops have no FLOPs or bytes.

Length: one transform — finding regions from shapes, pricing them, and editing the graph's host
and device edges — whose parts only make sense together.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.core.errors import XpuprofError
from xpuprof.sim.graph import DEVICE_WORK, HOST_GAP, HOST_WORK, LAUNCH
from xpuprof.sim.whatif import Change, checked_pattern

if TYPE_CHECKING:
    from xpuprof.sim.costs import RooflineCosts
    from xpuprof.sim.transforms import Context
    from xpuprof.trace.trace import Trace
    from xpuprof.trace.tree import EventTree

PRICED = True
#: The roofline class a chain is made of.
CLASS = "elementwise"
#: Host levels a ``fuse:REGEX`` span (or a ``fuse-elementwise:REGEX`` scope) may be.
SPAN_LEVELS = ("layer", "annotation", "op", "step")
NO_SHAPES = ("the trace records no input shapes, so no FLOPs or bytes to price a fused op: "
             "capture with record_shapes=True (xpuprof.profile(..., record_shapes=True), "
             "level='full', or torch.profiler.profile(record_shapes=True))")  # fmt: skip
REGION_COLUMNS = ["region", "kind", "span", "part", "tid", "ops", "first", "last", "n_ops",
                  "names", "cls", "dtype", "flops", "bytes_unfused", "bytes_external",
                  "measured_ns", "roofline_ns", "kept_ns", "compute_floor_ns", "model_ns",
                  "overhead_ns", "fused_ns", "on_host"]  # fmt: skip

Sig = tuple[tuple[int, ...], str]


def parse(text: str, verb: str, arg: str, value: str) -> Change:
    """``fuse-elementwise[:REGEX]`` and ``fuse:REGEX`` (neither takes a value)."""
    if value:
        raise XpuprofError(f"change {text!r}: {verb} takes no value (fuse-elementwise[:REGEX], "
                           "fuse:REGEX)")  # fmt: skip
    if verb == "fuse" and not arg:
        raise XpuprofError(f"change {text!r}: name the span to fuse, e.g. fuse:attn (a "
                           "layer span's module path or an annotation: a regular "
                           "expression)")  # fmt: skip
    return Change(text, verb, pattern=checked_pattern(text, arg or None))


@dataclass
class _Shapes:
    """One op call's tensor inputs as signatures and bytes, and its output's."""

    inputs: list[tuple[Sig, int]] = field(default_factory=list)
    out: Sig | None = None
    out_bytes: int | None = None


def _shapes(name: str, dims: Any, types: Any) -> _Shapes | None:
    """Inputs and output of an op from its recorded shapes; None without shapes."""
    from xpuprof.costmodel.call import Call, broadcast
    from xpuprof.costmodel.ops import base_name, op_kind

    if not isinstance(dims, list) or not dims:
        return None
    c = Call(dims, types, None)
    ins: list[tuple[Sig, int]] = []
    for i in range(len(c)):
        s, z = c.shape(i), c.itemsize(i)
        if s is not None and z is not None:
            ins.append(((tuple(s), c.type(i)), math.prod(s) * z))
    base, kind = base_name(name), op_kind(name)
    out: list[int] | None = None
    dtype = ins[0][0][1] if ins else None
    if kind == "matmul":
        out = _matmul_out(base, c)
        dtype = c.type(1 if base in ("addmm", "baddbmm") else 0)
    elif kind in ("elementwise", "softmax", "norm") and ins:
        if base.endswith("_") and not base.endswith("__"):
            out = list(ins[0][0][0])
        else:
            out = broadcast([list(s) for (s, _), _ in ins])
            floats = [t for (_, t), _ in ins if t in ("float", "double", "c10::Half",
                                                      "c10::BFloat16")]  # fmt: skip
            dtype = floats[0] if floats else dtype
    sh = _Shapes(inputs=ins)
    if out is not None and dtype is not None:
        z = Call([out], [dtype], None).itemsize(0)
        if z is not None:
            sh.out, sh.out_bytes = (tuple(out), dtype), math.prod(out) * z
    return sh


def _matmul_out(base: str, c: Any) -> list[int] | None:
    """Output shape of the matrix products whose rule ``costmodel/matmul.py`` has."""
    from xpuprof.costmodel.call import broadcast

    a, b = (1, 2) if base in ("addmm", "baddbmm") else (0, 1)
    x, y = c.shape(a), c.shape(b)
    if x is None or y is None or not x or not y:
        return None
    if base == "linear":
        return [*x[:-1], y[0]] if len(y) == 2 else None
    if len(x) < 2 or len(y) < 2:
        return None
    batch = broadcast([x[:-2], y[:-2]])
    return None if batch is None else [*batch, x[-2], y[-1]]


def external_bytes(shapes: list[_Shapes], op_bytes: list[float]) -> float | None:
    """B_ext of a region's work ops in order (module docstring); None when unknown."""
    produced: Counter[Sig] = Counter()
    total = 0.0
    for sh in shapes:
        used: Counter[Sig] = Counter()
        for sig, nb in sh.inputs:
            if used[sig] < produced[sig]:
                used[sig] += 1
            else:
                total += nb
        if sh.out is not None:
            produced[sh.out] += 1
    last, b = shapes[-1], op_bytes[-1]
    if last.out_bytes is not None:
        return total + last.out_bytes
    if b is not None and b == b:  # its costed bytes less its inputs: what it writes
        return total + max(float(b) - sum(nb for _, nb in last.inputs), 0.0)
    return None


# -- the plan ------------------------------------------------------------------------------------


def plan(trace: Trace, change: Change | str,
         costs: RooflineCosts | None = None) -> tuple[pd.DataFrame, RooflineCosts]:  # fmt: skip
    """The regions ``change`` fuses (one row each: its ops, bytes and modelled time; columns
    :data:`REGION_COLUMNS`) and the calibrated roofline model that priced them."""
    from xpuprof.sim.costs import RooflineCosts

    if isinstance(change, str):
        from xpuprof.sim.whatif import parse as parse_change

        change = parse_change(change)
    if change.verb not in ("fuse", "fuse-elementwise"):
        raise XpuprofError(f"change {change.text!r} is not a fusion")
    costs = costs if costs is not None else RooflineCosts(trace, calibrate=True)
    t = trace.tree(host_only=True, columns=("ts", "dur", "flops", "bytes", "correlation"))
    t.load("pid", "tid")
    is_op = t.is_level("op")
    outer = np.flatnonzero(is_op & (t.nearest(is_op, strict=True) < 0))
    scope = _spans(change, t) if change.pattern else None
    ops = _op_frame(trace, t, outer, costs)
    ops.attrs["overhead_ns"] = _fixed_overhead(t)
    if not ops["has_shapes"].any():
        raise XpuprofError(f"change {change.text!r}: {NO_SHAPES}")
    if change.verb == "fuse":
        assert scope is not None
        regions = _span_regions(ops, scope)
    else:
        regions = _chains(change, ops, scope)
    names = {}
    if scope is not None:
        rows = np.unique([s for s, _ in regions if s is not None]).astype(np.int64)
        names = dict(zip(rows.tolist(), map(str, t.names_of(rows)), strict=True))
    priced = _price(change, regions, ops, costs, names)
    if not len(priced):
        what = "spans matching it" if change.verb == "fuse" else "chains"
        raise XpuprofError(f"change {change.text!r}: nothing to fuse: the {len(regions):,} "
                           f"{what} hold no op with FLOPs or bytes and known shapes")  # fmt: skip
    return priced, costs


def _spans(c: Change, t: EventTree) -> np.ndarray:
    """Per row of the tree, the outermost host span matching ``c.pattern`` around it or
    itself (-1: none); an error naming the spans there when nothing matches."""
    rx = re.compile(c.pattern or "")
    levels = t.is_level(*SPAN_LEVELS)
    hit = levels & t.name_mask(lambda s: rx.search(s) is not None)
    if not hit.any():
        from xpuprof.core.text import short_name

        have = pd.Series(t.names_of(np.flatnonzero(t.is_level("layer", "annotation"))))
        top = list(dict.fromkeys(short_name(str(x)) for x in have.value_counts().index[:40]))[:12]
        where = (f"layer and annotation spans there: {', '.join(top)}" if top else
                 "the trace has no layer or annotation spans (capture with xpuprof.profile("
                 "model=...) for layer spans, or wrap the region in xpuprof.annotate)")  # fmt: skip
        raise XpuprofError(f"change {c.text!r}: {c.pattern!r} matches no host span; {where}")
    return t.farthest(hit)


def _op_frame(trace: Trace, t: EventTree, rows: np.ndarray, costs: RooflineCosts) -> pd.DataFrame:
    """The outermost ops in thread order, with their shapes, cost, class and device work."""

    from xpuprof.core.raw import decode_json

    o = pd.DataFrame({"row": rows, "id": t.ids[rows], "part": t.part[rows], "pid": t.pid[rows],
                      "tid": t.tid[rows], "ts": t.ts[rows], "end": t.ts[rows] + t.dur[rows],
                      "name": np.asarray(t.names_of(rows), dtype=object), "flops": t.flops[rows],
                      "bytes": t.bytes[rows]})  # fmt: skip
    o = o.sort_values(["part", "pid", "tid", "ts", "row"], kind="stable", ignore_index=True)
    got = trace.arg_fields(o["id"].to_numpy(np.int64), ("Input Dims", "Input type"))
    dims, types = got["Input Dims"].tolist(), got["Input type"].tolist()
    memo: dict[tuple[Any, Any, Any], _Shapes | None] = {}
    shapes = []
    for nm, d, ty in zip(o["name"].tolist(), dims, types, strict=True):
        key = (nm, d, ty)
        if key not in memo:
            memo[key] = _shapes(str(nm), decode_json(d) if isinstance(d, str) else None,
                                decode_json(ty) if isinstance(ty, str) else None)  # fmt: skip
        shapes.append(memo[key])
    o["shapes"] = shapes
    o["has_shapes"] = [s is not None for s in shapes]
    p = costs.ops.set_index("id")
    o["cls"] = p["class"].reindex(o["id"]).to_numpy(object)
    o["dtype"] = p["dtype"].reindex(o["id"]).to_numpy(object)
    o["priced"] = p["priced"].reindex(o["id"]).fillna(False).to_numpy(bool)
    o["on_host"] = p["on_host"].reindex(o["id"]).to_numpy(object)
    o["measured_ns"] = p["measured_ns"].reindex(o["id"]).to_numpy(float)
    o["work"] = (o["flops"].fillna(0) > 0) | (o["bytes"].fillna(0) > 0)
    o["lane"], o["first_k"], o["last_k"] = _kernel_lanes(trace, t, o)
    return o


def _kernel_lanes(trace: Trace, t: EventTree, o: pd.DataFrame
                  ) -> tuple[list[Any], np.ndarray, np.ndarray]:  # fmt: skip
    """Per op: the (part, device, stream) its kernels ran on (None: none, or several), and the
    ordinals of its first and last kernel on that stream (for back to back)."""
    n = len(o)
    lane: list[Any] = [None] * n
    first, last = np.full(n, -1, np.int64), np.full(n, -2, np.int64)
    w = trace.sql("select id, part, device, stream, ts, correlation from events where level in "
                  "('kernel', 'memcpy', 'memset') and correlation is not null")  # fmt: skip
    if not len(w) or not n:
        return lane, first, last
    w = w.sort_values(["part", "device", "stream", "ts", "id"], ignore_index=True)
    w["k"] = w.groupby(["part", "device", "stream"]).cumcount().to_numpy()
    call = t.host_calls(w["part"].to_numpy(np.int64), w["correlation"].to_numpy(np.int64),
                        runtime_only=True)  # fmt: skip
    mask = np.zeros(t.n, bool)
    mask[o["row"].to_numpy()] = True
    owner = t.nearest(mask, call, strict=True)
    w["owner"] = np.where(owner >= 0, t.ids[np.maximum(owner, 0)], -1)
    w = w[w["owner"] >= 0]
    w["lane"] = pd.factorize(pd.MultiIndex.from_frame(w[["part", "device", "stream"]]))[0]
    g = w.groupby("owner").agg(lanes=("lane", "nunique"), part=("part", "first"),
                               device=("device", "first"), stream=("stream", "first"),
                               kmin=("k", "min"), kmax=("k", "max"))  # fmt: skip
    pos = pd.Series(np.arange(n), index=o["id"].to_numpy()).reindex(g.index).to_numpy()
    for i, r in zip(pos.tolist(), g.itertuples(), strict=True):
        lane[i] = (r.part, r.device, r.stream) if r.lanes == 1 else ("several",)
    first[pos], last[pos] = g["kmin"].to_numpy(), g["kmax"].to_numpy()
    return lane, first, last


Region = tuple[int | None, list[int]]


def _chains(c: Change, ops: pd.DataFrame, scope: np.ndarray | None) -> list[Region]:
    """Maximal chains (module docstring) as (span row or None, positions in ``ops``)."""
    out: list[Region] = []
    cur: list[int] = []
    span = scope[ops["row"].to_numpy()] if scope is not None else np.full(len(ops), -1)
    # the ops a chain can hold, and those that end one (neither such an op nor a view: a view
    # moves no data and does not break a chain); only the former are visited one by one
    ok = ((ops["cls"] == CLASS).to_numpy(bool) & ops["priced"].to_numpy(bool)
          & np.fromiter((x is not None and x.out is not None for x in ops["shapes"]), bool,
                        len(ops))
          & ((span >= 0) if scope is not None else True))  # fmt: skip
    view = (ops["flops"].to_numpy(float) == 0) & ~(ops["bytes"].to_numpy(float) > 0)
    breaks = np.cumsum(~ok & ~view)
    cand = np.flatnonzero(ok)
    rows = dict(zip(cand.tolist(), ops.iloc[cand].itertuples(), strict=True))

    def close() -> None:
        if len(cur) >= 2:  # the chain, and the views between its ops
            first = None if scope is None else int(span[cur[0]])
            out.append((first, list(range(cur[0], cur[-1] + 1))))  # type: ignore[arg-type]
        cur.clear()

    for i, r in rows.items():
        if cur and view[i]:
            continue
        if cur and breaks[i] != breaks[cur[-1]]:
            close()  # an op that is neither of a chain nor a view lies between
        if cur:
            p = rows[cur[-1]]
            linked = ((p.part, p.pid, p.tid) == (r.part, r.pid, r.tid)
                      and span[cur[-1]] == span[i]
                      and any(sig == p.shapes.out for sig, _ in r.shapes.inputs)
                      and _back_to_back(p, r))  # fmt: skip
            if not linked:
                close()
        cur.append(i)
    close()
    if not out:
        elem = ops[[(x == CLASS) for x in ops["cls"]]]
        if scope is not None:
            elem = elem[span[elem.index.to_numpy()] >= 0]
        if not len(elem):
            if not ops["work"].any():
                raise XpuprofError(f"change {c.text!r}: {NO_SHAPES}")
            where = " inside the matched spans" if scope is not None else ""
            raise XpuprofError(f"change {c.text!r}: no elementwise op{where} with its "
                               "bytes known (costmodel.ops.supported_ops() lists the ops "
                               "costed)")  # fmt: skip
        names = ", ".join(pd.Series(elem["name"]).value_counts().index[:6].map(str))
        raise XpuprofError(f"change {c.text!r}: no chain of two or more elementwise ops "
                           f"(consecutive on a thread, each consuming the previous one's output); "
                           f"{len(elem):,} elementwise ops there stand alone: {names}")  # fmt: skip
    return out


def _back_to_back(p: Any, r: Any) -> bool:
    """Host ops (no kernels) chain; device ops chain when their kernels run on one stream with
    nothing between them."""
    if p.lane is None and r.lane is None:
        return bool(p.on_host) and bool(r.on_host)
    if p.lane is None or r.lane is None or p.lane != r.lane or p.lane == ("several",):
        return False
    return bool(r.first_k == p.last_k + 1)


def _span_regions(ops: pd.DataFrame, scope: np.ndarray) -> list[Region]:
    """Per (span, thread): the positions of the outermost ops inside it."""
    span = scope[ops["row"].to_numpy()]
    inside = np.flatnonzero(span >= 0)
    key = pd.DataFrame({"span": span[inside], "part": ops["part"].to_numpy()[inside],
                        "pid": ops["pid"].to_numpy()[inside],
                        "tid": ops["tid"].to_numpy()[inside], "i": inside})  # fmt: skip
    return [(int(s), list(g["i"])) for (s, *_), g in key.groupby(["span", "part", "pid", "tid"],
                                                                   sort=False)]  # fmt: skip


def _price(c: Change, regions: list[Region], ops: pd.DataFrame,
           costs: RooflineCosts, span_names: dict[int, str]) -> pd.DataFrame:  # fmt: skip
    """One row per region: its external bytes and fused time (plain lists per region: a
    trace may have thousands)."""
    overhead = ops.attrs["overhead_ns"]
    roofs = memory_roofs(costs)
    col = {k: ops[k].tolist() for k in ("id", "part", "tid", "name", "cls", "dtype", "shapes",
                                         "priced", "on_host", "work")}  # fmt: skip
    flops_a, bytes_a = ops["flops"].fillna(0).to_numpy(float), ops["bytes"].to_numpy(float)
    measured_a = ops["measured_ns"].to_numpy(float)
    unknown_a = (ops["flops"].isna() & ops["bytes"].isna()).to_numpy(bool)
    dur_a = (ops["end"] - ops["ts"]).to_numpy(float)
    rates: dict[tuple[str, str], tuple[float, float]] = {}
    rows = []
    for k, (span, pos) in enumerate(regions):
        work = [p for p in pos if col["work"][p]]
        if not work:
            continue
        bad = [p for p in work if col["shapes"][p] is None or not col["priced"][p]]
        if bad:
            if c.verb == "fuse":  # a chain is made of priced ops only
                _unpriceable(c, [col["name"][p] for p in bad], "no FLOPs/bytes or no roof")
            continue
        b_ext = external_bytes([col["shapes"][p] for p in work], [bytes_a[p] for p in work])
        if b_ext is None:
            continue
        w = np.asarray(work)
        flops = float(flops_a[w].sum())
        if c.verb == "fuse":
            by_cls: dict[str, float] = {}
            for p in work:
                by_cls[col["cls"][p]] = by_cls.get(col["cls"][p], 0.0) + flops_a[p]
            cls = max(by_cls, key=by_cls.__getitem__)
        else:
            cls = CLASS
        dtype = str(next(col["dtype"][p] for p in work if col["cls"][p] == cls))
        if (cls, dtype) not in rates:  # the roofline is max(F·a, B·b): two calls per class
            rates[(cls, dtype)] = (costs.time_ns(cls, 1.0, 0.0, dtype),
                                   costs.time_ns(cls, 0.0, 1.0, dtype))  # fmt: skip
        per_flop, per_byte = rates[(cls, dtype)]
        roofline = max(flops * per_flop, b_ext * per_byte)
        on_host = all(bool(col["on_host"][p]) for p in work)
        oh = overhead if on_host else 0.0
        # the compute floor: each op's time beyond its bytes at the best bandwidth seen
        roof = np.array([roofs.get(col["part"][p], np.nan) for p in work])
        left = measured_a[w] - oh - np.nan_to_num(np.nan_to_num(bytes_a[w]) / roof)
        floor = float(np.clip(left, 0, None).sum())
        # an op of unknown cost inside a span keeps its own time: on the CPU its duration less
        # o; on a device its kernels are not priced, so the span is not either
        unknown = [p for p in pos if unknown_a[p]] if c.verb == "fuse" else []
        if unknown and not on_host:
            _unpriceable(c, [col["name"][p] for p in unknown], "no cost rule")
        kept = float(sum(max(dur_a[p] - oh, 0.0) for p in unknown))
        floor += kept
        first, last = pos[0], pos[-1]
        rows.append({
            "region": k, "kind": "span" if c.verb == "fuse" else "chain",
            "span": None if span is None else span_names.get(span),
            "part": int(col["part"][first]), "tid": int(col["tid"][first]),
            "ops": tuple(int(col["id"][p]) for p in pos), "first": int(col["id"][first]),
            "last": int(col["id"][last]), "n_ops": len(pos),
            "names": " → ".join(str(col["name"][p]).removeprefix("aten::") for p in pos),
            "cls": cls, "dtype": dtype, "flops": flops,
            "bytes_unfused": float(np.nansum(bytes_a[w])), "bytes_external": b_ext,
            "measured_ns": float(measured_a[w].sum()), "roofline_ns": roofline, "kept_ns": kept,
            "compute_floor_ns": floor, "model_ns": max(roofline + kept, floor),
            "overhead_ns": oh, "fused_ns": max(roofline + kept, floor) + oh, "on_host": on_host,
        })  # fmt: skip
    out = pd.DataFrame(rows, columns=REGION_COLUMNS)
    out.attrs["overhead_ns"] = overhead
    return out


def _unpriceable(c: Change, names: list[Any], why: str) -> None:
    listed = ", ".join(dict.fromkeys(map(str, names)))
    raise XpuprofError(
        f"change {c.text!r}: cannot price the fused op: {listed} inside the span "
        f"have {why} (costmodel.ops.supported_ops() lists the ops costed)"
    )


def memory_roofs(costs: RooflineCosts) -> dict[int, float]:
    """Per part, the memory roof its trace shows (bytes/ns): the highest, over op names, of
    the median achieved bandwidth (bytes / measured time) of that name's priced ops (a median:
    an op stalled by another process does not lower it)."""
    o = costs.ops[costs.ops["priced"] & (costs.ops["bytes"] > 0) & (costs.ops["measured_ns"] > 0)]
    o = o.assign(rate=o["bytes"] / o["measured_ns"])
    rate = o.groupby(["part", "name"])["rate"].median().groupby(level="part").max()
    return {int(k): float(v) for k, v in rate.items()}


def _fixed_overhead(t: EventTree) -> float:
    """o: the median duration of the trace's ops that do no work and call no other op (views,
    ``as_strided``: an op call's dispatch cost; module docstring)."""
    is_op = t.is_level("op")
    rows = np.flatnonzero(is_op)
    parents = t.parent[rows]
    has_child = np.zeros(t.n, bool)
    has_child[parents[parents >= 0]] = True
    idle = is_op & ~has_child & (t.flops == 0) & ~(t.bytes > 0) & t.has_dur
    d = t.dur[idle].astype(float)
    return float(np.median(d)) if len(d) else 0.0


# -- applying it to the graph --------------------------------------------------------------------


def apply(change: Change, ctx: Context) -> str:
    """Fuse the regions of :func:`plan` in ``ctx.delay``/``ctx.keep`` (module docstring)."""
    regions, _ = plan(ctx.trace, change)
    g = ctx.graph
    n, e = g.nodes, g.edges
    start, end = _NodeOf(n, 0), _NodeOf(n, 1)
    host_tl = np.flatnonzero(e.timeline & np.isin(e.kind, (HOST_WORK, HOST_GAP)))
    into = np.full(len(n.event), -1, np.int64)  # node → the host timeline edge into it
    into[e.dst[host_tl]] = host_tl
    device: _DeviceEdges | None = None
    done, ops_fused, skipped = 0, 0, 0
    for r in regions.itertuples():
        s0, s1 = start.get(r.first), end.get(r.last)
        if s0 is None or s1 is None or n.timeline[s0] != n.timeline[s1]:
            skipped += 1  # outside the replayed steps
            continue
        inner = into[s0 + 1 : s1 + 1]
        inner = inner[inner >= 0]
        if r.on_host:
            total = float(ctx.delay[inner].sum())
            if total > 0:
                ctx.delay[inner] = np.rint(ctx.delay[inner] * (r.fused_ns / total)).astype(np.int64)
            elif len(inner):
                ctx.delay[inner[0]] = int(round(r.fused_ns))
        else:
            device = device or _DeviceEdges(ctx)
            op0 = device.fuse(r.ops, r.fused_ns, ctx)
            if op0 is None:
                skipped += 1
                continue
            # the host time of the op that launches the fused kernel (one call, one launch)
            # stays; the rest goes
            a, b = start.get(op0, s0), end.get(op0, s0)
            ctx.delay[inner[(e.dst[inner] <= a) | (e.dst[inner] > b)]] = 0
        done += 1
        ops_fused += int(r.n_ops)
    if not done:
        raise XpuprofError(f"change {change.text!r}: its {len(regions):,} regions lie outside the "
                           "replayed steps (or have no device work in the graph)")  # fmt: skip
    what = "chains" if change.verb == "fuse-elementwise" else "spans"
    b0, b1 = regions["bytes_unfused"].sum(), regions["bytes_external"].sum()
    oh = regions.attrs.get("overhead_ns", 0.0)
    fused, measured = regions["fused_ns"].sum() / 1e6, regions["measured_ns"].sum() / 1e6
    classes = ", ".join(sorted(set(regions["cls"])))
    return (f"{change.text}: {done:,} {what} of {ops_fused:,} ops fused ({b0 / 1e6:,.1f} MB of "
            f"op traffic → {b1 / 1e6:,.1f} MB external; fused time {fused:,.3f} ms vs "
            f"{measured:,.3f} ms measured in their ops, class {classes}"
            + (f"; CPU op overhead o = {oh / 1e3:.1f} µs" if regions["on_host"].any() else "")
            + (f"; {skipped} outside the replay" if skipped else "") + ")")  # fmt: skip


class _NodeOf:
    """Event id → its host start (kind 0) or end (1) node, by binary search over sorted ids."""

    def __init__(self, n: Any, kind: int) -> None:
        sel = np.flatnonzero(n.kind == kind)
        o = np.argsort(n.event[sel], kind="stable")
        self.ev, self.node = n.event[sel][o], sel[o]

    def get(self, ev: int, default: int | None = None) -> int | None:
        i = int(np.searchsorted(self.ev, ev))
        return int(self.node[i]) if i < len(self.ev) and self.ev[i] == ev else default


class _DeviceEdges:
    """The device work of the outermost ops (the op above each launching call), and the
    ``device_work`` and ``launch`` edges of each kernel, looked up once."""

    def __init__(self, ctx: Context) -> None:
        trace, g = ctx.trace, ctx.graph
        w = trace.sql("select id, part, ts, correlation from events where level in ('kernel', "
                      "'memcpy', 'memset') and correlation is not null")  # fmt: skip
        t = trace.tree(host_only=True)
        call = t.host_calls(w["part"].to_numpy(np.int64), w["correlation"].to_numpy(np.int64),
                            runtime_only=True)  # fmt: skip
        owner = t.farthest(t.is_level("op"), call, strict=True)
        w["op"] = np.where(owner >= 0, t.ids[np.maximum(owner, 0)], -1)
        w = w[w["op"] >= 0].sort_values(["op", "ts", "id"], kind="stable")
        # sorted keys and values, looked up by binary search (dicts of lists cost seconds on
        # a store of millions of events)
        self.k_op, self.k_id = w["op"].to_numpy(np.int64), w["id"].to_numpy(np.int64)
        e, n = g.edges, g.nodes
        dev = np.flatnonzero(e.kind == DEVICE_WORK)
        o = np.argsort(e.event[dev], kind="stable")
        self.w_ev, self.w_edge = e.event[dev][o], dev[o]
        launch = np.flatnonzero(e.kind == LAUNCH)
        into = n.event[e.dst[launch]]
        o = np.argsort(into, kind="stable")
        self.l_ev, self.l_edge = into[o], launch[o]

    @staticmethod
    def _of(keys: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
        lo, hi = np.searchsorted(keys, k, "left"), np.searchsorted(keys, k, "right")
        return values[lo:hi]

    def fuse(self, ops: tuple[int, ...], fused_ns: float, ctx: Context) -> int | None:
        """The first kernel of ``ops`` takes ``fused_ns``, the others nothing and their launch
        edges go; the op that launched the first (None: no kernel in the graph)."""
        per = [(int(op), self._of(self.k_op, self.k_id, int(op))) for op in ops]
        per = [(op, k) for op, k in per if len(k)]
        if not per:
            return None
        ids = np.concatenate([k for _, k in per])
        edges = [self._of(self.w_ev, self.w_edge, int(k)) for k in ids]
        if not len(edges[0]):
            return None
        for k, ed in zip(ids[1:].tolist(), edges[1:], strict=True):
            ctx.delay[ed] = 0
            ctx.keep[self._of(self.l_ev, self.l_edge, k)] = False
        ctx.delay[edges[0]] = 0
        ctx.delay[edges[0][0]] = int(round(fused_ns))
        return per[0][0]

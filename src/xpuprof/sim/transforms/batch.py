"""``batch[:REGEX]=FACTOR`` (or ``=NEW/OLD``): the batch size × FACTOR, each op repriced
through the roofline of its new shapes, not scaled linearly.

**Which work carries the batch.** The recorded batch size B is read from the shapes: over the
model's costed ops (the roofline's units: outermost framework ops with FLOPs or bytes; outside
the input pipeline and the optimizer), the most common leading dimension of each op's first
tensor input that is not of a parameter shape (``aten::linear`` of ``[B, 512]``, a convolution
of ``[B, C, H, W]``, a ReLU of ``[B, 1024]``; a weight gradient's ``[1024, B]`` votes for 1024
but is outvoted). ``batch=NEW/OLD`` gives B (= OLD) and the factor (NEW/OLD) instead.
*Parameter shapes* are the tensor inputs of the ops inside the optimizer's regions
(``Optimizer.step#…``, ``Optimizer.zero_grad#…``) and of ``AccumulateGrad`` (the gradients,
shaped as their parameters). An op carries the batch when one of its tensor inputs that is not
of a parameter shape has a dimension equal to B; in each such tensor the *first* dimension
equal to B (the leading one of a batch-first activation, the last one of the transposed
activation of a weight gradient, ``mm(gᵀ, x)``) becomes round(B·FACTOR), and the op's FLOPs F
and bytes Bytes are recomputed from the new shapes by ``xpuprof.costmodel`` (weights' bytes
unchanged, activations' × FACTOR, a GEMM's FLOPs × FACTOR). Ops inside the optimizer's regions,
ops whose inputs have no such dimension (parameter-only work), and host time outside ops
(Python between ops, autograd's bookkeeping: ``host_gap`` edges, and a step's own time outside
its ops) keep their measured times. The input pipeline's spans (``whatif.INPUT_PATTERN``: the
DataLoader's iterator, what is nested in it) × FACTOR: fetching and collating is per-sample
work (and so is the profiler's cost of the per-sample events recorded there: a prediction for
an unprofiled run carries this part as a ratio, ``benchmarks/whatif_cases/batch.py``).
``:REGEX`` limits all of this to host events matching REGEX and what is nested in them
(``batch:Sequential=2``: the model's forward only).

**Time of an op.** The work measure of an op is its roofline time at its device's peaks,
x = max(F/P, Bytes/W) (ns; P the peak FLOP/s of its precision, matrix rate for GEMM-like ops,
W the memory bandwidth: the roofline tool's ``peak_flops``/``peak_bandwidth``, with a CPU
trace's ops on this machine's calibrated CPU, ``hardware.local_cpu`` — only the ridge P/W
matters: the model uses x'/x). An op's time is a fixed part and a work part, T = a + w. Per
class c (the roofline model's classes: ``matmul``, ``elementwise``, ``softmax``, ``loss``…),
the fixed part a_c is the intercept of the least-squares line T = a_c + b_c·x through the
class's priced ops (the optimizer's included: they are measurements of the class too), each
distinct op (name and input shapes) once at its median time over the trace's repetitions; a_c is
bounded to [0, the class's fastest op] (a fixed part cannot be negative, nor longer than an
op that has it), and is 0 for a class with one distinct x (nothing to separate it by). b_c
(ns per ns of x: 1/efficiency) is reported, not used. An op that carries the batch is
predicted as

    T' = max(T + w·(x'/x − 1), min(T, a_c)),    w = max(T̃ − a_c, 0)

— T its measured time, T̃ its median over its repetitions (same name and input shapes): its work
part w runs at *its own* measured efficiency (a GEMM twice as slow as its class stays twice as
slow) and grows with its roofline work, its fixed part and its own noise stay as measured; it
never drops below its class's fixed part. The profiler's per-op overhead is in T and in a_c,
never multiplied: the change in ns carries over to an unprofiled run. The new time is spread
over the op's edges as the roofline model does (``RooflineCosts.delays``): on a GPU, each
kernel it launched gets dur · T'/T (T: the op's device time; its launches keep their measured
latency); on a CPU, each ``host_work`` edge inside the op × T'/T.

**Not modelled.** Cache effects (a batch whose activations leave the cache runs at another rate
than b_c measured); a kernel or algorithm choice that changes with the shape (oneDNN and cuBLAS
pick by size; the new shape runs at the efficiency of the class's fit, plus the op's own
measured deviation); memory limits (a batch that no longer fits); ops with no cost rule in
``xpuprof.costmodel`` (not costed: kept measured, whatever their shapes); work whose batch
dimension is flattened with another (``[B·S, H]`` after a reshape: it does not equal B); a
dimension equal to B that is not the batch (a hidden size equal to B in a non-parameter tensor:
the first such dimension is taken; the note warns when B is also a parameter dimension); XLA
ops (JAX, TPU traces: costed by XLA's cost analysis of a compiled program, no shapes to
rescale: an error); a trace without an optimizer step or ``AccumulateGrad`` (inference): no
parameter shapes are known, so a weight with a dimension equal to B would be scaled too. The
step's Python and the optimizer keep their time.

A trace without input shapes cannot be priced: the change is an error that says to capture
with ``record_shapes`` (``xpuprof.profile(..., record_shapes=True)`` or ``level="full"``;
``level="op"`` does not record them by default).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.core.errors import XpuprofError
from xpuprof.sim.graph import DEVICE_WORK, HOST_WORK
from xpuprof.sim.whatif import INPUT_PATTERN, Change, checked_pattern, inside, member

if TYPE_CHECKING:
    from xpuprof.sim.costs.roofline import RooflineCosts
    from xpuprof.sim.transforms import Context
    from xpuprof.trace.trace import Trace

PRICED = True

#: PyTorch's optimizer regions (``Optimizer.step#SGD.step``, ``Optimizer.zero_grad#…``).
OPTIMIZER_PATTERN = r"^Optimizer\.(?:step|zero_grad)#"
#: Autograd's gradient accumulation: its input is a gradient, shaped as its parameter.
PARAMETER_PATTERN = r"AccumulateGrad$"
#: Why a trace cannot be priced without shapes.
NO_SHAPES = ("the trace records no input shapes, so no op's FLOPs and bytes can be "
             "recomputed at another batch size: capture with record_shapes "
             "(xpuprof.profile(..., record_shapes=True) or level='full'; "
             "torch.profiler(record_shapes=True))")  # fmt: skip
FIT_COLUMNS = ["class", "ops", "a_ns", "b", "source"]
OP_COLUMNS = ["id", "step", "name", "class", "measured_ns", "flops", "bytes", "flops_new",
              "bytes_new", "typical_ns", "x", "x_new", "carries", "predicted_ns",
              "reason"]  # fmt: skip


def parse(text: str, verb: str, arg: str, value: str) -> Change:
    """``batch[:REGEX]=FACTOR`` or ``batch[:REGEX]=NEW/OLD``."""
    if not value:
        raise XpuprofError(f"change {text!r}: say the factor (new batch ÷ recorded batch), e.g. "
                           "batch=2, batch=0.5, or the sizes batch=128/64")  # fmt: skip
    new_t, slash, old_t = value.partition("/")
    try:
        nums = [float(new_t)] + ([float(old_t)] if slash else [])
    except ValueError:
        raise XpuprofError(f"change {text!r}: {value!r} is not a number (a factor such as 2 or "
                           "0.5, or NEW/OLD batch sizes such as 128/64)") from None  # fmt: skip
    if not all(np.isfinite(x) and x > 0 for x in nums):
        raise XpuprofError(f"change {text!r}: the batch factor must be > 0 (a batch of 0 "
                           "samples does no work to price)")  # fmt: skip
    options: tuple[tuple[str, Any], ...] = ()
    if slash:
        new, old = nums
        if new != int(new) or old != int(old):
            raise XpuprofError(f"change {text!r}: batch sizes NEW/OLD must be whole numbers")
        options = (("new", int(new)), ("old", int(old)))
        factor = new / old
    else:
        factor = nums[0]
    pattern = checked_pattern(text, arg or None)
    return Change(text, verb, pattern=pattern, factor=factor, options=options)


@dataclass
class Plan:
    """What ``batch`` changes: the recorded and new batch, how B was found, the per-class fit
    (``fits``: a_ns, b) and each costed op (``ops``: its x, x', whether it carries the batch,
    its predicted time), and the input spans (``input_ids``, with what is nested in them)."""

    batch: int
    new_batch: int
    found: str
    fits: pd.DataFrame
    ops: pd.DataFrame
    input_ids: np.ndarray
    costs: Any = None
    warnings: list[str] = field(default_factory=list)


def plan(trace: Trace, change: Change) -> Plan:
    """The batch change's repricing of ``trace`` (module docstring); errors name what is
    missing."""
    from xpuprof.sim.costs.roofline import RooflineCosts

    rc = RooflineCosts(trace, calibrate=True)
    units = rc.ops
    if not len(units):
        raise XpuprofError(f"change {change.text!r}: {NO_SHAPES}")
    t = trace.tree(host_only=True, columns=("step",))
    rows = t.rows_of(units["id"].to_numpy(np.int64))
    in_opt = _under(t, OPTIMIZER_PATTERN, rows)
    in_inp = _under(t, INPUT_PATTERN, rows)
    in_scope = _under(t, change.pattern, rows) if change.pattern else np.ones(len(rows), bool)
    calls = _calls(trace, units["id"].to_numpy(np.int64))
    if not any(len(c) for c in calls):
        if units["class"].astype(str).str.startswith("xla:").all():
            raise XpuprofError(f"change {change.text!r}: the trace's ops are XLA's, costed by "
                               "XLA's cost analysis of a program compiled for one batch size, "
                               "with no framework-op shapes to rescale: compile and capture at "
                               "the new batch size instead")  # fmt: skip
        raise XpuprofError(f"change {change.text!r}: {NO_SHAPES}")
    params = _parameter_shapes(trace, t)
    model = ~in_opt & ~in_inp & (rows >= 0)  # the model's work (B is read there)
    batchy = model & in_scope
    inp = np.flatnonzero(t.name_mask(re.compile(INPUT_PATTERN).search))
    if change.pattern and len(inp):
        inp = inp[_under(t, change.pattern, inp)]
    if change.pattern and not batchy.any() and not len(inp):
        raise XpuprofError(f"change {change.text!r}: no costed op and no input-pipeline span "
                           f"lies inside a host event matching {change.pattern!r}")  # fmt: skip
    # an op's call site (name and input shapes): its repetitions share it, each costed once
    named = zip(units["name"].astype(str), calls, strict=True)
    shape = pd.Series([f"{n}{c.dims!r}{c.types!r}" for n, c in named], index=units.index)
    site = shape.to_numpy(object)
    b0, found = _recorded_batch(change, model, calls, units, params, site)
    new_b = int(change.option("new") or round(b0 * change.factor))
    if new_b < 1:
        raise XpuprofError(f"change {change.text!r}: the recorded batch is {b0}; × "
                           f"{change.factor:g} leaves no sample")  # fmt: skip
    warnings = []
    if new_b != b0 * change.factor:
        warnings.append(f"batch {b0} × {change.factor:g} rounded to {new_b}")
    if any(b0 in s for s in params):
        warnings.append(f"{b0} is also a dimension of a parameter: in activations the first "
                        f"dimension equal to {b0} is taken for the batch")  # fmt: skip

    where = np.where(in_opt, "in the optimizer", np.where(in_inp, "in the input pipeline",
                                                          "outside the scope"))  # fmt: skip
    f0, y0, f1, y1, carries, reason = _rescale(units, calls, batchy, where, b0, new_b, params,
                                               site)  # fmt: skip
    peak = units["peak_flops"].to_numpy(float)
    bw = units["peak_bandwidth"].to_numpy(float)
    x0, x1 = _work(f0, y0, peak, bw), _work(f1, y1, peak, bw)
    x = _work(units["flops"].to_numpy(float), units["bytes"].to_numpy(float), peak, bw)
    fits = _fit(units, shape, x)
    fit = fits.set_index("class")
    cls = units["class"].astype(str).to_numpy()
    a_c = pd.Series(cls).map(fit["a_ns"]).to_numpy(float)
    measured = units["measured_ns"].to_numpy(float)
    # the op's typical time: the median over its repetitions
    timed = units["measured_ns"].where(units["measured_ns"] > 0)
    typical = timed.groupby(shape).transform("median").to_numpy(float)
    ok = carries & units["priced"].to_numpy(bool) & (x0 > 0) & np.isfinite(a_c)
    ok &= (measured > 0) & np.isfinite(typical)
    for k in np.flatnonzero(carries & ~ok):
        why = units["reason"].iloc[k]
        reason[k] = why if isinstance(why, str) else "its class has no fit (no roof or no time)"
    with np.errstate(divide="ignore", invalid="ignore"):
        work = np.fmax(typical - a_c, 0.0)  # its work part, at its own efficiency
        predicted = np.fmax(measured + work * (x1 / x0 - 1.0), np.fmin(measured, a_c))
    predicted = np.where(ok, predicted, np.nan)
    ops = pd.DataFrame({
        "id": units["id"].to_numpy(np.int64), "step": np.where(rows >= 0, t.step[rows], -1),
        "name": units["name"].astype(str).to_numpy(object), "class": cls,
        "measured_ns": measured, "flops": f0, "bytes": y0, "flops_new": f1, "bytes_new": y1,
        "typical_ns": typical, "x": x0, "x_new": x1, "carries": ok, "predicted_ns": predicted,
        "reason": reason,
    }, columns=OP_COLUMNS)  # fmt: skip
    return Plan(b0, new_b, found, fits, ops, t.ids[inp], rc, warnings)


def apply(change: Change, ctx: Context) -> str:
    """Reprice the ops that carry the batch and scale the input spans (module docstring)."""
    p = plan(ctx.trace, change)
    rc: RooflineCosts = p.costs
    carried = p.ops[p.ops["carries"]]
    if not len(carried) and not len(p.input_ids):
        raise XpuprofError(f"change {change.text!r}: no op carries the batch {p.batch} and the "
                           "trace has no input-pipeline span")  # fmt: skip
    # the roofline model's edge mapping, with the batch's times in place of its own
    o = rc.ops.copy()
    priced = o["id"].isin(carried["id"]).to_numpy()
    o["priced"] = priced
    o["predicted_ns"] = o["id"].map(carried.set_index("id")["predicted_ns"])
    from xpuprof.sim.costs import Given

    before = ctx.delay.copy()
    rc.ops, rc.base = o, Given(before)
    ctx.delay[:] = np.asarray(rc.delays(ctx.graph), np.int64)
    g, e = ctx.graph, ctx.graph.edges
    # the share of the device's work (a GPU trace) or of the host's (a CPU trace) repriced
    kind = DEVICE_WORK if (e.kind == DEVICE_WORK).any() else HOST_WORK
    work = e.kind == kind
    total = float(before[work].sum())
    share = float(before[work & (ctx.delay != before)].sum()) / total if total > 0 else 0.0
    where = "device" if kind == DEVICE_WORK else "host"
    spans = 0
    if len(p.input_ids):
        ids = np.union1d(p.input_ids, inside(g, p.input_ids))
        pick = (e.kind == HOST_WORK) & member(e.event, ids)
        ctx.delay[pick] = np.rint(ctx.delay[pick] * change.factor).astype(np.int64)
        spans = int(pick.sum())
    kept = p.ops[~p.ops["carries"]]
    opt = int((kept["reason"] == "in the optimizer").sum())
    classes = set(carried["class"].unique().tolist())
    fits = ", ".join(f"{r['class']} a={r['a_ns'] / 1e3:.1f} µs b={r['b']:.3g}"
                     for _, r in p.fits.iterrows() if r["class"] in classes)  # fmt: skip
    delta = float((carried["predicted_ns"] - carried["measured_ns"]).sum())
    steps = max(int(carried["step"][carried["step"] >= 0].nunique()), 1)
    return (f"{change.text}: batch {p.batch} → {p.new_batch} ({p.found}); {len(carried):,} ops "
            f"carry it, repriced T' = T + (T̃ − a)·(x'/x − 1): {delta / steps / 1e6:+.3f} ms of "
            f"op time per step ({steps} steps; per class T = a + b·x: {fits or 'none'}); "
            f"{share:.0%} of the {where} work's baseline time repriced; "
            f"{len(kept):,} costed ops kept ({opt:,} in the optimizer); {spans:,} "
            f"input-pipeline edges × {change.factor:g}; host time outside ops unchanged"
            + "".join(f"; {w}" for w in p.warnings))  # fmt: skip


# -- parts ---------------------------------------------------------------------------------------


def _under(t: Any, pattern: str | None, rows: np.ndarray) -> np.ndarray:
    """Whether each of ``rows`` is, or is nested in, a host event whose name matches."""
    if not pattern or not len(rows):
        return np.zeros(len(rows), bool)
    mask = t.name_mask(re.compile(pattern).search)
    if not mask.any():
        return np.zeros(len(rows), bool)
    return t.nearest(mask, np.asarray(rows, np.int64)) >= 0


def _calls(trace: Trace, ids: np.ndarray) -> list[Any]:
    """The recorded call (``Input Dims``, ``Input type``, ``Concrete Inputs``) of each event of
    ``ids``, in order: the three fields read by DuckDB, each distinct text decoded once (an
    op's repetitions share them; decoding every args object costs seconds on a large store)."""
    from xpuprof.core.raw import decode_json
    from xpuprof.costmodel.call import Call

    got = trace.arg_fields(ids, ("Input Dims", "Input type", "Concrete Inputs"))
    memo: dict[tuple[Any, Any, Any], Any] = {}
    out = []
    for key in zip(*(got[k].tolist() for k in got.columns), strict=True):
        if key not in memo:
            memo[key] = Call(*(decode_json(x) if isinstance(x, str) else None for x in key))
        out.append(memo[key])
    return out


def _shapes(c: Any) -> list[list[int]]:
    """The tensor shapes of a call's inputs (tensor lists flattened)."""
    out = []
    for i in range(len(c)):
        s = c.shape(i)
        if s is not None:
            out.append(s)
        else:
            out.extend(c.tensor_list(i) or [])
    return out


def _parameter_shapes(trace: Trace, t: Any) -> set[tuple[int, ...]]:
    """Shapes of the tensor inputs of the optimizer's ops and of ``AccumulateGrad``."""
    opt = t.name_mask(re.compile(OPTIMIZER_PATTERN).search)
    acc = t.name_mask(re.compile(PARAMETER_PATTERN).search)
    inside = (t.nearest(opt) >= 0) & t.is_level("op") if opt.any() else np.zeros(t.n, bool)
    rows = np.flatnonzero(inside | acc)
    if not len(rows):
        return set()
    out: set[tuple[int, ...]] = set()
    for c in {id(c): c for c in _calls(trace, t.ids[rows])}.values():
        out.update(tuple(s) for s in _shapes(c) if s)
    return out


def _first_batch_dim(c: Any, params: set[tuple[int, ...]]) -> int | None:
    """Leading dimension of a call's first tensor input that is not of a parameter shape."""
    for s in _shapes(c):
        if s and tuple(s) not in params:
            return int(s[0])
    return None


def _recorded_batch(change: Change, batchy: np.ndarray, calls: list[Any], units: pd.DataFrame,
                    params: set[tuple[int, ...]], site: np.ndarray) -> tuple[int, str]:  # fmt: skip
    """B: given (``=NEW/OLD``), or the most common leading dimension of the model ops' first
    non-parameter tensor input (module docstring)."""
    cand = np.flatnonzero(batchy)
    if change.option("old"):
        b = int(change.option("old"))
        if not any(b in s for k in cand for s in _shapes(calls[k])):
            dims = Counter(d for k in cand for s in _shapes(calls[k]) for d in s[:1])
            have = ", ".join(str(d) for d, _ in dims.most_common(8)) or "none"
            raise XpuprofError(f"change {change.text!r}: no op's input has a dimension {b}; "
                               f"leading dimensions there: {have}")  # fmt: skip
        return b, "given"
    votes: Counter[int] = Counter()
    first: dict[int, str] = {}
    seen: dict[str, int | None] = {}
    names = units["name"].astype(str).to_numpy(object)
    for k in cand.tolist():
        if site[k] not in seen:
            seen[site[k]] = _first_batch_dim(calls[k], params)
        d = seen[site[k]]
        if d is not None:
            votes[d] += 1
            first.setdefault(d, names[k])
    if not votes:
        raise XpuprofError(f"change {change.text!r}: no costed op outside the optimizer and the "
                           f"input pipeline has input shapes, so the batch size cannot be read; "
                           f"{NO_SHAPES}, or give the sizes: batch=NEW/OLD")  # fmt: skip
    b, n = votes.most_common(1)[0]
    return b, (f"the most common leading dimension of the model's inputs: {n:,} of "
               f"{sum(votes.values()):,} ops, the first {first[b]}")  # fmt: skip


def _rescale(units: pd.DataFrame, calls: list[Any], batchy: np.ndarray, where: np.ndarray,
             b0: int, b1: int, params: set[tuple[int, ...]],
             site: np.ndarray) -> tuple[np.ndarray, ...]:  # fmt: skip
    """Per costed op: FLOPs and bytes at the recorded and the new batch (``costmodel``),
    whether it carries the batch, and why not (``where`` for the ops outside ``batchy``);
    each call site (``site``: name and input shapes) costed once."""
    n = len(units)
    f0, y0, f1, y1 = (np.full(n, np.nan) for _ in range(4))
    carries = np.zeros(n, bool)
    reason = np.full(n, None, dtype=object)
    names = units["name"].astype(str).tolist()
    memo: dict[str, tuple[Any, ...]] = {}
    for k in range(n):
        if not batchy[k]:
            reason[k] = where[k]
            continue
        if site[k] not in memo:
            memo[site[k]] = _rescale_one(names[k], calls[k], b0, b1, params)
        got = memo[site[k]]
        if isinstance(got, str):
            reason[k] = got
            continue
        f0[k], y0[k], f1[k], y1[k] = got
        carries[k] = True
    return f0, y0, f1, y1, carries, reason


def _rescale_one(name: str, c: Any, b0: int, b1: int,
                 params: set[tuple[int, ...]]) -> tuple[float, ...] | str:  # fmt: skip
    """One call site's FLOPs and bytes at ``b0`` and ``b1``, or why it does not carry it."""
    from xpuprof.costmodel.ops import op_cost

    dims = _scale_dims(c, b0, b1, params)
    if dims is None:
        return f"no non-parameter input has a dimension {b0}"
    a, b = op_cost(name, c.dims, c.types, c.concrete)
    a2, b2 = op_cost(name, dims, c.types, c.concrete)
    if a2 is None and b2 is None:
        return "its cost rule does not accept the new shapes"
    return a or 0.0, b or 0.0, a2 or 0.0, b2 or 0.0


def _scale_dims(c: Any, b0: int, b1: int, params: set[tuple[int, ...]]) -> list[Any] | None:
    """``Input Dims`` with the first dimension equal to ``b0`` of each non-parameter tensor
    input set to ``b1``; None when no tensor has one."""

    def one(s: list[int]) -> list[int] | None:
        if tuple(s) in params or b0 not in s:
            return None
        j = s.index(b0)
        return s[:j] + [b1] + s[j + 1 :]

    dims = list(c.dims)
    changed = False
    for i in range(len(c)):
        s = c.shape(i)
        if s is not None:
            new = one(s)
            if new is not None:
                dims[i], changed = new, True
            continue
        lst = c.tensor_list(i)
        if lst:
            news = [one(x) for x in lst]
            if any(x is not None for x in news):
                dims[i] = [x if x is not None else y for x, y in zip(news, lst, strict=True)]
                changed = True
    return dims if changed else None


def _work(flops: np.ndarray, nbytes: np.ndarray, peak: np.ndarray, bw: np.ndarray) -> np.ndarray:
    """x = max(F/P, Bytes/W) in ns; NaN without a roof."""
    with np.errstate(divide="ignore", invalid="ignore"):
        tc = np.where(np.nan_to_num(flops) > 0, flops / peak, 0.0)
        tm = np.where(np.nan_to_num(nbytes) > 0, nbytes / bw, 0.0)
    x = np.fmax(tc, tm) * 1e9
    bad = (np.nan_to_num(flops) > 0) & ~np.isfinite(peak) | (np.nan_to_num(nbytes) > 0) & (
        ~np.isfinite(bw))  # fmt: skip
    return np.where(bad, np.nan, x)


def _fit(units: pd.DataFrame, shape: pd.Series, x: np.ndarray) -> pd.DataFrame:
    """Per class, T = a + b·x over its distinct ops at their median time (module docstring)."""
    d = pd.DataFrame({"class": units["class"].astype(str), "shape": shape, "x": x,
                      "t": units["measured_ns"].to_numpy(float)})  # fmt: skip
    d = d[np.isfinite(d["x"]) & (d["x"] > 0) & (d["t"] > 0)]
    groups = d.groupby(["class", "shape"], sort=True).agg(
        x=("x", "first"), t=("t", "median")).reset_index()  # fmt: skip
    rows = []
    for cls, g in groups.groupby("class", sort=True):
        xs, ts = g["x"].to_numpy(float), g["t"].to_numpy(float)
        if len(np.unique(xs)) < 2:
            a, src = 0.0, "one size: no fixed part separable"
        else:
            a, src = float(np.polyfit(xs, ts, 1)[1]), "least squares"
            if a < 0:
                a, src = 0.0, "least squares, a < 0 set to 0"
            elif a > ts.min():
                a, src = float(ts.min()), "least squares, a capped at the fastest op"
        b = max(float(xs @ (ts - a) / (xs @ xs)), 0.0)  # the slope, given a
        rows.append({"class": cls, "ops": len(g), "a_ns": a, "b": b, "source": src})
    return pd.DataFrame(rows, columns=FIT_COLUMNS)

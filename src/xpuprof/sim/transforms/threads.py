"""``threads=N`` (or ``threads=OLD:NEW``): the CPU ops run with N intra-op threads instead of
the count they were recorded with (``torch.set_num_threads``).

How PyTorch spends intra-op threads (ATen, ``aten/src/ATen/Parallel.h``, ``ParallelOpenMP.h``):
an op splits its range with ``at::parallel_for(0, n, GRAIN_SIZE)`` into at most
min(threads, ⌈n / GRAIN_SIZE⌉) chunks, GRAIN_SIZE = 32,768 elements
(``at::internal::GRAIN_SIZE``); below one grain, or with one thread, it runs inline on the
calling thread. GEMMs and convolutions go to MKL / oneDNN / OpenBLAS, which thread a
problem above their own size threshold. The Python and dispatch time between ops is
single-threaded. So the own CPU time of an op (``host_work`` edges whose innermost event is
the op: not its children's) is read as

    own = s + W,    own′ = s + W · p(OLD) / p(NEW)

- **p(T)**, the threads the op can use with T intra-op threads: min(T, P, chunks), P the CPUs
  the process could use (``xpuprof_capture`` meta ``cpus``, recorded by ``xpuprof.profile``;
  without it no CPU bound), chunks:
  - GEMM-like ops (cost-model kinds ``matmul``, ``conv``, ``attention``): unbounded when
    the op does at least :data:`GEMM_MIN_MACS` multiply-adds (FLOPs / 2, from its recorded
    shapes), else 1. 2¹⁸ is OpenBLAS's documented cut (``interface/gemm.c``: one thread
    while M·N·K < 65,536 · GEMM_MULTITHREAD_THRESHOLD, default 4); MKL (PyTorch's x86 BLAS)
    does not publish its cut, and threads problems of that order;
  - every other op with a cost rule that moves data: ⌈n / GRAIN_SIZE⌉, n the largest
    tensor argument it was called with (elements, from ``Input Dims``; a tensor list: its
    largest tensor, as the foreach fallbacks run one tensor at a time);
  - views and allocations (no FLOPs, no bytes), ops without a cost rule (autograd nodes,
    wrappers whose work is in their children) and ops without recorded shapes: 1 — kept as
    measured (those without shapes are counted in the note).
- **s**, the serial part (dispatch, bookkeeping, the profiler's own cost per op): the op's
  whole own time when it is serial (p = 1 at any thread count); otherwise min(own, f), f the
  fixed cost of an op of that name = the smallest own time of its serial instances in the
  trace (an ``add_`` on a 1,024-element bias, beside those on 1024×512 weights), or, for a
  name without a serial instance, the median own time of all serial ops of its part.
- **W** = own − s, the parallel part, scaled by p(OLD)/p(NEW).

OLD is the count ``xpuprof.profile`` records (``xpuprof_capture`` meta ``threads``:
``torch.get_num_threads()`` when the capture stops); a trace without it (any Kineto file from
elsewhere) needs ``threads=OLD:NEW``, and a given OLD wins over a recorded one (the note says
so when they differ). In a trace with device work, ops that launched device work (a runtime
call inside them) are the device's: their CPU time is dispatch, kept.

Limits: a memory-bandwidth-bound op (a big elementwise op) does not speed up linearly with
threads (the cores share the memory bus), so going up in threads is over-optimistic for them;
two threads on two hyperthreads of one core share its execution units (P counts logical
CPUs); a parallel region pays an OpenMP fork/join (thread-pool wake-up, a few µs) that the
recorded parallel part includes and a one-thread run does not — a recorded 2-thread trace
predicts 1 thread slightly slow, a 1-thread trace 2 threads slightly fast; more threads than
CPUs (oversubscription) are bounded at P, not made slower; MKL's and oneDNN's own cut-offs
and their partitioning of a GEMM are approximated by one threshold; inter-op threads, the
DataLoader's workers and other processes sharing the CPUs are not modelled.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pandas as pd

from xpuprof.core.errors import XpuprofError
from xpuprof.sim.graph import HOST_END, HOST_START, HOST_WORK
from xpuprof.sim.whatif import Change, member

if TYPE_CHECKING:
    from xpuprof.sim.transforms import Context
    from xpuprof.trace.trace import Trace

PRICED = True

#: ``at::internal::GRAIN_SIZE``: elements below which ``at::parallel_for`` runs inline.
GRAIN_SIZE = 32_768
#: Multiply-adds from which a GEMM-like op is threaded (OpenBLAS: 65,536 × 4; module docstring).
GEMM_MIN_MACS = 65_536 * 4


def parse(text: str, verb: str, arg: str, value: str) -> Change:
    """``threads=N`` or ``threads=OLD:NEW`` (counts ≥ 1)."""
    if arg:
        raise XpuprofError(f"change {text!r}: threads takes no pattern (it changes every CPU "
                           "op); say threads=N or threads=OLD:NEW")  # fmt: skip
    if not value:
        raise XpuprofError(f"change {text!r}: say how many intra-op threads, e.g. "
                           "threads=1 (or threads=OLD:NEW when the trace does not record "
                           "its count)")  # fmt: skip
    old_text, _, new_text = value.rpartition(":")
    old = _count(text, old_text) if old_text else None
    new = _count(text, new_text)
    return Change(text, verb, ("op",), None, float(new), options=(("old", old),))


def _count(text: str, s: str) -> int:
    try:
        n = int(s.strip())
    except ValueError:
        raise XpuprofError(f"change {text!r}: {s.strip()!r} is not a whole number of "
                           "threads") from None  # fmt: skip
    if n < 1:
        raise XpuprofError(f"change {text!r}: the thread count must be ≥ 1, got {n}")
    return n


def recorded(trace: Trace) -> dict[int, int]:
    """Per part, the intra-op thread count the capture recorded (``xpuprof.profile``)."""
    out = {}
    for s in trace.sources:
        n = ((s.get("meta") or {}).get("xpuprof_capture") or {}).get("threads")
        if isinstance(n, int) and n > 0:
            out[int(s["part"])] = n
    return out


class _Shapes(msgspec.Struct, gc=False):
    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b"null"), name="Input type")


_DECODE = msgspec.json.Decoder(_Shapes)


def largest_tensor(args: Any, cache: dict[tuple[bytes, bytes], int | None] | None = None
                   ) -> int | None:  # fmt: skip
    """Elements of the largest tensor argument (a tensor list: of its largest tensor) of an
    op from its ``args`` JSON; None without recorded shapes. ``cache``: answers per distinct
    (``Input Dims``, ``Input type``) text — a trace repeats its shapes, not its args."""
    if not isinstance(args, (str, bytes)) or not args:
        return None
    try:
        a = _DECODE.decode(args)
    except msgspec.DecodeError:
        return None
    key = (bytes(a.dims), bytes(a.types))
    if cache is not None and key in cache:
        return cache[key]
    out = _largest(msgspec.json.decode(key[0]), msgspec.json.decode(key[1]))
    if cache is not None:
        cache[key] = out
    return out


def _largest(dims: Any, types: Any) -> int | None:
    from xpuprof.costmodel.call import Call

    c = Call(dims, types, None)
    best: int | None = None
    for i in range(len(c)):
        shapes = [c.shape(i)] if c.is_tensor(i) else (c.tensor_list(i) or [])
        for s in shapes:
            if s is not None:
                best = max(best or 0, math.prod(s))
    return best


def chunks(kind: str | None, flops: float, nbytes: float, largest: int | None) -> float:
    """How many pieces the op's work can be split into (module docstring); 1: serial;
    NaN: unknown (no shapes)."""
    from xpuprof.costmodel.call import EXACT_KINDS

    if kind is None:
        return 1.0
    f = 0.0 if np.isnan(flops) else flops
    b = 0.0 if np.isnan(nbytes) else nbytes
    if np.isnan(flops) and np.isnan(nbytes):
        return np.nan  # a rule that needs shapes, and none recorded
    if f == 0 and b == 0:
        return 1.0  # a view or an allocation
    if kind in EXACT_KINDS:
        return math.inf if f / 2 >= GEMM_MIN_MACS else 1.0
    if largest is None:
        return np.nan
    return float(max(1, -(-largest // GRAIN_SIZE)))


def apply(c: Change, ctx: Context) -> str:
    """Scale the parallel part of each CPU op's own time by p(OLD)/p(NEW) (module docstring)."""
    from xpuprof.costmodel.ops import op_kind

    g, e, new = ctx.graph, ctx.graph.edges, int(c.factor)
    parts = [int(p) for p in g.parts]
    given = c.option("old")
    rec = recorded(ctx.trace)
    missing = [p for p in parts if given is None and p not in rec]
    if missing:
        raise XpuprofError(
            f"change {c.text!r}: the trace does not record the intra-op thread count of part(s) "
            f"{', '.join(map(str, missing))} (xpuprof.profile records it; a Kineto file from "
            f"elsewhere does not): say it, e.g. threads=OLD:{new}")  # fmt: skip
    old = {p: given or rec[p] for p in parts}
    ops = ctx.trace.sql(
        f"select id, part, name, flops, bytes, args from events where level = 'op' and part "
        f"in ({', '.join(map(str, parts)) or 'null'}) order by id")  # fmt: skip
    if ops.empty:
        raise XpuprofError(f"change {c.text!r}: the trace has no framework ops to rerun with "
                           "other thread counts (capture at level 'op')")  # fmt: skip
    ids = ops["id"].to_numpy(np.int64)
    # own time of each op: its host_work edges
    hw = np.flatnonzero((e.kind == HOST_WORK) & member(e.event, ids))
    row = np.searchsorted(ids, e.event[hw])
    own = np.bincount(row, weights=ctx.delay[hw].astype(float), minlength=len(ids))
    names = ops["name"].astype(str).to_numpy(object)
    kind_of = {n: op_kind(n) for n in set(names.tolist())}
    kinds = [kind_of[n] for n in names.tolist()]
    flops = ops["flops"].to_numpy(float)
    nbytes = ops["bytes"].to_numpy(float)
    args = ops["args"].to_numpy(object)
    device_op = _launched_device_work(ctx, ids)
    ch = _all_chunks(kinds, flops, nbytes, args, device_op)
    unknown = np.isnan(ch)
    ch[unknown] = 1.0
    part = ops["part"].to_numpy(np.int64)
    serial = ch == 1
    if not (ch > 1).any():
        why = (f"{int(unknown.sum()):,} ops with a cost rule have no recorded shapes "
               "(capture with record_shapes=True)" if unknown.any()
               else "every op is below ATen's grain size (32,768 elements) or a small "
               "GEMM")  # fmt: skip
        raise XpuprofError(f"change {c.text!r}: no CPU op of the trace runs in parallel: {why}")
    fixed = _fixed_parts(names, part, own, serial & ~unknown)
    s = np.minimum(own, fixed)
    s[serial] = own[serial]
    cpus = ctx.cpus
    uniq, at = np.unique(part, return_inverse=True)
    p_old = np.array([min(old[int(q)], cpus.get(int(q), math.inf)) for q in uniq])[at]
    p_new = np.array([min(new, cpus.get(int(q), math.inf)) for q in uniq])[at]
    ratio = np.minimum(p_old, ch) / np.minimum(p_new, ch)
    new_own = s + (own - s) * ratio
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(own > 0, new_own / own, 1.0)
    d = ctx.delay
    d[hw] = np.rint(d[hw] * factor[row]).astype(np.int64)
    parallel = int(((~serial) & (own > 0)).sum())
    changed = (~serial) & (own > 0) & (ratio != 1)
    olds = "/".join(map(str, sorted(set(old.values()))))
    recs = "/".join(map(str, sorted(set(rec.values()))))
    said = (f"; OLD {given} given, the trace recorded {recs}"
            if given is not None and rec and set(rec.values()) != {given} else "")  # fmt: skip
    bound = ("/".join(map(str, sorted({cpus[p] for p in parts if p in cpus}))) + " CPUs"
             if any(p in cpus for p in parts)
             else "no CPU count recorded: no CPU bound")  # fmt: skip
    if any(new > cpus.get(p, math.inf) for p in parts):
        bound += "; more threads than CPUs: bounded at the CPUs"
    return (f"{c.text}: {parallel:,} parallel CPU ops, {int(changed.sum()):,} rescaled, "
            f"{olds} → {new} "
            f"intra-op threads ({bound}); own time of the ops {own.sum() / 1e6:.3f} → "
            f"{new_own.sum() / 1e6:.3f} ms; {int(serial.sum()):,} serial ops kept"
            + (f", {int(unknown.sum()):,} of them for want of shapes (record_shapes=True)"
               if unknown.any() else "")
            + (f", {int(device_op.sum()):,} of them launched device work" if device_op.any()
               else "") + said)  # fmt: skip


def _fixed_parts(names: np.ndarray, part: np.ndarray, own: np.ndarray,
                 serial: np.ndarray) -> np.ndarray:  # fmt: skip
    """Per op, f: the smallest own time of the serial ops of its name and part, else the
    median own time of its part's serial ops (module docstring); +inf without either."""
    df = pd.DataFrame({"name": names, "part": part, "own": own})
    ser = df[serial & (own > 0)]
    by_name = ser.groupby(["part", "name"])["own"].min()
    by_part = ser.groupby("part")["own"].median()
    f = by_name.reindex(pd.MultiIndex.from_arrays([part, names])).to_numpy(float)
    fallback = by_part.reindex(part).to_numpy(float)
    f = np.where(np.isnan(f), fallback, f)
    return np.where(np.isnan(f), np.inf, f)


def _all_chunks(kinds: list[Any], flops: np.ndarray, nbytes: np.ndarray, args: np.ndarray,
                device_op: np.ndarray) -> np.ndarray:  # fmt: skip
    """:func:`chunks` of every op; an op that launched device work is serial (its CPU time is
    dispatch), so only the others, with a cost rule, are looked at one by one."""
    seen: dict[tuple[bytes, bytes], int | None] = {}
    ch = np.ones(len(kinds))
    for i in np.flatnonzero(~device_op).tolist():
        k = kinds[i]
        if k is not None:
            big = k not in ("matmul", "conv", "attention")
            ch[i] = chunks(k, flops[i], nbytes[i], largest_tensor(args[i], seen) if big else None)
    return ch


def _launched_device_work(ctx: Context, ids: np.ndarray) -> np.ndarray:
    """Per op of ``ids``: whether a runtime call lies inside it on its thread (it launched
    device work: its CPU time is dispatch, not the op's work)."""
    n = ctx.graph.nodes
    runtime = ctx.names.frame(("runtime",))["id"].to_numpy(np.int64)
    out = np.zeros(len(ids), bool)
    if not len(runtime):
        return out
    calls = np.flatnonzero((n.kind == HOST_START) & member(n.event, runtime))
    if not len(calls):
        return out
    start = np.flatnonzero((n.kind == HOST_START) & member(n.event, ids))
    end = np.flatnonzero((n.kind == HOST_END) & member(n.event, ids))
    s_row = np.searchsorted(ids, n.event[start])
    e_row = np.searchsorted(ids, n.event[end])
    a = np.full(len(ids), -1, np.int64)
    b = np.full(len(ids), -1, np.int64)
    a[s_row], b[e_row] = start, end
    ok = (a >= 0) & (b >= 0)
    # one timeline's points are consecutive node numbers: a call between an op's start and
    # end points is inside it
    inside = np.searchsorted(calls, b[ok]) - np.searchsorted(calls, a[ok], "right")
    out[ok] = inside > 0
    return out

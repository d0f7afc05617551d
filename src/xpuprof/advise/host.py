"""Rules about the host's share of the critical path: blocked on the device, launching
kernels, framework CPU work, runtime calls, untraced time and input. Each fires only on the
platforms it names and above the noise floor; its saving is at most its time on the path and
at most the step time the device does not work (``docs/advise.md``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from xpuprof.advise.findings import Context, Finding, per_step
from xpuprof.analysis.common import number_ranges
from xpuprof.analysis.diagnosis import describe, fmt_ns
from xpuprof.analysis.input_pipeline import MODERATELY_INPUT_BOUND
from xpuprof.analysis.platform import GRAPH_LAUNCHES

if TYPE_CHECKING:
    import pandas as pd

#: Ops behind which PyTorch reads a device value into Python (``.item()``, ``bool(t)``,
#: ``.tolist()``).
SCALAR_READS = ("aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::tolist")
#: Ops behind which a tensor is copied (``.to()``, ``.cpu()``, ``.cuda()``, ``copy_``).
COPIES = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::cpu", "aten::contiguous")
#: Runtime calls that allocate or free device or pinned memory.
ALLOCATION = re.compile(r"Malloc|Free|HostAlloc|HostRegister|MemPool|MemAlloc|MemCreate", re.I)
#: Runtime calls that set a device or a context up (a one-time cost).
SETUP = re.compile(
    r"GetStreamPriorityRange|GetDeviceProperties|StreamCreate|EventCreate|SetDevice|"
    r"ModuleLoad|LibraryLoad|CtxCreate|PrimaryCtx|GetDeviceCount|^cu(?:da)?Init|FuncGetAttr|"
    r"GetDevice$|DeviceGetAttribute",
    re.IGNORECASE,
)


def bound(ctx: Context, ns: float, category: str | None = None) -> float:
    """The most removing ``ns`` of ``category``'s host time per step can save: the part of it
    during which no device worked (the device work that ran meanwhile still has to run, so
    that stretch cannot get shorter than it), and the step time the device does not work
    (the step cannot get shorter than the device's own work)."""
    if category is not None and ctx.platform.vendor != "cpu":
        ns = ns * ctx.device_idle(category)
    busy = _device_busy(ctx)
    return min(ns, max(ctx.step_ns - busy, 0.0)) if busy is not None else ns


def _device_busy(ctx: Context) -> float | None:
    ov = ctx.overview
    if ov is None or "summary" not in ov.tables or ctx.platform.vendor == "cpu":
        return None
    s = ov.tables["summary"]
    s = s[s["rank"].astype("Float64").fillna(-1) == (-1 if ctx.rank is None else ctx.rank)]
    if s.empty or "device_utilization" not in s:
        return None
    return float(s.device_utilization.iloc[0]) * ctx.step_ns


def _utilization(ctx: Context) -> str:
    busy = _device_busy(ctx)
    return "" if busy is None else f"; the device works {busy / ctx.step_ns:.0%} of {ctx.window}"


def _calls(n: int) -> str:
    return "1 such call" if n == 1 else f"{n:,} such calls"


def _steps(f: pd.Series, lead: str = "") -> str:
    """``steps 3-7`` (after ``lead``), or nothing for a stepless trace."""
    if not f.steps:
        return ""
    return f"{lead}step{'s' if len(f.steps) > 1 else ''} {number_ranges(f.steps)}"


# ----------------------------------------------------------------------------- host blocked


def host_sync(ctx: Context) -> list[Finding]:
    """Host blocked in a synchronising call while no device works: name the call, the op and
    annotation above it, the Python frame when the trace has stacks, and the change."""
    t = ctx.time("sync")
    top = ctx.top("sync", 3)
    if not ctx.above_floor(t) or top.empty:
        return []
    first = top.iloc[0]
    d = describe(ctx.trace, np.asarray(first.ids[:1], np.int64)).iloc[0]
    where = ", ".join(x for x in (
        f"op `{d.op}`" if d.op and d.op != d["name"] else "",
        f"under `{d.annotation}`" if d.annotation else "",
        f"module `{d.layer}`" if d.layer else "",
        f"at `{d.python}`" if d.python else "")
        if x)  # fmt: skip
    change = _sync_change(ctx, d)
    evidence = (
        f"`{first['name']}` blocks the host {per_step(first.per_step_ns, ctx)} on the "
        f"critical path while no device works; {_calls(first.events)}"
        f"{_steps(first, ', ')}{'; ' + where if where else ''}{_utilization(ctx)}"
    )
    return [ctx.finding(
        "host-blocked", "sync", change,
        f"the host waits for the device {per_step(t, ctx)} in {d.what}",
        evidence, bound(ctx, t, "sync"), t, ctx.ids("sync"))]  # fmt: skip


def _sync_change(ctx: Context, d: pd.Series) -> str:
    """The change for a blocking call, by what it is and what called it."""
    p = ctx.platform
    event = {"nvidia": "a CUDA event", "amd": "a HIP event (torch.cuda.Event on ROCm)"}.get(
        p.vendor, "an event")  # fmt: skip
    op = str(d.op or "")
    chain = " ".join(str(x) for x in (d.op, d["name"], d.python) if x)
    if op in SCALAR_READS or ".item(" in chain or "_local_scalar_dense" in chain:
        return (
            "Stop reading a device value into Python every step (`.item()`, `bool(tensor)`, "
            "`.tolist()`): keep the value on the device (accumulate losses as tensors), read "
            "it every N steps or after the loop, and avoid Python branches on tensor values"
        )
    if "device-to-host" in d.what and (op in COPIES or "copy" in d.what):
        pinned = ("copy into pinned memory without blocking: `x.to('cpu', non_blocking=True)` "
                  "into a buffer from `torch.empty(..., pin_memory=True)`, then wait on "
                  f"{event} only where the host uses the value")  # fmt: skip
        return f"Move the device-to-host read-back ({op or d['name']}) out of the step, or {pinned}"
    if "host-to-device" in d.what and "pageable" in d.what:
        return (
            "Pin the host memory (`DataLoader(pin_memory=True)` or `tensor.pin_memory()`) "
            "and copy with `non_blocking=True`: a copy from pageable memory blocks the host"
        )
    if "host-to-device" in d.what:
        return (
            "Copy with `non_blocking=True` and start the copy of the next batch early (on "
            "a side stream, while this step computes): the copy waits for the device"
        )
    if p.vendor in ("nvidia", "amd"):
        sync = "torch.cuda.synchronize()" + (" (hipDeviceSynchronize)" if p.vendor == "amd" else "")
        return (
            f"Remove the synchronize from the step ({sync}, `stream.synchronize()`, "
            f"`event.synchronize()`): wait on {event} right where the host needs the result"
        )
    return (
        "Remove the synchronize from the step: wait for the device only where the host "
        "needs the result"
    )


# ----------------------------------------------------------------------------- launches


def launch_overhead(ctx: Context) -> list[Finding]:
    """Kernel-launch overhead on the path while the device idles, on GPUs; never for work
    that already runs in CUDA/HIP graphs; a launch that alone takes most of it is a one-time
    cost (module loading), said as such."""
    t, idle = ctx.time("launch"), ctx.device_idle("launch")
    top = ctx.top("launch", 5)
    if not ctx.platform.gpu or not ctx.above_floor(t) or idle < 0.5 or top.empty:
        return []
    graphs = top[top.name.isin(GRAPH_LAUNCHES)].time_ns.sum()
    if graphs >= 0.5 * top.time_ns.sum():
        return []  # the work is in graphs already: nothing a graph could add
    calls = _launch_calls(ctx, list(top.name))
    if calls.empty:
        return []
    longest, median = int(calls.dur.max()), float(calls.dur.median())
    total = float(calls.dur.sum())
    if longest >= 0.5 * total and longest >= 100 * median:
        return [ctx.finding(
            "launch-first-use", "launch",
            "Profile steps after warm-up (torch.profiler's schedule(wait=…, warmup=…)): one "
            "launch call pays a one-time cost (kernel code loading, lazy module init) that no "
            "later step pays",
            f"one `{calls.name.iloc[calls.dur.argmax()]}` takes {fmt_ns(longest)}, "
            f"{longest / total:.0%} of all launch time",
            f"the median launch call takes {fmt_ns(median)}; launches take {per_step(t, ctx)} "
            f"on the critical path, {idle:.0%} of it with the device idle",
            bound(ctx, min(t, longest / max(len(ctx.steps), 1))), t,
            [int(calls.id.iloc[calls.dur.argmax()])])]  # fmt: skip
    kern = _kernel_median(ctx)
    graph_api = ("CUDA graphs: torch.compile(mode='reduce-overhead') or torch.cuda.CUDAGraph"
                 if ctx.platform.vendor == "nvidia" else "HIP graphs: torch.compile("
                 "mode='reduce-overhead') or torch.cuda.CUDAGraph, which capture HIP graphs on "
                 "ROCm")  # fmt: skip
    return [ctx.finding(
        "launch-overhead", "launch",
        f"Launch the step's kernels as one graph ({graph_api}) and fuse small kernels "
        "(torch.compile): the device idles while the host launches them one by one",
        f"kernel launches take {per_step(t, ctx)} on the critical path, with the device idle "
        f"{idle:.0%} of that time",
        f"{len(calls):,} launch calls{' in the selected steps' if ctx.steps else ''}, median "
        f"{fmt_ns(median)}; kernels "
        f"run a median {fmt_ns(kern)}{_utilization(ctx)}",
        bound(ctx, t, "launch"), t, ctx.ids("launch"))]  # fmt: skip


def _launch_calls(ctx: Context, names: list[str]) -> pd.DataFrame:
    lst = ", ".join("'" + n.replace("'", "''") + "'" for n in names)
    return ctx.trace.sql(f"select id, name, dur from events where {ctx.where(device=False)} and "
                         f"level = 'runtime' and name in ({lst})")  # fmt: skip


def _kernel_median(ctx: Context) -> float:
    m = ctx.trace.sql(f"select median(dur) as m from events where {ctx.where()} and "
                      "level = 'kernel'").m.iloc[0]  # fmt: skip
    return float(m) if m == m and m is not None else 0.0


# ----------------------------------------------------------------------------- CPU work


def framework_cpu(ctx: Context) -> list[Finding]:
    """Framework ops' CPU time on the path (not on CPU runs, where the ops are the
    computation). One op call that alone is most of it is named as such: per-op overhead
    advice does not apply to one slow call (an allocation growing the pool, a first call)."""
    t = ctx.time("cpu")
    saved = bound(ctx, t, "cpu")
    top = ctx.top("cpu", 3)
    if ctx.platform.vendor == "cpu" or not ctx.above_floor(saved) or top.empty:
        return []
    one = top.sort_values("top_event_ns").iloc[-1]
    if one.top_event_ns >= 0.5 * t * max(len(ctx.steps), 1):
        return [_one_slow_op(ctx, one, t)]
    names = ", ".join(f"`{n}` {fmt_ns(v)}" for n, v in zip(top.name, top.per_step_ns,
                                                            strict=True))  # fmt: skip
    how = "fuse ops and cut per-op dispatch with torch.compile"
    if ctx.platform.gpu:
        how += " (mode='reduce-overhead' also replays the launches as a graph)"
    optimizer = _optimizer(ctx)
    if optimizer == "loop":
        how += ("; use foreach or fused optimizers (`torch.optim.SGD(..., foreach=True)`, "
                "`fused=True`) instead of per-parameter loops")  # fmt: skip
    elif optimizer == "foreach" and ctx.platform.gpu:
        how += ("; the optimizer already runs foreach ops: `fused=True` (Adam, AdamW, SGD) "
                "makes its update one kernel per parameter group")  # fmt: skip
    how += "; or give each op more work (larger batches)"
    return [ctx.finding(
        "host-cpu-bound", "cpu", "Cut the framework's CPU time: " + how,
        f"the host's framework work takes {per_step(t, ctx)} on the critical path; the device "
        f"idles {ctx.device_idle('cpu'):.0%} of that time",
        f"most CPU time{ctx.each} in {names}{_utilization(ctx)}",
        saved, t, ctx.ids("cpu"))]  # fmt: skip


def _optimizer(ctx: Context) -> str:
    """How the judged steps update parameters: ``fused`` (``aten::_fused_*`` ops), ``foreach``
    (``aten::_foreach_*``), ``loop`` (an optimizer runs — torch's ``Optimizer.step#…`` spans,
    TorchRec's ``## optimizer ##`` — with neither), or ``none`` (no optimizer: an inference
    trace). Optimizer advice is only about the first three, and never the one in use."""
    c = ctx.trace.sql(
        "select count(*) filter (where starts_with(name, 'aten::_fused_')) as fused, "
        "count(*) filter (where starts_with(name, 'aten::_foreach_')) as foreach, "
        "count(*) filter (where starts_with(name, 'Optimizer.') or "
        "contains(lower(name), 'optimizer')) as optimizer "
        f"from events where {ctx.where(device=False)} and device < 0"
    ).iloc[0]
    if c.fused:
        return "fused"
    if c.foreach:
        return "foreach"
    return "loop" if c.optimizer else "none"


def _one_slow_op(ctx: Context, one: pd.Series, t: float) -> Finding:
    d = describe(ctx.trace, np.asarray([int(one.top_event)], np.int64)).iloc[0]
    name = str(one["name"])
    n = max(len(ctx.steps), 1)
    if name in ("aten::empty", "aten::empty_strided", "aten::zeros", "aten::ones",
                "aten::empty_like"):  # fmt: skip
        how = (
            "Allocate before the profiled steps (warm up, or reuse buffers): one "
            f"allocation by `{name}` waits on the device allocator growing its pool"
        )
    else:
        how = (
            f"Look at what this one `{name}` call does on the host (torch.profiler with "
            "with_stack=True): it is a single slow call, not per-op overhead"
        )
    where = f" (`{d.op}`)" if d.op and d.op != name else ""
    return ctx.finding(
        "slow-host-op", "cpu", how,
        f"one `{name}`{where} call takes {fmt_ns(one.top_event_ns)} of host time on the "
        "critical path", f"all framework work on the path: {per_step(t, ctx)}"
        f"{_utilization(ctx)}", bound(ctx, min(t, one.top_event_ns / n), "cpu"), t,
        [int(one.top_event)])  # fmt: skip


def runtime_calls(ctx: Context) -> list[Finding]:
    """Allocation or setup calls of the device runtime on the path."""
    t = ctx.time("runtime")
    top = ctx.top("runtime", 5)
    if not ctx.above_floor(t) or top.empty:
        return []
    alloc = top[top.name.str.contains(ALLOCATION)]
    setup = top[top.name.str.contains(SETUP)]
    listed = lambda df: ", ".join(f"`{n}` {fmt_ns(v)}" for n, v in  # noqa: E731
                                  zip(df.name, df.per_step_ns, strict=True))  # fmt: skip
    out = []
    if setup.time_ns.sum() >= 0.5 * top.time_ns.sum():
        out.append(ctx.finding(
            "setup-in-profile", "runtime",
            "Profile steady-state steps (torch.profiler's schedule(wait=…, warmup=…)): the "
            "profiled steps include one-time device setup (context creation, stream creation, "
            "device queries) that later steps do not pay",
            f"device setup calls take {per_step(setup.per_step_ns.sum(), ctx)} on the critical "
            "path", f"the calls{ctx.each}: {listed(setup)}",
            bound(ctx, setup.per_step_ns.sum(), "runtime"), setup.per_step_ns.sum(),
            [i for ids in setup.ids for i in ids][:20]))  # fmt: skip
    elif alloc.time_ns.sum() >= 0.5 * top.time_ns.sum():
        tip = ("`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`" if ctx.platform.vendor ==
               "nvidia" else "`PYTORCH_HIP_ALLOC_CONF=expandable_segments:True`" if
               ctx.platform.vendor == "amd" else "static shapes")  # fmt: skip
        out.append(ctx.finding(
            "allocator", "runtime",
            "Keep the allocator from calling the device runtime again and again: no "
            "`torch.cuda.empty_cache()` in the loop, static shapes (pad variable lengths), "
            f"less fragmentation ({tip}); or warm up before profiling",
            f"memory allocation calls take {per_step(alloc.per_step_ns.sum(), ctx)} on the "
            "critical path", f"the calls{ctx.each}: {listed(alloc)}",
            bound(ctx, alloc.per_step_ns.sum(), "runtime"), alloc.per_step_ns.sum(),
            [i for ids in alloc.ids for i in ids][:20]))  # fmt: skip
    return out


def outside_ops(ctx: Context) -> list[Finding]:
    """Host time between framework ops on the path: Python and dispatch on a CPU run;
    untraced host code on a device run, when the device idles through it."""
    t, idle = ctx.time("outside_ops"), ctx.device_idle("outside_ops")
    if not ctx.above_floor(t) or host_timeline(ctx):
        # a step/layer capture: its time outside layer spans is the loss, the backward pass
        # and the optimizer as much as Python; nothing at that level tells them apart
        return []
    if ctx.platform.vendor == "cpu":
        return [ctx.finding(
            "python-overhead", "outside_ops",
            "Cut the Python and dispatch time between ops: torch.compile the model (fuses ops "
            "and removes per-op dispatch), or do more work per op (larger batches)",
            f"{per_step(t, ctx)} on the critical path runs no framework op",
            "host time outside aten ops on the critical path (Python code, optimizer loop, "
            "dispatch)", bound(ctx, t), t)]  # fmt: skip
    if not ctx.above_floor(bound(ctx, t, "outside_ops")) or idle < 0.5:
        return []
    return [ctx.finding(
        "host-untraced", "outside_ops",
        "Find what the host runs between framework ops (Python, a data handoff, a sleep): "
        "profile with torch.profiler(with_stack=True) or py-spy to see the frames; the "
        "device waits for it",
        f"the host runs no recorded op {per_step(t, ctx)} on the critical path, with the "
        f"device idle {idle:.0%} of that time",
        "time between top-level ops on the critical path, no other thread busy"
        f"{_utilization(ctx)}", bound(ctx, t, "outside_ops"), t)]  # fmt: skip


# ----------------------------------------------------------------------------- input


def host_timeline(ctx: Context) -> bool:
    """Whether the judged path is the host timeline of a capture without framework ops
    (level ``step`` or ``layer``: ``analysis.path_time``'s ``host`` path)."""
    return ctx.diagnosis.facts.get("path") == "host"


def input_bound(ctx: Context) -> list[Finding]:
    """The path waits for input: the change depends on who loads it."""
    t = ctx.time("input")
    top = ctx.top("input", 3)
    e = ctx.events[ctx.events.category == "input"]
    # input charged to no event: host time with no span between steps (``between-ops``).
    # Inferred, it holds the loop's own glue too, so it must make the step at least
    # moderately input-bound (XProf's 5 %, what the input tool calls input-bound)
    between = float(e.per_step_ns[e.name == "(no event)"].sum())
    if between >= 0.5 * t:
        moderate = t >= MODERATELY_INPUT_BOUND * ctx.step_ns
        return [_between_steps(ctx, t, between)] if ctx.above_floor(t) and moderate else []
    if not ctx.above_floor(t) or top.empty:
        return []
    name = str(top.name.iloc[0])
    if "_SingleProcessDataLoaderIter" in name:
        change = (
            "Load batches in worker processes: `DataLoader(num_workers=N, "
            "pin_memory=True, persistent_workers=True, prefetch_factor=2)`: with "
            "num_workers=0 the training process loads every batch itself"
        )
    elif "DataLoader" in name:
        change = (
            "The DataLoader workers do not keep up: more `num_workers`, cheaper "
            "per-sample transforms (or move them to the device), faster storage, "
            "a larger `prefetch_factor`"
        )
    elif name.startswith("##"):
        change = (
            "Overlap the input stage with the previous batch's compute: TorchRec's "
            "TrainPipelineSparseDist runs copy_batch_to_gpu and the sparse input "
            "distribution one batch ahead; check that the pipeline is not falling back "
            "to a synchronous one"
        )
    elif name.startswith("IteratorGetNext"):
        change = (
            "Prefetch and parallelise the tf.data pipeline (`.prefetch(AUTOTUNE)`, "
            "`num_parallel_calls=AUTOTUNE`, `.cache()`)"
        )
    else:
        change = (
            "Load the next batch while this one computes (a background thread or "
            "process, prefetching), so the step never waits for it"
        )
    return [ctx.finding(
        "input-bound", "input", change,
        f"{'the step' if ctx.steps else 'the host'} waits for input {per_step(t, ctx)} on the "
        "critical path",
        f"`{name}` {fmt_ns(top.per_step_ns.iloc[0])}{ctx.each}{_steps(top.iloc[0], ', ')}"
        f"{_utilization(ctx)}", bound(ctx, t, "input"), t, ctx.ids("input"))]  # fmt: skip


def _between_steps(ctx: Context, t: float, between: float) -> Finding:
    """Input found as host time with no recorded span between steps (a capture without
    framework ops): the loop's own batch fetch, whatever loads it."""
    ids = ctx.trace.sql(
        f"select id from events where {ctx.where(device=False)} and level = 'step' and "
        "device < 0 order by ts limit 20"
    ).id.tolist()
    pin = "pin_memory=True, " if ctx.platform.gpu else ""
    return ctx.finding(
        "input-bound", "input",
        "Fetch the next batch while the step computes: the loop's own batch fetch between "
        "steps (`next(loader)`: reading, transforms, collate) is what each step waits for. "
        f"Load in worker processes (`DataLoader(num_workers=N, {pin}persistent_workers=True, "
        "prefetch_factor=2)`), or prefetch in a background thread. To see what the fetch "
        "does, capture at level='op' or with torch.profiler (the DataLoader's "
        "`enumerate(DataLoader)#…` span then names the iterator)",
        f"{'the step' if ctx.steps else 'the host'} waits for input {per_step(t, ctx)} on the "
        "critical path, in the loop's batch fetch",
        "no framework ops recorded (capture level step or layer), so the loader leaves no "
        f"span: host time with none between step spans or before a step's first layer span, "
        f"{fmt_ns(between)}{ctx.each}{_utilization(ctx)}", bound(ctx, t, "input"), t,
        [int(i) for i in ids])  # fmt: skip


HOST_RULES = (host_sync, launch_overhead, framework_cpu, runtime_calls, outside_ops, input_bound)

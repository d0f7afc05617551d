"""Rules about the device's share of the critical path: the device is the bottleneck (the host
runs ahead of it), the device idles with nothing on the host linked to it (XPlane), and GEMMs
that leave the matrix units idle. ``docs/advise.md`` gives the evidence and bounds."""

from __future__ import annotations

import math

from xpuprof.advise.findings import Context, Finding, per_step
from xpuprof.analysis.diagnosis import fmt_ns, short_name


def device_bound(ctx: Context) -> list[Finding]:
    """Device work is the largest part of the critical path: the host is ahead (kernels start
    well after their launch), so host-side changes cannot help; point at the top kernels and
    the roofline. No saving is claimed: how much faster a kernel can run is the roofline's
    and the simulator's question."""
    t = ctx.time("compute")
    s = ctx.summary[ctx.summary.category != "device_gap"]
    if s.empty or s.category.iloc[0] != "compute" or not ctx.above_floor(t):
        return []
    top = ctx.top("compute", 5)
    if top.empty:
        top = _top_kernels(ctx)
    by_short = top.assign(short=[short_name(str(n)) for n in top.name]).groupby(
        "short", sort=False).per_step_ns.sum()  # fmt: skip
    names = ", ".join(f"`{n}` {fmt_ns(v)}" for n, v in by_short.items())
    delay = _launch_delay(ctx)
    ahead = (f"; kernels start a median {fmt_ns(delay)} after their launch: the host is ahead "
             "of the device, so host-side changes (graphs, fewer syncs) cannot help"
             if delay is not None else "")  # fmt: skip
    p = ctx.platform
    if p.vendor == "tpu":
        how = (
            "Speed up the top XLA ops: check each against its roof (`xpuprof roofline`); "
            "memory-bound fusions gain from larger batches per chip or layout changes, "
            "compute-bound ones from bf16 inputs"
        )
    elif p.gpu:
        how = (
            "Speed up the top kernels: check each against its roof (`xpuprof roofline`); "
            "memory-bound kernels gain from fusion (torch.compile), compute-bound ones from "
            "lower precision on the matrix units (bf16/fp16 autocast, fp8)"
        )
    else:
        how = "Speed up the top device kernels: check each against its roof (`xpuprof roofline`)"
    return [ctx.finding(
        "device-bound", "compute", how,
        f"the device's own compute takes {per_step(t, ctx)} on the critical path",
        f"top kernels{ctx.each} on the path: {names}{ahead}",
        math.nan, t, ctx.ids("compute"))]  # fmt: skip


def _top_kernels(ctx: Context):
    """The top compute kernels of the part by time per step and per device (a part may hold
    several devices: an XPlane host with its chips)."""
    from xpuprof.analysis.common import work_class

    steps = f"and step in ({', '.join(map(str, ctx.steps))})" if ctx.steps else ""
    n = max(len(ctx.steps), 1)
    k = ctx.trace.sql(
        f"select level, name, sum(dur) / {n} / count(distinct device) as per_step_ns from "
        f"events where part = {ctx.part} and level = 'kernel' {steps} group by level, name"
    )
    k = k[work_class(k.level, k.name) == "compute"]
    return k.sort_values("per_step_ns", ascending=False).head(3)


def _launch_delay(ctx: Context) -> float | None:
    """Median time from a kernel's launch call to its start (None: no launches linked)."""
    steps = f"and k.step in ({', '.join(map(str, ctx.steps))})" if ctx.steps else ""
    m = ctx.trace.sql(
        "select median(k.ts - r.ts) as m from events k join events r on r.part = k.part and "
        "r.correlation = k.correlation and r.level = 'runtime' where k.part = "
        f"{ctx.part} and k.level = 'kernel' {steps}"
    ).m.iloc[0]
    return None if m is None or m != m else float(m)


def device_idle(ctx: Context) -> list[Finding]:
    """The device idles and no host work is linked to it (XPlane: XLA programs): the host does
    not dispatch the next program in time."""
    t = ctx.time("device_idle")
    if not ctx.above_floor(t):
        return []
    if ctx.platform.vendor == "tpu" or ctx.platform.framework == "xla":
        how = (
            "Keep the TPU fed: dispatch the next step before reading this one's results "
            "(no `np.asarray`, `jax.device_get` or `.block_until_ready()` inside the loop), "
            "prefetch input to the device, and put more work in each jitted call"
        )
    else:
        how = (
            "Find what the host does while the device idles: the trace links no host work "
            "to the device, so look at the host timeline around the gaps"
        )
    return [ctx.finding(
        "device-idle", "device_idle", how,
        f"the device idles {per_step(t, ctx)} with no host work linked to the gaps",
        "device timeline only (no launches or correlation ids link host calls to device "
        "work)", t, t)]  # fmt: skip


def fp32_gemms(ctx: Context) -> list[Finding]:
    """GEMM-like kernels that do not use the matrix units, on a GPU whose matrix units are
    faster: what they would take at the 16-bit matrix roof, bounded by the compute time on
    the critical path."""
    from xpuprof.analysis.stats import stats
    from xpuprof.hardware.specs import match

    if not ctx.platform.gpu:
        return []
    try:
        ks = stats(ctx.trace, ranks=ctx.ranks, steps=ctx.selection, ops=False, kernels=True,
                   layers=False).tables.get("kernels")  # fmt: skip
    except Exception:  # noqa: BLE001 - a refinement: no kernel statistics, no finding
        return []
    if ks is None or len(ks) == 0 or "tensor_core" not in ks:
        return []
    if "rank" in ks and ctx.rank is not None:
        ks = ks[ks["rank"].astype("Float64") == ctx.rank]
    gemm = ks[ks.name.str.contains(r"gemm|sgemm|matmul|cutlass|cublas|Cijk_", case=False)
              & ~ks.tensor_core.astype(bool)]  # fmt: skip
    total = float(ks.total_ns.sum())
    props = ctx.trace.meta.get("device_properties", {}).get(ctx.part) or []
    spec = next((s for s in (match(p.get("name"), p) for p in props if isinstance(p, dict))
                 if s is not None), None)  # fmt: skip
    if gemm.empty or total <= 0 or spec is None:
        return []
    fp32, _ = spec.peak("fp32", matrix=False)
    half, key = spec.peak("bf16", matrix=True)  # bf16 where it exists, else fp16
    if key not in ("bf16", "fp16") or not fp32 or not half or half <= fp32:
        return []
    t = float(gemm.total_ns.sum())
    saved = t * (1 - fp32 / half) / max(len(ctx.steps), 1)  # all at the new roof, at most
    saved = min(saved, ctx.time("compute"))  # and never more than compute on the path
    if not ctx.above_floor(saved):
        return []
    top = ", ".join(short_name(n)[:60] for n in
                    gemm.sort_values("total_ns", ascending=False).name.head(3))  # fmt: skip
    dev = "cuda"
    if key == "bf16":
        how = ("Run GEMMs in bf16 on the matrix units: torch.autocast(device_type="
               f"'{dev}', dtype=torch.bfloat16)")  # fmt: skip
    else:  # no bf16 matrix units (V100, T4): fp16 needs loss scaling
        how = ("Run GEMMs in fp16 on tensor cores: torch.autocast(device_type="
               f"'{dev}', dtype=torch.float16) with torch.amp.GradScaler")  # fmt: skip
    if "tf32" in spec.flops:  # only parts with TF32 tensor cores (Ampere and later)
        how += " (or allow TF32: torch.backends.cuda.matmul.allow_tf32 = True)"
    return [ctx.finding(
        "fp32-gemm", "compute", how,
        f"{t / total:.0%} of kernel time is GEMMs without tensor cores on {spec.name}",
        f"{t / 1e6:.2f} ms of such GEMMs ({top}); {spec.name}: fp32 {fp32 / 1e12:.1f} vs "
        f"{key} matrix {half / 1e12:.0f} TFLOP/s", saved, ctx.time("compute"))]  # fmt: skip


def memory_copies(ctx: Context) -> list[Finding]:
    """Copies (memcpy, DMA, XLA's async copies) on the critical path: the step waits for data
    to move between host and device (or between buffers)."""
    t = ctx.time("memcpy")
    if not ctx.above_floor(t):
        return []
    top = ctx.top("memcpy", 3)
    if top.empty:
        top = _top_copies(ctx)
    names = ", ".join(f"`{n}` {fmt_ns(v)}" for n, v in zip(top.name, top.per_step_ns,
                                                            strict=True))  # fmt: skip
    p = ctx.platform
    if p.vendor == "tpu" or p.framework == "xla":
        how = (
            "Keep data on the device across calls (donate buffers, no host round trips "
            "between jitted calls), and overlap transfers with compute (prefetch the next "
            "input while this step runs)"
        )
    elif p.gpu:
        how = (
            "Keep tensors on the device between steps; copy what must move from pinned "
            "memory with `non_blocking=True` on a side stream, overlapped with compute"
        )
    else:
        how = (
            "Keep data on the device between steps and overlap the transfers (DMA) that "
            "remain with compute"
        )
    return [ctx.finding(
        "memory-copies", "memcpy", how,
        f"copies take {per_step(t, ctx)} on the critical path",
        f"most in {names or 'copies'}", t, t, ctx.ids("memcpy"))]  # fmt: skip


def _top_copies(ctx: Context):
    from xpuprof.analysis.common import work_class

    steps = f"and step in ({', '.join(map(str, ctx.steps))})" if ctx.steps else ""
    n = max(len(ctx.steps), 1)
    k = ctx.trace.sql(
        f"select level, name, sum(dur) / {n} / count(distinct device) as per_step_ns from "
        f"events where part = {ctx.part} and level in ('kernel', 'memcpy') {steps} "
        "group by level, name"
    )
    k = k[work_class(k.level, k.name) == "memcpy"]
    return k.sort_values("per_step_ns", ascending=False).head(3)


DEVICE_RULES = (device_bound, device_idle, memory_copies, fp32_gemms)

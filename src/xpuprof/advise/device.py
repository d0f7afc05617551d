"""Rules about the device's share of the critical path: the device is the bottleneck (the host
runs ahead of it), the device idles with nothing on the host linked to it (XPlane), and GEMMs
that leave the matrix units idle. ``docs/advise.md`` gives the evidence and bounds."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd

from xpuprof.advise.findings import Context, Finding, per_step
from xpuprof.analysis.diagnosis import fmt_ns
from xpuprof.core.text import short_name


def device_bound(ctx: Context) -> list[Finding]:
    """Device work is the largest part of the critical path: the host is ahead (kernels start
    well after their launch), so host-side changes cannot help; point at the top kernels and
    the roofline. No saving is claimed: how much faster a kernel can run is the roofline's
    and the simulator's question."""
    t = ctx.time("compute")
    s = ctx.summary[ctx.summary.category != "device_gap"]
    if s.empty or s.category.iloc[0] != "compute" or not ctx.above_floor(t):
        return []
    top = ctx.top_names("compute", 5)
    top = top[top.per_step_ns >= 0.01 * t]  # names below 1 % of it say nothing
    names = ", ".join(f"`{n}` {fmt_ns(v)}" for n, v in zip(top.name, top.per_step_ns,
                                                            strict=True))  # fmt: skip
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
        f"the device's own compute takes {per_step(t, ctx)} {ctx.on_path}",
        f"top kernels{ctx.each} on the path: {names or 'not named'}{ahead}",
        math.nan, t, ctx.ids("compute"))]  # fmt: skip


def _launch_delay(ctx: Context) -> float | None:
    """Median time from a kernel's launch call to its start (None: no launches linked)."""
    m = ctx.trace.sql(
        "select median(k.ts - r.ts) as m from events k join events r on r.part = k.part and "
        "r.correlation = k.correlation and r.level = 'runtime' where "
        f"{ctx.where('k')} and k.level = 'kernel'"
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
        f"the device idles {per_step(t, ctx)} {ctx.on_path}, with no host work linked to "
        "the gaps",
        "device timeline only (no launches or correlation ids link host calls to device "
        "work)", t, t)]  # fmt: skip


def fp32_gemms(ctx: Context) -> list[Finding]:
    """GEMM-like kernels that do not use the matrix units, on a GPU whose matrix units are
    faster: what they would take at the 16-bit matrix roof, bounded by the compute time on
    the critical path."""
    from xpuprof.hardware.specs import match

    if not ctx.platform.gpu:
        return []
    props = ctx.trace.meta.get("device_properties", {}).get(ctx.part) or []
    spec = next((s for s in (match(p.get("name"), p) for p in props if isinstance(p, dict))
                 if s is not None), None)  # fmt: skip
    if spec is None:
        return []
    try:
        got = _gemm_kernels(ctx)
    except Exception:  # noqa: BLE001 - a refinement: no kernel statistics, no finding
        return []
    if got is None:
        return []
    gemm, total = got
    if gemm.empty or total <= 0:
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
        f"{fmt_ns(t / max(len(ctx.steps), 1))}{ctx.each} of such GEMMs ({top}); "
        f"{spec.name}: fp32 {fp32 / 1e12:.1f} vs "
        f"{key} matrix {half / 1e12:.0f} TFLOP/s", saved, ctx.time("compute"))]  # fmt: skip


#: Kernel names that are GEMM-like (the stats tool's ``tensor_core`` rule tells which of them
#: use the matrix units).
_GEMM = r"gemm|sgemm|matmul|cutlass|cublas|Cijk_"
#: A kernel's launch configuration, as the stats tool's kernel table groups kernels by it.
_LAUNCH = {
    "grid": "args->>'$.grid'",
    "block": "args->>'$.block'",
    "registers_per_thread": "try_cast(args->>'$.\"registers per thread\"' as bigint)",
    "shared_memory": "try_cast(args->>'$.\"shared memory\"' as bigint)",
}


def _gemm_kernels(ctx: Context) -> tuple[pd.DataFrame, float] | None:
    """The GEMM-like kernels without tensor cores as the stats tool's kernel table has them
    (``name``, ``total_ns``: one row per name and launch configuration, longest first) and
    the selected kernels' total time; None without kernels. Launch details (JSON args, the
    costly part) are read for those kernels' names only."""
    from xpuprof.analysis.common import where_clause
    from xpuprof.analysis.stats import uses_tensor_cores

    w = f"{where_clause(ctx.ranks, ctx.selection, ('kernel', 'collective'))} and dur is not null"
    by_name = ctx.trace.sql(f"select name, sum(dur)::bigint as t from events where {w} "
                            "group by name")  # fmt: skip
    if by_name.empty:
        return None
    names = by_name["name"].astype(object)
    tc = names.map(lambda n: isinstance(n, str) and uses_tensor_cores(n)).astype(bool)
    want = names[names.str.contains(_GEMM, case=False).fillna(False).astype(bool) & ~tc]
    total = float(by_name["t"].sum())
    if want.empty:
        return pd.DataFrame({"name": [], "total_ns": []}), total
    listed = ", ".join("'" + str(n).replace("'", "''") + "'" for n in want)
    cols = ", ".join(f"{v} as {k}" for k, v in _LAUNCH.items())
    df = ctx.trace.sql(f"select name, dur, {cols} from events where {w} and name in ({listed})")
    df["name"] = df["name"].astype(object)
    out = df.groupby(["name", *_LAUNCH], dropna=False, sort=False).agg(total_ns=("dur", "sum"))
    out = out.reset_index().sort_values("total_ns", ascending=False, kind="stable")
    return out.reset_index(drop=True), total


def memory_copies(ctx: Context) -> list[Finding]:
    """Copies (memcpy, DMA, XLA's async copies) on the critical path: the step waits for data
    to move between host and device (or between buffers). On XLA the copies' shapes say
    where the data moves: memory space ``S(5)`` is host memory (host offloading)."""
    t = ctx.time("memcpy")
    if not ctx.above_floor(t):
        return []
    top = ctx.top_names("memcpy", 3)
    top = top[top.per_step_ns >= 0.01 * t]
    names = ", ".join(f"`{n}` {fmt_ns(v)}" for n, v in zip(top.name, top.per_step_ns,
                                                            strict=True))  # fmt: skip
    p = ctx.platform
    moved = _xla_transfers(ctx) if p.framework == "xla" else None
    compute = ctx.time("compute")
    if moved is not None and moved.host_bytes > 0:
        how = (
            "Move fewer bytes between host memory and the device: keep the arrays that fit "
            "in device memory there (no host offloading of them: memory kind 'device', not "
            "'pinned_host'), offload only what does not fit, and offload it in a narrower "
            "dtype (bf16 rather than f32); overlapping the transfers with compute can hide "
            f"at most the compute, {per_step(compute, ctx)}"
        )
    elif p.vendor == "tpu" or p.framework == "xla":
        how = (
            "Keep data on the device across calls (donate buffers, no host round trips "
            "between jitted calls), and overlap transfers with compute (prefetch the next "
            "input while this step runs)"
        )
    elif p.gpu:
        how = _gpu_copy_change(" ".join(str(n) for n in top.name))
    else:
        how = (
            "Overlap the transfers (DMA) with compute: start the next transfer while the "
            "device computes; keep data the device reuses on the device"
        )
    evidence = f"most in {names or 'copies'}"
    if moved is not None and moved.host_bytes > 0:
        evidence += f"; {moved.words(ctx)}"
    return [ctx.finding(
        "memory-copies", "memcpy", how,
        f"copies take {per_step(t, ctx)} {ctx.on_path}",
        evidence, t, t, ctx.ids("memcpy"))]  # fmt: skip


def _gpu_copy_change(names: str) -> str:
    """The change for copies on a GPU's critical path, by what they copy (Kineto names the
    direction and the host memory: ``Memcpy HtoD (Pageable -> Device)``)."""
    if re.search(r"Pageable", names):
        return (
            "Copy from pinned memory (`DataLoader(pin_memory=True)`, `tensor.pin_memory()`) "
            "with `non_blocking=True`: a copy from pageable memory is staged by the driver and "
            "cannot overlap compute; then start the next batch's copy on a side stream while "
            "this step computes"
        )
    if re.search(r"DtoH|Device -> (Pinned|Host)", names):
        return (
            "Read results back less often or later: keep them on the device across steps and "
            "copy them to pinned memory with `non_blocking=True` on a side stream"
        )
    return (
        "Overlap the copies with compute: issue them with `non_blocking=True` from pinned "
        "memory on a side stream, one step ahead (prefetch the next batch while this one "
        "computes); copy device-to-device data less (fuse, avoid `.contiguous()` copies)"
    )


#: Bytes per element of XLA's primitive types (``xla_data.proto``).
_XLA_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4,
              "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8,
              "c128": 16, "f8e5m2": 1, "f8e4m3fn": 1, "f8e4m3b11fnuz": 1, "f8e5m2fnuz": 1,
              "f8e4m3fnuz": 1}  # fmt: skip
#: One array shape in an HLO layout string: ``f32[5,1024]{1,0:T(8,128)S(5)}``.
_XLA_ARRAY = re.compile(r"(\w+)\[([\d,]*)\](?:\{([^}]*)\})?")
#: XLA's memory space of host memory (``Layout::kHostMemorySpace``): ``S(5)`` in a layout.
HOST_MEMORY_SPACE = 5


@dataclass(frozen=True)
class Transfers:
    """XLA async copies of the judged steps, per step: bytes into and out of host memory,
    and how many copies moved them."""

    to_host: float
    from_host: float
    copies_to_host: float
    copies_from_host: float

    @property
    def host_bytes(self) -> float:
        return self.to_host + self.from_host

    def words(self, ctx: Context) -> str:
        n = f"{self.copies_from_host:.3g} in, {self.copies_to_host:.3g} out"
        rate = self.host_bytes / (ctx.step_ns * 1e-9) if ctx.step_ns else 0.0
        return (f"the copies move {_bytes(self.host_bytes)}{ctx.each} between host memory "
                f"(XLA memory space S({HOST_MEMORY_SPACE})) and the device ({n}), "
                f"{rate / 1e9:.3g} GB/s over the {'step' if ctx.steps else 'trace'}")  # fmt: skip


def _xla_transfers(ctx: Context) -> Transfers | None:
    """What XLA's ``copy-start`` ops of the judged steps move, from their shapes: the output
    is (destination, source, context), each array with its layout's memory space."""
    df = ctx.trace.sql(
        "select json_extract_string(args, '$.shape_with_layout') as shape, count(*) as n "
        f"from events where {ctx.where()} and level = 'kernel' and "
        r"regexp_matches(name, '^copy-start(\.\d+)?$') group by 1"
    )
    if df.empty:
        return None
    out = {"to": 0.0, "from": 0.0, "n_to": 0.0, "n_from": 0.0}
    n_steps = max(len(ctx.steps), 1)
    for shape, n in zip(df["shape"], df["n"], strict=True):
        arrays = _XLA_ARRAY.findall(str(shape or ""))
        if len(arrays) < 2:
            continue
        dst, src = arrays[0], arrays[1]
        size = _array_bytes(dst)
        if size is None:
            continue
        if _space(dst) == HOST_MEMORY_SPACE and _space(src) != HOST_MEMORY_SPACE:
            out["to"] += size * n / n_steps
            out["n_to"] += n / n_steps
        elif _space(src) == HOST_MEMORY_SPACE and _space(dst) != HOST_MEMORY_SPACE:
            out["from"] += size * n / n_steps
            out["n_from"] += n / n_steps
    return Transfers(out["to"], out["from"], out["n_to"], out["n_from"])


def _array_bytes(array: tuple[str, str, str]) -> float | None:
    dtype, dims, _ = array
    per = _XLA_BYTES.get(dtype.lower())
    if per is None:
        return None
    return per * math.prod(int(d) for d in dims.split(",") if d)


def _space(array: tuple[str, str, str]) -> int:
    m = re.search(r"S\((\d+)\)", array[2] or "")
    return int(m.group(1)) if m else 0


def _bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


DEVICE_RULES = (device_bound, device_idle, memory_copies, fp32_gemms)

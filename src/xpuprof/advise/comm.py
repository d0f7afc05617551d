"""Rules about communication on the critical path: waiting for a late rank (name it, and what
made it late) versus moving bytes (bus bandwidth against the device's link). Library names
follow the platform: NCCL on NVIDIA, RCCL on AMD, XLA collectives on TPU, gloo on CPUs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.advise.findings import Context, Finding, per_step
from xpuprof.analysis.comm import collective_waits
from xpuprof.analysis.comm.clocks import clock_offsets
from xpuprof.analysis.diagnosis import DESCRIPTION, fmt_ns

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: Bus bandwidth at or above this share of the link's one-way peak is bandwidth-bound: NCCL's
#: all-reduce reaches about 75-80 % of it on NVLink (nccl-tests), so past half the link does
#: most of what it can and only fewer bytes help.
BANDWIDTH_BOUND = 0.5


def late_rank(ctx: Context) -> list[Finding]:
    """Collectives on the path wait for the last participant: name it and what made it late
    (it started the step later, or spent longer before the collective, and on what)."""
    t = ctx.time("comm_wait")
    if not ctx.above_floor(t):
        return []
    w = collective_waits(ctx.trace)
    mine = w[(w.part == ctx.part) & (w.wait_ns > 0)]
    if ctx.steps:
        mine = mine[_in_steps(ctx, mine)]
    if mine.empty:
        return []
    by_rank = mine.groupby("last_rank").wait_ns.sum().sort_values(ascending=False)
    late = int(by_rank.index[0])
    worst = mine[mine.last_rank == late].sort_values("wait_ns").iloc[-1]
    why = _why_late(ctx, late, worst)
    return [ctx.finding(
        "late-rank", "comm_wait",
        f"Find what delays rank {late}{': ' + why if why else ''}; balance the work (or the "
        "data) across ranks. The others wait for it inside the collective, so overlapping or "
        "tuning the collective itself does not help",
        f"rank {ctx.rank} waits {per_step(t, ctx)} inside collectives for rank {late} to arrive",
        f"rank {late} is last in {int((mine.last_rank == late).sum())} of {len(mine)} "
        f"collectives this rank waited in; the longest wait: {worst.collective} "
        f"{fmt_ns(worst.wait_ns)}", t, t, [int(i) for i in mine.id.head(20)])]  # fmt: skip


def _in_steps(ctx: Context, df: pd.DataFrame) -> pd.Series:
    st = ctx.diagnosis.tables["steps"]
    st = st[(st.part == ctx.part) & (st.device == ctx.device)]
    inside = np.zeros(len(df), bool)
    ts = df.ts.to_numpy(np.int64)
    for a, n in zip(st.ts, st.step_ns, strict=True):
        inside |= (ts >= a) & (ts < a + n)
    return pd.Series(inside, index=df.index)


def _why_late(ctx: Context, late: int, coll: pd.Series) -> str:
    """Lateness = later step start + longer work before the collective; say which, and on
    the second, in what category of the late rank's critical path."""
    w = collective_waits(ctx.trace)
    theirs = w[(w["rank"] == late) & (w.process_group == coll.process_group)
               & (w.seq == coll.seq)]  # fmt: skip
    dx = ctx.diagnosis.tables["steps"]
    mine_step = dx[(dx.part == ctx.part) & (dx.device == ctx.device) & (dx.ts <= coll.ts)].tail(1)
    if theirs.empty or mine_step.empty:
        return ""
    theirs = theirs.iloc[0]
    late_step = dx[(dx["rank"] == late) & (dx.ts <= theirs.ts)].tail(1)
    if late_step.empty:
        return ""
    offset = _offset(ctx.trace, late, ctx.rank)
    if offset is None:  # a rank not aligned: this one collective's ends agree
        offset = (theirs.ts - coll.ts) - (coll.wait_ns)
    start_gap = (int(late_step.ts.iloc[0]) - offset) - int(mine_step.ts.iloc[0])
    before_late = int(theirs.ts - late_step.ts.iloc[0])
    before_mine = int(coll.ts - mine_step.ts.iloc[0])
    if start_gap >= before_late - before_mine:
        return (f"it started the step {fmt_ns(start_gap)} after rank {ctx.rank} (the work "
                f"before the collective took {fmt_ns(before_late)} on it, {fmt_ns(before_mine)} "
                "here), so the delay is in what it did before the step")  # fmt: skip
    cat = _top_category(ctx, late, int(late_step.ts.iloc[0]), int(theirs.ts))
    return (f"it spent {fmt_ns(before_late - before_mine)} longer before the collective "
            f"({fmt_ns(before_late)} vs {fmt_ns(before_mine)})"
            + (f", most in {cat}" if cat else ""))  # fmt: skip


def _offset(trace: Trace, late: int, rank: int) -> int | None:
    """Rank ``late``'s clock minus rank ``rank``'s (ns), from the comm tool's clock solve over
    every matched collective (``analysis.comm.clocks``: 0 on one host); None where either
    rank's clock is not aligned."""
    off = clock_offsets(trace)
    by = off.dropna(subset=["rank"]).drop_duplicates("rank").set_index("rank")["offset_ns"]
    a, b = by.get(late), by.get(rank)
    if a is None or b is None or pd.isna(a) or pd.isna(b):
        return None
    return int(a) - int(b)


def _top_category(ctx: Context, rank: int, lo: int, hi: int) -> str:
    from xpuprof.analysis.path_time import CATEGORIES, path_times

    parts = [s["part"] for s in ctx.trace.sources if s["rank"] == rank]
    if not parts:
        return ""
    pt = path_times(ctx.trace, parts[:1])[parts[0]]
    s, e = np.clip(pt.start, lo, hi), np.clip(pt.end, lo, hi)
    per = np.bincount(pt.category, weights=(e - s), minlength=len(CATEGORIES))
    return DESCRIPTION[CATEGORIES[int(per.argmax())]] if per.sum() > 0 else ""


def bandwidth(ctx: Context) -> list[Finding]:
    """Collectives moving bytes on the path: bandwidth-bound when the bus bandwidth reaches
    :data:`BANDWIDTH_BOUND` of the link's one-way peak, else latency-bound (small messages) or
    just exposed."""
    t = ctx.time("communication")
    if not ctx.above_floor(t):
        return []
    lib = ctx.platform.collectives or "the collective library"
    top = ctx.top("communication", 3)
    link = _link(ctx)
    coll = _collectives(ctx)
    size = busbw = None
    if coll is not None and len(coll):
        known = coll[coll.bytes.notna() & (coll.dur > 0)]
        if len(known):
            size = float(known.bytes.median())
            busbw = float((known.bytes * known.busbw_factor).sum() / (known.dur.sum() * 1e-9))
    names = ", ".join(f"`{n}`" for n in top.name)
    evidence = f"on the path: {names or 'collectives'}"
    if busbw is not None:
        evidence += f"; bus bandwidth {busbw / 1e9:.1f} GB/s"
        if link:
            evidence += f" of a {link / 1e9:.0f} GB/s one-way link ({busbw / link:.0%})"
        evidence += f"; median message {_bytes(size)}"
    if busbw is not None and link and busbw >= BANDWIDTH_BOUND * link:
        how = (
            f"Send fewer bytes ({lib} runs near the link's peak): compress gradients "
            "(bf16/fp16 communication hooks, PowerSGD), shard instead of replicate "
            "(FSDP/ZeRO), or overlap the collectives with compute (DDP buckets, FSDP "
            "prefetch)"
        )
        what = "bandwidth-bound"
    elif size is not None and size < (1 << 20):
        how = (
            f"Batch small collectives: {lib} pays a fixed latency per call; coalesce them "
            "(DDP's bucket_cap_mb, torch.distributed's coalescing manager, fused "
            "optimizers' flat buffers), and overlap them with compute"
        )
        what = "latency-bound (small messages)"
    elif ctx.platform.collectives == "gloo":
        how = (
            "Overlap the gloo all-reduces with compute (DDP buckets) or send fewer bytes; "
            "gloo runs collectives on the CPU: use NCCL/RCCL where the ranks have GPUs"
        )
        what = "exposed"
    else:
        how = (
            f"Overlap the collectives with compute: they run with nothing beside them "
            f"(DDP with gradient_as_bucket_view and smaller buckets, FSDP backward "
            f"prefetch, {lib} on its own stream)"
        )
        what = "exposed"
    if ctx.trace.sql("select count(distinct part) as n from events").n.iloc[0] < 2:
        evidence += ("; one rank in this store: time waiting for other ranks cannot be told "
                     "apart from transfer")  # fmt: skip
    return [ctx.finding(
        "communication", "communication", how,
        f"collectives move data {per_step(t, ctx)} on the critical path ({what})",
        evidence, t, t, ctx.ids("communication"))]  # fmt: skip


def _collectives(ctx: Context) -> pd.DataFrame | None:
    try:
        from xpuprof.analysis.comm import collectives

        c = collectives(ctx.trace, ranks=ctx.ranks, steps=ctx.selection).tables["collectives"]
    except Exception:  # noqa: BLE001 - a refinement: no sizes, no bandwidth
        return None
    return c[c.part == ctx.part]


def _link(ctx: Context) -> float | None:
    """The device's one-way link bandwidth (the spec gives both directions together)."""
    from xpuprof.hardware.specs import match

    props = ctx.trace.meta.get("device_properties", {}).get(ctx.part) or []
    for p in props:
        if isinstance(p, dict):
            s = match(p.get("name"), p)
            if s is not None and s.interconnect_bandwidth:
                return s.interconnect_bandwidth / 2
    return None


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


COMM_RULES = (late_rank, bandwidth)

"""Headlines: each tool's answer in one sentence, from the tool's own tables, for the tools
that do not state one themselves (``Tool.headline`` in :mod:`xpuprof.ui.tools` names them).

Each is ``function(result, *traces) -> str | None`` (None: the tables hold nothing to state);
``tools.run`` puts the sentence into ``Result.facts["headline"]``, which every front end
shows first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xpuprof.core.result import Result

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace


def _time(ns: float) -> str:
    from xpuprof.ui.render import human_time

    return human_time(ns)


def _frame(res: Result, name: str) -> Any:
    """Table ``name`` as a DataFrame with rows, or None."""
    import pandas as pd

    table = res.tables.get(name)
    if table is None or not len(table):
        return None
    return table if isinstance(table, pd.DataFrame) else pd.DataFrame(table)


def _rank(value: Any) -> str:
    import pandas as pd

    return "" if pd.isna(value) else f" on rank {int(value)}"


def breakdown(res: Result, *_: Trace) -> str | None:
    t = _frame(res, "temporal")
    if t is None:
        return None
    if len(t) == 1:
        r = t.iloc[0]
        return (f"The device computes {r.compute_pct:.0f}% of the {_time(r.span_ns)} "
                f"traced{_rank(r['rank'])}, runs other work (communication, memory) "
                f"{r.non_compute_pct:.0f}% and is idle {r.idle_pct:.0f}%")  # fmt: skip
    worst = t.loc[t.idle_pct.idxmax()]
    return (f"Across {len(t)} ranks the devices compute {t.compute_pct.min():.0f}–"
            f"{t.compute_pct.max():.0f}% of the time traced, run other work (communication, "
            f"memory) {t.non_compute_pct.min():.0f}–{t.non_compute_pct.max():.0f}% and are idle "
            f"{t.idle_pct.min():.0f}–{t.idle_pct.max():.0f}% (most idle: rank "
            f"{int(worst['rank'])}, {worst.idle_pct:.0f}%)")  # fmt: skip


_IDLE_WORDS = {
    "host_wait": "waiting for the host to queue work",
    "kernel_wait": "in short gaps between queued kernels",
    "other": "other",
}


def idle(res: Result, *_: Trace) -> str | None:
    t = _frame(res, "breakdown")
    if t is None or not t.idle_ns.sum():
        return None
    by = t.groupby("idle_category").idle_ns.sum().sort_values(ascending=False)
    total = float(by.sum())
    streams = len(t.drop_duplicates(["rank", "device", "stream"]))
    parts = ", ".join(f"{v / total:.0%} {_IDLE_WORDS.get(k, k)}" for k, v in by.items() if v)
    return f"Device streams are idle {_time(total)} in all ({streams} streams): {parts}"


#: How late a rank must arrive, on average, for the communication headline to name it.
LATE_FLOOR_NS = 50_000


def comm(res: Result, *_: Trace) -> str | None:
    s = _frame(res, "summary")
    if s is None or not s.time_ns.sum():
        return None
    n = s.participant.nunique()
    by = s.groupby("collective").time_ns.sum().sort_values(ascending=False)
    who = "rank" if s["rank"].notna().all() else "participant"
    line = (f"Collectives take {_time(s.time_ns.sum() / n)} per {who} "
            f"({int(s['count'].sum() / n):,} calls; {by.index[0]} {by.iloc[0] / by.sum():.0%} "
            "of that time)")  # fmt: skip
    o = _frame(res, "overlap")
    if o is not None and o.comm_time_ns.sum():
        line += f", {o.overlapped_ns.sum() / o.comm_time_ns.sum():.0%} hidden under compute"
    st = _frame(res, "stragglers")
    if st is not None and n > 2:
        last = st.loc[st.times_last.idxmax()]
        # the noise floor: a straggler at least 50 µs late on average, last half the time
        if last.share_last_pct >= 50 and last.mean_late_ns >= LATE_FLOOR_NS:
            name = f"rank {last['rank']}" if who == "rank" else str(last.participant)
            line += (f"; {name} is the last to arrive at {int(last.times_last)} of "
                     f"{int(last.collectives)} collectives ({_time(last.mean_late_ns)} late on "
                     "average)")  # fmt: skip
    return line


def memory(res: Result, *traces: Trace) -> str | None:
    from xpuprof.ui.render import human_bytes

    p = _frame(res, "peaks")
    if p is None or p.peak_allocated.isna().all():
        return None
    top = p.loc[p.peak_allocated.idxmax()]
    from xpuprof.ui.tools import trace_start

    start = trace_start(traces[0]) if traces else None
    when = (f" at {_time(top.peak_ts - start)} into the trace"
            if start is not None and top.peak_ts == top.peak_ts else "")  # fmt: skip
    line = f"Peak memory {human_bytes(top.peak_allocated)} allocated on {top.device}" + (
        f"{_rank(top['rank'])}{when}"
    )
    by = _frame(res, "live_by_op")
    if by is not None:
        same = by[(by.device == top.device) & (by.part == top.part)]
        if len(same):
            big = same.loc[same.bytes.idxmax()]
            line += f"; the most live at the peak under {big.top_op} ({human_bytes(big.bytes)})"
    return line


_PATH_WORDS = {
    "cpu_bound": "host work",
    "gpu_compute": "device compute",
    "gpu_communication": "communication kernels",
    "launch_overhead": "launch delays",
    "kernel_gap": "gaps between kernels",
}


def critical_path(res: Result, *_: Trace) -> str | None:
    s = _frame(res, "summary")
    if s is None:
        return None
    totals = s[s.attribution == "total"]
    if not len(totals) or not totals.time.max():
        return None
    top = totals.loc[totals.time.idxmax()]
    mine = s[(s.part == top.part) & (s.attribution != "total") & (s.time > 0)]
    parts = ", ".join(
        f"{r.percent:.0f}% {_PATH_WORDS.get(r.attribution, r.attribution)}"
        for r in mine.sort_values("time", ascending=False).head(3).itertuples()
    )
    who = f" of rank {int(top['rank'])}" if len(totals) > 1 else ""
    return f"The critical path{who} is {_time(top.time)} long: {parts}"


def stats(res: Result, *_: Trace) -> str | None:
    from xpuprof.ui.text import short_name

    said = []
    ops = _frame(res, "ops")
    if ops is not None and ops.self_ns.sum() > 0:
        o = ops.loc[ops.self_ns.idxmax()]
        said.append(
            f"most op self time in {short_name(str(o['name']))} ({_time(o.self_ns)}, "
            f"{o.self_ns / ops.self_ns.sum():.0%} of all, {int(o['count']):,} calls)"
        )
    k = _frame(res, "kernels")
    if k is not None and k.total_ns.sum() > 0:
        r = k.loc[k.total_ns.idxmax()]
        said.append(
            f"most device time in {short_name(str(r['name']))} ({_time(r.total_ns)}, "
            f"{r.total_ns / k.total_ns.sum():.0%} of all, {int(r['count']):,} calls)"
        )
    line = "; ".join(said)
    return line[:1].upper() + line[1:] if line else None


def input(res: Result, *_: Trace) -> str | None:
    s = _frame(res, "summary")
    if s is None or "input_fraction" not in s:
        return None
    worst = s.loc[s.input_fraction.fillna(0).idxmax()]
    who = f"Rank {int(worst['rank'])} is" if len(s) > 1 else "The run is"
    return f"{who} {worst.classification}: {worst.input_fraction:.0%} of step time waits for input"


def roofline(res: Result, *_: Trace) -> str | None:
    b = _frame(res, "by_name")
    if b is None or not b.time_ns.sum():
        return None
    known = b[b.bound != "unknown"]
    if not len(known):
        return (f"{len(b)} op names costed ({_time(b.time_ns.sum())}); no roof for this device, "
                "so whether they are compute- or memory-bound is unknown")  # fmt: skip
    by = known.groupby("bound").time_ns.sum()
    share = ", ".join(f"{v / by.sum():.0%} {k}-bound" for k, v in by.items())
    return f"Of {_time(by.sum())} of costed work with a known roof: {share}"


def info(res: Result, *_: Trace) -> str | None:
    from xpuprof.ui.text import ranges_text

    src = res.tables.get("sources") or []
    ranks = sorted({int(s["rank"]) for s in src if isinstance(s.get("rank"), int)})
    devices = sorted({d for s in src for d in (s.get("devices") or "").split(", ") if d})
    line = f"{res.facts.get('events_read', 0):,} events read from {len(src)} source(s)"
    if ranks:
        line += f", {'rank' if len(ranks) == 1 else 'ranks'} {ranges_text(ranks)}"
    return line + (f", on {', '.join(devices)}" if devices else "")

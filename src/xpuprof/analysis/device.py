"""Device work: the one selection of device events (kernels, collectives, copies, sets) with
their kernel types and the runtime calls that launched them, shared by the breakdown and
idle-time analyses, and the step filter they apply.

Device work is what the schema calls device work: levels ``kernel``, ``collective``,
``memcpy``, ``memset``; each event's kernel type is :func:`xpuprof.analysis.common.kernel_type`
and its launch is the earliest runtime call with its correlation id in the same source file.

Steps (:data:`~xpuprof.analysis.common.StepSelection`): every step by default, like every tool.
``steps="drop-last"`` is HTA's default (``TraceAnalysis(include_last_profiler_step=False)``):
device work *launched* (its runtime call's start, else its own) before the start of the rank's
last step span is kept, the rest dropped, because a trace usually stops inside the last step;
it applies to a rank with at least two steps, otherwise nothing is dropped and a note says so.
A list of step numbers keeps device events whose ``step`` (that of the call that launched them)
is in the list. ``hta_compatible`` (``True`` or names of :data:`QUIRKS`) selects the work as
HTA 0.5.0 does instead (:mod:`xpuprof.analysis.hta`), and then ``steps=None`` means drop-last.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.analysis.common import DEVICE_LEVELS, StepSelection, kernel_type, step_mode
from xpuprof.core.errors import XpuprofError

if TYPE_CHECKING:
    import pyarrow as pa

    from xpuprof.trace.trace import Trace

NO_RANK = -1  # internal stand-in for a null rank (a trace without distributedInfo)

#: HTA 0.5.0's behaviours that ``hta_compatible`` can switch on one by one (``True``: all);
#: :mod:`xpuprof.analysis.hta` implements them.
QUIRKS = {
    "round_us": "times rounded inward to whole µs when the file has a fractional timestamp "
    "(trace_parser.round_down_time_stamps)",
    "stream_arg": "device work = events whose args carry a stream ≠ −1, grouped by that stream "
    "(idle time: only kernel/memcpy/memset/mtia_ccp_events categories)",
    "name_types": "kernel types from names (^nccl.*Kernel, ^Memcpy|^Memset|^dma, *Sync*)",
    "step_filter": "HTA's last-step filter: once for all ranks when ≥ 2 ProfilerStep names; "
    "keeps device events whose correlation matches a host event before the last step's start, "
    "once per such host event",
    "launch_lookup": "the launch of a device event is the last host event in file order with its "
    "correlation; without one, the file's first event (index_correlation = 0)",
    "prev_end": "idle gap measured from the previous event's end, negative gaps included",
    "launch_names": "launch delays and queue length only for HTA's lists of launch calls, "
    "joined on correlation with every event that shares it",
    "sort_ties": "equal timestamps in the order pandas' default quicksort leaves them",
}

#: How many selections one Trace keeps in its memo (each can hold millions of rows).
MEMO_SELECTIONS = 8


@dataclass
class DeviceWork:
    """The device events an analysis works on, one row each (times in ns):
    ``rank`` (−1 for a trace without rank), ``part``, ``index``, ``device``, ``stream``,
    ``level``, ``category``, ``name``, ``ts``, ``dur``, ``end``, ``ktype``, ``step``, and the
    runtime call that launched it (``has_launch``, ``launch_ts``, ``launch_dur``,
    ``launch_name``); ``quirks``: the HTA behaviours it was selected with; ``steps``: the
    step selection applied (``all``, ``drop-last`` or ``list``)."""

    df: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    quirks: frozenset[str] = frozenset()
    frame: pd.DataFrame | None = None  # HTA's rows before its step filter (quirks on)
    host: pd.DataFrame | None = None  # host rows of ``frame`` its step filter keeps
    steps: str = "all"

    @property
    def hta_compatible(self) -> bool:
        return bool(self.quirks)


def quirk_set(hta_compatible: bool | Iterable[str]) -> frozenset[str]:
    """``True`` → every quirk, ``False`` → none, or the named ones (see :data:`QUIRKS`)."""
    if hta_compatible is True:
        return frozenset(QUIRKS)
    if not hta_compatible:
        return frozenset()
    q = frozenset(hta_compatible)
    unknown = q - set(QUIRKS)
    if unknown:
        raise XpuprofError(f"unknown HTA quirk(s) {sorted(unknown)}; known: {', '.join(QUIRKS)}")
    return q


def rank_filter(ranks: Iterable[int] | None, col: str = "rank") -> str:
    """SQL predicate for the selected ranks; :data:`NO_RANK` selects events without a rank."""
    if ranks is None:
        return "true"
    rs = [int(r) for r in ranks]
    parts = []
    if rs:
        parts.append(f"{col} in ({', '.join(map(str, rs))})")
    if NO_RANK in rs:
        parts.append(f"{col} is null")
    return "(" + (" or ".join(parts) or "false") + ")"


def device_work(
    trace: Trace,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    *,
    hta_compatible: bool | Iterable[str] = False,
) -> DeviceWork:
    """Select the device events of the breakdown and idle-time analyses (see the module
    docstring for the step filter). ``hta_compatible=True`` selects them as HTA 0.5.0 does
    instead; a collection of :data:`QUIRKS` names switches on only those of HTA's
    behaviours (the tests use this to show which behaviour explains each disagreement).

    Computed once per trace and options (cached on ``trace.memo``): the breakdowns and idle
    time of one store share it. Callers only read ``df``; ``notes`` is their own copy."""
    quirks = quirk_set(hta_compatible)
    mode, step_list = step_mode(steps, hta_compatible=bool(quirks))
    key = (
        None if ranks is None else tuple(sorted(int(r) for r in ranks)),
        mode,
        None if step_list is None else tuple(step_list),
        quirks,
    )
    memo = trace.memo.setdefault("analysis.device_work", {})
    if key not in memo:
        if len(memo) >= MEMO_SELECTIONS:
            memo.clear()
        if quirks:
            from xpuprof.analysis.hta import hta_device_work

            memo[key] = hta_device_work(trace, ranks, mode, step_list, quirks)
        else:
            memo[key] = _select(trace, ranks, mode, step_list)
    dw = memo[key]
    return DeviceWork(dw.df, list(dw.notes), dw.quirks, dw.frame, dw.host, steps=mode)


def _select(
    trace: Trace, ranks: Iterable[int] | None, mode: str, step_list: list[int] | None
) -> DeviceWork:
    df = _read_device_events(trace, ranks)
    notes: list[str] = []
    if df.empty:
        notes.append(_no_device_note(trace, ranks))
        return DeviceWork(typed(df), notes)
    df, more = step_filter(trace, ranks, df, mode, step_list)
    notes += more
    df["ktype"] = kernel_type(df["level"], df["name"]).to_numpy()
    multi = df.groupby("rank")["device"].nunique()
    for r, n in multi[multi > 1].items():
        notes.append(
            f"{rank_name(r)} has device events on {n} devices; per-rank numbers take them "
            "together (as HTA does)"
        )
    return DeviceWork(typed(df), notes)


def _ints_nullable(t: pa.DataType) -> Any:
    """Arrow → pandas: integers stay exact integers (nullable) instead of float64, which
    cannot hold nanosecond timestamps."""
    import pyarrow as pa

    return {
        pa.int64(): pd.Int64Dtype(),
        pa.int32(): pd.Int32Dtype(),
        pa.int16(): pd.Int16Dtype(),
    }.get(t)


def _read_device_events(trace: Trace, ranks: Iterable[int] | None) -> pd.DataFrame:
    """Device events with the runtime call that launched them (the earliest runtime event
    with the same correlation id in the same source file), read with Arrow: names stay
    dictionary-encoded (pandas categoricals), which is what makes this fast."""
    cols = ["rank", "part", "index", "device", "stream", "level", "category", "name", "ts",
            "dur", "correlation", "step"]  # fmt: skip
    dev = trace.table("events", columns=cols, filters=[("level", "in", list(DEVICE_LEVELS))])
    dev = dev.to_pandas(types_mapper=_ints_nullable)
    dev = dev[dev["dur"].notna() & dev["ts"].notna()]
    dev["rank"] = dev["rank"].fillna(NO_RANK).astype(np.int64)
    if ranks is not None:
        dev = dev[dev["rank"].isin([int(r) for r in ranks])]
    rt = trace.table(
        "events",
        columns=["part", "correlation", "ts", "dur", "name"],
        filters=[("level", "==", "runtime")],
    ).to_pandas(types_mapper=_ints_nullable)
    rt = rt[rt["correlation"].notna()].sort_values("ts", kind="stable")
    rt = rt.drop_duplicates(["part", "correlation"], keep="first").rename(
        columns={"ts": "launch_ts", "dur": "launch_dur", "name": "launch_name"}
    )
    df = dev.merge(rt, on=["part", "correlation"], how="left")
    df["has_launch"] = df["launch_ts"].notna().to_numpy(bool)
    df["launch_ts"] = df["launch_ts"].fillna(df["ts"])
    df["launch_dur"] = df["launch_dur"].fillna(0)
    df["end"] = df["ts"] + df["dur"]
    df = df.sort_values(["rank", "ts"], kind="stable", ignore_index=True)
    for c in ("ts", "dur", "end", "launch_ts", "launch_dur"):
        df[c] = df[c].astype(np.int64)
    return df


def step_filter(
    trace: Trace,
    ranks: Iterable[int] | None,
    df: pd.DataFrame,
    mode: str,
    step_list: list[int] | None,
) -> tuple[pd.DataFrame, list[str]]:
    """Keep device work launched before each rank's last step (``drop-last``), or in the
    given steps (``list``); ``all`` keeps everything. ``launch_ts`` is the launch call's
    start, else the event's. Returns the kept rows and notes on what was (not) dropped."""
    notes: list[str] = []
    if mode == "drop-last":
        steps_df = trace.sql(
            f"select coalesce(rank, {NO_RANK}) as rank, max(ts) as last_start, count(*) as n "
            f"from events where level = 'step' and {rank_filter(ranks)} group by 1"
        )
        info = {
            int(r): (int(s), int(n))
            for r, s, n in zip(steps_df["rank"], steps_df["last_start"], steps_df["n"], strict=True)
        }
        keep = np.ones(len(df), dtype=bool)
        rk = df["rank"].to_numpy()
        lts = df["launch_ts"].to_numpy(np.int64)
        for r in sorted(pd.unique(rk)):
            last, n = info.get(int(r), (0, 0))
            if n >= 2:
                keep[rk == r] = lts[rk == r] < last
            else:
                notes.append(
                    f"{rank_name(r)}: {n} step span(s), so no last step was dropped "
                    "(HTA's default drops the last, usually incomplete, step)"
                )
        dropped = int((~keep).sum())
        if dropped:
            notes.append(
                f"last step dropped (steps='drop-last', HTA's default): {dropped:,} of "
                f"{len(df):,} device events launched at or after the start of their rank's "
                "last step are left out"
            )
        df = df[keep]
    elif mode == "list":
        df = df[df["step"].isin(step_list)]
        if df.empty:
            notes.append(f"no device events in step(s) {', '.join(map(str, step_list or []))}")
    return df.reset_index(drop=True), notes


def typed(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of selected device work with ``ktype``/``launch_name`` present and times int64."""
    df = df.copy()
    for c in ("ktype", "launch_name"):
        if c not in df:
            df[c] = pd.Series(dtype=object)
    for c in ("ts", "dur", "end", "launch_ts", "launch_dur"):
        if c in df:
            df[c] = df[c].astype(np.int64)
    return df


def rank_name(r: int) -> str:
    """How a note names a rank (:data:`NO_RANK`: the trace has none)."""
    return "the trace (no rank)" if r == NO_RANK else f"rank {r}"


def _no_device_note(trace: Trace, ranks: Iterable[int] | None) -> str:
    n = trace.sql(f"select count(*) as n from events where {rank_filter(ranks)}")["n"].iloc[0]
    return (
        f"no device events (kernels, collectives, memcpy, memset) among the {int(n):,} "
        "events selected: nothing runs on a device in this trace, so device time cannot be "
        "broken down"
    )


def out_rank(r: pd.Series) -> pd.Series:
    """Ranks as output columns show them: nullable integers, NA for :data:`NO_RANK`."""
    return r.astype("Int64").where(r != NO_RANK, pd.NA)

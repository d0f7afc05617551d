"""How the device spends its time: HTA's temporal breakdown, kernel-type breakdown and
communication/computation overlap.

Definitions (Holistic Trace Analysis 0.5.0, ``hta/analyzers/breakdown_analysis.py`` and
``hta/analyzers/communication_analysis.py``; the kernel types of ``hta/utils/utils.py``):

* **temporal breakdown** per rank (``BreakdownAnalysis.get_temporal_breakdown``): the *span*
  runs from the start of the first to the end of the last device event; *idle* = span − union
  of all device events (overlapping kernels count once); *compute* = union of COMPUTATION
  kernels; *non-compute* = span − idle − compute (communication, memcpy and memset time that
  no compute kernel covers). Percentages are of the span.
* **kernel-type breakdown** (``get_gpu_kernel_breakdown``): over all selected ranks, the time
  during which exactly a given set of kernel types runs ("COMPUTATION", "COMPUTATION
  overlapping COMMUNICATION", …; ``_get_gpu_kernel_type_time``), each type's intervals merged
  first, and its percentage of the total; plus per rank, type and kernel name: count, sum,
  mean, min, max, standard deviation.
* **comm/compute overlap** per rank (``CommunicationAnalysis.get_comm_comp_overlap``): time
  during which a communication and a computation kernel run at once ÷ union of communication
  time.

The **step filter** is explicit. ``steps="drop_last"`` (the default) is HTA's default
(``TraceAnalysis(include_last_profiler_step=False)``; ``Trace._filter_irrelevant_gpu_kernels``):
device work *launched* (its runtime call's start, found by correlation id) before the start of
the rank's last step span is kept, the rest dropped, because a trace usually stops inside the
last step. It applies to a rank with at least two steps; otherwise nothing is dropped and a
note says so. ``steps="all"`` (or ``None``) keeps every device event; a list of step numbers
keeps device events whose ``step`` (the step of the call that launched them) is in the list.

What we do differently, by design (``hta_compatible=True`` reproduces HTA instead, see
:func:`device_work`):

* times are the exact integer nanoseconds of the source. HTA parses microsecond floats and,
  when a file has any fractional timestamp, rounds every event inward to whole microseconds
  (``trace_parser.round_down_time_stamps``: start up, end down), which gives sub-µs events a
  duration of 0 or −1 µs and shifts every interval by up to 1 µs;
* device work is what the schema calls device work: levels ``kernel``, ``collective``,
  ``memcpy``, ``memset``. HTA takes every event whose args carry a ``stream`` other than −1:
  that adds ``cuda_sync`` waits (typed OTHER, but counted as busy time in the temporal
  breakdown), host ops that record a stream (a Triton ``cpu_op`` with ``"stream": 0``), and
  HIP runtime calls with a ``stream`` arg; it leaves out device events without one
  (``cuda_profiler_range`` kernels with hardware counters, so HTA's temporal breakdown fails
  on such a trace);
* kernel types come from levels (:func:`xpuprof.analysis.common.kernel_type`), plus MTIA's
  ``dma*`` transfers as MEMORY; HTA matches names (``^nccl.*Kernel`` communication,
  ``^Memcpy|^Memset|^dma`` memory, names containing ``Sync`` OTHER). They agree on every real
  trace we have except for the events above;
* HTA decides whether to drop the last step once for all ranks (when the trace holds at
  least two distinct ``ProfilerStep#N`` names) and drops device work that no host call of a
  kept step launched (no correlation); we decide per rank and keep uncorrelated work launched
  (started) before the last step;
* HTA's per-kernel table, once a type has more than ``num_kernels`` names, replaces each kept
  kernel's max/min/mean/std by statistics of the per-name *sums* (``_aggr_gpu_kernel_time``
  aggregates the already-aggregated table); ours are statistics of the kernels themselves.

``hta_compatible`` also takes a collection of :data:`QUIRKS` names, switching on only those of
HTA's behaviours; ``tests/test_breakdown.py`` uses that to show, for every shared trace where
our default and HTA disagree by more than 1 %, which behaviour accounts for the difference.
Functions that return one DataFrame put their notes (what was dropped, what could not be
computed) in ``df.attrs["notes"]``.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from xpuprof.analysis.common import (
    COMMUNICATION,
    COMPUTATION,
    DEVICE_LEVELS,
    MEMORY,
    OTHER,
    Result,
    intersection_length,
    kernel_type,
    merge_intervals,
)
from xpuprof.core.errors import XpuprofError

if TYPE_CHECKING:
    import pyarrow as pa

    from xpuprof.trace.trace import Trace

Steps = Iterable[int] | Literal["all", "drop_last"] | None

#: HTA's kernel-name patterns (``hta/utils/utils.py``: NCCL_KERNEL_RE, MEMORY_KERNEL_RE,
#: NCCL_COMPUTE_KERNEL_RE; matched with ``re.match``, i.e. anchored at the start).
HTA_COMM_RE = re.compile(r"^nccl.*Kernel")
HTA_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
HTA_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")

#: Categories HTA's idle-time breakdown keeps (``get_idle_time_breakdown``: kernel_cats).
HTA_IDLE_CATEGORIES = (
    "kernel",
    "Kernel",
    "gpu_memset",
    "Memset",
    "gpu_memcpy",
    "Memcpy",
    "mtia_ccp_events",
)

#: Device synchronisation events HTA's GPUKernelFilter keeps whatever their stream.
HTA_SYNC_NAMES = ("Event Sync", "Context Sync")

NO_RANK = -1  # internal stand-in for a null rank (a trace without distributedInfo)

#: HTA 0.5.0's behaviours that ``hta_compatible`` can switch on one by one (``True``: all):
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

#: Our refinement of the level-based kernel types: MTIA's ``dma_*`` device events (level
#: ``kernel``) move memory; HTA's name pattern ``^dma`` types them MEMORY, and so do we.
DMA_RE = r"^dma"


def hta_kernel_type(names: pd.Series) -> pd.Series:
    """HTA's ``get_kernel_type`` of each name, evaluated once per distinct name."""
    s = names.astype(str)
    out = {}
    for n in pd.unique(s):  # one regex per distinct name, not per event
        if HTA_COMM_RE.match(n):
            out[n] = COMMUNICATION
        elif HTA_MEMORY_RE.match(n):
            out[n] = MEMORY
        elif not HTA_NOT_COMPUTE_RE.match(n):
            out[n] = COMPUTATION
        else:
            out[n] = OTHER
    return s.map(out).astype(object)


def device_kernel_type(level: pd.Series, name: pd.Series) -> np.ndarray:
    """Kernel type of device events: :func:`xpuprof.analysis.common.kernel_type` (by level),
    with DMA transfers (``dma*`` names of level ``kernel``) as MEMORY. Evaluated once per
    distinct (level, name), so a million kernels cost a factorization, not a million regexes."""
    lc, lu = pd.factorize(level, use_na_sentinel=False)
    nc, nu = pd.factorize(name, use_na_sentinel=False)
    inv, ucomb = pd.factorize(lc.astype(np.int64) * max(len(nu), 1) + nc)
    ul = pd.Series(np.asarray(lu, dtype=object)[ucomb // max(len(nu), 1)])
    un = pd.Series(np.asarray(nu, dtype=object)[ucomb % max(len(nu), 1)])
    kt = kernel_type(ul, un).astype(object).to_numpy().copy()
    dma = (ul.astype(str) == "kernel").to_numpy() & un.astype(str).str.match(DMA_RE).to_numpy()
    kt[dma] = MEMORY
    return kt[inv]


# ------------------------------------------------------------------------------- selection


@dataclass
class DeviceWork:
    """The device events an analysis works on, one row each (times in ns):
    ``rank`` (−1 for a trace without rank), ``part``, ``index``, ``device``, ``stream``,
    ``level``, ``category``, ``name``, ``ts``, ``dur``, ``end``, ``ktype``, ``step``, and the
    runtime call that launched it (``has_launch``, ``launch_ts``, ``launch_dur``,
    ``launch_name``); ``quirks``: the HTA behaviours it was selected with."""

    df: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    quirks: frozenset[str] = frozenset()
    frame: pd.DataFrame | None = None  # HTA's rows before its step filter (quirks on)
    host: pd.DataFrame | None = None  # host rows of ``frame`` its step filter keeps

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


def _rank_filter(ranks: Iterable[int] | None, col: str = "rank") -> str:
    if ranks is None:
        return "true"
    rs = [int(r) for r in ranks]
    parts = []
    if rs:
        parts.append(f"{col} in ({', '.join(map(str, rs))})")
    if NO_RANK in rs:
        parts.append(f"{col} is null")
    return "(" + (" or ".join(parts) or "false") + ")"


def _steps_mode(steps: Steps) -> tuple[str, list[int] | None]:
    if steps is None or (isinstance(steps, str) and steps == "all"):
        return "all", None
    if isinstance(steps, str):
        if steps != "drop_last":
            raise XpuprofError(f"steps must be 'all', 'drop_last' or step numbers, not {steps!r}")
        return "drop_last", None
    return "list", [int(s) for s in steps]


def device_work(
    trace: Trace,
    ranks: Iterable[int] | None = None,
    steps: Steps = "drop_last",
    *,
    hta_compatible: bool | Iterable[str] = False,
) -> DeviceWork:
    """Select the device events of the breakdown and idle-time analyses (see the module
    docstring for the step filter). ``hta_compatible=True`` selects them as HTA 0.5.0 does
    instead; a collection of :data:`QUIRKS` names switches on only those of HTA's
    behaviours (the tests use this to show which behaviour explains each disagreement)."""
    quirks = quirk_set(hta_compatible)
    if quirks:
        return _device_work_quirks(trace, ranks, steps, quirks)
    mode, step_list = _steps_mode(steps)
    df = _read_device_events(trace, ranks)
    notes: list[str] = []
    if df.empty:
        notes.append(_no_device_note(trace, ranks))
        return DeviceWork(_typed(df), notes)
    df, more = _our_step_filter(trace, ranks, df, mode, step_list)
    notes += more
    df["ktype"] = device_kernel_type(df["level"], df["name"])
    multi = df.groupby("rank")["device"].nunique()
    for r, n in multi[multi > 1].items():
        notes.append(
            f"{_rank_name(r)} has device events on {n} devices; per-rank numbers take them "
            "together (as HTA does)"
        )
    return DeviceWork(_typed(df), notes)


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
    cols = [
        "rank",
        "part",
        "index",
        "device",
        "stream",
        "level",
        "category",
        "name",
        "ts",
        "dur",
        "correlation",
        "step",
    ]
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


_CACHE: weakref.WeakKeyDictionary[Trace, dict[tuple, DeviceWork]] = weakref.WeakKeyDictionary()


def _work(
    trace: Trace, ranks: Iterable[int] | None, steps: Steps, hta_compatible: bool | Iterable[str]
) -> DeviceWork:
    """:func:`device_work`, computed once per trace and options: the breakdowns and idle
    time of one store share it (the analyses only read it)."""
    mode, step_list = _steps_mode(steps)
    key = (
        None if ranks is None else tuple(sorted(int(r) for r in ranks)),
        mode,
        None if step_list is None else tuple(step_list),
        quirk_set(hta_compatible),
    )
    per = _CACHE.setdefault(trace, {})
    if key not in per:
        if len(per) > 8:
            per.clear()
        per[key] = device_work(trace, ranks, steps, hta_compatible=hta_compatible)
    dw = per[key]
    return DeviceWork(dw.df, list(dw.notes), dw.quirks, dw.frame, dw.host)


def _our_step_filter(
    trace: Trace,
    ranks: Iterable[int] | None,
    df: pd.DataFrame,
    mode: str,
    step_list: list[int] | None,
) -> tuple[pd.DataFrame, list[str]]:
    """Keep device work launched before each rank's last step (``drop_last``), or in the
    given steps (``list``). ``launch_ts`` is the launch call's start, else the event's."""
    notes: list[str] = []
    if mode == "drop_last":
        steps_df = trace.sql(
            f"select coalesce(rank, {NO_RANK}) as rank, max(ts) as last_start, count(*) as n "
            f"from events where level = 'step' and {_rank_filter(ranks)} group by 1"
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
                    f"{_rank_name(r)}: {n} step span(s), so no last step was dropped "
                    "(HTA's default drops the last, usually incomplete, step)"
                )
        dropped = int((~keep).sum())
        if dropped:
            notes.append(
                f"last step dropped (HTA's default; steps='all' keeps it): {dropped:,} of "
                f"{len(df):,} device events launched at or after the start of their rank's "
                "last step are left out"
            )
        df = df[keep]
    elif mode == "list":
        df = df[df["step"].isin(step_list)]
        if df.empty:
            notes.append(f"no device events in step(s) {', '.join(map(str, step_list))}")
    return df.reset_index(drop=True), notes


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for c in ("ktype", "launch_name"):
        if c not in df:
            df[c] = pd.Series(dtype=object)
    for c in ("ts", "dur", "end", "launch_ts", "launch_dur"):
        if c in df:
            df[c] = df[c].astype(np.int64)
    return df


def _rank_name(r: int) -> str:
    return "the trace (no rank)" if r == NO_RANK else f"rank {r}"


def _no_device_note(trace: Trace, ranks: Iterable[int] | None) -> str:
    n = trace.sql(f"select count(*) as n from events where {_rank_filter(ranks)}")["n"].iloc[0]
    return (
        f"no device events (kernels, collectives, memcpy, memset) among the {int(n):,} "
        "events selected: nothing runs on a device in this trace, so device time cannot be "
        "broken down"
    )


def _out_rank(r: pd.Series) -> pd.Series:
    return r.astype("Int64").where(r != NO_RANK, pd.NA)


# ---------------------------------------------------------------------- HTA-compatible path


def _hta_rounds(trace: Trace) -> dict[int, bool]:
    """Per part: whether HTA's parser would round its times to whole µs. It does when the
    ``ts`` column of ``pd.DataFrame(traceEvents)`` is float64: some entry has a fractional
    timestamp (or none at all)."""
    out: dict[int, bool] = {}
    for table in ("events", "flows", "counters", "metadata"):
        df = trace.sql(
            f"select part, bool_or(ts is null or ts % 1000 <> 0) as f from {table} group by part"
        )
        for p, f in zip(df["part"].tolist(), df["f"].tolist(), strict=True):
            out[int(p)] = out.get(int(p), False) or bool(f)
    return out


def _hta_round(ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HTA's ``round_down_time_stamps`` on exact ns, returned in ns: the float64 µs value
    json.loads gives (q + r/1000 rounds exactly as parsing the decimal text does), then
    start = ceil(ts), end = floor(ts + dur)."""
    q, r = np.divmod(ts, 1000)
    ts_f = q.astype(np.float64) + r.astype(np.float64) / 1000.0
    end_f = ts_f + dur.astype(np.float64) / 1000.0
    ts_r = np.ceil(ts_f).astype(np.int64)
    end_r = np.floor(end_f).astype(np.int64)
    return ts_r * 1000, (end_r - ts_r) * 1000


def hta_frame(
    trace: Trace, ranks: Iterable[int] | None = None, *, round_us: bool = True
) -> pd.DataFrame:
    """The rows of HTA's trace DataFrame that its breakdown, idle and launch analyses read
    (complete events with a category other than ``Trace``) and that carry a stream, a
    correlation or a ProfilerStep name, or are device work; with HTA's ``hstream`` (args
    ``stream``, −1 when absent), its ``correlation`` (−1 when absent), ``gpu_filter`` (its
    GPUKernelFilter), ``is_device`` (our levels) and, with ``round_us``, times rounded as HTA
    rounds them."""
    levels = ", ".join(f"'{lv}'" for lv in DEVICE_LEVELS)
    q = f"""
        select coalesce(rank, {NO_RANK}) as rank, part, "index", device, stream, level,
               category, name, ts, dur, coalesce(correlation, -1) as correlation, step,
               case when args like '%"stream"%'
                    then coalesce(try_cast(try_cast(json_extract_string(args, '$.stream')
                                                    as double) as bigint), -1)
                    else -1 end as hstream
        from events
        where phase = 'X' and dur is not null and ts is not null and category is not null
          and category <> 'Trace' and {_rank_filter(ranks)}
          and (correlation is not null or args like '%"stream"%' or name like '%ProfilerStep%'
               or level in ({levels}))
        order by part, "index"
    """
    df = trace.sql(q)
    df = df[
        (df["hstream"] != -1)
        | (df["correlation"] != -1)
        | df["level"].isin(DEVICE_LEVELS)
        | df["name"].astype(str).str.contains("ProfilerStep", regex=False)
    ]
    df = df.reset_index(drop=True)
    ts = df["ts"].to_numpy(np.int64)
    dur = df["dur"].to_numpy(np.int64)
    if round_us:
        rounds = _hta_rounds(trace)
        mask = df["part"].map(rounds).fillna(False).to_numpy(bool)
        if mask.any():
            rts, rdur = _hta_round(ts[mask], dur[mask])
            ts = ts.copy()
            dur = dur.copy()
            ts[mask], dur[mask] = rts, rdur
    df["ts"], df["dur"] = ts, dur
    df["end"] = ts + dur
    df["name"] = df["name"].astype(str)
    df["category"] = df["category"].astype(str)
    df["level"] = df["level"].astype(str)
    df["is_device"] = df["level"].isin(DEVICE_LEVELS)
    # GPUKernelFilter: (stream >= 0 and correlation >= 0) or a device-level sync event
    df["gpu_filter"] = ((df["hstream"] >= 0) & (df["correlation"] >= 0)) | df["name"].isin(
        HTA_SYNC_NAMES
    )
    return df


def _launch_hta(trace: Trace, df: pd.DataFrame, round_us: bool) -> pd.DataFrame:
    """HTA's ``transform_correlation_to_index``: a GPU event's launch is the host event with
    its correlation (the last in file order when several share it); one without gets index
    0, so the file's first event stands in for its launch."""
    cpu = df[~df["gpu_filter"] & (df["correlation"] != -1)].sort_values(["part", "index"])
    last_cpu = cpu.drop_duplicates(["part", "correlation"], keep="last").astype(
        {"ts": "Int64", "dur": "Int64"}
    )  # nullable: a merge must not turn ns into float64 (which cannot hold them)
    df = df.merge(
        last_cpu[["part", "correlation", "ts", "dur", "name"]].rename(
            columns={"ts": "launch_ts", "dur": "launch_dur", "name": "launch_name"}
        ),
        on=["part", "correlation"],
        how="left",
    )
    for c in ("launch_ts", "launch_dur"):
        df[c] = df[c].where(df["gpu_filter"], pd.NA)
    first = trace.sql(
        """select part, ts, dur from events where "index" = 0 and phase = 'X'
           and dur is not null and category is not null and category <> 'Trace'"""
    )
    df["launch_first_event"] = False
    if not first.empty:
        ts0, dur0 = first["ts"].to_numpy(np.int64), first["dur"].to_numpy(np.int64)
        if round_us:
            rounds = _hta_rounds(trace)
            m = first["part"].map(rounds).fillna(False).to_numpy(bool)
            r_ts, _ = _hta_round(ts0, dur0)
            ts0 = np.where(m, r_ts, ts0)
        fts = dict(zip(first["part"].tolist(), ts0.tolist(), strict=True))
        orphan = df["gpu_filter"] & df["launch_ts"].isna() & (df["correlation"] >= 0)
        df.loc[orphan, "launch_ts"] = df.loc[orphan, "part"].map(fts).astype("Int64")
        df["launch_first_event"] = (orphan & df["launch_ts"].notna()).to_numpy(bool)
    return df


def _launch_ours(df: pd.DataFrame) -> pd.DataFrame:
    """Our launch of a device event: the earliest runtime call with its correlation id."""
    rt = df[(df["level"] == "runtime") & (df["correlation"] != -1)].sort_values(
        ["part", "correlation", "ts"], kind="stable"
    )
    rt = rt.drop_duplicates(["part", "correlation"], keep="first").astype(
        {"ts": "Int64", "dur": "Int64"}
    )
    df = df.merge(
        rt[["part", "correlation", "ts", "dur", "name"]].rename(
            columns={"ts": "launch_ts", "dur": "launch_dur", "name": "launch_name"}
        ),
        on=["part", "correlation"],
        how="left",
    )
    df["launch_first_event"] = False
    return df


def _hta_step_filter(trace: Trace, df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """HTA's ``Trace._filter_irrelevant_gpu_kernels`` (include_last_profiler_step=False)."""
    n_names = trace.sql(
        "select count(distinct name) as n from events where name like '%ProfilerStep%'"
    )["n"].iloc[0]
    if n_names < 2:
        return df, ["HTA's last-step filter does nothing: fewer than two ProfilerStep names"]
    cpu = df[~df["gpu_filter"]]
    last = cpu[cpu["name"].str.contains("ProfilerStep", regex=False)].groupby("rank")["ts"].max()
    # a rank without a step keeps nothing (HTA compares with NaN)
    ls = df["rank"].map(last).fillna(np.iinfo(np.int64).min).to_numpy(np.int64)
    kept_cpu = ~df["gpu_filter"].to_numpy() & (df["ts"].to_numpy() < ls)
    # each device event once per kept host event with its correlation (an inner merge); host
    # events without a correlation are not in the frame, which matters only for a device
    # event with correlation −1 (an Event/Context Sync without one)
    mult = df[kept_cpu].groupby(["part", "correlation"]).size().rename("mult").reset_index()
    gpu = df[df["gpu_filter"]].merge(mult, on=["part", "correlation"], how="inner")
    gpu = gpu.loc[gpu.index.repeat(gpu["mult"])].drop(columns="mult")
    # the first event stands in for a missing launch only if the filter kept it
    lsg = gpu["rank"].map(last).fillna(np.iinfo(np.int64).min).astype(np.int64)
    gone = gpu["launch_first_event"] & ~(gpu["launch_ts"] < lsg).fillna(False)
    gpu.loc[gone, "launch_ts"] = pd.NA
    before = int(df["gpu_filter"].sum())
    out = pd.concat([gpu, df[kept_cpu]], ignore_index=True)
    return out, [
        f"HTA's last-step filter: {before - int(out['gpu_filter'].sum()):,} device events "
        "dropped (not launched by a host call before the last step's start)"
    ]


def _device_work_quirks(
    trace: Trace, ranks: Iterable[int] | None, steps: Steps, quirks: frozenset[str]
) -> DeviceWork:
    mode, step_list = _steps_mode(steps)
    notes = [
        "hta_compatible: "
        + ", ".join(q for q in QUIRKS if q in quirks)
        + " as HTA 0.5.0 does (for agreement checks; the default is exact)"
    ]
    df = hta_frame(trace, ranks, round_us="round_us" in quirks)
    if "launch_lookup" in quirks:
        df = _launch_hta(trace, df, "round_us" in quirks)
    else:
        df = _launch_ours(df)
    frame = df
    if mode == "drop_last" and "step_filter" in quirks:
        df, more = _hta_step_filter(trace, df)
        notes += more
    elif mode == "list" and "step_filter" in quirks:
        raise XpuprofError("the step_filter quirk supports steps='drop_last' or 'all' (as HTA)")
    host = df[df["hstream"] == -1] if "stream_arg" in quirks else df[~df["is_device"]]
    if "stream_arg" in quirks:
        dev = df[df["hstream"] != -1].copy()
        dev["stream"] = dev["hstream"]
    else:
        dev = df[df["is_device"]].copy()
    dev["has_launch"] = dev["launch_ts"].notna().to_numpy(bool)
    if "launch_lookup" in quirks:
        dev["launch_ts"] = dev["launch_ts"].fillna(np.iinfo(np.int64).min)
    else:
        dev["launch_ts"] = dev["launch_ts"].fillna(dev["ts"])
    dev["launch_ts"] = dev["launch_ts"].astype(np.int64)
    dev["launch_dur"] = dev["launch_dur"].fillna(0).astype(np.int64)
    if "step_filter" not in quirks and mode != "all":
        dev, more = _our_step_filter(trace, ranks, dev, mode, step_list)
        notes += more
    if "name_types" in quirks:
        dev["ktype"] = hta_kernel_type(dev["name"]).to_numpy()
    else:
        dev["ktype"] = device_kernel_type(dev["level"], dev["name"])
    dev = dev.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)
    if dev.empty:
        notes.append("no device events selected")
    return DeviceWork(_typed(dev), notes, quirks, frame=frame, host=host)


# -------------------------------------------------------------------------------- analyses


def _union(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return merge_intervals(ts, end)


def _temporal_rows(dw: DeviceWork) -> pd.DataFrame:
    rows = []
    df = dw.df
    for r, g in df.groupby("rank", sort=True):
        ts, end = g["ts"].to_numpy(), g["end"].to_numpy()
        s, e = _union(ts, end)
        span = int(e[-1] - s[0])
        busy = int((e - s).sum())
        comp = g["ktype"].to_numpy() == COMPUTATION
        cs, ce = _union(ts[comp], end[comp])
        compute = int((ce - cs).sum())
        idle = span - busy
        rows.append(
            {
                "rank": r,
                "idle_ns": idle,
                "compute_ns": compute,
                "non_compute_ns": span - compute - idle,
                "span_ns": span,
                "device_events": len(g),
            }
        )
    cols = ["rank", "idle_ns", "compute_ns", "non_compute_ns", "span_ns", "device_events"]
    out = pd.DataFrame(rows, columns=cols)
    for c in ("idle", "compute", "non_compute"):
        with np.errstate(divide="ignore", invalid="ignore"):
            out[f"{c}_pct"] = 100.0 * out[f"{c}_ns"] / out["span_ns"].replace(0, np.nan)
    out["rank"] = _out_rank(out["rank"])
    return out


def temporal_breakdown(
    trace: Trace,
    ranks: Iterable[int] | None = None,
    steps: Steps = "drop_last",
    *,
    hta_compatible: bool | Iterable[str] = False,
) -> pd.DataFrame:
    """Per rank: idle, compute and non-compute time of the device and their percentages of
    the span from the first device event's start to the last one's end (HTA's
    ``get_temporal_breakdown``; see the module docstring).

    Columns: ``rank``, ``idle_ns``, ``compute_ns``, ``non_compute_ns``, ``span_ns`` (HTA's
    "kernel_time"), ``device_events``, ``idle_pct``, ``compute_pct``, ``non_compute_pct``.
    ``steps``: ``"drop_last"`` (HTA's default), ``"all"``/``None``, or step numbers.
    Notes (what was dropped, ranks without device events) are in ``df.attrs["notes"]``.
    """
    dw = _work(trace, ranks, steps, hta_compatible)
    out = _temporal_rows(dw)
    out.attrs["notes"] = list(dw.notes)
    return out


def _type_sweep(g: pd.DataFrame, types: tuple[str, ...]) -> dict[str, int]:
    """Time during which exactly each combination of kernel types runs (HTA's
    ``_get_gpu_kernel_type_time``), each type's intervals merged first."""
    times, deltas = [], []
    for i, t in enumerate(types):
        m = g["ktype"].to_numpy() == t
        if not m.any():
            continue
        s, e = _union(g["ts"].to_numpy()[m], g["end"].to_numpy()[m])
        times += [s, e]
        deltas += [np.full(len(s), 1 << i, np.int64), np.full(len(e), -(1 << i), np.int64)]
    if not times:
        return {}
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    o = np.argsort(t, kind="stable")
    t, d = t[o], d[o]
    running = np.cumsum(d)
    seg = np.diff(t)
    mask = running[:-1]
    out: dict[str, int] = {}
    for m in np.unique(mask[mask > 0]):
        label = " overlapping ".join(ty for i, ty in enumerate(types) if m & (1 << i))
        out[label] = out.get(label, 0) + int(seg[mask == m].sum())
    return out


def _kernel_stats(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    g = df.groupby(keys, sort=False, observed=True)["dur"]
    out = g.agg(
        count="count", sum_ns="sum", mean_ns="mean", min_ns="min", max_ns="max", std_ns="std"
    ).reset_index()
    out["std_ns"] = out["std_ns"].fillna(0.0)
    return out


def _top(k: pd.DataFrame, sq: pd.DataFrame, top: int) -> pd.DataFrame:
    """Keep the ``top`` names by time per (rank, type); fold the rest into "others" with
    statistics of their kernels (count-weighted mean, pooled std)."""
    k = k.sort_values(["rank", "kernel_type", "sum_ns"], ascending=[True, True, False])
    k["_pos"] = k.groupby(["rank", "kernel_type"]).cumcount()
    k = k.merge(sq, on=["rank", "kernel_type", "name"], how="left")
    keep, rest = k[k["_pos"] < top], k[k["_pos"] >= top]
    if rest.empty:
        return keep.drop(columns=["_pos", "_sq"])
    agg = (
        rest.groupby(["rank", "kernel_type"])
        .agg(
            count=("count", "sum"),
            sum_ns=("sum_ns", "sum"),
            min_ns=("min_ns", "min"),
            max_ns=("max_ns", "max"),
            _sq=("_sq", "sum"),
        )
        .reset_index()
    )
    agg["name"] = "others"
    agg["mean_ns"] = agg["sum_ns"] / agg["count"]
    n = agg["count"].astype(float)
    var = (agg["_sq"] - n * agg["mean_ns"] ** 2) / (n - 1).where(n > 1, np.nan)
    agg["std_ns"] = np.sqrt(var.clip(lower=0)).fillna(0.0)
    return pd.concat([keep, agg], ignore_index=True).drop(columns=["_pos", "_sq"])


def _hta_aggr(g: pd.DataFrame, num_kernels: int, duration_ratio: float) -> pd.DataFrame:
    """HTA's ``_aggr_gpu_kernel_time``, quirks included (see the module docstring)."""
    t = g.groupby("name")["dur"].agg(["sum", "max", "min", "mean", "std"]).reset_index()
    t = t.sort_values("sum", ascending=False, ignore_index=True, kind="stable")
    t["std"] = t["std"].fillna(0)
    if len(t) > num_kernels:
        cs = t["sum"].cumsum()
        q = cs.quantile(duration_ratio)
        t.loc[cs > q, "name"] = "others"
        t.loc[t.index >= num_kernels, "name"] = "others"
        t = t.groupby("name")["sum"].agg(["sum", "max", "min", "mean", "std"]).reset_index()
        t["std"] = t["std"].fillna(0)
    return t


def kernel_breakdown(
    trace: Trace,
    ranks: Iterable[int] | None = None,
    steps: Steps = "drop_last",
    *,
    top: int | None = None,
    include_memory: bool = True,
    hta_compatible: bool | Iterable[str] = False,
    num_kernels: int = 10,
    duration_ratio: float = 0.8,
) -> Result:
    """Time by kernel type and by kernel (HTA's ``get_gpu_kernel_breakdown``).

    Tables:

    * ``types``: over all selected ranks, ``kernel_type`` (a type, or "A overlapping B" for
      time during which kernels of both run), ``time_ns`` and ``percentage`` of the total;
      each type's intervals are merged first, so concurrent kernels of one type count once.
      COMPUTATION, COMMUNICATION and (``include_memory``) MEMORY, as HTA.
    * ``types_by_rank``: per rank and type: ``count``, ``sum_ns`` (sum of durations),
      ``busy_ns`` (their union) and ``percentage`` of the rank's summed device time.
    * ``kernels``: per rank, type and name: ``count``, ``sum_ns``, ``mean_ns``, ``min_ns``,
      ``max_ns``, ``std_ns`` (sample, 0 for one kernel), ``percentage`` of the rank's time in
      that type; all names, or the ``top`` names per (rank, type) plus "others".

    With ``hta_compatible=True`` the ``kernels`` table is HTA's instead (its columns ``sum``,
    ``max``, ``min``, ``mean``, ``std`` in ns, ``num_kernels``/``duration_ratio`` folding).
    """
    dw = _work(trace, ranks, steps, hta_compatible)
    res = Result(notes=list(dw.notes))
    df = dw.df
    types = (COMPUTATION, COMMUNICATION) + ((MEMORY,) if include_memory else ())
    # types table
    acc: dict[str, int] = {}
    for _, g in df.groupby("rank", sort=True):
        for k, v in _type_sweep(g, types).items():
            acc[k] = acc.get(k, 0) + v
    tt = pd.DataFrame({"kernel_type": list(acc), "time_ns": list(acc.values())})
    tt = tt.sort_values("time_ns", ascending=False, ignore_index=True)
    total = tt["time_ns"].sum()
    tt["percentage"] = 100.0 * tt["time_ns"] / total if total else np.nan
    res.tables["types"] = tt
    # per rank and type
    sel = df[df["ktype"].isin(types)] if dw.quirks else df
    by = sel.groupby(["rank", "ktype"], sort=True)
    tr = by["dur"].agg(count="count", sum_ns="sum").reset_index()
    tr["busy_ns"] = [
        int(np.diff(np.vstack(_union(g["ts"].to_numpy(), g["end"].to_numpy())), axis=0).sum())
        for _, g in by
    ]
    rank_tot = tr.groupby("rank")["sum_ns"].transform("sum")
    tr["percentage"] = 100.0 * tr["sum_ns"] / rank_tot.replace(0, np.nan)
    tr = tr.rename(columns={"ktype": "kernel_type"})
    tr["rank"] = _out_rank(tr["rank"])
    res.tables["types_by_rank"] = tr
    # per kernel
    if dw.quirks:
        parts = []
        for r, g in df.groupby("rank", sort=True):
            for t in types:
                a = _hta_aggr(g[g["ktype"] == t], num_kernels, duration_ratio)
                a["kernel_type"], a["rank"] = t, r
                parts.append(a)
        cols = ["name", "sum", "max", "min", "std", "mean", "kernel_type", "rank"]
        k = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)
        k = k.sort_values(["kernel_type", "name", "rank"], ignore_index=True)
    else:
        sel = df.rename(columns={"ktype": "kernel_type"})
        k = _kernel_stats(sel, ["rank", "kernel_type", "name"])
        if top is not None:
            sq = (
                sel.assign(_sq=sel["dur"].astype(float) ** 2)
                .groupby(["rank", "kernel_type", "name"], observed=True)["_sq"]
                .sum()
                .reset_index()
            )
            k = _top(k, sq, int(top))
        tot = k.groupby(["rank", "kernel_type"])["sum_ns"].transform("sum")
        k["percentage"] = 100.0 * k["sum_ns"] / tot.replace(0, np.nan)
        k = k.sort_values(
            ["rank", "kernel_type", "sum_ns"], ascending=[True, True, False], ignore_index=True
        )
        k["name"] = k["name"].astype(str)
    k["rank"] = _out_rank(k["rank"])
    res.tables["kernels"] = k
    if df.empty:
        res.notes.append("no device events: kernel breakdown is empty")
    return res


def comm_overlap(
    trace: Trace,
    ranks: Iterable[int] | None = None,
    steps: Steps = "drop_last",
    *,
    hta_compatible: bool | Iterable[str] = False,
) -> pd.DataFrame:
    """Per rank: how much of the communication time computation runs alongside (HTA's
    ``get_comm_comp_overlap``): ``comm_ns`` (union of communication kernels), ``compute_ns``
    (union of computation kernels), ``overlap_ns`` (their intersection), ``overlap_ratio``
    = overlap ÷ comm and ``overlap_pct``. A rank without communication has NaN ratio (and a
    note in ``df.attrs["notes"]``)."""
    dw = _work(trace, ranks, steps, hta_compatible)
    notes = list(dw.notes)
    rows = []
    for r, g in dw.df.groupby("rank", sort=True):
        kt = g["ktype"].to_numpy()
        ts, end = g["ts"].to_numpy(), g["end"].to_numpy()
        comm = _union(ts[kt == COMMUNICATION], end[kt == COMMUNICATION])
        comp = _union(ts[kt == COMPUTATION], end[kt == COMPUTATION])
        comm_ns = int((comm[1] - comm[0]).sum())
        comp_ns = int((comp[1] - comp[0]).sum())
        ov = intersection_length(comm, comp)
        if comm_ns == 0:
            notes.append(f"{_rank_name(r)}: no communication kernels, overlap undefined")
        rows.append(
            {
                "rank": r,
                "comm_ns": comm_ns,
                "compute_ns": comp_ns,
                "overlap_ns": ov,
                "overlap_ratio": ov / comm_ns if comm_ns else np.nan,
            }
        )
    out = pd.DataFrame(
        rows, columns=["rank", "comm_ns", "compute_ns", "overlap_ns", "overlap_ratio"]
    )
    out["overlap_pct"] = 100.0 * out["overlap_ratio"]
    out["rank"] = _out_rank(out["rank"])
    out.attrs["notes"] = notes
    return out


def breakdown(
    trace: Trace,
    ranks: Iterable[int] | None = None,
    steps: Steps = "drop_last",
    *,
    top: int | None = 10,
    hta_compatible: bool | Iterable[str] = False,
) -> Result:
    """The temporal breakdown, kernel-type breakdown and comm/compute overlap as one
    :class:`Result` (tables ``temporal``, ``types``, ``types_by_rank``, ``kernels`` with the
    ``top`` kernels per rank and type, ``overlap``), over one selection of device work."""
    tb = temporal_breakdown(trace, ranks, steps, hta_compatible=hta_compatible)
    kb = kernel_breakdown(trace, ranks, steps, top=top, hta_compatible=hta_compatible)
    ov = comm_overlap(trace, ranks, steps, hta_compatible=hta_compatible)
    notes = list(dict.fromkeys([*tb.attrs["notes"], *kb.notes, *ov.attrs["notes"]]))
    tables = {"temporal": tb, **kb.tables, "overlap": ov}
    for df in tables.values():
        df.attrs = {}
    return Result(tables=tables, notes=notes)

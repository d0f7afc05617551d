"""HTA 0.5.0's way of selecting device work, behaviour by behaviour (:data:`QUIRKS`), for
``hta_compatible``: the numbers of Holistic Trace Analysis reproduced, rounding and quirks
included, so that the tests can show which of HTA's behaviours explains each difference
between its numbers and ours (see :mod:`xpuprof.analysis.breakdown` for the differences).

HTA's name-based kernel types (:func:`hta_kernel_type`, the ``name_types`` quirk) are kept
here as the documented variant of :func:`xpuprof.analysis.common.kernel_type`, which types
device work by level.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import (
    COMMUNICATION,
    COMPUTATION,
    DEVICE_LEVELS,
    MEMORY,
    OTHER,
    kernel_type,
)
from xpuprof.analysis.device import (
    NO_RANK,
    QUIRKS,
    DeviceWork,
    quirk_set,
    rank_filter,
    step_filter,
    typed,
)
from xpuprof.core.errors import XpuprofError

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

__all__ = ["QUIRKS", "quirk_set", "hta_kernel_type", "hta_frame", "hta_device_work"]

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


# ---------------------------------------------------------------------- HTA-compatible path


def hta_rounds(trace: Trace) -> dict[int, bool]:
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


def hta_round(ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
          and category <> 'Trace' and {rank_filter(ranks)}
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
        rounds = hta_rounds(trace)
        mask = df["part"].map(rounds).fillna(False).to_numpy(bool)
        if mask.any():
            rts, rdur = hta_round(ts[mask], dur[mask])
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


def launch_hta(trace: Trace, df: pd.DataFrame, round_us: bool) -> pd.DataFrame:
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
            rounds = hta_rounds(trace)
            m = first["part"].map(rounds).fillna(False).to_numpy(bool)
            r_ts, _ = hta_round(ts0, dur0)
            ts0 = np.where(m, r_ts, ts0)
        fts = dict(zip(first["part"].tolist(), ts0.tolist(), strict=True))
        orphan = df["gpu_filter"] & df["launch_ts"].isna() & (df["correlation"] >= 0)
        df.loc[orphan, "launch_ts"] = df.loc[orphan, "part"].map(fts).astype("Int64")
        df["launch_first_event"] = (orphan & df["launch_ts"].notna()).to_numpy(bool)
    return df


def launch_ours(df: pd.DataFrame) -> pd.DataFrame:
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


def hta_step_filter(trace: Trace, df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
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


def hta_device_work(
    trace: Trace,
    ranks: Iterable[int] | None,
    mode: str,
    step_list: list[int] | None,
    quirks: frozenset[str],
) -> DeviceWork:
    """Device work selected with the given HTA behaviours switched on (``mode``/``step_list``
    as :func:`xpuprof.analysis.common.step_mode` gives them)."""
    notes = [
        "hta_compatible: "
        + ", ".join(q for q in QUIRKS if q in quirks)
        + " as HTA 0.5.0 does (for agreement checks; the default is exact)"
    ]
    df = hta_frame(trace, ranks, round_us="round_us" in quirks)
    if "launch_lookup" in quirks:
        df = launch_hta(trace, df, "round_us" in quirks)
    else:
        df = launch_ours(df)
    frame = df
    if mode == "drop-last" and "step_filter" in quirks:
        df, more = hta_step_filter(trace, df)
        notes += more
    elif mode == "list" and "step_filter" in quirks:
        raise XpuprofError("the step_filter quirk supports steps='drop-last' or 'all' (as HTA)")
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
        dev, more = step_filter(trace, ranks, dev, mode, step_list)
        notes += more
    if "name_types" in quirks:
        dev["ktype"] = hta_kernel_type(dev["name"]).to_numpy()
    else:
        dev["ktype"] = kernel_type(dev["level"], dev["name"]).to_numpy()
    dev = dev.sort_values(["rank", "ts"], kind="stable").reset_index(drop=True)
    if dev.empty:
        notes.append("no device events selected")
    return DeviceWork(typed(dev), notes, quirks, frame=frame, host=host)

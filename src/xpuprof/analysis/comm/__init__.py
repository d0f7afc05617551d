"""Communication: one row per collective with its bus bandwidth and its overlap with compute,
and — for several ranks — how far apart the ranks arrive at the same collective. A collective
is a device kernel (NCCL/RCCL, XLA) or, on a rank with none (a CPU gloo job), a host span:
``host`` says which spans (gloo's worker spans measure the collective, the ``c10d::`` op on
the calling thread only enqueues it) and column ``where`` says which it is.

The tool is :func:`collectives`; its parts are ``kinds`` (what a collective is, from names and
args), ``host`` (the host spans that are collectives, one of each nest), ``identify`` (each
collective's type, size and group, from the first source that says),
``overlap`` (comm under compute, HTA's comm/compute overlap) and ``skew`` (collectives matched
across ranks, clock alignment, stragglers). ``docs/comm.md`` defines every number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.comm.host import host_collectives
from xpuprof.analysis.comm.identify import KERNEL_ARGS_SQL, Identity, identify
from xpuprof.analysis.comm.kinds import (
    ALGORITHMS,
    BUSBW_FACTOR,
    COMM_DTYPE_SIZE,
    PROTOCOLS,
    WHOLE_GROUP,
    XLA_SIZE,
    busbw_factor,
    kernel_parts,
    normalize_collective,
)
from xpuprof.analysis.comm.overlap import OVERLAP_COLUMNS, overlap
from xpuprof.analysis.comm.skew import ALIGN, skew
from xpuprof.analysis.common import Result, merge_intervals, missing_ranks_note, where_clause
from xpuprof.core.errors import XpuprofError
from xpuprof.core.text import human_time

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.analysis.common import StepSelection
    from xpuprof.trace.trace import Trace

__all__ = [
    "ALGORITHMS",
    "BUSBW_FACTOR",
    "COLUMNS",
    "COMM_DTYPE_SIZE",
    "LATE_FLOOR_NS",
    "PROTOCOLS",
    "SUMMARY_COLUMNS",
    "WHOLE_GROUP",
    "XLA_SIZE",
    "collective_waits",
    "collectives",
    "headline",
    "kernel_parts",
    "normalize_collective",
]

COLUMNS = ["rank", "part", "participant", "where", "device", "stream", "id", "ts", "dur",
           "collective",
           "type_source", "algorithm", "protocol", "dtype", "bytes", "bytes_source",
           "group_size", "group_ranks", "process_group", "seq", "algbw", "busbw_factor", "busbw",
           "overlap_ns", "overlap_pct", "name"]  # fmt: skip
SUMMARY_COLUMNS = ["participant", "rank", "collective", "count", "bytes", "time_ns", "algbw",
                   "busbw", "overlap_pct", "algorithms", "protocols"]  # fmt: skip

#: How late a participant must arrive, on average, for the headline to name it as the
#: straggler: below this, arriving last is noise (launch jitter, clock alignment error).
LATE_FLOOR_NS = 50_000
#: The collectives' per-rank half goes to a cluster of its own (one not started already for
#: the tool) only from this many events: in one pass DuckDB keeps ~1.3 cores busy, so two
#: workers gain ~1.46x, which pays a cluster's start (~1.7 s here) from ~7 M events (64
#: ranks, 2.5 M: 1.9 s in one pass against 3.0 s on two workers; 512 ranks, 20 M: 16.2 s
#: against 11.1 s).
DASK_MIN_EVENTS_ALONE = 8_000_000


def collectives(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    align: str = "auto",
) -> Result:
    """Collectives with their bandwidth and overlap, per-participant summaries, and cross-rank
    skew (``docs/comm.md``).

    Tables: ``collectives`` (one row per collective kernel), ``summary`` (per participant and
    type), ``overlap`` (per participant: HTA's comm/compute overlap), and for several
    participants ``clock`` (the offsets applied), ``skew`` (one row per matched collective) and
    ``stragglers`` (per participant). ``align``: ``"auto"``, ``"none"`` or ``"end"``. ``steps``
    keeps the collectives and compute kernels of those profiler steps (a device event's step is
    its launch's); ``steps="drop-last"`` is HTA's window. Facts: ``headline``
    (:func:`headline`), when there is collective time.
    """
    if align not in ALIGN:
        raise XpuprofError(f"align={align!r}: expected 'auto', 'none' or 'end'")
    where = where_clause(ranks=ranks, steps=steps)
    # the diagnosis, the advisor and the comm tool ask the same question of one trace: answer
    # it once (each caller gets its own Result around the shared, read-only tables)
    key = ("analysis.comm.collectives", where, align)
    if key not in trace.memo:
        trace.memo[key] = _collectives(trace, where, align, ranks)
    res = trace.memo[key]
    return Result(tables=dict(res.tables), notes=list(res.notes), facts=dict(res.facts))


def _collectives(trace: Trace, where: str, align: str, ranks: Iterable[int] | None) -> Result:
    """:func:`collectives` of the events ``where`` selects (of the ranks ``ranks``): each
    rank's collectives identified and measured by :func:`part_collectives` — by groups of
    ranks, as Dask tasks on many ranks (``analysis.per_rank``) — then labelled and matched
    across ranks here."""
    pieces = _per_rank_half(trace, where, ranks)
    if not pieces:
        return _empty()
    out = pd.concat([p.table for p in pieces], ignore_index=True)  # groups in part order
    participant, shared_rank = _participants(out)
    out["participant"] = participant
    out["seq"] = out.groupby(["participant", "process_group"]).cumcount()
    overlap_table = pd.concat([p.overlap for p in pieces], ignore_index=True)
    label = dict(zip(zip(out["part"], out["device"], strict=True), participant, strict=True))
    overlap_table["participant"] = [label.get((p, d)) for p, d in
                                    zip(overlap_table["part"], overlap_table["device"],
                                        strict=True)]  # fmt: skip
    tables = {
        "collectives": out[COLUMNS],
        "summary": _summary(out),
        "overlap": overlap_table[OVERLAP_COLUMNS],
    }
    notes = _notes(sum(p.assumed_world for p in pieces), out, shared_rank)
    absent = missing_ranks_note(trace)
    if absent:
        notes.insert(0, absent)
    if not shared_rank:
        skew_tables, skew_notes = skew(trace, out, align)
        late = skew_tables.pop("late", None)
        if late is not None:  # each collective's lateness behind its first participant
            tables["collectives"] = tables["collectives"].assign(late_ns=late)
        tables.update(skew_tables)
        notes += skew_notes
    line = headline(tables)
    return Result(tables=tables, notes=notes, facts={"headline": line} if line else {})


def _per_rank_half(trace: Trace, where: str, ranks: Iterable[int] | None) -> list[PartCollectives]:
    """:func:`part_collectives` of the selected ranks, by groups on Dask for many ranks
    (``analysis.per_rank``), else in one pass; cached on the trace (every alignment shares
    it)."""
    from xpuprof.analysis import per_rank

    key = ("analysis.comm.part_collectives", where)
    if key in trace.memo:
        return trace.memo[key]
    parts = sorted(per_rank.selected_parts(trace, ranks))
    # on one worker, one pass: identify's host trees are built per group of parts already
    # (bounded memory), and groups opened one by one here cost more than they save; by
    # default on Dask only from DASK_MIN_EVENTS_ALONE events, unless a cluster is up already
    least = None if per_rank.cluster_up() else DASK_MIN_EVENTS_ALONE
    events = per_rank.events_of(trace, parts)
    if per_rank.on_dask(len(parts), events=events, min_events=least) and (
        _one_part_per_rank(trace)
    ):
        pieces = per_rank.map_groups(trace, f"{__name__}:part_collectives", parts,
                                     kwargs={"where": where},
                                     seeds=lambda groups: [{} for _ in groups])  # fmt: skip
    else:
        pieces = [part_collectives(trace, where)]
    trace.memo[key] = [p for p in pieces if p is not None]
    return trace.memo[key]


def _one_part_per_rank(trace: Trace) -> bool:
    """Whether no rank is recorded by several parts (then the ranks' halves are independent:
    ``steps="drop-last"`` looks for a rank's last step in its own part)."""
    ranks = [s["rank"] for s in trace.sources if s["rank"] is not None]
    return len(ranks) == len(set(ranks))


@dataclass
class PartCollectives:
    """The per-rank half of :func:`collectives` for some parts: their collectives table
    without ``participant`` and ``seq`` (which need every rank), its overlap columns filled,
    the per-(part, device) overlap rows, and how many groups were assumed to be the world."""

    table: pd.DataFrame
    overlap: pd.DataFrame
    assumed_world: int


def part_collectives(trace: Trace, where: str) -> PartCollectives | None:
    """Each collective of the parts ``trace`` holds (``where`` selects events), identified
    (``identify``) and measured (bandwidth, overlap with compute); None when there is none.
    The answers for consecutive groups of parts concatenate into the answer for all."""
    cols = ("id, part, rank, device, stream, name, category, ts, dur, bytes, correlation, "
            + KERNEL_ARGS_SQL)  # fmt: skip
    df = trace.sql(
        f"""select {cols} from events where {where} and level = 'collective'
            and dur is not null order by part, device, ts"""
    )
    host = host_collectives(trace, where, cols)
    if len(host):
        df = pd.concat([df.assign(on_host=False), host.assign(on_host=True)], ignore_index=True)
        df = df.sort_values(["part", "device", "ts", "id"], kind="stable", ignore_index=True)
    else:
        df = df.assign(on_host=False)
    if df.empty:
        return None
    ident = identify(trace, df)
    out = _table(df, ident)
    on_dev = ~df["on_host"].to_numpy(bool)
    per_kernel = np.full(len(out), np.nan)
    per_kernel[on_dev], overlap_table = overlap(trace, out[on_dev], where)
    out["overlap_ns"] = per_kernel
    with np.errstate(divide="ignore", invalid="ignore"):
        out["overlap_pct"] = np.where(out["dur"] > 0, 100 * per_kernel / out["dur"], np.nan)
    return PartCollectives(out, overlap_table, ident.assumed_world)


def headline(tables: dict[str, pd.DataFrame]) -> str | None:
    """The communication in one sentence (from :func:`collectives`' tables): time in
    collectives per participant, calls, the largest type's share, the share hidden under
    compute, and — with more than two participants — the one last to arrive at half the
    collectives or more, when it is at least :data:`LATE_FLOOR_NS` late on average."""
    s = tables.get("summary")
    if s is None or not len(s) or not s.time_ns.sum():
        return None
    n = s.participant.nunique()
    by = s.groupby("collective").time_ns.sum().sort_values(ascending=False)
    who = "rank" if s["rank"].notna().all() else "participant"
    busy = _busy_ns(tables.get("collectives"))
    summed = s.time_ns.sum() / n
    per = busy / n if busy is not None else summed
    line = (f"Collectives take {human_time(per)} per {who} "
            f"({int(s['count'].sum() / n):,} calls; {by.index[0]} {by.iloc[0] / by.sum():.0%} "
            "of their summed time")  # fmt: skip
    if busy is not None and summed > 1.05 * per:
        line += (f"; they overlap: {human_time(summed)} summed, counted once while several "
                 "run at a time")  # fmt: skip
    line += ")"
    o = tables.get("overlap")
    if o is not None and len(o) and o.comm_time_ns.sum():
        line += f", {o.overlapped_ns.sum() / o.comm_time_ns.sum():.0%} hidden under compute"
    st = tables.get("stragglers")
    if st is not None and len(st) and n > 2:
        last = st.loc[st.times_last.idxmax()]
        if last.share_last_pct >= 50 and last.mean_late_ns >= LATE_FLOOR_NS:
            name = f"rank {last['rank']}" if who == "rank" else str(last.participant)
            line += (f"; {name} is the last to arrive at {int(last.times_last)} of "
                     f"{int(last.collectives)} collectives ({human_time(last.mean_late_ns)} "
                     "late on average)")  # fmt: skip
    return line


def _busy_ns(coll: pd.DataFrame | None) -> float | None:
    """Total time some collective runs, per participant summed: concurrent collectives (gloo's
    two worker threads, several NCCL streams) count once."""
    if coll is None or not len(coll):
        return None
    total = 0
    for _, g in coll.groupby("participant", sort=False):
        a, z = merge_intervals(g["ts"].to_numpy(np.int64), (g["ts"] + g["dur"]).to_numpy(np.int64))
        total += int((z - a).sum())
    return float(total)


WAIT_COLUMNS = ["part", "rank", "participant", "where", "id", "ts", "dur", "collective",
                "process_group", "seq", "wait_ns", "last_participant", "last_rank"]  # fmt: skip


def collective_waits(trace: Trace) -> pd.DataFrame:
    """Per collective kernel, when several participants recorded it: how long it waited at its
    start for the last participant to arrive (``wait_ns``: the last participant's aligned
    start minus its own, clipped to [0, dur]; ``docs/comm.md``), and who that was. Every
    collective of the store (cached on the trace); empty for one participant."""
    key = ("analysis.comm.collective_waits",)
    if key in trace.memo:
        return trace.memo[key]
    out = pd.DataFrame(columns=WAIT_COLUMNS)
    if len(trace.sources) >= 2:  # (no query of every rank's events for the parts here)
        res = collectives(trace)
        coll = res.tables["collectives"]
        if coll["part"].nunique() >= 2 and "skew" in res.tables and len(res.tables["skew"]):
            out = _waits(coll, res.tables["clock"], res.tables["skew"])
    trace.memo[key] = out
    return out


def _waits(coll: pd.DataFrame, clock: pd.DataFrame, sk: pd.DataFrame) -> pd.DataFrame:
    offset = coll["participant"].map(dict(zip(clock["participant"], clock["offset_ns"],
                                              strict=True))).fillna(0)  # fmt: skip
    m = coll.assign(ats=coll["ts"] - offset).merge(
        sk[["process_group", "seq", "last_start", "last_participant"]],
        on=["process_group", "seq"], how="inner")  # fmt: skip
    wait = np.clip((m["last_start"] - m["ats"]).to_numpy(np.float64), 0,
                   m["dur"].to_numpy(np.float64))  # fmt: skip
    ranks = coll.drop_duplicates("participant").set_index("participant")["rank"]
    return pd.DataFrame({
        "part": m["part"].to_numpy(), "rank": m["rank"], "participant": m["participant"],
        "where": m["where"].to_numpy(object),
        "id": m["id"].to_numpy(), "ts": m["ts"].to_numpy(), "dur": m["dur"].to_numpy(),
        "collective": m["collective"], "process_group": m["process_group"],
        "seq": m["seq"].to_numpy(), "wait_ns": wait.astype(np.int64),
        "last_participant": m["last_participant"],
        "last_rank": m["last_participant"].map(ranks).astype("Int64"),
    })  # fmt: skip


def _participants(df: pd.DataFrame) -> tuple[np.ndarray, bool]:
    """Who takes part in each collective: its rank, or ``part N`` without one, with `` dev D``
    when one source holds several devices' collectives. A rank recorded by several sources (a
    store holding two jobs, or two captures of one rank) is not one participant: it is labelled
    with its source then, and the second value is True (no cross-rank skew is computed)."""
    rank = df["rank"]
    shared_rank = bool((df.dropna(subset=["rank"]).groupby("rank")["part"].nunique() > 1).any())
    on_dev = (df["where"] == "device").to_numpy(bool)
    multi_dev = bool(on_dev.any()) and df[on_dev].groupby("part")["device"].nunique().max() > 1
    rank_str = rank.astype("string").fillna("").to_numpy(object)
    part_str = df["part"].astype(str).to_numpy(object)
    label = np.where(
        rank.isna().to_numpy(),
        "part " + part_str,
        (rank_str + " (part " + part_str + ")") if shared_rank else rank_str,
    )
    if multi_dev:  # (a host collective stays its rank's: it runs on no device)
        dev = " dev " + df["device"].to_numpy().astype(str).astype(object)
        label = np.where(on_dev, label + dev, label)
    return label.astype(object), shared_rank


def _table(df: pd.DataFrame, ident: Identity) -> pd.DataFrame:
    """The collectives table (overlap columns, the participant and ``seq`` — its position in
    its participant's process group, what matches it across ranks — added by the callers):
    identity, algbw = bytes / duration, busbw = algbw × nccl-tests' factor."""
    dur = df["dur"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(dur > 0, ident.nbytes / (dur * 1e-9), np.nan)
    factor = np.array([busbw_factor(k, g) for k, g in zip(ident.kind, ident.group, strict=True)])
    group = ident.group
    out = pd.DataFrame(
        {
            "rank": df["rank"].astype("Int64"),
            "part": df["part"].to_numpy(),
            "where": np.where(df["on_host"].to_numpy(bool), "host", "device"),
            "device": df["device"].to_numpy(),
            "stream": df["stream"],
            "id": df["id"],
            "ts": df["ts"],
            "dur": df["dur"],
            "collective": ident.kind,
            "type_source": ident.kind_source,
            "algorithm": ident.algorithm,
            "protocol": ident.protocol,
            "dtype": ident.dtype,
            "bytes": ident.nbytes,
            "bytes_source": ident.bytes_source,
            "group_size": pd.array(np.where(np.isnan(group), None, group), dtype="Int64"),
            "group_ranks": ident.group_ranks,
            "process_group": ident.process_group,
            "algbw": algbw,
            "busbw_factor": factor,
            "busbw": algbw * factor,
            "name": df["name"].to_numpy(object),
        }
    )
    return out


def _summary(out: pd.DataFrame) -> pd.DataFrame:
    """Per participant and collective type: count, bytes, time, bandwidth over the collectives
    of known size, overlap, and the algorithms and protocols seen."""
    known = out["bytes"].notna()
    g = (
        out.assign(
            b=out["bytes"],
            bb=out["bytes"] * out["busbw_factor"],
            tb=out["dur"].where(known),  # time of the collectives whose size is known
        )
        .groupby(["participant", "collective"], dropna=False)
        .agg(
            rank=("rank", "first"),
            count=("id", "size"),
            bytes=("b", lambda x: x.sum(min_count=1)),
            time_ns=("dur", "sum"),
            sized_time_ns=("tb", "sum"),
            bus_bytes=("bb", lambda x: x.sum(min_count=1)),
            overlap_ns=("overlap_ns", "sum"),
            algorithms=("algorithm", lambda s: ",".join(sorted({str(x) for x in s if x}))),
            protocols=("protocol", lambda s: ",".join(sorted({str(x) for x in s if x}))),
        )
        .reset_index()
    )
    t = g["sized_time_ns"] * 1e-9
    with np.errstate(divide="ignore", invalid="ignore"):
        g["algbw"] = np.where(t > 0, g["bytes"] / t, np.nan)
        g["busbw"] = np.where(t > 0, g["bus_bytes"] / t, np.nan)
        g["overlap_pct"] = np.where(g["time_ns"] > 0, 100 * g["overlap_ns"] / g["time_ns"],
                                    np.nan)  # fmt: skip
    return g[SUMMARY_COLUMNS]


def _notes(assumed_world: int, out: pd.DataFrame, shared_rank: bool) -> list[str]:
    """What the tables cannot say: assumed groups, unknown sizes and types, repeated ranks."""
    notes = []
    if assumed_world:
        notes.append(
            f"{assumed_world} collectives carry no group size or process group: their "
            "group is assumed to be the whole world (distributedInfo.world_size)."
        )
    unsized = int(out["bytes"].isna().sum())
    if unsized:
        notes.append(
            f"{unsized} collectives have no known size (no msg nelems on the kernel or its host "
            "op, no shapes): no algbw/busbw for them."
        )
    unknown = int((out["collective"] == "unknown").sum())
    if unknown:
        notes.append(
            f"{unknown} collectives are of unknown type (e.g. ncclDevKernel_Generic without "
            "host args): no busbw factor."
        )
    if shared_rank:
        notes.append(
            "several sources record the same rank (the store holds more than one job, or "
            "several captures of a rank): participants are labelled by source and no cross-rank "
            "skew is computed; import one job per store to compare its ranks."
        )
    return notes


def _empty() -> Result:
    return Result(
        tables={
            "collectives": pd.DataFrame(columns=COLUMNS),
            "summary": pd.DataFrame(columns=SUMMARY_COLUMNS),
            "overlap": pd.DataFrame(columns=OVERLAP_COLUMNS),
        },
        notes=[
            "no collectives in the trace (no NCCL/RCCL kernels, XLA collectives, or gloo/c10d "
            "host collectives): nothing to report for communication."
        ],
    )

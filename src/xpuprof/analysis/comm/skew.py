"""How far apart the participants (ranks, or the devices of one host) arrive at the same
collective, and who the others wait for: collectives matched across participants by order in
their process group, clocks aligned on collective ends where hosts differ (``docs/comm.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.analysis.comm.clocks import notes as clock_notes
from xpuprof.analysis.comm.clocks import solve
from xpuprof.analysis.comm.kinds import WHOLE_GROUP

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

__all__ = ["ALIGN", "SKEW_COLUMNS", "STRAGGLER_COLUMNS", "skew"]

#: Clock alignments: ``auto`` (none on one host, else end), ``none``, ``end``.
ALIGN = ("auto", "none", "end")

SKEW_COLUMNS = ["process_group", "seq", "collective", "participants", "bytes", "skew_ns",
                "end_skew_ns", "first_participant", "last_participant", "first_start",
                "last_start", "types_agree"]  # fmt: skip
STRAGGLER_COLUMNS = ["participant", "rank", "collectives", "times_last", "share_last_pct",
                     "times_first", "mean_late_ns", "mean_wait_ns", "total_wait_ns"]  # fmt: skip


def skew(trace: Trace, out: pd.DataFrame, align: str) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """Tables ``clock``, ``skew`` and ``stragglers``, and the series ``late`` (each row's
    lateness, :func:`late_ns`) for the collectives table ``out`` (with its
    ``participant``, ``process_group`` and ``seq`` columns), and the notes to read with them.
    No tables for fewer than two participants."""
    if out["participant"].nunique() < 2:
        return {}, ["one participant (rank/device): no cross-rank skew to compute."]
    notes = _uneven(out)
    order = _participant_order(out)
    clock, cnotes = _clock(trace, out, order, align)
    notes += cnotes
    # participants whose clock could not be aligned are not compared (their collectives
    # match none anyway: nothing is lost but a comparison on a raw clock)
    lost = set(clock.loc[clock["status"] == "unmatched", "participant"])
    out = out[~out["participant"].isin(lost)]
    shift = out["participant"].map(dict(zip(clock["participant"], clock["offset_ns"], strict=True)))
    shift = shift.astype(np.int64)
    adjusted = out.assign(ats=out["ts"] - shift, aend=out["ts"] - shift + out["dur"])
    matched = _match(adjusted)
    disagree = int((~matched["types_agree"]).sum())
    if disagree:
        notes.append(
            f"{disagree} matched collectives have different types on different participants: the "
            "order of collectives differs between ranks (or a capture window is shifted); their "
            "skew is not meaningful."
        )
    tables = {
        "clock": clock,
        "skew": matched[SKEW_COLUMNS],
        "stragglers": _stragglers(adjusted, matched),
        "late": late_ns(adjusted, matched),
    }
    return tables, notes


def late_ns(adjusted: pd.DataFrame, matched: pd.DataFrame) -> pd.Series:
    """Per collective row of ``adjusted`` (same index): how long after the first participant
    it started, on aligned clocks (its aligned start − the matched collective's earliest
    start); NaN for a row matched with no other."""
    first = matched.set_index(["process_group", "seq"])["first_start"].astype("Int64")
    keys = pd.MultiIndex.from_frame(adjusted[["process_group", "seq"]])
    # integers: a float64 of a ~1.7e18 ns timestamp is off by up to 128 ns
    start = adjusted["ats"].round().astype("Int64").to_numpy()
    late = pd.array(start - first.reindex(keys).to_numpy(), dtype="Int64")
    return pd.Series(late, index=adjusted.index).astype("float64")


def _uneven(out: pd.DataFrame) -> list[str]:
    """A note when participants recorded different numbers of collectives in a group."""
    counts = out.groupby(["process_group", "participant"]).size().unstack(fill_value=0)
    uneven = [g for g, row in counts.iterrows() if row[row > 0].nunique() > 1]
    if not uneven:
        return []
    return [
        "participants recorded different numbers of collectives in process group(s) "
        f"{', '.join(map(str, uneven))}: collectives are matched by order from the first, "
        "so a capture window that starts at a different collective shifts the match."
    ]


def _participant_order(out: pd.DataFrame) -> list[Any]:
    """Participants by rank, then label; the first is the clock reference."""
    return (
        out.drop_duplicates("participant")
        .assign(_r=lambda d: d["rank"].astype("Float64").fillna(np.inf))
        .sort_values(["_r", "participant"])["participant"]
        .tolist()
    )


def _clock(
    trace: Trace, out: pd.DataFrame, order: list[Any], align: str
) -> tuple[pd.DataFrame, list[str]]:
    """Each participant's clock offset to its reference and how it was found
    (:mod:`xpuprof.analysis.comm.clocks`): none when every participant is on one host (one
    clock) or ``align='none'``; else ``end``: the offsets that make the ends of the matched
    collectives agree, solved over all of them at once. A clock belongs to a part (a source
    file: one process on one host), so the devices of one part share its offset."""
    hosts = {int(s["part"]): s.get("host") for s in trace.meta["sources"]}
    first = out.drop_duplicates("participant").set_index("participant")
    part = first["part"].reindex(order)
    phost = part.map(hosts)
    one_clock = bool(phost.notna().all() and phost.nunique() == 1) or out["part"].nunique() == 1
    method = ("none" if one_clock else "end") if align == "auto" else align
    parts = list(dict.fromkeys(int(p) for p in part))  # in participant order: ref first
    sol = solve(_ends(out), order=parts).set_index("participant")
    ref_of: dict[int, Any] = {}  # part → its first participant
    for p, pp in zip(part, order, strict=True):
        ref_of.setdefault(int(p), pp)
    row = sol.reindex([int(p) for p in part])
    clock = pd.DataFrame(
        {
            "participant": order,
            "part": part.to_numpy(np.int64),
            "host": phost.to_numpy(object),
            "offset_ns": row["offset_ns"].to_numpy(),
            "residual_ns": row["residual_ns"].to_numpy(),
            "residual_p95_ns": row["residual_p95_ns"].to_numpy(),
            "method": method,
            "collectives_used": row["collectives_used"].to_numpy(np.int64),
            "component": row["component"].to_numpy(),
            "reference": [ref_of.get(r) if pd.notna(r) else None for r in row["reference"]],
            "status": row["status"].to_numpy(object),
        }
    )
    for col in ("offset_ns", "residual_ns", "residual_p95_ns", "component"):
        clock[col] = pd.array(clock[col].tolist(), dtype="Int64")
    _own_clock(clock, _matched(out))
    if method == "end":
        notes = clock_notes(clock)
        notes.append(
            "hosts differ or are unknown, so clocks may differ: each part's clock is shifted so "
            "that the ends of the collectives it shares with others agree (one solve over all "
            "matched collectives; see the clock table for offsets and residuals). Skew is "
            "measured on starts after that shift."
        )
        return clock, notes
    # one clock (or asked for none): times compared as recorded
    clock["offset_ns"] = pd.array([0] * len(clock), dtype="Int64")
    clock["residual_ns"] = clock["residual_p95_ns"] = pd.array([pd.NA] * len(clock), "Int64")
    clock["reference"] = order[0]
    clock["status"] = np.where(clock["status"] == "unmatched", "unmatched", "recorded")
    why = "all come from one host (one clock)." if one_clock else "align='none' was asked for."
    notes = [n for n in clock_notes(clock) if n.startswith("no collective")]
    return clock, [*notes, "ranks compared on their recorded clocks: " + why]


def _own_clock(clock: pd.DataFrame, matched: set[Any]) -> None:
    """A part whose collectives match only within itself (the devices of one host, and no
    other host's) is its own reference: offset 0, a group of its own, compared within."""
    alone = (clock["status"] == "unmatched") & clock["participant"].isin(matched)
    if not alone.any():
        return
    last = clock["component"].max()
    start = 0 if pd.isna(last) else int(last) + 1
    parts = clock.loc[alone, "part"].drop_duplicates().tolist()
    first = clock[alone].drop_duplicates("part").set_index("part")["participant"]
    for i, p in enumerate(parts):
        mine = alone & (clock["part"] == p)
        clock.loc[mine, ["offset_ns", "component"]] = [0, start + i]
        clock.loc[mine, "reference"] = first[p]
        clock.loc[mine, "status"] = "reference"


def _matched(out: pd.DataFrame) -> set[Any]:
    """The participants with a collective (of one type everywhere) seen by another."""
    key = out["process_group"].astype(str) + "#" + out["seq"].astype(str)
    g = out.groupby(key)
    ok = (g["participant"].transform("nunique") >= 2) & (g["collective"].transform("nunique") == 1)
    return set(out.loc[ok, "participant"])


def _ends(out: pd.DataFrame) -> pd.DataFrame:
    """The solver's input: per collective row, its part (the clock), the matched collective
    (process group and position in it) and its end; collectives whose type differs between
    participants (the order differs: not the same collective) are left out."""
    key = out["process_group"].astype(str) + "#" + out["seq"].astype(str)
    agree = out.groupby(key)["collective"].transform("nunique") == 1
    return pd.DataFrame(
        {
            "participant": out["part"].astype(np.int64),
            "key": key,
            "end": (out["ts"] + out["dur"]).astype(np.int64),
            "whole": out["collective"].isin(WHOLE_GROUP),
        }
    )[agree.to_numpy()]


def _match(m: pd.DataFrame) -> pd.DataFrame:
    """One row per collective matched across participants (same process group, same ``seq``)
    with two or more participants: its skew (latest − earliest start, on aligned clocks
    ``ats``/``aend``), who came first and last."""
    grp = m.groupby(["process_group", "seq"], sort=True)
    agg = grp.agg(
        types=("collective", "nunique"),
        participants=("participant", "nunique"),
        first_start=("ats", "min"),
        last_start=("ats", "max"),
        first_end=("aend", "min"),
        last_end=("aend", "max"),
        bytes=("bytes", "max"),
    )
    agg.insert(0, "collective", _modes(m, agg.index))
    agg["first_participant"] = m.loc[grp["ats"].idxmin().to_numpy(), "participant"].to_numpy()
    agg["last_participant"] = m.loc[grp["ats"].idxmax().to_numpy(), "participant"].to_numpy()
    agg["skew_ns"] = agg["last_start"] - agg["first_start"]
    agg["end_skew_ns"] = agg["last_end"] - agg["first_end"]
    agg["types_agree"] = agg["types"] == 1
    return agg[agg["participants"] >= 2].reset_index()


def _modes(m: pd.DataFrame, index: pd.Index) -> np.ndarray:
    """Per (process group, seq) of ``index``, its most frequent collective type (ties: the
    first in sort order, as ``Series.mode``), in one grouping rather than one call per group."""
    keys = ["process_group", "seq"]
    n = m.groupby([*keys, "collective"], sort=False).size().reset_index(name="_n")
    n = n.sort_values(["_n", "collective"], ascending=[False, True], kind="stable")
    mode = n.drop_duplicates(keys).set_index(keys)["collective"]
    return mode.reindex(index).to_numpy(object)


def _stragglers(m: pd.DataFrame, matched: pd.DataFrame) -> pd.DataFrame:
    """Per participant: how often it was last (the straggler the others waited for), how late
    it was on average, and how long it waited for the last one."""
    mm = m.merge(matched[["process_group", "seq", "first_start", "last_start"]],
                 on=["process_group", "seq"])  # fmt: skip
    mm["wait_ns"] = mm["last_start"] - mm["ats"]
    mm["late_ns"] = mm["ats"] - mm["first_start"]
    st = (
        mm.groupby("participant")
        .agg(
            rank=("rank", "first"),
            collectives=("id", "size"),
            mean_wait_ns=("wait_ns", "mean"),
            total_wait_ns=("wait_ns", "sum"),
            mean_late_ns=("late_ns", "mean"),
        )
        .reset_index()
    )
    last = matched["last_participant"].value_counts()
    first = matched["first_participant"].value_counts()
    st["times_last"] = st["participant"].map(last).fillna(0).astype(int)
    st["times_first"] = st["participant"].map(first).fillna(0).astype(int)
    st["share_last_pct"] = 100 * st["times_last"] / max(len(matched), 1)
    st = st.sort_values(["times_last", "mean_late_ns"], ascending=False).reset_index(drop=True)
    return st[STRAGGLER_COLUMNS]

"""How far apart the participants (ranks, or the devices of one host) arrive at the same
collective, and who the others wait for: collectives matched across participants by order in
their process group, clocks aligned on collective ends where hosts differ (``docs/comm.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

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
    clock, clock_notes = _clock(trace, out, order, align)
    notes += clock_notes
    shift = out["participant"].map(dict(zip(clock["participant"], clock["offset_ns"], strict=True)))
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
    """Each participant's clock offset to the reference (``order[0]``), and how it was found:
    none when every participant is on one host (one clock) or ``align='none'``; else the median
    difference of the ends of the whole-group collectives it shares with the reference (a
    collective ends on all ranks at nearly the same moment: none can finish before the last
    has arrived)."""
    ref = order[0]
    hosts = {int(s["part"]): s.get("host") for s in trace.meta["sources"]}
    phost = out.drop_duplicates("participant").set_index("participant")["part"].map(hosts)
    one_clock = bool(phost.notna().all() and phost.nunique() == 1) or out["part"].nunique() == 1
    method = ("none" if one_clock else "end") if align == "auto" else align
    offsets = {p: 0 for p in order}
    used = {p: 0 for p in order}
    notes = []
    if method == "end":
        _end_offsets(out, order, offsets, used)
        missing = [p for p in order[1:] if not used[p]]
        if missing:
            notes.append(
                f"no collective shared with the reference {ref} for {', '.join(missing)}: their "
                "clocks are left unaligned."
            )
        notes.append(
            "hosts differ or are unknown, so clocks may differ: each rank is shifted so that the "
            f"ends of the whole-group collectives it shares with {ref} agree (median offset; "
            "see the clock table). Skew is measured on starts after that shift."
        )
    else:
        why = "all come from one host (one clock)." if one_clock else "align='none' was asked for."
        notes.append("ranks compared on their recorded clocks: " + why)
    clock = pd.DataFrame(
        {
            "participant": order,
            "host": [phost.get(p) for p in order],
            "offset_ns": [offsets[p] for p in order],
            "method": [method] * len(order),
            "collectives_used": [used[p] for p in order],
            "reference": [ref] * len(order),
        }
    )
    return clock, notes


def _end_offsets(
    out: pd.DataFrame, order: list[Any], offsets: dict[Any, int], used: dict[Any, int]
) -> None:
    """Fill ``offsets`` (median end difference to ``order[0]``, in ns) and ``used`` (how many
    shared collectives gave it) for every other participant."""
    ref = order[0]
    key = out.assign(end=out["ts"] + out["dur"])
    whole = key[key["collective"].isin(WHOLE_GROUP)]
    base = whole if len(whole) else key
    piv = base.pivot_table(index=["process_group", "seq"], columns="participant", values="end",
                           aggfunc="first")  # fmt: skip
    for p in order[1:]:
        if p in piv and ref in piv:
            d = (piv[p] - piv[ref]).dropna()
            if len(d):
                offsets[p] = int(np.median(d.to_numpy(np.float64)))
                used[p] = len(d)


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

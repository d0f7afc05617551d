"""Clock alignment across ranks: each clock's offset, solved over every matched collective.

A collective that every member must enter before any can leave (all-reduce, all-gather, ...)
ends on all its participants at nearly the same instant. So the end of collective ``k`` read on
the clock of participant ``p`` is modelled as

    e[p, k] = T[k] + o[p] + n[p, k]

``T[k]`` the true end (unknown), ``o[p]`` the offset of ``p``'s clock (what is subtracted from
its times to put it on the reference's clock), ``n[p, k]`` noise: the transfer skew, how much
later one participant's kernel finishes than another's (µs; more when a rank's kernel is
delayed on its stream after the others are done).

:func:`solve` fits it by alternating medians: ``T[k] = median_p(e − o)``, then
``o[p] = median_k(e − T)``, then ``o`` shifted so the reference (the first participant of its
component in the given order: the lowest rank) reads 0; until nothing moves. Each half-step
minimises ``Σ|e − T − o|`` exactly over the one unknown it sets (the median minimises a sum of
absolute deviations), so the total never increases: an L1 fit, robust to the few collectives
whose ends differ by a whole transfer, where a least-squares fit would move every offset by a
share of such an outlier. It starts from offsets placed outwards from the reference (each
participant placed by the keys it shares with those already placed: exact without noise), so
a chain of ranks linked only through each other converges in a few rounds.

Which collectives: the matched ones (same key: process group and position in it, seen by two
participants or more) whose type is one of ``WHOLE_GROUP`` (everyone waits for everyone:
the end-together model holds); the others (send/recv, unknown types) only where they link
participants the whole-group ones leave apart (a point-to-point end pair is looser: a sender
may finish before its receiver). Components: the participants linked by the collectives used
(the "shares a collective" graph); offsets are relative to each component's reference, and two
components cannot be compared (their relative offset is unknown). A participant with no
matched collective is *unmatched*: no offset (``<NA>``), and the cross-rank tables leave it out.

Per participant (:data:`COLUMNS`): ``offset_ns`` (``o``, rounded to ns), ``residual_ns``
(median over its collectives of ``|e − T − o|``: how well one offset explains its ends) and
``residual_p95_ns`` (their 95th percentile), ``collectives_used``, ``component``, ``reference``
(its component's reference) and ``status``: ``reference``, ``aligned`` or ``unmatched``.

The comm tool's ``clock`` table (``skew.py``) solves with one participant per part (a source
file: one process, one clock), adds ``method`` (``none``: one host, one clock, or
``align='none'``: nothing shifted, status ``recorded``; ``end``: this solve) and makes a part
whose collectives match only among its own devices its own reference (offset 0).
:func:`clock_offsets` gives that table per part of a store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from collections.abc import Sequence

    from xpuprof.trace.trace import Trace

__all__ = ["COLUMNS", "OFFSET_COLUMNS", "clock_offsets", "notes", "solve"]

COLUMNS = ["participant", "offset_ns", "residual_ns", "residual_p95_ns", "collectives_used",
           "component", "reference", "status"]  # fmt: skip
OFFSET_COLUMNS = ["part", "rank", "host", "offset_ns", "residual_ns", "residual_p95_ns",
                  "collectives_used", "component", "reference", "status", "method"]  # fmt: skip

#: Rounds of alternating medians at most (each costs one pass over the ends).
MAX_ROUNDS = 200


def solve(ends: pd.DataFrame, order: Sequence[Any] | None = None) -> pd.DataFrame:
    """Each participant's clock offset (module docstring) from ``ends``: one row per end seen,
    columns ``participant``, ``key`` (the matched collective), ``end`` (int ns on the
    participant's clock) and optionally ``whole`` (bool: a whole-group collective; default
    True). Several rows of one participant for one key (devices sharing a clock) count as
    their median. ``order``: every participant, the preferred reference first (default:
    sorted); participants absent from ``ends`` are unmatched. One row per participant of
    ``order``, in that order (:data:`COLUMNS`)."""
    e = ends[["participant", "key", "end"]].copy()
    e["whole"] = ends["whole"].astype(bool).to_numpy() if "whole" in ends else True
    order = list(order) if order is not None else sorted(e["participant"].unique().tolist())
    missing = set(e["participant"].unique()) - set(order)
    if missing:
        raise ValueError(f"participants {sorted(map(str, missing))} are not in order")
    rank = {p: i for i, p in enumerate(order)}
    # ends relative to their key's earliest (int64, exact; then small enough for float64 to
    # hold to the ns: a float64 of a ~1.7e18 ns timestamp is off by up to 128 ns)
    end = e["end"].astype(np.int64)
    e["x"] = (end - end.groupby(e["key"]).transform("min")).to_numpy(np.float64)
    # one end per participant and key
    e = (e.groupby(["key", "participant"], sort=False)
         .agg(x=("x", "median"), whole=("whole", "all")).reset_index())  # fmt: skip
    e = e[e.groupby("key")["participant"].transform("size") >= 2]
    e["p"] = e["participant"].map(rank).to_numpy(np.int64)
    e["k"] = pd.factorize(e["key"])[0]
    e = e[_select(e, len(order))]
    comp = _labels(e["p"].to_numpy(), e["k"].to_numpy(), len(order))
    rows = {i: _unmatched(order[i]) for i in range(len(order))}
    for c, g in e.groupby(comp[e["p"].to_numpy()], sort=True):
        ref = int(c)  # the component's smallest index: first in order
        off, resid = _fit(g["p"].to_numpy(), g["k"].to_numpy(), g["x"].to_numpy(), ref)
        r = pd.Series(np.abs(resid)).groupby(g["p"].to_numpy())
        med, p95, n = r.median(), r.quantile(0.95), r.size()  # quantile: linear, as numpy
        for q, o in off.items():
            rows[q] = {"participant": order[q], "offset_ns": round(o),
                       "residual_ns": round(float(med[q])), "residual_p95_ns": round(float(p95[q])),
                       "collectives_used": int(n[q]), "component": ref, "reference": order[ref],
                       "status": "reference" if q == ref else "aligned"}  # fmt: skip
    recs = [rows[i] for i in range(len(order))]
    out = pd.DataFrame({c: pd.Series([r[c] for r in recs], dtype=object) for c in COLUMNS})
    for col in ("offset_ns", "residual_ns", "residual_p95_ns", "component"):
        out[col] = pd.array(out[col].tolist(), dtype="Int64")
    # components numbered 0, 1, ... in the order of their references
    refs = out.dropna(subset=["component"]).drop_duplicates("component")["component"]
    out["component"] = out["component"].map({c: i for i, c in enumerate(refs)}).astype("Int64")
    out["collectives_used"] = out["collectives_used"].astype(np.int64)
    return out


def notes(table: pd.DataFrame, what: str = "participant") -> list[str]:
    """What a :func:`solve` table (or :func:`clock_offsets`) says that its numbers do not: the
    unmatched participants by name, and separate components."""
    out = []
    if "participant" in table:  # the comm tool's labels: a bare number is a rank
        label = table["participant"].map(lambda p: f"rank {p}" if str(p).isdigit() else str(p))
    else:
        label = _part_labels(table)
    lost = label[table["status"] == "unmatched"].astype(str).tolist()
    if lost:
        its, it = ("its clock", "it is") if len(lost) == 1 else ("their clocks", "they are")
        out.append(
            f"no collective matched with another {what} for {', '.join(lost)}: {its} cannot be "
            f"aligned, so {it} left out of the cross-rank comparisons (skew, stragglers)."
        )
    comps = table.dropna(subset=["component"]).groupby("component")
    if comps.ngroups > 1:
        groups = "; ".join(", ".join(label[g.index].astype(str)) for _, g in comps)
        out.append(
            f"{comps.ngroups} groups of {what}s share no collective with each other ({groups}): "
            "each is aligned to its own reference and their relative offset is unknown, so "
            "they are compared within a group only."
        )
    return out


def clock_offsets(trace: Trace, align: str = "auto") -> pd.DataFrame:
    """One row per part (source) of ``trace``: its clock offset to its component's reference
    part (ns to subtract from its times), residual and status (:data:`OFFSET_COLUMNS`, module
    docstring), from the comm tool's matching of every collective in the store. ``align``:
    ``auto`` (no shift on one host, else ``end``), ``none`` or ``end``. Parts with no matched
    collective: ``unmatched``, offset ``<NA>`` under ``end``. ``.attrs["notes"]``: the notes
    to read with it. Cached on the trace."""
    key = ("analysis.comm.clock_offsets", align)
    if key in trace.memo:
        return trace.memo[key].copy()
    from xpuprof.analysis.comm import collectives

    res = collectives(trace, align=align)
    src = pd.DataFrame(
        [
            {"part": int(s["part"]), "rank": s.get("rank"), "host": s.get("host")}
            for s in trace.sources
        ]  # fmt: skip
    ).sort_values("part")
    src["rank"] = src["rank"].astype("Int64")
    clock = res.tables.get("clock")
    if clock is None or not len(clock):
        method = "none" if align in ("auto", "none") else "end"
        out = src.assign(offset_ns=pd.array([0 if method == "none" else None] * len(src),
                                            dtype="Int64"),
                         residual_ns=pd.NA, residual_p95_ns=pd.NA, collectives_used=0,
                         component=pd.NA, reference=pd.NA, method=method,
                         status="unmatched")  # fmt: skip
        why = next((n for n in res.notes if "same rank" in n or "one participant" in n), None)
        out.attrs["notes"] = [why or "no collective seen by two parts: no clock alignment."]
    else:
        per = clock.drop_duplicates("part").set_index("part")  # devices of a part: one clock
        out = src.join(per.drop(columns=["host", "participant"], errors="ignore"), on="part")
        ref_part = clock.drop_duplicates("participant").set_index("participant")["part"]
        out["reference"] = out["reference"].map(ref_part).astype("Int64")
        out["status"] = out["status"].fillna("unmatched")
        out["method"] = out["method"].fillna(clock["method"].iloc[0])
        if (out["method"] == "none").all():
            out["offset_ns"] = out["offset_ns"].fillna(0)
        out["collectives_used"] = out["collectives_used"].fillna(0).astype(np.int64)
        out.attrs["notes"] = notes(out, "part")
    out = out[OFFSET_COLUMNS].reset_index(drop=True)
    for col in ("offset_ns", "residual_ns", "residual_p95_ns", "component"):
        out[col] = pd.array(out[col], dtype="Int64")
    trace.memo[key] = out
    return out.copy()


def _part_labels(table: pd.DataFrame) -> pd.Series:
    """``rank R`` (``part P`` without a rank) per row of a :func:`clock_offsets` table."""
    rank = table["rank"].astype("Int64")
    return pd.Series(
        [
            f"rank {r}" if pd.notna(r) else f"part {p}"
            for r, p in zip(rank, table["part"], strict=True)
        ],
        index=table.index,
    )


def _unmatched(p: Any) -> dict[str, Any]:
    return {"participant": p, "offset_ns": None, "residual_ns": None, "residual_p95_ns": None,
            "collectives_used": 0, "component": None, "reference": None,
            "status": "unmatched"}  # fmt: skip


def _select(e: pd.DataFrame, n: int) -> np.ndarray:
    """Which rows (ends) to fit: those of whole-group keys, and of each other key that links
    participants the whole-group keys leave in different components."""
    whole = e["whole"].to_numpy(bool)
    p, k = e["p"].to_numpy(), e["k"].to_numpy()
    lab = _labels(p[whole], k[whole], n)[p]
    spans = pd.Series(lab[~whole]).groupby(k[~whole]).nunique()
    return whole | np.isin(k, spans.index[spans.to_numpy() > 1].to_numpy())


def _labels(p: np.ndarray, k: np.ndarray, n: int) -> np.ndarray:
    """Per participant index 0..n-1, the smallest index linked to it through the keys ``k``
    its ends ``p`` share (itself when unlinked): a key takes the smallest label of its
    participants, a participant the smallest of its keys', until nothing changes."""
    lab = np.arange(n)
    if not len(p):
        return lab
    nk = int(k.max()) + 1
    while True:
        kl = np.full(nk, n)
        np.minimum.at(kl, k, lab[p])
        new = lab.copy()
        np.minimum.at(new, p, kl[k])
        if (new == lab).all():
            return lab
        lab = new


def _fit(
    p: np.ndarray, k: np.ndarray, x: np.ndarray, ref: int
) -> tuple[dict[int, float], np.ndarray]:
    """Alternating medians on one component's ends ``x`` (participant ``p``, key ``k``):
    offsets (``ref`` at 0) and the residual of each end."""
    parts, pi = np.unique(p, return_inverse=True)
    k, keys = pd.factorize(k)  # this component's keys, 0..nk-1
    nk = len(keys)
    r0 = int(np.searchsorted(parts, ref))
    o = _start(pi, k, x, r0, len(parts))
    for _ in range(MAX_ROUNDS):
        t = _medians(x - o[pi], k, nk)
        new = _medians(x - t[k], pi, len(parts))
        new -= new[r0]
        moved = np.max(np.abs(new - o))
        o = new
        if moved < 0.5:  # below a nanosecond: done
            break
    o = np.round(o)  # the offsets as applied (whole ns), and their residuals
    t = _medians(x - o[pi], k, nk)
    return {int(q): float(o[i]) for i, q in enumerate(parts)}, x - t[k] - o[pi]


def _medians(v: np.ndarray, g: np.ndarray, n: int) -> np.ndarray:
    """The median of ``v`` per group ``g`` (0..n-1; every group present)."""
    return pd.Series(v).groupby(g).median().reindex(range(n)).to_numpy(np.float64, copy=True)


def _start(pi: np.ndarray, k: np.ndarray, x: np.ndarray, r0: int, n: int) -> np.ndarray:
    """Offsets to start from, placed outwards from ``r0`` (offset 0): each round, every key
    with placed participants gets ``T`` = the median of their ``x − o``, and every participant
    not yet placed that shares such keys the median of its ``x − T`` over them (exact when
    there is no noise)."""
    o = np.full(n, np.nan)
    o[r0] = 0.0
    while True:
        placed = ~np.isnan(o[pi])
        t = pd.Series((x - o[pi])[placed]).groupby(k[placed]).median()
        tk = t.reindex(k).to_numpy(np.float64)
        todo = ~placed & ~np.isnan(tk)
        if not todo.any():
            return np.nan_to_num(o)
        new = pd.Series((x - tk)[todo]).groupby(pi[todo]).median()
        o[new.index.to_numpy()] = new.to_numpy()

"""Collectives matched across the parts of a replay graph: a rendezvous node per matched
collective (each participant's start → rendezvous → each participant's end), the clock offsets
that align the parts, and the collectives that could not be matched (``docs/replay.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.sim.graph import COLLECTIVE, RENDEZVOUS, VIRTUAL, Builder

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace


def add_collectives(b: Builder, trace: Trace, parts: list[int]) -> dict[int, int]:
    """Rendezvous nodes for collectives matched across parts (the comm tool's matching: same
    process group and position in it), clock offsets from the comm tool's alignment (ends of
    whole-group collectives agree); unmatched collectives run at their measured duration.
    Returns the offsets (ns subtracted from each part's times)."""
    offsets = {p: 0 for p in parts}
    ours = [c.assign(part=p) for p, c in b.coll_nodes.items() if len(c)]
    if not ours:
        return offsets
    from xpuprof.analysis.comm import collectives

    ranks = [r for p in parts if (r := _rank_of(trace, p)) is not None]
    res = collectives(trace, ranks=ranks if len(ranks) == len(parts) else None)
    table = res.tables["collectives"]
    if "clock" in res.tables:
        _offsets(b, table, res.tables["clock"], offsets)
    m = pd.concat(ours).merge(
        table[["id", "participant", "process_group", "seq", "group_size"]], on="id", how="left"
    )
    m["key"] = m["process_group"].astype(str) + "#" + m["seq"].astype(str)
    n_part = m.groupby("key")["participant"].transform("nunique")
    matched = (n_part >= 2) & m["seq"].notna()
    for p, g in m[~matched].groupby("part"):
        b.unmodel(int(p), "collective", g["id"].to_numpy(),
                  "collective without partners in the store (a single rank of a multi-rank "
                  "job?): replayed at its measured duration")  # fmt: skip
    if matched.any():
        _rendezvous(b, m[matched].copy(), offsets)
    return offsets


def _offsets(b: Builder, table: pd.DataFrame, clock: pd.DataFrame, offsets: dict) -> None:
    """Fill ``offsets`` from the comm tool's clock table (per participant → per part)."""
    part_of = table.drop_duplicates("participant").set_index("participant")["part"]
    for pp, off in zip(clock["participant"], clock["offset_ns"], strict=True):
        if pp in part_of.index and int(part_of[pp]) in offsets:
            offsets[int(part_of[pp])] = int(off)
    if clock["method"].iloc[0] == "end" and len(clock) > 1:
        shifts = ", ".join(f"part {p} {o / 1000:+.1f} µs" for p, o in offsets.items() if o)
        b.notes.append("clocks of the ranks aligned on the ends of the collectives they share "
                       f"(the comm tool's clock table): {shifts or 'no shift needed'}")  # fmt: skip


def _rendezvous(b: Builder, mm: pd.DataFrame, offsets: dict[int, int]) -> None:
    """One rendezvous node per matched collective (``key``) and its edges: each
    participant's start → rendezvous (0), rendezvous → each participant's end (the transfer
    time: the duration of the kernel of the participant whose aligned start is last)."""
    times = np.concatenate([x["time"] for x in b.node_parts])
    mm["astart"] = times[mm["start"].to_numpy()] - mm["part"].map(offsets).to_numpy()
    mm = mm.sort_values(["key", "astart", "part"], kind="stable")
    last = mm.groupby("key", sort=True).tail(1).set_index("key")
    keys = last.index.to_numpy()
    k = len(keys)
    gsize = pd.to_numeric(last["group_size"], errors="coerce").to_numpy(float)
    npart = mm.groupby("key", sort=True)["participant"].nunique().reindex(keys).to_numpy()
    short = np.isfinite(gsize) & (npart < gsize)
    if short.any():
        b.notes.append(f"{int(short.sum())} matched collectives have fewer participants in the "
                       "store than their group size (ranks missing): each waits only for the "
                       "participants present")  # fmt: skip
        miss = mm[mm["key"].isin(set(keys[short]))]
        for p, g in miss.groupby("part"):
            b.unmodel(int(p), "collective", g["id"].to_numpy(),
                      "a rank of its process group is missing from the store")  # fmt: skip
    none = np.full(k, -1)
    rz = b.add_nodes(none, np.full(k, RENDEZVOUS), -1, last["astart"].to_numpy(),
                     np.ones(k, bool), {"kind": np.full(k, VIRTUAL), "part": none, "pid": none,
                                        "tid": none, "device": none, "stream": none})  # fmt: skip
    r_node = pd.Series(rz + np.arange(k), index=keys).reindex(mm["key"]).to_numpy()
    t_ns = pd.Series(last["dur"].to_numpy(), index=keys).reindex(mm["key"]).to_numpy()
    starts = mm["start"].to_numpy()
    b.add_edges(starts, r_node, COLLECTIVE, 0, False)
    # the kernel's own run (its timeline edge) takes the transfer time too: see calibrate
    b.add_edges(r_node, starts + 1, COLLECTIVE, t_ns, False)
    b.notes.append(f"{len(mm)} collective kernels matched across ranks in {k} collectives: "
                   "each ends at its last participant's start + that participant's kernel "
                   "duration (its transfer time)")  # fmt: skip


def _rank_of(trace: Trace, part: int) -> int | None:
    for s in trace.sources:
        if int(s["part"]) == part:
            return s.get("rank")
    return None

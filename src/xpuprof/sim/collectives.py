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


def add_collectives(
    b: Builder, trace: Trace, parts: list[int], align: str = "auto"
) -> dict[int, int]:
    """Rendezvous nodes for collectives matched across parts (the comm tool's matching: same
    process group and position in it), clock offsets from the comm tool's alignment (ends of
    whole-group collectives agree); unmatched collectives run at their measured duration.
    Returns the offsets (ns subtracted from each part's times)."""
    offsets = {p: 0 for p in parts}
    ours = [c.assign(part=p) for p, c in b.coll_nodes.items() if len(c)]
    if not ours:
        return offsets
    m, offsets = match_collectives(trace, parts, pd.concat(ours), align, b)
    matched = m["matched"]
    for p, g in m[~matched].groupby("part"):
        b.unmodel(int(p), "collective", g["id"].to_numpy(),
                  "collective without partners in the store (a single rank of a multi-rank "
                  "job?): replayed at its measured duration")  # fmt: skip
    if matched.any():
        _rendezvous(b, m[matched].copy(), offsets)
    return offsets


def match_collectives(
    trace: Trace, parts: list[int], ours: pd.DataFrame, align: str, b: Builder | None = None
) -> tuple[pd.DataFrame, dict[int, int]]:
    """The collectives ``ours`` (``id``, ``part``, …: those of the replay graph of ``parts``)
    with the comm tool's matching (``participant``, ``process_group``, ``seq``,
    ``group_size``), their ``key`` (process group # position) and whether it is ``matched``
    (≥ 2 participants), and the clock offsets per part: what :func:`add_collectives` builds
    the rendezvous from, and the partitioned job path plans with (``sim/job_parts.py``).
    Notes go to ``b`` when given."""
    from xpuprof.analysis.comm import collectives

    offsets = {p: 0 for p in parts}
    ranks = [r for p in parts if (r := _rank_of(trace, p)) is not None]
    every = {int(s["part"]) for s in trace.sources} <= set(parts)
    # every part: the comm tool's own question (no rank filter), which it answers once for all
    # who ask it (the diagnosis, the ranks tool); 7.5 s again at 512 ranks otherwise
    selected = ranks if len(ranks) == len(parts) and not every else None
    res = collectives(trace, ranks=selected, align=align)
    table = res.tables["collectives"]
    if "clock" in res.tables:
        _offsets(b if b is not None else Builder(), table, res.tables["clock"], offsets)
    m = ours.merge(
        table[["id", "participant", "process_group", "seq", "group_size"]], on="id", how="left"
    )
    m["key"] = m["process_group"].astype(str) + "#" + m["seq"].astype(str)
    n_part = m.groupby("key")["participant"].transform("nunique")
    m["matched"] = ((n_part >= 2) & m["seq"].notna()).to_numpy(bool)
    return m, offsets


def _offsets(b: Builder, table: pd.DataFrame, clock: pd.DataFrame, offsets: dict) -> None:
    """Fill ``offsets`` (per part) from the comm tool's clock table: a clock is a part's, so
    its devices share one offset (``analysis/comm/clocks.py``). A part whose collectives match
    no other part's has no offset: it keeps its own clock (nothing of it waits on another part
    then) and a note names it; so does a split into groups that share no collective."""
    per = clock.drop_duplicates("part")
    per = per[per["part"].astype(int).isin(list(offsets))]
    rank = table.drop_duplicates("part").set_index("part")["rank"]

    def name(p: int) -> str:
        r = rank.get(p)
        return f"rank {r}" if r is not None and pd.notna(r) else f"part {p}"

    for p, off in zip(per["part"], per["offset_ns"], strict=True):
        if pd.notna(off):
            offsets[int(p)] = int(off)
    lost = [name(int(p)) for p in per.loc[per["status"] == "unmatched", "part"]]
    if clock["method"].iloc[0] == "end" and (per["status"] == "aligned").any():
        shifts = ", ".join(f"{name(p)} {o / 1000:+.1f} µs" for p, o in offsets.items() if o)
        res = pd.to_numeric(per["residual_ns"], errors="coerce").max()
        worst = f"; largest median residual {res / 1000:.1f} µs" if pd.notna(res) else ""
        b.notes.append("clocks of the ranks aligned on the ends of the collectives they share "
                       f"(the comm tool's clock table{worst}): "
                       f"{shifts or 'no shift needed'}")  # fmt: skip
        groups = per.dropna(subset=["component"]).groupby("component")["part"]
        if groups.ngroups > 1:
            b.notes.append(f"{groups.ngroups} groups of ranks share no collective ("
                           + "; ".join(", ".join(name(int(p)) for p in g) for _, g in groups)
                           + "): each group is aligned to its own first rank, their relative "
                           "clock offset is unknown")  # fmt: skip
    elif clock["method"].iloc[0] != "end" and len(per) > 1:
        b.notes.append("clocks not aligned (align='none', or one host: one clock): each rank "
                       "replayed on its recorded clock")  # fmt: skip
    if lost:
        its = "its clock is" if len(lost) == 1 else "their clocks are"
        b.notes.append(f"no collective of {', '.join(lost)} matched another rank's: {its} not "
                       "aligned (each replayed on its own clock)")  # fmt: skip


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
    rz = _virtual_nodes(b, last["astart"].to_numpy())
    r_node = pd.Series(rz + np.arange(k), index=keys).reindex(mm["key"]).to_numpy()
    t_ns = pd.Series(last["dur"].to_numpy(), index=keys).reindex(mm["key"]).to_numpy()
    starts = mm["start"].to_numpy()
    ends = mm["end"].to_numpy()
    b.add_edges(starts, r_node, COLLECTIVE, 0, False)
    # a kernel's own run (its timeline edge) takes the transfer time too: see calibrate; a
    # host collective's span (gloo) ends at the later of its start and rendezvous + transfer,
    # unless it ended before the last participant arrived: it did not wait for the others
    # (a broadcast's root, whose send the socket buffered), so its end stays its own
    host = mm["host"].to_numpy(bool)
    rz_time = last["astart"].reindex(mm["key"]).to_numpy()
    aend = mm["astart"].to_numpy() + mm["dur"].to_numpy()
    alone = host & (aend < rz_time)
    # a host participant's transfer is its own time after the last arrival: a CPU thread,
    # unlike a kernel, is woken and scheduled on its own (ms apart on a loaded host)
    t_ns = np.where(host, np.maximum(aend - rz_time, 0), t_ns).astype(np.int64)
    b.add_edges(r_node[~alone], ends[~alone], COLLECTIVE, t_ns[~alone], False)
    b.notes.append(f"{len(mm)} collectives (kernels, or host spans: gloo) matched across ranks "
                   f"in {k} collectives: each ends at its last participant's start + that "
                   "participant's duration (its transfer time; a host collective's own time "
                   "after that start)"
                   + (f"; {int(alone.sum())} host collectives that ended before the last "
                      "participant arrived (a broadcast's root) keep their own end"
                      if alone.any() else ""))  # fmt: skip


def _virtual_nodes(b: Builder, times: np.ndarray) -> int:
    """One rendezvous-kind virtual node per time (no event, no part, each its own timeline
    head: a head without inputs keeps its time); the first one's number."""
    k = len(times)
    none = np.full(k, -1)
    return b.add_nodes(none, np.full(k, RENDEZVOUS), -1, times, np.ones(k, bool),
                       {"kind": np.full(k, VIRTUAL), "part": none, "pid": none, "tid": none,
                        "device": none, "stream": none})  # fmt: skip


def _rank_of(trace: Trace, part: int) -> int | None:
    for s in trace.sources:
        if int(s["part"]) == part:
            return s.get("rank")
    return None


def add_planned(b: Builder, plan: pd.DataFrame) -> np.ndarray:
    """The rendezvous of one part's matched collectives from a plan made over the whole job
    (``sim/job_parts.py``), so that the part's graph alone is the job's graph around that part:
    per collective ``key`` of ``plan`` (``id``, ``key``, ``transfer_ns``: the last
    participant's duration, ``rendezvous_ns``: its aligned start, ``arrival_ns``: when the
    other parts' last participant arrived), a rendezvous node fed by the part's own starts
    and by a pinned *foreign* node at ``arrival_ns`` (a timeline head without inputs keeps its
    time), and rendezvous → each end (``transfer_ns``), as :func:`_rendezvous` does. The part's
    collectives absent from the plan matched nothing: measured duration. Returns the
    rendezvous node of each plan key, in the order of ``plan``'s unique keys."""
    if not len(plan):
        return np.empty(0, np.int64)
    ours = pd.concat([c for c in b.coll_nodes.values() if len(c)] or [pd.DataFrame(
        {"id": [], "start": [], "end": [], "dur": [], "host": []})], ignore_index=True)  # fmt: skip
    if ours["host"].astype(bool).any():
        from xpuprof.core.errors import XpuprofError

        raise XpuprofError("host collectives (gloo) cannot be replayed part by part")
    m = ours.merge(plan, on="id", how="inner")  # the others matched nothing: measured
    keys = pd.unique(plan["key"])
    k = len(keys)
    if not k:
        return np.empty(0, np.int64)
    per = plan.drop_duplicates("key").set_index("key").reindex(keys)
    rz = _virtual_nodes(b, per["rendezvous_ns"].to_numpy(np.int64))
    r_node = pd.Series(rz + np.arange(k), index=keys)
    node_of = r_node.reindex(m["key"]).to_numpy()
    b.add_edges(m["start"].to_numpy(), node_of, COLLECTIVE, 0, False)
    t_ns = per["transfer_ns"].reindex(m["key"]).to_numpy(np.int64)
    b.add_edges(node_of, m["end"].to_numpy(), COLLECTIVE, t_ns, False)
    foreign = _virtual_nodes(b, per["arrival_ns"].to_numpy(np.int64))
    b.add_edges(foreign + np.arange(k), rz + np.arange(k), COLLECTIVE, 0, False)
    return rz + np.arange(k)

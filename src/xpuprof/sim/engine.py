"""The replay engine: the time of every point of a replay graph, given the edge delays.

A point's time is the latest of its inputs' times plus their delays; the first point of a
timeline without inputs keeps its measured time (where the trace window starts). Points of one
timeline are serialised by its timeline edges, so a thread or stream runs one thing at a time,
in program order.

How it is computed: along a timeline, between points with cross inputs, a point's time is the
previous one's plus a delay, i.e. a prefix sum (numpy). Only *anchors* (timeline heads and
points with cross inputs) need a step of their own; they are visited in a topological order
found by Kahn's algorithm on the small anchor graph (a Python loop over anchors and cross edges
only, over flat lists: no per-node objects). Integer arithmetic throughout, so the result is
bit-identical from run to run. A cycle (a trace whose recorded dependencies contradict each
other) is never looped on: its cross edges are cut, one cycle at a time, and reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: A time before every real one: the value of "no input".
_NONE = np.iinfo(np.int64).min // 4


@dataclass(frozen=True)
class Schedule:
    """Simulated times of the points (ns, the aligned clock), which input set each point's
    time (``via``: an edge number; -1: its timeline predecessor or its own measured time),
    and the cross edges cut to break cycles, as lists of edge numbers per cycle."""

    time: np.ndarray
    via: np.ndarray
    cycles: list[list[int]]


def simulate(
    n: int,
    first: np.ndarray,
    chain_delay: np.ndarray,
    start: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    delay: np.ndarray,
) -> Schedule:
    """Times of ``n`` points grouped in timelines that begin at ``first`` (sorted node
    numbers; timeline k is ``first[k]`` to ``first[k + 1]`` - 1). ``chain_delay[i]``: delay
    from point i - 1 to point i on its timeline (ignored at a head); ``start``: measured times
    (heads without inputs keep theirs); cross edges ``src`` → ``dst`` with ``delay``."""
    if n == 0:
        return Schedule(np.empty(0, np.int64), np.empty(0, np.int64), [])
    head = np.zeros(n, bool)
    head[first] = True
    has_in = np.zeros(n, bool)
    has_in[dst] = True
    anchor = head | has_in
    anchors = np.flatnonzero(anchor)
    a_of = np.cumsum(anchor) - 1  # last anchor at or before each point
    prefix = np.cumsum(np.where(head, 0, chain_delay).astype(np.int64))
    n_a = len(anchors)
    # cross edges grouped by target anchor; each reads its source as anchor time + offset
    e_src_a = a_of[src]
    e_off = prefix[src] - prefix[anchors[e_src_a]] + delay
    e_dst_a = a_of[dst]
    by_dst = np.argsort(e_dst_a, kind="stable")
    in_lo = np.searchsorted(e_dst_a[by_dst], np.arange(n_a), "left")
    in_hi = np.searchsorted(e_dst_a[by_dst], np.arange(n_a), "right")
    # successors: the next anchor on the timeline, and the targets of edges leaving a segment
    same_next = np.r_[~head[anchors[1:]], False]
    by_src = np.argsort(e_src_a, kind="stable")
    out_lo = np.searchsorted(e_src_a[by_src], np.arange(n_a), "left")
    out_hi = np.searchsorted(e_src_a[by_src], np.arange(n_a), "right")
    indeg = (~head[anchors]).astype(np.int64) + (in_hi - in_lo)
    step = np.r_[prefix[anchors[1:]] - prefix[anchors[:-1]], 0]  # chain from anchor k to k+1
    # a head without inputs starts at its measured time; one whose inputs were all cut too
    pinned = np.where(head[anchors] & (in_hi == in_lo), start[anchors], _NONE)
    fallback = start[anchors]

    value, via, cycles = _kahn(
        n_a, indeg.tolist(), same_next.tolist(), step.tolist(), pinned.tolist(), fallback.tolist(),
        in_lo.tolist(), in_hi.tolist(), by_dst.tolist(), e_src_a.tolist(), e_off.tolist(),
        out_lo.tolist(), out_hi.tolist(), by_src.tolist(), e_dst_a.tolist(),
    )  # fmt: skip
    val = np.asarray(value, np.int64)
    time = val[a_of] + prefix - prefix[anchors[a_of]]
    v = np.full(n, -1, np.int64)
    v[anchors] = via
    return Schedule(time=time, via=v, cycles=cycles)


def _kahn(
    n_a: int, indeg: list[int], same_next: list[bool], step: list[int], pinned: list[int],
    fallback: list[int],
    in_lo: list[int], in_hi: list[int], by_dst: list[int], e_src_a: list[int],
    e_off: list[int], out_lo: list[int], out_hi: list[int], by_src: list[int],
    e_dst_a: list[int],
) -> tuple[list[int], list[int], list[list[int]]]:  # fmt: skip
    """Anchor times in a topological order (Kahn), cutting cycles when stuck."""
    value = [_NONE] * n_a
    via = [-1] * n_a
    done = [False] * n_a
    cut: set[int] = set()
    cycles: list[list[int]] = []
    ready = [k for k in range(n_a - 1, -1, -1) if indeg[k] == 0]
    n_done = 0
    while True:
        while ready:
            k = ready.pop()
            done[k] = True
            n_done += 1
            best, how = (
                (value[k - 1] + step[k - 1], -1) if k and same_next[k - 1] else (pinned[k], -1)
            )
            for j in range(in_lo[k], in_hi[k]):
                e = by_dst[j]
                if e in cut:
                    continue
                t = value[e_src_a[e]] + e_off[e]
                if t > best:
                    best, how = t, e
            if best == _NONE:
                best = fallback[k]
            value[k], via[k] = best, how
            if same_next[k]:
                indeg[k + 1] -= 1
                if indeg[k + 1] == 0:
                    ready.append(k + 1)
            for j in range(out_lo[k], out_hi[k]):
                e = by_src[j]
                if e in cut:
                    continue
                m = e_dst_a[e]
                indeg[m] -= 1
                if indeg[m] == 0:
                    ready.append(m)
        if n_done == n_a:
            return value, via, cycles
        cycle = _find_cycle(done, same_next, in_lo, in_hi, by_dst, e_src_a, cut)
        cycles.append(cycle)
        for e in cycle:
            cut.add(e)
            m = e_dst_a[e]
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)


def _find_cycle(done: list[bool], same_next: list[bool], in_lo: list[int], in_hi: list[int],
                by_dst: list[int], e_src_a: list[int], cut: set[int]) -> list[int]:  # fmt: skip
    """Cross edges of one cycle among the anchors not yet done: walk back from one of them
    along inputs that are not done until an anchor repeats."""
    k = done.index(False)
    seen: dict[int, int] = {}
    path: list[tuple[int, int]] = []  # (anchor, the cross edge taken back from it; -1 timeline)
    while k not in seen:
        seen[k] = len(path)
        if k and same_next[k - 1] and not done[k - 1]:
            path.append((k, -1))
            k -= 1
            continue
        for j in range(in_lo[k], in_hi[k]):
            e = by_dst[j]
            if e not in cut and not done[e_src_a[e]]:
                path.append((k, e))
                k = e_src_a[e]
                break
        else:  # cannot happen: an anchor not done has an input not done
            raise AssertionError("replay engine: stuck without a cycle")
    return [e for _, e in path[seen[k] :] if e >= 0]

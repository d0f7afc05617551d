"""Nesting on a timeline track, and binding flow entries to the slices they belong to.

Pure numpy over whole columns: these are the timeline facts every later stage relies on
(``parent``/``depth`` of each event, the event each flow entry binds to), computed once at import
by the normaliser (``trace/normalize/``) and reused by the analyses that need to nest events of
their own (``analysis/hierarchy.py`` for layer spans on another clock).
"""

from __future__ import annotations

import numpy as np


def nest(
    pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray, slice_mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Nest events on their track (pid, tid); returns (order, parent_pos, end, is_slice).

    ``order`` sorts events by (pid, tid, ts, longest first); ``parent_pos[k]`` is the position
    in that order of the parent of ``order[k]`` (-1: none). A slice contains what starts within
    it and ends no later; an instant (``slice_mask`` False) never contains anything.

    The parent of k is the nearest earlier event on the track whose end is at least k's end.
    Found by pointer jumping: each event starts at its predecessor and, while that candidate
    ends too early, jumps to the candidate's own candidate — everything skipped ends earlier
    still. All events jump together; those still climbing after ``JUMP_ROUNDS`` rounds
    (events after a deep nest) are answered by a search tree, so a nest of any depth costs
    O(n log n).
    """
    n = len(ts)
    order = track_order(pid, tid, ts, dur)
    s = ts[order]
    q = s + dur[order]  # where each event ends, as a query
    sl = slice_mask[order]
    e = np.where(sl, q, s - 1)  # how far each event reaches, as a candidate parent
    del s
    p = np.arange(-1, n - 1, dtype=np.int64)
    if not n:
        return order, p, e, sl
    op, ot = pid[order], tid[order]
    first = np.ones(n, dtype=bool)
    first[1:] = (op[1:] != op[:-1]) | (ot[1:] != ot[:-1])
    del op, ot
    p[first] = -1
    # Shortcut: an event that ends after everything before it on its track has no parent;
    # most device events are such, and settling them now spares them the jumping.
    track = np.cumsum(first) - 1
    lo, span = int(e.min()), int(max(e.max(), q.max())) - int(e.min()) + 1
    if span < (1 << 62) // max(int(track[-1]) + 1, 1):
        reach = np.maximum.accumulate(track * span + (e - lo))
        before = np.empty(n, dtype=np.int64)
        before[0] = -1
        before[1:] = reach[:-1]
        p[~first & (before < track * span + (q - lo))] = -1
        del reach, before
    del track
    active = np.flatnonzero(p >= 0)
    for _ in range(JUMP_ROUNDS):
        if not active.size:
            break
        cand = p[active]
        ok = (cand < 0) | (e[np.maximum(cand, 0)] >= q[active])
        move = active[~ok]
        p[move] = p[cand[~ok]]
        active = move
    if active.size:
        # the nearest reaching event may lie on an earlier track: then none on its own does
        track_start = np.maximum.accumulate(np.where(first, np.arange(n), 0))[active]
        j = _nearest_reaching(e, q[active], p[active])
        p[active] = np.where(j >= track_start, j, -1)
    return order, p, e, sl


def track_order(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """``np.lexsort((-dur, ts, tid, pid))``: events by track, time, longest first, then as
    given. Found by one stable sort of a single key (the track's rank, then the time) where
    both fit in 63 bits, which is nearly sorted already as traces are written (a thread's
    events in time order): 0.3 s for the 2 GB benchmark file's 5 M events, ranks of the
    tracks included, against 1.1 s for the four passes of ``lexsort``. The few events that
    share track and time are then ordered by duration."""
    n = len(ts)
    if n < 2:
        return np.lexsort((-dur, ts, tid, pid))
    pc, n_pid = _dense(pid)
    tc, n_tid = _dense(tid)
    lo, span = int(ts.min()), int(ts.max()) - int(ts.min())
    bits = span.bit_length()
    if bits + (n_pid * n_tid - 1).bit_length() > 62:
        return np.lexsort((-dur, ts, tid, pid))
    key = ((pc * n_tid + tc) << bits) | (ts - lo)
    del pc, tc
    order = np.argsort(key, kind="stable")
    k = key[order]
    del key
    same = k[1:] == k[:-1]
    if same.any():
        tie = np.zeros(n, dtype=bool)
        tie[1:] |= same
        tie[:-1] |= same
        at = np.flatnonzero(tie)
        tied = order[at]  # runs of one key each, in given order within a run (stable sort)
        order[at] = tied[np.lexsort((-dur[tied], k[at]))]
    return order


def _dense(col: np.ndarray) -> tuple[np.ndarray, int]:
    """Each value's rank among the column's distinct values, and how many there are. Found
    from the heads of its runs (a column of pids or tids changes value rarely)."""
    heads = np.flatnonzero(col[1:] != col[:-1]) + 1
    uniq = np.unique(np.concatenate([col[:1], col[heads]]))
    return np.searchsorted(uniq, col).astype(np.int64, copy=False), len(uniq)


#: Rounds of pointer jumping before the rest is settled by a search tree. Jumps along a list
#: of siblings double (each takes its predecessor's latest candidate), so real traces settle
#: in about 20 rounds (23 at most among the shared traces); but a jump moves only one ancestor
#: up, so an event after a deep nest (a sibling near the top) would need one round per level.
JUMP_ROUNDS = 32


def _nearest_reaching(e: np.ndarray, q: np.ndarray, below: np.ndarray) -> np.ndarray:
    """For each query, the last position ``j <= below`` whose ``e[j] >= q`` (-1: none).

    A max-segment tree over ``e`` answers all queries at once in O(log n) vectorized rounds:
    climb from the leaf at ``below`` until a left sibling (everything in it lies before)
    holds a value that reaches, then descend into its rightmost such leaf.
    """
    n = len(e)
    size = 1 << max(int(n - 1).bit_length(), 0)
    tree = np.full(2 * size, np.iinfo(np.int64).min, dtype=np.int64)
    tree[size : size + n] = e
    for lo in range(int(np.log2(size)) - 1, -1, -1):
        a, z = 1 << lo, 1 << (lo + 1)
        tree[a:z] = np.maximum(tree[2 * a : 2 * z : 2], tree[2 * a + 1 : 2 * z : 2])
    out = np.full(len(q), -1, dtype=np.int64)
    # the leaf at ``below`` itself may reach
    leaf = below + size
    hit = (below >= 0) & (tree[np.maximum(leaf, 0)] >= q)
    out[hit] = below[hit]
    todo = np.flatnonzero(~hit & (below >= 0))
    node = leaf[todo]
    # climb: from each node, the left sibling of it or of an ancestor that reaches
    found = np.full(len(todo), -1, dtype=np.int64)
    live = np.arange(len(todo))
    while live.size:
        v = node[live]
        right = (v & 1) == 1
        sib = v - 1
        reach = right & (tree[np.maximum(sib, 0)] >= q[todo[live]])
        found[live[reach]] = sib[reach]
        up = ~reach & (v > 1)
        node[live[up]] = v[up] >> 1
        live = live[up]
    # descend: into the rightmost child that reaches, down to a leaf
    sel = np.flatnonzero(found >= 0)
    v = found[sel]
    qq = q[todo[sel]]
    while sel.size and (v < size).any():
        inner = v < size
        r = 2 * v + 1
        go_right = inner & (tree[np.where(inner, r, 0)] >= qq)
        v = np.where(inner, np.where(go_right, r, 2 * v), v)
    out[todo[sel]] = v - size
    return out


def match_correlation(
    ev_corr: np.ndarray,
    ev_pid: np.ndarray,
    ev_tid: np.ndarray,
    ev_ts: np.ndarray,
    corr: np.ndarray,
    pid: np.ndarray,
    tid: np.ndarray,
    ts: np.ndarray,
) -> np.ndarray:
    """Row of the event with correlation ``corr`` on track (pid, tid) for each query, -1 when
    none; when several share it (an MTIA launch runs several device events), the one starting
    at ``ts``, else the first."""
    out = np.full(len(corr), -1, dtype=np.int64)
    have = np.flatnonzero(ev_corr >= 0)
    if not have.size or not len(corr):
        return out
    o = have[np.lexsort((have, ev_tid[have], ev_pid[have], ev_corr[have]))]
    c_sorted = ev_corr[o]
    lo = np.searchsorted(c_sorted, corr, side="left")
    hi = np.searchsorted(c_sorted, corr, side="right")
    # the few events sharing a correlation id (launch, kernel, sync) are scanned in lockstep,
    # first for one that also starts at ts, then for any
    width = int((hi - lo).max(initial=0))
    for exact in (True, False):
        for k in range(width):
            pos = lo + k
            live = (pos < hi) & (out < 0)
            if not live.any():
                break
            cand = o[np.minimum(pos, len(o) - 1)]
            m = live & (ev_pid[cand] == pid) & (ev_tid[cand] == tid)
            if exact:
                m &= ev_ts[cand] == ts
            out[m] = cand[m]
    return out


def depths(parent_pos: np.ndarray) -> np.ndarray:
    """Depth of each position (0 at top level), by pointer doubling: each position keeps an
    ancestor and its distance to it, and jumps to that ancestor's ancestor, so a chain of any
    length takes O(log n) rounds (a level-by-level walk would take one round per level)."""
    n = len(parent_pos)
    up = parent_pos.astype(np.int64, copy=True)
    depth = (up >= 0).astype(np.int32)
    live = np.flatnonzero(up >= 0)
    while live.size:
        anc = up[live]
        depth[live] += depth[anc]
        up[live] = up[anc]
        live = live[up[live] >= 0]
    return depth if n else np.zeros(0, dtype=np.int32)


def _tracks(
    order: np.ndarray, ev_pid: np.ndarray, ev_tid: np.ndarray
) -> tuple[dict[tuple[int, int], int], dict[int, int]]:
    """Where each track (pid, tid) starts in ``order``, and where the track starting at each
    such position ends. Found one sorted column at a time (a 2 GB trace has 5 M events:
    every full-length temporary here is 40 MB)."""
    change = np.zeros(len(order), dtype=bool)
    change[0] = True
    for col in (ev_pid, ev_tid):
        sorted_col = col[order]
        change[1:] |= sorted_col[1:] != sorted_col[:-1]
        del sorted_col
    bounds = np.flatnonzero(change)
    del change
    first_rows = order[bounds]
    starts = dict(
        zip(
            zip(ev_pid[first_rows].tolist(), ev_tid[first_rows].tolist(), strict=True),
            bounds.tolist(),
            strict=True,
        )
    )
    ends = np.r_[bounds[1:], len(order)]
    return starts, dict(zip(bounds.tolist(), ends.tolist(), strict=True))


def bind_flows(
    order: np.ndarray,
    parent_pos: np.ndarray,
    end: np.ndarray,
    is_slice: np.ndarray,
    ev_pid: np.ndarray,
    ev_tid: np.ndarray,
    ev_ts: np.ndarray,
    fl_pid: np.ndarray,
    fl_tid: np.ndarray,
    fl_ts: np.ndarray,
    fl_next: np.ndarray,
) -> np.ndarray:
    """Row (in the events table) of the slice each flow entry binds to, -1 when none.

    Enclosing binding takes the innermost slice on the flow's track that contains its ts;
    ``fl_next`` rows (an ``f`` without ``bp: "e"``) take the first slice starting at or after it.
    """
    out = np.full(len(fl_ts), -1, dtype=np.int64)
    if not len(fl_ts) or not len(order):
        return out
    starts, end_of = _tracks(order, ev_pid, ev_tid)
    s_ts = ev_ts[order]
    # next slice at or after each position (for "next slice" binding)
    if fl_next.any():
        nxt = np.where(is_slice, np.arange(len(order)), len(order))
        nxt = np.minimum.accumulate(nxt[::-1])[::-1]
    else:
        nxt = np.zeros(1, dtype=np.int64)
    pos = np.full(len(fl_ts), -1, dtype=np.int64)
    # group the flow entries by track without a Python loop over entries
    f_order = np.lexsort((fl_tid, fl_pid))
    fp, ft = fl_pid[f_order], fl_tid[f_order]
    f_bounds = np.flatnonzero(np.r_[True, (fp[1:] != fp[:-1]) | (ft[1:] != ft[:-1])])
    f_ends = np.r_[f_bounds[1:], len(f_order)]
    for g0, g1 in zip(f_bounds.tolist(), f_ends.tolist(), strict=True):
        lo = starts.get((int(fp[g0]), int(ft[g0])))
        if lo is None:
            continue
        hi = end_of[lo]
        rows = f_order[g0:g1]
        t = fl_ts[rows]
        is_next = fl_next[rows]
        if is_next.any():
            first_ge = lo + np.searchsorted(s_ts[lo:hi], t[is_next], side="left")
            nx = np.where(first_ge < hi, nxt[np.minimum(first_ge, len(order) - 1)], hi)
            pos[rows[is_next]] = np.where(nx < hi, nx, -1)
        enc = ~is_next
        c = lo + np.searchsorted(s_ts[lo:hi], t[enc], side="right") - 1
        c = np.where(c < lo, -1, c)
        tt = t[enc]
        r = rows[enc]
        # walk up until a slice that contains the flow's ts
        while True:
            valid = c >= 0
            good = valid & is_slice[np.maximum(c, 0)] & (end[np.maximum(c, 0)] >= tt)
            done = ~valid | good
            pos[r[done]] = np.where(good[done], c[done], -1)
            if done.all():
                break
            c, tt, r = parent_pos[c[~done]], tt[~done], r[~done]
    ok = pos >= 0
    out[ok] = order[pos[ok]]
    return out

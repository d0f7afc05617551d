"""The vectorized nesting and flow binding against plain reference algorithms.

``nest`` and ``bind_flows`` are the two places where build.py replaces an obvious per-event loop
with numpy pointer jumping; these tests run the obvious loop on the same inputs and require the
same answer, on random timelines (with ties, instants, partial overlaps) and on a real trace.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EXAMPLE

from xpuprof.formats.kineto import read_kineto
from xpuprof.trace.normalize import bind_flows, depths, nest


def stack_nest(pid, tid, ts, dur, is_slice):
    """Textbook stack nesting: walk each track in (ts, longest first) order."""
    order = np.lexsort((-dur, ts, tid, pid))
    parent = np.full(len(ts), -1)
    stack: list[int] = []
    track = None
    for k, i in enumerate(order):
        if (pid[i], tid[i]) != track:
            stack, track = [], (pid[i], tid[i])
        while stack:
            j = order[stack[-1]]
            reach = ts[j] + dur[j] if is_slice[j] else ts[j] - 1
            if reach >= ts[i] + dur[i]:
                break
            stack.pop()
        parent[k] = stack[-1] if stack else -1
        stack.append(k)
    return order, parent


def random_timeline(rng, n, tracks=3):
    pid = rng.integers(0, 2, n)
    tid = rng.integers(0, tracks, n)
    ts = rng.integers(0, 200, n) * 10
    dur = rng.integers(0, 60, n) * 10  # many ties and zero-length slices
    is_slice = rng.random(n) > 0.1
    dur = np.where(is_slice, dur, 0)
    return pid, tid, ts, dur, is_slice


@pytest.mark.parametrize("seed", range(20))
def test_nest_matches_stack_algorithm_on_random_timelines(seed):
    rng = np.random.default_rng(seed)
    pid, tid, ts, dur, is_slice = random_timeline(rng, 400)
    order, parent, _, _ = nest(pid, tid, ts, dur, is_slice)
    ref_order, ref_parent = stack_nest(pid, tid, ts, dur, is_slice)
    assert (order == ref_order).all()
    assert (parent == ref_parent).all()


def test_depths_follow_parent_chains():
    rng = np.random.default_rng(7)
    pid, tid, ts, dur, is_slice = random_timeline(rng, 500, tracks=2)
    _, parent, _, _ = nest(pid, tid, ts, dur, is_slice)
    d = depths(parent)
    for k in range(len(parent)):
        n, j = 0, parent[k]
        while j >= 0:
            n, j = n + 1, parent[j]
        assert d[k] == n


def test_nest_matches_stack_algorithm_on_a_real_trace():
    raw = read_kineto(EXAMPLE).tables["events"]
    pid = raw["pid"].to_numpy()
    tid = raw["tid"].to_numpy()
    ts = raw["ts"].to_numpy()
    is_slice = np.array([p == "X" for p in raw["ph"].to_pylist()])
    dur = np.where(is_slice, raw["dur"].to_numpy(zero_copy_only=False), 0).astype(np.int64)
    order, parent, _, _ = nest(pid, tid, ts, dur, is_slice)
    ref_order, ref_parent = stack_nest(pid, tid, ts, dur, is_slice)
    assert (order == ref_order).all() and (parent == ref_parent).all()
    assert (parent >= 0).sum() > len(parent) // 2  # a real trace nests deeply


def brute_bind(pid, tid, ts, dur, is_slice, f_pid, f_tid, f_ts, f_next):
    """For each flow: the innermost slice on its track containing ts (largest start, then the
    shortest), or for 'next' flows the earliest slice starting at or after ts."""
    out = []
    for p, t, x, nxt in zip(f_pid, f_tid, f_ts, f_next, strict=True):
        same = np.flatnonzero((pid == p) & (tid == t) & is_slice)
        if nxt:
            cand = same[ts[same] >= x]
            key = [(ts[i], -dur[i]) for i in cand]
            out.append(cand[min(range(len(cand)), key=key.__getitem__)] if len(cand) else -1)
            continue
        cand = same[(ts[same] <= x) & (ts[same] + dur[same] >= x)]
        if not len(cand):
            out.append(-1)
            continue
        # innermost = last in (ts asc, dur desc) order among those containing x
        key = [(ts[i], -dur[i]) for i in cand]
        out.append(cand[max(range(len(cand)), key=key.__getitem__)])
    return np.array(out)


@pytest.mark.parametrize("seed", range(10))
def test_bind_flows_matches_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    # properly nested slices (as profilers write them): build children inside parents
    pid, tid, ts, dur = [], [], [], []
    for track in range(3):
        t = 0
        for _ in range(30):
            top, length = t + int(rng.integers(0, 5)) * 10, int(rng.integers(2, 10)) * 10
            pid.append(0), tid.append(track), ts.append(top), dur.append(length)
            c = top
            while c < top + length - 10 and rng.random() < 0.7:
                cl = int(rng.integers(1, 3)) * 5
                cl = min(cl, top + length - c)
                pid.append(0), tid.append(track), ts.append(c), dur.append(cl)
                c += cl + 5
            t = top + length
    pid, tid, ts, dur = map(np.array, (pid, tid, ts, dur))
    is_slice = np.ones(len(ts), bool)
    order, parent, end, sl = nest(pid, tid, ts, dur, is_slice)
    m = 200
    f_pid = np.zeros(m, dtype=np.int64)
    f_tid = rng.integers(0, 4, m)  # track 3 has no slices
    f_ts = rng.integers(0, int(ts.max()) + 20, m)
    f_next = rng.random(m) < 0.3
    got = bind_flows(order, parent, end, sl, pid, tid, ts, f_pid, f_tid, f_ts, f_next)
    want = brute_bind(pid, tid, ts, dur, is_slice, f_pid, f_tid, f_ts, f_next)
    assert (got == want).all()

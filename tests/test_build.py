"""The vectorized nesting and flow binding against plain reference algorithms.

``nest`` and ``bind_flows`` are the two places where build.py replaces an obvious per-event loop
with numpy pointer jumping; these tests run the obvious loop on the same inputs and require the
same answer, on random timelines (with ties, instants, partial overlaps) and on a real trace.
"""

from __future__ import annotations

import time

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


# ----------------------------------------------------------------------------------------------
# issue 8, item 10: deep nests (depth past int16, time that grew as n**2)
# ----------------------------------------------------------------------------------------------


def deep_track(rng, n):
    """One track of ``n`` events: long chains nested inside each other, then runs of
    siblings near the top after them (each sibling must climb past the whole chain)."""
    ts, dur, t = [], [], 0
    while len(ts) < n:
        depth = int(rng.integers(1, 400))
        for k in range(depth):  # a chain: each starts 1 later and ends 1 earlier
            ts.append(t + k)
            dur.append(2 * (depth - k) + 10)
        t += 2 * depth + 12
        for _ in range(int(rng.integers(0, 50))):  # siblings at the top, some zero-length
            ts.append(t)
            dur.append(int(rng.integers(0, 3)))
            t += 3
    ts, dur = np.array(ts[:n], dtype=np.int64), np.array(dur[:n], dtype=np.int64)
    return np.zeros(n, np.int64), np.zeros(n, np.int64), ts, dur, np.ones(n, bool)


@pytest.mark.parametrize("seed", range(20))
def test_search_tree_alone_matches_stack_algorithm(seed, monkeypatch):
    """With no rounds of pointer jumping, every event is settled by the search tree that
    deep nests need: it must give the same parents on the same random timelines."""
    from xpuprof.trace import nesting

    monkeypatch.setattr(nesting, "JUMP_ROUNDS", 0)
    rng = np.random.default_rng(seed)
    pid, tid, ts, dur, is_slice = random_timeline(rng, 400)
    order, parent, _, _ = nest(pid, tid, ts, dur, is_slice)
    ref_order, ref_parent = stack_nest(pid, tid, ts, dur, is_slice)
    assert (order == ref_order).all()
    assert (parent == ref_parent).all()


@pytest.mark.parametrize("seed", range(3))
def test_nest_matches_stack_algorithm_on_deep_nests(seed):
    rng = np.random.default_rng(seed)
    pid, tid, ts, dur, is_slice = deep_track(rng, 6000)
    tid[3000:] = 1  # a second track: a chain must not find a parent on the track before it
    order, parent, _, _ = nest(pid, tid, ts, dur, is_slice)
    ref_order, ref_parent = stack_nest(pid, tid, ts, dur, is_slice)
    assert (order == ref_order).all() and (parent == ref_parent).all()
    d = depths(parent)
    assert d.max() >= 300  # the chains are deep


def chain(n):
    """``n`` events each inside the one before: depth 0, 1, …, n-1."""
    ts = np.arange(n, dtype=np.int64)
    return np.zeros(n, np.int64), np.zeros(n, np.int64), ts, 2 * (n - ts) + 10, np.ones(n, bool)


def test_depth_beyond_int16_through_the_normaliser():
    """60,000 nested events gave 27,232 negative depths (int16); depth is int32 now."""
    from builders import TraceBuilder

    from xpuprof.core.schema import EVENTS
    from xpuprof.trace.normalize import build_tables

    n = 60_000
    tb = TraceBuilder(rank=None)
    for i in range(n):
        tb.op("op", ts=i, dur=2 * (n - i) + 10)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        raw = read_kineto(tb.write(f"{d}/deep.json"))
    t = build_tables(raw.tables, part=0, rank=0, host=None, string_ids=raw.string_ids)
    assert EVENTS.field("depth").type == t.events.schema.field("depth").type
    depth = t.events["depth"].to_numpy()
    index = t.events["index"].to_numpy()
    assert (depth == index).all()  # event i is nested in i-1: depth i


def _seconds(f, *args) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        f(*args)
        best = min(best, time.perf_counter() - t0)
    return best


def _nest_and_depth(pid, tid, ts, dur, is_slice):
    return depths(nest(pid, tid, ts, dur, is_slice)[1])


@pytest.mark.parametrize("shape", ["chain", "chain_then_siblings"])
def test_nesting_time_grows_as_n_log_n_on_deep_nests(shape):
    """30 k nested events took 1.2 s and 120 k took 13-16 s (quadratic); four times the
    events must now cost well under sixteen times the time (n log n: about 4.5x)."""

    def track(n):
        pid, tid, ts, dur, sl = chain(n // 2 if shape != "chain" else n)
        if shape == "chain":
            return pid, tid, ts, dur, sl
        m = n - len(ts)
        start = int((ts + dur).max()) + 1  # after the whole chain, one sibling per step
        sib = start + 3 * np.arange(m, dtype=np.int64)
        return (np.zeros(n, np.int64), np.zeros(n, np.int64), np.r_[ts, sib],
                np.r_[dur, np.ones(m, np.int64)], np.ones(n, bool))  # fmt: skip

    small, large = track(30_000), track(120_000)
    assert _nest_and_depth(*large).max() >= 59_999
    t_small, t_large = _seconds(_nest_and_depth, *small), _seconds(_nest_and_depth, *large)
    assert t_large < 8 * t_small + 0.25, (t_small, t_large)


def test_a_negative_dur_is_kept_without_an_extent(tmp_path):
    """A negative dur (an event the profiler never saw end) was taken as an extent ending
    before the event starts, and could nest it under an event that had already ended. It is
    kept, with a null dur, the source's value in ``extra`` and a note for the report."""
    import json

    from builders import TraceBuilder

    from xpuprof.trace.normalize import build_tables

    tb = TraceBuilder(rank=None)
    tb.op("A", ts=0, dur=18)  # ends at 18 µs, before B starts
    tb.op("B", ts=20, dur=-5)  # as an extent: 20 → 15, "inside" A's reach
    tb.op("C", ts=30, dur=4)
    raw = read_kineto(tb.write(tmp_path / "neg.json"))
    assert any("negative dur" in note and "event 1 of" in note for note in raw.notes)
    t = build_tables(raw.tables, part=0, rank=0, host=None, string_ids=raw.string_ids)
    rows = {r["name"]: r for r in t.events.to_pylist()}
    assert rows["B"]["dur"] is None and json.loads(rows["B"]["extra"]) == {"dur": -5}
    assert rows["B"]["parent"] is None and rows["C"]["parent"] is None
    assert rows["A"]["dur"] == 18_000


def test_inferred_steps_take_indexes_after_every_entry(tmp_path):
    """Inferred step spans are events the normaliser adds: their indexes follow every entry of
    the source (flows and metadata included), and ``Tables.steps_from`` says what made them."""
    from builders import TraceBuilder

    from xpuprof.trace.normalize import build_tables

    tb = TraceBuilder(rank=None)
    for t0 in (0, 100, 200):
        tb.annotation("Optimizer.step#AdamW.step", t0 + 60, 30)
        tb.launch("k", ts=t0 + 20, dur=5, launch_ts=t0 + 10)  # runtime, kernel and 2 flows
    tb.add({"ph": "M", "name": "process_name", "pid": 100, "args": {"name": "python"}})  # last
    raw = read_kineto(tb.write(tmp_path / "t.json"))
    t = build_tables(raw.tables, part=0, rank=0, host=None, string_ids=raw.string_ids)
    assert t.steps_from == "Optimizer.step"
    ev = t.events.to_pandas()
    st = ev[ev.level == "step"].sort_values("ts")
    n_entries = len(tb.events)  # 1 + 3 x (1 + 2 + 2)
    assert n_entries == 16
    assert st["index"].tolist() == [16, 17]
    assert st["ts"].tolist() == [90_000, 190_000] and st["dur"].tolist() == [100_000] * 2
    assert (st.device == -1).all() and set(st.category) == {"xpuprof_inferred_step"}
    kernels = ev[ev.level == "kernel"].sort_values("ts")
    assert kernels.step.isna().tolist() == [True, False, False]
    assert kernels.step.iloc[1:].tolist() == [0, 1]


@pytest.mark.parametrize("seed", range(40))
def test_track_order_is_lexsort(seed: int) -> None:
    """``track_order`` (one stable sort of a packed key, then the ties) gives exactly
    ``np.lexsort((-dur, ts, tid, pid))``: on many ties of track and time, equal durations,
    negative and extreme ids (global instants' tid is int64's minimum), times near the int64
    ends and spans too wide to pack (then it is lexsort itself)."""
    from xpuprof.trace.nesting import track_order

    rng = np.random.default_rng(seed)
    n = int(rng.choice([0, 1, 2, 3, 50, 2000]))
    lo64, hi64 = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    pid = rng.choice(np.array([7, -3, 0, 123456789012, hi64]), n)
    tid = rng.choice(np.array([1, 2, -5, lo64, 40000]), n)
    if seed % 4 == 0:  # times few and often equal: most events tie with another
        ts = rng.integers(0, 5, n)
    elif seed % 4 == 1:  # epoch nanoseconds, as real traces are
        ts = 1_700_000_000_000_000_000 + rng.integers(0, 10**10, n)
    elif seed % 4 == 2:  # a span wider than a packed key holds
        ts = rng.choice(np.array([lo64 + 1, 0, hi64 - 1]), n)
    else:
        ts = np.sort(rng.integers(-(10**6), 10**6, n))  # written in time order
    dur = rng.choice(np.array([0, 0, 1, 5, 10**9]), n)
    want = np.lexsort((-dur, ts, tid, pid))
    got = track_order(pid, tid, ts, dur)
    assert np.array_equal(got, want)

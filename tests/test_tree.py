"""The one event tree (``xpuprof.trace.tree``): parents, depths, ancestors at each level and
outermost-with-value.

Expected values come from elsewhere than the tree: a hand-written trace whose nesting is worked
out on paper below, and, on a real trace, a brute-force nesting computed from the raw JSON
(every span on the same pid/tid that contains the event; the innermost one is its parent).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from builders import TraceBuilder
from conftest import us_to_ns

from xpuprof.trace.tree import EventTree, chain_pairs, outermost, rows_in, walk_up

# ----------------------------------------------------------------------------------------------
# a trace written by hand
# ----------------------------------------------------------------------------------------------

#: The hand trace's host events as (name, thread, start µs, dur µs), and what encloses each,
#: worked out on paper from the intervals: (parent, depth).
HOST = {
    "ProfilerStep#3": (1, 0, 1000, None, 0),
    "fwd": (1, 10, 490, "ProfilerStep#3", 1),
    "aten::linear": (1, 20, 180, "fwd", 2),
    "aten::t": (1, 25, 10, "aten::linear", 3),
    "aten::addmm": (1, 40, 150, "aten::linear", 3),
    "launch_gemm": (1, 50, 10, "aten::addmm", 4),
    "aten::relu": (1, 300, 50, "fwd", 2),
    "launch_relu": (1, 310, 5, "aten::relu", 3),
    "aten::mul": (1, 600, 100, "ProfilerStep#3", 1),
    "aten::empty": (1, 610, 5, "aten::mul", 2),
    "ProfilerStep#4": (1, 1000, 1000, None, 0),
    "aten::add": (1, 1100, 50, "ProfilerStep#4", 1),
    "aten::mm": (2, 100, 50, None, 0),  # another thread: no step span around it there
}


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    tb = TraceBuilder(rank=0)
    for name, (tid, ts, dur, _, _) in HOST.items():
        if name.startswith("ProfilerStep#"):
            tb.step(int(name.split("#")[1]), ts=ts, dur=dur, tid=tid)
        elif name == "fwd":
            tb.annotation(name, ts, dur, tid=tid)
        elif name.startswith("launch_"):
            k = name.removeprefix("launch_")
            tb.launch(k, ts=100 if k == "gemm" else 400, dur=80 if k == "gemm" else 10,
                      launch_ts=ts, launch_dur=dur, call=name, tid=tid)  # fmt: skip
        else:
            tb.op(name, ts, dur, tid=tid)
    tb.instant("[memory]", 612, scope="t", Bytes=64)  # inside aten::empty
    with tb.load(tmp_path_factory.mktemp("tree")) as trace:
        yield trace


def _row(t: EventTree, name: str) -> int:
    (row,) = np.flatnonzero(t.names_of(np.arange(t.n)) == name)
    return int(row)


def _name(t: EventTree, row: int) -> str | None:
    return None if row < 0 else t.names_of(np.array([row]))[0]


def test_parents_and_depths_by_hand(hand) -> None:
    t = hand.tree()
    assert t is hand.tree() and t.n == len(HOST) + 3  # 2 kernels and the instant
    for name, (_, _, _, parent, depth) in HOST.items():
        r = _row(t, name)
        assert _name(t, t.parent[r]) == parent, name
        assert t.depth[r] == depth, name
    mem = _row(t, "[memory]")
    assert _name(t, t.parent[mem]) == "aten::empty" and t.depth[mem] == 3
    for k in ("gemm", "relu"):  # kernels sit alone on their stream
        assert t.parent[_row(t, k)] == -1 and t.depth[_row(t, k)] == 0
    # children in id order; every row's children point back at it
    step = _row(t, "ProfilerStep#3")
    assert [_name(t, c) for c in t.children(step)] == ["fwd", "aten::mul"]
    assert t.child_count()[_row(t, "aten::linear")] == 2
    assert t.child_count().sum() == (t.parent >= 0).sum()
    # the id -> row lookup
    assert (t.rows_of(t.ids) == np.arange(t.n)).all()
    assert t.rows_of([-1, t.ids.max() + 1]).tolist() == [-1, -1]


#: For each event: (nearest op, outermost op, nearest op strictly above, annotation, step),
#: by hand from HOST.
LEVELS_BY_HAND = {
    "launch_gemm": ("aten::addmm", "aten::linear", "aten::addmm", "fwd", "ProfilerStep#3"),
    "aten::addmm": ("aten::addmm", "aten::linear", "aten::linear", "fwd", "ProfilerStep#3"),
    "aten::t": ("aten::t", "aten::linear", "aten::linear", "fwd", "ProfilerStep#3"),
    "aten::linear": ("aten::linear", "aten::linear", None, "fwd", "ProfilerStep#3"),
    "launch_relu": ("aten::relu", "aten::relu", "aten::relu", "fwd", "ProfilerStep#3"),
    "[memory]": ("aten::empty", "aten::mul", "aten::empty", None, "ProfilerStep#3"),
    "aten::add": ("aten::add", "aten::add", None, None, "ProfilerStep#4"),
    "aten::mm": ("aten::mm", "aten::mm", None, None, None),
    "fwd": (None, None, None, "fwd", "ProfilerStep#3"),
    "gemm": (None, None, None, None, None),
}


def test_ancestors_at_each_level_by_hand(hand) -> None:
    t = hand.tree()
    rows = np.array([_row(t, n) for n in LEVELS_BY_HAND])
    got = {
        "op": t.ancestor_at("op", rows),
        "outer": t.ancestor_at("op", rows, farthest=True),
        "strict": t.ancestor_at("op", rows, strict=True),
        "annotation": t.ancestor_at("annotation", rows),
        "step": t.ancestor_at("step", rows),
    }
    for i, (name, want) in enumerate(LEVELS_BY_HAND.items()):
        assert tuple(_name(t, g[i]) for g in got.values()) == want, name
    # the whole-tree walks (one step per depth) agree with the walks from given rows
    for level in ("op", "annotation", "step", "runtime"):
        for farthest in (False, True):
            for strict in (False, True):
                whole = t.ancestor_at(level, farthest=farthest, strict=strict)
                some = t.ancestor_at(level, rows, farthest=farthest, strict=strict)
                assert (whole[rows] == some).all(), (level, farthest, strict)
    # inherit / outermost / above over values: the op names of the ancestors again
    op_rows = np.where(t.is_level("op"), np.arange(t.n), -1)
    assert (t.inherit(op_rows) == t.nearest(t.is_level("op"))).all()
    assert (t.outermost(op_rows) == t.farthest(t.is_level("op"))).all()
    assert (t.above(t.inherit(op_rows)) == t.nearest(t.is_level("op"), strict=True)).all()
    # by name, a predicate evaluated once per distinct name
    big = t.name_mask(lambda s: s.startswith("aten::") and s.endswith("mm"))
    assert _name(t, t.nearest(big, np.array([_row(t, "launch_gemm")]))[0]) == "aten::addmm"


def test_outermost_with_value_by_hand(hand) -> None:
    t = hand.tree()
    valued = ["aten::linear", "aten::addmm", "aten::relu", "aten::mul", "aten::empty"]
    has = np.isin(t.names_of(np.arange(t.n)), valued)
    # addmm is under linear, empty under mul: counted through their outer op only
    want = {"aten::linear", "aten::relu", "aten::mul"}
    got = t.outermost_with_value(has)
    assert set(t.names_of(np.flatnonzero(got))) == want
    # the module function, on rows and on event ids (the events table's id and parent columns)
    assert (outermost(has, t.parent) == got).all()
    parent_ids = np.where(t.parent >= 0, t.ids[np.maximum(t.parent, 0)], -1)
    shuffled = np.random.default_rng(0).permutation(t.n)
    assert (outermost(has[shuffled], parent_ids[shuffled], ids=t.ids[shuffled])
            == got[shuffled]).all()  # fmt: skip


def test_selections_and_launches_by_hand(hand) -> None:
    t = hand.tree()
    names = t.names_of(np.arange(t.n))
    in4 = {"ProfilerStep#4", "aten::add"}
    assert set(names[t.step_mask([4])]) == in4
    # drop-last: the last of the rank's two steps goes, events outside any step stay
    assert set(names[~t.step_mask(drop_last=True)]) == in4
    assert t.step_mask().all()
    # a kernel's launch: the runtime call of its part with its correlation id
    k = np.array([_row(t, "gemm"), _row(t, "relu")])
    calls = t.host_calls(t.part[k], t.correlation[k], runtime_only=True)
    assert [_name(t, c) for c in calls] == ["launch_gemm", "launch_relu"]
    assert t.is_device[k].all() and not t.is_device[calls].any()
    # selections of the tree itself
    host = hand.tree(host_only=True)
    assert host.n == t.n - 2 and not host.is_device.any()
    assert hand.tree(ranks=[0]).n == t.n and hand.tree(ranks=[1]).n == 0


def test_plain_array_walks() -> None:
    # a chain 0 <- 1 <- 2 <- 3 and a lone 4 (parent rows)
    parent = np.array([-1, 0, 1, 2, -1])
    target = np.array([True, False, True, False, True])
    assert walk_up(parent, np.array([3, 4, -1]), target).tolist() == [2, 4, -1]
    assert walk_up(parent, np.array([3, 4]), target, strict=True).tolist() == [2, -1]
    assert walk_up(parent, np.array([3, 2]), target, farthest=True).tolist() == [0, 0]
    assert rows_in(np.array([30, 10, 20]), np.array([20, 30, 5, -1])).tolist() == [2, 0, -1, -1]
    item, node, rnd = chain_pairs(np.array([3, -1]), parent)
    assert sorted(zip(item.tolist(), node.tolist(), rnd.tolist(), strict=True)) == [
        (0, 0, 3), (0, 1, 2), (0, 2, 1), (0, 3, 0)]  # fmt: skip


# ----------------------------------------------------------------------------------------------
# a real trace against a brute-force nesting of its raw JSON
# ----------------------------------------------------------------------------------------------


def brute_parents(events: list[dict], sample: list[int]) -> dict[int, int]:
    """For each sampled event (an index into ``events``): the index of the innermost span that
    contains it on its pid/tid, -1 when none. A span contains what starts within it and ends no
    later; among containers the innermost is the one starting last (the shorter one on equal
    starts, the later in the file on equal intervals)."""
    spans: dict[tuple, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for i, e in enumerate(events):
        if e.get("ph") == "X" and e.get("dur") is not None:
            spans[(e["pid"], e["tid"])].append((us_to_ns(e["ts"]), us_to_ns(e["dur"]), i))
    arrays = {k: np.array(v, dtype=np.int64) for k, v in spans.items()}
    out = {}
    for i in sample:
        e = events[i]
        s = us_to_ns(e["ts"])
        d = us_to_ns(e["dur"]) if e.get("ph") == "X" and e.get("dur") is not None else 0
        a = arrays.get((e["pid"], e["tid"]))
        if a is None:
            out[i] = -1
            continue
        cs, cd, ci = a[:, 0], a[:, 1], a[:, 2]
        before = (cs < s) | ((cs == s) & (cd > d)) | ((cs == s) & (cd == d) & (ci < i))
        inside = before & (cs + cd >= s + d) & (ci != i)
        if not inside.any():
            out[i] = -1
            continue
        c = np.flatnonzero(inside)
        best = c[np.lexsort((ci[c], -cd[c], cs[c]))[-1]]  # last by (start, -dur, index)
        out[i] = int(ci[best])
    return out


def test_parents_agree_with_a_brute_force_nesting_of_the_raw_json(nccl, raw_json) -> None:
    path, trace = nccl
    events = raw_json(path, exact=True)["traceEvents"]
    (part,) = [s["part"] for s in trace.sources]
    t = trace.tree()
    candidates = [i for i, e in enumerate(events)
                  if (e.get("ph") == "X" and e.get("dur") is not None)
                  or (e.get("ph") in ("i", "I") and e.get("s", "t") == "t")]  # fmt: skip
    rng = np.random.default_rng(7)
    sample = sorted(rng.choice(candidates, size=600, replace=False).tolist())
    want = brute_parents(events, sample)
    # follow the brute-force parents up to the top, so that whole chains are compared too
    todo = {p for p in want.values() if p >= 0 and p not in want}
    while todo:
        got = brute_parents(events, sorted(todo))
        want.update(got)
        todo = {p for p in got.values() if p >= 0 and p not in want}
    rows = t.rows_of([(part << 40) | i for i in sample])
    assert (rows >= 0).all()
    nested = 0
    for i, r in zip(sample, rows, strict=True):
        chain_want, j = [], want[i]
        while j >= 0:
            chain_want.append(j)
            j = want[j]
        chain_got, p = [], t.parent[r]
        while p >= 0:
            chain_got.append(int(t.ids[p]) & ((1 << 40) - 1))
            p = t.parent[p]
        assert len(chain_got) == len(chain_want) == t.depth[r], (i, chain_got, chain_want)
        for g, w in zip(chain_got, chain_want, strict=True):
            if g != w:  # two spans with the very same interval: either is innermost
                assert (events[g]["ts"], events[g]["dur"]) == (events[w]["ts"], events[w]["dur"])
        nested += bool(chain_want)
    assert nested > 300, nested
    # and the nearest op above each sampled event is the first op of its brute-force chain
    ops = {"cpu_op", "operator"}
    near = t.ancestor_at("op", rows, strict=True)
    for i, r in zip(sample, near, strict=True):
        chain, j = [], want[i]
        while j >= 0:
            chain.append(j)
            j = want[j]
        first_op = next((j for j in chain if str(events[j].get("cat", "")).lower() in ops
                         and not events[j]["name"].startswith("ProfilerStep#")), None)  # fmt: skip
        got = None if r < 0 else int(t.ids[r]) & ((1 << 40) - 1)
        if got != first_op:
            assert first_op is not None and got is not None, (i, got, first_op)
            assert (events[got]["ts"], events[got]["dur"]) == (
                events[first_op]["ts"], events[first_op]["dur"])  # fmt: skip


def test_walks_on_an_empty_tree_find_nothing() -> None:
    """An empty selection (no events on the ranks asked for) walks to -1, never raises."""
    from xpuprof.trace.tree import walk_up

    empty = np.empty(0, np.int64)
    for strict in (False, True):
        got = walk_up(empty, np.array([-1, -1]), np.empty(0, bool), strict=strict)
        assert got.tolist() == [-1, -1]


def test_the_tree_of_some_ranks_reads_their_parts_alone(tmp_path) -> None:
    """``Trace.tree(ranks)`` reads the files of those ranks' parts only (a rank of a job of
    hundreds costs one rank): three ranks, the tree of rank 1 holds rank 1's host events
    (the SQL count), its lazy columns load from the same files, and no other part's file is
    opened (the other parts' files are removed before the read)."""
    import xpuprof

    files = []
    for r in range(3):
        tb = TraceBuilder(rank=r, world_size=3)
        tb.step(0, 0, 100)
        for i in range(r + 2):
            tb.op(f"aten::op{i}", 10 * i, 5)
        files.append(tb.write(tmp_path / f"rank{r}.json"))
    xpuprof.import_traces(files, tmp_path / "job.store")
    with xpuprof.load(tmp_path / "job.store") as t:
        want = t.sql("select id, ts from events where rank = 1 and device = -1 order by id")
        for s in t.sources:
            if s["rank"] != 1:
                (t.path / s["files"]["events"]).unlink()
        tree = t.tree([1], host_only=True)
        assert tree.ids.tolist() == want["id"].tolist()
        tree.load("ts")
        assert tree.loaded["ts"].tolist() == want["ts"].tolist()

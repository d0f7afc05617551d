"""The job's critical path computed rank by rank (``sim/job_parts.py``): the same rows as the
whole-job replay's :func:`xpuprof.sim.paths.job_path` on the real 8-rank DLRM job, and on a
synthetic job with a different straggler in each step the path worked out by hand, jumping to
each step's straggler at its all-reduce.

Times in the synthetic traces are µs (Kineto's unit); the store holds ns, hence the ×1000.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import xpuprof
from tests.builders import ALLREDUCE, TraceBuilder
from tests.builders import ALLREDUCE_ARGS_4 as ARGS
from xpuprof.sim import replay
from xpuprof.sim.graph import RENDEZVOUS
from xpuprof.sim.job_parts import NotPartitioned, job_path_parts
from xpuprof.sim.paths import job_path
from xpuprof.ui import tools

US = 1000
#: The straggler of each step and its "prep" (µs; every other rank's takes 10 µs).
STRAGGLER = {0: (1, 60), 1: (3, 110), 2: (2, 40)}


def _job(tmp_path):
    """Four ranks, three steps at 0, 1000 and 2000 µs. In step k every rank runs "prep" from
    its step start (10 µs; the straggler of :data:`STRAGGLER` longer), then a 1 µs launch call
    1 µs later; its all-reduce kernel starts 4 µs after the call returns and ends when the last
    rank's has run 20 µs; a device synchronize from the call's end waits until 2 µs after the
    kernel ends and the step ends 3 µs after that."""
    builders = [TraceBuilder(rank=r, world_size=4) for r in range(4)]
    for k, (slow, slow_prep) in STRAGGLER.items():
        base = 1000 * k
        prep = {r: slow_prep if r == slow else 10 for r in range(4)}
        end = base + max(prep.values()) + 6 + 20
        for r, tb in enumerate(builders):
            p = prep[r]
            tb.step(k, ts=base, dur=end + 5 - base)
            tb.op("prep", base, p)
            tb.launch(ALLREDUCE, ts=base + p + 6, dur=end - (base + p + 6), launch_ts=base + p + 1,
                      launch_dur=1, stream=20, **ARGS)  # fmt: skip
            tb.runtime("cudaDeviceSynchronize", base + p + 2, end + 2 - (base + p + 2))
    files = [tb.write(tmp_path / f"rank{r}.json") for r, tb in enumerate(builders)]
    store = tmp_path / "job.store"
    xpuprof.import_traces(files, store)
    return store


def _hand_path() -> pd.DataFrame:
    """The job's critical path by hand, per rank and category (µs). It ends at rank 0's last
    step end (all ranks end step 2 together; the first rank wins the tie) and begins at 0:

    * rank 1 (step 0's straggler): prep 60, 1 to its call, the call 1, launch 4 → 66;
    * rank 3: the all-reduce after the last arrival 20 (communication), its synchronize's
      wake-up 2 (waiting), 3 to its step end, the gap to step 1 at 1000 (909), prep 110, 1, the
      call 1 (host: 1024), launch 4 → 1116;
    * rank 2: communication 20, waiting 2, host 3 + (2000 − 1141) + 40 + 1 + 1 = 904, launch 4
      → 2046;
    * rank 0: communication 20, waiting 2, host 3 → 2071."""
    rows = [(1, "host", 62), (1, "launch", 4),
            (3, "communication", 20), (3, "waiting", 2), (3, "host", 1024), (3, "launch", 4),
            (2, "communication", 20), (2, "waiting", 2), (2, "host", 904), (2, "launch", 4),
            (0, "communication", 20), (0, "waiting", 2), (0, "host", 3)]  # fmt: skip
    return pd.DataFrame(rows, columns=["rank", "category", "us"])


def _runs(seg: pd.DataFrame) -> list[int]:
    """The ranks the path runs on, in order (consecutive segments of one rank: one run)."""
    r = seg["rank"].to_numpy()
    return r[np.r_[True, r[1:] != r[:-1]]].tolist()


def test_the_path_jumps_to_each_steps_straggler(tmp_path):
    with xpuprof.load(_job(tmp_path)) as t:
        seg = job_path_parts(t)
        names = t.sql("select id as event, name from events")
    assert int(seg["ns"].sum()) == 2071 * US
    assert seg["start"].iloc[0] == 0 and seg["end"].iloc[-1] == 2071 * US
    assert (seg["start"].to_numpy()[1:] == seg["end"].to_numpy()[:-1]).all()  # no hole
    assert _runs(seg) == [1, 3, 2, 0]
    got = seg.groupby(["rank", "category"])["ns"].sum().to_dict()
    want = _hand_path().set_index(["rank", "category"])["us"] * US
    assert got == want.to_dict()
    prep = seg.merge(names, on="event")
    prep = prep[prep["name"] == "prep"].groupby("rank")["ns"].sum()
    assert prep.to_dict() == {1: 60 * US, 3: 110 * US, 2: 40 * US}


@pytest.mark.parametrize("per_worker", [4, 1])
def test_the_ranks_tool_on_dask_gives_the_whole_replays_tables(tmp_path, monkeypatch, per_worker):
    """``ranks`` with 2 workers takes the partitioned path (Dask tasks on a LocalCluster):
    its path tables equal those of the whole replay (``--workers 1``, 4 ranks: one process),
    with a task per rank and with tasks of two ranks each (their graphs built in turn)."""
    from xpuprof.analysis import per_rank

    store = _job(tmp_path)
    with xpuprof.load(store) as t:
        here = tools.run("ranks", t, workers=1)
    monkeypatch.setattr(per_rank, "GROUPS_PER_WORKER", per_worker)
    tasks = []
    real = per_rank._on_dask

    def on_dask(path, units, target, *a):
        tasks.append((target, units))
        return real(path, units, target, *a)

    monkeypatch.setattr(per_rank, "_on_dask", on_dask)
    with xpuprof.load(store) as t:
        there = tools.run("ranks", t, workers=2)
    terms = [[len(g) for _, g, _ in units] for target, units in tasks
             if target.endswith(":part_terms")]  # fmt: skip
    assert terms == [[1, 1, 1, 1] if per_worker == 4 else [2, 2]], tasks
    assert any("replayed rank by rank" in n for n in there.notes)
    assert not any("replayed rank by rank" in n for n in here.notes)
    for name in ("path", "path_events", "path_ranks"):
        pd.testing.assert_frame_equal(here.tables[name], there.tables[name])
    for k in ("path_ns", "path_rank", "path_rank_share", "path_crossings"):
        assert here.facts[k] == there.facts[k]
    assert there.facts["path_ns"] == 2071 * US and there.facts["path_crossings"] == 3


def test_dlrm_partitioned_path_is_the_whole_replays(dlrm_store):
    """The real 8-rank DLRM job: every segment (rank, category, event, start, end) to the ns.
    The identity replay moves some rendezvous off the measured last arrival (a collective's
    end is modelled), which is why the partition solves them rather than copying the measured
    ones: the whole replay's rendezvous times are checked to differ from the measured ones."""
    t, _ = dlrm_store
    rep = replay(t)
    whole = job_path(rep)
    parts = job_path_parts(t)
    pd.testing.assert_frame_equal(parts, whole, check_dtype=False)
    g = rep.graph
    rz = np.flatnonzero(g.nodes.kind == RENDEZVOUS)
    assert (rep.schedule.time[rz] != g.aligned[rz]).any()


def test_a_store_with_host_collectives_is_not_partitioned(tmp_path):
    """gloo's host spans (their hand-off edges) are replayed whole only: a clear refusal."""
    builders = [TraceBuilder(rank=r, world_size=2) for r in range(2)]
    for r, tb in enumerate(builders):
        tb.step(0, ts=0, dur=100)
        tb.op("gloo:all_reduce", 10 + r, 20)
    files = [tb.write(tmp_path / f"rank{r}.json") for r, tb in enumerate(builders)]
    xpuprof.import_traces(files, tmp_path / "g.store")
    with xpuprof.load(tmp_path / "g.store") as t, pytest.raises(NotPartitioned, match="host"):
        job_path_parts(t)


def test_a_step_selection_starts_the_path_at_its_first_step(tmp_path):
    """Steps 1 and 2 only (each rank's replay window): the path begins at step 1's start
    (1000 µs) on rank 3, step 1's straggler, whose 110 µs prep is its first work, and ends at
    rank 0's step 2 end (2071 µs): 1071 µs, rank 3 up to its launch (1116), then as in
    :func:`_hand_path`. The same rows as the whole replay of those steps."""
    with xpuprof.load(_job(tmp_path)) as t:
        seg = job_path_parts(t, steps=[1, 2])
        whole = job_path(replay(t, steps=[1, 2]))
    pd.testing.assert_frame_equal(seg, whole, check_dtype=False)
    assert seg["start"].iloc[0] == 1000 * US and int(seg["ns"].sum()) == 1071 * US
    assert _runs(seg) == [3, 2, 0]
    three = seg[seg["rank"] == 3].groupby("category")["ns"].sum().to_dict()
    assert three == {"host": 112 * US, "launch": 4 * US}


def test_terms_in_blocks_of_one_rendezvous_give_the_same_path(tmp_path, monkeypatch):
    """A task's vectors are computed in blocks of columns when the graph is large
    (``BLOCK_CELLS``): one rendezvous per block here, the same rows as the whole replay."""
    from xpuprof.sim import job_parts

    monkeypatch.setattr(job_parts, "BLOCK_CELLS", 1)
    with xpuprof.load(_job(tmp_path)) as t:
        seg = job_path_parts(t)
        whole = job_path(replay(t))
    pd.testing.assert_frame_equal(seg, whole, check_dtype=False)
    assert int(seg["ns"].sum()) == 2071 * US


def test_pruned_terms_keep_each_step_end_on_its_own_last_rendezvous(tmp_path):
    """A rank's step k ends after its all-reduce k, which starts after R_(k-1) … so once the
    terms every later rendezvous bounds are pruned, each step end depends on its own step's
    rendezvous alone; the values at the whole replay's rendezvous times are unchanged."""
    from xpuprof.analysis.per_rank import run_part
    from xpuprof.sim import job_parts

    store = _job(tmp_path)
    with xpuprof.load(store) as t:
        parts = [int(s["part"]) for s in t.sources]
        offsets, rows = job_parts.plan(t, parts, {}, "auto")
        rep = replay(t)
    g = rep.graph
    keys = sorted(set(rows["key"]))
    assert len(keys) == 3
    rz = np.flatnonzero(g.nodes.kind == RENDEZVOUS)  # the whole graph's, in key order
    R = rep.schedule.time[rz]
    last = rows.drop_duplicates("key").set_index("key")
    mine = rows[rows["part"] == 0]
    plan = mine[["id", "key"]].assign(
        transfer_ns=last["transfer_ns"].reindex(mine["key"]).to_numpy(),
        rendezvous_ns=last["rendezvous_ns"].reindex(mine["key"]).to_numpy(),
        arrival_ns=last["rendezvous_ns"].reindex(mine["key"]).to_numpy(),
    )
    seed = {job_parts.SEED: {0: {"offset": offsets[0], "plan": plan.reset_index(drop=True),
                                 "window": None, "align": "auto"}}}  # fmt: skip
    pruned = run_part(str(store), 0, "xpuprof.sim.job_parts:part_terms", seed, {})[0]
    orig = job_parts.prune
    try:
        job_parts.prune = lambda t, key_col: t
        dense = run_part(str(store), 0, "xpuprof.sim.job_parts:part_terms", seed, {})[0]
    finally:
        job_parts.prune = orig
    gcols = np.array([keys.index(k) for k in pruned["keys"]])
    n_rows = len(pruned["c"])
    for i in range(n_rows):
        assert job_parts.term_value(pruned, i, R, gcols) == job_parts.term_value(dense, i, R, gcols)
    ends = range(n_rows - 3, n_rows)  # the steps' ends, steps 0, 1, 2
    cols = [pruned["col"][pruned["ptr"][i] : pruned["ptr"][i + 1]].tolist() for i in ends]
    assert [[keys[gcols[c]] for c in cs] for cs in cols] == [[k] for k in keys]
    assert len(dense["col"]) > len(pruned["col"])

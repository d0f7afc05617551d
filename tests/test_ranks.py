"""The cross-rank views (``xpuprof ranks``): who holds each step back and why, wait vs transfer
per rank, and the job's critical path across ranks — on synthetic jobs whose answers are worked
out by hand, and on the real 8-rank DLRM job against numbers computed from its raw JSON.

Times in the synthetic traces are µs (Kineto's unit); the store holds ns, hence the ×1000.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os

import numpy as np
import pandas as pd
import pytest

import xpuprof
from tests.builders import ALLREDUCE, TraceBuilder
from tests.builders import ALLREDUCE_ARGS_4 as ARGS
from tests.conftest import cli
from tests.conftest import shared as shared_trace
from xpuprof.analysis.ranks import rank_steps
from xpuprof.ui import tools

US = 1000


def _job(
    tmp_path,
    prep: dict[tuple[int, int], float],
    late: dict[tuple[int, int], float],
    reverse: bool = False,
):
    """Four ranks, three steps at 0, 1000 and 2000 µs (``reverse``: the store lists them 3, 2,
    1, 0, its files named and given in that order). In each step a rank runs "prep" (10 µs,
    or ``prep[(rank, step)]``) from its step start (0, or ``late[(rank, step)]`` µs late),
    launches an all-reduce (1 µs call, the kernel 5 µs after it) whose kernel ends when the
    last rank's has run 20 µs of transfer, waits for it in a device synchronize (until 2 µs
    after it ends) and ends its step 5 µs after the kernel."""
    files = []
    builders = [TraceBuilder(rank=r, world_size=4) for r in range(4)]
    for k in range(3):
        base = 1000 * k
        starts = {}
        for r in range(4):
            s = base + late.get((r, k), 0)
            starts[r] = s + prep.get((r, k), 10) + 1 + 5
        end = max(starts.values()) + 20
        for r, tb in enumerate(builders):
            s = base + late.get((r, k), 0)
            p = prep.get((r, k), 10)
            tb.step(k, ts=s, dur=end + 5 - s)
            tb.op("prep", s, p)
            tb.launch(ALLREDUCE, ts=starts[r], dur=end - starts[r], launch_ts=s + p + 1,
                      launch_dur=1, stream=20, **ARGS)  # fmt: skip
            tb.runtime("cudaDeviceSynchronize", s + p + 2, end + 2 - (s + p + 2))
    for r, tb in enumerate(builders):
        files.append(tb.write(tmp_path / f"rank{3 - r if reverse else r}.json"))
    files = files[::-1] if reverse else files
    store = tmp_path / "job.store"
    xpuprof.import_traces(files, store)
    return store


def test_the_rank_others_wait_for_holds_the_step_and_its_extra_work_is_the_cause(tmp_path):
    """Step 1: rank 2's prep takes 110 µs instead of 10, so it launches at 111 and its
    all-reduce starts at 116 instead of 16: the three others wait 100 µs each (300 µs caused),
    and the cause is 100 µs more framework CPU work ("cpu") than the median rank. Steps 0 and
    2: nobody waits, so the holder is the longest step and there is no cause."""
    with xpuprof.load(_job(tmp_path, {(2, 1): 110}, {})) as t:
        res = rank_steps(t)
    slow = res.tables["slowest"].set_index("step")
    assert slow.loc[1, "holder"] == 2 and slow.loc[1, "basis"] == "waited for"
    assert slow.loc[1, "caused_ns"] == 3 * 100 * US
    assert slow.loc[1, "cause"] == "cpu" and slow.loc[1, "cause_ns"] == 100 * US
    assert slow.loc[1, "late_start_ns"] == 0
    assert list(slow.loc[[0, 2], "basis"]) == ["longest step", "longest step"]
    assert slow.loc[[0, 2], "cause"].isna().all()
    assert res.facts["holder"] == 2 and res.facts["held_steps"] == 1
    assert "Rank 2 held the job back in 1 of 3 step(s)" in res.facts["headline"]
    # 300 µs caused in all, by the three others' 100 µs each
    assert "the other 3 rank(s) waited 300 µs per step" in res.facts["headline"]
    assert "(100 µs each on average)" in res.facts["headline"]
    # a one-off: rank 2 usually causes no wait (median of 0, 300, 0 µs)
    out = res.tables["outliers"]
    assert list(out[["rank", "step"]].itertuples(index=False, name=None)) == [(2, 1)]
    assert out["usual_ns"].iloc[0] == 0 and out["excess_ns"].iloc[0] == 300 * US
    assert (res.facts["outlier_rank"], res.facts["outlier_step"]) == (2, 1)
    # wait vs transfer per rank: rank 2 waited for nobody; the others 100 µs each in step 1;
    # every rank's transfer is its kernels' time minus its waits
    w = res.tables["waits"].set_index("rank")
    assert w.loc[2, "wait_ns"] == 0 and w.loc[2, "caused_ns"] == 300 * US
    assert (w.loc[[0, 1, 3], "wait_ns"] == 100 * US).all()
    assert (w["transfer_ns"] == w["collective_ns"] - w["wait_ns"]).all()
    assert (w.loc[[0, 1, 3], "transfer_ns"] == 3 * 20 * US).all()


def test_a_late_start_is_named_as_the_cause(tmp_path):
    """Step 2: rank 1 starts 80 µs after the others (median start: the others' 2000 µs) and
    does the same work: it holds the step (3 × 80 µs of waiting) because of its late start."""
    with xpuprof.load(_job(tmp_path, {}, {(1, 2): 80})) as t:
        res = rank_steps(t)
    slow = res.tables["slowest"].set_index("step")
    assert slow.loc[2, "holder"] == 1 and slow.loc[2, "caused_ns"] == 3 * 80 * US
    assert slow.loc[2, "cause"] == "late start" and slow.loc[2, "cause_ns"] == 80 * US
    steps = res.tables["steps"].set_index(["step", "rank"])
    assert steps.loc[(2, 1), "late_start_ns"] == 80 * US
    assert any("started its step late" in n for n in res.notes)


def test_job_critical_path_runs_through_the_slow_ranks_work(tmp_path):
    """In step 1 the path into the all-reduce's end comes from rank 2 (the last to arrive):
    its 110 µs prep is on the job's critical path; no other rank's prep of that step is. In
    steps 0 and 2 every rank arrives together and the path takes one rank's 10 µs prep, so
    the path passes "prep" three times in all: one row per rank and name, summed."""
    with xpuprof.load(_job(tmp_path, {(2, 1): 110}, {})) as t:
        res = tools.run("ranks", t)
    ev = res.tables["path_events"]
    prep = ev[ev["name"] == "prep"].set_index("rank")
    assert prep.index.is_unique  # one row per rank, not one per step
    assert prep.loc[2, "max_ns"] == 110 * US
    assert prep.loc[2, "time_ns"] == 110 * US + 10 * US * (prep.loc[2, "count"] - 1)
    assert (prep.drop(index=2)["max_ns"] == 10 * US).all()
    assert prep["count"].sum() == 3
    assert prep["time_ns"].sum() == (110 + 10 + 10) * US
    assert res.facts["path_crossings"] >= 1
    runs = res.tables["path_ranks"]
    assert int(runs["time_ns"].sum()) == res.facts["path_ns"]


def test_a_rank_late_every_step_is_the_holder_not_an_outlier(tmp_path):
    """Rank 3's prep takes 50 µs longer in every step: it holds each step (3 × 50 µs caused),
    and since that is what it usually does, no step of it is an outlier."""
    slow = {(3, k): 60 for k in range(3)}
    with xpuprof.load(_job(tmp_path, slow, {})) as t:
        res = rank_steps(t)
    assert res.tables["slowest"]["holder"].tolist() == [3, 3, 3]
    assert res.tables["slowest"]["caused_ns"].tolist() == [150 * US] * 3
    assert res.tables["outliers"].empty and "outlier_rank" not in res.facts


def test_per_rank_tasks_on_dask_equal_the_in_process_answer(tmp_path):
    """The per-rank critical paths as Dask tasks on a real LocalCluster of 2 workers, each
    task opening one part of the store: the same tables as one process computing every rank."""
    store = _job(tmp_path, {(2, 1): 110}, {(1, 2): 80})
    with xpuprof.load(store) as t:
        here = rank_steps(t)
    with xpuprof.load(store) as t:
        there = rank_steps(t, workers=2)
    assert set(here.tables) == set(there.tables)
    for name, table in here.tables.items():
        pd.testing.assert_frame_equal(table, there.tables[name], check_dtype=False)
    assert here.facts == there.facts


def test_ranks_command_on_a_cluster_by_address(tmp_path):
    """``xpuprof ranks STORE --scheduler ADDRESS`` (a user's own cluster; here a LocalCluster
    started by the test): the per-rank work runs there, and the answer is the in-process one."""
    from dask.distributed import LocalCluster

    store = _job(tmp_path, {(2, 1): 110}, {})
    with xpuprof.load(store) as t:
        here = rank_steps(t)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        proc = cli("ranks", str(store), "--no-path", "--json", "--scheduler",
                   cluster.scheduler_address)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["facts"]["holder"] == here.facts["holder"] == 2
    assert [r["caused_ns"] for r in doc["tables"]["slowest"]] == here.tables["slowest"][
        "caused_ns"
    ].tolist()


def test_diagnosis_of_many_ranks_as_tasks_equals_one_process(tmp_path, monkeypatch):
    """From :data:`~xpuprof.analysis.per_rank.DASK_MIN_PARTS` ranks up the diagnosis (what
    the overview and the advisor read) runs one Dask task per rank; lowered to 2 here, the
    4-rank job's tables and facts equal the one-process answer."""
    from xpuprof.analysis import per_rank
    from xpuprof.analysis.diagnosis import diagnosis

    store = _job(tmp_path, {(2, 1): 110}, {(1, 2): 80})
    with xpuprof.load(store) as t:
        here = diagnosis(t)
    monkeypatch.setattr(per_rank, "DASK_MIN_PARTS", 2)
    monkeypatch.setattr(per_rank, "DASK_MIN_EVENTS", 0)
    with xpuprof.load(store) as t:
        there = diagnosis(t)
    assert set(here.tables) == set(there.tables) == {"steps", "summary", "events"}
    for name, table in here.tables.items():
        pd.testing.assert_frame_equal(table, there.tables[name], check_dtype=False)
    assert here.facts == there.facts and here.notes == there.notes
    assert "comm_wait" in set(here.tables["summary"]["category"])  # the seeded waits counted


def test_overview_of_many_ranks_as_tasks_equals_one_process(tmp_path, monkeypatch):
    """From :data:`~xpuprof.analysis.per_rank.DASK_MIN_PARTS` ranks up the overview runs one
    Dask task per rank (its step breakdown, diagnosis, roofline share and top sums); lowered
    to 2 here, the 4-rank job's tables, facts and notes equal the one-process answer, and
    the diagnosis it leaves for the advisor equals one made in one process."""
    from xpuprof.analysis import per_rank
    from xpuprof.analysis.diagnosis import diagnosis
    from xpuprof.analysis.overview import overview

    # the 4-rank job of these tests, and a CPU run of 3 ranks (no device events: their ops
    # are their compute)
    cpu = []
    for r in range(3):
        tb = TraceBuilder(rank=r, world_size=3)
        for k in range(2):
            tb.step(k, 100 * k, 100)
            tb.op("aten::mm", 100 * k, 40 + 10 * r)
        cpu.append(tb.write(tmp_path / f"cpu{r}.json"))
    xpuprof.import_traces(cpu, tmp_path / "cpu.store")
    stores = [_job(tmp_path, {(2, 1): 110}, {(1, 2): 80}), tmp_path / "cpu.store"]
    got = []
    for store in stores:
        monkeypatch.setattr(per_rank, "DASK_MIN_PARTS", 32)
        with xpuprof.load(store) as t:
            here, here_dx = overview(t), diagnosis(t)
        monkeypatch.setattr(per_rank, "DASK_MIN_PARTS", 2)
        monkeypatch.setattr(per_rank, "DASK_MIN_EVENTS", 0)
        with xpuprof.load(store) as t:
            there = overview(t)
            assert ("analysis.diagnosis", None, "all", None, 5) in t.memo  # left by the tasks
            there_dx = diagnosis(t)
        for a, b in ((here, there), (here_dx, there_dx)):
            assert set(a.tables) == set(b.tables)
            for name, table in a.tables.items():
                pd.testing.assert_frame_equal(table, b.tables[name], check_dtype=False)
            assert a.facts == b.facts and a.notes == b.notes
        got.append(there)
    # the 4 ranks' prep ops: 10 µs each, 3 steps, but rank 2 step 1 110 µs: 12 calls, 220 µs
    ops = got[0]["top_ops"].set_index("op")
    assert ops.loc["prep", "calls"] == 12 and ops.loc["prep", "self_ms"] == pytest.approx(0.22)
    # the CPU run: aten::mm is each rank's compute, 40/50/60 µs of its 100 µs steps
    s = got[1]["summary"].set_index("rank")
    assert got[1].facts["host_only"] and s["compute_fraction"].tolist() == pytest.approx(
        [0.4, 0.5, 0.6]
    )


def test_groups_of_ranks_give_the_one_process_answer(tmp_path, monkeypatch):
    """Several ranks per task (:func:`xpuprof.analysis.per_rank.map_groups`): on a real
    2-worker cluster, two groups of two ranks (``GROUPS_PER_WORKER`` lowered to 1), and in this
    process with one worker, groups of at most two ranks' events (``GROUP_MAX_EVENTS`` lowered
    below the job's); the collectives (identified and measured per group, matched across
    ranks after), the diagnosis, the overview and the ranks tool give the one-process answer,
    table for table. The store lists its ranks 3, 2, 1, 0: answers joined in the
    groups' order instead of the one process's would differ."""
    from xpuprof.analysis import per_rank
    from xpuprof.analysis.comm import collectives
    from xpuprof.analysis.diagnosis import diagnosis
    from xpuprof.analysis.overview import overview

    store = _job(tmp_path, {(2, 1): 110}, {(1, 2): 80}, reverse=True)

    def answers(**kw):
        with xpuprof.load(store) as t:
            return collectives(t), overview(t), diagnosis(t), rank_steps(t, **kw)

    here = answers()
    with xpuprof.load(store) as t:
        assert [s["rank"] for s in t.sources] == [3, 2, 1, 0]
        parts = per_rank.selected_parts(t, None)
        sizes = [s["rows"]["events"] for s in t.sources]
        assert not per_rank.grouped(t, parts)  # the one-process answer above: one pass
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # 2 workers, also on a bigger machine
    monkeypatch.setattr(per_rank, "DASK_MIN_PARTS", 2)
    monkeypatch.setattr(per_rank, "DASK_MIN_EVENTS", 0)
    monkeypatch.setattr(
        importlib.import_module("xpuprof.analysis.comm"), "DASK_MIN_EVENTS_ALONE", 0
    )
    monkeypatch.setattr(per_rank, "GROUPS_PER_WORKER", 1)
    with xpuprof.load(store) as t:
        assert per_rank.part_groups(t, parts, 2) == [parts[:2], parts[2:]]
    on_dask = answers(workers=2)
    monkeypatch.setattr(per_rank, "DASK_MIN_PARTS", 32)
    monkeypatch.setattr(per_rank, "GROUP_MAX_EVENTS", max(sizes[0] + sizes[1], sizes[2] + sizes[3]))
    ran = []
    real = per_rank.run_part
    monkeypatch.setattr(
        per_rank, "run_part", lambda path, p, *a: ran.append(p) or real(path, p, *a)
    )
    with xpuprof.load(store) as t:
        assert per_rank.grouped(t, parts) and not per_rank.on_dask(len(parts))
    in_groups = answers(workers=1)
    assert ran and all(g in (parts[:2], parts[2:]) for g in ran)
    for there in (on_dask, in_groups):
        for a, b in zip(here, there, strict=True):
            assert set(a.tables) == set(b.tables)
            for name, table in a.tables.items():
                pd.testing.assert_frame_equal(table, b.tables[name], check_dtype=False)
            assert a.facts == b.facts and a.notes == b.notes
    assert here[3].facts["holder"] == 2  # the job's own answer, worked out in the tests above
    assert len(here[0].tables["skew"]) == 3  # three all-reduces matched across the 4 ranks


def test_part_groups_rule(tmp_path, monkeypatch):
    """Groups are runs of consecutive parts of at most ``GROUP_MAX_EVENTS`` events, and of
    at most 1 / (``GROUPS_PER_WORKER`` x workers) of all; a part over that is a group alone.
    Parts of 40, 10, 10, 30, 5 and 5 events, by hand: with 1 worker and a cap of 50 events,
    [40, 10] [10, 30, 5, 5]; with 2 workers and 2 groups per worker, at most 100 // 4 = 25
    each: [40] [10, 10] [30] [5, 5]."""
    from xpuprof.analysis import per_rank

    class T:
        sources = [{"part": p, "rows": {"events": n}}
                   for p, n in enumerate([40, 10, 10, 30, 5, 5])]  # fmt: skip

    monkeypatch.setattr(per_rank, "GROUP_MAX_EVENTS", 50)
    monkeypatch.setattr(per_rank, "GROUPS_PER_WORKER", 2)
    parts = list(range(6))
    assert per_rank.part_groups(T, parts, 1) == [[0, 1], [2, 3, 4, 5]]
    assert per_rank.part_groups(T, parts, 2) == [[0], [1, 2], [3], [4, 5]]
    # over the cap with one worker: analysed group by group here; a single part never is
    assert per_rank.grouped(T, parts, workers=1) and not per_rank.grouped(T, [0], workers=1)
    assert not per_rank.grouped(T, [4, 5], workers=1)


def test_a_trace_of_some_parts_reads_only_those(tmp_path):
    """``Trace(path, parts=[p])``: the events of part p only (counted with SQL on the whole
    store), its manifest's row totals recounted; an unknown part is a clear error."""
    from xpuprof.core.errors import XpuprofError

    store = _job(tmp_path, {}, {})
    with xpuprof.Trace(store) as whole:
        n = whole.sql("select part, count(*) as n from events group by part").set_index("part")
    with xpuprof.Trace(store, parts=[2]) as one:
        assert [s["part"] for s in one.sources] == [2]
        got = one.sql("select part, count(*) as n from events group by part")
        assert got["part"].tolist() == [2] and int(got["n"].iloc[0]) == int(n.loc[2, "n"])
        assert one.manifest["rows"]["events"] == int(n.loc[2, "n"])
    with pytest.raises(XpuprofError, match="no part"):
        xpuprof.Trace(store, parts=[9])


def test_a_trace_of_some_parts_looks_up_only_their_files(tmp_path):
    """Part 1's events file gone: the whole store and a view holding part 1 refuse to open,
    naming the file; a view of parts 0 and 2 (what a task of those ranks opens) does not
    look the missing file up and reads its parts (the same counts as before the loss). A
    path out of the store is refused whichever parts are asked for."""
    from xpuprof.core.errors import StoreError

    store = _job(tmp_path, {}, {})
    with xpuprof.Trace(store) as whole:
        n = whole.sql("select part, count(*) as n from events group by part").set_index("part")
    m = json.loads((store / "manifest.json").read_text())
    gone = store / next(s for s in m["sources"] if s["part"] == 1)["files"]["events"]
    gone.unlink()
    for parts in (None, [1], [0, 1]):
        with pytest.raises(StoreError, match=f"{gone.name}: missing"):
            xpuprof.Trace(store, parts=parts)
    with xpuprof.Trace(store, parts=[0, 2]) as some:
        got = some.sql("select part, count(*) as n from events group by part order by part")
        assert got["n"].tolist() == [int(n.loc[0, "n"]), int(n.loc[2, "n"])]
    m["sources"][1]["files"]["events"] = "events/../../outside.parquet"
    (store / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(StoreError, match="not a path inside the store"):
        xpuprof.Trace(store, parts=[0])


def test_one_rank_says_there_is_nothing_to_compare(tmp_path):
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=100)
    tb.op("prep", 0, 10)
    with tb.load(tmp_path) as t:
        res = rank_steps(t)
    assert not res.tables and any("one rank" in n for n in res.notes)


def test_cli_ranks_json_and_text(tmp_path):
    store = _job(tmp_path, {(2, 1): 110}, {})
    proc = cli("ranks", str(store), "--json", "--no-path")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["facts"]["holder"] == 2
    assert "path" not in doc["tables"]
    proc = cli("ranks", str(store), env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.splitlines()[0].startswith("Rank 2 held the job back")
    assert max(len(x) for x in text.splitlines()) <= 80


# -- the real 8-rank DLRM job ---------------------------------------------------------------


def _raw_collectives(path) -> list[tuple[int, int]]:
    """(start, dur) in ns of a rank's NCCL kernels, in time order, from the raw JSON."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ks = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"
          and "nccl" in e["name"].lower()]  # fmt: skip
    ks.sort(key=lambda e: e["ts"])
    return [(round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in ks]


def test_dlrm_holder_and_waits_agree_with_the_raw_json(tmp_path):
    """From the raw files: the k-th NCCL kernel of every rank is one collective; its last
    participant is the rank that starts it last, and each other rank waits for it (last start
    − own start, at most its kernel's duration). The rank the others waited for most must be
    the holder, with that much waiting caused (to 1 %: the comm tool aligns clocks on the
    collectives' ends, sub-µs shifts here)."""
    folder = shared_trace("kineto/gpu/dlrm_8rank_v100")
    files = sorted(folder.glob("*.json.gz"))
    raw = {int(f.name[len("worker") :].split("_")[0]): _raw_collectives(f) for f in files}
    n = min(len(v) for v in raw.values())
    caused = np.zeros(8)
    for k in range(n):
        starts = {r: raw[r][k][0] for r in raw}
        last = max(starts, key=starts.__getitem__)
        caused[last] += sum(min(starts[last] - s, raw[r][k][1]) for r, s in starts.items()
                            if r != last)  # fmt: skip
    xpuprof.import_traces(files, tmp_path / "dlrm.store")
    with xpuprof.load(tmp_path / "dlrm.store") as t:
        res = tools.run("ranks", t)
    slow = res.tables["slowest"]
    assert len(slow) == 1
    assert int(slow["holder"].iloc[0]) == int(np.argmax(caused))
    got = res.tables["steps"].set_index("rank")["caused_ns"]
    for r in range(8):
        assert got[r] == pytest.approx(caused[r], rel=0.01, abs=2 * US)
    # the critical path of the job starts on the holder, which started its step late
    runs = res.tables["path_ranks"]
    assert int(runs["rank"].iloc[0]) == int(np.argmax(caused))
    assert res.tables["path"].iloc[0]["category"] == "late start"


def test_the_overviews_workers_reach_the_advisors_diagnosis(tmp_path, monkeypatch):
    """``xpuprof overview --workers N`` (``tools.overview(workers=N)``): the overview and the
    diagnosis its advisor asks for both run their per-rank work on a cluster of N workers
    (counted: the cluster is asked for once per analysis, not by a default), and the answer
    is the one process's; with ``workers=1`` nothing goes to Dask."""
    from xpuprof.analysis import per_rank

    store = _job(tmp_path, {(2, 1): 110}, {(1, 2): 80})
    calls = []
    real = per_rank._on_dask
    monkeypatch.setattr(per_rank, "_on_dask", lambda *a: calls.append(a[4]) or real(*a))
    with xpuprof.load(store) as t:
        here = tools.overview(t, workers=1)
    assert calls == []
    import contextlib

    from xpuprof.trace import ingest

    started, closed = [], []
    real_cluster = ingest.local_cluster

    @contextlib.contextmanager
    def counted(workers, *, method):
        started.append(workers)
        with real_cluster(workers, method=method) as cluster:
            yield cluster
        closed.append(workers)

    monkeypatch.setattr(ingest, "local_cluster", counted)
    with xpuprof.load(store) as t:
        there = tools.overview(t, workers=2)
    # the collectives' per-rank half (the tasks' seeds are made of it), then the overview's
    # tasks; its diagnosis, made of them, is reused; both on one cluster, closed on return
    assert calls == [2, 2]
    assert started == closed == [2] and getattr(per_rank._defaults, "pool", None) is None
    with xpuprof.load(store) as t:  # a call of its own: its own cluster, closed on return
        per_rank.map_groups(t, "xpuprof.analysis.overview:part_overview", [0, 1], workers=2)
    assert started == closed == [2, 2]
    with per_rank.cluster_options(workers=2):
        with per_rank.cluster_options(workers=1):
            assert not per_rank.on_dask(64)
        assert per_rank.on_dask(4)
    assert not per_rank.on_dask(4) and per_rank.on_dask(64) == ((os.cpu_count() or 1) > 1)
    # by default, many parts go to Dask only with more events than one process handles well
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert not per_rank.on_dask(64, events=per_rank.DASK_MIN_EVENTS)
    assert per_rank.on_dask(64, events=per_rank.DASK_MIN_EVENTS + 1)
    assert per_rank.on_dask(4, workers=2, events=10)  # unless told
    for name, table in here.tables.items():
        pd.testing.assert_frame_equal(table, there.tables[name], check_dtype=False)
    assert here.facts == there.facts
    assert here.facts["headline"].startswith("Bottleneck")

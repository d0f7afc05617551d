"""Distributed capture: the ranks of a real ``torch.distributed`` (gloo, CPU) training job all
profile into one store (``xpuprof.profile(out=SAME)``), as under torchrun.

Each rank is its own process, started here the way torchrun starts them (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` in the environment; ``init_method=file://``).
Checked against what the ranks record themselves, not against the code under test: their
rank, world size, backend, host and process groups as ``torch.distributed``/``socket`` tell
them, the steps and all-reduce calls their loop ran (counted in the loop), and the raw Kineto
JSON that torch's profiler wrote in each rank (kept: ``workdir=``), read here with ``json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from conftest import EXAMPLE

import xpuprof
from xpuprof.core.errors import XpuprofError
from xpuprof.trace import store as st
from xpuprof.trace.rankparts import check_join
from xpuprof.trace.trace import Trace

pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")

WARMUP, STEPS = 1, 3

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE",
                 "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                 "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "MASTER_ADDR", "MASTER_PORT")  # fmt: skip


@pytest.fixture
def plain_process(monkeypatch):
    """This process as no launcher started it and without torch.distributed (whatever the
    machine's environment or other tests set): the tests then set what they mean."""
    from xpuprof.live import job

    monkeypatch.setattr(job, "_torch_dist", lambda: None)
    for k in LAUNCHER_VARS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


WORKER = textwrap.dedent(
    """
    import json, os, socket, sys
    import torch
    import torch.distributed as dist
    import xpuprof

    init, out, work, mode = sys.argv[1:5]
    warmup, steps = int(sys.argv[5]), int(sys.argv[6])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    solo = dist.new_group(ranks=[0])  # a second process group, for the part's pg_config
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    fact = {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "backend": str(dist.get_backend()), "host": socket.gethostname(),
            "pid": os.getpid(), "steps": 0, "all_reduce": 0}
    if mode == "crash" and rank == 2:
        # die in the commit, holding the store's lock, after moving its files into the store
        # and before the manifest names them: the worst moment for the others' parts
        from xpuprof.trace import store as st
        real = st.write_manifest
        def dying(root, manifest):
            if root.name == "job.store":
                os._exit(3)
            real(root, manifest)
        st.write_manifest = dying

    def train(i):
        xpuprof.step(i)
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        for p in net.parameters():
            dist.all_reduce(p.grad)
            fact["all_reduce"] += 1
        opt.step()
        fact["steps"] += 1

    try:
        with xpuprof.profile(out, level="op", warmup=warmup, steps=steps, workdir=work):
            for i in range(warmup):
                train(i)
            fact["steps"] = fact["all_reduce"] = 0  # only the recorded steps count
            for i in range(warmup, warmup + steps):
                train(i)
            if mode == "crash" and rank == 2:
                dist.barrier()  # the others have committed: this rank joins an existing store
            if mode == "crash" and rank == 1:
                raise ValueError("rank 1 fails inside the window")
            xpuprof.step(warmup + steps)  # the end of the last recorded step
    except ValueError as e:
        fact["raised"] = str(e)
    if mode == "crash" and rank != 2:
        dist.barrier()
    with open(work + ".json", "w") as f:
        json.dump(fact, f)
    dist.destroy_process_group()
    """
)


def run_job(
    tmp: Path, world: int, mode: str, out: str = "job.store"
) -> tuple[Path, list[dict], list[int]]:
    """Start ``world`` ranks as torchrun would and wait for them; the store, each rank's own
    record (None for a rank that died) and their exit codes. ``out``: the store's name in
    ``tmp`` (``rank{rank}.store``: one store per rank, test_merge_stores.py)."""
    script = tmp / "worker.py"
    script.write_text(WORKER)
    store = tmp / out
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = []
    for r in range(world):
        renv = {**env, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1"}  # fmt: skip
        cmd = [sys.executable, str(script), str(tmp / "init"), str(tmp / out.format(rank=r)),
               str(tmp / f"w{r}"), mode, str(WARMUP), str(STEPS)]  # fmt: skip
        with open(tmp / f"w{r}.err", "w") as err:  # a file: a full pipe would stall a rank
            procs.append(subprocess.Popen(cmd, env=renv, stderr=err))
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=120))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    errs = [(tmp / f"w{r}.err").read_text()[-2000:] for r in range(world)]
    facts = []
    for r in range(world):
        f = tmp / f"w{r}.json"
        facts.append(json.loads(f.read_text()) if f.exists() else None)
    # crash: rank 1 raises inside its window (and carries on), rank 2 is killed in its commit
    assert codes == ([0] * world if mode == "normal" else [0, 0, 3]), errs
    return store, facts, codes


def raw_ops(tmp: Path, rank: int) -> Counter:
    """Names of the ``cpu_op`` events in the Kineto JSON torch's profiler wrote for a rank (in
    its own ``rankR`` folder of the ``workdir`` given)."""
    names: Counter = Counter()
    work = tmp / f"w{rank}" / f"rank{rank}"
    files = sorted((work / "torch").glob("*.json"))
    assert files, f"no Kineto trace in {work}"
    for f in files:
        for e in json.loads(f.read_text())["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "cpu_op":
                names[e["name"]] += 1
    return names


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    store, facts, _ = run_job(tmp, 2, "normal")
    trace = Trace(store)
    yield tmp, store, facts, trace
    trace.close()


def test_one_part_per_rank_with_its_place_in_the_job(job) -> None:
    _, store, facts, trace = job
    assert st.verify(store, deep=True) == []
    sources = {s["rank"]: s for s in trace.sources}
    assert sorted(sources) == [0, 1]
    jobs = set()
    for fact in facts:
        s = sources[fact["rank"]]
        assert s["part"] == fact["rank"]
        d = s["meta"]["xpuprof_capture"]["distributed"]
        assert d["rank"] == fact["rank"] and d["world_size"] == fact["world_size"] == 2
        assert d["backend"] == fact["backend"] == "gloo"
        assert d["host"] == s["host"] == fact["host"]
        assert d["local_rank"] == fact["rank"] and d["local_world_size"] == 2
        assert s["meta"]["xpuprof_capture"]["pid"] == fact["pid"]
        # the groups the rank is in (what torch lists): the default one, and rank 0 also the
        # worker's new_group(ranks=[0])
        info = s["meta"]["distributedInfo"]
        groups = sorted(tuple(g["ranks"]) for g in info["pg_config"])
        assert groups == ([(0,), (0, 1)] if fact["rank"] == 0 else [(0, 1)])
        assert info["pg_count"] == d["pg_count"] and info["backend"] == "gloo"
        jobs.add(d["job"])
    assert len(jobs) == 1 and None not in jobs  # both ranks know they are of one job
    assert trace.job() == {"world_size": 2, "ranks": [0, 1], "missing": []}


def test_steps_per_rank_are_the_steps_run(job) -> None:
    _, _, facts, trace = job
    ev = trace.events
    for fact in facts:
        steps = ev[(ev["rank"] == fact["rank"]) & (ev["level"] == "step")]
        assert fact["steps"] == STEPS
        assert len(steps) == STEPS
        assert sorted(steps["step"].astype(int)) == list(range(WARMUP, WARMUP + STEPS))


def test_each_ranks_ops_are_its_own_kineto_trace(job) -> None:
    tmp, _, facts, trace = job
    ev = trace.events
    for fact in facts:
        r = fact["rank"]
        ops = ev[(ev["rank"] == r) & (ev["level"] == "op")]
        assert Counter(ops["name"].astype(str)) == raw_ops(tmp, r)
        # each rank's gradient all-reduces, as many as its loop called (4 parameters x 3)
        assert fact["all_reduce"] == 4 * STEPS
        assert (ops["name"] == "c10d::allreduce_").sum() == fact["all_reduce"]
        gloo = ev[(ev["rank"] == r) & (ev["name"] == "gloo:all_reduce")]
        assert len(gloo) == fact["all_reduce"]


def test_a_rank_of_another_job_is_refused(job, plain_process) -> None:
    monkeypatch = plain_process
    tmp, store, _, trace = job
    before = (store / st.MANIFEST).read_bytes()
    # a later launch (no torch.distributed in this process: the launcher's variables say who
    # it is): rank 1 again, then a new rank 2 of a bigger job; neither may join
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "a-later-job")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(XpuprofError, match="another job with the same rank .*this process is "
                       "rank 1 of world size 2, job torchelastic:a-later-job"):  # fmt: skip
        with xpuprof.profile(store, level="step", telemetry=False):
            pass
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(XpuprofError, match="another job .*rank 2 of world size 3"):
        with xpuprof.profile(store, level="step", telemetry=False):
            pass
    # rank 0 of the job itself, arriving a second time (another capture window, same out)
    me = trace.sources[0]["meta"]["xpuprof_capture"]["distributed"]
    with pytest.raises(XpuprofError, match="rank 0 of this job is already in the store"):
        check_join(store, me)
    assert (store / st.MANIFEST).read_bytes() == before
    assert trace.ranks == [0, 1]


def test_a_single_process_store_is_not_joined(tmp_path, plain_process) -> None:
    monkeypatch = plain_process
    plain = tmp_path / "plain.store"
    with xpuprof.profile(plain, level="step", telemetry=False):
        xpuprof.step(0)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(XpuprofError, match="not a rank of a distributed capture"):
        with xpuprof.profile(plain, level="step", telemetry=False):
            pass


def test_a_failing_and_a_dying_rank_leave_the_store_whole(tmp_path) -> None:
    store, facts, _ = run_job(tmp_path, 3, "crash")
    assert facts[1]["raised"] == "rank 1 fails inside the window" and facts[2] is None
    assert st.verify(store, deep=True) == []
    with Trace(store) as trace:
        assert trace.ranks == [0, 1]
        assert trace.job() == {"world_size": 3, "ranks": [0, 1], "missing": [2]}
        cap = {s["rank"]: s["meta"]["xpuprof_capture"] for s in trace.sources}
        assert "ended_by" not in cap[0]
        assert cap[1]["ended_by"] == "ValueError: rank 1 fails inside the window"
        ev = trace.events
        for r in (0, 1):
            ops = ev[(ev["rank"] == r) & (ev["level"] == "op")]
            assert Counter(ops["name"].astype(str)) == raw_ops(tmp_path, r)
    # rank 2 died where intended: its files were in the store's folders, listed nowhere
    listed = {f for s in st.read_manifest(store)["sources"] for f in s["files"].values()}
    present = {f"events/{p.name}" for p in (store / "events").iterdir()}
    assert len(present - listed) == 1


def test_ranks_committing_at_once_lose_nothing(tmp_path, example_store) -> None:
    """Eight writers released together (threads: flock excludes separate opens of the lock
    file in one process as between processes): every part listed once, the store whole, each
    part the rows a plain import of the same trace gives."""
    import threading

    from xpuprof.formats.kineto import read_kineto
    from xpuprof.trace.rankparts import add_rank_part

    _, plain = example_store
    n = 8
    out = tmp_path / "many.store"
    go = threading.Barrier(n)
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        me = {"rank": r, "world_size": n, "job": "one-job", "host": "h"}
        raw = read_kineto(EXAMPLE)
        raw.top["xpuprof_capture"] = {"distributed": me}
        go.wait()
        try:
            add_rank_part(raw, out, me)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert st.verify(out, deep=True) == []
    m = st.read_manifest(out)
    assert [s["part"] for s in m["sources"]] == list(range(n))
    assert all(s["rows"] == plain.sources[0]["rows"] for s in m["sources"])
    assert m["rows"]["events"] == n * plain.sources[0]["rows"]["events"]
    # nothing left beside the store but the store (build folders gone, lock released)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.store"]


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, None),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "7"}, None),  # one task
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "7",
          "SLURM_STEP_ID": "0"}, (5, 8, 1, "Slurm", "slurm:7.0")),
        ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
          "OMPI_COMM_WORLD_LOCAL_RANK": "3", "PMIX_NAMESPACE": "ns1"},
         (3, 4, 3, "Open MPI", "pmix:ns1")),
        ({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "none",
          "MASTER_ADDR": "n0", "MASTER_PORT": "29500"},
         (2, 4, 0, "RANK/WORLD_SIZE", "rendezvous:n0:29500:4")),
        ({"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc", "SLURM_PROCID": "0",
          "SLURM_NTASKS": "2"}, (1, 2, None, "RANK/WORLD_SIZE", "torchelastic:abc:0")),
    ],
)  # fmt: skip
def test_the_launchers_variables_say_who_a_process_is(plain_process, env, want) -> None:
    from xpuprof.live import job

    for k, v in env.items():
        plain_process.setenv(k, v)
    me = job.detect()
    if want is None:
        assert me is None
        return
    got = (me["rank"], me["world_size"], me["local_rank"], me["rank_from"], me["job"])
    assert got == want


def test_the_ranks_all_reduces_are_matched_across_ranks(job) -> None:
    """Rank 0 lists two process groups (the default one and the worker's
    ``new_group(ranks=[0])``), rank 1 one, and the gloo spans name none: a group of one rank
    has no partner, so the default group is the only one their collectives can be matched in
    — each rank's k-th all-reduce pairs with the other's k-th, their starts the raw spans'."""
    from xpuprof.analysis.comm import collectives

    _, _, facts, trace = job
    sk = collectives(trace).tables["skew"].sort_values("seq")
    assert len(sk) == facts[0]["all_reduce"] == 12
    assert (sk["participants"] == 2).all() and (sk["process_group"] == "pg 0").all()
    ev = trace.events
    starts = {r: sorted(ev[(ev["rank"] == r) & (ev["name"] == "gloo:all_reduce")]["ts"])
              for r in (0, 1)}  # fmt: skip
    for row, a, b in zip(sk.itertuples(), starts[0], starts[1], strict=True):
        assert (row.first_start, row.last_start) == (min(a, b), max(a, b))
        assert row.skew_ns == abs(a - b)

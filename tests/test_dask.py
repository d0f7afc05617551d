"""Parallel import on a real Dask cluster reached by address, as `--scheduler ADDRESS` does for a
user's own cluster: the result must equal the in-process import, row for row."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import EXAMPLE, cli

import xpuprof
from xpuprof.trace.store import verify


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    """Four per-rank files made from the shipped real trace (rank written into each)."""
    doc = json.loads(gzip.decompress(EXAMPLE.read_bytes()))
    d = tmp_path_factory.mktemp("ranks")
    for r in range(4):
        doc["distributedInfo"] = {"rank": r, "world_size": 4}
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    return d


def test_import_through_a_scheduler_address_equals_in_process(ranks, tmp_path) -> None:
    from dask.distributed import LocalCluster

    local = xpuprof.import_traces([ranks], tmp_path / "local.store", workers=1)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        out = cli("import", ranks, "-o", tmp_path / "remote.store",
                  "--scheduler", cluster.scheduler_address, "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["workers"] == 2
    assert doc["rows"] == local.rows
    assert sorted(s["rank"] for s in doc["sources"]) == [0, 1, 2, 3]
    q = "select rank, level, count(*) as n, sum(dur) as d from events group by all order by all"
    with xpuprof.load(tmp_path / "local.store") as a, xpuprof.load(tmp_path / "remote.store") as b:
        assert a.sql(q).equals(b.sql(q))
    # the workers' files are complete and listed; no lock or build folder stays behind
    assert verify(tmp_path / "remote.store") == [] and verify(tmp_path / "local.store") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.store", "remote.store"]


def _nap(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds


def _feed(n: int, small: bool) -> tuple[list[str], list[list[bool]]]:
    """``n`` tasks of 0.2 s through ``ingest._fed`` on one worker thread: the keys in the
    order they ended, and for each submission whether each task sent before it was done."""
    from dask.distributed import Client, LocalCluster

    from xpuprof.trace.ingest import _fed

    jobs = [(Path(f"f{i}"), i) for i in range(n)]
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:  # fmt: skip
        sent: list = []
        seen_done: list[list[bool]] = []

        def submit(job):
            seen_done.append([f.done() for f in sent])
            fut = client.submit(_nap, 0.2, key=f"import-{job[1]}")
            sent.append(fut)
            return fut

        ended = [f.key for f in _fed(client, jobs, submit, [], False, lambda job: small)]
    return ended, seen_done


def test_files_are_fed_to_free_workers_only() -> None:
    """A file is submitted only when a worker thread is free for it: with one thread, the
    next task goes out only once the one before has ended (Dask's own queueing would have
    handed both to that worker at once when there are few files, leaving a worker that joins
    later with nothing); every task's answer comes back, each once."""
    ended, seen_done = _feed(3, small=False)
    assert sorted(ended) == ["import-0", "import-1", "import-2"]
    # each submission found every earlier task done: never two on the one thread
    assert seen_done == [[], [True], [True, True]]


def test_small_files_wait_on_a_busy_worker_one_at_a_time() -> None:
    """A small file (``ahead`` says yes) is sent while the one thread is still busy, so the
    worker goes on without a round trip through the client: never more than one waiting,
    and every task's answer comes back once."""
    ended, seen_done = _feed(4, small=True)
    assert sorted(ended) == [f"import-{i}" for i in range(4)]
    # the second went out with the first still running; later ones each as one ended
    assert seen_done == [[], [False], [True, False], [True, True, False]]


def _asks(client, expect: int) -> int:
    """Two files of 0.6 s fed to ``client``'s one worker thread by ``ingest._fed`` told to
    expect ``expect`` threads: how many times it asked the scheduler for the thread count."""
    from xpuprof.trace import ingest

    count = [0]

    class Counting:
        def nthreads(self):
            count[0] += 1
            return client.nthreads()

    sent: list = []

    def submit(job):
        assert all(f.done() for f in sent)  # one thread: one file at a time
        sent.append(client.submit(_nap, 0.6, key=f"import-{expect}-{job[1]}"))
        return sent[-1]

    jobs = [(Path(f"f{i}"), i) for i in range(2)]
    assert len(list(ingest._fed(Counting(), jobs, submit, [], False, expect=expect))) == 2
    return count[0]


def test_the_scheduler_is_asked_often_while_workers_are_still_joining() -> None:
    """While fewer threads have joined than the cluster will have (a forked worker is up a
    second into an import), the feeder asks the scheduler every ``_ASK_SOON`` seconds, so the
    new worker gets a file at once; once all are there, rarely. One worker thread, two files
    of 0.6 s: expecting two threads it asks about 12 times per file (at least 5 asserted),
    expecting one about once (at most 3), and both runs feed the files one at a time."""
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster, Client(cluster) as client:  # fmt: skip
        growing, full = _asks(client, 2), _asks(client, 1)
    assert growing >= 5 and full <= 3, (growing, full)


def test_local_cluster_runs_no_profiler_and_slower_monitors() -> None:
    """The import's own cluster (a worker in this process, one forked, the scheduler) runs
    no sampling profiler (it feeds only a dashboard this cluster does not have) and wakes
    its monitors less often than Dask's defaults, which are set for long-lived clusters."""
    import dask
    from dask.distributed import Client
    from dask.utils import parse_timedelta

    from xpuprof.trace.ingest import _local_cluster

    def default_ms(key: str) -> float:
        return 1000 * parse_timedelta(dask.config.get(key))

    with _local_cluster([], 2) as cluster, Client(cluster.scheduler_address) as client:
        client.wait_for_workers(2, timeout=60)
        running = client.run(
            lambda dask_worker: {
                k: pc.callback_time for k, pc in dask_worker.periodic_callbacks.items()
            }
        )
        scheduler = client.run_on_scheduler(
            lambda dask_scheduler: {
                k: pc.callback_time for k, pc in dask_scheduler.periodic_callbacks.items()
            }
        )
    assert len(running) == 2
    for callbacks in running.values():
        assert "heartbeat" in callbacks  # what a worker does run is listed here
        assert "profile" not in callbacks and "profile-cycle" not in callbacks
        assert callbacks["tick"] > default_ms("distributed.admin.tick.interval")
        assert callbacks["memory_monitor"] > default_ms(
            "distributed.worker.memory.monitor-interval"
        )
    assert scheduler["tick"] > default_ms("distributed.admin.tick.interval")


def test_a_reader_registered_here_reaches_the_workers(ranks, tmp_path) -> None:
    """A reader added with ``formats.register`` in the importing process is known to Dask
    workers that never saw the call (separate processes of a cluster reached by address):
    it travels with each task. The files, named for that reader alone, import as Kineto does
    them in one process."""
    import shutil

    from dask.distributed import LocalCluster

    from xpuprof.formats import Reader, register, unregister
    from xpuprof.formats.kineto import READER as KINETO

    src = tmp_path / "mine"
    src.mkdir()
    for r in range(2):
        shutil.copy(ranks / f"rank{r}.json", src / f"rank{r}.mine")
    mine = Reader(
        name="mine",
        description="Kineto JSON under another name",
        suffixes=(".mine",),
        read=KINETO.read,
        sniff=lambda path: False,
        category_levels=dict(KINETO.category_levels),
        device_categories=KINETO.device_categories,
    )
    register(mine)
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cl:
            report = xpuprof.import_traces([src], tmp_path / "mine.store",
                                           scheduler=cl.scheduler_address)  # fmt: skip
    finally:
        unregister("mine")
    assert report.workers == 2
    assert sorted(s["format"] for s in report.sources) == ["mine", "mine"]
    local = xpuprof.import_traces(
        [ranks / "rank0.json", ranks / "rank1.json"], tmp_path / "kineto.store", workers=1
    )
    assert report.rows == local.rows
    q = "select rank, level, count(*) as n, sum(dur) as d from events group by all order by all"
    with xpuprof.load(tmp_path / "mine.store") as a, xpuprof.load(tmp_path / "kineto.store") as b:
        assert a.sql(q).equals(b.sql(q))


def test_small_files_are_batched_but_the_last_ones_go_alone() -> None:
    """``ingest._batched``: runs of small files up to ``BATCH_MAX_BYTES`` share a task, a file
    larger than that goes alone, the last ``BATCH_TAIL`` files per worker each alone (so the
    workers end together); every file once, in the order given (biggest first)."""
    from xpuprof.trace import ingest

    mb = 1 << 20
    cap, tail = ingest.BATCH_MAX_BYTES, ingest.BATCH_TAIL
    sizes = {0: cap + 1, 1: cap // 2, 2: cap // 2, 3: cap // 2, **{k: mb for k in range(4, 40)}}
    jobs = [(Path(f"f{k}"), k) for k in sizes]
    out = ingest._batched(jobs, sizes, workers=2)
    assert [job for task in out for job in task] == jobs
    assert out[0] == (jobs[0],)  # larger than a batch: alone
    assert out[1] == (jobs[1], jobs[2])  # two halves fill a batch; the third starts the next
    assert all(sum(sizes[p] for _, p in task) <= cap for task in out[1:])
    assert all(len(task) == 1 for task in out[-2 * tail :])
    assert len(out) < len(jobs) - 20  # the 1 MB files did share tasks
    # fewer files than the tail: every file alone
    assert ingest._batched(jobs[:5], sizes, workers=2) == [(j,) for j in jobs[:5]]


def test_batched_import_equals_the_in_process_one(ranks, tmp_path, monkeypatch) -> None:
    """Six small rank files on a 2-worker cluster with one file per worker kept for the end:
    the first four go in batches (counted in the task), and the store equals the in-process
    import's, row for row, every rank once."""
    from dask.distributed import LocalCluster

    from xpuprof.trace import ingest

    src = tmp_path / "six"
    src.mkdir()
    doc = json.loads((ranks / "rank0.json").read_text())
    for r in range(6):
        doc["distributedInfo"] = {"rank": r, "world_size": 6}
        (src / f"rank{r}.json").write_text(json.dumps(doc))
    log = tmp_path / "batches.txt"  # the task is serialised even for a worker in-process
    real = ingest.import_files

    def counting(batch, *args, **kwargs):
        with open(log, "a") as f:
            f.write(f"{len(batch)}\n")
        return real(batch, *args, **kwargs)

    monkeypatch.setattr(ingest, "import_files", counting)
    monkeypatch.setattr(ingest, "BATCH_TAIL", 1)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cl:  # fmt: skip
        report = xpuprof.import_traces([src], tmp_path / "dask.store",
                                       scheduler=cl.scheduler_address)  # fmt: skip
    batches = [int(n) for n in log.read_text().split()]
    assert sum(batches) == 4 and all(n > 1 for n in batches), batches
    local = xpuprof.import_traces([src], tmp_path / "local.store", workers=1)
    assert report.rows == local.rows
    assert sorted(s["rank"] for s in report.sources) == list(range(6))
    assert sorted(s["part"] for s in report.sources) == list(range(6))
    q = "select rank, level, count(*) as n, sum(dur) as d from events group by all order by all"
    with xpuprof.load(tmp_path / "dask.store") as a, xpuprof.load(tmp_path / "local.store") as b:
        assert a.sql(q).equals(b.sql(q))
    assert verify(tmp_path / "dask.store") == []

"""Stores that two writers cannot corrupt, and that a corrupted store cannot turn into a
traceback (issue 8: items 7, 8, 11, 12 and 13).

Concurrency is tested with real processes (``multiprocessing``, spawn): a writer is stopped
at a known point (just before its manifest commit) by an event, never by a sleep that races.
Every expected number (rows per source) is counted from the JSON the test wrote.
"""

from __future__ import annotations

import builtins
import errno
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from builders import TraceBuilder

import xpuprof
from xpuprof.core.errors import StoreError, XpuprofError
from xpuprof.trace import lock
from xpuprof.trace import store as st
from xpuprof.trace.trace import Trace

TABLES = ("events", "flows", "links", "counters", "metadata")
SPAWN = mp.get_context("spawn")
#: Upper bound for any wait on another process in this file (never reached when all is well).
BOUND_S = 60


def write_trace(path: Path, rank: int, n: int) -> Path:
    """A step with ``n`` kernel launches, a counter and a thread name: 1 + 2n events (the
    step, n runtime calls, n kernels), 2n flow entries, 1 counter sample, 1 metadata entry."""
    tb = TraceBuilder(rank=rank, world_size=8)
    tb.add({"ph": "M", "name": "thread_name", "pid": 100, "tid": 1, "args": {"name": "main"}})
    tb.step(1, ts=0, dur=100 * n + 50)
    for i in range(n):
        tb.launch("gemm", ts=100 * i + 20, dur=30, launch_ts=100 * i + 5)
    tb.counter("queue", ts=5, depth=1)
    return tb.write(path)


def json_counts(path: Path) -> dict[str, int]:
    """Rows of events / flows / metadata a source must give, counted from its JSON."""
    evs = json.loads(path.read_text())["traceEvents"]
    ph = [e["ph"] for e in evs]
    return {
        "events": sum(p == "X" for p in ph),
        "flows": sum(p in ("s", "f") for p in ph),
        "metadata": ph.count("M"),
    }


def assert_consistent(store: Path, sources: list[Path]) -> None:
    """The store holds exactly ``sources``, and each listed file holds that source's data."""
    m = json.loads((store / "manifest.json").read_text())
    assert sorted(s["path"] for s in m["sources"]) == sorted(str(p.resolve()) for p in sources)
    listed = set()
    for s in m["sources"]:
        want = json_counts(Path(s["path"]))
        rank = json.loads(Path(s["path"]).read_text())["distributedInfo"]["rank"]
        for table in ("events", "flows", "metadata"):
            t = pq.read_table(store / s["files"][table], columns=["rank", "part"])
            assert t.num_rows == want[table] == s["rows"][table], (s["path"], table)
            assert set(t["rank"].to_pylist()) == {rank}, (s["path"], table)
            assert set(t["part"].to_pylist()) == {s["part"]}, (s["path"], table)
        listed |= set(s["files"].values())
    on_disk = {p.relative_to(store).as_posix() for p in store.rglob("*") if p.is_file()}
    assert on_disk == listed | {"manifest.json"}
    assert st.verify(store) == []


@pytest.fixture
def runs(tmp_path) -> dict[str, list[Path]]:
    """Two sets of sources for two writers: ranks 1-2 (A) and ranks 3-4 (B), sizes differing."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    return {
        "A": [write_trace(a / "rank1.json", 1, 5), write_trace(a / "rank2.json", 2, 7)],
        "B": [write_trace(b / "rank3.json", 3, 11), write_trace(b / "rank4.json", 4, 13)],
    }


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------- writers in other processes


def _writer(sources, store, kwargs, paused, go, waiting, out) -> None:
    """Import ``sources`` into ``store`` in this process. With ``paused``, stop just before the
    manifest commit (after every Parquet file is written) until ``go`` is set; with
    ``waiting``, set it the first time the import sleeps (it is waiting for the lock)."""
    from xpuprof.trace import store as st

    if paused is not None:
        real = st.write_manifest

        def slow(root, manifest):
            paused.set()
            go.wait(BOUND_S)
            real(root, manifest)

        st.write_manifest = slow
    if waiting is not None:
        real_sleep = time.sleep

        def sleep(s):
            waiting.set()
            real_sleep(s)

        time.sleep = sleep
    try:
        xpuprof.import_traces(sources, store, **kwargs)
        out.put(("ok", ""))
    except XpuprofError as e:
        out.put(("XpuprofError", str(e)))
    except BaseException as e:  # noqa: BLE001 - the test reports what escaped
        out.put((type(e).__name__, repr(e)))


class Writer:
    """One ``_writer`` process and its events."""

    def __init__(self, sources, store, *, pause=False, watch_wait=False, **kwargs) -> None:
        self.paused = SPAWN.Event() if pause else None
        self.go = SPAWN.Event()
        self.waiting = SPAWN.Event() if watch_wait else None
        self.out = SPAWN.Queue()
        self.proc = SPAWN.Process(
            target=_writer,
            args=(sources, store, kwargs, self.paused, self.go, self.waiting, self.out),
        )
        self.proc.start()

    def result(self) -> tuple[str, str]:
        got = self.out.get(timeout=BOUND_S)
        self.proc.join(BOUND_S)
        return got

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(BOUND_S)


def test_two_writers_of_one_store_never_mix(runs, tmp_path) -> None:
    """Item 8: B imports while A is between writing its Parquet and committing its manifest.
    B must wait for A (not interleave with it), then replace A's sources by its own."""
    store = tmp_path / "x.store"
    xpuprof.import_traces(runs["A"][:1], store)  # an existing store, part 0
    a = Writer(runs["A"], store, pause=True)
    try:
        assert a.paused.wait(BOUND_S)
        b = Writer(runs["B"], store, watch_wait=True, lock_wait=BOUND_S)
        try:
            assert b.waiting.wait(BOUND_S), "B did not wait for A's lock"
            assert b.out.empty()  # B has not finished while A holds the lock
            a.go.set()
            assert a.result() == ("ok", "")
            assert b.result() == ("ok", "")
        finally:
            b.kill()
    finally:
        a.go.set()
        a.kill()
    assert_consistent(store, runs["B"])
    assert hidden(tmp_path) == []


def test_a_writer_that_cannot_wait_fails_clearly_and_the_store_stays_whole(runs, tmp_path):
    store = tmp_path / "x.store"
    xpuprof.import_traces(runs["A"][:1], store)
    a = Writer(runs["A"], store, pause=True)
    try:
        assert a.paused.wait(BOUND_S)
        b = Writer(runs["B"], store, lock_wait=0)
        kind, msg = b.result()
        assert kind == "XpuprofError", msg
        assert str(store.resolve()) in msg and f"pid {a.proc.pid}" in msg
        assert socket.gethostname() in msg
        a.go.set()
        assert a.result() == ("ok", "")
    finally:
        a.go.set()
        a.kill()
    assert_consistent(store, runs["A"])


@pytest.mark.parametrize("b_waits", [False, True])
def test_two_imports_creating_the_same_new_store(runs, tmp_path, b_waits) -> None:
    """Item 7/8: the losing side of two simultaneous new imports gets one clear line (or, when
    it may wait, imports after the winner); the store is never a mix."""
    store = tmp_path / "new.store"
    a = Writer(runs["A"], store, pause=True)
    try:
        assert a.paused.wait(BOUND_S)
        assert not store.exists()
        if b_waits:
            b = Writer(runs["B"], store, watch_wait=True, lock_wait=BOUND_S)
            assert b.waiting.wait(BOUND_S), "B did not wait for A's lock"
            a.go.set()
            assert a.result() == ("ok", "")
            assert b.result() == ("ok", "")
            winner = runs["B"]
        else:
            b = Writer(runs["B"], store, lock_wait=0)
            kind, msg = b.result()
            assert kind == "XpuprofError" and f"pid {a.proc.pid}" in msg, msg
            a.go.set()
            assert a.result() == ("ok", "")
            winner = runs["A"]
        b.kill()
    finally:
        a.go.set()
        a.kill()
    assert_consistent(store, winner)
    assert hidden(tmp_path) == []


def _hold_lock(store, ready, fork_child, child_pid) -> None:
    """Take the store's lock and keep it (until killed); with ``fork_child``, fork a process
    that outlives this one first (as a Dask worker forked during an import would)."""
    from xpuprof.trace import store as st

    held = st.StoreLock(store, wait=0)
    held.acquire()
    if fork_child:
        done = mp.get_context("fork").Event()
        child = mp.get_context("fork").Process(target=done.wait, args=(BOUND_S,))
        child.start()
        child_pid.put(child.pid)
    ready.set()
    time.sleep(BOUND_S)


@pytest.mark.parametrize("fork_child", [False, True])
def test_the_lock_of_a_killed_writer_is_taken_over(runs, tmp_path, fork_child) -> None:
    store = tmp_path / "x.store"
    xpuprof.import_traces(runs["A"], store)
    ready, child_pid = SPAWN.Event(), SPAWN.Queue()
    holder = SPAWN.Process(target=_hold_lock, args=(store, ready, fork_child, child_pid))
    holder.start()
    grandchild = None
    try:
        assert ready.wait(BOUND_S)
        if fork_child:
            grandchild = child_pid.get(timeout=BOUND_S)
        lock_file = st.lock_path(store)
        owner = json.loads(lock_file.read_text())
        assert owner["pid"] == holder.pid and owner["host"] == socket.gethostname()
        with pytest.raises(StoreError, match=f"pid {holder.pid}"):
            xpuprof.import_traces(runs["B"], store, lock_wait=0)
        os.kill(holder.pid, signal.SIGKILL)
        deadline = time.monotonic() + BOUND_S  # join() would wait for the grandchild too
        while holder.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not holder.is_alive()
        assert lock_file.exists()  # a killed process removes nothing: the lock file stays
        report = xpuprof.import_traces(runs["B"], store, lock_wait=0)
        assert report.noop is False
    finally:
        if holder.is_alive():
            holder.kill()
        if grandchild is not None:
            os.kill(grandchild, signal.SIGKILL)
    assert_consistent(store, runs["B"])
    assert hidden(tmp_path) == []


def test_a_lock_file_naming_a_dead_process_is_taken_over(runs, tmp_path) -> None:
    store = tmp_path / "x.store"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    st.lock_path(store).write_text(
        json.dumps({"pid": dead.pid, "host": socket.gethostname(), "since": "earlier"})
    )
    xpuprof.import_traces(runs["A"], store, lock_wait=0)
    assert_consistent(store, runs["A"])
    assert hidden(tmp_path) == []


def test_lock_without_fcntl_takes_over_only_dead_owners(runs, tmp_path, monkeypatch) -> None:
    """Where ``fcntl`` is missing, the lock is an exclusively created file: a live owner
    (this process) blocks, a dead one is taken over."""
    monkeypatch.setattr(lock, "fcntl", None)
    store = tmp_path / "x.store"
    with st.StoreLock(store, wait=0):
        with pytest.raises(StoreError, match=f"pid {os.getpid()}"):
            xpuprof.import_traces(runs["A"], store, lock_wait=0)
    assert not st.lock_path(store).exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    st.lock_path(store).write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    xpuprof.import_traces(runs["A"], store, lock_wait=0)
    assert_consistent(store, runs["A"])
    assert hidden(tmp_path) == []


def test_part_files_of_two_writers_never_share_a_name(runs, tmp_path) -> None:
    """Item 8: the same part number written twice (two stores built from the same state)
    still gives different file names."""
    one, two = tmp_path / "one", tmp_path / "two"
    xpuprof.import_traces(runs["A"], one)
    xpuprof.import_traces(runs["A"], two, force=True)
    m1 = json.loads((one / "manifest.json").read_text())
    m2 = json.loads((two / "manifest.json").read_text())
    assert [s["part"] for s in m1["sources"]] == [s["part"] for s in m2["sources"]] == [0, 1]
    names1 = {f for s in m1["sources"] for f in s["files"].values()}
    names2 = {f for s in m2["sources"] for f in s["files"].values()}
    assert names1.isdisjoint(names2)


# ------------------------------------------------------------------------------ leftovers


def test_stale_temporaries_of_dead_processes_are_cleaned(runs, tmp_path) -> None:
    """Item 12: a build folder and temporary files left by killed imports disappear on the next
    import into the same parent; those of a live process stay."""
    store = tmp_path / "x.store"
    xpuprof.import_traces(runs["A"], store)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale_dir = tmp_path / f".x.store.tmp-{dead.pid}-0123abcd"
    (stale_dir / "events").mkdir(parents=True)
    (stale_dir / "events" / "part-00000.parquet").write_bytes(b"half")
    other = tmp_path / f".other.store.tmp-{dead.pid}-89abcdef"
    other.mkdir()
    live = tmp_path / f".x.store.tmp-{os.getpid()}-fedcba98"
    live.mkdir()
    stale_manifest = store / f".manifest.json.tmp-{dead.pid}"
    stale_manifest.write_text("{")
    stale_part = store / "events" / f".part-00009.parquet.tmp-{dead.pid}"
    stale_part.write_bytes(b"x")
    report = xpuprof.import_traces(runs["A"], store)
    assert report.noop is True
    assert not stale_dir.exists() and not other.exists()
    assert not stale_manifest.exists() and not stale_part.exists()
    assert live.is_dir()  # a live process's build folder is its own business
    live.rmdir()
    assert hidden(tmp_path) == []
    assert_consistent(store, runs["A"])


def test_orphaned_parquet_is_removed_even_by_a_noop_reimport(runs, tmp_path) -> None:
    store = tmp_path / "x.store"
    xpuprof.import_traces(runs["A"], store)
    orphan = store / "events" / "part-00042.parquet"
    shutil.copyfile(next((store / "events").iterdir()), orphan)
    assert xpuprof.import_traces(runs["A"], store).noop is True
    assert not orphan.exists()
    assert_consistent(store, runs["A"])


def _fsync_recorder(monkeypatch) -> list[tuple[str, str]]:
    """Record, in order, every fsync (with the path of its fd) and every os.replace."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(a, b, **kw):
        calls.append(("replace", str(b)))
        return real_replace(a, b, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return calls


@pytest.mark.parametrize("existing", [False, True])
def test_data_files_and_folders_are_fsynced_before_the_commit(runs, tmp_path, monkeypatch,
                                                             existing) -> None:  # fmt: skip
    """Item 12: every Parquet file, its folder and the store's folder reach the disk before
    the manifest that lists them (else a power cut can leave a manifest naming lost files)."""
    store = (tmp_path / "x.store").resolve()
    if existing:
        xpuprof.import_traces(runs["A"][:1], store)
    calls = _fsync_recorder(monkeypatch)
    xpuprof.import_traces(runs["A"], store)
    m = json.loads((store / "manifest.json").read_text())
    new = [s for s in m["sources"] if not existing or s["part"] != 0]
    commit = next(
        i for i, (k, p) in enumerate(calls)
        if k == "replace" and p == str(store / "manifest.json" if existing else store)
    )  # fmt: skip
    before = {Path(p).name for k, p in calls[:commit] if k == "fsync"}
    for s in new:
        for rel in s["files"].values():
            assert Path(rel).name in before, rel
    for t in TABLES:
        assert t in before, t  # each table's folder
    synced = [Path(p) for k, p in calls if k == "fsync"]
    assert store in synced or (not existing and store.parent in synced)
    if not existing:
        assert store.parent in [Path(p) for k, p in calls[commit:] if k == "fsync"]


def _enospc_on(monkeypatch, fragment: str) -> None:
    """Make fsync of any file whose path contains ``fragment`` fail as a full disk does."""
    real = os.fsync

    def fsync(fd):
        if fragment in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_disk_full_at_the_manifest_leaves_the_store_as_it_was(runs, tmp_path, monkeypatch):
    """Item 7/12: ENOSPC while writing the manifest: one clear error naming the store, no
    temporary manifest left, the previous store intact."""
    store = tmp_path / "x.store"
    xpuprof.import_traces(runs["A"][:1], store)
    before = (store / "manifest.json").read_bytes()
    _enospc_on(monkeypatch, ".manifest.json.tmp")
    with pytest.raises(XpuprofError, match="No space left on device") as e:
        xpuprof.import_traces(runs["A"], store)
    assert str(store.resolve()) in str(e.value)
    monkeypatch.undo()
    assert (store / "manifest.json").read_bytes() == before
    assert hidden(store) == [] and hidden(tmp_path) == []
    assert_consistent(store, runs["A"][:1])


def test_disk_full_writing_parquet_leaves_nothing(runs, tmp_path, monkeypatch) -> None:
    import pyarrow.parquet as pqm

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pqm, "write_table", full)
    store = tmp_path / "x.store"
    with pytest.raises(XpuprofError, match="No space left on device") as e:
        xpuprof.import_traces(runs["A"], store)
    assert "x.store" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_an_unreadable_file_in_an_input_folder_is_one_clear_error(runs, tmp_path, monkeypatch):
    """Item 7 (a file the user may not read; we run as root here, so open() is made to refuse
    it as the kernel would)."""
    bad = runs["A"][1].resolve()
    real_open = builtins.open

    def deny(file, *a, **k):
        if isinstance(file, (str, Path)) and Path(file).resolve() == bad:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", deny)
    store = tmp_path / "x.store"
    with pytest.raises(XpuprofError, match="Permission denied") as e:
        xpuprof.import_traces([tmp_path / "a"], store)
    assert str(bad) in str(e.value)
    assert not store.exists() and hidden(tmp_path) == []


def test_an_output_that_cannot_be_written_is_one_clear_error(runs, tmp_path) -> None:
    blocker = tmp_path / "file.txt"
    blocker.write_text("a file, not a folder")
    with pytest.raises(XpuprofError) as e:
        xpuprof.import_traces(runs["A"], blocker / "x.store")
    assert str(blocker) in str(e.value)
    assert blocker.read_text() == "a file, not a folder"


# ------------------------------------------------------------------------ corrupted stores


@pytest.fixture
def store(runs, tmp_path) -> Path:
    s = tmp_path / "x.store"
    xpuprof.import_traces(runs["A"], s)
    return s.resolve()


def edit_manifest(store: Path, change) -> None:
    """Apply ``change`` to the manifest in place (a list it returns replaces the manifest)."""
    m = json.loads((store / "manifest.json").read_text())
    out = change(m)
    m = out if isinstance(out, list) else m
    (store / "manifest.json").write_text(json.dumps(m))


def first_file(store: Path, table: str) -> Path:
    m = json.loads((store / "manifest.json").read_text())
    return store / m["sources"][0]["files"][table]


@pytest.mark.parametrize(
    "change, where",
    [
        (lambda m: [], "manifest.json"),
        (lambda m: m["sources"][0].pop("rows"), "rows"),
        (lambda m: m["sources"][0].update(part="0"), "part"),
        (lambda m: m["sources"][1].update(part=0), "part 0"),
        (lambda m: m["sources"][0]["files"].update(events=5), "files.events"),
        (lambda m: m["sources"][0].update(read={}), "total"),
        (lambda m: m.update(sources={}), "sources"),
        (lambda m: m["sources"][0]["files"].update(bogus="x.parquet"), "bogus"),
    ],
)
def test_a_malformed_manifest_is_a_store_error(store, change, where) -> None:
    """Item 11: a manifest of ``[]``, a source without ``rows``, wrong types: StoreError naming
    the manifest and the field, on open (never AttributeError or KeyError later)."""
    edit_manifest(store, change)
    with pytest.raises(StoreError) as e:
        Trace(store)
    assert str(store / "manifest.json") in str(e.value) and where in str(e.value)
    assert st.verify(store) == [str(e.value)]


def test_the_manifest_is_read_whatever_json_it_holds(store) -> None:
    """The manifest is decoded by msgspec, or by the standard decoder for what only that one
    reads (a ``NaN`` in a source's metadata, as ``json.dumps`` writes it); a manifest cut
    short is a StoreError naming it."""
    edit_manifest(store, lambda m: m["sources"][0]["meta"].update(odd=float("nan")))
    assert "NaN" in (store / "manifest.json").read_text()
    with Trace(store) as t:
        assert math.isnan(t.sources[0]["meta"]["odd"])
    text = (store / "manifest.json").read_text()
    (store / "manifest.json").write_text(text[: len(text) // 2])
    with pytest.raises(StoreError, match="unreadable manifest") as e:
        Trace(store)
    assert str(store / "manifest.json") in str(e.value)


@pytest.mark.parametrize(
    "rel", ["../../../../etc/passwd", "/etc/passwd", "events/../../outside.parquet", ""]
)
def test_manifest_paths_cannot_leave_the_store(store, rel) -> None:
    (store.parent / "outside.parquet").write_bytes(first_file(store, "events").read_bytes())
    edit_manifest(store, lambda m: m["sources"][0]["files"].update(events=rel))
    with pytest.raises(StoreError, match="outside the store|not a path inside"):
        Trace(store)


def test_a_symlink_out_of_the_store_is_refused(store) -> None:
    f = first_file(store, "events")
    outside = store.parent / "outside.parquet"
    shutil.copyfile(f, outside)
    f.unlink()
    f.symlink_to(outside)
    with pytest.raises(StoreError, match="outside the store") as e:
        Trace(store)
    assert str(f) in str(e.value)


def test_a_missing_parquet_file_is_named_on_open(store) -> None:
    f = first_file(store, "flows")
    f.unlink()
    with pytest.raises(StoreError, match="missing") as e:
        Trace(store)
    assert str(f) in str(e.value)
    problems = st.verify(store)
    assert len(problems) == 1 and str(f) in problems[0]


def test_reimport_repairs_a_store_with_a_missing_file(store, runs) -> None:
    """The repair for a deleted part: import the same sources again; only the damaged source is
    read again (the other keeps its files)."""
    m = json.loads((store / "manifest.json").read_text())
    kept = m["sources"][1]["files"]
    before = {rel: (store / rel).stat().st_ino for rel in kept.values()}
    first_file(store, "flows").unlink()
    report = xpuprof.import_traces(runs["A"], store)
    assert report.noop is False and report.reused == [str(runs["A"][1].resolve())]
    assert {rel: (store / rel).stat().st_ino for rel in kept.values()} == before
    assert_consistent(store, runs["A"])


def test_a_truncated_parquet_file_is_a_store_error_naming_it(store) -> None:
    f = first_file(store, "events")
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with Trace(store) as t:  # opening reads only the manifest
        for read in (lambda: t.table("events"), lambda: t.events,
                     lambda: t.sql("select count(*) from events"), lambda: t.con):  # fmt: skip
            with pytest.raises(StoreError) as e:
                read()
            assert str(f) in str(e.value)
    problems = st.verify(store)
    assert len(problems) == 1 and str(f) in problems[0]


def test_the_events_file_replaced_by_the_flows_file_is_caught(store) -> None:
    """Item 11: was exit 0 with wrong entries (pyarrow fills the missing columns with nulls)."""
    ev, fl = first_file(store, "events"), first_file(store, "flows")
    shutil.copyfile(fl, ev)
    with Trace(store) as t:
        with pytest.raises(StoreError, match="flows") as e:
            t.table("events")
        assert str(ev) in str(e.value)
        with pytest.raises(StoreError, match="flows"):
            t.sql("select count(*) from events")
    problems = st.verify(store)
    assert len(problems) == 1 and str(ev) in problems[0] and "flows" in problems[0]


def test_a_file_of_another_part_is_caught(store) -> None:
    """Two sources' events files swapped: same table, so only the rows tell (their ``part``)."""
    m = json.loads((store / "manifest.json").read_text())
    one, two = (store / s["files"]["events"] for s in m["sources"])
    data = one.read_bytes()
    one.write_bytes(two.read_bytes())
    two.write_bytes(data)
    problems = st.verify(store)
    assert len(problems) == 2
    assert str(one) in problems[0] and "holds rows of part 1" in problems[0], problems
    assert str(two) in problems[1] and "holds rows of part 0" in problems[1], problems
    with Trace(store) as t, pytest.raises(StoreError, match="holds rows of part 1"):
        t.table("events")


def test_verify_compares_rows_with_the_parquet_footers(store, runs) -> None:
    assert st.verify(store) == []
    m = json.loads((store / "manifest.json").read_text())
    n = json_counts(runs["A"][1])["events"]
    assert m["sources"][1]["rows"]["events"] == n

    def more(m):  # a manifest consistent in itself, but not with the file
        m["sources"][1]["rows"]["events"] += 3
        m["rows"]["events"] += 3
        m["sources"][1]["levels"]["kernel"] += 3
        m["levels"]["kernel"] += 3

    edit_manifest(store, more)
    f = store / m["sources"][1]["files"]["events"]
    problems = st.verify(store)
    assert len(problems) == 1
    assert str(f) in problems[0] and f"{n} rows" in problems[0] and str(n + 3) in problems[0]
    with Trace(store) as t, pytest.raises(StoreError, match=str(f)):
        t.table("events")
    edit_manifest(store, lambda m: m["rows"].update(events=1))
    assert any("total" in p for p in st.verify(store))


# ----------------------------------------------------------------------- restricted SQL


@pytest.mark.parametrize(
    "query, why",
    [
        ("select * from read_csv('/etc/passwd')", "Permission"),
        ("select * from read_parquet('{outside}')", "Permission"),
        ("attach '{dir}/evil.db' as evil", "one SELECT"),
        ("install httpfs", "one SELECT"),
        ("load httpfs", "one SELECT"),
        ("copy events to '{dir}/out.csv'", "one SELECT"),
        ("select 1; select 2", "one statement"),
        ("create table t as select 1", "one SELECT"),
        ("set enable_external_access = true", "one SELECT"),
        ("select * from glob('/etc/*')", "Permission"),
    ],
)
def test_restricted_sql_refuses_files_and_writes(store, query, why) -> None:
    """Item 13: the store-reading API a server uses: DuckDB with file access limited to the
    store's own Parquet, its configuration locked, one read-only statement per query."""
    outside = store.parent / "outside.parquet"
    shutil.copyfile(first_file(store, "events"), outside)
    q = query.format(outside=outside, dir=store.parent)
    with Trace(store, restricted=True) as t:
        with pytest.raises(XpuprofError, match=why):
            t.sql(q)
        assert t.sql("select count(*) as n from events")["n"][0] > 0
    assert sorted(p.name for p in store.parent.iterdir()) == sorted(
        ["a", "b", "x.store", "outside.parquet"]
    )


def test_restricted_sql_answers_over_all_five_tables(store, runs) -> None:
    want = {t: 0 for t in ("events", "flows", "metadata")}
    for p in runs["A"]:
        for t, n in json_counts(p).items():
            want[t] += n
    with Trace(store, restricted=True) as t, Trace(store) as free:
        for table in TABLES:
            q = f"select count(*) as n from {table}"
            got = t.sql(q)["n"][0]
            assert got == free.sql(q)["n"][0]
            if table in want:
                assert got == want[table], table
        assert t.sql("with s as (select rank from events) select count(distinct rank) as n "
                     "from s")["n"][0] == 2  # fmt: skip
        assert t.sql("describe events")["column_name"].tolist()[:2] == ["id", "part"]
    with xpuprof.load(store, restricted=True) as t:
        with pytest.raises(XpuprofError):
            t.sql("select * from read_csv('/etc/passwd')")


def test_restricted_sql_keeps_the_servers_limits(store) -> None:
    with Trace(store, restricted=True, duckdb_config={"threads": 1}) as t:
        assert t.sql("select current_setting('threads') as n")["n"][0] == 1
        with pytest.raises(XpuprofError, match="one SELECT"):
            t.sql("set threads = 4")
        with pytest.raises(duckdb.Error, match="locked"):
            t.con.execute("set threads = 4")  # even on the connection itself
        assert t.sql("select current_setting('threads') as n")["n"][0] == 1


def test_no_progress_bar_on_stdout(store) -> None:
    """DuckDB draws a progress bar on stdout for any query over 2 s (seen inside ``xpuprof
    ranks --json`` at 512 ranks): every connection of a Trace, and the viewer's, has it off.
    Asked in a fresh interpreter, as the CLI runs (under pytest DuckDB starts with it off)."""
    import subprocess
    import sys

    code = (
        "import sys, duckdb\n"
        "from xpuprof.trace.trace import Trace\n"
        "from xpuprof.view.detail import connection\n"
        "q = \"select current_setting('enable_progress_bar')\"\n"
        "got = [duckdb.connect().execute(q).fetchall()[0][0]]\n"
        "for restricted in (False, True):\n"
        "    with Trace(sys.argv[1], restricted=restricted) as t:\n"
        "        got += [t.con.execute(q).fetchall()[0][0],\n"
        "                connection(t).execute(q).fetchall()[0][0]]\n"
        "print(got)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True,
                         text=True, timeout=120, check=True).stdout  # fmt: skip
    assert out.split() == ["[True,", "False,", "False,", "False,", "False]"]


def test_the_default_sql_stays_unrestricted(store, tmp_path) -> None:
    out = tmp_path / "copy.csv"
    with Trace(store) as t:
        t.sql(f"copy (select 1 as x) to '{out}'")
    assert out.read_text().split() == ["x", "1"]


def test_cli_commands_report_a_corrupt_store_in_one_line(store) -> None:
    """Item 11 end to end: a truncated events file → exit 2 and one line naming it."""
    from conftest import cli

    f = first_file(store, "events")
    f.write_bytes(f.read_bytes()[:100])
    out = cli("sql", store, "select count(*) from events")
    assert out.returncode == 2, out.stderr
    assert str(f) in out.stderr and "Traceback" not in out.stderr


def test_cli_import_waits_for_the_lock_only_as_long_as_asked(tmp_path) -> None:
    """``xpuprof import --wait 0`` while another process holds the store's lock: one line
    naming the holder, exit 2, and the store untouched."""
    import os

    from conftest import EXAMPLE, cli

    from xpuprof.trace.store import StoreLock

    store = tmp_path / "s.store"
    with StoreLock(store):
        proc = cli("import", EXAMPLE, "-o", store, "--wait", "0")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "another xpuprof process is writing" in lines[0], lines
    assert f"pid {os.getpid()}" in lines[0]
    assert not store.exists()

"""Import trace files into a store, one source file per task, in parallel on Dask.

Each file is read, normalized and written by one task, which returns only a small summary: the
tables never travel between processes, and the same code runs on a cluster of this machine or
on a user's cluster (``scheduler=ADDRESS``; the store path must then be visible to the
workers). Small inputs skip Dask entirely, since starting workers costs more than it saves
below a few tens of megabytes. On this machine one worker runs in this process, busy from the
start, while the others' processes come up (:func:`_local_cluster`).

A plain Kineto file of ``SPLIT_MIN_BYTES`` or more that would otherwise keep one worker busy
alone is decoded in byte ranges, one task each, and put together by one more task that
normalizes and writes it (``formats/kineto/split.py``: the result is the one-piece decode's,
or the file is decoded in one piece when a range cannot be used).

Length: every way a source reaches the store (in this process, as one Dask task, in pieces;
the cluster; the staging and commit around them) in one place, so that one reading shows
which tasks exist and what each one writes.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

from xpuprof.core import heap
from xpuprof.core.beside import beside
from xpuprof.core.errors import StoreError, TraceFormatError, XpuprofError
from xpuprof.trace import store as st
from xpuprof.trace.ranks import (  # noqa: F401 - rank_from_name: tests', scripts'
    RANK_FROM,
    RankHint,
    mixed_jobs,
    rank_from_name,
    rank_hints,
    source_rank,
)
from xpuprof.trace.sources import expand_sources
from xpuprof.trace.store import abandon_staging, begin_staging  # noqa: F401 - live.remote's

#: Below this much input, import in-process: a LocalCluster's start-up would cost more.
PARALLEL_MIN_BYTES = 48 << 20
#: A plain (not gzip) Kineto file this large is decoded in byte ranges on several workers
#: when it would otherwise keep one worker busy while the others have nothing left to do
#: (``formats/kineto/split.py``); below it, one piece is quicker (measured: RESULTS.md).
SPLIT_MIN_BYTES = 1 << 30
#: The staging folder's subfolder where pieces of a file cut in ranges wait to be combined.
_SPILL = ".pieces"
#: A file this small may be sent to a busy worker, to start the moment the one before ends
#: (a round trip through this process costs 5-15 ms a file; a file this size takes ~0.2 s,
#: the most a worker can be left idle by one sent to the wrong worker).
AHEAD_MAX_BYTES = 16 << 20
#: Small files go to a worker several at a time, one task for up to this many bytes: a task's
#: round trip through Dask costs ~10 ms of CPU across the processes (the client's, the
#: scheduler's and the workers' event loops), 5-8 % of a 9 MB rank file's import. The last
#: ``BATCH_TAIL`` files per worker go one by one, so that the workers still end together.
BATCH_MAX_BYTES = 32 << 20
BATCH_TAIL = 4
# how often to ask the scheduler how many threads there are (workers join as they start):
# often while fewer than expected have joined (a forked worker is up ~1 s into an import, and
# every tenth of a second it waits unseen is a tenth of a core lost), then rarely
_ASK_EVERY = 0.25
_ASK_SOON = 0.05
#: Dask settings for the clusters xpuprof starts on this machine (imports, per-rank analyses).
#: Dask's defaults suit a long-lived cluster with a dashboard: a statistical profiler samples
#: every thread's stack each 10 ms (4 % of a worker's CPU on an import of 64 files), and the
#: event loops' tick monitor, the memory monitors and the system monitor wake every
#: 20-500 ms. An idle 2-worker import cluster used 6.2 % of a core in this process and
#: 2.2 % in the forked worker with them, 1.4 % and 0.4 % with these (RESULTS.md).
LOCAL_CLUSTER_CONFIG: dict[str, Any] = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "200ms",
    "distributed.admin.system-monitor.interval": "2s",
    "distributed.worker.memory.monitor-interval": "500ms",
}

Progress = Callable[[int, int], None]


@dataclass
class ImportReport:
    """What an import did, for the CLI and for scripts (``--json``)."""

    store: str
    noop: bool
    sources: list[dict[str, Any]]
    rows: dict[str, int]
    levels: dict[str, int]
    events_read: int
    seconds: float
    workers: int
    reused: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, root: Path, manifest: dict[str, Any], t0: float, workers: int,
           reused: list[str] | None = None) -> ImportReport:  # fmt: skip
        """The report of a write that left ``manifest`` at ``root``, begun at ``t0``
        (``time.perf_counter()``)."""
        return cls(store=str(root), noop=False, sources=manifest["sources"],
                   rows=manifest["rows"], levels=manifest["levels"],
                   events_read=manifest["events_read"], seconds=time.perf_counter() - t0,
                   workers=workers, reused=reused or [])  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "noop": self.noop,
            "seconds": round(self.seconds, 3),
            "workers": self.workers,
            "events_read": self.events_read,
            "rows": self.rows,
            "levels": self.levels,
            "reused": self.reused,
            "sources": [
                {
                    "path": s["path"],
                    "part": s["part"],
                    "rank": s["rank"],
                    "rank_from": s.get("rank_from"),
                    "steps_from": s.get("steps_from"),
                    "events_read": s["read"]["total"],
                    "rows": s["rows"],
                    "dropped": s["read"]["dropped"],
                    "truncated": s["read"].get("truncated", False),
                    "notes": s["read"].get("notes", []),
                }
                for s in self.sources
            ],
        }


_Task = TypeVar("_Task", bound=Callable[..., Any])
_Job = TypeVar("_Job")


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """Decoders allocate millions of small objects; the cyclic collector costs them 3-4x."""
    import gc

    gc_was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc_was:
            gc.enable()


def _roomy(task: _Task) -> _Task:
    """A task that decodes, with glibc's heap kept roomy while it runs (``core/heap.py``:
    on a worker a Nanny started, decoding is 1.3-1.6x slower without) and Arrow on the
    system allocator (``heap.system_pool``: a 2 GB file imports 1.17x slower on Arrow's
    default, with a 20 % higher peak)."""

    @functools.wraps(task)
    def run(*args: Any, **kwargs: Any) -> Any:
        with heap.roomy(), heap.system_pool():
            return task(*args, **kwargs)

    return cast(_Task, run)


def read_source(path: Path, lenient: bool, progress: Progress | None = None) -> Any:
    """Read one source file with the reader its format needs (a RawTrace whose ``format`` is
    that reader's name, which the normaliser takes the category vocabulary from)."""
    from xpuprof.formats import reader_for

    reader = reader_for(path)
    cb = (lambda done: progress(done, 0)) if progress else None
    with _no_gc():
        raw = reader.read(path, lenient=lenient, progress=cb)
    raw.format = reader.name
    return raw


@_roomy
def read_piece(
    path: str, start: int, end: int | None, first: bool, layout: str, spill_dir: str, tag: str,
    lenient: bool,
) -> dict[str, Any]:  # fmt: skip
    """One byte range of a file cut by :func:`_split_plans` (a Dask task): its columns go to
    IPC files under ``spill_dir``; what :func:`import_pieces` needs comes back."""
    from xpuprof.formats.kineto import split

    with _no_gc():
        return split.decode_piece(path, start, end, first, layout, spill_dir, tag, lenient)


@_roomy
def import_pieces(
    plan: dict[str, Any],
    pieces: list[dict[str, Any]],
    sha256: str,
    part: int,
    out_dir: str,
    lenient: bool,
    rank_hint: RankHint | None = None,
) -> dict[str, Any]:
    """:func:`import_file` for a file decoded in pieces (a Dask task): the pieces put
    together, normalized and written; when a piece could not be used (damage, a cut that was
    not an entry boundary, …) the file is decoded again in one piece, which reports whatever
    is wrong as a one-piece import does."""
    from xpuprof.formats.kineto import split

    path = plan["path"]
    spill = str(Path(out_dir) / _SPILL)
    with _no_gc():
        raw = split.combine(plan, pieces, spill, sha256)
    if raw is None:
        return import_file(path, part, out_dir, lenient, None, rank_hint)
    raw.format = "kineto"
    if rank_hint is None:
        n = rank_from_name(Path(path))
        rank_hint = (n, "file name") if n is not None else None
    with _no_gc():
        entry = write_raw(raw, part, out_dir, rank_hint=rank_hint)
    entry.update(path=path, size=plan["size"], mtime_ns=plan["mtime_ns"])
    return entry


@_roomy
def import_file(
    path: str,
    part: int,
    out_dir: str,
    lenient: bool,
    progress: Progress | None = None,
    rank_hint: RankHint | None = None,
    readers: tuple[Any, ...] = (),
) -> dict[str, Any]:
    """Read, normalize and write one source file; return its manifest entry. ``rank_hint``:
    what :func:`rank_hints` found for it (default: the file name's ``rank<N>``); ``readers``:
    those registered in the importing process (``formats.registered``), for a worker that
    does not know them.

    Runs inside a Dask worker for parallel imports, so it takes and returns plain data.
    """
    if readers:
        from xpuprof.formats import ensure

        ensure(readers)
    p = Path(path)
    try:
        stat = p.stat()
        raw = read_source(p, lenient, progress)
    except OSError as e:
        if e.errno is None:  # a decoder's complaint, not an I/O error
            raise
        raise XpuprofError(f"{p}: cannot read ({e.strerror or e})") from None
    if rank_hint is None:
        n = rank_from_name(p)
        rank_hint = (n, "file name") if n is not None else None
    with _no_gc():  # the FLOPs derivation decodes every op's args: objects by the million
        entry = write_raw(raw, part, out_dir, rank_hint=rank_hint)
    entry.update(path=str(p), size=stat.st_size, mtime_ns=stat.st_mtime_ns)
    return entry


def import_files(
    batch: list[tuple[str, int, RankHint | None]],
    out_dir: str,
    lenient: bool,
    readers: tuple[Any, ...] = (),
) -> list[dict[str, Any]]:
    """:func:`import_file` for each (path, part, rank hint) of a batch of small files, one
    after the other (a Dask task: one file's tables held at a time); their manifest entries.
    The first file that fails raises, as its own task would."""
    return [import_file(path, part, out_dir, lenient, None, hint, readers)
            for path, part, hint in batch]  # fmt: skip


def _batched(
    jobs: list[tuple[Path, int]], sizes: dict[int, int], workers: int
) -> list[tuple[tuple[Path, int], ...]]:
    """``jobs`` (biggest first) as the tasks that import them: runs of small files of at
    most ``BATCH_MAX_BYTES`` together, each other file alone, and the last ``BATCH_TAIL``
    files per worker alone."""
    tail = max(0, len(jobs) - BATCH_TAIL * workers)
    out: list[tuple[tuple[Path, int], ...]] = []
    run: list[tuple[Path, int]] = []
    total = 0
    for job in jobs[:tail]:
        size = sizes[job[1]]
        if run and total + size > BATCH_MAX_BYTES:
            out.append(tuple(run))
            run, total = [], 0
        run.append(job)
        total += size
    if run:
        out.append(tuple(run))
    return out + [(job,) for job in jobs[tail:]]


def write_raw(
    raw: Any, part: int, out_dir: str | Path, *, rank_hint: RankHint | None = None
) -> dict[str, Any]:
    """Normalize one source's raw tables and write them as part ``part`` (under file names no
    other writer produces; the commit flushes them); return its manifest entry (without the
    source file's path, size and mtime, which the caller knows)."""
    import pyarrow.compute as pc

    from xpuprof.trace.normalize import build_tables

    rank, rank_from = source_rank(raw.top, rank_hint)
    host = raw.top.get("host_name") or raw.top.get("hostname")
    host = host if isinstance(host, str) else None

    read_phase, read_cat = raw.read_phase, raw.read_category
    root = Path(out_dir)
    tag = st.unique_tag()
    files = {name: st.part_file(name, part, tag) for name in st.TABLES}
    # the events table (most of the bytes) is written on a thread of its own while the flows
    # are bound and the small tables written: Parquet encoding runs without the GIL (big
    # sources only: core/beside.py; the raw events' count stands for the table's)
    with beside(raw.tables["events"].num_rows, "write") as submit:
        events_written: list[Future[None]] = []

        def write_events(events: Any) -> None:
            events_written.append(submit(st.write_table, events, root / files["events"]))

        tables = build_tables(raw.tables, part=part, rank=rank, host=host,
                              string_ids=raw.string_ids, format=raw.format,
                              on_events=write_events)  # fmt: skip
        raw.tables = {}
        for name in st.TABLES:
            if name != "events":
                st.write_table(getattr(tables, name), root / files[name])
        for fut in events_written:
            fut.result()  # its error, if any, is this write's
    rows = {name: getattr(tables, name).num_rows for name in st.TABLES}
    levels = {
        k["values"]: k["counts"]
        for k in pc.value_counts(
            tables.events["level"].combine_chunks().dictionary_decode()
        ).to_pylist()
    }
    dropped = [d.__dict__ for d in raw.dropped]
    n_dropped = sum(d.events for d in raw.dropped)
    return {
        "path": raw.path,
        "size": raw.size,
        "mtime_ns": None,
        "sha256": raw.sha256,
        "format": raw.format,
        "compressed": raw.compressed,
        "part": part,
        "rank": rank,
        "rank_from": rank_from,
        "steps_from": tables.steps_from,
        "host": host,
        "files": files,
        "rows": rows,
        "levels": levels,
        "read": {
            "total": sum(read_phase.values()) + n_dropped,
            "kept": sum(read_phase.values()),
            "phase": read_phase,
            "category": read_cat,
            "dropped": dropped,
            "truncated": raw.truncated,
            "notes": list(getattr(raw, "notes", [])),  # what was kept but changed (a negative dur)
        },
        "meta": {**raw.top, "string_ids": raw.string_ids},
    }


@contextlib.contextmanager
def failing_cleanly(root: Path, made: list[Path]) -> Iterator[None]:
    """What every store write does when it fails: the parent folders it made go again if no
    store came to be, and an OS error becomes one :class:`StoreError` naming the store."""
    try:
        yield
    except BaseException as e:
        if not root.exists():
            st.remove_parents(made)
        if isinstance(e, OSError):
            raise StoreError(st.io_message(e, root)) from None
        raise


def store_raw(
    raws: list[Any], store: str | Path, *, lock_wait: float = st.LOCK_WAIT_S
) -> ImportReport:
    """Write raw traces held in memory (a live capture) as a new store, atomically.

    The store must not exist yet (or be an empty directory): a capture has no source file to
    compare against, so there is nothing to reuse.
    """
    t0 = time.perf_counter()
    root = Path(store).resolve()
    made = st.make_parents(root)
    with failing_cleanly(root, made), st.StoreLock(root, wait=lock_wait):
        st.clean_stale(root)
        if root.exists() and (root.is_file() or any(root.iterdir())):
            raise XpuprofError(f"{root}: exists and is not empty; not overwriting it")
        staging, _ = st.begin_staging(root)
        try:
            entries = [write_raw(raw, part, staging) for part, raw in enumerate(raws)]
            manifest = st.new_manifest(entries)
            st.commit_new(staging, root, manifest)
        except BaseException:
            st.discard(staging)
            raise
    return ImportReport.of(root, manifest, t0, 1)


def _unchanged(entry: dict[str, Any], path: Path) -> bool:
    """True when ``path`` is the file recorded in ``entry`` (size + mtime, else its hash)."""
    try:
        s = path.stat()
    except OSError:
        return False
    if s.st_size != entry.get("size"):
        return False
    if s.st_mtime_ns == entry.get("mtime_ns"):
        return True
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    if h.hexdigest() == entry.get("sha256"):
        entry["mtime_ns"] = s.st_mtime_ns
        return True
    return False


def _intact(root: Path, entry: dict[str, Any]) -> bool:
    """True when every file of a store's source is still there (else import it again)."""
    return not any(st.locate(root, rel) for rel in entry["files"].values() if rel)


def _start_methods() -> list[str]:
    import multiprocessing

    return multiprocessing.get_all_start_methods()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as e:
        raise XpuprofError(f"{path}: cannot read ({e.strerror or e})") from None


def _run(
    jobs: list[tuple[Path, int]],
    staging: Path,
    lenient: bool,
    scheduler: str | None,
    workers: int | None,
    progress: Progress | None,
    hints: dict[Path, RankHint] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Import each (file, part) into ``staging``: in this process for small inputs, else on
    Dask; return the manifest entries and the number of workers used."""
    total = sum(_size(p) for p, _ in jobs)
    n_cpu = os.cpu_count() or 1
    if workers is None:
        big = n_cpu > 1 and any(_size(p) >= SPLIT_MIN_BYTES and _can_split(p) for p, _ in jobs)
        parallel = n_cpu > 1 and (len(jobs) > 1 and total >= PARALLEL_MIN_BYTES or big)
        workers = (n_cpu if big else min(n_cpu, len(jobs))) if parallel else 1
    if scheduler is None and workers <= 1:
        return _run_here(jobs, staging, lenient, total, progress, hints or {}), 1
    return _run_on_dask(jobs, staging, lenient, scheduler, workers, total, progress, hints or {})


def _run_here(
    jobs: list[tuple[Path, int]],
    staging: Path,
    lenient: bool,
    total: int,
    progress: Progress | None,
    hints: dict[Path, RankHint],
) -> list[dict[str, Any]]:
    out = []
    done = 0
    for path, part in jobs:
        size = _size(path)
        base = done

        def cb(d: int, _t: int, base: int = base, size: int = size) -> None:
            if progress:
                progress(min(base + d, base + size), total)

        out.append(
            import_file(
                str(path), part, str(staging), lenient, cb if progress else None, hints.get(path)
            )
        )
        done += size
        if progress:
            progress(done, total)
    return out


def _preload(jobs: list[tuple[Path, int]]) -> str:
    """The Dask workers' start method for importing ``jobs``: forked from a *fork server*
    that imports what they need once (the readers of these files), not from this process,
    whose other threads (DuckDB's, torch's, a web server's) may hold a lock at the fork and
    leave the child stuck — the cluster then waits forever (seen in the test suite). Costs
    the server's start once per process (8-rank benchmark import: 5.0–5.7 s forked here,
    7.0 s), now overlapped with the work of the worker in this process; else spawn."""
    from xpuprof.formats import reader_for

    modules = dict.fromkeys(("xpuprof.trace.ingest", "xpuprof.trace.normalize"))
    for path, _ in jobs:
        with contextlib.suppress(XpuprofError):  # the worker reports it, with the others'
            modules.update(dict.fromkeys(reader_for(path).preload))
    if "xpuprof.formats.kineto.decode" in modules:
        modules["xpuprof.formats.kineto.split"] = None  # for a file decoded in pieces
    return start_forkserver(list(modules))


def start_forkserver(modules: list[str]) -> str:
    """Start the fork server Dask's worker processes will be forked from, importing Dask and
    ``modules`` (what their tasks run) once, and say so to Dask; returns the start method
    (``"spawn"`` where there is no fork server). See :func:`_preload` for why."""
    import multiprocessing

    if "forkserver" not in _start_methods():
        return "spawn"
    from multiprocessing import forkserver

    # the server starts now, before this process imports Dask: it imports the same at once
    # on the other core, and a worker forked from it is ready a second or so later
    multiprocessing.get_context("forkserver").set_forkserver_preload(["distributed", *modules])
    forkserver.ensure_running()
    import dask
    from distributed import utils

    # Dask sets its own preload list the first time it starts a process (over any set before,
    # which no longer matters to a server that is running), after importing every package it
    # knows of here to see which exist (0.8 s, on the way to the first file): say it is done
    if isinstance(getattr(utils, "_forkserver_preload_set", None), bool):
        utils._forkserver_preload_set = True
    else:
        with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
            utils.get_mp_context()
    return "forkserver"


def _can_split(path: Path) -> bool:
    """True for a file ``formats/kineto/split.py`` can decode in byte ranges."""
    from xpuprof.formats import reader_for

    try:
        if reader_for(path).name != "kineto":
            return False
    except XpuprofError:
        return False
    from xpuprof.formats.kineto.split import splittable

    return splittable(path)


def _split_plans(jobs: list[tuple[Path, int]], total: int, workers: int) -> dict[int, Any]:
    """The files to decode in byte ranges, by part, with their cuts: plain Kineto files of at
    least ``SPLIT_MIN_BYTES`` that hold more than one worker's share of the input (smaller
    ones keep the workers busy on their own)."""
    if workers < 2:
        return {}
    from xpuprof.formats.kineto import split

    share = total / workers
    plans = {}
    for path, part in jobs:
        size = _size(path)
        if size < SPLIT_MIN_BYTES or size <= share or not _can_split(path):
            continue
        plan = split.plan(path, 2 * workers)  # two per worker: a slow one is evened out
        if plan is not None:
            plans[part] = plan
    return plans


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    except OSError as e:
        raise XpuprofError(f"{path}: cannot read ({e.strerror or e})") from None
    return h.hexdigest()


def _run_on_dask(
    jobs: list[tuple[Path, int]],
    staging: Path,
    lenient: bool,
    scheduler: str | None,
    workers: int,
    total: int,
    progress: Progress | None,
    hints: dict[Path, RankHint],
) -> tuple[list[dict[str, Any]], int]:
    with contextlib.ExitStack() as stack:
        if scheduler:
            from dask.distributed import Client

            client = stack.enter_context(Client(scheduler))
            n_workers = len(client.scheduler_info().get("workers", {})) or workers
        else:
            # Dask is imported only once the fork server is starting (_local_cluster)
            cluster = stack.enter_context(_local_cluster(jobs, workers))
            from dask.distributed import Client

            # by address: a client given the cluster itself waits for every worker to be up
            # (the forked ones take a second or more), the one here could start at once
            client = stack.enter_context(Client(cluster.scheduler_address))
            n_workers = workers
        return _submit_all(client, jobs, staging, lenient, n_workers, total,
                           progress, hints)  # fmt: skip


def _local_cluster(
    jobs: list[tuple[Path, int]], workers: int
) -> contextlib.AbstractContextManager[Any]:
    """:func:`local_cluster` for importing ``jobs`` (its fork server imports their readers)."""
    return local_cluster(workers, method=_preload(jobs))


@contextlib.contextmanager
def local_cluster(workers: int, *, method: str) -> Iterator[Any]:
    """A Dask cluster of ``workers`` on this machine: one worker in this process, ready at
    once, and ``workers - 1`` processes started in the background (``method``: from the fork
    server of :func:`start_forkserver`, started first) that join as they come up. Starting
    processes costs about a second (importing the readers once, in the fork server), which
    this process spends importing the first file instead of waiting. Connect to it by
    ``cluster.scheduler_address``: a client given the cluster waits for every worker."""
    import dask
    from dask.distributed import Nanny, Scheduler, SpecCluster, Worker
    from distributed.worker_memory import parse_memory_limit

    quiet = {"silence_logs": logging.CRITICAL}  # our own error line is the one to read
    # as LocalCluster does: this machine only, no dashboard (its HTTP server on a free port:
    # no clash, no warning on a busy 8787), each worker its share of the memory
    here = {"host": "127.0.0.1", "dashboard": False}
    memory = parse_memory_limit("auto", 1, workers, logger=logging.getLogger("distributed"))
    opts = {**here, "nthreads": 1, "memory_limit": memory}
    # the Nanny reads the start method when it starts its process, after this returns; the
    # pieces of a file cut in byte ranges go to a worker only when it is free (Dask's default
    # gives a one-thread worker two at a time); whole files are fed so by :func:`_fed`
    config = {
        **LOCAL_CLUSTER_CONFIG,
        "distributed.worker.multiprocessing-method": method,
        "distributed.scheduler.worker-saturation": 1.0,
    }
    with dask.config.set(config):
        cluster = SpecCluster(
            workers={"here": {"cls": Worker, "options": opts}},
            scheduler={"cls": Scheduler, "options": {**here, "dashboard_address": "127.0.0.1:0"}},
            worker={"cls": Nanny, "options": {**opts, **quiet}},
            **quiet,
        )
        try:
            cluster.scale(workers)  # does not wait for the new workers
            yield cluster
        finally:
            cluster.close()


def _submit_pieces(
    client: Any,
    plans: dict[int, Any],
    spill: Path,
    staging: Path,
    lenient: bool,
    hints: dict[Path, RankHint],
) -> list[Any]:
    """Submit the pieces of each file cut in byte ranges and, per file, the task that puts
    them together (keyed ``import-PART``); return all their futures."""
    futures: list[Any] = []
    combines = []
    for part, plan in plans.items():
        pieces = [
            client.submit(
                read_piece,
                plan.path,
                a,
                z,
                k == 0,
                plan.layout,
                str(spill),
                f"{part:05d}-{k}",
                lenient,
                key=f"piece-{part}-{k}",
            )  # fmt: skip
            for k, (a, z) in enumerate(plan.ranges)
        ]
        futures.extend(pieces)
        combines.append((part, plan, pieces))
    # per file, the task that puts its pieces together, and the hash of the file, which no
    # piece sees whole: a task of its own that waits for a free worker (computed here, it
    # competed with the pieces for the cores; measured: RESULTS.md)
    for part, plan, pieces in combines:
        futures.append(
            client.submit(
                import_pieces,
                plan.to_dict(),
                pieces,
                "",  # the hash task's, put in by the caller
                part,
                str(staging),
                lenient,
                hints.get(Path(plan.path)),
                key=f"import-{part}",
            )  # fmt: skip
        )
        futures.append(client.submit(_sha256, Path(plan.path), key=f"hash-{part}", priority=-1))
    return futures


def _submit_all(
    client: Any,
    jobs: list[tuple[Path, int]],
    staging: Path,
    lenient: bool,
    n_workers: int,
    total: int,
    progress: Progress | None,
    hints: dict[Path, RankHint],
) -> tuple[list[dict[str, Any]], int]:
    """Submit every file (or its pieces and the task that puts them together), wait for them
    all; on the first failure cancel the rest and raise it."""
    from xpuprof.formats import registered

    futures: list[Any] = []
    # biggest files first: the last task to start should be a small one
    ordered = sorted(jobs, key=lambda j: -_size(j[0]))
    plans = _split_plans(ordered, total, n_workers)
    spill = staging / _SPILL
    if plans:
        spill.mkdir(exist_ok=True)
    by_part = {part: _size(p) for p, part in ordered}
    # fed to free workers, small files several to a task
    whole = _batched([(p, part) for p, part in ordered if part not in plans], by_part, n_workers)
    futures.extend(_submit_pieces(client, plans, spill, staging, lenient, hints))
    sizes = {f"import-{part}": size for part, size in by_part.items()}
    results = []
    done = 0
    extra = registered()  # readers added in this process, which the workers may not know

    def submit(job: tuple[tuple[Path, int], ...]) -> Any:
        if len(job) == 1:
            ((p, part),) = job
            fut = client.submit(import_file, str(p), part, str(staging), lenient, None,
                                hints.get(p), extra, key=f"import-{part}")  # fmt: skip
        else:
            key = f"import-{job[0][1]}-{job[-1][1]}"
            sizes[key] = sum(by_part[part] for _, part in job)
            batch = [(str(p), part, hints.get(p)) for p, part in job]
            fut = client.submit(import_files, batch, str(staging), lenient, extra, key=key)
        futures.append(fut)
        return fut

    hashes = {f.key.replace("hash-", "import-"): f for f in futures
              if f.key.startswith("hash-")}  # fmt: skip

    def small(job: tuple[tuple[Path, int], ...]) -> bool:
        # a batch is of small files; one sent early may delay the end by one of them
        return all(by_part[part] <= AHEAD_MAX_BYTES for _, part in job)

    for fut in _fed(client, whole, submit, [f for f in futures if f.key.startswith("import-")],
                    bool(plans), small, expect=n_workers):  # fmt: skip
        try:
            entry = fut.result()
            if isinstance(entry, list):  # a batch's
                results.extend(entry)
            else:
                if fut.key in hashes and not entry["sha256"]:  # not decoded again in one piece
                    entry["sha256"] = hashes[fut.key].result()
                results.append(entry)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        done += sizes[fut.key]
        if progress:
            progress(done, total)
    if plans:
        spill.rmdir()  # emptied by the tasks that put the pieces together
    return results, n_workers


def _fed(
    client: Any,
    todo: list[_Job],
    submit: Callable[[_Job], Any],
    waited: list[Any],
    all_at_once: bool,
    ahead: Callable[[_Job], bool] = lambda job: False,
    expect: int = 1,
) -> Iterator[Any]:
    """The import tasks as they end: ``waited`` (submitted already) and one per job of
    ``todo`` (a file, or a batch of small ones), submitted only when a worker thread is free
    for it, so a worker that joins late (the forked ones, a second after the one in this
    process) gets the next file rather than finding every file queued on the first worker
    (Dask queues tasks on the scheduler only when there are more than twice as many as
    threads). A job ``ahead`` accepts (small files) is sent one early, while each thread is
    still busy, so that a worker goes on to it without waiting for this process to hear that
    its last file ended.
    ``all_at_once``: everything submitted now (a file cut in pieces keeps the workers busy
    anyway). ``expect``: the threads the cluster will have once every worker has joined
    (until then the scheduler is asked every ``_ASK_SOON`` seconds)."""
    from distributed import wait

    todo = list(todo)
    if all_at_once:
        waited = waited + [submit(job) for job in todo]
        todo = []
    pending = set(waited)
    threads, asked = 1, -math.inf
    while todo or pending:
        joining = threads < expect
        if todo:
            # a round trip to the scheduler
            if time.monotonic() - asked > (_ASK_SOON if joining else _ASK_EVERY):
                threads, asked = max(1, sum(client.nthreads().values())), time.monotonic()
                joining = threads < expect
            while todo and len(pending) < threads * (2 if ahead(todo[0]) else 1):
                pending.add(submit(todo.pop(0)))
        try:
            ended = wait(list(pending), timeout=(_ASK_SOON if joining else 0.2) if todo else None,
                         return_when="FIRST_COMPLETED").done  # fmt: skip
        except TimeoutError:  # no task ended: a worker may have joined
            continue
        for fut in ended:
            pending.discard(fut)
            yield fut


def import_size(paths: list[str | Path]) -> int:
    """Bytes an import of ``paths`` reads: its trace files, or the files of the stores it
    merges (what a progress bar counts)."""
    from xpuprof.trace import merge

    if merge.wants_merge(paths):
        return merge.input_size(paths)
    return sum(_size(p) for p in expand_sources(paths))


def import_traces(
    paths: list[str | Path],
    store: str | Path,
    *,
    lenient: bool = False,
    scheduler: str | None = None,
    workers: int | None = None,
    force: bool = False,
    progress: Progress | None = None,
    lock_wait: float = st.LOCK_WAIT_S,
    mixed: bool = False,
) -> ImportReport:
    """Import trace files (or directories of them) into ``store``.

    The sources must be ranks of one job: files whose ``distributedInfo`` states different
    world sizes, or different process groups, are refused in one line naming them
    (:func:`~xpuprof.trace.ranks.mixed_jobs`) unless ``mixed``, and nothing is written.

    The store then holds exactly these sources. Sources already in it, unchanged (same size and
    modification time, or same SHA-256), are kept as they are; if nothing changed the import is
    a no-op. Nothing is left behind on error: a new store is built in a hidden sibling folder
    and renamed into place at the end, and an existing one changes only when its manifest is
    replaced. One writer at a time: the import holds the store's lock
    (:class:`~xpuprof.trace.store.StoreLock`), waiting up to ``lock_wait`` seconds for another
    writer before a :class:`StoreError` naming it; it also removes what killed writers left.

    ``paths`` naming stores are merged into ``store`` instead (:mod:`xpuprof.trace.merge`;
    ``lenient``, ``scheduler`` and ``workers`` do not apply: the parts are already read).
    """
    from xpuprof.trace import merge

    if merge.wants_merge(paths):
        return merge.merge_stores(paths, store, mixed=mixed, force=force, lock_wait=lock_wait,
                                  progress=progress)  # fmt: skip
    t0 = time.perf_counter()
    root = Path(store).resolve()
    sources = expand_sources(paths)
    made = st.make_parents(root)
    with failing_cleanly(root, made), st.StoreLock(root, wait=lock_wait):
        st.clean_stale(root)
        return _import_locked(sources, root, t0, lenient, scheduler, workers, force, progress,
                              mixed)  # fmt: skip


def _import_locked(
    sources: list[Path],
    root: Path,
    t0: float,
    lenient: bool,
    scheduler: str | None,
    workers: int | None,
    force: bool,
    progress: Progress | None,
    mixed: bool = False,
) -> ImportReport:
    """:func:`import_traces` once the store's lock is held."""
    if root.exists() and not st.is_store(root):
        if root.is_file() or any(root.iterdir()):
            raise XpuprofError(f"{root}: exists and is not an xpuprof store; not overwriting it")
    # files missing from the store are not an error here: their sources are imported again
    old = st.read_manifest(root, check_files=False) if st.is_store(root) else None
    old_by_path = {s["path"]: s for s in old["sources"]} if old else {}
    keep: list[dict[str, Any]] = []
    old_mtimes: list[int] = []
    todo: list[Path] = []
    for src in sources:
        entry = old_by_path.get(str(src))
        mtime = entry.get("mtime_ns") if entry is not None else None
        if entry is not None and not force and _unchanged(entry, src) and _intact(root, entry):
            keep.append(entry)
            old_mtimes.append(mtime)
        else:
            todo.append(src)
    if old is not None and not todo and len(keep) == len(old["sources"]):
        if any(e["mtime_ns"] != m for e, m in zip(keep, old_mtimes, strict=True)):
            # touched but identical files: remember the new mtimes, so the next import does
            # not hash them again
            st.write_manifest(root, {**old, "sources": keep})
        st.remove_unlisted(root, old)  # what an interrupted write left
        return ImportReport(
            store=str(root),
            noop=True,
            sources=keep,
            rows=old["rows"],
            levels=old["levels"],
            events_read=old["events_read"],
            seconds=time.perf_counter() - t0,
            workers=0,
            reused=[s["path"] for s in keep],
        )
    next_part = 1 + max((s["part"] for s in old["sources"]), default=-1) if old else 0
    jobs = [(p, next_part + i) for i, p in enumerate(todo)]
    staging, _ = st.begin_staging(root)
    try:
        hints = rank_hints(sources)
        results, n_workers = _run(jobs, staging, lenient, scheduler, workers, progress, hints)
        problem = None if mixed else mixed_jobs(keep + results)
        if problem:
            raise XpuprofError(problem)
        manifest = st.new_manifest(keep + results)
        st.commit(root, staging, old, results, manifest)
    finally:
        st.discard(staging)  # gone already after a new store's rename
    return ImportReport.of(root, manifest, t0, n_workers, [s["path"] for s in keep])


__all__ = [
    "RANK_FROM",
    "ImportReport",
    "StoreError",
    "TraceFormatError",
    "expand_sources",
    "import_size",
    "import_traces",
    "rank_hints",
    "source_rank",
]

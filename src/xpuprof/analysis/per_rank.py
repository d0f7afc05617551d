"""Per-rank analysis as Dask tasks: one task per group of parts (≈ ranks), each opening
only those parts of the store (``Trace(path, parts=[...])``), so no task holds more than one
group's tables (below) and the memory of a worker is bounded by the largest group, not by the
job.

What crosses ranks is computed first, in the calling process, on small tables (the matched
collectives' waits: one row per collective kernel), and handed to each task as *seeds*: entries
of the task's ``Trace.memo`` that the analysis would otherwise compute from every rank (the
diagnosis asks :func:`xpuprof.analysis.comm.collective_waits` for its part's waits). Each task
returns a small per-rank summary (a DataFrame of a few rows per step); the reduction across
ranks happens on those.

The cluster is a Dask ``LocalCluster`` of ``workers`` single-threaded processes (default: one
per core) or the user's own scheduler (``scheduler=ADDRESS``: the store must then be on a path
every worker reads, as for ``xpuprof import --scheduler``). Below :data:`DASK_MIN_PARTS`
parts or :data:`DASK_MIN_EVENTS` events, and with one worker, the tasks run in this process:
starting a cluster costs more than it saves on a few ranks. Within :func:`shared_cluster`
(each tool of ``ui/tools.py``, :func:`cluster_options`) the analyses a tool runs share one
local cluster, closed when the tool returns.

**Groups of ranks.** The analyses whose per-rank answers simply add up (the diagnosis, the
step times of the ranks tool, the overview, the collectives' per-rank half, the job path's
replay rounds) run a task per *group* of consecutive parts
(:func:`map_groups`): the task opens the group's parts together and runs the one-process
analysis over them, so the store is opened and each query run once per group, not per rank.
Per rank those fixed costs (a DuckDB connection, the manifest, ~10 queries of ~5 ms on one
small Parquet file each) were as large as the work itself on ranks of ~40 k events: 0.30 s
per rank as tasks against 0.13 s in one pass (64 ranks of the DLRM benchmark), which made 2
workers slower than one process. A group holds at most :data:`GROUP_MAX_EVENTS` events (a
larger rank is a group alone), so a task's memory is bounded by that, not by the job, and
there are at least :data:`GROUPS_PER_WORKER` groups per worker so that the workers end
together. With one worker, a selection of more than :data:`GROUP_MAX_EVENTS` events is
analysed group by group in this process too: its memory is then bounded the same way.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: From this many parts up, per-rank work goes to a Dask cluster unless told otherwise ...
DASK_MIN_PARTS = 32
#: ... when they hold more events than this together (one group's worth): below it starting
#: a cluster costs more than it saves (32 ranks of 1.26 M events: 7.3 s in one process
#: against 8.9 s on two workers; 64 ranks of 2.5 M: 18.4 against 13.9 s).
DASK_MIN_EVENTS = 1_000_000
#: DuckDB's settings inside a task: one thread (the worker is the unit of parallelism) and a
#: memory limit well under a worker's share, so a query spills rather than grows.
TASK_DUCKDB = {"threads": 1, "memory_limit": "1GB"}
#: A group of parts analysed by one task holds at most this many events (module docstring):
#: in one pass the analyses above hold ~0.3 KB per event (64 DLRM ranks, 2.5 M events: 0.73 GB).
GROUP_MAX_EVENTS = 1_000_000
#: At least this many groups per worker (when there are enough parts): the last groups are
#: short, so the workers end together.
GROUPS_PER_WORKER = 4
#: ``depth`` > 0 in a thread running a task: the analysis it calls must not start a cluster
#: or group again (a thread: the local cluster has a worker in the calling process).
_task = threading.local()
#: ``workers`` and ``scheduler`` set by :func:`cluster_options` in this thread.
_defaults = threading.local()


@contextlib.contextmanager
def cluster_options(workers: int | None = None, scheduler: str | None = None) -> Iterator[None]:
    """Within: the ``workers`` and ``scheduler`` of the per-rank work of every analysis
    called without its own (a tool's ``--workers`` reaches the diagnosis its advisor asks
    for, not only the analysis it calls itself). This thread only."""
    old = _given(None, None)
    _defaults.workers, _defaults.scheduler = workers, scheduler
    try:
        with shared_cluster():
            yield
    finally:
        _defaults.workers, _defaults.scheduler = old


@contextlib.contextmanager
def shared_cluster() -> Iterator[None]:
    """Within: the local cluster that per-rank work starts is kept for the next analysis that
    asks for as many workers, and closed on leaving — a tool that runs several analyses (the
    collectives, the step times, the job path's rounds) starts one, not one each (a start
    costs ~1.5 s on two cores). Nested, the outer one's. This thread only."""
    if getattr(_defaults, "pool", None) is not None:
        yield
        return
    pool = _Pool()
    _defaults.pool = pool
    try:
        yield
    finally:
        _defaults.pool = None
        pool.close()


class _Pool:
    """One local cluster and its client, kept by :func:`shared_cluster`."""

    def __init__(self) -> None:
        self.stack: contextlib.ExitStack | None = None
        self.workers = 0
        self.client: Any = None

    def get(self, workers: int, target: str) -> Any:
        """A client of a local cluster of ``workers`` (started on first use; one of another
        size is closed first)."""
        if self.client is not None and self.workers == workers:
            return self.client
        self.close()
        from dask.distributed import Client

        from xpuprof.trace.ingest import local_cluster

        stack = contextlib.ExitStack()
        try:
            cluster = stack.enter_context(local_cluster(workers, method=_fork_server(target)))
            # by address: a client given the cluster waits for the forked workers to be up
            self.client = stack.enter_context(Client(cluster.scheduler_address))
        except BaseException:
            stack.close()
            raise
        self.stack, self.workers = stack, workers
        return self.client

    def close(self) -> None:
        stack, self.stack, self.client, self.workers = self.stack, None, None, 0
        if stack is not None:
            stack.close()


def _given(workers: int | None, scheduler: str | None) -> tuple[int | None, str | None]:
    """The arguments, else those of the enclosing :func:`cluster_options`."""
    if workers is None:
        workers = getattr(_defaults, "workers", None)
    return workers, scheduler or getattr(_defaults, "scheduler", None)


def _size(workers: int | None) -> int:
    return workers if workers is not None else (os.cpu_count() or 1)


def on_dask(
    n_parts: int,
    workers: int | None = None,
    scheduler: str | None = None,
    events: int | None = None,
    min_events: int | None = None,
) -> bool:
    """Whether per-rank work over ``n_parts`` parts (holding ``events``; None: not known)
    goes to Dask: always on a given scheduler; never with one worker (or one core); by
    default from :data:`DASK_MIN_PARTS` parts holding more than ``min_events`` (default
    :data:`DASK_MIN_EVENTS`; :func:`cluster_options` gives the defaults)."""
    if _in_a_task():
        return False
    workers, scheduler = _given(workers, scheduler)
    if scheduler is not None:
        return True
    least = DASK_MIN_EVENTS if min_events is None else min_events
    big = n_parts >= DASK_MIN_PARTS and (events is None or events > least)
    return _size(workers) > 1 and (workers is not None or big)


def cluster_up() -> bool:
    """Whether this thread's :func:`shared_cluster` holds a running local cluster (work sent
    to it then pays no start)."""
    pool = getattr(_defaults, "pool", None)
    return pool is not None and pool.client is not None


def events_of(trace: Trace, parts: Iterable[int]) -> int:
    """The events ``parts`` hold together (the manifest's counts)."""
    sizes = _events(trace)
    return sum(sizes.get(int(p), 0) for p in parts)


def grouped(trace: Trace, parts: list[int], workers: int | None = None,
            scheduler: str | None = None) -> bool:  # fmt: skip
    """Whether an analysis of ``parts`` runs group by group (:func:`map_groups`): on Dask
    (:func:`on_dask`), or in this process when the parts hold more than
    :data:`GROUP_MAX_EVENTS` events (bounded memory). Never inside a task."""
    if _in_a_task():
        return False
    events = events_of(trace, parts)
    return on_dask(len(parts), workers, scheduler, events) or (
        len(parts) > 1 and events > GROUP_MAX_EVENTS
    )


def _events(trace: Trace) -> dict[int, int]:
    return {int(s["part"]): int(s.get("rows", {}).get("events", 0)) for s in trace.sources}


def part_groups(trace: Trace, parts: list[int], workers: int) -> list[list[int]]:
    """``parts`` cut into runs of consecutive parts of at most :data:`GROUP_MAX_EVENTS`
    events together, and of at most 1 / (:data:`GROUPS_PER_WORKER` x ``workers``) of all
    their events when there are enough parts (one part larger than that is a group alone)."""
    sizes = _events(trace)
    total = sum(sizes.get(p, 0) for p in parts)
    share = total // (GROUPS_PER_WORKER * workers) if workers > 1 else total
    cap = max(1, min(GROUP_MAX_EVENTS, share))
    groups: list[list[int]] = []
    size = 0
    for p in parts:
        n = sizes.get(p, 0)
        if groups and size + n <= cap:
            groups[-1].append(p)
            size += n
        else:
            groups.append([p])
            size = n
    return groups


def map_groups(
    trace: Trace,
    target: str,
    parts: Iterable[int],
    *,
    kwargs: dict[str, Any] | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    seeds: Callable[[list[list[int]]], list[dict[Any, Any]]] | None = None,
) -> list[Any]:
    """``target(Trace of a group of parts, **kwargs)`` for each group of
    :func:`part_groups`, as Dask tasks or here (module docstring; ``target`` is
    ``"module:function"``, importable on the workers), each Trace's memo seeded
    with ``seeds(groups)[i]`` — by default its parts' collective waits (:func:`wait_seeds`;
    the collectives' own per-rank half, which the waits are made of, seeds nothing; the job
    path, its parts' plans). ``target`` must give the answer
    of one process for whatever parts its Trace holds, in a form whose answers for
    consecutive groups concatenate into the answer for all. Returns the answers in the
    order of the parts."""
    parts = [int(p) for p in parts]
    workers, scheduler = _given(workers, scheduler)
    dask = on_dask(len(parts), workers, scheduler, events_of(trace, parts))
    n = _size(workers) if dask else 1
    groups = part_groups(trace, parts, n)
    kwargs = kwargs or {}
    memo = _group_seeds(trace, groups) if seeds is None else seeds(groups)
    if not dask:
        return [run_part(str(trace.path), g, target, s, kwargs)
                for g, s in zip(groups, memo, strict=True)]  # fmt: skip
    units = [(i, g, memo[i]) for i, g in enumerate(groups)]
    got = _on_dask(str(trace.path), units, target, kwargs, n, scheduler)
    return [got[i] for i in range(len(groups))]


def wait_seeds(trace: Trace, parts: Iterable[int]) -> dict[int, dict[Any, Any]]:
    """Per part, the memo entry its task needs from the other ranks: its collectives' waits
    (:func:`xpuprof.analysis.comm.collective_waits`, computed here once for the store)."""
    parts = [int(p) for p in parts]
    return dict(zip(parts, _group_seeds(trace, [[p] for p in parts]), strict=True))


def _group_seeds(trace: Trace, groups: list[list[int]]) -> list[dict[Any, Any]]:
    """The memo entry of each group's task: its parts' rows of the collectives' waits, in
    their order (computed here once for the store)."""
    from xpuprof.analysis.comm import collective_waits

    waits = collective_waits(trace)
    key = ("analysis.comm.collective_waits",)
    return [{key: waits[waits["part"].isin(g)].reset_index(drop=True)} for g in groups]


def selected_parts(trace: Trace, ranks: Iterable[int] | None) -> list[int]:
    """The parts of the ranks ``ranks`` (None: every part)."""
    wanted = None if ranks is None else {int(r) for r in ranks}
    return [int(s["part"]) for s in trace.sources
            if wanted is None or (s["rank"] is not None and int(s["rank"]) in wanted)]  # fmt: skip


def run_part(path: str, part: int | list[int], target: str, seed: dict[Any, Any],
             kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """One task: open part ``part`` (or the group of parts) of the store at ``path`` alone,
    seed its memo, run ``target`` on it (which then neither groups nor starts a cluster)."""
    from xpuprof.trace.trace import Trace

    module, name = target.split(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    parts = [part] if isinstance(part, int) else list(part)
    with Trace(path, parts=parts, duckdb_config=dict(TASK_DUCKDB)) as t:
        t.memo.update(seed)
        _task.depth = _in_a_task() + 1
        try:
            return fn(t, **kwargs)
        finally:
            _task.depth -= 1


def _in_a_task() -> int:
    return int(getattr(_task, "depth", 0))


def _on_dask(
    path: str,
    units: list[tuple[int, int | list[int], dict[Any, Any]]],
    target: str,
    kwargs: dict[str, Any],
    workers: int,
    scheduler: str | None,
) -> dict[int, Any]:
    """``run_part`` of each unit ``(key, part or group, seed)`` on the user's scheduler or a
    local cluster (:func:`xpuprof.trace.ingest.local_cluster`: one worker in this process,
    ready at once, the others forked as they come up); key → answer."""
    from dask.distributed import Client, as_completed

    pool: _Pool | None = getattr(_defaults, "pool", None)
    with contextlib.ExitStack() as stack:
        if scheduler:
            client = stack.enter_context(Client(scheduler))
        else:
            if pool is None:  # one call's own cluster, closed on return
                pool = _Pool()
                stack.callback(pool.close)
            else:  # a failed call leaves no half-used cluster to the next one
                stack.push(lambda exc, *_: pool.close() if exc is not None else None)
            client = pool.get(workers, target)
        # seeds travel with their task only: a worker never receives another rank's
        token = uuid.uuid4().hex[:8]  # a user's scheduler may still hold an earlier call's
        pending = {client.submit(run_part, path, what, target, seed, kwargs,
                                 key=f"part-{k}-{target}-{token}", pure=False): k
                   for k, what, seed in units}  # fmt: skip
        out: dict[int, Any] = {}
        # each answer fetched as it is ready and released on its worker then: a worker does
        # not keep the answers of its hundreds of tasks until the last one ends
        for f in as_completed(list(pending)):
            out[pending.pop(f)] = f.result()
            f.release()
        return {k: out[k] for k, _, _ in units}


def _fork_server(target: str) -> str:
    """Start the fork server of the local cluster's worker processes (never forked from this
    process, whose DuckDB threads may hold a lock at the fork: ``trace.ingest._preload``),
    importing this module and ``target``'s; returns their start method."""
    from xpuprof.trace.ingest import start_forkserver

    return start_forkserver([__name__, target.split(":")[0]])

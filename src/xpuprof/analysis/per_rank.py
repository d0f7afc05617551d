"""Per-rank analysis as Dask tasks: one task per part (≈ rank), each opening only that part of
the store (``Trace(path, parts=[p])``), so no task holds more than one rank's tables and the
memory of a worker is bounded by the largest rank, not by the job.

What crosses ranks is computed first, in the calling process, on small tables (the matched
collectives' waits: one row per collective kernel), and handed to each task as *seeds*: entries
of the task's ``Trace.memo`` that the analysis would otherwise compute from every rank (the
diagnosis asks :func:`xpuprof.analysis.comm.collective_waits` for its part's waits). Each task
returns a small per-rank summary (a DataFrame of a few rows per step); the reduction across
ranks happens on those.

The cluster is a Dask ``LocalCluster`` of ``workers`` single-threaded processes (default: one
per core) or the user's own scheduler (``scheduler=ADDRESS``: the store must then be on a path
every worker reads, as for ``xpuprof import --scheduler``). Below :data:`DASK_MIN_PARTS`
parts, and with one worker, the tasks run in this process: starting a cluster costs more than
it saves on a few ranks.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: From this many parts up, per-rank work goes to a Dask cluster unless told otherwise.
DASK_MIN_PARTS = 32
#: DuckDB's settings inside a task: one thread (the worker is the unit of parallelism) and a
#: memory limit well under a worker's share, so a query spills rather than grows.
TASK_DUCKDB = {"threads": 1, "memory_limit": "1GB"}


def map_parts(
    trace: Trace,
    target: str,
    parts: Iterable[int],
    *,
    seeds: dict[int, dict[Any, Any]] | None = None,
    kwargs: dict[str, Any] | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
) -> dict[int, Any]:
    """``target(Trace of one part, **kwargs)`` for each part, as Dask tasks or here (module
    docstring); ``target`` is ``"module:function"`` (importable on the workers); ``seeds[p]``
    goes into part ``p``'s ``Trace.memo`` before the call. Returns part → result."""
    parts = [int(p) for p in parts]
    seeds = seeds or {}
    kwargs = kwargs or {}
    if not on_dask(len(parts), workers, scheduler):
        return {p: run_part(str(trace.path), p, target, seeds.get(p, {}), kwargs) for p in parts}
    n = workers if workers is not None else (os.cpu_count() or 1)
    return _on_dask(str(trace.path), parts, target, seeds, kwargs, n, scheduler)


def on_dask(n_parts: int, workers: int | None = None, scheduler: str | None = None) -> bool:
    """Whether per-rank work over ``n_parts`` parts goes to Dask: always on a given
    scheduler; never with one worker (or one core); by default from :data:`DASK_MIN_PARTS`."""
    if scheduler is not None:
        return True
    n = workers if workers is not None else (os.cpu_count() or 1)
    return n > 1 and (workers is not None or n_parts >= DASK_MIN_PARTS)


def wait_seeds(trace: Trace, parts: Iterable[int]) -> dict[int, dict[Any, Any]]:
    """Per part, the memo entry its task needs from the other ranks: its collectives' waits
    (:func:`xpuprof.analysis.comm.collective_waits`, computed here once for the store)."""
    from xpuprof.analysis.comm import collective_waits

    waits = collective_waits(trace)
    key = ("analysis.comm.collective_waits",)
    return {int(p): {key: waits[waits["part"] == p].reset_index(drop=True)} for p in parts}


def selected_parts(trace: Trace, ranks: Iterable[int] | None) -> list[int]:
    """The parts of the ranks ``ranks`` (None: every part)."""
    wanted = None if ranks is None else {int(r) for r in ranks}
    return [int(s["part"]) for s in trace.sources
            if wanted is None or (s["rank"] is not None and int(s["rank"]) in wanted)]  # fmt: skip


def run_part(path: str, part: int, target: str, seed: dict[Any, Any],
             kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """One task: open part ``part`` of the store at ``path`` alone, seed its memo, run
    ``target`` on it."""
    from xpuprof.trace.trace import Trace

    module, name = target.split(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    with Trace(path, parts=[part], duckdb_config=dict(TASK_DUCKDB)) as t:
        t.memo.update(seed)
        return fn(t, **kwargs)


def _on_dask(
    path: str,
    parts: list[int],
    target: str,
    seeds: dict[int, dict[Any, Any]],
    kwargs: dict[str, Any],
    workers: int,
    scheduler: str | None,
) -> dict[int, Any]:
    import dask
    from dask.distributed import Client, LocalCluster, as_completed

    from xpuprof.trace.ingest import LOCAL_CLUSTER_CONFIG

    cluster = None
    if scheduler:
        client = Client(scheduler)
    else:
        # forked from a fork server, never from this process (whose DuckDB threads may hold
        # a lock at the fork): see ``trace.ingest._preload``
        import multiprocessing

        method = "spawn"
        if "forkserver" in multiprocessing.get_all_start_methods():
            module = target.split(":")[0]
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["xpuprof.analysis.per_rank", module])
            method = "forkserver"
        # quieter monitors than Dask's defaults, as for imports (``LOCAL_CLUSTER_CONFIG``)
        config = {**LOCAL_CLUSTER_CONFIG, "distributed.worker.multiprocessing-method": method}
        with dask.config.set(config):
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address="127.0.0.1:0",
                                   silence_logs=logging.CRITICAL)  # fmt: skip
        client = Client(cluster)
    try:
        # seeds travel with their task only: a worker never receives another rank's
        pending = {client.submit(run_part, path, p, target, seeds.get(p, {}), kwargs,
                                 key=f"part-{p}-{target}", pure=False): p
                   for p in parts}  # fmt: skip
        out: dict[int, Any] = {}
        # each answer fetched as it is ready and released on its worker then: a worker does
        # not keep the answers of its hundreds of tasks until the last one ends
        for f in as_completed(list(pending)):
            out[pending.pop(f)] = f.result()
            f.release()
        return {p: out[p] for p in parts}
    finally:
        client.close()
        if cluster is not None:
            cluster.close()

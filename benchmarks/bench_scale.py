"""Many-rank benchmark of issue 14: import and cross-rank analyses of 64, 128 and 512 ranks.

Why: issue 14's targets are about scale (512 ranks, >= 20 M events, peak memory per worker
< 2 GB, time linear in ranks, 2 workers >= 1.7x faster than 1) and about truth (injected clock
offsets recovered within 5 µs, the injected straggler's rank and step identified). There is no
multi-rank peer runnable here (HTA's loader forks one process per rank and its straggler
analysis needs NCCL's old kernel names), so the ratios are against ourselves: 2 workers vs 1,
and time per rank at N vs 2N and 8N.

Inputs: ``benchmarks/gen_ranks.py`` builds each set from the real 8-rank DLRM job (its module
docstring defines the set and ``truth.json``), cached in ``bench-data/ranks-<N>r-<S>s-seed<k>``.

Numbers:

* ``wall``: seconds around a fresh subprocess (Python start and imports included) that calls
  ``xpuprof.import_traces(files, store, workers=W)``; ``W = 1`` imports in that process (no
  Dask: what ``--workers 1`` does), ``W >= 2`` on a LocalCluster of W single-threaded worker
  processes. ``import_s``: the seconds the import itself reports. Median over ``--runs``
  timing runs, which follow one memory run per worker count; worker counts alternate within
  each round. The timing runs sample the process tree every 250 ms only: sampling every 20 ms
  costs ~10 % of this 2-core machine, which a 2-worker import loses and a 1-worker one takes
  from its idle core, so it lowered the measured speed-up.
* ``pN`` (``--workers 1,2,p1,p2``): this machine's ceiling for the same work, without Dask:
  N processes forked from the subprocess once it has imported xpuprof, each importing the next
  file from a shared counter with ``ingest.import_file`` (what a Dask task runs), into a scratch
  folder (no manifest, no commit). ``p2`` vs ``p1`` is what two cores give this work here,
  before any scheduler: on the 2-vCPU VM each file costs 7-9 % more CPU while the other core
  works (shared cache and memory; benchmarks/RESULTS.md), so 2 workers cannot reach 2x.
* ``peak total``: the maximum over time of the RSS summed over the subprocess and all its
  descendants, sampled every ~20 ms with psutil in the memory run (pages shared after fork counted
  once per process). ``peak per worker``: the largest peak RSS of one process that imports files:
  the subprocess itself or a Dask worker process (the subprocess counts for W >= 2 as well: with
  ingest's LocalCluster one of the W workers runs inside it — ``client.run(os.getpid)`` returns
  its pid for one worker and only W - 1 worker processes are forked); ``peak main``: the
  subprocess's.
* ``CPU (tree)``: CPU seconds (user + system) of the subprocess and its descendants, from the
  same samples (each process's last sample): less disturbed by other processes than wall time,
  so the better measure of linearity on a shared machine.
* ``events``: events read from the files (``ImportReport.events_read``) — equals the count the
  generator wrote, checked.
* ``per rank``: wall / N; ``linearity``: (wall/N at the largest N) / (wall/N at the smallest):
  1.0 is linear; the same of CPU seconds. ``speedup``: wall(1 worker) / wall(2 workers).
* Analysis phases (:data:`PHASES`, run in order in one subprocess on the 2-worker store, per
  N and per ``--analysis-workers`` count: one run that measures memory, then
  ``--analysis-runs`` timed ones sampled every 250 ms, worker counts alternating, as the
  imports; ``s`` a phase's seconds, the median of the timed runs; ``rss`` the subprocess's
  peak RSS so far): ``collectives`` runs
  ``xpuprof.analysis.comm.collectives(align='end')`` and judges its ``clock`` table against the
  injected offsets (``err`` = recovered offset − (injected offset − the reference rank's);
  ``err_src``: the same after adding the source ranks' own clock difference, the median end
  difference of the recorded collectives to the reference's source rank, since the 8 real ranks
  agree only to ~1-2 µs), its ``stragglers`` table (is its first row, the participant most often
  last, the injected rank?) and its ``skew`` table (the matched collective whose skew exceeds
  the median skew of the same collective in the other steps most: is its last participant the
  injected rank and its step the injected step?). ``rank_steps`` runs the ``ranks`` tool's
  analysis (its per-rank critical paths on Dask from 32 ranks up) and reads its ``slowest``
  table at the injected step (holder = injected rank? the source job's own late rank, a copy of
  real rank 7, usually holds every step) and its one-off straggler (facts ``outlier_rank``,
  ``outlier_step``: the rank that held the others back more than it usually does): the injected
  rank and step? ``overview`` runs the overview (one Dask task per rank from 32 ranks up: each
  rank's breakdown, diagnosis, roofline share and top sums) and checks every rank has its
  summary row. Add a phase by adding a function to :data:`PHASES`.

Each measurement waits (up to ``--wait-idle`` s) for the machine to be idle and reports the
CPU time other processes used meanwhile (the machine is shared: a busy neighbour halves a
2-core result), and the load average.

Usage (from the repository root, project venv active):
    python benchmarks/bench_scale.py                     # 64, 128, 512 ranks; 1 and 2 workers
    python benchmarks/bench_scale.py --ranks 64,128 --runs 3
    python benchmarks/bench_scale.py --quick             # 16 and 32 ranks, 3 steps
    python benchmarks/bench_scale.py --json              # one JSON document on stdout
    python benchmarks/bench_scale.py --merge a.json b.json   # one report from several runs
Progress goes to stderr; the Markdown (or JSON) to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import bench_import as bi  # noqa: E402  (sibling script: process measurement)
import gen_ranks  # noqa: E402  (sibling script, not a package)
from bench_import import machine, wait_idle  # noqa: E402

# ------------------------------------------------------------------------ analysis phases


def _clock_check(res: Any, truth: dict[str, Any]) -> dict[str, Any]:
    """The comm tool's clock table against the injected offsets (module docstring)."""
    import numpy as np

    clock = res.tables.get("clock")
    if clock is None or clock.empty:
        return {"error": "no clock table"}
    coll = res.tables["collectives"]
    rank_of = coll.drop_duplicates("participant").set_index("participant")["rank"]
    off = truth["offset_ns"]
    ranks = [int(rank_of[p]) for p in clock["participant"]]
    ref = int(rank_of[clock["reference"].iloc[0]])
    ends = np.array(truth["source_collective_ends_ns"], dtype=np.int64)  # [collective][source]
    n_src = ends.shape[1]
    src_skew = np.median(ends - ends[:, [ref % n_src]], axis=0)  # per source, vs ref's source
    est = clock["offset_ns"].to_numpy(np.float64)
    want = np.array([off[r] - off[ref] for r in ranks], dtype=np.float64)
    err = est - want
    err_src = err - np.array([src_skew[r % n_src] for r in ranks])
    out = {
        "ranks": len(ranks),
        "reference": ref,
        "aligned": int((clock["offset_ns"].notna()).sum()),
        "max_abs_err_us": float(np.max(np.abs(err))) / 1e3,
        "median_abs_err_us": float(np.median(np.abs(err))) / 1e3,
        "max_abs_err_src_us": float(np.max(np.abs(err_src))) / 1e3,
        "within_5us": bool(np.max(np.abs(err)) <= 5000),
    }
    if "residual_ns" in clock:
        out["max_residual_us"] = float(clock["residual_ns"].max()) / 1e3
    if "status" in clock:
        out["status"] = {str(k): int(v) for k, v in clock["status"].value_counts().items()}
    return out


def _straggler_check(res: Any, truth: dict[str, Any]) -> dict[str, Any]:
    """The stragglers and skew tables against the injected straggler (module docstring)."""
    sg = truth["straggler"]
    R, K = sg["rank"], sg["step_index"]
    out: dict[str, Any] = {"injected_rank": R, "injected_step": sg["profiler_step"]}
    coll = res.tables["collectives"]
    rank_of = coll.drop_duplicates("participant").set_index("participant")["rank"]
    st = res.tables.get("stragglers")
    if st is not None and len(st):
        top = st.iloc[0]
        out["stragglers_top_rank"] = int(top["rank"])
        out["stragglers_top_times_last"] = int(top["times_last"])
        row = st[st["rank"] == R]
        out["injected_rank_row"] = int(row.index[0]) if len(row) else None
        out["stragglers_top_is_injected"] = int(top["rank"]) == R
    sk = res.tables.get("skew")
    if sk is not None and len(sk):
        cps = truth["collectives_per_step"]
        sk = sk.assign(pos=sk["seq"] % cps, step=sk["seq"] // cps)
        base = sk.groupby("pos")["skew_ns"].transform("median")
        sk = sk.assign(excess=sk["skew_ns"] - base)
        worst = sk.loc[sk["excess"].idxmax()]
        found_rank = int(rank_of[worst["last_participant"]])
        found_step = int(worst["step"])
        out.update(
            skew_worst_rank=found_rank,
            skew_worst_step=found_step + truth["first_step_number"],
            skew_worst_excess_us=float(worst["excess"]) / 1e3,
            skew_identifies=found_rank == R and found_step == K,
        )
    return out


def phase_collectives(trace: Any, truth: dict[str, Any]) -> dict[str, Any]:
    """``comm.collectives(align='end')``: clock recovery and straggler identification."""
    from xpuprof.analysis.comm import collectives

    res = collectives(trace, align="end")
    return {
        "collectives": int(len(res.tables.get("collectives", ()))),
        "matched": int(len(res.tables.get("skew", ()))),
        "clock": _clock_check(res, truth),
        "straggler": _straggler_check(res, truth),
        "notes": [n[:200] for n in res.notes],
    }


def phase_rank_steps(trace: Any, truth: dict[str, Any]) -> dict[str, Any]:
    """``analysis.ranks.rank_steps``: the holder of the injected step."""
    try:
        from xpuprof.analysis.ranks import rank_steps
    except ImportError as e:
        return {"skipped": f"not available: {e}"}
    res = rank_steps(trace)
    slow = res.tables.get("slowest")
    if slow is None or slow.empty:
        return {"skipped": "no slowest table", "notes": res.notes[:3]}
    sg = truth["straggler"]
    steps = sorted(slow["step"].tolist())
    # the step column may hold the ProfilerStep number or an index: match by position
    at = slow.sort_values("step").iloc[sg["step_index"]] if len(steps) == truth["steps"] else None
    import pandas as pd

    out = {
        "steps": len(slow),
        "holders": {
            str(s): (None if pd.isna(h) else int(h))
            for s, h in zip(slow["step"], slow["holder"], strict=True)
        },  # fmt: skip
    }
    if at is not None:
        out.update(
            injected_step_holder=int(at["holder"]),
            injected_step_basis=str(at["basis"]),
            identifies=int(at["holder"]) == sg["rank"],
        )
    # the tool's own answer for a one-off straggler (its ``outliers`` table: a rank holding the
    # others back more than it usually does), against the injected rank and step
    if "outlier_rank" in res.facts:
        out.update(
            outlier_rank=res.facts["outlier_rank"],
            outlier_step=res.facts["outlier_step"],
            outlier_excess_us=res.facts["outlier_excess_ns"] / 1e3,
            outlier_identifies=res.facts["outlier_rank"] == sg["rank"]
            and res.facts["outlier_step"] == sg["profiler_step"],
        )
    else:
        out.update(outlier_rank=None, outlier_identifies=False)
    return out


def phase_overview(trace: Any, truth: dict[str, Any]) -> dict[str, Any]:
    """``analysis.overview``: from 32 ranks up one Dask task per rank; its headline and the
    rank it names, and whether every rank has a summary row."""
    from xpuprof.analysis.overview import overview

    res = overview(trace)
    summary = res.tables.get("summary")
    return {
        "ranks": int(res.facts.get("ranks", 0)),
        "all_ranks": summary is not None and len(summary) == truth["world_size"],
        "bottleneck": res.facts.get("bottleneck"),
        "headline": str(res.facts.get("headline", ""))[:300],
    }


#: Analysis phases run on each set, in order: name -> function(trace, truth) -> metrics.
PHASES: dict[str, Callable[[Any, dict[str, Any]], dict[str, Any]]] = {
    "collectives": phase_collectives,
    "rank_steps": phase_rank_steps,
    "overview": phase_overview,
}


# ------------------------------------------------------------------------------ children


def child_import(store: str, workers: str, files_dir: str) -> int:
    """Import every rank file of ``files_dir``; print one JSON line."""
    import xpuprof

    files = sorted(Path(files_dir).glob("rank*.pt.trace.json"))
    if workers.startswith("p"):
        return _plain(files, Path(store), int(workers[1:]))
    t0 = time.perf_counter()
    if workers.startswith("d"):  # N Dask workers on a cluster made here (no fork server)
        from dask.distributed import LocalCluster

        with LocalCluster(n_workers=int(workers[1:]), threads_per_worker=1, processes=True,
                          dashboard_address=None) as cl:  # fmt: skip
            rep = xpuprof.import_traces(files, store, scheduler=cl.scheduler_address)
    else:
        rep = xpuprof.import_traces(files, store, workers=int(workers))
    wall = time.perf_counter() - t0
    print("SCALE_RESULT " + json.dumps({
        "import_s": rep.seconds, "in_process_s": wall, "events_read": rep.events_read,
        "rows": rep.rows, "workers": rep.workers, "sources": len(rep.sources),
    }))  # fmt: skip
    return 0


def _plain(files: list[Path], out: Path, n: int) -> int:
    """The machine's ceiling for the same work: ``n`` processes forked from this one (modules
    imported once, before), each taking the next file from a shared counter and importing it
    with ``ingest.import_file`` (read, normalise, write its part) — no Dask, no manifest or
    commit; print one JSON line like :func:`child_import`."""
    import multiprocessing
    import traceback

    from xpuprof.trace.ingest import import_file

    out.mkdir(parents=True)
    nxt = multiprocessing.get_context("fork").Value("i", 0)
    t0 = time.perf_counter()
    pids = []
    for k in range(n):
        pid = os.fork()
        if pid == 0:  # a child: files until none is left, then its count of events
            code, events = 0, 0
            try:
                while True:
                    with nxt.get_lock():
                        i = nxt.value
                        nxt.value += 1
                    if i >= len(files):
                        break
                    events += import_file(str(files[i]), i, str(out), False)["read"]["total"]
                (out / f"events-{k}.json").write_text(json.dumps(events))
            except BaseException:
                traceback.print_exc()
                code = 1
            os._exit(code)
        pids.append(pid)
    failed = [p for p in pids if os.waitpid(p, 0)[1] != 0]
    wall = time.perf_counter() - t0
    if failed:
        return 1
    events = sum(json.loads((out / f"events-{k}.json").read_text()) for k in range(n))
    print("SCALE_RESULT " + json.dumps({
        "import_s": wall, "in_process_s": wall, "events_read": events, "rows": {},
        "workers": n, "sources": len(files),
    }))  # fmt: skip
    return 0


def child_analyse(store: str, truth_path: str, phases: list[str], workers: int | None) -> int:
    """Open ``store``, run the named phases (their per-rank work on ``workers``: 1 in this
    process; None: the analyses' default); print one JSON line."""
    import xpuprof
    from xpuprof.analysis.per_rank import cluster_options

    truth = json.loads(Path(truth_path).read_text())
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    trace = xpuprof.load(store)
    out["load"] = {"s": time.perf_counter() - t0, "rss": _maxrss()}
    for name in phases:
        t0 = time.perf_counter()
        try:
            with cluster_options(workers):
                metrics = PHASES[name](trace, truth)
        except Exception as e:  # a phase that fails is reported, the others still run
            metrics = {"error": f"{type(e).__name__}: {e}"[:500]}
        out[name] = {"s": time.perf_counter() - t0, "rss": _maxrss(), **metrics}
        print(f"  phase {name}: {out[name]['s']:.1f} s", file=sys.stderr, flush=True)
    trace.close()
    print("SCALE_RESULT " + json.dumps(out, default=str))
    return 0


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# --------------------------------------------------------------------------- measurement


#: psutil's sampling interval in the run that measures memory, and in the runs that time
MEMORY_SAMPLE_S = 0.02
TIMING_SAMPLE_S = 0.25


def measure(cmd: list[str], *, timeout: float, interval: float = MEMORY_SAMPLE_S) -> dict[str, Any]:
    """Run ``cmd`` (``bench_import.measure``: wall time, the tree's peak RSS and CPU, the rest
    of the machine's CPU meanwhile), and tell its processes apart: the main one, the fork
    server, the resource tracker and the workers, each with its peak RSS."""
    load0 = os.getloadavg()
    r = bi.measure(
        cmd, timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"), interval=interval
    )
    per = r["procs"]
    main = per.get(r["pid"], {"peak": 0})["peak"]
    for pid, q in per.items():
        q["role"] = ("main" if pid == r["pid"]
                     else "forkserver" if q["ppid"] == r["pid"] and "forkserver" in q["cmd"]
                     else "tracker" if "resource_tracker" in q["cmd"] else "worker")  # fmt: skip
    workers = [q["peak"] for q in per.values() if q["role"] == "worker"]
    result = None
    for line in r["output"].splitlines():
        if line.startswith("SCALE_RESULT "):
            result = json.loads(line[len("SCALE_RESULT ") :])
    return {"wall_s": r["wall_s"], "rc": r["rc"], "peak_tree": r["peak_rss"], "peak_main": main,
            "peak_worker_procs": sorted(workers, reverse=True), "max_procs": r["max_procs"],
            "procs": [{k: q[k] for k in ("role", "peak", "cpu", "cmd") if k in q}
                      for q in per.values()],
            "cpu_s": r["cpu_s"], "cpu_s_sampled": sum(q.get("cpu", 0.0) for q in per.values()),
            "other_cpu_s": r["other_cpu_s"], "load_before": load0,
            "load_after": os.getloadavg(), "result": result, "output": r["output"]}  # fmt: skip


def other_share(r: dict[str, Any]) -> float:
    return r["other_cpu_s"] / (r["wall_s"] * (os.cpu_count() or 1))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gb(n: float | None) -> str:
    return "—" if n is None else f"{n / 1e9:.2f} GB"


def _self(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


# ---------------------------------------------------------------------------------- main


def run_set(n: int, a: argparse.Namespace, stores: Path) -> dict[str, Any]:
    """Generate (or reuse) the set of ``n`` ranks, import it per worker count, analyse it."""
    t0 = time.perf_counter()
    folder, man, made = gen_ranks.ensure(a.data, n, steps=a.steps, seed=a.seed, traces=a.traces,
                                         delay_ns=gen_ranks.delay_range(a.delay_ms),
                                         log=log if a.verbose else None)  # fmt: skip
    gen_s = time.perf_counter() - t0
    log(f"{n} ranks: {man['total_events']:,} events, {man['total_bytes'] / 1e9:.2f} GB"
        + (f", generated in {gen_s:.1f} s" if made else " (cached)"))  # fmt: skip
    for f in man["files"]:  # read once, so no run pays for the first read from disk
        with open(f["path"], "rb") as fh:
            while fh.read(1 << 24):
                pass
    out: dict[str, Any] = {
        "ranks": n, "events": man["total_events"], "bytes": man["total_bytes"],
        "steps": man["params"]["steps"], "generated_now": made,
        "generate_s": man["seconds"] if made else None,
        "generate_processes": man.get("processes"), "imports": {},
    }  # fmt: skip
    keep: Path | None = None
    runs: dict[str, list[dict[str, Any]]] = {str(w): [] for w in a.workers}
    # round 0 measures memory (psutil every 20 ms, which costs CPU: ~10 % of this machine,
    # taken from the import when both cores are busy with 2 workers, from the idle core with
    # 1), the --runs rounds after it time the import (sampled every 250 ms); worker counts
    # alternate within a round, so a drift of the machine's speed hits each alike
    for i in range(a.runs + 1):
        for w in a.workers:
            store = stores / f"scale-{n}r-w{w}-{i}-{os.getpid()}"
            shutil.rmtree(store, ignore_errors=True)
            if a.wait_idle:
                wait_idle(a.wait_idle)
            what = "memory" if i == 0 else f"timing {i}/{a.runs}"
            log(f"  [{n} ranks, workers {w}, {what}] import ...")
            r = measure(_self("--child", "import", "--store", str(store), "--workers", str(w),
                              str(folder)), timeout=a.timeout,
                        interval=MEMORY_SAMPLE_S if i == 0 else TIMING_SAMPLE_S)  # fmt: skip
            if r["rc"] != 0 or r["result"] is None:
                log(r["output"][-3000:])
                raise SystemExit(f"error: import of {n} ranks with {w} workers failed "
                                 f"(exit code {r['rc']})")  # fmt: skip
            res = r["result"]
            if res["events_read"] != man["total_events"]:
                raise SystemExit(f"error: {res['events_read']:,} events read, "
                                 f"{man['total_events']:,} written")  # fmt: skip
            # W >= 2: the subprocess counts too, as it hosts one of the Dask workers (below)
            per_worker = max([r["peak_main"], *r["peak_worker_procs"]])
            log(f"    {r['wall_s']:.1f} s (import {res['import_s']:.1f} s), peak total "
                f"{gb(r['peak_tree'])}, per worker {gb(per_worker)}, others' CPU "
                f"{other_share(r):.0%}, load {r['load_before'][0]:.2f}")  # fmt: skip
            runs[str(w)].append(
                {k: v for k, v in r.items() if k != "output"}
                | {"peak_per_worker": per_worker, "memory_run": i == 0}
            )
            if str(w).startswith("p"):  # parts and no manifest: not a store to analyse
                shutil.rmtree(store, ignore_errors=True)
            elif keep is None or str(w) != "1":
                if keep is not None and keep != store:
                    shutil.rmtree(keep, ignore_errors=True)
                keep = store
            else:
                shutil.rmtree(store, ignore_errors=True)
    for w, rs in runs.items():
        mem = [r for r in rs if r["memory_run"]]
        timed = [r for r in rs if not r["memory_run"]] or mem
        walls = [r["wall_s"] for r in timed]
        out["imports"][w] = {
            "runs": rs, "wall_s_median": statistics.median(walls),
            "wall_s_all": [round(x, 2) for x in walls],
            "import_s_median": statistics.median(r["result"]["import_s"] for r in timed),
            "cpu_s_median": statistics.median(r["cpu_s_sampled"] for r in timed),
            "peak_tree_median": int(statistics.median(r["peak_tree"] for r in mem)),
            "peak_per_worker_max": max(r["peak_per_worker"] for r in rs),
            "peak_main_max": max(r["peak_main"] for r in rs),
            "others_share_max": max(other_share(r) for r in timed),
            "rows": rs[-1]["result"]["rows"], "events_read": rs[-1]["result"]["events_read"],
        }  # fmt: skip
    if a.phases and keep is not None:
        out["analyses_by_workers"] = analyse_set(n, a, keep, folder / "truth.json")
        out["analyses"] = next(iter(out["analyses_by_workers"].values()))  # its answers judged
    if keep is not None and not a.keep_stores:
        shutil.rmtree(keep, ignore_errors=True)
    return out


def analyse_set(n: int, a: argparse.Namespace, store: Path, truth: Path) -> dict[str, Any]:
    """The analysis phases on ``store`` per worker count: one run that measures memory
    (sampled every 20 ms), then ``--analysis-runs`` timed ones (every 250 ms), worker counts
    alternating within each round as the imports do — the 20 ms sampler costs ~10 % of this
    machine, which a 2-worker run loses from its busy cores and a 1-worker run takes from its
    idle one. Per worker count: the memory run's answers and peaks, each phase's ``s`` and the
    ``wall_s`` as medians of the timed runs (the memory run's when there are none)."""
    counts = a.analysis_workers or [None]
    runs: dict[str, list[dict[str, Any]]] = {str(w or "default"): [] for w in counts}
    for i in range(a.analysis_runs + 1):
        for w in counts:
            if a.wait_idle:
                wait_idle(a.wait_idle)
            what = "memory" if i == 0 else f"timing {i}/{a.analysis_runs}"
            log(f"  [{n} ranks] analyses: {', '.join(a.phases)}"
                + (f", {w} worker(s)" if w else "") + f", {what} ...")  # fmt: skip
            r = measure(_self("--child", "analyse", "--store", str(store), "--truth", str(truth),
                              "--phases", ",".join(a.phases),
                              *(("--analysis-workers", str(w)) if w else ())),
                        timeout=a.timeout,
                        interval=MEMORY_SAMPLE_S if i == 0 else TIMING_SAMPLE_S)  # fmt: skip
            if r["rc"] != 0 or r["result"] is None:
                log(r["output"][-3000:])
                got = {"error": f"exit code {r['rc']}", "wall_s": r["wall_s"]}
            else:
                got = {"wall_s": r["wall_s"], "peak_tree": r["peak_tree"],
                       "peak_main": r["peak_main"], "peak_worker_procs": r["peak_worker_procs"],
                       "others_share": other_share(r), **r["result"]}  # fmt: skip
                log(f"    {r['wall_s']:.1f} s, peak {gb(r['peak_tree'])}, others' CPU "
                    f"{other_share(r):.0%}")  # fmt: skip
            runs[str(w or "default")].append(got)
    return {w: _analysis_medians(rs) for w, rs in runs.items()}


def _analysis_medians(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One worker count's analysis runs as one entry (:func:`analyse_set`)."""
    first = rs[0]
    if "error" in first:
        return first
    timed = [r for r in rs[1:] if "error" not in r] or [first]
    out = dict(first)
    out["wall_s"] = statistics.median(r["wall_s"] for r in timed)
    out["wall_s_all"] = [round(r["wall_s"], 2) for r in timed]
    out["timed_runs"] = len(rs) - 1
    out["others_share"] = max(r["others_share"] for r in timed)
    for name in PHASES:
        secs = [r[name]["s"] for r in timed if isinstance(r.get(name), dict) and "s" in r[name]]
        if name in out and secs:
            out[name] = {**out[name], "s": statistics.median(secs),
                         "s_all": [round(x, 2) for x in secs]}  # fmt: skip
    return out


def ratios(sets: list[dict[str, Any]]) -> dict[str, Any]:
    """Speed-up of 2 workers over 1 per N, time per rank and linearity per worker count."""
    out: dict[str, Any] = {"speedup_2_vs_1": {}, "ceiling_2_vs_1": {}, "per_rank_s": {},
                           "linearity": {}}  # fmt: skip
    for s in sets:
        imp = s["imports"]
        for key, one, two in (("speedup_2_vs_1", "1", "2"), ("ceiling_2_vs_1", "p1", "p2")):
            if one in imp and two in imp:
                out[key][s["ranks"]] = imp[one]["wall_s_median"] / imp[two]["wall_s_median"]
    ws = sorted({w for s in sets for w in s["imports"]})
    for w in ws:
        per = {s["ranks"]: s["imports"][w]["wall_s_median"] / s["ranks"] for s in sets
               if w in s["imports"]}  # fmt: skip
        out["per_rank_s"][w] = per
        cpu = {s["ranks"]: s["imports"][w]["cpu_s_median"] / s["ranks"] for s in sets
               if w in s["imports"] and "cpu_s_median" in s["imports"][w]}  # fmt: skip
        out.setdefault("per_rank_cpu_s", {})[w] = cpu
        if len(per) > 1:
            lo, hi = min(per), max(per)
            out["linearity"][w] = per[hi] / per[lo]
        if len(cpu) > 1:
            out.setdefault("linearity_cpu", {})[w] = cpu[max(cpu)] / cpu[min(cpu)]
    return out


def render(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [
        f"### Many ranks (issue 14) — {m['date']}",
        "",
        f"Machine: {m['cpu']}, {m['cores_logical']} logical cores, "
        f"{m['ram_bytes'] / 2**30:.1f} GiB RAM, Python {m['python']}; load average at start "
        f"{res['load_start']}, shared with other agents. Command: `{res['command']}`. "
        f"Runs per configuration: one for memory (sampled every 20 ms), then {res['runs']} "
        "timed (sampled every 250 ms; median), worker counts alternating.",
        "",
        "| ranks | events | JSON | generate | workers | wall (median) | import | CPU (tree) "
        "| peak total | peak per worker | per rank | others' CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in res["sets"]:
        for w, imp in s["imports"].items():
            gen = f"{s['generate_s']:.0f} s" if s["generate_s"] else "cached"
            lines.append(
                f"| {s['ranks']} | {s['events']:,} | {s['bytes'] / 1e9:.2f} GB | {gen} | {w} | "
                f"{imp['wall_s_median']:.1f} s | {imp['import_s_median']:.1f} s | "
                f"{_cpu(imp)} | "
                f"{gb(imp['peak_tree_median'])} | {gb(imp['peak_per_worker_max'])} | "
                f"{1000 * imp['wall_s_median'] / s['ranks']:.0f} ms | "
                f"{imp['others_share_max']:.0%} |")  # fmt: skip
    r = res["ratios"]
    head = len(lines)
    lines += ["", "| ratio | value | target |", "|---|---|---|"]
    for n, v in r["speedup_2_vs_1"].items():
        lines.append(f"| speed-up 2 workers vs 1, {n} ranks | {v:.2f}x | >= 1.7x |")
    for n, v in r.get("ceiling_2_vs_1", {}).items():
        lines.append(
            f"| this machine's ceiling: 2 plain processes vs 1 (p2, p1: no Dask, no "
            f"commit), {n} ranks | {v:.2f}x | (what 2 cores give this work here) |"
        )
    for w, v in r["linearity"].items():
        per = ", ".join(f"{n}: {1000 * t:.0f} ms" for n, t in r["per_rank_s"][w].items())
        lines.append(f"| wall per rank, {w} worker(s) ({per}): largest N / smallest N | {v:.2f} "
                     "| ~1.0 (linear) |")  # fmt: skip
    for w, v in r.get("linearity_cpu", {}).items():
        per = ", ".join(f"{n}: {1000 * t:.0f} ms" for n, t in r["per_rank_cpu_s"][w].items())
        lines.append(f"| CPU per rank, {w} worker(s) ({per}): largest N / smallest N | {v:.2f} "
                     "| ~1.0 (linear) |")  # fmt: skip
    if len(lines) == head + 3:  # one worker count and one set: no ratio to print
        del lines[head:]
    if not any(s.get("analyses") for s in res["sets"]):
        return "\n".join(lines)
    lines += ["", "| ranks | phase | s | peak RSS | result |", "|---|---|---|---|---|"]
    for s in res["sets"]:
        an = s.get("analyses") or {}
        if "error" in an and len(an) <= 2:
            lines.append(f"| {s['ranks']} | analyses | | | failed: {an['error']} |")
            continue
        for name in ["load", *[p for p in PHASES if p in an]]:
            ph = an.get(name) or {}
            lines.append(f"| {s['ranks']} | {name} | {ph.get('s', 0):.1f} | "
                         f"{gb(ph.get('rss'))} | {_verdict(name, ph)} |")  # fmt: skip
    return "\n".join(lines + _by_workers(res))


def _by_workers(res: dict[str, Any]) -> list[str]:
    """The analyses' seconds per worker count (``--analysis-workers 1,2``) and 2 vs 1."""
    sets = [s for s in res["sets"] if len(s.get("analyses_by_workers") or {}) > 1]
    if not sets:
        return []
    counts = list(sets[0]["analyses_by_workers"])
    timed = res.get("analysis_runs") or 0
    lines = [
        "",
        f"Analyses per worker count: the median of {timed} timed runs (sampled every 250 ms) "
        "after one that measures memory, worker counts alternating; all phases: the sum of "
        "their medians."
        if timed
        else "Analyses per worker count: one run each (sampled every "
        "20 ms for memory: it takes CPU from a 2-worker run's busy cores).",
        "",
        "| ranks | phase | "
        + " | ".join(f"{w} worker(s)" for w in counts)
        + (" | 2 vs 1 |" if {"1", "2"} <= set(counts) else " |"),
        "|---|---|" + "---|" * len(counts) + ("---|" if {"1", "2"} <= set(counts) else ""),
    ]
    for s in sets:
        by = s["analyses_by_workers"]
        names = [p for p in PHASES if all(p in by[w] for w in counts)]
        for name in [*names, "all phases"]:
            secs = {w: (sum(by[w][p]["s"] for p in names) if name == "all phases"
                        else by[w][name]["s"]) for w in counts}  # fmt: skip
            row = f"| {s['ranks']} | {name} | " + " | ".join(f"{secs[w]:.1f} s" for w in counts)
            if {"1", "2"} <= set(counts):
                row += f" | {secs['1'] / secs['2']:.2f}x" if secs["2"] else " | —"
            lines.append(row + " |")
        peaks = ", ".join(f"{w}: {gb(_largest(by[w]))}" for w in counts if "error" not in by[w])
        lines.append(f"| {s['ranks']} | largest process (peak RSS) | {peaks} |"
                     + " |" * (len(counts) - 1 + ({"1", "2"} <= set(counts))))  # fmt: skip
    return lines


def _largest(an: dict[str, Any]) -> int:
    """The peak RSS of the analyses' largest process (the calling one, or a worker)."""
    return max([an.get("peak_main") or 0, *(an.get("peak_worker_procs") or [])])


def _cpu(imp: dict[str, Any]) -> str:
    return f"{imp['cpu_s_median']:.0f} s" if "cpu_s_median" in imp else "—"


def _verdict(name: str, ph: dict[str, Any]) -> str:
    if "error" in ph:
        return f"error: {ph['error'][:150]}"
    if "skipped" in ph:
        return f"skipped: {ph['skipped']}"
    if name == "collectives":
        c, s = ph["clock"], ph["straggler"]
        if "error" in c:
            return c["error"]
        txt = (f"{ph['collectives']:,} kernels, {ph['matched']:,} matched; clock: max abs err "
               f"{c['max_abs_err_us']:.2f} µs (net of the sources' own skew "
               f"{c['max_abs_err_src_us']:.2f} µs), within 5 µs: "
               f"{'yes' if c['within_5us'] else 'NO'}")  # fmt: skip
        txt += (f"; stragglers table first: rank {s.get('stragglers_top_rank')} (injected "
                f"{s['injected_rank']}: {'yes' if s.get('stragglers_top_is_injected') else 'no'})"
                f"; worst excess skew: rank {s.get('skew_worst_rank')} step "
                f"{s.get('skew_worst_step')} (injected step {s['injected_step']}: "
                f"{'yes' if s.get('skew_identifies') else 'no'})")  # fmt: skip
        return txt
    if name == "rank_steps":
        if "identifies" not in ph:
            return f"{ph.get('steps')} steps"
        txt = (
            f"holder of the injected step: rank {ph['injected_step_holder']} "
            f"({ph['injected_step_basis']}): {'yes' if ph['identifies'] else 'no'}"
        )
        if "outlier_identifies" in ph:
            txt += (f"; the tool's one-off straggler: rank {ph['outlier_rank']} step "
                    f"{ph.get('outlier_step')} ({ph.get('outlier_excess_us', 0):.0f} µs more "
                    f"than usual): {'yes' if ph['outlier_identifies'] else 'no'}")  # fmt: skip
        return txt
    if name == "overview":
        every = "every rank summarised" if ph.get("all_ranks") else "NOT every rank summarised"
        return f"{ph.get('ranks')} ranks, {every}; bottleneck {ph.get('bottleneck')}"
    return ""


def merge(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from several ``--json`` runs (e.g. 512 ranks run apart): sets of the same
    size are joined (their worker counts and analyses), the ratios recomputed."""
    out = dict(docs[0])
    by_n: dict[int, dict[str, Any]] = {}
    for d in docs:
        for s in d["sets"]:
            cur = by_n.setdefault(s["ranks"], {**s, "imports": {}})
            cur["imports"].update(s["imports"])
            if s.get("analyses") and not cur.get("analyses"):
                cur["analyses"] = s["analyses"]
            if s.get("generate_s") and not cur.get("generate_s"):
                cur["generate_s"] = s["generate_s"]
    out["sets"] = [by_n[n] for n in sorted(by_n)]
    out["command"] = "; ".join(d["command"] for d in docs)
    out["load_start"] = "; ".join(d["load_start"] for d in docs)
    out["ratios"] = ratios(out["sets"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default=None, help="comma-separated set sizes (64,128,512)")
    ap.add_argument("--workers", default="1,2",
                    help="comma-separated worker counts (1: in-process; dN: N Dask workers on "
                    "a LocalCluster made by the benchmark; pN: the machine's ceiling, N plain "
                    "forked processes importing the files with no Dask and no commit)")  # fmt: skip
    ap.add_argument(
        "--runs",
        type=int,
        default=1,
        help="timed imports per configuration (median), after one that measures memory",
    )
    ap.add_argument(
        "--analysis-runs",
        type=int,
        default=0,
        help="timed analysis runs per worker count (median), after one that measures memory "
        "(0: that one run is also the timing)",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps per rank (default: enough for 512 ranks >= 20 M events)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--delay-ms", default="2,5", help="the injected straggler's pause is drawn from LO,HI ms"
    )
    ap.add_argument("--traces", default=None, help="the real traces' folder (shared/traces)")
    ap.add_argument("--data", type=Path, default=ROOT / "bench-data")
    ap.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"analysis phases to run ({', '.join(PHASES)}; '' for none)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="16 and 32 ranks (unless --ranks), 3 steps, 1 run"
    )
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per subprocess")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=60,
        metavar="S",
        help="before each import wait up to S s for an idle machine (0: never)",
    )
    ap.add_argument("--analysis-workers", default="",
                    help="comma-separated worker counts for the analysis phases, each run "
                    "apart (e.g. 1,2: the ratio 2 vs 1 is printed); default: the analyses' own "
                    "default (one per core from 32 ranks)")  # fmt: skip
    ap.add_argument("--keep-stores", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--child", choices=["import", "analyse"], help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--truth", help=argparse.SUPPRESS)
    ap.add_argument("folder", nargs="?", help=argparse.SUPPRESS)
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="render one report from earlier --json outputs (runs nothing)",
    )
    a = ap.parse_args(argv)
    if a.merge:
        res = merge([json.loads(p.read_text()) for p in a.merge])
        print(json.dumps(res, indent=1, default=str) if a.json else render(res))
        return 0
    if a.child == "import":
        return child_import(a.store, a.workers, a.folder)
    if a.child == "analyse":
        w = int(a.analysis_workers) if a.analysis_workers else None
        return child_analyse(a.store, a.truth, [p for p in a.phases.split(",") if p], w)

    default_ranks = "16,32" if a.quick else "64,128,512"
    a.ranks = [int(x) for x in (a.ranks or default_ranks).split(",") if x]
    a.workers = [x.strip() for x in a.workers.split(",") if x.strip()]
    a.phases = [p for p in a.phases.split(",") if p]
    a.analysis_workers = [int(x) for x in a.analysis_workers.split(",") if x.strip()]
    unknown = [p for p in a.phases if p not in PHASES]
    if unknown:
        ap.error(f"unknown phase(s) {', '.join(unknown)}; known: {', '.join(PHASES)}")
    if a.quick:
        a.steps, a.runs = a.steps or 3, 1
    try:
        gen_ranks.load_sources(a.traces)
    except (FileNotFoundError, ValueError) as e:
        log(f"error: {e}")
        return 2
    a.data.mkdir(parents=True, exist_ok=True)
    stores = a.data / "stores"
    stores.mkdir(exist_ok=True)
    res: dict[str, Any] = {
        "machine": machine(), "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "command": "python benchmarks/bench_scale.py " + " ".join(argv or sys.argv[1:]),
        "runs": a.runs, "analysis_runs": a.analysis_runs, "workers": a.workers,
        "phases": a.phases,
    }  # fmt: skip
    t0 = time.perf_counter()
    res["sets"] = [run_set(n, a, stores) for n in a.ranks]
    res["total_s"] = time.perf_counter() - t0
    res["ratios"] = ratios(res["sets"])
    print(json.dumps(res, indent=1, default=str) if a.json else render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

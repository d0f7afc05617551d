"""The trace viewer's window query on a large store (issue 10): ``xpuprof.view.window`` against
a naive DuckDB query over the store's events Parquet for the same window.

The store is generated here, written directly in the normalized schema with pyarrow in the
store layout (``docs/schema.md``, ``docs/store.md``), so that 10 M events take seconds, not the
minutes an import of JSON would: several ranks, each with a host thread of nested spans
(ProfilerStep → layer → op → op → cudaLaunchKernel), a data-loader thread, device streams with
many short kernels launched through ``ac2g`` links, and a memory counter. Then the zoom tiers are
built (time and size on disk reported) and random windows are asked at every zoom, from the
whole trace down to microseconds, at widths of 1,500–8,000 px::

    python benchmarks/bench_view.py                 # 10 M events
    python benchmarks/bench_view.py --events 1000000 --queries 100

Targets (issue 10): median < 100 ms, p99 < 300 ms, < 50,000 items per window, RSS < 1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa

from xpuprof.core.names import ID_SHIFT
from xpuprof.core.schema import SCHEMAS
from xpuprof.trace import store as st

US = 1_000  # ns
ROOT = Path(__file__).resolve().parents[1]

OPS = ["aten::linear", "aten::addmm", "aten::matmul", "aten::layer_norm", "aten::gelu",
       "aten::softmax", "aten::dropout", "aten::add", "aten::mul", "aten::copy_",
       "aten::native_layer_norm", "aten::scaled_dot_product_attention", "aten::view",
       "aten::transpose", "aten::cat", "aten::embedding"]  # fmt: skip
KERNELS = [f"{k}_{i}" for k in ("ampere_sgemm_128x64_nn", "void at::native::elementwise_kernel",
           "void at::native::reduce_kernel", "void cutlass::Kernel<cutlass_80_gemm>",
           "flash_fwd_kernel", "void at::native::vectorized_elementwise_kernel")
           for i in range(10)]  # fmt: skip

#: Shape of one step on the host thread: layers × ops per layer × child ops × launches.
LAYERS, OPS_PER_LAYER, CHILDREN, LAUNCHES = 25, 8, 2, 3
SLOT = 10 * US  # one launch slot on the host
PER_STEP = 1 + LAYERS * (1 + OPS_PER_LAYER * (1 + CHILDREN * (1 + 2 * LAUNCHES))) + 1


# ----------------------------------------------------------------------------------------------
# generating the store
# ----------------------------------------------------------------------------------------------


def _dict(values: list[str], codes: np.ndarray) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(values))


def _rank_events(rank: int, steps: int, rng: np.random.Generator) -> dict[str, Any]:
    """Columns of one rank's events (host spans, data loader, kernels), its links and counter.

    Length: one flat construction of five nested levels and two streams; split, it would pass
    a dozen arrays between the pieces."""
    slots_per_step = LAYERS * OPS_PER_LAYER * CHILDREN * LAUNCHES
    step_ns = slots_per_step * SLOT + 2_000 * US  # + 2 ms between steps (input)
    base = 1_700_000_000_000_000_000 + rank * 137 * US  # ranks start a little apart
    step0 = base + np.arange(steps, dtype=np.int64) * step_ns
    rows: dict[str, list[np.ndarray]] = {
        k: [] for k in ("ts", "dur", "level", "name", "depth", "tid", "device", "stream", "slot")
    }

    def add(ts, dur, level, name, depth, tid=1, device=-1, stream=-1, slot=None):
        n = len(ts)
        rows["ts"].append(np.asarray(ts, np.int64))
        rows["dur"].append(np.asarray(dur, np.int64))
        rows["level"].append(np.full(n, level, np.int8))
        rows["name"].append(
            np.asarray(name, np.int32) if np.ndim(name) else np.full(n, name, np.int32)
        )
        rows["depth"].append(np.full(n, depth, np.int32))
        rows["tid"].append(np.full(n, tid, np.int64))
        rows["device"].append(np.full(n, device, np.int32))
        rows["stream"].append(np.full(n, stream, np.int64))
        rows["slot"].append(np.full(n, -1, np.int64) if slot is None else slot)

    names = ["ProfilerStep", *[f"nn.Module: Block_{i}" for i in range(LAYERS)], *OPS,
             "cudaLaunchKernel", "DataLoader.__next__", *KERNELS]  # fmt: skip
    n_op0, n_rt = 1 + LAYERS, 1 + LAYERS + len(OPS)
    n_dl, n_k0 = n_rt + 1, n_rt + 2
    levels = ["step", "layer", "op", "runtime", "kernel", "python"]
    # steps (names ProfilerStep#N are made distinct below), layers, ops, child ops, launches
    add(step0 + 100, np.full(steps, slots_per_step * SLOT - 200), 0, 0, 0)
    per = slots_per_step // LAYERS
    lts = (step0[:, None] + np.arange(LAYERS) * per * SLOT + 200).ravel()
    add(lts, np.full(lts.size, per * SLOT - 400), 1, np.tile(np.arange(LAYERS) + 1, steps), 1)
    slots = np.arange(steps * slots_per_step, dtype=np.int64)
    slot_ts = step0[slots // slots_per_step] + (slots % slots_per_step) * SLOT
    per = CHILDREN * LAUNCHES
    ots = slot_ts[::per] + 500
    add(ots, np.full(ots.size, per * SLOT - 1_000), 2,
        n_op0 + rng.integers(0, len(OPS), ots.size), 2)  # fmt: skip
    cts = slot_ts[::LAUNCHES] + 1_000
    add(cts, np.full(cts.size, LAUNCHES * SLOT - 2_000), 2,
        n_op0 + rng.integers(0, len(OPS), cts.size), 3)  # fmt: skip
    rdur = rng.integers(3 * US, 6 * US, slots.size)
    rts = slot_ts + 2 * US
    add(rts, rdur, 3, n_rt, 4, slot=slots)
    # the data loader's thread: one call between steps
    add(step0 + slots_per_step * SLOT + 300 * US, np.full(steps, 1_200 * US), 5, n_dl, 0, tid=2)
    # kernels: two compute streams, queued (a kernel starts when launched and its stream is free)
    kdur = np.clip(rng.lognormal(np.log(5 * US), 0.9, slots.size), 800, 400 * US).astype(np.int64)
    stream = np.where((slots // 24) % 5 == 4, 13, 7)
    kname = n_k0 + rng.integers(0, len(KERNELS), slots.size)
    ready = rts + rdur + 4 * US
    kts = np.empty_like(ready)
    for s in (7, 13):
        m = np.flatnonzero(stream == s)
        before = np.concatenate([[0], np.cumsum(kdur[m])[:-1]])
        kts[m] = np.maximum.accumulate(ready[m] - before) + before
    add(kts, kdur, 4, kname, 0, tid=0, device=0, stream=stream, slot=slots)
    # no two kernels of a stream overlap; put each stream's kernels in time order
    out = {k: np.concatenate(v) for k, v in rows.items()}
    out["names"], out["levels"], out["base"], out["step0"] = names, levels, base, step0
    out["mem"] = base + np.arange(0, steps * step_ns, 1_000 * US, dtype=np.int64)
    return out


def _rank_tables(part: int, rank: int, steps: int, seed: int) -> dict[str, pa.Table]:
    """The five tables of one rank, in the store's schema (ids in time order per track)."""
    rng = np.random.default_rng(seed + rank)
    c = _rank_events(rank, steps, rng)
    n = len(c["ts"])
    # index = position in time order (a Kineto file is roughly time-ordered)
    order = np.lexsort((c["depth"], c["ts"]))
    for k in ("ts", "dur", "level", "name", "depth", "tid", "device", "stream", "slot"):
        c[k] = c[k][order]
    idx = np.arange(n, dtype=np.int64)
    ids = (np.int64(part) << ID_SHIFT) | idx
    # step numbers and names: ProfilerStep#N
    is_step = c["level"] == 0
    step_no = np.searchsorted(c["step0"], c["ts"], side="right") - 1
    names = list(c["names"])
    name = c["name"].astype(np.int64)
    step_names = [f"ProfilerStep#{i}" for i in range(len(c["step0"]))]
    name = np.where(is_step, len(names) + step_no, name)
    names += step_names
    # parents: the innermost enclosing span on the same host thread (depth - 1, started before)
    parent = np.full(n, -1, np.int64)
    host = c["device"] == -1
    for d in range(1, 5):
        kids = np.flatnonzero(host & (c["tid"] == 1) & (c["depth"] == d))
        ups = np.flatnonzero(host & (c["tid"] == 1) & (c["depth"] == d - 1))
        pos = np.searchsorted(c["ts"][ups], c["ts"][kids], side="right") - 1
        parent[kids] = ids[ups[pos]]
    # launch links: runtime call (slot j) -> kernel (slot j)
    rt = np.flatnonzero(c["level"] == 3)
    kn = np.flatnonzero(c["level"] == 4)
    rt = rt[np.argsort(c["slot"][rt])]
    kn = kn[np.argsort(c["slot"][kn])]
    corr = np.full(n, -1, np.int64)
    corr[rt] = c["slot"][rt] + 1
    corr[kn] = c["slot"][kn] + 1
    stream = c["stream"]
    pid = np.where(host, 4000 + rank, 0)
    tid = np.where(host, 4000 + rank + c["tid"], stream)
    levels = c["levels"]
    args = pa.array([None] * n, pa.large_string())
    has_corr = corr >= 0
    if has_corr.any():
        import pyarrow.compute as pc

        text = pc.binary_join_element_wise(
            '{"correlation": ', pa.array(corr).cast(pa.string()), "}", ""
        ).cast(pa.large_string())
        args = pc.if_else(pa.array(has_corr), text, args)
    cat_values = ["user_annotation", "python_function", "cpu_op", "cuda_runtime", "kernel",
                  "python_function"]  # fmt: skip
    lv = c["level"].astype(np.int32)
    ev = {
        "id": pa.array(ids),
        "part": pa.array(np.full(n, part, np.int32)),
        "index": pa.array(idx),
        "rank": pa.array(np.full(n, rank, np.int32)),
        "host": pa.nulls(n, pa.dictionary(pa.int32(), pa.string())),
        "phase": _dict(["X"], np.zeros(n, np.int32)),
        "scope": pa.nulls(n, pa.dictionary(pa.int32(), pa.string())),
        "pid": pa.array(pid.astype(np.int64)),
        "tid": pa.array(tid.astype(np.int64)),
        "device": pa.array(c["device"]),
        "stream": pa.array(np.where(host, 0, stream), mask=host),
        "level": _dict(levels, lv),
        "category": _dict(cat_values, lv),
        "name": _dict(names, name.astype(np.int32)),
        "ts": pa.array(c["ts"]),
        "dur": pa.array(c["dur"]),
        "parent": pa.array(parent, mask=parent < 0),
        "depth": pa.array(c["depth"]),
        "correlation": pa.array(corr, mask=~has_corr),
        "external_id": pa.nulls(n, pa.int64()),
        "step": pa.array(np.where(step_no >= 0, step_no, 0), mask=step_no < 0),
        "flops": pa.nulls(n, pa.float64()),
        "bytes": pa.nulls(n, pa.float64()),
        "args": args,
        "extra": pa.nulls(n, pa.large_string()),
    }
    events = pa.Table.from_arrays(list(ev.values()), schema=SCHEMAS["events"])
    m = len(rt)
    links = pa.Table.from_arrays(
        [pa.array(np.full(m, part, np.int32)), pa.array(np.full(m, rank, np.int32)),
         _dict(["ac2g"], np.zeros(m, np.int32)), pa.array(corr[rt]).cast(pa.string()),
         pa.array(ids[rt]), pa.array(ids[kn]), pa.array(idx[rt]), pa.array(idx[kn])],
        schema=SCHEMAS["links"],
    )  # fmt: skip
    k = len(c["mem"])
    mem = np.cumsum(rng.normal(0, 1 << 20, k)) + (8 << 30)
    counters = pa.Table.from_arrays(
        [pa.array(np.full(k, part, np.int32)), pa.array(np.arange(n, n + k, dtype=np.int64)),
         pa.array(np.full(k, rank, np.int32)), pa.array(np.full(k, 4000 + rank, np.int64)),
         pa.nulls(k, pa.int64()), _dict(["memory"], np.zeros(k, np.int32)),
         _dict(["[memory]"], np.zeros(k, np.int32)),
         _dict(["Total Allocated"], np.zeros(k, np.int32)), pa.array(c["mem"]),
         pa.array(mem), pa.nulls(k, pa.large_string()), pa.nulls(k, pa.large_string())],
        schema=SCHEMAS["counters"],
    )  # fmt: skip
    return {
        "events": events,
        "flows": SCHEMAS["flows"].empty_table(),
        "links": links,
        "counters": counters,
        "metadata": SCHEMAS["metadata"].empty_table(),
    }


def generate(root: Path, events: int, ranks: int, seed: int = 0) -> dict[str, Any]:
    """Write a store of about ``events`` events over ``ranks`` ranks at ``root`` (replaced)."""
    steps = max(1, round(events / ranks / PER_STEP))
    if root.exists():
        shutil.rmtree(root)
    staging = root.parent / st.temp_name(root.name)
    staging.mkdir(parents=True)
    sources = []
    for part in range(ranks):
        tables = _rank_tables(part, part, steps, seed)
        tag = st.unique_tag()
        files, rows = {}, {}
        for name, t in tables.items():
            rel = st.part_file(name, part, tag)
            st.write_table(t, staging / rel)
            files[name], rows[name] = rel, t.num_rows
        lv = tables["events"]["level"].combine_chunks().dictionary_decode()
        import pyarrow.compute as pc

        levels = {r["values"]: r["counts"] for r in pc.value_counts(lv).to_pylist()}
        sources.append({
            "path": f"generated/rank{part}.json", "part": part, "rank": part, "files": files,
            "rows": rows, "levels": levels, "read": {"total": rows["events"]}, "size": None,
            "format": "generated", "rank_from": "file name", "steps_from": "ProfilerStep",
        })  # fmt: skip
        del tables
    manifest = st.new_manifest(sources)
    st.commit_new(staging, root, manifest)
    return {"events": manifest["rows"]["events"], "steps_per_rank": steps, "ranks": ranks}


# ----------------------------------------------------------------------------------------------
# the measurement
# ----------------------------------------------------------------------------------------------


class PeakRSS:
    """Samples this process's RSS every 20 ms in a thread; ``peak`` in bytes."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        p = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, p.memory_info().rss)
            self._stop.wait(0.02)

    def __enter__(self) -> PeakRSS:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, psutil.Process().memory_info().rss)


def windows(t0: int, t1: int, n: int, seed: int) -> list[tuple[int, int, int]]:
    """``n`` random windows: spans from the whole trace down to 1 µs (log-uniform), widths
    1,500–8,000 px, placed uniformly inside the trace; the whole trace first."""
    rng = random.Random(seed)
    span = t1 - t0
    out = [(t0, t1, 1500), (t0, t1, 8000)]
    while len(out) < n:
        w = int(10 ** rng.uniform(3, np.log10(span)))
        a = t0 + rng.randrange(0, max(1, span - w))
        out.append((a, a + w, rng.randint(1500, 8000)))
    return out


def naive(con: Any, files: list[Path], ts0: int, ts1: int, width: int) -> int:
    """The peer: the same answer straight from the store's events Parquet with DuckDB — events
    at least a pixel wide as they are, the rest grouped per (track, depth, pixel) with their
    count, busy time and dominant name. Returns the number of items."""
    ns = (ts1 - ts0) / width
    src = "read_parquet([" + ", ".join(f"'{f}'" for f in files) + "])"
    q = f"""
    with w as (select id, part, pid, tid, device, stream, depth, ts, coalesce(dur, 0) as dur,
                      name, level from {src}
               where ts < {ts1} and ts + coalesce(dur, 0) >= {ts0})
    select (select count(*) from (select id, ts, dur, name, level from w where dur >= {ns})),
           (select count(*) from (
              select part, pid, tid, device, stream, depth, px, sum(n), sum(d), arg_max(name, d)
              from (select part, pid, tid, device, stream, depth,
                           floor((ts - {ts0}) / {ns}) as px, name, count(*) n, sum(dur) d
                    from w where dur < {ns} group by all)
              group by all))
    """
    a, b = con.execute(q).fetchall()[0]
    return int(a) + int(b)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def machine() -> str:
    return (f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
            f"{psutil.virtual_memory().total / 2**30:.0f} GB RAM, no GPU, "
            f"Python {platform.python_version()}")  # fmt: skip


def phase_build(store: Path) -> dict[str, Any]:
    """Build the tiers from scratch (in a fresh process: its RSS is the build's)."""
    import xpuprof
    from xpuprof import view
    from xpuprof.view import tiers

    trace = xpuprof.load(store, restricted=True)
    shutil.rmtree(store / tiers.FOLDER, ignore_errors=True)
    with PeakRSS() as rss:
        t = time.perf_counter()
        view.tracks(trace)
        took = time.perf_counter() - t
    folder = tiers.open_tiers(trace).path
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    by_kind: dict[str, int] = {}
    for f in folder.iterdir():
        k = f.name.split("_")[0].rstrip("0123456789")
        by_kind[k] = by_kind.get(k, 0) + f.stat().st_size
    return {"build_s": round(took, 1), "tiers_mb": round(size / 2**20, 1),
            "tiers_mb_by_table": {k: round(v / 2**20, 1) for k, v in sorted(by_kind.items())},
            "build_peak_rss_mb": round(rss.peak / 2**20)}  # fmt: skip


def phase_query(store: Path, queries: int, peer_queries: int, seed: int) -> dict[str, Any]:
    """Random windows on a fresh Trace (as a server that finds the tiers built): latency,
    items, RSS; then the naive peer on the first windows; then search and event once.

    Length: one measurement after the other, each a few lines."""
    import duckdb

    import xpuprof
    from xpuprof import view

    res: dict[str, Any] = {"rss_at_start_mb": round(psutil.Process().memory_info().rss / 2**20)}
    trace = xpuprof.load(store, restricted=True)
    info = view.tracks(trace)
    wins = windows(info["t0"], info["t1"], queries, seed)
    times, items, cut = [], [], 0
    with PeakRSS() as q_rss:
        for ts0, ts1, w in wins:
            t = time.perf_counter()
            r = view.window(trace, ts0, ts1, w)
            times.append((time.perf_counter() - t) * 1000)
            items.append(r["items"])
            cut += r["summary_px"] > 1
    res["query_ms"] = {"median": round(statistics.median(times), 1),
                       "p99": round(pct(times, 0.99), 1), "max": round(max(times), 1)}  # fmt: skip
    res["items_max"] = max(items)
    res["coarsened_windows"] = cut
    res["query_peak_rss_mb"] = round(q_rss.peak / 2**20)
    mem = psutil.Process().memory_full_info()
    res["rss_after_mb"] = {"rss": round(mem.rss / 2**20), "uss": round(mem.uss / 2**20),
                           "shared (mapped tier files)": round(mem.shared / 2**20)}  # fmt: skip
    by_span: dict[int, list[float]] = {}
    for (ts0, ts1, _), ms in zip(wins, times, strict=True):
        by_span.setdefault(int(np.log10(max(ts1 - ts0, 1))), []).append(ms)
    res["median_ms_by_span"] = {f"1e{k} ns": round(statistics.median(v), 1)
                                for k, v in sorted(by_span.items())}  # fmt: skip
    con = duckdb.connect(config={"memory_limit": "1GB", "threads": 2})
    files = trace.files("events")
    peer, mine = [], []
    for ts0, ts1, w in wins[:peer_queries]:
        t = time.perf_counter()
        naive(con, files, ts0, ts1, w)
        peer.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        view.window(trace, ts0, ts1, w)
        mine.append((time.perf_counter() - t) * 1000)
    res["peer"] = {
        "windows": len(peer),
        "naive_duckdb_median_ms": round(statistics.median(peer), 1),
        "view_median_ms": round(statistics.median(mine), 1),
        "ratio": round(statistics.median(peer) / max(statistics.median(mine), 1e-9), 1),
    }
    t = time.perf_counter()
    s = view.search(trace, "gemm")
    res["search_ms"] = round((time.perf_counter() - t) * 1000, 1)
    res["search_total"] = s["total"]
    if s["matches"]:
        t = time.perf_counter()
        view.event(trace, s["matches"][len(s["matches"]) // 2]["id"])
        res["event_ms"] = round((time.perf_counter() - t) * 1000, 1)
    trace.close()
    return res


def _child(phase: str, args: argparse.Namespace, store: Path) -> dict[str, Any]:
    import subprocess

    cmd = [sys.executable, __file__, "--phase", phase, "--store", str(store),
           "--queries", str(args.queries), "--peer-queries", str(args.peer_queries),
           "--seed", str(args.seed)]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--peer-queries", type=int, default=40, help="windows also run naively")
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--regenerate", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--phase", choices=["build", "query"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    store = args.store or ROOT / "bench-data" / "stores" / f"view-{args.events}-{args.ranks}.store"
    if args.phase == "build":
        print(json.dumps(phase_build(store)))
        return 0
    if args.phase == "query":
        print(json.dumps(phase_query(store, args.queries, args.peer_queries, args.seed)))
        return 0
    res: dict[str, Any] = {"machine": machine(), "date": time.strftime("%Y-%m-%d")}
    if args.regenerate or not st.is_store(store):
        t = time.perf_counter()
        res["generated"] = generate(store, args.events, args.ranks, args.seed)
        res["generate_s"] = round(time.perf_counter() - t, 1)
    size = sum(f.stat().st_size for f in store.rglob("*.parquet") if "view" not in f.parts)
    res["store_mb"] = round(size / 2**20, 1)
    res["events"] = st.read_manifest(store)["rows"]["events"]
    res |= _child("build", args, store)
    res |= _child("query", args, store)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Replay speed on the 1.59 M-event benchmark store (issue 11 targets: < 3 s, < 1 GB,
>= 1 M graph nodes per second, deterministic).

Every measurement runs in a fresh Python process (modules imported before the clock starts, as
in ``bench_tools.py``; the store opened inside the timed region is a fresh ``Trace``, so nothing
is cached), and its peak RSS is that child's ``ru_maxrss``. Kinds of child, alternated run by run
so that drift of the shared machine hits them alike:

* ``split``: ``sim.graph.replay_graph`` (the graph from the store) then ``sim.replay.run`` (the
  engine with the measured delays), timed apart, then the engine once more on the same graph;
* ``replay``: ``sim.replay(trace)``, the public API (graph, engine and the comparison tables);
* ``peer``: the closest existing graph computation, the critical-path graph of
  ``trace/graph.py`` (``dependency_graphs`` over every part) and ``longest_path`` of each;
* ``baseline``: the same imports and opening the store, nothing else (the memory every child
  has before it computes anything).

Determinism: each ``split`` child hashes the engine's times (SHA-256 of the int64 bytes) after
both of its runs, each ``replay`` child hashes ``Replay.time``; every hash of a kind must be the
same, across runs and processes.

    python benchmarks/bench_replay.py [--runs 3] [--store PATH] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "bench-data"
KINDS = ("split", "replay", "peer", "baseline", "whatif")
#: The what-if measured (issue 12's target: a what-if on this store in < 5 s).
WHATIF = ["scale:kernel=0.5"]
TARGET_S, TARGET_RSS_MB, TARGET_NODES_PER_S = 3.0, 1024.0, 1e6


def default_store() -> Path:
    """The store ``bench_tools.py`` uses: the generated 8-rank set, imported once."""
    import xpuprof

    src = DATA / "kineto-8r-1600000"
    store = DATA / "stores" / "tools.store"
    if not store.exists():
        if not src.exists():
            raise SystemExit(f"{src} missing: run benchmarks/bench_import.py once to generate it")
        xpuprof.import_traces([src], store)
    return store


def _hash(a: Any) -> str:
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(a, dtype="<i8").tobytes()).hexdigest()


def child(kind: str, store: str) -> dict[str, Any]:
    """One measurement (module docstring); returns what the parent reads."""
    import xpuprof
    import xpuprof.analysis.comm  # noqa: F401  (the replay graph matches collectives with it)
    from xpuprof.sim import replay
    from xpuprof.sim.graph import replay_graph
    from xpuprof.sim.replay import run
    from xpuprof.trace.graph import dependency_graphs, longest_path

    out: dict[str, Any] = {"kind": kind}
    t0 = time.perf_counter()
    trace = xpuprof.load(store)
    t1 = time.perf_counter()
    c1 = time.process_time()
    out["open_s"] = t1 - t0
    if kind == "split":
        g = replay_graph(trace)
        t2 = time.perf_counter()
        sched = run(g)
        t3 = time.perf_counter()
        c3 = time.process_time()
        again = run(g)
        out.update(cpu_s_timed=c3 - c1, graph_s=t2 - t1, engine_s=t3 - t2, nodes=len(g.nodes),
                   edges=len(g.edges), edge_counts=g.edge_counts(), hash=_hash(sched.time),
                   hash_again=_hash(again.time), cycles=len(sched.cycles))  # fmt: skip
    elif kind == "replay":
        rp = replay(trace)
        t2 = time.perf_counter()
        out["cpu_s_timed"] = time.process_time() - c1
        facts = rp.result().facts
        out.update(replay_s=t2 - t1, nodes=len(rp.graph.nodes), edges=len(rp.graph.edges),
                   hash=_hash(rp.time), median_error_pct=facts.get("median_error_pct"),
                   worst_error_pct=facts.get("worst_error_pct"))  # fmt: skip
    elif kind == "peer":
        parts = [int(s["part"]) for s in trace.sources]
        graphs = dependency_graphs(trace, {p: None for p in parts})
        t2 = time.perf_counter()
        length = sum(len(longest_path(graphs[p])) for p in parts)
        t3 = time.perf_counter()
        out["cpu_s_timed"] = time.process_time() - c1
        nodes = sum(len(g.nodes) for g in graphs.values())
        edges = sum(len(g.edges) for g in graphs.values())
        out.update(graph_s=t2 - t1, path_s=t3 - t2, nodes=nodes, edges=edges, path_edges=length)
    elif kind == "whatif":
        from xpuprof.sim.whatif import whatif

        w = whatif(trace, WHATIF)
        out.update(whatif_s=time.perf_counter() - t1,
                   speedup=float(w.summary["speedup"].mean()))  # fmt: skip
    elif kind != "baseline":
        raise SystemExit(f"unknown kind {kind!r}; expected one of {KINDS}")
    trace.close()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["peak_rss_mb"] = ru.ru_maxrss / 1024  # KiB on Linux
    out["cpu_s"] = ru.ru_utime + ru.ru_stime
    return out


def measure(kind: str, store: Path) -> dict[str, Any]:
    """Run one child and read its one-line JSON answer."""
    load = os.getloadavg()[0]
    p = subprocess.run([sys.executable, __file__, "--child", kind, str(store)],
                       capture_output=True, text=True, check=False)  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"{kind} child failed ({p.returncode}):\n{p.stderr[-4000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["load_before"] = load
    return res


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {k: [r for r in runs if r["kind"] == k] for k in KINDS}

    def med(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in by[kind])

    split, rep, peer = by["split"][0], by["replay"][0], by["peer"][0]
    graph_s, engine_s = med("split", "graph_s"), med("split", "engine_s")
    replay_s = med("replay", "replay_s")
    peer_s = med("peer", "graph_s") + med("peer", "path_s")
    hashes = {r["hash"] for r in by["split"]} | {r["hash_again"] for r in by["split"]}
    rhashes = {r["hash"] for r in by["replay"]}
    rss = max(r["peak_rss_mb"] for r in by["replay"] + by["split"])
    return {
        "nodes": split["nodes"],
        "edges": split["edges"],
        "edge_counts": split["edge_counts"],
        "cycles": split["cycles"],
        "open_s": med("replay", "open_s"),
        "graph_s": graph_s,
        "engine_s": engine_s,
        "graph_engine_s": graph_s + engine_s,
        "replay_s": replay_s,
        "replay_runs_s": [r["replay_s"] for r in by["replay"]],
        "replay_cpu_s": med("replay", "cpu_s_timed"),
        "replay_min_s": min(r["replay_s"] for r in by["replay"]),
        "load_before": [round(r["load_before"], 2) for r in runs],
        "nodes_per_s_replay": split["nodes"] / replay_s,
        "nodes_per_s_graph_engine": split["nodes"] / (graph_s + engine_s),
        "nodes_per_s_engine": split["nodes"] / engine_s,
        "peak_rss_mb_replay": max(r["peak_rss_mb"] for r in by["replay"]),
        "peak_rss_mb_split": max(r["peak_rss_mb"] for r in by["split"]),
        "peak_rss_mb_peer": max(r["peak_rss_mb"] for r in by["peer"]),
        "rss_mb_baseline": max(r["peak_rss_mb"] for r in by["baseline"]),
        "peer_graph_s": med("peer", "graph_s"),
        "peer_path_s": med("peer", "path_s"),
        "peer_s": peer_s,
        "peer_nodes": peer["nodes"],
        "peer_edges": peer["edges"],
        "ratio_replay_to_peer": replay_s / peer_s,
        "ratio_graph_to_peer_graph": graph_s / med("peer", "graph_s"),
        "deterministic": len(hashes) == 1 and len(rhashes) == 1,
        "hash_engine": sorted(hashes),
        "hash_replay": sorted(rhashes),
        "whatif_s": med("whatif", "whatif_s"),
        "whatif_runs_s": [r["whatif_s"] for r in by["whatif"]],
        "median_error_pct": rep["median_error_pct"],
        "worst_error_pct": rep["worst_error_pct"],
        "targets": {
            "replay_under_3s": replay_s < TARGET_S,
            "rss_under_1gb": rss < TARGET_RSS_MB,
            "nodes_per_s_over_1m": split["nodes"] / replay_s >= TARGET_NODES_PER_S,
            "whatif_under_5s": med("whatif", "whatif_s") < 5,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--store", type=Path, help="a store (default: the benchmark store)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "STORE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    store = (args.store or default_store()).resolve()
    runs = [measure(kind, store) for _ in range(args.runs) for kind in KINDS]
    s = summarise(runs)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        "store": str(store),
        "runs": args.runs,
        "summary": s,
        "measurements": runs,
    }
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    t = s["targets"]

    def yes(ok: bool) -> str:
        return "yes" if ok else "**NO**"

    print(f"Replay speed — {doc['date']} — {doc['machine']}\nstore {store} "
          f"({s['nodes']:,} graph nodes, {s['edges']:,} edges); median of {args.runs} fresh "
          "processes per line\n")  # fmt: skip
    print("| measurement | seconds | nodes/s | peak RSS (child) | target | met |")
    print("|---|---|---|---|---|---|")
    print(f"| replay(trace), the API | {s['replay_s']:.2f} | {s['nodes_per_s_replay'] / 1e6:.2f} M "
          f"| {s['peak_rss_mb_replay']:.0f} MB | < 3 s, < 1 GB, ≥ 1 M nodes/s | "
          f"{yes(t['replay_under_3s'])}, {yes(t['rss_under_1gb'])}, "
          f"{yes(t['nodes_per_s_over_1m'])} |")  # fmt: skip
    print(
        f"| graph build (replay_graph) | {s['graph_s']:.2f} | "
        f"{s['nodes'] / s['graph_s'] / 1e6:.2f} M | {s['peak_rss_mb_split']:.0f} MB | | |"
    )
    print(f"| engine (run) | {s['engine_s']:.2f} | {s['nodes_per_s_engine'] / 1e6:.2f} M | | | |")
    print(f"| peer: critical-path graph (dependency_graphs) | {s['peer_graph_s']:.2f} | "
          f"{s['peer_nodes'] / s['peer_graph_s'] / 1e6:.2f} M | {s['peak_rss_mb_peer']:.0f} MB "
          "| | |")  # fmt: skip
    print(f"| peer: longest_path of every part | {s['peer_path_s']:.3f} | | | | |")
    print(f"| baseline: imports + open the store | {s['open_s']:.2f} (open) | | "
          f"{s['rss_mb_baseline']:.0f} MB | | |")  # fmt: skip
    print(f"| what-if `{'; '.join(WHATIF)}` (two replays + critical paths) | "
          f"{s['whatif_s']:.2f} | | | < 5 s | {yes(t['whatif_under_5s'])} |")  # fmt: skip
    print(f"\nreplay / peer (graph + longest path): {s['ratio_replay_to_peer']:.2f}×; graph "
          f"build / peer graph build: {s['ratio_graph_to_peer_graph']:.2f}× "
          f"(peer graph: {s['peer_nodes']:,} nodes, {s['peer_edges']:,} edges)")  # fmt: skip
    print(
        f"replay() runs: {', '.join(f'{x:.2f}' for x in s['replay_runs_s'])} s wall (min "
        f"{s['replay_min_s']:.2f}), {s['replay_cpu_s']:.2f} s CPU (median: the process's user + "
        f"sys time, all threads); 1-min load before each child: {s['load_before']}"
    )
    print(
        f"identity replay of this store: error median {s['median_error_pct']} %, worst "
        f"{s['worst_error_pct']} %"
    )
    print(
        f"deterministic: {yes(s['deterministic'])} — engine sha256 "
        f"{', '.join(s['hash_engine'])} ({2 * args.runs} runs in {args.runs} processes); "
        f"Replay.time sha256 {', '.join(s['hash_replay'])} ({args.runs} processes)"
    )
    print("edges: " + ", ".join(f"{k} {v:,}" for k, v in s["edge_counts"].items()))


if __name__ == "__main__":
    main()

"""Every analysis on the 1.59 M-event benchmark store (issue 4 target: each < 3 s).

Imports the generated 8-rank set once (cached next to it), then runs each tool in-process on a
freshly opened Trace (no cache carried between tools), median of ``--runs``.

    python benchmarks/bench_tools.py [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import xpuprof
from xpuprof.advise.rules import advise
from xpuprof.analysis.breakdown import breakdown
from xpuprof.analysis.comm import collectives
from xpuprof.analysis.critical_path import critical_path
from xpuprof.analysis.hierarchy import hierarchy
from xpuprof.analysis.idle import idle_time
from xpuprof.analysis.input_pipeline import input_pipeline
from xpuprof.analysis.memory import memory_timeline
from xpuprof.analysis.overview import overview
from xpuprof.analysis.roofline import roofline
from xpuprof.analysis.stats import stats

DATA = Path(__file__).resolve().parents[1] / "bench-data"
TOOLS = {
    "overview": overview,
    "advise (with its overview)": advise,
    "stats (ops, kernels, layers)": stats,
    "hierarchy (by layer)": hierarchy,
    "roofline": roofline,
    "input pipeline": input_pipeline,
    "memory": memory_timeline,
    "communication": collectives,
    "idle time": idle_time,
    "breakdown (temporal, kernel types, overlap)": breakdown,
    "critical path": critical_path,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    src = DATA / "kineto-8r-1600000"
    if not src.exists():
        raise SystemExit(f"{src} missing: run benchmarks/bench_import.py once to generate it")
    store = DATA / "stores" / "tools.store"
    xpuprof.import_traces([src], store)  # a no-op when already imported
    out = {}
    for name, fn in TOOLS.items():
        times = []
        for _ in range(args.runs):
            with xpuprof.load(store) as trace:
                t = time.perf_counter()
                fn(trace)
                times.append(time.perf_counter() - t)
        out[name] = statistics.median(times)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; store of {src.name}; "
        f"median of {args.runs}\n\n| tool | seconds | < 3 s |\n|---|---|---|"
    )
    for name, s in out.items():
        print(f"| {name} | {s:.2f} | {'yes' if s < 3 else 'NO'} |")


if __name__ == "__main__":
    main()

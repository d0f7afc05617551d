"""``overview`` and ``advise`` alone on the 1.59 M-event benchmark store: the two tools that run
the critical-path diagnosis (issue 9). In-process, a fresh Trace per run, median of ``--runs``.

Run it from two trees alternately to compare them (the store is imported next to each tree's
``bench-data/kineto-8r-1600000``, which ``benchmarks/bench_import.py`` generates):

    python benchmarks/bench_overview.py [--root TREE] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import xpuprof
from xpuprof.advise.rules import advise
from xpuprof.analysis.overview import overview


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    src = args.root / "bench-data" / "kineto-8r-1600000"
    if not src.exists():
        raise SystemExit(f"{src} missing: run benchmarks/bench_import.py once to generate it")
    store = args.root / "bench-data" / "stores" / "tools.store"
    xpuprof.import_traces([src], store)  # a no-op when already imported
    out = {}
    for name, fn in (("overview", overview), ("advise", advise)):
        times = []
        for _ in range(args.runs):
            with xpuprof.load(store) as trace:
                t = time.perf_counter()
                fn(trace)
                times.append(time.perf_counter() - t)
        out[name] = round(statistics.median(times), 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

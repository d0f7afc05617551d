"""What-if speed per kind of change on the 1.59 M-event benchmark store (issue 12's target: a
what-if on this store in < 5 s).

Each change runs in a fresh Python process (modules imported before the clock starts; the store
opened inside the timed region, so nothing is cached), ``--runs`` times, alternated change by
change so that drift of the shared machine hits them alike; the median wall time and the
child's peak RSS are printed. A change the store cannot take (no collectives, no thread count
recorded) prints its one-line error instead of a time. The peer in the same run is the identity
replay (``sim.replay``): a what-if is two replays' worth of engine work plus the critical paths
and the change itself, so the ratio says what a change costs beyond one replay.

    python benchmarks/bench_whatif.py [--runs 3] [--store PATH] [--json] [CHANGE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: One change of each kind the store can take (the generated store records shapes, no
#: thread count, NCCL collectives on their own streams, an input span per step).
CHANGES = ("scale:kernel=0.5", "host-gaps=0.5", "no-sync", "cuda-graphs", "no-input-wait",
           "device=h100-sxm", "collective:algorithm=tree", "overlap-collective", "batch=2",
           "fuse-elementwise", "dtype=bf16", "threads=2:1")  # fmt: skip
REPLAY = "(identity replay)"


def child(change: str, store: str) -> dict[str, Any]:
    import xpuprof
    from xpuprof.core.errors import XpuprofError
    from xpuprof.sim import replay
    from xpuprof.sim.whatif import whatif

    t0 = time.perf_counter()
    out: dict[str, Any] = {"change": change}
    with xpuprof.load(store) as trace:
        try:
            if change == REPLAY:
                replay(trace)
            else:
                w = whatif(trace, [change])
                out["speedup"] = float(w.summary["speedup"].mean())
        except XpuprofError as e:
            out["error"] = str(e)
    out["s"] = time.perf_counter() - t0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def measure(change: str, store: Path) -> dict[str, Any]:
    p = subprocess.run([sys.executable, __file__, "--child", change, str(store)],
                       capture_output=True, text=True, check=False)  # fmt: skip
    if p.returncode != 0:
        raise SystemExit(f"{change!r} child failed ({p.returncode}):\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("changes", nargs="*", default=list(CHANGES))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--store", type=Path)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("CHANGE", "STORE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    from bench_replay import default_store

    store = args.store or default_store()
    names = [REPLAY, *args.changes]
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in names}
    for r in range(args.runs):
        for c in names:
            runs[c].append(measure(c, store))
        print(f"run {r + 1}/{args.runs} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    rows = []
    for c in names:
        got = runs[c]
        row = {"change": c, "s": statistics.median(x["s"] for x in got),
               "runs_s": [round(x["s"], 2) for x in got],
               "peak_rss_mb": max(x["peak_rss_mb"] for x in got),
               "error": got[0].get("error"), "speedup": got[0].get("speedup")}  # fmt: skip
        rows.append(row)
    base = rows[0]["s"]
    for row in rows:
        row["vs_replay"] = row["s"] / base
    if args.json:
        print(json.dumps({"store": str(store), "runs": args.runs, "rows": rows}, indent=1))
        return
    print(f"store {store.name}, median of {args.runs} runs, each in a fresh process\n")
    print("| change | seconds (median) | × identity replay | peak RSS | < 5 s | note |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        note = (f"error: {row['error'][:110]}" if row["error"] else
                f"predicted speedup ×{row['speedup']:.3f}" if row["speedup"] else "")  # fmt: skip
        ok = "" if row["change"] == REPLAY else ("yes" if row["s"] < 5 else "**no**")
        print(f"| `{row['change']}` | {row['s']:.2f} | {row['vs_replay']:.2f} | "
              f"{row['peak_rss_mb']:.0f} MB | {ok} | {note} |")  # fmt: skip


if __name__ == "__main__":
    main()

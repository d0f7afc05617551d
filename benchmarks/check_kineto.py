"""Compare Kineto traces side by side and check their internal consistency.

Why: the benchmark input is only meaningful if gen_kineto.py writes what torch.profiler writes.
Run it on a generated file next to real ones to compare the mix of events per (ph, cat), and to
check what the generator promises: X events nest on each thread, every GPU activity starts after
its runtime call ended, ac2g `s`/`f` sit at the runtime's / activity's ts with id = correlation,
fwdbwd flows come in pairs, `Ev Idx` is unique. Timestamps are read as exact decimals.

    python benchmarks/check_kineto.py bench-data/kineto-8r-1600000/rank0.pt.trace.json \\
        ../shared/traces/kineto/gpu/v100_rank1of2_df_index_resolver.json.gz

Real traces are not perfect either: Kineto writes a lone ac2g `f` on runtime calls that launch
nothing, and `cuda_sync` ranges overlap the activities of their stream (both show up below).
Loads each file whole: meant for files up to a few hundred MB.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")


def load(path: str) -> dict[str, Any]:
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rb") as f:
        return json.load(f, parse_float=Decimal)


def ns(v: Any) -> int:
    return int(Decimal(v) * 1000)


def check(events: list[dict[str, Any]]) -> Counter:
    """Counts of consistency findings (see the module docstring)."""
    bad: Counter = Counter()
    threads: dict[tuple, list] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e and not isinstance(e.get("pid"), str):
            threads[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["dur"]), e.get("cat")))
    for evs in threads.values():
        evs.sort(key=lambda x: (x[0], -x[1]))
        stack: list[int] = []
        for ts, dur, cat in evs:
            while stack and stack[-1] <= ts:
                stack.pop()
            if stack and ts + dur > stack[-1]:
                bad[f"partial overlap on a thread/stream ({cat})"] += 1
            stack.append(ts + dur)
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    gpu = {e["args"]["correlation"]: e for e in events if e.get("cat") in GPU_CATS}
    starts: dict[Any, dict] = {}
    ends: dict[Any, dict] = {}
    for e in events:
        if e.get("cat") in ("ac2g", "async_cpu_to_gpu"):
            (starts if e["ph"] == "s" else ends)[e["id"]] = e
    for corr, g in gpu.items():
        r = runtime.get(corr)
        if r is None:
            bad["GPU activity without runtime call"] += 1
            continue
        if g["cat"] != "cuda_sync" and ns(g["ts"]) < ns(r["ts"]) + ns(r["dur"]):
            bad["GPU activity starts before its launch ended"] += 1
        s, f = starts.get(corr), ends.get(corr)
        if s is None or ns(s["ts"]) != ns(r["ts"]) or s["tid"] != r["tid"]:
            bad["ac2g s missing or not at the runtime call"] += 1
        if f is None or ns(f["ts"]) != ns(g["ts"]) or f["pid"] != g["pid"]:
            bad["ac2g f missing or not at the GPU activity"] += 1
    bad["(quirk) lone ac2g f without s"] = sum(1 for i in ends if i not in starts)
    pairs: dict[Any, set] = defaultdict(set)
    for e in events:
        if e.get("cat") == "fwdbwd":
            pairs[e["id"]].add(e["ph"])
    bad["fwdbwd flow without its partner"] = sum(1 for v in pairs.values() if v != {"s", "f"})
    idx = [e["args"]["Ev Idx"] for e in events if "Ev Idx" in e.get("args", {})]
    bad["duplicate Ev Idx"] = len(idx) - len(set(idx))
    return +bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    mixes, notes = [], []
    for p in a.files:
        d = load(p)
        ev = d["traceEvents"]
        raw = Path(p).stat().st_size
        mix = Counter(f"{e.get('ph')}/{e.get('cat', '')}" for e in ev)
        mixes.append((Path(p).name, len(ev), mix))
        keys = [k for k in d if k != "traceEvents"]
        notes.append((Path(p).name, len(ev), raw, keys, check(ev)))
    rows = sorted({k for _, _, m in mixes for k in m}, key=lambda k: -sum(m[k] for *_, m in mixes))
    w = max(12, *(len(n[:24]) for n, _, _ in mixes))
    print(f"{'ph/cat':26s}" + "".join(f"{n[:24]:>{w + 2}s}" for n, _, _ in mixes))
    for k in rows:
        cells = "".join(f"{m[k] / n * 100:>{w + 1}.1f}%" if m[k] else f"{'':>{w + 2}s}"
                        for _, n, m in mixes)
        print(f"{k:26s}{cells}")
    print(f"{'events':26s}" + "".join(f"{n:>{w + 2},}" for _, n, _ in mixes))
    for name, n, raw, keys, bad in notes:
        print(f"\n{name}: {n:,} events, {raw / 1e6:.1f} MB on disk, top-level keys {keys}")
        for k, v in bad.items():
            print(f"  {k}: {v:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

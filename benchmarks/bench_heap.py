"""Import on a cluster whose Nanny fixed glibc's heap thresholds: with and without
``core/heap.py`` raising them during the import's tasks.

Why: Dask's Nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (its
``distributed.nanny.pre-spawn-environ``), which freezes glibc's mmap threshold at 128 KiB; each
large buffer a decoder frees and allocates again is then a fresh mmap, faulted in page by page.
This is what a user's own cluster (``xpuprof import --scheduler ADDRESS``) gives the import.

How: one LocalCluster of 2 single-threaded worker processes started by Nannies, as Dask starts
them (the peer is the same cluster with the heap left as the Nanny set it: ``heap.roomy``
switched off on the workers). The 8-rank set of ``bench_import.py`` (or ``--files``) is
imported with ``scheduler=`` its address, alternating off and on, ``--rounds`` times; wall
time and the workers' minor page faults per import; medians and their ratio printed.

Usage (from the repository root, project venv active):
    python benchmarks/bench_heap.py                 # 5 rounds on the 8-rank set
    python benchmarks/bench_heap.py --files bench-data/kineto-big-2048mb/rank0.pt.trace.json
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _switch(on: bool) -> bool:
    """On a worker: let ``heap.roomy`` work (on) or make it find nothing to raise (off)."""
    from xpuprof.core import heap

    if not hasattr(heap, "_fixed_as_shipped"):
        heap._fixed_as_shipped = heap._fixed  # type: ignore[attr-defined]
    heap._fixed = heap._fixed_as_shipped if on else (lambda: None)  # type: ignore[attr-defined]
    return bool(heap.start_settings())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", type=Path, default=Path("bench-data"))
    ap.add_argument("--files", nargs="*", help="trace files (default: the 8-rank set)")
    a = ap.parse_args(argv)

    from dask.distributed import Client, LocalCluster

    import xpuprof

    if a.files:
        files = a.files
    else:
        import bench_import as bi

        man = bi.ensure_dataset(a.data, "kineto-8r-1600000", ranks=8, events=1_600_000)
        files = [f["path"] for f in man["files"]]
    times: dict[bool, list[float]] = {False: [], True: []}
    faults: dict[bool, list[int]] = {False: [], True: []}
    tmp = Path(tempfile.mkdtemp(prefix="bench-heap-"))
    quiet = logging.CRITICAL
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, silence_logs=quiet,
                          dashboard_address=None) as cluster, \
                Client(cluster.scheduler_address) as client:  # fmt: skip
            fixed = client.run(_switch, True)
            print(f"workers started with fixed heap settings: {sorted(fixed.values())}",
                  file=sys.stderr)  # fmt: skip
            for i in range(a.rounds):
                for on in (False, True):
                    client.run(_switch, on)
                    before = client.run(_faults)
                    store = tmp / f"s{i}-{int(on)}"
                    t = time.perf_counter()
                    xpuprof.import_traces(files, store, scheduler=cluster.scheduler_address)
                    times[on].append(time.perf_counter() - t)
                    after = client.run(_faults)
                    faults[on].append(sum(after[w] - before[w] for w in after))
                    shutil.rmtree(store)
                    print(f"[{i + 1}/{a.rounds}] heap {'raised' if on else 'as set '}: "
                          f"{times[on][-1]:6.2f} s, {faults[on][-1]:,} page faults",
                          file=sys.stderr)  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"files: {len(files)}, {sum(os.path.getsize(f) for f in files) / 1e6:,.0f} MB; "
          f"2 Nanny workers, {a.rounds} rounds, medians")  # fmt: skip
    print(f"heap as the Nanny set it: {off:6.2f} s, "
          f"{statistics.median(faults[False]):>12,.0f} page faults")
    print(f"heap raised (core/heap): {on:6.2f} s, "
          f"{statistics.median(faults[True]):>12,.0f} page faults")
    print(f"ratio: {off / on:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

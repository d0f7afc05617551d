"""Reference numbers from Holistic Trace Analysis for the breakdown agreement tests.

Runs with HTA's own interpreter (HTA 0.5.0 needs pandas<3 and cannot share xpuprof's venv):

    bench-data/hta-venv/bin/python scripts/hta_reference_breakdown.py   # every shared GPU trace
    bench-data/hta-venv/bin/python scripts/hta_reference_breakdown.py a100_triton dlrm_8rank_v100

For each real GPU trace in ``../shared/traces/kineto/gpu`` (a single file is copied alone into a
temporary directory, because ``TraceAnalysis`` reads a directory; the multi-rank DLRM directory
is read as a whole), it loads ``TraceAnalysis(trace_dir=...)`` with HTA's defaults (last
profiler step dropped) and writes ``tests/data/hta/breakdown/<name>.json`` with:

- ``temporal_breakdown``: ``get_temporal_breakdown()`` per rank (µs, HTA's unit);
- ``kernel_type_breakdown`` and ``kernel_breakdown``: ``get_gpu_kernel_breakdown()`` (the
  per-kernel table with each name cut to 60 characters plus the first 12 hex digits of its
  SHA-1, to match on);
- ``comm_comp_overlap``: ``get_comm_comp_overlap()`` per rank;
- ``idle_time_breakdown``: ``get_idle_time_breakdown(ranks=<all>)`` per rank, stream, category;
- ``launch_stats``: per rank, sums and counts of ``get_cuda_kernel_launch_stats()`` (the
  thresholds of its plots: runtime 50 µs, launch delay 100 µs, short = gpu < cpu ≤ 50 µs);
- ``queue_length_summary``: ``get_queue_length_summary(ranks=<all>)``;
- ``errors``: the analyses HTA could not run on this trace, with the exception it raised;

plus the exact command, the HTA and pandas versions and the date. Numbers only: the JSON stays
commit-sized.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import logging
import math
import shlex
import shutil
import sys
import tempfile
import traceback
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRACES = ROOT.parent / "shared" / "traces" / "kineto" / "gpu"
OUT = ROOT / "tests" / "data" / "hta" / "breakdown"


def cases(root: Path) -> dict[str, list[Path]]:
    """name -> the files HTA reads together (one directory per case)."""
    out: dict[str, list[Path]] = {}
    for p in sorted(root.glob("*.json.gz")):
        out[p.name.removesuffix(".json.gz")] = [p]
    dlrm = root / "dlrm_8rank_v100"
    if dlrm.is_dir():
        out["dlrm_8rank_v100"] = sorted(dlrm.glob("*.json.gz"))
    # the two ResNet files have no rank: HTA would map both to rank 0, so one case each
    for p in sorted((root / "resnet50_v100_2021").glob("*.json.gz")):
        out["resnet50_" + p.name.split(".")[0]] = [p]
    return out


def _num(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def records(df: Any) -> list[dict[str, Any]]:
    return [{str(k): _num(v) for k, v in row.items()} for row in df.to_dict(orient="records")]


def _err(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)[-1]
    return f"{type(e).__name__}: {e} (at {Path(tb.filename).name}:{tb.lineno} in {tb.name})"


def dump(doc: dict[str, Any]) -> str:
    """JSON with one line per top-level key and per table row (readable diffs, small files)."""
    lines = []
    for k, v in doc.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            rows = ",\n  ".join(json.dumps(r) for r in v)
            lines.append(f"{json.dumps(k)}: [\n  {rows}\n]")
        else:
            lines.append(f"{json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def run_case(files: list[Path]) -> dict[str, Any]:
    from hta.trace_analysis import TraceAnalysis

    out: dict[str, Any] = {"errors": {}}
    with tempfile.TemporaryDirectory(prefix="hta-ref-") as d:
        for f in files:
            shutil.copy(f, Path(d) / f.name)
        try:
            ta = TraceAnalysis(trace_dir=d)
        except Exception as e:  # noqa: BLE001 - recorded: HTA cannot load this trace
            out["errors"]["load"] = _err(e)
            return out
        ranks = [int(r) for r in ta.t.get_ranks()]
        out["ranks"] = ranks
        out["iterations"] = {str(r): [int(i) for i in ta.t.get_iterations(r)] for r in ranks}

        def attempt(name: str, fn: Any) -> None:
            try:
                out[name] = fn()
            except Exception as e:  # noqa: BLE001 - recorded, the test explains it
                out["errors"][name] = _err(e)

        attempt("temporal_breakdown", lambda: records(ta.get_temporal_breakdown(visualize=False)))

        try:
            types, per_kernel = ta.get_gpu_kernel_breakdown(visualize=False)
            out["kernel_type_breakdown"] = records(types)
            out["kernel_breakdown"] = [
                {
                    "rank": int(r["rank"]),
                    "kernel_type": r["kernel_type"],
                    # names are long C++ signatures: a prefix to read, a hash to match
                    "name": r["name"][:60],
                    "name_sha1": hashlib.sha1(r["name"].encode()).hexdigest()[:12],
                    **{
                        k: round(float(r[k]), 3)
                        for k in ("sum (us)", "max (us)", "min (us)", "mean (us)", "stddev")
                    },
                }
                for r in per_kernel.to_dict(orient="records")
            ]
        except Exception as e:  # noqa: BLE001
            out["errors"]["kernel_breakdown"] = _err(e)

        attempt("comm_comp_overlap", lambda: records(ta.get_comm_comp_overlap(visualize=False)))
        attempt(
            "idle_time_breakdown",
            lambda: records(ta.get_idle_time_breakdown(ranks=ranks, visualize=False)[0]),
        )

        def launch_stats() -> dict[str, Any]:
            res = {}
            for rank, df in ta.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False).items():
                short = (df["cpu_duration"] <= 50) & (df["gpu_duration"] < df["cpu_duration"])
                res[str(int(rank))] = {
                    "count": int(len(df)),
                    "cpu_duration_sum": _num(df["cpu_duration"].sum()),
                    "gpu_duration_sum": _num(df["gpu_duration"].sum()),
                    "launch_delay_sum": _num(df["launch_delay"].sum()),
                    "launch_delay_max": _num(df["launch_delay"].max()) if len(df) else None,
                    "short_kernels": int(short.sum()),
                    "runtime_outliers": int((df["cpu_duration"] > 50).sum()),
                    "launch_delay_outliers": int((df["launch_delay"] > 100).sum()),
                }
            return res

        attempt("launch_stats", launch_stats)

        def queue() -> list[dict[str, Any]] | None:
            q = ta.get_queue_length_summary(ranks=ranks)
            if q is None:
                return None
            q = q.copy()
            q.columns = [c[1] if isinstance(c, tuple) else c for c in q.columns]
            return records(q.reset_index())

        attempt("queue_length_summary", queue)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="cases to run (default: all)")
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    logging.disable(logging.WARNING)  # HTA logs every parse at WARNING
    warnings.simplefilter("ignore")  # and pandas warns about HTA's code

    import hta  # noqa: F401

    found = cases(a.traces)
    todo = a.names or list(found)
    unknown = [n for n in todo if n not in found]
    if unknown:
        print(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(found)}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    cmd = "bench-data/hta-venv/bin/python " + shlex.join(
        ["scripts/hta_reference_breakdown.py", *sys.argv[1:]]
    )
    for name in todo:
        files = found[name]
        print(f"{name}: {len(files)} file(s)", file=sys.stderr, flush=True)
        res = run_case(files)
        doc = {
            "case": name,
            "sources": [str(f.relative_to(a.traces.parents[1])) for f in files],
            "command": cmd,
            "hta_version": metadata.version("HolisticTraceAnalysis"),
            "pandas_version": metadata.version("pandas"),
            "python": sys.version.split()[0],
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "options": "TraceAnalysis(trace_dir) defaults: include_last_profiler_step=False; "
            "get_gpu_kernel_breakdown(duration_ratio=0.8, num_kernels=10, "
            "include_memory_kernels=True); get_idle_time_breakdown(consecutive_kernel_delay=30)",
            **res,
        }
        (a.out / f"{name}.json").write_text(dump(doc))
        if res["errors"]:
            print(f"  HTA errors: {res['errors']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Record HTA's critical path on the shared real traces, for tests/test_critical_path.py.

Run with the Python that has HolisticTraceAnalysis 0.5.0 (pandas < 3) installed, not xpuprof's:

    bench-data/hta-venv/bin/python scripts/hta_reference_critical_path.py

For each trace it calls ``TraceAnalysis.critical_path_analysis`` with the annotation and
instance HTA's own tests use (tests/test_critical_path_analysis.py in
facebookresearch/HolisticTraceAnalysis), and writes tests/data/hta/critical_path/<name>.json:
the path length (sum of the weights of the path's edges, HTA's µs), the time per ``bound_by``
and per edge type, and the path's edges in order (weight, bound_by, attributed event). HTA needs a
directory per trace, so each file is linked into a temporary directory of its own.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces" / "kineto" / "gpu"
OUT = ROOT / "tests" / "data" / "hta" / "critical_path"
ALEXNET_FORWARD = "[param|pytorch.model.alex_net|0|0|0|measure|forward]"
#: trace -> (annotation, instance_id), as in HTA's tests
CASES = {
    "a100_simple_add": (ALEXNET_FORWARD, 1),
    "a100_alexnet_cuda_sync": (ALEXNET_FORWARD, 1),
    "a100_cuda_event_sync": ("ProfilerStep", 0),
    "a100_cuda_event_sync_multi_stream": ("", None),
    "v100_ns_resolution": ("ProfilerStep", 1),  # ns decimals: HTA rounds them to whole µs
}


def run(name: str, annotation: str, instance: int | None) -> dict:
    import hta
    from hta.analyzers.critical_path_analysis import bound_by
    from hta.trace_analysis import TraceAnalysis

    src = TRACES / f"{name}.json.gz"
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(src, Path(tmp) / src.name)
        t0 = time.perf_counter()
        ta = TraceAnalysis(trace_dir=tmp)
        t1 = time.perf_counter()
        g, ok = ta.critical_path_analysis(rank=0, annotation=annotation, instance_id=instance)
        t2 = time.perf_counter()
    assert ok, f"HTA's critical path failed on {name}"
    df = ta.t.get_trace(0)
    sym = ta.t.symbol_table.get_sym_table()
    edges = []
    for u, v in zip(g.critical_path_nodes, g.critical_path_nodes[1:], strict=False):
        e = g.edges[u, v]["object"]
        ev = g.get_event_attribution_for_edge(e)
        row = {"type": e.type.value, "stream": -1, "s_name": ""}
        if ev is not None:
            row.update(stream=int(df.stream.loc[ev]), s_name=sym[int(df.name.loc[ev])])
        edges.append({
            "type": e.type.value.removeprefix("critical_path_"),
            "weight_us": int(e.weight),
            "bound_by": bound_by(row),
            "event": None if ev is None else sym[int(df.name.loc[ev])][:60],
        })  # fmt: skip
    names = sorted({e["event"] for e in edges if e["event"] is not None})
    index = {n: i for i, n in enumerate(names)}
    by, types = {}, {}
    for e in edges:
        by[e["bound_by"]] = by.get(e["bound_by"], 0) + e["weight_us"]
        types[e["type"]] = types.get(e["type"], 0) + e["weight_us"]
    return {
        "trace": f"shared/traces/kineto/gpu/{src.name}",
        "tool": f"HolisticTraceAnalysis {'.'.join(map(str, hta.__version_tuple__))}",
        "command": "bench-data/hta-venv/bin/python scripts/hta_reference_critical_path.py",
        "call": f"TraceAnalysis(trace_dir).critical_path_analysis(rank=0, "
        f"annotation={annotation!r}, instance_id={instance!r})",
        "date": datetime.date.today().isoformat(),
        "python": sys.version.split()[0],
        "annotation": annotation,
        "instance": instance,
        "length_us": sum(e["weight_us"] for e in edges),
        "by_bound_by_us": dict(sorted(by.items())),
        "by_edge_type_us": dict(sorted(types.items())),
        "nodes": len(g.critical_path_nodes),
        "seconds_load": round(t1 - t0, 3),
        "seconds_critical_path": round(t2 - t1, 3),
        "edge_fields": ["weight_us", "bound_by", "event (index into events)"],
        "events": names,
        "edges": [[e["weight_us"], e["bound_by"], index.get(e["event"])] for e in edges],
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (annotation, instance) in CASES.items():
        res = run(name, annotation, instance)
        edges = res.pop("edges")
        text = json.dumps(res, indent=1)[:-2] + ',\n "edges": [\n  '
        text += ",\n  ".join(json.dumps(e) for e in edges) + "\n ]\n}\n"
        (OUT / f"{name}.json").write_text(text)
        print(f"{name}: length {res['length_us']} us {res['by_bound_by_us']}")


if __name__ == "__main__":
    main()

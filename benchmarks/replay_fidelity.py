"""Replay fidelity on every real trace (issue 11, "Fidelity report" and the identity target).

Each trace set of ``../shared/traces`` (``$XPUPROF_TEST_TRACES`` when set) is imported into a
temporary store (a multi-rank folder such as ``kineto/gpu/dlrm_8rank_v100/`` as one store), and
so is a CPU training run captured here at ``level="op"`` (the built-in demo model, a few steps
under ``xpuprof.profile``). Each store is replayed three ways, on one graph:

* **identity** (cost model ``"measured"``): the delays the graph was calibrated with, so every
  start is reproduced where the graph holds the dependency that set it; what is left is what the
  model changes on purpose (a matched collective ends at its last arrival + transfer time).
* **typical delays** (:class:`TypicalDelays`, below): every ``launch``, ``stream_order`` and
  ``sync`` edge takes its rank's typical value (``graph.typical``: median launch latency onto
  an idle stream, gap between queued work, wake-up after a sync) instead of its measured one;
  durations and host gaps stay measured. Not exact by construction: where a kernel waited for a
  dependency the graph does not hold, its measured launch delay hid the wait, and here it is
  gone. The error of this variant is what shows whether the graph generalises.
* **kernels × 2** (``Scaled(2.0)``: device work and collectives twice as long): the simulated
  step (the longest rank's span where there are no steps) must grow by 0–100 % (0:
  host-bound, 100: device-bound). Its span change is shown too: a step is a host span, so a
  host that never waits for the device keeps its steps while the device work runs later.

Step time: the sum over ranks and steps of ``ProfilerStep`` spans (``rp.summary``); a trace
"holds whole steps" when the replay found such host step spans (an XPlane's Steps line gives
them too; steps xpuprof infers from XLA module runs sit on device lines and are not used by the
replay). Error: (simulated - measured) / measured of that sum; span error: first start to last
end of a rank, the worst rank. Median and worst are of |error| over the traces with whole steps.

    python benchmarks/replay_fidelity.py [--traces DIR] [--no-capture] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import xpuprof
from xpuprof.sim import replay
from xpuprof.sim.costs import Scaled
from xpuprof.sim.graph import EDGE_KINDS, ReplayGraph

ROOT = Path(__file__).resolve().parents[1]
#: Typical delay (column of ``graph.typical``) that replaces each edge kind's measured delay.
TYPICAL_OF = {"launch": "launch_ns", "stream_order": "queue_gap_ns", "sync": "wake_ns"}


@dataclass(frozen=True)
class TypicalDelays:
    """Launch, queue and sync edges at their rank's typical delay; every other edge (durations,
    host gaps, collectives, stream waits, forward → backward) at its measured delay."""

    def delays(self, graph: ReplayGraph) -> np.ndarray:
        d = np.array(graph.edges.delay, np.int64)
        part = graph.nodes.part[graph.edges.dst]
        typical = graph.typical.set_index("part")
        for kind, column in TYPICAL_OF.items():
            pick = graph.edges.kind == EDGE_KINDS.index(kind)
            if not pick.any():
                continue
            value = typical[column].reindex(part[pick])
            if value.isna().any():
                raise ValueError(f"graph.typical has no {column} for parts "
                                 f"{sorted(set(part[pick][value.isna().to_numpy()]))}")  # fmt: skip
            d[pick] = value.to_numpy(np.int64)
        return d


def traces_root(given: str | None) -> Path:
    """``--traces``, else ``$XPUPROF_TEST_TRACES``, else ``../shared/traces``."""
    env = given or os.environ.get("XPUPROF_TEST_TRACES")
    return Path(env).expanduser().resolve() if env else ROOT.parent / "shared" / "traces"


def trace_sets(root: Path) -> list[tuple[str, list[Path]]]:
    """(name, paths) per store to build: one per Kineto file, one per folder of files below
    ``kineto/<kind>/`` (the ranks of one job), each XPlane, the Kineto file of the execution
    trace pair (the ET itself is a graph, not a timeline)."""
    out: list[tuple[str, list[Path]]] = []
    kineto = root / "kineto"
    sets: dict[Path, list[Path]] = {}
    for p in sorted(kineto.rglob("*")):
        if not p.is_file() or not p.name.endswith((".json", ".json.gz")):
            continue
        key = p if p.parent.parent == kineto else p.parent
        sets.setdefault(key, []).append(p)
    for key, files in sets.items():
        name = str(key.relative_to(root)) + ("/" if key.is_dir() else "")
        out.append((name, [key] if key.is_dir() else files))
    for p in sorted((root / "xplane").glob("*.pb")):
        out.append((str(p.relative_to(root)), [p]))
    for p in sorted((root / "execution_trace").glob("*.kineto.json*")):
        out.append((str(p.relative_to(root)), [p]))
    return out


def capture_cpu_run(store: Path, steps: int = 5, warmup: int = 2) -> None:
    """The demo model's training loop on the CPU, ``steps`` steps recorded at level op."""
    from xpuprof.workloads.demo import Trainer

    trainer = Trainer()
    for _ in range(3):
        trainer.step()  # first-step allocations outside the capture
    with xpuprof.profile(store, level="op", steps=steps, warmup=warmup, model=trainer.model):
        for i in range(warmup + steps + 1):
            xpuprof.step(i)
            trainer.step()


def _num(x: Any) -> float | None:
    return None if x is None or pd.isna(x) else float(x)


def _step_sums(rp: Any) -> tuple[int | None, int | None]:
    s = rp.summary[rp.summary["steps"] > 0]
    if not len(s):
        return None, None
    return int(s["measured_ns"].sum()), int(s["simulated_ns"].sum())


def _pct(sim: float | None, meas: float | None) -> float | None:
    if sim is None or meas is None or meas <= 0:
        return None
    return 100.0 * (sim - meas) / meas


def _worst_span(rp: Any) -> float | None:
    s = pd.to_numeric(rp.summary["span_error_pct"], errors="coerce").dropna()
    return None if not len(s) else float(s.loc[s.abs().idxmax()])


def _top(df: pd.DataFrame, n: int = 3) -> list[dict[str, Any]]:
    rows = []
    for r in df.head(n).itertuples(index=False):
        rows.append({"rank": None if pd.isna(r.rank) else int(r.rank), "event": int(r.event),
                     "name": str(r.name), "level": str(r.level),
                     "deviation_ns": int(r.deviation_ns), "cause": str(r.cause)})  # fmt: skip
    return rows


def _variant(rp: Any) -> dict[str, Any]:
    meas, sim = _step_sums(rp)
    per_step = pd.to_numeric(rp.steps["error_pct"], errors="coerce").dropna()
    return {
        "measured_ns": meas,
        "simulated_ns": sim,
        "error_pct": _pct(sim, meas),
        "span_error_pct": _worst_span(rp),
        "step_errors_pct": [float(x) for x in per_step],
        "deviations": _top(rp.deviations),
    }


def measure(name: str, store: Path) -> dict[str, Any]:
    """Replay ``store`` three ways (module docstring) and collect the numbers."""
    with xpuprof.load(store) as trace:
        t = time.perf_counter()
        rp = replay(trace)
        seconds = time.perf_counter() - t
        typ = replay(trace, costs=TypicalDelays())  # the same graph (memoised on the trace)
        x2 = replay(trace, costs=Scaled(2.0))
        levels = trace.sql("select level, count(*) as n from events group by level")
        n_steps_all = int(levels.loc[levels["level"] == "step", "n"].sum())
        inferred = trace.sql(
            "select count(*) as n from events where level = 'step' and device >= 0"
        )["n"].iloc[0]
    g = rp.graph
    ident = _variant(rp)
    _, base = _step_sums(rp)
    _, doubled = _step_sums(x2)
    step_change = _pct(doubled, base)
    span, span2 = (int(r.summary["span_simulated_ns"].max()) if len(r.summary) else None
                   for r in (rp, x2))  # fmt: skip
    span_change = _pct(span2, span)
    change = step_change if base is not None else span_change
    un = rp.unmodelled.groupby("reason").size().sort_values(ascending=False)
    whole = len(rp.steps) > 0
    why = "" if whole else (
        f"{int(inferred)} steps inferred on device lines, not replayed as steps" if inferred
        else ("step spans outside the replay" if n_steps_all else "no step spans")
    )  # fmt: skip
    return {
        "trace": name,
        "ranks": [None if r is None else int(r) for r in g.ranks.values()],
        "parts": len(g.parts),
        "steps": int(rp.summary["steps"].sum()) if len(rp.summary) else 0,
        "whole_steps": whole,
        "why_not_whole": why,
        "nodes": len(g.nodes),
        "edges": len(g.edges),
        "edge_counts": g.edge_counts(),
        "replay_s": seconds,
        "identity": ident,
        "typical": _variant(typ),
        "typical_delays": g.typical.to_dict(orient="records"),
        "kernels_x2": {
            "step_change_pct": step_change,
            "span_change_pct": span_change,
            "ok": change is not None and -1e-9 <= change <= 100 + 1e-9,
        },
        "unmodelled": {str(k): int(v) for k, v in un.items()},
        "notes": list(rp.notes),
    }


def _agg(rows: list[dict[str, Any]], variant: str) -> dict[str, Any]:
    whole = [r for r in rows if r["whole_steps"] and r[variant]["error_pct"] is not None]
    errs = [abs(r[variant]["error_pct"]) for r in whole]
    steps = [abs(e) for r in whole for e in r[variant]["step_errors_pct"]]
    spans = [abs(r[variant]["span_error_pct"]) for r in rows
             if r[variant]["span_error_pct"] is not None]  # fmt: skip
    worst = max(whole, key=lambda r: abs(r[variant]["error_pct"]), default=None)
    if worst is not None and worst[variant]["error_pct"] == 0:
        worst = None  # every trace exact: no worst one to name
    return {
        "traces": len(whole),
        "median_error_pct": statistics.median(errs) if errs else None,
        "worst_error_pct": max(errs) if errs else None,
        "worst_trace": worst["trace"] if worst else None,
        "steps": len(steps),
        "median_step_error_pct": statistics.median(steps) if steps else None,
        "worst_step_error_pct": max(steps) if steps else None,
        "median_span_error_pct_all": statistics.median(spans) if spans else None,
        "worst_span_error_pct_all": max(spans) if spans else None,
    }


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def _ms(ns: int | None) -> str:
    return "—" if ns is None else f"{ns / 1e6:,.2f}"


def print_report(doc: dict[str, Any]) -> None:
    rows = doc["traces"]
    print(f"Replay fidelity — {doc['date']} — {doc['machine']}\n")
    print("| trace | ranks | steps | whole steps | measured ms | simulated ms | error % | "
          "span error % | nodes | edges | replay s | typical: error % | typical: span error % "
          "| kernels ×2: step Δ % | kernels ×2: span Δ % |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        i, t, x = r["identity"], r["typical"], r["kernels_x2"]
        ranks = ",".join("?" if k is None else str(k) for k in r["ranks"])
        print(
            f"| {r['trace']} | {ranks} | {r['steps']} | {'yes' if r['whole_steps'] else 'no'} | "
            f"{_ms(i['measured_ns'])} | {_ms(i['simulated_ns'])} | {_f(i['error_pct'], '{:+.3f}')}"
            f" | {_f(i['span_error_pct'], '{:+.4f}')} | {r['nodes']:,} | {r['edges']:,} | "
            f"{r['replay_s']:.2f} | {_f(t['error_pct'], '{:+.2f}')} | "
            f"{_f(t['span_error_pct'], '{:+.2f}')} | {_f(x['step_change_pct'], '{:+.1f}')} | "
            f"{_f(x['span_change_pct'], '{:+.1f}')}{'' if x['ok'] else ' **out of 0–100**'} |"
        )
    for label, key in (("identity", "identity"), ("typical delays", "typical")):
        a = doc["summary"][key]
        where = f" ({a['worst_trace']})" if a["worst_trace"] else ""
        print(
            f"\n**{label}**: over {a['traces']} traces with whole steps, |error| median "
            f"{_f(a['median_error_pct'], '{:.3f}')} %, worst {_f(a['worst_error_pct'], '{:.3f}')} "
            f"%{where}; over their {a['steps']} steps median "
            f"{_f(a['median_step_error_pct'], '{:.3f}')} %, worst "
            f"{_f(a['worst_step_error_pct'], '{:.3f}')} %; span |error| over all traces median "
            f"{_f(a['median_span_error_pct_all'], '{:.4f}')} %, worst "
            f"{_f(a['worst_span_error_pct_all'], '{:.3f}')} %."
        )
    bad = [r["trace"] for r in rows if not r["kernels_x2"]["ok"]]
    print(f"\nkernels ×2 within 0–100 %: {len(rows) - len(bad)} of {len(rows)}"
          + (f" (outside: {', '.join(bad)})" if bad else ""))  # fmt: skip
    print("\n### Per trace: largest start deviations (cause) and what was not modelled\n")
    for r in rows:
        print(f"**{r['trace']}** — edges: " + ", ".join(
            f"{k} {v:,}" for k, v in r["edge_counts"].items() if v))  # fmt: skip
        if not r["whole_steps"]:
            print(f"- steps: {r['why_not_whole']}")
        for label, key in (("identity", "identity"), ("typical", "typical")):
            dev = r[key]["deviations"]
            if not dev:
                print(f"- {label}: every replayed start reproduced")
            for d in dev:
                print(f"- {label}: {d['deviation_ns'] / 1e3:+,.1f} µs {d['level']} "
                      f"`{d['name'][:60]}` (event {d['event']}, rank {d['rank']}): "
                      f"{d['cause']}")  # fmt: skip
        for reason, n in r["unmodelled"].items():
            print(f"- unmodelled ×{n}: {reason}")
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", help="folder laid out like shared/traces")
    ap.add_argument("--no-capture", action="store_true", help="skip the CPU training capture")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args()
    root = traces_root(args.traces)
    if not root.is_dir():
        raise SystemExit(f"real traces not found at {root} (set XPUPROF_TEST_TRACES or --traces)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="xpuprof-fidelity-") as tmp:
        for i, (name, paths) in enumerate(trace_sets(root)):
            store = Path(tmp) / f"s{i}.store"
            xpuprof.import_traces(paths, store)
            rows.append(measure(name, store))
        if not args.no_capture:
            store = Path(tmp) / "cpu_capture.store"
            capture_cpu_run(store)
            rows.append(measure("capture: demo model, CPU, level=op (this run)", store))
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        "traces_root": str(root),
        "command": " ".join(["python", *sys.argv]),
        "traces": rows,
        "summary": {"identity": _agg(rows, "identity"), "typical": _agg(rows, "typical")},
    }
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
        return
    print_report(doc)


if __name__ == "__main__":
    main()

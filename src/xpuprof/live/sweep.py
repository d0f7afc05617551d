"""``xpuprof sweep``: models × batch sizes × dtypes, each measured leveled — XSP's model
characterisation, for PyTorch.

Why a process per configuration: one model's allocator state, threads and caches must not
leak into the next one's numbers; a configuration that crashes, runs out of memory or hangs
(``timeout``) is recorded as failed with its error and the sweep goes on; and each process's
peak resident memory is that configuration's own.

Each configuration (:func:`run_config`, in its own process) builds the workload
(:mod:`xpuprof.workloads.models`), measures it with :func:`xpuprof.live.leveled.leveled` into
``OUT/<model>-<dtype>-b<batch>/`` and then reads from those runs:

- the step time (median at the model level, with its interval), throughput, each level's
  overhead, what the layer run's units add up to;
- the share of the step per layer type: the layer run's leaf layers (module calls holding no
  other module call) by module class, and the rest of the step (backward, loss, optimizer and
  the glue between layers: forward spans only are recorded);
- the top ops (called from Python or a layer; op run) and kernels (kernel run, on a GPU), each
  with its share of that run's step;
- FLOPs and bytes per step from one more short run with shapes recorded (the roofline tool's
  cost model, never timed: its overhead enters no number), hence the arithmetic intensity and
  the achieved FLOP/s at the model level's step time; the roof of this machine's CPU is
  calibrated once per sweep (``hardware.calibrate``);
- the advisor's findings on the merged store (each unit timed by its own level's run).

Everything is written to ``config.json`` in the configuration's folder; :func:`sweep` gathers
them into the tables ``summary``, ``layer_types``, ``top_ops``, ``top_kernels``, ``findings``,
writes ``summary.parquet`` and ``sweep.json``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xpuprof.core.errors import XpuprofError
from xpuprof.live.levelmerge import plain_number

#: Rows kept per configuration in the ops and kernels tables.
TOP = 10
#: Steps of the shapes run (FLOPs and bytes per step).
SHAPE_STEPS = 3
#: The summary's columns: what a reader compares first (step, interval, throughput, memory)
#: before what explains it; ``work_flops``/``traffic_bytes`` are FLOPs and bytes per step.
#: Each configuration's runs are in ``OUT/<model>-<dtype>-b<batch>`` (:func:`folder_name`).
SUMMARY_COLUMNS = ("model", "batch", "dtype", "status", "step_ms", "ci_pct", "samples_per_s",
                   "peak_rss_bytes", "overhead_layer_pct", "overhead_op_pct",
                   "overhead_kernel_pct", "layer_sum_ms", "work_flops", "achieved_gflops",
                   "intensity", "traffic_bytes", "params", "seconds", "error")  # fmt: skip


def folder_name(model: str, batch: int, dtype: str) -> str:
    """``torchvision:resnet18``, 8, fp32 → ``torchvision-resnet18-fp32-b8``."""
    return f"{re.sub(r'[^A-Za-z0-9_.]+', '-', model).strip('-')}-{dtype}-b{batch}"


def sweep(
    models: Sequence[str],
    batches: Sequence[int],
    dtypes: Sequence[str] = ("fp32",),
    *,
    out: str | Path,
    levels: Sequence[str] = ("model", "layer", "op", "kernel"),
    device: str = "cpu",
    target: float = 0.02,
    min_steps: int = 10,
    max_steps: int = 40,
    timeout: float | None = 600,
    threads: int | None = None,
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
) -> Any:
    """Measure every configuration (module docstring) and gather the tables; returns a
    :class:`~xpuprof.core.result.Result`. ``progress(done, total, row)`` after each one."""
    from xpuprof.live.leveled import LEVELS
    from xpuprof.workloads.models import DTYPES

    if not models or not batches or not dtypes:
        raise XpuprofError("a sweep needs at least one model, batch size and dtype")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise XpuprofError(f"unknown dtype(s) {bad}; dtypes: {', '.join(DTYPES)}")
    if any(b < 1 for b in batches):
        raise XpuprofError(f"batch sizes must be ≥ 1, got {list(batches)}")
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad or "model" not in levels:
        raise XpuprofError(f"levels must include model and be among {', '.join(LEVELS)}; "
                           f"got {list(levels)}")  # fmt: skip
    root = Path(out)
    if root.exists() and any(root.iterdir()) and not (root / "sweep.json").exists():
        raise XpuprofError(f"{root}: exists, is not empty and holds no sweep.json; not "
                           "writing into it (choose another folder)")  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    roof = _machine_roof(device)
    configs = [{"model": m, "batch": int(b), "dtype": d, "device": device,
                "levels": list(levels), "target": target, "min_steps": min_steps,
                "max_steps": max_steps, "threads": threads,
                "folder": str(root / folder_name(m, int(b), d))}
               for m in models for d in dtypes for b in sorted(set(batches))]  # fmt: skip
    done: list[dict[str, Any]] = []
    for i, cfg in enumerate(configs):
        row = _run_one(cfg, timeout)
        done.append(row)
        if progress is not None:
            progress(i + 1, len(configs), row)
    res = gather(done, roof, levels)
    res.facts["out"] = str(root)
    _save(res, root)
    return res


def _machine_roof(device: str) -> dict[str, Any]:
    """This machine's CPU roof (peak FLOP/s, memory bandwidth), calibrated once, for the
    roofline chart; on a GPU the device table's entry is the roofline tool's business."""
    if device != "cpu":
        return {"device": device, "peak_gflops": None, "peak_gb_per_s": None}
    try:
        from xpuprof.hardware.calibrate import local_cpu

        spec = local_cpu()
    except Exception as e:  # noqa: BLE001 - the roof is optional; say why it is missing
        return {"device": f"CPU (roof not calibrated: {type(e).__name__}: {e})",
                "peak_gflops": None, "peak_gb_per_s": None}  # fmt: skip
    peak, bw = spec.flops.get("fp32"), spec.memory_bandwidth
    return {"device": f"CPU: {spec.name} ({os.cpu_count()} CPUs)",
            "peak_gflops": peak / 1e9 if peak else None,
            "peak_gb_per_s": bw / 1e9 if bw else None}  # fmt: skip


def _run_one(cfg: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """One configuration in its own process; its ``config.json``, or a failed row."""
    folder = Path(cfg["folder"])
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    t0 = time.monotonic()
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
    env.pop("XPUPROF_LEVEL", None)
    try:
        p = subprocess.run([sys.executable, "-m", "xpuprof.live.sweep", json.dumps(cfg)],
                           capture_output=True, text=True, timeout=timeout, env=env)  # fmt: skip
        error = None if p.returncode == 0 else _tail(p.stderr or p.stdout, p.returncode)
    except subprocess.TimeoutExpired:
        error = f"still running after {timeout:g} s; stopped"
    seconds = time.monotonic() - t0
    doc_path = folder / "config.json"
    doc = json.loads(doc_path.read_text()) if doc_path.is_file() else None
    if doc is None or doc.get("status") != "ok":
        why = (doc or {}).get("error") or error or "no result written"
        doc = {"model": cfg["model"], "batch": cfg["batch"], "dtype": cfg["dtype"],
               "status": "failed", "error": why}  # fmt: skip
    doc.setdefault("summary", {})
    doc["seconds"] = seconds
    doc["folder"] = folder.name  # under the sweep's folder (the fact ``out``)
    return doc


def _tail(text: str, code: int) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return f"exit {code}" + (": " + lines[-1][:300] if lines else "")


# -- one configuration (in its own process) ------------------------------------------------------


def run_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Build, measure and characterise one configuration; writes and returns ``config.json``
    (``status`` ok or failed with the error)."""
    folder = Path(cfg["folder"])
    doc: dict[str, Any] = {"model": cfg["model"], "batch": cfg["batch"], "dtype": cfg["dtype"]}
    try:
        doc.update(_measure(cfg, folder))
        doc["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - recorded for this configuration; the sweep goes on
        doc.update(status="failed", error=f"{type(e).__name__}: {e}")
    (folder / "config.json").write_text(json.dumps(doc, default=plain_number))
    return doc


def _measure(cfg: dict[str, Any], folder: Path) -> dict[str, Any]:
    import resource

    import torch

    from xpuprof.live.leveled import leveled
    from xpuprof.workloads.models import build

    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    w = build(cfg["model"], cfg["batch"], cfg["dtype"], cfg["device"])
    res = leveled(w.step, cfg["levels"], model=w.model, out=folder / "leveled",
                  target=cfg["target"], min_steps=cfg["min_steps"], max_steps=cfg["max_steps"],
                  samples=w.samples)  # fmt: skip
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    flops, nbytes = _shapes(w, folder)
    lv = res.levels.set_index("level")
    step_ms = float(lv.at["model", "median_ms"])

    def over(level: str) -> float | None:
        return float(lv.at[level, "overhead_pct"]) if level in lv.index else None

    summary = {
        "step_ms": step_ms, "ci_pct": float(lv.at["model", "ci_pct"]),
        "samples_per_s": w.samples / (step_ms / 1e3),
        "overhead_layer_pct": over("layer"), "overhead_op_pct": over("op"),
        "overhead_kernel_pct": over("kernel"),
        "layer_sum_ms": res.facts.get("layer_sum_ms"), "params": w.params,
        "peak_rss_bytes": peak_rss, "work_flops": flops, "traffic_bytes": nbytes,
        "intensity": flops / nbytes if flops and nbytes else None,
        "achieved_gflops": flops / (step_ms / 1e3) / 1e9 if flops else None,
    }  # fmt: skip
    return {"summary": summary, "notes": res.notes,
            "layer_types": layer_types(res.tree, step_ms * 1e6),
            "top_ops": top_units(res.tree, "op", step_of(res, "op")),
            "top_kernels": top_units(res.tree, "kernel", step_of(res, "kernel")),
            "findings": _findings(res)}  # fmt: skip


def step_of(res: Any, level: str) -> float | None:
    """The median step (ns) of ``level``'s run, or None if it did not run."""
    lv = res.levels.set_index("level")
    return float(lv.at[level, "median_ms"]) * 1e6 if level in lv.index else None


def layer_types(tree: Any, step_ns: float) -> list[dict[str, Any]]:
    """Time per step by module class of the leaf layers (layer run), and the rest of the step
    (module docstring), each with its share of ``step_ns``."""
    layers = tree[tree["level"] == "layer"]
    if not len(layers) or not step_ns:
        return []
    parents = set(layers["parent"])
    leaves = layers[~layers["key"].isin(parents)]
    by = leaves.groupby("type", sort=False)["time_ns"].sum().sort_values(ascending=False)
    rows = [{"type": str(t), "ms": ns / 1e6, "share_pct": 100 * ns / step_ns}
            for t, ns in by.items()]  # fmt: skip
    rest = step_ns - float(by.sum())
    rows.append({"type": "(rest of step: backward, loss, optimizer, glue)", "ms": rest / 1e6,
                 "share_pct": 100 * rest / step_ns})  # fmt: skip
    return rows


def top_units(tree: Any, level: str, step_ns: float | None) -> list[dict[str, Any]]:
    """The ``level`` units (ops called from Python or a layer; kernels) with the most time per
    step, by name, as measured by their own run, with their share of that run's step."""
    from xpuprof.live.levelmerge import shown

    if step_ns is None:
        return []
    t = shown(tree)
    t = t[(t["level"] == level) & (t["timed_by"] == level)]
    if not len(t):
        return []
    by = t.groupby("name", sort=False).agg(ns=("time_ns", "sum"), calls=("calls", "sum"))
    by = by.sort_values("ns", ascending=False).head(TOP)
    return [{level: str(n), "ms": r.ns / 1e6, "calls": float(r.calls),
             "share_pct": 100 * r.ns / step_ns} for n, r in by.iterrows()]  # fmt: skip


def _shapes(w: Any, folder: Path) -> tuple[float | None, float | None]:
    """FLOPs and bytes per step from a short run with shapes recorded (median over steps of
    the roofline tool's costed ops); None when nothing could be costed."""
    import shutil

    from xpuprof.live.profile import profile, step

    store = folder / "shapes.store"
    with profile(store, level="op", record_shapes=True, telemetry=False, kernels=False):
        for i in range(SHAPE_STEPS + 1):
            step(i)
            w.step()
    try:
        from xpuprof.analysis.roofline import roofline
        from xpuprof.trace.trace import Trace

        with Trace(store) as t:
            ops = roofline(t).tables["ops"]
        ops = ops[ops["step"] >= 1]
        if not len(ops):
            return None, None
        per = ops.groupby("step")[["flops", "bytes"]].sum()
        f, b = float(per["flops"].median()), float(per["bytes"].median())
        return (f or None), (b or None)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _findings(res: Any) -> list[dict[str, Any]]:
    """The advisor's findings on the merged store: each unit timed by its own level's run, so
    a gap between ops is not the op run's recording cost."""
    from xpuprof.advise.rules import advise
    from xpuprof.trace.trace import Trace

    with Trace(res.merged) as t:
        recs = advise(t).tables.get("recommendations")
    if recs is None or not len(recs):
        return []
    return [{"finding": str(r["finding"]), "recommendation": str(r["recommendation"])}
            for _, r in recs.iterrows()]  # fmt: skip


# -- gathering ------------------------------------------------------------------------------------


def gather(rows: list[dict[str, Any]], roof: dict[str, Any], levels: Sequence[str]) -> Any:
    """The per-configuration documents as the sweep's tables (module docstring)."""
    import pandas as pd

    from xpuprof.core.result import Presentation, Result

    summary, detail = [], {"layer_types": [], "top_ops": [], "top_kernels": [], "findings": []}
    notes: list[str] = []
    unstable = runs = 0
    for r in rows:
        ident = {"model": r["model"], "batch": r["batch"], "dtype": r["dtype"]}
        summary.append({**ident, "status": r["status"], "error": r.get("error"),
                        "seconds": r.get("seconds"), **r.get("summary", {}),
                        "folder": r.get("folder")})  # fmt: skip
        for name in detail:
            detail[name].extend({**ident, **x} for x in r.get(name, []))
        unstable += sum("not within" in n for n in r.get("notes", []))
        runs += len([lv for lv in levels if lv != "kernel" or device_run(r)])
    s = pd.DataFrame(summary).reindex(columns=list(SUMMARY_COLUMNS))
    failed = s[s["status"] != "ok"]
    for m, b, d, e in zip(failed["model"], failed["batch"], failed["dtype"], failed["error"],
                          strict=True):  # fmt: skip
        notes.insert(0, f"{m} batch {b} {d} failed: {e}")
    if unstable:
        notes.append(
            f"{unstable} of {runs} level runs stopped at their step limit before the 95 % "
            "interval of their median reached the target (ci_pct says how wide it is): on a "
            "noisy machine, overheads smaller than that are noise"
        )
    ok = s[s["status"] == "ok"]
    headline = (f"{len(ok)} of {len(s)} configurations measured"
                + (f"; fastest step {ok['step_ms'].min():.3g} ms, slowest "
                   f"{ok['step_ms'].max():.3g} ms" if len(ok) else ""))  # fmt: skip
    tables = {"summary": s, **{k: pd.DataFrame(v) for k, v in detail.items()}}
    present = {"summary": Presentation(title="Configurations", all_rows=True)}
    facts = {"headline": headline, "levels": ",".join(levels), **roof}
    return Result(tables=tables, notes=notes, facts=facts, present=present)


def device_run(row: dict[str, Any]) -> bool:
    """Whether a configuration measured the kernel level (a GPU run)."""
    return (row.get("summary") or {}).get("overhead_kernel_pct") is not None


def _save(res: Any, root: Path) -> None:
    """``summary.parquet`` and ``sweep.json`` (the Result's JSON document), atomically."""
    tmp = root / "summary.parquet.tmp"
    res.tables["summary"].to_parquet(tmp)
    tmp.replace(root / "summary.parquet")
    tmp = root / "sweep.json.tmp"
    tmp.write_text(json.dumps(res.to_dict(), default=plain_number))
    tmp.replace(root / "sweep.json")


def main(argv: list[str]) -> int:
    """The per-configuration process: ``python -m xpuprof.live.sweep CONFIG_JSON``."""
    doc = run_config(json.loads(argv[0]))
    if doc["status"] != "ok":
        print(doc.get("error"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

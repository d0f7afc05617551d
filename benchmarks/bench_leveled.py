"""Leveled measurement against plain timing (issue 13's targets), and the sweep's wall time.

For every built-in model (``xpuprof.workloads.models``), in its own process: a plain timing loop
(``time.perf_counter`` around each step, nothing else: the peer), then ``xpuprof.leveled`` over
the levels model, layer and op, then the plain loop again, then one single deep profile
(``xpuprof.profile(level="full")``: ops with shapes, memory and stacks, what a user runs when
they profile once). Printed per model, medians:

- the model level's step against the plain loops' (target: within 1 %);
- what the layer run's units add up to (its leaf-to-root layers plus the rest of its step)
  against the model level (target: within 3 %; this is the layer level's overhead);
- the op level's and the single deep profile's distortion of the step, for contrast.

``--sweep`` also times ``xpuprof sweep`` over every built-in at batch sizes 4, 8, 16 (target:
< 10 minutes), each configuration in its own process as the command runs it.

    python benchmarks/bench_leveled.py [--batch 8] [--threads 2] [--models mlp,gpt]
        [--sweep] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

#: Steps per plain timing block.
PLAIN = 40


def child(model: str, batch: int, threads: int) -> dict[str, Any]:
    import torch

    import xpuprof
    from xpuprof.live.leveled import leveled, median_interval
    from xpuprof.workloads.models import build

    torch.set_num_threads(threads)
    w = build(model, batch)

    def plain(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            w.step()
            out.append(time.perf_counter_ns() - t0)
        return out

    for _ in range(5):
        w.step()
    before = plain(PLAIN)
    with tempfile.TemporaryDirectory() as tmp:
        res = leveled(w.step, ("model", "layer", "op"), model=w.model, out=Path(tmp) / "lv",
                      warmup=0, max_steps=60, samples=w.samples)  # fmt: skip
        after = plain(PLAIN)
        deep = []
        with xpuprof.profile(Path(tmp) / "full.store", level="full", model=w.model,
                             telemetry=False):  # fmt: skip
            for i in range(PLAIN // 2 + 1):
                xpuprof.step(i)
                t0 = time.perf_counter_ns()
                w.step()
                deep.append(time.perf_counter_ns() - t0)
    lv = res.levels.set_index("level")
    plain_ms = median_interval(before + after)[0] / 1e6
    model_ms = float(lv.at["model", "median_ms"])
    return {
        "model": model, "batch": batch, "threads": threads,
        "plain_ms": plain_ms,
        "plain_before_ms": median_interval(before)[0] / 1e6,
        "plain_after_ms": median_interval(after)[0] / 1e6,
        "model_ms": model_ms, "model_ci_pct": float(lv.at["model", "ci_pct"]),
        "model_steps": int(lv.at["model", "steps"]),
        "model_vs_plain_pct": 100 * (model_ms / plain_ms - 1),
        "layer_sum_ms": res.facts.get("layer_sum_ms"),
        "layer_sum_vs_model_pct": 100 * (res.facts["layer_sum_ms"] / model_ms - 1)
        if res.facts.get("layer_sum_ms") else None,
        "op_ms": float(lv.at["op", "median_ms"]),
        "op_vs_plain_pct": 100 * (float(lv.at["op", "median_ms"]) / plain_ms - 1),
        "deep_ms": median_interval(deep[1:])[0] / 1e6,
        "deep_vs_plain_pct": 100 * (median_interval(deep[1:])[0] / 1e6 / plain_ms - 1),
    }  # fmt: skip


def measure(model: str, batch: int, threads: int) -> dict[str, Any]:
    p = subprocess.run([sys.executable, __file__, "--child", model, str(batch), str(threads)],
                       capture_output=True, text=True, env={**os.environ,
                       "TORCH_CPP_LOG_LEVEL": "ERROR"})  # fmt: skip
    if p.returncode != 0:
        return {"model": model, "error": (p.stderr or p.stdout).strip().splitlines()[-1:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def sweep_time(threads: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "xpuprof.ui.cli", "sweep", "-o",
                            str(Path(tmp) / "s"), "--batch", "4,8,16", "--threads",
                            str(threads), "--json"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
        seconds = time.monotonic() - t0
    if p.returncode != 0:
        return {"seconds": seconds, "error": p.stderr.strip().splitlines()[-1:]}
    rows = json.loads(p.stdout)["tables"]["summary"]
    return {"seconds": seconds, "configurations": len(rows),
            "failed": [f"{r['model']} b{r['batch']}" for r in rows if r["status"] != "ok"]}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
        return
    from xpuprof.workloads.models import BUILTIN

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=",".join(BUILTIN))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(m, args.batch, args.threads) for m in args.models.split(",")]
    doc: dict[str, Any] = {"rows": rows}
    if args.sweep:
        doc["sweep"] = sweep_time(args.threads)
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    print(f"batch {args.batch}, {args.threads} threads; medians; each model in its own process\n")
    print("| model | plain ms | model level ms (±CI %) | vs plain | layer sum vs model | "
          "op level vs plain | single deep profile vs plain |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | error: {r['error']} |||||| ")
            continue
        ls = r["layer_sum_vs_model_pct"]
        print(f"| {r['model']} | {r['plain_ms']:.2f} | {r['model_ms']:.2f} "
              f"(±{r['model_ci_pct']:.1f}) | {r['model_vs_plain_pct']:+.1f} % | "
              f"{'—' if ls is None else f'{ls:+.1f} %'} | {r['op_vs_plain_pct']:+.1f} % | "
              f"{r['deep_vs_plain_pct']:+.1f} % |")  # fmt: skip
    if args.sweep:
        s = doc["sweep"]
        print(f"\nsweep of the built-ins at batch 4, 8, 16: {s['seconds']:.0f} s "
              f"({s.get('configurations')} configurations, failed: {s.get('failed') or 'none'}"
              f"{', error: ' + str(s['error']) if 'error' in s else ''})")


if __name__ == "__main__":
    main()

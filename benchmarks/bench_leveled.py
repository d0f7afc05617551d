"""Leveled measurement against plain timing (issue 13's targets), and the sweep's wall time.

For every built-in model (``xpuprof.workloads.models``), in its own process, rounds of blocks of
steps: a plain timing loop (``time.perf_counter`` around each step, nothing else: the peer), then
``xpuprof.leveled`` at the model level, at the layer level and at the op level (each a leveled
run of exactly one block), then one single deep profile (``xpuprof.profile(level="full")``: ops
with shapes, memory and stacks, what a user runs when they profile once). This machine's speed
drifts by tens of % between consecutive loops (a shared VM), so each round starts and ends
with a plain block, each block is compared with the mean of its round's two, and the ratios'
median over the rounds is printed, with the two plain blocks against each other (A/A) as the
floor of what this machine can resolve:

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

#: Steps per block, and rounds of blocks (each round: plain, model, layer, op, deep profile).
STEPS, ROUNDS = 12, 15


def child(model: str, batch: int, threads: int) -> dict[str, Any]:
    """Rounds of blocks, each kind of block once per round in the same order; each kind's
    distortion is the median over rounds of (its block's median step / the round's plain
    block's median) − 1: the machine's drift between rounds cancels in the ratio."""
    import statistics

    import torch

    import xpuprof
    from xpuprof.live.leveled import leveled, median_interval
    from xpuprof.workloads.models import build

    torch.set_num_threads(threads)
    w = build(model, batch)

    def plain() -> float:
        out = []
        for _ in range(STEPS):
            t0 = time.perf_counter_ns()
            w.step()
            out.append(time.perf_counter_ns() - t0)
        return median_interval(out)[0]

    def level(name: str, tmp: Path) -> tuple[float, float | None]:
        res = leveled(w.step, (name,), model=w.model, out=tmp / name, warmup=0, settle=1,
                      min_steps=STEPS, max_steps=STEPS)  # fmt: skip
        return float(res.levels["median_ms"].iat[0]) * 1e6, res.facts.get("layer_sum_ms")

    def deep(tmp: Path) -> float:
        out = []
        with xpuprof.profile(tmp / "full.store", level="full", model=w.model, telemetry=False):
            for i in range(STEPS + 1):
                xpuprof.step(i)
                t0 = time.perf_counter_ns()
                w.step()
                out.append(time.perf_counter_ns() - t0)
        return median_interval(out[1:])[0]

    for _ in range(5):
        w.step()
    ratios: dict[str, list[float]] = {"model": [], "layer": [], "op": [], "deep": [],
                                      "layer_sum_vs_model": [], "plain_vs_plain": []}  # fmt: skip
    plains, models = [], []
    for _ in range(ROUNDS):
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            p1 = plain()
            m, _ = level("model", tmp)
            la, layer_sum = level("layer", tmp)
            op, _ = level("op", tmp)
            dp = deep(tmp)
            p2 = plain()
        p = (p1 + p2) / 2  # the round's plain step, bracketing its blocks
        plains.append(p)
        models.append(m)
        for k, v in (("model", m), ("layer", la), ("op", op), ("deep", dp)):
            ratios[k].append(v / p - 1)
        ratios["layer_sum_vs_model"].append(layer_sum * 1e6 / m - 1)
        ratios["plain_vs_plain"].append(p2 / p1 - 1)  # A/A: the machine's own noise

    def pct(k: str) -> float:
        return 100 * statistics.median(ratios[k])

    def spread(k: str) -> list[float]:
        q = statistics.quantiles(ratios[k], n=4)
        return [100 * q[0], 100 * q[2]]

    return {"model": model, "batch": batch, "threads": threads, "rounds": ROUNDS,
            "steps_per_block": STEPS, "plain_ms": statistics.median(plains) / 1e6,
            "model_ms": statistics.median(models) / 1e6,
            "model_vs_plain_pct": pct("model"), "model_vs_plain_iqr": spread("model"),
            "layer_sum_vs_model_pct": pct("layer_sum_vs_model"),
            "layer_sum_vs_model_iqr": spread("layer_sum_vs_model"),
            "plain_vs_plain_pct": pct("plain_vs_plain"),
            "plain_vs_plain_iqr": spread("plain_vs_plain"),
            "layer_vs_plain_pct": pct("layer"), "op_vs_plain_pct": pct("op"),
            "deep_vs_plain_pct": pct("deep")}  # fmt: skip


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
    print(f"batch {args.batch}, {args.threads} threads; each model in its own process; "
          f"{ROUNDS} rounds of {STEPS}-step blocks; median over rounds of each block's median "
          "step against the same round's plain block (interquartile range of the rounds)\n")
    print("| model | plain ms | A/A: plain vs plain | model level vs plain | layer sum vs model "
          "level | layer level vs plain | op level vs plain | single deep profile vs plain |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | error: {r['error']} |||||| ")
            continue
        mi, li = r["model_vs_plain_iqr"], r["layer_sum_vs_model_iqr"]
        ai = r["plain_vs_plain_iqr"]
        print(f"| {r['model']} | {r['plain_ms']:.2f} | {r['plain_vs_plain_pct']:+.1f} % "
              f"({ai[0]:+.1f}…{ai[1]:+.1f}) | {r['model_vs_plain_pct']:+.1f} % "
              f"({mi[0]:+.1f}…{mi[1]:+.1f}) | {r['layer_sum_vs_model_pct']:+.1f} % "
              f"({li[0]:+.1f}…{li[1]:+.1f}) | {r['layer_vs_plain_pct']:+.1f} % | "
              f"{r['op_vs_plain_pct']:+.1f} % | {r['deep_vs_plain_pct']:+.1f} % |")  # fmt: skip
    if args.sweep:
        s = doc["sweep"]
        print(f"\nsweep of the built-ins at batch 4, 8, 16: {s['seconds']:.0f} s "
              f"({s.get('configurations')} configurations, failed: {s.get('failed') or 'none'}"
              f"{', error: ' + str(s['error']) if 'error' in s else ''})")


if __name__ == "__main__":
    main()

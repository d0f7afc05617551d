"""Capture overhead on the demo model: step time under ``xpuprof.profile`` against the same loop
unprofiled, measured in one run (issue 3 targets: level ``step`` adds <= 1 %, ``layer`` <= 5 %).

Rounds alternate between the modes so drift of a shared machine hits all of them alike; each
round times ``--steps`` training steps and the per-step median of every round is kept; the
report gives the median over rounds and the ratio to unprofiled. The store writing after a
capture is outside the timed steps (it happens after the loop, as in real use).

    python benchmarks/bench_capture.py [--rounds 7] [--steps 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import xpuprof
from xpuprof.workloads.demo import Trainer

MODES = ("unprofiled", "step", "layer", "op")
TARGETS = {"step": 1.01, "layer": 1.05}


def timed_steps(trainer: Trainer, steps: int, mode: str, tmp: Path) -> list[float]:
    """Per-step wall times of ``steps`` steps in ``mode``."""
    times = []
    if mode == "unprofiled":
        for i in range(steps):
            t = time.perf_counter()
            xpuprof.step(i)
            trainer.step()
            times.append(time.perf_counter() - t)
        return times
    store = tmp / f"{mode}-{time.perf_counter_ns()}"
    with xpuprof.profile(store, level=mode, model=trainer.model):
        for i in range(steps):
            t = time.perf_counter()
            xpuprof.step(i)
            trainer.step()
            times.append(time.perf_counter() - t)
    shutil.rmtree(store, ignore_errors=True)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    modes = args.modes.split(",")
    trainer = Trainer()
    for _ in range(5):
        trainer.step()  # allocations and lazy initialisation happen in the first steps
    per_mode: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="xpuprof-bench-") as d:
        for _ in range(args.rounds):
            for m in modes:
                per_mode[m].append(statistics.median(timed_steps(trainer, args.steps, m, Path(d))))
    base = statistics.median(per_mode["unprofiled"])
    result: dict[str, Any] = {
        "machine": f"{platform.processor() or platform.machine()}, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "modes": {},
    }
    for m in modes:
        med = statistics.median(per_mode[m])
        result["modes"][m] = {
            "step_ms_median": med * 1e3,
            "step_ms_rounds": [round(x * 1e3, 3) for x in per_mode[m]],
            "ratio": med / base,
            "target": TARGETS.get(m),
            "met": None if m not in TARGETS else med / base <= TARGETS[m],
        }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"Capture overhead on the demo model — {result['date']} — {result['machine']}")
    print(f"{args.rounds} alternating rounds x {args.steps} steps; per-step median per round,")
    print("then the median over rounds.\n")
    print("| mode | step time (ms) | ratio to unprofiled | target | met |")
    print("|---|---|---|---|---|")
    for m, r in result["modes"].items():
        target = "" if r["target"] is None else f"<= {r['target']:.2f}"
        met = "" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"| {m} | {r['step_ms_median']:.2f} | {r['ratio']:.3f} | {target} | {met} |")


if __name__ == "__main__":
    main()

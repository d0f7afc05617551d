"""What-if predictions against real runs on this CPU (issue 12, "Validation that anyone can
rerun"; the cases that the what-if changes of this version can express).

A small PyTorch training loop (an MLP on random data, fed by a ``DataLoader`` whose collate
function spends ``--collate-ms`` of CPU time per batch, as a slow Python collate does) is run
three ways, each as a plain timing loop (``time.perf_counter`` around each step, no profiler)
and the baseline also under ``xpuprof.profile(level="op")``:

* **baseline**: ``num_workers=0``, the slow collate;
* **input removed**: the batches made before the loop (no DataLoader in the step at all) —
  predicted from the baseline trace alone by ``no-input-wait``;
* **2 workers**: ``num_workers=2``, the slow collate in worker processes — predicted by
  ``dataloader-workers=2``.

A GPU case from the shared traces, when ``../shared/traces`` (or ``$XPUPROF_TEST_TRACES``) is
there: ResNet-50 on a V100 (2021) with ``num_workers=0`` and with ``num_workers=4`` — the second
predicted from the first by ``dataloader-workers=4`` and compared with its recorded steps
(mean and median of the host step spans; the traces are the measurements, nothing is rerun).

A prediction is the unprofiled baseline step minus the time the replay says the change saves
(baseline replay − changed replay, mean step): profiling at level ``op`` inflates the ops, not
the Python time outside them that these changes remove, so the saving in ns carries over to
the unprofiled run where a ratio would not (the ratio-based prediction is printed beside it).
The error is (predicted − measured) / measured of the unprofiled mean step. Medians over
``--runs``.

    python benchmarks/whatif_validation.py [--runs 3] [--steps 12] [--collate-ms 25] [--json]
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: The modules of ``benchmarks/whatif_cases`` run after the input-pipeline cases above.
CASE_MODULES = ("batch", "threads", "fusion", "cuda")


def _busy(ms: float) -> None:
    """CPU work in Python for ``ms`` (what a slow collate does: per-sample Python)."""
    end = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < end:
        x += 1


class _Collate:
    """A picklable collate (workers need one) that stacks the batch after ``ms`` of CPU work."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, batch: list) -> tuple:
        import torch

        if self.ms:
            _busy(self.ms)
        xs, ys = zip(*batch, strict=True)
        return torch.stack(xs), torch.stack(ys)


def _loop(collate_ms: float, workers: int, steps: int, warmup: int,
          store: Path | None = None) -> list[float]:  # fmt: skip
    """Run the training loop; step times (s) after warm-up. With ``store``, under
    ``xpuprof.profile(level="op")`` with those warm-up and steps. ``workers`` -1: no
    DataLoader in the loop (every batch made beforehand)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    torch.set_num_threads(1)
    n = (steps + warmup + 2) * 64
    data = TensorDataset(torch.randn(n, 512), torch.randint(0, 10, (n,)))
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=64, collate_fn=_Collate(collate_ms),
                        num_workers=max(workers, 0), persistent_workers=workers > 0)  # fmt: skip
    if workers < 0:
        loader = list(loader)
    it = iter(loader)

    def step(i: int) -> None:
        x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    from whatif_cases.loop import timed_steps

    return timed_steps(step, steps, warmup, store, model=model)[0]


def run(args: argparse.Namespace) -> dict:
    import xpuprof
    from xpuprof.sim.whatif import whatif

    cases = {"input removed": ("no-input-wait", args.collate_ms, -1),
             "2 workers": ("dataloader-workers=2", args.collate_ms, 2)}  # fmt: skip
    rows = {name: {"predicted": [], "predicted_by_ratio": [], "measured": [],
                   "speedup_predicted": [], "speedup_measured": []} for name in cases}  # fmt: skip
    for r in range(args.runs):
        base_t = statistics.mean(_loop(args.collate_ms, 0, args.steps, 2))
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "base.store"
            _loop(args.collate_ms, 0, args.steps, 2, store)
            with xpuprof.load(store) as trace:
                preds = {name: whatif(trace, [change]).summary for name, (change, _, _)
                         in cases.items()}  # fmt: skip
        for name, (_, ms, workers) in cases.items():
            s = preds[name]
            speedup = float(s["baseline_ns"].mean() / s["predicted_ns"].mean())
            saved = float(s["baseline_ns"].mean() - s["predicted_ns"].mean()) * 1e-9
            measured = statistics.mean(_loop(ms, workers, args.steps, 2))
            rows[name]["predicted"].append(base_t - saved)
            rows[name]["predicted_by_ratio"].append(base_t / speedup)
            rows[name]["measured"].append(measured)
            rows[name]["speedup_predicted"].append(base_t / (base_t - saved))
            rows[name]["speedup_measured"].append(base_t / measured)
        print(f"run {r + 1}/{args.runs} done (baseline {base_t * 1e3:.1f} ms)", file=sys.stderr)
    out = {
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "collate_ms": args.collate_ms, "steps": args.steps, "runs": args.runs, "cases": {},
    }  # fmt: skip
    for name, (change, _, _) in cases.items():
        row = {k: statistics.median(v) for k, v in rows[name].items()}
        row["change"] = change
        out["cases"][name] = row
    for mod in CASE_MODULES:
        if args.only and mod not in args.only:
            continue
        print(f"cases: {mod} …", file=sys.stderr)
        out["cases"].update(importlib.import_module(f"whatif_cases.{mod}").run(args))
    for row in out["cases"].values():
        row["error_pct"] = 100 * (row["predicted"] - row["measured"]) / row["measured"]
    errs = [abs(c["error_pct"]) for c in out["cases"].values()]
    out["median_error_pct"], out["worst_error_pct"] = statistics.median(errs), max(errs)
    return out


def resnet_pair() -> dict | None:
    """Predict the num_workers=4 ResNet-50 trace from the num_workers=0 one (module
    docstring); None without the shared traces."""
    import os

    import xpuprof
    from xpuprof.sim import replay
    from xpuprof.sim.whatif import whatif

    root = Path(os.environ.get("XPUPROF_TEST_TRACES") or ROOT.parent / "shared" / "traces")
    d = root / "kineto" / "gpu" / "resnet50_v100_2021"
    if not (d / "num_workers_0.pt.trace.json.gz").exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        stores = {}
        for n in (0, 4):
            stores[n] = Path(tmp) / f"w{n}.store"
            xpuprof.import_traces([d / f"num_workers_{n}.pt.trace.json.gz"], stores[n])
        with xpuprof.load(stores[0]) as t0:
            w = whatif(t0, ["dataloader-workers=4"])
            predicted = w.steps["predicted_ns"].to_numpy() / 1e6
            baseline = w.steps["baseline_ns"].to_numpy() / 1e6
        with xpuprof.load(stores[4]) as t4:
            measured = replay(t4).steps["measured_ns"].to_numpy() / 1e6
    row = {"change": "dataloader-workers=4", "baseline_ms": float(statistics.mean(baseline)),
           "predicted_ms": float(statistics.mean(predicted)),
           "measured_ms": float(statistics.mean(measured)),
           "predicted_median_ms": float(statistics.median(predicted)),
           "measured_median_ms": float(statistics.median(measured)),
           "measured_steps_ms": [round(float(x), 1) for x in measured]}  # fmt: skip
    row["error_pct"] = 100 * (row["predicted_ms"] - row["measured_ms"]) / row["measured_ms"]
    row["error_median_pct"] = (
        100 * (row["predicted_median_ms"] - row["measured_median_ms"]) / (row["measured_median_ms"])
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--collate-ms", type=float, default=25.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--only",
        nargs="*",
        default=None,
        help=f"case modules to run besides the input cases: {', '.join(CASE_MODULES)}",
    )
    args = ap.parse_args()
    res = run(args)
    res["resnet50_pair"] = resnet_pair()
    if args.json:
        print(json.dumps(res, indent=1))
        return
    print(f"What-if validation — {res['date']} — {res['machine']}; collate {res['collate_ms']} "
          f"ms, {res['steps']} steps, median of {res['runs']} runs\n")  # fmt: skip
    print(
        "| case | change | predicted ms | measured ms | error % | speedup predicted | "
        "speedup measured | predicted by ratio ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, c in res["cases"].items():
        print(f"| {name} | `{c['change']}` | {c['predicted'] * 1e3:.2f} | "
              f"{c['measured'] * 1e3:.2f} | {c['error_pct']:+.1f} | "
              f"{c['speedup_predicted']:.2f} | {c['speedup_measured']:.2f} | "
              + (f"{c['predicted_by_ratio'] * 1e3:.2f} |" if "predicted_by_ratio" in c
                 else "– |"))  # fmt: skip
    for name, c in res["cases"].items():
        if c.get("note"):
            print(f"- {name}: {c['note']}")
    print(f"\n|error| median {res['median_error_pct']:.1f} %, worst {res['worst_error_pct']:.1f} %")
    r = res["resnet50_pair"]
    if r is None:
        print("\nResNet-50 pair: ../shared/traces not found, skipped")
        return
    print(
        f"\nResNet-50 V100 (shared traces), num_workers 0 → 4 by `{r['change']}`: mean step "
        f"{r['baseline_ms']:.1f} ms → predicted {r['predicted_ms']:.1f} ms, recorded "
        f"{r['measured_ms']:.1f} ms ({r['error_pct']:+.1f} %); median predicted "
        f"{r['predicted_median_ms']:.1f} ms, recorded {r['measured_median_ms']:.1f} ms "
        f"({r['error_median_pct']:+.1f} %); recorded steps {r['measured_steps_ms']} ms"
    )


if __name__ == "__main__":
    main()

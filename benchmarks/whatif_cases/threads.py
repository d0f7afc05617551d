"""``torch.set_num_threads`` 2 → 1, predicted by ``threads=1`` (issue 12's validation list).

A real CPU training loop whose GEMMs are big enough for MKL to thread them and whose
elementwise ops are above ATen's grain size (32,768 elements): an MLP 1024 → 1024 → 1024 →
1024 → 10 with ReLUs, batch 64 (64×1024 activations: 2 grains), cross-entropy, SGD, on
batches made before the loop (no DataLoader: only the intra-op threads differ). Per run:

1. baseline, ``torch.set_num_threads(2)``: a plain timing loop (``time.perf_counter`` per
   step, no profiler), then the same loop captured with ``xpuprof.profile(level="op",
   record_shapes=True)`` — the shapes tell ``threads=`` which ops ATen and MKL parallelise;
2. the prediction, from that trace alone: ``whatif(trace, ["threads=1"])`` (the capture
   records ``torch.get_num_threads()`` = 2 and the CPUs the process could use);
3. the changed program, ``torch.set_num_threads(1)``: the plain timing loop.

Profiling overhead: the profiler (and record_shapes) adds a fixed cost to every op, on the
serial side of the model — it does not change with the thread count — so the prediction is
the unprofiled baseline step plus the time the replay says the change *adds* (replay with
the change − baseline replay, mean step, ns), as the input-pipeline cases carry their
saving; the ratio-based prediction (unprofiled baseline ÷ predicted speedup) is printed beside
it. The error is (predicted − measured) / measured of the unprofiled mean step; medians over
``args.runs``. The step needs 2 CPUs to mean anything (with 1 CPU both runs use one).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Width of the MLP's hidden layers and the batch (module docstring).
WIDTH, BATCH, LAYERS = 1024, 64, 3
#: The recorded and the changed intra-op thread counts.
OLD, NEW = 2, 1


def _loop(threads: int, steps: int, warmup: int, store: Path | None = None) -> list[float]:
    """The training loop with ``threads`` intra-op threads; step times (s) after warm-up.
    With ``store``: under ``xpuprof.profile(level="op", record_shapes=True)``."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [(torch.randn(BATCH, WIDTH), torch.randint(0, 10, (BATCH,)))
               for _ in range(steps + warmup)]  # fmt: skip

    def step(i: int) -> None:
        x, y = batches[i]
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    from whatif_cases.loop import timed_steps

    return timed_steps(step, steps, warmup, store, record_shapes=True, telemetry=False)[0]


def run(args: Any) -> dict[str, dict]:
    import torch

    import xpuprof
    from xpuprof.sim.whatif import whatif

    change = f"threads={NEW}"
    keys = ("predicted", "predicted_by_ratio", "measured", "speedup_predicted",
            "speedup_measured", "baseline")  # fmt: skip
    rows: dict[str, list[float]] = {k: [] for k in keys}
    threads = torch.get_num_threads()
    note = ""
    try:
        for r in range(args.runs):
            base_t = statistics.mean(_loop(OLD, args.steps, 2))
            with tempfile.TemporaryDirectory() as tmp:
                store = Path(tmp) / "threads.store"
                _loop(OLD, args.steps, 2, store)
                with xpuprof.load(store) as trace:
                    w = whatif(trace, [change])
                    s = w.summary
                    note = w.notes[0]
            base_ns, pred_ns = float(s["baseline_ns"].mean()), float(s["predicted_ns"].mean())
            added = (pred_ns - base_ns) * 1e-9
            measured = statistics.mean(_loop(NEW, args.steps, 2))
            rows["baseline"].append(base_t)
            rows["predicted"].append(base_t + added)
            rows["predicted_by_ratio"].append(base_t * pred_ns / base_ns)
            rows["measured"].append(measured)
            rows["speedup_predicted"].append(base_t / (base_t + added))
            rows["speedup_measured"].append(base_t / measured)
            print(f"threads run {r + 1}/{args.runs}: {OLD} threads {base_t * 1e3:.2f} ms "
                  f"(profiled replay {base_ns / 1e6:.2f} → {pred_ns / 1e6:.2f} ms), predicted "
                  f"{(base_t + added) * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms "
                  f"with {NEW}", file=sys.stderr)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    row: dict[str, Any] = {k: statistics.median(v) for k, v in rows.items()}
    row["change"] = change
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    row["note"] = (f"MLP {LAYERS}×{WIDTH} batch {BATCH}; baseline {OLD} threads "
                   f"{row['baseline'] * 1e3:.2f} ms; {note}"
                   + (f"; only {cpus} CPU: both runs use one" if (cpus or 1) < OLD
                      else ""))  # fmt: skip
    return {f"threads {OLD} → {NEW}": row}

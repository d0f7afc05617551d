"""Batch size × 2 and × ½, predicted by ``batch=2`` and ``batch=0.5`` (issue 12's validation
list).

A real CPU training loop, ``torch.set_num_threads(1)``: an MLP 512 → 1024 → 1024 → 10 with
ReLUs, cross-entropy, SGD, fed by a ``DataLoader`` (``num_workers=0``, the default collate:
per-sample indexing of a ``TensorDataset`` and a stack — the input pipeline's per-sample work)
at batch :data:`BATCH` = 64. Per run:

1. baseline, batch 64: a plain timing loop (``time.perf_counter`` around each step, the batch
   fetch included; no profiler), then the same loop captured with ``xpuprof.profile(
   level="op", record_shapes=True)`` (``batch=`` needs the shapes);
2. the predictions, from that trace alone: ``whatif(trace, ["batch=2"])`` and
   ``["batch=0.5"]``;
3. the changed programs, batch 128 and batch 32: the plain timing loop.

Profiling overhead, per component, as it behaves:

- the ops: the profiler (and record_shapes) adds a fixed cost to every op; it does not grow
  with the batch (it is in each class's fixed part a and in each op's measured T, never
  multiplied by the transform), so their change is carried in ns — the unprofiled baseline
  step plus the time the replay says the change adds or saves, as the input-pipeline cases
  carry their saving;
- the input pipeline: its recorded events (an ``aten::select`` per sample and tensor, the
  stack) multiply with the batch, and so does the profiler's cost of each: the profiled input
  spans are several times the unprofiled fetch, and the transform scales them × FACTOR. Their
  change is carried as a ratio: the replay's change of the input spans × (unprofiled fetch ÷
  profiled input spans), the fetch timed by a stopwatch around ``next(loader)`` in the
  baseline's timing loop (the baseline, not the changed program).

The replay's change is split into the two by a second what-if limited to the input spans
(``batch:INPUT_PATTERN=FACTOR``: the scope holds no costed op outside them). Printed beside:
``predicted_by_ratio`` (unprofiled baseline ÷ predicted speedup: scales every overhead with
the step) and ``predicted_all_ns`` (the whole change carried in ns: the input's profiler
overhead × (FACTOR − 1) counted as work). The error is (predicted − measured) / measured of
the unprofiled mean step; medians over ``args.runs``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The recorded batch size and the MLP's widths (module docstring).
BATCH, IN, HIDDEN, CLASSES = 64, 512, 1024, 10
#: case → (change, new batch size).
CASES = {"batch ×2": ("batch=2", 2 * BATCH), "batch ×½": ("batch=0.5", BATCH // 2)}


def _loop(batch: int, steps: int, warmup: int,
          store: Path | None = None) -> tuple[list[float], list[float]]:  # fmt: skip
    """The training loop at ``batch``; step times and batch-fetch times (s) after warm-up.
    With ``store``: under ``xpuprof.profile(level="op", record_shapes=True)``."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)
    n = (steps + warmup + 2) * batch
    data = TensorDataset(torch.randn(n, IN), torch.randint(0, CLASSES, (n,)))
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                                torch.nn.Linear(HIDDEN, CLASSES))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(DataLoader(data, batch_size=batch))

    def step(i: int) -> float:
        t0 = time.perf_counter()
        x, y = next(it)
        fetched = time.perf_counter() - t0
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return fetched

    from whatif_cases.loop import timed_steps

    return timed_steps(step, steps, warmup, store, record_shapes=True, model=model,
                       telemetry=False)  # fmt: skip


def _mean_step(w: Any) -> tuple[float, float]:
    """Baseline and predicted mean step (ns) of a what-if."""
    s = w.summary
    return float(s["baseline_ns"].mean()), float(s["predicted_ns"].mean())


def run(args: Any) -> dict[str, dict]:
    """The two cases (module docstring): case → row of medians over ``args.runs``."""
    import xpuprof
    from xpuprof.sim.whatif import INPUT_PATTERN, whatif

    keys = ("predicted", "predicted_by_ratio", "predicted_all_ns", "measured",
            "speedup_predicted", "speedup_measured", "baseline", "profiled_baseline",
            "fetch_unprofiled", "input_profiled")  # fmt: skip
    rows: dict[str, dict[str, list[float]]] = {c: {k: [] for k in keys} for c in CASES}
    notes: dict[str, str] = {}
    for r in range(args.runs):
        steps, fetch = _loop(BATCH, args.steps, 2)
        base_t, fetch_t = statistics.mean(steps), statistics.mean(fetch)
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "base.store"
            _loop(BATCH, args.steps, 2, store)
            with xpuprof.load(store) as trace:
                preds = {}
                for c, (ch, _) in CASES.items():
                    factor = ch.partition("=")[2]
                    preds[c] = (whatif(trace, [ch]),
                                whatif(trace, [f"batch:{INPUT_PATTERN}={factor}"]))  # fmt: skip
        for case, (change, new) in CASES.items():
            factor = float(change.partition("=")[2])
            w, w_in = preds[case]
            base_ns, pred_ns = _mean_step(w)
            d_all = (pred_ns - base_ns) * 1e-9
            d_in = (_mean_step(w_in)[1] - _mean_step(w_in)[0]) * 1e-9
            input_prof = d_in / (factor - 1)  # the profiled input spans per step (s)
            predicted = base_t + (d_all - d_in) + d_in * fetch_t / input_prof
            measured = statistics.mean(_loop(new, args.steps, 2)[0])
            row = rows[case]
            for k, v in (("baseline", base_t), ("profiled_baseline", base_ns * 1e-9),
                         ("predicted", predicted), ("predicted_all_ns", base_t + d_all),
                         ("predicted_by_ratio", base_t * pred_ns / base_ns),
                         ("measured", measured), ("speedup_predicted", base_t / predicted),
                         ("speedup_measured", base_t / measured),
                         ("fetch_unprofiled", fetch_t),
                         ("input_profiled", input_prof)):  # fmt: skip
                row[k].append(v)
            notes[case] = (f"profiled step {base_ns / 1e6:.2f} ms, unprofiled {base_t * 1e3:.2f}"
                           f" ms; input spans {input_prof * 1e3:.2f} ms profiled, fetch "
                           f"{fetch_t * 1e3:.2f} ms unprofiled; all carried in ns "
                           f"{(base_t + d_all) * 1e3:.2f} ms; {w.notes[0]}")  # fmt: skip
        print(f"batch run {r + 1}/{args.runs} done (baseline {base_t * 1e3:.1f} ms)",
              file=sys.stderr)  # fmt: skip
    out = {}
    for case, (change, _) in CASES.items():
        row: dict[str, Any] = {k: statistics.median(v) for k, v in rows[case].items()}
        row["change"] = change
        row["note"] = notes[case]
        out[case] = row
    return out

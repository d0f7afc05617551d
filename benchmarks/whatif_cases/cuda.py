"""CUDA cases of the what-if validation (issue 12: "When a GPU is available the same script
adds CUDA cases"); without a CUDA device ``run`` returns nothing and says so.

Not yet run: no GPU was lent to the session that wrote it. Its first run on a GPU is its
check; until then no number in ``benchmarks/RESULTS.md`` comes from it.

The program: an MLP (4 × Linear 4096→4096 + ReLU, fp32) trained with SGD at batch 256 on a
CUDA device. Each step copies its batch from pageable host memory with a blocking ``.to()``
and reads the loss back with ``.item()`` — the two habits the advisor's ``host-blocked`` rule
is about. The baseline is timed unprofiled (``torch.cuda.synchronize`` around each step) and
captured with ``xpuprof.profile(level="op", record_shapes=True)``; each case is predicted from
that trace alone and then run unprofiled:

* **async copy**: the batch in pinned memory, ``non_blocking=True`` — predicted by the change
  the advisor's ``host-blocked`` finding carries (``advise(predict=True)``), or by
  ``no-sync:^cudaMemcpyAsync$`` when the advisor has no such finding (the row says which);
* **bf16**: ``torch.autocast("cuda", torch.bfloat16)`` — predicted by ``dtype=bf16``;
* **CUDA graphs**: forward, backward and the optimizer step captured once in a
  ``torch.cuda.CUDAGraph`` (static input; the copy and ``.item()`` outside it) and replayed —
  predicted by ``cuda-graphs``.

Prediction: the unprofiled baseline minus the saving the replay predicts (its run step, with
the device work: ``advise.predict.run_step``); the ratio-based prediction beside it.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

WIDTH, BATCH, LAYERS = 4096, 256, 4


def _setup(mode: str) -> tuple[Any, ...]:
    import torch

    torch.manual_seed(0)
    dev = torch.device("cuda")
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    xs = torch.randn(8, BATCH, WIDTH)
    ys = torch.randn(8, BATCH, WIDTH)
    if mode == "async":
        xs, ys = xs.pin_memory(), ys.pin_memory()
    return model, opt, xs, ys


def _loop(mode: str, steps: int, warmup: int, store: Path | None = None) -> list[float]:
    """Step times (s) after warm-up; ``store``: captured (baseline only)."""
    import torch

    model, opt, xs, ys = _setup(mode)
    dev = torch.device("cuda")
    non_blocking = mode == "async"
    graph = None
    if mode == "graphs":
        sx, sy = xs[0].to(dev), ys[0].to(dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm up on a side stream before capture (CUDA docs)
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(model(sx), sy).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = torch.nn.functional.mse_loss(model(sx), sy)
            static_loss.backward()
            opt.step()

    def step(i: int) -> None:
        x = xs[i % len(xs)].to(dev, non_blocking=non_blocking)
        y = ys[i % len(ys)].to(dev, non_blocking=non_blocking)
        if graph is not None:
            sx.copy_(x)
            sy.copy_(y)
            graph.replay()
            loss = static_loss
        else:
            with torch.autocast("cuda", torch.bfloat16, enabled=mode == "bf16"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        loss.item()
        torch.cuda.synchronize()

    from whatif_cases.loop import timed_steps

    return timed_steps(step, steps, warmup, store, before=torch.cuda.synchronize,
                       record_shapes=True)[0]  # fmt: skip


def _copy_change(trace: Any) -> tuple[str, str]:
    """The advisor's change for the blocking copy, and where it came from."""
    from xpuprof.advise.rules import advise

    rec = advise(trace, predict=True)["recommendations"]
    row = rec[rec["rule"] == "host-blocked"]
    if len(row) and isinstance(row["change"].iloc[0], str):
        return row["change"].iloc[0], "the advisor's host-blocked change"
    return "no-sync:^cudaMemcpyAsync$", "no host-blocked finding: the copy's waits removed"


def run(args: Any) -> dict[str, dict]:
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        print("cuda cases: no CUDA device here: skipped", file=sys.stderr)
        return {}
    import xpuprof
    from xpuprof.advise.predict import run_step
    from xpuprof.sim.whatif import whatif

    cases = {"async copy": "async", "bf16": "bf16", "CUDA graphs": "graphs"}
    got: dict[str, dict[str, list[float]]] = {c: {} for c in cases}
    notes: dict[str, str] = {}
    changes: dict[str, str] = {"bf16": "dtype=bf16", "CUDA graphs": "cuda-graphs"}
    for _ in range(args.runs):
        base_t = statistics.mean(_loop("base", args.steps, 3))
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "cuda.store"
            _loop("base", args.steps, 3, store)
            with xpuprof.load(store) as trace:
                changes["async copy"], notes["async copy"] = _copy_change(trace)
                part = int(trace.sources[0]["part"])
                pred = {}
                for name in cases:
                    w = whatif(trace, changes[name].split("; "))
                    pred[name] = run_step(w, part)
        for name, mode in cases.items():
            measured = statistics.mean(_loop(mode, args.steps, 3))
            row = got[name]
            if pred[name] is None:
                notes[name] = "the replay has no steps"
                continue
            b, p, _ = pred[name]
            saved = (b - p) * 1e-9
            for k, v in (("predicted", base_t - saved), ("predicted_by_ratio", base_t * p / b),
                         ("measured", measured), ("speedup_measured", base_t / measured),
                         ("speedup_predicted", base_t / (base_t - saved))):  # fmt: skip
                row.setdefault(k, []).append(v)
    out = {}
    for name, row in got.items():
        if not row:
            continue
        out[f"cuda: {name}"] = {**{k: statistics.median(v) for k, v in row.items()},
                                "change": changes[name], "note": notes.get(name, "")}  # fmt: skip
    return out

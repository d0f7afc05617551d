"""Fusion what-ifs against real CPU runs (issue 12's validation list): manual attention →
``scaled_dot_product_attention`` predicted by ``fuse:REGEX``, and elementwise chains fused by
``torch.compile`` predicted by ``fuse-elementwise``.

Both are inference loops (``torch.no_grad()``, ``torch.set_num_threads(1)``) over batches made
beforehand. Per run:

1. the baseline (eager) program: a plain timing loop (``time.perf_counter`` per step, no
   profiler), then the same loop captured with ``xpuprof.profile(level="op",
   record_shapes=True, model=...)`` (the shapes give the ops' FLOPs and bytes; ``model=`` gives
   the layer spans ``fuse:`` names);
2. the prediction, from that trace alone: ``whatif(trace, [change])``;
3. the changed program: the same plain timing loop.

Before the runs each program runs a few steps untimed: a process's first loops are slower (the
allocator maps fresh pages for the large activations until its thresholds settle: measured
here, 81 ms for the first eager loop of the torch.compile case against 40 ms for the next).

**SDPA**: a 2-block pre-norm transformer (d = :data:`D_MODEL`, :data:`HEADS` heads, sequence
:data:`SEQ`, batch :data:`BATCH`) whose attention core — ``q @ k.transpose(-2, -1)``,
``/ sqrt(d_head)``, ``softmax``, ``@ v`` — is a module of its own (``blocks.N.attn.core``),
predicted by ``fuse:attn\\.core$`` (the core's layer spans fused into one op of the ``matmul``
class); measured with the core calling ``torch.nn.functional.scaled_dot_product_attention``.

**torch.compile**: an MLP stack (d = :data:`MLP_D`, hidden 4d, :data:`MLP_ROWS` rows) whose
hidden activations go through a manual gated swish (``h * sigmoid(h) * scale + shift``) and a
manual tanh-GELU (``0.5 * h * (1 + tanh(0.79788 * (h + 0.044715 * h³)))``): chains of
elementwise ops between the GEMMs, predicted by ``fuse-elementwise``; measured with
``torch.compile(model)`` (inductor's C++ backend; compiled during the warm-up, timed after).
Inductor also removes the Python between the ops and may fuse a GEMM's bias: the transform
prices only the chains.

**Profiling overhead.** The profiler (with ``record_shapes``) adds a cost to every op call it
records; fusion removes op calls, so the replay's saving includes the profiler's cost of the
removed calls, which the unprofiled program never paid. The prediction carries the saving in
ns to the unprofiled baseline (as the other cases do) *less that cost*: ω = (profiled fastest
step − unprofiled fastest step) / (op and layer events recorded per step), the profiler's cost
per recorded event measured on the baseline pair (the fastest steps: the least disturbed by
other processes; a difference of medians of two runs seconds apart swung ω from 0 to 400 µs
on the shared machine), times the op events the change removes per step
(every op event inside the fused ops, nested ones included, less one per fused region). Beside
it: the saving carried uncorrected (``predicted_saving_ns``) and the ratio (unprofiled baseline
÷ the replay's speedup, ``predicted_by_ratio``); and the prediction with each fused op priced
by the roofline alone, without the compute floor (``predicted_roofline_only``; module
docstring of ``sim/transforms/fusion.py``). The error is (predicted − measured) / measured
of the unprofiled step. Every step statistic here is the *median* step of a run (the replay's
saving: the median of its per-step savings): on a shared machine a step stalled by another
process moves a mean by its whole stall, a median not at all; on a quiet one they agree.
Medians over ``args.runs``.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: The SDPA case's transformer (module docstring).
D_MODEL, HEADS, SEQ, BATCH, BLOCKS = 128, 4, 256, 4, 2
#: The torch.compile case's MLP stack (module docstring).
MLP_D, MLP_ROWS, MLP_LAYERS = 256, 1024, 2
WARMUP = 2
SDPA_CHANGE = r"fuse:attn\.core$"
COMPILE_CHANGE = "fuse-elementwise"


def _models() -> tuple[type, type]:
    """The two model classes (built on first use: torch is imported lazily)."""
    import torch
    from torch import nn

    class Core(nn.Module):
        """softmax(q kᵀ / √d) v, by hand or by SDPA."""

        def __init__(self, sdpa: bool) -> None:
            super().__init__()
            self.sdpa = sdpa

        def forward(self, q: Any, k: Any, v: Any) -> Any:
            if self.sdpa:
                return nn.functional.scaled_dot_product_attention(q, k, v)
            s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            return torch.softmax(s, dim=-1) @ v

    class Attention(nn.Module):
        def __init__(self, sdpa: bool) -> None:
            super().__init__()
            self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
            self.core = Core(sdpa)
            self.out = nn.Linear(D_MODEL, D_MODEL)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
            y = self.core(q, k, v)
            return self.out(y.transpose(1, 2).reshape(b, s, D_MODEL))

    class Block(nn.Module):
        def __init__(self, sdpa: bool) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(D_MODEL), nn.LayerNorm(D_MODEL)
            self.attn = Attention(sdpa)
            self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(),
                                     nn.Linear(4 * D_MODEL, D_MODEL))  # fmt: skip

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))

    class Transformer(nn.Module):
        def __init__(self, sdpa: bool) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([Block(sdpa) for _ in range(BLOCKS)])

        def forward(self, x: Any) -> Any:
            for b in self.blocks:
                x = b(x)
            return x

    class Chains(nn.Module):
        """Linear → gated swish → tanh-GELU → Linear (+ residual), twice."""

        def __init__(self) -> None:
            super().__init__()
            h = 4 * MLP_D
            self.up = nn.ModuleList([nn.Linear(MLP_D, h) for _ in range(MLP_LAYERS)])
            self.down = nn.ModuleList([nn.Linear(h, MLP_D) for _ in range(MLP_LAYERS)])
            self.scale = nn.Parameter(torch.rand(MLP_LAYERS, h) + 0.5)
            self.shift = nn.Parameter(torch.randn(MLP_LAYERS, h) * 0.1)

        def forward(self, x: Any) -> Any:
            for i in range(MLP_LAYERS):
                h = self.up[i](x)
                h = h * torch.sigmoid(h) * self.scale[i] + self.shift[i]
                h = 0.5 * h * (1.0 + torch.tanh(0.7978845608 * (h + 0.044715 * h * h * h)))
                x = x + self.down[i](h)
            return x

    return Transformer, Chains


def _loop(model: Any, inputs: list[Any], steps: int, store: Path | None = None,
          trace_model: Any = None) -> list[float]:  # fmt: skip
    """Forward passes over ``inputs``; step times (s) after :data:`WARMUP`. With ``store``:
    under ``xpuprof.profile(level="op", record_shapes=True, model=trace_model)``."""
    import torch

    import xpuprof

    ctx = (xpuprof.profile(store, level="op", steps=steps, warmup=WARMUP, record_shapes=True,
                           model=trace_model, telemetry=False)
           if store is not None else None)  # fmt: skip
    times: list[float] = []
    if ctx is not None:
        ctx.__enter__()
    try:
        with torch.no_grad():
            for i in range(steps + WARMUP):
                xpuprof.step(i)
                t0 = time.perf_counter()
                model(inputs[i % len(inputs)])
                if i >= WARMUP:
                    times.append(time.perf_counter() - t0)
            xpuprof.step(steps + WARMUP)
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return times


def _predict(store: Path, change: str, base_t: float, base_min: float) -> dict[str, float]:
    """The prediction from the baseline trace alone, by the three methods (module docstring);
    seconds."""
    import numpy as np

    import xpuprof
    from xpuprof.sim.transforms import fusion
    from xpuprof.sim.whatif import whatif

    with xpuprof.load(store) as trace:
        w = whatif(trace, [change])
        st = w.steps
        base_ns, pred_ns = float(st["baseline_ns"].median()), float(st["predicted_ns"].median())
        saving_ns = float((st["baseline_ns"] - st["predicted_ns"]).median())
        profiled_min = float(st["baseline_ns"].min()) * 1e-9
        steps = len(st)
        regions, _ = fusion.plan(trace, change)
        t = trace.tree(host_only=True)
        # op events inside the fused ops (nested ones included), per replayed step
        in_step = t.step_mask()
        ops = t.is_level("op") & in_step
        fused = np.zeros(t.n, bool)
        rows = t.rows_of(np.concatenate([np.asarray(r, np.int64) for r in regions["ops"]]))
        fused[rows[rows >= 0]] = True
        inside = ops & (t.farthest(fused) >= 0)
        n_regions = int(sum(1 for r in regions["ops"] if (t.rows_of(list(r[:1])) >= 0).all()))
        removed = (int(inside.sum()) - n_regions) / steps
        recorded = int((t.is_level("op", "layer") & in_step).sum()) / steps
        # what pricing the fused ops by the roofline alone, without the compute floor, would
        # take off the prediction, per step
        alone = regions["roofline_ns"] + regions["kept_ns"] - regions["model_ns"]
        floor_extra = float(alone.clip(upper=0).sum()) / steps * 1e-9
    saving = saving_ns * 1e-9
    omega = max(profiled_min - base_min, 0.0) / recorded if recorded else 0.0
    predicted = base_t - (saving - omega * removed)
    return {"predicted": predicted, "predicted_roofline_only": predicted + floor_extra,
            "predicted_saving_ns": base_t - saving,
            "predicted_by_ratio": base_t * pred_ns / base_ns, "profiled_step": base_ns * 1e-9,
            "omega_us": omega * 1e6, "removed_per_step": removed,
            "regions": float(len(regions))}  # fmt: skip


def _case(name: str, change: str, base: Any, changed: Any, make_inputs: Any,
          args: Any) -> dict[str, dict]:  # fmt: skip
    """Run one case ``args.runs`` times: the unprofiled baseline, its capture, the prediction,
    the changed program; the row of medians."""
    cols: dict[str, list[float]] = {}
    # the process's first loops run slower (the allocator maps fresh pages for the large
    # activations until its thresholds settle): each program runs once untimed first
    for program in (base, changed):
        _loop(program, make_inputs(), 2)
    for r in range(args.runs):
        inputs = make_inputs()
        base_times = _loop(base, inputs, args.steps)
        base_t = statistics.median(base_times)
        with tempfile.TemporaryDirectory() as tmp:
            store = Path(tmp) / "base.store"
            _loop(base, inputs, args.steps, store, trace_model=base)
            pred = _predict(store, change, base_t, min(base_times))
        measured = statistics.median(_loop(changed, inputs, args.steps))
        row = {**pred, "baseline": base_t, "measured": measured,
               "speedup_predicted": base_t / pred["predicted"],
               "speedup_measured": base_t / measured}  # fmt: skip
        for k, v in row.items():
            cols.setdefault(k, []).append(v)
        print(f"  {name} run {r + 1}/{args.runs}: baseline {base_t * 1e3:.2f} ms, predicted "
              f"{pred['predicted'] * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms",
              file=sys.stderr)  # fmt: skip
    out: dict[str, Any] = {k: statistics.median(v) for k, v in cols.items()}
    out["change"] = change
    out["note"] = (
        f"baseline {out['baseline'] * 1e3:.2f} ms (profiled {out['profiled_step'] * 1e3:.2f} ms; "
        f"fastest steps give ω = "
        f"{out['omega_us']:.1f} µs per recorded event × {out['removed_per_step']:.0f} op "
        f"events removed per step); saving carried uncorrected → "
        f"{out['predicted_saving_ns'] * 1e3:.2f} ms "
        f"({100 * (out['predicted_saving_ns'] - out['measured']) / out['measured']:+.1f} %), "
        f"by ratio → {out['predicted_by_ratio'] * 1e3:.2f} ms "
        f"({100 * (out['predicted_by_ratio'] - out['measured']) / out['measured']:+.1f} %); "
        f"fused ops by the roofline alone (no compute floor) → "
        f"{out['predicted_roofline_only'] * 1e3:.2f} ms "
        f"({100 * (out['predicted_roofline_only'] - out['measured']) / out['measured']:+.1f} %)"
    )
    return {name: out}


def run(args: Any) -> dict[str, dict]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    transformer, chains = _models()
    rows: dict[str, dict] = {}
    manual, sdpa = transformer(False).eval(), transformer(True).eval()
    sdpa.load_state_dict(manual.state_dict())

    def tokens() -> list[Any]:
        return [torch.randn(BATCH, SEQ, D_MODEL) for _ in range(4)]

    with torch.no_grad():
        x = tokens()[0]
        assert torch.allclose(manual(x), sdpa(x), atol=1e-4), "SDPA and manual attention differ"
    rows.update(_case("SDPA", SDPA_CHANGE, manual, sdpa, tokens, args))
    eager = chains().eval()

    def rows_in() -> list[Any]:
        return [torch.randn(MLP_ROWS, MLP_D) for _ in range(4)]

    try:
        compiled = torch.compile(eager)
        with torch.no_grad():
            x = rows_in()[0]
            t0 = time.perf_counter()
            y = compiled(x)  # compiles (inductor, C++)
            print(f"  torch.compile: compiled in {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)  # fmt: skip
            assert torch.allclose(y, eager(x), atol=1e-3), "compiled and eager differ"
    except Exception as e:  # noqa: BLE001 - any failure of the compiler skips the case
        print(f"  torch.compile cannot run here ({type(e).__name__}: {e}): case skipped",
              file=sys.stderr)  # fmt: skip
        return rows
    rows.update(_case("torch.compile", COMPILE_CHANGE, eager, compiled, rows_in, args))
    return rows

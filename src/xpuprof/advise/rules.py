"""The advisor: rules over the analyses' results, each a finding with its evidence, a concrete
change and the time it would save, ranked by that estimate.

An estimate is the time the change can remove from a step at most, from measured numbers:
time waiting for input can at best be hidden entirely (prefetching), communication not hidden
behind compute can at best be overlapped, device idle while the host launches can at best be
filled (CUDA graphs replay launches from the device), an fp32 GEMM can at best run at the
half-precision roof of its device. Each recommendation says "up to": the simulator (later) is
what ranks them by what they would really save.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from xpuprof.analysis.common import Result, StepSelection

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: A rule fires when what it can save is at least this fraction of the step time.
MIN_SAVING = 0.02


@dataclass
class Finding:
    rule: str
    recommendation: str
    finding: str
    evidence: str
    saved_fraction: float  # of the mean step time, at most
    saved_ms_per_step: float

    def row(self) -> dict[str, Any]:
        return asdict(self)


def _input(summary: pd.Series, step_ms: float) -> Finding | None:
    f = float(summary.input_fraction)
    if f < MIN_SAVING:
        return None
    return Finding(
        rule="input-bound",
        recommendation="Load data ahead of the step: raise DataLoader num_workers, set "
        "pin_memory=True and prefetch_factor, or move decoding off the training process",
        finding=f"the device waits for input {f:.0%} of each step",
        evidence=f"input {f * step_ms:.2f} ms of a {step_ms:.2f} ms mean step "
        "(DataLoader/input spans while the device is idle)",
        saved_fraction=f,
        saved_ms_per_step=f * step_ms,
    )


def _communication(summary: pd.Series, step_ms: float) -> Finding | None:
    f = float(summary.communication_fraction)
    if f < MIN_SAVING:
        return None
    return Finding(
        rule="communication-not-hidden",
        recommendation="Overlap the gradient all-reduce with backward compute: DDP with "
        "smaller bucket_cap_mb and gradient_as_bucket_view=True, or FSDP with backward "
        "prefetch; make sure collectives run on their own stream",
        finding=f"collectives run with no compute beside them {f:.0%} of each step",
        evidence=f"{f * step_ms:.2f} ms per step of communication not hidden behind compute",
        saved_fraction=f,
        saved_ms_per_step=f * step_ms,
    )


def _launch(summary: pd.Series, step_ms: float, cpu_run: bool) -> Finding | None:
    f = float(summary.host_idle_fraction)
    if f < MIN_SAVING or cpu_run:
        return None
    return Finding(
        rule="host-launch-bound",
        recommendation="Enable CUDA graphs (torch.compile(mode='reduce-overhead') or "
        "torch.cuda.CUDAGraph) and fuse small kernels: the device idles while the host "
        "launches work",
        finding=f"the device idles, waiting on the host, {f:.0%} of each step",
        evidence=f"{f * step_ms:.2f} ms per step of device idle outside input waits",
        saved_fraction=f,
        saved_ms_per_step=f * step_ms,
    )


def _python_overhead(summary: pd.Series, step_ms: float, cpu_run: bool) -> Finding | None:
    f = float(summary.host_idle_fraction)
    if f < MIN_SAVING or not cpu_run:
        return None
    return Finding(
        rule="python-overhead",
        recommendation="Cut the Python and dispatch time between ops: torch.compile the model "
        "(fuses ops and removes per-op dispatch), or do more work per op (larger batches)",
        finding=f"{f:.0%} of each step runs no framework op",
        evidence=f"{f * step_ms:.2f} ms per step outside aten ops (Python code, optimizer "
        "loop, dispatch)",
        saved_fraction=f,
        saved_ms_per_step=f * step_ms,
    )


def _fp32_gemms(trace: Trace, ranks: Iterable[int] | None, steps: StepSelection,
                step_ms: float, n_steps: int) -> Finding | None:  # fmt: skip
    """GEMM-like kernels that do not use tensor cores, on a device whose tensor cores are
    faster: what they would take at the half-precision matrix roof."""
    from xpuprof.analysis.stats import stats
    from xpuprof.hardware.specs import match

    try:
        ks = stats(trace, ranks=ranks, steps=steps, ops=False, kernels=True, layers=False)
        ks = ks.tables.get("kernels")
    except Exception:  # noqa: BLE001 - a refinement: no kernels, no finding
        return None
    if ks is None or len(ks) == 0 or "tensor_core" not in ks:
        return None
    gemm = ks[ks.name.str.contains(r"gemm|sgemm|matmul|cutlass|cublas", case=False, regex=True)
              & ~ks.tensor_core.astype(bool)]  # fmt: skip
    total = float(ks.total_ns.sum())
    if gemm.empty or total <= 0:
        return None
    spec = None
    for props in trace.meta.get("device_properties", {}).values():
        for p in props or []:
            spec = spec or match(p.get("name"), p)
    if spec is None:
        return None
    fp32, _ = spec.peak("fp32", matrix=False)
    # the 16-bit type this device's matrix units really have: bf16 where it exists (Ampere
    # and later), else fp16 (Volta, Turing); the peak lookup says which one it found
    half, key = spec.peak("bf16", matrix=True)
    if key not in ("bf16", "fp16"):
        return None
    if not fp32 or not half or half <= fp32:
        return None
    t = float(gemm.total_ns.sum())
    saved_ns = t * (1 - fp32 / half)  # at most: all of it compute-bound at the new roof
    per_step = saved_ns / max(n_steps, 1) / 1e6
    frac = per_step / step_ms if step_ms else 0.0
    if frac < MIN_SAVING:
        return None
    top = ", ".join(gemm.sort_values("total_ns", ascending=False).name.head(3).str[:60])
    if key == "bf16":
        how = ("Run GEMMs in bf16 on tensor cores: torch.autocast(device_type='cuda', "
               "dtype=torch.bfloat16)")  # fmt: skip
    else:  # no bf16 matrix units (V100, T4): fp16 needs loss scaling
        how = ("Run GEMMs in fp16 on tensor cores: torch.autocast(device_type='cuda', "
               "dtype=torch.float16) with torch.amp.GradScaler")  # fmt: skip
    if "tf32" in spec.flops:  # only parts with TF32 tensor cores (Ampere and later)
        how += " (or allow TF32: torch.backends.cuda.matmul.allow_tf32 = True)"
    return Finding(
        rule="fp32-gemm",
        recommendation=how,
        finding=f"{t / total:.0%} of kernel time is GEMMs without tensor cores on {spec.name}",
        evidence=f"{t / 1e6:.2f} ms of such GEMMs ({top}); {spec.name}: fp32 "
        f"{fp32 / 1e12:.1f} vs {key} matrix {half / 1e12:.0f} TFLOP/s",
        saved_fraction=frac,
        saved_ms_per_step=per_step,
    )


def advise(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    overview_result: Result | None = None,
) -> Result:
    """Recommendations ranked by the step time they can save (table ``recommendations``),
    judged on the rank with the slowest mean step of the overview (``overview_result``, or
    one computed here). Facts: ``recommendations`` (how many), ``saved_fraction`` (the
    largest saving, of the mean step time; 0 without recommendations)."""
    from xpuprof.analysis.overview import overview

    ov = overview_result or overview(trace, ranks=ranks, steps=steps)
    res = Result(facts={"recommendations": 0, "saved_fraction": 0.0})
    summary = ov.tables.get("summary")
    if summary is None or summary.empty:
        res.notes.append("no steps and no events to judge: no recommendations")
        return res
    # judge the rank that needs it most: the slowest mean step
    worst = summary.sort_values("step_ms_mean", ascending=False).iloc[0]
    step_ms = float(worst.step_ms_mean)
    cpu_run = bool(worst.host_only)  # no device events: its host ops were its compute
    rules = (
        _input(worst, step_ms),
        _communication(worst, step_ms),
        _launch(worst, step_ms, cpu_run),
        _python_overhead(worst, step_ms, cpu_run),
        _fp32_gemms(trace, ranks, steps, step_ms, int(summary.steps.sum())),
    )
    findings = sorted((f for f in rules if f is not None), key=lambda f: -f.saved_fraction)
    res.tables["recommendations"] = pd.DataFrame(
        [f.row() for f in findings], columns=list(Finding.__dataclass_fields__)
    )
    if findings:
        res.facts = {"recommendations": len(findings), "saved_fraction": findings[0].saved_fraction}
    else:
        res.notes.append(
            f"no rule found {MIN_SAVING:.0%} or more of the step to save (bottleneck: "
            f"{worst.bottleneck}); see the op and kernel tables for where the time goes"
        )
    return res

"""The advisor: rules over the diagnosis (where each step's critical path spends its time,
``analysis.diagnosis``), each a finding with its evidence, the rank, steps and events it is
about, a concrete change and the most it can save, ranked by that bound.

Every rule starts from a category of the critical path and fires only when that category is
above the noise floor (1 % of the mean step and 50 µs per step) on the judged rank — the one
with the slowest mean step — and only on the platforms it names (:data:`RULES`;
``analysis.platform`` decides the platform per rank). Aggregate fractions (the overview's
device utilisation) are supporting evidence, never the trigger. ``docs/advise.md`` documents
every rule: what it detects, from which evidence, on which devices, how its saving is bounded.

With ``predict=True`` each finding whose recommendation a what-if change expresses is
replayed (``advise.predict``): the table is then ranked by predicted gain, and findings
predicted to gain less than 1 % of the step leave it, named in a note.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from xpuprof.advise import comm, device, host
from xpuprof.advise.findings import FLOOR_NS, FLOOR_SHARE, Context, Finding, per_step
from xpuprof.analysis.common import Result, StepSelection

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

__all__ = ["FLOOR_NS", "FLOOR_SHARE", "RULES", "Finding", "Rule", "advise"]


@dataclass(frozen=True)
class Rule:
    """One rule: its name (the ``rule`` column), the function, the critical-path category it
    starts from, and the platforms (``analysis.platform`` vendors) it may fire on."""

    name: str
    function: Callable[[Context], list[Finding]]
    category: str
    devices: tuple[str, ...]


_ANY = ("nvidia", "amd", "tpu", "mtia", "unknown", "cpu")
_GPU = ("nvidia", "amd")
#: Every rule, in the order they are tried.
RULES: tuple[Rule, ...] = (
    Rule("host-blocked", host.host_sync, "sync", ("nvidia", "amd", "mtia", "unknown")),
    Rule("launch-overhead", host.launch_overhead, "launch", _GPU),
    Rule("host-cpu-bound", host.framework_cpu, "cpu", ("nvidia", "amd", "tpu", "mtia",
                                                       "unknown")),
    Rule("runtime", host.runtime_calls, "runtime", ("nvidia", "amd", "mtia", "unknown")),
    Rule("outside-ops", host.outside_ops, "outside_ops", _ANY),
    Rule("input-bound", host.input_bound, "input", _ANY),
    Rule("device-bound", device.device_bound, "compute", ("nvidia", "amd", "tpu", "mtia",
                                                          "unknown")),
    Rule("device-idle", device.device_idle, "device_idle", ("tpu", "unknown", "nvidia", "amd")),
    Rule("memory-copies", device.memory_copies, "memcpy", ("nvidia", "amd", "tpu", "mtia",
                                                          "unknown")),
    Rule("fp32-gemm", device.fp32_gemms, "compute", _GPU),
    Rule("late-rank", comm.late_rank, "comm_wait", _ANY),
    Rule("communication", comm.bandwidth, "communication", _ANY),
)  # fmt: skip


def advise(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    overview_result: Result | None = None,
    diagnosis_result: Result | None = None,
    predict: bool = False,
) -> Result:
    """Recommendations ranked by the step time they can save at most (table
    ``recommendations``: ``rule``, ``recommendation``, ``finding``, ``evidence``,
    ``saved_ms_per_step`` and ``saved_fraction`` (upper bounds; NaN where a rule claims none),
    ``saving`` (the bound in words), ``rank``, ``device`` (None: the rank as a whole; else
    the device judged, where a rank's devices are judged one by one), ``steps``, ``events``
    (ids), ``category``, ``path_ms_per_step``), judged on the rank (and device) with the
    slowest mean step.

    ``predict``: replay each finding's change too (a replay per finding, hence off by default)
    and rank by predicted gain: columns ``change`` … ``prediction``, facts (:func:`_replay`).

    Facts: ``recommendations`` (how many), ``saved_fraction`` (the largest bound, of the mean
    step; 0 without recommendations), ``headline`` and the ``bottleneck*`` facts (the
    diagnosis')."""
    from xpuprof.analysis.diagnosis import diagnosis
    from xpuprof.analysis.headline import judged
    from xpuprof.analysis.platform import platform_of

    ranks = None if ranks is None else [int(r) for r in ranks]
    dx = diagnosis_result or diagnosis(trace, ranks=ranks, steps=steps)
    predicted = {"predicted_gain_fraction": 0.0, "dropped": 0} if predict else {}
    res = Result(facts={"recommendations": 0, "saved_fraction": 0.0} | predicted)
    st = dx.tables.get("steps")
    if st is None or st.empty:
        res.notes.append("no steps and no events to judge: no recommendations")
        res.tables["recommendations"] = pd.DataFrame(columns=_COLUMNS)
        return res
    part, device, _ = judged(st)
    mine = st[(st.part == part) & (st.device == device)]
    rank = mine["rank"].iloc[0]
    unit = lambda df: df[(df.part == part) & (df.device == device)]  # noqa: E731
    ctx = Context(
        trace=trace, part=part, rank=None if pd.isna(rank) else int(rank),
        platform=platform_of(trace, part), step_ns=float(mine.step_ns.mean()),
        summary=unit(dx.tables["summary"]), events=unit(dx.tables["events"]),
        steps=[int(s) for s in mine.step.dropna()], diagnosis=dx, overview=overview_result,
        ranks=ranks, selection=steps, device=device,
        devices=int(st[st.part == part].device.nunique()),
    )  # fmt: skip
    findings = [f for rule in RULES if ctx.platform.vendor in rule.devices
                for f in rule.function(ctx)]  # fmt: skip
    # the noise floor applies to what a finding claims: its saving when it has one
    findings = [f for f in findings if math.isnan(f.saved_ms_per_step)
                or ctx.above_floor(f.saved_ms_per_step * 1e6)]  # fmt: skip
    # by the bound, largest first; findings whose saving no rule can bound come last (the
    # headline has already said what bounds the step)
    findings.sort(
        key=lambda f: (
            math.isnan(f.saved_ms_per_step),
            -f.path_ms_per_step if math.isnan(f.saved_ms_per_step) else -f.saved_ms_per_step,
        )
    )
    if predict:
        findings, predicted = _replay(ctx, findings, res)
    res.tables["recommendations"] = pd.DataFrame([f.row() for f in findings], columns=_COLUMNS)
    res.facts = {
        "recommendations": len(findings),
        "saved_fraction": max((f.saved_fraction for f in findings
                               if not math.isnan(f.saved_fraction)), default=0.0),
    } | predicted  # fmt: skip
    res.facts |= {k: v for k, v in dx.facts.items()
                  if k == "headline" or k.startswith("bottleneck")}  # fmt: skip
    if host.host_timeline(ctx) and ctx.above_floor(ctx.time("outside_ops")):
        res.notes.append(
            f"{per_step(ctx.time('outside_ops'), ctx)} of the path runs outside layer spans "
            "(the loss, the backward pass and optimizer without backward layer spans, Python): "
            "a capture at level step or layer cannot tell them apart; capture at level='op' "
            "(or with torch.profiler) to see which ops it is")  # fmt: skip
    if not findings and not predicted.get("dropped"):
        res.notes.append(_nothing(ctx, dx))
    return res


def _nothing(ctx: Context, dx: Result) -> str:
    """The note for a trace where no rule found anything above the noise floor."""
    return (
        f"no rule found a change above the noise floor ({FLOOR_SHARE:.0%} of the "
        f"{'step' if ctx.steps else 'trace'} and {FLOOR_NS // 1000} µs"
        f"{ctx.each}) on rank {ctx.rank if ctx.rank is not None else 0}{ctx.on_device}"
        f" ({ctx.platform.vendor}); "
        + (str(dx.facts.get("headline", "")).replace("Bottleneck: ", "bottleneck: ") or
           "see the op and kernel tables for where the time goes"))  # fmt: skip


def _replay(ctx: Context, findings: list[Finding],
            res: Result) -> tuple[list[Finding], dict[str, float | int]]:  # fmt: skip
    """``advise(predict=True)``: each finding's change replayed (``advise.predict`` defines
    the numbers) and filled in the columns ``change``, ``predicted_step_ms``,
    ``predicted_gain_ms``, ``predicted_gain_pct``, ``prediction_of``, ``error_band`` and
    ``prediction`` (in words, or why there is none; all None without ``predict``);
    findings ranked by predicted gain, those with no change after by their bound, those
    predicted to gain < 1 % of the step left out and named in a note (added to ``res``).
    Returns the findings kept and the facts ``predicted_gain_fraction`` (the largest
    predicted gain, of the replayed step; 0 without one) and ``dropped`` (how many left)."""
    from xpuprof.advise import predict as prediction

    kept, notes = prediction.attach(ctx, findings)
    res.notes += notes
    if findings and not kept:
        res.notes.append(
            "every finding was predicted to gain less than 1 % of the step when replayed "
            "(the notes above name them): no recommendation stands"
        )
    best = max((f.predicted_gain_pct / 100 for f in kept if f.predicted_gain_pct is not None),
               default=0.0)  # fmt: skip
    return kept, {"predicted_gain_fraction": best, "dropped": len(findings) - len(kept)}


_COLUMNS = ["rule", "recommendation", "finding", "evidence", "saved_fraction",
            "saved_ms_per_step", "saving", "rank", "device", "steps", "events", "category",
            "path_ms_per_step", "change", "predicted_step_ms", "predicted_gain_ms",
            "predicted_gain_pct", "prediction_of", "error_band", "prediction"]  # fmt: skip

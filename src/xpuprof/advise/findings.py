"""What a rule hands back, what every rule is given, and the noise floor.

A :class:`Finding` is one thing a person can change: the recommendation, what was found, the
evidence (numbers from the critical path first, aggregate fractions after), the rank and steps
it was seen on, the ids of the events it is about, and the most it can save per step — an
upper bound (``docs/advise.md`` says how each rule bounds it). With ``advise(predict=True)``
a finding whose recommendation a what-if change expresses also carries the change replayed
on the trace and what it is predicted to gain (``advise.predict`` defines those numbers).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from xpuprof.analysis.diagnosis import fmt_ns

if TYPE_CHECKING:
    from xpuprof.analysis.platform import Platform
    from xpuprof.core.result import Result
    from xpuprof.trace.trace import Trace

#: No finding below this share of the mean step…
FLOOR_SHARE = 0.01
#: …or below this many ns per step (50 µs: a few dozen launches; below it a change cannot be
#: told from run-to-run noise on any real step).
FLOOR_NS = 50_000


@dataclass
class Finding:
    """One recommendation (see the module docstring). ``saved_ms_per_step`` is an upper
    bound (NaN: the rule cannot bound it, e.g. "make the device's own work faster");
    ``saving`` says it in words. ``change`` … ``prediction``: the what-if change that stands
    for the recommendation and its predicted step, gain, the step it is judged on, the error
    measured for that kind of change, and all of it in words (``advise.predict``)."""

    rule: str
    recommendation: str
    finding: str
    evidence: str
    saved_fraction: float
    saved_ms_per_step: float
    rank: int | None = None
    device: int | None = None
    steps: list[int] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    category: str = ""
    path_ms_per_step: float = 0.0  # its time on the critical path, per step (the ranking)
    # the replayed prediction (``advise.predict``; None: not asked for, or no change for it)
    change: str | None = None
    predicted_step_ms: float | None = None
    predicted_gain_ms: float | None = None
    predicted_gain_pct: float | None = None
    prediction_of: str | None = None
    error_band: float | None = None
    prediction: str | None = None

    @property
    def saving(self) -> str:
        if math.isnan(self.saved_ms_per_step):
            return "saving not bounded by this rule (the device's own work)"
        t = fmt_ns(self.saved_ms_per_step * 1e6)
        if not self.steps:
            return f"saves up to {t} ({self.saved_fraction:.0%} of the trace), an upper bound"
        return f"saves up to {t} per step ({self.saved_fraction:.0%}), an upper bound"

    def row(self) -> dict[str, Any]:
        return asdict(self) | {"saving": self.saving}


@dataclass
class Context:
    """What every rule is given: the judged rank's part, platform, mean step and the
    diagnosis (tables ``summary``, ``events``, ``steps`` of that part), the whole diagnosis
    and the overview (supporting aggregates), and the selection."""

    trace: Trace
    part: int
    rank: int | None
    platform: Platform
    step_ns: float
    summary: pd.DataFrame
    events: pd.DataFrame
    steps: list[int]
    diagnosis: Result
    overview: Result | None
    ranks: Any
    selection: Any
    device: int = -1
    devices: int = 1

    @property
    def each(self) -> str:
        """`` per step`` where the windows are steps, else nothing (the whole trace)."""
        return " per step" if self.steps else ""

    @property
    def window(self) -> str:
        """What a share is of: ``each step`` or ``the trace``."""
        return "each step" if self.steps else "the trace"

    @property
    def on_device(self) -> str:
        """``, TPU 1`` where one of a rank's several devices is judged, else nothing."""
        if self.device < 0 or self.devices < 2:
            return ""
        from xpuprof.analysis.headline import device_label

        return f", {device_label(self.trace, self.part, self.device)}"

    @property
    def on_path(self) -> str:
        """``on the critical path`` (``… of TPU 1`` where one of several devices is judged)."""
        return "on the critical path" + (f" of{self.on_device[1:]}" if self.on_device else "")

    def where(self, alias: str = "", *, device: bool = True) -> str:
        """SQL predicate over events of the judged part (and device, unless ``device`` is
        false: host events), in the judged steps."""
        a = f"{alias}." if alias else ""
        out = f"{a}part = {self.part}"
        if device and self.device >= 0:
            out += f" and {a}device = {self.device}"
        if self.steps:
            out += f" and {a}step in ({', '.join(map(str, self.steps))})"
        return out

    def time(self, category: str) -> float:
        """Mean ns per step on the critical path in ``category``."""
        s = self.summary[self.summary.category == category]
        return float(s.time_ns.iloc[0]) if len(s) else 0.0

    def device_idle(self, category: str) -> float:
        """The fraction of ``category``'s path time during which no device worked."""
        s = self.summary[self.summary.category == category]
        return float(s.device_idle.iloc[0]) if len(s) else 0.0

    def top(self, category: str, n: int = 3) -> pd.DataFrame:
        """The ``n`` names most of ``category``'s path time is charged to."""
        e = self.events[self.events.category == category]
        return e[e.name != "(no event)"].head(n)

    def top_names(self, category: str, n: int = 3) -> pd.DataFrame:
        """As :meth:`top`, device work grouped by kernel family (``headline.top_names``:
        template arguments and XLA instance numbers dropped): ``name``, ``per_step_ns``,
        ``ids``."""
        from xpuprof.analysis.headline import top_names

        return top_names(self.trace, self.events, self.part, self.device, category).head(n)

    def above_floor(self, ns: float) -> bool:
        """The noise floor: at least 1 % of the mean step and 50 µs per step."""
        return ns >= FLOOR_NS and ns >= FLOOR_SHARE * self.step_ns

    def finding(self, rule: str, category: str, recommendation: str, finding: str,
                evidence: str, saved_ns: float, path_ns: float,
                events: list[int] | None = None) -> Finding:  # fmt: skip
        """A finding on the judged rank and steps; ``saved_ns``: the upper bound per step."""
        frac = saved_ns / self.step_ns if self.step_ns and not math.isnan(saved_ns) else (
            math.nan if math.isnan(saved_ns) else 0.0)  # fmt: skip
        return Finding(rule=rule, recommendation=recommendation, finding=finding,
                       evidence=evidence, saved_fraction=frac, saved_ms_per_step=saved_ns / 1e6,
                       rank=self.rank, device=self.device if self.device >= 0 else None,
                       steps=list(self.steps), events=list(events or []),
                       category=category, path_ms_per_step=path_ns / 1e6)  # fmt: skip

    def ids(self, category: str, n: int = 3) -> list[int]:
        """Event ids of the top names of ``category`` (each name's first few)."""
        out: list[int] = []
        for ids in self.top(category, n).ids:
            out += list(ids)
        return out[:20]


def share(ns: float, step_ns: float) -> str:
    return f"{ns / step_ns:.0%}" if step_ns else "-"


def per_step(ns: float, ctx: Context) -> str:
    """``12.3 ms per step (45%)``; without step spans the window is the whole trace:
    ``12.3 ms (45% of the trace)``."""
    if not ctx.steps:
        return f"{fmt_ns(ns)} ({share(ns, ctx.step_ns)} of the trace)"
    return f"{fmt_ns(ns)} per step ({share(ns, ctx.step_ns)})"

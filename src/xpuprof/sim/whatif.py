"""What-if: change the replay graph's costs or edges, replay, and say what the change is worth.

``whatif(trace, ["scale:kernel/gemm=0.5", "no-sync"])`` replays the trace once as measured
(the baseline) and once with every change applied, and compares them per rank: step time (the
mean host step, and the mean step with its device work), the speedup, and how the critical path
shifts between categories of work (host, launch, device compute, communication, waiting).
``docs/whatif.md`` defines the change language; in short (SELECTOR: a level or class — ``kernel``,
``memcpy``, ``memset``, ``collective``, ``device`` (all device work), ``op``, ``runtime``,
``step``, ``host`` — optionally ``/REGEX`` on event names):

- ``scale:SELECTOR=FACTOR``: the own time of the selected events × FACTOR (0 removes it);
- ``host-gaps=FACTOR``: the host time in no framework op or runtime call (between top-level
  host events, or inside a step span outside its ops: Python, the optimizer loop, dispatch) ×
  FACTOR;
- ``no-sync[:REGEX]``: the host calls (matching REGEX) no longer wait for the device (a
  blocking copy made non-blocking to pinned memory, a sync removed);
- ``cuda-graphs[:REGEX]``: the launch calls inside host events matching REGEX (default: all)
  cost nothing on the host, as when their kernels are captured in a CUDA graph;
- ``no-input-wait[:REGEX]``: the host spans of the input pipeline (DataLoader iterator spans,
  or REGEX) take no time;
- ``dataloader-workers[:REGEX]=N``: the input pipeline gets N worker processes: each input
  span shrinks to max(0, its time / N − the rest of its step);
- ``device=KEY``: the roofline calibrated on the trace, on another device;
- ``collective:K=V,…``: NCCL's model of the changed collectives, relative to the trace.
- ``batch[:REGEX]=FACTOR``, ``threads=N``, ``dtype=bf16``, ``fuse-elementwise[:REGEX]``,
  ``fuse:REGEX``, ``overlap-collective[:REGEX][@UNTIL]``: the transform modules of
  ``sim/transforms`` (each module's docstring defines its numbers).

``@REGION`` after a host selector's pattern or ``no-sync``'s keeps only the events nested in
host events whose names match REGION.

Only what the trace measured is moved: a change prices nothing new (the roofline, systolic
and collective models do that), so a prediction is as good as the graph's dependencies
(``docs/replay.md``). A change that selects nothing is an error naming what exists.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.core.errors import XpuprofError
from xpuprof.core.result import Presentation, Result
from xpuprof.sim.compare import pct, span_summary, steps_table, summary_table
from xpuprof.sim.graph import (
    COLLECTIVE,
    DEVICE_COMMUNICATION,
    DEVICE_WORK,
    HOST_GAP,
    HOST_WORK,
    LAUNCH,
    RENDEZVOUS,
    SYNC,
    ReplayGraph,
)
from xpuprof.sim.paths import critical_paths
from xpuprof.sim.replay import Replay, replay, run

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.analysis.common import StepSelection
    from xpuprof.trace.trace import Trace

#: Levels a selector may name, and the classes that stand for several.
SELECTORS = {
    "kernel": ("kernel",), "memcpy": ("memcpy",), "memset": ("memset",),
    "collective": ("collective",), "device": ("kernel", "memcpy", "memset", "collective"),
    "op": ("op",), "runtime": ("runtime",), "step": ("step",), "host": ("op", "runtime", "step"),
}  # fmt: skip
#: The host spans of the input pipeline (what ``analysis.input_pipeline`` finds by default).
INPUT_PATTERN = r"(?i)(?:dataloader|_next_data|load_batch|get_batch|fetch_batch)"
#: Runtime calls that launch work (what a CUDA graph replaces).
LAUNCH_PATTERN = r"(?i)(?:launch|memcpyasync|memsetasync)"


@dataclass(frozen=True)
class Change:
    """One parsed change: its text, what it does (``verb``), the levels and name pattern it
    selects, and its factor."""

    text: str
    verb: str
    levels: tuple[str, ...] = ()
    pattern: str | None = None
    factor: float = 0.0
    #: a transform module's own settings (``sim/transforms``), as it parsed them
    options: tuple[tuple[str, Any], ...] = ()

    def option(self, key: str, default: Any = None) -> Any:
        """One of :attr:`options`."""
        return dict(self.options).get(key, default)


def parse(text: str) -> Change:
    """A change from its text (module docstring); a clear error for anything else."""
    t = text.strip()
    head, _, factor_text = t.partition("=")
    verb, _, arg = head.partition(":")
    if "@" in verb:  # ``no-sync@REGION``: a region without a pattern
        verb, _, region = verb.partition("@")
        arg = f"@{region}{':' + arg if arg else ''}"
    verb = verb.strip().lower()
    from xpuprof.sim import transforms

    if verb in transforms.REGISTRY:
        return transforms.module(verb).parse(t, verb, arg.strip(), factor_text.strip())
    if verb in ("device", "collective"):  # their value is a name or settings, not a factor
        if verb == "collective":
            arg, factor_text = t.partition(":")[2], ""
        return _named(t, verb, arg, factor_text)
    factor = 0.0
    if factor_text:
        try:
            factor = float(factor_text)
        except ValueError:
            raise XpuprofError(f"change {text!r}: {factor_text!r} is not a number") from None
        if factor < 0:
            raise XpuprofError(f"change {text!r}: the factor must be ≥ 0")
    if verb == "scale":
        sel, _, pattern = arg.partition("/")
        if sel not in SELECTORS:
            raise XpuprofError(f"change {text!r}: unknown selector {sel!r}; selectors: "
                               f"{', '.join(SELECTORS)}")  # fmt: skip
        if not factor_text:
            raise XpuprofError(f"change {text!r}: say the factor, e.g. scale:{sel}=0.5")
        pattern, region = _scope(text, pattern)
        if region and not set(SELECTORS[sel]) <= set(SELECTORS["host"]):
            raise XpuprofError(f"change {text!r}: @REGION scopes host events (op, runtime, "
                               f"step, host), not {sel}")  # fmt: skip
        return Change(t, verb, SELECTORS[sel], pattern, factor, options=region)
    if verb == "host-gaps":
        if not factor_text:
            raise XpuprofError(f"change {text!r}: say the factor, e.g. host-gaps=0.5")
        return Change(t, verb, factor=factor)
    if verb == "dataloader-workers":
        if not factor_text or factor < 1 or factor != int(factor):
            raise XpuprofError(f"change {text!r}: say how many workers, e.g. "
                               "dataloader-workers=2")  # fmt: skip
        return Change(t, verb, pattern=checked_pattern(text, arg or None) or INPUT_PATTERN,
                      factor=factor)  # fmt: skip
    if verb in ("no-sync", "cuda-graphs", "no-input-wait"):
        if factor_text:
            raise XpuprofError(f"change {text!r}: {verb} takes no factor")
        default = INPUT_PATTERN if verb == "no-input-wait" else None
        if verb == "no-sync":
            pattern, region = _scope(text, arg)
            return Change(t, verb, pattern=pattern, options=region)
        return Change(t, verb, pattern=checked_pattern(text, arg or None) or default)
    raise XpuprofError(f"change {text!r}: unknown change {verb!r}; changes: scale:SELECTOR="
                       "FACTOR, host-gaps=FACTOR, no-sync[:REGEX], cuda-graphs[:REGEX], "
                       "no-input-wait[:REGEX], dataloader-workers[:REGEX]=N, device=KEY, "
                       f"collective:K=V,…, {', '.join(transforms.REGISTRY)} "
                       "(docs/whatif.md)")  # fmt: skip


def _named(t: str, verb: str, arg: str, value: str) -> Change:
    """``device=KEY`` and ``collective:K=V,K=V``."""
    if verb == "device":
        if not value.strip():
            raise XpuprofError(f"change {t!r}: name the device, e.g. device=h100-sxm "
                               "(xpuprof hardware lists them)")  # fmt: skip
        return Change(t, verb, pattern=value.strip())
    return Change(t, verb, pattern=json.dumps(_settings(t, arg), sort_keys=True))


#: What ``collective:`` may set, and how each value is read.
COLLECTIVE_SETTINGS = {"algorithm": str, "protocol": str, "channels": int, "world": int,
                       "topology": str, "chunk": float, "model": str}  # fmt: skip


def _settings(text: str, arg: str) -> dict[str, object]:
    """``algorithm=tree,protocol=simple,…`` as a dict (names checked, values typed)."""
    out: dict[str, object] = {}
    for item in filter(None, (x.strip() for x in arg.split(","))):
        k, _, v = item.partition("=")
        k = k.strip().lower()
        if k not in COLLECTIVE_SETTINGS or not v.strip():
            raise XpuprofError(f"change {text!r}: {item!r}: expected KEY=VALUE with KEY one of "
                               f"{', '.join(COLLECTIVE_SETTINGS)}")  # fmt: skip
        try:
            out[k] = COLLECTIVE_SETTINGS[k](v.strip())
        except ValueError:
            raise XpuprofError(f"change {text!r}: {k}={v!r} is not a number") from None
    if not out:
        raise XpuprofError(f"change {text!r}: say what changes, e.g. "
                           "collective:algorithm=tree,protocol=simple")  # fmt: skip
    return out


def _scope(text: str, arg: str) -> tuple[str | None, tuple[tuple[str, Any], ...]]:
    """``REGEX@REGION`` → (the pattern, the ``region`` option): only the events nested inside
    host events whose names match REGION (the last ``@`` splits)."""
    pattern, at, region = arg.rpartition("@")
    if not at:
        pattern, region = arg, ""
    if at and not region.strip():
        raise XpuprofError(f"change {text!r}: say the region after @, e.g. no-sync@copy_batch")
    options = (("region", checked_pattern(text, region.strip())),) if region.strip() else ()
    return checked_pattern(text, pattern or None), options


def checked_pattern(text: str, pattern: str | None) -> str | None:
    if pattern is None:
        return None
    try:
        re.compile(pattern)
    except re.error as e:
        raise XpuprofError(f"change {text!r}: bad pattern {pattern!r}: {e}") from None
    return pattern


@dataclass
class WhatIf:
    """The baseline replay, the changed schedule, and the comparison tables."""

    baseline: Replay
    changes: list[Change]
    time: np.ndarray  # simulated node times with the changes (each part's own clock)
    summary: pd.DataFrame
    steps: pd.DataFrame
    critical_path: pd.DataFrame
    notes: list[str]

    def result(self) -> Result:
        """The tables as a tool's Result (``xpuprof whatif``)."""
        s = self.summary
        facts: dict[str, object] = {"changes": "; ".join(c.text for c in self.changes)}
        if len(s) and s["baseline_ns"].notna().any():
            base, pred = float(s["baseline_ns"].mean()), float(s["predicted_ns"].mean())
            facts.update(baseline_ns=base, predicted_ns=pred,
                         speedup=round(base / pred, 4) if pred > 0 else None)  # fmt: skip
            what = "; ".join(c.text for c in self.changes) or "no change"
            unit = "step" if (s["steps"] > 0).any() else "span (no profiler steps)"
            facts["headline"] = (f"{what}: {unit} {base / 1e6:.3f} ms → {pred / 1e6:.3f} ms "
                                 f"predicted ({pct(pred, base):+.1f} %, ×{base / pred:.2f})"
                                 if pred > 0 else f"{what}: the step takes no time")  # fmt: skip
        ns = (("baseline_ns", "ns"), ("predicted_ns", "ns"), ("baseline_with_device_ns", "ns"),
              ("predicted_with_device_ns", "ns"))  # fmt: skip
        return Result(
            tables={"summary": s, "steps": self.steps, "critical_path": self.critical_path},
            notes=list(self.notes), facts=facts,  # type: ignore[arg-type]
            present={
                "summary": Presentation(title="baseline vs predicted, per rank (mean step; "
                                        "without steps, the span)",
                                        all_rows=True, units=ns),
                "steps": Presentation(title="baseline vs predicted, per step", units=ns),
                "critical_path": Presentation(
                    title="critical path by category, per rank (first step's start to last "
                    "step's end)",
                    all_rows=True, units=(("baseline_ns", "ns"), ("predicted_ns", "ns"),
                                          ("shift_ns", "ns"))),
            },
        )  # fmt: skip


def whatif(
    trace: Trace,
    changes: Iterable[str | Change] = (),
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    align: str = "auto",
) -> WhatIf:
    """Replay ``trace`` as measured and with ``changes`` applied together; compare them.
    ``align``: the ranks' clock alignment (:func:`xpuprof.sim.replay.replay`'s)."""
    parsed = [c if isinstance(c, Change) else parse(c) for c in changes]
    base = replay(trace, ranks=ranks, steps=steps, align=align)
    g = base.graph
    delay = g.edges.delay.copy()
    keep = np.ones(len(g.edges), bool)
    notes = []
    events = _Names(trace, g) if parsed else None
    # changes that a cost model prices come first, each on the delays so far
    from xpuprof.sim import transforms

    ctx = transforms.Context(trace, g, events, delay, keep, _cpus(trace))
    for c in sorted(parsed, key=lambda c: not _is_priced(c)):
        if c.verb in transforms.REGISTRY:
            notes.append(transforms.module(c.verb).apply(c, ctx))
        elif c.verb in ("device", "collective"):
            if c.verb == "collective":  # an error naming what exists when there are none
                select(Change(c.text, "scale", ("collective",)), events)  # type: ignore[arg-type]
            notes.append(_priced(c, trace, g, delay))
        else:
            notes.append(_apply(c, ctx.graph, events, delay, keep, ctx.cpus))  # type: ignore[arg-type]
    changed = ctx.graph  # the baseline's nodes; a transform may have rewired edges
    sched = run(changed, delay, keep)
    off = g.nodes.time - g.aligned
    time = sched.time + off
    steps_t = steps_table(base, time)
    summary = summary_table(base, steps_t) if len(steps_t) else span_summary(base, time)
    cp = critical_paths(g, base, base.schedule or run(g), sched, keep, after_graph=changed)
    if not parsed:
        notes.append("no change given: the prediction is the baseline (the identity replay)")
    return WhatIf(baseline=base, changes=parsed, time=time, summary=summary, steps=steps_t,
                  critical_path=cp, notes=notes + list(base.notes))  # fmt: skip


# -- the changes ------------------------------------------------------------------------------


def _is_priced(c: Change) -> bool:
    """Whether a cost model prices ``c`` (applied first, in the given order)."""
    from xpuprof.sim import transforms

    if c.verb in transforms.REGISTRY:
        return bool(transforms.module(c.verb).PRICED)
    return c.verb in ("device", "collective")


class _Names:
    """``id``, ``level``, ``name`` of the events of the replayed parts, read per set of levels
    on first use (a change on kernels reads the kernels only; one scan each, no join)."""

    def __init__(self, trace: Trace, g: ReplayGraph) -> None:
        self.trace, self.graph, self.parts = trace, g, ", ".join(map(str, g.parts)) or "null"
        self.cache: dict[tuple[str, ...], pd.DataFrame] = {}

    def frame(self, levels: tuple[str, ...] = ()) -> pd.DataFrame:
        from xpuprof.core.names import DEVICE_LEVELS
        from xpuprof.sim.build import HOST_LEVELS

        levels = tuple(sorted(levels or (*HOST_LEVELS, *DEVICE_LEVELS)))
        if levels not in self.cache:
            inside = ", ".join(f"'{x}'" for x in levels)
            self.cache[levels] = self.trace.sql(
                f"select id, level, name from events where part in ({self.parts}) "
                f"and level in ({inside})")  # fmt: skip
        return self.cache[levels]


def member(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is in ``ids`` (a binary search in the sorted ids: event ids
    are too sparse for a table, and ``np.isin`` sorts both sides)."""
    ids = np.asarray(ids, np.int64)
    if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():  # already sorted and distinct: as is
        ids = np.unique(ids)
    if not len(ids):
        return np.zeros(len(values), bool)
    pos = np.minimum(np.searchsorted(ids, values), len(ids) - 1)
    return ids[pos] == values


def select(c: Change, names: _Names) -> np.ndarray:
    """Ids of the replayed events ``c`` selects (an error when none)."""
    events = names.frame(c.levels)
    mask = np.ones(len(events), bool)
    if c.pattern:
        codes, uniq = pd.factorize(events["name"].astype(str))
        rx = re.compile(c.pattern)
        hit = np.fromiter((rx.search(x) is not None for x in uniq), bool, len(uniq))
        mask &= hit[codes]
    region = c.option("region")
    if region and mask.any():
        try:
            spans = select(Change(c.text, "scale", (), region), names)
        except XpuprofError as e:
            raise XpuprofError(str(e).replace(" selects no replayed event",
                                              f": its region {region!r} matches no replayed "
                                              "event", 1)) from None  # fmt: skip
        mask &= member(events["id"].to_numpy(), np.union1d(spans, inside(names.graph, spans)))
        if not mask.any():
            raise XpuprofError(f"change {c.text!r} selects no replayed event inside the host "
                               f"events matching {region!r}")  # fmt: skip
    if not mask.any():
        have = events["name"]
        from xpuprof.core.text import short_name

        top = list(dict.fromkeys(short_name(str(x)) for x in have.value_counts().index[:20]))[:6]
        where = (f"names there include: {', '.join(map(str, top))}" if top
                 else f"the trace has no {'/'.join(c.levels)} events")  # fmt: skip
        raise XpuprofError(f"change {c.text!r} selects no replayed event; {where}")
    return events["id"].to_numpy()[mask]


def _apply(c: Change, g: ReplayGraph, events: _Names, delay: np.ndarray,
           keep: np.ndarray, cpus: dict[int, int]) -> str:  # fmt: skip
    """Apply ``c`` to ``delay``/``keep`` in place; a note saying what it touched."""
    e = g.edges
    if c.verb == "scale":
        ids = select(c, events)
        work = np.isin(e.kind, (HOST_WORK, DEVICE_WORK, DEVICE_COMMUNICATION))
        pick = work & member(e.event, ids)
        # a matched collective's transfer time is carried by its rendezvous edges too
        out_of_rz = (e.kind == COLLECTIVE) & (g.nodes.kind[e.src] == RENDEZVOUS)
        pick |= out_of_rz & member(g.nodes.event[e.dst], ids)
        delay[pick] = np.rint(delay[pick] * c.factor).astype(np.int64)
        return f"{c.text}: {len(ids):,} events, {int(pick.sum()):,} edges scaled"
    if c.verb == "host-gaps":
        # host time in no op or runtime call: between top-level events, or inside a step
        # span but outside its ops (Python, the optimizer loop, dispatch)
        steps = events.frame(("step",))["id"].to_numpy()
        # a step span whose thread ran no recorded event inside it (its end point right after
        # its start) was waiting on something unrecorded (gloo's thread), not running Python
        n = g.nodes
        s_node = np.flatnonzero((n.kind == 0) & member(n.event, steps))
        empty = n.event[s_node[ends_of(g, n.event[s_node]) == s_node + 1]]
        steps = np.setdiff1d(steps, empty)
        pick = (e.kind == HOST_GAP) | ((e.kind == HOST_WORK) & member(e.event, steps))
        delay[pick] = np.rint(delay[pick] * c.factor).astype(np.int64)
        return (f"{c.text}: {int(pick.sum()):,} stretches of host time outside ops scaled"
                + (f"; {len(empty):,} step spans with nothing recorded inside them on "
                   "their thread left as they are (waiting, not Python)" if len(empty)
                   else ""))  # fmt: skip
    if c.verb == "no-sync":
        pick = e.kind == SYNC
        if c.pattern or c.options:
            ids = select(Change(c.text, "scale", ("runtime",), c.pattern, options=c.options),
                         events)  # fmt: skip
            pick &= member(g.nodes.event[e.dst], ids)
        if not pick.any():
            raise XpuprofError(f"change {c.text!r}: no host call waits for the device in the "
                               "replay graph (no sync edge)")  # fmt: skip
        keep &= ~pick
        # a copy its own call waited for (synchronous, or pageable: staged by the host) is
        # made asynchronous from pinned memory: it is submitted as any launch is, after the
        # rank's typical launch latency instead of its measured delay (its run is kept)
        src, dst = e.src[pick], e.dst[pick]
        own = _launching_call(g, src) == g.nodes.event[dst]
        starts = src[own] - 1  # the copy's start point (its end's predecessor)
        launch = (e.kind == LAUNCH) & np.isin(e.dst, starts)
        typical = g.typical.set_index("part")["launch_ns"]
        t = typical.reindex(g.nodes.part[e.dst[launch]]).fillna(0).to_numpy(np.int64)
        delay[launch] = np.minimum(delay[launch], t)
        return (f"{c.text}: {int(pick.sum()):,} waits removed"
                + (f"; {int(launch.sum()):,} copies submitted asynchronously" if launch.any()
                   else ""))  # fmt: skip
    if c.verb == "cuda-graphs":
        calls = select(Change(c.text, "scale", ("runtime",), LAUNCH_PATTERN), events)
        if c.pattern:
            region = select(Change(c.text, "scale", (), c.pattern), events)
            calls = np.intersect1d(calls, inside(g, region))
        pick = (e.kind == HOST_WORK) & member(e.event, calls)
        delay[pick] = 0
        return f"{c.text}: the host time of {len(calls):,} launch calls removed"
    if c.verb == "no-input-wait":
        ids = select(Change(c.text, "scale", (), c.pattern), events)
        ids = np.union1d(ids, inside(g, ids))
        pick = (e.kind == HOST_WORK) & member(e.event, ids)
        delay[pick] = 0
        return f"{c.text}: {len(ids):,} input-pipeline events take no time"
    if c.verb == "dataloader-workers":
        return _workers(c, g, events, delay, cpus)
    if c.verb in ("device", "collective"):
        raise AssertionError("priced by a cost model: see _priced")
    raise AssertionError(c.verb)


def _workers(c: Change, g: ReplayGraph, events: _Names, delay: np.ndarray,
             cpus_by_part: dict[int, int]) -> str:  # fmt: skip
    """``dataloader-workers=N``: N worker processes make the batches while the step computes,
    so in steady state a step lasts max(C, T/N, (C + T)/P): C = the measured step time outside
    its input spans (the step's own work), T = its input spans' time (one batch, made by one
    worker), P = the CPUs the process could use (recorded by ``xpuprof.profile``; without it
    no CPU bound applies, and a note says so) — the workers and the main process share them.
    Each input span (outermost) shrinks to that step minus C, what is inside it alike. The
    first batch's cold start and the cost of shipping batches between processes are not in
    the trace, so not in the prediction."""
    n = g.nodes
    ids = select(Change(c.text, "scale", (), c.pattern), events)
    starts = np.sort(np.flatnonzero((n.kind == 0) & member(n.event, ids)))
    ends = ends_of(g, n.event[starts])
    # outermost spans only (an input span inside another is part of it)
    outer = np.r_[True, starts[1:] > np.maximum.accumulate(ends)[:-1]]
    starts, ends = starts[outer], ends[outer]
    span_ns = n.time[ends] - n.time[starts]
    steps = np.flatnonzero((n.kind == 0) & np.isin(
        n.event, events.frame(("step",))["id"].to_numpy()))  # fmt: skip
    step_ends = ends_of(g, n.event[steps])
    along = np.flatnonzero(g.edges.timeline & (g.edges.kind == HOST_WORK))
    dst = g.edges.dst[along]
    changed = 0
    for s0, s1 in zip(steps.tolist(), step_ends.tolist(), strict=True):
        mine = np.flatnonzero((n.part[starts] == n.part[s0]) & (n.time[starts] >= n.time[s0])
                              & (n.time[starts] < n.time[s1]))  # fmt: skip
        t_in = float(span_ns[mine].sum())
        rest = float(n.time[s1] - n.time[s0]) - t_in  # the step's own work
        cpus = cpus_by_part.get(int(n.part[s0]))
        step = max(rest, t_in / c.factor, (rest + t_in) / cpus if cpus else 0.0)
        for k in mine.tolist():
            t = float(span_ns[k])
            factor = (step - rest) * (t / t_in) / t if t > 0 and t_in > 0 else 0.0
            pick = along[(dst > starts[k]) & (dst <= ends[k])]
            delay[pick] = np.rint(delay[pick] * factor).astype(np.int64)
            changed += 1
    if not changed:
        raise XpuprofError(f"change {c.text!r}: no input span lies inside a profiler step")
    cpus = sorted({cpus_by_part[int(p)] for p in np.unique(n.part[starts])
                   if cpus_by_part.get(int(p))})  # fmt: skip
    bound = (f"{'/'.join(map(str, cpus))} CPUs shared by the workers and the main process"
             if cpus else "no CPU count recorded (capture with xpuprof.profile to record it): "
             "the workers are assumed to have CPUs of their own")  # fmt: skip
    return f"{c.text}: {changed:,} input spans shrunk ({bound})"


def _cpus(trace: Trace) -> dict[int, int]:
    """Per part, the CPUs the captured process could use (``xpuprof.profile`` records them)."""
    out = {}
    for s in trace.sources:
        n = ((s.get("meta") or {}).get("xpuprof_capture") or {}).get("cpus")
        if isinstance(n, int) and n > 0:
            out[int(s["part"])] = n
    return out


def ends_of(g: ReplayGraph, ids: np.ndarray) -> np.ndarray:
    """End points of the host events ``ids``."""
    n = g.nodes
    e = pd.Series(np.flatnonzero(n.kind == 1), index=n.event[n.kind == 1])
    return e[~e.index.duplicated()].reindex(ids).to_numpy()


def _priced(c: Change, trace: Trace, g: ReplayGraph, delay: np.ndarray) -> str:
    """``device=KEY``: the roofline model calibrated on the trace, on the new device
    (``sim/costs/roofline.py``); ``collective:…``: each matched collective's transfer time
    × model(changed) / model(as recorded) (``sim/netmodel``). In place on ``delay``."""
    from xpuprof.sim.costs import Given

    base = Given(delay.copy())
    if c.verb == "device":
        from xpuprof.sim.costs import RooflineCosts
        from xpuprof.sim.costs.roofline import NO_OP

        model = RooflineCosts(trace, device=c.pattern, base=base)
        new = np.asarray(model.delays(g), np.int64)
        priced = int((new != delay).sum())
        left = model.unpriced_summary()
        if not priced and int(model.ops["priced"].sum()) == 0:
            from xpuprof.core.text import short_name

            u = model.unpriced
            why = "; ".join(
                f"{r.events:,} events: {r.reason} (e.g. " + ", ".join(
                    short_name(str(x)) for x in
                    u.loc[u["reason"] == r.reason, "name"].value_counts().index[:3]) + ")"
                for r in left.head(2).itertuples())  # fmt: skip
            raise XpuprofError(f"change {c.text!r}: the roofline can price no work of the "
                               f"replayed steps: {why or NO_OP}")  # fmt: skip
        delay[:] = new
        kept = (f"; {int(left['events'].sum()):,} device events kept at their measured time "
                f"(most: {left['reason'].iloc[0]})" if len(left) else "")  # fmt: skip
        return (f"{c.text}: {priced:,} edges repriced by the roofline calibrated on the "
                f"trace{kept}")  # fmt: skip
    from xpuprof.sim.netmodel.costs import CollectiveCosts

    settings = json.loads(c.pattern or "{}")
    renamed = {"world": "world_size", "chunk": "chunk_bytes"}
    kw = {renamed.get(k, k): v for k, v in settings.items()}
    try:
        model = CollectiveCosts.of(trace, relative=True, base=base, **kw)
        new = np.asarray(model.delays(g), np.int64)
    except XpuprofError as e:
        raise XpuprofError(f"change {c.text!r}: {e}") from None
    priced = int((new != delay).sum())
    delay[:] = new
    return f"{c.text}: {priced:,} collective edges repriced (NCCL's model, relative to the trace)"


def launch_calls(g: ReplayGraph) -> np.ndarray:
    """Per node: the start point of the host call that launched its work (its first launch
    edge; -1: none)."""
    launch = np.flatnonzero(g.edges.kind == LAUNCH)[::-1]  # the first edge assigned last
    out = np.full(len(g.nodes), -1, np.int64)
    out[g.edges.dst[launch]] = g.edges.src[launch]
    return out


def _launching_call(g: ReplayGraph, points: np.ndarray) -> np.ndarray:
    """Per device end point in ``points``, the event id of the host call that launched its
    work (-1 when none, or not a device end)."""
    call = launch_calls(g)[np.asarray(points) - 1]
    return np.where(call >= 0, g.nodes.event[np.maximum(call, 0)], -1)


def inside(g: ReplayGraph, ids: np.ndarray) -> np.ndarray:
    """Ids of the host events nested inside the events ``ids`` on their threads (points
    between an event's start and end on its timeline)."""
    n = g.nodes
    host = n.kind <= 1
    start = np.flatnonzero(host & (n.kind == 0) & member(n.event, ids))
    end_of = pd.Series(np.flatnonzero(host & (n.kind == 1)),
                       index=n.event[host & (n.kind == 1)])  # fmt: skip
    end_of = end_of[~end_of.index.duplicated()]
    stop = end_of.reindex(n.event[start]).to_numpy()
    inside = np.zeros(len(n.event) + 1, np.int64)
    np.add.at(inside, start, 1)
    np.add.at(inside, stop + 1, -1)
    depth = np.cumsum(inside[:-1])
    return np.unique(n.event[(depth > 0) & host])

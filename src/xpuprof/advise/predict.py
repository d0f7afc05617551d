"""Predicted gains: replay each recommendation's change (``xpuprof.sim.whatif``) and say what
it is worth per step, instead of the most it could be worth.

A rule's saving (``findings.Finding.saved_ms_per_step``) is an upper bound read off the
critical path: it cannot see what the step waits for once that time is gone. Replaying the
change on the trace's dependency graph can (``docs/whatif.md``): removing launch calls gains
nothing when the step then waits for a blocking copy. :func:`plan` maps a finding to the
what-if changes its recommendation stands for (``docs/advise.md`` has the table and why);
:func:`attach` replays them and fills the finding's prediction.

Numbers (all per step of the judged rank, in the selected steps):

- **run step**: how long a run of the selected steps takes per step: from the first step's
  start to the last step's *completion* — its host span's end or the end of the device work
  it launched, whichever is later — divided by the number of steps. Why not the mean host
  step: a change that stops the host waiting (no sync) lets it run ahead of the device, and
  the host steps shrink to the host's own work while the device still needs its time; the
  mean with-device step (step start to its device work's end) grows instead, as the work
  queues up. The run step is what a run of those steps would take either way. Steps that are
  not consecutive (a ``--steps 5,9`` selection) have no run between them: there each step's
  with-device time (the later of its host end and its device work's end) is averaged.
- ``prediction_of``: ``with_device`` when the device work of the step that completes last
  ends after its host span (the host runs ahead: the device bounds the run), else ``host``.
- ``predicted_step_ms``: the run step with the change; ``predicted_gain_ms``: the identity
  replay's run step minus it (both simulated, so the replay's own error cancels);
  ``predicted_gain_pct``: the gain in % of the identity replay's run step.
- ``error_band``: the signed error ((predicted − measured) / measured, %) that the what-if
  validation (``benchmarks/RESULTS.md``) measured for this kind of change, or None where no
  run has validated it (:data:`VALIDATED`).
- **Dropped**: a finding whose replay predicts a gain below :data:`MIN_GAIN` of the step
  leaves the table; a note names it, its change, its predicted gain, its bound and where the
  replayed critical path then runs, so nothing disappears unexplained.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.diagnosis import fmt_ns
from xpuprof.core.errors import XpuprofError
from xpuprof.sim.graph import HOST_END, HOST_START
from xpuprof.sim.whatif import INPUT_PATTERN, whatif

if TYPE_CHECKING:
    from xpuprof.advise.findings import Context, Finding
    from xpuprof.sim.graph import Nodes
    from xpuprof.sim.replay import Replay
    from xpuprof.sim.whatif import WhatIf

#: A prediction below this share of the step is dropped (issue 12: "drops those that gain
#: < 1 %"), the advisor's noise floor: below it a change cannot be told from the variation
#: between steps of one run.
MIN_GAIN = 0.01
#: DataLoader workers a single-process DataLoader's prediction gives it: a common setting, and
#: what the shared ResNet-50 pair ran (``num_workers_4``); where ``xpuprof.profile`` recorded
#: the process's CPUs the what-if also bounds the step by them.
WORKERS = 4
#: The measured error of each kind of change the advisor makes, ((predicted − measured) /
#: measured) in %, and the case that measured it: ``benchmarks/RESULTS.md``, "Issue 12:
#: what-if validation, every case" (run C: the median of 5 runs on this CPU).
VALIDATED: dict[str, tuple[float, str]] = {
    "no-input-wait": (-8.2, "input removed"),
    "dataloader-workers": (8.6, "2 workers"),
    "fuse-elementwise": (-8.1, "torch.compile"),
}
#: Input spans that the what-if finds without a pattern.
_DEFAULT_INPUT = re.compile(INPUT_PATTERN)


@dataclass(frozen=True)
class Plan:
    """The what-if changes a finding's recommendation stands for, applied together;
    ``bound``: True when they remove all of the time the finding is about (the most the
    recommendation can give, replayed), False when they are the recommended change itself."""

    changes: tuple[str, ...]
    bound: bool = False
    #: what the changes price when they stand for part of the advice only (then the finding is
    #: neither dropped nor ranked by the prediction: the rest of the advice is not priced)
    part: str | None = None

    @property
    def text(self) -> str:
        return "; ".join(self.changes)


@dataclass(frozen=True)
class Prediction:
    """A replayed change on the judged rank (module docstring); ``path``: where the critical
    path runs after the change (its two largest categories and their shares)."""

    plan: Plan
    baseline_ns: float
    predicted_ns: float
    of: str
    path: str

    @property
    def gain_ns(self) -> float:
        return self.baseline_ns - self.predicted_ns

    @property
    def gain_pct(self) -> float:
        return 100.0 * self.gain_ns / self.baseline_ns if self.baseline_ns > 0 else 0.0

    @property
    def error_band(self) -> float | None:
        verbs = {c.split(":")[0].split("=")[0] for c in self.plan.changes}
        if len(verbs) != 1:
            return None
        got = VALIDATED.get(verbs.pop())
        return got[0] if got else None


# ----------------------------------------------------------------------------- the changes


def plan(f: Finding, ctx: Context) -> Plan | str | None:
    """The changes that stand for ``f``'s recommendation; None where no what-if change
    expresses it, a string where one would but cannot select exactly what the finding is
    about (``docs/advise.md``, "Predicted gains", says why per rule)."""
    names = _names(ctx, f.events)
    if f.rule == "host-blocked" and f.events:
        return _unblock(ctx, f.events[0])
    if f.rule == "launch-overhead":
        return Plan(("cuda-graphs",))
    if f.rule in ("host-untraced", "python-overhead"):
        return Plan(("host-gaps=0",), bound=True)
    if f.rule == "host-cpu-bound":
        # "fuse ops … with torch.compile": the part a what-if can price is the fusion of the
        # elementwise chains (one op each, its dispatch and launches gone); the rest of the
        # advice (a fused optimizer, larger batches) has no factor in the trace
        return Plan(("fuse-elementwise",), part="the elementwise chains fused")
    if f.rule == "allocator" and names:
        return Plan((f"scale:runtime/{exact_pattern(names)}=0",), bound=True)
    if f.rule == "input-bound" and names and not _is_step(ctx, f.events[:1]):
        return _input_plan(names[0])
    if f.rule == "memory-copies" and names:
        xla = any(_family(n) != n for n in names)  # XLA's copies carry instance numbers
        rx = exact_pattern(sorted(set(map(_family, names))), instances=xla)
        return Plan((f"scale:device/{rx}=0",), bound=True)
    if f.rule == "communication" and "(bandwidth-bound)" in f.finding:
        # at the link's peak a collective's time follows its bytes: half the bytes (fp32
        # gradients sent as bf16, the recommendation's first remedy) halve the transfer
        return Plan(("scale:collective=0.5",))
    if f.rule == "communication" and "(exposed)" in f.finding and names:
        # "overlap the collectives with compute": the compute stream stops waiting for them
        # until the next step (a trace records no data flow that says where the result is
        # read: the most overlap can give); gloo's host-side collectives select nothing
        return Plan((f"overlap-collective:{exact_pattern(names)}",), bound=True)
    return None


def _unblock(ctx: Context, first: int) -> Plan | str:
    """The host-blocked change: the op whose blocking call the recommendation is about (the
    first on the path: ``aten::copy_`` of a pageable copy, ``aten::_local_scalar_dense`` of
    an ``.item()``) no longer blocks — its blocking calls (``cudaMemcpyAsync``, the
    ``cudaStreamSynchronize`` after it) neither wait for the device nor cost host time, as a
    pinned ``non_blocking=True`` copy or a read-back moved out of the step. A blocking call
    outside any op (``torch.cuda.synchronize()``) goes alone. The what-if selects calls by
    name only, so the change is made only when no call of those names runs elsewhere in the
    judged steps; otherwise a string says so."""
    from xpuprof.analysis.path_time import SYNC_CALLS

    w = ctx.where("e", device=False)
    region = _annotation_above(ctx, first)
    if region is not None:
        return _unblock_region(ctx, region, SYNC_CALLS)
    up = ctx.trace.sql("select p.name, p.level from events e join events p on p.id = e.parent "
                       f"where e.id = {int(first)}")  # fmt: skip
    op = str(up["name"].iloc[0]) if len(up) and up["level"].iloc[0] == "op" else None
    inside = (f"p.level = 'op' and p.name = '{op.replace(chr(39), chr(39) * 2)}'" if op else
              "(p.level is null or p.level <> 'op')")  # fmt: skip
    calls = ctx.trace.sql(
        f"select e.name, count(*) filter (where {inside}) as inside, count(*) as n from events "
        f"e left join events p on p.id = e.parent where {w} and e.level = 'runtime' group by "
        "e.name")  # fmt: skip
    calls = calls[calls["name"].isin(SYNC_CALLS) & (calls["inside"] > 0)]
    if calls.empty:
        return "no blocking call found under the finding's op"
    shared = calls[calls["n"] > calls["inside"]]
    if len(shared):
        where = f"`{op}`" if op else "no op"
        return (f"the what-if selects blocking calls by name, and {', '.join(shared['name'])} "
                f"also run outside {where} in these steps: a change cannot single out the "
                "finding's calls yet")  # fmt: skip
    rx = exact_pattern(sorted(calls["name"]))
    return Plan((f"no-sync:{rx}", f"scale:runtime/{rx}=0"))


def _annotation_above(ctx: Context, first: int) -> str | None:
    """The name of the innermost user annotation (``record_function``, not a step) that holds
    the event ``first``: the region a blocking call belongs to (``## copy_batch_to_gpu ##``)."""
    up = ctx.trace.sql(
        "with recursive a(id, parent, name, level, d) as (select id, parent, name, level, 0 "
        f"from events where id = {int(first)} union all select e.id, e.parent, e.name, "
        "e.level, a.d + 1 from events e join a on e.id = a.parent where a.d < 64) "
        "select name from a where level = 'annotation' order by d limit 1")  # fmt: skip
    return str(up["name"].iloc[0]) if len(up) else None


def _unblock_region(ctx: Context, region: str, sync_calls: frozenset[str]) -> Plan | str:
    """The blocking calls inside the annotation ``region`` (in the judged steps) stop waiting
    and cost no host time there, wherever else calls of those names run (``@REGION``): the
    copy the finding is about made non-blocking, nothing outside it touched."""
    w = ctx.where("e", device=False)
    q = region.replace("'", "''")
    calls = ctx.trace.sql(
        "select distinct e.name from events e join events r on r.part = e.part and "
        "r.pid = e.pid and r.tid = e.tid and r.ts <= e.ts and e.ts + e.dur <= r.ts + r.dur "
        f"where {w} and e.level = 'runtime' and r.level = 'annotation' and r.name = '{q}'"
    )
    names = sorted(set(calls["name"].astype(str)) & sync_calls)
    if not names:
        return f"no blocking call found inside `{region}`"
    rx, where = exact_pattern(names), exact_pattern([region])
    return Plan((f"no-sync:{rx}@{where}", f"scale:runtime/{rx}@{where}=0"))


def _input_plan(name: str) -> Plan:
    """Input spans: a single-process DataLoader gets :data:`WORKERS` workers (what its
    recommendation says); any other loader (workers that do not keep up, a TorchRec stage,
    tf.data, a user span) has its wait removed: the bound of making it faster or overlapping
    it."""
    default = _DEFAULT_INPUT.search(name) is not None
    if "_SingleProcessDataLoaderIter" in name:
        return Plan((f"dataloader-workers={WORKERS}" if default else
                     f"dataloader-workers:{exact_pattern([name])}={WORKERS}",))  # fmt: skip
    return Plan(
        ("no-input-wait" if default else f"no-input-wait:{exact_pattern([name])}",), bound=True
    )


def _names(ctx: Context, ids: list[int]) -> list[str]:
    """Distinct names of the events ``ids``, in their order."""
    if not ids:
        return []
    df = ctx.trace.sql(f"select id, name from events where id in ({', '.join(map(str, ids))})")
    by_id = dict(zip(df["id"].astype(int), df["name"].astype(str), strict=True))
    return list(dict.fromkeys(by_id[i] for i in ids if i in by_id))


def _is_step(ctx: Context, ids: list[int]) -> bool:
    """Whether the first event is a step span (input found between steps, with no span of
    its own: nothing a change can select)."""
    if not ids:
        return False
    df = ctx.trace.sql(f"select level from events where id = {int(ids[0])}")
    return bool(len(df)) and df["level"].iloc[0] == "step"


#: Characters with a meaning in a regular expression; ``=`` is written ``\x3d`` because a
#: change's factor follows the first ``=`` of its text.
_SPECIAL = re.compile(r"([.^$*+?{}\[\]\\|()])")
#: XLA's instance number after an op's name (``copy-done.2``).
_INSTANCE = r"(?:\.\d+)?"


def exact_pattern(names: list[str], *, instances: bool = False) -> str:
    """A pattern matching exactly ``names`` (``instances``: also with XLA's ``.N`` instance
    numbers), kept readable: only characters with a meaning are escaped."""
    alts = "|".join(_SPECIAL.sub(r"\\\1", n).replace("=", r"\x3d") for n in names)
    suffix = _INSTANCE if instances else ""
    return f"^(?:{alts}){suffix}$"


def _family(name: str) -> str:
    """An XLA op's name without its instance number (``copy-done.2`` → ``copy-done``)."""
    return re.sub(r"\.\d+$", "", name)


# ----------------------------------------------------------------------------- replay

_NO_CHANGE = "no what-if change expresses this recommendation"


def predict(f: Finding, ctx: Context) -> Prediction | str:
    """Replay ``f``'s change on the judged rank; a string saying why not where it cannot
    be (no change for this rule, no steps, a change the trace cannot take)."""
    p = plan(f, ctx)
    if p is None:
        return _NO_CHANGE
    if isinstance(p, str):
        return p
    if not ctx.steps:
        return "no step spans: the what-if compares steps"
    try:
        w = whatif(ctx.trace, list(p.changes), ranks=ctx.ranks, steps=ctx.selection)
    except XpuprofError as e:
        if f.rule != "host-blocked" or "no sync edge" not in str(e):
            return f"`{p.text}` cannot be replayed: {e}"
        # the calls block by their own host time (a pageable copy staged by the host), with
        # no wait for the device in the graph: their host time alone is what goes
        p = Plan(p.changes[1:], p.bound)
        try:
            w = whatif(ctx.trace, list(p.changes), ranks=ctx.ranks, steps=ctx.selection)
        except XpuprofError as e2:
            return f"`{p.text}` cannot be replayed: {e2}"
    got = run_step(w, ctx.part)
    if got is None:
        return f"`{p.text}`: the replay has no steps of rank {ctx.rank}"
    base, pred, of = got
    return Prediction(p, base, pred, of, _path(w, ctx.part))


def run_step(w: WhatIf, part: int) -> tuple[float, float, str] | None:
    """(baseline, predicted) run step of ``part`` and ``prediction_of`` (module docstring);
    None when the replay has no step of that part."""
    base = w.baseline
    st = base.steps
    if st.empty or part not in set(st["part"].tolist()):
        return None
    mine = np.flatnonzero(st["part"].to_numpy() == part)
    numbers = np.sort(st["step"].to_numpy()[mine].astype(np.int64))
    if len(numbers) > 1 and np.any(np.diff(numbers) != 1):  # no run between the steps
        rows = w.steps[w.steps["part"] == part]
        b = float(rows["baseline_with_device_ns"].mean())
        p = float(rows["predicted_with_device_ns"].mean())
        of = "with_device" if (rows["predicted_with_device_ns"] > rows["predicted_ns"]).any() \
            else "host"  # fmt: skip
        return b, p, of
    ids = base.step_ids[mine]
    steps = st["step"].to_numpy()[mine]
    b_span, _ = _span(base, base.time, ids, steps, part)
    p_span, of = _span(base, w.time, ids, steps, part)
    return b_span / len(mine), p_span / len(mine), of


def _span(base: Replay, time: np.ndarray, ids: np.ndarray, steps: np.ndarray,
          part: int) -> tuple[float, str]:  # fmt: skip
    """First step's start to the last completion under ``time``, and what completes last."""
    n = base.graph.nodes
    start = _node_of(n, HOST_START, ids)
    end = _node_of(n, HOST_END, ids)
    host_end = time[end].astype(float)
    dev_end = np.full(len(ids), -np.inf)
    ds = base.device_steps
    if len(ds):
        ds = ds[ds["part"] == part]
        last = pd.Series(time[ds["node"].to_numpy()], index=ds["step"].to_numpy())
        last = last.groupby(level=0).max()
        dev_end = last.reindex(steps).fillna(-np.inf).to_numpy(float)
    done = np.fmax(host_end, dev_end)
    k = int(np.argmax(done))
    of = "with_device" if dev_end[k] > host_end[k] else "host"
    return float(done.max() - time[start].min()), of


def _node_of(nodes: Nodes, kind: int, ids: np.ndarray) -> np.ndarray:
    """The graph node of each host event in ``ids`` of point ``kind`` (start or end)."""
    pick = nodes.kind == kind
    s = pd.Series(np.flatnonzero(pick), index=nodes.event[pick])
    return s[~s.index.duplicated()].reindex(ids).to_numpy()


def _path(w: WhatIf, part: int) -> str:
    """Where the replayed critical path runs after the change, its two largest categories:
    ``late start 63%, device compute 33%``."""
    cp = w.critical_path
    cp = cp[(cp["part"] == part) & (cp["predicted_ns"] > 0)]
    total = float(cp["predicted_ns"].sum())
    if cp.empty or total <= 0:
        return ""
    top = cp.sort_values("predicted_ns", ascending=False).head(2)
    top = top[top["predicted_ns"] >= 0.01 * total]  # a category below 1 % says nothing
    return ", ".join(f"{c} {float(v) / total:.0%}" for c, v in
                     zip(top["category"], top["predicted_ns"], strict=True))  # fmt: skip


# ----------------------------------------------------------------------------- the table


def attach(ctx: Context, findings: list[Finding]) -> tuple[list[Finding], list[str]]:
    """Replay every finding's change, fill its prediction, rank: predicted findings by
    predicted gain (largest first), then the others as the bound ranks them; those predicted
    to gain less than :data:`MIN_GAIN` of the step are left out; a finding without a
    prediction says why in its ``prediction`` (``no prediction: …``). Returns the findings
    and the notes (what was left out and why, what could not be replayed)."""
    kept: list[tuple[Finding, Prediction | None]] = []
    notes: list[str] = []
    for f in findings:
        got = predict(f, ctx)
        if isinstance(got, str):
            if got != _NO_CHANGE:
                notes.append(f"{f.rule}: no prediction, {got}; its bound stands")
            f.prediction = f"no prediction: {got}"
            kept.append((f, None))
            continue
        fill(f, got)
        if got.plan.part:  # part of the advice priced: its bound ranks it, nothing drops it
            kept.append((f, None))
            continue
        if got.gain_pct < 100 * MIN_GAIN:
            notes.append(_dropped(f, got))
            continue
        kept.append((f, got))
    with_p = sorted((x for x in kept if x[1] is not None), key=lambda x: -x[1].gain_ns)
    without = [x for x in kept if x[1] is None]  # already in the bound's order
    return [f for f, _ in with_p + without], notes


def fill(f: Finding, p: Prediction) -> None:
    """Write ``p`` into ``f``'s prediction fields."""
    f.change = p.plan.text
    f.predicted_step_ms = p.predicted_ns / 1e6
    f.predicted_gain_ms = p.gain_ns / 1e6
    f.predicted_gain_pct = round(p.gain_pct, 2)
    f.prediction_of = p.of
    f.error_band = p.error_band
    f.prediction = words(p)


def words(p: Prediction) -> str:
    """``predicted: 115.8 ms per step (−33.8 %, 59 ms saved) with `dataloader-workers=4`; …``"""
    what = "at most" if p.plan.bound else ""
    band = p.error_band
    trust = "a bound: the change removes all of that time; " if p.plan.bound else ""
    if band is not None:
        run = next(v[1] for k, v in VALIDATED.items() if p.plan.changes[0].startswith(k))
        trust += (f"this change's replay was {abs(band):.1f} % {'over' if band > 0 else 'under'}"
                  f" the measured step on a validation run ({run})")  # fmt: skip
    else:
        trust += "not validated"
    part = (f" for {p.plan.part} alone (the rest of the advice is not priced)"
            if p.plan.part else "")  # fmt: skip
    return (
        f"predicted{' ' + what if what else ''}{part}: {fmt_ns(p.predicted_ns)} per step "
        f"({-p.gain_pct:+.1f} %, {fmt_ns(p.gain_ns)} saved) with `{p.plan.text}`, judged "
        f"on the {'device work' if p.of == 'with_device' else 'host steps'}; {trust}"
    )


def _dropped(f: Finding, p: Prediction) -> str:
    bound = ("" if math.isnan(f.saved_ms_per_step)
             else f" (its bound said up to {fmt_ns(f.saved_ms_per_step * 1e6)})")  # fmt: skip
    path = f"; after it the replayed critical path runs through {p.path}" if p.path else ""
    if "late start" in p.path:
        path += (
            " (late start: a thread or stream whose first event keeps its measured time, "
            "as nothing recorded says what it waited for)"
        )
    return (
        f"dropped {f.rule}: `{p.plan.text}` is predicted to save {fmt_ns(p.gain_ns)} per "
        f"step ({p.gain_pct:.2f} %, below {MIN_GAIN:.0%}){bound}{path}"
    )

"""What every analysis needs: selecting events, classifying device work, interval arithmetic,
and saying plainly what could not be computed.

Analyses are pure functions ``tool(trace, *, ranks=None, steps=None, **options) -> Result``;
they never print and never parse files. Interval arithmetic is vectorized numpy over sorted
arrays: the busy time of a GPU stream with a million kernels is one sort and one cumulative
maximum, not a Python loop.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from xpuprof.core.names import DEVICE_LEVELS  # noqa: F401  (re-exported)
from xpuprof.core.result import Result  # noqa: F401  (re-exported: tools import it from here)

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace
    from xpuprof.trace.tree import EventTree

#: HTA's kernel types (hta/common/trace_parser ... KernelType): communication (NCCL/RCCL
#: collectives), memory (memcpy/memset), computation (every other kernel), other.
COMMUNICATION, MEMORY, COMPUTATION, OTHER = "COMMUNICATION", "MEMORY", "COMPUTATION", "OTHER"


#: What every tool's ``steps`` accepts: ``None`` or ``"all"`` (every step: the default of every
#: tool), step numbers, or ``"drop-last"`` (HTA's default: leave out each rank's last profiler
#: step, which a trace usually stops inside). ``"drop_last"`` is accepted as a spelling of it.
StepSelection = Iterable[int] | Literal["all", "drop-last", "drop_last"] | None


def step_mode(
    steps: StepSelection, *, hta_compatible: bool = False
) -> tuple[Literal["all", "drop-last", "list"], list[int] | None]:
    """A step selection as ``(mode, numbers)``: ``("all", None)``, ``("drop-last", None)`` or
    ``("list", [numbers])``. ``None`` means every step, except with ``hta_compatible``, where
    it means what HTA does by default: drop the last step."""
    from xpuprof.core.errors import XpuprofError

    if steps is None:
        return ("drop-last", None) if hta_compatible else ("all", None)
    if isinstance(steps, str):
        if steps == "all":
            return "all", None
        if steps in ("drop-last", "drop_last"):
            return "drop-last", None
        raise XpuprofError(f"steps must be 'all', 'drop-last' or step numbers, not {steps!r}")
    try:
        return "list", [int(s) for s in steps]
    except (TypeError, ValueError):
        raise XpuprofError(
            f"steps must be 'all', 'drop-last' or step numbers, not {steps!r}"
        ) from None


def steps_where(steps: StepSelection, *, alias: str = "", hta_compatible: bool = False) -> str:
    """SQL predicate over the events table selecting the events of a step selection (``true``
    for all steps). ``drop-last`` leaves out, per rank with at least two step spans, the events
    of its last step; events outside any step are kept."""
    mode, numbers = step_mode(steps, hta_compatible=hta_compatible)
    p = f"{alias}." if alias else ""
    if mode == "all":
        return "true"
    if mode == "list":
        return f"{p}step in ({', '.join(map(str, numbers)) or 'null'})"  # type: ignore[arg-type]
    last = (
        "select coalesce(rank, -1) as r, max(step) as s from events where level = 'step' "
        "group by 1 having count(*) >= 2"
    )
    return (
        f"not exists (select 1 from ({last}) last_step where last_step.r = coalesce({p}rank, -1)"
        f" and last_step.s = {p}step)"
    )


def where_clause(
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    levels: Iterable[str] | None = None,
    alias: str = "",
) -> str:
    """SQL predicate for the usual filters (an empty filter is ``true``)."""
    p = f"{alias}." if alias else ""
    parts = ["true"]
    if ranks is not None:
        parts.append(f"{p}rank in ({', '.join(str(int(r)) for r in ranks)})")
    if steps is not None:
        parts.append(steps_where(steps, alias=alias))
    if levels is not None:
        parts.append(f"{p}level in ({', '.join(repr(str(lv)) for lv in levels)})")
    return " and ".join(parts)


def events(
    trace: Trace,
    columns: Iterable[str] = ("id", "rank", "pid", "tid", "device", "stream", "level", "name",
                              "ts", "dur", "parent", "correlation", "step"),
    ranks: Iterable[int] | None = None,
    steps: Iterable[int] | None = None,
    levels: Iterable[str] | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Selected columns of the events table as pandas, filtered in DuckDB (only what is asked
    for is read from Parquet)."""
    cols = ", ".join(columns)
    return trace.sql(
        f"select {cols} from events where {where_clause(ranks, steps, levels)} order by ts"
    )


def trace_start(trace: Trace) -> int | None:
    """The time of the trace's first event (ns; None for a store without events): where
    "into the trace" counts from, in a headline and in the terminal's timestamps."""
    key = ("trace start",)
    if key not in trace.memo:
        start = trace.sql("select min(ts) as t from events")["t"].iloc[0]
        trace.memo[key] = None if pd.isna(start) else int(start)
    return trace.memo[key]


def kernel_type(level: pd.Series, name: pd.Series) -> pd.Series:
    """HTA's kernel type of device events, from their level: COMMUNICATION for collectives
    and NCCL kernels, MEMORY for memcpy, memset, MTIA's DMA transfers (kernels named
    ``dma*``, which HTA types MEMORY too) and XLA's async copy ops (``copy-start``,
    ``copy-done``: the device waits in them for a copy), COMPUTATION for every other kernel,
    OTHER for the rest. The one classifier of xpuprof; HTA's name-based rule is the
    ``name_types`` quirk (:func:`xpuprof.analysis.hta.hta_kernel_type`). Evaluated once per
    distinct (level, name), so a million kernels cost a factorization, not a million string
    matches."""
    lc, lu = pd.factorize(level, use_na_sentinel=False)
    nc, nu = pd.factorize(name, use_na_sentinel=False)
    width = max(len(nu), 1)
    inv, pairs = pd.factorize(lc.astype(np.int64) * width + nc)
    lv = pd.Series(np.asarray(lu, dtype=object)[pairs // width]).astype(str)
    nm = pd.Series(np.asarray(nu, dtype=object)[pairs % width]).astype(str)
    out = np.full(len(lv), OTHER, dtype=object)
    out[(lv == "kernel").to_numpy()] = COMPUTATION
    memory = lv.isin(["memcpy", "memset"]) | (
        (lv == "kernel") & (nm.str.startswith("dma") | nm.str.match(r"^copy-(start|done)(\.\d+)?$"))
    )
    out[memory.to_numpy()] = MEMORY
    comm = (lv == "collective") | nm.str.contains("nccl", case=False, regex=False)
    out[(comm & lv.isin(DEVICE_LEVELS)).to_numpy()] = COMMUNICATION
    return pd.Series(out[inv], index=level.index, dtype=object)


#: The one split of device work every tool shows: :func:`kernel_type`'s MEMORY is split into
#: copies (``memcpy``: memcpy events and DMA transfers such as MTIA's ``dma_request``) and
#: ``memset``; COMPUTATION is ``compute``, COMMUNICATION ``communication``, OTHER ``other``.
WORK_CLASSES: tuple[str, ...] = ("compute", "communication", "memcpy", "memset", "other")


def work_class(level: pd.Series, name: pd.Series) -> pd.Series:
    """The :data:`WORK_CLASSES` entry of each device event: :func:`kernel_type` with MEMORY
    split by level (``memset`` events are sets; copies and DMA kernels are copies), so that
    the overview, the diagnosis and the breakdown never disagree on what is memory work."""
    kt = kernel_type(level, name).to_numpy()
    lv = pd.Series(level).astype(str).to_numpy()
    out = np.full(len(kt), "other", dtype=object)
    out[kt == COMPUTATION] = "compute"
    out[kt == COMMUNICATION] = "communication"
    out[(kt == MEMORY) & (lv != "memset")] = "memcpy"
    out[(kt == MEMORY) & (lv == "memset")] = "memset"
    return pd.Series(out, index=level.index, dtype=object)


def merge_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals as sorted, disjoint intervals."""
    if len(start) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    o = np.argsort(start, kind="stable")
    s = np.asarray(start, np.int64)[o]
    e = np.asarray(end, np.int64)[o]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    starts = s[new]
    idx = np.flatnonzero(new)
    ends = np.maximum.reduceat(e, idx) if len(idx) else e
    # reduceat gives the max end within each group of overlapping intervals
    return starts, ends


def union_length(start: np.ndarray, end: np.ndarray) -> int:
    s, e = merge_intervals(start, end)
    return int((e - s).sum())


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of (union of a) ∩ (union of b); both given as merged, disjoint intervals."""
    a_s, a_e = a
    b_s, b_e = b
    if not len(a_s) or not len(b_s):
        return 0
    # sweep: at each boundary count how many of the two unions are open
    pts = np.concatenate([a_s, a_e, b_s, b_e])
    delta = np.concatenate(
        [np.ones(len(a_s)), -np.ones(len(a_e)), np.ones(len(b_s)), -np.ones(len(b_e))]
    ).astype(np.int64)
    o = np.lexsort((delta, pts))  # ends before starts at the same time: [s, e) intervals
    pts, delta = pts[o], delta[o]
    depth = np.cumsum(delta)
    both = depth[:-1] == 2
    return int((np.diff(pts)[both]).sum())


def steps_mask(t: EventTree, steps: StepSelection = None) -> np.ndarray:
    """Mask of the tree's rows in the selected steps (``analysis.common.StepSelection``)."""
    mode, numbers = step_mode(steps)
    if mode == "all":
        return np.ones(t.n, bool)
    return t.step_mask(numbers, drop_last=mode == "drop-last")


def select_rows(
    t: EventTree, steps: StepSelection = None, levels: Iterable[str] | None = None
) -> np.ndarray:
    """Rows of the tree at the given levels (None: all) in the selected steps."""
    mask = steps_mask(t, steps)
    if levels is not None:
        mask &= t.is_level(*levels)
    return np.flatnonzero(mask)


# ------------------------------------------------------------------ what a selection found


def number_ranges(numbers: Iterable[int], most: int = 12) -> str:
    """``[0, 1, 2, 3, 7, 8]`` → ``"0-3, 7, 8"`` (runs of three or more as ranges); beyond
    ``most`` entries, the rest is counted."""
    xs = sorted({int(n) for n in numbers})
    runs: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        if j - i >= 2:
            runs.append(f"{xs[i]}-{xs[j]}")
        else:
            runs.extend(map(str, xs[i : j + 1]))
        i = j + 1
    if len(runs) > most:
        return f"{', '.join(runs[:most])}, … ({len(xs):,} in all)"
    return ", ".join(runs)


def _counts(trace: Trace) -> pd.DataFrame:
    """Events per (rank, step), nulls included: what a selection is checked against (one
    group-by, cached on the trace)."""
    key = ("events per rank and step",)
    if key not in trace.memo:
        trace.memo[key] = trace.sql("select rank, step, count(*) as n from events group by all")
    return trace.memo[key]


def _plural(word: str, n: int) -> str:
    return word if n == 1 else word + "s"


#: What each ``steps_from`` of the manifest (``trace.normalize.steps.STEPS_FROM``) means, for
#: the note every tool adds when a trace's steps are not torch.profiler's ``ProfilerStep#N``.
STEPS_FROM_WORDS = {
    "XLA step marker": "steps from XLA's step markers (step_num)",
    "xpuprof.step": "steps from xpuprof.step spans",
    "step spans": "steps from the reader's step spans",
    "Optimizer.step": "steps inferred from Optimizer.step spans, each from the end of one "
    "optimizer update to the end of the next (no ProfilerStep#N in the trace; docs/steps.md)",
    "XLA module runs": "steps inferred from the device's runs of its most frequent XLA program "
    "(no step markers in the trace; docs/steps.md)",
    "forward calls": "steps inferred from the model's top-level forward calls, each from the "
    "start of one to the start of the next (no ProfilerStep#N in the trace; docs/steps.md)",
}


def steps_from_notes(trace: Trace, *, ranks: Iterable[int] | None = None) -> list[str]:
    """Where the selected ranks' steps come from, as notes, when it is not torch.profiler's
    ``ProfilerStep#N`` (and there are steps): an inferred "step" is an answer's unit, so
    every tool says what it is (docs/steps.md). One note per kind, naming the ranks when the
    store's sources disagree."""
    want = None if ranks is None else {int(r) for r in ranks}
    by: dict[str, set[int]] = {}
    kinds = set()
    for src in trace.sources:
        if want is not None and src.get("rank") not in want:
            continue
        kind = src.get("steps_from") or "none"
        kinds.add(kind)
        if kind in STEPS_FROM_WORDS:
            by.setdefault(kind, set()).add(int(src.get("rank") or 0))
    notes = []
    for kind, on in by.items():
        who = f" (rank{'s' if len(on) > 1 else ''} {number_ranges(sorted(on))})"
        notes.append(STEPS_FROM_WORDS[kind] + (who if len(kinds) > 1 else ""))
    return notes


def selection_notes(
    trace: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None
) -> tuple[list[str], bool]:
    """What a rank or step selection asks for that the store does not hold, as notes (e.g.
    ``no events on rank 5; ranks in this store: 0``), and whether it selects any event at all.
    Tools answer an empty selection with empty tables; these notes say why, in the terms the
    user chose, instead of leaving them to guess (no steps? no device? a typo in --rank?)."""
    ranks = None if ranks is None else [int(r) for r in ranks]
    counts = _counts(trace)
    if not int(counts["n"].sum()):
        return ["this store holds no events: there is nothing to analyse"], False
    rank = counts["rank"]
    notes: list[str] = []
    if ranks is not None:
        want = sorted({int(r) for r in ranks})
        have = sorted(int(r) for r in rank.dropna().unique())
        missing = sorted(set(want) - set(have))
        if missing:
            on = f"no events on {_plural('rank', len(missing))} {number_ranges(missing)}"
            notes.append(f"{on}; ranks in this store: {number_ranges(have)}" if have else
                         f"{on}: the events of this store carry no rank number")  # fmt: skip
        want = sorted(set(want) & set(have)) or want
        counts = counts[rank.isin(want)]
    mode, numbers = step_mode(steps)
    if mode == "list" and not counts.empty:
        have = sorted(int(s) for s in counts["step"].dropna().unique())
        missing = sorted(set(numbers or ()) - set(have))
        gone = f"no events in {_plural('step', len(missing))} {number_ranges(missing)}"
        where = ("in this store" if ranks is None else
                 f"on {_plural('rank', len(want))} {number_ranges(want)}")  # fmt: skip
        if missing and have:
            notes.append(f"{gone}; steps {where}: {number_ranges(have)}")
        elif missing:
            notes.append(f"{gone}: there are no step spans {where}")
        counts = counts[counts["step"].isin(numbers or ())]
    selected = bool(int(counts["n"].sum()))
    if not selected and not notes:  # an empty list of ranks or steps
        asked = [f"ranks {ranks}" if ranks is not None else "",
                 f"steps {numbers}" if mode == "list" else ""]  # fmt: skip
        notes.append(f"the selection ({', '.join(filter(None, asked))}) matches no event")
    return notes, selected


def missing_ranks_note(trace: Trace) -> str | None:
    """One note when a store holds several ranks of a job but not all of them (from
    :meth:`Trace.job`): which are absent, and that the numbers are of the ranks present. A
    store of one rank (one rank profiled on purpose) gets none."""
    job = trace.job()
    if len(job["ranks"]) < 2 or not job["missing"]:
        return None
    miss = job["missing"]
    named = ", ".join(map(str, miss[:10])) + (f" and {len(miss) - 10} more" if len(miss) > 10
                                               else "")  # fmt: skip
    return (
        f"rank{'s' if len(miss) > 1 else ''} {named} of world size {job['world_size']} "
        f"{'are' if len(miss) > 1 else 'is'} not in the store: the numbers are of the "
        f"{len(job['ranks'])} ranks present"
    )

"""Input pipeline: how much of each step waits for data, classified as XProf classifies it.

Input time is host time in input spans, found by name (:data:`INPUT_PATTERNS`, listed with
where each name comes from in ``docs/steps.md``): the DataLoader iterator's ``__next__``
(single- and multi-process), TorchRec's pipeline stages (``## copy_batch_to_gpu ##``,
``## sparse_data_dist ##``, …), tf.data's ``IteratorGetNext`` and user annotations that name
input (``load_batch``…). A training loop fetches the next batch before it can launch the step's
work, so that time is time the step waited for input — less, on a rank with devices, the part
during which its devices were running work anyway (XProf ranks device compute above host input
waits: input time is the device waiting for input). At the step and layer capture levels
(no framework ops recorded) a DataLoader leaves no span, so the host time *between* step spans
and at the start of a step before its first recorded span counts as input too (kind
``between-ops``): that is where a loop fetches its batch. XProf's thresholds (its input-pipeline
analyzer): input ≥ 20 % of the step time is *highly* input-bound, ≥ 5 % *moderately*, else not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import (
    Result,
    StepSelection,
    intersection_length,
    merge_intervals,
    where_clause,
)
from xpuprof.core.errors import XpuprofError
from xpuprof.core.names import DEVICE_LEVELS

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: XProf's input-bound thresholds (fraction of step time spent waiting for input).
HIGHLY_INPUT_BOUND = 0.20
MODERATELY_INPUT_BOUND = 0.05


@dataclass(frozen=True)
class InputPattern:
    """Names of input spans: ``kind`` (``dataloader``, ``torchrec``, ``annotation``), a
    regular expression searched in the span's name, and where such names come from."""

    kind: str
    regex: str
    source: str


#: The default input-span names, first match decides the kind. Extend with
#: ``patterns=[*INPUT_PATTERNS, InputPattern("annotation", r"my_reader", "my code")]``.
INPUT_PATTERNS: tuple[InputPattern, ...] = (
    InputPattern(
        "dataloader",
        r"^enumerate\(DataLoader\)#",
        "torch.utils.data: every DataLoader iterator (_SingleProcessDataLoaderIter, "
        "_MultiProcessingDataLoaderIter) records its __next__ as "
        "enumerate(DataLoader)#<iterator>.__next__",
    ),
    InputPattern(
        "dataloader",
        r"^IteratorGetNext",
        "tf.data: the op that waits for the next element (XProf's HOST_WAIT_INPUT)",
    ),
    InputPattern(
        "torchrec",
        r"^## (?:next_batch|load_batch|copy_batch_to_gpu|wait_for_batch|"
        r"(?:start_|wait_)?sparse_data_dist)(?: [^#]*)? ##$",
        "TorchRec's TrainPipelineBase/SparseDist (torchrec/distributed/train_pipeline): "
        "fetching the batch, copying it to the device, waiting for the copy, and the input "
        "distribution of sparse features (## sparse_data_dist ## in 2023 releases, "
        "## start_/wait_sparse_data_dist N ## later)",
    ),
    InputPattern(
        "annotation",
        r"(?i:load_batch|get_batch|next_batch|fetch_batch|read_batch|data_?loading|"
        r"data_?loader|input_pipeline)",
        "names users give input loading (xpuprof.annotate / record_function)",
    ),
)

#: Kinds of :func:`input_spans` rows.
KINDS = ("dataloader", "torchrec", "annotation", "between-ops")

#: One regular expression for all default names (for code that only asks "is this input?").
INPUT_NAME = re.compile("|".join(f"(?:{p.regex})" for p in INPUT_PATTERNS))

_COLUMNS = ["id", "rank", "step", "ts", "dur", "name", "kind"]
#: Levels of host spans that cover host time: what the step is seen doing.
_COVERING = ("layer", "op", "runtime", "annotation", "python")
_BEFORE = "host time before the step's first recorded span"
_BETWEEN = "host time between steps"


def classify(fraction: float) -> str:
    if fraction >= HIGHLY_INPUT_BOUND:
        return "highly input-bound"
    if fraction >= MODERATELY_INPUT_BOUND:
        return "moderately input-bound"
    return "not input-bound"


def _compile(patterns: Iterable[InputPattern | str] | None) -> list[tuple[str, re.Pattern]]:
    out = []
    for p in INPUT_PATTERNS if patterns is None else patterns:
        kind, rx = ("annotation", p) if isinstance(p, str) else (p.kind, p.regex)
        try:
            out.append((kind, re.compile(rx)))
        except re.error as e:
            raise XpuprofError(f"pattern {rx!r}: not a regular expression ({e})") from None
    return out


def input_spans(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    patterns: Iterable[InputPattern | str] | None = None,
) -> pd.DataFrame:
    """One row per input span of the host (``id, rank, step, ts, dur, name, kind``).

    Named spans matching ``patterns`` (default :data:`INPUT_PATTERNS`; a plain string is a
    regex of kind ``annotation``), outermost only: a span inside another input span on its
    thread is left out, its time being in the outer one, so the rows of one thread never
    overlap. For ranks with no framework ops recorded (xpuprof's ``step``/``layer`` capture
    levels), also rows of kind ``between-ops`` (``id`` null): host time between consecutive
    step spans of a thread (attributed to the next step) and from a step's start to its first
    recorded span, less any span there — where a loop fetches its next batch.
    """
    rx = _compile(patterns)
    ranks = list(ranks) if ranks is not None else None
    out = [_named(trace, ranks, steps, rx)]
    out.append(_between_ops(trace, ranks, steps))
    df = pd.concat([d for d in out if not d.empty], ignore_index=True) if any(
        not d.empty for d in out
    ) else pd.DataFrame({c: pd.Series(dtype=object) for c in _COLUMNS})  # fmt: skip
    for c in ("id", "rank", "step"):
        df[c] = df[c].astype("Int64")
    for c in ("ts", "dur"):
        df[c] = df[c].astype(np.int64)
    return df[_COLUMNS].sort_values(["rank", "ts"], ignore_index=True)


def _named(
    trace: Trace, ranks: list[int] | None, steps: StepSelection, rx: list[tuple[str, re.Pattern]]
) -> pd.DataFrame:
    """The outermost host spans whose names match, with their kind."""
    where = where_clause(ranks, steps)
    names = trace.sql(
        "select distinct name from events where device < 0 and dur is not null and "
        f"level <> 'step' and {where}"
    ).name
    kind = {}
    for n in names:
        if isinstance(n, str):
            k = next((k for k, r in rx if r.search(n)), None)
            if k is not None:
                kind[n] = k
    if not kind:
        return pd.DataFrame(columns=_COLUMNS)
    lst = ", ".join("'" + n.replace("'", "''") + "'" for n in kind)
    df = trace.sql(
        "select id, rank, pid, tid, step, ts, dur, name from events where device < 0 and "
        f"dur is not null and level <> 'step' and name in ({lst}) and {where}"
    )
    df = df.sort_values(["rank", "pid", "tid", "ts", "dur"], ascending=[1, 1, 1, 1, 0])
    end = df.ts + df.dur
    reach = end.groupby([df["rank"], df.pid, df.tid], dropna=False).cummax()
    prev = reach.groupby([df["rank"], df.pid, df.tid], dropna=False).shift(1)
    df = df[prev.isna() | (df.ts >= prev)].copy()
    df["kind"] = df.name.map(kind)
    return df[_COLUMNS]


def _between_ops(trace: Trace, ranks: list[int] | None, steps: StepSelection) -> pd.DataFrame:
    """``between-ops`` rows of the ranks with no framework ops on the host (see
    :func:`input_spans`)."""
    rank_sel = where_clause(ranks)
    with_ops = set(
        trace.sql(
            f"select distinct rank from events where level = 'op' and device < 0 and {rank_sel}"
        )["rank"]
    )
    st = trace.sql(
        "select rank, pid, tid, step, ts, dur from events where level = 'step' and device < 0 "
        f"and dur is not null and {rank_sel} order by rank, pid, tid, ts"
    )
    st = st[~st["rank"].isin(with_ops)]
    st["rank"] = st["rank"].fillna(-1)
    if st.empty:
        return pd.DataFrame(columns=_COLUMNS)
    selected = set(
        trace.sql(
            "select distinct step from events where level = 'step' and "
            + where_clause(ranks, steps)
        )["step"]
    )
    cov = trace.sql(
        "select rank, pid, tid, ts, ts + dur as e from events where device < 0 and dur > 0 and "
        f"level in ({', '.join(repr(x) for x in _COVERING)}) and {rank_sel}"
    )
    cov["rank"] = cov["rank"].fillna(-1)
    cover = dict(tuple(cov.groupby(["rank", "pid", "tid"], sort=False)))
    rows = []
    for key, s in st.groupby(["rank", "pid", "tid"], sort=False):
        c = cover.get(key, cov.iloc[:0])
        rows.append(_gaps(key[0], s, c.ts.to_numpy(np.int64), c.e.to_numpy(np.int64)))
    df = pd.concat(rows, ignore_index=True)
    df["rank"] = df["rank"].where(df["rank"] >= 0)
    return df[df.step.isin(selected)] if steps is not None else df


def _gaps(rank: int, s: pd.DataFrame, cs: np.ndarray, ce: np.ndarray) -> pd.DataFrame:
    """The uncovered host time of one thread's steps: between consecutive step spans, and
    from each step's start to its first covering span (none when the step has none)."""
    ts = s.ts.to_numpy(np.int64)
    end = ts + s.dur.to_numpy(np.int64)
    no = s.step.to_numpy()
    ms, me = merge_intervals(cs, ce)
    # from the start of each step to the first covered moment in it
    k = np.searchsorted(me, ts, side="right")
    nxt = ms[np.minimum(k, len(ms) - 1)] if len(ms) else np.zeros(len(ts), np.int64)
    first = np.where(k < len(ms), np.maximum(ts, nxt), np.iinfo(np.int64).max)
    has_work = first < end
    zone_s = [ts[has_work], end[:-1]]
    zone_e = [first[has_work], ts[1:]]
    zone_no = [no[has_work], no[1:]]
    zone_nm = [
        np.full(int(has_work.sum()), _BEFORE, object),
        np.full(len(ts) - 1, _BETWEEN, object),
    ]
    zs, ze = np.concatenate(zone_s), np.concatenate(zone_e)
    zn, znm = np.concatenate(zone_no), np.concatenate(zone_nm)
    ok = ze > zs
    zs, ze, zn, znm = zs[ok], ze[ok], zn[ok], znm[ok]
    out_s, out_e, out_i = _minus(zs, ze, ms, me)
    return pd.DataFrame(
        {"id": pd.array([pd.NA] * len(out_s), "Int64"), "rank": rank, "step": zn[out_i],
         "ts": out_s, "dur": out_e - out_s, "name": znm[out_i], "kind": "between-ops"}
    )  # fmt: skip


def _minus(
    zs: np.ndarray, ze: np.ndarray, ms: np.ndarray, me: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces of the intervals [zs, ze) outside the disjoint sorted intervals [ms, me): their
    starts, ends and the interval each comes from."""
    out_s, out_e, out_i = [], [], []
    for i, (a, b) in enumerate(zip(zs.tolist(), ze.tolist(), strict=True)):
        j = int(np.searchsorted(me, a, side="right"))
        t = a
        while j < len(ms) and ms[j] < b:
            if ms[j] > t:
                out_s.append(t), out_e.append(int(ms[j])), out_i.append(i)
            t = max(t, int(me[j]))
            j += 1
        if t < b:
            out_s.append(t), out_e.append(b), out_i.append(i)
    return (np.asarray(out_s, np.int64), np.asarray(out_e, np.int64),
            np.asarray(out_i, np.int64))  # fmt: skip


def input_pipeline(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    pattern: str | None = None,
    patterns: Iterable[InputPattern | str] | None = None,
) -> Result:
    """Per step: step time, host time in input spans (their union: ``input_host_ns``), the
    part of it no device of the rank was busy (``input_ns``, what the step waited; equal on a
    rank without devices), its fraction, and XProf's classification; a summary per rank; the
    input spans found, by name.

    ``patterns`` replaces the default names (:data:`INPUT_PATTERNS`; extend them with
    ``[*INPUT_PATTERNS, "my_loader"]``); ``pattern`` (one regular expression, the CLI's
    ``--pattern``) is added to them. A step's time runs from its span's start, or from the
    start of the ``between-ops`` input before it, to its end.
    Facts: ``headline``, ``input_fraction`` (of all selected step time, over every rank),
    ``input_spans`` (distinct names of named input spans found), ``input_kinds`` (the kinds
    found, comma-separated).
    """
    pats = list(INPUT_PATTERNS if patterns is None else patterns)
    if pattern:
        pats.append(pattern)
    spans = input_spans(trace, ranks=ranks, steps=steps, patterns=pats)
    res = Result()
    step_rows = trace.sql(
        "select rank, step, ts, dur from events where level = 'step' and dur is not null and "
        f"{where_clause(ranks, steps)} order by rank, ts"
    )
    if step_rows.empty:
        res.notes.append(
            "no step spans (none of ProfilerStep#N, an XLA step marker, xpuprof.step, "
            "Optimizer.step or repeated forward calls; see docs/steps.md): input time per step "
            "needs steps"
        )
        if not spans.empty:
            res.tables["input_spans"] = _by_name(spans)
        return res
    busy = trace.sql(
        "select rank, ts, ts + dur as e from events where device >= 0 and dur > 0 and level in "
        f"({', '.join(repr(x) for x in DEVICE_LEVELS)}) and {where_clause(ranks)}"
    )
    per_step = _per_step(step_rows, spans, busy)
    if not spans.empty:  # else every step's input is 0: the summary says it once
        res.tables["steps"] = per_step
    res.tables["summary"] = summary = _summary(per_step)
    total = int(summary.step_ns.sum())
    frac = float(summary.input_ns.sum() / total) if total else 0.0
    named = spans[spans.kind != "between-ops"]
    if spans.empty:
        res.notes.append(
            "no input spans found (DataLoader iterator spans, TorchRec pipeline stages, "
            "IteratorGetNext, or names like load_batch: docs/steps.md): input time is taken as "
            "0; annotate input loading with xpuprof.annotate('load_batch') if it is none of "
            "these"
        )
    else:
        res.tables["input_spans"] = _by_name(spans)
    if (spans.kind == "between-ops").any():
        res.notes.append(
            "no framework ops recorded (capture level step or layer): host time between steps "
            "and before a step's first layer span is counted as input; data loaded after a "
            "step's last layer span cannot be told apart from the backward pass and the "
            "optimizer at this level (capture at level='op' to see the DataLoader itself)"
        )
    kinds = sorted(set(spans.kind))
    res.facts = {
        "input_fraction": frac,
        "input_spans": int(named.name.nunique()),
        "input_kinds": ", ".join(kinds),
        "headline": _headline(frac, spans, summary),
    }
    return res


def _summary(per_step: pd.DataFrame) -> pd.DataFrame:
    """Per rank: steps, their time, input time (waited and on the host), fraction, class."""
    summary = (
        per_step.groupby("rank", dropna=False)
        .agg(
            steps=("step", "count"),
            step_ns=("step_ns", "sum"),
            input_ns=("input_ns", "sum"),
            input_host_ns=("input_host_ns", "sum"),
        )
        .reset_index()
    )
    summary["input_fraction"] = summary.input_ns / summary.step_ns
    summary["classification"] = summary.input_fraction.map(classify)
    return summary


def _headline(frac: float, spans: pd.DataFrame, summary: pd.DataFrame) -> str:
    if spans.empty:
        return "Input: no input spans found; input time taken as 0"
    top = _label(spans.groupby("name").dur.sum().sort_values(ascending=False).index[0])
    steps = int(summary.steps.sum())
    per_step = float(summary.input_ns.sum()) / steps / 1e6 if steps else 0.0
    return (
        f"Input: {frac:.0%} of step time waits for input ({per_step:.2f} ms per step, mostly "
        f"{top}): {classify(frac)}"
    )


def _label(name: str) -> str:
    """A short name for a headline (the DataLoader's spans say where it loads)."""
    if name.startswith("enumerate(DataLoader)#_SingleProcess"):
        return "the DataLoader, loading in the main process"
    if name.startswith("enumerate(DataLoader)#_MultiProcessing"):
        return "the DataLoader, waiting for its workers"
    return name


def _by_name(spans: pd.DataFrame) -> pd.DataFrame:
    """Input spans found, by name: kind, count, total time."""
    return (
        spans.groupby(["name", "kind"])
        .agg(count=("ts", "size"), total_ns=("dur", "sum"))
        .reset_index()
        .sort_values("total_ns", ascending=False, ignore_index=True)
    )


def step_starts(windows: pd.DataFrame, spans: pd.DataFrame, by: str = "rank") -> np.ndarray:
    """Where each step's time starts: the window's ``ts``, or the start of the
    ``between-ops`` input attributed to that step (:func:`input_spans`) when earlier. At the
    step and layer capture levels a loop fetches the step's batch before its span opens, and
    the step waits for it, so that wait is part of the step for every tool that measures
    steps (``docs/steps.md``). ``windows``: one row per step, columns ``by`` (``rank`` or
    ``part``), ``step``, ``ts``; ``spans``: the same key columns, ``ts`` and ``kind``."""
    ts = windows["ts"].to_numpy(np.int64)
    if spans is None or spans.empty or "kind" not in spans:
        return ts.copy()
    lead = spans[(spans["kind"] == "between-ops").fillna(False).to_numpy(bool)]
    if lead.empty:
        return ts.copy()

    def key(df: pd.DataFrame) -> pd.MultiIndex:
        return pd.MultiIndex.from_arrays(
            [pd.Series(df[c]).astype("Float64").fillna(-1).astype(np.int64).to_numpy()
             for c in (by, "step")])  # fmt: skip

    first = pd.Series(lead["ts"].to_numpy(np.int64), index=key(lead)).groupby(level=[0, 1]).min()
    far = np.iinfo(np.int64).max
    return np.minimum(ts, first.reindex(key(windows), fill_value=far).to_numpy(np.int64))


def _per_step(step_rows: pd.DataFrame, spans: pd.DataFrame, busy: pd.DataFrame) -> pd.DataFrame:
    """Per step: its window (the step's spans, extended back over the between-ops input
    before it), the union of the rank's input spans inside it, the part of that when none of
    the rank's devices ran work, and the fraction."""
    busy_rank = busy["rank"].fillna(-1).to_numpy()
    b_s = busy.ts.to_numpy(np.int64)
    b_e = busy.e.to_numpy(np.int64)
    rows = []
    span_rank = spans["rank"].fillna(-1).to_numpy()
    s_all = spans.ts.to_numpy(np.int64)
    e_all = s_all + spans.dur.to_numpy(np.int64)
    w = (step_rows.assign(end=step_rows.ts + step_rows.dur)
         .groupby(["rank", "step"], dropna=False, sort=True)
         .agg(ts=("ts", "min"), end=("end", "max")).reset_index())  # fmt: skip
    w["ts"] = step_starts(w, spans)
    for rank, step, t0, t1 in zip(w["rank"], w["step"], w.ts.tolist(), w.end.tolist(),
                                  strict=True):  # fmt: skip
        r = -1 if pd.isna(rank) else rank
        mine = span_rank == r
        t0, t1 = int(t0), int(t1)
        s = np.clip(s_all[mine], t0, t1)
        e = np.clip(e_all[mine], t0, t1)
        keep = e > s
        ms, me = merge_intervals(s[keep], e[keep])
        host = int((me - ms).sum())
        dev = busy_rank == r
        bs, be = np.clip(b_s[dev], t0, t1), np.clip(b_e[dev], t0, t1)
        on = be > bs
        wait = host - intersection_length((ms, me), merge_intervals(bs[on], be[on]))
        frac = wait / (t1 - t0) if t1 > t0 else 0.0
        rows.append({"rank": rank, "step": step, "step_ns": t1 - t0, "input_ns": wait,
                     "input_host_ns": host, "input_fraction": frac,
                     "classification": classify(frac)})  # fmt: skip
    return pd.DataFrame(rows)

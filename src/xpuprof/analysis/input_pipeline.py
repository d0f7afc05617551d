"""Input pipeline: how much of each step waits for data, classified as XProf classifies it.

The profiler records the host side of input loading as spans named after the DataLoader
iterator (``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` and its
multi-process twin), or as spans the user names (``xpuprof.annotate("load_batch")``). The time
of those spans inside a step is time the step's compute waited for input, since a training
loop fetches the next batch before it can launch the step's work. XProf's thresholds (its
input-pipeline analyzer): input ≥ 20 % of the step time is *highly* input-bound, ≥ 5 %
*moderately*, else not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import Result, StepSelection, merge_intervals, where_clause
from xpuprof.core.errors import XpuprofError

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: XProf's input-bound thresholds (fraction of step time spent waiting for input).
HIGHLY_INPUT_BOUND = 0.20
MODERATELY_INPUT_BOUND = 0.05

#: Names of input spans: torch's DataLoader iterator, and common user names.
INPUT_NAME = re.compile(
    r"(DataLoader|DataLoaderIter|_next_data|load_batch|data_loading|input_pipeline|get_batch)",
    re.IGNORECASE,
)


def classify(fraction: float) -> str:
    if fraction >= HIGHLY_INPUT_BOUND:
        return "highly input-bound"
    if fraction >= MODERATELY_INPUT_BOUND:
        return "moderately input-bound"
    return "not input-bound"


def input_pipeline(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    pattern: str | None = None,
) -> Result:
    """Per step: step time, time in input spans (their union, so nested spans count once),
    the fraction, and XProf's classification; plus a summary per rank.

    ``pattern`` (a regular expression) replaces the default names of input spans.
    Facts: ``input_spans`` (distinct names of input spans found), ``input_fraction`` (of all
    selected step time, over every rank).
    """
    res = Result()
    try:
        rx = re.compile(pattern, re.IGNORECASE) if pattern else INPUT_NAME
    except re.error as e:
        raise XpuprofError(f"pattern {pattern!r}: not a regular expression ({e})") from None
    step_rows = trace.sql(
        "select rank, pid, step, ts, dur from events where level = 'step' and "
        f"{where_clause(ranks, steps)} order by rank, ts"
    )
    if step_rows.empty:
        res.notes.append(
            "no step spans (ProfilerStep#N or xpuprof.step): input time per step needs steps"
        )
        return res
    names = trace.sql(
        "select distinct name from events where level in ('op', 'annotation', 'python') and "
        f"{where_clause(ranks, steps)}"
    ).name
    wanted = [n for n in names if isinstance(n, str) and rx.search(n)]
    if not wanted:
        res.notes.append(
            "no input spans found (DataLoader iterator spans or spans named like "
            f"{rx.pattern!r}): input time is taken as 0; annotate input loading with "
            "xpuprof.annotate('load_batch') if it is not a DataLoader"
        )
        spans = pd.DataFrame(columns=["rank", "step", "ts", "dur"])
    else:
        lst = ", ".join("'" + n.replace("'", "''") + "'" for n in wanted)
        spans = trace.sql(
            f"select rank, step, ts, dur from events where name in ({lst}) and dur is not null "
            f"and {where_clause(ranks, steps)}"
        )
    per_step = _per_step(step_rows, spans)
    res.tables["steps"] = per_step
    summary = (
        per_step.groupby("rank", dropna=False)
        .agg(steps=("step", "count"), step_ns=("step_ns", "sum"), input_ns=("input_ns", "sum"))
        .reset_index()
    )
    summary["input_fraction"] = summary.input_ns / summary.step_ns
    summary["classification"] = summary.input_fraction.map(classify)
    res.tables["summary"] = summary
    res.tables["input_spans"] = pd.DataFrame({"name": wanted})
    total = int(summary.step_ns.sum())
    res.facts = {
        "input_spans": len(wanted),
        "input_fraction": float(summary.input_ns.sum() / total) if total else 0.0,
    }
    return res


def _per_step(step_rows: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """Per step window: the union of the rank's input spans inside it, and the fraction."""
    rows = []
    span_rank = spans["rank"].fillna(-1)
    for (rank, step), st in step_rows.groupby(["rank", "step"], dropna=False, sort=True):
        t0, t1 = int(st.ts.min()), int((st.ts + st.dur).max())
        sel = spans[span_rank == (-1 if pd.isna(rank) else rank)]
        s = np.clip(sel.ts.to_numpy(np.int64), t0, t1)
        e = np.clip(sel.ts.to_numpy(np.int64) + sel.dur.to_numpy(np.int64), t0, t1)
        keep = e > s
        ms, me = merge_intervals(s[keep], e[keep])
        wait = int((me - ms).sum())
        frac = wait / (t1 - t0) if t1 > t0 else 0.0
        rows.append({"rank": rank, "step": step, "step_ns": t1 - t0, "input_ns": wait,
                     "input_fraction": frac, "classification": classify(frac)})  # fmt: skip
    return pd.DataFrame(rows)

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
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import Result, merge_intervals, where_clause

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
    ranks: list[int] | None = None,
    steps: list[int] | None = None,
    pattern: str | None = None,
) -> Result:
    """Per step: step time, time in input spans (their union, so nested spans count once),
    the fraction, and XProf's classification; plus a summary per rank.

    ``pattern`` (a regular expression) replaces the default names of input spans.
    """
    res = Result()
    rx = re.compile(pattern, re.IGNORECASE) if pattern else INPUT_NAME
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
    rows = []
    for (rank, step), st in step_rows.groupby(["rank", "step"], dropna=False, sort=True):
        t0, t1 = int(st.ts.min()), int((st.ts + st.dur).max())
        sel = spans[(spans["rank"].fillna(-1) == (-1 if pd.isna(rank) else rank))]
        s = sel.ts.to_numpy(np.int64)
        e = s + sel.dur.to_numpy(np.int64)
        s, e = np.clip(s, t0, t1), np.clip(e, t0, t1)
        keep = e > s
        ms, me = merge_intervals(s[keep], e[keep])
        wait = int((me - ms).sum())
        frac = wait / (t1 - t0) if t1 > t0 else 0.0
        rows.append(
            {
                "rank": rank,
                "step": step,
                "step_ns": t1 - t0,
                "input_ns": wait,
                "input_fraction": frac,
                "classification": classify(frac),
            }
        )
    per_step = pd.DataFrame(rows)
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
    return res

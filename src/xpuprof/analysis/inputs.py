"""Where each part's host loads input: the spans the diagnosis counts as input time.

One adapter so that the diagnosis has a single source of input spans:
``analysis.input_pipeline.input_spans`` (DataLoader iterators, TorchRec pipeline stages, user
annotations; its patterns are the documented, extensible list) when that function exists,
else the names below: torch's DataLoader iterator spans and the usual user names
(``input_pipeline.INPUT_NAME``) and TorchRec's input stages.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: TorchRec's train-pipeline stages that fetch and distribute a batch (``record_function``
#: names of ``TrainPipelineSparseDist`` and its variants).
TORCHREC_INPUT = re.compile(
    r"^## (load_batch|copy_batch_to_gpu|wait_for_batch|start_sparse_data_dist|sparse_data_dist"
    r"|wait_sparse_data_dist|fetch_sparse_data|input_dist|wait_for_input_dist) ##"
)

#: The fallback's names of input spans (``input_pipeline``'s defaults before it listed them).
INPUT_NAME = re.compile(
    r"^enumerate\(DataLoader\)#|^IteratorGetNext|load_batch|get_batch|next_batch|fetch_batch|"
    r"data_?loading|data_?loader|input_pipeline",
    re.IGNORECASE,
)

COLUMNS = ["part", "id", "ts", "dur", "name", "step", "kind"]


def input_spans_by_part(trace: Trace, parts: list[int]) -> dict[int, pd.DataFrame]:
    """The input spans of each of ``parts`` (columns ``id`` (null: not an event), ``ts``,
    ``dur``, ``name``, ``step``, ``kind``: ``input_pipeline.KINDS``, null when unknown)."""
    df = _spans(trace)
    return {int(p): g for p, g in df.groupby("part") if int(p) in parts}


def _spans(trace: Trace) -> pd.DataFrame:
    key = ("analysis.inputs",)
    if key not in trace.memo:
        trace.memo[key] = _from_input_pipeline(trace)
        if trace.memo[key] is None:
            trace.memo[key] = _by_name(trace)
    return trace.memo[key]


def _from_input_pipeline(trace: Trace) -> pd.DataFrame | None:
    """The spans of ``input_pipeline.input_spans``, given parts (joined on rank)."""
    try:
        from xpuprof.analysis import input_pipeline

        fn = getattr(input_pipeline, "input_spans", None)
    except Exception:  # noqa: BLE001 - a refinement: the names below stand in for it
        return None
    if fn is None:
        return None
    spans = fn(trace, ranks=None, steps=None)
    if hasattr(spans, "tables"):  # a Result
        spans = next(iter(spans.tables.values()), pd.DataFrame())
    if spans is None or not len(spans):
        return pd.DataFrame(columns=COLUMNS)
    parts = pd.DataFrame({"part": [s["part"] for s in trace.sources],
                          "rank": [s["rank"] for s in trace.sources]})  # fmt: skip
    parts["key"] = parts["rank"].fillna(-1).astype(int)
    spans = spans.assign(key=spans["rank"].astype("Float64").fillna(-1).astype(int))
    out = spans.merge(parts[["key", "part"]], on="key")
    single = len(trace.sources) == 1  # one source: whatever rank it says, it is that part
    if single and out.empty:
        out = spans.assign(part=trace.sources[0]["part"])
    for c in ("id", "step", "kind"):
        if c not in out:
            out[c] = pd.NA
    return out[COLUMNS].dropna(subset=["ts", "dur"]).reset_index(drop=True)


def _by_name(trace: Trace) -> pd.DataFrame:
    names = trace.sql(
        "select distinct name from events where device < 0 and dur > 0 and level in "
        "('op', 'annotation', 'python', 'layer')"
    ).name
    wanted = [n for n in names if isinstance(n, str) and
              (INPUT_NAME.search(n) or TORCHREC_INPUT.search(n))]  # fmt: skip
    if not wanted:
        return pd.DataFrame(columns=COLUMNS)
    lst = ", ".join("'" + n.replace("'", "''") + "'" for n in wanted)
    return trace.sql(
        f"select part, id, ts, dur, name, step, null as kind from events where device < 0 and "
        f"dur > 0 and name in ({lst})"
    )

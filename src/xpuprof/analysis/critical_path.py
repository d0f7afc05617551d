"""Critical path: the longest chain of dependent work through host and device events.

A longest-path query over each part's dependency graph (:mod:`xpuprof.trace.graph`, HTA
0.5.0's ``CPGraph``; ``docs/graph.md``). The path maximises the summed edge weights (its
length); ``duration`` is clock time, so waits and gaps show there only. Each segment is one
edge, attributed as HTA's ``bound_by``:

- ``cpu_bound``: host work (``host_work`` edges);
- ``gpu_compute`` / ``gpu_communication``: device work / NCCL-RCCL collectives running;
- ``launch_overhead``: a launch delay onto an idle stream (``launch``);
- ``kernel_gap``: the gap between queued kernels on a stream;
- ``sync`` (weight 0): inside blocking calls and along ``cuda_sync`` edges;
- ``host_gap`` (weight 0): between top-level host ops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import Result, StepSelection, step_mode
from xpuprof.core.text import human_time
from xpuprof.trace.graph import (
    WHOLE_TRACE,
    DependencyGraph,
    EdgeKind,
    dependency_graphs,
    longest_path,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.trace.trace import Trace

ATTRIBUTIONS = ("cpu_bound", "gpu_compute", "gpu_communication", "launch_overhead",
                "kernel_gap", "sync", "host_gap")  # fmt: skip
#: Edge kind -> the attribution of a path segment along it.
ATTRIBUTION_OF: dict[EdgeKind, str] = {
    EdgeKind.HOST_WORK: "cpu_bound",
    EdgeKind.HOST_GAP: "host_gap",
    EdgeKind.HOST_WAIT: "sync",
    EdgeKind.DEVICE_WORK: "gpu_compute",
    EdgeKind.DEVICE_COMMUNICATION: "gpu_communication",
    EdgeKind.KERNEL_GAP: "kernel_gap",
    EdgeKind.LAUNCH: "launch_overhead",
    EdgeKind.STREAM_SYNC: "sync",
    EdgeKind.CONTEXT_SYNC: "sync",
    EdgeKind.EVENT_SYNC: "sync",
    EdgeKind.STREAM_WAIT_EVENT: "sync",
}
_ATTRIBUTION_CODE = np.array([ATTRIBUTIONS.index(ATTRIBUTION_OF[k]) for k in EdgeKind])
COLUMNS = ["rank", "part", "start", "end", "duration", "weight", "attribution", "event", "name",
           "src", "dst"]  # fmt: skip


def critical_path(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    annotation: str | None = None,
    instance: int | tuple[int, int] = 0,
) -> Result:
    """Critical path of each source file (a rank) of ``ranks`` (None: all), over a window of
    host start times: the whole trace (``steps`` None or "all"), the span of the listed
    ``steps``, of every step but the last ("drop-last"; the whole trace with fewer than two
    steps), or — as HTA's ``critical_path_analysis`` — ``instance`` (or an inclusive range) of
    the host spans whose name contains ``annotation``.

    ``path``: the segments in order — ``start``, ``end``, ``duration`` (clock), ``weight``
    (what it adds to the length), ``attribution``, the charged ``event`` and its ``name``, the
    ``src`` and ``dst`` events it joins. ``summary``: per attribution the summed ``time``
    (weight) and ``wall`` (duration), ``percent`` of the length; row ``total``: the length and
    the span. Facts: ``headline`` (:func:`headline`), when there is a path.
    """  # fmt: skip
    notes: list[str] = []
    wanted = None if ranks is None else {int(r) for r in ranks}
    windows = {}
    for src in trace.sources:
        if wanted is None or src["rank"] in wanted:
            window = _window(trace, src["part"], steps, annotation, instance, notes)
            if window is not None:
                windows[src["part"]] = window
    paths = []
    for graph in dependency_graphs(trace, windows).values():
        if len(graph.nodes):
            notes += graph.notes
            paths.append(_segments(graph, longest_path(graph)))
    if not paths:
        notes.append("no host ops or runtime calls in the window: no critical path")
    path = pd.concat(paths, ignore_index=True) if paths else pd.DataFrame(columns=COLUMNS)
    path["name"] = path.event.map(_names(trace, path.event.dropna().unique()))
    summary = _summary(path)
    line = headline(summary)
    return Result(tables={"summary": summary, "path": path[COLUMNS]}, notes=notes,
                  facts={"headline": line} if line else {})  # fmt: skip


#: How the headline names each attribution.
ATTRIBUTION_WORDS = {
    "cpu_bound": "host work",
    "gpu_compute": "device compute",
    "gpu_communication": "communication kernels",
    "launch_overhead": "launch delays",
    "kernel_gap": "gaps between kernels",
}


def headline(summary: pd.DataFrame) -> str | None:
    """The critical path in one sentence (the ``summary`` of :func:`critical_path`): the
    longest path's length and its three largest attributions' shares; None without a path."""
    s = summary
    totals = s[s.attribution == "total"]
    if not len(totals) or not totals.time.max():
        return None
    top = totals.loc[totals.time.idxmax()]
    # shares that round to 0% say nothing: left out
    mine = s[(s.part == top.part) & (s.attribution != "total") & (s.percent >= 0.5)]
    parts = ", ".join(
        f"{r.percent:.0f}% {ATTRIBUTION_WORDS.get(r.attribution, r.attribution)}"
        for r in mine.sort_values("time", ascending=False).head(3).itertuples()
    )
    who = f" of rank {int(top['rank'])}" if len(totals) > 1 else ""
    return f"The critical path{who} is {human_time(top.time)} long: {parts}"


def _segments(graph: DependencyGraph, path: np.ndarray) -> pd.DataFrame:
    """One row per edge of ``path``."""
    e, time, event = graph.edges, graph.nodes.time, graph.nodes.event
    src, dst = e.src[path], e.dst[path]
    charged = pd.array(e.event[path], "Int64")
    charged[e.event[path] < 0] = pd.NA
    return pd.DataFrame({
        "rank": graph.rank, "part": graph.part, "start": time[src], "end": time[dst],
        "duration": e.duration[path], "weight": e.weight[path],
        "attribution": pd.Categorical.from_codes(_ATTRIBUTION_CODE[e.kind[path]], ATTRIBUTIONS),
        "event": charged, "src": event[src], "dst": event[dst],
    })  # fmt: skip


def _names(trace: Trace, ids) -> pd.Series:
    import pyarrow as pa

    trace.con.register("_cp_ids", pa.table({"id": pa.array(ids, pa.int64())}))
    try:
        df = trace.sql("select id, name from events where id in (select id from _cp_ids)")
    finally:
        trace.con.unregister("_cp_ids")
    return pd.Series(df.name.to_numpy(), index=df.id.to_numpy())


def _summary(path: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (r, part), g in path.groupby(["rank", "part"], dropna=False):
        for a in ATTRIBUTIONS:
            s = g[g.attribution == a]
            rows.append((r, part, a, s.weight.sum(), s.duration.sum(), len(s)))
        rows.append((r, part, "total", g.weight.sum(), g.end.max() - g.start.min(), len(g)))
    out = pd.DataFrame(rows, columns=["rank", "part", "attribution", "time", "wall", "segments"])
    out[["time", "wall"]] = out[["time", "wall"]].astype(np.int64)
    length = out.groupby(["rank", "part"], dropna=False).time.transform("max")
    out["percent"] = 100.0 * out.time / length.where(length > 0)
    return out


def _window(trace, part, steps, annotation, instance, notes) -> tuple[int, int] | None:
    """(lo, hi) ns: host events starting in [lo, hi] are in the graph; None: no such window."""
    mode, numbers = step_mode(steps)
    if mode == "list":
        where = f"level = 'step' and step in ({', '.join(map(str, numbers or [])) or 'null'})"
    elif mode == "drop-last":
        where = "level = 'step'"
    elif annotation:
        where = f"dur > 0 and contains(name, '{annotation.replace(chr(39), chr(39) * 2)}')"
    else:
        return WHOLE_TRACE
    spans = trace.sql(f"select ts, ts + coalesce(dur, 0) as e, step from events where "
                      f"part = {part} and device < 0 and {where} order by ts")  # fmt: skip
    if mode == "drop-last":
        if len(spans) < 2:
            return WHOLE_TRACE
        spans = spans[spans.step != spans.step.max()]
    elif mode == "all":
        a, b = instance if isinstance(instance, tuple) else (instance, instance)
        spans = spans.iloc[a : b + 1]
    if spans.empty:
        what = {"list": f"steps {numbers}", "drop-last": "steps but the last"}.get(
            mode, f"{annotation!r} #{instance}"
        )
        notes.append(f"part {part}: no {what} in this trace, so no critical path for it")
        return None
    return int(spans.ts.min()), int(spans.e.max())

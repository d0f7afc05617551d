"""Charts of a tool's answer: Plotly figure specs (plain JSON dicts) built from the tables of
its ``Result`` and nothing else, for the web UI's pages and the HTML report.

``figures(tool, res)`` → ``[{"id", "title", "data", "layout"}]`` (``[]`` when the result has
nothing to chart). The charts draw the tool's numbers as they are: a value is only converted
to the unit named in its axis title (ns → ms, bytes → MiB, FLOP/s → TFLOP/s, B/s → GB/s), never
recomputed. What each tool gets:

- ``overview`` (and ``summary``): the step-time breakdown, one stacked bar per step (grouped
  by rank), from the ``steps`` table; the step time of each rank and step as a heat map when
  there are several ranks; the top ops (self time) and top kernels (total time) as bars;
- ``stats``: the ops by self time and the kernels by total time, as bars;
- ``roofline``: intensity (FLOP/B) against achieved FLOP/s on log–log axes, one point per op
  name (``by_name``) and per kernel (``kernels``), and each device's roof ``min(P, I·W)``
  from the points' own ``peak_flops`` and ``peak_bandwidth``;
- ``memory``: allocated and reserved bytes over time per rank and device (``timeline``), with
  each peak (``peaks``) marked;
- ``replay``: measured and simulated step time side by side, one pair of bars per step
  (grouped by rank when there are several), the error in the hover, from the ``steps`` table;
  without steps, each rank's span (first start to last end) from the ``summary`` table;
- ``ranks``: the step time of each rank and step as a heat map (``steps``), and per rank its
  collective time as waiting vs transfer, beside the waiting it caused the others (``waits``);
- ``comm``: bus bandwidth against message size (log x), one point per collective; and when
  several ranks take part, each participant's lateness at each matched collective (its
  aligned start minus the earliest, from the ``collectives``, ``clock`` and ``skew`` tables:
  the difference the comm tool averages into ``stragglers.mean_late_ns``) as a heat map.

Where a chart would hold more marks than a browser draws comfortably it keeps the largest
(bars, points: by time) or thins a time series to the first, lowest, highest and last point
of each of :data:`MAX_POINTS` buckets (the peaks survive), and its title says so.

Every string from a trace is plain data: Plotly draws text itself (no innerHTML of data), but
it reads a few tags (``<b>``, ``<br>``, ``<a>``) in names, hover texts and annotations, so
``&``, ``<`` and ``>`` in them are written as entities (:func:`plain`), which Plotly shows as
the characters they stand for.

Length: one figure builder per tool, each short, over shared helpers (units, thinning,
escaping); a module per tool would scatter the rules every chart must follow.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterable
from typing import Any

from xpuprof.core.result import Result, records
from xpuprof.core.text import BYTE_UNITS, short_name

#: The most points one series holds (a longer time series is thinned, a scatter keeps the
#: longest work), and the most bars one bar chart holds.
MAX_POINTS = 5000
#: The most bars (steps × ranks) in the step breakdown and the most columns in a heat map.
MAX_BARS = 2000
#: The most ops or kernels in a top-N bar chart.
MAX_TOP = 25
#: Names longer than this are cut in axis labels (the hover shows the whole short name).
LABEL_MAX = 48

#: Colours of the step-breakdown categories (the overview's ``steps`` columns), fixed so that
#: every chart and page shows a category in one colour.
COLORS = {
    "compute": "#1f77b4",
    "communication": "#ff7f0e",
    "memcpy": "#2ca02c",
    "memset": "#98df8a",
    "input": "#9467bd",
    "host_idle": "#d62728",
    "other": "#7f7f7f",
}
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
_BOUND_COLORS = {"compute": "#d62728", "memory": "#1f77b4", "unknown": "#7f7f7f"}
#: FLOP/s units for the roofline's y axis, smallest first.
FLOPS_UNITS = ((1e9, "GFLOP/s"), (1e12, "TFLOP/s"), (1e15, "PFLOP/s"))

Figure = dict[str, Any]
Row = dict[str, Any]


def plain(value: Any) -> str:
    """A value as text Plotly shows as it is: ``&``, ``<`` and ``>`` as entities (Plotly reads
    a few tags in text and decodes entities back to the characters)."""
    return html.escape(str(value), quote=False)


def label(name: Any, limit: int = LABEL_MAX) -> str:
    """A name for an axis or legend: short (:func:`short_name`), cut to ``limit`` letters,
    as plain text (:func:`plain`)."""
    text = short_name(str(name))
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return plain(text)


def figures(tool: str, res: Result) -> list[Figure]:
    """The charts of the answer ``res`` of the tool ``tool`` (its registry name); ``[]`` for a
    tool without charts or an answer with nothing to chart."""
    build = _BUILDERS.get(tool)
    if build is None:
        return []
    return [_clean(f) for f in build(res) if f is not None]


# ----------------------------------------------------------------------------- helpers


def rows_of(res: Result, name: str) -> list[Row]:
    """The rows of table ``name`` as JSON-able dicts (missing values as None); [] when absent."""
    table = res.tables.get(name)
    if table is None or not len(table):
        return []
    return records(table)


def number(v: Any) -> float | None:
    """``v`` as a finite float, else None (missing, NaN, text)."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def stamp(v: Any) -> int | float | None:
    """A timestamp (ns) as it is when it is an int (differences of int64 nanoseconds since
    1970 must be taken in integers: a float holds them to about 256 ns), else as
    :func:`number`."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    return number(v)


def pick_unit(top: float, units: Iterable[tuple[float, str]]) -> tuple[float, str]:
    """The largest of ``units`` (scale, name; smallest first) in which ``top`` is at least 1
    (the smallest when none is)."""
    units = tuple(units)
    return next(((s, u) for s, u in reversed(units) if top >= s), units[0])


def _clean(obj: Any) -> Any:
    """Plain JSON: NaN and infinities as None, tuples as lists."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _figure(fid: str, title: str, data: list[dict[str, Any]], layout: dict[str, Any]) -> Figure:
    base = {
        "title": {"text": plain(title)},
        "margin": {"l": 70, "r": 30, "t": 60, "b": 60},
        "hovermode": "closest",
        "legend": {"orientation": "h", "y": -0.2},
        "height": 420,
    }
    return {"id": fid, "title": title, "data": data, "layout": base | layout}


def _axis(title: str, **kw: Any) -> dict[str, Any]:
    return {"title": {"text": plain(title)}, "automargin": True, **kw}


def _thin(n: int, keep: int) -> str:
    return f" (the {keep:,} largest of {n:,})" if n > keep else ""


# ------------------------------------------------------------------------------ overview


def step_breakdown(steps: list[Row]) -> Figure | None:
    """One stacked bar per (rank, step) of the overview's ``steps`` table: each ``*_ns``
    column but ``step_ns`` a segment (categories that are 0 in every step left out), grouped
    by rank when there are several; y in ms."""
    if not steps:
        return None
    n = len(steps)
    steps = steps[:MAX_BARS]
    cols = [c for c in steps[0] if c.endswith("_ns") and c != "step_ns"]
    cols = [c for c in cols if any(number(r.get(c)) for r in steps)]
    ranks = sorted({r.get("rank") for r in steps}, key=lambda r: (r is None, r))
    many = len(ranks) > 1
    steps_text = [step_label(r.get("step")) for r in steps]
    x: Any = [[f"rank {r.get('rank')}" for r in steps], steps_text] if many else steps_text
    total = [number(r.get("step_ns")) for r in steps]
    data = []
    for c in cols:
        key = c[: -len("_ns")]
        data.append({
            "type": "bar", "name": plain(key.replace("_", " ")), "x": x,
            "y": [(number(r.get(c)) or 0.0) / 1e6 for r in steps],
            "customdata": [None if t is None else t / 1e6 for t in total],
            "marker": {"color": COLORS.get(key, _PALETTE[len(data) % len(_PALETTE)])},
            "hovertemplate": f"%{{x}}<br>{plain(key.replace('_', ' '))}: %{{y:.3f}} ms "
                             "of %{customdata:.3f} ms<extra></extra>",
        })  # fmt: skip
    title = "Step time and where it goes" + (f" (the first {len(steps):,} of {n:,} steps)"
                                             if n > len(steps) else "")  # fmt: skip
    return _figure("step-breakdown", title, data, {
        "barmode": "stack",
        "xaxis": _axis("rank and step" if many else "step", type="multicategory" if many
                       else "category"),
        "yaxis": _axis("time (ms)"),
    })  # fmt: skip


def step_heatmap(steps: list[Row]) -> Figure | None:
    """Step time (ms) of each rank (rows) and step (columns): the overview's ``steps`` table,
    when it holds several ranks; a missing (rank, step) is an empty cell."""
    ranks = sorted({r.get("rank") for r in steps if r.get("rank") is not None})
    if len(ranks) < 2:
        return None
    all_steps = sorted({r.get("step") for r in steps if r.get("step") is not None})
    shown = all_steps[:MAX_BARS]
    col = {s: i for i, s in enumerate(shown)}
    row = {r: i for i, r in enumerate(ranks)}
    z: list[list[float | None]] = [[None] * len(shown) for _ in ranks]
    for r in steps:
        t = number(r.get("step_ns"))
        if r.get("rank") in row and r.get("step") in col and t is not None:
            z[row[r["rank"]]][col[r["step"]]] = t / 1e6
    more = (
        f" (the first {len(shown):,} of {len(all_steps):,} steps)"
        if len(all_steps) > len(shown)
        else ""
    )
    return _figure("step-heatmap", "Step time per rank and step" + more, [{
        "type": "heatmap", "z": z, "x": [step_label(s) for s in shown],
        "y": [f"rank {r}" for r in ranks], "colorscale": "Viridis",
        "colorbar": {"title": {"text": "ms"}},
        "hovertemplate": "%{y}, %{x}: %{z:.3f} ms<extra></extra>",
    }], {"xaxis": _axis("step", type="category"),
         "yaxis": _axis("rank", type="category", autorange="reversed")})  # fmt: skip


def _time_ms(row: Row, cols: tuple[str, ...]) -> float | None:
    """The first of ``cols`` that ``row`` has, in ms (``*_ms`` as is, ``*_us`` / ``*_ns``
    converted)."""
    for c in cols:
        v = number(row.get(c))
        if v is not None:
            return v / {"ms": 1.0, "us": 1e3, "ns": 1e6}[c.rsplit("_", 1)[-1]]
    return None


def top_bars(fid: str, title: str, rows: list[Row], name_cols: tuple[str, ...],
             time_cols: tuple[str, ...], axis: str) -> Figure | None:  # fmt: skip
    """Horizontal bars of the first :data:`MAX_TOP` rows of a table ranked by the tool (its
    order kept, the first on top), one per row even when two names shorten alike."""
    if not rows:
        return None
    n = len(rows)
    rows = rows[:MAX_TOP]
    names = [next((r[c] for c in name_cols if r.get(c) is not None), "?") for r in rows]
    values = [_time_ms(r, time_cols) for r in rows]
    calls = [r.get("calls", r.get("count")) for r in rows]
    full = [plain(short_name(str(nm))) for nm in names]
    return _figure(fid, title + (f" (the first {MAX_TOP} of {n:,})" if n > MAX_TOP else ""), [{
        "type": "bar", "orientation": "h", "x": values, "y": list(range(len(rows))),
        "customdata": [[f, c] for f, c in zip(full, calls, strict=True)],
        "hovertemplate": "%{customdata[0]}<br>%{x:.3f} ms, %{customdata[1]} calls<extra></extra>",
        "marker": {"color": _PALETTE[0]},
    }], {
        "xaxis": _axis(axis + " (ms)"),
        "yaxis": _axis("", tickmode="array", tickvals=list(range(len(rows))),
                       ticktext=[label(nm) for nm in names], autorange="reversed"),
        "height": max(260, 60 + 22 * len(rows)),
        "margin": {"l": 20, "r": 30, "t": 60, "b": 50},
    })  # fmt: skip


def overview_figures(res: Result) -> list[Figure | None]:
    steps = rows_of(res, "steps")
    return [
        step_breakdown(steps),
        step_heatmap(steps),
        top_bars("top-ops", "Top ops by self time", rows_of(res, "top_ops"), ("op", "name"),
                 ("self_ms", "self_us", "self_ns"), "self time"),
        top_bars("top-kernels", "Top kernels by total time", rows_of(res, "top_kernels"),
                 ("kernel", "name"), ("total_ms", "total_us", "total_ns"), "total time"),
    ]  # fmt: skip


def stats_figures(res: Result) -> list[Figure | None]:
    return [
        top_bars("stats-ops", "Ops by self time", rows_of(res, "ops"), ("name", "op"),
                 ("self_ns", "self_ms"), "self time"),
        top_bars("stats-kernels", "Kernels by total time", rows_of(res, "kernels"),
                 ("name", "kernel"), ("total_ns", "total_ms"), "total time"),
        top_bars("stats-layers", "Layers by forward time", rows_of(res, "layers"), ("layer",),
                 ("forward_ns",), "forward time"),
    ]  # fmt: skip


# ------------------------------------------------------------------------------ roofline


def roofline_points(rows: list[Row]) -> tuple[list[Row], int]:
    """The rows a log–log roofline can place (intensity and achieved FLOP/s both above 0), the
    :data:`MAX_POINTS` longest when more, and how many rows could not be placed."""
    ok = [r for r in rows if (number(r.get("intensity")) or 0) > 0
          and (number(r.get("achieved_flops")) or 0) > 0]  # fmt: skip
    if len(ok) > MAX_POINTS:
        ok = sorted(ok, key=lambda r: -(number(r.get("time_ns")) or 0))[:MAX_POINTS]
    return ok, sum(1 for r in rows if (number(r.get("intensity")) or 0) <= 0
                   or (number(r.get("achieved_flops")) or 0) <= 0)  # fmt: skip


def roofline(res: Result) -> Figure | None:
    """Achieved FLOP/s against intensity, one point per op name and per kernel (colour: the
    bound the tool found), and the roof of each (device, peak FLOP/s, bandwidth) the points
    were judged against."""
    series = [("op", rows_of(res, "by_name")), ("kernel", rows_of(res, "kernels"))]
    placed = [(kind, *roofline_points(rows), len(rows)) for kind, rows in series]
    points = [r for _, pts, _, _ in placed for r in pts]
    if not points:
        return None
    achieved = sorted(number(r.get("achieved_flops")) or 0 for r in points)
    scale, unit = pick_unit(achieved[len(achieved) // 2], FLOPS_UNITS)
    data: list[dict[str, Any]] = []
    for kind, pts, _, n in placed:
        for bound in sorted({str(r.get("bound")) for r in pts}):
            group = [r for r in pts if str(r.get("bound")) == bound]
            data.append(_roof_points(kind, bound, group, scale, unit, n))
    xs = [number(r["intensity"]) or 0 for r in points]
    data += _roofs(points, min(xs), max(xs), scale, unit)
    skipped = sum(s for _, _, s, _ in placed)
    title = "Roofline" + (f" ({skipped:,} with no FLOPs or no bytes not drawn)" if skipped else "")
    return _figure("roofline", title, data, {
        "xaxis": _axis("arithmetic intensity (FLOP/byte)", type="log"),
        "yaxis": _axis(f"achieved ({unit})", type="log", exponentformat="none",
                       separatethousands=True),
        "height": 520,
    })  # fmt: skip


def _roof_points(kind: str, bound: str, rows: list[Row], scale: float, unit: str,
                 n: int) -> dict[str, Any]:  # fmt: skip
    def text(r: Row) -> list[Any]:
        pct = number(r.get("pct_of_roof"))
        return [plain(short_name(str(r.get("name")))), plain(r.get("dtype") or "?"),
                plain(r.get("device") or "?"), (number(r.get("time_ns")) or 0) / 1e6,
                "-" if pct is None else f"{pct:.1f}%"]  # fmt: skip

    return {
        "type": "scatter", "mode": "markers",
        "name": plain(f"{kind}s, {bound}-bound" + _thin(n, MAX_POINTS)),
        "x": [number(r["intensity"]) for r in rows],
        "y": [number(r["achieved_flops"]) / scale for r in rows],
        "customdata": [text(r) for r in rows],
        "marker": {"color": _BOUND_COLORS.get(bound, "#8c564b"), "size": 8 if kind == "op" else 6,
                   "symbol": "circle" if kind == "op" else "diamond", "opacity": 0.75},
        "hovertemplate": "%{customdata[0]} (%{customdata[1]}, %{customdata[2]})<br>"
                         f"%{{x:.3g}} FLOP/byte, %{{y:.4g}} {unit}<br>"
                         "%{customdata[3]:.3f} ms, %{customdata[4]} of roof<extra></extra>",
    }  # fmt: skip


def _roofs(points: list[Row], lo: float, hi: float, scale: float,
           unit: str) -> list[dict[str, Any]]:  # fmt: skip
    """One line ``min(P, I·W)`` per distinct (device, P, W) of the points, over their
    intensities (and the ridge ``P / W``) with some room either side."""
    keys: dict[tuple[str, float, float], set[str]] = {}
    for r in points:
        p, w = number(r.get("peak_flops")), number(r.get("peak_bandwidth"))
        if p and w:
            keys.setdefault((str(r.get("device")), p, w), set()).update(
                [str(r["peak_key"])] if r.get("peak_key") else []
            )
    roofs = [(d, "/".join(sorted(keys[d, p, w])), p, w) for d, p, w in sorted(keys)]
    out = []
    for i, (device, key, p, w) in enumerate(roofs):
        ridge = p / w
        xs = sorted({lo / 4, ridge, max(hi, ridge) * 4})
        out.append({
            "type": "scatter", "mode": "lines", "x": xs, "y": [min(p, x * w) / scale for x in xs],
            "name": plain(f"roof: {device}{' ' + key if key else ''}: {p / 1e12:,.4g} TFLOP/s, "
                          f"{w / 1e9:,.4g} GB/s"),
            "line": {"color": _PALETTE[(i + 7) % len(_PALETTE)], "width": 2},
            "hovertemplate": f"%{{x:.3g}} FLOP/byte: roof %{{y:.4g}} {unit}<extra></extra>",
        })  # fmt: skip
    return out


# -------------------------------------------------------------------------------- memory


def thin_series(
    xs: list[float], ys: list[float], keep: int = MAX_POINTS
) -> tuple[list[float], list[float]]:
    """At most about ``keep`` points of a time series: per bucket of consecutive points, the
    first, the lowest, the highest and the last (in time order), so that peaks and troughs are
    drawn as they were."""
    n = len(xs)
    if n <= keep:
        return xs, ys
    buckets = max(1, keep // 4)
    size = math.ceil(n / buckets)
    ox: list[float] = []
    oy: list[float] = []
    for start in range(0, n, size):
        idx = range(start, min(start + size, n))
        picks = sorted(
            {idx[0], idx[-1], min(idx, key=ys.__getitem__), max(idx, key=ys.__getitem__)}
        )
        ox += [xs[i] for i in picks]
        oy += [ys[i] for i in picks]
    return ox, oy


def memory(res: Result) -> Figure | None:
    """Allocated (and reserved, where recorded) bytes over time per rank and device, in ms
    from the trace's first event, each peak of the ``peaks`` table marked."""
    rows = rows_of(res, "timeline")
    if not rows:
        return None
    origin = stamp(res.facts.get("trace_start_ns"))
    if origin is None:
        origin = min(stamp(r.get("ts")) or 0 for r in rows)
    top = max((number(r.get(c)) or 0) for r in rows for c in ("total_allocated", "total_reserved"))
    scale, unit = pick_unit(top, BYTE_UNITS)
    groups: dict[tuple[Any, Any], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.get("rank"), r.get("device")), []).append(r)
    data: list[dict[str, Any]] = []
    thinned = False
    reserved = {k for k, g in groups.items() if any(number(r.get("total_reserved")) for r in g)}
    keep = max(500, MAX_POINTS // (len(groups) + len(reserved)))  # the chart within MAX_POINTS
    for i, ((rank, device), group) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
        group.sort(key=lambda r: stamp(r.get("ts")) or 0)
        xs = [((stamp(r.get("ts")) or 0) - origin) / 1e6 for r in group]
        color = _PALETTE[i % len(_PALETTE)]
        for col, dash in (("total_allocated", "solid"), ("total_reserved", "dot")):
            ys = [(number(r.get(col)) or 0) / scale for r in group]
            if col == "total_reserved" and (rank, device) not in reserved:
                continue
            tx, ty = thin_series(xs, ys, keep)
            thinned |= len(tx) < len(xs)
            what = col.removeprefix("total_")
            data.append({
                "type": "scatter", "mode": "lines", "x": tx, "y": ty,
                "line": {"shape": "hv", "color": color, "dash": dash},
                "name": plain(f"rank {rank} {device} {what}"),
                "hovertemplate": f"%{{x:.3f}} ms: %{{y:.4g}} {unit} {what}<extra>"
                                 f"{plain(f'rank {rank} {device}')}</extra>",
            })  # fmt: skip
    peaks = [p for p in rows_of(res, "peaks") if number(p.get("peak_ts")) is not None
             and (p.get("rank"), p.get("device")) in groups]  # fmt: skip
    if peaks:
        data.append({
            "type": "scatter", "mode": "markers", "name": "peak allocated",
            "x": [(stamp(p["peak_ts"]) - origin) / 1e6 for p in peaks],
            "y": [(number(p.get("peak_allocated")) or 0) / scale for p in peaks],
            "customdata": [plain(f"rank {p.get('rank')} {p.get('device')}") for p in peaks],
            "marker": {"symbol": "triangle-down", "size": 11, "color": "#d62728"},
            "hovertemplate": f"peak %{{y:.4g}} {unit} at %{{x:.3f}} ms"
                             "<extra>%{customdata}</extra>",
        })  # fmt: skip
    title = "Memory over time" + (" (thinned: each bucket's first, lowest, highest and last "
                                  "point)" if thinned else "")  # fmt: skip
    return _figure("memory", title, data, {
        "xaxis": _axis("time from the trace's first event (ms)"),
        "yaxis": _axis(f"memory ({unit})", rangemode="tozero"),
    })  # fmt: skip


# ---------------------------------------------------------------------------------- comm


def bandwidth(res: Result) -> Figure | None:
    """Bus bandwidth (GB/s) against message size (bytes, log), one point per collective of
    known size and bandwidth, coloured by type; the longest :data:`MAX_POINTS` when more."""
    rows = [r for r in rows_of(res, "collectives")
            if (number(r.get("bytes")) or 0) > 0 and (number(r.get("busbw")) or 0) > 0]  # fmt: skip
    if not rows:
        return None
    n = len(rows)
    if n > MAX_POINTS:
        rows = sorted(rows, key=lambda r: -(number(r.get("dur")) or 0))[:MAX_POINTS]
    data = []
    for i, kind in enumerate(sorted({str(r.get("collective")) for r in rows})):
        group = [r for r in rows if str(r.get("collective")) == kind]
        data.append({
            "type": "scatter", "mode": "markers", "name": plain(kind),
            "x": [number(r["bytes"]) for r in group],
            "y": [number(r["busbw"]) / 1e9 for r in group],
            "customdata": [[plain(f"rank {r.get('rank')}"), (number(r.get("dur")) or 0) / 1e3,
                            (number(r.get("algbw")) or 0) / 1e9,
                            plain(short_name(str(r.get("name"))))] for r in group],
            "marker": {"color": _PALETTE[i % len(_PALETTE)], "size": 7, "opacity": 0.75},
            "hovertemplate": "%{customdata[3]} (%{customdata[0]})<br>%{x:,} bytes in "
                             "%{customdata[1]:.1f} µs<br>busbw %{y:.3f} GB/s, algbw "
                             "%{customdata[2]:.3f} GB/s<extra></extra>",
        })  # fmt: skip
    return _figure("comm-bandwidth", "Bus bandwidth by message size" + _thin(n, MAX_POINTS), data, {
        "xaxis": _axis("message size (bytes)", type="log"),
        "yaxis": _axis("bus bandwidth (GB/s)", rangemode="tozero"),
    })  # fmt: skip


def lateness(res: Result) -> tuple[list[str], list[str], list[list[float | None]]]:
    """Participants (rows), matched collectives (columns) and each participant's lateness at
    each (ms): the collectives table's ``late_ns`` (the comm tool's, on aligned clocks)."""
    skew = rows_of(res, "skew")
    if not skew:
        return [], [], []
    skew = skew[:MAX_BARS]
    cols = [(s.get("process_group"), s.get("seq")) for s in skew]
    colx = {k: i for i, k in enumerate(cols)}
    late: dict[Any, list[float | None]] = {}
    for r in rows_of(res, "collectives"):
        key = (r.get("process_group"), r.get("seq"))
        if key not in colx:
            continue
        value = number(r.get("late_ns"))
        p = r.get("participant")
        late.setdefault(p, [None] * len(cols))[colx[key]] = None if value is None else value / 1e6
    parts = sorted(late, key=lambda p: (len(str(p)), str(p)))
    groups = {k[0] for k in cols}
    names = [f"{s.get('collective')} #{s.get('seq')}"
             + (f" ({s.get('process_group')})" if len(groups) > 1 else "")
             for s in skew]  # fmt: skip
    return [str(p) for p in parts], names, [late[p] for p in parts]


def skew_heatmap(res: Result) -> Figure | None:
    """How late each participant (rows) started each matched collective (columns), in ms after
    the first to arrive: a row that is bright everywhere is the rank the others wait for."""
    parts, names, z = lateness(res)
    if not parts:
        return None
    n = len(rows_of(res, "skew"))
    more = f" (the first {MAX_BARS:,} of {n:,} collectives)" if n > MAX_BARS else ""
    return _figure("comm-skew", "Lateness per rank at each collective" + more, [{
        "type": "heatmap", "z": z, "x": [plain(t) for t in names],
        "y": [plain(f"rank {p}" if p.isdigit() else p) for p in parts],
        "colorscale": "Reds", "colorbar": {"title": {"text": "ms late"}},
        "hovertemplate": "%{y} at %{x}: %{z:.3f} ms after the first<extra></extra>",
    }], {"xaxis": _axis("collective (in issue order)", type="category"),
         "yaxis": _axis("participant", type="category", autorange="reversed")})  # fmt: skip


def comm_figures(res: Result) -> list[Figure | None]:
    return [bandwidth(res), skew_heatmap(res)]


# -------------------------------------------------------------------------------- replay

#: Colours of the replay's two bars: measured as the overview draws compute, simulated apart.
REPLAY_COLORS = {"measured": "#1f77b4", "simulated": "#ff7f0e"}


def replay_steps(res: Result) -> Figure | None:
    """Measured and simulated time of each step (bars side by side, ms; grouped by rank when
    there are several), the error in the hover: the replay's ``steps`` table; without steps,
    each rank's span from its ``summary`` table (``span_*`` columns)."""
    rows = rows_of(res, "steps")
    if rows:
        cols = ("measured_ns", "simulated_ns", "error_pct")
        keys = [step_label(r.get("step")) for r in rows]
        what, title = "step", "Step time, measured and simulated"
    else:
        rows = [r for r in rows_of(res, "summary") if number(r.get("span_measured_ns"))]
        if not rows:
            return None
        cols = ("span_measured_ns", "span_simulated_ns", "span_error_pct")
        keys = [f"rank {r.get('rank')}" for r in rows]
        what, title = "rank", "Span of each rank (first start to last end), measured and simulated"
    n = len(rows)
    rows, keys = rows[: MAX_BARS // 2], keys[: MAX_BARS // 2]
    many = what == "step" and len({r.get("rank") for r in rows}) > 1
    x: Any = [[f"rank {r.get('rank')}" for r in rows], keys] if many else keys
    err = [number(r.get(cols[2])) for r in rows]
    data = [{
        "type": "bar", "name": name, "x": x,
        "y": [(number(r.get(col)) or 0.0) / 1e6 for r in rows],
        "customdata": err, "marker": {"color": REPLAY_COLORS[name]},
        "hovertemplate": f"%{{x}}<br>{name}: %{{y:.3f}} ms (error %{{customdata:.2f}} %)"
                         "<extra></extra>",
    } for name, col in (("measured", cols[0]), ("simulated", cols[1]))]  # fmt: skip
    more = f" (the first {len(rows):,} of {n:,})" if n > len(rows) else ""
    return _figure("replay-steps", title + more, data, {
        "barmode": "group",
        "xaxis": _axis("rank and step" if many else what,
                       type="multicategory" if many else "category"),
        "yaxis": _axis("time (ms)"),
    })  # fmt: skip


def rank_waits(res: Result) -> Figure | None:
    """Per rank (the ``ranks`` tool's ``waits`` table): its collective time split into waiting
    for the last participant and transfer, stacked, and the waiting it caused the others
    beside them."""
    rows = sorted(rows_of(res, "waits"), key=lambda r: (r.get("rank") is None, r.get("rank")))
    if len(rows) < 2:
        return None
    names = [f"rank {r.get('rank')}" for r in rows]

    def ms(col: str) -> list[float | None]:
        return [None if (v := number(r.get(col))) is None else v / 1e6 for r in rows]

    return _figure("rank-waits", "Collective time per rank: waiting vs transfer", [
        {"type": "bar", "name": "waiting for the last rank", "x": names, "y": ms("wait_ns"),
         "marker": {"color": _PALETTE[1]}, "offsetgroup": "own",
         "hovertemplate": "%{x}: waited %{y:.3f} ms<extra></extra>"},
        {"type": "bar", "name": "transfer", "x": names, "y": ms("transfer_ns"),
         "marker": {"color": _PALETTE[0]}, "offsetgroup": "own", "base": ms("wait_ns"),
         "hovertemplate": "%{x}: transfer %{y:.3f} ms<extra></extra>"},
        {"type": "bar", "name": "others waited for it", "x": names, "y": ms("caused_ns"),
         "marker": {"color": _PALETTE[2]}, "offsetgroup": "caused",
         "hovertemplate": "%{x}: the others waited %{y:.3f} ms for it<extra></extra>"},
    ], {"barmode": "group", "xaxis": _axis("rank", type="category"),
        "yaxis": _axis("time (ms)")})  # fmt: skip


_BUILDERS: dict[str, Callable[[Result], list[Figure | None]]] = {
    "ranks": lambda res: [step_heatmap(rows_of(res, "steps")), rank_waits(res)],
    "overview": overview_figures,
    "summary": lambda res: [
        top_bars(
            "top-ops",
            "Top ops by self time",
            rows_of(res, "top_ops"),
            ("op", "name"),
            ("self_ms", "self_us", "self_ns"),
            "self time",
        ),
        top_bars(
            "slowest-layers",
            "Slowest layers (forward time)",
            rows_of(res, "slowest_layers"),
            ("layer",),
            ("forward_ns",),
            "forward time",
        ),
    ],
    "stats": stats_figures,
    "roofline": lambda res: [roofline(res)],
    "memory": lambda res: [memory(res)],
    "comm": comm_figures,
    "replay": lambda res: [replay_steps(res)],
}


def step_label(step: Any) -> str:
    """``step 5``; ``whole trace`` for a trace without steps (each rank's one step)."""
    return "whole trace" if step is None else f"step {step}"

"""The HTML report of a sweep (``xpuprof sweep``): models × batch sizes × dtypes, each measured
leveled (model-only run, then + layer spans, + framework ops, + kernels on a GPU), as one
self-contained page: the tables and charts of the XSP paper, for PyTorch.

Input: the sweep's :class:`~xpuprof.core.result.Result` (``docs/leveled.md``): tables
``summary`` (one row per configuration), ``layer_types``, ``top_ops``, ``top_kernels``,
``findings``, and facts ``headline``, ``device``, ``peak_gflops``, ``peak_gb_per_s``,
``levels``. Any table may be empty or absent. The page draws the numbers as they are: nothing
is measured or recomputed here, except the roof ``min(peak_gflops, peak_gb_per_s × I)``.

What it holds, in order: the headline, the device and the levels; the configurations table
(failed configurations marked, with their error); the charts — step latency and throughput
against batch size (one line per model × dtype), the share of the step each layer type takes
(one stacked bar per configuration), the roofline (achieved GFLOP/s against FLOP/byte, log–log,
with the roof when both peaks are known), peak memory against batch size, the profiling
overhead of each level per configuration (grouped bars); then per model its top ops, top
kernels and the advisor's findings. A failed configuration has no point in any chart. A chart
or table with nothing to show is left out and a one-line note says so, never an empty table.

Security and offline use as :mod:`xpuprof.ui.report` (whose helpers this reuses): Plotly's
JavaScript inlined, every string from the data escaped in the HTML (``esc``), written as
entities in chart text (:func:`xpuprof.ui.charts.plain`), the figures carried as JSON in a
``<script type="application/json">`` and drawn by Plotly (no ``innerHTML`` of data), the file
written atomically.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuprof.core.result import Result, records
from xpuprof.ui.charts import label, number, plain
from xpuprof.ui.report import (
    DRAW,
    STYLE,
    check_output,
    esc,
    json_for_script,
    notes_html,
    plotly_js,
    write_atomic,
)

Row = dict[str, Any]
Figure = dict[str, Any]
Key = tuple[Any, Any, Any]  # (model, batch, dtype)

#: Rows of each configuration shown in a model's top-ops and top-kernels tables.
TOP = 10
#: Layer types drawn in the share chart; the rest are summed into one "other types" segment.
MAX_TYPES = 10
#: The levels whose overhead the summary carries (column ``overhead_<level>_pct``).
OVERHEAD_LEVELS = ("layer", "op", "kernel")
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
DASHES = ("solid", "dash", "dot", "dashdot", "longdash")

EXTRA_STYLE = """
tr.failed td { background: #fdecea; }
tr.failed td.status { color: #b00020; font-weight: 700; }
h3 { font-size: 16px; margin: 18px 0 4px; }
"""


# ------------------------------------------------------------------------------ data


def table_rows(res: Result, name: str) -> list[Row]:
    """Table ``name`` as JSON-able rows (missing values as None); [] when absent or empty."""
    table = res.tables.get(name)
    if table is None or not len(table):
        return []
    return records(table)


def key_of(row: Row) -> Key:
    return (row.get("model"), row.get("batch"), row.get("dtype"))


def config_label(row: Row) -> str:
    """``mlp · float32 · batch 8``, as plain chart text."""
    return plain(f"{row.get('model')} · {row.get('dtype')} · batch {row.get('batch')}")


def _order(rows: list[Row]) -> list[Row]:
    """Rows by model and dtype (in order of first appearance), then batch size."""
    models = {m: i for i, m in enumerate(dict.fromkeys(r.get("model") for r in rows))}
    dtypes = {d: i for i, d in enumerate(dict.fromkeys(r.get("dtype") for r in rows))}
    return sorted(rows, key=lambda r: (models[r.get("model")], dtypes[r.get("dtype")],
                                       number(r.get("batch")) or 0.0))  # fmt: skip


def ok_rows(summary: list[Row]) -> list[Row]:
    """The configurations that ran (status ``ok``), ordered."""
    return _order([r for r in summary if r.get("status") == "ok"])


def series(rows: list[Row]) -> dict[tuple[Any, Any], list[Row]]:
    """Rows grouped by (model, dtype), each group in batch order."""
    out: dict[tuple[Any, Any], list[Row]] = {}
    for r in _order(rows):
        out.setdefault((r.get("model"), r.get("dtype")), []).append(r)
    return out


# ------------------------------------------------------------------------------ charts


def _figure(fid: str, title: str, data: list[dict[str, Any]], layout: dict[str, Any]) -> Figure:
    base = {"title": {"text": plain(title)}, "margin": {"l": 70, "r": 30, "t": 60, "b": 60},
            "hovermode": "closest", "legend": {"orientation": "h", "y": -0.25},
            "height": 420}  # fmt: skip
    return {"id": fid, "title": title, "data": data, "layout": base | layout}


def _axis(title: str, **kw: Any) -> dict[str, Any]:
    return {"title": {"text": plain(title)}, "automargin": True, **kw}


def _batch_axis(batches: Iterable[Any]) -> dict[str, Any]:
    """Batch sizes as ticks; a log axis when they span a factor of 8 or more."""
    vals = sorted({b for b in (number(x) for x in batches) if b is not None})
    kw: dict[str, Any] = {"tickvals": vals, "ticktext": [f"{v:g}" for v in vals]}
    if vals and vals[0] > 0 and vals[-1] / vals[0] >= 8:
        kw["type"] = "log"
    return _axis("batch size (samples)", **kw)


def _style(models: list[Any], dtypes: list[Any], model: Any, dtype: Any) -> dict[str, Any]:
    """One colour per model, one dash per dtype."""
    return {"color": PALETTE[models.index(model) % len(PALETTE)],
            "dash": DASHES[dtypes.index(dtype) % len(DASHES)]}  # fmt: skip


def by_batch(fid: str, title: str, summary: list[Row], col: str, ytitle: str, unit: str,
             ci: bool = False, div: float = 1.0) -> Figure | None:  # fmt: skip
    """``col`` (÷ ``div``) against batch size, one line per model × dtype, points of the
    configurations that ran and have a value; ``ci``: error bars of ± ``ci_pct`` % of it."""
    rows = [r for r in ok_rows(summary) if number(r.get(col)) is not None]
    if not rows:
        return None
    groups = series(rows)
    models = list(dict.fromkeys(m for m, _ in groups))
    dtypes = list(dict.fromkeys(d for _, d in groups))
    data = []
    for (model, dtype), rs in groups.items():
        trace: dict[str, Any] = {
            "type": "scatter", "mode": "lines+markers", "name": label(f"{model} {dtype}"),
            "x": [r.get("batch") for r in rs], "y": [number(r.get(col)) / div for r in rs],
            "line": _style(models, dtypes, model, dtype),
            "hovertemplate": f"{label(model)} {label(dtype)}, batch %{{x}}: "
                             f"%{{y:,.4g}} {plain(unit)}<extra></extra>",
        }  # fmt: skip
        if ci:
            pct = [number(r.get("ci_pct")) for r in rs]
            err = [None if c is None else (number(r.get(col)) or 0.0) / div * c / 100
                   for r, c in zip(rs, pct, strict=True)]  # fmt: skip
            if any(e is not None for e in err):
                trace["error_y"] = {"type": "data", "array": err, "visible": True}
        data.append(trace)
    return _figure(fid, title, data, {"xaxis": _batch_axis(r.get("batch") for r in rows),
                                      "yaxis": _axis(ytitle, rangemode="tozero")})  # fmt: skip


def layer_shares(summary: list[Row], layer_types: list[Row]) -> Figure | None:
    """One stacked horizontal bar per configuration that ran: the share of its step (%) each
    layer type takes (the :data:`MAX_TYPES` largest types by total share; the rest summed)."""
    ran = {key_of(r): r for r in ok_rows(summary)}
    rows = [r for r in layer_types if key_of(r) in ran and number(r.get("share_pct")) is not None]
    if not rows:
        return None
    configs = [k for k in ran if any(key_of(r) == k for r in rows)]
    total: dict[Any, float] = {}
    for r in rows:
        total[r.get("type")] = total.get(r.get("type"), 0.0) + (number(r["share_pct"]) or 0.0)
    # the rest of the step (what no leaf layer covers: backward, loss, optimizer) is not a
    # layer type: drawn last, in grey, after the types and "other types"
    outside = [t for t in total if str(t).startswith("(")]
    types = sorted((t for t in total if t not in outside), key=lambda t: -total[t])
    shown, rest = types[:MAX_TYPES], set(types[MAX_TYPES:])
    share: dict[tuple[Key, Any], float] = {}
    ms: dict[tuple[Key, Any], float | None] = {}
    for r in rows:
        t = "other types" if r.get("type") in rest else r.get("type")
        k = (key_of(r), t)
        share[k] = share.get(k, 0.0) + (number(r["share_pct"]) or 0.0)
        ms[k] = (ms.get(k) or 0.0) + (number(r.get("ms")) or 0.0)
    ylabels = [config_label(ran[k]) for k in configs]
    data = []
    colors = {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(shown)}
    colors.update({"other types": "#c7c7c7", **{t: "#e8e8e8" for t in outside}})
    for t in shown + (["other types"] if rest else []) + outside:
        data.append({
            "type": "bar", "orientation": "h", "name": label(t), "y": ylabels,
            "x": [share.get((k, t)) for k in configs],
            "customdata": [ms.get((k, t)) for k in configs],
            "marker": {"color": colors[t], "line": {"color": "#999999", "width": 0.5}},
            "hovertemplate": f"%{{y}}<br>{label(t)}: %{{x:.1f}} % of the step "
                             "(%{customdata:.3f} ms)<extra></extra>",
        })  # fmt: skip
    return _figure("layer-shares", "Share of the step per layer type", data, {
        "barmode": "stack", "height": max(300, 120 + 32 * len(configs)),
        "legend": {"orientation": "h", "y": -0.25, "traceorder": "normal"},
        "xaxis": _axis("share of the step time (%)"),
        "yaxis": _axis("configuration", type="category", autorange="reversed"),
    })  # fmt: skip


def roofline(summary: list[Row], peak_gflops: Any, peak_gb_per_s: Any) -> Figure | None:
    """Achieved GFLOP/s against arithmetic intensity (FLOP/byte), log–log, one labelled point
    per configuration that ran (positive values only: log axes); the roof
    ``min(peak_gflops, peak_gb_per_s × I)`` when both peaks are given."""
    ran = ok_rows(summary)
    rows = [r for r in ran if (number(r.get("intensity")) or 0) > 0
            and (number(r.get("achieved_gflops")) or 0) > 0]  # fmt: skip
    if not rows:
        return None
    groups = series(rows)
    models = list(dict.fromkeys(m for m, _ in groups))
    data: list[dict[str, Any]] = []
    for (model, dtype), rs in groups.items():
        data.append({
            "type": "scatter", "mode": "markers+text", "name": label(f"{model} {dtype}"),
            "x": [number(r.get("intensity")) for r in rs],
            "y": [number(r.get("achieved_gflops")) for r in rs],
            "text": [f"b{r.get('batch')}" for r in rs], "textposition": "top center",
            "marker": {"size": 9, "color": PALETTE[models.index(model) % len(PALETTE)]},
            "hovertemplate": f"{label(model)} {label(dtype)}, %{{text}}<br>"
                             "%{x:.3g} FLOP/B, %{y:,.4g} GFLOP/s<extra></extra>",
        })  # fmt: skip
    p, w = number(peak_gflops), number(peak_gb_per_s)
    if p and w and p > 0 and w > 0:
        xs = [number(r.get("intensity")) or 0.0 for r in rows]
        ridge = p / w
        lo, hi = min(*xs, ridge) / 4, max(*xs, ridge) * 4
        data.append({
            "type": "scatter", "mode": "lines", "name": "roof", "x": [lo, ridge, hi],
            "y": [min(p, w * lo), p, min(p, w * hi)],
            "line": {"color": "#444", "width": 2},
            "hovertemplate": "roof: %{y:,.4g} GFLOP/s at %{x:.3g} FLOP/B<extra></extra>",
        })  # fmt: skip
    left = len([r for r in ran if number(r.get("achieved_gflops")) is not None]) - len(rows)
    title = "Roofline" + (f" ({left} configuration(s) with 0 FLOPs or bytes not drawn)"
                          if left > 0 else "")  # fmt: skip
    return _figure("roofline", title, data, {
        "xaxis": _axis("arithmetic intensity (FLOP/byte)", type="log"),
        "yaxis": _axis("achieved (GFLOP/s)", type="log"),
    })  # fmt: skip


def overhead(summary: list[Row]) -> Figure | None:
    """The profiling overhead of each level (its median step over the model level's, %), one
    group of bars per configuration that ran, one bar per level measured."""
    cols = {lv: f"overhead_{lv}_pct" for lv in OVERHEAD_LEVELS}
    rows = [r for r in ok_rows(summary) if any(number(r.get(c)) is not None
                                               for c in cols.values())]  # fmt: skip
    if not rows:
        return None
    x = [config_label(r) for r in rows]
    data = []
    for i, (lv, col) in enumerate(cols.items()):
        y = [number(r.get(col)) for r in rows]
        if all(v is None for v in y):
            continue
        data.append({
            "type": "bar", "name": f"+ {lv}", "x": x, "y": y,
            "marker": {"color": PALETTE[i % len(PALETTE)]},
            "hovertemplate": f"%{{x}}<br>{lv} level: %{{y:+.1f}} %<extra></extra>",
        })  # fmt: skip
    return _figure("overhead", "Profiling overhead of each level over the model-only step", data,
                   {"barmode": "group",
                    "xaxis": _axis("configuration", type="category"),
                    "yaxis": _axis("overhead over the model-only step (%)")})  # fmt: skip


#: The charts in order: (id, section, why it is left out when there is nothing to draw).
CHARTS = (
    ("latency", "scaling", "no configuration that ran has a step time"),
    ("throughput", "scaling", "no configuration that ran has a throughput"),
    ("layer-shares", "layers", "no layer-type times (the layer level was not measured)"),
    ("roofline", "roofline", "no configuration has both FLOPs and bytes per step"),
    ("memory", "memory", "no configuration that ran has a peak memory"),
    ("overhead", "overhead", "no level below the model level was measured"),
)


def figures(res: Result) -> dict[str, Figure | None]:
    """Every chart of the sweep by id (None: nothing to draw)."""
    summary = table_rows(res, "summary")
    return {
        "latency": by_batch("latency", "Step latency against batch size", summary, "step_ms",
                            "step time (ms)", "ms", ci=True),
        "throughput": by_batch("throughput", "Throughput against batch size", summary,
                               "samples_per_s", "throughput (samples/s)", "samples/s"),
        "layer-shares": layer_shares(summary, table_rows(res, "layer_types")),
        "roofline": roofline(summary, res.facts.get("peak_gflops"),
                             res.facts.get("peak_gb_per_s")),
        "memory": by_batch("memory", "Peak memory against batch size", summary,
                           "peak_rss_bytes", "peak resident memory (MiB)", "MiB", div=2**20),
        "overhead": overhead(summary),
    }  # fmt: skip


# ------------------------------------------------------------------------------ tables


def fixed(digits: int) -> Callable[[Any], str]:
    """A formatter: a number with ``digits`` decimals and thousands separators; ``-`` if none."""

    def fmt(v: Any) -> str:
        x = number(v)
        return "-" if x is None else f"{x:,.{digits}f}"

    return fmt


def scaled(div: float) -> Callable[[Any], str]:
    """A formatter: the number divided by ``div``, to 4 significant digits (whole numbers from
    1,000 on), for columns whose values span orders of magnitude across models."""

    def fmt(v: Any) -> str:
        x = number(v)
        if x is None:
            return "-"
        x /= div
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"

    return fmt


def text(v: Any) -> str:
    return "-" if v is None else str(v)


@dataclass(frozen=True)
class Col:
    """One column: its key in the rows, its header (with the unit), how to show a value."""

    key: str
    header: str
    fmt: Callable[[Any], str] = text
    numeric: bool = True


SUMMARY_COLS = (
    Col("model", "model", numeric=False),
    Col("dtype", "dtype", numeric=False),
    Col("batch", "batch (samples)", fixed(0)),
    Col("status", "status", numeric=False),
    Col("step_ms", "step, median (ms)", fixed(3)),
    Col("ci_pct", "95 % interval (± %)", fixed(1)),
    Col("samples_per_s", "throughput (samples/s)", fixed(1)),
    Col("layer_sum_ms", "layers, sum (ms)", fixed(3)),
    Col("overhead_layer_pct", "overhead + layer (%)", fixed(1)),
    Col("overhead_op_pct", "overhead + op (%)", fixed(1)),
    Col("overhead_kernel_pct", "overhead + kernel (%)", fixed(1)),
    Col("params", "parameters (count)", fixed(0)),
    Col("peak_rss_bytes", "peak memory (MiB)", scaled(2**20)),
    Col("work_flops", "work per step (GFLOP)", scaled(1e9)),
    Col("traffic_bytes", "traffic per step (MB)", scaled(1e6)),
    Col("intensity", "intensity (FLOP/byte)", scaled(1)),
    Col("achieved_gflops", "achieved (GFLOP/s)", scaled(1)),
    Col("error", "error", numeric=False),
    Col("folder", "folder (in the sweep's)", numeric=False),
)
OP_COLS = (
    Col("dtype", "dtype", numeric=False),
    Col("batch", "batch (samples)", fixed(0)),
    Col("op", "op", numeric=False),
    Col("ms", "time per step (ms)", fixed(3)),
    Col("calls", "calls (count)", fixed(0)),
    Col("share_pct", "share of the step (%)", fixed(1)),
)
KERNEL_COLS = tuple(Col("kernel", "kernel", numeric=False) if c.key == "op" else c
                    for c in OP_COLS)  # fmt: skip
FINDING_COLS = (
    Col("dtype", "dtype", numeric=False),
    Col("batch", "batch (samples)", fixed(0)),
    Col("finding", "finding", numeric=False),
    Col("recommendation", "recommendation", numeric=False),
)
#: Text columns whose cells wrap.
LONG = {"error", "finding", "recommendation", "folder", "op", "kernel"}


def rows_html(title: str, rows: list[Row], cols: Iterable[Col],
              marked: Callable[[Row], bool] = lambda r: False) -> str:  # fmt: skip
    """A table of ``rows`` (``""`` when there are none): columns empty in every row left out
    and named under it; rows for which ``marked`` holds get class ``failed``."""
    if not rows:
        return ""
    cols = list(cols)
    keep = [c for c in cols if any(r.get(c.key) not in (None, "") for r in rows)]
    num = ' class="num"'
    head = "".join(f"<th{num if c.numeric else ''}>{esc(c.header)}</th>" for c in keep)
    lines = []
    for r in rows:
        cells = []
        for c in keep:
            cls = "num" if c.numeric else "long" if c.key in LONG else c.key
            cells.append(f'<td class="{esc(cls)}">{esc(c.fmt(r.get(c.key)))}</td>')
        mark = ' class="failed"' if marked(r) else ""
        lines.append(f"<tr{mark}>" + "".join(cells) + "</tr>")
    blank = [c.header for c in cols if c not in keep]
    aside = (f'<p class="aside">empty in every row: {esc(", ".join(blank))}</p>'
             if blank else "")  # fmt: skip
    return (
        f'<div class="table"><h4>{esc(title)}</h4><table class="records"><thead><tr>'
        f"{head}</tr></thead><tbody>" + "\n".join(lines) + f"</tbody></table>{aside}</div>"
    )


def note(text_: str) -> str:
    """One line saying why something is not shown."""
    return f'<p class="aside">{esc(text_)}</p>'


def top_rows(rows: list[Row], by: str = "ms") -> list[Row]:
    """The :data:`TOP` largest rows (by ``by``) of each configuration, in configuration order."""
    out: list[Row] = []
    for rs in series(rows).values():
        for batch in dict.fromkeys(r.get("batch") for r in rs):
            one = [r for r in rs if r.get("batch") == batch]
            out += sorted(one, key=lambda r: -(number(r.get(by)) or 0.0))[:TOP]
    return out


# ------------------------------------------------------------------------------ the page


@dataclass
class Part:
    """One section of the page: anchor, heading, HTML parts, the figures it draws, notes."""

    id: str
    title: str
    parts: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def chart(self, fig: Figure | None, why: str) -> None:
        if fig is None:
            self.parts.append(note(f"No chart: {why}."))
            return
        self.figures.append(fig)
        self.parts.append(f'<div class="chart" id="fig-{esc(fig["id"])}" '
                          f'data-title="{esc(fig["title"])}"></div>')  # fmt: skip

    def to_html(self) -> str:
        return (f'<section id="{esc(self.id)}"><h2>{esc(self.title)}</h2>'
                + "\n".join(self.parts) + notes_html(self.notes) + "</section>")  # fmt: skip


#: The tables of each model's section: (table, title, columns, top-N per configuration, why
#: none is shown when the model has no rows).
MODEL_TABLES = (
    ("top_ops", "Top ops", OP_COLS, True,
     "no framework ops recorded (the op level was not measured, or the model failed)"),
    ("top_kernels", "Top kernels", KERNEL_COLS, True,
     "no kernels recorded (kernels are measured on a GPU only)"),
    ("findings", "Findings", FINDING_COLS, False,
     "the advisor found nothing to change"),
)  # fmt: skip


def model_parts(res: Result, models: list[Any]) -> list[Part]:
    """Per model: its top ops, top kernels and findings (a one-line note for what is empty)."""
    ran = {r.get("model") for r in ok_rows(table_rows(res, "summary"))}
    tables = {name: table_rows(res, name) for name, *_ in MODEL_TABLES}
    out = []
    for i, m in enumerate(models):
        part = Part(f"model-{i}", f"Model {m}")
        if m not in ran:
            part.parts.append(note("Every configuration of this model failed: see its errors "
                                   "in the configurations table."))  # fmt: skip
            out.append(part)
            continue
        for name, title, cols, top, none in MODEL_TABLES:
            mine = [r for r in tables[name] if r.get("model") == m]
            shown = top_rows(mine) if top else _order(mine)
            heading = f"{title} (the {TOP} longest of each configuration)" if top else title
            part.parts.append(rows_html(heading, shown, cols) or note(f"{title}: {none}."))
        out.append(part)
    return out


def build(res: Result) -> tuple[list[Part], dict[str, str]]:
    """The sections of the page, and the charts left out (id → why)."""
    summary = table_rows(res, "summary")
    figs = figures(res)
    conf = Part("configurations", "Configurations")
    failed = [r for r in summary if r.get("status") != "ok"]
    table = rows_html("Configurations", _order(summary), SUMMARY_COLS,
                      marked=lambda r: r.get("status") != "ok")  # fmt: skip
    conf.parts.append(table or note("No configurations: the sweep ran nothing."))
    if failed:
        conf.notes.append(f"{len(failed)} of {len(summary)} configuration(s) failed (marked "
                          "red, with their error); they have no point in the charts")  # fmt: skip
    parts = [conf]
    titles = {
        "scaling": "Latency and throughput",
        "layers": "Where the step goes",
        "roofline": "Roofline",
        "memory": "Memory",
        "overhead": "Profiling overhead",
    }
    by_id = {}
    left_out = {}
    for fid, sid, why in CHARTS:
        part = by_id.get(sid)
        if part is None:
            part = by_id[sid] = Part(sid, titles[sid])
            parts.append(part)
        part.chart(figs[fid], why)
        if figs[fid] is None:
            left_out[fid] = why
    if figs["roofline"] is not None and not any(t.get("name") == "roof"
                                                for t in figs["roofline"]["data"]):  # fmt: skip
        by_id["roofline"].notes.append("no roof: the device's peak GFLOP/s and GB/s are not "
                                       "both known")  # fmt: skip
    models = list(dict.fromkeys(r.get("model") for r in _order(summary)))
    return parts + model_parts(res, models), left_out


def page(res: Result, parts: list[Part]) -> str:
    """The whole document: styles, Plotly, the sections, the figures as JSON, the drawing."""
    figs = [f for p in parts for f in p.figures]
    nav = " · ".join(f'<a href="#{esc(p.id)}">{esc(p.title)}</a>' for p in parts)
    facts = res.facts
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    meta = [f"device: {facts.get('device') or 'unknown'}",
            f"levels: {facts.get('levels') or 'unknown'}", f"written {when}"]  # fmt: skip
    peaks = [f"{number(facts.get(k)):,.4g} {u}" for k, u in (("peak_gflops", "GFLOP/s"),
             ("peak_gb_per_s", "GB/s")) if number(facts.get(k))]  # fmt: skip
    if peaks:
        meta.insert(1, "peaks: " + ", ".join(peaks))
    headline = facts.get("headline")
    head = f'<p class="headline">{esc(headline)}</p>' if headline else ""
    return "\n".join([
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>xpuprof sweep</title>",
        f"<style>{STYLE}{EXTRA_STYLE}</style>",
        f"<script>{plotly_js()}</script>",
        "</head><body>",
        f'<header><h1>xpuprof sweep</h1><p class="meta">{esc(" · ".join(meta))}</p>'
        f"<nav>{nav}</nav></header>",
        f"<main>{head}",
        *(p.to_html() for p in parts),
        "</main>",
        "<footer>Every number here is in the sweep's summary (its <code>--json</code>) and in "
        "each configuration's leveled folder.</footer>",
        f'<script type="application/json" id="xpuprof-figures">{json_for_script(figs)}'
        "</script>",
        f"<script>{DRAW}</script>",
        "</body></html>",
    ])  # fmt: skip


def sweep_report_html(res: Result) -> str:
    """The sweep's report as one HTML document."""
    return page(res, build(res)[0])


def write_sweep_report(res: Result, out: str | Path) -> dict[str, Any]:
    """Write the sweep's report to ``out``, atomically. Returns ``{"path", "bytes", "charts",
    "left_out"}`` (chart ids drawn; chart id → why it is not). A bad path (no such folder, a
    folder) is an :class:`~xpuprof.core.errors.XpuprofError` naming it, raised first."""
    path = check_output(out)
    parts, left_out = build(res)
    size = write_atomic(path, page(res, parts))
    charts = [f["id"] for p in parts for f in p.figures]
    return {"path": str(path.resolve()), "bytes": size, "charts": charts, "left_out": left_out}

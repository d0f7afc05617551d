"""The self-contained HTML report (``xpuprof report STORE -o report.html``; the demo writes it
too): one file that opens offline in any browser, with Plotly's JavaScript inlined from the
installed ``plotly`` package (no CDN, no address outside the file).

What it holds, in order (``docs/report.md``): what the store holds (``info``); the headline and
the advisor's findings with their evidence and saving, the step-time breakdown, the per-rank
summary and, with several ranks, the step time per rank and step (``overview``); the top ops and
kernels (tables and charts); the slowest layers when the trace has layers (``stats``); the
roofline, memory and — when the trace has collectives — communication. Every number comes from
:func:`xpuprof.ui.tools.run` (the same answers as each command's ``--json``) and every chart
from :func:`xpuprof.ui.charts.figures`; nothing is computed here. A tool that fails or has
nothing to show leaves a note in its section saying why, never a traceback.

Every string from a trace is escaped (``html.escape``); the charts' data travels as JSON inside
a ``<script type="application/json">`` with ``<``, ``>`` and ``&`` written as ``\\u003c``…, read
with ``JSON.parse`` and drawn by Plotly (no ``innerHTML`` of data). Tables show at most
:data:`ROWS` rows (the report stays small: < 10 MB for a big store, ~4.7 MB of it Plotly). The
file is written atomically: a temporary file in the same directory, then ``os.replace``.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuprof.core.errors import XpuprofError
from xpuprof.core.result import Presentation, Result, Table, records
from xpuprof.ui import charts, tools
from xpuprof.ui.render import TRANSPOSE_MAX, Column, same_units
from xpuprof.ui.text import merge_notes, ranges_text, short_name

if TYPE_CHECKING:
    from xpuprof.analysis.common import StepSelection
    from xpuprof.trace.trace import Trace

#: The most rows a table of the report shows (the tool's ``--json`` has them all).
ROWS = 50
#: Cells with more letters than this wrap; shorter ones stay on one line.
LONG = 40


def esc(value: Any) -> str:
    """``value`` as HTML text (``&``, ``<``, ``>`` and quotes escaped)."""
    return html.escape(str(value), quote=True)


# ------------------------------------------------------------------------------ tables


Row = dict[str, Any]


def _head(table: Table, limit: int | None) -> tuple[list[Row], int]:
    """The first ``limit`` rows (all for None) as JSON-able dicts, and the number of rows."""
    if isinstance(table, list):
        return records(table if limit is None else table[:limit]), len(table)
    return records(table if limit is None else table.head(limit)), len(table)


def _cell(col: Column, value: Any) -> str:
    """One cell: the value as the terminal shows it (units, short names); a shortened name
    keeps the whole one as its tooltip."""
    text = col.format(value)
    full = "" if col.numeric or value is None else str(value)
    tip = f' title="{esc(full)}"' if full and full != text else ""
    cls = ' class="num"' if col.numeric else ' class="long"' if len(text) > LONG else ""
    return f"<td{cls}{tip}>{esc(text)}</td>"


def table_html(name: str, table: Table, present: Presentation | None = None,
               origin: int | None = None, limit: int | None = ROWS,
               more: str = "") -> str:  # fmt: skip
    """One table of a Result as HTML, laid out as its presentation says (records,
    ``transpose``: one column per record, ``paragraphs``: one numbered paragraph per record),
    columns headed and formatted as the terminal does (:class:`xpuprof.ui.render.Column`:
    units in headers, short names), columns empty in every row left out; at most ``limit``
    rows, and a line saying how many there are (``more``: where to see the rest). ``origin``:
    the trace's first timestamp (timestamps are shown from it). Empty tables give ``""``."""
    p = present or Presentation()
    rows, n = _head(table, None if p.all_rows else limit)
    if not n:
        return ""
    title = esc(p.title or name.replace("_", " "))
    cols = list(dict.fromkeys(k for r in rows for k in r))
    if p.layout == "paragraphs":
        body = _paragraphs(rows, cols, p.lines)
    else:
        units = dict(p.units)
        spec = [Column(c, [r.get(c) for r in rows], units.get(c), origin) for c in cols]
        same_units(spec)
        keep = [s for s in spec if not s.blank] or spec
        if p.layout == "transpose" and n <= TRANSPOSE_MAX:
            body = _transposed(rows, keep, p.label)
        else:
            head = "".join(f"<th>{esc(c.header)}</th>" for c in keep)
            lines = ("<tr>" + "".join(_cell(c, r.get(c.name)) for c in keep) + "</tr>"
                     for r in rows)  # fmt: skip
            body = (f'<table class="records"><thead><tr>{head}</tr></thead><tbody>'
                    + "\n".join(lines) + "</tbody></table>")  # fmt: skip
        blank = [s.label for s in spec if s.blank]
        if blank and len(keep) < len(spec):
            body += f'<p class="aside">0 or empty in every row shown: {esc(", ".join(blank))}</p>'
    count = ""
    if len(rows) < n:
        count = f'<p class="aside">{n:,} rows, the first {len(rows)} shown{esc(more)}.</p>'
    return f'<div class="table"><h4>{title}</h4>{body}{count}</div>'


def _transposed(rows: list[Row], spec: list[Column], label: str | None) -> str:
    """One column per record, headed by its ``label`` value (``rank 0``)."""
    names = [f"{label} {r.get(label)}" if label and r.get(label) is not None else f"#{i + 1}"
             for i, r in enumerate(rows)]  # fmt: skip
    head = "<th></th>" + "".join(f'<th class="num">{esc(n)}</th>' for n in names)
    lines = []
    for c in spec:
        if c.name == label:
            continue
        cells = "".join(_cell(c, r.get(c.name)) for r in rows)
        lines.append(f'<tr><th class="key">{esc(c.header)}</th>{cells}</tr>')
    return (f'<table class="transpose"><thead><tr>{head}</tr></thead><tbody>'
            + "\n".join(lines) + "</tbody></table>")  # fmt: skip


class _Blank(dict):
    """Format values for a paragraph template: a missing key or value reads ``-``."""

    def __missing__(self, key: str) -> str:
        return "-"


def _paragraphs(rows: list[Row], cols: list[str], lines: tuple[str, ...]) -> str:
    """Numbered paragraphs, each line a template of the presentation over the record (the
    first in bold), escaped after formatting."""
    items = []
    for r in rows:
        rec = _Blank({k: ("-" if v is None else v) for k, v in r.items()})
        try:
            text = [line.format_map(rec) for line in lines] or [str(r)]
        except (ValueError, TypeError, IndexError, AttributeError):
            text = [", ".join(f"{k}: {r.get(k)}" for k in cols)]
        first, *rest = (esc(t) for t in text)
        items.append(f"<li><strong>{first}</strong>" + "".join(f"<br>{t}" for t in rest)
                     + "</li>")  # fmt: skip
    return '<ol class="paragraphs">' + "\n".join(items) + "</ol>"


def notes_html(notes: Iterable[str]) -> str:
    """Notes as a list (notes that say the same of several numbered things, once)."""
    merged = merge_notes(list(notes))
    if not merged:
        return ""
    return '<ul class="notes">' + "".join(f"<li>note: {esc(n)}</li>" for n in merged) + "</ul>"


# ------------------------------------------------------------------------------ sections


@dataclass
class Section:
    """One section of the report: its anchor, heading, HTML, the charts it draws and notes."""

    id: str
    title: str
    parts: list[str] = field(default_factory=list)
    figures: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)

    def chart(self, fig: dict[str, Any] | None) -> None:
        """Place ``fig`` (a :mod:`charts` figure) here."""
        if fig is None:
            return
        self.figures.append(fig)
        self.parts.append(f'<div class="chart" id="fig-{esc(fig["id"])}" '
                          f'data-title="{esc(fig["title"])}"></div>')  # fmt: skip

    def table(self, res: Result, name: str, limit: int = ROWS) -> bool:
        """Place table ``name`` of ``res`` (when it has rows); whether it did."""
        if name not in res.tables:
            return False
        tool = self.tools[-1] if self.tools else ""
        more = f"; xpuprof {tool} --json has them all"
        html_ = table_html(name, res.tables[name], res.present.get(name), _origin(res), limit,
                           more=more)  # fmt: skip
        self.parts.append(html_)
        return bool(html_)

    def to_html(self) -> str:
        return (f'<section id="{esc(self.id)}"><h2>{esc(self.title)}</h2>'
                + "\n".join(self.parts) + notes_html(self.notes) + "</section>")  # fmt: skip

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "tools": self.tools,
                "charts": [f["id"] for f in self.figures],
                "notes": merge_notes(self.notes)}  # fmt: skip


def _origin(res: Result) -> int | None:
    start = res.facts.get("trace_start_ns")
    return int(start) if isinstance(start, (int, float)) else None


def _run(section: Section, name: str, trace: Trace, **kw: Any) -> Result | None:
    """Run tool ``name`` for ``section``: its Result, or None with a note saying why it could
    not run (the error's message, never a traceback). A selection of ranks or steps that
    selects nothing is the caller's error and is raised."""
    section.tools.append(name)
    try:
        return tools.run(name, trace, **{k: v for k, v in kw.items() if v is not None})
    except tools.SelectionError:
        raise
    except XpuprofError as e:
        section.notes.append(f"{name} could not run: {e}")
    except Exception as e:  # noqa: BLE001 - one failing tool must not lose the whole report
        section.notes.append(f"{name} failed: {type(e).__name__}: {e}")
    return None


def _overview_sections(trace: Trace, sel: dict[str, Any],
                       predict: bool = False) -> list[Section]:  # fmt: skip
    """Findings, step time and top ops/kernels: all from one ``overview`` run (``predict``:
    each recommendation with the gain its replayed change predicts)."""
    find = Section("findings", "Findings")
    steps = Section("steps", "Step time")
    top = Section("top", "Top ops and kernels")
    res = _run(find, "overview", trace, **sel, predict=predict or None)
    if res is None:
        steps.notes.append("no overview: see the findings section")
        return [find, steps]
    steps.tools.append("overview")
    top.tools.append("overview")
    headline = res.facts.get("headline")
    if isinstance(headline, str) and headline:
        find.parts.append(f'<p class="headline">{esc(headline)}</p>')
    if not find.table(res, "recommendations"):
        find.parts.append('<p class="aside">No recommendations: the advisor found nothing to '
                          "change in this selection.</p>")  # fmt: skip
    find.notes += res.notes
    figs = {f["id"]: f for f in charts.figures("overview", res)}
    steps.chart(figs.get("step-breakdown"))
    steps.table(res, "summary")
    steps.chart(figs.get("step-heatmap"))
    steps.table(res, "steps")
    for fid, table in (("top-ops", "top_ops"), ("top-kernels", "top_kernels")):
        top.chart(figs.get(fid))
        top.table(res, table)
    if not top.parts:
        top.notes.append("no ops or kernels in the selection (the findings' notes say why)")
    return [find, steps, top]


def _layers(trace: Trace, sel: dict[str, Any]) -> Section | None:
    """The slowest layers (forward time), when the trace has layer spans."""
    if not trace.manifest.get("levels", {}).get("layer"):
        return None
    sec = Section("layers", "Slowest layers")
    res = _run(sec, "stats", trace, layers=True, **sel)
    if res is not None:
        for fig in charts.figures("stats", res):
            sec.chart(fig)
        sec.table(res, "layers", limit=25)
        sec.notes += res.notes
    return sec


Builder = Callable[["Trace", dict[str, Any]], "Section | None"]


def _tool_section(sid: str, title: str, tool: str, tables: tuple[str, ...],
                  needs: str | None = None) -> Builder:  # fmt: skip
    """A section of one tool: its charts, then ``tables``; with ``needs``, left out when that
    table of the answer is empty (communication without collectives)."""

    def build(trace: Trace, sel: dict[str, Any]) -> Section | None:
        sec = Section(sid, title)
        res = _run(sec, tool, trace, **sel)
        if res is None:
            return sec
        if needs is not None and not len(res.tables.get(needs, ())):
            return None
        headline = res.facts.get("headline")
        if isinstance(headline, str) and headline:
            sec.parts.append(f'<p class="headline">{esc(headline)}</p>')
        for fig in charts.figures(tool, res):
            sec.chart(fig)
        for name in tables:
            sec.table(res, name)
        sec.notes += res.notes
        if not sec.notes and not sec.figures and not any(len(res.tables.get(t, ()))
                                                         for t in tables):  # fmt: skip
            sec.notes.append(f"nothing to show: {tool} found no rows in this selection")
        return sec

    return build


#: The sections after the overview's, in order: (id, builder, why it is left out when the
#: builder gives none).
SECTIONS = (
    ("layers", _layers, "no layer spans in the trace"),
    ("roofline", _tool_section("roofline", "Roofline", "roofline",
                               ("by_name", "kernels", "devices")), ""),
    ("memory", _tool_section("memory", "Memory", "memory", ("peaks", "live_by_op")), ""),
    ("comm", _tool_section("comm", "Communication", "comm", ("summary", "stragglers", "overlap"),
                           needs="collectives"), "no collectives in the trace"),
)  # fmt: skip


# ------------------------------------------------------------------------------ the page


@dataclass
class Report:
    """The report's HTML and what each section holds (``sections``: id, title, tools,
    chart ids, notes; ``left_out``: sections without content and why)."""

    html: str
    sections: list[dict[str, Any]]
    left_out: dict[str, str]


def build(trace: Trace, *, ranks: Iterable[int] | None = None,
          steps: StepSelection = None, predict: bool = False) -> Report:  # fmt: skip
    """The report of ``trace`` for the selection (``ranks``, ``steps``: the tool convention);
    ``predict``: the findings with the gain their replayed change predicts (``docs/advise.md``)."""
    from xpuprof.analysis.per_rank import shared_cluster

    sel = {"ranks": list(ranks) if ranks is not None else None, "steps": steps}
    head = Section("store", "The trace")
    with shared_cluster():  # the sections of a many-rank report share one local cluster
        inf = _run(head, "info", trace)
        if inf is not None:
            if isinstance(inf.facts.get("headline"), str):
                head.parts.append(f"<p>{esc(inf.facts['headline'])}</p>")
            head.table(inf, "sources", limit=ROWS)
        sections = [head, *_overview_sections(trace, sel, predict)]
        left_out: dict[str, str] = {}
        for sid, make, why in SECTIONS:
            sec = make(trace, sel)
            if sec is None:
                left_out[sid] = why
            else:
                sections.append(sec)
    return Report(page(trace, sections, sel), [s.summary() for s in sections], left_out)


def report_html(trace: Trace, *, ranks: Iterable[int] | None = None,
                steps: StepSelection = None) -> str:  # fmt: skip
    """The report of ``trace`` as one HTML document (see :func:`build`)."""
    return build(trace, ranks=ranks, steps=steps).html


def plotly_js() -> str:
    """Plotly's JavaScript from the installed ``plotly`` package (it ships in the wheel), made
    safe to inline in a ``<script>`` (no ``</script`` inside)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as e:  # a dependency of xpuprof: only a broken install lacks it
        raise XpuprofError(
            f"the report needs the plotly package ({e}): pip install plotly"
        ) from None
    return get_plotlyjs().replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def json_for_script(obj: Any) -> str:
    """JSON to place inside ``<script type="application/json">``: ``<``, ``>`` and ``&``
    escaped, so no text of a trace can close the script or open a tag."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page(trace: Trace, sections: list[Section], sel: dict[str, Any]) -> str:
    """The whole document: styles, Plotly, the sections, the figures as JSON, the drawing."""
    try:
        from importlib.metadata import version

        __version__ = version("xpuprof")
    except ImportError:  # run from a source tree without an install (PackageNotFoundError)
        __version__ = "(unknown version)"

    figures = [f for s in sections for f in s.figures]
    nav = " · ".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in sections)
    chosen = []
    if sel.get("ranks") is not None:
        chosen.append("ranks " + ranges_text(sel["ranks"]))
    steps = sel.get("steps")
    if steps is not None:
        chosen.append("steps " + (str(steps) if isinstance(steps, str)
                                  else ranges_text(list(steps))))  # fmt: skip
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    meta = (f"{esc(trace.path.name)} · {esc('; '.join(chosen) or 'all ranks, all steps')} · "
            f"written {esc(when)} by xpuprof {esc(__version__)}")  # fmt: skip
    return "\n".join([
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>xpuprof report: {esc(short_name(trace.path.name))}</title>",
        f"<style>{STYLE}</style>",
        f"<script>{plotly_js()}</script>",
        "</head><body>",
        f'<header><h1>xpuprof report</h1><p class="meta">{meta}</p><nav>{nav}</nav></header>',
        "<main>",
        *(s.to_html() for s in sections),
        "</main>",
        '<footer>Every number here is also in the JSON of the command named in its section '
        f"(<code>xpuprof overview {esc(trace.path.name)} --json</code>, …).</footer>",
        f'<script type="application/json" id="xpuprof-figures">{json_for_script(figures)}'
        "</script>",
        f"<script>{DRAW}</script>",
        "</body></html>",
    ])  # fmt: skip


#: Draws every figure into its div; the data is read as JSON and handed to Plotly (no HTML).
DRAW = """
(function () {
  var figs = JSON.parse(document.getElementById("xpuprof-figures").textContent);
  figs.forEach(function (f) {
    var div = document.getElementById("fig-" + f.id);
    if (!div) { return; }
    if (typeof Plotly === "undefined") {
      div.textContent = "(this chart needs JavaScript: Plotly did not load)";
      return;
    }
    Plotly.newPlot(div, f.data, f.layout, {responsive: true, displaylogo: false});
  });
})();
"""

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
       color: #1d1d1f; background: #fafafa; }
header { background: #20232a; color: #f5f5f5; padding: 16px 32px; }
header h1 { margin: 0 0 4px; font-size: 22px; }
header .meta { margin: 0 0 8px; color: #c9c9c9; }
header nav a { color: #9cdcfe; text-decoration: none; }
main { padding: 8px 32px 32px; max-width: 1400px; }
section { background: #fff; border: 1px solid #e2e2e2; border-radius: 6px;
          margin: 18px 0; padding: 8px 20px 16px; }
h2 { font-size: 18px; border-bottom: 1px solid #eee; padding-bottom: 4px; }
h4 { margin: 16px 0 6px; font-size: 14px; }
.headline { font-weight: 600; font-size: 15px; }
.chart { width: 100%; min-height: 260px; margin: 8px 0; }
.table { overflow-x: auto; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #eee; padding: 3px 8px; text-align: left;
         vertical-align: top; white-space: nowrap; }
td.long { white-space: normal; min-width: 240px; max-width: 520px; overflow-wrap: anywhere; }
th { background: #f3f3f3; font-weight: 600; }
th.key { background: none; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
ol.paragraphs li { margin: 0 0 10px; }
.notes { color: #8a6d00; font-size: 13px; }
.aside { color: #666; font-size: 12px; }
footer { color: #666; font-size: 12px; padding: 0 32px 24px; }
"""


# ------------------------------------------------------------------------------ writing


def check_output(out: str | Path) -> Path:
    """The report's path, checked before any work: its folder exists and it is not a folder
    itself; else an error naming it."""
    path = Path(out)
    if path.is_dir():
        raise XpuprofError(f"{path}: is a directory; give the report's file name (e.g. "
                           f"{path / 'report.html'})")  # fmt: skip
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise XpuprofError(f"{path}: cannot write the report: {parent} {what}")
    return path


def write_atomic(path: Path, text: str) -> int:
    """Write ``text`` to ``path`` through a temporary file in the same folder and
    ``os.replace``: the file is whole or absent, never half written. Its size in bytes."""
    data = text.encode("utf-8")
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".",
                                   prefix=f".{path.name}.", suffix=".tmp")  # fmt: skip
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise XpuprofError(f"{path}: cannot write the report ({e.strerror or e})") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return len(data)


def write_report(trace: Trace, out: str | Path, *, ranks: Iterable[int] | None = None,
                 steps: StepSelection = None, predict: bool = False) -> dict[str, Any]:  # fmt: skip
    """Write the report of ``trace`` (:func:`build`) to ``out``, atomically. Returns
    ``{"path", "bytes", "sections", "left_out"}``. A bad path (no such folder, a folder) is an
    :class:`XpuprofError` naming it, raised before any tool runs."""
    path = check_output(out)
    rep = build(trace, ranks=ranks, steps=steps, predict=predict)
    size = write_atomic(path, rep.html)
    return {"path": str(path.resolve()), "bytes": size, "sections": rep.sections,
            "left_out": rep.left_out}  # fmt: skip

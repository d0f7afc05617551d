"""A tool's Result as the web page shows it: every table's cells formatted by the terminal's
rules (:class:`xpuprof.ui.render.Column`: units from column names and the presentation, the
time columns of a table in one unit, timestamps in ms from the trace's first event, C++ names
short), each cell
next to its raw value as JSON text — the value the CLI's ``--json`` prints, exactly (the
browser would round integers past 2**53, such as timestamps in ns, if it parsed them).

Nothing is computed here that the terminal does not show; no table is known by name.
"""

from __future__ import annotations

import json
import math
from typing import Any

from xpuprof.core.result import Presentation, Result, Table, records
from xpuprof.ui.render import Column, same_units
from xpuprof.ui.text import merge_notes


def _columns(table: Table, rows: list[dict[str, Any]]) -> list[str]:
    if not isinstance(table, list):
        return [str(c) for c in table.columns]
    cols: dict[str, None] = {}
    for row in rows:
        cols.update(dict.fromkeys(row))
    return list(cols)


def _origin(res: Result) -> int | None:
    start = res.facts.get("trace_start_ns")
    return int(start) if isinstance(start, (int, float)) and start == start else None


def _raw(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "null"  # as JSON has it (the --json document's NaN is null too)
    return json.dumps(value, default=str)


def _paragraph(lines: tuple[str, ...], rec: dict[str, Any]) -> list[str]:
    """The presentation's line templates over one record (the terminal's paragraphs)."""
    out = []
    for line in lines:
        try:
            out.append(line.format(**rec))
        except (KeyError, ValueError, TypeError, IndexError):  # a missing value: said plainly
            out.append(" ".join(f"{k}: {rec.get(k)}" for k in _fields(line)))
    return out or [str(rec)]


def _fields(line: str) -> list[str]:
    import string

    return [f.split(".")[0].split("[")[0] for _, f, _, _ in string.Formatter().parse(line) if f]


def table_view(name: str, table: Table, p: Presentation, origin: int | None) -> dict[str, Any]:
    """One table for the page: title, layout, columns (name, header with its unit, numeric,
    blank), each row's cells as text (``text``) and as the JSON of the raw value (``raw``)."""
    rows = records(table)
    cols = _columns(table, rows)
    units = dict(p.units)
    # names short as in the terminal (C++ template arguments and parameter lists elided): a
    # kernel's demangled name is often hundreds of characters; the page keeps the whole one
    # as the cell's tooltip (from ``raw``) and the filter matches it too
    spec = [Column(c, [r.get(c) for r in rows], units.get(c), origin) for c in cols]
    same_units(spec)
    view: dict[str, Any] = {
        "name": name,
        "title": p.title or name.replace("_", " "),
        "layout": p.layout,
        "label": p.label,
        "columns": [
            {
                "name": c.name,
                "header": c.header,
                "numeric": c.numeric,
                "measure": c.measure,
                "blank": c.blank,
                "stamp": c.stamp,
            }
            for c in spec
        ],  # fmt: skip
        "text": [[c.format(r.get(c.name)) for c in spec] for r in rows],
        "raw": [[_raw(r.get(c)) for c in cols] for r in rows],
        "rows": len(rows),
    }
    if any(c.stamp for c in spec):
        view["title"] += " (times from the trace's first event)"
    if p.layout == "paragraphs":
        view["paragraphs"] = [_paragraph(p.lines, r) for r in rows]
    return view


def result_view(res: Result) -> dict[str, Any]:
    """The headline, every table (:func:`table_view`, in the Result's order) and the notes
    (numbered notes that say the same merged, as the terminal does)."""
    origin = _origin(res)
    headline = res.facts.get("headline")
    return {
        "headline": headline if isinstance(headline, str) else None,
        "tables": [
            table_view(name, table, res.present.get(name, Presentation()), origin)
            for name, table in res.tables.items()
        ],  # fmt: skip
        "notes": merge_notes(list(res.notes)),
    }

"""Terminal rendering: a tool's Result as Rich tables, numbered paragraphs and notes, or one JSON
document; and the import's progress bar.

Everything here is driven by the Result's presentation hints and by the units in column names,
never by which tool or table it is: a column whose name has the token ``ns``, ``us`` or ``ms``
holds times and is shown in one unit per column (ns, µs, ms or s, chosen by its largest value);
``bytes`` in B, KB, MB or GB; ``fraction``, ``ratio`` and ``utilization`` as percentages;
``pct`` and ``percentage`` already are. The unit moves into the header: ``idle_ns`` is shown
as ``idle (ms)``. A presentation may declare the unit of a column whose name does not carry one
(``units``); rates in ``B/s`` are shown in B/s … TB/s.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from xpuprof.core.result import Presentation, Result, Table

#: Text columns with a longer value keep one line per row, cut short; shorter ones wrap.
WRAP_MAX = 100

#: Transposed tables fall back to records beyond this many records (columns get too narrow).
TRANSPOSE_MAX = 8

_TIME = {"ns": 1.0, "us": 1e3, "ms": 1e6}
_TIME_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "µs"), (1.0, "ns"))
_BYTE_UNITS = ((1 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "KB"), (1, "B"))
_RATE_UNITS = ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "KB/s"), (1.0, "B/s"))
_SHARE = {"fraction", "ratio", "utilization"}
_PERCENT = {"pct", "percentage"}


def print_json(doc: Any) -> None:
    """One JSON document on stdout (what every ``--json`` prints)."""
    sys.stdout.write(json.dumps(doc, indent=1, default=str) + "\n")


def human_bytes(n: float) -> str:
    """``1536`` → ``1.5 KB``."""
    for size, unit in _BYTE_UNITS:
        if abs(n) >= size or unit == "B":
            return f"{n:.0f} B" if unit == "B" else f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


# ------------------------------------------------------------------------------ cells


def _missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return bool(v != v)  # true for NaN only
    except TypeError:  # pandas' NA has no truth value
        return True
    except ValueError:  # an array: a value
        return False


def _number(v: float) -> str:
    return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"


def _plain(v: Any) -> str:
    if _missing(v):
        return "-"
    if isinstance(v, bool) or type(v).__name__ in ("bool_", "bool"):
        return "yes" if v else "no"
    if isinstance(v, float):
        return _number(v)
    if isinstance(v, int) or type(v).__name__.startswith(("int", "uint")):
        return f"{int(v):,}"
    return str(v)


class Column:
    """How one column is shown: its header and a formatter, from its name and values."""

    def __init__(self, name: str, values: list[Any], unit: str | None = None) -> None:
        self.name = name
        tokens = name.split("_")
        if unit == "%":
            tokens.append("pct")
        elif unit in (*_TIME, "bytes"):
            tokens.append(unit)
        nums = [float(v) for v in values if _is_number(v)]
        self.numeric = bool(nums) and len(nums) == sum(not _missing(v) for v in values)
        self.scale, self.unit = 1.0, ""
        self.format: Callable[[Any], str] = _plain
        unit_words = {*_TIME, *_PERCENT, "bytes", "fraction", "ratio"}
        label = " ".join(t for t in tokens if t not in unit_words) or name.replace("_", " ")
        top = max((abs(x) for x in nums if not math.isnan(x)), default=0.0)
        unit_token = next((t for t in tokens if t in _TIME), None)
        if self.numeric and unit_token:
            base = _TIME[unit_token]
            self.scale, self.unit = next((s, u) for s, u in _TIME_UNITS if top * base >= s
                                         or u == "ns")  # fmt: skip
            self.scale /= base
            self.format = self._scaled
        elif self.numeric and unit == "B/s":
            self.scale, self.unit = next((s, u) for s, u in _RATE_UNITS if top >= s
                                         or u == "B/s")  # fmt: skip
            self.format = self._scaled
        elif self.numeric and "bytes" in tokens:
            self.scale, self.unit = next((float(s), u) for s, u in _BYTE_UNITS if top >= s
                                         or u == "B")  # fmt: skip
            self.format = self._scaled
        elif self.numeric and _SHARE & set(tokens):
            self.scale, self.unit = 0.01, "%"
            self.format = self._scaled
        elif self.numeric and _PERCENT & set(tokens):
            self.unit = "%"
            self.format = self._scaled
        self.label = label if self.unit else name.replace("_", " ")
        self.header = f"{label} ({self.unit})" if self.unit else self.label
        #: nothing to show: every value missing, or every measure (a number with a unit) 0
        self.blank = all(_missing(v) for v in values) or bool(self.unit and top == 0)

    def _scaled(self, v: Any) -> str:
        if _missing(v):
            return "-"
        x = float(v) / self.scale
        if self.unit == "%":  # a share reads best with a fixed, short precision
            return "0" if x == 0 else f"{x:.1f}" if abs(x) >= 1 else f"{x:.2f}"
        return _number(x)


def _is_number(v: Any) -> bool:
    if isinstance(v, bool) or _missing(v):
        return False
    return isinstance(v, (int, float)) or type(v).__name__.startswith(("int", "uint", "float"))


def _columns_rows(table: Table, limit: int | None) -> tuple[list[str], list[list[Any]], int]:
    """(columns, first ``limit`` rows, number of rows) of a DataFrame or a list of dicts."""
    if isinstance(table, list):
        cols: dict[str, None] = {}
        for row in table:
            cols.update(dict.fromkeys(row))
        shown = table if limit is None else table[:limit]
        return list(cols), [[r.get(c) for c in cols] for r in shown], len(table)
    df = table if limit is None else table.head(limit)
    rows = [list(r) for r in df.itertuples(index=False, name=None)]
    return [str(c) for c in table.columns], rows, len(table)


# ------------------------------------------------------------------------------ layouts


def _need(text: str, wraps: bool) -> int:
    """Width a cell needs: its longest word when it may wrap, else all of it."""
    return max((len(w) for w in text.split()), default=0) if wraps else len(text)


def _fit(natural: list[int], least: list[int], budget: int) -> list[int]:
    """Column widths within ``budget``: each column's natural width, narrowed one letter at a
    time where it has the most to spare, never below its least width."""
    widths = list(natural)
    excess = sum(widths) - budget
    while excess > 0:
        spare = [w - m for w, m in zip(widths, least, strict=True)]
        j = max(range(len(spare)), key=spare.__getitem__)
        if spare[j] <= 0:
            break
        widths[j] -= 1
        excess -= 1
    return widths


def _records(
    title: str, cols: list[str], rows: list[list[Any]], width: int,
    units: dict[str, str] | None = None,
) -> tuple[RichTable, list[str], list[str]]:  # fmt: skip
    """One row per record, fitted to the terminal's ``width``: numbers never wrap, headers
    and short texts wrap at spaces, long texts (kernel names) keep one line each, cut short.
    Left out, and returned to be named: columns empty in every row shown, or measures (times,
    bytes, shares) that are 0 in every row shown,
    and the rightmost columns when even the least widths do not fit (--json has them all).
    """
    units = units or {}
    spec = [Column(c, [r[i] for r in rows], units.get(c)) for i, c in enumerate(cols)]
    keep = [i for i, c in enumerate(spec) if not c.blank] or list(range(len(spec)))
    cells = {i: [spec[i].format(r[i]) for r in rows] for i in keep}
    # a column that repeats the one before it (same header, same cells) is shown once
    keep = [i for j, i in enumerate(keep) if not j or (spec[i].header, cells[i])
            != (spec[keep[j - 1]].header, cells[keep[j - 1]])]  # fmt: skip
    natural, least, long = {}, {}, {}
    for i in keep:
        widest = max(map(len, cells[i]), default=0)
        long[i] = not spec[i].numeric and widest > WRAP_MAX
        natural[i] = max(widest, len(spec[i].header))
        # numbers whole; a header word of up to 8 letters whole (longer ones fold); texts
        # down to 16 letters a line, long ones (kernel names) to 24 letters, cut short
        word = min(_need(spec[i].header, True), 8 if spec[i].numeric else 16)
        words = max((_need(v, True) for v in cells[i]), default=0)
        least[i] = max(word, widest if spec[i].numeric else min(words, 24 if long[i] else 16))
    # what cannot fit even at its least width is left out, from the right, and named
    narrow = []
    while len(keep) > 2 and sum(least[i] + 3 for i in keep) + 1 > width:
        narrow.insert(0, spec[keep.pop()].label)
    widths = _fit([natural[i] for i in keep], [least[i] for i in keep], width - 1 - 3 * len(keep))
    t = RichTable(title=escape(title), title_justify="left")
    for w, i in zip(widths, keep, strict=True):
        t.add_column(escape(spec[i].header), width=w, no_wrap=long[i],
                     justify="right" if spec[i].numeric else "left",
                     overflow="ellipsis" if long[i] else "fold")  # fmt: skip
    for r in range(len(rows)):
        t.add_row(*(escape(cells[i][r]) for i in keep))
    blank = [c.label for c in spec if c.blank]
    return t, blank, narrow


def _transposed(
    title: str, cols: list[str], rows: list[list[Any]], label: str | None, width: int,
    units: dict[str, str] | None = None,
) -> list[RichTable]:  # fmt: skip
    """One column per record, named by its ``label`` value ("rank 0"; "value" without one);
    records that do not fit the width side by side go on into further tables."""
    key = cols.index(label) if label in cols else None
    names = [f"{label} {_plain(r[key])}" if key is not None and not _missing(r[key])
             else "value" for r in rows]  # fmt: skip
    lines = []
    for i, c in enumerate(cols):
        if i != key:
            col = Column(c, [r[i] for r in rows], (units or {}).get(c))
            lines.append((col.header, [col.format(r[i]) for r in rows]))
    head = max((len(h) for h, _ in lines), default=0)
    need = max([len(n) for n in names] + [_need(v, True) for _, vals in lines for v in vals])
    per = max(1, (width - head - 4) // (need + 3))
    tables = []
    for start in range(0, len(rows), per):
        t = RichTable(title=escape(title) if not start else None, title_justify="left")
        t.add_column("", no_wrap=True)
        for n in names[start : start + per]:
            t.add_column(escape(n), justify="right", min_width=min(need, 24))
        for h, vals in lines:
            t.add_row(escape(h), *map(escape, vals[start : start + per]))
        tables.append(t)
    return tables


def _paragraphs(title: str, cols: list[str], rows: list[list[Any]],
                lines: tuple[str, ...]) -> RichTable:  # fmt: skip
    """Numbered paragraphs (a table cannot hold sentences legibly), each line a template of
    the presentation over the record, the first in bold; wrapped lines keep the indent."""
    grid = RichTable.grid(padding=(0, 1))
    grid.title = escape(title)
    grid.title_justify = "left"
    grid.title_style = "bold"
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(overflow="fold")  # a word wider than the terminal (a path) breaks, whole
    for i, r in enumerate(rows, 1):
        rec = dict(zip(cols, r, strict=True))
        text = [escape(line.format(**rec)) for line in lines] or [escape(str(rec))]
        grid.add_row(f"{i}.", "\n".join([f"[bold]{text[0]}[/]", *text[1:]]))
    return grid


def result(
    res: Result, out: Console, limit: int = 20, more: str = "--limit N or --json for all"
) -> None:
    """Print each table as its presentation says (empty tables are left out: the notes say
    why), then the notes. ``more``: how to see the rows a table leaves out."""
    for name, table in res.tables.items():
        p = res.present.get(name, Presentation())
        cols, rows, n = _columns_rows(table, None if p.all_rows else limit)
        if not n:
            continue
        title = p.title or name.replace("_", " ")
        blank: list[str] = []
        narrow: list[str] = []
        if p.layout == "paragraphs":
            out.print(_paragraphs(title, cols, rows, p.lines), highlight=False)
        elif p.layout == "transpose" and n <= TRANSPOSE_MAX:
            for t in _transposed(title, cols, rows, p.label, out.width, dict(p.units)):
                out.print(t)
        else:
            table, blank, narrow = _records(title, cols, rows, out.width, dict(p.units))
            out.print(table)
        if len(rows) < n:
            out.print(f"({n:,} rows, first {len(rows)} shown; {escape(more)})")
        if blank:
            out.print(f"(0 or empty in every row shown: {escape(', '.join(blank))})",
                      style="dim", highlight=False)  # fmt: skip
        if narrow:
            out.print(f"(too wide for this terminal: {escape(', '.join(narrow))}; --json "
                      "has every column)", style="dim", highlight=False)  # fmt: skip
    for note in res.notes:
        out.print(f"[yellow]note:[/] {escape(note)}", highlight=False)


# ------------------------------------------------------------------------------ progress


@contextmanager
def progress_bar(total: int, err: Console) -> Iterator[Callable[[int, int], None]]:
    """A transient bar on stderr; yields the ``progress(done, total)`` callback to pass on."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                   TransferSpeedColumn(), TimeRemainingColumn(), console=err,
                   transient=True)  # fmt: skip
    task = bar.add_task("importing", total=total)
    bar.start()
    try:
        yield lambda done, _total: bar.update(task, completed=done)
    finally:
        bar.stop()

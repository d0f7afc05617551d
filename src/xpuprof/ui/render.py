"""Terminal rendering: a tool's Result as Rich tables, key–value lists, numbered paragraphs and
notes, or one JSON document; and the import's progress bar.

Everything here is driven by the Result's presentation hints and by the units in column names,
never by which tool or table it is (``docs/cli.md`` has the rules in full):

- the headline (``facts["headline"]``) first, in bold;
- units from column names or the presentation's ``units``: times (``ns``/``us``/``ms`` tokens,
  ``dur``) in ns … s, timestamps (``ts``, ``*_ts``, unit ``ts``) in ms from the trace's first
  event (``facts["trace_start_ns"]``), ``bytes`` in B … GiB (binary, named so), rates in B/s …
  TB/s, ``flops`` in FLOP … PFLOP, ``flops_per_s`` in FLOP/s … PFLOP/s, shares (``fraction``,
  ``ratio``, ``utilization``, ``share``) and percentages (``pct``, ``percent``) in %. One unit
  per column, the largest in which its median is at least 1 (the time columns of a table share
  one when it suits them all); the unit goes into the header (``idle_ns`` → ``idle (ms)``);
- C++ names short (:func:`short_name`: template arguments and parameter lists elided);
- a table fits the terminal: columns equal in every row move into the title, empty ones are
  named once, header words are never broken, and what still does not fit is left out (details
  first, then measures, from the right) and named; a short table too wide for its columns is
  shown as a key–value list. ``wide`` shows every column and full names instead.
"""

from __future__ import annotations

import json
import math
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable
from rich.text import Text

from xpuprof.core.result import Presentation, Result, Table
from xpuprof.core.text import BYTE_UNITS, TIME_UNITS, human_bytes, human_time, number  # noqa: F401 - human_*: re-exported
from xpuprof.ui.text import merge_notes, ranges_text, short_name  # noqa: F401  (re-exported)

#: Text columns with a longer value keep one line per row, cut short; shorter ones wrap.
WRAP_MAX = 100

#: Transposed tables fall back to records beyond this many records (columns get too narrow).
TRANSPOSE_MAX = 8

#: A table of at most this many rows that does not fit as records is shown as a key–value list.
KEY_VALUE_MAX = 3

#: The largest number a table's time columns show in a unit they share.
UNIT_LIMIT = 10_000

_TIME = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
_RATE_UNITS = tuple((10.0 ** (3 * i), p + "B/s") for i, p in enumerate(("", "K", "M", "G", "T")))
_FLOP_UNITS = tuple((10.0 ** (3 * i), p + "FLOP") for i, p in enumerate(("", "K", "M", "G", "T",
                                                                          "P")))  # fmt: skip
_FLOPS_UNITS = tuple((s, u + "/s") for s, u in _FLOP_UNITS)
_SCALED = {
    "time": TIME_UNITS,
    "bytes": BYTE_UNITS,
    "B/s": _RATE_UNITS,
    "FLOP": _FLOP_UNITS,
    "FLOP/s": _FLOPS_UNITS,
}
_SHARE = {"fraction", "ratio", "utilization", "share"}
_PERCENT = {"pct", "percentage", "percent"}
#: Words that name a column's unit, left out of its label (the unit is in the header).
_UNIT_WORDS = {*_TIME, *_PERCENT, "bytes", "fraction", "ratio", "per"}
#: Name tokens that are units already applied to the values (shown as they are).
_NAMED = {"tflops": "TFLOP/s", "gbs": "GB/s", "gb": "GB"}
#: Unitless columns that count things: kept before other details when space is short.
COUNT_WORDS = set(
    "count calls events launches kernels steps segments allocations allocs frees "
    "collectives participants rows read".split()
)


def print_json(doc: Any) -> None:
    """One JSON document on stdout (what every ``--json`` prints)."""
    sys.stdout.write(json.dumps(doc, indent=1, default=str) + "\n")


def _unit(typical: float, top: float, units: tuple[tuple[float, str], ...]) -> tuple[float, str]:
    """The largest unit in which the ``typical`` value (the median) is at least 1, or a larger
    one when the ``top`` would need :data:`UNIT_LIMIT` ten times over in it."""
    i = next((i for i in range(len(units) - 1, -1, -1) if typical >= units[i][0]), 0)
    while i + 1 < len(units) and top / units[i][0] >= 10 * UNIT_LIMIT:
        i += 1
    return units[i]


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


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool) or type(v).__name__ in ("bool_", "bool")


def _plain(v: Any) -> str:
    if _missing(v):
        return "-"
    if _is_bool(v):
        return "yes" if v else "no"
    if isinstance(v, float):
        return number(v)
    if isinstance(v, int) or type(v).__name__.startswith(("int", "uint")):
        return f"{int(v):,}"
    return str(v)


def _is_number(v: Any) -> bool:
    if _is_bool(v) or _missing(v):
        return False
    return isinstance(v, (int, float)) or type(v).__name__.startswith(("int", "uint", "float"))


def is_timestamp(name: str, unit: str | None = None) -> bool:
    """Whether column ``name`` holds absolute timestamps (ns): unit ``ts``, or named ``ts``
    or ``…_ts`` (the schema's name for an event's start)."""
    return unit == "ts" or name == "ts" or name.endswith("_ts")


class Column:
    """How one column is shown: its header and a formatter, from its name, its presentation
    unit and its values. ``measure``: it has a unit (time, bytes, rate, FLOPs, share);
    ``origin``: the trace's first timestamp, for timestamp columns (None: shown as numbers);
    ``wide``: names in full."""

    def __init__(self, name: str, values: list[Any], unit: str | None = None,
                 origin: int | None = None, wide: bool = False) -> None:  # fmt: skip
        self.name, self.wide = name, wide
        tokens = name.split("_")
        nums = [float(v) for v in values if _is_number(v)]
        self.numeric = bool(nums) and len(nums) == sum(not _missing(v) for v in values)
        self.kind = self._kind(tokens, unit, origin) if self.numeric else None
        self.stamp, self.hex = self.kind == "ts", self.kind == "hex"
        self.shift = float(origin or 0) if self.stamp else 0.0
        self.base = 1.0  # what one unit of the values is worth in the kind's smallest unit
        if self.kind == "time":
            time_unit = next((t for t in tokens if t in _TIME), "ns")
            self.base = _TIME[unit if unit in _TIME else time_unit]
        #: the largest magnitude, in the kind's smallest unit (ns for times)
        sizes = sorted(abs(x - self.shift) for x in nums if not math.isnan(x))
        self.top = self.base * (sizes[-1] if sizes else 0.0)
        nonzero = [x for x in sizes if x]
        #: the median magnitude (of the values that are not 0), in the kind's smallest unit
        self.typical = self.base * (nonzero[len(nonzero) // 2] if nonzero else 0.0)
        self.scale, self.unit = 1.0, ""
        if self.kind in _SCALED:
            self.use(*_unit(self.typical, self.top, _SCALED[self.kind]))
        elif self.kind == "ts":  # instants: ms from the trace's first event (ns)
            self.scale, self.unit = 1e6, "ms"
        elif self.kind == "share":
            self.scale, self.unit = 0.01, "%"
        elif self.kind and self.kind != "hex":  # %, and units not scaled (FLOP/B, TFLOP/s…)
            self.unit = self.kind
        drop = _UNIT_WORDS | set(_NAMED) | ({"s"} if self.kind == "FLOP/s" else set())
        label = " ".join(t for t in tokens if t not in drop) or (
            "share" if self.kind in ("%", "share") else name.replace("_", " ")
        )
        self.label = label if self.unit else name.replace("_", " ")
        self.measure = bool(self.unit)
        self.count = not self.measure and self.numeric and bool(COUNT_WORDS & set(tokens))
        #: nothing to show: every value missing or empty, or every measure 0
        self.blank = all(_missing(v) or v == "" for v in values) or bool(
            self.measure and not self.stamp and self.top == 0
        )

    def use(self, scale: float, unit: str) -> None:
        """Show the values in ``unit``, worth ``scale`` of the kind's smallest unit."""
        self.scale, self.unit = scale / self.base, unit

    @property
    def header(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label

    @staticmethod
    def _kind(tokens: list[str], unit: str | None, origin: int | None) -> str | None:
        name = "_".join(tokens)
        if is_timestamp(name, unit):
            return "ts" if origin is not None else None
        if unit in _TIME or name == "dur" or (unit is None and _TIME.keys() - {"s"} & set(tokens)):
            return "time"
        if unit is not None:
            return unit
        named = next((_NAMED[t] for t in tokens if t in _NAMED), None)
        if named:
            return named
        if "bytes" in tokens:
            return "bytes"
        if "flops" in tokens:
            return "FLOP/s" if tokens[-2:] == ["per", "s"] else "FLOP"
        if _PERCENT & set(tokens):
            return "%"
        if _SHARE & set(tokens):
            return "share"
        return None

    def format(self, v: Any) -> str:
        if self.hex and _is_number(v):
            return f"0x{int(v):x}"
        if not self.unit:
            text = _plain(v)
            return text if self.wide or self.numeric else short_name(text)
        if _missing(v):
            return "-"
        x = (float(v) - self.shift) / self.scale
        if self.stamp:  # instants: to the microsecond, whatever the span
            return f"{x:,.3f}"
        if self.unit == "%":  # a share reads best with a fixed, short precision
            return "0" if x == 0 else f"{x:.1f}" if abs(x) >= 1 else f"{x:.2f}"
        return number(x)


def same_units(columns: list[Column]) -> None:
    """Give the time columns of one table one unit when one suits them all (the median of
    each at least 1 in it, its largest value under ten times :data:`UNIT_LIMIT`): ``2.5 s``
    beside ``800 ms`` reads as two kinds of number; ``2,500`` and ``800 ms`` do not."""
    times = [c for c in columns if c.kind == "time" and c.top > 0]
    for scale, unit in reversed(TIME_UNITS):
        if len(times) > 1 and all(c.typical >= scale and c.top / scale < 10 * UNIT_LIMIT
                                  for c in times):  # fmt: skip
            for c in times:
                c.use(scale, unit)
            return


# ------------------------------------------------------------------------------ tables


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


def _constant(table: Table, col: str) -> tuple[bool, Any]:
    """Whether ``col`` holds one value (not missing) in every row of the whole table."""
    try:
        if isinstance(table, list):
            values = {row.get(col) for row in table}
        else:
            values = set(table[col].drop_duplicates().tolist())
    except TypeError:  # unhashable values (lists): not a column to fold into a title
        return False, None
    if len(values) != 1:
        return False, None
    (value,) = values
    return not _missing(value), value


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


class Layout:
    """One table laid out for a terminal ``width``: its columns (:class:`Column`), the cells
    of the rows shown, the columns folded into the title (equal in every row), left out as
    empty, or left out for want of width, and each kept column's least and natural width."""

    def __init__(self, title: str, table: Table, cols: list[str], rows: list[list[Any]],
                 p: Presentation, width: int, origin: int | None, wide: bool,
                 fit: bool = True) -> None:  # fmt: skip
        units = dict(p.units)
        self.spec = [Column(c, [r[i] for r in rows], units.get(c), origin, wide)
                     for i, c in enumerate(cols)]  # fmt: skip
        same_units(self.spec)
        self.rows, self.width, self.wide = rows, width, wide
        self.blank = list(dict.fromkeys(c.label for c in self.spec if c.blank))
        keep = [i for i, c in enumerate(self.spec) if not c.blank] or list(range(len(cols)))
        self.cells = {i: [self.spec[i].format(r[i]) for r in rows] for i in keep}
        # a column that repeats the one before it (same header, same cells) is shown once
        keep = [i for j, i in enumerate(keep) if not j or (self.spec[i].header, self.cells[i])
                != (self.spec[keep[j - 1]].header, self.cells[keep[j - 1]])]  # fmt: skip
        self.folded: list[str] = []
        if not wide and len(table) > 1 and len(keep) > 1:
            self._fold(table, keep)
        self.title = title + (" — " + ", ".join(self.folded) if self.folded else "")
        if any(self.spec[i].stamp for i in keep):
            self.title += " (times from the trace's first event)"
        self.keep = keep
        self.natural, self.least, self.long = {}, {}, {}
        for i in keep:
            c, cells = self.spec[i], self.cells[i]
            widest = max(map(len, cells), default=0)
            self.long[i] = not c.numeric and widest > WRAP_MAX and not wide
            self.natural[i] = max(widest, len(c.header))
            # numbers whole, header words whole; texts down to 24 letters a line (names: a
            # fifth of the terminal, when that is more), cut short
            words = max((_need(v, True) for v in cells), default=0)
            text = max(24, width // 5) if c.name == "name" else 24
            least = widest if c.numeric or wide else min(words, text)
            self.least[i] = max(_need(c.header, True), least)
        self.narrow: list[str] = []
        if fit and not wide:
            self._leave_out()

    def fits(self) -> bool:
        return sum(self.least[i] + 3 for i in self.keep) + 1 <= self.width

    def _fold(self, table: Table, keep: list[int]) -> None:
        """Move columns that hold one value in every row of ``table`` into the title: texts,
        counts, and the numbers that key the rows (left of every measure and count)."""
        first = next((i for i in keep if self.spec[i].measure or self.spec[i].count), 10**9)
        for i in list(keep):
            c = self.spec[i]
            if c.measure or (c.numeric and not c.count and i > first) or len(keep) < 2:
                continue
            same, value = _constant(table, c.name)
            text = c.format(value) if same else ""
            if same and len(text) <= 24:
                self.folded.append(f"{c.label} {text}")
                keep.remove(i)

    def _tier(self, j: int) -> int:
        """What to leave out first: 0 details, 1 texts that vary, 2 counts and measures, 3 the
        table's keys: its name column (``name``, else its most varied text), its leftmost
        number when no text or measure comes before it (rank, step), and, in a table with no
        ``name`` column, a text left of every count and measure that tells apart rows those
        two do not (a participant's two rows, one per collective type, told apart by the
        type; a kernel's launch configurations stay details beside its name)."""
        i = self.keep[j]
        c = self.spec[i]
        texts = [k for k in self.keep if not self.spec[k].numeric]
        named = [k for k in texts if self.spec[k].name == "name"]
        name = (
            (named or [max(texts, key=lambda k: (len(set(self.cells[k])), -k))])[0]
            if (texts)
            else None
        )
        if i == name or (j == 0 and c.numeric and not c.measure):
            return 3
        first = next((k for k in self.keep if self.spec[k].measure or self.spec[k].count),
                     len(self.spec))  # fmt: skip
        if name is not None and not named and i < first and not c.numeric:
            lead = self.keep[0]
            keys = [name] + ([lead] if self.spec[lead].numeric and not self.spec[lead].measure
                             else [])  # fmt: skip
            rows = list(zip(*(self.cells[k] for k in keys), strict=True))
            if len(set(rows)) < len(set(zip(rows, self.cells[i], strict=True))):
                return 3
        if c.measure or c.count:
            return 2
        return 1 if not c.numeric and len(set(self.cells[i])) > 1 else 0

    def _leave_out(self) -> None:
        while len(self.keep) > 2 and not self.fits():
            j = min(range(len(self.keep)), key=lambda j: (self._tier(j), -j))
            c = self.spec[self.keep.pop(j)]
            # two columns of one label (a time and a share of it): named with their units
            twin = sum(s.label == c.label for s in self.spec) > 1
            self.narrow.insert(0, c.header if twin else c.label)

    def table(self) -> RichTable:
        """The Rich table, its columns narrowed to the width where they have room to spare."""
        keep = self.keep
        budget = self.width - 1 - 3 * len(keep)
        natural = [self.natural[i] for i in keep]
        widths = natural if self.wide else _fit(natural, [self.least[i] for i in keep], budget)
        t = RichTable()
        for w, i in zip(widths, keep, strict=True):
            c = self.spec[i]
            t.add_column(escape(c.header), width=w, no_wrap=self.long[i] or self.wide,
                         justify="right" if c.numeric else "left",
                         overflow="fold" if c.numeric else "ellipsis")  # fmt: skip
        cut = {i: w for w, i in zip(widths, keep, strict=True)
               if not self.wide and not self.spec[i].numeric}  # fmt: skip
        for r in range(len(self.rows)):
            t.add_row(*(escape(_middle(self.cells[i][r], cut[i]) if i in cut else self.cells[i][r])
                        for i in keep))  # fmt: skip
        return t

    def key_values(self, label: str | None) -> list[RichTable]:
        """The same records as key–value lists (one column per record)."""
        cols = [self.spec[i].name for i in self.keep]
        rows = [[r[i] for i in self.keep] for r in self.rows]
        units = {self.spec[i].name: self.spec[i] for i in self.keep}
        return _transposed(cols, rows, label, self.width, units)


def _middle(text: str, width: int) -> str:
    """``text`` cut to ``width`` in the middle: names that differ only at their end (an op and
    its ``_backward``, ``worker0_…`` and ``worker1_…`` files) stay apart, as the end of a name
    is what tells them apart more often than its middle."""
    if len(text) <= width or width < 8 or "\n" in text:
        return text
    tail = (width - 1) * 2 // 5
    return text[: width - 1 - tail] + "…" + text[len(text) - tail :]


def _transposed(cols: list[str], rows: list[list[Any]], label: str | None, width: int,
                spec: dict[str, Column]) -> list[RichTable]:  # fmt: skip
    """One column per record, named by its ``label`` value ("rank 0"; "value" without one);
    records that do not fit the width side by side go on into further tables."""
    key = cols.index(label) if label in cols else None
    names = [f"{label} {_plain(r[key])}" if key is not None and not _missing(r[key])
             else "value" for r in rows]  # fmt: skip
    lines = []
    for i, c in enumerate(cols):
        if i != key:
            lines.append((spec[c].header, [spec[c].format(r[i]) for r in rows]))
    head = max((len(h) for h, _ in lines), default=0)
    need = max([len(n) for n in names] + [_need(v, True) for _, vals in lines for v in vals])
    per = max(1, (width - head - 4) // (need + 3))
    tables = []
    for start in range(0, len(rows), per):
        t = RichTable()
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


def _show(out: Console, item: Any, wide: bool) -> None:
    """Print ``item``; with ``wide``, at its natural width even past the terminal's."""
    if not wide:
        out.print(item)
        return
    need = out.measure(item, options=out.options.update_width(10**5)).maximum
    old = out.width
    out.width = max(old, need)
    try:
        out.print(item)
    finally:
        out.width = old


def _origin(res: Result) -> int | None:
    start = res.facts.get("trace_start_ns")
    return int(start) if isinstance(start, (int, float)) and not _missing(start) else None


# a space between a number and its unit ("283.9 ms", "15 %", "3.2 GiB"): where a line may not
# break, or the unit starts the next line alone
_UNITS = "|".join(re.escape(u) for _, u in (*TIME_UNITS, *BYTE_UNITS, (0, "GB"), (0, "MB")))
_UNIT_GAP = re.compile(rf"(?<=\d) (?=(?:{_UNITS}|%)(?!\w))")


def _prose(text: str, width: int) -> str:
    """``text`` cut into lines of at most ``width`` (Rich's own wrapping may cut "283.9 ms"
    between the number and its unit)."""
    glued = _UNIT_GAP.sub("\u00a0", text)  # textwrap breaks at ASCII whitespace only
    lines = textwrap.wrap(glued, width=max(20, width), break_long_words=False,
                          break_on_hyphens=False)  # fmt: skip
    return "\n".join(lines).replace("\u00a0", " ")


def result(res: Result, out: Console, limit: int = 20,
           more: str = "--limit N or --json for all", wide: bool = False) -> None:  # fmt: skip
    """Print the headline, each table as its presentation says (empty tables are left out:
    the notes say why), then the notes. ``more``: how to see the rows a table leaves out;
    ``wide``: every column and full names, past the terminal's width if need be."""
    headline = res.facts.get("headline")
    if isinstance(headline, str) and headline:
        text = _prose(headline, out.width - 1)
        out.print(f"[bold]{escape(text)}[/]", highlight=False, soft_wrap=True)
    for name, table in res.tables.items():
        p = res.present.get(name, Presentation())
        cols, rows, n = _columns_rows(table, None if p.all_rows else limit)
        if not n:
            continue
        title = p.title or name.replace("_", " ")
        if p.layout == "paragraphs":
            out.print(_paragraphs(title, cols, rows, p.lines), highlight=False)
            _rows_line(out, len(rows), n, more)
            continue
        lay = Layout(title, table, cols, rows, p, out.width, _origin(res), wide)
        out.print(Text(lay.title, style="table.title"))
        transpose = p.layout == "transpose" and n <= TRANSPOSE_MAX
        if transpose or (not wide and n <= KEY_VALUE_MAX and lay.narrow):
            full = Layout(title, table, cols, rows, p, out.width, _origin(res), wide, fit=False)
            label = p.label or next((full.spec[i].name for i in full.keep
                                     if not full.spec[i].measure), None)  # fmt: skip
            for t in full.key_values(label if _unique(rows, cols, label) else None):
                _show(out, t, wide)
            lay.narrow = []
        else:
            _show(out, lay.table(), wide)
        _rows_line(out, len(rows), n, more)
        if lay.blank:
            out.print(f"(0 or empty in every row shown: {escape(', '.join(lay.blank))})",
                      style="dim", highlight=False)  # fmt: skip
        if lay.narrow:
            left_out = escape(", ".join(lay.narrow))
            out.print(f"(columns left out to fit this terminal: {left_out}; --wide or --json "
                      "has every column)", style="dim", highlight=False)  # fmt: skip
    for note in merge_notes(res.notes):
        text = _prose("note: " + note, out.width - 1)[len("note: ") :]
        out.print(f"[yellow]note:[/] {escape(text)}", highlight=False, soft_wrap=True)
    if not (headline or res.notes or any(len(t) for t in res.tables.values())):
        out.print("(nothing to show: no rows and no notes)", highlight=False)


def _unique(rows: list[list[Any]], cols: list[str], label: str | None) -> bool:
    if label not in cols:
        return False
    values = [_plain(r[cols.index(label)]) for r in rows]
    return len(set(values)) == len(values)


def _rows_line(out: Console, shown: int, n: int, more: str) -> None:
    if shown < n:
        out.print(f"({n:,} rows, first {shown} shown; {escape(more)})", highlight=False)


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

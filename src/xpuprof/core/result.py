"""What every tool returns: named tables, the notes a user must read with them, typed facts,
and hints on how to show each table.

A tool never prints; renderers (``ui/``) turn a ``Result`` into a terminal table, JSON, a web page
or a report. ``to_dict`` is the JSON form every ``--json`` prints. This module imports nothing
heavy: a table is a pandas DataFrame, or a list of row dicts for the few tools that answer
without pandas (``info`` reads only the store's manifest, and must stay instant).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Union

if TYPE_CHECKING:
    import pandas as pd

#: A table: a DataFrame, or rows as dicts (column order: first appearance).
Table = Union["pd.DataFrame", list[dict[str, Any]]]

#: A fact's value: a typed scalar other code may branch on (never parse a note's text).
Fact = bool | int | float | str | None

#: How a renderer lays a table out: ``records`` (one row per record, the default),
#: ``transpose`` (one column per record, for a few wide records such as a per-rank summary) or
#: ``paragraphs`` (one numbered paragraph per record, for rows that hold sentences).
Layout = Literal["records", "transpose", "paragraphs"]


@dataclass(frozen=True)
class Presentation:
    """How to show one table. Hints only: every layout shows the same data.

    ``title``: the heading (default: the table's name). ``all_rows``: short and essential,
    shown whole whatever the row limit. ``label``: for ``transpose``, the column whose values
    name the output columns (``rank`` → "rank 0", "rank 1"). ``lines``: for ``paragraphs``,
    ``str.format`` templates over a row's columns, one per line, the first the paragraph's
    heading (e.g. ``("{recommendation}", "saves up to {saved_ms_per_step:.2f} ms")``).
    ``units``: (column, unit) pairs for columns whose names do not say their unit: ``ns``,
    ``us``, ``ms``, ``bytes``, ``B/s`` or ``%``."""

    layout: Layout = "records"
    title: str | None = None
    all_rows: bool = False
    label: str | None = None
    lines: tuple[str, ...] = ()
    units: tuple[tuple[str, str], ...] = ()


@dataclass
class Result:
    """A tool's tables plus the notes a user must read with them: what could not be computed
    and why (no device events, no steps, no shapes…), never a silently wrong number.

    ``facts``: typed scalars the tool states (documented per tool), for code that branches on
    them. ``present``: per table name, how to show it (tables without an entry are records)."""

    tables: dict[str, Table] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    facts: dict[str, Fact] = field(default_factory=dict)
    present: dict[str, Presentation] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Table:
        return self.tables[name]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: missing values (NaN, NA) become None."""
        return {
            "tables": {k: records(v) for k, v in self.tables.items()},
            "notes": self.notes,
            "facts": self.facts,
            "present": {k: asdict(p) for k, p in self.present.items()},
        }


def records(table: Table) -> list[dict[str, Any]]:
    """A table as JSON-able row dicts (NaN and NA as None, times as ISO text)."""
    if isinstance(table, list):
        return [{k: _plain(v) for k, v in row.items()} for row in table]
    import json

    return json.loads(table.to_json(orient="records", date_format="iso"))


def _plain(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return None
    return v

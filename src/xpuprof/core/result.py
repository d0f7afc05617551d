"""What every tool returns: named tables plus the notes a user must read with them.

A tool never prints; renderers (``ui/``) turn a ``Result`` into a terminal table, JSON, a web page
or a report. ``to_dict`` is the JSON form every ``--json`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class Result:
    """A tool's tables plus the notes a user must read with them: what could not be computed
    and why (no device events, no steps, no shapes…), never a silently wrong number."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: missing values (NaN, NA) become None."""
        import json

        return {
            "tables": {
                k: json.loads(v.to_json(orient="records", date_format="iso"))
                for k, v in self.tables.items()
            },
            "notes": self.notes,
        }

"""What every reader hands to the normaliser (``trace/normalize/``): raw columns in source
order, split by kind of entry, in one schema whatever the source format.

Kineto JSON and XPlane differ in almost everything, but once their entries are columns of
(phase, category, name, pid, tid, ts, dur, args, …) one normaliser derives levels, nesting,
steps and links for both, and every later stage sees one data model. The ``Reader`` that
produces a ``RawTrace`` is declared in ``xpuprof.formats`` (it must import without pyarrow);
what a reader must fill in is in ``docs/formats.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pyarrow as pa


@dataclass
class Dropped:
    """One piece of a file that a lenient import could not keep: why, how many entries of the
    event list it held (0 for text between entries, or a top-level key), where it starts in
    the (decompressed) text, the position in the event list of its first entry, and for damage
    to the file itself (gzip) the byte of the file where it was detected."""

    reason: str
    events: int
    offset: int | None = None
    event_index: int | None = None
    file_offset: int | None = None


@dataclass
class RawTrace:
    """Raw columns of one source file, split by kind of entry (``KINDS``), plus file facts.

    ``top`` holds the source's file-level facts (Kineto's top-level keys; an XPlane's hosts and
    planes), ``string_ids`` the map of negative pid/tid codes back to the names they replace.
    ``format`` names the reader that read it (``xpuprof.formats``); the normaliser takes the
    category vocabulary from that reader. ``notes`` are what the import report must say about
    entries kept as they are but not as the format means them (a negative ``dur``).
    """

    path: str
    tables: dict[str, pa.Table]
    read_phase: dict[str, int]
    read_category: dict[str, int]
    top: dict[str, Any]
    string_ids: dict[str, dict[str, str]]
    size: int
    sha256: str
    compressed: bool
    dropped: list[Dropped] = field(default_factory=list)
    truncated: bool = False
    format: str = "kineto"
    notes: list[str] = field(default_factory=list)


#: How entries are split as they are read: by phase, into the tables they will feed.
KINDS = ("events", "flows", "counters", "metadata")

DICT_STRING = pa.dictionary(pa.int32(), pa.string())

#: Columns of every raw table. Times are int64 ns; ``args``/``extra`` JSON object text;
#: ``correlation``..``bytes_arg`` are the few args lifted into typed columns.
RAW_SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("ph", DICT_STRING),
        ("cat", DICT_STRING),
        ("name", DICT_STRING),
        ("pid", pa.int64()),
        ("tid", pa.int64()),
        ("ts", pa.int64()),
        ("dur", pa.int64()),
        ("flow_id", pa.string()),
        ("bp", DICT_STRING),
        ("scope", DICT_STRING),
        ("args", pa.large_string()),
        ("extra", pa.large_string()),
        ("correlation", pa.int64()),
        ("external_id", pa.int64()),
        ("device_arg", pa.int64()),
        ("stream_arg", pa.int64()),
        ("bytes_arg", pa.float64()),
    ]
)


def empty_tables() -> dict[str, pa.Table]:
    """One empty raw table per kind."""
    return {k: RAW_SCHEMA.empty_table() for k in KINDS}


def concat_tables(parts: list[dict[str, pa.Table]]) -> dict[str, pa.Table]:
    """Join raw tables of several sources of one capture (profiler events, annotations,
    layer spans, telemetry) kind by kind; their ``index`` ranges must not overlap."""
    out = {}
    for k in KINDS:
        tables = [p[k] for p in parts if k in p and p[k].num_rows]
        out[k] = pa.concat_tables(tables) if tables else RAW_SCHEMA.empty_table()
    return out


def count_entries(tables: dict[str, pa.Table]) -> tuple[dict[str, int], dict[str, int]]:
    """Entries per phase and per category ("" for none), as the manifest records them."""
    import pyarrow.compute as pc

    phase: dict[str, int] = {}
    cat: dict[str, int] = {}
    for t in tables.values():
        for counts, col in ((phase, t["ph"]), (cat, t["cat"])):
            for row in pc.value_counts(col).to_pylist():
                key = "" if row["values"] is None else row["values"]
                counts[key] = counts.get(key, 0) + row["counts"]
    return phase, cat


def next_index(tables: dict[str, pa.Table]) -> int:
    """The first ``index`` after every entry of these tables."""
    import pyarrow.compute as pc

    highest = [pc.max(t["index"]).as_py() for t in tables.values() if t.num_rows]
    return max(highest) + 1 if highest else 0


def _keep_huge_floats(text: str) -> Any:
    f = float(text)
    return f if math.isfinite(f) else text


#: Any JSON value, floats beyond float64 (``1e400``, which a source may write and the importer
#: keeps) left as their text instead of failing the whole decode.
_JSON = msgspec.json.Decoder(float_hook=_keep_huge_floats)


def decode_json(text: str | bytes | None, default: Any = None) -> Any:
    """A source's JSON text kept in a store (``args``, ``extra``) as Python values, or
    ``default`` when there is none or it cannot be decoded here (nesting deeper than the
    interpreter allows, text that is not JSON). The one decoder every stage uses on such text:
    a value it cannot hold is unknown, never an exception in an analysis."""
    if not text:
        return default
    try:
        return _JSON.decode(text)
    except (msgspec.MsgspecError, RecursionError):
        return default

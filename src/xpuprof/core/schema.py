"""The normalized trace schema: the contract between capture, formats, the store and analysis.

Every source (Kineto / Chrome-trace JSON, XPlane, a live capture, a plug-in reader) is
normalised into these tables and nothing else, so an analysis written against them works on
every source. The full description, with the meaning of
each column and how each source maps onto it, is in ``docs/schema.md``; keep the two in step.

Conventions that hold for every table:

* times are int64 **nanoseconds** (``ts``, ``dur``), converted from the source's text without a
  float round trip, so nanosecond decimals in Kineto's microsecond timestamps survive;
* ``index`` is the entry's position in the source file's event list, and together with ``part``
  (one part per imported source file) it identifies the raw entry, so every raw entry can be
  accounted for and its original fields read back;
* ``id`` of an event is ``part << 40 | index`` and is unique in a store;
* ``args`` holds the source's own argument object as its original JSON text (lossless: integers
  beyond 2**63, key order and float spelling survive), ``extra`` the entry's remaining unknown
  top-level keys as a JSON object, or null.

This module imports only ``xpuprof.core.names`` from the package on purpose: it sits below every
stage.
"""

from __future__ import annotations

import pyarrow as pa

from xpuprof.core.names import ID_SHIFT, LEVELS, TABLES

__all__ = ["ID_SHIFT", "LEVELS", "TABLES", "SCHEMAS", "event_id"]

_dict_str = pa.dictionary(pa.int32(), pa.string())

EVENTS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("part", pa.int32(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),
        pa.field("rank", pa.int32()),
        pa.field("host", _dict_str),
        pa.field("phase", _dict_str, nullable=False),
        pa.field("scope", _dict_str),
        pa.field("pid", pa.int64()),
        pa.field("tid", pa.int64()),
        pa.field("device", pa.int32(), nullable=False),
        pa.field("stream", pa.int64()),
        pa.field("level", _dict_str, nullable=False),
        pa.field("category", _dict_str),
        pa.field("name", _dict_str),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("dur", pa.int64()),
        pa.field("parent", pa.int64()),
        pa.field("depth", pa.int32()),
        pa.field("correlation", pa.int64()),
        pa.field("external_id", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("flops", pa.float64()),
        pa.field("bytes", pa.float64()),
        pa.field("args", pa.large_string()),
        pa.field("extra", pa.large_string()),
    ]
)

FLOWS = pa.schema(
    [
        pa.field("part", pa.int32(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),
        pa.field("rank", pa.int32()),
        pa.field("phase", _dict_str, nullable=False),
        pa.field("category", _dict_str),
        pa.field("name", _dict_str),
        pa.field("flow_id", pa.string()),
        pa.field("pid", pa.int64()),
        pa.field("tid", pa.int64()),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("bp", pa.string()),
        pa.field("event", pa.int64()),
        pa.field("args", pa.large_string()),
        pa.field("extra", pa.large_string()),
    ]
)

LINKS = pa.schema(
    [
        pa.field("part", pa.int32(), nullable=False),
        pa.field("rank", pa.int32()),
        pa.field("kind", _dict_str),
        pa.field("flow_id", pa.string()),
        pa.field("src", pa.int64()),
        pa.field("dst", pa.int64()),
        pa.field("src_index", pa.int64(), nullable=False),
        pa.field("dst_index", pa.int64(), nullable=False),
    ]
)

COUNTERS = pa.schema(
    [
        pa.field("part", pa.int32(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),
        pa.field("rank", pa.int32()),
        pa.field("pid", pa.int64()),
        pa.field("tid", pa.int64()),
        pa.field("category", _dict_str),
        pa.field("name", _dict_str),
        pa.field("series", _dict_str),
        pa.field("ts", pa.int64(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("args", pa.large_string()),
        pa.field("extra", pa.large_string()),
    ]
)

METADATA = pa.schema(
    [
        pa.field("part", pa.int32(), nullable=False),
        pa.field("index", pa.int64(), nullable=False),
        pa.field("rank", pa.int32()),
        pa.field("category", _dict_str),
        pa.field("name", _dict_str),
        pa.field("pid", pa.int64()),
        pa.field("tid", pa.int64()),
        pa.field("ts", pa.int64()),
        pa.field("args", pa.large_string()),
        pa.field("extra", pa.large_string()),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "events": EVENTS,
    "flows": FLOWS,
    "links": LINKS,
    "counters": COUNTERS,
    "metadata": METADATA,
}


def event_id(part: int, index: int) -> int:
    """Compose a store-wide event id; ids sort by source file, then by position in it."""
    return (part << ID_SHIFT) | index

"""Names shared by every stage (levels, tables), kept free of imports so that reading a
manifest or printing ``info`` never pays for pyarrow."""

from __future__ import annotations

#: Across-stack levels, outermost first. Unknown categories become ``other``; nothing is dropped.
LEVELS: tuple[str, ...] = (
    "step",
    "layer",
    "op",
    "runtime",
    "kernel",
    "memcpy",
    "memset",
    "collective",
    "annotation",
    "python",
    "other",
)

#: Tables of a store, in the order ``info`` lists them.
TABLES: tuple[str, ...] = ("events", "flows", "links", "counters", "metadata")

#: Bits of an event id that hold the source index; the part number sits above them.
ID_SHIFT = 40

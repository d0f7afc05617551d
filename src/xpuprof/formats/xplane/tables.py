"""Raw tables out of the XPlane decoder: each plane's event columns (numpy) and the naming
rows become Arrow tables in ``core.raw.RAW_SCHEMA``, metadata rows first, then events in file
order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.raw import RAW_SCHEMA
from xpuprof.formats.xplane.stats import ENC


class Cols:
    """Columns of the events of one plane, before pids are known."""

    __slots__ = ("n", "name", "cat", "tid", "ts", "dur", "args", "corr", "device", "stream",
                 "nbytes", "flops", "plane")  # fmt: skip


def metadata_table(meta: list[tuple[str, int, int | None, dict[str, Any]]], pids: list[int]):
    """``M`` rows (``process_name``, ``process_labels``, ``thread_name``) naming planes and
    lines as a Kineto trace would; ``meta`` holds (name, plane, tid, args), indexes 0..M-1."""
    n_meta = len(meta)
    meta_tbl = pa.table(
        {
            "index": pa.array(np.arange(n_meta, dtype=np.int64)),
            "ph": dict_const("M", n_meta),
            "cat": pa.nulls(n_meta, RAW_SCHEMA.field("cat").type),
            "name": pc.dictionary_encode(pa.array([m[0] for m in meta], pa.string())),
            "pid": pa.array([pids[m[1]] for m in meta], pa.int64()),
            "tid": pa.array([m[2] for m in meta], pa.int64()),
            "ts": pa.nulls(n_meta, pa.int64()),
            "dur": pa.nulls(n_meta, pa.int64()),
            "args": pa.array([ENC.encode(m[3]).decode() for m in meta], pa.large_string()),
        }
    )
    return conform(meta_tbl)


def events_table(cols: list[Cols], dictionary: pa.Array, pids: list[int], start: int) -> pa.Table:
    """One ``X`` row per event, indexes from ``start`` on; one chunk per plane, as the Kineto
    reader leaves one per decoded run. ``cat``/``name`` are codes into ``dictionary``."""
    batches = []
    index = start
    for c in cols:
        if not c.n:
            continue
        corr, has_corr = c.corr
        is_dev = c.device >= 0
        batches.append(
            pa.table(
                {
                    "index": pa.array(np.arange(index, index + c.n, dtype=np.int64)),
                    "ph": dict_const("X", c.n),
                    "cat": pa.DictionaryArray.from_arrays(pa.array(c.cat), dictionary),
                    "name": pa.DictionaryArray.from_arrays(
                        pa.array(c.name, mask=c.name < 0), dictionary
                    ),
                    "pid": pa.array(np.full(c.n, pids[c.plane], dtype=np.int64)),
                    "tid": pa.array(c.tid),
                    "ts": pa.array(c.ts),
                    "dur": pa.array(c.dur),
                    "args": c.args,
                    "correlation": pa.array(corr, mask=~has_corr),
                    "device_arg": pa.array(c.device, mask=~is_dev),
                    "stream_arg": pa.array(c.stream, mask=c.stream < 0),
                    "bytes_arg": pa.array(c.nbytes, mask=np.isnan(c.nbytes)),
                    # kept only if RAW_SCHEMA has the column (proposed; conform drops it
                    # otherwise): XLA's FLOP count of each op, from its metadata
                    "flops_arg": pa.array(c.flops, mask=np.isnan(c.flops)),
                }
            )
        )
        index += c.n
    if not batches:
        return RAW_SCHEMA.empty_table()
    return pa.concat_tables([conform(b) for b in batches])


def read_counts(meta_tbl: pa.Table, ev_tbl: pa.Table) -> tuple[dict[str, int], dict[str, int]]:
    """Entries read per phase and per category ("" for none), as the manifest records them."""
    read_phase = {"M": meta_tbl.num_rows} if meta_tbl.num_rows else {}
    if ev_tbl.num_rows:
        read_phase["X"] = ev_tbl.num_rows
    read_category: dict[str, int] = {}
    for t in (meta_tbl, ev_tbl):
        for row in pc.value_counts(t["cat"]).to_pylist():
            key = "" if row["values"] is None else row["values"]
            read_category[key] = read_category.get(key, 0) + row["counts"]
    return read_phase, read_category


def dict_const(value: str, n: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, dtype=np.int32)), pa.array([value], pa.string())
    )


def strings(values: np.ndarray) -> pa.LargeStringArray:
    """A large-string column from an object array of JSON bytes (None = null), built from one
    joined buffer and offsets rather than a Python str per element."""
    n = len(values)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    parts = [v if v is not None else b"" for v in values]
    lens = np.fromiter(map(len, parts), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = b"".join(parts)
    n_null = int(n - valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if n_null else None
    return pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(data), validity, null_count=n_null
    )


def conform(t: pa.Table) -> pa.Table:
    """Add the RAW_SCHEMA columns a table lacks (as nulls) and put them in schema order."""
    n = t.num_rows
    cols = []
    for f in RAW_SCHEMA:
        if f.name in t.column_names:
            col = t[f.name]
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=RAW_SCHEMA)

"""Column helpers of the normaliser: Arrow columns to numpy and back, and per-distinct-value
functions of dictionary columns (computed once per value, never once per event)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.raw import decode_json  # noqa: F401  (the normaliser's modules take it from here)
from xpuprof.core.schema import LEVELS

LEVEL_CODE = {lv: i for i, lv in enumerate(LEVELS)}
LEVEL_DICT = pa.array(list(LEVELS), pa.string())


def ints(col: pa.ChunkedArray | pa.Array, fill: int = 0) -> np.ndarray:
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def isnull(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.is_null(col).to_numpy(zero_copy_only=False), dtype=bool)


def const_dict(value: str | None, n: int) -> pa.Array:
    """A dictionary column holding one value (or null) n times, without n Python strings."""
    t = pa.dictionary(pa.int32(), pa.string())
    if value is None:
        return pa.nulls(n, t)
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value]))


def as_dict(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        return arr.cast(pa.dictionary(pa.int32(), pa.string()))
    return pc.dictionary_encode(arr.cast(pa.string())).cast(pa.dictionary(pa.int32(), pa.string()))


def codes(col: pa.ChunkedArray | pa.Array, fn: Any, dtype: Any = np.int8) -> np.ndarray:
    """``fn`` of each value of a dictionary/string column as a numpy array, computing ``fn``
    once per distinct value (null is read as "")."""
    enc = as_dict(col)
    lut = np.array([fn(v) for v in enc.dictionary.to_pylist()] + [fn("")], dtype=dtype)
    idx = enc.indices.to_numpy(zero_copy_only=False)
    if enc.indices.null_count:
        idx = np.where(np.asarray(enc.indices.is_valid()), idx, len(lut) - 1)
    return lut[idx.astype(np.int64, copy=False)]


def rank_col(n: int, rank: int | None) -> pa.Array:
    return pa.nulls(n, pa.int32()) if rank is None else pa.array(np.full(n, rank, np.int32))


def small_int(v: Any, limit: int = 2**62) -> int | None:
    """``v`` as a non-negative int below ``limit`` (a step number, a device or stream index
    written as a number or as decimal digits), else None."""
    if isinstance(v, str):
        if not (v.isascii() and v.isdigit()) or len(v) > 19:
            return None
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return v if 0 <= v < limit else None


def int_or_null(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Flow ids as integers where they spell one in int64 (Kineto's do), null elsewhere (ids
    beyond int64 stay text in ``flow_id``; they can match no correlation id)."""
    try:
        return pc.cast(col, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        vals = []
        for v in col.to_pylist():
            try:
                n = int(v) if v is not None else None
            except ValueError:
                n = None
            vals.append(n if n is not None and -(2**63) <= n < 2**63 else None)
        return pa.array(vals, pa.int64())

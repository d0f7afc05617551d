"""Columns of the normalized tables as Chrome-trace JSON text, without a per-event Python loop.

Strings are JSON-escaped once per distinct value (Arrow dictionaries), pids/tids once per
distinct id, times written as exact microsecond decimals by integer arithmetic, and each
entry's text assembled with Arrow's vectorized string kernels (``Block.render``).
``export/chrome.py`` decides which columns make which entries; ``docs/export.md`` gives the
rules (exactness, ids, merged ranks).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "KEYS",
    "NATURAL_ID",
    "Block",
    "const_text",
    "escape_values",
    "flat",
    "flow_id_text",
    "id_text",
    "json_strings",
    "null_text",
    "us_text",
]

_L = pa.large_string()
_NUMBER = r"^-?(?:0|[1-9][0-9]*)$"
#: A non-negative decimal integer without leading zeros: a flow id written as a JSON number.
NATURAL_ID = r"^(?:0|[1-9][0-9]*)$"
_enc = msgspec.json.Encoder()

#: Output key order of an entry; each key is written only when its value is not null.
KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s", "args")
_PREFIX = {k: pa.scalar(f'"{k}":', _L) for k in KEYS}
_EMPTY = pa.scalar("", _L)
_COMMA = pa.scalar(",", _L)
_OPEN = pa.scalar(",\n{", _L)
_CLOSE = pa.scalar("}", _L)


def escape_values(values: list[Any]) -> pa.Array:
    """JSON text of each (distinct) string value."""
    return pa.array([None if v is None else _enc.encode(v).decode() for v in values], _L)


def json_strings(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
    """A string (or dictionary) column as a dictionary column of JSON string literals, escaped
    once per distinct value."""
    if isinstance(col, pa.Array):
        col = pa.chunked_array([col])
    out = []
    for chunk in col.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        esc = escape_values(chunk.dictionary.to_pylist())
        out.append(pa.DictionaryArray.from_arrays(chunk.indices, esc))
    return pa.chunked_array(out, pa.dictionary(pa.int32(), _L)) if out else null_text(0)


def null_text(n: int) -> pa.ChunkedArray:
    return pa.chunked_array([pa.nulls(n, _L)])


def const_text(text: str, n: int) -> pa.ChunkedArray:
    arr = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([text], _L))
    return pa.chunked_array([arr])


def id_text(col: pa.ChunkedArray, names: dict[str, str], who: str | None) -> pa.ChunkedArray:
    """pid/tid ids as JSON text: numbers as numbers, negative ids as their original strings
    (``names``), and, when ``who`` is given (pids of a merged export), the string
    ``"{who}/pid {P}"``."""
    out = []
    for chunk in col.chunks:
        enc = pc.dictionary_encode(chunk)
        texts = []
        for v in enc.dictionary.to_pylist():
            if v is None:
                texts.append(None)
                continue
            original: Any = names.get(str(v), v) if v < 0 else v
            value = original if who is None else f"{who}/pid {original}"
            texts.append(_enc.encode(value).decode())
        out.append(pa.DictionaryArray.from_arrays(enc.indices, pa.array(texts, _L)))
    return pa.chunked_array(out, pa.dictionary(pa.int32(), _L))


def flow_id_text(col: pa.ChunkedArray, who: str | None, offset: int) -> pa.ChunkedArray:
    """Flow ids as JSON text: all digits → a JSON number (Kineto's ids are integers, and
    Perfetto reads a string id as hex), anything else a JSON string.

    In a merged export (``who`` given) ids must not meet ids of another rank: numbers get
    ``offset`` added, other ids become ``"{who}/{id}"``.
    """
    out = []
    for chunk in col.chunks:
        chunk = chunk.cast(_L)
        is_num = pc.fill_null(pc.match_substring_regex(chunk, _NUMBER), True)
        if who is not None:
            missing = pc.is_null(chunk)  # no id: nothing to write
            natural = pc.fill_null(pc.match_substring_regex(chunk, NATURAL_ID), False)
            shifted = _shift_ids(chunk, natural, offset)
            if shifted is None:  # beyond int64 once shifted: keep them apart as strings
                is_num = missing
            else:
                chunk, is_num = shifted, pc.or_(natural, missing)
        if pc.all(is_num).as_py():
            out.append(chunk)
            continue
        other = pc.invert(is_num)
        values = chunk.filter(other).to_pylist()
        if who is not None:
            values = [f"{who}/{v}" for v in values]
        out.append(pc.replace_with_mask(chunk, other, escape_values(values)))
    return pa.chunked_array(out, _L)


def _shift_ids(chunk: pa.Array, num: pa.Array, offset: int) -> pa.Array | None:
    """``chunk`` with ``offset`` added to its decimal ids (where ``num``), or None when a
    result would not fit in int64."""
    if offset == 0:
        return chunk
    nums = chunk.filter(num)
    try:
        vals = np.asarray(nums.cast(pa.int64()).to_numpy(zero_copy_only=False), np.int64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if len(vals) and int(vals.max()) > np.iinfo(np.int64).max - offset:
        return None
    return pc.replace_with_mask(chunk, num, pa.array(vals + offset).cast(_L))


class Block:
    """One table of one part, ready to render: ``index`` plus JSON-text columns by output key."""

    def __init__(self, index: np.ndarray, cols: dict[str, Any], extra: Any = None) -> None:
        order = np.argsort(index, kind="stable")
        if np.any(order != np.arange(len(index))):
            take = pa.array(order)
            index = index[order]
            cols = {k: v.take(take) for k, v in cols.items()}
            extra = extra.take(take) if extra is not None else None
        self.index = index
        self.cols = cols
        self.extra = extra

    def __len__(self) -> int:
        return len(self.index)

    def render(self, lo: int, hi: int) -> tuple[np.ndarray, pa.Array] | None:
        """The rows with ``lo <= index < hi``: their indices and entry texts."""
        a, b = np.searchsorted(self.index, [lo, hi], side="left")
        if a >= b:
            return None
        n = int(b - a)
        frags = []
        for key in KEYS:
            col = self.cols.get(key)
            if col is None:
                continue
            part = col.slice(a, n)
            if key in ("ts", "dur"):
                text = us_text(part)
            else:
                text = flat(part.cast(_L) if pa.types.is_dictionary(part.type) else part)
            frags.append(pc.binary_join_element_wise(_PREFIX[key], text, _EMPTY))
        if self.extra is not None:
            ex = flat(self.extra.slice(a, n))
            if ex.null_count < n:
                inner = pc.utf8_slice_codeunits(pc.utf8_trim_whitespace(ex), 1, -1)
                frags.append(pc.if_else(pc.equal(inner, ""), pa.scalar(None, _L), inner))
        body = pc.binary_join_element_wise(*frags, _COMMA, null_handling="skip")
        entry = pc.binary_join_element_wise(_OPEN, body, _CLOSE, _EMPTY)
        return self.index[a:b], entry


def flat(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def us_text(ns: pa.ChunkedArray | pa.Array) -> pa.Array:
    """int64 nanoseconds → microsecond decimal text, exactly (integer arithmetic only)."""
    ns = flat(ns)
    valid = np.asarray(ns.is_valid())
    v = np.asarray(pc.fill_null(ns, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    neg = v < 0
    a = np.abs(v)
    q, r = np.divmod(a, 1000)
    mask = ~valid
    qs = pa.array(q, mask=mask).cast(_L)
    frac = pc.utf8_rtrim(pc.utf8_lpad(pa.array(r).cast(_L), 3, "0"), "0")
    text = pc.if_else(
        pa.array(r == 0), qs, pc.binary_join_element_wise(qs, frac, pa.scalar(".", _L))
    )
    if neg.any():
        text = pc.if_else(
            pa.array(neg), pc.binary_join_element_wise(pa.scalar("-", _L), text, _EMPTY), text
        )
    return text

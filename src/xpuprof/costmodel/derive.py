"""FLOPs and bytes of a whole column of op events at once (what the normaliser calls at import).

Fast because real traces repeat themselves: see :func:`derive`.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.costmodel.ops import RULES, base_name, op_cost


class _ShapeArgs(msgspec.Struct, gc=False):
    """The three args a cost needs, as raw JSON: compared as bytes to find repeated calls, and
    decoded only once per distinct call."""

    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")


_DECODE_ALL = msgspec.json.Decoder(list[_ShapeArgs])
#: Rows whose args are decoded at once (a few tens of MB of text at most).
DECODE_BATCH = 1 << 17
_DECODE_ONE = msgspec.json.Decoder(_ShapeArgs)
_ENCODE = msgspec.json.Encoder()


def _raw_value(raw: msgspec.Raw) -> Any:
    return msgspec.json.decode(raw) if len(raw) else None


def _name_codes(names: Any) -> tuple[np.ndarray, list[str | None]]:
    """Each row's index into a list of its distinct names (-1: null)."""
    if not isinstance(names, (pa.Array, pa.ChunkedArray)):
        names = pa.array(list(names), pa.string())
    chunks = names.chunks if isinstance(names, pa.ChunkedArray) else [names]
    uniq: dict[str | None, int] = {}
    parts = []
    for ch in chunks:
        if not pa.types.is_dictionary(ch.type):
            ch = pc.dictionary_encode(ch)
        local = np.array(
            [uniq.setdefault(v, len(uniq)) for v in ch.dictionary.to_pylist()] + [-1], np.int64
        )
        idx = ch.indices.to_numpy(zero_copy_only=False)
        if ch.null_count:
            idx = np.where(ch.is_null().to_numpy(zero_copy_only=False), -1, idx)
        parts.append(local[idx.astype(np.int64)])
    codes = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return codes, list(uniq)


def take_rows(col: pa.Array | pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """``col[rows]`` (rows ascending) as one large_string array, taken chunk by chunk: a take on
    a chunked column would first concatenate all of it."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    starts = np.cumsum([0] + [len(c) for c in chunks])
    parts = []
    for k, ch in enumerate(chunks):
        lo, hi = np.searchsorted(rows, starts[k : k + 2])
        if hi > lo:
            part = ch.take(pa.array(rows[lo:hi] - starts[k], pa.int64()))
            if not pa.types.is_large_string(part.type):
                part = part.cast(pa.large_string())
            parts.append(part)
    if not parts:
        return pa.array([], pa.large_string())
    return pa.concat_arrays(parts) if len(parts) > 1 else parts[0]


def _decode_rows(args: Any, rows: np.ndarray) -> list[_ShapeArgs | None]:
    """The shape args of the given rows, decoded in one msgspec call over one joined buffer
    (one call per row only if some row is not a JSON object)."""
    if not isinstance(args, (pa.Array, pa.ChunkedArray)):
        sel = pa.array([args[i] for i in rows.tolist()], pa.large_string())
    else:
        sel = take_rows(args, rows)
    sel = pc.fill_null(sel, "{}")
    sel = pc.if_else(pc.equal(sel, ""), pa.scalar("{}", sel.type), sel)
    lst = pa.LargeListArray.from_arrays(pa.array([0, len(sel)], pa.int64()), sel)
    joined = pc.binary_join(lst, pa.scalar(",", pa.large_string()))[0].as_buffer()
    text = np.empty(joined.size + 2, np.uint8)  # "[" + rows joined by "," + "]", one copy
    text[0], text[-1] = ord("["), ord("]")
    text[1:-1] = np.frombuffer(joined, np.uint8)
    try:
        return _DECODE_ALL.decode(text)  # type: ignore[return-value]
    except msgspec.DecodeError:
        out: list[_ShapeArgs | None] = []
        for text in sel.to_pylist():
            try:
                out.append(_DECODE_ONE.decode(text))
            except msgspec.DecodeError:
                out.append(None)
        return out


def derive(names: Any, args: Any, where: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and bytes of a column of op events; float64 arrays, NaN where unknown.

    ``names`` is the events' ``name`` column (Arrow string or dictionary array, chunked or not,
    or a sequence of str); ``args`` the ``args`` column (Arrow string/large_string of JSON
    objects, or a sequence of str/None). ``where`` (bool, optional) limits the work to those
    rows (the framework ops of a whole events table); the others get NaN. Values are inclusive
    (see the module notes): total a trace with ``outermost()``.

    Fast because real traces repeat themselves: names are looked at once each; ops whose cost
    does not depend on shapes (views, allocations) and ops with no model never have their args
    read; the rest are decoded in one msgspec call that keeps the three shape fields as raw
    bytes, and ``op_cost`` runs once per distinct (name, dims, types, concrete).
    """
    codes, uniq = _name_codes(names)
    n = len(codes)
    if where is not None:
        codes = np.where(np.asarray(where, bool), codes, -1)
    flops = np.full(n, np.nan)
    nbytes = np.full(n, np.nan)
    if n == 0:
        return flops, nbytes
    const_f = np.full(len(uniq) + 1, np.nan)
    const_b = np.full(len(uniq) + 1, np.nan)
    need = np.zeros(len(uniq) + 1, bool)
    for k, nm in enumerate(uniq):
        rule = RULES.get(base_name(nm)) if nm is not None else None
        if rule is None:
            continue
        if rule[2]:
            need[k] = True
        else:
            f, b = op_cost(nm, [], [], [])  # type: ignore[arg-type]
            const_f[k] = np.nan if f is None else f
            const_b[k] = np.nan if b is None else b
    flops[:] = const_f[codes]
    nbytes[:] = const_b[codes]
    rows = np.flatnonzero(need[codes])
    if not rows.size:
        return flops, nbytes
    # the rows' shape args in batches (the taken text, its joined copy and the decoded
    # objects of a whole big table at once would be gigabytes), deduplicated across them
    enc = _ENCODE.encode
    seen: dict[Any, int] = {}  # key -> its number
    # per key: its name code and its three raw fields, copied (as decoded they are views that
    # would keep each batch's whole text alive); None where the args did not decode
    first: list[tuple[int, tuple[msgspec.Raw, msgspec.Raw, msgspec.Raw] | None]] = []
    inverse = np.empty(len(rows), np.int64)
    for lo in range(0, len(rows), DECODE_BATCH):
        batch = rows[lo : lo + DECODE_BATCH]
        decoded = _decode_rows(args, batch)
        # one key per row: the name and the three raw fields, re-encoded into one bytes object
        # (a single C call; the volatile args — ids, sequence numbers — are not part of it)
        row_codes = codes[batch].tolist()
        keys = [(c, enc(a) if a is not None else None)
                for c, a in zip(row_codes, decoded, strict=True)]  # fmt: skip
        for k, a in zip(keys, decoded, strict=True):
            if k not in seen:
                seen[k] = len(first)
                raw = None if a is None else (a.dims.copy(), a.types.copy(), a.concrete.copy())
                first.append((k[0], raw))
        inverse[lo : lo + len(batch)] = np.fromiter(map(seen.__getitem__, keys), np.int64,
                                                    len(keys))  # fmt: skip
        del decoded, keys
    uf = np.full(len(first), np.nan)
    ub = np.full(len(first), np.nan)
    for u, (c, raw) in enumerate(first):
        if raw is None:
            continue
        try:
            dims, types, conc = (_raw_value(r) for r in raw)
        except msgspec.DecodeError:
            continue
        f, b = op_cost(uniq[c], dims, types, conc)  # type: ignore[arg-type]
        uf[u] = np.nan if f is None else f
        ub[u] = np.nan if b is None else b
    flops[rows] = uf[inverse]
    nbytes[rows] = ub[inverse]
    return flops, nbytes

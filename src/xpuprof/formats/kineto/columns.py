"""Columns out, for the Kineto reader: decoded events (msgspec structs) to Arrow columns of
``core.raw.RAW_SCHEMA``, without a Python object per value where Arrow can build the column
from the raw JSON slices at once."""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.raw import DICT_STRING
from xpuprof.formats.kineto.values import ANY_DEC, float_hook

_MISSING = msgspec.Raw(b"")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: The largest microsecond value whose nanoseconds fit in int64.
_MAX_US = Decimal(_INT64_MAX) / 1000


class Event(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The fields of a Chrome-trace event that we read; anything else takes the slow path."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = _MISSING
    dur: msgspec.Raw = _MISSING
    id: Any = None
    bp: Any = None
    s: Any = None
    args: msgspec.Raw = _MISSING


_KNOWN_KEYS = frozenset(Event.__struct_fields__)


class _ArgSel(msgspec.Struct, gc=False):
    """The few args the data model lifts into typed columns; the whole object stays in ``args``."""

    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_2021: Any = msgspec.field(default=None, name="external id")
    device: Any = None
    stream: Any = None
    bytes: Any = None


_ARGS_DEC = msgspec.json.Decoder(list[_ArgSel | None], float_hook=float_hook)


def _raw_strings(raws: list[Any]) -> pa.LargeStringArray:
    """Build a string array from raw JSON slices without a Python object per element; the
    slices are checked to be UTF-8 (msgspec passes raw values through unchecked), and a batch
    holding one that is not raises ``ArrowInvalid``, for the caller to find and name it."""
    n = len(raws)
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = b"".join(raws)
    valid = lens > 0
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    out = pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(data), validity, null_count=int(n - valid.sum())
    )
    out.validate(full=True)
    return out


def us_text_to_ns(text: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """Convert microsecond decimal text to int64 nanoseconds exactly (no float round trip).

    Returns the values and, when some text is not a finite number in range, a mask of those
    entries (their value is null).
    """
    try:
        dec = text.cast(pa.decimal128(24, 3))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        try:
            dec = pc.round(text.cast(pa.decimal128(38, 9)), ndigits=3).cast(pa.decimal128(38, 3))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return _us_text_to_ns_slow(text)
    n = len(dec)
    if n == 0:
        return pa.array([], pa.int64()), None
    words = np.frombuffer(dec.buffers()[1], dtype=np.int64, count=2 * (n + dec.offset))
    low = words[2 * dec.offset :: 2]
    high = words[2 * dec.offset + 1 :: 2]
    # The value fits in int64 when the high word is the sign extension of the low word.
    if not np.array_equal(high, np.where(low < 0, -1, 0)):
        return _us_text_to_ns_slow(text)
    return pa.array(low.copy(), pa.int64(), mask=np.asarray(dec.is_null())), None


def _us_text_to_ns_slow(text: pa.Array) -> tuple[pa.Array, np.ndarray | None]:
    """Per-value fallback for spellings Arrow's decimal cast rejects (quoted numbers, NaN,
    values beyond int64 nanoseconds): each bad one is flagged, not fatal, so the caller can
    name the event or, when lenient, drop just that event."""
    out: list[int | None] = []
    bad = np.zeros(len(text), dtype=bool)
    for i, v in enumerate(text.to_pylist()):
        if v is None:
            out.append(None)
            continue
        try:
            d = Decimal(v.strip().strip('"'))
        except InvalidOperation:
            d = None
        # the range is checked on the exponent first: int() of 1e999999999 would take forever
        # and arithmetic on it overflows the decimal context
        fits = d is not None and d.is_finite() and d.adjusted() < 19 and abs(d) <= _MAX_US
        ns = int((d * 1000).to_integral_value()) if fits else None
        if ns is None or not _INT64_MIN <= ns <= _INT64_MAX:
            bad[i] = True
            ns = None
        out.append(ns)
    return pa.array(out, pa.int64()), bad if bad.any() else None


def _int64_column(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        out = []
        for v in values:
            if isinstance(v, bool):
                v = int(v)
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if isinstance(v, str):
                try:
                    v = int(v)
                except ValueError:
                    v = None
            out.append(v if isinstance(v, int) and _INT64_MIN <= v <= _INT64_MAX else None)
        return pa.array(out, pa.int64())


def _float_column(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        out = []
        for v in values:
            try:
                f = None if v is None or isinstance(v, bool) else float(v)
            except (TypeError, ValueError, OverflowError):
                f = None
            out.append(f if f is not None and math.isfinite(f) else None)
        return pa.array(out, pa.float64())


def _string_column(values: list[Any], typ: pa.DataType | None = None) -> pa.Array:
    """Strings as they come; anything else (a number as a name, say) as its JSON text.
    Repetitive columns are built as dictionaries right away: a name then costs 4 bytes."""
    typ = typ or pa.string()
    try:
        return pa.array(values, typ)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array(
            [
                v if v is None or isinstance(v, str) else msgspec.json.encode(v).decode()
                for v in values
            ],
            typ,
        )


def _id_column(values: list[Any]) -> pa.Array:
    """Flow ids are integers in Kineto and strings in other tools: store their text."""
    try:
        return pa.array(values).cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return _string_column(values)


class IdMaps:
    """Per-file state shared by all chunks: the string → id maps for pid and tid."""

    def __init__(self) -> None:
        self.string_ids: dict[str, dict[Any, int]] = {"pid": {}, "tid": {}}

    def saw_ints(self, kind: str, values: np.ndarray) -> None:
        """The integer pids or tids of a run as the source wrote them (not codes), for maps
        that watch them (a piece's, ``split.py``); the compiled path (``fields.py``) reports
        them here, as ``ids`` sees them on msgspec's."""

    def ids(self, kind: str, values: list[Any]) -> pa.Array:
        try:
            return pa.array(values, pa.int64())
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
        table = self.string_ids[kind]
        out = list(values)
        for i, v in enumerate(out):
            if v is None or type(v) is int and _INT64_MIN <= v <= _INT64_MAX:
                continue
            if isinstance(v, str) and v.isascii() and v.isdigit() and len(v) < 19:
                # 2021 traces quote thread ids ("25738"): keep them the numbers they are.
                out[i] = int(v)
                continue
            key = v if isinstance(v, str) else msgspec.json.encode(v).decode()
            code = table.get(key)
            if code is None:
                # Names (and oddities: floats, huge ints) get ids below zero; real pids and tids
                # are never negative, and the map travels with the store.
                code = -(len(table) + 1)
                table[key] = code
            out[i] = code
        return pa.array(out, pa.int64())


def columns(
    evs: list[Event], index0: int, ctx: IdMaps, extra: list[bytes | None] | None = None
) -> pa.RecordBatch:
    n = len(evs)
    ph = [e.ph for e in evs]
    args = [e.args for e in evs]
    sel = _ARGS_DEC.decode(b"[" + b",".join([a or b"null" for a in args]) + b"]")
    cols: dict[str, pa.Array] = {
        "index": pa.array(np.arange(index0, index0 + n, dtype=np.int64)),
        "ph": _string_column(ph, DICT_STRING),
        "cat": _string_column([e.cat for e in evs], DICT_STRING),
        "name": _string_column([e.name for e in evs], DICT_STRING),
        "pid": ctx.ids("pid", [e.pid for e in evs]),
        "tid": ctx.ids("tid", [e.tid for e in evs]),
        "ts": _raw_strings([e.ts for e in evs]),
        "dur": _raw_strings([e.dur for e in evs]),
        "flow_id": _id_column([e.id for e in evs]),
        "bp": _string_column([e.bp for e in evs], DICT_STRING),
        "scope": _string_column([e.s for e in evs], DICT_STRING),
        "args": _raw_strings(args),
        "extra": pa.array(extra if extra is not None else [None] * n, pa.large_string()),
    }
    ext = [s.external_id if s is not None else None for s in sel]
    if any(v is None for v in ext):
        ext = [
            v if v is not None else (s.external_id_2021 if s is not None else None)
            for v, s in zip(ext, sel, strict=True)
        ]
    cols["correlation"] = _int64_column([s.correlation if s else None for s in sel])
    cols["external_id"] = _int64_column(ext)
    cols["device_arg"] = _int64_column([s.device if s else None for s in sel])
    cols["stream_arg"] = _int64_column([s.stream if s else None for s in sel])
    cols["bytes_arg"] = _float_column([s.bytes if s else None for s in sel])
    return pa.RecordBatch.from_pydict(cols)


def events_from_dicts(dicts: list[dict[str, msgspec.Raw]]) -> tuple[list[Event], list]:
    """Slow path for entries with keys beyond ``Event``: keep the unknown keys in ``extra``."""
    evs = []
    extra: list[bytes | None] = []
    for d in dicts:
        kw: dict[str, Any] = {}
        rest: dict[str, msgspec.Raw] = {}
        for k, v in d.items():
            if k in ("ts", "dur", "args"):
                kw[k] = v
            elif k in _KNOWN_KEYS:
                kw[k] = ANY_DEC.decode(v)
            else:
                rest[k] = v
        evs.append(Event(**kw))
        extra.append(msgspec.json.encode(rest).decode() if rest else None)
    return evs, extra

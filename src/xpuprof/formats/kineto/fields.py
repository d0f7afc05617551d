"""The Kineto reader's compiled path: a run of entries cut into fields by ``scanner.c`` and
turned into the raw columns that ``columns.columns`` builds from msgspec's structs — the same
Arrow columns, value for value, with no Python object per event (the reader's decode of the
8-rank benchmark's files: 2.5x faster, see benchmarks/RESULTS.md).

It takes only what it can turn into exactly those columns: every field a string, integer, null
or (``args``) object as Kineto writes them. Anything else — an entry with a key the reader keeps
in ``extra``, a name that is a number, a pid that is a string, an id that is a float, a lifted
arg that is not an integer, text that is not strict JSON or not UTF-8 — makes :func:`batch`
return None, and the reader takes its msgspec path for that run, which decodes it as before
and names what is wrong, if anything is. Without the compiled module (no C compiler at install)
every run takes that path.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from xpuprof.core.raw import DICT_STRING
from xpuprof.formats.kineto.columns import IdMaps

try:
    from xpuprof.formats.kineto import scanner
except ImportError:  # not built: the msgspec path reads everything
    scanner = None

# kinds of values, as scanner.c numbers them
ABSENT, STR, ESC, INT, NUM, TRUE, FALSE, NULL, OBJ, ARR = range(10)
FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s", "args",
          "correlation", "External id", "external id", "device", "stream", "bytes")  # fmt: skip
_AT = {name: i for i, name in enumerate(FIELDS)}
#: the fields whose text the scanner gathers, in its order
TEXTS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s", "args")
_STRINGISH = np.array([ABSENT, STR, ESC, NULL], dtype=np.int8)
_INTISH = np.array([ABSENT, INT, NULL], dtype=np.int8)
_IDISH = np.array([ABSENT, INT, NULL, STR], dtype=np.int8)
_LIFTED = np.array([ABSENT, INT, NULL, STR, TRUE, FALSE], dtype=np.int8)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_EXACT = 2**53  # integers a float64 holds exactly


class _Declined(Exception):
    """A value these columns cannot take as the msgspec path would: that path reads the run."""


def available() -> bool:
    """True when the compiled scanner was built."""
    return scanner is not None


class _Scanned:
    """One run's scan: per entry and field the value's kind and integer value, and the text
    of each gathered field (offsets, bytes)."""

    def __init__(self, text: Any, got: tuple[Any, ...]) -> None:
        n, kinds, ivals, spans, texts = got
        self.n = n
        self.source = memoryview(text)
        self.spans = np.frombuffer(spans, dtype=np.int64).reshape(n, len(FIELDS), 2)
        self.kinds = np.frombuffer(kinds, dtype=np.int8).reshape(n, len(FIELDS))
        self.ivals = np.frombuffer(ivals, dtype=np.int64).reshape(n, len(FIELDS))
        self.texts = dict(zip(TEXTS, texts, strict=True))

    def kind(self, name: str, allowed: np.ndarray) -> np.ndarray:
        k = self.kinds[:, _AT[name]]
        if not np.isin(k, allowed).all():
            raise _Declined(name)
        return k

    def text(self, name: str, valid: np.ndarray, large: bool) -> pa.Array:
        """The gathered text of ``name`` as a string column (nulls where not ``valid``),
        checked to be UTF-8."""
        offsets, data = self.texts[name]
        off = np.frombuffer(offsets, dtype=np.int64)
        if not large:
            if off[-1] >= 2**31:
                raise _Declined(name)
            off = off.astype(np.int32)
        nulls = int(self.n - np.count_nonzero(valid))
        mask = None if not nulls else pa.py_buffer(np.packbits(valid, bitorder="little"))
        typ = pa.LargeStringArray if large else pa.StringArray
        out = typ.from_buffers(self.n, pa.py_buffer(off), pa.py_buffer(data), mask, nulls)
        out.validate(full=True)
        return out

    def strings(self, name: str, ints: bool = False) -> pa.Array:
        """A string field as the msgspec path keeps it (``columns._string_column`` /
        ``_id_column``): the string; null for null or absent; with ``ints``, an integer as
        its text."""
        allowed = np.append(_STRINGISH, INT) if ints else _STRINGISH
        k = self.kind(name, allowed)
        out = self.text(name, (k != ABSENT) & (k != NULL), large=False)
        escaped = np.flatnonzero(k == ESC)
        if len(escaped):  # rare: resolve each escaped string as msgspec does
            values = out.to_pylist()
            for i in escaped.tolist():
                values[i] = msgspec.json.decode(b'"' + values[i].encode() + b'"', type=str)
            out = pa.array(values, pa.string())
        return out

    def lifted(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """An integer arg as ``columns._int64_column`` makes it of msgspec's value: an integer
        as it is, true/false as 1/0, a string as Python's ``int`` reads it (else null); with
        whether the arg was there at all (not null), which picks the external id."""
        k = self.kind(name, _LIFTED)
        at = _AT[name]
        values = self.ivals[:, at].copy()
        valid = (k == INT) | (k == TRUE) | (k == FALSE)
        values[k == TRUE], values[k == FALSE] = 1, 0
        for i in np.flatnonzero(k == STR).tolist():
            a, z = self.spans[i, at].tolist()
            try:
                v = int(bytes(self.source[a + 1 : z - 1]).decode())
            except ValueError:
                continue
            if _INT64_MIN <= v <= _INT64_MAX:
                values[i], valid[i] = v, True
        return values, valid, (k != ABSENT) & (k != NULL)

    def named(self, name: str) -> tuple[np.ndarray, list[str]]:
        """A pid or tid's kinds, and its strings (checked UTF-8), for :meth:`ids`."""
        k = self.kind(name, _IDISH)
        named = np.flatnonzero(k == STR)
        return k, self.text(name, k == STR, False).take(named).to_pylist() if len(named) else []

    def ids(self, name: str, named: tuple[np.ndarray, list[str]], ctx: IdMaps) -> pa.Array:
        """A pid or tid as ``IdMaps.ids`` makes it: integers as they are, a string of digits
        as its number, any other string the file's id for it (new ones numbered in order).
        Cannot fail: it changes the file's maps, so it runs once the run is known taken."""
        k, strings = named
        ctx.saw_ints(name, self.ivals[k == INT, _AT[name]])
        if not strings:
            return pa.array(self.ivals[:, _AT[name]], pa.int64(), mask=k != INT)
        values = self.ivals[:, _AT[name]].copy()
        table = ctx.string_ids[name]
        for i, v in zip(np.flatnonzero(k == STR).tolist(), strings, strict=True):
            if v.isascii() and v.isdigit() and len(v) < 19:
                values[i] = int(v)
                continue
            code = table.get(v)
            if code is None:
                code = table[v] = -(len(table) + 1)
            values[i] = code
        return pa.array(values, pa.int64(), mask=(k != INT) & (k != STR))

    def raw(self, name: str) -> pa.Array:
        """A field's JSON text as written (null when absent), as ``columns._raw_strings``."""
        return self.text(name, self.kinds[:, _AT[name]] != ABSENT, large=True)


def trim() -> None:
    """Free the memory the scanner keeps between runs (a file's read is over)."""
    if scanner is not None:
        scanner.trim()


def batch(text: Any, index0: int, ctx: IdMaps) -> pa.RecordBatch | None:
    """The raw columns of a run of entries (``[entry, …]`` text, numbered from ``index0``),
    equal to what ``columns.columns`` makes of msgspec's decode of it; None when the compiled
    scanner is absent or declines the run (the caller then decodes it with msgspec)."""
    if scanner is None:
        return None
    got = scanner.scan(text)
    if got is None:
        return None
    try:
        return _columns(_Scanned(text, got), index0, ctx)
    except (_Declined, pa.ArrowInvalid, msgspec.DecodeError, ValueError):
        # text that is not UTF-8, an escape msgspec refuses (a lone surrogate): that path
        # decodes the run and says what is wrong
        return None


def _columns(s: _Scanned, index0: int, ctx: IdMaps) -> pa.RecordBatch:
    n = s.n
    s.kind("args", np.array([ABSENT, NULL, OBJ], dtype=np.int8))  # else msgspec's lift fails
    # "External id", else (when it is absent or null) the 2021 spelling "external id"
    ext, ext_ok, first = s.lifted("External id")
    ext2, ext2_ok, _ = s.lifted("external id")
    ext, ext_ok = np.where(first, ext, ext2), np.where(first, ext_ok, ext2_ok)
    cols_int = {key: s.lifted(name)[:2] for key, name in _LIFTED_COLUMNS}
    size_k = s.kind("bytes", _INTISH)
    size = s.ivals[:, _AT["bytes"]]
    if (np.abs(size[size_k == INT]) > _MAX_EXACT).any():
        raise _Declined("bytes")
    pid, tid = s.named("pid"), s.named("tid")
    cols: dict[str, pa.Array | None] = {
        "index": pa.array(np.arange(index0, index0 + n, dtype=np.int64)),
        "ph": s.strings("ph").dictionary_encode(),
        "cat": s.strings("cat").dictionary_encode(),
        "name": s.strings("name").dictionary_encode(),
        "pid": None,  # last, below
        "tid": None,
        "ts": s.raw("ts"),
        "dur": s.raw("dur"),
        "flow_id": s.strings("id", ints=True),
        "bp": s.strings("bp").dictionary_encode(),
        "scope": s.strings("s").dictionary_encode(),
        "args": s.raw("args"),
        "extra": pa.nulls(n, pa.large_string()),
        "correlation": _int64(*cols_int["correlation"]),
        "external_id": _int64(ext, ext_ok),
        "device_arg": _int64(*cols_int["device_arg"]),
        "stream_arg": _int64(*cols_int["stream_arg"]),
        "bytes_arg": pa.array(size.astype(np.float64), pa.float64(), mask=size_k != INT),
    }
    for name in ("ph", "cat", "name", "bp", "scope"):
        if cols[name].type != DICT_STRING:
            cols[name] = cols[name].cast(DICT_STRING)
    # every column built: the run is taken, and only now may the file's id maps change (a run
    # declined after numbering its strings would leave names msgspec's path never numbers)
    cols["pid"], cols["tid"] = s.ids("pid", pid, ctx), s.ids("tid", tid, ctx)
    return pa.RecordBatch.from_pydict(cols)


_LIFTED_COLUMNS = (("correlation", "correlation"), ("device_arg", "device"),
                   ("stream_arg", "stream"))  # fmt: skip


def _int64(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    return pa.array(values, pa.int64(), mask=~valid)

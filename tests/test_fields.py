"""The Kineto reader's compiled scanner (``formats/kineto/scanner.c`` + ``fields.py``) against
its msgspec path, which it must equal value for value: on every real trace, on hand-written
runs of entries at each place the two could part (escapes, string ids, lifted args of odd
types, keys that repeat or are unknown, JSON that is not strict), and on generated runs.

Where it is not built (no C compiler at install) only the test saying so runs.
"""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import fuzzing as fz
import msgspec
import pytest
from conftest import EXAMPLE, kineto_files
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpuprof.core.errors import TraceFormatError
from xpuprof.formats.kineto import columns as cols
from xpuprof.formats.kineto import decode, fields
from xpuprof.formats.kineto.errors import DECODE_ERRORS

needs_scanner = pytest.mark.skipif(
    not fields.available(),
    reason="the compiled scanner was not built (no C compiler at install): the Kineto "
    "reader decodes with msgspec alone",
)


def test_built_where_a_compiler_is() -> None:
    """An install with a C compiler and Python's headers builds it (else every import is
    slower, silently)."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: the reader uses msgspec alone")
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        pytest.skip(f"no Python headers ({headers}) here: the reader uses msgspec alone")
    assert fields.available()


def by_msgspec(text: bytes, ctx: cols.IdMaps) -> object:
    """What ``Decoder.decode_events`` makes of a run without the scanner: its columns, or
    the exception that hands the run to the walker."""
    try:
        try:
            evs = decode._EVENTS_DEC.decode(text)
            extra = None
        except msgspec.ValidationError as e:
            if "unknown field" not in str(e):
                raise
            evs, extra = cols.events_from_dicts(decode._DICTS_DEC.decode(text))
        return cols.columns(evs, 0, ctx, extra)
    except DECODE_ERRORS as e:
        return e


def same_or_declined(text: bytes) -> bool:
    """Check the scanner against msgspec on one run; True when the scanner took it."""
    ctx_fast, ctx_slow = cols.IdMaps(), cols.IdMaps()
    got = fields.batch(text, 0, ctx_fast)
    want = by_msgspec(text, ctx_slow)
    if got is None:
        return False
    assert not isinstance(want, BaseException), f"scanner took a run msgspec refuses: {want}"
    assert got.schema == want.schema
    for name in want.schema.names:
        assert got.column(name).equals(want.column(name)), (
            name,
            got.column(name),
            want.column(name),
        )
    assert ctx_fast.string_ids == ctx_slow.string_ids
    return True


# runs the scanner must take, each with what makes it worth checking
TAKEN = {
    "plain": b'[{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 7, "ts": 1.5, '
    b'"dur": 2, "args": {"device": 0, "stream": 7, "correlation": 12, "External id": 3}}]',
    "no spaces, metadata": b'[{"name":"process_name","ph":"M","pid":0,"tid":0,'
    b'"args":{"name":"python3"}},{"ph":"i","s":"t","name":"m","pid":0,"tid":0,"ts":0}]',
    "whitespace everywhere": b' [ { "ph" : "X" ,\n\t"ts" : 0 } ,\r\n { } ] ',
    "empty run": b"[]",
    "escaped strings": b'[{"ph": "X", "name": "a\\"b\\u00e9\\n\\/", "cat": "c\\\\d", "ts": 0}]',
    "unicode": '[{"ph": "X", "name": "матмул ∑ 😀", "ts": 0}]'.encode(),
    "named ids": b'[{"ph": "X", "pid": "Spans", "tid": "stream 7", "ts": 0},'
    b'{"ph": "X", "pid": "25738", "tid": "Spans", "ts": 1},{"ph": "X", "pid": 3, "tid": 4, '
    b'"ts": 2},' + '{"ph": "X", "pid": "\u0663", "tid": "\u00b2", "ts": 3}]'.encode(),
    "nulls": b'[{"ph": "X", "cat": null, "name": null, "pid": null, "tid": null, "ts": 0, '
    b'"dur": null, "id": null, "args": null}]',
    "flows": b'[{"ph": "s", "id": 5, "bp": "e", "ts": 1},{"ph": "f", "id": "a-9", "ts": 2},'
    b'{"ph": "t", "id": -7, "ts": 3}]',
    "odd lifted args": b'[{"ph": "X", "ts": 0, "args": {"stream": "0x0", "device": true, '
    b'"correlation": "12", "External id": null, "external id": 5, "bytes": 4096}},'
    b'{"ph": "X", "ts": 0, "args": {"External id": "abc", "external id": 5, "device": false,'
    b' "stream": " 42 ", "correlation": "9" }}]',
    "lifted keys nested deeper": b'[{"ph": "X", "ts": 0, "args": {"x": {"correlation": 5}, '
    b'"y": [{"device": 1}], "Input Dims": [[2, 3], []], "z": -1.5e-3}}]',
    "times as written": b'[{"ph": "X", "ts": 1.0e3, "dur": "7"},{"ph": "X", "ts": -0.5}]',
    "int64 edges": b'[{"ph": "X", "ts": 0, "pid": 9223372036854775807, '
    b'"tid": -9223372036854775808, "args": {"correlation": -9223372036854775808}}]',
}

# runs it must leave to msgspec (which decodes them, or names what is wrong)
DECLINED = {
    "a number as a name": b'[{"ph": "X", "name": 5, "ts": 0}]',
    "an unknown key": b'[{"ph": "X", "ts": 0, "color": "red"}]',
    "a key twice": b'[{"ph": "X", "ts": 0, "ts": 1}]',
    "an escaped key": b'[{"ph": "X", "t\\u0073": 0}]',
    "an escaped lifted arg key": b'[{"ph": "X", "ts": 0, "args": {"devic\\u0065": 1}}]',
    "a lifted arg twice": b'[{"ph": "X", "ts": 0, "args": {"device": 1, "device": 2}}]',
    "minus zero id": b'[{"ph": "s", "id": -0, "ts": 0}]',
    "a float id": b'[{"ph": "s", "id": 1.5, "ts": 0}]',
    "a pid past int64": b'[{"ph": "X", "pid": 9223372036854775808, "ts": 0}]',
    "a float lifted arg": b'[{"ph": "X", "ts": 0, "args": {"device": 1.0}}]',
    "bytes past 2**53": b'[{"ph": "X", "ts": 0, "args": {"bytes": 9007199254740993}}]',
    "args a list": b'[{"ph": "X", "ts": 0, "args": [1, 2]}]',
    "an entry not an object": b'[{"ph": "X", "ts": 0}, 5]',
    "a trailing comma": b'[{"ph": "X", "ts": 0,}]',
    "a leading zero": b'[{"ph": "X", "ts": 01}]',
    "a control character": b'[{"ph": "X", "name": "a\x01b", "ts": 0}]',
    "a bad escape": b'[{"ph": "X", "name": "a\\qb", "ts": 0}]',
    "not UTF-8": b'[{"ph": "X", "name": "a\xff", "ts": 0}]',
    "not UTF-8 in args": b'[{"ph": "X", "ts": 0, "args": {"x": "\xc3("}}]',
    "a lone surrogate": b'[{"ph": "X", "name": "\\ud800", "ts": 0}]',
    "nested past the limit": b'[{"ph": "X", "ts": 0, "args": {"a": '
    + b"[" * 300
    + b"]" * 300
    + b"}}]",
    "text after the list": b'[{"ph": "X", "ts": 0}] x',
    "cut short": b'[{"ph": "X", "ts": 0',
}


@needs_scanner
@pytest.mark.parametrize("text", TAKEN.values(), ids=TAKEN.keys())
def test_runs_it_takes_equal_msgspecs(text: bytes) -> None:
    assert same_or_declined(text), "declined a run it should take"


@needs_scanner
@pytest.mark.parametrize("text", DECLINED.values(), ids=DECLINED.keys())
def test_runs_it_leaves_to_msgspec(text: bytes) -> None:
    assert fields.batch(text, 0, cols.IdMaps()) is None


def test_named_ids_numbered_across_runs() -> None:
    """A file's string ids are numbered in order of first appearance over all its runs,
    whichever path reads each run (the map is the reader's, shared)."""
    runs = [
        b'[{"ph": "X", "tid": "b", "ts": 0}]',
        b'[{"ph": "X", "tid": "a", "ts": 0}]',
        b'[{"ph": "X", "tid": "a", "name": 5, "ts": 0}, {"ph": "X", "tid": "c", "ts": 0}]',
    ]
    ctx = cols.IdMaps()
    tids = []
    for text in runs:
        batch = fields.batch(text, 0, ctx)
        if batch is None:  # the third run (a number as a name): msgspec's path
            batch = cols.columns(decode._EVENTS_DEC.decode(text), 0, ctx)
        tids += batch.column("tid").to_pylist()
    assert tids == [-1, -2, -2, -3]
    assert ctx.string_ids["tid"] == {"b": -1, "a": -2, "c": -3}


@needs_scanner
@pytest.mark.parametrize("pids", [b'-7, "a", -1, 3', b"-7, -3, 3", b'"a", 2'])
def test_a_pieces_maps_see_its_real_negative_ids(pids: bytes) -> None:
    """A piece of a file cut in byte ranges keeps the real negative pid closest to zero, which
    its own codes for strings could be mistaken for (split.py): seen on either path."""
    from xpuprof.formats.kineto.split import _PieceIds

    text = b"[" + b",".join(b'{"ph": "X", "ts": 0, "pid": %s}' % p for p in pids.split(b", "))
    text += b"]"
    fast, slow = _PieceIds(), _PieceIds()
    assert fields.batch(text, 0, fast) is not None
    cols.columns(decode._EVENTS_DEC.decode(text), 0, slow)
    assert fast.real_negative == slow.real_negative
    assert fast.string_ids == slow.string_ids


@needs_scanner
def test_a_declined_run_leaves_the_id_maps_alone(tmp_path: Path) -> None:
    """A run declined late (its first entry's flow id is not UTF-8) must not have numbered its
    string tids: msgspec's path rejects that entry before numbering any, the lenient walker
    drops it, and the next entry's tid "b" is the file's first string id, -1."""
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "ts": 0, "tid": "a", "id": "\xc3("},'
                     b'{"ph": "X", "ts": 1, "tid": "b"}]}')  # fmt: skip
    fast = decode.read(path, lenient=True)
    assert fast.string_ids["tid"] == {"-1": "b"}
    assert fast.tables["events"]["tid"].to_pylist() == [-1]


@needs_scanner
def test_scratch_memory_is_reused_then_given_back(tmp_path: Path) -> None:
    """The scan's per-entry arrays are handed over without a copy and their memory reused by
    the next scan; a file's read gives it all back (nothing held between reads, as anything
    that runs inside a training process must)."""
    import numpy as np

    scanner = fields.scanner
    scanner.trim()
    entries = [b'{"ph": "X", "ts": %d, "dur": 1, "name": "op%d", "args": {"External id": %d}}'
               % (i, i, i) for i in range(3000)]  # fmt: skip
    got = scanner.scan(b"[" + b",".join(entries) + b"]")
    n, kinds, ivals = got[0], got[1], got[2]
    assert n == 3000
    assert memoryview(kinds).readonly and memoryview(kinds).nbytes == n * len(fields.FIELDS)
    ext = np.frombuffer(ivals, dtype=np.int64).reshape(n, -1)[:, fields.FIELDS.index("External id")]
    assert ext.tolist() == list(range(3000))  # the values the text holds, by hand
    assert scanner.kept() == 0  # all three arrays in use
    del got, kinds, ivals, ext
    held = scanner.kept()
    assert held >= 3000 * len(fields.FIELDS) * (1 + 8 + 16)
    # a shorter run reuses that memory, and sees none of the longer run's values
    assert same_or_declined(b'[{"ph": "X", "ts": 5, "name": "x"}, {"ph": "i", "ts": 6}]')
    assert scanner.kept() == held
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": [' + b",".join(entries) + b"]}")
    raw = decode.read(path)
    assert raw.tables["events"].num_rows == 3000
    assert scanner.kept() == 0


@needs_scanner
def test_threads_scanning_at_once_each_get_their_own_arrays() -> None:
    """The scan lets the GIL go, so two threads can scan at once and share the kept memory: each
    must still see its own run's values, never the other's."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    at = fields.FIELDS.index("External id")

    def run(k: int) -> bool:
        entry = b'{"ph": "X", "ts": 0, "args": {"External id": %d}}'
        text = b"[" + b",".join(entry % (k * 10**6 + i) for i in range(2000 + k)) + b"]"
        for _ in range(30):
            n, _kinds, ivals, _spans, _texts = fields.scanner.scan(text)
            got = np.frombuffer(ivals, dtype=np.int64).reshape(n, -1)[:, at]
            if n != 2000 + k or got.tolist() != [k * 10**6 + i for i in range(n)]:
                return False
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(run, range(8)))
    fields.trim()


# -- real traces: the whole read, scanner against msgspec --------------------------------------


def _read(path: Path, lenient: bool) -> object:
    try:
        return decode.read(path, lenient=lenient)
    except TraceFormatError as e:
        return str(e)


def _same_read(a: object, b: object) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    for k in a.tables:
        assert a.tables[k].equals(b.tables[k]), k
    for attr in ("read_phase", "read_category", "top", "string_ids", "sha256", "dropped",
                 "truncated", "notes"):  # fmt: skip
        assert getattr(a, attr) == getattr(b, attr), attr


REAL = [EXAMPLE, *kineto_files()]


@needs_scanner
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_traces_read_the_same(path: Path, monkeypatch) -> None:
    taken = []
    real_batch = fields.batch

    def counting(text, index0, ctx):
        out = real_batch(text, index0, ctx)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(fields, "batch", counting)
    fast = decode.read(path)
    assert any(taken), "the scanner declined every run of a real trace"
    monkeypatch.setattr(fields, "scanner", None)
    _same_read(fast, decode.read(path))


# -- generated runs and files ------------------------------------------------------------------

_SETTINGS = dict(
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

STRINGS = st.text(max_size=6) | st.sampled_from(["", "a\\b", '"', "é", "\n", "0x0", "12"])
#: strings written without escapes (``fuzzing.dumps`` escapes all but printable ASCII; the
#: scanner leaves escaped ids and args to msgspec)
PLAIN = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'),
                max_size=6)  # fmt: skip
INTS = st.integers(-(2**63), 2**63 - 1) | st.integers(0, 9)


def takeable(key: str) -> st.SearchStrategy:
    """Values the scanner takes in field ``key`` (nearly always), odd ones among them."""
    nothing = st.none()
    if key in ("ph", "cat", "name", "bp", "s"):
        return nothing | STRINGS
    if key == "id":
        return nothing | INTS | STRINGS
    if key in ("pid", "tid"):
        return nothing | INTS | PLAIN
    if key in ("ts", "dur"):
        return INTS | st.floats(-1e6, 1e6) | STRINGS
    if key == "bytes":
        return nothing | st.integers(-(2**53), 2**53)
    # another arg, lifted or not
    return nothing | INTS | PLAIN | st.booleans() | st.sampled_from([" 7", "-3", "1_0", "0x0"])


@st.composite
def takeable_events(draw: st.DrawFn) -> dict:
    ev: dict = {}
    for key in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp", "s"):
        if draw(st.booleans()):
            ev[key] = draw(takeable(key))
    if draw(st.booleans()):
        args = st.fixed_dictionaries({}, optional={k: takeable(k) for k in fz.ARG_KEYS})
        ev["args"] = draw(st.none() | args)
    return ev


@needs_scanner
@settings(max_examples=300, **_SETTINGS)
@given(evs=st.lists(takeable_events(), max_size=8), sep=st.sampled_from([b",", b", ", b" ,\n"]))
def test_generated_runs(evs, sep) -> None:
    same_or_declined(fz.dumps(evs, sep))


@needs_scanner
@settings(max_examples=200, **_SETTINGS)
@given(evs=st.lists(fz.events(), max_size=10), sep=st.sampled_from([b",", b", "]))
def test_hostile_runs(evs, sep) -> None:
    same_or_declined(fz.dumps(evs, sep))


@needs_scanner
@settings(max_examples=120, **_SETTINGS)
@given(doc=fz.kineto_docs(), lenient=st.booleans(), chunk=st.sampled_from([None, 64, 300]))
def test_hostile_files_read_the_same(doc, lenient, chunk, tmp_path_factory) -> None:
    """Whole files, damaged ones too: the same tables, drops and errors either way (the
    walker's runs of good entries go through the scanner as well)."""
    path = tmp_path_factory.mktemp("fields") / f"trace{doc.suffix}"
    path.write_bytes(doc.content)
    with fz.chunk_size(chunk):
        fast = _read(path, lenient)
        saved = fields.scanner
        fields.scanner = None
        try:
            slow = _read(path, lenient)
        finally:
            fields.scanner = saved
    _same_read(fast, slow)

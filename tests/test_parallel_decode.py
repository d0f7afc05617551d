"""One plain Kineto file decoded in byte ranges (``formats/kineto/split.py``) must give exactly
what the one-piece decode gives: the same raw tables, counts, maps and notes, and through
``import_traces`` on Dask the same store. Checked on real traces, on generated ones whose
strings hold every separator the cuts look for, and on files where a cut lands inside a
string or a piece is damaged (then the file is decoded in one piece, errors included).

Independent checks beside the comparison: the entries' names in ``traceEvents`` order and the
string pids come from the standard ``json`` module.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import EXAMPLE, shared

import xpuprof
from xpuprof.core.errors import XpuprofError
from xpuprof.formats.kineto import split
from xpuprof.trace import ingest

#: Strings that look like entry boundaries, brackets, quotes and escapes to a byte search.
NASTY = [
    "},{",
    '"},{"ph":"X"}',
    "}, {",
    "}\n,\n{",
    "[[[{",
    "]]]}",
    "\\",
    '\\"},{\\"',
    "\u007d,\u007b",
    "tab\tnew\nline",
    "é},{ü",
    "\U0001f600},{",
    "",
]


def _plain(t: pa.Table) -> pa.Table:
    """A table with its dictionary columns decoded and in one chunk (pieces cut the batches,
    and so the per-batch dictionaries, elsewhere than a one-piece decode)."""
    cols = []
    for c in t.columns:
        c = c.combine_chunks()
        cols.append(c.dictionary_decode() if pa.types.is_dictionary(c.type) else c)
    return pa.table(cols, names=t.column_names)


def _in_pieces(path: Path, pieces: int, sha256: str, tmp: Path) -> Any:
    """Plan, decode each range (in this process, in order) and combine."""
    plan = split.plan(path, pieces)
    assert plan is not None, "the file should be cut"
    spill = tmp / "spill"
    spill.mkdir(exist_ok=True)
    got = [
        split.decode_piece(str(path), a, z, k == 0, plan.layout, str(spill), f"p{k}")
        for k, (a, z) in enumerate(plan.ranges)
    ]
    raw = split.combine(plan.to_dict(), got, str(spill), sha256)
    assert list(spill.iterdir()) == [], "the pieces' files are removed"
    return plan, got, raw


def _assert_same(one: Any, raw: Any) -> None:
    for kind, t in one.tables.items():
        assert _plain(raw.tables[kind]).equals(_plain(t)), kind
    for f in ("read_phase", "read_category", "top", "string_ids", "size", "sha256",
              "compressed", "dropped", "truncated", "notes", "path"):  # fmt: skip
        a, b = getattr(one, f), getattr(raw, f)
        assert a == b, f
        if isinstance(a, dict):
            assert list(a) == list(b), f"{f}: key order"


@pytest.fixture
def small_pieces(monkeypatch) -> None:
    """Cut files of a few megabytes into many pieces (the thresholds are for gigabytes)."""
    monkeypatch.setattr(split, "MIN_PIECE_BYTES", 1 << 16)
    monkeypatch.setattr(split, "SPILL_BYTES", 1 << 16)
    monkeypatch.setattr(ingest, "SPLIT_MIN_BYTES", 1 << 16)


def _write(tmp: Path, doc: dict[str, Any], name: str = "t.json", **dump: Any) -> Path:
    p = tmp / name
    p.write_text(json.dumps(doc, **dump))
    return p


def _real(tmp: Path, source: Path) -> Path:
    """A real gzipped trace, decompressed (only plain text can be cut)."""
    p = tmp / source.name.removesuffix(".gz")
    p.write_bytes(gzip.decompress(source.read_bytes()))
    return p


# -- pieces put together = one piece ---------------------------------------------------------


@pytest.mark.parametrize("pieces", [2, 7])
def test_shipped_real_trace_in_pieces_equals_one_piece(tmp_path, small_pieces, pieces) -> None:
    path = _real(tmp_path, EXAMPLE)
    one = ingest.read_source(path, False)
    plan, got, raw = _in_pieces(path, pieces, one.sha256, tmp_path)
    assert len(plan.ranges) == pieces and all(g["ok"] for g in got)
    _assert_same(one, raw)
    doc = json.loads(path.read_bytes())
    assert sum(g["entries"] for g in got) == len(doc["traceEvents"])


def test_real_gpu_trace_with_string_pids_in_pieces(tmp_path, small_pieces) -> None:
    path = _real(tmp_path, shared("kineto/gpu/a100_rank0of2_nccl.json.gz"))
    one = ingest.read_source(path, False)
    _, got, raw = _in_pieces(path, 16, one.sha256, tmp_path)
    assert all(g["ok"] for g in got)
    _assert_same(one, raw)
    # the string pids, numbered in order of first appearance in the file (json's reading)
    names = []
    for e in json.loads(path.read_bytes())["traceEvents"]:
        if isinstance(e.get("pid"), str) and not e["pid"].isdigit() and e["pid"] not in names:
            names.append(e["pid"])
    assert [raw.string_ids["pid"][str(-(i + 1))] for i in range(len(names))] == names


def _nasty_trace(seed: int, n: int = 4000) -> dict[str, Any]:
    """Events whose names, args and keys hold separators, escapes and non-ASCII text; string
    pids/tids first seen in every part of the file; flows, counters, metadata, unknown keys,
    a negative dur; and an args value with a nested list of objects (``},{`` at depth > 1)."""
    rnd = random.Random(seed)
    events: list[dict[str, Any]] = []
    for i in range(n):
        name = rnd.choice(NASTY) + str(i) + rnd.choice(NASTY)
        pid: Any = rnd.choice([1, 2, f"proc {i // 500}", "Spans"])
        tid: Any = rnd.choice([7, "8", f"thread {rnd.choice(NASTY)}{i // 700}"])
        e: dict[str, Any] = {"ph": "X", "cat": rnd.choice(["cpu_op", "kernel", "x},{y"]),
                             "name": name, "pid": pid, "tid": tid, "ts": 1000 + i,
                             "dur": rnd.choice([1, 2.5, 0])}  # fmt: skip
        k = rnd.random()
        if k < 0.2:
            e["args"] = {"items": [{"a": rnd.choice(NASTY)}, {"b": [1, {"c": "},{"}]}],
                         "External id": i}  # fmt: skip
        elif k < 0.25:
            e = {"ph": rnd.choice("stf"), "id": i, "pid": pid, "tid": tid, "ts": 1000 + i,
                 "cat": "ac2g", "name": "ac2g", "bp": "e"}  # fmt: skip
        elif k < 0.3:
            e = {"ph": "C", "name": "mem", "pid": pid, "ts": 1000 + i,
                 "args": {rnd.choice(NASTY) or "x": i}}  # fmt: skip
        elif k < 0.33:
            e[rnd.choice(NASTY) or "k"] = {"unknown": rnd.choice(NASTY)}
        elif k < 0.34:
            e["dur"] = -3
        events.append(e)
    events.insert(0, {"ph": "M", "name": "process_name", "pid": "Spans", "args": {"name": "}"}})
    return {"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": events,
            "traceName": "},{", "displayTimeUnit": "ms"}  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_nasty_strings_in_pieces_equal_one_piece(tmp_path, small_pieces, seed) -> None:
    doc = _nasty_trace(seed)
    dump = {"ensure_ascii": bool(seed % 2), "indent": 1 if seed == 2 else None}
    path = _write(tmp_path, doc, **dump)
    one = ingest.read_source(path, False)
    plan, got, raw = _in_pieces(path, 4 + seed, one.sha256, tmp_path)
    assert len(plan.ranges) == 4 + seed and raw is not None  # every cut found a real boundary
    _assert_same(one, raw)
    events = raw.tables["events"]
    by_index = dict(zip(events["index"].to_pylist(), events["name"].to_pylist(), strict=True))
    expect = {i: e["name"] for i, e in enumerate(doc["traceEvents"]) if e["ph"] == "X"}
    assert by_index == expect
    assert raw.notes and "negative dur" in raw.notes[0]


def test_separators_inside_a_string_are_not_cut(tmp_path, small_pieces) -> None:
    """A name that is one long run of ``},{`` across the middle of the file: the cut goes
    after it, at an entry, and the pieces put together equal the one-piece decode."""
    events = [{"ph": "X", "name": f"e{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
              for i in range(3000)]  # fmt: skip
    events[1500]["name"] = '},{"ph":"X"},{' * 40000
    path = _write(tmp_path, {"traceEvents": events})
    text = path.read_bytes()
    hi = text.rindex(b"},{")
    plan = split.plan(path, 2)
    assert plan is not None and hi < plan.ranges[0][1]
    one = ingest.read_source(path, False)
    _, _, raw = _in_pieces(path, 2, one.sha256, tmp_path)
    _assert_same(one, raw)


def test_cut_in_a_lookalike_is_refused(tmp_path, small_pieces) -> None:
    """An args value holding a long list of objects with a ``ph`` key, across the middle of
    the file: the cut lands in it (it looks like an entry boundary), the piece before it
    fails, and nothing half-right comes out."""
    events = [{"ph": "X", "name": f"e{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
              for i in range(3000)]  # fmt: skip
    events[1500]["args"] = {"list": [{"ph": "X", "i": i} for i in range(40000)]}
    path = _write(tmp_path, {"traceEvents": events})
    text = path.read_bytes()
    lo, hi = text.index(b'"list"'), text.rindex(b'"i": 39999')
    plan = split.plan(path, 2)
    assert plan is not None and lo < plan.ranges[0][1] < hi  # the cut is inside the args
    _, got, raw = _in_pieces(path, 2, "x", tmp_path)
    assert raw is None and not got[0]["ok"]


def test_damage_in_a_piece_leaves_it_to_the_one_piece_decode(tmp_path, small_pieces) -> None:
    events = [{"ph": "X", "name": f"e{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1}
              for i in range(6000)]  # fmt: skip
    events[4500]["ts"] = "soon"
    path = _write(tmp_path, {"traceEvents": events})
    plan, got, raw = _in_pieces(path, 3, "x", tmp_path)
    assert raw is None and [g["ok"] for g in got] == [True, True, False]
    # string pids renumbered in the last piece, where a real pid -1 could be mistaken for
    # that piece's own -1: left to the one-piece decode too; a real -7 cannot, and is kept
    events[4500]["ts"] = 4500
    events[10]["pid"], events[4400]["pid"], events[4500]["pid"] = "a", "b", -1
    path = _write(tmp_path, {"traceEvents": events})
    _, got, raw = _in_pieces(path, 3, "x", tmp_path)
    assert raw is None and all(g["ok"] for g in got)
    events[4500]["pid"] = -7
    path = _write(tmp_path, {"traceEvents": events})
    one = ingest.read_source(path, False)
    _, got, raw = _in_pieces(path, 3, one.sha256, tmp_path)
    _assert_same(one, raw)
    pids = raw.tables["events"].sort_by("index")["pid"].to_pylist()
    assert (pids[10], pids[4400], pids[4500]) == (-1, -2, -7)


def test_gzip_and_small_files_are_not_cut(tmp_path) -> None:
    assert split.plan(EXAMPLE, 4) is None  # gzip: one stream, no random access
    path = _real(tmp_path, EXAMPLE)
    assert split.plan(path, 4) is None  # 3 MB, below MIN_PIECE_BYTES


# -- through import_traces on Dask -----------------------------------------------------------


def _sql(store: Path) -> list[Any]:
    with xpuprof.load(store) as s:
        return [
            s.sql(f"select * from {t} order by all")
            for t in ("events", "flows", "links", "counters", "metadata")
        ]


def test_dask_import_in_pieces_equals_in_process(tmp_path, small_pieces, monkeypatch) -> None:
    path = _real(tmp_path, EXAMPLE)
    damaged = tmp_path / "damaged.json"
    doc = json.loads(path.read_bytes())
    doc["traceEvents"][-50]["ts"] = "later"
    damaged.write_text(json.dumps(doc))
    cut = []
    plans = ingest._split_plans
    monkeypatch.setattr(ingest, "_split_plans", lambda *a: cut.append(plans(*a)) or cut[-1])

    one = xpuprof.import_traces([path], tmp_path / "one.store", workers=1)
    two = xpuprof.import_traces([path], tmp_path / "two.store", workers=2)
    assert len(cut) == 1 and len(next(iter(cut[0].values())).ranges) >= 2  # it was cut
    assert two.rows == one.rows and two.levels == one.levels
    for a, b in zip(_sql(tmp_path / "one.store"), _sql(tmp_path / "two.store"), strict=True):
        assert a.equals(b)
    assert [s["sha256"] for s in two.sources] == [s["sha256"] for s in one.sources]
    assert not (tmp_path / "two.store" / ".pieces").exists()
    # a damaged piece: the same error as a one-piece import, and the same lenient store
    with pytest.raises(XpuprofError) as strict_one:
        xpuprof.import_traces([damaged], tmp_path / "d1.store", workers=1)
    with pytest.raises(XpuprofError) as strict_two:
        xpuprof.import_traces([damaged], tmp_path / "d2.store", workers=2)
    assert str(strict_two.value) == str(strict_one.value)
    assert not (tmp_path / "d2.store").exists()
    l1 = xpuprof.import_traces([damaged], tmp_path / "l1.store", workers=1, lenient=True)
    l2 = xpuprof.import_traces([damaged], tmp_path / "l2.store", workers=2, lenient=True)
    assert l2.sources[0]["read"]["dropped"] == l1.sources[0]["read"]["dropped"] != []
    for a, b in zip(_sql(tmp_path / "l1.store"), _sql(tmp_path / "l2.store"), strict=True):
        assert a.equals(b)


def test_which_files_are_cut(tmp_path, small_pieces) -> None:
    """Only a plain file that holds more than one worker's share of the input is cut."""
    big = _real(tmp_path, EXAMPLE)
    twin = tmp_path / "twin.json"
    twin.write_bytes(big.read_bytes())
    size = big.stat().st_size
    alone = ingest._split_plans([(big, 0)], size, 2)
    assert list(alone) == [0] and len(alone[0].ranges) == 4  # two ranges per worker
    assert ingest._split_plans([(big, 0), (twin, 1)], 2 * size, 2) == {}  # a share each
    assert ingest._split_plans([(EXAMPLE, 0)], EXAMPLE.stat().st_size, 2) == {}  # gzip
    assert ingest._split_plans([(big, 0)], size, 1) == {}  # one worker: nothing to share

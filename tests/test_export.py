"""Chrome-trace export: a store written back out re-imports to the same counts, times and args.

Every expectation is computed here from the raw source JSON (parsed with ``json`` and decimal
numbers, independently of the importer), or from the store the export started from.
"""

from __future__ import annotations

import functools
import gzip
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import EXAMPLE, cli, no_gc, shared

import xpuprof
from xpuprof.core.errors import XpuprofError
from xpuprof.export import chrome
from xpuprof.export.chrome import export_chrome

SHARED = [
    "gpu/v100_ns_resolution.json.gz",
    "gpu/resnet50_v100_2021/num_workers_0.pt.trace.json.gz",
    "gpu/a100_rank0of2_nccl.json.gz",
    "edge/large_integer.json.gz",
    "edge/old_categories_inference.json.gz",
    "cpu/gloo_rank34of300.json.gz",
    "gpu/mtia_inference.json.gz",
]

#: A trace with what the real ones lack: B/E pairs (one E with args, one with an unknown key),
#: an unmatched E and B, counters with two series and a string pid, an M without ts, instants
#: with scopes, a t flow with a string id, unknown top-level keys (``tts``), an integer beyond
#: 2**64 in args and at the top level, and strings that need escaping.
SYNTHETIC = r"""{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Fake GPU"}],
 "customTop": {"x": 18446744073709551617},
 "traceEvents": [
  {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "synthetic"}},
  {"ph": "M", "name": "thread_name", "pid": 1, "tid": "main thread", "ts": 0,
   "args": {"name": "main"}},
  {"ph": "B", "cat": "user_annotation", "name": "outer", "pid": 1, "tid": "main thread",
   "ts": 100.5, "args": {"a": 1}},
  {"ph": "B", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": "main thread", "ts": 101.25,
   "tts": 7},
  {"ph": "E", "pid": 1, "tid": "main thread", "ts": 150.125, "args": {"out": 2}},
  {"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": "main thread", "ts": 151,
   "dur": 2.001, "tts": 9, "args": {"big": 123456789012345678901234567890, "f": 1.50}},
  {"ph": "E", "pid": 1, "tid": "main thread", "ts": 200, "tts": 11},
  {"ph": "E", "pid": 1, "tid": 2, "ts": 300},
  {"ph": "B", "cat": "cpu_op", "name": "open", "pid": 1, "tid": 2, "ts": 310},
  {"ph": "C", "name": "memory", "pid": 1, "tid": 0, "ts": 120,
   "args": {"allocated": 10, "reserved": 20.5}},
  {"ph": "C", "cat": "counter", "name": "util", "pid": "Counters", "ts": 130.001,
   "args": {"gpu": 0.5}},
  {"ph": "i", "cat": "cpu_instant_event", "name": "mark", "pid": 1, "tid": "main thread",
   "ts": 140, "s": "t"},
  {"ph": "I", "name": "global", "pid": 1, "tid": 0, "ts": 141, "s": "g"},
  {"ph": "s", "cat": "ac2g", "name": "launch", "id": 42, "pid": 1, "tid": "main thread",
   "ts": 151.5},
  {"ph": "f", "cat": "ac2g", "name": "launch", "id": 42, "pid": 0, "tid": 7, "ts": 160,
   "bp": "e"},
  {"ph": "t", "cat": "custom", "name": "step", "id": "flow-a", "pid": 1, "tid": "main thread",
   "ts": 152},
  {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 160, "dur": 5,
   "args": {"correlation": 42, "device": 0, "stream": 7}},
  {"ph": "X", "cat": "weird \"cat\"\n", "name": "\u00e9 \u2603 \u0001", "pid": 0, "tid": 7,
   "ts": 0.001, "dur": 0.5}
 ]}"""


#: Shared traces whose round trip several tests read: made once and kept for the module.
REUSED = ("gpu/v100_ns_resolution.json.gz", "edge/large_integer.json.gz")


# ----------------------------------------------------------------------------------------------
# independent expectations, from the raw JSON
# ----------------------------------------------------------------------------------------------


def _load_json(path: Path) -> Any:
    """The document with every number exact (floats as Decimal)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f, no_gc():
        return json.loads(f.read(), parse_float=Decimal)


@functools.lru_cache(maxsize=4)
def _load_source(path: Path) -> Any:
    """A source trace's document, parsed once for the tests that read it (never modified)."""
    return _load_json(path)


def _entries(doc: Any) -> list[dict[str, Any]]:
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _raw_counts(entries: list[dict[str, Any]]) -> tuple[Counter, Counter]:
    phase = Counter(e["ph"] for e in entries)
    cat = Counter(e.get("cat") or "" for e in entries)
    return phase, cat


def _ns(v: Any) -> int | None:
    return None if v is None else int(Decimal(v) * 1000)


def _args_texts(values: list[str | None]) -> list[Any]:
    """The ``args`` JSON texts of many events decoded, numbers exact (one parse for all)."""
    text = "[" + ",".join("null" if v is None else v for v in values) + "]"
    with no_gc():
        return json.loads(text, parse_float=Decimal)


# ----------------------------------------------------------------------------------------------
# what a store holds, from its tables
# ----------------------------------------------------------------------------------------------


def _labels(column: Any) -> Counter:
    """How often each value occurs in a string column, a missing value counted as ""."""
    return Counter(pc.fill_null(column.cast(pa.string()), "").to_pylist())


def _store_counts(trace: Any) -> tuple[Counter, Counter]:
    """Counts per phase and category of the source entries a store accounts for: events (a B
    with a duration stands for a B and its E), flows, counters (one per entry) and metadata."""
    ev = trace.table("events", columns=["phase", "category", "dur"])
    phase, cat = _labels(ev["phase"]), _labels(ev["category"])
    pairs = pc.sum(pc.and_(pc.equal(ev["phase"], "B"), pc.is_valid(ev["dur"]))).as_py() or 0
    phase["E"] += pairs
    cat[""] += pairs  # the importer keeps no category for the E of a pair
    fl = trace.table("flows", columns=["phase", "category"])
    phase += _labels(fl["phase"])
    cat += _labels(fl["category"])
    co = trace.table("counters", columns=["part", "index", "category"]).to_pydict()
    seen = dict(zip(zip(co["part"], co["index"], strict=True), co["category"], strict=True))
    phase["C"] += len(seen)
    cat.update(c or "" for c in seen.values())
    md = trace.table("metadata", columns=["category"])
    phase["M"] += md.num_rows
    cat += _labels(md["category"])
    return +phase, +cat


def _times(trace: Any) -> dict[str, dict[tuple[int, int], tuple[int, int | None]]]:
    out = {}
    for name in ("events", "flows", "counters", "metadata"):
        cols = ["part", "index", "ts"] + (["dur"] if name == "events" else [])
        d = trace.table(name, columns=cols).to_pydict()
        durs = d.get("dur", [None] * len(d["ts"]))
        out[name] = {
            (p, i): (t, u) for p, i, t, u in zip(d["part"], d["index"], d["ts"], durs, strict=True)
        }
    return out


def _sorted_times(trace: Any, name: str) -> pa.Table:
    """(part, index, ts[, dur]) of every row of table ``name``, in (part, index) order."""
    cols = ["part", "index", "ts"] + (["dur"] if name == "events" else [])
    return trace.table(name, columns=cols).sort_by([("part", "ascending"), ("index", "ascending")])


def _manifest_totals(trace: Any) -> tuple[dict[str, int], dict[str, int]]:
    rows = {k: v for k, v in trace.manifest["rows"].items() if v}
    return rows, dict(trace.manifest["levels"])


# ----------------------------------------------------------------------------------------------
# the round trip
# ----------------------------------------------------------------------------------------------


def _check_file_against_source(src_entries: list[dict], out_entries: list[dict]) -> None:
    """The exported entries are the source's, in order: phase, category, name, times (exact
    decimals), flow ids and args."""
    assert len(out_entries) == len(src_entries)
    assert Counter(e["ph"] for e in out_entries) == Counter(e["ph"] for e in src_entries)
    for k, (a, b) in enumerate(zip(src_entries, out_entries, strict=True)):
        if a == b:  # the same keys and values: every check below holds
            continue
        where = f"entry {k}: {a} vs {b}"
        assert a["ph"] == b["ph"], where
        for key in ("cat", "name", "s", "bp"):
            assert a.get(key) == b.get(key), where
        for key in ("ts", "dur"):
            assert _ns(a.get(key)) == _ns(b.get(key)), where
        if "id" in a:
            assert str(a["id"]) == str(b["id"]), where
        assert a.get("args") == b.get("args"), where


@dataclass
class Roundtrip:
    """A source imported (``first``), exported to ``out`` and the export imported (``again``)."""

    src: Path
    first: Any
    again: Any
    out: Path

    def close(self) -> None:
        self.first.close()
        self.again.close()


def _roundtrip(src: Path, tmp: Path) -> Roundtrip:
    a = xpuprof.import_traces([src], tmp / "a")
    assert not a.noop
    first = xpuprof.load(tmp / "a")
    out = tmp / "x.json.gz"
    summary = export_chrome(first, out)
    raw = _entries(_load_source(src))
    assert summary == {
        "path": str(out),
        "sources": 1,
        "events": len(raw),
        "bytes": out.stat().st_size,
    }
    xpuprof.import_traces([out], tmp / "b")
    return Roundtrip(src, first, xpuprof.load(tmp / "b"), out)


def _check(rt: Roundtrip) -> None:
    """The round trip kept everything: counts, entries, top-level keys, times and args."""
    first, again, out = rt.first, rt.again, rt.out
    src_doc = _load_source(rt.src)
    raw = _entries(src_doc)
    phase, cat = _raw_counts(raw)
    # counts: the store before and after agree with each other and with the raw JSON
    assert _store_counts(first) == (phase, cat)
    assert _store_counts(again) == (phase, cat)
    assert _manifest_totals(again) == _manifest_totals(first)
    # the exported file itself: same entries, same order, exact times, same args
    out_doc = _load_json(out)
    _check_file_against_source(raw, _entries(out_doc))
    # top-level keys come back
    if isinstance(src_doc, dict):
        assert {k: v for k, v in out_doc.items() if k != "traceEvents"} == {
            k: v for k, v in src_doc.items() if k != "traceEvents"
        }
    # every ts/dur identical in ns, row by row in (part, index) order
    for name in ("events", "flows", "counters", "metadata"):
        assert _sorted_times(first, name).equals(_sorted_times(again, name)), name
    ev = _sorted_times(again, "events").to_pydict()
    for i, ts in zip(ev["index"], ev["ts"], strict=True):
        assert ts == _ns(raw[i]["ts"]), i
    # args of every event equal the source's
    ev = again.table("events", columns=["index", "phase", "args"]).to_pydict()
    args = _args_texts(ev["args"])
    for i, ph, a in zip(ev["index"], ev["phase"], args, strict=True):
        assert raw[i]["ph"] == ph
        assert a == raw[i].get("args"), i


def _check_roundtrip(src: Path, tmp: Path) -> None:
    rt = _roundtrip(src, tmp)
    try:
        _check(rt)
    finally:
        rt.close()


@pytest.fixture(scope="module")
def reused(tmp_path_factory) -> Iterator[dict[str, Roundtrip]]:
    """The round trips of the REUSED shared traces, made on first use and kept for the module."""
    made: dict[str, Roundtrip] = {}

    class Lazy(dict):
        def __missing__(self, rel: str) -> Roundtrip:
            src = shared(f"kineto/{rel}")
            made[rel] = self[rel] = _roundtrip(src, tmp_path_factory.mktemp("roundtrip"))
            return made[rel]

    yield Lazy()
    for rt in made.values():
        rt.close()


@pytest.mark.parametrize("rel", SHARED)
def test_roundtrip_shared_trace(rel: str, tmp_path: Path, reused: dict[str, Roundtrip]) -> None:
    if rel in REUSED:
        _check(reused[rel])
    else:
        _check_roundtrip(shared(f"kineto/{rel}"), tmp_path)


def test_roundtrip_shipped_example(tmp_path: Path) -> None:
    _check_roundtrip(EXAMPLE, tmp_path)


def test_roundtrip_synthetic(tmp_path: Path) -> None:
    src = tmp_path / "synthetic.json"
    src.write_text(SYNTHETIC)
    _check_roundtrip(src, tmp_path)
    text = (tmp_path / "x.json.gz").read_bytes()
    out = _entries(_load_json(tmp_path / "x.json.gz"))
    raw = _entries(_load_json(src))
    # keys the data model has no column for travel in ``extra`` and come back as keys
    assert [e.get("tts") for e in out] == [e.get("tts") for e in raw]
    # string pids/tids come back as strings; an M without ts stays without one
    ids = [(e.get("pid"), e.get("tid")) for e in raw]
    assert [(e.get("pid"), e.get("tid")) for e in out] == ids
    assert "ts" not in out[0]
    # flow ids: Kineto's integers as numbers, other ids as strings
    assert [e["id"] for e in out if "id" in e] == [42, 42, "flow-a"]
    assert json.loads(gzip.decompress(text))["customTop"] == {"x": 18446744073709551617}


def test_ns_decimals_written_exactly(reused: dict[str, Roundtrip]) -> None:
    rt = reused["gpu/v100_ns_resolution.json.gz"]
    text = gzip.decompress(rt.out.read_bytes()).decode()
    # the first event of the file, as Kineto wrote it (no float could carry this)
    assert '"ts":1712195495519689.047,' in text
    raw = _entries(_load_source(rt.src))
    with_ns = [e for e in raw if isinstance(e.get("ts"), Decimal) and e["ts"] % 1]
    assert with_ns, "the trace should carry nanosecond decimals"
    for e in with_ns[:1000]:
        assert f'"ts":{e["ts"].normalize():f}' in text


def test_large_integer_args_byte_exact(reused: dict[str, Roundtrip]) -> None:
    rt = reused["edge/large_integer.json.gz"]
    text = gzip.decompress(rt.out.read_bytes()).decode()
    assert '"args":{"Comms Id": 10159970886766084423}' in text
    args = rt.again.table("events", columns=["args"])["args"].to_pylist()
    assert '{"Comms Id": 10159970886766084423}' in args


# ----------------------------------------------------------------------------------------------
# several ranks
# ----------------------------------------------------------------------------------------------


@dataclass
class Dlrm:
    """The 8-rank DLRM store (imported once for the suite) and its source documents."""

    first: Any
    files: list[Path]
    docs: dict[Path, Any]

    def rank_of(self, path: Path) -> int:
        return self.docs[path]["distributedInfo"]["rank"]


@pytest.fixture(scope="module")
def dlrm(dlrm_store) -> Dlrm:
    first, files = dlrm_store
    assert len(files) == 8
    return Dlrm(first, files, {f: _load_json(f) for f in files})


def test_export_directory_one_file_per_rank(tmp_path: Path, dlrm: Dlrm) -> None:
    first, files = dlrm.first, dlrm.files
    out = tmp_path / "out"
    summary = export_chrome(first, str(out) + "/")
    names = sorted(Path(f).name for f in summary["files"])
    assert names == [f"rank{r}.pt.trace.json.gz" for r in range(8)]
    raw_by_rank = {dlrm.rank_of(f): _entries(dlrm.docs[f]) for f in files}
    assert summary["sources"] == 8
    assert summary["events"] == sum(len(v) for v in raw_by_rank.values())
    assert summary["bytes"] == sum(Path(f).stat().st_size for f in summary["files"])
    assert sorted(p.name for p in out.iterdir()) == names  # no temporary files left
    for r, raw in raw_by_rank.items():
        _check_file_against_source(raw, _entries(_load_json(out / f"rank{r}.pt.trace.json.gz")))
    xpuprof.import_traces([out], tmp_path / "b")
    again = xpuprof.load(tmp_path / "b")
    assert sorted(again.ranks) == list(range(8))
    assert _manifest_totals(again) == _manifest_totals(first)
    phase: Counter = Counter()
    cat: Counter = Counter()
    for raw in raw_by_rank.values():
        p, c = _raw_counts(raw)
        phase += p
        cat += c
    assert _store_counts(again) == (phase, cat)
    by_rank = {s["rank"]: s["part"] for s in first.sources}
    by_rank_again = {s["rank"]: s["part"] for s in again.sources}
    t0, t1 = _times(first), _times(again)
    for name in t0:
        remap = {
            (by_rank_again[r], i): v
            for r in by_rank
            for (p, i), v in t0[name].items()
            if p == by_rank[r]
        }
        assert remap == t1[name], name
    # an existing directory works the same way
    again.close()
    existing = tmp_path / "existing"
    existing.mkdir()
    assert export_chrome(first, existing)["events"] == summary["events"]


def test_export_merged_ranks(tmp_path: Path, dlrm: Dlrm) -> None:
    first, files = dlrm.first, dlrm.files
    out = tmp_path / "merged.json.gz"
    summary = export_chrome(first, out)
    raws = [_entries(dlrm.docs[f]) for f in sorted(files, key=dlrm.rank_of)]
    total = sum(len(r) for r in raws)
    assert summary == {"path": str(out), "sources": 8, "events": total, "bytes": out.stat().st_size}
    doc = _load_json(out)
    entries = doc["traceEvents"]
    # ranks are written one after the other, each in its own order
    max_id = max(e["id"] for raw in raws for e in raw if "id" in e)
    step = 10 ** len(str(max_id))
    k = 0
    for rank, raw in enumerate(raws):
        mine = entries[k : k + len(raw)]
        k += len(raw)
        for a, b in zip(raw, mine, strict=True):
            assert a["ph"] == b["ph"] and a.get("name") == b.get("name")
            assert _ns(a.get("ts")) == _ns(b.get("ts")) and _ns(a.get("dur")) == _ns(b.get("dur"))
            assert b["pid"] == f"rank {rank}/pid {a['pid']}"
            assert b.get("tid") == a.get("tid")
            if "id" in a:  # Kineto's flow ids are ints: shifted past the previous ranks' ids
                assert b["id"] == a["id"] + rank * step
            if a["ph"] == "M" and a["name"] == "process_name":
                assert b["args"] == {"name": f"rank {rank}: {a['args']['name']}"}
            else:
                assert b.get("args") == a.get("args")
    # per-rank top-level keys are kept per source; shared ones stay at the top
    assert "distributedInfo" not in doc
    assert [s["meta"]["distributedInfo"]["rank"] for s in doc["xpuprofSources"]] == list(range(8))
    assert doc["schemaVersion"] == dlrm.docs[files[0]]["schemaVersion"]
    # re-import: one source with every entry, counts equal the sum of the ranks
    xpuprof.import_traces([out], tmp_path / "b")
    again = xpuprof.load(tmp_path / "b")
    assert len(again.sources) == 1
    phase: Counter = Counter()
    cat: Counter = Counter()
    for raw in raws:
        p, c = _raw_counts(raw)
        phase += p
        cat += c
    assert _store_counts(again) == (phase, cat)
    rows0, levels0 = _manifest_totals(first)
    rows1, levels1 = _manifest_totals(again)
    assert rows1 == rows0
    assert levels1 == levels0
    # processes of different ranks stay apart
    pids_per_rank = sum(len({e["pid"] for e in raw if "pid" in e}) for raw in raws)
    ev = again.table("events", columns=["pid"])
    md = again.table("metadata", columns=["pid"])
    fl = again.table("flows", columns=["pid"])
    distinct = set(pc.unique(ev["pid"]).to_pylist())
    distinct |= set(pc.unique(md["pid"]).to_pylist()) | set(pc.unique(fl["pid"]).to_pylist())
    assert len(distinct) == pids_per_rank
    again.close()


def test_parts_without_rank_or_with_repeated_rank(tmp_path: Path) -> None:
    """Three parts: one without a rank, two with the same rank. File names and merged pids stay
    distinct, and the merged file re-imports to the sum of the parts (B/E pairs, counters,
    string flow ids included)."""
    ranked = SYNTHETIC.replace(
        '"schemaVersion": 1,', '"schemaVersion": 1, "distributedInfo": {"rank": 3},'
    )
    (tmp_path / "in").mkdir()
    srcs = [tmp_path / "in" / n for n in ("a.json", "b.json", "c.json")]
    srcs[0].write_text(SYNTHETIC)
    srcs[1].write_text(ranked)
    srcs[2].write_text(ranked.replace('"name": "x"', '"name": "y"'))
    xpuprof.import_traces(srcs, tmp_path / "a")
    first = xpuprof.load(tmp_path / "a")
    assert sorted(first.ranks) == [0, 3, 3]  # a part without a rank is rank 0
    raw = [_entries(_load_json(p)) for p in srcs]
    n_raw = sum(len(r) for r in raw)

    summary = export_chrome(first, tmp_path / "dir")  # no trailing slash: a new file
    assert summary["sources"] == 3 and (tmp_path / "dir").is_file()
    summary = export_chrome(first, str(tmp_path / "d") + "/")
    assert sorted(Path(f).name for f in summary["files"]) == [
        "rank0.pt.trace.json.gz",
        "rank3.part2.pt.trace.json.gz",
        "rank3.pt.trace.json.gz",
    ]
    assert summary["events"] == n_raw

    out = tmp_path / "merged.json"
    assert export_chrome(first, out)["events"] == n_raw
    entries = _entries(_load_json(out))
    # rank order (the part without a rank is rank 0)
    labels = ["rank 0", "rank 3 part 1", "rank 3 part 2"]
    order = [raw[0], raw[1], raw[2]]
    k = 0
    for label, part_raw in zip(labels, order, strict=True):
        for a in part_raw:
            b = entries[k]
            k += 1
            assert b["ph"] == a["ph"] and _ns(b.get("ts")) == _ns(a.get("ts"))
            assert b["pid"] == f"{label}/pid {a['pid']}"
            if a.get("id") == "flow-a":
                assert b["id"] == f"{label}/flow-a"
    xpuprof.import_traces([out], tmp_path / "b")
    again = xpuprof.load(tmp_path / "b")
    phase: Counter = Counter()
    cat: Counter = Counter()
    for r in raw:
        p, c = _raw_counts(r)
        phase += p
        cat += c
    assert _store_counts(again) == (phase, cat)
    assert _manifest_totals(again) == _manifest_totals(first)
    again.close()
    first.close()


# ----------------------------------------------------------------------------------------------
# errors, the CLI
# ----------------------------------------------------------------------------------------------


def test_error_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example_store
) -> None:
    trace, _ = example_store
    with pytest.raises(XpuprofError, match="does not exist"):
        export_chrome(trace, tmp_path / "no" / "such" / "x.json.gz")
    assert not (tmp_path / "no").exists()

    real = chrome._chunks

    def failing(blocks: Any) -> Any:
        it = real(blocks)
        yield next(it)
        raise OSError("disk full")

    monkeypatch.setattr(chrome, "_chunks", failing)
    monkeypatch.setattr(chrome, "CHUNK_ENTRIES", 1000)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(OSError, match="disk full"):
        export_chrome(trace, out_dir / "x.json.gz")
    assert list(out_dir.iterdir()) == []
    with pytest.raises(OSError, match="disk full"):
        export_chrome(trace, str(tmp_path / "new_dir") + "/")
    assert not (tmp_path / "new_dir").exists()


def test_small_chunks_keep_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunk boundaries fall between interleaved tables (events, flows, counters, metadata)
    and between a B and its E."""
    src = tmp_path / "synthetic.json"
    src.write_text(SYNTHETIC)
    monkeypatch.setattr(chrome, "CHUNK_ENTRIES", 3)
    _check_roundtrip(src, tmp_path / "s")
    monkeypatch.setattr(chrome, "CHUNK_ENTRIES", 97)
    _check_roundtrip(EXAMPLE, tmp_path / "e")


def test_cli_export_json(tmp_path: Path, example_store) -> None:
    trace, _ = example_store
    out = tmp_path / "out.json.gz"
    proc = cli("export", trace.path, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    raw = _entries(_load_source(EXAMPLE))
    assert summary["events"] == len(raw)
    assert summary["sources"] == 1
    assert summary["bytes"] == out.stat().st_size
    assert Path(summary["path"]) == out
    assert Counter(e["ph"] for e in _entries(_load_json(out))) == _raw_counts(raw)[0]

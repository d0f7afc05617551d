"""Chrome-trace export: a store written back out re-imports to the same counts, times and args.

Every expectation is computed here from the raw source JSON (parsed with ``json`` and decimal
numbers, independently of the importer), or from the store the export started from.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

import xpuprof
from xpuprof.core.errors import XpuprofError
from xpuprof.export import chrome
from xpuprof.export.chrome import export_chrome

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
KINETO = TRACES / "kineto"
EXAMPLE = ROOT / "src" / "xpuprof" / "data" / "example_cpu_train.pt.trace.json.gz"
DLRM = KINETO / "gpu" / "dlrm_8rank_v100"

SHARED_TRACES = [
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


def _need(path: Path) -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"shared traces not found at {TRACES} (the ../shared checkout is absent)")
    if not path.exists():
        pytest.skip(f"{path} is missing from the shared traces")
    return path


# ----------------------------------------------------------------------------------------------
# independent expectations, from the raw JSON
# ----------------------------------------------------------------------------------------------


def _load_json(path: Path) -> Any:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        return json.loads(f.read(), parse_float=Decimal)


def _entries(doc: Any) -> list[dict[str, Any]]:
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def _raw_counts(entries: list[dict[str, Any]]) -> tuple[Counter, Counter]:
    phase = Counter(e["ph"] for e in entries)
    cat = Counter(e.get("cat") or "" for e in entries)
    return phase, cat


def _ns(v: Any) -> int | None:
    return None if v is None else int(Decimal(v) * 1000)


def _args_text(v: Any) -> Any:
    return None if v is None else json.loads(v, parse_float=Decimal)


# ----------------------------------------------------------------------------------------------
# what a store holds, from its tables
# ----------------------------------------------------------------------------------------------


def _store_counts(trace: Any) -> tuple[Counter, Counter]:
    """Counts per phase and category of the source entries a store accounts for: events (a B
    with a duration stands for a B and its E), flows, counters (one per entry) and metadata."""
    phase: Counter = Counter()
    cat: Counter = Counter()
    ev = trace.table("events", columns=["phase", "category", "dur"]).to_pydict()
    for ph, c, d in zip(ev["phase"], ev["category"], ev["dur"], strict=True):
        phase[ph] += 1
        cat[c or ""] += 1
        if ph == "B" and d is not None:
            phase["E"] += 1
            cat[""] += 1  # the importer keeps no category for the E of a pair
    fl = trace.table("flows", columns=["phase", "category"]).to_pydict()
    phase.update(fl["phase"])
    cat.update(c or "" for c in fl["category"])
    co = trace.table("counters", columns=["part", "index", "category"]).to_pydict()
    seen = {}
    for p, i, c in zip(co["part"], co["index"], co["category"], strict=True):
        seen[(p, i)] = c
    phase["C"] += len(seen)
    cat.update(c or "" for c in seen.values())
    md = trace.table("metadata", columns=["category"]).to_pydict()
    phase["M"] += len(md["category"])
    cat.update(c or "" for c in md["category"])
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
        where = f"entry {k}: {a} vs {b}"
        assert a["ph"] == b["ph"], where
        for key in ("cat", "name", "s", "bp"):
            assert a.get(key) == b.get(key), where
        for key in ("ts", "dur"):
            assert _ns(a.get(key)) == _ns(b.get(key)), where
        if "id" in a:
            assert str(a["id"]) == str(b["id"]), where
        assert a.get("args") == b.get("args"), where


def _roundtrip(src: Path, tmp: Path) -> tuple[Any, Any, Path]:
    a = xpuprof.import_traces([src], tmp / "a")
    assert not a.noop
    first = xpuprof.load(tmp / "a")
    out = tmp / "x.json.gz"
    summary = export_chrome(first, out)
    raw = _entries(_load_json(src))
    assert summary == {
        "path": str(out),
        "sources": 1,
        "events": len(raw),
        "bytes": out.stat().st_size,
    }
    xpuprof.import_traces([out], tmp / "b")
    return first, xpuprof.load(tmp / "b"), out


def _check_roundtrip(src: Path, tmp: Path) -> None:
    first, again, out = _roundtrip(src, tmp)
    src_doc = _load_json(src)
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
    # every ts/dur identical in ns, joined on (part, index)
    t0, t1 = _times(first), _times(again)
    assert t0 == t1
    for (_, i), (ts, _dur) in t1["events"].items():
        assert ts == _ns(raw[i]["ts"]), i
    # args of every event equal the source's
    ev = again.table("events", columns=["index", "phase", "args"]).to_pydict()
    for i, ph, args in zip(ev["index"], ev["phase"], ev["args"], strict=True):
        assert raw[i]["ph"] == ph
        assert _args_text(args) == raw[i].get("args"), i


@pytest.mark.parametrize("rel", SHARED_TRACES)
def test_roundtrip_shared_trace(rel: str, tmp_path: Path) -> None:
    _check_roundtrip(_need(KINETO / rel), tmp_path)


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


def test_ns_decimals_written_exactly(tmp_path: Path) -> None:
    src = _need(KINETO / "gpu" / "v100_ns_resolution.json.gz")
    _, _, out = _roundtrip(src, tmp_path)
    text = gzip.decompress(out.read_bytes()).decode()
    # the first event of the file, as Kineto wrote it (no float could carry this)
    assert '"ts":1712195495519689.047,' in text
    raw = _entries(_load_json(src))
    with_ns = [e for e in raw if isinstance(e.get("ts"), Decimal) and e["ts"] % 1]
    assert with_ns, "the trace should carry nanosecond decimals"
    for e in with_ns[:1000]:
        assert f'"ts":{e["ts"].normalize():f}' in text


def test_large_integer_args_byte_exact(tmp_path: Path) -> None:
    src = _need(KINETO / "edge" / "large_integer.json.gz")
    _, again, out = _roundtrip(src, tmp_path)
    text = gzip.decompress(out.read_bytes()).decode()
    assert '"args":{"Comms Id": 10159970886766084423}' in text
    args = again.table("events", columns=["args"])["args"].to_pylist()
    assert '{"Comms Id": 10159970886766084423}' in args


# ----------------------------------------------------------------------------------------------
# several ranks
# ----------------------------------------------------------------------------------------------


def _dlrm(tmp: Path) -> tuple[Any, list[Path]]:
    _need(DLRM)
    files = sorted(DLRM.glob("*.json.gz"))
    assert len(files) == 8
    xpuprof.import_traces([DLRM], tmp / "a")
    return xpuprof.load(tmp / "a"), files


def _rank_of(path: Path) -> int:
    return _load_json(path)["distributedInfo"]["rank"]


def test_export_directory_one_file_per_rank(tmp_path: Path) -> None:
    first, files = _dlrm(tmp_path)
    out = tmp_path / "out"
    summary = export_chrome(first, str(out) + "/")
    names = sorted(Path(f).name for f in summary["files"])
    assert names == [f"rank{r}.pt.trace.json.gz" for r in range(8)]
    raw_by_rank = {_rank_of(f): _entries(_load_json(f)) for f in files}
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


def test_export_merged_ranks(tmp_path: Path) -> None:
    first, files = _dlrm(tmp_path)
    out = tmp_path / "merged.json.gz"
    summary = export_chrome(first, out)
    raws = [_entries(_load_json(f)) for f in sorted(files, key=_rank_of)]
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
    assert doc["schemaVersion"] == _load_json(files[0])["schemaVersion"]
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
    assert sorted(first.ranks, key=str) == [3, 3, None]
    raw = [_entries(_load_json(p)) for p in srcs]
    n_raw = sum(len(r) for r in raw)

    summary = export_chrome(first, tmp_path / "dir")  # no trailing slash: a new file
    assert summary["sources"] == 3 and (tmp_path / "dir").is_file()
    summary = export_chrome(first, str(tmp_path / "d") + "/")
    assert sorted(Path(f).name for f in summary["files"]) == [
        "part0.pt.trace.json.gz",
        "rank3.part2.pt.trace.json.gz",
        "rank3.pt.trace.json.gz",
    ]
    assert summary["events"] == n_raw

    out = tmp_path / "merged.json"
    assert export_chrome(first, out)["events"] == n_raw
    entries = _entries(_load_json(out))
    # rank order, parts without a rank last
    labels = ["rank 3 part 1", "rank 3 part 2", "part 0"]
    order = [raw[1], raw[2], raw[0]]
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


# ----------------------------------------------------------------------------------------------
# errors, the CLI
# ----------------------------------------------------------------------------------------------


def test_error_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    xpuprof.import_traces([EXAMPLE], tmp_path / "a")
    trace = xpuprof.load(tmp_path / "a")
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


def test_cli_export_json(tmp_path: Path) -> None:
    xpuprof.import_traces([EXAMPLE], tmp_path / "store")
    out = tmp_path / "out.json.gz"
    proc = subprocess.run(
        [sys.executable, "-m", "xpuprof.ui.cli", "export", str(tmp_path / "store"),
         "-o", str(out), "--json"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    raw = _entries(_load_json(EXAMPLE))
    assert summary["events"] == len(raw)
    assert summary["sources"] == 1
    assert summary["bytes"] == out.stat().st_size
    assert Path(summary["path"]) == out
    assert Counter(e["ph"] for e in _entries(_load_json(out))) == _raw_counts(raw)[0]

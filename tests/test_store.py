"""The store: Parquet files per part and table, a manifest that lists them, atomic and
incremental re-imports, SQL that agrees with the files, on-the-fly imports that clean up.

Inputs are the real trace shipped in the package plus small traces written here, so this file
needs nothing from ../shared.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from builders import HOST_PID, HOST_TID, TraceBuilder
from conftest import EXAMPLE, read_trace_json

import xpuprof
from xpuprof.core.errors import XpuprofError
from xpuprof.trace.store import verify

TABLES = ("events", "flows", "links", "counters", "metadata")


def small_trace(rank: int, n: int) -> dict[str, Any]:
    """n host ops, each launching one kernel (with an ac2g flow pair) and sampling a counter,
    plus a thread name."""
    tb = TraceBuilder(rank=rank, world_size=3)
    tb.add({"ph": "M", "name": "thread_name", "pid": HOST_PID, "tid": HOST_TID,
            "args": {"name": "main"}})  # fmt: skip
    tb.step(1, ts=0, dur=100 * n + 50)
    for i in range(n):
        t = 100 * i + 10
        tb.op(f"aten::op{i % 3}", ts=t, dur=40)
        tb.launch("gemm", ts=t + 20, dur=30.5, launch_ts=t + 5, launch_dur=10,
                  correlation=1000 + i)  # fmt: skip
        tb.counter("queue", ts=t, pid=0, depth=i % 4)
    return tb.doc()


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A folder of three per-rank traces: the shipped real one and two written here."""
    d = tmp_path / "run"
    d.mkdir()
    shutil.copyfile(EXAMPLE, d / "rank0.json.gz")
    (d / "rank1.json").write_text(json.dumps(small_trace(1, 40)))
    (d / "rank2.json").write_text(json.dumps(small_trace(2, 25)))
    return d


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """(inode, size, mtime in ns) of every file under root."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[p.relative_to(root).as_posix()] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def manifest(store: Path) -> dict[str, Any]:
    return json.loads((store / "manifest.json").read_text())


def by_name(store: Path) -> dict[str, dict[str, Any]]:
    return {Path(s["path"]).name: s for s in manifest(store)["sources"]}


def raw_rows(path: Path) -> dict[str, int]:
    """Rows each table should get from a trace without B/E pairs, counted from the raw JSON."""
    evs = read_trace_json(path)["traceEvents"]
    ph = [e.get("ph") for e in evs]
    return {
        "events": sum(p not in ("s", "t", "f", "C", "M") for p in ph),
        "flows": sum(p in ("s", "t", "f") for p in ph),
        "counters": sum(len(e.get("args") or {None: 0}) for e in evs if e.get("ph") == "C"),
        "metadata": ph.count("M"),
    }


def test_layout_manifest_lists_existing_parquet_files(run_dir, tmp_path) -> None:
    store = tmp_path / "x.store"
    report = xpuprof.import_traces([run_dir], store)
    m = manifest(store)
    assert m["format"] == "xpuprof-store" and isinstance(m["version"], int)
    assert len(m["sources"]) == 3
    assert sorted(s["part"] for s in m["sources"]) == [0, 1, 2]
    listed = set()
    for s in m["sources"]:
        src = Path(s["path"])
        assert src.parent == run_dir.resolve()
        assert s["size"] == src.stat().st_size
        assert s["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
        assert s["read"]["total"] == len(read_trace_json(src)["traceEvents"])
        assert sorted(s["files"]) == sorted(TABLES)
        want = raw_rows(src)
        for table, rel in s["files"].items():
            f = store / rel
            assert f.is_file() and f.resolve().parent.parent == store.resolve()
            assert pq.read_metadata(f).num_rows == s["rows"][table]
            if table in want:
                assert s["rows"][table] == want[table], (src.name, table)
            listed.add(rel)
    on_disk = {p.relative_to(store).as_posix() for p in store.rglob("*.parquet")}
    assert on_disk == listed
    assert {p.name for p in store.iterdir() if p.is_file()} == {"manifest.json"}
    assert [p for p in store.rglob(".*")] == []  # no temporary files left in the store
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    for t in TABLES:
        assert m["rows"][t] == sum(s["rows"][t] for s in m["sources"])
    assert report.rows == m["rows"] and report.noop is False
    assert verify(store) == []  # the store's own check agrees with the one above


def test_reimport_of_unchanged_files_is_a_noop(run_dir, tmp_path) -> None:
    store = tmp_path / "x.store"
    xpuprof.import_traces([run_dir], store)
    before = snapshot(store)
    report = xpuprof.import_traces([run_dir], store)
    assert report.noop is True
    assert sorted(report.reused) == sorted(str(p.resolve()) for p in run_dir.iterdir())
    assert snapshot(store) == before
    assert report.rows == manifest(store)["rows"]


def test_touched_but_identical_files_are_still_a_noop(run_dir, tmp_path) -> None:
    store = tmp_path / "x.store"
    xpuprof.import_traces([run_dir], store)
    before = snapshot(store)
    for p in run_dir.iterdir():
        st = p.stat()
        os.utime(p, ns=(st.st_atime_ns + 7 * 10**9, st.st_mtime_ns + 7 * 10**9))
    report = xpuprof.import_traces([run_dir], store)
    assert report.noop is True
    after = snapshot(store)
    # the tables are untouched; only the manifest learns the new mtimes (so that the next
    # import need not hash the files again)
    assert {k: v for k, v in after.items() if k != "manifest.json"} == {
        k: v for k, v in before.items() if k != "manifest.json"
    }
    recorded = {s["path"]: s["mtime_ns"] for s in manifest(store)["sources"]}
    assert recorded == {str(p.resolve()): p.stat().st_mtime_ns for p in run_dir.iterdir()}
    again = snapshot(store)
    assert xpuprof.import_traces([run_dir], store).noop is True
    assert snapshot(store) == again


def test_changing_one_file_reimports_only_that_file(run_dir, tmp_path) -> None:
    store = tmp_path / "x.store"
    xpuprof.import_traces([run_dir], store)
    old = by_name(store)
    before = snapshot(store)
    changed = run_dir / "rank2.json"
    changed.write_text(json.dumps(small_trace(2, 31)))
    report = xpuprof.import_traces([run_dir], store)
    assert report.noop is False
    assert sorted(Path(p).name for p in report.reused) == ["rank0.json.gz", "rank1.json"]
    new = by_name(store)
    after = snapshot(store)
    for name in ("rank0.json.gz", "rank1.json"):
        assert new[name]["part"] == old[name]["part"]
        assert new[name]["files"] == old[name]["files"]
        for rel in new[name]["files"].values():
            assert after[rel] == before[rel], rel  # same inode, size and mtime: not rewritten
    assert new["rank2.json"]["part"] not in {s["part"] for s in old.values()}
    assert new["rank2.json"]["sha256"] == hashlib.sha256(changed.read_bytes()).hexdigest()
    for rel in old["rank2.json"]["files"].values():
        assert not (store / rel).exists()
    want = raw_rows(changed)
    with xpuprof.load(store) as t:
        part = new["rank2.json"]["part"]
        for table in ("events", "flows", "counters", "metadata"):
            n = t.sql(f"select count(*) as n from {table} where part = {part}")["n"][0]
            assert n == want[table] == new["rank2.json"]["rows"][table], table
        assert t.sql("select count(*) as n from links where rank = 2")["n"][0] == 31


def test_a_source_no_longer_named_leaves_the_store(run_dir, tmp_path) -> None:
    store = tmp_path / "x.store"
    xpuprof.import_traces([run_dir], store)
    gone = by_name(store)["rank1.json"]
    (run_dir / "rank1.json").unlink()
    report = xpuprof.import_traces([run_dir], store)
    assert report.noop is False
    assert sorted(by_name(store)) == ["rank0.json.gz", "rank2.json"]
    for rel in gone["files"].values():
        assert not (store / rel).exists()
    with xpuprof.load(store) as t:
        assert sorted(t.sql("select distinct rank from events")["rank"]) == [0, 2]


def test_sql_counts_equal_the_parquet_files(run_dir, tmp_path) -> None:
    store = tmp_path / "x.store"
    xpuprof.import_traces([run_dir], store)
    m = manifest(store)
    with xpuprof.load(store) as t:
        for table in TABLES:
            files = [str(store / s["files"][table]) for s in m["sources"]]
            direct = pq.ParquetDataset(files).read()
            n = t.sql(f"select count(*) as n from {table}")["n"][0]
            assert n == direct.num_rows == t.table(table).num_rows, table
            per_part = t.sql(f"select part, count(*) as n from {table} group by part")
            got = dict(zip(per_part["part"], per_part["n"], strict=True))
            want = {r["values"]: r["counts"] for r in pc.value_counts(direct["part"]).to_pylist()}
            assert got == want, table
        direct = pq.ParquetDataset([str(store / s["files"]["events"]) for s in m["sources"]])
        levels = pc.value_counts(direct.read(columns=["level"])["level"].combine_chunks())
        want = {r["values"]: r["counts"] for r in levels.to_pylist()}
        got = t.sql("select level, count(*) as n from events group by level")
        assert dict(zip(got["level"], got["n"], strict=True)) == want == m["levels"]


def test_load_of_a_trace_file_imports_to_a_temporary_store(tmp_path) -> None:
    n = len(read_trace_json(EXAMPLE)["traceEvents"])
    trace = xpuprof.load(EXAMPLE)
    path = trace.path
    assert (path / "manifest.json").is_file()
    assert tmp_path not in path.parents and EXAMPLE.parent not in path.parents
    rows = {
        name: trace.sql(f"select count(*) as n from {name}")["n"][0]
        for name in ("events", "flows", "metadata")
    }
    assert sum(rows.values()) == n  # the example has no B/E or C entries
    trace.close()
    assert not path.exists()
    assert not path.parent.exists()  # the temporary folder around it is gone too
    with xpuprof.load(EXAMPLE) as again:
        path2 = again.path
        assert again.sql("select count(*) as n from events")["n"][0] == rows["events"]
    assert not path2.exists()
    assert not (EXAMPLE.parent / "store").exists()


def test_load_of_a_store_does_not_delete_it(run_dir, tmp_path) -> None:
    store = tmp_path / "x.store"
    xpuprof.import_traces([run_dir], store)
    before = snapshot(store)
    with xpuprof.load(store) as t:
        assert t.path == store.resolve()
    assert snapshot(store) == before


def test_import_refuses_to_overwrite_a_folder_that_is_not_a_store(run_dir, tmp_path) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(XpuprofError, match="not an xpuprof store"):
        xpuprof.import_traces([run_dir], target)
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    store = tmp_path / "x.store"
    xpuprof.import_traces([run_dir / "rank1.json"], store)
    # a store given to import is merged (trace/merge.py, test_merge_stores.py), not read
    # as a trace: y.store holds its one part
    report = xpuprof.import_traces([store], tmp_path / "y.store")
    with xpuprof.load(store) as t:
        assert report.rows == t.manifest["rows"] and len(report.sources) == 1

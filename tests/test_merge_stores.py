"""Stores merged into one (``xpuprof import rank0.store rank1.store -o job.store``): ranks
captured one store each become the parts of one job store (issue 14).

Checked against what does not go through the merge: the ranks' own records and the raw Kineto
JSON torch's profiler wrote in each rank (a real 2-rank gloo job, launched as
``test_distributed_capture.py`` does, each rank writing ``rank{R}.store``), the one-store
capture of the same job (``out=SAME``, that file's fixture), and an import of the trace files
all at once (the 8 DLRM ranks; synthetic traces whose parts are numbered in order). Integrity
is checked with DuckDB over the Parquet files: ids unique, parents in their own part, flows
and links ending on events of the store.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from builders import TraceBuilder
from conftest import cli, shared

import xpuprof
from xpuprof.core.errors import XpuprofError
from xpuprof.core.names import ID_SHIFT, TABLES
from xpuprof.trace import store as st
from xpuprof.trace.trace import Trace

try:  # the 2-rank job needs torch (an optional extra); without it only its tests skip
    from test_distributed_capture import job, raw_ops, run_job
except pytest.skip.Exception as e:
    _NO_TORCH = str(e)

    @pytest.fixture(scope="module")
    def job():  # noqa: D103 - stands in for the one-store capture's fixture
        pytest.skip(_NO_TORCH)


# -- helpers -------------------------------------------------------------------------------------


def _files(root: Path, table: str) -> list[str]:
    return [str(root / f) for f in st.files_of(st.read_manifest(root), table)]


def _hashes(root: Path) -> dict[str, tuple]:
    """Per table: rows, and two order-free hashes of all its rows (DuckDB's ``hash`` of each
    whole row, summed and xor-ed)."""
    con = duckdb.connect()
    out = {}
    for t in TABLES:
        fs = _files(root, t)
        out[t] = con.execute(f"SELECT count(*), sum(hash(x)::HUGEINT), bit_xor(hash(x)) "
                         f"FROM read_parquet({fs}) x").fetchone()  # fmt: skip
    return out


def _arrow(root: Path, table: str):
    """One table of a store, all parts in part order, as Arrow (its types as stored)."""
    import pyarrow as pa

    return pa.concat_tables([pq.read_table(f) for f in _files(root, table)])


def _part(root: Path, table: str, part: int):
    """The rows of one part of one table."""
    import pyarrow.compute as pc

    t = _arrow(root, table)
    return t.filter(pc.equal(t["part"], part))


def _broken_references(root: Path) -> dict[str, int]:
    """Rows whose event ids do not hold: duplicate ids, ids not of their own part, parents
    outside their part or naming no event, flow/link endpoints naming no event."""
    con = duckdb.connect()
    con.sql(f"CREATE VIEW ev AS SELECT * FROM read_parquet({_files(root, 'events')})")
    con.sql(f"CREATE VIEW fl AS SELECT * FROM read_parquet({_files(root, 'flows')})")
    con.sql(f"CREATE VIEW li AS SELECT * FROM read_parquet({_files(root, 'links')})")
    q = {
        "duplicate_ids": "SELECT count(*) - count(DISTINCT id) FROM ev",
        "id_of_other_part": f"SELECT count(*) FROM ev WHERE id >> {ID_SHIFT} != part",
        "parent_of_other_part": f"SELECT count(*) FROM ev WHERE parent >> {ID_SHIFT} != part",
        "parent_missing": "SELECT count(*) FROM ev e WHERE parent IS NOT NULL AND parent NOT IN "
        "(SELECT id FROM ev)",
        "flow_event_missing": "SELECT count(*) FROM fl WHERE event IS NOT NULL AND event NOT IN "
        "(SELECT id FROM ev)",
        "link_end_missing": "SELECT count(*) FROM li WHERE (src IS NOT NULL AND src NOT IN "
        "(SELECT id FROM ev)) OR (dst IS NOT NULL AND dst NOT IN (SELECT id FROM ev))",
        "link_of_other_part": f"SELECT count(*) FROM li WHERE src >> {ID_SHIFT} != part "
        f"OR dst >> {ID_SHIFT} != part",
    }
    return {k: con.execute(v).fetchone()[0] for k, v in q.items()}


CLEAN = dict.fromkeys(
    ["duplicate_ids", "id_of_other_part", "parent_of_other_part", "parent_missing",
     "flow_event_missing", "link_end_missing", "link_of_other_part"], 0)  # fmt: skip


def _trace(d: Path, name: str, rank: int, world: int, groups: list | None = None) -> Path:
    """A small Kineto trace of one rank: a step, an op, a kernel it launches (nesting, a
    launch flow and link), a counter and a metadata entry: a row in every table."""
    tb = TraceBuilder(rank=rank, world_size=world)
    if groups is not None:
        tb.top["distributedInfo"]["pg_config"] = groups
    tb.step(0, ts=0, dur=100)
    tb.op("aten::mm", 10, 50)
    tb.launch("gemm", ts=30, dur=20, launch_ts=12)
    tb.counter("memory", 5, used=1.0)
    tb.metadata("process_name", pid=100, labels="python")
    return tb.write(d / name)


def _groups(ranks: list[int]) -> list[dict]:
    return [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
             "pg_size": len(ranks), "ranks": ranks}]  # fmt: skip


def _leftovers(d: Path) -> list[str]:
    """Hidden build folders and lock files a write left beside its store."""
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


# -- a real 2-rank job, one store per rank --------------------------------------------------------


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory):
    """The gloo job of ``test_distributed_capture.py``, each rank profiling into its own store
    (``out=rank{R}.store``), merged by the import command."""
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    tmp = tmp_path_factory.mktemp("perrank")
    _, facts, _ = run_job(tmp, 2, "normal", out="rank{rank}.store")
    stores = [tmp / f"rank{r}.store" for r in range(2)]
    p = cli("import", *stores, "-o", tmp / "job.store", "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    trace = Trace(tmp / "job.store")
    yield tmp, stores, facts, trace, report
    trace.close()


def test_every_rank_store_is_a_part_of_the_merge(per_rank) -> None:
    tmp, stores, facts, trace, report = per_rank
    merged = tmp / "job.store"
    assert st.verify(merged, deep=True) == []
    assert [(s["part"], s["rank"]) for s in report["sources"]] == [(0, 0), (1, 1)]
    ins = [st.read_manifest(s) for s in stores]
    # every table: the sum of the inputs' rows, and each part the rank's own rows
    for t in TABLES:
        assert trace.manifest["rows"][t] == sum(m["rows"][t] for m in ins)
        assert _hashes(merged)[t][0] == sum(_hashes(s)[t][0] for s in stores)
        for r, s in enumerate(stores):
            mine = [str(merged / f) for f in st.files_of(trace.manifest, t)][r]
            assert pq.read_table(mine).equals(_arrow(s, t))
    assert _broken_references(merged) == CLEAN
    ev = trace.events
    for fact in facts:
        r = fact["rank"]
        ops = ev[(ev["rank"] == r) & (ev["level"] == "op")]
        assert Counter(ops["name"].astype(str)) == raw_ops(tmp, r)  # the rank's raw JSON
        with Trace(stores[r]) as own:
            oe = own.events
            assert Counter(ops["name"].astype(str)) == Counter(
                oe.loc[oe["level"] == "op", "name"].astype(str))  # fmt: skip
        # the rank's place in the job, as the rank's capture recorded it
        src = trace.sources[r]
        d = src["meta"]["xpuprof_capture"]["distributed"]
        assert (d["rank"], d["world_size"], d["backend"]) == (r, 2, fact["backend"])
        assert src["host"] == fact["host"] and src["merged_from"]["store"] == str(stores[r])
    jobs = {s["meta"]["xpuprof_capture"]["distributed"]["job"] for s in trace.sources}
    assert len(jobs) == 1 and None not in jobs
    assert trace.job() == {"world_size": 2, "ranks": [0, 1], "missing": []}


def test_merged_analyses_are_the_one_store_captures(per_rank, job) -> None:  # noqa: F811
    """``comm`` and ``ranks`` on the merge find what they find on the job captured into one
    store (``out=SAME``, another run of the same loop): each rank's 12 all-reduces (its loop's
    count) in the order that pairs them across ranks (``seq``), the same cross-rank rows
    (``skew``), and every step of both ranks."""
    from xpuprof.analysis.comm import collectives
    from xpuprof.analysis.ranks import rank_steps

    _, _, facts, merged, _ = per_rank
    _, _, one_facts, one = job
    got = {}
    for name, trace, fs in (("merged", merged, facts), ("one store", one, one_facts)):
        res = collectives(trace)
        coll = res.tables["collectives"]
        per = {r: coll[coll["rank"] == r] for r in (0, 1)}
        for f in fs:
            assert f["all_reduce"] == 12
            assert (per[f["rank"]]["collective"] == "all_reduce").sum() == f["all_reduce"]
        sk = res.tables["skew"]
        steps = rank_steps(trace).tables["steps"]
        got[name] = (
            {
                r: per[r].sort_values("seq")[["collective", "seq", "process_group"]].values.tolist()
                for r in per
            },  # fmt: skip
            len(sk),
            bool(sk["types_agree"].all()),
            sorted(set(zip(steps["rank"], steps["step"], strict=True))),
            trace.job(),
        )
    assert got["merged"] == got["one store"]
    for r in (0, 1):
        assert [c[:2] for c in got["merged"][0][r]] == [["all_reduce", i] for i in range(12)]
    assert got["merged"][3] == [(r, s) for r in (0, 1) for s in (1, 2, 3)]


def test_a_rank_in_two_stores_is_refused(per_rank, tmp_path) -> None:
    """Two capture windows of rank 0 (its store, and a copy of it as another window would
    leave it): exit 2, one line naming both stores, nothing written."""
    _, stores, _, _, _ = per_rank
    again = tmp_path / "rank0-again.store"
    shutil.copytree(stores[0], again)
    p = cli("import", stores[0], stores[1], again, "-o", tmp_path / "job.store")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"rank 0 is in two of the stores to merge ({stores[0]} and {again})" in p.stderr
    assert not (tmp_path / "job.store").exists() and _leftovers(tmp_path) == []


# -- the 8 DLRM ranks, imported one store each --------------------------------------------------


def test_dlrm_ranks_merged_equal_one_import(tmp_path) -> None:
    d = shared("kineto/gpu/dlrm_8rank_v100")
    files = sorted(d.glob("*.json.gz"))
    assert len(files) == 8
    at_once = tmp_path / "at_once.store"
    xpuprof.import_traces(files, at_once)
    stores = []
    for i, f in enumerate(files):
        stores.append(tmp_path / f"r{i}.store")
        xpuprof.import_traces([f], stores[-1])
        assert st.read_manifest(stores[-1])["sources"][0]["part"] == 0  # renumbered below
    merged = tmp_path / "merged.store"
    # given in another order: the parts are the ranks whatever the order
    report = xpuprof.import_traces(stores[::-1], merged)
    assert not report.noop
    assert st.verify(merged, deep=True) == []
    assert _hashes(merged) == _hashes(at_once)
    for t in TABLES:
        assert _arrow(merged, t).equals(_arrow(at_once, t))
    assert _broken_references(merged) == CLEAN
    one, two = st.read_manifest(at_once), st.read_manifest(merged)
    skip = ("files", "merged_from")
    assert [{k: v for k, v in s.items() if k not in skip} for s in two["sources"]] == [
        {k: v for k, v in s.items() if k not in skip} for s in one["sources"]]  # fmt: skip
    assert (two["rows"], two["levels"], two["events_read"]) == (
        one["rows"], one["levels"], one["events_read"])  # fmt: skip
    # the same merge again: nothing to do; --force writes it again, under new file names
    listed = {f for s in two["sources"] for f in s["files"].values()}
    assert xpuprof.import_traces(stores, merged).noop
    assert not xpuprof.import_traces(stores, merged, force=True).noop
    again = st.read_manifest(merged)
    assert not listed & {f for s in again["sources"] for f in s["files"].values()}
    assert _hashes(merged) == _hashes(at_once)


# -- parts numbered in order, ids renumbered -----------------------------------------------------


@pytest.fixture
def synthetic(tmp_path):
    """Store A: two captures of rank 0 (parts 0, 1); store B: rank 2 (part 0); the files."""
    a0 = _trace(tmp_path, "a0.json", 0, 3)
    a1 = _trace(tmp_path, "a1.json", 0, 3)
    b = _trace(tmp_path, "b.json", 2, 3)
    xpuprof.import_traces([a0, a1], tmp_path / "a.store")
    xpuprof.import_traces([b], tmp_path / "b.store")
    return tmp_path, (a0, a1, b)


def test_parts_in_order_when_a_store_holds_a_rank_twice(synthetic) -> None:
    tmp, files = synthetic
    a, b = tmp / "a.store", tmp / "b.store"
    report = xpuprof.import_traces([a, b], tmp / "m.store")
    assert [(s["part"], s["rank"]) for s in report.sources] == [(0, 0), (1, 0), (2, 2)]
    xpuprof.import_traces(list(files), tmp / "once.store")
    assert _hashes(tmp / "m.store") == _hashes(tmp / "once.store")
    for t in TABLES:
        assert _arrow(tmp / "m.store", t).equals(_arrow(tmp / "once.store", t))
    assert _broken_references(tmp / "m.store") == CLEAN
    # B's part 0 is part 2: every id moved by 2 << ID_SHIFT, the rest as it was
    mine, theirs = _part(tmp / "m.store", "events", 2), _arrow(b, "events")
    shift = 2 << ID_SHIFT
    assert mine["id"].to_pylist() == [i + shift for i in theirs["id"].to_pylist()]
    assert mine["parent"].to_pylist() == [
        None if p is None else p + shift for p in theirs["parent"].to_pylist()]  # fmt: skip
    assert mine["parent"].null_count < mine.num_rows  # something is nested
    assert mine["index"].equals(theirs["index"]) and mine["name"].equals(theirs["name"])
    links, flows = _part(tmp / "m.store", "links", 2), _part(tmp / "m.store", "flows", 2)
    assert links.num_rows == 1 and flows.num_rows == 2
    for t, cols in (("links", ("src", "dst")), ("flows", ("event",))):
        for c in cols:
            want = [v + shift for v in _arrow(b, t)[c].to_pylist()]
            assert (links if t == "links" else flows)[c].to_pylist() == want
    # what the command prints: a merge of 3 parts from 2 stores, their events counted
    out = cli("import", a, b, "-o", tmp / "m2.store", env={"COLUMNS": "200"})
    events = sum(_arrow(x, "events").num_rows for x in (a, b))
    assert out.returncode == 0
    assert f"merged into {tmp / 'm2.store'}: 3 part(s) of 2 store(s), {events:,} events" in (
        out.stdout)  # fmt: skip


def test_an_existing_store_is_replaced_and_the_same_merge_is_a_noop(synthetic) -> None:
    tmp, files = synthetic
    out = tmp / "b.store"  # not an input below: a store already there
    a = tmp / "a.store"
    xpuprof.import_traces([files[2]], tmp / "c.store")
    report = xpuprof.import_traces([a, tmp / "c.store"], out)
    assert [(s["part"], s["rank"]) for s in report.sources] == [(0, 0), (1, 0), (2, 2)]
    assert st.verify(out, deep=True) == []
    listed = {f for s in st.read_manifest(out)["sources"] for f in s["files"].values() if f}
    present = {f"{t}/{p.name}" for t in TABLES for p in (out / t).iterdir()}
    assert present == listed  # the old store's files are gone
    assert xpuprof.import_traces([a, tmp / "c.store"], out).noop
    # a file of the merge lost: the merge is written again, whole
    (out / st.read_manifest(out)["sources"][1]["files"]["links"]).unlink()
    assert not xpuprof.import_traces([a, tmp / "c.store"], out).noop
    assert st.verify(out, deep=True) == []
    assert _leftovers(tmp) == []


# -- refusals ------------------------------------------------------------------------------------


def _capture_of(store: Path, rank: int, job_id: str) -> None:
    """Mark the store's part as the capture of rank ``rank`` of a 2-rank job ``job_id`` (what
    ``live/job.py`` records in a capture's manifest entry)."""
    m = json.loads((store / st.MANIFEST).read_text())
    m["sources"][0]["meta"]["xpuprof_capture"] = {
        "distributed": {"rank": rank, "world_size": 2, "job": job_id}}  # fmt: skip
    (store / st.MANIFEST).write_text(json.dumps(m))


def test_ranks_of_different_jobs_are_refused(tmp_path) -> None:
    def store(name: str, rank: int, world: int, groups: list | None = None) -> Path:
        xpuprof.import_traces([_trace(tmp_path, f"{name}.json", rank, world, groups)],
                              tmp_path / f"{name}.store")  # fmt: skip
        return tmp_path / f"{name}.store"

    out = tmp_path / "out.store"
    w2, w4 = store("w2", 0, 2), store("w4", 1, 4)
    with pytest.raises(XpuprofError, match=r"these stores hold ranks of different jobs \(world "
                       r"size 2: w2.store part 0; world size 4: w4.store part 0\)"):  # fmt: skip
        xpuprof.import_traces([w2, w4], out)
    g1, g2 = store("g1", 0, 2, _groups([0, 1])), store("g2", 1, 2, _groups([0, 2]))
    with pytest.raises(XpuprofError, match="ranks of different jobs .*process groups"):
        xpuprof.import_traces([g1, g2], out)
    j1, j2 = store("j1", 0, 2), store("j2", 1, 2)
    _capture_of(j1, 0, "torchelastic:one")
    _capture_of(j2, 1, "torchelastic:two")
    with pytest.raises(XpuprofError, match="captures of different jobs .*j1.store part 0: rank 0 "
                       "of world size 2, job torchelastic:one; j2.store part 0: .*job "
                       "torchelastic:two"):  # fmt: skip
        xpuprof.import_traces([j1, j2], out)
    assert not out.exists() and _leftovers(tmp_path) == []
    # --mixed keeps them together, parts in order (both jobs have a rank 0 in g1, w2)
    report = xpuprof.import_traces([w2, w4, g1], out, mixed=True)
    assert [(s["part"], s["rank"]) for s in report.sources] == [(0, 0), (1, 1), (2, 0)]
    assert _broken_references(out) == CLEAN


def test_stores_and_trace_files_are_not_imported_together(synthetic) -> None:
    tmp, files = synthetic
    p = cli("import", tmp / "a.store", files[2], "-o", tmp / "out.store")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"{files[2]}: a trace file, while {tmp / 'a.store'} is a store" in p.stderr
    (tmp / "plain").mkdir()
    with pytest.raises(XpuprofError, match="plain: not an xpuprof store"):
        xpuprof.import_traces([tmp / "a.store", tmp / "plain"], tmp / "out.store")
    with pytest.raises(XpuprofError, match="nowhere: no such file"):
        xpuprof.import_traces([tmp / "a.store", tmp / "nowhere"], tmp / "out.store")
    assert not (tmp / "out.store").exists()


def test_damaged_stores_and_bad_outputs_are_refused(synthetic) -> None:
    tmp, _ = synthetic
    a, b, out = tmp / "a.store", tmp / "b.store", tmp / "out.store"
    bad = tmp / "bad.store"
    shutil.copytree(b, bad)
    (bad / st.MANIFEST).write_text("{ not json")
    with pytest.raises(XpuprofError, match=f"{bad / st.MANIFEST}: unreadable manifest"):
        xpuprof.import_traces([a, bad], out)
    shutil.rmtree(bad)
    shutil.copytree(b, bad)
    gone = bad / st.read_manifest(bad)["sources"][0]["files"]["flows"]
    gone.unlink()
    with pytest.raises(XpuprofError, match=f"{gone}: missing"):
        xpuprof.import_traces([a, bad], out)
    with pytest.raises(XpuprofError, match="is one of the stores to merge"):
        xpuprof.import_traces([a, b], a)
    with pytest.raises(XpuprofError, match="named twice"):
        xpuprof.import_traces([a, b, a], out)
    (tmp / "full").mkdir()
    (tmp / "full" / "notes.txt").write_text("mine")
    p = cli("import", a, b, "-o", tmp / "full")
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "full: exists and is not an xpuprof store; not overwriting it" in p.stderr
    assert (tmp / "full" / "notes.txt").read_text() == "mine"
    assert not out.exists() and _leftovers(tmp) == []


def test_a_damaged_part_found_while_writing_leaves_nothing(synthetic) -> None:
    """A part whose event ids are of another part than its manifest says (the footer and rows
    check out: found only while renumbering): refused naming the file, no store, no build
    folder left."""
    import pyarrow as pa

    tmp, _ = synthetic
    bad = tmp / "bad.store"
    shutil.copytree(tmp / "b.store", bad)
    f = bad / st.read_manifest(bad)["sources"][0]["files"]["events"]
    t = pq.read_table(f)
    i = t.schema.get_field_index("id")
    moved = pa.array([v + (5 << ID_SHIFT) for v in t["id"].to_pylist()], pa.int64())
    pq.write_table(t.set_column(i, t.schema.field("id"), moved), f)
    assert st.verify(bad) == []
    with pytest.raises(XpuprofError, match=f"{f}: column id holds ids of part 5, the manifest "
                       "lists the file for part 0"):  # fmt: skip
        xpuprof.import_traces([tmp / "a.store", bad], tmp / "out.store")
    assert not (tmp / "out.store").exists() and _leftovers(tmp) == []


def test_import_help_names_the_merge() -> None:
    p = cli("import", "--help", env={"COLUMNS": "250"})
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    assert (
        "Given stores instead (xpuprof import rank0.store rank1.store -o job.store), merge "
        "them into one" in text
    )
    assert "or stores to merge into one (per-rank captures of one job)" in text

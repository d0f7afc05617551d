"""Importing real Kineto traces: every entry accounted for, counts equal to the raw JSON's.

Each expected number is computed here from the raw file with ``json``/``gzip``/``decimal``;
the store is read back through the public API (``xpuprof.load`` → ``trace.sql`` /
``trace.table`` / ``trace.args`` / ``trace.meta``) and through ``xpuprof info --json``.
"""

from __future__ import annotations

import collections
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import (
    EXAMPLE,
    KINETO,
    NO_SHARED,
    cli_json,
    kineto_files,
    no_gc,
    read_trace_json,
    shared,
    us_to_ns,
)

import xpuprof

#: Flow categories that join a launch (runtime call) to the device work it started.
LAUNCH_FLOWS = ("ac2g", "async", "async_gpu", "async_cpu_to_gpu")
RUNTIME_CATEGORIES = {"cuda_runtime", "Runtime", "mtia_runtime", "cuda_driver"}
DEVICE_CATEGORIES = {
    "kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "cuda_sync",
    "mtia_ccp_events",
}  # fmt: skip

SYNTHETIC = "synthetic_all_phases"


def _na(v: Any) -> Any:
    """SQL NULL as None, whatever pandas made of it (None, NaN, NA)."""
    return None if v is None or (not isinstance(v, (list, dict)) and pd.isna(v)) else v


def _case_params(marks_for: dict[str, Any] | None = None) -> list[Any]:
    """The shipped example, a trace written by the test, and every shared Kineto trace."""
    params: list[Any] = [
        pytest.param(EXAMPLE, id="example_cpu_train"),
        pytest.param(SYNTHETIC, id=SYNTHETIC),
    ]
    files = kineto_files()
    if not files:
        params.append(pytest.param(None, id="shared", marks=pytest.mark.skip(reason=NO_SHARED)))
    for f in files:
        rel = f.relative_to(KINETO).as_posix()
        marks = (marks_for or {}).get(rel, ())
        params.append(pytest.param(f, id=rel, marks=marks))
    return params


# ----------------------------------------------------------------------------------------------
# a trace written by the tests: X, B/E (closed, unclosed, orphan), C, i (thread, global),
# s/t/f with string ids and pids, M, an unknown category and an unknown top-level key
# ----------------------------------------------------------------------------------------------


def _synthetic_events() -> list[dict[str, Any]]:
    return [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "host"}},
        {"ph": "B", "cat": "user_annotation", "name": "outer", "pid": 1, "tid": 1, "ts": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 11.5,
         "dur": 2.25, "args": {"External id": 7}},
        {"ph": "E", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 20,
         "args": {"result": 1}},
        {"ph": "B", "cat": "user_annotation", "name": "unclosed", "pid": 1, "tid": 1, "ts": 30},
        {"ph": "E", "pid": 1, "tid": 2, "ts": 31},
        {"ph": "C", "cat": "memory", "name": "mem", "pid": 1, "ts": 12,
         "args": {"allocated": 100, "reserved": 200}},
        {"ph": "C", "name": "util", "pid": 1, "ts": 13, "args": {"gpu": 0.5}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1,
         "ts": 12, "s": "t", "args": {"Bytes": 4, "bytes": 5}},
        {"ph": "i", "name": "global", "pid": 1, "tid": 1, "ts": 14, "s": "g"},
        {"ph": "s", "cat": "custom_flow", "name": "f", "id": "abc", "pid": 1, "tid": 1,
         "ts": 11.5},
        {"ph": "t", "cat": "custom_flow", "name": "f", "id": "abc", "pid": "worker",
         "tid": "main", "ts": 15},
        {"ph": "f", "cat": "custom_flow", "name": "f", "id": "abc", "pid": 1, "tid": 1,
         "ts": 16, "bp": "e"},
        {"ph": "X", "cat": "my_own_category", "name": "w", "pid": "worker", "tid": "main",
         "ts": 15, "dur": 1, "custom_key": [1, 2]},
    ]  # fmt: skip


@pytest.fixture(scope="session")
def synthetic_trace(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("synthetic") / "all_phases.json"
    p.write_text(json.dumps({"traceEvents": _synthetic_events(), "distributedInfo": {"rank": 3}}))
    return p


# ----------------------------------------------------------------------------------------------
# the store a case lives in, and what the raw JSON says about it
# ----------------------------------------------------------------------------------------------


@dataclass
class Case:
    path: Path
    trace: Any
    part: int
    store: Path

    def agg(self, name: str) -> pd.DataFrame:
        """One of ``AGGREGATES``, run once per store over all parts, rows of this part."""
        key = (str(self.store), name)
        if key not in _AGG:
            _AGG[key] = self.trace.sql(AGGREGATES[name])
        df = _AGG[key]
        return df[df["part"] == self.part].drop(columns="part")


#: Queries the per-file tests share: each runs once per store, grouped or keyed by part.
#: Source entries only: step spans inferred from optimizer steps or forward calls are events
#: the normaliser adds (``docs/steps.md``), with indexes after the source's own entries.
SOURCE_EVENTS = "(category is distinct from 'xpuprof_inferred_step')"

AGGREGATES = {
    "events": "select part, phase, category, (phase = 'B' and dur is not null) as closed, "
    f"count(*) as n from events where {SOURCE_EVENTS} group by all",
    "flows": "select part, phase, category, count(*) as n from flows group by all",
    "counters": "select part, category, count(distinct index) as n from counters group by all",
    "metadata": "select part, category, count(*) as n from metadata group by all",
    "rows": " union all ".join(
        f"select part, '{t}' as tbl, count(*) as n from {t} group by part"
        for t in ("events", "flows", "links", "counters", "metadata")
    ),
    "levels": "select part, level, count(*) as n from events group by all",
    "event_entries": f"select part, index, phase, name, extra from events where {SOURCE_EVENTS}",
    "flow_entries": "select part, index, phase, name from flows",
    "counter_entries": "select distinct part, index from counters",
    "metadata_entries": "select part, index, name from metadata",
    "launch_links": "select l.part, l.flow_id, l.src_index, l.dst_index, a.index as a_index, "
    "b.index as b_index, a.category as a_cat, b.category as b_cat, "
    "a.correlation as a_corr, b.correlation as b_corr "
    "from links l left join events a on a.id = l.src left join events b on b.id = l.dst "
    "where l.kind in ({})".format(", ".join(f"'{k}'" for k in LAUNCH_FLOWS)),
}
_AGG: dict[tuple[str, str], pd.DataFrame] = {}

_SINGLE_STORES: dict[str, Any] = {}
_INFO: dict[str, Any] = {}


@pytest.fixture(scope="session")
def single_store(tmp_path_factory):
    """``single_store(path)``: a store holding just that file, imported once per session."""
    opened = []

    def get(path: Path):
        key = str(path)
        if key not in _SINGLE_STORES:
            store = tmp_path_factory.mktemp("single") / "s.store"
            xpuprof.import_traces([path], store)
            _SINGLE_STORES[key] = xpuprof.load(store)
            opened.append(_SINGLE_STORES[key])
        return _SINGLE_STORES[key]

    yield get
    for t in opened:
        t.close()
    _SINGLE_STORES.clear()


def _part(trace: Any, path: Path) -> int:
    want = str(Path(path).resolve())
    parts = [s["part"] for s in trace.sources if s["path"] == want]
    assert len(parts) == 1, f"{want} is not exactly once in {trace.path}"
    return parts[0]


@pytest.fixture
def case(request, single_store, synthetic_trace) -> Case:
    p = request.param
    if p == SYNTHETIC:
        trace = single_store(synthetic_trace)
        path = synthetic_trace
    elif p == EXAMPLE:
        trace, _ = request.getfixturevalue("example_store")
        path = EXAMPLE
    else:
        trace, _ = request.getfixturevalue("kineto_store")
        path = p
    return Case(path, trace, _part(trace, path), trace.path)


def info_of(store: Path) -> dict[str, Any]:
    key = str(store)
    if key not in _INFO:
        _INFO[key] = cli_json("info", store)
    return _INFO[key]


@dataclass
class RawFacts:
    """What the raw JSON of one file says, computed with the standard library only."""

    n: int
    ph: list[Any]
    cat: list[Any]
    name: list[Any]
    top: dict[str, Any]
    correlation: dict[int, Any] = field(default_factory=dict)
    #: (s index, f index) of every launch flow pair → (runtime event index, device event index)
    launch: dict[tuple[int, int], tuple[int | None, int | None]] = field(default_factory=dict)
    launch_pairs: int = 0


_FACTS: dict[str, RawFacts] = {}


def raw_facts(path: Path) -> RawFacts:
    key = str(path)
    if key not in _FACTS:
        with no_gc():
            _FACTS[key] = _raw_facts(path)
    return _FACTS[key]


def _raw_facts(path: Path) -> RawFacts:
    doc = read_trace_json(path)
    evs = doc["traceEvents"]
    facts = RawFacts(
        n=len(evs),
        ph=[e.get("ph") for e in evs],
        cat=[e.get("cat") for e in evs],
        name=[e.get("name") for e in evs],
        top={k: v for k, v in doc.items() if k != "traceEvents"},
    )
    # events carrying a correlation id, by (track, correlation, ts); launch flow entries
    by_track: dict[tuple[str, str, Any, Any], list[int]] = collections.defaultdict(list)
    starts: dict[tuple[Any, Any], list[int]] = collections.defaultdict(list)
    finishes: dict[tuple[Any, Any], list[int]] = collections.defaultdict(list)
    for i, e in enumerate(evs):
        ph = e.get("ph")
        if ph == "X":
            args = e.get("args")
            if isinstance(args, dict) and "correlation" in args:
                c = args["correlation"]
                facts.correlation[i] = c
                by_track[(str(e.get("pid")), str(e.get("tid")), c, e["ts"])].append(i)
        elif ph in ("s", "f") and e.get("cat") in LAUNCH_FLOWS:
            (starts if ph == "s" else finishes)[(e.get("cat"), e.get("id"))].append(i)

    def event_at(flow: dict[str, Any]) -> int | None:
        hits = by_track.get((str(flow["pid"]), str(flow["tid"]), flow["id"], flow["ts"]), [])
        return hits[0] if len(hits) == 1 else None

    for key2, fs in finishes.items():
        ss = starts.get(key2, [])
        if not ss:
            continue
        assert len(ss) == 1, f"{path}: flow {key2} has {len(ss)} starts"
        for f in fs:
            facts.launch_pairs += 1
            facts.launch[(ss[0], f)] = (event_at(evs[ss[0]]), event_at(evs[f]))
    return facts


def facts_of(case: Case) -> RawFacts:
    return raw_facts(case.path)


# ----------------------------------------------------------------------------------------------
# every file: counts, coverage, info
# ----------------------------------------------------------------------------------------------


def _merged_ends(case: Case) -> list[dict[str, Any]]:
    """The E entries that B rows hold (``extra["end"]``: index, and cat/name/args if any)."""
    out = []
    for text in case.agg("event_entries")["extra"].dropna():
        end = json.loads(text).get("end")
        if end is not None:
            out.append(end)
    return out


@pytest.mark.parametrize("case", _case_params(), indirect=True)
def test_counts_per_phase_and_category_equal_raw_json(case: Case) -> None:
    raw = facts_of(case)
    ends = _merged_ends(case)
    want_phase = collections.Counter(raw.ph)
    want_cat = collections.Counter(raw.cat)

    phase: collections.Counter = collections.Counter()
    cat: collections.Counter = collections.Counter()
    for r in case.agg("events").itertuples(index=False):
        phase[r.phase] += r.n
        cat[_na(r.category)] += r.n
        if r.closed:
            phase["E"] += r.n
    for end in ends:  # a B row with a duration also holds its E entry (counted as E above)
        cat[end.get("cat")] += 1
    for r in case.agg("flows").itertuples(index=False):
        phase[r.phase] += r.n
        cat[_na(r.category)] += r.n
    for table, ph in (("counters", "C"), ("metadata", "M")):
        for r in case.agg(table).itertuples(index=False):
            phase[ph] += r.n
            cat[_na(r.category)] += r.n

    assert dict(phase) == dict(want_phase)
    assert dict(cat) == dict(want_cat)
    assert all(raw.ph[end["index"]] == "E" for end in ends)


@pytest.mark.parametrize("case", _case_params(), indirect=True)
def test_every_trace_event_is_accounted_for_once(case: Case) -> None:
    """The indexes kept in the tables are exactly 0..n-1, each once, each in the table its
    phase belongs to, with its own name."""
    raw = facts_of(case)
    ev = case.agg("event_entries")
    idx = ev["index"].tolist()
    assert ev["phase"].tolist() == [raw.ph[i] for i in idx]
    assert [_na(x) for x in ev["name"]] == [raw.name[i] for i in idx]
    merged = _merged_ends(case)
    ends = [end["index"] for end in merged]
    assert all(raw.ph[i] == "E" for i in ends)
    assert [end.get("name") for end in merged] == [raw.name[i] for i in ends]
    fl = case.agg("flow_entries")
    fl_idx = fl["index"].tolist()
    assert fl["phase"].tolist() == [raw.ph[i] for i in fl_idx]
    assert set(fl["phase"]) <= {"s", "t", "f"}
    assert [_na(x) for x in fl["name"]] == [raw.name[i] for i in fl_idx]
    co_idx = case.agg("counter_entries")["index"].tolist()
    assert all(raw.ph[i] == "C" for i in co_idx)
    me = case.agg("metadata_entries")
    me_idx = me["index"].tolist()
    assert all(raw.ph[i] == "M" for i in me_idx)
    assert [_na(x) for x in me["name"]] == [raw.name[i] for i in me_idx]
    seen = idx + ends + fl_idx + co_idx + me_idx
    assert len(seen) == len(set(seen)), "an entry is stored twice"
    assert sorted(seen) == list(range(raw.n))


@pytest.mark.parametrize("case", _case_params(), indirect=True)
def test_info_json_reports_reads_and_rows(case: Case) -> None:
    raw = facts_of(case)
    doc = info_of(case.store)
    (src,) = [s for s in doc["sources"] if s["path"] == str(case.path.resolve())]
    assert src["events_read"] == raw.n
    assert src["part"] == case.part
    rows = dict(case.agg("rows").itertuples(index=False))
    assert src["rows"] == {t: rows.get(t, 0) for t in src["rows"]}
    assert set(src["rows"]) == {"events", "flows", "links", "counters", "metadata"}
    assert src["levels"] == dict(case.agg("levels").itertuples(index=False))


def test_info_json_totals_equal_store_sql(kineto_store) -> None:
    trace, _ = kineto_store
    doc = info_of(trace.path)
    assert doc["events_read"] == sum(raw_facts(f).n for f in kineto_files())
    for table in ("events", "flows", "links", "counters", "metadata"):
        assert doc["rows"][table] == trace.sql(f"select count(*) as n from {table}")["n"][0]
    levels = trace.sql("select level, count(*) as n from events group by 1")
    assert doc["levels"] == dict(zip(levels["level"], levels["n"].tolist(), strict=True))
    assert len(doc["sources"]) == len(kineto_files())


@pytest.mark.parametrize("case", _case_params(), indirect=True)
def test_top_level_keys_kept_in_meta(case: Case) -> None:
    """deviceProperties, distributedInfo and every other top-level key land in trace.meta."""
    raw = facts_of(case)
    (src,) = [s for s in case.trace.meta["sources"] if s["part"] == case.part]
    for k, v in raw.top.items():
        assert src["meta"].get(k) == v, k
    dist = raw.top.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        assert src["rank"] == dist["rank"]
        assert src["rank_from"] == "distributedInfo"


@pytest.mark.parametrize("case", _case_params(), indirect=True)
def test_launch_links_join_runtime_call_to_device_work(case: Case) -> None:
    """Every ac2g/async flow pair of the raw JSON becomes a link with both ends resolved, from
    the runtime call to the device event that carry the flow's correlation id."""
    raw = facts_of(case)
    links = case.agg("launch_links")
    both = links.dropna(subset=["a_index", "b_index"])
    assert len(both) == raw.launch_pairs
    assert len(links) == raw.launch_pairs
    got = {(r.src_index, r.dst_index): r for r in both.itertuples(index=False)}
    assert set(got) == set(raw.launch)
    wrong = []
    for key, (want_src, want_dst) in raw.launch.items():
        r = got[key]
        assert want_src is not None and want_dst is not None, key
        cid = int(r.flow_id)
        assert raw.correlation[want_src] == raw.correlation[want_dst] == cid
        if (int(r.a_index), int(r.b_index)) != (want_src, want_dst):
            wrong.append((key, (int(r.a_index), int(r.b_index)), (want_src, want_dst)))
            continue
        assert int(r.a_corr) == int(r.b_corr) == cid
        assert r.a_cat in RUNTIME_CATEGORIES, r
        # MTIA traces also draw ac2g arrows to runtime events on the device's own tracks
        # (raw: the f entry sits on an mtia_runtime slice); everything else lands on device work.
        assert r.b_cat in DEVICE_CATEGORIES or r.b_cat == raw.cat[want_dst] == "mtia_runtime"
    assert not wrong, f"{len(wrong)} links join other events than the flow's correlation: {wrong}"


# ----------------------------------------------------------------------------------------------
# exact time, nesting, steps, fwdbwd
# ----------------------------------------------------------------------------------------------


def test_ns_resolution_timestamps_are_exact(kineto_store, raw_json) -> None:
    path = shared("kineto/gpu/v100_ns_resolution.json.gz")
    trace, _ = kineto_store
    part = _part(trace, path)
    evs = raw_json(path, exact=True)["traceEvents"]
    want_x = {i: (us_to_ns(e["ts"]), us_to_ns(e["dur"])) for i, e in enumerate(evs)
              if e.get("ph") == "X"}  # fmt: skip
    df = trace.sql(f"select index, ts, dur from events where part = {part} and phase = 'X'")
    got_x = {i: (ts, dur) for i, ts, dur in df.itertuples(index=False)}
    assert got_x == want_x
    want_fl = {i: us_to_ns(e["ts"]) for i, e in enumerate(evs) if e.get("ph") in ("s", "f")}
    df = trace.sql(f"select index, ts from flows where part = {part}")
    assert dict(df.itertuples(index=False)) == want_fl
    # the file does carry nanoseconds that float64 microseconds would lose
    lost = sum(1 for i, e in enumerate(evs) if i in want_x
               and round(float(e["ts"]) * 1000) != want_x[i][0])  # fmt: skip
    assert lost > 1000


def _expected_parents(evs: list[dict[str, Any]]) -> dict[int, int | None]:
    """Nesting computed with a stack: sorted by (track, start, longest first, index), each
    event's parent is the nearest earlier slice on its track that ends no earlier than it."""
    items = []
    for i, e in enumerate(evs):
        ph = e.get("ph")
        if ph not in ("X", "i", "I"):
            continue
        ts = us_to_ns(e["ts"])
        is_slice = ph == "X" and "dur" in e
        dur = us_to_ns(e["dur"]) if is_slice else 0
        glob = ph in ("i", "I") and e.get("s") in ("g", "p")
        track = (str(e.get("pid")), "<process>" if glob else str(e.get("tid")))
        items.append((track, ts, -dur, i, ts + dur if is_slice else None))
    items.sort()
    out: dict[int, int | None] = {}
    stack: list[tuple[int, int]] = []
    track_now = None
    for track, ts, _, i, end in items:
        if track != track_now:
            stack, track_now = [], track
        reach = ts if end is None else end
        while stack and stack[-1][1] < reach:
            stack.pop()
        out[i] = stack[-1][0] if stack else None
        if end is not None:
            stack.append((i, end))
    return out


@pytest.mark.parametrize("which", ["example", "gpu/v100_ns_resolution.json.gz"])
def test_nesting_on_real_trace(which: str, request, raw_json) -> None:
    if which == "example":
        path = EXAMPLE
        trace, _ = request.getfixturevalue("example_store")
    else:
        path = shared(f"kineto/{which}")
        trace, _ = request.getfixturevalue("kineto_store")
    part = _part(trace, path)
    # each parent is on the same track and contains its child in time
    bad = trace.sql(
        "select count(*) as n from events c join events p on p.id = c.parent "
        f"where c.part = {part} and not (p.pid = c.pid and p.tid = c.tid and p.ts <= c.ts "
        "and p.dur is not null and c.ts + coalesce(c.dur, 0) <= p.ts + p.dur "
        "and c.depth = p.depth + 1)"
    )["n"][0]
    assert bad == 0
    dangling = trace.sql(
        "select count(*) as n from events c left join events p on p.id = c.parent "
        f"where c.part = {part} and c.parent is not null and p.id is null"
    )["n"][0]
    assert dangling == 0
    want = _expected_parents(raw_json(path, exact=True)["traceEvents"])
    df = trace.sql(
        "select c.index, p.index as parent_index from events c "
        f"left join events p on p.id = c.parent where c.part = {part} "
        "and c.phase in ('X', 'i', 'I')"
    )
    got = {int(i): (None if _na(p) is None else int(p)) for i, p in df.itertuples(index=False)}
    assert got == want
    assert sum(p is not None for p in want.values()) > len(want) // 2  # really nested


@pytest.mark.parametrize(
    "rel",
    ["gpu/a100_rank0of2_nccl.json.gz", "gpu/v100_ns_resolution.json.gz",
     "gpu/mi250_rocm_minitoy.json.gz"],
)  # fmt: skip
def test_fwdbwd_links_forward_op_to_backward_op(rel: str, kineto_store, raw_json) -> None:
    path = shared(f"kineto/{rel}")
    trace, _ = kineto_store
    part = _part(trace, path)
    evs = raw_json(path)["traceEvents"]
    autograd = {
        e["tid"] for e in evs
        if e.get("ph") == "M" and e.get("name") == "thread_name"
        and "autograd" in str((e.get("args") or {}).get("name"))
    }  # fmt: skip
    assert autograd, "the raw trace names an autograd thread"
    s = {e["id"]: e for e in evs if e.get("cat") == "fwdbwd" and e.get("ph") == "s"}
    f = {e["id"]: e for e in evs if e.get("cat") == "fwdbwd" and e.get("ph") == "f"}
    pairs = set(s) & set(f)
    assert pairs
    links = trace.sql(
        "select l.flow_id, a.id as a_id, b.id as b_id, a.tid as a_tid, b.tid as b_tid, "
        "a.category as a_cat, b.category as b_cat, a.ts as a_ts, b.ts as b_ts "
        "from links l join events a on a.id = l.src join events b on b.id = l.dst "
        f"where l.part = {part} and l.kind = 'fwdbwd'"
    )
    assert sorted(int(x) for x in links["flow_id"]) == sorted(pairs)
    args = trace.args(links["a_id"].tolist() + links["b_id"].tolist())
    for r in links.itertuples(index=False):
        fid = int(r.flow_id)
        assert r.a_tid == s[fid]["tid"] and r.a_tid not in autograd
        assert r.b_tid == f[fid]["tid"] and r.b_tid in autograd
        assert r.a_cat == r.b_cat == "cpu_op"
        assert r.a_ts < r.b_ts
        fwd, bwd = args[r.a_id], args[r.b_id]
        assert fwd["Sequence number"] == bwd["Sequence number"]
        assert fwd["Fwd thread id"] == 0 and bwd["Fwd thread id"] != 0


_STEP = re.compile(r"ProfilerStep#(\d+)")


@pytest.mark.parametrize(
    "which",
    ["example", "gpu/a100_rank0of2_nccl.json.gz", "gpu/v100_ns_resolution.json.gz"],
)
def test_steps_from_profiler_step_spans(which: str, request, raw_json) -> None:
    if which == "example":
        path = EXAMPLE
        trace, _ = request.getfixturevalue("example_store")
    else:
        path = shared(f"kineto/{which}")
        trace, _ = request.getfixturevalue("kineto_store")
    part = _part(trace, path)
    evs = raw_json(path, exact=True)["traceEvents"]
    windows = []
    for e in evs:
        m = _STEP.fullmatch(str(e.get("name")))
        if e.get("ph") == "X" and m:
            start = us_to_ns(e["ts"])
            windows.append((e["pid"], start, start + us_to_ns(e["dur"]), int(m.group(1))))
    assert len(windows) >= 3

    def step_at(pid: Any, ts: Any) -> int | None:
        t = us_to_ns(ts)
        hits = [n for p, a, b, n in windows if p == pid and a <= t < b]
        return hits[0] if hits else None

    want = collections.Counter(
        step_at(e["pid"], e["ts"]) for e in evs if e.get("ph") == "X" and e.get("cat") == "cpu_op"
    )
    df = trace.sql(
        f"select step, count(*) as n from events where part = {part} and category = 'cpu_op' "
        "group by step"
    )
    got = {(None if _na(s) is None else int(s)): n for s, n in df.itertuples(index=False)}
    assert got == dict(want)
    steps = trace.sql(
        f"select name, step, level from events where part = {part} and name like 'ProfilerStep#%'"
        " and device < 0"
    )
    assert sorted((int(s), lv) for s, lv in zip(steps["step"], steps["level"], strict=True)) == [
        (n, "step") for *_, n in sorted(windows, key=lambda w: w[3])
    ]
    # device work gets the step of the runtime call with the same correlation id
    launch_step = {
        e["args"]["correlation"]: step_at(e["pid"], e["ts"]) for e in evs
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
        and "correlation" in (e.get("args") or {})
    }  # fmt: skip
    want_dev = {
        i: launch_step[e["args"]["correlation"]] for i, e in enumerate(evs)
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
        and launch_step.get((e.get("args") or {}).get("correlation")) is not None
    }  # fmt: skip
    if which == "example":
        assert not want_dev  # a CPU run: no device work
        return
    assert len(want_dev) > 1000
    df = trace.sql(
        f"select index, step from events where part = {part} "
        "and category in ('kernel', 'gpu_memcpy', 'gpu_memset')"
    )
    got_dev = {int(i): _na(s) for i, s in df.itertuples(index=False)}
    assert {i: got_dev[i] for i in want_dev} == want_dev


# ----------------------------------------------------------------------------------------------
# collectives
# ----------------------------------------------------------------------------------------------

NCCL_ARGS = ("Collective name", "In msg nelems", "Group size", "dtype", "Process Group Ranks")
#: element sizes of the dtype names found in these traces (torch's scalar type names)
DTYPE_SIZE = {"Float": 4, "Long": 8, "Int": 4, "Half": 2, "BFloat16": 2, "Char": 1, "Byte": 1}


def test_nccl_kernels_are_collectives_with_their_args(kineto_store, raw_json) -> None:
    path = shared("kineto/gpu/a100_rank0of2_nccl.json.gz")
    trace, _ = kineto_store
    part = _part(trace, path)
    evs = raw_json(path)["traceEvents"]
    want = {
        i: e for i, e in enumerate(evs)
        if e.get("ph") == "X" and e.get("cat") == "kernel" and e["name"].startswith("nccl")
    }  # fmt: skip
    assert len(want) >= 20
    df = trace.sql(
        f"select id, index, level, bytes from events where part = {part} "
        "and category = 'kernel' and name like 'nccl%'"
    )
    assert sorted(df["index"]) == sorted(want)
    assert set(df["level"]) == {"collective"}
    assert trace.sql(
        f"select count(*) as n from events where part = {part} and level = 'collective'"
    )["n"][0] == len(want)
    args = trace.args(df["id"].tolist())
    for r in df.itertuples(index=False):
        raw_args = want[r.index]["args"]
        for k in NCCL_ARGS:
            assert args[r.id][k] == raw_args[k], (r.index, k)
        assert args[r.id] == raw_args
        n = max(raw_args["In msg nelems"], raw_args["Out msg nelems"])
        assert r.bytes == n * DTYPE_SIZE[raw_args["dtype"]]


def test_synthetic_nccl_dev_kernel_is_a_collective(tmp_path) -> None:
    kernel = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    nccl_args = {
        "correlation": 7, "device": 0, "stream": 7, "Collective name": "allreduce",
        "In msg nelems": 1048576, "Out msg nelems": 1048576, "Group size": 8,
        "dtype": "Float", "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]",
    }  # fmt: skip
    evs = [
        {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": 100,
         "tid": 100, "ts": 5, "dur": 20},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100,
         "ts": 10, "dur": 5, "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": 20, "dur": 30,
         "args": nccl_args},
        {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": 60,
         "dur": 3, "args": {"correlation": 8, "device": 0, "stream": 7}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 7, "pid": 100, "tid": 100, "ts": 10},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 7, "pid": 0, "tid": 7, "ts": 20,
         "bp": "e"},
    ]  # fmt: skip
    path = tmp_path / "nccl_dev.json"
    path.write_text(json.dumps({"traceEvents": evs}))
    with xpuprof.load(path) as trace:
        df = trace.sql("select id, index, name, level, bytes, device, stream from events")
        by_index = {r.index: r for r in df.itertuples(index=False)}
        coll = by_index[2]
        assert coll.name == kernel and coll.level == "collective"
        assert coll.bytes == 1048576 * 4
        assert (coll.device, coll.stream) == (0, 7)
        assert by_index[3].level == "kernel" and _na(by_index[3].bytes) is None
        assert by_index[0].level == "annotation"  # a host-side range, not a kernel
        assert trace.args([coll.id])[coll.id] == nccl_args
        link = trace.sql("select src_index, dst_index, src, dst from links")
        assert link.to_dict("records") == [
            {"src_index": 4, "dst_index": 5, "src": by_index[1].id, "dst": coll.id}
        ]


# ----------------------------------------------------------------------------------------------
# meta, ranks, big integers
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rel", ["edge/distributed_info_not_found.json.gz", "edge/rank_not_found.json.gz"]
)
def test_missing_rank_imports_as_rank_0(rel: str, single_store, raw_json) -> None:
    """A trace that names no rank (no distributedInfo.rank, nothing in its name) is one rank's:
    rank 0, said to be the default, on every row of every table (never null)."""
    path = shared(f"kineto/{rel}")
    doc = raw_json(path)
    assert "rank" not in (doc.get("distributedInfo") or {})
    trace = single_store(path)
    assert trace.ranks == [0]
    assert trace.sources[0]["rank_from"] == "default"
    for table in ("events", "flows", "counters", "metadata"):
        assert trace.sql(f"select count(*) as n from {table} where rank is null")["n"][0] == 0
    assert trace.sql("select count(*) as n from events where rank = 0")["n"][0] == len(
        doc["traceEvents"]
    )  # fmt: skip
    key = 0  # device_properties is keyed by part; this store has one, part 0
    if "deviceProperties" in doc:
        assert trace.meta["device_properties"][key] == doc["deviceProperties"]
    if "distributedInfo" in doc:
        assert trace.meta["distributed_info"][key] == doc["distributedInfo"]
    assert trace.sql("select count(*) as n from events")["n"][0] == len(doc["traceEvents"])


def test_rank_from_file_name_when_trace_has_none(tmp_path, raw_json) -> None:
    path = shared("kineto/edge/rank_not_found.json.gz")
    copy = tmp_path / "job_rank5.json.gz"
    shutil.copyfile(path, copy)
    with xpuprof.load(copy) as trace:
        assert trace.ranks == [5]
        assert trace.sources[0]["rank_from"] == "file name"
        n = len(raw_json(path)["traceEvents"])
        assert trace.sql("select count(*) as n from events where rank = 5")["n"][0] == n


def test_device_properties_and_distributed_info_in_meta(single_store, raw_json) -> None:
    path = shared("kineto/gpu/a100_rank0of2_nccl.json.gz")
    doc = raw_json(path)
    trace = single_store(path)
    rank = doc["distributedInfo"]["rank"]
    assert trace.ranks == [rank]
    assert trace.meta["device_properties"][rank] == doc["deviceProperties"]
    assert trace.meta["distributed_info"][rank] == doc["distributedInfo"]


def test_integer_beyond_int64_comes_back_exactly(single_store) -> None:
    path = shared("kineto/edge/large_integer.json.gz")
    raw = read_trace_json(path)
    (want,) = [e["args"]["Comms Id"] for e in raw["traceEvents"] if "args" in e]
    assert want == 10159970886766084423 > 2**63
    trace = single_store(path)
    ids = trace.sql("select id from events where name = 'record_param_comms'")["id"].tolist()
    got = trace.args(ids)[ids[0]]["Comms Id"]
    assert type(got) is int and got == want


# ----------------------------------------------------------------------------------------------
# a directory of per-rank files, in-process and on Dask
# ----------------------------------------------------------------------------------------------


def test_rank_directory_in_process_and_on_dask(tmp_path, raw_json) -> None:
    folder = shared("kineto/gpu/dlrm_8rank_v100")
    files = sorted(folder.glob("*.json.gz"))
    assert len(files) == 8
    want_rank = {str(f.resolve()): read_trace_json(f)["distributedInfo"]["rank"] for f in files}
    want_n = {str(f.resolve()): len(read_trace_json(f)["traceEvents"]) for f in files}

    one = xpuprof.import_traces([folder], tmp_path / "one.store", workers=1)
    two = xpuprof.import_traces([folder], tmp_path / "two.store", workers=2)
    assert two.workers == 2
    for report in (one, two):
        assert len(report.sources) == 8
        assert sorted(s["part"] for s in report.sources) == list(range(8))
        assert {s["path"]: s["rank"] for s in report.sources} == want_rank
        assert sorted(want_rank.values()) == list(range(8))
        assert {s["rank_from"] for s in report.sources} == {"distributedInfo"}
        assert {s["path"]: s["read"]["total"] for s in report.sources} == want_n
    assert one.rows == two.rows and one.levels == two.levels
    assert {s["path"]: (s["part"], s["rows"]) for s in one.sources} == {
        s["path"]: (s["part"], s["rows"]) for s in two.sources
    }
    queries = [
        "select part, rank, count(*), sum(index), sum(ts), count(parent), count(step), "
        "count(correlation) from events group by all order by all",
        "select part, count(*), count(event), sum(ts) from flows group by all order by all",
        "select part, kind, count(*), count(src), count(dst) from links group by all order by all",
        "select part, count(*) from metadata group by all order by all",
    ]
    with xpuprof.load(one.store) as a, xpuprof.load(two.store) as b:
        assert a.ranks == b.ranks
        for q in queries:
            pd.testing.assert_frame_equal(a.sql(q), b.sql(q))
        by_rank = a.sql("select rank, count(*) as n from events group by rank order by rank")
        assert by_rank["rank"].tolist() == list(range(8))


def test_synthetic_all_phases_details(single_store, synthetic_trace) -> None:
    """B/E pairing, counters per series, string pids, unknown keys and categories."""
    trace = single_store(synthetic_trace)
    ev = {r["index"]: r for r in trace.table("events").to_pylist()}
    outer = ev[1]
    assert outer["phase"] == "B" and outer["dur"] == (20 - 10) * 1000
    assert json.loads(outer["extra"])["end"] == {
        "index": 3,
        "cat": "user_annotation",
        "args": {"result": 1},
    }
    assert ev[4]["dur"] is None  # a B never closed keeps a null duration
    assert ev[5]["phase"] == "E"  # an E that closes nothing stays an entry of its own
    assert ev[2]["ts"] == 11500 and ev[2]["dur"] == 2250 and ev[2]["parent"] == outer["id"]
    assert ev[13]["level"] == "other" and ev[13]["category"] == "my_own_category"
    assert json.loads(ev[13]["extra"]) == {"custom_key": [1, 2]}
    assert ev[13]["pid"] not in (None, 1) and ev[13]["tid"] is not None
    ids = trace.sources[0]["meta"]["string_ids"]
    assert ids["pid"][str(ev[13]["pid"])] == "worker"
    assert ids["tid"][str(ev[13]["tid"])] == "main"
    assert json.loads(ev[8]["args"]) == {"Bytes": 4, "bytes": 5}
    counters = trace.sql("select index, series, value, ts from counters order by index, series")
    assert counters.to_dict("records") == [
        {"index": 6, "series": "allocated", "value": 100.0, "ts": 12000},
        {"index": 6, "series": "reserved", "value": 200.0, "ts": 12000},
        {"index": 7, "series": "gpu", "value": 0.5, "ts": 13000},
    ]
    links = trace.sql("select src_index, dst_index, src, dst from links order by src_index")
    assert links.to_dict("records") == [
        {"src_index": 10, "dst_index": 11, "src": ev[2]["id"], "dst": ev[13]["id"]},
        {"src_index": 11, "dst_index": 12, "src": ev[13]["id"], "dst": outer["id"]},
    ]
    assert trace.ranks == [3]


def test_meta_keeps_device_properties_of_sources_with_the_same_rank(tmp_path) -> None:
    props = {}
    for run, gpu in (("a", "NVIDIA A100"), ("b", "Tesla V100")):
        props[run] = [{"id": 0, "name": gpu}]
        doc = {
            "deviceProperties": props[run],
            "distributedInfo": {"rank": 0, "world_size": 1},
            "traceEvents": [{"ph": "X", "name": "op", "pid": 1, "tid": 1, "ts": 1, "dur": 1}],
        }
        (tmp_path / f"run_{run}.json").write_text(json.dumps(doc))
    xpuprof.import_traces([tmp_path / "run_a.json", tmp_path / "run_b.json"], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as trace:
        assert trace.ranks == [0, 0]
        kept = list(trace.meta["device_properties"].values())
        assert props["a"] in kept and props["b"] in kept

"""The trace viewer's server side (``xpuprof.view``): window, tracks, event, search, overlays
and the zoom tiers.

Expectations come from a synthetic trace whose summaries are worked out by hand below, from
SQL over the store's own tables (counts per track, ILIKE counts, links), and from the raw
JSON of a real trace (the launch and the enclosing spans of a kernel) — never from the code
under test.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from builders import HOST_PID, HOST_TID, TraceBuilder
from conftest import read_trace_json, shared

import xpuprof
from xpuprof import view
from xpuprof.view import NotFound, ViewError, tiers
from xpuprof.view import build as vbuild
from xpuprof.view import levels as vlevels

US = 1000  # ns
WINDOW = sys.modules["xpuprof.view.window"]  # the module (``view.window`` is the function)

# ----------------------------------------------------------------------------------------------
# a synthetic trace, worked out by hand
# ----------------------------------------------------------------------------------------------
#
# One host thread and one stream over [0, 1000) µs, asked at 100 px: a pixel is 10 µs.
#   host depth 0  ProfilerStep#1 [0, 1000)                         1000 µs: an event
#   host depth 1  aten::big      [100, 600)                          500 µs: an event
#   host depth 2  cudaLaunchKernel × 3 at 300, 302, 304 (1 µs)       pixel 30 ┐ one summary, the
#                 cudaLaunchKernel × 2 at 310, 312 (1 µs)            pixel 31 ┘ same name: 5 calls,
#                                                                    5 µs over 20 µs = 0.25 busy
#                 cudaLaunchKernel [350, 352) launching wide_kernel  pixel 35: 1 call, 0.2 busy
#                 instant "marker" at 500                            pixel 50: 1 event, 0 busy
#   stream 7      k_a × 6 of 0.5 µs from 200.0, k_b × 2 of 2 µs      pixel 20: 8 kernels, 3 + 4
#                 at 204.0 and 206.5                                 = 7 µs: busy 0.7; k_b has
#                                                                    the most time (4 > 3 µs)
#                                                                    though k_a is more frequent
#                 wide_kernel [400, 450)                             50 µs: an event
#                 one_px [600, 610)                                  exactly a pixel: an event
#                 just_under [700, 709.999)                          pixel 70: 1, busy 0.9999
#   counter       [memory] Total Allocated, one sample a µs, a spike of 10^9 at 777 µs

K_A = [200.0, 200.6, 201.2, 201.8, 202.4, 203.0]
K_B = [204.0, 206.5]


def _hand_trace() -> TraceBuilder:
    tb = TraceBuilder(rank=0)
    tb.step(1, ts=0, dur=1000)
    tb.op("aten::big", ts=100, dur=500)
    for i, ts in enumerate([300, 302, 304, 310, 312]):
        tb.runtime("cudaLaunchKernel", ts, 1, correlation=900 + i)
    tb.launch("wide_kernel", ts=400, dur=50, launch_ts=350, launch_dur=2, stream=7)
    tb.instant("marker", 500)
    for ts in K_A:
        tb.kernel("k_a", ts, 0.5, stream=7)
    for ts in K_B:
        tb.kernel("k_b", ts, 2, stream=7)
    tb.kernel("one_px", 600, 10, stream=7)
    tb.kernel("just_under", 700, 9.999, stream=7)
    for i in range(1000):
        tb.counter("[memory]", i, **{"Total Allocated": 1e9 if i == 777 else 1000 + i % 7})
    return tb


@pytest.fixture(scope="module")
def hand_store(tmp_path_factory) -> Path:
    """The hand-worked trace imported once; tests that write tiers copy it."""
    return _hand_trace().store(tmp_path_factory.mktemp("hand"))


def _copy(store: Path, to: Path) -> Path:
    shutil.copytree(store, to, ignore=shutil.ignore_patterns(tiers.FOLDER))
    return to


@pytest.fixture
def hand(hand_store: Path, tmp_path: Path):
    with xpuprof.load(_copy(hand_store, tmp_path / "hand.store")) as trace:
        yield trace


def _rows(block: dict[str, list]) -> list[dict[str, Any]]:
    keys = list(block)
    return [dict(zip(keys, vals, strict=True)) for vals in zip(*block.values(), strict=True)]


def test_tracks_of_the_hand_trace(hand) -> None:
    t = view.tracks(hand)
    assert (t["t0"], t["t1"]) == (0, 1000 * US)
    kinds = [(x["kind"], x["pid"], x["tid"], x["device"], x["stream"]) for x in t["tracks"]]
    assert kinds == [("thread", HOST_PID, HOST_TID, -1, None), ("stream", 0, None, 0, 7),
                     ("counter", HOST_PID, None, -1, None)]  # fmt: skip
    host, stream, counter = t["tracks"]
    assert [x["track"] for x in t["tracks"]] == [0, 1, 2]
    # host: step, op, 6 runtime calls, the instant; 3 lanes (depths 0..2)
    assert (host["events"], host["lanes"]) == (9, 3)
    assert (stream["events"], stream["lanes"]) == (11, 1)
    assert (counter["events"], counter["label"]) == (1000, "[memory]: Total Allocated")
    assert host["group"] == f"rank 0 · host {HOST_PID}" and stream["label"] == "stream 7"


def test_window_events_and_summaries_by_hand(hand) -> None:
    w = view.window(hand, 0, 1000 * US, 100)
    assert w["ns_per_px"] == 10 * US and w["summary_px"] == 1 and w["tier"] == "events"
    ev = sorted((e["name"], e["track"], e["depth"], e["ts"], e["dur"]) for e in _rows(w["events"]))
    assert ev == [
        ("ProfilerStep#1", 0, 0, 0, 1000 * US),
        ("aten::big", 0, 1, 100 * US, 500 * US),
        ("one_px", 1, 0, 600 * US, 10 * US),
        ("wide_kernel", 1, 0, 400 * US, 50 * US),
    ]
    sm = sorted((s["track"], s["depth"], s["ts"], s["dur"], s["count"], s["busy"], s["name"])
                for s in _rows(w["summaries"]))  # fmt: skip
    assert sm == [
        (0, 2, 300 * US, 20 * US, 5, 0.25, "cudaLaunchKernel"),
        (0, 2, 350 * US, 10 * US, 1, 0.2, "cudaLaunchKernel"),
        (0, 2, 500 * US, 10 * US, 1, 0.0, "marker"),
        (1, 0, 200 * US, 10 * US, 8, 0.7, "k_b"),
        (1, 0, 700 * US, 10 * US, 1, 0.9999, "just_under"),
    ]
    assert w["items"] == 4 + 5 + len(w["counters"]["ts"]) + len(w["flows"]["src"])
    assert w["items"] < WINDOW.BUDGET


def test_window_counter_keeps_the_spike(hand) -> None:
    w = view.window(hand, 0, 1000 * US, 100)
    c = w["counters"]
    assert set(c["track"]) == {2}
    assert len(c["ts"]) <= 2 * 100 + 2  # min and max per pixel, the first and the last
    assert max(c["value"]) == 1e9 and c["ts"][c["value"].index(1e9)] == 777 * US
    assert c["ts"] == sorted(c["ts"])
    # at a width with more than a pixel per sample, every sample in the window is kept, with
    # the one in effect at the start (at or before it) and the first at or after the end
    w = view.window(hand, 10 * US, 20 * US, 200)
    assert w["counters"]["ts"] == [i * US for i in range(10, 21)]
    w = view.window(hand, 10 * US + 500, 20 * US + 500, 200)
    assert w["counters"]["ts"] == [i * US for i in range(10, 22)]


def test_window_flows_of_returned_events(hand) -> None:
    """The launch of wide_kernel: its ac2g link, checked against the links table."""
    w = view.window(hand, 0, 1000 * US, 100)
    ids = {e["name"]: e["id"] for e in _rows(w["events"])}
    link = hand.sql("select src, dst from links where kind = 'ac2g'")
    assert len(link) == 1
    src, dst = int(link.src[0]), int(link.dst[0])
    assert dst == ids["wide_kernel"]
    fl = _rows(w["flows"])
    assert fl == [{"kind": "ac2g", "src": src, "dst": dst, "src_track": 0, "src_ts": 350 * US,
                   "src_depth": 2, "dst_track": 1, "dst_ts": 400 * US, "dst_depth": 0}]  # fmt: skip
    assert w["flows_cut"] is False and w["flows_total"] == 1


def _per_track(w: dict[str, Any]) -> dict[int, int]:
    got: dict[int, int] = {}
    for t in w["events"]["track"]:
        got[t] = got.get(t, 0) + 1
    for t, n in zip(w["summaries"]["track"], w["summaries"]["count"], strict=True):
        got[t] = got.get(t, 0) + n
    return got


def test_window_coarsens_under_a_small_budget(hand, monkeypatch) -> None:
    monkeypatch.setattr(WINDOW, "BUDGET", 12)
    w = view.window(hand, 0, 1000 * US, 100)
    assert w["summary_px"] > 1 and w["items"] < 12
    assert _per_track(w) == {0: 9, 1: 11}  # nothing lost by merging wider pixels
    px = w["ns_per_px"] * w["summary_px"]
    assert all(d >= px for d in w["events"]["dur"])


def test_window_of_some_tracks_and_the_edges(hand) -> None:
    w = view.window(hand, 0, 1000 * US, 100, tracks=[1])
    assert set(w["events"]["track"]) | set(w["summaries"]["track"]) == {1}
    assert not w["counters"]["ts"]
    # [205, 215) µs: k_b at 204–206 overlaps the start and is 0.2 px wide; k_a do not overlap
    w = view.window(hand, 205 * US, 215 * US, 1000, tracks=[1])
    got = sorted((e["name"], e["ts"]) for e in _rows(w["events"]))
    assert got == [("k_b", 204 * US), ("k_b", 206500)]
    # an instant is in a window that holds its time
    w = view.window(hand, 500 * US, 501 * US, 10, tracks=[0])
    assert "marker" in w["summaries"]["name"]
    assert view.window(hand, 501 * US, 502 * US, 10, tracks=[0])["summaries"]["name"].count(
        "marker") == 0  # fmt: skip


def test_window_from_summary_levels(hand_store: Path, tmp_path: Path, monkeypatch) -> None:
    """With every level written (thresholds off), a window is answered from buckets and still
    accounts for every event and every nanosecond of busy time."""
    monkeypatch.setattr(vlevels, "MIN_THIN", 0)
    monkeypatch.setattr(vlevels, "COMPRESSION", 1.0)
    with xpuprof.load(_copy(hand_store, tmp_path / "s.store")) as trace:
        w = view.window(trace, 0, 1000 * US, 100)
        assert w["tier"].startswith("summaries of 4096 ns")
        assert _per_track(w) == {0: 9, 1: 11}
        thin = [s for s in _rows(w["summaries"]) if s["track"] == 1]
        busy = sum(s["busy"] * s["dur"] for s in thin)
        assert busy == pytest.approx((6 * 0.5 + 2 * 2 + 9.999) * US, rel=1e-3)


# ----------------------------------------------------------------------------------------------
# real traces
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def alexnet(tmp_path_factory):
    path = shared("kineto/gpu/a100_alexnet_cuda_sync.json.gz")
    store = tmp_path_factory.mktemp("alexnet") / "a.store"
    xpuprof.import_traces([path], store)
    with xpuprof.load(store) as trace:
        yield trace


@pytest.fixture(scope="module")
def sync(tmp_path_factory):
    path = shared("kineto/gpu/a100_cuda_event_sync.json.gz")
    store = tmp_path_factory.mktemp("sync") / "s.store"
    xpuprof.import_traces([path], store)
    with xpuprof.load(store) as trace:
        yield path, trace


def test_string_pids_and_tids_are_labelled_as_the_source_spelled_them(tmp_path: Path) -> None:
    """Kineto writes a few host events with string pids and tids (``Spans`` / ``PyTorch
    Profiler``, ``Traces``, and the empty string); they are stored as negative numbers, but a
    track's group and label name the strings, and the real threads come first."""
    path = shared("kineto/gpu/a100_triton.json.gz")
    raw = read_trace_json(path)["traceEvents"]
    spelled = {(e["pid"], e["tid"]) for e in raw
               if e.get("ph") != "M" and isinstance(e.get("pid"), str)}  # fmt: skip
    assert ("", "") in spelled and ("Spans", "PyTorch Profiler") in spelled
    want = {(f"rank 0 · {p or '(unnamed process)'}", t or "(unnamed thread)") for p, t in spelled}
    numeric = {
        e["tid"]
        for e in raw
        if e.get("ph") == "X"
        and isinstance(e.get("pid"), int)
        and e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")
    }
    store = tmp_path / "t.store"
    xpuprof.import_traces([path], store)
    with xpuprof.load(store) as trace:
        threads = [t for t in view.tracks(trace)["tracks"] if t["kind"] == "thread"]
    named = {(t["group"], t["label"]) for t in threads if t["pid"] < 0}
    assert named == want
    # the real host threads first, then the string ones
    first = threads[: len(threads) - len(named)]
    assert {t["tid"] for t in first} == numeric and all(t["pid"] >= 0 for t in first)


def test_whole_window_accounts_for_every_event(alexnet) -> None:
    info = view.tracks(alexnet)
    want = {}
    for t in info["tracks"]:
        if t["kind"] == "thread":
            q = f"device < 0 and pid = {t['pid']} and tid = {t['tid']}"
        elif t["kind"] == "stream":
            q = f"device = {t['device']} and stream = {t['stream']}"
        else:
            continue
        want[t["track"]] = int(alexnet.sql(f"select count(*) n from events where {q}").n[0])
    assert sum(want.values()) == alexnet.manifest["rows"]["events"]
    for width in (1500, 8000, 40):
        w = view.window(alexnet, info["t0"], info["t1"], width)
        assert _per_track(w) == {k: v for k, v in want.items() if v}, width
        assert w["items"] < WINDOW.BUDGET


def test_search_matches_sql(alexnet) -> None:
    for text in ("conv", "CUDALAUNCH", "relu", "zzz-none"):
        got = view.search(alexnet, text, limit=7)
        sql = alexnet.sql(f"select id, ts from events where name ilike '%{text}%' "
                          "order by ts, id")  # fmt: skip
        assert got["total"] == len(sql)
        assert [m["id"] for m in got["matches"]] == [int(i) for i in sql.id[:7]]
        assert all(text.lower() in m["name"].lower() for m in got["matches"])


def test_event_ancestry_of_a_kernel_from_the_raw_json(sync) -> None:
    """A kernel's ancestry: the cudaLaunchKernel its ac2g flow starts at, then every span of
    that thread enclosing the call, innermost first (an aten op, up to ProfilerStep)."""
    path, trace = sync
    raw = read_trace_json(path)["traceEvents"]
    kernels = [i for i, e in enumerate(raw) if e.get("cat") == "kernel"]
    assert kernels
    in_ops = 0
    for k in kernels:
        corr = raw[k]["args"]["correlation"]
        launch = [i for i, e in enumerate(raw) if e.get("cat") == "cuda_runtime"
                  and e.get("args", {}).get("correlation") == corr]  # fmt: skip
        assert len(launch) == 1
        call = raw[launch[0]]
        outer = [
            i
            for i, e in enumerate(raw)
            if e.get("ph") == "X"
            and i != launch[0]
            and (e["pid"], e["tid"]) == (call["pid"], call["tid"])
            and e["ts"] <= call["ts"]
            and e["ts"] + e["dur"] >= call["ts"] + call["dur"]
        ]
        outer.sort(key=lambda i: (raw[i]["dur"], -raw[i]["ts"]))
        got = view.event(trace, k)  # part 0: the id is the index in traceEvents
        assert got["name"] == raw[k]["name"] and got["level"] == "kernel"
        assert got["args"] == raw[k]["args"]
        assert [(a["id"], a["via"]) for a in got["ancestry"]] == [
            (launch[0], "launch"),
            *((i, "parent") for i in outer),
        ]
        names = [a["name"] for a in got["ancestry"]]
        assert names[0] == "cudaLaunchKernel" and names[-1].startswith("ProfilerStep#")
        in_ops += any(n.startswith("aten::") for n in names)
        assert got["flows"] == [{"id": launch[0], "name": "cudaLaunchKernel", "level": "runtime",
                                 "ts": got["ancestry"][0]["ts"], "dur": got["ancestry"][0]["dur"],
                                 "track": got["ancestry"][0]["track"],
                                 "depth": got["ancestry"][0]["depth"], "kind": "ac2g",
                                 "direction": "in"}]  # fmt: skip
    assert in_ops >= 3  # three of the four are launched inside an aten op


def test_event_of_a_host_op_and_its_flows(sync) -> None:
    _, trace = sync
    call = trace.sql("select src, dst from links where kind = 'ac2g' order by src limit 1")
    src, dst = int(call.src[0]), int(call.dst[0])
    got = view.event(trace, src)
    assert got["level"] == "runtime" and got["ancestry"][0]["via"] == "parent"
    assert [(f["id"], f["direction"], f["kind"]) for f in got["flows"]] == [(dst, "out", "ac2g")]
    parent = int(trace.sql(f"select parent from events where id = {src}").parent[0])
    assert got["ancestry"][0]["id"] == parent


def test_overlays_place_path_and_findings(sync) -> None:
    from xpuprof.advise.rules import advise
    from xpuprof.analysis.critical_path import critical_path

    _, trace = sync
    o = view.overlays(trace)
    path = critical_path(trace).tables["path"]
    assert len(o["critical_path"]) == len(path)
    info = {t["track"]: t for t in view.tracks(trace)["tracks"]}
    for seg, (_, p) in zip(o["critical_path"], path.iterrows(), strict=True):
        assert (seg["ts"], seg["dur"], seg["category"]) == (p.start, p.end - p.start,
                                                              p.attribution)  # fmt: skip
        if seg["id"] is not None:
            row = trace.sql(f"select pid, tid, device, stream, depth from events "
                            f"where id = {seg['id']}").iloc[0]  # fmt: skip
            t = info[seg["track"]]
            assert (t["device"], seg["depth"]) == (row.device, row.depth)
            assert (t["pid"], t["tid"]) == (row.pid, row.tid) if row.device < 0 else \
                t["stream"] == row.stream  # fmt: skip
    recs = advise(trace).tables["recommendations"]
    assert [f["ids"] for f in o["findings"]] == [list(e) for e in recs["events"]]
    for f in o["findings"]:
        assert [e["id"] for e in f["events"]] == f["ids"]


# ----------------------------------------------------------------------------------------------
# the tiers: where, atomic, reused, rebuilt
# ----------------------------------------------------------------------------------------------


def _folders(store: Path) -> list[str]:
    d = store / tiers.FOLDER
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_tiers_written_once_and_reused(hand_store: Path, tmp_path: Path, monkeypatch) -> None:
    store = _copy(hand_store, tmp_path / "t.store")
    with xpuprof.load(store) as trace:
        view.tracks(trace)
        digest = tiers.digest(trace)
    assert _folders(store) == [digest]  # no temporary left over
    assert json.loads((store / tiers.FOLDER / digest / "meta.json").read_text())["events"] == 20

    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("rebuilt")

    monkeypatch.setattr(vbuild, "build", boom)
    with xpuprof.load(store) as trace:  # a second server finds them
        assert view.window(trace, 0, 1000 * US, 100)["events"]["id"]
    monkeypatch.undo()
    shutil.rmtree(store / tiers.FOLDER / digest)
    with xpuprof.load(store) as trace:  # deleted: rebuilt
        assert len(view.tracks(trace)["tracks"]) == 3
    assert _folders(store) == [digest]


def test_damaged_tiers_are_rebuilt(hand_store: Path, tmp_path: Path) -> None:
    store = _copy(hand_store, tmp_path / "t.store")
    with xpuprof.load(store) as trace:
        want = view.window(trace, 0, 1000 * US, 100)
        folder = tiers.open_tiers(trace).path
    (folder / "ev_ts.npy").unlink()
    with xpuprof.load(store) as trace:
        got = view.window(trace, 0, 1000 * US, 100)
    assert {k: v for k, v in got.items() if k != "elapsed_ms"} == {
        k: v for k, v in want.items() if k != "elapsed_ms"
    }
    assert (folder / "ev_ts.npy").is_file()


def test_mapped_pages_let_go(hand, monkeypatch) -> None:
    """With no room for mapped pages, every answer unmaps them: the next reads them again."""
    monkeypatch.setattr(tiers, "TRIM_BYTES", 0)
    a = view.window(hand, 0, 1000 * US, 100)
    b = view.window(hand, 0, 1000 * US, 100)
    assert a["summaries"] == b["summaries"] and a["events"] == b["events"]


def test_stale_tiers_are_replaced(hand_store: Path, tmp_path: Path) -> None:
    store = _copy(hand_store, tmp_path / "t.store")
    stale = store / tiers.FOLDER / "0123456789abcdef"
    stale.mkdir(parents=True)
    (stale / "meta.json").write_text("{}")
    with xpuprof.load(store) as trace:
        view.tracks(trace)
        assert _folders(store) == [tiers.digest(trace)]


def test_unwritable_store_uses_the_cache(hand_store: Path, tmp_path: Path, monkeypatch) -> None:
    store = _copy(hand_store, tmp_path / "t.store")
    (store / tiers.FOLDER).write_text("not a folder")  # nothing can be created under it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with xpuprof.load(store) as trace:
        assert view.window(trace, 0, 1000 * US, 100)["summaries"]["count"]
        where = tiers.open_tiers(trace).path
        assert where == tmp_path / "cache" / "xpuprof" / "view" / tiers.digest(trace)
    assert (store / tiers.FOLDER).is_file()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_store_uses_the_cache(hand_store: Path, tmp_path: Path, monkeypatch) -> None:
    store = _copy(hand_store, tmp_path / "t.store")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store.chmod(0o555)
    try:
        with xpuprof.load(store) as trace:
            assert tiers.open_tiers(trace).path.is_relative_to(tmp_path / "cache")
    finally:
        store.chmod(0o755)


def test_two_builders_at_once_the_first_rename_wins(hand_store: Path, tmp_path: Path,
                                                    monkeypatch) -> None:  # fmt: skip
    """While this process builds, another finishes first: ours is discarded, theirs used."""
    store = _copy(hand_store, tmp_path / "t.store")
    real = vbuild.build
    seen = {}

    def racing(trace: Any, out: Path, digest: str) -> dict[str, Any]:
        other = out.parent / ".other-builder"
        other.mkdir()
        real(trace, other, digest)
        os.rename(other, out.parent / digest)  # the other process's rename
        seen["theirs"] = (out.parent / digest / "meta.json").stat().st_ino
        return real(trace, out, digest)

    monkeypatch.setattr(vbuild, "build", racing)
    with xpuprof.load(store) as trace:
        view.tracks(trace)
        path = tiers.open_tiers(trace).path
    assert (path / "meta.json").stat().st_ino == seen["theirs"]
    assert _folders(store) == [path.name]


# ----------------------------------------------------------------------------------------------
# bad parameters
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda t: view.window(t, 10, 10, 100), ViewError),
        (lambda t: view.window(t, 10, 5, 100), ViewError),
        (lambda t: view.window(t, 0, 10, 0), ViewError),
        (lambda t: view.window(t, 0, 10, 10**6), ViewError),
        (lambda t: view.window(t, "a", 10, 100), ViewError),
        (lambda t: view.window(t, 0.5, 10, 100), ViewError),
        (lambda t: view.window(t, True, 10, 100), ViewError),
        (lambda t: view.window(t, 0, 10, 100, tracks=[99]), NotFound),
        (lambda t: view.window(t, 0, 10, 100, tracks="0"), ViewError),
        (lambda t: view.event(t, 123456789), NotFound),
        (lambda t: view.event(t, -1), ViewError),
        (lambda t: view.event(t, "x"), ViewError),
        (lambda t: view.search(t, ""), ViewError),
        (lambda t: view.search(t, "a", limit=-1), ViewError),
        (lambda t: view.search(t, None), ViewError),
        (lambda t: view.overlays(t, steps="sometimes"), ViewError),
        (lambda t: view.overlays(t, ranks="0"), ViewError),
    ],
)
def test_bad_parameters(hand, call: Any, error: type) -> None:
    with pytest.raises(error):
        call(hand)


def test_not_found_is_a_view_error() -> None:
    assert issubclass(NotFound, ViewError)
    from xpuprof.core.errors import XpuprofError

    assert issubclass(ViewError, XpuprofError)


def test_answers_are_plain_json(hand) -> None:
    """Nothing numpy in the answers: they go through ``json.dumps`` unchanged."""
    w = view.window(hand, 0, 1000 * US, 100)
    k = w["events"]["id"][w["events"]["name"].index("wide_kernel")]
    for doc in (view.tracks(hand), w, view.event(hand, k), view.search(hand, "k_")):
        assert json.loads(json.dumps(doc)) == doc

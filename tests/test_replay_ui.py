"""What a user sees of the replay: ``xpuprof replay`` (text and ``--json``), its Chrome-trace
export, the simulated tracks of the viewer and the web UI's replay page.

Stores: the trace shipped in the package (a PyTorch CPU training run: every test runs on a
fresh clone) and the 8-rank DLRM job from ../shared/traces (skipped with the reason when
absent).

Expected numbers come from outside the code under test where they can: step durations from the
raw JSON (the ``ProfilerStep#N`` spans, exact decimals), spans and counts from the replay's own
per-event table (``Replay.events()``) aggregated here, edge counts from the graph's arrays, the
export's measured entries from ``xpuprof export`` of the same store; what only the simulator
knows (simulated times) is compared between the CLI, the file, the viewer and the Python API,
event by event.
"""

from __future__ import annotations

import decimal
import gzip
import json
import math
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from browser import browser, open_page  # noqa: F401  (pytest fixtures)
from conftest import EXAMPLE, SHARED_TRACES, cli, cli_json, read_trace_json, us_to_ns

import xpuprof
from xpuprof.export.chrome import export_chrome
from xpuprof.sim import replay
from xpuprof.sim.graph import EDGE_KINDS
from xpuprof.trace.trace import Trace
from xpuprof.ui import tools
from xpuprof.ui.web.server import running
from xpuprof.view import event as view_event
from xpuprof.view import tracks as view_tracks
from xpuprof.view import window as view_window

DLRM = SHARED_TRACES / "kineto/gpu/dlrm_8rank_v100"
SIM = "simulated · "


# ------------------------------------------------------------------------------- stores


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """A directory of stores: ``example`` (always), ``dlrm`` (when the shared traces are
    here)."""
    root = tmp_path_factory.mktemp("replay-ui") / "stores"
    root.mkdir()
    xpuprof.import_traces([EXAMPLE], root / "example")
    have = {"example": root / "example"}
    if DLRM.is_dir():
        xpuprof.import_traces(sorted(DLRM.glob("*.json.gz")), root / "dlrm")
        have["dlrm"] = root / "dlrm"
    return have


def raw_files(name: str) -> list[Path]:
    return [EXAMPLE] if name == "example" else sorted(DLRM.glob("*.json.gz"))


@pytest.fixture(params=["example", "dlrm"])
def store(request, stores) -> tuple[str, Path]:
    if request.param not in stores:
        pytest.skip(f"{DLRM} not found: set XPUPROF_TEST_TRACES to the shared traces")
    return request.param, stores[request.param]


@pytest.fixture(scope="module")
def replays(stores):
    """The replay of each store in this process (Python API), with its events table."""
    opened: dict[str, Any] = {}

    def get(name: str) -> tuple[Trace, Any, Any]:
        if name not in opened:
            trace = Trace(stores[name])
            rp = replay(trace)
            opened[name] = (trace, rp, rp.events())
        return opened[name]

    yield get
    for trace, _, _ in opened.values():
        trace.close()


def raw_steps(files: list[Path]) -> dict[tuple[int, int], int]:
    """(rank, step) → ns of each ``ProfilerStep#N`` span, from the raw JSON (exact decimals);
    the rank from ``distributedInfo``, 0 without it."""
    out = {}
    for f in files:
        doc = read_trace_json(f, exact=True)
        rank = int((doc.get("distributedInfo") or {}).get("rank", 0))
        for e in doc["traceEvents"]:
            m = re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name", "")))
            if m and e.get("ph") == "X":
                out[(rank, int(m.group(1)))] = us_to_ns(e["dur"])
    return out


# ---------------------------------------------------------------------------------- CLI


def test_cli_json_numbers(store, replays):
    """``xpuprof replay STORE --json``: each step's measured time is the raw JSON's step span,
    its simulated time the replay's, the error their relative difference; each rank's span is
    its replayed events' first start to last end (measured and simulated); the edge counts are
    the graph's; nodes are two per replayed event plus the rendezvous."""
    name, path = store
    doc = cli_json("replay", path)
    trace, rp, ev = replays(name)
    facts, tables = doc["facts"], doc["tables"]
    assert next(iter(facts)) == "headline" and facts["headline"].startswith("Replay reproduces")
    # steps: measured from the raw JSON, simulated from the replay's own event table
    raw = raw_steps(raw_files(name))
    steps = tables["steps"]
    assert {(r["rank"], r["step"]) for r in steps} == set(raw)
    ends = ev.assign(sim_end=ev["sim_ts"] + ev["sim_dur"]).set_index("name")
    for r in steps:
        assert r["measured_ns"] == raw[(r["rank"], r["step"])], r
        mine = ends.loc[[f"ProfilerStep#{r['step']}"]]
        mine = mine[mine["rank"] == r["rank"]]
        assert len(mine) == 1
        assert r["simulated_ns"] == int(mine["sim_dur"].iloc[0]), r
        assert math.isclose(r["error_pct"], 100 * (r["simulated_ns"] - r["measured_ns"])
                            / r["measured_ns"], abs_tol=1e-4)  # fmt: skip
    errors = [abs(r["error_pct"]) for r in steps]
    assert math.isclose(facts["median_error_pct"], float(np.median(errors)), abs_tol=1e-3)
    assert math.isclose(facts["worst_error_pct"], max(errors), abs_tol=1e-3)
    # per rank: steps, spans
    per = ev.assign(end=ev["ts"] + ev["dur"], sim_end=ev["sim_ts"] + ev["sim_dur"]).groupby("rank")
    for r in tables["summary"]:
        g = per.get_group(r["rank"])
        assert r["steps"] == sum(1 for k in raw if k[0] == r["rank"])
        assert r["span_measured_ns"] == int(g["end"].max() - g["ts"].min())
        assert r["span_simulated_ns"] == int(g["sim_end"].max() - g["sim_ts"].min())
        assert r["measured_ns"] == sum(v for k, v in raw.items() if k[0] == r["rank"])
    # the graph
    kinds = Counter(EDGE_KINDS[k] for k in rp.graph.edges.kind.tolist())
    assert {r["kind"]: r["edges"] for r in tables["edges"]} == {k: kinds.get(k, 0)
                                                                for k in EDGE_KINDS}  # fmt: skip
    assert facts["edges"] == len(rp.graph.edges.kind) == sum(kinds.values())
    rendezvous = int((rp.graph.nodes.kind == 4).sum())
    assert facts["nodes"] == 2 * len(ev) + rendezvous
    if name == "dlrm":  # 8 ranks × 8 collectives matched across ranks: one rendezvous each
        assert rendezvous == 8 and len(tables["summary"]) == 8
    # the deviations: each point's simulated time minus its measured one (a start or an end)
    by_id = ev.set_index("id")
    for r in tables["deviations"]:
        e = by_id.loc[r["event"]]
        if r["point"] == "start":
            want = (int(e["ts"]), int(e["sim_ts"]))
        else:
            want = (int(e["ts"] + e["dur"]), int(e["sim_ts"] + e["sim_dur"]))
        assert (r["measured"], r["simulated"]) == want
        assert r["deviation_ns"] != 0


def test_cli_text_fits_and_has_units(stores):
    """At 80 columns the answer comes first, every line fits, times carry their unit, and no
    traceback or empty table shows; a wide terminal shows every column of the deviations."""
    path = stores.get("dlrm") or stores["example"]
    narrow = cli("replay", path, env={"COLUMNS": "80"})
    assert narrow.returncode == 0, narrow.stderr
    lines = narrow.stdout.splitlines()
    assert lines[0].startswith("Replay reproduces the measured steps within")
    assert max(map(len, lines)) <= 80, [ln for ln in lines if len(ln) > 80]
    assert "Traceback" not in narrow.stdout + narrow.stderr
    assert "(ms)" in narrow.stdout and "edges per kind" in narrow.stdout
    assert "(no rows)" not in narrow.stdout
    wide = cli("replay", path, env={"COLUMNS": "220"})
    assert wide.returncode == 0, wide.stderr
    if "dlrm" in stores:  # it has deviations (clock alignment): their cause is a column
        assert re.search(r"deviation \((?:ns|µs|ms)\).*cause", wide.stdout)
        assert re.search(r"\w+ edge from (?:event \d+|a rendezvous)", wide.stdout)


def test_cli_bad_options(stores, tmp_path):
    """Each bad option is one line on stderr naming it, exit code 2, and nothing written."""
    path = stores["example"]
    cases = [
        (["--output", tmp_path / "a.json"], "add --export chrome"),
        (["--export", "perfetto"], "'perfetto': not an export format"),
        (["--export", "chrome", "-o", tmp_path / "nowhere" / "a.json"], "does not exist"),
        (["--rank", "3"], "rank 3"),
    ]
    for args, message in cases:
        p = cli("replay", path, *args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert message in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------ Chrome export


def is_sim(e: dict[str, Any], sim_threads: set[tuple[Any, Any]]) -> bool:
    return (e.get("pid"), e.get("tid")) in sim_threads


def test_chrome_export(store, replays, tmp_path):
    """``--export chrome -o FILE``: the measured entries are exactly what ``xpuprof export``
    writes of the store; then one simulated event per replayed event, at its simulated time
    (``ts`` = ``sim_ts`` / 1000 exactly, ``dur`` = ``sim_dur`` / 1000), on threads named
    ``simulated · <thread>`` in the measured event's own process, whose tids no measured thread
    of that process has; nothing but the file is left in the folder."""
    name, path = store
    out = tmp_path / "replay.json.gz"
    doc = cli_json("replay", path, "--export", "chrome", "-o", out)
    written = doc["facts"]["export"]
    assert written["path"] == str(out) and out.is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["replay.json.gz"]  # no temporary left
    got = json.loads(gzip.decompress(out.read_bytes()), parse_float=decimal.Decimal)
    trace, rp, ev = replays(name)
    plain = tmp_path / "export" / "plain.json"
    plain.parent.mkdir()
    export_chrome(trace, plain)
    want = json.loads(plain.read_text(), parse_float=decimal.Decimal)
    # simulated threads: named by a thread_name entry
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in got["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}  # fmt: skip
    sim_threads = {k for k, v in names.items() if v.startswith(SIM)}
    measured = [e for e in got["traceEvents"] if not is_sim(e, sim_threads)]
    assert measured == want["traceEvents"]
    assert {k: v for k, v in got.items() if k not in ("traceEvents", "xpuprofReplay")} == \
        {k: v for k, v in want.items() if k != "traceEvents"}  # fmt: skip
    assert got["xpuprofReplay"]["facts"]["edges"] == len(rp.graph.edges.kind)
    spans = [e for e in got["traceEvents"] if is_sim(e, sim_threads) and e["ph"] == "X"]
    assert len(spans) == len(ev) == written["simulated"]
    assert written["threads"] == len(sim_threads)
    assert written["measured"] == len(measured) and written["events"] == len(got["traceEvents"])
    by_id = ev.set_index("id")
    for e in spans:
        row = by_id.loc[e["args"]["event"]]
        assert decimal.Decimal(e["ts"]) * 1000 == int(row["sim_ts"]), e
        assert decimal.Decimal(e["dur"]) * 1000 == int(row["sim_dur"]), e
        assert e["name"] == row["name"] and e["cat"] == row["category"]
        assert e["args"]["start_deviation_ns"] == int(row["sim_ts"] - row["ts"])
    # each simulated thread is named after a measured thread of its process, and is not one
    measured_threads = {(e.get("pid"), e.get("tid")) for e in measured if "tid" in e}
    assert not sim_threads & measured_threads
    assert {pid for pid, _ in sim_threads} <= {pid for pid, _ in measured_threads}
    streams = {names[(e["pid"], e["tid"])] for e in spans if e["cat"] == "kernel"}
    if name == "dlrm":
        assert f"{SIM}stream 7" in streams
    host = {names[(e["pid"], e["tid"])] for e in spans if e["cat"] == "cpu_op"}
    assert host and all(re.fullmatch(SIM + r"thread \d+ \(python3?\)", h) for h in host), host


def test_chrome_export_default_path(stores, tmp_path):
    """Without ``--output`` the file goes beside the store (``STORE.replay.json.gz``); for a
    trace file imported on the fly, beside that file."""
    store = tmp_path / "s"
    shutil.copytree(stores["example"], store, ignore=shutil.ignore_patterns("view"))
    doc = cli_json("replay", store, "--export", "chrome")
    assert doc["facts"]["export"]["path"] == str(tmp_path / "s.replay.json.gz")
    src = tmp_path / "run" / "train.pt.trace.json.gz"
    src.parent.mkdir()
    shutil.copy(EXAMPLE, src)
    doc = cli_json("replay", src, "--export", "chrome")
    assert doc["facts"]["export"]["path"] == str(src.parent / "train.pt.trace.replay.json.gz")
    assert json.loads(gzip.decompress(Path(doc["facts"]["export"]["path"]).read_bytes()))


# ---------------------------------------------------------------- the viewer's data layer


def test_viewer_simulated_tracks(store, replays):
    """``view.tracks(trace, sim=True)``: after each replayed thread and stream, its twin
    ``sim: <label>`` (same rank, kind, pid, tid, device, stream) holding its replayed events;
    a window over everything answers every replayed event exactly once on those tracks
    (as an event at its simulated time, or in a per-pixel summary), and ``view.event`` gives
    the simulated start and duration of the replay."""
    name, _ = store
    trace, rp, ev = replays(name)
    doc = view_tracks(trace, sim=True)
    measured = view_tracks(trace)
    n = len(measured["tracks"])
    assert doc["origin"] == measured["t0"]
    tracks = doc["tracks"]
    assert [t for t in tracks if not t.get("sim")] == measured["tracks"]
    sims = [t for t in tracks if t.get("sim")]
    for i, t in enumerate(tracks):
        if t.get("sim"):  # right after its measured twin
            twin = tracks[i - 1]
            assert twin["track"] == t["of"] and t["label"] == "sim: " + twin["label"]
            assert t["track"] >= n
            for k in ("rank", "kind", "pid", "tid", "device", "stream", "group"):
                assert t[k] == twin[k], (k, t, twin)
    keys = ev.assign(dev=ev["device"].fillna(-1) >= 0)
    keys = keys.assign(a=np.where(keys["dev"], keys["device"], keys["pid"]),
                       b=np.where(keys["dev"], keys["stream"], keys["tid"]))  # fmt: skip
    assert len(sims) == len(keys[["part", "dev", "a", "b"]].drop_duplicates())
    assert sum(t["events"] for t in sims) == len(ev)
    w = view_window(trace, doc["t0"], doc["t1"], 4000, [t["track"] for t in sims], sim=True)
    assert w["items"] < 50_000
    assert all(t >= n for t in w["events"]["track"] + w["summaries"]["track"])
    assert len(w["events"]["id"]) + sum(w["summaries"]["count"]) == len(ev)
    by_id = ev.set_index("id")
    got = by_id.loc[w["events"]["id"]]
    assert (got["sim_ts"].to_numpy() == np.array(w["events"]["ts"])).all()
    assert (got["sim_dur"].to_numpy() == np.array(w["events"]["dur"])).all()
    # both halves of a window: measured tracks as without the simulated ones
    both = view_window(trace, doc["t0"], doc["t1"], 1500, sim=True)
    assert both["items"] < 50_000
    assert {t for t in both["events"]["track"] if t < n} <= {t["track"] for t in
                                                            measured["tracks"]}  # fmt: skip
    # one event: the longest replayed kernel (else op) and its simulated place
    pick = ev[ev["level"].isin(["kernel"])] if (ev["level"] == "kernel").any() else ev
    row = pick.sort_values("sim_dur").iloc[-1]
    e = view_event(trace, int(row["id"]), sim=True)
    assert (e["ts"], e["dur"]) == (int(row["ts"]), int(row["dur"]))
    s = e["simulated"]
    assert (s["ts"], s["dur"]) == (int(row["sim_ts"]), int(row["sim_dur"]))
    assert s["start_deviation_ns"] == int(row["sim_ts"] - row["ts"])
    assert tracks[[t["track"] for t in tracks].index(s["track"])]["of"] == e["track"]


def test_simulated_store_is_rebuilt_when_missing(stores, tmp_path):
    """The simulated timeline lives beside the tiers (``STORE/view/<digest>.replay-…``):
    deleted, it is built again on the next question, with the same answer."""
    from xpuprof.view import simulated

    store = tmp_path / "s"
    shutil.copytree(stores["example"], store, ignore=shutil.ignore_patterns("view"))
    with Trace(store) as trace:
        first = view_tracks(trace, sim=True)
        folder = simulated.locate(trace)
        assert folder.parent == store / "view" and ".replay-" in folder.name
    shutil.rmtree(folder)
    with Trace(store) as trace:
        assert view_tracks(trace, sim=True) == first
        assert [p.name for p in (store / "view").iterdir() if ".replay-" in p.name] == [folder.name]


# --------------------------------------------------------------------------------- web


@pytest.fixture(scope="module")
def server(stores) -> Any:
    root = next(iter(stores.values())).parent
    with running(root) as url:
        yield url


def main_store(stores: dict[str, Path]) -> str:
    return "dlrm" if "dlrm" in stores else "example"


def get(url: str, **params: Any) -> tuple[int, Any]:
    r = httpx.get(url, params=params, timeout=180)
    return r.status_code, r.json()


def test_web_never_writes(server, stores):
    """The web UI takes no option that writes a file: the replay page offers none, and the
    API refuses them (400) without writing anything beside the store; a ``sim`` flag that is
    not yes or no is a 400 too."""
    name = main_store(stores)
    status, pages = get(f"{server}api/pages")
    page = next(p for p in pages if p["name"] == "replay")
    assert page["renderer"] == "replay"
    assert {c["name"] for c in page["controls"]} == {"ranks", "steps", "top", "align"}
    for opt in ({"export": "chrome"}, {"output": "/tmp/x.json"}):
        status, body = get(f"{server}api/s/{name}/tools/replay", **opt)
        assert status == 400 and "writes files" in body["error"], body
    assert not list(stores[name].parent.glob("*.replay.json*"))
    status, body = get(f"{server}api/s/{name}/view/tracks", sim="maybe")
    assert status == 400 and "sim" in body["error"], body


def test_replay_page(server, stores, replays, browser):  # noqa: F811
    """The replay page in Chromium: the headline, the chart of measured and simulated step
    time (one bar pair per step), every table cell equal to the tool's answer, a link to the
    viewer with the simulated tracks; no error on the page."""
    from test_web import assert_cells_match, shown_cells, wait_ready

    name = main_store(stores)
    trace, rp, ev = replays(name)
    doc = json.loads(json.dumps(tools.document("replay", trace)))
    with open_page(browser) as w:
        page = w.page
        page.goto(f"{server}s/{name}/#/replay")
        assert wait_ready(page) == "1", page.text_content("#xp-main")
        page.wait_for_function(
            "() => [...document.querySelectorAll('.xp-chart')].every(c => c.dataset.drawn)",
            timeout=30_000,
        )
        assert page.text_content("#xp-headline") == doc["facts"]["headline"]
        assert page.locator('.xp-chart[data-figure="replay-steps"] svg').count() > 0
        bars = page.evaluate("""() => {
            const d = document.querySelector('.xp-chart[data-figure="replay-steps"]').data;
            return d.map(t => [t.name, t.y]); }""")
        assert [b[0] for b in bars] == ["measured", "simulated"]
        steps = doc["tables"]["steps"]
        assert bars[0][1] == pytest.approx([r["measured_ns"] / 1e6 for r in steps])
        assert bars[1][1] == pytest.approx([r["simulated_ns"] / 1e6 for r in steps])
        cells = shown_cells(page)
        stamps = {(t, col) for t, p in doc["present"].items() for col, unit in p["units"]
                  if unit == "ts"}  # fmt: skip
        times = [c for c in cells if (c["table"], c["col"]) in stamps]
        assert assert_cells_match([c for c in cells if c not in times], doc) >= 3 * len(steps)
        assert {c["table"] for c in cells} >= {"summary", "steps", "edges"}
        origin = doc["facts"]["trace_start_ns"]
        for c in times:  # instants: ms from the trace's first event
            raw = doc["tables"][c["table"]][c["row"]][c["col"]]
            assert json.loads(c["raw"]) == raw and c["header"].endswith("(ms)"), c
            decimals = len(c["text"].split(".")[1]) if "." in c["text"] else 0
            assert abs(float(c["text"]) * 1e6 - (raw - origin)) <= 0.51 * 10 ** (6 - decimals)
        assert page.get_attribute("#xp-replay-show", "href") == "#/viewer?sim=1"
        if not doc["tables"]["unmodelled"]:
            assert "every replayed event was modelled" in page.text_content(
                'section[data-table="unmodelled"]'
            )


def test_viewer_shows_simulated_tracks(server, stores, replays, browser):  # noqa: F811
    """``#/viewer?sim=1``: the simulated tracks are drawn beside the measured ones; the window
    API's simulated spans are at the replay's times; a click on a simulated span selects its
    event and shows its simulated start; unticking "simulated" removes the tracks."""
    name = main_store(stores)
    trace, rp, ev = replays(name)
    status, doc = get(f"{server}api/s/{name}/view/tracks", sim=1)
    assert status == 200
    origin = int(doc["origin_text"])
    n_sim = sum(1 for t in doc["tracks"] if t.get("sim"))
    # the window API: every simulated span at its simulated time (ns from the origin)
    status, w = get(f"{server}api/s/{name}/view/window", ts0=doc["t0"], ts1=doc["t1"],
                    width=2000, sim=1)  # fmt: skip
    assert status == 200
    sim_tracks = {t["track"] for t in doc["tracks"] if t.get("sim")}
    by_id = ev.set_index("id")
    on_sim = [i for i, t in enumerate(w["events"]["track"]) if t in sim_tracks]
    assert on_sim
    for i in on_sim:
        row = by_id.loc[w["events"]["id"][i]]
        assert w["events"]["ts"][i] + origin == int(row["sim_ts"])
        assert w["events"]["dur"][i] == int(row["sim_dur"])
    # the longest span of the first simulated track (in view on the page): clicked there
    first = next(t["track"] for t in doc["tracks"] if t.get("sim"))
    k = max((i for i in on_sim if w["events"]["track"][i] == first),
            key=lambda i: w["events"]["dur"][i])  # fmt: skip
    eid, track = w["events"]["id"][k], w["events"]["track"][k]
    status, e = get(f"{server}api/s/{name}/view/event/{eid}", sim=1)
    assert e["simulated"]["ts"] + origin == int(by_id.loc[eid, "sim_ts"])
    with open_page(browser) as wp:
        page = wp.page
        page.goto(f"{server}s/{name}/#/viewer?sim=1")
        page.wait_for_function(
            "() => window.xpuprofViewer && xpuprofViewer.idle && xpuprofViewer.requests > 0",
            timeout=120_000,
        )
        assert page.evaluate("xpuprofViewer.simTracks") == n_sim > 0
        assert page.is_checked("#xp-ov-sim")
        at = page.evaluate(f"xpuprofViewer.locate({eid}, {track})")
        assert at and at["visible"], at
        page.mouse.click(at["x"], at["y"])
        page.wait_for_selector("#xp-event-sim", timeout=30_000)
        sel = page.evaluate("xpuprofViewer.selected")
        assert sel["id"] == eid
        assert sel["simulated"]["ts"] + origin == int(by_id.loc[eid, "sim_ts"])
        assert page.locator('dd[data-field="simulated start"]').count() == 1
        page.uncheck("#xp-ov-sim")
        page.wait_for_function("() => xpuprofViewer.idle && !xpuprofViewer.sim", timeout=30_000)
        assert page.evaluate("xpuprofViewer.simTracks") == 0
        page.wait_for_function("() => !location.hash.includes('sim=1')", timeout=5_000)
        assert page.evaluate("xpuprofViewer.errors") == 0

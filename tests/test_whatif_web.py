"""The web UI's what-if page (``#/whatif``) and the viewer's what-if tracks, in Chromium, on a
real store: a small model trained on this CPU for a few steps, fed by a DataLoader whose
collate sleeps (so the input pipeline is a real part of the step), captured by
``xpuprof.profile`` at level ``op``.

Expected numbers come from :func:`xpuprof.sim.whatif.whatif` called here on the same store
(the Python API the page's tool wraps): the predicted step (the mean of the per-step
predictions), the critical path per category, and the what-if's simulated node times
(``WhatIf.time``) read at each event's start and end nodes of the replay graph. What the store
holds (no kernel, no runtime call; DataLoader spans) is read with a query on its events.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from browser import browser, open_page  # noqa: F401  (pytest fixtures)
from test_web import docs_shot, wait_ready

import xpuprof
from xpuprof.core.errors import XpuprofError
from xpuprof.sim.graph import DEVICE_END, DEVICE_START, HOST_END, HOST_START
from xpuprof.sim.whatif import whatif
from xpuprof.trace.trace import Trace
from xpuprof.ui import tools
from xpuprof.ui.web.server import running

STEPS = 4
#: How long the collate sleeps per batch (s): the input pipeline's share of the step.
SLEEP_S = 0.01
CHANGE = "no-input-wait"


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """The demo model (2 layers) for :data:`STEPS` steps, each batch from a DataLoader whose
    collate sleeps :data:`SLEEP_S`; captured at level ``op`` (ops, DataLoader spans, layers,
    steps; no device)."""
    torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    from torch.utils.data import DataLoader

    from xpuprof.workloads.demo import Trainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = Trainer(batch=4, seq=32, layers=2)
        trainer.step()  # warm up outside the capture

        def collate(items: list[Any]) -> Any:
            time.sleep(SLEEP_S)
            return torch.stack(items)

        data = [trainer.data[0] for _ in range(4 * (STEPS + 2))]
        root = tmp_path_factory.mktemp("whatif-web") / "stores"
        path = root / "train"
        with xpuprof.profile(path, level="op", model=trainer.model, telemetry=False):
            for i, batch in enumerate(DataLoader(data, batch_size=4, collate_fn=collate)):
                if i == STEPS:
                    break
                with xpuprof.step(i):
                    trainer.data = batch
                    trainer.step()
    finally:
        torch.set_num_threads(threads)
    return path


@pytest.fixture(scope="module")
def trace(store):
    with Trace(store) as t:
        yield t


@pytest.fixture(scope="module")
def server(store):
    with running(store.parent) as url:
        yield url


@pytest.fixture(scope="module")
def predicted(trace):
    """The what-if of :data:`CHANGE`, from the Python API."""
    return whatif(trace, [CHANGE])


def get(url: str, **params: Any) -> tuple[int, Any]:
    r = httpx.get(url, params=params, timeout=120)
    return r.status_code, r.json()


def start_end(w: Any, event_id: int) -> tuple[int, int]:
    """The what-if's simulated start and end of an event: ``WhatIf.time`` at its start and
    end nodes in the replay graph."""
    n = w.baseline.graph.nodes
    mine = n.event == event_id
    (s,) = np.flatnonzero(mine & np.isin(n.kind, (HOST_START, DEVICE_START)))
    (e,) = np.flatnonzero(mine & np.isin(n.kind, (HOST_END, DEVICE_END)))
    return int(w.time[s]), int(w.time[e])


def test_store_has_what_the_picks_assume(trace):
    """The store (read here with a query): ops, DataLoader spans, no kernel and no runtime
    call — so the page may offer the input changes and must not offer the device ones."""
    levels = dict(trace.sql("select level, count(*) n from events group by 1").values.tolist())
    assert levels.get("op", 0) > 0 and "kernel" not in levels and "runtime" not in levels
    loads = trace.sql("select count(*) from events where name like '%DataLoader%'").iloc[0, 0]
    assert loads >= STEPS


def test_the_page(server, store, trace, predicted, browser):  # noqa: F811
    """A change typed in a field: the headline gives the predicted step the Python API
    predicts, in ms; the summary shows it per rank; the critical-path chart draws the
    what-if's critical path per category before and after (ms); the picks offer the input
    changes the store has and the advisor's change, not the device ones; a pick fills a
    field."""
    base = float(predicted.steps["baseline_ns"].mean())
    pred = float(predicted.steps["predicted_ns"].mean())
    assert pred < base  # the input spans are a real share of the step
    advice = tools.run("overview", trace, predict=True).tables["recommendations"]
    advised = [c for c in advice["change"].tolist() if c]
    assert advised, "the advisor should recommend a change for an input-bound step"
    with open_page(browser) as w:
        page = w.page
        page.goto(f"{server}s/train/#/whatif")
        assert wait_ready(page) == "1"
        page.wait_for_selector("#xp-whatif-common[data-ready]", timeout=30_000)
        page.wait_for_selector("#xp-whatif-advisor[data-ready]", timeout=60_000)
        common = page.eval_on_selector_all(
            '.xp-pick[data-source="common"]', "bs => bs.map(b => b.dataset.change)"
        )
        assert {"no-input-wait", "dataloader-workers=2", "host-gaps=0.5"} <= set(common)
        assert not {"scale:kernel=0.5", "no-sync", "cuda-graphs"} & set(common), common
        offered = page.eval_on_selector_all(
            '.xp-pick[data-source="advisor"]', "bs => bs.map(b => b.dataset.change)"
        )
        assert offered == list(dict.fromkeys(advised))
        page.fill("input.xp-change", CHANGE)
        page.click("#xp-whatif-run")
        page.wait_for_function(
            "() => location.hash.includes('change=') && document.querySelector("
            "'#xp-main').dataset.ready === '1'", timeout=60_000)  # fmt: skip
        page.wait_for_function(
            "() => [...document.querySelectorAll('.xp-chart')].every(c => c.dataset.drawn)",
            timeout=30_000,
        )
        headline = page.text_content("#xp-headline")
        assert headline.startswith(f"{CHANGE}: step {base / 1e6:.3f} ms → {pred / 1e6:.3f} ms")
        assert f"×{base / pred:.2f}" in headline and f"{100 * (pred - base) / base:+.1f} %" \
            in headline  # fmt: skip
        # the summary: the mean predicted step of the rank, in a column that names its unit
        cell = page.query_selector('td[data-table="summary"][data-col="predicted_ns"]')
        assert json.loads(cell.get_attribute("data-v")) == round(pred)
        header = page.text_content('section[data-table="summary"] th[data-col="predicted_ns"]')
        assert header.endswith("(ms)"), header
        assert page.locator('section[data-table="steps"] tbody tr').count() == STEPS
        # the chart: categories on the path before or after, in ms
        bars = page.evaluate("""() => document.querySelector(
            '.xp-chart[data-figure="whatif-critical-path"]').data.map(t => [t.name, t.y, t.x])""")
        cp = predicted.critical_path
        cp = cp[(cp["baseline_ns"] != 0) | (cp["predicted_ns"] != 0)]
        assert [b[0] for b in bars] == cp["category"].tolist()
        for (_, labels, ms), (_, row) in zip(bars, cp.iterrows(), strict=True):
            assert labels == ["baseline", "predicted"]
            assert ms == pytest.approx([row["baseline_ns"] / 1e6, row["predicted_ns"] / 1e6])
        assert page.locator(".xp-chart svg").count() > 0
        assert "(no rows)" not in page.text_content("#xp-main")
        page.wait_for_selector("#xp-whatif-advisor[data-ready]", timeout=60_000)
        docs_shot(page, "web-whatif")
        # a pick goes into a new field (the first holds the change)
        page.click('.xp-pick[data-change="dataloader-workers=2"]')
        values = page.eval_on_selector_all("input.xp-change", "xs => xs.map(x => x.value)")
        assert values == [CHANGE, "dataloader-workers=2"]


@pytest.mark.parametrize("change", ["scale:kernel=0.5", "speed:op=2", "no-sync"])
def test_a_bad_change_is_one_line(server, trace, browser, change):  # noqa: F811
    """A change that cannot be read or selects nothing: the tool's own message, one line, no
    traceback, the form kept with the change in it to fix."""
    with pytest.raises(XpuprofError) as raised:
        whatif(trace, [change])
    with open_page(browser) as w:
        page = w.page
        page.goto(f"{server}s/train/#/whatif?change={change}")
        assert wait_ready(page) == "error"
        text = page.text_content("#xp-whatif-error")
        assert text == str(raised.value) and "\n" not in text and "Traceback" not in text
        assert page.input_value("input.xp-change") == change
        assert page.locator("#xp-whatif-answer").count() == 0


def test_the_viewer_shows_the_what_if_tracks(server, trace, predicted, browser):  # noqa: F811
    """The page's link opens the viewer with the what-if's tracks: each replayed thread
    followed by "what-if: <thread>"; an event on it sits at the what-if's simulated start and
    lasts its simulated duration (``WhatIf.time`` at its nodes), not the identity replay's;
    clicked, its panel gives the same simulated start."""
    status, doc = get(f"{server}api/s/train/view/tracks", sim=1, whatif=CHANGE)
    assert status == 200 and doc["simulated"]["whatif"] == CHANGE
    origin = int(doc["origin_text"])
    sims = [t for t in doc["tracks"] if t.get("sim")]
    assert sims and all(t["label"].startswith("what-if: ") for t in sims)
    status, win = get(f"{server}api/s/train/view/window", ts0=doc["t0"], ts1=doc["t1"],
                      width=2000, sim=1, whatif=CHANGE)  # fmt: skip
    assert status == 200
    ev = win["events"]
    on_sim = [i for i, t in enumerate(ev["track"]) if t in {s["track"] for s in sims}]
    assert on_sim
    for i in on_sim:
        s, e = start_end(predicted, ev["id"][i])
        assert (ev["ts"][i] + origin, ev["dur"][i]) == (s, e - s), ev["id"][i]
    # the event the change moved most (the replay's own times differ from the what-if's)
    base = predicted.baseline

    def moved(i: int) -> int:
        s, _ = start_end(predicted, ev["id"][i])
        return abs(s - int(base.time[np.flatnonzero(
            (base.graph.nodes.event == ev["id"][i])
            & np.isin(base.graph.nodes.kind, (HOST_START, DEVICE_START)))[0]]))  # fmt: skip

    k = max(on_sim, key=lambda i: (moved(i), ev["dur"][i]))
    assert moved(k) > 0
    eid, track = ev["id"][k], ev["track"][k]
    want = start_end(predicted, eid)[0]
    with open_page(browser) as w:
        page = w.page
        page.goto(f"{server}s/train/#/whatif?change={CHANGE}")
        assert wait_ready(page) == "1"
        page.click("#xp-whatif-show")
        page.wait_for_function(
            "() => window.xpuprofViewer && xpuprofViewer.idle && xpuprofViewer.requests > 0",
            timeout=60_000,
        )
        assert page.evaluate("xpuprofViewer.whatif") == CHANGE
        assert page.evaluate("xpuprofViewer.simTracks") == len(sims)
        assert page.text_content("#xp-viewer-whatif") == CHANGE
        at = page.evaluate(f"xpuprofViewer.locate({eid}, {track})")
        assert at and at["visible"], at
        page.mouse.click(at["x"], at["y"])
        page.wait_for_selector("#xp-event-sim", timeout=30_000)
        sel = page.evaluate("xpuprofViewer.selected")
        assert sel["id"] == eid and sel["simulated"]["ts"] + origin == want
        assert page.evaluate("xpuprofViewer.errors") == 0


def test_the_api(server, store, trace):
    """Several ``change`` parameters are several changes (the tool's answer for both); a bad
    ``whatif`` of the viewer is a 400 with the one line; the what-if's timeline is a store
    beside the tiers, and only the :data:`WHATIF_KEEP` most recently used stay."""
    from xpuprof.view import simulated

    both = ["no-input-wait", "host-gaps=0.5"]
    r = httpx.get(f"{server}api/s/train/tools/whatif", params=[("change", c) for c in both],
                  timeout=120)  # fmt: skip
    status, doc = r.status_code, r.json()
    assert status == 200
    assert doc["document"]["facts"] == json.loads(json.dumps(
        tools.document("whatif", trace, change=both)["facts"]))  # fmt: skip
    assert doc["document"]["facts"]["changes"] == "; ".join(both)
    status, body = get(f"{server}api/s/train/view/tracks", sim=1, whatif="speed:op=2")
    assert status == 400 and body["error"].startswith("change 'speed:op=2': unknown change")
    status, picks = get(f"{server}api/s/train/whatif/picks")
    assert status == 200 and picks == json.loads(json.dumps(tools.whatif_picks(trace)))
    folders = sorted(p.name for p in (store / "view").iterdir() if ".whatif-" in p.name)
    assert simulated.folder_name(trace, CHANGE) in folders


def test_what_if_timelines_are_bounded(store, tmp_path, monkeypatch):
    """Beyond :data:`WHATIF_KEEP`, the least recently used what-if timeline is removed when
    another is built; the identity replay's stays."""
    import shutil

    from xpuprof.view import simulated

    copy = tmp_path / "s"
    shutil.copytree(store, copy, ignore=shutil.ignore_patterns("view"))
    monkeypatch.setattr(simulated, "WHATIF_KEEP", 1)
    with Trace(copy) as t:
        base = simulated.locate(t)
        first = simulated.locate(t, "host-gaps=0.5")
        time.sleep(0.05)
        second = simulated.locate(t, "no-input-wait")
        assert base.is_dir() and second.is_dir() and not first.exists()

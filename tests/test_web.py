"""The web UI (``xpuprof ui``), in a real browser against a real server.

Stores: the A100 AlexNet trace and the 8-rank DLRM job from ../shared/traces (skipped with the
reason when absent), and a trace written here whose op, kernel, arg and store name are an HTML
tag with a script in it (the issue's XSS case). One uvicorn server on 127.0.0.1 (port 0) and one
chromium serve the whole module; both stop on every path.

What is checked, and against what:
- every page of a store opens without an error and every number it shows equals the CLI's
  ``--json`` (a fresh interpreter for the overview, ``tools.document`` for the rest): the raw
  value of each cell exactly, and its text read back through the unit in its header to within
  the last digit shown;
- the viewer zooms and pans with keys and the wheel (the window changes by the factor the key
  stands for), events appear, each query answers within budget; a clicked event shows the
  args and ancestry that SQL over the store gives;
- the XSS store: no dialog, no <img> element, the name shown as text;
- the token, the loopback check, bad store names, ``..``, bad parameters: 401/403/404/400,
  never a stack trace.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pandas as pd
import pytest
from browser import artifacts, browser, open_page, shot  # noqa: F401  (pytest fixtures)
from builders import TraceBuilder
from conftest import EXAMPLE, SHARED_TRACES, cli_json

import xpuprof
from xpuprof.core.errors import XpuprofError
from xpuprof.trace.trace import Trace
from xpuprof.ui import tools
from xpuprof.ui.web import app as web_app
from xpuprof.ui.web.catalog import AnswerCache, Catalog
from xpuprof.ui.web.server import running, serve

EVIL = "<img src=x onerror=alert(1)>"
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"
#: Budgets of the viewer's window queries on these small stores (this machine is shared).
QUERY_MS = 1500  # round trip seen by the page
SERVER_MS = 300  # the server's own time for the query


# ------------------------------------------------------------------------------ stores


def _xss_store(root: Path) -> Path:
    """A one-step trace whose op, kernel and an arg are :data:`EVIL`, in a store named so."""
    tb = TraceBuilder(rank=0)
    tb.step(1, ts=0, dur=1000)
    tb.op(EVIL, ts=10, dur=500, note=EVIL)
    tb.launch(EVIL, ts=100, dur=300, launch_ts=20)
    tb.op("aten::mm", ts=600, dur=300)
    tb.launch("volta_sgemm_128x64_nn", ts=650, dur=200, launch_ts=610)
    src = tb.write(root.parent / "xss.json")
    xpuprof.import_traces([src], root / EVIL)
    return root / EVIL


#: A ROCm kernel's name: hundreds of characters without a space (the MI250 trace has one).
LONG_NAME = "Cijk_Alik_Bljk_SB_Bias_" + "_".join(f"AFEM{i}_LBSPPA{i * 128}" for i in range(40))


def _long_name_store(root: Path) -> Path:
    """A one-step trace whose busiest kernel is :data:`LONG_NAME` (so the stats headline names
    it) and another one with a long C++ template name."""
    tb = TraceBuilder(rank=0)
    tb.step(1, ts=0, dur=1000)
    tb.op("aten::addmm", ts=10, dur=700)
    tb.launch(LONG_NAME, ts=100, dur=500, launch_ts=20)
    tb.launch("void at::native::vectorized_elementwise_kernel<4, " + "at::native::Functor<float>, "
              * 12 + "at::detail::Array<char*, 2> >(int, at::detail::Array<char*, 2>)",
              ts=650, dur=100, launch_ts=30)  # fmt: skip
    src = tb.write(root.parent / "long.json")
    xpuprof.import_traces([src], root / "longname")
    return root / "longname"


@pytest.fixture(scope="module")
def web_root(tmp_path_factory) -> dict[str, Any]:
    """A directory of stores (the shared ones when present, always the XSS and long-name
    ones)."""
    root = tmp_path_factory.mktemp("web") / "stores"
    root.mkdir()
    have = {"xss": _xss_store(root).name, "longname": _long_name_store(root).name}
    xpuprof.import_traces([EXAMPLE], root / "example")  # the shipped real CPU trace
    have["example"] = "example"
    alexnet = SHARED_TRACES / "kineto/gpu/a100_alexnet_cuda_sync.json.gz"
    dlrm = SHARED_TRACES / "kineto/gpu/dlrm_8rank_v100"
    if alexnet.exists():
        xpuprof.import_traces([alexnet], root / "alexnet")
        have["alexnet"] = "alexnet"
    if dlrm.is_dir():
        xpuprof.import_traces(sorted(dlrm.glob("*.json.gz")), root / "dlrm")
        have["dlrm"] = "dlrm"
    return {"root": root, "stores": have}


def main_store(web_root: dict[str, Any]) -> str:
    """The store the page and viewer tests read: the 8-rank DLRM job when the shared traces
    are here, else the shipped CPU training trace (a fresh clone still tests every page)."""
    return "dlrm" if "dlrm" in web_root["stores"] else "example"


def need(web_root: dict[str, Any], name: str) -> Path:
    if name not in web_root["stores"]:
        pytest.skip(f"the {name} trace is not under {SHARED_TRACES} (set XPUPROF_TEST_TRACES)")
    return web_root["root"] / web_root["stores"][name]


@pytest.fixture(scope="module")
def server(web_root) -> Any:
    """The web UI over the stores, on 127.0.0.1 and a free port; stopped on every path."""
    with running(web_root["root"]) as url:
        yield url


@pytest.fixture(scope="module")
def traces(web_root):
    """Read-only Traces of the stores (for expected values), closed at the end."""
    opened: dict[str, Trace] = {}

    def get(name: str) -> Trace:
        if name not in opened:
            opened[name] = Trace(need(web_root, name))
        return opened[name]

    yield get
    for t in opened.values():
        t.close()


def docs_shot(page: Any, name: str) -> None:
    """With ``XPUPROF_DOCS_IMG=1``, also write this page as ``docs/img/NAME.png`` (the README's
    and docs/web.md's screenshots, at 1,200 x 760 so that they stay small)."""
    if os.environ.get("XPUPROF_DOCS_IMG") != "1":
        return
    size = page.viewport_size
    page.set_viewport_size({"width": 1200, "height": 760})
    page.wait_for_timeout(600)
    DOCS_IMG.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(DOCS_IMG / f"{name}.png"))
    page.set_viewport_size(size)
    page.wait_for_timeout(300)


def get_json(url: str, **kw: Any) -> tuple[int, Any]:
    r = httpx.get(url, timeout=120, **kw)
    return r.status_code, r.json()


def page_url(server: str, store: str, hash_: str = "") -> str:
    return f"{server}s/{quote(store, safe='')}/#/{hash_}"


def wait_ready(page: Any, timeout: float = 90_000) -> str:
    page.wait_for_selector("#xp-main[data-ready]", timeout=timeout)
    return page.eval_on_selector("#xp-main", "e => e.dataset.ready")


# ----------------------------------------------------------------- numbers on a page

#: Units a header names, in the tool's own units (ns, bytes, B/s, FLOP, FLOP/s).
UNITS = {"ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9, "B": 1, "KiB": 2**10, "MiB": 2**20,
         "GiB": 2**30, "TiB": 2**40, "FLOP": 1, "KFLOP": 1e3, "MFLOP": 1e6, "GFLOP": 1e9,
         "TFLOP": 1e12, "PFLOP": 1e15}  # fmt: skip
UNITS |= {f"{k}/s": v for k, v in UNITS.items() if k.endswith(("B", "FLOP"))}
UNITS |= {"KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12}
SHARES = {"fraction", "ratio", "utilization", "share"}
PERCENT = {"pct", "percent", "percentage"}
TIME_BASE = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def check_shown(text: str, header: str, col: str, raw: Any, origin: int | None,
                given: str | None = None) -> bool | None:  # fmt: skip
    """Whether ``text`` under ``header`` shows ``raw`` (the tool's value) to within the last
    digit shown; None when the cell is not a plain number (text, a list, '-', a timestamp
    without origin). ``given``: the column's unit in the tool's presentation, if any."""
    if raw is None or isinstance(raw, (str, list, dict, bool)):
        return None
    m = re.search(r"\(([^()]+)\)$", header)
    unit = m.group(1) if m else None
    if text.startswith(("<", ">")):  # <0.001
        return abs(raw) < 0.001 * UNITS.get(unit or "", 1) * (100 if unit == "%" else 1)
    if text.startswith("0x"):
        return int(text, 16) == raw
    try:
        shown = float(text.replace(",", ""))
    except ValueError:
        return None
    decimals = len(text.split(".")[1]) if "." in text else 0
    step = 10.0**-decimals
    if unit == "%":  # a share (0..1) unless the presentation says the column is in %
        tokens = set(col.split("_"))
        value = raw * 100 if given != "%" and SHARES & tokens and not PERCENT & tokens else raw
        scale = 1.0
    elif unit == "ms" and (
        given == "ts" or col == "ts" or col.endswith("_ts")
        or col in ("start", "end", "first_start", "last_start")
    ):  # fmt: skip
        if origin is None:
            return None
        value, scale = raw - origin, 1e6
    elif unit in ("ns", "µs", "ms", "s"):  # a column named in a unit (step_ms_mean) is in it
        base = TIME_BASE.get(given or "") or next(
            (TIME_BASE[t] for t in col.split("_") if t in TIME_BASE), 1.0
        )
        value, scale = raw * base, UNITS[unit]
    elif unit in UNITS:
        value, scale = raw, UNITS[unit]
    elif unit is None:
        value, scale = raw, 1.0
    else:  # a unit shown as it is (FLOP/B, TFLOP/s from a tflops column)
        value, scale = raw, 1.0
    # four significant digits: the last digit shown, or 1e-4 of the value, whichever is more
    return abs(shown * scale - value) <= max(step * scale * 0.51,
                                             abs(value) * 6e-4) + 1e-9  # fmt: skip


def shown_cells(page: Any, table: str | None = None) -> list[dict[str, Any]]:
    """Every table cell the page shows: table, row, column, raw JSON text, shown text, and
    the column's header."""
    sel = "td[data-col][data-v]" if table is None else f'td[data-table="{table}"][data-v]'
    return page.eval_on_selector_all(
        sel,
        """tds => tds.map(td => {
        const table = td.closest('table');
        let header = '';
        if (table && !table.classList.contains('xp-transposed')) {
          const th = table.querySelector(`thead th[data-col="${td.dataset.col}"]`);
          header = th ? th.textContent : '';
        } else if (table) {
          header = td.parentElement.querySelector('th').textContent;
        }
        return {table: td.dataset.table, row: +td.dataset.row, col: td.dataset.col,
                raw: td.dataset.v, text: td.firstChild ? td.firstChild.textContent : '',
                header};
      })""",
    )


def assert_cells_match(cells: list[dict[str, Any]], doc: dict[str, Any]) -> int:
    """Each shown cell's raw value equals the document's, and its text shows that value;
    returns how many numbers were read back from their text."""
    origin = doc.get("facts", {}).get("trace_start_ns")
    read = 0
    for c in cells:
        expected = doc["tables"][c["table"]][c["row"]][c["col"]]
        got = json.loads(c["raw"])
        assert got == expected, (c, expected)
        units = dict(map(tuple, doc.get("present", {}).get(c["table"], {}).get("units", ())))
        ok = check_shown(c["text"], c["header"], c["col"], expected, origin, units.get(c["col"]))
        if ok is not None:
            assert ok, f"{c['table']}[{c['row']}].{c['col']}: shows {c['text']!r} under " \
                       f"{c['header']!r} for {expected!r}"  # fmt: skip
            read += 1
    return read


# ------------------------------------------------------------------------------- the API


def test_tool_api_is_the_cli_json(server, web_root):
    """The overview's document the web serves is what ``xpuprof overview STORE --json`` prints
    in a fresh interpreter, and its tables hold the same rows."""
    store = need(web_root, "dlrm")
    status, body = get_json(f"{server}api/s/dlrm/tools/overview")
    assert status == 200, body
    assert body["document"] == cli_json("overview", store)
    for tv in body["view"]["tables"]:
        rows = body["document"]["tables"][tv["name"]]
        assert tv["rows"] == len(rows)
        names = [c["name"] for c in tv["columns"]]
        assert [[json.loads(x) for x in r] for r in tv["raw"]] == \
            [[row.get(n) for n in names] for row in rows]  # fmt: skip
    assert {f["id"] for f in body["figures"]} >= {"step-breakdown", "step-heatmap", "top-ops"}


def test_every_tool_answers(server, web_root, traces):
    """Every one-store tool of the registry answers through the API, as tools.document does."""
    need(web_root, "alexnet")
    for tool in tools.TOOLS:
        if tool.inputs != 1:
            continue
        status, body = get_json(f"{server}api/s/alexnet/tools/{tool.name}")
        assert status == 200, (tool.name, body)
        assert body["document"] == json.loads(json.dumps(
            tools.document(tool.name, traces("alexnet")))), tool.name  # fmt: skip


def test_ranks_page_charts_the_holder(server, web_root):
    """The cross-rank tool on the 8-rank DLRM job through the API: rank 7 holds the step
    (``tests/test_ranks.py`` checks it against the raw JSON), its step-time heat map has one row
    per rank, and the wait/transfer chart's caused-wait bar is highest for rank 7."""
    need(web_root, "dlrm")
    status, body = get_json(f"{server}api/s/dlrm/tools/ranks")
    assert status == 200, body
    assert body["document"]["facts"]["holder"] == 7
    figs = {f["id"]: f for f in body["figures"]}
    assert len(figs["step-heatmap"]["data"][0]["y"]) == 8
    caused = next(d for d in figs["rank-waits"]["data"] if d["name"] == "others waited for it")
    assert caused["x"][max(range(8), key=lambda i: caused["y"][i])] == "rank 7"


def test_diff_api(server, web_root, traces):
    need(web_root, "dlrm")
    need(web_root, "alexnet")
    status, body = get_json(f"{server}api/diff?a=alexnet&b=dlrm")
    assert status == 200, body
    expected = tools.document("diff", traces("alexnet"), traces("dlrm"))
    assert body["document"] == json.loads(json.dumps(expected))


BAD = [
    ("api/s/nope/tools/overview", 404),
    ("api/s/..%2F..%2Fetc/tools/overview", 404),
    ("api/s/%2e%2e/tools/overview", 404),
    ("api/s/..%2Fstores/view/tracks", 404),
    ("s/..%2F..%2F/", 404),
    ("static/..%2F..%2Fapp.py", 404),
    ("static/%2e%2e/app.py", 404),
    ("api/s/{x}/tools/nope", 404),
    ("api/s/{x}/tools/diff", 404),
    ("api/s/{x}/tools/overview?top=ten", 400),
    ("api/s/{x}/tools/overview?nope=1", 400),
    ("api/s/{x}/tools/overview?ranks=a-b", 400),
    ("api/s/{x}/tools/overview?ranks=99", 400),
    ("api/s/{x}/tools/stats?ops=maybe", 400),
    ("api/s/{x}/view/event/abc", 400),
    ("api/s/{x}/view/event/99999999999", 404),
    ("api/s/{x}/view/window?ts0=10&ts1=5&width=100", 400),
    ("api/s/{x}/view/window?ts0=0&ts1=5&width=0", 400),
    ("api/s/{x}/view/window?ts0=zero&ts1=5&width=10", 400),
    ("api/s/{x}/view/window?ts0=0&ts1=1000&width=100&tracks=a", 400),
    ("api/s/{x}/view/search?q=", 400),
    ("api/s/{x}/view/search?q=a&limit=0", 400),
    ("api/s/{x}/view/overlays?bogus=1", 400),
    ("api/diff?a={x}", 400),
    ("api/diff?a={x}&b=nope", 404),
    ("api/nothing", 404),
    ("nothing", 404),
]


@pytest.mark.parametrize(("path", "status"), BAD)
def test_bad_requests(server, web_root, path, status):
    """Unknown stores, ``..``, unknown tools and events → 404; bad parameters → 400; a JSON
    error (or a page) with one line, never a stack trace."""
    url = server + path.replace("{x}", quote(web_root["stores"]["xss"], safe=""))
    r = httpx.get(url, timeout=60)
    assert r.status_code == status, (url, r.text)
    assert "Traceback" not in r.text and 'File "' not in r.text
    if path.startswith("api/"):
        assert set(r.json()) == {"error"} and r.json()["error"], r.text


def test_unexpected_error_is_one_line(web_root, monkeypatch):
    """An exception nobody expected is a 500 with a short message; the details go to the log."""
    from fastapi.testclient import TestClient

    def boom(*a: Any, **k: Any) -> Any:
        raise RuntimeError("secret detail /etc/passwd")

    monkeypatch.setattr(tools, "run", boom)
    app = web_app.create_app(web_root["root"])
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        r = c.get(f"/api/s/{quote(web_root['stores']['xss'], safe='')}/tools/stats")
    assert r.status_code == 500
    assert r.json() == {"error": "internal error (RuntimeError); the server's log has details"}


def test_answers_are_cached(server, web_root):
    """A second request for the same tool and options is served from the cache (fast, same
    bytes); other options are another answer."""
    x = quote(web_root["stores"]["xss"], safe="")
    first = httpx.get(f"{server}api/s/{x}/tools/stats", timeout=60)
    t = time.perf_counter()
    second = httpx.get(f"{server}api/s/{x}/tools/stats", timeout=60)
    assert time.perf_counter() - t < 0.5
    assert first.content == second.content
    other = httpx.get(f"{server}api/s/{x}/tools/stats?ops=true", timeout=60)
    assert other.status_code == 200 and other.content != first.content


def test_answer_cache_and_catalog_bounds(web_root):
    cache = AnswerCache(max_bytes=10, max_entries=2)
    cache.put("a", b"12345")
    cache.put("b", b"12345")
    cache.put("c", b"1")  # over 10 bytes → the oldest goes
    assert cache.get("a") is None and cache.get("b") == b"12345" and len(cache) == 2
    cache.put("big", b"x" * 11)  # larger than the whole cache: not kept
    assert cache.get("big") is None and cache.size <= 10
    catalog = Catalog(web_root["root"], max_open=1)
    names = list(catalog.names())
    assert EVIL in names
    s1 = catalog.acquire(names[0])
    s1.call("tools", lambda t: t.manifest)
    catalog.release(s1)
    s2 = catalog.acquire(names[-1])  # the first is closed: one store open at most
    catalog.release(s2)
    assert s1.retired and not s1._traces  # noqa: SLF001 (checking it closed)
    with pytest.raises(XpuprofError, match="no store named"):
        catalog.path("../" + names[0])
    catalog.close()


def test_prefetch_fills_the_cache(web_root):
    """A starting server computes the overview of the first stores in the background: the
    first visit is then answered from the cache, with the document the tool gives."""
    from fastapi.testclient import TestClient

    app = web_app.create_app(web_root["root"])
    names = list(app.state.catalog.names())
    thread = app.state.prefetch(len(names))
    thread.join(300)
    assert not thread.is_alive() and len(app.state.cache) == len(names)
    x = quote(web_root["stores"]["xss"], safe="")
    with TestClient(app, base_url="http://127.0.0.1") as c:
        hits = app.state.cache.hits
        body = c.get(f"/api/s/{x}/tools/overview").json()
        assert app.state.cache.hits == hits + 1
    with Trace(web_root["root"] / EVIL) as trace:
        assert body["document"] == json.loads(json.dumps(tools.document("overview", trace)))


# ----------------------------------------------------------------------------- security


def test_non_loopback_needs_a_token(web_root):
    """Binding a network address without a token is refused before anything listens; a
    token shorter than 16 characters too."""
    with pytest.raises(XpuprofError, match="needs --token"):
        serve(web_root["root"], host="0.0.0.0", port=0)
    with pytest.raises(XpuprofError, match="needs --token"):
        serve(web_root["root"], host="192.0.2.1", port=0)
    with pytest.raises(XpuprofError, match="at least 16"):
        serve(web_root["root"], host="0.0.0.0", port=0, token="short")


def test_token(web_root, browser):  # noqa: F811
    """With a token every request needs it: none → 401, a wrong one → 403, a Bearer header or
    the cookie that ``?token=`` sets → 200; the page's own requests then carry the cookie."""
    token = "k3y-" + "x" * 24
    with running(web_root["root"], token=token) as url:
        api = f"{url}api/stores"
        assert httpx.get(api).status_code == 401
        assert (
            httpx.get(api, headers={"Authorization": "Bearer wrong-token-123456"}).status_code
            == 403
        )
        assert httpx.get(api + "?token=nope").status_code == 403
        ok = httpx.get(api, headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200 and EVIL in [s["name"] for s in ok.json()["stores"]]
        r = httpx.get(f"{url}?token={token}", follow_redirects=False)
        assert r.status_code == 303 and "token" not in r.headers["location"]
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert httpx.get(api, cookies={"xpuprof_token": token}).status_code == 200
        assert httpx.get(f"{url}static/app.js").status_code == 401
        with open_page(browser) as w:
            w.page.goto(f"{url}s/{quote(EVIL, safe='')}/?token={token}#/stats")
            assert "token" not in w.page.url
            assert wait_ready(w.page) == "1"


def test_loopback_host_names_only_without_token(server):
    """Without a token the server answers loopback host names only (no DNS rebinding)."""
    assert httpx.get(f"{server}api/stores", headers={"Host": "evil.example"}).status_code == 403
    assert httpx.get(f"{server}api/stores", headers={"Host": "localhost"}).status_code == 200
    r = httpx.get(f"{server}api/stores")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"


# -------------------------------------------------------------------------------- pages


def test_store_list(server, browser):  # noqa: F811
    with open_page(browser) as w:
        w.page.goto(server)
        rows = w.page.eval_on_selector_all(
            "#xp-stores tbody tr", "rs => rs.map(r => r.dataset.store)"
        )
        assert EVIL in rows
        assert w.page.locator("img").count() == 0
        link = w.page.locator(f'#xp-stores tr[data-store="{EVIL}"] a')
        assert link.text_content() == EVIL


#: The change the what-if page is opened with (it answers once given one).
WHATIF_CHANGE = "host-gaps=0.5"


def test_every_page_shows_the_tools_numbers(server, web_root, traces, browser, artifacts):  # noqa: F811
    """Every page of the DLRM store (the shipped trace without the shared ones) opens without an
    error; every table cell it shows is the tool's --json value, and its text reads back to
    that value through its header's unit."""
    main = main_store(web_root)
    status, pages = get_json(f"{server}api/pages")
    assert status == 200
    expected_docs = {"overview": cli_json("overview", need(web_root, main))}
    read = {}
    with open_page(browser) as w:
        for p in pages:
            hash_ = p["name"] + ("?with=alexnet" if p["name"] == "diff" and "alexnet" in
                                 web_root["stores"] else "")  # fmt: skip
            if p["renderer"] == "whatif":  # the what-if page answers once given a change
                hash_ += "?change=" + quote(WHATIF_CHANGE, safe="")
            w.page.goto(page_url(server, main, hash_))
            assert wait_ready(w.page) == "1", (p["name"], w.page.text_content("#xp-main"))
            if p["renderer"] != "viewer":
                w.page.wait_for_function(
                    "() => [...document.querySelectorAll('.xp-chart')].every(c => c.dataset.drawn)",
                    timeout=30_000,
                )
            shot(w.page, artifacts, f"page-{p['name']}")
            if (
                p["name"] == "multirank" and main == "dlrm"
            ):  # 8 ranks: the heat map of step time per rank
                assert w.page.locator('.xp-chart[data-figure="step-heatmap"] svg').count() > 0
            if p["name"] in ("overview", "stats"):
                docs_shot(w.page, f"web-{p['name']}")
            cells = shown_cells(w.page)
            if p["renderer"] in ("viewer", "hierarchy"):
                continue
            if p["tool"] == "diff":
                if "alexnet" not in web_root["stores"]:
                    continue
                doc = tools.document("diff", traces(main), traces("alexnet"))
            else:
                opts = {"change": [WHATIF_CHANGE]} if p["renderer"] == "whatif" else {}
                doc = expected_docs.get(p["tool"]) or tools.document(p["tool"], traces(main),
                                                                     **opts)  # fmt: skip
            if "tables" not in doc:  # info's --json predates Result: its tables are run()'s
                doc = tools.run(p["tool"], traces(main)).to_dict()
            doc = json.loads(json.dumps(doc))
            assert cells or not any(doc.get("tables", {}).values()), p["name"]
            read[p["name"]] = assert_cells_match(cells, doc)
    assert read["overview"] > 20 and read["stats"] > 100, read


def test_tables_sort_and_filter(server, web_root, traces, browser):  # noqa: F811
    """A click on a header sorts the rows by the raw values (descending for numbers first,
    then ascending); the filter keeps the rows whose text contains it, case-insensitive."""
    need(web_root, "dlrm")
    kernels = tools.document("stats", traces("dlrm"))["tables"]["kernels"]
    with open_page(browser) as w:
        page = w.page
        page.goto(page_url(server, "dlrm", "stats"))
        wait_ready(page)
        table = page.locator('table[data-table="kernels"]')
        col = "mean_ns"
        table.locator(f'th[data-col="{col}"]').click()
        shown = [json.loads(v) for v in table.locator(f'td[data-col="{col}"]').evaluate_all(
            "tds => tds.map(td => td.dataset.v)")]  # fmt: skip
        assert shown == sorted((k[col] for k in kernels), reverse=True)[: len(shown)]
        assert len(shown) == min(100, len(kernels))
        table.locator(f'th[data-col="{col}"]').click()
        shown = [json.loads(v) for v in table.locator(f'td[data-col="{col}"]').evaluate_all(
            "tds => tds.map(td => td.dataset.v)")]  # fmt: skip
        assert shown == sorted(k[col] for k in kernels)[: len(shown)]
        box = page.locator('section[data-table="kernels"] input.xp-filter')
        box.fill("NCCL")
        names = table.locator('td[data-col="name"]').evaluate_all(
            "tds => tds.map(td => JSON.parse(td.dataset.v))")  # fmt: skip
        expected = [k["name"] for k in kernels if "nccl" in k["name"].lower()]
        assert sorted(names) == sorted(expected) and names


def test_long_kernel_names_stay_readable(server, web_root, traces, browser):  # noqa: F811
    """Demangled kernel names run to hundreds of characters: a table shows them short (as the
    terminal does) with the whole name as the cell's tooltip, the filter also finds a part the
    short name leaves out, and at 800 px the name column keeps a readable width (it was
    squeezed to a few letters a line, each row hundreds of pixels tall)."""
    need(web_root, "alexnet")
    kernels = tools.document("stats", traces("alexnet"))["tables"]["kernels"]
    templated = max((k["name"] for k in kernels if "<" in k["name"]), key=len)
    hidden = templated.split("<", 1)[1][:18]  # inside the template arguments
    assert len(templated) > 200
    with open_page(browser) as w:
        page = w.page
        page.set_viewport_size({"width": 800, "height": 900})
        page.goto(page_url(server, "alexnet", "stats"))
        wait_ready(page)
        cells = page.eval_on_selector_all(
            'td[data-table="kernels"][data-col="name"]',
            "tds => tds.map(td => ({full: JSON.parse(td.dataset.v),"
            " text: td.firstChild.textContent, title: td.title,"
            " width: td.getBoundingClientRect().width,"
            " height: td.getBoundingClientRect().height}))",
        )
        assert len(cells) == len(kernels)
        for c in cells:
            assert c["title"] == (c["full"] if c["text"] != c["full"] else ""), c
            assert c["width"] >= 200 and c["height"] < 160, c
        mine = next(c for c in cells if c["full"] == templated)
        assert len(mine["text"]) < 80 and hidden not in mine["text"]
        page.locator('section[data-table="kernels"] input.xp-filter').fill(hidden)
        names = page.locator('table[data-table="kernels"] td[data-col="name"]').evaluate_all(
            "tds => tds.map(td => JSON.parse(td.dataset.v))")  # fmt: skip
        assert templated in names and all(hidden.lower() in n.lower() for n in names)


@pytest.mark.parametrize("width", [1280, 800])
def test_long_names_never_widen_the_page(server, web_root, browser, width):  # noqa: F811
    """A kernel name of hundreds of characters without a space, in the headline, the findings,
    the tables and the charts of every page, wraps or scrolls inside its box: the page is never
    wider than the window (the MI250 trace's stats page was 4,038 px wide at 1,280)."""
    with open_page(browser) as w:
        page = w.page
        page.set_viewport_size({"width": width, "height": 900})
        for name in ("overview", "stats", "summary", "roofline"):
            page.goto(page_url(server, "longname", name))
            assert wait_ready(page) == "1", name
            page.wait_for_function(
                "() => [...document.querySelectorAll('.xp-chart')].every(c => c.dataset.drawn)",
                timeout=30_000,
            )
            if name == "stats":
                assert LONG_NAME in page.text_content("#xp-headline")
            assert page.evaluate("document.documentElement.scrollWidth") <= width, name


def test_overview_findings_link_to_the_viewer(server, web_root, browser):  # noqa: F811
    """Each finding shows its recommendation, evidence and saving, and links to the viewer with
    its event ids; following the link highlights those events there."""
    store = need(web_root, "dlrm")
    doc = cli_json("overview", store)
    recs = doc["tables"]["recommendations"]
    with open_page(browser) as w:
        w.page.goto(page_url(server, "dlrm", "overview"))
        wait_ready(w.page)
        cards = w.page.locator(".xp-finding")
        assert cards.count() == len(recs)
        for i, rec in enumerate(recs):
            card = cards.nth(i)
            assert (
                card.locator('[data-col="recommendation"]').text_content() == rec["recommendation"]
            )
            assert card.locator('[data-col="evidence"]').text_content() == rec["evidence"]
            assert json.loads(card.locator('[data-col="saved_ms_per_step"]').get_attribute(
                "data-v")) == rec["saved_ms_per_step"]  # fmt: skip
            if rec["events"]:
                ids = card.locator(".xp-finding-link").get_attribute("data-ids")
                assert [int(x) for x in ids.split(",")] == rec["events"]
        first = next(r for r in recs if r["events"])
        w.page.locator(".xp-finding-link").first.click()
        wait_ready(w.page)
        w.page.wait_for_function(
            "() => window.xpuprofViewer && xpuprofViewer.idle && "
            "xpuprofViewer.highlighted.length > 0",
            timeout=30_000,
        )
        assert w.page.evaluate("xpuprofViewer.highlighted") == first["events"][:200]
        assert w.page.locator("#xp-highlights li").count() == len(first["events"])


def test_hierarchy_tree(server, web_root, traces, browser):  # noqa: F811
    """The tree: a step's inclusive time is the hierarchy tool's; expanded, its ops; an op
    expanded, its kernels with the stats tool's numbers (kernels per launching op)."""
    need(web_root, "dlrm")
    steps = tools.document("hierarchy", traces("dlrm"), by="step")["tables"]["step"]
    with open_page(browser) as w:
        w.page.goto(page_url(server, "dlrm", "hierarchy"))
        wait_ready(w.page)
        first = w.page.locator('tr.xp-node[data-level="step"]').first
        shown = json.loads(first.locator('td[data-col="device_ns"]').get_attribute("data-v"))
        assert shown == steps[0]["device_ns"]
        first.locator(".xp-toggle").click()
        w.page.wait_for_selector('tr.xp-node[data-level="op"]')
        op_row = w.page.locator('tr.xp-node[data-level="op"]').first
        op = op_row.locator(".xp-label").text_content()
        op_row.locator(".xp-toggle").click()
        w.page.wait_for_selector('tr.xp-node[data-level="kernel"]')
        doc = tools.document("stats", traces("dlrm"), kernels=True, by_op=True,
                             steps=str(steps[0]["step"]))  # fmt: skip
        expected = [k for k in doc["tables"]["kernels"] if k["op"] == op]
        kernels = w.page.locator('tr.xp-node[data-level="kernel"]')
        assert kernels.count() == len(expected) > 0
        for i, k in enumerate(expected):
            row = kernels.nth(i)
            assert row.locator(".xp-label").text_content() == k["name"]
            assert json.loads(row.locator('td[data-col="total_ns"]').get_attribute("data-v")) \
                == k["total_ns"]  # fmt: skip


# ------------------------------------------------------------------------------- viewer


def viewer_ready(page: Any) -> None:
    page.wait_for_function(
        "() => window.xpuprofViewer && xpuprofViewer.idle && xpuprofViewer.requests > 0",
        timeout=60_000,
    )
    page.wait_for_function("() => xpuprofViewer.idle", timeout=60_000)


def test_viewer_zoom_and_pan(server, web_root, browser, artifacts):  # noqa: F811
    """W/S zoom by 0.8 and 1.25 around the pointer, A/D pan by 15 % of the window, the wheel
    zooms at the pointer; after each change the window query runs, events appear, and every
    query answers within budget."""
    main = main_store(web_root)
    with open_page(browser) as w:
        page = w.page
        page.goto(page_url(server, main, "viewer"))
        viewer_ready(page)
        assert page.evaluate("xpuprofViewer.drawnItems") > 0
        shot(page, artifacts, "viewer-whole")
        box = page.locator("#xp-canvas").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
        page.locator("#xp-canvas").focus()
        before = page.evaluate("xpuprofViewer.window")
        for _ in range(6):
            page.keyboard.press("w")
        viewer_ready(page)
        after = page.evaluate("xpuprofViewer.window")
        span0, span1 = before["ts1"] - before["ts0"], after["ts1"] - after["ts0"]
        assert math.isclose(span1, span0 * 0.8**6, rel_tol=1e-6)
        page.keyboard.press("d")
        viewer_ready(page)
        moved = page.evaluate("xpuprofViewer.window")
        assert math.isclose(moved["ts0"] - after["ts0"], 0.15 * span1, rel_tol=1e-6)
        page.keyboard.press("s")
        viewer_ready(page)
        out = page.evaluate("xpuprofViewer.window")
        assert math.isclose(out["ts1"] - out["ts0"], span1 * 1.25, rel_tol=1e-6)
        page.mouse.wheel(0, -400)
        viewer_ready(page)
        wheeled = page.evaluate("xpuprofViewer.window")
        assert wheeled["ts1"] - wheeled["ts0"] < (out["ts1"] - out["ts0"]) * 0.8
        page.keyboard.press("a")
        viewer_ready(page)
        assert page.evaluate("xpuprofViewer.drawnItems") > 0
        assert page.evaluate("xpuprofViewer.items") > 0
        shot(page, artifacts, "viewer-zoomed")
        queries = page.evaluate("xpuprofViewer.queries")
        assert len(queries) >= 5
        assert max(q["ms"] for q in queries) < QUERY_MS, queries
        assert max(q["server"] for q in queries) < SERVER_MS, queries
        assert page.evaluate("xpuprofViewer.errors") == 0
        # the view is in the address: a reload shows the same window
        page.wait_for_timeout(400)
        assert "ts0=" in page.url
        page.reload()
        viewer_ready(page)
        again = page.evaluate("xpuprofViewer.window")
        assert abs(again["ts0"] - wheeled["ts0"]) > 0  # panned since: the hash kept the pan
        assert math.isclose(again["ts1"] - again["ts0"], wheeled["ts1"] - wheeled["ts0"],
                            rel_tol=1e-3, abs_tol=2)  # fmt: skip


def test_viewer_on_a_narrow_screen(server, web_root, browser):  # noqa: F811
    """At 800 px the side panel goes under the timeline, which keeps the width (beside it,
    the timeline had 204 px left for time after the track names); a selected event's details
    are in view."""
    store = web_root["stores"]["xss"]
    with open_page(browser) as w:
        page = w.page
        page.set_viewport_size({"width": 800, "height": 900})
        page.goto(page_url(server, store, "viewer"))
        viewer_ready(page)
        assert page.evaluate("xpuprofViewer.window.width") >= 500
        assert page.evaluate("xpuprofViewer.drawnItems") > 0
        eid = page.evaluate("fetch(xpuprof.storeApi('view/search?q=aten::mm'))"
                            ".then(r => r.json()).then(d => d.matches[0].id)")  # fmt: skip
        page.evaluate(f"xpuprofViewer.select({eid})")
        page.wait_for_selector(f'#xp-panel[data-event="{eid}"]')
        name = page.locator("#xp-event-name").bounding_box()
        assert name is not None and name["y"] + name["height"] <= 900
        assert page.locator("#xp-canvas").bounding_box()["width"] >= 700


def raw_event(trace: Trace, eid: int) -> dict[str, Any]:
    """The event's row and its decoded args, straight from SQL over the store."""
    row = trace.sql(f"SELECT id, part, name, level, ts, dur, parent, correlation, args "
                    f"FROM events WHERE id = {int(eid)}").iloc[0]  # fmt: skip

    def opt(v: Any) -> int | None:
        return None if pd.isna(v) else int(v)

    return {"id": int(row["id"]), "part": int(row["part"]), "name": row["name"],
            "level": row["level"], "ts": int(row["ts"]), "dur": opt(row["dur"]),
            "parent": opt(row["parent"]), "correlation": opt(row["correlation"]),
            "args": json.loads(row["args"] or "{}")}  # fmt: skip


def host_chain(trace: Trace, kernel: dict[str, Any]) -> list[dict[str, Any]]:
    """The kernel's launching runtime call (same part and correlation, on the host) and that
    call's enclosing events (``parent``, outward), from SQL."""
    rt = trace.sql(f"SELECT id FROM events WHERE part = {kernel['part']} AND device = -1 AND "
                   f"level = 'runtime' AND correlation = {int(kernel['correlation'])}")  # fmt: skip
    assert len(rt) == 1
    chain = [raw_event(trace, int(rt["id"].iloc[0]))]
    while chain[-1]["parent"] is not None:
        chain.append(raw_event(trace, chain[-1]["parent"]))
    return chain


def test_viewer_click_shows_args_and_ancestry(server, web_root, traces, browser, artifacts):  # noqa: F811
    """Clicking the longest kernel of AlexNet shows its fields and args as SQL has them, its
    ancestry (the launching runtime call, then every host event around that call, outward: the
    store's ``parent`` chain) and its flows (the store's links into it)."""
    trace = traces("alexnet")
    eid = int(trace.sql("SELECT id FROM events WHERE level = 'kernel' "
                        "ORDER BY dur DESC, id LIMIT 1").iloc[0, 0])  # fmt: skip
    k = raw_event(trace, eid)
    chain = host_chain(trace, k)
    with open_page(browser) as w:
        page = w.page
        page.goto(page_url(server, "alexnet", f"viewer?ids={eid}"))
        viewer_ready(page)
        spot = page.evaluate(f"xpuprofViewer.locate({eid})")
        assert spot and spot["visible"], spot
        page.mouse.click(spot["x"], spot["y"])
        page.wait_for_selector(f'#xp-panel[data-event="{eid}"]')
        assert page.text_content("#xp-event-name") == k["name"]
        assert page.text_content('[data-field="level"]') == "kernel"
        assert int(page.text_content('[data-field="dur_ns"]')) == k["dur"]
        args = page.eval_on_selector_all(
            "#xp-event-args tr",
            "rs => rs.map(r => [r.dataset.arg, r.querySelector('td').textContent])",
        )
        assert dict(args) == {key: v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
                              for key, v in k["args"].items()}  # fmt: skip
        ancestry = page.eval_on_selector_all(
            "#xp-event-ancestry li", "ls => ls.map(l => [+l.dataset.id, l.dataset.level])"
        )
        assert ancestry[0][1] == "runtime"
        assert [a[0] for a in ancestry] == [e["id"] for e in chain]
        assert [a[1] for a in ancestry] == [e["level"] for e in chain]
        links = trace.sql(f"SELECT src, kind FROM links WHERE dst = {eid}")
        flows = page.eval_on_selector_all(
            "#xp-event-flows li",
            "ls => ls.map(l => [+l.dataset.id, l.dataset.kind, l.dataset.direction])",
        )
        assert sorted(flows) == sorted([int(r.src), r.kind, "in"] for r in links.itertuples())
        assert [f[0] for f in flows] == [chain[0]["id"]]  # the launch: the runtime call
        shot(page, artifacts, "viewer-selected")
        docs_shot(page, "web-viewer")
        # an ancestor clicked becomes the selection
        page.locator("#xp-event-ancestry li button").last.click()
        page.wait_for_selector(f'#xp-panel[data-event="{chain[-1]["id"]}"]')
        assert page.text_content("#xp-event-name") == chain[-1]["name"]


def test_viewer_search_and_critical_path(server, web_root, traces, browser):  # noqa: F811
    """Search lists the matches the store has (SQL, case-insensitive) and a click selects one;
    the critical-path page's button turns the overlay on."""
    trace = traces("alexnet")
    n = int(trace.sql("SELECT count(*) FROM events WHERE lower(name) LIKE '%relu%'").iloc[0, 0])
    assert n > 0
    with open_page(browser) as w:
        page = w.page
        page.goto(page_url(server, "alexnet", "viewer"))
        viewer_ready(page)
        page.fill("#xp-search", "RELU")
        page.wait_for_selector("#xp-results li button")
        assert page.text_content("#xp-results li.xp-dim").startswith(f"{n:,} match")
        first = page.locator("#xp-results li button").first
        eid = int(first.get_attribute("data-id"))
        first.click()
        page.wait_for_selector(f'#xp-panel[data-event="{eid}"]')
        assert "relu" in page.text_content("#xp-event-name").lower()
        page.goto(page_url(server, "alexnet", "critical-path"))
        wait_ready(page)
        page.click("#xp-cp-show")
        viewer_ready(page)
        page.wait_for_function("() => document.querySelector('#xp-ov-cp').checked")
        page.wait_for_function(
            "() => xpuprofViewer.overlays !== null || xpuprofViewer.overlayError", timeout=60_000
        )
        assert page.evaluate("xpuprofViewer.overlayError") is None
        expected = tools.viewer_overlays(trace)
        assert page.evaluate("xpuprofViewer.overlays") == {
            "critical_path": len(expected["critical_path"]),
            "findings": len(expected["findings"]),
        }
        assert len(expected["critical_path"]) > 0


# ---------------------------------------------------------------------------------- XSS


def test_scripts_never_write_html():
    """The page's scripts put data into the page as text only: no innerHTML, outerHTML,
    insertAdjacentHTML or document.write anywhere in them (comments aside), no eval."""
    static = Path(web_app.__file__).parent / "static"
    scripts = sorted(static.glob("*.js"))
    assert {p.name for p in scripts} >= {"app.js", "viewer.js"}
    for path in scripts:
        code = re.sub(r"/\*.*?\*/|//[^\n]*", "", path.read_text(), flags=re.S)
        for sink in (
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
        ):
            assert sink not in code, f"{path.name} uses {sink}"


def test_xss_names_are_text(server, web_root, browser, artifacts):  # noqa: F811
    """A store, op, kernel and arg named ``<img src=x onerror=alert(1)>``: no dialog, no <img>
    element anywhere, and the name shown as text on the overview, the stats and the viewer's
    event panel."""
    x = web_root["stores"]["xss"]
    with open_page(browser) as w:
        page = w.page
        for name in ("overview", "stats"):
            page.goto(page_url(server, x, name))
            assert wait_ready(page) == "1"
            page.wait_for_timeout(300)
            assert page.locator("img").count() == 0
            assert page.get_by_text(EVIL, exact=True).count() >= 1, name
            assert page.text_content("#xp-store-name") == EVIL
        shot(page, artifacts, "xss-stats")
        page.goto(page_url(server, x, "viewer"))
        viewer_ready(page)
        page.fill("#xp-search", "<img")
        page.wait_for_selector("#xp-results li button")
        kernel = page.locator("#xp-results li button", has_text="kernel").first
        kernel.click()
        page.wait_for_selector("#xp-panel[data-event]")
        assert page.text_content("#xp-event-name") == EVIL
        page.wait_for_timeout(300)
        assert page.locator("img").count() == 0
        assert page.evaluate("document.title").endswith("Trace viewer")
        shot(page, artifacts, "xss-viewer")
        docs_shot(page, "web-xss")

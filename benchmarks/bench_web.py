"""The web UI under load (issue 10): 20 clients panning the trace viewer at once for 60 s over
loopback, and the time until the overview page is interactive, cold and warm.

The server is ``xpuprof ui`` itself (``xpuprof.ui.web.server.serve`` in a child process, so
that the clients here do not share its interpreter). The store is the 10 M-event store of
``benchmarks/bench_view.py`` when it has been generated (``bench-data/stores/``), else one
generated here with the same generator (``--events``, 1 M by default; zoom tiers built before
the clock starts)::

    python benchmarks/bench_web.py                       # the bench_view store, or 1 M events
    python benchmarks/bench_web.py --events 10000000     # generate 10 M events
    python benchmarks/bench_web.py --clients 20 --duration 60 --think-ms 100

Each client is one keep-alive HTTP connection that behaves like a viewer being panned: it starts
at a random zoom (a window from 10 µs to the whole trace) and place, then asks for the window at
1,600 px, waits ``--think-ms`` (a person's pan rate, after the viewer's 40 ms debounce), moves
the window by 15 % (A/D) and now and then zooms by 0.8 or 1.25 (W/S), bouncing off the trace's
ends. Latency is the round trip of one window request. The overview page: Playwright (Debian's
chromium) from navigation start to the tables drawn (``#xp-main[data-ready]``), on a server
that has not computed the overview yet (cold: the tool runs) and again (warm: from the
server's cache; the page and Plotly from the browser's).

Targets (issue 10): no errors, p99 < 500 ms; overview interactive < 1 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import psutil

ROOT = Path(__file__).resolve().parents[1]
BENCH_VIEW_STORE = ROOT / "bench-data" / "stores" / "view-10000000-8.store"
WIDTH = 1600
HEIGHT = 860  # px of tracks in view (a 1,600 x 900 canvas less its time axis)
MIN_SPAN = 10_000  # ns


class Window(msgspec.Struct):
    items: int
    elapsed_ms: float


WINDOW = msgspec.json.Decoder(Window)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def the_store(args: argparse.Namespace) -> Path:
    """The store to serve: ``--store``, the bench_view store, or one generated here."""
    if args.store:
        return args.store
    if args.events is None and BENCH_VIEW_STORE.exists():
        return BENCH_VIEW_STORE
    events = args.events or 1_000_000
    store = ROOT / "bench-data" / "stores" / f"web-{events}-8.store"
    from xpuprof.trace import store as st

    if not st.is_store(store):
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import bench_view

        t = time.perf_counter()
        bench_view.generate(store, events, 8)
        print(f"generated {store} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return store


def build_tiers(store: Path) -> float:
    """Build the viewer's zoom tiers (once per store) before the clock starts; seconds."""
    import xpuprof
    from xpuprof import view

    t = time.perf_counter()
    with xpuprof.load(store) as trace:
        view.tracks(trace)
    return time.perf_counter() - t


class Server:
    """``serve(store, port=0, prefetch=0)`` in a child process; its URL and peak RSS."""

    def __init__(self, store: Path) -> None:
        code = ("import sys; from xpuprof.ui.web.server import serve; "
                "serve(sys.argv[1], port=0, prefetch=0)")  # fmt: skip
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(store)],
                                     stdout=subprocess.PIPE, text=True)  # fmt: skip
        line = self.proc.stdout.readline()
        if " at http" not in line:
            self.stop()
            raise SystemExit(f"the server did not start: {line!r}")
        self.url = line.split(" at ", 1)[1].split()[0]
        self.peak_rss = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()

    def _watch(self) -> None:
        p = psutil.Process(self.proc.pid)
        while not self._stop.is_set():
            try:
                self.peak_rss = max(self.peak_rss, p.memory_info().rss)
            except psutil.Error:
                return
            self._stop.wait(0.05)

    def stop(self) -> None:
        if hasattr(self, "_stop"):
            self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def visible(tracks: list[dict[str, Any]], top: float) -> list[int]:
    """The tracks a viewer scrolled down ``top`` px shows, laid out as ``static/viewer.js``
    does (a group header of 20 px, 18 px per lane, 40 px per counter, 4 px between tracks)."""
    y, seen, out = 0.0, set(), []
    for t in tracks:
        if t["group"] not in seen:
            seen.add(t["group"])
            y += 20
        h = 40 if t["kind"] == "counter" else max(1, t["lanes"]) * 18
        if y + h > top and y < top + HEIGHT:
            out.append(t["track"])
        y += h + 4
    return out


def pan_client(base: str, tracks: dict[str, Any], seconds: float, think: float, seed: int,
               out: dict[str, list[Any]]) -> None:  # fmt: skip
    """One viewer being panned until ``seconds`` have passed: the tracks in view at a random
    scroll position (the viewer asks for those only), the window moved as the keys move it."""
    rng = random.Random(seed)
    t0, t1 = tracks["t0"], tracks["t1"]
    height = sum(max(1, t["lanes"]) * 18 + 24 for t in tracks["tracks"])
    shown = visible(tracks["tracks"], rng.uniform(0, max(0, height - HEIGHT)))
    wanted = ",".join(map(str, shown)) if len(shown) < len(tracks["tracks"]) else ""
    total = max(MIN_SPAN, t1 - t0)
    span = math.exp(rng.uniform(math.log(MIN_SPAN), math.log(total)))
    a = rng.uniform(t0, max(t0, t1 - span))
    step = 1
    end = time.monotonic() + seconds
    with httpx.Client(base_url=base, timeout=30) as c:
        while time.monotonic() < end:
            q = {"ts0": int(a), "ts1": int(a + span), "width": WIDTH, "tracks": wanted}
            t = time.perf_counter()
            try:
                r = c.get("view/window", params=q)
                ms = (time.perf_counter() - t) * 1000
                if r.status_code != 200:
                    out["errors"].append(f"{r.status_code}: {r.text[:200]}")
                else:
                    d = WINDOW.decode(r.content)  # only the fields counted: a light client
                    out["ms"].append(ms)
                    out["server_ms"].append(d.elapsed_ms)
                    out["items"].append(d.items)
            except httpx.HTTPError as e:
                out["errors"].append(repr(e))
            out["tracks"].append(len(shown))
            time.sleep(think)
            roll = rng.random()
            if roll < 0.1:
                span = min(total, max(MIN_SPAN, span * 0.8))
            elif roll < 0.2:
                span = min(total, span * 1.25)
            a += step * 0.15 * span
            if a + span > t1 or a < t0:
                step = -step
                a = min(max(a, t0), max(t0, t1 - span))


def load(url: str, store_name: str, clients: int, seconds: float, think: float) -> dict[str, Any]:
    base = f"{url}api/s/{quote(store_name, safe='')}/"
    tracks = httpx.get(base + "view/tracks", timeout=600).json()
    out: dict[str, list[Any]] = {"ms": [], "server_ms": [], "items": [], "errors": [],
                                 "tracks": []}  # fmt: skip
    threads = [threading.Thread(target=pan_client, args=(base, tracks, seconds, think, i, out))
               for i in range(clients)]  # fmt: skip
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ms = out["ms"]
    return {
        "clients": clients, "seconds": round(wall, 1), "think_ms": think * 1000,
        "requests": len(ms) + len(out["errors"]), "errors": len(out["errors"]),
        "first_errors": out["errors"][:3],
        "per_s": round(len(ms) / wall, 1),
        "latency_ms": {"p50": round(pct(ms, 0.5), 1), "p90": round(pct(ms, 0.9), 1),
                       "p99": round(pct(ms, 0.99), 1), "max": round(max(ms, default=0), 1)},
        "server_ms": {"p50": round(pct(out["server_ms"], 0.5), 1),
                      "p99": round(pct(out["server_ms"], 0.99), 1)},
        "items_max": max(out["items"], default=0),
        "tracks": len(tracks["tracks"]),
        "tracks_per_request_mean": round(statistics.mean(out["tracks"] or [0]), 1),
    }  # fmt: skip


def overview_interactive(url: str, store_name: str) -> dict[str, Any]:
    """Navigation start → the overview's tables drawn, cold (the tool runs) then warm."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return {"skipped": "playwright is not installed"}
    if not Path("/usr/bin/chromium").exists():
        return {"skipped": "/usr/bin/chromium not found"}
    args = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
            "--no-first-run"]  # fmt: skip
    out: dict[str, Any] = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=args)
        try:
            ctx = b.new_context(viewport={"width": 1400, "height": 900})
            page = ctx.new_page()
            for label in ("cold", "warm", "warm2"):
                page.goto(f"{url}s/{quote(store_name, safe='')}/#/overview")
                page.wait_for_selector("#xp-main[data-ready]", timeout=600_000)
                ready = page.evaluate("+document.querySelector('#xp-main').dataset.readyMs")
                out[f"{label}_ms"] = round(ready)
                page.goto("about:blank")
        finally:
            b.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path, default=None)
    ap.add_argument("--events", type=int, default=None,
                    help="generate a store of this many events (default: the bench_view "
                         "store when it exists, else 1,000,000)")  # fmt: skip
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--think-ms", type=float, default=100.0)
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args(argv)
    store = the_store(args)
    res: dict[str, Any] = {"machine": f"{platform.node()} {os.cpu_count()} CPUs, "
                                      f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
                           "date": time.strftime("%Y-%m-%d"), "store": str(store)}  # fmt: skip
    with open(store / "manifest.json") as f:
        res["events"] = json.load(f)["rows"]["events"]
    res["tiers_s"] = round(build_tiers(store), 1)
    server = Server(store)
    try:
        res["url"] = server.url
        res["pan"] = load(server.url, store.name, args.clients, args.duration,
                          args.think_ms / 1000)  # fmt: skip
        res["server_peak_rss_mb_panning"] = round(server.peak_rss / 2**20)
        if not args.no_browser:
            res["overview"] = overview_interactive(server.url, store.name)
            res["server_peak_rss_mb_with_overview"] = round(server.peak_rss / 2**20)
    finally:
        server.stop()
    print(json.dumps(res, indent=1))
    return 0 if res["pan"]["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

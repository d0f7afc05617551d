"""What the web UI's routes share: the served stores (:class:`Web`: the catalog, the answer
cache, the templates), running work on a store in a worker thread with its lock held
(:func:`answer`), JSON encoding and the errors that become HTTP statuses.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from xpuprof.core.errors import StoreError, XpuprofError
from xpuprof.ui.web.catalog import AnswerCache, Catalog, Gone, OpenStore, UnknownStore

log = logging.getLogger("xpuprof.ui.web")

STATIC = Path(str(files("xpuprof") / "ui" / "web" / "static"))
TEMPLATES = Path(str(files("xpuprof") / "ui" / "web" / "templates"))
#: Stores whose overview a starting server computes before anyone asks (``serve``).
PREFETCH = 1


class BadRequest(XpuprofError):
    """A parameter the API cannot use (HTTP 400)."""


class NotThere(XpuprofError):
    """Something the URL names that does not exist (HTTP 404)."""


def encode(obj: Any) -> bytes:
    """JSON bytes: NaN and infinities as null (what JSON has), numpy values as numbers."""
    import msgspec

    return msgspec.json.encode(obj, enc_hook=_plain)


def _plain(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return obj.tolist()
    if type(obj).__name__ in ("NAType", "NaTType"):
        return None
    return str(obj)


def json_response(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def error_response(status: int, message: str) -> Response:
    return json_response(encode({"error": message}), status)


def plotly_js() -> Path:
    """plotly.min.js from the installed plotly package (served as is: no CDN, works offline)."""
    return Path(str(files("plotly") / "package_data" / "plotly.min.js"))


def status_of(e: XpuprofError) -> int:
    if isinstance(e, (UnknownStore, NotThere)):
        return 404
    try:
        from xpuprof.view import NotFound
    except ImportError:  # the view module absent: no view errors to tell apart
        NotFound = ()  # noqa: N806
    if isinstance(e, NotFound):
        return 404
    return 500 if isinstance(e, StoreError) else 400


def cache_key(opened: list[OpenStore], key: tuple | None) -> tuple | None:
    """The cache key of an answer: each store's name and manifest time, then ``key``."""
    return None if key is None else (*((s.name, s.stamp) for s in opened), *key)


def answer(cache: AnswerCache, opened: list[OpenStore], role: str, full: tuple | None,
           fn: Callable[..., Any], alive: Callable[[], bool] = lambda: True) -> bytes:  # fmt: skip
    """``fn(stores, traces)`` as JSON bytes, with each store's Trace of ``role`` locked (in
    name order: one order for every request, so two never wait for each other), from the
    cache when ``full`` is in it, put there after."""
    by_name = {s.name: s for s in opened}
    order = sorted(by_name)

    def job(k: int = 0, held: tuple[tuple[str, Any], ...] = ()) -> bytes:
        if k < len(order):
            s = by_name[order[k]]
            return s.call(role, lambda trace: job(k + 1, (*held, (s.name, trace))), alive)
        if full is not None and (hit := cache.get(full)) is not None:
            return hit  # computed while this request waited
        traces = dict(held)
        body = encode(fn(opened, [traces[s.name] for s in opened]))
        if full is not None:
            cache.put(full, body)
        return body

    return job()


async def _watch(request: Request, gone: threading.Event) -> None:
    """Set ``gone`` when the client disconnects (a request is a GET: its body is nothing), so
    that a worker thread can drop a request whose client left while it waited for the store,
    without a round trip through the event loop."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return


class Web:
    """The state of one web UI: the served stores (:class:`Catalog`), the cache of answers
    and the page templates (Jinja2, autoescaped)."""

    def __init__(self, root: Path) -> None:
        import jinja2

        self.catalog = Catalog(Path(root))
        self.cache = AnswerCache()
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                                      autoescape=True)  # fmt: skip

    def page(self, template: str, code: int = 200, **context: Any) -> HTMLResponse:
        html = self.env.get_template(template).render(**context)
        return HTMLResponse(html, status_code=code, headers={"cache-control": "no-store"})

    async def work(self, request: Request, names: list[str], role: str, key: tuple | None,
                   fn: Callable[..., Any]) -> Response:  # fmt: skip
        """``fn(stores, traces)`` in a worker thread with the named stores' Traces of ``role``,
        as JSON (:func:`answer`); from the cache, without a thread, when it is there; nothing
        (499) when the client has left."""
        opened: list[OpenStore] = []
        try:
            for name in names:
                opened.append(self.catalog.acquire(name))
            full = cache_key(opened, key)
            if full is not None and (hit := self.cache.get(full)) is not None:
                return json_response(hit)
            gone = threading.Event()
            watcher = asyncio.ensure_future(_watch(request, gone))
            try:
                body = await anyio.to_thread.run_sync(
                    answer, self.cache, opened, role, full, fn, lambda: not gone.is_set()
                )
            finally:
                watcher.cancel()
            return json_response(body)
        except Gone:
            return Response(status_code=499)
        finally:
            for s in opened:
                self.catalog.release(s)

    def prefetch(self, limit: int = PREFETCH) -> threading.Thread | None:
        """Compute the overview's answer (with its default options) for the first ``limit``
        stores in a background thread, so that the first visit finds it ready (a big store's
        overview takes seconds)."""
        from xpuprof.ui.web.api import overview_prefetch

        payload_key, payload = overview_prefetch()
        names = list(self.catalog.names())[:limit]
        if not names:
            return None

        def run() -> None:
            for name in names:
                try:
                    s = self.catalog.acquire(name)
                except XpuprofError:
                    continue
                try:
                    answer(self.cache, [s], "tools", cache_key([s], payload_key),
                           lambda st, tr, n=name: payload(n, tr[0]))  # fmt: skip
                except Exception as e:  # a store the overview cannot read: its page will say
                    log.warning("xpuprof ui: prefetching the overview of %s: %s", name, e)
                finally:
                    self.catalog.release(s)

        thread = threading.Thread(target=run, name="xpuprof-ui-prefetch", daemon=True)
        thread.start()
        return thread


def store_rows(catalog: Catalog) -> list[dict[str, Any]]:
    """The store list: name, sources, ranks and events of each store, from its manifest."""
    from xpuprof.trace.store import read_manifest

    rows = []
    for name, path in catalog.names().items():
        try:
            m = read_manifest(path, check_files=False)
        except XpuprofError as e:
            rows.append({"name": name, "error": str(e)})
            continue
        ranks = sorted({s["rank"] for s in m["sources"] if s.get("rank") is not None})
        rows.append({"name": name, "sources": len(m["sources"]), "ranks": ranks,
                     "events": int(m["rows"].get("events", 0)),
                     "written": m.get("written")})  # fmt: skip
    return rows

"""The web UI's application (``xpuprof ui``): pages and a JSON API over the stores of one
directory, read-only. ``docs/web.md`` describes the pages, the API and the security model.

Every answer is what :mod:`xpuprof.ui.tools` returns — a tool's ``--json`` document, its charts
(:func:`xpuprof.ui.charts.figures`) and its tables formatted by the terminal's rules
(:mod:`xpuprof.ui.web.tables`), or the trace viewer's answers (``tools.viewer_*``, times from
the trace's first event: :mod:`xpuprof.ui.web.timebase`). Nothing is computed here.

Work on a store runs in a worker thread (the server stays responsive), on that store's Trace
for its role (tools or viewer), one request at a time per Trace; a request whose client left
while it waited is dropped. Tool answers, charts included, are kept as JSON bytes per (store,
tool, options) in a bounded cache. Errors: a bad parameter → 400 ``{"error": …}``, an unknown
store, tool, event or route → 404, anything unexpected → 500 with one line (the traceback goes
to the server's log, never to the client).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import anyio
import anyio.from_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.gzip import GZipMiddleware
from starlette.staticfiles import StaticFiles

from xpuprof.core.errors import XpuprofError
from xpuprof.ui.web import api
from xpuprof.ui.web import pages as page_registry
from xpuprof.ui.web.security import Guard
from xpuprof.ui.web.service import (
    STATIC,
    Web,
    encode,
    error_response,
    log,
    plotly_js,
    status_of,
    store_rows,
)


def create_app(root: Path, *, token: str | None = None) -> FastAPI:
    """The web UI over ``root``: one store, or a directory whose subdirectories (one level)
    are stores. ``token``: the secret every request must carry (see
    :mod:`xpuprof.ui.web.security`)."""
    web = Web(Path(root))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        web.catalog.close()

    app = FastAPI(title="xpuprof", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)  # fmt: skip
    app.state.web = web
    app.state.catalog, app.state.cache = web.catalog, web.cache
    app.state.prefetch = web.prefetch
    # level 1: a window of 30,000 items (1.6 MB of JSON) in 6 ms, 7x smaller; level 9 (the
    # default) took 75 ms for 30 % less
    app.add_middleware(GZipMiddleware, minimum_size=2048, compresslevel=1)
    app.add_middleware(Guard, token=token)
    _errors(app, web)
    _pages(app, web)
    api.register(app, web)
    return app


def _errors(app: FastAPI, web: Web) -> None:
    """Errors as answers: JSON ``{"error": …}`` for the API, a page otherwise."""
    page = web.page

    @app.exception_handler(XpuprofError)
    async def xpuprof_error(request: Request, e: XpuprofError) -> Response:
        status = status_of(e)
        if request.url.path.startswith("/api/"):
            return error_response(status, str(e))
        return page("error.html", status, status=status, message=str(e))

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request: Request, e: RequestValidationError) -> Response:
        where = "; ".join(f"{'.'.join(map(str, err.get('loc', ())[1:]))}: {err.get('msg')}"
                          for err in e.errors()[:3])  # fmt: skip
        return error_response(400, f"bad parameter ({where})")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        message = "not found" if e.status_code == 404 else str(e.detail)
        if request.url.path.startswith("/api/"):
            return error_response(e.status_code, message)
        return page("error.html", e.status_code, status=e.status_code, message=message)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, e: Exception) -> Response:
        log.error("xpuprof ui: %s %s failed", request.method, request.url.path, exc_info=e)
        name = type(e).__name__
        return error_response(500, f"internal error ({name}); the server's log has details")


def _pages(app: FastAPI, web: Web) -> None:
    """The store list, a store's page (the shell its pages draw in), the static files."""
    page, catalog = web.page, web.catalog

    # -- pages ----------------------------------------------------------------------------

    @app.get("/static/plotly.min.js", include_in_schema=False)
    async def plotly() -> FileResponse:
        return FileResponse(plotly_js(), media_type="text/javascript",
                            headers={"cache-control": "public, max-age=86400"})  # fmt: skip

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/", response_class=HTMLResponse)
    async def index() -> Response:
        stores = await anyio.to_thread.run_sync(store_rows, catalog)
        if len(stores) == 1:
            return RedirectResponse(f"/s/{quote(stores[0]['name'], safe='')}/", 303)
        return page("index.html", stores=stores, root=catalog.root.name)

    @app.get("/s/{store}", include_in_schema=False)
    async def store_slash(store: str) -> Response:
        catalog.path(store)
        return RedirectResponse(f"/s/{quote(store, safe='')}/", 308)

    @app.get("/s/{store}/", response_class=HTMLResponse)
    async def store_page(store: str) -> Response:
        catalog.path(store)
        names = list(catalog.names(refresh=False))
        every = page_registry.pages()
        config = {"store": store, "stores": names,
                  "api": f"/api/s/{quote(store, safe='')}/",
                  "pages": [page_registry.page_json(p) for p in every]}  # fmt: skip
        return page("store.html", store=store, pages=every, config=encode(config).decode())

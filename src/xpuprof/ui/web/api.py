"""The web UI's JSON API: a tool's answer (``/api/s/STORE/tools/TOOL``), the diff of two stores
(``/api/diff``) and the trace viewer's questions (``/api/s/STORE/view/…``). ``docs/web.md``
lists every route and parameter.

Each answer is what :mod:`xpuprof.ui.tools` returns: a tool's ``--json`` document with its
table view (:mod:`.tables`) and charts (:func:`xpuprof.ui.charts.figures`), or the viewer's
dicts with times from the trace's first event (:mod:`.timebase`).
"""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import Response

from xpuprof.ui import tools
from xpuprof.ui.web import pages as page_registry
from xpuprof.ui.web import timebase
from xpuprof.ui.web.catalog import OpenStore
from xpuprof.ui.web.service import BadRequest, NotThere, Web, encode, json_response, store_rows
from xpuprof.ui.web.tables import result_view

#: Longest search text, most matches, widest window a client may ask for.
MAX_QUERY = 200
MAX_MATCHES = 1000
MAX_WIDTH = 16384
#: Query parameters that are never a tool's option.
RESERVED = ("token",)
#: The longest what-if change text the viewer takes (``whatif=``: several changes).
MAX_CHANGES = 1000


def _tool(name: str, inputs: int = 1) -> tools.Tool:
    tool = next((t for t in tools.TOOLS if t.name == name), None)
    if tool is None or tool.inputs != inputs:
        raise NotThere(f"no tool {name!r} for {inputs} store(s)")
    return tool


def _typed(option: tools.Option, text: str) -> Any:
    if option.type is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise BadRequest(f"{option.name}: not true or false: {text!r}")
    if option.type is int:
        try:
            return int(text)
        except ValueError:
            raise BadRequest(f"{option.name}: not a whole number: {text!r}") from None
    return text


def tool_options(tool: tools.Tool, query: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The tool's keywords from the query string, typed as its options say; an unknown or
    malformed parameter is a :class:`BadRequest`. Empty values are left to the default."""
    known = {o.name: o for o in (*(tools.COMMON[c] for c in tool.common), *tool.served())}
    local = {o.name for o in tool.options if o.local}
    out: dict[str, Any] = {}
    for key, text in query.multi_items():
        if key in RESERVED or key in skip or text == "":
            continue
        if key in local:
            raise BadRequest(f"{tool.name}: {key} writes files on the server; the web UI "
                             "only reads (use the command line)")  # fmt: skip
        if key not in known:
            raise BadRequest(f"{tool.name} has no option {key!r}; it takes "
                             f"{', '.join(known) or 'none'}")  # fmt: skip
        if len(text) > MAX_QUERY:
            raise BadRequest(f"{key}: longer than {MAX_QUERY} characters")
        if getattr(known[key].type, "__origin__", None) is list:  # repeated: one value each
            out[key] = (*out.get(key, ()), text)
        else:
            out[key] = _typed(known[key], text)
    return out


def _int(query: Any, name: str, lo: int | None = None, hi: int | None = None,
         default: int | None = None) -> int:  # fmt: skip
    text = query.get(name)
    if text is None or text == "":
        if default is None:
            raise BadRequest(f"{name}: missing")
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name}: not a whole number: {text[:40]!r}") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise BadRequest(f"{name}: {value} is out of range ({lo} to {hi})")
    return value


def _flag(query: Any, name: str) -> bool:
    """A yes/no parameter: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``
    (absent or empty: no)."""
    text = (query.get(name) or "").strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    raise BadRequest(f"{name}: not true or false: {text[:40]!r}")


def _whatif(query: Any) -> str | None:
    """The viewer's ``whatif``: the changes whose simulated tracks to show (None: the
    identity replay's, or none)."""
    text = (query.get("whatif") or "").strip()
    if len(text) > MAX_CHANGES:
        raise BadRequest(f"whatif: longer than {MAX_CHANGES} characters")
    return text or None


def _int_list(text: str | None, name: str) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()][:100_000]
    except ValueError:
        raise BadRequest(f"{name}: not a list of whole numbers: {text[:40]!r}") from None


# ------------------------------------------------------------------------------- payloads


def figures(tool: str, res: Any) -> list[dict[str, Any]]:
    """The tool's charts (:func:`xpuprof.ui.charts.figures`)."""
    from xpuprof.ui.charts import figures as charts_figures

    return charts_figures(tool, res)


def tool_payload(tool: tools.Tool, traces: tuple[Any, ...], options: dict[str, Any],
                 stores: list[str]) -> dict[str, Any]:  # fmt: skip
    """A tool's answer for the page: its ``--json`` document, its table view and its charts."""
    res = tools.run(tool.name, *traces, **options)
    doc = res.to_dict() if tool.document is None else tools.document(tool.name, *traces,
                                                                      **options)  # fmt: skip
    return {"stores": stores, "tool": tool.name, "options": options, "document": doc,
            "view": result_view(res), "figures": figures(tool.name, res)}  # fmt: skip


def _origin(s: OpenStore, trace: Any) -> int:
    """The viewer's time origin of a store (the tracks' ``t0``), asked once per open store."""
    if "origin" not in s.values:
        s.values["origin"] = int(tools.viewer_tracks(trace).get("t0") or 0)
    return s.values["origin"]


def overview_prefetch() -> tuple[tuple, Any]:
    """The cache key of the overview with its default options, and how to compute it."""
    tool = _tool("overview")
    return ("tool", tool.name, ()), lambda name, trace: tool_payload(tool, (trace,), {}, [name])


def register(app: FastAPI, web: Web) -> None:
    """Add the API's routes to ``app``."""
    _tool_routes(app, web)
    _view_routes(app, web)


def _tool_routes(app: FastAPI, web: Web) -> None:
    """The store list, the page registry, a tool's answer, the diff, the what-if's picks."""

    @app.get("/api/stores")
    async def stores_api() -> Response:
        rows = await anyio.to_thread.run_sync(store_rows, web.catalog)
        return json_response(encode({"root": str(web.catalog.root.name), "stores": rows}))

    @app.get("/api/pages")
    async def pages_api() -> Response:
        return json_response(encode([page_registry.page_json(p) for p in page_registry.pages()]))

    @app.get("/api/s/{store}/tools/{tool}")
    async def tool_api(request: Request, store: str, tool: str) -> Response:
        t = _tool(tool)
        opts = tool_options(t, request.query_params)
        key = ("tool", t.name, tuple(sorted(opts.items())))
        return await web.work(request, [store], "tools", key,
                          lambda s, tr: tool_payload(t, tuple(tr), opts, [store]))  # fmt: skip

    @app.get("/api/diff")
    async def diff_api(request: Request) -> Response:
        q = request.query_params
        a, b = q.get("a"), q.get("b")
        if not a or not b:
            raise BadRequest("diff needs two stores: ?a=BASELINE&b=NEW")
        t = _tool("diff", inputs=2)
        opts = tool_options(t, q, skip=("a", "b"))
        key = ("diff", tuple(sorted(opts.items())))

        def run(s: list[OpenStore], tr: list[Any]) -> dict[str, Any]:
            return tool_payload(t, tuple(tr), opts, [a, b])

        return await web.work(request, [a, b], "tools", key, run)

    @app.get("/api/s/{store}/whatif/picks")
    async def whatif_picks_api(request: Request, store: str) -> Response:
        return await web.work(request, [store], "tools", ("whatif-picks",),
                              lambda s, tr: tools.whatif_picks(tr[0]))  # fmt: skip


def _view_routes(app: FastAPI, web: Web) -> None:
    """The trace viewer's questions: tracks, window, event, search, overlays."""

    @app.get("/api/s/{store}/view/tracks")
    async def tracks_api(request: Request, store: str) -> Response:
        sim, whatif = _flag(request.query_params, "sim"), _whatif(request.query_params)

        def run(s: list[OpenStore], tr: list[Any]) -> dict[str, Any]:
            doc = timebase.tracks(tools.viewer_tracks(tr[0], sim=sim, whatif=whatif))
            s[0].values["origin"] = doc["origin"]
            return doc

        return await web.work(request, [store], "view", ("tracks", sim, whatif), run)

    @app.get("/api/s/{store}/view/window")
    async def window_api(request: Request, store: str) -> Response:
        q = request.query_params
        ts0, ts1 = _int(q, "ts0"), _int(q, "ts1")
        width = _int(q, "width", 1, MAX_WIDTH)
        wanted = _int_list(q.get("tracks"), "tracks")
        sim, whatif = _flag(q, "sim"), _whatif(q)
        if ts1 <= ts0:
            raise BadRequest(f"ts1 ({ts1}) must be after ts0 ({ts0})")

        def run(s: list[OpenStore], tr: list[Any]) -> dict[str, Any]:
            origin = _origin(s[0], tr[0])
            doc = tools.viewer_window(tr[0], ts0 + origin, ts1 + origin, width, wanted, sim=sim,
                                      whatif=whatif)  # fmt: skip
            return timebase.window(doc, origin)

        return await web.work(request, [store], "view", None, run)

    @app.get("/api/s/{store}/view/event/{event_id}")
    async def event_api(request: Request, store: str, event_id: str) -> Response:
        try:
            eid = int(event_id)
        except ValueError:
            raise BadRequest(f"not an event id: {event_id[:40]!r}") from None
        sim, whatif = _flag(request.query_params, "sim"), _whatif(request.query_params)

        def run(s: list[OpenStore], tr: list[Any]) -> dict[str, Any]:
            doc = tools.viewer_event(tr[0], eid, sim=sim, whatif=whatif)
            return timebase.event(doc, _origin(s[0], tr[0]))

        return await web.work(request, [store], "view", ("event", eid, sim, whatif), run)

    @app.get("/api/s/{store}/view/search")
    async def search_api(request: Request, store: str) -> Response:
        q = request.query_params
        text = q.get("q", "")
        if not text.strip() or len(text) > MAX_QUERY:
            raise BadRequest(f"q: a name to look for, 1 to {MAX_QUERY} characters")
        limit = _int(q, "limit", 1, MAX_MATCHES, default=100)

        def run(s: list[OpenStore], tr: list[Any]) -> dict[str, Any]:
            doc = tools.viewer_search(tr[0], text, limit=limit)
            return timebase.search(doc, _origin(s[0], tr[0]))

        return await web.work(request, [store], "view", ("search", text, limit), run)

    @app.get("/api/s/{store}/view/overlays")
    async def overlays_api(request: Request, store: str) -> Response:
        q = request.query_params
        for key in q:
            if key not in ("ranks", "steps", *RESERVED):
                raise BadRequest(f"overlays take ranks and steps, not {key!r}")
        ranks = tools.parse_ranks(q.get("ranks") or None)
        steps = tools.parse_steps(q.get("steps") or None)

        def run(s: list[OpenStore], tr: list[Any]) -> dict[str, Any]:
            doc = tools.viewer_overlays(tr[0], ranks=ranks, steps=steps)
            with_origin = s[0].values.get("origin")
            if with_origin is None:  # the tools' Trace: ask its tracks once
                with_origin = _origin(s[0], tr[0])
            return timebase.overlays(doc, with_origin)

        key = ("overlays", q.get("ranks") or "", q.get("steps") or "")
        return await web.work(request, [store], "tools", key, run)

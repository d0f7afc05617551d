"""The web UI (``xpuprof ui``): :func:`xpuprof.ui.web.app.create_app` (the FastAPI app: pages
and a JSON API over a directory of stores, read-only) and :func:`xpuprof.ui.web.server.serve`.
Pages are plug-ins (:mod:`xpuprof.ui.web.pages`); ``docs/web.md`` describes it all.
"""

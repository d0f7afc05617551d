"""The pages of a store, as plug-ins: one :class:`Page` entry each (its name in the URL, its
title in the navigation, the tool whose answer it shows, options it fixes, and the renderer
that draws it in the browser). A later tool adds a page by adding an entry to :data:`PAGES`;
a tool of :data:`xpuprof.ui.tools.TOOLS` that takes one trace and has no page of its own gets
the generic page (its tables and charts) without any entry.

Renderers (``static/app.js``): ``tool`` (the generic page: headline, charts, every table
sortable and filterable, notes), ``overview``, ``viewer``, ``hierarchy``, ``critical_path``,
``replay``, ``whatif``, ``diff`` and ``multirank``. A renderer the browser does not know draws
as ``tool``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from xpuprof.ui import tools


@dataclass(frozen=True)
class Page:
    """One page of a store: ``name`` (``#/name`` in the URL), ``title`` (in the navigation),
    ``tool`` (the tool whose answer it shows; None for the viewer), ``options`` (fixed options
    of that tool), ``renderer`` (how the browser draws it) and one line of ``help``."""

    name: str
    title: str
    tool: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    renderer: str = "tool"
    help: str = ""


#: The pages with an entry of their own, in navigation order.
PAGES: tuple[Page, ...] = (
    Page("overview", "Overview", "overview", renderer="overview",
         help="Step time, where it goes, the bottleneck, findings, top ops and kernels."),
    Page("viewer", "Trace viewer", None, renderer="viewer",
         help="The timeline: W/S zoom, A/D pan, drag, wheel; click an event for details."),
    Page("stats", "Stats", "stats", help="Op, kernel and layer statistics."),
    Page("hierarchy", "Hierarchy", "hierarchy", renderer="hierarchy",
         help="Device time attributed up the stack: step → layer → op → kernel."),
    Page("roofline", "Roofline", "roofline"),
    Page("memory", "Memory", "memory"),
    Page("comm", "Communication", "comm"),
    Page("input", "Input", "input"),
    Page("critical-path", "Critical path", "critical-path", renderer="critical_path"),
    Page("replay", "Replay", "replay", renderer="replay",
         help="The trace replayed on its dependency graph: simulated vs measured step time, "
              "edges per kind, what could not be modelled, the largest deviations."),
    Page("whatif", "What-if", "whatif", renderer="whatif",
         help="Predict what a change is worth: the trace replayed with it — the step time, "
              "the critical path's shift between kinds of work, and the changed timeline."),
    Page("diff", "Diff", "diff", renderer="diff",
         help="This store against another store of the directory."),
    Page("multirank", "Multi-rank", "overview", renderer="multirank",
         help="Step time per rank and step."),
)  # fmt: skip


def pages() -> list[Page]:
    """Every page of a store: :data:`PAGES`, then a generic page for each one-trace tool of
    :data:`xpuprof.ui.tools.TOOLS` that none of them shows."""
    shown = {p.tool for p in PAGES}
    generic = [Page(t.name, t.name.replace("-", " ").capitalize(), t.name, help=t.help)
               for t in tools.TOOLS if t.inputs == 1 and t.name not in shown]  # fmt: skip
    return [*PAGES, *generic]


def controls(tool_name: str | None) -> list[dict[str, Any]]:
    """The options of a page's tool as the browser's form shows them (name, help, type,
    default), the common ones (ranks, steps) first."""
    if tool_name is None:
        return []
    tool = tools.get(tool_name)
    opts = [tools.COMMON[c] for c in tool.common] + list(tool.served())
    return [{"name": o.name, "help": o.help, "type": o.type.__name__,
             "default": o.default if isinstance(o.default, (bool, int, float, str)) else None}
            for o in opts]  # fmt: skip


def page_json(page: Page) -> dict[str, Any]:
    """A page as the browser's router reads it."""
    return {"name": page.name, "title": page.title, "tool": page.tool,
            "options": dict(page.options), "renderer": page.renderer, "help": page.help,
            "controls": controls(page.tool)}  # fmt: skip

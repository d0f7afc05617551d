"""The trace viewer's server side: what a timeline client asks of a store (``docs/view.md``).

``tracks`` lists the tracks (host threads, device streams, counter series) and the trace's
span; ``window`` answers a time window at a resolution from the zoom tiers (events at least a
pixel wide as they are, thinner ones merged per pixel, counters, flows), in bounded time and
size whatever the size of the trace; ``event`` gives one event with its args, ancestry and
flows; ``search`` finds events by name; ``overlays`` places the critical path and the advisor's
findings on the tracks. The tiers are written next to the store on first use (``tiers``).
"""

from __future__ import annotations

from xpuprof.view.detail import event, search
from xpuprof.view.errors import NotFound, ViewError
from xpuprof.view.overlays import overlays
from xpuprof.view.window import tracks, window

__all__ = ["NotFound", "ViewError", "event", "overlays", "search", "tracks", "window"]

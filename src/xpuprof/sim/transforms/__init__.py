"""What-if transforms that live in modules of their own (``whatif.py`` holds the core ones).

Each module of :data:`REGISTRY` prices or restructures one kind of change and exposes:

- ``PRICED: bool`` — whether it is applied with the cost-model changes (first, on the delays
  so far) or with the graph changes after them;
- ``parse(text, verb, arg, value) -> Change`` — ``VERB[:ARG][=VALUE]`` parsed, a clear
  :class:`~xpuprof.core.errors.XpuprofError` for anything else;
- ``apply(change, ctx: Context) -> str`` — change ``ctx.delay``/``ctx.keep`` in place; a note
  saying what it touched (an error when it selects nothing, naming what exists).

Modules are imported on first use, so the registry costs nothing until a change names them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from xpuprof.sim.graph import ReplayGraph
    from xpuprof.trace.trace import Trace

#: verb → module (under ``xpuprof.sim.transforms``).
REGISTRY = {
    "batch": "batch",
    "threads": "threads",
    "fuse-elementwise": "fusion",
    "fuse": "fusion",
    "dtype": "dtype",
    "overlap-collective": "overlap",
}


@dataclass
class Context:
    """What a transform reads and changes: the trace, the replay graph (the baseline's; a
    transform that rewires edges replaces it with a graph of the same nodes and edge
    numbering), the event names of the replayed parts (``whatif._Names``), the edge delays and
    the kept-edge mask (both changed in place), and the CPUs each part could use."""

    trace: Trace
    graph: ReplayGraph
    names: Any
    delay: np.ndarray
    keep: np.ndarray
    cpus: dict[int, int]


def module(verb: str) -> ModuleType:
    """The module that implements ``verb`` (a KeyError when none)."""
    return importlib.import_module(f"{__name__}.{REGISTRY[verb]}")

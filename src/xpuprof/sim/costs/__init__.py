"""Duration models: what each edge of a replay graph costs.

A cost model maps a :class:`~xpuprof.sim.graph.ReplayGraph` to one delay per edge (ns). The
replay issue needs only :class:`Measured` (the delays the graph was calibrated with: measured
durations and gaps, the binding input's measured gap, typical delays elsewhere;
``sim/graph.py``). :class:`Scaled` multiplies the delays of some edge kinds (optionally of some
events only): the smallest change that shows the replay is a model and not a copy, and the
first of the what-if transforms.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from xpuprof.sim.graph import EDGE_KINDS, ReplayGraph


class CostModel(Protocol):
    """Anything that gives one delay (ns, int64) per edge of a graph."""

    def delays(self, graph: ReplayGraph) -> np.ndarray: ...


@dataclass(frozen=True)
class Measured:
    """The calibrated delays of the graph itself (identity replay)."""

    def delays(self, graph: ReplayGraph) -> np.ndarray:
        return graph.edges.delay


@dataclass(frozen=True)
class Given:
    """Delays given as they are (one per edge): the delays a what-if has set so far, as the
    base a cost model prices on top of."""

    values: np.ndarray

    def delays(self, graph: ReplayGraph) -> np.ndarray:
        return self.values


@dataclass(frozen=True)
class Scaled:
    """Delays of the edges of ``kinds`` (names of :data:`EDGE_KINDS`) multiplied by
    ``factor``, only for edges that are the work of ``events`` (``Edges.event``: an event's
    own CPU time, a kernel's run) when given;
    on top of ``base`` (default :class:`Measured`). Rounded to whole ns."""

    factor: float
    kinds: tuple[str, ...] = ("device_work", "device_communication")
    events: Iterable[int] | None = None
    base: CostModel = Measured()

    def delays(self, graph: ReplayGraph) -> np.ndarray:
        unknown = set(self.kinds) - set(EDGE_KINDS)
        if unknown:
            raise ValueError(f"unknown edge kinds {sorted(unknown)}; expected some of {EDGE_KINDS}")
        d = np.asarray(self.base.delays(graph), np.int64)
        pick = np.isin(graph.edges.kind, [EDGE_KINDS.index(k) for k in self.kinds])
        if self.events is not None:
            ids = np.fromiter(self.events, np.int64)
            pick &= np.isin(graph.edges.event, ids)
        out = d.copy()
        out[pick] = np.rint(d[pick] * self.factor).astype(np.int64)
        return out


def resolve(costs: str | CostModel) -> CostModel:
    """A cost model from its name (``"measured"``) or itself."""
    if isinstance(costs, str):
        if costs == "measured":
            return Measured()
        raise ValueError(f"unknown cost model {costs!r}: this version has 'measured'")
    return costs


# the models that price events from what they are (FLOPs, bytes, shapes), after the base ones
# they build on (they import Measured lazily: no cycle)
from xpuprof.sim.costs.roofline import CostModelError, RooflineCosts  # noqa: E402
from xpuprof.sim.costs.systolic import SystolicArray, SystolicCosts  # noqa: E402

__all__ = ["CostModel", "CostModelError", "Given", "Measured", "RooflineCosts", "Scaled",
           "SystolicArray", "SystolicCosts", "resolve"]  # fmt: skip

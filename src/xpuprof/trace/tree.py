"""The event tree of a store: every event's parent, children and ancestors across levels.

One model for every analysis that walks nesting (hierarchy, memory, roofline, stats, comm):
rows in id order, the parent of each row as a row, and vectorized walks up the tree (one numpy
step per nesting level, never a Python loop over events).
"""

from __future__ import annotations

import numpy as np


def outermost(
    has_value: np.ndarray, parent: np.ndarray, ids: np.ndarray | None = None
) -> np.ndarray:
    """Mask of the rows to sum so that nested ops are counted once: rows with a value and no
    ancestor with a value.

    ``parent`` gives each row's parent as a row position (-1: none), or, with ``ids``, as an
    event id from the same ``ids`` column (negative: none) — the events table's ``parent`` and
    ``id``. Ancestors without a value (autograd nodes, annotations, unknown ops) are looked
    through. Runs one vectorized step per nesting level.
    """
    has = np.asarray(has_value, bool)
    par = np.asarray(parent, np.int64)
    if ids is not None:
        ids = np.asarray(ids, np.int64)
        if not len(ids):
            par = np.full(len(par), -1, np.int64)
        else:
            order = np.argsort(ids, kind="stable")
            sid = ids[order]
            pos = np.clip(np.searchsorted(sid, par), 0, len(ids) - 1)
            par = np.where((par >= 0) & (sid[pos] == par), order[pos], -1)
    covered = np.zeros(len(has), bool)
    rows = np.flatnonzero(has & (par >= 0))
    anc = par[rows]
    while rows.size:
        hit = has[anc]
        covered[rows[hit]] = True
        keep = ~hit
        rows, anc = rows[keep], par[anc[keep]]
        live = anc >= 0
        rows, anc = rows[live], anc[live]
    return has & ~covered

"""Embeddings and gathers: 0 FLOPs, the gathered rows read and written."""

from __future__ import annotations

import math
from collections.abc import Callable

from xpuprof.costmodel.call import Call, Cost, add


def _embedding(c: Call) -> Cost:
    """embedding(weight, indices): 0 FLOPs; indices read, one row gathered and written per index."""
    w, idx, z = c.shape(0), c.numel(1), c.itemsize(0)
    if w is None or idx is None or len(w) != 2:
        return None, None
    rows = idx * w[1] * z if z is not None else None
    return 0.0, add(c.nbytes(1), rows, rows)


def _embedding_bag(c: Call) -> Cost:
    """embedding_bag(weight, indices, offsets, …): one add per gathered element."""
    w, idx, off, z = c.shape(0), c.numel(1), c.numel(2), c.itemsize(0)
    if w is None or idx is None or off is None or len(w) != 2:
        return None, None
    gathered = idx * w[1]
    out = off * w[1] * z if z is not None else None
    return float(gathered), add(c.nbytes(1), c.nbytes(2), gathered * z if z else None, out)


def _embedding_dense_backward(c: Call) -> Cost:
    """embedding_dense_backward(grad, indices, num_weights, …): a scatter-add of every grad
    element into a zeroed (num_weights, D) table."""
    g, z, nw = c.shape(0), c.itemsize(0), c.int(2)
    if g is None or not g:
        return None, None
    n = math.prod(g)
    table = nw * g[-1] * z if nw is not None and z is not None else None
    return float(n), add(c.nbytes(0), c.nbytes(1), table)


def _index_select(c: Call) -> Cost:
    """index_select(self, dim, index): 0 FLOPs; index read, the selected slices read and written."""
    s, d, k, z = c.shape(0), c.int(1), c.numel(2), c.itemsize(0)
    if s is None or d is None or k is None or not s:
        return None, None
    d %= len(s)
    sel = math.prod(s) // max(s[d], 1) * k
    return 0.0, add(c.nbytes(2), sel * z if z else None, sel * z if z else None)


def _gather(c: Call) -> Cost:
    """gather(self, dim, index): one element read and written per index."""
    k, z = c.numel(2), c.itemsize(0)
    if k is None:
        return None, None
    return 0.0, add(c.nbytes(2), k * z if z else None, k * z if z else None)


#: (kind, op names without ``aten::``, rule): read by ``costmodel/ops.py``.
RULES: list[tuple[str, str, Callable[[Call], Cost]]] = [
    ("embedding", "embedding", _embedding),
    ("embedding", "embedding_bag _embedding_bag _embedding_bag_forward_only", _embedding_bag),
    ("embedding", "embedding_dense_backward", _embedding_dense_backward),
    ("embedding", "index_select", _index_select),
    ("embedding", "gather", _gather),
]

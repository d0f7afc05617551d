"""Matrix products: FLOPs as ``torch.utils.flop_counter`` counts them (a multiply-add is 2
FLOPs; the bias of addmm/baddbmm is not counted), bytes as inputs read plus output written."""

from __future__ import annotations

import math
from collections.abc import Callable

from xpuprof.costmodel.call import Call, Cost, add, broadcast, dtype_size


def _mm(a: int, b: int, bias: int | None = None) -> Callable[[Call], Cost]:
    """(M,K)·(K,N) [+ bias]: 2·M·K·N FLOPs, the bias add not counted (flop_counter's addmm)."""

    def cost(c: Call) -> Cost:
        x, y = c.shape(a), c.shape(b)
        if x is None or y is None or len(x) != 2 or len(y) != 2 or x[1] != y[0]:
            return None, None
        m, k, n = x[0], x[1], y[1]
        z = c.itemsize(a)
        out = m * n * z if z is not None else None
        extra = c.nbytes(bias) if bias is not None and c.is_tensor(bias) else 0
        return 2.0 * m * k * n, add(c.nbytes(a), c.nbytes(b), extra, out)

    return cost


def _bmm(
    a: int, b: int, bias: int | None = None, reduce_batch: bool = False
) -> Callable[..., Cost]:
    """(B,M,K)·(B,K,N): 2·B·M·K·N (flop_counter's bmm/baddbmm); addbmm sums over B."""

    def cost(c: Call) -> Cost:
        x, y = c.shape(a), c.shape(b)
        if x is None or y is None or len(x) != 3 or len(y) != 3 or x[0] != y[0] or x[2] != y[1]:
            return None, None
        bb, m, k, n = x[0], x[1], x[2], y[2]
        z = c.itemsize(a)
        out = (m * n if reduce_batch else bb * m * n) * z if z is not None else None
        extra = c.nbytes(bias) if bias is not None and c.is_tensor(bias) else 0
        return 2.0 * bb * m * k * n, add(c.nbytes(a), c.nbytes(b), extra, out)

    return cost


def _matmul(c: Call) -> Cost:
    """torch.matmul with its 1-D and broadcast-batch cases; 2 FLOPs per multiply-add."""
    x, y = c.shape(0), c.shape(1)
    if x is None or y is None or not x or not y:
        return None, None
    xm = x if len(x) > 1 else [1] + x
    ym = y if len(y) > 1 else y + [1]
    if xm[-1] != ym[-2]:
        return None, None
    batch = broadcast([xm[:-2], ym[:-2]])
    if batch is None:
        return None, None
    m, k, n = xm[-2], xm[-1], ym[-1]
    nb = math.prod(batch)
    z = c.itemsize(0)
    out_numel = nb * (m if len(x) > 1 else 1) * (n if len(y) > 1 else 1)
    out = out_numel * z if z is not None else None
    return 2.0 * nb * m * k * n, add(c.nbytes(0), c.nbytes(1), out)


def _linear(c: Call) -> Cost:
    """x(…,K)·W(N,K)ᵀ + b: 2·rows·K·N, as its addmm/mm children count it."""
    x, w = c.shape(0), c.shape(1)
    if x is None or w is None or not x or len(w) != 2 or x[-1] != w[1]:
        return None, None
    rows, k, n = math.prod(x[:-1]), x[-1], w[0]
    z = c.itemsize(0)
    out = rows * n * z if z is not None else None
    bias = c.nbytes(2) if c.is_tensor(2) else 0
    return 2.0 * rows * k * n, add(c.nbytes(0), c.nbytes(1), bias, out)


def _mv(a: int, b: int, bias: int | None = None) -> Callable[[Call], Cost]:
    def cost(c: Call) -> Cost:
        x, y = c.shape(a), c.shape(b)
        if x is None or y is None or len(x) != 2 or len(y) != 1 or x[1] != y[0]:
            return None, None
        z = c.itemsize(a)
        extra = c.nbytes(bias) if bias is not None and c.is_tensor(bias) else 0
        out = x[0] * z if z is not None else None
        return 2.0 * x[0] * x[1], add(c.nbytes(a), c.nbytes(b), extra, out)

    return cost


def _dot(c: Call) -> Cost:
    x, y = c.shape(0), c.shape(1)
    if x is None or y is None or len(x) != 1 or x != y:
        return None, None
    return 2.0 * x[0], add(c.nbytes(0), c.nbytes(1), c.itemsize(0))


def _scaled_mm(c: Call) -> Cost:
    """FP8 GEMM: 2·M·K·N (flop_counter's _scaled_mm); output in ``out_dtype`` when given."""
    f, _ = _mm(0, 1)(c)
    x, y = c.shape(0), c.shape(1)
    if f is None or x is None or y is None:
        return None, None
    if c.concrete is None:
        z = None  # out_dtype not recorded: the output size is not known
    elif c.text(6) is not None:
        z = dtype_size(c, 6)
    else:
        z = c.itemsize(0)  # out_dtype None: the inputs' dtype
    reads = add(*(c.nbytes(i) if c.is_tensor(i) else 0 for i in range(min(len(c), 6))))
    return f, add(reads, x[0] * y[1] * z if z is not None else None)


#: (kind, op names without ``aten::``, rule): read by ``costmodel/ops.py``.
RULES: list[tuple[str, str, Callable[[Call], Cost]]] = [
    ("matmul", "mm", _mm(0, 1)),
    ("matmul", "addmm _addmm_activation", _mm(1, 2, 0)),
    ("matmul", "bmm", _bmm(0, 1)),
    ("matmul", "baddbmm", _bmm(1, 2, 0)),
    ("matmul", "addbmm", _bmm(1, 2, 0, reduce_batch=True)),
    ("matmul", "matmul", _matmul),
    ("matmul", "linear", _linear),
    ("matmul", "mv", _mv(0, 1)),
    ("matmul", "addmv addmv_", _mv(1, 2, 0)),
    ("matmul", "dot vdot", _dot),
    ("matmul", "_scaled_mm", _scaled_mm),
]

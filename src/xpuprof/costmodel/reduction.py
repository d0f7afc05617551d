"""Reductions (one to three operations per input element) and softmax (5 per element, its
backward 4) — estimated."""

from __future__ import annotations

import math
from collections.abc import Callable

from xpuprof.costmodel.call import Call, Cost, add, dtype_size
from xpuprof.costmodel.elementwise import elementwise_cost, foreach_cost

#: Reductions: (operations per input element, position of the ``dim`` argument, the number of
#: arguments up to which the call is the full-reduction overload, output item size or None for
#: the input's, whether a ``max.dim``-style indices output is written too).
_REDUCTIONS: dict[str, tuple[int, int, int, int | None, bool]] = {
    "sum": (1, 1, 2, None, False), "nansum": (1, 1, 2, None, False),
    "mean": (1, 1, 2, None, False), "nanmean": (1, 1, 2, None, False),
    "prod": (1, 1, 2, None, False),
    "amax": (1, 1, 1, None, False), "amin": (1, 1, 1, None, False),
    "max": (1, 1, 1, None, True), "min": (1, 1, 1, None, True),
    "argmax": (1, 1, 1, 8, False), "argmin": (1, 1, 1, 8, False),
    "any": (1, 1, 1, 1, False), "all": (1, 1, 1, 1, False),
    "count_nonzero": (1, 1, 1, 8, False),
    "logsumexp": (3, 1, 1, None, False),
    "var": (3, 1, 2, None, False), "std": (3, 1, 2, None, False),
    "var_mean": (3, 1, 2, None, True), "std_mean": (3, 1, 2, None, True),
    "norm": (2, 2, 3, None, False), "linalg_vector_norm": (2, 2, 1, None, False),
    "cumsum": (1, -1, 0, None, False), "cumprod": (1, -1, 0, None, False),
}  # fmt: skip


def _reduction(name: str) -> Callable[[Call], Cost]:
    ops, dim_i, full_upto, out_z, second = _REDUCTIONS[name]

    def cost(c: Call) -> Cost:
        s, z = c.shape(0), c.itemsize(0)
        if s is None:
            return None, None
        if name in ("max", "min") and c.is_tensor(1):  # max.other: elementwise
            return elementwise_cost(1, 2, "maximum", False)(c)
        n = math.prod(s)
        flops = float(ops * n)
        if dim_i < 0:  # scans: output of the input's shape
            out_n: int | None = n
        elif len(c) <= full_upto or c.type(dim_i) in ("", "None"):
            out_n = 1
        else:
            dims = c.ints(dim_i)
            if dims is None:
                out_n = None
            elif not dims:
                out_n = 1
            else:
                nd = max(len(s), 1)
                red = {d % nd for d in dims}
                if s and any(d >= len(s) for d in red):
                    return None, None
                out_n = n // max(math.prod(s[d] for d in red), 1) if s else 1
        zo = out_z if out_z is not None else z
        if out_n is None or zo is None or z is None:
            return flops, None
        writes = out_n * zo + (out_n * (8 if name in ("max", "min") else zo) if second else 0)
        return flops, add(n * z, writes)

    return cost


def _softmax(ops: int, n_in: int, dtype_arg: int | None, half_to_float: int | None) -> Callable:
    """Softmax and its backward: ``ops`` per element; output in the ``dtype`` argument's type
    (or float32 with ``half_to_float``), else the input's."""

    def cost(c: Call) -> Cost:
        n, z = c.numel(0), c.itemsize(0)
        if n is None:
            return None, None
        zo = z
        if dtype_arg is not None and c.text(dtype_arg) is not None:
            zo = dtype_size(c, dtype_arg)
        elif dtype_arg is not None and c.type(dtype_arg) != "":
            zo = None  # a dtype was given but its value not recorded (older traces)
        if half_to_float is not None:
            up = c.flag(half_to_float)
            if up:
                zo = 4
            elif up is None and z is not None and z < 4:
                zo = None  # a half input whose output may be float
        reads = add(*(c.nbytes(i) for i in range(n_in) if c.is_tensor(i)))
        return float(ops * n), add(reads, n * zo if zo is not None else None)

    return cost


#: (kind, op names without ``aten::``, rule): read by ``costmodel/ops.py``.
RULES: list[tuple[str, str, Callable[[Call], Cost]]] = [
    ("reduction", "_foreach_norm", foreach_cost(2)),
    *(("reduction", name, _reduction(name)) for name in _REDUCTIONS),
    ("softmax", "softmax _safe_softmax log_softmax", _softmax(5, 1, 2, None)),
    ("softmax", "_softmax _log_softmax", _softmax(5, 1, None, 2)),
    ("softmax", "_softmax_backward_data _log_softmax_backward_data", _softmax(4, 2, 3, None)),
]

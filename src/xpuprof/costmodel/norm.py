"""Layer, group, batch and RMS normalisation, forward and backward (estimated: 5 operations
per element for statistics and normalisation, +1 each for weight and bias)."""

from __future__ import annotations

import math
from collections.abc import Callable

from xpuprof.costmodel.call import Call, Cost, add


def _affine_terms(c: Call, w_i: int, b_i: int) -> int:
    return int(c.is_tensor(w_i)) + int(c.is_tensor(b_i))


def _norm_forward(
    per: int, w_i: int, b_i: int, training_i: int | None = None, eval_per: int = 2,
    stats: Callable[[Call], int | None] | None = None,
) -> Callable[[Call], Cost]:  # fmt: skip
    """Normalisations: ``per`` operations per element (statistics and normalisation; ``eval_per``
    in eval mode where a ``training`` flag says so), +1 each for the weight and the bias.
    Bytes: the tensor inputs, the output and the saved statistics (``stats`` elements, fp32)."""

    def cost(c: Call) -> Cost:
        n, z = c.numel(0), c.itemsize(0)
        if n is None:
            return None, None
        k = per
        if training_i is not None:
            tr = c.flag(training_i) if training_i >= 0 else False
            if tr is None:
                k = -1
            elif not tr:
                k = eval_per
        flops = float((k + _affine_terms(c, w_i, b_i)) * n) if k >= 0 else None
        reads = add(*(c.nbytes(i) for i in range(len(c)) if c.is_tensor(i)))
        st = stats(c) if stats is not None else 0
        out = n * z + 2 * 4 * st if z is not None and st is not None else None
        return flops, add(reads, out)

    return cost


def _layer_norm_rows(c: Call) -> int | None:
    s, ns = c.shape(0), c.ints(1)
    if s is None:
        return None
    if ns is None:
        w = c.shape(2)
        ns = w if w is not None else None
    if ns is None or len(ns) > len(s):
        return None
    return math.prod(s[: len(s) - len(ns)])


def _channels(c: Call) -> int | None:
    s = c.shape(0)
    return s[1] if s is not None and len(s) > 1 else None


def _group_stats(c: Call) -> int | None:
    s, g = c.shape(0), c.int(6)
    return s[0] * g if s is not None and s and g is not None else None


def _norm_backward(per: int, go_i: int, x_i: int, w_i: int, mask_i: int | None) -> Callable:
    """Backward of a normalisation: twice the forward's operations per element; bytes: the
    tensor inputs plus grad-input (and grad-weight/bias per ``output_mask`` where there is one)."""

    def cost(c: Call) -> Cost:
        n, z = c.numel(x_i), c.itemsize(go_i)
        if n is None:
            return None, None
        flops = float(2 * per * n)
        reads = add(*(c.nbytes(i) for i in range(len(c)) if c.is_tensor(i)))
        if z is None:
            return flops, None
        wn = c.numel(w_i) if c.is_tensor(w_i) else 0
        if mask_i is None:
            writes: int | None = n + 2 * (wn or 0)
        else:
            m = c.flags(mask_i)
            writes = (
                None
                if m is None or len(m) < 3
                else (n * m[0] + (wn or 0) * (int(m[1]) + int(m[2])))
            )
        return flops, add(reads, writes * z if writes is not None else None)

    return cost


#: (kind, op names without ``aten::``, rule): read by ``costmodel/ops.py``.
RULES: list[tuple[str, str, Callable[[Call], Cost]]] = [
    ("norm", "layer_norm native_layer_norm", _norm_forward(5, 2, 3, stats=_layer_norm_rows)),
    ("norm", "native_layer_norm_backward", _norm_backward(5, 0, 1, 5, 7)),
    (
        "norm",
        "batch_norm _batch_norm_impl_index native_batch_norm _native_batch_norm_legit "
        "cudnn_batch_norm miopen_batch_norm",
        _norm_forward(5, 1, 2, 5, stats=_channels),
    ),
    (
        "norm",
        "_native_batch_norm_legit_no_training _batch_norm_no_update",
        _norm_forward(5, 1, 2, -1, stats=_channels),
    ),
    ("norm", "_batch_norm_with_update", _norm_forward(5, 1, 2, stats=_channels)),
    ("norm", "native_batch_norm_backward", _norm_backward(5, 0, 1, 2, 9)),
    (
        "norm",
        "cudnn_batch_norm_backward miopen_batch_norm_backward",
        _norm_backward(5, 1, 0, 2, None),
    ),
    ("norm", "group_norm", _norm_forward(5, 2, 3)),
    ("norm", "native_group_norm", _norm_forward(5, 1, 2, stats=_group_stats)),
    ("norm", "native_group_norm_backward", _norm_backward(5, 0, 1, 4, 9)),
    ("norm", "rms_norm _fused_rms_norm", _norm_forward(3, 2, -1, stats=_layer_norm_rows)),
    ("norm", "_fused_rms_norm_backward", _norm_backward(3, 0, 1, 4, 5)),
]

"""Scaled dot-product attention, forward and backward, as ``torch.utils.flop_counter``
counts it (Q·Kᵀ and P·V; backward five matmuls; no discount for causal masks)."""

from __future__ import annotations

import math
from collections.abc import Callable

from xpuprof.costmodel.call import Call, Cost, add


def _sdpa_dims(q: list[int], k: list[int], v: list[int], bshd: bool) -> tuple[int, ...] | None:
    """(batch·heads of the query, Sq, Sk, Dqk, Dv), or None if the shapes do not fit."""
    if len(q) < 3 or len(k) != len(q) or len(v) != len(q):
        return None
    if bshd:  # (B, S, H, D): the layout of _flash/_efficient_attention_forward
        if len(q) != 4:
            return None
        bh, sq, sk, d, dv = q[0] * q[2], q[1], k[1], q[3], v[3]
        if k[3] != d or v[1] != sk:
            return None
    else:  # (…, S, D), heads among the leading dims (GQA: fewer key/value heads)
        bh, sq, sk, d, dv = math.prod(q[:-2]), q[-2], k[-2], q[-1], v[-1]
        if k[-1] != d or v[-2] != sk:
            return None
    return bh, sq, sk, d, dv


def _attention(
    q_i: int, bshd: bool = False, lse: bool = False, varlen: tuple[int, ...] = ()
) -> Callable[[Call], Cost]:
    """Forward: Q·Kᵀ and P·V, 2·BH·Sq·Sk·(D + Dv); causal masking not discounted. ``varlen``:
    the positions of cumulative sequence lengths, whose presence makes the cost unknown."""

    def cost(c: Call) -> Cost:
        q, k, v = c.shape(q_i), c.shape(q_i + 1), c.shape(q_i + 2)
        if q is None or k is None or v is None:
            return None, None
        if _bshd_varlen(c, varlen):
            return None, None  # variable-length batch: lengths are tensor values, not recorded
        dims = _sdpa_dims(q, k, v, bshd)
        if dims is None:
            return None, None
        bh, sq, sk, d, dv = dims
        flops = 2.0 * bh * sq * d * sk + 2.0 * bh * sq * sk * dv
        z = c.itemsize(q_i)
        reads = add(*(c.nbytes(i) for i in range(len(c)) if c.is_tensor(i)))
        out = bh * sq * dv * z + (bh * sq * 4 if lse else 0) if z is not None else None
        return flops, add(reads, out)

    return cost


def _attention_backward(go_i: int = 0, bshd: bool = False) -> Callable[[Call], Cost]:
    """Backward: scores recomputed, then dV, dP, dQ, dK: 2·BH·Sq·Sk·(3·D + 2·Dv)."""

    def cost(c: Call) -> Cost:
        q, k, v = c.shape(go_i + 1), c.shape(go_i + 2), c.shape(go_i + 3)
        if q is None or k is None or v is None:
            return None, None
        dims = _sdpa_dims(q, k, v, bshd)
        if dims is None:
            return None, None
        bh, sq, sk, d, dv = dims
        flops = 2.0 * bh * sq * sk * (3 * d + 2 * dv)
        reads = add(*(c.nbytes(i) for i in range(len(c)) if c.is_tensor(i)))
        writes = add(c.nbytes(go_i + 1), c.nbytes(go_i + 2), c.nbytes(go_i + 3))
        return flops, add(reads, writes)

    return cost


def _bshd_varlen(c: Call, positions: tuple[int, ...]) -> bool:
    return any(c.is_tensor(i) for i in positions)


def _attention_backward_bshd(go_i: int, cu: tuple[int, int]) -> Callable[[Call], Cost]:
    inner = _attention_backward(go_i, bshd=True)

    def cost(c: Call) -> Cost:
        return (None, None) if _bshd_varlen(c, cu) else inner(c)

    return cost


#: (kind, op names without ``aten::``, rule): read by ``costmodel/ops.py``.
RULES: list[tuple[str, str, Callable[[Call], Cost]]] = [
    (
        "attention",
        "scaled_dot_product_attention _scaled_dot_product_attention_math "
        "_scaled_dot_product_attention_math_for_mps",
        _attention(0),
    ),
    (
        "attention",
        "_scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention "
        "_scaled_dot_product_cudnn_attention _scaled_dot_product_flash_attention_for_cpu "
        "_scaled_dot_product_fused_attention_overrideable",
        _attention(0, lse=True),
    ),
    ("attention", "_flash_attention_forward", _attention(0, True, True, (3, 4))),
    ("attention", "_efficient_attention_forward", _attention(0, True, True, (4, 5))),
    (
        "attention",
        "_scaled_dot_product_flash_attention_backward "
        "_scaled_dot_product_efficient_attention_backward "
        "_scaled_dot_product_cudnn_attention_backward "
        "_scaled_dot_product_flash_attention_for_cpu_backward "
        "_scaled_dot_product_fused_attention_overrideable_backward",
        _attention_backward(0),
    ),
    ("attention", "_flash_attention_backward", _attention_backward_bshd(0, (6, 7))),
    ("attention", "_efficient_attention_backward", _attention_backward_bshd(0, (6, 7))),
]

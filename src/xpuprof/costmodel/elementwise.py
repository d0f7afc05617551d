"""Elementwise ops (estimated): a fixed number of operations per output element, a
transcendental function counting as one; ``_foreach_*`` over tensor lists; dropout."""

from __future__ import annotations

import math
from collections.abc import Callable

from xpuprof.costmodel.call import Call, Cost, add, broadcast

#: Elementwise ops: (operations per output element, number of leading arguments that are
#: inputs). A transcendental function counts as one operation.
_ELEMENTWISE: dict[str, tuple[int, int]] = {}
for _names, _spec in (
    (
        "abs neg sign sgn relu exp exp2 expm1 log log2 log10 log1p sqrt rsqrt reciprocal sin cos "
        "tan asin acos atan sinh cosh tanh asinh acosh atanh sigmoid erf erfc erfinv floor ceil "
        "round trunc frac bitwise_not logical_not isnan isinf isfinite isneginf isposinf "
        "nan_to_num lgamma digamma signbit logit square conj_physical",
        (1, 1),
    ),
    (
        "add sub rsub mul div true_divide floor_divide remainder fmod pow maximum minimum fmax "
        "fmin eq ne lt le gt ge logical_and logical_or logical_xor bitwise_and bitwise_or "
        "bitwise_xor bitwise_left_shift bitwise_right_shift atan2 hypot copysign xlogy "
        "clamp_min clamp_max masked_fill threshold_backward",
        (1, 2),
    ),
    ("threshold", (1, 1)),
    ("where", (1, 3)),
    ("clamp clip", (2, 3)),
    ("hardtanh relu6 leaky_relu silu softshrink hardshrink", (2, 1)),
    ("hardtanh_backward leaky_relu_backward", (2, 2)),
    ("hardsigmoid", (4, 1)),
    ("hardswish elu celu selu softplus", (5, 1)),
    ("sigmoid_backward tanh_backward elu_backward", (3, 2)),
    ("gelu", (5, 1)),
    ("gelu_backward", (10, 2)),
    ("silu_backward hardswish_backward softplus_backward", (6, 2)),
    ("addcmul addcdiv lerp", (3, 3)),
    ("native_dropout_backward", (2, 2)),
):
    for _n in _names.split():
        _ELEMENTWISE[_n] = _spec

_COMPARISONS = frozenset(
    "eq ne lt le gt ge logical_and logical_or logical_xor logical_not isnan isinf isfinite "
    "isneginf isposinf signbit".split()
)


def _is_float(t: str) -> bool:
    return any(k in t for k in ("float", "double", "Half", "BFloat16", "Float", "complex"))


def elementwise_cost(ops: int, n_in: int, base: str, inplace: bool) -> Callable[[Call], Cost]:
    def cost(c: Call) -> Cost:
        idx = [i for i in range(min(n_in, len(c))) if c.is_tensor(i)]
        if not idx or idx[0] != 0 and base not in ("where", "pow"):
            return None, None
        shapes = [c.shape(i) for i in idx]
        if any(s is None for s in shapes):
            return None, None
        out = c.shape(0) if inplace else broadcast(shapes)  # type: ignore[arg-type]
        if out is None:
            return None, None
        n = math.prod(out)
        if base in _COMPARISONS:
            z: int | None = 1
        else:  # result dtype: the widest of the non-0-dim (else all) inputs, floats first
            pool = [i for i in idx if c.shape(i)] or idx
            pool = [i for i in pool if _is_float(c.type(i))] or pool
            sizes = [c.itemsize(i) for i in pool]
            z = None if any(s is None for s in sizes) else max(sizes)  # type: ignore[type-var]
        reads = add(*(c.nbytes(i) for i in idx))
        return float(ops * n), add(reads, n * z if z is not None else None)

    return cost


def foreach_cost(ops: int) -> Callable[[Call], Cost]:
    """``_foreach_*`` over tensor lists: FLOPs from the list's shapes; bytes unknown (no dtype)."""

    def cost(c: Call) -> Cost:
        shapes = c.tensor_list(0)
        if shapes is None:
            return None, None
        return float(ops * sum(math.prod(s) for s in shapes)), None

    return cost


def _native_dropout(c: Call) -> Cost:
    """native_dropout(input, p, train): random draw, compare, scale — 3 per element; output and
    a bool mask written."""
    n, z = c.numel(0), c.itemsize(0)
    if n is None or z is None:
        return None, None
    return 3.0 * n, add(n * z, n * z, n)


#: Ops whose ``_foreach_*`` variants (over tensor lists) are costed like the op itself.
_FOREACH = frozenset(
    "add sub mul div addcmul addcdiv lerp sqrt exp neg abs maximum minimum pow clamp_min "
    "clamp_max sign reciprocal sigmoid log tanh clamp rsqrt copysign".split()
)


def _rules() -> list[tuple[str, str, Callable[[Call], Cost]]]:
    out = []
    names = set(_ELEMENTWISE)
    for name, (ops, n_in) in _ELEMENTWISE.items():
        out.append(("elementwise", name, elementwise_cost(ops, n_in, name, False)))
        if name + "_" not in names:  # an in-place variant, unless it is an op of its own
            out.append(("elementwise", name + "_", elementwise_cost(ops, n_in, name, True)))
        if name in _FOREACH:
            out.append(("elementwise", f"_foreach_{name} _foreach_{name}_", foreach_cost(ops)))
    out.append(("elementwise", "native_dropout", _native_dropout))
    return out


#: (kind, op names without ``aten::``, rule): read by ``costmodel/ops.py``.
RULES = _rules()

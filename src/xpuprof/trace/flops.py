"""FLOPs and bytes of framework ops, derived from the shapes and dtypes the profiler records.

torch.profiler writes no FLOPs into its traces, even with ``with_flops=True``; what it does write,
with ``record_shapes=True``, is every op's ``Input Dims`` (one shape per argument, ``[]`` for a
scalar, a list of shapes for a tensor list), ``Input type`` (the tensor's dtype as c10 spells
it — ``float``, ``c10::BFloat16``, ``long int`` — or ``Scalar``, ``ScalarList``, ``TensorList``,
``""`` for None) and ``Concrete Inputs`` (the value of each scalar argument as text: ``"[1, 1]"``,
``"False"``, ``"1.0000000000000001e-05"``). That is enough to cost most ops.

**Two classes of number.**

* *Exact* kinds — ``matmul``, ``conv``, ``attention`` — follow the conventions of
  ``torch.utils.flop_counter`` (``FlopCounterMode``), so that our totals and its totals can be
  compared: a multiply-add is 2 FLOPs (mm: 2·M·K·N), the bias of addmm/baddbmm/convolution is not
  counted, convolution is 2·N·(output positions)·(kernel positions)·C_out·C_in/groups (for a
  transposed convolution the *input* positions), a convolution backward is the sum of its
  grad-input and grad-weight convolutions as selected by ``output_mask`` (grad-weight counted
  with the full input channel count, as flop_counter does, even with groups), attention is the
  two batched matmuls Q·Kᵀ and P·V (backward: five, the scores being recomputed), with no
  discount for causal masks. Ops that ``FlopCounterMode`` does not register but that are plainly
  the same computation (``linear``, ``matmul``, ``mv``, ``dot``, ``addmv``, the CPU
  ``_scaled_dot_product_flash_attention_for_cpu``) use the same convention.
* *Estimated* kinds — ``elementwise``, ``reduction``, ``softmax``, ``norm``, ``embedding``,
  ``loss`` — are ops ``FlopCounterMode`` ignores (counts 0 for). They get a simple, documented
  model, good to a small factor, meant for roofline placement, not for MFU: an elementwise op
  costs a fixed number of operations per output element, a transcendental function (exp, erf,
  tanh, sigmoid) counting as one (``_ELEMENTWISE`` lists them: add 1, addcmul 3, gelu 5, …); a
  reduction one (sum, max, mean) to three (var, std) per input element; softmax 5 and its
  backward 4 per element; layer/group/batch norm 5 per element for statistics and normalisation
  plus 1 each for the weight and the bias (batch norm in eval mode 2), RMS norm 3 (+1); a
  normalisation backward twice its forward; embedding/gather 0 FLOPs.
* ``memory`` and ``view`` kinds cost 0 FLOPs exactly; views and allocations also move 0 bytes.

``op_kind(name)`` tells which; ``EXACT_KINDS`` are the comparable ones.

**Bytes** are the op's compulsory traffic seen as a black box: the tensor inputs it reads plus the
outputs it writes (shape and dtype inferred per op; an in-place op writes its first argument),
each tensor counted once. Intermediates, caches and the auxiliary outputs of fused kernels are
not counted; a tensor list's bytes are unknown (the trace gives its shapes, not its dtype).

**Unknown is None, never a guess.** An op we have no model for, a shape that does not fit the
op's signature, or a value the formula needs that the trace lacks (older traces record no
``Concrete Inputs``, so the stride of a convolution or the ``output_mask`` of a backward is not
known) gives ``None`` (``NaN`` in ``derive``'s arrays). Composite ops whose work depends on
run-time state and always shows up in their child ops (``aten::to``, ``contiguous``, ``reshape``,
``dropout``, ``zeros``, ``cross_entropy_loss``, ``einsum``, autograd nodes such as
``AddmmBackward0``) are deliberately unknown: their children carry the cost.

**Summing over the op tree.** Ops nest (``aten::linear`` → ``aten::addmm`` → ``aten::copy_``;
``AddmmBackward0`` → ``aten::mm``). Like ``dur``, the values are *inclusive*: every op whose cost
is known carries the cost of everything it does, children included, so ``linear`` and its
``addmm`` both carry 2·M·K·N. To total a trace (or a step, a layer), sum each column over the
*outermost* ops that have a value in it — ops with no ancestor (``parent`` chain on the same
track) holding a value in that column; ``outermost()`` computes that mask. Ops with no value
(autograd nodes, composites, unknown ops) are looked through, so their children count. The two
columns are masked independently (``aten::_foreach_add_`` has FLOPs but, its dtype unknown, no
bytes: its per-tensor ``add_`` children then supply the bytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Cost = tuple[float | None, float | None]

#: Item size of the dtype names the profiler writes in ``Input type`` (c10's type names, as
#: ``caffe2::TypeMeta::name()`` gives them on Linux/GCC; a few other spellings seen in traces).
ITEMSIZE: dict[str, int] = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2,
    "long int": 8, "long": 8, "long long": 8, "__int64": 8, "int64_t": 8,
    "int": 4, "short int": 2, "short": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "short unsigned int": 2, "unsigned short": 2, "unsigned int": 4,
    "long unsigned int": 8, "unsigned long": 8,
    "c10::complex<c10::Half>": 4, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1, "c10::Float4_e2m1fn_x2": 1,
    "c10::qint8": 1, "c10::quint8": 1, "c10::qint32": 4, "c10::quint4x2": 1, "c10::quint2x4": 1,
    "c10::bits1x8": 1, "c10::bits2x4": 1, "c10::bits4x2": 1, "c10::bits8": 1, "c10::bits16": 2,
}  # fmt: skip

#: Item size by ``c10::ScalarType`` code, as a ``dtype`` argument appears in ``Concrete Inputs``
#: (``aten::to(x, 6)`` is float32), from c10/core/ScalarType.h's enumeration order.
SCALAR_TYPE_ITEMSIZE: dict[int, int] = {
    0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 8: 4, 9: 8, 10: 16, 11: 1, 12: 1, 13: 1,
    14: 4, 15: 2, 16: 1, 17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 2, 23: 1, 24: 1, 25: 1, 26: 1,
    27: 2, 28: 4, 29: 8, 44: 1, 45: 1,
}  # fmt: skip

#: ``Input type`` values that are not tensors (current and 2021 spellings).
_NOT_TENSOR = frozenset(
    {"", "Scalar", "ScalarList", "GenericList", "TensorList", "Int", "Bool", "Double", "String",
     "Device", "Layout", "ScalarType", "MemoryFormat", "None", "c10::string_view", "str"}
)  # fmt: skip

#: The kinds whose FLOPs follow ``torch.utils.flop_counter`` and are compared against it.
EXACT_KINDS = frozenset({"matmul", "conv", "attention"})


class _Call:
    """One op call's inputs, with typed accessors that answer None instead of raising."""

    __slots__ = ("dims", "types", "concrete")

    def __init__(self, dims: Any, types: Any, concrete: Any) -> None:
        self.dims: list[Any] = dims if isinstance(dims, list) else []
        self.types: list[Any] = types if isinstance(types, list) else []
        self.concrete: list[Any] | None = concrete if isinstance(concrete, list) else None

    def __len__(self) -> int:
        return len(self.dims)

    def type(self, i: int) -> str:
        t = self.types[i] if i < len(self.types) else ""
        return t if isinstance(t, str) else ""

    def is_tensor(self, i: int) -> bool:
        if i < 0 or i >= len(self.dims):
            return False
        t = self.type(i)
        if t in ITEMSIZE:
            return True
        d = self.dims[i]
        # a dtype we do not know the size of: still a tensor if it has a shape
        return t not in _NOT_TENSOR and isinstance(d, list) and all(isinstance(x, int) for x in d)

    def shape(self, i: int) -> list[int] | None:
        """Shape of tensor argument ``i`` (``[]`` for a 0-dim tensor), None if not a tensor."""
        if not self.is_tensor(i):
            return None
        d = self.dims[i]
        return d if isinstance(d, list) and all(isinstance(x, int) for x in d) else None

    def itemsize(self, i: int) -> int | None:
        return ITEMSIZE.get(self.type(i)) if self.is_tensor(i) else None

    def numel(self, i: int) -> int | None:
        s = self.shape(i)
        return math.prod(s) if s is not None else None

    def nbytes(self, i: int) -> int | None:
        n, z = self.numel(i), self.itemsize(i)
        return n * z if n is not None and z is not None else None

    def tensor_list(self, i: int) -> list[list[int]] | None:
        """Shapes of a ``TensorList`` argument (the profiler nests them), None otherwise."""
        if i < 0 or i >= len(self.dims) or self.type(i) not in ("TensorList", "GenericList"):
            return None
        d = self.dims[i]
        if not isinstance(d, list) or not all(
            isinstance(s, list) and all(isinstance(x, int) for x in s) for s in d
        ):
            return None
        return d if d else None  # an empty list here means "not recorded" (2021 traces)

    def text(self, i: int) -> str | None:
        """The recorded value of scalar argument ``i``; None when absent or not recorded."""
        c = self.concrete
        if c is None or i < 0 or i >= len(c) or not isinstance(c[i], str) or c[i] == "":
            return None
        return c[i]

    def ints(self, i: int) -> list[int] | None:
        """An int-list argument (``"[1, 1]"``), or a single int as a one-element list."""
        t = self.text(i)
        if t is None:
            return None
        t = t.strip()
        try:
            if t.startswith("["):
                body = t[1:-1].strip()
                return [int(x) for x in body.split(",")] if body else []
            return [int(t)]
        except ValueError:
            return None

    def int(self, i: int) -> int | None:
        t = self.text(i)
        if t is None or t.startswith("["):
            return None
        try:
            return int(t)
        except ValueError:
            return None

    def flag(self, i: int) -> bool | None:
        t = self.text(i)
        return {"True": True, "False": False, "1": True, "0": False}.get(t) if t else None

    def flags(self, i: int) -> list[bool] | None:
        t = self.text(i)
        if t is None or not t.startswith("["):
            return None
        out = [{"True": True, "False": False}.get(x.strip()) for x in t[1:-1].split(",")]
        return None if any(x is None for x in out) else out  # type: ignore[return-value]


def _add(*terms: float | int | None) -> float | None:
    """Sum of byte terms; unknown if any term is unknown."""
    if any(t is None for t in terms):
        return None
    return float(sum(terms))  # type: ignore[arg-type]


def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        for k, d in enumerate(s):
            j = nd - len(s) + k
            if out[j] == 1:
                out[j] = d
            elif d not in (1, out[j]):
                return None
    return out


def _dtype_size(c: _Call, i: int) -> int | None:
    """Item size of a ``dtype`` argument given as a ScalarType code."""
    v = c.int(i)
    return SCALAR_TYPE_ITEMSIZE.get(v) if v is not None else None


# ----------------------------------------------------------------------------------------------
# matmul family (flop_counter: mm_flop, addmm_flop, bmm_flop, baddbmm_flop, _scaled_mm_flop)
# ----------------------------------------------------------------------------------------------


def _mm(a: int, b: int, bias: int | None = None) -> Callable[[_Call], Cost]:
    """(M,K)·(K,N) [+ bias]: 2·M·K·N FLOPs, the bias add not counted (flop_counter's addmm)."""

    def cost(c: _Call) -> Cost:
        x, y = c.shape(a), c.shape(b)
        if x is None or y is None or len(x) != 2 or len(y) != 2 or x[1] != y[0]:
            return None, None
        m, k, n = x[0], x[1], y[1]
        z = c.itemsize(a)
        out = m * n * z if z is not None else None
        extra = c.nbytes(bias) if bias is not None and c.is_tensor(bias) else 0
        return 2.0 * m * k * n, _add(c.nbytes(a), c.nbytes(b), extra, out)

    return cost


def _bmm(
    a: int, b: int, bias: int | None = None, reduce_batch: bool = False
) -> Callable[..., Cost]:
    """(B,M,K)·(B,K,N): 2·B·M·K·N (flop_counter's bmm/baddbmm); addbmm sums over B."""

    def cost(c: _Call) -> Cost:
        x, y = c.shape(a), c.shape(b)
        if x is None or y is None or len(x) != 3 or len(y) != 3 or x[0] != y[0] or x[2] != y[1]:
            return None, None
        bb, m, k, n = x[0], x[1], x[2], y[2]
        z = c.itemsize(a)
        out = (m * n if reduce_batch else bb * m * n) * z if z is not None else None
        extra = c.nbytes(bias) if bias is not None and c.is_tensor(bias) else 0
        return 2.0 * bb * m * k * n, _add(c.nbytes(a), c.nbytes(b), extra, out)

    return cost


def _matmul(c: _Call) -> Cost:
    """torch.matmul with its 1-D and broadcast-batch cases; 2 FLOPs per multiply-add."""
    x, y = c.shape(0), c.shape(1)
    if x is None or y is None or not x or not y:
        return None, None
    xm = x if len(x) > 1 else [1] + x
    ym = y if len(y) > 1 else y + [1]
    if xm[-1] != ym[-2]:
        return None, None
    batch = _broadcast([xm[:-2], ym[:-2]])
    if batch is None:
        return None, None
    m, k, n = xm[-2], xm[-1], ym[-1]
    nb = math.prod(batch)
    z = c.itemsize(0)
    out_numel = nb * (m if len(x) > 1 else 1) * (n if len(y) > 1 else 1)
    out = out_numel * z if z is not None else None
    return 2.0 * nb * m * k * n, _add(c.nbytes(0), c.nbytes(1), out)


def _linear(c: _Call) -> Cost:
    """x(…,K)·W(N,K)ᵀ + b: 2·rows·K·N, as its addmm/mm children count it."""
    x, w = c.shape(0), c.shape(1)
    if x is None or w is None or not x or len(w) != 2 or x[-1] != w[1]:
        return None, None
    rows, k, n = math.prod(x[:-1]), x[-1], w[0]
    z = c.itemsize(0)
    out = rows * n * z if z is not None else None
    bias = c.nbytes(2) if c.is_tensor(2) else 0
    return 2.0 * rows * k * n, _add(c.nbytes(0), c.nbytes(1), bias, out)


def _mv(a: int, b: int, bias: int | None = None) -> Callable[[_Call], Cost]:
    def cost(c: _Call) -> Cost:
        x, y = c.shape(a), c.shape(b)
        if x is None or y is None or len(x) != 2 or len(y) != 1 or x[1] != y[0]:
            return None, None
        z = c.itemsize(a)
        extra = c.nbytes(bias) if bias is not None and c.is_tensor(bias) else 0
        out = x[0] * z if z is not None else None
        return 2.0 * x[0] * x[1], _add(c.nbytes(a), c.nbytes(b), extra, out)

    return cost


def _dot(c: _Call) -> Cost:
    x, y = c.shape(0), c.shape(1)
    if x is None or y is None or len(x) != 1 or x != y:
        return None, None
    return 2.0 * x[0], _add(c.nbytes(0), c.nbytes(1), c.itemsize(0))


def _scaled_mm(c: _Call) -> Cost:
    """FP8 GEMM: 2·M·K·N (flop_counter's _scaled_mm); output in ``out_dtype`` when given."""
    f, _ = _mm(0, 1)(c)
    x, y = c.shape(0), c.shape(1)
    if f is None or x is None or y is None:
        return None, None
    if c.concrete is None:
        z = None  # out_dtype not recorded: the output size is not known
    elif c.text(6) is not None:
        z = _dtype_size(c, 6)
    else:
        z = c.itemsize(0)  # out_dtype None: the inputs' dtype
    reads = _add(*(c.nbytes(i) if c.is_tensor(i) else 0 for i in range(min(len(c), 6))))
    return f, _add(reads, x[0] * y[1] * z if z is not None else None)


# ----------------------------------------------------------------------------------------------
# convolution (flop_counter: conv_flop_count, conv_flop, conv_backward_flop)
# ----------------------------------------------------------------------------------------------


class ConvArgs(NamedTuple):
    """Where a convolution op keeps its arguments (positions in its schema; -1: absent).

    ``transposed`` is a position, or -2 for "always transposed", -1 for "never"."""

    stride: int
    padding: int
    dilation: int = -1
    transposed: int = -1
    output_padding: int = -1
    groups: int = -1


#: Forward convolution ops, with their schemas' argument positions (checked against torch's
#: registered schemas by the tests).
CONV_FORWARD: dict[str, ConvArgs] = {
    "conv1d": ConvArgs(3, 4, 5, -1, -1, 6),
    "conv2d": ConvArgs(3, 4, 5, -1, -1, 6),
    "conv3d": ConvArgs(3, 4, 5, -1, -1, 6),
    "conv_transpose1d": ConvArgs(3, 4, 7, -2, 5, 6),
    "conv_transpose2d": ConvArgs(3, 4, 7, -2, 5, 6),
    "conv_transpose3d": ConvArgs(3, 4, 7, -2, 5, 6),
    "convolution": ConvArgs(3, 4, 5, 6, 7, 8),
    "_convolution": ConvArgs(3, 4, 5, 6, 7, 8),
    "convolution_overrideable": ConvArgs(3, 4, 5, 6, 7, 8),
    "cudnn_convolution": ConvArgs(3, 2, 4, -1, -1, 5),
    "cudnn_convolution_transpose": ConvArgs(4, 2, 5, -2, 3, 6),
    "cudnn_convolution_relu": ConvArgs(3, 4, 5, -1, -1, 6),
    "mkldnn_convolution": ConvArgs(4, 3, 5, -1, -1, 6),
    "miopen_convolution": ConvArgs(4, 3, 5, -1, -1, 6),
    "miopen_depthwise_convolution": ConvArgs(4, 3, 5, -1, -1, 6),
    "miopen_convolution_transpose": ConvArgs(5, 3, 6, -2, 4, 7),
    "_slow_conv2d_forward": ConvArgs(4, 5),
    "thnn_conv2d": ConvArgs(4, 5),
    "slow_conv3d": ConvArgs(4, 5),
    "slow_conv3d_forward": ConvArgs(4, 5),
    "slow_conv_dilated2d": ConvArgs(4, 5, 6),
    "slow_conv_dilated3d": ConvArgs(4, 5, 6),
    "_conv_depthwise2d": ConvArgs(4, 5, 6),
    "conv_depthwise3d": ConvArgs(4, 5, 6),
    "slow_conv_transpose2d": ConvArgs(4, 5, 7, -2, 6),
    "slow_conv_transpose3d": ConvArgs(4, 5, 7, -2, 6),
    "_nnpack_spatial_convolution": ConvArgs(4, 3),
    "_mps_convolution": ConvArgs(4, 3, 5, -1, -1, 6),
    "_mps_convolution_transpose": ConvArgs(4, 2, 5, -2, 3, 6),
}


def _expand(v: list[int] | None, n: int, default: int) -> list[int] | None:
    if v is None:
        return None
    if not v:
        return [default] * n
    if len(v) == 1:
        return v * n
    return v if len(v) == n else None


def conv_flops(x: list[int], w: list[int], out: list[int], transposed: bool) -> float:
    """flop_counter's convolution count: 2 · batch · (positions) · (kernel) · w₀ · w₁, where the
    positions are the output's (the input's when transposed); the bias is not counted."""
    conv_shape = (x if transposed else out)[2:]
    return 2.0 * x[0] * math.prod(conv_shape) * math.prod(w[2:]) * w[0] * w[1]


def _conv_forward(spec: ConvArgs) -> Callable[[_Call], Cost]:
    def cost(c: _Call) -> Cost:
        x, w = c.shape(0), c.shape(1)
        if x is None or w is None or len(w) < 3:
            return None, None
        nsp = len(w) - 2
        if len(x) == nsp + 1:  # unbatched input
            x = [1] + x
        if len(x) != nsp + 2:
            return None, None
        if spec.transposed >= 0:
            transposed = c.flag(spec.transposed)
            if transposed is None:
                return None, None
        else:
            transposed = spec.transposed == -2
        stride = _expand(c.ints(spec.stride), nsp, 1)
        padding = _expand(c.ints(spec.padding), nsp, 0)
        dilation = _expand(c.ints(spec.dilation), nsp, 1) if spec.dilation >= 0 else [1] * nsp
        if spec.output_padding >= 0:
            out_pad = _expand(c.ints(spec.output_padding), nsp, 0)
        else:
            out_pad = [0] * nsp
        groups = c.int(spec.groups) if spec.groups >= 0 else 1
        known = stride is not None and padding is not None and dilation is not None
        out_sp: list[int] | None = None
        if known and (out_pad is not None or not transposed):
            assert stride is not None and padding is not None and dilation is not None
            if transposed:
                assert out_pad is not None
                out_sp = [
                    (i - 1) * s - 2 * p + d * (k - 1) + op + 1
                    for i, k, s, p, d, op in zip(
                        x[2:], w[2:], stride, padding, dilation, out_pad, strict=True
                    )
                ]
            else:
                out_sp = [
                    (i + 2 * p - d * (k - 1) - 1) // s + 1
                    for i, k, s, p, d in zip(x[2:], w[2:], stride, padding, dilation, strict=True)
                ]
            if any(o <= 0 for o in out_sp):
                return None, None
        if transposed:
            flops: float | None = conv_flops(x, w, [], True)
            c_out = w[1] * groups if groups is not None else None
        else:
            flops = conv_flops(x, w, [x[0], w[0], *out_sp], False) if out_sp else None
            c_out = w[0]
        z = c.itemsize(0)
        out = (
            x[0] * c_out * math.prod(out_sp) * z
            if out_sp is not None and c_out is not None and z is not None
            else None
        )
        bias = 0
        for i in range(2, min(len(c), 4)):  # a bias tensor, where the op takes one
            if c.is_tensor(i) and len(c.shape(i) or []) == 1:
                bias = c.nbytes(i)  # type: ignore[assignment]
        return flops, _add(c.nbytes(0), c.nbytes(1), bias, out)

    return cost


def _conv_bwd_flops(
    go: list[int], x: list[int], w: list[int], transposed: bool, mask: list[bool]
) -> float:
    """flop_counter's conv_backward_flop: grad-input as the transposed convolution of the output
    gradient, grad-weight as a convolution of input and output gradient (channel axes swapped)."""

    def t(s: list[int]) -> list[int]:
        return [s[1], s[0], *s[2:]]

    total = 0.0
    if mask[0]:
        total += conv_flops(go, w, x, not transposed)
    if mask[1]:
        if transposed:
            total += conv_flops(t(go), t(x), t(w), False)
        else:
            total += conv_flops(t(x), t(go), t(w), False)
    return total


def _conv_backward(go_i: int, x_i: int, w_i: int, transposed_i: int, mask_i: int) -> Callable:
    """convolution_backward(grad_output, input, weight, …, transposed, …, output_mask) and its
    backend variants; ``transposed_i`` -1: never transposed."""

    def cost(c: _Call) -> Cost:
        go, x, w = c.shape(go_i), c.shape(x_i), c.shape(w_i)
        if go is None or x is None or w is None or len(w) < 3:
            return None, None
        if not (len(go) == len(x) == len(w)):
            return None, None
        transposed = c.flag(transposed_i) if transposed_i >= 0 else False
        mask = c.flags(mask_i)
        if transposed is None or mask is None or len(mask) < 2:
            return None, None
        flops = _conv_bwd_flops(go, x, w, transposed, mask)
        z = c.itemsize(go_i)
        if z is None:
            return flops, None
        writes = (math.prod(x) if mask[0] else 0) + (math.prod(w) if mask[1] else 0)
        if len(mask) > 2 and mask[2]:
            writes += go[1]
        return flops, _add(c.nbytes(go_i), c.nbytes(x_i), c.nbytes(w_i), writes * z)

    return cost


def _cudnn_bwd_input(c: _Call) -> Cost:
    """cudnn_convolution_backward_input(self_size, grad_output, weight, …) (2021 traces)."""
    go, w = c.shape(1), c.shape(2)
    if go is None or w is None or len(go) != len(w) or len(w) < 3:
        return None, None
    flops = conv_flops(go, w, [], True)
    size = c.ints(0)
    z = c.itemsize(1)
    out = math.prod(size) * z if size is not None and z is not None else None
    return flops, _add(c.nbytes(1), c.nbytes(2), out)


def _cudnn_bwd_weight(c: _Call) -> Cost:
    """cudnn_convolution_backward_weight(weight_size, grad_output, self, …) (2021 traces)."""
    go, x, wsize = c.shape(1), c.shape(2), c.ints(0)
    if go is None or x is None or wsize is None or not (len(go) == len(x) == len(wsize)):
        return None, None
    flops = _conv_bwd_flops(go, x, wsize, False, [False, True])
    z = c.itemsize(1)
    out = math.prod(wsize) * z if z is not None else None
    return flops, _add(c.nbytes(1), c.nbytes(2), out)


# ----------------------------------------------------------------------------------------------
# attention (flop_counter: sdpa_flop_count, sdpa_backward_flop_count)
# ----------------------------------------------------------------------------------------------


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
) -> Callable[[_Call], Cost]:
    """Forward: Q·Kᵀ and P·V, 2·BH·Sq·Sk·(D + Dv); causal masking not discounted. ``varlen``:
    the positions of cumulative sequence lengths, whose presence makes the cost unknown."""

    def cost(c: _Call) -> Cost:
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
        reads = _add(*(c.nbytes(i) for i in range(len(c)) if c.is_tensor(i)))
        out = bh * sq * dv * z + (bh * sq * 4 if lse else 0) if z is not None else None
        return flops, _add(reads, out)

    return cost


def _attention_backward(go_i: int = 0, bshd: bool = False) -> Callable[[_Call], Cost]:
    """Backward: scores recomputed, then dV, dP, dQ, dK: 2·BH·Sq·Sk·(3·D + 2·Dv)."""

    def cost(c: _Call) -> Cost:
        q, k, v = c.shape(go_i + 1), c.shape(go_i + 2), c.shape(go_i + 3)
        if q is None or k is None or v is None:
            return None, None
        dims = _sdpa_dims(q, k, v, bshd)
        if dims is None:
            return None, None
        bh, sq, sk, d, dv = dims
        flops = 2.0 * bh * sq * sk * (3 * d + 2 * dv)
        reads = _add(*(c.nbytes(i) for i in range(len(c)) if c.is_tensor(i)))
        writes = _add(c.nbytes(go_i + 1), c.nbytes(go_i + 2), c.nbytes(go_i + 3))
        return flops, _add(reads, writes)

    return cost


def _bshd_varlen(c: _Call, positions: tuple[int, ...]) -> bool:
    return any(c.is_tensor(i) for i in positions)


def _attention_backward_bshd(go_i: int, cu: tuple[int, int]) -> Callable[[_Call], Cost]:
    inner = _attention_backward(go_i, bshd=True)

    def cost(c: _Call) -> Cost:
        return (None, None) if _bshd_varlen(c, cu) else inner(c)

    return cost


# ----------------------------------------------------------------------------------------------
# elementwise, reductions, softmax, norms, embeddings, losses (estimated)
# ----------------------------------------------------------------------------------------------

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


def _elementwise(ops: int, n_in: int, base: str, inplace: bool) -> Callable[[_Call], Cost]:
    def cost(c: _Call) -> Cost:
        idx = [i for i in range(min(n_in, len(c))) if c.is_tensor(i)]
        if not idx or idx[0] != 0 and base not in ("where", "pow"):
            return None, None
        shapes = [c.shape(i) for i in idx]
        if any(s is None for s in shapes):
            return None, None
        out = c.shape(0) if inplace else _broadcast(shapes)  # type: ignore[arg-type]
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
        reads = _add(*(c.nbytes(i) for i in idx))
        return float(ops * n), _add(reads, n * z if z is not None else None)

    return cost


def _foreach(ops: int) -> Callable[[_Call], Cost]:
    """``_foreach_*`` over tensor lists: FLOPs from the list's shapes; bytes unknown (no dtype)."""

    def cost(c: _Call) -> Cost:
        shapes = c.tensor_list(0)
        if shapes is None:
            return None, None
        return float(ops * sum(math.prod(s) for s in shapes)), None

    return cost


def _copy(src: int, dst_from: int | None = None, dtype_arg: int | None = None) -> Callable:
    """Data movement, 0 FLOPs: ``src`` read, an output of its shape written (``dst_from``'s dtype,
    or a ``dtype`` argument's, else the source's)."""

    def cost(c: _Call) -> Cost:
        n, zs = c.numel(src), c.itemsize(src)
        if n is None:
            return None, None
        if dst_from is not None:
            zd = c.itemsize(dst_from)
        elif dtype_arg is not None and c.text(dtype_arg) is not None:
            zd = _dtype_size(c, dtype_arg)
        elif dtype_arg is not None and c.type(dtype_arg) != "":
            zd = None  # a dtype was given but its value not recorded (older traces)
        else:
            zd = zs  # no dtype argument: the source's
        return 0.0, _add(n * zs if zs is not None else None, n * zd if zd is not None else None)

    return cost


def _fill(c: _Call) -> Cost:
    """fill_/zero_: 0 FLOPs, the tensor written."""
    return 0.0, _add(c.nbytes(0))


def _item(c: _Call) -> Cost:
    return 0.0, _add(c.itemsize(0))


def _cat(c: _Call) -> Cost:
    """cat: 0 FLOPs; bytes unknown (a tensor list's dtype is not recorded)."""
    return 0.0, None


def _zero_cost(c: _Call) -> Cost:
    return 0.0, 0.0


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


def _reduction(name: str) -> Callable[[_Call], Cost]:
    ops, dim_i, full_upto, out_z, second = _REDUCTIONS[name]

    def cost(c: _Call) -> Cost:
        s, z = c.shape(0), c.itemsize(0)
        if s is None:
            return None, None
        if name in ("max", "min") and c.is_tensor(1):  # max.other: elementwise
            return _elementwise(1, 2, "maximum", False)(c)
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
        return flops, _add(n * z, writes)

    return cost


def _softmax(ops: int, n_in: int, dtype_arg: int | None, half_to_float: int | None) -> Callable:
    """Softmax and its backward: ``ops`` per element; output in the ``dtype`` argument's type
    (or float32 with ``half_to_float``), else the input's."""

    def cost(c: _Call) -> Cost:
        n, z = c.numel(0), c.itemsize(0)
        if n is None:
            return None, None
        zo = z
        if dtype_arg is not None and c.text(dtype_arg) is not None:
            zo = _dtype_size(c, dtype_arg)
        elif dtype_arg is not None and c.type(dtype_arg) != "":
            zo = None  # a dtype was given but its value not recorded (older traces)
        if half_to_float is not None:
            up = c.flag(half_to_float)
            if up:
                zo = 4
            elif up is None and z is not None and z < 4:
                zo = None  # a half input whose output may be float
        reads = _add(*(c.nbytes(i) for i in range(n_in) if c.is_tensor(i)))
        return float(ops * n), _add(reads, n * zo if zo is not None else None)

    return cost


def _affine_terms(c: _Call, w_i: int, b_i: int) -> int:
    return int(c.is_tensor(w_i)) + int(c.is_tensor(b_i))


def _norm_forward(
    per: int, w_i: int, b_i: int, training_i: int | None = None, eval_per: int = 2,
    stats: Callable[[_Call], int | None] | None = None,
) -> Callable[[_Call], Cost]:  # fmt: skip
    """Normalisations: ``per`` operations per element (statistics and normalisation; ``eval_per``
    in eval mode where a ``training`` flag says so), +1 each for the weight and the bias.
    Bytes: the tensor inputs, the output and the saved statistics (``stats`` elements, fp32)."""

    def cost(c: _Call) -> Cost:
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
        reads = _add(*(c.nbytes(i) for i in range(len(c)) if c.is_tensor(i)))
        st = stats(c) if stats is not None else 0
        out = n * z + 2 * 4 * st if z is not None and st is not None else None
        return flops, _add(reads, out)

    return cost


def _layer_norm_rows(c: _Call) -> int | None:
    s, ns = c.shape(0), c.ints(1)
    if s is None:
        return None
    if ns is None:
        w = c.shape(2)
        ns = w if w is not None else None
    if ns is None or len(ns) > len(s):
        return None
    return math.prod(s[: len(s) - len(ns)])


def _channels(c: _Call) -> int | None:
    s = c.shape(0)
    return s[1] if s is not None and len(s) > 1 else None


def _group_stats(c: _Call) -> int | None:
    s, g = c.shape(0), c.int(6)
    return s[0] * g if s is not None and s and g is not None else None


def _norm_backward(per: int, go_i: int, x_i: int, w_i: int, mask_i: int | None) -> Callable:
    """Backward of a normalisation: twice the forward's operations per element; bytes: the
    tensor inputs plus grad-input (and grad-weight/bias per ``output_mask`` where there is one)."""

    def cost(c: _Call) -> Cost:
        n, z = c.numel(x_i), c.itemsize(go_i)
        if n is None:
            return None, None
        flops = float(2 * per * n)
        reads = _add(*(c.nbytes(i) for i in range(len(c)) if c.is_tensor(i)))
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
        return flops, _add(reads, writes * z if writes is not None else None)

    return cost


def _embedding(c: _Call) -> Cost:
    """embedding(weight, indices): 0 FLOPs; indices read, one row gathered and written per index."""
    w, idx, z = c.shape(0), c.numel(1), c.itemsize(0)
    if w is None or idx is None or len(w) != 2:
        return None, None
    rows = idx * w[1] * z if z is not None else None
    return 0.0, _add(c.nbytes(1), rows, rows)


def _embedding_bag(c: _Call) -> Cost:
    """embedding_bag(weight, indices, offsets, …): one add per gathered element."""
    w, idx, off, z = c.shape(0), c.numel(1), c.numel(2), c.itemsize(0)
    if w is None or idx is None or off is None or len(w) != 2:
        return None, None
    gathered = idx * w[1]
    out = off * w[1] * z if z is not None else None
    return float(gathered), _add(c.nbytes(1), c.nbytes(2), gathered * z if z else None, out)


def _embedding_dense_backward(c: _Call) -> Cost:
    """embedding_dense_backward(grad, indices, num_weights, …): a scatter-add of every grad
    element into a zeroed (num_weights, D) table."""
    g, z, nw = c.shape(0), c.itemsize(0), c.int(2)
    if g is None or not g:
        return None, None
    n = math.prod(g)
    table = nw * g[-1] * z if nw is not None and z is not None else None
    return float(n), _add(c.nbytes(0), c.nbytes(1), table)


def _index_select(c: _Call) -> Cost:
    """index_select(self, dim, index): 0 FLOPs; index read, the selected slices read and written."""
    s, d, k, z = c.shape(0), c.int(1), c.numel(2), c.itemsize(0)
    if s is None or d is None or k is None or not s:
        return None, None
    d %= len(s)
    sel = math.prod(s) // max(s[d], 1) * k
    return 0.0, _add(c.nbytes(2), sel * z if z else None, sel * z if z else None)


def _gather(c: _Call) -> Cost:
    """gather(self, dim, index): one element read and written per index."""
    k, z = c.numel(2), c.itemsize(0)
    if k is None:
        return None, None
    return 0.0, _add(c.nbytes(2), k * z if z else None, k * z if z else None)


def _nll_loss_forward(c: _Call) -> Cost:
    """nll_loss_forward(self, target, weight, reduction, ignore_index): one pick-and-add per
    target; the picked inputs, the target and the output (per target, or a scalar) moved."""
    t, z = c.numel(1), c.itemsize(0)
    red = c.int(3)
    if t is None or z is None:
        return None, None
    out = (t if red == 0 else 2) * z if red is not None else None
    return float(t), _add(c.nbytes(1), t * z, c.nbytes(2) if c.is_tensor(2) else 0, out)


def _nll_loss_backward(c: _Call) -> Cost:
    """nll_loss_backward(grad_output, self, target, …): grad-input zeroed then one write per
    target."""
    n, t, z = c.numel(1), c.numel(2), c.itemsize(1)
    if n is None or t is None or z is None:
        return None, None
    return float(t), _add(c.nbytes(0), c.nbytes(2), n * z)


def _mse(bwd: bool) -> Callable[[_Call], Cost]:
    """mse_loss(self, target, reduction): sub, square, accumulate — 3 per element."""

    def cost(c: _Call) -> Cost:
        x_i = 1 if bwd else 0
        n, z = c.numel(x_i), c.itemsize(x_i)
        if n is None or z is None:
            return None, None
        reads = _add(*(c.nbytes(i) for i in range(3) if c.is_tensor(i)))
        if bwd:
            return 3.0 * n, _add(reads, n * z)
        red = c.int(2)
        out = (n if red == 0 else 1) * z if red is not None else None
        return 3.0 * n, _add(reads, out)

    return cost


def _native_dropout(c: _Call) -> Cost:
    """native_dropout(input, p, train): random draw, compare, scale — 3 per element; output and
    a bool mask written."""
    n, z = c.numel(0), c.itemsize(0)
    if n is None or z is None:
        return None, None
    return 3.0 * n, _add(n * z, n * z, n)


# ----------------------------------------------------------------------------------------------
# the table
# ----------------------------------------------------------------------------------------------

_VIEWS = (
    "view _unsafe_view _reshape_alias as_strided as_strided_ t transpose transpose_ permute "
    "expand expand_as squeeze squeeze_ unsqueeze unsqueeze_ select slice narrow split "
    "split_with_sizes unsafe_split tensor_split chunk unsafe_chunk unbind alias detach detach_ "
    "view_as unflatten diagonal unfold movedim swapaxes lift_fresh _nested_view_from_buffer "
    "real imag numpy_T mT T _conj _neg_view view_as_real view_as_complex"
)
_ALLOCATIONS = (
    "empty empty_strided empty_like new_empty new_empty_strided resize_ resize_as_ set_ "
    "record_stream is_pinned _nnpack_available result_type size stride numel dim is_contiguous"
)

_Rule = Callable[[_Call], Cost]
#: name (without ``aten::``) → (kind, rule, whether the rule reads the arguments)
_RULES: dict[str, tuple[str, _Rule, bool]] = {}


def _reg(kind: str, names: str, rule: _Rule, needs_args: bool = True) -> None:
    for n in names.split():
        _RULES[n] = (kind, rule, needs_args)


_reg("matmul", "mm", _mm(0, 1))
_reg("matmul", "addmm _addmm_activation", _mm(1, 2, 0))
_reg("matmul", "bmm", _bmm(0, 1))
_reg("matmul", "baddbmm", _bmm(1, 2, 0))
_reg("matmul", "addbmm", _bmm(1, 2, 0, reduce_batch=True))
_reg("matmul", "matmul", _matmul)
_reg("matmul", "linear", _linear)
_reg("matmul", "mv", _mv(0, 1))
_reg("matmul", "addmv addmv_", _mv(1, 2, 0))
_reg("matmul", "dot vdot", _dot)
_reg("matmul", "_scaled_mm", _scaled_mm)
for _n, _spec_c in CONV_FORWARD.items():
    _reg("conv", _n, _conv_forward(_spec_c))
_reg("conv", "convolution_backward", _conv_backward(0, 1, 2, 7, 10))
_reg("conv", "convolution_backward_overrideable", _conv_backward(0, 1, 2, 6, 9))
_reg("conv", "cudnn_convolution_backward", _conv_backward(1, 0, 2, -1, 10))
_reg("conv", "_slow_conv2d_backward", _conv_backward(0, 1, 2, -1, 6))
_reg("conv", "cudnn_convolution_backward_input", _cudnn_bwd_input)
_reg("conv", "cudnn_convolution_backward_weight", _cudnn_bwd_weight)
_reg(
    "attention",
    "scaled_dot_product_attention _scaled_dot_product_attention_math "
    "_scaled_dot_product_attention_math_for_mps",
    _attention(0),
)
_reg(
    "attention",
    "_scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention "
    "_scaled_dot_product_cudnn_attention _scaled_dot_product_flash_attention_for_cpu "
    "_scaled_dot_product_fused_attention_overrideable",
    _attention(0, lse=True),
)
_reg("attention", "_flash_attention_forward", _attention(0, True, True, (3, 4)))
_reg("attention", "_efficient_attention_forward", _attention(0, True, True, (4, 5)))
_reg(
    "attention",
    "_scaled_dot_product_flash_attention_backward "
    "_scaled_dot_product_efficient_attention_backward "
    "_scaled_dot_product_cudnn_attention_backward "
    "_scaled_dot_product_flash_attention_for_cpu_backward "
    "_scaled_dot_product_fused_attention_overrideable_backward",
    _attention_backward(0),
)
_reg("attention", "_flash_attention_backward", _attention_backward_bshd(0, (6, 7)))
_reg("attention", "_efficient_attention_backward", _attention_backward_bshd(0, (6, 7)))

for _n, (_ops, _nin) in _ELEMENTWISE.items():
    _reg("elementwise", _n, _elementwise(_ops, _nin, _n, False))
    if _n + "_" not in _RULES:
        _reg("elementwise", _n + "_", _elementwise(_ops, _nin, _n, True))
    if _n in ("add", "sub", "mul", "div", "addcmul", "addcdiv", "lerp", "sqrt", "exp", "neg",
              "abs", "maximum", "minimum", "pow", "clamp_min", "clamp_max", "sign", "reciprocal",
              "sigmoid", "log", "tanh", "clamp", "rsqrt", "copysign"):  # fmt: skip
        _reg("elementwise", f"_foreach_{_n} _foreach_{_n}_", _foreach(_ops))
_reg("elementwise", "native_dropout", _native_dropout)
_reg("reduction", "_foreach_norm", _foreach(2))
for _n in _REDUCTIONS:
    _reg("reduction", _n, _reduction(_n))
_reg("softmax", "softmax _safe_softmax log_softmax", _softmax(5, 1, 2, None))
_reg("softmax", "_softmax _log_softmax", _softmax(5, 1, None, 2))
_reg("softmax", "_softmax_backward_data _log_softmax_backward_data", _softmax(4, 2, 3, None))
_reg("norm", "layer_norm native_layer_norm",
     _norm_forward(5, 2, 3, stats=_layer_norm_rows))  # fmt: skip
_reg("norm", "native_layer_norm_backward", _norm_backward(5, 0, 1, 5, 7))
_reg("norm", "batch_norm _batch_norm_impl_index native_batch_norm _native_batch_norm_legit "
     "cudnn_batch_norm miopen_batch_norm", _norm_forward(5, 1, 2, 5, stats=_channels))  # fmt: skip
_reg("norm", "_native_batch_norm_legit_no_training _batch_norm_no_update",
     _norm_forward(5, 1, 2, -1, stats=_channels))  # fmt: skip
_reg("norm", "_batch_norm_with_update", _norm_forward(5, 1, 2, stats=_channels))
_reg("norm", "native_batch_norm_backward", _norm_backward(5, 0, 1, 2, 9))
_reg(
    "norm", "cudnn_batch_norm_backward miopen_batch_norm_backward", _norm_backward(5, 1, 0, 2, None)
)
_reg("norm", "group_norm", _norm_forward(5, 2, 3))
_reg("norm", "native_group_norm", _norm_forward(5, 1, 2, stats=_group_stats))
_reg("norm", "native_group_norm_backward", _norm_backward(5, 0, 1, 4, 9))
_reg("norm", "rms_norm _fused_rms_norm", _norm_forward(3, 2, -1, stats=_layer_norm_rows))
_reg("norm", "_fused_rms_norm_backward", _norm_backward(3, 0, 1, 4, 5))
_reg("embedding", "embedding", _embedding)
_reg("embedding", "embedding_bag _embedding_bag _embedding_bag_forward_only", _embedding_bag)
_reg("embedding", "embedding_dense_backward", _embedding_dense_backward)
_reg("embedding", "index_select", _index_select)
_reg("embedding", "gather", _gather)
_reg("loss", "nll_loss_forward nll_loss2d_forward", _nll_loss_forward)
_reg("loss", "nll_loss_backward nll_loss2d_backward", _nll_loss_backward)
_reg("loss", "mse_loss", _mse(False))
_reg("loss", "mse_loss_backward", _mse(True))
_reg("memory", "copy_", _copy(1, dst_from=0))
_reg("memory", "clone", _copy(0))
_reg("memory", "_to_copy", _copy(0, dtype_arg=1))
_reg("memory", "fill_ zero_", _fill)
_reg("memory", "item _local_scalar_dense", _item)
_reg("memory", "cat _cat concat concatenate", _cat, needs_args=False)
_reg("view", _VIEWS + " " + _ALLOCATIONS, _zero_cost, needs_args=False)

del _n, _names, _spec, _ops, _nin, _spec_c


def _base(name: str) -> str:
    return name[6:] if name.startswith("aten::") else name


def op_kind(name: str) -> str | None:
    """The kind of an op (``matmul``, ``conv``, ``attention`` are exact, following
    torch.utils.flop_counter; ``elementwise``, ``reduction``, ``softmax``, ``norm``,
    ``embedding``, ``loss`` are estimated; ``memory`` and ``view`` cost 0 FLOPs), None if we
    have no model for it."""
    r = _RULES.get(_base(name))
    return r[0] if r else None


def supported_ops() -> dict[str, str]:
    """Every op name with a cost model (as the profiler spells it) and its kind."""
    return {f"aten::{n}": r[0] for n, r in sorted(_RULES.items())}


def op_cost(
    name: str, dims: list[Any] | None, types: list[Any] | None, concrete: list[Any] | None = None
) -> Cost:
    """FLOPs and bytes of one op call, from its ``Input Dims``, ``Input type`` and
    ``Concrete Inputs`` as the profiler records them; None for what cannot be known.

    ``name`` may carry the ``aten::`` prefix (the profiler's spelling) or not. Bytes are the
    tensor inputs read plus the outputs written (see the module notes for what is left out).
    """
    rule = _RULES.get(_base(name))
    if rule is None:
        return None, None
    try:
        f, b = rule[1](_Call(dims, types, concrete))
    except (TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError):
        return None, None  # the shapes do not fit the op's signature
    return (None if f is None else float(f)), (None if b is None else float(b))


# ----------------------------------------------------------------------------------------------
# columns
# ----------------------------------------------------------------------------------------------


class _ShapeArgs(msgspec.Struct, gc=False):
    """The three args a cost needs, as raw JSON: compared as bytes to find repeated calls, and
    decoded only once per distinct call."""

    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")


_DECODE_ALL = msgspec.json.Decoder(list[_ShapeArgs])
_DECODE_ONE = msgspec.json.Decoder(_ShapeArgs)
_ENCODE = msgspec.json.Encoder()


def _raw_value(raw: msgspec.Raw) -> Any:
    return msgspec.json.decode(raw) if len(raw) else None


def _name_codes(names: Any) -> tuple[np.ndarray, list[str | None]]:
    """Each row's index into a list of its distinct names (-1: null)."""
    if not isinstance(names, (pa.Array, pa.ChunkedArray)):
        names = pa.array(list(names), pa.string())
    chunks = names.chunks if isinstance(names, pa.ChunkedArray) else [names]
    uniq: dict[str | None, int] = {}
    parts = []
    for ch in chunks:
        if not pa.types.is_dictionary(ch.type):
            ch = pc.dictionary_encode(ch)
        local = np.array(
            [uniq.setdefault(v, len(uniq)) for v in ch.dictionary.to_pylist()] + [-1], np.int64
        )
        idx = ch.indices.to_numpy(zero_copy_only=False)
        if ch.null_count:
            idx = np.where(ch.is_null().to_numpy(zero_copy_only=False), -1, idx)
        parts.append(local[idx.astype(np.int64)])
    codes = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return codes, list(uniq)


def _take(col: pa.Array | pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """``col[rows]`` (rows ascending) as one large_string array, taken chunk by chunk: a take on
    a chunked column would first concatenate all of it."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    starts = np.cumsum([0] + [len(c) for c in chunks])
    parts = []
    for k, ch in enumerate(chunks):
        lo, hi = np.searchsorted(rows, starts[k : k + 2])
        if hi > lo:
            part = ch.take(pa.array(rows[lo:hi] - starts[k], pa.int64()))
            if not pa.types.is_large_string(part.type):
                part = part.cast(pa.large_string())
            parts.append(part)
    if not parts:
        return pa.array([], pa.large_string())
    return pa.concat_arrays(parts) if len(parts) > 1 else parts[0]


def _decode_rows(args: Any, rows: np.ndarray) -> list[_ShapeArgs | None]:
    """The shape args of the given rows, decoded in one msgspec call over one joined buffer
    (one call per row only if some row is not a JSON object)."""
    if not isinstance(args, (pa.Array, pa.ChunkedArray)):
        sel = pa.array([args[i] for i in rows.tolist()], pa.large_string())
    else:
        sel = _take(args, rows)
    sel = pc.fill_null(sel, "{}")
    sel = pc.if_else(pc.equal(sel, ""), pa.scalar("{}", sel.type), sel)
    lst = pa.LargeListArray.from_arrays(pa.array([0, len(sel)], pa.int64()), sel)
    joined = pc.binary_join(lst, pa.scalar(",", pa.large_string()))[0].as_buffer()
    text = np.empty(joined.size + 2, np.uint8)  # "[" + rows joined by "," + "]", one copy
    text[0], text[-1] = ord("["), ord("]")
    text[1:-1] = np.frombuffer(joined, np.uint8)
    try:
        return _DECODE_ALL.decode(text)  # type: ignore[return-value]
    except msgspec.DecodeError:
        out: list[_ShapeArgs | None] = []
        for text in sel.to_pylist():
            try:
                out.append(_DECODE_ONE.decode(text))
            except msgspec.DecodeError:
                out.append(None)
        return out


def derive(names: Any, args: Any, where: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and bytes of a column of op events; float64 arrays, NaN where unknown.

    ``names`` is the events' ``name`` column (Arrow string or dictionary array, chunked or not,
    or a sequence of str); ``args`` the ``args`` column (Arrow string/large_string of JSON
    objects, or a sequence of str/None). ``where`` (bool, optional) limits the work to those
    rows (the framework ops of a whole events table); the others get NaN. Values are inclusive
    (see the module notes): total a trace with ``outermost()``.

    Fast because real traces repeat themselves: names are looked at once each; ops whose cost
    does not depend on shapes (views, allocations) and ops with no model never have their args
    read; the rest are decoded in one msgspec call that keeps the three shape fields as raw
    bytes, and ``op_cost`` runs once per distinct (name, dims, types, concrete).
    """
    codes, uniq = _name_codes(names)
    n = len(codes)
    if where is not None:
        codes = np.where(np.asarray(where, bool), codes, -1)
    flops = np.full(n, np.nan)
    nbytes = np.full(n, np.nan)
    if n == 0:
        return flops, nbytes
    const_f = np.full(len(uniq) + 1, np.nan)
    const_b = np.full(len(uniq) + 1, np.nan)
    need = np.zeros(len(uniq) + 1, bool)
    for k, nm in enumerate(uniq):
        rule = _RULES.get(_base(nm)) if nm is not None else None
        if rule is None:
            continue
        if rule[2]:
            need[k] = True
        else:
            f, b = op_cost(nm, [], [], [])  # type: ignore[arg-type]
            const_f[k] = np.nan if f is None else f
            const_b[k] = np.nan if b is None else b
    flops[:] = const_f[codes]
    nbytes[:] = const_b[codes]
    rows = np.flatnonzero(need[codes])
    if not rows.size:
        return flops, nbytes
    decoded = _decode_rows(args, rows)
    # one key per row: the name and the three raw fields, re-encoded into one bytes object (a
    # single C call; the volatile args — ids, sequence numbers — are not part of it)
    enc = _ENCODE.encode
    row_codes = codes[rows].tolist()
    if all(a is not None for a in decoded):
        keys = list(zip(row_codes, map(enc, decoded), strict=True))  # type: ignore[arg-type]
    else:
        keys = [
            (c, enc(a) if a is not None else None) for c, a in zip(row_codes, decoded, strict=True)
        ]
    seen: dict[Any, int] = dict.fromkeys(keys)  # type: ignore[arg-type]
    for u, k in enumerate(seen):
        seen[k] = u
    inverse = np.fromiter(map(seen.__getitem__, keys), np.int64, len(keys))
    _, first = np.unique(inverse, return_index=True)
    uf = np.full(len(seen), np.nan)
    ub = np.full(len(seen), np.nan)
    for u, j in enumerate(first.tolist()):
        a = decoded[j]
        if a is None:
            continue
        try:
            dims, types, conc = _raw_value(a.dims), _raw_value(a.types), _raw_value(a.concrete)
        except msgspec.DecodeError:
            continue
        f, b = op_cost(uniq[keys[j][0]], dims, types, conc)  # type: ignore[arg-type]
        uf[u] = np.nan if f is None else f
        ub[u] = np.nan if b is None else b
    flops[rows] = uf[inverse]
    nbytes[rows] = ub[inverse]
    return flops, nbytes


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

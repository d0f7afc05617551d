"""Convolutions, forward and backward, as ``torch.utils.flop_counter`` counts them."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from xpuprof.costmodel.call import Call, Cost, add


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


def _conv_forward(spec: ConvArgs) -> Callable[[Call], Cost]:
    def cost(c: Call) -> Cost:
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
        return flops, add(c.nbytes(0), c.nbytes(1), bias, out)

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

    def cost(c: Call) -> Cost:
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
        return flops, add(c.nbytes(go_i), c.nbytes(x_i), c.nbytes(w_i), writes * z)

    return cost


def _cudnn_bwd_input(c: Call) -> Cost:
    """cudnn_convolution_backward_input(self_size, grad_output, weight, …) (2021 traces)."""
    go, w = c.shape(1), c.shape(2)
    if go is None or w is None or len(go) != len(w) or len(w) < 3:
        return None, None
    flops = conv_flops(go, w, [], True)
    size = c.ints(0)
    z = c.itemsize(1)
    out = math.prod(size) * z if size is not None and z is not None else None
    return flops, add(c.nbytes(1), c.nbytes(2), out)


def _cudnn_bwd_weight(c: Call) -> Cost:
    """cudnn_convolution_backward_weight(weight_size, grad_output, self, …) (2021 traces)."""
    go, x, wsize = c.shape(1), c.shape(2), c.ints(0)
    if go is None or x is None or wsize is None or not (len(go) == len(x) == len(wsize)):
        return None, None
    flops = _conv_bwd_flops(go, x, wsize, False, [False, True])
    z = c.itemsize(1)
    out = math.prod(wsize) * z if z is not None else None
    return flops, add(c.nbytes(1), c.nbytes(2), out)


#: (kind, op names without ``aten::``, rule): read by ``costmodel/ops.py``.
RULES: list[tuple[str, str, Callable[[Call], Cost]]] = [
    *(("conv", name, _conv_forward(spec)) for name, spec in CONV_FORWARD.items()),
    ("conv", "convolution_backward", _conv_backward(0, 1, 2, 7, 10)),
    ("conv", "convolution_backward_overrideable", _conv_backward(0, 1, 2, 6, 9)),
    ("conv", "cudnn_convolution_backward", _conv_backward(1, 0, 2, -1, 10)),
    ("conv", "_slow_conv2d_backward", _conv_backward(0, 1, 2, -1, 6)),
    ("conv", "cudnn_convolution_backward_input", _cudnn_bwd_input),
    ("conv", "cudnn_convolution_backward_weight", _cudnn_bwd_weight),
]

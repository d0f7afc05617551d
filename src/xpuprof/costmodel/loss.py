"""Losses (estimated): NLL and MSE, forward and backward."""

from __future__ import annotations

from collections.abc import Callable

from xpuprof.costmodel.call import Call, Cost, add


def _nll_loss_forward(c: Call) -> Cost:
    """nll_loss_forward(self, target, weight, reduction, ignore_index): one pick-and-add per
    target; the picked inputs, the target and the output (per target, or a scalar) moved."""
    t, z = c.numel(1), c.itemsize(0)
    red = c.int(3)
    if t is None or z is None:
        return None, None
    out = (t if red == 0 else 2) * z if red is not None else None
    return float(t), add(c.nbytes(1), t * z, c.nbytes(2) if c.is_tensor(2) else 0, out)


def _nll_loss_backward(c: Call) -> Cost:
    """nll_loss_backward(grad_output, self, target, …): grad-input zeroed then one write per
    target."""
    n, t, z = c.numel(1), c.numel(2), c.itemsize(1)
    if n is None or t is None or z is None:
        return None, None
    return float(t), add(c.nbytes(0), c.nbytes(2), n * z)


def _mse(bwd: bool) -> Callable[[Call], Cost]:
    """mse_loss(self, target, reduction): sub, square, accumulate — 3 per element."""

    def cost(c: Call) -> Cost:
        x_i = 1 if bwd else 0
        n, z = c.numel(x_i), c.itemsize(x_i)
        if n is None or z is None:
            return None, None
        reads = add(*(c.nbytes(i) for i in range(3) if c.is_tensor(i)))
        if bwd:
            return 3.0 * n, add(reads, n * z)
        red = c.int(2)
        out = (n if red == 0 else 1) * z if red is not None else None
        return 3.0 * n, add(reads, out)

    return cost


#: (kind, op names without ``aten::``, rule): read by ``costmodel/ops.py``.
RULES: list[tuple[str, str, Callable[[Call], Cost]]] = [
    ("loss", "nll_loss_forward nll_loss2d_forward", _nll_loss_forward),
    ("loss", "nll_loss_backward nll_loss2d_backward", _nll_loss_backward),
    ("loss", "mse_loss", _mse(False)),
    ("loss", "mse_loss_backward", _mse(True)),
]

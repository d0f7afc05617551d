"""The accelerator model: GEMM and convolution time on a configurable systolic array.

An array of ``rows`` × ``cols`` processing elements (PEs), each doing one multiply-accumulate
per cycle at ``clock_hz``, with ``sram_bytes`` of on-chip buffer and ``hbm_bandwidth`` bytes/s
of off-chip memory moved by ``dma_engines`` DMA engines (``dma_bandwidth`` bytes/s each, when
given). ``docs/costs.md`` states every rule; in short:

**Cycles** (SCALE-Sim's cycle-level model, Samajdar et al., "SCALE-Sim: Systolic CNN
Accelerator Simulator", and its v2/v3 source): an M×K by K×N GEMM maps onto the array as a
stationary Sr × Sc matrix, tiled into ⌈Sr/R⌉·⌈Sc/C⌉ *folds*, with T rows streamed through
each fold:

- weight-stationary (``ws``): Sr = K, Sc = N, T = M; a fold takes 2R + C + T − 2 cycles (R to
  load the weights, T + C − 1 to stream the inputs and drain, R − 1 of skew);
- input-stationary (``is``): Sr = K, Sc = M, T = N; the same 2R + C + T − 2 per fold;
- output-stationary (``os``): Sr = M, Sc = N, T = K; R + C + T − 2 per fold (nothing is
  preloaded: the operands stream in with their skew and the outputs drain).

τ = cycles per fold × ⌈Sr/R⌉ × ⌈Sc/C⌉. These are the row counts of SCALE-Sim's demand
matrices (``systolic_compute_{ws,is,os}.py``); SCALE-Sim reports τ − 1 as its total cycles
(the 0-based number of the last cycle), e.g. 14,303 for 512³ on 128×128 (τ = 14,304).

**Bytes moved** off chip, for A (M×K), B (K×N), C (M×N) of ``itemsize`` bytes each: when
A + B + C fits in the SRAM, each input is read once and the output written once. Otherwise each
operand is judged alone against a third of the SRAM (SCALE-Sim's separate input, filter and
output buffers): one that fits is read once; one that does not is read as often as the
dataflow streams it (the counts of SCALE-Sim's SRAM reads): ws — A ⌈N/C⌉ times, B once;
is — A once, B ⌈M/C⌉ times; os — A ⌈N/C⌉ times, B ⌈M/R⌉ times. The output of ws and is is
accumulated over the ⌈K/R⌉ row folds: when it does not fit, its partial sums are written
⌈K/R⌉ times and read back ⌈K/R⌉ − 1 times; os finishes each output in the array (written
once).

**Time** = max(τ / clock, bytes / bandwidth), bandwidth = min(``hbm_bandwidth``,
``dma_engines`` × ``dma_bandwidth``): the DMA engines overlap transfers with compute (double
buffering), so the slower of the two sets the time. A batch of GEMMs (``bmm``, grouped
convolutions) runs its GEMMs one after another.

**Convolutions** become GEMMs by im2col: forward M = N·H_out·W_out, K = C_in/g·kh·kw,
N = C_out/g, once per group g. Backward: the input gradient as col2im (M = N·H_out·W_out,
K = C_out/g, N = C_in/g·kh·kw) and the weight gradient (M = C_out/g, K = N·H_out·W_out,
N = C_in/g·kh·kw); a transposed convolution's forward is the col2im form of its input. Each
form performs exactly the multiply-adds ``torch.utils.flop_counter`` counts for the op.

:class:`SystolicCosts` prices the ``device_work`` edges of a replay graph whose kernels were
launched by a GEMM or convolution op with known shapes (kernel → runtime call by correlation id
→ innermost framework op); an op's modelled time is shared among its kernels in proportion to
their measured durations (copies and sets the op issued, e.g. cuDNN zeroing a gradient, keep
their delay: they are not array work). Every other edge keeps the base model's delay;
``unpriced`` lists the GEMM-like kernels it could not price and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pandas as pd

from xpuprof.core.raw import decode_json
from xpuprof.costmodel.call import Call, broadcast
from xpuprof.costmodel.conv import CONV_FORWARD
from xpuprof.costmodel.ops import base_name, op_kind
from xpuprof.sim.costs.roofline import CostModelError, launching_ops
from xpuprof.sim.graph import DEVICE_WORK

if TYPE_CHECKING:
    from xpuprof.sim.costs import CostModel
    from xpuprof.sim.graph import ReplayGraph
    from xpuprof.trace.trace import Trace

DATAFLOWS = ("ws", "is", "os")

#: Op kinds (``costmodel.ops``) whose kernels the array runs.
GEMM_KINDS = ("matmul", "conv")

#: Why a GEMM-like op has no GEMM shape when its shapes were not recorded at all.
NO_SHAPES = ("no input shapes recorded (torch.profiler record_shapes=True, or "
             "xpuprof.profile(level='full'))")  # fmt: skip
#: Where the scalar arguments of an op (stride, padding, groups, sizes) come from.
CONCRETE = "(Concrete Inputs: a newer torch.profiler with record_shapes=True records them)"
NO_ARGS = f"its stride, padding or groups are not recorded {CONCRETE}"


class Gemm(NamedTuple):
    """``count`` GEMMs of (M×K)·(K×N), run one after another."""

    m: int
    k: int
    n: int
    count: int = 1


@dataclass(frozen=True)
class SystolicArray:
    """A configurable accelerator (module docstring). Defaults: a nominal 128×128
    weight-stationary array at 1 GHz with 24 MiB of SRAM and 1 TB/s of HBM, the size of
    SCALE-Sim's reference points; not a product."""

    rows: int = 128
    cols: int = 128
    clock_hz: float = 1e9
    sram_bytes: float = 24 * 2**20
    hbm_bandwidth: float = 1e12
    dma_engines: int = 4
    dma_bandwidth: float | None = None
    dataflow: str = "ws"

    def __post_init__(self) -> None:
        if self.dataflow not in DATAFLOWS:
            raise CostModelError(
                f"unknown dataflow {self.dataflow!r}: expected one of {', '.join(DATAFLOWS)} "
                "(weight-, input- or output-stationary)"
            )
        for name in ("rows", "cols", "dma_engines"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise CostModelError(f"array {name} must be a whole number ≥ 1, got {v!r}")
        for name in ("clock_hz", "hbm_bandwidth"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v > 0 or math.isinf(v):
                raise CostModelError(f"array {name} must be a positive number, got {v!r}")
        if not isinstance(self.sram_bytes, (int, float)) or self.sram_bytes < 0:
            raise CostModelError(f"array sram_bytes must be ≥ 0, got {self.sram_bytes!r}")
        if self.dma_bandwidth is not None and not (
            isinstance(self.dma_bandwidth, (int, float)) and self.dma_bandwidth > 0
        ):
            raise CostModelError(
                f"dma_bandwidth must be a positive number of bytes/s or None, got "
                f"{self.dma_bandwidth!r}"
            )

    @property
    def bandwidth(self) -> float:
        """Off-chip bytes/s the array can use: HBM, or less when the DMA engines are slower."""
        if self.dma_bandwidth is None:
            return float(self.hbm_bandwidth)
        return float(min(self.hbm_bandwidth, self.dma_engines * self.dma_bandwidth))


@dataclass(frozen=True)
class GemmCost:
    """What one GEMM (or a batch of ``count``) costs on an array."""

    cycles: int
    bytes: int
    compute_s: float
    memory_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def mapping(dataflow: str, m: int, k: int, n: int) -> tuple[int, int, int]:
    """(Sr, Sc, T) of an M×K by K×N GEMM under ``dataflow`` (SCALE-Sim's operand mapping)."""
    if dataflow == "ws":
        return k, n, m
    if dataflow == "is":
        return k, m, n
    if dataflow == "os":
        return m, n, k
    raise CostModelError(f"unknown dataflow {dataflow!r}: expected one of {', '.join(DATAFLOWS)}")


def folds(dataflow: str, m: int, k: int, n: int, rows: int, cols: int) -> tuple[int, int]:
    """(row folds ⌈Sr/R⌉, column folds ⌈Sc/C⌉)."""
    sr, sc, _ = mapping(dataflow, m, k, n)
    return -(-sr // rows), -(-sc // cols)


def gemm_cycles(m: int, k: int, n: int, rows: int = 128, cols: int = 128,
                dataflow: str = "ws") -> int:  # fmt: skip
    """τ, the cycles of one M×K by K×N GEMM on a ``rows`` × ``cols`` array (module
    docstring): (2R + C + T − 2)·⌈Sr/R⌉·⌈Sc/C⌉ for ws and is, (R + C + T − 2)·… for os."""
    _check_dims(m, k, n)
    _, _, t = mapping(dataflow, m, k, n)
    fr, fc = folds(dataflow, m, k, n, rows, cols)
    per_fold = (rows if dataflow != "os" else 0) + rows + cols + t - 2
    return per_fold * fr * fc


def gemm_bytes(m: int, k: int, n: int, itemsize: int, array: SystolicArray) -> int:
    """Bytes moved off chip by one GEMM (module docstring: once each when all fits, else each
    operand by itself against a third of the SRAM)."""
    _check_dims(m, k, n)
    a, b, c = m * k * itemsize, k * n * itemsize, m * n * itemsize
    if a + b + c <= array.sram_bytes:
        return a + b + c
    share = array.sram_bytes / 3
    r, cc, df = array.rows, array.cols, array.dataflow
    reuse_a = {"ws": -(-n // cc), "is": 1, "os": -(-n // cc)}[df]
    reuse_b = {"ws": 1, "is": -(-m // cc), "os": -(-m // r)}[df]
    total = (a if a <= share else a * reuse_a) + (b if b <= share else b * reuse_b)
    k_folds = -(-k // r)
    if df == "os" or c <= share:
        total += c
    else:
        total += c * (2 * k_folds - 1)  # partial sums: written per row fold, read back
    return total


def gemm_cost(gemm: Gemm, array: SystolicArray, itemsize: int = 2) -> GemmCost:
    """Cycles, bytes and the two times of ``gemm.count`` GEMMs run one after another."""
    cyc = gemm_cycles(gemm.m, gemm.k, gemm.n, array.rows, array.cols, array.dataflow)
    nbytes = gemm_bytes(gemm.m, gemm.k, gemm.n, itemsize, array)
    cyc, nbytes = cyc * gemm.count, nbytes * gemm.count
    return GemmCost(cycles=cyc, bytes=nbytes, compute_s=cyc / array.clock_hz,
                    memory_s=nbytes / array.bandwidth)  # fmt: skip


def conv_gemm(batch: int, c_in: int, c_out: int, out_hw: tuple[int, ...] | list[int],
              kernel: tuple[int, ...] | list[int], groups: int = 1) -> Gemm:  # fmt: skip
    """The im2col GEMM of a forward convolution: M = N·∏out, K = C_in/g·∏kernel,
    N = C_out/g, once per group."""
    if groups < 1 or c_in % groups or c_out % groups:
        raise CostModelError(f"groups={groups} does not divide C_in={c_in} and C_out={c_out}")
    return Gemm(batch * math.prod(out_hw), c_in // groups * math.prod(kernel),
                c_out // groups, groups)  # fmt: skip


def _check_dims(m: int, k: int, n: int) -> None:
    if min(m, k, n) < 1:
        raise CostModelError(f"a GEMM needs M, K, N ≥ 1, got M={m}, K={k}, N={n}")


# -- GEMM shapes of framework ops -------------------------------------------------------------

#: Backward convolutions: (grad_output, input, weight, transposed, output_mask, groups)
#: positions in their schemas (-1: absent; as ``costmodel/conv.py``'s rules read them).
_CONV_BACKWARD = {
    "convolution_backward": (0, 1, 2, 7, 10, 9),
    "convolution_backward_overrideable": (0, 1, 2, 6, 9, 8),
    "cudnn_convolution_backward": (1, 0, 2, -1, 10, 6),
    "_slow_conv2d_backward": (0, 1, 2, -1, 6, -1),
}


def op_gemms(name: str, call: Call, flops: float | None = None) -> tuple[list[Gemm], str | None]:
    """The GEMMs an op performs, from its recorded shapes (and, for a forward convolution,
    its FLOPs: M = FLOPs / (2·K·C_out), which is the output size the costmodel derived from
    stride and padding). Returns (gemms, None), or ([], why not)."""
    base = base_name(name)
    if not call.dims:
        return [], NO_SHAPES
    try:
        if op_kind(name) == "matmul":
            return _matmul_gemms(base, call)
        if base in CONV_FORWARD:
            return _conv_forward_gemms(base, call, flops)
        return _conv_backward_gemms(base, call)
    except (TypeError, ValueError, ZeroDivisionError, CostModelError) as e:
        return [], f"its shapes do not fit the op ({e})"


def _matmul_gemms(base: str, c: Call) -> tuple[list[Gemm], str | None]:
    """mm/addmm/bmm/baddbmm/addbmm/matmul/linear/mv/dot/_scaled_mm as costmodel/matmul.py
    reads them."""
    pos = {"mm": (0, 1), "_scaled_mm": (0, 1), "addmm": (1, 2), "_addmm_activation": (1, 2),
           "bmm": (0, 1), "baddbmm": (1, 2), "addbmm": (1, 2), "mv": (0, 1), "addmv": (1, 2),
           "addmv_": (1, 2), "dot": (0, 1), "vdot": (0, 1), "matmul": (0, 1),
           "linear": (0, 1)}  # fmt: skip
    if base not in pos:
        return [], f"no GEMM mapping for {base}"
    i, j = pos[base]
    x, y = c.shape(i), c.shape(j)
    if x is None or y is None:
        return [], NO_SHAPES if not c.dims else "an operand's shape is not recorded"
    if base == "linear":
        if not x or len(y) != 2:
            return [], "not a (…, K)·(N, K)ᵀ product"
        return [Gemm(math.prod(x[:-1]), x[-1], y[0])], None
    if base in ("dot", "vdot"):
        return [Gemm(1, x[0], 1)], None
    if base in ("mv", "addmv", "addmv_"):
        return [Gemm(x[0], x[1], 1)], None
    if base in ("bmm", "baddbmm", "addbmm"):
        return [Gemm(x[1], x[2], y[2], x[0])], None
    if base == "matmul":
        xm = x if len(x) > 1 else [1, *x]
        ym = y if len(y) > 1 else [*y, 1]
        batch = broadcast([xm[:-2], ym[:-2]])
        if batch is None or xm[-1] != ym[-2]:
            return [], "its operands do not broadcast to a matrix product"
        return [Gemm(xm[-2], xm[-1], ym[-1], math.prod(batch))], None
    return [Gemm(x[0], x[1], y[1])], None


def _conv_forward_gemms(base: str, c: Call, flops: float | None) -> tuple[list[Gemm], str | None]:
    spec = CONV_FORWARD[base]
    x, w = c.shape(0), c.shape(1)
    if x is None or w is None or len(w) < 3:
        return [], "the input or weight shape is not recorded"
    nsp = len(w) - 2
    if len(x) == nsp + 1:  # unbatched input
        x = [1, *x]
    if spec.transposed >= 0:
        transposed = c.flag(spec.transposed)
        if transposed is None:
            return [], NO_ARGS
    else:
        transposed = spec.transposed == -2
    groups = c.int(spec.groups) if spec.groups >= 0 else 1
    if groups is None:
        return [], NO_ARGS
    kernel = math.prod(w[2:])
    if transposed:  # col2im of the input: M = N·∏in, K = C_in/g, N = C_out/g·∏kernel
        return [Gemm(x[0] * math.prod(x[2:]), w[0] // groups, w[1] * kernel, groups)], None
    if flops is None or not flops > 0:
        return [], f"its output size is unknown: {NO_ARGS}"
    m = flops / (2 * w[1] * kernel * w[0])
    if m != int(m) or m < 1:
        return [], f"its FLOPs ({flops:g}) are not 2·M·K·N of its shapes"
    return [Gemm(int(m), w[1] * kernel, w[0] // groups, groups)], None


def _conv_backward_gemms(base: str, c: Call) -> tuple[list[Gemm], str | None]:
    if base == "cudnn_convolution_backward_input":  # (self_size, grad_output, weight, …)
        go, w, g = c.shape(1), c.shape(2), c.int(6)
        if go is None or w is None:
            return [], "the gradient or weight shape is not recorded"
        return [_dgrad(go, w, g or 1)], None
    if base == "cudnn_convolution_backward_weight":  # (weight_size, grad_output, self, …)
        wsize, go, g = c.ints(0), c.shape(1), c.int(6)
        if wsize is None or go is None:
            return [], f"its weight size is not recorded {CONCRETE}"
        return [_wgrad(go, wsize, g or 1)], None
    if base not in _CONV_BACKWARD:
        return [], f"no GEMM mapping for {base}"
    go_i, _x_i, w_i, tr_i, mask_i, g_i = _CONV_BACKWARD[base]
    go, w = c.shape(go_i), c.shape(w_i)
    if go is None or w is None:
        return [], "the gradient or weight shape is not recorded"
    transposed = c.flag(tr_i) if tr_i >= 0 else False
    mask = c.flags(mask_i)
    groups = c.int(g_i) if g_i >= 0 else 1
    if transposed is None or mask is None or len(mask) < 2 or groups is None:
        return [], f"which gradients it computes is unknown: {NO_ARGS}"
    if transposed:
        return [], "the backward of a transposed convolution is not mapped to GEMMs"
    out = ([_dgrad(go, w, groups)] if mask[0] else []) + ([_wgrad(go, w, groups)] if mask[1]
                                                          else [])  # fmt: skip
    return (out, None) if out else ([], "it computes no input or weight gradient")


def _dgrad(go: list[int], w: list[int], groups: int) -> Gemm:
    """Input gradient as col2im: (N·∏out × C_out/g)·(C_out/g × C_in/g·∏kernel), per group."""
    return Gemm(go[0] * math.prod(go[2:]), w[0] // groups, w[1] * math.prod(w[2:]), groups)


def _wgrad(go: list[int], w: list[int], groups: int) -> Gemm:
    """Weight gradient: (C_out/g × N·∏out)·(N·∏out × C_in/g·∏kernel), per group."""
    return Gemm(w[0] // groups, go[0] * math.prod(go[2:]), w[1] * math.prod(w[2:]), groups)


# -- the cost model ------------------------------------------------------------------------------

PRICED_COLUMNS = ["op", "name", "gemms", "itemsize", "cycles", "bytes", "time_ns", "bound",
                  "measured_ns", "kernels"]  # fmt: skip
UNPRICED_COLUMNS = ["event", "name", "op", "op_name", "reason"]


class SystolicCosts:
    """GEMM and convolution kernels priced on a :class:`SystolicArray` (module docstring);
    every other edge at ``base``'s delay (default: measured).

    After :meth:`delays`, ``priced`` has one row per op priced (its GEMMs, cycles, bytes,
    modelled and measured time) and ``unpriced`` one row per GEMM-like kernel left at the
    base delay, with the reason."""

    def __init__(self, trace: Trace, array: SystolicArray | None = None,
                 base: CostModel | None = None) -> None:  # fmt: skip
        from xpuprof.sim.costs import Measured

        self.trace = trace
        self.array = array if array is not None else SystolicArray()
        if not isinstance(self.array, SystolicArray):
            raise CostModelError(f"array must be a SystolicArray, got {type(array).__name__}")
        self.base = base if base is not None else Measured()
        self.priced = pd.DataFrame(columns=PRICED_COLUMNS)
        self.unpriced = pd.DataFrame(columns=UNPRICED_COLUMNS)

    def delays(self, graph: ReplayGraph) -> np.ndarray:
        out = np.asarray(self.base.delays(graph), np.int64).copy()
        e = graph.edges
        rows = np.flatnonzero((e.kind == DEVICE_WORK) & (e.event >= 0))
        self.priced = pd.DataFrame(columns=PRICED_COLUMNS)
        self.unpriced = pd.DataFrame(columns=UNPRICED_COLUMNS)
        if not len(rows):
            return out
        ids = e.event[rows]
        t, info, call = launching_ops(self.trace, ids)
        op = t.ancestor_at("op", call)
        op_name = t.names_of(op)
        kind_of = {n: op_kind(str(n)) for n in set(op_name.tolist()) if n is not None}
        kind = np.array([kind_of.get(n) for n in op_name.tolist()], object)
        gl = np.flatnonzero(np.isin(kind, GEMM_KINDS) & (info["level"] == "kernel"))
        un = _gemm_named_without_op(info, ids, op)
        if len(gl):
            uniq, inv = np.unique(op[gl], return_inverse=True)
            inv = inv.reshape(-1)
            table = self._price_ops(t, uniq)
            measured = np.maximum(e.slack[rows[gl]], 0).astype(np.float64)
            m_sum = np.bincount(inv, weights=measured, minlength=len(uniq))
            n_k = np.bincount(inv, minlength=len(uniq))
            frac = np.where(m_sum[inv] > 0, measured / np.where(m_sum[inv] > 0, m_sum[inv], 1),
                            1.0 / n_k[inv])  # fmt: skip
            share = table["time_ns"].to_numpy(float)[inv] * frac
            ok = ~np.isnan(share)
            out[rows[gl[ok]]] = np.rint(share[ok]).astype(np.int64)
            table["measured_ns"], table["kernels"] = m_sum, n_k
            self.priced = table[table["reason"].isna()][PRICED_COLUMNS].reset_index(drop=True)
            bad = ~ok
            un = pd.concat([pd.DataFrame({
                "event": ids[gl[bad]], "name": info["name"][gl[bad]],
                "op": t.ids[op[gl[bad]]], "op_name": op_name[gl[bad]],
                "reason": table["reason"].to_numpy(object)[inv[bad]],
            }), un], ignore_index=True)  # fmt: skip
        self.unpriced = un[UNPRICED_COLUMNS].reset_index(drop=True)
        return out

    def _price_ops(self, t: Any, ops: np.ndarray) -> pd.DataFrame:
        """One row per GEMM-like op row in ``ops``: the op whose shapes gave its GEMMs, the
        GEMMs, cycles, bytes, modelled time (NaN and a ``reason`` when none). An op whose own
        shapes give none (a wrapper without the needed argument) is read through its GEMM-like
        ancestors, nearest first. Ops repeat a few signatures: each distinct (name, args,
        FLOPs) is mapped and priced once."""
        chain = [ops]
        cur = ops
        for _ in range(8):  # nests of GEMM-like ops are a few deep (conv2d → … → cudnn_…)
            cur = t.ancestor_at("op", cur, strict=True)
            names = t.names_of(cur)
            cur = np.where([n is not None and op_kind(str(n)) in GEMM_KINDS for n in names],
                           cur, -1)  # fmt: skip
            if not (cur >= 0).any():
                break
            chain.append(cur)
        every = np.unique(np.concatenate(chain))
        every = every[every >= 0]
        args = _op_args(self.trace, t.ids[every])
        t.load("flops")
        memo: dict[Any, tuple[list[Gemm], int, str | None]] = {}

        def gemms_of(r: int) -> tuple[list[Gemm], int, str | None]:
            name = str(t.names_of(np.array([r]))[0])
            fl = float(t.flops[r]) if not np.isnan(t.flops[r]) else None
            a = args.get(int(t.ids[r]), {})
            key = (name, fl, *(repr(a.get(f)) for f in ("Input Dims", "Input type",
                                                         "Concrete Inputs")))  # fmt: skip
            if key not in memo:
                c = Call(a.get("Input Dims"), a.get("Input type"), a.get("Concrete Inputs"))
                gemms, why = op_gemms(name, c, fl)
                size = next((c.itemsize(i) for i in range(len(c)) if c.itemsize(i)), None)
                memo[key] = (gemms, size or 4, why)
            return memo[key]

        priced: dict[Any, tuple[GemmCost, float]] = {}
        rows = []
        for k, o in enumerate(ops.tolist()):
            first_why, found = None, None
            for level in chain:
                r = int(level[k])
                if r < 0:
                    break
                gemms, size, why = gemms_of(r)
                if why is None:
                    found = (r, gemms, size)
                    break
                first_why = first_why or why
            if found is None:
                rows.append({"op": int(t.ids[o]), "name": t.names_of(np.array([o]))[0],
                             "gemms": [], "itemsize": None, "cycles": None, "bytes": None,
                             "time_ns": np.nan, "bound": None, "reason": first_why})  # fmt: skip
                continue
            r, gemms, size = found
            key = (tuple(gemms), size)
            if key not in priced:
                costs = [gemm_cost(g, self.array, size) for g in gemms]
                total = GemmCost(cycles=sum(c.cycles for c in costs),
                                 bytes=sum(c.bytes for c in costs),
                                 compute_s=sum(c.compute_s for c in costs),
                                 memory_s=sum(c.memory_s for c in costs))  # fmt: skip
                priced[key] = (total, sum(c.time_s for c in costs) * 1e9)
            cost, time_ns = priced[key]
            rows.append({"op": int(t.ids[r]), "name": t.names_of(np.array([r]))[0],
                         "gemms": [tuple(g) for g in gemms], "itemsize": size,
                         "cycles": cost.cycles, "bytes": cost.bytes, "time_ns": time_ns,
                         "bound": cost.bound, "reason": None})  # fmt: skip
        return pd.DataFrame(rows)


def _op_args(trace: Trace, ids: np.ndarray) -> dict[int, dict[str, Any]]:
    """The decoded ``args`` of the given events, by id."""
    import pyarrow as pa

    if not len(ids):
        return {}
    con = trace.con
    con.register("_xpuprof_systolic_ids", pa.table({"id": pa.array(ids, pa.int64())}))
    try:
        got = con.execute("select e.id, e.args from events e join _xpuprof_systolic_ids i "
                          "on e.id = i.id").fetchall()  # fmt: skip
    finally:
        con.unregister("_xpuprof_systolic_ids")
    out = {}
    for i, text in got:
        d = decode_json(text, {})
        out[int(i)] = d if isinstance(d, dict) else {}
    return out


_GEMM_NAME = ("gemm", "cublas", "cutlass", "xmma", "sgemm", "hgemm", "conv", "wgrad", "dgrad")


def _gemm_named_without_op(info: dict[str, np.ndarray], ids: np.ndarray,
                           op: np.ndarray) -> pd.DataFrame:  # fmt: skip
    """Kernels named like GEMMs or convolutions whose launching op is not in the trace."""
    orphan = np.flatnonzero((op < 0) & (info["level"] == "kernel"))
    names = [str(n) for n in info["name"][orphan]]
    pick = [any(w in n.lower() for w in _GEMM_NAME) for n in names]
    sel = orphan[np.asarray(pick, bool)] if len(orphan) else orphan
    return pd.DataFrame({
        "event": ids[sel], "name": info["name"][sel], "op": np.full(len(sel), -1),
        "op_name": np.full(len(sel), None, dtype=object),
        "reason": "no launching framework op in the trace (no runtime call with its "
                  "correlation id, or no op around that call)",
    }, columns=UNPRICED_COLUMNS)  # fmt: skip

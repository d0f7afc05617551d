"""The compute cost models (``xpuprof.sim.costs.systolic`` and ``.roofline``, docs/costs.md).

Systolic: SCALE-Sim v3's three weight-stationary reference points (REFERENCE.md), the input-
and output-stationary mappings on small arrays with the folds counted by hand (and checked
once against the row counts of SCALE-Sim 3.0.0's demand matrices: the same numbers), the
bytes rule, im2col, and the GEMMs found in the shared ResNet-50 trace (counted from the raw
JSON). Roofline: the calibration worked by hand on a synthetic A100 trace and a swap to an
H100 from the datasheet peaks of ``hardware/specs.py``; the identity (a class's model times on
its own device sum to its measured total) on the shared GPU traces that record shapes; CPU ops
priced through their host time.

Synthetic traces are in µs (Kineto's unit); the store and the models are in ns.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from tests.builders import TraceBuilder
from tests.conftest import shared
from xpuprof.core.errors import XpuprofError
from xpuprof.costmodel.call import Call
from xpuprof.hardware.specs import DeviceSpec
from xpuprof.sim.costs.roofline import ASYNC_START, NO_OP, CostModelError, RooflineCosts
from xpuprof.sim.costs.systolic import (
    NO_SHAPES,
    Gemm,
    SystolicArray,
    SystolicCosts,
    conv_gemm,
    gemm_bytes,
    gemm_cost,
    gemm_cycles,
    mapping,
    op_gemms,
)
from xpuprof.sim.graph import DEVICE_WORK, HOST_WORK, replay_graph

RESNET = "kineto/gpu/resnet50_v100_2021/num_workers_0.pt.trace.json.gz"
DLRM = "kineto/gpu/dlrm_8rank_v100/worker0_step_12.1694128201545.pt.trace.json.gz"
MI250 = "kineto/gpu/mi250_rocm_minitoy.json.gz"


# -- systolic: cycles ---------------------------------------------------------------------------


@pytest.mark.parametrize("n, scalesim", [(512, 14_303), (1024, 89_983), (2048, 622_079)])
def test_weight_stationary_matches_scalesim_v3(n, scalesim):
    """REFERENCE.md: SCALE-Sim v3, 128×128 weight-stationary, n³ GEMMs. By hand: 512³ →
    (256 + 128 + 512 − 2)·4·4 = 894·16 = 14,304; 1024³ → 1406·64 = 89,984; 2048³ →
    2430·256 = 622,080. Within ±1 of SCALE-Sim, which reports τ − 1 (the 0-based number of
    its last cycle)."""
    tau = gemm_cycles(n, n, n, 128, 128, "ws")
    assert abs(tau - scalesim) <= 1
    assert tau - 1 == scalesim
    assert tau == {512: 14_304, 1024: 89_984, 2048: 622_080}[n]


def test_dataflow_mappings():
    """SCALE-Sim's operand mapping (systolic_compute_{ws,is,os}.py set_params): the ifmap
    operand is M×K, the filter K×N. ws: Sr = K, Sc = N, T = M; is: Sr = K, Sc = M, T = N;
    os: Sr = M, Sc = N, T = K."""
    assert mapping("ws", 5, 7, 9) == (7, 9, 5)
    assert mapping("is", 5, 7, 9) == (7, 5, 9)
    assert mapping("os", 5, 7, 9) == (5, 9, 7)


@pytest.mark.parametrize(
    "r, c, m, k, n, ws, is_, os_",
    [
        # no fold: 4×4 array, 4³. ws/is: 2·4 + 4 + 4 − 2 = 14; os: 4 + 4 + 4 − 2 = 10
        (4, 4, 4, 4, 4, 14, 14, 10),
        # folds, 4×4, M=5 K=7 N=9.
        # ws: Sr=K=7 → 2 row folds, Sc=N=9 → 3 col folds, T=M=5: (8+4+5−2)=15 · 6 = 90
        # is: Sr=K=7 → 2, Sc=M=5 → 2, T=N=9: (8+4+9−2)=19 · 4 = 76
        # os: Sr=M=5 → 2, Sc=N=9 → 3, T=K=7: (4+4+7−2)=13 · 6 = 78
        (4, 4, 5, 7, 9, 90, 76, 78),
        # a 2×3 array (rows ≠ cols), M=5 K=4 N=7.
        # ws: Sr=4 → 2, Sc=7 → 3, T=5: (4+3+5−2)=10 · 6 = 60
        # is: Sr=4 → 2, Sc=5 → 2, T=7: (4+3+7−2)=12 · 4 = 48
        # os: Sr=5 → 3, Sc=7 → 3, T=4: (2+3+4−2)=7 · 9 = 63
        (2, 3, 5, 4, 7, 60, 48, 63),
        # smaller than the array in every dimension, 4×4, M=3 K=2 N=6 (N folds, K does not).
        # ws: Sr=2 → 1, Sc=6 → 2, T=3: (8+4+3−2)=13 · 2 = 26
        # is: Sr=2 → 1, Sc=3 → 1, T=6: (8+4+6−2)=16 · 1 = 16
        # os: Sr=3 → 1, Sc=6 → 2, T=2: (4+4+2−2)=8 · 2 = 16
        (4, 4, 3, 2, 6, 26, 16, 16),
    ],
)
def test_cycles_by_hand(r, c, m, k, n, ws, is_, os_):
    assert gemm_cycles(m, k, n, r, c, "ws") == ws
    assert gemm_cycles(m, k, n, r, c, "is") == is_
    assert gemm_cycles(m, k, n, r, c, "os") == os_


# -- systolic: bytes and time -------------------------------------------------------------------


def test_bytes_when_everything_fits():
    """4³ at 2 bytes: A = B = C = 32 bytes; 96 ≤ SRAM: each once."""
    arr = SystolicArray(rows=4, cols=4, sram_bytes=1000)
    assert gemm_bytes(4, 4, 4, 2, arr) == 96


@pytest.mark.parametrize("dataflow, expected", [("ws", 384), ("is", 384), ("os", 320)])
def test_bytes_when_nothing_fits(dataflow, expected):
    """8³ at 1 byte on 4×4 with 150 bytes of SRAM: A = B = C = 64, 192 > 150, a third is 50,
    no operand fits. ws: A·⌈N/C⌉ = 128, B once = 64, C partial sums over ⌈K/R⌉ = 2 row folds:
    64·(2·2 − 1) = 192 → 384. is: A once 64, B·⌈M/C⌉ = 128, C 192 → 384. os: A·⌈N/C⌉ =
    128, B·⌈M/R⌉ = 128, C once 64 → 320."""
    arr = SystolicArray(rows=4, cols=4, sram_bytes=150, dataflow=dataflow)
    assert gemm_bytes(8, 8, 8, 1, arr) == expected


def test_bytes_operands_judged_alone():
    """8³ at 1 byte, 4×4 ws, SRAM 195: A + B + C = 192 ≤ 195, once each (192). SRAM 180: 192 >
    180 and a third is 60 < 64: as in the case above, 384. M=4, K=8, N=8 at 1 byte, SRAM 110:
    A = 32, B = 64, C = 32, 128 > 110, a third is 36.7: A fits (once, 32), B does not (ws reads
    it once anyway, 64), C fits (once, 32) → 128."""
    assert gemm_bytes(8, 8, 8, 1, SystolicArray(rows=4, cols=4, sram_bytes=195)) == 192
    assert gemm_bytes(8, 8, 8, 1, SystolicArray(rows=4, cols=4, sram_bytes=180)) == 384
    assert gemm_bytes(4, 8, 8, 1, SystolicArray(rows=4, cols=4, sram_bytes=110)) == 128


def test_time_is_the_slower_of_compute_and_memory():
    """8³ ws on 4×4 at 1 GHz: (8 + 4 + 8 − 2)·2·2 = 72 cycles = 72 ns. With 150 bytes of SRAM
    it moves 384 bytes: at 1e9 B/s 384 ns (memory-bound); with two DMA engines of 1e8 B/s each
    the bandwidth is 2e8 B/s: 1920 ns. With all of it in SRAM (1 KB) and 1e12 B/s: 192 bytes
    take 0.192 ns, so compute (72 ns) sets the time. A batch of 3 triples everything."""
    arr = SystolicArray(rows=4, cols=4, clock_hz=1e9, sram_bytes=150, hbm_bandwidth=1e9)
    c = gemm_cost(Gemm(8, 8, 8), arr, itemsize=1)
    assert (c.cycles, c.bytes) == (72, 384)
    assert c.time_s == pytest.approx(384e-9) and c.bound == "memory"
    slow = SystolicArray(rows=4, cols=4, clock_hz=1e9, sram_bytes=150, hbm_bandwidth=1e9,
                         dma_engines=2, dma_bandwidth=1e8)  # fmt: skip
    assert slow.bandwidth == 2e8
    assert gemm_cost(Gemm(8, 8, 8), slow, itemsize=1).time_s == pytest.approx(1920e-9)
    big = SystolicArray(rows=4, cols=4, clock_hz=1e9, sram_bytes=1000, hbm_bandwidth=1e12)
    c = gemm_cost(Gemm(8, 8, 8), big, itemsize=1)
    assert c.time_s == pytest.approx(72e-9) and c.bound == "compute"
    c3 = gemm_cost(Gemm(8, 8, 8, count=3), big, itemsize=1)
    assert (c3.cycles, c3.bytes) == (216, 576)


def test_conv_to_gemm_by_im2col():
    """N=2, C_in=3, 5×5 output, 3×3 kernel, C_out=8: M = 2·25 = 50, K = 3·9 = 27, N = 8.
    Depthwise-like groups=4 on C_in=8, C_out=16: 4 GEMMs of M=50, K = 2·9 = 18, N = 4."""
    assert conv_gemm(2, 3, 8, (5, 5), (3, 3)) == Gemm(50, 27, 8, 1)
    assert conv_gemm(2, 8, 16, (5, 5), (3, 3), groups=4) == Gemm(50, 18, 4, 4)
    with pytest.raises(CostModelError, match="groups=3"):
        conv_gemm(2, 8, 16, (5, 5), (3, 3), groups=3)


def test_gemms_of_framework_ops():
    """Shapes as torch.profiler records them (Input Dims / Input type / Concrete Inputs)."""
    f = ["float"] * 3

    def g(name, dims, types=f, concrete=None, flops=None):
        return op_gemms(name, Call(dims, types, concrete), flops)

    assert g("aten::addmm", [[1000], [32, 2048], [2048, 1000]]) == ([Gemm(32, 2048, 1000)], None)
    assert g("aten::mm", [[16, 1], [1, 256]]) == ([Gemm(16, 1, 256)], None)
    assert g("aten::bmm", [[6, 4, 5], [6, 5, 7]]) == ([Gemm(4, 5, 7, 6)], None)
    assert g("aten::linear", [[8, 10, 64], [32, 64], [32]]) == ([Gemm(80, 64, 32)], None)
    # matmul broadcasts its batch dims: (2, 1, 4, 5)·(3, 5, 6) → 2·3 GEMMs of 4×5×6
    assert g("aten::matmul", [[2, 1, 4, 5], [3, 5, 6]]) == ([Gemm(4, 5, 6, 6)], None)
    # forward conv: x (2, 3, 7, 7), w (8, 3, 3, 3), stride 1, no padding → 5×5 output; its
    # FLOPs (flop_counter) 2·2·25·9·8·3 = 21,600 give M = 21,600 / (2·27·8) = 50
    conv = [[2, 3, 7, 7], [8, 3, 3, 3], [8], [], [], [], []]
    args = ["", "", "", "[1, 1]", "[0, 0]", "[1, 1]", "1"]
    assert g("aten::conv2d", conv, concrete=args, flops=21_600.0) == ([Gemm(50, 27, 8)], None)
    gem, why = g("aten::conv2d", conv, concrete=args[:6] + ["2"], flops=21_600.0)
    assert gem == [Gemm(50, 27, 4, 2)]  # groups 2: two GEMMs of C_out/2 (weight: C_in/g = 3)
    gem, why = g("aten::conv2d", conv)  # 2021: no Concrete Inputs, no FLOPs
    assert gem == [] and "Concrete Inputs" in why
    # backward: dgrad as col2im (M = N·∏out, K = C_out, N = C_in·∏k) and wgrad
    # (M = C_out, K = N·∏out, N = C_in·∏k); grad_output (2, 8, 5, 5), weight (8, 3, 3, 3)
    bw = [[2, 8, 5, 5], [2, 3, 7, 7], [8, 3, 3, 3]] + [[]] * 8
    concrete = ["", "", "", "[8]", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "1",
                "[True, True, False]"]  # fmt: skip
    assert g("aten::convolution_backward", bw, f * 3 + [""] * 8, concrete) == (
        [Gemm(50, 8, 27), Gemm(8, 50, 27)], None)  # fmt: skip
    # 2021: cudnn_convolution_backward_input(self_size, grad_output, weight, …)
    old = [[], [32, 2048, 7, 7], [2048, 512, 1, 1], [], [], [], [], [], [], []]
    assert g("aten::cudnn_convolution_backward_input", old,
             ["GenericList", "float", "float"]) == ([Gemm(1568, 2048, 512)], None)  # fmt: skip
    gem, why = g("aten::cudnn_convolution_backward_weight", old, ["GenericList", "float"])
    assert gem == [] and "weight size" in why
    assert g("aten::mm", []) == ([], NO_SHAPES)


def test_bad_array_settings():
    for bad in ({"dataflow": "xs"}, {"rows": 0}, {"cols": 2.5}, {"clock_hz": 0},
                {"hbm_bandwidth": -1}, {"dma_bandwidth": 0}):  # fmt: skip
        with pytest.raises(XpuprofError):
            SystolicArray(**bad)
    with pytest.raises(CostModelError, match="dataflow 'xs'"):
        SystolicArray(dataflow="xs")
    with pytest.raises(CostModelError, match="M, K, N ≥ 1"):
        gemm_cycles(0, 4, 4)


# -- systolic: pricing a replay graph -----------------------------------------------------------


def _systolic_trace(tb: TraceBuilder) -> None:
    """aten::mm 64³ fp32 launching two kernels (30 and 10 µs); aten::mm without shapes (one
    kernel, 5 µs); aten::add (one kernel, 8 µs); a kernel named like a GEMM with no launch."""
    dims = {"Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]}
    tb.step(0, ts=0, dur=200)
    tb.op("aten::mm", 1, 10, **dims)
    tb.launch("sm80_sgemm_64x64", ts=20, dur=30, launch_ts=2, launch_dur=1)
    tb.launch("splitKreduce_kernel", ts=50, dur=10, launch_ts=5, launch_dur=1)
    tb.op("aten::mm", 12, 5)
    tb.launch("sm80_sgemm_other", ts=60, dur=5, launch_ts=13, launch_dur=1)
    tb.op("aten::add", 18, 5, **{"Input Dims": [[64], [64], []],
                                 "Input type": ["float", "float", "Scalar"]})  # fmt: skip
    tb.launch("vectorized_elementwise_kernel", ts=65, dur=8, launch_ts=19, launch_dur=1)
    tb.kernel("cutlass_gemm_orphan", 80, 7, stream=7)


def test_systolic_prices_gemm_kernels_and_leaves_the_rest(tmp_path):
    """64³ ws on 128×128 at 1 GHz: Sr = Sc = 64 (one fold), T = 64: 256 + 128 + 64 − 2 =
    446 cycles = 446 ns; 3·64²·4 = 49,152 bytes at 1 TB/s = 49 ns: 446 ns. Its two kernels
    share it 30:10 → 334.5 → 334 (round half to even) and 111.5 → 112. The mm without shapes,
    the add and the orphan keep their measured 5, 8 and 7 µs."""
    tb = TraceBuilder(rank=0)
    _systolic_trace(tb)
    with tb.load(tmp_path) as trace:
        g = replay_graph(trace)
        sc = SystolicCosts(trace)
        d = sc.delays(g)
        ev = _events_by_name(trace)
        got = {n: int(d[_work_edge(g, i)]) for n, i in ev.items()}
        assert got["sm80_sgemm_64x64"] == 334 and got["splitKreduce_kernel"] == 112
        assert got["sm80_sgemm_other"] == 5000
        assert got["vectorized_elementwise_kernel"] == 8000
        assert got["cutlass_gemm_orphan"] == 7000
        assert len(sc.priced) == 1
        row = sc.priced.iloc[0]
        assert (row.cycles, row.bytes, row.time_ns, row.measured_ns, row.kernels) == (
            446, 49_152, 446.0, 40_000.0, 2)  # fmt: skip
        why = dict(zip(sc.unpriced["name"], sc.unpriced["reason"], strict=True))
        assert why["sm80_sgemm_other"] == NO_SHAPES
        assert "no launching framework op" in why["cutlass_gemm_orphan"]
        assert set(why) == {"sm80_sgemm_other", "cutlass_gemm_orphan"}
        # every other edge is the base model's
        other = np.ones(len(d), bool)
        other[[_work_edge(g, ev["sm80_sgemm_64x64"]), _work_edge(g, ev["splitKreduce_kernel"])]] = (
            False)  # fmt: skip
        assert (d[other] == g.edges.delay[other]).all()
        # output-stationary: (128 + 128 + 64 − 2) = 318 cycles, shared 30:10 → 238.5, 79.5
        os_ = SystolicCosts(trace, SystolicArray(dataflow="os")).delays(g)
        assert int(os_[_work_edge(g, ev["sm80_sgemm_64x64"])]) == 238
        assert int(os_[_work_edge(g, ev["splitKreduce_kernel"])]) == 80


def _events_by_name(trace) -> dict[str, int]:
    df = trace.sql("select id, name from events where level in ('kernel', 'memcpy', 'memset')")
    return dict(zip(df["name"], df["id"].astype(int), strict=True))


def _work_edge(g, event_id: int) -> int:
    (k,) = np.flatnonzero((g.edges.kind == DEVICE_WORK) & (g.edges.event == event_id))
    return int(k)


# -- systolic and roofline on the shared ResNet-50 trace (V100, 2021 format) ----------------------


@pytest.fixture(scope="module")
def resnet(tmp_path_factory, raw_json):
    import xpuprof

    path = shared(RESNET)
    store = tmp_path_factory.mktemp("costs") / "resnet.store"
    xpuprof.import_traces([path], store)
    with xpuprof.load(store) as trace:
        yield trace, _raw_kernels_by_op(raw_json(path)), replay_graph(trace)


def _raw_kernels_by_op(doc) -> dict[str, list[dict]]:
    """Kernels grouped by the name of the innermost op around the runtime call that launched
    them (same pid and tid, the op's span covering the call's), from the raw JSON."""
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    ops = defaultdict(list)
    for e in ev:
        if e.get("cat") in ("Operator", "cpu_op"):
            ops[(e["pid"], e["tid"])].append(e)
    for v in ops.values():
        v.sort(key=lambda e: e["ts"])
    starts = {k: np.array([e["ts"] for e in v]) for k, v in ops.items()}
    launcher = {}
    for r in ev:
        if r.get("cat") not in ("Runtime", "cuda_runtime") or "correlation" not in r["args"]:
            continue
        lst, st = ops.get((r["pid"], r["tid"]), []), starts.get((r["pid"], r["tid"]), [])
        i = int(np.searchsorted(st, r["ts"], "right")) - 1
        while i >= 0 and lst[i]["ts"] + lst[i]["dur"] < r["ts"] + r["dur"]:
            i -= 1  # an op that ended before the call: not around it; look further out
        if i >= 0:
            launcher[r["args"]["correlation"]] = lst[i]["name"]
    out = defaultdict(list)
    for k in ev:
        if k.get("cat") in ("Kernel", "kernel") and k["args"].get("correlation") in launcher:
            out[launcher[k["args"]["correlation"]]].append(k)
    return out


def test_systolic_on_resnet50(resnet):
    """The GEMMs the trace records shapes for: the 816 kernels of cudnn_convolution_backward_
    input (whose input gradient is col2im of grad_output and weight) and the 36 of mm/addmm,
    counted in the raw JSON. The forward convolutions (606 kernels) and the weight gradients
    (684) have no stride, padding or weight size (no Concrete Inputs in 2021): unpriced, said
    why. By hand, grad_output (32, 2048, 7, 7) with weight (2048, 512, 1, 1): M = 32·49 =
    1568, K = 2048, N = 512; 128×128 ws: Sr = 2048 → 16 folds, Sc = 512 → 4, T = 1568:
    (256 + 128 + 1568 − 2)·64 = 124,800 cycles. Weight (512, 512, 3, 3): K = 512, N = 4608,
    (1950)·4·36 = 280,800 cycles; A = 3.2 MB, B = 9.4 MB, C = 28.9 MB overflow the 24 MiB
    SRAM (a third: 8.4 MB): A once, B once (ws), C's partial sums 7 times (⌈512/128⌉ = 4 row
    folds: 2·4 − 1): 3,211,264 + 9,437,184 + 7·28,901,376 = 214,958,080 bytes."""
    trace, raw, g = resnet
    names = ("aten::cudnn_convolution_backward_input", "aten::addmm", "aten::mm")
    n_raw = sum(len(raw[n]) for n in names)
    assert (len(raw[names[0]]), n_raw) == (816, 852)
    sc = SystolicCosts(trace)
    d = sc.delays(g)
    assert int(sc.priced["kernels"].sum()) == n_raw
    assert set(sc.priced["name"]) == set(names)
    by_gemm = sc.priced.assign(g0=[x[0] for x in sc.priced["gemms"]])
    a = by_gemm[by_gemm.g0 == (1568, 2048, 512, 1)]
    b = by_gemm[by_gemm.g0 == (1568, 512, 4608, 1)]
    assert len(a) and (a.cycles == 124_800).all()
    assert len(b) and (b.cycles == 280_800).all() and (b.bytes == 214_958_080).all()
    reasons = sc.unpriced.groupby("op_name").size().to_dict()
    assert reasons == {"aten::cudnn_convolution": len(raw["aten::cudnn_convolution"]),
                       "aten::cudnn_convolution_backward_weight":
                       len(raw["aten::cudnn_convolution_backward_weight"])}  # fmt: skip
    assert (len(raw["aten::cudnn_convolution"]), len(raw["aten::cudnn_convolution_backward_weight"])
            ) == (606, 684)  # fmt: skip
    assert sc.unpriced["reason"].str.contains("Concrete Inputs").all()
    # priced kernels carry their op's modelled time, shared by measured duration
    dev = np.flatnonzero(g.edges.kind == DEVICE_WORK)
    changed = dev[d[dev] != g.edges.delay[dev]]
    assert abs(int(d[changed].sum()) - sc.priced["time_ns"].sum()) <= len(changed)


def test_roofline_identity_on_resnet50(resnet):
    """Calibrated on the trace, each class's model times on its own device (V100) sum to its
    measured total (η is built so), within rounding to whole ns per kernel. The conv class is
    the input gradients (the only convolutions with FLOPs in this 2021 trace): its measured
    total is the raw JSON's sum of their kernels, 130,967 µs."""
    trace, raw, g = resnet
    rc = RooflineCosts(trace)
    d = rc.delays(g)
    eff = rc.efficiencies.set_index("class")
    conv_us = sum(k["dur"] for k in raw["aten::cudnn_convolution_backward_input"])
    assert conv_us == 130_967
    assert eff.loc["conv", "measured_ns"] == conv_us * 1000
    _check_identity(rc, g, d)
    # an H100 keeps the inefficiency and is faster on every class
    h = RooflineCosts(trace, device="h100-sxm")
    dh = h.delays(g)
    assert (h.efficiencies["eta_compute"] == rc.efficiencies["eta_compute"]).all()
    priced = h.ops[h.ops["priced"]]
    assert (priced["predicted_ns"] < priced["own_ns"]).all()
    dev = np.flatnonzero(g.edges.kind == DEVICE_WORK)
    assert dh[dev].sum() < d[dev].sum()


def _check_identity(rc: RooflineCosts, g, d: np.ndarray) -> None:
    """Per class: Σ model delays of the priced device work == Σ its measured durations."""
    e = g.edges
    dev = np.flatnonzero((e.kind == DEVICE_WORK) & (e.event >= 0))
    ops = rc.ops.set_index("id")
    by_kernel = _launching_op_ids(rc, e.event[dev])
    cls = ops["class"].where(ops["priced"]).reindex(by_kernel).to_numpy(object)
    assert len(rc.efficiencies)
    for c in rc.efficiencies["class"]:
        s = cls == c
        assert s.any()
        measured = int(e.slack[dev[s]].sum())
        assert abs(int(d[dev[s]].sum()) - measured) <= s.sum() / 2 + 1, c
        assert measured == rc.efficiencies.set_index("class").loc[c, "measured_ns"]


def _launching_op_ids(rc: RooflineCosts, events: np.ndarray) -> np.ndarray:
    """The id of the op of ``rc.ops`` that launched each device event (-1: none), found here
    through the trace's tree (runtime call by correlation id, nearest op above it), not
    through the model's own mapping."""
    trace = rc.trace
    t = trace.tree(host_only=True)
    info = trace.sql("select id, part, correlation from events where level in ('kernel', "
                     "'memcpy', 'memset') and correlation is not null")  # fmt: skip
    pos = {int(i): k for k, i in enumerate(info["id"])}
    rows = np.array([pos.get(int(x), -1) for x in events])
    part = np.where(rows >= 0, info["part"].to_numpy(np.int64)[np.maximum(rows, 0)], -1)
    corr = np.where(rows >= 0, info["correlation"].to_numpy(np.int64)[np.maximum(rows, 0)], -1)
    call = t.host_calls(part, corr, runtime_only=True)
    mask = np.zeros(t.n, bool)
    r = t.rows_of(rc.ops["id"].to_numpy(np.int64))
    mask[r[r >= 0]] = True
    owner = t.nearest(mask, call, strict=True)
    return np.where(owner >= 0, t.ids[np.maximum(owner, 0)], -1)


@pytest.mark.parametrize("rel", [DLRM, MI250])
def test_roofline_identity_on_other_traces_with_shapes(tmp_path, rel):
    """The other shared GPU traces whose kernels' ops record shapes: DLRM (V100, 2023) and the
    ROCm MI250 toy; the identity holds per class, and the host↔device copies are listed as
    unpriced with their reason."""
    import xpuprof

    path = shared(rel)
    xpuprof.import_traces([path], tmp_path / "t.store")
    with xpuprof.load(tmp_path / "t.store") as trace:
        g = replay_graph(trace)
        rc = RooflineCosts(trace)
        d = rc.delays(g)
        _check_identity(rc, g, d)
        assert "matmul" in set(rc.efficiencies["class"])
        copies = rc.unpriced[rc.unpriced["name"].str.startswith("Memcpy HtoD")]
        assert len(copies) and copies["reason"].str.contains("host link").all()


def test_roofline_on_xla_ops_of_a_tpu_trace(tmp_path):
    """XPlane (TPU v6e, 4 chips): each XLA op with cost analysis is its own unit, of class
    ``xla:<HLO category>``, on the roofs the device plane reports (918 TFLOP/s,
    1,637.99 GB/s). Identity per class; copy-start is an asynchronous start (unpriced, said
    why). On a TPU v5p (459 TFLOP/s bf16, 2,765 GB/s: hardware/specs.py) each unit takes
    max(F/(η·459e12), B/(η·2.765e12)) with its class's η."""
    import xpuprof

    path = shared("xplane/tpu_v6e_4chip_inference.xplane.pb")
    xpuprof.import_traces([path], tmp_path / "tpu.store")
    with xpuprof.load(tmp_path / "tpu.store") as trace:
        g = replay_graph(trace)
        rc = RooflineCosts(trace)
        d = rc.delays(g)
        e = g.edges
        dev = np.flatnonzero((e.kind == DEVICE_WORK) & (e.event >= 0))
        ops = rc.ops.set_index("id")
        cls = ops["class"].where(ops["priced"]).reindex(e.event[dev]).to_numpy(object)
        assert set(rc.efficiencies["class"]) == {"xla:loop fusion", "xla:copy-done",
                                                 "xla:broadcast"}  # fmt: skip
        for c in rc.efficiencies["class"]:
            s = cls == c
            assert abs(int(d[dev[s]].sum()) - int(e.slack[dev[s]].sum())) <= s.sum() / 2 + 1
        priced = rc.ops[rc.ops["priced"]]
        assert (priced["peak_flops"] == 918e12).all()
        assert np.allclose(priced["peak_bandwidth"], 1637.99315e9)
        starts = rc.unpriced[rc.unpriced["name"].str.startswith("copy-start")]
        assert len(starts) == 2400
        assert set(starts["reason"]) <= {ASYNC_START, "its measured time is 0: nothing to scale"}
        v5p = RooflineCosts(trace, device="tpu-v5p")
        dv = v5p.delays(g)
        # every unit is memory-bound on its own roofs: one η per class
        assert (rc.efficiencies["eta_compute"] == rc.efficiencies["eta_memory"]).all()
        eta = rc.efficiencies.set_index("class")["eta_memory"]
        p = v5p.ops[v5p.ops["priced"]]
        want = np.fmax(p["flops"] / (p["class"].map(eta) * 459e12),
                       p["bytes"] / (p["class"].map(eta) * 2765e9)) * 1e9  # fmt: skip
        got = pd.Series(dv[dev], index=e.event[dev]).reindex(p["id"]).to_numpy(float)
        assert np.abs(got - want.to_numpy()).max() <= 0.5


# -- roofline: calibration and a device swap by hand ----------------------------------------------

A100_BF16, A100_FP32, A100_BW = 312e12, 19.5e12, 2039e9  # A100 SXM4 80GB datasheet (dense)
H100_BF16, H100_FP32, H100_BW = 989.5e12, 67e12, 3350e9  # H100 SXM datasheet (dense)
F1, B1 = 2 * 1024**3, 3 * 1024**2 * 2  # mm 1024³ bf16: 2·M·K·N; A + B + C
F2, B2 = 2 * 1024**2 * 8, (1024**2 + 2 * 1024 * 8) * 2  # mm 1024×1024 by 1024×8 bf16
F3, B3 = 1024**2, 3 * 1024**2 * 4  # add of two fp32 vectors of 2^20: 1 FLOP, 12 bytes each
T1, T2, T3 = 10e-6, 4e-6, 8e-6


def _gpu_trace(tmp_path):
    """On an A100: mm 1024³ bf16 (kernel 10 µs), mm 1024×1024×8 bf16 (4 µs), add of two
    2^20 fp32 vectors (8 µs)."""
    tb = TraceBuilder(rank=0, device_properties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    bf = ["c10::BFloat16", "c10::BFloat16"]
    tb.step(0, ts=0, dur=100)
    tb.op("aten::mm", 1, 7, **{"Input Dims": [[1024, 1024], [1024, 1024]], "Input type": bf})
    tb.launch("ampere_bf16_gemm", ts=10, dur=10, launch_ts=2, launch_dur=1)
    tb.op("aten::mm", 9, 5, **{"Input Dims": [[1024, 1024], [1024, 8]], "Input type": bf})
    tb.launch("gemv_bf16", ts=20, dur=4, launch_ts=10, launch_dur=1)
    tb.op("aten::add", 15, 5, **{"Input Dims": [[1048576], [1048576], []],
                                 "Input type": ["float", "float", "Scalar"]})  # fmt: skip
    tb.launch("vectorized_elementwise_kernel", ts=24, dur=8, launch_ts=16, launch_dur=1)
    return tb.load(tmp_path)


def test_roofline_calibration_and_swap_by_hand(tmp_path):
    """matmul: the big mm is compute-bound on the A100 (F/P = 6.883 µs ≥ B/W = 3.086 µs), the
    skinny one memory-bound (0.054 µs < 1.045 µs). η_c⁰ = 6.883/10 = 0.6883, η_m⁰ =
    1.045/4 = 0.2611; at those the big mm's memory term (11.815 µs) exceeds its compute term
    (10 µs), so s = (11.815 + 4)/14 = 1.1297: η_c = 0.7775, η_m = 0.2950, and the two mm
    take 10.459 + 3.541 = 14 µs, as measured. elementwise: η = (12,582,912 B / 2039 GB/s) /
    8 µs = 0.7714. On an H100 (bf16 989.5 TF/s, 3.35 TB/s) all three are memory-side: 6,366,
    2,155 and 4,869 ns."""
    with _gpu_trace(tmp_path) as trace:
        ec0, em0 = F1 / A100_BF16 / T1, B2 / A100_BW / T2
        s = (max(F1 / A100_BF16 / ec0, B1 / A100_BW / em0)
             + max(F2 / A100_BF16 / ec0, B2 / A100_BW / em0)) / (T1 + T2)  # fmt: skip
        ec, em = s * ec0, s * em0
        e3 = B3 / A100_BW / T3
        assert s == pytest.approx(1.1296703)
        rc = RooflineCosts(trace)
        eff = rc.efficiencies.set_index("class")
        assert eff.loc["matmul", "eta_compute"] == pytest.approx(ec)
        assert eff.loc["matmul", "eta_memory"] == pytest.approx(em)
        etas = eff.loc["elementwise", ["eta_compute", "eta_memory"]].tolist()
        assert etas == pytest.approx([e3, e3])
        g = replay_graph(trace)
        ev = _events_by_name(trace)
        k1, k2, k3 = (_work_edge(g, ev[n]) for n in ("ampere_bf16_gemm", "gemv_bf16",
                                                      "vectorized_elementwise_kernel"))  # fmt: skip
        d = rc.delays(g)
        own1 = max(F1 / (ec * A100_BF16), B1 / (em * A100_BW)) * 1e9
        own2 = max(F2 / (ec * A100_BF16), B2 / (em * A100_BW)) * 1e9
        assert (int(d[k1]), int(d[k2])) == (round(own1), round(own2)) == (10_459, 3_541)
        assert int(d[k1] + d[k2]) == 14_000 and int(d[k3]) == 8_000
        h = RooflineCosts(trace, device="h100-sxm").delays(g)
        want = [max(F1 / (ec * H100_BF16), B1 / (em * H100_BW)),
                max(F2 / (ec * H100_BF16), B2 / (em * H100_BW)),
                max(F3 / (e3 * H100_FP32), B3 / (e3 * H100_BW))]  # fmt: skip
        assert [int(h[k]) for k in (k1, k2, k3)] == [round(w * 1e9) for w in want]
        assert [int(h[k]) for k in (k1, k2, k3)] == [6_366, 2_155, 4_869]
        # given efficiencies: matmul η_c = 0.5, η_m = 1 makes the big mm compute-bound:
        # A100: 6.883/0.5 = 13,766 ns; H100: 2·1024³/(0.5·989.5e12) = 4,341 ns
        given = RooflineCosts(trace, efficiencies={"matmul": (0.5, 1.0)})
        assert int(given.delays(g)[k1]) == round(F1 / (0.5 * A100_BF16) * 1e9) == 13_766
        gh = RooflineCosts(trace, device="h100-sxm", efficiencies={"matmul": (0.5, 1.0)})
        assert int(gh.delays(g)[k1]) == round(F1 / (0.5 * H100_BF16) * 1e9) == 4_341
        assert gh.efficiencies.set_index("class").loc["matmul", "source"] == "given"
        # other work priced on the target (a transform's new FLOPs and bytes)
        model = RooflineCosts(trace, device="h100-sxm")
        twice = max(2 * F1 / (ec * H100_BF16), 2 * B1 / (em * H100_BW)) * 1e9
        assert model.time_ns("matmul", 2 * F1, 2 * B1, "bf16") == pytest.approx(twice)


def test_roofline_bad_input(tmp_path):
    with _gpu_trace(tmp_path) as trace:
        with pytest.raises(CostModelError, match="unknown device 'a200'.*h100-sxm"):
            RooflineCosts(trace, device="a200")
        with pytest.raises(CostModelError, match="no priced op of class 'attention'.*matmul"):
            RooflineCosts(trace, efficiencies={"attention": 0.5})
        with pytest.raises(CostModelError, match="must be > 0"):
            RooflineCosts(trace, efficiencies={"matmul": -1})
        with pytest.raises(CostModelError, match="no calibrated class 'conv'"):
            RooflineCosts(trace).time_ns("conv", 1.0, 1.0)


def test_roofline_without_shapes_prices_nothing_and_says_why(tmp_path):
    """Ops without Input Dims have no FLOPs: no class, every kernel unpriced with the
    record_shapes hint, and the graph's delays are the measured ones."""
    tb = TraceBuilder(rank=0, device_properties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    tb.op("aten::mm", 1, 7)
    tb.launch("ampere_sgemm", ts=10, dur=10, launch_ts=2, launch_dur=1)
    with tb.load(tmp_path) as trace:
        g = replay_graph(trace)
        rc = RooflineCosts(trace)
        d = rc.delays(g)
        assert len(rc.efficiencies) == 0
        assert (d == g.edges.delay).all()
        assert rc.unpriced["reason"].tolist() == [NO_OP]
        assert "record_shapes" in NO_OP


# -- roofline: CPU ops --------------------------------------------------------------------------


def test_roofline_prices_cpu_ops_through_their_host_time(tmp_path):
    """A CPU trace: mm 256³ fp32 (0–100 µs, with an aten::empty child 10–15 µs) and add of two
    2^16 fp32 vectors (110–130 µs), on a CPU given as 1 TFLOP/s, 100 GB/s. mm: F/P = 33.55 µs
    ≥ B/W = 7.86 µs, η = 0.3355; add: B/W = 7.86 µs, η = 0.3932. Alone in their classes, each
    takes its measured time on its own device. On a CPU twice as fast in both, every host
    edge inside them halves: mm's 10 + 5 + 85 µs → 5 + 2.5 + 42.5, add's 20 → 10."""
    own = DeviceSpec(key="test-cpu", name="test CPU", vendor="", kind="cpu",
                     flops={"fp32": 1e12}, memory_bandwidth=1e11)  # fmt: skip
    fast = DeviceSpec(key="test-cpu-2x", name="test CPU 2x", vendor="", kind="cpu",
                      flops={"fp32": 2e12}, memory_bandwidth=2e11)  # fmt: skip
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=140)
    tb.op("aten::mm", 0, 100, **{"Input Dims": [[256, 256], [256, 256]],
                                 "Input type": ["float", "float"]})  # fmt: skip
    tb.op("aten::empty", 10, 5)
    tb.op("aten::add", 110, 20, **{"Input Dims": [[65536], [65536], []],
                                   "Input type": ["float", "float", "Scalar"]})  # fmt: skip
    with tb.load(tmp_path) as trace:
        g = replay_graph(trace)
        same = RooflineCosts(trace, own_device=own)
        eff = same.efficiencies.set_index("class")
        assert eff.loc["matmul", "eta_compute"] == pytest.approx(2 * 256**3 / 1e12 / 100e-6)
        assert eff.loc["elementwise", "eta_memory"] == pytest.approx(3 * 65536 * 4 / 1e11 / 20e-6)
        assert (same.delays(g) == g.edges.delay).all()
        d = RooflineCosts(trace, device=fast, own_device=own).delays(g)
        hw_ = np.flatnonzero(g.edges.kind == HOST_WORK)
        names = dict(zip(*trace.sql("select id, name from events").to_dict("list").values(),
                         strict=True))  # fmt: skip
        got = sorted((names[int(g.edges.event[k])], int(g.edges.delay[k]), int(d[k]))
                     for k in hw_ if g.edges.event[k] >= 0 and names[int(g.edges.event[k])]
                     in ("aten::mm", "aten::empty", "aten::add"))  # fmt: skip
        assert got == [("aten::add", 20_000, 10_000), ("aten::empty", 5_000, 2_500),
                       ("aten::mm", 10_000, 5_000), ("aten::mm", 85_000, 42_500)]  # fmt: skip
        assert math.isclose(RooflineCosts(trace, own_device=own).time_ns(
            "matmul", 2e6, 0.0), 2e6 / (eff.loc["matmul", "eta_compute"] * 1e12) * 1e9)  # fmt: skip

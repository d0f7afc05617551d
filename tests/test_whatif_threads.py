"""What-if ``threads=N`` and ``dtype=…`` (``sim/transforms/threads.py``, ``dtype.py``).

threads: a synthetic CPU trace whose changed op times are worked out by hand from ATen's grain
size and the model's serial part; a real 2-thread capture of a small MLP (the count recorded
by ``xpuprof.profile``, the identity at 2 threads, host time outside ops and ops below the
grain size untouched, GEMMs slower with 1 thread); bad input.

dtype: a synthetic A100 trace with an fp32 GEMM (its bf16 and tf32 times from the datasheet
peaks of ``hardware/specs.py``); the shared ResNet-50 V100 trace (fp16: the V100 has no bf16)
with the GEMM kernels found from the raw JSON; a CPU trace and a device without the precision
are errors. Synthetic traces are in µs (Kineto's unit), the replay in ns.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import xpuprof
from tests.builders import TraceBuilder
from tests.conftest import shared
from xpuprof.core.errors import XpuprofError
from xpuprof.hardware.specs import SPECS
from xpuprof.sim.graph import DEVICE_WORK, HOST_GAP, HOST_WORK
from xpuprof.sim.whatif import parse, whatif

US = 1000
F32 = ["float", "float"]


# -- threads: synthetic, by hand ----------------------------------------------------------------


def _cpu_trace(capture: dict | None = None) -> TraceBuilder:
    """A CPU step 0–1000 µs, with 2 threads and 4 CPUs recorded (unless ``capture`` says
    otherwise):

    - ``aten::mm`` 512×512 · 512×512 at 10–610 (600 µs): 512³ = 134M multiply-adds ≥ 2¹⁸,
      threaded;
    - ``aten::add`` of 1,000 elements at 620–640 (20 µs): below the grain (32,768), serial;
    - ``aten::add`` of 65,536 elements at 650–710 (60 µs): two grains;
    - ``aten::view`` at 720–722 (2 µs): no work, serial.

    Serial parts: ``aten::add``'s own, from its serial instance, 20 µs; ``aten::mm`` has no
    serial instance: the median of the serial ops (20 and 2 µs), 11 µs."""
    tb = TraceBuilder(rank=0, xpuprof_capture=capture if capture is not None
                      else {"threads": 2, "cpus": 4})  # fmt: skip
    tb.step(0, ts=0, dur=1000)
    tb.op("aten::mm", 10, 600, **{"Input Dims": [[512, 512], [512, 512]], "Input type": F32})
    tb.op("aten::add", 620, 20, **{"Input Dims": [[1000], [1000], []],
                                   "Input type": [*F32, "Scalar"]})  # fmt: skip
    tb.op("aten::add", 650, 60, **{"Input Dims": [[65536], [65536], []],
                                   "Input type": [*F32, "Scalar"]})  # fmt: skip
    tb.op("aten::view", 720, 2, **{"Input Dims": [[64, 1024], []],
                                   "Input type": ["float", "ScalarList"]})  # fmt: skip
    return tb


def _own(trace, w, delay: np.ndarray) -> dict[tuple[str, float], int]:
    """Own time (ns) per (op name, start µs) under ``delay``: its host_work edges."""
    ev = trace.sql("select id, name, ts from events where level = 'op'")
    g = w.baseline.graph
    e = g.edges
    out = {}
    for i, name, ts in ev.itertuples(index=False):
        pick = (e.kind == HOST_WORK) & (e.event == i)
        out[(name, round(ts / US))] = int(delay[pick].sum())
    return out


def _changed_delays(trace, changes: list[str]) -> tuple[object, np.ndarray]:
    """The what-if and its changed delays (the baseline graph's edges)."""
    from xpuprof.sim import transforms
    from xpuprof.sim.whatif import _cpus, _Names

    w = whatif(trace, changes)
    g = w.baseline.graph
    d = g.edges.delay.copy()
    ctx = transforms.Context(trace, g, _Names(trace, g), d, np.ones(len(g.edges), bool),
                             _cpus(trace))  # fmt: skip
    for c in changes:
        pc = parse(c)
        transforms.module(pc.verb).apply(pc, ctx)
    return w, d


def test_threads_by_hand(tmp_path):
    """threads=1: mm 11 + 589·2/1 = 1,189 µs; the 2-grain add 20 + 40·min(2,2)/min(1,2) =
    100 µs; the small add and the view as measured. The host-bound step grows by 589 + 40:
    1,629 µs. threads=4 (4 CPUs): mm 11 + 589·2/4 = 305.5 µs; the add has only two grains:
    60 µs. threads=8 is bounded at the 4 CPUs: the same."""
    with _cpu_trace().load(tmp_path) as t:
        w, d = _changed_delays(t, ["threads=1"])
        got = _own(t, w, d)
        assert got == {("aten::mm", 10): 1_189_000, ("aten::add", 620): 20_000,
                       ("aten::add", 650): 100_000, ("aten::view", 720): 2_000}  # fmt: skip
        assert w.steps["predicted_ns"].iloc[0] == 1_629 * US
        assert w.steps["baseline_ns"].iloc[0] == 1_000 * US
        for n in (4, 8):
            w, d = _changed_delays(t, [f"threads={n}"])
            got = _own(t, w, d)
            assert got[("aten::mm", 10)] == 305_500
            assert got[("aten::add", 650)] == 60_000
            assert w.steps["predicted_ns"].iloc[0] == (1_000 - 294.5) * US
        assert "bounded at the CPUs" in whatif(t, ["threads=8"]).notes[0]


def test_threads_keep_host_gaps_and_small_ops(tmp_path):
    """Everything but the two parallel ops keeps its delay exactly: host gaps, the step's own
    time between ops, the serial ops; the recorded count is the identity."""
    with _cpu_trace().load(tmp_path) as t:
        w, d = _changed_delays(t, ["threads=1"])
        g = w.baseline.graph
        e = g.edges
        ids = t.sql("select id from events where name in ('aten::mm') or (name = 'aten::add' "
                    "and ts > 645000)")["id"].to_numpy()  # fmt: skip
        moved = (e.kind == HOST_WORK) & np.isin(e.event, ids)
        assert moved.sum() == 2
        assert (d[~moved] == e.delay[~moved]).all()
        assert ((e.kind == HOST_GAP) | (e.kind == HOST_WORK)).sum() > moved.sum()
        same, d2 = _changed_delays(t, ["threads=2"])
        assert (d2 == e.delay).all()
        assert (same.steps["predicted_ns"] == same.steps["baseline_ns"]).all()


def test_threads_bad_input(tmp_path):
    for bad, says in (("threads=0", "≥ 1"), ("threads=x", "not a whole number"),
                      ("threads=1.5", "not a whole number"), ("threads", "how many"),
                      ("threads:mm=1", "no pattern"), ("threads=0:1", "≥ 1")):  # fmt: skip
        with pytest.raises(XpuprofError, match=says):
            parse(bad)
    c = parse("threads=2:1")
    assert (c.factor, c.option("old")) == (1.0, 2)
    # no recorded count: say OLD; said, it is the recorded one's prediction
    with _cpu_trace(capture={}).load(tmp_path / "none") as t:
        with pytest.raises(XpuprofError, match=r"does not record the intra-op thread count.*"
                           r"threads=OLD:1"):  # fmt: skip
            whatif(t, ["threads=1"])
        assert whatif(t, ["threads=2:1"]).steps["predicted_ns"].iloc[0] == 1_629 * US
    # no shapes: nothing can be told parallel
    tb = TraceBuilder(rank=0, xpuprof_capture={"threads": 2, "cpus": 2})
    tb.step(0, ts=0, dur=100)
    tb.op("aten::mm", 10, 60)
    with tb.load(tmp_path / "noshape") as t:
        with pytest.raises(XpuprofError, match="record_shapes=True"):
            whatif(t, ["threads=1"])


# -- threads: a real capture --------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp_2_threads(tmp_path_factory):
    """A small MLP (256 → 512 → 512 → 10, batch 64) trained 2 steps with 2 intra-op threads,
    captured by ``xpuprof.profile(level="op", record_shapes=True)``."""
    torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    store = tmp_path_factory.mktemp("threads") / "mlp.store"
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                    torch.nn.Linear(512, 10))  # fmt: skip
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        with xpuprof.profile(store, level="op", steps=2, warmup=1, record_shapes=True,
                             telemetry=False):  # fmt: skip
            for i in range(3):
                xpuprof.step(i)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            xpuprof.step(3)
    finally:
        torch.set_num_threads(before)
    with xpuprof.load(store) as trace:
        yield trace


def test_the_capture_records_the_thread_count(mlp_2_threads):
    import os

    meta = mlp_2_threads.sources[0]["meta"]["xpuprof_capture"]
    assert meta["threads"] == 2
    assert meta["cpus"] == len(os.sched_getaffinity(0))


def test_threads_on_a_real_capture(mlp_2_threads):
    """With 1 thread: every edge outside the ops whose largest tensor has ≥ 32,768 elements or
    that are GEMMs of ≥ 2¹⁸ multiply-adds (read here from the raw args) keeps its delay; each
    such ``aten::mm``/``aten::addmm`` takes more than before and at most twice (2 threads,
    and as many CPUs, or fewer: then p(2) = 1 and nothing changes)."""
    import json

    t = mlp_2_threads
    w, d = _changed_delays(t, ["threads=1"])
    e = w.baseline.graph.edges
    ops = t.sql("select id, name, args from events where level = 'op'")
    big = []
    for i, name, args in ops.itertuples(index=False):
        a = json.loads(args or "{}")
        dims = [x for x in a.get("Input Dims", []) if x and all(isinstance(v, int) for v in x)]
        if name in ("aten::mm", "aten::addmm"):
            m, k = dims[-2] if name == "aten::addmm" else dims[0]
            n = dims[-1][1]
            big.append((i, name, m * k * n >= 2**18))
        elif any(math.prod(x) >= 32_768 for x in dims):
            big.append((i, name, True))
    maybe = np.isin(e.event, [i for i, _, _ in big])
    assert (d[~maybe] == e.delay[~maybe]).all()
    assert ((e.kind == HOST_GAP) & (d == e.delay)).sum() == (e.kind == HOST_GAP).sum()
    gemms = [i for i, n, b in big if n in ("aten::mm", "aten::addmm") and b]
    # per step 3 addmm (forward) and 5 mm (backward: the first layer's input needs no grad)
    assert len(gemms) == 16
    cpus = t.sources[0]["meta"]["xpuprof_capture"]["cpus"]
    for i in gemms:
        pick = (e.kind == HOST_WORK) & (e.event == i)
        before, after = int(e.delay[pick].sum()), int(d[pick].sum())
        if cpus >= 2:
            assert before < after <= 2 * before + pick.sum()
        else:
            assert after == before
    assert (d >= e.delay).all()  # fewer threads never make anything faster
    same, d2 = _changed_delays(t, ["threads=2"])
    assert (d2 == e.delay).all()


# -- dtype -------------------------------------------------------------------------------------


def _a100_fp32_trace(tmp_path):
    """On an A100 SXM4 80GB: an fp32 ``aten::mm`` 1024³ whose kernel runs 200 µs (10.7 TFLOP/s:
    below the fp32 peak, so fp32, not TF32) and an fp32 ``aten::add`` of 2²⁰ elements (8 µs)."""
    tb = TraceBuilder(rank=0, device_properties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    tb.step(0, ts=0, dur=300)
    tb.op("aten::mm", 1, 7, **{"Input Dims": [[1024, 1024], [1024, 1024]], "Input type": F32})
    tb.launch("ampere_sgemm_128x64_nn", ts=10, dur=200, launch_ts=2, launch_dur=1)
    tb.op("aten::add", 15, 5, **{"Input Dims": [[1048576], [1048576], []],
                                 "Input type": [*F32, "Scalar"]})  # fmt: skip
    tb.launch("vectorized_elementwise_kernel", ts=210, dur=8, launch_ts=16, launch_dur=1)
    tb.runtime("cudaDeviceSynchronize", 21, 200)
    return tb.load(tmp_path)


def _kernel_delays(trace, w, d) -> dict[str, int]:
    names = dict(trace.sql("select id, name from events where level = 'kernel'").itertuples(
        index=False))  # fmt: skip
    e = w.baseline.graph.edges
    return {names[int(e.event[k])]: int(d[k]) for k in np.flatnonzero(e.kind == DEVICE_WORK)}


def test_dtype_on_a_compute_bound_gemm_by_hand(tmp_path):
    """The mm is compute-bound (F/P = 2·1024³ / 19.5e12 = 110.1 µs ≥ B/W = 12.6 MB / 2039 GB/s
    = 6.2 µs), alone in its class: η = 110.1/200. At bf16 its compute term is 110.1/η ·
    19.5/312 = 12.5 µs, its memory term (bytes halved) 5.6 µs: compute-bound still, so the
    kernel runs 200 · P_fp32 / P_bf16 µs, the peaks taken from the hardware table; TF32:
    200 · 19.5/156 = 25 µs. The add kernel is not a GEMM: unchanged (8 µs); it starts after
    the mm (10 + the mm's time) and not before its call at 16 µs + the trace's launch latency
    (8 µs, the mm's: call at 2, kernel at 10) = 24 µs. So the device work of the step ends at
    24 + 8 = 32 µs for bf16 and fp16 (186 µs earlier than 218), 35 + 8 = 43 µs for TF32
    (175 µs earlier)."""
    a100 = SPECS["a100-sxm4-80gb"].flops
    with _a100_fp32_trace(tmp_path) as t:
        for target, peak in (("bf16", a100["bf16"]), ("fp16", a100["fp16"]),
                             ("tf32", a100["tf32"])):  # fmt: skip
            w, d = _changed_delays(t, [f"dtype={target}"])
            k = _kernel_delays(t, w, d)
            want = round(200 * US * a100["fp32"] / peak)
            assert k == {"ampere_sgemm_128x64_nn": want, "vectorized_elementwise_kernel": 8 * US}
            assert want == {"bf16": 12_500, "fp16": 12_500, "tf32": 25_000}[target]
            shrink = w.steps["baseline_with_device_ns"] - w.steps["predicted_with_device_ns"]
            assert int(shrink.iloc[0]) == {"bf16": 186, "fp16": 186, "tf32": 175}[target] * US
        with pytest.raises(XpuprofError, match=r"matches no GEMM op; GEMM ops there: aten::mm"):
            whatif(t, ["dtype:conv=bf16"])
        w, d = _changed_delays(t, ["dtype:^aten::mm$=bf16"])
        assert _kernel_delays(t, w, d)["ampere_sgemm_128x64_nn"] == 12_500


def test_dtype_bad_input(tmp_path):
    for bad in ("dtype=int4", "dtype", "dtype=fp32"):
        with pytest.raises(XpuprofError, match="not a target precision"):
            parse(bad)
    assert parse("dtype:linear=bfloat16").option("dtype") == "bf16"
    assert parse("dtype=half").option("dtype") == "fp16"
    # a CPU trace: its GEMMs ran on the host
    with _cpu_trace().load(tmp_path / "cpu") as t:
        with pytest.raises(XpuprofError, match="GEMMs ran on the CPU"):
            whatif(t, ["dtype=bf16"])


RESNET = "kineto/gpu/resnet50_v100_2021/num_workers_0.pt.trace.json.gz"


def test_dtype_on_resnet50_v100(tmp_path, raw_json):
    """The shared ResNet-50 trace (V100 SXM2, fp32 GEMMs with shapes). bf16: the V100 has no
    bf16 tensor cores (hardware table: fp16 only): an error. fp16: the kernels of the input
    gradients (``cudnn_convolution_backward_input``, the convolutions with FLOPs in this 2021
    trace; they have FLOPs but no bytes, so they are compute-bound whatever η) run measured ×
    P_fp32/P_fp16 = 15.7/125; those of ``aten::mm``/``aten::addmm`` (the classifier, 32×2048 ·
    2048×1000: F/P = 131.072 MFLOP / 15.7 TF/s = 8.35 µs < B/W = 8.58 MB / 900 GB/s = 9.54 µs,
    memory-bound, one η for the class as all its ops are; at fp16 1.05 µs < 4.77 µs) run
    measured × 1/2. The kernels are found from the raw JSON (launching op by thread and time);
    every other kernel keeps its delay."""
    from tests.test_costs import _raw_kernels_by_op

    path = shared(RESNET)
    xpuprof.import_traces([path], tmp_path / "r.store")
    v100 = SPECS["v100-sxm2"].flops
    raw = _raw_kernels_by_op(raw_json(path))
    conv = {k["args"]["correlation"] for k in raw["aten::cudnn_convolution_backward_input"]}
    mm = {k["args"]["correlation"] for n in ("aten::mm", "aten::addmm") for k in raw[n]}
    assert (len(conv), len(mm)) == (816, 36)
    with xpuprof.load(tmp_path / "r.store") as t:
        with pytest.raises(XpuprofError, match=r"no bf16 tensor-core peak for NVIDIA V100"):
            whatif(t, ["dtype=bf16"])
        w, d = _changed_delays(t, ["dtype=fp16"])
        e = w.baseline.graph.edges
        corr = dict(t.sql("select id, correlation from events where level = 'kernel'")
                    .itertuples(index=False))  # fmt: skip
        dev = np.flatnonzero(e.kind == DEVICE_WORK)
        c = np.array([corr.get(int(x), -1) for x in e.event[dev]])
        is_conv, is_mm = np.isin(c, list(conv)), np.isin(c, list(mm))
        assert (is_conv.sum(), is_mm.sum()) == (816, 36)
        m = e.delay[dev]
        assert (d[dev[is_conv]] == np.rint(m[is_conv] * v100["fp32"] / v100["fp16"])).all()
        assert (d[dev[is_mm]] == np.rint(m[is_mm] * 0.5)).all()
        rest = ~(is_conv | is_mm)
        assert rest.sum() > 1000 and (d[dev[rest]] == m[rest]).all()
        others = np.setdiff1d(np.arange(len(e)), dev[~rest])
        assert (d[others] == e.delay[others]).all()


def test_dtype_bf16_on_the_mi250_toy(tmp_path, raw_json):
    """The shared ROCm MI250 toy (one GCD: fp32 matrix 45.25 TF/s, bf16 181.05 TF/s, 1.6 TB/s;
    fp32 GEMMs with shapes). Its two GEMM ops are memory-bound (``aten::mm``: F/P =
    163,840 / 45.25e12 = 3.6 ns < B/W = 70,656 / 1.6e12 = 44 ns; ``aten::linear`` alike),
    one η for the class; at bf16, 0.9 ns < 22 ns: memory-bound still, so the three kernels
    they launched (the ``addmm``'s bias copy and GEMM, the ``mm``'s GEMM: found from the raw
    JSON) run × 2/4; every other kernel keeps its delay; tf32: the MI250 has none, an error."""
    from tests.test_costs import _raw_kernels_by_op

    path = shared("kineto/gpu/mi250_rocm_minitoy.json.gz")
    raw = _raw_kernels_by_op(raw_json(path))
    gemm = {k["args"]["correlation"] for n in ("aten::mm", "aten::addmm") for k in raw[n]}
    assert len(gemm) == 3
    xpuprof.import_traces([path], tmp_path / "m.store")
    with xpuprof.load(tmp_path / "m.store") as t:
        with pytest.raises(XpuprofError, match=r"no tf32 tensor-core peak for AMD Instinct MI250"):
            whatif(t, ["dtype=tf32"])
        w, d = _changed_delays(t, ["dtype=bf16"])
        e = w.baseline.graph.edges
        corr = dict(t.sql("select id, correlation from events where level = 'kernel'")
                    .itertuples(index=False))  # fmt: skip
        dev = np.flatnonzero(e.kind == DEVICE_WORK)
        hit = np.isin([corr.get(int(x), -1) for x in e.event[dev]], list(gemm))
        assert hit.sum() == 3
        assert (d[dev[hit]] == np.rint(e.delay[dev[hit]] * 0.5)).all()
        assert (d[dev[~hit]] == e.delay[dev[~hit]]).all()

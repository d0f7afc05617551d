"""Roofline and the hardware table (``xpuprof.analysis.roofline``, ``xpuprof.hardware``).

The expected numbers are worked out by hand in the tests from the GEMM's dimensions and the
datasheet figures, or read from the raw JSON with the standard ``json`` module (the device names
of every shared trace, the CUPTI counters), never from xpuprof's own output.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from builders import TraceBuilder
from conftest import KINETO, SHARED_TRACES, kineto_files, read_trace_json, shared

import xpuprof
from xpuprof.analysis.roofline import roofline
from xpuprof.hardware import SPECS, calibrate, get, match

# -- the hardware table ------------------------------------------------------------------------


def test_every_spec_has_a_source_and_sane_numbers():
    assert len(SPECS) >= 20
    for s in SPECS.values():
        assert s.source, s.key
        assert s.memory_bandwidth > 1e11, s.key
        assert all(v > 1e11 for v in s.flops.values()), s.key
        # matrix rates are at least the vector rates of the same precision
        for vec, mat in (("fp64", "fp64_matrix"), ("fp32", "fp32_matrix"), ("fp32", "tf32")):
            if vec in s.flops and mat in s.flops:
                assert s.flops[mat] >= s.flops[vec], s.key


def test_dense_rates_are_half_the_sparse_datasheet_figures():
    # NVIDIA prints Tensor Core rates with sparsity: H100 SXM BF16 1,979*, FP8 3,958*, TF32 989*
    h = get("h100-sxm")
    assert h.flops["bf16"] == pytest.approx(1979e12 / 2)
    assert h.flops["fp8"] == pytest.approx(3958e12 / 2)
    assert h.flops["tf32"] == pytest.approx(989e12 / 2)
    # A100: 312 TFLOPS BF16 dense, 1,555 GB/s (40GB) and 2,039 GB/s (80GB SXM)
    assert get("a100-sxm4-80gb").flops["bf16"] == 312e12
    assert get("a100-sxm4-40gb").memory_bandwidth == 1555e9
    assert get("a100-sxm4-80gb").memory_bandwidth == 2039e9
    # MI250X: one GCD is half the package
    assert get("mi250x-gcd").flops["fp16"] == pytest.approx(get("mi250x").flops["fp16"] / 2)
    # TPUs: Cloud TPU pages, per chip
    assert get("tpu-v5e").flops["bf16"] == 197e12 and get("tpu-v6e").flops["bf16"] == 918e12


def test_peak_fallbacks():
    a100 = get("a100-sxm4-80gb")
    assert a100.peak("bf16") == (312e12, "bf16")
    assert a100.peak("fp32") == (19.5e12, "fp32")  # no fp32_matrix: CUDA cores
    assert a100.peak("fp32", matrix=False) == (19.5e12, "fp32")
    assert a100.peak("bf16", matrix=False) == (19.5e12, "fp32")  # vector work: fp32 rate
    assert a100.peak("fp64") == (19.5e12, "fp64_matrix")
    v100 = get("v100-sxm2")
    assert v100.peak("bf16") == (125e12, "fp16")  # no bf16 on Volta: the fp16 rate
    tpu = get("tpu-v5p")
    assert tpu.peak("fp32") == (459e12, "bf16")  # XLA default precision: bf16 passes
    assert a100.ridge("bf16") == pytest.approx(312e12 / 2039e9)


#: Every device name the shared Kineto traces carry, and the spec it must map to.
EXPECTED_NAMES = {
    "NVIDIA A100-PG509-200": "a100-sxm4-40gb",  # 42.3 GB totalGlobalMem: the 40GB part
    "Tesla V100-SXM2-32GB": "v100-sxm2",
    "Tesla V100-DGXS-32GB": "v100-sxm2",
    "AMD Radeon Graphics": "mi250-gcd",  # ROCm's generic name; 104 CUs, 64 GiB = one MI250 GCD
    "Quadro GP100": None,
    "ARTEMIS": None,  # MTIA
}


def test_match_names_from_the_brief():
    cases = {
        "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
        "NVIDIA A100-SXM4-40GB": "a100-sxm4-40gb",
        "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
        "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
        "Tesla V100-SXM2-32GB": "v100-sxm2",
        "Tesla V100-PCIE-16GB": "v100-pcie",
        "Tesla V100S-PCIE-32GB": "v100s-pcie",
        "NVIDIA H100 80GB HBM3": "h100-sxm",
        "NVIDIA H100 PCIe": "h100-pcie",
        "NVIDIA H100 NVL": "h100-nvl",
        "NVIDIA H200": "h200-sxm",
        "NVIDIA H200 NVL": "h200-nvl",
        "NVIDIA B200": "b200",
        "NVIDIA L4": "l4",
        "Tesla T4": "t4",
        "AMD Instinct MI300X": "mi300x",
        "AMD Instinct MI250X": "mi250x",
        "TPU v4": "tpu-v4",
        "TPU v5 lite": "tpu-v5e",
        "TPU v5e": "tpu-v5e",
        "TPU v5": "tpu-v5p",
        "TPU v5p": "tpu-v5p",
        "TPU v6 Lite": "tpu-v6e",
        "TPU v6e": "tpu-v6e",
        "NVIDIA L40S": None,
        "NVIDIA A10": None,
        "TPU v4 lite": None,
        "": None,
    }
    for name, key in cases.items():
        s = match(name)
        assert (s.key if s else None) == key, name
    # ROCm: one GCD of an MI250X reports 110 CUs and 64 GiB
    gcd = match("AMD Instinct MI250X", {"numSms": 110, "totalGlobalMem": 68702699520})
    assert gcd.key == "mi250x-gcd" and gcd.memory_bytes == 68702699520


def test_match_every_device_name_in_the_shared_traces():
    files = kineto_files()
    if not files:
        pytest.skip(f"{KINETO} not found")
    seen = set()
    for f in files:
        doc = read_trace_json(f)
        for props in doc.get("deviceProperties") or []:
            name = props.get("name")
            seen.add(name)
            assert name in EXPECTED_NAMES, f"{f.name}: new device name {name!r}: add it"
            s = match(name, props)
            assert (s.key if s else None) == EXPECTED_NAMES[name], (f.name, name)
            if s is not None:
                assert s.memory_bytes == props["totalGlobalMem"]
    assert {"NVIDIA A100-PG509-200", "Tesla V100-SXM2-32GB"} <= seen


def test_xplane_device_uses_the_plane_peaks(tmp_path):
    pb = SHARED_TRACES / "xplane" / "tpu_v6e_4chip_inference.xplane.pb"
    if not pb.exists():
        pytest.skip(f"{pb} not found")
    xpuprof.import_traces([pb], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        r = roofline(t, calibrate=False)
        dev = r["devices"]
        assert set(dev["key"]) == {"tpu-v6e"} and len(dev) == 4
        # XPlane plane stats: peak_teraflops_per_second 918, HBM 1637.99 GB/s
        assert dev["memory_bandwidth"].round(-6).unique().tolist() == [1637993000000.0]
        k = r["kernels"]
        assert len(k) and (k["source"] == "XLA cost analysis").all()
        # copies move bytes and do no FLOPs: memory-bound, % of roof = bandwidth share
        row = k[k["flops"] == 0].iloc[0]
        assert row["bound"] == "memory"
        assert row["pct_of_roof"] == pytest.approx(
            100 * row["bytes"] / (row["time_ns"] * 1e-9) / row["peak_bandwidth"]
        )


# -- a synthetic GEMM on a known device -------------------------------------------------------

M, K, N = 4096, 4096, 4096
GEMM_US = 1000  # kernel time, µs
ADD_SHAPE = (1024, 1024)
ADD_US = 10


def _gemm_trace(path: Path, dtype: str = "c10::BFloat16") -> Path:
    """aten::matmul → aten::mm → cudaLaunchKernel → GEMM kernel; aten::add → its kernel."""
    props = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920}]
    tb = TraceBuilder(rank=None, schemaVersion=1, device_properties=props)
    gemm = {"Input Dims": [[M, K], [K, N]], "Input type": [dtype, dtype]}
    tb.op("aten::matmul", 1000, 100, **gemm)
    tb.op("aten::mm", 1010, 80, **gemm)
    tb.launch("ampere_bf16_s16816gemm_bf16_256x128", 1100, GEMM_US, launch_ts=1020,
              correlation=7, flow=False)  # fmt: skip
    tb.op("aten::add", 1200, 20, **{"Input Dims": [list(ADD_SHAPE), list(ADD_SHAPE), []],
                                    "Input type": ["float", "float", "Scalar"],
                                    "Concrete Inputs": ["", "", "1"]})  # fmt: skip
    tb.launch("vectorized_elementwise_kernel", 2200, ADD_US, launch_ts=1205, correlation=8,
              flow=False)  # fmt: skip
    return tb.write(path)


@pytest.fixture
def gemm_trace(tmp_path):
    src = _gemm_trace(tmp_path / "gemm.json")
    xpuprof.import_traces([src], tmp_path / "s")
    t = xpuprof.load(tmp_path / "s")
    yield t
    t.close()


def test_gemm_by_hand(gemm_trace):
    r = roofline(gemm_trace, calibrate=False)
    ops = r["ops"].set_index("name")
    # the outer op carries the GEMM; its aten::mm child is not counted again
    assert "aten::mm" not in ops.index and set(ops.index) == {"aten::matmul", "aten::add"}
    g = ops.loc["aten::matmul"]
    flops = 2 * M * K * N  # 1.374e11
    nbytes = (M * K + K * N + M * N) * 2  # bf16 inputs read + output written
    intensity = flops / nbytes  # 1365.3 FLOP/byte
    achieved = flops / (GEMM_US * 1e-6)  # 1.374e14 FLOP/s
    peak, bw = 312e12, 2039e9  # A100 SXM4 80GB datasheet: BF16 Tensor Core dense, HBM2e
    assert g["flops"] == flops and g["bytes"] == nbytes
    assert g["dtype"] == "bf16" and g["peak_key"] == "bf16"
    assert g["time_ns"] == GEMM_US * 1000 and g["time_source"] == "device kernels"
    assert g["intensity"] == pytest.approx(intensity)
    assert g["ridge"] == pytest.approx(peak / bw)  # 153 FLOP/byte
    assert g["bound"] == "compute"
    assert g["roof"] == pytest.approx(peak)
    assert g["achieved_flops"] == pytest.approx(achieved)
    assert g["pct_of_roof"] == pytest.approx(100 * achieved / peak)  # 44.05 %
    assert g["pct_of_roof"] == pytest.approx(44.0509, abs=1e-3)

    a = ops.loc["aten::add"]
    n = ADD_SHAPE[0] * ADD_SHAPE[1]
    a_bytes = 3 * n * 4  # two fp32 inputs read, one output written
    assert a["flops"] == n and a["bytes"] == a_bytes
    assert a["bound"] == "memory" and a["peak_key"] == "fp32"
    bw_achieved = a_bytes / (ADD_US * 1e-6)  # 1.258e12 B/s
    assert a["achieved_bandwidth"] == pytest.approx(bw_achieved)
    assert a["roof"] == pytest.approx(n / a_bytes * bw)
    assert a["pct_of_roof"] == pytest.approx(100 * bw_achieved / bw)  # 61.7 %

    byname = r["by_name"].set_index("name")
    assert byname.loc["aten::matmul", "share_of_time"] == pytest.approx(
        100 * GEMM_US / (GEMM_US + ADD_US)
    )
    assert r["devices"]["key"].tolist() == ["a100-sxm4-80gb"]
    # the analysis states its answer itself: 1000 + 10 µs costed, the GEMM (compute-bound)
    # 1000/1010 = 99%, the add (memory-bound) 10/1010 = 1%
    assert r.facts["headline"] == (
        "Of 1.01 ms of costed work with a known roof: 99% compute-bound, 1% memory-bound"
    )


def test_gemm_against_another_device(gemm_trace):
    r = roofline(gemm_trace, device="h100-sxm", calibrate=False)
    g = r["ops"].set_index("name").loc["aten::matmul"]
    assert g["peak_flops"] == 989.5e12
    assert g["pct_of_roof"] == pytest.approx(100 * 2 * M * K * N / 1e-3 / 989.5e12)
    with pytest.raises(xpuprof.XpuprofError, match="unknown device"):
        roofline(gemm_trace, device="no-such-gpu")


def test_fp32_gemm_faster_than_fp32_peak_is_tf32(tmp_path):
    src = _gemm_trace(tmp_path / "gemm32.json", dtype="float")
    xpuprof.import_traces([src], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        r = roofline(t, calibrate=False)
        g = r["ops"].set_index("name").loc["aten::matmul"]
        # 1.374e14 FLOP/s is beyond fp32's 19.5e12: only TF32 Tensor Cores (156e12) get there
        assert g["dtype"] == "tf32" and g["peak_flops"] == 156e12
        assert any("TF32" in n for n in r.notes)


# -- CPU traces: the calibrated local CPU -------------------------------------------------------


def test_calibration_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    t0 = time.perf_counter()
    a = calibrate.local_cpu(quick=True)
    first = time.perf_counter() - t0
    assert first < 10
    files = list((tmp_path / "cache" / "xpuprof").glob("cpu-calibration-*.json"))
    assert len(files) == 1
    assert a.kind == "cpu" and a.flops["fp64"] > 1e8 and a.memory_bandwidth > 1e8
    t0 = time.perf_counter()
    b = calibrate.local_cpu()
    assert time.perf_counter() - t0 < 0.5
    assert b.flops == a.flops and b.memory_bandwidth == a.memory_bandwidth
    c = calibrate.local_cpu(refresh=True, quick=True)
    assert c.extra["calibration"]["seconds"] > 0


def test_cpu_trace_uses_the_calibration(example_store, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cpu = calibrate.local_cpu(quick=True)
    trace, _ = example_store
    r = roofline(trace, calibrate=True)
    ops = r["ops"]
    assert len(ops) and (ops["time_source"] == "op duration (host)").all()
    assert r["devices"]["key"].tolist() == ["local-cpu"]
    row = ops.dropna(subset=["bytes"]).iloc[0]
    t = row["time_ns"] * 1e-9
    peak = cpu.peak(row["dtype"], matrix=row["kind"] in ("matmul", "conv", "attention"))[0]
    want = 100 * max(row["flops"] / t / peak, row["bytes"] / t / cpu.memory_bandwidth)
    assert row["pct_of_roof"] == pytest.approx(want)
    assert any("calibrated CPU" in n for n in r.notes)


def test_cpu_trace_is_not_calibrated_unless_asked(example_store, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(Path, "home", lambda: tmp_path / "home")
    trace, _ = example_store
    r = roofline(trace)
    ops = r["ops"]
    assert len(ops) and (ops["time_source"] == "op duration (host)").all()
    assert ops["peak_flops"].isna().all() and ops["pct_of_roof"].isna().all()
    assert any("calibrate=True" in n for n in r.notes)
    dev = r["devices"]
    assert dev["key"].isna().all() and dev["source_of_match"].tolist() == [
        "local CPU, not calibrated"
    ]
    # nothing was measured, nothing was written anywhere
    assert not (tmp_path / "cache").exists() and not (tmp_path / "home").exists()
    # device="local-cpu" asks for this machine's CPU: measured once, cached in the user cache
    cpu = calibrate.local_cpu(quick=True)
    r = roofline(trace, device="local-cpu")
    assert r["devices"]["key"].tolist() == ["local-cpu"]
    assert r["ops"]["peak_flops"].notna().all()
    assert r["ops"]["peak_bandwidth"].eq(cpu.memory_bandwidth).all()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["xpuprof"]


# -- real GPU traces --------------------------------------------------------------------------


def test_cupti_counter_flops_from_raw_json(tmp_path):
    src = shared("kineto/gpu/a100_cupti_counters.json.gz")
    raw = [e for e in read_trace_json(src)["traceEvents"] if e.get("cat") == "cuda_profiler_range"]
    want = 0.0
    for e in raw:
        a = e["args"]
        for c in "dfh":
            p = "smsp__sass_thread_inst_executed_op_"
            want += (a[f"{p}{c}add_pred_on.sum"] + a[f"{p}{c}mul_pred_on.sum"]
                     + 2 * a[f"{p}{c}fma_pred_on.sum"])  # fmt: skip
    xpuprof.import_traces([src], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        r = roofline(t, calibrate=False)
        k = r["kernels"]
        assert len(k) == len(raw) == 77
        assert k["flops"].sum() == pytest.approx(want)
        assert k["time_ns"].isna().all()  # the range profiler's durations are not kernel times
        assert any("share one duration" in n for n in r.notes)
        # the fp16 kernel of the raw trace is classified fp16
        first = raw[0]["args"]
        assert first["smsp__sass_thread_inst_executed_op_hfma_pred_on.sum"] > 0
        assert set(k["dtype"]) <= {"fp32", "fp16", "fp64"}


def test_trace_without_shapes_says_so(tmp_path):
    src = shared("kineto/gpu/a100_rank0of2_nccl.json.gz")
    xpuprof.import_traces([src], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        r = roofline(t, calibrate=False)
        assert r["ops"].empty and r["kernels"].empty
        assert any("no framework-op FLOPs" in n for n in r.notes)
        assert "headline" not in r.facts


def test_unknown_device_is_a_note_not_a_number(tmp_path):
    src = shared("kineto/gpu/gp100_gpu_user_annotation.json.gz")
    xpuprof.import_traces([src], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        r = roofline(t, calibrate=False)
        ops = r["ops"]
        on_gpu = ops[ops["time_source"] == "device kernels"]
        assert on_gpu["peak_flops"].isna().all() and on_gpu["pct_of_roof"].isna().all()
        if len(on_gpu):
            assert any("Quadro GP100" in n for n in r.notes)


def test_every_shared_trace_runs_without_invented_numbers(tmp_path):
    files = kineto_files()
    if not files:
        pytest.skip(f"{KINETO} not found")
    xpuprof.import_traces([KINETO / "gpu"], tmp_path / "s", mixed=True)  # every kind of job
    with xpuprof.load(tmp_path / "s") as t:
        r = roofline(t, calibrate=False)
        ops = r["ops"]
        # a % of roof exists only where the time and the device's peak do
        has = ops["pct_of_roof"].notna()
        assert (ops.loc[has, "time_ns"] > 0).all() and ops.loc[has, "peak_flops"].notna().all()
        assert not math.isinf(ops["pct_of_roof"].fillna(0).max())

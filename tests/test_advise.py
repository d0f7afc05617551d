"""The advisor on traces built to trigger each rule, with the saving worked out by hand."""

from __future__ import annotations

import pytest
from builders import TraceBuilder

from xpuprof.advise.rules import advise


def run(tmp_path, build, **top):
    """Advice on one 1000 µs step holding what ``build(tb)`` adds (device work on stream 7 or
    9 of device 0)."""
    tb = TraceBuilder(rank=0, **top)
    tb.step(0, 0, 1000)
    build(tb)
    with tb.load(tmp_path) as t:
        return advise(t)


def test_input_wait_recommends_dataloader_workers(tmp_path) -> None:
    def build(tb):
        tb.kernel("k", 300, 700, stream=7)
        tb.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 300)

    res = run(tmp_path, build)
    rec = res["recommendations"].iloc[0]
    assert rec.rule == "input-bound" and "num_workers" in rec.recommendation
    assert rec.saved_fraction == pytest.approx(0.30)
    assert rec.saved_ms_per_step == pytest.approx(0.30)


def test_ranked_by_saving(tmp_path) -> None:
    # 10 % input, 40 % exposed all-reduce, 20 % device idle, 30 % compute. No host call is
    # linked to the device, so the critical path is the device's own timeline: the idle 20 %
    # has no known cause (device-idle, not "launch-bound": nothing shows a launch); compute is
    # not the largest part, so no device-bound finding
    def build(tb):
        tb.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 100)
        tb.kernel("gemm", 100, 300, stream=7)
        tb.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 400, 400, stream=9)

    res = run(tmp_path, build)
    recs = res["recommendations"]
    assert list(recs.rule) == ["communication", "device-idle", "input-bound"]
    assert list(recs.saved_fraction.round(3)) == [0.4, 0.2, 0.1]
    assert res.facts["recommendations"] == 3
    assert res.facts["saved_fraction"] == pytest.approx(0.4)


def test_fp32_gemms_on_an_a100(tmp_path) -> None:
    def build(tb):
        tb.kernel("ampere_sgemm_128x64_nn", 0, 500, stream=7)
        tb.kernel("void elementwise_kernel", 500, 500, stream=7)

    props = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]
    res = run(tmp_path, build, device_properties=props)
    rec = res["recommendations"].set_index("rule").loc["fp32-gemm"]
    # 500 us of fp32 GEMM at the bf16 matrix roof: 500 * (1 - 19.5/312) = 468.75 us
    assert rec.saved_ms_per_step == pytest.approx(0.46875)
    assert "autocast" in rec.recommendation and "bfloat16" in rec.recommendation
    assert "allow_tf32" in rec.recommendation  # A100 has TF32 tensor cores


def test_fp32_gemms_on_a_v100_advise_fp16_not_bf16_or_tf32(tmp_path) -> None:
    """A V100's tensor cores run fp16 only (no bf16, no TF32: NVIDIA's V100 datasheet): the
    advice and its price must be fp16's."""

    def build(tb):
        tb.kernel("volta_sgemm_128x64_nn", 0, 500, stream=7)
        tb.kernel("void elementwise_kernel", 500, 500, stream=7)

    props = [{"id": 0, "name": "Tesla V100-SXM2-32GB"}]
    res = run(tmp_path, build, device_properties=props)
    rec = res["recommendations"].set_index("rule").loc["fp32-gemm"]
    # 500 us of fp32 GEMM at the fp16 matrix roof: 500 * (1 - 15.7/125) = 437.2 us
    assert rec.saved_ms_per_step == pytest.approx(0.4372)
    assert "float16" in rec.recommendation and "GradScaler" in rec.recommendation
    assert "bfloat16" not in rec.recommendation and "tf32" not in rec.recommendation.lower()
    assert "fp16 matrix 125 TFLOP/s" in rec.evidence


def test_a_busy_device_gets_no_made_up_advice(tmp_path) -> None:
    # the device computes the whole step: the only finding says so (device-bound, pointing
    # at the kernels and the roofline) and claims no saving it cannot bound
    res = run(tmp_path, lambda tb: tb.kernel("gemm_tensorop", 0, 1000, stream=7))
    recs = res["recommendations"]
    assert list(recs.rule) == ["device-bound"] and recs.saved_ms_per_step.isna().all()
    assert res.facts["recommendations"] == 1 and res.facts["saved_fraction"] == 0.0
    # the one kernel covers the step, so the device's timeline charges all of it to that kernel
    headline = (
        "Bottleneck: device compute 1 ms per step (100%), most in `gemm_tensorop`, rank 0, step 0"
    )
    assert res.facts["headline"] == headline


def test_cpu_run_with_time_outside_ops_recommends_cutting_python_overhead(tmp_path) -> None:
    res = run(tmp_path, lambda tb: tb.op("aten::mm", 0, 600))  # no device: a CPU run
    rec = res["recommendations"].iloc[0]
    assert rec.rule == "python-overhead" and "torch.compile" in rec.recommendation
    assert rec.saved_fraction == pytest.approx(0.40)

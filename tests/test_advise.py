"""The advisor on traces built to trigger each rule, with the saving worked out by hand."""

from __future__ import annotations

import json

import pytest

import xpuprof
from xpuprof.advise.rules import advise


def _x(name, cat, ts, dur, pid=100, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def run(tmp_path, events, top=None):
    doc = {"traceEvents": [_x("ProfilerStep#0", "user_annotation", 0, 1000), *events],
           "distributedInfo": {"rank": 0}, **(top or {})}  # fmt: skip
    (tmp_path / "t.json").write_text(json.dumps(doc))
    xpuprof.import_traces([tmp_path / "t.json"], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        return advise(t)


def test_input_wait_recommends_dataloader_workers(tmp_path) -> None:
    res = run(tmp_path, [_x("k", "kernel", 300, 700, pid=0, tid=7),
                         _x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                            "user_annotation", 0, 300)])  # fmt: skip
    rec = res["recommendations"].iloc[0]
    assert rec.rule == "input-bound" and "num_workers" in rec.recommendation
    assert rec.saved_fraction == pytest.approx(0.30)
    assert rec.saved_ms_per_step == pytest.approx(0.30)


def test_ranked_by_saving(tmp_path) -> None:
    # 10 % input, 40 % exposed all-reduce, 20 % host idle, 30 % compute
    res = run(tmp_path, [
        _x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation",
           0, 100),
        _x("gemm", "kernel", 100, 300, pid=0, tid=7),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 400, 400, pid=0, tid=9),
    ])  # fmt: skip
    recs = res["recommendations"]
    assert list(recs.rule) == ["communication-not-hidden", "host-launch-bound", "input-bound"]
    assert list(recs.saved_fraction.round(3)) == [0.4, 0.2, 0.1]


def test_fp32_gemms_on_an_a100(tmp_path) -> None:
    props = {"deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]}
    res = run(tmp_path, [_x("ampere_sgemm_128x64_nn", "kernel", 0, 500, pid=0, tid=7),
                         _x("void elementwise_kernel", "kernel", 500, 500, pid=0, tid=7)],
              props)  # fmt: skip
    rec = res["recommendations"].set_index("rule").loc["fp32-gemm"]
    # 500 us of fp32 GEMM at the bf16 matrix roof: 500 * (1 - 19.5/312) = 468.75 us
    assert rec.saved_ms_per_step == pytest.approx(0.46875)
    assert "autocast" in rec.recommendation


def test_a_busy_device_gets_no_made_up_advice(tmp_path) -> None:
    res = run(tmp_path, [_x("gemm_tensorop", "kernel", 0, 1000, pid=0, tid=7)])
    assert res["recommendations"].empty
    assert "no rule found" in res.notes[0]


def test_cpu_run_with_time_outside_ops_recommends_cutting_python_overhead(tmp_path) -> None:
    res = run(tmp_path, [_x("aten::mm", "cpu_op", 0, 600)])  # no device: a CPU run
    rec = res["recommendations"].iloc[0]
    assert rec.rule == "python-overhead" and "torch.compile" in rec.recommendation
    assert rec.saved_fraction == pytest.approx(0.40)

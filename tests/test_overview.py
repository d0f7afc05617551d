"""The overview's per-step breakdown on a trace built so that every part is known by hand, and
the bottleneck rules on traces made to hit each of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import TraceBuilder

import xpuprof
from xpuprof.analysis.overview import overview


def test_breakdown_of_a_step_known_by_hand(tmp_path) -> None:
    # step [0, 100) µs; device: compute [10, 40), allreduce [30, 70), memcpy [60, 80);
    # host input span [85, 95) while the device idles. The host records framework ops (one
    # aten::add at [0, 5)), as an op-level capture does: without any, the time before the
    # step's first recorded span would count as input too (a step-level capture's loader)
    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 100)
    tb.op("aten::add", 0, 5)
    tb.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 85, 10)
    tb.kernel("gemm", 10, 30, stream=7)
    tb.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 40, stream=9)
    tb.memcpy("Memcpy HtoD", 60, 20, stream=8)
    with tb.load(tmp_path) as t:
        res = overview(t)
    s = res["steps"].iloc[0]
    got = {
        k: s[f"{k}_ns"] // 1000
        for k in ("compute", "communication", "memcpy", "memset", "other", "input", "host_idle")
    }
    assert got == {"compute": 30, "communication": 30, "memcpy": 10, "memset": 0, "other": 0,
                   "input": 10, "host_idle": 20}  # fmt: skip
    summ = res["summary"].iloc[0]
    assert summ.device_utilization == pytest.approx(0.70)
    # no launch links the host to the device, so the critical path is the device timeline:
    # compute 30 µs and the exposed all-reduce 30 µs tie, and the first category wins
    # (diagnosis.CATEGORIES' order): the device's own compute, no FLOPs known; each is one
    # kernel (gemm; the all-reduce), so "most in" names it
    assert summ.bottleneck == "device-bound"
    assert not summ.host_only
    headline = ("Bottleneck: device compute 30 µs per step (30%), most in `gemm`; "
                "communication 30 µs per step (30%), most in "
                "`ncclDevKernel_AllReduce_Sum_f32_RING_LL`, rank 0, step 0")  # fmt: skip
    assert res.facts == {"ranks": 1, "steps": 1, "host_only": False, "step_ms_mean": 0.1,
                         "bottleneck": "device-bound", "headline": headline}  # fmt: skip


@pytest.mark.parametrize(
    "events, want",
    [
        # the device idles 60 % of each step and nothing links a host call to it: the cause
        # of the idle time is not in the trace (no launch-bound guess without launches)
        ([("kernel", "k", 0, 40, 7)], "device idle (cause not linked)"),
        # a collective not hidden behind compute for 55 % of the step
        ([("kernel", "k", 0, 40, 7),
          ("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float", 40, 55, 9)],
         "communication-bound"),
        # input spans cover a quarter of the step while the device idles, compute the rest:
        # the largest part of the path is the device's work (the advisor still finds input)
        ([("kernel", "k", 0, 75, 7), ("annotation", "load_batch", 75, 25, None)],
         "device-bound"),
        # input spans cover 60 % of the step while the device idles
        ([("kernel", "k", 0, 40, 7), ("annotation", "load_batch", 40, 60, None)],
         "input-bound"),
        # the device is busy all the time: bound by the device itself (no FLOPs known)
        ([("kernel", "k", 0, 100, 7)], "device-bound"),
    ],
)  # fmt: skip
def test_bottleneck_rules(tmp_path, events, want) -> None:
    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 100)
    for kind, name, ts, dur, stream in events:
        if kind == "kernel":
            tb.kernel(name, ts, dur, stream=stream)
        else:
            tb.annotation(name, ts, dur)
    with tb.load(tmp_path) as t:
        assert overview(t)["summary"].bottleneck.iloc[0] == want


def test_cpu_run_uses_host_ops_and_says_so(tmp_path) -> None:
    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 100)
    tb.op("aten::mm", 0, 60)
    with tb.load(tmp_path) as t:
        res = overview(t)
    assert any("CPU run" in n for n in res.notes)
    assert res.facts["host_only"] is True and bool(res["summary"].host_only.iloc[0])
    s = res["steps"].iloc[0]
    assert s.compute_ns == 60_000 and s.host_idle_ns == 40_000


def test_overview_of_the_shipped_real_trace(tmp_path) -> None:
    example = Path(__file__).resolve().parents[1] / "src/xpuprof/data"
    xpuprof.import_traces([example / "example_cpu_train.pt.trace.json.gz"], tmp_path / "e")
    raw = json.loads(
        __import__("gzip").decompress((example / "example_cpu_train.pt.trace.json.gz")
                                      .read_bytes()))["traceEvents"]  # fmt: skip
    steps = sorted(e["dur"] for e in raw if e.get("name", "").startswith("ProfilerStep#"))
    with xpuprof.load(tmp_path / "e") as t:
        res = overview(t)
    summ = res["summary"].iloc[0]
    assert summ.steps == len(steps)
    assert summ.step_ms_mean == pytest.approx(sum(steps) / len(steps) / 1e3, rel=1e-6)
    parts = res["steps"][[c for c in res["steps"].columns if c.endswith("_ns") and
                          c != "step_ns"]].sum(axis=1)  # fmt: skip
    assert (parts == res["steps"].step_ns).all()  # the parts add up to each step


def test_a_tpu_host_has_one_row_per_chip(tmp_path) -> None:
    """The 4-chip TPU v6e XPlane file is one rank (one host process drives its chips) whose
    steps lie on each chip's own line: the overview gives one row per chip, each measured on
    that chip's steps and work, not the four merged into one row of 396 "steps"."""
    from conftest import shared

    xpuprof.import_traces([shared("xplane/tpu_v6e_4chip_inference.xplane.pb")], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        res = overview(t)
        want = t.sql(
            "select device, count(*) as n, avg(dur) / 1e6 as mean_ms from events "
            "where level = 'step' group by device order by device"
        )
        s = res["summary"].sort_values("device")
        assert s.device.tolist() == want.device.tolist() == [0, 1, 2, 3]
        assert s.steps.tolist() == want.n.tolist() == [99] * 4
        assert s.step_ms_mean.tolist() == pytest.approx(want.mean_ms.tolist())
        parts = [c for c in s.columns if c.endswith("_fraction")]
        assert s[parts].sum(axis=1).tolist() == pytest.approx([1.0] * 4)
        steps = res["steps"]
        assert len(steps) == 396 and steps.groupby("device").step.nunique().tolist() == [99] * 4
        assert res.present["summary"].label == "device"

"""The overview's per-step breakdown on a trace built so that every part is known by hand, and
the bottleneck rules on traces made to hit each of them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
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


def test_a_layer_level_capture_by_hand(tmp_path) -> None:
    """``xpuprof.profile(level="layer")`` as hand-written spans (µs): ``step#N`` spans of
    100 µs at 0, 200 and 450, each with a 50 µs ``model`` layer span (10, 10, 5 µs after
    the step starts). The batch is fetched between steps, so steps 1 and 2 start where step
    0 and step 1 end: windows of 100, 200 and 250 µs; input 10, 110 and 155 µs (the gap
    and the time before the layer span); compute 50 µs each (the layer spans: no op is
    recorded); the rest host-bound idle."""
    from captures import layer_level

    tb = TraceBuilder(rank=0)
    layer_level(tb)
    with tb.load(tmp_path) as t:
        res = overview(t)
    s = res["steps"]
    assert s.step_ns.tolist() == [100_000, 200_000, 250_000]
    assert s.input_ns.tolist() == [10_000, 110_000, 155_000]
    assert s.compute_ns.tolist() == [50_000] * 3
    assert s.host_idle_ns.tolist() == [40_000, 40_000, 45_000]
    summ = res["summary"].iloc[0]
    assert summ.input_fraction == pytest.approx(275 / 550)
    assert summ.compute_fraction == pytest.approx(150 / 550)
    assert summ.bottleneck == "input-bound"
    assert res.facts["headline"].startswith("Bottleneck: waiting for input")
    assert any("layer spans are its compute" in n for n in res.notes)


@pytest.mark.parametrize("slow", [True, False])
def test_a_real_layer_level_capture(tmp_path, slow) -> None:
    """The demo model fed by a DataLoader whose collate sleeps 30 ms (or not), captured at
    level ``layer``: the input share comes from the same step windows as the input tool's
    and the diagnosis' (each starts where its batch fetch starts), and the layer spans are
    the host's compute."""
    from captures import SLEEP_S, capture_layer_level

    from xpuprof.analysis.diagnosis import diagnosis
    from xpuprof.analysis.input_pipeline import input_pipeline

    store, waited = capture_layer_level(tmp_path, "with", SLEEP_S if slow else 0.0)
    with xpuprof.load(store) as t:
        res = overview(t)
        inp = input_pipeline(t)
        dx = diagnosis(t)
        layers = t.sql("select sum(dur) as ns from events where level = 'layer' and depth = 1")
    summ = res["summary"].iloc[0]
    steps = res["steps"]
    assert steps.step_ns.tolist() == inp["steps"].step_ns.tolist()
    assert steps.step_ns.tolist() == dx["steps"].step_ns.tolist()
    assert steps.input_ns.tolist() == inp["steps"].input_ns.tolist()
    assert summ.input_fraction == pytest.approx(inp.facts["input_fraction"])
    # compute: the top-level layer spans (the model's forward), not 0
    assert steps.compute_ns.sum() == layers.ns[0]
    if slow:  # the stopwatch: steps 1-5 each wait SLEEP_S (60 ms) of a ~70 ms window
        assert steps.input_ns.iloc[1:].sum() == pytest.approx(sum(waited[1:]) * 1e9, rel=0.1)
        assert summ.input_fraction > 0.4 and summ.bottleneck == "input-bound"
        assert res.facts["headline"] == dx.facts["headline"]
        assert res.facts["headline"].startswith("Bottleneck: waiting for input")
    else:
        assert summ.input_fraction < 0.05 and summ.bottleneck != "input-bound"


def test_top_tables_break_ties_by_name(tmp_path) -> None:
    """Kernels and ops with equal time come in name order, the same every run (SQL's
    ``order by … limit`` leaves ties in any order otherwise)."""
    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 100)
    for i, name in enumerate(("k_c", "k_a", "k_b")):
        tb.kernel(name, 10 + 20 * i, 10, stream=7)
        tb.op(f"aten::{name}", 10 + 20 * i, 5)
    with tb.load(tmp_path) as t:
        res = overview(t, top=2)
    assert res["top_kernels"].kernel.tolist() == ["k_a", "k_b"]
    assert res["top_ops"].op.tolist() == ["aten::k_a", "aten::k_b"]


def test_a_trace_without_steps_says_its_step_is_the_whole_trace(tmp_path) -> None:
    """No step spans: the one "step" per rank is the whole trace (50 µs here, from the first
    event's start to the last one's end), and the tables say so in their titles."""
    tb = TraceBuilder(rank=0)
    tb.op("aten::mm", 0, 50)
    tb.kernel("gemm", 10, 20, stream=7)
    with tb.load(tmp_path) as t:
        res = overview(t)
    assert res["steps"].step_ns.tolist() == [50_000]
    assert "no step spans" in res.present["summary"].title
    assert "whole trace" in res.present["steps"].title


def test_overview_of_the_dlrm_job_as_rank_tasks_equals_one_process(dlrm_store, monkeypatch):
    """The real 8-rank DLRM job with the Dask threshold lowered to 2 ranks: one task per
    rank (breakdown, diagnosis, roofline share, op and kernel sums) gives the one-process
    overview's every table, fact and note; its top kernel's total is the raw sum over the
    8 ranks' stores (DuckDB, one query)."""
    from xpuprof.analysis import per_rank

    trace, _ = dlrm_store
    with xpuprof.load(trace.path) as t:
        here = overview(t)
    monkeypatch.setattr(per_rank, "DASK_MIN_PARTS", 2)
    monkeypatch.setattr(per_rank, "DASK_MIN_EVENTS", 0)
    with xpuprof.load(trace.path) as t:
        there = overview(t)
        k = there["top_kernels"].iloc[0]
        name = str(k.kernel).replace("'", "''")
        raw = t.sql(
            "select count(*) as n, sum(dur) as ns from events "
            f"where name = '{name}' and level = '{k.level}'"
        ).iloc[0]
    assert set(here.tables) == set(there.tables)
    for name, table in here.tables.items():
        pd.testing.assert_frame_equal(table, there.tables[name], check_dtype=False)
    assert here.facts == there.facts and here.notes == there.notes
    assert (k.calls, k.total_ms) == (raw.n, pytest.approx(raw.ns / 1e6, rel=1e-12))
    assert there.facts["ranks"] == 8


def test_a_big_jobs_summary_lists_the_slowest_ranks_first(tmp_path) -> None:
    """From 32 ranks the summary's rows come slowest mean step first (a screenful of the ranks
    to look at), and its title says so: 33 ranks whose one step lasts 100 + 3·((7·r) mod 33)
    µs (a permutation of the ranks), so the order by hand is by that value, descending."""
    files = []
    want = {}
    for r in range(33):
        dur = 100 + 3 * ((7 * r) % 33)
        want[r] = dur
        tb = TraceBuilder(rank=r, world_size=33)
        tb.step(0, 0, dur)
        tb.op("aten::mm", 0, dur - 10)
        files.append(tb.write(tmp_path / f"rank{r}.json"))
    xpuprof.import_traces(files, tmp_path / "job.store")
    with xpuprof.load(tmp_path / "job.store") as t:
        res = overview(t)
    s = res["summary"]
    assert s["rank"].tolist() == sorted(want, key=lambda r: -want[r])
    assert s["step_ms_mean"].tolist() == pytest.approx(
        sorted((d / 1000 for d in want.values()), reverse=True)
    )
    assert res.present["summary"].title == "summary — 33 ranks, the slowest mean step first"
    assert res.facts["step_ms_mean"] == pytest.approx(max(want.values()) / 1000)

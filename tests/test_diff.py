"""diff: the step-time delta first, split into where a step's time goes, then ops and kernels;
a warning when the runs were recorded on different devices, world sizes or ranks.

The synthetic runs are written here with ``TraceBuilder`` and every expected number is worked
out by hand from the events built; the real pairs are checked against the raw JSON.
"""

from __future__ import annotations

import gzip
import json
import re

import pytest
from builders import TraceBuilder
from conftest import shared
from rich.console import Console

import xpuprof
from xpuprof.analysis.diff import diff
from xpuprof.ui import render, tools

A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-40GB"}]
V100 = [{"id": 0, "name": "Tesla V100-SXM2-32GB"}]
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _run(gemm_us: float, step_us: float, **setup) -> TraceBuilder:
    """Two steps of ``step_us``; in each an op launching a gemm of ``gemm_us`` from 10 µs in,
    then a 20 µs all-reduce from 5 µs after the gemm, alone on its stream (no compute beside
    it)."""
    tb = TraceBuilder(**setup)
    for i in range(2):
        t = i * step_us
        tb.step(i, t, step_us)
        tb.op("aten::mm", t + 1, 8)
        tb.launch("gemm", t + 10 + 0, gemm_us, launch_ts=t + 2, stream=7)
        tb.launch(NCCL, t + 15 + gemm_us, 20, launch_ts=t + 5, stream=9)
    return tb


@pytest.fixture()
def runs(tmp_path):
    """Baseline: steps of 100 µs, gemm 40, all-reduce 20: idle 40 µs a step. New: steps of
    80 µs, gemm 25, all-reduce 20: idle 35. A third run like the new one, but rank 1 of 4 on a
    V100 instead of rank 0 of 2 on an A100."""
    a = _run(40, 100, rank=0, world_size=2, device_properties=A100).store(tmp_path, "a")
    b = _run(25, 80, rank=0, world_size=2, device_properties=A100).store(tmp_path, "b")
    c = _run(25, 80, rank=1, world_size=4, device_properties=V100).store(tmp_path, "c")
    return a, b, c


def test_the_step_delta_split_by_hand(runs) -> None:
    a, b, _ = runs
    with xpuprof.load(a) as ta, xpuprof.load(b) as tb:
        res = diff(ta, tb)
    steps = res["steps"].set_index("part")
    assert list(res.tables) == ["steps", "ops", "kernels"]  # the step time leads
    want = {"step": (100_000, 80_000), "compute": (40_000, 25_000),
            "communication": (20_000, 20_000), "host_idle": (40_000, 35_000)}  # fmt: skip
    assert set(steps.index) == set(want)  # parts neither run has (memcpy, input…) left out
    for part, (x, y) in want.items():
        row = steps.loc[part]
        assert (row.mean_ns_a, row.mean_ns_b, row.mean_delta_ns) == (x, y, y - x), part
        assert row.mean_delta_fraction == pytest.approx((y - x) / 100_000), part
        assert (row.steps_a, row.steps_b) == (2, 2)
    # the parts' deltas add up to the step's
    assert steps.mean_delta_ns.drop("step").sum() == steps.loc["step", "mean_delta_ns"]
    assert res.facts["step_delta_ns"] == -20_000
    assert res.facts["headline"] == ("Step time 100 µs → 80 µs (−20 µs, −20.0%): compute "
                                     "−15 µs, host idle −5 µs")  # fmt: skip
    assert (res.facts["same_devices"], res.facts["same_world_size"],
            res.facts["same_ranks"]) == (True, True, True)  # fmt: skip
    assert not any("differ" in n for n in res.notes)
    k = res["kernels"].set_index("name")
    assert k.loc["gemm", ["count_a", "count_b", "time_delta_ns"]].tolist() == [2, 2, -30_000]
    assert k.loc[NCCL, "status"] == "same"
    ops = res["ops"].set_index("name")
    assert ops.loc["aten::mm", ["count_a", "count_b", "time_delta_ns"]].tolist() == [2, 2, 0]


def test_runs_on_other_devices_world_sizes_and_ranks_are_flagged(runs) -> None:
    a, _, c = runs
    with xpuprof.load(a) as ta, xpuprof.load(c) as tc:
        res = diff(ta, tc)
    assert res.notes[:3] == [
        "the runs differ in devices: baseline NVIDIA A100-SXM4-40GB, new Tesla V100-SXM2-32GB; "
        "their times may differ for that reason alone",
        "the runs differ in world sizes: baseline 2, new 4; their times may differ for that "
        "reason alone",
        "the runs differ in ranks: baseline 0, new 1; their times may differ for that reason alone",
    ]
    assert res.facts["headline"].endswith(
        " — but the runs differ in devices, world sizes and ranks"
    )
    assert (res.facts["same_devices"], res.facts["same_world_size"],
            res.facts["same_ranks"]) == (False, False, False)  # fmt: skip


def test_the_terminal_shows_the_headline_then_the_step_split(runs) -> None:
    a, b, _ = runs
    with xpuprof.load(a) as ta, xpuprof.load(b) as tb:
        res = tools.run("diff", ta, tb)
    console = Console(record=True, width=80, file=open("/dev/null", "w"))  # noqa: SIM115
    render.result(res, console)
    text = console.export_text()
    lines = text.splitlines()
    assert lines[0] == res.facts["headline"]  # 77 letters: one line at 80 columns
    order = [text.index(t) for t in ("step time and where it goes", "ops, largest change",
                                     "kernels, largest change")]  # fmt: skip
    assert order == sorted(order)


def _mean_step_us(path) -> float:
    evs = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    durs = [e["dur"] for e in evs if e.get("name", "").startswith("ProfilerStep#")]
    return sum(durs) / len(durs)


def test_a_real_pair_against_the_raw_steps(tmp_path) -> None:
    """ResNet-50 on a V100 with 0 and with 4 DataLoader workers: the mean ProfilerStep of each
    file, from the raw JSON; the parts add up to the step delta."""
    p0 = shared("kineto/gpu/resnet50_v100_2021/num_workers_0.pt.trace.json.gz")
    p4 = shared("kineto/gpu/resnet50_v100_2021/num_workers_4.pt.trace.json.gz")
    xpuprof.import_traces([p0], tmp_path / "w0")
    xpuprof.import_traces([p4], tmp_path / "w4")
    with xpuprof.load(tmp_path / "w0") as a, xpuprof.load(tmp_path / "w4") as b:
        res = diff(a, b)
    steps = res["steps"].set_index("part")
    assert steps.loc["step", "mean_ns_a"] == pytest.approx(_mean_step_us(p0) * 1000, abs=1)
    assert steps.loc["step", "mean_ns_b"] == pytest.approx(_mean_step_us(p4) * 1000, abs=1)
    assert steps.mean_delta_ns.drop("step").sum() == pytest.approx(
        steps.loc["step", "mean_delta_ns"], abs=1
    )
    assert res.facts["same_devices"] is True
    # the four workers took the input off the step: the largest part of the change
    parts = steps.drop("step").mean_delta_ns
    assert parts.abs().idxmax() == "input" and parts["input"] < 0
    assert re.match(r"Step time \S+ ms → \S+ ms \(−\S+ ms, −\S+%\): input −", res.facts["headline"])


def test_an_a100_run_against_a_v100_run_says_so(nccl, tmp_path) -> None:
    path, a100 = nccl
    v100_path = shared("kineto/gpu/v100_rank1of2_df_index_resolver.json.gz")
    names = []
    for p in (path, v100_path):
        doc = json.loads(gzip.decompress(p.read_bytes()))
        names.append(doc["deviceProperties"][0]["name"])
    xpuprof.import_traces([v100_path], tmp_path / "v100")
    with xpuprof.load(tmp_path / "v100") as v100:
        res = diff(a100, v100)
    assert res.notes[0].startswith(f"the runs differ in devices: baseline {names[0]}, new "
                                   f"{names[1]};")  # fmt: skip
    assert "the runs differ in devices" in res.facts["headline"]

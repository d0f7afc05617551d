"""The overview's per-step breakdown on a trace built so that every part is known by hand, and
the bottleneck rules on traces made to hit each of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import xpuprof
from xpuprof.analysis.overview import overview


def _x(name, cat, ts, dur, pid=100, tid=1, **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def store_of(tmp_path: Path, events: list[dict], name: str = "t") -> Path:
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    xpuprof.import_traces([p], tmp_path / f"{name}.store")
    return tmp_path / f"{name}.store"


def test_breakdown_of_a_step_known_by_hand(tmp_path) -> None:
    # step [0, 100) µs; device (pid 0): compute [10, 40), allreduce [30, 70), memcpy [60, 80);
    # host input span [85, 95) while the device idles
    ev = [
        _x("ProfilerStep#0", "user_annotation", 0, 100),
        _x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation",
           85, 10),
        _x("gemm", "kernel", 10, 30, pid=0, tid=7),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 30, 40, pid=0, tid=9),
        _x("Memcpy HtoD", "gpu_memcpy", 60, 20, pid=0, tid=8),
    ]  # fmt: skip
    with xpuprof.load(store_of(tmp_path, ev)) as t:
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
    assert summ.bottleneck == "input-bound (moderately)"  # input 10 % of the step


@pytest.mark.parametrize(
    "events, want",
    [
        # device idles 60 % of each step with no input span: the host does not keep up
        ([_x("k", "kernel", 0, 40, pid=0, tid=7)], "host/launch-bound"),
        # a collective not hidden behind compute for 50 % of the step
        ([_x("k", "kernel", 0, 40, pid=0, tid=7),
          _x("ncclKernel_AllReduce_RING_LL_Sum_float", "kernel", 40, 55, pid=0, tid=9)],
         "communication-bound"),
        # input spans cover a quarter of the step while the device idles
        ([_x("k", "kernel", 0, 75, pid=0, tid=7),
          _x("load_batch", "user_annotation", 75, 25)], "input-bound (highly)"),
        # the device is busy all the time: bound by the device itself (no FLOPs known)
        ([_x("k", "kernel", 0, 100, pid=0, tid=7)], "device-bound"),
    ],
)  # fmt: skip
def test_bottleneck_rules(tmp_path, events, want) -> None:
    ev = [_x("ProfilerStep#0", "user_annotation", 0, 100)] + events
    with xpuprof.load(store_of(tmp_path, ev)) as t:
        assert overview(t)["summary"].bottleneck.iloc[0] == want


def test_cpu_run_uses_host_ops_and_says_so(tmp_path) -> None:
    ev = [_x("ProfilerStep#0", "user_annotation", 0, 100), _x("aten::mm", "cpu_op", 0, 60)]
    with xpuprof.load(store_of(tmp_path, ev)) as t:
        res = overview(t)
    assert any("CPU run" in n for n in res.notes)
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

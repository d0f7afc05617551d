"""Diff of two traces and the input-pipeline analysis, checked against counts from the raw JSON
and against times the test measures itself."""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter

import pytest
from builders import TraceBuilder
from conftest import SHARED_TRACES

import xpuprof
from xpuprof.analysis.diff import diff
from xpuprof.analysis.input_pipeline import classify, input_pipeline

SHARED = SHARED_TRACES / "kineto" / "edge"


def test_diff_of_two_synthetic_runs(tmp_path) -> None:
    a = TraceBuilder(rank=None)
    a.step(0, 0, 100)
    a.op("aten::mm", 10, 30)
    a.op("aten::relu", 50, 10)
    a.kernel("k_mm", 20, 40)
    b = TraceBuilder(rank=None)
    b.step(0, 0, 80)
    b.op("aten::mm", 10, 20)
    b.op("aten::mm", 40, 20)
    b.op("aten::gelu", 65, 5)
    b.kernel("k_mm", 20, 25)
    with a.load(tmp_path, "a") as ta, b.load(tmp_path, "b") as tb:
        res = diff(ta, tb)
    ops = res["ops"].set_index("name")
    assert ops.loc["aten::mm", ["count_a", "count_b", "time_ns_a", "time_ns_b"]].tolist() == [
        1, 2, 30_000, 40_000]  # fmt: skip
    assert ops.loc["aten::mm", "status"] == "changed"
    assert ops.loc["aten::relu", "status"] == "removed"
    assert ops.loc["aten::gelu", "status"] == "added"
    k = res["kernels"].set_index("name")
    assert k.loc["k_mm", "time_delta_ns"] == -15_000
    s = res["steps"].iloc[0]
    assert s.mean_ns_a == 100_000 and s.mean_ns_b == 80_000
    assert s.mean_delta_fraction == pytest.approx(-0.2)


def test_diff_of_hta_tiny_pair_matches_raw_counts(tmp_path) -> None:
    base, test = SHARED / "tiny_base.json.gz", SHARED / "tiny_test.json.gz"
    if not base.exists():
        pytest.skip(f"shared traces not found at {SHARED} (the ../shared checkout is absent)")
    raw = {}
    for p in (base, test):
        evs = json.loads(gzip.decompress(p.read_bytes()))["traceEvents"]
        raw[p] = Counter(e["name"] for e in evs if e.get("cat") == "cpu_op")
    xpuprof.import_traces([base], tmp_path / "a")
    xpuprof.import_traces([test], tmp_path / "b")
    with xpuprof.load(tmp_path / "a") as ta, xpuprof.load(tmp_path / "b") as tb:
        ops = diff(ta, tb)["ops"].set_index("name")
    for name in set(raw[base]) | set(raw[test]):
        assert ops.loc[name, "count_a"] == raw[base][name]
        assert ops.loc[name, "count_b"] == raw[test][name]
    added = {n for n in raw[test] if n not in raw[base]}
    assert set(ops.index[ops.status == "added"]) == added


def test_classification_thresholds_are_xprofs() -> None:
    assert classify(0.25) == "highly input-bound"
    assert classify(0.20) == "highly input-bound"
    assert classify(0.07) == "moderately input-bound"
    assert classify(0.049) == "not input-bound"


def test_input_fraction_of_a_real_loop_with_a_slow_dataloader(tmp_path) -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self) -> int:
            return 10_000

        def __getitem__(self, i: int):
            time.sleep(0.0015)  # a slow decode: about 12 ms per batch of 8
            return torch.randn(64), torch.randint(0, 4, ())

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = iter(DataLoader(Slow(), batch_size=8))
    waited = []
    with xpuprof.profile(tmp_path / "in", level="op", telemetry=False):
        for i in range(6):
            xpuprof.step(i)
            t = time.perf_counter()
            x, y = next(loader)
            waited.append(time.perf_counter() - t)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with xpuprof.load(tmp_path / "in") as trace:
        res = input_pipeline(trace)
        steps = trace.sql("select step, dur from events where level = 'step' order by step")
    per_step = res["steps"].set_index("step")
    # the test's own stopwatch around next(loader) against the profiler's DataLoader spans
    for i, w in enumerate(waited):
        assert per_step.loc[i, "input_ns"] == pytest.approx(w * 1e9, rel=0.15, abs=300_000)
    frac = sum(waited) * 1e9 / steps.dur.sum()
    assert res["summary"].input_fraction.iloc[0] == pytest.approx(frac, rel=0.15)
    assert res["summary"].classification.iloc[0] == classify(frac)


def test_without_steps_or_input_spans_it_says_so(tmp_path) -> None:
    tb = TraceBuilder(rank=None)
    tb.op("aten::mm", 0, 10)
    with tb.load(tmp_path) as t:
        res = input_pipeline(t)
    assert not res.tables and "no step spans" in res.notes[0]

"""What-if ``batch=FACTOR`` (``sim/transforms/batch.py``) on a real small CPU capture.

The capture: an MLP 128 → 256 → 256 → 10 with ReLUs, batch 48, cross-entropy, SGD, fed by a
``DataLoader`` (default collate, ``num_workers=0``), 3 steps after 1 of warm-up, captured by
``xpuprof.profile(level="op", record_shapes=True)``. Every expected value is computed here from
the raw events (SQL on the store, their ``Input Dims``), the roofline tool's op table and the
local CPU's roofs — not by the transform: op times are read from the replay's node times
(the op's end minus its start), baseline from the identity what-if.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import xpuprof
from tests.builders import TraceBuilder
from xpuprof.core.errors import XpuprofError
from xpuprof.sim.whatif import INPUT_PATTERN, parse, whatif

BATCH = 48


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """The capture (module docstring), opened."""
    torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    from torch.utils.data import DataLoader, TensorDataset

    store = tmp_path_factory.mktemp("batch") / "mlp.store"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 10))  # fmt: skip
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        data = TensorDataset(torch.randn(6 * BATCH, 128), torch.randint(0, 10, (6 * BATCH,)))
        it = iter(DataLoader(data, batch_size=BATCH))
        with xpuprof.profile(store, level="op", steps=3, warmup=1, record_shapes=True,
                             model=model, telemetry=False):  # fmt: skip
            for i in range(4):
                xpuprof.step(i)
                x, y = next(it)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            xpuprof.step(4)
    finally:
        torch.set_num_threads(before)
    with xpuprof.load(store) as trace:
        yield trace


@pytest.fixture(scope="module")
def runs(mlp):
    """The identity, batch=2 and batch=0.5 what-ifs, once for the module."""
    return {c: whatif(mlp, [c] if c else []) for c in ("", "batch=2", "batch=0.5")}


def _durations(w, ids) -> np.ndarray:
    """Simulated duration (ns) of the host events ``ids`` in a what-if's prediction."""
    n = w.baseline.graph.nodes
    start = pd.Series(np.flatnonzero(n.kind == 0), index=n.event[n.kind == 0])
    end = pd.Series(np.flatnonzero(n.kind == 1), index=n.event[n.kind == 1])
    start, end = start[~start.index.duplicated()], end[~end.index.duplicated()]
    s = start.reindex(ids).to_numpy()
    e = end.reindex(ids).to_numpy()
    return w.time[e] - w.time[s]


def _ops_within(trace, span_pattern: str) -> pd.DataFrame:
    """Op events lying within host spans whose name matches ``span_pattern`` (SQL)."""
    return trace.sql(
        "select o.id, o.name, o.args from events o join events s on o.tid = s.tid and "
        "o.ts >= s.ts and o.ts + o.dur <= s.ts + s.dur where o.level = 'op' and "
        f"regexp_matches(s.name, '{span_pattern}') order by o.id"
    )


def test_batch_is_read_from_the_model_input(mlp):
    """The first op of each step outside the DataLoader is the first ``aten::linear``: its
    input is ``[48, 128]``."""
    from xpuprof.sim.transforms import batch

    p = batch.plan(mlp, parse("batch=2"))
    assert (p.batch, p.new_batch) == (BATCH, 2 * BATCH)
    assert "aten::linear" in p.found
    first = mlp.sql("select args from events where name = 'aten::linear' order by ts limit 1")
    assert json.loads(first["args"].iloc[0])["Input Dims"][0] == [BATCH, 128]


def test_batch_1_is_the_identity(mlp, runs):
    w1 = whatif(mlp, ["batch=1"])
    s = w1.steps
    assert len(s) == 3
    assert np.abs(s["predicted_ns"] - s["baseline_ns"]).max() <= 2
    assert np.array_equal(w1.time, runs[""].time) or np.abs(w1.time - runs[""].time).max() <= 2


def test_optimizer_ops_keep_their_times(mlp, runs):
    """The ops inside ``Optimizer.step#SGD.step`` (found by SQL, by time) take exactly their
    baseline time, with the batch doubled or halved."""
    opt = _ops_within(mlp, r"^Optimizer\.step#")
    assert len(opt) >= 6 * 3  # an add_ per parameter (6) per step
    base = _durations(runs[""], opt["id"].to_numpy())
    for c in ("batch=2", "batch=0.5"):
        assert np.array_equal(_durations(runs[c], opt["id"].to_numpy()), base)


def test_host_time_outside_ops_is_unchanged(mlp, runs):
    """Host-gap edges (Python between ops) keep their delays."""
    from xpuprof.sim import transforms
    from xpuprof.sim.graph import HOST_GAP
    from xpuprof.sim.whatif import _cpus, _Names

    g = runs[""].baseline.graph
    d = g.edges.delay.copy()
    ctx = transforms.Context(mlp, g, _Names(mlp, g), d, np.ones(len(g.edges), bool),
                             _cpus(mlp))  # fmt: skip
    transforms.module("batch").apply(parse("batch=2"), ctx)
    gap = g.edges.kind == HOST_GAP
    assert gap.any()
    assert np.array_equal(d[gap], g.edges.delay[gap])
    assert (d >= g.edges.delay).all()  # a bigger batch makes nothing faster


def test_input_spans_scale_with_the_batch(mlp, runs):
    """The DataLoader's spans (per-sample fetch and collate) × 2 and × ½."""
    spans = mlp.sql("select id, name from events where regexp_matches(name, "
                    f"'{INPUT_PATTERN}') and level != 'op'")  # fmt: skip
    assert len(spans) >= 3
    ids = spans["id"].to_numpy()
    base = _durations(runs[""], ids).astype(float)
    for c, f in (("batch=2", 2.0), ("batch=0.5", 0.5)):
        got = _durations(runs[c], ids)
        # each span's edges are rounded to whole ns: a few ns per nested event
        assert np.allclose(got, f * base, rtol=1e-4, atol=2_000)


def _x_ns(flops: float, nbytes: float, peak: float, bw: float) -> float:
    """max(F/P, B/W) in ns."""
    return max(flops / peak, nbytes / bw) * 1e9


def test_big_gemm_by_hand(mlp, runs):
    """The 256×256 ``aten::linear`` of each step: T' = T + (T̃ − a)·(x'/x − 1), with T̃ its
    median over the 3 steps, x = max(F/P, B/W) on the local CPU's roofs, and a the intercept
    of T = a + b·x fitted here (least squares in closed form) over the distinct matmul ops
    (name and ``Input Dims`` from the raw args) of the roofline tool's table at their median
    time, bounded to [0, the fastest]; F' and B' by hand for the input [96, 256]."""
    from xpuprof.analysis.roofline import roofline
    from xpuprof.hardware import local_cpu

    cpu = local_cpu()
    peak, bw = cpu.peak("fp32", matrix=True)[0], cpu.memory_bandwidth
    ops = roofline(mlp, calibrate=True).tables["ops"]
    mm = ops[ops["kind"] == "matmul"].copy()
    mm["x"] = [_x_ns(f, b, peak, bw) for f, b in zip(mm["flops"], mm["bytes"], strict=True)]
    raw = mlp.sql("select id, args from events where level = 'op'").set_index("id")["args"]
    mm["dims"] = [repr(json.loads(raw[i])["Input Dims"]) for i in mm["id"]]
    grp = mm.groupby(["name", "dims"]).agg(x=("x", "first"), t=("time_ns", "median"))
    x, t = grp["x"].to_numpy(), grp["t"].to_numpy()
    assert len(np.unique(x)) >= 3
    b = float(((x - x.mean()) * (t - t.mean())).sum() / ((x - x.mean()) ** 2).sum())
    a = min(max(t.mean() - b * x.mean(), 0.0), t.min())
    args = mlp.sql("select id, args from events where name = 'aten::linear'")
    big = [int(i) for i, s in zip(args["id"], args["args"], strict=True)
           if json.loads(s)["Input Dims"][:2] == [[BATCH, 256], [256, 256]]]  # fmt: skip
    assert len(big) == 3  # one per step
    f0, y0 = 2.0 * BATCH * 256 * 256, 4.0 * (BATCH * 256 + 256 * 256 + 256 + BATCH * 256)
    f1, y1 = 2.0 * 96 * 256 * 256, 4.0 * (96 * 256 + 256 * 256 + 256 + 96 * 256)
    assert f0 / peak > y0 / bw  # compute-bound: x'/x = 2
    row = mm.set_index("id").loc[big]
    assert np.allclose(row["flops"], f0) and np.allclose(row["bytes"], y0)
    t_op = row["time_ns"].to_numpy()
    work = max(float(np.median(t_op)) - a, 0.0)
    expected = np.maximum(t_op + work * (_x_ns(f1, y1, peak, bw) / _x_ns(f0, y0, peak, bw) - 1),
                          np.minimum(t_op, a))  # fmt: skip
    base = _durations(runs[""], np.array(big))
    assert np.allclose(base, t_op, atol=2)  # the identity replay
    got = _durations(runs["batch=2"], np.array(big))
    assert np.allclose(got, expected, rtol=1e-6, atol=50)
    assert (got > base).all()


def test_weight_gradients_carry_the_batch(mlp, runs):
    """``mm(gᵀ, x)`` of a weight gradient has the batch last in its first input
    (``[256, 48]``) and first in its second: both scaled, so the op grows; the input gradient
    ``mm(g, W)`` (``[48, 256]·[256, 128]``) too. Shapes read from the raw args."""
    mm = mlp.sql("select id, args from events where name = 'aten::mm'")
    dims = [json.loads(x)["Input Dims"] for x in mm["args"]]
    wgrad = [int(i) for i, d in zip(mm["id"], dims, strict=True) if d[0] == [256, BATCH]]
    assert len(wgrad) == 2 * 3  # two 256-wide layers' weights, per step
    base = _durations(runs[""], np.array(wgrad))
    assert (_durations(runs["batch=2"], np.array(wgrad)) > base).all()
    assert (_durations(runs["batch=0.5"], np.array(wgrad)) < base).all()


def test_batch_2_between_the_baseline_and_twice_it(runs):
    s2, s05 = runs["batch=2"].summary.iloc[0], runs["batch=0.5"].summary.iloc[0]
    assert s2["baseline_ns"] < s2["predicted_ns"] < 2 * s2["baseline_ns"]
    assert 0.5 * s05["baseline_ns"] < s05["predicted_ns"] < s05["baseline_ns"]


def test_sizes_and_factor_agree(mlp, runs):
    """``batch=96/48`` is ``batch=2``; a size the trace does not have is an error."""
    w = whatif(mlp, [f"batch={2 * BATCH}/{BATCH}"])
    assert np.abs(w.time - runs["batch=2"].time).max() <= 1
    with pytest.raises(XpuprofError, match="no op's input has a dimension 77"):
        whatif(mlp, ["batch=154/77"])


def test_scope_limits_the_change(mlp, runs):
    """``batch:Sequential=2``: the forward pass (inside the model's layer span) only; the
    backward's ``aten::mm`` keep their time."""
    w = whatif(mlp, ["batch:^Sequential$=2"])
    mm = mlp.sql("select id from events where name = 'aten::mm'")["id"].to_numpy()
    assert np.array_equal(_durations(w, mm), _durations(runs[""], mm))
    lin = mlp.sql("select id from events where name = 'aten::linear'")["id"].to_numpy()
    assert (_durations(w, lin) > _durations(runs[""], lin)).all()
    with pytest.raises(XpuprofError, match="no costed op and no input-pipeline span"):
        whatif(mlp, ["batch:no-such-region=2"])


@pytest.mark.parametrize(("change", "message"), [
    ("batch=0", "must be > 0"), ("batch=-2", "must be > 0"), ("batch=abc", "not a number"),
    ("batch", "say the factor"), ("batch=3/2.5", "whole numbers"), ("batch:(=2", "bad pattern"),
])  # fmt: skip
def test_bad_changes(change, message):
    with pytest.raises(XpuprofError, match=message):
        parse(change)


def test_a_trace_without_shapes_is_an_error(tmp_path):
    """No ``Input Dims``: nothing can be recomputed; the error names record_shapes."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=1000)
    tb.op("aten::mm", 10, 600)
    tb.op("aten::relu", 620, 20)
    with tb.load(tmp_path) as t:
        with pytest.raises(XpuprofError, match="record_shapes"):
            whatif(t, ["batch=2"])


# -- a GPU trace (shared traces) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def dlrm0(tmp_path_factory):
    """Rank 0 of the shared DLRM V100 job (input shapes recorded), imported alone."""
    from tests.conftest import shared

    f = shared("kineto/gpu/dlrm_8rank_v100/worker0_step_12.1694128201545.pt.trace.json.gz")
    store = tmp_path_factory.mktemp("dlrm0") / "rank0.store"
    xpuprof.import_traces([f], store)
    with xpuprof.load(store) as trace:
        yield trace


def test_gpu_kernels_repriced_launches_kept(dlrm0):
    """batch=2 on a GPU trace: launches and the host's own work (outside the DataLoader's
    spans) keep their delays; the kernels launched from inside ``Optimizer.step#…`` (runtime
    calls found by SQL, by time; kernels by correlation id) keep theirs; every kernel changed
    grows, and all together at most × 2 (T' = T + w·(x'/x − 1): x'/x ≤ 2 when only a batch
    dimension doubles, w ≤ T̃, the op's median time)."""
    from xpuprof.sim import transforms
    from xpuprof.sim.graph import DEVICE_WORK, EDGE_KINDS, HOST_WORK
    from xpuprof.sim.whatif import _cpus, _Names, inside

    t = dlrm0
    base = whatif(t, [])
    g = base.baseline.graph
    d = g.edges.delay.copy()
    ctx = transforms.Context(t, g, _Names(t, g), d, np.ones(len(g.edges), bool), _cpus(t))
    note = transforms.module("batch").apply(parse("batch=2"), ctx)
    assert "batch 16 → 32" in note
    e, old = g.edges, g.edges.delay
    launch = e.kind == EDGE_KINDS.index("launch")
    assert launch.any() and np.array_equal(d[launch], old[launch])
    spans = t.sql(f"select id from events where regexp_matches(name, '{INPUT_PATTERN}') "
                  "and level != 'op'")["id"].to_numpy()  # fmt: skip
    in_input = np.isin(e.event, np.union1d(spans, inside(g, spans)))
    host = (e.kind == HOST_WORK) & ~in_input
    assert np.array_equal(d[host], old[host])
    opt_kernels = t.sql(
        "select k.id from events k join events r on k.correlation = r.correlation and "
        "r.level = 'runtime' join events s on r.ts >= s.ts and r.ts < s.ts + s.dur and "
        "s.tid = r.tid where k.level = 'kernel' and s.name like 'Optimizer.step#%'"
    )["id"].to_numpy()
    assert len(opt_kernels) > 0
    opt = (e.kind == DEVICE_WORK) & np.isin(e.event, opt_kernels)
    assert opt.any() and np.array_equal(d[opt], old[opt])
    dev = (e.kind == DEVICE_WORK) & (d != old)
    assert dev.sum() > 10
    assert (d[dev] >= old[dev]).all()
    assert d[dev].sum() <= 2 * old[dev].sum()

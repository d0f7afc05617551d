"""Op, kernel and layer statistics, checked against numbers computed elsewhere:

* op stats against torch.profiler's own ``key_averages()`` of a run recorded in the test
  (counts exact, total and self CPU time within 1 %);
* kernel stats against groups summed straight from the raw JSON of a real A100 trace;
* layer stats against the layer spans read straight out of the events table of a capture.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
from conftest import us_to_ns

import xpuprof
from xpuprof.analysis.stats import kernel_stats, layer_stats, op_stats, stats, uses_tensor_cores

# ----------------------------------------------------------------------------------------------
# op stats against torch.profiler
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory) -> dict:
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    from xpuprof.workloads.demo import Trainer

    out = tmp_path_factory.mktemp("torch_stats")
    trainer = Trainer(batch=4, seq=32, layers=2)
    got: dict = {}

    def ready(p) -> None:
        # read in the handler: the profiler clears its events after a cycle
        got["ops"] = {
            e.key: (e.count, e.cpu_time_total, e.self_cpu_time_total) for e in p.key_averages()
        }
        got["shapes"] = collections.Counter()
        for e in p.key_averages(group_by_input_shape=True):
            got["shapes"][(e.key, json.dumps(e.input_shapes, separators=(",", ":")))] += e.count
        p.export_chrome_trace(str(out / "run.pt.trace.json"))

    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=2),
        on_trace_ready=ready,
    ) as prof:
        for _ in range(3):
            trainer.step()
            prof.step()
    store = out / "run.store"
    xpuprof.import_traces([out / "run.pt.trace.json"], store)
    trace = xpuprof.load(store)
    yield {"trace": trace, **got}
    trace.close()


def test_op_stats_agree_with_torch_key_averages(torch_run) -> None:
    trace, want = torch_run["trace"], torch_run["ops"]
    res = stats(trace, kernels=False, layers=False)
    df = res["ops"].set_index("name")
    assert df.equals(op_stats(trace).set_index("name"))
    assert len(df) > 50
    assert res.notes  # a CPU run: no device time, said so
    worst_total = worst_self = 0.0
    for name, r in df.iterrows():
        count, total_us, self_us = want[name]
        assert r["count"] == count, name
        # the trace keeps microseconds with 3 decimals: 1 ns of rounding per event (an op and
        # each of its children) on top of the 1 % the agreement is held to
        slack = 0.002 * count
        got_total, got_self = r.total_ns / 1e3, r.self_ns / 1e3
        assert abs(got_total - total_us) <= 0.01 * total_us + slack, (name, got_total, total_us)
        assert abs(got_self - self_us) <= 0.01 * abs(self_us) + slack, (name, got_self, self_us)
        worst_total = max(worst_total, abs(got_total - total_us) / max(total_us, 1e-9))
        if self_us > 10:
            worst_self = max(worst_self, abs(got_self - self_us) / self_us)
    # every op key of torch's table is here; the rest are the step spans and the user
    # annotations (record_function: Optimizer.step#AdamW.step), which are not framework ops
    missing = set(want) - set(df.index)
    other = set(trace.sql("select distinct name from events where level in "
                          "('step', 'annotation')")["name"])  # fmt: skip
    assert missing - {"ProfilerStep*"} == other - {n for n in other if n.startswith("Profiler")}
    assert worst_total < 0.01 and worst_self < 0.01
    # self time sums to the time of the outermost ops, as in torch's table
    assert df.self_ns.sum() == pytest.approx(
        sum(v[2] for k, v in want.items() if k in df.index) * 1e3, rel=1e-3
    )


def test_op_stats_by_input_shape_match_torch_groups(torch_run) -> None:
    trace, want = torch_run["trace"], torch_run["shapes"]
    df = op_stats(trace, shapes=True)
    got = collections.Counter()
    for name, dims, n in zip(df.name, df.input_shapes, df["count"], strict=True):
        got[(name, json.dumps(json.loads(dims), separators=(",", ":")) if dims else "[]")] += n
    annotations = set(trace.sql("select distinct name from events where level in "
                                "('step', 'annotation')")["name"])  # fmt: skip
    ops = {k: v for k, v in want.items() if k[0] not in annotations | {"ProfilerStep*"}}
    assert got == ops and len(ops) > 100
    # FLOPs: GEMMs carry them, and the outermost column counts each GEMM once
    by_name = op_stats(trace).set_index("name")
    assert by_name.loc["aten::mm", "flops"] > 0
    assert by_name.flops_outermost.sum() <= by_name.flops.sum()
    assert (by_name.flops_per_s.dropna() >= 0).all()


# ----------------------------------------------------------------------------------------------
# kernel stats against the raw JSON
# ----------------------------------------------------------------------------------------------


def test_kernel_stats_match_the_raw_json(nccl, raw_json) -> None:
    path, trace = nccl
    events = raw_json(path, exact=True)["traceEvents"]
    groups: dict[tuple, list] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            a = e["args"]
            key = (e["name"], json.dumps(a["grid"], separators=(",", ":")),
                   json.dumps(a["block"], separators=(",", ":")), a["registers per thread"],
                   a["shared memory"])  # fmt: skip
            groups[key].append((us_to_ns(e["dur"]), float(a["est. achieved occupancy %"])))
    df = kernel_stats(trace)
    assert len(df) == len(groups)
    total = sum(d for v in groups.values() for d, _ in v)
    for r in df.itertuples():
        v = groups[(r.name, r.grid, r.block, r.registers_per_thread, r.shared_memory)]
        durs = [d for d, _ in v]
        assert (r.count, r.total_ns, r.min_ns, r.max_ns) == (len(v), sum(durs), min(durs),
                                                             max(durs))  # fmt: skip
        assert r.occupancy_pct == pytest.approx(np.mean([o for _, o in v]))
        assert r.pct == pytest.approx(100 * sum(durs) / total)
        assert r.level in ("kernel", "collective")
    assert df.total_ns.is_monotonic_decreasing
    assert df[df.name.str.startswith("nccl")].level.eq("collective").all()
    # per launching op: the same kernels, split further
    by_op = kernel_stats(trace, by_op=True)
    assert by_op["count"].sum() == df["count"].sum() and by_op.op.notna().all()


def test_tensor_core_rule() -> None:
    # XProf's patterns
    assert uses_tensor_cores("volta_h884gemm_64x64_ldg8_nn")
    assert uses_tensor_cores("turing_fp16_s1688cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc")
    assert uses_tensor_cores("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn")
    # ours: real A100 kernel names from the shared traces
    assert uses_tensor_cores("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc")
    assert uses_tensor_cores("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn>")
    assert uses_tensor_cores("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT")
    # plain FP32 SIMT GEMMs and elementwise kernels do not
    assert not uses_tensor_cores("volta_sgemm_128x64_nn")
    assert not uses_tensor_cores("ampere_sgemm_32x32_sliced1x4_tn")
    assert not uses_tensor_cores("void at::native::vectorized_elementwise_kernel<4>")


def test_op_device_time_on_a_gpu_trace(nccl) -> None:
    path, trace = nccl
    df = op_stats(trace).set_index("name")
    dev = trace.sql(
        "select sum(dur) as ns from events where level in ('kernel','collective','memcpy','memset')"
    )["ns"][0]
    # every device event launched under an op counts once as some op's own device time
    assert df.self_device_ns.sum() <= dev and df.self_device_ns.sum() > 0.9 * dev
    assert (df.device_ns >= df.self_device_ns).all()
    assert df.loc["aten::convolution", "device_ns"] > 0
    assert df.loc["aten::conv2d", "device_ns"] == df.loc["aten::convolution", "device_ns"]


# ----------------------------------------------------------------------------------------------
# layer stats of a capture
# ----------------------------------------------------------------------------------------------


def test_layer_stats_forward_time_is_the_layer_spans(demo_capture) -> None:
    trace, modules = demo_capture
    t = trace.table("events", columns=["category", "name", "dur", "args"]).to_pylist()
    fwd_ns: dict[str, int] = collections.defaultdict(int)
    calls: collections.Counter = collections.Counter()
    for r in t:
        if r["category"] == "xpuprof_layer" and json.loads(r["args"])["pass"] == "forward":
            fwd_ns[r["name"]] += r["dur"]
            calls[r["name"]] += 1
    df = layer_stats(trace).set_index("layer")
    assert dict(df.forward_ns) == dict(fwd_ns)
    assert dict(df["calls"]) == dict(calls)
    assert all(df.module_type[p] == modules[p] for p in df.index)
    assert (df.forward_self_ns <= df.forward_ns).all()
    # backward: no backward hooks in this capture, so the backward ops found through autograd
    assert (df.backward_from == "autograd").all()
    assert (df.backward_ns > 0).all()
    root = next(iter(modules))
    assert df.backward_ns.max() == df.backward_ns[root]
    # per type: types whose modules never nest add their modules' times
    by_type = layer_stats(trace, by="module_type").set_index("module_type")
    for mtype in ("Linear", "LayerNorm", "GELU", "Embedding"):
        paths = [p for p, t in modules.items() if t == mtype and p in df.index]
        assert by_type.forward_ns[mtype] == df.forward_ns[paths].sum()
        assert by_type.calls[mtype] == df["calls"][paths].sum()
    # Sequential nests in Sequential: the outer one only
    assert by_type.forward_ns["Sequential"] == df.forward_ns["blocks"]
    res = stats(trace)
    assert set(res.tables) == {"ops", "kernels", "layers", "layer_types"}


# ----------------------------------------------------------------------------------------------
# the hand-written trace of test_hierarchy: numbers worked out on paper
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    from test_hierarchy import hand_trace

    d = tmp_path_factory.mktemp("hand_stats")
    hand_trace(d / "hand.json")
    xpuprof.import_traces([d / "hand.json"], d / "hand.store")
    trace = xpuprof.load(d / "hand.store")
    yield trace
    trace.close()


def test_op_and_layer_stats_of_a_hand_written_trace(hand) -> None:
    us = 1000
    ev = "autograd::engine::evaluate_function: AddmmBackward0"
    ops = op_stats(hand).set_index("name")
    # name: (total, self, device, self device, kernels) in µs; layer spans are looked through
    want = {"aten::linear": (165, 15, 100, 0, 1), "aten::addmm": (150, 140, 100, 100, 1),
            "aten::relu": (87, 77, 20, 20, 1), "aten::add": (40, 30, 10, 10, 1),
            "aten::zero_": (50, 40, 5, 5, 1), ev: (200, 15, 50, 0, 1),
            "AddmmBackward0": (185, 95, 50, 0, 1), "aten::mm": (90, 80, 50, 50, 1)}  # fmt: skip
    got = {
        k: (r.total_ns // us, r.self_ns // us, r.device_ns // us, r.self_device_ns // us,
            r.kernels)
        for k, r in ops.iterrows()
    }  # fmt: skip
    assert got == want
    lay = layer_stats(hand).set_index("layer")
    cols = ["calls", "forward_ns", "forward_self_ns", "backward_calls", "backward_ns",
            "device_ns", "device_forward_ns", "device_backward_ns"]  # fmt: skip
    assert {k: tuple(int(v) // (1 if c in ("calls", "backward_calls") else us)
                     for c, v in zip(cols, r[cols], strict=True))
            for k, r in lay.iterrows()} == {
        "model": (1, 490, 220, 1, 200, 180, 130, 50),
        "model.fc": (1, 180, 180, 1, 200, 150, 100, 50),
        "model.act": (1, 90, 90, 0, 0, 20, 20, 0),
    }  # fmt: skip
    assert dict(lay.backward_from.fillna("-")) == {
        "model": "autograd", "model.fc": "autograd", "model.act": "-"
    }  # fmt: skip
    k = kernel_stats(hand, levels=("kernel", "memset"), by_op=True).set_index("name")
    assert k.loc["gemm_k5", "op"] == "aten::mm" and k.loc["Memset (Device)", "op"] == "aten::zero_"
    assert k.total_ns.sum() == 185 * us
    # the stats tool states its answer itself: the most self time is aten::addmm's 140 of the
    # 492 µs summed in ``want`` (28%); the most kernel time gemm_k1's 100 of the 180 µs of
    # kernels (k1 100 + k2 20 + k3 10 + k5 50; the memset is not a kernel): 56%
    assert stats(hand).facts["headline"] == (
        "Most op self time in aten::addmm (140 µs, 28% of all, 1 call); most device time in "
        "gemm_k1 (100 µs, 56% of all, 1 call)"
    )

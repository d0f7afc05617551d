"""Across-stack hierarchy: each event's ancestry and device time attributed up the tree.

Expected values come from elsewhere than xpuprof's own tree:

* on the shared GPU traces, from the raw JSON: the innermost ``cpu_op`` enclosing the runtime
  call that has a kernel's correlation id (one sweep per thread over the parsed events), and
  ``fwdbwd`` flow entries bound to the ops around their timestamps;
* on a capture of the demo model, from the model itself (``named_modules``: which module types
  run which aten op) and from the layer spans read straight out of the events table.
"""

from __future__ import annotations

import collections
import json
import re

import numpy as np
import pytest
from builders import TraceBuilder
from conftest import KINETO, NO_SHARED, us_to_ns

import xpuprof
from xpuprof.analysis.hierarchy import ancestry, attribute, hierarchy

OPS = {"cpu_op", "operator"}
RUNTIME = {"cuda_runtime", "cuda_driver", "runtime", "mtia_runtime", "xpu_runtime",
           "privateuse1_runtime", "xpu_driver", "privateuse1_driver"}  # fmt: skip
DEVICE = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "mtia_ccp_events",
          "cuda_profiler_range"}  # fmt: skip
EVALUATE = "autograd::engine::evaluate_function: "
#: 2021 traces record the step spans as ops (category Operator); they are the step level
STEP = re.compile(r"^ProfilerStep#\d+$")


# ----------------------------------------------------------------------------------------------
# independent reading of a raw Kineto trace
# ----------------------------------------------------------------------------------------------


def _cat(e: dict) -> str:
    return str(e.get("cat") or "").lower()


def enclosing_ops(events: list[dict]) -> dict[tuple, list[int]]:
    """For every runtime call and every ``fwdbwd`` flow entry: the indexes of the ops that
    enclose it on its thread, innermost first. Keys: ("call", index) and ("flow", index).

    One sweep per (pid, tid): ops sorted by start (longest first on ties, then file order),
    a stack of the ops still open; an op encloses a call if it starts no later and ends no
    earlier, a flow point if its interval contains the point (both ends included)."""
    tracks: dict[tuple, list[tuple]] = collections.defaultdict(list)
    for i, e in enumerate(events):
        ph, cat = e.get("ph"), _cat(e)
        key = (str(e.get("pid")), str(e.get("tid")))
        if ph == "X" and cat in OPS and not STEP.match(e.get("name", "")):
            s = us_to_ns(e["ts"])
            tracks[key].append((s, 0, -us_to_ns(e.get("dur", 0)), i, "op"))
        elif ph == "X" and cat in RUNTIME:
            s = us_to_ns(e["ts"])
            tracks[key].append((s, 1, -us_to_ns(e.get("dur", 0)), i, "call"))
        elif ph in ("s", "f") and cat == "fwdbwd":
            tracks[key].append((us_to_ns(e["ts"]), 1, 0, i, "flow"))
    out: dict[tuple, list[int]] = {}
    for items in tracks.values():
        items.sort()
        stack: list[tuple[int, int]] = []  # (end, index)
        for start, _, neg_dur, i, kind in items:
            end = start - neg_dur
            while stack and stack[-1][0] < end:
                stack.pop()
            if kind == "op":
                stack.append((end, i))
            else:
                out[(kind, i)] = [j for _, j in reversed(stack)]
    return out


def expected_launch_ops(events: list[dict]) -> dict[int, dict]:
    """Per device event with a runtime call of the same correlation id: the innermost op
    around that call (None when no op encloses it), and the whole enclosing chain."""
    around = enclosing_ops(events)
    calls: dict[int, list[int]] = collections.defaultdict(list)
    for i, e in enumerate(events):
        if e.get("ph") == "X" and _cat(e) in RUNTIME:
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                calls[int(c)].append(i)
    out = {}
    for i, e in enumerate(events):
        if e.get("ph") != "X" or _cat(e) not in DEVICE:
            continue
        c = (e.get("args") or {}).get("correlation")
        if c is None or int(c) not in calls:
            continue
        chains = [around[("call", r)] for r in calls[int(c)]]
        if len({tuple(ch) for ch in chains}) != 1:
            continue  # several calls share the id and disagree: no single answer
        chain = chains[0]
        out[i] = {"op": chain[0] if chain else None, "chain": chain}
    return out


def _interval(e: dict) -> tuple[int, int]:
    return us_to_ns(e["ts"]), us_to_ns(e.get("dur", 0))


def _part_of(trace, path) -> int:
    (part,) = [s["part"] for s in trace.sources if s["path"] == str(path)]
    return part


def _gpu_files(trace) -> list:
    return [s for s in trace.sources if "/gpu/" in s["path"]]


# ----------------------------------------------------------------------------------------------
# real GPU traces
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_ancestry(kineto_store):
    trace, _ = kineto_store
    dev = ancestry(trace, levels=["kernel", "memcpy", "memset", "collective"])["ancestry"]
    return trace, dev.set_index("id")


def test_every_launched_kernel_gets_the_op_around_its_runtime_call(gpu_ancestry, raw_json):
    if not KINETO.is_dir():
        pytest.skip(NO_SHARED)
    trace, dev = gpu_ancestry
    leaf = dev["leaf_op_id"].fillna(-1).astype("int64")
    outer = dev["op_id"].fillna(-1).astype("int64")
    mask = (1 << 40) - 1
    checked = with_op = 0
    for src in _gpu_files(trace):
        events = raw_json(src["path"], exact=True)["traceEvents"]
        part = src["part"]
        want = expected_launch_ops(events)
        ids = [(part << 40) | i for i in want]
        got_leaf = leaf.loc[ids].to_numpy()
        got_outer = outer.loc[ids].to_numpy()
        for (i, w), gl, go in zip(want.items(), got_leaf, got_outer, strict=True):
            checked += 1
            if w["op"] is None:
                assert gl < 0 and go < 0, (src["path"], i, gl)
                continue
            with_op += 1
            # an op with the very same interval is as innermost as the other
            assert gl >= 0, (src["path"], i, events[w["op"]]["name"])
            if gl != (part << 40) | w["op"]:
                assert _interval(events[gl & mask]) == _interval(events[w["op"]]), (src, i)
            # the outermost op is the last of the chain
            if go != (part << 40) | w["chain"][-1]:
                assert _interval(events[go & mask]) == _interval(events[w["chain"][-1]])
    assert checked > 50_000 and with_op > 40_000, (checked, with_op)


def _isna(v) -> bool:
    import pandas as pd

    return v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v))


def test_backward_kernels_get_their_forward_op_through_fwdbwd(nccl, raw_json) -> None:
    path, trace = nccl
    events = raw_json(path, exact=True)["traceEvents"]
    around = enclosing_ops(events)
    # fwdbwd: the op around the 's' entry is the forward op, the op around the 'f' the backward
    ends: dict[str, dict[str, list[int]]] = collections.defaultdict(dict)
    for i, e in enumerate(events):
        if e.get("ph") in ("s", "f") and _cat(e) == "fwdbwd":
            chain = around[("flow", i)]
            if chain:
                ends[str(e["id"])][e["ph"]] = chain
    fwd_of = {}
    for v in ends.values():
        if "s" in v and "f" in v:
            b, f = v["f"][0], v["s"][0]
            fwd_of[b] = f
            # the evaluate_function op around a linked backward op stands for it too
            if len(v["f"]) > 1 and events[v["f"][1]]["name"] == EVALUATE + events[b]["name"]:
                fwd_of.setdefault(v["f"][1], f)
    assert len(fwd_of) > 500
    launched = expected_launch_ops(events)
    dev = ancestry(trace, levels=["kernel", "memcpy", "memset", "collective"])[
        "ancestry"
    ].set_index("id")
    backward = 0
    for i, w in launched.items():
        want = next((fwd_of[j] for j in w["chain"] if j in fwd_of), None)
        row = dev.loc[i]
        if want is None:
            assert _isna(row["fwd_op_id"]), (i, events[i]["name"])
            continue
        backward += 1
        assert row["fwd_op_id"] == want, (i, events[i]["name"])
        assert row["pass"] == "backward"
        assert not events[want]["name"].endswith("Backward0")
    assert backward > 1000, backward


def test_backward_without_flows_is_matched_by_sequence_number(kineto_store, raw_json) -> None:
    """2021 traces have no fwdbwd flows: a backward op finds its forward op by the sequence
    number both carry, and the kernels under it take that forward op."""
    trace, _ = kineto_store
    srcs = [s for s in _gpu_files(trace) if "resnet50_v100_2021" in s["path"]]
    if not srcs:
        pytest.skip(NO_SHARED)
    dev = ancestry(trace, levels=["kernel", "memcpy", "memset"])["ancestry"].set_index("id")
    checked = 0
    for src in srcs:
        events = raw_json(src["path"])["traceEvents"]
        part = src["part"]
        for i, w in expected_launch_ops(events).items():
            seqs = [events[j]["args"].get("Sequence number") for j in w["chain"]
                    if re.search(r"Backward\d*$", events[j]["name"])]  # fmt: skip
            row = dev.loc[(part << 40) | i]
            if not seqs:
                assert _isna(row["fwd_op_id"])
                continue
            f = events[int(row["fwd_op_id"]) & ((1 << 40) - 1)]
            assert f["args"]["Sequence number"] == seqs[0]
            assert "Backward" not in f["name"] and f["ts"] < events[i]["ts"]
            assert row["pass"] == "backward"
            checked += 1
    assert checked > 1000


def test_device_time_rolls_up_the_op_tree(nccl, raw_json) -> None:
    """Inclusive device time per op name = device time of the events whose launching call has
    an op of that name around it (each event once per name), from the raw JSON."""
    path, trace = nccl
    events = raw_json(path, exact=True)["traceEvents"]
    launched = expected_launch_ops(events)
    incl: dict[str, int] = collections.defaultdict(int)
    excl: dict[str, int] = collections.defaultdict(int)
    for i, w in launched.items():
        d = us_to_ns(events[i]["dur"])
        for name in {events[j]["name"] for j in w["chain"]}:
            incl[name] += d
        if w["op"] is not None:
            excl[events[w["op"]]["name"]] += d
    res = attribute(trace, by="op")
    df = res.tables["op"].set_index("op")
    assert dict(df.device_ns[df.device_ns > 0]) == dict(incl)
    assert dict(df.device_exclusive_ns[df.device_exclusive_ns > 0]) == {
        k: v for k, v in excl.items() if v
    }
    total = sum(us_to_ns(e["dur"]) for e in events if e.get("ph") == "X" and _cat(e) in DEVICE)
    assert res.facts["device_ns"] == total
    assert df.device_exclusive_ns.sum() == total - res.facts["unattributed_ns"]
    # per step: every device event of a step, by the step of its launch
    st = attribute(trace, by="step").tables["step"]
    assert st.device_ns.sum() <= total and st.kernels.sum() > 3000
    res = hierarchy(trace, by="op")
    assert list(res.tables) == ["op"] and res.notes


# ----------------------------------------------------------------------------------------------
# a capture of the demo model
# ----------------------------------------------------------------------------------------------

#: The aten op each leaf module type runs in its forward (the truth the test holds the
#: hierarchy to); MultiheadAttention runs aten::linear itself (F.multi_head_attention_forward).
LEAF_OPS = {"Linear": "aten::linear", "LayerNorm": "aten::layer_norm", "GELU": "aten::gelu",
            "Embedding": "aten::embedding"}  # fmt: skip


def _spans(trace) -> list[dict]:
    """The layer spans straight from the events table (args decoded here)."""
    t = trace.table("events", columns=["id", "category", "name", "tid", "ts", "dur", "args"])
    rows = [r for r in t.to_pylist() if r["category"] == "xpuprof_layer"]
    for r in rows:
        r.update(json.loads(r["args"]))
    return rows


def test_every_aten_op_of_a_module_forward_is_under_that_module(demo_capture) -> None:
    trace, modules = demo_capture
    a = ancestry(trace)["ancestry"]
    spans = [s for s in _spans(trace) if s["pass"] == "forward"]
    calls = collections.Counter(s["name"] for s in spans)
    # every module ran, under its named_modules path, but MultiheadAttention's out_proj (its
    # weights are used by F.multi_head_attention_forward, the module is never called)
    assert set(calls) == {p for p in modules if not p.endswith(".attn.out_proj")}
    ops = a[a.level == "op"]
    # the model's truth: each leaf module's own aten op sits under a module of that type
    for mtype, op in LEAF_OPS.items():
        rows = ops[(ops.name == op) & (ops["pass"] == "forward")]
        assert len(rows), op
        got_types = {modules[str(p)] for p in rows.layer}
        allowed = {mtype, "MultiheadAttention"} if op == "aten::linear" else {mtype}
        assert got_types <= allowed, (op, got_types)
        for path, t in modules.items():
            if t == mtype:
                assert (rows.layer == path).sum() == calls[path], (op, path)
    # and by time: an outermost op lies in the innermost forward span around its start,
    # and every module path above it (named_modules prefixes) has a span around it too
    ts = np.array([s["ts"] for s in spans])
    end = ts + np.array([s["dur"] for s in spans])
    tid = np.array([s["tid"] for s in spans])
    names = np.array([s["name"] for s in spans], dtype=object)
    op_tid = trace.sql("select id, tid from events where level = 'op'")
    tids = dict(zip(op_tid["id"], op_tid["tid"], strict=True))
    outer = ops[(ops.op_id == ops.id) & (ops["pass"] != "backward")]
    checked = 0
    for r in outer.itertuples():
        inside = (ts <= r.ts) & (r.ts < end) & (tid == tids[r.id])
        if not inside.any():
            assert _isna(r.layer_id), r.name
            continue
        innermost = names[inside][np.argmax(ts[inside])]
        assert r.layer == innermost, (r.name, r.layer, innermost)
        assert set(names[inside]) == {p for p in modules if _is_prefix(p, r.layer, modules)}
        checked += 1
    assert checked > 100
    # the ops below an outermost op share its layer
    sub = ops.merge(outer[["id", "layer"]], left_on="op_id", right_on="id", suffixes=("", "_o"))
    assert len(sub) > len(outer)
    assert (sub.layer.astype(object).fillna("-") == sub.layer_o.astype(object).fillna("-")).all()


def _is_prefix(p: str, path: str, modules: dict) -> bool:
    """Whether module ``p`` encloses (or is) ``path`` in the model's tree."""
    root = next(iter(modules))  # named_modules lists the root first
    return p == root or path == p or path.startswith(p + ".")


def test_backward_ops_take_the_layer_of_their_forward_op(demo_capture) -> None:
    trace, modules = demo_capture
    a = ancestry(trace)["ancestry"].set_index("id")
    links = trace.sql("select src, dst from links where kind = 'fwdbwd'")
    assert len(links) > 50
    for src, dst in zip(links.src, links.dst, strict=True):
        b, f = a.loc[dst], a.loc[src]
        assert b["pass"] == "backward" and b["fwd_op_id"] == src
        assert f["pass"] == "forward"
        if not _isna(f["layer_id"]):
            assert b["layer"] == f["layer"]
    # a module's backward ops are found for each leaf module with parameters
    bwd = a[(a["pass"] == "backward") & a.layer.notna()]
    for path, t in modules.items():
        if t in ("Linear", "LayerNorm", "Embedding"):
            assert (bwd.layer == path).any(), path


def test_layer_attribution_without_device_work(demo_capture) -> None:
    trace, modules = demo_capture
    res = attribute(trace, by="layer")
    df = res.tables["layer"]
    assert set(df.layer) == {p for p in modules if not p.endswith(".attn.out_proj")}
    assert (df.device_ns == 0).all() and res.facts["device_ns"] == 0
    assert any("no device events" in n for n in res.notes)
    by_type = attribute(trace, by="module_type").tables["module_type"].set_index("module_type")
    assert by_type.calls.sum() == len(_spans(trace))


# ----------------------------------------------------------------------------------------------
# a trace written by hand: every number below is worked out on paper
# ----------------------------------------------------------------------------------------------


def hand_trace(path) -> None:
    """Layer spans, ops, launches and kernels with known times (µs): a forward on thread 1
    (layers model > model.fc, model.act), a backward of the addmm on thread 2, one memset
    found only through its correlation id (no flow)."""
    tb = TraceBuilder(rank=None)
    fwd = {"pass": "forward"}
    tb.step(1, ts=0, dur=1000)
    tb.x("model", "xpuprof_layer", 10, 490, module="Net", **fwd)
    tb.x("model.fc", "xpuprof_layer", 20, 180, module="Linear", **fwd)
    tb.op("aten::linear", 25, 165)
    tb.op("aten::addmm", 30, 150)
    tb.launch("gemm_k1", 60, 100, launch_ts=40, launch_dur=10, correlation=1)
    tb.x("model.act", "xpuprof_layer", 210, 90, module="ReLU", **fwd)
    tb.op("aten::relu", 212, 87)
    tb.launch("relu_k2", 240, 20, launch_ts=220, launch_dur=10, correlation=2)
    tb.op("aten::add", 310, 40)
    tb.launch("add_k3", 335, 10, launch_ts=320, launch_dur=10, correlation=3)
    tb.op("aten::zero_", 600, 50)
    tb.launch("Memset (Device)", 630, 5, launch_ts=610, launch_dur=10, correlation=4,
              call="cudaMemsetAsync", cat="gpu_memset", flow=False)  # fmt: skip
    tb.op(EVALUATE + "AddmmBackward0", 700, 200, tid=2)
    tb.op("AddmmBackward0", 705, 185, tid=2)
    tb.op("aten::mm", 710, 90, tid=2)
    tb.launch("gemm_k5", 740, 50, launch_ts=720, launch_dur=10, correlation=5, tid=2)
    tb.flow("fwdbwd", 99, "s", 30)
    tb.flow("fwdbwd", 99, "f", 705, tid=2, bp="e")
    tb.write(path)


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    d = tmp_path_factory.mktemp("hand")
    hand_trace(d / "hand.json")
    xpuprof.import_traces([d / "hand.json"], d / "hand.store")
    trace = xpuprof.load(d / "hand.store")
    yield trace
    trace.close()


def test_ancestry_of_a_hand_written_trace(hand) -> None:
    a = ancestry(hand)["ancestry"].set_index("name")
    k1, k5, ms = a.loc["gemm_k1"], a.loc["gemm_k5"], a.loc["Memset (Device)"]
    assert (k1.runtime, k1.leaf_op, k1.op, k1.layer, k1.module_type, k1["pass"], k1.via) == (
        "cudaLaunchKernel", "aten::addmm", "aten::linear", "model.fc", "Linear", "forward",
        "link")  # fmt: skip
    assert (k5.leaf_op, k5.op, k5.fwd_op, k5.layer, k5["pass"]) == (
        "aten::mm",
        EVALUATE + "AddmmBackward0",
        "aten::addmm",
        "model.fc",
        "backward",
    )
    assert k1.step == k5.step == ms.step == 1
    assert (ms.runtime, ms.leaf_op, ms.via) == ("cudaMemsetAsync", "aten::zero_", "correlation")
    assert _isna(ms.layer) and _isna(ms.layer_id)
    assert a.loc["add_k3", "layer"] == "model" and a.loc["relu_k2", "layer"] == "model.act"


def test_attribution_of_a_hand_written_trace(hand) -> None:
    us = 1000
    res = attribute(hand, by="layer")
    lay = res.tables["layer"].set_index("layer")
    assert dict(lay.device_ns) == {"model": 180 * us, "model.fc": 150 * us, "model.act": 20 * us}
    assert dict(lay.device_exclusive_ns) == {"model": 10 * us, "model.fc": 150 * us,
                                             "model.act": 20 * us}  # fmt: skip
    assert dict(lay.forward_ns) == {"model": 130 * us, "model.fc": 100 * us, "model.act": 20 * us}
    assert dict(lay.backward_ns) == {"model": 50 * us, "model.fc": 50 * us, "model.act": 0}
    assert dict(lay.kernels) == {"model": 4, "model.fc": 2, "model.act": 1}
    assert dict(lay.parent.fillna("-")) == {"model": "-", "model.fc": "model", "model.act": "model"}
    assert res.facts["device_ns"] == 185 * us and res.facts["unattributed_ns"] == 5 * us
    op = attribute(hand, by="op").tables["op"].set_index("op")
    want = {"aten::linear": (100, 0), "aten::addmm": (100, 100), "aten::relu": (20, 20),
            "aten::add": (10, 10), "aten::zero_": (5, 5), EVALUATE + "AddmmBackward0": (50, 0),
            "AddmmBackward0": (50, 0), "aten::mm": (50, 50)}  # fmt: skip
    got = {k: (v.device_ns // us, v.device_exclusive_ns // us) for k, v in op.iterrows()}
    assert got == want
    types = attribute(hand, by="module_type").tables["module_type"].set_index("module_type")
    assert dict(types.device_ns) == {"Net": 180 * us, "Linear": 150 * us, "ReLU": 20 * us}
    step = attribute(hand, by="step").tables["step"]
    assert step[["step", "calls", "step_ns", "kernels", "device_ns"]].values.tolist() == [
        [1, 1, 1000 * us, 5, 185 * us]]  # fmt: skip

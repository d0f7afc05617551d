"""Fusion what-ifs (``sim/transforms/fusion.py``) on real small CPU captures.

The model: ``act`` (``x * sigmoid(x) * w + b``: a chain of four elementwise ops, each consuming
the previous one's output), ``lin`` (a GEMM), then ``tanh`` of the GEMM's output (same shape as
the chain's output: only the GEMM between them keeps them apart) and ``neg`` of another tensor
(right after ``tanh``, but of another shape: not a chain). Expected values are computed here
from the raw events (their ``Input Dims`` and durations) and the local CPU's spec.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

import xpuprof
from xpuprof.core.errors import XpuprofError

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")

ROWS, COLS, STEPS = 64, 128, 4
#: The other tensor of ``neg`` (a shape unlike the chain's).
Q = (32, 16)


class _Act(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(COLS))
        self.b = torch.nn.Parameter(torch.randn(COLS))

    def forward(self, x):
        return x * torch.sigmoid(x) * self.w + self.b


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.act = _Act()
        self.lin = torch.nn.Linear(COLS, COLS)

    def forward(self, x, q):
        g = self.lin(self.act(x))
        return torch.tanh(g), torch.neg(q)


def _capture(path: Path, record_shapes: bool) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = _Model()
        x, q = torch.randn(ROWS, COLS), torch.randn(*Q)
        with torch.no_grad(), xpuprof.profile(path, level="op", record_shapes=record_shapes,
                                              model=model, steps=STEPS, warmup=1,
                                              telemetry=False):  # fmt: skip
            for i in range(STEPS + 2):
                xpuprof.step(i)
                model(x, q)
    finally:
        torch.set_num_threads(threads)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return _capture(tmp_path_factory.mktemp("fusion") / "shapes.store", True)


@pytest.fixture(scope="module")
def trace(store):
    with xpuprof.load(store) as t:
        yield t


def _raw_ops(trace) -> list[dict]:
    """The outermost aten ops (parent a layer or step span), in time order, from the raw
    events: id, name, ts, dur, input dims and types."""
    df = trace.sql(
        "select e.id, e.name, e.ts, e.dur, e.args from events e left join events p "
        "on p.id = e.parent where e.level = 'op' and (p.level is null or p.level <> 'op') "
        "order by e.ts"
    )
    out = []
    for r in df.itertuples():
        a = json.loads(r.args) if isinstance(r.args, str) else {}
        out.append({"id": int(r.id), "name": r.name.removeprefix("aten::"), "ts": int(r.ts),
                    "dur": int(r.dur), "dims": a.get("Input Dims"),
                    "types": a.get("Input type")})  # fmt: skip
    return out


def _tensor_bytes(op: dict) -> list[int]:
    """Bytes of each fp32 tensor input (every tensor here is float)."""
    return [4 * int(np.prod(d)) for d, t in zip(op["dims"], op["types"], strict=True)
            if t == "float"]  # fmt: skip


ELEMENTWISE = {"sigmoid", "mul", "add", "tanh", "neg"}


def test_chain_priced_from_its_external_bytes(trace):
    """The chain's fused time = max(B_ext / (η_m·W), the compute floor) + o, every number
    computed here; the rest of the step replays as measured."""
    from xpuprof.hardware import local_cpu
    from xpuprof.sim.transforms import fusion

    ops = _raw_ops(trace)
    names = [o["name"] for o in ops]
    step_names = ["sigmoid", "mul", "mul", "add", "linear", "tanh", "neg"]
    assert names == step_names * STEPS  # what the model runs, per step
    spec = local_cpu()
    peak, bw = spec.peak("fp32", matrix=False)[0], spec.memory_bandwidth
    n = ROWS * COLS
    for o in ops:  # bytes read and written, by hand
        out = {"neg": int(np.prod(Q)), "linear": n}.get(o["name"], n)
        o["bytes"] = sum(_tensor_bytes(o)) + 4 * out
    # η_m of the elementwise class: Σ (B/W) / Σ T over its ops (each memory-bound on this CPU)
    sum_b, sum_t = 0.0, 0.0
    for o in ops:
        if o["name"] in ELEMENTWISE:
            out = int(np.prod(Q)) if o["name"] == "neg" else n
            assert out / peak < o["bytes"] / bw  # memory-bound: one operation per element
            sum_b, sum_t = sum_b + o["bytes"], sum_t + o["dur"] * 1e-9
    eta_m = (sum_b / bw) / sum_t
    # external bytes: x (sigmoid), x again (mul's other input: the trace cannot say it is the
    # same tensor), w, b, and the output; sigmoid's and the muls' outputs stay inside
    b_ext = 4 * (n + n + COLS + COLS + n)
    roofline_ns = b_ext / (eta_m * bw) * 1e9
    # o: the median duration of the ops that do no work and call no other op
    views = trace.sql(
        "select e.dur from events e where e.level = 'op' and e.flops = 0 "
        "and coalesce(e.bytes, 0) = 0 and not exists (select 1 from events c "
        "where c.parent = e.id and c.level = 'op')"
    )["dur"]
    o_ns = float(statistics.median(views)) if len(views) else 0.0
    # the reported compute floor: each chain op's time beyond o and its bytes at W*, the best
    # median bandwidth of an op name
    roof = max(statistics.median(o["bytes"] / o["dur"] for o in ops if o["name"] == name)
               for name in set(names))  # fmt: skip
    regions, _ = fusion.plan(trace, "fuse-elementwise")
    assert len(regions) == STEPS
    expected = []
    for k, r in enumerate(regions.itertuples()):
        chain = ops[7 * k : 7 * k + 4]
        floor = sum(max(0.0, o["dur"] - o_ns - o["bytes"] / roof) for o in chain)
        assert list(r.ops) == [o["id"] for o in chain]
        assert r.bytes_external == b_ext
        assert r.roofline_ns == pytest.approx(roofline_ns, rel=1e-6)
        assert r.compute_floor_ns == pytest.approx(floor, rel=1e-6, abs=1e-3)
        assert r.overhead_ns == o_ns
        assert r.model_ns == pytest.approx(max(roofline_ns, floor), rel=1e-6)
        expected.append(max(roofline_ns, floor) + o_ns)
    # in the replay: the chain (first op's start to last op's end) takes the fused time
    from xpuprof.sim.whatif import whatif

    w = whatif(trace, ["fuse-elementwise"])
    g = w.baseline.graph
    pairs = enumerate(zip(g.nodes.event.tolist(), g.nodes.kind.tolist(), strict=True))
    node = {(e, k): i for i, (e, k) in pairs if k in (0, 1)}
    fused = 0
    for k in range(STEPS):
        step = ops[7 * k : 7 * k + 7]
        s0, s1 = node.get((step[0]["id"], 0)), node.get((step[3]["id"], 1))
        if s0 is None:
            continue  # a step outside the replay
        fused += 1
        assert w.time[s1] - w.time[s0] == pytest.approx(expected[k], abs=8)
        for o in step[4:]:  # linear, tanh, neg: unchanged
            a, b = node[(o["id"], 0)], node[(o["id"], 1)]
            assert w.time[b] - w.time[a] == o["dur"]
    assert fused >= STEPS - 1
    base, pred = w.summary["baseline_ns"].iloc[0], w.summary["predicted_ns"].iloc[0]
    assert base > pred  # the chain's four calls and its 1.5× extra traffic go


def test_gemm_between_or_other_shapes_is_not_a_chain(trace):
    """add → linear → tanh (same shapes, a GEMM between) and tanh → neg (adjacent, other
    shapes) are not fused: only the four ops of ``act`` are."""
    from xpuprof.sim.transforms import fusion

    ops = _raw_ops(trace)
    add, lin, tanh, neg = ops[3], ops[4], ops[5], ops[6]
    # what would fuse them if the rules did not hold: matching shapes across the GEMM, and
    # adjacency between tanh and neg
    assert lin["dims"][0] == [ROWS, COLS] and tanh["dims"][0] == [ROWS, COLS]
    assert neg["dims"][0] == list(Q) and tanh["ts"] + tanh["dur"] <= neg["ts"]
    regions, _ = fusion.plan(trace, "fuse-elementwise")
    fused = {i for r in regions["ops"] for i in r}
    assert add["id"] in fused
    others = {o["id"] for o in ops if o["name"] in ("tanh", "neg", "linear")}
    assert not fused & others
    assert set(regions["names"]) == {"sigmoid → mul → mul → add"}


def test_fuse_span_of_the_module(trace):
    """``fuse:^act$`` fuses the same four ops as one op of their class; a scope that holds
    no chain is an error that says why."""
    from xpuprof.sim.transforms import fusion

    span, _ = fusion.plan(trace, "fuse:^act$")
    chain, _ = fusion.plan(trace, "fuse-elementwise:^act$")
    assert list(span["ops"]) == list(chain["ops"])
    assert set(span["cls"]) == {"elementwise"} and set(span["span"]) == {"act"}
    assert np.allclose(span["model_ns"], chain["model_ns"])
    with pytest.raises(XpuprofError, match="no elementwise op inside the matched spans"):
        fusion.plan(trace, "fuse-elementwise:^lin$")


def test_fuse_pattern_matching_nothing_names_the_spans(trace):
    from xpuprof.sim.whatif import whatif

    with pytest.raises(XpuprofError) as e:
        whatif(trace, ["fuse:attention"])
    msg = str(e.value)
    assert "'attention' matches no host span" in msg
    assert "act" in msg and "lin" in msg


def test_trace_without_shapes_says_record_shapes(tmp_path):
    from xpuprof.sim.whatif import whatif

    store = _capture(tmp_path / "plain.store", False)
    with xpuprof.load(store) as t:
        for change in ("fuse-elementwise", "fuse:^act$"):
            with pytest.raises(XpuprofError, match="record_shapes"):
                whatif(t, [change])


@pytest.mark.parametrize("text, match", [("fuse", "name the span"),
                                         ("fuse-elementwise=2", "takes no value"),
                                         ("fuse:(", "bad pattern")])  # fmt: skip
def test_parse_errors(text, match):
    from xpuprof.sim.whatif import parse

    with pytest.raises(XpuprofError, match=match):
        parse(text)


# -- a GPU trace by hand --------------------------------------------------------------------------

#: The GPU trace's tensors: x (1024×1024 fp32) and a bias row.
X, BIAS = [1024, 1024], [1024]
KERNEL_US = 20


def _gpu_trace(tmp_path: Path) -> Path:
    """One step: sigmoid(x) → mul(x, s) → add(·, bias) → mm → relu, each op launching one
    kernel on stream 7 (µs): ops 10 µs long every 15 µs from 10, their kernels 20 µs back to
    back from 30; the mm kernel 40 µs."""
    from builders import TraceBuilder

    props = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920}]
    tb = TraceBuilder(rank=None, schemaVersion=1, device_properties=props)
    tb.step(0, 0, 200)
    f = "float"
    ops = [("aten::sigmoid", [X], [f]), ("aten::mul", [X, X], [f, f]),
           ("aten::add", [X, BIAS, []], [f, f, "Scalar"]), ("aten::mm", [X, X], [f, f]),
           ("aten::relu", [X], [f])]  # fmt: skip
    k_ts = 30
    for i, (name, dims, types) in enumerate(ops):
        ts = 10 + 15 * i
        tb.op(name, ts, 10, **{"Input Dims": dims, "Input type": types})
        dur = 40 if name == "aten::mm" else KERNEL_US
        tb.launch(f"kernel_{name[6:]}", k_ts, dur, launch_ts=ts + 2, correlation=100 + i,
                  flow=False)  # fmt: skip
        k_ts += dur
    return tb.store(tmp_path)


def test_gpu_chain_one_kernel_one_launch(tmp_path):
    """On a GPU: the chain's first kernel takes B_ext/(η_m·W), the others none and their
    launches go; the host time of the other ops and between them goes; the GEMM after is
    unchanged."""
    from xpuprof.hardware import specs
    from xpuprof.sim.whatif import whatif

    bw = specs.match("NVIDIA A100-SXM4-80GB").memory_bandwidth
    with xpuprof.load(_gpu_trace(tmp_path)) as t:
        n = 4 * X[0] * X[1]
        # every elementwise op memory-bound (1 FLOP per element against 19.5 TFLOP/s fp32)
        op_bytes = [2 * n, 3 * n, 2 * n + 4 * BIAS[0], 2 * n]  # sigmoid, mul, add, relu
        eta_m = sum(b / bw for b in op_bytes) / (4 * KERNEL_US * 1e-6)
        b_ext = n + n + 4 * BIAS[0] + n  # x, x again, bias; the output
        expected_ns = b_ext / (eta_m * bw) * 1e9
        w = whatif(t, ["fuse-elementwise"])
        g = w.baseline.graph
        ev = t.sql("select id, name, level from events where level in ('op', 'kernel', "
                   "'runtime')")  # fmt: skip
        ids = dict(zip(ev["name"], ev["id"], strict=True))
        pairs = enumerate(zip(g.nodes.event.tolist(), g.nodes.kind.tolist(), strict=True))
        node: dict[tuple[int, int], int] = {}
        for i, (e, k) in pairs:
            node.setdefault((e, k), i)

        def span(name: str, device: bool = False) -> float:
            a, b = (2, 3) if device else (0, 1)
            return w.time[node[(ids[name], b)]] - w.time[node[(ids[name], a)]]

        assert span("kernel_sigmoid", True) == pytest.approx(expected_ns, abs=1)
        assert span("kernel_mul", True) == 0 and span("kernel_add", True) == 0
        assert span("kernel_mm", True) == 40_000 and span("kernel_relu", True) == KERNEL_US * 1000
        assert span("aten::sigmoid") == 10_000  # the fused op's call: kept
        assert span("aten::mul") == 0 and span("aten::add") == 0
        assert span("aten::mm") == 10_000
        # the Python between sigmoid and mul, and inside the fused ops, went; add → mm's stayed
        gap = w.time[node[(ids["aten::mm"], 0)]] - w.time[node[(ids["aten::sigmoid"], 1)]]
        assert gap == 5_000
        # the GEMM's kernel runs right after the fused one (its launch was early enough)
        fused_end = w.time[node[(ids["kernel_sigmoid"], 3)]]
        assert w.time[node[(ids["kernel_mm"], 2)]] == fused_end

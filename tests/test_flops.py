"""FLOPs and bytes derived from recorded shapes (``xpuprof.costmodel``).

The peer is ``torch.utils.flop_counter.FlopCounterMode`` run on the same model with the same
inputs: it counts at dispatch time from real tensors, we count afterwards from the profiler's
``Input Dims``/``Input type``/``Concrete Inputs`` text. Hand-computed cases pin the formulas, and
the GEMMs of the real example trace are checked against 2·M·K·N taken from their own dims.
"""

from __future__ import annotations

import json
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import EXAMPLE, NO_SHARED, kineto_files, read_text

from xpuprof.costmodel.call import EXACT_KINDS, ITEMSIZE, SCALAR_TYPE_ITEMSIZE
from xpuprof.costmodel.conv import CONV_FORWARD
from xpuprof.costmodel.derive import derive
from xpuprof.costmodel.ops import op_cost, op_kind, supported_ops
from xpuprof.trace.tree import outermost

# ----------------------------------------------------------------------------------------------
# helpers: profile a function, read its cpu_op events with json, nest them, count FLOPs both ways
# ----------------------------------------------------------------------------------------------


def _ops(trace: dict) -> list[dict]:
    return [
        e
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("cpu_op", "operator")
    ]


def _parents(ev: list[dict]) -> np.ndarray:
    """Parent position of each op among ``ev`` (-1: none): the innermost op on the same
    (pid, tid) that contains it, found with a stack over start order."""
    ns = [(round(float(e["ts"]) * 1000), round(float(e.get("dur", 0)) * 1000)) for e in ev]
    order = sorted(
        range(len(ev)), key=lambda i: (str(ev[i]["pid"]), str(ev[i]["tid"]), ns[i][0], -ns[i][1])
    )
    parent = np.full(len(ev), -1, np.int64)
    stack: list[int] = []
    track = None
    for i in order:
        t = (str(ev[i]["pid"]), str(ev[i]["tid"]))
        if t != track:
            stack, track = [], t
        start, end = ns[i][0], ns[i][0] + ns[i][1]
        while stack and not (ns[stack[-1]][0] <= start and end <= sum(ns[stack[-1]])):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return parent


def _derive(ev: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    names = [e["name"] for e in ev]
    args = [json.dumps(e["args"]) if "args" in e else None for e in ev]
    return derive(names, args)


def _profile(fn, tmp_path: Path) -> list[dict]:
    torch = pytest.importorskip("torch")
    fn()  # warm up: first calls take other paths (lazy init), not the ones measured
    path = tmp_path / "trace.json"
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as p:
        fn()
    p.export_chrome_trace(str(path))
    return _ops(json.loads(path.read_text()))


def _flop_counter(fn) -> dict[str, int]:
    pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return {str(k).split(".")[-1]: v for k, v in fc.get_flop_counts().get("Global", {}).items()}


def _by_name(ev: list[dict], flops: np.ndarray) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for e, f in zip(ev, flops, strict=True):
        if not np.isnan(f):
            out[e["name"].removeprefix("aten::")] += f
    return out


def _total(ev: list[dict], flops: np.ndarray, kinds: frozenset[str] = EXACT_KINDS) -> float:
    """Sum over the outermost ops with a value, of the given kinds."""
    mask = outermost(~np.isnan(flops), _parents(ev))
    keep = np.array([op_kind(e["name"]) in kinds for e in ev]) & mask
    return float(flops[keep].sum())


def _close(a: float, b: float, rel: float = 0.01) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _compare(ev: list[dict], flops: np.ndarray, fcm: dict[str, int]) -> None:
    """Per op FlopCounterMode counts, our per-name sum matches within 1 %; and our total over
    the outermost exact ops matches its total (nothing counted twice, nothing missed)."""
    ours = _by_name(ev, flops)
    assert fcm, "FlopCounterMode counted nothing"
    for op, want in fcm.items():
        assert _close(ours.get(op, 0.0), want), (op, ours.get(op), want)
    assert _close(_total(ev, flops), sum(fcm.values())), (_total(ev, flops), fcm)


# ----------------------------------------------------------------------------------------------
# hand-computed
# ----------------------------------------------------------------------------------------------


def test_mm_is_2mkn_and_bytes_are_inputs_plus_output() -> None:
    m, k, n = 37, 129, 64
    f, b = op_cost("aten::mm", [[m, k], [k, n]], ["float", "float"], ["", ""])
    assert f == 2 * m * k * n
    assert b == (m * k + k * n + m * n) * 4
    f, b = op_cost("mm", [[m, k], [k, n]], ["c10::BFloat16", "c10::BFloat16"], None)
    assert f == 2 * m * k * n and b == (m * k + k * n + m * n) * 2
    # addmm: the bias add is not counted (flop_counter's convention), its bytes are
    types = ["float", "float", "float", "Scalar", "Scalar"]
    f, b = op_cost("aten::addmm", [[n], [m, k], [k, n], [], []], types, ["", "", "", "1", "1"])
    assert f == 2 * m * k * n and b == (n + m * k + k * n + m * n) * 4
    f, _ = op_cost("aten::bmm", [[3, m, k], [3, k, n]], ["float", "float"], ["", ""])
    assert f == 2 * 3 * m * k * n
    f, _ = op_cost("aten::linear", [[4, 5, k], [n, k], [n]], ["float"] * 3, ["", "", ""])
    assert f == 2 * 20 * k * n
    f, _ = op_cost("aten::matmul", [[2, 1, m, k], [3, k, n]], ["float"] * 2, ["", ""])
    assert f == 2 * 6 * m * k * n  # broadcast batch 2 x 3


def test_conv2d_known_shape() -> None:
    # x (2,3,32,32) * w (16,3,5,5), stride 2, padding 1, dilation 1: out (2,16,15,15)
    out = (32 + 2 * 1 - 1 * (5 - 1) - 1) // 2 + 1
    assert out == 15
    want = 2 * 2 * out * out * 5 * 5 * 16 * 3
    want_bytes = (2 * 3 * 32 * 32 + 16 * 3 * 5 * 5 + 16 + 2 * 16 * out * out) * 4
    x, w = [2, 3, 32, 32], [16, 3, 5, 5]
    conv = op_cost(
        "aten::convolution",
        [x, w, [16], [], [], [], [], [], []],
        ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar",
         "ScalarList", "Scalar"],
        ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"],
    )  # fmt: skip
    assert conv == (want, want_bytes)
    # the same convolution through the CPU backends' own argument orders
    mkldnn = op_cost(
        "aten::mkldnn_convolution",
        [x, w, [16], [], [], [], []],
        ["float", "float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
        ["", "", "", "[1, 1]", "[2, 2]", "[1, 1]", "1"],
    )
    slow = op_cost(
        "aten::_slow_conv2d_forward",
        [x, w, [], [16], [], []],
        ["float", "float", "ScalarList", "float", "ScalarList", "ScalarList"],
        ["", "", "[5, 5]", "", "[2, 2]", "[1, 1]"],
    )
    assert mkldnn == slow == (want, want_bytes)
    # grouped, dilated: weight (16, 3/… ) holds C_in/groups, the count uses it as is
    f, _ = op_cost(
        "aten::conv2d",
        [[1, 8, 20, 20], [8, 2, 3, 3], [], [], [], [], []],
        ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
        ["", "", "", "[1, 1]", "[0, 0]", "[2, 2]", "4"],
    )
    assert f == 2 * 1 * 16 * 16 * 9 * 8 * 2  # out = 20 - 2*(3-1) = 16
    # transposed: FLOPs over the input positions, no stride needed
    f, b = op_cost(
        "aten::conv_transpose2d",
        [[1, 3, 8, 8], [3, 4, 3, 3], [], [], [], [], [], []],
        ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList"],
        ["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "1", "[1, 1]"],
    )
    assert f == 2 * 1 * 8 * 8 * 9 * 3 * 4
    side = (8 - 1) * 2 + (3 - 1) + 1 + 1  # 18
    assert b == (3 * 64 + 3 * 4 * 9 + 4 * side * side) * 4


def test_attention_matches_torch_formula() -> None:
    pytest.importorskip("torch")
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q, k, v = [2, 8, 128, 64], [2, 2, 96, 64], [2, 2, 96, 32]  # GQA, Dv != Dqk
    f, _ = op_cost("aten::_scaled_dot_product_flash_attention", [q, k, v], ["c10::Half"] * 3)
    assert f == sdpa_flop_count(q, k, v)
    go = [2, 8, 128, 32]
    f, _ = op_cost(
        "aten::_scaled_dot_product_efficient_attention_backward",
        [go, q, k, v, [], go, [2, 8, 128]],
        ["c10::Half"] * 4 + ["", "c10::Half", "float"],
    )
    assert f == sdpa_backward_flop_count(go, q, k, v)
    # the flash kernels' own (B, S, H, D) layout counts the same computation
    bshd = [[2, 128, 8, 64], [2, 96, 2, 64], [2, 96, 2, 32]]
    f, _ = op_cost("aten::_flash_attention_forward", [*bshd, [], []], ["c10::Half"] * 3 + ["", ""])
    assert f == sdpa_flop_count(q, k, v)


def test_unknown_is_none_not_a_guess() -> None:
    assert op_cost("aten::some_new_op", [[4]], ["float"], [""]) == (None, None)
    assert op_cost("AddmmBackward0", [[4, 4]], ["float"], [""]) == (None, None)
    assert op_cost("aten::to", [[4], []], ["float", "Scalar"], ["", "6"]) == (None, None)
    # shapes that do not fit the op
    assert op_cost("aten::mm", [[4, 5], [6, 7]], ["float", "float"], ["", ""]) == (None, None)
    assert op_cost("aten::mm", [[4, 5]], ["float"], [""]) == (None, None)
    # a 2021 trace records no Concrete Inputs: the stride of a convolution is unknown ...
    old = op_cost(
        "aten::cudnn_convolution",
        [[32, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []],
        ["float", "float", "GenericList", "GenericList", "GenericList", "Int", "Bool", "Bool",
         "Bool"],
        None,
    )  # fmt: skip
    assert old == (None, None)
    # ... but its backward-input convolution needs none: the output gradient gives the positions
    f, b = op_cost(
        "aten::cudnn_convolution_backward_input",
        [[], [32, 2048, 7, 7], [2048, 512, 1, 1], [], [], [], [], [], [], []],
        ["GenericList", "float", "float", "GenericList", "GenericList", "GenericList", "Int",
         "Bool", "Bool", "Bool"],
        None,
    )  # fmt: skip
    assert f == 2 * 32 * 49 * 1 * 2048 * 512 and b is None  # grad-input size not recorded
    # a backward whose output_mask is not recorded
    assert op_cost(
        "aten::convolution_backward",
        [[2, 16, 7, 7], [2, 8, 16, 16], [16, 4, 3, 3]] + [[]] * 8,
        ["float"] * 3 + ["ScalarList"] * 4 + ["Scalar", "ScalarList", "Scalar", "ScalarList"],
        None,
    ) == (None, None)
    # a tensor list: shapes known (FLOPs), dtype not (bytes)
    assert op_cost("aten::cat", [[], []], ["TensorList", "Scalar"], ["", "0"]) == (0.0, None)
    f, b = op_cost(
        "aten::_foreach_add_",
        [[[128, 128], [128]], [[128, 128], [128]], []],
        ["TensorList", "TensorList", "Scalar"],
        ["", "", "-0.001"],
    )
    assert f == 128 * 128 + 128 and b is None


def test_estimated_kinds_follow_their_documented_model() -> None:
    n = 8 * 32 * 64
    assert op_cost("aten::add", [[8, 32, 64], [64], []], ["float", "float", "Scalar"],
                   ["", "", "1"]) == (n, (n + 64 + n) * 4)  # fmt: skip
    assert op_cost("aten::add_", [[8, 32, 64], [8, 32, 64], []], ["float", "float", "Scalar"],
                   ["", "", "1"]) == (n, 3 * n * 4)  # fmt: skip
    assert op_cost("aten::gt", [[8, 32, 64], []], ["float", "Scalar"], ["", "0"]) == (n, n * 5)
    f, b = op_cost(
        "aten::native_layer_norm",
        [[8, 32, 64], [], [64], [64], []],
        ["float", "ScalarList", "float", "float", "Scalar"],
        ["", "[64]", "", "", "1e-05"],
    )
    assert f == 7 * n  # 5 per element + weight + bias
    assert b == (n + 64 + 64 + n) * 4 + 2 * 8 * 32 * 4  # + mean and rstd per row
    f, b = op_cost("aten::sum", [[256, 512], [], [], []], ["float", "ScalarList", "Scalar", ""],
                   ["", "[0]", "True", ""])  # fmt: skip
    assert f == 256 * 512 and b == (256 * 512 + 512) * 4
    f, b = op_cost("aten::_softmax", [[4, 10], [], []], ["c10::Half", "Scalar", "Scalar"],
                   ["", "-1", "True"])  # fmt: skip
    assert f == 5 * 40 and b == 40 * 2 + 40 * 4  # half in, float out
    for name in ("aten::view", "aten::t", "aten::empty", "aten::as_strided"):
        assert op_cost(name, [], [], None) == (0.0, 0.0) and op_kind(name) == "view"
    assert op_kind("aten::mm") in EXACT_KINDS and op_kind("aten::gelu") not in EXACT_KINDS


def test_conv_argument_positions_match_torch_schemas() -> None:
    """Our table of where each convolution keeps stride/padding/… against torch's schemas."""
    torch = pytest.importorskip("torch")
    checked = 0
    for name, spec in CONV_FORWARD.items():
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{name}")
        if not schemas:
            continue  # an op of another torch version or backend
        fits = False
        for s in schemas:
            arg = [a.name for a in s.arguments]
            want = {spec.stride: "stride", spec.padding: "padding", spec.dilation: "dilation",
                    spec.transposed: "transposed", spec.output_padding: "output_padding",
                    spec.groups: "groups"}  # fmt: skip
            if all(p < 0 or (p < len(arg) and arg[p] == w) for p, w in want.items()):
                fits = True
        assert fits, (name, [str(s) for s in schemas])
        checked += 1
    assert checked >= 15


def test_dtype_names_and_codes_match_torch(tmp_path: Path) -> None:
    """Every dtype's profiler spelling, and its ScalarType code as a ``dtype`` argument, maps to
    its real item size."""
    torch = pytest.importorskip("torch")
    dtypes = sorted({d for d in vars(torch).values() if isinstance(d, torch.dtype)}, key=str)

    def works(fn) -> bool:
        try:
            fn()
        except (RuntimeError, TypeError, NotImplementedError):
            return False
        return True

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cloned = [d for d in dtypes if works(lambda d=d: torch.empty(3, dtype=d).clone())]
        cast = [d for d in dtypes if works(lambda d=d: torch.empty(3).to(d))]

        def run() -> None:
            for d in cloned:
                torch.empty(3, dtype=d).clone()
            for d in cast:
                torch.empty(3).to(d)

        ev = _profile(run, tmp_path)
    names = [e["args"]["Input type"][0] for e in ev if e["name"] == "aten::clone"]
    assert len(names) == len(cloned) >= 20
    for d, t in zip(cloned, names, strict=True):
        assert ITEMSIZE.get(t) == d.itemsize, (d, t)
    tos = [e for e in ev if e["name"] == "aten::to"]
    assert len(tos) == len(cast) >= 15
    for d, e in zip(cast, tos, strict=True):
        code = e["args"]["Concrete Inputs"][1]
        assert SCALAR_TYPE_ITEMSIZE.get(int(code)) == d.itemsize, (d, code)


# ----------------------------------------------------------------------------------------------
# against FlopCounterMode on real models
# ----------------------------------------------------------------------------------------------


# batch 3: the args decoded 3 rows at a time, the calls deduplicated across the batches
@pytest.mark.parametrize("batch", [None, 3])
def test_linear_mlp_forward_backward_matches_flop_counter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int | None
) -> None:
    torch = pytest.importorskip("torch")
    if batch:
        monkeypatch.setattr("xpuprof.costmodel.derive.DECODE_BATCH", batch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(48, 96),
        torch.nn.GELU(),
        torch.nn.Linear(96, 96, bias=False),
        torch.nn.ReLU(),
        torch.nn.Linear(96, 10),
    )
    x = torch.randn(6, 7, 48)  # 3-D input: linear folds it into one GEMM

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).square().sum().backward()

    fcm = _flop_counter(step)
    assert set(fcm) == {"addmm", "mm"}
    ev = _profile(step, tmp_path)
    flops, nbytes = _derive(ev)
    _compare(ev, flops, fcm)
    # every GEMM op got bytes too
    gemm = [i for i, e in enumerate(ev) if e["name"] in ("aten::mm", "aten::addmm")]
    assert gemm and not np.isnan(nbytes[gemm]).any()


def test_conv_net_forward_backward_matches_flop_counter(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, groups=2),
        torch.nn.Conv2d(16, 16, 3, padding=2, dilation=2, bias=False),
        torch.nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1, output_padding=1),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(5),
    )
    x = torch.randn(2, 3, 17, 17)
    model(x)  # materialize the lazy layer

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    fcm = _flop_counter(step)
    assert {"convolution", "convolution_backward"} <= set(fcm)
    ev = _profile(step, tmp_path)
    flops, _ = _derive(ev)
    _compare(ev, flops, fcm)


def test_conv1d_and_conv3d_match_flop_counter(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    c1 = torch.nn.Conv1d(4, 6, 5, stride=2, padding=1)
    c3 = torch.nn.Conv3d(2, 3, (2, 3, 3), padding=(0, 1, 1))
    x1 = torch.randn(3, 4, 33, requires_grad=True)
    x3 = torch.randn(1, 2, 5, 9, 9)

    def step() -> None:
        (c1(x1).sum() + c3(x3).sum()).backward()

    fcm = _flop_counter(step)
    ev = _profile(step, tmp_path)
    flops, _ = _derive(ev)
    _compare(ev, flops, fcm)


def test_plain_matmul_bmm_match_flop_counter(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    a, b = torch.randn(3, 40, 50), torch.randn(3, 50, 60)
    c, bias = torch.randn(60, 70), torch.randn(70)

    def step() -> None:
        torch.matmul(a, b)  # -> bmm
        torch.bmm(a, b)
        torch.mm(a[0], b[0])
        a @ c[:50]  # 3-D @ 2-D -> one folded mm
        torch.addmm(bias, b[1], c)
        torch.baddbmm(torch.zeros(3, 40, 60), a, b)
        torch.einsum("bij,bjk->bik", a, b)  # -> bmm

    fcm = _flop_counter(step)
    assert set(fcm) == {"bmm", "mm", "addmm", "baddbmm"}
    ev = _profile(step, tmp_path)
    flops, _ = _derive(ev)
    _compare(ev, flops, fcm)


def test_transformer_layer_matches_flop_counter(tmp_path: Path) -> None:
    """A training step of a small transformer: every GEMM FlopCounterMode counts is counted once
    (linear, matmul and their mm/addmm children nest), attention on the side."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    emb = torch.nn.Embedding(50, 32)
    tok = torch.randint(0, 50, (3, 11))

    def step() -> None:
        layer.zero_grad(set_to_none=True)
        emb.zero_grad(set_to_none=True)
        out = layer(emb(tok)).flatten(0, 1)
        torch.nn.functional.cross_entropy(out, tok.flatten() % 32).backward()

    fcm = _flop_counter(step)
    assert set(fcm) == {"mm", "addmm"}  # the CPU flash attention kernel is not registered
    ev = _profile(step, tmp_path)
    flops, _ = _derive(ev)
    ours = _by_name(ev, flops)
    for op, want in fcm.items():
        assert _close(ours[op], want), (op, ours[op], want)
    assert _close(_total(ev, flops, frozenset({"matmul"})), sum(fcm.values()))
    assert _total(ev, flops, frozenset({"attention"})) > 0


def test_attention_on_cpu(tmp_path: Path) -> None:
    """FlopCounterMode registers no formula for the CPU flash kernel (it counts 0 there), so the
    fused path is checked against torch's own formula functions; the math path decomposes into
    bmm, which FlopCounterMode does count."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = torch.randn(2, 4, 24, 16, requires_grad=True)
    k = torch.randn(2, 4, 20, 16, requires_grad=True)
    v = torch.randn(2, 4, 20, 16, requires_grad=True)

    def fused() -> None:
        torch.nn.functional.scaled_dot_product_attention(q, k, v).sum().backward()

    assert _flop_counter(fused) == {}
    ev = _profile(fused, tmp_path)
    flops, _ = _derive(ev)
    by = _by_name(ev, flops)
    shapes = ([2, 4, 24, 16], [2, 4, 20, 16], [2, 4, 20, 16])
    fwd, bwd = sdpa_flop_count(*shapes), sdpa_backward_flop_count([2, 4, 24, 16], *shapes)
    assert by["_scaled_dot_product_flash_attention_for_cpu"] == fwd
    assert by["_scaled_dot_product_flash_attention_for_cpu_backward"] == bwd
    assert by["scaled_dot_product_attention"] == fwd  # the composite carries it too ...
    assert _total(ev, flops) == fwd + bwd  # ... and is counted once

    v8 = torch.randn(2, 4, 20, 8, requires_grad=True)  # Dv != Dqk

    def math_path() -> None:
        with sdpa_kernel(SDPBackend.MATH):
            torch.nn.functional.scaled_dot_product_attention(q, k, v8).sum().backward()

    fcm = _flop_counter(math_path)
    assert set(fcm) == {"bmm"}
    ev = _profile(math_path, tmp_path)
    flops, _ = _derive(ev)
    assert _close(_total(ev, flops), sum(fcm.values()))
    assert _close(_by_name(ev, flops)["bmm"], fcm["bmm"])


# ----------------------------------------------------------------------------------------------
# real traces
# ----------------------------------------------------------------------------------------------


def _gemm_want(name: str, dims: list) -> int:
    if name == "aten::mm":
        (m, k), (_, n) = dims[0], dims[1]
        return 2 * m * k * n
    if name == "aten::addmm":
        (m, k), (_, n) = dims[1], dims[2]
        return 2 * m * k * n
    (b, m, k), (_, _, n) = dims[0], dims[1]
    return 2 * b * m * k * n


def test_example_trace_gemms_are_2mkn() -> None:
    ev = _ops(json.loads(read_text(EXAMPLE)))
    flops, nbytes = _derive(ev)
    gemm = [i for i, e in enumerate(ev) if e["name"] in ("aten::mm", "aten::addmm", "aten::bmm")]
    assert len(gemm) >= 80
    for i in gemm:
        assert flops[i] == _gemm_want(ev[i]["name"], ev[i]["args"]["Input Dims"]), ev[i]
        assert nbytes[i] > 0
    # inclusive values nest consistently: each linear carries exactly what its GEMM child does
    parent = _parents(ev)
    for i, e in enumerate(ev):
        if e["name"] == "aten::linear":
            below = [j for j in range(len(ev)) if _is_below(parent, j, i) and j in set(gemm)]
            assert below and flops[i] == sum(flops[j] for j in below)


def _is_below(parent: np.ndarray, j: int, i: int) -> bool:
    p = parent[j]
    while p >= 0:
        if p == i:
            return True
        p = parent[p]
    return False


def test_shared_traces_gemms_are_2mkn_and_nothing_raises() -> None:
    files = kineto_files()
    if not files:
        pytest.skip(NO_SHARED)
    checked = 0
    for f in files:
        try:
            doc = json.loads(read_text(f))
        except ValueError:
            continue  # the damaged files of the bad-input tests
        ev = _ops(doc)
        if not ev:
            continue
        flops, nbytes = _derive(ev)
        assert len(flops) == len(ev) == len(nbytes)
        for i, e in enumerate(ev):
            dims = (e.get("args") or {}).get("Input Dims")
            if e["name"] in ("aten::mm", "aten::addmm", "aten::bmm") and dims:
                assert flops[i] == _gemm_want(e["name"], dims), (f, e)
                checked += 1
    assert checked > 50


@pytest.mark.parametrize("batch", [None, 5])
def test_derive_accepts_arrow_columns_and_survives_bad_rows(
    monkeypatch: pytest.MonkeyPatch, batch: int | None
) -> None:
    if batch:  # the damaged row's batch falls back to row by row, the others do not
        monkeypatch.setattr("xpuprof.costmodel.derive.DECODE_BATCH", batch)
    ev = _ops(json.loads(read_text(EXAMPLE)))
    names = [e["name"] for e in ev]
    args = [json.dumps(e["args"]) if "args" in e else None for e in ev]
    want_f, want_b = derive(names, args)
    half = len(ev) // 2
    name_col = pa.chunked_array(
        [pa.array(names[:half]).dictionary_encode(), pa.array(names[half:]).dictionary_encode()]
    )
    arg_col = pa.chunked_array([pa.array(args[:half], pa.large_string()),
                                pa.array(args[half:], pa.large_string())])  # fmt: skip
    f, b = derive(name_col, arg_col)
    np.testing.assert_array_equal(f, want_f)
    np.testing.assert_array_equal(b, want_b)
    # a damaged args text loses that row only
    i = next(i for i, n in enumerate(names) if n == "aten::mm")
    bad = list(args)
    bad[i] = '{"Input Dims": [[1, 2'
    f, _ = derive(names, bad)
    assert np.isnan(f[i])
    others = np.arange(len(f)) != i
    np.testing.assert_array_equal(f[others], want_f[others])
    # empty input
    f, b = derive([], [])
    assert f.shape == b.shape == (0,)


def test_outermost_counts_each_computation_once() -> None:
    # 0 linear(4) > 1 t(0) , 2 addmm(4) > 3 copy_ ; 4 Backward node(nan) > 5 mm(2), 6 mm(2)
    f = np.array([4, 0, 4, 0, np.nan, 2, 2], float)
    parent = np.array([-1, 0, 0, 2, -1, 4, 4])
    mask = outermost(~np.isnan(f), parent)
    assert mask.tolist() == [True, False, False, False, False, True, True]
    assert f[mask].sum() == 8
    # the same through event ids, as the events table holds them
    ids = np.array([10, 11, 12, 13, 14, 15, 16]) << 3
    pid = np.where(parent >= 0, ids[np.maximum(parent, 0)], -1)
    assert (outermost(~np.isnan(f), pid, ids) == mask).all()


def test_derive_speed_on_repeated_real_ops() -> None:
    """A loose guard (the measured numbers are in the report): 10x the example trace's ops."""
    ev = _ops(json.loads(read_text(EXAMPLE))) * 10
    names = pa.array([e["name"] for e in ev]).dictionary_encode()
    args = pa.array([json.dumps(e["args"]) if "args" in e else None for e in ev], pa.large_string())
    t = time.perf_counter()
    f, _ = derive(names, args)
    assert time.perf_counter() - t < 1.0
    assert (~np.isnan(f)).sum() > len(ev) // 2


def test_supported_ops_listed() -> None:
    ops = supported_ops()
    for name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear",
                 "aten::convolution", "aten::convolution_backward",
                 "aten::_scaled_dot_product_flash_attention", "aten::native_layer_norm",
                 "aten::embedding", "aten::_softmax", "aten::sum", "aten::gelu"):  # fmt: skip
        assert name in ops
    kinds = {"matmul", "conv", "attention", "elementwise", "reduction", "softmax", "norm",
             "embedding", "loss", "memory", "view"}  # fmt: skip
    assert set(ops.values()) == kinds


def test_rows_taken_chunk_by_chunk() -> None:
    """``take_rows`` (what the normaliser reads the args of chosen rows with, where a take on
    the chunked column would first join all of its text) gives exactly those rows, in order,
    across chunks, an empty chunk and nulls."""
    from xpuprof.costmodel.derive import take_rows

    chunks = [["a", None, "c"], [], ["d", "e"], ["f", None, "h", "i"]]
    col = pa.chunked_array([pa.array(c, pa.string()) for c in chunks], pa.string())
    flat = [v for c in chunks for v in c]
    for rows in ([0, 2, 3, 5, 8], [1, 6], [4], [], list(range(len(flat)))):
        got = take_rows(col, np.array(rows, np.int64))
        assert got.to_pylist() == [flat[i] for i in rows]


def test_collective_bytes_from_args_in_many_chunks() -> None:
    """Collectives' bytes (elements x dtype size) read from args spread over chunks equal
    those of the same args in one chunk, and the hand-computed values."""
    from xpuprof.trace.normalize.columns import LEVEL_CODE
    from xpuprof.trace.normalize.events import _work

    def nccl(n_in: int, n_out: int, dtype: str) -> str:
        return json.dumps({"In msg nelems": n_in, "Out msg nelems": n_out, "dtype": dtype})

    args = [nccl(10, 20, "Float"), None, "{}", nccl(1024, 1024, "Half"), None,
            nccl(7, 3, "Long")]  # fmt: skip
    level = np.array([LEVEL_CODE[x] for x in ("collective", "kernel", "kernel",
                                              "collective", "kernel", "collective")])  # fmt: skip
    want = [20 * 4, None, None, 1024 * 2, None, 7 * 8]
    for cuts in ([6], [1, 2, 3], [3, 0, 3], [2, 2, 2]):
        chunks, at = [], 0
        for k in cuts:
            chunks.append(pa.array(args[at : at + k], pa.string()))
            at += k
        ev = pa.table({"args": pa.chunked_array(chunks, pa.string()), "name": ["x"] * 6,
                       "bytes_arg": pa.array([None] * 6, pa.float64())})  # fmt: skip
        _, nbytes = _work(ev, level)
        assert [None if np.isnan(b) else b for b in nbytes] == want, cuts

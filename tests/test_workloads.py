"""The sweep's built-in models (``xpuprof.workloads.models``): each trains, on the data it says,
at the batch and dtype asked for, and bad requests fail with one clear line.

Numbers are computed here from the model itself (its parameters, hooks on its modules, its
outputs), or by hand (the MLP's and the recommender's parameter counts), never read back from
the Workload alone.
"""

from __future__ import annotations

import importlib
import math
import sys
import types

import pytest

torch = pytest.importorskip("torch", reason="the built-in models need torch")

from xpuprof.core.errors import XpuprofError  # noqa: E402
from xpuprof.workloads import models  # noqa: E402

SIX = ["mlp", "resnet", "encoder", "gpt", "lstm", "recommender"]


@pytest.fixture(autouse=True)
def _two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _record_inputs(model):
    """A forward pre-hook on the root module; returns the list of each call's tensor inputs."""
    calls: list[list] = []

    def hook(_mod, args, kwargs):
        given = [*args, *kwargs.values()]
        calls.append([a.detach().clone() for a in given if isinstance(a, torch.Tensor)])

    return calls, model.register_forward_pre_hook(hook, with_kwargs=True)


def test_the_builtins_are_the_six_named():
    assert list(models.BUILTIN) == SIX
    assert models.names()[:6] == SIX
    assert all(isinstance(d, str) and d for d in models.BUILTIN.values())


@pytest.mark.parametrize("name", SIX)
def test_builtin_trains_on_fixed_data_at_the_batch_asked(name):
    w = models.build(name, batch=2)
    assert (w.name, w.batch, w.samples, w.dtype, w.device) == (name, 2, 2, "fp32", "cpu")
    assert w.params == sum(p.numel() for p in w.model.parameters())
    before = {n: p.detach().clone() for n, p in w.model.named_parameters()}
    calls, handle = _record_inputs(w.model)
    try:
        losses = [w.step() for _ in range(5)]
    finally:
        handle.remove()
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0], losses
    # Every parameter tensor the loss reaches moved (all of them, in these models).
    unchanged = [n for n, p in w.model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []
    # One forward per step, every input batch-first, and the same data every step.
    assert len(calls) == 5
    assert calls[0] and all(t.shape[0] == 2 for t in calls[0])
    for later in calls[1:]:
        assert all(torch.equal(a, b) for a, b in zip(calls[0], later, strict=True))


def test_batch_sets_the_first_dimension_of_every_input():
    for name in ("resnet", "recommender"):
        w = models.build(name, batch=3)
        calls, handle = _record_inputs(w.model)
        try:
            w.step()
        finally:
            handle.remove()
        assert [t.shape[0] for t in calls[0]] == [3] * len(calls[0])


def test_parameter_counts_by_hand():
    mlp = models.build("mlp", 1)
    sizes = [(784, 1024), (1024, 1024), (1024, 512), (512, 10)]
    assert mlp.params == sum(i * o + o for i, o in sizes) == 2_383_370
    rec = models.build("recommender", 1)
    tables = sum(
        t.weight.numel() for t in rec.model.modules() if isinstance(t, torch.nn.EmbeddingBag)
    )
    assert tables == sum(models.TABLE_ROWS) * 64
    assert tables > 0.9 * rec.params  # embedding-heavy: the tables are nearly all of it


@pytest.mark.parametrize("name", SIX)
def test_bf16_runs_linear_and_conv_layers_in_bfloat16(name):
    dtypes: set = set()
    kinds = (torch.nn.Linear, torch.nn.Conv2d)

    def build_and_step(dtype):
        dtypes.clear()
        w = models.build(name, batch=2, dtype=dtype)
        hooks = [
            m.register_forward_hook(lambda _m, _a, out: dtypes.add(out.dtype))
            for m in w.model.modules()
            if isinstance(m, kinds)
        ]
        loss = w.step()
        for h in hooks:
            h.remove()
        return w, loss

    w, loss = build_and_step("bf16")
    assert w.dtype == "bf16" and math.isfinite(loss)
    assert torch.bfloat16 in dtypes
    # Autocast is mixed precision: the weights the optimizer updates stay fp32.
    assert {p.dtype for p in w.model.parameters()} == {torch.float32}
    build_and_step("fp32")
    assert dtypes == {torch.float32}


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_fp16_steps_with_a_grad_scaler(name):
    seen: set = set()
    w = models.build(name, batch=2, dtype="fp16")
    lin = [m for m in w.model.modules() if isinstance(m, torch.nn.Linear)][-1]
    lin.register_forward_hook(lambda _m, _a, out: seen.add(out.dtype))
    before = lin.weight.detach().clone()
    losses = [w.step() for _ in range(3)]
    assert all(math.isfinite(v) for v in losses)
    assert seen == {torch.float16}
    # The scaler skips steps whose gradients overflow at its first, huge scale; within a few
    # steps it has found one that fits and the weights move.
    assert not torch.equal(lin.weight, before)


def test_seed_fixes_weights_and_data():
    first = [models.build("gpt", 2, seed=s).step() for s in (0, 0, 1)]
    assert first[0] == first[1]
    assert first[2] != first[0]


def test_module_paths_name_the_layers():
    gpt = dict(models.build("gpt", 1).model.named_modules())
    for path in ("blocks.0.attn.q", "blocks.0.attn.k", "blocks.0.attn.v", "blocks.1.mlp.fc"):
        assert isinstance(gpt[path], torch.nn.Linear), path
    assert isinstance(gpt["blocks.1.ln2"], torch.nn.LayerNorm)
    assert gpt["head"].weight is gpt["tok_emb"].weight  # tied
    res = dict(models.build("resnet", 1).model.named_modules())
    assert isinstance(res["layer2.0.shortcut.0"], torch.nn.Conv2d)  # a projected residual
    assert isinstance(res["layer3.1.bn2"], torch.nn.BatchNorm2d)
    enc = dict(models.build("encoder", 1).model.named_modules())
    assert isinstance(enc["encoder.layers.1"], torch.nn.TransformerEncoderLayer)
    rec = dict(models.build("recommender", 1).model.named_modules())
    assert rec["tables.0"].sparse and isinstance(rec["tables.0"], torch.nn.EmbeddingBag)
    assert isinstance(dict(models.build("lstm", 1).model.named_modules())["lstm"], torch.nn.LSTM)


def test_gpt_attention_is_causal():
    model = models.build("gpt", 1).model
    tokens = torch.randint(0, 512, (1, 64), generator=torch.Generator().manual_seed(5))
    changed = tokens.clone()
    changed[0, 40] = (tokens[0, 40] + 1) % 512
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert torch.equal(a[0, :40], b[0, :40])  # earlier positions cannot see token 40
    assert not torch.allclose(a[0, 40:], b[0, 40:])


def test_bad_requests_fail_with_one_line_naming_what_exists():
    with pytest.raises(XpuprofError) as err:
        models.build("vgg", 2)
    msg = str(err.value)
    assert "\n" not in msg and "'vgg'" in msg
    for form in [*SIX, "torchvision:NAME", "timm:NAME", "hf:NAME"]:
        assert form in msg
    for bad in ("torchvision:", "nope:mlp", "mlp:x"):
        with pytest.raises(XpuprofError, match="unknown model"):
            models.build(bad, 2)
    with pytest.raises(XpuprofError, match="fp32, bf16, fp16"):
        models.build("mlp", 2, dtype="fp8")
    for batch in (0, -1, 2.0):
        with pytest.raises(XpuprofError, match="batch"):
            models.build("mlp", batch)
    with pytest.raises(XpuprofError, match="unknown device 'gpu'"):
        models.build("mlp", 2, device="gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_cuda_device_fails_clearly():
    with pytest.raises(XpuprofError, match="sees no CUDA device"):
        models.build("gpt", 2, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", SIX)
def test_builtin_trains_on_cuda_in_fp16(name):
    w = models.build(name, batch=4, dtype="fp16", device="cuda")
    assert {p.device.type for p in w.model.parameters()} == {"cuda"}
    calls, handle = _record_inputs(w.model)
    losses = [w.step() for _ in range(5)]
    handle.remove()
    assert all(math.isfinite(v) for v in losses)
    assert all(t.is_cuda and t.shape[0] == 4 for t in calls[0])


@pytest.mark.parametrize(
    ("form", "package"),
    [
        ("torchvision:resnet18", "torchvision"),
        ("timm:resnet18", "timm"),
        ("hf:bert", "transformers"),
    ],
)
def test_by_name_without_its_package_says_what_to_install(monkeypatch, form, package):
    monkeypatch.setitem(sys.modules, package, None)  # makes `import package` fail
    with pytest.raises(XpuprofError, match=f"pip install {package}$"):
        models.build(form, 2)
    prefix = form.split(":")[0]
    assert f"{prefix}:NAME" not in models.names()
    with pytest.raises(XpuprofError, match=f"{prefix}:NAME \\(pip install {package}\\)"):
        models.build("nothing", 2)


def test_by_name_with_a_broken_package_says_so(monkeypatch):
    def broken(name, *a, **k):
        raise RuntimeError("operator torchvision::nms does not exist")

    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(XpuprofError, match="installed but does not import.*nms"):
        models.build("torchvision:resnet18", 2)


class _TinyVision(torch.nn.Module):
    """Stands in for a torchvision/timm classifier: 1000 classes, and optionally the tuple
    (Inception in training) or dict (segmentation, per-pixel scores) those models return."""

    def __init__(self, shape: str = "plain") -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 1000, 8, stride=8)
        self.shape = shape

    def forward(self, x):
        maps = self.conv(x)
        if self.shape == "dict":
            return {"out": maps, "aux": maps}
        logits = maps.mean((2, 3))
        return (logits, logits) if self.shape == "tuple" else logits


def _stand_in(monkeypatch, name, **attrs):
    fake = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(fake, key, value)
    monkeypatch.setitem(sys.modules, name, fake)


def test_torchvision_form_on_a_stand_in_package(monkeypatch):
    asked = []

    def get_model(name, weights="default"):
        asked.append((name, weights))
        if name == "nope":
            raise ValueError("Unknown model nope")
        return _TinyVision({"inception_v3": "tuple", "fcn": "dict"}.get(name, "plain"))

    models_ns = types.SimpleNamespace(get_model=get_model, list_models=lambda module: ["a"])
    _stand_in(monkeypatch, "torchvision", models=models_ns)
    for name, side in (("resnet18", 224), ("inception_v3", 299), ("fcn", 224)):
        w = models.build(f"torchvision:{name}", 2)
        assert asked[-1] == (name, None)  # random weights: nothing downloaded
        calls, handle = _record_inputs(w.model)
        losses = [w.step() for _ in range(3)]
        handle.remove()
        assert calls[0][0].shape == (2, 3, side, side)
        assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    with pytest.raises(XpuprofError, match="torchvision has no model 'nope'"):
        models.build("torchvision:nope", 2)


def test_timm_form_uses_the_models_own_input_size(monkeypatch):
    def create_model(name, pretrained=True):
        assert pretrained is False
        model = _TinyVision()
        model.pretrained_cfg = {"input_size": (3, 64, 48)}
        return model

    _stand_in(monkeypatch, "timm", create_model=create_model)
    w = models.build("timm:tiny", 3)
    calls, handle = _record_inputs(w.model)
    assert math.isfinite(w.step())
    handle.remove()
    assert calls[0][0].shape == (3, 3, 64, 48)


def test_torchvision_by_name():
    tv = pytest.importorskip("torchvision", reason="torchvision is not installed")
    w = models.build("torchvision:resnet18", 2)
    ref = tv.models.resnet18(weights=None)
    assert w.params == sum(p.numel() for p in ref.parameters())
    calls, handle = _record_inputs(w.model)
    assert math.isfinite(w.step())
    handle.remove()
    assert tuple(calls[0][0].shape) == (2, 3, 224, 224)
    with pytest.raises(XpuprofError, match="no model 'nope'"):
        models.build("torchvision:nope", 2)


def test_timm_by_name():
    timm = pytest.importorskip("timm", reason="timm is not installed")
    w = models.build("timm:resnet18", 2)
    assert w.params == sum(p.numel() for p in timm.create_model("resnet18").parameters())
    assert math.isfinite(w.step())


@pytest.mark.parametrize(("kind", "head"), [("gpt2", "LMHeadModel"), ("bert", "Classification")])
def test_transformers_by_model_type(kind, head):
    pytest.importorskip("transformers", reason="transformers is not installed")
    w = models.build(f"hf:{kind}", 1)
    assert type(w.model).__name__.endswith(head)
    assert w.model.config.num_hidden_layers == 2  # shrunk from the default 12
    assert w.params == sum(p.numel() for p in w.model.parameters())
    calls, handle = _record_inputs(w.model)
    losses = [w.step(), w.step()]
    handle.remove()
    assert all(math.isfinite(v) for v in losses)
    assert calls[0][0].shape == (1, 128)  # input_ids, batch-first; then the labels
    assert [t.shape[0] for t in calls[0]] == [1, 1]
    with pytest.raises(XpuprofError, match="no model type 'nope'"):
        models.build("hf:nope", 1)

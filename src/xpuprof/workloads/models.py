"""The model sweep's workloads: six built-in models and any torchvision, timm or transformers
model by name, each wrapped as one whole training step on fixed random data.

Why these six: together they cover the layer kinds whose profiles differ most (dense GEMMs,
convolutions with BatchNorm, fused and hand-written attention, a recurrent cell, and sparse
embedding lookups whose parameters dwarf their compute), so a sweep over them exercises every
analysis on realistic shapes. They are small enough that 6 models × 3 batch sizes × ~40 steps
× 3 capture levels finish in minutes on a laptop CPU, and real enough to train: the loss falls.

Every workload's data (inputs and targets) is made once in :func:`build`, seeded, on the
target device, so every step does equal work and two builds with one seed are identical. A
step is forward (under ``torch.autocast`` for bf16/fp16; fp16 also uses a GradScaler, as fp16
training does), loss, ``zero_grad``, backward and optimizer step; it returns ``loss.item()``
(which also synchronises the device, so a step's wall time is its whole work).

Built-ins (module paths, which layer-level profiles name their spans by, in brackets). Step
time: one whole step at batch 8, fp32, ``torch.set_num_threads(2)`` on a 2-core CPU shared with
other work (2026-12-02): median (and fastest tenth) of 40 steps after 5 warm-up ones.

===========  ==========  ============================================================  =========
name         parameters  what                                                          step ms
===========  ==========  ============================================================  =========
mlp          2,383,370   784 → 1024 → 1024 → 512 → 10 classifier, ReLU                 15 (10)
                         (``fc1``…``fc3``, ``act1``…``act3``, ``head``)
resnet       175,258     CIFAR-style ResNet-14: 3×3 stem, 3 stages of 2 BasicBlocks     19 (17)
                         (16/32/64 channels, BatchNorm, 1×1 projected shortcut where
                         the shape changes), 3×32×32 images, 10 classes
                         (``layer2.0.conv1``, ``layer2.0.shortcut.0``, ``fc``)
encoder      534,282     BERT-like classifier: token + position embeddings, 2 pre-norm  19 (17)
                         ``nn.TransformerEncoderLayer`` (d 128, 4 heads, GELU FFN 512),
                         mean pool, 10 classes, 64 tokens
                         (``encoder.layers.0.self_attn``, ``head``)
gpt          470,528     GPT-2-style LM: 2 pre-LayerNorm blocks of causal attention     18 (16)
                         written out (``q``/``k``/``v``/``proj`` Linears, SDPA
                         ``is_causal=True``) and a GELU MLP, head tied to the token
                         embedding, vocab 512, 64 tokens (``blocks.0.attn.q``,
                         ``blocks.1.mlp.fc``, ``ln_f``)
lstm         1,306,600   LSTM LM: embedding 128, 2-layer LSTM 256, vocab 1000, 32       23 (21)
                         tokens (``embed``, ``lstm``, ``head``)
recommender  28,296,513  DLRM-like CTR model: 26 sparse-gradient ``EmbeddingBag``       20 (18)
                         tables (406,400 rows × 64, 8 ids a bag, SGD lr 0.1), a
                         bottom MLP 13 → 512 → 256 → 64 on dense features, pairwise
                         dots of the 27 vectors, top MLP 415 → 1024 → 1024 → 512 → 256
                         → 1 (dense parts by AdamW) (``tables.0``, ``bottom.0``,
                         ``top.8``)
===========  ==========  ============================================================  =========

Everything else trains with AdamW (lr 1e-3). fp16 on the CPU is slow (no fp16 arithmetic:
3–15× fp32 here) and runs ``lstm``'s recurrent layers in fp32, since oneDNN has no fp16 LSTM
(nor bf16 without AVX-512: bf16 does the same there); bf16 costs about what fp32 does here.

By name (random weights, nothing downloaded; the package must be installed):

- ``torchvision:NAME`` — ``torchvision.models.get_model(NAME, weights=None)``, images
  3×224×224 (299 for inception_v3), cross-entropy on random classes (the main output of the
  tuples Inception/GoogLeNet return; spatial score maps averaged).
- ``timm:NAME`` — ``timm.create_model(NAME, pretrained=False)``, images of the model's own
  ``pretrained_cfg["input_size"]`` (3×224×224 if it has none).
- ``hf:NAME`` — transformers ``AutoConfig.for_model(NAME)``: NAME is a model type (``bert``,
  ``gpt2``, ``llama`` …), not a hub id. The default config is cut to 2 layers (its width is
  kept, so the shapes are the real ones: ``hf:gpt2`` has 54 M parameters, ``hf:llama`` 0.67 B
  and takes ~10 s a CPU step). An encoder type (one transformers gives a masked-LM head)
  trains as a 2-label sequence classifier, anything else as a causal LM on its own tokens,
  falling back to the bare model (loss: mean square of the last hidden state). 128 random
  tokens, fewer if the model has fewer positions.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from xpuprof.capture.torch import require_torch
from xpuprof.core.errors import XpuprofError

BUILTIN: dict[str, str] = {
    "mlp": "3 hidden-layer MLP classifier (784 → 1024 → 1024 → 512 → 10)",
    "resnet": "CIFAR-style ResNet: residual BasicBlocks with BatchNorm, 32×32 images",
    "encoder": "transformer encoder classifier (2 × nn.TransformerEncoderLayer, d 128)",
    "gpt": "GPT-style decoder LM: causal self-attention blocks, tied head",
    "lstm": "2-layer LSTM language model",
    "recommender": "DLRM-like recommender: 26 sparse EmbeddingBag tables, MLPs, dot interaction",
}
DTYPES = ("fp32", "bf16", "fp16")

#: The by-name forms: prefix → the package (import and pip name) that makes the model.
BY_NAME = {"torchvision": "torchvision", "timm": "timm", "hf": "transformers"}


@dataclass
class Workload:
    """One model and its training step, ready to profile: ``profile(model=w.model)``."""

    name: str
    batch: int
    dtype: str
    device: str
    model: Any
    step: Callable[[], float]
    samples: int
    params: int
    layer_type: Callable[[str], str] | None = None


@dataclass
class _Spec:
    """What a model maker returns: CPU tensors (build moves them), the loss of one forward,
    and optimizer makers (none: AdamW over all parameters)."""

    model: Any
    inputs: tuple
    targets: tuple
    loss: Callable[[Any, tuple, tuple], Any]  # (model, inputs, targets) -> scalar loss
    opts: tuple = ()


def installed() -> dict[str, bool]:
    """Which by-name packages can be imported here (found on the path, not imported: cheap)."""
    return {prefix: importlib.util.find_spec(pkg) is not None for prefix, pkg in BY_NAME.items()}


def names() -> list[str]:
    """The built-in names, then ``PREFIX:NAME`` for each by-name package that is installed."""
    return list(BUILTIN) + [f"{p}:NAME" for p, ok in installed().items() if ok]


def _known() -> str:
    have = installed()
    forms = ", ".join(
        f"{p}:NAME ({'installed' if have[p] else 'pip install ' + pkg})"
        for p, pkg in BY_NAME.items()
    )
    return f"built-ins: {', '.join(BUILTIN)}; by name: {forms}"


def build(
    name: str, batch: int, dtype: str = "fp32", device: str = "cpu", seed: int = 0
) -> Workload:
    """The workload ``name`` at ``batch`` samples a step, ready to run ``step()``.

    Raises XpuprofError (one line naming what exists) for an unknown name, a dtype not in
    DTYPES, a batch below 1, or a by-name package that is not installed.
    """
    if dtype not in DTYPES:
        raise XpuprofError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise XpuprofError(f"batch must be a positive integer, got {batch!r}")
    prefix, sep, rest = name.partition(":")
    if sep and prefix in BY_NAME and rest:
        maker, arg = _BY_NAME_MAKERS[prefix], rest
    elif not sep and name in BUILTIN:
        maker, arg = _BUILTIN_MAKERS[name], None
    else:
        raise XpuprofError(f"unknown model {name!r}; {_known()}")
    torch = require_torch()
    kind = _device_kind(torch, device)
    torch.manual_seed(seed)
    spec = maker(torch, batch, torch.Generator().manual_seed(seed + 1), arg)
    model = spec.model.to(device).train()
    inputs = tuple(x.to(device) for x in spec.inputs)
    targets = tuple(y.to(device) for y in spec.targets)
    opts = [make(model) for make in spec.opts] or [torch.optim.AdamW(model.parameters(), lr=1e-3)]
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype)
    scaler = torch.amp.GradScaler(kind) if dtype == "fp16" else None

    def step() -> float:
        with torch.autocast(kind, dtype=low) if low else contextlib.nullcontext():
            loss = spec.loss(model, inputs, targets)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            for opt in opts:
                opt.step()
        else:
            scaler.scale(loss).backward()
            for opt in opts:
                scaler.step(opt)
            scaler.update()
        return loss.item()

    params = sum(p.numel() for p in model.parameters())
    return Workload(name, batch, dtype, device, model, step, batch, params)


def _device_kind(torch: Any, device: str) -> str:
    """``cpu``/``cuda``/… of ``device``, or an XpuprofError before anything is built."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as e:
        raise XpuprofError(
            f"unknown device {device!r} ({type(e).__name__}); use cpu or cuda"
        ) from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise XpuprofError(
            f"device {device!r}: this torch ({torch.__version__}) sees no CUDA device; use cpu"
        )
    return kind


# ---------------------------------------------------------------------------------------------
# Built-ins: each maker takes (torch, batch, generator, _) and returns a _Spec.


def _classify(model: Any, inputs: tuple, targets: tuple) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(model(*inputs), targets[0])


def _next_token(model: Any, inputs: tuple, targets: tuple) -> Any:
    import torch.nn.functional as F

    logits = model(*inputs)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[0].reshape(-1))


def _mlp(torch: Any, batch: int, gen: Any, _: Any) -> _Spec:
    nn = torch.nn

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(784, 1024)
            self.fc2 = nn.Linear(1024, 1024)
            self.fc3 = nn.Linear(1024, 512)
            self.head = nn.Linear(512, 10)
            self.act1, self.act2, self.act3 = nn.ReLU(), nn.ReLU(), nn.ReLU()

        def forward(self, x: Any) -> Any:
            x = self.act1(self.fc1(x))
            x = self.act2(self.fc2(x))
            return self.head(self.act3(self.fc3(x)))

    x = torch.randn(batch, 784, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return _Spec(MLP(), (x,), (y,), _classify)


def _resnet(torch: Any, batch: int, gen: Any, _: Any) -> _Spec:
    nn = torch.nn

    class BasicBlock(nn.Module):
        """Two 3×3 conv + BatchNorm, plus the input (projected when the shape changes)."""

        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.shortcut = nn.Sequential()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x: Any) -> Any:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + self.shortcut(x))

    def stage(cin: int, cout: int, stride: int, blocks: int = 2) -> Any:
        return nn.Sequential(
            BasicBlock(cin, cout, stride), *[BasicBlock(cout, cout, 1) for _ in range(blocks - 1)]
        )

    class ResNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
            )
            self.layer1 = stage(16, 16, 1)
            self.layer2 = stage(16, 32, 2)
            self.layer3 = stage(32, 64, 2)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(64, 10)

        def forward(self, x: Any) -> Any:
            x = self.layer3(self.layer2(self.layer1(self.stem(x))))
            return self.fc(self.pool(x).flatten(1))

    x = torch.randn(batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return _Spec(ResNet(), (x,), (y,), _classify)


def _encoder(torch: Any, batch: int, gen: Any, _: Any) -> _Spec:
    nn = torch.nn
    vocab, seq, d = 1000, 64, 128

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(seq, d)
            layer = nn.TransformerEncoderLayer(
                d, 4, 4 * d, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            # No nested tensors: a batch of equal lengths gains nothing, and norm_first warns.
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, 10)

        def forward(self, tokens: Any) -> Any:
            pos = torch.arange(tokens.shape[1], device=tokens.device)
            h = self.encoder(self.embed(tokens) + self.pos(pos))
            return self.head(self.norm(h).mean(dim=1))

    x = torch.randint(0, vocab, (batch, seq), generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    return _Spec(Encoder(), (x,), (y,), _classify)


def _gpt(torch: Any, batch: int, gen: Any, _: Any) -> _Spec:
    nn = torch.nn
    vocab, seq, d, heads, layers = 512, 64, 128, 4, 2

    class CausalSelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
            self.proj = nn.Linear(d, d)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape

            def split(h: Any) -> Any:  # (b, t, d) -> (b, heads, t, d / heads)
                return h.view(b, t, heads, d // heads).transpose(1, 2)

            y = torch.nn.functional.scaled_dot_product_attention(
                split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True
            )
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.act, self.proj = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

        def forward(self, x: Any) -> Any:
            return self.proj(self.act(self.fc(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(d), CausalSelfAttention()
            self.ln2, self.mlp = nn.LayerNorm(d), MLP()

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok_emb, self.pos_emb = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok_emb.weight  # tied, as in GPT-2
            for m in self.modules():  # GPT-2's init: with N(0, 1) the tied head's logits explode
                if isinstance(m, nn.Linear | nn.Embedding):
                    nn.init.normal_(m.weight, std=0.02)

        def forward(self, tokens: Any) -> Any:
            pos = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.tok_emb(tokens) + self.pos_emb(pos)
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    data = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    return _Spec(GPT(), (data[:, :-1].contiguous(),), (data[:, 1:].contiguous(),), _next_token)


def _cpu_lstm_runs(torch: Any, dtype: Any) -> bool:
    """Whether oneDNN runs an LSTM in ``dtype`` on this CPU: never in fp16; in bf16 only where
    it has bf16 at all (AVX-512 or AMX, not AVX2 alone)."""
    bf16 = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    return dtype != torch.float16 and (dtype != torch.bfloat16 or bool(bf16()))


def _lstm(torch: Any, batch: int, gen: Any, _: Any) -> _Spec:
    nn = torch.nn
    vocab, seq = 1000, 32

    class LSTMLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, 128)
            self.lstm = nn.LSTM(128, 256, num_layers=2, batch_first=True)
            self.head = nn.Linear(256, vocab)

        def forward(self, tokens: Any) -> Any:
            x = self.embed(tokens)
            cpu_amp = x.is_cpu and torch.is_autocast_enabled("cpu")
            if cpu_amp and not _cpu_lstm_runs(torch, torch.get_autocast_dtype("cpu")):
                # oneDNN has no fp16 LSTM on the CPU, nor a bf16 one without AVX-512 ("could
                # not create a primitive descriptor"): there the recurrent layers run in fp32,
                # the head in the lower precision.
                with torch.autocast("cpu", enabled=False):
                    h = self.lstm(x.float())[0]
            else:
                h = self.lstm(x)[0]
            return self.head(h)

    data = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    return _Spec(LSTMLM(), (data[:, :-1].contiguous(),), (data[:, 1:].contiguous(),), _next_token)


#: Rows of the recommender's sparse tables: 26 sparse features as in Criteo's click logs (the
#: data DLRM is benchmarked on), a few large tables and many small ones.
TABLE_ROWS = (100_000,) * 2 + (50_000,) * 2 + (20_000,) * 2 + (10_000, 5000, 1000, 500, 100) * 4


def _recommender(torch: Any, batch: int, gen: Any, _: Any) -> _Spec:
    nn = torch.nn
    dim, dense_in, bag = 64, 13, 8
    n = len(TABLE_ROWS) + 1  # vectors that interact: the bottom MLP's and one per table

    def mlp(*widths: int, logit: bool = False) -> Any:  # Linear, ReLU, …; a logit has no ReLU
        layers: list = []
        for a, b in zip(widths, widths[1:], strict=False):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*(layers[:-1] if logit else layers))

    class DLRM(nn.Module):
        """Bottom MLP on dense features, one pooled embedding per sparse feature, the
        pairwise dot products of all of them, and a top MLP to one click logit."""

        def __init__(self) -> None:
            super().__init__()
            self.bottom = mlp(dense_in, 512, 256, dim)
            self.tables = nn.ModuleList(
                nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for rows in TABLE_ROWS
            )
            # DLRM's init, U(±1/√rows): with torch's N(0, 1), rows summed 8 to a bag make dot
            # products in the tens and the first logits saturate (loss ~0.1 before any step).
            for table in self.tables:
                bound = table.num_embeddings**-0.5
                nn.init.uniform_(table.weight, -bound, bound)
            self.register_buffer("pairs", torch.triu_indices(n, n, offset=1), persistent=False)
            self.top = mlp(dim + n * (n - 1) // 2, 1024, 1024, 512, 256, 1, logit=True)

        def forward(self, dense: Any, ids: Any) -> Any:
            x = self.bottom(dense)
            pooled = [table(ids[:, i]) for i, table in enumerate(self.tables)]
            feats = torch.stack([x, *[p.to(x.dtype) for p in pooled]], dim=1)
            dots = feats @ feats.transpose(1, 2)
            inter = dots[:, self.pairs[0], self.pairs[1]]
            return self.top(torch.cat([x, inter], dim=1)).squeeze(1)

    def loss(model: Any, inputs: tuple, targets: tuple) -> Any:
        logit = model(*inputs).float()
        return torch.nn.functional.binary_cross_entropy_with_logits(logit, targets[0])

    def dense_opt(m: Any) -> Any:
        dense = [p for name, p in m.named_parameters() if not name.startswith("tables.")]
        return torch.optim.AdamW(dense, lr=1e-3)

    def sparse_opt(m: Any) -> Any:  # SGD takes sparse gradients: only looked-up rows change
        return torch.optim.SGD(m.tables.parameters(), lr=0.1)

    dense = torch.randn(batch, dense_in, generator=gen)
    ids = torch.stack(
        [torch.randint(0, rows, (batch, bag), generator=gen) for rows in TABLE_ROWS], dim=1
    )
    clicks = torch.randint(0, 2, (batch,), generator=gen).float()
    return _Spec(DLRM(), (dense, ids), (clicks,), loss, (dense_opt, sparse_opt))


_BUILTIN_MAKERS = {
    "mlp": _mlp,
    "resnet": _resnet,
    "encoder": _encoder,
    "gpt": _gpt,
    "lstm": _lstm,
    "recommender": _recommender,
}


# ---------------------------------------------------------------------------------------------
# By name: models from other packages, random weights, random inputs of the shape they expect.


def _import(prefix: str) -> Any:
    """The package behind ``prefix``, or an XpuprofError saying how to get it."""
    pkg = BY_NAME[prefix]
    try:
        return importlib.import_module(pkg)
    except ImportError:
        raise XpuprofError(f"{prefix}:NAME models need {pkg}: pip install {pkg}") from None
    except Exception as e:  # installed but broken, e.g. built for another torch
        raise XpuprofError(
            f"{pkg} is installed but does not import ({type(e).__name__}: {e}); "
            f"install a {pkg} built for this torch"
        ) from None


def _logits(out: Any) -> Any:
    """The class scores in what an image model returns: the main output of the tuples that
    Inception/GoogLeNet return in training, ``out`` of a segmentation dict, spatial maps
    averaged to one score per class."""
    if isinstance(out, dict):
        out = out.get("out", next(iter(out.values())))
    elif isinstance(out, tuple | list):
        out = out[0]
    return out.flatten(2).mean(2) if out.dim() > 2 else out


def _image_spec(torch: Any, model: Any, batch: int, gen: Any, size: tuple) -> _Spec:
    """Random images of ``size`` (C, H, W) and random labels, cross-entropy on the logits.
    Labels are drawn below 1000 and folded into the model's class count, which is known
    only from its output (1000 for every default torchvision and timm classifier)."""
    x = torch.randn(batch, *size, generator=gen)
    y = torch.randint(0, 1000, (batch,), generator=gen)

    def loss(m: Any, inputs: tuple, targets: tuple) -> Any:
        logits = _logits(m(*inputs))
        return torch.nn.functional.cross_entropy(logits, targets[0] % logits.shape[1])

    return _Spec(model, (x,), (y,), loss)


def _torchvision(torch: Any, batch: int, gen: Any, name: str) -> _Spec:
    tv = _import("torchvision")
    try:
        model = tv.models.get_model(name, weights=None)
    except (ValueError, KeyError) as e:
        some = ", ".join(tv.models.list_models(module=tv.models)[:8])
        raise XpuprofError(f"torchvision has no model {name!r} ({e}); e.g. {some}") from None
    size = 299 if name == "inception_v3" else 224
    return _image_spec(torch, model, batch, gen, (3, size, size))


def _timm(torch: Any, batch: int, gen: Any, name: str) -> _Spec:
    timm = _import("timm")
    try:
        model = timm.create_model(name, pretrained=False)
    except RuntimeError as e:  # timm's "Unknown model"
        raise XpuprofError(f"timm: {e}; see timm.list_models()") from None
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return _image_spec(torch, model, batch, gen, tuple(cfg.get("input_size", (3, 224, 224))))


#: Config fields that count layers (transformers names them per family); each is cut to 2.
LAYER_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers")


def _hf(torch: Any, batch: int, gen: Any, name: str) -> _Spec:
    tf = _import("hf")
    try:
        config = tf.AutoConfig.for_model(name)
    except ValueError:
        raise XpuprofError(
            f"transformers has no model type {name!r}; hf:NAME takes a model type such as "
            "bert, gpt2, llama (nothing is downloaded, so hub ids do not work)"
        ) from None
    for field in LAYER_FIELDS:
        if isinstance(getattr(config, field, None), int) and getattr(config, field) > 2:
            setattr(config, field, 2)
    positions = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", 0
    )
    seq = min(128, positions) if positions else 128
    tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=gen)
    lm = (tf.AutoModelForCausalLM, (tokens,))  # labels = the tokens, shifted inside the model
    classify = (
        tf.AutoModelForSequenceClassification,
        (torch.randint(0, 2, (batch,), generator=gen),),  # num_labels defaults to 2
    )
    # An encoder (one with a masked-LM head: bert, roberta, …) trains as a classifier, though
    # transformers also maps some of them to a causal LM (BertLMHeadModel); the rest as LMs.
    masked = tf.models.auto.modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    heads = (classify, lm) if name in masked else (lm, classify)
    for auto, targets in (*heads, (tf.AutoModel, ())):
        try:
            model, labels = auto.from_config(config), targets
            break
        except ValueError:  # transformers has no such head for this model type
            continue
    else:
        raise XpuprofError(f"transformers cannot build model type {name!r} from its config")

    def loss(m: Any, inputs: tuple, targets: tuple) -> Any:
        if targets:
            return m(input_ids=inputs[0], labels=targets[0]).loss
        return m(input_ids=inputs[0]).last_hidden_state.float().pow(2).mean()

    return _Spec(model, (tokens,), labels, loss)


_BY_NAME_MAKERS = {"torchvision": _torchvision, "timm": _timm, "hf": _hf}

"""``dtype=bf16`` (also ``fp16``, ``tf32``; ``dtype:REGEX=…`` for the GEMM ops whose names
match REGEX): the GEMMs run at that precision on the GPU's tensor cores.

Priced by the roofline model calibrated on the trace (``sim/costs/roofline.py``,
``docs/costs.md``): the GEMM-like ops — roofline classes ``matmul``, ``conv``, ``attention``
(the outermost framework op with FLOPs: ``aten::linear``, ``aten::cudnn_convolution``…),
on a GPU, priced — keep their FLOPs F and their class's calibrated efficiencies η_c, η_m;
their bytes B (operands read, result written) scale by the element size ratio
r = size(target) / size(recorded precision) (bf16 and fp16: 2 bytes; tf32 is stored as
fp32: 4), and their compute roof becomes the device's tensor-core peak for the target:

    t_rec = max(F / (η_c · P_rec), B / (η_m · W))        (the model's own-device time)
    t_new = max(F / (η_c · P_target), r · B / (η_m · W))

with P_rec the peak the roofline tool measured the op against (its precision as recorded,
fp32 GEMMs that ran faster than the fp32 peak as TF32), P_target the device's entry for the
target in the hardware table (``hardware/specs.py``: ``bf16``, ``fp16``, ``tf32``; no
fallback — a V100 has no bf16 and no tf32, and an emulated precision is not a tensor-core
rate), W the memory bandwidth. Each kernel the op launched runs ``measured × t_new / t_rec``:
the op's measured deviation from the model is kept, so a compute-bound GEMM (compute-bound in
both) becomes measured × P_rec / P_target, a memory-bound one measured × r. An op already at
the target precision is unchanged.

GPU only: a trace whose GEMMs ran on the CPU (no device work), a device not in the hardware
table, or one without a tensor-core entry for the target is an error naming what it has. Not
modelled: the casts autocast inserts (elementwise copies to and from the target precision),
the halved bytes of the non-GEMM ops between GEMMs (they stay in fp32 under autocast unless
the model is cast), different kernels chosen at the new precision, and numerics. With
``device=``, the ratio is the trace's own device's (the two changes multiply).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.core.errors import XpuprofError
from xpuprof.sim.graph import DEVICE_WORK
from xpuprof.sim.whatif import Change

if TYPE_CHECKING:
    from xpuprof.hardware.specs import DeviceSpec
    from xpuprof.sim.transforms import Context

PRICED = True

#: Target precisions, their spellings, and their element sizes (bytes).
TARGETS = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "half": "fp16",
           "float16": "fp16", "tf32": "tf32"}  # fmt: skip
SIZES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
#: The roofline classes that run on tensor cores.
GEMM_CLASSES = ("matmul", "conv", "attention")


def parse(text: str, verb: str, arg: str, value: str) -> Change:
    """``dtype[:REGEX]=bf16|fp16|tf32``."""
    target = TARGETS.get(value.strip().lower())
    if target is None:
        raise XpuprofError(f"change {text!r}: {value.strip() or 'no precision'!r} is not a "
                           "target precision; say dtype=bf16, dtype=fp16 or dtype=tf32 "
                           "(dtype:REGEX=… for some GEMM ops)")  # fmt: skip
    if arg:
        try:
            re.compile(arg)
        except re.error as e:
            raise XpuprofError(f"change {text!r}: bad pattern {arg!r}: {e}") from None
    return Change(text, verb, ("op",), arg or None, options=(("dtype", target),))


def apply(c: Change, ctx: Context) -> str:
    """Reprice the kernels of the selected GEMM ops at the target precision (module
    docstring), in place on ``ctx.delay``."""
    from xpuprof.sim.costs.roofline import RooflineCosts

    target = c.option("dtype")
    rc = RooflineCosts(ctx.trace)
    o = rc.ops
    gemm = o[o["class"].isin(GEMM_CLASSES)]
    if c.pattern:
        rx = re.compile(c.pattern)
        hit = gemm["name"].astype(str).map(lambda s: rx.search(s) is not None)
        if not hit.any():
            have = ", ".join(gemm["name"].astype(str).value_counts().index[:6]) or "none"
            raise XpuprofError(f"change {c.text!r}: {c.pattern!r} matches no GEMM op; GEMM "
                               f"ops there: {have}")  # fmt: skip
        gemm = gemm[hit.to_numpy(bool)]
    on_gpu = gemm[~gemm["on_host"]]
    if on_gpu.empty:
        if len(gemm):
            raise XpuprofError(
                f"change {c.text!r}: this trace's GEMMs ran on the CPU ({len(gemm):,} host "
                "ops, no device work): dtype= prices GEMMs on a GPU's tensor cores")  # fmt: skip
        raise XpuprofError(f"change {c.text!r}: the trace has no GEMM-like op with FLOPs "
                           "(matmul, conv, attention; shapes come with "
                           "record_shapes=True)")  # fmt: skip
    specs = _specs(rc.tables, on_gpu["id"].to_numpy(np.int64))
    bad = sorted({s.name for s in specs.values() if s is not None and s.kind != "gpu"})
    if bad:
        raise XpuprofError(f"change {c.text!r}: dtype= is for GPUs; the GEMMs ran on "
                           f"{', '.join(bad)}")  # fmt: skip
    lacking = sorted({s.name for s in specs.values() if s is not None and target not in s.flops})
    if lacking:
        have = "; ".join(f"{s.name}: {', '.join(k for k in s.flops if k in SIZES)}"
                         for s in {s.key: s for s in specs.values() if s}.values())  # fmt: skip
        raise XpuprofError(f"change {c.text!r}: no {target} tensor-core peak for "
                           f"{', '.join(lacking)} in the hardware table ({have})")  # fmt: skip
    priced = on_gpu[on_gpu["priced"].to_numpy(bool)]
    if priced.empty:
        why = "; ".join(str(x) for x in on_gpu["reason"].dropna().unique()[:3])
        raise XpuprofError(f"change {c.text!r}: none of the {len(on_gpu):,} GEMM ops on the "
                           f"GPU can be priced: {why}")  # fmt: skip
    ratio = _ratios(priced, rc.efficiencies.set_index("class"), specs, target)
    # each kernel the op launched: measured (delays so far) × t_new / t_rec
    e = ctx.graph.edges
    dev = np.flatnonzero((e.kind == DEVICE_WORK) & (e.event >= 0))
    r = ratio.reindex(_launching_op(ctx, e.event[dev], ratio.index.to_numpy())).to_numpy(float)
    edges, r = dev[~np.isnan(r)], r[~np.isnan(r)]
    before = int(ctx.delay[edges].sum())
    ctx.delay[edges] = np.rint(ctx.delay[edges] * r).astype(np.int64)
    after = int(ctx.delay[edges].sum())
    changed = int((ratio != 1).sum())
    kept = len(on_gpu) - len(priced)
    return (f"{c.text}: {changed:,} GEMM ops repriced at {target} ({len(edges):,} kernels: "
            f"{before / 1e6:.3f} → {after / 1e6:.3f} ms by the roofline calibrated on the "
            "trace)" + (f"; {kept:,} GEMM ops kept measured (unpriced: see RooflineCosts."
                        "unpriced)" if kept else "")
            + (f"; {int((ratio == 1).sum()):,} already at {target}" if (ratio == 1).any()
               else ""))  # fmt: skip


def _ratios(ops: pd.DataFrame, eff: pd.DataFrame, specs: dict[int, DeviceSpec | None],
            target: str) -> pd.Series:  # fmt: skip
    """t_new / t_rec per op id (module docstring); 1 for an op already at the target."""
    ec = ops["class"].map(eff["eta_compute"]).to_numpy(float)
    em = ops["class"].map(eff["eta_memory"]).to_numpy(float)
    f = ops["flops"].to_numpy(float)
    b = ops["bytes"].to_numpy(float)
    w = ops["peak_bandwidth"].to_numpy(float)
    p_rec = ops["peak_flops"].to_numpy(float)
    ids = ops["id"].to_numpy(np.int64)
    p_new = np.array([specs[int(i)].flops[target] for i in ids], float)  # type: ignore[union-attr]
    size = np.array([SIZES.get(str(d), 4) for d in ops["dtype"]], float)
    r = SIZES[target] / size
    with np.errstate(divide="ignore", invalid="ignore"):
        comp = lambda p: np.where(f > 0, f / (ec * p), 0.0)  # noqa: E731
        mem = np.where(b > 0, b / (em * w), 0.0)
        t_rec = np.fmax(comp(p_rec), mem)
        t_new = np.fmax(comp(p_new), mem * r)
        out = np.where(t_rec > 0, t_new / t_rec, 1.0)
    out[(ops["dtype"] == target).to_numpy(bool)] = 1.0
    return pd.Series(out, index=ids)


def _specs(tables: dict[str, pd.DataFrame], ids: np.ndarray) -> dict[int, DeviceSpec | None]:
    """The hardware-table spec of the device each op ran on (the roofline tool's match:
    ``deviceProperties``, XPlane planes; its ``tables``), None when it has none."""
    from xpuprof.hardware import specs as hw

    ops = tables["ops"].drop_duplicates("id").set_index("id")
    key_of = dict(zip(tables["devices"]["name"], tables["devices"]["key"], strict=True))
    names = [None if pd.isna(n) else n for n in ops["device"].reindex(ids).tolist()]
    spec_of = {n: (hw.SPECS.get(str(key_of[n])) if key_of.get(n) is not None else None)
               for n in set(names)}  # fmt: skip
    out: dict[int, DeviceSpec | None] = dict(zip(ids.tolist(), (spec_of[n] for n in names),
                                                 strict=True))  # fmt: skip
    missing = [i for i, s in out.items() if s is None]
    if missing:
        raise XpuprofError(f"change dtype: the device of {len(missing):,} GEMM ops is not in "
                           "the hardware table (xpuprof hardware lists it)")  # fmt: skip
    return out


def _launching_op(ctx: Context, kernels: np.ndarray, ops: np.ndarray) -> np.ndarray:
    """Per device event of ``kernels``, the id of the op of ``ops`` that launched it (-1:
    none): the roofline model's rule — the runtime call by correlation id, then the nearest
    of ``ops`` above the call."""
    from xpuprof.sim.costs.roofline import launching_ops

    t, _, call = launching_ops(ctx.trace, kernels)
    mask = np.zeros(t.n, bool)
    rows = t.rows_of(np.asarray(ops, np.int64))
    mask[rows[rows >= 0]] = True
    owner = t.nearest(mask, call, strict=True)
    return np.where(owner >= 0, t.ids[np.maximum(owner, 0)], -1)

"""The roofline cost model: time from FLOPs and bytes over a device's peaks, with the
efficiency of each class of work measured on the trace itself.

Inputs are the roofline tool's (``analysis/roofline.py``, ``docs/roofline.md``), not re-derived:
its ``ops`` table gives each priced op — the outermost framework op with FLOPs (``aten::linear``,
not its ``aten::addmm``) — its *class* (the op kind of ``costmodel.ops``: ``matmul``, ``conv``,
``attention``, ``elementwise``, ``reduction``, ``softmax``, ``norm``, ``embedding``, ``loss``,
``memory``; ``other`` for an op without one), its precision (with fp32 GEMMs found running on
TF32), FLOPs F, bytes B, measured time T (the device time of the kernels, copies and sets it
launched; a CPU op's own duration) and the peaks of its device: P (matrix rate of its
precision for matmul/conv/attention, vector rate otherwise: ``DeviceSpec.peak``) and W
(memory bandwidth). The device is the trace's own (``deviceProperties``, the XPlane plane), or
``own_device=`` when the trace does not say (a CPU trace: a spec of the CPU it ran on). XLA ops
with XLA's cost analysis (the tool's ``kernels`` table) are units of their own, of class
``xla:<HLO category>``; an async start (``copy-start``) is not priced (its time is its
``-done``'s).

**Calibration**, per class c over its priced ops (ops on a known device, with a measured time):
an op is compute-bound when F/P ≥ B/W (the roofline's ``bound``), memory-bound otherwise.

- η_c⁰ = Σ_compute-bound (F/P) / Σ_compute-bound T — achieved over peak, time-weighted;
- η_m⁰ = Σ_memory-bound (B/W) / Σ_memory-bound T;
  a class with only one kind of op uses that one's value for both;
- s = Σ max(F/(η_c⁰·P), B/(η_m⁰·W)) / Σ T, and η_c = s·η_c⁰, η_m = s·η_m⁰,

so that the model's times of a class sum to its measured total on the trace's own device
(the identity the tests check): t = max(F/(η_c·P), B/(η_m·W)) for each op (only the compute
term without bytes, only the memory term without FLOPs). ``efficiencies`` replaces the
calibrated values of the classes it names.

**Another device** (``device=``: a table key such as ``"h100-sxm"``, a name, a
:class:`~xpuprof.hardware.DeviceSpec`): the same formula with its peaks P′(precision) and W′,
and the same η — the trace's measured inefficiency is kept.

**Pricing a graph** (:meth:`RooflineCosts.delays`): each ``device_work`` edge of a kernel, copy
or set that a priced op launched gets its share of the op's modelled time, in proportion to its
measured duration (dur/T · t); each ``host_work`` edge inside a priced CPU op (the op's own
time and its children's) is scaled by t/T. The launch overhead is not in t: it stays in the
graph's launch edges, measured. Everything else keeps the base model's delay; ``unpriced``
says which device work was not priced and why: no launching op with FLOPs (the trace has no
shapes: ``record_shapes``; or no cost rule for the op), a device not in the hardware table, a
copy between host and device (bound by the host link, which the device table does not give:
the op that issued it is left whole at its measured time), collectives (their own models).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.core.errors import XpuprofError
from xpuprof.sim.graph import DEVICE_WORK, HOST_WORK

if TYPE_CHECKING:
    from xpuprof.hardware.specs import DeviceSpec
    from xpuprof.sim.costs import CostModel
    from xpuprof.sim.graph import ReplayGraph
    from xpuprof.trace.trace import Trace
    from xpuprof.trace.tree import EventTree

#: Class of work whose op has no kind in the cost model table.
OTHER = "other"

EFFICIENCY_COLUMNS = ["class", "ops", "compute_bound", "memory_bound", "measured_ns",
                      "eta_compute", "eta_memory", "source"]  # fmt: skip
OP_COLUMNS = ["id", "part", "name", "class", "dtype", "matrix", "flops", "bytes", "measured_ns",
              "peak_flops", "peak_bandwidth", "bound", "target_peak_flops",
              "target_bandwidth", "own_ns", "predicted_ns", "on_host", "priced",
              "reason"]  # fmt: skip
UNPRICED_COLUMNS = ["event", "name", "level", "reason"]

NO_OP = ("no launching framework op with FLOPs or bytes (the trace records no input shapes: "
         "torch.profiler record_shapes=True; or the op has no cost rule: "
         "xpuprof.costmodel.ops.supported_ops())")  # fmt: skip
HOST_COPY = ("a copy between host and device: bound by the host link, which the device table "
             "does not give (its op is left at its measured time)")  # fmt: skip
NO_COST = ("no FLOPs or bytes for it: no launch from a framework op in the trace, and no XLA "
           "cost analysis of its own")  # fmt: skip
ASYNC_START = ("an asynchronous start (XLA's copy-start and the like): it issues the work, "
               "whose time is its -done's")  # fmt: skip
NO_ROOF = ("no roof for its device (not in the hardware table; pass device=, or calibrate=True "
           "for CPU ops)")  # fmt: skip


class CostModelError(XpuprofError):
    """A cost model was given settings or input it cannot use."""


def resolve_device(device: Any) -> DeviceSpec | None:
    """A device spec from a :class:`DeviceSpec`, a table key, a device name or
    ``"local-cpu"``; None for None (the trace's own devices)."""
    from xpuprof.analysis.roofline import LOCAL_CPU_NAMES
    from xpuprof.hardware import specs as hw

    if device is None or isinstance(device, hw.DeviceSpec):
        return device
    text = str(device).strip()
    if text.lower() in LOCAL_CPU_NAMES:
        from xpuprof.hardware import local_cpu

        return local_cpu()
    spec = hw.SPECS.get(text.lower()) or hw.match(text)
    if spec is None:
        raise CostModelError(f"unknown device {device!r}; known: {', '.join(hw.SPECS)} (or a "
                             "name such as 'NVIDIA H100 80GB HBM3')")  # fmt: skip
    return spec


def launching_ops(trace: Trace, ids: np.ndarray) -> tuple[EventTree, dict[str, np.ndarray],
                                                           np.ndarray]:  # fmt: skip
    """For device events ``ids``: the host event tree, their ``name``/``level``/``part``/
    ``dur`` (aligned with ``ids``), and the row of the runtime call that launched each
    (-1: none; correlation id within the part, as the roofline and the replay read it)."""
    import pyarrow as pa

    ids = np.asarray(ids, np.int64)
    t = trace.tree(host_only=True, columns=("flops", "bytes", "dur", "correlation"))
    con = trace.con
    con.register("_xpuprof_cost_ids", pa.table({"id": pa.array(ids, pa.int64()),
                                                "k": pa.array(np.arange(len(ids)))}))  # fmt: skip
    try:
        got = con.execute(
            "select i.k, e.part, coalesce(e.correlation, -1) as corr, e.name, e.level, "
            "coalesce(e.dur, 0) as dur from _xpuprof_cost_ids i join events e on e.id = i.id "
            "order by i.k"
        ).fetchnumpy()
    finally:
        con.unregister("_xpuprof_cost_ids")
    k = np.asarray(got["k"], np.int64)
    info: dict[str, np.ndarray] = {}
    for col, fill, dt in (("part", -1, np.int64), ("corr", -1, np.int64), ("dur", 0, np.int64),
                          ("name", None, object), ("level", None, object)):  # fmt: skip
        a = np.full(len(ids), fill, dtype=dt)
        a[k] = np.asarray(got[col], dtype=dt)
        info[col] = a
    call = t.host_calls(info["part"], info["corr"], runtime_only=True)
    return t, info, call


def is_host_copy(name: Any, level: Any) -> bool:
    """A copy with the host on one side (Kineto names it ``Memcpy HtoD (Pageable -> Device)``
    and the like; device-to-device copies are ``DtoD``, peer copies ``PtoP``)."""
    if level != "memcpy":
        return False
    n = str(name)
    return not ("DtoD" in n or "PtoP" in n or "Device -> Device" in n)


class RooflineCosts:
    """Roofline time of every priced op, on the trace's own devices or on ``device``, with
    per-class efficiencies calibrated on the trace (module docstring).

    ``efficiencies``: ``{class: η}`` or ``{class: (η_compute, η_memory)}`` replacing the
    calibrated values. ``own_device``, ``tf32`` and ``calibrate`` are the roofline tool's
    ``device``, ``tf32`` and ``calibrate``: the device the trace ran on when its own record
    does not say (a CPU trace recorded on another machine: a spec of that CPU), fp32 matmuls
    on TF32, this machine's CPU measured as the roof of CPU ops. ``base``: the delays of what
    is not priced (default: measured). Tables: ``efficiencies``, ``ops`` (each op, its class,
    roofs, measured, own-device and predicted time), and after :meth:`delays`, ``unpriced``.
    """

    def __init__(self, trace: Trace, device: Any = None,
                 efficiencies: Mapping[str, float | tuple[float, float]] | None = None, *,
                 own_device: Any = None, tf32: bool = False, calibrate: bool = False,
                 base: CostModel | None = None) -> None:  # fmt: skip
        from xpuprof.analysis.roofline import roofline
        from xpuprof.sim.costs import Measured

        self.trace = trace
        self.base = base if base is not None else Measured()
        self.target = resolve_device(device)
        own = resolve_device(own_device)
        tables = roofline(trace, device=own, tf32=tf32, calibrate=calibrate).tables
        self.tables = tables  # the roofline tool's answer (devices, ops), for whoever prices on
        ops, xla = tables["ops"], _xla_kernels(tables["kernels"])
        work = self._device_work(ops)
        work = pd.concat([work[~work.index.isin(xla[1].index)], xla[1]])
        work["host_copy"] = work["host_copy"].astype(bool)
        work["op"] = work["op"].astype(np.int64)
        self._work = work
        self.ops = self._op_table(pd.concat([_op_units(ops), xla[0]], ignore_index=True))
        self.efficiencies = self._calibrate(efficiencies)
        self._predict()
        self.unpriced = pd.DataFrame(columns=UNPRICED_COLUMNS)

    # -- calibration -----------------------------------------------------------------------------

    def _device_work(self, ops: pd.DataFrame) -> pd.DataFrame:
        """Every kernel, copy and set with a launch, and the priced op (roofline ``ops`` id)
        that launched it (-1: none) — the roofline tool's own rule: runtime call by
        correlation id, then the nearest op of its table above the call."""
        w = self.trace.sql(
            "select id, part, correlation, dur, name, level from events where level in "
            "('kernel', 'memcpy', 'memset') and correlation is not null and dur is not null"
        )
        t = self.trace.tree(host_only=True)
        call = t.host_calls(w["part"].to_numpy(np.int64), w["correlation"].to_numpy(np.int64),
                            runtime_only=True)  # fmt: skip
        mask = np.zeros(t.n, bool)
        rows = t.rows_of(ops["id"].to_numpy(np.int64))
        mask[rows[rows >= 0]] = True
        owner = t.nearest(mask, call, strict=True)
        w["op"] = np.where(owner >= 0, t.ids[np.maximum(owner, 0)], -1)
        # per distinct (name, level): a store has few kernel names and many kernels
        codes, pairs = pd.factorize(pd.MultiIndex.from_arrays([w["name"], w["level"]]))
        copy = np.fromiter((is_host_copy(n, lv) for n, lv in pairs), bool, len(pairs))
        w["host_copy"] = copy[codes] if len(codes) else np.zeros(0, bool)
        return w.set_index("id")

    def _op_table(self, o: pd.DataFrame) -> pd.DataFrame:
        """The priced units (:func:`_op_units`, :func:`_xla_kernels`) with why each is not
        priced, its bound and its seconds at peak on its own device."""
        copies = self._work.loc[self._work["host_copy"], "op"].unique()
        reason = np.full(len(o), None, dtype=object)
        if "why" in o:
            reason[:] = o.pop("why").to_numpy(object)
        no_time = ~(o["measured_ns"] > 0)
        reason[no_time.to_numpy()] = "it launched no device work the trace has"
        reason[(o["measured_ns"] == 0).to_numpy()] = "its measured time is 0: nothing to scale"
        no_roof = (o["peak_flops"].isna() & (o["flops"] > 0)) | (
            o["peak_bandwidth"].isna() & ~(o["flops"] > 0))  # fmt: skip
        reason[(no_roof & ~no_time).to_numpy()] = NO_ROOF
        reason[(o["id"].isin(copies) & pd.isna(reason)).to_numpy()] = HOST_COPY
        o["priced"] = pd.isna(reason)
        o["reason"] = reason
        f, b = o["flops"].to_numpy(), o["bytes"].to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            tc = np.where(f > 0, f / o["peak_flops"].to_numpy(), 0.0)
            tm = np.where(b > 0, b / o["peak_bandwidth"].to_numpy(), 0.0)
        o["bound"] = np.where(np.nan_to_num(tc) >= np.nan_to_num(tm), "compute", "memory")
        o["_tc"], o["_tm"] = tc, tm  # seconds at peak, own device
        return o

    def _calibrate(self, given: Mapping[str, Any] | None) -> pd.DataFrame:
        """η per class (module docstring), then the classes ``given`` replaced."""
        p = self.ops[self.ops["priced"]]
        rows = []
        for cls, g in p.groupby("class", sort=True):
            cb, mb = g[g["bound"] == "compute"], g[g["bound"] == "memory"]
            t_cb, t_mb = cb["measured_ns"].sum() * 1e-9, mb["measured_ns"].sum() * 1e-9
            ec = cb["_tc"].sum() / t_cb if t_cb > 0 else None
            em = mb["_tm"].sum() / t_mb if t_mb > 0 else None
            ec, em = ec or em, em or ec
            s = _times(g, ec, em).sum() / (g["measured_ns"].sum() * 1e-9)
            rows.append({"class": cls, "ops": len(g), "compute_bound": len(cb),
                         "memory_bound": len(mb), "measured_ns": float(g["measured_ns"].sum()),
                         "eta_compute": ec * s, "eta_memory": em * s,
                         "source": "calibrated"})  # fmt: skip
        eff = pd.DataFrame(rows, columns=EFFICIENCY_COLUMNS)
        for cls, v in (given or {}).items():
            ec, em = (v, v) if isinstance(v, (int, float)) else tuple(v)
            if not all(isinstance(x, (int, float)) and x > 0 for x in (ec, em)):
                raise CostModelError(f"efficiency of {cls!r} must be > 0 (η, or (η_compute, "
                                     f"η_memory)), got {v!r}")  # fmt: skip
            if cls not in set(eff["class"]):
                raise CostModelError(
                    f"no priced op of class {cls!r} in this trace; classes: "
                    f"{', '.join(eff['class']) or 'none (no op has FLOPs and a known device)'}"
                )
            k = eff.index[eff["class"] == cls][0]
            eff.loc[k, ["eta_compute", "eta_memory", "source"]] = [float(ec), float(em), "given"]
        return eff

    def _predict(self) -> None:
        """Own-device and target times of every priced op."""
        o = self.ops
        eff = self.efficiencies.set_index("class")
        ec = o["class"].map(eff["eta_compute"]).to_numpy(float)
        em = o["class"].map(eff["eta_memory"]).to_numpy(float)
        o["own_ns"] = _times(o, ec, em) * 1e9
        if self.target is None:
            o["target_peak_flops"], o["target_bandwidth"] = o["peak_flops"], o["peak_bandwidth"]
        else:
            peaks = {(d, m): self.target.peak(d, matrix=m)[0]
                     for d, m in set(zip(o["dtype"], o["matrix"], strict=True))}  # fmt: skip
            o["target_peak_flops"] = [peaks[(d, m)] for d, m in zip(o["dtype"], o["matrix"],
                                                                     strict=True)]  # fmt: skip
            o["target_peak_flops"] = o["target_peak_flops"].astype(float)
            o["target_bandwidth"] = float(self.target.memory_bandwidth)
        f, b = o["flops"].to_numpy(), o["bytes"].to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            tc = np.where(f > 0, f / o["target_peak_flops"].to_numpy(float), 0.0)
            tm = np.where(b > 0, b / o["target_bandwidth"].to_numpy(float), 0.0)
        o["predicted_ns"] = np.fmax(tc / ec, tm / em) * 1e9
        lost = o["priced"] & ~(o["predicted_ns"] > 0)
        o.loc[lost, "reason"] = "the target device has no peak for its precision"
        o.loc[lost, "priced"] = False
        o.loc[~o["priced"], ["own_ns", "predicted_ns"]] = np.nan
        self.ops = o[OP_COLUMNS]  # without the seconds at peak, used only to calibrate

    def time_ns(self, cls: str, flops: float, nbytes: float, dtype: str = "fp32", *,
                matrix: bool | None = None) -> float:  # fmt: skip
        """The model's time of other work of class ``cls`` on the target device (or, without
        one, the trace's first priced device of that class): for a transform that changes
        FLOPs or bytes (a batch size, a fusion)."""
        from xpuprof.costmodel.call import EXACT_KINDS

        eff = self.efficiencies.set_index("class")
        if cls not in eff.index:
            raise CostModelError(f"no calibrated class {cls!r}; classes: "
                                 f"{', '.join(eff.index) or 'none'}")  # fmt: skip
        matrix = cls in EXACT_KINDS if matrix is None else matrix
        if self.target is not None:
            peak, bw = self.target.peak(dtype, matrix=matrix)[0], self.target.memory_bandwidth
        else:
            same = self.ops[self.ops["priced"] & (self.ops["class"] == cls)].iloc[0]
            peak, bw = same["peak_flops"], same["peak_bandwidth"]
        tc = flops / (eff.loc[cls, "eta_compute"] * peak) if flops > 0 and peak else 0.0
        tm = nbytes / (eff.loc[cls, "eta_memory"] * bw) if nbytes > 0 else 0.0
        return max(tc, tm) * 1e9

    # -- pricing a graph -------------------------------------------------------------------------

    def delays(self, graph: ReplayGraph) -> np.ndarray:
        out = np.asarray(self.base.delays(graph), np.int64).copy()
        e = graph.edges
        ops = self.ops.set_index("id")
        ratio = (ops["predicted_ns"] / ops["measured_ns"]).where(ops["priced"])
        # device work: its op's time shared by measured duration (dur/T · t = dur · t/T)
        dev = np.flatnonzero((e.kind == DEVICE_WORK) & (e.event >= 0))
        ev = e.event[dev]
        work = self._work.reindex(ev)
        op = work["op"].fillna(-1).to_numpy(np.int64)
        r = ratio.reindex(op).to_numpy(float)
        dur = work["dur"].to_numpy(float)
        ok = ~np.isnan(r) & ~np.isnan(dur)
        out[dev[ok]] = np.rint(dur[ok] * r[ok]).astype(np.int64)
        why = np.full(len(dev), NO_OP, dtype=object)
        has_op = op >= 0
        why[has_op] = ops["reason"].reindex(op[has_op]).to_numpy(object)
        why[work["host_copy"].fillna(False).to_numpy(bool)] = HOST_COPY
        known = work["name"].notna().to_numpy()
        why[~known] = NO_COST
        self.unpriced = pd.DataFrame({
            "event": ev[~ok], "name": work["name"].to_numpy(object)[~ok],
            "level": work["level"].to_numpy(object)[~ok], "reason": why[~ok],
        }, columns=UNPRICED_COLUMNS)  # fmt: skip
        # host work inside priced CPU ops: scaled by t/T
        host_ops = ops.index[ops["priced"] & ops["on_host"]].to_numpy(np.int64)
        hw_rows = np.flatnonzero((e.kind == HOST_WORK) & (e.event >= 0))
        if len(host_ops) and len(hw_rows):
            t = self.trace.tree(host_only=True)
            mask = np.zeros(t.n, bool)
            hr = t.rows_of(host_ops)
            mask[hr[hr >= 0]] = True
            owner = t.nearest(mask, t.rows_of(e.event[hw_rows]))
            inside = owner >= 0
            rr = ratio.reindex(t.ids[owner[inside]]).to_numpy(float)
            sel = hw_rows[inside]
            out[sel] = np.rint(out[sel] * rr).astype(np.int64)
        return out

    def unpriced_summary(self) -> pd.DataFrame:
        """``unpriced`` grouped by reason: how many, and the most frequent names."""
        u = self.unpriced
        if not len(u):
            return pd.DataFrame(columns=["reason", "events", "examples"])
        g = u.groupby("reason")["name"]
        return pd.DataFrame({
            "events": g.size(),
            "examples": g.agg(lambda s: ", ".join(map(str, s.value_counts().index[:3]))),
        }).reset_index().sort_values("events", ascending=False, ignore_index=True)  # fmt: skip


def _op_units(ops: pd.DataFrame) -> pd.DataFrame:
    """The roofline tool's ``ops`` table as units of the model."""
    from xpuprof.costmodel.call import EXACT_KINDS

    return pd.DataFrame({
        "id": ops["id"].to_numpy(np.int64), "part": ops["part"].to_numpy(np.int64),
        "name": ops["name"].to_numpy(object),
        "class": ops["kind"].fillna(OTHER).to_numpy(object),
        "dtype": ops["dtype"].to_numpy(object),
        "matrix": ops["kind"].isin(list(EXACT_KINDS)).to_numpy(bool),
        "flops": ops["flops"].to_numpy(float), "bytes": ops["bytes"].to_numpy(float),
        "measured_ns": ops["time_ns"].to_numpy(float),
        "peak_flops": ops["peak_flops"].to_numpy(float),
        "peak_bandwidth": ops["peak_bandwidth"].to_numpy(float),
        "on_host": (ops["time_source"] != "device kernels").to_numpy(bool),
    })  # fmt: skip


def _xla_kernels(kernels: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """XLA ops on a device with the FLOPs and bytes of XLA's cost analysis (the roofline
    tool's ``kernels`` table): each is its own unit, of class ``xla:<HLO category>``, and its
    own device work. GEMM-like (matrix rate) when its HLO category or name says convolution or
    dot, as the roofline tool marks them. CUPTI counter ranges are not used: their counters miss
    Tensor Core work and their times are the profiler's replays."""
    k = kernels[(kernels["source"] == "XLA cost analysis") & (kernels["device_index"] >= 0)]
    cat = k["category"].fillna("").astype(str).str.lower()
    units = pd.DataFrame({
        "id": k["id"].to_numpy(np.int64), "part": k["part"].to_numpy(np.int64),
        "name": k["name"].to_numpy(object), "class": ("xla:" + cat).to_numpy(object),
        "dtype": k["dtype"].to_numpy(object),
        "matrix": (cat.str.contains("convolution|dot") | k["name"].fillna("").str.lower()
                   .str.contains(r"dot|gemm|matmul|conv|cublas")).to_numpy(bool),
        "flops": k["flops"].to_numpy(float), "bytes": k["bytes"].to_numpy(float),
        "measured_ns": k["time_ns"].to_numpy(float),
        "peak_flops": k["peak_flops"].to_numpy(float),
        "peak_bandwidth": k["peak_bandwidth"].to_numpy(float),
        "on_host": np.zeros(len(k), bool),
        "why": np.where(cat.str.endswith("-start"), ASYNC_START, None),
    })  # fmt: skip
    work = pd.DataFrame({
        "part": units["part"].to_numpy(), "correlation": -1,
        "dur": units["measured_ns"].to_numpy(), "name": units["name"].to_numpy(),
        "level": "kernel", "op": units["id"].to_numpy(), "host_copy": False,
    }, index=pd.Index(units["id"].to_numpy(), name="id"))  # fmt: skip
    return units, work


def _times(o: pd.DataFrame, ec: Any, em: Any) -> np.ndarray:
    """max(F/(η_c·P), B/(η_m·W)) in seconds, from the seconds at peak ``_tc``/``_tm``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.fmax(o["_tc"].to_numpy(float) / ec, o["_tm"].to_numpy(float) / em)

"""Roofline: where each op and kernel sits against the compute and memory roofs of its device.

Ops are the outermost framework ops with FLOPs (the event tree's ``outermost``), timed by the
kernels they launched; kernels are those whose FLOPs the trace itself records (XLA cost
analysis, CUPTI counters). ``docs/roofline.md`` defines intensity, roofs, bounds, precisions,
device matching and when the local CPU is calibrated (only on request).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.analysis.common import Result, step_mode, steps_mask, where_clause
from xpuprof.analysis.cupti import CUPTI_COUNTERS, cupti_kernels  # noqa: F401  (re-exported)
from xpuprof.core.errors import XpuprofError
from xpuprof.core.raw import decode_json
from xpuprof.core.text import human_time
from xpuprof.hardware import specs as hw
from xpuprof.trace.tree import rows_in

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.analysis.common import StepSelection
    from xpuprof.hardware.specs import DeviceSpec
    from xpuprof.trace.trace import Trace
    from xpuprof.trace.tree import EventTree

#: ``device=`` values that mean this machine's CPU (calibrated on the spot, or from the cache).
LOCAL_CPU_NAMES = ("local-cpu", "local", "cpu")

#: ``Input type`` spellings (c10 type names) → precision.
TORCH_DTYPES = {"float": "fp32", "double": "fp64", "c10::Half": "fp16", "c10::BFloat16": "bf16",
                "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8",
                "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8",
                "c10::complex<float>": "fp32", "c10::complex<double>": "fp64",
                "c10::complex<c10::Half>": "fp16"}  # fmt: skip

#: XLA element types (``shape_with_layout`` prefixes) → precision.
XLA_DTYPES = {"f64": "fp64", "f32": "fp32", "bf16": "bf16", "f16": "fp16", "s8": "int8",
              "u8": "int8", "f8e4m3fn": "fp8", "f8e5m2": "fp8", "f8e4m3": "fp8",
              "f8e4m3fnuz": "fp8", "f8e5m2fnuz": "fp8", "c64": "fp32", "c128": "fp64"}  # fmt: skip

OP_COLUMNS = ["rank", "part", "step", "id", "name", "kind", "dtype", "device", "flops", "bytes",
              "intensity", "time_ns", "time_source", "achieved_flops", "achieved_bandwidth",
              "peak_flops", "peak_key", "peak_bandwidth", "ridge", "roof", "bound",
              "pct_of_roof"]  # fmt: skip
KERNEL_COLUMNS = ["rank", "part", "device_index", "id", "name", "source", "category", "dtype",
                  "device", "flops", "bytes", "intensity", "time_ns", "achieved_flops",
                  "achieved_bandwidth", "peak_flops", "peak_key", "peak_bandwidth", "ridge",
                  "roof", "bound", "pct_of_roof"]  # fmt: skip


def _first_float(types: Any) -> str:
    if isinstance(types, list):
        for t in types:
            if isinstance(t, str) and t in TORCH_DTYPES:
                return TORCH_DTYPES[t]
    return "fp32"


def _xla_dtype(shape: Any) -> str:
    if isinstance(shape, str):
        m = re.match(r"\(?\s*([a-z0-9]+)\[", shape)
        if m:
            return XLA_DTYPES.get(m.group(1), "fp32")
    return "fp32"


class _Devices:
    """Resolves (part, device index) → DeviceSpec, remembering what it could not resolve."""

    def __init__(self, trace: Trace, device: Any, calibrate: bool) -> None:
        self.meta = trace.meta
        self.sources = {s["part"]: s for s in self.meta["sources"]}
        self.calibrate = calibrate
        self.cache: dict[tuple[int, int], tuple[DeviceSpec | None, str]] = {}
        self.unknown: set[str] = set()
        self.forced: DeviceSpec | None = None
        self._cpu: DeviceSpec | None = None
        self.cpu_used = False
        self.cpu_skipped = False
        if device is not None:
            if isinstance(device, hw.DeviceSpec):
                self.forced = device
            elif str(device).strip().lower() in LOCAL_CPU_NAMES:
                self.calibrate = True
                self.forced = self.cpu()
            else:
                spec = hw.match(str(device))
                if spec is None:
                    raise XpuprofError(
                        f"unknown device {device!r}; known: {', '.join(hw.SPECS)} "
                        "(or a name such as 'NVIDIA A100-SXM4-80GB')"
                    )
                self.forced = spec

    def cpu(self) -> DeviceSpec | None:
        """The calibrated local CPU; None (and remembered) when calibration was not asked for."""
        if not self.calibrate:
            self.cpu_skipped = True
            return None
        if self._cpu is None:
            from xpuprof.hardware.calibrate import local_cpu

            self._cpu = local_cpu()
        self.cpu_used = True
        return self._cpu

    def get(self, part: int, index: int) -> tuple[DeviceSpec | None, str]:
        if self.forced is not None:
            return self.forced, "device= argument"
        key = (int(part), int(index))
        if key not in self.cache:
            self.cache[key] = self._resolve(*key)
        return self.cache[key]

    def _resolve(self, part: int, index: int) -> tuple[DeviceSpec | None, str]:
        if index < 0:
            cpu = self.cpu()
            return cpu, "local CPU calibration" if cpu else "local CPU, not calibrated"
        src = self.sources.get(part, {})
        meta = src.get("meta", {}) or {}
        for plane in meta.get("planes", []) or []:
            if plane.get("kind") == "device" and plane.get("device") == index:
                return self._from_plane(plane)
        props_list = self.meta["device_properties"].get(part) or []
        props = next((p for p in props_list if p.get("id") == index), None)
        if props is None and len(props_list) == 1:
            props = props_list[0]
        if props is None:
            self.unknown.add(f"device {index} of source {part}: no deviceProperties entry")
            return None, "unknown"
        spec = hw.match(props.get("name"), props)
        if spec is None:
            self.unknown.add(f"{props.get('name')!r} (not in the hardware table)")
            return None, "unknown"
        return spec, f"deviceProperties {props.get('name')!r}"

    def _from_plane(self, plane: dict[str, Any]) -> tuple[DeviceSpec | None, str]:
        import dataclasses

        stats = plane.get("stats", {}) or {}
        name = stats.get("device_type_string") or plane.get("name")
        spec = hw.match(name)
        tf = stats.get("peak_teraflops_per_second")
        bw = stats.get("peak_hbm_bw_gigabytes_per_second")
        if isinstance(tf, (int, float)) and tf > 0 and isinstance(bw, (int, float)) and bw > 0:
            base = spec or hw.DeviceSpec(
                key="xplane-device", name=str(name), vendor="", kind="tpu" if "tpu" in
                str(name).lower() else "gpu", flops={}, memory_bandwidth=bw * 1e9)  # fmt: skip
            flops = dict(base.flops)
            flops["bf16"] = tf * 1e12
            spec = dataclasses.replace(
                base,
                flops=flops,
                memory_bandwidth=bw * 1e9,
                source=f"XPlane plane stats of {plane.get('name')} "
                f"({base.source or 'no table entry'})",
            )
            return spec, f"XPlane {name!r} plane stats"
        if spec is None:
            self.unknown.add(f"{name!r} (not in the hardware table)")
            return None, "unknown"
        return spec, f"XPlane {name!r}"


def _metrics(df: pd.DataFrame, specs: list[DeviceSpec | None], matrix: np.ndarray,
             spec_code: np.ndarray | None = None) -> None:  # fmt: skip
    """Fill the roofline columns of ``df`` (flops, bytes, time_ns, dtype already present).
    ``spec_code``: a code per row that is equal wherever the spec is the same object (saves
    finding it from ``specs``)."""
    n = len(df)
    peak = np.full(n, np.nan)
    peak_key = np.full(n, None, dtype=object)
    bw = np.full(n, np.nan)
    names = np.full(n, None, dtype=object)
    dt = df["dtype"].to_numpy()
    # one peak() call per distinct (device, precision, matrix) combination
    # (integer codes: factorizing a MultiIndex of object columns costs more than the rest)
    if spec_code is None:
        by_id = {id(s): s for s in specs}
        s_ids = np.unique(np.array(list(by_id), np.int64))
        sid = np.array([id(s) for s in specs], dtype=np.int64) if n else np.empty(0, np.int64)
        spec_code = np.searchsorted(s_ids, sid)
    s_code = np.asarray(spec_code, np.int64)
    d_code, d_values = pd.factorize(pd.Series(dt, dtype=object), use_na_sentinel=False)
    key = (s_code * max(len(d_values), 1) + d_code) * 2 + np.asarray(matrix, bool)
    uniq, first, codes = np.unique(key, return_index=True, return_inverse=True)
    for c, i in enumerate(first.tolist()):
        s, d, m = specs[i], d_values[d_code[i]], bool(matrix[i])
        if s is None:
            continue
        rows = codes.reshape(-1) == c
        p, k = s.peak(d, matrix=bool(m))
        peak[rows] = np.nan if p is None else p
        peak_key[rows] = k
        bw[rows] = s.memory_bandwidth
        names[rows] = s.name
    f = df["flops"].to_numpy(float)
    b = df["bytes"].to_numpy(float)
    t = df["time_ns"].to_numpy(float) * 1e-9
    with np.errstate(divide="ignore", invalid="ignore"):
        inten = np.where(b > 0, f / b, np.nan)
        af = np.where(t > 0, f / t, np.nan)
        ab = np.where(t > 0, b / t, np.nan)
        ridge = peak / bw
        roof = np.where(np.isnan(inten), peak, np.minimum(peak, inten * bw))
        roof = np.where((b > 0) & (f == 0), 0.0, roof)
        util_c = af / peak
        util_m = ab / bw
        pct = 100 * np.where(np.isnan(util_m), util_c, np.fmax(util_c, util_m))
    bound = np.where(
        np.isnan(inten) | np.isnan(ridge), "unknown", np.where(inten >= ridge, "compute", "memory")
    )
    df["device"] = names
    df["intensity"] = inten
    df["achieved_flops"] = af
    df["achieved_bandwidth"] = ab
    df["peak_flops"] = peak
    df["peak_key"] = peak_key
    df["peak_bandwidth"] = bw
    df["ridge"] = ridge
    df["roof"] = roof
    df["bound"] = np.where(np.isnan(peak) & np.isnan(bw), "unknown", bound)
    df["pct_of_roof"] = pct


def _op_time(
    trace: Trace, t: EventTree, outer: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of the tree (for the ``outer`` ops): device time of the kernels, copies and sets
    it launched, their count, and the device index (-1: none)."""
    time = np.zeros(t.n, np.float64)
    nk = np.zeros(t.n, np.int64)
    dev = np.full(t.n, -1, np.int64)
    kern = trace.sql(
        "select part, correlation, dur, device from events where level in "
        "('kernel','memcpy','memset') and correlation is not null and dur is not null"
    )
    if not len(kern) or not t.n:  # no tree (a selection with no events): nothing launched
        return time, nk, dev
    call = t.host_calls(kern["part"].to_numpy(np.int64), kern["correlation"].to_numpy(np.int64),
                        runtime_only=True)  # fmt: skip
    owner = t.nearest(outer, call, strict=True)
    ok = owner >= 0
    np.add.at(time, owner[ok], kern["dur"].to_numpy(float)[ok])
    np.add.at(nk, owner[ok], 1)
    dev[owner[ok]] = kern["device"].to_numpy(np.int64)[ok]
    return time, nk, dev


def _op_specs(devs: _Devices, part: np.ndarray, dev_index: np.ndarray,
              on_device: np.ndarray) -> tuple[list[DeviceSpec | None], np.ndarray]:  # fmt: skip
    """The device spec of each distinct (part, device, on device), and the index of each
    op's: one lookup per combination, found through one integer per combination (a row-wise
    unique sorts the rows as bytes: slow)."""
    combo = np.c_[part, dev_index, on_device].astype(np.int64).reshape(-1, 3)
    _, first, inv = np.unique((combo[:, 0] * (1 << 32) + combo[:, 1] + 1) * 2 + combo[:, 2],
                              return_index=True, return_inverse=True)  # fmt: skip
    one = [devs.get(p, d)[0] if (d >= 0 or not o) else None for p, d, o in combo[first].tolist()]
    return one, inv.reshape(-1)


def _ops(
    trace: Trace,
    devs: _Devices,
    ranks: list[int] | None,
    steps: StepSelection,
    tf32: bool,
    notes: list[str],
) -> tuple[pd.DataFrame, list[DeviceSpec | None], np.ndarray]:
    """The ``ops`` table (outermost ops with FLOPs, timed, typed and placed on their roofs),
    with each op's device spec and whether it is GEMM-like."""
    from xpuprof.costmodel.call import EXACT_KINDS
    from xpuprof.costmodel.ops import op_kind

    # ops, their ancestors and the runtime calls that launched kernels are host events: the
    # host tree holds all of them (and is the one the diagnosis builds); only dropping the
    # last step needs every step span, device lines' included
    host_only = step_mode(steps)[0] != "drop-last"
    t = trace.tree(ranks, host_only=host_only,
                   columns=("flops", "bytes", "dur", "step", "correlation"))  # fmt: skip
    has = t.is_level("op") & ~np.isnan(t.flops)
    outer = t.outermost_with_value(has)
    outer &= ~((t.flops == 0) & ~(t.bytes > 0))  # views and allocations: no work at all
    rows = np.flatnonzero(outer & steps_mask(t, steps))
    dev_parts = trace.sql("select distinct part from events where level in ('kernel', "
                          "'memcpy', 'memset', 'collective')")["part"]  # fmt: skip
    on_device = np.isin(t.part[rows], dev_parts.to_numpy(np.int64))
    op_time, op_nk, op_dev = _op_time(trace, t, outer)
    time_ns = np.where(on_device, op_time[rows], t.dur[rows].astype(float))
    time_ns = np.where(on_device & (op_nk[rows] == 0), np.nan, time_ns)
    names = t.names_of(rows)
    kind_of = {nm: op_kind(str(nm)) for nm in set(names.tolist())}
    kinds = np.array([kind_of[nm] for nm in names.tolist()], dtype=object)
    ops = pd.DataFrame(
        {
            "rank": pd.array(np.where(t.rank[rows] >= 0, t.rank[rows], None), dtype="Int64"),
            "part": t.part[rows],
            "step": pd.array(np.where(t.step[rows] >= 0, t.step[rows], None), dtype="Int64"),
            "id": t.ids[rows],
            "name": names,
            "kind": kinds,
            "dtype": _op_dtypes(trace, t.ids[rows]),
            "flops": t.flops[rows],
            "bytes": t.bytes[rows],
            "time_ns": time_ns,
            "time_source": np.where(on_device, "device kernels", "op duration (host)"),
        }
    )
    # ops on a device without a launch recorded: no device to judge them on
    dev_index = np.where(on_device, op_dev[rows], -1)
    # one device lookup per distinct (part, device, on device)
    one, inv = _op_specs(devs, t.part[rows], dev_index, on_device)
    spec_of = np.empty(len(one), dtype=object)
    spec_of[:] = one
    specs = spec_of[inv.reshape(-1)].tolist()
    matrix = np.isin(kinds, list(EXACT_KINDS))
    # tf32 for fp32 GEMMs on request, fp32 convolutions by cuDNN's default
    tf = (ops["dtype"] == "fp32") & (((ops["kind"] == "matmul") & tf32) | (ops["kind"] == "conv"))
    one_tf32 = np.array([s is not None and "tf32" in s.flops for s in one] or [False], bool)
    has_tf32 = one_tf32[inv.reshape(-1)] if len(one) else np.zeros(len(specs), bool)
    ops.loc[tf & has_tf32, "dtype"] = "tf32"
    inferred = _infer_tf32(ops, specs, matrix, has_tf32)
    _metrics(ops, specs, matrix, spec_code=inv)
    ops = ops[OP_COLUMNS].reset_index(drop=True)
    if inferred:
        notes.append(
            f"{inferred} fp32 GEMM-like ops ran faster than the device's fp32 peak, which only "
            "TF32 Tensor Cores allow (torch.backends.cuda.matmul.allow_tf32 / "
            "torch.set_float32_matmul_precision): they are measured against the TF32 roof."
        )
    no_launch = int((on_device & np.isnan(time_ns)).sum())
    if no_launch:
        notes.append(
            f"{no_launch} ops with FLOPs launched no kernel the trace recorded (CPU-side work in a "
            "GPU trace, or launches outside the capture): they have no device time, so no "
            "achieved rate."
        )
    return ops, specs, matrix


def _devices_table(devs: _Devices, notes: list[str]) -> pd.DataFrame:
    """The ``devices`` table (every device resolved, or the forced one) and its notes."""
    rows = [_device_row(part, idx, s, how) for (part, idx), (s, how) in sorted(devs.cache.items())]
    if devs.forced is not None:
        rows.append(_device_row(None, None, devs.forced, "device= argument"))
    if devs.unknown:
        notes.append(
            "device not in the hardware table, so no roof for its work: "
            + "; ".join(sorted(devs.unknown))
            + " (pass device= to choose one; xpuprof.hardware.SPECS lists them)."
        )
    if devs.cpu_used:
        notes.append(
            "CPU work is measured against this machine's calibrated CPU "
            "(xpuprof.hardware.local_cpu); a CPU trace recorded on another machine should be "
            "read with device= set to a spec of that machine."
        )
    if devs.cpu_skipped:
        notes.append(
            "CPU ops have no roof: this machine's CPU is calibrated only on request "
            "(calibrate=True, CLI --calibrate: a micro-benchmark of a second or two, cached in "
            "the user cache directory), which describes the trace's CPU only if it was "
            "recorded here; or pass device= with a spec."
        )
    cols = ["part", "device_index", "key", "name", "source_of_match", "peak_tflops",
            "memory_bandwidth", "memory_bytes", "spec_source"]  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def roofline(
    trace: Trace,
    *,
    ranks: Iterable[int] | None = None,
    steps: StepSelection = None,
    device: Any = None,
    tf32: bool = False,
    calibrate: bool = False,
) -> Result:
    """Roofline placement of ops and kernels (``docs/roofline.md`` for every rule).

    ``device``: a :class:`~xpuprof.hardware.DeviceSpec`, a table key (``"h100-sxm"``), a
    device name, or ``"local-cpu"``, used for every event instead of the trace's own devices
    ("what would this trace's work look like against an H200's roofs"). ``calibrate=True``
    measures this machine's CPU (cached in the user cache directory) as the roof of CPU ops;
    without it they have none. ``tf32``: fp32 matmuls ran on TF32 Tensor Cores. Tables:
    ``ops``, ``by_name`` (ops grouped by name, precision and device, largest device time
    first), ``kernels`` and ``devices``. Facts: ``headline`` (:func:`headline`), when costed
    ops were timed.
    """
    ranks = None if ranks is None else [int(r) for r in ranks]
    notes: list[str] = []
    devs = _Devices(trace, device, calibrate)
    ops, specs, matrix = _ops(trace, devs, ranks, steps, tf32, notes)
    kernels = _kernels(trace, devs, notes, ranks, steps)
    if not len(ops):
        notes.append(
            "no framework-op FLOPs: the trace records no input shapes (torch.profiler "
            "record_shapes=True, or xpuprof.profile(level='full')), or its ops are not ones "
            "xpuprof can cost (xpuprof.costmodel.ops.supported_ops()); the ops table is empty"
            + (" (kernel-level FLOPs from the trace are in the kernels table)." if len(kernels)
               else ".")
        )  # fmt: skip
    tables = {"ops": ops, "by_name": _by_name(ops, specs, matrix), "kernels": kernels,
              "devices": _devices_table(devs, notes)}  # fmt: skip
    line = headline(tables["by_name"])
    return Result(tables=tables, notes=notes, facts={"headline": line} if line else {})


def headline(by_name: pd.DataFrame) -> str | None:
    """The roofline in one sentence (the ``by_name`` table of :func:`roofline`): the shares
    of the costed time that are compute- and memory-bound, or that no roof is known; None
    without timed costed ops."""
    b = by_name
    if not len(b) or not b.time_ns.sum():
        return None
    known = b[b.bound != "unknown"]
    if not len(known):
        return (f"{len(b)} op names costed ({human_time(b.time_ns.sum())}); no roof for this "
                "device, so whether they are compute- or memory-bound is unknown")  # fmt: skip
    by = known.groupby("bound").time_ns.sum()
    share = ", ".join(f"{v / by.sum():.0%} {k}-bound" for k, v in by.items())
    return f"Of {human_time(by.sum())} of costed work with a known roof: {share}"


def _infer_tf32(
    ops: pd.DataFrame, specs: list[Any], matrix: np.ndarray, has_tf32: np.ndarray
) -> int:
    """Mark as TF32 the fp32 GEMM-like ops whose achieved rate exceeds the fp32 peak."""
    cand = np.flatnonzero(matrix & has_tf32 & (ops["dtype"].to_numpy() == "fp32"))
    if not len(cand):
        return 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ach = ops["flops"].to_numpy(float)[cand] / (ops["time_ns"].to_numpy(float)[cand] * 1e-9)
    p32 = np.array([specs[i].peak("fp32", matrix=True)[0] or np.inf for i in cand])
    over = cand[ach > p32]
    ops.iloc[over, ops.columns.get_loc("dtype")] = "tf32"
    return len(over)


def _device_row(part: Any, idx: Any, s: DeviceSpec | None, how: str) -> dict[str, Any]:
    return {
        "part": part,
        "device_index": idx,
        "key": s.key if s else None,
        "name": s.name if s else None,
        "source_of_match": how,
        "peak_tflops": {k: v / 1e12 for k, v in s.flops.items()} if s else None,
        "memory_bandwidth": s.memory_bandwidth if s else None,
        "memory_bytes": s.memory_bytes if s else None,
        "spec_source": s.source if s else None,
    }


def _op_dtypes(trace: Trace, ids: np.ndarray) -> np.ndarray:
    """Precision of each op from its recorded ``Input type`` (fp32 when unknown)."""
    import pyarrow as pa

    if not len(ids):
        return np.empty(0, dtype=object)
    con = trace.con
    con.register("_xpuprof_roofline_ids", pa.table({"id": pa.array(ids, pa.int64())}))
    try:
        got = con.execute(
            """select e.id, json_extract(e.args, '$."Input type"')::varchar as types
               from events e join _xpuprof_roofline_ids i on e.id = i.id"""
        ).fetchnumpy()
    finally:
        con.unregister("_xpuprof_roofline_ids")
    memo: dict[Any, str] = {}

    def prec(text: Any) -> str:
        if text not in memo:
            memo[text] = _first_float(decode_json(text)) if text else "fp32"
        return memo[text]

    got_ids = np.asarray(got["id"], np.int64)
    # each distinct text decoded once (ops repeat a few signatures many times)
    codes, texts = pd.factorize(pd.Series(got["types"], dtype=object), use_na_sentinel=False)
    got_prec = np.array([prec(t) for t in texts.tolist()] or ["fp32"], dtype=object)[codes]
    out = np.full(len(ids), "fp32", dtype=object)
    pos = rows_in(got_ids, ids)
    out[pos >= 0] = got_prec[pos[pos >= 0]]
    return out


def _by_name(ops: pd.DataFrame, specs: list[Any], matrix: np.ndarray) -> pd.DataFrame:
    cols = ["name", "kind", "dtype", "device", "count", "flops", "bytes", "time_ns", "intensity",
            "achieved_flops", "achieved_bandwidth", "peak_flops", "peak_bandwidth", "ridge",
            "roof", "bound", "pct_of_roof", "share_of_time"]  # fmt: skip
    timed = ops[ops["time_ns"].notna()]
    if not len(timed):
        return pd.DataFrame(columns=cols)
    g = (
        timed.assign(device=timed["device"].fillna("(unknown)"))
        .groupby(["name", "kind", "dtype", "device"], dropna=False)
        .agg(
            count=("id", "size"),
            flops=("flops", "sum"),
            bytes=("bytes", lambda s: s.sum(min_count=len(s))),
            time_ns=("time_ns", "sum"),
            peak_flops=("peak_flops", "first"),
            peak_bandwidth=("peak_bandwidth", "first"),
        )
        .reset_index()
    )
    f, b, t = g["flops"], g["bytes"], g["time_ns"] * 1e-9
    with np.errstate(divide="ignore", invalid="ignore"):
        g["intensity"] = np.where(b > 0, f / b, np.nan)
        g["achieved_flops"] = np.where(t > 0, f / t, np.nan)
        g["achieved_bandwidth"] = np.where(t > 0, b / t, np.nan)
        g["ridge"] = g["peak_flops"] / g["peak_bandwidth"]
        g["roof"] = np.where(
            g["intensity"].isna(),
            g["peak_flops"],
            np.minimum(g["peak_flops"], g["intensity"] * g["peak_bandwidth"]),
        )
        uc = g["achieved_flops"] / g["peak_flops"]
        um = g["achieved_bandwidth"] / g["peak_bandwidth"]
        g["pct_of_roof"] = 100 * np.where(um.isna(), uc, np.fmax(uc, um))
    g["bound"] = np.where(
        g["intensity"].isna() | g["ridge"].isna(),
        "unknown",
        np.where(g["intensity"] >= g["ridge"], "compute", "memory"),
    )
    total = float(g["time_ns"].sum()) or 1.0
    g["share_of_time"] = 100 * g["time_ns"] / total
    return g.sort_values("time_ns", ascending=False)[cols].reset_index(drop=True)


def _kernels(
    trace: Trace,
    devs: _Devices,
    notes: list[str],
    ranks: list[int] | None,
    steps: StepSelection,
) -> pd.DataFrame:
    """The ``kernels`` table: device work whose FLOPs the trace records."""
    w = where_clause(ranks=ranks, steps=steps)
    frames = []
    xla = trace.sql(
        f"""select rank, part, device as device_index, id, name, category,
               ts, dur as time_ns,
               try_cast(json_extract(args, '$.flops') as double) as flops,
               try_cast(json_extract(args, '$.bytes_accessed') as double) as bytes,
               json_extract_string(args, '$.shape_with_layout') as shape,
               json_extract_string(args, '$.hlo_category') as hlo
            from events
            where {w} and level = 'kernel' and lower(category) in ('xla_op', 'xla_op_cpu')"""
    )
    if len(xla):
        xla = xla[(xla["flops"] > 0) | (xla["bytes"] > 0)].copy()
        xla["source"] = "XLA cost analysis"
        xla["dtype"] = [_xla_dtype(s) for s in xla["shape"]]
        hlo = xla["hlo"].fillna("").str.lower()
        nm = xla["name"].fillna("").str.lower()
        xla["matrix"] = hlo.str.contains("convolution|dot") | nm.str.contains(
            r"dot|gemm|matmul|conv|cublas"
        )
        xla["category"] = xla["hlo"].fillna(xla["category"])
        frames.append(xla)
    cupti = trace.sql(
        f"""select rank, part, device as device_index, id, name, category, ts,
               dur as time_ns, args
            from events where {w} and lower(category) = 'cuda_profiler_range'"""
    )
    if len(cupti):
        frames.append(cupti_kernels(cupti, notes))
    if not frames:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    k = pd.concat(frames, ignore_index=True)
    specs = []
    for p, d in zip(k["part"].tolist(), k["device_index"].tolist(), strict=True):
        specs.append(devs.get(int(p), int(d))[0])
    _metrics(k, specs, k["matrix"].to_numpy(bool))
    return (
        k[KERNEL_COLUMNS]
        .sort_values(["part", "time_ns"], ascending=[True, False])
        .reset_index(drop=True)
    )

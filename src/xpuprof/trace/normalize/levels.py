"""The across-stack level of each event (from its category, through the source format's
vocabulary, then from a few names), where events run (device and stream), and the bytes of
collectives."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.trace.normalize.columns import LEVEL_CODE, codes, decode_json, ints, small_int

#: Step spans: torch.profiler's ``ProfilerStep#N``, xpuprof's own ``step#N``.
STEP_NAME = re.compile(r"^(?:ProfilerStep|step)#(\d+)$")
_COLLECTIVE_NAME = re.compile(r"^(nccl|rccl)", re.IGNORECASE)
_LAYER_NAME = re.compile(r"^nn\.Module: ")
_STREAM_NAME = re.compile(r"stream\s*(\d+)", re.IGNORECASE)
_INT32 = 2**31
_GPU_LABEL = re.compile(r"^(?:GPU|MTIA|XPU)\s*(\d+)$")

#: Element sizes of the dtype names torch writes in NCCL args.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "complexfloat": 8, "complexdouble": 16,
}  # fmt: skip


def levels(
    cat: pa.ChunkedArray, name: pa.ChunkedArray, host: np.ndarray, vocab: Mapping[str, str]
) -> np.ndarray:
    """Level code (index into ``LEVELS``) of each event: from its category through the
    format's vocabulary (``vocab``: lower-case category → level), then a few names."""
    level = codes(cat, lambda c: LEVEL_CODE[vocab.get(c.lower(), "other") if c else "other"])
    kind = codes(
        name,
        lambda v: 1 if STEP_NAME.match(v) else 2 if _COLLECTIVE_NAME.match(v)
        else 3 if _LAYER_NAME.match(v) else 0,
    )  # fmt: skip
    L = LEVEL_CODE
    steppable = (level == L["op"]) | (level == L["annotation"]) | (level == L["other"])
    level[(kind == 1) & host & steppable] = L["step"]
    level[(kind == 2) & ~host & (level == L["kernel"])] = L["collective"]
    level[(kind == 3) & (level == L["python"])] = L["layer"]
    return level


def gpu_pids(meta_rows: pa.Table) -> dict[int, int]:
    """pid → device index from ``process_labels`` metadata ("GPU 3")."""
    out: dict[int, int] = {}
    if not meta_rows.num_rows:
        return out
    rows = meta_rows.filter(pc.equal(meta_rows["name"], "process_labels")).to_pydict()
    for pid, args in zip(rows["pid"], rows["args"], strict=True):
        if pid is None or not args:
            continue
        labels = decode_json(args)
        text = labels.get("labels") if isinstance(labels, dict) else None
        if isinstance(text, str):
            m = _GPU_LABEL.match(text.strip())
            d = small_int(m.group(1), _INT32) if m else None
            if d is not None:
                out[pid] = d
    return out


def collective_bytes(args: list[str | None]) -> list[float | None]:
    """Bytes of a collective: the larger of its in/out element counts times the dtype size
    (the buffer nccl-tests sizes its bandwidth by)."""
    out: list[float | None] = []
    for a in args:
        if not a:
            out.append(None)
            continue
        d = decode_json(a)
        n_in = d.get("In msg nelems") if isinstance(d, dict) else None
        n_out = d.get("Out msg nelems") if isinstance(d, dict) else None
        dt = d.get("dtype") if isinstance(d, dict) else None
        size = DTYPE_BYTES.get(str(dt).lower()) if dt is not None else None
        counts = [v for v in (n_in, n_out) if isinstance(v, (int, float)) and v >= 0]
        try:
            b = float(max(counts) * size) if counts and size else None
        except OverflowError:  # element counts beyond float64: no size
            b = None
        out.append(b if b is not None and math.isfinite(b) else None)
    return out


def placement(
    ev: pa.Table,
    pid: np.ndarray,
    tid: np.ndarray,
    string_ids: dict[str, dict[str, str]],
    meta_raw: pa.Table,
    device_categories: frozenset[str],
) -> tuple[np.ndarray, np.ndarray]:
    """Device (-1: host) and stream (-1: none) of each event.

    Device: ``args.device``, else the pid, for the format's device categories; the ``GPU N``
    label of the process for anything else recorded on a device's pid. Stream: ``args.stream``,
    else the tid (or the N of a ``stream N`` tid name), on devices.
    """
    is_dev_cat = codes(ev["cat"], lambda c: c.lower() in device_categories, bool)
    dev_arg = ints(ev["device_arg"], -1)
    chosen = np.where(dev_arg >= 0, dev_arg, pid)
    # a device number beyond int32 (or a pid code below zero) names no device
    chosen = np.where((chosen >= 0) & (chosen < _INT32), chosen, -1)
    device = np.where(is_dev_cat, chosen, -1).astype(np.int32)
    del dev_arg, chosen
    labelled = gpu_pids(meta_raw)
    if labelled:
        for p, d in labelled.items():
            device[(pid == p) & ~is_dev_cat] = d
    is_dev = device >= 0
    del is_dev_cat
    stream = ints(ev["stream_arg"], -1).copy()
    no_arg = is_dev & (stream < 0)
    stream[no_arg] = tid[no_arg]
    named = string_ids.get("tid", {})
    neg = no_arg & (tid < 0) if named else None
    if neg is not None and neg.any():
        for code, text in named.items():
            m = _STREAM_NAME.search(text)
            k = small_int(m.group(1)) if m else None
            stream[neg & (tid == int(code))] = -1 if k is None else k
    stream[~is_dev] = -1
    return device, stream

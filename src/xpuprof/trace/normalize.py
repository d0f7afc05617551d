"""Turn an importer's raw columns into the normalized tables of ``xpuprof.core.schema``.

Everything here is vectorized over whole columns (numpy / Arrow): the only Python loops run over
things there are few of (threads, categories, unique names, B/E pairs, counters), never over
events, because per-event Python is what makes other tools load at tens of thousands of events
per second.

What is derived, and why it is derived here rather than in each analysis:

* ``level``: the across-stack level, from the category (both Kineto vocabularies, ROCm, MTIA)
  and, for a few names, from the name (``ProfilerStep#N`` → step, ``nccl*`` kernels →
  collective, ``nn.Module: …`` → layer);
* ``parent``/``depth``: nesting of events on their own track (pid, tid) — the one timeline fact
  every analysis needs and none should recompute;
* ``step``: the profiler step an event belongs to (host events by time, device events through
  the runtime call that launched them, by correlation id);
* flow binding: each flow entry is bound to the slice it belongs to on its track (Chrome-trace
  semantics: the enclosing slice; for an ``f`` without ``bp: "e"``, the next slice), and the
  entries sharing a (category, id) are joined into ``links`` (launch → kernel, forward →
  backward).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.names import LAUNCH_FLOW_KINDS
from xpuprof.core.schema import COUNTERS, EVENTS, FLOWS, ID_SHIFT, LEVELS, LINKS, METADATA
from xpuprof.costmodel.derive import derive as derive_flops
from xpuprof.formats.xplane import XPLANE_CATEGORY_LEVEL, XPLANE_DEVICE_CATEGORIES
from xpuprof.trace.nesting import bind_flows, depths, match_correlation, nest

_CATEGORY_LEVEL = {
    # current Kineto vocabulary
    "cpu_op": "op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "annotation",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "python_function": "python",
    "cuda_profiler_range": "kernel",
    # 2021 vocabulary (compared lower-case)
    "operator": "op",
    "runtime": "runtime",
    "memcpy": "memcpy",
    "memset": "memset",
    # xpuprof's own capture (capture/annotate.py, capture/torch.py, capture/telemetry.py)
    "xpuprof_annotation": "annotation",
    "xpuprof_step": "step",
    "xpuprof_layer": "layer",
    "xpuprof_telemetry": "other",
    # other accelerators
    "mtia_runtime": "runtime",
    "mtia_ccp_events": "kernel",
    "privateuse1_runtime": "runtime",
    "privateuse1_driver": "runtime",
    "xpu_runtime": "runtime",
    "xpu_driver": "runtime",
}
_CATEGORY_LEVEL.update(XPLANE_CATEGORY_LEVEL)  # XPlane (XProf, JAX, TF): formats/xplane.py

#: Categories recorded on a device timeline (pid = device, tid = stream).
DEVICE_CATEGORIES = frozenset(
    {
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "gpu_user_annotation",
        "cuda_sync",
        "cuda_profiler_range",
        "mtia_ccp_events",
        "memcpy",
        "memset",
    }
)
DEVICE_CATEGORIES = DEVICE_CATEGORIES | XPLANE_DEVICE_CATEGORIES


#: Step spans: torch.profiler's ``ProfilerStep#N``, xpuprof's own ``step#N``.
_STEP_NAME = re.compile(r"^(?:ProfilerStep|step)#(\d+)$")
_COLLECTIVE_NAME = re.compile(r"^(nccl|rccl)", re.IGNORECASE)
_LAYER_NAME = re.compile(r"^nn\.Module: ")
_STREAM_NAME = re.compile(r"stream\s*(\d+)", re.IGNORECASE)
_GPU_LABEL = re.compile(r"^(?:GPU|MTIA|XPU)\s*(\d+)$")

#: Element sizes of the dtype names torch writes in NCCL args.
DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "complexfloat": 8, "complexdouble": 16,
}  # fmt: skip

SPAN_PHASES = ("X", "B", "E", "i", "I", "n", "b", "e")
FLOW_PHASES = ("s", "t", "f")


@dataclass
class _Timeline:
    """What flow binding needs of the events, as numpy arrays (kept from the events build
    rather than read back out of the Arrow table, which would copy each column again)."""

    order: np.ndarray
    parent_pos: np.ndarray
    end: np.ndarray
    is_slice: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    ts: np.ndarray
    ids: np.ndarray
    corr: np.ndarray


def _int_or_null(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Flow ids as integers where they spell one (Kineto's do), null elsewhere."""
    try:
        return pc.cast(col, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        vals = []
        for v in col.to_pylist():
            try:
                vals.append(int(v) if v is not None else None)
            except ValueError:
                vals.append(None)
        return pa.array(vals, pa.int64())


@dataclass
class Tables:
    """The normalized tables of one source file, plus counts for the manifest."""

    events: pa.Table
    flows: pa.Table
    links: pa.Table
    counters: pa.Table
    metadata: pa.Table


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def _np(col: pa.ChunkedArray | pa.Array, fill: int = 0) -> np.ndarray:
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def _isnull(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.is_null(col).to_numpy(zero_copy_only=False), dtype=bool)


def _const_dict(value: str | None, n: int) -> pa.Array:
    """A dictionary column holding one value (or null) n times, without n Python strings."""
    t = pa.dictionary(pa.int32(), pa.string())
    if value is None:
        return pa.nulls(n, t)
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value]))


def _as_dict(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(arr.type):
        return arr.cast(pa.dictionary(pa.int32(), pa.string()))
    return pc.dictionary_encode(arr.cast(pa.string())).cast(pa.dictionary(pa.int32(), pa.string()))


# ----------------------------------------------------------------------------------------------
# the build
# ----------------------------------------------------------------------------------------------


def _match_begin_end(ev: pa.Table) -> pa.Table:
    """Pair ``B``/``E`` entries per thread into one row with phase ``B`` and a duration.

    The ``E`` entry's own index, category, name, args and extra keys move into the row's
    ``extra`` under ``"end"`` (args and extra as their original text), so nothing is lost;
    unmatched ``B`` keep a null ``dur``, unmatched ``E`` stay rows of their own.
    """
    be = pc.is_in(ev.column("ph"), pa.array(["B", "E"]))
    if not pc.any(be).as_py():
        return ev
    cols = ["index", "ph", "cat", "name", "pid", "tid", "ts", "args", "extra"]
    d = ev.filter(be).select(cols).to_pydict()
    order = sorted(range(len(d["index"])), key=lambda i: (d["ts"][i], d["index"][i]))
    stacks: dict[tuple[Any, Any], list[int]] = {}
    b_index, b_dur, b_extra, e_index = [], [], [], []
    for i in order:
        key = (d["pid"][i], d["tid"][i])
        if d["ph"][i] == "B":
            stacks.setdefault(key, []).append(i)
        elif stacks.get(key):
            b = stacks[key].pop()
            end: dict[str, Any] = {"index": d["index"][i]}
            for k in ("cat", "name"):
                if d[k][i] is not None:
                    end[k] = d[k][i]
            for k in ("args", "extra"):
                if d[k][i] is not None:
                    end[k] = msgspec.Raw(d[k][i].encode())
            merged = (
                msgspec.json.decode(d["extra"][b], type=dict[str, msgspec.Raw])
                if d["extra"][b]
                else {}
            )
            merged["end"] = end
            b_index.append(d["index"][b])
            b_dur.append(d["ts"][i] - d["ts"][b])
            b_extra.append(msgspec.json.encode(merged).decode())
            e_index.append(d["index"][i])
    if not b_index:
        return ev
    index = _np(ev["index"])  # rows are in source order, so index is sorted
    pos = np.searchsorted(index, np.array(b_index))
    dur = _np(ev["dur"]).copy()
    has_dur = ~_isnull(ev["dur"])
    dur[pos] = b_dur
    has_dur[pos] = True
    extra = ev["extra"].to_pylist() if ev["extra"].null_count < len(ev) else [None] * len(ev)
    for p_, x in zip(pos.tolist(), b_extra, strict=True):
        extra[p_] = x
    ev = ev.set_column(ev.schema.get_field_index("dur"), "dur", pa.array(dur, mask=~has_dur))
    ev = ev.set_column(
        ev.schema.get_field_index("extra"), "extra", pa.array(extra, pa.large_string())
    )
    keep = np.ones(len(index), dtype=bool)
    keep[np.searchsorted(index, np.array(e_index))] = False
    return ev.filter(pa.array(keep))


def _fold_leftovers(t: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """Keep fields a table has no column for (an async event's ``id``, a flow's ``dur``…) in
    ``extra``, as the source spelled them, so that every key of every entry survives."""
    present = [c for c in columns if t[c].null_count < len(t)]
    if not present:
        return t
    mask = np.zeros(len(t), dtype=bool)
    for c in present:
        mask |= ~_isnull(t[c])
    rows = np.flatnonzero(mask)
    vals = {c: t[c].take(pa.array(rows)).to_pylist() for c in present}
    extra = t["extra"].to_pylist()
    for k, r in enumerate(rows.tolist()):
        obj = msgspec.json.decode(extra[r], type=dict[str, msgspec.Raw]) if extra[r] else {}
        for c in present:
            v = vals[c][k]
            if v is None:
                continue
            key = _RAW_KEY[c]
            if c == "dur":
                obj[key] = msgspec.Raw(_ns_to_us_text(v).encode())
            elif c == "flow_id" and v.lstrip("-").isdigit():
                obj[key] = msgspec.Raw(v.encode())
            else:
                obj[key] = v
        extra[r] = msgspec.json.encode(obj).decode()
    return t.set_column(
        t.schema.get_field_index("extra"), "extra", pa.array(extra, pa.large_string())
    )


#: Raw column → the Chrome-trace key it came from.
_RAW_KEY = {"flow_id": "id", "bp": "bp", "scope": "s", "dur": "dur"}


def _ns_to_us_text(ns: int) -> str:
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    whole, frac = divmod(ns, 1000)
    return f"{sign}{whole}" if not frac else f"{sign}{whole}.{frac:03d}"


_LEVEL_CODE = {lv: i for i, lv in enumerate(LEVELS)}
_LEVEL_DICT = pa.array(list(LEVELS), pa.string())


def _codes(col: pa.ChunkedArray | pa.Array, fn: Any, dtype: Any = np.int8) -> np.ndarray:
    """``fn`` of each value of a dictionary/string column as a numpy array, computing ``fn``
    once per distinct value (null is read as "")."""
    enc = _as_dict(col)
    lut = np.array([fn(v) for v in enc.dictionary.to_pylist()] + [fn("")], dtype=dtype)
    idx = enc.indices.to_numpy(zero_copy_only=False)
    if enc.indices.null_count:
        idx = np.where(np.asarray(enc.indices.is_valid()), idx, len(lut) - 1)
    return lut[idx.astype(np.int64, copy=False)]


def _levels(cat: pa.ChunkedArray, name: pa.ChunkedArray, host: np.ndarray) -> np.ndarray:
    """Level code (index into ``LEVELS``) of each event: from its category, then a few names."""
    level = _codes(
        cat, lambda c: _LEVEL_CODE[_CATEGORY_LEVEL.get(c.lower(), "other") if c else "other"]
    )
    kind = _codes(
        name,
        lambda v: 1 if _STEP_NAME.match(v) else 2 if _COLLECTIVE_NAME.match(v)
        else 3 if _LAYER_NAME.match(v) else 0,
    )  # fmt: skip
    L = _LEVEL_CODE
    steppable = (level == L["op"]) | (level == L["annotation"]) | (level == L["other"])
    level[(kind == 1) & host & steppable] = L["step"]
    level[(kind == 2) & ~host & (level == L["kernel"])] = L["collective"]
    level[(kind == 3) & (level == L["python"])] = L["layer"]
    return level


def _gpu_pids(meta_rows: pa.Table) -> dict[int, int]:
    """pid → device index from ``process_labels`` metadata ("GPU 3")."""
    out: dict[int, int] = {}
    if not meta_rows.num_rows:
        return out
    rows = meta_rows.filter(pc.equal(meta_rows["name"], "process_labels")).to_pydict()
    for pid, args in zip(rows["pid"], rows["args"], strict=True):
        if pid is None or not args:
            continue
        labels = msgspec.json.decode(args)
        text = labels.get("labels") if isinstance(labels, dict) else None
        if isinstance(text, str):
            m = _GPU_LABEL.match(text.strip())
            if m:
                out[pid] = int(m.group(1))
    return out


def _collective_bytes(args: list[str | None]) -> list[float | None]:
    """Bytes of a collective: the larger of its in/out element counts times the dtype size
    (the buffer nccl-tests sizes its bandwidth by)."""
    out: list[float | None] = []
    for a in args:
        if not a:
            out.append(None)
            continue
        d = msgspec.json.decode(a)
        n_in = d.get("In msg nelems") if isinstance(d, dict) else None
        n_out = d.get("Out msg nelems") if isinstance(d, dict) else None
        dt = d.get("dtype") if isinstance(d, dict) else None
        size = DTYPE_BYTES.get(str(dt).lower()) if dt is not None else None
        counts = [v for v in (n_in, n_out) if isinstance(v, (int, float))]
        out.append(float(max(counts) * size) if counts and size else None)
    return out


def build_tables(
    raw: dict[str, pa.Table],
    *,
    part: int,
    rank: int | None,
    host: str | None,
    string_ids: dict[str, dict[str, str]],
) -> Tables:
    """Normalize one source file's raw columns, already split by kind of entry
    (``raw.KINDS``; columns as in ``raw.RAW_SCHEMA``)."""
    meta_raw = _fold_leftovers(raw.pop("metadata"), ("flow_id", "bp", "scope", "dur"))
    metadata = _metadata_table(meta_raw, part, rank)
    ev_raw = _fold_leftovers(_match_begin_end(raw.pop("events")), ("flow_id", "bp"))
    events, timeline = _events_table(ev_raw, part, rank, host, string_ids, meta_raw)
    del ev_raw
    fl_raw = _fold_leftovers(raw.pop("flows"), ("scope", "dur"))
    flows, links = _flow_tables(fl_raw, timeline, part, rank)
    del timeline
    counters = _counters_table(
        _fold_leftovers(raw.pop("counters"), ("flow_id", "bp", "scope", "dur")), part, rank
    )
    return Tables(events, flows, links, counters, metadata)


def _rank_col(n: int, rank: int | None) -> pa.Array:
    return pa.nulls(n, pa.int32()) if rank is None else pa.array(np.full(n, rank, np.int32))


def _events_table(
    ev: pa.Table,
    part: int,
    rank: int | None,
    host: str | None,
    string_ids: dict[str, dict[str, str]],
    meta_raw: pa.Table,
) -> tuple[pa.Table, _Timeline]:
    n = ev.num_rows
    pid = _np(ev["pid"], -1)
    tid = _np(ev["tid"], -1)
    ts = _np(ev["ts"])
    dur_null = _isnull(ev["dur"])

    # device: args.device, else the pid, for device categories; the "GPU N" label of the
    # process for anything else recorded on a device's pid
    is_dev_cat = _codes(ev["cat"], lambda c: c.lower() in DEVICE_CATEGORIES, bool)
    device = np.full(n, -1, dtype=np.int32)
    dev_arg = _np(ev["device_arg"], -1)
    device[is_dev_cat] = np.where(dev_arg[is_dev_cat] >= 0, dev_arg[is_dev_cat], pid[is_dev_cat])
    del dev_arg
    gpu_pids = _gpu_pids(meta_raw)
    if gpu_pids:
        for p, d in gpu_pids.items():
            device[(pid == p) & ~is_dev_cat] = d
    is_dev = device >= 0
    del is_dev_cat

    # stream: args.stream, else the tid (or the N of a "stream N" tid name), on devices
    stream = _np(ev["stream_arg"], -1).copy()
    no_arg = is_dev & (stream < 0)
    stream[no_arg] = tid[no_arg]
    named = string_ids.get("tid", {})
    neg = no_arg & (tid < 0) if named else None
    if neg is not None and neg.any():
        for code, text in named.items():
            m = _STREAM_NAME.search(text)
            stream[neg & (tid == int(code))] = int(m.group(1)) if m else -1
    stream[~is_dev] = -1
    del no_arg

    level = _levels(ev["cat"], ev["name"], ~is_dev)

    # nesting on each track (pid, tid); global and process-scoped instants get tracks of
    # their own, since they belong to no thread
    phase = ev["ph"]
    instant = _codes(phase, lambda v: v in ("i", "I", "n", "b", "e", "E"), bool) | dur_null
    global_inst = instant & _codes(ev["scope"], lambda v: v in ("g", "p"), bool)
    dur = _np(ev["dur"])
    span_dur = np.where(instant, 0, dur)
    nest_tid = np.where(global_inst, np.iinfo(np.int64).min, tid) if global_inst.any() else tid
    order, parent_pos, end, is_slice = nest(pid, nest_tid, ts, span_dur, ~instant)
    del nest_tid, global_inst, instant
    index = _np(ev["index"])
    ids = (np.int64(part) << ID_SHIFT) | index
    parent_id = np.full(n, -1, dtype=np.int64)
    has_parent = parent_pos >= 0
    parent_id[order[has_parent]] = ids[order[parent_pos[has_parent]]]
    del has_parent
    depth = np.empty(n, dtype=np.int16)
    depth[order] = depths(parent_pos)

    step = _steps(ev, level, pid, ts, span_dur, is_dev)
    del span_dur

    # bytes moved: memcpy/memset args.bytes; collectives: elements x dtype size
    L = _LEVEL_CODE
    bytes_col = np.full(n, np.nan)
    mem = (level == L["memcpy"]) | (level == L["memset"])
    if mem.any():
        b_np = ev["bytes_arg"].to_numpy()
        bytes_col[mem] = b_np[mem]
    coll = np.flatnonzero(level == L["collective"])
    if coll.size:
        vals = _collective_bytes(ev["args"].take(pa.array(coll)).to_pylist())
        bytes_col[coll] = [np.nan if v is None else v for v in vals]
    # FLOPs and bytes of framework ops from their recorded shapes (trace/flops.py). Inclusive,
    # like dur: a total sums the outermost ops that have a value (flops.outermost).
    flops_col = np.full(n, np.nan)
    is_op = level == L["op"]
    if is_op.any():
        flops_col, op_bytes = derive_flops(ev["name"], ev["args"], where=is_op)
        bytes_col = np.where(is_op, op_bytes, bytes_col)

    table = pa.Table.from_arrays(
        [
            pa.array(ids, pa.int64()),
            pa.array(np.full(n, part, np.int32)),
            pa.array(index, pa.int64()),
            _rank_col(n, rank),
            _const_dict(host, n),
            _as_dict(phase),
            _as_dict(ev["scope"]),
            pa.array(pid, pa.int64(), mask=_isnull(ev["pid"])),
            pa.array(tid, pa.int64(), mask=_isnull(ev["tid"])),
            pa.array(device),
            pa.array(stream, pa.int64(), mask=stream < 0),
            pa.DictionaryArray.from_arrays(pa.array(level.astype(np.int32)), _LEVEL_DICT),
            _as_dict(ev["cat"]),
            _as_dict(ev["name"]),
            pa.array(ts, pa.int64()),
            pa.array(dur, pa.int64(), mask=dur_null),
            pa.array(parent_id, pa.int64(), mask=parent_id < 0),
            pa.array(depth, pa.int16()),
            ev["correlation"],
            ev["external_id"],
            step,
            pa.array(flops_col, pa.float64(), mask=np.isnan(flops_col)),
            pa.array(bytes_col, pa.float64(), mask=np.isnan(bytes_col)),
            ev["args"],  # chunked as read: no copy of the largest column
            ev["extra"],
        ],
        schema=EVENTS,
    )
    corr = _np(ev["correlation"], -1)
    return table, _Timeline(order, parent_pos, end, is_slice, pid, tid, ts, ids, corr)


def _steps(
    ev: pa.Table,
    level: np.ndarray,
    pid: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    is_dev: np.ndarray,
) -> pa.Array:
    n = len(ts)
    is_step = level == _LEVEL_CODE["step"]
    if not is_step.any():
        return pa.nulls(n, pa.int64())
    step_no = _codes(
        ev["name"],
        lambda v: int(m.group(1)) if (m := _STEP_NAME.match(v)) else -1,
        np.int64,
    )
    step = np.full(n, -1, dtype=np.int64)
    rows = np.flatnonzero(is_step)
    if not rows.size:
        return pa.nulls(n, pa.int64())
    # XPlane steps carry their number in a step_num stat (JAX's StepTraceAnnotation, TF's step
    # TraceMes) or, on a TPU "Steps" line, as their name
    unnumbered = rows[step_no[rows] < 0]
    if unnumbered.size:
        take = pa.array(unnumbered)
        for r, name, args in zip(
            unnumbered.tolist(),
            ev["name"].take(take).to_pylist(),
            ev["args"].take(take).to_pylist(),
            strict=True,
        ):
            d = msgspec.json.decode(args) if args else None
            v = d.get("step_num") if isinstance(d, dict) else None
            if isinstance(v, int) and not isinstance(v, bool):
                step_no[r] = v
            elif name and name.isdigit():
                step_no[r] = int(name)
    step[rows] = step_no[rows]
    s_ts, s_end, s_no = ts[rows], ts[rows] + dur[rows], step_no[rows]
    # host events: the step span of the same process that contains their start
    host = ~is_dev & ~is_step
    for p in np.unique(pid[rows]):
        sel = pid[rows] == p
        o = np.argsort(s_ts[sel])
        st, en, no = s_ts[sel][o], s_end[sel][o], s_no[sel][o]
        cand = np.flatnonzero(host & (pid == p))
        k = np.searchsorted(st, ts[cand], side="right") - 1
        ok = (k >= 0) & (ts[cand] < en[np.maximum(k, 0)])
        step[cand[ok]] = no[k[ok]]
    # device events: the step of the host call that launched them (same correlation id)
    corr = ev["correlation"]
    c = _np(corr, -1)
    has_c = np.asarray(pc.is_valid(corr).to_numpy(zero_copy_only=False), dtype=bool)
    src = ~is_dev & has_c & (step >= 0)
    dev = np.flatnonzero(is_dev & has_c)
    if dev.size and src.any():
        keys, first = np.unique(c[src], return_index=True)
        vals = step[src][first]
        k = np.searchsorted(keys, c[dev])
        k = np.minimum(k, len(keys) - 1)
        hit = keys[k] == c[dev]
        step[dev[hit]] = vals[k[hit]]
    # device events with no launch found: by time against all steps
    rest = np.flatnonzero(is_dev & (step < 0))
    if rest.size:
        o = np.argsort(s_ts)
        st, en, no = s_ts[o], s_end[o], s_no[o]
        k = np.searchsorted(st, ts[rest], side="right") - 1
        ok = (k >= 0) & (ts[rest] < en[np.maximum(k, 0)])
        step[rest[ok]] = no[k[ok]]
    return pa.array(step, pa.int64(), mask=step < 0)


def _flow_tables(
    fl: pa.Table, tl: _Timeline, part: int, rank: int | None
) -> tuple[pa.Table, pa.Table]:
    n = fl.num_rows
    order, parent_pos, end, is_slice = tl.order, tl.parent_pos, tl.end, tl.is_slice
    ev_pid, ev_tid, ev_ts = tl.pid, tl.tid, tl.ts
    rank_ph = _codes(fl["ph"], lambda v: {"s": 0, "t": 1}.get(v, 2))
    fl_next = (rank_ph == 2) & _codes(fl["bp"], lambda v: v != "e", bool)
    f_ts = _np(fl["ts"])
    f_pid, f_tid = _np(fl["pid"], -1), _np(fl["tid"], -1)
    row = bind_flows(order, parent_pos, end, is_slice, ev_pid, ev_tid, ev_ts,
                     f_pid, f_tid, f_ts, fl_next)  # fmt: skip
    # Launch flows carry the correlation id as their id: where an event on the flow's own
    # track has that correlation, it is the one meant, even when a zero-length call starts
    # in the same microsecond and time alone cannot tell them apart.
    launch = _codes(fl["cat"], lambda c: c.lower() in LAUNCH_FLOW_KINDS, bool)
    if launch.any():
        rows = np.flatnonzero(launch)
        fid = _int_or_null(fl["flow_id"].take(pa.array(rows)))
        ok = ~_isnull(fid)
        rows, fid = rows[ok], _np(fid)[ok]
        ev_corr = tl.corr
        bound_corr = np.where(row[rows] >= 0, ev_corr[np.maximum(row[rows], 0)], -1)
        wrong = bound_corr != fid
        rows, fid = rows[wrong], fid[wrong]
        hit = match_correlation(
            ev_corr, ev_pid, ev_tid, ev_ts, fid, f_pid[rows], f_tid[rows], f_ts[rows]
        )
        found = hit >= 0
        row[rows[found]] = hit[found]
    bound = np.where(row >= 0, tl.ids[np.maximum(row, 0)], -1)
    flows = pa.Table.from_arrays(
        [
            pa.array(np.full(n, part, np.int32)),
            fl["index"],
            _rank_col(n, rank),
            _as_dict(fl["ph"]),
            _as_dict(fl["cat"]),
            _as_dict(fl["name"]),
            fl["flow_id"],
            fl["pid"],
            fl["tid"],
            fl["ts"],
            fl["bp"].cast(pa.dictionary(pa.int32(), pa.string())).cast(pa.string()),
            pa.array(bound, pa.int64(), mask=bound < 0),
            fl["args"],
            fl["extra"],
        ],
        schema=FLOWS,
    )
    # links: within each (category, id), every t or f links from the s/t before it
    if n == 0:
        return flows, LINKS.empty_table()
    cat_codes = _np(pc.dictionary_encode(pc.fill_null(fl["cat"], "")).combine_chunks().indices)
    id_codes = _np(pc.dictionary_encode(pc.fill_null(fl["flow_id"], "")).combine_chunks().indices)
    idx = _np(fl["index"])
    o = np.lexsort((idx, f_ts, rank_ph, id_codes, cat_codes))
    same_prev = np.r_[
        False, (cat_codes[o][1:] == cat_codes[o][:-1]) & (id_codes[o][1:] == id_codes[o][:-1])
    ]
    is_src = rank_ph[o] < 2
    # position of the latest s/t at or before each position within the group
    last_src = np.where(is_src, np.arange(n), -1)
    group_start = np.where(~same_prev, np.arange(n), 0)
    group_start = np.maximum.accumulate(group_start)
    last_src = np.maximum.accumulate(last_src)
    prev_src = np.r_[-1, last_src[:-1]]
    has_src = (prev_src >= group_start) & same_prev & (rank_ph[o] > 0)
    dst_pos = np.flatnonzero(has_src)
    src_pos = prev_src[dst_pos]
    src_rows = o[src_pos]
    dst_rows = o[dst_pos]
    kinds = fl["cat"].combine_chunks().take(pa.array(dst_rows))
    links = pa.Table.from_arrays(
        [
            pa.array(np.full(len(dst_rows), part, np.int32)),
            _rank_col(len(dst_rows), rank),
            _as_dict(kinds),
            fl["flow_id"].combine_chunks().take(pa.array(dst_rows)),
            pa.array(bound[src_rows], pa.int64(), mask=bound[src_rows] < 0),
            pa.array(bound[dst_rows], pa.int64(), mask=bound[dst_rows] < 0),
            pa.array(idx[src_rows], pa.int64()),
            pa.array(idx[dst_rows], pa.int64()),
        ],
        schema=LINKS,
    )
    return flows, links


def _counters_table(c: pa.Table, part: int, rank: int | None) -> pa.Table:
    """One row per (counter entry, series): a ``C`` entry's args hold one value per series."""
    if c.num_rows == 0:
        return COUNTERS.empty_table()
    d = c.select(["index", "pid", "tid", "cat", "name", "ts", "args", "extra"]).to_pydict()
    rows: dict[str, list[Any]] = {k: [] for k in COUNTERS.names}
    for i in range(c.num_rows):
        args = msgspec.json.decode(d["args"][i]) if d["args"][i] else {}
        series = list(args.items()) if isinstance(args, dict) and args else [(None, None)]
        for key, value in series:
            rows["part"].append(part)
            rows["index"].append(d["index"][i])
            rows["rank"].append(rank)
            rows["pid"].append(d["pid"][i])
            rows["tid"].append(d["tid"][i])
            rows["category"].append(d["cat"][i])
            rows["name"].append(d["name"][i])
            rows["series"].append(key)
            rows["ts"].append(d["ts"][i])
            is_num = isinstance(value, (int, float)) and not isinstance(value, bool)
            rows["value"].append(float(value) if is_num else None)
            rows["args"].append(d["args"][i])
            rows["extra"].append(d["extra"][i])
    return pa.Table.from_pydict(
        {k: pa.array(v, COUNTERS.field(k).type.value_type
                     if pa.types.is_dictionary(COUNTERS.field(k).type) else COUNTERS.field(k).type)
         for k, v in rows.items()}
    ).cast(COUNTERS)  # fmt: skip


def _metadata_table(m: pa.Table, part: int, rank: int | None) -> pa.Table:
    n = m.num_rows
    return pa.Table.from_arrays(
        [
            pa.array(np.full(n, part, np.int32)),
            m["index"],
            _rank_col(n, rank),
            _as_dict(m["cat"]),
            _as_dict(m["name"]),
            m["pid"],
            m["tid"],
            m["ts"],
            m["args"],
            m["extra"],
        ],
        schema=METADATA,
    )

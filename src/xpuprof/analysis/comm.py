"""Communication: one row per collective kernel, its bandwidth, its overlap with compute, and —
for stores with several ranks — how far apart the ranks arrive at the same collective.

**What each collective is** (first source that has it wins):

* type: the kernel's ``Collective name`` arg (PyTorch ≥ 2.2 copies ``record_param_comms``'
  args onto NCCL kernels); else the host side of its launch (runtime call by correlation id, then
  up its parent chain): ``record_param_comms``' ``Collective name``, else the ``nccl:<name>``
  annotation; else the kernel name (``ncclKernel_AllReduce_…``, ``ncclDevKernel_SendRecv``); for
  XLA collectives the HLO category (``all-reduce``, ``all-gather``, …). Names are normalised to
  ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ``reduce``,
  ``send_recv``, ``send``, ``recv``, ``gather``, ``scatter``, ``barrier`` (else ``unknown``).
  NCCL implements all-to-all with SendRecv kernels; the host side says which it was.
* bytes: ``events.bytes`` (the larger of ``In/Out msg nelems`` × dtype size, the buffer size
  nccl-tests calls *size*); else the same from ``record_param_comms`` on the host; else the
  largest tensor of the ``nccl:<name>`` annotation's ``Input Dims``/``Input type``; for XLA the
  element count × size of ``shape_with_layout`` (× group size for reduce-scatter, whose shape is
  the scattered output).
* group size and ranks: ``Group size``/``Process Group Ranks`` (kernel, else host), else the
  ``pg_config`` entry of ``distributedInfo`` for its ``Process Group Name``, else XLA's
  ``replica_groups``, else the world size (a note says it was assumed).
* algorithm and protocol: from the kernel name (``RING``/``TREE``/``COLLNET_*``/``NVLS*``/``PAT``
  and ``LL``/``LL128``/``SIMPLE``), in either naming (``ncclKernel_AllReduce_RING_LL_Sum_float``,
  ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``).

**Bandwidth** (nccl-tests, ``doc/PERFORMANCE.md``): ``algbw = bytes / duration``; ``busbw =
algbw × factor`` with factor ``2(n−1)/n`` for all-reduce, ``(n−1)/n`` for reduce-scatter,
all-gather and all-to-all, ``1`` for broadcast, reduce and point-to-point (n = group size).

**Overlap**: the part of each collective's [start, end) during which a computation kernel (HTA's
COMPUTATION type: a ``kernel``-level event, not a collective, copy or set) runs on the same
device; per rank, HTA's comm/compute overlap = time where both run ÷ total communication time.

**Cross-rank skew** (two or more participants — ranks, or the devices of one XPlane host):
the same collective is the n-th collective of the same process group on each participant
(NCCL requires every rank to issue a group's collectives in the same order); the process group
is ``Process Group Name`` (else its ranks, else XLA's replica groups, else one default group).
Its *skew* is latest start − earliest start; the participant that starts last is the straggler
the others wait for. Clocks: participants on one host (same ``host`` in the manifest) share
a clock and are compared as recorded (``align="none"``). Otherwise (``align="end"``, the default
when hosts differ or are unknown) each participant is shifted by the median, over the
whole-group collectives it shares with the reference participant (the lowest rank), of the
difference between its end and the reference's end: a collective completes on all ranks at
nearly the same moment, since none can finish before the last has arrived, so ends are the
common instant that starts are not. The ``clock`` table gives each offset and the method.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pandas as pd

from xpuprof.analysis.common import Result, merge_intervals, where_clause
from xpuprof.analysis.memory import ancestor, host_tree, level_mask

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: nccl-tests bus-bandwidth factors, as a function of the group size n.
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}

ALGORITHMS = ("COLLNET_DIRECT", "COLLNET_CHAIN", "COLLNET", "NVLS_TREE", "NVLS", "RING", "TREE",
              "PAT")  # fmt: skip
PROTOCOLS = ("LL128", "LL", "SIMPLE")

#: Element sizes of the ``dtype`` arg of record_param_comms / NCCL kernels (c10 ScalarType names).
COMM_DTYPE_SIZE = {
    "float": 4,
    "double": 8,
    "half": 2,
    "bfloat16": 2,
    "int": 4,
    "long": 8,
    "short": 2,
    "char": 1,
    "byte": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complexfloat": 8,
    "complexdouble": 16,
    "uint32": 4,
    "uint64": 8,
    "uint16": 2,
}

XLA_SIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "s64": 8, "u64": 8, "s32": 4, "u32": 4,
            "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1, "c64": 8, "c128": 16,
            "f8e4m3fn": 1, "f8e5m2": 1}  # fmt: skip

#: Collectives whose every member takes part (usable as clock references); not point-to-point.
WHOLE_GROUP = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
               "barrier")  # fmt: skip

COLUMNS = ["rank", "part", "participant", "device", "stream", "id", "ts", "dur", "collective",
           "type_source", "algorithm", "protocol", "dtype", "bytes", "bytes_source",
           "group_size", "group_ranks", "process_group", "seq", "algbw", "busbw_factor", "busbw",
           "overlap_ns", "overlap_pct", "name"]  # fmt: skip


def normalize_collective(name: Any) -> str | None:
    """``"allreduce"``, ``"_allgather_base"``, ``"all-reduce"``, ``"nccl:all_to_all"``,
    ``"AllReduce"`` … → the canonical type (None when it is not a collective name)."""
    if not isinstance(name, str) or not name:
        return None
    s = name.lower()
    s = s.split(":", 1)[1] if s.startswith(("nccl:", "gloo:", "rccl:")) else s
    s = re.sub(r"[^a-z]", "", s)
    for pat, canon in (
        ("reducescatter", "reduce_scatter"), ("allreduce", "all_reduce"),
        ("allgather", "all_gather"), ("alltoall", "all_to_all"),
        ("collectivepermute", "send_recv"), ("sendrecv", "send_recv"),
        ("broadcast", "broadcast"), ("barrier", "barrier"), ("scatter", "scatter"),
        ("gather", "gather"), ("reduce", "reduce"), ("send", "send"), ("recv", "recv"),
    ):  # fmt: skip
        if pat in s:
            return canon
    return None


def kernel_parts(name: Any) -> dict[str, str | None]:
    """Collective type, algorithm, protocol, reduction and data type from an NCCL kernel name."""
    out: dict[str, str | None] = {"collective": None, "algorithm": None, "protocol": None}
    if not isinstance(name, str):
        return out
    base = name.split("(", 1)[0]
    m = re.match(r"(?:nccl|rccl)(?:Dev)?Kernel_(.*)", base)
    if not m:
        return out
    rest = m.group(1)
    toks = rest.split("_")
    out["collective"] = normalize_collective(toks[0]) if toks else None
    joined = "_" + rest.upper() + "_"
    out["algorithm"] = next((a for a in ALGORITHMS if f"_{a}_" in joined), None)
    out["protocol"] = next((p for p in PROTOCOLS if f"_{p}_" in joined), None)
    return out


def _busbw_factor(kind: str | None, n: float) -> float:
    f = BUSBW_FACTOR.get(kind or "")
    if f is None or not n or n != n or n < 1:
        return float("nan")
    return float(f(n))


def _as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == v:
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _ranks_list(v: Any) -> list[int] | None:
    if isinstance(v, list):
        return [int(x) for x in v if _as_int(x) is not None]
    if isinstance(v, str) and v.strip().startswith("["):
        try:
            got = msgspec.json.decode(v)
        except msgspec.DecodeError:
            return None
        return _ranks_list(got)
    return None


def _comm_bytes(args: dict[str, Any]) -> float | None:
    """max(In, Out msg nelems) × dtype size, from record_param_comms-style args."""
    size = COMM_DTYPE_SIZE.get(str(args.get("dtype", "")).lower().replace("c10::", ""))
    ins = [_as_int(args.get("In msg nelems")), _as_int(args.get("Out msg nelems"))]
    ins = [x for x in ins if x is not None]
    if size is None or not ins:
        return None
    return float(max(ins) * size)


def _tensor_bytes(args: dict[str, Any]) -> float | None:
    """The largest tensor of an op's ``Input Dims``/``Input type``."""
    from xpuprof.costmodel.call import ITEMSIZE

    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    best = None
    for d, t in zip(dims, types, strict=False):
        z = ITEMSIZE.get(t) if isinstance(t, str) else None
        if z is None or not isinstance(d, list) or not all(isinstance(x, int) for x in d):
            continue
        v = float(np.prod(d, dtype=np.float64)) * z if d else float(z)
        best = v if best is None else max(best, v)
    return best


def _xla_shape_bytes(shape: Any) -> float | None:
    if not isinstance(shape, str):
        return None
    total = 0.0
    found = False
    for et, dims in re.findall(r"([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]", shape):
        z = XLA_SIZE.get(et)
        if z is None:
            continue
        n = 1.0
        for x in dims.split(","):
            if x:
                n *= int(x)
        total += n * z
        found = True
    return total if found else None


def _replica_group_size(long_name: Any) -> tuple[int | None, str | None]:
    """Group size and the group spec from an HLO instruction's ``replica_groups``."""
    if not isinstance(long_name, str):
        return None, None
    m = re.search(r"replica_groups=(\{\{[^=]*?\}\}|\[[0-9,]+\]<=\[[0-9,]+\](?:T\([0-9,]+\))?)",
                  long_name)  # fmt: skip
    if not m:
        return None, None
    spec = m.group(1)
    if spec.startswith("{{"):
        first = spec[2:].split("}", 1)[0]
        return len([x for x in first.split(",") if x.strip()]), spec
    shape = [int(x) for x in spec[1:].split("]", 1)[0].split(",") if x]
    return (shape[-1] if shape else None), spec


def _cover(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s, e = merge_intervals(starts, ends)
    prefix = np.concatenate([[0], np.cumsum(e - s)])
    return s, e, prefix


def _covered_upto(s: np.ndarray, e: np.ndarray, prefix: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of the union of [s, e) intervals that lies before time t (vectorized over t)."""
    if not len(s):
        return np.zeros(len(t), np.float64)
    j = np.searchsorted(s, t, side="right") - 1
    jj = np.maximum(j, 0)
    inside = np.clip(t - s[jj], 0, e[jj] - s[jj])
    return np.where(j >= 0, prefix[jj] + inside, 0).astype(np.float64)


def collectives(
    trace: Trace,
    *,
    ranks: list[int] | None = None,
    steps: list[int] | None = None,
    align: str = "auto",
) -> Result:
    """Collectives table, per-rank summary and overlap, and cross-rank skew (module docstring).

    Tables: ``collectives`` (one row per collective kernel), ``summary`` (per participant and
    type), ``overlap`` (per participant: HTA's comm/compute overlap), and for several
    participants ``skew`` (one row per matched collective), ``stragglers`` (per participant)
    and ``clock`` (the offsets applied). ``align``: ``"auto"``, ``"none"`` or ``"end"``.
    ``steps`` keeps the collectives and compute kernels of those profiler steps (a device
    event's step is its launch's): HTA drops the last step by default, so ``steps`` without the
    last one reproduces its window.
    """
    if align not in ("auto", "none", "end"):
        raise ValueError(f"align={align!r}: expected 'auto', 'none' or 'end'")
    res = Result()
    w = where_clause(ranks=ranks, steps=steps)
    df = trace.sql(
        f"""
        select id, part, rank, device, stream, name, category, ts, dur, bytes, correlation,
            json_extract_string(args, '$."Collective name"') as a_coll,
            json_extract(args, '$."In msg nelems"')::varchar as a_in,
            json_extract(args, '$."Out msg nelems"')::varchar as a_out,
            json_extract(args, '$."Group size"')::varchar as a_group,
            json_extract_string(args, '$."dtype"') as a_dtype,
            json_extract_string(args, '$."Process Group Name"') as a_pg,
            json_extract(args, '$."Process Group Ranks"')::varchar as a_ranks,
            json_extract_string(args, '$.hlo_category') as hlo,
            json_extract_string(args, '$.shape_with_layout') as shape,
            json_extract_string(args, '$.long_name') as long_name
        from events where {w} and level = 'collective' and dur is not null
        order by part, device, ts
        """
    )
    if df.empty:
        _empty(res)
        res.notes.append(
            "no collective kernels (NCCL/RCCL kernels, XLA collectives) in the trace: nothing "
            "to report for communication."
        )
        return res
    n = len(df)
    kinds = np.full(n, None, dtype=object)
    kind_src = np.full(n, None, dtype=object)
    nbytes = df["bytes"].to_numpy(float).copy()
    bytes_src = np.where(np.isnan(nbytes), None, "kernel args").astype(object)
    group = np.full(n, np.nan)
    granks = np.full(n, None, dtype=object)
    pg = np.full(n, None, dtype=object)
    dtype = df["a_dtype"].to_numpy(object).copy()

    cols = ["a_coll", "a_group", "a_pg", "a_ranks", "hlo", "a_in", "a_out", "a_dtype"]
    for i, r in enumerate(df[cols].itertuples(False)):
        k = normalize_collective(r.a_coll)
        if k:
            kinds[i], kind_src[i] = k, "kernel args"
        if np.isnan(nbytes[i]) and (r.a_in or r.a_out):
            b = _comm_bytes({"In msg nelems": _decode(r.a_in), "Out msg nelems": _decode(r.a_out),
                             "dtype": r.a_dtype})  # fmt: skip
            if b is not None:
                nbytes[i], bytes_src[i] = b, "kernel args"
        g = _as_int(_decode(r.a_group))
        if g:
            group[i] = g
        rl = _ranks_list(_decode(r.a_ranks))
        if rl:
            granks[i] = rl
            if np.isnan(group[i]):
                group[i] = len(rl)
        if isinstance(r.a_pg, str) and r.a_pg:
            pg[i] = f"pg {r.a_pg}"
        elif rl:
            pg[i] = f"ranks {rl}"
        if not kinds[i] and r.hlo:
            k = normalize_collective(r.hlo)
            if k:
                kinds[i], kind_src[i] = k, "HLO category"

    # host side of the launch, for what the kernel does not say
    need = np.flatnonzero(
        (kinds == None) | np.isnan(nbytes) | np.isnan(group)  # noqa: E711
    )
    need = need[df["correlation"].notna().to_numpy()[need]]
    _from_host(trace, df, need, kinds, kind_src, nbytes, bytes_src, group, granks, pg, dtype)

    # XLA collectives: bytes from the shape, group from replica_groups
    for i in np.flatnonzero(df["shape"].notna().to_numpy()):
        gsz, spec = _replica_group_size(df["long_name"].iat[i])
        if gsz and np.isnan(group[i]):
            group[i] = gsz
        if spec and pg[i] is None:
            pg[i] = f"replica_groups {spec}"
        if np.isnan(nbytes[i]):
            b = _xla_shape_bytes(df["shape"].iat[i])
            if b is not None:
                if kinds[i] == "reduce_scatter" and not np.isnan(group[i]):
                    b *= group[i]
                nbytes[i], bytes_src[i] = b, "XLA shape"

    names = df["name"].to_numpy(object)
    parsed = [kernel_parts(x) for x in names]
    algo = np.array([p["algorithm"] for p in parsed], dtype=object)
    proto = np.array([p["protocol"] for p in parsed], dtype=object)
    for i, p in enumerate(parsed):
        if kinds[i] is None and p["collective"]:
            kinds[i], kind_src[i] = p["collective"], "kernel name"
    kinds = np.where(kinds == None, "unknown", kinds)  # noqa: E711

    # group size from distributedInfo, else the world size
    assumed = 0
    di = trace.meta.get("distributed_info", {})
    for i in np.flatnonzero(np.isnan(group)):
        info = di.get(int(df["part"].iat[i])) or {}
        pgn = (pg[i] or "").removeprefix("pg ")
        for cfg in info.get("pg_config", []) or []:
            if str(cfg.get("pg_name")) == pgn and pgn:
                group[i] = cfg.get("pg_size") or len(cfg.get("ranks") or []) or np.nan
                if granks[i] is None and cfg.get("ranks"):
                    granks[i] = list(cfg["ranks"])
        if np.isnan(group[i]) and _as_int(info.get("world_size")):
            group[i] = _as_int(info.get("world_size"))
            assumed += 1
    pg = np.where(pg == None, "default", pg)  # noqa: E711

    dur = df["dur"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(dur > 0, nbytes / (dur * 1e-9), np.nan)
    factor = np.array([_busbw_factor(k, g) for k, g in zip(kinds, group, strict=True)])

    # participants: ranks, or devices when one source holds several devices' collectives
    part = df["part"].to_numpy()
    dev = df["device"].to_numpy()
    rank = df["rank"]
    # a rank recorded by several sources (a store holding two jobs, or two captures of one
    # rank) is not one participant: label by source then, and compute no cross-rank skew
    shared_rank = bool((df.dropna(subset=["rank"]).groupby("rank")["part"].nunique() > 1).any())
    multi_dev = df.groupby("part")["device"].nunique().max() > 1
    rank_str = rank.astype("string").fillna("").to_numpy(object)
    part_str = df["part"].astype(str).to_numpy(object)
    lbl = np.where(
        rank.isna().to_numpy(),
        "part " + part_str,
        (rank_str + " (part " + part_str + ")") if shared_rank else rank_str,
    )
    participant = (lbl + " dev " + dev.astype(str).astype(object)) if multi_dev else lbl
    participant = participant.astype(object)

    out = pd.DataFrame(
        {
            "rank": rank.astype("Int64"),
            "part": part,
            "participant": participant,
            "device": dev,
            "stream": df["stream"],
            "id": df["id"],
            "ts": df["ts"],
            "dur": df["dur"],
            "collective": kinds,
            "type_source": kind_src,
            "algorithm": algo,
            "protocol": proto,
            "dtype": dtype,
            "bytes": nbytes,
            "bytes_source": bytes_src,
            "group_size": pd.array(np.where(np.isnan(group), None, group), dtype="Int64"),
            "group_ranks": granks,
            "process_group": pg,
            "algbw": algbw,
            "busbw_factor": factor,
            "busbw": algbw * factor,
            "name": names,
        }
    )
    out["seq"] = out.groupby(["participant", "process_group"]).cumcount()
    _overlap(trace, out, res, w)
    res.tables["collectives"] = out[COLUMNS]
    res.tables["summary"] = _summary(out)
    if assumed:
        res.notes.append(
            f"{assumed} collectives carry no group size or process group: their group is assumed "
            "to be the whole world (distributedInfo.world_size)."
        )
    if np.isnan(nbytes).any():
        res.notes.append(
            f"{int(np.isnan(nbytes).sum())} collectives have no known size (no msg nelems on the "
            "kernel or its host op, no shapes): no algbw/busbw for them."
        )
    if (kinds == "unknown").any():
        res.notes.append(
            f"{int((kinds == 'unknown').sum())} collectives are of unknown type (e.g. "
            "ncclDevKernel_Generic without host args): no busbw factor."
        )
    if shared_rank:
        res.notes.append(
            "several sources record the same rank (the store holds more than one job, or "
            "several captures of a rank): participants are labelled by source and no cross-rank "
            "skew is computed; import one job per store to compare its ranks."
        )
    else:
        _skew(trace, out, res, align)
    return res


def _decode(v: Any) -> Any:
    if v is None or (isinstance(v, float) and v != v):
        return None
    if isinstance(v, str):
        try:
            return msgspec.json.decode(v)
        except msgspec.DecodeError:
            return v
    return v


def _from_host(
    trace: Trace,
    df: pd.DataFrame,
    need: np.ndarray,
    kinds: np.ndarray,
    kind_src: np.ndarray,
    nbytes: np.ndarray,
    bytes_src: np.ndarray,
    group: np.ndarray,
    granks: np.ndarray,
    pg: np.ndarray,
    dtype: np.ndarray,
) -> None:
    """Fill type, bytes, group and process group from the host op that launched each kernel."""
    if not len(need):
        return
    parts = sorted({int(p) for p in df["part"].to_numpy()[need]})
    tree = host_tree(trace, parts, columns=("correlation",))
    rt = np.flatnonzero(level_mask(tree, "runtime") & (tree["correlation"] >= 0))
    if not len(rt):
        return
    key = pd.DataFrame(
        {"part": tree["part"][rt], "correlation": tree["correlation"][rt], "row": rt}
    ).drop_duplicates(["part", "correlation"])
    want = pd.DataFrame(
        {
            "part": df["part"].to_numpy()[need],
            "correlation": df["correlation"].to_numpy()[need],
            "i": need,
        }
    ).merge(key, on=["part", "correlation"], how="inner")
    if want.empty:
        return
    start = want["row"].to_numpy(np.int64)
    names = tree["name_dict"]
    codes_nccl = np.array([isinstance(x, str) and x.lower().startswith(("nccl:", "gloo:",
                           "rccl:")) for x in names], dtype=bool)  # fmt: skip
    codes_rpc = np.array([x == "record_param_comms" for x in names], dtype=bool)
    nm = tree["name"]
    is_ann = np.where(nm >= 0, codes_nccl[np.maximum(nm, 0)], False)
    is_rpc = np.where(nm >= 0, codes_rpc[np.maximum(nm, 0)], False)
    ann = ancestor(tree["par"], start, is_ann, max_depth=16)
    rpc = ancestor(tree["par"], start, is_rpc, max_depth=16)
    ids = np.unique(np.concatenate([tree["id"][ann[ann >= 0]], tree["id"][rpc[rpc >= 0]]]))
    args = trace.args(ids.tolist()) if len(ids) else {}
    for i, a_row, r_row in zip(want["i"], ann, rpc, strict=True):
        ra = args.get(int(tree["id"][r_row])) if r_row >= 0 else None
        aa = args.get(int(tree["id"][a_row])) if a_row >= 0 else None
        ra = ra if isinstance(ra, dict) else {}
        aa = aa if isinstance(aa, dict) else {}
        if kinds[i] is None:
            k = normalize_collective(ra.get("Collective name"))
            src = "record_param_comms"
            if not k and a_row >= 0:
                k, src = normalize_collective(str(names[nm[a_row]])), "host annotation"
            if k:
                kinds[i], kind_src[i] = k, src
        if np.isnan(nbytes[i]):
            b, src = _comm_bytes(ra), "record_param_comms"
            if b is None:
                b, src = _tensor_bytes(aa), "host annotation shapes"
            if b is not None:
                nbytes[i], bytes_src[i] = b, src
        if np.isnan(group[i]):
            g = _as_int(ra.get("Group size"))
            rl = _ranks_list(ra.get("Process Group Ranks"))
            if g:
                group[i] = g
            elif rl:
                group[i] = len(rl)
            if rl and granks[i] is None:
                granks[i] = rl
        if pg[i] is None and ra.get("Process Group Name") is not None:
            pg[i] = f"pg {ra.get('Process Group Name')}"
        if dtype[i] is None and ra.get("dtype"):
            dtype[i] = ra.get("dtype")


def _overlap(trace: Trace, out: pd.DataFrame, res: Result, w: str) -> None:
    comp = trace.sql(
        f"""select part, device, ts, ts + dur as te from events
            where {w} and level = 'kernel' and dur is not null and device >= 0"""
    )
    ov = np.zeros(len(out), np.float64)
    rows = []
    for (p, d), idx in out.groupby(["part", "device"]).indices.items():
        c = comp[(comp["part"] == p) & (comp["device"] == d)]
        s, e, prefix = _cover(c["ts"].to_numpy(np.int64), c["te"].to_numpy(np.int64))
        ts = out["ts"].to_numpy(np.int64)[idx]
        te = ts + out["dur"].to_numpy(np.int64)[idx]
        ov[idx] = _covered_upto(s, e, prefix, te) - _covered_upto(s, e, prefix, ts)
        # HTA: overlap of the union of comm kernels with the union of compute kernels
        cs, ce = merge_intervals(ts, te)
        comm_len = float((ce - cs).sum())
        both = float((_covered_upto(s, e, prefix, ce) - _covered_upto(s, e, prefix, cs)).sum())
        rows.append(
            {
                "participant": out["participant"].iat[idx[0]],
                "rank": out["rank"].iat[idx[0]],
                "part": p,
                "device": d,
                "comm_time_ns": comm_len,
                "overlapped_ns": both,
                "overlap_pct": 100 * both / comm_len if comm_len else np.nan,
            }
        )
    out["overlap_ns"] = ov
    with np.errstate(divide="ignore", invalid="ignore"):
        out["overlap_pct"] = np.where(out["dur"] > 0, 100 * ov / out["dur"], np.nan)
    res.tables["overlap"] = pd.DataFrame(
        rows,
        columns=[
            "participant",
            "rank",
            "part",
            "device",
            "comm_time_ns",
            "overlapped_ns",
            "overlap_pct",
        ],
    )


def _summary(out: pd.DataFrame) -> pd.DataFrame:
    known = out["bytes"].notna()
    g = (
        out.assign(
            b=out["bytes"],
            bb=out["bytes"] * out["busbw_factor"],
            tb=out["dur"].where(known),  # time of the collectives whose size is known
        )
        .groupby(["participant", "collective"], dropna=False)
        .agg(
            rank=("rank", "first"),
            count=("id", "size"),
            bytes=("b", lambda x: x.sum(min_count=1)),
            time_ns=("dur", "sum"),
            sized_time_ns=("tb", "sum"),
            bus_bytes=("bb", lambda x: x.sum(min_count=1)),
            overlap_ns=("overlap_ns", "sum"),
            algorithms=("algorithm", lambda s: ",".join(sorted({str(x) for x in s if x}))),
            protocols=("protocol", lambda s: ",".join(sorted({str(x) for x in s if x}))),
        )
        .reset_index()
    )
    t = g["sized_time_ns"] * 1e-9
    with np.errstate(divide="ignore", invalid="ignore"):
        g["algbw"] = np.where(t > 0, g["bytes"] / t, np.nan)
        g["busbw"] = np.where(t > 0, g["bus_bytes"] / t, np.nan)
        g["overlap_pct"] = np.where(g["time_ns"] > 0, 100 * g["overlap_ns"] / g["time_ns"],
                                    np.nan)  # fmt: skip
    return g[["participant", "rank", "collective", "count", "bytes", "time_ns", "algbw", "busbw",
              "overlap_pct", "algorithms", "protocols"]]  # fmt: skip


def _hosts(trace: Trace) -> dict[int, Any]:
    return {int(s["part"]): s.get("host") for s in trace.meta["sources"]}


def _skew(trace: Trace, out: pd.DataFrame, res: Result, align: str) -> None:
    parts_ = out["participant"].unique().tolist()
    if len(parts_) < 2:
        res.notes.append("one participant (rank/device): no cross-rank skew to compute.")
        return
    # counts per participant and group
    counts = out.groupby(["process_group", "participant"]).size().unstack(fill_value=0)
    uneven = [g for g, row in counts.iterrows() if row[row > 0].nunique() > 1]
    if uneven:
        res.notes.append(
            "participants recorded different numbers of collectives in process group(s) "
            f"{', '.join(map(str, uneven))}: collectives are matched by order from the first, "
            "so a capture window that starts at a different collective shifts the match."
        )
    # order participants: by rank, then label
    order = (
        out.drop_duplicates("participant")
        .assign(_r=lambda d: d["rank"].astype("Float64").fillna(np.inf))
        .sort_values(["_r", "participant"])["participant"]
        .tolist()
    )
    ref = order[0]
    hosts = _hosts(trace)
    phost = out.drop_duplicates("participant").set_index("participant")["part"].map(hosts)
    same_host = phost.notna().all() and phost.nunique() == 1
    one_source = out["part"].nunique() == 1
    method = align
    if align == "auto":
        method = "none" if (same_host or one_source) else "end"
    end = out["ts"] + out["dur"]
    offsets = {p: 0 for p in order}
    used = {p: 0 for p in order}
    if method == "end":
        key = out.assign(end=end)
        whole = key[key["collective"].isin(WHOLE_GROUP)]
        base = whole if len(whole) else key
        piv = base.pivot_table(index=["process_group", "seq"], columns="participant",
                               values="end", aggfunc="first")  # fmt: skip
        for p in order[1:]:
            if p in piv and ref in piv:
                d = (piv[p] - piv[ref]).dropna()
                if len(d):
                    offsets[p] = int(np.median(d.to_numpy(np.float64)))
                    used[p] = len(d)
        missing = [p for p in order[1:] if not used[p]]
        if missing:
            res.notes.append(
                f"no collective shared with the reference {ref} for {', '.join(missing)}: their "
                "clocks are left unaligned."
            )
    res.tables["clock"] = pd.DataFrame(
        {
            "participant": order,
            "host": [phost.get(p) for p in order],
            "offset_ns": [offsets[p] for p in order],
            "method": [method] * len(order),
            "collectives_used": [used[p] for p in order],
            "reference": [ref] * len(order),
        }
    )
    if method == "none":
        res.notes.append(
            "ranks compared on their recorded clocks: "
            + (
                "all come from one host (one clock)."
                if (same_host or one_source)
                else "align='none' was asked for."
            )  # fmt: skip
        )
    else:
        res.notes.append(
            "hosts differ or are unknown, so clocks may differ: each rank is shifted so that the "
            f"ends of the whole-group collectives it shares with {ref} agree (median offset; "
            "see the clock table). Skew is measured on starts after that shift."
        )
    adj_ts = out["ts"] - out["participant"].map(offsets)
    adj_end = adj_ts + out["dur"]
    m = out.assign(ats=adj_ts, aend=adj_end)
    grp = m.groupby(["process_group", "seq"], sort=True)
    agg = grp.agg(
        collective=("collective", lambda s: s.mode().iat[0] if len(s) else None),
        types=("collective", "nunique"),
        participants=("participant", "nunique"),
        first_start=("ats", "min"),
        last_start=("ats", "max"),
        first_end=("aend", "min"),
        last_end=("aend", "max"),
        bytes=("bytes", "max"),
    )
    first_idx = grp["ats"].idxmin()
    last_idx = grp["ats"].idxmax()
    agg["first_participant"] = m.loc[first_idx.to_numpy(), "participant"].to_numpy()
    agg["last_participant"] = m.loc[last_idx.to_numpy(), "participant"].to_numpy()
    agg["skew_ns"] = agg["last_start"] - agg["first_start"]
    agg["end_skew_ns"] = agg["last_end"] - agg["first_end"]
    agg["types_agree"] = agg["types"] == 1
    agg = agg[agg["participants"] >= 2].reset_index()
    if (~agg["types_agree"]).any():
        res.notes.append(
            f"{int((~agg['types_agree']).sum())} matched collectives have different types on "
            "different participants: the order of collectives differs between ranks (or a "
            "capture window is shifted); their skew is not meaningful."
        )
    res.tables["skew"] = agg[
        [
            "process_group",
            "seq",
            "collective",
            "participants",
            "bytes",
            "skew_ns",
            "end_skew_ns",
            "first_participant",
            "last_participant",
            "first_start",
            "last_start",
            "types_agree",
        ]
    ]
    # per participant: how often last, how long the others waited for it
    mm = m.merge(agg[["process_group", "seq", "first_start", "last_start"]],
                 on=["process_group", "seq"])  # fmt: skip
    mm["wait_ns"] = mm["last_start"] - mm["ats"]
    mm["late_ns"] = mm["ats"] - mm["first_start"]
    last_counts = agg["last_participant"].value_counts()
    first_counts = agg["first_participant"].value_counts()
    st = (
        mm.groupby("participant")
        .agg(
            rank=("rank", "first"),
            collectives=("id", "size"),
            mean_wait_ns=("wait_ns", "mean"),
            total_wait_ns=("wait_ns", "sum"),
            mean_late_ns=("late_ns", "mean"),
        )
        .reset_index()
    )
    st["times_last"] = st["participant"].map(last_counts).fillna(0).astype(int)
    st["times_first"] = st["participant"].map(first_counts).fillna(0).astype(int)
    st["share_last_pct"] = 100 * st["times_last"] / max(len(agg), 1)
    res.tables["stragglers"] = st.sort_values(
        ["times_last", "mean_late_ns"], ascending=False
    ).reset_index(drop=True)[
        [
            "participant",
            "rank",
            "collectives",
            "times_last",
            "share_last_pct",
            "times_first",
            "mean_late_ns",
            "mean_wait_ns",
            "total_wait_ns",
        ]
    ]


def _empty(res: Result) -> None:
    res.tables["collectives"] = pd.DataFrame(columns=COLUMNS)
    res.tables["summary"] = pd.DataFrame(
        columns=[
            "participant",
            "rank",
            "collective",
            "count",
            "bytes",
            "time_ns",
            "algbw",
            "busbw",
            "overlap_pct",
            "algorithms",
            "protocols",
        ]
    )
    res.tables["overlap"] = pd.DataFrame(
        columns=[
            "participant",
            "rank",
            "part",
            "device",
            "comm_time_ns",
            "overlapped_ns",
            "overlap_pct",
        ]
    )

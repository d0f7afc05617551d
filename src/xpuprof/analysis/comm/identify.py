"""Each collective kernel's type, size, group and process group, from the first source that
says: the kernel's own args, the host op that launched it (found through the one event tree),
XLA's HLO args, the kernel's name, then the job's ``distributedInfo`` (``docs/comm.md``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from xpuprof.analysis.comm.kinds import (
    as_int,
    comm_bytes,
    decode_arg,
    kernel_parts,
    normalize_collective,
    ranks_list,
    replica_group_size,
    tensor_bytes,
    xla_shape_bytes,
)

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

__all__ = ["KERNEL_ARGS_SQL", "Identity", "identify"]

#: The kernel args the identification reads, as columns of the collectives query.
KERNEL_ARGS_SQL = """
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
"""

_COLLECTIVE_ANNOTATION = ("nccl:", "gloo:", "rccl:")


@dataclass
class Identity:
    """Per collective kernel (row of the query), what is known so far: object arrays hold None
    and float arrays NaN where unknown; ``*_source`` says where each value came from."""

    kind: np.ndarray
    kind_source: np.ndarray
    nbytes: np.ndarray
    bytes_source: np.ndarray
    group: np.ndarray
    group_ranks: np.ndarray
    process_group: np.ndarray
    dtype: np.ndarray
    algorithm: np.ndarray
    protocol: np.ndarray
    #: Collectives whose group was assumed to be the whole world.
    assumed_world: int = 0

    @classmethod
    def empty(cls, df: pd.DataFrame) -> Identity:
        n = len(df)
        nbytes = df["bytes"].to_numpy(float).copy()

        def none() -> np.ndarray:
            return np.full(n, None, dtype=object)

        return cls(
            kind=none(),
            kind_source=none(),
            nbytes=nbytes,
            bytes_source=np.where(np.isnan(nbytes), None, "kernel args").astype(object),
            group=np.full(n, np.nan),
            group_ranks=none(),
            process_group=none(),
            dtype=df["a_dtype"].to_numpy(object).copy(),
            algorithm=none(),
            protocol=none(),
        )

    def set_kind(self, i: int, kind: str | None, source: str) -> None:
        if kind:
            self.kind[i], self.kind_source[i] = kind, source

    def set_bytes(self, i: int, nbytes: float | None, source: str) -> None:
        if nbytes is not None:
            self.nbytes[i], self.bytes_source[i] = nbytes, source


def identify(trace: Trace, df: pd.DataFrame) -> Identity:
    """What each collective kernel of ``df`` (the collectives query, ``KERNEL_ARGS_SQL``
    included) is; unknown types end as ``"unknown"`` and unknown process groups as
    ``"default"``."""
    ident = Identity.empty(df)
    _from_kernel_args(ident, df)
    need = np.flatnonzero(
        (ident.kind == None) | np.isnan(ident.nbytes) | np.isnan(ident.group)  # noqa: E711
    )
    on_host = _on_host(df)
    need = need[df["correlation"].notna().to_numpy()[need] & ~on_host[need]]
    _from_host(ident, trace, df, need)
    _from_host_spans(ident, trace, df, np.flatnonzero(on_host))
    _from_xla(ident, df)
    _from_kernel_names(ident, df["name"].to_numpy(object))
    ident.kind = np.where(ident.kind == None, "unknown", ident.kind)  # noqa: E711
    _from_distributed_info(ident, trace, df)
    pg = ident.process_group
    ident.process_group = np.where(pg == None, "default", pg)  # noqa: E711
    return ident


def _on_host(df: pd.DataFrame) -> np.ndarray:
    """Which rows are host collectives (``analysis.comm.host``), not device kernels."""
    if "on_host" not in df:
        return np.zeros(len(df), bool)
    return df["on_host"].to_numpy(bool)


def _from_host_spans(ident: Identity, trace: Trace, df: pd.DataFrame, rows: np.ndarray) -> None:
    """Host collectives (``gloo:all_reduce``, ``c10d::broadcast_``): what the
    ``record_param_comms`` op inside a ``c10d::`` op says (as for a kernel's launch), then the
    type from the name where no args said it, the bytes from the largest tensor of their input
    shapes (``record_shapes``), and — when the rank's ``distributedInfo`` lists a single
    process group of more than one rank (:func:`_shared_groups`) — that group (the only one
    its collectives can be matched in)."""
    if not len(rows):
        return
    ids = df["id"].to_numpy(np.int64)[rows]
    args = trace.args(ids.tolist())
    kids = trace.sql(
        "select parent, min(id) as id from events where name = 'record_param_comms' and "
        f"parent in ({', '.join(map(str, ids.tolist()))}) group by parent"
    )
    rpc = dict(zip(kids["parent"].astype("int64"), kids["id"].astype("int64"), strict=True))
    rpc_args = trace.args(list(rpc.values())) if rpc else {}
    di = trace.meta.get("distributed_info", {})
    for i in rows.tolist():
        ra = rpc_args.get(rpc.get(int(df["id"].iat[i]), -1))
        if isinstance(ra, dict):
            _fill_from_op(ident, i, ra, {}, None)
        name = str(df["name"].iat[i])
        if ident.kind[i] is None:
            ident.set_kind(i, normalize_collective(name.removeprefix("c10d::")), "host span name")
        a = args.get(int(df["id"].iat[i]))
        if np.isnan(ident.nbytes[i]) and isinstance(a, dict):
            ident.set_bytes(i, tensor_bytes(a), "host span shapes")
        cfg = _shared_groups((di.get(int(df["part"].iat[i])) or {}).get("pg_config") or [])
        if ident.process_group[i] is None and len(cfg) == 1 and cfg[0].get("pg_name") is not None:
            ident.process_group[i] = f"pg {cfg[0]['pg_name']}"


def _shared_groups(cfg: list[Any]) -> list[dict[str, Any]]:
    """The process groups of a rank's ``pg_config`` that other ranks are in: a group of one
    rank (``new_group([0])``) has no partner to wait for, so a collective that another rank
    matches is never in it; a group whose size is not recorded counts as shared."""
    out = []
    for g in cfg:
        if not isinstance(g, dict):
            continue
        size = as_int(g.get("pg_size"))
        if size is None and isinstance(g.get("ranks"), list):
            size = len(g["ranks"])
        if size is None or size >= 2:
            out.append(g)
    return out


def _from_kernel_args(ident: Identity, df: pd.DataFrame) -> None:
    """PyTorch ≥ 2.2 copies ``record_param_comms``' args onto NCCL kernels; XLA collectives
    carry their HLO category. Decoded once per distinct set of args (kernels repeat a few),
    then spread to every kernel that has it."""
    cols = ["a_coll", "a_group", "a_pg", "a_ranks", "hlo", "a_in", "a_out", "a_dtype"]
    if not len(df):
        return
    no_bytes = np.isnan(ident.nbytes)
    key = df[cols].assign(_nb=no_bytes).groupby([*cols, "_nb"], dropna=False, sort=False)
    code = key.ngroup().to_numpy()
    first = np.full(code.max() + 1, len(code))
    np.minimum.at(first, code, np.arange(len(code)))
    one = Identity.empty(df.iloc[first])
    for i, r in enumerate(df[cols].iloc[first].itertuples(False)):
        _fill_from_args(one, i, r)
    for f in ("kind", "kind_source", "group", "group_ranks", "process_group"):
        setattr(ident, f, getattr(one, f)[code])
    ident.nbytes = np.where(no_bytes, one.nbytes[code], ident.nbytes)
    ident.bytes_source = np.where(no_bytes, one.bytes_source[code], ident.bytes_source)


def _fill_from_args(ident: Identity, i: int, r: Any) -> None:
    """Row ``i`` of ``ident`` from the kernel's args ``r`` (a row of the query)."""
    ident.set_kind(i, normalize_collective(r.a_coll), "kernel args")
    if np.isnan(ident.nbytes[i]) and (r.a_in or r.a_out):
        args = {"In msg nelems": decode_arg(r.a_in), "Out msg nelems": decode_arg(r.a_out),
                "dtype": r.a_dtype}  # fmt: skip
        ident.set_bytes(i, comm_bytes(args), "kernel args")
    g = as_int(decode_arg(r.a_group))
    if g:
        ident.group[i] = g
    rl = ranks_list(decode_arg(r.a_ranks))
    if rl:
        ident.group_ranks[i] = rl
        if np.isnan(ident.group[i]):
            ident.group[i] = len(rl)
    if isinstance(r.a_pg, str) and r.a_pg:
        ident.process_group[i] = f"pg {r.a_pg}"
    elif rl:
        ident.process_group[i] = f"ranks {rl}"
    if not ident.kind[i] and r.hlo:
        ident.set_kind(i, normalize_collective(r.hlo), "HLO category")


def _host_ops(trace: Trace, df: pd.DataFrame, need: np.ndarray) -> pd.DataFrame:
    """For the kernels ``need``: the nearest enclosing ``record_param_comms`` op and
    ``nccl:<name>`` annotation of the runtime call that launched each (same part and
    correlation id), as event ids (-1: none), and the annotation's name. The host event tree
    is built for one group of parts at a time (``analysis.per_rank.part_groups``: at most
    ``GROUP_MAX_EVENTS`` events, a view of the store holding only them): a job of hundreds of
    ranks holds tens of millions of host events, and one tree of them all would hold
    gigabytes. A task's trace is one such group already."""
    from xpuprof.analysis.per_rank import part_groups

    parts = df["part"].to_numpy(np.int64)[need]
    groups = part_groups(trace, np.unique(parts).tolist(), 1)
    if len(groups) <= 1:
        return _host_ops_of(trace, df, need)
    from xpuprof.trace.trace import Trace as Store

    frames = []
    for group in groups:
        with Store(trace.path, parts=group, restricted=trace.restricted,
                   duckdb_config=trace.duckdb_config) as sub:  # fmt: skip
            frames.append(_host_ops_of(sub, df, need[np.isin(parts, group)]))
    return pd.concat(frames, ignore_index=True)


def _host_ops_of(trace: Trace, df: pd.DataFrame, need: np.ndarray) -> pd.DataFrame:
    """:func:`_host_ops` on the tree of the whole of ``trace``."""
    t = trace.tree(host_only=True)
    call = t.host_calls(
        df["part"].to_numpy(np.int64)[need],
        df["correlation"].to_numpy(np.int64, na_value=-1)[need],
        runtime_only=True,
    )
    found = call >= 0
    need, call = need[found], call[found]
    is_ann = t.name_mask(lambda s: s.lower().startswith(_COLLECTIVE_ANNOTATION))
    is_rpc = t.name_mask(lambda s: s == "record_param_comms")
    ann = t.nearest(is_ann, call, strict=True)
    rpc = t.nearest(is_rpc, call, strict=True)
    return pd.DataFrame(
        {
            "i": need,
            "ann": np.where(ann >= 0, t.ids[np.maximum(ann, 0)], -1),
            "ann_name": t.names_of(ann),
            "rpc": np.where(rpc >= 0, t.ids[np.maximum(rpc, 0)], -1),
        }
    )


def _from_host(ident: Identity, trace: Trace, df: pd.DataFrame, need: np.ndarray) -> None:
    """Type, bytes, group and process group from the host side of each launch:
    ``record_param_comms``' args first, else the ``nccl:<name>`` annotation (its name and the
    largest tensor of its input shapes)."""
    if not len(need):
        return
    host = _host_ops(trace, df, need)
    if host.empty:
        return
    ids = np.unique(np.concatenate([host["ann"], host["rpc"]]))
    ids = ids[ids >= 0]
    args = trace.args(ids.tolist()) if len(ids) else {}
    for i, ann, ann_name, rpc in host.itertuples(index=False):
        ra = args.get(int(rpc)) if rpc >= 0 else None
        aa = args.get(int(ann)) if ann >= 0 else None
        _fill_from_op(
            ident,
            int(i),
            ra if isinstance(ra, dict) else {},
            aa if isinstance(aa, dict) else {},
            ann_name if ann >= 0 else None,
        )


def _fill_from_op(
    ident: Identity, i: int, ra: dict[str, Any], aa: dict[str, Any], ann_name: Any
) -> None:
    """Fill row ``i`` from the launching ``record_param_comms``' args ``ra`` and the
    enclosing annotation's args ``aa`` and name."""
    if ident.kind[i] is None:
        k, src = normalize_collective(ra.get("Collective name")), "record_param_comms"
        if not k and ann_name is not None:
            k, src = normalize_collective(str(ann_name)), "host annotation"
        ident.set_kind(i, k, src)
    if np.isnan(ident.nbytes[i]):
        b, src = comm_bytes(ra), "record_param_comms"
        if b is None:
            b, src = tensor_bytes(aa), "host annotation shapes"
        ident.set_bytes(i, b, src)
    if np.isnan(ident.group[i]):
        g = as_int(ra.get("Group size"))
        rl = ranks_list(ra.get("Process Group Ranks"))
        if g:
            ident.group[i] = g
        elif rl:
            ident.group[i] = len(rl)
        if rl and ident.group_ranks[i] is None:
            ident.group_ranks[i] = rl
    if ident.process_group[i] is None and ra.get("Process Group Name") is not None:
        ident.process_group[i] = f"pg {ra.get('Process Group Name')}"
    if ident.dtype[i] is None and ra.get("dtype"):
        ident.dtype[i] = ra.get("dtype")


def _from_xla(ident: Identity, df: pd.DataFrame) -> None:
    """XLA collectives: group from ``replica_groups``, bytes from the shape (× group size for
    reduce-scatter, whose shape is the scattered output)."""
    for i in np.flatnonzero(df["shape"].notna().to_numpy()):
        gsz, spec = replica_group_size(df["long_name"].iat[i])
        if gsz and np.isnan(ident.group[i]):
            ident.group[i] = gsz
        if spec and ident.process_group[i] is None:
            ident.process_group[i] = f"replica_groups {spec}"
        if np.isnan(ident.nbytes[i]):
            b = xla_shape_bytes(df["shape"].iat[i])
            if b is not None and ident.kind[i] == "reduce_scatter" and not np.isnan(ident.group[i]):
                b *= ident.group[i]
            ident.set_bytes(i, b, "XLA shape")


def _from_kernel_names(ident: Identity, names: np.ndarray) -> None:
    """Algorithm and protocol, and the type where nothing else said it."""
    code, uniq = pd.factorize(pd.Series(names, dtype=object), use_na_sentinel=False)
    parsed = [kernel_parts(x) for x in uniq]  # once per distinct name
    ident.algorithm = np.array([p["algorithm"] for p in parsed] or [None], dtype=object)[code]
    ident.protocol = np.array([p["protocol"] for p in parsed] or [None], dtype=object)[code]
    kind = np.array([p["collective"] for p in parsed] or [None], dtype=object)[code]
    fill = np.flatnonzero((ident.kind == None) & (kind != None))  # noqa: E711
    ident.kind[fill], ident.kind_source[fill] = kind[fill], "kernel name"


def _from_distributed_info(ident: Identity, trace: Trace, df: pd.DataFrame) -> None:
    """Group size from the ``pg_config`` of ``distributedInfo``, else the world size (counted
    in ``assumed_world``)."""
    di = trace.meta.get("distributed_info", {})
    for i in np.flatnonzero(np.isnan(ident.group)):
        info = di.get(int(df["part"].iat[i])) or {}
        pgn = (ident.process_group[i] or "").removeprefix("pg ")
        for cfg in info.get("pg_config", []) or []:
            if str(cfg.get("pg_name")) == pgn and pgn:
                ident.group[i] = cfg.get("pg_size") or len(cfg.get("ranks") or []) or np.nan
                if ident.group_ranks[i] is None and cfg.get("ranks"):
                    ident.group_ranks[i] = list(cfg["ranks"])
        if np.isnan(ident.group[i]) and as_int(info.get("world_size")):
            ident.group[i] = as_int(info.get("world_size"))
            ident.assumed_world += 1

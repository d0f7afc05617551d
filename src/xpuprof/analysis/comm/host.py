"""Collectives that run on the host: which host spans are collectives, and which one of a
nest of them measures the collective (the one definition the comm tool, the critical path's
labels and the replay share).

A CPU ``torch.distributed`` job (gloo) records each collective up to three times: the
``c10d::<name>_`` op on the calling thread (for gloo: it only *enqueues* the work; a
synchronous call then waits in ``Work.wait()``, which the profiler does not record), sometimes a
``record_param_comms`` op inside it (size, group and process group in its args), and the
``gloo:<name>`` span on one of gloo's worker threads, from the moment the worker takes the work
to the moment the algorithm completes: the wait for the other ranks plus the transfer. The
``gloo:`` span is therefore the collective's time, and is the one chosen; the others are
dropped, so no collective is counted twice.

Rules, per part (a rank's source):

1. every ``gloo:<name>`` host span is a collective (gloo never launches device work, so it is
   never the launch of a device collective, even in a GPU job that uses gloo on the side);
2. in a part with no ``gloo:`` span, no device collective and a backend other than NCCL, the
   outermost ``c10d::<collective>`` ops are the collectives (a synchronous backend without
   worker spans: the op is the call, wait included), else the outermost
   ``record_param_comms`` ops with a ``Collective name``;
3. the ``nccl:<name>`` host ops (and the ``c10d::``/``record_param_comms`` ops) of a part
   with device collectives are launches of kernels that are already rows: never rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from xpuprof.analysis.comm.kinds import normalize_collective

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

__all__ = ["host_collective_ids", "host_collective_members", "host_collectives"]

_C10D = (
    "starts_with(name, 'c10d::') and regexp_matches(lower(name), "
    "'all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|barrier|scatter|gather"
    "|reduce|send|recv')"
)
_CANDIDATE = (
    "starts_with(name, 'gloo:') or starts_with(name, 'c10d::') or name = 'record_param_comms'"
)
_RPC = """(name = 'record_param_comms'
           and json_extract_string(args, '$."Collective name"') is not null)"""


def host_collective_ids(trace: Trace) -> pd.DataFrame:
    """The host spans chosen as collectives (module docstring), every part of the store:
    ``part``, ``id``, ``ts``, ``dur``, ``name``, ``rule`` (``gloo``, ``c10d`` or
    ``record_param_comms``). Cached on the trace."""
    key = ("analysis.comm.host_collective_ids",)
    if key in trace.memo:
        return trace.memo[key]
    df = trace.sql(
        f"""
        select * from (
            select part, id, parent, ts, dur, name,
                case when starts_with(name, 'gloo:') then 'gloo'
                     when {_C10D} then 'c10d'
                     when {_RPC} then 'record_param_comms' end as rule
            from events
            where device < 0 and dur is not null and dur >= 0 and ({_CANDIDATE})
        ) where rule is not null order by part, ts, id
        """
    )
    dev = set(trace.sql("select distinct part from events where level = 'collective'")["part"])
    df = df.assign(nested=df["parent"].isin(df["id"]).to_numpy(bool))
    df = df[(df["rule"] == "gloo") | ~df["part"].isin(dev)]
    nccl = {p for p, info in trace.meta.get("distributed_info", {}).items()
            if str((info or {}).get("backend", "")).lower() == "nccl"}  # fmt: skip
    keep = []
    for p, g in df.groupby("part", sort=True):
        if (g["rule"] == "gloo").any():
            keep.append(g[g["rule"] == "gloo"])
            continue
        if int(p) in nccl:
            continue
        for rule in ("c10d", "record_param_comms"):
            r = g[(g["rule"] == rule) & ~g["nested"]]
            if rule == "c10d":
                r = r[r["name"].map(lambda s: normalize_collective(s[6:]) is not None)]
            if len(r):
                keep.append(r)
                break
    cols = ["part", "id", "ts", "dur", "name", "rule"]
    out = pd.concat(keep)[cols] if keep else pd.DataFrame(columns=cols)
    out = out.reset_index(drop=True)
    trace.memo[key] = out
    return out


def host_collective_members(trace: Trace) -> pd.DataFrame:
    """``part``, ``id`` of every chosen host collective and of the host events inside a
    chosen ``c10d::``/``record_param_comms`` op on its thread (its ``record_param_comms``,
    the copies it makes): time spent in any of them is the collective's (gloo's spans run
    nothing else inside). Cached on the trace."""
    key = ("analysis.comm.host_collective_members",)
    if key in trace.memo:
        return trace.memo[key]
    ids = host_collective_ids(trace)
    out = ids[["part", "id"]]
    ops = ids.loc[ids["rule"] != "gloo", "id"].astype("int64").tolist()
    if ops:
        inner = trace.sql(
            "select distinct e.part, e.id from events e join events c on e.part = c.part and "
            "e.pid = c.pid and e.tid = c.tid and e.ts >= c.ts and e.device < 0 and "
            "e.ts + coalesce(e.dur, 0) <= c.ts + c.dur "
            f"where c.id in ({', '.join(map(str, ops))})"
        )
        out = pd.concat([out, inner], ignore_index=True).drop_duplicates()
    trace.memo[key] = out
    return out


def host_collectives(trace: Trace, where: str, columns: str) -> pd.DataFrame:
    """The events (``columns``, SQL over ``events``, ``id`` among them) of the host
    collectives selected by ``where``, in the order of the device collectives query (part,
    device, ts): the candidates by name in SQL, then the chosen ones by id (no id list in
    the query, however many ranks)."""
    ids = host_collective_ids(trace)
    if ids.empty:
        return pd.DataFrame()
    df = trace.sql(
        f"select {columns} from events where {where} and device < 0 and ({_CANDIDATE}) "
        "order by part, device, ts"
    )
    return df[df["id"].isin(ids["id"])].reset_index(drop=True)

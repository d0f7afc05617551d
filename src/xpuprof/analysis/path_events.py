"""What the events on a critical path are: their names, looked up by id (as codes, so a
table groups on integers), and in words for a sentence (the op, annotation and layer above
an event, the copy a blocking call waited for)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace
    from xpuprof.trace.tree import EventTree

__all__ = ["describe", "name_codes", "names_of"]


def name_codes(trace: Trace, event: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per event id, a code of its name (``(no event)`` for -1, -1 where no name), numbered in
    the names' sort order, and the names: read dictionary-encoded, each converted once."""
    trace.con.register("_dx_codes", pa.table({"id": np.unique(event[event >= 0])}))
    try:
        tb = trace.con.sql("select id, name from events where id in (select id from _dx_codes) "
                           "order by id").to_arrow_table()  # fmt: skip
    finally:
        trace.con.unregister("_dx_codes")
    found, enc = tb["id"].to_numpy(), tb["name"].combine_chunks().dictionary_encode()
    code, uniq = pd.factorize(np.array([*enc.dictionary.to_pylist(), "(no event)"], object),
                              sort=True)  # fmt: skip
    idx = enc.indices.fill_null(-1).to_numpy()
    of_found = np.r_[np.where(idx >= 0, code[np.maximum(idx, 0)], -1), -1]
    pos = np.minimum(np.searchsorted(found, event), len(found))
    hit = pos < len(found)
    hit[hit] = found[pos[hit]] == event[hit]
    out = np.where(hit, of_found[np.where(hit, pos, len(found))], -1)
    return np.where(event < 0, code[-1], out), np.asarray(uniq, dtype=object)


def names_of(trace: Trace, ids: np.ndarray) -> np.ndarray:
    """The name of each event id (None for -1)."""
    ids = np.asarray(ids, np.int64)
    code, names = name_codes(trace, ids)
    out, ok = np.full(len(ids), None, dtype=object), (ids >= 0) & (code >= 0)
    out[ok] = names[code[ok]]
    return out


# ------------------------------------------------------------------------- describing events

_COPY = re.compile(r"(DtoH|Device\s*->\s*Host|Device -> Pageable|Device -> Pinned|D2H)", re.I)
_TO_DEVICE = re.compile(r"(HtoD|Host\s*->\s*Device|Pageable -> Device|Pinned -> Device|H2D)",
                        re.I)  # fmt: skip


def describe(trace: Trace, ids: np.ndarray) -> pd.DataFrame:
    """For each event id: ``name``, the outermost enclosing ``op`` (what the user called), the
    nearest ``annotation`` (``record_function``) and ``layer`` (module path) above it, the
    nearest ``python`` frame, the device ``copy`` it issued (same correlation), and ``what`` it
    is in words (``a device-to-host copy (pageable)``, ``a stream synchronize``…)."""
    ids = np.asarray(ids, np.int64)
    t = _host_tree(trace, ids)
    rows = t.rows_of(ids)
    ok = rows >= 0
    out = pd.DataFrame({"id": ids, "name": names_of(trace, ids)})
    for col, levels in (("op", "op"), ("annotation", "annotation"), ("layer", "layer"),
                        ("python", "python")):  # fmt: skip
        far = col == "op"
        anc = np.full(len(ids), -1)
        if ok.any():
            anc[ok] = t.ancestor_at(levels, rows[ok], farthest=far, strict=False)
        out[col] = t.names_of(anc)
    out["copy"] = _copies(trace, ids)
    out["what"] = [_what(str(n), c) for n, c in zip(out["name"], out["copy"], strict=True)]
    return out


def _host_tree(trace: Trace, ids: np.ndarray) -> EventTree:
    """The host tree :func:`describe` reads: the whole store's where it is built already or
    the store has few ranks; else the tree of the ranks of ``ids`` alone (a headline of a
    job of hundreds of ranks describes one rank's events: one rank's tree, not the job's)."""
    from xpuprof.analysis.per_rank import DASK_MIN_PARTS
    from xpuprof.core.names import ID_SHIFT

    if ("tree", None, True) in trace.memo or len(trace.sources) < DASK_MIN_PARTS:
        return trace.tree(host_only=True)
    rank_of = {int(s["part"]): s.get("rank") for s in trace.sources}
    ranks = {rank_of.get(int(p)) for p in np.unique(ids >> ID_SHIFT)}
    if None in ranks:
        return trace.tree(host_only=True)
    return trace.tree(sorted(ranks), host_only=True)


def _copies(trace: Trace, ids: np.ndarray) -> list[str | None]:
    import pyarrow as pa

    trace.con.register("_dx_copy", pa.table({"id": pa.array(ids, pa.int64())}))
    try:
        df = trace.sql(
            "select h.id, any_value(d.name) as copy from events h join events d on "
            "d.part = h.part and d.correlation = h.correlation and d.level = 'memcpy' "
            "where h.id in (select id from _dx_copy) group by h.id"
        )
    finally:
        trace.con.unregister("_dx_copy")
    m = dict(zip(df["id"].tolist(), df["copy"].tolist(), strict=True))
    return [m.get(int(i)) for i in ids]


def _what(name: str, copy: str | None) -> str:
    """A blocking call in words."""
    pageable = " (pageable memory)" if copy and "pageable" in copy.lower() else ""
    if copy and _COPY.search(copy):
        return f"a device-to-host copy{pageable}"
    if copy and _TO_DEVICE.search(copy):
        return f"a host-to-device copy{pageable}"
    low = name.lower()
    if "memcpy" in low:
        return "a synchronous copy"
    for key, words in (("streamsynchronize", "a stream synchronize"),
                       ("devicesynchronize", "a device synchronize"),
                       ("ctxsynchronize", "a device synchronize"),
                       ("eventsynchronize", "an event synchronize"),
                       ("eventquery", "an event query")):  # fmt: skip
        if key in low:
            return words
    return f"`{name}`"

"""The ``flows`` and ``links`` tables: each flow entry bound to the slice it belongs to on its
track, and the entries sharing a (category, id) joined into links."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.names import LAUNCH_FLOW_KINDS
from xpuprof.core.schema import FLOWS, LINKS
from xpuprof.trace.nesting import bind_flows, match_correlation
from xpuprof.trace.normalize.columns import as_dict, codes, int_or_null, ints, isnull, rank_col
from xpuprof.trace.normalize.events import Timeline


def flow_tables(
    fl: pa.Table, tl: Timeline, part: int, rank: int | None
) -> tuple[pa.Table, pa.Table]:
    """The flows table (each entry with the event it binds to) and the links table."""
    n = fl.num_rows
    rank_ph = codes(fl["ph"], lambda v: {"s": 0, "t": 1}.get(v, 2))
    f_ts = ints(fl["ts"])
    bound = _bind(fl, tl, rank_ph, f_ts)
    flows = pa.Table.from_arrays(
        [
            pa.array(np.full(n, part, np.int32)),
            fl["index"],
            rank_col(n, rank),
            as_dict(fl["ph"]),
            as_dict(fl["cat"]),
            as_dict(fl["name"]),
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
    if n == 0:
        return flows, LINKS.empty_table()
    return flows, _links(fl, bound, rank_ph, f_ts, part, rank)


def _bind(fl: pa.Table, tl: Timeline, rank_ph: np.ndarray, f_ts: np.ndarray) -> np.ndarray:
    """Id of the event each flow entry binds to (-1: none): Chrome-trace binding on its track,
    corrected by correlation id for launch flows."""
    fl_next = (rank_ph == 2) & codes(fl["bp"], lambda v: v != "e", bool)
    f_pid, f_tid = ints(fl["pid"], -1), ints(fl["tid"], -1)
    row = bind_flows(tl.order, tl.parent_pos, tl.end, tl.is_slice, tl.pid, tl.tid, tl.ts,
                     f_pid, f_tid, f_ts, fl_next)  # fmt: skip
    # Launch flows carry the correlation id as their id: where an event on the flow's own
    # track has that correlation, it is the one meant, even when a zero-length call starts
    # in the same microsecond and time alone cannot tell them apart.
    launch = codes(fl["cat"], lambda c: c.lower() in LAUNCH_FLOW_KINDS, bool)
    if launch.any():
        rows = np.flatnonzero(launch)
        fid = int_or_null(fl["flow_id"].take(pa.array(rows)))
        ok = ~isnull(fid)
        rows, fid = rows[ok], ints(fid)[ok]
        ev_corr = tl.corr
        bound_corr = np.where(row[rows] >= 0, ev_corr[np.maximum(row[rows], 0)], -1)
        wrong = bound_corr != fid
        rows, fid = rows[wrong], fid[wrong]
        hit = match_correlation(
            ev_corr, tl.pid, tl.tid, tl.ts, fid, f_pid[rows], f_tid[rows], f_ts[rows]
        )
        found = hit >= 0
        row[rows[found]] = hit[found]
    if not len(tl.ids):
        return np.full(len(row), -1, dtype=np.int64)
    return np.where(row >= 0, tl.ids[np.maximum(row, 0)], -1)


def _links(
    fl: pa.Table,
    bound: np.ndarray,
    rank_ph: np.ndarray,
    f_ts: np.ndarray,
    part: int,
    rank: int | None,
) -> pa.Table:
    """Within each (category, id), every ``t`` or ``f`` links from the ``s``/``t`` before it."""
    n = fl.num_rows
    cat_codes = ints(pc.dictionary_encode(pc.fill_null(fl["cat"], "")).combine_chunks().indices)
    id_codes = ints(pc.dictionary_encode(pc.fill_null(fl["flow_id"], "")).combine_chunks().indices)
    idx = ints(fl["index"])
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
    return pa.Table.from_arrays(
        [
            pa.array(np.full(len(dst_rows), part, np.int32)),
            rank_col(len(dst_rows), rank),
            as_dict(kinds),
            fl["flow_id"].combine_chunks().take(pa.array(dst_rows)),
            pa.array(bound[src_rows], pa.int64(), mask=bound[src_rows] < 0),
            pa.array(bound[dst_rows], pa.int64(), mask=bound[dst_rows] < 0),
            pa.array(idx[src_rows], pa.int64()),
            pa.array(idx[dst_rows], pa.int64()),
        ],
        schema=LINKS,
    )

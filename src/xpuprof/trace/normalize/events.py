"""The ``events`` table: every span and instant with its level, device, stream, nesting on its
track, step, FLOPs and bytes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from xpuprof.core.beside import beside
from xpuprof.core.schema import EVENTS, ID_SHIFT
from xpuprof.costmodel.derive import derive as derive_flops
from xpuprof.costmodel.derive import take_rows
from xpuprof.formats import Vocabulary
from xpuprof.trace.nesting import depths, nest
from xpuprof.trace.normalize.columns import (
    LEVEL_CODE,
    LEVEL_DICT,
    as_dict,
    codes,
    const_dict,
    ints,
    isnull,
    rank_col,
)
from xpuprof.trace.normalize.entries import keep_in_extra
from xpuprof.trace.normalize.levels import collective_bytes, levels, placement
from xpuprof.trace.normalize.steps import StepChoice, choose, steps, window_rows


@dataclass
class Timeline:
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


def events_table(
    ev: pa.Table,
    part: int,
    rank: int | None,
    host: str | None,
    string_ids: dict[str, dict[str, str]],
    meta_raw: pa.Table,
    vocab: Vocabulary,
    index_start: int = 0,
) -> tuple[pa.Table, Timeline, str]:
    """The events table of one source, the timeline facts flow binding needs, and what
    defined its steps (``steps.STEPS_FROM``). Inferred step windows are added as events with
    indexes from ``index_start`` on (the first index no entry of the source has)."""
    pid = ints(ev["pid"], -1)
    tid = ints(ev["tid"], -1)
    ts = ints(ev["ts"])
    dur_null = isnull(ev["dur"])
    device, stream = placement(ev, pid, tid, string_ids, meta_raw, vocab.device)
    is_dev = device >= 0
    level = levels(ev["cat"], ev["name"], ~is_dev, vocab.levels)
    dur = ints(ev["dur"])
    negative = ~dur_null & (dur < 0)
    if negative.any():
        # an event the profiler never saw end: no extent (the source's value goes to extra)
        ev = ev.set_column(
            ev.schema.get_field_index("extra"), "extra", keep_in_extra(ev, negative, "dur")
        )
        dur_null = dur_null | negative
    choice = choose(ev, level, pid, tid, ts, dur, dur_null, device)
    level = choice.level
    if choice.windows is not None:
        ev, (pid, tid, ts, dur, dur_null, device, stream, level) = _with_windows(
            ev, choice, index_start, (pid, tid, ts, dur, dur_null, device, stream, level)
        )
        is_dev = device >= 0
    n = ev.num_rows
    # FLOPs from shapes (Python over the ops' args) on a thread of its own while the nesting
    # sorts the tracks, which numpy does without the GIL (big tables only: core/beside.py)
    with beside(n, "flops") as submit:
        work = submit(_work, ev, level)
        span_dur, (order, parent_pos, end, is_slice) = _nest(ev, pid, tid, ts, dur, dur_null)
        index = ints(ev["index"])
        ids = (np.int64(part) << ID_SHIFT) | index
        parent_id, depth = _parents(order, parent_pos, ids)
        step = steps(ev, level, pid, ts, span_dur, is_dev)
        del span_dur
        flops_col, bytes_col = work.result()
    table = pa.Table.from_arrays(
        [
            pa.array(ids, pa.int64()),
            pa.array(np.full(n, part, np.int32)),
            pa.array(index, pa.int64()),
            rank_col(n, rank),
            const_dict(host, n),
            as_dict(ev["ph"]),
            as_dict(ev["scope"]),
            pa.array(pid, pa.int64(), mask=isnull(ev["pid"])),
            pa.array(tid, pa.int64(), mask=isnull(ev["tid"])),
            pa.array(device),
            pa.array(stream, pa.int64(), mask=stream < 0),
            pa.DictionaryArray.from_arrays(pa.array(level.astype(np.int32)), LEVEL_DICT),
            as_dict(ev["cat"]),
            as_dict(ev["name"]),
            pa.array(ts, pa.int64()),
            pa.array(dur, pa.int64(), mask=dur_null),
            pa.array(parent_id, pa.int64(), mask=parent_id < 0),
            pa.array(depth, pa.int32()),
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
    corr = ints(ev["correlation"], -1)
    timeline = Timeline(order, parent_pos, end, is_slice, pid, tid, ts, ids, corr)
    return table, timeline, choice.steps_from


def _with_windows(
    ev: pa.Table, choice: StepChoice, index_start: int, cols: tuple[np.ndarray, ...]
) -> tuple[pa.Table, tuple[np.ndarray, ...]]:
    """The raw events and their (pid, tid, ts, dur, dur_null, device, stream, level) with the
    inferred step windows appended."""
    w = choice.windows
    assert w is not None
    ev = pa.concat_tables([ev, window_rows(w, ev.schema, index_start, choice.steps_from)])
    k = len(w.start)
    added = (w.pid, w.tid, w.start, w.end - w.start, np.zeros(k, bool), w.device,
             np.full(k, -1), np.full(k, LEVEL_CODE["step"]))  # fmt: skip
    return ev, tuple(
        np.concatenate([c, a.astype(c.dtype)]) for c, a in zip(cols, added, strict=True)
    )


def _nest(
    ev: pa.Table,
    pid: np.ndarray,
    tid: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    dur_null: np.ndarray,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Nesting on each track (pid, tid): the span durations (0 for instants) and what
    ``nesting.nest`` returns. Global and process-scoped instants get tracks of their own,
    since they belong to no thread."""
    instant = codes(ev["ph"], lambda v: v in ("i", "I", "n", "b", "e", "E"), bool) | dur_null
    global_inst = instant & codes(ev["scope"], lambda v: v in ("g", "p"), bool)
    span_dur = np.where(instant, 0, dur)
    nest_tid = np.where(global_inst, np.iinfo(np.int64).min, tid) if global_inst.any() else tid
    return span_dur, nest(pid, nest_tid, ts, span_dur, ~instant)


def _parents(
    order: np.ndarray, parent_pos: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Parent id (-1: none) and depth of each event, in table order."""
    n = len(ids)
    parent_id = np.full(n, -1, dtype=np.int64)
    has_parent = parent_pos >= 0
    parent_id[order[has_parent]] = ids[order[parent_pos[has_parent]]]
    del has_parent
    depth = np.empty(n, dtype=np.int32)
    depth[order] = depths(parent_pos)
    return parent_id, depth


def _work(ev: pa.Table, level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and bytes of each event (NaN: unknown). Bytes moved: memcpy/memset
    ``args.bytes``; collectives: elements x dtype size; framework ops: FLOPs and bytes from
    their recorded shapes (``costmodel``), inclusive like ``dur``: a total sums the outermost
    ops that have a value."""
    n = len(level)
    L = LEVEL_CODE
    bytes_col = np.full(n, np.nan)
    mem = (level == L["memcpy"]) | (level == L["memset"])
    if mem.any():
        b_np = ev["bytes_arg"].to_numpy()
        bytes_col[mem] = b_np[mem]
    coll = np.flatnonzero(level == L["collective"])
    if coll.size:
        # chunk by chunk: a take on the chunked column would first join all of its text
        vals = collective_bytes(take_rows(ev["args"], coll).to_pylist())
        bytes_col[coll] = [np.nan if v is None else v for v in vals]
    flops_col = np.full(n, np.nan)
    is_op = level == L["op"]
    if is_op.any():
        flops_col, op_bytes = derive_flops(ev["name"], ev["args"], where=is_op)
        bytes_col = np.where(is_op, op_bytes, bytes_col)
    return flops_col, bytes_col

"""Which marker defines a source's training steps, and the step of each event.

A source's steps come from the first of these that it holds (``docs/steps.md`` says why each
comes where it does): ``ProfilerStep#N`` spans, XLA step markers, ``xpuprof.step`` spans, any
other step spans a reader declares; for traces with none of those, windows inferred from
``Optimizer.step#…`` spans, from the runs of the program an XLA device runs most often, or from
repeated top-level forward calls. Inferred windows become events of their own (category
:data:`INFERRED_CATEGORY`, named ``step#N``), so every tool that reads step spans sees them.
Then host events take the step span of their process that contains their start; device events
the step of the host call that launched them (same correlation id), else the step span of their
own device containing their start, else any step span containing it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.names import CATEGORY_STEP
from xpuprof.trace.normalize.columns import LEVEL_CODE, codes, decode_json, ints, small_int
from xpuprof.trace.normalize.levels import STEP_NAME

#: What defined a source's steps (the manifest's ``steps_from``), in the order they are tried.
PROFILER_STEP = "ProfilerStep"
XLA_STEP = "XLA step marker"
OWN_STEP = "xpuprof.step"
READER_STEP = "step spans"
OPTIMIZER_STEP = "Optimizer.step"
XLA_MODULE_RUNS = "XLA module runs"
FORWARD_CALLS = "forward calls"
NO_STEPS = "none"
STEPS_FROM: tuple[str, ...] = (
    PROFILER_STEP, XLA_STEP, OWN_STEP, READER_STEP, OPTIMIZER_STEP, XLA_MODULE_RUNS,
    FORWARD_CALLS, NO_STEPS,
)  # fmt: skip

#: Category of the inferred step spans (optimizer steps, XLA module runs, forward calls).
INFERRED_CATEGORY = "xpuprof_inferred_step"
#: The categories of XLA's step markers (a TPU's "Steps" line, host events with ``step_num``).
XLA_STEP_CATEGORIES = frozenset({"xla_step", "host_step"})
#: Category of one run of a compiled XLA program on a device (XProf's "XLA Modules" line).
XLA_MODULE_CATEGORY = "xla_module"

#: torch's optimizer hook names every ``optimizer.step()`` call ``Optimizer.step#<Class>.step``.
OPTIMIZER_NAME = re.compile(r"^Optimizer\.step#")
#: Host spans of one forward call of a whole model: torch's module spans (``nn.Module: …``),
#: TorchRec's pipeline (``## forward ##``, ``## forward 12 ##``), the DDP/FSDP wrappers, JAX's
#: call of a jitted function (``PjitFunction(f)``). Layer spans of an xpuprof capture count too.
FORWARD_NAME = re.compile(
    r"^(?:nn\.Module: |## forward(?: [^#]*)? ##$|"
    r"(?:DistributedDataParallel|FullyShardedDataParallel)\.forward$|PjitFunction\()"
)

_FAMILY = (PROFILER_STEP, XLA_STEP, OWN_STEP, READER_STEP)


@dataclass
class Windows:
    """Inferred step windows, one row each: where (pid, tid, device: -1 on the host), when,
    their number, the marker they come from and the source indexes of the markers that open
    and close them."""

    pid: np.ndarray
    tid: np.ndarray
    device: np.ndarray
    start: np.ndarray
    end: np.ndarray
    number: np.ndarray
    marker: list[str]
    opens: np.ndarray
    closes: np.ndarray


@dataclass
class StepChoice:
    """The marker that defines the steps (``steps_from``), the levels with step spans of other
    kinds demoted to ``annotation``, and the inferred windows (None unless inferred)."""

    steps_from: str
    level: np.ndarray
    windows: Windows | None = None


def choose(
    ev: pa.Table,
    level: np.ndarray,
    pid: np.ndarray,
    tid: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    dur_null: np.ndarray,
    device: np.ndarray,
) -> StepChoice:
    """Decide what defines this source's steps (vectorized; a loop runs over processes and
    tracks with markers only)."""
    rows = np.flatnonzero(level == LEVEL_CODE["step"])
    if rows.size:
        take = pa.array(rows)
        by_name = codes(ev["name"].take(take), lambda v: v.startswith("ProfilerStep#"), bool)
        by_cat = codes(ev["cat"].take(take), _family_of_category, np.int8)
        family = np.where(by_name, 0, by_cat)
        chosen = int(family.min())
        if (family != chosen).any():
            level = level.copy()
            level[rows[family != chosen]] = LEVEL_CODE["annotation"]
        return StepChoice(_FAMILY[chosen], level)
    span = ~dur_null
    host_span = span & (device < 0)
    opt = host_span & codes(ev["name"], lambda v: bool(OPTIMIZER_NAME.match(v)), bool)
    where = (pid, tid, ts, dur, device)
    win = _windows(ev, np.flatnonzero(opt), *where, at_end=True, by_name=False)
    if win is not None:
        return StepChoice(OPTIMIZER_STEP, level, win)
    runs = span & (device >= 0) & codes(ev["cat"], lambda c: c.lower() == XLA_MODULE_CATEGORY, bool)
    win = _windows(ev, np.flatnonzero(runs), *where, at_end=False, by_name=True)
    if win is not None:
        return StepChoice(XLA_MODULE_RUNS, level, win)
    fwd = host_span & (
        codes(ev["name"], lambda v: bool(FORWARD_NAME.match(v)), bool)
        | (level == LEVEL_CODE["layer"])
    )
    win = _windows(ev, np.flatnonzero(fwd), *where, at_end=False, by_name=True)
    if win is not None:
        return StepChoice(FORWARD_CALLS, level, win)
    return StepChoice(NO_STEPS, level)


def _family_of_category(cat: str) -> int:
    """Position in ``_FAMILY`` of a step span that is not a ``ProfilerStep#N``."""
    c = cat.lower()
    return 1 if c in XLA_STEP_CATEGORIES else 2 if c == CATEGORY_STEP else 3


def _outermost(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Mask of spans (sorted by start, longest first) not inside an earlier one."""
    reach = np.maximum.accumulate(end)
    keep = np.ones(len(ts), bool)
    keep[1:] = ts[1:] >= reach[:-1]
    return keep


def _windows(
    ev: pa.Table,
    rows: np.ndarray,
    pid: np.ndarray,
    tid: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    device: np.ndarray,
    *,
    at_end: bool,
    by_name: bool,
) -> Windows | None:
    """Step windows between consecutive markers (``rows``), per process on the thread with the
    most outermost markers: from one marker's end to the next one's end (``at_end``: an
    optimizer step closes its training step), else from one's start to the next one's start
    (a forward call or a program run opens it). ``by_name``: only the most frequent marker name
    of that thread (the model's own forward, not a submodule's; the step's program, not the
    one-off ones). None when no process has two markers."""
    if rows.size < 2:
        return None
    # a damaged or hostile file can leave a marker without a name: "" sorts with the others
    taken = ev["name"].take(pa.array(rows))
    names = np.asarray(pc.fill_null(pc.cast(taken, pa.string()), "").to_pylist(), dtype=object)
    parts: list[tuple[np.ndarray, ...]] = []
    for p in np.unique(pid[rows]):
        mine = rows[pid[rows] == p]
        mine_names = names[pid[rows] == p]
        best: tuple[np.ndarray, np.ndarray] | None = None
        for t in np.unique(tid[mine]):
            sel = tid[mine] == t
            r, nm = mine[sel], mine_names[sel]
            o = np.lexsort((-dur[r], ts[r]))
            r, nm = r[o], nm[o]
            keep = _outermost(ts[r], ts[r] + dur[r])
            r, nm = r[keep], nm[keep]
            if by_name and r.size:
                uniq, first, count = np.unique(nm, return_index=True, return_counts=True)
                top = uniq[np.lexsort((first, -count))[0]]
                r, nm = r[nm == top], nm[nm == top]
            if r.size >= 2 and (best is None or r.size > best[0].size):
                best = (r, nm)
        if best is None:
            continue
        r, nm = best
        edge = ts[r] + dur[r] if at_end else ts[r]
        start, end = edge[:-1], edge[1:]
        ok = end > start
        k = int(ok.sum())
        parts.append(
            (np.full(k, p), np.full(k, tid[r[0]]), np.full(k, device[r[0]]), start[ok], end[ok],
             np.arange(k), nm[:-1][ok], r[:-1][ok], r[1:][ok])
        )  # fmt: skip
    if not parts:
        return None
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    index = ints(ev["index"])
    return Windows(
        pid=cols[0].astype(np.int64),
        tid=cols[1].astype(np.int64),
        device=cols[2].astype(np.int32),
        start=cols[3].astype(np.int64),
        end=cols[4].astype(np.int64),
        number=cols[5].astype(np.int64),
        marker=[str(x) for x in cols[6]],
        opens=index[cols[7].astype(np.int64)],
        closes=index[cols[8].astype(np.int64)],
    )


def window_rows(w: Windows, schema: pa.Schema, index_start: int, steps_from: str) -> pa.Table:
    """Raw event rows (``schema``: the events' raw columns) of inferred step windows, indexes
    from ``index_start`` on: ``X`` spans named ``step#N`` in :data:`INFERRED_CATEGORY`, args
    saying what they were inferred from (``steps_from``, ``marker``, and ``opened_by``/
    ``closed_by``: the source indexes of the markers that bound them)."""
    n = len(w.start)
    enc = msgspec.json.Encoder()
    args = [
        enc.encode(
            {"steps_from": steps_from, "marker": m, "opened_by": int(a), "closed_by": int(b)}
        ).decode()
        for m, a, b in zip(w.marker, w.opens, w.closes, strict=True)
    ]
    given = {
        "index": pa.array(np.arange(index_start, index_start + n, dtype=np.int64)),
        "ph": pa.array(["X"] * n),
        "cat": pa.array([INFERRED_CATEGORY] * n),
        "name": pa.array([f"step#{k}" for k in w.number.tolist()]),
        "pid": pa.array(w.pid, pa.int64()),
        "tid": pa.array(w.tid, pa.int64()),
        "ts": pa.array(w.start, pa.int64()),
        "dur": pa.array(w.end - w.start, pa.int64()),
        "args": pa.array(args, pa.large_string()),
    }
    cols = []
    for f in schema:
        if f.name in given:
            v = given[f.name]
            if pa.types.is_dictionary(f.type):
                v = pc.dictionary_encode(v.cast(f.type.value_type)).cast(f.type)
            cols.append(v.cast(f.type))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def _step_of_name(name: str) -> int:
    """N of ``ProfilerStep#N`` (-1: not a step name, or a number no step has)."""
    m = STEP_NAME.match(name)
    n = small_int(m.group(1)) if m else None
    return -1 if n is None else n


def steps(
    ev: pa.Table,
    level: np.ndarray,
    pid: np.ndarray,
    ts: np.ndarray,
    dur: np.ndarray,
    is_dev: np.ndarray,
) -> pa.Array:
    """The step of each event (null: in no step)."""
    n = len(ts)
    is_step = level == LEVEL_CODE["step"]
    if not is_step.any():
        return pa.nulls(n, pa.int64())
    step_no = codes(ev["name"], _step_of_name, np.int64)
    step = np.full(n, -1, dtype=np.int64)
    rows = np.flatnonzero(is_step)
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
            d = decode_json(args)
            v = small_int(d.get("step_num")) if isinstance(d, dict) else None
            if v is None and name:
                v = small_int(name)
            if v is not None:
                step_no[r] = v
    step[rows] = step_no[rows]
    s_ts, s_end, s_no = ts[rows], ts[rows] + dur[rows], step_no[rows]
    # host events: the step span of the same process that contains their start
    host = ~is_dev & ~is_step
    for p in np.unique(pid[rows]):
        cand = np.flatnonzero(host & (pid == p))
        _by_time(step, cand, ts, *_spans(s_ts, s_end, s_no, pid[rows] == p))
    # device events: the step of the host call that launched them (same correlation id)
    corr = ev["correlation"]
    c = ints(corr, -1)
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
    # device events with no launch found: by time, against the step spans of their own device
    # (an XLA device's program runs) where it has some, else against all
    rest = is_dev & (step < 0)
    own = np.unique(pid[rows][is_dev[rows]])
    for p in own:
        _by_time(step, np.flatnonzero(rest & (pid == p)), ts, *_spans(s_ts, s_end, s_no,
                 pid[rows] == p))  # fmt: skip
    rest = np.flatnonzero(is_dev & (step < 0) & ~np.isin(pid, own))
    if rest.size:
        _by_time(step, rest, ts, *_spans(s_ts, s_end, s_no, np.ones(len(s_ts), bool)))
    return pa.array(step, pa.int64(), mask=step < 0)


def _spans(
    s_ts: np.ndarray, s_end: np.ndarray, s_no: np.ndarray, sel: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The selected step spans' (start, end, number), sorted by start."""
    o = np.argsort(s_ts[sel])
    return s_ts[sel][o], s_end[sel][o], s_no[sel][o]


def _by_time(
    step: np.ndarray, cand: np.ndarray, ts: np.ndarray, st: np.ndarray, en: np.ndarray,
    no: np.ndarray,
) -> None:  # fmt: skip
    """Set, in place, the step of the ``cand`` rows to that of the span containing their start."""
    if not cand.size or not st.size:
        return
    k = np.searchsorted(st, ts[cand], side="right") - 1
    ok = (k >= 0) & (ts[cand] < en[np.maximum(k, 0)])
    step[cand[ok]] = no[k[ok]]

"""The profiler step of each event: host events by time within their process's step spans,
device events through the host call that launched them (same correlation id), else by time."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.trace.normalize.columns import LEVEL_CODE, codes, decode_json, ints, small_int
from xpuprof.trace.normalize.levels import STEP_NAME


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
    n = len(ts)
    is_step = level == LEVEL_CODE["step"]
    if not is_step.any():
        return pa.nulls(n, pa.int64())
    step_no = codes(ev["name"], _step_of_name, np.int64)
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
        sel = pid[rows] == p
        o = np.argsort(s_ts[sel])
        st, en, no = s_ts[sel][o], s_end[sel][o], s_no[sel][o]
        cand = np.flatnonzero(host & (pid == p))
        k = np.searchsorted(st, ts[cand], side="right") - 1
        ok = (k >= 0) & (ts[cand] < en[np.maximum(k, 0)])
        step[cand[ok]] = no[k[ok]]
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
    # device events with no launch found: by time against all steps
    rest = np.flatnonzero(is_dev & (step < 0))
    if rest.size:
        o = np.argsort(s_ts)
        st, en, no = s_ts[o], s_end[o], s_no[o]
        k = np.searchsorted(st, ts[rest], side="right") - 1
        ok = (k >= 0) & (ts[rest] < en[np.maximum(k, 0)])
        step[rest[ok]] = no[k[ok]]
    return pa.array(step, pa.int64(), mask=step < 0)

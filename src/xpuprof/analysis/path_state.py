"""What a part's devices do at each instant, and which host spans claim the path's host time
(input spans, host collectives), as labelled elementary intervals: the state
:mod:`xpuprof.analysis.path_time` reads to label the pieces of the critical path
(``docs/advise.md``). Also the path's categories and which device "kernels" are waits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import WORK_CLASSES, merge_intervals, work_class
from xpuprof.core.names import DEVICE_LEVELS

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: What a piece of the critical path is (``docs/advise.md``), in the order tables list them.
CATEGORIES: tuple[str, ...] = (
    "input", "cpu", "outside_ops", "runtime", "launch", "sync", "compute", "memcpy", "memset",
    "communication", "comm_wait", "device_gap", "other", "device_idle",
)  # fmt: skip
CODE = {c: i for i, c in enumerate(CATEGORIES)}
#: Device "kernels" that are a stream's synchronisation, not work: MTIA's ``event_wait`` (the
#: stream waits for an event another stream records: its args name ``wait_on_stream``) and
#: ``event_record``. HTA types them as computation (``analysis.common.kernel_type`` keeps
#: that, so breakdowns equal HTA's); on the path they are what ``stream_wait_event`` is in
#: HTA's graph: ``device_gap``, which refinement 4 turns into the work the stream waits for.
DEVICE_WAITS = frozenset({"event_wait", "event_record"})


@dataclass(frozen=True)
class DeviceState:
    """What a part's devices do at each instant, as elementary intervals ``bounds[i]`` to
    ``bounds[i + 1]`` labelled with a category code (-1: idle): compute first, then
    communication (``comm_wait`` while waiting for the last participant), copies, sets,
    other work. ``waits``: merged intervals where a collective waited for the last
    participant, whatever else ran."""

    bounds: np.ndarray
    label: np.ndarray
    waits: tuple[np.ndarray, np.ndarray]
    by_label: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]

    @classmethod
    def of(cls, d: pd.DataFrame | None, waits: tuple[np.ndarray, np.ndarray] | None):
        no = (np.empty(0, np.int64), np.empty(0, np.int64))
        waits = merge_intervals(*waits) if waits is not None and len(waits[0]) else no
        if d is None or d.empty:
            return cls(np.zeros(1, np.int64), np.empty(0, np.int64), waits, {})
        s = d.ts.to_numpy(np.int64)
        e = s + d.dur.to_numpy(np.int64)
        k = d.work.to_numpy(object)
        ids = d.id.to_numpy(np.int64)
        groups = [(CODE[c], merge_intervals(s[k == c], e[k == c])) for c in WORK_CLASSES]
        groups.insert(1, (CODE["comm_wait"], waits))
        bounds = unique_sorted(np.concatenate([np.r_[a, b] for _, (a, b) in groups]))
        label = np.full(max(len(bounds) - 1, 0), -1, np.int64)
        for code, (a, b) in reversed(groups):  # the first group wins: it is written last
            label[covered(bounds, a, b)] = code
        by_label = {}
        for c in WORK_CLASSES:
            o = np.flatnonzero(k == c)
            o = o[np.argsort(s[o], kind="stable")]
            by_label[CODE[c]] = (s[o], e[o], ids[o])
        by_label[CODE["comm_wait"]] = by_label[CODE["communication"]]
        return cls(bounds, label, waits, by_label)

    @property
    def event_bounds(self) -> np.ndarray:
        """Every start and end of device work, sorted: where the work a piece is charged to
        can change."""
        if not self.by_label:
            return np.empty(0, np.int64)
        ends = [x for s, e, _ in self.by_label.values() for x in (s, e)]
        return unique_sorted(np.concatenate(ends))

    def charge(
        self, start: np.ndarray, end: np.ndarray, label: np.ndarray, mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Pieces ``[start, end)`` of device label ``label``, those in ``mask`` cut wherever
        the device work running changes, with the event each piece is charged to: a long
        wait through many kernels is charged to each of them, not to the first."""
        c = self.event_bounds
        lo = np.searchsorted(c, start, side="right")
        n_cuts = np.where(mask, np.maximum(np.searchsorted(c, end, side="left") - lo, 0), 0)
        i = np.repeat(np.arange(len(start)), n_cuts + 1)
        j = np.arange(len(i)) - np.r_[0, np.cumsum(n_cuts + 1)[:-1]][i]
        inner = c[np.clip(lo[i] + j - 1, 0, max(len(c) - 1, 0))] if len(c) else start[i]
        s = np.where(j == 0, start[i], inner)
        e = np.where(j == n_cuts[i], end[i], np.r_[s[1:], 0])
        return s, e, i, self.events_at(s, label[i])

    def events_at(self, t: np.ndarray, label: np.ndarray) -> np.ndarray:
        """The id of a device event of class ``label`` running at each ``t`` (-1: none): the
        one started last, else (overlapping work on several streams or lines) the one
        reaching farthest among those started before ``t``."""
        ev = np.full(len(t), -1, np.int64)
        for code, (s, e, ids) in self.by_label.items():
            m = label == code
            if m.any() and len(s):
                k = np.maximum(np.searchsorted(s, t[m], side="right") - 1, 0)
                far = np.maximum.accumulate(np.where(e == np.maximum.accumulate(e),
                                                     np.arange(len(e)), 0))[k]  # fmt: skip
                ev[m] = np.where(e[k] > t[m], ids[k], np.where(e[far] > t[m], ids[far], -1))
        return ev

    def at(self, t: np.ndarray) -> np.ndarray:
        """The label at each instant ``t`` (-1: idle or outside)."""
        if not len(self.label):
            return np.full(len(t), -1, np.int64)
        k = np.searchsorted(self.bounds, t, side="right") - 1
        ok = (k >= 0) & (k < len(self.label))
        return np.where(ok, self.label[np.clip(k, 0, len(self.label) - 1)], -1)

    def waiting(self, t: np.ndarray) -> np.ndarray:
        """Whether a collective waits for the last participant at each instant ``t``."""
        return inside(*self.waits, t)


def unique_sorted(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (a sort: numpy's hash-based unique is slower on int64 times)."""
    a = np.sort(a, kind="stable")
    return a[np.r_[True, a[1:] != a[:-1]]] if len(a) else a


def covered(bounds: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per elementary interval ``bounds[i]``–``bounds[i + 1]``, whether it lies in one of the
    merged, sorted intervals ``[lo, hi)`` whose ends are all in ``bounds``: ``inside(lo, hi,
    bounds[:-1])``, found from the intervals' ends (fewer) rather than every bound."""
    d = np.zeros(len(bounds), np.int64)
    d[np.searchsorted(bounds, lo)] += 1
    d[np.searchsorted(bounds, hi)] -= 1
    return np.cumsum(d[:-1]) > 0


def inside(lo: np.ndarray, hi: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whether each ``t`` lies in one of the merged, sorted intervals ``[lo, hi)``."""
    if not len(lo):
        return np.zeros(len(t), bool)
    k = np.searchsorted(lo, t, side="right") - 1
    return (k >= 0) & (hi[np.maximum(k, 0)] > t)


#: :attr:`KindRows.dur` of an event without a duration.
NO_DUR = np.iinfo(np.int64).min


@dataclass(frozen=True)
class KindRows:
    """Every runtime call and device event of the store, in scan order, names as codes into
    ``names`` (-1: none): the one read the path's device state and its call kinds share."""

    id: np.ndarray
    part: np.ndarray
    device: np.ndarray
    ts: np.ndarray
    dur: np.ndarray  # NO_DUR where missing
    runtime: np.ndarray  # bool: a runtime call (else device work)
    level: np.ndarray  # int64 code into levels
    levels: np.ndarray  # object: the distinct levels
    name: np.ndarray  # int64 code into names
    names: np.ndarray  # object: the distinct names
    work: np.ndarray  # object: work class of device rows (None for runtime calls)


def kind_rows(trace: Trace) -> KindRows:
    """:class:`KindRows` of ``trace`` (cached on ``trace.memo``): one Arrow scan, names and
    levels dictionary-encoded so each distinct (level, name) is classified once."""
    key = ("analysis.path_state.kind_rows",)
    if key in trace.memo:
        return trace.memo[key]
    t = trace.table(
        "events",
        columns=["id", "part", "device", "level", "name", "ts", "dur"],
        filters=[("level", "in", ["runtime", *DEVICE_LEVELS])],
    )
    name, names = _codes(t["name"])
    level, levels = _codes(t["level"])
    runtime = level == (list(levels).index("runtime") if "runtime" in list(levels) else -2)
    pair, inv = np.unique(level * (len(names) + 1) + name + 1, return_inverse=True)
    lv, nm = pair // (len(names) + 1), pair % (len(names) + 1) - 1
    none = np.array([None], object)
    classes = work_class(pd.Series(np.r_[levels, none][lv]), pd.Series(np.r_[names, none][nm]))
    work = classes.to_numpy(object)[inv.reshape(-1)]
    work[runtime] = None
    out = KindRows(
        id=_ints(t["id"]), part=_ints(t["part"]), device=_ints(t["device"]), ts=_ints(t["ts"]),
        dur=_ints(t["dur"], NO_DUR), runtime=runtime, level=level, levels=levels,
        name=name, names=names, work=work,
    )  # fmt: skip
    trace.memo[key] = out
    return out


def _codes(col) -> tuple[np.ndarray, np.ndarray]:
    """(int64 code of each value, -1 for null; the distinct values as an object array)."""
    import pyarrow as pa

    d = col.combine_chunks().dictionary_encode() if len(col) else pa.array([], pa.string())
    if not len(col):
        return np.empty(0, np.int64), np.empty(0, object)
    codes = d.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, np.asarray(d.dictionary.to_pylist(), dtype=object)


def _ints(col, missing: int = -1) -> np.ndarray:
    """int64 values of an Arrow column, ``missing`` where missing."""
    return col.combine_chunks().fill_null(missing).to_numpy(zero_copy_only=False).astype(np.int64)


def device_events(trace: Trace, parts: list[int]) -> dict[int, pd.DataFrame]:
    """Each part's device work (id, part, device, ts, dur, work class), from
    :func:`kind_rows`: device rows with a positive duration, stream waits left out."""
    r = kind_rows(trace)
    waits = np.isin(r.names, list(DEVICE_WAITS))
    keep = ~r.runtime & (r.dur > 0) & np.isin(r.part, parts)
    keep &= ~np.r_[waits, False][r.name]  # a stream waiting does no work (-1: no name)
    if not keep.any():
        return {}
    t = pd.DataFrame({"id": r.id[keep], "part": r.part[keep], "device": r.device[keep],
                      "ts": r.ts[keep], "dur": r.dur[keep], "work": r.work[keep]})  # fmt: skip
    return {int(p): g for p, g in t.groupby("part")}


@dataclass(frozen=True)
class Claims:
    """Host spans that claim the path's host time (input spans, CPU collectives): ``lo``/``hi``
    merged; ``starts`` sorted, with the id of the span reaching farthest among those started
    so far (``reach_id``, -1: not an event) and that reach (``reach``)."""

    lo: np.ndarray
    hi: np.ndarray
    starts: np.ndarray
    reach: np.ndarray
    reach_id: np.ndarray

    @classmethod
    def of(cls, df: pd.DataFrame | None) -> Claims | None:
        if df is None or df.empty:
            return None
        o = np.argsort(df.ts.to_numpy(np.int64), kind="stable")
        s = df.ts.to_numpy(np.int64)[o]
        e = s + df.dur.to_numpy(np.int64)[o]
        ids = pd.Series(df["id"]).astype("Float64").fillna(-1).to_numpy(np.int64)[o]
        best = np.maximum.accumulate(np.where(e == np.maximum.accumulate(e),
                                              np.arange(len(e)), 0))  # fmt: skip
        lo, hi = merge_intervals(s, e)
        return cls(lo, hi, s, e[best], ids[best])

    def covers(self, t: np.ndarray) -> np.ndarray:
        return inside(self.lo, self.hi, t)

    def id_at(self, t: np.ndarray) -> np.ndarray:
        """The id of a span covering each ``t`` (-1: none, or not an event)."""
        k = np.searchsorted(self.starts, t, side="right") - 1
        kk = np.maximum(k, 0)
        return np.where((k >= 0) & (self.reach[kk] > t), self.reach_id[kk], -1)


def innermost(spans: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """The id of the deepest span of ``spans`` (``id``, ``pid``, ``tid``, ``depth``, ``ts``,
    ``e``) covering each instant ``t`` (-1: none): its own time, as an op's self time is its
    own. One numpy pass per thread and depth, shallowest first, so a deeper span wins."""
    out = np.full(len(t), -1, np.int64)
    if spans.empty or not len(t):
        return out
    spans = spans.assign(depth=spans["depth"].fillna(0)).sort_values("ts", kind="stable")
    for _, g in spans.groupby(["depth", "pid", "tid"], sort=True, dropna=False):
        s, e = g["ts"].to_numpy(np.int64), g["e"].to_numpy(np.int64)
        k = np.searchsorted(s, t, side="right") - 1
        kk = np.maximum(k, 0)
        hit = (k >= 0) & (e[kk] > t)
        out[hit] = g["id"].to_numpy(np.int64)[kk[hit]]
    return out

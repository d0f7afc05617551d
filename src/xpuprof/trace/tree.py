"""The event tree of a store: every event's parent, children and ancestors across levels.

One model for every analysis that walks nesting (hierarchy, stats, memory, roofline, comm):
the events as numpy arrays in id order, each row's parent as a row, and vectorized walks up
the tree — one numpy step per nesting level, never a Python loop over events. Build it with
``Trace.tree(ranks=None, host_only=False)``, which caches it on the Trace; ``docs/tree.md``
describes every walk with an example.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from xpuprof.core.errors import XpuprofError
from xpuprof.core.names import DEVICE_LEVELS, LEVELS

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import pyarrow as pa

    from xpuprof.trace.trace import Trace

#: Level name → the code stored in ``EventTree.level`` (the position in ``LEVELS``).
LEVEL_CODE = {lv: i for i, lv in enumerate(LEVELS)}
STEP_CODE = LEVEL_CODE["step"]
#: Levels of work that runs on a device.
DEVICE_LEVEL_CODES = np.array([LEVEL_CODE[x] for x in DEVICE_LEVELS], np.int8)

#: Columns of the events table the tree reads when it is built (the rest: ``LAZY_COLUMNS``).
COLUMNS = ("id", "part", "rank", "device", "level", "name", "parent", "depth")


# ----------------------------------------------------------------------------------------------
# the one id -> row lookup, and walks over plain parent arrays
# ----------------------------------------------------------------------------------------------


def rows_in(ids: np.ndarray, wanted: np.ndarray, *, is_sorted: bool = False) -> np.ndarray:
    """Position in ``ids`` of each wanted id (-1: absent, or a negative/null id). ``ids`` must
    be unique; ``is_sorted`` skips the sort when they are increasing (a tree's ``ids``)."""
    ids = np.asarray(ids, np.int64)
    wanted = np.asarray(wanted, np.int64)
    if not len(ids):
        return np.full(len(wanted), -1, np.int64)
    if is_sorted:
        pos = np.clip(np.searchsorted(ids, wanted), 0, len(ids) - 1)
        return np.where((wanted >= 0) & (ids[pos] == wanted), pos, -1)
    order = np.argsort(ids, kind="stable")
    sid = ids[order]
    pos = np.clip(np.searchsorted(sid, wanted), 0, len(ids) - 1)
    return np.where((wanted >= 0) & (sid[pos] == wanted), order[pos], -1)


def outermost(
    has_value: np.ndarray, parent: np.ndarray, ids: np.ndarray | None = None
) -> np.ndarray:
    """Mask of the rows to sum so that nested ops are counted once: rows with a value and no
    ancestor with a value.

    ``parent`` gives each row's parent as a row position (-1: none), or, with ``ids``, as an
    event id from the same ``ids`` column (negative: none) — the events table's ``parent`` and
    ``id``. Ancestors without a value (autograd nodes, annotations, unknown ops) are looked
    through. Runs one vectorized step per nesting level.
    """
    has = np.asarray(has_value, bool)
    par = np.asarray(parent, np.int64)
    if ids is not None:
        par = rows_in(ids, par)
    return has & ~_covered(has, par)


def _covered(has: np.ndarray, par: np.ndarray) -> np.ndarray:
    """Rows with a value that have an ancestor with a value."""
    covered = np.zeros(len(has), bool)
    rows = np.flatnonzero(has & (par >= 0))
    anc = par[rows]
    while rows.size:
        hit = has[anc]
        covered[rows[hit]] = True
        keep = ~hit
        rows, anc = rows[keep], par[anc[keep]]
        live = anc >= 0
        rows, anc = rows[live], anc[live]
    return covered


def walk_up(
    parent: np.ndarray,
    start: np.ndarray,
    target: np.ndarray,
    *,
    farthest: bool = False,
    strict: bool = False,
) -> np.ndarray:
    """For each start row, the nearest (``farthest``: the farthest) ancestor-or-self row where
    ``target`` is true (``strict``: ancestors only); -1 when there is none or the start is -1.
    One vectorized step per nesting level, over the start rows only."""
    start = np.asarray(start, np.int64)
    out = np.full(len(start), -1, np.int64)
    if not len(parent):  # an empty tree: nothing has an ancestor (and nothing to index)
        return out
    cur = start if not strict else np.where(start >= 0, parent[np.maximum(start, 0)], -1)
    idx = np.flatnonzero(cur >= 0)
    cur = cur[idx]
    for _ in range(1 << 16):
        if not idx.size:
            return out
        hit = target[cur]
        out[idx[hit]] = cur[hit]
        if not farthest:
            idx, cur = idx[~hit], cur[~hit]
        cur = parent[cur]
        live = cur >= 0
        idx, cur = idx[live], cur[live]
    raise XpuprofError("the event tree has a cycle (corrupt parent column)")


def chain_pairs(start: np.ndarray, up: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item, node, round) for every node on each item's chain: ``start[i]``, then ``up`` of
    it, recursively (round 0 is the item's own node; items with ``start`` -1 have none).

    ``up`` is any "next node above" array: the tree's ``parent``, or an analysis's own chain
    (enclosing layer span, enclosing op). Used to roll values up a chain, one pair per step."""
    items, nodes, rounds = [], [], []
    idx = np.flatnonzero(start >= 0)
    cur = start[idx]
    k = 0
    while idx.size:
        items.append(idx)
        nodes.append(cur)
        rounds.append(np.full(idx.size, k, np.int32))
        nxt = up[cur]
        ok = nxt >= 0
        idx, cur = idx[ok], nxt[ok]
        k += 1
        if k > 1 << 16:
            raise XpuprofError("the event tree has a cycle (corrupt parent column)")
    if not items:
        e = np.empty(0, np.int64)
        return e, e, np.empty(0, np.int32)
    return np.concatenate(items), np.concatenate(nodes), np.concatenate(rounds)


@dataclass
class Rollup:
    """Weights of items (device time of kernels, host time of ops…) rolled up a chain of
    nodes, per key (a name, a module type…): what :func:`roll_up` returns."""

    inclusive: np.ndarray
    count: np.ndarray
    exclusive: np.ndarray
    exclusive_count: np.ndarray
    item: np.ndarray  # (item, key) pairs, each pair once
    key: np.ndarray


def roll_up(
    start: np.ndarray, up: np.ndarray, key_of: np.ndarray, n_keys: int, weight: np.ndarray
) -> Rollup:
    """Sum ``weight`` of items up their chain (``start[i]``, then ``up`` of it...): each item
    counts once per key however often the key recurs on its chain (inclusive), and once for
    the key of its own node (exclusive). ``key_of`` maps nodes to keys (-1: skip the node but
    keep climbing)."""
    item, node, _ = chain_pairs(start, up)
    key = key_of[node]
    ok = key >= 0
    item, key = item[ok], key[ok]
    if len(item):
        _, first = np.unique(item.astype(np.int64) * max(n_keys, 1) + key, return_index=True)
        item, key = item[first], key[first]
    s = np.flatnonzero(start >= 0)
    k0 = key_of[start[s]]
    ok0 = k0 >= 0
    w = np.asarray(weight, np.float64)
    return Rollup(
        inclusive=np.bincount(key, weights=w[item], minlength=n_keys)[:n_keys],
        count=np.bincount(key, minlength=n_keys)[:n_keys].astype(np.int64),
        exclusive=np.bincount(k0[ok0], weights=w[s[ok0]], minlength=n_keys)[:n_keys],
        exclusive_count=np.bincount(k0[ok0], minlength=n_keys)[:n_keys].astype(np.int64),
        item=item,
        key=key,
    )


# ----------------------------------------------------------------------------------------------
# the tree
# ----------------------------------------------------------------------------------------------


class _Lazy:
    """A column of the tree read from the store on first use (``EventTree.load``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, tree: EventTree | None, owner: type) -> np.ndarray:
        if tree is None:
            return self  # type: ignore[return-value]
        if self.name not in tree.loaded:
            tree.load(self.name)
        return tree.loaded[self.name]


#: Lazy columns → the events column each is read from.
LAZY_COLUMNS = {"pid": "pid", "tid": "tid", "ts": "ts", "dur": "dur", "has_dur": "dur",
                "correlation": "correlation", "step": "step", "flops": "flops",
                "bytes": "bytes"}  # fmt: skip


@dataclass(eq=False)
class EventTree:
    """Events of a store (optionally some ranks, optionally host events only) as numpy arrays
    in id order. Row numbers index every array; -1 means none (no parent, null rank, …).

    The structure (ids, parent, level, name, part, rank, device) is read when the tree is
    built; the other columns (``pid``, ``tid``, ``ts``, ``dur``/``has_dur``, ``correlation``,
    ``step``, ``flops``, ``bytes``) on first use, or together with :meth:`load`."""

    ids: np.ndarray  # int64, increasing
    part: np.ndarray
    rank: np.ndarray  # -1 where null
    device: np.ndarray  # -1: host
    level: np.ndarray  # int8 code into LEVELS (unknown levels: "other")
    name: np.ndarray  # int64 code into ``names`` (-1: null)
    names: np.ndarray  # object array of the distinct names
    parent: np.ndarray  # row of the parent (-1: none, or not in this tree)
    stored_depth: np.ndarray  # the store's depth column (0 where null)
    #: How to read more columns: the store's events table, which of its rows, in what order.
    source: _Source | None = None
    loaded: dict[str, np.ndarray] = field(default_factory=dict)

    pid = _Lazy()  # -1 where null
    tid = _Lazy()  # -1 where null
    ts = _Lazy()  # int64 ns
    dur = _Lazy()  # int64 ns, 0 where null (negative clipped)
    has_dur = _Lazy()  # bool: dur not null
    correlation = _Lazy()  # -1 where null
    step = _Lazy()  # step number, -1 where null
    flops = _Lazy()  # float64, NaN where null
    bytes = _Lazy()  # float64, NaN where null

    def load(self, *columns: str) -> None:
        """Read lazy columns (``LAZY_COLUMNS``) now, in one pass over the store."""
        want = sorted({LAZY_COLUMNS[c] for c in columns} - set(self.loaded))
        if not want:
            return
        if self.source is None:
            raise XpuprofError(f"this event tree has no column {want[0]!r}")
        self.loaded.update(_convert(self.source.read(want)))

    @property
    def n(self) -> int:
        return len(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    # -- lookups -------------------------------------------------------------------------------

    def rows_of(self, ids: Iterable[int] | np.ndarray) -> np.ndarray:
        """Row of each event id (-1: not in this tree)."""
        return rows_in(self.ids, np.asarray(ids, np.int64), is_sorted=True)

    def is_level(self, *levels: str) -> np.ndarray:
        """Mask of the rows at any of the given levels (``LEVELS``)."""
        unknown = [lv for lv in levels if lv not in LEVEL_CODE]
        if unknown:
            raise XpuprofError(f"unknown level(s) {unknown}; levels are: {', '.join(LEVELS)}")
        return np.isin(self.level, np.array([LEVEL_CODE[lv] for lv in levels], np.int8))

    @cached_property
    def is_device(self) -> np.ndarray:
        """Mask of device work: kernels, copies, sets and collectives."""
        return np.isin(self.level, DEVICE_LEVEL_CODES)

    def name_mask(self, predicate: Callable[[str], object]) -> np.ndarray:
        """Mask of the rows whose name satisfies ``predicate(str) -> bool`` (evaluated once per
        distinct name, not per event)."""
        ok = np.array([isinstance(v, str) and bool(predicate(v)) for v in self.names], bool)
        if not ok.size:
            return np.zeros(self.n, bool)
        return np.where(self.name >= 0, ok[np.maximum(self.name, 0)], False)

    def names_of(self, rows: np.ndarray) -> np.ndarray:
        """Names of the given rows as an object array (None for -1 or a null name)."""
        rows = np.asarray(rows, np.int64)
        out = np.full(len(rows), None, dtype=object)
        ok = rows >= 0
        codes = self.name[rows[ok]]
        out[ok] = np.where(codes >= 0, self.names[np.maximum(codes, 0)], None)
        return out

    # -- structure -----------------------------------------------------------------------------

    @cached_property
    def depth(self) -> np.ndarray:
        """Nesting depth of each row in this tree (0: no parent here). The store's own depth
        where it agrees with ``parent``, else recomputed (a rank or host-only selection can cut
        a chain)."""
        from xpuprof.trace.nesting import depths

        d = self.stored_depth
        ok = self.parent >= 0
        if (len(d) and d.min() >= 0 and (d[~ok] == 0).all()
                and (d[self.parent[ok]] + 1 == d[ok]).all()):  # fmt: skip
            return d
        return depths(self.parent).astype(np.int64)

    @cached_property
    def by_depth(self) -> list[np.ndarray]:
        """Rows grouped by depth, shallowest first: walking the groups in order settles every
        parent before its children."""
        d = self.depth
        if not len(d):
            return []
        order = np.argsort(d, kind="stable")
        return np.split(order, np.flatnonzero(np.diff(d[order])) + 1)

    @cached_property
    def _children(self) -> tuple[np.ndarray, np.ndarray]:
        has = np.flatnonzero(self.parent >= 0)
        kids = has[np.argsort(self.parent[has], kind="stable")]
        offsets = np.searchsorted(self.parent[kids], np.arange(self.n + 1))
        return offsets, kids

    def children(self, row: int) -> np.ndarray:
        """Rows of the children of one row, in id order."""
        offsets, kids = self._children
        return kids[offsets[row] : offsets[row + 1]]

    def child_count(self) -> np.ndarray:
        """Number of children of every row."""
        return np.diff(self._children[0])

    # -- walks over the whole tree (one numpy step per depth) ----------------------------------

    def inherit(self, own: np.ndarray) -> np.ndarray:
        """Nearest ancestor-or-self value for every row: ``own[i]`` where it is set (>= 0), else
        the parent's result, recursively."""
        out = np.asarray(own).astype(np.int64, copy=True)
        par = self.parent
        for rows in self.by_depth[1:]:
            unset = rows[out[rows] < 0]
            if unset.size:
                p = par[unset]
                ok = p >= 0
                out[unset[ok]] = out[p[ok]]
        return out

    def outermost(self, own: np.ndarray) -> np.ndarray:
        """Farthest ancestor-or-self value for every row: the parent's result where it is set,
        else ``own[i]``."""
        out = np.asarray(own).astype(np.int64, copy=True)
        par = self.parent
        for rows in self.by_depth[1:]:
            p = par[rows]
            ok = p >= 0
            up = np.full(len(rows), -1, np.int64)
            up[ok] = out[p[ok]]
            hit = up >= 0
            out[rows[hit]] = up[hit]
        return out

    def above(self, values: np.ndarray) -> np.ndarray:
        """The parent's value for every row (-1 at the top): with an ``inherit`` result, the
        nearest *strict* ancestor's value."""
        out = np.full(self.n, -1, np.int64)
        ok = self.parent >= 0
        out[ok] = values[self.parent[ok]]
        return out

    # -- ancestors in a mask or at a level -----------------------------------------------------

    def nearest(
        self, mask: np.ndarray, rows: np.ndarray | None = None, *, strict: bool = False
    ) -> np.ndarray:
        """Nearest ancestor-or-self row where ``mask`` is true (``strict``: ancestors only),
        for every row, or for the given ``rows`` (-1: none). Whole-tree walks go one depth at a
        time; a few rows walk up alone."""
        if rows is not None:
            return walk_up(self.parent, rows, np.asarray(mask, bool), strict=strict)
        got = self.inherit(np.where(mask, np.arange(self.n, dtype=np.int64), -1))
        return self.above(got) if strict else got

    def farthest(
        self, mask: np.ndarray, rows: np.ndarray | None = None, *, strict: bool = False
    ) -> np.ndarray:
        """Farthest (outermost) ancestor-or-self row where ``mask`` is true (``strict``:
        ancestors only), for every row or for the given ``rows`` (-1: none)."""
        if rows is not None:
            return walk_up(self.parent, rows, np.asarray(mask, bool), farthest=True,
                           strict=strict)  # fmt: skip
        got = self.outermost(np.where(mask, np.arange(self.n, dtype=np.int64), -1))
        return self.above(got) if strict else got

    def ancestor_at(
        self,
        levels: str | Iterable[str],
        rows: np.ndarray | None = None,
        *,
        farthest: bool = False,
        strict: bool = False,
    ) -> np.ndarray:
        """Nearest (``farthest``: outermost) ancestor-or-self row at one of ``levels``
        (``strict``: ancestors only), for every row or for the given ``rows``."""
        mask = self.is_level(*([levels] if isinstance(levels, str) else levels))
        walk = self.farthest if farthest else self.nearest
        return walk(mask, rows, strict=strict)

    def outermost_with_value(self, has_value: np.ndarray) -> np.ndarray:
        """Mask of the rows with a value and no ancestor with a value (nested FLOPs counted
        once: :func:`outermost` on this tree)."""
        has = np.asarray(has_value, bool)
        return has & ~_covered(has, self.parent)

    def host_calls(
        self, part: np.ndarray, correlation: np.ndarray, *, runtime_only: bool = False
    ) -> np.ndarray:
        """Row of the host call that carries each (part, correlation id): a runtime call
        first, else (unless ``runtime_only``) another non-device event with that id, the lowest
        row on ties; -1 when none. This is how device work finds its launch without a flow."""
        import pandas as pd

        part = np.asarray(part, np.int64)
        correlation = np.asarray(correlation, np.int64)
        out = np.full(len(part), -1, np.int64)
        runtime = self.level == LEVEL_CODE["runtime"]
        cand = np.flatnonzero(
            (runtime if runtime_only else ~self.is_device) & (self.correlation >= 0)
        )
        if not cand.size or not len(part):
            return out
        o = np.lexsort((cand, ~runtime[cand], self.correlation[cand], self.part[cand]))
        cand = cand[o]
        h = pd.DataFrame({"part": self.part[cand], "corr": self.correlation[cand], "row": cand})
        h = h.drop_duplicates(["part", "corr"])
        q = pd.DataFrame({"part": part, "corr": correlation, "q": np.arange(len(part))})
        m = q[correlation >= 0].merge(h, on=["part", "corr"], how="inner")
        out[m.q.to_numpy()] = m.row.to_numpy()
        return out

    # -- selections ----------------------------------------------------------------------------

    def step_mask(
        self, numbers: Iterable[int] | None = None, *, drop_last: bool = False
    ) -> np.ndarray:
        """Mask of the rows in the selected steps: the given step ``numbers``; or with
        ``drop_last`` every row but those of each rank's last step (ranks with at least two
        step spans; rows outside any step are kept); else every row."""
        if numbers is not None:
            return np.isin(self.step, np.array([int(s) for s in numbers], np.int64))
        keep = np.ones(self.n, bool)
        if not drop_last:
            return keep
        spans = np.flatnonzero(self.level == STEP_CODE)
        if not spans.size:
            return keep
        ranks, inv = np.unique(self.rank[spans], return_inverse=True)
        count = np.bincount(inv, minlength=len(ranks))
        steps = self.step[spans]
        last = np.full(len(ranks), -1, np.int64)
        np.maximum.at(last, inv, steps)
        drop = ranks[(count >= 2) & (last >= 0)], last[(count >= 2) & (last >= 0)]
        if not len(drop[0]):
            return keep
        pos = np.clip(np.searchsorted(drop[0], self.rank), 0, len(drop[0]) - 1)
        hit = (drop[0][pos] == self.rank) & (self.step >= 0) & (self.step == drop[1][pos])
        return ~hit


# ----------------------------------------------------------------------------------------------
# building it
# ----------------------------------------------------------------------------------------------


def _int(col: pa.ChunkedArray, fill: int = -1) -> np.ndarray:
    import pyarrow.compute as pc

    if col.null_count == 0:
        return np.asarray(col.to_numpy(), np.int64)
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), np.int64)


def _float(col: pa.ChunkedArray) -> np.ndarray:
    import pyarrow.compute as pc

    return np.asarray(pc.fill_null(col, np.nan).to_numpy(zero_copy_only=False), np.float64)


def dictionary_codes(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(codes, values) of a dictionary (or plain string) column; null → -1."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not pa.types.is_dictionary(col.type):
        col = pc.dictionary_encode(col)
    arr = col.unify_dictionaries().combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if isinstance(arr, pa.ChunkedArray):  # an empty column
        arr = pa.array([], pa.dictionary(pa.int32(), pa.string()))
    codes = np.asarray(pc.fill_null(arr.indices, -1).to_numpy(zero_copy_only=False), np.int64)
    values = np.asarray(arr.dictionary.to_pylist(), dtype=object)
    return codes, values


@dataclass(eq=False)
class _Source:
    """Where a tree's rows come from: the Trace (weakly: the tree lives in its memo), the rows
    of its events table kept (None: all) and their order (None: as stored), of the files of
    ``parts`` (None: all)."""

    trace: weakref.ref[Trace]
    keep: pa.Array | None
    order: pa.Array | None
    parts: list[int] | None = None

    def read(self, columns: list[str]) -> pa.Table:
        trace = self.trace()
        if trace is None:
            raise XpuprofError("the Trace this event tree was read from is gone")
        tb = trace.table("events", columns=columns, parts=self.parts)
        if self.keep is not None:
            tb = tb.filter(self.keep)
        return tb if self.order is None else tb.take(self.order)


def _convert(tb: pa.Table) -> dict[str, np.ndarray]:
    """Lazy columns as numpy arrays (nulls: -1 for ids and numbers, 0 for times, NaN for
    FLOPs and bytes)."""
    import pyarrow.compute as pc

    out: dict[str, np.ndarray] = {}
    for c in tb.column_names:
        col = tb[c]
        if c == "dur":
            out["dur"] = np.maximum(_int(col, 0), 0)
            out["has_dur"] = np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), bool)
        elif c in ("flops", "bytes"):
            out[c] = _float(col)
        else:
            out[c] = _int(col, 0 if c == "ts" else -1)
    return out


def build(
    trace: Trace,
    ranks: Iterable[int] | None = None,
    *,
    host_only: bool = False,
    columns: Iterable[str] = (),
) -> EventTree:
    """Read the tree of a store, with the lazy ``columns`` read in the same pass (use
    ``Trace.tree``, which caches it)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lazy = sorted({LAZY_COLUMNS[c] for c in columns})
    parts = None  # the ranks' parts only: a rank of a job of hundreds reads its own files
    if ranks is not None:
        wanted = {int(r) for r in ranks}
        parts = [int(s["part"]) for s in trace.sources
                 if s.get("rank") is not None and int(s["rank"]) in wanted]  # fmt: skip
    tb = trace.table("events", columns=[*COLUMNS, *lazy], parts=parts)
    keep = None
    if ranks is not None:
        keep = pc.is_in(tb["rank"], pa.array([int(r) for r in ranks], pa.int32()))
    if host_only:
        host = pc.equal(tb["device"], -1)
        keep = host if keep is None else pc.and_(keep, host)
    if keep is not None:
        keep = keep.combine_chunks() if isinstance(keep, pa.ChunkedArray) else keep
        tb = tb.filter(keep)
    ids = _int(tb["id"])
    order = None
    if len(ids) > 1 and not (np.diff(ids) > 0).all():
        order = pa.array(np.argsort(ids, kind="stable"))
        tb = tb.take(order)
        ids = _int(tb["id"])
    lv_codes, lv_values = dictionary_codes(tb["level"])
    lv_map = np.array([LEVEL_CODE.get(v, LEVEL_CODE["other"]) for v in lv_values], np.int8)
    level = lv_map[lv_codes] if len(lv_map) else np.zeros(len(ids), np.int8)
    name, names = dictionary_codes(tb["name"])
    return EventTree(
        ids=ids,
        part=_int(tb["part"]),
        rank=_int(tb["rank"]),
        device=_int(tb["device"]),
        level=level,
        name=name,
        names=names,
        parent=rows_in(ids, _int(tb["parent"]), is_sorted=True),
        stored_depth=_int(tb["depth"], 0),
        source=_Source(weakref.ref(trace), keep, order, parts),
        loaded=_convert(tb.select(lazy)),
    )

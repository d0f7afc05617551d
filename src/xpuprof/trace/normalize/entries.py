"""Entries that need more than a column copy: ``B``/``E`` pairs joined into one row, fields a
table has no column for folded into ``extra`` (so every key of every entry survives), counters
split by series, and metadata rows."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.schema import COUNTERS, METADATA
from xpuprof.trace.normalize.columns import as_dict, ints, isnull, rank_col


def match_begin_end(ev: pa.Table) -> pa.Table:
    """Pair ``B``/``E`` entries per thread into one row with phase ``B`` and a duration.

    The ``E`` entry's own index, category, name, args and extra keys move into the row's
    ``extra`` under ``"end"`` (args and extra as their original text), so nothing is lost;
    unmatched ``B`` keep a null ``dur``, unmatched ``E`` stay rows of their own.
    """
    be = pc.is_in(ev.column("ph"), pa.array(["B", "E"]))
    if not pc.any(be).as_py():
        return ev
    cols = ["index", "ph", "cat", "name", "pid", "tid", "ts", "args", "extra"]
    d = ev.filter(be).select(cols).to_pydict()
    order = sorted(range(len(d["index"])), key=lambda i: (d["ts"][i], d["index"][i]))
    stacks: dict[tuple[Any, Any], list[int]] = {}
    b_index, b_dur, b_extra, e_index = [], [], [], []
    for i in order:
        key = (d["pid"][i], d["tid"][i])
        if d["ph"][i] == "B":
            stacks.setdefault(key, []).append(i)
        elif stacks.get(key):
            b = stacks[key].pop()
            end: dict[str, Any] = {"index": d["index"][i]}
            for k in ("cat", "name"):
                if d[k][i] is not None:
                    end[k] = d[k][i]
            for k in ("args", "extra"):
                if d[k][i] is not None:
                    end[k] = msgspec.Raw(d[k][i].encode())
            merged = (
                msgspec.json.decode(d["extra"][b], type=dict[str, msgspec.Raw])
                if d["extra"][b]
                else {}
            )
            merged["end"] = end
            b_index.append(d["index"][b])
            b_dur.append(d["ts"][i] - d["ts"][b])
            b_extra.append(msgspec.json.encode(merged).decode())
            e_index.append(d["index"][i])
    if not b_index:
        return ev
    index = ints(ev["index"])  # rows are in source order, so index is sorted
    pos = np.searchsorted(index, np.array(b_index))
    dur = ints(ev["dur"]).copy()
    has_dur = ~isnull(ev["dur"])
    dur[pos] = b_dur
    has_dur[pos] = True
    extra = ev["extra"].to_pylist() if ev["extra"].null_count < len(ev) else [None] * len(ev)
    for p_, x in zip(pos.tolist(), b_extra, strict=True):
        extra[p_] = x
    ev = ev.set_column(ev.schema.get_field_index("dur"), "dur", pa.array(dur, mask=~has_dur))
    ev = ev.set_column(
        ev.schema.get_field_index("extra"), "extra", pa.array(extra, pa.large_string())
    )
    keep = np.ones(len(index), dtype=bool)
    keep[np.searchsorted(index, np.array(e_index))] = False
    return ev.filter(pa.array(keep))


def fold_leftovers(t: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """Keep fields a table has no column for (an async event's ``id``, a flow's ``dur``…) in
    ``extra``, as the source spelled them, so that every key of every entry survives."""
    present = [c for c in columns if t[c].null_count < len(t)]
    if not present:
        return t
    mask = np.zeros(len(t), dtype=bool)
    for c in present:
        mask |= ~isnull(t[c])
    rows = np.flatnonzero(mask)
    vals = {c: t[c].take(pa.array(rows)).to_pylist() for c in present}
    extra = t["extra"].to_pylist()
    for k, r in enumerate(rows.tolist()):
        obj = msgspec.json.decode(extra[r], type=dict[str, msgspec.Raw]) if extra[r] else {}
        for c in present:
            v = vals[c][k]
            if v is None:
                continue
            key = _RAW_KEY[c]
            if c == "dur":
                obj[key] = msgspec.Raw(_ns_to_us_text(v).encode())
            elif c == "flow_id" and v.lstrip("-").isdigit():
                obj[key] = msgspec.Raw(v.encode())
            else:
                obj[key] = v
        extra[r] = msgspec.json.encode(obj).decode()
    return t.set_column(
        t.schema.get_field_index("extra"), "extra", pa.array(extra, pa.large_string())
    )


def keep_in_extra(t: pa.Table, rows: np.ndarray, column: str) -> pa.ChunkedArray | pa.Array:
    """The ``extra`` column with the value of ``column`` in the masked ``rows`` added under
    its Chrome-trace key, as the source spelled it (``dur`` in microseconds), for a value the
    table's own column does not keep."""
    idx = np.flatnonzero(rows)
    vals = t[column].take(pa.array(idx)).to_pylist()
    extra = t["extra"].to_pylist()
    key = _RAW_KEY[column]
    for r, v in zip(idx.tolist(), vals, strict=True):
        obj = msgspec.json.decode(extra[r], type=dict[str, msgspec.Raw]) if extra[r] else {}
        obj[key] = msgspec.Raw(_ns_to_us_text(v).encode()) if column == "dur" else v
        extra[r] = msgspec.json.encode(obj).decode()
    return pa.array(extra, pa.large_string())


#: Raw column → the Chrome-trace key it came from.
_RAW_KEY = {"flow_id": "id", "bp": "bp", "scope": "s", "dur": "dur"}


def _ns_to_us_text(ns: int) -> str:
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    whole, frac = divmod(ns, 1000)
    return f"{sign}{whole}" if not frac else f"{sign}{whole}.{frac:03d}"


def counters_table(c: pa.Table, part: int, rank: int | None) -> pa.Table:
    """One row per (counter entry, series): a ``C`` entry's args hold one value per series."""
    if c.num_rows == 0:
        return COUNTERS.empty_table()
    d = c.select(["index", "pid", "tid", "cat", "name", "ts", "args", "extra"]).to_pydict()
    rows: dict[str, list[Any]] = {k: [] for k in COUNTERS.names}
    for i in range(c.num_rows):
        args = msgspec.json.decode(d["args"][i]) if d["args"][i] else {}
        series = list(args.items()) if isinstance(args, dict) and args else [(None, None)]
        for key, value in series:
            rows["part"].append(part)
            rows["index"].append(d["index"][i])
            rows["rank"].append(rank)
            rows["pid"].append(d["pid"][i])
            rows["tid"].append(d["tid"][i])
            rows["category"].append(d["cat"][i])
            rows["name"].append(d["name"][i])
            rows["series"].append(key)
            rows["ts"].append(d["ts"][i])
            is_num = isinstance(value, (int, float)) and not isinstance(value, bool)
            rows["value"].append(float(value) if is_num else None)
            rows["args"].append(d["args"][i])
            rows["extra"].append(d["extra"][i])
    return pa.Table.from_pydict(
        {k: pa.array(v, COUNTERS.field(k).type.value_type
                     if pa.types.is_dictionary(COUNTERS.field(k).type) else COUNTERS.field(k).type)
         for k, v in rows.items()}
    ).cast(COUNTERS)  # fmt: skip


def metadata_table(m: pa.Table, part: int, rank: int | None) -> pa.Table:
    n = m.num_rows
    return pa.Table.from_arrays(
        [
            pa.array(np.full(n, part, np.int32)),
            m["index"],
            rank_col(n, rank),
            as_dict(m["cat"]),
            as_dict(m["name"]),
            m["pid"],
            m["tid"],
            m["ts"],
            m["args"],
            m["extra"],
        ],
        schema=METADATA,
    )

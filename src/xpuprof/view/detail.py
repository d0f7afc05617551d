"""One event in full (its args, its ancestry across levels and tracks, its flows), and search.

``event`` reads the event's own row from the store (a point query on its id, which the Parquet
statistics narrow to one row group of one file) and walks its ancestry outward: up the store's
``parent`` column on its own track (the one nesting every analysis reads: the event tree,
``trace/tree.py``); from device work to the host call that launched it through a launch link
(``via: "launch"``), else through the same correlation id in the same file (``via:
"correlation"``, the event tree's ``host_calls`` rule: a runtime call first); up that call's
track; and, when no step span encloses the chain, to the step span with the event's step
number (``via: "step"``). Candidate ancestors on a track come from the tiers (events that
contain the start, shallower), so a chain is read from the store in one or two queries.

``search`` answers from the tiers' names (case-insensitive substring over the distinct names,
then each matching name's events in time order): no scan of the events.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from xpuprof.core.names import DEVICE_LEVELS, ID_SHIFT, LAUNCH_FLOW_KINDS, LEVELS
from xpuprof.core.raw import decode_json
from xpuprof.view.errors import NotFound, ViewError
from xpuprof.view.tiers import Tiers, open_tiers
from xpuprof.view.window import expand, integer

if TYPE_CHECKING:
    import duckdb

    from xpuprof.trace.trace import Trace

#: DuckDB's memory for the point queries of ``event`` and ``overlays``.
QUERY_MEMORY = "256MB"
#: Columns of an event read from the store (``args`` separately, for the event asked for).
ROW_COLUMNS = (
    "id",
    "part",
    "rank",
    "pid",
    "tid",
    "device",
    "stream",
    "level",
    "category",
    "name",
    "ts",
    "dur",
    "parent",
    "depth",
    "correlation",
    "step",
    "flops",
    "bytes",
)
#: Most ids per point query (an ``IN`` list).
CHUNK = 2_000
MAX_LIMIT = 10_000
_LEVEL_NAMES = np.array(LEVELS, dtype=object)


def connection(trace: Trace) -> duckdb.DuckDBPyConnection:
    """A cursor on this module's own DuckDB connection to the store's events and links (kept
    on the Trace): read-only on those files only, with a memory limit."""
    key = ("view", "duckdb")
    con = trace.memo.get(key)
    if con is None:
        import duckdb

        files = {t: trace.files(t) for t in ("events",)}
        con = duckdb.connect(config={"memory_limit": QUERY_MEMORY, "threads": 2})
        con.execute("SET enable_progress_bar = false")  # not on stdout (trace.Trace.con)
        allowed = ", ".join("'" + str(f).replace("'", "''") + "'" for fs in files.values()
                            for f in fs)  # fmt: skip
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        if files["events"]:
            con.execute(f"SET allowed_paths = [{allowed}]")
            con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet([{allowed}])")
        else:
            from xpuprof.core.schema import SCHEMAS

            con.register("_empty", SCHEMAS["events"].empty_table())
            con.execute("CREATE VIEW events AS SELECT * FROM _empty")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        con = trace.memo.setdefault(key, con)
    return con.cursor()


def _plain(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def rows(trace: Trace, ids: Any, columns: tuple[str, ...] = ROW_COLUMNS, *,
         args_of: int | None = None) -> dict[int, dict[str, Any]]:  # fmt: skip
    """Store rows of the given event ids (absent ids are left out); with ``args_of``, that
    event's ``args`` text too (the others': None)."""
    ids = sorted({int(i) for i in ids if i is not None and int(i) >= 0})
    out: dict[int, dict[str, Any]] = {}
    if not ids:
        return out
    cur = connection(trace)
    try:
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i : i + CHUNK]
            cols = [*columns, *([f"CASE WHEN id = {int(args_of)} THEN args END"]
                                if args_of is not None else [])]  # fmt: skip
            names = [*columns, *(["args"] if args_of is not None else [])]
            q = (f"SELECT {', '.join(cols)} FROM events "
                 f"WHERE id IN ({', '.join(map(str, chunk))})")  # fmt: skip
            for r in cur.execute(q).fetchall():
                d = {c: _plain(v) for c, v in zip(names, r, strict=True)}
                out[d["id"]] = d
    finally:
        cur.close()
    return out


def where(tv: Tiers, row: dict[str, Any]) -> tuple[int | None, int]:
    """(track, depth) of a store row."""
    track = tv.track_of(row["part"], row["device"], row["pid"], row["tid"], row["stream"])
    return track, int(row["depth"] or 0)


def brief(tv: Tiers, row: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An event as ancestry, flows and overlays list it (an instant: ``dur`` 0, as drawn)."""
    track, depth = where(tv, row)
    return {"id": row["id"], "name": row["name"], "level": row["level"], "ts": row["ts"],
            "dur": row["dur"] or 0, "track": track, "depth": depth, **extra}  # fmt: skip


def _enclosing(tv: Tiers, track: int, ts: int, end: int, depth: int) -> list[int]:
    """Ids of the events of a track shallower than ``depth`` that contain [ts, end): the
    candidates for the chain of parents (read from the store together)."""
    out: list[int] = []
    if depth <= 0:
        return out
    for c in range(tv.classes):
        a, e = tv.segment(c, track)
        if a == e:
            continue
        lo = ts - int(tv.maxdur[c * tv.n_tracks + track])
        x, y = np.searchsorted(tv.ev["ts"][a:e], [lo, ts + 1])
        if y <= x:
            continue
        r = np.arange(a + x, a + y)
        ok = (tv.ev["depth"][r] < depth) & (tv.ev["ts"][r] + tv.ev["dur"][r] >= end)
        out.extend(np.asarray(tv.ev["id"][r[ok]]).tolist())
    return out


class _Rows:
    """Store rows by id, read in as few queries as possible: ``plan`` the ids that will be
    needed, then ``get`` reads whatever is missing."""

    def __init__(self, trace: Trace, tv: Tiers) -> None:
        self.trace, self.tv = trace, tv
        self.known: dict[int, dict[str, Any]] = {}
        self.wanted: set[int] = set()

    def plan(self, ids: Any) -> None:
        self.wanted.update(int(i) for i in ids)

    def get(self, *ids: int) -> list[dict[str, Any] | None]:
        missing = (self.wanted | set(ids)) - set(self.known)
        if missing & set(ids):
            self.known.update(rows(self.trace, missing))
            self.wanted.clear()
        return [self.known.get(i) for i in ids]

    def near(self, row: int) -> None:
        """Plan the candidate parents of a tier row (its own track)."""
        tv = self.tv
        track = int(tv.track_of_rows([row])[0])
        ts, dur, depth = (int(tv.ev[c][row]) for c in ("ts", "dur", "depth"))
        self.plan(_enclosing(tv, track, ts, ts + dur, depth))


def _parents(got: _Rows, row: dict[str, Any]) -> list[dict]:
    """The chain of parents of a row on its track, innermost first."""
    chain, seen, cur = [], {row["id"]}, row
    while cur["parent"] is not None and cur["parent"] not in seen:
        (nxt,) = got.get(cur["parent"])
        if nxt is None:
            break
        cur = nxt
        seen.add(cur["id"])
        chain.append(cur)
    return chain


def _launch_links(tv: Tiers, event_id: int) -> list[int]:
    """Tier rows of the host calls linked to an event by a launch link, in link order."""
    lo, hi = np.searchsorted(tv.links_dst_sorted, [event_id, event_id + 1])
    out = []
    for r in np.asarray(tv.links_by_dst[lo:hi]).tolist():
        src = int(tv.links["src_row"][r])
        if (tv.kinds[tv.links["kind"][r]] in LAUNCH_FLOW_KINDS
                and tv.kind[int(tv.track_of_rows([src])[0])] == "thread"):  # fmt: skip
            out.append(src)
    return out


def _by_correlation(trace: Trace, row: dict[str, Any]) -> int | None:
    """The host call with the device event's correlation id in its file (a runtime call
    first, then the lowest id): the event tree's ``host_calls`` rule."""
    if row["correlation"] is None:
        return None
    cur = connection(trace)
    try:
        q = (f"SELECT id FROM events WHERE part = {int(row['part'])} AND "
             f"correlation = {int(row['correlation'])} AND device < 0 "
             "ORDER BY (level = 'runtime') DESC, id LIMIT 1")  # fmt: skip
        hit = next(iter(cur.execute(q).fetchall()), None)
    finally:
        cur.close()
    return None if hit is None else int(hit[0])


def _steps_around(tv: Tiers, part: int, ts: int) -> list[int]:
    """Ids of the step spans of a part that contain ``ts``."""
    r = tv.steps["row"][tv.steps["part"] == part]
    if not len(r):
        return []
    a = np.asarray(tv.ev["ts"][r])
    ok = (a <= ts) & (a + np.asarray(tv.ev["dur"][r]) > ts)
    return np.asarray(tv.ev["id"][r[ok]]).tolist()


def _step(got: _Rows, tv: Tiers, row: dict[str, Any]) -> dict[str, Any] | None:
    """The step span of the row's part with the row's step number."""
    if row["step"] is None:
        return None
    hit = np.flatnonzero((tv.steps["part"] == row["part"]) & (tv.steps["step"] == row["step"]))
    if not hit.size:
        return None
    return got.get(int(tv.ev["id"][tv.steps["row"][hit[0]]]))[0]


def ancestry(got: _Rows, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The event's ancestors, outward (module docstring), each with ``via``."""
    tv = got.tv
    out = [(r, "parent") for r in _parents(got, row)]
    device = [r for r in (row, *(r for r, _ in out)) if r["level"] in DEVICE_LEVELS]
    launched = None
    if device:
        dev = device[-1]
        for src in _launch_links(tv, dev["id"]):
            (call,) = got.get(int(tv.ev["id"][src]))
            if call is not None:
                launched = (call, "launch")
                break
        if launched is None:
            cid = _by_correlation(got.trace, dev)
            call = got.get(cid)[0] if cid is not None else None
            launched = (call, "correlation") if call is not None else None
    if launched is not None:
        out.append(launched)
        out += [(r, "parent") for r in _parents(got, launched[0])]
    if not any(r["level"] == "step" for r, _ in out) and row["level"] != "step":
        base = launched[0] if launched is not None and row["step"] is None else row
        step = _step(got, tv, base)
        if step is not None and step["id"] != row["id"]:
            out.append((step, "step"))
    return [brief(tv, r, via=via) for r, via in out]


def event_flows(got: _Rows, event_id: int) -> list[dict[str, Any]]:
    """Links into and out of an event, with the event at the other end."""
    tv = got.tv
    lo, hi = np.searchsorted(tv.links["src"], [event_id, event_id + 1])
    lk_out = tv.ends(np.arange(lo, hi, dtype=np.int64))
    lo, hi = np.searchsorted(tv.links_dst_sorted, [event_id, event_id + 1])
    lk_in = tv.ends(np.asarray(tv.links_by_dst[lo:hi], np.int64))
    ends = [(k, "out", e) for k, e in zip(lk_out["kind"], lk_out["dst"].tolist(), strict=True)]
    ends += [(k, "in", e) for k, e in zip(lk_in["kind"], lk_in["src"].tolist(), strict=True)]
    other = got.get(*(e for _, _, e in ends)) if ends else []
    return [brief(tv, o, kind=str(k), direction=d)
            for (k, d, _), o in zip(ends, other, strict=True) if o is not None]  # fmt: skip


def _plan(got: _Rows, event_id: int, row: int) -> None:
    """Every id the answer is likely to need, found in the tiers, so that the store is read
    once: parents on the event's track, the launching call and its parents, the step spans
    around them, the other ends of the event's links."""
    tv = got.tv
    got.near(row)
    calls = _launch_links(tv, event_id)[:1]
    for src in calls:
        got.plan([int(tv.ev["id"][src])])
        got.near(src)
    part = event_id >> ID_SHIFT
    for r in (row, *calls):
        got.plan(_steps_around(tv, part, int(tv.ev["ts"][r])))
    lo, hi = np.searchsorted(tv.links["src"], [event_id, event_id + 1])
    got.plan(tv.ends(np.arange(lo, hi, dtype=np.int64))["dst"].tolist())
    lo, hi = np.searchsorted(tv.links_dst_sorted, [event_id, event_id + 1])
    got.plan(tv.ends(np.asarray(tv.links_by_dst[lo:hi], np.int64))["src"].tolist())


def event(trace: Trace, event_id: Any, *, sim: bool = False) -> dict[str, Any]:
    """One event: its columns, decoded args, ancestry (outward, each with ``via``) and flows
    (``docs/view.md``). ``NotFound`` when the store has no such id. With ``sim``, also
    ``simulated``: where the replay put it (:func:`xpuprof.view.simulated.event`; None when it
    was not replayed)."""
    event_id = integer("id", event_id)
    if event_id < 0:
        raise ViewError(f"event ids are not negative ({event_id})")
    tv = open_tiers(trace)
    at = tv.row_of(event_id)
    if at is None:
        raise NotFound(f"no event with id {event_id} in this trace")
    got = _Rows(trace, tv)
    _plan(got, event_id, at)
    got.known.update(rows(trace, got.wanted | {event_id}, args_of=event_id))
    got.wanted.clear()
    row = got.known.get(event_id)
    if row is None:
        raise NotFound(f"no event with id {event_id} in this trace")
    args = row.pop("args", None)
    decoded = decode_json(args, default=args)
    track, depth = where(tv, row)
    keep = ("id", "name", "level", "category", "rank", "pid", "tid", "device", "stream")
    doc = {
        **{k: row[k] for k in keep}, "track": track, "depth": depth, "ts": row["ts"],
        "dur": row["dur"], "step": row["step"], "flops": row["flops"], "bytes": row["bytes"],
        "args": {} if decoded is None else decoded,
        "ancestry": ancestry(got, row),
        "flows": event_flows(got, event_id),
    }  # fmt: skip
    if sim:
        from xpuprof.view import simulated

        doc["simulated"] = simulated.event(trace, tv, event_id, row)
    return doc


def search(trace: Trace, text: Any, *, limit: Any = 100) -> dict[str, Any]:
    """Events whose name contains ``text`` (ignoring case): how many (``total``) and the first
    ``limit`` in time order (ties: by id)."""
    if not isinstance(text, str) or not text:
        raise ViewError(f"search text must be a non-empty string, not {text!r}")
    if len(text) > 1000:
        raise ViewError("search text is longer than 1,000 characters")
    limit = integer("limit", limit)
    if not 0 <= limit <= MAX_LIMIT:
        raise ViewError(f"limit must be 0..{MAX_LIMIT}, not {limit}")
    tv = open_tiers(trace)
    q = text.lower()
    codes = np.array([i for i, n in enumerate(tv.lower_names) if q in n], np.int64)
    if not codes.size:
        return {"total": 0, "matches": []}
    lo, hi = tv.name_off[codes], tv.name_off[codes + 1]
    total = int((hi - lo).sum())
    r = np.asarray(tv.name_rows[expand(lo, np.minimum(hi, lo + limit))])
    ev = tv.ev
    r = r[np.lexsort((np.asarray(ev["id"][r]), np.asarray(ev["ts"][r])))][:limit]
    cols = {c: np.asarray(ev[c][r]) for c in ("id", "ts", "dur", "depth", "name", "level")}
    cols["track"] = tv.track_of_rows(r)
    names = tv.names_arr[cols["name"]].tolist()
    levels = _LEVEL_NAMES[cols["level"]].tolist()
    matches = [
        {"id": i, "name": n, "level": lv, "ts": t, "dur": d, "track": tr, "depth": dp}
        for i, n, lv, t, d, tr, dp in zip(cols["id"].tolist(), names, levels, cols["ts"].tolist(),
                                          cols["dur"].tolist(), cols["track"].tolist(),
                                          cols["depth"].tolist(), strict=True)
    ]  # fmt: skip
    return {"total": total, "matches": matches}

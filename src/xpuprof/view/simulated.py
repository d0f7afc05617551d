"""The replay's simulated timeline in the viewer: one track beside each replayed thread and
stream (``docs/view.md``, "Simulated tracks").

The identity replay of the whole store (:func:`xpuprof.sim.replay`: every rank and step,
measured costs) gives each replayed event a simulated start and duration on its part's own
clock. Those events are written as a store of their own — the replayed rows of the events
table with ``ts``/``dur`` replaced by ``sim_ts``/``sim_dur``, the links between them, the
metadata (thread and process names) — and that store gets zoom tiers like any other, so every
window on the simulated timeline is answered as a measured one is: in bounded time and size,
from memory-mapped files, whatever the size of the trace. The event ids are the measured
ones, so a simulated span leads to its measured event's args, ancestry and flows.

**Where.** Beside the store's own tiers: ``STORE/view/<digest>.replay-<sim>/`` (``digest`` the
tiers' digest of the store, ``sim`` a digest of this layout and of the simulator's code, so a
new import or a changed simulator gives a new folder, and the one it replaces is removed), or
in the user cache when the store cannot be written. Built in a hidden temporary folder and
renamed into place (a reader sees a whole store or none); removed with the tiers when the store
is re-imported; always safe to delete.

**What-if timelines.** A what-if (:func:`xpuprof.sim.whatif.whatif`: the store replayed with
changes) gives a simulated start and duration to the same events, from its changed schedule
(``WhatIf.time``); :func:`sim_trace` with ``changes`` writes them as a store the same way, in
``STORE/view/<digest>.replay-<sim>.whatif-<changes>/`` (``changes`` a digest of the change
text as :func:`canonical` writes it), labelled ``what-if: <label>``. The whole store is
replayed (every rank and step), as for the identity replay. At most :data:`WHATIF_KEEP` of
them stay beside a store (the least recently used go first) and a process keeps at most
:data:`WHATIF_OPEN` open per store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xpuprof.core.errors import StoreError
from xpuprof.view import tiers as tr
from xpuprof.view.errors import ViewError

if TYPE_CHECKING:
    import pyarrow as pa

    from xpuprof.trace.trace import Trace
    from xpuprof.view.tiers import Tiers

#: Bumped whenever the simulated store's layout changes.
FORMAT = 1
#: What a simulated track's label starts with.
PREFIX = "sim: "
#: What a what-if's simulated track's label starts with.
WHATIF_PREFIX = "what-if: "
#: The format name written in the simulated store's sources.
SOURCE_FORMAT = "xpuprof-replay"
#: What-if timelines kept beside a store; the least recently used beyond are removed.
WHATIF_KEEP = 8
#: What-if timelines a process keeps open per store (each holds its tiers' mapped files).
WHATIF_OPEN = 4


@functools.lru_cache(maxsize=1)
def simulator_code() -> str:
    """A digest of the simulator's source files, its sub-packages included (the cost models
    and the what-if transforms): the simulated timelines depend on them."""
    root = Path(str(files("xpuprof.sim")))
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def canonical(changes: str | Iterable[str]) -> str:
    """What-if changes as one text: each parsed (:func:`xpuprof.sim.whatif.parse`: a change
    it cannot read is an error saying why), joined by ``; `` — the key of their timeline."""
    from xpuprof.sim.whatif import parse

    texts = [changes] if isinstance(changes, str) else list(changes)
    parts = [t.strip() for x in texts for t in str(x).split(";") if t.strip()]
    if not parts:
        raise ViewError("whatif: name a change, e.g. host-gaps=0.5 (docs/whatif.md)")
    return "; ".join(parse(t).text for t in parts)


def folder_name(trace: Trace, changes: str | None = None) -> str:
    """``<tiers digest>.replay-<sim digest>``: the simulated store's folder name; with
    ``changes`` (as :func:`canonical` writes them), ``….whatif-<digest of the changes>``."""
    d = tr.digest(trace)
    sim = hashlib.sha256(json.dumps([FORMAT, d, simulator_code()]).encode()).hexdigest()[:12]
    if not changes:
        return f"{d}.replay-{sim}"
    return f"{d}.replay-{sim}.whatif-{hashlib.sha256(changes.encode()).hexdigest()[:12]}"


def locate(trace: Trace, changes: str | None = None) -> Path:
    """The simulated store of ``trace`` (with ``changes``: of that what-if), built first when
    there is none."""
    from xpuprof.trace.store import MANIFEST

    name = folder_name(trace, changes)
    what = f"the what-if timeline of {changes!r}" if changes else "the simulated timeline"
    path = tr.find_or_build(trace, name, MANIFEST, lambda tmp: build(trace, tmp, changes),
                            lambda base: _clean(base, name), what)  # fmt: skip
    if changes:  # used now: the last to be removed (_clean keeps the most recently used)
        with contextlib.suppress(OSError):
            os.utime(path)
    return path


def _clean(base: Path, keep: str) -> None:
    """Remove the simulated timelines of the same tiers made by another simulator (stale),
    and the least recently used what-if timelines beyond :data:`WHATIF_KEEP`."""
    digest, _, rest = keep.partition(".replay-")
    sim = rest.split(".")[0]
    whatifs = []
    with contextlib.suppress(OSError):
        for p in base.iterdir():
            if p.name == keep or not p.name.startswith(digest + ".replay-") or not p.is_dir():
                continue
            if p.name.partition(".replay-")[2].split(".")[0] != sim:
                tr.discard(p)
            elif ".whatif-" in p.name:
                whatifs.append(p)
    if ".whatif-" in keep:
        whatifs.append(base / keep)
    whatifs.sort(key=_used, reverse=True)
    for p in whatifs[WHATIF_KEEP:]:
        if p.name != keep:
            tr.discard(p)


def _used(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _ids_in(col: pa.ChunkedArray | pa.Array, ids: np.ndarray) -> np.ndarray:
    """Whether each value of an id column is in the sorted array ``ids``."""
    v = np.asarray(col.to_numpy(zero_copy_only=False), np.float64)
    ok = ~np.isnan(v)
    out = np.zeros(len(v), bool)
    if len(ids):
        x = v[ok].astype(np.int64)
        pos = np.clip(np.searchsorted(ids, x), 0, len(ids) - 1)
        out[ok] = ids[pos] == x
    return out


def build(trace: Trace, out: Path, changes: str | None = None) -> dict[str, Any]:
    """Replay ``trace`` (with ``changes``: the what-if's changed schedule) and write its
    simulated timeline as a store in the folder ``out``; its manifest."""
    import pyarrow as pa

    from xpuprof.core.names import TABLES
    from xpuprof.sim import replay
    from xpuprof.trace import store as st

    if changes:
        from xpuprof.sim.whatif import whatif

        w = whatif(trace, [t for t in changes.split(";") if t.strip()])
        # the baseline's events and graph at the changed schedule's times
        rp = dataclasses.replace(w.baseline, time=w.time)
        about = {"whatif": {"changes": changes, "facts": w.result().facts,
                            "notes": list(w.notes)}}  # fmt: skip
    else:
        rp = replay(trace)
        about = {"replay": {"facts": rp.result().facts, "notes": list(rp.notes)}}
    ev = rp.events().sort_values("id")
    ids = ev["id"].to_numpy(np.int64)
    sim_ts, sim_dur = ev["sim_ts"].to_numpy(np.int64), ev["sim_dur"].to_numpy(np.int64)
    tag = st.unique_tag()
    sources = []
    for s in trace.sources:
        part = int(s["part"])
        rows = {t: 0 for t in TABLES}
        paths: dict[str, str | None] = dict.fromkeys(TABLES)
        levels: dict[str, int] = {}
        e = trace.table("events", filters=[("part", "=", part)])
        e = e.filter(pa.array(_ids_in(e["id"], ids)))
        if e.num_rows:
            pos = np.searchsorted(ids, np.asarray(e["id"].to_numpy(), np.int64))
            e = e.set_column(e.schema.get_field_index("ts"), "ts", pa.array(sim_ts[pos]))
            dur = pa.array(sim_dur[pos], mask=np.asarray(e["dur"].is_null()))
            e = e.set_column(e.schema.get_field_index("dur"), "dur", dur)
            counts = e["level"].cast(pa.string()).value_counts().to_pylist()
            levels = {str(c["values"]): int(c["counts"]) for c in counts}
        lk = trace.table("links", filters=[("part", "=", part)])
        lk = lk.filter(pa.array(_ids_in(lk["src"], ids) & _ids_in(lk["dst"], ids)))
        md = trace.table("metadata", filters=[("part", "=", part)])
        for table, t in (("events", e), ("links", lk), ("metadata", md)):
            if t.num_rows:
                rel = st.part_file(table, part, tag)
                st.write_table(t, out / rel)
                paths[table], rows[table] = rel, t.num_rows
        sources.append({"path": s["path"], "part": part, "rank": s.get("rank"),
                        "files": paths, "rows": rows, "levels": levels,
                        "read": {"total": rows["events"]}, "size": None,
                        "format": SOURCE_FORMAT, "host": s.get("host"),
                        "meta": s.get("meta") or {}})  # fmt: skip
    manifest = st.new_manifest(sources)
    manifest |= about
    st.write_manifest(out, manifest)
    return manifest


def sim_trace(trace: Trace, changes: str | None = None) -> Trace:
    """The simulated store of ``trace`` (with ``changes``, as :func:`canonical` writes them:
    of that what-if) opened and kept on the Trace, built on first use; a store found damaged
    is built again once."""
    from xpuprof.trace.trace import Trace

    if not changes:
        return tr.built_once(trace, "sim", locate, Trace, (StoreError,))
    lock = trace.memo.setdefault(("view", "whatif-lock"), threading.Lock())
    with lock:
        opened: OrderedDict[str, Trace] = trace.memo.setdefault(("view", "whatif"), OrderedDict())
        got = opened.get(changes)
        if got is not None:
            opened.move_to_end(changes)
            return got
        path = locate(trace, changes)
        try:
            got = Trace(path)
        except StoreError:
            tr.discard(path)
            got = Trace(locate(trace, changes))
        opened[changes] = got
        while len(opened) > WHATIF_OPEN:
            opened.popitem(last=False)[1].close()
        return got


def sim_tiers(trace: Trace, changes: str | None = None) -> Tiers:
    """The zoom tiers of the simulated timeline of ``trace`` (with ``changes``: of that
    what-if)."""
    return tr.open_tiers(sim_trace(trace, changes))


def tracks(trace: Trace, tv: Tiers, changes: str | None = None) -> dict[str, Any]:
    """The measured tracks of ``tv`` (the tiers of ``trace``) with, after each replayed thread
    and stream, its simulated twin: numbered after every measured track (``len(measured) +``
    its number in the simulated tiers), labelled ``sim: <label>`` (with ``changes``: the
    what-if's, ``what-if: <label>``), in its twin's group, with ``sim`` true and ``of`` the
    twin's number. ``t0``/``t1`` span both timelines; ``origin`` is the measured ``t0`` (times
    on the wire stay the same with or without the simulated tracks)."""
    st = sim_tiers(trace, changes)
    prefix = WHATIF_PREFIX if changes else PREFIX
    n = tv.n_tracks
    twins: dict[int, list[dict[str, Any]]] = {}
    orphans = []
    for t in st.tracks:
        if t["kind"] == "counter":
            continue
        of = tv.track_of_key.get(tuple(t["key"]))
        twin = tv.public[of] if of is not None else None
        rec = {k: v for k, v in t.items() if k != "key"}
        rec |= {"track": n + t["track"], "label": prefix + str(t["label"]), "sim": True,
                "of": of, "group": twin["group"] if twin else t["group"]}  # fmt: skip
        (twins.setdefault(of, []) if of is not None else orphans).append(rec)
    out = []
    for t in tv.public:
        out.append(dict(t))
        out += twins.get(t["track"], [])
    out += orphans
    t0, t1 = tv.meta["t0"], tv.meta["t1"]
    if st.meta["events"]:
        t0, t1 = min(t0, st.meta["t0"]), max(t1, st.meta["t1"])
    return {"t0": t0, "t1": t1, "origin": tv.meta["t0"], "tracks": out,
            "simulated": {"tracks": sum(1 for t in out if t.get("sim")),
                          "events": int(st.meta["events"]), "whatif": changes or None}}  # fmt: skip


def event(trace: Trace, tv: Tiers, event_id: int, measured: dict[str, Any],
          changes: str | None = None) -> dict[str, Any] | None:  # fmt: skip
    """Where the replay (with ``changes``: the what-if) put the event: its simulated ``ts``,
    ``dur`` (0 for an instant), ``track`` (numbered as :func:`tracks` numbers it) and
    ``depth``, and how far it moved from its measured place (``start_deviation_ns``,
    ``duration_change_ns``); None when it was not replayed."""
    st = sim_tiers(trace, changes)
    row = st.row_of(event_id)
    if row is None:
        return None
    ts, dur = int(st.ev["ts"][row]), int(st.ev["dur"][row])
    return {"ts": ts, "dur": dur, "track": tv.n_tracks + int(st.track_of_rows([row])[0]),
            "depth": int(st.ev["depth"][row]),
            "start_deviation_ns": ts - int(measured["ts"]),
            "duration_change_ns": dur - int(measured["dur"] or 0)}  # fmt: skip


# ------------------------------------------------------------------- the what-if's questions
# The viewer's three questions with a what-if's simulated tracks instead of the identity
# replay's (``xpuprof.ui.tools.viewer_*`` with ``whatif``): the changes are read first, so a bad
# one is a one-line error before anything is built.


def whatif_tracks(trace: Trace, changes: str | Iterable[str]) -> dict[str, Any]:
    """:func:`xpuprof.view.tracks` with the what-if's simulated twins (:func:`tracks`)."""
    return tracks(trace, tr.open_tiers(trace), canonical(changes))


def whatif_event(trace: Trace, event_id: Any, changes: str | Iterable[str]) -> dict[str, Any]:
    """:func:`xpuprof.view.event` with ``simulated``: where the what-if put it (None: not
    replayed)."""
    from xpuprof.view.detail import event as measured_event

    key = canonical(changes)
    doc = measured_event(trace, event_id)
    doc["simulated"] = event(trace, tr.open_tiers(trace), int(doc["id"]), doc, key)
    return doc


def whatif_window(trace: Trace, ts0: Any, ts1: Any, width_px: Any, tracks: Iterable[Any] | None,
                  changes: str | Iterable[str]) -> dict[str, Any]:  # fmt: skip
    """:func:`xpuprof.view.window` with the what-if's simulated tracks, numbered as
    :func:`whatif_tracks` numbers them."""
    from xpuprof.view.window import MAX_WIDTH, integer

    start = time.perf_counter()
    ts0, ts1, width = integer("ts0", ts0), integer("ts1", ts1), integer("width_px", width_px)
    if ts1 <= ts0:
        raise ViewError(f"the window must end after it starts (ts0={ts0}, ts1={ts1})")
    if not 1 <= width <= MAX_WIDTH:
        raise ViewError(f"width_px must be 1..{MAX_WIDTH}, not {width}")
    key = canonical(changes)
    return both(tr.open_tiers(trace), sim_tiers(trace, key), ts0, ts1, width, tracks, start)


def both(tv: Tiers, st: Tiers, ts0: int, ts1: int, width: int, tracks: Iterable[Any] | None,
         start: float) -> dict[str, Any]:  # fmt: skip
    """One window on the measured tiers ``tv`` and the simulated tiers ``st`` (tracks of
    ``st`` numbered after those of ``tv``): each set asked for its own tracks, with half the
    item budget when both are asked, the answers merged (``start``: when the question came,
    for ``elapsed_ms``)."""
    from xpuprof.view.errors import NotFound
    from xpuprof.view.window import BUDGET, answer, integer, select

    n = tv.n_tracks
    if tracks is None:
        mine, theirs = select(tv, None), select(st, None)
    else:
        if isinstance(tracks, (str, bytes)) or not isinstance(tracks, Iterable):
            raise ViewError(f"tracks must be a list of track numbers, not {tracks!r}")
        ids = np.array([integer("track", t) for t in tracks], np.int64)
        bad = ids[(ids < 0) | (ids >= n + st.n_tracks)]
        if len(bad):
            raise NotFound(f"no track {int(bad[0])} in this trace with its simulated tracks "
                           f"(tracks are 0..{n + st.n_tracks - 1})")  # fmt: skip
        mine, theirs = np.unique(ids[ids < n]), np.unique(ids[ids >= n] - n)
    budget = BUDGET // 2 if len(mine) and len(theirs) else BUDGET
    docs = [answer(tiers, ts0, ts1, width, sel, budget, start)
            for tiers, sel in ((tv, mine), (st, theirs)) if len(sel)]  # fmt: skip
    if not docs:  # no track asked for
        return answer(tv, ts0, ts1, width, mine, BUDGET, start)
    if len(docs) == 1 and len(mine):
        return docs[0]
    if len(docs) == 1:
        return shifted(docs[0], n)
    return merged(docs[0], shifted(docs[1], n), start)


def shifted(doc: dict[str, Any], n: int) -> dict[str, Any]:
    """A simulated window's answer with its track numbers moved after the ``n`` measured."""
    moved = (("events", ("track",)), ("summaries", ("track",)), ("counters", ("track",)),
             ("flows", ("src_track", "dst_track")))  # fmt: skip
    for block, keys in moved:
        for k in keys:
            doc[block][k] = [t + n for t in doc[block][k]]
    doc["tier"] = "simulated: " + doc["tier"]
    return doc


def merged(a: dict[str, Any], b: dict[str, Any], start: float) -> dict[str, Any]:
    """The measured and the simulated answers of one window as one."""
    out = dict(a)
    for block in ("events", "summaries", "counters", "flows"):
        out[block] = {k: a[block][k] + b[block].get(k, []) for k in a[block]}
    out["flows_total"] = a["flows_total"] + b["flows_total"]
    out["flows_cut"] = a["flows_cut"] or b["flows_cut"]
    out["items"] = a["items"] + b["items"]
    out["summary_px"] = max(a["summary_px"], b["summary_px"])
    out["tier"] = f"{a['tier']}; {b['tier']}"
    out["elapsed_ms"] = round((time.perf_counter() - start) * 1000, 3)
    return out

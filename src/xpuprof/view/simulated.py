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
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xpuprof.core.errors import StoreError
from xpuprof.view import tiers as tr

if TYPE_CHECKING:
    import pyarrow as pa

    from xpuprof.trace.trace import Trace
    from xpuprof.view.tiers import Tiers

#: Bumped whenever the simulated store's layout changes.
FORMAT = 1
#: What a simulated track's label starts with.
PREFIX = "sim: "
#: The format name written in the simulated store's sources.
SOURCE_FORMAT = "xpuprof-replay"


@functools.lru_cache(maxsize=1)
def simulator_code() -> str:
    """A digest of the simulator's source files: the simulated timeline depends on them."""
    h = hashlib.sha256()
    for f in sorted(files("xpuprof.sim").iterdir(), key=lambda p: p.name):
        if f.name.endswith(".py"):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def folder_name(trace: Trace) -> str:
    """``<tiers digest>.replay-<sim digest>``: the simulated store's folder name."""
    d = tr.digest(trace)
    sim = hashlib.sha256(json.dumps([FORMAT, d, simulator_code()]).encode()).hexdigest()[:12]
    return f"{d}.replay-{sim}"


def locate(trace: Trace) -> Path:
    """The simulated store of ``trace``, built first when there is none."""
    from xpuprof.trace.store import MANIFEST

    name = folder_name(trace)
    return tr.find_or_build(trace, name, MANIFEST, lambda tmp: build(trace, tmp),
                            lambda base: _clean(base, name), "the simulated timeline")  # fmt: skip


def _clean(base: Path, keep: str) -> None:
    """Remove the simulated timelines of the same tiers made by another simulator (stale)."""
    digest = keep.split(".replay-")[0]
    with contextlib.suppress(OSError):
        for p in base.iterdir():
            if p.name != keep and p.name.startswith(digest + ".replay-") and p.is_dir():
                tr.discard(p)


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


def build(trace: Trace, out: Path) -> dict[str, Any]:
    """Replay ``trace`` and write its simulated timeline as a store in the folder ``out``;
    its manifest."""
    import pyarrow as pa

    from xpuprof.core.names import TABLES
    from xpuprof.sim import replay
    from xpuprof.trace import store as st

    rp = replay(trace)
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
    manifest["replay"] = {"facts": rp.result().facts, "notes": list(rp.notes)}
    st.write_manifest(out, manifest)
    return manifest


def sim_trace(trace: Trace) -> Trace:
    """The simulated store of ``trace`` opened (kept on the Trace), built on first use; a
    store found damaged is built again once."""
    from xpuprof.trace.trace import Trace

    return tr.built_once(trace, "sim", locate, Trace, (StoreError,))


def sim_tiers(trace: Trace) -> Tiers:
    """The zoom tiers of the simulated timeline of ``trace``."""
    return tr.open_tiers(sim_trace(trace))


def tracks(trace: Trace, tv: Tiers) -> dict[str, Any]:
    """The measured tracks of ``tv`` (the tiers of ``trace``) with, after each replayed thread
    and stream, its simulated twin: numbered after every measured track (``len(measured) +``
    its number in the simulated tiers), labelled ``sim: <label>``, in its twin's group, with
    ``sim`` true and ``of`` the twin's number. ``t0``/``t1`` span both timelines; ``origin`` is
    the measured ``t0`` (times on the wire stay the same with or without the simulated
    tracks)."""
    st = sim_tiers(trace)
    n = tv.n_tracks
    twins: dict[int, list[dict[str, Any]]] = {}
    orphans = []
    for t in st.tracks:
        if t["kind"] == "counter":
            continue
        of = tv.track_of_key.get(tuple(t["key"]))
        twin = tv.public[of] if of is not None else None
        rec = {k: v for k, v in t.items() if k != "key"}
        rec |= {"track": n + t["track"], "label": PREFIX + str(t["label"]), "sim": True,
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
                          "events": int(st.meta["events"])}}  # fmt: skip


def event(trace: Trace, tv: Tiers, event_id: int,
          measured: dict[str, Any]) -> dict[str, Any] | None:  # fmt: skip
    """Where the replay put the event: its simulated ``ts``, ``dur`` (0 for an instant),
    ``track`` (numbered as :func:`tracks` numbers it) and ``depth``, and how far it moved
    (``start_deviation_ns``, ``duration_change_ns``); None when it was not replayed."""
    st = sim_tiers(trace)
    row = st.row_of(event_id)
    if row is None:
        return None
    ts, dur = int(st.ev["ts"][row]), int(st.ev["dur"][row])
    return {"ts": ts, "dur": dur, "track": tv.n_tracks + int(st.track_of_rows([row])[0]),
            "depth": int(st.ev["depth"][row]),
            "start_deviation_ns": ts - int(measured["ts"]),
            "duration_change_ns": dur - int(measured["dur"] or 0)}  # fmt: skip

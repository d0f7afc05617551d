"""Where the zoom tiers live, how they appear atomically, and how a query reads them.

The tiers of a store sit next to it, in ``STORE/view/<digest>/`` (``digest``: of the tier
format and of the manifest's files, whose names carry a random tag per import, and sizes), so a
re-import gives a new digest and the old folder is removed as stale. They are built in a
hidden temporary folder beside the final one and renamed into place: a reader sees a whole
folder or none. Two processes building at once each build their own; the first rename wins,
the other one's rename fails on the folder already there and it uses the winner's. When the
store cannot be written (a read-only mount, someone else's store), the tiers go to the user's
cache, ``$XDG_CACHE_HOME/xpuprof/view/<digest>`` (``~/.cache`` by default). Deleting the folder
is always safe: the next question rebuilds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xpuprof.core.errors import StoreError
from xpuprof.core.names import ID_SHIFT
from xpuprof.trace.lock import TEMP_NAME, abandoned, temp_name
from xpuprof.view import build as bd
from xpuprof.view.levels import SUM_COLUMNS

if TYPE_CHECKING:
    from collections.abc import Callable

    from xpuprof.trace.trace import Trace

#: The folder inside a store that holds its tiers.
FOLDER = "view"
#: Tier pages a process keeps mapped before it lets them go (``Tiers.trim``): they stay in
#: the operating system's file cache, so the next read of them costs a minor page fault.
TRIM_BYTES = 256 << 20
#: Bumped whenever the layout changes: a new version means a new digest, hence a rebuild.
FORMAT = 2


def digest(trace: Trace) -> str:
    """16 hex digits naming the tiers of this store as it is now."""
    files = sorted(
        (t, rel, s["rows"].get(t, 0)) for s in trace.sources for t, rel in s["files"].items() if rel
    )
    text = json.dumps([FORMAT, files])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_root() -> Path:
    """The user's cache folder for tiers of stores that cannot be written."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xpuprof" / "view"


def places(trace: Trace) -> list[Path]:
    """Where the tiers may be, in order of preference: next to the store, then the cache."""
    return [trace.path / FOLDER, cache_root()]


def discard(path: Path) -> None:
    """Remove a folder: renamed away first, so no reader ever finds it half-deleted."""
    try:
        gone = path.parent / temp_name(path.name)
        os.rename(path, gone)
    except OSError:
        gone = path
    shutil.rmtree(gone, ignore_errors=True)


def clean(base: Path, keep: str) -> None:
    """Remove stale tiers (other digests) and temporaries of processes that are gone from the
    store's own tier folder; the simulated timeline of the digest ``keep``
    (``keep.replay-…``, ``view/simulated.py``) stays."""
    with contextlib.suppress(OSError):
        for p in base.iterdir():
            if p.name == keep or p.name.startswith(keep + ".replay-"):
                continue
            if not p.is_dir() or p.is_symlink():
                continue
            m = TEMP_NAME.match(p.name)
            if m is None:
                discard(p)
            elif abandoned(p.name):
                shutil.rmtree(p, ignore_errors=True)


def locate(trace: Trace, *, build: bool = True) -> Path | None:
    """The folder of this store's tiers, built first when there is none (``build``)."""
    d = digest(trace)
    if not build:
        return next((base / d for base in places(trace) if (base / d / "meta.json").is_file()),
                    None)  # fmt: skip
    return find_or_build(trace, d, "meta.json", lambda tmp: bd.build(trace, tmp, d),
                         lambda base: clean(base, d), "the viewer's tiers")  # fmt: skip


def find_or_build(trace: Trace, name: str, marker: str, make: Callable[[Path], None],
                  tidy: Callable[[Path], None], what: str) -> Path:  # fmt: skip
    """The folder ``name`` (complete when it holds ``marker``) in the first of
    :func:`places` that has it; else built by ``make`` into a temporary folder of the first
    place that can be written and renamed into place (atomic: a reader never sees it half
    made; another process first → its folder is used), then ``tidy`` runs on the store's own
    folder. A :class:`StoreError` naming every place when none can be written."""
    for base in places(trace):
        if (base / name / marker).is_file():
            return base / name
    problems = []
    for base in places(trace):
        try:
            base.mkdir(parents=True, exist_ok=True)
            tmp = base / temp_name(name)
            tmp.mkdir()
        except OSError as e:
            problems.append(f"{base}: {e.strerror or e}")
            continue
        try:
            make(tmp)
            try:
                os.rename(tmp, base / name)
            except OSError:
                if not (base / name / marker).is_file():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process was first: use its
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if base == trace.path / FOLDER:
            tidy(base)
        return base / name
    raise StoreError(f"{trace.path}: cannot write {what} ({'; '.join(problems)})")


class Tiers:
    """The tiers of one store, opened: small tables in memory, the big columns mapped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._maps: list[mmap.mmap] = []
        self.meta = json.loads((path / "meta.json").read_text())
        self.tracks: list[dict[str, Any]] = json.loads((path / "tracks.json").read_text())
        self.names: list[str | None] = json.loads((path / "names.json").read_text())
        self.names_arr = np.array([*self.names, None], dtype=object)  # code -1 -> None
        self.n_tracks = len(self.tracks)
        self.ev = {c: self._map(f"ev_{c}") for c in bd.EV_COLUMNS}
        self.start = np.load(path / "ev_start.npy")
        self.maxdur = np.load(path / "ev_maxdur.npy")
        self.classes = int(self.meta["classes"])
        self.levels: dict[int, dict[str, np.ndarray]] = {}
        for lv in self.meta["levels"]:
            cols = {c: self._map(f"sum{lv}_{c}") for c in SUM_COLUMNS}
            cols["off"] = np.load(path / f"sum{lv}_off.npy")
            self.levels[int(lv)] = cols
        self.links = {c: self._map(f"lk_{c}") for c in bd.LINK_COLUMNS}  # sorted by src
        self.links_by_dst = self._map("lk_bydst")
        self.links_dst_sorted = self._map("lk_dstsorted")
        self.kinds = np.array([*self.meta["kinds"], ""], dtype=object)
        self.counters = {c: self._map(f"ct_{c}") for c in bd.COUNTER_COLUMNS}
        self.ct_off = np.load(path / "ct_off.npy")
        self.name_rows = self._map("name_rows")
        self.name_off = np.load(path / "name_off.npy")
        self.steps = {c: np.load(path / f"st_{c}.npy") for c in ("part", "step", "row")}
        lanes = np.array([t["lanes"] for t in self.tracks], np.int64)
        self.lane_base = np.concatenate([[0], np.cumsum(lanes)])
        self.lane_track = np.repeat(np.arange(self.n_tracks), lanes)
        self.kind = np.array([t["kind"] for t in self.tracks], dtype=object)
        self.track_of_key = {tuple(t["key"]): t["track"] for t in self.tracks
                             if t["kind"] != "counter"}  # fmt: skip
        self._lower: list[str] | None = None
        self.part_tracks: dict[int, list[int]] = {}
        for t in self.tracks:
            if t["kind"] != "counter":
                self.part_tracks.setdefault(t["key"][0], []).append(t["track"])
        self.public = [{k: v for k, v in t.items() if k != "key"} for t in self.tracks]

    def _map(self, name: str) -> np.ndarray:
        try:
            a = np.load(self.path / f"{name}.npy", mmap_mode="r")
        except ValueError:  # an empty column cannot be mapped
            return np.load(self.path / f"{name}.npy")
        m = getattr(a, "_mmap", None)
        if m is not None and hasattr(mmap, "MADV_RANDOM"):
            # a query touches a few pages of each column: no read-ahead
            m.madvise(mmap.MADV_RANDOM)
            self._maps.append(m)
        return a

    def trim(self) -> None:
        """Unmap the tier pages this process has read once they pass ``TRIM_BYTES`` (Linux),
        so that a server's resident memory stays bounded whatever the size of the tiers:
        a long session touches most pages of a large tier in the end."""
        try:
            with open("/proc/self/statm") as f:
                shared = int(f.read().split()[2]) * mmap.PAGESIZE
        except (OSError, ValueError, IndexError):
            return
        if shared > TRIM_BYTES and hasattr(mmap, "MADV_DONTNEED"):
            for m in self._maps:
                with contextlib.suppress(OSError, ValueError):
                    m.madvise(mmap.MADV_DONTNEED)

    @property
    def lower_names(self) -> list[str]:
        """Names in lower case, for search (made once)."""
        if self._lower is None:
            self._lower = [n.lower() if isinstance(n, str) else "" for n in self.names]
        return self._lower

    def track_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The track of each row of the event tier (from the segment it lies in)."""
        g = np.searchsorted(self.start, np.asarray(rows, np.int64), "right") - 1
        return g % max(self.n_tracks, 1)

    def ends(self, links: np.ndarray) -> dict[str, np.ndarray]:
        """Both ends of some links (rows of the link tier): ids, tracks, starts, depths."""
        lk = self.links
        out = {
            "kind": self.kinds[np.asarray(lk["kind"][links], np.int64)],
            "src": np.asarray(lk["src"][links]),
            "dst": np.asarray(self.ev["id"][np.asarray(lk["dst_row"][links], np.int64)]),
        }
        for end in ("src", "dst"):
            r = np.asarray(lk[f"{end}_row"][links], np.int64)
            out[f"{end}_track"] = self.track_of_rows(r)
            out[f"{end}_ts"] = np.asarray(self.ev["ts"][r])
            out[f"{end}_depth"] = np.asarray(self.ev["depth"][r], np.int64)
        return out

    def row_of(self, event_id: int) -> int | None:
        """The row of an event id in the event tier (None: no such event): a scan of the
        ids of its file's tracks, a few milliseconds."""
        part = event_id >> ID_SHIFT
        for t in self.part_tracks.get(part, ()):
            for c in range(self.classes):
                a, e = self.segment(c, t)
                if a < e:
                    hit = np.flatnonzero(self.ev["id"][a:e] == event_id)
                    if hit.size:
                        return a + int(hit[0])
        return None

    def segment(self, cls: int, track: int) -> tuple[int, int]:
        g = cls * self.n_tracks + track
        return int(self.start[g]), int(self.start[g + 1])

    def track_of(self, part: int, device: int, pid: Any, tid: Any, stream: Any) -> int | None:
        """The track of an event given its store columns (None: not in the tiers)."""
        null = bd.NULL

        def v(x: Any) -> int:
            return null if x is None or x != x else int(x)

        dev = device is not None and device == device and int(device) >= 0
        key = (int(part), int(dev), int(device) if dev else v(pid), v(stream) if dev else v(tid))
        return self.track_of_key.get(key)


def open_tiers(trace: Trace) -> Tiers:
    """The tiers of a store, built on first use and kept on the Trace (``trace.memo``); a
    folder that was damaged or deleted meanwhile is built again once."""
    return built_once(trace, "tiers", locate, Tiers, (OSError, ValueError, KeyError))


def built_once(
    trace: Trace,
    name: str,
    find: Callable[[Trace], Path],
    open_: Callable[[Path], Any],
    errors: tuple[type[BaseException], ...],
) -> Any:
    """``open_(find(trace))`` once per Trace (kept on ``trace.memo`` under ``("view", name)``,
    one builder at a time); a folder ``open_`` finds damaged (``errors``) is discarded and
    built again once."""
    key = ("view", name)
    got = trace.memo.get(key)
    if got is not None:
        return got
    lock = trace.memo.setdefault(("view", f"{name}-lock"), threading.Lock())
    with lock:
        got = trace.memo.get(key)
        if got is None:
            path = find(trace)
            try:
                got = open_(path)
            except errors:
                discard(path)
                got = open_(find(trace))
            trace.memo[key] = got
    return got
    lock = trace.memo.setdefault(("view", "lock"), threading.Lock())
    with lock:
        got = trace.memo.get(key)
        if got is None:
            path = locate(trace)
            try:
                got = Tiers(path)
            except (OSError, ValueError, KeyError):
                discard(path)
                got = Tiers(locate(trace))
            trace.memo[key] = got
    return got

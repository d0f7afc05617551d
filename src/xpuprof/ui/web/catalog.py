"""The stores a server shows, opened read-only and kept open (a bounded number), and the answers
it has computed, kept in memory (bounded by size).

Store names in URLs are looked up in the listing of the served directory, never joined to a
path: a name that is not a store of the listing is unknown (404), so no request can reach a
file outside the stores. Each store is opened twice, once for the tools and once for the trace
viewer, so that a tool computing for seconds never blocks the viewer's window queries; each
of the two is used by one thread at a time (a DuckDB connection and ``Trace.memo`` are not
safe to share between threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from xpuprof.core.errors import XpuprofError
from xpuprof.trace.store import MANIFEST, is_store

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

T = TypeVar("T")

#: DuckDB settings of a served store: a server answers many clients, each query bounded.
DUCKDB_CONFIG = {"memory_limit": "1GB", "threads": 2}
#: Stores kept open at once (the least recently used one is closed beyond this).
MAX_OPEN = 8
#: Computed answers kept in memory: at most this many bytes of JSON, and this many answers.
CACHE_BYTES = 256 * 2**20
CACHE_ENTRIES = 512
#: The two uses of a store, each with its own Trace (its own DuckDB connection and memo).
ROLES = ("tools", "view")


class UnknownStore(XpuprofError):
    """A store name that is not one of the served directory's stores (HTTP 404)."""


class Gone(Exception):
    """The client went away while its request waited: nothing to compute for it."""


def list_stores(root: Path) -> dict[str, Path]:
    """The stores under ``root`` by name: ``root`` itself when it is a store, else its
    subdirectories (one level) that are stores, in name order."""
    if is_store(root):
        return {root.name: root}
    if not root.is_dir():
        raise XpuprofError(f"{root}: not a store, nor a directory of stores")
    found = {}
    try:
        for p in sorted(root.iterdir()):
            if p.is_dir() and is_store(p):
                found[p.name] = p
    except OSError as e:
        raise XpuprofError(f"{root}: cannot list the directory ({e.strerror})") from None
    return found


def _stamp(path: Path) -> int:
    """When the store's manifest was last written (ns): a rewritten store is a new store."""
    try:
        return (path / MANIFEST).stat().st_mtime_ns
    except OSError:
        return 0


class OpenStore:
    """One store opened for the server: a read-only Trace per role, opened on first use,
    each used under its own lock; ``users`` counts the requests using it now (a store is
    closed only once they are done)."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path, self.stamp = name, path, _stamp(path)
        self._traces: dict[str, Trace] = {}
        self._locks = {role: threading.Lock() for role in ROLES}
        self.users = 0
        self.retired = False
        #: small per-store values the server keeps (the viewer's time origin)
        self.values: dict[str, Any] = {}

    def call(self, role: str, fn: Callable[[Trace], T],
             alive: Callable[[], bool] = lambda: True) -> T:  # fmt: skip
        """``fn(trace)`` with this role's Trace, one thread at a time; :class:`Gone` when
        ``alive()`` says the client left while the call waited for its turn."""
        with self._locks[role]:
            if not alive():
                raise Gone()
            trace = self._traces.get(role)
            if trace is None:
                from xpuprof.trace.trace import Trace

                trace = Trace(self.path, restricted=True, duckdb_config=DUCKDB_CONFIG)
                self._traces[role] = trace
            return fn(trace)

    def close(self) -> None:
        for role in ROLES:
            with self._locks[role]:
                trace = self._traces.pop(role, None)
                if trace is not None:
                    trace.close()


class Catalog:
    """The served stores: the listing of the root (read again when a name is not in it) and
    the stores open now (at most :data:`MAX_OPEN`, least recently used closed first)."""

    def __init__(self, root: Path, max_open: int = MAX_OPEN) -> None:
        self.root = Path(root).resolve()
        self.max_open = max_open
        self._listing = list_stores(self.root)
        self._open: OrderedDict[str, OpenStore] = OrderedDict()
        self._lock = threading.Lock()

    def names(self, refresh: bool = True) -> dict[str, Path]:
        """The stores by name (the directory listed again unless ``refresh`` is False)."""
        if refresh:
            listing = list_stores(self.root)
            with self._lock:
                self._listing = listing
        return dict(self._listing)

    def path(self, name: str) -> Path:
        """The path of the store called ``name`` in the listing; :class:`UnknownStore` else."""
        listing = self._listing
        if name not in listing:
            listing = self.names()
        if name not in listing:
            raise UnknownStore(f"no store named {name!r} here")
        return listing[name]

    def acquire(self, name: str) -> OpenStore:
        """The open store called ``name`` (opened now if need be), counted as in use until
        :meth:`release`. A store whose manifest changed since it was opened is reopened."""
        path = self.path(name)
        closing: list[OpenStore] = []
        with self._lock:
            s = self._open.get(name)
            if s is not None and (s.path != path or s.stamp != _stamp(path)):
                closing.append(self._retire(name))
                s = None
            if s is None:
                s = OpenStore(name, path)
                self._open[name] = s
            self._open.move_to_end(name)
            s.users += 1
            while len(self._open) > self.max_open:
                oldest = next(iter(self._open))
                closing.append(self._retire(oldest))
        for old in closing:
            if old.users == 0:
                old.close()
        return s

    def _retire(self, name: str) -> OpenStore:
        s = self._open.pop(name)
        s.retired = True
        return s

    def release(self, s: OpenStore) -> None:
        with self._lock:
            s.users -= 1
            done = s.retired and s.users == 0
        if done:
            s.close()

    def close(self) -> None:
        """Close every open store (the server is stopping)."""
        with self._lock:
            stores = list(self._open.values())
            self._open.clear()
        for s in stores:
            s.close()


class AnswerCache:
    """Computed answers (JSON bytes) by key, least recently used dropped first beyond
    ``max_bytes`` or ``max_entries``; safe to use from many threads."""

    def __init__(self, max_bytes: int = CACHE_BYTES, max_entries: int = CACHE_ENTRIES) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._items: OrderedDict[Any, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Any) -> bytes | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self.hits += 1
            self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: bytes) -> None:
        if len(value) > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            self._bytes += len(value) - (len(old) if old is not None else 0)
            self._items[key] = value
            while self._bytes > self.max_bytes or len(self._items) > self.max_entries:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= len(dropped)

    @property
    def size(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

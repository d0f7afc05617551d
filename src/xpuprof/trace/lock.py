"""Who owns a store: the exclusive writer lock, and temporary names that carry their owner.

A store has one writer at a time (``StoreLock``): two would pick the same part numbers and
commit each other's files. Temporaries (a store's build folder, a manifest being written) are
named with their process and host (``temp_name``), so that a later writer can tell those of a
process that no longer runs (``abandoned``) and remove them. ``docs/store.md`` has the protocol.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from xpuprof.core.errors import StoreError

try:
    import fcntl
except ImportError:  # Windows: StoreLock falls back to an exclusively created file
    fcntl = None  # type: ignore[assignment]

#: How long a writer waits for another writer of the same store before giving up (seconds).
LOCK_WAIT_S = 60.0

# -- temporary names --------------------------------------------------------------------------


def host_tag() -> str:
    """8 hex digits naming this host in temporary names (pids mean nothing across hosts)."""
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def temp_name(base: str) -> str:
    """``.BASE.tmp-PID-hHOST-RAND``: unique, and telling whose it is once its owner is gone."""
    return f".{base}.tmp-{os.getpid()}-h{host_tag()}-{uuid.uuid4().hex[:8]}"


#: Temporary names, this version's and earlier ones (``.BASE.tmp-PID[-RAND]``).
TEMP_NAME = re.compile(
    r"^\.(?P<base>.+)\.tmp-(?P<pid>\d+)(?:-h(?P<host>[0-9a-f]{8}))?(?:-(?P<rand>[0-9a-f]{8}))?$"
)


def abandoned(name: str) -> bool:
    """True for a temporary name whose process (on this host) no longer runs."""
    m = TEMP_NAME.match(name)
    if m is None or (m["host"] is not None and m["host"] != host_tag()):
        return False
    import psutil

    return not psutil.pid_exists(int(m["pid"]))


# -- the lock ----------------------------------------------------------------------------------

#: Descriptors of locks this process holds, closed in forked children (Dask's workers): a
#: flock is shared with a child, which would otherwise keep the store locked after we die.
_HELD: set[int] = set()


def _forget_locks_in_child() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks_in_child)


def lock_path(root: str | Path) -> Path:
    """The lock file of a store: beside it, so that it also guards a store not yet created."""
    root = Path(root)
    return root.parent / f".{root.name}.lock"


class StoreLock:
    """The exclusive writer lock of one store (a context manager; ``docs/store.md``).

    ``flock`` on ``.NAME.lock`` beside the store, which records the owner (pid, host, since)
    for the message others get. The kernel drops the lock when its owner dies, so the lock of a
    killed writer is simply taken over; the file is removed on release. ``wait``: seconds to
    wait for another writer before raising :class:`StoreError` naming it.
    """

    def __init__(self, root: str | Path, *, wait: float = LOCK_WAIT_S) -> None:
        self.root = Path(root)
        self.path = lock_path(self.root)
        self.wait = max(0.0, float(wait))
        self._fd: int | None = None

    def __enter__(self) -> StoreLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait
        delay = 0.01
        while True:
            try:
                got = self._try() if fcntl is not None else self._try_exclusive()
            except OSError as e:
                raise StoreError(
                    f"{self.path}: cannot create the lock ({e.strerror or e})"
                ) from None
            if got:
                return
            if got is None:
                continue  # the file changed under us: look again at once
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreError(self._busy())
            time.sleep(min(delay, left))
            delay = min(2 * delay, 0.25)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still holding it: see _try
        finally:
            _HELD.discard(fd)
            if fd >= 0:
                os.close(fd)

    def owner(self) -> dict[str, Any] | None:
        """Who holds (or last held) the lock, as recorded in the lock file."""
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def _record(self) -> bytes:
        since = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since,
                           "by": "xpuprof"}).encode()  # fmt: skip

    def _try(self) -> bool | None:
        """flock the lock file; None when it was replaced meanwhile (its owner removed it
        between our open and our flock: the lock we got is on a file nobody else sees)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            return None
        os.ftruncate(fd, 0)
        os.write(fd, self._record())
        self._fd = fd
        _HELD.add(fd)
        return True

    def _try_exclusive(self) -> bool | None:
        """Without flock: create the file exclusively (with its record, through a hard link);
        a file whose owner is a dead process of this host is removed and the lock retried."""
        tmp = self.path.with_name(temp_name(self.path.name))
        tmp.write_bytes(self._record())
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            owner = self.owner()
            if owner is None or _dead_owner(owner):
                self.path.unlink(missing_ok=True)
                return None
            return False
        finally:
            tmp.unlink(missing_ok=True)
        self._fd = -1  # held; nothing to keep open (Windows cannot remove an open file)
        return True

    def _busy(self) -> str:
        o = self.owner()
        who = (
            f"pid {o.get('pid')} on {o.get('host')}, since {o.get('since')}"
            if o
            else f"lock file {self.path}"
        )
        waited = f"waited {self.wait:g} s; " if self.wait else ""
        return (
            f"{self.root}: another xpuprof process is writing this store ({who}); {waited}"
            f"try again when it has finished (lock: {self.path})"
        )


def _dead_owner(owner: dict[str, Any]) -> bool:
    pid = owner.get("pid")
    if owner.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    import psutil

    return not psutil.pid_exists(pid)

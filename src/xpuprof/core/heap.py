"""A roomy C heap while a decoder runs, in a process whose heap thresholds were fixed at start.

Why: glibc serves each allocation above ``M_MMAP_THRESHOLD`` with a fresh ``mmap`` (zeroed
pages, faulted in one by one, unmapped again on free) and gives back the free top of its heap
above ``M_TRIM_THRESHOLD``. By default both thresholds grow with what the program frees, so a
decoder that builds and drops lists of megabytes per chunk soon reuses its heap. Setting either
one at start freezes them: the mmap threshold stays at 128 KiB. Dask's Nanny starts every worker
with ``MALLOC_TRIM_THRESHOLD_=65536`` (to give memory back between tasks), and there one 512 MB
piece of a Kineto file decoded in 12-15 s instead of 9-10 s (benchmarks/RESULTS.md, "the
worker's heap"). Workers forked from ingest's fork server are not affected (it starts before
the Nanny sets the variable); those of a user's cluster (``--scheduler``) and spawned ones are.

What :func:`roomy` does: only where glibc read such a setting when the process started (the
environment the process was started with, ``/proc/self/environ``: a variable set later, as the
Nanny sets it in its own process, was never read), it raises both thresholds for the length of
the block and then puts back the values the process started with and trims the heap once, which
is what the setting was for. Anywhere else it does nothing: setting a threshold would freeze the
growing ones for good. Nested and concurrent blocks (threads of one worker) share one raise.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import threading
from collections.abc import Iterator

#: ``mallopt`` parameters (glibc's malloc.h).
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -2, -3, -4
#: glibc's default thresholds (bytes), where a fixed setting of the other one leaves them.
DEFAULT_MMAP = 128 << 10
DEFAULT_TRIM = 128 << 10
#: The thresholds while a block runs: the largest mmap threshold glibc would grow to by itself
#: on a 64-bit machine, and twice that for trimming, as glibc pairs them.
ROOMY_MMAP = 32 << 20
ROOMY_TRIM = 64 << 20

_ENV = {"MALLOC_TRIM_THRESHOLD_": "trim", "MALLOC_MMAP_THRESHOLD_": "mmap",
        "MALLOC_TOP_PAD_": "top_pad", "MALLOC_MMAP_MAX_": "mmap_max"}  # fmt: skip
_TUNABLES = {"glibc.malloc.trim_threshold": "trim", "glibc.malloc.mmap_threshold": "mmap",
             "glibc.malloc.top_pad": "top_pad", "glibc.malloc.mmap_max": "mmap_max"}  # fmt: skip

_lock = threading.Lock()
_depth = 0


def start_settings(environ: bytes | None = None) -> dict[str, int]:
    """The heap settings glibc read when this process started (``trim``, ``mmap``, …), from
    the environment it was started with (``environ``: that block, NUL-separated; default:
    ``/proc/self/environ``). Empty when there were none or it cannot be read."""
    if environ is None:
        try:
            with open("/proc/self/environ", "rb") as f:
                environ = f.read()
        except OSError:
            return {}
    found: dict[str, int] = {}
    for item in environ.split(b"\0"):
        key, _, value = item.decode("utf-8", "replace").partition("=")
        if key in _ENV:
            _setting(found, _ENV[key], value)
        elif key == "GLIBC_TUNABLES":
            for tunable in value.split(":"):
                name, _, v = tunable.partition("=")
                if name in _TUNABLES:
                    _setting(found, _TUNABLES[name], v)
    return found


def _setting(found: dict[str, int], name: str, value: str) -> None:
    with contextlib.suppress(ValueError):
        found[name] = int(value, 0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """glibc, when this process runs on it (its ``mallopt`` and ``malloc_trim``); looked up
    once per process (``find_library`` may run ``ldconfig``)."""
    import platform

    if platform.libc_ver()[0] != "glibc":
        return None
    for name in ("libc.so.6", ctypes.util.find_library("c")):
        if not name:
            continue
        try:
            libc = ctypes.CDLL(name)
            libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
            libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            continue
        return libc
    return None


@functools.cache
def _fixed() -> tuple[ctypes.CDLL, dict[str, int]] | None:
    """glibc and the settings it started with, when a threshold was fixed at start; read once
    per process (the environment it started with does not change)."""
    settings = start_settings()
    if not settings:
        return None
    libc = _libc()
    return None if libc is None else (libc, settings)


@contextlib.contextmanager
def roomy() -> Iterator[bool]:
    """Raise glibc's heap thresholds for the block when they were fixed at start (yields
    whether it did); put the start values back and trim once after the last block ends."""
    global _depth
    fixed = _fixed()
    if fixed is None:
        yield False
        return
    libc, settings = fixed
    with _lock:
        _depth += 1
        if _depth == 1:
            libc.mallopt(M_MMAP_THRESHOLD, max(ROOMY_MMAP, settings.get("mmap", 0)))
            libc.mallopt(M_TRIM_THRESHOLD, max(ROOMY_TRIM, settings.get("trim", 0)))
    try:
        yield True
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                libc.mallopt(M_MMAP_THRESHOLD, settings.get("mmap", DEFAULT_MMAP))
                libc.mallopt(M_TRIM_THRESHOLD, settings.get("trim", DEFAULT_TRIM))
                libc.malloc_trim(0)


def raised() -> bool:
    """Whether a :func:`roomy` block has the thresholds raised in this process now."""
    return _depth > 0 and _fixed() is not None


_pool_lock = threading.Lock()
_pool_depth = 0
_pool_before: list[object] = []
#: Arrow's default pool, the one :func:`system_pool` replaces (any other was chosen by someone).
DEFAULT_BACKEND = "mimalloc"


@contextlib.contextmanager
def system_pool() -> Iterator[bool]:
    """Arrow's allocations on the system allocator for the block (yields whether they are),
    where nobody chose a pool: Arrow's default (mimalloc) keeps what a decoder frees for reuse
    and, in the same process, a 2 GB Kineto file's one-piece import took 20.1 s with a 3.85 GB
    peak against 17.2 s and 3.20 GB on the system allocator (benchmarks/RESULTS.md). The
    ``xpuprof`` command sets ``ARROW_DEFAULT_MEMORY_POOL=system`` before pyarrow is loaded; this
    gives a Python caller's imports and the import's workers the same. Arrays keep the pool
    that made them, so switching back after the block is safe; nested and concurrent blocks
    share one switch. Where the variable names a pool, or the pool in use is not Arrow's
    default (someone called ``pyarrow.set_memory_pool``), nothing is touched."""
    import os

    global _pool_depth
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        yield False
        return
    import pyarrow as pa

    with _pool_lock:
        joined = _pool_depth > 0
        if joined:
            _pool_depth += 1
        elif pa.default_memory_pool().backend_name == DEFAULT_BACKEND:
            _pool_before.append(pa.default_memory_pool())
            pa.set_memory_pool(pa.system_memory_pool())
            _pool_depth = 1
            joined = True
    if not joined:
        yield False
        return
    try:
        yield True
    finally:
        with _pool_lock:
            _pool_depth -= 1
            if _pool_depth == 0:
                pa.set_memory_pool(_pool_before.pop())

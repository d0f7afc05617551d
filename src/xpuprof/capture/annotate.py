"""Low-overhead user annotations and step markers (XProf's TraceMe idea).

``annotate(name, **fields)`` marks a span of host time, as a context manager or a decorator;
``step(n)`` marks training steps; collectors use ``start()``/``stop()``, and ``stop()`` returns
a ``records.Collected`` whose ``to_raw()`` hands the normaliser its raw tables. Annotations stay
in production code, so the design is ruled by their cost: while nobody captures, a call is one
integer comparison and a cached no-op object; during a capture, two clock reads and one tuple
appended to a list of the calling thread (no lock). ``docs/annotate.md`` gives the details, the
clocks and the designs measured. This module imports only the standard library.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from xpuprof.capture.records import CAT_ANNOTATION, CAT_STEP, STEP_KIND, Collected, ThreadRecords
from xpuprof.core.errors import XpuprofError

__all__ = [
    "CAT_ANNOTATION",
    "CAT_STEP",
    "DEFAULT_MAX_RECORDS",
    "Collected",
    "ThreadRecords",
    "annotate",
    "is_active",
    "start",
    "step",
    "stop",
]

F = TypeVar("F", bound=Callable[..., Any])

#: Records kept per capture, all threads together; further records are dropped and counted.
DEFAULT_MAX_RECORDS = 1_000_000

#: ``_threshold`` while no capture runs: below every valid level (levels are >= 0).
_OFF = -1
#: No-op objects are cached for levels 0.._CACHED_LEVELS-1, up to _CACHE_NAMES names each.
_CACHED_LEVELS = 8
_CACHE_NAMES = 4096

# ----------------------------------------------------------------------------------------------
# global state: read on the hot path as module globals, written only by start()/stop()
# ----------------------------------------------------------------------------------------------

#: True while a capture runs. The hot path reads ``_threshold`` instead (one comparison covers
#: "no capture" and "level above verbosity"); ``_active`` guards the rarer paths.
_active: bool = False
#: Annotations with ``level <= _threshold`` are recorded: the capture's verbosity, or _OFF.
_threshold: int = _OFF
#: Per-thread state of the current capture (replaced at every start/stop, so that a thread's
#: first annotation in a new capture registers a fresh buffer).
_local: threading.local = threading.local()
#: Tickets for the record budget: a record is kept when its ticket is below ``_limit``.
_tickets: itertools.count = itertools.count()
_limit: int = 0
_clock: Callable[[], int] = time.monotonic_ns
#: Serializes start/stop and thread registration (never taken on the hot path).
_lock = threading.Lock()


class _ThreadState:
    """One thread's buffer in one capture, plus its open step (``step(n)`` as a plain call)."""

    __slots__ = ("rec", "pid", "tid", "name", "step")

    def __init__(self) -> None:
        self.rec: list[tuple[Any, ...]] = []
        self.pid = os.getpid()
        self.tid = threading.get_native_id()
        self.name = threading.current_thread().name
        self.step: _Step | None = None


class _Capture:
    __slots__ = ("threads", "verbosity", "max_records", "offset", "offset_err", "t_start")

    def __init__(self, verbosity: int, max_records: int) -> None:
        self.threads: list[_ThreadState] = []
        self.verbosity = verbosity
        self.max_records = max_records
        self.offset, self.offset_err = _epoch_offset()
        self.t_start = _clock()


_capture: _Capture | None = None


def _register() -> _ThreadState:
    """First record of this thread in this capture: make its buffer and list it globally.

    Outside a capture (a span created during one and entered after it stopped) the state is
    a throwaway that nobody collects.
    """
    st = _ThreadState()
    with _lock:
        cap, local = _capture, _local
        if cap is not None:
            cap.threads.append(st)
            local.rec = st.rec
            local.st = st
    return st


def _thread_state() -> _ThreadState:
    try:
        return _local.st
    except AttributeError:
        return _register()


def _epoch_offset() -> tuple[int, int]:
    """``time.time_ns() - _clock()`` from the tightest of a few bracketed reads, and its
    uncertainty (the bracket's width) in ns."""
    best, width = 0, None
    for _ in range(9):
        a = _clock()
        w = time.time_ns()
        b = _clock()
        if width is None or b - a < width:
            best, width = w - (a + b) // 2, b - a
    return best, int(width or 0)


# ----------------------------------------------------------------------------------------------
# annotations
# ----------------------------------------------------------------------------------------------


class _Span:
    """An annotation made while a capture is active: one per ``annotate()`` call.

    The buffer is looked up at ``__enter__`` and kept, so a span closed on another thread is
    recorded on the thread that opened it (with that thread's tid), and nothing crashes.
    """

    __slots__ = ("name", "fields", "level", "t0", "rec")

    def __enter__(self) -> None:
        try:
            self.rec = _local.rec
        except AttributeError:
            self.rec = _register().rec
        self.t0 = _clock()

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        t1 = _clock()
        if next(_tickets) < _limit:
            self.rec.append((self.t0, t1, self.name, self.fields, self.level))

    def __call__(self, fn: F) -> F:
        return _decorate(fn, self.name, self.level, self.fields)


class _Idle:
    """What ``annotate()`` returns while it would not record: enters and exits doing nothing,
    and still knows its name, level and fields so that it can decorate a function (whose
    wrapper checks at each call whether a capture has started since)."""

    __slots__ = ("name", "level", "fields")

    # no __init__: the slots are set by the caller, which saves a Python call per object

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        return _decorate(fn, self.name, self.level, self.fields)


class _IdleCache(dict):
    """Names → cached ``_Idle`` of one level; a miss makes one without raising (``__missing__``
    costs less than a caught KeyError), and caches it while there is room, so that names
    built at run time (f-strings) cannot grow the cache without bound."""

    __slots__ = ("level",)

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def __missing__(self, name: Any) -> Any:
        if type(name) is not str:
            return _idle(name, self.level, None)
        obj = _Idle()
        obj.name, obj.level, obj.fields = name, self.level, None
        if len(self) < _CACHE_NAMES:
            self[name] = obj
        return obj


_IDLE: list[_IdleCache] = [_IdleCache(lv) for lv in range(_CACHED_LEVELS)]


def _idle(name: Any, level: int, fields: dict[str, Any] | None) -> Any:
    """The slow, uncached form of the no-op (fields given, odd level, or a decorated function
    passed bare as ``@annotate``)."""
    if not isinstance(name, str) and callable(name):
        return _decorate(name, _qualname(name), level, fields)
    obj = _Idle()
    obj.name, obj.level, obj.fields = name, level, fields
    return obj


def annotate(name: Any, level: int = 1, **fields: Any) -> Any:
    """Mark a span of host time: ``with annotate("load_batch", size=32): ...``,
    ``@annotate("fwd")`` or bare ``@annotate`` (named by the function's qualified name).

    ``level`` (>= 0) is compared with the verbosity of the capture: an annotation above it costs
    what a disabled one costs. ``fields`` are stored as the event's JSON args (values that JSON
    cannot hold are written as their ``str``). The returned object is meant to be entered once;
    decorate with it as often as needed.
    """
    if level > _threshold:
        if not fields:
            try:
                return _IDLE[level][name]
            except (IndexError, TypeError):  # odd level, unhashable name
                return _idle(name, level, None)
        if name.__class__ is str:  # fields given: the keyword dict exists anyway; keep it
            o = _Idle()
            o.name = name
            o.level = level
            o.fields = fields
            return o
        return _idle(name, level, fields)
    if not _active or (name.__class__ is not str and callable(name)):
        return _idle(name, level, fields or None)
    s = _Span()
    s.name = name
    s.fields = fields or None
    s.level = level
    return s


def _qualname(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _decorate(fn: F, name: str, level: int, fields: dict[str, Any] | None) -> F:
    """Wrap ``fn`` so that each call is a span, decided at call time (one comparison when no
    capture runs). Coroutine functions get an async wrapper spanning the awaited call;
    generator functions are spanned only while being created, which is all a plain call does.
    """
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            if level > _threshold or not _active:
                return await fn(*args, **kwargs)
            try:
                rec = _local.rec
            except AttributeError:
                rec = _register().rec
            t0 = _clock()
            try:
                return await fn(*args, **kwargs)
            finally:
                t1 = _clock()
                if next(_tickets) < _limit:
                    rec.append((t0, t1, name, fields, level))

        return awrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if level > _threshold or not _active:
            return fn(*args, **kwargs)
        try:
            rec = _local.rec
        except AttributeError:
            rec = _register().rec
        t0 = _clock()
        try:
            return fn(*args, **kwargs)
        finally:
            t1 = _clock()
            if next(_tickets) < _limit:
                rec.append((t0, t1, name, fields, level))

    return wrapper  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# steps
# ----------------------------------------------------------------------------------------------


class _NoStep:
    """``step()`` outside a capture: a shared no-op context manager."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        return None


_NO_STEP = _NoStep()


class _Step:
    """An open step span of one thread. Opened by ``step(n)``; closed by its ``__exit__``
    (``with step(n):``), by the thread's next ``step()`` call, or by ``stop()``."""

    __slots__ = ("st", "n", "t0")

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: object, ev: object, tb: object) -> None:
        _close_step(self.st, self, _clock())


def _close_step(st: _ThreadState, s: _Step, t1: int) -> None:
    """Record ``s`` if it is still the open step of its thread (closing twice is harmless)."""
    if st.step is not s:
        return
    st.step = None
    if next(_tickets) < _limit:
        st.rec.append((s.t0, t1, s.n, None, STEP_KIND))


def step(n: int | None) -> Any:
    """Step marker: steps become spans named ``step#N`` at level ``step``.

    ``with step(n): ...`` spans the block. A plain call ``step(n)`` closes this thread's open
    step and opens step ``n``, so a loop that only calls ``step(i)`` at its top gets one span
    per iteration; ``step(None)`` (or the end of the capture) closes the last one. Outside a
    capture this is one flag check.
    """
    if not _active:
        return _NO_STEP
    t = _clock()
    st = _thread_state()
    if st.step is not None:
        _close_step(st, st.step, t)
    if n is None:
        return _NO_STEP
    s = _Step()
    s.st, s.n, s.t0 = st, n, t
    st.step = s
    return s


# ----------------------------------------------------------------------------------------------
# capture control, for the collectors
# ----------------------------------------------------------------------------------------------


def is_active() -> bool:
    """True while an annotation capture runs."""
    return _active


def start(verbosity: int = 1, max_records: int = DEFAULT_MAX_RECORDS) -> None:
    """Start recording annotations with ``level <= verbosity``, and steps, in every thread.

    At most ``max_records`` records are kept (all threads together); later ones are dropped and
    counted in ``Collected.dropped``. A second ``start`` while one capture runs is refused.
    """
    global _active, _threshold, _local, _tickets, _limit, _capture
    if isinstance(verbosity, bool) or not isinstance(verbosity, int) or verbosity < 0:
        raise XpuprofError(f"annotation verbosity must be an integer >= 0, not {verbosity!r}")
    if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 0:
        raise XpuprofError(f"max_records must be an integer >= 0, not {max_records!r}")
    with _lock:
        if _capture is not None:
            raise XpuprofError(
                "an annotation capture is already active in this process; stop it first"
            )
        _capture = _Capture(verbosity, max_records)
        _local = threading.local()
        _tickets = itertools.count()
        _limit = max_records
        _active = True
        _threshold = verbosity


def stop() -> Collected:
    """Stop recording and return what was recorded: every thread's records and the number
    dropped. Open step spans are closed at this moment; annotations still open are not kept
    (a span is recorded when it closes)."""
    global _active, _threshold, _local, _capture, _limit
    with _lock:
        cap = _capture
        if cap is None:
            raise XpuprofError("no annotation capture is active")
        _threshold = _OFF
        _active = False
        t_stop = _clock()
        threads = list(cap.threads)
    for st in threads:
        s = st.step
        if s is not None:
            _close_step(st, s, t_stop)
    with _lock:
        issued = next(_tickets)  # tickets handed out so far (this one is not a record)
        _limit = 0  # a span still open now records nothing when it closes
        _capture = None
        _local = threading.local()
        threads = list(cap.threads)  # with any thread that registered meanwhile
    offset_end, _ = _epoch_offset()
    return Collected(
        threads=[ThreadRecords(st.pid, st.tid, st.name, st.rec, len(st.rec)) for st in threads],
        dropped=max(0, issued - cap.max_records),
        verbosity=cap.verbosity,
        max_records=cap.max_records,
        offset_ns=cap.offset,
        offset_err_ns=cap.offset_err,
        offset_end_ns=offset_end,
        start_ns=cap.t_start + cap.offset,
        stop_ns=t_stop + cap.offset,
    )


def _reset_for_tests() -> None:  # pragma: no cover - used by tests after a failure mid-capture
    """Stop any capture without collecting (tests call this so one failure cannot leak)."""
    global _active, _threshold, _local, _capture
    with _lock:
        _active, _threshold, _capture = False, _OFF, None
        _local = threading.local()

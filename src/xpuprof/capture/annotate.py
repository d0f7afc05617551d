"""Low-overhead user annotations and step markers (XProf's TraceMe idea).

``annotate(name, **fields)`` marks a span of host time, as a context manager or a decorator;
``step(n)`` marks training steps. Annotations stay in production code, so what matters most is
their cost while nobody is capturing, and second their cost during a capture:

* **No capture active** (or the annotation's ``level`` is above the capture's verbosity): the
  call is one integer comparison against a module global (``_threshold``: "no capture" and
  "above verbosity" are the same test), then the cached no-op object of (level, name) is
  returned (a list index and a dict lookup). No time is read, nothing is recorded, and for the
  usual call (no fields) nothing is allocated beyond the keyword dict the interpreter makes for
  any function with ``**fields``. The no-op is cached *per name* rather than being one shared
  singleton (which measured ~50 ns faster) because ``@annotate("fwd")`` is usually evaluated at
  import time, before any capture, and the object it returns must still know its name when it
  decorates. ``benchmarks/bench_annotate.py --alternatives`` measures the designs considered.
* **Capture active**: one small ``__slots__`` object per annotation, two clock reads, and one
  tuple ``(start, end, name, fields, kind)`` appended to a plain list owned by the thread that
  opened the span (``kind``: the annotation's level, or ``"step"`` for a step, whose ``name``
  is then the step number). No lock on this path: each thread appends to its own list
  (found through a ``threading.local``), and the per-capture record budget is enforced with
  ``itertools.count`` tickets, whose ``next()`` is atomic under the GIL.

Times are read with ``time.monotonic_ns`` (the same clock as ``perf_counter_ns`` on Linux and
measured equally cheap here; monotonic is the property we rely on) and converted to Unix-epoch
nanoseconds only at collection, with an offset measured when the capture starts. Unix-epoch
nanoseconds are what PyTorch's Kineto traces hold once their ``baseTimeNanoseconds`` is added
back, so ``Collected.to_raw(base_ns=...)`` gives rows that merge with torch's own events. Thread
ids are ``threading.get_native_id()`` and the pid ``os.getpid()``: the ids Kineto writes for
host threads, so our spans land on the same tracks as the aten ops they contain.

Collectors use ``start()`` / ``stop()``; ``Collected.to_raw()`` hands the normaliser
(``trace/build.py``) tables in ``raw.RAW_SCHEMA``. This module imports only the standard
library at import time; pyarrow and msgspec are imported by ``to_raw``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import operator
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from xpuprof.core.errors import XpuprofError

if TYPE_CHECKING:
    import pyarrow as pa

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

#: Raw category of annotation spans (the normaliser maps it to level ``annotation``).
CAT_ANNOTATION = "xpuprof_annotation"
#: Raw category of step spans, named ``step#N`` (the normaliser maps them to level ``step``).
CAT_STEP = "xpuprof_step"
#: Records kept per capture, all threads together; further records are dropped and counted.
DEFAULT_MAX_RECORDS = 1_000_000

#: ``kind`` of a step record (annotation records hold their integer level instead).
_STEP = "step"
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
        st.rec.append((s.t0, t1, s.n, None, _STEP))


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


# ----------------------------------------------------------------------------------------------
# collected records → raw tables
# ----------------------------------------------------------------------------------------------


@dataclass
class ThreadRecords:
    """One thread's records: ``records[:count]`` are this capture's (the list is append-only,
    and a span still open at ``stop()`` may append to it later; ``count`` excludes it)."""

    pid: int
    tid: int
    name: str
    records: list[tuple[Any, ...]]
    count: int

    def kept(self) -> list[tuple[Any, ...]]:
        return self.records[: self.count]


@dataclass
class Collected:
    """Records of one capture, with the clock facts needed to place them in Unix time.

    ``offset_ns`` converts the monotonic clock to Unix-epoch ns (measured at start, to within
    ``offset_err_ns``); ``offset_end_ns`` is the same measured at stop (their difference is the
    wall clock's drift or step during the capture, worth keeping in the store's meta).
    ``start_ns``/``stop_ns`` are the capture's bounds in Unix-epoch ns.
    """

    threads: list[ThreadRecords]
    dropped: int
    verbosity: int
    max_records: int
    offset_ns: int
    offset_err_ns: int
    offset_end_ns: int
    start_ns: int
    stop_ns: int
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def records(self) -> int:
        """Records kept, all threads together."""
        return sum(t.count for t in self.threads)

    def to_raw(
        self, base_ns: int = 0, *, index_start: int = 0, names: bool = True
    ) -> dict[str, pa.Table]:
        """Raw tables (``raw.KINDS`` → ``RAW_SCHEMA``) for ``trace.build.build_tables``.

        ``ts`` is Unix-epoch ns minus ``base_ns`` (pass a Kineto trace's
        ``baseTimeNanoseconds`` to put the rows on its time base). ``index`` numbers the event
        rows from ``index_start``, then the metadata rows, so they can follow another source's
        rows in one part. ``names`` adds ``process_name``/``thread_name`` metadata rows (leave
        it off when the other source already names these threads).
        """
        import msgspec
        import numpy as np
        import pyarrow as pa

        from xpuprof.core.raw import KINDS, RAW_SCHEMA

        enc = msgspec.json.Encoder(enc_hook=str)
        t0: list[int] = []
        t1: list[int] = []
        name_col: list[Any] = []
        kinds: list[Any] = []
        fields: list[Any] = []
        pid_parts, tid_parts = [], []
        for th in self.threads:
            recs = th.kept()
            if not recs:
                continue
            # column by column: itemgetter keeps this in C (zip(*recs) over a million records
            # is 8x slower, most of it in garbage collection of its iterators)
            t0 += map(_COL0, recs)
            t1 += map(_COL1, recs)
            name_col += map(_COL2, recs)
            fields += map(_COL3, recs)
            kinds += map(_COL4, recs)
            pid_parts.append(np.full(len(recs), th.pid, np.int64))
            tid_parts.append(np.full(len(recs), th.tid, np.int64))
        n = len(t0)
        start = np.array(t0, dtype=np.int64)
        end = np.array(t1, dtype=np.int64)
        pid = np.concatenate(pid_parts) if pid_parts else np.zeros(0, np.int64)
        tid = np.concatenate(tid_parts) if tid_parts else np.zeros(0, np.int64)
        # by thread, then start, longest first: outer spans before what they contain (records
        # were appended as spans closed, inner first)
        order = np.lexsort((start - end, start, tid, pid))
        is_step = np.asarray(np.array(kinds, dtype=object) == _STEP, dtype=bool).reshape(n)
        for i in np.flatnonzero(is_step).tolist():
            name_col[i] = f"step#{name_col[i]}"
        try:
            name_arr = pa.array(name_col, pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a name that is not a str
            name_arr = pa.array([v if type(v) is str else str(v) for v in name_col], pa.string())
        name_arr = name_arr.take(order).dictionary_encode()
        args = pa.array(
            [None if f is None else enc.encode(f).decode() for f in fields], pa.large_string()
        ).take(order)
        start, end, pid, tid = start[order], end[order], pid[order], tid[order]
        events = _raw_table(
            RAW_SCHEMA,
            n,
            index=np.arange(index_start, index_start + n, dtype=np.int64),
            ph=_const("X", n),
            cat=pa.DictionaryArray.from_arrays(
                pa.array(is_step[order].astype(np.int32)),
                pa.array([CAT_ANNOTATION, CAT_STEP]),
            ),
            name=pa.DictionaryArray.from_arrays(
                name_arr.indices.cast(pa.int32()), name_arr.dictionary
            ),
            pid=pid,
            tid=tid,
            ts=start + np.int64(self.offset_ns - base_ns),
            dur=end - start,
            args=args,
        )

        meta_rows: list[tuple[str, int, int, str]] = []
        meta_ts = self.start_ns - base_ns
        if names:
            for p in dict.fromkeys(th.pid for th in self.threads):
                meta_rows.append(("process_name", p, 0, enc.encode({"name": "python"}).decode()))
            for th in self.threads:
                meta_rows.append(
                    ("thread_name", th.pid, th.tid, enc.encode({"name": th.name}).decode())
                )
        m = len(meta_rows)
        metadata = _raw_table(
            RAW_SCHEMA,
            m,
            index=np.arange(index_start + n, index_start + n + m, dtype=np.int64),
            ph=_const("M", m),
            name=pa.array([r[0] for r in meta_rows], pa.string()).dictionary_encode(),
            pid=np.array([r[1] for r in meta_rows], dtype=np.int64),
            tid=np.array([r[2] for r in meta_rows], dtype=np.int64),
            ts=np.full(m, meta_ts, dtype=np.int64),
            args=pa.array([r[3] for r in meta_rows], pa.large_string()),
        )
        out = {k: RAW_SCHEMA.empty_table() for k in KINDS}
        out["events"] = events
        out["metadata"] = metadata
        return out


_COL0, _COL1, _COL2, _COL3, _COL4 = (operator.itemgetter(i) for i in range(5))


def _const(value: str, n: int) -> Any:
    import numpy as np
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value]))


def _raw_table(schema: Any, n: int, **cols: Any) -> pa.Table:
    """A RAW_SCHEMA table of ``n`` rows from the given columns, every other column null."""
    import pyarrow as pa

    arrays = []
    for f in schema:
        v = cols.get(f.name)
        if v is None:
            arrays.append(pa.nulls(n, f.type))
        elif isinstance(v, (pa.Array, pa.ChunkedArray)):
            arrays.append(v.cast(f.type) if v.type != f.type else v)
        else:
            arrays.append(pa.array(v, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _reset_for_tests() -> None:  # pragma: no cover - used by tests after a failure mid-capture
    """Stop any capture without collecting (tests call this so one failure cannot leak)."""
    global _active, _threshold, _local, _capture
    with _lock:
        _active, _threshold, _capture = False, _OFF, None
        _local = threading.local()

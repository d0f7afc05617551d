"""What an annotation capture collected, and its conversion to raw tables (``core.raw``).

Recording (``capture/annotate.py``) appends one tuple ``(start, end, name, fields, kind)`` per
span to a per-thread list on the monotonic clock; here those lists become the normaliser's raw
tables, column by column, on Unix-epoch nanoseconds. Kept apart from ``annotate`` so that the
module every annotated program imports holds only the recording path; this one, too, imports
only the standard library until ``to_raw`` runs.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

__all__ = ["CAT_ANNOTATION", "CAT_STEP", "STEP_KIND", "Collected", "ThreadRecords"]

#: Raw category of annotation spans (the normaliser maps it to level ``annotation``).
CAT_ANNOTATION = "xpuprof_annotation"
#: Raw category of step spans, named ``step#N`` (the normaliser maps them to level ``step``).
CAT_STEP = "xpuprof_step"
#: ``kind`` of a step record (annotation records hold their integer level instead).
STEP_KIND = "step"

_COL0, _COL1, _COL2, _COL3, _COL4 = (operator.itemgetter(i) for i in range(5))


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
        """Raw tables (``raw.KINDS`` → ``RAW_SCHEMA``) for ``trace.normalize.build_tables``.

        ``ts`` is Unix-epoch ns minus ``base_ns`` (pass a Kineto trace's
        ``baseTimeNanoseconds`` to put the rows on its time base). ``index`` numbers the event
        rows from ``index_start``, then the metadata rows, so they can follow another source's
        rows in one part. ``names`` adds ``process_name``/``thread_name`` metadata rows (leave
        it off when the other source already names these threads).
        """
        from xpuprof.core.raw import KINDS, RAW_SCHEMA

        spans = _Spans.of(self.threads)
        events = spans.table(self.offset_ns - base_ns, index_start)
        threads = self.threads if names else []
        metadata = _names_table(threads, self.start_ns - base_ns, index_start + spans.n)
        out = {k: RAW_SCHEMA.empty_table() for k in KINDS}
        out["events"] = events
        out["metadata"] = metadata
        return out


@dataclass
class _Spans:
    """Every kept record of every thread as columns, outer spans before what they contain."""

    n: int
    start: np.ndarray
    end: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    is_step: np.ndarray
    names: pa.DictionaryArray
    args: pa.Array

    @classmethod
    def of(cls, threads: list[ThreadRecords]) -> _Spans:
        import msgspec
        import numpy as np
        import pyarrow as pa

        t0: list[int] = []
        t1: list[int] = []
        name_col: list[Any] = []
        kinds: list[Any] = []
        fields: list[Any] = []
        pid_parts, tid_parts = [], []
        for th in threads:
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
        is_step = np.asarray(np.array(kinds, dtype=object) == STEP_KIND, dtype=bool).reshape(n)
        for i in np.flatnonzero(is_step).tolist():
            name_col[i] = f"step#{name_col[i]}"
        try:
            name_arr = pa.array(name_col, pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # a name that is not a str
            name_arr = pa.array([v if type(v) is str else str(v) for v in name_col], pa.string())
        enc = msgspec.json.Encoder(enc_hook=str)
        args = pa.array(
            [None if f is None else enc.encode(f).decode() for f in fields], pa.large_string()
        )
        return cls(
            n,
            start[order],
            end[order],
            pid[order],
            tid[order],
            is_step[order],
            name_arr.take(order).dictionary_encode(),
            args.take(order),
        )

    def table(self, shift_ns: int, index_start: int) -> pa.Table:
        """The event rows: ``ts`` moved by ``shift_ns``, ``index`` from ``index_start``."""
        import numpy as np
        import pyarrow as pa

        from xpuprof.core.raw import RAW_SCHEMA

        n = self.n
        return _raw_table(
            RAW_SCHEMA,
            n,
            index=np.arange(index_start, index_start + n, dtype=np.int64),
            ph=_const("X", n),
            cat=pa.DictionaryArray.from_arrays(
                pa.array(self.is_step.astype(np.int32)),
                pa.array([CAT_ANNOTATION, CAT_STEP]),
            ),
            name=pa.DictionaryArray.from_arrays(
                self.names.indices.cast(pa.int32()), self.names.dictionary
            ),
            pid=self.pid,
            tid=self.tid,
            ts=self.start + np.int64(shift_ns),
            dur=self.end - self.start,
            args=self.args,
        )


def _names_table(threads: list[ThreadRecords], ts: int, index_start: int) -> pa.Table:
    """``process_name``/``thread_name`` metadata rows of the threads that recorded, at ``ts``."""
    import msgspec
    import numpy as np
    import pyarrow as pa

    from xpuprof.core.raw import RAW_SCHEMA

    enc = msgspec.json.Encoder(enc_hook=str)
    rows: list[tuple[str, int, int, str]] = []
    for p in dict.fromkeys(th.pid for th in threads):
        rows.append(("process_name", p, 0, enc.encode({"name": "python"}).decode()))
    for th in threads:
        rows.append(("thread_name", th.pid, th.tid, enc.encode({"name": th.name}).decode()))
    m = len(rows)
    return _raw_table(
        RAW_SCHEMA,
        m,
        index=np.arange(index_start, index_start + m, dtype=np.int64),
        ph=_const("M", m),
        name=pa.array([r[0] for r in rows], pa.string()).dictionary_encode(),
        pid=np.array([r[1] for r in rows], dtype=np.int64),
        tid=np.array([r[2] for r in rows], dtype=np.int64),
        ts=np.full(m, ts, dtype=np.int64),
        args=pa.array([r[3] for r in rows], pa.large_string()),
    )


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

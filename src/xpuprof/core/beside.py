"""Work run beside the caller on one short-lived thread, only where it pays.

Why: a big file's normalise and write is the serial tail of its import (the other workers
wait), and parts of it run without the GIL (numpy's sorts, Parquet encoding), so a second thread
shortens it. For the many small files of a many-rank import every core is busy already, and a
second thread per worker only adds hand-overs of the GIL. So the thread is used from
``MIN_ROWS`` rows up, and the same code runs inline below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

#: Rows (events) from which the work of one table is split over two threads.
MIN_ROWS = 1_000_000

Submit = Callable[..., "Future[Any]"]


def _inline(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run ``fn`` now; its result (or error) in a done Future, as a pool would give it."""
    fut: Future[Any] = Future()
    try:
        fut.set_result(fn(*args))
    except BaseException as e:  # re-raised by .result(), as from a pool
        fut.set_exception(e)
    return fut


@contextlib.contextmanager
def beside(rows: int, name: str) -> Iterator[Submit]:
    """A ``submit(fn, *args) -> Future``: on one thread of its own (named ``xpuprof-NAME``)
    when ``rows >= MIN_ROWS``, else run at once. The thread is joined when the block ends,
    on every path."""
    if rows < MIN_ROWS:
        yield _inline
        return
    with ThreadPoolExecutor(1, thread_name_prefix=f"xpuprof-{name}") as pool:
        yield pool.submit

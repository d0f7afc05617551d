"""core/beside.py: a second thread for the work of big tables only, joined on every path."""

from __future__ import annotations

import threading

import pytest

from xpuprof.core.beside import MIN_ROWS, beside


def _where() -> str:
    return threading.current_thread().name


def test_small_tables_run_inline() -> None:
    before = threading.active_count()
    with beside(MIN_ROWS - 1, "t") as submit:
        fut = submit(_where)
        assert threading.active_count() == before  # no thread was started
    assert fut.done() and fut.result() == threading.current_thread().name
    with beside(10, "t") as submit:
        failed = submit(int, "not a number")
    with pytest.raises(ValueError):  # the error comes back through .result(), as from a pool
        failed.result()


def test_big_tables_get_one_thread_joined_at_the_end() -> None:
    gate = threading.Event()
    with beside(MIN_ROWS, "probe") as submit:
        fut = submit(lambda: (gate.wait(10), _where())[1])
        names = [t.name for t in threading.enumerate()]
        assert sum(n.startswith("xpuprof-probe") for n in names) == 1
        gate.set()
    assert fut.result().startswith("xpuprof-probe")
    assert not any(t.name.startswith("xpuprof-probe") for t in threading.enumerate())


def test_thread_is_joined_when_the_block_fails() -> None:
    gate = threading.Event()
    with pytest.raises(RuntimeError), beside(MIN_ROWS, "fail") as submit:
        fut = submit(lambda: gate.wait(10))
        gate.set()
        raise RuntimeError("the caller's own error")
    assert fut.done()
    assert not any(t.name.startswith("xpuprof-fail") for t in threading.enumerate())

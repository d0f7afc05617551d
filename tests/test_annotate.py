"""Annotations and step markers (``xpuprof.capture.annotate``).

What is checked against something independent: span times against ``time.time_ns()`` read
around them, thread ids against ``threading.get_native_id()`` read in each thread, args against
the fields passed, nesting against the normaliser's own ``parent`` column, and the time base
against the aten ops torch's profiler records inside an annotation. Speed is measured in
``benchmarks/bench_annotate.py``, not asserted here.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator

import msgspec
import pyarrow as pa
import pytest

from xpuprof.capture import annotate as A
from xpuprof.capture.annotate import annotate, step
from xpuprof.core.errors import XpuprofError
from xpuprof.core.raw import KINDS, RAW_SCHEMA
from xpuprof.trace.normalize import build_tables


@pytest.fixture(autouse=True)
def no_leftover_capture() -> Iterator[None]:
    """Each test starts and ends with no capture, even when it fails halfway."""
    A._reset_for_tests()
    yield
    A._reset_for_tests()


def events(collected: A.Collected, base_ns: int = 0) -> list[dict]:
    """The event rows of ``to_raw`` as dicts, args decoded."""
    rows = collected.to_raw(base_ns)["events"].to_pylist()
    for r in rows:
        r["fields"] = json.loads(r["args"]) if r["args"] is not None else None
    return rows


def by_name(rows: list[dict], name: str) -> list[dict]:
    return [r for r in rows if r["name"] == name]


def contains(outer: dict, inner: dict) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


# ----------------------------------------------------------------------------------------------
# nesting, threads, decorators, fields
# ----------------------------------------------------------------------------------------------


def test_nested_spans_are_contained_in_time() -> None:
    A.start()
    with annotate("outer"):
        with annotate("middle"):
            with annotate("inner"):
                time.sleep(0.001)
        with annotate("sibling"):
            pass
    rows = events(A.stop())
    assert [r["name"] for r in rows] == ["outer", "middle", "inner", "sibling"]
    outer, middle, inner, sibling = rows
    assert contains(outer, middle) and contains(middle, inner) and contains(outer, sibling)
    assert inner["dur"] >= 1_000_000  # the sleep
    assert sibling["ts"] >= middle["ts"] + middle["dur"]
    assert {r["cat"] for r in rows} == {A.CAT_ANNOTATION}
    assert {r["ph"] for r in rows} == {"X"}


def test_spans_of_three_threads_land_with_their_own_tids() -> None:
    tids: dict[str, int] = {}
    barrier = threading.Barrier(3)

    def work(label: str) -> None:
        tids[label] = threading.get_native_id()
        barrier.wait()  # all three alive at once, so their native ids are distinct
        for i in range(5):
            with annotate(f"{label}-outer", i=i):
                with annotate(f"{label}-inner"):
                    pass
        barrier.wait()

    A.start()
    threads = [threading.Thread(target=work, args=(x,), name=f"worker-{x}") for x in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    collected = A.stop()
    rows = events(collected)
    assert len(set(tids.values())) == 3
    for label, tid in tids.items():
        mine = [r for r in rows if r["name"].startswith(label)]
        assert len(mine) == 10
        assert {r["tid"] for r in mine} == {tid}
        outers = by_name(mine, f"{label}-outer")
        assert [r["fields"]["i"] for r in outers] == list(range(5))
        for o in outers:  # each inner lies in exactly one outer of its own thread
            assert sum(contains(o, x) for x in by_name(mine, f"{label}-inner")) == 1
    assert {r["pid"] for r in rows} == {os.getpid()}
    meta = collected.to_raw()["metadata"].to_pylist()
    names = {r["tid"]: json.loads(r["args"])["name"] for r in meta if r["name"] == "thread_name"}
    assert names == {tids[x]: f"worker-{x}" for x in "abc"}


# Decorated at import time, while no capture runs: the decorator must still know its name.
@annotate("fwd", layer=3)
def forward(x: int) -> int:
    return x + 1


@annotate
def bare(x: int) -> int:
    return 2 * x


@annotate("verbose_fn", level=2)
def verbose_fn() -> None:
    pass


@annotate("async_fn")
async def async_fn(delay: float) -> str:
    await asyncio.sleep(delay)
    return "done"


def test_decorators_record_the_function_name_and_keep_behaviour() -> None:
    assert forward(1) == 2 and bare(2) == 4  # outside a capture: plain calls
    assert forward.__name__ == "forward" and bare.__qualname__ == "bare"
    A.start()
    assert forward(41) == 42
    assert bare(5) == 10
    verbose_fn()  # level 2 > verbosity 1: not recorded
    assert asyncio.run(async_fn(0.002)) == "done"

    class Model:
        @annotate
        def method(self) -> str:
            return "m"

    assert Model().method() == "m"
    rows = events(A.stop())
    assert [r["name"] for r in rows] == [
        "fwd",
        "bare",
        "async_fn",
        "test_decorators_record_the_function_name_and_keep_behaviour.<locals>.Model.method",
    ]
    assert rows[0]["fields"] == {"layer": 3}
    assert rows[2]["dur"] >= 2_000_000  # the awaited sleep is inside the span


def test_decorator_made_during_a_capture_and_exceptions_still_close_spans() -> None:
    A.start()

    @annotate("boom")
    def boom() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        boom()
    with pytest.raises(KeyError):
        with annotate("ctx_boom"):
            raise KeyError("y")
    rows = events(A.stop())
    assert [r["name"] for r in rows] == ["boom", "ctx_boom"]


def test_fields_land_as_json_args() -> None:
    class Shape:
        def __str__(self) -> str:
            return "Shape(2, 3)"

    A.start()
    with annotate("load_batch", size=32, path="/data/x", ratio=0.5, ok=True, ids=[1, 2]):
        pass
    with annotate("odd", shape=Shape(), nested={"a": None}):
        pass
    with annotate("plain"):
        pass
    rows = events(A.stop())
    assert rows[0]["fields"] == {"size": 32, "path": "/data/x", "ratio": 0.5, "ok": True,
                                 "ids": [1, 2]}  # fmt: skip
    assert rows[1]["fields"] == {"shape": "Shape(2, 3)", "nested": {"a": None}}
    assert rows[2]["args"] is None
    assert msgspec.json.decode(rows[0]["args"]) == rows[0]["fields"]


def test_verbosity_filters_by_level() -> None:
    def make() -> None:
        with annotate("l0", level=0):
            pass
        with annotate("l1"):
            pass
        with annotate("l2", level=2):
            pass
        with annotate("l3", level=3, detail="x"):
            pass
        with annotate("l9", level=9):
            pass

    A.start(verbosity=1)
    make()
    assert [r["name"] for r in events(A.stop())] == ["l0", "l1"]
    A.start(verbosity=3)
    make()
    assert [r["name"] for r in events(A.stop())] == ["l0", "l1", "l2", "l3"]
    A.start(verbosity=0)
    make()
    assert [r["name"] for r in events(A.stop())] == ["l0"]


def test_max_records_drops_and_counts() -> None:
    A.start(max_records=5)
    for i in range(12):
        with annotate("a", i=i):
            pass
    collected = A.stop()
    assert collected.records == 5 and collected.dropped == 7
    assert [r["fields"]["i"] for r in events(collected)] == [0, 1, 2, 3, 4]

    # threads share one budget; steps count against it too
    A.start(max_records=10)

    def work() -> None:
        for _ in range(6):
            with annotate("t"):
                pass

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    step(1)
    collected = A.stop()
    assert collected.records == 10 and collected.dropped == 18 + 1 - 10


# ----------------------------------------------------------------------------------------------
# steps
# ----------------------------------------------------------------------------------------------


def test_plain_step_calls_make_spans_containing_their_work() -> None:
    A.start()
    for i in range(3):
        step(i)
        with annotate("work", i=i):
            time.sleep(0.0005)
    step(None)
    with annotate("after"):
        pass
    step(7)  # left open: the end of the capture closes it
    with annotate("last"):
        pass
    rows = events(A.stop())
    steps = [r for r in rows if r["cat"] == A.CAT_STEP]
    assert [s["name"] for s in steps] == ["step#0", "step#1", "step#2", "step#7"]
    works = by_name(rows, "work")
    for s, w in zip(steps, works, strict=False):
        assert contains(s, w)
        assert sum(contains(s, x) for x in works) == 1
    after = by_name(rows, "after")[0]
    assert not any(contains(s, after) for s in steps)
    assert contains(steps[3], by_name(rows, "last")[0])
    # consecutive plain steps touch: one ends where the next begins
    assert steps[0]["ts"] + steps[0]["dur"] == steps[1]["ts"]


def test_with_step_spans_its_block() -> None:
    A.start()
    for i in range(2):
        with step(i):
            with annotate("fwd"):
                pass
            with annotate("bwd"):
                pass
    with annotate("outside"):
        pass
    rows = events(A.stop())
    steps = [r for r in rows if r["cat"] == A.CAT_STEP]
    assert [s["name"] for s in steps] == ["step#0", "step#1"]
    for s in steps:
        assert sum(contains(s, x) for x in by_name(rows, "fwd")) == 1
        assert sum(contains(s, x) for x in by_name(rows, "bwd")) == 1
        assert not contains(s, by_name(rows, "outside")[0])


def test_steps_are_per_thread() -> None:
    A.start()
    step(1)

    def other() -> None:
        step(100)  # must not close the main thread's step 1
        with annotate("other_work"):
            pass

    t = threading.Thread(target=other)
    t.start()
    t.join()
    with annotate("main_work"):
        pass
    rows = events(A.stop())
    s1, s100 = by_name(rows, "step#1")[0], by_name(rows, "step#100")[0]
    assert contains(s1, by_name(rows, "main_work")[0])
    assert contains(s100, by_name(rows, "other_work")[0])
    assert s1["tid"] == threading.get_native_id() != s100["tid"]


# ----------------------------------------------------------------------------------------------
# disabled mode, capture control
# ----------------------------------------------------------------------------------------------


def test_disabled_records_nothing_and_returns_cached_no_ops() -> None:
    assert not A.is_active()
    with annotate("before"):
        pass
    step(3)
    # the same cached object for the same name: nothing is made per call
    assert annotate("x") is annotate("x")
    assert step(1) is step(2)
    A.start(verbosity=1)
    assert annotate("y", level=2) is annotate("y", level=2)  # filtered by verbosity: cached too
    collected = A.stop()
    assert collected.records == 0 and collected.dropped == 0
    with annotate("after"):
        pass
    forward(1)
    A.start()
    assert A.stop().records == 0


def test_capture_control_errors() -> None:
    with pytest.raises(XpuprofError, match="no annotation capture"):
        A.stop()
    A.start()
    with pytest.raises(XpuprofError, match="already active"):
        A.start()
    A.stop()
    with pytest.raises(XpuprofError, match="verbosity"):
        A.start(verbosity=-1)
    with pytest.raises(XpuprofError, match="max_records"):
        A.start(max_records=-5)


def test_span_closed_on_another_thread_records_on_the_opening_thread() -> None:
    A.start()
    span = annotate("handoff")
    span.__enter__()
    t = threading.Thread(target=span.__exit__, args=(None, None, None))
    t.start()
    t.join()
    rows = events(A.stop())
    assert [(r["name"], r["tid"]) for r in rows] == [("handoff", threading.get_native_id())]


def test_span_still_open_at_stop_is_not_collected() -> None:
    A.start()
    span = annotate("late")
    span.__enter__()
    collected = A.stop()
    span.__exit__(None, None, None)  # after stop: harmless, not part of the capture
    assert collected.records == 0
    assert events(collected) == []


# ----------------------------------------------------------------------------------------------
# raw tables: schema, times, normaliser
# ----------------------------------------------------------------------------------------------


def test_to_raw_has_raw_schema_and_numbers_rows_from_index_start() -> None:
    A.start()
    step(0)
    with annotate("a"):
        pass
    collected = A.stop()
    raw = collected.to_raw(1_000, index_start=500)
    assert set(raw) == set(KINDS)
    for kind, table in raw.items():
        assert table.schema.equals(RAW_SCHEMA), kind
    ev, meta = raw["events"], raw["metadata"]
    assert ev["index"].to_pylist() == [500, 501]
    assert meta["index"].to_pylist() == [502, 503]  # process_name, thread_name
    assert meta["name"].to_pylist() == ["process_name", "thread_name"]
    assert raw["flows"].num_rows == 0 and raw["counters"].num_rows == 0
    shifted = collected.to_raw(0)["events"]
    assert [
        a - b for a, b in zip(shifted["ts"].to_pylist(), ev["ts"].to_pylist(), strict=True)
    ] == [
        1_000,
        1_000,
    ]
    assert collected.to_raw(names=False)["metadata"].num_rows == 0
    # an empty capture gives empty tables of the same schema
    A.start()
    empty = A.stop().to_raw()
    assert all(t.schema.equals(RAW_SCHEMA) for t in empty.values())
    assert empty["events"].num_rows == 0


def test_times_agree_with_the_wall_clock() -> None:
    A.start()
    spans = []
    for _ in range(5):
        w0 = time.time_ns()
        with annotate("timed"):
            time.sleep(0.002)
        w1 = time.time_ns()
        spans.append((w0, w1))
    collected = A.stop()
    rows = events(collected)
    # tolerance: the offset's own uncertainty plus a margin for wall-clock slewing
    tol = collected.offset_err_ns + 50_000
    for r, (w0, w1) in zip(rows, spans, strict=True):
        assert w0 - tol <= r["ts"] and r["ts"] + r["dur"] <= w1 + tol
        assert r["dur"] >= 2_000_000
    assert abs(collected.offset_end_ns - collected.offset_ns) < 1_000_000
    assert collected.start_ns <= rows[0]["ts"] + tol and rows[-1]["ts"] <= collected.stop_ns


def test_normaliser_nests_inner_annotation_in_outer_and_in_step() -> None:
    A.start()
    step(4)
    with annotate("outer"):
        with annotate("inner", k=1):
            pass
    collected = A.stop()
    raw = collected.to_raw(collected.start_ns)
    tables = build_tables(raw, part=0, rank=None, host=None, string_ids={})
    ev = tables.events.to_pylist()
    by = {r["name"]: r for r in ev}
    assert by["inner"]["parent"] == by["outer"]["id"]
    assert by["outer"]["parent"] == by["step#4"]["id"]
    assert by["step#4"]["parent"] is None
    assert by["inner"]["depth"] == 2
    assert json.loads(by["inner"]["args"]) == {"k": 1}
    assert tables.metadata.num_rows == 2


def test_time_base_matches_torch_profiler_events() -> None:
    """Our spans, put on a Kineto trace's base, contain the aten ops torch recorded in them."""
    torch = pytest.importorskip("torch")
    import tempfile
    from pathlib import Path

    a = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        A.start()
        for i in range(3):
            with annotate("matmul_block", i=i):
                for _ in range(4):
                    torch.mm(a, a)
            time.sleep(0.001)
        collected = A.stop()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    base = int(trace["baseTimeNanoseconds"])
    mms = [
        e
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e.get("name") == "aten::mm" and e.get("cat") == "cpu_op"
    ]
    assert len(mms) == 12
    ours = by_name(events(collected, base_ns=base), "matmul_block")
    assert len(ours) == 3
    for e in mms:
        ts = round(float(e["ts"]) * 1000)
        end = ts + round(float(e["dur"]) * 1000)
        # slack for the two clocks' conversions to Unix time (measured agreement: ~1 us); the
        # blocks are 1 ms apart, and a unit or base mistake would be off by far more
        slack = 10_000
        inside = [o for o in ours if o["ts"] - slack <= ts and end <= o["ts"] + o["dur"] + slack]
        assert len(inside) == 1, (ts, end, [(o["ts"], o["dur"]) for o in ours])
        assert inside[0]["tid"] == e["tid"] and inside[0]["pid"] == e["pid"]


def test_raw_tables_are_arrow_tables_of_the_right_types() -> None:
    A.start()
    with annotate("x", n=1):
        pass
    ev = A.stop().to_raw()["events"]
    assert isinstance(ev, pa.Table)
    assert ev.column("name").type == pa.dictionary(pa.int32(), pa.string())
    assert ev["args"].to_pylist() == ['{"n":1}']

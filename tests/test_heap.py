"""core/heap.py: glibc's heap kept roomy while a decode runs, in a process started with fixed
heap thresholds (as Dask's Nanny starts its workers), and left alone everywhere else.

The behaviour is checked in fresh interpreters started with and without
``MALLOC_TRIM_THRESHOLD_``, by the page faults of a loop that allocates, fills and frees 4 MiB
buffers: with a fixed threshold every buffer is a fresh mmap, its 1024 pages faulted in again;
from a heap that keeps its memory, none are."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from xpuprof.core import heap


def test_start_settings_reads_variables_and_tunables() -> None:
    env = b"\0".join([
        b"PATH=/bin",
        b"MALLOC_TRIM_THRESHOLD_=65536",
        b"MALLOC_MMAP_THRESHOLD_=0x40000",
        b"GLIBC_TUNABLES=glibc.malloc.top_pad=4096:glibc.malloc.arena_max=2",
        b"MALLOC_MMAP_MAX_=oops",  # not a number: not a setting glibc would use either
        b"",
    ])  # fmt: skip
    assert heap.start_settings(env) == {"trim": 65536, "mmap": 0x40000, "top_pad": 4096}
    assert heap.start_settings(b"PATH=/bin\0HOME=/root\0") == {}


linux_glibc = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
    reason="glibc's heap thresholds: Linux with glibc only",
)

_PROBE = textwrap.dedent("""
    import json, os, resource, sys
    from xpuprof.core import heap

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def churn(rounds=40, size=4 << 20):
        before = faults()
        for _ in range(rounds):
            buf = b"x" * size  # allocated, every page written, freed
            del buf
        return faults() - before

    churn(4)  # warm up: the interpreter's own first allocations
    out = {"settings": heap.start_settings(), "outside": churn()}
    with heap.roomy() as raised:
        churn(2)  # the heap grows to hold one buffer once
        out["raised"] = raised
        out["inside"] = churn()
        with heap.roomy() as again:  # nested: one raise, undone by the outer block only
            out["nested"] = again
        out["inside_after_nested"] = churn()
    out["after"] = churn()
    os.environ["MALLOC_TRIM_THRESHOLD_"] = "65536"  # set late: glibc never reads it
    out["late"] = heap.start_settings()
    print(json.dumps(out))
""")


def _probe(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.pop("GLIBC_TUNABLES", None)
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**clean, **env},
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return json.loads(out.stdout)


@linux_glibc
def test_fixed_threshold_is_raised_in_the_block_and_restored_after() -> None:
    r = _probe(MALLOC_TRIM_THRESHOLD_="65536")  # what Dask's Nanny gives its workers
    assert r["settings"] == {"trim": 65536}
    assert r["raised"] is True and r["nested"] is True
    pages = 40 * (4 << 20) // 4096  # every page of every buffer
    # fixed thresholds: every buffer is mapped and faulted in anew
    assert r["outside"] >= 0.8 * pages, r
    # inside the block the heap keeps the memory: almost nothing is faulted in again
    assert r["inside"] < 0.05 * pages, r
    assert r["inside_after_nested"] < 0.05 * pages, r  # the nested block undid nothing
    # after it, the process's own settings are back
    assert r["after"] >= 0.8 * pages, r
    assert r["late"] == r["settings"]  # the late variable is not counted


@linux_glibc
def test_growing_thresholds_are_left_alone() -> None:
    r = _probe()
    assert r["settings"] == {}
    assert r["raised"] is False
    pages = 40 * (4 << 20) // 4096
    # glibc's own thresholds grew after the first free: no refaults, before or after
    assert r["outside"] < 0.05 * pages, r
    assert r["after"] < 0.05 * pages, r
    # a variable set after the start is not a setting glibc read
    assert r["late"] == {}


_TASKS = textwrap.dedent("""
    import json, pickle
    from xpuprof.core import heap
    from xpuprof.formats.kineto import split
    from xpuprof.trace import ingest

    seen = {}

    def spy(name):
        def call(*args, **kwargs):
            seen[name] = heap.raised()
            raise LookupError(name)  # enough: the task's body ran this far
        return call

    ingest.read_source = spy("import_file")
    split.decode_piece = spy("read_piece")
    split.combine = spy("import_pieces")
    for task, args in ((ingest.import_file, (heap.__file__, 0, ".", False)),
                       (ingest.read_piece, ("t.json", 0, None, True, "", ".", "0-0", False)),
                       (ingest.import_pieces, ({"path": "t.json"}, [], "", 0, ".", False))):
        try:
            task(*args)
        except LookupError:
            pass
    # Dask sends the tasks by reference: the name must lead back to the wrapped function
    same = all(pickle.loads(pickle.dumps(t)) is t
               for t in (ingest.import_file, ingest.read_piece, ingest.import_pieces))
    print(json.dumps({"seen": seen, "after": heap.raised(), "pickles": same}))
""")


@linux_glibc
def test_import_tasks_run_with_the_heap_raised() -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _TASKS], capture_output=True, text=True,
                         env={**clean, "MALLOC_TRIM_THRESHOLD_": "65536"}, timeout=120,
                         check=True)  # fmt: skip
    r = json.loads(out.stdout)
    assert r == {"seen": {"import_file": True, "read_piece": True, "import_pieces": True},
                 "after": False, "pickles": True}  # fmt: skip


def _pool(name: str) -> object:
    import pyarrow as pa

    try:
        return getattr(pa, f"{name}_memory_pool")()
    except (NotImplementedError, AttributeError):
        pytest.skip(f"this pyarrow has no {name} allocator")


def test_arrow_on_the_system_allocator_in_the_block_only(monkeypatch, tmp_path) -> None:
    """Where nobody chose a pool, Arrow allocates from the system allocator inside the
    block (nested blocks share the switch) and from its default after; an import done in this
    process leaves the pool as it found it. A pool chosen by the variable or by
    ``set_memory_pool`` is never touched."""
    import pyarrow as pa
    from conftest import EXAMPLE

    import xpuprof

    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    before = pa.default_memory_pool()
    default = _pool(heap.DEFAULT_BACKEND)
    pa.set_memory_pool(default)  # type: ignore[arg-type]
    try:
        with heap.system_pool() as switched:
            assert switched
            assert pa.default_memory_pool().backend_name == "system"
            with heap.system_pool() as inner:
                assert inner and pa.default_memory_pool().backend_name == "system"
            assert pa.default_memory_pool().backend_name == "system"  # the outer block's
            kept = pa.array(list(range(1000)))  # made on the system allocator
        assert pa.default_memory_pool().backend_name == heap.DEFAULT_BACKEND
        assert kept.to_pylist()[-1] == 999  # still readable, freed by its own pool later
        entered = []
        real = heap.system_pool

        def watching():  # type: ignore[no-untyped-def]
            entered.append(True)
            return real()

        monkeypatch.setattr(heap, "system_pool", watching)
        xpuprof.import_traces([EXAMPLE], tmp_path / "s.store", workers=1)
        assert entered and pa.default_memory_pool().backend_name == heap.DEFAULT_BACKEND
        monkeypatch.setattr(heap, "system_pool", real)
        pa.set_memory_pool(_pool("jemalloc"))  # type: ignore[arg-type]
        with heap.system_pool() as switched:  # chosen in code
            assert not switched and pa.default_memory_pool().backend_name == "jemalloc"
        pa.set_memory_pool(default)  # type: ignore[arg-type]
        monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", heap.DEFAULT_BACKEND)
        with heap.system_pool() as switched:  # chosen by the variable
            assert not switched
            assert pa.default_memory_pool().backend_name == heap.DEFAULT_BACKEND
    finally:
        pa.set_memory_pool(before)

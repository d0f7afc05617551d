"""Shared fixtures: where the traces are, how to read them independently, how to run the CLI.

Expected numbers in these tests are computed from the raw JSON with the standard ``json`` and
``gzip`` modules, never from xpuprof's own output. The real traces published by others are found
in the folder named by the environment variable ``XPUPROF_TEST_TRACES`` (laid out like
``shared/traces``: ``kineto/``, ``xplane/``…) or, when it is not set, in ``../shared/traces``
relative to the project root. Tests that need them skip with a reason naming both; the rest of
the suite still exercises real behaviour on the trace shipped in the package and on traces the
tests write themselves (``tests/builders.py``).
"""

from __future__ import annotations

import contextlib
import decimal
import functools
import gc
import gzip
import json
import os
import subprocess
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest

#: The project root (the folder holding ``src/`` and ``tests/``).
ROOT = Path(__file__).resolve().parents[1]
#: The environment variable naming a folder of real traces laid out like ``shared/traces``.
TRACES_ENV = "XPUPROF_TEST_TRACES"
#: The default folder of real traces, next to the project root.
DEFAULT_TRACES = ROOT.parent / "shared" / "traces"


def traces_root() -> Path:
    """Where the real traces are: ``$XPUPROF_TEST_TRACES`` when set, else ../shared/traces."""
    env = os.environ.get(TRACES_ENV)
    return Path(env).expanduser().resolve() if env else DEFAULT_TRACES


SHARED_TRACES = traces_root()
KINETO = SHARED_TRACES / "kineto"
#: The real trace shipped inside the package (a PyTorch CPU training run).
EXAMPLE = Path(str(files("xpuprof") / "data" / "example_cpu_train.pt.trace.json.gz"))
NO_SHARED = (
    f"real traces not found at {SHARED_TRACES} (the suite reads ${TRACES_ENV} when set, else "
    f"../shared/traces relative to the project root, {DEFAULT_TRACES}); tests on the shipped "
    "example trace and on self-written traces still run"
)


def kineto_files() -> list[Path]:
    """Every Kineto trace under ../shared/traces/kineto (empty when the folder is absent)."""
    if not KINETO.is_dir():
        return []
    return sorted(
        p for p in KINETO.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz"))
    )


def shared(rel: str) -> Path:
    """A file under ../shared/traces, or skip the calling test when it is not there."""
    p = SHARED_TRACES / rel
    if not p.exists():
        pytest.skip(f"{p} not found: {NO_SHARED}")
    return p


def read_text(path: Path) -> bytes:
    """The JSON text of a trace file, decompressed with gzip when it is gzipped."""
    data = Path(path).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


@contextlib.contextmanager
def no_gc():
    """Pause the cyclic garbage collector: building millions of small dicts otherwise
    triggers full collections over everything the test session holds (2-3x slower)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def read_trace_json(path: Path, *, exact: bool = False) -> dict[str, Any]:
    """Parse a trace with the standard json module. ``exact`` keeps floats as Decimal (the
    text's exact value). A file that is a bare list of events is returned as
    ``{"traceEvents": [...]}``."""
    text = read_text(path)
    with no_gc():
        doc = json.loads(text, parse_float=decimal.Decimal) if exact else json.loads(text)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


@functools.lru_cache(maxsize=3)
def _cached_json(path: str, exact: bool) -> dict[str, Any]:
    return read_trace_json(Path(path), exact=exact)


@pytest.fixture(scope="session")
def raw_json():
    """``raw_json(path, exact=False)``: the parsed trace, cached for a few files (read-only)."""

    def get(path: Path, *, exact: bool = False) -> dict[str, Any]:
        return _cached_json(str(Path(path).resolve()), exact)

    return get


def us_to_ns(value: Any) -> int:
    """Exact nanoseconds of a microsecond value parsed with ``exact=True`` (int or Decimal)."""
    d = decimal.Decimal(value) * 1000
    assert d == d.to_integral_value(), f"{value} µs is not a whole number of nanoseconds"
    return int(d)


def cli(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``xpuprof`` as a user would (a fresh interpreter), capturing stdout and stderr;
    ``env`` adds variables to the test's own environment."""
    return subprocess.run(
        [sys.executable, "-m", "xpuprof.ui.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **env} if env else None,
        timeout=300,
    )


def cli_many(commands: list[list[str | Path]]) -> list[subprocess.CompletedProcess]:
    """Run several CLI commands at once (each in its own interpreter); results in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda args: cli(*args), commands))


def cli_json(*args: str | Path) -> Any:
    """Run a CLI command with ``--json``; it must succeed and print exactly one JSON document."""
    proc = cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def kineto_store(tmp_path_factory):
    """Every shared Kineto trace imported once, together, into one store (one part per file)."""
    import xpuprof

    if not kineto_files():
        pytest.skip(NO_SHARED)
    store = tmp_path_factory.mktemp("kineto") / "all.store"
    report = xpuprof.import_traces([KINETO], store, mixed=True)  # every kind of job
    trace = xpuprof.load(store)
    yield trace, report
    trace.close()


@pytest.fixture(scope="session")
def example_store(tmp_path_factory):
    """The trace shipped in the package (a real PyTorch CPU training run), imported once."""
    import xpuprof

    store = tmp_path_factory.mktemp("example") / "example.store"
    report = xpuprof.import_traces([EXAMPLE], store)
    trace = xpuprof.load(store)
    yield trace, report
    trace.close()


@pytest.fixture(scope="session")
def nccl(tmp_path_factory):
    """The A100 NCCL trace (rank 0 of 2) and its store, imported once for every test file."""
    import xpuprof

    path = shared("kineto/gpu/a100_rank0of2_nccl.json.gz")
    store = tmp_path_factory.mktemp("nccl") / "nccl.store"
    xpuprof.import_traces([path], store)
    trace = xpuprof.load(store)
    yield path, trace
    trace.close()


@pytest.fixture(scope="session")
def dlrm_store(tmp_path_factory):
    """The 8-rank DLRM job (one file per rank) imported once into one store, for every test
    file; yields the opened trace and the source files in name order. Read-only."""
    import xpuprof

    d = shared("kineto/gpu/dlrm_8rank_v100")
    files = sorted(d.glob("*.json.gz"))
    store = tmp_path_factory.mktemp("dlrm") / "dlrm.store"
    xpuprof.import_traces(files, store)
    trace = xpuprof.load(store)
    yield trace, files
    trace.close()


@pytest.fixture(scope="session")
def demo_capture(tmp_path_factory):
    """The built-in demo model (2 blocks) captured at level ``op`` with layer spans, 2 steps
    after 1 of warm-up, once for the suite. Yields the opened trace and the model's modules
    (path → type name; the root under its class name). Read-only."""
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    import xpuprof
    from xpuprof.workloads.demo import Trainer

    trainer = Trainer(batch=4, seq=32, layers=2)
    trainer.step()  # warm up outside the capture
    store = tmp_path_factory.mktemp("demo") / "demo.store"
    with xpuprof.profile(store, level="op", model=trainer.model, steps=2, warmup=1):
        for i in range(4):
            xpuprof.step(i)
            trainer.step()
    trace = xpuprof.load(store)
    modules = {path or type(trainer.model).__name__: type(m).__name__
               for path, m in trainer.model.named_modules()}  # fmt: skip
    yield trace, modules
    trace.close()

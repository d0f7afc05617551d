"""JAX side of a capture: ``jax.profiler`` writes XPlane, which ``formats.xplane`` reads.

``trace_jax(logdir)`` is the plain context manager (the files stay in ``logdir``, where XProf
and TensorBoard can open them too); ``start_jax`` / ``stop_jax_files`` are the two halves that
``xpuprof.profile`` calls around a JAX program, ending with the capture's raw tables.

jax is imported only inside these functions: xpuprof works without it, and says which extra to
install when asked to profile JAX without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xpuprof.core.errors import XpuprofError

_EXTRA = "pip install 'xpuprof[jax]' (or: pip install jax jaxlib)"


def require_jax() -> Any:
    """``jax`` itself, or an error naming the extra that provides it."""
    try:
        import jax
        import jax.profiler  # noqa: F401  (a broken jaxlib fails here, not at import jax)
    except ImportError as e:
        raise XpuprofError(f"profiling JAX needs jax and jaxlib: {_EXTRA} ({e})") from None
    return jax


def _options(jax: Any, python_tracer: bool | None, host_tracer_level: int | None) -> Any:
    if python_tracer is None and host_tracer_level is None:
        return None
    make = getattr(jax.profiler, "ProfileOptions", None)
    if make is None:
        raise XpuprofError(
            f"jax {jax.__version__} has no jax.profiler.ProfileOptions: python_tracer and "
            "host_tracer_level need a newer jax"
        )
    opts = make()
    if python_tracer is not None:
        opts.python_tracer_level = 1 if python_tracer else 0
    if host_tracer_level is not None:
        opts.host_tracer_level = host_tracer_level
    return opts


def _written(logdir: Path) -> list[Path]:
    """The XPlane files jax.profiler wrote under ``logdir``, newest first (listing only:
    reading them is the importer's job, to the right of capture in the pipeline)."""
    if not logdir.is_dir():
        return []
    found = [*logdir.rglob("*.xplane.pb"), *logdir.rglob("*.xplane.pb.gz")]
    return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)


def _xplane_files(logdir: Path) -> set[Path]:
    return set(_written(logdir))


@dataclass
class JaxTrace:
    """What a ``trace_jax`` block wrote; ``paths`` is filled when the block ends."""

    logdir: Path
    paths: list[Path] = field(default_factory=list)

    @property
    def path(self) -> Path:
        """The one XPlane file written (one per host; a single-process run writes one)."""
        if len(self.paths) != 1:
            raise XpuprofError(
                f"{self.logdir}: the trace wrote {len(self.paths)} XPlane files, not one: "
                f"{[str(p) for p in self.paths]}"
            )
        return self.paths[0]


def start_jax(
    logdir: str | Path,
    *,
    python_tracer: bool | None = None,
    host_tracer_level: int | None = None,
) -> str:
    """Start ``jax.profiler`` writing into ``logdir``; return a line saying what runs.

    ``python_tracer`` / ``host_tracer_level`` set jax's ``ProfileOptions`` (jax's defaults
    otherwise). A second concurrent trace is refused by jax with a RuntimeError.
    """
    jax = require_jax()
    d = Path(logdir)
    d.mkdir(parents=True, exist_ok=True)
    opts = _options(jax, python_tracer, host_tracer_level)
    if opts is None:
        jax.profiler.start_trace(str(d))
    else:
        jax.profiler.start_trace(str(d), profiler_options=opts)
    return f"jax.profiler {jax.__version__} (XPlane)"


def stop_jax_files(logdir: str | Path, before: set[Path] | None = None) -> list[Path]:
    """Stop the running ``jax.profiler`` trace; return the XPlane files it wrote into
    ``logdir`` (those not in ``before``), newest run first."""
    jax = require_jax()
    d = Path(logdir)
    jax.profiler.stop_trace()
    return [p for p in _written(d) if before is None or p not in before]


@contextlib.contextmanager
def trace_jax(
    logdir: str | Path,
    *,
    python_tracer: bool | None = None,
    host_tracer_level: int | None = None,
) -> Iterator[JaxTrace]:
    """Record the JAX work of a ``with`` block with ``jax.profiler`` into ``logdir``.

    Yields a :class:`JaxTrace` whose ``paths`` (``path`` when there is one) name the
    ``.xplane.pb`` files written, once the block ends::

        with trace_jax("logs") as t:
            train_step(params, batch).block_until_ready()
        raw = xpuprof.formats.xplane.read_xplane(t.path)

    The trace is stopped and written even when the block raises (the error then propagates).
    Remember to wait for asynchronous JAX work (``block_until_ready``) inside the block.
    """
    require_jax()
    d = Path(logdir)
    before = _xplane_files(d)
    result = JaxTrace(logdir=d)
    start_jax(d, python_tracer=python_tracer, host_tracer_level=host_tracer_level)
    try:
        yield result
    finally:
        result.paths = stop_jax_files(d, before)


__all__ = ["JaxTrace", "require_jax", "start_jax", "stop_jax_files", "trace_jax"]

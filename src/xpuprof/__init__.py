"""xpuprof: performance analysis for ML programs on accelerators.

``xpuprof.load(path)`` opens a store or imports trace files on the fly and returns a
:class:`~xpuprof.trace.trace.Trace`; ``xpuprof.import_traces`` builds a store. Attributes are
imported lazily so that ``import xpuprof`` (and the CLI's ``info``) stays fast.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load": ("xpuprof.trace.trace", "load"),
    "Trace": ("xpuprof.trace.trace", "Trace"),
    "import_traces": ("xpuprof.trace.ingest", "import_traces"),
    "LEVELS": ("xpuprof.schema", "LEVELS"),
    "XpuprofError": ("xpuprof.errors", "XpuprofError"),
    "annotate": ("xpuprof.capture.annotate", "annotate"),
    "step": ("xpuprof.session", "step"),
    "profile": ("xpuprof.session", "profile"),
    "serve": ("xpuprof.remote", "serve"),
    "TraceFormatError": ("xpuprof.errors", "TraceFormatError"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'xpuprof' has no attribute {name!r}")

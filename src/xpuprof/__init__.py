"""xpuprof: performance analysis for ML programs on accelerators.

``xpuprof.load(path)`` opens a store or imports trace files on the fly and returns a
:class:`~xpuprof.trace.trace.Trace`; ``xpuprof.import_traces`` builds a store. Attributes are
imported lazily so that ``import xpuprof`` (and the CLI's ``info``) stays fast.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "load": ("xpuprof.trace.trace", "load"),
    "Trace": ("xpuprof.trace.trace", "Trace"),
    "import_traces": ("xpuprof.trace.ingest", "import_traces"),
    "LEVELS": ("xpuprof.core.schema", "LEVELS"),
    "XpuprofError": ("xpuprof.core.errors", "XpuprofError"),
    "annotate": ("xpuprof.capture.annotate", "annotate"),
    "step": ("xpuprof.live.profile", "step"),
    "profile": ("xpuprof.live.profile", "profile"),
    "leveled": ("xpuprof.live.leveled", "leveled"),
    "serve": ("xpuprof.live.remote", "serve"),
    "TraceFormatError": ("xpuprof.core.errors", "TraceFormatError"),
    "StoreError": ("xpuprof.core.errors", "StoreError"),
    "Result": ("xpuprof.core.result", "Result"),
    "request_capture": ("xpuprof.live.remote", "request_capture"),
}

#: Modules that moved when the package was laid out by pipeline layer; the old dotted names
#: still import (as the new modules) so that scripts written against them keep working.
MOVED = {
    "xpuprof.names": "xpuprof.core.names",
    "xpuprof.schema": "xpuprof.core.schema",
    "xpuprof.raw": "xpuprof.core.raw",
    "xpuprof.errors": "xpuprof.core.errors",
    "xpuprof.session": "xpuprof.live.profile",
    "xpuprof.remote": "xpuprof.live.remote",
    "xpuprof.demo": "xpuprof.workloads.demo",
    "xpuprof.formats.chrome": "xpuprof.export.chrome",
    "xpuprof.trace.build": "xpuprof.trace.normalize",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import an old module name as the module that replaced it (one module object, so
    ``isinstance`` checks and module state are shared)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec: Any) -> Any:
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # import machinery overwrites __spec__: restore it
        return module

    def exec_module(self, module: Any) -> None:
        module.__spec__ = module.__spec__.loader_state


sys.meta_path.append(_MovedFinder())

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'xpuprof' has no attribute {name!r}")

"""PyTorch side of a capture: model-layer spans from module hooks, and the torch profiler.

Why hooks: torch.profiler records aten ops and kernels but not which model layer ran them;
XSP's across-stack view needs that level. A forward pre-hook and forward hook per module (and
the full backward pre-hook/hook pair, where the module allows it) bracket each module's work
with a span named by its path in the model (``encoder.layers.3.attn``) and carrying its type.
The spans are plain tuples appended to a per-thread list (a few microseconds per module call),
then merged with the profiler's events into one store, where the normaliser nests every aten op
inside the layer that ran it.

torch is imported only inside these functions: xpuprof works without it, and says which extra
to install when asked to profile PyTorch without it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import msgspec

from xpuprof.core.errors import XpuprofError


def require_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise XpuprofError(
            "profiling PyTorch needs torch: pip install 'xpuprof[torch]' "
            "(on this project's machines: pip install torch==2.13.0)"
        ) from None
    return torch


class LayerSpans:
    """Records one span per module call (forward, and backward where hooks allow) of a model.

    ``install(model)`` registers hooks on every submodule; ``remove()`` takes them off again.
    The hooks cost nothing once removed, and while installed check one flag before recording,
    so a model can keep them between captures.
    """

    def __init__(self, max_records: int = 1_000_000) -> None:
        self.max_records = max_records
        self.dropped = 0
        self.active = False
        self._handles: list[Any] = []
        self._local = threading.local()
        self._buffers: list[tuple[int, list[tuple[int, int, str, str, str]]]] = []
        self._lock = threading.Lock()
        self._count = 0
        self.backward = "off"
        self._clock: Any = time.perf_counter_ns
        self._converter: Any = None
        self._offset = 0

    # -- recording ---------------------------------------------------------------------------

    def _buffer(self) -> tuple[list[tuple[Any, ...]], list[int]]:
        loc = self._local
        try:
            return loc.open, loc.buf
        except AttributeError:
            loc.open = []
            loc.buf = []
            with self._lock:
                self._buffers.append((threading.get_native_id(), loc.buf))
            return loc.open, loc.buf

    def _enter(self, path: str, kind: str, phase: str) -> None:
        if not self.active:
            return
        opened, _ = self._buffer()
        opened.append((self._clock(), path, kind, phase))

    def _exit(self) -> None:
        if not self.active:
            return
        end = self._clock()
        opened, buf = self._buffer()
        if not opened:
            return  # a capture started between this module's pre-hook and hook
        start, path, kind, phase = opened.pop()
        if self._count >= self.max_records:
            self.dropped += 1
            return
        self._count += 1
        buf.append((start, end, path, kind, phase))

    # -- hooks -------------------------------------------------------------------------------

    def install(self, model: Any, backward: bool = True) -> LayerSpans:
        """Hook every submodule of ``model`` (named by its path; the root by its class)."""
        torch = require_torch()
        root_name = type(model).__name__
        for path, module in model.named_modules():
            name = path or root_name
            kind = type(module).__name__

            def pre(_m: Any, _inp: Any, name: str = name, kind: str = kind) -> None:
                self._enter(name, kind, "forward")

            def post(_m: Any, _inp: Any, _out: Any) -> None:
                self._exit()

            self._handles.append(module.register_forward_pre_hook(pre))
            self._handles.append(module.register_forward_hook(post))
        if backward:
            self.backward = self._install_backward(model, torch, root_name)
        return self

    def _install_backward(self, model: Any, torch: Any, root_name: str) -> str:
        """Full backward hooks wrap a module's inputs and outputs; modules whose outputs are
        then modified in place cannot have them, so failures turn backward spans off (said in
        the store's meta) rather than breaking the user's model."""
        handles = []
        try:
            for path, module in model.named_modules():
                if path and not list(module.children()) and not list(module.parameters(False)):
                    continue  # parameterless leaves (activations, dropout): often in-place
                name = path or root_name
                kind = type(module).__name__

                def bpre(_m: Any, _g: Any, name: str = name, kind: str = kind) -> None:
                    self._enter(name, kind, "backward")

                def bpost(_m: Any, _gi: Any, _go: Any) -> None:
                    self._exit()

                handles.append(module.register_full_backward_pre_hook(bpre))
                handles.append(module.register_full_backward_hook(bpost))
        except Exception as e:  # noqa: BLE001 - any refusal means: no backward spans
            for h in handles:
                h.remove()
            return f"off ({type(e).__name__}: {e})"
        self._handles.extend(handles)
        return "on"

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    # -- output ------------------------------------------------------------------------------

    def start(self) -> None:
        """Read time with torch's own profiler clock (the approximate, TSC-based clock Kineto
        stamps ops with) and convert it to Unix time the way torch does: spans measured with
        another clock drifted about a microsecond from the ops inside them, enough to make an
        op seem to end after its module."""
        torch = require_torch()
        prof = torch._C._profiler
        if hasattr(prof, "_get_approximate_time") and hasattr(
            prof, "_ApproximateClockToUnixTimeConverter"
        ):
            self._clock = prof._get_approximate_time
            self._converter = prof._ApproximateClockToUnixTimeConverter()
        else:  # an older torch: Unix time through our own offset
            self._clock = time.perf_counter_ns
            self._converter = None
            self._offset = time.time_ns() - time.perf_counter_ns()
        self.active = True

    def stop(self) -> None:
        self.active = False

    def to_raw(self, base_ns: int = 0, index_start: int = 0) -> dict[str, Any]:
        """Layer spans as raw ``X`` entries (category ``xpuprof_layer``)."""
        import pyarrow as pa

        from xpuprof.core.raw import RAW_SCHEMA

        rows = [(tid, r) for tid, buf in self._buffers for r in buf]
        if self._converter is not None:
            unix = self._converter.to_unix_ns
            rows = [(tid, (unix(r[0]), unix(r[1]), *r[2:])) for tid, r in rows]
            off = -base_ns
        else:
            off = self._offset - base_ns
        n = len(rows)
        cols: dict[str, Any] = {name: [None] * n for name in RAW_SCHEMA.names}
        cols["index"] = list(range(index_start, index_start + n))
        cols["ph"] = ["X"] * n
        cols["cat"] = ["xpuprof_layer"] * n
        cols["name"] = [r[2] for _, r in rows]
        cols["pid"] = [os.getpid()] * n
        cols["tid"] = [tid for tid, _ in rows]
        cols["ts"] = [r[0] + off for _, r in rows]
        cols["dur"] = [r[1] - r[0] for _, r in rows]
        cols["args"] = [
            msgspec.json.encode({"module": r[3], "pass": r[4]}).decode() for _, r in rows
        ]
        events = pa.Table.from_pydict(cols, schema=RAW_SCHEMA)
        empty = RAW_SCHEMA.empty_table()
        return {"events": events, "flows": empty, "counters": empty, "metadata": empty}

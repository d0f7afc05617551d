"""PyTorch side of a capture: model-layer spans from module hooks, and the torch profiler's
lifecycle (:class:`TorchProfiler`: started, cut and stopped on the thread that runs the model).

Why hooks: torch.profiler records aten ops and kernels but not which model layer ran them;
XSP's across-stack view needs that level. A forward pre-hook and forward hook per module (and
the full backward pre-hook/hook pair, where the module allows it) bracket each module's work
with a span named by its path in the model (``encoder.layers.3.attn``) and carrying its type.
Without torch's profiler (level ``layer``) the spans are plain tuples appended to a per-thread
list (a few microseconds per module call), read with torch's profiler clock and converted to
Unix time; while the profiler records (levels ``op``, ``full``) each module call is a torch
record function instead, which torch stamps with the same clock and conversion as the aten ops
inside it, and which the segment's trace file turns into a layer span (``layer_marks.py``: two
conversions of one clock, calibrated at different moments, disagreed by microseconds on a loaded
machine, enough to make ops straddle their module's span). Either way the spans land in one
store with the profiler's events, where the normaliser nests every aten op inside the layer
that ran it.

torch is imported only inside these functions: xpuprof works without it, and says which extra
to install when asked to profile PyTorch without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from xpuprof.capture.layer_marks import layer_mark, marks_to_spans
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


#: The start of torch's warning when a full backward hook fires on a module's outputs
#: (``torch/utils/hooks.py``, ``BackwardHook``): see :meth:`LayerSpans._quiet_hook_warning`.
HOOK_WARNING = (
    "Full backward hook is firing when gradients are computed with respect to module outputs"
)


class LayerSpans:
    """Records one span per module call (forward, and backward where hooks allow) of a model.

    ``install(model)`` registers hooks on every submodule; ``remove()`` takes them off again.
    The hooks cost nothing once removed, and while installed check one flag before recording,
    so a model can keep them between captures.

    :meth:`attach` (by :class:`TorchProfiler`, on the thread that runs the model, right after
    torch's profiler starts) makes every module call a torch record function until
    :meth:`detach` (right before it stops): spans on the profiler's own clock, written into its
    trace file (``layer_marks.py``) rather than kept here. Record functions still open at
    :meth:`detach` (a step marked inside a module call) are closed there, so none outlives the
    profiler session it was stamped in.
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
        self._pinned = False
        self._offset = 0
        self._filter: Any = None
        #: torch's record-function type while attached to a recording profiler, else None.
        self._rf: Any = None
        #: How the spans were timed (for the store's meta).
        self.clock = "torch profiler clock, converted by xpuprof"

    # -- recording ---------------------------------------------------------------------------

    def _buffer(self) -> tuple[list[Any], list[tuple[Any, ...]]]:
        loc = self._local
        try:
            return loc.open, loc.buf
        except AttributeError:
            loc.open = []
            loc.buf = []
            with self._lock:
                self._buffers.append((threading.get_native_id(), loc.buf))
            return loc.open, loc.buf

    def _enter(self, path: str, kind: str, phase: str, mark: str) -> None:
        """A module call begins: push a clock reading (a tuple), or ``[record function,
        its name]`` (None: a span over ``max_records``)."""
        if not self.active:
            return
        opened, _ = self._buffer()
        rf = self._rf
        if rf is None:
            opened.append((self._clock(), path, kind, phase))
        elif self._count < self.max_records:
            self._count += 1
            span = rf(mark)
            span.__enter__()
            opened.append([span, mark])
        else:
            opened.append(None)

    def _exit(self) -> None:
        end = self._clock() if self._rf is None else 0
        try:
            opened = self._local.open
            item = opened.pop()
        except (AttributeError, IndexError):
            return  # a capture started between this module's pre-hook and hook
        if item.__class__ is list:
            if item[0] is not None:
                item[0].__exit__(None, None, None)
        elif item is None:
            self.dropped += 1
        elif self.active:
            start, path, kind, phase = item
            if self._count >= self.max_records:
                self.dropped += 1
                return
            self._count += 1
            self._local.buf.append((start, end or self._clock(), path, kind, phase))

    # -- torch's profiler --------------------------------------------------------------------

    def attach(self) -> bool:
        """Stamp module calls as torch record functions from now on (torch's profiler has just
        started on this thread); False if this torch has no fast record function."""
        rf = getattr(require_torch()._C._profiler, "_RecordFunctionFast", None)
        if rf is None:
            return False
        self._rf = rf
        self.clock = "torch profiler events"
        return True

    def resume(self) -> None:
        """Module calls on this thread that :meth:`detach` ended at the previous session's
        stop go on with a new span each in this one (when attached)."""
        rf = self._rf
        if rf is None:
            return
        for item in getattr(self._local, "open", ()):
            if item.__class__ is list and item[0] is None:
                span = rf(item[1])
                span.__enter__()
                item[0] = span

    def detach(self) -> None:
        """Back to clock readings (torch's profiler is about to stop on this thread). Record
        functions still open on this thread end now (a step marked inside a module call):
        one left open across a restart of the profiler would be ended by the next session,
        on the stopped session's freed event. Never raises."""
        self._rf = None
        for item in getattr(self._local, "open", ()):
            if item.__class__ is list and item[0] is not None:
                span, item[0] = item[0], None
                with contextlib.suppress(Exception):
                    span.__exit__(None, None, None)

    # -- hooks -------------------------------------------------------------------------------

    def install(self, model: Any, backward: bool = True) -> LayerSpans:
        """Hook every submodule of ``model`` (named by its path; the root by its class)."""
        torch = require_torch()
        root_name = type(model).__name__
        for path, module in model.named_modules():
            name = path or root_name
            kind = type(module).__name__

            def pre(
                _m: Any, _inp: Any, name: str = name, kind: str = kind,
                mark: str = layer_mark(name, kind, "forward"),
            ) -> None:  # fmt: skip
                self._enter(name, kind, "forward", mark)

            def post(_m: Any, _inp: Any, _out: Any) -> None:
                self._exit()

            self._handles.append(module.register_forward_pre_hook(pre))
            # always_call: a forward that raises still ends its span (and its record function)
            self._handles.append(module.register_forward_hook(post, always_call=True))
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

                def bpre(
                    _m: Any, _g: Any, name: str = name, kind: str = kind,
                    mark: str = layer_mark(name, kind, "backward"),
                ) -> None:  # fmt: skip
                    self._enter(name, kind, "backward", mark)

                def bpost(_m: Any, _gi: Any, _go: Any) -> None:
                    self._exit()

                handles.append(module.register_full_backward_pre_hook(bpre))
                handles.append(module.register_full_backward_hook(bpost))
        except Exception as e:  # noqa: BLE001 - any refusal means: no backward spans
            for h in handles:
                h.remove()
            return f"off ({type(e).__name__}: {e})"
        self._handles.extend(handles)
        self._quiet_hook_warning()
        return "on"

    def _quiet_hook_warning(self) -> None:
        """torch warns, each time a full backward hook fires on a module none of whose inputs
        needs a gradient (the first layers: token ids, images), that it fires on the module's
        outputs instead: true, and exactly what a span needs, but said about hooks xpuprof
        put there. That one warning is ignored while the hooks are installed; every other
        warning of the user's program is left as it was."""
        warnings.filterwarnings("ignore", message=re.escape(HOOK_WARNING), category=UserWarning)
        self._filter = warnings.filters[0]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        f, self._filter = self._filter, None
        if f is not None and f in warnings.filters:
            warnings.filters.remove(f)

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
        """Record nothing more, and fix the clock conversion now, as torch fixes its own at
        the profiler's stop, rather than when the spans are converted: that may be much later
        (off the job's thread, after the profiler's trace has been read)."""
        self.active = False
        if self._converter is not None and not self._pinned:
            self._pinned = True
            self._converter.to_unix_ns(self._clock())

    def to_raw(self, base_ns: int = 0, index_start: int = 0) -> dict[str, Any]:
        """Layer spans timed by clock readings as raw ``X`` entries (category
        ``xpuprof_layer``); those torch's profiler stamped are in its trace files already."""
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


class TorchProfiler:
    """torch.profiler's Kineto session for one capture, cut into segments at step boundaries.

    Everything here runs on the thread that runs the model: torch's profiler state is local to
    the thread that enabled it, so no other thread can stop it. Stopping it
    (``_disable_profiler``) and exporting its trace hold the GIL for a time proportional to the
    events recorded since it started (measured on the demo model: 150 ms and 95 ms for one
    second of recording), so a capture recorded in one piece stalls the job that long at the
    step that ends it, and holds every event in memory until then. With ``budget_ns`` the
    session is restarted at a step boundary before stopping it would take longer than that
    (estimated from the previous cut); each cut writes its segment's trace file and frees its
    events, so the step that ends the capture pays for one short segment. ``budget_ns=None``
    records in one piece (``xpuprof.profile``, where the caller waits for the store anyway).

    Built on ``torch.autograd.profiler.profile`` rather than ``torch.profiler.profile``: the
    latter keeps itself alive in a reference cycle (its action map holds bound methods) and
    imports ``torch._inductor`` on start (1.3 s on the job's thread).

    With ``layers`` (the capture's :class:`LayerSpans`), module calls are stamped by each
    session itself (:meth:`LayerSpans.attach`) and each segment's file has its layer spans
    written in (``layer_marks.marks_to_spans``) before the segment counts as written.
    """

    #: Most steps in one segment, however cheap the steps are to stop.
    MAX_SEGMENT_STEPS = 256

    def __init__(
        self,
        workdir: Path,
        *,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        budget_ns: int | None = None,
        layers: LayerSpans | None = None,
        kernels: bool = True,
    ) -> None:
        self.workdir = Path(workdir)
        #: Record device activity (kernels, copies) when a GPU is in use; False: host ops only
        #: (the leveled op level, whose numbers must not carry CUPTI's cost).
        self.kernels = kernels
        self.layers = layers
        #: Layer spans written into the segments' files, and markers that could not be.
        self.layer_spans = 0
        self.layer_marks_left = 0
        self.record_shapes = record_shapes
        self.profile_memory = profile_memory
        self.with_stack = with_stack
        self.budget_ns = budget_ns
        #: The segments' trace files, in order.
        self.files: list[Path] = []
        #: Cost of each cut (stop + export of a segment), ns: the job's stall at that step.
        self.cut_ns: list[int] = []
        #: Why recording ended early (a restart failed), or "".
        self.error = ""
        self._prof: Any = None
        self._span: Any = None
        self._device: str | None = None
        self._steps = 0  # steps begun in the open segment
        self._marked = False  # the open segment stamps layer spans
        self._per_step_ns = 0  # the last segment's stop cost per step

    def start(self) -> str:
        """Start recording; returns what records (for the store's meta)."""
        torch = require_torch()
        self._device = "cuda" if self.kernels and torch.cuda.is_available() else None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._begin()
        return f"torch.profiler {torch.__version__} CPU" + ("+CUDA" if self._device else "")

    @property
    def recording(self) -> bool:
        return self._prof is not None

    def step(self, number: int | None) -> None:
        """A step boundary: close the open ``ProfilerStep#N`` span (named as torch.profiler
        names them, opened where the user marks a step), cut the segment if the next step
        would make it too costly to stop, and open step ``number``'s span (None: none)."""
        self._close_span()
        if self._prof is None:
            return
        if self._should_cut():
            try:
                self._end(save=True)
                self._begin()
            except Exception as e:  # the job's step must go on: the capture ends here
                self.error = f"restarting torch.profiler failed: {type(e).__name__}: {e}"
                self.abandon()
                return
        if number is not None:
            from torch.autograd.profiler import record_function

            self._span = record_function(f"ProfilerStep#{number}")
            self._span.__enter__()
            self._steps += 1
        if self._marked and self.layers is not None:
            self.layers.resume()  # module calls cut at a restart: within the new step's span

    def stop(self) -> list[Path]:
        """Stop recording and write the last segment; returns every segment's file."""
        self._close_span()
        self._end(save=True)
        return list(self.files)

    def abandon(self) -> None:
        """Stop recording and keep nothing more (the segments already written stay in
        ``files``); never raises."""
        self._span = None
        p, self._prof = self._prof, None
        if p is not None:
            if self.layers is not None:
                self.layers.detach()
            try:
                p.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - it may never have started; nothing to keep
                pass
            p.kineto_results = None

    # -- segments ----------------------------------------------------------------------------

    def _should_cut(self) -> bool:
        if self.budget_ns is None or self._steps == 0:
            return False
        if self._steps >= self.MAX_SEGMENT_STEPS or not self._per_step_ns:
            return True  # the first segment holds one step: it measures what a step costs
        return (self._steps + 1) * self._per_step_ns > self.budget_ns

    def _begin(self) -> None:
        from torch.autograd.profiler import profile

        p = profile(
            use_kineto=True,
            use_device=self._device,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        spent = [require_torch().empty(1)] if self.profile_memory else []
        with quiet_kineto():
            p.__enter__()
        spend_unknown_block_warning(spent)
        self._prof = p
        self._steps = 0
        self._marked = self.layers is not None and self.layers.attach()
        _add_distributed_info()

    def _end(self, save: bool) -> None:
        p, self._prof = self._prof, None
        if p is None:
            return
        t0 = time.perf_counter_ns()
        try:
            if self.layers is not None:
                self.layers.detach()
            p.__exit__(None, None, None)
            if save:
                path = self.workdir / f"segment{len(self.files):05d}.pt.trace.json"
                p.export_chrome_trace(str(path))
                if self._marked:
                    spans, left = marks_to_spans(path)
                    self.layer_spans += spans
                    self.layer_marks_left += left
                self.files.append(path)
        finally:
            p.kineto_results = None  # the segment's events: freed now, not at a later GC
        cost = time.perf_counter_ns() - t0
        self.cut_ns.append(cost)
        if self._steps:
            self._per_step_ns = cost // self._steps

    def _close_span(self) -> None:
        span, self._span = self._span, None
        if span is not None:
            span.__exit__(None, None, None)


#: Kineto's log level that keeps its lines (``USDT:… profiler_start``) off stderr: above its
#: highest (VERBOSE 0 … ERROR 3, STAGE 4).
KINETO_QUIET = "6"


@contextlib.contextmanager
def quiet_kineto() -> Iterator[None]:
    """Kineto (torch's profiler) writes a line to stderr at each start and stop of a capture
    unless ``KINETO_LOG_LEVEL`` says otherwise when it initialises (its first start in the
    process). Set it for that moment unless the user has set it, and put the environment back
    as it was: the level stays with Kineto, and the user's environment is left as it was."""
    mine = "KINETO_LOG_LEVEL" not in os.environ
    if mine:
        os.environ["KINETO_LOG_LEVEL"] = KINETO_QUIET
    try:
        yield
    finally:
        if mine:
            os.environ.pop("KINETO_LOG_LEVEL", None)


#: Whether torch's once-per-process allocator warning has been spent (see below).
_UNKNOWN_BLOCK = {"spent": False}


def spend_unknown_block_warning(blocks: list[Any]) -> None:
    """With memory profiling on, torch's CPU allocator writes one C++ line to stderr
    ("Memory block of unknown size was allocated before the profiling started …") the first
    time in the process a block allocated before profiling is freed: which is always, as
    every model's weights were. It is said about profiling xpuprof switched on, once per
    process, and is not something the user can act on. So the first time, xpuprof frees one
    block of its own (``blocks``, allocated before the profiler started) while file
    descriptor 2 points at /dev/null for that one deallocation (microseconds), which spends
    torch's once-only warning; every later line of the job reaches stderr as before."""
    if _UNKNOWN_BLOCK["spent"] or not blocks:
        blocks.clear()
        return
    _UNKNOWN_BLOCK["spent"] = True
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no stderr to protect: free it plainly
        blocks.clear()
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 2)
            blocks.clear()  # the last reference: torch frees the block here
        finally:
            os.dup2(saved, 2)
            os.close(null)
    finally:
        blocks.clear()
        os.close(saved)


def _add_distributed_info() -> None:
    """The job's rank and world in the segment's trace, as torch.profiler writes them (the
    importer takes the rank from there)."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return
    info = {
        "backend": dist.get_backend(),
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
    }
    torch.autograd._add_metadata_json("distributedInfo", json.dumps(info))

"""``xpuprof.profile``: capture a run of the user's program into a store.

This module composes the pipeline end to end, so it sits beside ``ui`` rather than in
``capture/``: the recorders in ``capture/`` (annotations, layer spans, telemetry, the JAX
profiler) know nothing of stores; here their output meets the framework's trace (``formats/``)
and becomes a store (``trace/``).

One object drives everything a capture can record, chosen by ``level`` (leveled measurement, as
in XSP: each level is captured in its own run so that the overhead of the deeper levels never
inflates the numbers of the shallower ones):

=========  ========================================================================
``step``   step spans and the user's own ``xpuprof.annotate`` spans
``layer``  + one span per model module call (forward/backward hooks; needs ``model=``)
``op``     + the framework profiler: torch.profiler (Kineto) ops, and kernels on GPUs;
           jax.profiler (XPlane) XLA ops for JAX programs
``full``   + input shapes, memory events and Python stacks (torch)
=========  ========================================================================

Telemetry (CPU, memory; GPU through NVML) is sampled in the background at every level.
The pieces are merged into one normalized trace before anything is written: the profiler's
own trace (Kineto JSON, the only way torch exports it) plus our spans as raw columns, so an aten
op nests inside the layer span that ran it.

Many ranks: in one rank of a distributed job (``torch.distributed`` initialised, or a launcher's
``RANK``/``WORLD_SIZE``: ``live/job.py``) every rank names the same ``out`` and adds its own part
to that one store (part number = rank), with its rank, world size, local rank, host, backend and
process groups in the part's capture settings (``xpuprof_capture.distributed``);
``trace/rankparts.py`` says why this is safe against concurrent ranks and crashes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from xpuprof.core.errors import XpuprofError
from xpuprof.live.assemble import Halted, finish

CAPTURE_LEVELS = ("step", "layer", "op", "full")

#: The environment through which ``xpuprof leveled`` reruns a script once per level: the
#: leveled level (below) and the store that level's run writes.
LEVEL_ENV = "XPUPROF_LEVEL"
OUT_ENV = "XPUPROF_OUT"
#: Each leveled level as (capture level, record device activity): the model level records the
#: steps only; ops are recorded without CUPTI, kernels with it (on a GPU).
LEVELED = {"model": ("step", False), "layer": ("layer", False), "op": ("op", False),
           "kernel": ("op", True)}  # fmt: skip

#: The capture that ``xpuprof.step`` drives, if any.
_ACTIVE: Profile | None = None
#: A pending on-demand capture request (``live/remote.py``), served at the next step.
_REMOTE: Any = None


def set_pending_request(request: Any) -> None:
    """Install the on-demand capture request that ``xpuprof.step()`` serves (its
    ``on_step()`` is called there, on the job's thread, until it is cleared), or clear it with
    None."""
    global _REMOTE
    _REMOTE = request


def clear_pending_request(request: Any) -> None:
    """Clear ``request`` if it is still the one installed (never a newer one)."""
    global _REMOTE
    if _REMOTE is request:
        _REMOTE = None


def step(n: int | None = None) -> Any:
    """Mark a training-step boundary: ``xpuprof.step(i)`` at the top of each iteration.

    With a capture running it advances that capture (its warm-up/steps schedule, torch's
    ``ProfilerStep#N`` spans); otherwise it is ``annotate.step`` (one flag check when nothing is
    recording). Usable as ``with xpuprof.step(i):`` too.
    """
    remote = _REMOTE  # read once: another thread may clear it meanwhile
    if remote is not None:
        remote.on_step()
    if _ACTIVE is not None:
        return _ACTIVE.step(n)
    from xpuprof.capture import annotate

    return annotate.step(n)


class Profile:
    """A capture session; use as a context manager or a decorator.

    ``steps``/``warmup``: with ``steps`` set, recording starts after ``warmup`` calls of
    :meth:`step` (or ``xpuprof.step``) and stops after ``steps`` more, so a long loop can be
    wrapped whole. Without it, everything inside the ``with`` block is recorded.

    ``workdir``: where the framework's trace files go while recording (a temporary folder,
    removed afterwards, by default; a given one is the caller's to remove; in a distributed
    job each rank uses its own ``rankR`` folder in it). ``segment_ms``:
    restart torch's profiler at step boundaries so that stopping it never stalls the job much
    longer than this (:class:`~xpuprof.capture.torch.TorchProfiler`; the remote capture uses
    it); None records in one piece. ``kernels``: record device activity (kernels, copies) on a
    GPU at levels ``op``/``full``; False records host ops only.

    In a distributed job every rank passes the same ``out``: each adds its part (part number =
    its rank) to that store; a store of another job, or one that already holds this rank, is
    refused when recording would start (``docs/capture.md``, "Many ranks (torchrun)").

    Set in the environment, ``XPUPROF_LEVEL`` (model, layer, op, kernel) and ``XPUPROF_OUT``
    replace the level and the store: ``xpuprof leveled`` reruns a script once per level that
    way (``docs/leveled.md``).
    """

    def __init__(
        self,
        out: str | Path | None = None,
        *,
        level: str = "op",
        model: Any = None,
        steps: int | None = None,
        warmup: int = 0,
        framework: str = "auto",
        record_shapes: bool | None = None,
        profile_memory: bool | None = None,
        with_stack: bool | None = None,
        telemetry: bool = True,
        verbosity: int = 1,
        max_records: int = 1_000_000,
        backward_layers: bool = False,
        workdir: str | Path | None = None,
        segment_ms: float | None = None,
        kernels: bool = True,
    ) -> None:
        self.leveled: str | None = None
        override = os.environ.get(LEVEL_ENV, "").strip()
        if override:  # ``xpuprof leveled`` reruns the script once per level (live/leveled.py)
            level, kernels, out = self._leveled(override, model, out)
        if level not in CAPTURE_LEVELS:
            raise XpuprofError(f"unknown capture level {level!r}; levels: {CAPTURE_LEVELS}")
        if level == "layer" and model is None:
            raise XpuprofError("level='layer' needs the model: xpuprof.profile(model=net, ...)")
        self.out = Path(out) if out is not None else None
        self.level = level
        self.model = model
        self.steps = steps
        self.warmup = warmup
        self.framework = framework
        full = level == "full"
        self.record_shapes = full if record_shapes is None else record_shapes
        self.profile_memory = full if profile_memory is None else profile_memory
        self.with_stack = full if with_stack is None else with_stack
        self.telemetry = telemetry
        self.verbosity = verbosity
        self.max_records = max_records
        # Full backward hooks wrap every module's inputs and outputs in extra autograd nodes:
        # 13 % on the demo model's step (forward spans alone: 1.2 %), so they are opt-in.
        # Without them backward ops still reach their layer through forward->backward links.
        self.backward_layers = backward_layers
        self.workdir = Path(workdir) if workdir is not None else None
        self.segment_ms = segment_ms
        self.kernels = kernels
        self.report: Any = None
        self._step = 0
        self._recording = False
        self._done = False
        self._layers: Any = None
        self._torch: Any = None
        self._jax_dir: Path | None = None
        self._telemetry: Any = None
        self._annotating = False
        self._work: Path | None = None
        self._own_work = False
        self._settings: dict[str, Any] = {}
        self._dist: dict[str, Any] | None = None

    def _leveled(self, override: str, model: Any, out: Any) -> tuple[str, bool, Any]:
        """The capture ``xpuprof leveled`` asks for through :data:`LEVEL_ENV` and
        :data:`OUT_ENV`: the level's capture settings and its store, whatever the script says
        (a layer level without ``model=`` falls back to steps only, and says so)."""
        if override not in LEVELED:
            raise XpuprofError(f"{LEVEL_ENV}={override!r}: not a leveled level; levels: "
                               f"{', '.join(LEVELED)}")  # fmt: skip
        self.leveled = override
        level, kernels = LEVELED[override]
        if level == "layer" and model is None:
            level, self.leveled = "step", "layer-without-model"
        target = os.environ.get(OUT_ENV, "").strip()
        return level, kernels, Path(target) if target else out

    # -- which framework ---------------------------------------------------------------------

    def _framework(self) -> str:
        if self.framework != "auto":
            return self.framework
        if self.model is not None and type(self.model).__module__.startswith("torch"):
            return "torch"
        if "torch" in sys.modules:
            return "torch"
        if "jax" in sys.modules:
            return "jax"
        return "none"

    # -- recording ---------------------------------------------------------------------------

    def _start(self) -> None:
        """Start every recorder; if one fails, the ones already started are released."""
        fw = self._framework()
        self._settings = {
            "level": self.level,
            "framework": fw,
            "steps": self.steps,
            "warmup": self.warmup,
            "record_shapes": self.record_shapes,
            "profile_memory": self.profile_memory,
            "with_stack": self.with_stack,
            "started_unix_ns": time.time_ns(),
            "kernels": self.kernels,
        }
        if self.leveled is not None:
            self._settings["leveled"] = self.leveled
        self._dist = self._distributed()
        if self._dist is not None:
            self._settings["distributed"] = self._dist
        if self.workdir is not None:
            self._work, self._own_work = self.workdir, False
            if self._dist is not None:  # ranks given one workdir must not share trace files
                self._work = self.workdir / f"rank{self._dist['rank']}"
            self._work.mkdir(parents=True, exist_ok=True)
        else:
            self._work, self._own_work = Path(tempfile.mkdtemp(prefix="xpuprof-capture-")), True
        try:
            self._start_recorders(fw)
        except BaseException:
            if self._torch is not None:
                self._torch.abandon()
            self._release()
            if self._own_work:
                shutil.rmtree(self._work, ignore_errors=True)
            raise
        self._recording = True

    def _distributed(self) -> dict[str, Any] | None:
        """This process's rank and job (``live/job.py``) if it is one rank of a distributed
        job; its part then joins the store ``out`` that every rank names. A store this rank
        cannot join (another job's, a single-process capture, its own rank already there) is
        refused here, before anything is recorded."""
        from xpuprof.live.job import detect

        me = detect()
        if me is not None and self.out is not None:
            from xpuprof.trace.rankparts import check_join

            check_join(self.out, me)
        return me

    def _start_recorders(self, fw: str) -> None:
        from xpuprof.capture import annotate

        if self.level in ("layer", "op", "full") and self.model is not None and fw == "torch":
            from xpuprof.capture.torch import LayerSpans

            self._layers = LayerSpans(self.max_records).install(
                self.model, backward=self.backward_layers
            )
            self._settings["backward_layer_spans"] = self._layers.backward
            self._layers.start()
        if self.telemetry:
            from xpuprof.capture.telemetry import Telemetry

            self._telemetry = Telemetry().start()
        annotate.start(verbosity=self.verbosity, max_records=self.max_records)
        self._annotating = True
        if self.level in ("op", "full"):
            if fw == "torch":
                self._start_torch()
            elif fw == "jax":
                self._start_jax()
            else:
                self._settings["profiler"] = "none: neither torch nor jax is in use"

    def _start_torch(self) -> None:
        from xpuprof.capture.torch import TorchProfiler

        assert self._work is not None
        budget = None if self.segment_ms is None else int(self.segment_ms * 1e6)
        self._torch = TorchProfiler(
            self._work / "torch",
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            budget_ns=budget,
            layers=self._layers,
            kernels=self.kernels,
        )
        self._settings["profiler"] = self._torch.start()
        if self._layers is not None:
            self._settings["layer_spans_clock"] = self._layers.clock

    def _start_jax(self) -> None:
        from xpuprof.capture.jax import start_jax

        assert self._work is not None
        self._jax_dir = self._work / "jax"
        self._jax_dir.mkdir()
        # jax's Python tracer would record every Python call of every thread (our telemetry
        # sampler included): only at level "full"
        self._settings["profiler"] = start_jax(self._jax_dir, python_tracer=self.level == "full")

    def _stop(self) -> None:
        """Stop every recorder and write the store."""
        halted = self._halt()
        out = self.out
        if out is None:
            out = Path(tempfile.mkdtemp(prefix="xpuprof-capture-")) / "store"
        try:
            self.report = finish(halted, out, join=self._dist is not None)
        finally:
            halted.cleanup()
        self.out = Path(self.report.store)
        self._done = True

    def halt(self) -> Halted:
        """Stop every recorder now without writing anything, and detach this capture from
        ``xpuprof.step``: a remote capture does this on the job's thread and leaves the rest
        (:meth:`Halted.prepare`, :func:`finish`) to other threads and processes."""
        self._detach()
        return self._halt()

    def abandon(self) -> None:
        """Stop every recorder, keep nothing, and detach from ``xpuprof.step``: what a remote
        capture does on the job's thread when its client is gone or the job stopped stepping
        for too long. Never raises."""
        self._detach()
        self._recording = False
        if self._torch is not None:
            with contextlib.suppress(Exception):
                self._torch.abandon()
        if self._jax_dir is not None:
            from xpuprof.capture.jax import stop_jax_files

            with contextlib.suppress(Exception):
                stop_jax_files(self._jax_dir)
        self._release()
        if self._telemetry is not None:
            self._telemetry.request_stop()
        if self._own_work and self._work is not None:
            shutil.rmtree(self._work, ignore_errors=True)

    def quiesce(self) -> None:
        """From any thread: stop the recorders that need not wait for the job's thread
        (layer spans record nothing more, the telemetry sampler ends); the framework profiler
        and the hooks themselves are released by :meth:`abandon` on the job's thread."""
        if self._layers is not None:
            self._layers.stop()
        if self._telemetry is not None:
            self._telemetry.request_stop()

    def _detach(self) -> None:
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None

    def _release(self) -> None:
        """Let go of the recorders that any thread may stop: annotations, layer hooks,
        telemetry (asked to stop; joined by whoever prepares the tables). Never raises."""
        from xpuprof.capture import annotate

        if self._annotating:
            self._annotating = False
            with contextlib.suppress(Exception):
                annotate.stop()
        if self._layers is not None:
            self._layers.stop()
            with contextlib.suppress(Exception):
                self._layers.remove()
        if self._telemetry is not None:
            self._telemetry.request_stop()

    def _halt(self) -> Halted:
        """Stop every recorder, quickly (this runs on the job's thread, at the step that ends
        the capture): converting what they hold into tables is :meth:`Halted.prepare`'s, and
        reading the framework's trace, normalising and writing Parquet :func:`finish`'s."""
        from xpuprof.capture import annotate

        assert self._work is not None
        self._recording = False
        framework_traces: list[Path] = []
        framework = "none"
        try:
            if self._torch is not None:
                framework_traces = self._torch.stop()
                framework = "torch"
            elif self._jax_dir is not None:
                from xpuprof.capture.jax import stop_jax_files

                framework_traces = stop_jax_files(self._jax_dir)[:1]
                framework = "jax"
        except BaseException:
            self.abandon()
            raise
        collected = None
        if self._annotating:
            self._annotating = False
            collected = annotate.stop()
        self._release()
        settings = {
            **self._settings,
            "stopped_unix_ns": time.time_ns(),
            "layer_spans_dropped": self._layers.dropped if self._layers is not None else 0,
            "telemetry": self._telemetry.status if self._telemetry is not None else {},
            "pid": os.getpid(),
            "host_name": os.uname().nodename if hasattr(os, "uname") else None,
            # the CPUs the process may run on (what its threads and workers share)
            "cpus": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            # torch's intra-op thread count (what at::parallel_for and the BLAS use; the
            # what-if change threads=N scales from it); None when torch is not imported
            "threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None,
            # the store's rank when the trace states none (live/job.py: torch.distributed,
            # else the launcher's RANK, MPI or Slurm variables)
            "rank": self._dist["rank"] if self._dist is not None else None,
        }
        if collected is not None:
            settings.update(
                annotations_dropped=collected.dropped,
                clock_offset_ns=collected.offset_ns,
                clock_offset_error_ns=collected.offset_err_ns,
            )
        if self._torch is not None:
            cuts = self._torch.cut_ns
            settings.update(torch_segments=len(cuts), torch_cut_max_ns=max(cuts, default=0))
            if self._torch.error:
                settings["torch_error"] = self._torch.error
        sources = [
            s for s in (collected, self._layers, self._telemetry) if s is not None
        ]  # fmt: skip
        return Halted(
            self._work, framework, framework_traces, None, settings,
            sources=sources, names=framework == "none", owned=self._own_work,
        )  # fmt: skip

    # -- the user's side ---------------------------------------------------------------------

    def step(self, n: int | None = None) -> Any:
        """Mark a step boundary (also what ``xpuprof.step`` does while this capture runs)."""
        from xpuprof.capture import annotate

        self._step += 1
        if self.steps is not None:
            if not self._recording and not self._done and self._step > self.warmup:
                self._start()
            elif self._recording and self._step > self.warmup + self.steps:
                self._stop()
                return annotate.step(None)
        if self._recording:
            number = self._step - 1 if n is None else n
            if self._torch is not None:
                self._torch.step(number)
                return annotate.step(None)
            return annotate.step(number)
        return annotate.step(None)

    def __enter__(self) -> Profile:
        global _ACTIVE
        if _ACTIVE is not None:
            raise XpuprofError("a capture is already running in this process")
        _ACTIVE = self
        try:
            if self.steps is None:
                self._start()
        except BaseException:
            _ACTIVE = None
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        global _ACTIVE
        _ACTIVE = None
        if self._recording:
            if exc is not None:  # what was recorded is still written; the part says why it ended
                self._settings["ended_by"] = f"{type(exc).__name__}: {exc}"[:500]
            self._stop()

    def __call__(self, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.__class__(
                self.out,
                level=self.level,
                model=self.model,
                steps=self.steps,
                warmup=self.warmup,
                framework=self.framework,
                record_shapes=self.record_shapes,
                profile_memory=self.profile_memory,
                with_stack=self.with_stack,
                telemetry=self.telemetry,
                verbosity=self.verbosity,
                max_records=self.max_records,
                backward_layers=self.backward_layers,
                workdir=self.workdir,
                segment_ms=self.segment_ms,
                kernels=self.kernels,
            ):
                return fn(*args, **kwargs)

        return wrapper

    def trace(self) -> Any:
        """The captured store, opened."""
        from xpuprof.trace.trace import Trace

        if not self._done:
            raise XpuprofError("the capture has not finished yet")
        return Trace(self.out)


def profile(out: str | Path | None = None, **options: Any) -> Profile:
    """Capture into the store ``out`` (see :class:`Profile` for the options)."""
    return Profile(out, **options)

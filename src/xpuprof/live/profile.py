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
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from xpuprof.core.errors import XpuprofError

CAPTURE_LEVELS = ("step", "layer", "op", "full")

#: The capture that ``xpuprof.step`` drives, if any.
_ACTIVE: Profile | None = None
#: A pending on-demand capture request (``live/remote.py``), served at the next step.
_REMOTE: Any = None


def set_pending_request(request: Any) -> None:
    """Install the on-demand capture request that the next ``xpuprof.step()`` serves (its
    ``on_step()`` is called there, on the job's thread), or clear it with None."""
    global _REMOTE
    _REMOTE = request


def step(n: int | None = None) -> Any:
    """Mark a training-step boundary: ``xpuprof.step(i)`` at the top of each iteration.

    With a capture running it advances that capture (its warm-up/steps schedule, torch's
    ``ProfilerStep#N`` spans); otherwise it is ``annotate.step`` (one flag check when nothing is
    recording). Usable as ``with xpuprof.step(i):`` too.
    """
    if _REMOTE is not None:
        _REMOTE.on_step()
    if _ACTIVE is not None:
        return _ACTIVE.step(n)
    from xpuprof.capture import annotate

    return annotate.step(n)


class Profile:
    """A capture session; use as a context manager or a decorator.

    ``steps``/``warmup``: with ``steps`` set, recording starts after ``warmup`` calls of
    :meth:`step` (or ``xpuprof.step``) and stops after ``steps`` more, so a long loop can be
    wrapped whole. Without it, everything inside the ``with`` block is recorded.
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
    ) -> None:
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
        self.report: Any = None
        self._step = 0
        self._recording = False
        self._done = False
        self._layers: Any = None
        self._torch_prof: Any = None
        self._jax_dir: Path | None = None
        self._telemetry: Any = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._settings: dict[str, Any] = {}
        self._step_span: Any = None

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
        from xpuprof.capture import annotate

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
        }
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
        if self.level in ("op", "full"):
            if fw == "torch":
                self._start_torch()
            elif fw == "jax":
                self._start_jax()
            else:
                self._settings["profiler"] = "none: neither torch nor jax is in use"
        self._recording = True

    def _start_torch(self) -> None:
        from xpuprof.capture.torch import require_torch

        torch = require_torch()
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._torch_prof = profile(
            activities=activities,
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
        )
        self._torch_prof.start()
        self._settings["profiler"] = f"torch.profiler {torch.__version__} " + "+".join(
            a.name for a in activities
        )

    def _start_jax(self) -> None:
        from xpuprof.capture.jax import start_jax

        self._tmp = tempfile.TemporaryDirectory(prefix="xpuprof-jax-")
        self._jax_dir = Path(self._tmp.name)
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
            self.report = finish(halted, out)
        finally:
            halted.cleanup()
        self.out = Path(self.report.store)
        self._done = True

    def halt(self) -> Halted:
        """Stop every recorder now without writing anything, and detach this capture from
        ``xpuprof.step``: a remote capture does this on the job's thread and leaves
        :func:`finish` to another process."""
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        return self._halt()

    def _halt(self) -> Halted:
        """Stop every recorder, quickly: what remains (reading the framework's trace,
        normalising, writing Parquet) is :func:`finish`'s, which a remote capture runs in
        another process so the job is not slowed after the capture window."""
        from xpuprof.capture import annotate

        self._recording = False
        work = Path(tempfile.mkdtemp(prefix="xpuprof-halt-"))
        framework_trace: Path | None = None
        framework = "none"
        try:
            if self._torch_prof is not None:
                self._torch_step(None)
                self._torch_prof.stop()
                framework_trace = work / "torch.trace.json"
                self._torch_prof.export_chrome_trace(str(framework_trace))
                framework = "torch"
            elif self._jax_dir is not None:
                from xpuprof.capture.jax import stop_jax_files

                files = stop_jax_files(self._jax_dir)
                framework_trace = files[0] if files else None
                framework = "jax"
        finally:
            collected = annotate.stop()
            if self._layers is not None:
                self._layers.stop()
                self._layers.remove()
            if self._telemetry is not None:
                self._telemetry.stop()
        extras = [collected.to_raw(base_ns=0, index_start=0, names=framework == "none")]
        for source in (self._layers, self._telemetry):
            if source is not None:
                extras.append(source.to_raw(base_ns=0, index_start=0))
        settings = {
            **self._settings,
            "stopped_unix_ns": time.time_ns(),
            "annotations_dropped": collected.dropped,
            "clock_offset_ns": collected.offset_ns,
            "clock_offset_error_ns": collected.offset_err_ns,
            "layer_spans_dropped": self._layers.dropped if self._layers is not None else 0,
            "telemetry": self._telemetry.status if self._telemetry is not None else {},
            "pid": os.getpid(),
            "host_name": os.uname().nodename if hasattr(os, "uname") else None,
        }
        return Halted(work, framework, framework_trace, extras, settings, self._tmp)

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
            if self._torch_prof is not None:
                self._torch_step(number)
                return annotate.step(None)
            return annotate.step(number)
        return annotate.step(None)

    def _torch_step(self, number: int | None) -> None:
        """Step spans inside torch's own trace, named as torch.profiler names them
        (``ProfilerStep#N``), opened where the user marks a step rather than at profiler start
        (which is where ``profile.step()`` would put an empty first one)."""
        if self._step_span is not None:
            self._step_span.__exit__(None, None, None)
            self._step_span = None
        if number is not None:
            from torch.autograd.profiler import record_function

            self._step_span = record_function(f"ProfilerStep#{number}")
            self._step_span.__enter__()

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

    def __exit__(self, *exc: object) -> None:
        global _ACTIVE
        _ACTIVE = None
        if self._recording:
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
            ):
                return fn(*args, **kwargs)

        return wrapper

    def trace(self) -> Any:
        """The captured store, opened."""
        from xpuprof.trace.trace import Trace

        if not self._done:
            raise XpuprofError("the capture has not finished yet")
        return Trace(self.out)


class Halted:
    """A stopped capture not yet written: the framework's own trace file and our spans and
    samples as raw tables (times in Unix ns, indexes from 0: :func:`finish` shifts them)."""

    def __init__(
        self,
        workdir: Path,
        framework: str,
        framework_trace: Path | None,
        extras: list[dict[str, Any]],
        settings: dict[str, Any],
        owned_tmp: Any = None,
    ) -> None:
        self.workdir = workdir
        self.framework = framework
        self.framework_trace = framework_trace
        self.extras = extras
        self.settings = settings
        self._owned_tmp = owned_tmp

    def save(self) -> Path:
        """Write the raw tables next to the framework trace, so another process can finish."""
        import json

        import pyarrow as pa

        for i, tables in enumerate(self.extras):
            for kind, t in tables.items():
                with pa.OSFile(str(self.workdir / f"extra{i}.{kind}.arrow"), "wb") as f:
                    with pa.ipc.new_file(f, t.schema) as w:
                        w.write_table(t)
        (self.workdir / "halted.json").write_text(
            json.dumps(
                {
                    "framework": self.framework,
                    "framework_trace": str(self.framework_trace) if self.framework_trace else None,
                    "extras": len(self.extras),
                    "settings": self.settings,
                },
                default=str,
            )
        )
        return self.workdir

    @classmethod
    def load(cls, workdir: Path) -> Halted:
        import json

        import pyarrow as pa

        from xpuprof.core.raw import KINDS

        doc = json.loads((workdir / "halted.json").read_text())
        extras = []
        for i in range(doc["extras"]):
            tables = {}
            for kind in KINDS:
                with pa.memory_map(str(workdir / f"extra{i}.{kind}.arrow")) as f:
                    tables[kind] = pa.ipc.open_file(f).read_all()
            extras.append(tables)
        ft = doc["framework_trace"]
        return cls(workdir, doc["framework"], Path(ft) if ft else None, extras, doc["settings"])

    def cleanup(self) -> None:
        import shutil

        shutil.rmtree(self.workdir, ignore_errors=True)
        if self._owned_tmp is not None:
            self._owned_tmp.cleanup()


def finish(halted: Halted, out: str | Path) -> Any:
    """Merge a stopped capture's pieces into one normalized trace and write it as a store."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from xpuprof.core.raw import RawTrace, concat_tables, count_entries, next_index
    from xpuprof.trace.ingest import store_raw

    base: RawTrace | None = None
    if halted.framework == "torch" and halted.framework_trace is not None:
        from xpuprof.formats.kineto import read_kineto

        base = read_kineto(halted.framework_trace)
        base.top.pop("traceName", None)  # a temporary file: meaningless afterwards
    elif halted.framework == "jax" and halted.framework_trace is not None:
        from xpuprof.formats.xplane import read_xplane

        base = read_xplane(halted.framework_trace)
    base_ns = int((base.top.get("baseTimeNanoseconds") or 0) if base is not None else 0)
    parts = [base.tables] if base is not None else []
    nxt = next_index(parts[0]) if parts else 0
    for tables in halted.extras:
        shifted = {}
        for kind, t in tables.items():
            if t.num_rows:
                t = t.set_column(
                    t.schema.get_field_index("index"), "index", pc.add(t["index"], nxt)
                )
                t = t.set_column(
                    t.schema.get_field_index("ts"), "ts", pc.subtract(t["ts"], pa.scalar(base_ns))
                )
            shifted[kind] = t
        parts.append(shifted)
        nxt = max(nxt, next_index(shifted))
    tables = concat_tables(parts)
    phase, cat = count_entries(tables)
    top = dict(base.top) if base is not None else {"baseTimeNanoseconds": base_ns}
    settings = dict(halted.settings)
    top["xpuprof_capture"] = settings
    top.setdefault("host_name", settings.get("host_name"))
    raw = RawTrace(
        path=f"capture:{settings.get('pid')}",
        tables=tables,
        read_phase=phase,
        read_category=cat,
        top=top,
        string_ids=base.string_ids if base is not None else {"pid": {}, "tid": {}},
        size=0,
        sha256="",
        compressed=False,
        format="xpuprof-capture",
    )
    return store_raw([raw], out)


def profile(out: str | Path | None = None, **options: Any) -> Profile:
    """Capture into the store ``out`` (see :class:`Profile` for the options)."""
    return Profile(out, **options)

"""One builder for the synthetic Kineto (Chrome-trace JSON) traces the tests write by hand.

Times are microseconds, as in Kineto's files; the expected numbers of a test are worked out by
hand from the events it builds, so the builder only spells events the way torch.profiler
writes them and never computes anything a test asserts::

    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=100)
    tb.launch("gemm", ts=10, dur=30, launch_ts=2, stream=7)   # runtime call + kernel + ac2g flow
    tb.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", ts=30, dur=40, stream=9)
    with tb.load(tmp_path) as trace:
        ...

Host events go on ``pid=HOST_PID, tid=HOST_TID`` unless given; device events on the device's
pid (``device``) and the stream's tid, with ``args.device``/``args.stream`` as Kineto writes
them. Correlation ids are allocated in order when not given.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HOST_PID = 100
HOST_TID = 1
#: An NCCL all-reduce kernel as PyTorch names it, and the ``record_param_comms`` args PyTorch
#: (>= 2.2) copies onto it, for the default group of a 4-rank job (1 Mi floats each way).
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALLREDUCE_ARGS_4 = {"Collective name": "allreduce", "In msg nelems": 1 << 20,
                    "Out msg nelems": 1 << 20, "Group size": 4, "dtype": "Float",
                    "Process Group Name": "0", "Process Group Ranks": "[0, 1, 2, 3]"}  # fmt: skip


class TraceBuilder:
    """Collects trace events and writes them as one Kineto JSON file (or imports them)."""

    def __init__(
        self,
        *,
        rank: int | None = 0,
        world_size: int | None = None,
        device_properties: list[dict[str, Any]] | None = None,
        **top: Any,
    ) -> None:
        self.events: list[dict[str, Any]] = []
        self.top: dict[str, Any] = dict(top)
        if rank is not None:
            info: dict[str, Any] = {"rank": rank}
            if world_size is not None:
                info["world_size"] = world_size
            self.top["distributedInfo"] = info
        if device_properties is not None:
            self.top["deviceProperties"] = device_properties
        self._corr = itertools.count(1)

    # -- events --------------------------------------------------------------------------------

    def add(self, event: dict[str, Any]) -> dict[str, Any]:
        """Append a raw event dict as given (for shapes the helpers below do not cover)."""
        self.events.append(event)
        return event

    def x(
        self,
        name: str,
        cat: str,
        ts: float,
        dur: float,
        *,
        pid: int | str = HOST_PID,
        tid: int | str = HOST_TID,
        **args: Any,
    ) -> dict[str, Any]:
        """A complete event (``ph: X``); keyword arguments become its ``args``."""
        e: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                             "ts": ts, "dur": dur}  # fmt: skip
        if args:
            e["args"] = args
        return self.add(e)

    def step(self, n: int, ts: float, dur: float, **kw: Any) -> dict[str, Any]:
        """A ``ProfilerStep#n`` span, as torch.profiler's schedule writes it."""
        return self.x(f"ProfilerStep#{n}", "user_annotation", ts, dur, **kw)

    def op(self, name: str, ts: float, dur: float, **kw: Any) -> dict[str, Any]:
        """A framework op (``cpu_op``)."""
        return self.x(name, "cpu_op", ts, dur, **kw)

    def annotation(self, name: str, ts: float, dur: float, **kw: Any) -> dict[str, Any]:
        """A user annotation (``record_function``)."""
        return self.x(name, "user_annotation", ts, dur, **kw)

    def runtime(
        self, name: str, ts: float, dur: float, *, correlation: int | None = None, **kw: Any
    ) -> dict[str, Any]:
        """A CUDA runtime call; ``correlation`` ties it to the device work it launches."""
        if correlation is not None:
            kw["correlation"] = correlation
        return self.x(name, "cuda_runtime", ts, dur, **kw)

    def kernel(
        self,
        name: str,
        ts: float,
        dur: float,
        *,
        stream: int = 7,
        device: int = 0,
        correlation: int | None = None,
        cat: str = "kernel",
        **args: Any,
    ) -> dict[str, Any]:
        """Device work on ``device``'s pid and ``stream``'s tid (``cat``: kernel,
        gpu_memcpy, gpu_memset, cuda_sync…)."""
        a: dict[str, Any] = {"device": device, "stream": stream}
        if correlation is not None:
            a["correlation"] = correlation
        a.update(args)
        return self.x(name, cat, ts, dur, pid=device, tid=stream, **a)

    def memcpy(self, name: str, ts: float, dur: float, *, bytes: int | None = None,
               **kw: Any) -> dict[str, Any]:  # fmt: skip
        """A copy on the device timeline (``gpu_memcpy``), with its size when given."""
        if bytes is not None:
            kw["bytes"] = bytes
        return self.kernel(name, ts, dur, cat="gpu_memcpy", **kw)

    def flow(self, cat: str, flow_id: int, ph: str, ts: float, *, pid: int | str = HOST_PID,
             tid: int | str = HOST_TID, bp: str | None = None,
             name: str | None = None) -> dict[str, Any]:  # fmt: skip
        """One flow entry (``s``, ``t`` or ``f``) of flow ``flow_id`` in category ``cat``."""
        e: dict[str, Any] = {"ph": ph, "id": flow_id, "pid": pid, "tid": tid, "ts": ts,
                             "cat": cat, "name": name or cat}  # fmt: skip
        if bp is not None:
            e["bp"] = bp
        return self.add(e)

    def launch(
        self,
        kernel: str,
        ts: float,
        dur: float,
        *,
        launch_ts: float,
        launch_dur: float = 5,
        stream: int = 7,
        device: int = 0,
        call: str = "cudaLaunchKernel",
        correlation: int | None = None,
        flow: bool = True,
        pid: int | str = HOST_PID,
        tid: int | str = HOST_TID,
        cat: str = "kernel",
        **args: Any,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """A runtime call at ``launch_ts`` and the device work it launches at ``ts``, sharing a
        correlation id, joined by an ``ac2g`` flow (``s`` on the call, ``f`` with ``bp: e`` on
        the kernel) unless ``flow=False``. Returns (call, kernel)."""
        corr = next(self._corr) if correlation is None else correlation
        rt = self.runtime(call, launch_ts, launch_dur, correlation=corr, pid=pid, tid=tid)
        k = self.kernel(kernel, ts, dur, stream=stream, device=device, correlation=corr,
                        cat=cat, **args)  # fmt: skip
        if flow:
            self.flow("ac2g", corr, "s", launch_ts, pid=pid, tid=tid)
            self.flow("ac2g", corr, "f", ts, pid=device, tid=stream, bp="e")
        return rt, k

    def instant(self, name: str, ts: float, *, cat: str = "cpu_instant_event",
                pid: int | str = HOST_PID, tid: int | str = HOST_TID,
                scope: str | None = None, **args: Any) -> dict[str, Any]:  # fmt: skip
        """An instant event (``ph: i``), e.g. a ``[memory]`` allocator record."""
        e: dict[str, Any] = {"ph": "i", "cat": cat, "name": name, "pid": pid, "tid": tid,
                             "ts": ts}  # fmt: skip
        if scope is not None:
            e["s"] = scope
        if args:
            e["args"] = args
        return self.add(e)

    def counter(self, name: str, ts: float, *, pid: int | str = HOST_PID,
                **series: float) -> dict[str, Any]:  # fmt: skip
        """A counter sample (``ph: C``), one value per series."""
        return self.add({"ph": "C", "name": name, "pid": pid, "ts": ts, "args": series})

    def metadata(self, name: str, *, pid: int | str, tid: int | str | None = None,
                 **args: Any) -> dict[str, Any]:  # fmt: skip
        """A metadata entry (``ph: M``), e.g. ``process_name`` or ``thread_name``."""
        e: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": args}
        if tid is not None:
            e["tid"] = tid
        return self.add(e)

    # -- output --------------------------------------------------------------------------------

    def doc(self) -> dict[str, Any]:
        """The trace as the JSON document torch.profiler writes."""
        return {"traceEvents": list(self.events), **self.top}

    def write(self, path: str | Path) -> Path:
        """Write the trace as JSON (gzipped when the name ends in ``.gz``)."""
        path = Path(path)
        text = json.dumps(self.doc())
        if path.name.endswith(".gz"):
            import gzip

            path.write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)
        return path

    def store(self, directory: str | Path, name: str = "trace") -> Path:
        """Write the trace into ``directory`` and import it into a store there; its path."""
        import xpuprof

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        src = self.write(d / f"{name}.json")
        xpuprof.import_traces([src], d / f"{name}.store")
        return d / f"{name}.store"

    @contextlib.contextmanager
    def load(self, directory: str | Path, name: str = "trace") -> Iterator[Any]:
        """Import the trace into a store under ``directory`` and open it (closed on exit)."""
        import xpuprof

        with xpuprof.load(self.store(directory, name)) as trace:
            yield trace

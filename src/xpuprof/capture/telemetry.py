"""Background sampling of machine telemetry during a capture, into the ``counters`` table.

Why sample at all when the trace has every event: utilisation, memory and clocks explain gaps the
events cannot — a step slower because the CPU was shared, a GPU throttled by power or heat, a
process swapping. Sampling runs on its own thread at a coarse interval (100 ms by default),
so it costs the profiled job a few microseconds of GIL per sample and nothing between samples.

Sources: psutil for the process and the machine (always), NVML for NVIDIA GPUs when the
``nvidia-ml-py`` package and a driver are present (``pip install 'xpuprof[gpu]'``); what was not
available is said in ``Telemetry.status`` and lands in the store's meta, never silently.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import msgspec


class Telemetry:
    """Samples CPU utilisation, RSS and (with NVML) GPU utilisation, memory, power,
    temperature and clocks every ``interval`` seconds between ``start()`` and ``stop()``."""

    def __init__(self, interval: float = 0.1, pid: int | None = None) -> None:
        self.interval = interval
        self.pid = pid or os.getpid()
        self.samples: list[tuple[int, str, dict[str, float]]] = []
        self.status: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._gpus: list[Any] = []

    # -- sources -----------------------------------------------------------------------------

    def _open_nvml(self) -> None:
        try:
            import pynvml  # provided by nvidia-ml-py
        except ImportError:
            self.status["gpu"] = "not sampled: nvidia-ml-py is not installed"
            return
        try:
            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
        except Exception as e:  # no driver, no GPU: NVML raises its own error types
            self.status["gpu"] = f"not sampled: NVML unavailable ({e})"
            return
        self._nvml = pynvml
        self._gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        self.status["gpu"] = f"sampled {n} GPU(s) through NVML"

    def _sample_gpus(self, now: int) -> None:
        nv = self._nvml
        for i, h in enumerate(self._gpus):
            values: dict[str, float] = {}
            for key, read in (
                ("utilization_percent", lambda h=h: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                ("memory_used_bytes", lambda h=h: nv.nvmlDeviceGetMemoryInfo(h).used),
                ("power_watts", lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
                (
                    "temperature_c",
                    lambda h=h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                ),
                ("sm_clock_mhz", lambda h=h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            ):
                try:
                    values[key] = float(read())
                except Exception:  # a counter this GPU does not support: skip just it
                    continue
            if values:
                self.samples.append((now, f"gpu{i}", values))

    # -- the loop ----------------------------------------------------------------------------

    def _sample(self, proc: Any, cpu_too: bool) -> bool:
        import psutil

        now = time.time_ns()
        try:
            with proc.oneshot():
                cpu = proc.cpu_percent(None)
                rss = proc.memory_info().rss
        except psutil.Error:
            return False
        if cpu_too:  # utilisation is a rate: it needs an interval behind it
            self.samples.append(
                (now, "cpu", {"process_percent": cpu, "system_percent": psutil.cpu_percent(None)})
            )
        self.samples.append((now, "memory", {"rss_bytes": float(rss)}))
        if self._gpus:
            self._sample_gpus(now)
        return True

    def _run(self) -> None:
        import psutil

        proc = psutil.Process(self.pid)
        psutil.cpu_percent(None)
        # a sample at the start and one at the end: even a capture shorter than the interval
        # has its memory and utilisation
        self._sample(proc, cpu_too=False)
        while not self._stop.wait(self.interval):
            if not self._sample(proc, cpu_too=True):
                return
        self._sample(proc, cpu_too=True)

    def start(self) -> Telemetry:
        self.status["cpu"] = f"sampled every {self.interval * 1000:.0f} ms through psutil"
        self._open_nvml()
        self._thread = threading.Thread(target=self._run, name="xpuprof-telemetry", daemon=True)
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Ask the sampler to end without waiting for it: the thread that runs the model does
        this, and leaves the join (:meth:`stop`) to a thread that can afford to wait."""
        self._stop.set()

    def stop(self, timeout: float = 5.0) -> None:
        """End sampling and wait (at most ``timeout`` s: a sampler stuck in a system call is
        a daemon thread and is left behind rather than blocking the caller)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    # -- output ------------------------------------------------------------------------------

    def to_raw(self, base_ns: int = 0, index_start: int = 0) -> dict[str, Any]:
        """The samples as raw ``C`` (counter) entries, one per sample and source."""
        import pyarrow as pa

        from xpuprof.core.raw import RAW_SCHEMA

        n = len(self.samples)
        cols: dict[str, Any] = {name: [None] * n for name in RAW_SCHEMA.names}
        cols["index"] = list(range(index_start, index_start + n))
        cols["ph"] = ["C"] * n
        cols["cat"] = ["xpuprof_telemetry"] * n
        cols["name"] = [s[1] for s in self.samples]
        cols["pid"] = [self.pid] * n
        cols["tid"] = [0] * n
        cols["ts"] = [s[0] - base_ns for s in self.samples]
        cols["args"] = [msgspec.json.encode(s[2]).decode() for s in self.samples]
        counters = pa.Table.from_pydict(cols, schema=RAW_SCHEMA)
        empty = RAW_SCHEMA.empty_table()
        return {"events": empty, "flows": empty, "counters": counters, "metadata": empty}

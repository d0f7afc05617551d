"""Telemetry sampling. The machine running the suite has no GPU, so the NVML path is driven by a
stand-in ``pynvml`` module with known readings (the real one needs a driver); the CPU and memory
path is checked against psutil itself."""

from __future__ import annotations

import sys
import time
import types

import msgspec

from xpuprof.capture.telemetry import Telemetry


def fake_nvml(n: int) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.NVML_TEMPERATURE_GPU = 0
    m.NVML_CLOCK_SM = 1
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: n
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=40 + h)
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h + 1) * 2**30)
    m.nvmlDeviceGetPowerUsage = lambda h: 250_000 + h  # milliwatts
    m.nvmlDeviceGetTemperature = lambda h, kind: 60 + h
    m.nvmlDeviceGetClockInfo = lambda h, kind: 1_980

    def unsupported(h):
        raise RuntimeError("not supported")

    m.nvmlDeviceGetEncoderUtilization = unsupported
    return m


def samples_of(t: Telemetry) -> dict[str, list[dict[str, float]]]:
    c = t.to_raw()["counters"].to_pydict()
    out: dict[str, list[dict[str, float]]] = {}
    for name, args in zip(c["name"], c["args"], strict=True):
        out.setdefault(name, []).append(msgspec.json.decode(args))
    return out


def test_gpus_are_sampled_through_nvml(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(2))
    t = Telemetry(interval=0.02).start()
    time.sleep(0.15)
    t.stop()
    got = samples_of(t)
    assert t.status["gpu"] == "sampled 2 GPU(s) through NVML"
    assert got["gpu1"][0] == {
        "utilization_percent": 41.0,
        "memory_used_bytes": 2.0 * 2**30,
        "power_watts": 250.001,
        "temperature_c": 61.0,
        "sm_clock_mhz": 1980.0,
    }
    assert len(got["gpu0"]) >= 3


def test_without_nvml_says_why_and_samples_cpu_and_memory(monkeypatch) -> None:
    import psutil

    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if not installed
    t = Telemetry(interval=0.02).start()
    time.sleep(0.1)
    t.stop()
    got = samples_of(t)
    assert "not installed" in t.status["gpu"]
    assert not any(k.startswith("gpu") for k in got)
    rss = psutil.Process().memory_info().rss
    assert all(0.5 * rss < s["rss_bytes"] < 2 * rss for s in got["memory"])
    assert all(0 <= s["system_percent"] <= 100 for s in got["cpu"])


def test_request_stop_returns_at_once_and_stop_joins_the_sampler() -> None:
    """The job's thread only asks the sampler to end (a capture's closing step must stay
    short); whoever converts the samples joins it, and no sampler thread outlives a capture."""
    import threading

    def samplers() -> int:
        return sum(t.name == "xpuprof-telemetry" for t in threading.enumerate())

    before = samplers()
    t = Telemetry(interval=0.05).start()
    time.sleep(0.12)
    assert samplers() == before + 1
    t0 = time.perf_counter()
    t.request_stop()
    assert time.perf_counter() - t0 < 0.01
    t.stop()
    assert samplers() == before
    got = samples_of(t)
    assert len(got["memory"]) >= 2  # one at the start, one at the end at least

"""The local CPU as a roofline device, measured by a micro-benchmark and cached.

CPUs have no datasheet peak that a profile can trust (turbo, AVX frequency offsets, SMT, the
BLAS in use), so the roof of a CPU trace is *measured*: what this machine's numpy reaches, which
is what the ops in a CPU trace (oneDNN/BLAS GEMMs, vectorised elementwise loops) can reach too.

* **FLOP/s per dtype**: the best of a few timed ``numpy.matmul`` calls on square matrices, each
  counted as 2·n³ FLOPs. fp64 and fp32 go through the BLAS numpy links (all cores); fp16 has no
  BLAS path in numpy and is measured as what it is, a slow loop, on a small matrix (bf16: numpy
  has no such type; :meth:`DeviceSpec.peak` falls back to fp32 for it).
* **Memory bandwidth**: the best of a few ``numpy.copyto`` calls between two 256 MiB arrays (well
  beyond any last-level cache), counted as 2 × size bytes (one read, one write stream).

The whole run takes about one to two seconds, so it runs only when asked for (the roofline's
``calibrate=True`` or ``device="local-cpu"``). The result is cached as JSON in the user cache
directory (``$XDG_CACHE_HOME/xpuprof``, else ``~/.cache/xpuprof``; the platform's cache folder
on macOS and Windows), keyed by CPU model, logical core count and numpy version, so later
analyses read it in microseconds; ``refresh=True`` measures again. Nothing is written anywhere
else.

The calibration describes *this* machine: a CPU trace recorded elsewhere is measured against the
machine that analyses it, and the roofline notes say so.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from xpuprof.hardware.specs import DeviceSpec

#: Bumped when the benchmark changes, so that older cached numbers are not reused.
VERSION = 1


def cache_dir() -> Path:
    """Where xpuprof keeps per-user cached data (the only place it writes on its own)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "xpuprof"
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "xpuprof" / "Cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "xpuprof"


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _identity() -> dict[str, Any]:
    import numpy as np

    return {
        "cpu": cpu_name(),
        "logical_cores": os.cpu_count(),
        "machine": platform.machine(),
        "numpy": np.__version__,
        "version": VERSION,
    }


def _cache_file(ident: dict[str, Any]) -> Path:
    h = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"cpu-calibration-{h}.json"


def _best(fn: Any, repeats: int, budget_s: float) -> float:
    """Shortest wall time of ``fn()`` over up to ``repeats`` calls within ``budget_s``."""
    fn()  # warm-up: page faults, BLAS thread pool start
    best = float("inf")
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return best


def measure(*, quick: bool = False) -> dict[str, Any]:
    """Run the micro-benchmark and return its numbers (FLOP/s per dtype, bytes/s)."""
    import numpy as np

    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"flops": {}, "method": {}}
    sizes = {"fp64": 512 if quick else 1536, "fp32": 512 if quick else 2048,
             "fp16": 64 if quick else 128}  # fmt: skip
    for key, dt in (("fp64", np.float64), ("fp32", np.float32), ("fp16", np.float16)):
        n = sizes[key]
        a = rng.standard_normal((n, n)).astype(dt)
        b = rng.standard_normal((n, n)).astype(dt)
        c = np.empty((n, n), dt)
        t = _best(lambda a=a, b=b, c=c: np.matmul(a, b, out=c), 3, 0.6)
        out["flops"][key] = 2.0 * n**3 / t
        out["method"][key] = f"numpy.matmul {n}x{n}x{n}, best of up to 3"
    nbytes = (32 if quick else 256) << 20
    src = np.ones(nbytes // 8, np.float64)
    dst = np.empty_like(src)
    t = _best(lambda: np.copyto(dst, src), 4, 0.6)
    out["memory_bandwidth"] = 2.0 * nbytes / t
    out["method"]["memory"] = f"numpy.copyto {nbytes >> 20} MiB, 2 x size bytes, best of up to 4"
    out["seconds"] = round(time.perf_counter() - t_start, 3)
    return out


def _spec(ident: dict[str, Any], m: dict[str, Any], path: Path | None) -> DeviceSpec:
    try:
        import psutil

        mem = float(psutil.virtual_memory().total)
    except Exception:  # pragma: no cover - psutil is a dependency; be safe anyway
        mem = None
    return DeviceSpec(
        key="local-cpu",
        name=f"{ident['cpu']} ({ident['logical_cores']} logical cores, calibrated)",
        vendor=platform.machine(),
        kind="cpu",
        flops=dict(m["flops"]),
        memory_bandwidth=float(m["memory_bandwidth"]),
        memory_bytes=mem,
        source="measured on this machine ("
        + ", ".join(f"{k}: {v}" for k, v in m["method"].items())
        + ")",
        notes="Measured, not a datasheet peak: what numpy reaches here. fp16 is numpy's non-BLAS "
        "loop; bf16 falls back to fp32.",
        extra={"calibration": m, "identity": ident, "cache": str(path) if path else None},
    )


def local_cpu(*, refresh: bool = False, cache: bool = True, quick: bool = False) -> DeviceSpec:
    """The local CPU's spec: from the cache when present, else measured (and cached)."""
    ident = _identity()
    path = _cache_file(ident) if cache else None
    if path is not None and not refresh and path.is_file():
        try:
            doc = json.loads(path.read_text())
            if doc.get("identity") == ident:
                return _spec(ident, doc["measurement"], path)
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file is measured again and rewritten
    m = measure(quick=quick)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"identity": ident, "measurement": m}, indent=1))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home: the numbers are still returned
    return _spec(ident, m, path)

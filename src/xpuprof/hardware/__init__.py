"""Hardware models: peak FLOP/s per precision, memory and interconnect bandwidth of known
accelerators (``specs``), and the local CPU measured by a micro-benchmark (``calibrate``).

``match(name, props)`` maps the device names that traces carry to a :class:`DeviceSpec`;
``local_cpu()`` returns the calibrated CPU (cached per user).
"""

from __future__ import annotations

from xpuprof.hardware.calibrate import local_cpu
from xpuprof.hardware.specs import DTYPES, SPECS, DeviceSpec, get, match, table

__all__ = ["DTYPES", "SPECS", "DeviceSpec", "get", "local_cpu", "match", "table"]

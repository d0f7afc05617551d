"""Categories of XPlane events: from the plane (device, host, CUPTI, …), the line (XProf's
``XLA Ops``, ``Steps``, … on devices) and the event's own metadata and stats. :func:`category`
is the definition, one event at a time; the decoder computes the same, vectorized."""

from __future__ import annotations

import re
from typing import Any

#: XProf's named lines of device planes (raw and derived) → category.
_DEVICE_LINES = {
    "Steps": "xla_step",
    "XLA Modules": "xla_module",
    "XLA Ops": "xla_op",
    "Async XLA Ops": "xla_op_async",
    "XLA TraceMe": "xla_traceme",
    "Framework Ops": "framework_op",
    "TensorFlow Ops": "framework_op",
    "Framework Name Scope": "framework_name_scope",
    "TensorFlow Name Scope": "framework_name_scope",
    "Source code": "source_code",
}

#: Plane kind (``plane_kind``) → the category of its events, for planes that are not devices.
HOST_RULE = {
    "host": "host_trace",
    "python": "python_function",
    "cupti": "cuda_driver",
    "roctracer": "hip_runtime",
}

METADATA_PLANE = "/host:metadata"
TASK_ENV_PLANE = "Task Environment"
_COLLECTIVE = re.compile(
    r"^(?:%?)(all-reduce|all-gather|all-to-all|ragged-all-to-all|reduce-scatter|"
    r"collective-permute|collective-broadcast|send|recv)\b",
    re.IGNORECASE,
)
_COPY = re.compile(r"^(?:%?)copy", re.IGNORECASE)
GPU_MEMORY = ("memalloc_details", "memfree_details", "memory_residency_details")


def plane_kind(name: str) -> str:
    """``device``, ``host``, ``cupti``, ``roctracer``, ``python``, ``metadata``, ``task`` or
    ``other``."""
    if name.startswith("/device:"):
        return "device"
    if name == METADATA_PLANE:
        return "metadata"
    if name == TASK_ENV_PLANE:
        return "task"
    if name == "/host:CUPTI":
        return "cupti"
    if name == "/host:ROCTRACER":
        return "roctracer"
    if name.startswith("/host:python"):
        return "python"
    if name.startswith("/host:"):
        return "host"
    return "other"


def category(
    plane_name: str,
    line_name: str,
    event_name: str,
    stats: dict[str, Any] | None = None,
) -> str:
    """The category of an event from its plane's and line's names, its metadata name and its
    (metadata and own) stats. The reader computes the same thing, vectorized; this is the
    definition, one event at a time."""
    stats = stats or {}
    kind = plane_kind(plane_name)
    if kind == "device":
        rule = line_rule(plane_name, line_name)
        return md_category(rule, event_name, stats.get("hlo_category"), stats)
    if kind in HOST_RULE or kind == "other":
        base = HOST_RULE.get(kind, "xplane_trace")
        if kind == "host" and event_name.startswith("$"):
            base = "python_function"
        return event_override(base, event_name, stats) or base
    return "xplane_trace"


def line_rule(plane_name: str, line_name: str) -> str:
    """How the events of a device line get their category (``md_category``'s ``rule``)."""
    if line_name in _DEVICE_LINES:
        return _DEVICE_LINES[line_name]
    if plane_name.startswith("/device:GPU"):
        return "cupti_overhead" if line_name == "CUPTI overhead" else "gpu_stream"
    return "device_trace"


def md_category(rule: str, name: str, hlo_category: Any, stats: dict[str, Any]) -> str:
    """Category of a device event under ``rule``, from its metadata (and event stats)."""
    hc = hlo_category if isinstance(hlo_category, str) else ""
    if rule == "xla_op":
        return "xla_collective" if _COLLECTIVE.match(hc) or _COLLECTIVE.match(name) else "xla_op"
    if rule == "xla_op_async":
        if _COLLECTIVE.match(hc) or _COLLECTIVE.match(name):
            return "xla_collective_async"
        if _COPY.match(hc) or _COPY.match(name) or name == "async-copy":
            return "xla_copy_async"
        return "xla_op_async"
    if rule == "gpu_stream":
        if "memcpy_details" in stats or name.startswith("Memcpy"):
            return "gpu_memcpy"
        if "memset_details" in stats or name.startswith("Memset"):
            return "gpu_memset"
        if name.startswith("Memory") or any(k in stats for k in GPU_MEMORY):
            return "gpu_memory"
        return "kernel"
    return rule


def event_override(base: str, name: str, stats: dict[str, Any]) -> str | None:
    """Host events whose own stats change their category: step markers and XLA CPU ops."""
    if "step_num" in stats and base == "host_trace":
        return "host_step"
    op = stats.get("hlo_op")
    if op is not None and base == "host_trace" and op == name:
        # The XLA CPU runtime names the TraceMe of each op after the op itself; a GPU launch
        # TraceMe that carries hlo_op is named after the thunk instead, and stays host_trace.
        return "xla_op_cpu"
    return None

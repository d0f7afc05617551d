"""Names shared by every stage (levels, tables), kept free of imports so that reading a
manifest or printing ``info`` never pays for pyarrow."""

from __future__ import annotations

#: Across-stack levels, outermost first. Unknown categories become ``other``; nothing is dropped.
LEVELS: tuple[str, ...] = (
    "step",
    "layer",
    "op",
    "runtime",
    "kernel",
    "memcpy",
    "memset",
    "collective",
    "annotation",
    "python",
    "other",
)

#: Tables of a store, in the order ``info`` lists them.
TABLES: tuple[str, ...] = ("events", "flows", "links", "counters", "metadata")

#: Bits of an event id that hold the source index; the part number sits above them.
ID_SHIFT = 40

#: Flow (and link) kinds that join a host call to the device work it launched: their id is the
#: correlation id shared by the runtime call and its kernel, copy or set.
LAUNCH_FLOW_KINDS: frozenset[str] = frozenset({"ac2g", "async", "async_gpu", "async_cpu_to_gpu"})

#: Categories of xpuprof's own recorders (``capture/``): annotations, step spans, model-layer
#: spans and telemetry samples. Every source may hold them (a live capture adds them to the
#: framework's trace), so the normaliser maps them whatever the format.
CATEGORY_ANNOTATION = "xpuprof_annotation"
CATEGORY_STEP = "xpuprof_step"
CATEGORY_LAYER = "xpuprof_layer"
CATEGORY_TELEMETRY = "xpuprof_telemetry"
CAPTURE_CATEGORY_LEVELS: dict[str, str] = {
    CATEGORY_ANNOTATION: "annotation",
    CATEGORY_STEP: "step",
    CATEGORY_LAYER: "layer",
    CATEGORY_TELEMETRY: "other",
}

#: Levels of work that runs on a device (the rest is host activity).
DEVICE_LEVELS: tuple[str, ...] = ("kernel", "collective", "memcpy", "memset")

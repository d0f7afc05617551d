"""The reader of XPlane (``.xplane.pb``), the trace format of XProf, JAX, TensorFlow and
PyTorch/XLA: what it declares to the registry (suffixes, sniffing, the XProf log-directory
layout, the category vocabulary). The decoder is ``decode.py`` (with ``stats.py``, ``wire.py``,
``tables.py``), imported on first read; only ``protobuf`` is needed, never TensorFlow. How an
XSpace becomes raw tables (times, pids, names, categories, args, damage) is in
``docs/formats.md``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from xpuprof.core.errors import XpuprofError
from xpuprof.formats import Reader
from xpuprof.formats.xplane.categories import category, plane_kind
from xpuprof.formats.xplane.wire import WireError, fields, varint

if TYPE_CHECKING:
    from xpuprof.core.raw import RawTrace

#: Category → across-stack level (``xpuprof.core.names.LEVELS``). Why each:
XPLANE_CATEGORY_LEVEL: dict[str, str] = {
    # Device ``Steps`` line (TPU) and host step markers (``jax.profiler.StepTraceAnnotation``,
    # TF's step TraceMes: events with a ``step_num`` stat): what XProf's step view is built on.
    "xla_step": "step",
    "host_step": "step",
    # XProf's ``Framework Name Scope`` line: the name scopes of the model (Flax/Keras module
    # paths such as ``transformer/layer_3/attention``) over device time, i.e. model layers.
    "framework_name_scope": "layer",
    # ``Framework Ops``: the framework op (``jit(f)/dot_general``) that each device op came
    # from, the framework-op level of XSP.
    "framework_op": "op",
    # ``XLA Modules``: one execution of one compiled program (one jit call) on the device. It
    # is the device-side span of a framework-level call, above the ops it runs and below any
    # step or model layer, so it sits at ``op`` (``layer`` is kept for model structure).
    "xla_module": "op",
    # ``XLA Ops``: the HLO ops the device executed, XLA's kernels; ops whose HLO category is a
    # collective (all-reduce, all-gather, …) are collectives, as XProf's overview counts them.
    "xla_op": "kernel",
    "xla_collective": "collective",
    # XLA ops of the CPU backend (JAX on CPU): host-thread events named by their HLO op. The
    # CPU is JAX's device here, and these are the program's kernels.
    "xla_op_cpu": "kernel",
    # ``Async XLA Ops``: the in-flight span of an async pair (copy-start → copy-done,
    # all-reduce-start → -done), on its own line and overlapping the ops that run meanwhile:
    # copies are data movement, collectives are communication, anything else is ``other`` so
    # that it never inflates kernel time (the start/done ops themselves are on ``XLA Ops``).
    "xla_copy_async": "memcpy",
    "xla_collective_async": "collective",
    "xla_op_async": "other",
    # Runtime TraceMes on the device timeline (``dependency-wait``, ``barrier-cores``),
    # XProf's ``Source code`` attribution line, and device lines we do not know.
    "xla_traceme": "other",
    "source_code": "other",
    "device_trace": "other",
    # GPU streams (CUPTI activity), named as in Kineto so both formats read alike.
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    # GPU memory allocation/free/residency records and CUPTI's own overhead on the stream
    # lines: bookkeeping, not device work.
    "gpu_memory": "other",
    "cupti_overhead": "other",
    # CUPTI driver API calls on the host (``/host:CUPTI``; ROCm: ``/host:ROCTRACER``): the
    # launch level, correlated with the device work they launched.
    "cuda_driver": "runtime",
    "hip_runtime": "runtime",
    # TraceMe annotations on host threads (PjRt, runtime and user ``TraceAnnotation``s alike:
    # the format does not tell them apart): XProf's TraceMe is an annotation API.
    "host_trace": "annotation",
    # The Python tracer (``$file.py:line function`` events), as Kineto's python_function.
    "python_function": "python",
    # Events of planes that are neither host nor device (custom planes).
    "xplane_trace": "other",
}

#: Categories recorded on a device timeline (pid = the device's plane, tid = its line or stream;
#: for XLA CPU ops, the host thread that ran them, device = JAX's CPU device).
XPLANE_DEVICE_CATEGORIES = frozenset(
    {
        "xla_step",
        "framework_name_scope",
        "framework_op",
        "xla_module",
        "xla_op",
        "xla_collective",
        "xla_op_cpu",
        "xla_copy_async",
        "xla_collective_async",
        "xla_op_async",
        "xla_traceme",
        "source_code",
        "device_trace",
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "gpu_memory",
        "cupti_overhead",
    }
)


def read_xplane(
    path: str | Path,
    *,
    lenient: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RawTrace:
    """Read one XPlane file (``.xplane.pb``, plain or gzip) into raw columns.

    ``progress`` is called with the number of (decompressed) bytes read so far, plane by plane.
    Raises :class:`~xpuprof.core.errors.TraceFormatError` on damage unless ``lenient``; then the
    planes that decode are kept and each damaged piece is listed in ``dropped``.
    """
    from xpuprof.formats.xplane.decode import read

    return read(path, lenient=lenient, progress=progress)


# ----------------------------------------------------------------------------------------------
# Finding files
# ----------------------------------------------------------------------------------------------

XPLANE_SUFFIXES = (".xplane.pb", ".xplane.pb.gz")


def is_xplane_path(path: str | Path) -> bool:
    """True for names XProf and JAX give XPlane files (``<host>.xplane.pb``, also gzipped)."""
    return str(path).endswith(XPLANE_SUFFIXES)


def find_xplane_files(path: str | Path, run: str | None = None) -> list[Path]:
    """XPlane files under ``path``.

    For an XProf/TensorBoard log directory (``<logdir>/plugins/profile/<run>/<host>.xplane.pb``,
    ``path`` being the logdir or its ``plugins/profile``), the files of each run, newest run
    first (run folders are named by their start time, ``2024_05_01_12_30_00``; the folder's
    modification time breaks ties), hosts in name order; ``run="latest"`` keeps only the newest
    run, any other string only the run of that name. Otherwise every ``*.xplane.pb(.gz)`` under
    ``path``, in path order. A file path is returned as it is.
    """
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        return []
    profile = None
    for cand in (p / "plugins" / "profile", p):
        if cand.name == "profile" and cand.parent.name == "plugins" and cand.is_dir():
            profile = cand
            break
    if profile is not None:
        runs = [d for d in profile.iterdir() if d.is_dir() and _files_in(d)]
        runs.sort(key=lambda d: (d.name, d.stat().st_mtime_ns), reverse=True)
        if run == "latest":
            runs = runs[:1]
        elif run is not None:
            runs = [d for d in runs if d.name == run]
        return [f for d in runs for f in _files_in(d)]
    return sorted(
        f
        for f in p.rglob("*")
        if f.is_file()
        and is_xplane_path(f.name)
        and not any(part.startswith(".") for part in f.relative_to(p).parts)
    )


def _files_in(d: Path) -> list[Path]:
    return sorted(f for f in d.iterdir() if f.is_file() and is_xplane_path(f.name))


def is_log_dir(path: Path) -> bool:
    """An XProf/TensorBoard log directory: it holds ``plugins/profile``, or is that folder."""
    return (path / "plugins" / "profile").is_dir() or (
        path.name == "profile" and path.parent.name == "plugins"
    )


def expand(directory: Path) -> list[Path] | None:
    """The files to import for a directory the user names: for an XProf log directory, the
    newest run's XPlane files (one per host); None for any other directory."""
    p = Path(directory)
    if not is_log_dir(p):
        return None
    found = find_xplane_files(p, run="latest")
    if not found:
        raise XpuprofError(f"{p}: an XProf log directory with no .xplane.pb files")
    return found


#: Bytes of (decompressed) data that sniffing looks at.
_SNIFF_BYTES = 1 << 16
#: Fields of an XSpace (all length-delimited): planes, errors, warnings, hostnames.
_XSPACE_FIELDS = (1, 2, 3, 4)


def sniff(path: str | Path) -> bool:
    """True when the file (gunzipped if it is gzip) starts like an XSpace: a plane, error,
    warning or hostname field whose length fits the file, and for a plane, fields of an
    XPlane (id, name, lines, metadata, stats) as far as the bytes looked at reach."""
    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    limit: int | None = p.stat().st_size
    if head[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, _SNIFF_BYTES)
        except zlib.error:
            return False
        limit = None  # the decompressed size is not known
    try:
        key, pos = varint(head, 0, len(head))
        n, pos = varint(head, pos, len(head))
    except WireError:
        return False
    field, end = key >> 3, min(pos + n, len(head))
    if field not in _XSPACE_FIELDS or key & 7 != 2 or (limit is not None and pos + n > limit):
        return False
    if field != 1:  # a string
        try:
            head[pos:end].decode("utf-8")
        except UnicodeDecodeError:
            return end < pos + n  # perhaps a character cut at the end of what was read
        return True
    try:
        for inner, wt, *_ in fields(head, pos, end):
            if not (inner == 1 and wt == 0 or 2 <= inner <= 6 and wt == 2):
                return False
    except WireError as e:
        return e.truncated and end < pos + n  # the plane goes on beyond what was read
    return True


READER = Reader(
    name="xplane",
    description="XPlane of XProf, JAX, TensorFlow, PyTorch/XLA: .xplane.pb, .xplane.pb.gz, "
    "or an XProf log directory (its newest run)",
    suffixes=XPLANE_SUFFIXES,
    read=read_xplane,
    sniff=sniff,
    category_levels=XPLANE_CATEGORY_LEVEL,
    device_categories=XPLANE_DEVICE_CATEGORIES,
    expand=expand,
    supersedes=(".trace.json.gz",),
    preload=("xpuprof.formats.xplane.decode", "xpuprof.formats.proto.xplane_pb2"),
    ranks_by_host=True,
)

__all__ = [
    "READER",
    "XPLANE_CATEGORY_LEVEL",
    "XPLANE_DEVICE_CATEGORIES",
    "XPLANE_SUFFIXES",
    "category",
    "expand",
    "find_xplane_files",
    "is_xplane_path",
    "plane_kind",
    "read_xplane",
    "sniff",
]

"""Reader for XPlane (``.xplane.pb``), the trace format of XProf, JAX, TensorFlow and PyTorch/XLA.

An XSpace holds planes (``/host:CPU``, ``/device:TPU:0``, ``/device:GPU:0``, ``/host:CUPTI``…),
a plane holds lines (host threads, device streams, or XProf's ``XLA Modules`` / ``XLA Ops`` /
``Steps`` timelines), a line holds events; each event points at event metadata shared by all
its occurrences (name, HLO text, per-op constants such as ``flops`` and ``bytes_accessed``) and
carries its own stats. The file is decoded with our own compiled copy of ``xplane.proto``
(``formats/proto``), so only ``protobuf`` is needed, never TensorFlow.

How an XSpace becomes the raw tables of ``xpuprof.core.raw`` (what ``trace.build`` normalises):

* **One ``X`` row per XEvent**, none dropped, in file order (plane, line, event). Zero-length
  events stay ``X`` rows with ``dur`` 0.
* **Time.** ``ts = line.timestamp_ns + floor(offset_ps / 1000)`` and ``dur = floor((offset_ps +
  duration_ps) / 1000) - floor(offset_ps / 1000)``: integer nanoseconds, with the *end* rounded
  down like the start, so an event that lies inside another in picoseconds still lies inside it
  in nanoseconds (rounding ``duration_ps`` on its own can push a child 1 ns past its parent);
  ``dur`` differs from ``duration_ps / 1000`` by less than 1 ns. Whenever ``offset_ps`` or
  ``duration_ps`` is not a whole number of nanoseconds (TPU device events usually are not), both
  are kept exactly in ``args`` as ``offset_ps`` / ``duration_ps``. Profilers write lines relative
  to the start of the capture; that instant (Unix-epoch ns, from the ``Task Environment``
  plane's ``profile_start_time``) is ``top["baseTimeNanoseconds"]``, as in Kineto traces, so
  ``ts + baseTimeNanoseconds`` is wall-clock time. An aggregated event (``num_occurrences``
  instead of an offset) starts at its line's timestamp and keeps ``num_occurrences`` in args.
* **pid / tid.** ``tid`` is the line id (the OS thread id, or in recent JAX a 64-bit hash of
  it, on host planes; the stream id on GPUs):
  XPlane says lines with the same id are one timeline, while ``display_id`` only groups rows
  in a viewer (it is 0 everywhere in real files). ``pid`` cannot be the plane id, which is 0 for
  several planes of one file; it is the OS process id for a host plane that records one
  (``process_id`` stat: JAX writes it, and our own annotations use the same pid, so they share
  steps), otherwise the plane's position in the file. ``top["planes"]`` maps each pid back to
  its plane, and ``M`` rows (``process_name``, ``process_labels``, ``thread_name``) name
  planes and lines as a Kineto trace would.
* **name** is what XProf's trace viewer shows: the metadata's ``display_name`` when it has one
  (``broadcast.2``), else its ``name``; the full name (for XLA ops, the HLO instruction text)
  then goes to ``args["long_name"]``, as XProf does.
* **cat** is derived from the plane, the line and the event (:func:`category`); the table
  :data:`XPLANE_CATEGORY_LEVEL` maps each category to an across-stack level, and
  :data:`XPLANE_DEVICE_CATEGORIES` lists those recorded on a device timeline.
* **args** is a JSON object of the event metadata's stats merged with the event's own stats
  (the event's win on a clash), each named by its stat metadata name: numbers stay numbers
  (uint64 beyond 2**63 included), ``ref_value`` becomes the string it refers to,
  ``compressed_str_value`` is gunzipped to its string, and bytes become ``{"base64": "…"}``. A
  stat that occurs twice on one event (JAX's ``_src``) becomes a list of its values. NaN
  doubles are written as ``null`` (JSON has no NaN). The metadata's serialized ``metadata``
  field, rare, is kept as base64 under ``"metadata"`` up to 4 KiB (only its size beyond);
  ``child_id`` lists are not imported.
* **Typed columns**: ``correlation`` from the ``correlation_id`` stat (GPU kernels and the CUPTI
  calls that launched them), ``device_arg`` = the device index of device planes (and the
  ``device_ordinal`` stat of XLA CPU ops), ``stream_arg`` = the line id on devices (its
  position in the plane when the id is negative, and for XLA CPU ops the position of their
  thread's line, whose id is a hash), ``bytes_arg`` = XLA's ``bytes_accessed`` estimate for XLA
  ops and the size in the ``memcpy_details`` / ``memset_details`` stat of GPU copies and sets.
* **Skipped**: the ``/host:metadata`` plane, which holds each XLA program's HLO proto (often
  most of a file's bytes) and no events; its size, its count of event metadata and its plane
  stats are recorded in ``top["planes"]``. Plane stats, hostnames, errors and warnings of the
  XSpace go to ``top`` too.

Damage: a file that is not an XSpace, or is truncated or corrupt, raises
:class:`~xpuprof.core.errors.TraceFormatError` naming the file, the byte offset (in the decompressed
data for ``.gz``) and protobuf's own DecodeError message. The XSpace is walked plane by plane
(its top level with a small wire-format reader, each plane with protobuf), so with
``lenient=True`` the planes that decode are kept and each damaged one is reported in
``dropped``.

Speed: the only per-event Python is one pass over the protobuf objects that appends plain
values to lists (attribute access on protobuf messages cannot be avoided); names, categories,
times and shared args are then assembled with numpy/Arrow, once per plane.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import re
import zlib
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from xpuprof.core.errors import TraceFormatError
from xpuprof.core.raw import KINDS, RAW_SCHEMA, Dropped, RawTrace

# ----------------------------------------------------------------------------------------------
# Categories and levels
# ----------------------------------------------------------------------------------------------

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
_HOST_RULE = {
    "host": "host_trace",
    "python": "python_function",
    "cupti": "cuda_driver",
    "roctracer": "hip_runtime",
}

METADATA_PLANE = "/host:metadata"
TASK_ENV_PLANE = "Task Environment"
_DEVICE_PLANE = re.compile(r"^/device:([A-Za-z_]+):(\d+)")
_COLLECTIVE = re.compile(
    r"^(?:%?)(all-reduce|all-gather|all-to-all|ragged-all-to-all|reduce-scatter|"
    r"collective-permute|collective-broadcast|send|recv)\b",
    re.IGNORECASE,
)
_COPY = re.compile(r"^(?:%?)copy", re.IGNORECASE)
_SIZE = re.compile(r"\b(?:size|num_bytes)[:=]\s*(\d+)")
_GPU_MEMORY = ("memalloc_details", "memfree_details", "memory_residency_details")

#: Event stats the reader looks at while it passes (beyond copying them into args).
_WATCHED = frozenset(("correlation_id", "device_ordinal", "hlo_op", "step_num",
                     "memcpy_details", "memset_details", *_GPU_MEMORY))  # fmt: skip

#: Decompressed bytes read at a time from a gzipped file.
_BLOCK = 64 << 10

#: Metadata ``metadata`` bytes longer than this are not copied into args (only their size).
_MAX_INLINE_BYTES = 4096


# ----------------------------------------------------------------------------------------------
# A minimal wire-format walker for the top of the file (XSpace fields, a plane's header)
# ----------------------------------------------------------------------------------------------


class _WireError(Exception):
    def __init__(self, message: str, offset: int, truncated: bool = False) -> None:
        super().__init__(message)
        self.offset = offset
        self.truncated = truncated


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _WireError("the data ends inside a varint", start, truncated=True)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _WireError("malformed varint (longer than 10 bytes)", start)


def _fields(buf: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int, int, int]]:
    """Yield ``(field, wire_type, start, stop, value_start, value_end)`` of each field in
    ``buf[pos:end]`` (``start:stop`` is the whole field, key included); a varint yields its
    value as ``value_start`` and ``value_end = -1``."""
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos, end)
        field, wt = key >> 3, key & 7
        if field == 0:
            raise _WireError("field number 0 (not protobuf data)", start)
        if wt == 0:
            value, pos = _varint(buf, pos, end)
            yield field, wt, start, pos, value, -1
        elif wt == 2:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise _WireError(
                    f"field {field} needs {n} bytes but only {end - pos} are left",
                    start,
                    truncated=True,
                )
            yield field, wt, start, pos + n, pos, pos + n
            pos += n
        elif wt == 1 or wt == 5:
            n = 8 if wt == 1 else 4
            if pos + n > end:
                raise _WireError("the data ends inside a fixed-size field", start, True)
            yield field, wt, start, pos + n, pos, pos + n
            pos += n
        else:
            raise _WireError(f"wire type {wt} of field {field} is not valid here", start)


# ----------------------------------------------------------------------------------------------
# Stats
# ----------------------------------------------------------------------------------------------


def _bytes_value(v: bytes) -> dict[str, str]:
    return {"base64": base64.b64encode(v).decode("ascii")}


def _stat_value(s: Any, kind: str | None, ref_names: dict[int, str]) -> Any:
    if kind is None:
        return None
    v = getattr(s, kind)
    return _convert(kind, v, ref_names) if kind in _CONVERTED else v


def _convert(kind: str, v: Any, ref_names: dict[int, str]) -> Any:
    """A stat value that is not JSON as it is: a reference, bytes, gzipped text."""
    if kind == "ref_value":
        return ref_names.get(v, v)
    if kind == "bytes_value":
        return _bytes_value(v)
    if kind == "compressed_str_value":
        try:
            return zlib.decompress(v, 47).decode("utf-8")
        except (zlib.error, UnicodeDecodeError):
            return {"compressed": True, **_bytes_value(v)}
    return v


def _stats_dict(stats: Any, names: dict[int, str], ref_names: dict[int, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in stats:
        key = names.get(s.metadata_id, str(s.metadata_id))
        v = _stat_value(s, s.WhichOneof("value"), ref_names)
        _put(out, key, v)
    return out


def _put(d: dict[str, Any], key: str, v: Any) -> None:
    """Set ``d[key]``; a key seen twice keeps every value, as a list."""
    if key in d:
        old = d[key]
        if isinstance(old, _Multi):
            old.append(v)
        else:
            d[key] = _Multi((old, v))
    else:
        d[key] = v


class _Multi(list):
    """The values of a stat that occurs more than once on one event (a list in JSON)."""


_ENC = msgspec.json.Encoder()


# ----------------------------------------------------------------------------------------------
# Categories of one plane
# ----------------------------------------------------------------------------------------------


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
        rule = _line_rule(plane_name, line_name)
        return _md_category(rule, event_name, stats.get("hlo_category"), stats)
    if kind in _HOST_RULE or kind == "other":
        base = _HOST_RULE.get(kind, "xplane_trace")
        if kind == "host" and event_name.startswith("$"):
            base = "python_function"
        return _event_override(base, event_name, stats) or base
    return "xplane_trace"


def _line_rule(plane_name: str, line_name: str) -> str:
    """How the events of a device line get their category (``_md_category``'s ``rule``)."""
    if line_name in _DEVICE_LINES:
        return _DEVICE_LINES[line_name]
    if plane_name.startswith("/device:GPU"):
        return "cupti_overhead" if line_name == "CUPTI overhead" else "gpu_stream"
    return "device_trace"


def _md_category(rule: str, name: str, hlo_category: Any, stats: dict[str, Any]) -> str:
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
        if name.startswith("Memory") or any(k in stats for k in _GPU_MEMORY):
            return "gpu_memory"
        return "kernel"
    return rule


def _event_override(base: str, name: str, stats: dict[str, Any]) -> str | None:
    """Host events whose own stats change their category: step markers and XLA CPU ops."""
    if "step_num" in stats and base == "host_trace":
        return "host_step"
    op = stats.get("hlo_op")
    if op is not None and base == "host_trace" and op == name:
        # The XLA CPU runtime names the TraceMe of each op after the op itself; a GPU launch
        # TraceMe that carries hlo_op is named after the thunk instead, and stays host_trace.
        return "xla_op_cpu"
    return None


# ----------------------------------------------------------------------------------------------
# The reader
# ----------------------------------------------------------------------------------------------


_CONVERTED = frozenset({"ref_value", "bytes_value", "compressed_str_value"})


class _Scan:
    """The one pass over a plane's events: plain values appended to flat buffers.

    Per event: its metadata id, offset and duration (int64 buffers, read by numpy without a
    copy); where the event has stats of its own, or a time that is not whole nanoseconds, its
    merged args as JSON (with its position); and the few stats the columns need
    (``_WATCHED``), as ``(position, name, value)``.
    """

    def __init__(self) -> None:
        self.mids = array("q")
        self.offs = array("q")
        self.durs = array("q")
        self.own_pos = array("q")
        self.own_json: list[bytes] = []
        self.special: list[tuple[int, str, Any]] = []
        self.n = 0

    def line(self, events: Any, names: dict[int, str], md_args: dict[int, dict]) -> None:
        mids, offs, durs = self.mids.append, self.offs.append, self.durs.append
        own_pos, own_json = self.own_pos.append, self.own_json.append
        special = self.special.append
        watched = {sid: nm for sid, nm in names.items() if nm in _WATCHED}
        name_of = names.get
        md_get = md_args.get
        encode = _ENC.encode
        i = self.n
        for e in events:
            mid = e.metadata_id
            off = e.offset_ps
            dur = e.duration_ps
            mids(mid)
            offs(off)
            durs(dur)
            st = e.stats
            if st:
                extra: dict[str, Any] = {}
                for s in st:
                    sid = s.metadata_id
                    kind = s.WhichOneof("value")
                    if kind is None:
                        v = None
                    else:
                        v = getattr(s, kind)
                        if kind in _CONVERTED:
                            v = _convert(kind, v, names)
                    key = name_of(sid)
                    if key is None:
                        key = str(sid)
                    if key in extra:
                        _put(extra, key, v)
                    else:
                        extra[key] = v
                    if sid in watched:
                        special((i, watched[sid], v))
            elif off % 1000 == 0 and dur % 1000 == 0 and off:
                i += 1
                continue  # the common case: nothing but what the metadata says
            else:
                extra = {}
            if off % 1000 or dur % 1000:
                extra["offset_ps"] = off
                extra["duration_ps"] = dur
            if not off and e.WhichOneof("data") == "num_occurrences":
                extra["num_occurrences"] = e.num_occurrences
            if extra:
                base = md_get(mid)
                own_pos(i)
                own_json(encode({**base, **extra} if base else extra))
            i += 1
        self.n = i


def _group_special(special: list[tuple[int, str, Any]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for p, name, v in special:
        out.setdefault(p, {})[name] = v
    return out


class _PlaneMeta:
    """Per-event-metadata facts of one plane, as arrays indexed like ``ids`` (sorted)."""

    ids: np.ndarray
    name: np.ndarray
    json: np.ndarray
    bytes: np.ndarray
    flops: np.ndarray
    names: list[str]
    args_by_id: dict[int, dict[str, Any]]

    def __init__(self) -> None:
        self.luts: dict[str, np.ndarray] = {}


class _Cols:
    """Columns of the events of one plane, before pids are known."""

    __slots__ = ("n", "name", "cat", "tid", "ts", "dur", "args", "corr", "device", "stream",
                 "nbytes", "flops", "plane")  # fmt: skip


class _Reader:
    def __init__(self, path: Path, lenient: bool, progress: Callable[[int], None] | None):
        self.path = path
        self.lenient = lenient
        self.progress = progress
        self.dropped: list[Dropped] = []
        self.truncated = False
        self.compressed = False
        self.names: dict[str, int] = {}  # string → code of the name/category dictionaries
        self.cols: list[_Cols] = []
        self.meta: list[tuple[str, int, int | None, dict[str, Any]]] = []  # name, plane, tid, args
        self.planes_top: list[dict[str, Any]] = []
        self.plane_pos: list[int] = []  # position of each kept plane in the file
        self.process_ids: list[int | None] = []
        self.missing_metadata = 0

    # -- errors ----------------------------------------------------------------------------------

    def fail(self, message: str, offset: int | None = None) -> None:
        if self.compressed and offset is not None:
            message = f"{message} (offsets are in the decompressed data)"
        raise TraceFormatError(self.path, message, offset=offset)

    def damaged(self, message: str, offset: int | None, lost: str = "") -> None:
        """Damage that a lenient read survives (reported, with ``lost`` saying what it costs)
        and a strict one does not."""
        if not self.lenient:
            self.fail(message, offset)
        self.dropped.append(Dropped(message + lost, 0, offset=offset))

    # -- bytes in --------------------------------------------------------------------------------

    def load(self) -> tuple[bytes, int, str]:
        raw = self.path.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        size = len(raw)
        if not raw:
            self.fail("empty file: no XSpace")
        if raw[:2] != b"\x1f\x8b":
            return raw, size, digest
        self.compressed = True
        out: list[bytes] = []
        # block by block, so that a lenient read keeps what decompressed before any damage
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as g:
            try:
                while block := g.read(_BLOCK):
                    out.append(block)
            except EOFError:
                self.truncated = True
                self.damaged(
                    "truncated gzip stream: the file ends inside compressed data",
                    None,
                    ": the data it held is lost",
                )
            except (OSError, zlib.error) as e:
                self.truncated = True
                self.damaged(f"corrupt gzip data ({e})", None, ": what follows is lost")
        del raw
        return b"".join(out), size, digest

    # -- the file --------------------------------------------------------------------------------

    def read(self) -> RawTrace:
        data, size, digest = self.load()
        total = len(data)
        planes: list[tuple[int, int]] = []
        top: dict[str, Any] = {}
        strings: dict[int, list[str]] = {2: [], 3: [], 4: []}
        unknown = 0
        try:
            for field, wt, _start, _stop, v0, v1 in _fields(data, 0, total):
                if field == 1 and wt == 2:
                    planes.append((v0, v1))
                elif field in strings and wt == 2:
                    strings[field].append(bytes(data[v0:v1]).decode("utf-8", "replace"))
                else:
                    unknown += 1
        except _WireError as e:
            msg = self._decode_error(data, e, len(planes))
            self.truncated = self.truncated or e.truncated
            self.damaged(msg, e.offset, ": the rest of the file is lost")
        if not planes and not any(strings.values()):
            if unknown:
                self.fail(f"not an XSpace: {unknown} top-level fields and none is a plane", 0)
            if not self.dropped:
                self.fail("no planes: the XSpace is empty")
        hostnames, errors, warnings = strings[4], strings[2], strings[3]
        if hostnames:
            top["hostnames"] = hostnames
            top["hostname"] = hostnames[0]
        if errors:
            top["errors"] = errors
        if warnings:
            top["warnings"] = warnings
        if unknown:
            top["unknown_fields"] = unknown
        n_events_total = 0
        for i, (p0, p1) in enumerate(planes):
            n_events_total += self.plane(data, i, p0, p1, top)
            if self.progress:
                self.progress(p1)
        if self.progress:
            self.progress(total)
        return self.finish(top, size, digest, n_events_total)

    def _decode_error(self, data: bytes, e: _WireError, planes: int) -> str:
        """The walker's finding plus protobuf's own DecodeError message for the whole file."""
        from google.protobuf.message import DecodeError

        from xpuprof.formats.proto.xplane_pb2 import XSpace

        if e.truncated:
            msg = f"truncated XSpace: the file ends after {planes} whole planes ({e})"
        else:
            msg = f"not a valid XSpace: {e}"
        try:
            XSpace.FromString(data)
        except DecodeError as de:
            msg += f" (protobuf: DecodeError: {de})"
        return msg

    # -- one plane -------------------------------------------------------------------------------

    def plane(self, data: bytes, pos: int, p0: int, p1: int, top: dict[str, Any]) -> int:
        from google.protobuf.message import DecodeError

        from xpuprof.formats.proto.xplane_pb2 import XPlane

        plane_id, name = self.peek_header(data, p0, p1)
        if name == METADATA_PLANE:
            self.skip_plane(data, pos, p0, p1, name, plane_id)
            return 0
        try:
            plane = XPlane.FromString(data[p0:p1])
        except DecodeError as e:
            self.damaged(
                f"plane {pos} ({name or 'unnamed'}, bytes {p0}..{p1}) does not decode: "
                f"DecodeError: {e}",
                p0,
                ": the plane is left out",
            )
            return 0
        return self.events(plane, pos, p1 - p0, top)

    def peek_header(self, data: bytes, p0: int, p1: int) -> tuple[int, str]:
        """The plane's id and name, read from its first fields without decoding the rest."""
        plane_id, name = 0, ""
        try:
            for field, wt, _start, _stop, v0, v1 in _fields(data, p0, p1):
                if field == 1 and wt == 0:
                    plane_id = v0 - (1 << 64) if v0 >= 1 << 63 else v0
                elif field == 2 and wt == 2:
                    name = bytes(data[v0:v1]).decode("utf-8", "replace")
                    break
                elif field > 2:
                    break
        except _WireError:
            pass  # protobuf's own parse reports it
        return plane_id, name

    def skip_plane(self, data: bytes, pos: int, p0: int, p1: int, name: str, plane_id: int) -> None:
        """Record a metadata plane (HLO protos) without decoding its event metadata."""
        from google.protobuf.message import DecodeError

        from xpuprof.formats.proto.xplane_pb2 import XPlane

        keep = []
        n_meta = 0
        try:
            for field, _wt, start, stop, _v0, _v1 in _fields(data, p0, p1):
                if field == 4:
                    n_meta += 1
                elif field in (1, 2, 5, 6):  # id, name, stat metadata, stats: not the HLO
                    keep.append(bytes(data[start:stop]))
            light = XPlane.FromString(b"".join(keep))
            names = {k: v.name for k, v in light.stat_metadata.items()}
            stats = _stats_dict(light.stats, names, names)
        except (_WireError, DecodeError) as e:
            self.damaged(
                f"plane {pos} ({name}, bytes {p0}..{p1}) does not decode: {e}",
                p0,
                ": the plane is left out",
            )
            return
        self.planes_top.append(
            {
                "position": pos,
                "id": plane_id,
                "name": name,
                "kind": "metadata",
                "skipped": "holds the HLO proto of each XLA program and no events; not imported",
                "bytes": p1 - p0,
                "event_metadata": n_meta,
                "stats": stats,
            }
        )

    def events(self, plane: Any, pos: int, nbytes: int, top: dict[str, Any]) -> int:
        """Turn one decoded plane into columns (``self.cols``) and metadata rows."""
        pname = plane.name
        kind = plane_kind(pname)
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        plane_stats = _stats_dict(plane.stats, stat_names, stat_names)
        m = _DEVICE_PLANE.match(pname) if kind == "device" else None
        device = int(m.group(2)) if m else None
        lines = list(plane.lines)
        info: dict[str, Any] = {
            "position": pos,
            "id": plane.id,
            "name": pname,
            "kind": kind,
            "bytes": nbytes,
            "event_metadata": len(plane.event_metadata),
            "stats": plane_stats,
            "events": sum(len(line.events) for line in lines),
            "lines": [],
        }
        if m:
            info["device"] = device
            info["device_type"] = m.group(1)
        if kind == "task":
            top["task_environment"] = plane_stats
            start = plane_stats.get("profile_start_time")
            if isinstance(start, int) and start > 0:
                top["baseTimeNanoseconds"] = start
        proc = plane_stats.get("process_id") if kind == "host" else None
        self.planes_top.append(info)
        self.plane_pos.append(pos)
        self.process_ids.append(proc if isinstance(proc, int) and proc > 0 else None)
        k = len(self.plane_pos) - 1  # this plane among the kept ones
        self.meta.append(("process_name", k, None, {"name": pname}))
        if m:
            self.meta.append(("process_labels", k, None, {"labels": f"{m.group(1)} {device}"}))
        if not lines:
            return 0
        rules = [_line_rule(pname, ln.name) if kind == "device" else _HOST_RULE.get(kind,
                 "xplane_trace") for ln in lines]  # fmt: skip
        md = self.metadata(plane, stat_names, kind, set(rules))
        scan = _Scan()
        for line in lines:
            n = len(line.events)
            lid = line.id
            info["lines"].append(
                {
                    "id": lid,
                    "display_id": line.display_id,
                    "name": line.name,
                    "display_name": line.display_name,
                    "timestamp_ns": line.timestamp_ns,
                    "duration_ps": line.duration_ps,
                    "events": n,
                }
            )
            self.meta.append(("thread_name", k, lid, {"name": line.display_name or line.name}))
            scan.line(line.events, stat_names, md.args_by_id)
        del lines
        self.cols.append(self.columns(scan, info, md, rules, kind, device, k))
        return scan.n

    def metadata(self, plane: Any, stat_names: dict[int, str], kind: str, rules: set[str]):
        """Everything derived once per event metadata: name code, args, bytes, category per
        line rule (one lookup table per rule present, indexed like ``ids``)."""
        md = _PlaneMeta()
        ids = np.fromiter(plane.event_metadata.keys(), dtype=np.int64)
        ids.sort()
        n = len(ids)
        md.ids = ids
        md.name = np.full(n + 1, -1, dtype=np.int32)  # last slot: an id with no metadata
        md.json = np.empty(n + 1, dtype=object)
        md.bytes = np.full(n + 1, np.nan)
        md.flops = np.full(n + 1, np.nan)
        md.names = [""] * (n + 1)
        args_list: list[dict[str, Any]] = [{}] * (n + 1)
        for j, mid in enumerate(ids.tolist()):
            meta = plane.event_metadata[mid]
            args = _stats_dict(meta.stats, stat_names, stat_names)
            shown = meta.display_name or meta.name
            if meta.display_name and meta.name and meta.name != meta.display_name:
                args["long_name"] = meta.name
            if meta.metadata:
                blob = meta.metadata
                too_big = len(blob) > _MAX_INLINE_BYTES
                args["metadata"] = {"bytes": len(blob)} if too_big else _bytes_value(blob)
            md.names[j] = shown
            md.name[j] = self.code(shown)
            args_list[j] = args
            md.json[j] = _ENC.encode(args) if args else None
            for key, col in (("bytes_accessed", md.bytes), ("flops", md.flops)):
                v = args.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    col[j] = v
        md.args_by_id = {mid: a for mid, a in zip(ids.tolist(), args_list, strict=False) if a}
        for rule in rules:
            lut = np.empty(n + 1, dtype=np.int32)
            for j in range(n):
                if kind == "device":
                    c = _md_category(rule, md.names[j], args_list[j].get("hlo_category"),
                                     args_list[j])  # fmt: skip
                elif rule == "host_trace" and md.names[j].startswith("$"):
                    c = "python_function"
                else:
                    c = _event_override(rule, md.names[j], args_list[j]) or rule
                lut[j] = self.code(c)
            lut[n] = self.code(rule)
            md.luts[rule] = lut
        return md

    def columns(
        self,
        scan: _Scan,
        info: dict[str, Any],
        md: _PlaneMeta,
        rules: list[str],
        kind: str,
        device: int | None,
        k: int,
    ) -> _Cols:
        """The plane's event columns, vectorized over its events."""
        n_ev = scan.n
        counts = np.array([line["events"] for line in info["lines"]], dtype=np.int64)
        n_md = len(md.ids)
        mid = np.frombuffer(scan.mids, dtype=np.int64)
        if n_md:
            jx = np.minimum(np.searchsorted(md.ids, mid), n_md - 1)
            found = md.ids[jx] == mid
            jx = np.where(found, jx, n_md)
            self.missing_metadata += int(n_ev - found.sum())
        else:
            jx = np.zeros(n_ev, dtype=np.int64)
            self.missing_metadata += n_ev
        off = np.frombuffer(scan.offs, dtype=np.int64)
        start = off // 1000
        dur = (off + np.frombuffer(scan.durs, dtype=np.int64)) // 1000 - start
        line_ts = np.array([line["timestamp_ns"] for line in info["lines"]], dtype=np.int64)
        ts = np.repeat(line_ts, counts) + start
        del off, start, mid
        cat = np.empty(n_ev, dtype=np.int32)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        for li, rule in enumerate(rules):
            a, b = bounds[li], bounds[li + 1]
            cat[a:b] = md.luts[rule][jx[a:b]]
        line_ids = np.array([line["id"] for line in info["lines"]], dtype=np.int64)
        tid = np.repeat(line_ids, counts)
        corr = np.zeros(n_ev, dtype=np.int64)
        has_corr = np.zeros(n_ev, dtype=bool)
        dev = np.full(n_ev, -1 if device is None else device, dtype=np.int64)
        if device is not None:
            # the line id is the stream; a negative id (a hash) cannot be, so its position is
            positions = np.arange(len(line_ids), dtype=np.int64)
            stream = np.repeat(np.where(line_ids >= 0, line_ids, positions), counts)
        else:
            stream = np.full(n_ev, -1, dtype=np.int64)
        nbytes = md.bytes[jx]
        if scan.special:
            line_of = np.repeat(np.arange(len(counts)), counts)
            for p, sv in _group_special(scan.special).items():
                c = sv.get("correlation_id")
                if isinstance(c, int) and -(2**63) <= c < 2**63:
                    corr[p] = c
                    has_corr[p] = True
                name = md.names[jx[p]]
                rule = rules[line_of[p]]
                if rule == "gpu_stream":
                    cat[p] = self.code(_md_category(rule, name, None, sv))
                    det = sv.get("memcpy_details") or sv.get("memset_details")
                    size = _SIZE.search(det) if isinstance(det, str) else None
                    if size:
                        nbytes[p] = float(size.group(1))
                elif rule == "host_trace":
                    c2 = _event_override(rule, name, sv)
                    if c2 is not None:
                        cat[p] = self.code(c2)
                    if c2 == "xla_op_cpu":
                        d = sv.get("device_ordinal")
                        dev[p] = d if isinstance(d, int) and d >= 0 else 0
                        stream[p] = line_of[p]  # the thread's position: its id is a hash
        cols = _Cols()
        cols.n = n_ev
        cols.name = md.name[jx]
        cols.cat = cat
        cols.tid = tid
        cols.ts = ts
        cols.dur = dur
        cols.corr = (corr, has_corr)
        cols.device = dev
        cols.stream = stream
        cols.nbytes = nbytes
        cols.flops = md.flops[jx]
        cols.plane = k
        # args: the event's own JSON where it has one, else its metadata's (shared) JSON
        args = md.json[jx]
        if scan.own_pos:
            args[np.frombuffer(scan.own_pos, dtype=np.int64)] = scan.own_json
        cols.args = _strings(args)
        return cols

    def code(self, s: str) -> int:
        c = self.names.get(s)
        if c is None:
            c = self.names[s] = len(self.names)
        return c

    # -- tables out ------------------------------------------------------------------------------

    def pids(self) -> list[int]:
        """pid of each kept plane: its process id when it is a host plane with one, else its
        position in the file; positions for all when that would make two planes share one."""
        chosen = [
            proc if proc is not None else pos
            for proc, pos in zip(self.process_ids, self.plane_pos, strict=True)
        ]
        if len(set(chosen)) != len(chosen):
            chosen = list(self.plane_pos)
        return chosen

    def finish(self, top: dict[str, Any], size: int, digest: str, n_events: int) -> RawTrace:
        pids = self.pids()
        kept = iter(pids)
        for info in self.planes_top:
            if info.get("kind") != "metadata":
                info["pid"] = next(kept)
        self.planes_top.sort(key=lambda d: d["position"])
        top["planes"] = self.planes_top
        if self.missing_metadata:
            top["events_without_metadata"] = self.missing_metadata
        dictionary = pa.array(list(self.names), pa.string())
        # metadata rows first (index 0..M-1), then events in file order
        n_meta = len(self.meta)
        meta_tbl = pa.table(
            {
                "index": pa.array(np.arange(n_meta, dtype=np.int64)),
                "ph": _dict_const("M", n_meta),
                "cat": pa.nulls(n_meta, RAW_SCHEMA.field("cat").type),
                "name": pc.dictionary_encode(pa.array([m[0] for m in self.meta], pa.string())),
                "pid": pa.array([pids[m[1]] for m in self.meta], pa.int64()),
                "tid": pa.array([m[2] for m in self.meta], pa.int64()),
                "ts": pa.nulls(n_meta, pa.int64()),
                "dur": pa.nulls(n_meta, pa.int64()),
                "args": pa.array(
                    [_ENC.encode(m[3]).decode() for m in self.meta], pa.large_string()
                ),  # fmt: skip
            }
        )
        meta_tbl = _conform(meta_tbl)
        batches = []
        index = n_meta
        for c in self.cols:
            if not c.n:
                continue
            corr, has_corr = c.corr
            is_dev = c.device >= 0
            batches.append(
                pa.table(
                    {
                        "index": pa.array(np.arange(index, index + c.n, dtype=np.int64)),
                        "ph": _dict_const("X", c.n),
                        "cat": pa.DictionaryArray.from_arrays(pa.array(c.cat), dictionary),
                        "name": pa.DictionaryArray.from_arrays(
                            pa.array(c.name, mask=c.name < 0), dictionary
                        ),
                        "pid": pa.array(np.full(c.n, pids[c.plane], dtype=np.int64)),
                        "tid": pa.array(c.tid),
                        "ts": pa.array(c.ts),
                        "dur": pa.array(c.dur),
                        "args": c.args,
                        "correlation": pa.array(corr, mask=~has_corr),
                        "device_arg": pa.array(c.device, mask=~is_dev),
                        "stream_arg": pa.array(c.stream, mask=c.stream < 0),
                        "bytes_arg": pa.array(c.nbytes, mask=np.isnan(c.nbytes)),
                        # kept only if RAW_SCHEMA has the column (proposed; _conform drops it
                        # otherwise): XLA's FLOP count of each op, from its metadata
                        "flops_arg": pa.array(c.flops, mask=np.isnan(c.flops)),
                    }
                )
            )
            index += c.n
        self.cols = []
        # one chunk per plane, as the Kineto reader leaves one per decoded run
        ev_tbl = (
            pa.concat_tables([_conform(b) for b in batches])
            if batches
            else RAW_SCHEMA.empty_table()
        )
        tables = {k: RAW_SCHEMA.empty_table() for k in KINDS}
        tables["events"] = ev_tbl
        tables["metadata"] = meta_tbl
        read_phase = {"M": n_meta} if n_meta else {}
        if ev_tbl.num_rows:
            read_phase["X"] = ev_tbl.num_rows
        read_category: dict[str, int] = {}
        for t in (meta_tbl, ev_tbl):
            for row in pc.value_counts(t["cat"]).to_pylist():
                key = "" if row["values"] is None else row["values"]
                read_category[key] = read_category.get(key, 0) + row["counts"]
        return RawTrace(
            path=str(self.path),
            tables=tables,
            read_phase=read_phase,
            read_category=read_category,
            top=top,
            string_ids={"pid": {}, "tid": {}},
            size=size,
            sha256=digest,
            compressed=self.compressed,
            dropped=self.dropped,
            truncated=self.truncated,
            format="xplane",
        )


def _dict_const(value: str, n: int) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(
        pa.array(np.zeros(n, dtype=np.int32)), pa.array([value], pa.string())
    )


def _strings(values: np.ndarray) -> pa.LargeStringArray:
    """A large-string column from an object array of JSON bytes (None = null), built from one
    joined buffer and offsets rather than a Python str per element."""
    n = len(values)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    parts = [v if v is not None else b"" for v in values]
    lens = np.fromiter(map(len, parts), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = b"".join(parts)
    n_null = int(n - valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if n_null else None
    return pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(data), validity, null_count=n_null
    )


def _conform(t: pa.Table) -> pa.Table:
    """Add the RAW_SCHEMA columns a table lacks (as nulls) and put them in schema order."""
    n = t.num_rows
    cols = []
    for f in RAW_SCHEMA:
        if f.name in t.column_names:
            col = t[f.name]
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=RAW_SCHEMA)


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
    p = Path(path)
    if not p.is_file():
        raise TraceFormatError(p, "no such file")
    return _Reader(p, lenient, progress).read()


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


__all__ = [
    "XPLANE_CATEGORY_LEVEL",
    "XPLANE_DEVICE_CATEGORIES",
    "category",
    "find_xplane_files",
    "is_xplane_path",
    "plane_kind",
    "read_xplane",
]

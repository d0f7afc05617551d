"""The reader of PyTorch profiler (Kineto) and other Chrome-trace JSON files: what it declares
to the registry (suffixes, sniffing, the category vocabulary); the decoder itself is
``decode.py``, imported on first read so that declaring the reader costs nothing.

Why the decoder looks the way it does:

* **Speed.** Events are decoded with msgspec into small typed structs, a few megabytes of JSON
  at a time, and turned into Arrow columns at once, so no per-event Python dict is ever built and
  memory stays bounded by the chunk size plus the columns (a 2 GB file fits in a few GB).
* **Exact time.** Kineto writes microseconds as decimals carrying nanoseconds
  (``1712195495519689.047``); a float64 cannot hold that, so ``ts``/``dur`` are kept as their raw
  JSON text and converted to integer nanoseconds through Arrow's decimal cast.
* **Lossless.** Every entry of ``traceEvents`` becomes a row; its ``args`` object is kept as its
  original JSON text, unknown top-level keys of an entry go to ``extra``, string pids/tids are
  mapped to negative integers with the mapping kept, and every other top-level key of the file
  (``deviceProperties``, ``distributedInfo``, …) is returned as ``top``.
* **Clear errors, bounded time.** Damage is reported with the file and the byte offset (of the
  decompressed text for ``.gz``; of the file for gzip damage) or the event index; with
  ``lenient=True`` what parses is kept and every dropped piece is reported with its reason and
  place. Whatever the file holds (deep nesting, huge numbers, bad UTF-8, separators inside
  strings), decoding is linear in its size and fails only with ``TraceFormatError``
  (``docs/formats.md``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from xpuprof.formats import Reader

if TYPE_CHECKING:
    from xpuprof.core.raw import RawTrace

SUFFIXES = (".json", ".json.gz")

#: Kineto's categories → across-stack level (``xpuprof.core.names.LEVELS``), lower-case.
CATEGORY_LEVELS: dict[str, str] = {
    # current Kineto vocabulary
    "cpu_op": "op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "annotation",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "python_function": "python",
    "cuda_profiler_range": "kernel",  # kernels with hardware counters
    # 2021 vocabulary (``Operator``, ``Runtime``, …; compared lower-case)
    "operator": "op",
    "runtime": "runtime",
    "memcpy": "memcpy",
    "memset": "memset",
    # other accelerators
    "mtia_runtime": "runtime",
    "mtia_ccp_events": "kernel",
    "privateuse1_runtime": "runtime",
    "privateuse1_driver": "runtime",
    "xpu_runtime": "runtime",
    "xpu_driver": "runtime",
}

#: Categories recorded on a device timeline (pid = device, tid = stream).
DEVICE_CATEGORIES = frozenset(
    {
        "kernel",
        "gpu_memcpy",
        "gpu_memset",
        "gpu_user_annotation",
        "cuda_sync",
        "cuda_profiler_range",
        "mtia_ccp_events",
        "memcpy",
        "memset",
    }
)

#: Bytes of (decompressed) text that sniffing looks at.
_SNIFF_BYTES = 4096


def sniff(path: str | Path) -> bool:
    """True when the file's text (gunzipped if it is gzip) starts with a JSON object or array,
    as a Chrome trace does (``{"traceEvents": …}`` or a bare list of events)."""
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    if head[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, _SNIFF_BYTES)
        except zlib.error:
            return False
    head = head.lstrip(b" \t\r\n")
    return head[:1] in (b"{", b"[")


def read_kineto(
    path: str | Path,
    *,
    lenient: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RawTrace:
    """Read one Kineto / Chrome-trace JSON file (plain or gzip) into raw columns.

    ``progress`` is called with the number of decompressed bytes consumed so far.
    Raises :class:`~xpuprof.core.errors.TraceFormatError` on damage unless ``lenient``.
    """
    from xpuprof.formats.kineto.decode import read

    return read(path, lenient=lenient, progress=progress)


READER = Reader(
    name="kineto",
    description="PyTorch profiler (Kineto) and other Chrome-trace JSON: .json, .json.gz",
    suffixes=SUFFIXES,
    read=read_kineto,
    sniff=sniff,
    category_levels=CATEGORY_LEVELS,
    device_categories=DEVICE_CATEGORIES,
    preload=("xpuprof.formats.kineto.decode",),
)

__all__ = ["CATEGORY_LEVELS", "DEVICE_CATEGORIES", "READER", "SUFFIXES", "read_kineto", "sniff"]

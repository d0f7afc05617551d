"""Structure-aware generators of hostile traces, and the property every import must keep;
shared by ``tests/test_fuzz.py`` (bounded, in CI) and ``scripts/fuzz.py`` (longer, by hand).

The property: importing a file either succeeds — and then every entry of the event list is
accounted for, kept or listed as dropped (kept + dropped = read), each kept entry under its
position in the source list — or fails with an ``XpuprofError`` whose message starts with the
file's path; never another exception, and never more than ``LIMIT_S`` seconds for an input
under 1 MB.

Kineto documents are built from events with odd types (numbers as names, strings as pids,
lists as args), huge and negative numbers (2**64, 1e400, 1e999999999), deep nesting (past
msgspec's recursion limit), strings that are not UTF-8 or hold ``},{``, entries that are not
events, duplicate ``traceEvents`` keys, then damaged as bytes (cut, flipped, junk between
events, a quote removed) and optionally gzipped and damaged again. XPlane files are built as
protobufs with extreme values, then optionally damaged. The decoder's chunk size is drawn too
(down to a few bytes), so that chunk boundaries, bad splits and the walker are exercised by
small inputs.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

#: The most seconds one import of an input under 1 MB may take.
LIMIT_S = 10.0


# ----------------------------------------------------------------------------------------------
# JSON text with what json.dumps cannot write
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """Bytes spliced into the JSON text as they are: numbers beyond float64, strings that are
    not UTF-8 or hold bad escapes, nesting deeper than a recursive writer could produce."""

    text: bytes


def dumps(v: Any, sep: bytes = b", ") -> bytes:
    """JSON bytes of ``v`` (dicts, lists, str, numbers, bool, None, :class:`Raw`)."""
    if isinstance(v, Raw):
        return v.text
    if v is None:
        return b"null"
    if v is True:
        return b"true"
    if v is False:
        return b"false"
    if isinstance(v, int):
        return str(v).encode()
    if isinstance(v, float):
        return repr(v).encode() if math.isfinite(v) else b"0"
    if isinstance(v, str):
        import json

        return json.dumps(v).encode()
    if isinstance(v, dict):
        return b"{" + sep.join(dumps(k) + b": " + dumps(x, sep) for k, x in v.items()) + b"}"
    if isinstance(v, (list, tuple)):
        return b"[" + sep.join(dumps(x, sep) for x in v) + b"]"
    raise TypeError(type(v))


@dataclass(frozen=True)
class Pairs:
    """An object whose keys may repeat (a duplicate ``traceEvents``), in order."""

    items: tuple[tuple[str, Any], ...]


def dump_doc(top: Pairs, sep: bytes) -> bytes:
    return b"{" + sep.join(dumps(k) + b": " + dumps(v, sep) for k, v in top.items) + b"}"


# ----------------------------------------------------------------------------------------------
# values
# ----------------------------------------------------------------------------------------------

EDGE_INTS = [0, 1, -1, 7, 2**31, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30]
ODD_NUMBERS = [b"1e400", b"-1e400", b"1e-400", b"1.5E+3", b"0.0000001", b"-0.0", b"1" * 400,
               b"1e999999999", b"123456789012345678901234.5678",
               b"1712195495519689.047"]  # fmt: skip
BAD_STRINGS = [b'"\xff\xfe"', b'"a\xc3"', b'"\\ud800"', b'"\\ud800x"', b'"\\udc00"', b'"\\q"',
               b'"\x01"', b'"\\u12"', b'"\xed\xa0\x80"']  # fmt: skip
TEXTS = ["", "},{", "}, {", '"', "\\", "ProfilerStep#1", "ProfilerStep#x", "aten::mm",
         "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "nn.Module: Linear", "cudaLaunchKernel",
         "\u0000", "é", "\U0001f600", "x" * 300]  # fmt: skip
CATS = ["cpu_op", "kernel", "cuda_runtime", "gpu_memcpy", "gpu_memset", "user_annotation",
        "gpu_user_annotation", "python_function", "ac2g", "fwdbwd", "cuda_driver", "Trace",
        "cpu_instant_event", "", "KERNEL"]  # fmt: skip
PHASES = ["X", "X", "X", "X", "B", "E", "i", "I", "s", "t", "f", "C", "M", "b", "e", "n", "", "?"]
ARG_KEYS = ["correlation", "External id", "external id", "device", "stream", "bytes",
            "Input Dims", "Input type", "Concrete Inputs", "name", "labels", "In msg nelems",
            "dtype", "Collective name", "stream_id"]  # fmt: skip


def deep(n: int, obj: bool) -> Raw:
    if obj:
        return Raw(b'{"a": ' * n + b"1" + b"}" * n)
    return Raw(b"[" * n + b"]" * n)


def odd_scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from(EDGE_INTS),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from(ODD_NUMBERS).map(Raw),
        st.sampled_from(TEXTS),
        st.text(max_size=12),
        st.sampled_from(BAD_STRINGS).map(Raw),
    )


def deep_values() -> st.SearchStrategy[Raw]:
    return st.builds(deep, st.sampled_from([2, 50, 500, 990, 1001, 3000]), st.booleans())


def odd_values() -> st.SearchStrategy[Any]:
    return st.recursive(
        st.one_of(odd_scalars(), deep_values()),
        lambda kids: st.one_of(
            st.lists(kids, max_size=3),
            st.dictionaries(st.sampled_from(ARG_KEYS) | st.text(max_size=6), kids, max_size=3),
        ),
        max_leaves=6,
    )


def usually(normal: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy:
    """``normal`` nine times in ten, else ``odd``: enough sane events to reach the nesting,
    B/E pairing, flows and steps, enough odd ones to reach every error path."""
    return st.integers(0, 9).flatmap(lambda k: odd if k == 0 else normal)


# ----------------------------------------------------------------------------------------------
# Kineto documents
# ----------------------------------------------------------------------------------------------

_MISSING = object()


@st.composite
def events(draw: st.DrawFn) -> Any:
    """One traceEvents entry: mostly an event, odd in some field; sometimes not an object."""
    if draw(st.integers(0, 24)) == 0:
        return draw(odd_values())
    fields: dict[str, st.SearchStrategy[Any]] = {
        "ph": usually(st.sampled_from(PHASES), odd_scalars()),
        "cat": usually(st.sampled_from(CATS), odd_values()),
        "name": usually(st.sampled_from(TEXTS[4:12]) | st.text(max_size=8), odd_values()),
        "pid": usually(st.integers(0, 3), odd_scalars()),
        "tid": usually(st.integers(0, 3), odd_scalars()),
        "ts": usually(
            st.integers(-5, 400) | st.floats(-5, 400).map(lambda x: round(x, 3)), odd_scalars()
        ),  # fmt: skip
        "dur": usually(st.integers(-3, 200), odd_scalars()),
        "id": usually(st.integers(0, 20), odd_scalars()),
        "bp": usually(st.just("e"), odd_scalars()),
        "s": usually(st.sampled_from(["t", "p", "g"]), odd_scalars()),
        "args": usually(
            st.dictionaries(
                st.sampled_from(ARG_KEYS), st.integers(-2, 40) | st.text(max_size=5), max_size=4
            ),
            odd_values(),
        ),  # fmt: skip
        "extra_key": odd_values(),
    }
    ev: dict[str, Any] = {}
    for key, strat in fields.items():
        present = draw(st.integers(0, 9))
        if key in ("ph", "ts", "pid", "tid", "name") and present or present >= 5:
            ev[key] = draw(strat)
    return ev


@dataclass
class Doc:
    """A generated file: its bytes and name suffix, how many entries its event list(s) hold,
    each entry's name (when known), and whether bytes were damaged after it was written (then
    only "no crash, no hang" can be checked, not the count)."""

    content: bytes
    suffix: str
    entries: int
    names: list[Any]
    damaged: str | None = None


@st.composite
def kineto_docs(draw: st.DrawFn, max_events: int = 30) -> Doc:
    evs = draw(st.lists(events(), max_size=max_events))
    sep = draw(st.sampled_from([b",", b", ", b",\n  ", b" ,\t"]))
    layout = draw(st.sampled_from(["object", "object", "object", "array"]))
    entries = len(evs)
    if layout == "array":
        text = dumps(evs, sep)
    else:
        items: list[tuple[str, Any]] = []
        for _ in range(draw(st.integers(0, 2))):
            items.append((draw(st.sampled_from(["deviceProperties", "schemaVersion", "x"])),
                          draw(usually(st.integers(0, 3), odd_values()))))  # fmt: skip
        items.append(("traceEvents", evs))
        for _ in range(draw(st.integers(0, 2))):
            if draw(st.integers(0, 5)) == 0:
                dup = draw(st.lists(events(), max_size=3))
                items.append(("traceEvents", dup))
                entries += len(dup)
            else:
                items.append((draw(st.sampled_from(["distributedInfo", "displayTimeUnit", "y"])),
                              draw(usually(st.integers(0, 3), odd_values()))))  # fmt: skip
        text = dump_doc(Pairs(tuple(items)), sep)
    names = [e.get("name", _MISSING) if isinstance(e, dict) else _MISSING for e in evs]
    damaged = None
    if draw(st.integers(0, 2)) == 0:
        text, damaged = draw(damage(text))
    suffix = ".json"
    if draw(st.integers(0, 3)) == 0:
        suffix = ".json.gz"
        text = gzip.compress(text, mtime=0)
        if draw(st.booleans()):  # a second member
            text += gzip.compress(b" ", mtime=0)
        if draw(st.integers(0, 2)) == 0:
            text, how = draw(damage(text))
            damaged = f"gzip {how}"
    return Doc(text, suffix, entries, names, damaged)


@st.composite
def damage(draw: st.DrawFn, text: bytes) -> tuple[bytes, str]:
    """One byte-level damage to ``text``, and its name."""
    if not text:
        return text, "none"
    how = draw(st.sampled_from(["cut", "flip", "insert", "delete", "junk", "unquote"]))
    at = draw(st.integers(0, len(text) - 1))
    if how == "cut":
        return text[:at], how
    if how == "flip":
        b = bytearray(text)
        b[at] ^= 1 << draw(st.integers(0, 7))
        return bytes(b), how
    if how == "insert":
        junk = draw(st.binary(min_size=1, max_size=6))
        return text[:at] + junk + text[at:], how
    if how == "delete":
        return text[:at] + text[at + draw(st.integers(1, 12)) :], how
    if how == "junk":
        k = text.find(b"}", at)
        k = k if k >= 0 else at
        return text[: k + 1] + b" @@junk@@ " + text[k + 1 :], how
    k = text.find(b'"', at)
    k = k if k >= 0 else at
    return text[:k] + text[k + 1 :], how


# ----------------------------------------------------------------------------------------------
# XPlane files
# ----------------------------------------------------------------------------------------------

PLANE_NAMES = [
    "/host:CPU",
    "/device:TPU:0",
    "/device:GPU:1",
    "/device:GPU:99999999999999999999",
    "/host:CUPTI",
    "/host:metadata",
    "Task Environment",
    "/host:python-tracer",
    "odd",
]
LINE_NAMES = ["XLA Ops", "Steps", "XLA Modules", "Async XLA Ops", "Framework Ops",
              "Stream #1(MemcpyH2D)", "Host Threads/1", ""]  # fmt: skip
STAT_NAMES = ["correlation_id", "device_ordinal", "hlo_op", "step_num", "memcpy_details",
              "memset_details", "hlo_category", "flops", "bytes_accessed", "process_id",
              "profile_start_time", "x"]  # fmt: skip
I64 = st.one_of(st.integers(-5, 10**6), st.sampled_from([2**63 - 1, -(2**63), 10**15, -(10**15)]))


def _stat(draw: st.DrawFn, s: Any, mids: list[int]) -> None:
    s.metadata_id = draw(st.sampled_from(mids) | I64)
    kind = draw(st.sampled_from(["double", "uint64", "int64", "str", "bytes", "ref", "zstr"]))
    if kind == "double":
        s.double_value = draw(st.floats())
    elif kind == "uint64":
        s.uint64_value = draw(st.integers(0, 2**64 - 1))
    elif kind == "int64":
        s.int64_value = draw(st.integers(-(2**63), 2**63 - 1))
    elif kind == "str":
        s.str_value = draw(st.sampled_from(TEXTS) | st.sampled_from(["size: 42", "num_bytes=9"]))
    elif kind == "bytes":
        s.bytes_value = draw(st.binary(max_size=8))
    elif kind == "ref":
        s.ref_value = draw(
            st.sampled_from([m for m in mids if m >= 0] or [0]) | st.integers(0, 2**64 - 1)
        )
    else:
        s.compressed_str_value = draw(
            st.sampled_from([gzip.compress(b"long text"), b"\x1f\x8bjunk", b""])
        )


@st.composite
def xplane_files(draw: st.DrawFn) -> Doc:
    from xpuprof.formats.proto.xplane_pb2 import XSpace

    space = XSpace()
    for h in draw(st.lists(st.sampled_from(["host", ""]), max_size=2)):
        space.hostnames.append(h)
    for _ in range(draw(st.integers(0, 3))):
        plane = space.planes.add(id=draw(I64), name=draw(st.sampled_from(PLANE_NAMES)))
        mids = draw(st.lists(I64, min_size=1, max_size=4, unique=True))
        for i, mid in enumerate(mids):
            plane.stat_metadata[mid].id = mid
            plane.stat_metadata[mid].name = STAT_NAMES[i % len(STAT_NAMES)]
            md = plane.event_metadata[mid]
            md.id = mid
            md.name = draw(st.sampled_from(TEXTS[4:9] + ["all-reduce.1", "copy-start", "%fusion"]))
            md.display_name = draw(st.sampled_from(["", "fusion.3"]))
            if draw(st.booleans()):
                md.metadata = draw(st.binary(max_size=16))
            for _ in range(draw(st.integers(0, 2))):
                _stat(draw, md.stats.add(), mids)
        for _ in range(draw(st.integers(0, 2))):
            _stat(draw, plane.stats.add(), mids)
        for _ in range(draw(st.integers(0, 3))):
            line = plane.lines.add(id=draw(I64), name=draw(st.sampled_from(LINE_NAMES)),
                                   timestamp_ns=draw(I64), duration_ps=draw(I64))  # fmt: skip
            for _ in range(draw(st.integers(0, 6))):
                ev = line.events.add(metadata_id=draw(st.sampled_from(mids) | I64),
                                     duration_ps=draw(I64))  # fmt: skip
                if draw(st.booleans()):
                    ev.offset_ps = draw(I64)
                else:
                    ev.num_occurrences = draw(I64)
                for _ in range(draw(st.integers(0, 2))):
                    _stat(draw, ev.stats.add(), mids)
    data = space.SerializeToString()
    damaged = None
    if draw(st.integers(0, 2)) == 0:
        data, damaged = draw(damage(data))
    suffix = ".xplane.pb"
    if draw(st.integers(0, 4)) == 0:
        suffix += ".gz"
        data = gzip.compress(data, mtime=0)
    return Doc(data, suffix, 0, [], damaged)


# ----------------------------------------------------------------------------------------------
# the property
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def chunk_size(n: int | None) -> Iterator[None]:
    """Decode Kineto text ``n`` bytes at a time (None: as shipped), to reach the chunk-boundary
    and walker paths with small inputs."""
    from xpuprof.formats.kineto import decode, walk

    if n is None:
        yield
        return
    saved = decode.CHUNK_BYTES, walk.RUN_BYTES
    decode.CHUNK_BYTES, walk.RUN_BYTES = n, max(n, 1)
    try:
        yield
    finally:
        decode.CHUNK_BYTES, walk.RUN_BYTES = saved


def check_import(doc: Doc, path: Path, *, lenient: bool, chunk: int | None = None) -> str:
    """Read and normalise ``doc`` written at ``path``; assert the property; return the
    outcome: ``ok``, ``ok-dropped`` (lenient, something listed as dropped) or ``rejected``."""
    from xpuprof.core.errors import XpuprofError
    from xpuprof.formats import reader_for
    from xpuprof.trace.normalize import build_tables

    path.write_bytes(doc.content)
    t0 = time.perf_counter()
    try:
        with chunk_size(chunk):
            raw = reader_for(path).read(path, lenient=lenient)
            build_tables(dict(raw.tables), part=0, rank=0, host=None,
                         string_ids=raw.string_ids, format=raw.format)  # fmt: skip
    except XpuprofError as e:
        assert str(e).startswith(f"{path}: "), str(e)
        assert "\n" not in str(e), str(e)
        outcome = "rejected"
    else:
        _check_accounting(doc, raw, lenient)
        outcome = "ok-dropped" if raw.dropped else "ok"
    took = time.perf_counter() - t0
    assert took < LIMIT_S, f"{took:.1f} s for {len(doc.content)} bytes"
    return outcome


def _check_accounting(doc: Doc, raw: Any, lenient: bool) -> None:
    """Every entry kept or listed as dropped; each kept one under its position in the list."""
    kept = sum(raw.read_phase.values())
    dropped = sum(d.events for d in raw.dropped)
    assert lenient or dropped == 0, raw.dropped
    if raw.format != "kineto" or doc.damaged:
        return
    assert kept + dropped == doc.entries, (kept, dropped, doc.entries, raw.dropped)
    index, names = [], []
    for t in raw.tables.values():
        index += t["index"].to_pylist()
        names += t["name"].to_pylist()
    assert len(set(index)) == len(index) == kept
    assert all(0 <= i < (len(doc.names) or doc.entries) for i in index)
    for i, name in zip(index, names, strict=True):
        want = doc.names[i] if doc.names else None
        if isinstance(want, str):
            assert name == want, (i, name, want)


def corpus(folder: Path) -> list[tuple[str, Doc]]:
    """The seed corpus: each file with what its ``.meta.json`` sidecar says is known about it
    by construction (entries in the event list, whether the bytes are damaged)."""
    import json

    out = []
    for meta in sorted(folder.glob("*.meta.json")):
        name = meta.name.removesuffix(".meta.json")
        m = json.loads(meta.read_text())
        data = (folder / name).read_bytes()
        suffix = next(
            s for s in (".json.gz", ".json", ".xplane.pb.gz", ".xplane.pb") if name.endswith(s)
        )
        out.append((name, Doc(data, suffix, m["entries"], [], "corpus" if m["damaged"] else None)))
    return out

"""The XPlane decoder: an XSpace, plane by plane, into the raw tables of ``core.raw`` (how,
and why, is in ``docs/formats.md``). Damage raises
:class:`~xpuprof.core.errors.TraceFormatError` with the byte offset, or (lenient) leaves out
just the plane it hit.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from xpuprof.core.errors import TraceFormatError
from xpuprof.core.raw import KINDS, RAW_SCHEMA, Dropped, RawTrace
from xpuprof.formats.gz import GzipDamage, gunzip
from xpuprof.formats.xplane.categories import (
    HOST_RULE,
    METADATA_PLANE,
    event_override,
    line_rule,
    md_category,
    plane_kind,
)
from xpuprof.formats.xplane.stats import ENC, Scan, bytes_value, group_special, stats_dict
from xpuprof.formats.xplane.tables import Cols, events_table, metadata_table, read_counts, strings
from xpuprof.formats.xplane.wire import WireError, fields

_DEVICE_PLANE = re.compile(r"^/device:([A-Za-z_]+):(\d+)")
_SIZE = re.compile(r"\b(?:size|num_bytes)[:=]\s*(\d+)")

#: Metadata ``metadata`` bytes longer than this are not copied into args (only their size).
_MAX_INLINE_BYTES = 4096


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


class Decoder:
    def __init__(self, path: Path, lenient: bool, progress: Callable[[int], None] | None):
        self.path = path
        self.lenient = lenient
        self.progress = progress
        self.dropped: list[Dropped] = []
        self.truncated = False
        self.compressed = False
        self.names: dict[str, int] = {}  # string → code of the name/category dictionaries
        self.cols: list[Cols] = []
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
        # piece by piece, so that a lenient read keeps what decompressed before any damage
        try:
            for piece in gunzip([raw]):
                out.append(piece)
        except GzipDamage as e:
            self.truncated = True
            if not self.lenient or not out:  # nothing before the damage: nothing to keep
                raise TraceFormatError(self.path, e.message, offset=e.offset) from None
            lost = ": the data it held is lost" if e.truncated else ": what follows is lost"
            self.dropped.append(Dropped(e.message + lost, 0, file_offset=e.offset))
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
            for field, wt, _start, _stop, v0, v1 in fields(data, 0, total):
                if field == 1 and wt == 2:
                    planes.append((v0, v1))
                elif field in strings and wt == 2:
                    strings[field].append(bytes(data[v0:v1]).decode("utf-8", "replace"))
                else:
                    unknown += 1
        except WireError as e:
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
        for i, (p0, p1) in enumerate(planes):
            self.plane(data, i, p0, p1, top)
            if self.progress:
                self.progress(p1)
        if self.progress:
            self.progress(total)
        return self.finish(top, size, digest)

    def _decode_error(self, data: bytes, e: WireError, planes: int) -> str:
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
            for field, wt, _start, _stop, v0, v1 in fields(data, p0, p1):
                if field == 1 and wt == 0:
                    plane_id = v0 - (1 << 64) if v0 >= 1 << 63 else v0
                elif field == 2 and wt == 2:
                    name = bytes(data[v0:v1]).decode("utf-8", "replace")
                    break
                elif field > 2:
                    break
        except WireError:
            pass  # protobuf's own parse reports it
        return plane_id, name

    def skip_plane(self, data: bytes, pos: int, p0: int, p1: int, name: str, plane_id: int) -> None:
        """Record a metadata plane (HLO protos) without decoding its event metadata."""
        from google.protobuf.message import DecodeError

        from xpuprof.formats.proto.xplane_pb2 import XPlane

        keep = []
        n_meta = 0
        try:
            for field, _wt, start, stop, _v0, _v1 in fields(data, p0, p1):
                if field == 4:
                    n_meta += 1
                elif field in (1, 2, 5, 6):  # id, name, stat metadata, stats: not the HLO
                    keep.append(bytes(data[start:stop]))
            light = XPlane.FromString(b"".join(keep))
            names = {k: v.name for k, v in light.stat_metadata.items()}
            stats = stats_dict(light.stats, names, names)
        except (WireError, DecodeError) as e:
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
        plane_stats = stats_dict(plane.stats, stat_names, stat_names)
        m = _DEVICE_PLANE.match(pname) if kind == "device" else None
        if m and len(m.group(2)) > 9:  # no device has such a number: a plane of no device
            m = None
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
        rules = [line_rule(pname, ln.name) if kind == "device" else HOST_RULE.get(kind,
                 "xplane_trace") for ln in lines]  # fmt: skip
        md = self.metadata(plane, stat_names, kind, set(rules))
        scan = Scan()
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
            args = stats_dict(meta.stats, stat_names, stat_names)
            shown = meta.display_name or meta.name
            if meta.display_name and meta.name and meta.name != meta.display_name:
                args["long_name"] = meta.name
            if meta.metadata:
                blob = meta.metadata
                too_big = len(blob) > _MAX_INLINE_BYTES
                args["metadata"] = {"bytes": len(blob)} if too_big else bytes_value(blob)
            md.names[j] = shown
            md.name[j] = self.code(shown)
            args_list[j] = args
            md.json[j] = ENC.encode(args) if args else None
            for key, col in (("bytes_accessed", md.bytes), ("flops", md.flops)):
                v = args.get(key)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    col[j] = v
        md.args_by_id = {mid: a for mid, a in zip(ids.tolist(), args_list, strict=False) if a}
        for rule in rules:
            lut = np.empty(n + 1, dtype=np.int32)
            for j in range(n):
                if kind == "device":
                    c = md_category(rule, md.names[j], args_list[j].get("hlo_category"),
                                     args_list[j])  # fmt: skip
                elif rule == "host_trace" and md.names[j].startswith("$"):
                    c = "python_function"
                else:
                    c = event_override(rule, md.names[j], args_list[j]) or rule
                lut[j] = self.code(c)
            lut[n] = self.code(rule)
            md.luts[rule] = lut
        return md

    def columns(
        self,
        scan: Scan,
        info: dict[str, Any],
        md: _PlaneMeta,
        rules: list[str],
        kind: str,
        device: int | None,
        k: int,
    ) -> Cols:
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
            self.apply_special(scan, md.names, jx, rules, line_of, cat, (corr, has_corr), dev,
                               stream, nbytes)  # fmt: skip
        cols = Cols()
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
        cols.args = strings(args)
        return cols

    def apply_special(
        self,
        scan: Scan,
        names: list[str],
        jx: np.ndarray,
        rules: list[str],
        line_of: np.ndarray,
        cat: np.ndarray,
        corr: tuple[np.ndarray, np.ndarray],
        dev: np.ndarray,
        stream: np.ndarray,
        nbytes: np.ndarray,
    ) -> None:
        """Set, in place, what the watched stats of single events decide: correlation ids,
        the category and size of GPU copies and sets, the category of host events with a
        ``step_num`` or ``hlo_op``, and the device and stream of XLA CPU ops (few events: a loop
        over them)."""
        for p, sv in group_special(scan.special).items():
            c = sv.get("correlation_id")
            if isinstance(c, int) and -(2**63) <= c < 2**63:
                corr[0][p] = c
                corr[1][p] = True
            name = names[jx[p]]
            rule = rules[line_of[p]]
            if rule == "gpu_stream":
                cat[p] = self.code(md_category(rule, name, None, sv))
                det = sv.get("memcpy_details") or sv.get("memset_details")
                size = _SIZE.search(det) if isinstance(det, str) else None
                if size:
                    nbytes[p] = float(size.group(1))
            elif rule == "host_trace":
                c2 = event_override(rule, name, sv)
                if c2 is not None:
                    cat[p] = self.code(c2)
                if c2 == "xla_op_cpu":
                    d = sv.get("device_ordinal")
                    dev[p] = d if isinstance(d, int) and d >= 0 else 0
                    stream[p] = line_of[p]  # the thread's position: its id is a hash

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

    def finish(self, top: dict[str, Any], size: int, digest: str) -> RawTrace:
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
        meta_tbl = metadata_table(self.meta, pids)
        ev_tbl = events_table(self.cols, dictionary, pids, start=meta_tbl.num_rows)
        self.cols = []
        tables = {k: RAW_SCHEMA.empty_table() for k in KINDS}
        tables["events"] = ev_tbl
        tables["metadata"] = meta_tbl
        read_phase, read_category = read_counts(meta_tbl, ev_tbl)
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


def read(
    path: str | Path,
    *,
    lenient: bool = False,
    progress: Callable[[int], None] | None = None,
) -> RawTrace:
    """``formats.xplane.read_xplane``, once the decoder is imported."""
    p = Path(path)
    if not p.is_file():
        raise TraceFormatError(p, "no such file")
    return Decoder(p, lenient, progress).read()

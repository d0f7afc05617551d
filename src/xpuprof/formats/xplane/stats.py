"""Stat decoding: XPlane stats (typed values, references, compressed text) to the JSON-able
values of an event's ``args``, and the one pass over a plane's events that collects them."""

from __future__ import annotations

import base64
import zlib
from array import array
from typing import Any

import msgspec

from xpuprof.formats.xplane.categories import GPU_MEMORY

#: Event stats the reader looks at while it passes (beyond copying them into args).
WATCHED = frozenset(("correlation_id", "device_ordinal", "hlo_op", "step_num",
                     "memcpy_details", "memset_details", *GPU_MEMORY))  # fmt: skip

CONVERTED = frozenset({"ref_value", "bytes_value", "compressed_str_value"})


def bytes_value(v: bytes) -> dict[str, str]:
    return {"base64": base64.b64encode(v).decode("ascii")}


def _stat_value(s: Any, kind: str | None, ref_names: dict[int, str]) -> Any:
    if kind is None:
        return None
    v = getattr(s, kind)
    return convert_stat(kind, v, ref_names) if kind in CONVERTED else v


def convert_stat(kind: str, v: Any, ref_names: dict[int, str]) -> Any:
    """A stat value that is not JSON as it is: a reference, bytes, gzipped text."""
    if kind == "ref_value":
        return ref_names.get(v, v)
    if kind == "bytes_value":
        return bytes_value(v)
    if kind == "compressed_str_value":
        try:
            return zlib.decompress(v, 47).decode("utf-8")
        except (zlib.error, UnicodeDecodeError):
            return {"compressed": True, **bytes_value(v)}
    return v


def stats_dict(stats: Any, names: dict[int, str], ref_names: dict[int, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in stats:
        key = names.get(s.metadata_id, str(s.metadata_id))
        v = _stat_value(s, s.WhichOneof("value"), ref_names)
        put_stat(out, key, v)
    return out


def put_stat(d: dict[str, Any], key: str, v: Any) -> None:
    """Set ``d[key]``; a key seen twice keeps every value, as a list."""
    if key in d:
        old = d[key]
        if isinstance(old, Multi):
            old.append(v)
        else:
            d[key] = Multi((old, v))
    else:
        d[key] = v


class Multi(list):
    """The values of a stat that occurs more than once on one event (a list in JSON)."""


ENC = msgspec.json.Encoder()


class Scan:
    """The one pass over a plane's events: plain values appended to flat buffers.

    Per event: its metadata id, offset and duration (int64 buffers, read by numpy without a
    copy); where the event has stats of its own, or a time that is not whole nanoseconds, its
    merged args as JSON (with its position); and the few stats the columns need
    (``WATCHED``), as ``(position, name, value)``.
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
        watched = {sid: nm for sid, nm in names.items() if nm in WATCHED}
        name_of = names.get
        md_get = md_args.get
        encode = ENC.encode
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
                        if kind in CONVERTED:
                            v = convert_stat(kind, v, names)
                    key = name_of(sid)
                    if key is None:
                        key = str(sid)
                    if key in extra:
                        put_stat(extra, key, v)
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


def group_special(special: list[tuple[int, str, Any]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for p, name, v in special:
        out.setdefault(p, {})[name] = v
    return out

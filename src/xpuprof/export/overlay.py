"""What xpuprof found, written into an exported Chrome trace (``xpuprof export --overlay``).

Perfetto users see the critical path and the advisor's findings next to the events they are
about, as HTA's critical-path overlay shows its path:

* **critical path**: in each process that holds part of the path, a thread named
  ``xpuprof critical path`` with one span per segment (its time on the path, named
  ``category: event``), and flow arrows (category ``xpuprof_critical_path``) from each path
  event to the next one of the same part, drawn between the original events (from the end of
  one to where the next takes over);
* **findings**: in each process that holds an event a finding is about, a thread
  ``xpuprof finding N`` with one span per such event (same time as the event), named after the
  finding, its args holding the recommendation and the event's id and name.

The original entries are untouched: the overlay entries come after them (their ``index`` is
:data:`OVERLAY_INDEX` and up), so the file still round-trips, overlay aside. What to mark comes
from :func:`xpuprof.view.overlays` (the same data the web viewer overlays).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pyarrow as pa

from xpuprof.core.errors import XpuprofError
from xpuprof.export.jsontext import Block, id_text, json_strings

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: The overlays ``--overlay`` accepts.
OVERLAYS = ("critical-path", "findings")
#: Index of the first overlay entry of a part: after any source's own entries.
OVERLAY_INDEX = 1 << 60
#: Category of the overlay's spans and arrows.
CATEGORY = "xpuprof_critical_path"
FINDING_CATEGORY = "xpuprof_finding"

_enc = msgspec.json.Encoder()
_L = pa.large_string()


def parse_overlays(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """``critical-path``, ``findings``, ``critical-path,findings`` or ``all`` → the overlays;
    anything else is an error naming what is accepted."""
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for raw in items:
        item = raw.strip().replace("_", "-")
        if item == "all":
            out += [o for o in OVERLAYS if o not in out]
        elif item in ("critical-path", "findings"):
            if item not in out:
                out.append(item)
        elif item:
            raise XpuprofError(f"--overlay {raw.strip()!r}: not an overlay; overlays: "
                               f"{', '.join(OVERLAYS)} (or all)")  # fmt: skip
    if not out:
        raise XpuprofError(f"--overlay {text!r}: names no overlay; overlays: "
                           f"{', '.join(OVERLAYS)}")  # fmt: skip
    return tuple(out)


class Marks:
    """The overlay entries of every part, computed once per export: rows of
    (part, event id, kind, ts, dur, name, args, thread)."""

    def __init__(self, trace: Trace, which: tuple[str, ...]) -> None:
        from xpuprof.view import overlays

        found = overlays(trace)
        self.rows: list[dict[str, Any]] = []
        #: (segment, next segment) of the path: an arrow between their events
        self.arrows: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.counts: dict[str, int] = {}
        if "critical-path" in which:
            self._path(found.get("critical_path") or [])
        if "findings" in which:
            self._findings(found.get("findings") or [])
        ids = sorted({r["id"] for r in self.rows})
        self.where = _where(trace, ids)

    def _path(self, segments: list[dict[str, Any]]) -> None:
        prev: dict[str, Any] | None = None
        n = 0
        for seg in segments:
            eid = seg.get("id")
            if eid is None or seg.get("dur") is None:
                prev = None
                continue
            n += 1
            seg = {**seg, "id": int(eid), "ts": int(seg["ts"]), "dur": int(seg["dur"])}
            self.rows.append({"id": seg["id"], "ts": seg["ts"], "dur": seg["dur"],
                              "cat": CATEGORY, "thread": "xpuprof critical path",
                              "name": str(seg.get("category") or "path"),
                              "args": {"event": seg["id"],
                                       "category": seg.get("category")}})  # fmt: skip
            if prev is not None and prev["id"] != seg["id"] and prev["id"] >> 40 == eid >> 40:
                self.arrows.append((prev, seg))
            prev = seg
        self.counts["critical_path"] = n

    def _findings(self, findings: list[dict[str, Any]]) -> None:
        n = 0
        for k, f in enumerate(findings, 1):
            for e in f.get("events") or []:
                if e.get("dur") is None:
                    continue
                n += 1
                self.rows.append({"id": int(e["id"]), "ts": int(e["ts"]), "dur": int(e["dur"]),
                                  "cat": FINDING_CATEGORY, "thread": f"xpuprof finding {k}",
                                  "name": f"finding {k}: {f.get('title') or ''}",
                                  "args": {"recommendation": f.get("recommendation"),
                                           "event": int(e["id"]),
                                           "event_name": e.get("name")}})  # fmt: skip
        self.counts["findings"] = n

    def block(self, part: int, pid_names: dict[str, str], tid_names: dict[str, str],
              who: str | None, flow_base: int) -> Block | None:  # fmt: skip
        """The overlay entries of ``part`` (None when it has none): spans, then arrows, with
        pids (and the arrows' tids) written as the part's own entries write them."""
        rows = [r for r in self.rows if r["id"] >> 40 == part and r["id"] in self.where]
        arrows = [(a, b) for a, b in self.arrows if a["id"] >> 40 == part
                  and a["id"] in self.where and b["id"] in self.where]  # fmt: skip
        if not rows and not arrows:
            return None
        ends = [(e["id"], phase) for a, b in arrows for e, phase in ((a, "s"), (b, "f"))]
        spans = {
            "ph": ["X"] * len(rows),
            "cat": [r["cat"] for r in rows],
            "name": [r["name"] + ": " + self.where[r["id"]]["name"] for r in rows],
            "ts": [r["ts"] for r in rows],
            "dur": [r["dur"] for r in rows],
            "args": [_enc.encode(r["args"]).decode() for r in rows],
        }
        flows = {
            "ph": [phase for _, phase in ends],
            "cat": [CATEGORY] * len(ends),
            "name": ["critical path"] * len(ends),
            "ts": [
                t
                for a, b in arrows
                for t in _arrow_times(a, b, self.where[a["id"]], self.where[b["id"]])
            ],
            "id": [str(flow_base + k // 2) for k in range(len(ends))],
            "bp": ['"e"' if phase == "f" else None for _, phase in ends],
        }
        pid = [self.where[r["id"]]["pid"] for r in rows] + [self.where[e]["pid"] for e, _ in ends]
        span_tids = [_enc.encode(r["thread"]).decode() for r in rows]
        flow_tids = id_text(pa.chunked_array([pa.array([self.where[e]["tid"] for e, _ in ends],
                                                       pa.int64())]), tid_names, None)  # fmt: skip
        n = len(rows) + len(ends)

        def column(key: str, typ: pa.DataType = _L) -> pa.Array:
            return pa.array(spans.get(key, [None] * len(rows)) + flows.get(key, [None] * len(ends)),
                            typ)  # fmt: skip

        cols = {
            "ph": json_strings(column("ph", pa.string())),
            "cat": json_strings(column("cat", pa.string())),
            "name": json_strings(column("name", pa.string())),
            "pid": id_text(pa.chunked_array([pa.array(pid, pa.int64())]), pid_names, who),
            "tid": pa.chunked_array(
                [pa.array(span_tids, _L), flow_tids.cast(_L).combine_chunks()]
            ),  # fmt: skip
            "ts": column("ts", pa.int64()),
            "dur": column("dur", pa.int64()),
            "id": column("id"),
            "bp": column("bp"),
            "args": column("args"),
        }
        return Block(OVERLAY_INDEX + np.arange(n, dtype=np.int64), cols)


def _where(trace: Trace, ids: list[int]) -> dict[int, dict[str, Any]]:
    """pid, tid (as its JSON text), ts and name of each event id."""
    if not ids:
        return {}
    t = trace.table("events", columns=["id", "pid", "tid", "ts", "dur", "name"],
                    filters=[("id", "in", ids)])  # fmt: skip
    out = {}
    for row in t.to_pylist():
        tid = row["tid"]
        out[row["id"]] = {"pid": row["pid"], "tid": tid, "ts": row["ts"],
                          "dur": row["dur"] or 0, "name": str(row["name"])}  # fmt: skip
    return out


def _arrow_times(a: dict[str, Any], b: dict[str, Any], event_a: dict[str, Any],
                 event_b: dict[str, Any]) -> tuple[int, int]:  # fmt: skip
    """Where the arrow from path segment ``a`` to the next segment ``b`` starts and ends:
    at the last nanosecond of ``a`` that lies inside its event (a segment may run past its
    event: a kernel is charged the gap after it, as HTA does), and where ``b`` takes over,
    inside ``b``'s event, so that it never points back in time."""
    start = _inside(a["ts"] + max(a["dur"] - 1, 0), event_a)
    return start, _inside(max(b["ts"], start), event_b)


def _inside(t: int, event: dict[str, Any]) -> int:
    return min(max(t, event["ts"]), event["ts"] + max(event["dur"] - 1, 0))

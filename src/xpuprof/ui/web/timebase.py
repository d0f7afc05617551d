"""The viewer's times on the wire: nanoseconds from the trace's first event (the ``t0`` of
``tools.viewer_tracks``), not since the clock's epoch.

Why: a browser's numbers hold integers exactly only up to 2**53 ns (104 days), and Kineto's
timestamps are about 1.7e18 ns; parsed by JavaScript, every one would be off by up to 128 ns.
Times from the first event stay exact for any trace shorter than 104 days. Every viewer answer
says its ``origin`` (the absolute ns of 0) as a number and as text; durations are unchanged.
This is the only change the web layer makes to the view's answers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def _minus(values: Iterable[Any], origin: int) -> list[Any]:
    return [None if v is None else v - origin for v in values]


def _columns(block: dict[str, list[Any]], names: Iterable[str], origin: int) -> None:
    for name in names:
        if name in block:
            block[name] = _minus(block[name], origin)


def _rows(rows: Iterable[dict[str, Any]], origin: int, names: Iterable[str] = ("ts",)) -> None:
    for row in rows:
        for name in names:
            if row.get(name) is not None:
                row[name] -= origin


def _stamp(doc: dict[str, Any], origin: int) -> dict[str, Any]:
    doc["origin"] = origin
    doc["origin_text"] = str(origin)
    return doc


def tracks(doc: dict[str, Any]) -> dict[str, Any]:
    """``viewer_tracks``: its ``origin`` (with simulated tracks: the measured ``t0``), else its
    ``t0``, becomes 0; ``t0`` and ``t1`` are then times from it."""
    t0 = int(doc.get("t0") or 0)
    origin = int(doc["origin"]) if doc.get("origin") is not None else t0
    doc["t0"], doc["t1"] = t0 - origin, int(doc.get("t1") or t0) - origin
    return _stamp(doc, origin)


def window(doc: dict[str, Any], origin: int) -> dict[str, Any]:
    """``viewer_window``: the window, events, summaries, counters and flow ends."""
    doc["ts0"] -= origin
    doc["ts1"] -= origin
    for block in ("events", "summaries", "counters"):
        _columns(doc.get(block) or {}, ("ts",), origin)
    _columns(doc.get("flows") or {}, ("src_ts", "dst_ts"), origin)
    return _stamp(doc, origin)


def event(doc: dict[str, Any], origin: int) -> dict[str, Any]:
    """``viewer_event``: the event, its simulated place, its ancestry and its flows."""
    _rows([doc], origin)
    _rows([doc["simulated"]] if doc.get("simulated") else (), origin)
    _rows(doc.get("ancestry") or (), origin)
    _rows(doc.get("flows") or (), origin)
    return _stamp(doc, origin)


def search(doc: dict[str, Any], origin: int) -> dict[str, Any]:
    """``viewer_search``: each match."""
    _rows(doc.get("matches") or (), origin)
    return _stamp(doc, origin)


def overlays(doc: dict[str, Any], origin: int) -> dict[str, Any]:
    """``viewer_overlays``: critical-path segments and the findings' events."""
    _rows(doc.get("critical_path") or (), origin)
    for finding in doc.get("findings") or ():
        _rows(finding.get("events") or (), origin)
    return _stamp(doc, origin)

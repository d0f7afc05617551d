"""Text for people: notes that say the same of several numbered things merged into one
(:func:`merge_notes`). C++ names shortened (:func:`short_name`) and number lists as ranges
(:func:`ranges_text`) live in :mod:`xpuprof.core.text` (analyses write sentences with them too)
and are re-exported here. Used by the renderers; computes nothing about a trace.
"""

from __future__ import annotations

import re
from typing import Any

from xpuprof.core.text import ranges_text, short_name  # noqa: F401  (re-exported)

_NUMBERED = re.compile(r"(?P<word>[a-z]+) (?P<n>\d+): (?P<rest>.+)", re.S)


def merge_notes(notes: list[str]) -> list[str]:
    """Notes that say the same of several numbered things once: ``part 0: no cuda_sync
    events…``, ``part 1: no cuda_sync events…`` → ``parts 0-1: no cuda_sync events…``."""
    groups: dict[tuple[str, str], list[int]] = {}
    order: list[Any] = []
    for note in notes:
        m = _NUMBERED.fullmatch(note)
        if m is None:
            order.append(note)
            continue
        key = (m["word"], m["rest"])
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(m["n"]))
    out = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        (word, rest), ns = item, groups[item]
        many = len(ns) > 1
        out.append(f"{word}{'s' if many else ''} {ranges_text(ns)}: {rest}")
    return out

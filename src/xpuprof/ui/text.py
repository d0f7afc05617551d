"""Text for people: C++ names shortened to what a person reads (:func:`short_name`), notes that
say the same of several numbered things merged into one (:func:`merge_notes`), number lists as
ranges (:func:`ranges_text`). Used by the renderers; computes nothing about a trace.
"""

from __future__ import annotations

import re
from typing import Any


def _skip_group(s: str, i: int, open_: str, close: str) -> int:
    """Index just past the bracket group opening at ``s[i]`` (nested; -1 when unclosed)."""
    depth = 0
    for j in range(i, len(s)):
        depth += (s[j] == open_) - (s[j] == close)
        if depth == 0:
            return j + 1
    return -1


def short_name(name: str) -> str:
    """A C++ kernel or function name without its template arguments, parameter list and
    return type: ``void cutlass::Kernel<cutlass_80_tensorop…>(Params)`` →
    ``cutlass::Kernel<…>``, ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs…)``
    → ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``. Anything else is left as it is: a ``(``
    after a space (``Memcpy DtoD (Device -> Device)``), a ``<`` not after a name
    (``<built-in method …>``), brackets that do not close, a parameter list not at the end
    (``module.py(12): forward``)."""
    if "<" not in name and not name.endswith(")"):
        return name
    out: list[str] = []
    i, n = 0, len(name)
    while i < n:
        c = name[i]
        after_name = i > 0 and (name[i - 1].isalnum() or name[i - 1] in "_>")
        if c == "<" and i > 0 and (name[i - 1].isalnum() or name[i - 1] == "_"):
            end = _skip_group(name, i, "<", ">")
            if end < 0:
                return name
            out.append("<…>")
            i = end
        elif c == "(" and after_name:
            end = _skip_group(name, i, "(", ")")
            if end < 0:
                return name
            if name[end:].strip() in ("", "const"):
                break  # the parameter list: dropped
            out.append(name[i:end])
            i = end
        else:
            out.append(c)
            i += 1
    short = "".join(out).strip()
    short = short.replace("(anonymous namespace)", "(anon)")
    short = re.sub(r"^(?:(?:static|inline|__global__|void)\s+)+", "", short)
    return short or name


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


def ranges_text(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``0-2, 5``."""
    xs, runs = sorted(set(numbers)), []
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return ", ".join(f"{a}-{b}" if b > a + 1 else f"{a}, {b}" if b > a else str(a)
                     for a, b in runs)  # fmt: skip

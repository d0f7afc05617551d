"""Text for people, for every layer that writes a sentence: durations and sizes with their
units (:func:`human_time`, :func:`human_bytes`), C++ names shortened to what a person reads
(:func:`short_name`), number lists as ranges (:func:`ranges_text`). Here, under everything,
so that an analysis can state its answer in the words the terminal uses; pure functions of
their arguments.
"""

from __future__ import annotations

import re

#: Time units, smallest first: (nanoseconds in one, name).
TIME_UNITS = ((1.0, "ns"), (1e3, "µs"), (1e6, "ms"), (1e9, "s"))
#: Size units, smallest first: (bytes in one, name); binary, named so.
BYTE_UNITS = ((1.0, "B"), (1024.0, "KiB"), (1024.0**2, "MiB"), (1024.0**3, "GiB"),
              (1024.0**4, "TiB"))  # fmt: skip


def number(v: float) -> str:
    """Four significant digits, thousands separated, never an exponent."""
    if v == 0:
        return "0"
    if abs(v) < 0.001:
        return "<0.001" if v > 0 else ">-0.001"
    return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"


def plural(n: int, word: str) -> str:
    """``1 call``, ``2 calls``, ``1,024 streams``: the count with the word, plural when not
    one (English ``-s`` plurals only: the words headlines count)."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def human_bytes(n: float) -> str:
    """``1536`` → ``1.5 KiB``."""
    scale, unit = next((s, u) for s, u in reversed(BYTE_UNITS) if abs(n) >= s or u == "B")
    return f"{n:.0f} B" if unit == "B" else f"{n / scale:.1f} {unit}"


def human_time(ns: float) -> str:
    """``222_442_191`` → ``222.4 ms``: four significant digits in ns, µs, ms or s."""
    scale, unit = next(((s, u) for s, u in reversed(TIME_UNITS) if abs(ns) >= s),
                       TIME_UNITS[0])  # fmt: skip
    return f"{number(ns / scale)} {unit}"


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

"""The walker: the Kineto event list one entry at a time, for the stretches the fast path
cannot take (a chunk split inside a string, damage, entries that are not events, values too
deep to decode).

Each entry's extent comes from ``values.value_end`` (msgspec, in C, linear in the entry), so a
``},{`` inside a string costs nothing. Consecutive good entries are decoded together in one
run; a run that fails is split where msgspec says (``$[k]``) or in halves until the bad
entries stand alone, and each is named: strict reads raise, lenient ones drop exactly that
entry (its index and offset recorded) and go on, so ``index`` stays the position in the list.
After damage that leaves the entry's end unclear, the walk resumes at the damaged entry's own
closing comma when its brackets and quotes still balance, else at the next ``},{``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from xpuprof.formats.kineto import scan
from xpuprof.formats.kineto.errors import DECODE_ERRORS
from xpuprof.formats.kineto.values import (
    Damage,
    Incomplete,
    TooDeep,
    decode_any,
    err_text,
    members,
    skip_ws,
    utf8_error,
    value_end,
)

if TYPE_CHECKING:
    from xpuprof.formats.kineto.decode import Decoder
    from xpuprof.formats.kineto.stream import Text

#: Where to resume after damage inside an entry, when its own end cannot be found.
_RESYNC = re.compile(rb"\}\s*,\s*\{")
#: Where to resume after text between entries that is not JSON: the next entry or the end.
_AFTER_JUNK = re.compile(rb",\s*\{|\]")
#: A pending run of good entries is decoded once it holds this much text.
RUN_BYTES = 4 << 20
#: The most text searched for a damaged entry's own closing comma.
_MAX_ENTRY_SCAN = 1 << 20
#: Event fields decoded as JSON values (the rest are kept as text or go to ``extra``).
_VALUE_FIELDS = frozenset({"ph", "cat", "name", "pid", "tid", "id", "bp", "s", "args"})


def walk(dec: Decoder, text: Text, *, stop: int | None) -> bool:
    """Walk entries from ``text``'s base until the first entry boundary at or after ``stop``
    bytes (None: the end of the list). True when the list's ``]`` was reached (``text`` then
    stands just after it); False when ``stop`` was reached (``text`` at the next entry) or the
    file ended inside the list."""
    return _Walk(dec, text, stop).run()


def _kind(c: int) -> str:
    if c == ord("["):
        return "an array"
    if c == ord('"'):
        return "a string"
    if c == ord("n"):
        return "null"
    if c in (ord("t"), ord("f")):
        return "a boolean"
    return "a number"


class _Walk:
    """One walk; positions are relative to ``text.base``, which only moves on return."""

    def __init__(self, dec: Decoder, text: Text, stop: int | None) -> None:
        self.dec = dec
        self.text = text
        self.stop = stop
        self.spans: list[tuple[int, int]] = []  # the pending run of good entries

    def at(self, rel: int) -> int:
        """Offset in the whole text of a position."""
        return self.text.offset + rel

    def run(self) -> bool:
        t = self.text
        pos, expect_value = 0, True
        while True:
            p = skip_ws(t.buf, t.base + pos, len(t.buf)) - t.base
            if p >= t.avail:
                if t.more():
                    continue
                return self.cut_off(p)
            c = t.buf[t.base + p]
            if expect_value:
                if c == ord("]"):
                    if self.dec.after_comma:
                        self.flush()
                        self.dec.damage(
                            "malformed JSON (a ',' with no entry after it)",
                            offset=self.at(p), events=0,
                        )  # fmt: skip
                    return self.end_list(p)
                got = self.entry(p)
                if got is None:
                    return False
                pos, expect_value = got
            elif c == ord(","):
                pos, expect_value = p + 1, True
                self.dec.after_comma = True
                if self.stop is not None and p >= self.stop:
                    self.flush()
                    t.advance(pos)
                    return False
                if self.spans and self.spans[-1][1] - self.spans[0][0] > RUN_BYTES:
                    self.flush()
            elif c == ord("]"):
                return self.end_list(p)
            else:
                self.flush()
                self.dec.damage(
                    "malformed JSON (unexpected text between events)", offset=self.at(p), events=0
                )
                got = self.after_junk(p)
                if got is None:
                    return False
                pos, expect_value = got

    # -- one entry -------------------------------------------------------------------------------

    def entry(self, p: int) -> tuple[int, bool] | None:
        """Read the entry at ``p``: (where to go on, whether an entry is expected there), or
        None when the file ends inside it."""
        t = self.text
        b = t.base
        try:
            e = value_end(t.buf, b + p, len(t.buf), eof=t.eof) - b
        except Incomplete:
            t.more()
            return p, True
        except TooDeep as d:
            self.bad(d.message, d.offset - b)
            if d.end is None:
                self.dec.truncated = True
                return None
            return d.end - b, False
        except Damage as d:
            if d.truncated:
                self.flush()
                self.dec.truncated = True
                if self.dec.lenient:
                    self.bad("truncated JSON (the last, partial event)", p)
                else:
                    self.dec.fail(
                        "truncated JSON: the file ends inside the event list",
                        offset=self.at(t.avail),
                    )
                return None
            self.bad(d.message, d.offset - b)
            return self.resync(p, d.offset - b)
        self.spans.append((p, e))
        return e, False

    def bad(self, message: str, rel: int, *, index_only: bool = False) -> None:
        """One entry that cannot be kept: strict reads stop here; lenient ones drop it."""
        self.flush()
        idx = self.dec.index
        self.dec.index += 1
        if not self.dec.lenient:
            if index_only:
                self.dec.fail(message, index=idx)
            self.dec.fail(message, offset=self.at(rel))
        self.dec.damage(message, offset=self.at(rel), index=idx, events=1)

    # -- runs of good entries ----------------------------------------------------------------

    def flush(self) -> None:
        """Decode the pending run; when that fails, find the bad entries and name them.

        The run is taken in windows that double while they decode and shrink around a failure
        (to the entry msgspec names, else by half), so a run costs time linear in its text
        whether it holds one bad entry or nothing else (a window never re-reads the whole rest
        of the run after each bad entry).
        """
        spans, self.spans = self.spans, []
        i, z, width = 0, len(spans), len(spans)
        while i < z:
            j = min(z, i + width)
            if self.dec.fast(self.run_text(spans, i, j)):
                i, width = j, 2 * width
                continue
            if j - i == 1:
                self.single(*spans[i])
                i, width = i + 1, 1
                continue
            k = self.dec.first_bad(self.run_text(spans, i, j))
            if k == 0:
                self.single(*spans[i])
                i, width = i + 1, 1
            else:
                width = k if k is not None else (j - i) // 2

    def run_text(self, spans: list[tuple[int, int]], a: int, z: int) -> bytes:
        b = self.text.base
        return b"".join(
            (b"[", memoryview(self.text.buf)[b + spans[a][0] : b + spans[z - 1][1]], b"]")
        )

    def single(self, start: int, end: int) -> None:
        """One entry that does not decode: say exactly what is wrong."""
        b = self.text.base
        try:
            n = self.dec.decode_events(self.run_text([(start, end)], 0, 1))
        except DECODE_ERRORS as e:
            message, at, index_only = diagnose(self.text.buf, b + start, b + end, e)
            self.bad(message, at - b, index_only=index_only)
            return
        self.dec.index += n

    # -- the list's end, the file's end, resuming after damage ---------------------------------

    def end_list(self, p: int) -> bool:
        self.flush()
        self.text.advance(p + 1)
        return True

    def cut_off(self, p: int) -> bool:
        """The file ends between entries, before the list's ``]``."""
        self.flush()
        self.dec.truncated = True
        self.dec.damage(
            "truncated JSON: the file ends inside the event list", offset=self.at(p), events=0
        )
        return False

    def after_junk(self, p: int) -> tuple[int, bool] | None:
        """Resume after text that is not JSON between two entries: at the next entry, or at
        the list's ``]``."""
        m = self.search(_AFTER_JUNK, p)
        if m is None:
            self.dec.truncated = True
            return None
        if m.group() == b"]":
            return m.start() - self.text.base, False
        return m.end() - 1 - self.text.base, True

    def resync(self, p: int, damage: int) -> tuple[int, bool] | None:
        """Where to go on after damage inside the entry at ``p``: after its own closing comma
        when its brackets and quotes balance, else at the next ``},{``."""
        t = self.text
        b = t.base
        width = max(2 * (damage - p), 1 << 16)
        while True:
            hi = min(t.avail, p + width)
            view = memoryview(t.buf)[b + p : b + hi]
            comma = scan.first_top_comma(view)
            if comma is not None:
                return skip_ws(t.buf, b + p + comma + 1, len(t.buf)) - b, True
            end = scan.value_end(view)
            if end is not None:
                after = skip_ws(t.buf, b + p + end, b + hi) - b
                if after < hi and t.buf[b + after] == ord("]"):
                    return after, False
            if width >= _MAX_ENTRY_SCAN or (hi == t.avail and not t.more()):
                break
            width *= 2
            b = t.base
        m = self.search(_RESYNC, damage)
        if m is None:
            self.dec.truncated = True
            return None
        return m.end() - 1 - self.text.base, True

    def search(self, pattern: re.Pattern[bytes], rel: int) -> re.Match[bytes] | None:
        """The first match at or after ``rel``, reading more of the file while there is none."""
        t = self.text
        while True:
            m = pattern.search(t.buf, t.base + rel)
            if m is not None or not t.more():
                return m


def diagnose(buf: bytes, start: int, end: int, error: BaseException) -> tuple[str, int, bool]:
    """What is wrong with the one entry ``buf[start:end]`` (valid JSON that does not decode as
    an event): the message, the offset it points at, and whether the entry's index says it
    better than an offset (an entry that is not an event at all)."""
    c = buf[start]
    if c != ord("{"):
        return f"traceEvents entry is not an event (it is {_kind(c)})", start, True
    bad = utf8_error(buf, start, end)
    if bad is not None:
        return "malformed JSON (invalid UTF-8 in a string)", bad, False
    try:
        fields, _, _ = members(buf, start + 1, end, eof=True, events_key=False)
    except (Damage, TooDeep) as d:
        return d.message, d.offset, False
    except Incomplete:
        return "malformed JSON (the entry does not close)", start, False
    for key, vs, ve in fields:
        if key not in _VALUE_FIELDS:
            continue
        if key == "args" and buf[vs] not in b"{n":
            return f"args is not a JSON object (it is {_kind(buf[vs])})", vs, False
        try:
            decode_any(buf, vs, ve)
        except Damage as d:
            return f"{key}: {d.message}", d.offset, False
    return f"traceEvents entry is not an event ({err_text(error)})", start, True


__all__ = ["RUN_BYTES", "diagnose", "walk"]

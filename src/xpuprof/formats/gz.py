"""gzip for every reader: the text of a gzip file piece by piece, with damage placed at the
byte of the file where zlib detects it and everything before that byte kept.

zlib loses the output of a call that fails, so feeding it a megabyte at a time loses up to a
megabyte before the damage and can only say "somewhere in this megabyte". Here the compressed
bytes go in 64 KB at a time; a feed that fails is retried in halves from a copy of zlib's state
before it, down to the one byte whose feeding fails. Concatenated members are read one after
another, and zero padding after a member is skipped, as the ``gzip`` module does.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

#: Compressed bytes given to zlib at a time; on damage, the spot is found by halving this.
FEED_BYTES = 64 << 10

MAGIC = b"\x1f\x8b"


class GzipDamage(Exception):
    """The gzip stream is damaged or cut at ``offset`` (a byte of the file); ``truncated``
    when the file ends inside compressed data."""

    def __init__(self, message: str, offset: int, *, truncated: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset
        self.truncated = truncated


class _Members:
    """zlib over a file's members one after another; copyable, so a feed that fails can be
    retried in halves from the state before it."""

    def __init__(self) -> None:
        self.dec = zlib.decompressobj(wbits=31)
        self.started = False  # bytes of the current member fed, its end not reached
        self.done = 0  # members complete

    def copy(self) -> _Members:
        c = _Members.__new__(_Members)
        c.dec, c.started, c.done = self.dec.copy(), self.started, self.done
        return c

    def feed(self, data: bytes | memoryview) -> bytes:
        """The text these compressed bytes complete; raises ``zlib.error`` on damage."""
        outs = []
        data = bytes(data)
        while data:
            if not self.started and self.done:
                data = data.lstrip(b"\0")
                if not data:
                    break
            outs.append(self.dec.decompress(data))
            self.started = True
            if not self.dec.eof:
                break
            data = self.dec.unused_data
            self.dec = zlib.decompressobj(wbits=31)
            self.started = False
            self.done += 1
        return b"".join(outs)


def _feed_exact(state: _Members, piece: memoryview) -> tuple[_Members, bytes, int | None]:
    """Feed ``piece``; on damage, find by halving the first byte whose feeding fails and keep
    all the text before it. Returns the new state, the text and that byte's offset in
    ``piece`` (None: no damage)."""
    before = state.copy()
    try:
        return state, state.feed(piece), None
    except zlib.error:
        pass
    good, outs, lo, hi = before, [], 0, len(piece)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = good.copy()
        try:
            outs.append(trial.feed(piece[lo:mid]))
            good, lo = trial, mid
        except zlib.error:
            hi = mid
    return good, b"".join(outs), lo


def _zlib_message(state: _Members, byte: memoryview) -> str:
    """zlib's own words for the damage at ``byte`` (fed to a copy of the state before it)."""
    try:
        state.copy().feed(byte)
    except zlib.error as e:
        said = str(e).removeprefix("Error -3 while decompressing data: ")
        if said in ("incorrect data check", "incorrect length check"):
            return (
                f"{said}: the text does not match its checksum, so it is damaged somewhere before"
            )
        return said
    return "invalid data"


def gunzip(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The text of the gzip file whose bytes come in ``blocks``, piece by piece; raises
    :class:`GzipDamage` after yielding all the text before the damage."""
    state = _Members()
    pos = 0  # offset in the file of the block being fed
    for block in blocks:
        view = memoryview(block)
        for i in range(0, len(block), FEED_BYTES):
            state, out, bad = _feed_exact(state, view[i : i + FEED_BYTES])
            if out:
                yield out
            if bad is not None:
                err = _zlib_message(state, view[i + bad : i + bad + 1])
                raise GzipDamage(f"corrupt gzip data ({err})", pos + i + bad)
        pos += len(block)
    if state.started:
        if out := state.dec.flush():
            yield out
        raise GzipDamage(
            "truncated gzip stream (the file ends inside compressed data)", pos, truncated=True
        )

"""Bytes in, for the Kineto reader: the decompressed text of a file block by block (on a
thread of its own, so gunzip overlaps decoding; gzip damage located to the byte by
``formats.gz``), and the buffer of text not yet decoded."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from xpuprof.core.errors import TraceFormatError
from xpuprof.formats.gz import MAGIC, GzipDamage, gunzip

#: Bytes read from the file at a time.
BLOCK_BYTES = 1 << 20


def file_blocks(
    path: Path, hasher: Any, on_damage: Callable[[str, int], None] | None = None
) -> Iterator[bytes]:
    """Yield the decompressed text of ``path`` block by block (gzip detected by magic bytes).

    Damaged gzip raises :class:`TraceFormatError` at the byte of the file where zlib detects
    the damage (it lies at or before that byte), or with ``on_damage`` (lenient imports) is
    reported there and ends the text early: everything that decompressed before that byte is
    still read.
    """

    def damaged(message: str, offset: int) -> None:
        if on_damage is None:
            raise TraceFormatError(path, message, offset=offset)
        on_damage(message, offset)

    with open(path, "rb") as f:
        magic = f.read(2)
        f.seek(0)

        def blocks() -> Iterator[bytes]:
            while block := f.read(BLOCK_BYTES):
                hasher.update(block)
                yield block

        if magic != MAGIC:
            yield from blocks()
            return
        try:
            yield from gunzip(blocks())
        except GzipDamage as e:
            damaged(e.message, e.offset)


def threaded(gen: Iterator[bytes], depth: int = 4) -> Iterator[bytes]:
    """Run a block generator in a thread: zlib and file reads release the GIL, so gunzip
    overlaps with decoding on another core."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def run() -> None:
        try:
            for item in gen:
                while not stop.is_set():
                    try:
                        q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as e:  # handed to the consumer, which re-raises it
            q.put(e)

    t = threading.Thread(target=run, name="xpuprof-read", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


class Text:
    """The decompressed text read so far; ``buf[base:]`` is what is not consumed yet, and
    ``offset`` the position of ``buf[base]`` in the whole text. Positions the decoder works
    with are relative to ``base``."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks = blocks
        self.buf = b""
        self.base = 0
        self.offset = 0
        self.eof = False

    @property
    def avail(self) -> int:
        """Bytes read and not consumed."""
        return len(self.buf) - self.base

    def fill(self, target: int) -> None:
        """Make ``avail`` at least ``target`` (or hold the rest of the file), copying the kept
        part once rather than once per block."""
        parts: list[Any] = [memoryview(self.buf)[self.base :]]
        have = self.avail
        while have < target and not self.eof:
            try:
                block = next(self.blocks)
            except StopIteration:
                self.eof = True
                break
            parts.append(block)
            have += len(block)
        if len(parts) > 1:
            self.buf = b"".join(parts)
            self.base = 0

    def more(self) -> bool:
        """Read more (at least double what is held, so that retries stay linear); False at
        the end of the file."""
        before = self.avail
        self.fill(max(2 * before, before + BLOCK_BYTES))
        return self.avail > before

    def advance(self, n: int) -> None:
        """Consume ``n`` bytes."""
        self.base += n
        self.offset += n

    def rest(self) -> bytes:
        """What is not consumed, as bytes whose offset 0 is ``base``."""
        return self.buf[self.base :] if self.base else self.buf

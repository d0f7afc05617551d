"""A minimal protobuf wire-format walker, for the top of an XPlane file (the XSpace's fields,
a plane's header): it finds each plane's bytes without decoding them, so planes are decoded
one at a time and a damaged one can be reported (and, lenient, left out) on its own."""

from __future__ import annotations

from collections.abc import Iterator


class WireError(Exception):
    def __init__(self, message: str, offset: int, truncated: bool = False) -> None:
        super().__init__(message)
        self.offset = offset
        self.truncated = truncated


def varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise WireError("the data ends inside a varint", start, truncated=True)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError("malformed varint (longer than 10 bytes)", start)


def fields(buf: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int, int, int]]:
    """Yield ``(field, wire_type, start, stop, value_start, value_end)`` of each field in
    ``buf[pos:end]`` (``start:stop`` is the whole field, key included); a varint yields its
    value as ``value_start`` and ``value_end = -1``."""
    while pos < end:
        start = pos
        key, pos = varint(buf, pos, end)
        field, wt = key >> 3, key & 7
        if field == 0:
            raise WireError("field number 0 (not protobuf data)", start)
        if wt == 0:
            value, pos = varint(buf, pos, end)
            yield field, wt, start, pos, value, -1
        elif wt == 2:
            n, pos = varint(buf, pos, end)
            if pos + n > end:
                raise WireError(
                    f"field {field} needs {n} bytes but only {end - pos} are left",
                    start,
                    truncated=True,
                )
            yield field, wt, start, pos + n, pos, pos + n
            pos += n
        elif wt == 1 or wt == 5:
            n = 8 if wt == 1 else 4
            if pos + n > end:
                raise WireError("the data ends inside a fixed-size field", start, True)
            yield field, wt, start, pos + n, pos, pos + n
            pos += n
        else:
            raise WireError(f"wire type {wt} of field {field} is not valid here", start)

"""Errors that users see: each names the file and the place, so one line is enough to act on."""

from __future__ import annotations

from pathlib import Path


class XpuprofError(Exception):
    """Base of every error the CLI turns into one clear line and exit code 2."""


class TraceFormatError(XpuprofError):
    """A source file is not a trace we can read, or is damaged at a known place."""

    def __init__(
        self,
        path: str | Path,
        message: str,
        *,
        offset: int | None = None,
        event_index: int | None = None,
        compressed: bool = False,
    ) -> None:
        self.path = str(path)
        self.message = message
        self.offset = offset
        self.event_index = event_index
        where = []
        if event_index is not None:
            where.append(f"event {event_index} of traceEvents")
        if offset is not None:
            where.append(f"byte {offset}" + (" of the decompressed JSON" if compressed else ""))
        suffix = f" (at {', '.join(where)})" if where else ""
        self.compressed = compressed
        super().__init__(f"{self.path}: {message}{suffix}")

    def __reduce__(self):  # keep the fields when the error crosses a process (Dask workers)
        return (
            _rebuild_format_error,
            (self.path, self.message, self.offset, self.event_index, self.compressed),
        )


def _rebuild_format_error(path, message, offset, event_index, compressed) -> TraceFormatError:
    return TraceFormatError(
        path, message, offset=offset, event_index=event_index, compressed=compressed
    )


class StoreError(XpuprofError):
    """A store directory is missing, incomplete or of an unknown version."""

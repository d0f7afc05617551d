"""What the viewer's questions raise: a bad parameter (the web answers 400) or an id or track
that is not in the store (404). Both are ``XpuprofError``, so the CLI prints one line."""

from __future__ import annotations

from xpuprof.core.errors import XpuprofError


class ViewError(XpuprofError):
    """A parameter of a viewer question is not valid (a window that ends before it starts, a
    width out of range, a limit that is not a number...)."""


class NotFound(ViewError):
    """An event id or a track number that the store does not hold."""

"""The reader registry: every input format declares one :class:`Reader`, and everything that
needs to know formats (the import command, directory scanning, the Dask workers, the
normaliser's category vocabulary) asks the registry instead of knowing them.

Built-in readers (``kineto``, ``xplane``) come first, then plug-ins from the entry-point group
``xpuprof.readers`` (each entry point loads to a ``Reader``; read once per process, when first
needed), then readers passed to :func:`register`. How to write one: ``docs/formats.md``.

This module and the built-in readers' declarations import nothing heavy (no pyarrow, msgspec or
protobuf): a reader's ``read`` imports its decoder on first use, so listing formats and
choosing a reader for a file stay instant.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuprof.core.errors import TraceFormatError, XpuprofError
from xpuprof.core.names import CAPTURE_CATEGORY_LEVELS, LEVELS

if TYPE_CHECKING:
    from xpuprof.core.raw import RawTrace

#: The entry-point group plug-in readers are found under.
ENTRY_POINT_GROUP = "xpuprof.readers"

#: Modules holding the built-in readers' declarations (a ``READER`` each), in registry order.
BUILTIN_MODULES = ("xpuprof.formats.kineto", "xpuprof.formats.xplane")


@dataclass(frozen=True, eq=False)
class Reader:
    """What a format declares so that xpuprof can find, read and normalise its files (compared
    and hashed by identity: one object per format).

    * ``name``: short and unique (``kineto``); recorded as each source's ``format``.
    * ``description``: one line for ``--help``, naming the suffixes.
    * ``suffixes``: file-name endings that decide the format (``.json.gz``); compared as
      written, the longest match wins.
    * ``read(path, *, lenient=False, progress=None) -> RawTrace``: ``progress`` is called
      with the bytes consumed so far; damage raises :class:`TraceFormatError` unless
      ``lenient``, when what parses is kept and the rest listed in ``RawTrace.dropped``.
    * ``sniff(path) -> bool``: whether the file's first bytes look like this format, for
      files whose name decides nothing; it must be quick and never raise for other content.
    * ``category_levels``: the format's categories → across-stack level (one of
      ``xpuprof.core.names.LEVELS``), keys lower-case (categories are compared lower-case).
    * ``device_categories``: categories recorded on a device timeline (lower-case).
    * ``expand(directory) -> list[Path] | None``: for directory layouts the format owns (an
      XProf log directory): the files to import when a user names such a directory, else
      None. It may raise :class:`XpuprofError` for a layout with nothing to import.
    * ``supersedes``: suffixes of files that a file of this format makes redundant when both
      lie in one folder under one stem (XProf's ``h.trace.json.gz`` renders ``h.xplane.pb``);
      a directory scan leaves those out.
    * ``preload``: modules to import in the parent before forking local Dask workers, so
      they start with the decoder loaded.
    * ``ranks_by_host``: the format writes one file per host of a job and no rank in it
      (XProf's ``<host>.xplane.pb``): several such files in one folder, none naming a rank,
      get ranks in host-name order (``trace/ranks.py``).
    """

    name: str
    description: str
    suffixes: tuple[str, ...]
    read: Callable[..., RawTrace]
    sniff: Callable[[Path], bool]
    category_levels: Mapping[str, str] = field(default_factory=dict)
    device_categories: frozenset[str] = frozenset()
    expand: Callable[[Path], list[Path] | None] | None = None
    supersedes: tuple[str, ...] = ()
    preload: tuple[str, ...] = ()
    ranks_by_host: bool = False

    def suffix_of(self, name: str) -> str | None:
        """The longest of this reader's suffixes that ``name`` ends with, or None."""
        hits = [s for s in self.suffixes if name.endswith(s)]
        return max(hits, key=len) if hits else None


@dataclass(frozen=True)
class Vocabulary:
    """What the normaliser needs of a source's format: category → level and the device
    categories, keys lower-case."""

    levels: Mapping[str, str]
    device: frozenset[str]


class _Registry:
    """Built-ins, plug-ins (loaded once, on first need) and registered readers, in order."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.builtins: list[Reader] | None = None
        self.plugins: list[Reader] | None = None
        self.registered: list[Reader] = []

    def builtin(self) -> list[Reader]:
        with self.lock:
            if self.builtins is None:
                import importlib

                self.builtins = [importlib.import_module(m).READER for m in BUILTIN_MODULES]
            return self.builtins

    def all(self) -> list[Reader]:
        with self.lock:
            if self.plugins is None:
                self.plugins = _load_plugins({r.name for r in self.builtin()})
            return [*self.builtin(), *self.plugins, *self.registered]


_REGISTRY = _Registry()


def _load_plugins(taken: set[str]) -> list[Reader]:
    """Readers of the ``xpuprof.readers`` entry points; a broken one is skipped with a warning
    (a third-party package must not stop xpuprof from reading the formats it knows)."""
    from importlib.metadata import entry_points

    out: list[Reader] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            reader = ep.load()
        except Exception as e:  # noqa: BLE001 - any import error of someone else's package
            warnings.warn(
                f"xpuprof: reader plug-in {ep.name!r} ({ep.value}) failed to load: {e!r}",
                stacklevel=3,
            )
            continue
        problem = _invalid(reader, taken)
        if problem:
            warnings.warn(
                f"xpuprof: reader plug-in {ep.name!r} ({ep.value}) is skipped: {problem}",
                stacklevel=3,
            )
            continue
        taken.add(reader.name)
        out.append(reader)
    return out


def _invalid(reader: Any, taken: set[str]) -> str | None:
    if not isinstance(reader, Reader):
        return f"it is a {type(reader).__name__}, not an xpuprof.formats.Reader"
    if not reader.name:
        return "its name is empty"
    if reader.name in taken:
        return f"a reader named {reader.name!r} is already registered"
    unknown = sorted({lv for lv in reader.category_levels.values() if lv not in LEVELS})
    if unknown:
        return f"its category_levels name unknown levels {unknown} (levels: {', '.join(LEVELS)})"
    return None


def readers() -> list[Reader]:
    """Every reader: built-ins first, then plug-ins, then those passed to :func:`register`."""
    return _REGISTRY.all()


def register(reader: Reader) -> Reader:
    """Add a reader for this process (plug-ins installed as packages need no call: their entry
    point is read on first need). An import on Dask sends it to its workers with each task,
    local or remote, so it must pickle (cloudpickle: functions of a script or a lambda do)."""
    with _REGISTRY.lock:
        problem = _invalid(reader, {r.name for r in readers()})
        if problem:
            raise XpuprofError(f"cannot register reader: {problem}")
        _REGISTRY.registered.append(reader)
    return reader


def registered() -> tuple[Reader, ...]:
    """The readers added with :func:`register` in this process: an import hands them to its
    Dask workers with each task (a worker forked from the fork server, or one of a remote
    cluster, never saw the call)."""
    with _REGISTRY.lock:
        return tuple(_REGISTRY.registered)


def ensure(extra: tuple[Reader, ...]) -> None:
    """Register each of ``extra`` this process does not know yet by name (a worker's side of
    :func:`registered`)."""
    with _REGISTRY.lock:
        known = {r.name for r in readers()}
        _REGISTRY.registered.extend(r for r in extra if r.name not in known)


def unregister(name: str) -> None:
    """Remove a reader added with :func:`register` (tests, interactive sessions)."""
    with _REGISTRY.lock:
        _REGISTRY.registered = [r for r in _REGISTRY.registered if r.name != name]


def get_reader(name: str) -> Reader:
    """The reader called ``name`` (a source's ``format``); plug-ins are loaded only when no
    built-in has that name."""
    for r in _REGISTRY.builtin():
        if r.name == name:
            return r
    for r in readers():
        if r.name == name:
            return r
    known = ", ".join(r.name for r in readers())
    raise XpuprofError(f"no reader named {name!r} (known: {known})")


def find_reader(name: str) -> Reader | None:
    """Like :func:`get_reader`, but None for a name no reader has."""
    try:
        return get_reader(name)
    except XpuprofError:
        return None


def suffixes() -> tuple[str, ...]:
    """Every suffix some reader claims, in registry order."""
    return tuple(s for r in readers() for s in r.suffixes)


def _sniffs(reader: Reader, path: Path) -> bool:
    try:
        return bool(reader.sniff(path))
    except Exception:  # noqa: BLE001 - a sniff that fails is a "no", whatever the reader
        return False


def reader_for(path: str | Path) -> Reader:
    """The reader of one file: by the longest suffix that matches (sniffing only between
    readers claiming the same suffix), else the first reader whose ``sniff`` accepts the file.

    Raises :class:`TraceFormatError` naming the file when no reader fits.
    """
    p = Path(path)
    all_readers = readers()
    best: list[Reader] = []
    longest = 0
    for r in all_readers:
        s = r.suffix_of(p.name)
        if s is None or len(s) < longest:
            continue
        if len(s) > longest:
            best, longest = [], len(s)
        best.append(r)
    if len(best) == 1:
        return best[0]
    if best:
        return next((r for r in best if _sniffs(r, p)), best[0])
    if not p.is_file():
        raise TraceFormatError(p, "no such file")
    for r in all_readers:
        if _sniffs(r, p):
            return r
    names = ", ".join(r.name for r in all_readers)
    raise TraceFormatError(
        p,
        f"not a trace format xpuprof reads: the name ends in none of {', '.join(suffixes())} "
        f"and its first bytes match no reader ({names})",
    )


def vocabulary(format: str | None) -> Vocabulary:
    """The category vocabulary for normalising a source of ``format`` (a reader's name).

    The source's own reader decides; xpuprof's own capture categories (``core.names``) hold for
    every source, and the built-in readers' vocabularies fill in categories the reader does not
    name: a Chrome-trace JSON that xpuprof wrote from an XPlane store carries XPlane's
    categories, and a live capture (format ``xpuprof-capture``) mixes its framework's with its
    own. Built-in vocabularies never disagree on a category.
    """
    levels: dict[str, str] = {}
    device: set[str] = set()
    for r in _REGISTRY.builtin():
        levels.update(r.category_levels)
        device |= r.device_categories
    own = find_reader(format) if format else None
    if own is not None:
        levels.update(own.category_levels)
        device |= own.device_categories
        # a category the reader names as host-side stays host-side, whatever another says
        device -= {c for c in own.category_levels if c not in own.device_categories}
    levels.update(CAPTURE_CATEGORY_LEVELS)
    device -= set(CAPTURE_CATEGORY_LEVELS)
    return Vocabulary(
        {k.lower(): v for k, v in levels.items()}, frozenset(c.lower() for c in device)
    )


__all__ = [
    "ENTRY_POINT_GROUP",
    "Reader",
    "Vocabulary",
    "ensure",
    "find_reader",
    "get_reader",
    "reader_for",
    "readers",
    "register",
    "registered",
    "suffixes",
    "unregister",
    "vocabulary",
]

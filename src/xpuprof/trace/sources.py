"""Which files an import reads: files named directly, and the trace files under named
directories (each reader's own layouts, suffixes, and the files another one supersedes).
Split from :mod:`xpuprof.trace.ingest`, which imports what this finds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xpuprof.core.errors import XpuprofError
from xpuprof.trace import store as st


def expand_sources(paths: list[str | Path]) -> list[Path]:
    """Files named directly, plus the trace files under named directories.

    A directory in a layout some reader owns (``Reader.expand``: an XProf/TensorBoard log
    directory gives its newest run's XPlane files) is expanded by that reader; any other is
    scanned for files with a reader's suffix (hidden folders and stores left out), less those
    another file makes redundant (``Reader.supersedes``: ``<host>.trace.json.gz`` beside
    ``<host>.xplane.pb``, which jax.profiler writes, is XProf's rendering of the same events).
    """
    from xpuprof.formats import readers

    all_readers = readers()
    out: list[Path] = []
    for p in map(Path, paths):
        try:
            if p.is_dir():
                if st.is_store(p):
                    raise XpuprofError(f"{p}: is an xpuprof store, not a trace to import")
                out.extend(_scan(p, all_readers))
            elif p.is_file():
                out.append(p)
            else:
                raise XpuprofError(f"{p}: no such file or directory")
        except OSError as e:  # a folder we may not list
            raise XpuprofError(f"{e.filename or p}: cannot read ({e.strerror or e})") from None
    seen: set[Path] = set()
    unique = []
    for p in out:
        r = p.resolve()
        if r not in seen:
            seen.add(r)
            unique.append(r)
    return unique


def _scan(directory: Path, all_readers: list[Any]) -> list[Path]:
    """The trace files of one named directory (see :func:`expand_sources`)."""
    for reader in all_readers:
        if reader.expand is not None:
            owned = reader.expand(directory)
            if owned is not None:
                return list(owned)
    suffixes = tuple(s for r in all_readers for s in r.suffixes)
    found = sorted(
        f
        for f in directory.rglob("*")
        if f.is_file()
        and f.name.endswith(suffixes)
        and not any(part.startswith(".") for part in f.relative_to(directory).parts)
        and not (f.parent / st.MANIFEST).exists()
    )
    redundant: set[Path] = set()
    for reader in all_readers:
        if not reader.supersedes:
            continue
        stems = {
            (f.parent, f.name[: -len(s)])
            for f in found
            if (s := reader.suffix_of(f.name)) is not None
        }
        redundant |= {
            f
            for f in found
            for s in reader.supersedes
            if f.name.endswith(s) and (f.parent, f.name[: -len(s)]) in stems
        }
    found = [f for f in found if f not in redundant]
    if not found:
        names = (
            ", ".join(suffixes[:-1]) + f" or {suffixes[-1]}" if len(suffixes) > 1 else suffixes[0]
        )
        raise XpuprofError(f"{directory}: no {names} trace files in this directory")
    return found

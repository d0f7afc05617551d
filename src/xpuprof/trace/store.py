"""The store: a directory of Parquet files (one per source file and table) and a manifest.

Layout, commit protocol, locking and checks are specified in ``docs/store.md``::

    STORE/
      manifest.json                       the commit point: only what it lists is the store
      events/part-00000-1a2b3c4d.parquet  one file per imported source (≈ per rank) and table
      flows/…  links/…  counters/…  metadata/…
    .STORE.lock                           beside it, while a writer holds the store

Why a manifest rather than globbing the folders: writes are atomic. New Parquet files get fresh
names, reach the disk (fsync of files and folders), and only then does ``manifest.json`` change
in one ``os.replace``; a new store is built in a hidden sibling folder renamed into place when
complete. Why a lock: two writers would otherwise pick the same part numbers and commit each
other's files. Why validate on open: a damaged store must be one clear error, never a traceback
or silently wrong rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from xpuprof.core.errors import StoreError
from xpuprof.core.names import ID_SHIFT, TABLES
from xpuprof.trace.lock import (  # noqa: F401 - the lock is part of the store's API
    LOCK_WAIT_S,
    TEMP_NAME,
    StoreLock,
    abandoned,
    lock_path,
    temp_name,
)

if TYPE_CHECKING:
    import pyarrow as pa

MANIFEST = "manifest.json"
FORMAT = "xpuprof-store"
VERSION = 1


def part_file(table: str, part: int, tag: str = "") -> str:
    """Relative path of one table's Parquet file for one part (``tag``: a unique suffix)."""
    return f"{table}/part-{part:05d}{tag}.parquet"


def unique_tag() -> str:
    """A suffix no other writer produces: part numbers repeat across stores and attempts."""
    return f"-{uuid.uuid4().hex[:8]}"


# -- durable writes ----------------------------------------------------------------------------


def fsync_path(path: Path) -> None:
    """Flush a file or a folder (its entries: renames, creations) to the disk."""
    fd = os.open(path, os.O_RDWR if os.name == "nt" else os.O_RDONLY)  # Windows needs write
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dirs(paths: Iterable[Path]) -> None:
    """fsync each existing folder once (where supported: Windows cannot open folders)."""
    if os.name == "nt":
        return
    for d in dict.fromkeys(paths):
        if d.is_dir():
            fsync_path(d)


def sync_files(paths: Iterable[Path]) -> None:
    """fsync many files at once: the file system then commits its journal for all of them
    together (110 files: 0.34 s one by one, 0.04 s from 16 threads, on this machine's ext4)."""
    paths = list(paths)
    if not paths:
        return
    from concurrent.futures import ThreadPoolExecutor

    def one(p: Path) -> None:
        try:
            fsync_path(p)
        except OSError as e:
            raise StoreError(f"{p}: cannot write ({e.strerror or e})") from None

    with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
        list(pool.map(one, paths))


def write_table(table: pa.Table, path: Path) -> None:
    """Write one Parquet file. Files are only written under names no manifest lists yet (a
    build folder, a unique part name), so no rename is needed; the commit flushes them all
    together (:func:`sync_files`) before the manifest names them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Dictionary pages only where values repeat (names, levels, …): trying them on the args
        # text costs a third of the write and then falls back anyway. zstd level 1 is as fast
        # as lz4 here and files are 2.4x smaller.
        dict_cols = [f.name for f in table.schema if pa.types.is_dictionary(f.type)]
        pq.write_table(
            table,
            path,
            compression="zstd",
            compression_level=1,
            use_dictionary=dict_cols,
            row_group_size=1 << 20,
        )
    except OSError as e:
        raise StoreError(f"{path}: cannot write ({e.strerror or e})") from None


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    """Replace the manifest in one rename, the moment a store changes; then flush the folder.
    On any failure the temporary file is removed and the old manifest stays."""
    tmp = root / temp_name(MANIFEST)
    try:
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / MANIFEST)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError):
            raise StoreError(f"{root}: cannot write {MANIFEST} ({e.strerror or e})") from None
        raise
    sync_dirs([root])


def clean_stale(root: Path) -> list[Path]:
    """Remove what killed writers left: build folders (``.NAME.tmp-…``) in the store's parent
    and temporary manifests in the store, of processes of this host that no longer run. Call
    it holding the store's lock; returns what was removed."""
    removed = []
    with contextlib.suppress(OSError):
        for p in root.parent.iterdir():
            m = TEMP_NAME.match(p.name)
            if not m or not m["rand"] or p.is_symlink() or not abandoned(p.name):
                continue
            if p.is_dir():
                discard(p)
            elif m["base"].endswith(".lock"):  # a lock record (StoreLock without flock)
                p.unlink(missing_ok=True)
            else:
                continue
            removed.append(p)
    if root.is_dir():
        with contextlib.suppress(OSError):
            for p in root.iterdir():
                if p.name.startswith(f".{MANIFEST}.tmp-") and abandoned(p.name):
                    p.unlink(missing_ok=True)
                    removed.append(p)
    return removed


def remove_unlisted(root: Path, manifest: dict[str, Any]) -> None:
    """Delete files in the table folders that the manifest does not list (replaced parts,
    leftovers of interrupted writes). Call it holding the store's lock."""
    keep = {f for s in manifest["sources"] for f in s.get("files", {}).values()}
    for t in TABLES:
        d = root / t
        if not d.is_dir():
            continue
        for f in d.iterdir():
            if f"{t}/{f.name}" not in keep and not f.is_dir():
                f.unlink(missing_ok=True)


def discard(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# -- building and committing ----------------------------------------------------------------


def make_parents(root: Path) -> list[Path]:
    """Create the folders above ``root``; return those made (innermost first), so that a
    failure can remove them again."""
    made = [p for p in (root.parent, *root.parent.parents) if not p.exists()]
    blocker = next((p for p in (root.parent, *root.parent.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise StoreError(f"{blocker}: is a file, not a folder; cannot create the store {root}")
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"{e.filename or root.parent}: cannot create the store's folder "
                         f"({e.strerror or e})") from None  # fmt: skip
    return made


def remove_parents(made: list[Path]) -> None:
    """Undo :func:`make_parents` as far as the folders are empty."""
    for d in made:  # innermost first
        try:
            d.rmdir()
        except OSError:
            break


def begin_staging(root: Path) -> tuple[Path, list[Path]]:
    """A hidden sibling folder to build a store in, and the parent folders made for it (so a
    failure can remove them again): the store appears only by renaming this folder. Its name
    carries this process's pid and host, so that a later import can tell it was abandoned."""
    made = make_parents(root)
    staging = root.parent / temp_name(root.name)
    try:
        staging.mkdir()
    except OSError as e:
        remove_parents(made)
        raise StoreError(f"{staging}: cannot create ({e.strerror or e})") from None
    return staging, made


def abandon_staging(staging: Path, made: list[Path]) -> None:
    """Undo :func:`begin_staging` after a failure: nothing half-written stays behind."""
    discard(staging)
    remove_parents(made)


def commit_new(staging: Path, root: Path, manifest: dict[str, Any]) -> None:
    """Make the store built in ``staging`` appear at ``root``: its files and folders flushed,
    its manifest written, one rename, the parent folder flushed. Hold the store's lock."""
    sync_files(staging / f for src in manifest["sources"] for f in src["files"].values() if f)
    sync_dirs([staging / t for t in TABLES])
    write_manifest(staging, manifest)
    try:
        if root.exists():  # an empty directory the user made for us
            root.rmdir()
        os.replace(staging, root)
    except OSError as e:
        raise StoreError(f"{root}: cannot create the store ({e.strerror or e}); did another "
                         "program write there meanwhile?") from None  # fmt: skip
    sync_dirs([root.parent])


def commit(root: Path, staging: Path, old: dict[str, Any] | None,
           results: list[dict[str, Any]], manifest: dict[str, Any]) -> None:  # fmt: skip
    """Commit what ``staging`` holds: a new store's one rename (:func:`commit_new`, no
    ``old`` manifest), or the new parts ``results`` moved into the existing store
    (:func:`commit_into`). Hold the store's lock."""
    if old is None:
        commit_new(staging, root, manifest)
    else:
        commit_into(root, staging, results, manifest)


def commit_into(
    root: Path, staging: Path, results: list[dict[str, Any]], manifest: dict[str, Any]
) -> None:
    """Move the new parts into an existing store, flush its folders, replace its manifest,
    then remove the files it no longer lists. Before the manifest changes, a failure removes
    the moved files again (their names are new: nothing the old manifest lists is touched)."""
    moved: list[Path] = []
    try:
        for r in results:
            for rel in r["files"].values():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / rel, root / rel)
                moved.append(root / rel)
        sync_files(moved)
        sync_dirs(f.parent for f in moved)
        write_manifest(root, manifest)
    except BaseException:
        try:
            current = read_manifest(root, check_files=False)
        except StoreError:
            current = None
        listed = {root / f for s in (current or {}).get("sources", []) for f in s["files"].values()
                  if f}  # fmt: skip
        for f in moved:
            if f not in listed:
                f.unlink(missing_ok=True)
        raise
    remove_unlisted(root, manifest)


def io_message(e: OSError, root: Path) -> str:
    """One line for an I/O error met while writing ``root``."""
    where = e.filename if e.filename is not None else root
    return f"{where}: cannot write the store {root} ({e.strerror or e})"


# -- the manifest ------------------------------------------------------------------------------

_Count = Annotated[int, msgspec.Meta(ge=0)]


class _Files(msgspec.Struct, forbid_unknown_fields=True):
    events: str | None = None
    flows: str | None = None
    links: str | None = None
    counters: str | None = None
    metadata: str | None = None


class _Rows(msgspec.Struct):
    events: _Count
    flows: _Count
    links: _Count
    counters: _Count
    metadata: _Count


class _Read(msgspec.Struct):
    total: _Count
    dropped: list[dict[str, Any]] = []
    truncated: bool = False


class _Source(msgspec.Struct):
    path: str
    part: Annotated[int, msgspec.Meta(ge=0, lt=1 << (63 - ID_SHIFT))]
    rank: int | None
    files: _Files
    rows: _Rows
    levels: dict[str, _Count]
    read: _Read
    size: _Count | None
    mtime_ns: int | None = None
    sha256: str | None = None
    format: str | None = None
    host: str | None = None
    rank_from: str | None = None
    meta: dict[str, Any] = {}


class _Manifest(msgspec.Struct):
    """Every field the code reads, with its type: what ``read_manifest`` guarantees."""

    format: str
    version: int
    sources: list[_Source]
    rows: _Rows
    levels: dict[str, _Count]
    events_read: _Count
    written: str | None = None


def is_store(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def read_manifest(root: str | Path, *, check_files: bool = True,
                  parts: set[int] | None = None) -> dict[str, Any]:  # fmt: skip
    """The manifest, validated: its schema (type of every field the code reads), unique parts,
    file paths confined to the store (``TABLE/NAME``, no ``..``, no absolute path, no symlink
    out) and, with ``check_files``, every listed file present. Else :class:`StoreError`.
    ``parts``: only these parts' files are looked up on disk (the others are never read by
    who asks; the rest is checked for every part): a task opening a few ranks of a job of
    hundreds does not stat thousands of files (40 ms of ~75 ms an open at 512 ranks)."""
    root = Path(root)
    p = root / MANIFEST
    if not p.is_file():
        raise StoreError(f"{root}: not an xpuprof store (no {MANIFEST})")
    try:
        with open(p, "rb") as f:
            m = _decode(f.read())
    except (OSError, ValueError, RecursionError) as e:
        raise StoreError(f"{p}: unreadable manifest ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise StoreError(f"{p}: not an xpuprof store manifest")
    if isinstance(m.get("version"), int) and m["version"] > VERSION:
        raise StoreError(
            f"{p}: store version {m.get('version')} is newer than this xpuprof reads ({VERSION})"
        )
    try:
        msgspec.convert(m, _Manifest)
    except msgspec.ValidationError as e:
        raise StoreError(f"{p}: malformed manifest: {e}") from None
    _check_paths(root, m, check_files, parts)
    return m


def _decode(data: bytes) -> Any:
    """The manifest's JSON: msgspec's decoder (20 ms against the standard one's 36 ms for the
    2.8 MB manifest of 512 ranks, and every task of a many-rank analysis opens it), or the
    standard one for what only it reads (``NaN`` in a source's metadata)."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        return json.loads(data)


def _plain_path(rel: str, table: str) -> bool:
    """``TABLE/NAME.parquet`` as the store writes it (a quick test, no path object: thousands
    of files per open at hundreds of ranks); anything else goes through the full check."""
    head, sep, name = rel.partition("/")
    return (sep == "/" and head == table and "/" not in name and "\\" not in rel
            and not name.startswith(".") and name.endswith(".parquet"))  # fmt: skip


def _inside(rel: str, table: str) -> bool:
    """``rel`` names ``TABLE/NAME.parquet`` once normalised as a POSIX path."""
    pp = PurePosixPath(rel)
    return (len(pp.parts) == 2 and pp.parts[0] == table and "\\" not in rel
            and not pp.name.startswith(".") and pp.name.endswith(".parquet"))  # fmt: skip


def _check_paths(root: Path, m: dict[str, Any], check_files: bool,
                 only: set[int] | None = None) -> None:  # fmt: skip
    p = root / MANIFEST
    parts: dict[int, int] = {}
    for i, s in enumerate(m["sources"]):
        if s["part"] in parts:
            raise StoreError(f"{p}: part {s['part']} is listed twice (sources[{parts[s['part']]}] "
                             f"and sources[{i}])")  # fmt: skip
        parts[s["part"]] = i
    seen: set[str] = set()
    for i, s in enumerate(m["sources"]):
        for table, rel in s["files"].items():
            if rel is None:
                continue
            if not _plain_path(rel, table) and not _inside(rel, table):
                raise StoreError(f"{p}: sources[{i}].files.{table} = {rel!r} is not a path "
                                 f"inside the store (expected {table}/NAME.parquet)")  # fmt: skip
            if rel in seen:
                raise StoreError(f"{p}: sources[{i}].files.{table} = {rel!r} is listed twice")
            seen.add(rel)
            if only is not None and s["part"] not in only:
                continue
            problem = locate(root, rel, must_exist=check_files)
            if problem:
                raise StoreError(problem)


def locate(root: Path, rel: str, *, must_exist: bool = True) -> str | None:
    """What is wrong with where ``root/rel`` (a ``TABLE/NAME`` path, as ``read_manifest``
    admits) leads: missing, not a file, out of the store through a symlink; or None. Two
    lstat calls unless a symlink is involved (a store lists thousands of files)."""
    f = root / rel
    try:
        linked = stat.S_ISLNK(os.lstat(f.parent).st_mode)
        mode = os.lstat(f).st_mode
    except FileNotFoundError:
        return f"{f}: missing (listed in {root / MANIFEST})" if must_exist else None
    except OSError as e:
        return f"{f}: cannot be opened ({e.strerror or e})"
    if linked or stat.S_ISLNK(mode):
        try:
            real = f.resolve(strict=must_exist)
        except FileNotFoundError:
            return f"{f}: missing (a symlink to nothing; listed in {root / MANIFEST})"
        except (OSError, RuntimeError) as e:
            return f"{f}: cannot be opened ({e})"
        if not real.is_relative_to(root.resolve()):
            return f"{f}: resolves outside the store (to {real})"
        mode = os.stat(real).st_mode if must_exist else stat.S_IFREG
    if must_exist and not stat.S_ISREG(mode):
        return f"{f}: not a regular file"
    return None


def check_file(
    root: Path, rel: str, table: str, rows: int, *, part: int | None = None, deep: bool = False
) -> str | None:
    """What is wrong with one listed Parquet file, or None: present and inside the store, a
    readable footer, the columns of ``table`` (not of another table), rows of ``part`` only
    (by the footer's statistics), ``rows`` rows; with ``deep``, every page decodes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from xpuprof.core.schema import SCHEMAS

    problem = locate(root, rel)
    if problem:
        return problem
    f = root / rel
    try:
        md = pq.read_metadata(f)
        names = md.schema.to_arrow_schema().names
    except (pa.ArrowException, OSError) as e:
        return f"{f}: not a readable Parquet file ({e})"
    want = SCHEMAS[table].names
    if names != want:
        other = next((t for t, s in SCHEMAS.items() if s.names == names), None)
        if other:
            return f"{f}: holds the columns of the {other} table, not of {table}"
        missing = [c for c in want if c not in names]
        extra = [c for c in names if c not in want]
        return (f"{f}: not the columns of the {table} table (missing {missing}, "
                f"unexpected {extra})")  # fmt: skip
    if part is not None:
        other = _other_part(md, names.index("part"), part)
        if other is not None:
            return f"{f}: holds rows of part {other}, the manifest lists it for part {part}"
    if md.num_rows != rows:
        return f"{f}: {md.num_rows} rows in the file, the manifest says {rows}"
    if deep:
        try:
            pq.read_table(f)
        except (pa.ArrowException, OSError) as e:
            return f"{f}: damaged data ({e})"
    return None


def _other_part(md: Any, column: int, part: int) -> int | None:
    """A part number other than ``part`` that the footer's statistics show, or None."""
    for i in range(md.num_row_groups):
        stats = md.row_group(i).column(column).statistics
        if stats is not None and stats.has_min_max:
            for v in (stats.min, stats.max):
                if v != part:
                    return v
    return None


def verify(root: str | Path, *, deep: bool = False) -> list[str]:
    """Check a store against its manifest: the manifest itself (as ``read_manifest``), then
    every listed file (``check_file``: present, inside the store, its table's columns, the row
    count the manifest records) and the manifest's totals. One line per problem, naming the
    file and what is wrong; empty when all is well. ``deep`` also decodes every page."""
    root = Path(root)
    try:
        m = read_manifest(root, check_files=False)
    except StoreError as e:
        return [str(e)]
    p = root / MANIFEST
    problems = []
    for s in m["sources"]:
        for table, rel in s["files"].items():
            if rel is not None:
                problem = check_file(root, rel, table, s["rows"][table], part=s["part"], deep=deep)
                if problem:
                    problems.append(problem)
        if sum(s["levels"].values()) != s["rows"]["events"]:
            problems.append(f"{p}: part {s['part']}: events per level add up to "
                            f"{sum(s['levels'].values())}, rows.events is "
                            f"{s['rows']['events']}")  # fmt: skip
    want = new_manifest(m["sources"])
    for key in ("rows", "levels"):
        for k in sorted(set(want[key]) | set(m[key])):
            if want[key].get(k, 0) != m[key].get(k, 0):
                problems.append(f"{p}: {key}.{k} total {m[key].get(k, 0)} is not the sum over "
                                f"its sources ({want[key].get(k, 0)})")  # fmt: skip
    if want["events_read"] != m["events_read"]:
        problems.append(f"{p}: events_read total {m['events_read']} is not the sum over its "
                        f"sources ({want['events_read']})")  # fmt: skip
    return problems


def new_manifest(sources: list[dict[str, Any]]) -> dict[str, Any]:
    """Assemble the manifest with totals, so ``info`` answers without opening a Parquet file."""
    rows = {t: 0 for t in TABLES}
    levels: dict[str, int] = {}
    read = 0
    for s in sources:
        for t, n in s["rows"].items():
            rows[t] = rows.get(t, 0) + n
        for lv, n in s["levels"].items():
            levels[lv] = levels.get(lv, 0) + n
        read += s["read"]["total"]
    return {
        "format": FORMAT,
        "version": VERSION,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "sources": sorted(sources, key=lambda s: s["part"]),
        "rows": rows,
        "levels": dict(sorted(levels.items(), key=lambda kv: -kv[1])),
        "events_read": read,
    }


def files_of(manifest: dict[str, Any], table: str) -> list[str]:
    return [s["files"][table] for s in manifest["sources"] if s.get("files", {}).get(table)]

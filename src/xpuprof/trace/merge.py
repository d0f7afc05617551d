"""Merge stores into one: ``xpuprof import rank0.store rank1.store … -o job.store``.

Why: ranks captured one store each — ``xpuprof capture URL`` against each rank's capture server,
``xpuprof.profile(out=f"rank{r}.store")``, one store per node on machines that share no
folder — are one job, and the tools that compare ranks (``ranks``, ``comm``) read one store.
Importing their trace files again is not possible (a live capture keeps none) and would be
slower; the parts are already normalized, so merging only copies them.

What the merged store holds: every part of every input, each with all its rows, as part ``P``
of the output, where ``P`` is

* the part's rank, when every part of the inputs has a distinct rank (0 to ``MAX_PART``): as
  ``trace/rankparts.py`` numbers a job's ranks, so a job captured per rank and merged equals
  the same job captured into one store;
* else (a store holding several parts of one rank, ``--mixed`` jobs): 0, 1, 2, … in the
  order of the inputs given and of the parts in each.

A part whose number changes gets new event ids: an event id is ``part << ID_SHIFT | index``
(``core/schema.py``), and the columns holding event ids are ``events.id``, ``events.parent``,
``flows.event``, ``links.src`` and ``links.dst``; every table's ``part`` column is the new
number. Nothing else changes (``index``, ``correlation``, ``external_id`` are the source's
own values; ``counters`` and ``metadata`` reference no event). Each of those columns must
hold ids of its own part only (they are built per source); one that does not is a damaged
store, refused. A part whose number stays is copied byte for byte. Renumbering streams each
file in batches through Arrow compute (whole columns, no loop over rows) rather than DuckDB's
``COPY``: the rows are the same either way, but DuckDB's Parquet writer does not keep the
store's Arrow types (dictionary-encoded names and levels, ``large_string`` args), which every
reader of a store gets back from an import's files.

The manifest entry of each part is the input's (source path, rank, host, format, what was read
and dropped, ``meta`` with ``distributedInfo`` and ``xpuprof_capture``: world size, backend,
process groups, job id) with its new part, files and ``merged_from`` (input store, part and
files): a second merge of the same inputs into the same output is then a no-op.

Refused, in one line naming the inputs, with nothing written (:func:`merge_problem`):

* parts of different jobs: world sizes or process groups that differ (the rule imports apply,
  :func:`~xpuprof.trace.ranks.mixed_jobs`), or captures stating different job ids
  (:func:`~xpuprof.trace.rankparts.other_job`, the rule a rank joining a store meets) —
  unless ``mixed``;
* one rank in two input stores (unless ``mixed``): two capture windows of one rank;
* an input that is not a store (a trace file, another folder: stores and trace files are not
  imported in one run; import the files into a store of their own first) or a damaged one
  (its manifest, or a listed file: ``store.verify``);
* the output among the inputs, or an output that exists and is not a store. An existing store
  at the output is replaced, as ``import`` makes it hold exactly what it was given.

Writes are the store's: the output is built in a hidden sibling folder and appears in one
rename, or its manifest is replaced in one rename, under its lock. Input stores are read, never
locked (one may be on read-only media): their files are never rewritten in place, and one that
vanishes during the merge is a clear error.
"""

from __future__ import annotations

import copy
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuprof.core.errors import StoreError, XpuprofError
from xpuprof.core.names import ID_SHIFT
from xpuprof.trace import store as st
from xpuprof.trace.rankparts import MAX_PART, other_job
from xpuprof.trace.ranks import mixed_jobs

if TYPE_CHECKING:
    from collections.abc import Callable

    from xpuprof.trace.ingest import ImportReport

#: The columns of each table that hold event ids (``part << ID_SHIFT | index``).
ID_COLUMNS: dict[str, tuple[str, ...]] = {
    "events": ("id", "parent"),
    "flows": ("event",),
    "links": ("src", "dst"),
}

#: Rows per batch while renumbering: one batch in memory at a time, as one row group written.
_BATCH_ROWS = 1 << 20


def wants_merge(paths: list[str | Path]) -> bool:
    """True when ``paths`` name a store: the import is then a merge of stores."""
    return any(st.is_store(p) for p in paths)


def input_size(paths: list[str | Path]) -> int:
    """Bytes of the files a merge of ``paths`` reads (what a progress bar counts)."""
    return sum(_file_bytes(r, m) for r, m in _inputs(paths))


def _file_bytes(root: Path, m: dict[str, Any]) -> int:
    total = 0
    for s in m["sources"]:
        for rel in s["files"].values():
            if rel:
                try:
                    total += (root / rel).stat().st_size
                except OSError as e:
                    raise StoreError(f"{root / rel}: cannot read ({e.strerror or e})") from None
    return total


def _inputs(paths: list[str | Path]) -> list[tuple[Path, dict[str, Any]]]:
    """Each input store with its manifest; refuse what is not a store (naming a store given,
    so the line says why a store was expected) and the same store named twice."""
    roots = [Path(p).resolve() for p in paths]
    a_store = next((r for r in roots if st.is_store(r)), None)
    if a_store is None:
        raise XpuprofError(f"{paths[0] if paths else '(nothing)'}: not an xpuprof store; "
                           "name the stores to merge")  # fmt: skip
    out: list[tuple[Path, dict[str, Any]]] = []
    seen: set[Path] = set()
    for given, r in zip(paths, roots, strict=True):
        if not r.exists():
            raise XpuprofError(f"{given}: no such file or directory")
        if not st.is_store(r):
            what = "a trace file" if r.is_file() else "not an xpuprof store (no manifest.json)"
            raise XpuprofError(
                f"{given}: {what}, while {a_store} is a store: import merges stores or imports "
                "trace files, not both in one run (import the trace files into a store of "
                "their own, then merge the stores)"
            )
        if r in seen:
            raise XpuprofError(f"{given}: named twice among the stores to merge")
        seen.add(r)
        out.append((r, st.read_manifest(r)))
    return out


def _label(root: Path, s: dict[str, Any]) -> str:
    return f"{root.name} part {s['part']}"


def _dist(s: dict[str, Any]) -> dict[str, Any] | None:
    cap = (s.get("meta") or {}).get("xpuprof_capture")
    d = cap.get("distributed") if isinstance(cap, dict) else None
    return d if isinstance(d, dict) else None


def _who(root: Path, s: dict[str, Any], d: dict[str, Any]) -> str:
    return (f"{_label(root, s)}: rank {d.get('rank')} of world size {d.get('world_size')}, "
            f"job {d.get('job')}")  # fmt: skip


def merge_problem(inputs: list[tuple[Path, dict[str, Any]]], mixed: bool) -> str | None:
    """Why these stores (root, manifest) may not be merged into one, in one line naming the
    stores and parts; None if they may (see the module's docstring)."""
    if mixed:
        return None
    # the rule imports apply to their files, on every part (labelled by store and part)
    labelled = [{**s, "path": _label(r, s)} for r, m in inputs for s in m["sources"]]
    problem = mixed_jobs(labelled)
    if problem:
        return problem.replace("these traces are", "these stores hold")
    # the rule a rank joining a store meets: a capture of another job (id or world size)
    first: tuple[Path, dict[str, Any], dict[str, Any]] | None = None
    for r, m in inputs:
        for s in m["sources"]:
            d = _dist(s)
            if d is None:
                continue
            if first is None:
                first = (r, s, d)
            elif other_job(first[2], d):
                a, b = _who(*first), _who(r, s, d)
                return (f"these stores hold captures of different jobs ({a}; {b}); merge each "
                        "job into its own store, or pass --mixed to keep them")  # fmt: skip
    where: dict[int, Path] = {}
    for r, m in inputs:
        for rank in {s["rank"] for s in m["sources"] if s["rank"] is not None}:
            if rank in where:
                return (f"rank {rank} is in two of the stores to merge ({where[rank]} and {r}): "
                        "two capture windows of one rank; merge one of them, or pass --mixed "
                        "to keep both (parts are then numbered in order)")  # fmt: skip
            where[rank] = r
    return None


def plan_parts(inputs: list[tuple[Path, dict[str, Any]]]) -> list[tuple[Path, dict[str, Any], int]]:
    """(input store, its manifest entry, part in the output) for every part of the inputs: the
    rank when all ranks are distinct and fit a part number, else the position."""
    parts = [(r, s) for r, m in inputs for s in sorted(m["sources"], key=lambda s: s["part"])]
    ranks = [s["rank"] for _, s in parts]
    by_rank = (all(isinstance(k, int) and 0 <= k <= MAX_PART for k in ranks)
               and len(set(ranks)) == len(ranks))  # fmt: skip
    return [(r, s, s["rank"] if by_rank else i) for i, (r, s) in enumerate(parts)]


def _renumber(src: Path, dst: Path, table: str, old: int, new: int) -> None:
    """Copy one Parquet file of part ``old`` as part ``new``: the ``part`` column set, every
    event id column moved by ``(new - old) << ID_SHIFT``, in batches (Arrow compute, no loop
    over rows); the schema and the store's write options kept."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from xpuprof.core.schema import SCHEMAS

    schema = SCHEMAS[table]
    shift = pa.scalar((new - old) << ID_SHIFT, pa.int64())
    bits = pa.scalar(ID_SHIFT, pa.int64())
    dict_cols = [f.name for f in schema if pa.types.is_dictionary(f.type)]
    try:
        f = pq.ParquetFile(src)
        with pq.ParquetWriter(dst, schema, compression="zstd", compression_level=1,
                              use_dictionary=dict_cols) as w:  # fmt: skip
            for batch in f.iter_batches(batch_size=_BATCH_ROWS):
                t = pa.Table.from_batches([batch]).cast(schema)
                part = pa.array(np.full(t.num_rows, new, np.int32))
                t = t.set_column(schema.get_field_index("part"), schema.field("part"), part)
                for c in ID_COLUMNS.get(table, ()):
                    i = schema.get_field_index(c)
                    col = t.column(i)
                    owner = pc.min_max(pc.shift_right(col, bits))
                    lo, hi = owner["min"].as_py(), owner["max"].as_py()
                    if lo is not None and (lo != old or hi != old):
                        raise StoreError(f"{src}: column {c} holds ids of part "
                                         f"{lo if lo != old else hi}, the manifest lists the "
                                         f"file for part {old}; not merging a damaged "
                                         "store")  # fmt: skip
                    t = t.set_column(i, schema.field(c), pc.add(col, shift))
                w.write_table(t, row_group_size=_BATCH_ROWS)
    except (pa.ArrowException, OSError) as e:
        raise StoreError(f"{src}: cannot be merged ({e})") from None


def _copy_part(
    root: Path, s: dict[str, Any], new: int, staging: Path, progress: Callable[[int], None]
) -> dict[str, Any]:
    """Write part ``s`` of the store ``root`` as part ``new`` into ``staging``; its manifest
    entry in the output."""
    tag = st.unique_tag()
    files: dict[str, str | None] = {}
    for table, rel in s["files"].items():
        if not rel:
            files[table] = rel
            continue
        src, new_rel = root / rel, st.part_file(table, new, tag)
        dst = staging / new_rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        size = _size(src)
        if new == s["part"]:
            try:
                shutil.copyfile(src, dst)
            except OSError as e:
                raise StoreError(f"{src}: cannot be copied ({e.strerror or e})") from None
        else:
            _renumber(src, dst, table, s["part"], new)
        files[table] = new_rel
        progress(size)
    entry = copy.deepcopy(s)
    entry.update(part=new, files=files, merged_from=_origin(root, s))
    return entry


def _origin(root: Path, s: dict[str, Any]) -> dict[str, Any]:
    """Where a merged part came from (the manifest's ``merged_from``)."""
    return {"store": str(root), "part": s["part"], "files": s["files"]}


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError as e:
        raise StoreError(f"{f}: cannot read ({e.strerror or e}); did the store change while "
                         "merging?") from None  # fmt: skip


def _same_merge(
    root: Path, old: dict[str, Any], plan: list[tuple[Path, dict[str, Any], int]]
) -> bool:
    """True when the store at ``root`` (manifest ``old``) is the merge of exactly this plan,
    its files all there: every part from the same input store, part and files (file names
    are never reused, so the same names are the same rows)."""
    if len(old["sources"]) != len(plan):
        return False
    have = {s["part"]: s.get("merged_from") for s in old["sources"]}
    if not all(have.get(new) == _origin(r, s) for r, s, new in plan):
        return False
    return not any(st.locate(root, rel) for s in old["sources"] for rel in s["files"].values()
                   if rel)  # fmt: skip


def merge_stores(
    paths: list[str | Path],
    store: str | Path,
    *,
    mixed: bool = False,
    force: bool = False,
    lock_wait: float = st.LOCK_WAIT_S,
    progress: Callable[[int, int], None] | None = None,
) -> ImportReport:
    """Merge the stores ``paths`` into the store ``store`` (see the module's docstring); the
    report an import gives. ``force``: write again even when ``store`` is already this merge.
    Raises :class:`XpuprofError` (nothing written) for what :func:`merge_problem` refuses."""
    from xpuprof.trace.ingest import ImportReport, failing_cleanly

    t0 = time.perf_counter()
    root = Path(store).resolve()
    inputs = _inputs(paths)
    for r, _ in inputs:
        if root == r or root.is_relative_to(r):
            raise XpuprofError(f"{root}: is one of the stores to merge (or inside one); "
                               "write the merge to a new store")  # fmt: skip
    for r, _ in inputs:
        problems = st.verify(r)
        if problems:
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise XpuprofError(f"{problems[0]}{more}; not merging a damaged store")
    problem = merge_problem(inputs, mixed)
    if problem:
        raise XpuprofError(problem)
    plan = plan_parts(inputs)
    total = sum(_file_bytes(r, m) for r, m in inputs)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        if progress:
            progress(done, total)

    made = st.make_parents(root)
    with failing_cleanly(root, made), st.StoreLock(root, wait=lock_wait):
        st.clean_stale(root)
        if root.exists() and not st.is_store(root) and (root.is_file() or any(root.iterdir())):
            raise XpuprofError(f"{root}: exists and is not an xpuprof store; not overwriting it")
        old = st.read_manifest(root, check_files=False) if st.is_store(root) else None
        if not force and old is not None and _same_merge(root, old, plan):
            st.remove_unlisted(root, old)  # what an interrupted write left
            report = ImportReport.of(root, old, t0, 0, [s["path"] for s in old["sources"]])
            report.noop = True
            return report
        staging, _ = st.begin_staging(root)
        try:
            entries = [_copy_part(r, s, new, staging, advance) for r, s, new in plan]
            manifest = st.new_manifest(entries)
            st.commit(root, staging, old, entries, manifest)
        finally:
            st.discard(staging)  # gone already after a new store's rename
    return ImportReport.of(root, manifest, t0, 1)

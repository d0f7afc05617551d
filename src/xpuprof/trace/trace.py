"""The ``Trace`` object: one store, read lazily as Arrow, pandas or SQL.

Nothing is loaded until asked for: opening a store reads only its manifest (so ``info`` is
instant on any size), ``table()`` reads the Parquet columns it needs, and ``sql()`` lets DuckDB
read the Parquet files directly, out of core. Before a table is first read, each of its files is
checked against the manifest (footer, columns, rows): a damaged store is a ``StoreError`` naming
the file, never a traceback or silently wrong rows. ``restricted=True`` gives the SQL a server
may expose (``docs/store.md``).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import weakref
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuprof.core.errors import StoreError, XpuprofError
from xpuprof.core.names import TABLES
from xpuprof.trace import store as st

if TYPE_CHECKING:
    from collections.abc import Iterable

    import duckdb
    import pandas as pd
    import pyarrow as pa

    from xpuprof.trace.tree import EventTree

#: Columns left out of ``Trace.events``: the lossless source text, large and rarely needed.
HEAVY_COLUMNS = ("args", "extra")


class Trace:
    """A normalized trace store (see ``docs/schema.md`` for its tables).

    ``restricted``: the SQL a server may expose to its clients: DuckDB reads nothing but this
    store's Parquet files (no other file, no ATTACH, INSTALL, LOAD or COPY), its configuration
    is locked, and :meth:`sql` runs one SELECT statement per call (``docs/store.md``). The
    default is the unrestricted DuckDB of a local user (``xpuprof sql``). ``duckdb_config``:
    settings of the connection (``{"memory_limit": "2GB", "threads": 2}``), applied before a
    restricted connection locks its configuration. ``parts``: open only these parts (sources)
    of the store — a view of some ranks, which reads none of the others' files: what a Dask
    task analysing one rank of a large job opens (:mod:`xpuprof.analysis.per_rank`).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        restricted: bool = False,
        duckdb_config: dict[str, Any] | None = None,
        parts: Iterable[int] | None = None,
        _cleanup: Path | None = None,
    ) -> None:
        self.path = Path(path).resolve()
        wanted = None if parts is None else {int(p) for p in parts}
        self.manifest = st.read_manifest(self.path, parts=wanted)
        if wanted is not None:
            self.manifest = _subset(self.manifest, wanted, self.path)
        self.restricted = restricted
        self.duckdb_config = dict(duckdb_config or {})
        self._con: duckdb.DuckDBPyConnection | None = None
        self._checked: set[str] = set()
        self._cleanup = _cleanup
        if _cleanup is not None:
            self._finalizer = weakref.finalize(self, shutil.rmtree, str(_cleanup), True)

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"Trace({str(self.path)!r}, sources={len(m['sources'])}, "
            f"events={m['rows'].get('events', 0)})"
        )

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the DuckDB connection (and the temporary store of an on-the-fly import)."""
        if self._con is not None:
            self._con.close()
            self._con = None
        if self._cleanup is not None:
            self._finalizer()

    @cached_property
    def memo(self) -> dict[Any, Any]:
        """Derived data that analyses cache on this Trace (the event tree, resolved ancestry,
        selected device work…), keyed by what it was computed from. A store never changes
        while it is open, and the cache goes with the Trace: nothing is kept at module level."""
        return {}

    # -- metadata ----------------------------------------------------------------------------

    @property
    def sources(self) -> list[dict[str, Any]]:
        return self.manifest["sources"]

    @property
    def ranks(self) -> list[int | None]:
        return [s["rank"] for s in self.sources]

    def job(self) -> dict[str, Any]:
        """The job the store's ranks belong to, from their ``distributedInfo``: ``world_size``
        (None when no source states one, or they disagree: an import with ``mixed``),
        ``ranks`` (present, sorted) and ``missing`` (ranks of the world with no source)."""
        from xpuprof.trace.ranks import job_of

        worlds = {job_of(s.get("meta") or {})[0] for s in self.sources} - {None}
        present = sorted({r for r in self.ranks if r is not None})
        world = next(iter(worlds)) if len(worlds) == 1 else None
        missing = sorted(set(range(world)) - set(present)) if world else []
        return {"world_size": world, "ranks": present, "missing": missing}

    @cached_property
    def meta(self) -> dict[str, Any]:
        """Facts about the capture: per source its rank, host, device properties, distributed
        info and every other top-level key of the source file.

        ``device_properties`` and ``distributed_info`` are keyed by part (one per source file)
        — two files of the same rank (a before/after pair, say) must not overwrite each
        other; ``ranks`` maps part → rank.
        """
        out: dict[str, Any] = {
            "store": str(self.path),
            "sources": [],
            "device_properties": {},
            "distributed_info": {},
            "ranks": {},
        }
        for s in self.sources:
            meta = s.get("meta", {})
            key = s["part"]
            out["ranks"][key] = s["rank"]
            if "deviceProperties" in meta:
                out["device_properties"][key] = meta["deviceProperties"]
            if "distributedInfo" in meta:
                out["distributed_info"][key] = meta["distributedInfo"]
            out["sources"].append(
                {
                    "path": s["path"],
                    "part": s["part"],
                    "rank": s["rank"],
                    "rank_from": s.get("rank_from"),
                    "steps_from": s.get("steps_from"),
                    "host": s.get("host"),
                    "format": s.get("format"),
                    "meta": meta,
                }
            )
        return out

    # -- tables ------------------------------------------------------------------------------

    def files(self, table: str) -> list[Path]:
        """The Parquet files of one table, checked against the manifest (once per Trace)."""
        if table not in TABLES:
            raise XpuprofError(f"unknown table {table!r}; tables are: {', '.join(TABLES)}")
        if table not in self._checked:
            for s in self.sources:
                rel = s["files"].get(table)
                problem = rel and st.check_file(
                    self.path, rel, table, s["rows"][table], part=s["part"]
                )
                if problem:
                    raise StoreError(problem)
            self._checked.add(table)
        return [self.path / f for f in st.files_of(self.manifest, table)]

    def table(self, name: str, columns: list[str] | None = None, filters: Any = None,
              parts: Iterable[int] | None = None) -> pa.Table:  # fmt: skip
        """One table as Arrow, all parts together (optionally a subset of columns / rows, or
        of ``parts``: only their files are read, so one rank of a big job costs one rank)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from xpuprof.core.schema import SCHEMAS

        files = self.files(name)
        if parts is not None:
            want = {int(p) for p in parts}
            mine = {self.path / s["files"][name] for s in self.sources
                    if int(s["part"]) in want and s["files"].get(name)}  # fmt: skip
            files = [f for f in files if f in mine]
        schema = SCHEMAS[name]
        if not files:
            t = schema.empty_table()
            return t.select(columns) if columns else t
        try:
            return pq.read_table(
                [str(f) for f in files], columns=columns, filters=filters, schema=schema
            )
        except (pa.ArrowException, OSError) as e:  # damage past the footer
            raise StoreError(f"{self.path}: cannot read the {name} table ({e})") from None

    @cached_property
    def events(self) -> pd.DataFrame:
        """The events table as pandas, without the heavy ``args``/``extra`` text columns
        (read those with :meth:`args` or ``table("events")``)."""
        from xpuprof.core.schema import SCHEMAS

        cols = [c for c in SCHEMAS["events"].names if c not in HEAVY_COLUMNS]
        return self.table("events", columns=cols).to_pandas()

    def tree(
        self,
        ranks: Iterable[int] | None = None,
        *,
        host_only: bool = False,
        columns: Iterable[str] = (),
    ) -> EventTree:
        """The event tree (``xpuprof.trace.tree.EventTree``, ``docs/tree.md``) of some ranks
        (None: all), of host events only with ``host_only``; built once per selection and kept
        in ``memo``. ``columns``: lazy columns the caller is about to use, read now (in the
        same pass as the tree when it is built)."""
        from xpuprof.trace.tree import build

        key = ("tree", None if ranks is None else tuple(sorted({int(r) for r in ranks})), host_only)
        if key not in self.memo:
            self.memo[key] = build(self, key[1], host_only=host_only, columns=columns)
        else:
            self.memo[key].load(*columns)
        return self.memo[key]

    def arg_fields(self, ids: Any, keys: Iterable[str]) -> pd.DataFrame:
        """Some fields of the args of the events ``ids`` as JSON text (None where absent),
        one column per key, indexed by ``ids`` in their order: DuckDB extracts them, so a
        caller that needs a few fields (``Input Dims``) of many events decodes only those,
        and each distinct text once if it memoizes."""
        import pyarrow as pa

        keys = list(keys)
        cols = ", ".join(
            f"json_extract(e.args, '$.\"{k}\"')::varchar as c{i}" for i, k in enumerate(keys)
        )
        con = self.con
        con.register("_xp_arg_ids", pa.table({"id": pa.array(ids, pa.int64())}))
        try:
            got = con.execute(f"select e.id, {cols} from events e join _xp_arg_ids i "
                              "on e.id = i.id").fetchdf()  # fmt: skip
        finally:
            con.unregister("_xp_arg_ids")
        got = got.drop_duplicates("id").set_index("id").reindex(ids)
        got.columns = keys
        return got.astype(object).where(got.notna(), None)

    def args(self, ids: list[int] | Any) -> dict[int, Any]:
        """The original args objects of the given event ids, decoded from their source text."""
        import pyarrow as pa
        import pyarrow.compute as pc

        want = pa.array(list(ids), pa.int64())
        # filtered while scanning: only the matching rows' text is ever held (the whole args
        # column of a job of hundreds of ranks is gigabytes), and the ids' part bits let the
        # files of other parts be skipped on their statistics
        t = self.table("events", columns=["id", "args"], filters=pc.field("id").isin(want))
        from xpuprof.core.raw import decode_json

        # text that cannot be decoded here (nesting deeper than Python allows) comes back as
        # the text itself: the source's args are never lost, and never an exception
        return {
            i: decode_json(a, default=a)
            for i, a in zip(t["id"].to_pylist(), t["args"].to_pylist(), strict=True)
        }

    # -- SQL ---------------------------------------------------------------------------------

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with one view per table, reading the Parquet files in place
        (restricted to them, its configuration locked, when the Trace is ``restricted``)."""
        if self._con is None:
            import duckdb

            from xpuprof.core.schema import SCHEMAS

            files = {name: self.files(name) for name in TABLES}
            try:
                con = duckdb.connect(config=self.duckdb_config)
            except duckdb.Error as e:
                raise XpuprofError(f"DuckDB settings {self.duckdb_config}: {e}") from None
            try:
                # DuckDB draws a progress bar on stdout for a query over 2 s (512 ranks): it
                # would land inside a --json document or a table
                con.execute("SET enable_progress_bar = false")
                if self.restricted:
                    allowed = [f for fs in files.values() for f in fs]
                    con.execute("SET autoinstall_known_extensions = false")
                    con.execute("SET autoload_known_extensions = false")
                    con.execute(f"SET allowed_paths = [{_sql_list(allowed)}]")
                for name in TABLES:
                    if files[name]:
                        con.execute(f"CREATE VIEW {name} AS SELECT * FROM "
                                    f"read_parquet([{_sql_list(files[name])}])")  # fmt: skip
                    else:
                        con.register(f"_{name}_empty", SCHEMAS[name].empty_table())
                        con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_empty")
                if self.restricted:
                    con.execute("SET enable_external_access = false")
                    con.execute("SET lock_configuration = true")
            except BaseException:
                con.close()
                raise
            self._con = con
        return self._con

    def sql(self, query: str) -> pd.DataFrame:
        """Run SQL over the store's tables (``events``, ``flows``, ``links``, ``counters``,
        ``metadata``) and return a DataFrame. A restricted Trace runs one SELECT (or EXPLAIN)
        statement per call and refuses the rest."""
        import duckdb

        con = self.con
        try:
            if not self.restricted:
                return con.execute(query).df()
            statements = con.extract_statements(query)
            if len(statements) != 1:
                raise XpuprofError(
                    f"restricted SQL runs one statement at a time; got {len(statements)}"
                )
            kind = statements[0].type
            if kind not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
                raise XpuprofError(
                    f"restricted SQL runs only one SELECT statement (a query); this is {kind.name}"
                )
            return con.execute(statements[0]).df()
        except duckdb.Error as e:
            if isinstance(e, duckdb.IOException) and str(self.path) in str(e):
                raise StoreError(f"{self.path}: damaged store ({e})") from None
            raise XpuprofError(f"SQL error: {e}") from None


def _subset(manifest: dict[str, Any], parts: set[int], path: Path) -> dict[str, Any]:
    """The manifest of the parts ``parts`` only (row totals recounted)."""
    have = {int(s["part"]) for s in manifest["sources"]}
    if not parts <= have:
        raise XpuprofError(f"{path}: no part {sorted(parts - have)} in the store "
                           f"(parts: {sorted(have)})")  # fmt: skip
    sources = [s for s in manifest["sources"] if int(s["part"]) in parts]
    rows: dict[str, int] = {}
    for s in sources:
        for t, n in s.get("rows", {}).items():
            rows[t] = rows.get(t, 0) + int(n)
    return {**manifest, "sources": sources, "rows": rows}


def _sql_list(paths: list[Path]) -> str:
    """Paths as the items of a DuckDB list literal."""
    return ", ".join("'" + str(f).replace("'", "''") + "'" for f in paths)


def load(
    path: str | Path,
    *,
    lenient: bool = False,
    scheduler: str | None = None,
    restricted: bool = False,
) -> Trace:
    """Open a store, or import trace files (a file, or a directory of them) on the fly.

    An on-the-fly import goes to a temporary store that is deleted when the Trace is closed or
    garbage-collected; import with ``xpuprof import`` to keep it. ``restricted``: see
    :class:`Trace`.
    """
    p = Path(path)
    if st.is_store(p):
        return Trace(p, restricted=restricted)
    if not p.exists():
        raise XpuprofError(f"{p}: no such file or directory")
    from xpuprof.trace.ingest import import_traces

    tmp = Path(tempfile.mkdtemp(prefix="xpuprof-"))
    _TEMP_DIRS.add(str(tmp))
    try:
        import_traces([p], tmp / "store", lenient=lenient, scheduler=scheduler)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Trace(tmp / "store", restricted=restricted, _cleanup=tmp)


_TEMP_DIRS: set[str] = set()


@atexit.register
def _remove_temp_dirs() -> None:
    for d in _TEMP_DIRS:
        shutil.rmtree(d, ignore_errors=True)

"""A stopped capture (:class:`Halted`) and how it becomes a store (:func:`finish`).

``xpuprof.profile`` runs :func:`finish` in the job when its block ends; a remote capture runs
it in a child process (``live/remote.py``), so that reading the profiler's trace files,
normalising and writing Parquet never take the job's core. torch's trace comes as one file per
profiler segment (``capture/torch.py``): :func:`merge_segments` joins them into one trace.
A rank of a distributed job adds its part to the store its job shares (``finish(join=True)``,
``trace/rankparts.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


class Halted:
    """A stopped capture not yet written: the framework's own trace files (torch: one per
    segment, in order) and our recorders' spans and samples, as raw tables once
    :meth:`prepare` has run (times in Unix ns, indexes from 0: :func:`finish` shifts them).

    ``sources`` are the stopped recorders (annotations collected, layer spans, telemetry):
    turning them into tables is left to :meth:`prepare`, which runs off the job's thread.
    ``owned``: :meth:`cleanup` removes ``workdir`` too.
    """

    def __init__(
        self,
        workdir: Path,
        framework: str,
        framework_traces: list[Path],
        extras: list[dict[str, Any]] | None,
        settings: dict[str, Any],
        *,
        sources: list[Any] | None = None,
        names: bool = False,
        owned: bool = True,
    ) -> None:
        self.workdir = workdir
        self.framework = framework
        self.framework_traces = framework_traces
        self.extras = extras
        self.settings = settings
        self._sources = sources or []
        self._names = names
        self._owned = owned

    def prepare(self) -> list[dict[str, Any]]:
        """The recorders' raw tables (built once): waits for the telemetry sampler to end."""
        from xpuprof.capture.records import Collected

        if self.extras is None:
            extras = []
            for source in self._sources:
                if isinstance(source, Collected):
                    extras.append(source.to_raw(base_ns=0, index_start=0, names=self._names))
                    continue
                if hasattr(source, "request_stop"):  # the telemetry sampler
                    source.stop()
                extras.append(source.to_raw(base_ns=0, index_start=0))
            self.extras, self._sources = extras, []
        return self.extras

    def save(self) -> Path:
        """Write the raw tables next to the framework traces, so another process can finish."""
        import json

        import pyarrow as pa

        for i, tables in enumerate(self.prepare()):
            for kind, t in tables.items():
                with pa.OSFile(str(self.workdir / f"extra{i}.{kind}.arrow"), "wb") as f:
                    with pa.ipc.new_file(f, t.schema) as w:
                        w.write_table(t)
        (self.workdir / "halted.json").write_text(
            json.dumps(
                {
                    "framework": self.framework,
                    "framework_traces": [str(p) for p in self.framework_traces],
                    "extras": len(self.prepare()),
                    "settings": self.settings,
                },
                default=str,
            )
        )
        return self.workdir

    @classmethod
    def load(cls, workdir: Path) -> Halted:
        import json

        import pyarrow as pa

        from xpuprof.core.raw import KINDS

        doc = json.loads((workdir / "halted.json").read_text())
        extras = []
        for i in range(doc["extras"]):
            tables = {}
            for kind in KINDS:
                with pa.memory_map(str(workdir / f"extra{i}.{kind}.arrow")) as f:
                    tables[kind] = pa.ipc.open_file(f).read_all()
            extras.append(tables)
        traces = [Path(p) for p in doc["framework_traces"]]
        return cls(workdir, doc["framework"], traces, extras, doc["settings"], owned=False)

    def cleanup(self) -> None:
        if self._owned:
            shutil.rmtree(self.workdir, ignore_errors=True)


def finish(halted: Halted, out: str | Path, *, join: bool = False) -> Any:
    """Merge a stopped capture's pieces into one normalized trace and write it as a store.

    ``join``: the capture is one rank of a distributed job (its settings' ``distributed``,
    ``live/job.py``): its part joins the store ``out`` that the job's other ranks write too
    (``trace/rankparts.py``), as part number = its rank; else ``out`` must be new or empty."""
    from xpuprof.core.raw import RawTrace, concat_tables, count_entries, next_index
    from xpuprof.trace.ingest import store_raw

    base: RawTrace | None = None
    if halted.framework == "torch" and halted.framework_traces:
        from xpuprof.formats.kineto import read_kineto

        base = merge_segments([read_kineto(p) for p in halted.framework_traces])
        base.top.pop("traceName", None)  # a temporary file: meaningless afterwards
    elif halted.framework == "jax" and halted.framework_traces:
        from xpuprof.formats.xplane import read_xplane

        base = read_xplane(halted.framework_traces[0])
    base_ns = int((base.top.get("baseTimeNanoseconds") or 0) if base is not None else 0)
    parts = [base.tables] if base is not None else []
    nxt = next_index(parts[0]) if parts else 0
    for tables in halted.prepare():
        shifted = _shifted(tables, nxt, -base_ns)
        parts.append(shifted)
        nxt = max(nxt, next_index(shifted))
    tables = concat_tables(parts)
    phase, cat = count_entries(tables)
    top = dict(base.top) if base is not None else {"baseTimeNanoseconds": base_ns}
    settings = dict(halted.settings)
    top["xpuprof_capture"] = settings
    top.setdefault("host_name", settings.get("host_name"))
    me = settings.get("distributed") if join else None
    path = f"capture:{settings.get('pid')}"
    if me is not None:
        from xpuprof.live.job import distributed_info

        # torch.profiler's distributedInfo (op level) lacks the process groups: add them;
        # captures without it (step, layer levels) get torch.distributed's facts; a launcher's
        # variables are not torch's statement: those stay in xpuprof_capture (rank_from)
        if me["rank_from"] == "torch.distributed":
            dist = top.get("distributedInfo")
            top["distributedInfo"] = {**distributed_info(me), **(dist if isinstance(dist, dict)
                                                                 else {})}  # fmt: skip
        # the groups once per part, there (a rank's list of every group's ranks grows with
        # the job, and the manifest every rank rewrites holds them all)
        settings["distributed"] = {k: v for k, v in me.items() if k != "pg_config"}
        path = f"capture:{me['host']}:{settings.get('pid')}:rank{me['rank']}"
    raw = RawTrace(
        path=path,
        tables=tables,
        read_phase=phase,
        read_category=cat,
        top=top,
        string_ids=base.string_ids if base is not None else {"pid": {}, "tid": {}},
        size=0,
        sha256="",
        compressed=False,
        format="xpuprof-capture",
    )
    if me is not None:
        from xpuprof.trace.rankparts import add_rank_part

        return add_rank_part(raw, out, me)
    return store_raw([raw], out)


def _shifted(tables: dict[str, Any], index_by: int, ts_by: int) -> dict[str, Any]:
    """``tables`` with ``index`` moved up by ``index_by`` and ``ts`` by ``ts_by``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = {}
    for kind, t in tables.items():
        if t.num_rows:
            if index_by:
                i = t.schema.get_field_index("index")
                t = t.set_column(i, "index", pc.add(t["index"], pa.scalar(index_by, pa.int64())))
            if ts_by:
                i = t.schema.get_field_index("ts")
                t = t.set_column(i, "ts", pc.add(t["ts"], pa.scalar(ts_by, pa.int64())))
        out[kind] = t
    return out


def merge_segments(raws: list[Any]) -> Any:
    """One Kineto ``RawTrace`` from the trace files of consecutive profiler segments
    (:class:`~xpuprof.capture.torch.TorchProfiler`), as if recorded in one piece.

    Entries keep their order (``index`` runs on across files) and their times (moved onto the
    first file's ``baseTimeNanoseconds``). Launch flows carry correlation ids, unique in the
    process; other flows (``fwdbwd``) are numbered from 1 in each session, so their ids are
    moved past the previous segments' to stay unique. pid/tid names that a file coded
    differently get the first files' codes.
    """
    from xpuprof.core.raw import next_index

    first = raws[0]
    if len(raws) == 1:
        return first
    base_ns = int(first.top.get("baseTimeNanoseconds") or 0)
    codes = {k: {name: int(c) for c, name in v.items()} for k, v in first.string_ids.items()}
    parts = [first.tables]
    nxt = next_index(first.tables)
    flow_next = _renumber_flows(first.tables["flows"], 0)[1]
    phase, cat = dict(first.read_phase), dict(first.read_category)
    for raw in raws[1:]:
        seg_ns = int(raw.top.get("baseTimeNanoseconds") or 0)
        tables = _shifted(raw.tables, nxt, seg_ns - base_ns)
        tables = _recode_names(tables, raw.string_ids, codes)
        tables["flows"], flow_next = _renumber_flows(tables["flows"], flow_next)
        parts.append(tables)
        nxt = max(nxt, next_index(tables))
        for total, counts in ((phase, raw.read_phase), (cat, raw.read_category)):
            for key, n in counts.items():
                total[key] = total.get(key, 0) + n
    from xpuprof.core.raw import concat_tables

    first.tables = concat_tables(parts)
    first.read_phase, first.read_category = phase, cat
    first.string_ids = {k: {str(c): name for name, c in v.items()} for k, v in codes.items()}
    return first


def _renumber_flows(fl: Any, offset: int) -> tuple[Any, int]:
    """Flows with numeric ids of non-launch kinds moved up by ``offset``; returns the table
    and the first id free after them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from xpuprof.core.names import LAUNCH_FLOW_KINDS

    if not fl.num_rows:
        return fl, offset
    cats = pc.utf8_lower(pc.cast(fl["cat"], pa.string()))
    launch = pc.fill_null(pc.is_in(cats, value_set=pa.array(sorted(LAUNCH_FLOW_KINDS))), False)
    numeric = pc.fill_null(pc.match_substring_regex(fl["flow_id"], r"^[0-9]{1,15}$"), False)
    moved = pc.and_(pc.invert(launch), numeric)
    ids = pc.cast(pc.if_else(moved, fl["flow_id"], "0"), pa.int64())
    top = pc.max(pc.filter(ids, moved)).as_py()
    if top is None:
        return fl, offset
    if offset:
        new = pc.cast(pc.add(ids, pa.scalar(offset, pa.int64())), pa.string())
        fl = fl.set_column(
            fl.schema.get_field_index("flow_id"), "flow_id", pc.if_else(moved, new, fl["flow_id"])
        )
    return fl, offset + top + 1


def _recode_names(
    tables: dict[str, Any], string_ids: dict[str, dict[str, str]], codes: dict[str, dict]
) -> dict[str, Any]:
    """pid/tid codes of names (negative ids) rewritten to the codes in ``codes`` (name →
    code, extended with names not seen before)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    for kind in ("pid", "tid"):
        known = codes.setdefault(kind, {})
        remap: dict[int, int] = {}
        for code, name in string_ids.get(kind, {}).items():
            want = known.setdefault(name, min(known.values(), default=0) - 1)
            if int(code) != want:
                remap[int(code)] = want
        if not remap:
            continue
        old = np.array(sorted(remap), dtype=np.int64)
        new = np.array([remap[c] for c in old], dtype=np.int64)
        for key, t in tables.items():
            if not t.num_rows:
                continue
            col = t[kind].combine_chunks()
            vals = pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64)
            valid = ~np.asarray(col.is_null())
            pos = np.searchsorted(old, vals)
            hit = valid & (pos < len(old)) & (old[np.minimum(pos, len(old) - 1)] == vals)
            vals[hit] = new[pos[hit]]
            arr = pa.array(vals, pa.int64(), mask=~valid)
            tables[key] = t.set_column(t.schema.get_field_index(kind), kind, arr)
    return tables

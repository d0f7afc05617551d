"""What a store holds and what an import did, as Results: ``info`` (from the manifest alone:
instant on any size, no pandas), ``info --check`` (every file verified against the
manifest), and the import's report. Listed as tools in :mod:`xpuprof.ui.tools`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuprof.core.errors import XpuprofError
from xpuprof.core.names import LEVELS, TABLES
from xpuprof.core.result import Presentation, Result
from xpuprof.core.text import ranges_text

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

#: How ``info`` shows its tables of rows per table and events per level.
INFO_PRESENT = {"tables": Presentation(title="rows per table", all_rows=True),
                "levels": Presentation(title="events per level", all_rows=True)}  # fmt: skip


def store_info(trace: Trace) -> dict[str, Any]:
    """What a store holds, from its manifest alone (instant on any size): the store, its
    format version, when it was written, events read, rows per table and per level, and per
    source its path, part, rank (and where the rank came from), host, format, size, what was
    read, rows, levels, device names and world size."""
    m = trace.manifest
    sources = []
    for s, meta in zip(m["sources"], trace.meta["sources"], strict=True):
        raw = meta["meta"]
        props = raw.get("deviceProperties") or []
        dist = raw.get("distributedInfo")
        sources.append(
            {
                **{k: v for k, v in meta.items() if k != "meta"},  # path, part, rank, host…
                "size": s["size"],
                "events_read": s["read"]["total"],
                "read": s["read"],
                "rows": s["rows"],
                "levels": s["levels"],
                "devices": [d.get("name") for d in props if isinstance(d, dict)],
                "world_size": dist.get("world_size") if isinstance(dist, dict) else None,
            }
        )
    return {
        "store": str(trace.path),
        "version": m["version"],
        "written": m.get("written"),
        "events_read": m["events_read"],
        "rows": m["rows"],
        "levels": m["levels"],
        "sources": sources,
    }


def check_store(path: str | Path) -> list[str]:
    """``info --check``: what is wrong with the store at ``path`` (its manifest, and each of its
    files checked against it: missing, truncated, another table's); empty when all is well."""
    try:
        from xpuprof.trace.store import verify  # type: ignore[attr-defined]
    except ImportError:
        raise XpuprofError(
            "info --check: this version of xpuprof cannot verify stores "
            "(xpuprof.trace.store.verify is missing)"
        ) from None
    return [str(p) for p in verify(Path(path))]


def _problems(path: str | Path, found: list[str]) -> Result:
    n = len(found)
    title = f"check: {n} problem{'s' if n != 1 else ''} in {path}"
    shown = Presentation(layout="paragraphs", title=title, all_rows=True, lines=("{problem}",))
    return Result(
        tables={"problems": [{"problem": p} for p in found]},
        facts={"store": str(path), "problems": n},
        present={"problems": shown},
    )


def check_first(name: str, paths: Iterable[str | Path], options: Mapping[str, Any],
                as_json: bool = False) -> Result | dict[str, Any] | None:  # fmt: skip
    """What a front end shows instead of running tool ``name`` when the checks it was asked
    for fail before its stores can be opened (``info --check`` on a store with a bad manifest
    or a missing file, which opening refuses): the problems (a Result, or the ``--json``
    document), else None and the tool runs."""
    if name != "info" or not options.get("check"):
        return None
    from xpuprof.trace.store import is_store

    for path in paths:
        found = check_store(path) if is_store(path) else []
        if found:
            return {"store": str(path), "check": {"problems": found}} if as_json else (
                _problems(path, found))  # fmt: skip
    return None


def info_headline(sources: list[dict[str, Any]], events_read: int) -> str:
    """``info``'s answer in one sentence: events read, sources, ranks and devices (the
    ``sources`` rows of :func:`info`: ``rank`` an int or None, ``devices`` names joined by
    ``", "``)."""
    ranks = sorted({int(s["rank"]) for s in sources if isinstance(s.get("rank"), int)})
    devices = sorted({d for s in sources for d in (s.get("devices") or "").split(", ") if d})
    line = f"{events_read or 0:,} events read from {len(sources)} source(s)"
    if ranks:
        line += f", {'rank' if len(ranks) == 1 else 'ranks'} {ranges_text(ranks)}"
    return line + (f", on {', '.join(devices)}" if devices else "")


def info(trace: Trace, *, check: bool = False) -> Result:
    """:func:`store_info` as tables (no pandas: ``info`` must answer in a blink): ``sources``,
    ``tables`` (rows per table) and ``levels`` (events per level). Facts: ``headline``
    (:func:`info_headline`), ``store``, ``version``, ``events_read``. ``check``: also verify
    every file against the manifest (:func:`check_store`): the table ``problems`` and the fact
    ``problems`` (their number), or a note that all is well."""
    doc = store_info(trace)
    sources = [
        {
            "part": s["part"],
            "rank": s["rank"],
            "rank_from": s.get("rank_from"),
            "steps_from": s.get("steps_from"),
            "source": Path(s["path"]).name,
            "size_bytes": s["size"],
            "read": s["events_read"],
            "events": s["rows"]["events"],
            "devices": ", ".join(sorted({d for d in s["devices"] if d})) or None,
        }
        for s in doc["sources"]
    ]
    levels = [{"level": lv, "events": doc["levels"][lv]} for lv in LEVELS
              if doc["levels"].get(lv)]  # fmt: skip
    res = Result(
        tables={"sources": sources,
                "tables": [{"table": t, "rows": doc["rows"].get(t, 0)} for t in TABLES],
                "levels": levels},
        facts={"headline": info_headline(sources, doc["events_read"]), "store": doc["store"],
               "version": doc["version"], "events_read": doc["events_read"]},
        present={"sources": Presentation(title=doc["store"], all_rows=True)},
    )  # fmt: skip
    if check:
        found = check_store(trace.path)
        res.facts["problems"] = len(found)
        if found:
            bad = _problems(trace.path, found)
            res.tables |= bad.tables
            res.present |= bad.present
        else:
            files = sum(len(trace.files(t)) for t in TABLES)
            res.notes.append(f"check: ok, {files} files verified against the manifest")
    return res


def info_document(trace: Trace, *, check: bool = False) -> dict[str, Any]:
    """``info --json``: the :func:`store_info` document (it predates Result, and scripts read
    it); with ``check``, ``check: {"problems": [...]}`` too."""
    doc = store_info(trace)
    if check:
        doc["check"] = {"problems": check_store(trace.path)}
    return doc


def import_result(report: Any) -> Result:
    """What an import (an :class:`~xpuprof.trace.ingest.ImportReport`) read and wrote, per
    source, and events per level; what it dropped, in the notes. Facts: ``events_read``,
    ``seconds``, ``workers``, ``up_to_date`` (nothing needed importing)."""
    doc = report.to_dict()
    facts = {"events_read": report.events_read, "seconds": report.seconds,
             "workers": report.workers, "up_to_date": bool(report.noop)}  # fmt: skip
    if report.noop:
        return Result(notes=[f"{report.store}: up to date ({len(report.sources)} source(s) "
                             f"unchanged, {report.rows.get('events', 0):,} events)"],
                      facts=facts)  # fmt: skip
    rows, notes = [], []
    for s in doc["sources"]:
        rows.append({"source": Path(s["path"]).name + (" (unchanged)" if s["path"] in
                                                         report.reused else ""),
                     "rank": s["rank"], "read": s["events_read"],
                     **{t: n for t, n in s["rows"].items() if t != "links"},
                     "dropped": sum(d["events"] for d in s["dropped"])})  # fmt: skip
        for d in s["dropped"]:
            where = f" at byte {d['offset']}" if d.get("offset") is not None else ""
            lost = f"dropped {d['events']} from " if d["events"] else ""  # a truncation note
            notes.append(f"{lost}{s['path']}: {d['reason']}{where}")
        notes.extend(f"{s['path']}: {n}" for n in s.get("notes", []))
    title = (f"imported into {report.store}: {report.events_read:,} events read from "
             f"{len(report.sources)} file(s) in {report.seconds:.2f} s "
             f"({report.workers} worker(s))")  # fmt: skip
    merged = {str(s["merged_from"]["store"]) for s in report.sources if s.get("merged_from")}
    if merged:  # a merge of stores (trace.merge): their parts were read at their import
        title = (f"merged into {report.store}: {len(report.sources)} part(s) of "
                 f"{len(merged)} store(s), {report.rows.get('events', 0):,} events, in "
                 f"{report.seconds:.2f} s")  # fmt: skip
    levels = [{"level": lv, "events": report.levels[lv]} for lv in LEVELS
              if report.levels.get(lv)]  # fmt: skip
    return Result(tables={"sources": rows, "levels": levels}, notes=notes, facts=facts,
                  present={"sources": Presentation(title=title, all_rows=True),
                           "levels": INFO_PRESENT["levels"]})  # fmt: skip

"""The rank of each source: what the file says (``distributedInfo``; for xpuprof's own captures
the capturing process's ``RANK``), else what its name says (``rank<N>``, ``worker<N>``; one file
per host of an XProf run: the host's position), else 0. A rank is never null: a trace that names
none is one rank's, and every tool can then group, select and print by rank.

XPlane: one file is one host's process, and the chips it drives are devices of that rank (each
event's ``device``), not ranks of their own: a JAX/XLA process drives all of its host's chips,
as one PyTorch rank drives its GPU. ``docs/steps.md`` (ranks) says why.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from xpuprof.core.errors import XpuprofError

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[_\-]?(\d+)", re.IGNORECASE)
_DIGITS = re.compile(r"(\d+)")

#: Where a source's rank came from (the manifest's ``rank_from``), in the order they are tried.
RANK_FROM = (
    "distributedInfo",
    "RANK environment variable",
    "file name",
    "host order",
    "default",
)

#: A rank hint for one file: (rank, where it came from).
RankHint = tuple[int, str]


def rank_from_name(path: Path) -> int | None:
    """N of a ``rank<N>``/``worker<N>`` in the file name (``worker3_step_12.pt.trace.json``)."""
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def _natural(name: str) -> list[Any]:
    """Sort key of a host name with its numbers compared as numbers (``w-2`` before ``w-10``)."""
    return [int(x) if x.isdigit() else x for x in _DIGITS.split(name)]


def rank_hints(paths: list[Path]) -> dict[Path, RankHint]:
    """Ranks the file names give: a ``rank<N>``/``worker<N>`` in the name; else, for formats
    that write one file per host (``Reader.ranks_by_host``: XProf's ``<host>.xplane.pb``), the
    position of the host among the files of its folder when that folder holds several and none
    names a rank (one profile run of a multi-host job; a lone file is left to the default)."""
    from xpuprof.formats import reader_for

    hints: dict[Path, RankHint] = {}
    by_folder: dict[Path, list[Path]] = {}
    for p in paths:
        n = rank_from_name(p)
        if n is not None:
            hints[p] = (n, "file name")
            continue
        try:
            per_host = reader_for(p).ranks_by_host
        except XpuprofError:
            continue  # the import reports it
        if per_host:
            by_folder.setdefault(p.parent, []).append(p)
    for files in by_folder.values():
        if len(files) > 1:
            for i, p in enumerate(sorted(files, key=lambda f: _natural(f.name))):
                hints[p] = (i, "host order")
    return hints


def source_rank(top: dict[str, Any], rank_hint: RankHint | None = None) -> RankHint:
    """The rank of a source and where it came from (:data:`RANK_FROM`): ``distributedInfo``'s
    rank; for xpuprof's own captures the ``RANK`` the capturing process had; the hint from the
    file names (:func:`rank_hints`); else 0 (``default``: a trace that names no rank is one
    rank's). Never None: every event has a rank."""
    dist = top.get("distributedInfo")
    r = dist.get("rank") if isinstance(dist, dict) else None
    if _is_rank(r):
        return r, "distributedInfo"
    cap = top.get("xpuprof_capture")
    r = cap.get("rank") if isinstance(cap, dict) else None
    if _is_rank(r):
        return r, "RANK environment variable"
    if rank_hint is not None and _is_rank(rank_hint[0]):
        return rank_hint
    return 0, "default"


def job_of(top: dict[str, Any]) -> tuple[Any, str | None]:
    """A source's job as its ``distributedInfo`` states it: (world size, digest of its process
    groups' definitions, None when it lists none) — what every rank of one job shares."""
    import hashlib
    import json

    dist = top.get("distributedInfo")
    if not isinstance(dist, dict):
        return None, None
    world = dist.get("world_size")
    pgs = dist.get("pg_config")
    digest = None
    if pgs:
        text = json.dumps(pgs, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return (world if _is_rank(world) else None), digest


def groups_of(top: dict[str, Any]) -> dict[str, str]:
    """The process groups a source's ``distributedInfo`` defines, by name: their definition
    (description, size and ranks) as text. Each rank lists only the groups it belongs to
    (torch builds ``pg_config`` from the process's own groups), so two ranks of one job agree
    on every group both list, not on the whole list."""
    import json

    dist = top.get("distributedInfo")
    pgs = dist.get("pg_config") if isinstance(dist, dict) else None
    if not isinstance(pgs, list):
        return {}
    out = {}
    for g in pgs:
        if isinstance(g, dict) and "pg_name" in g:
            what = {k: g.get(k) for k in ("pg_desc", "pg_size", "ranks")}
            out[str(g["pg_name"])] = json.dumps(what, sort_keys=True, default=str)
    return out


def mixed_jobs(entries: list[dict[str, Any]]) -> str | None:
    """Why these sources (manifest entries, ``meta`` holding each file's top-level facts) are
    not the ranks of one job, in one line naming the files, or None: their world sizes differ,
    or a process group of one name is defined differently (other ranks, size or purpose) by
    two of them. Ranks listing different groups are one job when the groups they share agree
    (:func:`groups_of`)."""
    import hashlib

    jobs: list[tuple[Any, dict[str, str], list[str]]] = []
    for e in entries:
        top = e.get("meta") or {}
        world, _ = job_of(top)
        if world is None:
            continue
        mine = groups_of(top)
        for w, groups, names in jobs:
            if w == world and all(groups.get(k, v) == v for k, v in mine.items()):
                groups.update(mine)
                names.append(Path(e["path"]).name)
                break
        else:
            jobs.append((world, dict(mine), [Path(e["path"]).name]))
    if len(jobs) < 2:
        return None
    same_world = len({w for w, _, _ in jobs}) < len(jobs)

    def files(names: list[str]) -> str:
        shown = ", ".join(sorted(names)[:3])
        return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    def what(w: Any, groups: dict[str, str]) -> str:
        if not (same_world and groups):
            return f"world size {w}"
        digest = hashlib.sha256(repr(sorted(groups.items())).encode()).hexdigest()[:12]
        return f"world size {w}, process groups {digest}"

    parts = "; ".join(f"{what(w, g)}: {files(n)}" for w, g, n in sorted(
        jobs, key=lambda j: (j[0], sorted(j[2]))))  # fmt: skip
    return (f"these traces are ranks of different jobs ({parts}); import each job into its own "
            "store, or pass --mixed to keep them together (collectives are then compared "
            "within each job only)")  # fmt: skip


def _is_rank(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31


__all__ = ["RANK_FROM", "RankHint", "groups_of", "job_of", "mixed_jobs", "rank_from_name",
           "rank_hints", "source_rank"]  # fmt: skip

"""Many ranks capturing into one store at once (``docs/capture.md``, "Many ranks (torchrun)").

Chosen design: **one store, one part per rank, committed under the store's lock** — rather than
per-rank stores merged by a later import. Why it is sound: a store already has one commit
point (``manifest.json``, replaced in one rename) and one writer lock (``trace/lock.py``: flock,
dropped by the kernel when its holder dies, forwarded to the server on NFSv4); the part number
of a rank's files is its rank, so no two ranks of a job ever pick the same part or file name,
and the heavy work (normalising, writing Parquet) happens *outside* the lock, in each rank's own
hidden build folder beside the store. Under the lock a rank only re-reads the manifest, checks
that it may join, moves its files in and replaces the manifest (``store.commit_into``; the
first rank renames its build folder into place, ``store.commit_new``): milliseconds, so ranks
queue briefly instead of holding each other for a whole write. What a crash leaves:

* before the lock: a build folder of a dead process, removed by the next writer on that host
  (``store.clean_stale``); the store does not change;
* under the lock, before the manifest is replaced: moved files that no manifest lists, deleted
  by the next commit (``store.remove_unlisted``); the kernel frees the lock for the next rank;
* after: the rank's part is in the store, whole.

Another rank's part is never touched: a commit only adds files under new names and writes a
manifest that lists every part the previous one listed plus its own.

Who may join (:func:`join_problem`): every part already in the store must be a rank of the same
job (``xpuprof_capture.distributed.job``, see ``live/job.py``) with the same world size, and
none of them the joining rank. A store of a single-process capture or of imported files, a rank
of another job, or a rank that is already there (a second capture window of the same job with
the same ``out``) is refused in one line naming the store, the part and both jobs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from xpuprof.core.errors import StoreError, XpuprofError
from xpuprof.core.names import ID_SHIFT
from xpuprof.trace import store as st

#: How long a rank waits for the others' commits (seconds): each takes milliseconds, but
#: hundreds of ranks finishing together queue up, and a rank must not lose its capture.
JOIN_WAIT_S = 600.0

#: The largest part number a store admits (event ids are ``part << ID_SHIFT | index``).
MAX_PART = (1 << (63 - ID_SHIFT)) - 1


def _dist(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The distributed settings a part was captured with, or None."""
    cap = (entry.get("meta") or {}).get("xpuprof_capture")
    d = cap.get("distributed") if isinstance(cap, dict) else None
    return d if isinstance(d, dict) else None


def _who(entry: dict[str, Any]) -> str:
    d = _dist(entry) or {}
    cap = (entry.get("meta") or {}).get("xpuprof_capture") or {}
    return (f"part {entry['part']}: rank {entry.get('rank')} of world size "
            f"{d.get('world_size')}, job {d.get('job')}, pid {cap.get('pid')} on "
            f"{d.get('host') or entry.get('host')}")  # fmt: skip


def other_job(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when two ranks' distributed settings (``live/job.py``'s dicts) are not of one job:
    their job ids or world sizes differ. The one rule for a rank joining a store and for
    stores merged into one (``trace/merge.py``)."""
    return a.get("job") != b.get("job") or a.get("world_size") != b.get("world_size")


def join_problem(root: Path, sources: list[dict[str, Any]], me: dict[str, Any]) -> str | None:
    """Why the rank described by ``me`` (``live/job.py``'s dict) may not add its part to the
    store at ``root`` holding ``sources`` (manifest entries), in one line; None if it may."""
    mine = f"rank {me['rank']} of world size {me['world_size']}, job {me.get('job')}"
    # the part of the same rank first: its message is the one that explains most
    for s in sorted(sources, key=lambda s: s["part"] != me["rank"]):
        d = _dist(s)
        if d is None:
            return (f"{root}: holds {s.get('path')} (part {s['part']}), which is not a rank of "
                    f"a distributed capture; this process ({mine}) will not add its part to "
                    "it: give the job its own out")  # fmt: skip
        if other_job(d, me):
            same = " with the same rank" if s["part"] == me["rank"] else ""
            return (f"{root}: holds a capture of another job{same} ({_who(s)}); this process "
                    f"is {mine}: give each job its own out")  # fmt: skip
        if s["part"] == me["rank"]:
            return (f"{root}: rank {me['rank']} of this job is already in the store "
                    f"({_who(s)}); one capture window per rank and store: give each window "
                    "its own out")  # fmt: skip
    return None


def check_join(store: str | Path, me: dict[str, Any]) -> None:
    """Raise now (before anything is recorded) if the rank ``me`` could not join ``store``
    as it is; the commit checks again under the lock."""
    root = Path(store).resolve()
    _check_rank(root, me)
    if st.is_store(root):
        problem = join_problem(root, st.read_manifest(root, check_files=False)["sources"], me)
        if problem:
            raise XpuprofError(problem)
    else:
        _refuse_other_content(root)


def _refuse_other_content(root: Path) -> None:
    """A path that is not a store must be absent or an empty folder to become one."""
    if root.exists() and (root.is_file() or any(root.iterdir())):
        raise XpuprofError(f"{root}: exists and is not an xpuprof store; not writing into it")


def _check_rank(root: Path, me: dict[str, Any]) -> None:
    r = me.get("rank")
    if not isinstance(r, int) or not 0 <= r <= MAX_PART:
        raise XpuprofError(f"{root}: rank {r!r} cannot be a part of a store (0 to {MAX_PART})")


def add_rank_part(
    raw: Any, store: str | Path, me: dict[str, Any], *, lock_wait: float = JOIN_WAIT_S
) -> Any:
    """Write one rank's capture ``raw`` as part ``me['rank']`` of ``store``, creating the store
    if this is the first rank; return the :class:`~xpuprof.trace.ingest.ImportReport` of the
    store as this commit left it. Raises :class:`XpuprofError` (nothing written) when the rank
    may not join (:func:`join_problem`)."""
    from xpuprof.trace.ingest import ImportReport, write_raw

    t0 = time.perf_counter()
    root = Path(store).resolve()
    _check_rank(root, me)
    made = st.make_parents(root)
    try:
        # outside the lock: every rank normalises and writes its Parquet files at once
        staging, _ = st.begin_staging(root)
        try:
            entry = write_raw(raw, me["rank"], staging)
            with st.StoreLock(root, wait=lock_wait):
                manifest = _commit(root, staging, entry, me)
        finally:
            st.discard(staging)  # gone already after a new store's rename
    except BaseException as e:  # as every store write fails: no folder made for nothing
        if not root.exists():
            st.remove_parents(made)
        if isinstance(e, OSError):
            raise StoreError(st.io_message(e, root)) from None
        raise
    return ImportReport.of(root, manifest, t0, 1)


def _commit(root: Path, staging: Path, entry: dict[str, Any], me: dict[str, Any]) -> dict:
    """Under the store's lock: check that the rank may join the store as it is now, then add
    its part (or create the store with it); the new manifest."""
    st.clean_stale(root)
    old = st.read_manifest(root, check_files=False) if st.is_store(root) else None
    if old is None:
        _refuse_other_content(root)
    sources = old["sources"] if old is not None else []
    problem = join_problem(root, sources, me)
    if problem:
        raise XpuprofError(problem)
    manifest = st.new_manifest([*sources, entry])
    st.commit(root, staging, old, [entry], manifest)
    return manifest

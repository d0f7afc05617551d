"""Which rank of which distributed job this process is, for a capture (``docs/capture.md``,
"Many ranks (torchrun)").

:func:`detect` answers once per capture, at its start, with a plain dict (recorded in the part's
capture settings as ``xpuprof_capture.distributed``) or None for a single process:

``rank``, ``world_size``
    From ``torch.distributed`` when it is initialised (``get_rank``/``get_world_size`` of the
    default group; ``rank_from`` = ``torch.distributed``); else from the launcher's environment,
    in this order: ``RANK``/``WORLD_SIZE`` (torchrun, torch.distributed.launch, DeepSpeed,
    Accelerate), ``OMPI_COMM_WORLD_RANK``/``_SIZE`` (Open MPI), ``PMI_RANK``/``PMI_SIZE`` (MPICH,
    Intel MPI), ``SLURM_PROCID``/``SLURM_NTASKS`` (srun); ``LOCAL_RANK`` alone gives the rank
    with an unknown world size. MPI and Slurm variables count only for more than one task: every
    ``srun`` sets them, also for a single process.
``local_rank``, ``local_world_size``
    ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, else the MPI or Slurm equivalents; None if unset.
``host``
    ``socket.gethostname()``.
``backend``, ``pg_count``, ``pg_config``
    ``torch.distributed``'s backend, number of process groups and their definitions (what
    torch.profiler writes as ``distributedInfo``); None without ``torch.distributed``. The part
    keeps ``pg_config`` once, in its ``distributedInfo`` (``live/assemble.py``): a list of
    every group's ranks per rank would otherwise fill the manifest twice.
``job``, ``job_from``
    What every rank of one job shares and no other job has, so that a store can tell a rank of
    its own job from a late one of another job. With ``torch.distributed``: a random id that
    the first rank to ask puts in the job's rendezvous store (``compare_set`` on the default
    group's c10d store: no collective, no waiting for the other ranks; every later caller of the
    same job reads the first one's id). Without it: the launcher's job id
    (``TORCHELASTIC_RUN_ID`` with its restart count, ``SLURM_JOB_ID.SLURM_STEP_ID``,
    ``PMIX_NAMESPACE``), else the rendezvous address ``MASTER_ADDR:MASTER_PORT`` (weak: two
    runs of one script on the same port look alike; the store still refuses a rank that is
    already in it), else None (unknown: the store then checks the world size only).
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from typing import Any

#: The key of the job's id in torch.distributed's rendezvous store.
JOB_KEY = "xpuprof/job"

#: Launcher variables for (rank, world size, local rank, local world size), tried in order,
#: with the name recorded as ``rank_from``; the last field: count only for more than one task.
_LAUNCHERS = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RANK/WORLD_SIZE", False),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI", True),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI", True),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "Slurm", True),
)  # fmt: skip


def _int(name: str) -> int | None:
    """The environment variable ``name`` as a non-negative int, else None."""
    v = os.environ.get(name, "").strip()
    return int(v) if v.isdigit() else None


def _torch_dist() -> Any:
    """``torch.distributed`` if this process has initialised it (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        dist = torch.distributed
        return dist if dist.is_available() and dist.is_initialized() else None
    except Exception:  # a torch build without distributed support, half-initialised state
        return None


def detect() -> dict[str, Any] | None:
    """This process's place in a distributed job (see the module docstring), or None."""
    dist = _torch_dist()
    found = None
    for rank_v, size_v, local_v, local_size_v, name, needs_many in _LAUNCHERS:
        rank, size = _int(rank_v), _int(size_v)
        if rank is None or (needs_many and (size is None or size < 2)):
            continue
        found = (rank, size, _int(local_v), _int(local_size_v), name)
        break
    if found is None and _int("LOCAL_RANK") is not None:
        found = (_int("LOCAL_RANK"), None, _int("LOCAL_RANK"), _int("LOCAL_WORLD_SIZE"),
                 "LOCAL_RANK")  # fmt: skip
    if dist is None and found is None:
        return None
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "local_rank": found[2] if found else _int("LOCAL_RANK"),
        "local_world_size": found[3] if found else _int("LOCAL_WORLD_SIZE"),
        "backend": None,
        "pg_count": None,
        "pg_config": None,
    }
    if dist is not None:
        info.update(rank=int(dist.get_rank()), world_size=int(dist.get_world_size()),
                    rank_from="torch.distributed", backend=str(dist.get_backend()))  # fmt: skip
        try:
            info["pg_count"] = int(dist.get_pg_count())
            info["pg_config"] = dist.distributed_c10d._get_all_pg_configs()
        except Exception:  # private API: its absence loses the groups, not the capture
            pass
    else:
        assert found is not None
        info.update(rank=found[0], world_size=found[1], rank_from=found[4])
    info["job"], info["job_from"] = _job(dist, info["world_size"])
    return info


def _job(dist: Any, world_size: int | None) -> tuple[str | None, str | None]:
    """The job's id and where it came from (module docstring)."""
    if dist is not None:
        try:
            store = dist.distributed_c10d._get_default_store()
            got = store.compare_set(JOB_KEY, "", uuid.uuid4().hex)
            value = got.decode() if isinstance(got, bytes) else str(got)
            if value:
                return f"c10d:{value}", "torch.distributed store"
        except Exception:  # a store without compare_set: fall back to the launcher's id
            pass
    env = os.environ
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id != "none":
        return f"torchelastic:{run_id}:{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", (
            "TORCHELASTIC_RUN_ID"
        )
    if env.get("SLURM_JOB_ID", "").strip():
        return f"slurm:{env['SLURM_JOB_ID'].strip()}.{env.get('SLURM_STEP_ID', '')}", (
            "SLURM_JOB_ID"
        )
    if env.get("PMIX_NAMESPACE", "").strip():
        return f"pmix:{env['PMIX_NAMESPACE'].strip()}", "PMIX_NAMESPACE"
    if env.get("MASTER_ADDR", "").strip() and env.get("MASTER_PORT", "").strip():
        return (f"rendezvous:{env['MASTER_ADDR'].strip()}:{env['MASTER_PORT'].strip()}:"
                f"{world_size}", "MASTER_ADDR:MASTER_PORT")  # fmt: skip
    return None, None


def distributed_info(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` (from ``torch.distributed``) in the shape torch.profiler writes as a trace's
    ``distributedInfo`` (what the importer and ``Trace.job()`` read), for captures whose trace
    has none (levels step and layer) or lacks the process groups (torch's own, op level)."""
    out = {"backend": info["backend"], "rank": info["rank"], "world_size": info["world_size"]}
    if info.get("pg_config") is not None:
        out.update(pg_count=info["pg_count"], pg_config=info["pg_config"])
    return out

"""Which platform each part (source file ≈ rank) of a trace was recorded on: the one function
the advisor and the diagnosis ask before they word anything (CUDA advice on an NVIDIA GPU, HIP
and RCCL on AMD, XLA on a TPU, no vendor API at all on MTIA or a CPU run).

Evidence, per part, first that decides wins (``docs/advise.md`` lists it):

1. MTIA: events of a ``mtia_*`` category (``mtia_runtime``, ``mtia_ccp_events``) or a device
   named like Meta's accelerators (``MTIA``, ``ARTEMIS``);
2. TPU: an XPlane source with a ``/device:TPU:n`` plane (XLA on TPU);
3. AMD: HIP runtime calls (``hip*``) or an AMD device name (``AMD``, ``Instinct``, ``MI2xx``);
4. NVIDIA: CUDA runtime or driver calls (``cuda*``, ``cu[A-Z]*``), an NVIDIA device name, or an
   XPlane ``/device:GPU`` plane (XLA on GPU);
5. another accelerator: device events and none of the above (``unknown``);
6. CPU: no device events at all.

Besides the vendor: the collective library (NCCL, RCCL — AMD's NCCL keeps NCCL's kernel
names —, XLA's collectives, gloo), whether work already runs inside CUDA/HIP graphs
(``cudaGraphLaunch``/``hipGraphLaunch`` calls), and whether PyTorch recorded ``cuda_sync`` events.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from collections.abc import Iterable

    from xpuprof.trace.trace import Trace

VENDORS = ("nvidia", "amd", "tpu", "mtia", "unknown", "cpu")

_AMD_NAME = re.compile(r"\bAMD\b|Instinct|Radeon|\bMI\d{3}|gfx9", re.IGNORECASE)
_NVIDIA_NAME = re.compile(
    r"NVIDIA|Tesla|Quadro|GeForce|RTX|\b[AHBLT]\d{2,3}\b|\bV100|\bP100|\bGH200|\bGB200",
    re.IGNORECASE,
)
_MTIA_NAME = re.compile(r"MTIA|ARTEMIS|FREYA", re.IGNORECASE)

#: Runtime calls that launch device work from a captured graph (one call, many kernels).
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cudaGraphLaunch_v10000", "hipGraphLaunch",
                  "cuGraphLaunch")  # fmt: skip


@dataclass(frozen=True)
class Platform:
    """What one part ran on. ``vendor``: one of :data:`VENDORS`; ``runtime``: the device API
    the advice may name (``CUDA``, ``HIP``, ``XLA``, ``MTIA``, or ``""``); ``collectives``:
    ``NCCL``, ``RCCL``, ``XLA``, ``gloo`` or ``""``; ``framework``: ``pytorch`` (Kineto),
    ``xla`` (XPlane: JAX, TensorFlow or PyTorch/XLA) or ``unknown``; ``device``: the device
    name when the trace gives one; ``graph_launches``: calls that replay CUDA/HIP graphs;
    ``cuda_sync_events``: PyTorch's ``cuda_sync`` records (host waits are explicit)."""

    part: int
    rank: int | None
    vendor: str
    runtime: str
    collectives: str
    framework: str
    device: str | None
    graph_launches: int
    cuda_sync_events: int

    @property
    def gpu(self) -> bool:
        """An NVIDIA or AMD GPU: the platforms with kernel launches, streams and graphs."""
        return self.vendor in ("nvidia", "amd")


_QUERY = """
select part,
  count(*) filter (where level in ('kernel', 'collective', 'memcpy', 'memset')) as device,
  count(*) filter (where lower(category) like 'mtia%') as mtia,
  count(*) filter (where level = 'runtime' and name like 'hip%') as hip,
  count(*) filter (where level = 'runtime' and (name like 'cuda%'
                   or regexp_matches(name, '^cu[A-Z]'))) as cuda,
  count(*) filter (where level = 'runtime' and name in {graph}) as graphs,
  count(*) filter (where lower(category) = 'cuda_sync') as cuda_sync,
  count(*) filter (where category like 'xla%') as xla,
  count(*) filter (where contains(lower(name), 'nccl') or contains(lower(name), 'rccl'))
    as nccl
from events group by part
"""


def platforms(trace: Trace, *, ranks: Iterable[int] | None = None) -> pd.DataFrame:
    """One row per part (of the selected ranks): the :class:`Platform` fields as columns."""
    wanted = None if ranks is None else {int(r) for r in ranks}
    rows = [asdict(p) for p in _all(trace).values()
            if wanted is None or (p.rank if p.rank is not None else 0) in wanted]  # fmt: skip
    cols = list(Platform.__dataclass_fields__)
    return pd.DataFrame(rows, columns=cols)


def platform_of(trace: Trace, part: int) -> Platform:
    """The platform of one part (see the module docstring)."""
    return _all(trace)[int(part)]


def _all(trace: Trace) -> dict[int, Platform]:
    key = ("analysis.platform",)
    if key not in trace.memo:
        counts = trace.sql(_QUERY.replace("{graph}", str(GRAPH_LAUNCHES)))
        by_part = {int(r.part): r for r in counts.itertuples(index=False)}
        out = {}
        for src in trace.sources:
            part = int(src["part"])
            out[part] = _detect(src, by_part.get(part), trace.meta)
        trace.memo[key] = out
    return trace.memo[key]


def _device_names(src: dict, meta: dict) -> list[str]:
    props = meta.get("device_properties", {}).get(src["part"]) or []
    names = [str(p.get("name")) for p in props if isinstance(p, dict) and p.get("name")]
    for plane in (src.get("meta") or {}).get("planes") or []:
        if isinstance(plane, dict):
            stats = plane.get("stats") or {}
            if stats.get("device_type_string"):
                names.append(str(stats["device_type_string"]))
    return names


def _detect(src: dict, c, meta: dict) -> Platform:
    """Apply the module docstring's order to one part's counts (``c``: a row of _QUERY)."""
    fmt = str(src.get("format") or "")
    planes = [str(p.get("name", "")) for p in (src.get("meta") or {}).get("planes") or []
              if isinstance(p, dict)]  # fmt: skip
    names = _device_names(src, meta)
    name = next(iter(names), None)
    n = lambda f: int(getattr(c, f)) if c is not None else 0  # noqa: E731
    dist = meta.get("distributed_info", {}).get(src["part"]) or {}
    backend = str(dist.get("backend") or "").lower() if isinstance(dist, dict) else ""
    framework = "xla" if fmt == "xplane" or n("xla") else ("pytorch" if fmt == "kineto"
                                                            else "unknown")  # fmt: skip
    if n("mtia") or any(_MTIA_NAME.search(x) for x in names):
        vendor, runtime, coll = "mtia", "MTIA", ""
    elif any("/device:TPU" in p for p in planes) or any("TPU" in x for x in names):
        vendor, runtime, coll = "tpu", "XLA", "XLA"
    elif n("hip") or any(_AMD_NAME.search(x) for x in names):
        vendor, runtime, coll = "amd", "HIP", "RCCL" if n("nccl") or backend == "nccl" else ""
    elif (n("cuda") or any(_NVIDIA_NAME.search(x) for x in names)
          or any("/device:GPU" in p for p in planes)):  # fmt: skip
        vendor, runtime = "nvidia", "XLA" if framework == "xla" else "CUDA"
        coll = "NCCL" if n("nccl") or backend == "nccl" else ""
    elif n("device"):
        vendor, runtime, coll = "unknown", "", ""
    else:
        vendor, runtime, coll = "cpu", "", ""
    if not coll and backend == "gloo":
        coll = "gloo"
    return Platform(
        part=int(src["part"]), rank=src.get("rank"), vendor=vendor, runtime=runtime,
        collectives=coll, framework=framework, device=name, graph_launches=n("graphs"),
        cuda_sync_events=n("cuda_sync"),
    )  # fmt: skip

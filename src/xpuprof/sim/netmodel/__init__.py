"""Collective models: how long a collective takes on a given machine, three ways, and a replay
cost model built on them (``docs/netmodel.md``).

- ``topology``: links (NVLink/NVSwitch, PCIe, InfiniBand/RoCE) with NCCL's bandwidths, GPUs per
  node, nodes, the rings NCCL's search builds, and presets (DGX-1 V100, a V100 NVLink pair,
  DGX A100, DGX H100, a PCIe Gen4 box);
- ``alphabeta``: Thakur–Rabenseifner–Gropp alpha–beta formulas and nccl-tests' bus bandwidth;
- ``nccl``: NCCL's tuning model (latency + bytes / bandwidth per algorithm and protocol, least
  time wins) and its launch rule (channels and threads per kernel);
- ``chunksim``: a chunk-level simulation of ring collectives on per-link FIFOs;
- ``costs``: :class:`CollectiveCosts`, a replay cost model (``sim/costs``' contract) that gives
  each collective the time a model predicts for a topology, algorithm, protocol, channel count
  and world size.

This is not ``sim/collectives.py``, which matches collectives across ranks in the replay graph.
"""

from xpuprof.sim.netmodel.chunksim import ChunkModel, SimResult
from xpuprof.sim.netmodel.costs import CollectiveCosts, collective_table, predict_us
from xpuprof.sim.netmodel.nccl import Choice, NcclModel, launch, protocol_from_threads
from xpuprof.sim.netmodel.topology import PRESETS, Link, NetModelError, Topology, preset

__all__ = [
    "PRESETS",
    "Choice",
    "ChunkModel",
    "CollectiveCosts",
    "Link",
    "NcclModel",
    "NetModelError",
    "SimResult",
    "Topology",
    "collective_table",
    "launch",
    "predict_us",
    "preset",
    "protocol_from_threads",
]

"""Where the collectives run: links, GPUs per node, nodes, and the rings NCCL builds on them.

Units are NCCL's own: bandwidth in GB/s (10⁹ bytes/s, = bytes/ns) *per direction*, latency in
µs. Link bandwidths are the numbers NCCL's topology code assigns (``src/graph/topo.h``,
NVIDIA/nccl), not the datasheet's: NCCL counts an NVLink 2/3 link as 20 GB/s
(``SM70_NVLINK_BW``, ``SM80_NVLINK_BW``; the datasheet says 25 GB/s per direction), an NVLink 4
link as 20.6 (``SM90_NVLINK_BW``), NVLink 5 as 40.1 (``SM100_NVLINK_BW``), a PCIe x16 link as
width × lane speed / 80 (``topo.cc``: Gen3 8 GT/s → 60 → 12 GB/s, ``PCI_BW``; Gen4 24; Gen5 48),
and a NIC as its port speed / 8 (HDR 200 Gb/s → 25 GB/s; ``NET_BW`` 12 is 100 Gb/s).

*The ring search* (:meth:`Topology.ring_graph`) is a simplified ``ncclTopoCompute``
(``src/graph/search.cc``): the per-channel bandwidth is the first entry of NCCL's speed array
for the architecture (``speedArrayIntra`` {40, 30, 20, 18, 15, 12, 10, 9, 7, 6, 5, 4, 3} before
Hopper, ``sm90SpeedArrayIntra`` {60, 50, 40, 30, 24, 20, 15, 12, 11, 6, 3},
``sm100SpeedArrayIntra`` {90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18}; the ``Inter`` arrays
across nodes) that is at most the bandwidth of one ring hop (``maxBw``: the best GPU → GPU
path; across nodes the NIC); the number of channels is how many of those fit in a GPU's total
bandwidth (``totalBw``; across nodes one per NIC), at most ``MAXCHANNELS/2`` = 32. Then
``ncclTopoDupChannels``: a graph at ≥ 25 GB/s per channel is duplicated (twice the channels at
half the bandwidth; on Hopper and later not when < 50 GB/s with more than 4 channels). The
communicator then runs twice the graph's channels (``connect.cc``: ``nChannels * 2``, at most
``MAXCHANNELS``: 64 on master, 32 in older releases), which is the grid size of an NCCL kernel
in a trace. NCCL searches the real link graph; here the hop and total bandwidths are given
per preset, which is exact for a switch (every hop is the GPU's uplink) and for the presets
below (their hop bandwidth is the link rings can use all around). Trees use the ring's
channels and bandwidth (NCCL searches them separately, usually with the same result on one
node).

*Presets* (:data:`PRESETS`), each with its source:

- ``dgx1-v100``: 8 × V100 SXM2, NVLink 2 hybrid cube-mesh, 6 links per GPU (NVIDIA, "DGX-1 with
  Tesla V100 System Architecture", WP-08437-002: six NVLinks per GPU, 25 GB/s per direction
  each); rings use single links (20 GB/s), a GPU's total is 6 × 20 = 120 → 6 graph channels,
  12 in the communicator (the 12-block NCCL kernels of the shared 8-rank DLRM trace).
- ``v100-nvlink-pair``: two V100 SXM2 joined by one NVLink 2 link (a pair of neighbours of that
  mesh, as GPU0–GPU1 of a DGX-1V): 1 graph channel at 20 GB/s, 2 in the communicator (the
  2-block kernels of the shared 2-rank V100 trace).
- ``dgx-a100``: 8 × A100 SXM4 on NVSwitch, 12 NVLink 3 links per GPU (NVIDIA DGX A100 User
  Guide / A100 datasheet: 600 GB/s bidirectional = 12 × 25 per direction) → 12 × 20 = 240 GB/s
  per GPU; 8 HDR InfiniBand NICs of 200 Gb/s for the compute fabric (DGX A100 datasheet).
- ``dgx-h100``: 8 × H100 SXM5 on NVSwitch, 18 NVLink 4 links per GPU (H100 datasheet: 900 GB/s
  bidirectional) → 18 × 20.6 = 370.8; 8 ConnectX-7 400 Gb/s NICs = 50 GB/s (DGX H100 datasheet).
- ``pcie-gen4``: 8 GPUs on PCIe Gen4 x16 without NVLink (an 8 × A100 PCIe server): 24 GB/s per
  GPU, one ring hop through the PCIe switch; LL128 is off (NCCL enables it only over NVLink).

Per-hop latencies are not part of a topology: NCCL's tuner keeps them per link kind, algorithm
and protocol (``sim/netmodel/nccl.py``); a :class:`Link` may override them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from xpuprof.core.errors import XpuprofError

__all__ = ["ARCHES", "PRESETS", "Link", "NetModelError", "RingGraph", "Topology", "preset"]

#: GPU architectures whose constants NCCL's tuner distinguishes, and their compute capability.
ARCHES = {"volta": 70, "ampere": 80, "hopper": 90, "blackwell": 100}

#: NCCL's per-channel speed arrays (GB/s), ``src/graph/search.cc``.
SPEEDS_INTRA = {
    "pre90": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "sm90": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "sm100": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
SPEEDS_INTER = {
    "pre90": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
              3.0, 2.4, 1.2, 0.24, 0.12),
    "sm90": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
             1.2, 0.24, 0.12),
    "sm100": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0,
              12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
}  # fmt: skip
#: ``MAXCHANNELS`` (communicator, ``device.h``) and a ring graph's ``maxChannels``
#: (``MAXCHANNELS/2``, ``init.cc``).
MAX_CHANNELS = 64
MAX_GRAPH_CHANNELS = MAX_CHANNELS // 2

LINK_KINDS = ("nvlink", "pcie", "net")


class NetModelError(XpuprofError):
    """A topology, collective or model setting the collective models cannot use."""


@dataclass(frozen=True)
class Link:
    """One kind of link: ``kind`` (``nvlink``, ``pcie`` or ``net``), ``bandwidth`` (GB/s per
    direction, as NCCL counts it; module docstring) and, optionally, ``latency_us`` (per hop;
    None: NCCL's per-hop latency for the kind, algorithm and protocol)."""

    kind: str
    bandwidth: float
    latency_us: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS:
            raise NetModelError(f"link kind {self.kind!r}: expected one of {LINK_KINDS}")
        if not self.bandwidth > 0:
            raise NetModelError(f"link bandwidth {self.bandwidth!r} GB/s: must be > 0")
        if self.latency_us is not None and self.latency_us < 0:
            raise NetModelError(f"link latency {self.latency_us!r} µs: must be ≥ 0")


@dataclass(frozen=True)
class RingGraph:
    """What NCCL's search finds: ``graph_channels`` rings of ``bandwidth`` GB/s each (per
    direction), run by ``channels`` communicator channels (twice the graph's)."""

    graph_channels: int
    bandwidth: float
    channels: int

    @property
    def bus_bandwidth(self) -> float:
        """graph channels × per-channel bandwidth: NCCL's ``busBw`` before protocol factors."""
        return self.graph_channels * self.bandwidth


@dataclass(frozen=True)
class Topology:
    """GPUs in ``nodes`` nodes of ``gpus_per_node``. Inside a node, ``intra`` is one ring hop
    (its bandwidth: the best GPU → GPU path, NCCL's ``maxBw``) and ``intra_total`` a GPU's
    total bandwidth into the node's fabric (``totalBw``); across nodes, ``inter`` is a NIC and
    ``nics_per_node`` how many there are. ``arch`` picks NCCL's per-architecture constants."""

    name: str
    arch: str
    gpus_per_node: int
    intra: Link
    intra_total: float
    nodes: int = 1
    inter: Link | None = None
    nics_per_node: int = 1
    source: str = ""

    def __post_init__(self) -> None:
        if self.arch not in ARCHES:
            raise NetModelError(f"architecture {self.arch!r}: expected one of {sorted(ARCHES)}")
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise NetModelError(f"topology {self.name!r}: gpus_per_node and nodes must be ≥ 1")
        if self.intra.kind == "net":
            raise NetModelError(f"topology {self.name!r}: the intra-node link cannot be 'net'")
        if self.intra_total < self.intra.bandwidth:
            raise NetModelError(f"topology {self.name!r}: intra_total {self.intra_total} GB/s is "
                                f"below one hop's {self.intra.bandwidth} GB/s")  # fmt: skip
        if self.nodes > 1 and self.inter is None:
            raise NetModelError(f"topology {self.name!r}: {self.nodes} nodes need an inter link")

    @property
    def ranks(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def compute_capability(self) -> int:
        return ARCHES[self.arch]

    def for_ranks(self, p: int) -> Topology:
        """The same machine running a job of ``p`` ranks: whole nodes of ``gpus_per_node``
        (fewer GPUs on one node when ``p`` is smaller). Raises for ``p`` < 1, and for more
        than one node without an inter-node link."""
        if p < 1:
            raise NetModelError(f"a collective of {p} ranks: need at least 1")
        nodes = math.ceil(p / self.gpus_per_node)
        if nodes > 1 and self.inter is None:
            raise NetModelError(f"{p} ranks need {nodes} nodes of {self.gpus_per_node} GPUs, but "
                                f"topology {self.name!r} has no inter-node link: give it one "
                                "(Topology.inter) or use a larger node")  # fmt: skip
        return replace(self, gpus_per_node=min(p, self.gpus_per_node) if nodes == 1
                       else self.gpus_per_node, nodes=nodes)  # fmt: skip

    def ring_graph(self) -> RingGraph:
        """The rings NCCL's search would build (module docstring)."""
        cc = self.compute_capability
        key = "sm100" if cc >= 100 else "sm90" if cc >= 90 else "pre90"
        if self.nodes == 1:
            hop, total, speeds = self.intra.bandwidth, self.intra_total, SPEEDS_INTRA[key]
        else:
            assert self.inter is not None
            hop = min(self.inter.bandwidth, self.intra.bandwidth)
            total, speeds = self.inter.bandwidth * self.nics_per_node, SPEEDS_INTER[key]
        speed = next((s for s in speeds if s <= hop and s <= total), speeds[-1])
        n = max(1, min(MAX_GRAPH_CHANNELS, int(total // speed + 1e-9)))
        # ncclTopoDupChannels
        if speed >= 25 and not (cc > 80 and speed < 50 and n > 4):
            dup = min(2 * n, MAX_GRAPH_CHANNELS)
            speed /= math.ceil(dup / n)
            n = dup
        return RingGraph(graph_channels=n, bandwidth=speed, channels=min(MAX_CHANNELS, 2 * n))

    @property
    def ll128(self) -> bool:
        """Whether NCCL enables LL128 by default: only when GPUs talk over NVLink (``tuning.cc``:
        ``typeIntra <= PATH_NVB``), on Volta or later."""
        return self.intra.kind == "nvlink" and self.compute_capability >= 70


def _nvlink(arch: str, links: int) -> float:
    per = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}[arch]
    return per * links


PRESETS: dict[str, Topology] = {
    "dgx1-v100": Topology(
        name="dgx1-v100", arch="volta", gpus_per_node=8,
        intra=Link("nvlink", _nvlink("volta", 1)), intra_total=_nvlink("volta", 6),
        inter=Link("net", 12.0), nics_per_node=4,
        source="NVIDIA WP-08437-002 (DGX-1 with Tesla V100): 6 NVLink 2 links per GPU, hybrid "
               "cube-mesh; 4 × 100 Gb/s InfiniBand EDR; NCCL topo.h SM70_NVLINK_BW 20"),
    "v100-nvlink-pair": Topology(
        name="v100-nvlink-pair", arch="volta", gpus_per_node=2,
        intra=Link("nvlink", _nvlink("volta", 1)), intra_total=_nvlink("volta", 1),
        source="two neighbours of the DGX-1V mesh joined by one NVLink 2 link (GPU0-GPU1); NCCL "
               "topo.h SM70_NVLINK_BW 20"),
    "dgx-a100": Topology(
        name="dgx-a100", arch="ampere", gpus_per_node=8,
        intra=Link("nvlink", _nvlink("ampere", 12)), intra_total=_nvlink("ampere", 12),
        inter=Link("net", 25.0), nics_per_node=8,
        source="NVIDIA DGX A100 datasheet: 6 NVSwitches, 600 GB/s NVLink 3 per GPU (12 links), "
               "8 × 200 Gb/s HDR InfiniBand; NCCL topo.h SM80_NVLINK_BW 20"),
    "dgx-h100": Topology(
        name="dgx-h100", arch="hopper", gpus_per_node=8,
        intra=Link("nvlink", _nvlink("hopper", 18)), intra_total=_nvlink("hopper", 18),
        inter=Link("net", 50.0), nics_per_node=8,
        source="NVIDIA DGX H100 datasheet: 4 NVSwitches, 900 GB/s NVLink 4 per GPU (18 links), "
               "8 × 400 Gb/s ConnectX-7; NCCL topo.h SM90_NVLINK_BW 20.6"),
    "pcie-gen4": Topology(
        name="pcie-gen4", arch="ampere", gpus_per_node=8,
        intra=Link("pcie", 24.0), intra_total=24.0, inter=Link("net", 25.0), nics_per_node=2,
        source="8 GPUs on PCIe Gen4 x16 (16 GT/s: 16 lanes × 120 / 80 = 24 GB/s in NCCL's "
               "topo.cc), no NVLink; 2 × 200 Gb/s NICs"),
}  # fmt: skip


def preset(name: str | Topology) -> Topology:
    """A preset by name (or a topology itself)."""
    if isinstance(name, Topology):
        return name
    try:
        return PRESETS[name]
    except KeyError:
        raise NetModelError(f"unknown topology {name!r}; presets: "
                            f"{', '.join(sorted(PRESETS))}") from None  # fmt: skip

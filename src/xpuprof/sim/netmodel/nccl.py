"""NCCL's own tuning model: per (collective, algorithm, protocol) a latency and a bandwidth,
time = latency + bytes / bandwidth, and the (algorithm, protocol) of least time wins; plus the
launch rule that gives each kernel its channels and threads.

Every constant is NVIDIA/nccl's (``src/graph/tuning.cc``, ``src/enqueue.cc``,
``src/include/device.h``, ``comm.h``; master at commit 5067397c, June 2026, whose values
``../shared/REFERENCE.md`` quotes), read and re-expressed here:

*Latencies* (µs). Base, per algorithm × protocol [LL, LL128, Simple]: Tree {6.8, 14, 8.4},
Ring {6.6, 14, 8.4}. Per hop, per link kind × algorithm × protocol: NVLink Tree {0.6, 1.25,
4.0}, Ring {0.6, 1.9, 3.4}; PCIe Tree {1.0, 1.9, 4.0}, Ring {1.0, 2.5, 5.7}; network Tree {5.0,
8.5, 14}, Ring {2.7, 4.0, 14}. Ring all-reduce / all-gather / reduce-scatter: base + (steps −
inter-node steps) × intra hop + inter-node steps × network hop, steps = 2(p − 1) for all-reduce
and p − 1 for all-gather and reduce-scatter, inter-node steps 2(nodes − 1) resp. nodes − 1; the
intra hop is at least the network post overhead (1 µs, ×3 for Simple; x86 Intel) across
nodes. Ring broadcast / reduce: base + one hop (``sameChannels``). Tree all-reduce: base +
2 × ((p/nodes − 1) × intra hop + log₂(nodes) × network hop) (the network hop of Tree when one
rank per node).

*Bandwidths* (GB/s). busBw = graph channels × per-channel bandwidth (``topology.py``), then:
Ring LL min(llMaxBw, busBw × 0.5) (an LL line is 8 payload bytes of 16); Ring LL128
min(busBw × 0.92, channels × perChMaxRingLL128Bw) (0.92 ≈ 120 of 128 bytes, as tuning.cc
writes it); Tree all-reduce min(busBw × 0.92, channels × perChMaxTreeBw), then Tree LL
min(that / 3.8, llMaxBw), Tree LL128 min(that × 7/9 on one node, × 120/128 across nodes;
channels × perChMaxTreeLL128Bw). Per architecture (Volta, Ampere, Hopper, Blackwell) × [1 node,
2 nodes, more]: llMaxBw {39, 39, 20.4}, {87.7, 22.5, 19}, {141, 45, 35}, {282, 90, 70} (one node:
by GPU; across nodes tuning.cc indexes by CPU, Intel = the Volta row); perChMaxRingLL128Bw 20,
20, 36.7, 40; perChMaxTreeLL128Bw {20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 29}, {55.6, 31.67,
20}; perChMaxTreeBw {26.5, 18.5, 10}, {24, 23.6, 17.8}, {38.7, 41.4, 36}, {70, 42.8, 24}. Bus
bandwidth → algorithm bandwidth: Ring × p / steps (steps = p for broadcast and reduce), Tree ×
0.5. Tree all-reduce bandwidth is multiplied by ``treeCorrectionFactor`` [protocol][log₂(bytes
/ 64)] (24 values per protocol, powers of two from 64 B). Ring Simple all-reduce across nodes
with bytes / (channels × p) ≥ 64: latency × 1.9 before Ampere, × 1.4 after ("plateau").

*What is enabled*: Tree only for all-reduce; Ring for every collective; LL128 only over NVLink
(``Topology.ll128``); NVLS, CollNet and PAT are not modelled (NVSwitch multicast, in-network
reduction and the one-GPU-per-node PAT need hardware or plug-ins this model does not describe).

*Launch rule* (``enqueue.cc`` ``topoGetAlgoInfo``): from the communicator's channels c and the
protocol's maximum threads t (LL 512, LL128 640, Simple 512, or 256 when the ring's bandwidth is
at most PCIe Gen3's 12 GB/s), while bytes < c × t × threshold: drop a channel while c ≥ 2,
then halve t while it is a multiple of 128. Thresholds: LL 8 × p (Ring) or 8, LL128 8, Simple
64. Simple adds a warp (Ring) or four (Tree); NCCL ≥ 2.19 raises t to at least 3 warps (96)
and runs Tree with 640. So a kernel's grid is its channels and its block its threads — which
is how :func:`protocol_from_threads` tells the protocol of NCCL < 2.19 kernels, all of which
are named after their ``RING_LL`` entry point whatever ran.

*Protocol step sizes* (the chunk-level simulation's chunks): buffers of 8 steps
(``NCCL_STEPS``): LL 8 lines × 512 threads × 8 steps × 16 B = 512 KiB, so 64 KiB per step of
which 32 KiB payload; LL128 120 × 640 × 8 × 8 B, 600 KiB per step, 15/16 payload (562.5 KiB);
Simple 4 MiB, 512 KiB per step, a ring all-reduce / all-gather / reduce-scatter chunk being 4
steps (2 MiB) sent as 2 slices (``ALLREDUCE_CHUNKSTEPS`` = 4, ``SLICESTEPS`` = 2).

What this time is: NCCL's estimate of a whole call, launch included; a kernel's duration in a
trace is the device part, so for small messages the model sits above the lower envelope of
measured kernels on some machines and below it on others (``docs/netmodel.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from xpuprof.sim.netmodel.topology import NetModelError, Topology, preset

__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "PROTOCOLS",
    "Choice",
    "NcclModel",
    "launch",
    "protocol_from_threads",
]

ALGORITHMS = ("tree", "ring")
PROTOCOLS = ("LL", "LL128", "Simple")
#: Collectives NCCL's tuner prices (its ``ncclFunc*``), under xpuprof's canonical names.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")

#: Base latency (µs) per algorithm, [LL, LL128, Simple]; per-hop latencies per link kind.
BASE_LATENCY = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
_HOP = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "pcie": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
#: Per-architecture bandwidth caps (GB/s), rows Volta … Blackwell, columns 1 / 2 / more nodes.
_ARCH_ROW = {"volta": 0, "ampere": 1, "hopper": 2, "blackwell": 3}
_LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
_RING_LL128_BW = (20.0, 20.0, 36.7, 40.0)
_TREE_LL128_BW = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0),
                  (55.6, 31.67, 20.0))  # fmt: skip
_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
_TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
           1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9, .9),
}  # fmt: skip
#: Network post overhead (µs), x86 Intel (``getNetOverhead``); ×3 for Simple.
NET_OVERHEAD_US = 1.0
#: Launch rule constants (``device.h``, ``comm.h``).
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
WARP = 32
PCI_BW = 12.0
#: Payload bytes per NCCL step of one channel, and slices per step (module docstring).
STEP_PAYLOAD = {"LL": 32 * 1024, "LL128": 614400 // 16 * 15, "Simple": 512 * 1024}
CHUNK_STEPS = {"LL": 1, "LL128": 1, "Simple": 4}
SLICES_PER_CHUNK = {"LL": 1, "LL128": 1, "Simple": 2}


def norm_protocol(p: str | None) -> str | None:
    """``"ll128"``, ``"SIMPLE"`` … → ``"LL128"``, ``"Simple"`` (None and NaN: None)."""
    if p is None or p != p:
        return None
    for q in PROTOCOLS:
        if str(p).lower() == q.lower():
            return q
    raise NetModelError(f"protocol {p!r}: expected one of {PROTOCOLS}")


def norm_algorithm(a: str | None) -> str | None:
    """``"RING"``, ``"Tree"`` … → ``"ring"``, ``"tree"`` (None and NaN: None)."""
    if a is None or a != a:
        return None
    if str(a).lower() in ALGORITHMS:
        return str(a).lower()
    raise NetModelError(f"algorithm {a!r}: this model has {ALGORITHMS} (NVLS, CollNet and PAT "
                        "are not modelled)")  # fmt: skip


def _log2i(x: int) -> int:
    return int(x).bit_length() - 1 if x > 0 else -1


@dataclass(frozen=True)
class Choice:
    """The model's answer for one collective: ``algorithm``, ``protocol``, predicted time (µs),
    its ``latency_us`` and ``bandwidth`` (GB/s, algorithm bandwidth) terms."""

    algorithm: str
    protocol: str
    time_us: float
    latency_us: float
    bandwidth: float


class NcclModel:
    """NCCL's tuning tables for a topology and a group of ``ranks`` (module docstring).

    ``channels`` overrides the communicator's channel count (busBw scales with it: each
    channel keeps its share of the bandwidth NCCL's search found)."""

    def __init__(self, topology: Topology | str, ranks: int, channels: int | None = None):
        if ranks < 1:
            raise NetModelError(f"a collective of {ranks} ranks: need at least 1")
        self.topology = preset(topology).for_ranks(ranks)
        self.ranks = ranks
        self.graph = self.topology.ring_graph()
        if channels is not None and channels < 1:
            raise NetModelError(f"channels={channels}: need at least 1")
        self.channels = channels or self.graph.channels
        # each communicator channel's share of the graph's bus bandwidth
        self.bus_bw = self.graph.bus_bandwidth * self.channels / self.graph.channels
        self.graph_channels = self.graph.graph_channels * self.channels / self.graph.channels

    # -- the tables ------------------------------------------------------------------------

    def steps(self, collective: str) -> int:
        p = self.ranks
        return 2 * (p - 1) if collective == "all_reduce" else p - 1 if collective in (
            "all_gather", "reduce_scatter") else p  # fmt: skip

    def hop_us(self, kind: str, algorithm: str, protocol: str) -> float:
        """Per-hop latency of a link kind: the topology's own when it gives one, else NCCL's."""
        link = self.topology.intra if kind != "net" else self.topology.inter
        if link is not None and link.latency_us is not None:
            return link.latency_us
        return _HOP[kind][algorithm][PROTOCOLS.index(protocol)]

    def enabled(self, collective: str, algorithm: str, protocol: str) -> bool:
        if collective not in COLLECTIVES:
            return False
        if algorithm == "tree" and collective != "all_reduce":
            return False
        return not (protocol == "LL128" and not self.topology.ll128)

    def bandwidth(self, collective: str, algorithm: str, protocol: str) -> float:
        """Algorithm bandwidth (GB/s) before the size-dependent tree correction; 0 when the
        combination is disabled."""
        if not self.enabled(collective, algorithm, protocol):
            return 0.0
        t = self.topology
        row = _ARCH_ROW[t.arch]
        col = min(t.nodes, 3) - 1
        ll_row = row if t.nodes == 1 else 0  # across nodes: by CPU; Intel is the first row
        ll_max = _LL_MAX_BW[ll_row][col]
        ch = self.graph_channels
        bus = self.bus_bw
        if algorithm == "ring" and protocol == "LL":
            bus = min(ll_max, bus * 0.5)
        if algorithm == "ring" and protocol == "LL128":
            bus = min(bus * 0.92, ch * _RING_LL128_BW[row])
        if algorithm == "tree":
            bus = min(bus * 0.92, ch * _TREE_BW[row][col])
            if protocol == "LL":
                bus = min(bus / 3.8, ll_max)
            if protocol == "LL128":
                bus = min(bus * (7.0 / 9.0 if t.nodes == 1 else 120.0 / 128.0),
                          ch * _TREE_LL128_BW[row][col])  # fmt: skip
        ratio = self.ranks / self.steps(collective) if algorithm == "ring" else 0.5
        return bus * ratio

    def latency(self, collective: str, algorithm: str, protocol: str) -> float:
        """Latency (µs) of one call (module docstring)."""
        t = self.topology
        k = PROTOCOLS.index(protocol)
        lat = BASE_LATENCY[algorithm][k]
        intra = self.hop_us(t.intra.kind, algorithm, protocol)
        ppn = self.ranks / t.nodes
        inter = self.hop_us("net", "tree" if ppn == 1 else algorithm, protocol) if (
            t.nodes > 1) else 0.0  # fmt: skip
        if algorithm == "ring":
            if collective in ("broadcast", "reduce"):
                return lat + intra
            if t.nodes > 1:
                intra = max(intra, NET_OVERHEAD_US * (3 if protocol == "Simple" else 1))
            steps = self.steps(collective)
            inter_steps = 0 if t.nodes == 1 else (
                2 * (t.nodes - 1) if collective == "all_reduce" else t.nodes - 1)  # fmt: skip
            return lat + (steps - inter_steps) * intra + inter_steps * inter
        return lat + 2 * ((ppn - 1) * intra + _log2i(t.nodes) * inter)

    def time_us(self, collective: str, nbytes: float, algorithm: str, protocol: str) -> float:
        """NCCL's ``ncclTopoGetAlgoTime`` for one call; NaN when disabled."""
        bw = self.bandwidth(collective, algorithm, protocol)
        if bw <= 0:
            return math.nan
        lat = self.latency(collective, algorithm, protocol)
        log_size = _log2i(int(nbytes) >> 6)
        if algorithm == "tree" and collective == "all_reduce" and 0 <= log_size < 23:
            bw *= _TREE_CORRECTION[protocol][log_size]
        if (algorithm == "ring" and protocol == "Simple" and self.topology.nodes > 1
                and collective == "all_reduce"
                and nbytes / (self.channels * self.ranks) >= 64):  # fmt: skip
            lat *= 1.9 if self.topology.compute_capability < 80 else 1.4
        return lat + nbytes / (1000.0 * bw)

    def choose(self, collective: str, nbytes: float, algorithm: str | None = None,
               protocol: str | None = None) -> Choice:  # fmt: skip
        """The (algorithm, protocol) of least time, as NCCL picks it; either may be fixed
        (``NCCL_ALGO`` / ``NCCL_PROTO``). One rank: no transfer (time 0, as NCCL)."""
        if collective not in COLLECTIVES:
            raise NetModelError(f"NCCL's tuning model prices {COLLECTIVES}, not {collective!r}")
        algorithm, protocol = norm_algorithm(algorithm), norm_protocol(protocol)
        if self.ranks == 1:
            return Choice(algorithm or "ring", protocol or "Simple", 0.0, 0.0, math.inf)
        best: Choice | None = None
        for a in ALGORITHMS:
            for p in PROTOCOLS:
                if (algorithm and a != algorithm) or (protocol and p != protocol):
                    continue
                tm = self.time_us(collective, nbytes, a, p)
                if tm == tm and (best is None or tm < best.time_us):
                    best = Choice(a, p, tm, self.latency(collective, a, p),
                                  self.bandwidth(collective, a, p))  # fmt: skip
        if best is None:
            raise NetModelError(
                f"no algorithm/protocol for {collective} with algorithm={algorithm!r} "
                f"protocol={protocol!r} on {self.topology.name} (Tree is all-reduce only; "
                "LL128 needs NVLink)"
            )
        return best

    def times_us(
        self, collective: str, nbytes: np.ndarray, algorithm: str | None = None,
        protocol: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """:meth:`choose` over an array of sizes: (times µs, algorithms, protocols)."""
        nb = np.asarray(nbytes, np.float64)
        out = np.full(len(nb), np.nan)
        algo = np.full(len(nb), None, object)
        proto = np.full(len(nb), None, object)
        uniq, inv = np.unique(nb, return_inverse=True)
        for i, b in enumerate(uniq):
            c = self.choose(collective, float(b), algorithm, protocol)
            pick = inv == i
            out[pick], algo[pick], proto[pick] = c.time_us, c.algorithm, c.protocol
        return out, algo, proto


def launch(nbytes: float, channels: int, protocol: str, algorithm: str = "ring", ranks: int = 2,
           ring_bw: float = 20.0, new: bool = True) -> tuple[int, int]:  # fmt: skip
    """(channels, threads per block) NCCL launches for a collective of ``nbytes`` (module
    docstring: the launch rule). ``new``: NCCL ≥ 2.19 (at least 3 warps; Tree 640 threads);
    ``ring_bw``: the ring's bus bandwidth (Simple runs 256 threads at ≤ 12 GB/s)."""
    protocol = norm_protocol(protocol) or "Simple"
    nc = channels
    nt = MAX_THREADS[protocol]
    if protocol == "Simple" and algorithm == "ring" and ring_bw <= PCI_BW:
        nt = 256
    thr = THREAD_THRESHOLD[protocol] * (ranks if (protocol == "LL" and algorithm == "ring") else 1)
    while nbytes < nc * nt * thr and nc >= 2:
        nc -= 1
    while nbytes < nc * nt * thr and nt % 128 == 0:
        nt //= 2
    if protocol == "Simple":
        nt += WARP if algorithm == "ring" else 4 * WARP
    if new:
        nt = max(nt, 3 * WARP)
        if algorithm == "tree":
            nt = 640
    return nc, nt


def protocol_from_threads(threads: int | None) -> str | None:
    """The protocol that ran, from an NCCL kernel's threads per block (module docstring):
    640 or 320 → LL128 (Ring; Tree runs 640 threads too on NCCL ≥ 2.19), 512/256/128/64 → LL,
    544/288/160 → Simple (a sync warp over 512/256/128); None when ambiguous (96: LL or Simple
    at their smallest on NCCL ≥ 2.19) or unknown."""
    if threads is None or threads != threads:
        return None
    t = int(threads)
    if t in (640, 320):
        return "LL128"
    if t in (512, 256, 128, 64):
        return "LL"
    if t in (544, 288, 160, 576):
        return "Simple"
    return None

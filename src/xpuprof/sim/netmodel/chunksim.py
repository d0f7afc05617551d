"""Chunk-level simulation of ring collectives on a topology: the data moves in chunks through
per-link FIFOs with a bandwidth and a per-hop latency, one ring per channel.

*The ring.* p ranks in node order; rank r sends to r + 1 over its link (NVLink/PCIe inside a
node, the NIC between nodes), whose FIFO carries r's sends in program order. A ring all-reduce
takes 2(p − 1) steps per iteration (reduce-scatter then all-gather), all-gather and
reduce-scatter p − 1; at step s ≥ 1 a rank forwards what it received at step s − 1. A step
moves one chunk in ``slices`` slices. A slice of rank r starts when (1) r's previous slice has
left (program order: the FIFO serialises, one slice takes size / bandwidth) and (2) for s ≥ 1
the same slice of the previous step has arrived from r − 1 (its start + its serialisation +
the hop latency). The collective ends when the last step's slices have landed.

*Iterations.* NCCL splits a channel's n/c bytes into iterations of p chunks (``loopSize`` =
channels × p × chunk); the last is shorter, and a message smaller than one iteration uses
chunks of n/(c·p) (NCCL's ``realChunkSize``). Chunks and slices are NCCL's
(``sim/netmodel/nccl.py``): Simple 2 MiB chunks in 2 slices, LL 32 KiB and LL128 562.5 KiB of
payload in one. Beyond 64 iterations the schedule is periodic (no buffer bounds the ring), so
iterations 65… are extrapolated from the period of two runs (:func:`periodic`, exact for
uniform chunks; a test compares it with the full run); the broadcast chain likewise.

*Per-link numbers.* Bandwidth per channel: the ring's bus bandwidth for the protocol (NCCL's
tuning bandwidth before its bus → algorithm conversion: the search's channels × per-channel
bandwidth, LL × 0.5 capped at llMaxBw, LL128 payload 120/128 capped per channel) divided by
the communicator's channels; the channels a message uses follow NCCL's launch rule (fewer for
small messages). Per-hop latency: NCCL's Ring latency of the link kind and protocol; a call
adds NCCL's Ring base latency once.

*Reduces to alpha–beta.* With one chunk per step (chunk = n/p, one slice, one channel, no base
latency) every step waits for the previous one: T = 2(p − 1)(α + (n/p)β) = 2(p − 1)α +
2((p − 1)/p)nβ, the ring all-reduce formula; with many slices and α below one slice's
serialisation the latency hides behind the transfer and T → 2((p − 1)/p)nβ + a pipeline fill.
Vectorised over ranks and slices (one numpy step per ring step); a broadcast's chain is one
max-plus scan per hop over all chunks.

Not modelled: buffer credits (``NCCL_STEPS`` slots; in a uniform ring the receiver keeps pace,
so they never bind), the reduction's compute, contention between channels beyond their share.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from xpuprof.sim.netmodel.nccl import (
    BASE_LATENCY,
    CHUNK_STEPS,
    NET_OVERHEAD_US,
    PROTOCOLS,
    SLICES_PER_CHUNK,
    STEP_PAYLOAD,
    NcclModel,
    launch,
    norm_protocol,
)
from xpuprof.sim.netmodel.topology import NetModelError, Topology

__all__ = [
    "SIMULATED",
    "ChunkModel",
    "SimResult",
    "periodic",
    "pipeline_time_us",
    "ring_time_us",
    "ring_uniform_us",
]

#: Collectives the chunk simulation runs (ring patterns and the broadcast/reduce chain).
SIMULATED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
#: Iterations simulated one by one before the periodic extrapolation.
DIRECT_ITERATIONS = 64


def _ring_run(steps: int, chunks: np.ndarray, slices: int, upb: np.ndarray,
              lat: np.ndarray) -> tuple[float, np.ndarray]:  # fmt: skip
    """Completion time (µs) of a ring schedule and each iteration's first start (rank 0)."""
    p = len(upb)
    jj = np.arange(slices, dtype=np.float64)
    end = np.zeros(p)
    prev = np.zeros((p, slices))
    prev_w = np.zeros(p)
    first = np.empty(len(chunks))
    for i, c in enumerate(chunks):
        ws = (c / slices) * upb  # each rank's serialisation of one slice on its link
        for s in range(steps):
            if s == 0:
                dep = np.full((p, slices), -np.inf)
            else:  # what rank r - 1 sent at step s - 1 lands at rank r
                dep = np.roll(prev + (prev_w + lat)[:, None], 1, axis=0)
            dep[:, 0] = np.maximum(dep[:, 0], end)
            # start[j] = max over v ≤ j of dep[v] + (j - v)·ws  (the FIFO after v)
            start = jj * ws[:, None] + np.maximum.accumulate(dep - jj * ws[:, None], axis=1)
            if s == 0:
                first[i] = start[0, 0]
            end = start[:, -1] + ws
            prev, prev_w = start, ws
    landed = np.roll(prev[:, -1] + prev_w + lat, 1)
    return float(np.max(np.maximum(landed, end))), first


def periodic(run: Callable[[int], float], n_full: int, direct: int = DIRECT_ITERATIONS) -> float:
    """``run(k)``: the time of k full chunks then the last one. Up to ``direct`` chunks, run;
    beyond, the schedule is periodic: T(n) = T(a) + (n − a)·(T(a + 1) − T(a)), a = direct/2."""
    if n_full <= direct:
        return run(n_full)
    a = direct // 2
    t_a = run(a)
    return t_a + (n_full - a) * (run(a + 1) - t_a)


def ring_time_us(steps: int, chunks: np.ndarray, slices: int, us_per_byte: np.ndarray,
                 hop_us: np.ndarray, direct: int = DIRECT_ITERATIONS) -> float:  # fmt: skip
    """Time (µs) of one channel of a ring collective: ``steps`` per iteration, ``chunks`` the
    chunk size of each iteration (bytes; all but the last equal), ``slices`` per chunk, and per
    rank r the link r → r + 1: ``us_per_byte`` (1 / (1000 × GB/s) of payload) and ``hop_us``.
    More than ``direct`` iterations: the middle ones are extrapolated (:func:`periodic`)."""
    chunks = np.asarray(chunks, np.float64)
    if not len(chunks):
        return 0.0
    return ring_uniform_us(steps, chunks[0], len(chunks) - 1, chunks[-1], slices, us_per_byte,
                           hop_us, direct)  # fmt: skip


def ring_uniform_us(steps: int, chunk: float, n_full: int, last: float, slices: int,
                    us_per_byte: np.ndarray, hop_us: np.ndarray,
                    direct: int = DIRECT_ITERATIONS) -> float:  # fmt: skip
    """:func:`ring_time_us` of ``n_full`` chunks of ``chunk`` bytes then one of ``last`` (none
    when 0), without building the list (a tiny ``chunk_bytes`` gives millions)."""
    upb, lat = np.asarray(us_per_byte, np.float64), np.asarray(hop_us, np.float64)
    if len(upb) != len(lat) or len(upb) < 2:
        raise NetModelError("a ring needs ≥ 2 ranks, one bandwidth and one latency per link")
    if steps < 1 or slices < 1 or (n_full == 0 and last <= 0):
        return 0.0
    tail = [last] if last > 0 else []

    def run(k: int) -> float:
        return _ring_run(steps, np.r_[np.full(k, chunk), tail], slices, upb, lat)[0]

    return periodic(run, n_full, direct)


def pipeline_time_us(chunks: np.ndarray, us_per_byte: np.ndarray, hop_us: np.ndarray) -> float:
    """Time (µs) of a chain (ring broadcast from the root, or reduce towards it): every chunk
    crosses each hop h in order; a hop's FIFO sends chunk u after chunk u − 1 has left and
    once u has arrived. One max-plus scan per hop, vectorised over the chunks."""
    c = np.asarray(chunks, np.float64)
    arrive = np.zeros(len(c))
    for upb, lat in zip(np.asarray(us_per_byte, np.float64), np.asarray(hop_us, np.float64),
                        strict=True):  # fmt: skip
        w = c * upb
        before = np.cumsum(w) - w
        start = before + np.maximum.accumulate(arrive - before)
        arrive = start + w + lat
    return float(arrive.max()) if len(arrive) else 0.0


@dataclass(frozen=True)
class SimResult:
    """One simulated collective: ``time_us`` (base latency included), ``protocol``, the
    ``channels`` it ran on, its ``chunk`` (bytes per step per channel) and ``iterations``."""

    time_us: float
    protocol: str
    channels: int
    chunk: float
    iterations: int


class ChunkModel:
    """The chunk-level simulation on a topology for a group of ``ranks`` (module docstring);
    ``channels`` overrides the communicator's channel count, as :class:`NcclModel`."""

    def __init__(self, topology: Topology | str, ranks: int, channels: int | None = None):
        self.nccl = NcclModel(topology, ranks, channels)
        self.topology = self.nccl.topology
        self.ranks = ranks

    def links(self, protocol: str, collective: str) -> tuple[np.ndarray, np.ndarray]:
        """Per ring link r → r + 1 (one channel): µs per payload byte and hop latency (µs)."""
        m = self.nccl
        t = self.topology
        p = self.ranks
        bus = m.bandwidth(collective, "ring", protocol) * m.steps(collective) / p
        per_channel = bus / m.channels
        upb = np.full(p, 1.0 / (1000.0 * per_channel))
        intra = m.hop_us(t.intra.kind, "ring", protocol)
        lat = np.full(p, intra)
        if t.nodes > 1:
            lat[:] = max(intra, NET_OVERHEAD_US * (3 if protocol == "Simple" else 1))
            crossing = (np.arange(p) + 1) % t.gpus_per_node == 0
            lat[crossing] = m.hop_us("net", "ring", protocol)
        return upb, lat

    def simulate(self, collective: str, nbytes: float, protocol: str | None = None,
                 chunk_bytes: float | None = None,
                 base_us: float | None = None) -> SimResult:  # fmt: skip
        """Simulate one collective of ``nbytes``. ``protocol`` None: NCCL's choice among the Ring
        protocols (its tuning model); ``chunk_bytes`` None: NCCL's chunk for the protocol;
        ``base_us`` None: NCCL's Ring base latency for the protocol."""
        if collective not in SIMULATED:
            raise NetModelError(f"the chunk simulation runs {SIMULATED}, not {collective!r}")
        if nbytes < 0:
            raise NetModelError(f"a collective of {nbytes} bytes")
        proto = norm_protocol(protocol) or self.nccl.choose(collective, nbytes, "ring").protocol
        if not self.nccl.enabled(collective, "ring", proto):
            raise NetModelError(f"{proto} is not enabled on {self.topology.name} (LL128 needs "
                                "NVLink)")  # fmt: skip
        p = self.ranks
        if p == 1 or nbytes == 0:
            return SimResult(0.0, proto, 0, 0.0, 0)
        ring_bw = self.nccl.bus_bw
        nc, _ = launch(nbytes, self.nccl.channels, proto, "ring", p, ring_bw)
        per_channel = nbytes / nc
        base = BASE_LATENCY["ring"][PROTOCOLS.index(proto)] if base_us is None else base_us
        upb, lat = self.links(proto, collective)
        if collective in ("broadcast", "reduce"):
            chunk = float(chunk_bytes or STEP_PAYLOAD[proto])
            if chunk <= 0:
                raise NetModelError(f"chunk_bytes={chunk_bytes}: must be > 0")
            k = max(1, math.ceil(per_channel / chunk))
            last = per_channel - chunk * (k - 1)

            def chain(j: int) -> float:
                return pipeline_time_us(np.r_[np.full(j, chunk), last], upb[: p - 1],
                                        lat[: p - 1])  # fmt: skip

            return SimResult(base + periodic(chain, k - 1), proto, nc, chunk, k)
        chunk = float(chunk_bytes or STEP_PAYLOAD[proto] * CHUNK_STEPS[proto])
        if chunk <= 0:
            raise NetModelError(f"chunk_bytes={chunk_bytes}: must be > 0")
        full = int(per_channel // (p * chunk))
        rest = per_channel - full * p * chunk
        last = rest / p if rest > 1e-9 else 0.0
        if full == 0:  # smaller than one iteration: chunks of n/(c·p)
            chunk, full, last = last, 1, 0.0
        steps = self.nccl.steps(collective)
        t = ring_uniform_us(steps, chunk, full, last, SLICES_PER_CHUNK[proto], upb, lat)
        return SimResult(base + t, proto, nc, chunk, full + (last > 0))

    def time_us(self, collective: str, nbytes: float, protocol: str | None = None,
                chunk_bytes: float | None = None) -> float:  # fmt: skip
        return self.simulate(collective, nbytes, protocol, chunk_bytes).time_us

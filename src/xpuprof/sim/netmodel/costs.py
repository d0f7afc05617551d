""":class:`CollectiveCosts`: a replay cost model whose collectives take the time a collective
model predicts for them on a topology, with a chosen algorithm, protocol, channel count and
world size — the what-if tier for collectives (measured → alpha–beta → NCCL's tuner → the
chunk-level simulation).

*What it prices.* Each collective kernel of the trace, from the comm tool's identity
(``xpuprof.analysis.comm.collectives``: type, bytes, group size, algorithm and protocol from
the name) and its launch (grid = channels, block = threads; :func:`collective_table`). NCCL <
2.19 names every kernel after its ``RING_LL`` entry point whatever ran, so for ``ncclKernel_*``
names the protocol is read from the threads per block (:func:`~xpuprof.sim.netmodel.nccl.
protocol_from_threads`) where they decide it.

*Where the time goes in the replay graph* (``sim/graph.py``): a collective matched across
ranks has a rendezvous node; its ``collective`` edges out of the rendezvous carry the transfer
time, and so does each participant's own ``device_communication`` run edge (``calibrate``). Both
become the prediction, the largest over the collective's participants (they normally agree: same
type, size and group). A collective without partners has only its run edge: it becomes its own
prediction. A kernel the models cannot price (unknown size or type, no group) keeps the base
model's delay, and :meth:`CollectiveCosts.predictions` says why.

*Models.* ``"nccl"``: NCCL's tuning model (``nccl.py``); ``"chunk"``: the chunk-level
simulation (``chunksim.py``; Ring only); ``"alphabeta"``: the Thakur–Rabenseifner–Gropp formula
of ``algorithm`` (default ring) with α = NCCL's Ring per-hop latency of the topology's link
(the network's across nodes) for ``protocol`` (default Simple) and β = 1 / the ring's bus
bandwidth, no base latency. All-to-all and point-to-point, which NCCL runs as grouped sends
and receives on every peer at once and its tuner does not price, cost one call and one hop
(NCCL's Ring base and hop latency of the protocol NCCL uses for them: LL up to 16 KiB per
peer, ``NCCL_P2P_LL_THRESHOLD``, else Simple) plus bytes × (p − 1)/p over the ring's bus
bandwidth for that protocol.

*Knobs* (None: as the trace, or NCCL's choice): ``algorithm``, ``protocol``, ``channels`` (the
communicator's), ``chunk_bytes`` (chunk model), ``world_size`` (applied to the collectives of
the largest group in the trace, the world; all-gather and reduce-scatter bytes scale with it,
each rank's shard staying the same; all-reduce, broadcast and all-to-all buffers stay).
``relative=True`` keeps the measured inefficiency: each kernel's delay is its base delay ×
model(what-if settings) / model(the kernel as recorded: its algorithm, protocol and group,
NCCL's channels, on ``baseline_topology``: the machine it ran on; default ``topology``, and
with :meth:`CollectiveCosts.of` the preset of the trace's GPUs when they name one); a setting
left None stays as recorded (not NCCL's choice), so with nothing set the replay is the trace's
own, and ``topology="dgx-h100"`` on a V100 trace scales each transfer by H100 / DGX-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.sim.costs import CostModel, Measured
from xpuprof.sim.graph import COLLECTIVE, DEVICE_COMMUNICATION, RENDEZVOUS, ReplayGraph
from xpuprof.sim.netmodel.alphabeta import alpha_beta
from xpuprof.sim.netmodel.chunksim import SIMULATED, ChunkModel
from xpuprof.sim.netmodel.nccl import (
    BASE_LATENCY,
    COLLECTIVES,
    PROTOCOLS,
    NcclModel,
    norm_algorithm,
    norm_protocol,
    protocol_from_threads,
)
from xpuprof.sim.netmodel.topology import NetModelError, Topology, preset

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace

__all__ = [
    "MODELS",
    "P2P_LL_THRESHOLD",
    "CollectiveCosts",
    "collective_table",
    "guess_topology",
    "predict_us",
]

MODELS = ("nccl", "chunk", "alphabeta")
#: ``NCCL_P2P_LL_THRESHOLD`` (``enqueue.cc``): per-peer bytes up to which sends use LL.
P2P_LL_THRESHOLD = 16384
P2P = ("all_to_all", "send_recv", "send", "recv")

TABLE_COLUMNS = ["id", "part", "rank", "collective", "bytes", "group_size", "process_group",
                 "seq", "dur", "name", "channels", "threads", "algorithm", "protocol",
                 "protocol_source"]  # fmt: skip


def collective_table(trace: Trace) -> pd.DataFrame:
    """One row per collective kernel: the comm tool's identity plus its launch (``channels``
    = grid x, ``threads`` = block x) and the ``algorithm`` / ``protocol`` that ran
    (``protocol_source``: ``threads`` or ``name``; module docstring)."""
    from xpuprof.analysis.comm import collectives

    t = collectives(trace).tables["collectives"]
    if "where" in t:  # host collectives (gloo on the CPU) are no NCCL kernels to price
        t = t[t["where"] == "device"]
    if t.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    la = trace.sql(
        """select id, json_extract(args, '$.grid[0]')::bigint as channels,
                  json_extract(args, '$.block[0]')::bigint as threads
           from events where level = 'collective'"""
    )
    t = t.merge(la, on="id", how="left")
    old = t["name"].astype(str).str.contains(r"(?:nccl|rccl)Kernel_", regex=True).to_numpy()
    by_threads = np.array([protocol_from_threads(x) if x == x else None
                           for x in t["threads"].to_numpy(np.float64)], object)  # fmt: skip
    name_proto = np.array([_proto_or_none(x) for x in t["protocol"]], object)
    use_threads = old & (by_threads != None)  # noqa: E711
    proto = np.where(use_threads, by_threads, name_proto)
    src = np.where(use_threads, "threads", np.where(name_proto != None, "name", None))  # noqa: E711
    algo = np.array([_algo_or_none(x) for x in t["algorithm"]], object)
    # grouped sends/receives: every NCCL p2p kernel runs 640 threads and is named SendRecv
    # RING SIMPLE whatever protocol each peer used, so neither says anything
    p2p = (
        t["collective"].isin(P2P).to_numpy()
        | t["name"].astype(str).str.contains("SendRecv").to_numpy()
    )
    proto = np.where(p2p, None, proto)
    src = np.where(p2p, None, src)
    algo = np.where(p2p, None, algo)
    out = t.assign(algorithm=algo, protocol=proto, protocol_source=src)
    return out[TABLE_COLUMNS].reset_index(drop=True)


#: Device-name patterns → the preset of the machine such GPUs usually sit in.
GUESS = (("V100", "dgx1-v100"), ("A100", "dgx-a100"), ("H100", "dgx-h100"),
         ("H200", "dgx-h100"))  # fmt: skip


def guess_topology(trace: Trace) -> str:
    """The preset for the trace's GPUs (``deviceProperties`` names: V100 → ``dgx1-v100``, A100
    → ``dgx-a100``, H100/H200 → ``dgx-h100``); raises when the trace names none of them."""
    names = sorted({str(d.get("name", "")) for devs in
                    (trace.meta.get("device_properties") or {}).values()
                    for d in (devs or [])})  # fmt: skip
    for pat, key in GUESS:
        if any(pat in n for n in names):
            return key
    raise NetModelError(f"no topology preset for the devices {names or ['(none recorded)']}: "
                        "pass topology= (a preset name or a Topology)")  # fmt: skip


def _none(x: object) -> object:
    """None for None and NaN (pandas' missing values in object columns)."""
    return None if x is None or (isinstance(x, float) and x != x) else x


def _proto_or_none(x: object) -> str | None:
    try:
        return norm_protocol(x) if isinstance(x, str) else None
    except NetModelError:
        return None


def _algo_or_none(x: object) -> str | None:
    try:
        return norm_algorithm(x) if isinstance(x, str) else None
    except NetModelError:
        return None


def _p2p_us(kind: str, nbytes: float, p: int, topology: Topology, channels: int | None,
            protocol: str | None) -> tuple[float, str]:  # fmt: skip
    m = NcclModel(topology, p, channels)
    peers = max(p - 1, 1) if kind == "all_to_all" else 1
    per_peer = nbytes / p if kind == "all_to_all" else nbytes
    proto = protocol or ("LL" if per_peer <= P2P_LL_THRESHOLD else "Simple")
    bus = m.bus_bw * (0.5 if proto == "LL" else 120 / 128 if proto == "LL128" else 1.0)
    moved = per_peer * peers
    kind_link = m.topology.intra.kind if m.topology.nodes == 1 else "net"
    lat = BASE_LATENCY["ring"][PROTOCOLS.index(proto)] + m.hop_us(kind_link, "ring", proto)
    return lat + moved / (1000.0 * bus), proto


def predict_us(kind: str, nbytes: float, p: int, *, topology: Topology | str, model: str = "nccl",
               algorithm: str | None = None, protocol: str | None = None,
               channels: int | None = None, chunk_bytes: float | None = None,
               ) -> tuple[float, str | None, str | None]:  # fmt: skip
    """Predicted time (µs), algorithm and protocol of one collective (module docstring).
    Raises :class:`NetModelError` for what the model cannot price."""
    if model not in MODELS:
        raise NetModelError(f"collective model {model!r}: expected one of {MODELS}")
    if not (nbytes == nbytes) or nbytes < 0:
        raise NetModelError("no message size")
    if not (p == p) or p < 1:
        raise NetModelError("no group size")
    p = int(p)
    topo = preset(topology)
    protocol = norm_protocol(protocol)
    if model != "alphabeta":  # the alpha-beta tier has algorithms of its own (rhd, bruck …)
        algorithm = norm_algorithm(algorithm)
    if p == 1:
        return 0.0, algorithm, protocol
    if kind in P2P:
        t, proto = _p2p_us(kind, nbytes, p, topo, channels, protocol)
        return t, "p2p", proto
    if kind not in COLLECTIVES:
        raise NetModelError(f"no model for collective type {kind!r}")
    if model == "nccl":
        c = NcclModel(topo, p, channels).choose(kind, nbytes, algorithm, protocol)
        return c.time_us, c.algorithm, c.protocol
    if model == "chunk":
        if algorithm not in (None, "ring") or kind not in SIMULATED:
            raise NetModelError(f"the chunk simulation runs Ring {SIMULATED}, not "
                                f"{algorithm} {kind}")  # fmt: skip
        r = ChunkModel(topo, p, channels).simulate(kind, nbytes, protocol, chunk_bytes)
        return r.time_us, "ring", r.protocol
    m = NcclModel(topo, p, channels)
    link = m.topology.intra.kind if m.topology.nodes == 1 else "net"
    alpha = m.hop_us(link, "ring", protocol or "Simple")
    beta = 1.0 / (1000.0 * m.bus_bw)
    algo = algorithm or "ring"
    return float(alpha_beta(kind, algo, nbytes, p, alpha, beta)), algo, None


@dataclass(frozen=True, eq=False)
class CollectiveCosts:
    """Collectives at the model's predicted time, everything else at ``base``'s delays (module
    docstring). Build it with :meth:`of` (reads the trace's collectives once)."""

    table: pd.DataFrame
    topology: Topology | str = "dgx-a100"
    model: str = "nccl"
    algorithm: str | None = None
    protocol: str | None = None
    channels: int | None = None
    world_size: int | None = None
    chunk_bytes: float | None = None
    relative: bool = False
    baseline_topology: Topology | str | None = None
    base: CostModel = field(default_factory=Measured)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise NetModelError(f"collective model {self.model!r}: expected one of {MODELS}")
        preset(self.topology)
        if self.baseline_topology is not None:
            preset(self.baseline_topology)
        norm_protocol(self.protocol)
        if self.model != "alphabeta":
            norm_algorithm(self.algorithm)
        if self.world_size is not None and self.world_size < 1:
            raise NetModelError(f"world_size={self.world_size}: need at least 1")
        missing = set(TABLE_COLUMNS) - set(self.table.columns)
        if missing:
            raise NetModelError(f"the collectives table lacks {sorted(missing)}: build it with "
                                "collective_table(trace) or CollectiveCosts.of(trace)")  # fmt: skip

    @classmethod
    def of(cls, trace: Trace, **settings: object) -> CollectiveCosts:
        """For ``trace``'s collectives; without ``topology``, the preset of its GPUs
        (:func:`guess_topology`)."""
        if settings.get("topology") is None:
            settings["topology"] = guess_topology(trace)
        if settings.get("relative") and settings.get("baseline_topology") is None:
            try:  # the machine the trace ran on, when its GPUs say
                settings["baseline_topology"] = guess_topology(trace)
            except NetModelError:
                pass
        return cls(collective_table(trace), **settings)  # type: ignore[arg-type]

    def predictions(self) -> pd.DataFrame:
        """Per collective kernel: the what-if ``group_size`` and ``bytes``, ``predicted_ns``
        (NaN when unpriced), the ``algorithm`` / ``protocol`` the model used, ``ratio`` (with
        ``relative``: what-if / as recorded) and ``reason`` (why unpriced)."""
        t = self.table
        g = pd.to_numeric(t["group_size"], errors="coerce").to_numpy(np.float64)
        b = pd.to_numeric(t["bytes"], errors="coerce").to_numpy(np.float64)
        new_g, new_b = g.copy(), b.copy()
        if self.world_size is not None and np.isfinite(g).any():
            world = np.nanmax(g)
            pick = g == world
            new_g[pick] = self.world_size
            scale = np.isin(t["collective"].to_numpy(object), ["all_gather", "reduce_scatter"])
            new_b[pick & scale] = b[pick & scale] * self.world_size / world
        rows = []
        cache: dict[tuple, tuple] = {}
        rec_a, rec_p = t["algorithm"].to_numpy(object), t["protocol"].to_numpy(object)
        for i, kind in enumerate(t["collective"].to_numpy(object)):
            ra, rp = _none(rec_a[i]), _none(rec_p[i])
            # relative: what is not set stays as recorded; absolute: NCCL's choice
            a = self.algorithm if (self.algorithm is not None or not self.relative) else ra
            pr = self.protocol if (self.protocol is not None or not self.relative) else rp
            key = ("new", kind, new_b[i], new_g[i], a, pr)
            if key not in cache:
                cache[key] = self._one(kind, new_b[i], new_g[i], a, pr, self.channels,
                                       self.topology)  # fmt: skip
            ns, algo, proto, why = cache[key]
            ratio = np.nan
            if self.relative and ns == ns:
                rkey = ("rec", kind, b[i], g[i], ra, rp)
                if rkey not in cache:
                    cache[rkey] = self._one(kind, b[i], g[i], ra, rp, None,
                                            self.baseline_topology or self.topology)  # fmt: skip
                ref = cache[rkey][0]
                ratio = ns / ref if ref == ref and ref > 0 else np.nan
                if ratio != ratio:
                    ns, why = np.nan, cache[rkey][3] or "the recorded setting predicts no time"
            rows.append((ns, algo, proto, ratio, why))
        p = pd.DataFrame(rows, columns=["predicted_ns", "algorithm", "protocol", "ratio", "reason"])
        return pd.concat(
            [
                t[["id", "collective"]].reset_index(drop=True),
                pd.DataFrame({"group_size": new_g, "bytes": new_b}),
                p,
            ],
            axis=1,
        )

    def _one(self, kind: object, nbytes: float, p: float, algorithm: object, protocol: object,
             channels: int | None, topology: Topology | str,
             ) -> tuple[float, str | None, str | None, str | None]:  # fmt: skip
        """(predicted ns, algorithm, protocol, None) or (NaN, None, None, why not)."""
        try:
            us, a, pr = predict_us(
                str(kind), nbytes, p, topology=topology, model=self.model,  # type: ignore[arg-type]
                algorithm=algorithm, protocol=protocol, channels=channels,  # type: ignore[arg-type]
                chunk_bytes=self.chunk_bytes)  # fmt: skip
        except NetModelError as e:
            return np.nan, None, None, str(e)
        return float(np.rint(us * 1000.0)), a, pr, None

    def delays(self, graph: ReplayGraph) -> np.ndarray:
        """The base model's delays with every priced collective's transfer replaced (module
        docstring)."""
        d = np.array(self.base.delays(graph), np.int64)
        pr = self.predictions()
        pred = pd.Series(pr["predicted_ns"].to_numpy(), index=pr["id"].to_numpy())
        ratio = pd.Series(pr["ratio"].to_numpy(), index=pr["id"].to_numpy())
        e, n = graph.edges, graph.nodes

        def new_delay(edges: np.ndarray, kernels: np.ndarray) -> np.ndarray:
            if self.relative:
                r = ratio.reindex(kernels).to_numpy(np.float64)
                return d[edges] * r
            return pred.reindex(kernels).to_numpy(np.float64)

        # collectives matched across ranks: the rendezvous' out-edges and the runs they end
        co = np.flatnonzero((e.kind == COLLECTIVE) & (n.kind[e.src] == RENDEZVOUS))
        ended = np.zeros(len(n), bool)
        if len(co):
            v = new_delay(co, n.event[e.dst[co]])
            per = pd.Series(v).groupby(e.src[co]).max()  # NaN-skipping: any priced participant
            t = per.reindex(e.src[co]).to_numpy(np.float64)
            ok = np.isfinite(t)
            d[co[ok]] = np.rint(t[ok]).astype(np.int64)
            transfer = np.full(len(n), -1, np.int64)
            transfer[e.dst[co[ok]]] = d[co[ok]]
            ended[e.dst[co[ok]]] = True
            run = np.flatnonzero((e.kind == DEVICE_COMMUNICATION) & e.timeline & ended[e.dst])
            d[run] = transfer[e.dst[run]]
        # collectives without partners: their own run
        solo = np.flatnonzero((e.kind == DEVICE_COMMUNICATION) & ~ended[e.dst])
        if len(solo):
            v = new_delay(solo, e.event[solo])
            ok = np.isfinite(v)
            d[solo[ok]] = np.rint(v[ok]).astype(np.int64)
        return d

"""Alpha–beta (Hockney) models of collective algorithms: a message of n bytes costs α + nβ,
α the per-message latency (µs) and β the time per byte (µs/byte = 1 / (1000 × GB/s)).

Formulas (Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations
in MPICH", IJHPCA 19(1), 2005; the reduction's compute term γ is left out, a GPU reduces at
memory speed), for p ranks and n bytes (the collective's size: the all-reduce buffer, the
all-gather output, the reduce-scatter input, the all-to-all send buffer of one rank):

- ring all-reduce: 2(p − 1)α + 2((p − 1)/p)nβ;
- ring reduce-scatter, ring all-gather: (p − 1)α + ((p − 1)/p)nβ;
- recursive halving-doubling all-reduce (Rabenseifner: reduce-scatter by recursive halving,
  all-gather by recursive doubling; p a power of two): 2·log₂p·α + 2((p − 1)/p)nβ;
- recursive doubling all-reduce (short messages): log₂p·(α + nβ);
- binomial tree broadcast / reduce: ⌈log₂p⌉(α + nβ); tree all-reduce = reduce + broadcast:
  2⌈log₂p⌉(α + nβ);
- pipelined (chain) broadcast in k pieces: (p − 1 + k − 1)(α + (n/k)β), optimal k for large n;
- all-to-all, pairwise exchange (long messages): (p − 1)α + ((p − 1)/p)nβ; Bruck (short):
  ⌈log₂p⌉α + (n/2)⌈log₂p⌉β.

Bus bandwidth (nccl-tests' convention, :func:`xpuprof.analysis.comm.kinds.busbw_factor`): the
bandwidth a link must carry is algbw × factor, factor 2(p − 1)/p for all-reduce, (p − 1)/p for
all-gather, reduce-scatter and all-to-all, 1 for broadcast and reduce. So the bandwidth term of
every bandwidth-optimal algorithm above is n × factor / busbw, and :func:`busbw_time` prices any
collective from a bus bandwidth and a latency: a measured busbw (nccl-tests, or the comm tool's
``busbw`` column) carries over to other sizes, group sizes and collective types.

Every function takes arrays (broadcasting over n and p) and returns µs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xpuprof.analysis.comm.kinds import busbw_factor
from xpuprof.sim.netmodel.topology import NetModelError

__all__ = [
    "ALPHA_BETA",
    "alpha_beta",
    "beta_of",
    "binomial_allreduce",
    "binomial_broadcast",
    "bruck_alltoall",
    "busbw_time",
    "pairwise_alltoall",
    "pipeline_broadcast",
    "rd_allreduce",
    "rhd_allreduce",
    "ring_allgather",
    "ring_allreduce",
    "ring_reduce_scatter",
]

Array = np.ndarray | float | int


def beta_of(gbs: float) -> float:
    """β (µs per byte) of a bandwidth in GB/s."""
    if not gbs > 0:
        raise NetModelError(f"bandwidth {gbs!r} GB/s: must be > 0")
    return 1.0 / (1000.0 * gbs)


def _np(n: Array, p: Array) -> tuple[np.ndarray, np.ndarray]:
    n, p = np.asarray(n, np.float64), np.asarray(p, np.float64)
    if np.any(p < 1):
        raise NetModelError("alpha-beta models need p ≥ 1 ranks")
    if np.any(n < 0):
        raise NetModelError("alpha-beta models need n ≥ 0 bytes")
    return n, p


def ring_allreduce(n: Array, p: Array, alpha: float, beta: float) -> np.ndarray:
    n, p = _np(n, p)
    return 2 * (p - 1) * alpha + 2 * ((p - 1) / p) * n * beta


def ring_reduce_scatter(n: Array, p: Array, alpha: float, beta: float) -> np.ndarray:
    n, p = _np(n, p)
    return (p - 1) * alpha + ((p - 1) / p) * n * beta


ring_allgather = ring_reduce_scatter


def rhd_allreduce(n: Array, p: Array, alpha: float, beta: float) -> np.ndarray:
    """Rabenseifner's recursive halving-doubling (p a power of two; else log₂ rounded up, as
    the non-power-of-two variant adds a step)."""
    n, p = _np(n, p)
    return 2 * np.ceil(np.log2(p)) * alpha + 2 * ((p - 1) / p) * n * beta


def rd_allreduce(n: Array, p: Array, alpha: float, beta: float) -> np.ndarray:
    n, p = _np(n, p)
    return np.ceil(np.log2(p)) * (alpha + n * beta)


def binomial_broadcast(n: Array, p: Array, alpha: float, beta: float) -> np.ndarray:
    n, p = _np(n, p)
    return np.ceil(np.log2(p)) * (alpha + n * beta)


def binomial_allreduce(n: Array, p: Array, alpha: float, beta: float) -> np.ndarray:
    return 2 * binomial_broadcast(n, p, alpha, beta)


def pipeline_broadcast(n: Array, p: Array, alpha: float, beta: float,
                       pieces: Array | None = None) -> np.ndarray:  # fmt: skip
    """Chain broadcast in ``pieces`` pieces; default the optimum
    k* = sqrt((p − 2)·nβ/α) (at least 1)."""
    n, p = _np(n, p)
    if pieces is None:
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.sqrt(np.maximum(p - 2, 0) * n * beta / alpha) if alpha > 0 else n
        k = np.maximum(1, np.round(k))
    else:
        k = np.maximum(1, np.asarray(pieces, np.float64))
    return np.where(p > 1, (p - 1 + k - 1) * (alpha + n / k * beta), 0.0)


def pairwise_alltoall(n: Array, p: Array, alpha: float, beta: float) -> np.ndarray:
    n, p = _np(n, p)
    return (p - 1) * alpha + ((p - 1) / p) * n * beta


def bruck_alltoall(n: Array, p: Array, alpha: float, beta: float) -> np.ndarray:
    n, p = _np(n, p)
    lg = np.ceil(np.log2(p))
    return lg * alpha + (n / 2) * lg * beta


#: Per collective type: the algorithm names this module has and their functions.
ALPHA_BETA: dict[str, dict[str, Callable[..., np.ndarray]]] = {
    "all_reduce": {"ring": ring_allreduce, "rhd": rhd_allreduce, "rd": rd_allreduce,
                   "tree": binomial_allreduce},
    "reduce_scatter": {"ring": ring_reduce_scatter},
    "all_gather": {"ring": ring_allgather},
    "broadcast": {"tree": binomial_broadcast, "ring": pipeline_broadcast},
    "reduce": {"tree": binomial_broadcast, "ring": pipeline_broadcast},
    "all_to_all": {"pairwise": pairwise_alltoall, "ring": pairwise_alltoall,
                   "bruck": bruck_alltoall},
}  # fmt: skip


def busbw_time(kind: str, n: Array, p: Array, busbw: float, latency_us: Array = 0.0
               ) -> np.ndarray:  # fmt: skip
    """latency + n × busbw_factor(kind, p) / busbw (µs; busbw in GB/s): the time of a
    collective whose links run at ``busbw`` (module docstring). Unknown types raise."""
    n, p = _np(n, p)
    f = np.vectorize(lambda q: busbw_factor(kind, float(q)), otypes=[np.float64])(p)
    if np.isnan(f).any():
        raise NetModelError(f"no bus-bandwidth factor for collective {kind!r}")
    return np.asarray(latency_us, np.float64) + n * f * beta_of(busbw)


def alpha_beta(kind: str, algorithm: str, n: Array, p: Array, alpha: float, beta: float
               ) -> np.ndarray:  # fmt: skip
    """The ``algorithm`` model of collective ``kind`` (:data:`ALPHA_BETA`)."""
    algos = ALPHA_BETA.get(kind)
    if algos is None:
        raise NetModelError(f"no alpha-beta model for collective {kind!r}; have "
                            f"{sorted(ALPHA_BETA)}")  # fmt: skip
    f = algos.get(algorithm)
    if f is None:
        raise NetModelError(f"no {algorithm!r} alpha-beta model for {kind}; have {sorted(algos)}")
    out = f(n, p, alpha, beta)
    return np.where(np.asarray(p) > 1, out, 0.0)

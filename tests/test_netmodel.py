"""Collective models (``xpuprof.sim.netmodel``): alpha-beta formulas, NCCL's tuning model and
launch rule, the chunk-level ring simulation, topologies, and the replay cost model
:class:`CollectiveCosts` on a synthetic 4-rank trace — every expected number worked out by hand
in the test's docstring — plus the launch rule against the raw JSON of the shared traces.

Units: µs and GB/s (10⁹ B/s) as NCCL; β = 1 / (1000 × GB/s) µs per byte.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

import xpuprof
from tests.builders import TraceBuilder
from tests.conftest import shared as shared_trace
from tests.test_replay import ALLREDUCE, _four_ranks
from xpuprof.sim import replay
from xpuprof.sim.graph import COLLECTIVE, RENDEZVOUS
from xpuprof.sim.netmodel import (
    ChunkModel,
    CollectiveCosts,
    Link,
    NcclModel,
    NetModelError,
    Topology,
    collective_table,
    launch,
    predict_us,
    preset,
    protocol_from_threads,
)
from xpuprof.sim.netmodel import alphabeta as ab
from xpuprof.sim.netmodel.chunksim import pipeline_time_us, ring_time_us

US = 1000

# -- alpha-beta ---------------------------------------------------------------------------------


def test_alpha_beta_formulas_by_hand():
    """n = 4 MB, α = 5 µs, 100 GB/s (β = 1e-5 µs/B, so nβ = 40 µs).
    Ring all-reduce, p = 4: 2·3·5 + 2·(3/4)·40 = 30 + 60 = 90. Ring all-gather / reduce-scatter:
    3·5 + (3/4)·40 = 45. Recursive halving-doubling, p = 8: 2·3·5 + 2·(7/8)·40 = 100; p = 6
    rounds log₂ up: 30 + 2·(5/6)·40 = 96.67. Binomial broadcast, p = 8: 3·(5 + 40) = 135.
    Chain broadcast, p = 4, 4 pieces: (3 + 3)·(5 + 10) = 90. Pairwise all-to-all, p = 4: 45;
    Bruck, p = 8: 3·5 + (40/2)·3 = 75."""
    n, a, b = 4e6, 5.0, ab.beta_of(100)
    assert b == pytest.approx(1e-5)
    assert ab.ring_allreduce(n, 4, a, b) == pytest.approx(90)
    assert ab.ring_allgather(n, 4, a, b) == pytest.approx(45)
    assert ab.ring_reduce_scatter(n, 4, a, b) == pytest.approx(45)
    assert ab.rhd_allreduce(n, 8, a, b) == pytest.approx(100)
    assert ab.rhd_allreduce(n, 6, a, b) == pytest.approx(30 + 2 * 5 / 6 * 40)
    assert ab.binomial_broadcast(n, 8, a, b) == pytest.approx(135)
    assert ab.pipeline_broadcast(n, 4, a, b, pieces=4) == pytest.approx(90)
    assert ab.pairwise_alltoall(n, 4, a, b) == pytest.approx(45)
    assert ab.bruck_alltoall(n, 8, a, b) == pytest.approx(75)
    # vectorised over n and p
    got = ab.ring_allreduce(np.array([0, n]), np.array([2, 4]), a, b)
    assert got.tolist() == pytest.approx([10, 90])


def test_bus_bandwidth_time_is_the_ring_formula():
    """nccl-tests' factors: all-reduce 2(p−1)/p, all-gather (p−1)/p, broadcast 1. With the ring
    all-reduce's latency (30 µs at p = 4, α = 5) and busbw 100 GB/s: 30 + 1.5·4e6/1e5 = 90, the
    ring formula; all-gather 0.75·40 = 30; broadcast 40."""
    assert ab.busbw_time("all_reduce", 4e6, 4, 100, 30) == pytest.approx(90)
    assert ab.busbw_time("all_gather", 4e6, 4, 100) == pytest.approx(30)
    assert ab.busbw_time("broadcast", 4e6, 4, 100) == pytest.approx(40)
    with pytest.raises(NetModelError, match="bus-bandwidth factor"):
        ab.busbw_time("barrier", 4e6, 4, 100)
    with pytest.raises(NetModelError, match="p ≥ 1"):
        ab.ring_allreduce(1e6, 0, 1.0, 1e-5)
    with pytest.raises(NetModelError, match="no 'bruck'"):
        ab.alpha_beta("all_reduce", "bruck", 1e6, 4, 1.0, 1e-5)


# -- the chunk-level simulation -----------------------------------------------------------------


def test_one_chunk_per_step_is_the_alpha_beta_ring():
    """p = 4, n = 4 MB, α = 2 µs, 50 GB/s, one chunk of n/p per step, one slice: each of the
    2(p−1) = 6 steps waits for the previous one: 6·(2 + 1e6/50e3) = 6·22 = 132 µs =
    2(p−1)α + 2((p−1)/p)nβ = 12 + 120. And for every p from 2 to 9 against the formula."""
    beta = ab.beta_of(50)
    got = ring_time_us(6, np.array([1e6]), 1, np.full(4, beta), np.full(4, 2.0))
    assert got == pytest.approx(132)
    for p in range(2, 10):
        t = ring_time_us(2 * (p - 1), np.array([4e6 / p]), 1, np.full(p, beta), np.full(p, 2.0))
        assert t == pytest.approx(ab.ring_allreduce(4e6, p, 2.0, beta))
        t = ring_time_us(p - 1, np.array([4e6 / p]), 1, np.full(p, beta), np.full(p, 2.0))
        assert t == pytest.approx(ab.ring_allgather(4e6, p, 2.0, beta))


def test_two_iterations_overlap_by_hand():
    """p = 2, 2 steps, two iterations of a chunk that takes w = 10 µs, hop α = 3 µs. Rank r:
    step 0 at 0 (ends 10, lands at 13); step 1 waits for it: 13 (ends 23, lands 26); iteration 2
    step 0 needs no data: 23 (ends 33, lands 36); step 1 at max(33, 36) = 36, lands 49. Fully
    serialised would be 2·2·13 = 52: the FIFO sends iteration 2 while step 1's data flies."""
    upb = np.full(2, 10 / 100.0)  # 100-byte chunks at 10 µs each
    assert ring_time_us(2, np.array([100.0, 100.0]), 1, upb, np.full(2, 3.0)) == pytest.approx(49)


def test_slices_hide_the_latency_behind_the_transfer():
    """p = 2, 2 steps, 10 iterations of a 10 µs chunk in 2 slices of 5, α = 1: a slice's data
    lands 6 µs after its start, before the link has sent the chunk (10), so the link never
    idles: 10·2·2 slices × 5 = 200 µs back to back, the last landing at 201."""
    upb = np.full(2, 0.1)
    got = ring_time_us(2, np.full(10, 100.0), 2, upb, np.full(2, 1.0))
    assert got == pytest.approx(201)


def test_periodic_extrapolation_equals_the_full_run():
    """150 iterations (beyond the 64 run one by one): extrapolated = simulated in full, for a
    ring with a slow hop (two nodes) and for a broadcast chain of 200 chunks."""
    upb, lat = np.full(6, 1 / 3000), np.array([0.5, 0.5, 4.0, 0.5, 0.5, 4.0])
    chunks = np.r_[np.full(149, 2e5), 7e4]
    for slices in (1, 2):
        fast = ring_time_us(10, chunks, slices, upb, lat)
        full = ring_time_us(10, chunks, slices, upb, lat, direct=1000)
        assert fast == pytest.approx(full, rel=1e-12)
    cm = ChunkModel("dgx1-v100", 8)
    r = cm.simulate("broadcast", 12 * 200 * 524288.0, "Simple")  # 200 steps per channel
    assert r.iterations == 200
    chain = pipeline_time_us(
        np.full(200, 524288.0), *(x[:7] for x in cm.links("Simple", "broadcast"))
    )
    assert r.time_us == pytest.approx(8.4 + chain, rel=1e-12)


def test_a_tiny_chunk_does_not_build_millions_of_chunks():
    """1 GB in 1-byte chunks: 1e9 / 12 channels / 8 ranks = 10,416,666 full iterations and a
    partial one, extrapolated in milliseconds; never below the bandwidth bound (2·7/8 · 1 GB at
    120 GB/s ≈ 14.6 ms)."""
    r = ChunkModel("dgx1-v100", 8).simulate("all_reduce", 1e9, "Simple", chunk_bytes=1)
    assert r.iterations == 10_416_667 and r.time_us > 2 * 7 / 8 * 1e9 / 120e3


def test_chain_broadcast_by_hand():
    """3 hops, 4 chunks of 10 µs, α = 2: hop 0 sends at 0, 10, 20, 30 (lands 12 … 42); hop 1 at
    12 … 42 (lands 24 … 54); hop 2 lands 36 … 66 = (3 + 4 − 1)·10 + 3·2. Hockney's pipelined
    broadcast charges α to every piece at every stage, (3 + 3)·(2 + 10) = 72: a FIFO sends the
    next chunk while the last one is in flight. In one piece both are 3·(2 + 40) = 126."""
    got = pipeline_time_us(np.full(4, 100.0), np.full(3, 0.1), np.full(3, 2.0))
    assert got == pytest.approx(66)
    assert ab.pipeline_broadcast(400.0, 4, 2.0, 0.1, pieces=4) == pytest.approx(72)
    one = pipeline_time_us(np.array([400.0]), np.full(3, 0.1), np.full(3, 2.0))
    assert one == pytest.approx(126) == ab.pipeline_broadcast(400.0, 4, 2.0, 0.1, pieces=1)


def test_chunk_model_agrees_with_the_tuner_at_one_chunk_per_step():
    """DGX-1 V100, 8 ranks, 1 MB LL128: 12 channels of 83,333 B, 10,417 B per step: one chunk.
    Simulated: base 14 + 14 hops × 1.9 + 14 steps × the chunk at the channel's 110.4/12 GB/s;
    NCCL: 40.6 + 1e6 / (1000 × 63.086) = 56.45 µs — the same sum written two ways."""
    cm = ChunkModel("dgx1-v100", 8)
    r = cm.simulate("all_reduce", 1e6, "LL128")
    assert (r.channels, r.iterations) == (12, 1)
    assert r.time_us == pytest.approx(40.6 + 1e6 / (1000 * 110.4 * 8 / 14))
    assert r.time_us == pytest.approx(NcclModel("dgx1-v100", 8).time_us(
        "all_reduce", 1e6, "ring", "LL128"))  # fmt: skip


# -- NCCL's tuning model and launch rule ------------------------------------------------------


def test_nccl_picks_ring_ll128_for_dlrms_1_5_mb_all_reduce():
    """DGX-1 V100, 8 ranks (6 graph channels × 20 GB/s, busBw 120), 1,576,964 B:
    Ring LL128: latency 14 + 14·1.9 = 40.6, bandwidth min(120·0.92, 6·20) × 8/14 = 63.086 →
    40.6 + 24.997 = 65.597 µs. Ring LL: 6.6 + 14·0.6 = 15, min(39, 60) × 8/14 = 22.286 →
    85.76. Ring Simple: 8.4 + 14·3.4 = 56, 120 × 8/14 = 68.571 → 79.00. Tree LL128: 14 +
    2·7·1.25 = 31.5, min(min(110.4, 6·26.5)·7/9, 120)·0.5 = 42.93, × tree correction 0.6
    (log₂(1,576,964 / 64) = 14) → 92.7. LL128 wins, as the trace's 640-thread kernels show."""
    m = NcclModel("dgx1-v100", 8)
    n = 1576964
    c = m.choose("all_reduce", n)
    assert (c.algorithm, c.protocol) == ("ring", "LL128")
    assert c.time_us == pytest.approx(40.6 + n / (1000 * 110.4 * 8 / 14))
    assert m.time_us("all_reduce", n, "ring", "LL") == pytest.approx(15 + n / (1000 * 39 * 8 / 14))
    assert m.time_us("all_reduce", n, "ring", "Simple") == pytest.approx(
        56 + n / (1000 * 120 * 8 / 14)
    )
    tree = 31.5 + n / (1000 * 110.4 * 7 / 9 * 0.5 * 0.6)
    assert m.time_us("all_reduce", n, "tree", "LL128") == pytest.approx(tree)
    small = m.choose("all_reduce", 448)
    assert (small.protocol, small.time_us) == ("LL", pytest.approx(15 + 448 / (1000 * 39 * 8 / 14)))


def test_what_nccl_enables():
    """LL128 only over NVLink; Tree only for all-reduce; one rank costs nothing."""
    pcie = NcclModel("pcie-gen4", 8)
    assert pcie.choose("all_reduce", 1e6).protocol != "LL128"
    with pytest.raises(NetModelError, match="LL128 needs NVLink"):
        pcie.choose("all_reduce", 1e6, protocol="LL128")
    with pytest.raises(NetModelError, match="Tree is all-reduce only"):
        NcclModel("dgx-a100", 8).choose("all_gather", 1e6, algorithm="tree")
    assert NcclModel("dgx-a100", 1).choose("all_reduce", 1e6).time_us == 0
    with pytest.raises(NetModelError, match="algorithm 'NVLS'.*not modelled"):
        NcclModel("dgx-a100", 8).choose("all_reduce", 1e6, algorithm="NVLS")


def test_launch_rule_by_hand():
    """Ring LL on 2 ranks: threshold 8 × 2 = 16. From 2 channels × 512 threads: 1,000 B <
    2·512·16 → 1 channel; < 512·16, 256·16, 128·16 → 64 threads; 64 is no multiple of 128:
    stop → (1, 64), or (1, 96) with NCCL ≥ 2.19's 3-warp minimum. 12,000 B: 1 channel, 512
    threads (12,000 ≥ 8,192). 16,384 B: (2, 512). Simple 1 MB: 2 × 512 + a sync warp = 544.
    LL128, 8 ranks, 12 channels, threshold 8: 907,840 ≥ 12·640·8 → (12, 640)."""
    assert launch(1000, 2, "LL", "ring", 2, new=False) == (1, 64)
    assert launch(1000, 2, "LL", "ring", 2, new=True) == (1, 96)
    assert launch(12000, 2, "LL", "ring", 2) == (1, 512)
    assert launch(16384, 2, "LL", "ring", 2) == (2, 512)
    assert launch(1e6, 2, "Simple", "ring", 2, ring_bw=20) == (2, 544)
    assert launch(1e6, 2, "Simple", "ring", 2, ring_bw=12) == (2, 288)  # 256 threads at PCIe
    assert launch(907840, 12, "LL128", "ring", 8) == (12, 640)
    assert [protocol_from_threads(t) for t in (640, 512, 544, 96, None)] == [
        "LL128", "LL", "Simple", None, None]  # fmt: skip


# -- topologies ------------------------------------------------------------------------------


def test_ring_graphs_of_the_presets():
    """DGX-1 V100: hop 20, total 120 → speed 20, 6 channels, no duplication (< 25) → 12 in the
    communicator. V100 pair: 1 × 20 → 2. DGX A100: speed 40, 240/40 = 6, duplicated (≥ 25) to
    12 × 20 → 24. DGX H100: Hopper's array starts at 60, 370.8/60 = 6, duplicated (60 ≥ 50) to
    12 × 30 → 24."""
    got = {k: (g.graph_channels, g.bandwidth, g.channels)
           for k in ("dgx1-v100", "v100-nvlink-pair", "dgx-a100", "dgx-h100")
           for g in [preset(k).ring_graph()]}  # fmt: skip
    assert got == {"dgx1-v100": (6, 20.0, 12), "v100-nvlink-pair": (1, 20.0, 2),
                   "dgx-a100": (12, 20.0, 24), "dgx-h100": (12, 30.0, 24)}  # fmt: skip
    # two DGX A100 nodes: the ring crosses 25 GB/s NICs: speed 24 (Inter array), 8 NICs → 8
    two = preset("dgx-a100").for_ranks(16)
    assert two.nodes == 2 and two.ring_graph().graph_channels == 8


def test_bad_topologies_say_what_is_wrong():
    with pytest.raises(NetModelError, match="presets: dgx-a100, dgx-h100, dgx1-v100"):
        preset("dgx-z")
    with pytest.raises(NetModelError, match="no inter-node link"):
        preset("v100-nvlink-pair").for_ranks(4)
    with pytest.raises(NetModelError, match="link kind 'optical'"):
        Link("optical", 10.0)
    with pytest.raises(NetModelError, match="below one hop"):
        Topology("t", "ampere", 4, Link("nvlink", 40.0), intra_total=20.0)
    with pytest.raises(NetModelError, match="architecture 'kepler'"):
        Topology("t", "kepler", 4, Link("nvlink", 20.0), intra_total=20.0)


# -- the replay cost model on four ranks --------------------------------------------------------

#: One ring hop of 20 GB/s (in NCCL's speed array: 1 graph channel, no duplication, busBw 20)
#: with a 5 µs latency of its own.
RING4 = Topology("ring4", "ampere", 4, Link("nvlink", 20.0, latency_us=5.0), intra_total=20.0)
N = 4 * (1 << 20)  # the all-reduce of _four_ranks: 1 << 20 floats


def _ends(rp) -> list[float]:
    ev = rp.events()
    ev = ev[ev["name"] == ALLREDUCE].sort_values("rank")
    return ((ev["sim_ts"] + ev["sim_dur"]) / US).tolist()


def test_alpha_beta_costs_on_four_ranks(tmp_path):
    """Ranks start the all-reduce at 16 µs (0–2) and 66 µs (3, the last). Alpha-beta ring,
    p = 4, α = 5 µs, β = 1/20,000 µs/B: 2·3·5 + 2·(3/4)·4,194,304/20,000 = 30 + 314.5728 =
    344.5728 µs → 344,573 ns; every rank ends at 66 + 344.573 = 410.573 µs (measured: 86), and
    the rendezvous' 4 out-edges carry 344,573 ns."""
    with xpuprof.load(_four_ranks(tmp_path)) as t:
        cc = CollectiveCosts.of(t, topology=RING4, model="alphabeta")
        assert cc.predictions()["predicted_ns"].tolist() == [344573] * 4
        rp = replay(t, costs=cc)
        assert _ends(rp) == pytest.approx([410.573] * 4)
        g = rp.graph
        out = (g.edges.kind == COLLECTIVE) & (g.nodes.kind[g.edges.src] == RENDEZVOUS)
        assert cc.delays(g)[out].tolist() == [344573] * 4


def test_nccl_costs_on_four_ranks(tmp_path):
    """NCCL's model on RING4 (busBw 20 GB/s; hop latency 5 µs overrides NCCL's): Ring Simple
    8.4 + 6·5 = 38.4 + 4,194,304 / (1000 × 20 × 4/6) = 38.4 + 314.5728 = 352.9728 µs; Ring
    LL128 14 + 30 + n / (1000 × 18.4 × 4/6) = 385.9 µs; Ring LL 6.6 + 30 + n/(1000 × 10 ×
    4/6) = 665.7; Tree Simple 8.4 + 2·3·5 = 38.4 + n / (1000 × 18.4 × 0.5 × 0.7) (correction
    at log₂(n/64) = 16) = 689.7. Ring Simple wins: 352,973 ns, ends at 66 + 352.973."""
    with xpuprof.load(_four_ranks(tmp_path)) as t:
        cc = CollectiveCosts.of(t, topology=RING4)
        p = cc.predictions()
        assert p["predicted_ns"].tolist() == [352973] * 4
        assert set(p["protocol"]) == {"Simple"} and set(p["algorithm"]) == {"ring"}
        assert _ends(replay(t, costs=cc)) == pytest.approx([418.973] * 4)


def test_relative_costs_keep_the_measured_transfer(tmp_path):
    """relative=True: delay = measured × model(what-if) / model(as recorded). Unchanged, the
    replay is the measured one (ends at 86 µs). Recorded: RING_LL (an NCCL ≥ 2.19 name, taken
    as it says): 6.6 + 30 + 629.1456 = 665.7456 µs → 665,746 ns. With protocol="Simple":
    352,973 / 665,746 × 20,000 ns (the last arriver's kernel) = 10,603.7 → ends at 76.604 µs."""
    with xpuprof.load(_four_ranks(tmp_path)) as t:
        same = CollectiveCosts.of(t, topology=RING4, relative=True)
        assert _ends(replay(t, costs=same)) == [86, 86, 86, 86]
        simple = CollectiveCosts.of(t, topology=RING4, relative=True, protocol="Simple")
        assert simple.predictions()["ratio"].iloc[0] == pytest.approx(352973 / 665746)
        assert _ends(replay(t, costs=simple)) == pytest.approx([76.604] * 4)


def test_world_size_changes_the_group(tmp_path):
    """world_size=2: ring all-reduce of the same 4 MiB on 2 ranks: 2·1·5 + 2·(1/2)·4,194,304 /
    20,000 = 10 + 209.7152 → 219,715 ns. world_size=8 on a 4-GPU node without a network: a
    clear error naming the missing link."""
    with xpuprof.load(_four_ranks(tmp_path)) as t:
        cc = CollectiveCosts.of(t, topology=RING4, model="alphabeta", world_size=2)
        assert cc.predictions()["predicted_ns"].tolist() == [219715] * 4
        assert _ends(replay(t, costs=cc)) == pytest.approx([285.715] * 4)
        big = CollectiveCosts.of(t, topology=RING4, model="alphabeta", world_size=8)
        assert big.predictions()["reason"].str.contains("no inter-node link").all()


def test_a_collective_without_size_keeps_its_measured_time_and_says_why(tmp_path):
    """Rank 0 alone, an all-reduce without size args (16–89 µs): unpriced, replayed at its
    measured 73 µs; one with sizes (a second rank-0 kernel, 1 MiB, group 4) is priced alone:
    ring alpha-beta 30 + 1.5 × 1,048,576 / 20,000 = 108.6432 µs from its start at 120."""
    tb = TraceBuilder(rank=0, world_size=4)
    tb.step(0, ts=0, dur=400)
    tb.launch(ALLREDUCE, ts=16, dur=73, launch_ts=11, launch_dur=1, stream=20)
    tb.launch(ALLREDUCE, ts=120, dur=50, launch_ts=100, launch_dur=1, stream=20,
              **{"Collective name": "allreduce", "In msg nelems": 1 << 18,
                 "Out msg nelems": 1 << 18, "Group size": 4, "dtype": "Float"})  # fmt: skip
    with tb.load(tmp_path) as t:
        cc = CollectiveCosts.of(t, topology=RING4, model="alphabeta")
        p = cc.predictions()
        assert p["reason"].iloc[0] == "no message size" and np.isnan(p["predicted_ns"].iloc[0])
        assert p["predicted_ns"].iloc[1] == 108643
        ev = replay(t, costs=cc).events()
        ev = ev[ev["name"] == ALLREDUCE].sort_values("ts")
        assert ((ev["sim_ts"] + ev["sim_dur"]) / US).tolist() == pytest.approx([89, 228.643])


def test_bad_settings_are_clear_errors(tmp_path):
    with xpuprof.load(_four_ranks(tmp_path)) as t:
        with pytest.raises(NetModelError, match="collective model 'magic'"):
            CollectiveCosts.of(t, topology=RING4, model="magic")
        with pytest.raises(NetModelError, match="protocol 'LL64'"):
            CollectiveCosts.of(t, topology=RING4, protocol="LL64")
        with pytest.raises(NetModelError, match="no topology preset for the devices"):
            CollectiveCosts.of(t)  # the synthetic trace names no GPU
    with pytest.raises(NetModelError, match="the chunk simulation runs Ring"):
        predict_us("all_reduce", 1e6, 4, topology=RING4, model="chunk", algorithm="tree")


# -- real traces -------------------------------------------------------------------------------


def _raw_kernels(path):
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return [e for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ncclKernel")]


def test_launch_rule_reproduces_the_a100_kernels():
    """All 21 NCCL kernels of the A100 file (2 ranks, NCCL 2.17), sizes from their raw args
    (msg nelems × 4 for Float, × 8 for Long): with the communicator's 8 channels and the
    3-warp minimum, the launch rule gives each kernel's grid and block: 15 all-reduces of 8–31
    MB Simple (8, 544), 3 broadcasts of 212,480 B LL (8, 512), 3 of 424 B (1, 96)."""
    size = {"Float": 4, "Long": 8}
    ks = _raw_kernels(shared_trace("kineto/gpu/a100_rank0of2_nccl.json.gz"))
    assert len(ks) == 21
    for e in ks:
        a = e["args"]
        n = a["In msg nelems"] * size[a["dtype"]]
        proto = protocol_from_threads(a["block"][0]) or "LL"
        got = launch(n, 8, proto, "ring", 2, ring_bw=80, new=True)
        assert got == (a["grid"][0], a["block"][0]), (e["name"], n)


def test_dlrm_all_reduces_are_priced_at_nccls_time(tmp_path):
    """The 8-rank DLRM step on dgx1-v100 (guessed from its V100s): the table reads LL128 from
    the 640-thread all-reduce kernels (the names say RING_LL); the grouped all-to-alls get no
    protocol. Replayed with NCCL's model, each 1,576,964 B all-reduce ends 65.597 µs (hand
    worked above) after its last participant starts; its launch rule gives (12, 640)."""
    d = shared_trace("kineto/gpu/dlrm_8rank_v100")
    store = tmp_path / "dlrm.store"
    xpuprof.import_traces(sorted(d.glob("*.json.gz")), store)
    with xpuprof.load(store) as t:
        tab = collective_table(t)
        big = tab[tab["bytes"] == 1576964]
        assert len(big) == 8 and set(big["protocol"]) == {"LL128"}
        assert set(big["protocol_source"]) == {"threads"} and set(big["channels"]) == {12}
        assert tab.loc[tab["collective"] == "all_to_all", "protocol"].isna().all()
        assert launch(1576964, 12, "LL128", "ring", 8) == (12, 640)
        cc = CollectiveCosts.of(t)
        assert cc.topology == "dgx1-v100"
        rp = replay(t, costs=cc)
        ev = rp.events()
        k = ev[ev["id"].isin(big["id"])]
        off = k["part"].map(rp.graph.offsets)  # each rank's clock → the aligned clock
        start, end = k["sim_ts"] - off, k["sim_ts"] + k["sim_dur"] - off
        assert (end - start.max()).tolist() == [65597] * 8


def test_dlrm_on_an_h100_box_scales_each_measured_transfer(tmp_path):
    """relative=True with topology="dgx-h100" on the V100 DLRM step: the baseline is the
    machine the trace names (dgx1-v100). The 1,576,964 B all-reduce, Ring LL128 on 8 ranks:
    recorded 65,597 ns (above); on DGX H100 (12 graph channels × 30 GB/s, busBw 360):
    40.6 + 1,576,964 / (1000 × min(360 × 0.92, 12 × 36.7) × 8/14) = 48.932 µs → 48,932 ns.
    Its measured transfer (the last arriver's kernel, 86 µs) × 48,932 / 65,597 = 64,152 ns."""
    d = shared_trace("kineto/gpu/dlrm_8rank_v100")
    store = tmp_path / "dlrm.store"
    xpuprof.import_traces(sorted(d.glob("*.json.gz")), store)
    with xpuprof.load(store) as t:
        cc = CollectiveCosts.of(t, relative=True, topology="dgx-h100")
        assert cc.baseline_topology == "dgx1-v100"
        p = cc.predictions()
        assert p.loc[p["bytes"] == 1576964, "ratio"].tolist() == pytest.approx([48932 / 65597] * 8)
        rp = replay(t, costs=cc)
        ev = rp.events()
        k = ev[ev["id"].isin(p.loc[p["bytes"] == 1576964, "id"])]
        off = k["part"].map(rp.graph.offsets)
        start, end = k["sim_ts"] - off, k["sim_ts"] + k["sim_dur"] - off
        assert (end - start.max()).tolist() == [64152] * 8

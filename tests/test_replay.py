"""The replay (``xpuprof.sim``): the engine on hand-built graphs, perturbations of synthetic
traces whose timelines are worked out by hand (so that identity replay is not trivially
exact), collectives across ranks, determinism, bad input, and the identity replay of real
traces.

Times in the synthetic traces are µs (Kineto's unit); the store holds ns, hence the ×1000.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import xpuprof
from tests.builders import TraceBuilder
from tests.conftest import shared as shared_trace
from xpuprof.sim import replay
from xpuprof.sim.costs import Scaled
from xpuprof.sim.engine import simulate
from xpuprof.sim.graph import EDGE_KINDS, SYNC
from xpuprof.sim.replay import run

US = 1000


# -- the engine ------------------------------------------------------------------------------


def test_engine_by_hand():
    """Host 0 → 1 → 2 (10, 5 µs), device 3 → 4 (7 µs); launch 0 → 3 (+3), sync 4 → 2 (+1).
    t0 = 100 (measured, no input), t1 = 110, t3 = 103, t4 = 110, t2 = max(115, 111) = 115.
    A device step of 20 instead of 7: t4 = 123, t2 = max(115, 124) = 124."""
    first = np.array([0, 3])
    start = np.array([100, 0, 0, 999, 0])  # node 3 has an input: its measured time is unused
    src, dst, d = np.array([0, 4]), np.array([3, 2]), np.array([3, 1])
    s = simulate(5, first, np.array([0, 10, 5, 0, 7]), start, src, dst, d)
    assert s.time.tolist() == [100, 110, 115, 103, 110]
    assert s.via[2] == -1  # its own thread set node 2
    s = simulate(5, first, np.array([0, 10, 5, 0, 20]), start, src, dst, d)
    assert s.time.tolist() == [100, 110, 124, 103, 123]
    assert s.via[2] == 1  # the sync edge (cross edge number 1) set it
    assert s.cycles == []


def test_engine_cuts_a_cycle_and_says_which_edges():
    """1 → 3 and 4 → 1 make a cycle (node 1 waits for node 4, which follows node 3, which
    waits for node 1): both cross edges are on it, cut, and the rest is scheduled."""
    first = np.array([0, 3])
    s = simulate(5, first, np.array([0, 10, 5, 0, 7]), np.array([100, 0, 0, 50, 0]),
                 np.array([1, 4]), np.array([3, 1]), np.array([0, 0]))  # fmt: skip
    assert len(s.cycles) == 1 and sorted(s.cycles[0]) == [0, 1]
    # with both cut: node 3 keeps its measured time (50), the host runs 100, 110, 115
    assert s.time.tolist() == [100, 110, 115, 50, 57]


# -- perturbations of synthetic traces ---------------------------------------------------------


def _device_bound(tmp_path, name="dev", kernel="k"):
    """One step 0–50 µs. Four 10 µs kernels launched at 1, 3, 5, 7 (1 µs calls); the first
    starts 5 µs after its launch (6–16), the others queue behind it (16–26, 26–36, 36–46);
    cudaDeviceSynchronize 9–48 waits for the last (2 µs to wake up); 2 µs of host work after
    it. No cuda_sync events: the wait is inferred from the last kernel launched before it.
    The kernels are named ``{kernel}0`` to ``{kernel}3``."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=50)
    for i, (call, k) in enumerate(((1, 6), (3, 16), (5, 26), (7, 36))):
        tb.launch(f"{kernel}{i}", ts=k, dur=10, launch_ts=call, launch_dur=1)
    tb.runtime("cudaDeviceSynchronize", 9, 39)
    tb.op("tail", 48, 2)
    return tb.store(tmp_path, name)


def _host_bound(tmp_path, name="host"):
    """One step 0–45 µs. Four 2 µs kernels launched every 10 µs (calls at 1, 11, 21, 31),
    each starting 5 µs after its launch (6–8, 16–18, 26–28, 36–38): the device waits for the
    host. cudaDeviceSynchronize 41–43 finds the device idle; 2 µs of host work after it."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=45)
    for i, call in enumerate((1, 11, 21, 31)):
        tb.launch(f"k{i}", ts=call + 5, dur=2, launch_ts=call, launch_dur=1)
    tb.runtime("cudaDeviceSynchronize", 41, 2)
    tb.op("tail", 43, 2)
    return tb.store(tmp_path, name)


def _step_us(rp) -> float:
    return float(rp.steps["simulated_ns"].iloc[0]) / US


def test_identity_replay_of_the_synthetic_traces(tmp_path):
    for store, step in ((_device_bound(tmp_path), 50), (_host_bound(tmp_path), 45)):
        with xpuprof.load(store) as t:
            rp = replay(t)
            assert rp.steps["measured_ns"].iloc[0] == step * US
            assert _step_us(rp) == step
            ev = rp.events()
            assert (ev["sim_ts"] == ev["ts"]).all() and (ev["sim_dur"] == ev["dur"]).all()


def test_doubling_kernels_doubles_the_device_bound_step_part(tmp_path):
    """Kernels 20 µs: 6–26, 26–46, 46–66, 66–86 (queued back to back, as measured); the sync
    ends 2 µs after the last (88), the tail runs 88–90: the step is 90 µs, the device's 40 µs
    became 80."""
    with xpuprof.load(_device_bound(tmp_path)) as t:
        rp = replay(t, costs=Scaled(2.0))
        assert _step_us(rp) == 90
        ev = rp.events().set_index("name")
        assert [ev.loc[f"k{i}", "sim_ts"] / US for i in range(4)] == [6, 26, 46, 66]
        assert ev.loc["cudaDeviceSynchronize", "sim_dur"] / US == 88 - 9


def test_doubling_kernels_changes_nothing_when_host_bound(tmp_path):
    """Kernels 4 µs: 6–10, 16–20, 26–30, 36–40, each still waiting for its launch; the sync at
    41 finds the last done (40 < 41) and takes its own 2 µs: the step stays 45 µs."""
    with xpuprof.load(_host_bound(tmp_path)) as t:
        rp = replay(t, costs=Scaled(2.0))
        assert _step_us(rp) == 45
        ev = rp.events().set_index("name")
        assert [ev.loc[f"k{i}", "sim_ts"] / US for i in range(4)] == [6, 16, 26, 36]
        assert [ev.loc[f"k{i}", "sim_dur"] / US for i in range(4)] == [4] * 4


def test_removing_the_sync_lets_the_host_run_ahead(tmp_path):
    """Without its sync edge, cudaDeviceSynchronize (9–48 measured) no longer waits: it ends at
    its start (it did wait in the trace, so its own time counts as 0), the tail runs 9–11, the
    host is 39 µs ahead (48 − 9) and the step is 11 µs. The kernels do not move."""
    with xpuprof.load(_device_bound(tmp_path)) as t:
        rp = replay(t)
        g = rp.graph
        assert g.edge_counts()["sync"] == 1
        sched = run(g, keep=g.edges.kind != SYNC)
        names = rp.events().set_index("id")["name"]
        at = {names[e]: int(sched.time[i]) for i, e in enumerate(g.nodes.event)
              if e >= 0 and g.nodes.kind[i] in (0, 2)}  # fmt: skip
        ends = {names[e]: int(sched.time[i]) for i, e in enumerate(g.nodes.event)
                if e >= 0 and g.nodes.kind[i] in (1, 3)}  # fmt: skip
        assert ends["cudaDeviceSynchronize"] == 9 * US
        assert at["tail"] == 48 * US - 39 * US
        assert ends["ProfilerStep#0"] - at["ProfilerStep#0"] == 11 * US
        assert [at[f"k{i}"] for i in range(4)] == [6 * US, 16 * US, 26 * US, 36 * US]


def test_edge_counts_of_the_device_bound_trace(tmp_path):
    """Counted by hand from the events built: host thread: step, 4 launches, sync, tail =
    7 events, 14 points, 13 timeline edges: into the starts of the 4 calls, the sync and the
    tail (inside the step: host_work), into every end (host_work), and none into the step's
    start (the thread's first point): 13 host_work, 0 host_gap. Device: 4 kernels → 4
    device_work, 3 stream_order; 4 launches; 1 sync."""
    with xpuprof.load(_device_bound(tmp_path)) as t:
        c = replay(t).graph.edge_counts()
    assert c == {**dict.fromkeys(EDGE_KINDS, 0), "host_work": 13, "device_work": 4,
                 "stream_order": 3, "launch": 4, "sync": 1}  # fmt: skip


# -- collectives across ranks ------------------------------------------------------------------

ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _four_ranks(tmp_path, clock=(0, 0, 0, 0)):
    """Four ranks, one step 0–200 µs each. Each runs an op "prep" from 0 (10 µs; rank 3: 60
    µs, the late rank), launches an all-reduce right after it (1 µs call), which starts 5 µs
    after the launch: at 16 µs on ranks 0–2, at 66 µs on rank 3. Rank 3's kernel is pure
    transfer: 20 µs (66–86). The others wait for it and end with it at 86 (their durations
    include the wait). Rank r's clock reads ``clock[r]`` µs ahead (all its times shifted)."""
    files = []
    for r in range(4):
        tb = TraceBuilder(rank=r, world_size=4)
        prep = 60 if r == 3 else 10
        c = clock[r]
        tb.step(0, ts=c, dur=200)
        tb.op("prep", c, prep)
        start = prep + 1 + 5
        tb.launch(ALLREDUCE, ts=c + start, dur=86 - start, launch_ts=c + prep + 1, launch_dur=1,
                  stream=20, **{"Collective name": "allreduce", "In msg nelems": 1 << 20,
                                "Out msg nelems": 1 << 20, "Group size": 4, "dtype": "Float",
                                "Process Group Name": "0",
                                "Process Group Ranks": "[0, 1, 2, 3]"})  # fmt: skip
        files.append(tb.write(tmp_path / f"rank{r}.json"))
    store = tmp_path / "four.store"
    xpuprof.import_traces(files, store)
    return store


def _coll_ends(rp) -> list[float]:
    ev = rp.events()
    ev = ev[ev["name"] == ALLREDUCE].sort_values("rank")
    return ((ev["sim_ts"] + ev["sim_dur"]) / US).tolist()


def test_a_collective_ends_at_the_late_ranks_start_plus_its_transfer(tmp_path):
    """Every rank's all-reduce ends at 66 + 20 = 86 µs. Rank 2's clock is 1000 µs ahead: the
    clocks are aligned on the collective's ends (the comm tool's alignment), so rank 2 waits
    for rank 3 all the same, and its end reads 1086 on its own clock."""
    with xpuprof.load(_four_ranks(tmp_path, (0, 0, 1000, 0))) as t:
        rp = replay(t)
        assert rp.graph.edge_counts()["collective"] == 8  # 4 in, 4 out of one rendezvous
        assert rp.graph.offsets == {0: 0, 1: 0, 2: 1000 * US, 3: 0}
        assert _coll_ends(rp) == [86, 86, 1086, 86]


def test_a_later_late_rank_delays_every_rank(tmp_path):
    """Rank 3's prep twice as long (120 µs): its launch at 121, its kernel at 126, every
    all-reduce ends at 126 + 20 = 146 µs; ranks 0–2 start theirs at 16 as before."""
    with xpuprof.load(_four_ranks(tmp_path)) as t:
        prep3 = int(t.sql("select id from events where name = 'prep' and rank = 3")["id"][0])
        rp = replay(t, costs=Scaled(2.0, kinds=("host_work",), events=[prep3]))
        assert _coll_ends(rp) == [146, 146, 146, 146]
        ev = rp.events()
        starts = ev[ev["name"] == ALLREDUCE].sort_values("rank")["sim_ts"] / US
        assert starts.tolist() == [16, 16, 16, 126]


def test_a_collective_without_partners_runs_as_measured_and_is_listed(tmp_path):
    """Rank 0 alone of a 4-rank job: its all-reduce (16–89 µs) is replayed at its measured
    73 µs and listed as unmodelled."""
    tb = TraceBuilder(rank=0, world_size=4)
    tb.step(0, ts=0, dur=200)
    tb.launch(ALLREDUCE, ts=16, dur=73, launch_ts=11, launch_dur=1, stream=20)
    with tb.load(tmp_path) as t:
        rp = replay(t)
        assert _coll_ends(rp) == [89]
        u = rp.unmodelled
        assert len(u) == 1 and u["what"].iloc[0] == "collective"
        assert u["name"].iloc[0] == ALLREDUCE and "without partners" in u["reason"].iloc[0]


# -- bad input, determinism -----------------------------------------------------------------------


def test_a_store_without_device_events_replays_the_host_and_says_so(tmp_path):
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=30)
    tb.op("a", 2, 10)
    tb.op("b", 15, 10)
    with tb.load(tmp_path) as t:
        rp = replay(t)
        assert rp.steps["simulated_ns"].tolist() == [30 * US]
        assert any("no device events" in n for n in rp.notes)
        assert rp.graph.edge_counts()["launch"] == 0


def test_replay_is_deterministic(tmp_path):
    """Two replays (fresh opens of the store) give bit-identical timelines."""

    def digest(sub: str) -> str:
        (tmp_path / sub).mkdir()
        with xpuprof.load(_four_ranks(tmp_path / sub, (0, 5, 0, 0))) as t:
            rp = replay(t, costs=Scaled(1.5))
            return hashlib.sha256(rp.time.tobytes() + rp.graph.edges.delay.tobytes()).hexdigest()

    assert digest("a") == digest("b")


def test_unknown_rank_is_a_clear_error(tmp_path):
    from xpuprof.core.errors import XpuprofError

    with xpuprof.load(_host_bound(tmp_path)) as t, pytest.raises(XpuprofError, match="no rank"):
        replay(t, ranks=[7])


# -- real traces -------------------------------------------------------------------------------


def _import(paths, tmp_path):
    store = tmp_path / "real.store"
    xpuprof.import_traces(paths, store)
    return store


@pytest.mark.parametrize("name", ["kineto/gpu/a100_alexnet_cuda_sync.json.gz",
                                  "kineto/gpu/v100_ns_resolution.json.gz",
                                  "kineto/gpu/mi250_rocm_minitoy.json.gz"])  # fmt: skip
def test_identity_replay_of_single_rank_real_traces_is_exact(name, tmp_path):
    """One rank, no collectives across ranks: every replayed event starts and ends where it
    was measured (the calibration gives each binding input its measured gap)."""
    with xpuprof.load(_import([shared_trace(name)], tmp_path)) as t:
        rp = replay(t)
        ev = rp.events()
        assert len(ev) > 50
        assert (ev["sim_ts"] == ev["ts"]).all() and (ev["sim_dur"] == ev["dur"]).all()


def test_launch_edges_match_the_raw_trace(tmp_path):
    """Launch edges = device events whose correlation id is also on a runtime call, counted
    from the raw JSON (every event of the file is in one window here)."""
    path = shared_trace("kineto/gpu/a100_alexnet_cuda_sync.json.gz")
    import gzip

    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    runtime = ("cuda_runtime", "cuda_driver")
    calls = {e["args"]["correlation"] for e in ev
             if e.get("cat") in runtime and "correlation" in e.get("args", {})}  # fmt: skip
    work = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and e.get("args", {}).get("correlation") in calls]  # fmt: skip
    with xpuprof.load(_import([path], tmp_path)) as t:
        assert replay(t).graph.edge_counts()["launch"] == len(work)


def test_dlrm_eight_ranks_within_two_percent(tmp_path):
    """The 8-rank DLRM step: collectives modelled across ranks (the ends are not copied), every
    rank's step within 2 % of the measured one."""
    d = shared_trace("kineto/gpu/dlrm_8rank_v100")
    with xpuprof.load(_import(sorted(d.glob("*.json.gz")), tmp_path)) as t:
        rp = replay(t)
        assert len(rp.steps) == 8
        assert rp.graph.edge_counts()["collective"] == 2 * 64
        assert rp.steps["error_pct"].abs().max() <= 2
        ev = rp.events()
        coll = ev[ev["level"] == "collective"]
        assert (coll["sim_ts"] + coll["sim_dur"] != coll["ts"] + coll["dur"]).any()


def test_a_step_window_replays_that_step_only(tmp_path):
    """Two device-bound steps (0–50 and 60–110 µs, the second a copy of the first 60 µs
    later); --steps 1 replays the second alone: 7 host events and 4 kernels, its first host
    event starts where measured (60), its kernels are driven by their launches (66 …)."""
    tb = TraceBuilder(rank=0)
    for n, t0 in ((0, 0), (1, 60)):
        tb.step(n, ts=t0, dur=50)
        for i, (call, k) in enumerate(((1, 6), (3, 16), (5, 26), (7, 36))):
            tb.launch(f"s{n}k{i}", ts=t0 + k, dur=10, launch_ts=t0 + call, launch_dur=1)
        tb.runtime("cudaDeviceSynchronize", t0 + 9, 39)
        tb.op("tail", t0 + 48, 2)
    with tb.load(tmp_path) as t:
        rp = replay(t, steps=[1])
        ev = rp.events()
        assert len(ev) == 11 and set(ev["name"]) >= {"ProfilerStep#1", "s1k0", "s1k3"}
        assert not ev["name"].str.startswith("s0").any()
        assert rp.steps["step"].tolist() == [1] and _step_us(rp) == 50
        k = rp.events().set_index("name")
        assert k.loc["s1k0", "sim_ts"] / US == 66
        rp2 = replay(t, steps=[1], costs=Scaled(2.0))
        assert _step_us(rp2) == 90  # as the single device-bound step, 60 µs later


def _waiting_stream(tmp_path, with_wait_call: bool):
    """Stream 20: a 100 µs kernel "producer" launched at 1, running 6–106. Stream 7: a 10 µs
    kernel "consumer" launched at 10 (its stream idle) that starts only at 108, 2 µs after the
    producer ends: it waited for it. With ``with_wait_call``, the thread called
    cudaStreamWaitEvent at 5 (between the two launches), as PyTorch does; no cuda_sync events.
    Three 1 µs kernels on stream 30 (launched at 120, 130, 140) and the producer make the
    typical launch latency 5 µs (the median of 5, 5, 5, 5 and the consumer's 98)."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=200)
    for call in (120, 130, 140):
        tb.launch("other", ts=call + 5, dur=1, launch_ts=call, launch_dur=1, stream=30)
    tb.launch("producer", ts=6, dur=100, launch_ts=1, launch_dur=1, stream=20)
    if with_wait_call:
        tb.runtime("cudaStreamWaitEvent", 5, 1)
    tb.launch("consumer", ts=108, dur=10, launch_ts=10, launch_dur=1, stream=7)
    return tb.store(tmp_path, f"wait{int(with_wait_call)}")


def test_an_inferred_stream_wait_carries_a_slower_producer(tmp_path):
    """Producer ×2 (200 µs: 6–206): the consumer starts 2 µs after it, at 208 µs."""
    with xpuprof.load(_waiting_stream(tmp_path, True)) as t:
        rp = replay(t)
        assert rp.graph.edge_counts()["stream_wait_event"] == 1
        assert any("1 stream waits inferred" in n for n in rp.notes)
        prod = int(t.sql("select id from events where name = 'producer'")["id"][0])
        ev = replay(t, costs=Scaled(2.0, events=[prod])).events().set_index("name")
        assert ev.loc["consumer", "sim_ts"] / US == 208


def test_no_stream_wait_is_inferred_without_the_call(tmp_path):
    """The same timeline without a cudaStreamWaitEvent call: nothing says the consumer waited
    for the producer, so no edge; its late start stays a measured launch latency (98 µs)."""
    with xpuprof.load(_waiting_stream(tmp_path, False)) as t:
        rp = replay(t)
        assert rp.graph.edge_counts()["stream_wait_event"] == 0
        prod = int(t.sql("select id from events where name = 'producer'")["id"][0])
        ev = replay(t, costs=Scaled(2.0, events=[prod])).events().set_index("name")
        assert ev.loc["consumer", "sim_ts"] / US == 108


def test_a_backward_op_on_the_autograd_thread_follows_its_forward_op(tmp_path):
    """Main thread: step 0–100, op "fwd" 10–40. Autograd thread (tid 2): "bwd" 45–75, its
    first event, linked to "fwd" by a fwdbwd flow. Identity: bwd at 45 (5 µs after fwd ends).
    fwd ×2 (10–70): bwd starts at 75; fwd ×0.5 (10–25): bwd starts at 30 — it is driven by
    its forward op, not pinned to its measured start."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=100)
    tb.op("fwd", 10, 30)
    tb.flow("fwdbwd", 1, "s", 10)
    tb.op("bwd", 45, 30, tid=2)
    tb.flow("fwdbwd", 1, "f", 45, tid=2, bp="e")
    with tb.load(tmp_path) as t:
        rp = replay(t)
        assert rp.graph.edge_counts()["fwdbwd"] == 1
        fwd = int(t.sql("select id from events where name = 'fwd'")["id"][0])
        for factor, at in ((1.0, 45), (2.0, 75), (0.5, 30)):
            ev = replay(t, costs=Scaled(factor, kinds=("host_work",), events=[fwd])).events()
            assert ev.set_index("name").loc["bwd", "sim_ts"] / US == at


def test_work_overlapping_on_one_stream_runs_in_lanes(tmp_path):
    """Stream 7 records "a" 0–100, "b" 50–80 (overlapping a, as XLA's async work on one TPU
    line) and "c" 110–120, none launched by a call. Lanes: a, c | b. "a" ×2 (0–200): c,
    after a in its lane with the measured 10 µs gap, starts at 210; b keeps its 50."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=5)
    for name, ts, dur in (("a", 0, 100), ("b", 50, 30), ("c", 110, 10)):
        tb.kernel(name, ts, dur, stream=7)
    with tb.load(tmp_path) as t:
        ev = replay(t).events().set_index("name")
        assert (ev["sim_ts"] == ev["ts"]).all()
        a = int(t.sql("select id from events where name = 'a'")["id"][0])
        ev = replay(t, costs=Scaled(2.0, events=[a])).events().set_index("name")
        assert [ev.loc[n, "sim_ts"] / US for n in "abc"] == [0, 50, 210]


def test_work_that_started_after_a_long_launch_call_waits_for_its_return(tmp_path):
    """cudaLaunchKernel 10–3010 µs (a lazy module load), its kernel at 3015: submitted when the
    call returned. The call twice as fast (10–1510): the kernel starts at 1515."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=4000)
    tb.launch("k", ts=3015, dur=10, launch_ts=10, launch_dur=3000)
    with tb.load(tmp_path) as t:
        call = int(t.sql("select id from events where name = 'cudaLaunchKernel'")["id"][0])
        ev = replay(t, costs=Scaled(0.5, kinds=("host_work",), events=[call])).events()
        assert ev.set_index("name").loc["k", "sim_ts"] / US == 1515


def test_a_cycle_in_a_graph_is_cut_and_reported_not_looped_on(tmp_path):
    """A contradictory dependency added to the device-bound graph — the last kernel's end
    before the first launch call's start — closes a cycle (launch → kernels → that edge → the
    launch). The engine cuts it, names the edge, and schedules the rest as measured."""
    import dataclasses

    with xpuprof.load(_device_bound(tmp_path)) as t:
        g = replay(t).graph
        names = replay(t).events().set_index("id")["name"]
        node_name = [names.get(e, "") for e in g.nodes.event]
        k3_end = next(i for i, n in enumerate(node_name) if n == "k3" and g.nodes.kind[i] == 3)
        call0 = next(i for i, n in enumerate(node_name)
                     if n == "cudaLaunchKernel" and g.nodes.kind[i] == 0)  # fmt: skip
        e = g.edges
        bad = dataclasses.replace(
            e,
            **{
                f.name: np.r_[getattr(e, f.name), v]
                for f, v in zip(
                    dataclasses.fields(e), (k3_end, call0, 5, 0, 0, False, False, -1), strict=True
                )
            },
        )
        sched = run(dataclasses.replace(g, edges=bad))
        assert len(sched.cycles) == 1
        cross = np.flatnonzero(~bad.timeline)
        assert len(e.src) in cross[sched.cycles[0]]  # the added edge is on the cycle cut
        assert (sched.time == g.aligned).all()


def test_hand_offs_between_host_threads_are_inferred(tmp_path):
    """Main thread (tid 1): step 0–96 ms, "forward" 0–30 ms, then idle until "optimizer"
    80.5–93.5 ms. Autograd thread (tid 2): "backward" 30.2–80 ms. No fwdbwd flow (as in 2021
    traces): inferred, the backward waits for the forward's end (0.2 ms later), the optimizer
    for the backward's end (0.5 ms later). The forward ×2 (0–60 ms): backward 60.2–110,
    optimizer 110.5–123.5, the step ends 2.5 ms later: 126 ms."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=96_000)
    tb.op("forward", 0, 30_000)
    tb.op("backward", 30_200, 49_800, tid=2)
    tb.op("optimizer", 80_500, 13_000)
    with tb.load(tmp_path) as t:
        rp = replay(t)
        assert rp.graph.edge_counts()["handoff"] == 2
        fwd = int(t.sql("select id from events where name = 'forward'")["id"][0])
        r2 = replay(t, costs=Scaled(2.0, kinds=("host_work",), events=[fwd]))
        ev = r2.events().set_index("name")
        assert ev.loc["backward", "sim_ts"] / US == 60_200
        assert ev.loc["optimizer", "sim_ts"] / US == 110_500
        assert _step_us(r2) == 126_000

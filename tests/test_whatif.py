"""What-if (``xpuprof.sim.whatif``): the change language, and predictions on synthetic traces
whose changed timelines are worked out by hand (times in µs, as the builder writes them)."""

from __future__ import annotations

import pytest

import xpuprof
from tests.builders import TraceBuilder
from tests.conftest import cli, cli_json
from tests.test_replay import _device_bound as device_bound
from tests.test_replay import _host_bound as host_bound
from xpuprof.core.errors import XpuprofError
from xpuprof.sim.paths import CATEGORIES
from xpuprof.sim.whatif import parse, whatif

US = 1000


def _device_bound(tmp_path):
    """tests/test_replay.py's: one step 0–50; four 10 µs kernels ``gemm0``–``gemm3`` launched
    at 1, 3, 5, 7 (1 µs calls), running 6–46 back to back; cudaDeviceSynchronize 9–48 waits
    for the last; "tail" 48–50."""
    return device_bound(tmp_path, "dev", kernel="gemm")


def _host_bound(tmp_path):
    """tests/test_replay.py's: one step 0–45: a 1 µs launch every 10 µs (1, 11, 21, 31), each
    2 µs kernel 5 µs after its call (4 µs after its return); cudaDeviceSynchronize 41–43 finds
    the device idle; "tail" 43–45. Between the calls the host runs no op."""
    return host_bound(tmp_path, "host")


def _input_steps(starts: tuple[int, ...]) -> TraceBuilder:
    """Steps of 30 µs at ``starts``, each a 20 µs DataLoader span (a record_function
    annotation, as PyTorch names it) then 10 µs of "compute"."""
    tb = TraceBuilder(rank=0)
    for n, t0 in enumerate(starts):
        tb.step(n, ts=t0, dur=30)
        tb.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t0, 20)
        tb.op("compute", t0 + 20, 10)
    return tb


def _step(w) -> float:
    return float(w.steps["predicted_ns"].iloc[0]) / US


def test_the_change_language():
    c = parse("scale:kernel/gemm=0.5")
    assert (c.verb, c.levels, c.pattern, c.factor) == ("scale", ("kernel",), "gemm", 0.5)
    assert parse("host-gaps=0").factor == 0
    assert parse("no-sync:cudaMemcpy").pattern == "cudaMemcpy"
    assert parse("no-input-wait").pattern  # the DataLoader spans by default
    for bad, says in (("speed:kernel=2", "unknown change"), ("scale:gpu=2", "unknown selector"),
                      ("scale:kernel", "say the factor"), ("scale:kernel=x", "not a number"),
                      ("scale:kernel=-1", "≥ 0"), ("scale:op/(=2", "bad pattern"),
                      ("no-sync=2", "takes no factor")):  # fmt: skip
        with pytest.raises(XpuprofError, match=says):
            parse(bad)


def test_kernels_twice_as_slow_on_a_device_bound_step(tmp_path):
    """Kernels 20 µs, back to back 6–86; the sync ends 2 µs after (88), the tail 88–90: the
    step is 90 µs, a speedup of 50/90."""
    with xpuprof.load(_device_bound(tmp_path)) as t:
        w = whatif(t, ["scale:kernel=2"])
        assert w.steps["baseline_ns"].iloc[0] == 50 * US
        assert _step(w) == 90
        assert w.summary["speedup"].iloc[0] == round(50 / 90, 4)
        r = w.result()
        assert r.facts["headline"].startswith("scale:kernel=2: step 0.050 ms → 0.090 ms")


def test_a_pattern_selects_by_name(tmp_path):
    """Only gemm2 twice as slow: 26–46, gemm3 46–56, the sync ends at 58, the step at 60."""
    with xpuprof.load(_device_bound(tmp_path)) as t:
        assert _step(whatif(t, ["scale:kernel/gemm2$=2"])) == 60


def test_removing_the_sync(tmp_path):
    """The sync no longer waits: it ends at its start (9), the tail 9–11: an 11 µs step."""
    with xpuprof.load(_device_bound(tmp_path)) as t:
        assert _step(whatif(t, ["no-sync"])) == 11


def test_cuda_graphs_remove_the_launch_calls_host_time(tmp_path):
    """The four 1 µs launch calls cost nothing: the host reaches the sync 4 µs earlier (37),
    the last kernel ends at 34 (its call at 28, its kernel 4 µs after the call returned), so
    the sync takes its own 2 µs (37–39) and the tail 39–41: a 41 µs step."""
    with xpuprof.load(_host_bound(tmp_path)) as t:
        w = whatif(t, ["cuda-graphs"])
        assert _step(w) == 41


def test_less_python_between_ops(tmp_path):
    """host-gaps=0 removes the step's time outside its ops (0–1, 2–11, 12–21, 22–31, 32–41):
    the calls run 0–1, 1–2, 2–3, 3–4 and the sync starts at 4. Each kernel starts 4 µs after
    its call returns, but now behind the one before on its stream: 5–7, 7–9, 9–11, 11–13.
    The sync (which never waited in the trace: wake-up 0) ends with the last kernel at 13,
    the tail runs 13–15: a 15 µs step, from 45."""
    with xpuprof.load(_host_bound(tmp_path)) as t:
        w = whatif(t, ["host-gaps=0"])
        assert _step(w) == 15
        ev = w.baseline.events().set_index("id")
        at = {ev.loc[e, "name"]: int(w.time[i]) for i, e in enumerate(w.baseline.graph.nodes.event)
              if e >= 0 and w.baseline.graph.nodes.kind[i] == 2}  # fmt: skip
        assert [at[f"k{i}"] / US for i in range(4)] == [5, 7, 9, 11]


def test_the_critical_path_sums_to_the_step_and_shifts(tmp_path):
    """Per rank the categories add up to the step (baseline 50, predicted 90 µs); with kernels
    twice as slow, device compute grows by 40 µs on the path."""
    with xpuprof.load(_device_bound(tmp_path)) as t:
        w = whatif(t, ["scale:kernel=2"])
        cp = w.critical_path.set_index("category")
        assert list(cp.index) == list(CATEGORIES)
        assert cp["baseline_ns"].sum() == 50 * US and cp["predicted_ns"].sum() == 90 * US
        assert cp.loc["device compute", "shift_ns"] == 40 * US


def test_removing_input_waits(tmp_path):
    """A 20 µs DataLoader span (a record_function annotation, as PyTorch names it) opens the
    step (0–20), then "compute" 20–30: without the input wait the step is 10 µs."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=30)
    tb.annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 20)
    tb.op("compute", 20, 10)
    with tb.load(tmp_path) as t:
        assert _step(whatif(t, ["no-input-wait"])) == 10


def test_a_change_that_selects_nothing_says_what_exists(tmp_path):
    with xpuprof.load(_device_bound(tmp_path)) as t:
        with pytest.raises(XpuprofError, match="selects no replayed event.*gemm0"):
            whatif(t, ["scale:kernel/conv=0.5"])
        with pytest.raises(XpuprofError, match="no collective events"):
            whatif(t, ["scale:collective=0.5"])


def test_cli(tmp_path):
    """`xpuprof whatif STORE --change … --change … --json`: the changes apply together."""
    store = _device_bound(tmp_path)
    doc = cli_json("whatif", store, "--change", "scale:kernel=2", "--change", "no-sync")
    assert doc["facts"]["changes"] == "scale:kernel=2; no-sync"
    assert doc["facts"]["predicted_ns"] == 11 * US  # without the sync, the kernels don't matter
    bad = cli("whatif", store, "--change", "scale:kernel/conv=2")
    assert bad.returncode == 2 and "selects no replayed event" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_dataloader_workers(tmp_path):
    """Two steps (0–30, 40–70), each a 20 µs DataLoader span then 10 µs of compute. With
    workers the batch is made while the step computes: the wait is max(0, 20/N − 10) µs —
    N=1: 10 (steps of 20 µs), N=2 and more: 0 (steps of 10 µs)."""
    tb = _input_steps((0, 40))
    with tb.load(tmp_path) as t:
        for workers, step in ((1, 20), (2, 10), (4, 10)):
            w = whatif(t, [f"dataloader-workers={workers}"])
            assert (w.steps["predicted_ns"] / US).tolist() == [step, step], workers
        with pytest.raises(XpuprofError, match="how many workers"):
            whatif(t, ["dataloader-workers=0.5"])


def test_dataloader_workers_share_the_cpus(tmp_path, monkeypatch):
    """The same two steps on a process with 2 CPUs (what xpuprof.profile records): the
    workers and the main process share them, so a step lasts max(10, 20/N, (10 + 20)/2) =
    15 µs for N=2 and N=4; N=1 still waits: max(10, 20, 15) = 20 µs."""
    import xpuprof.sim.whatif as wi

    monkeypatch.setattr(wi, "_cpus", lambda trace: {0: 2})
    tb = _input_steps((0, 40))
    with tb.load(tmp_path) as t:
        for workers, step in ((1, 20), (2, 15), (4, 15)):
            w = whatif(t, [f"dataloader-workers={workers}"])
            assert (w.steps["predicted_ns"] / US).tolist() == [step, step], workers
            assert any("2 CPUs shared" in n for n in w.notes)


def test_a_capture_records_the_cpus_it_could_use(tmp_path):
    """xpuprof.profile writes the process's CPU count (its affinity) into the store."""
    import os

    torch = pytest.importorskip("torch")
    with xpuprof.profile(tmp_path / "s", level="op"):
        for i in range(2):
            xpuprof.step(i)
            torch.ones(4).sum()
    with xpuprof.load(tmp_path / "s") as t:
        meta = t.sources[0]["meta"]["xpuprof_capture"]
    assert meta["cpus"] == len(os.sched_getaffinity(0))


def test_priced_changes_parse():
    c = parse("collective:algorithm=tree,protocol=simple,channels=12,world=16")
    assert c.verb == "collective" and '"world": 16' in c.pattern
    assert parse("device=h100-sxm").pattern == "h100-sxm"
    for bad, says in (("collective:speed=2", "KEY one of"), ("collective:channels=x",
                      "not a number"), ("collective:", "say what changes"),
                      ("device=", "name the device")):  # fmt: skip
        with pytest.raises(XpuprofError, match=says):
            parse(bad)


def test_a_collective_change_moves_every_ranks_end(tmp_path):
    """The 4-rank job of tests/test_replay.py (rank 3 arrives last, at 66 µs; its kernel is
    the 20 µs transfer; no GPU recorded, so the topology is named): with the Simple protocol
    every rank's all-reduce ends at
    66 µs + 20 µs × (NCCL's model: Simple / as recorded), the ratio read from the model's own
    predictions table."""
    from tests.test_replay import ALLREDUCE, _four_ranks
    from xpuprof.sim.netmodel.costs import CollectiveCosts

    with xpuprof.load(_four_ranks(tmp_path)) as t:
        ratio = CollectiveCosts.of(t, relative=True, protocol="simple",
                                   topology="dgx-a100").predictions()["ratio"]  # fmt: skip
        assert ratio.nunique() == 1 and ratio.iloc[0] != 1
        w = whatif(t, ["collective:protocol=simple,topology=dgx-a100"])
        ev = w.baseline.events()
        g = w.baseline.graph
        end = {int(e): int(w.time[i]) for i, e in enumerate(g.nodes.event) if g.nodes.kind[i] == 3}
        ends = [end[i] for i in ev.loc[ev["name"] == ALLREDUCE, "id"]]
        want = 66 * US + round(20 * US * float(ratio.iloc[0]))
        assert all(abs(x - want) <= 1 for x in ends), (ends, want)


def test_dataloader_workers_on_back_to_back_steps(tmp_path):
    """Steps 0–30 and 30–60 with no gap: the second step's input span starts at the first's
    end and belongs to the second only; each step still becomes 10 µs with 2 workers."""
    tb = _input_steps((0, 30))
    with tb.load(tmp_path) as t:
        w = whatif(t, ["dataloader-workers=2"])
        assert (w.steps["predicted_ns"] / US).tolist() == [10, 10]


def test_a_blocking_copy_made_asynchronous(tmp_path):
    """Step 0–80. "k0" launched 1–2, runs 6–10 (4 µs after its call returned: the typical
    launch latency). A pageable copy: cudaMemcpyAsync 20–70 stages the data, its copy runs
    65–70, the call returns with it; "after" 70–80. no-sync: the call returns at once (20),
    "after" runs 20–30, the step is 30 µs; the copy, now from pinned memory, is submitted as a
    launch is: 4 µs after its call (24–29) instead of 45 µs of staging."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=80)
    tb.launch("k0", ts=6, dur=4, launch_ts=1, launch_dur=1)
    tb.launch("Memcpy DtoH (Device -> Pageable)", ts=65, dur=5, launch_ts=20, launch_dur=50,
              call="cudaMemcpyAsync", cat="gpu_memcpy")  # fmt: skip
    tb.op("after", 70, 10)
    with tb.load(tmp_path) as t:
        w = whatif(t, ["no-sync"])
        assert _step(w) == 30
        assert any("1 copies submitted asynchronously" in n for n in w.notes)
        g = w.baseline.graph
        names = w.baseline.events().set_index("id")["name"]
        start = {names[e]: int(w.time[i]) for i, e in enumerate(g.nodes.event)
                 if e >= 0 and g.nodes.kind[i] in (0, 2)}  # fmt: skip
        assert start["Memcpy DtoH (Device -> Pageable)"] == 24 * US


def test_a_device_change_without_shapes_says_which_option_supplies_them(tmp_path):
    """A GEMM kernel launched by an op whose shapes were not recorded: the roofline has no
    FLOPs or bytes for anything, so ``device=`` is refused, naming record_shapes."""
    tb = TraceBuilder(rank=0, device_properties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    tb.step(0, 0, 100)
    tb.op("aten::mm", 0, 20)
    tb.launch("ampere_sgemm_128x64_tn", 10, 60, launch_ts=5)
    with tb.load(tmp_path) as t:
        with pytest.raises(XpuprofError, match=r"price no work.*1 events.*record_shapes=True"):
            whatif(t, ["device=h100-sxm"])


def test_a_region_scopes_no_sync_and_scale_to_the_calls_inside_it(tmp_path):
    """Two read-backs in one 400 µs step: a 100 µs GEMM [10, 110) read back by a blocking
    copy whose call [20, 115) sits inside the annotation "## log ##" [15, 120); a second
    100 µs GEMM [130, 230) read back by a call [140, 235) outside it. ``@^## log ##$`` removes
    the first wait only (1 of 2), and scaling the calls there to 0 touches that one call."""
    tb = TraceBuilder(rank=0, device_properties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    tb.step(0, 0, 400)
    tb.launch("gemm", 10, 100, launch_ts=2, launch_dur=2)
    tb.annotation("## log ##", 15, 105)
    tb.launch("Memcpy DtoH (Device -> Pageable)", 110, 2, launch_ts=20, launch_dur=95,
              call="cudaMemcpyAsync", cat="gpu_memcpy")  # fmt: skip
    tb.launch("gemm", 130, 100, launch_ts=122, launch_dur=2)
    tb.launch("Memcpy DtoH (Device -> Pageable)", 230, 2, launch_ts=140, launch_dur=95,
              call="cudaMemcpyAsync", cat="gpu_memcpy")  # fmt: skip
    with tb.load(tmp_path) as t:
        both = whatif(t, ["no-sync:^cudaMemcpyAsync$"])
        assert both.notes[0].startswith("no-sync:^cudaMemcpyAsync$: 2 waits removed")
        one = whatif(t, ["no-sync:^cudaMemcpyAsync$@^## log ##$",
                         "scale:runtime/^cudaMemcpyAsync$@^## log ##$=0"])  # fmt: skip
        assert "1 waits removed" in one.notes[0]
        assert one.notes[1].endswith(": 1 events, 1 edges scaled")
        with pytest.raises(XpuprofError, match=r"its region '\^nothing' matches no replayed event"):
            whatif(t, ["no-sync:^cudaMemcpyAsync$@^nothing"])


def test_without_steps_the_span_is_compared(tmp_path):
    """No profiler step: each rank's span is compared. Two 10 µs kernels back to back on one
    stream [5, 25) after a launch [0, 1) and [1, 2); a host op "tail" [2, 30). Kernels ×2:
    they end at 45, the span 0–45 (from 0–30: the host's tail ended it before)."""
    tb = TraceBuilder(rank=0)
    tb.launch("k0", 5, 10, launch_ts=0, launch_dur=1)
    tb.launch("k1", 15, 10, launch_ts=1, launch_dur=1)
    tb.op("tail", 2, 28)
    with tb.load(tmp_path) as t:
        w = whatif(t, ["scale:kernel=2"])
        s = w.summary.iloc[0]
        assert (s.steps, s.baseline_ns / US, s.predicted_ns / US) == (0, 30, 45)
        assert w.result().facts["headline"].startswith("scale:kernel=2: span (no profiler")
        with pytest.raises(XpuprofError, match="the trace has no collective events"):
            whatif(t, ["collective:algorithm=tree"])


def test_host_gaps_leave_a_step_that_only_waits_for_another_thread(tmp_path):
    """As in the shared gloo trace: the step span 0–100 µs holds nothing on its own thread,
    while a ``gloo:all_reduce`` annotation runs 5–95 µs on another thread. Its 100 µs are not
    Python between ops: ``host-gaps=0`` leaves the step at 100 µs. A second step 200–300 µs
    with an op 210–240 µs on its thread shrinks to the op's 30 µs."""
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=100)
    tb.annotation("gloo:all_reduce", 5, 90, tid=2)
    tb.step(1, ts=200, dur=100)
    tb.op("aten::mm", 210, 30)
    with tb.load(tmp_path) as t:
        w = whatif(t, ["host-gaps=0"])
        assert (w.steps["predicted_ns"] / US).tolist() == [100, 30]
        assert "1 step spans with nothing recorded inside them" in w.notes[0]

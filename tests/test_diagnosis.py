"""The diagnosis suite: what bounds each step, and what the advisor says about it.

Two halves. **Synthetic traces** (``tests/builders.TraceBuilder``), one pair per rule: a trace
where the rule must fire, with the time on the critical path worked out by hand in the
comments, and a trace where it must stay silent (the look-alike a rule written from aggregate
fractions would get wrong). **Real traces** in ``../shared/traces``: the expected headline and
top finding were decided by reading each trace, and every test states the SQL query that
shows the evidence and checks the diagnosis against the number that query returns.

Times in the builders are µs (Kineto's unit); the tools answer in ns.
"""

from __future__ import annotations

import math
import re

import pytest
from builders import TraceBuilder
from captures import SLEEP_S, capture_layer_level, layer_level
from conftest import EXAMPLE, shared

import xpuprof
from xpuprof.advise.rules import RULES, advise
from xpuprof.analysis.diagnosis import diagnosis
from xpuprof.analysis.platform import platforms

A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920}]
MI250 = [{"id": 0, "name": "AMD Instinct MI250X", "totalGlobalMem": 68702699520}]
#: Words no advice may use on a platform that is not theirs.
CUDA_WORDS = re.compile(r"CUDA|NCCL|cudaGraph|cuda\.synchronize", re.IGNORECASE)
VENDOR_WORDS = re.compile(r"CUDA|NCCL|HIP|RCCL|cudaGraph|torch\.cuda", re.IGNORECASE)


def advice(trace) -> tuple[dict, list[str], object]:
    """(facts, the rules that fired in rank order, the recommendations table)."""
    res = advise(trace)
    recs = res["recommendations"]
    return res.facts, list(recs.rule), recs


def per_step(trace, category: str) -> float:
    """Mean ns per step the critical path spends in ``category`` (0 when absent)."""
    s = diagnosis(trace)["summary"]
    s = s[s.category == category]
    return float(s.time_ns.iloc[0]) if len(s) else 0.0


# ----------------------------------------------------------------------- host blocked


def blocked_copy(tb: TraceBuilder, *, copy_at: float, call_end: float, dev_end: float) -> None:
    """One 1000 µs step: ``aten::mm`` launches a GEMM [20, dev_end); then ``aten::to``
    (under ``## sparse_data_dist ##``) copies device→host with a blocking
    ``cudaMemcpyAsync`` [160, call_end) whose copy runs [copy_at, copy_at + 5)."""
    tb.step(0, 0, 1000)
    tb.op("aten::mm", 0, 100)
    tb.launch("ampere_sgemm_128x64_tn", 20, dev_end - 20, launch_ts=10, launch_dur=5)
    tb.annotation("## sparse_data_dist ##", 140, call_end + 10 - 140)
    tb.op("aten::to", 150, call_end + 5 - 150)
    tb.launch("Memcpy DtoH (Device -> Pageable)", copy_at, 5, launch_ts=160,
              launch_dur=call_end - 160, call="cudaMemcpyAsync",
              cat="gpu_memcpy")  # fmt: skip


def test_host_blocked_in_a_copy_while_the_device_idles(tmp_path) -> None:
    # the GEMM ends at 120; the host sits in cudaMemcpyAsync [160, 890) while nothing runs
    # until the copy [880, 885): 880 - 160 = 720 µs blocked with the device idle, then the
    # copy (5 µs, memcpy) and the call's return [885, 890) (5 µs, blocked): 725 µs of sync
    tb = TraceBuilder(rank=0, device_properties=A100)
    blocked_copy(tb, copy_at=880, call_end=890, dev_end=120)
    with tb.load(tmp_path) as t:
        assert per_step(t, "sync") == 725_000
        facts, rules, recs = advice(t)
        assert rules[0] == "host-blocked"
        top = recs.iloc[0]
        assert "non_blocking=True" in top.recommendation and "aten::to" in top.recommendation
        assert "## sparse_data_dist ##" in top.evidence and top["rank"] == 0 and top["steps"] == [0]
        assert top.saved_ms_per_step == pytest.approx(0.725)
        assert facts["headline"].startswith(
            "Bottleneck: host blocked 725 µs per step (72%) in a device-to-host copy "
            "(pageable memory) (`aten::to` under `## sparse_data_dist ##`), rank 0, step 0"
        )
        ids = t.sql("select id from events where name = 'cudaMemcpyAsync'").id.tolist()
        assert set(ids) <= set(top.events)


def test_item_at_the_end_of_a_device_bound_step_is_not_a_host_block(tmp_path) -> None:
    # the same blocking copy, but the GEMM runs [20, 880): while the host waits the device
    # computes, so the device bounds the step and no host-blocked finding may appear
    tb = TraceBuilder(rank=0, device_properties=A100)
    blocked_copy(tb, copy_at=880, call_end=890, dev_end=880)
    with tb.load(tmp_path) as t:
        assert per_step(t, "sync") < 50_000
        assert per_step(t, "compute") == 860_000  # the GEMM [20, 880) is on the path
        facts, rules, _ = advice(t)
        assert "host-blocked" not in rules and facts["bottleneck"] == "compute"


def test_a_short_non_blocking_copy_is_below_the_noise_floor(tmp_path) -> None:
    tb = TraceBuilder(rank=0, device_properties=A100)
    blocked_copy(tb, copy_at=165, call_end=170, dev_end=120)  # a 10 µs call
    with tb.load(tmp_path) as t:
        assert "host-blocked" not in advice(t)[1]


# ----------------------------------------------------------------------------- launches


def launch_loop(tb: TraceBuilder, call: str = "cudaLaunchKernel", n: int = 40) -> None:
    """One 1000 µs step of ``n`` ops, each [20 i + 5, 20 i + 23) launching a 2 µs kernel with
    a 15 µs launch call [20 i + 6, 20 i + 21): the device runs 2 µs of every 20."""
    tb.step(0, 0, 1000)
    for i in range(n):
        t0 = 20 * i + 5
        tb.op("aten::add", t0, 18)
        tb.launch("void at::native::vectorized_elementwise_kernel<4>(int)", t0 + 17, 2,
                  launch_ts=t0 + 1, launch_dur=15, call=call)  # fmt: skip


def test_launch_overhead_on_an_nvidia_gpu(tmp_path) -> None:
    tb = TraceBuilder(rank=0, device_properties=A100)
    launch_loop(tb)
    with tb.load(tmp_path) as t:
        launch = per_step(t, "launch")
        assert launch >= 40 * 15_000  # every launch call's 15 µs is on the host path
        facts, rules, recs = advice(t)
        rec = recs.set_index("rule").loc["launch-overhead"]
        assert "CUDA graphs" in rec.recommendation and "HIP" not in rec.recommendation


def test_launch_overhead_on_an_amd_gpu_says_hip(tmp_path) -> None:
    tb = TraceBuilder(rank=0, device_properties=MI250)
    launch_loop(tb, call="hipLaunchKernel")
    with tb.load(tmp_path) as t:
        assert platforms(t).vendor.tolist() == ["amd"]
        rec = advice(t)[2].set_index("rule").loc["launch-overhead"]
        assert "HIP graphs" in rec.recommendation and "CUDA graphs" not in rec.recommendation


def test_no_graph_advice_for_work_already_in_cuda_graphs(tmp_path) -> None:
    tb = TraceBuilder(rank=0, device_properties=A100)
    launch_loop(tb, call="cudaGraphLaunch")
    with tb.load(tmp_path) as t:
        assert per_step(t, "launch") >= 40 * 15_000  # the same time on the path…
        recs = advice(t)[2]
        assert "launch-overhead" not in set(recs.rule)  # …but graphs are already in use
        assert not recs.recommendation.str.contains("CUDA graph").any()


def test_host_ahead_of_the_device_is_device_bound_not_launch_bound(tmp_path) -> None:
    # 10 launches in the first 50 µs, each of a 95 µs kernel queued back to back from 20 µs:
    # the device is busy [20, 970); kernels start a median 4 * 95 µs after their launch
    tb = TraceBuilder(rank=0, device_properties=A100)
    tb.step(0, 0, 1000)
    tb.op("aten::linear", 0, 60)
    for i in range(10):
        tb.launch("ampere_bf16_s16816gemm_bf16_128x128_tn", 20 + 95 * i, 95,
                  launch_ts=5 * i, launch_dur=4)  # fmt: skip
    with tb.load(tmp_path) as t:
        assert per_step(t, "compute") == 950_000
        facts, rules, recs = advice(t)
        assert facts["bottleneck"] == "compute" and "launch-overhead" not in rules
        rec = recs.set_index("rule").loc["device-bound"]
        assert math.isnan(rec.saved_ms_per_step)  # no made-up saving for the device's work
        assert "roofline" in rec.recommendation and "after their launch" in rec.evidence


# ---------------------------------------------------------------------------------- input


def input_step(tb: TraceBuilder, load_us: float) -> None:
    tb.step(0, 0, 1000)
    tb.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, load_us)
    tb.op("aten::mm", load_us, 20)
    tb.launch("ampere_sgemm_128x64_tn", load_us + 15, 985 - load_us, launch_ts=load_us + 2)


def test_input_bound_single_process_loader(tmp_path) -> None:
    tb = TraceBuilder(rank=0, device_properties=A100)
    input_step(tb, 600)  # the host loads [0, 600) while the device idles
    with tb.load(tmp_path) as t:
        assert per_step(t, "input") == 600_000
        facts, rules, recs = advice(t)
        assert rules[0] == "input-bound" and "num_workers" in recs.iloc[0].recommendation
        assert recs.iloc[0].saved_ms_per_step == pytest.approx(0.6)


def test_a_short_loader_span_is_below_the_noise_floor(tmp_path) -> None:
    tb = TraceBuilder(rank=0, device_properties=A100)
    input_step(tb, 30)  # 30 µs < 50 µs per step
    with tb.load(tmp_path) as t:
        assert "input-bound" not in advice(t)[1]


# --------------------------------------------------------------------------- CPU runs


def test_python_overhead_on_a_cpu_run(tmp_path) -> None:
    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 1000)
    tb.op("aten::mm", 0, 600)  # 400 µs of the step outside any op
    with tb.load(tmp_path) as t:
        assert platforms(t).vendor.tolist() == ["cpu"]
        facts, rules, recs = advice(t)
        assert rules == ["python-overhead"] and recs.iloc[0].saved_fraction == pytest.approx(0.4)
        assert not recs.recommendation.str.contains(VENDOR_WORDS).any()


def test_a_cpu_run_busy_in_ops_gets_no_advice(tmp_path) -> None:
    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 1000)
    tb.op("aten::mm", 0, 1000)
    with tb.load(tmp_path) as t:
        assert advice(t)[1] == []


def test_host_cpu_bound_framework_work_on_a_gpu(tmp_path) -> None:
    # 40 ops of 20 µs each run on the host while one short kernel waits for them
    tb = TraceBuilder(rank=0, device_properties=A100)
    tb.step(0, 0, 1000)
    for i in range(40):
        tb.op("aten::index", 20 * i, 20)
    tb.op("aten::mm", 800, 20)
    tb.launch("ampere_sgemm_128x64_tn", 815, 100, launch_ts=802)
    with tb.load(tmp_path) as t:
        assert per_step(t, "cpu") >= 800_000
        rec = advice(t)[2].set_index("rule").loc["host-cpu-bound"]
        assert "aten::index" in rec.evidence
        assert "optimizer" not in rec.recommendation  # no optimizer runs in this trace


def test_one_slow_allocation_is_not_per_op_overhead(tmp_path) -> None:
    tb = TraceBuilder(rank=0, device_properties=A100)
    tb.step(0, 0, 1000)
    tb.op("aten::empty", 0, 700)  # one call: 70 % of the step
    tb.op("aten::mm", 700, 20)
    tb.launch("ampere_sgemm_128x64_tn", 715, 100, launch_ts=702)
    with tb.load(tmp_path) as t:
        rules = advice(t)[1]
        assert rules[0] == "slow-host-op" and "host-cpu-bound" not in rules


def test_allocator_calls_on_the_path(tmp_path) -> None:
    tb = TraceBuilder(rank=0, device_properties=A100)
    tb.step(0, 0, 1000)
    tb.op("aten::empty", 0, 600)
    tb.runtime("cudaMalloc", 10, 580)
    tb.op("aten::mm", 600, 20)
    tb.launch("ampere_sgemm_128x64_tn", 615, 300, launch_ts=602)
    with tb.load(tmp_path) as t:
        assert per_step(t, "runtime") == 580_000
        assert advice(t)[1][0] == "allocator"


# ------------------------------------------------------------------------- communication


def _coll(n_bytes: int) -> dict:
    return {"Collective name": "allreduce", "In msg nelems": n_bytes // 4,
            "Out msg nelems": n_bytes // 4, "Group size": 2, "dtype": "Float",
            "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}  # fmt: skip


def two_ranks(tmp_path, late_by: float, n_bytes: int = 64 << 20):
    """Two ranks (files) of one job on one host: rank 0 reaches the all-reduce of ``n_bytes``
    at 100 µs, rank 1 after ``late_by`` more µs of GEMM; both all-reduces end at 700 µs."""
    paths = []
    for rank in (0, 1):
        tb = TraceBuilder(rank=rank, world_size=2, device_properties=A100)
        arrive = 100 + (late_by if rank == 1 else 0)
        tb.step(0, 0, 800 if rank else 850)  # rank 0's step is the slower one
        tb.op("aten::mm", 0, 20)
        tb.launch("ampere_sgemm_128x64_tn", 10, arrive - 10, launch_ts=5)
        tb.op("nccl:all_reduce", 30, 20)
        tb.launch(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            arrive,
            700 - arrive,
            launch_ts=35,
            stream=9,
            **_coll(n_bytes),
        )
        tb.op("aten::add", 760, 20)
        paths.append(tb.write(tmp_path / f"rank{rank}.json"))
    xpuprof.import_traces(paths, tmp_path / "job.store")
    return xpuprof.load(tmp_path / "job.store")


def test_late_rank_is_named_with_what_made_it_late(tmp_path) -> None:
    with two_ranks(tmp_path, late_by=500) as t:  # rank 0 waits [100, 600) for rank 1
        assert per_step(t, "comm_wait") == 500_000  # rank 0, the slower step, is judged
        facts, rules, recs = advice(t)
        rec = recs.set_index("rule").loc["late-rank"]
        assert "rank 1" in rec.recommendation and "device compute" in rec.recommendation
        assert "for rank 1" in facts["headline"] and "overlap" not in rules


def test_ranks_that_arrive_together_move_data_instead(tmp_path) -> None:
    with two_ranks(tmp_path, late_by=0) as t:
        assert per_step(t, "comm_wait") == 0
        assert "late-rank" not in advice(t)[1]
        assert per_step(t, "communication") == 600_000  # [100, 700) moving data


def test_an_all_reduce_near_the_link_peak_is_bandwidth_bound(tmp_path) -> None:
    # 128 MiB all-reduced by 2 ranks in 600 µs: bus bandwidth = 134217728 B * 2(n-1)/n
    # / 600 µs = 223.7 GB/s, 75 % of an A100's 300 GB/s one-way NVLink (600 GB/s both ways)
    with two_ranks(tmp_path, late_by=0, n_bytes=128 << 20) as t:
        rec = advice(t)[2].set_index("rule").loc["communication"]
        assert "(bandwidth-bound)" in rec.finding and "Send fewer bytes" in rec.recommendation
        assert "bus bandwidth 223.7 GB/s of a 300 GB/s one-way link (75%)" in rec.evidence


def test_small_all_reduces_are_latency_bound(tmp_path) -> None:
    # 256 KiB in 600 µs: 0.4 GB/s, far below the link, and below 1 MiB: a fixed cost per call
    with two_ranks(tmp_path, late_by=0, n_bytes=256 << 10) as t:
        rec = advice(t)[2].set_index("rule").loc["communication"]
        assert "latency-bound (small messages)" in rec.finding
        assert "coalesce" in rec.recommendation and "median message 256 KiB" in rec.evidence


# ----------------------------------------------------------------------- platforms, noise


def test_a_300_ns_toy_trace_gets_no_finding(tmp_path) -> None:
    tb = TraceBuilder(rank=0, device_properties=A100)
    tb.step(0, 0, 0.3)
    tb.op("aten::add", 0.0, 0.2)
    tb.launch("k", 0.15, 0.1, launch_ts=0.05, launch_dur=0.05)
    with tb.load(tmp_path) as t:
        facts, rules, _ = advice(t)
        assert rules == [] and facts["recommendations"] == 0


def test_mtia_gets_no_cuda_words_and_dma_is_memory(tmp_path) -> None:
    # an MTIA runtime launching DMA transfers one by one: the copies are memory work, and no
    # advice may name a CUDA or HIP API
    tb = TraceBuilder(rank=0, device_properties=[{"id": 0, "name": "ARTEMIS"}])
    tb.step(0, 0, 1000)
    for i in range(40):
        tb.op("aten::copy_", 20 * i + 5, 18)
        tb.launch("dma_request", 20 * i + 22, 2, launch_ts=20 * i + 6, launch_dur=15,
                  call="enqueueCommand memcpyHtoDAsync", cat="mtia_ccp_events")  # fmt: skip
    for e in tb.events:
        if e.get("cat") == "cuda_runtime":
            e["cat"] = "mtia_runtime"
    with tb.load(tmp_path) as t:
        assert platforms(t).vendor.tolist() == ["mtia"]
        from xpuprof.analysis.overview import overview

        s = overview(t)["steps"].iloc[0]
        assert s.memcpy_ns == 40 * 2_000 and s.compute_ns == 0
        recs = advice(t)[2]
        assert not recs.recommendation.str.contains(VENDOR_WORDS).any()
        assert "launch-overhead" not in set(recs.rule)


def test_devices_of_one_rank_are_judged_one_by_one(tmp_path) -> None:
    # one rank, two GPUs, no launch links (each device's timeline is its own path), one
    # 1000 µs step: GPU 0 computes [0, 400); GPU 1 copies [0, 700) (two overlapping copies,
    # [0, 700) and [100, 600): 700 µs once, not 1200) and computes [700, 800). Merged, the
    # two would read as compute 500 µs and copies 300 µs; per device, GPU 1 works longest
    # (800 µs) and its bottleneck is the copies: 700 µs per step (70 %)
    tb = TraceBuilder(rank=0, device_properties=[{**A100[0], "id": 0}, {**A100[0], "id": 1}])
    tb.step(0, 0, 1000)
    tb.kernel("gemm_a", 0, 400, device=0)
    tb.memcpy("Memcpy HtoD (Pinned -> Device)", 0, 700, device=1, stream=8)
    tb.memcpy("Memcpy HtoD (Pinned -> Device)", 100, 500, device=1, stream=9)
    tb.kernel("gemm_b", 700, 100, device=1)
    with tb.load(tmp_path) as t:
        dx = diagnosis(t)
        assert sorted(set(dx["steps"].device)) == [0, 1]
        assert dx.facts["bottleneck"] == "memcpy" and dx.facts["bottleneck_device"] == 1
        assert dx.facts["bottleneck_ns_per_step"] == 700_000
        assert dx.facts["headline"] == (
            "Bottleneck: memory copies 700 µs per step (70%), most in "
            "`Memcpy HtoD (Pinned -> Device)`, rank 0, GPU 1 (busiest of 2), step 0"
        )
        rec = advice(t)[2].set_index("rule").loc["memory-copies"]
        assert rec["device"] == 1 and rec.path_ms_per_step == pytest.approx(0.7)


def test_a_device_side_event_wait_is_what_it_waits_for(tmp_path) -> None:
    # MTIA: stream 2 waits [10, 800) for an event of stream 1, whose kernel `merge` computes
    # [0, 800); then stream 2 runs `pe_exe` [800, 900). The wait is no work: the path
    # charges [10, 800) to `merge` (compute), never to `event_wait`
    tb = TraceBuilder(rank=0, device_properties=[{"id": 0, "name": "ARTEMIS"}])
    tb.step(0, 0, 1000)
    tb.op("aten::linear", 0, 20)
    for name, ts, dur, stream, at in (("merge", 0, 800, 1, 1), ("event_wait", 10, 790, 2, 2),
                                      ("pe_exe", 800, 100, 2, 3)):  # fmt: skip
        tb.launch(name, ts, dur, launch_ts=at, launch_dur=1, stream=stream,
                  call="runFunction", cat="mtia_ccp_events")  # fmt: skip
    for e in tb.events:
        if e.get("cat") == "cuda_runtime":
            e["cat"] = "mtia_runtime"
    with tb.load(tmp_path) as t:
        dx = diagnosis(t)
        assert "event_wait" not in set(dx["events"].name)
        assert dx.facts["bottleneck"] == "compute"
        assert dx.facts["headline"].startswith("Bottleneck: device compute")
        assert "most in `merge`" in dx.facts["headline"]


def test_a_trace_without_steps_speaks_of_the_trace(tmp_path) -> None:
    # no step span: the window is the trace [0, 1000); the host loads input [0, 600) while
    # the device idles, then one GEMM runs. Every sentence says "of the trace", none "step"
    from xpuprof.analysis.overview import overview

    tb = TraceBuilder(rank=0, device_properties=A100)
    tb.op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 600)
    tb.op("aten::mm", 600, 20)
    tb.launch("ampere_sgemm_128x64_tn", 615, 385, launch_ts=602)
    with tb.load(tmp_path) as t:
        res = advise(t, overview_result=overview(t))
        recs = res["recommendations"]
        assert recs.rule.iloc[0] == "input-bound"
        text = " ".join(recs[c].str.cat(sep=" ") for c in ("finding", "evidence", "saving"))
        assert "of the trace" in text and "step" not in text
        assert "of the trace" in res.facts["headline"] and "step" not in res.facts["headline"]


def test_every_rule_declares_its_devices() -> None:
    assert {r.name for r in RULES} >= {
        "host-blocked",
        "launch-overhead",
        "input-bound",
        "late-rank",
        "communication",
        "fp32-gemm",
        "device-bound",
        "python-overhead",
    } - {"python-overhead"}
    for r in RULES:
        assert r.devices and set(r.devices) <= {"nvidia", "amd", "tpu", "mtia", "unknown",
                                                "cpu"}  # fmt: skip
    launch = next(r for r in RULES if r.name == "launch-overhead")
    assert set(launch.devices) == {"nvidia", "amd"}


# ============================================================================ real traces
#
# Each expectation was decided by reading the trace (the queries below are how), not by
# running the advisor: the test checks the advisor against the query's number.


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """``real(rel)``: the shared trace (a file or a folder of ranks) imported once, opened."""
    opened = {}

    def get(rel: str):
        if rel not in opened:
            src = EXAMPLE if rel == "example" else shared(rel)
            files = sorted(src.glob("*.json.gz")) if src.is_dir() else [src]
            store = tmp_path_factory.mktemp("real") / "t.store"
            xpuprof.import_traces(files, store)
            opened[rel] = xpuprof.load(store)
        return opened[rel]

    yield get
    for t in opened.values():
        t.close()


def union_ns(starts, ends) -> int:
    """Length of the union of [start, end) intervals, by a plain sweep."""
    total, reach = 0, None
    for s, e in sorted(zip(starts, ends, strict=True)):
        if reach is None or s > reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


def one(t, sql: str):
    return t.sql(sql).iloc[0, 0]


def test_a100_cuda_event_sync_is_one_slow_allocation(real) -> None:
    t = real("kineto/gpu/a100_cuda_event_sync.json.gz")
    # evidence: the step is 3.154 ms and one aten::empty (under aten::ones) takes 2.187 ms of
    # it on the host; every blocking call together takes 77 µs
    step = one(t, "select dur from events where level = 'step'")
    empty = t.sql("select id, dur from events where name = 'aten::empty'").iloc[0]
    waits = one(
        t,
        "select sum(dur) from events where name in ('cudaEventSynchronize', "
        "'cudaMemcpyAsync', 'cudaStreamSynchronize', 'cudaDeviceSynchronize')",
    )
    assert (step, empty.dur, waits) == (3_154_000, 2_187_000, 77_000)
    facts, rules, recs = advice(t)
    assert facts["bottleneck"] == "cpu" and "`aten::empty` (`aten::ones`)" in facts["headline"]
    assert per_step(t, "cpu") >= empty.dur
    assert rules[0] == "slow-host-op" and recs.iloc[0].events == [int(empty.id)]
    # the sync the trace is named after is real but small: at most the calls' own time
    assert 0 < per_step(t, "sync") <= waits and "host-blocked" in rules


def test_a100_multi_stream_sync_waits_on_untraced_host_code(real) -> None:
    t = real("kineto/gpu/a100_cuda_event_sync_multi_stream.json.gz")
    # evidence: an 18.5 ms hole between two top-level host calls, nothing recorded in it
    gap = one(
        t,
        "select max(ts - prev_end) from (select ts, lag(ts + dur) over (order by ts) "
        "as prev_end from events where device < 0 and depth = 0 and level in "
        "('op', 'runtime'))",
    )
    assert gap == 18_558_000
    facts, rules, _ = advice(t)
    assert facts["bottleneck"] == "outside_ops" and per_step(t, "outside_ops") >= gap
    assert rules[0] == "host-untraced"
    # evidence: three cudaMalloc calls, 692 µs together, with nothing on the device: the
    # allocator rule fires (its bound at most those calls' time)
    malloc = one(t, "select sum(dur) from events where name = 'cudaMalloc'")
    assert malloc == 692_000 and "allocator" in rules
    rec = advice(t)[2].set_index("rule").loc["allocator"]
    assert rec.saved_ms_per_step * 1e6 <= malloc


@pytest.mark.parametrize("name", ["a100_alexnet_cuda_sync", "a100_simple_add"])
def test_a100_profiles_that_include_cuda_setup(real, name) -> None:
    t = real(f"kineto/gpu/{name}.json.gz")
    # evidence: the first CUDA call creates the context: cudaDeviceGetStreamPriorityRange
    # takes tens of seconds, every kernel launch after warm-up a few µs
    setup = one(t, "select max(dur) from events where name = 'cudaDeviceGetStreamPriorityRange'")
    assert setup > 20e9
    facts, rules, recs = advice(t)
    assert facts["bottleneck"] == "runtime"
    assert "cudaDeviceGetStreamPriorityRange" in facts["headline"]
    assert rules[0] == "setup-in-profile" and "warmup" in recs.iloc[0].recommendation
    assert "launch-overhead" not in rules  # the one slow launch is a first use, said as such


def test_a100_cupti_counters_has_no_launch_links(real) -> None:
    t = real("kineto/gpu/a100_cupti_counters.json.gz")
    # evidence: no runtime call shares a correlation id with a kernel: the path can only be
    # the device's own timeline, and its idle time has no cause in the trace
    linked = one(
        t,
        "select count(*) from events k join events r on r.part = k.part and "
        "r.correlation = k.correlation and r.level = 'runtime' where k.level = "
        "'kernel'",
    )
    assert linked == 0
    res = diagnosis(t)
    assert res.facts["path"] == "device" and res.facts["bottleneck"] == "compute"
    rules = advice(t)[1]
    assert "device-idle" in rules and "launch-overhead" not in rules


def test_a100_ddp_rank_is_host_bound(real) -> None:
    t = real("kineto/gpu/a100_rank0of2_nccl.json.gz")
    # evidence: the GPU works under a quarter of each step (union of its device work per
    # step window), so the host's work bounds it
    steps = t.sql("select ts, dur from events where level = 'step' order by ts")
    dev = t.sql(
        "select ts, ts + dur as e from events where level in ('kernel', 'memcpy', "
        "'memset', 'collective') and dur > 0"
    )
    pairs = list(zip(dev.ts, dev.e, strict=True))
    busy = [union_ns([max(s, a) for s, e in pairs if e > a and s < a + d],
                     [min(e, a + d) for s, e in pairs if e > a and s < a + d])
            / d for a, d in zip(steps.ts, steps.dur, strict=True)]  # fmt: skip
    assert max(busy) < 0.30
    facts, rules, _ = advice(t)
    assert facts["bottleneck"] == "cpu" and rules[0] == "host-cpu-bound"
    assert "device-bound" not in rules
    # evidence: the GEMMs run on tensor cores (TF32 `tensorop`/`xmma` kernels); fp32 SIMT
    # GEMMs (`sgemm` without them) are 0.17 ms of 115.7 ms of kernels: below the floor
    simt = one(t, "select sum(dur) from events where level = 'kernel' and regexp_matches("
                  "lower(name), 'gemm') and not regexp_matches(lower(name), "
                  "'tensorop|tf32|xmma')")  # fmt: skip
    assert simt < 200_000 and "fp32-gemm" not in rules
    # evidence: the optimizer already runs foreach ops (`aten::_foreach_add_`), so the advice
    # is the next step (fused), not what it already does
    assert one(t, "select count(*) from events where name like 'aten::_foreach_%'") > 0
    rec = advice(t)[2].set_index("rule").loc["host-cpu-bound"]
    assert "fused=True" in rec.recommendation and "foreach=True" not in rec.recommendation


def test_a100_triton_step_is_mostly_untraced(real) -> None:
    t = real("kineto/gpu/a100_triton.json.gz")
    # evidence: a 13.3 s step in which the recorded host work (top-level ops and calls) is
    # 1.5 ms: the rest is time the profiler did not see
    step = one(t, "select max(dur) from events where level = 'step'")
    traced = one(
        t,
        "select sum(dur) from events where device < 0 and depth = 0 and level in ('op', 'runtime')",
    )
    assert step > 13e9 and traced < 2e6
    facts, rules, _ = advice(t)
    assert facts["bottleneck"] == "outside_ops" and rules == ["host-untraced"]


def test_gp100_is_host_bound(real) -> None:
    t = real("kineto/gpu/gp100_gpu_user_annotation.json.gz")
    # evidence: the GPU works a few per cent of the trace (its kernels' union)
    dev = t.sql(
        "select ts, ts + dur as e from events where level in ('kernel', 'memcpy', "
        "'memset') and dur > 0"
    )
    span = t.sql("select min(ts) as a, max(ts + dur) as b from events where level = 'step'")
    assert union_ns(dev.ts, dev.e) / (span.b[0] - span.a[0]) < 0.10
    facts, rules, _ = advice(t)
    assert facts["bottleneck"] in ("cpu", "outside_ops") and rules[0] in (
        "host-cpu-bound",
        "host-untraced",
    )
    assert "device-bound" not in rules
    # evidence: a launch call takes a median 8 µs, its kernel 2 µs, and the kernel starts a
    # median 1 µs after the call returns: the device waits for each launch (launch-bound
    # work, not in CUDA graphs)
    call = one(t, "select median(dur) from events where name = 'cudaLaunchKernel'")
    kern = one(t, "select median(dur) from events where level = 'kernel'")
    after = one(t, "select median(k.ts - r.ts - r.dur) from events k join events r on "
                   "r.correlation = k.correlation and r.level = 'runtime' where "
                   "k.level = 'kernel'")  # fmt: skip
    assert (call, kern, after) == (8_000, 2_000, 1_000)
    assert "launch-overhead" in rules and "launch-first-use" not in rules


def test_mi250_one_slow_launch_is_a_first_use(real) -> None:
    t = real("kineto/gpu/mi250_rocm_minitoy.json.gz")
    # evidence: one hipLaunchKernel takes 6.54 ms, the median one 6 µs
    longest, median = t.sql("select max(dur), median(dur) from events where "
                            "name = 'hipLaunchKernel'").iloc[0]  # fmt: skip
    assert longest == 6_543_109 and median < 10_000
    assert platforms(t).vendor.tolist() == ["amd"]
    _, rules, recs = advice(t)
    assert rules[0] == "launch-first-use" and "launch-overhead" not in rules
    assert not recs.recommendation.str.contains(CUDA_WORDS).any()


def test_mtia_dma_is_memory_and_no_gpu_advice(real) -> None:
    from xpuprof.analysis.overview import overview

    t = real("kineto/gpu/mtia_inference.json.gz")
    # evidence: dma_request kernels are MTIA's host/device copies
    dma = t.sql("select ts, ts + dur as e from events where name = 'dma_request' and dur > 0")
    assert len(dma) == 877
    s = overview(t)["steps"].iloc[0]
    assert s.memcpy_ns > 0 and s.memcpy_ns <= union_ns(dma.ts, dma.e)
    assert platforms(t).vendor.tolist() == ["mtia"]
    facts, _, recs = advice(t)
    assert not recs.recommendation.str.contains(VENDOR_WORDS).any()
    assert not re.search(CUDA_WORDS, facts["headline"])


def test_v100_host_far_ahead_is_device_bound(real) -> None:
    t = real("kineto/gpu/v100_ns_resolution.json.gz")
    # evidence: kernels start a median 76 ms after their launch call: the host is far ahead
    delay = one(
        t,
        "select median(k.ts - r.ts) from events k join events r on r.part = k.part "
        "and r.correlation = k.correlation and r.level = 'runtime' where k.level = "
        "'kernel'",
    )
    assert delay > 50e6
    facts, rules, recs = advice(t)
    assert facts["bottleneck"] == "compute" and facts["bottleneck_share"] > 0.9
    assert "launch-overhead" not in rules and "host-blocked" not in rules
    assert set(rules) == {"fp32-gemm", "device-bound"}
    assert "GradScaler" in recs.set_index("rule").loc["fp32-gemm"].recommendation  # V100


def test_v100_ddp_rank_with_fp32_gemms(real) -> None:
    t = real("kineto/gpu/v100_rank1of2_df_index_resolver.json.gz")
    # evidence: volta_sgemm kernels (fp32 GEMMs without tensor cores) are hundreds of ms
    sgemm = one(
        t, "select sum(dur) from events where level = 'kernel' and name like 'volta_sgemm%'"
    )
    assert sgemm > 300e6
    facts, rules, _ = advice(t)
    assert facts["bottleneck"] == "cpu" and rules[0] == "host-cpu-bound"
    assert "fp32-gemm" in rules


def test_dlrm_ranks_wait_for_rank_7(real) -> None:
    t = real("kineto/gpu/dlrm_8rank_v100")
    # evidence: the first all-to-all (SendRecv kernels) starts on rank 7 7.6 ms after rank 1,
    # and rank 7 began its step 7.5 ms after rank 1 (one host: one clock)
    first = (
        t.sql(
            "select rank, min(ts) as ts from events where name like "
            "'ncclKernel_SendRecv%' group by rank"
        )
        .set_index("rank")
        .ts
    )
    start = t.sql("select rank, ts from events where level = 'step'").set_index("rank").ts
    assert first.idxmax() == 7 and first[7] - first[1] == pytest.approx(7.6e6, rel=0.01)
    assert start[7] - start[1] == pytest.approx(7.5e6, rel=0.01)
    facts, rules, recs = advice(t)
    assert facts["bottleneck"] == "comm_wait" and facts["bottleneck_rank"] == 1
    assert "for rank 7" in facts["headline"]
    top = recs.iloc[0]
    assert top.rule == "late-rank" and "rank 7" in top.recommendation
    assert "started the step" in top.recommendation  # what made it late


@pytest.mark.parametrize("workers, input_bound", [(0, True), (4, False)])
def test_resnet50_input_bound_with_no_loader_workers(real, workers, input_bound) -> None:
    t = real(f"kineto/gpu/resnet50_v100_2021/num_workers_{workers}.pt.trace.json.gz")
    # evidence: the DataLoader iterator's span per step against the step
    load = one(
        t,
        "select avg(d.dur) / avg(s.dur) from events d join events s on "
        "s.level = 'step' and d.step = s.step where d.name like "
        "'enumerate(DataLoader)%'",
    )
    assert (load > 0.30) if input_bound else (load < 0.02)
    facts, rules, recs = advice(t)
    if input_bound:
        assert rules[0] == "input-bound" and "num_workers" in recs.iloc[0].recommendation
        assert "waiting for input" in facts["headline"]
    else:
        assert "input-bound" not in rules and facts["bottleneck"] == "cpu"
        # evidence: without pinned memory every batch is copied with a blocking
        # cudaMemcpyAsync from pageable memory (two a step, 3 ms and more): the host-blocked
        # rule names it, and its path time is at most those calls' time
        calls = t.sql("select r.step, r.dur, k.name from events r join events k on "
                      "k.correlation = r.correlation and k.level = 'memcpy' where "
                      "r.name = 'cudaMemcpyAsync' and r.step is not null")  # fmt: skip
        assert (calls.name == "Memcpy HtoD (Pageable -> Device)").all()
        rec = recs.set_index("rule").loc["host-blocked"]
        assert "pin_memory" in rec.recommendation and "pageable" in rec.finding
        assert rec.path_ms_per_step * 1e6 <= calls.dur.sum() / calls.step.nunique()


def test_gloo_cpu_rank_spends_its_step_in_all_reduce(real) -> None:
    t = real("kineto/cpu/gloo_rank34of300.json.gz")
    # evidence: gloo's all-reduces (on its own threads) cover 85 % of the step
    step = t.sql("select ts, dur from events where level = 'step'").iloc[0]
    g = t.sql("select ts, ts + dur as e from events where name = 'gloo:all_reduce'")
    a, b = int(step.ts), int(step.ts + step.dur)
    g = g[(g.e > a) & (g.ts < b)]
    inside = union_ns([max(s, a) for s in g.ts], [min(e, b) for e in g.e]) / step.dur
    assert inside == pytest.approx(0.851, abs=0.001)
    facts, rules, recs = advice(t)
    assert facts["bottleneck"] == "communication" and rules[0] == "communication"
    assert "gloo" in recs.iloc[0].recommendation


def clipped_union(df, a: int, b: int) -> int:
    """Length of the union of the rows' [ts, e) intervals inside [a, b)."""
    inside = df[(df.e > a) & (df.ts < b)]
    return union_ns([max(s, a) for s in inside.ts], [min(e, b) for e in inside.e])


def test_tpu_each_chip_waits_for_host_offload_copies(real) -> None:
    t = real("xplane/tpu_v6e_4chip_inference.xplane.pb")
    # evidence 1: the steps are XLA module runs on each chip's own line (99 per chip, none
    # on the host), and the chips never wait for the host between them: consecutive runs of
    # jit_f are at most 2 µs apart (dispatch is asynchronous; the host blocks on the device)
    chips = t.sql("select device, count(*) as n, avg(dur) as mean from events where "
                  "level = 'step' group by device order by device")  # fmt: skip
    assert chips.device.tolist() == [0, 1, 2, 3] and (chips.n == 99).all()
    gap = one(t, "select max(ts - prev) from (select ts, lag(ts + dur) over (partition by "
                 "device order by ts) as prev from events where level = 'op' and name like "
                 "'jit_f%')")  # fmt: skip
    assert gap < 2_000
    chip = int(chips.sort_values("mean").device.iloc[-1])  # the slowest chip's mean step
    assert chip == 1
    # evidence 2: XLA's async copies overlap one another (three in flight at once): their
    # durations sum to 198 s in a 98 s trace, so a sum of durations counts time twice
    copies = one(t, "select sum(dur) from events where name = 'async-copy'")
    span = one(t, "select max(ts + dur) - min(ts) from events")
    assert copies > 2 * span
    # evidence 3, per step of that chip by hand: the chip is busy all of it; the fusions
    # (its only compute) take 3 %, the rest is copy-done ops waiting for the copies
    steps = t.sql(f"select ts, ts + dur as e from events where level = 'step' and "
                  f"device = {chip} order by ts")  # fmt: skip
    work = t.sql(f"select name, ts, ts + dur as e from events where device = {chip} and "
                 "level in ('kernel', 'memcpy', 'collective') and dur > 0")  # fmt: skip
    fusions = work[~work.name.str.startswith(("copy-", "async-copy"))]
    busy = [clipped_union(work, a, b) for a, b in zip(steps.ts, steps.e, strict=True)]
    comp = [clipped_union(fusions, a, b) for a, b in zip(steps.ts, steps.e, strict=True)]
    step_ns = float((steps.e - steps.ts).mean())
    copy_ns = (sum(busy) - sum(comp)) / len(steps)
    assert sum(busy) / (steps.e - steps.ts).sum() > 0.9999
    assert copy_ns == pytest.approx(760.8e6, abs=0.05e6) and copy_ns / step_ns > 0.96
    # evidence 4: six 5 GiB copies a step (f32[5,1024,1024,256]), three from host memory
    # (layout S(5), XLA's host memory space) into HBM and three back
    starts = t.sql(f"select json_extract_string(args, '$.shape_with_layout') as shape, "
                   f"count(*) as n from events where device = {chip} and step = 10 and "
                   "name like 'copy-start%' group by 1")  # fmt: skip
    assert starts.n.sum() == 6 and starts["shape"].str.contains("S(5)", regex=False).all()
    assert starts["shape"].str.startswith("(f32[5,1024,1024,256]").all()

    facts, rules, recs = advice(t)
    assert facts["bottleneck"] == "memcpy" and facts["bottleneck_device"] == chip
    assert facts["bottleneck_ns_per_step"] == pytest.approx(copy_ns, rel=1e-3)
    assert facts["headline"] == (
        "Bottleneck: memory copies 760.8 ms per step (97%), most in `copy-done`, rank 0, "
        "TPU 1 (slowest of 4), steps 0-98"
    )
    assert rules == ["memory-copies"]  # no device-idle: the chips never wait for the host
    rec = recs.iloc[0]
    assert "30 GiB per step between host memory" in rec.evidence and "(3 in, 3 out)" in rec.evidence
    assert "pinned_host" in rec.recommendation and rec["device"] == chip
    assert rec.path_ms_per_step * 1e6 <= step_ns  # nothing counted twice
    assert platforms(t).vendor.tolist() == ["tpu"]
    assert not recs.recommendation.str.contains(VENDOR_WORDS).any()
    assert not re.search(VENDOR_WORDS, facts["headline"])


def test_mtia_event_wait_is_waiting_not_compute(real) -> None:
    import pandas as pd

    from xpuprof.analysis.common import COMPUTATION, kernel_type
    from xpuprof.analysis.overview import overview

    t = real("kineto/gpu/mtia_inference.json.gz")
    # evidence 1: each event_wait names the stream it waits on, and while the waits run the
    # device does other work (other streams' kernels) 99 % of their time: a stream waiting
    # for another, not computing
    dev = t.sql("select name, ts, ts + dur as e, args from events where level = 'kernel' "
                "and dur > 0")  # fmt: skip
    waits = dev[dev.name == "event_wait"]
    assert len(waits) == 48 and waits.args.str.contains('"wait_on_stream"').all()
    work = dev[~dev.name.isin(["event_wait", "event_record"])]
    covered = sum(clipped_union(work, a, b) for a, b in zip(waits.ts, waits.e, strict=True))
    assert covered / (waits.e - waits.ts).sum() > 0.98
    # evidence 2: the real compute kernels (merge, pe_exe, remote) never overlap (their
    # durations sum to their union: one engine) and fill 90 % of the trace: device-bound
    comp = dev[dev.name.isin(["merge", "pe_exe", "remote"])]
    union = union_ns(comp.ts, comp.e)
    assert union == pytest.approx((comp.e - comp.ts).sum(), rel=1e-3)
    assert union / one(t, "select max(ts + dur) - min(ts) from events") > 0.85
    # HTA types event_wait as computation, and the breakdown keeps that
    assert kernel_type(pd.Series(["kernel"]), pd.Series(["event_wait"])).iloc[0] == COMPUTATION

    dx = diagnosis(t)
    assert "event_wait" not in set(dx["events"].name)  # the path charges what it waited for
    facts = dx.facts
    assert facts["bottleneck"] == "compute"
    assert re.fullmatch(r"Bottleneck: device compute [\d.]+ ms \(\d+% of the trace\), "
                        r"most in `merge`, rank 0", facts["headline"])  # fmt: skip
    res = advise(t, overview_result=overview(t))
    recs = res["recommendations"]
    assert "device-bound" in set(recs.rule) and "launch-overhead" not in set(recs.rule)
    text = " ".join(recs[c].str.cat(sep=" ") for c in ("recommendation", "finding",
                                                          "evidence", "saving"))  # fmt: skip
    assert "event_wait" not in text
    # no steps: every sentence speaks of the trace, none of a step
    assert "of the trace" in text and "per step" not in text and "each step" not in text
    assert "optimizer" not in text.lower()  # an inference trace: nothing to say about one


def test_example_cpu_run(real) -> None:
    t = real("example")
    # evidence: per step, the time no top-level op covers on the main thread
    gaps = t.sql(
        "with s as (select step, ts, dur from events where level = 'step'), o as "
        "(select step, sum(dur) as ops from events where level = 'op' and depth = 1 "
        "group by step) select avg(s.dur - o.ops) from s join o using (step)"
    )
    facts, rules, recs = advice(t)
    assert platforms(t).vendor.tolist() == ["cpu"]
    assert rules == ["python-overhead"]
    assert recs.iloc[0].path_ms_per_step * 1e6 <= gaps.iloc[0, 0] * 1.05
    assert "CPU run" in facts["headline"]


# ------------------------------------------------------- captures without framework ops


def test_a_layer_level_capture_is_judged_on_the_host_timeline(tmp_path) -> None:
    # step 1 starts where its batch fetch starts, at the end of step 0 (100); step 2 at 300:
    #   step 0 [0, 100):   input 10 (0-10, before the layer), cpu 50, outside 40
    #   step 1 [100, 300): input 100 (between steps) + 10 = 110, cpu 50, outside 40
    #   step 2 [300, 550): input 150 + 5 = 155, cpu 50, outside 45
    # per step: input 275 / 3 = 91.67 µs (275 / 550 = 50 %), cpu 50 (model.fc 30, model 20)
    tb = TraceBuilder(rank=0)
    layer_level(tb)
    with tb.load(tmp_path) as t:
        dx = diagnosis(t)
        steps = dx["steps"]
        assert steps.step_ns.tolist() == [100_000, 200_000, 250_000]
        assert steps.input_ns.tolist() == [10_000, 110_000, 155_000]
        assert steps.cpu_ns.tolist() == [50_000] * 3
        assert steps.outside_ops_ns.tolist() == [40_000, 40_000, 45_000]
        assert steps.off_path_ns.tolist() == [0] * 3
        cpu = dx["events"][dx["events"].category == "cpu"].set_index("name")
        assert cpu.per_step_ns.to_dict() == {"model.fc": 30_000, "model": 20_000}
        assert dx.facts["bottleneck"] == "input" and dx.facts["path"] == "host"
        assert dx.facts["bottleneck_share"] == pytest.approx(0.5)
        assert dx.facts["headline"].startswith("Bottleneck: waiting for input 91.67 µs per step "
                                               "(50%)")  # fmt: skip
        facts, rules, recs = advice(t)
        assert rules == ["input-bound"]  # outside_ops (41.7 µs a step) is below the floor
        assert "num_workers" in recs.iloc[0].recommendation
        assert "level='op'" in recs.iloc[0].recommendation
        assert recs.iloc[0].saved_ms_per_step == pytest.approx(275 / 3 / 1e3)
        assert recs.iloc[0].events == [0, 3, 6]  # the three step spans


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """Real level-layer captures of the demo model (``captures.capture_layer_level``), by
    idiom and collate (slow: sleeps ``SLEEP_S``; fast: does not), made once per module."""
    made = {}

    def get(idiom: str, slow: bool):
        if (idiom, slow) not in made:
            d = tmp_path_factory.mktemp(f"{idiom}{'_slow' if slow else '_fast'}")
            made[idiom, slow] = capture_layer_level(d, idiom, SLEEP_S if slow else 0.0)
        return made[idiom, slow]

    return get


@pytest.mark.parametrize("idiom", ["with", "top"])
def test_a_slow_collate_at_level_layer_is_the_bottleneck(captured, idiom) -> None:
    store, waited = captured(idiom, True)
    with xpuprof.load(store) as t:
        # evidence: no op is recorded, and the host time between step spans ("with") or
        # before each step's first layer span ("top") is the stopwatch's wait
        assert one(t, "select count(*) from events where level = 'op'") == 0
        gaps = t.sql(
            "with s as (select step, ts, ts - lag(ts + dur) over (order by ts) as between_ns "
            "from events where level = 'step'), l as (select step, min(ts) as first from "
            "events where level = 'layer' group by step) select s.step, s.between_ns, "
            "l.first - s.ts as before_ns from s join l using (step) order by s.step"
        ).set_index("step")
        dx = diagnosis(t)
        facts, rules, recs = advice(t)
    first = 1 if idiom == "with" else 0  # "with": the first batch is fetched before step 0
    wait = gaps.between_ns.fillna(0) + gaps.before_ns
    per = dx["steps"].set_index("step")
    for i in range(first, 6):
        assert per.loc[i, "input_ns"] == pytest.approx(waited[i] * 1e9, rel=0.1, abs=2e6)
        assert per.loc[i, "input_ns"] == wait.loc[i]
    assert facts["bottleneck"] == "input"
    mean = sum(waited[first:]) * 1e9 / 6  # the headline's "per step": over all six steps
    assert facts["bottleneck_ns_per_step"] == pytest.approx(mean, rel=0.1, abs=2e6)
    assert facts["headline"].startswith("Bottleneck: waiting for input ")
    assert f"per step ({facts['bottleneck_share']:.0%})" in facts["headline"]
    assert rules[0] == "input-bound" and "num_workers" in recs.iloc[0].recommendation
    assert "python-overhead" not in rules and "host-untraced" not in rules
    assert not recs.recommendation.str.contains("torch.compile").any()
    assert "pin_memory" not in recs.iloc[0].recommendation  # a CPU run: nothing to pin for


@pytest.mark.parametrize("idiom", ["with", "top"])
def test_a_fast_collate_at_level_layer_is_not_input(captured, idiom) -> None:
    store, waited = captured(idiom, False)
    with xpuprof.load(store) as t:
        dx = diagnosis(t)
        facts, rules, recs = advice(t)
        steps = one(t, "select avg(dur) from events where level = 'step'")
    # evidence: each fetch takes well under a millisecond, the step's own work several
    assert max(waited) * 1e9 < 0.1 * steps
    assert facts["bottleneck"] != "input" and "waiting for input" not in facts["headline"]
    assert dx["summary"].set_index("category").time_ns.get("input", 0) < 0.05 * steps
    assert "input-bound" not in rules
    assert "python-overhead" not in rules and not recs.recommendation.str.contains(
        "torch.compile").any()  # fmt: skip

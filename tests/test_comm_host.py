"""Collectives that run on the host (gloo on the CPU): the comm tool's rows, the cross-rank
skew and stragglers, the overview's breakdown, the critical path, the advice and the replay,
on a real two-process ``torch.distributed`` job whose rank 1 sleeps in every step
(``tests/gloo_job.py``), and on the shared single-rank gloo trace.

Expected numbers come from the raw Chrome-trace JSON each rank wrote (``json``), never from
xpuprof: the ``gloo:*`` spans of each rank in start order are the collectives, matched by
position across ranks; rank 0's wait in each is rank 1's start minus its own.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from builders import TraceBuilder
from conftest import ROOT, read_trace_json, shared, us_to_ns

import xpuprof
from xpuprof.advise.rules import advise
from xpuprof.analysis.comm import collective_waits, collectives
from xpuprof.analysis.diagnosis import diagnosis
from xpuprof.analysis.overview import overview
from xpuprof.sim.graph import EDGE_KINDS
from xpuprof.sim.replay import replay

SLEEP_MS = 40.0
#: Collectives per step: 4 parameters all-reduced, then broadcast; rank 1 sleeps before each.
PER_STEP = 8
STEPS = 3
MS = 1_000_000


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The 2-rank gloo job run once (real processes), its traces' raw JSON, and the store."""
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    out = tmp_path_factory.mktemp("gloo")
    subprocess.run([sys.executable, str(ROOT / "tests" / "gloo_job.py"), str(out),
                    "--sleep-ms", str(SLEEP_MS), "--steps", str(STEPS)],
                   check=True, timeout=240, capture_output=True)  # fmt: skip
    files = [out / f"rank{r}.pt.trace.json" for r in (0, 1)]
    raw = [read_trace_json(f, exact=True) for f in files]
    store = out / "job.store"
    xpuprof.import_traces(files, store)
    trace = xpuprof.load(store)
    yield trace, raw
    trace.close()


def _spans(raw: dict, prefix: str) -> list[dict]:
    """Complete events whose name starts with ``prefix``, in start order."""
    ev = [e for e in raw["traceEvents"] if e.get("ph") == "X" and str(e.get("name", ""))
          .startswith(prefix)]  # fmt: skip
    return sorted(ev, key=lambda e: (e["ts"], e["name"]))


def _steps(raw: dict) -> list[tuple[int, int]]:
    st = _spans(raw, "ProfilerStep#")
    return [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in st]


def _union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        elif e > s:
            out.append([s, e])
    return [(a, b) for a, b in out]


def _clip(iv, a: int, b: int) -> list[tuple[int, int]]:
    return _union([(max(s, a), min(e, b)) for s, e in iv if min(e, b) > max(s, a)])


def _length(iv) -> int:
    return sum(e - s for s, e in iv)


def _overlap(x, y) -> int:
    return sum(max(0, min(b, d) - max(a, c)) for a, b in x for c, d in y)


def test_gloo_spans_are_the_collectives_counted_once(job) -> None:
    trace, raw = job
    res = collectives(trace)
    coll = res.tables["collectives"]
    for rank in (0, 1):
        g = _spans(raw[rank], "gloo:")
        mine = coll[coll["rank"] == rank].sort_values(["ts", "name"])
        # 4 parameters all-reduced and broadcast per step: the job's own count
        assert len(g) == len(mine) == 2 * 4 * STEPS
        assert mine["name"].tolist() == [e["name"] for e in g]  # no c10d:: op counted again
        assert mine["ts"].tolist() == [us_to_ns(e["ts"]) for e in g]
        assert mine["dur"].tolist() == [us_to_ns(e["dur"]) for e in g]
        assert (mine["where"] == "host").all()
        assert mine["collective"].tolist() == [e["name"].split(":")[1] for e in g]
        # bytes: the span's float32 tensor (record_shapes)
        want = [4.0 * np.prod(e["args"]["Input Dims"][0]) for e in g]
        assert mine["bytes"].tolist() == want
        # the one process group of distributedInfo, its size
        pg = raw[rank]["distributedInfo"]["pg_config"]
        assert (mine["process_group"] == f"pg {pg[0]['pg_name']}").all()
        assert (mine["group_size"] == pg[0]["pg_size"]).all()
    assert not any("no collectives" in n for n in res.notes)


def test_skew_and_stragglers_name_the_sleeping_rank(job) -> None:
    trace, raw = job
    res = collectives(trace)
    g0, g1 = _spans(raw[0], "gloo:"), _spans(raw[1], "gloo:")
    sk = res.tables["skew"].sort_values("seq")
    assert len(sk) == len(g0) and sk["types_agree"].all()
    # one host (one clock): skew = |start on rank 1 - start on rank 0|, matched by position
    want = [abs(us_to_ns(b["ts"]) - us_to_ns(a["ts"])) for a, b in zip(g0, g1, strict=True)]
    assert sk["skew_ns"].astype(np.int64).tolist() == want
    st = res.tables["stragglers"]
    assert st.iloc[0]["rank"] == 1
    late1 = sum(us_to_ns(b["ts"]) > us_to_ns(a["ts"]) for a, b in zip(g0, g1, strict=True))
    assert st.set_index("rank").loc[1, "times_last"] == late1 == len(g0)
    assert (sk["last_participant"] == "1").all()
    # rank 0's waits: rank 1's start - its own, clipped to its span
    w = collective_waits(trace)
    w0 = w[w["rank"] == 0].sort_values("ts")
    expect = [min(max(us_to_ns(b["ts"]) - us_to_ns(a["ts"]), 0), us_to_ns(a["dur"]))
              for a, b in zip(g0, g1, strict=True)]  # fmt: skip
    assert w0["wait_ns"].tolist() == expect
    assert (w0.loc[w0["wait_ns"] > 0, "last_rank"] == 1).all()
    # rank 0 waits in an all-reduce about the sleep rank 1 takes before it (both leave the
    # previous collective together; a loaded machine stalls either rank now and then: the
    # median; a broadcast's root may finish sending first: its wait is clipped to its span)
    pause = SLEEP_MS * MS / PER_STEP
    ar = w0[w0["collective"] == "all_reduce"]
    assert len(ar) == 4 * STEPS
    assert 0.8 * pause <= ar["wait_ns"].median() <= 2 * pause


def test_ranks_tool_names_the_sleeping_rank_and_its_sleep(job) -> None:
    """``xpuprof ranks`` on the real job: rank 1 is the rank rank 0 waits for in every step
    (``caused_ns`` = rank 0's waits in that step, from the raw spans as above), and what made
    it slow includes its sleep: time.sleep runs in Python between ops, so rank 1's host time
    outside ops exceeds rank 0's by at least most of the 40 ms it sleeps per step."""
    from xpuprof.analysis.ranks import rank_steps

    trace, raw = job
    res = rank_steps(trace)
    slow = res.tables["slowest"]
    assert len(slow) == STEPS
    assert (slow["holder"] == 1).all() and (slow["basis"] == "waited for").all()
    w = collective_waits(trace)
    steps = res.tables["steps"]
    for _, row in steps[steps["rank"] == 1].iterrows():
        s0 = steps[(steps["rank"] == 0) & (steps["step"] == row["step"])].iloc[0]
        mine = w[(w["rank"] == 0) & (w["ts"] >= s0["start"]) & (w["ts"] < s0["start"]
                                                                  + s0["step_ns"])]  # fmt: skip
        assert row["caused_ns"] == mine["wait_ns"].sum()
    c = res.tables["causes"]
    py = c[c["category"] == "outside_ops"].set_index("step")["excess_ns"]
    assert len(py) == STEPS and (py >= 0.8 * SLEEP_MS * MS).all()
    assert res.facts["holder"] == 1 and res.facts["held_steps"] == STEPS


def test_overview_puts_rank0s_wait_under_communication(job) -> None:
    trace, raw = job
    steps = overview(trace).tables["steps"]
    r0 = steps[steps["rank"] == 0].sort_values("step")
    ops = [
        (us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
        for e in raw[0]["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") == "cpu_op"
    ]
    gloo = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
            for e in _spans(raw[0], "gloo:")]  # fmt: skip
    windows = _steps(raw[0])
    assert len(r0) == len(windows) == STEPS
    for (a, b), row in zip(windows, r0.itertuples(), strict=True):
        comp, comm = _clip(ops, a, b), _clip(gloo, a, b)
        # communication: the gloo spans' union in the step, less what ops cover (compute first)
        assert row.communication_ns == pytest.approx(_length(comm) - _overlap(comm, comp),
                                                     abs=1000)  # fmt: skip
        assert row.communication_ns > SLEEP_MS * MS / 2 * 0.9  # the all-reduces' waits
    # the critical path: rank 0 waits for rank 1, not in Python
    s = diagnosis(trace).tables["summary"]
    top = s[s["rank"] == 0].sort_values("time_ns", ascending=False).iloc[0]
    assert top["category"] == "comm_wait"
    w0 = collective_waits(trace).query("rank == 0")
    per_step = w0[w0["ts"] >= windows[0][0]]["wait_ns"].sum() / STEPS
    assert top["time_ns"] == pytest.approx(per_step, rel=0.1)


def test_advice_for_rank0_is_the_late_rank(job) -> None:
    trace, _ = job
    recs = advise(trace, ranks=[0])["recommendations"]
    assert recs.iloc[0]["rule"] == "late-rank"
    assert "for rank 1 to arrive" in recs.iloc[0]["finding"]


def test_identity_replay_rendezvous_reproduces_the_steps(job) -> None:
    trace, raw = job
    rp = replay(trace)
    n = 2 * 4 * STEPS
    assert rp.graph.edge_counts()["collective"] == 2 * 2 * n  # in and out, both ranks
    st = rp.steps
    for rank in (0, 1):
        mine = st[st["rank"] == rank].sort_values("step")
        assert mine["measured_ns"].tolist() == [b - a for a, b in _steps(raw[rank])]
        err = (mine["simulated_ns"] / mine["measured_ns"] - 1).abs()
        assert err.max() < 0.01, err.tolist()


def test_single_rank_gloo_trace_has_rows_and_no_cross_rank_finding(tmp_path) -> None:
    path = shared("kineto/cpu/gloo_rank34of300.json.gz")
    raw = read_trace_json(path, exact=True)
    g = _spans(raw, "gloo:")
    store = tmp_path / "gloo.store"
    xpuprof.import_traces([path], store)
    with xpuprof.load(store) as t:
        res = collectives(t)
        coll = res.tables["collectives"].sort_values("ts")
        assert coll["ts"].tolist() == [us_to_ns(e["ts"]) for e in g]
        assert coll["bytes"].tolist() == [4.0 * np.prod(e["args"]["Input Dims"][0]) for e in g]
        assert "skew" not in res.tables and collective_waits(t).empty
        recs = advise(t)["recommendations"]
        assert "late-rank" not in set(recs["rule"])
        assert not recs["finding"].str.contains("rank [0-9]+ to arrive").any()


def _sync_rank(rank: int, start: float, dur: float) -> TraceBuilder:
    """One rank of a synchronous backend (no gloo worker spans): a step with one
    ``c10d::allreduce_`` op (the call, wait included) holding its ``record_param_comms``."""
    tb = TraceBuilder(rank=rank, world_size=2)
    tb.step(1, ts=0, dur=100)
    tb.op("aten::mm", 2, start - 4)
    tb.op("c10d::allreduce_", start, dur)
    tb.op("record_param_comms", start + 1, dur - 2, **{
        "Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000,
        "dtype": "Float", "Group size": 2, "Process Group Name": "0"})  # fmt: skip
    tb.op("aten::add_", start + dur + 2, 5)
    return tb


def test_sync_backend_c10d_op_is_the_collective_once(tmp_path) -> None:
    """Rank 0 calls at 10 µs and returns at 60; rank 1 calls at 40 and returns at 60: one
    collective each (the c10d op, not its record_param_comms too), 1000 floats = 4000 bytes,
    rank 0 waits 30 µs for rank 1, and its path puts that under comm_wait, the last 20 µs
    under communication."""
    files = [_sync_rank(0, 10, 50).write(tmp_path / "r0.json"),
             _sync_rank(1, 40, 20).write(tmp_path / "r1.json")]  # fmt: skip
    xpuprof.import_traces(files, tmp_path / "s.store")
    with xpuprof.load(tmp_path / "s.store") as t:
        coll = collectives(t).tables["collectives"].sort_values("rank")
        assert coll["name"].tolist() == ["c10d::allreduce_"] * 2
        assert coll["bytes"].tolist() == [4000.0, 4000.0]
        assert coll["type_source"].tolist() == ["record_param_comms"] * 2
        assert coll["process_group"].tolist() == ["pg 0"] * 2
        assert collective_waits(t).set_index("rank").loc[0, "wait_ns"] == 30_000
        s = diagnosis(t).tables["summary"].set_index(["rank", "category"])["time_ns"]
        assert s.loc[(0, "comm_wait")] == 30_000 and s.loc[(0, "communication")] == 20_000
        steps = overview(t).tables["steps"].set_index("rank")
        assert steps.loc[0, "communication_ns"] == 50_000


def test_nccl_host_ops_stay_launches(tmp_path) -> None:
    """A GPU rank: the ``c10d::``/``nccl:`` host ops launch an NCCL kernel, the one row."""
    tb = TraceBuilder(rank=0, world_size=1)
    tb.step(1, ts=0, dur=100)
    tb.op("c10d::allreduce_", 10, 20)
    tb.annotation("nccl:all_reduce", 11, 18)
    tb.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", ts=30, dur=40, launch_ts=12, stream=9)
    with tb.load(tmp_path) as t:
        coll = collectives(t).tables["collectives"]
        assert coll["name"].tolist() == ["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]
        assert coll["where"].tolist() == ["device"]


class _NoSleep:
    """Rank 1 without its sleeps: its host time inside a step span that lasts a pause or
    more (the untraced ``time.sleep`` before each collective) costs nothing."""

    def __init__(self, trace) -> None:
        q = "select id from events where rank = 1 and level = 'step'"
        self.steps = trace.sql(q)["id"].to_numpy(np.int64)

    def delays(self, graph) -> np.ndarray:
        d = graph.edges.delay.copy()
        sleep = ((graph.edges.kind == EDGE_KINDS.index("host_work"))
                 & np.isin(graph.edges.event, self.steps)
                 & (d >= 0.9 * SLEEP_MS * MS / PER_STEP))  # fmt: skip
        d[sleep] = 0
        return d


def test_rank0_gains_when_rank1_stops_sleeping(job) -> None:
    """The rendezvous carries rank 1's speed-up to rank 0: without the collectives matched
    across ranks, rank 0's replay would not move at all."""
    trace, _ = job
    base = replay(trace).steps.groupby("rank")["simulated_ns"].sum()
    fast = replay(trace, costs=_NoSleep(trace)).steps.groupby("rank")["simulated_ns"].sum()
    for rank in (0, 1):
        assert base[rank] - fast[rank] >= 0.5 * SLEEP_MS * MS * STEPS

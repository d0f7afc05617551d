"""Collectives, bus bandwidth, comm/compute overlap and cross-rank skew
(``xpuprof.analysis.comm``).

Bus bandwidth is checked by hand on a hand-written trace (nccl-tests' factors); the 8-rank DLRM
job is checked against its raw JSON: the collective count of every rank, the type and size of
each collective from the host annotation that launched it (found by correlation id and time
containment, the way a reader of the JSON would), the skew and straggler of every collective,
and the comm/compute overlap — which HTA 0.5.0 also reports for these files.
"""

from __future__ import annotations

import importlib
import math
import os
from pathlib import Path

import numpy as np
import pytest
from builders import TraceBuilder
from conftest import read_trace_json, shared, us_to_ns

import xpuprof
from xpuprof.analysis.comm import collectives, kernel_parts, normalize_collective

MIB = 1 << 20


def _coll(kind, n_in, n_out, dtype, group=4):
    """The record_param_comms args PyTorch copies onto an NCCL kernel."""
    return {"Collective name": kind, "In msg nelems": n_in, "Out msg nelems": n_out,
            "Group size": group, "dtype": dtype, "Process Group Name": "0",
            "Process Group Ranks": str(list(range(group)))}  # fmt: skip


@pytest.fixture
def synthetic(tmp_path):
    tb = TraceBuilder(rank=None, schemaVersion=1,
                      distributedInfo={"backend": "nccl", "rank": 0, "world_size": 4})  # fmt: skip
    tb.kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
              1000, 100, stream=20, correlation=0,
              **_coll("allreduce", MIB, MIB, "Float"))  # fmt: skip
    # overlaps the second half of the all-reduce
    tb.kernel("gemm_kernel", 1050, 100, stream=7, correlation=0)
    tb.kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
              2000, 50, stream=20, correlation=0,
              **_coll("all_gather", MIB // 4, MIB, "Float"))  # fmt: skip
    tb.kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_SIMPLE(ncclDevKernelArgsStorage<4096ul>)",
              3000, 25, stream=20, correlation=0,
              **_coll("reduce_scatter", MIB, MIB // 4, "BFloat16"))  # fmt: skip
    with tb.load(tmp_path, "rank0") as t:
        yield t


def test_names():
    assert normalize_collective("allreduce") == "all_reduce"
    assert normalize_collective("_allgather_base") == "all_gather"
    assert normalize_collective("reduce_scatter_tensor_coalesced") == "reduce_scatter"
    assert normalize_collective("nccl:all_to_all") == "all_to_all"
    assert normalize_collective("alltoall_base") == "all_to_all"
    assert normalize_collective("all-reduce") == "all_reduce"
    assert normalize_collective("collective-permute") == "send_recv"
    assert normalize_collective("broadcast") == "broadcast"
    assert normalize_collective("aten::add") is None
    old = kernel_parts("ncclKernel_AllReduce_RING_LL128_Sum_float(ncclDevComm*, ncclWork*)")
    assert old == {"collective": "all_reduce", "algorithm": "RING", "protocol": "LL128"}
    new = kernel_parts("ncclDevKernel_AllReduce_Sum_f32_TREE_SIMPLE(ncclDevKernelArgsStorage<8>)")
    assert new == {"collective": "all_reduce", "algorithm": "TREE", "protocol": "SIMPLE"}
    p2p = kernel_parts("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")
    assert p2p["collective"] == "send_recv" and p2p["algorithm"] is None
    assert kernel_parts("ncclDevKernel_Generic(x)")["collective"] is None


def test_busbw_by_hand(synthetic):
    r = collectives(synthetic)
    c = r["collectives"].set_index("collective")
    n = 4
    ar = c.loc["all_reduce"]
    ar_bytes = MIB * 4  # 1 Mi floats = 4 MiB
    ar_algbw = ar_bytes / 100e-6  # 41.9 GB/s
    assert ar["bytes"] == ar_bytes and ar["group_size"] == n
    assert ar["algbw"] == pytest.approx(ar_algbw)
    assert ar["busbw_factor"] == pytest.approx(2 * (n - 1) / n)  # 1.5
    assert ar["busbw"] == pytest.approx(ar_algbw * 1.5)  # 62.9 GB/s
    assert (ar["algorithm"], ar["protocol"]) == ("RING", "LL")
    assert ar["overlap_pct"] == pytest.approx(50.0)  # the GEMM covers [1050, 1100) of [1000, 1100)

    ag = c.loc["all_gather"]
    assert ag["bytes"] == MIB * 4  # the larger (gathered output) buffer, as nccl-tests' size
    assert ag["busbw"] == pytest.approx(MIB * 4 / 50e-6 * (n - 1) / n)
    assert (ag["algorithm"], ag["protocol"]) == ("RING", "LL")

    rs = c.loc["reduce_scatter"]
    assert rs["bytes"] == MIB * 2  # 1 Mi bf16 elements in
    assert rs["busbw"] == pytest.approx(MIB * 2 / 25e-6 * 3 / 4)
    assert (rs["algorithm"], rs["protocol"]) == ("RING", "SIMPLE")

    ov = r["overlap"].iloc[0]
    assert ov["comm_time_ns"] == (100 + 50 + 25) * 1000
    assert ov["overlapped_ns"] == 50_000
    assert ov["overlap_pct"] == pytest.approx(100 * 50 / 175)
    s = r["summary"].set_index("collective")
    assert s.loc["all_reduce", "busbw"] == pytest.approx(ar_algbw * 1.5)
    assert "skew" not in r.tables and any("one participant" in x for x in r.notes)


def test_headline_by_hand(synthetic):
    """The analysis states its answer itself: 100 + 50 + 25 = 175 µs of collectives on the one
    rank, 3 calls, all_reduce 100/175 = 57%; the GEMM hides 50/175 = 29% of it."""
    r = collectives(synthetic)
    assert r.facts["headline"] == ("Collectives take 175 µs per rank (3 calls; all_reduce 57% "
                                   "of their summed time), 29% hidden under compute")  # fmt: skip


def test_headline_counts_concurrent_collectives_once(tmp_path):
    """Two all-reduces on two streams of one rank, 0-100 and 50-150 µs: they run 150 µs (the
    union, by hand), 200 µs summed; the headline says both."""
    tb = TraceBuilder(rank=0)
    for t0, stream in ((0, 20), (50, 21)):
        tb.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                  t0, 100, stream=stream, correlation=0,
                  **_coll("allreduce", MIB, MIB, "Float", group=1))  # fmt: skip
    with tb.load(tmp_path) as t:
        line = collectives(t).facts["headline"]
    assert line.startswith("Collectives take 150 µs per rank (2 calls; all_reduce 100% of their "
                           "summed time; they overlap: 200 µs summed, counted once")  # fmt: skip


def _three_ranks(tmp_path: Path, late_us: tuple[int, int]) -> Path:
    """Three ranks, two 100 µs all-reduces each (at 1000 and 2000 µs); rank 2 starts them
    ``late_us`` later, ranks 0 and 1 on time (rank 1 10 µs after rank 0)."""
    files = []
    for rank, delay in ((0, (0, 0)), (1, (10, 10)), (2, late_us)):
        tb = TraceBuilder(rank=rank, world_size=3)
        for t0, d in zip((1000, 2000), delay, strict=True):
            tb.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                      t0 + d, 100, stream=20, correlation=0,
                      **_coll("allreduce", MIB, MIB, "Float", group=3))  # fmt: skip
        files.append(tb.write(tmp_path / f"rank{rank}.json"))
    xpuprof.import_traces(files, tmp_path / f"late{late_us[0]}.store")
    return tmp_path / f"late{late_us[0]}.store"


def test_headline_names_a_straggler_only_above_the_noise_floor(tmp_path):
    """Rank 2 is last at both collectives. 200 and 300 µs late (mean 250 µs, over the 50 µs
    floor): named. 20 and 30 µs late (mean 25 µs): noise, not named. Each rank spends 200 µs
    in 2 calls; no compute, so nothing is hidden."""
    base = (
        "Collectives take 200 µs per rank (2 calls; all_reduce 100% of their summed time), "
        "0% hidden"
    )
    with xpuprof.load(_three_ranks(tmp_path, (200, 300))) as t:
        line = collectives(t, align="none").facts["headline"]
    assert line == (base + " under compute; rank 2 is the last to arrive at 2 of 2 "
                    "collectives (250 µs late on average)")  # fmt: skip
    with xpuprof.load(_three_ranks(tmp_path, (20, 30))) as t:
        assert collectives(t, align="none").facts["headline"] == base + " under compute"


def test_no_collectives(tmp_path):
    tb = TraceBuilder(rank=None)
    tb.kernel("gemm", 0, 10, stream=7, correlation=0)
    with tb.load(tmp_path) as t:
        r = collectives(t)
        assert r["collectives"].empty and any("no collective" in n for n in r.notes)
        assert "headline" not in r.facts


DTYPE_SIZE = {"Float": 4, "Long": 8}


def test_a100_rank0_against_raw_args(nccl):
    src, t = nccl
    raw = [e for e in read_trace_json(src, exact=True)["traceEvents"]
           if e.get("cat") == "kernel" and "nccl" in e["name"].lower()]  # fmt: skip
    raw.sort(key=lambda e: e["ts"])
    c = collectives(t)["collectives"].sort_values("ts")
    assert len(c) == len(raw) == 21
    want_bytes = [max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"])
                  * DTYPE_SIZE[e["args"]["dtype"]] for e in raw]  # fmt: skip
    assert c["bytes"].tolist() == want_bytes
    assert c["collective"].tolist() == [
        {"allreduce": "all_reduce", "broadcast": "broadcast"}[e["args"]["Collective name"]]
        for e in raw
    ]
    assert (c["group_size"] == 2).all() and (c["busbw_factor"] == 1.0).all()  # 2(n-1)/n, n=2
    assert c["dur"].tolist() == [us_to_ns(e["dur"]) for e in raw]
    assert c["ts"].tolist() == [us_to_ns(e["ts"]) for e in raw]


# -- the 8-rank DLRM job ----------------------------------------------------------------------


def _dlrm_raw(files: list[Path]) -> dict[int, dict]:
    """Per rank, from the JSON alone: NCCL kernels in time order, each with the type and bytes of
    the nccl:* annotation enclosing the runtime call that launched it."""
    sizes = {"float": 4, "int": 4, "long int": 8}
    out = {}
    for f in files:
        doc = read_trace_json(f)
        rank = doc["distributedInfo"]["rank"]
        ev = doc["traceEvents"]
        kern = sorted((e for e in ev if e.get("cat") == "kernel" and "nccl" in e["name"].lower()),
                      key=lambda e: e["ts"])  # fmt: skip
        rt = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"
              and "correlation" in e.get("args", {})}  # fmt: skip
        ann = [e for e in ev if e.get("cat") == "user_annotation"
               and e["name"].startswith("nccl:")]  # fmt: skip
        rows = []
        for k in kern:
            r = rt[k["args"]["correlation"]]
            enc = [a for a in ann if a["tid"] == r["tid"] and a["ts"] <= r["ts"]
                   and a["ts"] + a["dur"] >= r["ts"] + r["dur"]]  # fmt: skip
            a = max(enc, key=lambda a: a["ts"])
            dims, types = a["args"]["Input Dims"][0], a["args"]["Input type"][0]
            rows.append({"ts": us_to_ns(k["ts"]), "dur": us_to_ns(k["dur"]),
                         "type": a["name"].split(":", 1)[1],
                         "bytes": math.prod(dims) * sizes[types]})  # fmt: skip
        gpu = [e for e in ev if e.get("cat") == "kernel"]
        out[rank] = {"nccl": rows, "kernels": gpu}
    return out


def _union(iv):
    iv = sorted(iv)
    out = []
    for s, e in iv:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


@pytest.fixture(scope="module")
def dlrm(dlrm_store):
    """The 8-rank job's store (imported once for the suite) and what its JSON says."""
    t, files = dlrm_store
    return t, _dlrm_raw(files)


def test_dlrm_table_matches_the_raw_json(dlrm):
    t, raw = dlrm
    c = collectives(t, align="none")["collectives"]
    assert sorted(c["rank"].unique().tolist()) == list(range(8))
    for rank, info in raw.items():
        mine = c[c["rank"] == rank].sort_values("ts")
        assert len(mine) == len(info["nccl"]) == 8, rank
        assert mine["ts"].tolist() == [x["ts"] for x in info["nccl"]]
        assert mine["collective"].tolist() == [x["type"] for x in info["nccl"]]
        assert mine["bytes"].tolist() == [x["bytes"] for x in info["nccl"]]
        assert (mine["group_size"] == 8).all()  # world size: no group args in these files


def test_dlrm_per_rank_half_split_by_ranks(dlrm, monkeypatch):
    """The per-rank half of the collectives (each kernel's type and size from its host
    annotation, its overlap) run by groups of ranks — as tasks of a real 2-worker Dask cluster,
    and in one process with the host event tree built one group of ranks at a time — gives
    the raw JSON's types and sizes and the one-pass tables; the half is computed once for
    every alignment asked of the trace."""
    import pandas as pd

    from xpuprof.analysis import per_rank

    t, raw = dlrm
    one_pass = collectives(t, align="none")
    assert set(one_pass["collectives"]["type_source"]) == {"host annotation"}
    sizes = {int(s["part"]): s["rows"]["events"] for s in t.sources}
    parts = sorted(sizes)
    monkeypatch.setattr(per_rank, "GROUP_MAX_EVENTS", sizes[parts[0]] + sizes[parts[1]])
    trees = []
    identify = importlib.import_module("xpuprof.analysis.comm.identify")
    real = identify._host_ops_of
    monkeypatch.setattr(identify, "_host_ops_of",
                        lambda tr, *a: trees.append(len(tr.sources)) or real(tr, *a))  # fmt: skip
    with xpuprof.load(t.path) as t1:
        in_groups = collectives(t1, align="none")
    assert len(trees) >= 4 and max(trees) <= 2  # host trees of at most two ranks at a time
    monkeypatch.setattr(per_rank, "DASK_MIN_PARTS", 2)
    monkeypatch.setattr(per_rank, "DASK_MIN_EVENTS", 0)
    comm = importlib.import_module("xpuprof.analysis.comm")
    monkeypatch.setattr(comm, "DASK_MIN_EVENTS_ALONE", 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    maps = []
    real_map = per_rank.map_groups
    monkeypatch.setattr(per_rank, "map_groups",
                        lambda tr, target, *a, **k: maps.append(target) or
                        real_map(tr, target, *a, **k))  # fmt: skip
    with xpuprof.load(t.path) as t2:
        on_dask = collectives(t2, align="none")
        assert len(collectives(t2, align="end")["skew"]) == 8
    assert maps == ["xpuprof.analysis.comm:part_collectives"]  # once for both alignments
    # by default the half starts a cluster of its own only from DASK_MIN_EVENTS_ALONE events,
    # and goes to one a tool has up already whatever their number
    monkeypatch.setattr(comm, "DASK_MIN_EVENTS_ALONE", sum(sizes.values()))
    with xpuprof.load(t.path) as t3:
        collectives(t3, align="none")
    assert len(maps) == 1
    with per_rank.shared_cluster(), xpuprof.load(t.path) as t4:
        per_rank.map_groups(t4, "xpuprof.analysis.overview:part_overview", parts[:2],
                            workers=2, seeds=lambda groups: [{} for _ in groups])  # fmt: skip
        assert per_rank.cluster_up()
        collectives(t4, align="none")
    assert maps[1:] == ["xpuprof.analysis.overview:part_overview",
                        "xpuprof.analysis.comm:part_collectives"]  # fmt: skip
    assert not per_rank.cluster_up()  # closed on leaving
    for res in (in_groups, on_dask):
        for name, table in one_pass.tables.items():
            pd.testing.assert_frame_equal(table, res.tables[name], check_dtype=False)
        assert res.notes == one_pass.notes and res.facts == one_pass.facts
        c = res["collectives"]
        for rank, info in raw.items():
            mine = c[c["rank"] == rank].sort_values("ts")
            assert mine["collective"].tolist() == [x["type"] for x in info["nccl"]]
            assert mine["bytes"].tolist() == [x["bytes"] for x in info["nccl"]]


def test_dlrm_skew_and_stragglers(dlrm):
    t, raw = dlrm
    r = collectives(t, align="none")
    skew = r["skew"].sort_values("seq").reset_index(drop=True)
    starts = np.array([[x["ts"] for x in raw[k]["nccl"]] for k in range(8)])  # rank × seq
    assert len(skew) == starts.shape[1] == 8
    want_skew = starts.max(axis=0) - starts.min(axis=0)
    assert skew["skew_ns"].tolist() == want_skew.tolist()
    want_last = starts.argmax(axis=0)  # first rank among equal latest starts
    assert skew["last_participant"].astype(int).tolist() == want_last.tolist()
    st = r["stragglers"].set_index("participant")
    counts = np.bincount(want_last, minlength=8)
    for k in range(8):
        assert st.loc[str(k), "times_last"] == counts[k]
    assert st["times_last"].sum() == 8
    assert r["clock"]["offset_ns"].eq(0).all()

    # aligned on the ends: offsets solved over all ranks at once (alternating medians of a
    # rank × collective matrix from the pairwise medians to rank 0; tests/test_clocks.py)
    ends = starts + np.array([[x["dur"] for x in raw[k]["nccl"]] for k in range(8)])
    x = (ends - ends.min(axis=0)).astype(float)
    o = np.median(x - x[0], axis=1)
    for _ in range(200):
        new = np.median(x - np.median(x - o[:, None], axis=0), axis=1)
        new -= new[0]
        moved, o = np.abs(new - o).max(), new
        if moved < 0.5:
            break
    off = np.round(o).astype(int)
    r2 = collectives(t)  # align="auto": hosts unknown → "end"
    clock = r2["clock"].set_index("participant")
    assert clock.loc["0", "method"] == "end"
    assert [clock.loc[str(k), "offset_ns"] for k in range(8)] == off.tolist()
    adj = starts - off[:, None]
    sk2 = r2["skew"].sort_values("seq")
    assert sk2["skew_ns"].tolist() == (adj.max(axis=0) - adj.min(axis=0)).tolist()


#: HTA 0.5.0 ``TraceAnalysis(trace_dir=...).get_comm_comp_overlap()`` on the same eight files.
HTA_OVERLAP_PCT = [4.50, 2.47, 7.88, 3.31, 0.56, 0.64, 7.56, 9.51]


def test_dlrm_overlap_against_raw_json_and_hta(dlrm):
    t, raw = dlrm
    ov = collectives(t)["overlap"].set_index("participant")
    for rank, info in raw.items():
        comm = _union([(x["ts"], x["ts"] + x["dur"]) for x in info["nccl"]])
        comp = _union([(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
                       for e in info["kernels"] if "nccl" not in e["name"].lower()])  # fmt: skip
        both = sum(max(0, min(b, d) - max(a, c)) for a, b in comm for c, d in comp)
        total = sum(b - a for a, b in comm)
        row = ov.loc[str(rank)]
        assert row["comm_time_ns"] == total and row["overlapped_ns"] == both
        assert round(row["overlap_pct"], 2) == HTA_OVERLAP_PCT[rank]


def test_two_jobs_in_one_store_are_not_compared(tmp_path):
    a = shared("kineto/gpu/a100_rank0of2_nccl.json.gz")
    d = shared("kineto/gpu/dlrm_8rank_v100")
    w0 = sorted(d.glob("worker0_*.json.gz"))[0]  # also rank 0
    xpuprof.import_traces([a, w0], tmp_path / "s", mixed=True)  # two jobs, on purpose
    with xpuprof.load(tmp_path / "s") as t:
        r = collectives(t)
    assert "skew" not in r.tables
    assert r["collectives"]["participant"].nunique() == 2
    assert any("same rank" in n for n in r.notes)

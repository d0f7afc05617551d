"""Memory timeline, peak and live set (``xpuprof.analysis.memory``).

A hand-written alloc/free sequence pins the rules (address reuse, a free of memory allocated
before the trace, attribution to op, top op and layer); the real V100 trace is checked against
a plain sequential replay of its ``[memory]`` events read with the ``json`` module.
"""

from __future__ import annotations

import pandas as pd
import pytest
from builders import TraceBuilder
from conftest import read_trace_json, shared

import xpuprof
from xpuprof.analysis.memory import memory, memory_timeline
from xpuprof.core.errors import XpuprofError


def _mem(tb, ts, addr, nbytes, total, *, dev_type=1, dev_id=0, reserved=1000):
    """One allocator record as torch.profiler writes it (``profile_memory=True``)."""
    args = {"Device Type": dev_type, "Device Id": dev_id, "Addr": addr, "Bytes": nbytes,
            "Total Allocated": total, "Total Reserved": reserved}  # fmt: skip
    return tb.instant("[memory]", ts, scope="t", **args)


def _load(tb, tmp_path):
    xpuprof.import_traces([tb.write(tmp_path / "mem.json")], tmp_path / "s")
    return xpuprof.load(tmp_path / "s")


@pytest.fixture
def seq_trace(tmp_path):
    # 30 bytes at address 3 were allocated before the trace started (Total Allocated = 30).
    tb = TraceBuilder(rank=None, schemaVersion=1)
    tb.x("nn.Module: Block_0", "python_function", 0, 1000)
    tb.op("aten::linear", 10, 200)
    tb.op("aten::empty", 20, 5)
    _mem(tb, 21, 1, 100, 130)  # alloc A @1 under linear → empty
    tb.op("aten::relu", 300, 50)
    _mem(tb, 310, 2, 50, 180)  # alloc B @2
    tb.op("aten::add", 400, 50)
    _mem(tb, 410, 1, -100, 80)  # free A
    tb.op("aten::mul", 500, 50)
    _mem(tb, 510, 1, 200, 280)  # alloc C @1 (address reused): the peak
    _mem(tb, 600, 9, 8, 8, dev_type=0, dev_id=-1, reserved=0)  # CPU, inside the layer only
    tb.op("aten::sum", 1100, 100)
    _mem(tb, 1110, 2, -50, 230)  # free B
    _mem(tb, 1120, 3, -30, 200)  # free of the pre-trace allocation
    _mem(tb, 1130, 1, -200, 0)  # free C
    _mem(tb, 1150, 9, -8, 0, dev_type=0, dev_id=-1, reserved=0)
    t = _load(tb, tmp_path)
    yield t
    t.close()


def test_synthetic_sequence(seq_trace):
    r = memory_timeline(seq_trace)
    peaks = r["peaks"].set_index("device")
    cuda = peaks.loc["cuda:0"]
    assert cuda["peak_allocated"] == 280 and cuda["peak_ts"] == 510_000
    assert (cuda["events"], cuda["allocs"], cuda["frees"]) == (7, 3, 4)
    assert cuda["live_allocations"] == 2 and cuda["live_bytes"] == 250
    assert cuda["unattributed_bytes"] == 30  # allocated before the trace
    assert cuda["frees_of_earlier_allocations"] == 1
    assert cuda["bytes_freed_of_earlier_allocations"] == 30
    assert cuda["reserved_at_peak"] == 1000

    live = r["live"]
    lc = live[live["device"] == "cuda:0"].set_index("addr")
    assert lc.loc[1, "bytes"] == 200 and lc.loc[1, "op"] == "aten::mul"
    assert lc.loc[2, "bytes"] == 50 and lc.loc[2, "op"] == "aten::relu"
    assert set(lc["layer"]) == {"nn.Module: Block_0"}
    assert lc.loc[2, "age_ns"] == (510 - 310) * 1000

    cpu = peaks.loc["cpu"]
    assert cpu["peak_allocated"] == 8 and cpu["live_bytes"] == 8
    lcpu = live[live["device"] == "cpu"].iloc[0]
    assert pd.isna(lcpu["op"]) and lcpu["layer"] == "nn.Module: Block_0"

    tl = r["timeline"]
    assert len(tl) == 9
    assert tl[tl["device"] == "cuda:0"]["total_allocated"].tolist() == [
        130, 180, 80, 280, 230, 200, 0
    ]  # fmt: skip
    by = r["live_by_op"]
    assert by[by["device"] == "cuda:0"]["bytes"].tolist() == [200, 50]
    # the analysis states its answer itself: the highest peak is cuda:0's 280 B, at 510 µs
    # from the first event (the layer span at 0); C (200 B, under aten::mul) is most of it.
    # Rank 0: the file names no rank (docs/steps.md: the default).
    assert r.facts["headline"] == (
        "Peak memory 280 B allocated on cuda:0 on rank 0 at 510 µs into the trace; the most "
        "live at the peak under aten::mul (200 B)"
    )


def test_nested_attribution_and_device_filter(tmp_path):
    tb = TraceBuilder(rank=None)
    tb.op("aten::linear", 10, 200)
    tb.op("aten::addmm", 20, 100)
    tb.op("aten::empty", 30, 5)
    _mem(tb, 31, 7, 64, 64)
    with _load(tb, tmp_path) as t:
        live = memory_timeline(t, device="cuda:0")["live"].iloc[0]
        assert (live["op"], live["top_op"]) == ("aten::empty", "aten::linear")
        assert pd.isna(live["layer"])
        r = memory_timeline(t, device="cpu")
        assert r["peaks"].empty and any("no [memory] events" in n for n in r.notes)
        with pytest.raises(XpuprofError, match="device 'gpu-zero': expected"):
            memory_timeline(t, device="gpu-zero")
        with pytest.raises(XpuprofError, match="device 'cuda:x': expected"):
            memory_timeline(t, device="cuda:x")
        # an index as the command line spells it (--device 0): the device id, of any type
        live = memory_timeline(t, device="0")["live"]
        assert live[["addr", "bytes"]].values.tolist() == [[7, 64]]
        assert memory_timeline(t, device="1")["live"].empty


def test_no_memory_events_is_a_note(tmp_path):
    tb = TraceBuilder(rank=None)
    tb.op("aten::add", 0, 10)
    with _load(tb, tmp_path) as t:
        r = memory_timeline(t)
        assert r["timeline"].empty and r["peaks"].empty and r["live"].empty
        assert any("profile_memory=True" in n for n in r.notes)
        assert "headline" not in r.facts


def _replay(events):
    """Sequential replay: the live allocations (addr → bytes) at the first maximum of Total
    Allocated, per device."""
    out = {}
    by_dev = {}
    for e in events:
        by_dev.setdefault(e["args"]["Device Id"], []).append(e)
    for dev, evs in by_dev.items():
        live, best, snap = {}, None, None
        for e in evs:
            a = e["args"]
            if a["Bytes"] > 0:
                live[a["Addr"]] = a["Bytes"]
            else:
                live.pop(a["Addr"], None)
            if best is None or a["Total Allocated"] > best:
                best, snap = a["Total Allocated"], dict(live)
        out[dev] = (best, snap)
    return out


def test_v100_peak_and_live_set_against_the_raw_json(tmp_path):
    src = shared("kineto/gpu/v100_rank1of2_df_index_resolver.json.gz")
    raw = read_trace_json(src)["traceEvents"]
    mem = [e for e in raw if e.get("name") == "[memory]"]
    mem = sorted(mem, key=lambda e: e["ts"])  # stable: file order among equal timestamps
    want = _replay(mem)
    xpuprof.import_traces([src], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        r = memory_timeline(t)
    peaks = r["peaks"].set_index("device_id")
    assert set(peaks.index) == set(want) == {1, -1}
    for dev, (best, snap) in want.items():
        p = peaks.loc[dev]
        assert p["peak_allocated"] == best
        assert p["peak_allocated"] == max(
            e["args"]["Total Allocated"] for e in mem if e["args"]["Device Id"] == dev
        )
        assert p["live_allocations"] == len(snap)
        assert p["live_bytes"] == sum(snap.values())
        assert p["events"] == sum(1 for e in mem if e["args"]["Device Id"] == dev)
    assert peaks.loc[1, "peak_allocated"] == 6629508096
    live = r["live"]
    cuda = live[live["device"] == "cuda:1"]
    assert set(cuda["addr"]) == set(want[1][1])
    # every live CUDA allocation was made under some op
    assert cuda["op"].notna().all()


def test_events_without_addr_give_a_timeline_but_no_live_set(tmp_path):
    # 2021 profilers wrote [memory] events with Bytes only: no Addr, no totals
    tb = TraceBuilder(rank=None)
    tb.op("aten::empty", 0, 10)
    for ts, b in ((1, 100), (2, 50), (3, -100), (4, 70)):
        tb.instant("[memory]", ts, scope="t", **{"Device Type": 1, "Device Id": 0, "Bytes": b})
    with _load(tb, tmp_path) as t:
        r = memory_timeline(t)
    p = r["peaks"].iloc[0]
    assert p["peak_allocated"] == 150  # running sum 100, 150, 50, 120
    assert r["timeline"]["total_allocated"].tolist() == [100, 150, 50, 120]
    assert pd.isna(p["live_bytes"]) and r["live"].empty
    assert any("without Addr" in n for n in r.notes)
    assert any("running sum" in n for n in r.notes)


def test_steps_select_the_timeline_and_the_peak(tmp_path):
    """Three steps; memory held across steps stays live (and attributed) at a later peak."""
    tb = TraceBuilder(rank=None)
    for n in range(3):
        tb.step(n, ts=100 * n, dur=100)
    tb.op("aten::empty", 8, 5)
    _mem(tb, 10, 1, 100, 100)  # step 0: A, held until step 2
    _mem(tb, 20, 2, 300, 400)  # step 0: B, the peak of step 0
    _mem(tb, 30, 2, -300, 100)
    _mem(tb, 110, 3, 50, 150)  # step 1: C, the peak of step 1
    _mem(tb, 120, 3, -50, 100)
    _mem(tb, 210, 4, 500, 600)  # step 2: D, the peak of the whole trace
    _mem(tb, 220, 4, -500, 100)
    _mem(tb, 230, 1, -100, 0)
    with _load(tb, tmp_path) as t:
        one = memory(t, steps=[1])
        p = one["peaks"].iloc[0]
        assert one["timeline"]["ts"].tolist() == [110_000, 120_000]
        assert (p["events"], p["allocs"], p["frees"]) == (2, 1, 1)
        assert (p["peak_allocated"], p["peak_ts"]) == (150, 110_000)
        # A was allocated in step 0 and is still held: live, attributed, not "unattributed"
        assert (p["live_allocations"], p["live_bytes"], p["unattributed_bytes"]) == (2, 150, 0)
        live = one["live"].set_index("addr")
        assert live.loc[1, "op"] == "aten::empty" and live.loc[1, "age_ns"] == 100_000
        every = memory(t)["peaks"].iloc[0]
        assert (every["peak_allocated"], every["events"], every["live_bytes"]) == (600, 8, 600)
        # HTA's default: each rank's last step (2) left out
        dl = memory(t, steps="drop-last")["peaks"].iloc[0]
        assert (dl["peak_allocated"], dl["peak_ts"], dl["events"]) == (400, 20_000, 5)
        assert dl["live_bytes"] == 400
        assert memory_timeline(t, steps=[7])["peaks"].empty

"""Memory timeline, peak and live set (``xpuprof.analysis.memory``).

A hand-written alloc/free sequence pins the rules (address reuse, a free of memory allocated
before the trace, attribution to op, top op and layer); the real V100 trace is checked against
a plain sequential replay of its ``[memory]`` events read with the ``json`` module.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import read_trace_json, shared

import xpuprof
from xpuprof.analysis.memory import memory_timeline


def _mem(ts, addr, nbytes, total, *, dev_type=1, dev_id=0, reserved=1000):
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
            "tid": 1, "ts": ts, "args": {"Device Type": dev_type, "Device Id": dev_id,
                                         "Addr": addr, "Bytes": nbytes,
                                         "Total Allocated": total, "Total Reserved": reserved}}  # fmt: skip  # noqa: E501


def _op(name, ts, dur, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {}}  # fmt: skip


@pytest.fixture
def seq_trace(tmp_path):
    # 30 bytes at address 3 were allocated before the trace started (Total Allocated = 30).
    ev = [
        _op("nn.Module: Block_0", 0, 1000, cat="python_function"),
        _op("aten::linear", 10, 200),
        _op("aten::empty", 20, 5),
        _mem(21, 1, 100, 130),  # alloc A @1 under linear → empty
        _op("aten::relu", 300, 50),
        _mem(310, 2, 50, 180),  # alloc B @2
        _op("aten::add", 400, 50),
        _mem(410, 1, -100, 80),  # free A
        _op("aten::mul", 500, 50),
        _mem(510, 1, 200, 280),  # alloc C @1 (address reused): the peak
        _mem(600, 9, 8, 8, dev_type=0, dev_id=-1, reserved=0),  # CPU, inside the layer only
        _op("aten::sum", 1100, 100),
        _mem(1110, 2, -50, 230),  # free B
        _mem(1120, 3, -30, 200),  # free of the pre-trace allocation
        _mem(1130, 1, -200, 0),  # free C
        _mem(1150, 9, -8, 0, dev_type=0, dev_id=-1, reserved=0),
    ]
    src = tmp_path / "mem.json"
    src.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    xpuprof.import_traces([src], tmp_path / "s")
    t = xpuprof.load(tmp_path / "s")
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


def test_nested_attribution_and_device_filter(tmp_path):
    ev = [
        _op("aten::linear", 10, 200),
        _op("aten::addmm", 20, 100),
        _op("aten::empty", 30, 5),
        _mem(31, 7, 64, 64),
    ]
    src = tmp_path / "n.json"
    src.write_text(json.dumps({"traceEvents": ev}))
    xpuprof.import_traces([src], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        live = memory_timeline(t, device="cuda:0")["live"].iloc[0]
        assert (live["op"], live["top_op"]) == ("aten::empty", "aten::linear")
        assert pd.isna(live["layer"])
        r = memory_timeline(t, device="cpu")
        assert r["peaks"].empty and any("no [memory] events" in n for n in r.notes)
        with pytest.raises(ValueError):
            memory_timeline(t, device="gpu-zero")


def test_no_memory_events_is_a_note(tmp_path):
    src = tmp_path / "none.json"
    src.write_text(json.dumps({"traceEvents": [_op("aten::add", 0, 10)]}))
    xpuprof.import_traces([src], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        r = memory_timeline(t)
        assert r["timeline"].empty and r["peaks"].empty and r["live"].empty
        assert any("profile_memory=True" in n for n in r.notes)


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
    ev = [_op("aten::empty", 0, 10)]
    for ts, b in ((1, 100), (2, 50), (3, -100), (4, 70)):
        e = _mem(ts, 0, b, 0)
        for k in ("Addr", "Total Allocated", "Total Reserved"):
            del e["args"][k]
        ev.append(e)
    src = tmp_path / "old.json"
    src.write_text(json.dumps({"traceEvents": ev}))
    xpuprof.import_traces([src], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        r = memory_timeline(t)
    p = r["peaks"].iloc[0]
    assert p["peak_allocated"] == 150  # running sum 100, 150, 50, 120
    assert r["timeline"]["total_allocated"].tolist() == [100, 150, 50, 120]
    assert pd.isna(p["live_bytes"]) and r["live"].empty
    assert any("without Addr" in n for n in r.notes)
    assert any("running sum" in n for n in r.notes)

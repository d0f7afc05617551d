"""Charts (``xpuprof.ui.charts``): each figure's marks hold the tool's numbers, checked against
numbers found another way — SQL over the store's events (step spans), the raw trace JSON
(allocator records), the CLI's ``--json`` of the same tool run in a fresh interpreter (op times,
roofline rows, collectives, stragglers) and a device's datasheet (the roof).

The shipped example trace (a PyTorch CPU training run with memory events) is always there; the
8-rank DLRM job, the A100 NCCL rank and the TPU XPlane come from ../shared/traces (skipped with
the reason when absent). Names from a trace reach Plotly as plain data: a kernel named like an
HTML tag is written with entities, never as a tag.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from typing import Any

import pytest
from builders import TraceBuilder
from conftest import EXAMPLE, cli_json, shared

import xpuprof
from xpuprof.core.result import Result
from xpuprof.core.text import short_name
from xpuprof.ui import charts, tools

#: A name that is an HTML tag with a script in it (the issue's XSS case).
EVIL = "<img src=x onerror=alert(1)>"
#: Multiplier from each axis unit the charts write to the tool's own units.
MS = 1e6  # ns per ms


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def by_id(figs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    ids = [f["id"] for f in figs]
    assert len(ids) == len(set(ids)), ids
    return {f["id"]: f for f in figs}


def walk_strings(obj: Any, key: str = ""):
    """Every (key, string) in a figure, recursively."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from walk_strings(v, k)
    elif isinstance(obj, list):
        for v in obj:
            yield from walk_strings(v, key)
    elif isinstance(obj, str):
        yield key, obj


# ---------------------------------------------------------------------------- overview


def step_durations_sql(trace) -> dict[tuple[int, int], int]:
    """(rank, step) → the step span's duration (ns), straight from the events table."""
    df = trace.sql("select rank, step, dur from events where level = 'step'")
    return {(int(r.rank), int(r.step)): int(r.dur) for r in df.itertuples()}


def bars_per_step(fig: dict[str, Any]) -> dict[str, dict[tuple[str, str], float]]:
    """Series name → (rank label, step label) → bar height (ms)."""
    out = {}
    for tr in fig["data"]:
        x = tr["x"]
        keys = list(zip(*x, strict=True)) if isinstance(x[0], list) else [("rank 0", s) for s in x]
        out[tr["name"]] = dict(zip(keys, tr["y"], strict=True))
    return out


def test_step_breakdown_on_the_example_sums_to_each_step_span(example_store):
    trace, _ = example_store
    res = tools.run("overview", trace)
    fig = by_id(charts.figures("overview", res))["step-breakdown"]
    assert fig["layout"]["barmode"] == "stack"
    assert "(ms)" in fig["layout"]["yaxis"]["title"]["text"]
    spans = step_durations_sql(trace)
    bars = bars_per_step(fig)
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for series in bars.values():
        for k, v in series.items():
            totals[k] += v
    assert {k: v * MS for k, v in totals.items()}.keys() == {
        (f"rank {r}", f"step {s}") for r, s in spans
    }
    for (r, s), dur in spans.items():
        assert close(totals[(f"rank {r}", f"step {s}")] * MS, dur, 1e-9), (r, s)
    # the segments are the CLI's steps table (category columns that are not 0 everywhere)
    doc = cli_json("overview", trace.path)
    rows = doc["tables"]["steps"]
    cats = [c for c in rows[0] if c.endswith("_ns") and c != "step_ns" and any(r[c] for r in rows)]
    assert sorted(bars) == sorted(c[:-3].replace("_", " ") for c in cats)
    for c in cats:
        for r in rows:
            got = bars[c[:-3].replace("_", " ")][(f"rank {r['rank']}", f"step {r['step']}")]
            assert close(got * MS, r[c]), (c, r)
    # one rank: no heat map; the top ops are the CLI's, in its order
    figs = by_id(charts.figures("overview", res))
    assert "step-heatmap" not in figs
    top = figs["top-ops"]["data"][0]
    assert top["x"] == pytest.approx([r["self_ms"] for r in doc["tables"]["top_ops"]], rel=1e-12)
    ticks = figs["top-ops"]["layout"]["yaxis"]["ticktext"]
    assert [html.unescape(t) for t in ticks] == [
        short_name(r["op"]) for r in doc["tables"]["top_ops"]
    ]


def test_steps_of_eight_ranks_grouped_by_rank_and_as_a_heat_map(dlrm_store):
    trace, files = dlrm_store
    figs = by_id(charts.figures("overview", tools.run("overview", trace)))
    spans = step_durations_sql(trace)
    assert len({r for r, _ in spans}) == len(files) == 8
    bd = figs["step-breakdown"]
    assert bd["layout"]["xaxis"]["type"] == "multicategory"
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for series in bars_per_step(bd).values():
        for k, v in series.items():
            totals[k] += v
    assert len(totals) == len(spans)
    for (r, s), dur in spans.items():
        assert close(totals[(f"rank {r}", f"step {s}")] * MS, dur), (r, s)
    hm = figs["step-heatmap"]["data"][0]
    assert hm["type"] == "heatmap"
    assert hm["y"] == [f"rank {r}" for r in range(8)]
    for i, r in enumerate(range(8)):
        for j, step in enumerate(hm["x"]):
            s = int(step.split()[1])
            assert close(hm["z"][i][j] * MS, spans[(r, s)])
    # the top kernels are the CLI's, short names as ticks
    doc = cli_json("overview", trace.path)
    kern = figs["top-kernels"]
    assert kern["data"][0]["x"] == pytest.approx(
        [r["total_ms"] for r in doc["tables"]["top_kernels"]]
    )
    assert [html.unescape(t) for t in kern["layout"]["yaxis"]["ticktext"]] == [
        short_name(r["kernel"])[: charts.LABEL_MAX - 1] + "…"
        if len(short_name(r["kernel"])) > charts.LABEL_MAX
        else short_name(r["kernel"])
        for r in doc["tables"]["top_kernels"]
    ]


# ---------------------------------------------------------------------------- roofline

#: NVIDIA H100 SXM5 datasheet: 67 TFLOP/s fp32 (vector), 3.35 TB/s HBM3.
H100_FP32 = 67e12
H100_BW = 3.35e12


def test_roofline_points_are_the_tools_rows_and_the_roof_the_datasheets(example_store):
    trace, _ = example_store
    res = tools.run("roofline", trace, device="h100-sxm")
    fig = by_id(charts.figures("roofline", res))["roofline"]
    assert fig["layout"]["xaxis"]["type"] == fig["layout"]["yaxis"]["type"] == "log"
    unit = fig["layout"]["yaxis"]["title"]["text"].split("(")[1].rstrip(")")
    scale = {"GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15}[unit]
    points = [t for t in fig["data"] if t["mode"] == "markers"]
    roofs = [t for t in fig["data"] if t["mode"] == "lines"]
    drawn = sorted((html.unescape(c[0]), x, y * scale) for t in points
                   for c, x, y in zip(t["customdata"], t["x"], t["y"], strict=True))  # fmt: skip
    doc = cli_json("roofline", trace.path, "--device", "h100-sxm")
    rows = doc["tables"]["by_name"]
    want = sorted((short_name(r["name"]), r["intensity"], r["achieved_flops"]) for r in rows
                  if (r["intensity"] or 0) > 0 and (r["achieved_flops"] or 0) > 0)  # fmt: skip
    assert len(drawn) == len(want) > 5
    for (n1, x1, y1), (n2, x2, y2) in zip(drawn, want, strict=True):
        assert n1 == n2 and close(x1, x2) and close(y1, y2, 1e-9)
    left = len(rows) - len(want)
    assert f"{left:,} with no FLOPs or no bytes not drawn" in fig["title"]
    # one roof: min(P, I·W) with the datasheet's P and W
    assert len(roofs) == 1
    for x, y in zip(roofs[0]["x"], roofs[0]["y"], strict=True):
        assert close(y * scale, min(H100_FP32, x * H100_BW), 1e-12)
    assert max(roofs[0]["y"]) * scale == pytest.approx(H100_FP32)
    assert any(close(x, H100_FP32 / H100_BW) for x in roofs[0]["x"])  # the ridge is a vertex


def test_roofline_kernel_points_of_the_tpu_are_the_tools_kernel_rows(tmp_path):
    store = tmp_path / "tpu.store"
    xpuprof.import_traces([shared("xplane/tpu_v6e_4chip_inference.xplane.pb")], store)
    with xpuprof.load(store) as trace:
        fig = by_id(charts.figures("roofline", tools.run("roofline", trace)))["roofline"]
    doc = cli_json("roofline", store)
    rows = [r for r in doc["tables"]["kernels"]
            if (r["intensity"] or 0) > 0 and (r["achieved_flops"] or 0) > 0]  # fmt: skip
    assert 0 < len(rows) <= charts.MAX_POINTS
    unit = fig["layout"]["yaxis"]["title"]["text"].split("(")[1].rstrip(")")
    scale = {"GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15}[unit]
    kern = [t for t in fig["data"] if t["mode"] == "markers" and t["name"].startswith("kernels")]
    drawn = sorted((x, y * scale) for t in kern for x, y in zip(t["x"], t["y"], strict=True))
    want = sorted((r["intensity"], r["achieved_flops"]) for r in rows)
    assert len(drawn) == len(want)
    assert all(close(a[0], b[0]) and close(a[1], b[1]) for a, b in zip(drawn, want, strict=True))
    # every point is coloured by the bound the tool gave it
    bounds = {r["bound"] for r in rows}
    assert {t["name"].split(", ")[1].split("-bound")[0] for t in kern} == bounds
    # the roofs: one per distinct (device, peak, bandwidth) of the drawn rows
    peaks = {(r["device"], r["peak_flops"], r["peak_bandwidth"]) for r in rows}
    roofs = [t for t in fig["data"] if t["mode"] == "lines"]
    assert len(roofs) == len(peaks)
    assert sorted(max(t["y"]) * scale for t in roofs) == pytest.approx(
        sorted(p for _, p, _ in peaks)
    )


# ------------------------------------------------------------------------------ memory


def test_memory_chart_is_the_allocators_own_record(example_store, raw_json):
    """The example records 2,695 allocator events (fewer than MAX_POINTS: nothing thinned):
    the allocated line is their ``Total Allocated`` in time order, x their time offsets."""
    trace, _ = example_store
    fig = by_id(charts.figures("memory", tools.run("memory", trace)))["memory"]
    events = [e for e in raw_json(EXAMPLE)["traceEvents"] if e.get("name") == "[memory]"]
    events.sort(key=lambda e: e["ts"])
    unit = fig["layout"]["yaxis"]["title"]["text"].split("(")[1].rstrip(")")
    scale = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}[unit]
    (alloc,) = [t for t in fig["data"] if t["name"].endswith("allocated") and t["mode"] == "lines"]
    assert len(alloc["x"]) == len(events) < charts.MAX_POINTS
    assert [round(y * scale) for y in alloc["y"]] == [e["args"]["Total Allocated"] for e in events]
    t0 = events[0]["ts"]  # µs
    for x, e in zip(alloc["x"], events, strict=True):
        assert x - alloc["x"][0] == pytest.approx((e["ts"] - t0) / 1e3, abs=1e-6)
    assert not [t for t in fig["data"] if t["name"].endswith("reserved")]  # all 0 on a CPU
    (peak,) = [t for t in fig["data"] if t["mode"] == "markers"]
    top = max(events, key=lambda e: e["args"]["Total Allocated"])
    assert round(peak["y"][0] * scale) == top["args"]["Total Allocated"] == 4276232
    assert peak["x"][0] - alloc["x"][0] == pytest.approx((top["ts"] - t0) / 1e3, abs=1e-6)


def test_thinning_keeps_first_last_lowest_and_highest():
    xs = [float(i) for i in range(100_000)]
    ys = [float((i * 7919) % 10_007) for i in range(100_000)]
    ys[12_345] = 1e9  # a spike
    ys[67_890] = -5.0  # a dip
    tx, ty = charts.thin_series(xs, ys, 4000)
    assert len(tx) <= 4000 + 4
    assert tx == sorted(tx) and tx[0] == 0.0 and tx[-1] == 99_999.0
    assert max(ty) == 1e9 and min(ty) == -5.0
    assert dict(zip(tx, ty, strict=True))[12_345.0] == 1e9
    assert all(ys[int(x)] == y for x, y in zip(tx, ty, strict=True))  # real points only
    assert charts.thin_series(xs[:10], ys[:10], 4000) == (xs[:10], ys[:10])


# -------------------------------------------------------------------------------- comm


def test_bandwidth_points_are_the_collectives_of_known_size(nccl, raw_json):
    path, trace = nccl
    fig = by_id(charts.figures("comm", tools.run("comm", trace)))["comm-bandwidth"]
    assert fig["layout"]["xaxis"]["type"] == "log"
    assert "(GB/s)" in fig["layout"]["yaxis"]["title"]["text"]
    assert "(bytes)" in fig["layout"]["xaxis"]["title"]["text"]
    drawn = sorted((x, y * 1e9) for t in fig["data"] for x, y in zip(t["x"], t["y"], strict=True))
    # independently: every NCCL kernel with a message size; 2 ranks: busbw = algbw (factor
    # 2(n-1)/n = 1 for all-reduce, 1 for broadcast), algbw = bytes / duration
    size = {"Float": 4, "Long": 8, "Int": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Byte": 1}
    want = []
    for e in raw_json(path)["traceEvents"]:
        a = e.get("args") or {}
        if e.get("ph") == "X" and e.get("cat") == "kernel" and "In msg nelems" in a:
            n = max(a["In msg nelems"], a.get("Out msg nelems", 0))
            b = n * size[a["dtype"]]
            dur_ns = round(e["dur"] * 1000)
            want.append((float(b), b / dur_ns * 1e9))
    want.sort()
    assert len(drawn) == len(want) == 21
    for (x1, y1), (x2, y2) in zip(drawn, want, strict=True):
        assert x1 == x2 and close(y1, y2, 1e-6)
    assert sorted(t["name"] for t in fig["data"]) == ["all_reduce", "broadcast"]
    assert "comm-skew" not in by_id(charts.figures("comm", tools.run("comm", trace)))


def test_skew_heat_map_rows_average_to_the_stragglers_lateness(dlrm_store):
    trace, _ = dlrm_store
    fig = by_id(charts.figures("comm", tools.run("comm", trace)))["comm-skew"]
    hm = fig["data"][0]
    doc = cli_json("comm", trace.path)
    skew = doc["tables"]["skew"]
    assert len(hm["x"]) == len(skew) == 8
    assert hm["y"] == [f"rank {r}" for r in range(8)]
    # the latest participant of each collective is late by its skew; the first by 0
    for j, s in enumerate(skew):
        col = [row[j] for row in hm["z"]]
        assert close(max(col) * MS, s["skew_ns"], 1e-9) and min(col) == 0
        assert hm["z"][int(s["last_participant"])][j] == max(col)
        assert hm["z"][int(s["first_participant"])][j] == 0
    # each row's mean is the comm tool's mean lateness of that rank
    for st in doc["tables"]["stragglers"]:
        row = hm["z"][int(st["participant"])]
        assert close(sum(row) / len(row) * MS, st["mean_late_ns"], 1e-9), st


# ------------------------------------------------------------------------ plain strings


def test_names_from_a_trace_reach_plotly_as_entities_only(tmp_path):
    tb = TraceBuilder(rank=0)
    tb.step(0, ts=0, dur=200)
    tb.op(EVIL, ts=5, dur=60)
    tb.launch(EVIL, ts=20, dur=50, launch_ts=10)
    tb.op("aten::mm<&>", ts=100, dur=50)
    tb.launch("void k<float>(int)", ts=110, dur=40, launch_ts=105)
    with tb.load(tmp_path) as trace:
        figs = []
        for tool in ("overview", "stats", "roofline", "memory", "comm"):
            figs += charts.figures(tool, tools.run(tool, trace))
    assert {"step-breakdown", "top-ops", "top-kernels", "stats-ops", "stats-kernels"} <= {
        f["id"] for f in figs
    }
    text = json.dumps(figs)
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    for key, s in walk_strings(figs):
        if key == "hovertemplate":  # our own tags only: <br>, <extra>
            assert "img" not in s and "onerror" not in s, s
            stripped = s.replace("<br>", "").replace("<extra>", "").replace("</extra>", "")
            assert "<" not in stripped and ">" not in stripped, s
        else:
            assert "<" not in s and ">" not in s, (key, s)


def test_no_charts_for_nothing():
    assert charts.figures("overview", Result()) == []
    assert charts.figures("hardware", Result(tables={"devices": [{"a": 1}]})) == []
    assert charts.figures("no-such-tool", Result()) == []
    # NaN never reaches the JSON (Plotly's JSON.parse rejects it)
    res = Result(tables={"steps": [{"rank": 0, "step": 1, "step_ns": 10, "compute_ns": float("nan"),
                                    "host_idle_ns": 10}]})  # fmt: skip
    (fig,) = charts.figures("overview", res)
    json.dumps(fig, allow_nan=False)


def test_a_real_trace_charts_without_nan(example_store):
    trace, _ = example_store
    for tool in ("overview", "stats", "roofline", "memory", "comm", "summary"):
        for fig in charts.figures(tool, tools.run(tool, trace)):
            json.dumps(fig, allow_nan=False)
            assert set(fig) == {"id", "title", "data", "layout"}
            assert fig["data"], fig["id"]

"""The one list of tools (``xpuprof.ui.tools``): every tool runs through ``tools.run`` on the
shipped example trace (a real PyTorch CPU training run), its numbers checked against values
read from the raw JSON with the ``json`` module (or a vendor's datasheet) where that is cheap,
and the terminal renderer shows every tool's tables and notes without knowing any table's
name."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from builders import TraceBuilder
from conftest import EXAMPLE, read_trace_json
from rich.console import Console

from xpuprof.core.errors import XpuprofError
from xpuprof.core.result import Presentation, Result, records
from xpuprof.ui import render, stores, tools

UI = Path(tools.__file__).parent
NAMES = [t.name for t in tools.TOOLS]


@pytest.fixture(scope="module")
def trace(example_store):
    return example_store[0]


@pytest.fixture(scope="module")
def raw() -> list[dict[str, Any]]:
    return read_trace_json(EXAMPLE)["traceEvents"]


@pytest.fixture(scope="module")
def results(trace) -> dict[str, Result]:
    """Each tool's Result on the example, with its default options (each run once)."""
    out = {}
    for tool in tools.TOOLS:
        out[tool.name] = tools.run(tool.name, *[trace] * tool.inputs)
    return out


def _step_durations_ns(raw: list[dict[str, Any]]) -> list[int]:
    return [round(e["dur"] * 1000) for e in raw if e.get("name", "").startswith("ProfilerStep#")]


def _op_counts(raw: list[dict[str, Any]]) -> Counter:
    return Counter(e["name"] for e in raw if e.get("cat") == "cpu_op")


def _shown(text: str) -> str:
    """Terminal text with whitespace and box drawing collapsed (tables wrap and fold)."""
    return re.sub(r"[\s│┃┏┓┗┛━─┳┻╇┡┩└┘┴┬├┤┼]+", " ", text)


def test_the_list_names_each_tool_once_and_every_function_resolves() -> None:
    assert len(NAMES) == len(set(NAMES))
    assert {"overview", "breakdown", "idle", "info", "summary", "critical-path", "diff",
            "formats", "hardware"} <= set(NAMES)  # fmt: skip
    for tool in tools.TOOLS:
        assert callable(tool.function()), tool.name
        assert tool.help and "\n" not in tool.help
        assert set(tool.common) <= set(tools.COMMON)
    with pytest.raises(XpuprofError, match="no tool"):
        tools.get("nope")


@pytest.mark.parametrize("name", NAMES)
def test_every_tool_runs_renders_and_serialises(name, results) -> None:
    res = results[name]
    assert isinstance(res, Result)
    assert res.tables or res.notes, f"{name}: neither a table nor a note"
    doc = json.loads(json.dumps(res.to_dict()))
    assert set(doc) == {"tables", "notes", "facts", "present"}
    assert set(doc["tables"]) == set(res.tables)
    for value in res.facts.values():
        assert value is None or isinstance(value, bool | int | float | str)
    console = Console(record=True, width=100)
    render.result(res, console, limit=5)
    text = _shown(console.export_text())
    for table, rows in res.tables.items():
        p = res.present.get(table, Presentation())
        if len(rows):
            title = p.title or table.replace("_", " ")
            assert _shown(title) in text, f"{name}: table {table!r} not shown"
    for note in res.notes:
        assert _shown(note) in text, f"{name}: note not shown: {note}"


def test_tools_reject_what_they_do_not_take(trace) -> None:
    with pytest.raises(XpuprofError, match="no option"):
        tools.run("info", trace, ranks=[0])
    with pytest.raises(XpuprofError, match="takes 2 trace"):
        tools.run("diff", trace)
    with pytest.raises(XpuprofError, match="not a list of numbers"):
        tools.run("overview", trace, steps="last")


def test_one_parser_for_ranks_and_steps() -> None:
    assert tools.parse_steps(None) is None
    assert tools.parse_steps("all") == "all"
    assert tools.parse_steps("drop-last") == tools.parse_steps("drop_last") == "drop-last"
    assert tools.parse_steps("3,5-7") == [3, 5, 6, 7]
    assert tools.parse_ranks("0-3") == [0, 1, 2, 3] and tools.parse_ranks("all") is None
    for bad in ("", ",", "7-3", "-3", "3-", "x"):  # nothing selected by mistake: an error
        with pytest.raises(XpuprofError, match="not a list of numbers"):
            tools.parse_steps(bad)
    with pytest.raises(XpuprofError, match="more than 100,000 numbers"):
        tools.parse_ranks("0-999999999999")  # a typo, not a list to build in memory


# ------------------------------------------------------------------ numbers, from the raw JSON


def test_overview_steps_against_the_raw_profiler_steps(results, raw) -> None:
    durations = _step_durations_ns(raw)
    res = results["overview"]
    summ = res["summary"].iloc[0]
    assert summ.steps == len(durations) == res.facts["steps"]
    assert summ.step_ms_mean == pytest.approx(sum(durations) / len(durations) / 1e6, rel=1e-6)
    assert sorted(res["steps"].step_ns) == sorted(durations)
    # no kernel, copy or collective category anywhere in the file: a CPU run
    assert not {e.get("cat") for e in raw} & {"kernel", "gpu_memcpy", "gpu_memset"}
    assert res.facts["host_only"] is True and bool(summ.host_only)
    # the advisor's recommendation follows the overview's numbers, under them
    assert list(res.tables)[-1] == "recommendations"
    rec = res["recommendations"].iloc[0]
    assert rec.rule == "python-overhead"
    assert rec.saved_fraction == pytest.approx(summ.host_idle_fraction)
    ops = _op_counts(raw)
    for op, calls in zip(res["top_ops"].op, res["top_ops"].calls, strict=True):
        assert calls == ops[op]


def test_info_against_the_raw_file(results, trace, raw) -> None:
    res = results["info"]
    (src,) = res["sources"]
    assert src["read"] == len(raw) and res.facts["events_read"] == len(raw)
    assert src["size_bytes"] == EXAMPLE.stat().st_size
    levels = {r["level"]: r["events"] for r in res["levels"]}
    assert levels["step"] == len(_step_durations_ns(raw))
    assert levels["op"] == sum(_op_counts(raw).values())
    # info states its answer itself (no distributedInfo in the file: rank 0, the default of
    # docs/steps.md; an empty deviceProperties: no device named)
    assert stores.info(trace).facts["headline"] == (
        f"{len(raw):,} events read from 1 source(s), rank 0"
    )


def test_info_document_is_the_manifest_summary(trace, raw) -> None:
    doc = tools.document("info", trace)
    (src,) = doc["sources"]
    assert doc["events_read"] == src["events_read"] == len(raw)
    assert src["read"]["phase"] == dict(Counter(e["ph"] for e in raw))
    assert doc["store"] == str(trace.path)


def test_summary_is_the_demos_composition(results, raw) -> None:
    res = results["summary"]
    assert list(res.tables)[:3] == ["sources", "tables", "levels"]
    assert res["overview"].steps.iloc[0] == len(_step_durations_ns(raw))
    assert res.present["overview"].layout == "transpose"
    assert res.present["recommendations"].layout == "paragraphs"
    ops = _op_counts(raw)
    assert len(res["top_ops"]) == 8
    assert all(ops[op] == calls for op, calls in zip(res["top_ops"].op, res["top_ops"].calls,
                                                       strict=True))  # fmt: skip
    assert "slowest_layers" not in res.tables  # the example has no layer spans


def test_stats_counts_against_the_raw_ops(results, raw) -> None:
    got = results["stats"]["ops"].set_index("name")["count"].to_dict()
    assert got == dict(_op_counts(raw))


def test_device_tools_on_a_cpu_run_say_so(results) -> None:
    for name in ("breakdown", "idle"):
        res = results[name]
        assert all(not len(t) for t in res.tables.values())
        assert any("no device events" in n for n in res.notes)
        assert res.facts["device_events"] == 0 and res.facts["steps"] == "all"
    assert results["comm"]["collectives"].empty


def test_input_against_the_raw_steps(results, raw) -> None:
    res = results["input"]
    durations = _step_durations_ns(raw)
    (summary,) = res["summary"].to_dict("records")
    assert (summary["steps"], summary["step_ns"]) == (len(durations), sum(durations))
    if "steps" in res.tables:  # the per-step table (left out when there are no input spans)
        assert sorted(res["steps"].step_ns) == sorted(durations)
    assert not any("DataLoader" in e.get("name", "") for e in raw)
    assert (res.facts["input_spans"], res.facts["input_fraction"]) == (0, 0.0)


def test_memory_peak_against_the_raw_allocator_records(results, raw) -> None:
    mem = [e["args"]["Total Allocated"] for e in raw if e.get("name") == "[memory]"]
    assert results["memory"]["peaks"].peak_allocated.iloc[0] == max(mem)


def test_diff_of_a_trace_with_itself(results, raw) -> None:
    ops = results["diff"]["ops"].set_index("name")
    assert (ops.status == "same").all() and (ops.time_delta_ns == 0).all()
    assert ops.count_a.to_dict() == dict(_op_counts(raw))


def test_hardware_and_formats() -> None:
    dev = {r["key"]: r for r in tools.run("hardware")["devices"]}
    # NVIDIA's V100 datasheet: SXM2, 15.7 TFLOP/s fp32, 900 GB/s HBM2
    assert dev["v100-sxm2"]["fp32_tflops"] == 15.7 and dev["v100-sxm2"]["memory_gbs"] == 900
    fmts = {r["format"]: r for r in tools.run("formats")["formats"]}
    assert {"kineto", "xplane"} <= set(fmts)
    assert ".json.gz" in fmts["kineto"]["suffixes"] and ".xplane.pb" in fmts["xplane"]["suffixes"]


# ------------------------------------------------------------------ steps: one default


def test_breakdown_and_idle_default_to_every_step_like_every_tool(tmp_path) -> None:
    """Two steps, a kernel launched in each (µs): A [10, 30) launched at 5 in step 1, B
    [150, 170) launched at 120 in step 2. Every step: span 10..170 = 160, busy 40, idle 120.
    drop-last (HTA's default, also under hta_compatible): A alone, span 20, idle 0."""
    tb = TraceBuilder(rank=0)
    tb.step(1, 0, 100)
    tb.step(2, 100, 100)
    tb.launch("gemm_a", 10, 20, launch_ts=5)
    tb.launch("gemm_b", 150, 20, launch_ts=120)
    with tb.load(tmp_path) as t:
        every = tools.run("breakdown", t)
        last = tools.run("breakdown", t, steps="drop-last")
        hta = tools.run("breakdown", t, hta_compatible=True)
        idle_every = tools.run("idle", t)
        idle_last = tools.run("idle", t, steps="drop-last")
    row = every["temporal"].iloc[0]
    assert (row.span_ns, row.idle_ns, row.device_events) == (160_000, 120_000, 2)
    assert every.facts["steps"] == "all"
    for res in (last, hta):
        row = res["temporal"].iloc[0]
        assert (row.span_ns, row.idle_ns, row.device_events) == (20_000, 0, 1)
        assert res.facts["steps"] == "drop-last"
    assert idle_every.facts["launches"] == 2 and idle_last.facts["launches"] == 1


# ------------------------------------------------------------------ the renderer


def test_renderer_names_no_table_and_the_cli_touches_none(results) -> None:
    """What a table looks like comes from its presentation and its column names: render.py
    holds none of the tools' table names, and cli.py never reaches into a Result's tables
    (it runs tools and hands their Results to the renderer)."""
    names = {n for res in results.values() for n in res.tables}
    names |= {n for tool in tools.TOOLS for n in tool.present}
    src = (UI / "render.py").read_text()
    quoted = {n for n in names if f'"{n}"' in src or f"'{n}'" in src}
    assert not quoted, f"render.py names tables {sorted(quoted)}"
    cli = (UI / "cli.py").read_text()
    assert ".tables" not in cli and "DataFrame" not in cli and "import pandas" not in cli


def test_units_come_from_column_names() -> None:
    res = Result(tables={"t": [
        {"name": "a", "idle_ns": 2_500_000, "share_fraction": 0.25, "size_bytes": 3 << 20,
         "step_ms_mean": 0.5, "count": 1234, "empty_ns": 0},
        {"name": "b", "idle_ns": 500_000, "share_fraction": 0.5, "size_bytes": 1 << 20,
         "step_ms_mean": 1.5, "count": 5, "empty_ns": 0},
    ]})  # fmt: skip
    console = Console(record=True, width=120)
    render.result(res, console)
    text = console.export_text()
    for want in ("idle (ms)", "2.5", "0.5", "share (%)", "25", "size (MiB)", "3",
                 "step mean (ms)", "1,234", "0 or empty in every row shown: empty"):  # fmt: skip
        assert want in text, want
    assert "2500000" not in text and "2,500,000" not in text


def test_paragraphs_and_transposed_layouts() -> None:
    rows = [{"rank": 0, "steps": 3, "step_ms_mean": 12.5}, {"rank": 1, "steps": 3,
                                                            "step_ms_mean": 14.0}]  # fmt: skip
    recs = [{"what": "Do this", "why": "it saves", "ms": 1.234}]
    res = Result(
        tables={"s": rows, "r": recs},
        present={"s": Presentation(layout="transpose", label="rank"),
                 "r": Presentation(layout="paragraphs", title="advice",
                                   lines=("{what}", "{why} {ms:.1f} ms"))},
    )  # fmt: skip
    console = Console(record=True, width=80)
    render.result(res, console)
    text = console.export_text()
    assert "rank 0" in text and "rank 1" in text and "step mean (ms)" in text
    assert "advice" in text and "1. Do this" in text and "it saves 1.2 ms" in text
    assert records(rows) == rows


def test_long_names_keep_the_numbers_in_an_80_column_terminal(results) -> None:
    long = [{"name": "void at::native::" + "x" * 200 + str(i), "calls": 10**i, "time_ns": 10**9 + i}
            for i in range(3)]  # fmt: skip
    console = Console(record=True, width=80)
    render.result(Result(tables={"kernels": long}), console)
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert any("100" in line and "1" in line for line in lines)
    assert sum("void at::native::" in line for line in lines) == 3  # one line per kernel

"""What a person reads: every command rendered at 80 and at 200 columns on real traces.

Each tool runs through ``tools.run`` on the shipped example (a PyTorch CPU training run) and,
when ``../shared/traces`` is there, on GPU traces (the A100 NCCL rank, the V100 rank with memory
events, the 8-rank DLRM job) and the TPU XPlane; its Result is rendered to a fixed-width Rich
console and the text is read back as a user reads it: every header word whole, every time,
byte, rate and share column with its unit in the header, no empty table, no line wider than the
terminal, the headline first. The expectations come from the tables' own column names (what
the data is), never from the renderer's code.

Then the rules one at a time, on tables written here with values chosen by hand: short kernel
names, units (binary bytes, GB/s, TFLOP/s), timestamps relative to the trace's first event,
``--wide``, numbered notes merged.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import shared
from rich.console import Console

import xpuprof
from xpuprof.core.result import Presentation, Result, records
from xpuprof.ui import render, tools
from xpuprof.ui.text import short_name

WIDTHS = (80, 200)
TRACE_TOOLS = [t for t in tools.TOOLS if t.inputs]

#: Column-name tokens that say a column is a measure with a unit (time, bytes, share…).
UNIT_TOKENS = {"ns", "us", "ms", "bytes", "fraction", "ratio", "utilization", "pct", "percent",
               "percentage", "share"}  # fmt: skip
#: Units a header may carry, in parentheses.
UNITS = {"ns", "µs", "ms", "s", "%", "B", "KiB", "MiB", "GiB", "TiB", "B/s", "KB/s", "MB/s",
         "GB/s", "TB/s", "FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "FLOP/s",
         "KFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s", "FLOP/B", "GB"}  # fmt: skip


def _render(res: Result, width: int, wide: bool = False) -> str:
    console = Console(record=True, width=width, file=open("/dev/null", "w"))  # noqa: SIM115
    render.result(res, console, wide=wide)
    return console.export_text()


# ------------------------------------------------------------------ reading tables back


def _tables(text: str) -> list[dict[str, Any]]:
    """The tables in rendered text: per table its headers (each column's header lines joined)
    and, for a key–value list (first header cell empty), the row labels of its first column."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("┏"):
            continue
        head = []
        j = i + 1
        while not lines[j].startswith("┡"):
            head.append([c.strip() for c in lines[j].split("┃")[1:-1]])
            j += 1
        headers = [" ".join(filter(None, col)) for col in zip(*head, strict=True)]
        body = []
        j += 1
        while not lines[j].startswith("└"):
            body.append([c.strip() for c in lines[j].split("│")[1:-1]])
            j += 1
        out.append({"headers": headers, "rows": body, "empty": not body})
    return out


def _labels(table: dict[str, Any]) -> list[str]:
    """What names the columns of a table as read: its headers, or for a key–value list the
    labels down its first column."""
    if table["headers"] and table["headers"][0] == "":
        return [r[0] for r in table["rows"] if r and r[0]]
    return table["headers"]


def _vocabulary(res: Result) -> set[str]:
    """Every word a header may be made of: the tokens of the tables' column names, the units
    in parentheses, and the words the renderer is documented to use (``share`` for a bare
    percentage, a transposed table's ``value`` and label values such as ``rank 0``)."""
    words = {"share", "value"}
    for table in res.tables.values():
        cols = table.columns if hasattr(table, "columns") else {k for r in table for k in r}
        for c in cols:
            words.update(str(c).split("_"))
    return words


def _check_headers(res: Result, text: str, what: str) -> int:
    """Every header word whole (a word of a column name, or a unit in parentheses), and every
    measure's header with a unit; returns how many measure headers were checked."""
    vocab = _vocabulary(res)
    measures = 0
    for table in _tables(text):
        assert not table["empty"], f"{what}: an empty table is printed"
        labels = _labels(table)
        for label in labels:
            unit = re.search(r"\(([^()]*)\)$", label)
            words = label[: unit.start()].split() if unit else label.split()
            if unit:
                assert unit[1] in UNITS, f"{what}: header {label!r}: unknown unit"
                measures += 1
            for w in words:
                assert w in vocab or re.fullmatch(r"-?\d+", w), (
                    f"{what}: header {label!r}: {w!r} is not a whole word of a column name"
                )
            # a header naming a unit-bearing column by its unit word must show the unit
            assert unit or not UNIT_TOKENS & set(words), f"{what}: {label!r} has no unit"
    return measures


def _check_measures_have_units(res: Result, text: str, what: str) -> int:
    """Every column whose name says it is a time, size or share (its name has a unit token,
    or it is the schema's ``dur``/``ts``), when shown as a header or a key, has a unit."""
    shown = [lab for t in _tables(text) for lab in _labels(t)]
    checked = 0
    columns = [list(map(str, t.columns if hasattr(t, "columns") else {k for r in t for k in r}))
               for t in res.tables.values()]  # fmt: skip
    plain = {c.replace("_", " ") for cols in columns for c in cols}
    for cols in columns:
        for c in cols:
            tokens = c.split("_")
            if not (UNIT_TOKENS & set(tokens) or c in ("dur", "ts") or c.endswith("_ts")):
                continue
            words = [t for t in tokens if t not in UNIT_TOKENS and t != "per"] or ["share"]
            if " ".join(words) in plain:
                continue  # ``step_ns`` and ``step``: a header ``step`` is the other one
            mine = [lab for lab in shown if lab.split(" (")[0].split() == words]
            for lab in mine:
                assert re.search(r"\([^()]+\)$", lab), f"{what}: column {c} shown as {lab!r}"
                checked += 1
    return checked


def _check(res: Result, width: int, what: str) -> tuple[int, int]:
    text = _render(res, width)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), f"{what}: wider than {width} columns"
    assert "…" not in "".join(h for t in _tables(text) for h in t["headers"]), (
        f"{what}: a header cut short"
    )
    headline = res.facts.get("headline")
    if headline:
        first = " ".join(lines[0].split())
        assert " ".join(headline.split()).startswith(first) and first, (
            f"{what}: the headline is not the first line: {lines[:2]}"
        )
    return _check_headers(res, text, what), _check_measures_have_units(res, text, what)


# ------------------------------------------------------------------ every command, real traces


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, Path]:
    """Stores of the real traces this module reads beyond the session's fixtures."""
    root = tmp_path_factory.mktemp("render")
    out = {}
    for name, rel in (("v100", "kineto/gpu/v100_rank1of2_df_index_resolver.json.gz"),
                      ("tpu", "xplane/tpu_v6e_4chip_inference.xplane.pb")):  # fmt: skip
        out[name] = root / f"{name}.store"
        xpuprof.import_traces([shared(rel)], out[name])
    return out


def _every_command(trace: Any, what: str) -> dict[str, Result]:
    results = {}
    for tool in TRACE_TOOLS:
        res = tools.run(tool.name, *[trace] * tool.inputs)
        measures = 0
        for width in WIDTHS:
            m, checked = _check(res, width, f"{what}/{tool.name}@{width}")
            measures += m
        results[tool.name] = res
    return results


def test_every_command_reads_well_on_the_shipped_example(example_store) -> None:
    results = _every_command(example_store[0], "example")
    # the tools that have something to say on a CPU run say it first
    for name in ("info", "stats", "critical-path", "diff"):
        assert results[name].facts.get("headline"), name


def test_every_command_reads_well_on_a_gpu_trace(nccl) -> None:
    _, trace = nccl
    results = _every_command(trace, "a100")
    for name in ("info", "stats", "breakdown", "idle", "comm", "critical-path", "diff"):
        assert results[name].facts.get("headline"), name


def test_every_command_reads_well_on_more_real_traces(imported, dlrm_store) -> None:
    with xpuprof.load(imported["v100"]) as v100:
        res = _every_command(v100, "v100")
        assert res["memory"].facts.get("headline", "").startswith("Peak memory")
    with xpuprof.load(imported["tpu"]) as tpu:
        _every_command(tpu, "tpu")
    res = _every_command(dlrm_store[0], "dlrm")
    # 8 ranks: the straggler is named (rank 7 arrives last at 5 of the 8 collectives, checked
    # against the skew table: first_start/last_start of each collective)
    assert "rank 7 is the last to arrive at 5 of 8 collectives" in res["comm"].facts["headline"]


def test_measures_with_units_are_checked(nccl) -> None:
    """The checks above are not vacuous: on the A100 trace the breakdown shows its times and
    shares with units, and a header without one is caught."""
    _, trace = nccl
    res = tools.run("breakdown", trace)
    headers, measures = _check(res, 80, "breakdown")
    assert headers >= 10 and measures >= 10
    bad = Result(tables={"t": [{"name": "a", "idle_ns": 5}, {"name": "b", "idle_ns": 7}]})
    text = _render(bad, 80).replace("idle (ns)", "idle ns  ")
    with pytest.raises(AssertionError, match="no unit"):
        _check_headers(bad, text, "broken")


# ------------------------------------------------------------------ the rules, by hand


@pytest.mark.parametrize(("name", "short"), [
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)",
     "cutlass::Kernel<…>"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, "
     "at::detail::Array<char*, 1>)", "at::native::vectorized_elementwise_kernel<…>"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, int)",
     "at::native::(anon)::cunn_SoftMaxForward<…>"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD (Device -> Device)"),
    ("<built-in method conv2d of type object at 0x7f>", "<built-in method conv2d of type "
     "object at 0x7f>"),
    ("torch/nn/modules/module.py(1501): _call_impl", "torch/nn/modules/module.py(1501): "
     "_call_impl"),
    ("aten::add_", "aten::add_"), ("ProfilerStep#4", "ProfilerStep#4"), ("a<b", "a<b"),
])  # fmt: skip
def test_short_names(name, short) -> None:
    assert short_name(name) == short


def test_long_kernel_names_short_by_default_full_with_wide() -> None:
    full = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
    res = Result(
        tables={
            "kernels": [
                {"name": full, "time_ns": 1_500_000},
                {
                    "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL("
                    "ncclDevKernelArgsStorage<4096ul>)",
                    "time_ns": 10,
                },
            ]
        }
    )
    text = _render(res, 80)
    assert "cutlass::Kernel<…>" in text and "Params" not in text and "void" not in text
    assert "ncclDevKernel_AllReduce_Sum_f32_RING_LL " in text
    wide = _render(res, 80, wide=True)
    assert full in wide and "ncclDevKernelArgsStorage<4096ul>)" in wide
    assert records(res.tables["kernels"])[0]["name"] == full  # --json keeps the name whole


def test_names_too_long_for_the_terminal_are_cut_in_the_middle() -> None:
    """Two op names that differ only at their end stay apart at 40 columns: the cell keeps the
    start and the end of each, joined by one ellipsis, and is no wider than its column."""
    fwd = "aten::_scaled_dot_product_flash_attention_for_cpu"
    rows = [{"name": fwd, "self_ns": 12_360_000}, {"name": fwd + "_backward", "self_ns": 10}]
    text = _render(Result(tables={"ops": rows}), 40)
    cells = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")]
    assert len(cells) == 2 and cells[0] != cells[1], cells
    assert cells[0].startswith("aten::_") and cells[0].endswith("for_cpu") and "…" in cells[0]
    assert cells[1].endswith("_backward") and "…" in cells[1]
    assert all(len(line) <= 40 for line in text.splitlines())
    assert fwd + "_backward" in _render(Result(tables={"ops": rows}), 40, wide=True)


def test_headline_and_notes_never_leave_a_unit_alone_on_a_line() -> None:
    """A headline or note is cut into lines without parting a number from its unit: at every
    width from 30 to 90 columns the words come back whole, no line is wider than the terminal,
    and no line starts with the unit of a number that ended the line before."""
    head = (
        "Rank 15 held the job back in 12 of 12 step(s): the other 63 rank(s) waited 283.9 "
        "ms per step for it in their collectives (4.506 ms each on average); it started its "
        "step 4.523 ms after the median rank, 97 % of the path, 3.2 GiB at the peak."
    )
    note = "the 2 ranks with 17 µs of skew were left out, 5 s and 40 steps after the start."
    res = Result(facts={"headline": head}, notes=[note])
    units = ("ns", "µs", "ms", "s", "%", "GiB")
    for width in range(30, 91):
        text = _render(res, width)
        lines = text.splitlines()
        assert all(len(line) <= width for line in lines), width
        assert " ".join(text.split()) == " ".join((head + " note: " + note).split()), width
        for before, line in zip(lines, lines[1:], strict=False):
            first = line.split()[0] if line.split() else ""
            assert not (first.strip(",.;()") in units and re.search(r"\d$", before.rstrip())), (
                width,
                before,
                line,
            )


def test_units_by_hand() -> None:
    """3 GiB = 3 · 2^30 bytes; 12.5e9 B/s = 12.5 GB/s; 3.2e14 FLOP/s = 320 TFLOP/s; a
    fraction 0.125 = 12.5 %; 1.5e6 ns = 1.5 ms; 2_500 µs (a ``_us`` column) = 2.5 ms."""
    res = Result(
        tables={"t": [{"name": "x", "size_bytes": 3 << 30, "busbw": 12.5e9,
                       "flops_per_s": 3.2e14, "busy_fraction": 0.125, "dur": 1_500_000,
                       "wait_us": 2_500.0}]},
        present={"t": Presentation(units=(("busbw", "B/s"),))},
    )  # fmt: skip
    text = " ".join(_render(res, 200).split())
    for want in ("size (GiB)", "3 ", "busbw (GB/s)", "12.5", "flops (TFLOP/s)", "320",
                 "busy (%)", "12.5", "dur (ms)", "1.5", "wait (ms)", "2.5"):  # fmt: skip
        assert want in text, want


def test_timestamps_are_ms_from_the_trace_start() -> None:
    """Start 1,700,000,000,000,000,000 ns; an event 2,345,678 ns later is at 2.346 ms, shown
    to the microsecond."""
    t0 = 1_700_000_000_000_000_000
    res = Result(tables={"path": [{"name": "a", "start": t0 + 2_345_678, "dur": 10_000},
                                  {"name": "b", "start": t0 + 12_000, "dur": 20_000}]},
                 facts={"trace_start_ns": t0},
                 present={"path": Presentation(units=(("start", "ts"),))})  # fmt: skip
    text = _render(res, 80)
    assert "start (ms)" in text and "2.346" in text and "0.012" in text
    assert "1,700,000" not in text and "from the trace's first event" in text
    # without the trace's start (a user's SQL), the numbers are left as they are
    plain = Result(tables={"q": [{"ts": t0}, {"ts": t0 + 1}]})
    assert "1,700,000,000,000,000,000" in _render(plain, 80)


def test_tools_run_adds_the_trace_start_for_tables_with_timestamps(nccl, raw_json) -> None:
    """The trace's first event, from the raw JSON (µs → ns), is the origin of the critical
    path's start and end."""
    path, trace = nccl
    events = raw_json(path)["traceEvents"]
    first = min(e["ts"] for e in events if e.get("ph") == "X" and "ts" in e)
    res = tools.run("critical-path", trace)
    assert res.facts["trace_start_ns"] == pytest.approx(first * 1000, abs=1000)
    assert "trace_start_ns" not in tools.run("breakdown", trace).facts  # no timestamps there


def test_numbered_notes_merge() -> None:
    notes = [f"part {i}: no cuda_sync events" for i in (0, 1, 2, 3, 5)] + ["other", "rank 3: x"]
    assert render.merge_notes(notes) == ["parts 0-3, 5: no cuda_sync events", "other",
                                         "rank 3: x"]  # fmt: skip


def test_a_summary_row_is_a_key_value_list_when_too_wide() -> None:
    row = {f"metric_{i}_ns": 1000 * (i + 1) for i in range(12)}
    text = _render(Result(tables={"summary": [{"rank": 0, **row}]}), 80)
    (table,) = _tables(text)
    assert table["headers"] == ["", "rank 0"]
    assert _labels(table)[0] == "metric 0 (µs)" and len(_labels(table)) == 12


def test_columns_equal_in_every_row_move_into_the_title() -> None:
    rows = [{"rank": 3, "stream": 7, "name": n, "time_ns": t} for n, t in (("a", 5), ("b", 9))]
    text = _render(Result(tables={"kernels": rows}), 80)
    assert text.splitlines()[0] == "kernels — rank 3, stream 7"
    assert _tables(text)[0]["headers"] == ["name", "time (ns)"]


def test_a_text_that_tells_apart_rows_of_one_key_stays_when_columns_are_left_out() -> None:
    """Per participant and collective type (the comm tool's summary): two rows per participant.
    In a terminal too narrow for every column, measures are left out before the type, without
    which a participant's two rows read alike; a table with a ``name`` column keeps its
    measures before a kernel's grid (the time is what is read there)."""
    rows = [{"participant": str(r), "collective": k, "count": 3 + 2 * j,
             "bytes": 2_485_125 * (j + 1) + r, "time_ns": 1_799_000 + 1_000 * r,
             "algbw": 1.381e9 + r * 1e7, "busbw": 2.418e9 + r * 1e7, "overlap_pct": 8.0 + r,
             "algorithms": "RING", "protocols": "LL,LL128" if j else "LL", "rank": r}
            for r in range(8) for j, k in enumerate(("all_reduce", "all_to_all"))]  # fmt: skip
    rate = Presentation(units=(("algbw", "B/s"), ("busbw", "B/s")))
    text = _render(Result(tables={"summary": rows}, present={"summary": rate}), 64)
    headers = _tables(text)[0]["headers"]
    assert headers[:2] == ["participant", "collective"], headers
    assert "left out" in text and "collective" not in text.split("left out")[1]
    kernels = [{"name": "ncclKernel_AllReduce_RING_LL_Sum_float", "grid": f"[{g},1,1]",
                "block": "[640,1,1]", "count": 8 + g, "total_ns": 7_071_000 + g,
                "mean_ns": 441_900 + g, "min_ns": 69_000 + g, "max_ns": 952_000 + g,
                "occupancy_pct": 12.5 + g, "share_pct": 3.1 + g}
               for g in range(1, 13)]  # fmt: skip
    headers = _tables(_render(Result(tables={"kernels": kernels}), 64))[0]["headers"]
    assert "total (µs)" in headers and "grid" not in headers, headers


def test_columns_left_out_under_one_label_are_named_with_their_units() -> None:
    """The comm tool's collectives: ``overlap_ns`` and ``overlap_pct`` both read "overlap";
    left out at 80 columns, the note names them "overlap (µs), overlap (%)", not "overlap,
    overlap"; a left-out column whose label is its own keeps the short name."""
    rows = [{"rank": r, "name": f"ncclKernel_AllReduce_RING_LL_Sum_float_{r}",
             "ts_start_ns": 1_000_000 * r, "dur_ns": 2_146_000 + r, "bytes": 24_576 * (r + 1),
             "algbw": 1.1e7 + r, "busbw": 1.2e7 + r, "overlap_ns": 64_000 + r,
             "overlap_pct": 3.0 + r, "late_ns": 1_000 * r, "process_group": f"pg{r % 2}",
             "seq": r, "group_size": 8 + r % 2} for r in range(6)]  # fmt: skip
    text = _render(Result(tables={"collectives": rows}), 60)
    left = " ".join(text.split("left out")[1].split()) if "left out" in text else ""
    assert "overlap (µs)" in left and "overlap (%)" in left, text
    assert "seq" in left and "seq (" not in left, text

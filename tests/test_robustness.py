"""Odd and damaged stores never reach the user as a traceback.

Every tool of ``ui/tools.py`` runs on stores that hold little or nothing (no events, host events
only, device events only, no steps, one event, events without a rank or outside any step) and
with a rank or step selection that matches nothing; each answers without an exception, prints no
empty table, fits an 80-column terminal, and says in a note what was missing, in the terms the
user chose (``no events on rank 5; ranks in this store: 0``). The stores are written by hand with
``TraceBuilder``, so every expected note below is known from the events built.

Stores with a deleted, truncated or foreign Parquet file, or a manifest that is not one, make
every command print one line and exit with code 2 (``Trace.table``/``Trace.sql`` raise
``StoreError`` and ``read_manifest`` validates the manifest: the store layer's part), and
``xpuprof info --check`` lists what is wrong.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from builders import TraceBuilder
from conftest import cli
from rich.console import Console

import xpuprof
from xpuprof.analysis.common import number_ranges, selection_notes
from xpuprof.core.result import Result
from xpuprof.ui import cli as cli_module
from xpuprof.ui import render, tools

NO_EVENTS = "this store holds no events: there is nothing to analyse"
NO_RANK_5 = "no events on rank 5; ranks in this store: 0"
NO_STEPS_1_3 = "no events in steps 1-3; steps in this store: 0"
NO_STEP_SPANS = "no events in steps 1-3: there are no step spans in this store"


def _empty() -> TraceBuilder:
    return TraceBuilder(rank=0)


def _host_only() -> TraceBuilder:
    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 100)
    tb.op("aten::mm", 10, 30)
    tb.op("aten::add", 50, 10)
    return tb


def _device_only() -> TraceBuilder:
    tb = TraceBuilder(rank=0)
    tb.kernel("gemm", 10, 30)
    tb.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 50, 20, stream=9)
    return tb


def _no_steps() -> TraceBuilder:
    tb = TraceBuilder(rank=0)
    tb.op("aten::mm", 0, 50)
    tb.launch("gemm", 10, 20, launch_ts=5)
    return tb


def _one_event() -> TraceBuilder:
    tb = TraceBuilder(rank=0)
    tb.op("aten::mm", 0, 50)
    return tb


def _no_rank() -> TraceBuilder:
    """No distributedInfo: a single-rank trace, rank 0."""
    tb = TraceBuilder(rank=None)
    tb.step(0, 0, 100)
    tb.op("aten::mm", 5, 50)
    tb.launch("gemm", 10, 20, launch_ts=6)
    return tb


def _outside_steps() -> TraceBuilder:
    """One step [0, 100) µs; an op and its kernel after it, whose step is null."""
    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 100)
    tb.op("aten::mm", 5, 50)
    tb.op("aten::add", 150, 30)
    tb.launch("gemm", 160, 10, launch_ts=152)
    return tb


#: name → (builder, the note for --rank 5, the note for --steps 1-3); None: no events at all.
ODD = {
    "empty": (_empty, None, None),
    "host_only": (_host_only, NO_RANK_5, NO_STEPS_1_3),
    "device_only": (_device_only, NO_RANK_5, NO_STEP_SPANS),
    "no_steps": (_no_steps, NO_RANK_5, NO_STEP_SPANS),
    "one_event": (_one_event, NO_RANK_5, NO_STEP_SPANS),
    "no_rank": (_no_rank, NO_RANK_5, NO_STEPS_1_3),  # a single-rank trace is rank 0
    "outside_steps": (_outside_steps, NO_RANK_5, NO_STEPS_1_3),
}  # fmt: skip

#: Every tool that reads a trace.
TRACE_TOOLS = [t for t in tools.TOOLS if t.inputs]


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("odd")
    return {name: build().store(root / name) for name, (build, _, _) in ODD.items()}


def _shown(res: Result) -> list[str]:
    """The lines the terminal shows for ``res`` at 80 columns."""
    console = Console(record=True, width=80, file=open("/dev/null", "w"))  # noqa: SIM115
    render.result(res, console)
    return console.export_text().splitlines()


def _check_shown(res: Result, what: str) -> None:
    lines = _shown(res)
    assert res.tables or res.notes, f"{what}: says nothing"
    assert all(len(line) <= 80 for line in lines), f"{what}: wider than 80 columns"
    # a table's header rule (┡━┩) directly above its bottom rule (└─┘): a table with no rows
    empty = [i for i in range(len(lines) - 1)
             if lines[i].startswith("┡") and lines[i + 1].startswith("└")]  # fmt: skip
    assert not empty, f"{what}: an empty table is printed"
    for note in res.notes:
        assert "\n" not in note, f"{what}: a note of more than one line"
    json.dumps(res.to_dict())  # and it serialises


#: Tables that say what a store holds (``info``'s, which ``summary`` shows too): they have rows
#: whatever is selected.
INFO_TABLES = {"sources", "tables", "levels"}


def _selected_nothing(res: Result) -> bool:
    return not any(len(t) for k, t in res.tables.items() if k not in INFO_TABLES)


@pytest.mark.parametrize("name", list(ODD))
def test_every_tool_on_an_odd_store(name, stores) -> None:
    """No exception, something said, no empty table, 80 columns; a selection that matches
    nothing is an error (``SelectionError``: the CLI's one line and exit 2) whose message is
    exactly what is missing and what the store holds."""
    _, no_rank_5, no_steps = ODD[name]
    with xpuprof.load(stores[name]) as trace:
        for tool in TRACE_TOOLS:
            traces = [trace] * tool.inputs
            default = tools.run(tool.name, *traces)
            _check_shown(default, f"{name}/{tool.name}")
            if not tool.common:
                continue
            expected_default = [NO_EVENTS] if no_rank_5 is None else None
            if expected_default:
                assert _labelled(default.notes, tool) == expected_default, tool.name
                assert _selected_nothing(default), tool.name
            for sel, note in (({"ranks": [5]}, no_rank_5), ({"steps": [1, 2, 3]}, no_steps),
                              ({"ranks": "5", "steps": "1-3"}, no_rank_5)):  # fmt: skip
                with pytest.raises(tools.SelectionError) as err:
                    tools.run(tool.name, *traces, **sel)
                label = "baseline: " if tool.inputs == 2 else ""
                assert str(err.value) == label + (note or NO_EVENTS), (tool.name, sel)


def _labelled(notes: list[str], tool: tools.Tool) -> list[str]:
    """The notes of a one-trace tool as they are; a two-trace tool (diff, here of a store with
    itself) says each once per side."""
    if tool.inputs == 1:
        return notes
    base = [n.removeprefix("baseline: ") for n in notes if n.startswith("baseline: ")]
    new = [n.removeprefix("new: ") for n in notes if n.startswith("new: ")]
    assert base == new and len(base) + len(new) == len(notes), notes
    return base


def test_a_selection_partly_in_the_store_names_what_is_not(stores) -> None:
    """Steps 0 and 4 of a store with step 0 only: the tools answer for step 0 (its step span
    of 100 µs) and say that step 4 is not there; ranks 0 and 7 likewise."""
    with xpuprof.load(stores["outside_steps"]) as trace:
        res = tools.run("overview", trace, steps=[0, 4], ranks=[0, 7])
        assert res.notes[:2] == ["no events on rank 7; ranks in this store: 0",
                                 "no events in step 4; steps on rank 0: 0"]  # fmt: skip
        (row,) = res["summary"].to_dict("records")
        assert row["steps"] == 1 and row["step_ms_mean"] == pytest.approx(0.1)
        assert selection_notes(trace, ranks=[0], steps="all") == ([], True)
        assert selection_notes(trace, steps=[]) == (["the selection (steps []) matches no "
                                                     "event"], False)  # fmt: skip


def test_a_trace_without_steps_is_one_window_without_a_step_number(stores) -> None:
    """``no_steps``: an op [0, 50) µs, its launch [5, 10), the kernel [10, 30): one window of
    50 µs, whose step is missing, not -1 (a step number no trace has)."""
    with xpuprof.load(stores["no_steps"]) as trace:
        (row,) = tools.run("overview", trace)["steps"].to_dict("records")
    assert row["step"] is None or row["step"] is pd.NA
    assert row["step_ns"] == 50_000


def test_number_ranges_reads_as_a_person_writes_them() -> None:
    assert number_ranges([3, 0, 1, 2, 7, 8]) == "0-3, 7, 8"
    assert number_ranges([5]) == "5" and number_ranges([]) == ""
    assert number_ranges(range(0, 40, 2), most=3) == "0, 2, 4, … (20 in all)"


def _main(capsys, *args: Any) -> tuple[int, str, str]:
    """``xpuprof ARGS`` through :func:`xpuprof.ui.cli.main` in this process (every command
    on every damaged store would take a minute in new processes): exit code, stdout, stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli_module.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.mark.parametrize("args", [
    ["input", "--pattern", "("], ["overview", "--top", "-1"], ["memory", "--device", "gpu-zero"],
    ["hierarchy", "--by", "nonsense"], ["comm", "--align", "sideways"],
    ["roofline", "--device", "no-such-gpu"], ["breakdown", "--steps", "last"],
])  # fmt: skip
def test_a_bad_option_value_is_one_line(args, stores, capsys) -> None:
    """``--pattern (`` and ``--device gpu-zero`` were tracebacks; ``--top -1`` an SQL error."""
    code, out, err = _main(capsys, args[0], stores["outside_steps"], *args[1:])
    assert code == 2 and out == "", err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert repr(args[-1]) in err or args[-1] in err, err


# ------------------------------------------------------------------ damaged stores


def _damaged(tmp_path: Path, source: Path, how: str) -> Path:
    store = tmp_path / f"{how}.store"
    shutil.copytree(source, store)
    manifest = store / "manifest.json"
    events, flows = (store / _listed(store, t) for t in ("events", "flows"))
    if how == "deleted":
        events.unlink()
    elif how == "truncated":
        events.write_bytes(events.read_bytes()[:100])
    elif how == "foreign":  # the flows file where the events file should be
        shutil.copyfile(flows, events)
    elif how == "manifest-list":
        manifest.write_text("[]")
    elif how == "no-rows":
        doc = json.loads(manifest.read_text())
        del doc["sources"][0]["rows"]
        manifest.write_text(json.dumps(doc))
    elif how == "outside":
        doc = json.loads(manifest.read_text())
        doc["sources"][0]["files"]["events"] = "../../../../etc/passwd"
        manifest.write_text(json.dumps(doc))
    return store


def _listed(store: Path, table: str) -> str:
    """The file of ``table`` the manifest lists for the store's one source."""
    return json.loads((store / "manifest.json").read_text())["sources"][0]["files"][table]


def _commands(store: Path, tmp_path: Path) -> list[list[Any]]:
    """Every command that reads a store's tables."""
    out = [[t.name, *[store] * t.inputs] for t in TRACE_TOOLS if t.name not in ("info",)]
    return [*out, ["sql", store, "select count(*) from events"],
            ["export", store, "-o", tmp_path / "out.json"]]  # fmt: skip


@pytest.fixture(scope="module")
def good_store(stores) -> Path:
    return stores["outside_steps"]


@pytest.mark.parametrize("how", ["deleted", "truncated", "foreign"])
def test_every_command_on_a_damaged_data_file_prints_one_line(how, good_store, tmp_path,
                                                               capsys) -> None:  # fmt: skip
    """Needs the store layer's checks (``StoreError`` from ``Trace.table``/``Trace.sql``)."""
    store = _damaged(tmp_path, good_store, how)
    name = Path(_listed(store, "events")).name
    for args in _commands(store, tmp_path):
        code, out, err = _main(capsys, *args)
        assert code == 2, (args[0], err)
        assert err.startswith("error: ") and err.count("\n") == 1, (args[0], err)
        assert name in err, (args[0], err)
        assert "Traceback" not in out + err
    assert not (tmp_path / "out.json").exists()  # export wrote nothing


@pytest.mark.parametrize("how", ["manifest-list", "no-rows", "outside"])
def test_every_command_on_a_damaged_manifest_prints_one_line(how, good_store, tmp_path,
                                                              capsys) -> None:  # fmt: skip
    """Needs the store layer's manifest validation (``read_manifest``); ``info --check``
    lists the problem instead (exit 2)."""
    store = _damaged(tmp_path, good_store, how)
    for args in [["info", store], *_commands(store, tmp_path)]:
        code, out, err = _main(capsys, *args)
        assert code == 2, (args[0], err)
        assert err.startswith("error: ") and err.count("\n") == 1, (args[0], err)
        assert "manifest" in err, (args[0], err)
        assert "Traceback" not in out + err
    code, out, err = _main(capsys, "info", store, "--check", "--json")
    assert code == 2 and not err, err
    (problem,) = json.loads(out)["check"]["problems"]
    assert "manifest" in problem


def test_damaged_store_in_a_new_process(good_store, tmp_path) -> None:
    """The same as a user sees it: ``stats`` and ``export`` printed tracebacks here."""
    store = _damaged(tmp_path, good_store, "truncated")
    for args in (["stats", store], ["export", store, "-o", tmp_path / "x.json"]):
        proc = cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr


def test_info_check(good_store, tmp_path, capsys) -> None:
    """``info --check``: "ok" and exit 0 on a sound store; each problem, and exit 2, on a
    damaged one (needs ``xpuprof.trace.store.verify``)."""
    code, out, err = _main(capsys, "info", good_store, "--check")
    assert code == 0, err
    assert "check: ok, 5 files verified against the manifest" in " ".join(out.split())
    doc = json.loads(_main(capsys, "info", good_store, "--check", "--json")[1])
    assert doc["check"] == {"problems": []}
    for how in ("deleted", "truncated"):
        store = _damaged(tmp_path, good_store, how)
        name = Path(_listed(store, "events")).name
        code, out, err = _main(capsys, "info", store, "--check")
        assert code == 2 and not err, err
        assert out.startswith("check: 1 problem in") and "\n1. " in out, out
        code, out, _ = _main(capsys, "info", store, "--check", "--json")
        assert code == 2
        (problem,) = json.loads(out)["check"]["problems"]
        assert name in problem


def test_values_a_column_cannot_hold_reach_the_user_as_notes_not_exceptions(tmp_path) -> None:
    """A float beyond float64 in args (valid JSON the importer keeps) and a negative dur (an
    event the profiler never saw end): the import says what it changed, Trace.args hands the
    number back as its text, and the tools that read args run."""
    import json

    import xpuprof
    from xpuprof.ui import tools

    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 100)
    tb.op("aten::mm", 10, 20, **{"Input type": ["HUGE", "float"]})
    tb.op("aten::relu", 40, -5)
    src = tmp_path / "t.json"
    src.write_text(json.dumps(tb.doc()).replace('"HUGE"', "1e400"))
    report = xpuprof.import_traces([src], tmp_path / "s")
    notes = tools.import_result(report).notes
    assert any("negative dur" in n and "event 2 of traceEvents" in n for n in notes), notes
    with xpuprof.load(tmp_path / "s") as t:
        mm = t.sql("select id from events where name = 'aten::mm'")["id"].tolist()
        assert t.args(mm) == {mm[0]: {"Input type": ["1e400", "float"]}}
        relu = t.sql("select dur from events where name = 'aten::relu'")
        assert relu.dur.isna().all()
        for name in ("roofline", "stats", "overview"):
            tools.run(name, t)  # must not raise

"""The command line: every command answers, ``--json`` prints one JSON document whose numbers
agree with the raw JSON, errors exit with code 2 and one line, ``--limit`` limits, ``--steps``
and ``--rank`` parse the same way everywhere, imports over 16 MB show a progress bar, and
``info`` answers without importing pandas.

Most commands run in-process (Typer's runner: the same command objects, a fraction of the
time); the exit-code and start-up checks run ``xpuprof`` as a user would, in a new process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
from builders import TraceBuilder
from conftest import EXAMPLE, cli, cli_many, read_trace_json
from typer.testing import CliRunner

from xpuprof.ui import cli as cli_module
from xpuprof.ui import render, tools

runner = CliRunner()


def invoke(*args: object) -> object:
    return runner.invoke(cli_module.app, [str(a) for a in args])


@pytest.fixture(scope="module")
def store(example_store):
    return example_store[0].path


@pytest.fixture(scope="module")
def raw():
    return read_trace_json(EXAMPLE)["traceEvents"]


def _args(tool: tools.Tool, store) -> list[object]:
    return [tool.name, *[store] * tool.inputs]


@pytest.mark.parametrize("name", [t.name for t in tools.TOOLS])
def test_every_tool_command_prints_tables_or_one_json_document(name, store) -> None:
    tool = tools.get(name)
    shown = invoke(*_args(tool, store), "--limit", "3") if tool.inputs else invoke(name)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.strip() and "Traceback" not in shown.output
    doc = invoke(*_args(tool, store), "--json")
    assert doc.exit_code == 0, doc.output
    parsed = json.loads(doc.stdout)  # exactly one document: json.loads rejects trailing text
    assert isinstance(parsed, dict)


def test_overview_json_against_the_raw_steps(store, raw) -> None:
    doc = json.loads(invoke("overview", store, "--json").stdout)
    durations = [e["dur"] for e in raw if e.get("name", "").startswith("ProfilerStep#")]
    (summ,) = doc["tables"]["summary"]
    assert summ["steps"] == len(durations) == doc["facts"]["steps"]
    assert summ["step_ms_mean"] == pytest.approx(sum(durations) / len(durations) / 1e3)
    assert doc["tables"]["recommendations"][0]["rule"] == "python-overhead"
    # --steps takes numbers here as in every tool: the last step alone
    last = max(int(e["name"].split("#")[1]) for e in raw if e.get("name", "").startswith(
        "ProfilerStep#"))  # fmt: skip
    one = json.loads(invoke("overview", store, "--steps", str(last), "--json").stdout)
    want = [e["dur"] for e in raw if e.get("name") == f"ProfilerStep#{last}"]
    assert one["tables"]["summary"][0]["step_ms_mean"] == pytest.approx(want[0] / 1e3)


def test_info_json_and_its_tables(store, raw) -> None:
    doc = json.loads(invoke("info", store, "--json").stdout)
    assert doc["events_read"] == len(raw)
    assert doc["sources"][0]["read"]["phase"] == dict(Counter(e["ph"] for e in raw))
    shown = invoke("info", store)
    for title in ("rows per table", "events per level", EXAMPLE.name[:20]):
        assert title in shown.stdout


def test_limit_limits_rows(store, raw) -> None:
    ops = len({e["name"] for e in raw if e.get("cat") == "cpu_op"})
    out = invoke("stats", store, "--ops", "--limit", "2").stdout
    assert f"({ops:,} rows, first 2 shown" in out
    out = invoke("sql", store, "select name from events where level = 'op'", "--limit", "4")
    n_ops = sum(1 for e in raw if e.get("cat") == "cpu_op")
    assert f"({n_ops:,} rows, first 4 shown" in out.stdout
    doc = json.loads(invoke("stats", store, "--ops", "--limit", "2", "--json").stdout)
    assert len(doc["tables"]["ops"]) == ops  # --json has every row


def test_steps_and_ranks_parse_the_same_everywhere(tmp_path) -> None:
    """Two steps, one kernel launched in each (µs): A [10, 30), B [150, 170). All steps: span
    160, idle 120; drop-last: A alone, span 20."""
    tb = TraceBuilder(rank=3)
    tb.step(1, 0, 100)
    tb.step(2, 100, 100)
    tb.launch("gemm_a", 10, 20, launch_ts=5)
    tb.launch("gemm_b", 150, 20, launch_ts=120)
    path = tb.store(tmp_path)
    spans = {}
    for steps in (None, "all", "drop-last", "drop_last", "2", "1-2"):
        args = ["breakdown", path, "--json", *(["--steps", steps] if steps else [])]
        doc = json.loads(invoke(*args).stdout)
        spans[steps] = doc["tables"]["temporal"][0]["span_ns"]
    assert spans == {None: 160_000, "all": 160_000, "drop-last": 20_000, "drop_last": 20_000,
                     "2": 20_000, "1-2": 160_000}  # fmt: skip
    hta = json.loads(invoke("breakdown", path, "--hta-compatible", "--json").stdout)
    assert hta["facts"]["steps"] == "drop-last"
    for tool in ("breakdown", "idle", "overview", "critical-path"):
        none = invoke(tool, path, "--rank", "0,1", "--json")  # selects nothing: one line, exit 2
        assert none.exit_code == 2 and none.stdout == "", tool
        assert none.stderr == "error: no events on ranks 0, 1; ranks in this store: 3\n", tool
        some = json.loads(invoke(tool, path, "--rank", "2-3", "--json").stdout)
        assert any(len(t) for t in some["tables"].values()), tool
        assert some["notes"][0] == "no events on rank 2; ranks in this store: 3", tool


def test_errors_exit_2_with_one_line(tmp_path, store) -> None:
    bad = (["overview", tmp_path / "missing"], ["breakdown", store, "--steps", "last"],
           ["idle", store, "--rank", "a"], ["diff", store, tmp_path / "missing"])  # fmt: skip
    for args in bad:
        res = invoke(*args)
        assert res.exit_code == 2, args
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    proc = cli("critical-path", tmp_path / "missing", "--json")  # a real process, via main()
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1


def test_every_tools_help_prints_its_options_whole() -> None:
    """Each tool's --help renders (Rich reads ``[…]`` as markup: a help text with ``[/X]``
    fails, one with ``[@X]`` loses it) and shows every option's help text, words intact."""
    for tool in tools.TOOLS:
        proc = invoke(tool.name, "--help")
        assert proc.exit_code == 0, (tool.name, proc.output)
        shown = " ".join(proc.stdout.replace("│", " ").split())
        for o in tool.served():
            words = " ".join(o.help.split())
            assert words[:60] in shown, (tool.name, o.name)
    shown = " ".join(invoke("whatif", "--help").stdout.replace("│", " ").split())
    assert "no-sync[:REGEX] (and @REGION)" in shown and "(and @UNTIL)" in shown


def test_the_command_list_shows_each_summary_as_one_sentence() -> None:
    """``xpuprof --help`` lists each command with the first paragraph of its help, which
    Rich prints with the docstring's own line breaks: every command registered with its
    help on one line reads as whole sentences at any width."""
    from xpuprof.ui.cli import app

    for info in app.registered_commands:
        name = info.name or info.callback.__name__
        assert info.help, name  # None: Typer would use the raw docstring
        assert "\n" not in info.help.split("\n\n")[0], name
    listed = " ".join(invoke("--help").stdout.replace("│", " ").split())
    assert "chrome://tracing), or its replay graph as Chakra execution traces" in listed


def test_formats_are_listed_from_the_reader_registry() -> None:
    names = [n for n, _, _ in tools.input_formats()]
    assert {"kineto", "xplane"} <= set(names)
    helped = invoke("import", "--help").stdout
    for n in names:
        assert f"{n}:" in helped
    doc = json.loads(invoke("formats", "--json").stdout)
    assert [r["format"] for r in doc["tables"]["formats"]] == names


def test_import_shows_progress_over_the_threshold(tmp_path, monkeypatch, raw) -> None:
    calls = []
    bar = render.progress_bar

    def spy(total, err):
        calls.append(total)
        return bar(total, err)

    monkeypatch.setattr(render, "progress_bar", spy)
    res = invoke("import", EXAMPLE, "-o", tmp_path / "small.store")
    assert res.exit_code == 0 and calls == []  # 174 kB: no bar
    monkeypatch.setattr(cli_module, "PROGRESS_MIN_BYTES", 1)
    res = invoke("import", EXAMPLE, "-o", tmp_path / "big.store")
    assert res.exit_code == 0, res.output
    assert calls == [EXAMPLE.stat().st_size]
    assert f"{len(raw):,} events read from 1 file(s)" in " ".join(res.stdout.split())


def test_info_starts_without_pandas(store) -> None:
    code = (
        "import sys\nfrom xpuprof.ui.cli import app\n"
        f"app(['info', {str(store)!r}], standalone_mode=False)\n"
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert out.strip().endswith("False")


def test_demo_records_the_steps_it_is_asked_for(tmp_path) -> None:
    pytest.importorskip("torch", reason="torch is an optional extra")
    res = invoke("demo", "-o", tmp_path / "demo.store", "--steps", "2", "--level", "layer",
                 "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["levels"]["step"] == 2 and doc["levels"]["layer"] > 0
    shown = invoke("summary", tmp_path / "demo.store")
    assert "slowest layers" in shown.stdout and "overview" in shown.stdout


# ------------------------------------------------------------------ never a traceback

#: A real ``xpuprof`` process whose ``hardware`` tool runs BODY (a stand-in for a bug, or for
#: what the machine does to a command: Ctrl-C, a full disk).
_FAULTY = """
import os, signal, sys, time
import xpuprof.ui.tools as tools
from xpuprof.ui.cli import main

def hardware():
    {body}

tools.hardware = hardware
main()  # as the xpuprof script does: the arguments from sys.argv
"""


def _faulty(
    body: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _FAULTY.format(body=body), *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_an_unexpected_error_is_one_line_and_a_hint() -> None:
    proc = _faulty("return {}['no such key']", "hardware")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        "error: unexpected KeyError: 'no such key'\n"
        "  rerun with --debug for the traceback (and please report it)\n"
    )
    proc = _faulty("raise ValueError('first line\\n   second line')", "hardware", "--json")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[0] == "error: unexpected ValueError: first line second line"


@pytest.mark.parametrize("how", ["after", "before", "env"])
def test_debug_shows_the_traceback(how) -> None:
    args = {"after": ["hardware", "--debug"], "before": ["--debug", "hardware"],
            "env": ["hardware"]}[how]  # fmt: skip
    env = {"XPUPROF_DEBUG": "1"} if how == "env" else {}
    proc = _faulty("return {}['no such key']", *args, env=env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("Traceback (most recent call last):")
    assert "in hardware" in proc.stderr  # the frame where it happened
    assert proc.stderr.endswith("error: unexpected KeyError: 'no such key'\n")


def test_a_users_error_stays_one_line_and_debug_adds_its_traceback(tmp_path) -> None:
    proc = cli("overview", tmp_path / "missing")
    assert (
        proc.returncode == 2
        and proc.stderr == f"error: {tmp_path / 'missing'}: no such file or directory\n"
    )
    proc = cli("overview", tmp_path / "missing", "--debug")
    assert proc.returncode == 2
    assert proc.stderr.startswith("Traceback") and "XpuprofError" in proc.stderr
    assert proc.stderr.endswith(f"error: {tmp_path / 'missing'}: no such file or directory\n")


def test_what_the_machine_refuses_is_one_line_exit_2(tmp_path) -> None:
    """A full disk or a folder one may not write: the system's words and the file."""
    target = tmp_path / "no-such-dir" / "out.json"
    proc = _faulty(f"open({str(target)!r}, 'w')", "hardware")
    assert proc.returncode == 2
    assert proc.stderr == f"error: {target}: No such file or directory\n"


def test_ctrl_c_is_one_line_exit_130() -> None:
    """A real SIGINT, delivered while the command runs."""
    # the default handler, as in a terminal: a process started in the background by a
    # non-interactive shell inherits SIGINT ignored, and Python then installs none
    proc = _faulty(
        "signal.signal(signal.SIGINT, signal.default_int_handler); "
        "os.kill(os.getpid(), signal.SIGINT); time.sleep(30)",
        "hardware",
    )
    assert proc.returncode == 130
    assert proc.stderr == "interrupted\n" and proc.stdout == ""


@pytest.mark.parametrize("as_json", [False, True])
def test_a_closed_pipe_ends_quietly(store, as_json) -> None:
    """``xpuprof sql … | head -1`` where head has already gone: nothing on stderr, the exit
    code of a command whose output was cut short."""
    args = ["sql", str(store), "select name from events", *(["--json"] if as_json else [])]
    proc = subprocess.Popen([sys.executable, "-m", "xpuprof.ui.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1
    assert err == b""


def test_capture_takes_only_real_durations(tmp_path) -> None:
    """``--duration nan`` gave a traceback; nothing is captured or created for a bad one."""
    bad = ["nan", "inf", "-1", "abc", "0", "1e3", ""]
    procs = cli_many([["capture", "http://127.0.0.1:9", "-o", tmp_path / f"c{i}.store",
                       "--token", "t", "--duration", d] for i, d in enumerate(bad)])  # fmt: skip
    for d, proc in zip(bad, procs, strict=True):
        assert proc.returncode == 2, (d, proc.stderr)
        assert proc.stderr.startswith("error: --duration ") and proc.stderr.count("\n") == 1, (
            d, proc.stderr)  # fmt: skip
        assert repr(d) in proc.stderr
    assert not list(tmp_path.iterdir())
    for text, seconds in (("2s", 2.0), ("500ms", 0.5), ("1.5", 1.5), ("1m", 60.0),
                          (" 2 S", 2.0), (".25s", 0.25)):  # fmt: skip
        assert cli_module._seconds(text) == seconds


def test_sql_says_it_has_the_users_full_access() -> None:
    shown = " ".join(invoke("sql", "--help").stdout.split())
    assert "full access to this machine" in shown and "read and write any file" in shown
    assert "a restricted Trace instead, whose DuckDB reads nothing but the store's own" in shown


# ------------------------------------------------------------------ one selection, checked

#: Every command that takes --rank and --steps.
SELECTING = [t.name for t in tools.TOOLS if t.common]


@pytest.mark.parametrize("name", SELECTING)
def test_a_selection_of_nothing_that_exists_is_one_line_exit_2(name, store, raw) -> None:
    """The example holds rank 0 only (no distributedInfo: a single-rank trace) and
    ProfilerStep#2-4, read from the raw JSON: --rank 5 and --steps 9 select nothing and say
    what exists; --steps 4,9 selects step 4 and names step 9 as missing."""
    steps = sorted(int(e["name"].split("#")[1]) for e in raw
                   if e.get("name", "").startswith("ProfilerStep#"))  # fmt: skip
    assert steps == [2, 3, 4]
    tool = tools.get(name)
    inputs = [store] * tool.inputs
    label = "baseline: " if tool.inputs == 2 else ""
    for args, said in (
        (["--rank", "5"], "no events on rank 5; ranks in this store: 0"),
        (["--steps", "9"], "no events in step 9; steps in this store: 2-4"),
    ):
        res = invoke(name, *inputs, *args)
        assert res.exit_code == 2 and res.stdout == "", (name, args, res.stdout)
        assert res.stderr == f"error: {label}{said}\n", (name, args)
    part = invoke(name, *inputs, "--steps", "4,9", "--json")
    assert part.exit_code == 0, part.stderr
    assert (
        f"{label}no events in step 9; steps in this store: 2-4" in json.loads(part.stdout)["notes"]
    )


def test_wide_is_a_global_flag_anywhere_on_the_line(store) -> None:
    """--wide before or after the command: every column, whatever the terminal's width."""
    narrow = cli("stats", store, "--ops", env={"COLUMNS": "80"}).stdout
    wide = [
        cli(*args, env={"COLUMNS": "80"}).stdout
        for args in (["--wide", "stats", store, "--ops"], ["stats", store, "--ops", "--wide"])
    ]
    assert wide[0] == wide[1]
    assert max(map(len, narrow.splitlines())) <= 80 < max(map(len, wide[0].splitlines()))
    assert "columns left out to fit this terminal" in narrow and "left out" not in wide[0]


def test_the_demo_writes_to_the_cache_folder_and_says_where(tmp_path) -> None:
    """No --out: the store goes to $XDG_CACHE_HOME/xpuprof/demo.store, replaced by the next
    demo run; a store the demo did not write is never replaced."""
    pytest.importorskip("torch", reason="torch is an optional extra")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "80"}
    where = tmp_path / "cache" / "xpuprof" / "demo.store"
    for _ in range(2):  # the second run replaces the first one's store
        proc = cli("demo", "--steps", "1", "--level", "step", env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert f"The store is {where}" in " ".join(proc.stdout.split())
        assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # nothing in the cwd
    import xpuprof

    with xpuprof.load(where) as trace:
        assert trace.manifest["levels"]["step"] == 1
    other = TraceBuilder(rank=0).store(tmp_path / "mine")
    proc = cli("demo", "--out", other, "--steps", "1", env=env)
    assert proc.returncode == 2 and "not a store xpuprof demo wrote" in proc.stderr
    assert (other / "manifest.json").is_file()

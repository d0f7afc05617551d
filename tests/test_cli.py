"""The command line: every command answers, ``--json`` prints one JSON document whose numbers
agree with the raw JSON, errors exit with code 2 and one line, ``--limit`` limits, ``--steps``
and ``--rank`` parse the same way everywhere, imports over 16 MB show a progress bar, and
``info`` answers without importing pandas.

Most commands run in-process (Typer's runner: the same command objects, a fraction of the
time); the exit-code and start-up checks run ``xpuprof`` as a user would, in a new process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from builders import TraceBuilder
from conftest import EXAMPLE, cli, read_trace_json
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
        none = json.loads(invoke(tool, path, "--rank", "0,1", "--json").stdout)
        assert not any(len(t) for t in none["tables"].values()), tool
        some = json.loads(invoke(tool, path, "--rank", "2-3", "--json").stdout)
        assert any(len(t) for t in some["tables"].values()), tool


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

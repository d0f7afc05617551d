"""Bad input: one clear line naming the file and the place, exit code 2, nothing half-written;
``--lenient`` keeps what parses and says exactly what it dropped.

Every damaged file is made here from the real trace shipped in the package, so the place of the
damage (byte offset, event index) is known independently of xpuprof.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import EXAMPLE, cli, cli_many, read_text

import xpuprof

_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


@pytest.fixture(scope="module")
def text() -> bytes:
    """The decompressed JSON of the shipped example trace."""
    return read_text(EXAMPLE)


def complete_events(prefix: bytes) -> tuple[int, int]:
    """(number of whole events, offset where the next one starts) in a cut-off trace text,
    found with the standard library's JSON decoder, one event at a time."""
    s = prefix.decode("latin-1")  # one char per byte: str offsets are byte offsets
    m = re.search(r'"traceEvents"\s*:\s*\[', s)
    assert m is not None
    dec = json.JSONDecoder()
    pos, n = m.end(), 0
    while True:
        while pos < len(s) and s[pos] in " \t\r\n":
            pos += 1
        try:
            _, end = dec.raw_decode(s, pos)
        except json.JSONDecodeError:
            return n, pos
        n += 1
        pos = end
        while pos < len(s) and s[pos] in " \t\r\n":
            pos += 1
        if pos >= len(s) or s[pos] != ",":
            return n, pos
        pos += 1


def event_start_near(text: bytes, offset: int) -> int:
    """Offset of the ``{`` of the first event starting after ``offset``."""
    m = _BOUNDARY.search(text, offset)
    assert m is not None
    return m.end() - 1


@dataclass
class Bad:
    name: str
    content: bytes
    where: str  # the exact "(at …)" text the error line must hold
    says: str  # a word the message must use


def _truncated_json(text: bytes) -> Bad:
    cut = event_start_near(text, len(text) // 2) + 37  # inside an event
    return Bad("cut.json", text[:cut], f"(at byte {cut})", "truncated")


def _truncated_json_gz(text: bytes) -> Bad:
    cut = event_start_near(text, len(text) // 3) + 11
    return Bad(
        "cut.json.gz",
        gzip.compress(text[:cut]),
        f"(at byte {cut} of the decompressed JSON)",
        "truncated",
    )


def _truncated_gzip(text: bytes) -> Bad:
    whole = gzip.compress(text)
    cut = len(whole) // 2
    return Bad("cut_gzip.json.gz", whole[:cut], f"(at byte {cut})", "gzip")


def _garbage_between_events(text: bytes) -> Bad:
    p = event_start_near(text, len(text) // 2) - 1  # the "," before an event...
    p = text.rindex(b"}", 0, p) + 1  # ...right after the "}" that ends the previous one
    content = text[:p] + b" @@garbage@@" + text[p:]
    return Bad("garbage.json", content, f"(at byte {p + 1})", "malformed")


def _garbage_between_events_gz(text: bytes) -> Bad:
    bad = _garbage_between_events(text)
    where = bad.where.replace(")", " of the decompressed JSON)")
    return Bad("garbage.json.gz", gzip.compress(bad.content), where, "malformed")


def _garbage_inside_event(text: bytes) -> Bad:
    start = event_start_near(text, len(text) // 4)
    m = re.compile(rb'"name":\s*').search(text, start)
    assert m is not None
    p = m.end()
    content = text[:p] + b"oops, " + text[p:]
    return Bad("garbage_value.json", content, f"(at byte {p})", "malformed")


def _event_without_ts(text: bytes) -> Bad:
    doc = json.loads(text)
    evs = doc["traceEvents"]
    k = next(i for i in range(len(evs) // 2, len(evs)) if evs[i].get("ph") == "X")
    del evs[k]["ts"]
    return Bad("no_ts.json", json.dumps(doc).encode(), f"(at event {k} of traceEvents)", "ts")


def _const(name: str, content: bytes, where: str, says: str) -> Callable[[bytes], Bad]:
    return lambda _text: Bad(name, content, where, says)


#: The bad inputs the issue names, each imported through the CLI.
CLI_CASES: dict[str, Callable[[bytes], Bad]] = {
    "truncated_json": _truncated_json,
    "truncated_gzip_stream": _truncated_gzip,
    "top_level_number": _const("number.json", b"42", "(at byte 0)", "not a trace"),
    "top_level_string": _const("string.json", b'"x"', "(at byte 0)", "not a trace"),
    "object_without_traceEvents": _const("foo.json", b'{"foo": 1}', "(at byte 9)", "traceEvents"),
    "traceEvents_not_a_list": _const(
        "te.json", b'{"traceEvents": {}}', "(at byte 16)", "traceEvents"
    ),
    "event_without_ts": _event_without_ts,
    "garbage_between_events": _garbage_between_events,
}


def _ts_text(_text: bytes) -> Bad:
    evs = [{"ph": "X", "name": f"e{i}", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(5)]
    evs[3]["ts"] = "abc"
    return Bad("ts_text.json", json.dumps({"traceEvents": evs}).encode(), "(at event 3 of", "ts")


#: More damage, checked through the API (same error text, no interpreter start per case).
API_CASES = [
    pytest.param(_truncated_json_gz, id="truncated_json_in_gzip"),
    pytest.param(_garbage_between_events_gz, id="garbage_between_events_in_gzip"),
    pytest.param(_garbage_inside_event, id="garbage_inside_an_event"),
    pytest.param(
        _const("null.json", b"  null", "(at byte 2)", "not a trace"),
        id="top_level_null_after_spaces",
    ),
    pytest.param(
        _const("ints.json", b"[1, 2]", "(at event 0 of traceEvents)", "event"),
        id="list_of_non_events",
    ),
    pytest.param(
        _const(
            "te_int.json", b'{"traceEvents": [{"ph": "i", "ts": 1}, 7]}', "(at event 1 of", "event"
        ),
        id="entry_not_an_object",
    ),  # fmt: skip
    pytest.param(_const("empty.json", b"", "", "empty"), id="empty_file"),
    pytest.param(_ts_text, id="ts_not_a_number"),
]


@dataclass
class Run:
    """One CLI import of a damaged input, run in the module's batch."""

    path: Path  # the damaged file
    out: Path  # the folder the store was to be written in: must stay empty on failure
    bad: Bad
    proc: subprocess.CompletedProcess | None = None

    @property
    def store(self) -> Path:
        return self.out / "x.store"


def assert_clean_failure(run: Run, where: str, says: str) -> None:
    """Exit code 2, nothing on stdout, one line on stderr naming the file and the place, and
    nothing left in the output folder (no store, no hidden temporary sibling)."""
    proc = run.proc
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("error: ")
    assert str(run.path) in line
    assert where in line, line
    assert says.lower() in line.lower(), line
    assert list(run.out.iterdir()) == []


#: CLI runs beyond CLI_CASES: name → (how the bad file is made, CLI options, with a good file)
EXTRA_RUNS: dict[str, tuple[Callable[[bytes], Bad], tuple[str, ...], bool]] = {
    "bad_among_good": (_truncated_json, (), True),
    "bad_among_good_on_dask": (_truncated_json, ("--workers", "2"), True),
    "brackets_in_file_name": (
        _const("trace[rank0].json", b"42", "(at byte 0)", "not a trace"),
        (),
        False,
    ),
    "lenient_truncated_json": (_truncated_json, ("--lenient", "--json"), False),
}


@pytest.fixture(scope="module")
def runs(text: bytes, tmp_path_factory) -> dict[str, Run]:
    """Every CLI import of this module, made and run at once (each is a fresh interpreter)."""
    base = tmp_path_factory.mktemp("bad")
    plan = {name: (make, (), False) for name, make in CLI_CASES.items()} | EXTRA_RUNS
    out: dict[str, Run] = {}
    commands = []
    for name, (make, options, with_good) in plan.items():
        src, dest = base / name / "in", base / name / "out"
        src.mkdir(parents=True)
        dest.mkdir()
        bad = make(text)
        path = src / bad.name
        path.write_bytes(bad.content)
        inputs = [path]
        if with_good:
            good = src / "good.json.gz"
            shutil.copyfile(EXAMPLE, good)
            inputs = [good, path]
        out[name] = run = Run(path, dest, bad)
        commands.append(["import", *inputs, "-o", run.store, *options])
    for run, proc in zip(out.values(), cli_many(commands), strict=True):
        run.proc = proc
    return out


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_bad_input_fails_cleanly(case: str, runs) -> None:
    run = runs[case]
    assert_clean_failure(run, run.bad.where, run.bad.says)


@pytest.mark.parametrize("make", API_CASES)
def test_bad_input_error_names_file_and_place(make, text: bytes, tmp_path) -> None:
    bad = make(text)
    path = tmp_path / "in" / bad.name
    path.parent.mkdir()
    path.write_bytes(bad.content)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(xpuprof.TraceFormatError) as e:
        xpuprof.import_traces([path], out / "x.store")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ")
    assert bad.where in msg and bad.says.lower() in msg.lower(), msg
    assert list(out.iterdir()) == []


def test_missing_file_fails_cleanly(tmp_path) -> None:
    missing = tmp_path / "missing.json"
    out = tmp_path / "out"
    out.mkdir()
    run = Run(missing, out, Bad(missing.name, b"", "", "no such file"))
    run.proc = cli("import", missing, "-o", run.store)
    assert_clean_failure(run, "", "no such file")


def test_one_bad_file_among_good_ones_writes_nothing(runs) -> None:
    run = runs["bad_among_good"]
    assert_clean_failure(run, run.bad.where, run.bad.says)


def test_bad_file_on_dask_workers_fails_cleanly(runs) -> None:
    run = runs["bad_among_good_on_dask"]
    assert_clean_failure(run, run.bad.where, run.bad.says)


def test_error_names_a_file_with_brackets_exactly(runs) -> None:
    run = runs["brackets_in_file_name"]
    assert_clean_failure(run, run.bad.where, run.bad.says)


# ----------------------------------------------------------------------------------------------
# --lenient
# ----------------------------------------------------------------------------------------------


def lenient_report(run: Run) -> dict:
    """The source entry of the ``--json`` report of a lenient CLI import."""
    assert run.proc.returncode == 0, run.proc.stderr
    doc = json.loads(run.proc.stdout)
    assert len(doc["sources"]) == 1
    return doc["sources"][0]


def lenient_in_process(make: Callable[[bytes], Bad], text: bytes, tmp_path: Path) -> Run:
    """A lenient import through the API: ``ImportReport.to_dict()`` is the document that
    ``xpuprof import --lenient --json`` prints (the CLI path is covered by the truncated case)."""
    bad = make(text)
    path = tmp_path / bad.name
    path.write_bytes(bad.content)
    run = Run(path, tmp_path / "out", bad)
    report = xpuprof.import_traces([path], run.store, lenient=True)
    run.proc = subprocess.CompletedProcess([], 0, json.dumps(report.to_dict()), "")
    return run


def stored_indexes(store: Path) -> list[int]:
    """Every source entry the store accounts for (B rows also stand for their E entry)."""
    with xpuprof.load(store) as t:
        idx = t.sql(
            "select index from events union all select index from flows "
            "union all select distinct index from counters union all select index from metadata"
        )["index"].tolist()
        ends = t.sql("select extra from events where extra is not null")["extra"]
        idx += [json.loads(x)["end"]["index"] for x in ends if "end" in json.loads(x)]
    return sorted(idx)


def test_lenient_keeps_the_events_before_a_cut(runs) -> None:
    run = runs["lenient_truncated_json"]
    kept, partial_at = complete_events(run.bad.content)
    assert kept > 1000
    src = lenient_report(run)
    assert stored_indexes(run.store) == list(range(kept))
    assert src["truncated"] is True
    assert src["events_read"] == kept + 1
    (dropped,) = src["dropped"]
    assert dropped["events"] == 1
    assert dropped["event_index"] == kept
    assert dropped["offset"] == partial_at
    assert "truncated" in dropped["reason"]


def test_lenient_drops_and_counts_an_event_without_ts(text: bytes, tmp_path) -> None:
    run = lenient_in_process(_event_without_ts, text, tmp_path)
    evs = json.loads(run.bad.content)["traceEvents"]
    (k,) = [i for i, e in enumerate(evs) if e.get("ph") != "M" and "ts" not in e]
    src = lenient_report(run)
    assert stored_indexes(run.store) == [i for i in range(len(evs)) if i != k]
    assert src["events_read"] == len(evs)
    assert src["truncated"] is False
    assert [(d["events"], d["event_index"], d["reason"]) for d in src["dropped"]] == [
        (1, k, "event has no ts")
    ]


def test_lenient_keeps_what_a_truncated_gzip_holds(text: bytes, tmp_path) -> None:
    bad = _truncated_gzip(text)
    readable = zlib.decompressobj(wbits=31).decompress(bad.content)
    kept, _ = complete_events(readable)
    assert kept > 1000
    run = lenient_in_process(lambda _t: bad, text, tmp_path)
    src = lenient_report(run)
    assert stored_indexes(run.store) == list(range(kept))
    assert src["truncated"] is True


def test_lenient_keeps_every_event_around_garbage(text: bytes, tmp_path) -> None:
    run = lenient_in_process(_garbage_between_events, text, tmp_path)
    n = len(json.loads(text)["traceEvents"])
    at = int(re.search(r"byte (\d+)", run.bad.where).group(1))
    src = lenient_report(run)
    assert stored_indexes(run.store) == list(range(n))
    assert [d["offset"] for d in src["dropped"]] == [at]


def test_lenient_drops_an_event_whose_ts_is_not_a_number(text: bytes, tmp_path) -> None:
    run = lenient_in_process(_ts_text, text, tmp_path)
    src = lenient_report(run)
    assert stored_indexes(run.store) == [0, 1, 2, 4]
    assert [(d["events"], d["event_index"]) for d in src["dropped"]] == [(1, 3)]


# ----------------------------------------------------------------------------------------------
# a failed re-import leaves the old store as it was
# ----------------------------------------------------------------------------------------------


def snapshot(store: Path) -> dict[str, tuple[int, int, bytes | None]]:
    out = {}
    for p in sorted(store.rglob("*")):
        if p.is_file():
            st = p.stat()
            body = p.read_bytes() if p.name == "manifest.json" else None
            out[p.relative_to(store).as_posix()] = (st.st_mtime_ns, st.st_size, body)
    return out


def counts(store: Path) -> dict[str, int]:
    with xpuprof.load(store) as t:
        return {
            name: int(t.sql(f"select count(*) as n from {name}")["n"][0])
            for name in ("events", "flows", "links", "counters", "metadata")
        }


def test_failed_reimport_leaves_old_store_intact(text: bytes, tmp_path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    good = src / "good.json.gz"
    shutil.copyfile(EXAMPLE, good)
    store = tmp_path / "x.store"
    xpuprof.import_traces([good], store)
    before, rows = snapshot(store), counts(store)
    n = len(json.loads(text)["traceEvents"])
    assert rows["events"] + rows["flows"] + rows["metadata"] == n  # the example has no C

    def unchanged() -> None:
        assert snapshot(store) == before
        assert counts(store) == rows
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    # a new, bad file next to the good one
    bad = _garbage_between_events(text)
    bad_path = src / bad.name
    bad_path.write_bytes(bad.content)
    with pytest.raises(xpuprof.TraceFormatError, match=re.escape(str(bad_path))):
        xpuprof.import_traces([good, bad_path], store)
    unchanged()
    # the good file itself replaced by a damaged version of it
    good.write_bytes(gzip.compress(_truncated_json(text).content))
    with pytest.raises(xpuprof.TraceFormatError, match=re.escape(str(good))):
        xpuprof.import_traces([good], store)
    unchanged()

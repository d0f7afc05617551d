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
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from builders import TraceBuilder
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


# ----------------------------------------------------------------------------------------------
# issue 8: an importer that cannot hang or crash, and a lenient mode that says exactly what it
# dropped. Each case was found by the probing campaign; the expected places are worked out from
# the bytes written here, never from xpuprof.
# ----------------------------------------------------------------------------------------------

DEEP = 1200  # brackets: past msgspec's recursion limit (about 1000)


def events_text(n: int, **top) -> bytes:
    """A trace of ``n`` framework ops named ``op0``…, as JSON bytes (TraceBuilder's spelling)."""
    tb = TraceBuilder(rank=None, **top)
    for i in range(n):
        tb.op(f"op{i}", ts=10 * i, dur=5)
    return json.dumps(tb.doc()).encode()


def deepest(content: bytes) -> int:
    """Offset of the innermost ``[`` of the deep nest the cases below write."""
    return content.index(b"[" * DEEP) + DEEP - 1


def _deep_in_args(_text: bytes) -> Bad:
    t = events_text(3).replace(b'"name": "op1"', b'"name": "op1", "args": {"x": ' + b"[" * DEEP
                               + b"]" * DEEP + b"}")  # fmt: skip
    return Bad("deep_args.json", t, f"(at byte {deepest(t)})", "nested")


def _deep_in_name(_text: bytes) -> Bad:
    t = events_text(3).replace(b'"name": "op2"', b'"name": ' + b"[" * DEEP + b"]" * DEEP)
    return Bad("deep_name.json", t, f"(at byte {deepest(t)})", "nested")


def _deep_top_key(_text: bytes) -> Bad:
    t = events_text(2)[:-1] + b', "late": ' + b"[" * DEEP + b"]" * DEEP + b"}"
    return Bad("deep_top.json", t, f"(at byte {deepest(t)})", "nested")


def _utf8_top_key(_text: bytes) -> Bad:
    t = b'{"hostname": "h\xff\xfe", ' + events_text(2)[1:]
    at = t.index(b"\xff")
    return Bad("utf8_top.json", t, f"(at byte {at})", "UTF-8")


def _utf8_in_event(_text: bytes) -> Bad:
    t = events_text(4).replace(b'"op2"', b'"op\xc3"')
    at = t.index(b"\xc3")
    return Bad("utf8_event.json", t, f"(at byte {at})", "UTF-8")


def _args_a_list(_text: bytes) -> Bad:
    t = events_text(4).replace(b'"name": "op1"', b'"name": "op1", "args": [1, 2]')
    at = t.index(b"[1, 2]")
    return Bad("args_list.json", t, f"(at byte {at})", "args")


def _duplicate_traceEvents(_text: bytes) -> Bad:
    t = events_text(5)[:-1] + b', "traceEvents": [' + json.dumps({"ph": "X"}).encode() + b"]}"
    second = t.rindex(b'"traceEvents": [') + len(b'"traceEvents": ')
    return Bad("dup.json", t, f"(at byte {second})", "second traceEvents")


#: Issue 8, item 7: each raised RecursionError, OverflowError or msgspec's own DecodeError
#: (a traceback, exit 1); item 9: a second traceEvents key was silently ignored.
ISSUE8_CLI = {
    "deep_args": _deep_in_args,
    "deep_name": _deep_in_name,
    "deep_top_key": _deep_top_key,
    "utf8_top_key": _utf8_top_key,
    "utf8_in_event": _utf8_in_event,
    "args_a_list": _args_a_list,
    "duplicate_traceEvents": _duplicate_traceEvents,
    "entries_are_numbers": _const(
        "ints.json", b'{"traceEvents":[1,2,3]}', "(at event 0 of traceEvents)", "not an event"
    ),
}


@pytest.fixture(scope="module")
def issue8_runs(text: bytes, tmp_path_factory) -> dict[str, Run]:
    base = tmp_path_factory.mktemp("issue8")
    out: dict[str, Run] = {}
    for name, make in ISSUE8_CLI.items():
        (base / name / "out").mkdir(parents=True)
        bad = make(text)
        path = base / name / bad.name
        path.write_bytes(bad.content)
        out[name] = Run(path, base / name / "out", bad)
    procs = cli_many([["import", r.path, "-o", r.store] for r in out.values()])
    for run, proc in zip(out.values(), procs, strict=True):
        run.proc = proc
    return out


@pytest.mark.parametrize("case", list(ISSUE8_CLI))
def test_decoding_errors_are_one_line_and_exit_2(case: str, issue8_runs) -> None:
    run = issue8_runs[case]
    assert_clean_failure(run, run.bad.where, run.bad.says)


def test_a_string_of_separators_across_the_chunk_boundary_reads_in_linear_time(tmp_path) -> None:
    """Item 6: each ``},{`` inside a string that crosses the 4 MB read chunk made the reader
    decode the whole chunk again (12 KB of them: +31 s). A 30 KB string now costs one pass:
    the read finishes within the subprocess's time limit (it took minutes before)."""
    from xpuprof.formats.kineto.decode import CHUNK_BYTES

    one = {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 0, "dur": 1}
    parts, size, n = [], len(b'{"traceEvents": ['), 0
    sep = "},{" * 10_000
    while size < CHUNK_BYTES - len(sep) // 2:  # the string will start before the boundary
        s = json.dumps(dict(one, ts=n, args={"pad": "x" * 80}))
        parts.append(s)
        size, n = size + len(s) + 2, n + 1
    parts.append(json.dumps(dict(one, ts=n, args={"s": sep})))
    parts += [json.dumps(dict(one, ts=n + 1 + i, args={"pad": "x" * 80})) for i in range(30_000)]
    path = tmp_path / "seps.json"
    path.write_text('{"traceEvents": [' + ", ".join(parts) + "]}")
    assert size < CHUNK_BYTES < size + len(sep)
    code = (
        "import sys; from xpuprof.formats.kineto import read_kineto; "
        "print(read_kineto(sys.argv[1]).tables['events'].num_rows)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == len(parts)


def test_chunk_boundaries_cost_work_linear_in_the_file(tmp_path, monkeypatch) -> None:
    """Item 6, counted rather than timed: with 4 KB chunks, a string holding 5,000 ``},{``
    across boundaries is decoded a bounded number of times, not once per separator."""
    from xpuprof.formats.kineto import decode

    monkeypatch.setattr(decode, "CHUNK_BYTES", 4096)
    decoded = []
    real = decode.Decoder.decode_events

    def counting(self, text):
        decoded.append(len(text))
        return real(self, text)

    monkeypatch.setattr(decode.Decoder, "decode_events", counting)
    tb = TraceBuilder(rank=None)
    for i in range(300):
        tb.op(f"op{i}", ts=i, dur=1)
    tb.op("long", ts=300, dur=1, s="},{" * 5000)
    for i in range(300):
        tb.op(f"op{301 + i}", ts=301 + i, dur=1)
    path = tb.write(tmp_path / "t.json")
    raw = decode.read(path)
    assert raw.tables["events"].num_rows == 601
    assert sum(decoded) <= 3 * path.stat().st_size, (len(decoded), sum(decoded))


def test_values_beyond_int64_and_float64_are_kept_as_written(tmp_path) -> None:
    """Item 7: a flow id of 2**64 and ``args.bytes`` of 1e400 raised OverflowError; they are
    valid JSON, so the events are kept: the id as its text, the args text as written, and
    the size (which no float holds) left unknown."""
    tb = TraceBuilder(rank=None)
    tb.op("op", ts=0, dur=10)
    tb.flow("ac2g", 2**64, "s", 1)
    tb.memcpy("Memcpy HtoD", ts=20, dur=5, bytes=7)
    path = tmp_path / "big.json"
    path.write_bytes(json.dumps(tb.doc()).encode().replace(b'"bytes": 7', b'"bytes": 1e400'))
    with xpuprof.load(_import(path)) as t:
        flows = t.sql("select flow_id from flows")["flow_id"].tolist()
        mem = t.sql("select bytes, args from events where category = 'gpu_memcpy'")
    assert flows == [str(2**64)]
    assert mem["bytes"].isna().all() and '"bytes": 1e400' in mem["args"][0]


def _import(path: Path, **kw) -> Path:
    store = path.with_suffix(".store")
    xpuprof.import_traces([path], store, **kw)
    return store


def lenient_read(content: bytes, tmp_path: Path, name: str = "t.json") -> tuple[dict, Path]:
    """Import ``content`` with ``--lenient`` semantics; the report's source entry and store."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / name
    path.write_bytes(content)
    store = tmp_path / "out.store"
    report = xpuprof.import_traces([path], store, lenient=True)
    (src,) = report.to_dict()["sources"]
    return src, store


def stored_names(store: Path) -> dict[int, str]:
    with xpuprof.load(store) as t:
        df = t.sql("select index, name from events")
    return dict(zip(df["index"].tolist(), df["name"].tolist(), strict=True))


def test_lenient_entries_that_are_not_events_are_each_dropped(tmp_path) -> None:
    """Item 9: ``[1,2,3]`` was reported as one truncated event. Consecutive entries dropped
    for one reason are one record (first index, count), so a flood stays one line."""
    src, store = lenient_read(b'{"traceEvents":[1,2,3,"x",{"ph":"X"}]}', tmp_path)
    assert src["events_read"] == 5
    assert [(d["events"], d["event_index"], d["offset"]) for d in src["dropped"]] == [
        (3, 0, 16), (1, 3, 22), (1, 4, None)
    ]  # fmt: skip
    assert [d["reason"] for d in src["dropped"]] == [
        "traceEvents entry is not an event (it is a number)",
        "traceEvents entry is not an event (it is a string)",
        "event has no ts",
    ]
    assert stored_names(store) == {}


def test_lenient_string_and_null_entries_keep_later_indexes(tmp_path) -> None:
    """Item 9: a string or null entry was dropped without a word and every later event's
    index was off by one."""
    evs = json.loads(events_text(5))["traceEvents"]
    doc = {"traceEvents": [evs[0], "x", evs[1], None, evs[2]]}
    src, store = lenient_read(json.dumps(doc).encode(), tmp_path)
    assert src["events_read"] == 5
    assert [(d["events"], d["event_index"]) for d in src["dropped"]] == [(1, 1), (1, 3)]
    assert stored_names(store) == {0: "op0", 2: "op1", 4: "op2"}


@pytest.mark.parametrize(
    ("make", "reason"),
    [(_utf8_in_event, "UTF-8"), (_args_a_list, "args is not a JSON object (it is an array)")],
)
def test_lenient_drops_just_the_undecodable_event(make, reason: str, tmp_path) -> None:
    """Item 7 with --lenient: invalid UTF-8 in an event, or args that is a list, raised
    DecodeError / ValidationError; now that event alone is dropped, named and placed."""
    bad = make(b"")
    src, store = lenient_read(bad.content, tmp_path)
    at = int(re.search(r"byte (\d+)", bad.where).group(1))
    k = 2 if make is _utf8_in_event else 1
    assert [(d["events"], d["event_index"], d["offset"]) for d in src["dropped"]] == [(1, k, at)]
    assert reason in src["dropped"][0]["reason"]
    assert sorted(stored_names(store)) == [i for i in range(4) if i != k]


def test_lenient_deep_nesting_drops_the_event_or_the_key(tmp_path) -> None:
    bad = _deep_in_args(b"")
    src, store = lenient_read(bad.content, tmp_path)
    assert [(d["events"], d["event_index"], d["offset"]) for d in src["dropped"]] == [
        (1, 1, deepest(bad.content))
    ]
    assert sorted(stored_names(store)) == [0, 2]
    bad = _deep_top_key(b"")
    src, store = lenient_read(bad.content, tmp_path / "top")
    assert [(d["events"], d["offset"]) for d in src["dropped"]] == [(0, deepest(bad.content))]
    assert "'late'" in src["dropped"][0]["reason"]
    assert sorted(stored_names(store)) == [0, 1]


def test_lenient_duplicate_traceEvents_is_reported_with_its_entries(tmp_path) -> None:
    """Item 9: a second traceEvents key kept 1 of 6 entries and said nothing."""
    bad = _duplicate_traceEvents(b"")
    src, store = lenient_read(bad.content, tmp_path)
    assert src["events_read"] == 6
    (d,) = src["dropped"]
    assert d["events"] == 1 and "second traceEvents" in d["reason"]
    assert sorted(stored_names(store)) == [0, 1, 2, 3, 4]


def zlib_oracle(data: bytes) -> tuple[int | None, bytes]:
    """Where zlib itself, fed one byte at a time, detects damage in a gzip file (None: it
    does not), and the text it gave before."""
    dec, out = zlib.decompressobj(wbits=31), []
    for i in range(len(data)):
        try:
            out.append(dec.decompress(data[i : i + 1]))
        except zlib.error:
            return i, b"".join(out)
    return None, b"".join(out)


def test_gzip_damage_is_placed_at_its_byte_and_lenient_keeps_what_precedes(tmp_path) -> None:
    """Item 9: a gzip file damaged at byte 7552 was reported "at byte 0", and with --lenient
    as an empty file (the whole file was one read block, lost with its damage)."""
    data = bytearray(EXAMPLE.read_bytes())
    data[7552:7556] = b"\xff" * 4
    at, before = zlib_oracle(bytes(data))
    assert at is not None and 7552 <= at < 7600
    path = tmp_path / "in" / "damaged.json.gz"
    path.parent.mkdir()
    path.write_bytes(bytes(data))
    with pytest.raises(xpuprof.TraceFormatError) as e:
        xpuprof.import_traces([path], tmp_path / "x.store")
    assert str(e.value).startswith(f"{path}: corrupt gzip data")
    assert str(e.value).endswith(f"(at byte {at})")
    kept, _ = complete_events(before)
    assert kept > 100
    src, store = lenient_read(bytes(data), tmp_path, "damaged.json.gz")
    assert stored_indexes(store) == list(range(kept))
    gz = src["dropped"][0]
    assert (gz["file_offset"], gz["offset"], gz["events"]) == (at, len(before), 0)
    assert [d["event_index"] for d in src["dropped"][1:]] == [kept]  # the cut event
    assert src["events_read"] == kept + 1


def test_gzip_cut_near_its_end_keeps_every_whole_event(tmp_path) -> None:
    """Item 9: a gzip file cut within 100 bytes of its end read as an "empty file"."""
    whole = EXAMPLE.read_bytes()
    cut = whole[:-60]
    at, before = zlib_oracle(cut)
    assert at is None
    text_all = read_text(EXAMPLE)
    n = len(json.loads(text_all)["traceEvents"])
    kept, _ = complete_events(before)
    src, store = lenient_read(cut, tmp_path, "cut.json.gz")
    assert stored_indexes(store) == list(range(kept)) and n - kept < 5
    assert src["truncated"] is True and src["dropped"][0]["file_offset"] == len(cut)


@pytest.mark.parametrize("lenient", [False, True])
def test_gzip_with_nothing_readable_names_the_gzip_damage(lenient: bool, tmp_path) -> None:
    """A gzip file cut inside its first compressed bytes holds no text at all: the error is
    the cut gzip stream at its byte, not "empty file", even for a lenient import."""
    cut = EXAMPLE.read_bytes()[:20]
    path = tmp_path / "head.json.gz"
    path.write_bytes(cut)
    with pytest.raises(xpuprof.TraceFormatError) as e:
        xpuprof.import_traces([path], tmp_path / "x.store", lenient=lenient)
    assert "gzip" in str(e.value) and str(e.value).endswith(f"(at byte {len(cut)})")

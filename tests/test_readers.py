"""The reader registry: a third-party reader registered through the ``xpuprof.readers`` entry
point imports through the real CLI with no change to xpuprof; built-in formats are chosen by
suffix, else by sniffing the first bytes; a file no reader fits gets one clear error.

The toy format and every expected number below are written by hand in this file: the toy
package is a plug-in as a third party would write it, and the expected levels, devices, steps
and parents are worked out from the toy file's lines, not from xpuprof's output.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from builders import TraceBuilder
from conftest import cli, cli_many

from xpuprof.core.errors import TraceFormatError, XpuprofError
from xpuprof.formats import (
    Reader,
    get_reader,
    reader_for,
    readers,
    register,
    unregister,
    vocabulary,
)
from xpuprof.trace.ingest import expand_sources

# ----------------------------------------------------------------------------------------------
# The toy plug-in: a package and its dist-info, as pip would install them
# ----------------------------------------------------------------------------------------------

TOY_PACKAGE = '''
"""A toy trace format: ``# toy v1`` on the first line, then one event per line,
``<ts_ns> <dur_ns> <track> <category> <name>``; the track is ``host:<tid>`` or
``dev<N>:<stream>``."""

import hashlib
from pathlib import Path

import pyarrow as pa

from xpuprof.core.errors import TraceFormatError
from xpuprof.core.raw import KINDS, RAW_SCHEMA, RawTrace, count_entries
from xpuprof.formats import Reader

MAGIC = b"# toy v1"
HOST_PID = 1
DEVICE_PID = 100  # + the device index


def read(path, *, lenient=False, progress=None):
    p = Path(path)
    data = p.read_bytes()
    if not data.startswith(MAGIC):
        raise TraceFormatError(p, "not a toy trace (no '# toy v1' line)", offset=0)
    rows = {name: [] for name in RAW_SCHEMA.names}
    for lineno, line in enumerate(data.decode().splitlines()[1:], start=2):
        fields = line.split(None, 4)
        if not fields or fields[0].startswith("#"):
            continue
        ts, dur, track, cat, name = fields
        where, lane = track.split(":")
        device = None if where == "host" else int(where[3:])
        row = dict.fromkeys(RAW_SCHEMA.names)
        row.update(index=len(rows["index"]), ph="X", cat=cat, name=name, ts=int(ts),
                   dur=int(dur), tid=int(lane), device_arg=device,
                   pid=HOST_PID if device is None else DEVICE_PID + device,
                   stream_arg=None if device is None else int(lane),
                   args=f'{{"line": {lineno}}}')
        for k, v in row.items():
            rows[k].append(v)
    events = pa.Table.from_pydict(
        {f.name: pa.array(rows[f.name], f.type) for f in RAW_SCHEMA}, schema=RAW_SCHEMA
    )
    tables = {k: RAW_SCHEMA.empty_table() for k in KINDS}
    tables["events"] = events
    phase, category = count_entries(tables)
    if progress:
        progress(len(data))
    return RawTrace(path=str(p), tables=tables, read_phase=phase, read_category=category,
                    top={"toy_version": 1}, string_ids={"pid": {}, "tid": {}}, size=len(data),
                    sha256=hashlib.sha256(data).hexdigest(), compressed=False, format="toy")


def sniff(path):
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


READER = Reader(
    name="toy",
    description="Toy traces: .toy",
    suffixes=(".toy",),
    read=read,
    sniff=sniff,
    category_levels={"toy_iter": "step", "toy_call": "op", "toy_launch": "runtime",
                     "toy_compute": "kernel", "toy_copy": "memcpy"},
    device_categories=frozenset({"toy_compute", "toy_copy"}),
)
'''

TOY_METADATA = "Metadata-Version: 2.1\nName: toyreader\nVersion: 0.1\n"
TOY_ENTRY_POINTS = "[xpuprof.readers]\ntoy = toyreader:READER\n"

#: The toy trace: (ts ns, dur ns, track, category, name), one event per line.
TOY_LINES = [
    (0, 1000, "host:1", "toy_iter", "step#1"),
    (10, 200, "host:1", "toy_call", "forward"),
    (20, 50, "host:1", "toy_launch", "launch_matmul"),
    (100, 300, "dev0:7", "toy_compute", "matmul"),
    (300, 100, "host:1", "Toy_Call", "backward"),
    (350, 10, "host:1", "toy_note", "a_note"),
    (400, 100, "dev0:7", "toy_copy", "copy_out"),
    (1000, 1000, "host:1", "toy_iter", "step#2"),
    (1100, 100, "host:1", "toy_call", "forward"),
    (1150, 20, "host:1", "toy_launch", "launch_matmul"),
    (1200, 300, "dev1:3", "toy_compute", "matmul"),
]

#: Worked out by hand from TOY_LINES: (name, level, device, stream, step, parent's name).
#: Levels come from the toy vocabulary (``Toy_Call`` compared lower-case; ``toy_note`` is
#: unknown, so ``other``); host events take the step span containing their start, device
#: events (no launch correlation in this format) the step span containing theirs; parents are
#: the innermost enclosing event on the same track.
TOY_EXPECTED = [
    ("step#1", "step", -1, None, 1, None),
    ("forward", "op", -1, None, 1, "step#1"),
    ("launch_matmul", "runtime", -1, None, 1, "forward"),
    ("matmul", "kernel", 0, 7, 1, None),
    ("backward", "op", -1, None, 1, "step#1"),
    ("a_note", "other", -1, None, 1, "backward"),
    ("copy_out", "memcpy", 0, 7, 1, None),
    ("step#2", "step", -1, None, 2, None),
    ("forward", "op", -1, None, 2, "step#2"),
    ("launch_matmul", "runtime", -1, None, 2, "forward"),
    ("matmul", "kernel", 1, 3, 2, None),
]


def toy_text() -> str:
    return "# toy v1\n" + "".join(f"{t} {d} {tr} {c} {n}\n" for t, d, tr, c, n in TOY_LINES)


@pytest.fixture
def toy_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The toy package and its dist-info in a folder on PYTHONPATH (for the CLI subprocesses
    the tests start): installed the way pip installs a package, nothing registered by hand."""
    site = tmp_path / "site"
    (site / "toyreader").mkdir(parents=True)
    (site / "toyreader" / "__init__.py").write_text(textwrap.dedent(TOY_PACKAGE))
    info = site / "toyreader-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(TOY_METADATA)
    (info / "entry_points.txt").write_text(TOY_ENTRY_POINTS)
    monkeypatch.setenv("PYTHONPATH", str(site), prepend=os.pathsep)
    return site


def sql_json(store: Path, query: str) -> list[dict]:
    proc = cli("sql", store, query, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_plugin_reader_imports_through_the_cli(tmp_path: Path, toy_plugin: Path) -> None:
    src = tmp_path / "run.toy"
    src.write_text(toy_text())
    sniffed = tmp_path / "run_copy.txt"  # a name that says nothing: the toy sniff decides
    sniffed.write_text(toy_text())
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "a.toy").write_text(toy_text())
    (folder / "README.md").write_text("not a trace")
    listing = "from xpuprof.formats import readers; print([r.name for r in readers()])"
    procs = cli_many(
        [
            ["import", src, "-o", tmp_path / "store", "--json"],
            ["import", sniffed, "-o", tmp_path / "sniffed", "--json"],
            ["import", folder, "-o", tmp_path / "folder", "--json"],
        ]
    )
    for proc in procs:
        assert proc.returncode == 0, proc.stderr
    names = subprocess.run(
        [sys.executable, "-c", listing], capture_output=True, text=True, check=True
    )
    assert names.stdout.strip() == "['kineto', 'xplane', 'toy']"

    n = len(TOY_LINES)
    levels: dict[str, int] = {}
    for row in TOY_EXPECTED:
        levels[row[1]] = levels.get(row[1], 0) + 1
    assert levels == {"step": 2, "op": 3, "runtime": 2, "kernel": 2, "memcpy": 1, "other": 1}
    for proc, path in zip(procs, [src, sniffed, folder / "a.toy"], strict=True):
        report = json.loads(proc.stdout)
        (source,) = report["sources"]
        assert source["path"] == str(path.resolve())
        assert source["events_read"] == n and source["rows"]["events"] == n
        assert report["levels"] == levels

    store = tmp_path / "store"
    manifest = json.loads((store / "manifest.json").read_text())
    assert [s["format"] for s in manifest["sources"]] == ["toy"]
    assert manifest["sources"][0]["meta"]["toy_version"] == 1
    rows = sql_json(
        store,
        "select e.name, e.category, e.level, e.device, e.stream, e.step, e.ts, e.dur, "
        "p.name as parent from events e left join events p on e.parent = p.id "
        "order by e.index",
    )
    got = [(r["name"], r["level"], r["device"], r["stream"], r["step"], r["parent"]) for r in rows]
    assert got == TOY_EXPECTED
    assert [(r["ts"], r["dur"], r["category"]) for r in rows] == [
        (t, d, c) for t, d, _, c, _ in TOY_LINES
    ]
    split = sql_json(store, "select device >= 0 as on_device, count(*) as n from events group by 1")
    assert {r["on_device"]: r["n"] for r in split} == {True: 3, False: 8}


def test_plugin_readers_that_are_broken_are_skipped_with_a_warning(
    tmp_path: Path, toy_plugin: Path
) -> None:
    info = toy_plugin / "toyreader-0.1.dist-info"
    (info / "entry_points.txt").write_text(
        TOY_ENTRY_POINTS + "missing = toyreader_missing:READER\nnot_a_reader = toyreader:read\n"
    )
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    from xpuprof.formats import readers\n"
        "    print([r.name for r in readers()])\n"
        "    print(len(w)); print(w[0].message); print(w[1].message)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, count, first, second = out.stdout.strip().splitlines()
    assert names == "['kineto', 'xplane', 'toy']"
    assert count == "2"
    assert "'missing'" in first and "failed to load" in first
    assert "'not_a_reader'" in second and "not an xpuprof.formats.Reader" in second


# ----------------------------------------------------------------------------------------------
# Choosing a built-in reader: by suffix, else by the first bytes
# ----------------------------------------------------------------------------------------------


def _kineto_json() -> bytes:
    tb = TraceBuilder(rank=0)
    tb.step(1, ts=0, dur=100)
    tb.kernel("gemm", ts=10, dur=30, stream=7)
    return json.dumps(tb.doc()).encode()


def _xspace() -> bytes:
    """A one-plane XSpace, written with the generated protobuf module."""
    from xpuprof.formats.proto import xplane_pb2 as xp

    space = xp.XSpace(hostnames=["h"])
    plane = space.planes.add(id=1, name="/host:CPU")
    plane.event_metadata[1].id = 1
    plane.event_metadata[1].name = "work"
    line = plane.lines.add(id=5, name="main", timestamp_ns=1_000)
    line.events.add(metadata_id=1, offset_ps=2_000, duration_ps=3_000)
    return space.SerializeToString()


@pytest.fixture
def samples(tmp_path: Path) -> dict[str, Path]:
    """The same Kineto and XPlane content under telling and untelling names."""
    kineto, xspace = _kineto_json(), _xspace()
    contents = {
        "t.json": kineto,
        "t.json.gz": gzip.compress(kineto),
        "t.xplane.pb": xspace,
        "t.xplane.pb.gz": gzip.compress(xspace),
        "kineto.trace": kineto,
        "kineto_spaced.data": b"\n  " + kineto,
        "kineto.gz": gzip.compress(kineto),
        "capture.pb": xspace,
        "capture.bin": gzip.compress(xspace),
        "notes.txt": b"hello, world\n",
        "empty.dat": b"",
    }
    out = {}
    for name, data in contents.items():
        out[name] = tmp_path / name
        out[name].write_bytes(data)
    return out


@pytest.mark.parametrize(
    ("name", "reader"),
    [
        ("t.json", "kineto"),
        ("t.json.gz", "kineto"),
        ("t.xplane.pb", "xplane"),
        ("t.xplane.pb.gz", "xplane"),
        ("kineto.trace", "kineto"),
        ("kineto_spaced.data", "kineto"),
        ("kineto.gz", "kineto"),
        ("capture.pb", "xplane"),
        ("capture.bin", "xplane"),
    ],
)
def test_reader_for_by_suffix_else_by_sniffing(samples, name: str, reader: str) -> None:
    assert reader_for(samples[name]).name == reader
    # the reader chosen reads the file: same events whatever the name
    raw = reader_for(samples[name]).read(samples[name])
    assert raw.tables["events"].num_rows == (2 if reader == "kineto" else 1)


@pytest.mark.parametrize("name", ["notes.txt", "empty.dat"])
def test_a_file_no_reader_fits_gets_a_clear_error(samples, name: str) -> None:
    with pytest.raises(TraceFormatError) as e:
        reader_for(samples[name])
    msg = str(e.value)
    assert msg.startswith(f"{samples[name]}: not a trace format xpuprof reads")
    for suffix in (".json", ".json.gz", ".xplane.pb", ".xplane.pb.gz"):
        assert suffix in msg
    assert "kineto, xplane" in msg


def test_unknown_file_through_the_cli_is_one_line_and_exit_2(samples, tmp_path: Path) -> None:
    proc = cli("import", samples["notes.txt"], "-o", tmp_path / "out.store")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: {samples['notes.txt']}: not a trace format xpuprof reads")
    assert not (tmp_path / "out.store").exists()


def test_missing_file_with_an_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        reader_for(tmp_path / "nowhere.bin")


def test_the_registry_lists_built_ins_first_and_finds_them_by_name() -> None:
    names = [r.name for r in readers()]
    assert names[:2] == ["kineto", "xplane"]
    assert get_reader("xplane").suffixes == (".xplane.pb", ".xplane.pb.gz")
    assert get_reader("kineto").suffixes == (".json", ".json.gz")
    for r in readers()[:2]:
        assert r.description and all(s in r.description for s in r.suffixes)
    with pytest.raises(XpuprofError, match="no reader named 'nsys'"):
        get_reader("nsys")


def test_register_takes_precedence_by_longer_suffix_and_vocabulary(tmp_path: Path) -> None:
    """A reader registered in-process: its longer suffix beats Kineto's ``.json``, and its own
    vocabulary decides its categories, even one that another vocabulary places on a device."""
    mine = Reader(
        name="mine",
        description="Mine: .mine.json",
        suffixes=(".mine.json",),
        read=lambda path, **kw: None,
        sniff=lambda path: False,
        category_levels={"memcpy": "op", "mine_gpu": "kernel"},
        device_categories=frozenset({"mine_gpu"}),
    )
    register(mine)
    try:
        assert reader_for(tmp_path / "a.mine.json").name == "mine"
        assert reader_for(tmp_path / "a.json").name == "kineto"
        with pytest.raises(XpuprofError, match="already registered"):
            register(mine)
        v = vocabulary("mine")
        assert v.levels["memcpy"] == "op" and "memcpy" not in v.device
        assert v.levels["mine_gpu"] == "kernel" and "mine_gpu" in v.device
        # Kineto's own meaning of the same category is untouched
        assert vocabulary("kineto").levels["memcpy"] == "memcpy"
        assert "memcpy" in vocabulary("kineto").device
        # xpuprof's own capture categories hold for every format
        assert v.levels["xpuprof_step"] == "step"
    finally:
        unregister("mine")
    assert "mine" not in [r.name for r in readers()]


def test_register_rejects_unknown_levels() -> None:
    bad = Reader(
        name="bad",
        description="Bad: .bad",
        suffixes=(".bad",),
        read=lambda path, **kw: None,
        sniff=lambda path: False,
        category_levels={"x": "kernels"},
    )
    with pytest.raises(XpuprofError, match=r"unknown levels \['kernels'\]"):
        register(bad)


def test_declaring_formats_imports_nothing_heavy(samples) -> None:
    """Listing readers and choosing one by suffix or sniffing must stay instant: no pyarrow,
    msgspec or protobuf until a file is read."""
    code = (
        "import sys, xpuprof.formats as f\n"
        "print([f.reader_for(p).name for p in sys.argv[1:]])\n"
        "print(sorted(m for m in ('pyarrow', 'msgspec', 'google.protobuf', 'numpy')"
        " if m in sys.modules))\n"
    )
    files = [samples[n] for n in ("t.json", "t.xplane.pb", "kineto.gz", "capture.bin")]
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, files)], capture_output=True, text=True, check=True
    )
    assert out.stdout.splitlines() == ["['kineto', 'xplane', 'kineto', 'xplane']", "[]"]


# ----------------------------------------------------------------------------------------------
# Directories
# ----------------------------------------------------------------------------------------------


def test_directory_scan_uses_every_suffix_and_drops_renderings_beside_xplane(
    tmp_path: Path,
) -> None:
    """A ``<host>.trace.json.gz`` beside ``<host>.xplane.pb`` is XProf's rendering of the same
    events: left out. The same name in another folder, or beside no XPlane file, is a trace."""
    run = tmp_path / "logs" / "run1"
    other = tmp_path / "logs" / "other"
    for d in (run, other):
        d.mkdir(parents=True)
    files = {
        run / "h.xplane.pb": b"",
        run / "h.trace.json.gz": b"",
        run / "g.trace.json.gz": b"",
        other / "h.trace.json.gz": b"",
        other / "rank0.json": b"",
        other / "notes.md": b"",
    }
    for p, data in files.items():
        p.write_bytes(data)
    (tmp_path / "logs" / ".hidden").mkdir()
    (tmp_path / "logs" / ".hidden" / "x.json").write_bytes(b"")
    got = expand_sources([tmp_path / "logs"])
    assert got == sorted(
        p.resolve()
        for p in (
            run / "h.xplane.pb",
            run / "g.trace.json.gz",
            other / "h.trace.json.gz",
            other / "rank0.json",
        )
    )


def test_an_xprof_log_directory_is_expanded_by_the_xplane_reader(tmp_path: Path) -> None:
    prof = tmp_path / "logs" / "plugins" / "profile"
    for run in ("2024_01_01_00_00_00", "2024_02_01_00_00_00"):
        (prof / run).mkdir(parents=True)
        (prof / run / "h.xplane.pb").write_bytes(b"")
        (prof / run / "h.trace.json.gz").write_bytes(b"")
    newest = (prof / "2024_02_01_00_00_00" / "h.xplane.pb").resolve()
    assert expand_sources([tmp_path / "logs"]) == [newest]
    assert expand_sources([prof]) == [newest]
    empty = tmp_path / "empty" / "plugins" / "profile"
    empty.mkdir(parents=True)
    with pytest.raises(XpuprofError, match="an XProf log directory with no .xplane.pb files"):
        expand_sources([tmp_path / "empty"])


def test_a_directory_without_traces_names_every_suffix(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(
        XpuprofError, match=r"no \.json, \.json\.gz, \.xplane\.pb or \.xplane\.pb\.gz trace files"
    ):
        expand_sources([tmp_path])

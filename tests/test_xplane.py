"""XPlane importer: the real TPU trace, a real JAX run on this CPU, damaged files.

Counts and times are checked against a second decode of each file made here, with a minimal
protobuf wire-format walker that shares nothing with the importer (not its generated module,
not its walker), against values worked out by hand from the raw proto, and, where installed,
against XLA's own C++ reader (``jax.profiler.ProfileData``) and XProf's converter.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import SHARED_TRACES, cli

from xpuprof.core.errors import TraceFormatError, XpuprofError
from xpuprof.core.names import LEVELS
from xpuprof.core.raw import RAW_SCHEMA
from xpuprof.formats.xplane import (
    XPLANE_CATEGORY_LEVEL,
    XPLANE_DEVICE_CATEGORIES,
    category,
    find_xplane_files,
    read_xplane,
)
from xpuprof.trace import normalize as build

TRACES = SHARED_TRACES
TPU = TRACES / "xplane" / "tpu_v6e_4chip_inference.xplane.pb"


def need_tpu_file() -> Path:
    if not TPU.is_file():
        pytest.skip(f"real XPlane trace not found at {TPU} (the shared traces are not here)")
    return TPU


# ----------------------------------------------------------------------------------------------
# An independent decoder: protobuf wire format by hand, only what the counts need
# ----------------------------------------------------------------------------------------------


def _varint(b: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        c = b[i]
        i += 1
        out |= (c & 0x7F) << shift
        if c < 0x80:
            return out, i
        shift += 7


def _msg(b: bytes, i: int, end: int):
    """(field, value) pairs of one message: ints for varints, (start, end) for the rest."""
    while i < end:
        key, i = _varint(b, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
            yield field, v
        elif wt == 2:
            n, i = _varint(b, i)
            yield field, (i, i + n)
            i += n
        elif wt == 1:
            yield field, (i, i + 8)
            i += 8
        elif wt == 5:
            yield field, (i, i + 4)
            i += 4
        else:
            raise ValueError(f"wire type {wt}")


def _s64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def walk(data: bytes) -> list[dict]:
    """Planes as plain dicts: name, id, lines (id, name, timestamp_ns, events as
    (metadata_id, offset_ps, duration_ps, stat names)), metadata names."""
    planes = []
    for f, v in _msg(data, 0, len(data)):
        if f != 1:
            continue
        p = {"name": "", "id": 0, "lines": [], "md": {}, "stat_names": {}}
        for pf, pv in _msg(data, *v):
            if pf == 1:
                p["id"] = _s64(pv)
            elif pf == 2:
                p["name"] = data[pv[0] : pv[1]].decode()
            elif pf == 3:
                line = {"id": 0, "name": "", "ts": 0, "events": []}
                for lf, lv in _msg(data, *pv):
                    if lf == 1:
                        line["id"] = _s64(lv)
                    elif lf == 2:
                        line["name"] = data[lv[0] : lv[1]].decode()
                    elif lf == 3:
                        line["ts"] = _s64(lv)
                    elif lf == 4:
                        ev = [0, 0, 0, []]
                        for ef, evv in _msg(data, *lv):
                            if ef == 1:
                                ev[0] = _s64(evv)
                            elif ef == 2:
                                ev[1] = _s64(evv)
                            elif ef == 3:
                                ev[2] = _s64(evv)
                            elif ef == 4:
                                sid = dict(_msg(data, *evv)).get(1, 0)
                                ev[3].append(sid)
                        line["events"].append(tuple(ev))
                p["lines"].append(line)
            elif pf in (4, 5):  # map entries: key 1, value 2
                entry = dict(_msg(data, *pv))
                key = _s64(entry.get(1, 0))
                fields = dict(_msg(data, *entry[2])) if 2 in entry else {}
                texts = {k: data[x[0] : x[1]].decode() for k, x in fields.items() if k in (2, 4)}
                if pf == 4:
                    p["md"][key] = (texts.get(2, ""), texts.get(4, ""))
                else:
                    p["stat_names"][key] = texts.get(2, "")
        planes.append(p)
    return planes


def expected_rows(planes: list[dict]) -> dict[str, list]:
    """What the importer should produce for every event, in file order, by the documented
    rules: name = display_name or name; ts = line ts + floor(offset_ps/1000); dur = floor of
    the end minus ts; tid = line id."""
    out: dict[str, list] = {"name": [], "ts": [], "dur": [], "tid": [], "plane": []}
    for p in planes:
        if p["name"] == "/host:metadata":
            continue
        for line in p["lines"]:
            for mid, off, dur, _stats in line["events"]:
                name, display = p["md"].get(mid, ("", ""))
                out["name"].append(display or name)
                out["ts"].append(line["ts"] + off // 1000)
                out["dur"].append((off + dur) // 1000 - off // 1000)
                out["tid"].append(line["id"])
                out["plane"].append(p["name"])
    return out


def line_counts(planes: list[dict]) -> Counter:
    return Counter(
        {
            (p["name"], line["id"]): len(line["events"])
            for p in planes
            for line in p["lines"]
            if p["name"] != "/host:metadata"
        }
    )


def our_line_counts(raw) -> Counter:
    """Event rows per (plane name, line id), read off the importer's table."""
    by_pid = {p["pid"]: p["name"] for p in raw.top["planes"] if "pid" in p}
    ev = raw.tables["events"]
    out: Counter = Counter()
    for row in pc.value_counts(
        pc.binary_join_element_wise(ev["pid"].cast("string"), ev["tid"].cast("string"), "|")
    ).to_pylist():
        pid, tid = row["values"].split("|")
        out[(by_pid[int(pid)], int(tid))] = row["counts"]
    # lines without events are rows of zero
    for p in raw.top["planes"]:
        for line in p.get("lines", []):
            out.setdefault((p["name"], line["id"]), 0)
    return +out


def build_tables(raw):
    """Normalise with ``trace.normalize``, the vocabulary chosen by the reader's format."""
    return build.build_tables(
        dict(raw.tables),
        part=0,
        rank=None,
        host=None,
        string_ids=raw.string_ids,
        format=raw.format,
    )


# ----------------------------------------------------------------------------------------------
# (a) the real TPU trace
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tpu():
    path = need_tpu_file()
    data = path.read_bytes()
    return path, data, walk(data), read_xplane(path)


def test_tpu_counts_per_plane_and_line_match_an_independent_decode(tpu):
    _, _, planes, raw = tpu
    assert set(raw.tables) == {"events", "flows", "counters", "metadata"}
    for t in raw.tables.values():
        assert t.schema == RAW_SCHEMA
    assert raw.format == "xplane"
    want = line_counts(planes)
    assert our_line_counts(raw) == +want
    total = sum(want.values())
    assert total == 26_723
    assert raw.tables["events"].num_rows == total
    assert raw.read_phase["X"] == total
    per_plane: Counter = Counter()
    for (plane, _), n in want.items():
        per_plane[plane] += n
    assert dict(per_plane) == {
        "/device:TPU:0": 2317,
        "/device:TPU:1": 1712,
        "/device:TPU:2": 1712,
        "/device:TPU:3": 1712,
        "/host:CPU": 19270,
    }
    ours = {p["name"]: p.get("events") for p in raw.top["planes"]}
    assert {k: v for k, v in ours.items() if v} == dict(per_plane)
    # the metadata plane (HLO protos) is skipped but counted
    meta = [p for p in raw.top["planes"] if p["name"] == "/host:metadata"]
    assert len(meta) == 1 and meta[0]["skipped"] and meta[0]["event_metadata"] == 8


def test_tpu_every_event_has_the_name_time_and_line_the_raw_proto_gives(tpu):
    _, _, planes, raw = tpu
    want = expected_rows(planes)
    ev = raw.tables["events"]
    assert ev["name"].to_pylist() == want["name"]
    assert ev["ts"].to_pylist() == want["ts"]
    assert ev["dur"].to_pylist() == want["dur"]
    assert ev["tid"].to_pylist() == want["tid"]
    # indices: metadata rows first, then events in file order
    n_meta = raw.tables["metadata"].num_rows
    assert ev["index"].to_pylist() == list(range(n_meta, n_meta + ev.num_rows))


def test_tpu_sample_events_checked_by_hand(tpu):
    """Values read off the raw proto by hand (printed with a protobuf dump, then worked out)."""
    _, _, _, raw = tpu
    ev = raw.tables["events"].to_pylist()
    first = ev[0]  # /device:TPU:0, line "XLA Modules", line timestamp_ns 0
    assert first["name"] == "jit_convert_element_type(2433868464432466958)"
    assert first["cat"] == "xla_module"
    # offset_ps 5353251593250, duration_ps 961328: start 5353251593.25 ns, end 5353252554.578
    assert first["ts"] == 5_353_251_593
    assert first["dur"] == 5_353_252_554 - 5_353_251_593 == 961
    args = json.loads(first["args"])
    assert args["offset_ps"] == 5_353_251_593_250 and args["duration_ps"] == 961_328
    assert args["run_id"] == 1 and args["_c"] == -2002751013228737526
    assert first["device_arg"] == 0 and first["stream_arg"] == 2 and first["tid"] == 2
    # the first XLA op of TPU:0: display name shown, HLO text kept as long_name
    op = next(e for e in ev if e["cat"] == "xla_op")
    assert op["name"] == "broadcast.2"
    a = json.loads(op["args"])
    assert a["long_name"].startswith("%broadcast.2 = f32[5,1024,1024,256]")
    assert a["hlo_category"] == "broadcast" and a["bytes_accessed"] == 5_368_709_120
    assert a["program_id"] == 11287434908481120160  # a uint64 beyond int64, exact
    assert op["bytes_arg"] == 5_368_709_120
    # offset_ps 5439011744500, duration_ps 4443766328 (line timestamp 0)
    assert op["ts"] == 5_439_011_744 and op["dur"] == 5_443_455_510 - 5_439_011_744
    # a host event: line "EventFDAsyncWorker/3118193", timestamp_ns 212990, whole ns
    host = next(e for e in ev if e["tid"] == 3118193)
    assert host["name"] == "tpu::System::TransferToDevice=>IssueEvent=>Done"
    assert host["cat"] == "host_trace"
    assert host["ts"] == 212_990 + 7_154_120_613 and host["dur"] == 17_970
    ha = json.loads(host["args"])
    assert ha == {"size": 5_368_709_120, "_ct": 7, "_c": 12884901888}  # no ps: whole ns
    assert host["device_arg"] is None and host["stream_arg"] is None
    # a ref_value stat becomes the string it refers to
    dma = next(e for e in ev if e["name"] == "MapDmaBuffer")
    assert re.fullmatch(r"[\d.]+[KMG]?B", json.loads(dma["args"])["size"])


def test_tpu_planes_lines_and_stats_in_top_and_metadata_rows(tpu):
    _, _, planes, raw = tpu
    top = raw.top
    assert top["baseTimeNanoseconds"] == 1741722099081044120
    dev0 = next(p for p in top["planes"] if p["name"] == "/device:TPU:0")
    assert dev0["device"] == 0 and dev0["id"] == 2
    assert dev0["stats"]["peak_teraflops_per_second"] == 918.0
    assert dev0["stats"]["peak_hbm_bw_gigabytes_per_second"] == pytest.approx(1637.993152512)
    assert [line["name"] for line in dev0["lines"]] == [
        "XLA Modules", "XLA Ops", "Async XLA Ops", "Overlay", "XLA TraceMe"
    ]  # fmt: skip
    host = next(p for p in top["planes"] if p["name"] == "/host:CPU")
    assert len(host["lines"]) == 122
    # pids are unique per plane although three planes have id 0
    pids = [p["pid"] for p in top["planes"] if "pid" in p]
    assert len(set(pids)) == len(pids)
    meta = raw.tables["metadata"].to_pylist()
    names = Counter(m["name"] for m in meta)
    n_lines = sum(len(p["lines"]) for p in planes if p["name"] != "/host:metadata")
    assert names["thread_name"] == n_lines
    assert names["process_name"] == len(pids)
    assert names["process_labels"] == 4
    pname = {m["pid"]: json.loads(m["args"])["name"] for m in meta if m["name"] == "process_name"}
    assert pname[dev0["pid"]] == "/device:TPU:0"


def test_tpu_categories_and_levels(tpu):
    _, _, planes, raw = tpu
    cats = raw.read_category
    # every event of the device lines is categorised by its line (collectives by HLO category)
    by_line = Counter()
    for p in planes:
        for line in p["lines"]:
            if p["name"].startswith("/device:"):
                by_line[line["name"]] += len(line["events"])
    assert cats["xla_module"] == by_line["XLA Modules"]
    assert cats["xla_op"] + cats["xla_collective"] == by_line["XLA Ops"]
    assert cats["xla_copy_async"] == by_line["Async XLA Ops"] == 600
    assert cats["xla_traceme"] == by_line["XLA TraceMe"]
    assert cats["host_trace"] == 19_270
    assert cats["xla_collective"] == 12  # 3 all-reduces on each of the 4 chips
    coll = [e for e in raw.tables["events"].to_pylist() if e["cat"] == "xla_collective"]
    assert {json.loads(e["args"])["hlo_category"] for e in coll} == {"all-reduce"}
    for c in XPLANE_CATEGORY_LEVEL.values():
        assert c in LEVELS
    t = build_tables(raw)
    levels = Counter(t.events["level"].to_pylist())
    assert levels["kernel"] == cats["xla_op"]
    assert levels["collective"] == cats["xla_collective"]
    assert levels["op"] == cats["xla_module"]
    assert levels["memcpy"] == 600
    assert levels["annotation"] == 19_270
    dev = np.asarray(t.events["device"])
    cat = t.events["category"].cast("string")
    is_dev = np.asarray(pc.is_in(cat, value_set=pa.array(sorted(XPLANE_DEVICE_CATEGORIES))))
    assert set(dev[is_dev].tolist()) == {0, 1, 2, 3}
    # the step windows inferred from each chip's program runs lie on that chip's plane
    inferred = np.asarray(pc.equal(cat, "xpuprof_inferred_step"))
    assert set(dev[inferred].tolist()) == {0, 1, 2, 3}
    assert (dev[~is_dev & ~inferred] == -1).all()
    # nesting is per track (plane, line): every parent is on its child's own track and
    # contains it (host TraceMes nest deeply; device lines are flat)
    ev = t.events.select(["id", "pid", "tid", "parent", "ts", "dur"]).to_pandas()
    kids = ev[ev.parent.notna()].merge(ev, left_on="parent", right_on="id", suffixes=("", "_p"))
    assert len(kids) > 1000
    assert (kids.pid == kids.pid_p).all() and (kids.tid == kids.tid_p).all()
    assert (kids.ts >= kids.ts_p).all()
    assert (kids.ts + kids.dur <= kids.ts_p + kids.dur_p).all()


def test_tpu_steps_are_the_runs_of_its_program_on_each_chip(tpu, tmp_path):
    """No step markers (the README says so); read by hand: the host calls ``PjitFunction(f)``
    100 times, but JAX dispatches asynchronously (31 calls return in under 1 ms, 68 block
    ~784 ms, the first takes 4 s to compile), so the host calls do not show the steps; each chip's
    "XLA Modules" line runs ``jit_f`` 100 times back to back, ~784 ms apart, besides three
    ``jit__psum`` and two one-off programs. So the steps are the runs of ``jit_f``: 99 windows
    per chip from one run's start to the next one's, on the chip, and the chips are devices of
    the one rank of this one host (rank 0: nothing in the file names one)."""
    path, _, planes, _ = tpu
    want = {}
    for p in planes:
        m = re.match(r"/device:TPU:(\d+)$", p["name"])
        if not m:
            continue
        (line,) = [ln for ln in p["lines"] if ln["name"] == "XLA Modules"]
        names = Counter(p["md"][e[0]][1] or p["md"][e[0]][0] for e in line["events"])
        top, n = names.most_common(1)[0]
        assert top.startswith("jit_f(") and n == 100
        starts = sorted(
            line["ts"] + e[1] // 1000
            for e in line["events"]
            if (p["md"][e[0]][1] or p["md"][e[0]][0]) == top
        )
        want[int(m.group(1))] = list(zip(starts[:-1], starts[1:], strict=True))
    import xpuprof

    xpuprof.import_traces([path], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        src = t.sources[0]
        assert (src["steps_from"], src["rank"], src["rank_from"]) == (
            "XLA module runs", 0, "default")  # fmt: skip
        st = t.sql(
            "select device, step, ts, ts + dur as e from events where level = 'step' "
            "order by device, ts"
        )
        for d, w in want.items():
            mine = st[st.device == d]
            assert list(zip(mine.ts, mine.e, strict=True)) == w
            assert mine.step.tolist() == list(range(99))
        # each chip's XLA ops take the step of the run they start in, on that chip
        ops = t.sql("select device, step, ts from events where category = 'xla_op' and device = 0")
        w0 = want[0]
        for ts, step in zip(ops.ts, ops.step, strict=True):
            hit = [k for k, (a, b) in enumerate(w0) if a <= ts < b]
            assert (hit[0] if hit else None) == (None if step is pd_na(step) else step)
        assert t.sql("select count(*) as n from events where rank is null")["n"][0] == 0


def pd_na(v):
    """``v`` itself when it is a missing value (so ``step is pd_na(step)`` tests for one)."""
    import pandas as pd

    return v if pd.isna(v) else object()


def test_category_function_agrees_with_the_reader(tpu):
    _, _, planes, raw = tpu
    ev = raw.tables["events"]
    cats = ev["cat"].to_pylist()
    i = 0
    for p in planes:
        if p["name"] == "/host:metadata":
            continue
        for line in p["lines"]:
            for mid, _off, _dur, sids in line["events"]:
                name, display = p["md"].get(mid, ("", ""))
                stats = {p["stat_names"].get(s, ""): 1 for s in sids}
                args = json.loads(ev["args"][i].as_py() or "{}")
                stats.update({k: v for k, v in args.items() if k == "hlo_category"})
                if "hlo_op" in stats:
                    stats["hlo_op"] = args["hlo_op"]
                assert category(p["name"], line["name"], display or name, stats) == cats[i]
                i += 1
    assert i == ev.num_rows


def test_tpu_agrees_with_xlas_own_reader(tpu):
    """jax.profiler.ProfileData parses XSpace with XLA's C++ code."""
    jax_profiler = pytest.importorskip("jax.profiler", reason="jax is not installed")
    path, data, _, raw = tpu
    pd = jax_profiler.ProfileData.from_serialized_xspace(data)
    theirs: Counter = Counter()
    names: list[str] = []
    for plane in pd.planes:
        if plane.name == "/host:metadata":
            continue
        for line in plane.lines:
            evs = list(line.events)
            theirs[(plane.name, line.name)] += len(evs)
            names.extend(e.name for e in evs)
    ours: Counter = Counter()
    for p in raw.top["planes"]:
        for line in p.get("lines", []):
            ours[(p["name"], line["name"])] += line["events"]
    assert +ours == +theirs
    assert sum(theirs.values()) == raw.tables["events"].num_rows
    # ProfileData names events by metadata name; ours is the display name when there is one
    long_names = [
        json.loads(a).get("long_name", n) if a else n
        for n, a in zip(
            raw.tables["events"]["name"].to_pylist(),
            raw.tables["events"]["args"].to_pylist(),
            strict=True,
        )
    ]
    assert Counter(long_names) == Counter(names)


def test_tpu_agrees_with_xprof_trace_viewer(tpu, tmp_path):
    """XProf's own converter (pip install xprof): the device lines it shows unchanged (XLA
    Modules, XLA Ops, XLA TraceMe) have our events, names and times."""
    try:
        from xprof.convert import raw_to_tool_data
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        pytest.skip(f"xprof is not installed or does not load ({e!r})")
    path, _, _, raw = tpu
    copy = tmp_path / path.name
    shutil.copy(path, copy)
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(copy)], "trace_viewer", {})
    tv = json.loads(data)["traceEvents"]
    pname = {e["pid"]: e["args"]["name"] for e in tv if e.get("name") == "process_name"}
    tname = {(e["pid"], e["tid"]): e["args"]["name"] for e in tv if e.get("name") == "thread_name"}
    theirs: dict[tuple[str, str], list] = {}
    for e in tv:
        if e.get("ph") in ("X", "i") and (e["pid"], e["tid"]) in tname:
            key = (pname[e["pid"]], tname[(e["pid"], e["tid"])])
            theirs.setdefault(key, []).append((e["name"], e["ts"]))
    by_pid = {p["pid"]: p for p in raw.top["planes"] if "pid" in p}
    ours: dict[tuple[str, str], list] = {}
    lines = {(p["pid"], line["id"]): line["name"] for p in by_pid.values() for line in p["lines"]}
    ev = raw.tables["events"]
    for pid, tid, name, ts, args in zip(
        *(ev[c].to_pylist() for c in ("pid", "tid", "name", "ts", "args")), strict=True
    ):
        a = json.loads(args) if args else {}
        exact = a.get("offset_ps")
        key = (by_pid[pid]["name"], lines[(pid, tid)])
        ours.setdefault(key, []).append((name, ts, exact))
    compared = 0
    for plane in ("/device:TPU:0", "/device:TPU:1", "/device:TPU:2", "/device:TPU:3"):
        for line in ("XLA Modules", "XLA Ops", "XLA TraceMe"):
            mine = sorted(ours[(plane, line)], key=lambda r: (r[1], r[0]))
            them = sorted(theirs[(plane, line)], key=lambda r: (r[1], r[0]))
            assert len(mine) == len(them), (plane, line)
            assert [m[0] for m in mine] == [t[0] for t in them], (plane, line)
            # XProf writes microseconds with picosecond decimals; ours is floor(ns)
            got = np.array([m[1] for m in mine], dtype=np.int64)
            want = np.array([t[1] for t in them]) * 1000
            assert np.abs(want - got).max() < 1.001
            compared += len(mine)
    assert compared > 6000


# ----------------------------------------------------------------------------------------------
# (b) a real JAX program, run here on the CPU
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    jax = pytest.importorskip("jax", reason="jax is not installed (pip install 'xpuprof[jax]')")
    import jax.numpy as jnp

    from xpuprof.capture.jax import trace_jax

    @jax.jit
    def matmuls(a, b):
        return jnp.tanh(a @ b) @ b.T

    def loss(params, x, y):
        w1, w2 = params
        h = jax.nn.relu(x @ w1)
        return jnp.mean((h @ w2 - y) ** 2)

    @jax.jit
    def train_step(params, x, y):
        g = jax.grad(loss)(params, x, y)
        return [p - 0.01 * q for p, q in zip(params, g, strict=True)]

    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)
    a = jax.random.normal(k1, (128, 256))
    b = jax.random.normal(k2, (256, 256))
    params = [jax.random.normal(k3, (256, 512)) * 0.05, jax.random.normal(k4, (512, 16)) * 0.05]
    x = jax.random.normal(k1, (64, 256))
    y = jax.random.normal(k2, (64, 16))
    matmuls(a, b).block_until_ready()  # compile outside the trace
    jax.block_until_ready(train_step(params, x, y))
    hlo = {
        "jit_matmuls": matmuls.lower(a, b).compile().as_text(),
        "jit_train_step": train_step.lower(params, x, y).compile().as_text(),
    }
    logdir = tmp_path_factory.mktemp("jaxlog")
    steps = 3
    with trace_jax(logdir) as t:
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                matmuls(a, b).block_until_ready()
                params = jax.block_until_ready(train_step(params, x, y))
    return t, hlo, steps


_NOT_RUN = ("parameter", "tuple", "get-tuple-element", "constant", "bitcast")


def _entry_instructions(hlo_text: str) -> set[str]:
    """Names of the instructions of a compiled HLO module's entry computation that do work
    (not parameters, tuples, constants or bitcasts)."""
    entry = hlo_text[hlo_text.index("\nENTRY ") :]
    entry = entry[: entry.index("\n}")]
    found = re.findall(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = \S+ ([\w\-]+)\(", entry, re.M)
    return {name for name, opcode in found if opcode not in _NOT_RUN}


def test_trace_jax_writes_one_xplane_file(jax_run):
    t, _, _ = jax_run
    assert len(t.paths) == 1
    assert t.path.name.endswith(".xplane.pb")
    assert t.path.parent.parent.name == "profile"
    assert find_xplane_files(t.logdir) == [t.path]
    assert find_xplane_files(t.logdir, run="latest") == [t.path]


def test_jax_xla_ops_import_with_counts_per_line_equal_to_the_file(jax_run):
    t, hlo, steps = jax_run
    data = t.path.read_bytes()
    planes = walk(data)
    raw = read_xplane(t.path)
    assert our_line_counts(raw) == +line_counts(planes)
    want = expected_rows(planes)
    assert raw.tables["events"]["ts"].to_pylist() == want["ts"]
    assert raw.tables["events"]["dur"].to_pylist() == want["dur"]

    tables = build_tables(raw)
    ev = tables.events.to_pandas()
    ev["args_d"] = [json.loads(a) if isinstance(a, str) else {} for a in ev["args"]]
    ops = ev[ev.category == "xla_op_cpu"]
    assert len(ops) > 0, "no XLA op of the CPU backend in the trace"
    assert (ops.level == "kernel").all()
    assert (ops.dur > 0).all()
    assert (ops.device == 0).all()
    # every op is an instruction of the program it ran in (the compiled HLO says which), and
    # each ran once per step
    modules = ops.args_d.map(lambda a: a["hlo_module"])
    assert set(modules) == {"jit_matmuls", "jit_train_step"}
    for module, group in ops.groupby(modules):
        names = Counter(group.name)
        assert set(names) <= _entry_instructions(hlo[module]), module
        assert set(names.values()) == {steps}, (module, names)
    # the small program runs every instruction of its entry computation as one op
    assert set(ops[modules == "jit_matmuls"].name) == _entry_instructions(hlo["jit_matmuls"])
    assert any("dot" in n or "fusion" in n for n in ops.name)
    # nesting on their lines: what an op contains lies inside it, on its own track
    by_id = ev.set_index("id")
    kids = ev[ev.parent.isin(ops.id)]
    assert len(kids) > 0  # e.g. the "end: <op>" completion events inside each op
    p = by_id.loc[kids.parent.astype("int64")]
    assert (kids.ts.values >= p.ts.values).all()
    assert (kids.ts.values + kids.dur.values <= p.ts.values + p.dur.values).all()
    assert (kids.tid.values == p.tid.values).all()
    # the step markers (StepTraceAnnotation) are steps, numbered by their step_num
    st = ev[ev.category == "host_step"]
    assert len(st) == steps and (st.level == "step").all()
    assert sorted(a["step_num"] for a in st.args_d) == list(range(steps))
    # each XLA op starts inside one of the steps (the ops run while the step is open)
    s0, s1 = st.ts.values, st.ts.values + st.dur.values
    assert all(((s0 <= t0) & (t0 < s1)).any() for t0 in ops.ts)
    # the host plane's pid is the process that ran (what our own annotations use)
    import os

    host = next(p for p in raw.top["planes"] if p["name"] == "/host:CPU")
    assert host["pid"] == os.getpid()
    assert raw.top["hostname"]
    assert raw.top["baseTimeNanoseconds"] > 1_600_000_000 * 10**9


def test_jax_trace_agrees_with_xlas_own_reader(jax_run):
    jax_profiler = pytest.importorskip("jax.profiler")
    t, _, _ = jax_run
    raw = read_xplane(t.path)
    pd = jax_profiler.ProfileData.from_file(str(t.path))
    theirs = Counter()
    for plane in pd.planes:
        for line in plane.lines:
            theirs[(plane.name, line.name)] += sum(1 for _ in line.events)
    ours = Counter()
    for p in raw.top["planes"]:
        for line in p.get("lines", []):
            ours[(p["name"], line["name"])] += line["events"]
    assert +ours == +theirs


def test_trace_jax_stops_the_trace_when_the_block_raises(tmp_path):
    jax = pytest.importorskip("jax", reason="jax is not installed")
    from xpuprof.capture.jax import trace_jax

    with pytest.raises(ZeroDivisionError):
        with trace_jax(tmp_path / "a") as t:
            jax.numpy.ones(3).block_until_ready()
            1 / 0  # noqa: B018
    assert len(t.paths) == 1
    with trace_jax(tmp_path / "b") as t2:  # a second trace starts: the first was stopped
        jax.numpy.ones(3).block_until_ready()
    assert len(t2.paths) == 1


def test_missing_jax_names_the_extra(monkeypatch):
    from xpuprof.capture import jax as capture_jax

    monkeypatch.setitem(sys.modules, "jax", None)
    monkeypatch.setitem(sys.modules, "jax.profiler", None)
    with pytest.raises(XpuprofError, match=r"pip install 'xpuprof\[jax\]'"):
        with capture_jax.trace_jax("/nonexistent/never-made"):
            pass
    with pytest.raises(XpuprofError, match=r"xpuprof\[jax\]"):
        capture_jax.start_jax("/nonexistent/never-made")


# ----------------------------------------------------------------------------------------------
# (c) damaged input, gzip, file discovery
# ----------------------------------------------------------------------------------------------


def test_truncated_file_names_the_file_and_the_decode_error(tmp_path):
    data = need_tpu_file().read_bytes()
    bad = tmp_path / "cut.xplane.pb"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError) as ei:
        read_xplane(bad)
    msg = str(ei.value)
    assert str(bad) in msg
    assert "truncated" in msg and "DecodeError" in msg
    assert ei.value.offset is not None and 0 <= ei.value.offset < len(data) // 2


def test_lenient_keeps_the_planes_that_decode(tmp_path):
    data = need_tpu_file().read_bytes()
    planes = walk(data)
    bad = tmp_path / "cut.xplane.pb"
    bad.write_bytes(data[: len(data) - 1000])  # ends inside the host plane
    raw = read_xplane(bad, lenient=True)
    assert raw.truncated
    assert len(raw.dropped) == 1 and "truncated" in raw.dropped[0].reason
    kept = {p["name"] for p in raw.top["planes"]}
    assert "/host:CPU" not in kept
    want = sum(len(line["events"]) for p in planes[:4] for line in p["lines"])
    assert raw.tables["events"].num_rows == want


def test_corrupt_plane_and_garbage_give_clear_errors(tmp_path):
    data = bytearray(need_tpu_file().read_bytes())
    # damage inside the first plane: a length prefix that runs past the plane's end
    planes_at = [v for f, v in _msg(bytes(data), 0, len(data)) if f == 1]
    p0, p1 = planes_at[0]
    data[p0 + 40 : p0 + 48] = b"\xff" * 8
    bad = tmp_path / "corrupt.xplane.pb"
    bad.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError) as ei:
        read_xplane(bad)
    assert str(bad) in str(ei.value) and "DecodeError" in str(ei.value)
    raw = read_xplane(bad, lenient=True)
    assert len(raw.dropped) == 1 and raw.dropped[0].offset == p0
    assert "/device:TPU:0" not in {p["name"] for p in raw.top["planes"]}
    assert raw.tables["events"].num_rows == 26_723 - 2317

    for name, content in [
        ("json.xplane.pb", b'{"traceEvents": []}'),
        ("empty.xplane.pb", b""),
        ("zeros.xplane.pb", b"\x00" * 64),
    ]:
        f = tmp_path / name
        f.write_bytes(content)
        with pytest.raises(TraceFormatError) as ei:
            read_xplane(f)
        assert str(f) in str(ei.value)
    with pytest.raises(TraceFormatError, match="no such file"):
        read_xplane(tmp_path / "missing.xplane.pb")


def test_gzip_reads_like_the_plain_file(tmp_path, tpu):
    path, data, _, raw = tpu
    gz = tmp_path / "t.xplane.pb.gz"
    gz.write_bytes(gzip.compress(data))
    got = read_xplane(gz)
    assert got.compressed and not raw.compressed
    for k in raw.tables:
        assert got.tables[k].equals(raw.tables[k])
    cut = tmp_path / "cut.xplane.pb.gz"
    cut.write_bytes(gzip.compress(data)[:-5000])  # ends inside the host plane
    with pytest.raises(TraceFormatError, match="truncated gzip"):
        read_xplane(cut)
    kept = read_xplane(cut, lenient=True)
    assert kept.truncated and len(kept.dropped) == 2  # the gzip stream, then the last plane
    assert kept.tables["events"].num_rows == 2317 + 3 * 1712  # the four device planes


def test_find_xplane_files_newest_run_first(tmp_path):
    prof = tmp_path / "logs" / "plugins" / "profile"
    for run, hosts in [("2024_01_02_00_00_00", ["b", "a"]), ("2024_03_01_00_00_00", ["h"])]:
        (prof / run).mkdir(parents=True)
        for h in hosts:
            (prof / run / f"{h}.xplane.pb").write_bytes(b"")
        (prof / run / "h.trace.json.gz").write_bytes(b"")
    (prof / "empty_run").mkdir()
    got = find_xplane_files(tmp_path / "logs")
    assert [f"{p.parent.name}/{p.name}" for p in got] == [
        "2024_03_01_00_00_00/h.xplane.pb",
        "2024_01_02_00_00_00/a.xplane.pb",
        "2024_01_02_00_00_00/b.xplane.pb",
    ]
    assert find_xplane_files(prof, run="latest") == got[:1]
    assert find_xplane_files(tmp_path / "logs", run="2024_01_02_00_00_00") == got[1:]
    other = tmp_path / "other" / "x"
    other.mkdir(parents=True)
    (other / "m.xplane.pb.gz").write_bytes(b"")
    (other / "n.json").write_bytes(b"")
    assert find_xplane_files(tmp_path / "other") == [other / "m.xplane.pb.gz"]


def test_generated_module_does_not_clash_with_another_copy_of_the_proto():
    """TensorFlow/XProf register tensorflow.profiler.XSpace in protobuf's default pool; ours
    lives in a private pool, so both load in one process."""
    code = """
from google.protobuf import descriptor_pb2, descriptor_pool
fd = descriptor_pb2.FileDescriptorProto(name="tsl/profiler/protobuf/xplane.proto",
                                        package="tensorflow.profiler", syntax="proto3")
m = fd.message_type.add(name="XSpace")
m.field.add(name="hostnames", number=4, type=9, label=3)
descriptor_pool.Default().Add(fd)
from xpuprof.formats.proto import xplane_pb2
s = xplane_pb2.XSpace(hostnames=["h"])
assert xplane_pb2.XSpace.FromString(s.SerializeToString()).hostnames == ["h"]
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ----------------------------------------------------------------------------------------------
# The mapping rules for what the real files above lack (GPU streams, CUPTI, stat kinds)
# ----------------------------------------------------------------------------------------------


def _gpu_space() -> bytes:
    """A small XSpace laid out as XLA's CUPTI collector writes one (plane and line names, stat
    names and formats as in its source): a GPU stream with a kernel, a memcpy, a memset and an
    allocation; the CUPTI driver calls that launched them; XProf's derived XLA Ops line."""
    from xpuprof.formats.proto import xplane_pb2 as xp

    space = xp.XSpace(hostnames=["gpuhost"], warnings=["a warning"])
    gpu = space.planes.add(id=7, name="/device:GPU:1")
    names = ["correlation_id", "kernel_details", "memcpy_details", "memset_details",
             "memalloc_details", "hlo_op", "note", "blob", "gz", "ratio",
             "kind_src:pageable kind_dst:device size:4096 dest:1 async:1"]  # fmt: skip
    for i, n in enumerate(names, start=1):
        gpu.stat_metadata[i].id = i
        gpu.stat_metadata[i].name = n
    for i, n in enumerate(["sgemm_128x64", "MemcpyH2D", "Memset", "MemoryAlloc", "fusion.3"], 1):
        gpu.event_metadata[i].id = i
        gpu.event_metadata[i].name = n
    gpu.event_metadata[5].display_name = "fusion.3"
    gpu.event_metadata[5].name = "%fusion.3 = f32[8] fusion(...)"
    stream = gpu.lines.add(id=13, name="Stream #13(Kernel,MemcpyH2D)", timestamp_ns=1_000)
    ev = stream.events.add(metadata_id=1, offset_ps=5_000_500, duration_ps=2_000_000)
    ev.stats.add(metadata_id=1, uint64_value=42)
    ev.stats.add(metadata_id=6, str_value="fusion.3")
    ev.stats.add(metadata_id=7, str_value="first")
    ev.stats.add(metadata_id=7, str_value="second")  # the same stat twice: both kept
    ev.stats.add(metadata_id=8, bytes_value=b"\x00\x01")
    ev.stats.add(metadata_id=9, compressed_str_value=gzip.compress(b"long text"))
    ev.stats.add(metadata_id=10, double_value=float("nan"))
    ev = stream.events.add(metadata_id=2, offset_ps=8_000_000, duration_ps=1_000_000)
    ev.stats.add(metadata_id=1, uint64_value=43)
    ev.stats.add(metadata_id=3, ref_value=11)
    ev = stream.events.add(metadata_id=3, offset_ps=9_000_000, duration_ps=1_000)
    ev.stats.add(metadata_id=4, str_value="kind:device num_bytes:256 async:0")
    stream.events.add(metadata_id=4, offset_ps=9_500_000, duration_ps=0)
    stream.events.add(metadata_id=1, num_occurrences=3, duration_ps=7_000)
    ops = gpu.lines.add(id=-3, name="XLA Ops", timestamp_ns=1_000)
    ops.events.add(metadata_id=5, offset_ps=5_000_000, duration_ps=2_500_000)
    cupti = space.planes.add(id=0, name="/host:CUPTI")
    cupti.stat_metadata[1].id = 1
    cupti.stat_metadata[1].name = "correlation_id"
    cupti.event_metadata[1].id = 1
    cupti.event_metadata[1].name = "cuLaunchKernel"
    thread = cupti.lines.add(id=777, name="Host Threads/777", timestamp_ns=1_000)
    launch = thread.events.add(metadata_id=1, offset_ps=4_000_000, duration_ps=500_000)
    launch.stats.add(metadata_id=1, uint64_value=42)
    thread.events.add(metadata_id=99, offset_ps=4_600_000, duration_ps=1_000)  # no metadata
    return space.SerializeToString()


def test_gpu_streams_cupti_and_stat_kinds(tmp_path):
    f = tmp_path / "gpuhost.xplane.pb"
    f.write_bytes(_gpu_space())
    raw = read_xplane(f)
    assert raw.top["hostname"] == "gpuhost" and raw.top["warnings"] == ["a warning"]
    assert raw.top["events_without_metadata"] == 1
    rows = raw.tables["events"].to_pylist()
    kernel, memcpy, memset, alloc, agg, op, launch, orphan = rows
    assert [r["cat"] for r in rows] == [
        "kernel", "gpu_memcpy", "gpu_memset", "gpu_memory", "kernel", "xla_op",
        "cuda_driver", "cuda_driver",
    ]  # fmt: skip
    assert kernel["correlation"] == launch["correlation"] == 42
    assert memcpy["correlation"] == 43 and memset["correlation"] is None
    assert kernel["device_arg"] == 1 and kernel["stream_arg"] == 13 and kernel["tid"] == 13
    assert op["stream_arg"] == 1  # line id -3 is no stream: its position in the plane
    assert launch["device_arg"] is None and launch["stream_arg"] is None
    assert memcpy["bytes_arg"] == 4096 and memset["bytes_arg"] == 256
    assert orphan["name"] is None
    # ts/dur: line 1000 ns + 5000.5 ns, ends at 7000.5 ns: floors 6000 and 8000
    assert kernel["ts"] == 6_000 and kernel["dur"] == 2_000
    a = json.loads(kernel["args"])
    assert a["offset_ps"] == 5_000_500 and a["duration_ps"] == 2_000_000
    assert a["note"] == ["first", "second"]
    assert a["blob"] == {"base64": "AAE="}
    assert a["gz"] == "long text"
    assert a["ratio"] is None  # NaN
    assert json.loads(memcpy["args"])["memcpy_details"].startswith("kind_src:pageable")
    assert agg["ts"] == 1_000 and agg["dur"] == 7
    assert json.loads(agg["args"])["num_occurrences"] == 3
    assert op["name"] == "fusion.3"
    assert json.loads(op["args"])["long_name"] == "%fusion.3 = f32[8] fusion(...)"
    labels = [
        json.loads(m["args"]) for m in raw.tables["metadata"].to_pylist()
        if m["name"] == "process_labels"
    ]  # fmt: skip
    assert labels == [{"labels": "GPU 1"}]
    t = build_tables(raw)
    lv = dict(zip(t.events["category"].to_pylist(), t.events["level"].to_pylist(), strict=True))
    assert lv == {
        "kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
        "gpu_memory": "other", "xla_op": "kernel", "cuda_driver": "runtime",
    }  # fmt: skip
    dev = dict(zip(t.events["category"].to_pylist(), t.events["device"].to_pylist(), strict=True))
    assert dev["kernel"] == 1 and dev["cuda_driver"] == -1


def test_progress_reports_bytes_up_to_the_whole_file(tmp_path):
    f = tmp_path / "gpuhost.xplane.pb"
    data = _gpu_space()
    f.write_bytes(data)
    seen: list[int] = []
    read_xplane(f, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == len(data)


def test_cli_import_of_a_corrupt_xplane_leaves_no_store(tmp_path):
    """Through the CLI, as a user meets it: one line naming the file, exit code 2, no store
    (and no hidden staging folder) left behind."""
    bad = tmp_path / "host.xplane.pb"
    bad.write_bytes(b"\x0a\xff\xff\xff\x0fnot a protobuf at all")
    out = cli("import", bad, "-o", tmp_path / "s")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host.xplane.pb"]


def test_a_device_numbered_beyond_any_int_is_a_plane_of_no_device(tmp_path):
    """Found by the fuzzer (issue 8): ``/device:GPU:99999999999999999999`` raised
    OverflowError while its events were laid out. No device has that number: the plane's
    events are kept, with no device number of their own (the normaliser then places device
    work by its pid, as for any device event without one)."""
    from xpuprof.formats.proto.xplane_pb2 import XSpace

    space = XSpace()
    plane = space.planes.add(id=1, name="/device:GPU:99999999999999999999")
    plane.event_metadata[1].id = 1
    plane.event_metadata[1].name = "kernel_a"
    line = plane.lines.add(id=7, name="Stream #7", timestamp_ns=1000)
    line.events.add(metadata_id=1, offset_ps=1000, duration_ps=2000)
    f = tmp_path / "h.xplane.pb"
    f.write_bytes(space.SerializeToString())
    raw = read_xplane(f)
    (row,) = raw.tables["events"].to_pylist()
    assert row["name"] == "kernel_a" and row["device_arg"] is None
    t = build_tables(raw)
    assert t.events["device"].to_pylist() == t.events["pid"].to_pylist()


def _zlib_detects(data: bytes) -> tuple[int, int]:
    """(byte where zlib, fed one byte at a time, detects damage; bytes of text before it)."""
    import zlib

    dec, text = zlib.decompressobj(wbits=31), 0
    for i in range(len(data)):
        try:
            text += len(dec.decompress(data[i : i + 1]))
        except zlib.error:
            return i, text
    raise AssertionError("no damage detected")


@pytest.mark.parametrize("at", [40, 200])
def test_gzip_damage_names_its_byte(tmp_path, at):
    """Issue 8: gzip damage was reported with no place. The error names the byte of the file
    where zlib detects it; a lenient read keeps what decompressed before, and when nothing
    did, fails like a strict one instead of returning an empty trace."""
    data = bytearray(gzip.compress(_gpu_space(), mtime=0))
    data[at : at + 4] = b"\xff" * 4
    where, text = _zlib_detects(bytes(data))
    f = tmp_path / "h.xplane.pb.gz"
    f.write_bytes(bytes(data))
    for lenient in (False, True) if not text else (False,):
        with pytest.raises(TraceFormatError) as ei:
            read_xplane(f, lenient=lenient)
        assert str(ei.value).startswith(f"{f}: corrupt gzip data")
        assert ei.value.offset == where
    if text:
        raw = read_xplane(f, lenient=True)
        assert raw.truncated and raw.dropped[0].file_offset == where

"""``xpuprof export --overlay``: the critical path and the findings written into the Chrome
trace, next to the original entries, which stay exactly as a plain export writes them.

Expected values come from the tools' own ``--json`` (the critical path's segments, the
overview's recommendations with their event ids) and from the raw source JSON, never from
the overlay code.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLE, cli, cli_json, shared

from xpuprof.core.errors import XpuprofError
from xpuprof.export.overlay import CATEGORY, FINDING_CATEGORY, parse_overlays

ALEXNET = "kineto/gpu/a100_alexnet_cuda_sync.json.gz"


def _entries(path: Path) -> list[dict[str, Any]]:
    """The file's entries, numbers parsed exactly (µs decimals with ns digits)."""
    return json.loads(path.read_text(), parse_float=Decimal)["traceEvents"]


def _ns(us: Any) -> int:
    return int(Decimal(us) * 1000)


@pytest.fixture(scope="module")
def alex(tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("overlay") / "alex.store"
    assert cli("import", shared(ALEXNET), "-o", store).returncode == 0
    return store


@pytest.fixture(scope="module", params=["alexnet", "example"])
def path_store(request, tmp_path_factory) -> Path:
    """A GPU trace (host and device on the path) and the shipped CPU trace (a fresh clone)."""
    if request.param == "alexnet":
        return request.getfixturevalue("alex")
    store = tmp_path_factory.mktemp("overlay") / "example.store"
    assert cli("import", EXAMPLE, "-o", store).returncode == 0
    return store


def test_overlay_names_are_checked(tmp_path) -> None:
    assert parse_overlays("critical-path") == ("critical-path",)
    assert parse_overlays("findings, critical_path") == ("findings", "critical-path")
    assert parse_overlays("all") == ("critical-path", "findings")
    with pytest.raises(XpuprofError, match="overlays: critical-path, findings"):
        parse_overlays("bogus")
    r = cli("export", EXAMPLE, "-o", tmp_path / "never.json", "--overlay", "nope")
    assert r.returncode == 2 and "nope" in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())


def test_critical_path_overlay_marks_each_segment_and_keeps_the_trace(path_store, tmp_path):
    alex = path_store
    plain, marked = tmp_path / "plain.json", tmp_path / "marked.json"
    assert cli("export", alex, "-o", plain).returncode == 0
    summary = cli_json("export", alex, "-o", marked, "--overlay", "critical-path")
    base, over = _entries(plain), _entries(marked)
    # the original entries come first, unchanged, in their order
    assert over[: len(base)] == base
    added = over[len(base) :]
    spans = [e for e in added if e["ph"] == "X"]
    # one span per critical-path segment that is an event, at the segment's own time
    path = cli_json("critical-path", alex)["tables"]["path"]
    segments = [s for s in path if s["event"] is not None]
    assert summary["overlays"]["critical_path"] == len(spans) == len(segments) > 10
    assert sorted((_ns(s["ts"]), _ns(s["dur"])) for s in spans) == sorted(
        (s["start"], s["duration"]) for s in segments
    )
    assert {s["cat"] for s in spans} == {CATEGORY}
    assert all(s["tid"] == "xpuprof critical path" for s in spans)
    # arrows join original events: each end lies inside an original X entry of its thread,
    # and no arrow points back in time
    spans_of: dict[tuple, list[tuple[int, int]]] = {}
    for e in base:
        if e.get("ph") == "X":
            lo = _ns(e["ts"])
            spans_of.setdefault((e["pid"], e["tid"]), []).append((lo, lo + _ns(e["dur"])))
    arrows = [e for e in added if e["ph"] in ("s", "f")]
    assert arrows and len(arrows) % 2 == 0
    for a in arrows:
        t = _ns(a["ts"])
        assert any(lo <= t < hi for lo, hi in spans_of[(a["pid"], a["tid"])]), a
    back = 0
    for s, f in zip(arrows[::2], arrows[1::2], strict=True):
        assert (s["ph"], f["ph"], s["id"]) == ("s", "f", f["id"])
        if _ns(f["ts"]) < _ns(s["ts"]):
            # only where the path itself goes back: a wait recorded by a host call that had
            # returned before the kernel it waits for ended (cudaStreamWaitEvent)
            t = _ns(f["ts"])
            ends = [hi for lo, hi in spans_of[(f["pid"], f["tid"])] if lo <= t < hi]
            assert min(ends) <= _ns(s["ts"]), (s, f)
            back += 1
    assert back < len(arrows) // 20
    ids = [a["id"] for a in arrows]
    assert len(set(ids)) == len(ids) // 2  # one id per pair
    assert not set(ids) & {e["id"] for e in base if "id" in e}  # never an existing flow's id


def test_findings_overlay_marks_the_events_each_finding_is_about(alex, tmp_path) -> None:
    out = tmp_path / "findings.json"
    summary = cli_json("export", alex, "-o", out, "--overlay", "findings")
    recs = cli_json("overview", alex)["tables"]["recommendations"]
    assert recs and any(r["events"] for r in recs)
    raw = _entries(out)
    spans = [e for e in raw if e.get("cat") == FINDING_CATEGORY]
    assert summary["overlays"]["findings"] == len(spans)
    # by id: the events of the raw trace (import order = entry order; id = index here)
    source = json.loads(gzip.decompress(shared(ALEXNET).read_bytes()), parse_float=Decimal)
    entries = source["traceEvents"]
    for k, rec in enumerate(recs, 1):
        mine = [s for s in spans if s["tid"] == f"xpuprof finding {k}"]
        want = [entries[i] for i in rec["events"] if "dur" in entries[i]]
        assert len(mine) == len(want)
        assert sorted((_ns(s["ts"]), _ns(s["dur"])) for s in mine) == sorted(
            (_ns(e["ts"]), _ns(e["dur"])) for e in want
        )
        assert all(s["args"]["recommendation"] == rec["recommendation"] for s in mine)

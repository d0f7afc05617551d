"""The many-rank generator of ``benchmarks/bench_scale.py`` (``benchmarks/gen_ranks.py``): a
16-rank set built from the real 8-rank DLRM job, checked from the written JSON.

Every expectation is recomputed here from the files with the standard ``json`` module (decimals
read exactly, as ``Decimal``) and from the DLRM sources read with ``gzip``: the collectives are
the same sequence on every rank, each rank's clock is the source's plus the offset that
``truth.json`` states, and the straggler pause and the others' wait are where and as long as it
says. Skips without the shared traces.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, SHARED_TRACES, shared

N, S = 16, 3


def _gen_ranks() -> Any:
    spec = importlib.util.spec_from_file_location("gen_ranks", ROOT / "benchmarks" / "gen_ranks.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_ranks"] = mod  # its dataclass and its pool's tasks resolve it by name
    spec.loader.exec_module(mod)
    return mod


def _ns(v: Any) -> int:
    return int(Decimal(v) * 1000) if not isinstance(v, int) else v * 1000


def _load(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        return json.loads(f.read(), parse_float=Decimal)


def _nccl(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ks = [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    return sorted(ks, key=lambda e: _ns(e["ts"]))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    src_dir = shared("kineto/gpu/dlrm_8rank_v100")
    out = tmp_path_factory.mktemp("ranks16")
    # in this process: a fork of the test process (which may hold JAX's threads) could deadlock
    man = _gen_ranks().generate(out, N, steps=S, seed=3, traces=SHARED_TRACES, processes=1)
    truth = json.loads((out / "truth.json").read_text())
    files = {r: _load(out / f"rank{r}.pt.trace.json") for r in range(N)}
    sources = []
    for p in sorted(src_dir.glob("*.json.gz")):
        doc = _load(p)
        sources.append((doc["distributedInfo"]["rank"], doc))
    sources = [d for _, d in sorted(sources, key=lambda x: x[0])]
    return man, truth, files, sources


def test_files_and_counts(made):
    man, truth, files, sources = made
    assert len(man["files"]) == N
    for r, doc in files.items():
        assert doc["distributedInfo"]["rank"] == r
        assert doc["distributedInfo"]["world_size"] == N
        src = sources[r % 8]["traceEvents"]
        once = sum(1 for e in src if e["ph"] in ("M", "i") or e.get("cat") == "Trace")
        assert len(doc["traceEvents"]) == once + S * (len(src) - once)
        assert man["files"][r]["events"] == len(doc["traceEvents"])
        steps = sorted(e["name"] for e in doc["traceEvents"] if "ProfilerStep#" in e["name"])
        assert steps == [f"ProfilerStep#{10 + k}" for k in range(S)]
        # ids stay unique across the copies: as many distinct correlations as S x the source's
        corr = {e["args"]["correlation"] for e in doc["traceEvents"] if e.get("cat") == "kernel"}
        src_corr = {e["args"]["correlation"] for e in src if e.get("cat") == "kernel"}
        assert len(corr) == S * len(src_corr)


def test_collectives_rank_consistent(made):
    _, _, files, sources = made
    seqs = {tuple(e["name"] for e in _nccl(doc["traceEvents"])) for doc in files.values()}
    assert len(seqs) == 1
    (seq,) = seqs
    assert seq == tuple(e["name"] for e in _nccl(sources[0]["traceEvents"])) * S


def test_offsets_are_what_the_files_hold(made):
    _, truth, files, sources = made
    K = truth["straggler"]["step_index"]
    assert K >= 1 and -50_000_000 <= min(truth["offset_ns"]) <= max(truth["offset_ns"]) <= 5e7
    assert any(o % 1000 for o in truth["offset_ns"])  # µs-fractional
    for r, doc in files.items():
        src = sources[r % 8]["traceEvents"]
        # step 0 comes before the straggler's step: each copied event is the source's + offset
        src_step = next(e for e in src if e["name"] == "ProfilerStep#10")
        out_step = next(e for e in doc["traceEvents"] if e["name"] == "ProfilerStep#10")
        assert _ns(out_step["ts"]) - _ns(src_step["ts"]) == truth["offset_ns"][r]
        n = len(_nccl(src))
        for a, b in zip(_nccl(src), _nccl(doc["traceEvents"])[:n], strict=True):
            assert _ns(b["ts"]) - _ns(a["ts"]) == truth["offset_ns"][r]
            assert _ns(b["dur"]) == _ns(a["dur"])


def test_straggler_is_what_the_files_hold(made):
    _, truth, files, sources = made
    sg = truth["straggler"]
    R, K, D, j = sg["rank"], sg["step_index"], sg["delay_ns"], sg["collective_index"]
    P = truth["period_ns"]
    assert 2_000_000 <= D <= 5_000_000 and 1 <= K <= S - 2 and j >= 1
    n = len(_nccl(sources[0]["traceEvents"]))
    starts, ends = {}, {}
    for r, doc in files.items():
        off = truth["offset_ns"][r]
        ks = _nccl(doc["traceEvents"])
        before, at = ks[(K - 1) * n + j], ks[K * n + j]
        t0, t1 = _ns(before["ts"]) - off, _ns(at["ts"]) - off
        e0, e1 = t0 + _ns(before["dur"]), t1 + _ns(at["dur"])
        starts[r], ends[r] = t1, e1
        # every rank's collective j of step K ends D later than the plain repetition
        assert e1 - e0 == P + D
        if r == R:
            assert t1 - t0 == P + D  # it arrives D late ...
            assert _ns(at["dur"]) == _ns(before["dur"])
        else:
            assert t1 - t0 == P  # ... the others arrive on time and wait D longer
            assert _ns(at["dur"]) - _ns(before["dur"]) == D
        # the next step starts P + D after the straggler's step, on every rank
        step = {e["name"]: _ns(e["ts"]) for e in doc["traceEvents"] if "ProfilerStep#" in e["name"]}
        assert step[f"ProfilerStep#{11 + K}"] - step[f"ProfilerStep#{10 + K}"] == P + D
        assert step["ProfilerStep#11"] - step["ProfilerStep#10"] == (P + D if K == 0 else P)
    # the straggler arrives last, by at least D minus the recorded arrival spread
    src_starts = [_ns(_nccl(s["traceEvents"])[j]["ts"]) for s in sources]
    spread = max(src_starts) - min(src_starts)
    assert spread == sg["arrival_spread_ns"]
    assert starts[R] - max(t for r, t in starts.items() if r != R) >= D - spread
    # ends agree across ranks within the sources' own end skew
    src_ends = [_ns(_nccl(s["traceEvents"])[j]["ts"]) + _ns(_nccl(s["traceEvents"])[j]["dur"])
                for s in sources]  # fmt: skip
    assert max(ends.values()) - min(ends.values()) == max(src_ends) - min(src_ends)

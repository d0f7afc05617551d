"""Parallel import on a real Dask cluster reached by address, as `--scheduler ADDRESS` does for a
user's own cluster: the result must equal the in-process import, row for row."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import EXAMPLE, cli

import xpuprof
from xpuprof.trace.store import verify


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    """Four per-rank files made from the shipped real trace (rank written into each)."""
    doc = json.loads(gzip.decompress(EXAMPLE.read_bytes()))
    d = tmp_path_factory.mktemp("ranks")
    for r in range(4):
        doc["distributedInfo"] = {"rank": r, "world_size": 4}
        (d / f"rank{r}.json").write_text(json.dumps(doc))
    return d


def test_import_through_a_scheduler_address_equals_in_process(ranks, tmp_path) -> None:
    from dask.distributed import LocalCluster

    local = xpuprof.import_traces([ranks], tmp_path / "local.store", workers=1)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        out = cli("import", ranks, "-o", tmp_path / "remote.store",
                  "--scheduler", cluster.scheduler_address, "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["workers"] == 2
    assert doc["rows"] == local.rows
    assert sorted(s["rank"] for s in doc["sources"]) == [0, 1, 2, 3]
    q = "select rank, level, count(*) as n, sum(dur) as d from events group by all order by all"
    with xpuprof.load(tmp_path / "local.store") as a, xpuprof.load(tmp_path / "remote.store") as b:
        assert a.sql(q).equals(b.sql(q))
    # the workers' files are complete and listed; no lock or build folder stays behind
    assert verify(tmp_path / "remote.store") == [] and verify(tmp_path / "local.store") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local.store", "remote.store"]

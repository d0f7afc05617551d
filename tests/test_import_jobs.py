"""One import, one job: traces whose ``distributedInfo`` states different world sizes or
different process groups are refused in one line naming the files, nothing written, unless
``--mixed`` (issue 14's bad input)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from builders import TraceBuilder

import xpuprof
from xpuprof.core.errors import XpuprofError

ROOT = Path(__file__).resolve().parents[1]


def _rank(d: Path, name: str, rank: int, world: int, groups: list | None = None) -> Path:
    tb = TraceBuilder(rank=rank, world_size=world)
    if groups is not None:
        tb.top["distributedInfo"]["pg_config"] = groups
    tb.step(0, ts=0, dur=100)
    tb.op("aten::mm", 10, 50)
    return tb.write(d / name)


def _groups(ranks: list[int]) -> list[dict]:
    return [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
             "pg_size": len(ranks), "ranks": ranks}]  # fmt: skip


def test_one_job_imports(tmp_path: Path) -> None:
    files = [_rank(tmp_path, f"r{r}.json", r, 2, _groups([0, 1])) for r in range(2)]
    xpuprof.import_traces(files, tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        assert sorted(t.ranks) == [0, 1]


def test_world_sizes_differ(tmp_path: Path) -> None:
    a = _rank(tmp_path, "job_a_rank0.json", 0, 2)
    b = _rank(tmp_path, "job_b_rank1.json", 1, 4)
    with pytest.raises(XpuprofError) as e:
        xpuprof.import_traces([a, b], tmp_path / "s")
    msg = str(e.value)
    assert "world size 2: job_a_rank0.json" in msg and "world size 4: job_b_rank1.json" in msg
    assert "--mixed" in msg and "\n" not in msg
    assert not (tmp_path / "s").exists()
    # kept together on request; each job's collectives are then compared within the job only
    xpuprof.import_traces([a, b], tmp_path / "s", mixed=True)
    with xpuprof.load(tmp_path / "s") as t:
        assert sorted(t.ranks) == [0, 1]


def test_process_groups_differ(tmp_path: Path) -> None:
    a = _rank(tmp_path, "a.json", 0, 2, _groups([0, 1]))
    b = _rank(tmp_path, "b.json", 1, 2, _groups([1, 2]))
    with pytest.raises(
        XpuprofError,
        match=r"world size 2, process groups \w+: a.json; world "
        r"size 2, process groups \w+: b.json",
    ):
        xpuprof.import_traces([a, b], tmp_path / "s")


def test_ranks_listing_only_their_own_sub_groups_are_one_job(tmp_path: Path) -> None:
    """torch writes into each rank's ``pg_config`` only the groups that rank belongs to: in a
    4-rank job with two tensor-parallel pairs, ranks 0-1 list group "1" = [0, 1] and ranks
    2-3 group "2" = [2, 3], all of them the world group "0". One job, imported together; a
    fifth file defining group "1" as [1, 2] contradicts ranks 0-1 and is another job."""
    world = _groups([0, 1, 2, 3])

    def pair(name: str, ranks: list[int]) -> dict:
        return {"pg_name": name, "pg_desc": "tp", "backend_config": "cuda:nccl", "pg_size": 2,
                "ranks": ranks}  # fmt: skip

    files = [_rank(tmp_path, f"r{r}.json", r, 4, world + [pair("1", [0, 1])]) for r in (0, 1)]
    files += [_rank(tmp_path, f"r{r}.json", r, 4, world + [pair("2", [2, 3])]) for r in (2, 3)]
    xpuprof.import_traces(files, tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        assert sorted(t.ranks) == [0, 1, 2, 3]
    other = _rank(tmp_path, "x.json", 1, 4, world + [pair("1", [1, 2])])
    with pytest.raises(XpuprofError, match="different jobs"):
        xpuprof.import_traces([*files, other], tmp_path / "s2")


def test_files_without_distributed_info_are_not_judged(tmp_path: Path) -> None:
    a = _rank(tmp_path, "a.json", 0, 2)
    plain = TraceBuilder(rank=None)
    plain.step(0, ts=0, dur=10)
    b = plain.write(tmp_path / "b.json")
    xpuprof.import_traces([a, b], tmp_path / "s")  # one job's rank and a trace that names none


def test_import_command_says_it_in_one_line(tmp_path: Path) -> None:
    a = _rank(tmp_path, "a.json", 0, 2)
    b = _rank(tmp_path, "b.json", 1, 8)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "xpuprof.ui.cli", "import", str(a), str(b), "-o",
           str(tmp_path / "s")]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert p.stderr.startswith("error: these traces are ranks of different jobs")
    assert not (tmp_path / "s").exists()
    p = subprocess.run([*cmd, "--mixed", "--json"], capture_output=True, text=True,
                       timeout=120, env=env)  # fmt: skip
    assert p.returncode == 0, p.stderr


def test_missing_ranks_are_named_and_the_rest_computed(tmp_path: Path) -> None:
    from xpuprof.ui import tools

    files = [_rank(tmp_path, f"r{r}.json", r, 4) for r in (0, 2)]
    xpuprof.import_traces(files, tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        assert t.job() == {"world_size": 4, "ranks": [0, 2], "missing": [1, 3]}
        res = tools.run("overview", t)
    note = "ranks 1, 3 of world size 4 are not in the store: the numbers are of the 2 ranks present"
    assert note in res.notes
    assert sorted(res.tables["steps"]["rank"]) == [0, 2]
    # one rank profiled on purpose: nothing to say
    xpuprof.import_traces([files[1]], tmp_path / "one")
    with xpuprof.load(tmp_path / "one") as t:
        assert t.job()["missing"] == [0, 1, 3]
        assert not any("not in the store" in n for n in tools.run("overview", t).notes)


def test_dlrm_without_two_ranks(tmp_path: Path) -> None:
    from conftest import shared

    from xpuprof.ui import tools

    d = shared("kineto/gpu/dlrm_8rank_v100")
    files = sorted(d.iterdir())
    keep = [f for f in files if not f.name.startswith(("worker3_", "worker5_"))]
    assert len(keep) == 6
    xpuprof.import_traces(keep, tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        comm = tools.run("comm", t)
    assert comm.notes[0] == ("ranks 3, 5 of world size 8 are not in the store: the numbers are "
                             "of the 6 ranks present")  # fmt: skip
    # the rest is computed: the six ranks' collectives, found as in the whole set
    assert sorted(set(comm.tables["collectives"]["rank"])) == [0, 1, 2, 4, 6, 7]

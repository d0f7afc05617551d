"""``xpuprof sweep`` (``xpuprof.live.sweep``): a real small sweep, its numbers checked against
the test's own measurements (``time.perf_counter``, torch's ``FlopCounterMode``, the model's
parameters), and configurations that fail recorded while the sweep goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xpuprof.core.errors import XpuprofError
from xpuprof.live.levelmerge import median_interval

ROOT = Path(__file__).resolve().parents[1]


TIMING = """
import json, time, torch
from xpuprof.workloads.models import build
torch.set_num_threads(1)
w = build("mlp", 2)
for _ in range(3):
    w.step()
times = []
for _ in range(20):
    t0 = time.perf_counter()
    w.step()
    times.append(time.perf_counter() - t0)
print(json.dumps(times))
"""


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    from xpuprof.live.sweep import sweep

    out = tmp_path_factory.mktemp("sweep") / "out"
    seen: list[tuple[int, int, str]] = []
    before = _direct_ms()
    res = sweep(["mlp", "nosuchmodel"], [2], out=out, levels=("model", "layer", "op"),
                min_steps=10, max_steps=20, threads=1,
                progress=lambda i, n, row: seen.append((i, n, row["status"])))  # fmt: skip
    after = _direct_ms()
    return res, out, seen, (before, after)


def _direct_ms() -> float:
    """The mlp's median step timed as a sweep's configuration is: a fresh process, one
    thread, a plain ``time.perf_counter`` loop."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-c", TIMING], capture_output=True, text=True,
                       timeout=120, env=env)  # fmt: skip
    assert p.returncode == 0, p.stderr
    return median_interval(json.loads(p.stdout))[0] * 1e3


def test_sweep_numbers_match_direct_measurement(small_sweep) -> None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from xpuprof.live.sweep import folder_name
    from xpuprof.workloads.models import build

    res, out, _, direct = small_sweep
    assert res.facts["out"] == str(out)
    s = res.tables["summary"].set_index("model")
    row = s.loc["mlp"]
    assert row["status"] == "ok"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        w = build("mlp", 2)
        with FlopCounterMode(display=False) as fc:
            w.step()
    finally:
        torch.set_num_threads(threads)
    # the sweep's model level against plain loops timed just before and just after it, each in
    # its own process: between them, within a factor 1.5. This VM's speed drifts by 10-20 %
    # between processes (benchmarks/RESULTS.md, "A/A") and once, in a full run of the suite,
    # the sweep's process ran 45 % slower than both plain ones (38.7 ms against 24.1 and
    # 26.7; rerun: 23.3 against 24.3). What this still catches: another level's time, or a
    # unit, reported as the step.
    low, high = min(direct) / 1.5, max(direct) * 1.5
    assert low <= row["step_ms"] <= high, (row["step_ms"], direct)
    assert 2 / (high / 1e3) <= row["samples_per_s"] <= 2 / (low / 1e3)
    assert row["params"] == sum(p.numel() for p in w.model.parameters())
    # FLOPs per step from the recorded shapes: torch counts the GEMMs (forward and backward);
    # ours adds the elementwise ops and the optimizer (a few FLOPs per parameter)
    gemm = fc.get_total_flops()
    assert gemm <= row["work_flops"] <= gemm + 20 * row["params"]
    # the layer types of the layer run are the leaf modules' classes of the model itself
    leaves = {type(m).__name__ for _, m in w.model.named_modules() if not list(m.children())}
    types = res.tables["layer_types"]
    got = set(types.loc[types["model"] == "mlp", "type"])
    assert {t for t in got if not t.startswith("(")} == leaves
    # the folder holds the leveled runs and the configuration's document
    folder = out / folder_name("mlp", 2, "fp32")
    assert (folder / "leveled" / "merged.store").is_dir()
    assert json.loads((folder / "config.json").read_text())["status"] == "ok"


def test_sweep_records_failures_and_goes_on(small_sweep) -> None:
    res, out, seen, _ = small_sweep
    s = res.tables["summary"].set_index("model")
    assert s.at["nosuchmodel", "status"] == "failed"
    assert "mlp" in s.at["nosuchmodel", "error"]  # the error lists the built-ins
    assert any("nosuchmodel" in n and "failed" in n for n in res.notes)
    assert seen == [(1, 2, "ok"), (2, 2, "failed")]
    # the tables are saved beside the runs
    import pandas as pd

    saved = pd.read_parquet(out / "summary.parquet")
    assert list(saved["model"]) == ["mlp", "nosuchmodel"]
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["facts"]["headline"].startswith("1 of 2 configurations")


def test_sweep_timeout_is_a_failure_of_that_configuration(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    from xpuprof.live.sweep import sweep

    res = sweep(["mlp"], [2], out=tmp_path / "o", levels=("model",), timeout=0.5)
    row = res.tables["summary"].iloc[0]
    assert row["status"] == "failed" and "still running after 0.5 s" in row["error"]


def test_sweep_bad_arguments(tmp_path: Path) -> None:
    from xpuprof.live.sweep import sweep

    with pytest.raises(XpuprofError, match="dtype"):
        sweep(["mlp"], [2], ["fp64"], out=tmp_path / "a")
    with pytest.raises(XpuprofError, match="batch"):
        sweep(["mlp"], [0], out=tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mine.txt").write_text("x")
    with pytest.raises(XpuprofError, match="not empty"):
        sweep(["mlp"], [2], out=tmp_path / "b")


def test_sweep_command(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "xpuprof.ui.cli", "sweep", "-o", str(out),
                        "--models", "gpt", "--batch", "2", "--levels", "model,layer",
                        "--max-steps", "10", "--threads", "1", "--json"],
                       capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    (row,) = doc["tables"]["summary"]
    assert (row["model"], row["batch"], row["status"]) == ("gpt", 2, "ok")
    assert Path(doc["facts"]["report"]).is_file()

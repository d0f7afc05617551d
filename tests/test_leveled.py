"""Leveled measurement (``xpuprof.live.leveled``): the statistics, the keys that correlate the
runs, the merge and its timeline (on stores written by hand, numbers worked out below), and real
leveled runs of a small PyTorch model, in process and through ``xpuprof leveled -- python …``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from builders import TraceBuilder

import xpuprof
from xpuprof.core.errors import XpuprofError
from xpuprof.live.levelmerge import (
    LevelRun,
    interval,
    median_interval,
    merge,
    relative_width,
    t95,
    units,
)

ROOT = Path(__file__).resolve().parents[1]


# -- statistics ------------------------------------------------------------------------------------


def test_mean_interval_by_hand() -> None:
    # 1..5: mean 3, s = sqrt(2.5), t(4) = 2.776 (tables), half = 2.776 * sqrt(2.5) / sqrt(5)
    mean, half = interval([1, 2, 3, 4, 5])
    assert mean == 3
    assert half == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5))
    assert t95(9) == 2.262 and t95(1000) == 1.96
    assert interval([7.0])[1] == math.inf


def test_median_interval_by_hand() -> None:
    # n = 20: ranks 10 -/+ 1.96*sqrt(20)/2 = 4.383 -> round(5.617) = 6 and round(15.383) = 15
    xs = list(range(20, 0, -1))  # order must not matter
    median, lo, hi = median_interval(xs)
    assert (median, lo, hi) == (10.5, 6, 15)
    assert relative_width(xs) == pytest.approx(max(10.5 - 6, 15 - 10.5) / 10.5)
    # a stray slow step moves the mean, not the median or its interval
    steady = [100.0] * 19
    assert median_interval([*steady, 10_000.0])[:2] == (100.0, 100.0)
    assert relative_width([5.0]) == math.inf


# -- merging, on stores written by hand ------------------------------------------------------


def _layer(tb: TraceBuilder, name: str, ts: float, dur: float) -> None:
    tb.x(name, "xpuprof_layer", ts, dur, module="Net", **{"pass": "forward"})


def _stores(tmp_path: Path) -> list[LevelRun]:
    """Three runs of a step with one layer ``net`` and a loss outside it (µs):

    model run: steps 1..3 only.
    layer run: ``net`` 590 / 600 / 610 (mean 600).
    op run (identical steps 0..3): step [0, 1200]; net [100, 800] holding aten::linear
    [110, 760] (650); aten::mse_loss [900, 1000] holding two aten::add [910, 930], [940, 960].
    Settle step 0 is in every store and measured in none."""
    runs = []
    model = TraceBuilder()
    for n in range(4):
        model.step(n, ts=n * 2000, dur=1000)
    layer = TraceBuilder()
    for n, d in zip(range(4), (999, 590, 600, 610), strict=True):
        t0 = n * 2000
        layer.step(n, ts=t0, dur=1000)
        _layer(layer, "net", t0 + 100, d)
    op = TraceBuilder()
    for n in range(4):
        t0 = n * 2000
        op.step(n, ts=t0, dur=1200)
        _layer(op, "net", t0 + 100, 700)
        op.op("aten::linear", t0 + 110, 650)
        op.op("aten::mse_loss", t0 + 900, 100)
        op.op("aten::add", t0 + 910, 20)
        op.op("aten::add", t0 + 940, 20)
    for level, tb, times_us in (("model", model, (990, 1000, 1010)),
                                ("layer", layer, (1040, 1050, 1060)),
                                ("op", op, (1190, 1200, 1210))):  # fmt: skip
        store = tb.store(tmp_path / "runs", name=level)
        run = LevelRun(level, [store], [(0, n, int(t * 1000)) for n, t in
                                        zip((1, 2, 3), times_us, strict=True)])  # fmt: skip
        runs.append(run)
    return runs


def test_keys_correlate_by_path_and_sequence(tmp_path: Path) -> None:
    runs = _stores(tmp_path)
    with xpuprof.load(runs[2].stores[0]) as t:
        u = units(t, {2})
    assert list(u["key"]) == [
        "step",
        "step › net#0",
        "step › net#0 › aten::linear#0",
        "step › aten::mse_loss#0",
        "step › aten::mse_loss#0 › aten::add#0",
        "step › aten::mse_loss#0 › aten::add#1",
    ]
    assert list(u["dur"]) == [1_200_000, 700_000, 650_000, 100_000, 20_000, 20_000]


def test_merge_times_each_unit_by_its_own_level(tmp_path: Path) -> None:
    runs = _stores(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    res = merge(runs, out)
    tree = res.tree.set_index("key")
    # the step by the model run's clock, net by the layer run, ops by the op run (µs → ns)
    assert tree.at["step", "timed_by"] == "model"
    assert tree.at["step", "time_ns"] == pytest.approx(1_000_000)
    assert tree.at["step › net#0", "timed_by"] == "layer"
    assert tree.at["step › net#0", "time_ns"] == pytest.approx(600_000)
    assert tree.at["step › net#0", "deepest_ns"] == pytest.approx(700_000)
    assert tree.at["step › net#0", "distortion_pct"] == pytest.approx(100 * (700 / 600 - 1))
    assert tree.at["step › aten::mse_loss#0", "timed_by"] == "op"
    assert tree.at["step › aten::mse_loss#0 › aten::add#1", "time_ns"] == pytest.approx(20_000)
    lv = res.levels.set_index("level")
    assert lv.at["model", "median_ms"] == pytest.approx(1.0)
    assert lv.at["op", "overhead_pct"] == pytest.approx(20.0)
    assert lv.at["layer", "overhead_pct"] == pytest.approx(5.0)
    # layer run: net 600 of a 1050 µs step (median)
    assert res.facts["layer_units_ms"] == pytest.approx(0.6)
    assert res.facts["outside_layers_ms"] == pytest.approx(1.05 - 0.6)

    # the merged timeline (worked out by hand): the step 1000 µs; its children net 600 and
    # mse_loss 100 leave 300 µs, spread as the op run's gaps (100 before net, 100 between,
    # 200 after): net at 75, mse_loss at 75 + 600 + 75 = 750. linear (650, op run) does not
    # fit in net's 600: scaled to 600 and marked compressed.
    with xpuprof.load(res.merged) as m:
        ev = m.sql("select name, level, ts, dur, args from events where level in "
                   "('step', 'layer', 'op') order by ts, dur desc")  # fmt: skip
    t0 = ev["ts"].iat[0]
    got = {n: (ts - t0, d) for n, ts, d in zip(ev["name"], ev["ts"], ev["dur"], strict=True)}
    assert got["ProfilerStep#0"] == (0, 1_000_000)
    assert got["net"] == (75_000, 600_000)
    assert got["aten::linear"] == (75_000, 600_000)
    assert got["aten::mse_loss"] == (750_000, 100_000)
    linear = json.loads(ev.loc[ev["name"] == "aten::linear", "args"].iat[0])
    assert linear["leveled"]["compressed"] is True and linear["leveled"]["timed_by"] == "op"
    # the merged store is a store every tool reads
    with xpuprof.load(res.merged) as m:
        from xpuprof.ui import tools

        steps = tools.run("overview", m).tables["steps"]
    assert len(steps) == 1
    assert steps["step_ns"].iat[0] == 1_000_000


def test_merge_kernel_level_on_gpu_shaped_stores(tmp_path: Path) -> None:
    """A kernel run (op → launch call → kernel on stream 7), an op run without device
    activity and a model run, in µs: the kernel is timed by the kernel run and keeps its
    queueing after its launch call, the op by the op run."""
    model, op, kern = TraceBuilder(), TraceBuilder(), TraceBuilder()
    for n in range(3):
        t0 = n * 2000
        model.step(n, ts=t0, dur=800)
        op.step(n, ts=t0, dur=900)
        op.op("aten::mm", t0 + 100, 250)
        kern.step(n, ts=t0, dur=1000)
        kern.op("aten::mm", t0 + 100, 300)
        kern.launch("gemm", t0 + 200, 300, launch_ts=t0 + 150, launch_dur=10)
    runs = []
    for level, tb, us in (("model", model, 800), ("op", op, 900), ("kernel", kern, 1000)):
        store = tb.store(tmp_path / "runs", name=level)
        runs.append(LevelRun(level, [store], [(0, 1, us * 1000), (0, 2, us * 1000)]))
    out = tmp_path / "out"
    out.mkdir()
    res = merge(runs, out)
    tree = res.tree.set_index("key")
    mm = "step › aten::mm#0"
    call = f"{mm} › cudaLaunchKernel#0"
    gemm = f"{call} › gemm#0"
    assert tree.at[mm, "timed_by"] == "op" and tree.at[mm, "time_ns"] == 250_000
    assert tree.at[call, "timed_by"] == "kernel" and tree.at[gemm, "timed_by"] == "kernel"
    assert tree.at[gemm, "time_ns"] == 300_000
    assert list(res.levels["level"]) == ["model", "op", "kernel"]
    # by hand: the step 800; mm (250) gets 550 of spare time as the kernel run's gaps (100
    # before, 600 after): mm at 550 * 100/700; the call (10) inside mm's 250 at 240 * 50/290
    # after mm's start; the kernel 50 µs after its call, 300 long
    mm_at = 550 * 100 / 700
    call_at = mm_at + 240 * 50 / 290
    with xpuprof.load(res.merged) as m:
        ev = m.sql("select name, level, ts, dur from events where dur is not null order by ts")
        t0 = ev["ts"].min()
        got = {n: ((ts - t0) / 1e3, d / 1e3) for n, ts, d in
               zip(ev["name"], ev["ts"], ev["dur"], strict=True)}  # fmt: skip
        from xpuprof.ui import tools

        kernels = tools.run("overview", m).tables["top_kernels"]
    assert got["aten::mm"][0] == pytest.approx(mm_at, abs=0.002)
    assert got["cudaLaunchKernel"][0] == pytest.approx(call_at, abs=0.002)
    assert got["gemm"] == (pytest.approx(call_at + 50, abs=0.002), 300)
    # the kernel still belongs to its launch in the merged store
    assert list(kernels["kernel"]) == ["gemm"]


# -- real runs ---------------------------------------------------------------------------------


def _times_ns(fn, n: int) -> list[int]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return times


def _median_ns(fn, n: int) -> tuple[float, float, float]:
    return median_interval(_times_ns(fn, n))


def _fastest_per_kind(step, net, leveled, out: Path) -> dict[str, float]:
    """8 rounds of 10 plain steps and a 10-step leveled run of each level; each kind's
    fastest step (ns)."""
    fastest = {"plain": math.inf, "model": math.inf, "layer": math.inf, "op": math.inf}
    for r in range(8):
        _times_ns(step, 5)  # untimed: the first steps after a run that wrote a store
        fastest["plain"] = min(fastest["plain"], min(_times_ns(step, 10)))
        for lv in ("model", "layer", "op"):
            run = leveled(step, (lv,), model=net, out=out / f"r{r}{lv}", warmup=5,
                          min_steps=10, max_steps=10).runs[0]  # fmt: skip
            fastest[lv] = min(fastest[lv], min(run.times_ns))
    return fastest


def test_leveled_real_training_step(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    from xpuprof.live.leveled import leveled

    # many small modules: each module call costs the layer level a hook (~2.5 µs), so its
    # overhead stands above this machine's noise, as the op level's does
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
                                for _ in range(48)])  # fmt: skip
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x, y = torch.randn(4, 16), torch.randn(4, 16)

    def step() -> None:
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # the modules whose forward runs, found by hooks of the test's own
        called: set[str] = set()
        hooks = [m.register_forward_pre_hook(lambda _m, _i, n=n: called.add(n))
                 for n, m in net.named_modules()]  # fmt: skip
        step()
        for h in hooks:
            h.remove()
        res = leveled(step, ("model", "layer", "op"), model=net, out=tmp_path / "lv",
                      min_steps=10, max_steps=40)  # fmt: skip
        # this VM runs the same step at 2.1 to 4.8 ms in phases of a fraction of a second to
        # seconds (thread CPU time alike: slower execution, not stolen time), so medians of
        # runs a second apart, even within interleaved rounds, were seen out of order. Rounds
        # of a plain loop and a leveled run of each level in turn (10 steps each), then each
        # kind's FASTEST step over all rounds: a level's recording cost is paid by its fastest
        # step too. A kind can still miss the fast phase in all 8 rounds (seen 2 times in 5):
        # up to 3 attempts, the last one's numbers asserted
        for _attempt in range(3):
            fastest = _fastest_per_kind(step, net, leveled, tmp_path / f"a{_attempt}")
            ordered = fastest["model"] < fastest["layer"] < fastest["op"]
            if ordered and abs(fastest["model"] / fastest["plain"] - 1) < 0.1:
                break
    finally:
        torch.set_num_threads(threads)
    lv = res.levels.set_index("level")
    assert list(lv.index) == ["model", "layer", "op"]
    # ordered overheads (module hooks ~2.5 µs per module call; torch.profiler more per op)
    assert fastest["model"] < fastest["layer"] < fastest["op"], fastest
    # the model level agrees with plain timing: within 10 % (the 1 % target is the
    # benchmark's; interleaved in one process, plain and model-level blocks of this step
    # differ by 1-4 % at their fastest); the op level, at +40 % and more here, would not
    assert abs(fastest["model"] / fastest["plain"] - 1) < 0.1, fastest
    # every module whose forward ran is a layer of the merged tree, timed by the layer run
    layers = res.tree[res.tree["level"] == "layer"]
    root = type(net).__name__
    assert {n if n else root for n in called} == set(layers["name"])
    assert set(layers["timed_by"]) == {"layer"}
    # the step in the merged store is the model level's time
    with xpuprof.load(res.merged) as m:
        step = m.sql("select dur from events where level = 'step'")["dur"]
    assert len(step) == 1
    model_steps = res.runs[0].times_ns
    assert step.iat[0] == pytest.approx(sum(model_steps) / len(model_steps), abs=1000)
    saved = json.loads((tmp_path / "lv" / "leveled.json").read_text())
    assert [r["level"] for r in saved["runs"]] == ["model", "layer", "op"]


SCRIPT = """
import sys
import torch
import xpuprof
from xpuprof.workloads.demo import Trainer

torch.set_num_threads(1)
tr = Trainer(batch=2, seq=16, layers=1, d=32)
tr.step()
if sys.argv[1] == "fail" and __import__("os").environ.get("XPUPROF_LEVEL") == "layer":
    raise SystemExit("broken at the layer level")
model = tr.model if sys.argv[1] != "nomodel" else None
with xpuprof.profile("ignored.store", level="full", model=model):
    for i in range(8):
        xpuprof.step(i)
        tr.step()
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "xpuprof.ui.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_leveled_command_reruns_a_script_per_level(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "lv"
    p = _cli("leveled", "-o", str(out), "--levels", "model,layer,op", "--max-runs", "1",
             "--json", "--", sys.executable, str(script), "ok", cwd=tmp_path)  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    levels = {r["level"]: r for r in doc["tables"]["levels"]}
    assert list(levels) == ["model", "layer", "op"]
    # 8 steps marked, the first not counted (settle 1)
    assert {r["steps"] for r in levels.values()} == {7}
    assert not (tmp_path / "ignored.store").exists()  # XPUPROF_OUT won over the script's path
    # each level was recorded as asked, whatever level the script wrote (full)
    for level, has_ops, has_layers in (("model", 0, 0), ("layer", 0, 1), ("op", 1, 1)):
        with xpuprof.load(out / f"{level}.store") as t:
            n = t.sql("select count(*) filter (where level = 'op') ops, count(*) filter "
                      "(where level = 'layer') layers from events")  # fmt: skip
        assert (n["ops"].iat[0] > 0, n["layers"].iat[0] > 0) == (bool(has_ops), bool(has_layers))
    # step times are the stores' step spans: checked against the model store itself
    with xpuprof.load(out / "model.store") as t:
        durs = sorted(t.sql("select dur from events where level = 'step' order by ts")["dur"]
                      .tolist()[1:])  # fmt: skip
    assert levels["model"]["median_ms"] == pytest.approx(median_interval(durs)[0] / 1e6)


TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist, xpuprof
dist.init_process_group("gloo")
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x = torch.randn(8, 32)
with xpuprof.profile(model=net, warmup=1, steps=6):
    for i in range(8):
        xpuprof.step(i)
        loss = net(x).sum()
        opt.zero_grad()
        loss.backward()
        for p in net.parameters():
            dist.all_reduce(p.grad)
        opt.step()
dist.destroy_process_group()
"""


def test_leveled_command_under_torchrun(tmp_path: Path) -> None:
    """``xpuprof leveled -- torchrun --nproc-per-node 2 train.py``: each level's store holds
    both ranks' parts; the levels are measured and merged on rank 0's (step times equal rank
    0's step spans in the model store), and a note says so."""
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    script = tmp_path / "train.py"
    script.write_text(TORCHRUN_SCRIPT)
    out = tmp_path / "lv"
    p = _cli("leveled", "-o", str(out), "--levels", "model,layer", "--max-runs", "1", "--json",
             "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
             str(script), cwd=tmp_path)  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert any("ran 2 ranks" in n and "rank 0" in n for n in doc["notes"])
    with xpuprof.load(out / "model.store") as t:
        assert sorted(t.ranks) == [0, 1]
        durs = t.sql("select dur from events where level = 'step' and rank = 0 order by ts")
    levels = {r["level"]: r for r in doc["tables"]["levels"]}
    assert levels["model"]["steps"] == 5  # 6 steps recorded, the first settles
    assert levels["model"]["median_ms"] == pytest.approx(
        median_interval(sorted(durs["dur"].tolist()[1:]))[0] / 1e6
    )


def test_leveled_command_without_model_and_failing(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    p = _cli("leveled", "-o", str(tmp_path / "a"), "--levels", "model,layer", "--max-runs",
             "1", "--json", "--", sys.executable, str(script), "nomodel", cwd=tmp_path)  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert [r["level"] for r in doc["tables"]["levels"]] == ["model"]
    assert any("model=" in n for n in doc["notes"])
    # a script failing at one level: exit 2, one line naming the level and the script's
    # words, nothing left behind
    out = tmp_path / "b"
    p = _cli("leveled", "-o", str(out), "--levels", "model,layer", "--max-runs", "1", "--",
             sys.executable, str(script), "fail", cwd=tmp_path)  # fmt: skip
    assert p.returncode == 2
    assert "at level layer" in p.stderr and "broken at the layer level" in p.stderr
    assert not out.exists()
    assert not [q for q in tmp_path.iterdir() if ".partial-" in q.name]


def test_bad_arguments(tmp_path: Path) -> None:
    from xpuprof.live.leveled import leveled

    with pytest.raises(XpuprofError, match="unknown level"):
        leveled(lambda: None, ("model", "gpu"))
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    with pytest.raises(XpuprofError, match="not empty"):
        leveled(lambda: None, ("model",), out=tmp_path / "x")
    assert (tmp_path / "x" / "keep.txt").read_text() == "mine"
    p = _cli("leveled", "--target", "0", "--", "true", cwd=tmp_path)
    assert p.returncode == 2 and "--target" in p.stderr


def test_headline_tells_overheads_inside_the_noise() -> None:
    import pandas as pd

    from xpuprof.live.levelmerge import Leveled

    def row(level: str, lo: float, med: float, hi: float, over: float) -> dict:
        return {"level": level, "steps": 20, "median_ms": med, "ci_low_ms": lo,
                "ci_high_ms": hi, "ci_pct": 2.0, "overhead_pct": over}  # fmt: skip

    lv = pd.DataFrame([row("model", 9.8, 10.0, 10.2, 0.0), row("layer", 9.9, 10.1, 10.3, 1.0),
                       row("op", 11.8, 12.0, 12.2, 20.0)])  # fmt: skip
    text = Leveled(Path("x"), [], lv, None, Path("m.store"), [], {}).headline()
    assert text.startswith("Step 10 ms at the model level (median of 20 steps, ±2.0 %)")
    assert "layer +1.0 % (within the intervals)" in text and "op +20.0 %;" in text

"""Steps without ProfilerStep and ranks that are never null (``docs/steps.md``).

What each real trace's steps come from was decided by reading the trace (the survey is written
down per trace below and in ``docs/steps.md``); the windows and the step of each event are
recomputed here from the raw JSON with the ``json`` module, never from xpuprof's output.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from builders import TraceBuilder
from conftest import SHARED_TRACES, shared, us_to_ns

import xpuprof

INFERRED = "xpuprof_inferred_step"

#: steps_from of every real trace, decided by reading it (see docs/steps.md for the why).
REAL = {
    # torch.profiler with a schedule: ProfilerStep#N spans on the host
    "kineto/gpu/a100_rank0of2_nccl.json.gz": "ProfilerStep",
    "kineto/gpu/v100_ns_resolution.json.gz": "ProfilerStep",
    "kineto/gpu/v100_rank1of2_df_index_resolver.json.gz": "ProfilerStep",
    "kineto/gpu/resnet50_v100_2021/num_workers_0.pt.trace.json.gz": "ProfilerStep",
    "kineto/gpu/resnet50_v100_2021/num_workers_4.pt.trace.json.gz": "ProfilerStep",
    "kineto/gpu/dlrm_8rank_v100/worker3_step_12.1694128201557.pt.trace.json.gz": "ProfilerStep",
    "kineto/gpu/mi250_rocm_minitoy.json.gz": "ProfilerStep",
    "kineto/gpu/a100_triton.json.gz": "ProfilerStep",
    "kineto/gpu/a100_cuda_event_sync.json.gz": "ProfilerStep",
    "kineto/cpu/gloo_rank34of300.json.gz": "ProfilerStep",
    "kineto/edge/tiny_base.json.gz": "ProfilerStep",
    "kineto/edge/backward_thread.json": "ProfilerStep",
    "kineto/edge/rank_not_found.json.gz": "ProfilerStep",
    # no ProfilerStep; five host Optimizer.step#SGD.step spans, one per training iteration
    "kineto/gpu/gp100_gpu_user_annotation.json.gz": "Optimizer.step",
    # no step markers; each of the 4 chips runs jit_f 100 times (test_xplane has the detail)
    "xplane/tpu_v6e_4chip_inference.xplane.pb": "XLA module runs",
    # inference requests served by 38 threads (Stage::…forward predictor stages): no loop
    "kineto/gpu/mtia_inference.json.gz": "none",
    # PARAM benchmark harness ([param|…|warmup|forward], [param|…|measure|forward]): timed
    # repetitions of a benchmark, not iterations of a training loop
    "kineto/gpu/a100_alexnet_cuda_sync.json.gz": "none",
    "kineto/gpu/a100_cupti_counters.json.gz": "none",
    "kineto/gpu/a100_simple_add.json.gz": "none",
    "execution_trace/a100_simple_add.kineto.json.gz": "none",
    # a handful of ops and no iteration
    "kineto/gpu/a100_cuda_event_sync_multi_stream.json.gz": "none",
    "kineto/edge/large_integer.json.gz": "none",
    "kineto/edge/old_categories_inference.json.gz": "none",
}


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    """Every trace of ``REAL`` imported once, each in a store of its own."""
    opened: dict[str, object] = {}

    def get(rel: str):
        if rel not in opened:
            store = tmp_path_factory.mktemp("steps") / "s.store"
            xpuprof.import_traces([shared(rel)], store)
            opened[rel] = xpuprof.load(store)
        return opened[rel]

    yield get
    for t in opened.values():
        t.close()


@pytest.mark.parametrize("rel", sorted(REAL))
def test_every_real_trace_says_what_its_steps_come_from(rel, real_store, raw_json) -> None:
    trace = real_store(rel)
    (src,) = trace.sources
    assert src["steps_from"] == REAL[rel]
    assert trace.meta["sources"][0]["rank"] is not None
    assert trace.sql("select count(*) as n from events where rank is null")["n"][0] == 0
    n_steps = trace.sql("select count(*) as n from events where level = 'step'")["n"][0]
    if rel.endswith(".xplane.pb"):
        assert n_steps == 4 * 99
        return
    evs = raw_json(shared(rel))["traceEvents"]
    profiler = [
        e for e in evs
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
        and e.get("cat") != "gpu_user_annotation"
    ]  # fmt: skip
    if REAL[rel] == "ProfilerStep":
        assert n_steps == len(profiler) > 0
        assert trace.sql(f"select count(*) as n from events where category = '{INFERRED}'")[
            "n"
        ][0] == 0  # fmt: skip
    elif REAL[rel] == "none":
        assert not profiler and n_steps == 0
        assert trace.sql("select count(*) as n from events where step is not null")["n"][0] == 0


def test_optimizer_steps_of_a_real_trace_match_the_raw_json(real_store, raw_json) -> None:
    """gp100_gpu_user_annotation: read by hand, one process runs 5 iterations of a small model
    (``aten::to``, two ``aten::linear``, backward on the autograd thread) each ending in a host
    ``Optimizer.step#SGD.step`` (user_annotation; their GPU twins are gpu_user_annotation on
    the device). So 4 steps: from the end of one optimizer step to the end of the next."""
    rel = "kineto/gpu/gp100_gpu_user_annotation.json.gz"
    evs = raw_json(shared(rel), exact=True)["traceEvents"]
    opt = sorted(
        (e for e in evs if e.get("ph") == "X" and e.get("cat") == "user_annotation"
         and e["name"] == "Optimizer.step#SGD.step"),
        key=lambda e: us_to_ns(e["ts"]),
    )  # fmt: skip
    assert len(opt) == 5 and len({(e["pid"], e["tid"]) for e in opt}) == 1
    ends = [us_to_ns(e["ts"]) + us_to_ns(e["dur"]) for e in opt]
    windows = list(zip(ends[:-1], ends[1:], strict=True))
    trace = real_store(rel)
    st = trace.sql(
        "select name, category, tid, step, ts, ts + dur as e, args from events "
        "where level = 'step' order by ts"
    )
    assert list(zip(st.ts, st.e, strict=True)) == windows
    assert st.name.tolist() == [f"step#{k}" for k in range(4)] and st.step.tolist() == [0, 1, 2, 3]
    assert set(st.category) == {INFERRED} and set(st.tid) == {opt[0]["tid"]}
    assert '"steps_from":"Optimizer.step"' in st.args[0]
    # host ops of the process (main and autograd threads) by start time
    pid = opt[0]["pid"]

    def step_at(ts) -> int | None:
        t = us_to_ns(ts)
        hit = [k for k, (a, b) in enumerate(windows) if a <= t < b]
        return hit[0] if hit else None

    want = Counter(step_at(e["ts"]) for e in evs if e.get("ph") == "X"
                   and e.get("cat") == "cpu_op" and e.get("pid") == pid)  # fmt: skip
    got = trace.sql("select step, count(*) as n from events where category = 'cpu_op' group by 1")
    assert {_int(s): n for s, n in zip(got.step, got.n, strict=True)} == dict(want)
    # each step holds one iteration: its zero_grad, two linears and their backward
    for name, n in (("Optimizer.zero_grad#SGD.zero_grad", 1), ("aten::linear", 2),
                    ("autograd::engine::evaluate_function: MmBackward0", 2)):  # fmt: skip
        got = trace.sql(f"select step from events where name = '{name}' and device < 0").step
        assert Counter(map(_int, got)) == {None: n, 0: n, 1: n, 2: n, 3: n}, name
    # kernels take the step of the runtime call that launched them (same correlation id)
    launch = {e["args"]["correlation"]: step_at(e["ts"]) for e in evs
              if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}  # fmt: skip
    kern = Counter(launch.get(e["args"].get("correlation")) for e in evs
                   if e.get("ph") == "X" and e.get("cat") == "kernel")  # fmt: skip
    got = trace.sql("select step, count(*) as n from events where category = 'kernel' group by 1")
    assert {_int(s): n for s, n in zip(got.step, got.n, strict=True)} == dict(kern)


# ----------------------------------------------------------------------------------------------
# synthetic traces: each marker, the order between them, what does not make a step
# ----------------------------------------------------------------------------------------------


def _int(v) -> int | None:
    return None if pd.isna(v) else int(v)


def _steps(trace) -> list[tuple[int, int, int]]:
    df = trace.sql("select step, ts, dur from events where level = 'step' order by ts")
    return [(int(s), int(t), int(d)) for s, t, d in zip(df.step, df.ts, df.dur, strict=True)]


def _step_of(trace, name: str) -> list:
    df = trace.sql(f"select step from events where name = '{name}' order by ts")
    return [_int(s) for s in df.step]


def test_optimizer_steps_make_windows_from_end_to_end(tmp_path) -> None:
    tb = TraceBuilder(rank=None)
    for i, t0 in enumerate((0, 100, 200, 300)):
        tb.op("aten::linear", t0 + 10, 20)
        tb.op("autograd::engine::evaluate_function: MmBackward0", t0 + 40, 20, tid=2)
        tb.annotation("Optimizer.step#SGD.step", t0 + 70, 20)
        tb.op("aten::add_", t0 + 75, 5)  # inside the optimizer step
        if i == 1:  # a second optimizer step nested in the first (a wrapper): not a new step
            tb.annotation("Optimizer.step#SGD.step", t0 + 72, 10)
    tb.launch("k_mm", ts=260, dur=50, launch_ts=212)  # launched in window 1, runs into 2
    tb.x("Optimizer.step#SGD.step", "gpu_user_annotation", 95, 3, pid=0, tid=7)  # device twin
    with tb.load(tmp_path) as t:
        assert t.sources[0]["steps_from"] == "Optimizer.step"
        assert (t.sources[0]["rank"], t.sources[0]["rank_from"]) == (0, "default")
        # ends at 90, 190, 290, 390 µs: three windows
        assert _steps(t) == [(0, 90_000, 100_000), (1, 190_000, 100_000), (2, 290_000, 100_000)]
        assert _step_of(t, "aten::linear") == [None, 0, 1, 2]
        assert _step_of(t, "autograd::engine::evaluate_function: MmBackward0") == [None, 0, 1, 2]
        assert _step_of(t, "aten::add_") == [None, 0, 1, 2]  # the update closes its step
        assert _step_of(t, "k_mm") == [1]
        # the step span is on the optimizer's thread and holds what that thread ran in it
        par = t.sql(
            "select p.name from events c join events p on p.id = c.parent "
            "where c.name = 'aten::linear' order by c.ts"
        )
        assert par.name.tolist() == ["step#0", "step#1", "step#2"]


def test_forward_calls_make_windows_from_start_to_start(tmp_path) -> None:
    tb = TraceBuilder(rank=None)
    for t0 in (0, 100, 200):
        tb.annotation("## forward ##", t0 + 10, 40)
        tb.annotation("DistributedDataParallel.forward", t0 + 12, 30)  # nested: not a step
        tb.x("nn.Module: DLRM_0", "python_function", t0 + 14, 20)
        tb.x("nn.Module: Linear_1", "python_function", t0 + 15, 5)
        tb.op("aten::addmm", t0 + 16, 3)
        tb.annotation("## backward ##", t0 + 55, 30)
    with tb.load(tmp_path) as t:
        assert t.sources[0]["steps_from"] == "forward calls"
        assert _steps(t) == [(0, 10_000, 100_000), (1, 110_000, 100_000)]
        assert _step_of(t, "aten::addmm") == [0, 1, None]
        assert _step_of(t, "## backward ##") == [0, 1, None]
        args = t.sql("select args from events where level = 'step' order by ts").args[0]
        assert '"marker":"## forward ##"' in args


def test_module_spans_make_steps_by_the_most_frequent_root(tmp_path) -> None:
    tb = TraceBuilder(rank=None)
    tb.x("nn.Module: Tokenizer_0", "python_function", 0, 5)  # once, before the loop
    for t0 in (10, 60, 110, 160):
        tb.x("nn.Module: Net_0", "python_function", t0, 20)
        tb.x("nn.Module: Linear_0", "python_function", t0 + 1, 5)
    with tb.load(tmp_path) as t:
        assert t.sources[0]["steps_from"] == "forward calls"
        assert [s[1] for s in _steps(t)] == [10_000, 60_000, 110_000]


def test_explicit_markers_come_first_and_others_are_demoted(tmp_path) -> None:
    tb = TraceBuilder(rank=None)
    tb.step(7, 0, 100)
    tb.step(8, 100, 100)
    tb.x("step#1", "xpuprof_step", 5, 90)  # xpuprof.step spans of the same iterations
    tb.x("step#2", "xpuprof_step", 105, 90)
    for t0 in (0, 100):
        tb.annotation("Optimizer.step#SGD.step", t0 + 80, 10)
    with tb.load(tmp_path) as t:
        assert t.sources[0]["steps_from"] == "ProfilerStep"
        assert _steps(t) == [(7, 0, 100_000), (8, 100_000, 100_000)]
        lv = t.sql("select name, level, step from events where category = 'xpuprof_step'")
        assert lv.level.tolist() == ["annotation", "annotation"]
        assert lv.step.tolist() == [7, 8]
    own = TraceBuilder(rank=None)
    own.x("step#1", "xpuprof_step", 5, 90)
    own.annotation("Optimizer.step#SGD.step", 80, 10)
    own.annotation("Optimizer.step#SGD.step", 180, 10)
    with own.load(tmp_path, "own") as t:
        assert t.sources[0]["steps_from"] == "xpuprof.step"
        assert _steps(t) == [(1, 5_000, 90_000)]


def test_one_marker_makes_no_step(tmp_path) -> None:
    tb = TraceBuilder(rank=None)
    tb.annotation("Optimizer.step#SGD.step", 80, 10)
    tb.x("nn.Module: Net_0", "python_function", 10, 20)
    tb.op("aten::mm", 12, 5)
    with tb.load(tmp_path) as t:
        assert t.sources[0]["steps_from"] == "none"
        assert _steps(t) == []


def test_reimported_unchanged_store_keeps_its_ids(tmp_path) -> None:
    tb = TraceBuilder(rank=None)
    for t0 in (0, 100, 200):
        tb.annotation("Optimizer.step#SGD.step", t0 + 80, 10)
    src = tb.write(tmp_path / "t.json")
    xpuprof.import_traces([src], tmp_path / "a")
    xpuprof.import_traces([src], tmp_path / "b", force=True)
    with xpuprof.load(tmp_path / "a") as a, xpuprof.load(tmp_path / "b") as b:
        q = "select id, index, ts, dur from events where level = 'step' order by id"
        assert a.sql(q).equals(b.sql(q))
        # the inferred spans' indexes follow the source's 3 entries
        assert a.sql(q)["index"].tolist() == [3, 4]


# ----------------------------------------------------------------------------------------------
# ranks
# ----------------------------------------------------------------------------------------------


def test_rank_from_file_name_then_default(tmp_path) -> None:
    tb = TraceBuilder(rank=None)
    tb.op("aten::mm", 0, 10)
    tb.write(tmp_path / "job_worker4.json")
    tb.write(tmp_path / "plain.json")
    xpuprof.import_traces([tmp_path / "job_worker4.json", tmp_path / "plain.json"], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        got = {Path(s["path"]).name: (s["rank"], s["rank_from"]) for s in t.sources}
        assert got == {"job_worker4.json": (4, "file name"), "plain.json": (0, "default")}
    ranked = TraceBuilder(rank=2)
    ranked.op("aten::mm", 0, 10)
    with ranked.load(tmp_path, "rank7") as t:  # distributedInfo wins over the name
        assert (t.sources[0]["rank"], t.sources[0]["rank_from"]) == (2, "distributedInfo")


def test_xplane_hosts_of_one_run_are_ranks_in_host_order(tmp_path) -> None:
    tpu = SHARED_TRACES / "xplane" / "tpu_v6e_4chip_inference.xplane.pb"
    if not tpu.is_file():
        pytest.skip(f"{tpu} not found")
    run = tmp_path / "run"
    run.mkdir()
    for host in ("t1v-n-0-w-10", "t1v-n-0-w-2"):
        shutil.copyfile(tpu, run / f"{host}.xplane.pb")
    xpuprof.import_traces([run], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        got = {Path(s["path"]).name: (s["rank"], s["rank_from"]) for s in t.sources}
        assert got == {
            "t1v-n-0-w-2.xplane.pb": (0, "host order"),  # numbers compare as numbers
            "t1v-n-0-w-10.xplane.pb": (1, "host order"),
        }
        per = t.sql("select rank, device, count(*) as n from events group by all order by all")
        # each rank has its host (-1) and its four chips
        assert per.groupby("rank").device.apply(list).to_dict() == {
            0: [-1, 0, 1, 2, 3], 1: [-1, 0, 1, 2, 3]}  # fmt: skip


@pytest.mark.parametrize("env", [None, "3"])
def test_own_capture_takes_the_rank_of_its_process(tmp_path, monkeypatch, env) -> None:
    if env is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", env)
    with xpuprof.profile(tmp_path / "s", level="step", telemetry=False, framework="none"):
        for i in range(3):
            xpuprof.step(i)
            with xpuprof.annotate("work"):
                pass
    with xpuprof.load(tmp_path / "s") as t:
        src = t.sources[0]
        want = (0, "default") if env is None else (3, "RANK environment variable")
        assert (src["rank"], src["rank_from"]) == want
        assert src["steps_from"] == "xpuprof.step"
        assert t.sql("select count(*) as n from events where rank is null")["n"][0] == 0


def test_every_tool_says_when_its_steps_are_not_profiler_steps(tmp_path) -> None:
    """Inferred steps are the unit of every answer, so each tool that selects steps says what
    they are; a trace with ProfilerStep#N gets no such note, and a multi-rank store whose
    sources disagree names the ranks."""
    from xpuprof.ui import tools

    inferred = TraceBuilder(rank=0)
    for t0 in (0, 100, 200):
        inferred.op("aten::linear", t0 + 10, 20)
        inferred.annotation("Optimizer.step#SGD.step", t0 + 70, 20)
    profiled = TraceBuilder(rank=1)
    profiled.step(3, 0, 100)
    profiled.op("aten::linear", 10, 20)
    paths = [inferred.write(tmp_path / "a.json"), profiled.write(tmp_path / "b.json")]
    xpuprof.import_traces(paths, tmp_path / "both.store")
    says = "steps inferred from Optimizer.step spans"
    with xpuprof.load(tmp_path / "both.store") as t:
        for name in ("overview", "breakdown", "stats", "input", "critical-path", "idle"):
            notes = tools.run(name, t, ranks=[0]).notes
            assert sum(n.startswith(says) for n in notes) == 1, (name, notes)
            assert not any("steps inferred" in n for n in tools.run(name, t, ranks=[1]).notes)
        both = [n for n in tools.run("overview", t).notes if n.startswith(says)]
        assert both == [both[0]] and both[0].endswith("(rank 0)")
        assert not any("steps inferred" in n for n in tools.run("info", t).notes)

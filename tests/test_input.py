"""Input detection (``docs/steps.md``, Input): DataLoader spans of both iterators on real
traces, TorchRec's pipeline stages under their real names, user patterns, and a real CPU
capture at ``level="layer"`` of the demo model fed by a DataLoader whose collate sleeps.

Expected numbers come from the raw JSON (``json`` module, interval sums written here), from the
test's own stopwatch around ``next(loader)``, or by hand from the spans a test writes.
"""

from __future__ import annotations

import pandas as pd
import pytest
from builders import TraceBuilder
from captures import SLEEP_S, capture_layer_level
from conftest import shared, us_to_ns

import xpuprof
from xpuprof.analysis.input_pipeline import (
    INPUT_PATTERNS,
    InputPattern,
    classify,
    input_pipeline,
    input_spans,
)
from xpuprof.core.errors import XpuprofError

RESNET = "kineto/gpu/resnet50_v100_2021/num_workers_{}.pt.trace.json.gz"
DEVICE_CATS = {"Kernel", "Memcpy", "Memset"}  # the 2021 format's device categories


def _union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _overlap(a: tuple[int, int], merged: list[tuple[int, int]]) -> int:
    return sum(max(0, min(a[1], e) - max(a[0], s)) for s, e in merged)


def _resnet_by_hand(doc: dict) -> pd.DataFrame:
    """Per ProfilerStep of a 2021 ResNet-50 trace: its duration, the DataLoader span inside
    it, and the part of that span when no kernel, copy or set ran on the GPU."""
    evs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    busy = _union(
        [
            (us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
            for e in evs
            if e.get("cat") in DEVICE_CATS and us_to_ns(e["dur"]) > 0
        ]
    )
    rows = []
    for s in (e for e in evs if str(e["name"]).startswith("ProfilerStep#")):
        t0 = us_to_ns(s["ts"])
        t1 = t0 + us_to_ns(s["dur"])
        (dl,) = [
            e
            for e in evs
            if e["name"].startswith("enumerate(DataLoader)#") and t0 <= us_to_ns(e["ts"]) < t1
        ]
        a = us_to_ns(dl["ts"])
        b = a + us_to_ns(dl["dur"])
        rows.append(
            {"step": int(s["name"].split("#")[1]), "step_ns": t1 - t0, "host": b - a,
             "wait": (b - a) - _overlap((a, b), busy)}
        )  # fmt: skip
    return pd.DataFrame(rows).set_index("step")


@pytest.mark.parametrize("workers", [0, 4])
def test_resnet_dataloader_input_matches_the_raw_json(workers, raw_json) -> None:
    """Read by hand: both runs are ResNet-50 on a V100, 6 ProfilerSteps, one DataLoader span
    in each. With ``num_workers=0`` the main process loads and decodes the batch itself: the
    span takes 63-73 ms of 164-181 ms steps, while the GPU has finished the previous step's
    work (idle 49-69 ms of it): input-bound. With ``num_workers=4`` the workers have the batch
    ready: the span takes 0.08-4.3 ms and the GPU is mostly still busy: not input-bound.
    The query that shows it::

        select step, dur from events where name like 'enumerate(DataLoader)%' order by step
    """
    path = shared(RESNET.format(workers))
    doc = raw_json(path, exact=True)
    want = _resnet_by_hand(doc)
    with xpuprof.load(path) as t:
        q = t.sql(
            "select step, dur from events where name like 'enumerate(DataLoader)%' order by step"
        ).set_index("step")
        assert q.dur.to_dict() == want.host.to_dict()
        res = input_pipeline(t)
        spans = input_spans(t)
    per = res["steps"].set_index("step")
    assert per.step_ns.to_dict() == want.step_ns.to_dict()
    assert per.input_host_ns.to_dict() == want.host.to_dict()
    assert per.input_ns.to_dict() == want.wait.to_dict()
    frac = want.wait.sum() / want.step_ns.sum()
    assert res.facts["input_fraction"] == pytest.approx(frac)
    name = "_SingleProcessDataLoaderIter" if workers == 0 else "_MultiProcessingDataLoaderIter"
    assert set(spans.name) == {f"enumerate(DataLoader)#{name}.__next__"}
    assert set(spans.kind) == {"dataloader"}
    assert len(spans) == 6 and spans["id"].notna().all()
    if workers == 0:
        assert frac > 0.25 and (per.classification == "highly input-bound").all()
        assert res["summary"].classification.iloc[0] == "highly input-bound"
    else:
        assert frac < 0.01 and (per.classification == "not input-bound").all()
    assert res.facts["headline"].startswith(f"Input: {frac:.0%} of step time")


def test_steps_and_ranks_select_rows(raw_json) -> None:
    path = shared(RESNET.format(0))
    with xpuprof.load(path) as t:
        assert input_spans(t, steps=[6, 8]).step.tolist() == [6, 8]
        assert input_spans(t, ranks=[1]).empty
        assert input_pipeline(t, steps="drop-last")["steps"].step.tolist() == [5, 6, 7, 8, 9]


def test_dlrm_torchrec_stages_are_input(raw_json) -> None:
    """Read by hand: each DLRM rank runs TorchRec's TrainPipelineSparseDist (2023): in its one
    ProfilerStep, ``## copy_batch_to_gpu ##`` (holding the DataLoader's ``__next__``),
    ``## wait_for_batch ##``, ``## wait_sparse_data_dist ##`` (inside ``## forward ##``) and
    ``## sparse_data_dist ##`` (the next batch's input distribution); forward, backward and
    optimizer are not input."""
    path = shared("kineto/gpu/dlrm_8rank_v100/worker0_step_12.1694128201545.pt.trace.json.gz")
    evs = raw_json(path, exact=True)["traceEvents"]
    names = ["## copy_batch_to_gpu ##", "## wait_for_batch ##", "## wait_sparse_data_dist ##",
             "## sparse_data_dist ##"]  # fmt: skip
    host = {e["name"]: us_to_ns(e["dur"]) for e in evs
            if e.get("cat") == "user_annotation" and e.get("name") in names}  # fmt: skip
    assert set(host) == set(names)
    with xpuprof.load(path) as t:
        spans = input_spans(t)
        res = input_pipeline(t)
    assert spans.set_index("name").dur.to_dict() == host
    assert set(spans.kind) == {"torchrec"}
    # the DataLoader span is inside copy_batch_to_gpu: counted once, in the outer span
    assert not spans.name.str.startswith("enumerate(DataLoader)").any()
    assert res["steps"].input_host_ns.iloc[0] == sum(host.values())  # they do not overlap


def _torchrec_trace() -> TraceBuilder:
    """One step of TorchRec's TrainPipelineSparseDist as its current source names its spans
    (torchrec/distributed/train_pipeline/train_pipelines.py), 1 µs units."""
    tb = TraceBuilder(rank=0)
    tb.step(3, 0, 1000)
    tb.annotation("## zero_grad ##", 0, 10)
    tb.annotation("## wait_for_batch 3 ##", 10, 40)
    tb.annotation("## start_sparse_data_dist 4 ##", 50, 100)
    tb.annotation("## copy_batch_to_gpu 5 ##", 150, 200)
    tb.annotation("## next_batch ##", 160, 150)
    tb.annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 170, 130)
    tb.annotation("## forward 3 ##", 350, 300)
    tb.launch("gemm", ts=400, dur=300, launch_ts=360)  # the device computes from 400 to 700
    tb.annotation("## wait_sparse_data_dist 4 ##", 650, 100)  # 650-750: device busy to 700
    tb.annotation("## backward 3 ##", 750, 150)
    tb.annotation("## optimizer 3 ##", 900, 50)
    tb.annotation("## sparse_data_dist ##", 950, 20)  # the 2023 name
    tb.annotation("## _prefetch_embeddings 4 ##", 970, 20)  # not input: embedding cache
    return tb


def test_torchrec_pipeline_stages_by_their_real_names(tmp_path) -> None:
    with _torchrec_trace().load(tmp_path) as t:
        spans = input_spans(t)
        res = input_pipeline(t)
    assert list(zip(spans.name, spans.kind, spans.dur // 1000, strict=True)) == [
        ("## wait_for_batch 3 ##", "torchrec", 40),
        ("## start_sparse_data_dist 4 ##", "torchrec", 100),
        ("## copy_batch_to_gpu 5 ##", "torchrec", 200),  # holds next_batch and the DataLoader
        ("## wait_sparse_data_dist 4 ##", "torchrec", 100),
        ("## sparse_data_dist ##", "torchrec", 20),
    ]
    row = res["steps"].iloc[0]
    assert row.input_host_ns == 460_000
    assert row.input_ns == 410_000  # 650-700 of wait_sparse_data_dist had the GPU busy
    assert row.input_fraction == pytest.approx(0.41)
    assert row.classification == "highly input-bound"
    assert res.facts["input_kinds"] == "torchrec"


def test_patterns_are_listed_and_extensible(tmp_path) -> None:
    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 100)
    tb.annotation("decode_jpeg", 0, 30)
    tb.annotation("Load_Batch", 40, 10)  # user names: any case
    tb.op("aten::conv2d", 50, 40)
    with tb.load(tmp_path) as t:
        assert input_spans(t).name.tolist() == ["Load_Batch"]
        mine = [*INPUT_PATTERNS, InputPattern("annotation", "^decode_jpeg$", "my reader")]
        assert input_spans(t, patterns=mine).name.tolist() == ["decode_jpeg", "Load_Batch"]
        assert input_spans(t, patterns=["decode"]).name.tolist() == ["decode_jpeg"]
        res = input_pipeline(t, pattern="decode_jpeg")  # the CLI's --pattern adds one
        assert res["steps"].input_ns.iloc[0] == 40_000
        with pytest.raises(XpuprofError, match="not a regular expression"):
            input_spans(t, patterns=["("])
    kinds = {p.kind for p in INPUT_PATTERNS}
    assert kinds == {"dataloader", "torchrec", "annotation"}


def test_no_input_spans_is_said_without_empty_tables(tmp_path) -> None:
    tb = TraceBuilder(rank=0)
    tb.step(0, 0, 100)
    tb.op("aten::mm", 10, 50)
    with tb.load(tmp_path) as t:
        res = input_pipeline(t)
        assert input_spans(t).empty
    assert set(res.tables) == {"summary"}  # no table of zeros
    assert res["summary"].input_ns.tolist() == [0] and res["summary"].steps.tolist() == [1]
    assert "no input spans found" in res.notes[0]
    assert res.facts["input_fraction"] == 0.0


# ----------------------------------------------------------------------------------------------
# a real capture at level="layer": the DataLoader leaves no span, its time is between-ops
# ----------------------------------------------------------------------------------------------


def _capture(tmp_path, idiom: str) -> tuple[object, list[float]]:
    """The demo model fed by a real DataLoader whose collate sleeps 30 ms, captured at level
    ``layer`` (``captures.capture_layer_level``)."""
    return capture_layer_level(tmp_path, idiom)


@pytest.mark.parametrize("idiom", ["with", "top"])
def test_slow_collate_at_level_layer_is_input(tmp_path, idiom) -> None:
    store, waited = _capture(tmp_path, idiom)
    with xpuprof.load(store) as t:
        assert t.sql("select count(*) as n from events where level = 'op'")["n"][0] == 0
        assert t.sources[0]["steps_from"] == "xpuprof.step"
        res = input_pipeline(t)
        spans = input_spans(t)
        steps = t.sql("select step, dur from events where level = 'step' order by step")
    per = res["steps"].set_index("step")
    # "with": the first batch is fetched before the first step exists, so steps 1-5 only
    first = 1 if idiom == "with" else 0
    for i in range(first, 6):
        assert per.loc[i, "input_ns"] == pytest.approx(waited[i] * 1e9, rel=0.1, abs=2e6)
        assert per.loc[i, "input_ns"] >= SLEEP_S * 1e9
    # never the backward pass or the optimizer: input stays within the stopwatch's total
    assert per.input_ns.sum() <= sum(waited) * 1e9 + 6 * 2e6
    assert set(spans.kind) == {"between-ops"} and spans["id"].isna().all()
    assert any("capture level step or layer" in n for n in res.notes)
    if idiom == "with":
        # the fetch lies between step spans: the step's time starts where its input starts
        assert (per.step_ns.iloc[1:].to_numpy() > steps.dur.iloc[1:].to_numpy()).all()
    assert res.facts["input_fraction"] > 0.05
    assert classify(res.facts["input_fraction"]) != "not input-bound"

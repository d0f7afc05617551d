"""Temporal, kernel-type, overlap and idle-time breakdowns: hand-computed numbers on a small
trace written here, and agreement with Holistic Trace Analysis 0.5.0 on the shared real traces.

HTA's numbers are in ``tests/data/hta/breakdown/<case>.json``, written by
``scripts/hta_reference_breakdown.py`` (run with HTA's own interpreter; the command, HTA version
and date are in each file). For each case:

* ``hta_compatible=True`` (every HTA behaviour switched on) agrees with HTA within 1 % on
  every number HTA computed (or within HTA's resolution of 1 µs);
* our default agrees within 1 % too, except where ``EXPLAINED`` says why it does not: there, the
  named HTA behaviours (``xpuprof.analysis.breakdown.QUIRKS``), switched on alone on top of our
  default, bring it within 1 % of HTA, which shows that these behaviours — and nothing else —
  make the difference; and the entry is needed (our default does disagree there).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from builders import TraceBuilder
from conftest import SHARED_TRACES

from xpuprof.analysis.breakdown import (
    QUIRKS,
    breakdown,
    comm_overlap,
    device_work,
    kernel_breakdown,
    temporal_breakdown,
)
from xpuprof.analysis.idle import idle_time
from xpuprof.core.errors import XpuprofError
from xpuprof.trace.ingest import import_traces
from xpuprof.trace.trace import Trace

REF = Path(__file__).resolve().parent / "data" / "hta" / "breakdown"
CASES = sorted(p.stem for p in REF.glob("*.json"))

#: Why our default differs from HTA 0.5.0, per case and analysis: the HTA behaviours that
#: explain it (see QUIRKS in xpuprof/analysis/breakdown.py for what each one is).
#:
#: round_us — HTA rounds every event of a file with fractional µs timestamps inward to whole
#:   µs (ceil start, floor end): a 1.6 µs memcpy becomes 1 µs or 0, fake 1–2 µs gaps appear
#:   between back-to-back kernels (v100_ns_resolution: idle 10,113 µs vs 6,453 µs exact).
#: stream_arg — HTA's device work is whatever has a ``stream`` arg: it counts a Triton
#:   ``cpu_op`` (94 µs on the host) as a GPU kernel, ``cuda_sync`` waits and HIP runtime calls
#:   as GPU busy time, and misses ``cuda_profiler_range`` kernels (no stream arg), on which its
#:   temporal and idle breakdowns raise.
#: launch_lookup — a kernel whose launch call is outside the trace gets the file's first
#:   event as its launch (index_correlation = 0), so HTA calls its gap host_wait.
#: launch_names — HTA's launch statistics know cudaLaunchKernel(ExC), cudaMemcpyAsync,
#:   cudaMemsetAsync and MTIA's runFunction only (not hipLaunchKernel, cuLaunchKernel, MTIA's
#:   enqueueCommand…).
#: sort_ties — HTA orders equal µs timestamps as pandas' unstable quicksort leaves them, which
#:   moves the queue-length mean by 1–3 % on traces with whole-µs timestamps.
EXPLAINED: dict[str, dict[str, set[str]]] = {
    "a100_cuda_event_sync": {"temporal": {"stream_arg"}},  # a 5 µs cuda_sync as busy time
    "a100_cupti_counters": {"types": {"stream_arg"}},  # HTA sees no kernel at all
    # a 2 µs "Stream Wait Event" (cuda_sync) is a COMPUTATION kernel to HTA (no "Sync" in it)
    "a100_cuda_event_sync_multi_stream": {"kernels": {"stream_arg", "name_types"}},
    "a100_rank0of2_nccl": {
        f: {"round_us"} for f in ("temporal", "types", "kernels", "overlap", "idle", "launch")
    },
    "a100_simple_add": {
        "temporal": {"stream_arg"},  # cuda_sync events stretch the span
        "queue": {"sort_ties"},
    },
    # the host cpu_op with "stream": 0 (94 µs) is HTA's only long "kernel"; its name makes it
    # COMPUTATION; the real 1.76 µs kernel is rounded
    "a100_triton": {
        "temporal": {"stream_arg", "name_types", "round_us"},
        "types": {"stream_arg", "name_types", "round_us"},
        "kernels": {"stream_arg", "name_types", "round_us"},
        "launch": {"launch_names"},  # its launch is a cuLaunchKernel
    },
    "dlrm_8rank_v100": {"idle": {"launch_lookup"}, "queue": {"sort_ties"}},
    # no ProfilerStep: our steps are inferred from its 5 Optimizer.step spans (docs/steps.md)
    # and drop-last drops the last of them; HTA knows steps only from ProfilerStep#N, so it
    # keeps the whole trace
    "gp100_gpu_user_annotation": {
        f: {"step_filter"} for f in ("temporal", "types", "kernels", "idle", "launch", "queue")
    },
    "mi250_rocm_minitoy": {
        "temporal": {"round_us"},
        "types": {"round_us"},
        "kernels": {"round_us"},
        "launch": {"launch_names"},  # hipLaunchKernel
    },
    "mtia_inference": {
        "temporal": {"round_us"},
        "types": {"round_us"},
        "kernels": {"round_us"},  # event_record: 99 µs exact, −198 µs after HTA's rounding
        "idle": {"round_us"},
        "launch": {"launch_names", "round_us"},
        "queue": {"launch_names"},
    },
    "v100_ns_resolution": {
        f: {"round_us"} for f in ("temporal", "types", "kernels", "idle", "launch")
    },
}

#: Analyses HTA raises on (recorded in the reference file), and why.
HTA_RAISES = {
    # cuda_profiler_range kernels have no stream arg: HTA's GPU event set is empty, and its
    # temporal breakdown indexes the first merged interval of nothing (IndexError), its idle
    # breakdown concatenates no stream (ValueError)
    "a100_cupti_counters": {"temporal_breakdown", "idle_time_breakdown"},
}

#: Number families compared, one per HTA analysis.
FAMILIES = ("temporal", "types", "kernels", "overlap", "idle", "launch", "queue")


# ---------------------------------------------------------------------------- comparison


def _rel_ok(ours: float, theirs: float | None, tol: float = 0.01, abs_tol: float = 0.0) -> bool:
    if theirs is None or (isinstance(theirs, float) and math.isnan(theirs)):
        return ours is None or (isinstance(ours, float) and math.isnan(ours)) or pd.isna(ours)
    if pd.isna(ours):
        return False
    d = abs(float(ours) - float(theirs))
    return d <= abs_tol or d <= tol * abs(float(theirs))


def _hta_rank(r: Any) -> int:
    return 0 if pd.isna(r) else int(r)  # HTA gives a file without a rank rank 0


def compare(trace: Trace, ref: dict[str, Any], hta: bool | set[str]) -> dict[str, list[str]]:
    """Every number HTA computed for this case against ours: family → disagreements (an
    analysis HTA raised on has no numbers to compare)."""
    out: dict[str, list[str]] = {f: [] for f in FAMILIES}
    err = ref["errors"]

    def chk(fam: str, what: str, ours: Any, theirs: Any, abs_tol: float = 1.0) -> None:
        if not _rel_ok(ours, theirs, abs_tol=abs_tol):
            out[fam].append(f"{what}: ours {ours} HTA {theirs}")

    # our default is every step; HTA's (recorded here) drops the last one
    if "temporal_breakdown" not in err:
        tb = temporal_breakdown(trace, steps="drop-last", hta_compatible=hta)["temporal"]
        tb.index = [_hta_rank(r) for r in tb["rank"]]
        for r in ref["temporal_breakdown"]:
            if r["rank"] not in tb.index:
                out["temporal"].append(f"rank {r['rank']} missing")
                continue
            row = tb.loc[r["rank"]]
            for a, b in (
                ("idle_ns", "idle_time(us)"),
                ("compute_ns", "compute_time(us)"),
                ("non_compute_ns", "non_compute_time(us)"),
                ("span_ns", "kernel_time(us)"),
            ):
                chk("temporal", f"rank {r['rank']} {a}", row[a] / 1000, r[b])
            for a, b in (("idle_pct", "idle_time_pctg"), ("compute_pct", "compute_time_pctg")):
                chk("temporal", f"rank {r['rank']} {a}", row[a], r[b], abs_tol=0.01)
    kb = kernel_breakdown(trace, steps="drop-last", hta_compatible=hta)
    ours_types = dict(zip(kb["types"]["kernel_type"], kb["types"]["time_ns"] / 1000, strict=True))
    ref_types = {r["kernel_type"]: r["sum"] for r in ref.get("kernel_type_breakdown") or []}
    for k in set(ours_types) | set(ref_types):
        chk("types", f"type {k}", ours_types.get(k, 0.0), ref_types.get(k, 0))
    if hta is True and ref.get("kernel_breakdown") is not None:
        k = kb["kernels"]
        key = [
            (_hta_rank(r), t, hashlib.sha1(n.encode()).hexdigest()[:12])
            for r, t, n in zip(k["rank"], k["kernel_type"], k["name"], strict=True)
        ]
        ours_k = dict(zip(key, k[["sum", "max", "min", "mean"]].to_numpy() / 1000, strict=True))
        for r in ref["kernel_breakdown"]:
            kk = (r["rank"], r["kernel_type"], r["name_sha1"])
            if kk not in ours_k:
                out["kernels"].append(f"missing {kk} {r['name']}")
                continue
            for v, col in zip(
                ours_k[kk], ("sum (us)", "max (us)", "min (us)", "mean (us)"), strict=True
            ):
                chk("kernels", f"{r['name'][:40]} {col}", v, r[col])
        if len(ours_k) != len(ref["kernel_breakdown"]):
            out["kernels"].append(f"{len(ours_k)} rows, HTA {len(ref['kernel_breakdown'])}")
    elif ref.get("kernel_breakdown") is not None:
        # our own table: the time of each kernel HTA lists by name (its "others" row folds
        # names by its own rule, and its max/min/mean of folded tables are not per kernel)
        k = kb["kernels"]
        col = "sum_ns" if "sum_ns" in k else "sum"
        sums = {
            (_hta_rank(r), t, hashlib.sha1(n.encode()).hexdigest()[:12]): v / 1000
            for r, t, n, v in zip(k["rank"], k["kernel_type"], k["name"], k[col], strict=True)
        }
        for r in ref["kernel_breakdown"]:
            if r["name"] != "others":
                kk = (r["rank"], r["kernel_type"], r["name_sha1"])
                chk("kernels", f"{r['name'][:40]} sum", sums.get(kk, 0.0), r["sum (us)"])
    ov = comm_overlap(trace, steps="drop-last", hta_compatible=hta)["overlap"]
    ovd = {_hta_rank(r): v for r, v in zip(ov["rank"], ov["overlap_pct"], strict=True)}
    for r in ref.get("comm_comp_overlap") or []:
        chk(
            "overlap",
            f"rank {r['rank']}",
            ovd.get(r["rank"], float("nan")),
            r["comp_comm_overlap_pctg"],
            abs_tol=0.01,
        )
    it = idle_time(trace, steps="drop-last", hta_compatible=hta)
    if "idle_time_breakdown" not in err:
        b = it["breakdown"]
        bi = {
            (_hta_rank(r), int(s), c): v / 1000
            for r, s, c, v in zip(
                b["rank"], b["stream"], b["idle_category"], b["idle_ns"], strict=True
            )
        }
        for r in ref["idle_time_breakdown"]:
            kk = (r["rank"], r["stream"], r["idle_category"])
            chk("idle", f"{kk}", bi.get(kk, 0.0), r["idle_time"])
    ls = it["launch_summary"]
    lsd = {_hta_rank(r): row for r, (_, row) in zip(ls["rank"], ls.iterrows(), strict=True)}
    for rk, r in (ref.get("launch_stats") or {}).items():
        row = lsd.get(int(rk))
        if row is None:
            if r["count"]:
                out["launch"].append(f"rank {rk}: no launches, HTA {r['count']}")
            continue
        for a, b, scale in (
            ("launches", "count", 1),
            ("cpu_ns", "cpu_duration_sum", 1000),
            ("gpu_ns", "gpu_duration_sum", 1000),
            ("launch_delay_ns", "launch_delay_sum", 1000),
            ("short_kernels", "short_kernels", 1),
            ("runtime_outliers", "runtime_outliers", 1),
            ("launch_delay_outliers", "launch_delay_outliers", 1),
        ):
            chk("launch", f"rank {rk} {a}", row[a] / scale, r[b], abs_tol=0 if scale == 1 else 1)
    q = it["queue_length"]
    qg = q.assign(rank=[_hta_rank(r) for r in q["rank"]]).groupby(["rank", "stream"])
    qd = qg.agg({"count": "sum", "mean": "mean", "max": "max"})
    for r in ref.get("queue_length_summary") or []:
        kk = (r["rank"], r["stream"])
        if kk not in qd.index:
            out["queue"].append(f"{kk} missing")
            continue
        for a in ("count", "mean", "max"):
            chk("queue", f"{kk} {a}", qd.loc[kk, a], r[a], abs_tol=0)
    return out


# ---------------------------------------------------------------------------- real traces


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    cache: dict[str, Trace] = {}

    def get(case: str) -> tuple[Trace, dict[str, Any]]:
        ref = json.loads((REF / f"{case}.json").read_text())
        if case not in cache:
            files = [SHARED_TRACES / s for s in ref["sources"]]
            missing = [str(f) for f in files if not f.exists()]
            if missing:
                pytest.skip(
                    f"shared traces not found ({missing[0]}): the agreement tests read "
                    f"{SHARED_TRACES} (../shared/traces relative to the project root)"
                )
            out = tmp_path_factory.mktemp(case) / "store"
            import_traces(files, out)
            cache[case] = Trace(out)
        return cache[case], ref

    yield get
    for t in cache.values():
        t.close()


def test_reference_files_are_complete():
    """Every case names its command, HTA version and date; the set covers the shared GPU
    traces HTA can load (all of them, as one case per file and one for the DLRM ranks)."""
    assert len(CASES) >= 15
    for case in CASES:
        ref = json.loads((REF / f"{case}.json").read_text())
        assert ref["hta_version"] == "0.5.0"
        assert "scripts/hta_reference_breakdown" in ref["command"]
        assert ref["date"] and ref["sources"]
        assert "load" not in ref["errors"], f"{case}: HTA could not load it"


@pytest.mark.parametrize("case", CASES)
def test_hta_compatible_reproduces_hta(stores, case):
    trace, ref = stores(case)
    assert set(ref["errors"]) == HTA_RAISES.get(case, set()), ref["errors"]
    probs = compare(trace, ref, True)
    assert not any(probs.values()), {f: p[:5] for f, p in probs.items() if p}


@pytest.mark.parametrize("case", CASES)
def test_default_agrees_with_hta_or_the_difference_is_explained(stores, case):
    trace, ref = stores(case)
    probs = compare(trace, ref, False)
    why = EXPLAINED.get(case, {})
    unexplained = {f: p[:5] for f, p in probs.items() if p and f not in why}
    assert not unexplained, f"{case}: disagreements no entry of EXPLAINED covers"
    for fam, quirks in why.items():
        assert quirks <= set(QUIRKS)
        assert probs[fam], f"{case}/{fam}: ours agrees with HTA; the EXPLAINED entry is stale"
        fixed = compare(trace, ref, quirks)[fam]
        assert not fixed, (
            f"{case}/{fam}: switching on {sorted(quirks)} does not explain the difference",
            fixed[:5],
        )


# --------------------------------------------------------------- a small trace, by hand

US = 1000  # ns


def small_trace(*, steps: bool = True) -> TraceBuilder:
    """Two steps; five kernels launched in step 1 on streams 7 and 20, one in step 2 (µs):

    stream 7:  A [40, 60)  B [85, 95)                F [150, 160)   D [120, 130) (step 2)
    stream 20:        C [50, 75) (NCCL)   E [96, 98)
    launches:  A@10 B@20 C@30 F@40 E@90 D@110, each 5 µs on the host
    """
    tb = TraceBuilder(rank=0, world_size=1)
    if steps:
        tb.step(1, 0, 100)
        tb.step(2, 100, 100)
    for ts, corr in ((10, 1), (20, 2), (30, 3), (40, 6), (90, 5), (110, 4)):
        tb.runtime("cudaLaunchKernel", ts, 5, correlation=corr)
    tb.kernel("gemm_a", 40, 20, stream=7, correlation=1)
    tb.kernel("gemm_b", 85, 10, stream=7, correlation=2)
    tb.kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 50, 25, stream=20, correlation=3)
    tb.kernel("gemm_d", 120, 10, stream=7, correlation=4)
    tb.kernel("elementwise_e", 96, 2, stream=20, correlation=5)
    tb.kernel("gemm_f", 150, 10, stream=7, correlation=6)
    return tb


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    with small_trace().load(tmp_path_factory.mktemp("small"), "small.pt.trace") as t:
        yield t


#: The temporal breakdown of ``small`` with drop-last, in one sentence: of the 120 µs span the
#: device computes 42 (35%), runs the NCCL kernel alone 15 (12.5%, shown 12%: halves round to
#: even) and idles 63 (52.5%, shown 52%).
SMALL_HEADLINE = ("The device computes 35% of the 120 µs traced on rank 0, runs other work "
                  "(communication, memory) 12% and is idle 52%")  # fmt: skip


def test_small_temporal_by_hand(small):
    # drop-last leaves out D (launched in step 2). Busy: [40,75) ∪ [85,95) ∪ [96,98) ∪
    # [150,160) = 57 of the span 40..160 = 120, so idle 63; compute A+B+E+F = 42; the rest
    # (the NCCL kernel outside [50,60)) 15.
    res = temporal_breakdown(small, steps="drop-last")
    tb = res["temporal"]
    row = tb.iloc[0]
    assert (row["span_ns"], row["idle_ns"], row["compute_ns"], row["non_compute_ns"]) == (
        120 * US,
        63 * US,
        42 * US,
        15 * US,
    )
    assert row["idle_pct"] == pytest.approx(100 * 63 / 120)
    assert row["device_events"] == 5
    assert any("last step dropped" in n for n in res.notes)
    assert res.facts == {"device_events": 5, "steps": "drop-last", "hta_compatible": False,
                         "headline": SMALL_HEADLINE}  # fmt: skip
    # every step: D [120,130) is busy compute time too
    allr = temporal_breakdown(small, steps="all")["temporal"].iloc[0]
    assert (allr["idle_ns"], allr["compute_ns"], allr["device_events"]) == (53 * US, 52 * US, 6)
    # every step is the default, as in every tool; hta_compatible defaults to HTA's drop-last
    default = temporal_breakdown(small)
    assert default["temporal"].iloc[0]["idle_ns"] == 53 * US
    assert default.facts["steps"] == "all" and not default.notes
    hta = temporal_breakdown(small, hta_compatible=True)["temporal"].iloc[0]
    assert (hta["idle_ns"], hta["device_events"]) == (63 * US, 5)
    # explicit steps use the step of the launching call: step 1 = drop-last, step 2 = D alone
    assert temporal_breakdown(small, steps=[1])["temporal"].iloc[0]["idle_ns"] == 63 * US
    two = temporal_breakdown(small, steps=[2])["temporal"].iloc[0]
    assert (two["span_ns"], two["compute_ns"], two["idle_ns"]) == (10 * US, 10 * US, 0)


def test_small_kernel_types_and_overlap_by_hand(small):
    kb = kernel_breakdown(small, steps="drop-last")
    types = dict(zip(kb["types"]["kernel_type"], kb["types"]["time_ns"], strict=True))
    # computation alone [40,50) [85,95) [96,98) [150,160); with the NCCL kernel [50,60);
    # communication alone [60,75)
    assert types == {
        "COMPUTATION": 32 * US,
        "COMPUTATION overlapping COMMUNICATION": 10 * US,
        "COMMUNICATION": 15 * US,
    }
    assert kb["types"]["percentage"].sum() == pytest.approx(100)
    k = kb["kernels"].set_index("name")
    assert k.loc["gemm_a", "sum_ns"] == 20 * US and k.loc["gemm_a", "count"] == 1
    assert k.loc["ncclKernel_AllReduce_RING_LL_Sum_float", "kernel_type"] == "COMMUNICATION"
    comp = k[k["kernel_type"] == "COMPUTATION"]
    assert comp["sum_ns"].sum() == 42 * US
    assert comp.loc["gemm_b", "percentage"] == pytest.approx(100 * 10 / 42)
    tr = kb["types_by_rank"].set_index("kernel_type")
    assert tr.loc["COMPUTATION", "count"] == 4 and tr.loc["COMPUTATION", "busy_ns"] == 42 * US
    top = kernel_breakdown(small, steps="drop-last", top=1)["kernels"]
    others = top[(top["name"] == "others") & (top["kernel_type"] == "COMPUTATION")].iloc[0]
    # top-1 computation kernel is gemm_a (20 µs); B, E, F fold into others: 3 kernels, 22 µs
    assert (others["count"], others["sum_ns"], others["min_ns"], others["max_ns"]) == (
        3,
        22 * US,
        2 * US,
        10 * US,
    )
    assert others["std_ns"] == pytest.approx(np.std([10, 2, 10], ddof=1) * US)
    ov = comm_overlap(small, steps="drop-last")["overlap"].iloc[0]
    assert (ov["comm_ns"], ov["overlap_ns"]) == (25 * US, 10 * US)
    assert ov["overlap_pct"] == pytest.approx(40.0)


def test_small_idle_time_by_hand(small):
    res = idle_time(small, steps="drop-last")
    b = res["breakdown"].set_index(["stream", "idle_category"])["idle_ns"]
    # stream 7: A→B gap 25 µs, B launched at 20 < A's end → kernel wait (< 30 µs);
    # B→F gap 55 µs, F launched at 40 < B's end → other. Stream 20: C→E gap 21 µs, E launched
    # at 90 > C's end (75) → host wait.
    assert b.to_dict() == {
        (7, "host_wait"): 0,
        (7, "kernel_wait"): 25 * US,
        (7, "other"): 55 * US,
        (20, "host_wait"): 21 * US,
        (20, "kernel_wait"): 0,
        (20, "other"): 0,
    }
    ls = res["launch_summary"].iloc[0]
    # delays: A 40-15=25, B 85-25=60, C 50-35=15, E 96-95=1, F 150-45=105 µs
    assert ls["launches"] == 5
    assert ls["launch_delay_ns"] == (25 + 60 + 15 + 1 + 105) * US
    assert ls["launch_delay_max_ns"] == 105 * US and ls["launch_delay_outliers"] == 1
    assert ls["short_kernels"] == 1  # E: 2 µs on the device, 5 µs to launch
    assert res["short_kernels"].iloc[0]["name"] == "elementwise_e"
    q = res["queue_length"].set_index("stream")
    # stream 7: +1@10 +1@20 +1@40 −1@40 −1@85 −1@150 → 1 2 3 2 1 0 (enqueue first at a tie)
    assert (q.loc[7, "count"], q.loc[7, "max"], q.loc[7, "mean"]) == (6, 3, 1.5)
    # held: 1 for 10 µs, 2 for 20, 3 for 0, 2 for 45, 1 for 65 → 205 / 140
    assert q.loc[7, "mean_time_weighted"] == pytest.approx(205 / 140)
    assert (q.loc[20, "count"], q.loc[20, "max"], q.loc[20, "mean"]) == (4, 1, 0.5)
    ev = idle_time(small, steps="drop-last", per_event=True)
    assert len(ev["launches"]) == 5 and len(ev["queue_series"]) == 10
    # the headline, from the analysis itself: 25 + 55 + 21 = 101 µs idle on 2 streams, other
    # 55/101 = 54%, kernel wait 25/101 = 25%, host wait 21/101 = 21%, largest first
    assert res.facts["headline"] == (
        "Device streams are idle 101 µs in all (2 streams): 54% other, 25% in short gaps "
        "between queued kernels, 21% waiting for the host to queue work"
    )


def test_small_hta_compatible_equals_default_on_whole_microseconds(small):
    """On whole-µs times with every launch in the trace, HTA's behaviours change nothing
    here: the quirks path and the fast path must give the same numbers."""
    a = temporal_breakdown(small, steps="drop-last")["temporal"]
    b = temporal_breakdown(small, hta_compatible=True)["temporal"]
    cols = ["idle_ns", "compute_ns", "non_compute_ns", "span_ns"]
    assert a[cols].to_numpy().tolist() == b[cols].to_numpy().tolist()
    ia, ib = idle_time(small, steps="drop-last"), idle_time(small, hta_compatible=True)
    assert ia["breakdown"]["idle_ns"].tolist() == ib["breakdown"]["idle_ns"].tolist()
    assert ia["launch_summary"]["launch_delay_ns"].tolist() == (
        ib["launch_summary"]["launch_delay_ns"].tolist()
    )
    with pytest.raises(XpuprofError, match="unknown HTA quirk"):
        device_work(small, hta_compatible={"nope"})


def test_combined_breakdown_and_bad_options(small):
    res = breakdown(small, steps="drop-last")
    assert list(res.tables) == ["temporal", "types", "types_by_rank", "kernels", "overlap"]
    assert res["temporal"].iloc[0]["idle_ns"] == 63 * US
    assert res["overlap"].iloc[0]["overlap_pct"] == pytest.approx(40.0)
    assert any("last step dropped" in n for n in res.notes)
    doc = json.loads(json.dumps(res.to_dict(), default=str))
    assert doc["tables"]["types"][0]["kernel_type"] == "COMPUTATION"
    assert doc["facts"] == {"device_events": 5, "steps": "drop-last", "hta_compatible": False,
                            "headline": SMALL_HEADLINE}  # fmt: skip
    with pytest.raises(XpuprofError, match="steps must be"):
        temporal_breakdown(small, steps="last")
    with pytest.raises(XpuprofError, match="step_filter quirk"):
        temporal_breakdown(small, steps=[1], hta_compatible=True)


def test_hta_rounding_reproduced_on_fractional_timestamps(tmp_path):
    """HTA rounds start up and end down to whole µs when a file has fractional timestamps:
    a kernel at 10.4 µs lasting 1.2 µs (ends 11.6) becomes [11, 11): 0 µs; ours keeps 1.2."""
    tb = small_trace()
    tb.kernel("tiny", 10.4, 1.2, stream=9, correlation=99)
    tb.runtime("cudaLaunchKernel", 1.5, 5, correlation=99)
    with tb.load(tmp_path, "frac") as t:
        ours = kernel_breakdown(t)["kernels"].set_index("name")
        assert ours.loc["tiny", "sum_ns"] == 1200
        hta = kernel_breakdown(t, hta_compatible={"round_us"})["kernels"]
        hta = hta[hta["kernel_type"] == "COMPUTATION"].set_index("name")
        assert hta.loc["tiny", "sum"] == 0
        assert hta.loc["gemm_a", "sum"] == 20 * US  # whole µs stay as they are


# --------------------------------------------------------------- what cannot be computed


def test_no_device_events_gives_notes_not_errors(tmp_path):
    tb = TraceBuilder(rank=None)
    tb.op("aten::mm", 0, 10)
    tb.runtime("cudaLaunchKernel", 2, 5, correlation=1)
    with tb.load(tmp_path, "cpu") as t:
        res = temporal_breakdown(t)
        assert res["temporal"].empty and any("no device events" in n for n in res.notes)
        kb = kernel_breakdown(t)
        assert kb["types"].empty and kb["kernels"].empty
        assert any("no device events" in n for n in kb.notes)
        ov = comm_overlap(t)["overlap"]
        assert ov.empty
        it = idle_time(t)
        assert it["breakdown"].empty and it["launch_summary"].empty
        assert it["queue_length"].empty
        assert any("no device events" in n for n in it.notes)
        # nothing to state: no headline rather than a sentence about zeros
        assert "headline" not in res.facts and "headline" not in it.facts
        for q in (True, False):  # the HTA path says the same, and does not raise
            assert temporal_breakdown(t, hta_compatible=q)["temporal"].empty


def test_no_steps_keeps_everything_and_says_so(tmp_path):
    with small_trace(steps=False).load(tmp_path, "nosteps") as t:
        res = temporal_breakdown(t, steps="drop-last")
        assert res["temporal"].iloc[0]["device_events"] == 6
        assert any("0 step span(s)" in n for n in res.notes)


def test_no_correlation_no_host_wait_and_a_note(tmp_path):
    tb = small_trace()
    for e in tb.events:
        e.get("args", {}).pop("correlation", None)
    with tb.load(tmp_path, "nocorr") as t:
        it = idle_time(t, steps="all")
        assert it["launch_summary"].empty
        assert any("no device event is linked" in n for n in it.notes)
        b = it["breakdown"].set_index(["stream", "idle_category"])["idle_ns"]
        assert b[(20, "host_wait")] == 0 and b[(20, "kernel_wait")] == 21 * US


def test_cupti_counter_kernels_are_device_work(stores):
    """``cuda_profiler_range`` kernels carry no stream arg: HTA finds no GPU event and its
    temporal breakdown raises; ours breaks them down (77 kernels)."""
    trace, ref = stores("a100_cupti_counters")
    assert "temporal_breakdown" in ref["errors"]
    tb = temporal_breakdown(trace, steps="drop-last")["temporal"]
    assert tb.iloc[0]["device_events"] == 77 and tb.iloc[0]["compute_ns"] > 0
    assert temporal_breakdown(trace, hta_compatible=True)["temporal"].empty


def test_triton_cpu_op_is_not_a_kernel(stores):
    """The Triton trace's ``cpu_op`` records ``"stream": 0``; HTA takes its 94 µs host span
    for a GPU kernel (kernel time 94 µs). The one real kernel runs 1.76 µs."""
    trace, ref = stores("a100_triton")
    raw = json.loads(gzip.decompress((SHARED_TRACES / ref["sources"][0]).read_bytes()))
    op = [e for e in raw["traceEvents"] if e.get("cat") == "cpu_op" and "stream" in e["args"]]
    assert len(op) == 1 and ref["temporal_breakdown"][0]["kernel_time(us)"] == 94
    assert temporal_breakdown(trace, steps="drop-last")["temporal"].iloc[0]["span_ns"] == 1760

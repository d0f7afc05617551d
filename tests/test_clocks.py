"""Clock alignment (analysis/comm/clocks.py): the solver on hand-made ends with offsets worked
out by hand, and the 8-rank DLRM job with every rank's clock shifted by a known amount."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import cli_many, read_trace_json, shared, us_to_ns

import xpuprof
from xpuprof.analysis.comm import collectives
from xpuprof.analysis.comm.clocks import clock_offsets, notes, solve
from xpuprof.core.errors import XpuprofError

T0 = 1_694_128_201_429_795_000  # a realistic epoch time in ns: float64 cannot hold it to 1 ns


def _ends(rows: list[tuple[object, str, int]], whole: dict[str, bool] | None = None):
    df = pd.DataFrame(rows, columns=["participant", "key", "end"])
    if whole is not None:
        df["whole"] = df["key"].map(whole).fillna(True).astype(bool)
    return df


def _by(table: pd.DataFrame) -> pd.DataFrame:
    return table.set_index("participant")


# -- the solver on hand-made ends -----------------------------------------------------------------


def test_a_chain_of_ranks_linked_only_through_each_other_is_aligned_transitively():
    # true offsets: rank 1 reads 5 µs + 3 ns ahead of rank 0, rank 2 7 µs behind, rank 3
    # 123.457 ms ahead; 0–1 share a and b, 1–2 share c and d, 2–3 share e only: rank 2 and
    # rank 3 share nothing with rank 0 (the old alignment left them at 0)
    off = {0: 0, 1: 5_003, 2: -7_000, 3: 123_456_789}
    keys = {"a": (0, 1), "b": (0, 1), "c": (1, 2), "d": (1, 2), "e": (2, 3)}
    rows = [(p, k, T0 + 1000 * i + off[p]) for i, (k, ps) in enumerate(keys.items()) for p in ps]
    t = _by(solve(_ends(rows), order=[0, 1, 2, 3]))
    assert t["offset_ns"].tolist() == [0, 5_003, -7_000, 123_456_789]
    assert t["status"].tolist() == ["reference", "aligned", "aligned", "aligned"]
    assert t["collectives_used"].tolist() == [2, 4, 3, 1]
    assert t["residual_ns"].tolist() == [0, 0, 0, 0]
    assert (t["component"] == 0).all() and (t["reference"] == 0).all()


def test_a_participant_without_a_matched_collective_is_listed_and_not_aligned():
    rows = [(0, "a", T0), (1, "a", T0 + 2_000), (0, "b", T0 + 9_000), (1, "b", T0 + 11_000),
            (2, "z", T0 + 50)]  # fmt: skip  # 2's only collective has no partner
    t = _by(solve(_ends(rows), order=[0, 1, 2, 3]))  # 3: no collective at all
    assert t.loc[1, "offset_ns"] == 2_000
    for p in (2, 3):
        assert t.loc[p, "status"] == "unmatched"
        assert pd.isna(t.loc[p, "offset_ns"]) and pd.isna(t.loc[p, "component"])
        assert t.loc[p, "collectives_used"] == 0
    (line,) = notes(solve(_ends(rows), order=[0, 1, 2, 3]))
    assert "for rank 2, rank 3" in line and "left out" in line


def test_two_components_are_aligned_each_to_its_own_reference():
    rows = [(0, "a", T0), (1, "a", T0 + 300), (2, "b", T0 + 10), (3, "b", T0 - 490),
            (2, "c", T0 + 1_010), (3, "c", T0 + 510)]  # fmt: skip
    t = _by(solve(_ends(rows), order=[0, 1, 2, 3]))
    assert t["offset_ns"].tolist() == [0, 300, 0, -500]
    assert t["component"].tolist() == [0, 0, 1, 1]
    assert t["reference"].tolist() == [0, 0, 2, 2]
    assert t["status"].tolist() == ["reference", "aligned", "reference", "aligned"]
    (line,) = notes(t.reset_index())
    assert "2 groups" in line and "(rank 0, rank 1; rank 2, rank 3)" in line


def test_outliers_move_no_offset_and_show_in_the_residual():
    # three ranks, seven all-reduces; offsets 0, +1 ms, −2 ms; the ends agree except on
    # collective 3, where rank 2's kernel finished 50 µs after the others (a delayed transfer)
    # and collective 5, where rank 1's finished 20 µs late. Medians ignore both: by hand,
    # T[k] = median of the three offset-free ends = the common end, so each offset is exact.
    # Rank 2's |residuals| are six 0s and 50 µs: median 0, 95th percentile (linear, numpy's
    # default) = 0 + 0.7 × 50 000 = 35 000 ns; rank 1's the same with 20 µs: 14 000 ns.
    # A least-squares fit would move rank 2 by 50 000 × (2/3) / 7 ≈ 4.8 µs.
    off = [0, 1_000_000, -2_000_000]
    rows = []
    for k in range(7):
        for p in range(3):
            late = 50_000 if (k, p) == (3, 2) else 20_000 if (k, p) == (5, 1) else 0
            rows.append((p, f"k{k}", T0 + 100_000 * k + off[p] + late))
    t = _by(solve(_ends(rows)))
    assert t["offset_ns"].tolist() == off
    assert t["residual_ns"].tolist() == [0, 0, 0]
    assert t["residual_p95_ns"].tolist() == [0, 14_000, 35_000]


def test_whole_group_collectives_are_preferred_and_others_link_what_they_leave_apart():
    # 0 and 1: two all-reduces (offset 1 000 ns) and a send/recv whose ends differ by 30 µs
    # (the sender finished first): not used, the offset stays exact. 2 shares only a
    # send/recv with 1: used, so 2 is aligned (offset 1 000 + 4 000).
    rows = [(0, "ar0", T0), (1, "ar0", T0 + 1_000), (0, "ar1", T0 + 5_000),
            (1, "ar1", T0 + 6_000), (0, "p2p", T0 + 9_000), (1, "p2p", T0 + 40_000),
            (1, "p2p2", T0 + 70_000), (2, "p2p2", T0 + 74_000)]  # fmt: skip
    whole = {"p2p": False, "p2p2": False}
    t = _by(solve(_ends(rows, whole)))
    assert t["offset_ns"].tolist() == [0, 1_000, 5_000]
    assert t["collectives_used"].tolist() == [2, 3, 1]
    # the same ends with every collective whole-group: the 31 µs pair now counts (median of
    # 1 000, 1 000 and 31 000 = 1 000: still robust, but the residual shows it)
    t2 = _by(solve(_ends(rows)))
    assert t2.loc[1, "offset_ns"] == 1_000 and t2.loc[1, "collectives_used"] == 4


def test_devices_sharing_a_clock_count_as_their_median_end():
    # part 1 has three devices in collective a: ends +100, +400, +700 → median +400
    rows = [(0, "a", T0), (1, "a", T0 + 100), (1, "a", T0 + 400), (1, "a", T0 + 700),
            (0, "b", T0 + 5_000), (1, "b", T0 + 5_400)]  # fmt: skip
    t = _by(solve(_ends(rows)))
    assert t.loc[1, "offset_ns"] == 400 and t.loc[1, "collectives_used"] == 2


def test_an_order_missing_a_participant_is_an_error():
    with pytest.raises(ValueError, match="not in order"):
        solve(_ends([(0, "a", T0), (1, "a", T0)]), order=[0])


# -- the 8-rank DLRM job ------------------------------------------------------------------------

DLRM = "kineto/gpu/dlrm_8rank_v100"
#: Injected clock shifts (µs) per rank: 137.291 ms steps in a non-monotone order of the ranks,
#: centred (some negative, rank 0's too), plus a few µs that differ per rank. Quarter µs are
#: exact in a float64 of ~1.7e15 µs, so the shifted JSON holds them exactly.
SHIFT_US = [((3 * r) % 8 - 4) * 137_291 + j
            for r, j in enumerate([2.5, -7.25, 11.0, 0.75, -3.5, 5.25, -9.0, 1.0])]  # fmt: skip


def _write_shifted(files: list[Path], out: Path, *, rename: int | None = None,
                   drop: int | None = None) -> list[Path]:  # fmt: skip
    """Copies of the job's files with every timestamp of rank r shifted by SHIFT_US[r];
    rank ``rename``'s NCCL kernels moved to a process group of their own, rank ``drop``'s
    removed."""
    out.mkdir()
    written = []
    for f in files:
        doc = read_trace_json(f)
        rank = doc["distributedInfo"]["rank"]
        events = []
        for e in doc["traceEvents"]:
            nccl = e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower()
            if nccl and rank == drop:
                continue
            e = dict(e)
            if "ts" in e:
                e["ts"] = e["ts"] + SHIFT_US[rank]
            if nccl and rank == rename:
                e["args"] = {**e["args"], "Process Group Name": "renamed"}
            events.append(e)
        p = out / f.name
        with gzip.open(p, "wt") as fh:
            json.dump({**doc, "traceEvents": events}, fh)
        written.append(p)
    return written


def _raw_ends(files: list[Path]) -> np.ndarray:
    """Rank × collective: each NCCL kernel's end (ns) from the JSON alone (one group: the
    n-th kernel of every rank is the same collective)."""
    ends = {}
    for f in files:
        doc = read_trace_json(f, exact=True)
        k = sorted((e for e in doc["traceEvents"] if e.get("cat") == "kernel"
                    and "nccl" in e["name"].lower()), key=lambda e: e["ts"])  # fmt: skip
        ends[doc["distributedInfo"]["rank"]] = [us_to_ns(e["ts"]) + us_to_ns(e["dur"]) for e in k]
    return np.array([ends[r] for r in sorted(ends)], np.int64)


def _dense_medians(ends: np.ndarray) -> np.ndarray:
    """Offsets of the rows of a full rank × collective matrix, written here on a dense
    matrix: start at each row's median end difference to row 0, then alternate column
    medians (T) and row medians (o), row 0 kept at 0, until nothing moves."""
    x = (ends - ends.min(axis=0)).astype(np.float64)
    o = np.median(x - x[0], axis=1)
    for _ in range(200):
        t = np.median(x - o[:, None], axis=0)
        new = np.median(x - t[None, :], axis=1)
        new -= new[0]
        done = np.abs(new - o).max() < 0.5
        o = new
        if done:
            break
    return o


@pytest.fixture(scope="module")
def job(dlrm_store, tmp_path_factory):
    """The job as recorded, and a store of the same files with each rank's clock shifted."""
    t, files = dlrm_store
    d = tmp_path_factory.mktemp("clocks")
    shifted = _write_shifted(files, d / "shifted")
    xpuprof.import_traces(shifted, d / "shifted.store")
    with xpuprof.load(d / "shifted.store") as s:
        yield t, files, s, d / "shifted.store"


def test_dlrm_offsets_agree_with_a_dense_solve_of_the_raw_json(job):
    t, files, _, _ = job
    ends = _raw_ends(files)
    want = np.round(_dense_medians(ends)).astype(np.int64)
    got = clock_offsets(t)  # hosts unknown: "end"
    assert got["rank"].tolist() == list(range(8))
    assert (got["method"] == "end").all()
    assert got["offset_ns"].astype(np.int64).tolist() == want.tolist()
    assert got["status"].tolist() == ["reference"] + ["aligned"] * 7
    assert (got["collectives_used"] == 8).all() and (got["component"] == 0).all()
    # the residual: median and 95th percentile of |end − T − o| per rank, by hand
    x = (ends - ends.min(axis=0)).astype(np.float64)
    tt = np.median(x - want[:, None], axis=0)
    r = np.abs(x - tt[None, :] - want[:, None])
    assert got["residual_ns"].tolist() == np.round(np.median(r, axis=1)).astype(int).tolist()
    assert got["residual_p95_ns"].tolist() == np.round(np.percentile(r, 95, axis=1)).astype(
        int).tolist()  # fmt: skip
    assert got["residual_p95_ns"].max() < 5_000  # ends agree within a few µs once aligned
    # the joint fit explains the ends at least as well as the old pairwise-to-rank-0 offsets
    old = np.median(ends - ends[0], axis=1)

    def l1(o: np.ndarray) -> float:
        return float(np.abs(x - np.median(x - o[:, None], axis=0) - o[:, None]).sum())

    assert l1(want.astype(float)) <= l1(old)


def test_injected_clock_shifts_are_recovered_within_5_us(job):
    t, _, s, _ = job
    base = clock_offsets(t)["offset_ns"].astype(np.int64).to_numpy()
    got = clock_offsets(s)
    assert got["rank"].tolist() == list(range(8))
    injected = np.array([round(1000 * (x - SHIFT_US[0])) for x in SHIFT_US])  # vs rank 0
    err = got["offset_ns"].astype(np.int64).to_numpy() - (base + injected)
    assert np.abs(err).max() <= 5_000, err
    # a shift of a whole clock changes nothing else: residuals as on the recorded clocks
    assert got["residual_ns"].tolist() == clock_offsets(t)["residual_ns"].tolist()
    # skew on the shifted store, aligned, is the recorded store's; unaligned, it is the shifts
    sk = collectives(s)["skew"].sort_values("seq")["skew_ns"].to_numpy()
    sk0 = collectives(t)["skew"].sort_values("seq")["skew_ns"].to_numpy()
    assert np.abs(sk - sk0).max() <= 5_000
    raw = collectives(s, align="none")["skew"]["skew_ns"]
    assert raw.min() > 900_000_000  # the shifts span 7 × 137.291 ms


def test_the_replay_aligns_the_shifted_clocks_and_align_none_does_not(job):
    t, _, s, _ = job
    from xpuprof.sim import replay

    base = replay(t).steps.set_index("rank")["simulated_ns"]
    aligned = replay(s, align="end")
    assert (aligned.steps.set_index("rank")["simulated_ns"] - base).abs().max() <= 5_000
    assert any("clocks of the ranks aligned" in n for n in aligned.notes)
    # on the recorded (shifted) clocks the ranks that read early wait ~137 ms multiples for
    # the others in the first collective: step times blow up
    raw = replay(s, align="none")
    worse = raw.steps.set_index("rank")["simulated_ns"] - base
    assert worse.max() > 100_000_000
    assert any("clocks not aligned" in n for n in raw.notes)
    with pytest.raises(XpuprofError, match="align='x'"):
        replay(s, align="x")


def test_the_cli_replay_takes_align(job):
    *_, store = job
    auto, none, bad = cli_many([["replay", store, "--json"],
                                ["replay", store, "--align", "none", "--json"],
                                ["replay", store, "--align", "sideways"]])  # fmt: skip
    assert auto.returncode == 0 and none.returncode == 0, auto.stderr + none.stderr
    # measured step times are reproduced once aligned (0.01 % worst, as on the recorded
    # files); on the shifted clocks as recorded they are not
    assert json.loads(auto.stdout)["facts"]["worst_error_pct"] < 0.1
    assert json.loads(none.stdout)["facts"]["median_error_pct"] > 100
    assert bad.returncode == 2 and "align='sideways'" in bad.stderr


def test_a_rank_whose_collectives_never_match_is_listed_and_left_out(dlrm_store, tmp_path):
    _, files = dlrm_store
    # rank 5's NCCL kernels in a process group of their own; rank 6's removed
    written = _write_shifted(files, tmp_path / "odd", rename=5, drop=6)
    xpuprof.import_traces(written, tmp_path / "odd.store")
    with xpuprof.load(tmp_path / "odd.store") as s:
        off = clock_offsets(s).set_index("rank")
        for r in (5, 6):
            assert off.loc[r, "status"] == "unmatched" and pd.isna(off.loc[r, "offset_ns"])
        assert (off.drop(index=[5, 6])["status"] != "unmatched").all()
        assert any("rank 5, rank 6" in n for n in clock_offsets(s).attrs["notes"])
        # the other six: the dense solve of their raw ends, plus the injected shifts
        keep = [0, 1, 2, 3, 4, 7]
        ends = _raw_ends(files)[keep]
        want = np.round(_dense_medians(ends)).astype(np.int64)
        injected = np.array([round(1000 * (SHIFT_US[r] - SHIFT_US[0])) for r in keep])
        err = off.loc[keep, "offset_ns"].astype(np.int64).to_numpy() - (want + injected)
        assert np.abs(err).max() <= 5_000, err
        # rank 5 is in no skew comparison (its collectives are not compared on its raw clock)
        r = collectives(s)
        assert r["clock"].set_index("participant").loc["5", "status"] == "unmatched"
        assert "5" not in set(r["stragglers"]["participant"])
        assert (r["skew"]["participants"] == 6).all() and len(r["skew"]) == 8
        assert r["collectives"].loc[r["collectives"]["rank"] == 5, "late_ns"].isna().all()
        assert any("for rank 5:" in n for n in r.notes)


def test_the_devices_of_one_host_share_its_clock_under_every_alignment(tmp_path):
    # four TPU chips in one XPlane file: one part, one clock; their collectives match only
    # among themselves, so the part is its own reference and nothing is shifted or left out
    xpuprof.import_traces([shared("xplane/tpu_v6e_4chip_inference.xplane.pb")], tmp_path / "s")
    with xpuprof.load(tmp_path / "s") as t:
        none, end = collectives(t, align="none"), collectives(t, align="end")
        assert end["clock"]["status"].tolist() == ["reference"] * 4
        assert end["clock"]["offset_ns"].tolist() == [0] * 4
        assert none["clock"]["status"].tolist() == ["recorded"] * 4
        assert len(end["skew"]) == 3 and (end["skew"]["participants"] == 4).all()
        assert end["skew"]["skew_ns"].tolist() == none["skew"]["skew_ns"].tolist()
        off = clock_offsets(t, "end")
        assert off["status"].tolist() == ["reference"] and off["offset_ns"].tolist() == [0]


def test_the_late_rank_advice_reads_the_shifted_clocks_as_the_recorded_ones(job):
    """The advisor's late-rank finding compares the late rank's step start with the waiting
    rank's on one clock (the solved offsets): on the shifted copy it says what it says on the
    recorded job — rank 7 started its step 7.5 ms after rank 1 (raw JSON: the step spans'
    starts, one host, one clock), not 7.5 ms plus 7 × 137 ms of shifted clock."""
    from xpuprof.advise.rules import advise

    t, _, s, _ = job
    start = t.sql("select rank, ts from events where level = 'step'").set_index("rank").ts
    gap_ms = (start[7] - start[1]) / 1e6
    assert gap_ms == pytest.approx(7.5, rel=0.01)
    recs = [advise(x)["recommendations"] for x in (t, s)]
    late = [r[r.rule == "late-rank"].iloc[0].recommendation for r in recs]
    assert late[0] == late[1]
    said = re.search(r"it started the step ([\d.]+) ms after rank 1", late[1])
    assert said and float(said.group(1)) == pytest.approx(gap_ms, abs=0.001)

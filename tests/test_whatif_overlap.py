"""``overlap-collective``: the compute stream's wait for a collective moves to its consumer.

Expected times are worked out by hand from the trace each test builds (µs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from builders import TraceBuilder

import xpuprof
from xpuprof.core.errors import XpuprofError
from xpuprof.sim.whatif import whatif

US = 1000
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _store(tmp_path: Path) -> Path:
    """Step 0 (0–20 µs of host time), compute stream 7, NCCL stream 20:

    - "producer" launched at 1, runs 6–56 (the typical launch latency, from a call's end, is
      4 µs: the producer, and three "other" kernels on stream 30 launched at 200, 210, 220,
      each starting 5 µs after its call; the typical gap between queued kernels is 0: the
      median of the consumer's 54 µs, "late"'s 0 and three 0s of kernels "queued1–3" queued
      on stream 31 behind a 20 µs one);
    - the all-reduce launched at 3, runs 8–108 (alone of its 2-rank group: as measured);
    - cudaStreamWaitEvent at 5: stream 7 waits for the all-reduce;
    - "consumer" launched at 10, runs 110–120 (2 µs after the all-reduce: it waited);
    - "late" launched at 13 inside the op "optimizer" (12–15), runs 120–170 (queued right
      behind the consumer: a queue gap of 0).
    Step 1 (300–320): "next" launched at 301, runs 306–316."""
    tb = TraceBuilder(rank=0, world_size=2)
    tb.step(0, ts=0, dur=20)
    tb.step(1, ts=300, dur=20)
    for call in (200, 210, 220):
        tb.launch("other", ts=call + 5, dur=1, launch_ts=call, launch_dur=1, stream=30)
    for i, (ts, dur) in enumerate(((235, 20), (255, 1), (256, 1), (257, 1))):
        tb.launch(f"queued{i}", ts=ts, dur=dur, launch_ts=230 + i, launch_dur=1, stream=31)
    tb.launch("producer", ts=6, dur=50, launch_ts=1, launch_dur=1, stream=7)
    args = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20,
            "Group size": 2, "dtype": "Float", "Process Group Name": "0",
            "Process Group Ranks": "[0, 1]"}  # fmt: skip
    tb.launch(ALLREDUCE, ts=8, dur=100, launch_ts=3, launch_dur=1, stream=20, **args)
    tb.runtime("cudaStreamWaitEvent", 5, 1)
    tb.launch("consumer", ts=110, dur=10, launch_ts=10, launch_dur=1, stream=7)
    tb.op("optimizer", 12, 3)
    tb.launch("late", ts=120, dur=50, launch_ts=13, launch_dur=1, stream=7)
    tb.launch("next", ts=306, dur=10, launch_ts=301, launch_dur=1, stream=7)
    return tb.store(tmp_path, "overlap")


def _with_device_us(w, step: int) -> float:
    s = w.steps.set_index("step")
    return s.loc[step, "predicted_with_device_ns"] / US


def test_the_wait_moves_to_the_next_step(tmp_path):
    """Without the wait the consumer follows the producer: 56–66 (its launch's end at 11 + 4
    = 15 is earlier; queue gap 0), "late" 66–116; the all-reduce still ends at 108. Step 0 with its
    device work: 0–116 µs, from 0–170. The wait now points at step 1's "next" (306), which
    starts after 108 anyway: step 1 unchanged. The host never waited: the host steps stay."""
    with xpuprof.load(_store(tmp_path)) as t:
        base = whatif(t, [])
        assert _with_device_us(base, 0) == 170
        w = whatif(t, ["overlap-collective"])
        assert _with_device_us(w, 0) == 116
        assert _with_device_us(w, 1) == _with_device_us(base, 1) == 20
        assert w.steps["predicted_ns"].tolist() == w.steps["baseline_ns"].tolist()
        assert "1 stream waits moved" in w.notes[0]


def test_until_moves_the_wait_to_the_consumers_work(tmp_path):
    """@optimizer: "late" (launched inside "optimizer") waits for the all-reduce: it starts at
    max(consumer's end 66, 108) = 108, ends 158: step 0 with device 0–158 µs."""
    with xpuprof.load(_store(tmp_path)) as t:
        w = whatif(t, ["overlap-collective:AllReduce@^optimizer$"])
        assert _with_device_us(w, 0) == 158
        assert "1 to the work of '^optimizer$'" in w.notes[0]


def test_a_collective_on_the_compute_stream_is_refused(tmp_path):
    """An all-reduce queued on the compute stream 7 between two kernels (as XLA runs its
    in-stream collectives): the graph cannot move it; the error says why."""
    tb = TraceBuilder(rank=0, world_size=2)
    tb.step(0, ts=0, dur=20)
    tb.launch("producer", ts=6, dur=50, launch_ts=1, launch_dur=1, stream=7)
    tb.launch(ALLREDUCE, ts=56, dur=100, launch_ts=3, launch_dur=1, stream=7)
    tb.launch("consumer", ts=156, dur=10, launch_ts=10, launch_dur=1, stream=7)
    with tb.load(tmp_path) as t:
        with pytest.raises(XpuprofError, match="stream 7 of device 0 together with other work"):
            whatif(t, ["overlap-collective"])


def test_bad_input(tmp_path):
    with xpuprof.load(_store(tmp_path)) as t:
        with pytest.raises(XpuprofError, match="selects no replayed event"):
            whatif(t, ["overlap-collective:Broadcast"])
        with pytest.raises(XpuprofError, match="takes no factor"):
            whatif(t, ["overlap-collective=2"])


def _dlrm() -> Path | None:
    root = Path(os.environ.get("XPUPROF_TEST_TRACES")
                or Path(__file__).resolve().parents[2] / "shared" / "traces")  # fmt: skip
    d = root / "kineto" / "gpu" / "dlrm_8rank_v100"
    files = sorted(d.glob("worker[01]_*.json.gz"))
    return d if len(files) == 2 else None


@pytest.mark.skipif(_dlrm() is None, reason="needs ../shared/traces (dlrm_8rank_v100)")
def test_dlrm_waits_on_the_all_to_all(tmp_path):
    """DLRM (2 of 8 V100 ranks, one step): every stream wait out of an NCCL kernel is dropped
    (one step: no later work), and no rank's host step gets longer. Rank 1 waited for rank 0
    in its all-to-alls: its step gains more than removing the transfers does
    (``scale:collective=0`` keeps the wait for the last arrival)."""
    d = _dlrm()
    store = tmp_path / "dlrm.store"
    xpuprof.import_traces(sorted(d.glob("worker[01]_*.json.gz")), store)
    with xpuprof.load(store) as t:
        waits = t.sql("select count(*) as n from events where name = 'cudaStreamWaitEvent'")
        w = whatif(t, ["overlap-collective"])
        assert "6 dropped" in w.notes[0] and int(waits["n"][0]) > 0
        s = w.summary.set_index("rank")
        assert (s["predicted_ns"] <= s["baseline_ns"]).all()
        zero = whatif(t, ["scale:collective=0"]).summary.set_index("rank")
        assert s.loc[1, "predicted_ns"] < zero.loc[1, "predicted_ns"]

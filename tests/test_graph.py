"""The dependency graph (``xpuprof.trace.graph``): every node and edge of a small trace worked
out by hand, its critical path worked out by hand, and edge counts on a real trace counted
independently from the raw JSON with the ``json`` module.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from builders import HOST_PID, TraceBuilder
from conftest import shared

import xpuprof
from xpuprof.analysis.critical_path import critical_path
from xpuprof.trace.graph import (
    BLOCKING_CALLS,
    EDGE_KINDS,
    NODE_KINDS,
    EdgeKind,
    dependency_graph,
    longest_path,
)

US = 1000  # ns


def hand_trace() -> TraceBuilder:
    """One device, streams 7 and 20; host thread 1 (labels A–M) and thread 2 (N, O); µs.

    Thread 1: A aten::mm [0, 50] holding B cudaLaunchKernel [10, 15] (k1 on stream 7 at
    [20, 120]), C cudaEventRecord [20, 22] (records stream 7), D cudaStreamWaitEvent [25, 27]
    (stream 20 waits for C's event), E cudaLaunchKernel [30, 35] (k2 on stream 20 at
    [125, 165]); F cudaStreamSynchronize [60, 170] (stream 20); G aten::copy_ [180, 260]
    holding H cudaMemcpy [190, 250] (a copy on stream 7 at [200, 240]); I cudaLaunchKernel
    [270, 275] (k3 on stream 7 at [280, 330]); J cudaEventRecord [276, 278] (stream 7);
    K cudaEventSynchronize [290, 340] (J's event); L cudaDeviceSynchronize [345, 360];
    M aten::item [365, 375]. Thread 2: N aten::fill_ [100, 140] holding O cudaLaunchKernel
    [110, 115] (k4 on stream 7 at [125, 135]). Each sync call has its ``cuda_sync`` event.
    """
    tb = TraceBuilder(rank=0)
    tb.op("aten::mm", 0, 50)
    tb.launch("k1", 20, 100, launch_ts=10, launch_dur=5, stream=7, correlation=1)
    tb.runtime("cudaEventRecord", 20, 2, correlation=2)
    tb.runtime("cudaStreamWaitEvent", 25, 2, correlation=3)
    tb.kernel("Stream Wait Event", 26, 0, stream=20, correlation=3, cat="cuda_sync",
              wait_on_stream=7, wait_on_cuda_event_record_corr_id=2)  # fmt: skip
    tb.launch("k2", 125, 40, launch_ts=30, launch_dur=5, stream=20, correlation=4)
    tb.runtime("cudaStreamSynchronize", 60, 110, correlation=5)
    tb.kernel("Stream Sync", 61, 108, stream=20, correlation=5, cat="cuda_sync")
    tb.op("aten::copy_", 180, 80)
    tb.launch("Memcpy HtoD (Pageable -> Device)", 200, 40, launch_ts=190, launch_dur=60,
              call="cudaMemcpy", cat="gpu_memcpy", stream=7, correlation=6)  # fmt: skip
    tb.launch("k3", 280, 50, launch_ts=270, launch_dur=5, stream=7, correlation=7)
    tb.runtime("cudaEventRecord", 276, 2, correlation=8)
    tb.runtime("cudaEventSynchronize", 290, 50, correlation=9)
    tb.kernel("Event Sync", 291, 48, stream=-1, correlation=9, cat="cuda_sync",
              wait_on_stream=7, wait_on_cuda_event_record_corr_id=8)  # fmt: skip
    tb.runtime("cudaDeviceSynchronize", 345, 15, correlation=11)
    tb.kernel("Context Sync", 346, 13, stream=-1, correlation=11, cat="cuda_sync")
    tb.op("aten::item", 365, 10)
    tb.op("aten::fill_", 100, 40, tid=2)
    tb.launch("k4", 125, 10, launch_ts=110, launch_dur=5, stream=7, correlation=10, tid=2)
    return tb


#: label -> (name, start in µs) of the events the graph holds
EVENTS = {
    "A": ("aten::mm", 0), "B": ("cudaLaunchKernel", 10), "C": ("cudaEventRecord", 20),
    "D": ("cudaStreamWaitEvent", 25), "E": ("cudaLaunchKernel", 30),
    "F": ("cudaStreamSynchronize", 60), "G": ("aten::copy_", 180), "H": ("cudaMemcpy", 190),
    "I": ("cudaLaunchKernel", 270), "J": ("cudaEventRecord", 276),
    "K": ("cudaEventSynchronize", 290), "L": ("cudaDeviceSynchronize", 345),
    "M": ("aten::item", 365), "N": ("aten::fill_", 100), "O": ("cudaLaunchKernel", 110),
    "k1": ("k1", 20), "k4": ("k4", 125), "copy": ("Memcpy HtoD (Pageable -> Device)", 200),
    "k3": ("k3", 280), "k2": ("k2", 125),
}  # fmt: skip

#: Nodes in their documented order: thread (100, 1), thread (100, 2), stream 7, stream 20; each
#: in time order (ends before starts at equal times). (label, start or end, time µs)
NODES = [
    ("A", "s", 0), ("B", "s", 10), ("B", "e", 15), ("C", "s", 20), ("C", "e", 22),  # 0-4
    ("D", "s", 25), ("D", "e", 27), ("E", "s", 30), ("E", "e", 35), ("A", "e", 50),  # 5-9
    ("F", "s", 60), ("F", "e", 170), ("G", "s", 180), ("H", "s", 190),  # 10-13
    ("H", "e", 250), ("G", "e", 260), ("I", "s", 270), ("I", "e", 275),  # 14-17
    ("J", "s", 276), ("J", "e", 278), ("K", "s", 290), ("K", "e", 340),  # 18-21
    ("L", "s", 345), ("L", "e", 360), ("M", "s", 365), ("M", "e", 375),  # 22-25
    ("N", "s", 100), ("O", "s", 110), ("O", "e", 115), ("N", "e", 140),  # 26-29: thread 2
    ("k1", "s", 20), ("k1", "e", 120), ("k4", "s", 125), ("k4", "e", 135),  # 30-33: stream 7
    ("copy", "s", 200), ("copy", "e", 240), ("k3", "s", 280), ("k3", "e", 330),  # 34-37
    ("k2", "s", 125), ("k2", "e", 165),  # 38-39: stream 20
]  # fmt: skip

W, GAP, WAIT = "host_work", "host_gap", "host_wait"
#: (src node, dst node, kind, weight µs, charged event label or None), in the documented order:
#: timeline edges by target node, then launch, stream-wait and sync edges.
EDGES = [
    # thread 1: CPU time goes to the op that just started, else to the parent of the op that
    # starts next (A), else to the op that ends; blocking calls' ends are waits (weight 0),
    # top-level starts follow gaps (weight 0, charged to nothing)
    (0, 1, W, 10, "A"), (1, 2, W, 5, "B"), (2, 3, W, 5, "A"), (3, 4, W, 2, "C"),
    (4, 5, W, 3, "A"), (5, 6, W, 2, "D"), (6, 7, W, 3, "A"), (7, 8, W, 5, "E"),
    (8, 9, W, 15, "A"), (9, 10, GAP, 0, None), (10, 11, WAIT, 0, "F"), (11, 12, GAP, 0, None),
    (12, 13, W, 10, "G"), (13, 14, WAIT, 0, "H"), (14, 15, W, 10, "G"),
    (15, 16, GAP, 0, None), (16, 17, W, 5, "I"), (17, 18, GAP, 0, None), (18, 19, W, 2, "J"),
    (19, 20, GAP, 0, None), (20, 21, WAIT, 0, "K"), (21, 22, GAP, 0, None),
    (22, 23, WAIT, 0, "L"), (23, 24, GAP, 0, None), (24, 25, W, 10, "M"),
    # thread 2
    (26, 27, W, 10, "N"), (27, 28, W, 5, "O"), (28, 29, W, 25, "N"),
    # stream 7: k4 was launched (110) while k1 still ran (until 120): queued behind it, a
    # 5 µs kernel gap charged to k1; the copy and k3 were launched onto an idle stream
    (30, 31, "device_work", 100, "k1"), (31, 32, "kernel_gap", 5, "k1"),
    (32, 33, "device_work", 10, "k4"), (34, 35, "device_work", 40, "copy"),
    (36, 37, "device_work", 50, "k3"),
    # stream 20: k2 waits for k1 (ended 120, after k2's launch at 30): no launch edge
    (38, 39, "device_work", 40, "k2"),
    # launches onto an idle stream with an empty queue: delay = work start - call start
    (1, 30, "launch", 10, "B"), (13, 34, "launch", 10, "H"), (16, 36, "launch", 10, "I"),
    # D: stream 20 waits for the work launched onto stream 7 up to C (k1), before the next
    # work thread 1 launches onto stream 20 (k2)
    (31, 38, "stream_wait_event", 0, "D"),
    # K waits for the work launched onto stream 7 up to J (k3); F for the last work started on
    # stream 20 before its Stream Sync ended (k2); L for the last of each stream (k3, k2)
    (37, 21, "event_sync", 0, "K"), (39, 11, "stream_sync", 0, "F"),
    (37, 23, "context_sync", 0, "L"), (39, 23, "context_sync", 0, "L"),
]  # fmt: skip


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    with hand_trace().load(tmp_path_factory.mktemp("graph")) as trace:
        df = trace.sql("select id, name, ts from events")
        ids = {(n, int(t)): int(i) for i, n, t in zip(df.id, df.name, df.ts, strict=True)}
        label = {k: ids[(n, t * US)] for k, (n, t) in EVENTS.items()}
        yield trace, label


def test_nodes_by_hand(hand) -> None:
    trace, label = hand
    g = dependency_graph(trace, 0)
    n = g.nodes
    device = {"k1", "k2", "k3", "k4", "copy"}
    kinds = [("device_" if lb in device else "host_") + ("start" if se == "s" else "end")
             for lb, se, _ in NODES]  # fmt: skip
    assert n.event.tolist() == [label[lb] for lb, _, _ in NODES]
    assert [NODE_KINDS[k] for k in n.kind] == kinds
    assert n.time.tolist() == [t * US for _, _, t in NODES]
    t = g.timelines
    assert (t.first.tolist(), t.stop.tolist()) == ([0, 26, 30, 38], [26, 30, 38, 40])
    assert t.pid.tolist() == [HOST_PID, HOST_PID, -1, -1]
    assert t.tid.tolist() == [1, 2, -1, -1]
    assert (t.device.tolist(), t.stream.tolist()) == ([-1, -1, 0, 0], [-1, -1, 7, 20])
    assert n.timeline.tolist() == [0] * 26 + [1] * 4 + [2] * 8 + [3] * 2
    assert g.notes == ()


def test_edges_by_hand(hand) -> None:
    trace, label = hand
    g = dependency_graph(trace, 0)
    e = g.edges
    got = [(s, d, EDGE_KINDS[k], w, c) for s, d, k, w, c in
           zip(e.src.tolist(), e.dst.tolist(), e.kind, e.weight.tolist(), e.event.tolist(),
               strict=True)]  # fmt: skip
    want = [(s, d, k, w * US, -1 if c is None else label[c]) for s, d, k, w, c in EDGES]
    assert got == want
    times = [t * US for _, _, t in NODES]
    assert e.duration.tolist() == [times[d] - times[s] for s, d, *_ in EDGES]
    counts = {k: 0 for k in EDGE_KINDS} | {
        "host_work": 17, "host_gap": 7, "host_wait": 4, "device_work": 5, "kernel_gap": 1,
        "launch": 3, "stream_sync": 1, "context_sync": 2, "event_sync": 1,
        "stream_wait_event": 1,
    }  # fmt: skip
    assert g.edge_counts() == counts
    s = g.summary().set_index("kind")
    assert s.edges.to_dict() == counts
    assert s.weight["host_work"] == (10 + 5 + 5 + 2 + 3 + 2 + 3 + 5 + 15 + 10 + 10 + 5 + 2 + 10
                                     + 10 + 5 + 25) * US  # fmt: skip
    assert s.weight["device_work"] == (100 + 10 + 40 + 50 + 40) * US


def test_critical_path_by_hand(hand) -> None:
    """Longest distance to each node (µs), from the edges above: thread 1 reaches B's start at
    10, k1 runs 20–120 (10 + 10 launch + 100 = 120), k2 after the wait: 160; F's end takes
    the stream sync (160 > 50 by the host); then G 10 µs to H, H waits (0), G 10 more: 180;
    I's launch of k3: 190, k3: 240; K's end takes the event sync (240 > 187 by the host); L's
    end ties (host 240, k3 240, k2 160): the timeline edge wins; M: 250. The copy (ends at
    220) and thread 2 (40) lead nowhere longer. Length 250 µs: 40 CPU, 20 launch delay,
    190 device."""
    trace, label = hand
    g = dependency_graph(trace, 0)
    path = longest_path(g).tolist()
    kinds = [EDGE_KINDS[k] for k in g.edges.kind[path]]
    nodes = [g.edges.src[path[0]]] + g.edges.dst[path].tolist()
    assert nodes == [0, 1, 30, 31, 38, 39, 11, 12, 13, 14, 15, 16, 36, 37, 21, 22, 23, 24, 25]
    assert kinds == [W, "launch", "device_work", "stream_wait_event", "device_work",
                     "stream_sync", GAP, W, WAIT, W, GAP, "launch", "device_work",
                     "event_sync", GAP, WAIT, GAP, W]  # fmt: skip
    assert g.edges.weight[path].sum() == 250 * US
    res = critical_path(trace)
    s = res["summary"].set_index("attribution").time // US
    assert s.to_dict() == {"cpu_bound": 40, "gpu_compute": 190, "gpu_communication": 0,
                           "launch_overhead": 20, "kernel_gap": 0, "sync": 0, "host_gap": 0,
                           "total": 250}  # fmt: skip
    p = res["path"]
    assert p.src.iat[0] == label["A"] and p.dst.iat[-1] == label["M"]
    assert p.end.iat[-1] - p.start.iat[0] == 375 * US == p.duration.sum()
    names = p.name[p.weight > 0].tolist()
    assert names == ["aten::mm", "cudaLaunchKernel", "k1", "k2", "aten::copy_", "aten::copy_",
                     "cudaLaunchKernel", "k3", "aten::item"]  # fmt: skip


def test_window_keeps_host_events_starting_inside(hand) -> None:
    """Window [100, 200] µs: host events starting in it are G, H (thread 1) and N, O (thread
    2); the work they launched is the copy and k4. No sync call is in it."""
    trace, label = hand
    g = dependency_graph(trace, 0, window=(100 * US, 200 * US))
    got = sorted(set(g.nodes.event.tolist()))
    assert got == sorted(label[x] for x in ("G", "H", "N", "O", "copy", "k4"))
    c = g.edge_counts()
    # k1 is outside the window, so k4 is the first work of stream 7 in the graph and, its
    # queue being empty (k1 started at 20, before k4's launch at 110), it hangs from its launch
    # (delay 15 µs) as in HTA, though k1 still ran when it was launched; the copy as before
    assert (c["launch"], c["kernel_gap"], c["device_work"]) == (2, 0, 2)
    launch = g.edges.kind == EdgeKind.LAUNCH
    assert g.edges.weight[launch].tolist() == [15 * US, 10 * US]
    assert c["stream_sync"] + c["event_sync"] + c["context_sync"] + c["stream_wait_event"] == 0


def test_edge_kinds_are_all_defined() -> None:
    from xpuprof.trace import graph

    assert EDGE_KINDS == tuple(k.name.lower() for k in EdgeKind)
    for kind in EDGE_KINDS:
        assert f"``{kind}``" in (graph.__doc__ or ""), kind


# ----------------------------------------------------------------------------------------------
# a real trace: edge counts from the raw JSON
# ----------------------------------------------------------------------------------------------


def test_edge_counts_on_a_real_trace(raw_json) -> None:
    """a100_alexnet_cuda_sync, whole trace, counted from the JSON: host nodes are the ops and
    runtime calls with dur > 0; every node of a thread but its first has a timeline edge;
    ops with no enclosing op on their thread follow a host gap (but the thread's first);
    every blocking call ends with a host wait; every kernel, copy and set whose correlation id
    names one of those runtime calls runs (one device edge each); a Stream Sync joins the last
    work started on its stream before it ended, a Context Sync that of each stream of the
    device."""
    path = shared("kineto/gpu/a100_alexnet_cuda_sync.json.gz")
    events = [e for e in raw_json(path)["traceEvents"] if e.get("ph") == "X"]
    host = [e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime") and e["dur"] > 0]
    calls = {e["args"]["correlation"]: e for e in host if e["cat"] == "cuda_runtime"}
    work = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and e["args"].get("correlation") in calls]  # fmt: skip
    threads = defaultdict(list)
    for e in host:
        threads[(e["pid"], e["tid"])].append((e["ts"], -e["dur"], e["ts"] + e["dur"]))
    top_level = 0
    for spans in threads.values():
        reach = float("-inf")
        for ts, _, end in sorted(spans):
            top_level += ts >= reach
            reach = max(reach, end)
    started = defaultdict(list)  # (device, stream) -> work start times
    for e in work:
        started[(e["args"]["device"], e["args"]["stream"])].append(e["ts"])

    def synced(e: dict, streams: list) -> int:
        end = e["ts"] + e["dur"]
        return sum(any(t < end for t in started[(e["args"]["device"], s)]) for s in streams)

    syncs = [e for e in events if e.get("cat") == "cuda_sync"
             and e["args"].get("correlation") in calls]  # fmt: skip
    streams_of = defaultdict(list)
    for device, stream in started:
        streams_of[device].append(stream)
    stream_sync = sum(synced(e, [e["args"]["stream"]]) for e in syncs
                      if e["name"] == "Stream Sync")  # fmt: skip
    context_sync = sum(synced(e, streams_of[e["args"]["device"]]) for e in syncs
                       if e["name"] == "Context Sync")  # fmt: skip

    with xpuprof.load(path) as trace:
        g = dependency_graph(trace, 0)
        c = g.edge_counts()
    assert len(g.nodes) == 2 * len(host) + 2 * len(work)
    assert c["host_work"] + c["host_gap"] + c["host_wait"] == 2 * len(host) - len(threads)
    assert c["host_gap"] == top_level - len(threads)
    assert c["host_wait"] == sum(e["name"] in BLOCKING_CALLS for e in host)
    nccl = sum("nccl" in e["name"].lower() for e in work)
    assert (c["device_work"], c["device_communication"]) == (len(work) - nccl, nccl)
    assert (c["stream_sync"], c["context_sync"]) == (stream_sync, context_sync)
    assert stream_sync > 0 and context_sync > 0 and c["host_wait"] > 0
    # a launch edge joins a runtime call to the work carrying its correlation id
    launch = g.edges.kind == EdgeKind.LAUNCH
    ids = g.nodes.event
    src, dst = ids[g.edges.src[launch]], ids[g.edges.dst[launch]]
    raw = raw_json(path)["traceEvents"]
    mask = (1 << 40) - 1
    assert all(raw[s & mask]["args"]["correlation"] == raw[d & mask]["args"]["correlation"]
               and raw[s & mask]["cat"] == "cuda_runtime" for s, d in
               zip(src.tolist(), dst.tolist(), strict=True))  # fmt: skip
    assert 0 < launch.sum() + c["kernel_gap"] <= len(work)

"""``overlap-collective[:REGEX][@UNTIL]``: a collective runs on a stream of its own and the
compute stream waits for it only where its result is needed, so it overlaps the compute
between (what ``async_op=True`` with a late ``work.wait()``, or DDP's bucketing, does).

In a PyTorch trace NCCL's kernels already run on NCCL's streams; what serialises them with
the compute is the compute stream's *wait* for the collective (``work.wait()`` makes the
current stream wait for the NCCL stream: the replay graph's ``stream_wait_event`` edge from
the collective's end to the waiting stream's next work, recorded or inferred). The change
moves each such wait of a selected collective (REGEX on collective names; default: all) from
the work right after the collective to its *consumer*:

- with ``@UNTIL`` (a regular expression on host event names, e.g. ``@Optimizer.step``): the
  first work on the waiting stream, after the original wait, launched from inside a host
  event matching UNTIL;
- without it, or when no such work exists: the first work on the waiting stream that starts
  after the end of the step that launched the collective (the next step's first work): the
  most overlap a rewrite can give, since a trace records no data flow that says where the
  result is read. The step's "with device" time still includes the collective's end.

A moved wait carries the model's delay (0: an event wait costs nothing once its event has
completed). Where there is no later work, the wait is dropped. Host calls that wait for the
collective itself (a stream sync on NCCL's stream) keep waiting.

Not modelled: a collective that shares its stream with the compute (XLA's in-stream
collectives): the replay graph serialises a stream's work in program order, and moving work
to another stream needs the graph rebuilt, which this version does not do — such a change is
an error that says so. Contention between the overlapped collective and the compute for SMs
and memory bandwidth is not in the trace either: the prediction is the overlap's upper bound.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from xpuprof.core.errors import XpuprofError
from xpuprof.sim.graph import DEVICE_END, DEVICE_START, HOST_START
from xpuprof.sim.graph import STREAM_WAIT_EVENT as WAIT
from xpuprof.sim.whatif import (
    Change,
    checked_pattern,
    ends_of,
    inside,
    launch_calls,
    member,
    select,
)

if TYPE_CHECKING:
    from xpuprof.sim.graph import ReplayGraph
    from xpuprof.sim.transforms import Context

PRICED = False


def parse(text: str, verb: str, arg: str, value: str) -> Change:
    """``overlap-collective[:REGEX][@UNTIL]``; no value."""
    if value:
        raise XpuprofError(f"change {text!r}: {verb} takes no factor")
    pattern, _, until = arg.partition("@")
    options = (("until", checked_pattern(text, until.strip())),) if until.strip() else ()
    return Change(text, verb, ("collective",), checked_pattern(text, pattern.strip() or None),
                  options=options)  # fmt: skip


def apply(c: Change, ctx: Context) -> str:
    """Move the waits (module docstring); ``ctx.graph`` becomes a graph whose moved wait
    edges point at their consumers (same nodes, same edge numbering)."""
    g = ctx.graph
    n, e = g.nodes, g.edges
    ids = select(Change(c.text, "scale", ("collective",), c.pattern), ctx.names)
    ends = np.flatnonzero((n.kind == DEVICE_END) & member(n.event, ids))
    _check_own_stream(c, ctx, ends)
    waits = np.flatnonzero((e.kind == WAIT) & ctx.keep & member(e.src, ends)
                           & (n.timeline[e.dst] != n.timeline[e.src]))  # fmt: skip
    if not len(waits):
        raise XpuprofError(f"change {c.text!r}: no stream waits for the selected collectives "
                           "in the replay graph: they overlap the compute already")  # fmt: skip
    consumer = _step_end_consumers(ctx, waits)
    until = c.option("until")
    found = 0
    if until:
        region = select(Change(c.text, "scale", (), until), ctx.names)
        late = _until_consumers(ctx, waits, np.union1d(region, inside(g, region)))
        found = int((late >= 0).sum())
        consumer = np.where(late >= 0, late, consumer)
    dst = e.dst.copy()
    moved = consumer >= 0
    dst[waits[moved]] = consumer[moved]
    ctx.delay[waits[moved]] = 0
    ctx.keep[waits[~moved]] = False
    ctx.graph = dataclasses.replace(g, edges=dataclasses.replace(e, dst=dst))
    k = int(moved.sum())
    where = (f"{found:,} to the work of {until!r}, {k - found:,} to the next step's first work"
             if until else "to the next step's first work")  # fmt: skip
    bound = ("" if until and found == k and k else "; an upper bound: a trace records no data "
             "flow that says where a collective's result is read")  # fmt: skip
    return (
        f"{c.text}: {len(ids):,} collective kernels; {k:,} stream waits moved ({where})"
        + (f", {int((~moved).sum()):,} dropped (no later work)" if (~moved).any() else "")
        + ("" if not until or found else f"; no work of {until!r} follows them")
        + bound
    )


def _check_own_stream(c: Change, ctx: Context, ends: np.ndarray) -> None:
    """The selected collectives must run on streams without other work (module docstring)."""
    n = ctx.graph.nodes
    tls = np.unique(n.timeline[ends])
    on = np.isin(n.timeline, tls) & (n.kind == DEVICE_START)
    colls = ctx.names.frame(("collective",))["id"].to_numpy()
    other = on & ~member(n.event, colls)
    if other.any():
        t = ctx.graph.timelines
        k = int(n.timeline[np.flatnonzero(other)[0]])
        raise XpuprofError(
            f"change {c.text!r}: the selected collectives run on stream {int(t.stream[k])} of "
            f"device {int(t.device[k])} together with other work; the replay runs a stream's "
            "work in program order, and moving work to a stream of its own needs the graph "
            "rebuilt, which this version does not do (docs/whatif.md)")  # fmt: skip


def _step_end_consumers(ctx: Context, waits: np.ndarray) -> np.ndarray:
    """Per wait edge: the first work on its waiting stream launched at or after the end of
    the step in which the collective was launched (-1: none; the original target when the
    collective's launch lies in no step)."""
    g = ctx.graph
    n, e = g.nodes, g.edges
    call = launch_calls(g)
    # when each node's work was launched (its own time for work without a launch)
    launched_at = np.where(call >= 0, n.time[np.maximum(call, 0)], n.time)
    steps = ctx.names.frame(("step",))["id"].to_numpy()
    s_nodes = np.flatnonzero((n.kind == HOST_START) & member(n.event, steps))
    s_ends = ends_of(g, n.event[s_nodes])
    out = e.dst[waits].copy()
    for k, w in enumerate(waits.tolist()):
        cs = int(call[e.src[w] - 1])  # the call that launched the collective (start point)
        if cs < 0:
            continue
        p, t = n.part[cs], n.time[cs]
        mine = (n.part[s_nodes] == p) & (n.time[s_nodes] <= t) & (n.time[s_ends] >= t)
        if not mine.any():
            continue
        step_end = n.time[s_ends[np.flatnonzero(mine)[-1]]]
        out[k] = _first_after(g, int(e.dst[w]), launched_at >= step_end)
    return out


def _until_consumers(ctx: Context, waits: np.ndarray, region: np.ndarray) -> np.ndarray:
    """Per wait edge: the first work on its waiting stream after the original target launched
    by a host call inside ``region`` (host event ids; -1: none)."""
    g = ctx.graph
    n, e = g.nodes, g.edges
    call = launch_calls(g)
    launched_in = (call >= 0) & member(n.event[np.maximum(call, 0)], region)
    return np.array([_first_after(g, int(e.dst[w]), launched_in) for w in waits.tolist()],
                    np.int64)  # fmt: skip


def _first_after(g: ReplayGraph, node: int, ok: np.ndarray) -> int:
    """The first device start at or after ``node`` on its timeline where ``ok`` (a mask over
    the nodes) holds; -1: none."""
    n = g.nodes
    stop = int(g.timelines.stop[n.timeline[node]])
    hit = np.flatnonzero(ok[node:stop] & (n.kind[node:stop] == DEVICE_START))
    return node + int(hit[0]) if len(hit) else -1

"""The diagnosis' headline: which rank (and device) is judged, what bounds it, in one sentence
(``docs/advise.md`` defines its parts). Split from :mod:`xpuprof.analysis.diagnosis`, which
computes the tables these sentences read; the advisor's findings phrase their evidence with
the same helpers (:func:`top_names`, :func:`device_label`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from xpuprof.analysis.common import number_ranges
from xpuprof.analysis.diagnosis import BOTTLENECKS, fmt_ns
from xpuprof.analysis.path_events import describe
from xpuprof.analysis.path_time import path_times
from xpuprof.core.text import short_name

if TYPE_CHECKING:
    from xpuprof.trace.trace import Trace


def judged(per_step: pd.DataFrame) -> tuple[int, int, str]:
    """The (part, device) judged, and why it: the one with the slowest mean step
    (``slowest``); among devices that share their step windows (one rank's host steps), the
    one that works longest per step (``busiest``): the step waits for it."""
    idle = per_step.device_idle_ns + per_step.off_path_ns
    g = per_step.assign(busy=per_step.step_ns - idle).groupby(["part", "device"])
    means = pd.DataFrame({"step": g.step_ns.mean(), "busy": g.busy.mean()})
    means = means.sort_values(["step", "busy"], ascending=False, kind="stable")
    part, device = means.index[0]
    tied = (means.step == means.step.iloc[0]).sum() > 1
    return int(part), int(device), "busiest" if tied else "slowest"


def device_label(trace: Trace, part: int, device: int) -> str:
    """How a sentence names one device of a part: ``TPU 1``, ``GPU 0``, ``MTIA 0``."""
    from xpuprof.analysis.platform import platform_of

    kind = {"tpu": "TPU", "nvidia": "GPU", "amd": "GPU", "mtia": "MTIA"}
    return f"{kind.get(platform_of(trace, part).vendor, 'device')} {device}"


def facts(trace: Trace, tables: dict) -> dict:
    """The diagnosis' facts (``docs/advise.md``): the judged part and device, its bottleneck
    and the headline."""
    part, device, why = judged(tables["steps"])
    with judged_trace(trace, part) as one:
        return _facts_of(one, tables, part, device, why)


@contextmanager
def judged_trace(trace: Trace, part: int) -> Iterator[Trace]:
    """The trace the judged part's path and headline are read from: in a job of many ranks
    (:data:`~xpuprof.analysis.per_rank.DASK_MIN_PARTS`, whose paths were per-rank tasks) that
    part opened alone, seeded with its collectives' waits as a task is, so this process never
    reads every rank's rows for one sentence; else ``trace`` itself."""
    from xpuprof.analysis.per_rank import DASK_MIN_PARTS, TASK_DUCKDB, wait_seeds
    from xpuprof.trace.trace import Trace as Opened

    if len(trace.sources) < DASK_MIN_PARTS:
        yield trace
        return
    with Opened(trace.path, parts=[part], duckdb_config=dict(TASK_DUCKDB)) as one:
        one.memo.update(wait_seeds(trace, [part])[part])
        yield one


def _facts_of(trace: Trace, tables: dict, part: int, device: int, why: str) -> dict:
    per_step, summary, events = tables["steps"], tables["summary"], tables["events"]
    s = summary[(summary.part == part) & (summary.device == device)
                & summary.category.isin(BOTTLENECKS)]  # fmt: skip
    # the judged part's path (computed again here when the ranks were tasks: one rank)
    facts: dict = {"steps": len(per_step), "path": path_times(trace, [part])[part].source}
    if s.empty:
        return facts
    top = s.iloc[0]
    mine = per_step[(per_step.part == part) & (per_step.device == device)]
    rank = mine["rank"].iloc[0]
    steps = mine.step.dropna().astype(int).tolist()
    n_devices = per_step[per_step.part == part].device.nunique()
    facts |= {
        "bottleneck": str(top.category),
        "bottleneck_rank": None if pd.isna(rank) else int(rank),
        "bottleneck_device": device if device >= 0 else None,
        "bottleneck_ns_per_step": float(top.time_ns),
        "bottleneck_share": float(top.share),
        "headline": headline(trace, s, events, rank, steps, part,
                             device if n_devices > 1 else -1, f"{why} of {n_devices}"),
    }  # fmt: skip
    return facts


#: How a headline names each category (``{runtime}``: the platform's device API).
PHRASE = {
    "input": "waiting for input", "cpu": "CPU-bound framework work",
    "outside_ops": "host time outside framework ops (Python, untraced code)",
    "runtime": "{runtime}runtime calls", "launch": "kernel-launch overhead",
    "sync": "host blocked", "compute": "device compute", "memcpy": "memory copies",
    "memset": "memory sets", "communication": "communication",
    "comm_wait": "waiting in collectives", "device_gap": "gaps between device work",
    "other": "other device work", "device_idle": "device idle", "off_path": "off the path",
}  # fmt: skip


def headline(trace: Trace, ranked: pd.DataFrame, events: pd.DataFrame, rank, steps: list[int],
             part: int = 0, device: int = -1, which: str = "") -> str:  # fmt: skip
    """``Bottleneck: <what> <time> per step (<share>)[, most in <where>], rank R[, TPU D
    (<which>: slowest of N)], steps A–B``: the category with the most time per step on the judged
    path (``ranked``: its summary rows, largest first), and the runner-up when it is at least
    half as large (then fixing the first alone leaves at least a third of the two: naming one
    would mislead). A trace without steps says "of the trace" instead of "per step"."""
    ranked = ranked.assign(stepped=bool(steps))
    first = ranked.iloc[0]
    parts = [phrase(trace, first, events, part, rank, device)]
    if len(ranked) > 1 and ranked.iloc[1].time_ns >= 0.5 * first.time_ns:
        parts.append(phrase(trace, ranked.iloc[1], events, part, rank, device))
    where = [] if rank is None or pd.isna(rank) else [f"rank {int(rank)}"]
    if device >= 0:
        where.append(f"{device_label(trace, part, device)}{f' ({which})' if which else ''}")
    if steps:
        where.append(f"step{'s' if len(steps) > 1 else ''} {number_ranges(steps)}")
    return "Bottleneck: " + "; ".join(parts) + "".join(", " + w for w in where)


#: XLA names each instance of an HLO op ``<name>.<n>`` (``copy-done.2``, ``fusion.14``): one
#: op family is the name without that suffix.
_XLA_INSTANCE = re.compile(r"\.\d+$")


def family(name: str, xla: bool = False, device_work: bool = True) -> str:
    """The name a sentence groups an event under: device work without template arguments
    (:func:`short_name`), and on XLA without the instance number (``copy-done.2`` →
    ``copy-done``); host names as they are."""
    if not device_work:
        return name
    name = short_name(name)
    return _XLA_INSTANCE.sub("", name) if xla else name


#: Path categories of device work (named by kernel, grouped by :func:`family`).
DEVICE_WORK = ("compute", "memcpy", "memset", "communication", "other")
#: A name "holds most" of a category at this share; below it the sentence says "led by".
MOST = 0.5


def top_names(trace: Trace, events: pd.DataFrame, part: int, device: int,
              category: str) -> pd.DataFrame:  # fmt: skip
    """The names a category's path time is charged to, grouped by :func:`family`, largest
    first: ``name`` (the family), ``per_step_ns``, ``ids`` (the first id of each member,
    largest member first)."""
    from xpuprof.analysis.platform import platform_of

    evs = events[(events.part == part) & (events.device == device)
                 & (events.category == category) & (events.name != "(no event)")]  # fmt: skip
    if evs.empty:
        return pd.DataFrame(columns=["name", "per_step_ns", "ids"])
    xla = platform_of(trace, part).framework == "xla"
    dev = category in DEVICE_WORK
    fam = [family(str(n), xla, dev) for n in evs.name]
    g = (
        evs.assign(family=fam)
        .groupby("family", sort=False)
        .agg(per_step_ns=("per_step_ns", "sum"), ids=("ids", lambda x: [i[0] for i in x if i]))
    )
    g = g.sort_values("per_step_ns", ascending=False).reset_index()
    return g.rename(columns={"family": "name"})


def phrase(trace: Trace, row: pd.Series, events: pd.DataFrame, part: int, rank,
           device: int = -1) -> str:  # fmt: skip
    """One category of a path in words: what, how long per step, the share of the step,
    and the name most of it is charged to ("most in", or "led by" when that name holds less
    than half of it), with the op and annotation above it."""
    from xpuprof.analysis.platform import platform_of

    category = str(row.category)
    t = (f"{fmt_ns(row.time_ns)} per step ({row.share:.0%})" if row.get("stepped", True)
         else f"{fmt_ns(row.time_ns)} ({row.share:.0%} of the trace)")  # fmt: skip
    plat = platform_of(trace, part)
    rt = plat.runtime
    words = PHRASE[category].format(runtime=f"{rt} " if rt else "")
    host = path_times(trace, [part])[part].source == "host"  # a step/layer capture
    if category == "cpu" and plat.vendor == "cpu":
        words = "work in layer spans" if host else "framework ops (a CPU run's compute)"
    if category == "outside_ops" and host:
        words = "host time outside layer spans (loss, backward, optimizer, Python)"
    if category == "comm_wait":
        late = late_rank(trace, rank)
        return f"{words}{f' for rank {late}' if late is not None else ''} {t}"
    names = top_names(trace, events, part, device, category)
    if category == "input" and names.empty:  # charged to no event: host time between steps
        return f"{words} {t} in the loop's batch fetch (no span recorded)"
    if names.empty or category in ("outside_ops", "device_gap", "device_idle"):
        return f"{words} {t}"
    first = names.iloc[0]
    d = describe(trace, np.asarray(first.ids[:1], np.int64)).iloc[0]
    where = _where(d)
    if category == "sync":
        return f"host blocked {t} in {d.what}{f' ({where})' if where else ''}"
    share = first.per_step_ns / row.time_ns if row.time_ns else 0.0
    if share >= MOST:
        return f"{words} {t}, most in `{first['name']}`{f' ({where})' if where else ''}"
    return f"{words} {t}, led by `{first['name']}` ({share:.0%}{f'; {where}' if where else ''})"


def _where(d: pd.Series) -> str:
    """What called an event, in words: ```op` under `annotation``` (or ``in `layer```)."""
    parts = []
    if d.get("op") and d["op"] != d["name"]:
        parts.append(f"`{d['op']}`")
    if d.get("annotation") and d["annotation"] != d["name"]:
        parts.append(f"under `{d['annotation']}`")
    elif d.get("layer") and d["layer"] != d["name"]:
        parts.append(f"in `{d['layer']}`")
    return " ".join(parts)


def late_rank(trace: Trace, rank) -> int | None:
    """The participant most often last in the collectives this rank waited in."""
    from xpuprof.analysis.comm import collective_waits

    w = collective_waits(trace)
    if w.empty:
        return None
    mine = w[(w["rank"] == rank) & (w.wait_ns > 0)] if rank is not None else w[w.wait_ns > 0]
    if mine.empty:
        return None
    late = mine.groupby("last_rank").wait_ns.sum().sort_values(ascending=False)
    return None if late.empty or pd.isna(late.index[0]) else int(late.index[0])

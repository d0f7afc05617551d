"""Merging leveled runs (:mod:`xpuprof.live.leveled`) into one across-stack picture, and
the statistics every level is judged by.

**Merging.** Every recorded unit of a step (layer span, op, annotation, runtime call, kernel)
gets a key: its ancestors' keys, its name and its ordinal among same-named siblings (``step ›
blocks.0#0 › aten::linear#1``). A shallower run's units are a subset of a deeper run's (the
deeper levels add units, never remove them), so the keys correlate the runs by module path and
op sequence. The merged tree is the deepest run's step closest to its median (its structure),
with each unit timed by the shallowest run that records it — the step by the model run, layers
by the layer run, ops by the op run, kernels by the kernel run — as the mean over that run's
measured steps, with its interval. Laid out as a timeline: a unit's children keep their order
and their own times; the parent's time left over is spread over the gaps in proportion to the
gaps of the deepest run; should the children's own times exceed the parent's (a child timed by
a deeper run carries that run's overhead), they are scaled to fit and the unit is marked
``compressed``. Kernels keep their queueing after their launch call. The merged timeline is
written as one step of a Kineto trace and imported into the ``merged`` store, so every tool
reads it; each unit's args carry ``leveled`` (the level that timed it, its interval).

A unit that no shallower run records is timed by the deepest run that does (counted as
unmatched when the runs' structures differ, e.g. data-dependent control flow).
"""

from __future__ import annotations

import contextlib
import math
import sys
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from xpuprof.core.errors import XpuprofError
from xpuprof.live.profile import LEVELED

#: The levels, shallowest first.
LEVELS = tuple(LEVELED)
#: Units' levels (the events table's ``level``) keyed across runs.
UNIT_LEVELS = ("step", "layer", "annotation", "op", "runtime", "kernel", "memcpy", "memset")
DEVICE_LEVELS = ("kernel", "memcpy", "memset")
#: Separates the parts of a unit's key.
SEP = " › "

#: Student's t, two-sided 95 %, by degrees of freedom (the largest tabulated ≤ df is used).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
        16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 22: 2.074, 24: 2.064,
        26: 2.056, 28: 2.048, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}  # fmt: skip


def t95(df: int) -> float:
    """Student's t quantile for a two-sided 95 % interval with ``df`` degrees of freedom
    (conservative between tabulated values; 1.96 beyond 120)."""
    if df < 1:
        return math.inf
    if df > 120:
        return 1.96
    return _T95[max(k for k in _T95 if k <= df)]


def median_interval(samples: Sequence[float]) -> tuple[float, float, float]:
    """The median and its distribution-free 95 % confidence interval (order statistics of
    ranks n/2 ∓ 1.96·√n/2, as in Conover's *Practical Nonparametric Statistics*): robust to
    the stray slow step a shared machine adds, which moves a mean and widens its interval.
    With fewer than 6 samples the interval is the whole range."""
    x = sorted(samples)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan
    mid = n // 2
    median = x[mid] if n % 2 else (x[mid - 1] + x[mid]) / 2
    spread = 1.96 * math.sqrt(n) / 2
    lo = max(1, round(n / 2 - spread))  # 1-based ranks
    hi = min(n, round(1 + n / 2 + spread))
    return median, x[lo - 1], x[hi - 1]


def relative_width(samples: Sequence[float]) -> float:
    """How far the median's 95 % interval reaches from the median, as a fraction of it."""
    median, lo, hi = median_interval(samples)
    if not median or len(samples) < 2:
        return math.inf
    return max(median - lo, hi - median) / median


def interval(samples: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (inf for fewer than 2)."""
    n = len(samples)
    if n == 0:
        return math.nan, math.inf
    mean = sum(samples) / n
    if n < 2:
        return mean, math.inf
    var = sum((x - mean) ** 2 for x in samples) / (n - 1)
    return mean, t95(n - 1) * math.sqrt(var / n)


@dataclass
class LevelRun:
    """One level's run(s): the stores written, and each measured step as (store index, step
    number, time ns). ``stable``: the interval reached its target."""

    level: str
    stores: list[Path] = field(default_factory=list)
    samples: list[tuple[int, int, int]] = field(default_factory=list)
    stable: bool = False
    note: str = ""

    @property
    def times_ns(self) -> list[int]:
        return [t for _, _, t in self.samples]


@dataclass
class Leveled:
    """A leveled measurement: per level its run; ``levels`` (one row per level: steps, mean,
    interval, overhead against the model level), ``tree`` (the merged across-stack tree, one
    row per unit, depth-first), the ``merged`` store, and notes. :meth:`result` is what the
    CLI, the web and ``--json`` show."""

    out: Path
    runs: list[LevelRun]
    levels: Any
    tree: Any
    merged: Path | None
    notes: list[str]
    facts: dict[str, Any]

    def result(self) -> Any:
        from xpuprof.core.result import Presentation, Result

        tree = shown(self.tree)
        if len(tree):
            tree["unit"] = ["  " * d + n for d, n in zip(tree["depth"], tree["name"], strict=True)]
            tree = tree[["unit", "level", "timed_by", "time_ms", "ci_pct", "calls",
                         "deepest_ms", "distortion_pct"]]  # fmt: skip
        return Result(
            tables={"levels": self.levels, "tree": tree},
            notes=list(self.notes),
            facts={"headline": self.headline(), **self.facts},
            present={
                "levels": Presentation(title="Step time per level (each in its own run)",
                                       all_rows=True),
                "tree": Presentation(title="Across-stack tree, each unit timed by its own "
                                     "level's run (mean per step)"),
            },
        )  # fmt: skip

    def headline(self) -> str:
        """One sentence: the step time at the shallowest level measured, its interval, and
        what each deeper level's profiling added."""
        lv = self.levels
        if not len(lv):
            return ""
        first = lv.iloc[0]
        text = (f"Step {first['median_ms']:.3g} ms at the {first['level']} level "
                f"(median of {first['steps']} steps, ±{first['ci_pct']:.1f} %)")  # fmt: skip
        more = []
        for r in lv.iloc[1:].itertuples():
            if r.overhead_pct is None or r.overhead_pct != r.overhead_pct:
                continue
            # an overhead whose interval overlaps the first level's is not told from noise
            noise = r.ci_low_ms <= first["ci_high_ms"] and first["ci_low_ms"] <= r.ci_high_ms
            more.append(f"{r.level} {r.overhead_pct:+.1f} %" + (" (within the intervals)"
                                                                   if noise else ""))  # fmt: skip
        if more:
            text += "; profiling overhead " + ", ".join(more)
        return text + f"; merged across-stack store {self.merged}"

    def save(self) -> Path:
        """Write ``leveled.json`` (the result's JSON document) into :attr:`out`."""
        doc = self.result().to_dict()
        doc["runs"] = [{"level": r.level, "stores": [str(s) for s in r.stores],
                        "times_ns": r.times_ns, "stable": r.stable, "note": r.note}
                       for r in self.runs]  # fmt: skip
        path = self.out / "leveled.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_bytes(msgspec.json.encode(doc, enc_hook=plain_number))
        tmp.replace(path)
        return path


def shown(tree: Any) -> Any:
    """The units a reader scans: the step, layers, annotations, the ops called directly from
    Python (an op inside another op is the caller's implementation) and device work; the
    merged store and ``leveled.json`` hold every unit."""
    parent_level = dict(zip(tree["key"], tree["level"], strict=True))
    inner = [lv == "op" and parent_level.get(p) == "op"
             for lv, p in zip(tree["level"], tree["parent"], strict=True)]  # fmt: skip
    keep = [not x and lv != "runtime" for x, lv in zip(inner, tree["level"], strict=True)]
    return tree[keep].copy()


# -- merging --------------------------------------------------------------------------------------


def first_rank(store: Any) -> Any:
    """The store of one level's run as a Trace of its lowest rank only: a distributed job's
    levels (``xpuprof leveled -- torchrun ...``) hold one part per rank, and the levels are
    merged on one rank (the ranks of a synchronous job step together)."""
    from xpuprof.trace.trace import Trace

    t = Trace(store)
    if len(t.sources) < 2:
        return t
    first = min(t.sources, key=lambda s: (s.get("rank") is None, s.get("rank") or 0, s["part"]))
    t.close()
    return Trace(store, parts=[int(first["part"])])


def ranks_note(store: Any) -> str | None:
    """A note when a level's store holds several ranks (merged on the lowest rank)."""
    from xpuprof.trace.trace import Trace

    with Trace(store) as t:
        ranks = sorted({s.get("rank") for s in t.sources if s.get("rank") is not None})
    if len(ranks) < 2:
        return None
    return (
        f"the script ran {len(ranks)} ranks: every rank recorded each level; the levels are "
        f"measured and merged on rank {ranks[0]}'s (a synchronous job's ranks step together)"
    )


def units(trace: Any, steps: set[int] | None = None) -> Any:
    """Every unit of the given steps (all: None) with its key (module docstring): columns
    ``id, key, parent_key, level, category, name, ts, dur, step, pid, tid, args``; host units
    in time order, then device units."""
    import pandas as pd

    ev = trace.sql(
        "select id, parent, level, category, name, ts, dur, step, pid, tid, part, correlation, "
        "device, args from events where dur is not null and level in ("
        + ", ".join(f"'{lv}'" for lv in UNIT_LEVELS)
        + ")"
    )
    host = ev[ev["device"] < 0].sort_values(["ts", "dur"], ascending=[True, False], kind="stable")
    key: dict[int, str] = {}
    step_of: dict[int, int] = {}
    seen: dict[tuple[int, str], int] = defaultdict(int)
    keep: list[int] = []
    parents: list[str] = []
    keys: list[str] = []
    for row, (i, parent, level, name, st) in enumerate(
        zip(host["id"], host["parent"], host["level"], host["name"], host["step"], strict=True)
    ):
        if level == "step":
            if pd.isna(st) or (steps is not None and int(st) not in steps):
                continue
            key[i], step_of[i] = "step", int(st)
            keep.append(row)
            parents.append("")  # the root's parent (None would read as NaN)
            keys.append("step")
            continue
        if pd.isna(parent) or int(parent) not in key:
            continue
        parent = int(parent)
        o = seen[(parent, name)]
        seen[(parent, name)] = o + 1
        k = f"{key[parent]}{SEP}{name}#{o}"
        key[i], step_of[i] = k, step_of[parent]
        keep.append(row)
        parents.append(key[parent])
        keys.append(k)
    h = host.iloc[keep].copy()
    h["key"], h["parent_key"] = keys, parents
    h["step"] = [step_of[i] for i in h["id"]]
    # device units: by the launch call with their correlation id, in the same part
    dev = ev[ev["device"] >= 0].dropna(subset=["correlation"]).sort_values("ts", kind="stable")
    launch = {(int(p), int(c)): i for p, c, i in zip(h["part"], h["correlation"], h["id"],
                                                     strict=True) if not pd.isna(c)}  # fmt: skip
    dkeep, dkeys, dparents, dsteps = [], [], [], []
    for row, (p, c, name) in enumerate(zip(dev["part"], dev["correlation"], dev["name"],
                                           strict=True)):  # fmt: skip
        i = launch.get((int(p), int(c)))
        if i is None:
            continue
        o = seen[(i, name)]
        seen[(i, name)] = o + 1
        dkeep.append(row)
        dparents.append(key[i])
        dkeys.append(f"{key[i]}{SEP}{name}#{o}")
        dsteps.append(step_of[i])
    d = dev.iloc[dkeep].copy()
    d["key"], d["parent_key"], d["step"] = dkeys, dparents, dsteps
    cols = ["id", "key", "parent_key", "level", "category", "name", "ts", "dur", "step", "pid",
            "tid", "args"]  # fmt: skip
    return pd.concat([h[cols], d[cols]], ignore_index=True)


def _per_step(u: Any, measured: set[int]) -> dict[str, tuple[list[float], list[int]]]:
    """key → (its time in each measured step it appears in, its calls in each)."""
    u = u[u["step"].isin(measured)]
    per = u.groupby(["key", "step"], sort=False)["dur"].agg(["sum", "count"])
    return {
        k: (g["sum"].tolist(), g["count"].tolist()) for k, g in per.groupby(level=0, sort=False)
    }


def merge(
    runs: list[LevelRun],
    root: Path,
    *,
    notes: list[str] | None = None,
    samples: int | None = None,
    extra_facts: dict[str, Any] | None = None,
) -> Leveled:
    """Merge the levels' runs (module docstring) into the tree, the levels table and the
    ``merged`` store under ``root``."""

    notes = list(notes or [])
    if not runs:
        raise XpuprofError("no level ran: nothing to merge")
    stats: list[dict[str, tuple[float, float, int, float]]] = []
    skeleton = None
    for j, run in enumerate(runs):
        times: dict[str, list[float]] = defaultdict(list)
        calls: dict[str, list[int]] = defaultdict(list)
        for s_index, store in enumerate(run.stores):
            with first_rank(store) as t:
                u = units(t)
            if j == len(runs) - 1 and s_index == 0:
                skeleton = _representative(u, run)
            measured = {n for s, n, _ in run.samples if s == s_index}
            for k, (ts, cs) in _per_step(u, measured).items():
                times[k].extend(ts)
                calls[k].extend(cs)
        st = {k: (*interval(v), len(v), sum(calls[k]) / len(v)) for k, v in times.items()}
        st["step"] = (*interval(run.times_ns), len(run.samples), 1.0)
        stats.append(st)
        if run.note:
            notes.append(run.note)
    assert skeleton is not None
    tree, unmatched = _tree(skeleton, runs, stats)
    if unmatched:
        notes.append(
            f"{unmatched} unit(s) of the deepest run are not in the shallower run(s) "
            "that should record them (their structure differs); timed by the deepest"
        )
    levels = _levels_table(runs, samples)
    merged = root / "merged.store"
    _write_merged(skeleton, tree, runs, merged)
    facts: dict[str, Any] = {"deepest_level": runs[-1].level, "merged_store": str(merged),
                             "out": str(root)}  # fmt: skip
    by_level = {r.level: st for r, st in zip(runs, stats, strict=True)}
    model = next((r for r in runs if r.level == "model"), None)
    if model is not None:
        facts.update(model_ms=median_interval(model.times_ns)[0] / 1e6,
                     model_ci_pct=100 * relative_width(model.times_ns))  # fmt: skip
    if "layer" in by_level:
        facts.update(_layer_sum(skeleton, by_level["layer"]))
    facts.update(extra_facts or {})
    result = Leveled(root, runs, levels, tree, merged, notes, facts)
    result.save()
    return result


def _representative(u: Any, run: LevelRun) -> Any:
    """The units of the deepest run's measured step whose time is closest to its median."""
    mine = [(n, t) for s, n, t in run.samples if s == 0]
    times = sorted(t for _, t in mine)
    median = times[len(times) // 2]
    step = min(mine, key=lambda nt: (abs(nt[1] - median), nt[0]))[0]
    return u[u["step"] == step].reset_index(drop=True)


def _tree(skeleton: Any, runs: list[LevelRun],
          stats: list[dict[str, tuple[float, float, int, float]]]) -> tuple[Any, int]:  # fmt: skip
    """One row per unit of the skeleton, depth-first: its own level's time and interval,
    the deepest run's time."""
    import pandas as pd

    deepest = stats[-1]
    rows = []
    unmatched = 0
    own_level = {"step": "model", "layer": "layer", "op": "op",
                 "runtime": "kernel", "kernel": "kernel", "memcpy": "kernel",
                 "memset": "kernel"}  # fmt: skip
    order = list(LEVELS)
    cols = [skeleton[c] for c in ("key", "parent_key", "level", "name", "args")]
    for k, parent, level, name, args in zip(*cols, strict=True):
        j = next(j for j, st in enumerate(stats) if k in st)
        mean, half, n, calls = stats[j][k]
        expected = own_level.get(level)  # annotations: torch's exist only under its profiler
        if (
            expected is not None
            and order.index(runs[j].level) > order.index(expected)
            and any(order.index(r.level) >= order.index(expected) for r in runs[:j])
        ):
            unmatched += 1
        d = deepest.get(k, (math.nan,))[0]
        rows.append({"key": k, "parent": parent, "depth": k.count(SEP), "level": level,
                     "name": "step" if k == "step" else name, "timed_by": runs[j].level,
                     "time_ns": mean, "ci_ns": half, "steps": n, "calls": calls,
                     "deepest_ns": d, "type": _module_type(level, args)})  # fmt: skip
    t = pd.DataFrame(rows)
    t["time_ms"] = t["time_ns"] / 1e6
    t["ci_pct"] = 100 * t["ci_ns"] / t["time_ns"]
    t["deepest_ms"] = t["deepest_ns"] / 1e6
    t["distortion_pct"] = 100 * (t["deepest_ns"] / t["time_ns"] - 1)
    return _depth_first(t), unmatched


def _module_type(level: str, args: Any) -> str | None:
    """A layer's module class (its span's ``module`` arg); None for other units."""
    if level != "layer" or not isinstance(args, str):
        return None
    from xpuprof.core.raw import decode_json

    got = decode_json(args, default={})
    return got.get("module") if isinstance(got, dict) else None


def _depth_first(t: Any) -> Any:
    kids: dict[Any, list[int]] = defaultdict(list)
    for i, p in enumerate(t["parent"]):
        kids[p].append(i)
    order: list[int] = []
    stack = list(reversed(kids[""]))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(reversed(kids[t["key"].iat[i]]))
    return t.iloc[order].reset_index(drop=True)


def _layer_sum(
    skeleton: Any, layer: dict[str, tuple[float, float, int, float]]
) -> dict[str, float]:
    """What the layer run's units add up to: the step's direct units it records (layers and
    annotations), and the rest of its step outside them (backward, loss and optimizer when
    only forward spans are recorded). Their sum is the layer run's step time, so comparing it
    with the model level's is comparing the two runs: the layer level's overhead."""
    top = skeleton.loc[skeleton["parent_key"] == "step", "key"]
    units = sum(layer[k][0] for k in top if k in layer)
    step = layer["step"][0]
    return {"layer_units_ms": units / 1e6, "outside_layers_ms": (step - units) / 1e6,
            "layer_sum_ms": step / 1e6}  # fmt: skip


def _levels_table(runs: list[LevelRun], samples: int | None) -> Any:
    """One row per level: its step time (median, the 95 % interval of the median, the mean),
    whether the interval reached its target, and the overhead over the model level's median."""
    import pandas as pd

    model = next((r for r in runs if r.level == "model"), None)
    base = median_interval(model.times_ns)[0] if model is not None else math.nan
    rows = []
    for run in runs:
        median, lo, hi = median_interval(run.times_ns)
        row = {"level": run.level, "runs": len(run.stores), "steps": len(run.samples),
               "median_ms": median / 1e6, "ci_low_ms": lo / 1e6, "ci_high_ms": hi / 1e6,
               "ci_pct": 100 * relative_width(run.times_ns),
               "mean_ms": sum(run.times_ns) / len(run.samples) / 1e6, "stable": run.stable,
               "overhead_pct": 100 * (median / base - 1) if base == base else None}  # fmt: skip
        if samples:
            row["samples_per_s"] = samples / (median / 1e9)
        rows.append(row)
    return pd.DataFrame(rows)


def plain_number(x: Any) -> Any:
    """numpy scalars as Python numbers: the encoder hook of ``leveled.json``, the merged trace
    and the sweep's documents (msgspec's ``enc_hook``, json's ``default``)."""
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"cannot encode {type(x).__name__}")


# -- the merged store -----------------------------------------------------------------------------


def _layout(skeleton: Any, tree: Any) -> dict[str, tuple[float, float, bool]]:
    """key → (start ns, duration ns, compressed) of each unit on the merged timeline."""
    own = dict(zip(tree["key"], tree["time_ns"], strict=True))
    sk = skeleton.set_index("key")
    kids: dict[str, list[str]] = defaultdict(list)
    host = skeleton[~skeleton["level"].isin(DEVICE_LEVELS)]
    for k, p in zip(host["key"], host["parent_key"], strict=True):
        if p:
            kids[p].append(k)
    place: dict[str, tuple[float, float, bool]] = {"step": (0.0, own["step"], False)}
    stack = ["step"]
    while stack:
        k = stack.pop()
        start, dur, _ = place[k]
        ch = sorted(kids.get(k, []), key=lambda c: sk.at[c, "ts"])
        if not ch:
            continue
        c_own = [own[c] for c in ch]
        ts0, end0 = sk.at[k, "ts"], sk.at[k, "ts"] + sk.at[k, "dur"]
        gaps, prev = [], ts0
        for c in ch:
            gaps.append(max(0.0, sk.at[c, "ts"] - prev))
            prev = max(prev, sk.at[c, "ts"] + sk.at[c, "dur"])
        gaps.append(max(0.0, end0 - prev))
        total = sum(c_own)
        compressed = total > dur
        if compressed:
            scale, spare = dur / total, 0.0
        else:
            scale, spare = 1.0, dur - total
        g_sum = sum(gaps)
        shares = [g / g_sum for g in gaps] if g_sum > 0 else [1 / len(gaps)] * len(gaps)
        at = start
        for c, co, share in zip(ch, c_own, shares, strict=False):
            at += spare * share
            place[c] = (at, co * scale, compressed)
            at += co * scale
            stack.append(c)
    return place


def _write_merged(skeleton: Any, tree: Any, runs: list[LevelRun], out: Path) -> None:
    """The merged step as a Kineto trace (one ``ProfilerStep#0``), imported into ``out``."""
    from xpuprof.core.raw import decode_json
    from xpuprof.trace.ingest import import_traces

    place = _layout(skeleton, tree)
    info = tree.set_index("key")
    sk = skeleton.set_index("key")
    events = []
    queue_end: dict[tuple[int, int], float] = {}
    for k, row in sk.iterrows():
        args = decode_json(row["args"], default={}) if isinstance(row["args"], str) else {}
        args = args if isinstance(args, dict) else {"args": args}
        it = info.loc[k]
        args["leveled"] = {"timed_by": it["timed_by"], "time_ns": round(float(it["time_ns"])),
                           "ci_ns": None if math.isinf(it["ci_ns"]) else round(float(it["ci_ns"])),
                           "steps": int(it["steps"])}  # fmt: skip
        if row["level"] in DEVICE_LEVELS:
            parent = row["parent_key"]
            p_start = place[parent][0]
            lag = max(0.0, row["ts"] - sk.at[parent, "ts"])
            q = (int(row["pid"]), int(row["tid"]))
            start = max(p_start + lag, queue_end.get(q, 0.0))
            dur = float(it["time_ns"])
            queue_end[q] = start + dur
        else:
            start, dur, compressed = place[k]
            if compressed:
                args["leveled"]["compressed"] = True
        name = "ProfilerStep#0" if k == "step" else row["name"]
        events.append({"ph": "X", "cat": row["category"] or "cpu_op", "name": name,
                       "pid": int(row["pid"]), "tid": int(row["tid"]),
                       "ts": round(start / 1e3, 3), "dur": round(dur / 1e3, 3),
                       "args": args})  # fmt: skip
    doc = {"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms",
           "xpuprof_leveled": {"levels": [r.level for r in runs],
                               "stores": [s.name for r in runs for s in r.stores]}}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xpuprof-merged-") as tmp:
        path = Path(tmp) / "merged.pt.trace.json"
        path.write_bytes(msgspec.json.encode(doc, enc_hook=plain_number))
        with contextlib.redirect_stdout(sys.stderr):
            import_traces([path], out)

"""A synthetic many-rank Kineto job built from the real 8-rank DLRM job (issue 14, bench_scale).

Why: no public multi-rank trace set has hundreds of ranks, and the cross-rank analyses (clock
alignment, stragglers) need a job whose truth is known. So each synthetic rank is a real rank's
recorded step, repeated, with a clock offset and one slow rank injected by construction.

The set of ``N`` ranks (one plain ``.json`` file per rank, ``rank<r>.pt.trace.json``):

* **Source.** Rank ``r`` copies real rank ``r % 8`` of the DLRM job (``kineto/gpu/
  dlrm_8rank_v100`` under the real traces: ``--traces``, else ``$XPUPROF_TEST_TRACES``, else
  ``../shared/traces``). ``distributedInfo`` says rank ``r`` of world size ``N``; a
  ``pg_config`` (absent in DLRM) and the kernels' ``Group size`` / ``Process Group Ranks`` args
  (absent too) are rewritten to the whole world, so every rank of the one group records the same
  sequence of collectives (DLRM's 8 real ranks each record the same 8 NCCL kernels per step).
* **Steps.** The recorded step (every event but the metadata ``M`` events, the ``Trace`` span
  and the two instant events) is repeated ``S`` times back to back: copy ``k`` is shifted by
  ``k * P`` where the period ``P`` (the same on every rank, so that collectives stay matched) is
  the longest recorded span over the 8 sources plus 500 µs, rounded up to a whole µs. Copy ``k``'s
  ``ProfilerStep#n`` becomes ``ProfilerStep#(n + k)``; the ids (flow ``id``, ``External id``,
  ``correlation``, ``Ev Idx``, ``Sequence number``) get ``+ k * stride`` (``stride``: the power of
  ten above the largest recorded id), so they stay unique and still link host and device. ``S``
  defaults to the smallest count that gives 512 ranks >= 20 M events.
* **Straggler.** One per set: rank ``R`` in step index ``K`` (1 <= K <= S-2) is paused for ``D``
  (uniform 2-5 ms, whole ns) at the end of its collective ``j - 1`` of that step (the start of
  the step for j = 0): every event of ``R`` from that moment on starts ``D`` later, and events
  spanning it (the step, the annotations) last ``D`` longer. ``j`` is the step's collective whose
  recorded arrival spread (latest − earliest kernel start over the 8 sources) is smallest
  among those after the first, so ``R`` arrives last by at least ``D`` − that spread. On every
  other rank the kernel of collective ``j`` of step ``K`` ends ``D`` later (it waits for ``R``:
  its end = ``R``'s arrival + its transfer, as recorded) and everything after that end moves by
  ``D``. From step ``K + 1`` on, every rank runs ``D`` later than the plain repetition.
* **Clocks.** Rank ``r``'s every timestamp is written as true time + ``offset_ns[r]`` (uniform in
  ±50 ms, whole ns, so µs-fractional): ``ts``/``dur`` are written as decimal µs with three
  decimals, which the importer reads exactly.

``truth.json`` next to the files holds the offsets, the straggler (rank, step index ``K``, its
``ProfilerStep`` number, ``D``, collective index ``j``), ``S``, ``P``, the first step's number,
and the recorded collective starts and ends of the sources (for judging alignment: the 8 real
ranks' own clocks agree only to ~1-2 µs). ``set.json`` holds the parameters, the per-file
bytes and event counts.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import msgspec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Where the 8-rank DLRM job lies under the real traces' folder.
SOURCE_REL = "kineto/gpu/dlrm_8rank_v100"
#: Events the 512-rank set must hold at least (issue 14's target size).
TARGET_EVENTS = 20_000_000
TARGET_RANKS = 512
#: Ids rewritten per step copy (top-level flow ``id`` and these args).
ID_ARGS = ("External id", "correlation", "Ev Idx", "Sequence number")
#: Idle time between a step copy's last event and the next copy's first, ns.
GAP_NS = 500_000
#: Clock offsets are drawn from [-OFFSET_NS, OFFSET_NS].
OFFSET_NS = 50_000_000
#: The straggler's pause is drawn from this range, ns.
DELAY_NS = (2_000_000, 5_000_000)
#: Bump when the output changes, so cached sets are rebuilt.
VERSION = 1

_ENC = msgspec.json.Encoder()


def traces_root(given: str | Path | None = None) -> Path:
    """The real traces' folder: ``given``, else ``$XPUPROF_TEST_TRACES``, else ../shared/traces
    (as tests/conftest.py finds it)."""
    if given:
        return Path(given).expanduser().resolve()
    env = os.environ.get("XPUPROF_TEST_TRACES")
    return Path(env).expanduser().resolve() if env else ROOT.parent / "shared" / "traces"


def _ns(v: Any) -> int:
    """Kineto µs (an int, or a float carrying ns decimals) as int ns."""
    return v * 1000 if isinstance(v, int) else round(v * 1000)


def is_collective_kernel(e: dict[str, Any]) -> bool:
    """An NCCL kernel (``ncclKernel_*``/``ncclDevKernel_*``) on a GPU stream."""
    return e.get("ph") == "X" and e.get("cat") == "kernel" and e.get("name", "").startswith("nccl")


@dataclass
class Source:
    """One real rank: its top-level members, what is written once, and the repeated step."""

    path: Path
    rank: int
    top: dict[str, Any]
    once: list[dict[str, Any]]  # M events, the Trace span, the instant events
    unit: list[dict[str, Any]]  # the step's events, ts/dur removed
    ts: list[int]  # ns, per unit event
    end: list[int | None]  # ns, per unit event with a dur
    step_number: int
    step_start: int  # ns
    colls: list[int] = field(default_factory=list)  # unit indices of the collective kernels


def load_sources(traces: str | Path | None = None) -> list[Source]:
    """The 8 DLRM ranks, by rank; an error naming the folder when they are not there."""
    d = traces_root(traces) / SOURCE_REL
    files = sorted(d.glob("*.json*")) if d.is_dir() else []
    if not files:
        raise FileNotFoundError(f"{d}: no DLRM rank files (give --traces or XPUPROF_TEST_TRACES)")
    out = []
    for p in files:
        opener = gzip.open if p.name.endswith(".gz") else open
        with opener(p, "rb") as f:
            doc = json.load(f)
        events = doc.pop("traceEvents")
        rank = int(doc["distributedInfo"]["rank"])
        once, unit, ts, end = [], [], [], []
        step_number, step_start = None, None
        for e in events:
            if e.get("ph") in ("M", "i") or e.get("cat") == "Trace":
                once.append(e)
                continue
            e = dict(e)
            t = _ns(e.pop("ts"))
            d_ = e.pop("dur", None)
            name = e.get("name", "")
            if name.startswith("ProfilerStep#"):
                step_number, step_start = int(name.split("#", 1)[1]), t
            unit.append(e)
            ts.append(t)
            end.append(None if d_ is None else t + _ns(d_))
        if step_number is None:
            raise ValueError(f"{p}: no ProfilerStep# event")
        src = Source(p, rank, doc, once, unit, ts, end, step_number, step_start)
        src.colls = [i for i, e in enumerate(unit) if is_collective_kernel(e)]
        out.append(src)
    out.sort(key=lambda s: s.rank)
    if [s.rank for s in out] != list(range(len(out))):
        raise ValueError(f"{d}: ranks {[s.rank for s in out]} are not 0..{len(out) - 1}")
    seqs = {tuple(s.unit[i]["name"] for i in s.colls) for s in out}
    if len(seqs) != 1:
        raise ValueError(f"{d}: the ranks record different collective sequences")
    return out


def period_ns(sources: list[Source]) -> int:
    """The step period P: the longest recorded span (first start to last end) + GAP_NS."""
    span = max(max(e or t for t, e in zip(s.ts, s.end, strict=True)) - min(s.ts) for s in sources)
    return math.ceil((span + GAP_NS) / 1000) * 1000


def id_stride(sources: list[Source]) -> int:
    """The power of ten above every id that is rewritten per copy."""
    top = 1
    for s in sources:
        for e in s.unit:
            if isinstance(e.get("id"), int):
                top = max(top, e["id"])
            for k in ID_ARGS:
                v = (e.get("args") or {}).get(k)
                if isinstance(v, int):
                    top = max(top, v)
    return 10 ** len(str(top))


def events_per_rank(sources: list[Source], steps: int) -> list[int]:
    return [len(s.once) + steps * len(s.unit) for s in sources]


def default_steps(sources: list[Source]) -> int:
    """The fewest steps with which TARGET_RANKS ranks hold >= TARGET_EVENTS events."""
    steps = 1
    while True:
        per = events_per_rank(sources, steps)
        total = sum(per[r % len(per)] for r in range(TARGET_RANKS))
        if total >= TARGET_EVENTS:
            return steps
        steps += 1


def plan(
    sources: list[Source],
    n_ranks: int,
    steps: int,
    seed: int,
    delay_ns: tuple[int, int] = DELAY_NS,
) -> dict[str, Any]:
    """The truth of one set: offsets, straggler, period (see the module docstring)."""
    if steps < 3:
        raise ValueError("steps must be >= 3 (the straggler's step has one before and after)")
    rng = random.Random(seed * 1_000_003 + n_ranks)
    n_coll = len(sources[0].colls)
    starts = [[s.ts[s.colls[c]] for s in sources] for c in range(n_coll)]
    ends = [[s.end[s.colls[c]] for s in sources] for c in range(n_coll)]
    spread = [max(x) - min(x) for x in starts]
    j = min(range(1, n_coll), key=lambda c: spread[c]) if n_coll > 1 else 0
    offsets = [rng.randint(-OFFSET_NS, OFFSET_NS) for _ in range(n_ranks)]
    straggler = {
        "rank": rng.randrange(n_ranks),
        "step_index": rng.randint(1, steps - 2),
        "delay_ns": rng.randint(*delay_ns),
        "collective_index": j,
        "collective": sources[0].unit[sources[0].colls[j]]["name"],
        "arrival_spread_ns": spread[j],
    }
    straggler["profiler_step"] = sources[0].step_number + straggler["step_index"]
    return {
        "version": VERSION,
        "world_size": n_ranks,
        "steps": steps,
        "first_step_number": sources[0].step_number,
        "period_ns": period_ns(sources),
        "id_stride": id_stride(sources),
        "seed": seed,
        "offset_ns": offsets,
        "straggler": straggler,
        "collectives_per_step": n_coll,
        "source_of_rank": "r % 8",
        "sources": [s.path.name for s in sources],
        "source_collective_ends_ns": ends,
        "source_collective_starts_ns": starts,
    }


def _copy_bytes(src: Source, k: int, stride: int, world: int) -> list[bytes]:
    """Step copy ``k`` of ``src``'s unit, each event encoded as what follows its ``ts``: its
    recorded ``dur`` then its other members (``,"dur":…,…}``)."""
    out = []
    add = k * stride
    for e, t, end in zip(src.unit, src.ts, src.end, strict=True):
        e = dict(e)
        if isinstance(e.get("id"), int):
            e["id"] += add
        a = e.get("args")
        if a:
            a = dict(a)
            for key in ID_ARGS:
                if isinstance(a.get(key), int):
                    a[key] += add
            if "Group size" in a:
                a["Group size"] = world
            if "Process Group Ranks" in a:
                a["Process Group Ranks"] = list(range(world))
            e["args"] = a
        if e.get("name", "").startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{src.step_number + k}"
        rest = _ENC.encode(e)
        dur = b"" if end is None else b',"dur":' + _dec(end - t)
        out.append(dur + b"," + rest[1:])
    return out


def _dec(ns: int) -> bytes:
    q, r = divmod(ns, 1000)
    return b"%d.%03d" % (q, r)


def _top(src: Source, rank: int, world: int) -> dict[str, Any]:
    top = {k: v for k, v in src.top.items()}
    dist = dict(top.get("distributedInfo") or {})
    dist.update(rank=rank, world_size=world)
    if isinstance(dist.get("pg_config"), list):
        dist["pg_config"] = [
            {**pg, "ranks": list(range(world)), "group_size": world} for pg in dist["pg_config"]
        ]
    top["distributedInfo"] = dist
    top["traceName"] = f"rank{rank}.pt.trace.json"
    return top


def write_rank(
    src: Source, copies: list[list[bytes]], rank: int, truth: dict[str, Any], out: Path
) -> tuple[int, int]:
    """Write rank ``rank``'s file; return (events, bytes)."""
    world, steps, P = truth["world_size"], truth["steps"], truth["period_ns"]
    off = truth["offset_ns"][rank]
    sg = truth["straggler"]
    K, D, j = sg["step_index"], sg["delay_ns"], sg["collective_index"]
    kj = src.colls[j]
    if rank == sg["rank"]:
        # paused at the end of its collective j-1 (the step's start for j = 0)
        cut = src.end[src.colls[j - 1]] if j > 0 else src.step_start
        stretch_at_cut = -1
    else:
        cut = src.end[kj]  # waits for the straggler: its kernel j ends D later
        stretch_at_cut = kj
    chunks: list[bytes] = []
    ts, end = src.ts, src.end
    whole = all(t % 1000 == 0 for t in ts)
    ts_us = [t // 1000 for t in ts]
    for k in range(steps):
        base = k * P + off + (D if k > K else 0)
        if k != K and whole:
            # the common case, one format per event: the fraction of every ts of this copy is
            # the fraction of base (the recorded ts are whole µs)
            bu, fr = divmod(base, 1000)
            chunks += [b'{"ts":%d.%03d%s' % (tu + bu, fr, tail)
                       for tu, tail in zip(ts_us, copies[k], strict=True)]  # fmt: skip
            continue
        for i, tail in enumerate(copies[k]):
            t, e = ts[i], end[i]
            t2, e2 = t, e
            if k == K:
                if t >= cut:
                    t2 = t + D
                    e2 = None if e is None else e + D
                elif e is not None and (e > cut or i == stretch_at_cut):
                    e2 = e + D
            if e2 == e and t2 == t:
                chunks.append(b'{"ts":' + _dec(t + base) + tail)
                continue
            # a changed dur: re-encode what follows it (tail = ',"dur":…' + the rest)
            rest = tail[tail.index(b",", 1) :] if e is not None else tail
            dur = b"" if e2 is None else b',"dur":' + _dec(e2 - t2)
            chunks.append(b'{"ts":' + _dec(t2 + base) + dur + rest)
    last = (steps - 1) * P + D  # how much later the last copy ends than the recorded step
    for e in src.once:
        e = dict(e)
        if "ts" not in e:
            chunks.append(_ENC.encode(e))
            continue
        t = _ns(e.pop("ts"))
        d_ = e.pop("dur", None)
        if e.get("name") == "Record Window End":
            t += last
        rest = _ENC.encode(e)
        if d_ is None:
            chunks.append(b'{"ts":' + _dec(t + off) + b"," + rest[1:])
        else:
            dur = _ns(d_) + (last if e.get("cat") == "Trace" else 0)
            chunks.append(b'{"ts":' + _dec(t + off) + b',"dur":' + _dec(dur) + b"," + rest[1:])
    head = _ENC.encode(_top(src, rank, world))
    body = head[:-1] + b',"traceEvents":[\n' + b",\n".join(chunks) + b"\n]}\n"
    path = out / f"rank{rank}.pt.trace.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(body)
    tmp.replace(path)
    return len(chunks), len(body)


# ------------------------------------------------------------------------------ the pool

_W: dict[str, Any] = {}


def _init(traces: str, truth: dict[str, Any], out: str) -> None:
    _W.update(sources=load_sources(traces), truth=truth, out=Path(out), cached=(None, None))


def _task(ranks: list[int]) -> list[tuple[int, int, int]]:
    sources, truth = _W["sources"], _W["truth"]
    s = ranks[0] % len(sources)
    key, copies = _W["cached"]
    if key != s:
        copies = [
            _copy_bytes(sources[s], k, truth["id_stride"], truth["world_size"])
            for k in range(truth["steps"])
        ]
        _W["cached"] = (s, copies)
    return [(r, *write_rank(sources[s], copies, r, truth, _W["out"])) for r in ranks]


def generate(
    out: str | Path,
    n_ranks: int,
    *,
    steps: int | None = None,
    seed: int = 0,
    traces: str | Path | None = None,
    processes: int | None = None,
    delay_ns: tuple[int, int] = DELAY_NS,
    log: Any = None,
) -> dict[str, Any]:
    """Write the set of ``n_ranks`` into ``out`` (made empty first); return its manifest.
    ``delay_ns``: the range the straggler's pause is drawn from."""
    t0 = time.perf_counter()
    traces = traces_root(traces)
    sources = load_sources(traces)
    steps = steps or default_steps(sources)
    truth = plan(sources, n_ranks, steps, seed, delay_ns)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for p in out.iterdir():
        if p.name.endswith((".json", ".tmp")):
            p.unlink()
    n_src = len(sources)
    chunk = max(1, min(16, n_ranks // (n_src * 2) or 1))
    tasks = []
    for s in range(n_src):
        mine = list(range(s, n_ranks, n_src))
        tasks += [mine[i : i + chunk] for i in range(0, len(mine), chunk)]
    processes = processes or min(os.cpu_count() or 1, len(tasks))
    results: list[tuple[int, int, int]] = []
    if processes <= 1:
        _init(str(traces), truth, str(out))
        for t in tasks:
            results += _task(t)
    else:
        with get_context("fork").Pool(processes, _init, (str(traces), truth, str(out))) as pool:
            for res in pool.imap(_task, tasks):
                results += res
                if log:
                    log(f"  {len(results)}/{n_ranks} ranks written")
    results.sort()
    (out / "truth.json").write_text(json.dumps(truth, indent=1))
    man = {
        "params": _params(n_ranks, steps, seed, delay_ns),
        "files": [
            {"path": str(out / f"rank{r}.pt.trace.json"), "rank": r, "events": n, "bytes": b}
            for r, n, b in results
        ],
        "total_events": sum(n for _, n, _ in results),
        "total_bytes": sum(b for _, _, b in results),
        "seconds": round(time.perf_counter() - t0, 2),
        "processes": processes,
    }
    (out / "set.json").write_text(json.dumps(man, indent=1))
    return man


def _params(n_ranks: int, steps: int, seed: int, delay_ns: tuple[int, int]) -> dict[str, Any]:
    return {"version": VERSION, "ranks": n_ranks, "steps": steps, "seed": seed,
            "delay_ns": list(delay_ns)}  # fmt: skip


def ensure(
    data: Path,
    n_ranks: int,
    *,
    steps: int | None = None,
    seed: int = 0,
    traces: str | Path | None = None,
    delay_ns: tuple[int, int] = DELAY_NS,
    log: Any = None,
) -> tuple[Path, dict[str, Any], bool]:
    """The set for these parameters under ``data`` (``ranks-<N>r-<S>s-seed<k>``), generated unless a
    complete one is cached; returns (folder, manifest, whether it was generated now)."""
    if steps is None:
        steps = default_steps(load_sources(traces))
    out = data / f"ranks-{n_ranks}r-{steps}s-seed{seed}"
    if tuple(delay_ns) != DELAY_NS:
        out = out.with_name(f"{out.name}-delay{delay_ns[0]}-{delay_ns[1]}")
    mp = out / "set.json"
    if mp.exists():
        man = json.loads(mp.read_text())
        if man.get("params") == _params(n_ranks, steps, seed, delay_ns) and all(
            Path(f["path"]).is_file() and Path(f["path"]).stat().st_size == f["bytes"]
            for f in man["files"]
        ):
            return out, man, False
    man = generate(out, n_ranks, steps=steps, seed=seed, traces=traces, delay_ns=delay_ns, log=log)
    return out, man, True


def delay_range(text: str) -> tuple[int, int]:
    """``"LO,HI"`` in ms as a range of ns."""
    lo, hi = (round(float(x) * 1e6) for x in text.split(","))
    if not 0 < lo <= hi:
        raise ValueError(f"delay range {text!r}: expected 0 < LO <= HI (ms)")
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--traces", default=None, help="the real traces' folder (shared/traces)")
    ap.add_argument("--processes", type=int, default=None)
    ap.add_argument("--delay-ms", default="2,5", help="the straggler's pause range, ms (LO,HI)")
    a = ap.parse_args(argv)
    man = generate(a.out, a.ranks, steps=a.steps, seed=a.seed, traces=a.traces,
                   processes=a.processes, delay_ns=delay_range(a.delay_ms))  # fmt: skip
    print(f"{a.ranks} ranks, {man['total_events']:,} events, {man['total_bytes'] / 1e9:.2f} GB "
          f"in {man['seconds']} s", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

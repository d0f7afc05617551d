"""Leveled measurement (XSP): each level of the stack timed in its own run, merged into one
across-stack picture whose numbers carry no overhead of the levels below them.

Why: deep profiling distorts what it measures (torch.profiler with shapes and memory made a
small CPU training step 41 % slower on this machine), and it distorts the top of the stack
most: a step time read from a kernel-level trace includes every op's and every kernel's
recording cost. So each level runs separately, deepest level last:

=========  ===========================================================================
``model``  the steps only (``xpuprof.profile(level="step")``: one flag check per step)
``layer``  + one span per module call (forward hooks; needs the model)
``op``     + framework ops (torch.profiler or jax.profiler), host activity only
``kernel`` + device activity (CUDA kernels, copies through CUPTI); needs a GPU — on the CPU
           the deepest level is ``op``
=========  ===========================================================================

Each level first runs ``settle`` steps it does not count (the profiler's first step pays its
start-up), then one step at a time until the 95 % confidence interval of the median step time
(distribution-free, :func:`~xpuprof.live.levelmerge.median_interval`: a stray slow step on a
shared machine moves a mean, not a median) reaches no further than ±``target`` from the median,
or ``max_steps``/``max_seconds`` is reached (the level is then marked unstable). A step's time
is ``time.perf_counter`` around the step (after ``torch.cuda.synchronize`` on a GPU), the same
clock at every level, so each level's overhead is its median over the model level's. In
script mode (``xpuprof leveled -- python train.py``) a step's time is its step span in the
run's store, and a level is rerun (up to ``max_runs``) until its interval is narrow enough.

The runs are merged by :mod:`xpuprof.live.levelmerge`.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from xpuprof.core.errors import XpuprofError
from xpuprof.live.levelmerge import (
    LEVELS,
    Leveled,
    LevelRun,
    first_rank,
    interval,
    median_interval,
    merge,
    ranks_note,
    relative_width,
)
from xpuprof.live.profile import LEVEL_ENV, LEVELED, OUT_ENV

__all__ = [
    "LEVELS",
    "Leveled",
    "LevelRun",
    "interval",
    "leveled",
    "leveled_script",
    "merge",
    "median_interval",
    "relative_width",
]


# -- running the levels -------------------------------------------------------------------------


def _has_gpu() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


def _sync_fn(sync: bool | None) -> Callable[[], None]:
    torch = sys.modules.get("torch")
    if sync is None:
        sync = _has_gpu()
    if sync and torch is not None:
        return torch.cuda.synchronize
    return lambda: None


def _peak_memory() -> dict[str, int]:
    """The process's peak resident memory, and on a GPU the peak allocated by torch."""
    out = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if _has_gpu():
        out["peak_gpu_bytes"] = int(sys.modules["torch"].cuda.max_memory_allocated())
    return out


def leveled(
    step_fn: Callable[[], Any],
    levels: Sequence[str] = LEVELS,
    *,
    model: Any = None,
    out: str | Path | None = None,
    warmup: int = 3,
    settle: int = 1,
    min_steps: int = 5,
    max_steps: int = 50,
    target: float = 0.02,
    max_seconds: float | None = None,
    sync: bool | None = None,
    samples: int | None = None,
    progress: Callable[[str, int, float, float], None] | None = None,
) -> Leveled:
    """Measure ``step_fn`` (one training or inference step) level by level and merge the runs
    (module docstring). ``model``: the torch module (the layer level hooks it; without it the
    layer level is skipped). ``out``: the folder for the stores (``model.store`` …,
    ``merged.store``, ``leveled.json``); default a new temporary folder. ``warmup``: steps run
    once before any level; ``settle``: steps each level runs and does not count. A level stops
    at ``min_steps``.. ``max_steps`` measured steps when the 95 % interval is within
    ±``target`` of the mean (or after ``max_seconds``). ``sync``: synchronise the GPU after
    each step (default: when one is in use). ``samples``: samples per step (for throughput).
    ``progress(level, steps, mean_ns, ci_fraction)`` is called after every measured step."""
    levels = _check_levels(levels)
    if min_steps < 2 or max_steps < min_steps:
        raise XpuprofError(f"need 2 ≤ min_steps ≤ max_steps, got {min_steps}, {max_steps}")
    if not (target > 0):
        raise XpuprofError(f"target must be > 0 (a fraction of the mean), got {target}")
    do_sync = _sync_fn(sync)
    notes: list[str] = []
    runs: list[LevelRun] = []
    with _staging(out) as (root, final):
        for _ in range(warmup):
            step_fn()
        do_sync()
        memory: dict[str, int] = {}
        for level in levels:
            skip = _skip_reason(level, model, gpu=_has_gpu())
            if skip:
                notes.append(skip)
                continue
            run = _run_level(step_fn, level, root, model, settle, min_steps, max_steps, target,
                             max_seconds, do_sync, progress)  # fmt: skip
            runs.append(run)
            if level == "model":
                memory = _peak_memory()
        result = merge(runs, root, notes=notes, samples=samples, extra_facts=memory)
    return _publish(result, final)


def _check_levels(levels: Sequence[str]) -> list[str]:
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad or not levels:
        raise XpuprofError(f"unknown level(s) {bad or levels!r}; levels: {', '.join(LEVELS)}")
    return [lv for lv in LEVELS if lv in levels]  # shallowest first, each once


@contextlib.contextmanager
def _staging(out: str | Path | None) -> Iterator[tuple[Path, Path]]:
    """A folder to write the runs into, and the folder they end in: nothing half-written is
    ever left under ``out`` (a failure removes the staging folder; :func:`_publish` moves a
    finished one into place). ``out`` must be absent, empty or an earlier leveled folder
    (holding ``leveled.json``), which is then replaced."""
    if out is None:
        final = Path(tempfile.mkdtemp(prefix="xpuprof-leveled-"))
    else:
        final = Path(out)
        if final.exists() and not final.is_dir():
            raise XpuprofError(f"{final}: exists and is not a folder")
        if final.exists() and any(final.iterdir()) and not (final / "leveled.json").exists():
            raise XpuprofError(f"{final}: exists, is not empty and holds no leveled.json; not "
                               "writing into it (choose another folder)")  # fmt: skip
        final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
    try:
        yield tmp, final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if out is None:
            shutil.rmtree(final, ignore_errors=True)
        raise


def _publish(result: Leveled, final: Path) -> Leveled:
    """Move the finished staging folder to ``final`` and write ``leveled.json`` there."""
    tmp = result.out
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)

    def moved(p: Path) -> Path:
        return final / p.relative_to(tmp)

    for run in result.runs:
        run.stores = [moved(s) for s in run.stores]
    result.out = final
    result.merged = moved(result.merged) if result.merged is not None else None
    result.facts.update(out=str(final), merged_store=str(result.merged))
    result.save()
    return result


def _skip_reason(level: str, model: Any, gpu: bool) -> str:
    if level == "layer" and model is None:
        return "layer level skipped: it needs the model (leveled(step, model=net))"
    if level == "kernel" and not gpu:
        return "kernel level skipped: no GPU in use; on the CPU the deepest level is op"
    return ""


def _run_level(step_fn: Callable[[], Any], level: str, root: Path, model: Any, settle: int,
               min_steps: int, max_steps: int, target: float, max_seconds: float | None,
               do_sync: Callable[[], None],
               progress: Callable[[str, int, float, float], None] | None) -> LevelRun:  # fmt: skip
    from xpuprof.live.profile import Profile, step

    capture, kernels = LEVELED[level]
    store = root / f"{level}.store"
    run = LevelRun(level, [store])
    clock = time.perf_counter_ns
    with Profile(store, level=capture, model=model, kernels=kernels, telemetry=False):
        for i in range(settle):
            step(i)
            step_fn()
            do_sync()
        start = time.monotonic()
        i = settle
        while True:
            step(i)
            t0 = clock()
            step_fn()
            do_sync()
            run.samples.append((0, i, clock() - t0))
            i += 1
            n = len(run.samples)
            width = relative_width(run.times_ns)
            if progress is not None:
                progress(level, n, median_interval(run.times_ns)[0], width)
            if n >= min_steps and width <= target:
                run.stable = True
                break
            if n >= max_steps or (max_seconds is not None
                                  and time.monotonic() - start > max_seconds):  # fmt: skip
                break
    if not run.stable:
        run.note = (f"{level}: interval ±{relative_width(run.times_ns):.1%} after "
                    f"{len(run.samples)} steps, not within ±{target:.0%}")  # fmt: skip
    return run


# -- script mode ----------------------------------------------------------------------------------


def leveled_script(
    argv: Sequence[str],
    levels: Sequence[str] = LEVELS,
    *,
    out: str | Path | None = None,
    settle: int = 1,
    target: float = 0.02,
    max_runs: int = 3,
    timeout: float | None = None,
    samples: int | None = None,
    progress: Callable[[str, int, float, float], None] | None = None,
) -> Leveled:
    """``xpuprof leveled -- python script.py ARGS``: run the script once per level with
    ``XPUPROF_LEVEL``/``XPUPROF_OUT`` set (its ``xpuprof.profile`` records that level into that
    store; its ``xpuprof.step`` calls mark the steps), rerun a level up to ``max_runs`` times
    while its steps' 95 % interval is wider than ±``target``, then merge as :func:`leveled`.
    Step times are the step spans of each run's store, its first ``settle`` steps not
    counted. A script that fails stops the measurement with its exit status and the end of its
    output."""
    if not argv:
        raise XpuprofError("no command to run: xpuprof leveled -- python script.py ARGS")
    levels = _check_levels(levels)
    runs: list[LevelRun] = []
    notes: list[str] = []
    with _staging(out) as (root, final):
        for level in levels:
            if level == "kernel" and not _gpu_present():
                notes.append(_skip_reason("kernel", None, gpu=False))
                continue
            run, why = _script_level(argv, level, root, settle, target, max_runs, timeout,
                                     progress)  # fmt: skip
            if why:
                if level == "model":
                    raise XpuprofError(why)
                notes.append(why)
                continue
            runs.append(run)
        many = ranks_note(runs[0].stores[0]) if runs and runs[0].stores else None
        if many:
            notes.append(many)
        result = merge(runs, root, notes=notes, samples=samples)
    return _publish(result, final)


def _gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU the script could use (its driver's device)."""
    return Path("/dev/nvidiactl").exists() or _has_gpu()


def _script_level(argv: Sequence[str], level: str, root: Path, settle: int, target: float,
                  max_runs: int, timeout: float | None,
                  progress: Callable[[str, int, float, float], None] | None,
                  ) -> tuple[LevelRun, str]:  # fmt: skip
    """One level of :func:`leveled_script`: its runs, or why the level has none."""
    run = LevelRun(level)
    for k in range(max_runs):
        store = root / (f"{level}.store" if k == 0 else f"{level}.run{k + 1}.store")
        _run_script(argv, level, store, timeout)
        why = _script_level_problem(store, level)
        if why:
            return run, why
        steps = _step_times(store, settle)
        if not steps:
            raise XpuprofError(
                f"{level}: the script's store has no step after its first {settle}: mark "
                "steps with xpuprof.step(i) in its loop"
            )
        run.stores.append(store)
        run.samples.extend((len(run.stores) - 1, n, t) for n, t in steps)
        width = relative_width(run.times_ns)
        if progress is not None:
            progress(level, len(run.samples), median_interval(run.times_ns)[0], width)
        if width <= target:
            run.stable = True
            return run, ""
    run.note = (f"{level}: interval ±{relative_width(run.times_ns):.1%} after "
                f"{len(run.stores)} run(s), {len(run.samples)} steps, not within "
                f"±{target:.0%}")  # fmt: skip
    return run, ""


def _run_script(argv: Sequence[str], level: str, store: Path, timeout: float | None) -> None:
    env = {**os.environ, LEVEL_ENV: level, OUT_ENV: str(store)}
    try:
        p = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise XpuprofError(f"{argv[0]}: no such program") from None
    except subprocess.TimeoutExpired:
        raise XpuprofError(f"{' '.join(argv)}: still running after {timeout:g} s at level "
                           f"{level}; stopped") from None  # fmt: skip
    if p.returncode != 0:
        tail = (p.stderr or p.stdout or "").strip().splitlines()[-3:]
        raise XpuprofError(f"{' '.join(argv)} failed at level {level} (exit {p.returncode})"
                           + (": " + " | ".join(tail) if tail else ""))  # fmt: skip


def _script_level_problem(store: Path, level: str) -> str:
    from xpuprof.trace.store import is_store

    if not is_store(store):
        return (
            f"{level}: the script wrote no store; it must run its steps inside "
            "xpuprof.profile(...), which records what XPUPROF_LEVEL asks into XPUPROF_OUT"
        )
    with first_rank(store) as t:
        got = ((t.meta["sources"][0]["meta"] or {}).get("xpuprof_capture") or {}).get("leveled")
    if got == "layer-without-model":
        return ("layer level skipped: the script's xpuprof.profile(...) has no model= to hook "
                "(pass model=net)")  # fmt: skip
    if got != level:
        return f"{level}: the script's store was not recorded at that level ({got!r})"
    if level == "kernel":
        with first_rank(store) as t:
            dev = t.sql("select count(*) n from events where device >= 0")["n"].iat[0]
        if not dev:
            return "kernel level: its run recorded no device activity (no GPU in use)"
    return ""


def _step_times(store: Path, settle: int) -> list[tuple[int, int]]:
    """(step number, duration ns) of the store's step spans, the first ``settle`` left out."""

    with first_rank(store) as t:
        s = t.sql("select step, dur from events where level = 'step' and dur is not null "
                  "and step is not null order by ts")  # fmt: skip
    rows = [(int(n), int(d)) for n, d in zip(s["step"], s["dur"], strict=True)]
    return rows[settle:]

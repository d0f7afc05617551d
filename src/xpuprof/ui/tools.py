"""The one list of tools: what each is called, what it runs, which options it takes and how its
tables are shown. The CLI builds its analysis commands from :data:`TOOLS`, and the web UI and
reports call :func:`run` the same way, so none of them composes tools or reshapes tables.

A tool is ``function(*traces, ranks=None, steps=None, **options) -> Result``. Composite tools
(``overview`` = the overview plus the advisor's recommendations; ``summary`` = what the demo
prints) are written here, once; ``info`` (what a store holds) in :mod:`xpuprof.ui.stores`.
Each tool states its own one-sentence answer (``Result.facts["headline"]``); :func:`run` puts
it first.
Functions are named as ``"module:function"`` and imported on first use, so that listing tools
stays instant.

Length: the list itself is the module's reason to be (every tool, its options and how its
tables show, in one place), with the few composite tools it names and the viewer's thin
names; split, a front end would have to look for a tool in several modules.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuprof.core.errors import XpuprofError
from xpuprof.core.result import Presentation, Result
from xpuprof.core.text import human_time
from xpuprof.ui.stores import (  # noqa: F401  (tools and front ends name them from here)
    INFO_PRESENT,
    check_first,
    check_store,
    import_result,
    info,
    info_document,
    store_info,
)

if TYPE_CHECKING:
    from xpuprof.analysis.common import StepSelection
    from xpuprof.trace.trace import Trace


@dataclass(frozen=True)
class Option:
    """One keyword option of a tool: its keyword, one line of help, the default the CLI shows
    (None: the tool's own default applies), its type, its CLI flag (``--name``) and short
    flag (``-o``), and whether it is ``local``: it writes files on the machine that runs the
    tool, so the CLI offers it and the web UI, which serves others read-only, never does."""

    name: str
    help: str
    default: Any = None
    type: type = str
    flag: str | None = None
    short: str | None = None
    local: bool = False

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


#: Options most tools share (see :data:`xpuprof.analysis.common.StepSelection`).
COMMON = {
    "ranks": Option("ranks", "Ranks: 0, 0,2 or 0-3 (default: all).", flag="--rank"),
    "steps": Option(
        "steps",
        "Steps: all (the default), drop-last (each rank's last step left out, as HTA "
        "does by default), or numbers: 5, 5,6 or 5-9.",
    ),
}


@dataclass(frozen=True)
class Tool:
    """One entry of the list. ``inputs``: how many traces it takes (0, 1, or 2 for a
    baseline and a new trace). ``present``: how to show its tables, by table name (a table
    the tool gives a presentation itself keeps it). ``document``: a function giving the
    tool's ``--json`` document when that is not ``Result.to_dict()`` (``info``'s predates
    Result)."""

    name: str
    target: str
    help: str
    common: tuple[str, ...] = ("ranks", "steps")
    options: tuple[Option, ...] = ()
    present: Mapping[str, Presentation] = field(default_factory=dict)
    inputs: int = 1
    document: str | None = None

    def function(self) -> Callable[..., Any]:
        return _resolve(self.target)

    def keywords(self) -> tuple[str, ...]:
        return (*self.common, *(o.name for o in self.options))

    def served(self) -> tuple[Option, ...]:
        """The options a server may take from its clients: all but the ``local`` ones."""
        return tuple(o for o in self.options if not o.local)


def _resolve(target: str) -> Callable[..., Any]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


# ---------------------------------------------------------------------------------- options


#: The most numbers a list of ranks or steps may hold (``0-999999999999`` would not fit in memory).
MAX_NUMBERS = 100_000


def parse_numbers(text: str) -> list[int]:
    """``3``, ``3,5,9`` or ``3-7`` (inclusive) → a list of ints; nothing, or a range that
    runs backwards (``7-3``), is an error rather than a selection of nothing."""
    out: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, dash, hi = part.partition("-")
            if dash and (not hi or int(hi) < int(lo)):
                raise ValueError(part)
            numbers = range(int(lo), int(hi) + 1) if dash else [int(lo)]
            if len(out) + len(numbers) > MAX_NUMBERS:
                raise XpuprofError(f"{text!r}: more than {MAX_NUMBERS:,} numbers")
            out.extend(numbers)
    except ValueError:
        out = []
    if not out:
        raise XpuprofError(f"not a list of numbers: {text!r} (use e.g. 3, 3,5 or 3-7)")
    return out


def parse_ranks(text: str | None) -> list[int] | None:
    """``--rank``: numbers as :func:`parse_numbers`; None or ``all`` → every rank."""
    if text is None or text.strip() == "all":
        return None
    return parse_numbers(text)


def parse_steps(text: str | None) -> StepSelection:
    """``--steps``: ``all`` (or nothing), ``drop-last`` (``drop_last``), or numbers."""
    if text is None:
        return None
    t = text.strip()
    if t in ("all", "drop-last", "drop_last"):
        return "drop-last" if t == "drop_last" else t
    return parse_numbers(t)


# ---------------------------------------------------------------------------------- running


def get(name: str) -> Tool:
    """The tool called ``name`` (its CLI command)."""
    for tool in TOOLS:
        if tool.name == name:
            return tool
    raise XpuprofError(f"no tool {name!r}; tools: {', '.join(t.name for t in TOOLS)}")


def _call(tool: Tool, traces: tuple[Trace, ...], options: dict[str, Any]) -> dict[str, Any]:
    """Check the traces and options against the tool's entry; the keywords to pass (options
    given as None are left to the tool's default; ranks and steps may be given as text)."""
    if len(traces) != tool.inputs:
        raise XpuprofError(f"{tool.name} takes {tool.inputs} trace(s), not {len(traces)}")
    unknown = set(options) - set(tool.keywords())
    if unknown:
        raise XpuprofError(
            f"{tool.name} has no option(s) {', '.join(sorted(unknown))}; it takes "
            f"{', '.join(tool.keywords()) or 'none'}"
        )
    kw = {k: v for k, v in options.items() if v is not None}
    if isinstance(kw.get("ranks"), str):
        kw["ranks"] = parse_ranks(kw["ranks"])
    if isinstance(kw.get("steps"), str):
        kw["steps"] = parse_steps(kw["steps"])
    return {k: v for k, v in kw.items() if v is not None}


def run(name: str, *traces: Trace, **options: Any) -> Result:
    """Run the tool ``name`` on ``traces`` with ``options`` (its keywords; see :data:`TOOLS`)
    and return its Result, each table with its presentation, its headline first. A rank or
    step selection that selects nothing the store holds is an error naming what the store
    holds (:class:`SelectionError`); one that asks for some of what it holds runs, and the
    notes name what is not there. A table with timestamps adds the fact ``trace_start_ns``
    (the first event's time, from which the terminal shows them)."""
    tool = get(name)
    kw = _call(tool, traces, options)
    found, anything = check_selection(traces, kw) if tool.common and traces else ([], True)
    from xpuprof.analysis.per_rank import shared_cluster

    with shared_cluster():  # the tool's analyses share one local cluster, if they start any
        res = tool.function()(*traces, **kw)
    # an empty store: the tool's own notes would only guess at why it found nothing
    res.notes[:] = found + [n for n in res.notes if n not in found] if anything else found
    if tool.common and len(traces) == 1 and anything:  # what a "step" is, when not ProfilerStep
        from xpuprof.analysis.common import steps_from_notes

        res.notes += [n for n in steps_from_notes(traces[0], ranks=kw.get("ranks"))
                      if n not in res.notes]  # fmt: skip
    for table, hint in tool.present.items():
        if table in res.tables:
            res.present.setdefault(table, hint)
    if len(traces) == 1 and _has_timestamps(res):
        res.facts.setdefault("trace_start_ns", trace_start(traces[0]))
    if "headline" in res.facts:  # the answer first, in --json too
        res.facts = {"headline": res.facts["headline"], **res.facts}
    return res


class SelectionError(XpuprofError):
    """A rank or step selection that selects nothing the store holds."""


def check_selection(traces: Iterable[Trace], kw: Mapping[str, Any]) -> tuple[list[str], bool]:
    """What a rank or step selection asks for that the traces do not hold, as notes (the
    baseline's and the new trace's, labelled so, for two), and whether any trace has events
    to analyse; :class:`SelectionError` with those notes when a selection the user made
    (ranks, step numbers) selects no event of some trace at all."""
    from xpuprof.analysis.common import selection_notes, step_mode

    traces = tuple(traces)
    ranks, steps = kw.get("ranks"), kw.get("steps")
    chosen = ranks is not None or step_mode(steps)[0] == "list"
    found: list[str] = []
    anything = False
    labels = ("baseline: ", "new: ") if len(traces) == 2 else ("",)
    for label, trace in zip(labels, traces, strict=True):
        notes, some = selection_notes(trace, ranks=ranks, steps=steps)
        if chosen and not some:
            raise SelectionError(label + "; ".join(notes))
        found += [label + n for n in notes]
        anything |= some
    return found, anything


def trace_start(trace: Trace) -> int | None:
    """The time of the trace's first event (ns; None for a store without events):
    :func:`xpuprof.analysis.common.trace_start`, imported on first use."""
    from xpuprof.analysis.common import trace_start as start

    return start(trace)


def _has_timestamps(res: Result) -> bool:
    from xpuprof.ui.render import is_timestamp

    for name, table in res.tables.items():
        units = dict(res.present[name].units) if name in res.present else {}
        cols = table.columns if hasattr(table, "columns") else {k for r in table for k in r}
        if any(is_timestamp(str(c), units.get(str(c))) for c in cols):
            return True
    return False


def problems(answer: Result | dict[str, Any]) -> int:
    """Problems a tool's answer (its Result or ``--json`` document) reports, as the fact
    ``problems`` (``info --check``): the CLI exits with code 2 when there are any."""
    if isinstance(answer, Result):
        return int(answer.facts.get("problems") or 0)
    facts = answer.get("facts") or {}
    return int(facts.get("problems") or len((answer.get("check") or {}).get("problems", ())))


def document(name: str, *traces: Trace, **options: Any) -> dict[str, Any]:
    """The tool's ``--json`` document: ``run(...).to_dict()``, or its own document."""
    tool = get(name)
    if tool.document is None:
        return run(name, *traces, **options).to_dict()
    from xpuprof.analysis.per_rank import shared_cluster

    with shared_cluster():
        return _resolve(tool.document)(*traces, **_call(tool, traces, options))


# ------------------------------------------------------------------------- composite tools


def overview(
    trace: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None,
    top: int = 10, predict: bool = False, workers: int | None = None,
    scheduler: str | None = None,
) -> Result:  # fmt: skip
    """The overview (step time, where it goes, bottleneck, top ops and kernels) with the
    advisor's recommendations under the numbers; with ``predict``, each recommendation's
    change replayed and the recommendations ranked by predicted gain (``advise(predict=
    True)``). ``workers``/``scheduler``: the Dask cluster of the per-rank work of both
    (:func:`xpuprof.analysis.per_rank.cluster_options`). Facts: the overview's and the
    advisor's."""
    from xpuprof.advise.rules import advise
    from xpuprof.analysis.overview import overview as overview_tool
    from xpuprof.analysis.per_rank import cluster_options

    with cluster_options(workers, scheduler):
        ov = overview_tool(trace, ranks=ranks, steps=steps, top=top)
        adv = advise(trace, ranks=ranks, steps=steps, overview_result=ov, predict=predict)
    order = ("summary", "steps", "top_ops", "top_kernels")
    present = ov.present | adv.present
    if predict:
        present["recommendations"] = _PREDICTED
    return Result(
        tables={k: ov.tables[k] for k in order if k in ov.tables} | adv.tables,
        notes=ov.notes + adv.notes,
        facts=ov.facts | adv.facts,
        present=present,
    )


def summary(
    trace: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None,
    predict: bool = False,
) -> Result:  # fmt: skip
    """What the demo prints after training: the store's info, the overview (one column per
    rank), the top ops by self time, the slowest layers (when the trace has layers) and the
    recommendations (``predict``: ranked by predicted gain, as :func:`overview`). Facts: the
    overview's and the advisor's."""
    from xpuprof.analysis.stats import stats

    ov = overview(trace, ranks=ranks, steps=steps, top=8, predict=predict)
    inf = info(trace)
    tables = dict(inf.tables)
    for name, table in (("overview", "summary"), ("top_ops", "top_ops")):
        if table in ov.tables:  # absent when nothing is selected (the notes say why)
            tables[name] = ov.tables[table]
    notes = list(ov.notes)
    if trace.manifest["levels"].get("layer"):
        st = stats(trace, ranks=ranks, steps=steps, ops=False, kernels=False, layers=True)
        layers = st.tables.get("layers")
        if layers is not None and len(layers) and "forward_ns" in layers:
            layers = layers.sort_values("forward_ns", ascending=False)
            cols = ["layer", "module_type", "calls", "forward_ns", "backward_ns"]
            tables["slowest_layers"] = layers[[c for c in cols if c in layers]]
        notes += [n for n in st.notes if n not in notes]
    present = dict(inf.present)
    if "recommendations" in ov.tables:
        tables["recommendations"] = ov.tables["recommendations"]
        if predict:
            present["recommendations"] = _PREDICTED
    return Result(tables=tables, notes=notes, facts=ov.facts, present=present)


def stats(
    trace: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None,
    ops: bool = False, kernels: bool = False, layers: bool = False, shapes: bool = False,
    by_op: bool = False,
) -> Result:  # fmt: skip
    """Op, kernel and layer statistics: the ones chosen, all three when none is."""
    from xpuprof.analysis.stats import stats as stats_tool

    every = not (ops or kernels or layers)
    return stats_tool(trace, ranks=ranks, steps=steps, ops=ops or every,
                      kernels=kernels or every, layers=layers or every, shapes=shapes,
                      by_op=by_op)  # fmt: skip


def hardware() -> Result:
    """The device table the roofline uses (one row per device)."""
    from xpuprof.hardware.specs import table

    return Result(tables={"devices": table()})


#: Input formats named when the reader registry cannot be read (it always can, in a whole
#: install; this keeps ``--help`` useful in a broken one).
FALLBACK_FORMATS = (
    ("kineto", "PyTorch profiler (Kineto) and other Chrome-trace JSON: .json, .json.gz",
     (".json", ".json.gz")),
    ("xplane", "XProf XPlane: .xplane.pb, or an XProf log directory", (".xplane.pb",)),
)  # fmt: skip


def input_formats() -> list[tuple[str, str, tuple[str, ...]]]:
    """(name, description, suffixes) of every reader ``xpuprof import`` knows."""
    try:
        from xpuprof.formats import readers

        return [(r.name, r.description, tuple(r.suffixes)) for r in readers()]
    except (ImportError, AttributeError):
        return list(FALLBACK_FORMATS)


def formats() -> Result:
    """The input formats ``xpuprof import`` reads (the reader registry, plug-ins included)."""
    rows = [{"format": n, "suffixes": ", ".join(s), "description": d}
            for n, d, s in input_formats()]  # fmt: skip
    return Result(tables={"formats": rows})


def replay(
    trace: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None,
    top: int = 20, export: str | None = None, output: str | Path | None = None,
    align: str = "auto",
) -> Result:  # fmt: skip
    """Replay the trace (:func:`xpuprof.sim.replay`: identity replay, measured costs) and
    compare it with what was measured; with ``export="chrome"`` also write the measured and
    the simulated timeline into one Chrome trace (``output``; default beside the store,
    :func:`xpuprof.export.replay.default_path`). Facts: the replay's, and ``export`` (what
    was written: :func:`xpuprof.export.replay.export_replay_chrome`'s summary)."""
    from xpuprof.sim import replay as run_replay

    if export is not None and export.strip().lower() != "chrome":
        raise XpuprofError(f"--export {export!r}: not an export format; formats: chrome")
    if export is None and output is not None:
        raise XpuprofError("--output names the file --export writes: add --export chrome")
    rp = run_replay(trace, ranks=ranks, steps=steps, top=top, align=align)
    res = rp.result()
    if export is not None:
        from xpuprof.export.replay import default_path, export_replay_chrome

        path = Path(output) if output is not None else default_path(trace)
        written = export_replay_chrome(rp, path)
        res.facts["export"] = written
        res.notes.append(
            f"wrote the measured and the simulated timeline to {written['path']} "
            f"({written['measured']:,} measured entries, {written['simulated']:,} simulated "
            "events on threads named 'simulated · …'): open it in Perfetto (ui.perfetto.dev)"
        )
    return res


def whatif(
    trace: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None,
    change: Iterable[str] | str | None = None, align: str = "auto",
) -> Result:  # fmt: skip
    """Replay the trace as measured and with the changes applied together
    (:func:`xpuprof.sim.whatif.whatif`, ``docs/whatif.md``): baseline vs predicted step time
    per rank and step, and the critical path's shift between categories of work. ``change``:
    one change or several (``;`` also separates them)."""
    from xpuprof.sim.whatif import whatif as run_whatif

    texts = [change] if isinstance(change, str) else list(change or [])
    texts = [t.strip() for x in texts for t in str(x).split(";") if t.strip()]
    return run_whatif(trace, texts, ranks=ranks, steps=steps, align=align).result()


def ranks(
    trace: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None,
    path: bool | None = None, workers: int | None = None, scheduler: str | None = None,
) -> Result:  # fmt: skip
    """Cross-rank views (:func:`xpuprof.analysis.ranks.rank_steps`: step time per rank and
    step, the rank holding each step back and why, wait vs transfer per rank) and, unless
    ``path`` is False, the job's critical path across ranks through the identity replay
    (:func:`xpuprof.sim.paths.path_tables`): the whole replay in one process below 32 ranks,
    from 32 up (or on Dask: ``workers``/``scheduler``) one replay task per rank
    (:func:`xpuprof.sim.job_parts.job_path_parts`, the same answer)."""
    from xpuprof.analysis.ranks import rank_steps

    res = rank_steps(trace, ranks=ranks, steps=steps, workers=workers, scheduler=scheduler)
    if path is not False and "steps" in res.tables:
        _job_path(trace, ranks, steps, res, forced=bool(path), workers=workers,
                  scheduler=scheduler)  # fmt: skip
    if "steps" in res.tables and _one_part_per_rank(res.tables["steps"]):
        res.tables = {k: v.drop(columns="part", errors="ignore") for k, v in res.tables.items()}
    return res


def _one_part_per_rank(steps: Any) -> bool:
    """True when every rank is one part (the part column then says nothing more)."""
    return bool(
        steps["rank"].notna().all() and (steps.groupby("rank")["part"].nunique() == 1).all()
    )


def _job_path(trace: Trace, ranks: Iterable[int] | None, steps: StepSelection, res: Result,
              *, forced: bool = False, workers: int | None = None,
              scheduler: str | None = None) -> None:  # fmt: skip
    """Add the job's critical path across ranks (the replay's) to the ranks tool's answer:
    partitioned (one replay task per rank) from :data:`~xpuprof.analysis.per_rank.
    DASK_MIN_PARTS` ranks up or on Dask, else the whole replay; where the partition is not
    possible (host collectives, no steps, a cycle across ranks) the whole replay below 32
    ranks or when ``forced`` (``--path``), else a note."""
    from xpuprof.analysis.per_rank import DASK_MIN_PARTS, on_dask, selected_parts
    from xpuprof.sim.paths import job_path_tables, path_tables

    n = len(selected_parts(trace, ranks))
    tables: dict[str, Any] = {}
    facts: dict[str, Any] = {}
    whole = True
    if n >= DASK_MIN_PARTS or on_dask(n, workers, scheduler):
        from xpuprof.sim.job_parts import NotPartitioned, job_path_parts

        try:
            seg = job_path_parts(trace, ranks=ranks, steps=steps, workers=workers,
                                 scheduler=scheduler)  # fmt: skip
            ranks_of = {int(s["part"]): s.get("rank") for s in trace.sources}
            tables, facts = path_tables(seg, trace, ranks_of)
            whole = False
            res.notes.append(f"the job's critical path: replayed rank by rank ({n} replay "
                             "tasks, each rank's graph alone, its collectives' rendezvous "
                             "solved across ranks first): the whole replay's answer")  # fmt: skip
        except NotPartitioned as e:
            if n >= DASK_MIN_PARTS and not forced:
                res.notes.append(f"the job's critical path is left out: it cannot be "
                                 f"replayed rank by rank here ({e}), and from "
                                 f"{DASK_MIN_PARTS} ranks up the whole replay of all {n} ranks "
                                 "in one process is made only on --path")  # fmt: skip
                return
            res.notes.append("the job's critical path is the whole replay's, in one process: "
                             f"it cannot be replayed rank by rank here ({e})")  # fmt: skip
    if whole:
        from xpuprof.sim import replay as run_replay

        tables, facts = job_path_tables(run_replay(trace, ranks=ranks, steps=steps))
    if not tables:
        res.notes.append("the replay graph holds nothing to walk: no cross-rank critical path")
        return
    res.tables.update(tables)
    res.facts.update(facts)
    n = facts["path_crossings"]
    line = (f"The job's critical path ({human_time(facts['path_ns'])}) runs "
            f"{facts['path_rank_share']:.0f} % on rank {facts['path_rank']} and crosses to "
            f"another rank {n} time{'' if n == 1 else 's'} through collectives.")  # fmt: skip
    head = res.facts.get("headline")
    res.facts["headline"] = f"{head} {line}" if head else line


#: The changes the what-if page offers whatever the store (``whatif_picks``): (change, what
#: it stands for, the levels the store must have for it to select anything; () = any).
COMMON_CHANGES = (
    ("host-gaps=0.5", "half the host time outside ops (Python, dispatch)", ()),
    ("scale:kernel=0.5", "kernels twice as fast", ("kernel",)),
    ("scale:op=0.5", "ops' own CPU time halved", ("op",)),
    ("no-sync", "no host call waits for the device", ("runtime",)),
    ("cuda-graphs", "no host cost to launch (CUDA graphs)", ("runtime",)),
    ("dataloader-workers=2", "the input pipeline in 2 worker processes", ()),
    ("no-input-wait", "no time spent waiting for input", ()),
)  # fmt: skip


def whatif_picks(trace: Trace) -> dict[str, Any]:
    """The common changes that can select something in this store (:data:`COMMON_CHANGES`),
    judged from the manifest's event counts per level and, for the input pipeline's, one
    query for an input span's name (``sim.whatif.INPUT_PATTERN``) — cheap tests, not a replay:
    a change offered may still find nothing to change (``no-sync`` without a sync), and says
    so when tried. ``{"common": [{"change", "help"}], "levels": {level: events}}``."""
    from xpuprof.sim.whatif import INPUT_PATTERN

    levels = {str(k): int(v) for k, v in (trace.manifest.get("levels") or {}).items() if v}
    device = any(levels.get(x) for x in ("kernel", "memcpy", "memset", "collective"))
    has_input = False
    if levels:
        pattern = INPUT_PATTERN.replace("(?i)", "")
        found = trace.sql("select 1 from events where level in ('op', 'annotation', "
                          "'runtime', 'other') and regexp_matches(lower(name), "
                          f"'{pattern}') limit 1")  # fmt: skip
        has_input = len(found) > 0
    out = []
    for change, text, need in COMMON_CHANGES:
        if need and not all(levels.get(x) for x in need):
            continue
        if change.startswith(("no-sync", "cuda-graphs")) and not device:
            continue
        if change.startswith(("dataloader-workers", "no-input-wait")) and not has_input:
            continue
        out.append({"change": change, "help": text})
    return {"common": out, "levels": levels}


# ------------------------------------------------------------------------------ the viewer
# The trace viewer's questions (docs/view.md): thin names for :mod:`xpuprof.view`, so the web UI
# asks this module, as it does for every tool, and imports nothing that computes.


def viewer_tracks(trace: Trace, sim: bool = False, whatif: str | None = None) -> dict[str, Any]:
    """The viewer's tracks (rank, process, thread, stream, counter) and the trace's time span;
    with ``sim``, each replayed thread and stream followed by its simulated twin; with
    ``whatif`` (changes, as ``whatif`` takes them), by the what-if's simulated twin."""
    if whatif:
        from xpuprof.view.simulated import whatif_tracks

        return whatif_tracks(trace, whatif)
    from xpuprof.view import tracks

    return tracks(trace, sim=sim)


def viewer_window(
    trace: Trace, ts0: int, ts1: int, width_px: int, tracks: list[int] | None = None,
    sim: bool = False, whatif: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Events and per-pixel summaries of a time window at a width in pixels (with ``sim``,
    on the simulated tracks too; with ``whatif``, on the what-if's)."""
    if whatif:
        from xpuprof.view.simulated import whatif_window

        return whatif_window(trace, ts0, ts1, width_px, tracks, whatif)
    from xpuprof.view import window

    return window(trace, ts0, ts1, width_px, tracks, sim=sim)


def viewer_event(trace: Trace, event_id: int, sim: bool = False,
                 whatif: str | None = None) -> dict[str, Any]:  # fmt: skip
    """One event with its args, its ancestry across levels and its flows (with ``sim``, its
    simulated start, duration and track too; with ``whatif``, the what-if's)."""
    if whatif:
        from xpuprof.view.simulated import whatif_event

        return whatif_event(trace, event_id, whatif)
    from xpuprof.view import event

    return event(trace, event_id, sim=sim)


def viewer_search(trace: Trace, text: str, limit: int = 100) -> dict[str, Any]:
    """Events whose name contains ``text`` (case-insensitive), in time order."""
    from xpuprof.view import search

    return search(trace, text, limit=limit)


def viewer_overlays(
    trace: Trace, *, ranks: Iterable[int] | None = None, steps: StepSelection = None
) -> dict[str, Any]:
    """The critical path and the advisor's findings as events to mark in the viewer."""
    from xpuprof.view import overlays

    return overlays(trace, ranks=ranks, steps=steps)


# ------------------------------------------------------------------- report and web server


def write_report(
    trace: Trace, out: str | Path, *, ranks: Iterable[int] | str | None = None,
    steps: StepSelection | str = None, predict: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Write the self-contained HTML report of ``trace`` to ``out`` (:mod:`xpuprof.ui.report`);
    ranks and steps may be given as the CLI's text; ``predict``: the recommendations with the
    gain their replayed change predicts."""
    from xpuprof.ui.report import write_report as write

    kw = _call(get("overview"), (trace,), {"ranks": ranks, "steps": steps})
    return write(trace, Path(out), **kw, predict=predict)


def parse_levels(text: str | None) -> list[str]:
    """``model,layer,op`` → the leveled levels (all when None or empty)."""
    from xpuprof.live.leveled import LEVELS

    if not text:
        return list(LEVELS)
    return [p.strip() for p in text.split(",") if p.strip()]


def parse_percent(text: str | float, what: str) -> float:
    """``2``, ``2%`` or ``0.5 %`` → a fraction (0.02), finite and more than 0."""
    try:
        v = float(str(text).strip().rstrip("%").strip())
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise XpuprofError(f"{what} {text!r}: not a percentage > 0 (e.g. 2 or 2%)")
    return v / 100


def leveled(argv: list[str], *, levels: str | None = None, out: str | Path | None = None,
            target: str | float = 2, max_runs: int = 3, settle: int = 1,
            timeout: float | None = None, progress: Callable[..., None] | None = None,
            ) -> Result:  # fmt: skip
    """``xpuprof leveled -- CMD``: the script measured level by level, merged
    (:func:`xpuprof.live.leveled.leveled_script`); its Result."""
    from xpuprof.live.leveled import leveled_script

    if max_runs < 1 or settle < 0:
        raise XpuprofError(f"--max-runs must be ≥ 1 and --settle ≥ 0, got {max_runs}, {settle}")
    return leveled_script(argv, parse_levels(levels), out=out,
                          target=parse_percent(target, "--target"), max_runs=max_runs,
                          settle=settle, timeout=timeout, progress=progress).result()  # fmt: skip


def sweep(models: str | None, batches: str, dtypes: str = "fp32", *, out: str | Path,
          levels: str | None = None, target: str | float = 2, max_steps: int = 40,
          timeout: float | None = 600, threads: int | None = None, device: str = "cpu",
          report: str | Path | None = None,
          progress: Callable[[int, int, dict[str, Any]], None] | None = None,
          ) -> Result:  # fmt: skip
    """``xpuprof sweep``: every configuration measured leveled
    (:func:`xpuprof.live.sweep.sweep`), its Result, and the HTML report written (default
    ``OUT/report.html``; its path is the fact ``report``)."""
    from xpuprof.live.sweep import sweep as run_sweep
    from xpuprof.ui.sweep_report import write_sweep_report
    from xpuprof.workloads.models import BUILTIN

    names = [m.strip() for m in (models or ",".join(BUILTIN)).split(",") if m.strip()]
    sizes = parse_numbers(batches)
    kinds = [d.strip() for d in dtypes.split(",") if d.strip()]
    if max_steps < 2:
        raise XpuprofError(f"--max-steps must be ≥ 2, got {max_steps}")
    page = Path(report) if report else Path(out) / "report.html"
    res = run_sweep(names, sizes, kinds, out=out, levels=parse_levels(levels),
                    device=device, target=parse_percent(target, "--target"),
                    min_steps=min(10, max_steps), max_steps=max_steps, timeout=timeout,
                    threads=threads, progress=progress)  # fmt: skip
    written = write_sweep_report(res, page)
    res.facts["report"] = written["path"]
    return res


def sweep_summary(res: Result) -> Result:
    """What ``xpuprof sweep`` prints of a sweep: the headline, the summary table and the
    notes (the per-model tables are in the report and ``--json``)."""
    return Result(tables={"summary": res.tables["summary"]}, notes=list(res.notes),
                  facts={"headline": res.facts.get("headline")},
                  present={k: v for k, v in res.present.items() if k == "summary"})  # fmt: skip


def serve_ui(root: str | Path, *, host: str = "127.0.0.1", port: int = 8765,
             token: str | None = None) -> None:  # fmt: skip
    """Serve the web UI over a store or a directory of stores (:mod:`xpuprof.ui.web`)."""
    from xpuprof.ui.web.server import serve

    serve(Path(root), host=host, port=port, token=token)


# ------------------------------------------------------------------------------ the list

_ALL = Presentation(all_rows=True)
_INFO = INFO_PRESENT
_RECOMMENDATIONS = Presentation(
    layout="paragraphs",
    title="recommendations (ranked by the step time they can save, at most)",
    lines=(
        "{recommendation}",
        "{finding}: {evidence}",
        "{saving}",
    ),
)
#: The recommendations with their predicted gains (``--predict``): each paragraph says what
#: the replayed change is predicted to save (or why there is no prediction), then the bound.
_PREDICTED = Presentation(
    layout="paragraphs",
    title="recommendations (ranked by predicted gain; those without a prediction by the step "
    "time they can save, at most)",
    lines=(
        "{recommendation}",
        "{finding}: {evidence}",
        "{prediction}",
        "{saving}",
    ),
)
#: The Dask cluster of the per-rank work (``analysis/per_rank.py``); CLI only.
_CLUSTER = (
    Option("workers", "Dask workers for the per-rank analysis (default: one per core from 32 "
                      "ranks of more than 1 M events, else in this process).", type=int,
           local=True),
    Option("scheduler", "A Dask scheduler's address: analyse the ranks on that cluster (the "
                        "store must be readable there).", local=True),
)  # fmt: skip
_PREDICT = Option(
    "predict",
    "Replay each recommendation's change on the trace (as xpuprof whatif does) and rank them "
    "by predicted gain; those predicted to gain < 1 % are left out, and a note names them. "
    "Slower: one replay per recommendation.",
    False,
    bool,
)
_SUMMARY = Presentation(layout="transpose", label="rank", all_rows=True)
_OVERVIEW = {
    "summary": _SUMMARY,
    "top_ops": Presentation(title="top ops (by self time)"),
    "top_kernels": Presentation(title="top kernels (by total time)"),
    "recommendations": _RECOMMENDATIONS,
}
#: Units of the columns whose names do not carry one (render.py reads names for the rest).
_ROOF_UNITS = (("flops", "FLOP"), ("achieved_flops", "FLOP/s"), ("peak_flops", "FLOP/s"),
               ("roof", "FLOP/s"), ("achieved_bandwidth", "B/s"), ("peak_bandwidth", "B/s"),
               ("intensity", "FLOP/B"), ("ridge", "FLOP/B"), ("pct_of_roof", "%"),
               ("share_of_time", "%"))  # fmt: skip
_MEMORY_UNITS = (("total_allocated", "bytes"), ("total_reserved", "bytes"),
                 ("peak_allocated", "bytes"), ("reserved_at_peak", "bytes"),
                 ("peak_reserved", "bytes"), ("addr", "hex"))  # fmt: skip
_COMM_UNITS = (("dur", "ns"), ("algbw", "B/s"), ("busbw", "B/s"), ("first_start", "ts"),
               ("last_start", "ts"))  # fmt: skip
_PER_RANK = Presentation(layout="transpose", label="rank", all_rows=True)
_HTA = Option(
    "hta_compatible",
    "Reproduce HTA 0.5.0's numbers, rounding and quirks included (the last step is then left "
    "out unless --steps says otherwise).",
    False,
    bool,
)

#: Every tool, in the order ``xpuprof --help`` lists them.
TOOLS: tuple[Tool, ...] = (
    Tool("info", "xpuprof.ui.tools:info",
         "What a store holds: sources, ranks, devices, rows per table and per level.",
         common=(), present=_INFO,
         options=(Option("check", "Also verify every file against the manifest (missing, "
                                  "truncated, wrong files); exit 2 on any problem.", False,
                         bool),),
         document="xpuprof.ui.tools:info_document"),
    Tool("overview", "xpuprof.ui.tools:overview",
         "Step time, where it goes (compute, communication, memcpy, input, host-bound idle), "
         "the bottleneck, top ops and kernels, and the advisor's recommendations.",
         options=(Option("top", "Top ops and kernels to list.", 10, int), _PREDICT,
                  *_CLUSTER),
         present=_OVERVIEW),
    Tool("summary", "xpuprof.ui.tools:summary",
         "What the demo prints: the store, the overview, top ops, slowest layers and "
         "recommendations.",
         options=(_PREDICT,),
         present={**_INFO, "overview": _SUMMARY,
                  "top_ops": _OVERVIEW["top_ops"],
                  "slowest_layers": Presentation(title="slowest layers (forward time)"),
                  "recommendations": _RECOMMENDATIONS}),
    Tool("stats", "xpuprof.ui.tools:stats",
         "Op, kernel and layer statistics (all three unless one is chosen).",
         options=(Option("ops", "Framework ops.", False, bool),
                  Option("kernels", "Device kernels.", False, bool),
                  Option("layers", "Model layers (modules and types).", False, bool),
                  Option("shapes", "Ops per input shapes.", False, bool),
                  Option("by_op", "Kernels per launching op.", False, bool)),
         present={"kernels": Presentation(units=(("shared_memory", "bytes"),))}),
    Tool("hierarchy", "xpuprof.analysis.hierarchy:hierarchy",
         "Device time attributed up the stack (kernel → op → layer → step), inclusive and "
         "exclusive, as XSP does.",
         options=(Option("by", "layer, module_type, op, step or runtime.", "layer"),
                  Option("per_rank", "One row per rank and node.", False, bool))),
    Tool("breakdown", "xpuprof.analysis.breakdown:breakdown",
         "HTA's temporal breakdown, kernel-type breakdown and comm/compute overlap (every "
         "step unless --steps or --hta-compatible says otherwise).",
         options=(Option("top", "Kernels listed per rank and type.", 10, int), _HTA),
         present={"temporal": _PER_RANK, "types": _ALL, "overlap": _PER_RANK}),
    Tool("idle", "xpuprof.analysis.idle:idle_time",
         "Idle time per stream (host wait, kernel wait, other), launch delays, short "
         "kernels, queue length (every step unless --steps or --hta-compatible says "
         "otherwise).",
         options=(_HTA,), present={"launch_summary": _PER_RANK}),
    Tool("input", "xpuprof.analysis.input_pipeline:input_pipeline",
         "Input pipeline: time each step waits for data, classified as XProf does.",
         options=(Option("pattern", "Regex naming the input spans (default: DataLoader "
                                    "iterator spans and names like load_batch)."),),
         present={"summary": _PER_RANK}),
    Tool("roofline", "xpuprof.analysis.roofline:roofline",
         "Roofline: FLOPs, bytes, arithmetic intensity, achieved rates, bound and % of roof.",
         options=(Option("device", "Judge against this device (e.g. h200-sxm) instead of "
                                   "the trace's."),
                  Option("tf32", "fp32 matmuls ran on TF32 tensor cores.", False, bool),
                  Option("calibrate", "Measure this machine's CPU roof with a short "
                                      "micro-benchmark (cached in the user cache directory).",
                         None, bool)),
         present={"ops": Presentation(units=_ROOF_UNITS),
                  "by_name": Presentation(units=_ROOF_UNITS),
                  "kernels": Presentation(units=_ROOF_UNITS),
                  "devices": Presentation(units=(("memory_bandwidth", "B/s"),
                                                 ("memory_bytes", "bytes")), all_rows=True)}),
    Tool("memory", "xpuprof.analysis.memory:memory_timeline",
         "Memory: allocation timeline, peak, and what is live at the peak by op and layer.",
         options=(Option("device", "cuda, cuda:1, cpu or a device index."),),
         present={"timeline": Presentation(units=_MEMORY_UNITS),
                  "peaks": Presentation(layout="transpose", label="device", all_rows=True,
                                        units=_MEMORY_UNITS),
                  "live": Presentation(units=_MEMORY_UNITS),
                  "live_by_op": Presentation(title="live at the peak, by op")}),
    Tool("comm", "xpuprof.analysis.comm:collectives",
         "Communication: collectives with bus bandwidth, overlap with compute, cross-rank "
         "skew.",
         options=(Option("align", "Clock alignment: auto, none, end.", "auto"),),
         present={"collectives": Presentation(units=_COMM_UNITS),
                  "summary": Presentation(units=_COMM_UNITS),
                  "skew": Presentation(units=_COMM_UNITS)}),
    Tool("ranks", "xpuprof.ui.tools:ranks",
         "Across ranks: step time per rank and step, the rank holding each step back and "
         "why, collective wait vs transfer per rank, and the job's critical path across ranks "
         "(docs/ranks.md).",
         options=(Option("path", "The job's critical path across ranks (replays the trace: "
                                 "rank by rank from 32 ranks up; on by default).", None, bool,
                         flag="--path/--no-path"),
                  *_CLUSTER),
         present={"slowest": Presentation(title="who held each step back", all_rows=True,
                                          units=(("caused_ns", "ns"), ("holder_step_ns", "ns"),
                                                 ("median_step_ns", "ns"),
                                                 ("late_start_ns", "ns"), ("cause_ns", "ns"))),
                  "steps": Presentation(title="step time per rank and step",
                                        units=(("start", "ts"),)),
                  "causes": Presentation(title="the holder against the median rank"),
                  "waits": Presentation(title="collective wait vs transfer, per rank"),
                  "path": Presentation(title="the job's critical path, by rank and category",
                                       units=(("share_pct", "%"),)),
                  "path_events": Presentation(title="where the job's critical path spends "
                                                    "its time", units=(("time_ns", "ns"),
                                                                       ("share_pct", "%"),
                                                                       ("max_ns", "ns"))),
                  "path_ranks": Presentation(title="the job's critical path, rank by rank",
                                             units=(("start", "ts"), ("end", "ts")))}),
    Tool("critical-path", "xpuprof.analysis.critical_path:critical_path",
         "The critical path through host and device events, each segment attributed.",
         options=(Option("annotation", "Window: host spans named so."),
                  Option("instance", "Which such span (0 = first).", 0, int)),
         present={"summary": Presentation(title="critical path by attribution", all_rows=True,
                                          units=(("time", "ns"), ("wall", "ns"),
                                                 ("percent", "%"))),
                  "path": Presentation(title="critical path, segment by segment",
                                       units=(("start", "ts"), ("end", "ts"),
                                              ("duration", "ns"), ("weight", "ns")))}),
    Tool("replay", "xpuprof.ui.tools:replay",
         "Replay the trace on its dependency graph (measured costs) and compare: simulated vs "
         "measured step time per rank and step, edges per kind, what could not be modelled, "
         "the largest start-time deviations (docs/replay.md).",
         options=(Option("top", "Largest start-time deviations to list.", 20, int),
                  Option("export", "Also write the measured and simulated timelines as one "
                                   "Chrome trace for Perfetto: chrome.", local=True),
                  Option("output", "The file --export writes (.json or .json.gz; default: "
                                   "beside the store, STORE.replay.json.gz).", short="-o",
                         local=True),
                  Option("align", "Clock alignment of the ranks: auto, none, end.", "auto"))),
    Tool("whatif", "xpuprof.ui.tools:whatif",
         "Predict what a change is worth: replay the trace with it and compare with the "
         "measured replay (step time, speedup, critical-path shift; docs/whatif.md).",
         options=(Option("change", "A change: scale:SELECTOR=FACTOR (SELECTOR may end in "
                                   "/REGEX and @REGION), host-gaps=FACTOR, "
                                   "no-sync[:REGEX] (and @REGION), "
                                   "cuda-graphs[:REGEX], no-input-wait[:REGEX], "
                                   "dataloader-workers=N, overlap-collective[:REGEX] (and "
                                   "@UNTIL), "
                                   "fuse-elementwise[:REGEX], fuse:REGEX, batch=FACTOR, "
                                   "threads=N, dtype=bf16, device=KEY, collective:K=V,…; "
                                   "repeat it or separate by ';' (docs/whatif.md).",
                         type=list[str]),
                  Option("align", "Clock alignment of the ranks: auto, none, end.", "auto"))),
    Tool("diff", "xpuprof.analysis.diff:diff",
         "The step-time delta between two traces split into where the time goes, then the "
         "ops and kernels added, removed and changed.",
         inputs=2,
         present={"steps": Presentation(title="step time and where it goes, mean per step "
                                              "(a: baseline, b: new)", all_rows=True),
                  "ops": Presentation(title="ops, largest change first (a: baseline, b: new)"),
                  "kernels": Presentation(title="kernels, largest change first (a: baseline, "
                                                "b: new)")}),
    Tool("hardware", "xpuprof.ui.tools:hardware",
         "The device table the roofline uses: peak FLOP/s per dtype, memory and link "
         "bandwidth.",
         common=(), inputs=0, present={"devices": _ALL}),
    Tool("formats", "xpuprof.ui.tools:formats",
         "The input formats xpuprof import reads (built-in readers and plug-ins).",
         common=(), inputs=0, present={"formats": _ALL}),
)  # fmt: skip

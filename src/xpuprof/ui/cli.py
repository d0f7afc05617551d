"""The ``xpuprof`` command line.

Every command that prints a table also takes ``--json`` and then prints exactly one JSON
document on stdout, so scripts and tests read numbers rather than text. Errors print one line on
stderr (``error: <file>: <what> (at <where>)``) and exit with code 2.

Heavy libraries (pyarrow, pandas, DuckDB, Dask) are imported inside the commands that need them,
so ``xpuprof info`` answers from the manifest alone in a fraction of a second.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from xpuprof.core.errors import XpuprofError
from xpuprof.core.names import LEVELS, TABLES

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="xpuprof: performance analysis for ML programs on accelerators.",
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

#: Show a progress bar when the input is at least this large.
PROGRESS_MIN_BYTES = 16 << 20


def _fail(e: Exception) -> None:
    # escape: a file named "trace[rank0].json" must not be read as Rich markup
    err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=1, default=str) + "\n")


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _level_table(levels: dict[str, int]) -> Table:
    t = Table(title="events per level", title_justify="left")
    t.add_column("level")
    t.add_column("events", justify="right")
    for lv in LEVELS:
        if levels.get(lv):
            t.add_row(lv, f"{levels[lv]:,}")
    return t


def _rows_table(rows: dict[str, int]) -> Table:
    t = Table(title="rows per table", title_justify="left")
    t.add_column("table")
    t.add_column("rows", justify="right")
    for name in TABLES:
        t.add_row(name, f"{rows.get(name, 0):,}")
    return t


@app.command("import")
def import_cmd(
    paths: list[Path] = typer.Argument(..., help="Trace files (.json, .json.gz) or directories."),
    store: Path = typer.Option(..., "-o", "--output", help="Store directory to write."),
    lenient: bool = typer.Option(
        False, "--lenient", help="Keep what parses in damaged files and report what was dropped."
    ),
    scheduler: str = typer.Option(
        None, "--scheduler", help="Address of a running Dask scheduler to import on."
    ),
    workers: int = typer.Option(
        None, "--workers", help="Worker processes (default: one per core for large inputs)."
    ),
    force: bool = typer.Option(False, "--force", help="Re-import even unchanged files."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Import PyTorch profiler (Kineto) / Chrome-trace files into a store."""
    from xpuprof.trace.ingest import expand_sources, import_traces

    try:
        total = sum(p.stat().st_size for p in expand_sources(list(paths)))
        progress = None
        bar = None
        if not as_json and total >= PROGRESS_MIN_BYTES:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                console=err,
                transient=True,
            )
            task = bar.add_task("importing", total=total)

            def progress(done: int, _total: int) -> None:
                bar.update(task, completed=done)

            bar.start()
        try:
            report = import_traces(
                list(paths),
                store,
                lenient=lenient,
                scheduler=scheduler,
                workers=workers,
                force=force,
                progress=progress,
            )
        finally:
            if bar is not None:
                bar.stop()
    except XpuprofError as e:
        _fail(e)
    doc = report.to_dict()
    if as_json:
        _print_json(doc)
        return
    if report.noop:
        out.print(
            f"{report.store}: up to date ({len(report.sources)} source(s) unchanged, "
            f"{report.rows.get('events', 0):,} events)"
        )
        return
    t = Table(title=f"imported into {report.store}", title_justify="left")
    for c in ("source", "rank", "read", "events", "flows", "counters", "metadata", "dropped"):
        t.add_column(c, justify="left" if c == "source" else "right")
    for s in doc["sources"]:
        dropped = sum(d["events"] for d in s["dropped"])
        t.add_row(
            Path(s["path"]).name + (" (unchanged)" if s["path"] in report.reused else ""),
            "-" if s["rank"] is None else str(s["rank"]),
            f"{s['events_read']:,}",
            f"{s['rows']['events']:,}",
            f"{s['rows']['flows']:,}",
            f"{s['rows']['counters']:,}",
            f"{s['rows']['metadata']:,}",
            f"{dropped:,}",
        )
    out.print(t)
    out.print(_level_table(report.levels))
    for s in doc["sources"]:
        for d in s["dropped"]:
            where = f" at byte {d['offset']}" if d.get("offset") is not None else ""
            out.print(f"[yellow]dropped[/] {d['events']} from {s['path']}: {d['reason']}{where}")
    out.print(
        f"read {report.events_read:,} events from {len(report.sources)} file(s) in "
        f"{report.seconds:.2f} s ({report.workers} worker(s))"
    )


@app.command()
def info(
    store: Path = typer.Argument(..., help="Store directory."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """What a store holds: sources, ranks, devices, rows per table and per level."""
    from xpuprof.trace.store import read_manifest

    try:
        m = read_manifest(store)
    except XpuprofError as e:
        _fail(e)
    sources = []
    for s in m["sources"]:
        meta = s.get("meta", {})
        devices = [
            d.get("name") for d in meta.get("deviceProperties", []) or [] if isinstance(d, dict)
        ]
        sources.append(
            {
                "path": s["path"],
                "part": s["part"],
                "rank": s["rank"],
                "rank_from": s.get("rank_from"),
                "host": s.get("host"),
                "format": s.get("format"),
                "size": s["size"],
                "events_read": s["read"]["total"],
                "read": s["read"],
                "rows": s["rows"],
                "levels": s["levels"],
                "devices": devices,
                "world_size": (meta.get("distributedInfo") or {}).get("world_size")
                if isinstance(meta.get("distributedInfo"), dict)
                else None,
            }
        )
    doc = {
        "store": str(Path(store).resolve()),
        "version": m["version"],
        "written": m.get("written"),
        "events_read": m["events_read"],
        "rows": m["rows"],
        "levels": m["levels"],
        "sources": sources,
    }
    if as_json:
        _print_json(doc)
        return
    t = Table(title=f"{doc['store']}", title_justify="left")
    for c in ("part", "rank", "source", "size", "read", "events", "devices"):
        t.add_column(c, justify="left" if c in ("source", "devices") else "right")
    for s in sources:
        devs = sorted(set(d for d in s["devices"] if d))
        t.add_row(
            str(s["part"]),
            "-" if s["rank"] is None else str(s["rank"]),
            Path(s["path"]).name,
            _human_bytes(s["size"]),
            f"{s['events_read']:,}",
            f"{s['rows']['events']:,}",
            ", ".join(devs) if devs else "-",
        )
    out.print(t)
    out.print(_rows_table(m["rows"]))
    out.print(_level_table(m["levels"]))


@app.command()
def sql(
    store: Path = typer.Argument(
        ..., help="Store directory (or a trace file, imported on the fly)."
    ),
    query: str = typer.Argument(
        ..., help="SQL over tables events, flows, links, counters, metadata."
    ),
    limit: int = typer.Option(50, "--limit", help="Rows to print (all rows with --json)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Run a DuckDB SQL query over a store."""
    from xpuprof.trace.trace import load

    try:
        with load(store) as trace:
            df = trace.sql(query)
    except XpuprofError as e:
        _fail(e)
    if as_json:
        sys.stdout.write(df.to_json(orient="records", date_format="iso") + "\n")
        return
    t = Table()
    for c in df.columns:
        t.add_column(str(c), justify="right" if df[c].dtype.kind in "iuf" else "left")
    for row in df.head(limit).itertuples(index=False):
        t.add_row(*["" if v is None else str(v) for v in row])
    out.print(t)
    if len(df) > limit:
        out.print(f"({len(df):,} rows, first {limit} shown; --limit N or --json for more)")


@app.command()
def export(
    store: Path = typer.Argument(..., help="Store directory."),
    output: str = typer.Option(
        ...,
        "-o",
        "--output",
        help="Output file (.json or .json.gz), or a directory (existing, or ending in /) "
        "for one file per rank.",
    ),
    fmt: str = typer.Option("chrome", "--format", help="Output format: chrome."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Write a store back out as a Chrome trace (opens in Perfetto and chrome://tracing)."""
    if fmt != "chrome":
        _fail(XpuprofError(f"unknown export format {fmt!r}; formats: chrome"))
    from xpuprof.export.chrome import export_chrome
    from xpuprof.trace.trace import Trace

    try:
        with Trace(store) as trace:
            summary = export_chrome(trace, output)
    except XpuprofError as e:
        _fail(e)
    if as_json:
        _print_json(summary)
    else:
        out.print(
            f"wrote {summary['events']:,} trace entries from {summary['sources']} source(s) "
            f"to {summary['path']} ({_human_bytes(summary['bytes'])})"
        )


def _seconds(text: str) -> float:
    """``2s``, ``500ms``, ``1.5``, ``1m`` → seconds."""
    t = text.strip().lower()
    for suffix, scale in (("ms", 1e-3), ("s", 1.0), ("m", 60.0)):
        if t.endswith(suffix):
            t, mult = t[: -len(suffix)], scale
            break
    else:
        mult = 1.0
    try:
        return float(t) * mult
    except ValueError:
        raise XpuprofError(f"not a duration: {text!r} (use e.g. 2s, 500ms, 1m)") from None


@app.command()
def capture(
    url: str = typer.Argument(..., help="The job's capture server, e.g. http://127.0.0.1:8471"),
    store: Path = typer.Option(..., "-o", "--output", help="Store directory to write."),
    duration: str = typer.Option("2s", "--duration", help="How long to capture (2s, 500ms)."),
    token: str = typer.Option(
        None, "--token", envvar="XPUPROF_TOKEN", help="The job's token (or XPUPROF_TOKEN)."
    ),
    level: str = typer.Option(None, "--level", help="Capture level (default: the server's)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Capture a running job on demand (the job runs xpuprof.serve) into a store."""
    from xpuprof.live.remote import request_capture

    try:
        seconds = _seconds(duration)
        if not as_json:
            err.print(f"capturing {url} for {seconds:g} s…")
        request_capture(url, store, duration=seconds, token=token, level=level)
    except XpuprofError as e:
        _fail(e)
    info(store, as_json)


@app.command()
def demo(
    store: Path = typer.Option(
        Path("xpuprof-demo.store"), "-o", "--output", help="Store directory to write."
    ),
    steps: int = typer.Option(5, "--steps", help="Training steps to record."),
    level: str = typer.Option("op", "--level", help="Capture level: step, layer, op, full."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Train a small built-in transformer on the CPU under xpuprof.profile, write the store and
    print what it holds. Without torch, import the real trace shipped with xpuprof instead."""
    import shutil

    from xpuprof.trace.ingest import import_traces

    if store.exists():
        from xpuprof.trace.store import is_store

        if not is_store(store):
            _fail(XpuprofError(f"{store}: exists and is not an xpuprof store; not replacing it"))
        shutil.rmtree(store)  # the demo's own store from an earlier run
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
    try:
        if have_torch:
            from xpuprof.live.profile import profile, step
            from xpuprof.workloads.demo import Trainer

            trainer = Trainer()
            trainer.step()  # the first step allocates and warms up: not what a user measures
            if not as_json:
                err.print(f"training the demo transformer for {steps} steps at level {level!r}…")
            with profile(store, level=level, model=trainer.model):
                for i in range(steps):
                    step(i)
                    trainer.step()
        else:
            from importlib.resources import files

            err.print(
                "torch is not installed (pip install 'xpuprof[torch]'): importing the example "
                "trace shipped with xpuprof instead"
            )
            example = files("xpuprof") / "data" / "example_cpu_train.pt.trace.json.gz"
            import_traces([Path(str(example))], store)
    except XpuprofError as e:
        _fail(e)
    info(store, as_json)
    if as_json:
        return
    from xpuprof.advise.rules import advise
    from xpuprof.analysis.common import Result
    from xpuprof.analysis.overview import overview
    from xpuprof.analysis.stats import layer_stats
    from xpuprof.trace.trace import Trace

    with Trace(store) as trace:
        ov = overview(trace, top=8)
        adv = advise(trace, overview_result=ov)
        summary = ov.tables["summary"]
        # one column per rank reads better than one very wide row
        overview_t = summary.set_index(summary["rank"].map(lambda r: f"rank {r}" if
                                       r == r and r is not None else "value"))  # fmt: skip
        overview_t = overview_t.drop(columns=["rank"]).T.reset_index(names="")
        tables = {"overview": overview_t, "top ops (self time)": ov.tables["top_ops"]}
        if trace.manifest["levels"].get("layer"):
            layers = layer_stats(trace).sort_values("forward_ns", ascending=False)
            layers["forward_ms"] = layers.forward_ns / 1e6
            layers["backward_ms"] = layers.backward_ns / 1e6
            tables["slowest layers"] = layers[["layer", "module_type", "calls", "forward_ms",
                                               "backward_ms"]]  # fmt: skip
        tables |= adv.tables
    render_result(Result(tables=tables, notes=ov.notes + adv.notes), False, limit=8)


# ----------------------------------------------------------------------------------------------
# analysis commands: each runs one tool of xpuprof.analysis and renders its Result
# ----------------------------------------------------------------------------------------------


def _parse_list(text: str | None) -> list[int] | None:
    """``3``, ``3,5,9`` or ``3-7`` (inclusive) → a list of ints; None stays None."""
    if text is None:
        return None
    out: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    except ValueError:
        raise XpuprofError(f"not a list of numbers: {text!r} (use e.g. 3, 3,5 or 3-7)") from None
    return out


def _render_df(df: Any, title: str, limit: int) -> Table:
    t = Table(title=title, title_justify="left")
    for c in df.columns:
        t.add_column(str(c), justify="right" if df[c].dtype.kind in "iuf" else "left")
    for row in df.head(limit).itertuples(index=False):
        cells = []
        for v in row:
            if isinstance(v, float):
                cells.append(f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}")
            elif v is None:
                cells.append("")
            else:
                cells.append(str(v))
        t.add_row(*cells)
    return t


def _render_recommendations(df: Any) -> None:
    """Findings as numbered paragraphs: a table cannot hold their sentences legibly."""
    out.print("[bold]recommendations[/] (ranked by the step time they can save, at most)")
    for i, r in enumerate(df.itertuples(index=False), 1):
        out.print(
            f"{i}. [bold]{escape(r.recommendation)}[/]\n"
            f"   {escape(r.finding)}: {escape(r.evidence)}\n"
            f"   saves up to {r.saved_ms_per_step:.2f} ms per step ({r.saved_fraction:.0%})",
            highlight=False,
        )


def render_result(res: Any, as_json: bool, limit: int = 20) -> None:
    """Print a tool's Result: each table, then its notes (or one JSON document)."""
    if as_json:
        _print_json(res.to_dict())
        return
    for name, df in res.tables.items():
        if name == "recommendations" and len(df):
            _render_recommendations(df)
            continue
        if name in ("overview", "summary") and len(df) <= 50:
            out.print(_render_df(df, name, len(df)))  # short and essential: all of it
            continue
        out.print(_render_df(df, name, limit))
        if len(df) > limit:
            out.print(f"({len(df):,} rows, first {limit} shown; --limit N or --json for all)")
    for note in res.notes:
        out.print(f"[yellow]note:[/] {escape(note)}")


def run_tool(store: Path, fn: Any, as_json: bool, limit: int, **kwargs: Any) -> None:
    from xpuprof.trace.trace import load

    try:
        with load(store) as trace:
            res = fn(trace, **kwargs)
    except XpuprofError as e:
        _fail(e)
    render_result(res, as_json, limit)


_STORE = typer.Argument(..., help="Store directory (or a trace file, imported on the fly).")
_RANK = typer.Option(None, "--rank", help="Ranks: 0, 0,2 or 0-3 (default: all).")
_STEPS = typer.Option(None, "--steps", help="Steps: 5, 5,6 or 5-9 (default: all).")
_JSON = typer.Option(False, "--json", help="Print one JSON document.")
_LIMIT = typer.Option(20, "--limit", help="Rows to print per table.")


@app.command("input")
def input_cmd(
    store: Path = _STORE,
    rank: str = _RANK,
    steps: str = _STEPS,
    pattern: str = typer.Option(None, "--pattern", help="Regex naming the input spans."),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Input pipeline: time each step waits for data, classified as XProf does."""
    from xpuprof.analysis.input_pipeline import input_pipeline

    run_tool(store, input_pipeline, as_json, limit, ranks=_parse_list(rank),
             steps=_parse_list(steps), pattern=pattern)  # fmt: skip


@app.command("overview")
def overview_cmd(
    store: Path = _STORE,
    rank: str = _RANK,
    steps: str = _STEPS,
    top: int = typer.Option(10, "--top", help="Top ops and kernels to list."),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Step time, where it goes (compute, communication, memcpy, input, host-bound idle), the
    bottleneck, top ops and kernels, and the advisor's recommendations under the numbers."""
    from xpuprof.advise.rules import advise
    from xpuprof.analysis.common import Result
    from xpuprof.analysis.overview import overview
    from xpuprof.trace.trace import load

    try:
        with load(store) as trace:
            ranks, step_list = _parse_list(rank), _parse_list(steps)
            ov = overview(trace, ranks=ranks, steps=step_list, top=top)
            adv = advise(trace, ranks=ranks, steps=step_list, overview_result=ov)
    except XpuprofError as e:
        _fail(e)
    order = ("summary", "steps", "top_ops", "top_kernels")
    res = Result(
        tables={k: ov.tables[k] for k in order if k in ov.tables} | adv.tables,
        notes=ov.notes + adv.notes,
    )
    render_result(res, as_json, limit)


@app.command("critical-path")
def critical_path_cmd(
    store: Path = _STORE,
    rank: int = typer.Option(None, "--rank", help="One rank (default: the first)."),
    steps: str = _STEPS,
    annotation: str = typer.Option(None, "--annotation", help="Window: host spans named so."),
    instance: int = typer.Option(0, "--instance", help="Which such span (0 = first)."),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """The critical path through host and device events, each segment attributed."""
    from xpuprof.analysis.critical_path import critical_path

    run_tool(store, critical_path, as_json, limit, rank=rank, steps=_parse_list(steps),
             annotation=annotation, instance=instance)  # fmt: skip


@app.command("roofline")
def roofline_cmd(
    store: Path = _STORE,
    rank: str = _RANK,
    steps: str = _STEPS,
    device: str = typer.Option(
        None, "--device", help="Judge against this device (e.g. h200-sxm) instead of the trace's."
    ),
    tf32: bool = typer.Option(False, "--tf32", help="fp32 matmuls ran on TF32 tensor cores."),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Roofline: FLOPs, bytes, arithmetic intensity, achieved rates, bound and % of roof."""
    from xpuprof.analysis.roofline import roofline

    run_tool(store, roofline, as_json, limit, device=device, ranks=_parse_list(rank),
             steps=_parse_list(steps), tf32=tf32)  # fmt: skip


@app.command("memory")
def memory_cmd(
    store: Path = _STORE,
    rank: str = _RANK,
    device: str = typer.Option(None, "--device", help="cuda, cuda:1, cpu or a device index."),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Memory: allocation timeline, peak, and what is live at the peak by op and layer."""
    from xpuprof.analysis.memory import memory_timeline

    run_tool(store, memory_timeline, as_json, limit, device=device, ranks=_parse_list(rank))


@app.command("comm")
def comm_cmd(
    store: Path = _STORE,
    rank: str = _RANK,
    steps: str = _STEPS,
    align: str = typer.Option("auto", "--align", help="Clock alignment: auto, none, end."),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Communication: collectives with bus bandwidth, overlap with compute, cross-rank skew."""
    from xpuprof.analysis.comm import collectives

    run_tool(store, collectives, as_json, limit, ranks=_parse_list(rank),
             steps=_parse_list(steps), align=align)  # fmt: skip


@app.command("hardware")
def hardware_cmd(as_json: bool = _JSON) -> None:
    """The device table the roofline uses: peak FLOP/s per dtype, memory and link bandwidth."""
    import pandas as pd

    from xpuprof.analysis.common import Result
    from xpuprof.hardware.specs import table

    render_result(Result(tables={"devices": pd.DataFrame(table())}), as_json, limit=100)


@app.command("stats")
def stats_cmd(
    store: Path = _STORE,
    rank: str = _RANK,
    steps: str = _STEPS,
    ops: bool = typer.Option(False, "--ops", help="Framework ops."),
    kernels: bool = typer.Option(False, "--kernels", help="Device kernels."),
    layers: bool = typer.Option(False, "--layers", help="Model layers (modules and types)."),
    shapes: bool = typer.Option(False, "--shapes", help="Ops per input shapes."),
    by_op: bool = typer.Option(False, "--by-op", help="Kernels per launching op."),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Op, kernel and layer statistics (all three unless one is chosen)."""
    from xpuprof.analysis.stats import stats

    every = not (ops or kernels or layers)
    run_tool(store, stats, as_json, limit, ops=ops or every, kernels=kernels or every,
             layers=layers or every, ranks=_parse_list(rank), steps=_parse_list(steps),
             shapes=shapes, by_op=by_op)  # fmt: skip


@app.command("hierarchy")
def hierarchy_cmd(
    store: Path = _STORE,
    by: str = typer.Option("layer", "--by", help="layer, module_type, op, step or runtime."),
    rank: str = _RANK,
    steps: str = _STEPS,
    per_rank: bool = typer.Option(False, "--per-rank", help="One row per rank and node."),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Device time attributed up the stack (kernel → op → layer → step), inclusive and
    exclusive, as XSP does."""
    from xpuprof.analysis.hierarchy import hierarchy

    run_tool(store, hierarchy, as_json, limit, by=by, ranks=_parse_list(rank),
             steps=_parse_list(steps), per_rank=per_rank)  # fmt: skip


def _steps_hta(text: str | None) -> Any:
    """Steps for the HTA-style tools: HTA drops the last profiler step by default."""
    if text is None or text == "drop-last":
        return "drop_last"
    if text == "all":
        return "all"
    return _parse_list(text)


_STEPS_HTA = typer.Option(
    None, "--steps", help="drop-last (default, as HTA), all, or steps: 5, 5,6, 5-9."
)


@app.command("breakdown")
def breakdown_cmd(
    store: Path = _STORE,
    rank: str = _RANK,
    steps: str = _STEPS_HTA,
    top: int = typer.Option(10, "--top", help="Kernels listed per type."),
    hta_compatible: bool = typer.Option(
        False, "--hta-compatible", help="Reproduce HTA's numbers, rounding and quirks included."
    ),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """HTA's temporal breakdown, kernel-type breakdown and comm/compute overlap."""
    from xpuprof.analysis.breakdown import breakdown

    run_tool(store, breakdown, as_json, limit, ranks=_parse_list(rank),
             steps=_steps_hta(steps), top=top, hta_compatible=hta_compatible)  # fmt: skip


@app.command("idle")
def idle_cmd(
    store: Path = _STORE,
    rank: str = _RANK,
    steps: str = _STEPS_HTA,
    hta_compatible: bool = typer.Option(
        False, "--hta-compatible", help="Reproduce HTA's numbers, rounding and quirks included."
    ),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Idle time per stream (host wait, kernel wait, other), launch delays, short kernels,
    queue length."""
    from xpuprof.analysis.idle import idle_time

    run_tool(store, idle_time, as_json, limit, ranks=_parse_list(rank),
             steps=_steps_hta(steps), hta_compatible=hta_compatible)  # fmt: skip


@app.command("diff")
def diff_cmd(
    baseline: Path = typer.Argument(..., help="Baseline store (or trace file)."),
    new: Path = typer.Argument(..., help="New store (or trace file)."),
    steps: str = _STEPS,
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Ops and kernels added, removed and changed between two traces, and the step-time delta."""
    from xpuprof.analysis.diff import diff
    from xpuprof.trace.trace import load

    try:
        with load(baseline) as a, load(new) as b:
            res = diff(a, b, steps=_parse_list(steps))
    except XpuprofError as e:
        _fail(e)
    render_result(res, as_json, limit)


def main() -> None:
    # Arrow's default allocator (mimalloc) keeps freed memory for reuse: importing a 2 GB trace
    # peaked at 4.5 GB with it and at 3.5 GB with the system allocator, which was also no
    # slower on the import benchmark. Set before pyarrow is first imported; a user's own
    # choice of pool wins.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    try:
        app()
    except XpuprofError as e:  # raised outside a command's own handler
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()

"""The ``xpuprof`` command line.

The analysis commands are made from the list of tools in :mod:`xpuprof.ui.tools` (one command
per entry, its options from the entry); what they print is :mod:`xpuprof.ui.render`'s. The
commands written here are the ones that are not analyses: import, sql, export, capture, demo.

Every command that prints a table also takes ``--json`` and then prints exactly one JSON
document on stdout, so scripts and tests read numbers rather than text. Errors print one line on
stderr (``error: <file>: <what> (at <where>)``) and exit with code 2; anything unexpected prints
one line and a hint to rerun with ``--debug`` (the traceback), exit 1; Ctrl-C prints one line,
exit 130; a closed pipe (``| head``) ends the command quietly. :func:`main` is where all of that
is decided, once.

Heavy libraries (pyarrow, pandas, DuckDB, Dask) are imported inside the commands that need them,
so ``xpuprof info`` answers from the manifest alone in a fraction of a second.

Length: one Typer command per non-analysis action, each mostly its options and help; splitting
them over files would scatter the one place that decides exit codes and error lines.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import typer
import typer.core
from rich.console import Console
from rich.markup import escape

from xpuprof.core.errors import XpuprofError
from xpuprof.core.result import Result
from xpuprof.ui import render, tools

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

_JSON = typer.Option(False, "--json", help="Print one JSON document.")
_LIMIT = typer.Option(20, "--limit", help="Rows to print per table (all rows with --json).")


#: What ``--debug`` (or ``XPUPROF_DEBUG=1``) turned on: tracebacks for every error.
_DEBUG = {"on": False}
#: What ``--wide`` turned on: every column and full names, however wide the terminal.
_WIDE = {"on": False}

#: Exit codes: a user's error (bad input, a damaged file), a bug, Ctrl-C (128 + SIGINT).
EXIT_ERROR, EXIT_BUG, EXIT_INTERRUPTED = 2, 1, 130

#: The hint under an unexpected error.
BUG_HINT = "rerun with --debug for the traceback (and please report it)"


def _error_line(message: str) -> None:
    # escape: a file named "trace[rank0].json" must not be read as Rich markup
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _fail(e: Exception) -> None:
    if _DEBUG["on"]:
        import traceback

        traceback.print_exc()
    _error_line(str(e))
    raise typer.Exit(EXIT_ERROR)


def _documented(name: str | None = None, **options: Any) -> Any:
    """``app.command`` with the docstring as help, each paragraph on one line: Rich's help
    keeps the docstring's line breaks, which read as broken sentences in a terminal."""

    def register(fn: Any) -> Any:
        paragraphs = (inspect.getdoc(fn) or "").split("\n\n")
        text = "\n\n".join(" ".join(p.split()) for p in paragraphs)
        return app.command(name, help=text, **options)(fn)

    return register


@app.callback()
def _options(
    debug: bool = typer.Option(
        False, "--debug", help="Show the traceback of any error (or set XPUPROF_DEBUG=1)."
    ),
    wide: bool = typer.Option(
        False,
        "--wide",
        help="Show every column and full kernel names, however wide the "
        "lines get (default: what fits the terminal, names shortened).",
    ),
) -> None:
    """xpuprof: performance analysis for ML programs on accelerators."""
    _DEBUG["on"] = debug or _debug_env()
    _WIDE["on"] = _WIDE["on"] or wide


def _debug_env() -> bool:
    return os.environ.get("XPUPROF_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


class _FormatsHelp(typer.core.TyperCommand):
    """``import --help`` names the input formats of the reader registry, read only when help
    is asked for (the registry may load plug-ins)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        listed = "\n\n".join(f"{n}: {escape(d)}" for n, d, _ in tools.input_formats())
        # the docstring's paragraphs reflowed: Rich keeps a single newline as a line break
        doc = "\n\n".join(
            " ".join(p.split()) for p in (inspect.getdoc(import_cmd) or "").split("\n\n")
        )
        self.help = f"{doc}\n\nFormats (xpuprof formats):\n\n{listed}"
        super().format_help(ctx, formatter)


@_documented("import", cls=_FormatsHelp)
def import_cmd(
    paths: list[Path] = typer.Argument(
        ...,
        help="Trace files or directories of them (formats below; xpuprof formats), or stores "
        "to merge into one (per-rank captures of one job).",
    ),
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
    force: bool = typer.Option(
        False, "--force", help="Re-import even unchanged files (re-merge unchanged stores)."
    ),
    mixed: bool = typer.Option(
        False,
        "--mixed",
        help="Keep traces of different jobs (world sizes, process groups) in one store; "
        "merging: also stores holding the same rank.",
    ),
    wait: float = typer.Option(
        60.0, "--wait", help="Seconds to wait while another xpuprof process writes the store."
    ),
    as_json: bool = _JSON,
) -> None:
    """Import trace files (PyTorch profiler, XProf XPlane, plug-in formats) into a store.

    Given stores instead (xpuprof import rank0.store rank1.store -o job.store), merge them into
    one: each input's parts become parts of the output, numbered by rank when all ranks are
    distinct, else in order; refused when they hold ranks of different jobs or one rank twice
    (unless --mixed). Stores and trace files are not imported in one run."""
    from xpuprof.trace.ingest import import_size, import_traces

    try:
        total = import_size(list(paths))
        bar = not as_json and total >= PROGRESS_MIN_BYTES
        with render.progress_bar(total, err) if bar else contextlib.nullcontext() as progress:
            report = import_traces(list(paths), store, lenient=lenient, scheduler=scheduler,
                                   workers=workers, force=force, progress=progress,
                                   lock_wait=max(0.0, wait), mixed=mixed)  # fmt: skip
    except XpuprofError as e:
        _fail(e)
    if as_json:
        render.print_json(report.to_dict())
    else:
        render.result(tools.import_result(report), out)


@_documented()
def sql(
    store: Path = typer.Argument(
        ..., help="Store directory (or a trace file, imported on the fly)."
    ),
    query: str = typer.Argument(
        ..., help="SQL over tables events, flows, links, counters, metadata."
    ),
    limit: int = typer.Option(50, "--limit", help="Rows to print (all rows with --json)."),
    as_json: bool = _JSON,
) -> None:
    """Run a DuckDB SQL query over a store.

    The query runs with your own full access to this machine, as your shell does: DuckDB can
    read and write any file you can, ATTACH databases, install extensions and run several
    statements. That is right for a tool you run yourself; a server that reads stores for
    others (the web UI) uses a restricted Trace instead, whose DuckDB reads nothing but the
    store's own files and runs one SELECT per query."""
    from xpuprof.trace.trace import load

    try:
        with load(store) as trace:
            df = trace.sql(query)
    except XpuprofError as e:
        _fail(e)
    if as_json:
        sys.stdout.write(df.to_json(orient="records", date_format="iso") + "\n")
    elif df.empty:
        out.print(f"(no rows; columns: {escape(', '.join(map(str, df.columns)))})")
    else:
        render.result(Result(tables={"": df}), out, limit, wide=_WIDE["on"])


@_documented()
def export(
    store: Path = typer.Argument(..., help="Store directory."),
    output: str = typer.Option(
        ...,
        "-o",
        "--output",
        help="Output file (.json or .json.gz), or a directory (existing, or ending in /) "
        "for one file per rank.",
    ),
    fmt: str = typer.Option(
        "chrome",
        "--format",
        help="Output format: chrome, or chakra (one Chakra ET file per rank in the -o "
        "directory, from the replay graph; docs/chakra.md).",
    ),
    overlay: str = typer.Option(
        None,
        "--overlay",
        help="Also mark what xpuprof found: critical-path, findings, or both "
        "(critical-path,findings), as flow arrows and marker spans (docs/export.md).",
    ),
    as_json: bool = _JSON,
) -> None:
    """Write a store back out as a Chrome trace (opens in Perfetto and chrome://tracing), or
    its replay graph as Chakra execution traces (--format chakra)."""
    if fmt not in ("chrome", "chakra"):
        _fail(XpuprofError(f"unknown export format {fmt!r}; formats: chrome, chakra"))
    if fmt == "chakra":
        _export_chakra(store, output, overlay, as_json)
        return
    from xpuprof.export.chrome import export_chrome, parse_overlays
    from xpuprof.trace.trace import Trace

    try:
        overlays = parse_overlays(overlay)
        with Trace(store) as trace:
            summary = export_chrome(trace, output, overlays=overlays)
    except XpuprofError as e:
        _fail(e)
    if as_json:
        render.print_json(summary)
        return
    out.print(
        f"wrote {summary['events']:,} trace entries from {summary['sources']} source(s) "
        f"to {escape(str(summary['path']))} ({render.human_bytes(summary['bytes'])})"
    )
    for name, n in (summary.get("overlays") or {}).items():
        out.print(f"  with the {name.replace('_', ' ')} overlay: {n:,} marked event(s)")


def _export_chakra(store: Path, output: str, overlay: str | None, as_json: bool) -> None:
    """``export --format chakra``: replay the store, write one .et file per rank."""
    from xpuprof.export.chakra import export_chakra
    from xpuprof.trace.trace import Trace

    try:
        if overlay:
            raise XpuprofError("--overlay applies to --format chrome only")
        with Trace(store) as trace:
            paths = export_chakra(trace, output)
    except XpuprofError as e:
        _fail(e)
    if as_json:
        render.print_json({"path": output, "files": [str(p) for p in paths]})
        return
    out.print(f"wrote {len(paths)} Chakra ET file(s) to {escape(output)}")


@_documented()
def report(
    store: Path = typer.Argument(..., help="The " + "store directory (or a trace file)."),
    output: Path = typer.Option(..., "-o", "--output", help="The HTML file to write."),
    ranks: str = typer.Option(None, "--rank", help=tools.COMMON["ranks"].help),
    steps: str = typer.Option(None, "--steps", help=tools.COMMON["steps"].help),
    predict: bool = typer.Option(
        False,
        "--predict",
        help="Replay each recommendation's change and show its predicted gain (docs/advise.md).",
    ),
    as_json: bool = _JSON,
) -> None:
    """Write one self-contained HTML report (overview, findings, charts, tables; works
    offline: Plotly's JavaScript is inside the file)."""
    from xpuprof.trace.trace import load

    try:
        with load(store) as trace:
            answer = tools.write_report(trace, output, ranks=ranks, steps=steps, predict=predict)
    except XpuprofError as e:
        _fail(e)
    if as_json:
        render.print_json(answer)
    else:
        out.print(
            f"wrote the report {escape(str(answer['path']))} "
            f"({render.human_bytes(answer['bytes'])})",
            highlight=False,
            soft_wrap=True,
        )


@_documented("ui")
def web_ui(
    store: Path = typer.Argument(
        ..., help="A store directory, or a directory whose folders are stores."
    ),
    port: int = typer.Option(8765, "--port", help="Port to listen on (0: any free port)."),
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        help="Address to listen on. Any address other than loopback needs --token.",
    ),
    token: str = typer.Option(
        None,
        "--token",
        envvar="XPUPROF_UI_TOKEN",
        help="Secret every request must carry (or XPUPROF_UI_TOKEN).",
    ),
) -> None:
    """Serve the web UI: overview, trace viewer, every tool as a page with charts (read-only;
    127.0.0.1 unless --host and --token say otherwise)."""
    try:
        tools.serve_ui(store, host=host, port=port, token=token)
    except XpuprofError as e:
        _fail(e)


#: A duration: a decimal number and an optional unit (no exponents, nan or inf).
_DURATION = re.compile(r"(?P<n>[+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<unit>ms|s|m|min)?")
_UNITS = {"ms": 1e-3, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0}


def _seconds(text: str) -> float:
    """``2s``, ``500ms``, ``1.5``, ``1m`` → seconds: finite and more than 0, or an error
    naming the text (``nan``, ``inf``, ``-1`` and ``1e3`` are not durations)."""
    m = _DURATION.fullmatch(text.strip().lower())
    seconds = float(m["n"]) * _UNITS[m["unit"]] if m else math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise XpuprofError(f"--duration {text!r}: not a finite number of seconds > 0 "
                           "(e.g. 2s, 500ms)")  # fmt: skip
    return seconds


@_documented()
def capture(
    url: str = typer.Argument(..., help="The job's capture server, e.g. http://127.0.0.1:8471"),
    store: Path = typer.Option(..., "-o", "--output", help="Store directory to write."),
    duration: str = typer.Option("2s", "--duration", help="How long to capture (2s, 500ms)."),
    token: str = typer.Option(
        None, "--token", envvar="XPUPROF_TOKEN", help="The job's token (or XPUPROF_TOKEN)."
    ),
    level: str = typer.Option(None, "--level", help="Capture level (default: the server's)."),
    as_json: bool = _JSON,
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
    show("info", [store], {}, as_json)


@_documented(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    options_metavar="[OPTIONS] -- COMMAND [ARGS]...",
)
def leveled(
    ctx: typer.Context,
    output: Path = typer.Option(
        None,
        "-o",
        "--out",
        help="Folder for the level stores, merged.store and leveled.json "
        "(default: a new temporary folder; an earlier leveled folder is replaced).",
    ),
    levels: str = typer.Option(
        "model,layer,op,kernel",
        "--levels",
        help="Levels to measure, shallowest first (kernel needs a GPU).",
    ),
    target: str = typer.Option(
        "2",
        "--target",
        help="Rerun a level while the 95 % interval of its median step is wider than ± this %.",
    ),
    max_runs: int = typer.Option(3, "--max-runs", help="Most runs of the script per level."),
    settle: int = typer.Option(1, "--settle", help="Steps of each run not counted."),
    timeout: str = typer.Option(None, "--timeout", help="Stop a run after this (e.g. 10m)."),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Measure a script level by level (model; + layers; + ops; + kernels), each level in its
    own run, and merge the runs: xpuprof leveled -- python train.py ARGS. The script runs its
    steps inside xpuprof.profile(model=net) and marks them with xpuprof.step(i);
    XPUPROF_LEVEL and XPUPROF_OUT tell it which level to record where (docs/leveled.md)."""
    try:
        seconds = _seconds(timeout) if timeout else None

        def progress(level: str, steps: int, median_ns: float, width: float) -> None:
            if not as_json:
                err.print(f"{level}: {steps} steps, median {median_ns / 1e6:.3f} ms, "
                          f"±{100 * width:.1f} %", highlight=False)  # fmt: skip

        answer = tools.leveled(list(ctx.args), levels=levels, out=output, target=target,
                               max_runs=max_runs, settle=settle, timeout=seconds,
                               progress=progress)  # fmt: skip
    except XpuprofError as e:
        _fail(e)
    if as_json:
        render.print_json(answer.to_dict())
    else:
        render.result(answer, out, limit, "--limit N or --json for all", wide=_WIDE["on"])


@_documented()
def sweep(
    output: Path = typer.Option(
        ...,
        "-o",
        "--out",
        help="Folder for every configuration's "
        "stores, summary.parquet, sweep.json and report.html.",
    ),
    models: str = typer.Option(
        None,
        "--models",
        help="Comma-separated: built-ins (mlp, "
        "resnet, encoder, gpt, lstm, recommender; default: all) or "
        "torchvision:NAME, timm:NAME, hf:NAME.",
    ),
    batches: str = typer.Option("4,8,16", "--batch", help="Batch sizes, e.g. 4,8,16 or 1-4."),
    dtypes: str = typer.Option("fp32", "--dtype", help="fp32, bf16, fp16 (comma-separated)."),
    levels: str = typer.Option(
        "model,layer,op,kernel", "--levels", help="Levels to measure (kernel needs a GPU)."
    ),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    target: str = typer.Option(
        "2",
        "--target",
        help="Stop a level once the 95 % interval of its median step is within ± this %.",
    ),
    max_steps: int = typer.Option(40, "--max-steps", help="Most measured steps per level."),
    threads: int = typer.Option(
        None, "--threads", help="torch.set_num_threads (default: torch's)."
    ),
    timeout: str = typer.Option("10m", "--timeout", help="Stop a configuration after this."),
    report_path: Path = typer.Option(
        None, "--report", help="The HTML report to write (default: report.html in --out)."
    ),
    as_json: bool = _JSON,
    limit: int = _LIMIT,
) -> None:
    """Measure models × batch sizes × dtypes, each level by level in its own process, and
    write the summary table and an HTML report (latency, throughput, layer types, top ops,
    roofline, memory, findings per model)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    try:
        seconds = _seconds(timeout) if timeout else None
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn(
                "{task.completed}/{task.total}"), TimeElapsedColumn(), console=err,
                disable=as_json, transient=True) as bar:  # fmt: skip
            task = bar.add_task("sweep", total=None)

            def progress(done: int, total: int, row: dict[str, Any]) -> None:
                what = f"{row['model']} b{row['batch']} {row['dtype']}: {row['status']}"
                bar.update(task, completed=done, total=total, description=escape(what))

            answer = tools.sweep(models, batches, dtypes, out=output, levels=levels,
                                 target=target, max_steps=max_steps, timeout=seconds,
                                 threads=threads, device=device, report=report_path,
                                 progress=progress)  # fmt: skip
    except XpuprofError as e:
        _fail(e)
    if as_json:
        render.print_json(answer.to_dict())
        return
    render.result(tools.sweep_summary(answer), out, limit, "--limit N or --json for all",
                  wide=_WIDE["on"])  # fmt: skip
    out.print(f"The report is {escape(str(answer.facts['report']))}; the tables are in "
              f"{escape(str(output))}/sweep.json and summary.parquet", highlight=False,
              soft_wrap=True)  # fmt: skip


#: The file that marks a store as the demo's own, which a later demo run may replace.
DEMO_MARK = ".xpuprof-demo"


def demo_store() -> Path:
    """Where the demo writes its store by default: ``demo.store`` in xpuprof's folder of the
    user cache directory (``$XDG_CACHE_HOME/xpuprof``, else ``~/.cache/xpuprof``), so that a
    demo run leaves nothing in the folder it was started from."""
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(cache) if cache else Path.home() / ".cache") / "xpuprof" / "demo.store"


@_documented()
def demo(
    store: Path = typer.Option(
        None,
        "--out",
        "-o",
        "--output",
        help="Store directory to write (default: demo.store in the user cache directory, "
        "$XDG_CACHE_HOME/xpuprof or ~/.cache/xpuprof); a store the demo wrote before is "
        "replaced, anything else is left alone.",
    ),
    steps: int = typer.Option(5, "--steps", help="Training steps to record."),
    level: str = typer.Option("op", "--level", help="Capture level: step, layer, op, full."),
    report_path: Path = typer.Option(
        None,
        "--report",
        help="The HTML report to write (default: beside the store, demo-report.html).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the store's info as JSON."),
) -> None:
    """Profile a small built-in transformer training on the CPU, and print its summary.

    Trains under xpuprof.profile, writes the store (--out) and prints what xpuprof summary
    prints: what the store holds, the overview, top ops, slowest layers and recommendations;
    then writes the HTML report beside it (--report) and says where both are. Without torch,
    imports the real trace shipped with xpuprof instead."""
    store = store or demo_store()
    try:
        _record_demo(store, steps, level, as_json)
    except XpuprofError as e:
        _fail(e)
    more = f"xpuprof summary {store} --limit N for more"
    show("info" if as_json else "summary", [store], {}, as_json, limit=8, more=more)
    page = report_path or demo_report(store)
    try:
        from xpuprof.trace.trace import Trace

        with Trace(store) as trace:
            written = tools.write_report(trace, page)
    except XpuprofError as e:
        _fail(e)
    if not as_json:
        out.print(
            f"The store is {escape(str(store))}: run any xpuprof command on it, e.g. "
            f"xpuprof overview {escape(str(store))}, or browse it with xpuprof ui "
            f"{escape(str(store))}",
            highlight=False,
            soft_wrap=True,
        )
        out.print(f"The report is {escape(str(written['path']))} (open it in a browser; "
                  "it works offline)", highlight=False, soft_wrap=True)  # fmt: skip


def demo_report(store: Path) -> Path:
    """Where the demo writes its report: beside the store, ``demo.store`` →
    ``demo-report.html``."""
    stem = store.name[: -len(".store")] if store.name.endswith(".store") else store.name
    return store.with_name(f"{stem}-report.html")


def _record_demo(store: Path, steps: int, level: str, quiet: bool) -> None:
    import shutil

    from xpuprof.trace.ingest import import_traces
    from xpuprof.trace.store import is_store

    if store.exists():
        if not is_store(store) or not (store / DEMO_MARK).is_file():
            raise XpuprofError(f"{store}: exists and is not a store xpuprof demo wrote; not "
                               "replacing it (choose another --out)")  # fmt: skip
        shutil.rmtree(store)  # the demo's own store from an earlier run
    store.parent.mkdir(parents=True, exist_ok=True)
    # torch's C++ warnings (at level full: "Memory block of unknown size was allocated before
    # the profiling started") go to stderr unless this is set before torch is imported; in
    # the demo's own process they are about xpuprof's recording, not the user's code
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        import torch  # noqa: F401
    except ImportError:
        from importlib.resources import files

        err.print(
            "torch is not installed (pip install 'xpuprof[torch]'): importing the example "
            "trace shipped with xpuprof instead"
        )
        example = files("xpuprof") / "data" / "example_cpu_train.pt.trace.json.gz"
        import_traces([Path(str(example))], store)
        (store / DEMO_MARK).write_text("written by xpuprof demo\n")
        return
    from xpuprof.live.profile import profile, step
    from xpuprof.workloads.demo import Trainer

    trainer = Trainer()
    trainer.step()  # the first step allocates and warms up: not what a user measures
    if not quiet:
        err.print(
            f"training the demo transformer for {steps} steps at level {level!r} into "
            f"{escape(str(store))}…",
            highlight=False,
            soft_wrap=True,
        )
    with profile(store, level=level, model=trainer.model):
        for i in range(steps):
            step(i)
            trainer.step()
    (store / DEMO_MARK).write_text("written by xpuprof demo\n")


# ----------------------------------------------------------------------------------------------
# the tools: one command per entry of xpuprof.ui.tools.TOOLS
# ----------------------------------------------------------------------------------------------


def show(
    name: str,
    stores: list[Path],
    options: dict[str, Any],
    as_json: bool,
    limit: int = 20,
    more: str = "--limit N or --json for all",
) -> None:
    """Run tool ``name`` on the stores (or trace files, imported on the fly) and print its
    Result (or its JSON document); errors exit with code 2 and one line, and so does an
    answer that reports problems (``info --check``), after printing them."""
    from xpuprof.trace.trace import load

    try:
        answer = tools.check_first(name, stores, options, as_json)
        if answer is None:
            with contextlib.ExitStack() as stack:
                traces = [stack.enter_context(load(s)) for s in stores]
                if as_json:
                    answer = tools.document(name, *traces, **options)
                else:
                    answer = tools.run(name, *traces, **options)
    except XpuprofError as e:
        _fail(e)
    if as_json:
        render.print_json(answer)
    else:
        render.result(answer, out, limit, more, wide=_WIDE["on"])
    if tools.problems(answer):
        raise typer.Exit(EXIT_ERROR)


_STORE = "store directory (or a trace file, imported on the fly)."
#: The arguments of a tool that takes 0, 1 or 2 traces: (name, help).
_INPUTS = {
    0: (),
    1: (("store", "The " + _STORE),),
    2: (("baseline", "The baseline " + _STORE), ("new", "The new " + _STORE)),
}


def _parameter(option: tools.Option) -> inspect.Parameter:
    typ = option.type if option.default is not None else option.type | None
    flags = (option.cli_flag, option.short) if option.short else (option.cli_flag,)
    default = typer.Option(option.default, *flags, help=option.help)
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=typ)  # fmt: skip


def _command(tool: tools.Tool) -> Any:
    """A Typer command for ``tool``: its inputs as arguments, its options, --json, --limit."""
    inputs = _INPUTS[tool.inputs]
    params = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=Path,
                                default=typer.Argument(..., help=h))
              for n, h in inputs]  # fmt: skip
    params += [_parameter(tools.COMMON[c]) for c in tool.common]
    params += [_parameter(o) for o in tool.options]
    params.append(inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=_JSON,
                                    annotation=bool))  # fmt: skip
    if tool.inputs:  # the tools without a trace print short tables whole
        params.append(inspect.Parameter("limit", inspect.Parameter.KEYWORD_ONLY,
                                        default=_LIMIT, annotation=int))  # fmt: skip

    def command(**kw: Any) -> None:
        stores = [kw.pop(n) for n, _ in inputs]
        as_json, limit = kw.pop("as_json"), kw.pop("limit", 20)
        show(tool.name, stores, kw, as_json, limit)

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__ = tool.name.replace("-", "_")
    command.__doc__ = tool.help
    return command


for _tool in tools.TOOLS:
    app.command(_tool.name, help=_tool.help)(_command(_tool))


#: Options of every command, accepted anywhere on the line.
GLOBAL_FLAGS = ("--debug", "--wide")


def _global_flags(args: list[str]) -> tuple[list[str], set[str]]:
    """``--debug`` and ``--wide`` anywhere on the line (before a ``--``) moved to the front,
    where global options are parsed, so that ``xpuprof overview s --wide`` works too; the
    flags found."""
    end = args.index("--") if "--" in args else len(args)
    found = {f for f in GLOBAL_FLAGS if f in args[:end]}
    rest = [a for i, a in enumerate(args) if i >= end or a not in GLOBAL_FLAGS]
    return [f for f in GLOBAL_FLAGS if f in found] + rest, found


def _quiet_stdout() -> None:
    """The reader of stdout is gone (``| head``): send what is still buffered nowhere, so
    that Python's exit does not report the broken pipe again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _unexpected(e: BaseException) -> int:
    """One line for an exception no command expected, and the hint; the exit code."""
    if isinstance(e, OSError) and e.errno is not None and e.strerror:
        # the machine said no (disk full, permission denied): the user can act on it
        _error_line(f"{e.filename}: {e.strerror}" if e.filename else e.strerror)
        return EXIT_ERROR
    text = " ".join(str(e).split())
    text = text if len(text) <= 300 else text[:299] + "…"
    kind = "out of memory" if isinstance(e, MemoryError) else type(e).__name__
    _error_line(f"unexpected {kind}" + (f": {text}" if text else ""))
    if not _DEBUG["on"]:
        err.print(f"  {BUG_HINT}", highlight=False, soft_wrap=True)
    return EXIT_BUG


def main(argv: list[str] | None = None) -> None:
    """The ``xpuprof`` command: never a traceback unless asked for (``--debug``)."""
    # Arrow's default allocator (mimalloc) keeps freed memory for reuse: importing a 2 GB trace
    # peaked at 4.5 GB with it and at 3.5 GB with the system allocator, which was also no
    # slower on the import benchmark. Set before pyarrow is first imported; a user's own
    # choice of pool wins.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    args, flags = _global_flags(list(sys.argv[1:] if argv is None else argv))
    _DEBUG["on"] = "--debug" in flags or _debug_env()
    _WIDE["on"] = "--wide" in flags
    code = 0
    try:
        try:
            app(args=args, prog_name="xpuprof")
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not at exit
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else EXIT_ERROR
        if isinstance(e.code, str):  # sys.exit("message"): a message, one line
            _error_line(e.code)
        if code == EXIT_INTERRUPTED:  # Typer's answer to Ctrl-C inside a command: silent
            err.print("interrupted", highlight=False)
    except KeyboardInterrupt:
        err.print("interrupted", highlight=False)
        code = EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        code = EXIT_BUG
    except Exception as e:
        if _DEBUG["on"]:
            import traceback

            traceback.print_exc()
        if isinstance(e, XpuprofError):  # raised outside a command's own handler
            _error_line(str(e))
            code = EXIT_ERROR
        else:
            code = _unexpected(e)
    if argv is None:
        # The process ends here. Its last garbage collection walks every object the command
        # made and every module imported (0.3 s after an import on Dask): nothing is left to
        # collect that matters, so spare it. Exit handlers and finalizers still run.
        import gc

        gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    main()

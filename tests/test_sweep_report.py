"""The sweep's HTML report (``xpuprof.ui.sweep_report``): a Result built by hand (2 models × 2
batch sizes, one configuration failed), written to a file; the charts' JSON read back from the
page and compared with the numbers written into the Result (each chart holds exactly the
points of the configurations that ran, in batch order), the failed configuration marked with
its error, every string escaped, empty tables left out with a note, the roof only with both
peaks, the file written atomically; then, with Debian's chromium, every chart drawn by Plotly
with no console error and the XSS model name shown as text.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from browser import browser, open_page  # noqa: F401  (pytest fixtures: chromium)

from xpuprof.core.errors import XpuprofError
from xpuprof.core.result import Result
from xpuprof.ui import report
from xpuprof.ui.sweep_report import sweep_report_html, write_sweep_report

EVIL = '<script>alert("sweep")</script>'
CHART_IDS = ["latency", "throughput", "layer-shares", "roofline", "memory", "overhead"]


def config(model: str, batch: int, step_ms: float | None, **kw: Any) -> dict[str, Any]:
    """One summary row; throughput from the step time (batch / step), the rest given."""
    ok = step_ms is not None
    rss = kw.pop("rss", None)  # MiB
    row = {"model": model, "batch": batch, "dtype": "float32",
           "status": "ok" if ok else "failed", "error": None if ok else kw.pop("error"),
           "step_ms": step_ms, "ci_pct": kw.pop("ci", None),
           "samples_per_s": batch / step_ms * 1000 if ok else None,
           "overhead_layer_pct": kw.pop("layer", None), "overhead_op_pct": kw.pop("op", None),
           "overhead_kernel_pct": None, "layer_sum_ms": kw.pop("layer_sum", None),
           "params": kw.pop("params"),
           "peak_rss_bytes": None if rss is None else rss * 2**20,
           "work_flops": kw.pop("flops", None), "traffic_bytes": kw.pop("bytes", None),
           "folder": f"{model}-b{batch}"}  # fmt: skip
    f, b = row["work_flops"], row["traffic_bytes"]
    row["intensity"] = f / b if f and b else None
    row["achieved_gflops"] = f / (step_ms * 1e-3) / 1e9 if f and ok else None
    assert not kw, kw
    return row


def sweep(mlp: str = "mlp", peaks: tuple[float | None, float | None] = (200.0, 20.0),
          kernels: bool = False) -> Result:  # fmt: skip
    """2 models × batch 1 and 4; cnn at batch 4 failed. Every number is written here."""
    summary = pd.DataFrame([
        config(mlp, 1, 2.0, ci=1.5, layer=4.0, op=30.0, layer_sum=1.8, params=1000, rss=310.0,
               flops=4e6, bytes=2e6),
        config("cnn", 4, None, error="RuntimeError: out of <memory>", params=5000),
        config(mlp, 4, 5.0, ci=2.0, layer=3.0, op=25.0, layer_sum=4.6, params=1000, rss=330.0,
               flops=16e6, bytes=4e6),
        config("cnn", 1, 8.0, ci=1.0, layer=6.0, op=None, layer_sum=7.5, params=5000,
               rss=400.0, flops=1.6e8, bytes=1e7),
    ])  # fmt: skip
    layer_types = pd.DataFrame([
        (mlp, 1, "float32", "Linear", 1.5, 75.0), (mlp, 1, "float32", "ReLU", 0.3, 15.0),
        (mlp, 4, "float32", "Linear", 4.0, 80.0), (mlp, 4, "float32", "ReLU", 0.6, 12.0),
        ("cnn", 1, "float32", "Conv2d", 6.0, 75.0), ("cnn", 1, "float32", "Linear", 1.5, 18.75),
        ("cnn", 4, "float32", "Conv2d", 9.0, 50.0),  # the failed configuration: not drawn
    ], columns=["model", "batch", "dtype", "type", "ms", "share_pct"])  # fmt: skip
    top_ops = pd.DataFrame([
        (mlp, 1, "float32", "aten::addmm", 1.2, 2, 60.0),
        (mlp, 4, "float32", "aten::addmm", 3.5, 2, 70.0),
        ("cnn", 1, "float32", "aten::conv2d", 5.5, 3, 68.75),
    ], columns=["model", "batch", "dtype", "op", "ms", "calls", "share_pct"])  # fmt: skip
    top_kernels = pd.DataFrame(
        [(mlp, 1, "float32", "sgemm_128x64", 0.9, 2, 45.0)] if kernels else [],
        columns=["model", "batch", "dtype", "kernel", "ms", "calls", "share_pct"],
    )
    findings = pd.DataFrame([
        (mlp, 1, "float32", "the host launches more than the device computes",
         "raise the batch size"),
    ], columns=["model", "batch", "dtype", "finding", "recommendation"])  # fmt: skip
    return Result(
        tables={"summary": summary, "layer_types": layer_types, "top_ops": top_ops,
                "top_kernels": top_kernels, "findings": findings},
        facts={"headline": f"{mlp} at batch 4 is 2.5x slower per step but 1.6x faster per "
               "sample", "device": "CPU: test machine (2 threads)", "peak_gflops": peaks[0],
               "peak_gb_per_s": peaks[1], "levels": "model,layer,op"},
    )  # fmt: skip


class Page(HTMLParser):
    """The page's tables (heading, headers, rows with their class and cells), chart divs,
    notes (``p.aside``) and the figures' JSON."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[dict[str, Any]] = []
        self.charts: list[str] = []
        self.asides: list[str] = []
        self.figures: dict[str, Any] = {}
        self._h4 = ""
        self._text: list[str] | None = None
        self._what = ""
        self._row: dict[str, Any] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "div" and a.get("class") == "chart":
            self.charts.append(str(a["id"]))
        if tag == "table":
            self.tables.append({"title": self._h4, "headers": [], "rows": []})
        if tag == "tr" and self.tables:
            self._row = {"class": a.get("class"), "cells": []}
        if tag in ("h4", "th", "td") or (tag == "p" and a.get("class") == "aside"):
            self._text, self._what = [], tag
        if tag == "script" and a.get("type") == "application/json":
            self._text, self._what = [], "json"

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if self._text is not None and tag in ("h4", "th", "td", "p", "script"):
            text, self._text = "".join(self._text), None
            if self._what == "h4":
                self._h4 = text
            elif self._what == "th":
                self.tables[-1]["headers"].append(text)
            elif self._what == "td" and self._row is not None:
                self._row["cells"].append(text)
            elif self._what == "p":
                self.asides.append(text)
            elif self._what == "json":
                self.figures = {f["id"]: f for f in json.loads(text)}
        if tag == "tr" and self._row is not None:
            if self._row["cells"]:
                self.tables[-1]["rows"].append(self._row)
            self._row = None

    def table(self, title: str) -> dict[str, Any]:
        found = [t for t in self.tables if t["title"].startswith(title)]
        assert len(found) == 1, (title, [t["title"] for t in self.tables])
        return found[0]


@pytest.fixture
def written(tmp_path: Path) -> tuple[Path, dict[str, Any], Page]:
    out = tmp_path / "sweep.html"
    answer = write_sweep_report(sweep(), out)
    return out, answer, Page(out.read_text("utf-8"))


def traces(page: Page, fid: str) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in page.figures[fid]["data"]}


def test_each_chart_holds_exactly_the_points_of_the_configurations_that_ran(written):
    _, answer, page = written
    assert answer["charts"] == CHART_IDS and page.charts == [f"fig-{c}" for c in CHART_IDS]
    lat = traces(page, "latency")
    assert set(lat) == {"mlp float32", "cnn float32"}
    assert lat["mlp float32"]["x"] == [1, 4] and lat["mlp float32"]["y"] == [2.0, 5.0]
    assert lat["cnn float32"]["x"] == [1] and lat["cnn float32"]["y"] == [8.0]  # b4 failed
    # error bars: ± 1.5 % of 2 ms, ± 2 % of 5 ms
    assert lat["mlp float32"]["error_y"]["array"] == pytest.approx([0.03, 0.1])
    thr = traces(page, "throughput")
    assert thr["mlp float32"]["y"] == pytest.approx([500.0, 800.0])  # 1/2 ms, 4/5 ms
    assert thr["cnn float32"]["y"] == pytest.approx([125.0])
    mem = traces(page, "memory")
    assert mem["mlp float32"]["y"] == [310.0, 330.0] and mem["cnn float32"]["y"] == [400.0]
    # layer types: one bar per configuration that ran, types by total share (Linear first)
    share = page.figures["layer-shares"]["data"]
    assert [t["name"] for t in share] == ["Linear", "Conv2d", "ReLU"]
    configs = ["mlp · float32 · batch 1", "mlp · float32 · batch 4", "cnn · float32 · batch 1"]
    assert all(t["y"] == configs and t["orientation"] == "h" for t in share)
    assert share[0]["x"] == [75.0, 80.0, 18.75] and share[0]["customdata"] == [1.5, 4.0, 1.5]
    assert share[1]["x"] == [None, None, 75.0] and share[2]["x"] == [15.0, 12.0, None]
    assert page.figures["layer-shares"]["layout"]["barmode"] == "stack"
    # overhead: one bar per level measured; the kernel level never was
    over = traces(page, "overhead")
    assert set(over) == {"+ layer", "+ op"}
    assert over["+ layer"]["x"] == configs and over["+ layer"]["y"] == [4.0, 3.0, 6.0]
    assert over["+ op"]["y"] == [30.0, 25.0, None]


def test_the_roofline_points_and_roof(written):
    _, _, page = written
    roof = traces(page, "roofline")
    # intensity = FLOPs / bytes, achieved = FLOPs / step: by hand from the numbers above
    assert roof["mlp float32"]["x"] == [2.0, 4.0]
    assert roof["mlp float32"]["y"] == pytest.approx([2.0, 3.2])  # 4 MFLOP / 2 ms, 16 / 5
    assert roof["mlp float32"]["text"] == ["b1", "b4"]
    assert roof["cnn float32"]["x"] == [16.0] and roof["cnn float32"]["y"] == pytest.approx([20.0])
    line = roof["roof"]
    assert 10.0 in line["x"]  # the ridge: 200 GFLOP/s / 20 GB/s
    for x, y in zip(line["x"], line["y"], strict=True):
        assert y == pytest.approx(min(200.0, 20.0 * x))
    assert min(line["x"]) < 2.0 and max(line["x"]) > 16.0
    layout = page.figures["roofline"]["layout"]
    assert layout["xaxis"]["type"] == "log" and layout["yaxis"]["type"] == "log"


def test_more_layer_types_than_drawn_are_summed_into_one_segment():
    res = sweep()
    # 12 types for mlp at batch 1: type i takes (13 - i) % of the step (12 %, 11 %, ..., 1 %)
    res.tables["layer_types"] = pd.DataFrame(
        [("mlp", 1, "float32", f"Type{i}", 0.1 * i, 13.0 - i) for i in range(1, 13)],
        columns=["model", "batch", "dtype", "type", "ms", "share_pct"],
    )
    page = Page(sweep_report_html(res))
    share = {t["name"]: t for t in page.figures["layer-shares"]["data"]}
    assert list(share) == [f"Type{i}" for i in range(1, 11)] + ["other types"]
    assert share["other types"]["x"] == [2.0 + 1.0]  # Type11 and Type12
    assert share["other types"]["customdata"] == pytest.approx([1.1 + 1.2])
    assert share["Type1"]["y"] == ["mlp · float32 · batch 1"]


@pytest.mark.parametrize("peaks", [(None, None), (200.0, None), (None, 20.0)])
def test_no_roof_without_both_peaks(tmp_path, peaks):
    out = tmp_path / "s.html"
    write_sweep_report(sweep(peaks=peaks), out)
    page = Page(out.read_text("utf-8"))
    assert set(traces(page, "roofline")) == {"mlp float32", "cnn float32"}
    assert "no roof" in out.read_text("utf-8")


def test_units_in_every_numeric_header_and_axis(written):
    _, _, page = written
    conf = page.table("Configurations")
    text_cols = {"model", "dtype", "status", "error"}
    for h in conf["headers"]:
        assert h in text_cols or re.search(r"\(.+\)$", h), h
    # the kernel overhead column is empty in every row: left out, and named
    assert "overhead + kernel (%)" not in conf["headers"]
    assert any("overhead + kernel (%)" in a for a in page.asides)
    for f in page.figures.values():
        for ax in ("xaxis", "yaxis"):
            title = f["layout"][ax]["title"]["text"]
            assert re.search(r"\(.+\)$", title) or title == "configuration", (f["id"], title)


def test_the_failed_configuration_is_marked_with_its_error(written):
    _, _, page = written
    conf = page.table("Configurations")
    h = conf["headers"]
    rows = [dict(zip(h, r["cells"], strict=True)) | {"class": r["class"]} for r in conf["rows"]]
    assert [(r["model"], r["batch (samples)"]) for r in rows] == [
        ("mlp", "1"), ("mlp", "4"), ("cnn", "1"), ("cnn", "4")]  # fmt: skip
    failed = [r for r in rows if r["class"] == "failed"]
    assert len(failed) == 1 and failed[0]["model"] == "cnn" and failed[0]["batch (samples)"] == "4"
    assert failed[0]["status"] == "failed" and failed[0]["error"] == "RuntimeError: out of <memory>"
    assert rows[1]["step, median (ms)"] == "5.000" and rows[1]["throughput (samples/s)"] == "800.0"


def test_strings_from_the_data_are_escaped(tmp_path):
    out = tmp_path / "evil.html"
    write_sweep_report(sweep(mlp=EVIL), out)
    text = out.read_text("utf-8")
    assert EVIL not in text and "<script>alert(" not in text
    assert "&lt;script&gt;alert(&quot;sweep&quot;)&lt;/script&gt;" in text  # the HTML
    assert "out of &lt;memory&gt;" in text and "out of <memory>" not in text
    blob = re.search(r'id="xpuprof-figures">(.*?)</script>', text, re.S)
    assert blob and "<" not in blob.group(1) and ">" not in blob.group(1)
    page = Page(text)
    names = {t["name"] for t in page.figures["latency"]["data"]}
    assert '&lt;script&gt;alert("sweep")&lt;/script&gt; float32' in names  # Plotly text
    assert any(c == EVIL for t in page.tables for r in t["rows"] for c in r["cells"])


def test_empty_tables_leave_a_note_not_a_table(written, tmp_path):
    _, _, page = written
    assert not [t for t in page.tables if t["title"].startswith("Top kernels")]
    assert sum("Top kernels: no kernels recorded" in a for a in page.asides) == 2  # each model
    ops = [t for t in page.tables if t["title"].startswith("Top ops")]
    assert [[r["cells"][2] for r in t["rows"]] for t in ops] == [
        ["aten::addmm", "aten::addmm"], ["aten::conv2d"]]  # fmt: skip
    # with kernels: a table for mlp, a note for cnn
    out = tmp_path / "k.html"
    write_sweep_report(sweep(kernels=True), out)
    page = Page(out.read_text("utf-8"))
    kern = [t for t in page.tables if t["title"].startswith("Top kernels")]
    assert len(kern) == 1 and kern[0]["rows"][0]["cells"][2] == "sgemm_128x64"
    assert "time per step (ms)" in kern[0]["headers"]


def test_an_empty_sweep_has_notes_and_no_chart_or_table(tmp_path):
    out = tmp_path / "empty.html"
    answer = write_sweep_report(Result(tables={"summary": pd.DataFrame()}), out)
    page = Page(out.read_text("utf-8"))
    assert answer["charts"] == [] and set(answer["left_out"]) == set(CHART_IDS)
    assert page.charts == [] and page.tables == [] and page.figures == {}
    assert sum(a.startswith("No chart:") for a in page.asides) == len(CHART_IDS)
    assert "No configurations" in " ".join(page.asides)


def test_only_failed_configurations_draw_nothing(tmp_path):
    res = sweep()
    summary = res.tables["summary"]
    summary["status"], summary["error"] = "failed", "boom"
    html = sweep_report_html(res)
    page = Page(html)
    assert page.charts == [] and page.figures == {}
    assert sum("Every configuration of this model failed" in a for a in page.asides) == 2
    assert [len(t["rows"]) for t in page.tables] == [4]  # the configurations table only


def test_written_atomically_and_bad_paths_are_named(tmp_path, monkeypatch):
    out = tmp_path / "s.html"
    answer = write_sweep_report(sweep(), out)
    assert answer["path"] == str(out.resolve()) and answer["bytes"] == out.stat().st_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.html"]  # no temporary file
    assert out.read_text("utf-8").startswith("<!doctype html>")
    missing = tmp_path / "no" / "such" / "s.html"
    with pytest.raises(XpuprofError, match=re.escape(str(missing))):
        write_sweep_report(sweep(), missing)
    with pytest.raises(XpuprofError, match="is a directory"):
        write_sweep_report(sweep(), tmp_path)

    def fail(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report.os, "replace", fail)
    with pytest.raises(XpuprofError, match=r"s\.html: cannot write the report \(No space left"):
        write_sweep_report(sweep(mlp="mlp_renamed_xq"), out)
    monkeypatch.undo()
    assert "mlp_renamed_xq" not in out.read_text("utf-8")  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.html"]


def test_offline_plotly_is_inlined_and_nothing_is_fetched(written):
    out, _, _ = written
    text = out.read_text("utf-8")
    plotly = report.plotly_js()
    assert text.count(plotly) == 1
    assert not re.search(r"(src|href)=\"(?!#)|https?://", text.replace(plotly, ""))


# ------------------------------------------------------------------------------ browser


def test_every_chart_is_drawn_in_chromium(browser, tmp_path):  # noqa: F811
    out = tmp_path / "sweep.html"
    write_sweep_report(sweep(mlp=EVIL), out)
    with open_page(browser) as w:  # fails on any console error, page error or dialog
        page = w.page
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(out.as_uri())
        page.wait_for_function(
            "Array.from(document.querySelectorAll('.chart'))"
            ".every(e => e.classList.contains('js-plotly-plot'))",
            timeout=20_000,
        )
        charts = page.eval_on_selector_all(".chart", "els => els.map(e => e.id)")
        drawn = page.eval_on_selector_all(
            ".chart.js-plotly-plot", "els => els.filter(e => e.querySelector('svg.main-svg'))"
            ".map(e => e.id)")  # fmt: skip
        # one marker per configuration that ran on the latency chart (3), one bar per layer
        # type and configuration with a share (6)
        points = page.eval_on_selector_all("#fig-latency .scatterlayer .point", "e => e.length")
        bars = page.eval_on_selector_all(  # a missing value is a bar 0 wide
            "#fig-layer-shares .barlayer .point path",
            "e => e.filter(p => p.getBBox().width > 0.5).length",
        )
        legend = page.eval_on_selector_all(
            "#fig-latency .legendtext", "e => e.map(x => x.textContent)"
        )
        body = page.inner_text("main")
        scripts = page.eval_on_selector_all("script", "e => e.length")
    assert charts == [f"fig-{c}" for c in CHART_IDS] and drawn == charts
    assert points == 3 and bars == 6
    assert f"{EVIL} float32" in legend and EVIL in body
    assert scripts == 3  # Plotly, the figures' JSON, the drawing: none from the data
    assert all(u.startswith("file://") for u in requests), requests

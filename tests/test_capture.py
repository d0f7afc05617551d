"""Capture of a real PyTorch training loop on the CPU with ``xpuprof.profile``.

Checked against facts computed here, not by the code under test: the model's own module tree
(``named_modules``), torch's profiler trace of the same run, the steps the loop ran, and psutil.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import xpuprof

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")

from xpuprof.workloads.demo import Trainer  # noqa: E402


@pytest.fixture(scope="module")
def op_capture(tmp_path_factory):
    trainer = Trainer(layers=2, d=64, seq=32)
    # the test's own record of which modules run forward (MultiheadAttention, for one, never
    # calls its out_proj module: it uses the weights directly)
    ran: set[str] = set()
    root = type(trainer.model).__name__
    hooks = [
        m.register_forward_hook(lambda _m, _i, _o, name=(path or root): ran.add(name))
        for path, m in trainer.model.named_modules()
    ]
    out = tmp_path_factory.mktemp("cap") / "op.store"
    with xpuprof.profile(out, level="op", model=trainer.model, backward_layers=True) as prof:
        for i in range(3):
            xpuprof.step(i)
            with xpuprof.annotate("train_step", i=i):
                trainer.step()
    for h in hooks:
        h.remove()
    trainer.ran = ran
    trace = prof.trace()
    yield trainer, trace
    trace.close()


def test_layer_spans_nest_like_the_module_tree(op_capture) -> None:
    trainer, trace = op_capture
    modules = {path or type(trainer.model).__name__: type(m).__name__
               for path, m in trainer.model.named_modules()}  # fmt: skip
    df = trace.sql(
        "select e.name, json_extract_string(e.args, '$.module') as kind, "
        "json_extract_string(e.args, '$.pass') as pass, p.name as parent, p.level as plevel "
        "from events e left join events p on p.id = e.parent where e.level = 'layer'"
    )
    fwd = df[df["pass"] == "forward"]
    # every module that ran forward has a span per step, with its type recorded
    assert sorted(fwd.name.unique()) == sorted(trainer.ran)
    assert (fwd.groupby("name").size() == 3).all()
    assert all(modules[n] == k for n, k in zip(fwd.name, fwd.kind, strict=True))
    # a submodule's span sits inside its parent module's span
    for name, parent, plevel in zip(fwd.name, fwd.parent, fwd.plevel, strict=True):
        if "." in name:
            assert plevel == "layer" and parent == name.rsplit(".", 1)[0], (name, parent)
        elif name in dict(trainer.model.named_children()):
            assert parent == type(trainer.model).__name__
    # backward spans exist for the modules with parameters
    bwd = set(df[df["pass"] == "backward"].name)
    assert {"head", "embed", "blocks.0.attn", "blocks.1.mlp.0"} <= bwd


def test_every_aten_op_of_the_forward_pass_is_inside_its_module(op_capture) -> None:
    _, trace = op_capture
    # each op with the innermost layer span above it (walking up the parent chain in SQL)
    chain = trace.sql(
        """
        with recursive up(op, name, cur) as (
          select id, name, parent from events where level = 'op'
          union all
          select up.op, up.name, e.parent from up join events e on e.id = up.cur
          where e.level <> 'layer'
        )
        select up.op, up.name as op_name, l.name as layer,
               json_extract_string(l.args, '$.module') as module,
               json_extract_string(l.args, '$.pass') as pass
        from up join events l on l.id = up.cur and l.level = 'layer'
        """
    )
    forward = chain[chain["pass"] == "forward"]
    by_op = dict(zip(forward.op_name, forward.module, strict=False))
    # the forward ops of each layer type land in a span of that type
    assert by_op["aten::embedding"] == "Embedding"
    assert by_op["aten::layer_norm"] == "LayerNorm"
    assert by_op["aten::gelu"] == "GELU"
    inside = set(forward.module[forward.op_name == "aten::linear"])
    assert inside <= {"Linear", "MultiheadAttention"} and "Linear" in inside
    # every op in a step's forward pass has a layer span above it: the ops torch ran between
    # the first and last forward layer span of step 0 on the main thread
    ops = trace.sql(
        """
        with f as (select min(ts) t0, max(ts + dur) t1, tid from events
                   where level = 'layer' and step = 0
                     and json_extract_string(args, '$.pass') = 'forward'
                     and name = 'TinyLM' group by tid)
        select e.id from events e, f where e.level = 'op' and e.tid = f.tid
          and e.ts >= f.t0 and e.ts + e.dur <= f.t1
        """
    )
    assert len(ops) > 100
    assert set(ops.id) <= set(chain.op)


def test_steps_and_annotations(op_capture) -> None:
    _, trace = op_capture
    steps = trace.sql("select name, step from events where level = 'step' order by ts")
    assert list(steps.name) == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    ann = trace.sql(
        "select e.step, json_extract(e.args, '$.i')::int as i, p.level as plevel from events e "
        "left join events p on p.id = e.parent where e.name = 'train_step' order by e.ts"
    )
    assert list(ann.i) == [0, 1, 2] and list(ann.step) == [0, 1, 2]
    assert (ann.plevel == "step").all()  # our span nests inside torch's step span
    untimed = trace.sql("select count(*) n from events where level = 'op' and step is null")
    assert untimed.n[0] == 0


def test_telemetry_lands_in_counters(op_capture) -> None:
    import psutil

    _, trace = op_capture
    c = trace.sql("select name, series, value from counters")
    rss = c[(c.name == "memory") & (c.series == "rss_bytes")].value
    assert len(rss) >= 1
    now = psutil.Process().memory_info().rss
    assert (rss > 0.3 * now).all() and (rss < 3 * now).all()
    cpu = c[(c.name == "cpu") & (c.series == "process_percent")].value
    assert (cpu >= 0).all()
    status = trace.meta["sources"][0]["meta"]["xpuprof_capture"]["telemetry"]
    assert "gpu" in status  # says whether GPUs were sampled, and why not


def test_step_level_records_no_framework_events(tmp_path) -> None:
    trainer = Trainer(layers=1, d=32, seq=16)
    with xpuprof.profile(tmp_path / "s", level="step") as prof:
        for i in range(4):
            xpuprof.step(i)
            trainer.step()
    with prof.trace() as t:
        levels = dict(t.sql("select level, count(*) n from events group by 1").values.tolist())
        assert levels == {"step": 4}
        steps = t.sql("select name from events order by ts").name.tolist()
    assert steps == [f"step#{i}" for i in range(4)]


def test_warmup_and_steps_schedule(tmp_path) -> None:
    trainer = Trainer(layers=1, d=32, seq=16)
    with xpuprof.profile(tmp_path / "w", level="layer", model=trainer.model, warmup=2,
                         steps=2) as prof:  # fmt: skip
        for i in range(6):
            xpuprof.step(i)
            trainer.step()
    with prof.trace() as t:
        steps = t.sql("select distinct step from events where step is not null order by 1")
    assert steps.step.tolist() == [2, 3]


def test_profile_as_decorator(tmp_path) -> None:
    trainer = Trainer(layers=1, d=32, seq=16)

    @xpuprof.profile(tmp_path / "d", level="layer", model=trainer.model)
    def run() -> None:
        trainer.step()

    run()
    with xpuprof.load(tmp_path / "d") as t:
        assert t.sql("select count(*) n from events where level = 'layer'").n[0] > 10


def test_profiling_torch_without_torch_names_the_extra(tmp_path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # as if torch were not installed
        import xpuprof
        from xpuprof.core.errors import XpuprofError
        try:
            with xpuprof.profile({str(tmp_path / "x")!r}, level="op", framework="torch"):
                pass
        except XpuprofError as e:
            print(e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "pip install 'xpuprof[torch]'" in out.stdout, out.stderr
    assert not (tmp_path / "x").exists()


def test_store_flops_of_a_captured_step_match_flop_counter_mode(tmp_path) -> None:
    """FLOPs in the store (derived from the shapes the capture recorded) against torch's own
    FlopCounterMode on the same step, for linear, conv and matmul work."""
    import numpy as np
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    from xpuprof.costmodel.call import EXACT_KINDS
    from xpuprof.costmodel.ops import op_kind
    from xpuprof.trace.tree import outermost

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 32)
    )
    x = torch.randn(4, 3, 16, 16)
    w = torch.randn(32, 32)

    def step() -> None:
        y = model(x) @ w  # conv, linear and a plain matmul, forward and backward
        y.sum().backward()

    step()
    with FlopCounterMode(display=False) as counter:
        step()
    want = counter.get_total_flops()
    with xpuprof.profile(tmp_path / "f", level="full", model=model):
        step()
    with xpuprof.load(tmp_path / "f") as t:
        ev = t.table("events", columns=["id", "parent", "name", "flops"]).to_pandas()
    # FlopCounterMode counts matmul, conv and attention only; our estimates of elementwise
    # work (relu, sum) are left out of the comparison
    exact = np.array([op_kind(str(n)) in EXACT_KINDS for n in ev.name])
    flops = np.where(exact, ev.flops.to_numpy(dtype=float, na_value=np.nan), np.nan)
    top = outermost(~np.isnan(flops), ev.parent.fillna(-1).to_numpy(np.int64), ev.id.to_numpy())
    got = float(np.nansum(flops[top]))
    assert want > 0
    assert abs(got - want) <= 0.01 * want, (got, want)


def test_jax_program_profiled_with_its_xla_ops(tmp_path) -> None:
    jax = pytest.importorskip("jax", reason="jax is an optional extra: pip install 'xpuprof[jax]'")
    jnp = jax.numpy

    @jax.jit
    def layer(w, x):
        return jnp.tanh(x @ w)

    w = jnp.ones((64, 64)) / 64
    x = jnp.ones((32, 64))
    layer(w, x).block_until_ready()  # compile outside the capture
    with xpuprof.profile(tmp_path / "j", level="op", framework="jax") as prof:
        for i in range(3):
            xpuprof.step(i)
            with xpuprof.annotate("jax_step", i=i):
                x = layer(w, x).block_until_ready()
    with prof.trace() as t:
        ops = t.sql("select name, dur, step from events where level = 'kernel'")
        ann = t.sql("select count(*) n from events where name = 'jax_step'")
        meta = t.meta["sources"][0]["meta"]
    # the jitted function's XLA ops (named by the CPU backend, e.g. a fused dot) ran in every
    # step, the same ops each time, each with a duration
    assert len(ops) >= 3 and (ops.dur > 0).all()
    per_step = ops.groupby("step").name.apply(sorted)
    assert list(per_step.index) == [0, 1, 2]
    assert per_step.iloc[0] == per_step.iloc[1] == per_step.iloc[2]
    assert ann.n[0] == 3
    assert meta["xpuprof_capture"]["framework"] == "jax"


def test_no_op_straddles_the_end_of_its_layer_span(op_capture) -> None:
    """Layer spans are read on torch's own profiler clock: an op that starts inside a module's
    span ends inside it too (a module call is synchronous)."""
    _, trace = op_capture
    n = trace.sql(
        "select count(*) as n from events o join events l on o.tid = l.tid "
        "and l.level = 'layer' and json_extract_string(l.args, '$.pass') = 'forward' "
        "and o.ts >= l.ts and o.ts < l.ts + l.dur and o.ts + o.dur > l.ts + l.dur "
        "where o.level = 'op'"
    ).n[0]
    inside = trace.sql(
        "select count(*) as n from events o join events l on o.tid = l.tid "
        "and l.level = 'layer' and o.ts >= l.ts and o.ts + o.dur <= l.ts + l.dur "
        "where o.level = 'op'"
    ).n[0]
    assert inside > 1000 and n == 0


def _json_events(folder):
    """Every event of the segment files in ``folder``, read with ``json`` (times as Decimal
    microseconds, as Kineto writes them)."""
    import decimal
    import json

    events = []
    for f in sorted(folder.glob("*.json")):
        events += json.loads(f.read_text(), parse_float=decimal.Decimal)["traceEvents"]
    return events


def test_layer_spans_are_stamped_by_torchs_profiler_whatever_our_clock_conversion(
    tmp_path, monkeypatch
) -> None:
    """At the op level a layer span is a torch record function, timed by the profiler exactly
    as the ops inside it, so it does not depend on xpuprof's own conversion of the clock. That
    conversion is skewed here by 50 µs (two conversions calibrated at different moments
    disagreed by up to ~40 µs on a loaded machine): the spans still hold their ops exactly.
    Checked on the profiler's own files, read with ``json``, and on the store; the number of
    spans is the number of module calls the test's own hooks counted."""
    from torch import nn

    P = torch._C._profiler
    real = P._ApproximateClockToUnixTimeConverter

    class Skewed:
        def __init__(self) -> None:
            self._c = real()

        def to_unix_ns(self, t: int) -> int:
            return self._c.to_unix_ns(t) + 50_000

    monkeypatch.setattr(P, "_ApproximateClockToUnixTimeConverter", Skewed)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Sequential(nn.Linear(32, 8)))
    calls = {"forward": 0, "backward": 0}
    counting = [
        m.register_forward_hook(lambda *_: calls.__setitem__("forward", calls["forward"] + 1))
        for m in model.modules()
    ]
    x = torch.randn(4, 16)
    with xpuprof.profile(tmp_path / "s", level="op", model=model, workdir=tmp_path / "w",
                         backward_layers=True, telemetry=False) as prof:  # fmt: skip
        for i in range(3):
            xpuprof.step(i)
            model(x).sum().backward()
    for h in counting:
        h.remove()
    events = _json_events(tmp_path / "w" / "torch")
    layers = [e for e in events if e.get("cat") == "xpuprof_layer"]
    assert not [e for e in events if str(e.get("name", "")).startswith("xpuprof_layer|")]
    fwd = [e for e in layers if e["args"]["pass"] == "forward"]
    assert len(fwd) == calls["forward"] == 3 * 5
    assert {e["args"]["module"] for e in fwd} == {"Sequential", "Linear", "GELU"}
    assert {e["name"] for e in layers if e["args"]["pass"] == "backward"} == {
        "Sequential", "0", "2", "2.0"
    }  # fmt: skip
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    straddles, inside = 0, 0
    # (a backward span begins and ends inside autograd's ``evaluate_function`` ops, where the
    # hooks run: those ops straddle it by nature)
    for layer in fwd:
        t0, t1 = layer["ts"], layer["ts"] + layer["dur"]
        for op in ops:
            if op["tid"] == layer["tid"] and t0 <= op["ts"] < t1:
                inside += 1
                straddles += op["ts"] + op["dur"] > t1
    assert inside > 50 and straddles == 0
    with prof.trace() as t:
        meta = t.meta["sources"][0]["meta"]["xpuprof_capture"]
        assert meta["layer_spans_clock"] == "torch profiler events"
        n = t.sql(
            "select count(*) n from events o join events l on o.tid = l.tid and l.level = 'layer' "
            "and json_extract_string(l.args, '$.pass') = 'forward' and o.ts >= l.ts "
            "and o.ts < l.ts + l.dur and o.ts + o.dur > l.ts + l.dur where o.level = 'op'"
        ).n[0]
        kinds = t.sql("select category, count(*) n from events where level = 'layer' group by 1")
    assert n == 0
    assert dict(kinds.values.tolist()) == {"xpuprof_layer": len(layers)}


def test_a_step_marked_inside_a_module_call_cuts_the_profiler_cleanly(tmp_path) -> None:
    """A remote capture restarts torch's profiler at a step boundary; when the step is marked
    inside a module call, that module's open span (a record function of the stopped session)
    ends at the cut and goes on as a new span in the next session, inside the new step: the
    module called after the mark nests in it, and no marker is left behind."""
    from torch import nn

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(8, 8)

        def forward(self, x, i):
            xpuprof.step(i)
            return self.inner(x)

    model = Outer()
    x = torch.randn(4, 8)
    with xpuprof.profile(tmp_path / "s", level="op", model=model, segment_ms=1e-6,
                         telemetry=False) as prof:  # fmt: skip
        for i in range(5):
            model(x, i).sum().backward()
    with prof.trace() as t:
        assert t.meta["sources"][0]["meta"]["xpuprof_capture"]["torch_segments"] == 5
        df = t.sql(
            "select e.name, e.step, p.name as parent, p.level as plevel from events e "
            "left join events p on p.id = e.parent where e.level = 'layer' order by e.ts"
        )
        left = t.sql("select count(*) n from events where name like 'xpuprof_layer|%'").n[0]
    assert left == 0
    inner = df[df.name == "inner"]
    assert list(inner.step) == [0, 1, 2, 3, 4]
    # from the first cut on, each call's remainder is an Outer span in the new step
    assert list(inner.parent[1:]) == ["Outer"] * 4 and (inner.plevel[1:] == "layer").all()
    assert (df.name == "Outer").sum() == 1 + 2 * 4  # the first call, then each split at a cut


@pytest.mark.parametrize("level", ["layer", "op"])
def test_a_forward_that_raises_keeps_the_spans_paired(tmp_path, level) -> None:
    """A module whose forward raises (caught by the user) still ends its span, so the spans of
    the calls after it keep their names and nest as the module tree does."""
    from torch import nn

    class Flaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.fail = True

        def forward(self, x):
            y = self.lin(x)
            if self.fail:
                self.fail = False
                raise RuntimeError("once")
            return y

    model = nn.Sequential(nn.Linear(8, 8), Flaky())
    x = torch.randn(2, 8)
    with xpuprof.profile(tmp_path / "s", level=level, model=model, telemetry=False) as prof:
        with pytest.raises(RuntimeError, match="once"):
            model(x)
        model(x)
    with prof.trace() as t:
        df = t.sql(
            "select e.name, p.name as parent from events e left join events p on p.id = e.parent "
            "where e.level = 'layer' order by e.ts"
        )
    assert list(df.name) == ["Sequential", "0", "1", "1.lin"] * 2
    assert list(df.parent[df.name == "1.lin"]) == ["1", "1"]
    assert list(df.parent[df.name == "1"]) == ["Sequential", "Sequential"]


def test_layer_marks_become_spans_in_place_or_through_a_copy(tmp_path) -> None:
    """The rewrite of a profiler file: marker events (as torch writes them, and a compact one
    whose span is longer than itself) become layer spans with the same time text; everything
    else, a marker-like string in another event's args included, is left as it was."""
    import json

    from xpuprof.capture.layer_marks import layer_mark, marks_to_spans, parse_mark

    for path, kind in [("a.b", "Linear"), ('we|ird:"na\\me', "K|ind"), ("ünï", "Ünï")]:
        for phase in ("forward", "backward"):
            assert parse_mark(layer_mark(path, kind, phase)) == (path, kind, phase)
    assert parse_mark("xpuprof_layer|forward|9:Linear|x") is None
    assert parse_mark("aten::mm") is None

    pretty = (
        '{\n  "schemaVersion": 1,\n  "traceEvents": [\n  {\n    "ph": "X", "cat": "cpu_op", '
        '"name": %s, "pid": 7, "tid": 7,\n    "ts": 1712195495519689.047, "dur": 12.301,\n'
        '    "args": {\n      "External id": 3,"Record function id": 0, "Ev Idx": 2\n    }\n'
        '  },\n  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, '
        '"ts": 1712195495519690.001, "dur": 1.5, "args": {"note": %s}}\n  ],\n'
        '  "baseTimeNanoseconds": 5\n}'
    )
    mark = layer_mark('blocks.0."attn"', "MultiheadAttention", "forward")
    f = tmp_path / "pretty.json"
    f.write_text(pretty % (json.dumps(mark), json.dumps(mark)))
    size = f.stat().st_size
    assert marks_to_spans(f) == (1, 1)  # the string in aten::mm's args is no event
    assert f.stat().st_size == size  # rewritten in place
    text = f.read_text()
    doc = json.loads(text)
    span, op = doc["traceEvents"]
    assert span == {"ph": "X", "cat": "xpuprof_layer", "name": 'blocks.0."attn"', "pid": 7,
                    "tid": 7, "ts": 1712195495519689.047, "dur": 12.301,
                    "args": {"module": "MultiheadAttention", "pass": "forward"}}  # fmt: skip
    assert '"ts":1712195495519689.047,"dur":12.301' in text  # torch's text, not a float's
    assert op["name"] == "aten::mm" and op["args"] == {"note": mark}
    assert doc["baseTimeNanoseconds"] == 5

    tight = layer_mark("p" * 40, "K" * 60, "backward")
    g = tmp_path / "compact.json"
    g.write_text(
        '{"traceEvents":[{"name":' + json.dumps(tight) + ',"ph":"X","ts":1.5,"dur":2,"pid":1,'
        '"tid":2},{"ph":"i","name":"x","ts":3,"pid":1,"tid":2}]}'
    )
    size = g.stat().st_size
    assert marks_to_spans(g) == (1, 0)
    assert g.stat().st_size > size  # the span is longer than the marker: written anew
    events = json.loads(g.read_text())["traceEvents"]
    assert events[0]["cat"] == "xpuprof_layer" and events[0]["name"] == "p" * 40
    assert events[0]["args"] == {"module": "K" * 60, "pass": "backward"}
    assert events[1] == {"ph": "i", "name": "x", "ts": 3, "pid": 1, "tid": 2}
    assert not list(tmp_path.glob("*.tmp"))


def test_capture_cut_into_profiler_segments_holds_every_step_whole(tmp_path) -> None:
    """A remote capture restarts torch's profiler every few steps so that stopping it stays
    cheap (``capture/torch.py``); merged, the segments must hold what one recording would:
    each step with every op and forward-backward link that torch's own profiler records for
    one step of this model (read from its trace with ``json``), with flow ids still unique."""
    import json

    from torch.autograd.profiler import profile

    trainer = Trainer(layers=1, d=64, seq=32)
    for _ in range(2):  # the optimizer's state exists from here on: every step does the same
        trainer.step()
    with profile(use_kineto=True) as ref:
        trainer.step()
    ref.export_chrome_trace(str(tmp_path / "one.json"))
    events = json.loads((tmp_path / "one.json").read_text())["traceEvents"]
    ops = sum(1 for e in events if e.get("cat") == "cpu_op")
    links = sum(1 for e in events if e.get("cat") == "fwdbwd" and e.get("ph") == "f")
    assert ops > 500 and links > 20
    # a budget of 1 ns: the profiler is restarted at every step
    with xpuprof.profile(tmp_path / "s", level="op", segment_ms=1e-6, telemetry=False) as prof:
        for i in range(4):
            xpuprof.step(i)
            trainer.step()
    with prof.trace() as trace:
        assert trace.meta["sources"][0]["meta"]["xpuprof_capture"]["torch_segments"] == 4
        per_step = trace.sql(
            "select step, count(*) n from events where category = 'cpu_op' group by step "
            "order by step"
        )
        assert list(per_step.step) == [0, 1, 2, 3] and set(per_step.n) == {ops}
        linked = trace.sql(
            "select e.step, count(*) n from links l join events e on e.id = l.dst "
            "where l.kind = 'fwdbwd' group by e.step order by e.step"
        )
        assert list(linked.step) == [0, 1, 2, 3] and set(linked.n) == {links}
        dup = trace.sql(
            "select category, flow_id, phase, count(*) n from flows "
            "group by all having count(*) > 1"
        )
        assert dup.empty


_QUIET = """
import os, sys, warnings
import xpuprof
from xpuprof.workloads.demo import Trainer

trainer = Trainer(layers=1, d=32, seq=16)
trainer.step()
# twice: Kineto's lines come at every start and stop; "full" profiles memory (torch's
# allocator warns, once, when a block allocated before profiling is freed)
for k, level in enumerate(("op", "full")):
    with xpuprof.profile(sys.argv[1] + str(k), level=level, model=trainer.model,
                         backward_layers=True):
        for i in range(2):
            xpuprof.step(i)
            trainer.step()
        warnings.warn("the user's own warning")
print("KINETO_LOG_LEVEL" in os.environ)
print("-- after the captures --", file=sys.stderr, flush=True)
trainer.model.register_full_backward_hook(lambda *a: None)  # the user's own hook: it warns
trainer.step()
"""


def test_capture_is_quiet_and_leaves_the_users_warnings_alone(tmp_path) -> None:
    """``xpuprof.profile`` prints nothing of its own on stderr: no Kineto lines (``USDT:…
    profiler_start``), no line of torch's allocator about blocks allocated before memory
    profiling began, no warning about the backward hooks it installs (the model's first
    layer has no input that needs a gradient); the user's own warnings still show, during
    the capture and after it, and the environment is left as it was."""
    proc = subprocess.run([sys.executable, "-W", "default", "-c", _QUIET, str(tmp_path / "q")],
                          capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items()
                               if k != "KINETO_LOG_LEVEL"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
    during, after = proc.stderr.split("-- after the captures --\n")
    assert "USDT" not in during and "profiler_st" not in during
    # during the captures: the user's warning, and nothing else
    assert "the user's own warning" in during
    assert all("the user's own warning" in line for line in during.splitlines()), during
    # torch's hook warning: silent while xpuprof's hooks are installed, back for the user's
    assert "Full backward hook is firing" not in during
    assert after.count("Full backward hook is firing") == 1

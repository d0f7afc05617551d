"""A trace the test records itself: a small PyTorch training loop profiled on the CPU.

The peer here is torch's own profiler: ``key_averages()`` of the very profile that wrote the
trace counts each op and sums its time; the store must agree with it exactly on counts and to
the rounding of microseconds on time. Skipped, saying so, where torch is not installed (CI
installs it).
"""

from __future__ import annotations

import json

import pytest
from conftest import cli_json

import xpuprof

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    out_dir = tmp_path_factory.mktemp("torch")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32), torch.randint(0, 8, (16,))
    got: dict = {}

    def ready(p) -> None:
        # key_averages must be read in the handler: the profiler clears events after a cycle
        got["ops"] = {e.key: (e.count, e.cpu_time_total) for e in p.key_averages()}
        p.export_chrome_trace(str(out_dir / "train.pt.trace.json"))

    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        profile_memory=True,
        schedule=schedule(wait=0, warmup=1, active=3),
        on_trace_ready=ready,
    ) as prof:
        for _ in range(4):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            prof.step()
    path = out_dir / "train.pt.trace.json"
    store = out_dir / "train.store"
    xpuprof.import_traces([path], store)
    return {"path": path, "store": store, "ops": got["ops"]}


def test_op_counts_and_times_match_torch_key_averages(recorded) -> None:
    with xpuprof.load(recorded["store"]) as trace:
        df = trace.sql(
            "select name, level, count(*) as n, sum(dur) as ns from events "
            "where level in ('op', 'annotation', 'step') group by name, level"
        )
    steps = df[df.level == "step"]
    rest = df[df.level != "step"]
    ops = dict(recorded["ops"])
    # torch folds ProfilerStep#1..#3 into one key
    n_steps, step_us = ops.pop("ProfilerStep*")
    assert steps.n.sum() == n_steps == 3
    assert abs(steps.ns.sum() / 1e3 - step_us) <= 0.001 * step_us
    assert dict(zip(rest.name, rest.n.tolist(), strict=True)) == {k: v[0] for k, v in ops.items()}
    for name, ns in zip(rest.name, rest.ns.tolist(), strict=True):
        want_us = ops[name][1]
        # the trace stores microseconds with 3 decimals: allow that rounding per event
        assert abs(ns / 1e3 - want_us) <= 0.001 * ops[name][0] + 1e-6 * want_us, name


def test_every_entry_of_the_recorded_trace_is_in_the_store(recorded) -> None:
    raw = json.loads(recorded["path"].read_text())["traceEvents"]
    doc = cli_json("info", recorded["store"])
    (src,) = doc["sources"]
    assert src["events_read"] == len(raw)
    phases: dict[str, int] = {}
    for e in raw:
        phases[e["ph"]] = phases.get(e["ph"], 0) + 1
    assert src["read"]["phase"] == phases
    # every op runs inside a profiler step of its own process
    with xpuprof.load(recorded["store"]) as trace:
        n = trace.sql("select count(*) as n from events where level = 'op' and step is null")
    assert n["n"][0] == 0


def test_backward_ops_are_linked_to_their_forward_ops(recorded) -> None:
    raw = json.loads(recorded["path"].read_text())["traceEvents"]
    pairs = sum(1 for e in raw if e.get("cat") == "fwdbwd" and e.get("ph") == "f")
    with xpuprof.load(recorded["store"]) as trace:
        links = trace.sql(
            "select s.name as fwd, d.name as bwd, s.ts < d.ts as ordered from links l "
            "join events s on s.id = l.src join events d on d.id = l.dst where l.kind = 'fwdbwd'"
        )
    assert len(links) == pairs > 0
    assert links.ordered.all()  # a backward op runs after its forward op
    assert links.bwd.str.contains("Backward").all()

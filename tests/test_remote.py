"""On-demand capture of a running training loop from a second process.

The job is a real process (a PyTorch loop calling ``xpuprof.step``), started once for the
module, that logs the wall time of every step; the client is the CLI. The step log, written by
the job itself, is the independent record the checks use: which steps the store holds, and the
loop's rate before, during and after the capture.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import cli
from remote_job import Job, start_job

pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")

import xpuprof  # noqa: E402

#: How long the loop's rate is measured before and after the capture window (seconds). At the
#: job's ~70 steps/s on one core that is over a hundred steps per window.
RATE_WINDOW_S = 2.0


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Iterator[Job]:
    """One training job for the tests below (starting one, torch import included, is the
    slowest part of each): it runs until the module's tests are done."""
    job = start_job(tmp_path_factory.mktemp("job"), seconds=120)
    yield job
    job.stop()


def steps_log(job: Job) -> list[tuple[int, int]]:
    """(step, wall-clock ns when it was done) per logged step."""
    return [(s.n, s.done_ns) for s in job.steps()]


def rate(log: list[tuple[int, int]], t0: float, t1: float) -> float:
    n = sum(1 for _, t in log if t0 * 1e9 <= t < t1 * 1e9)
    return n / (t1 - t0)


def test_capture_a_running_loop_from_another_process(job: Job, tmp_path: Path) -> None:
    # a wrong token is refused with 401 and starts nothing
    bad = cli("capture", job.url, "--duration", "1s", "-o", tmp_path / "bad", "--token", "nope")
    assert bad.returncode == 2 and "HTTP 401" in bad.stderr
    assert not (tmp_path / "bad").exists()
    # the loop runs unprofiled for a whole rate window before the request
    time.sleep(max(0.0, job.quiet_since + RATE_WINDOW_S - time.time()))
    t_req = time.time()
    out = cli("capture", job.url, "--duration", "1s", "-o", tmp_path / "cap", "--json",
              env={"XPUPROF_TOKEN": job.token})  # fmt: skip
    t_resp = time.time()
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    time.sleep(0.5 + RATE_WINDOW_S)  # the loop runs on after the capture
    job.quiet_since = time.time()
    log = steps_log(job)
    with xpuprof.load(tmp_path / "cap") as trace:
        steps = trace.sql("select name, ts, dur from events where level = 'step' order by ts")
        base = trace.meta["sources"][0]["meta"].get("baseTimeNanoseconds") or 0
        levels = set(trace.sql("select distinct level from events").level)
    assert doc["rows"]["events"] > 0 and {"op", "layer", "step"} <= levels
    # the store holds whole consecutive steps of the job, inside the request's window
    numbers = [int(n.split("#")[1]) for n in steps.name]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    assert len(numbers) >= 2
    first_ns = int(steps.ts.iloc[0]) + base
    last_end_ns = int(steps.ts.iloc[-1] + steps.dur.iloc[-1]) + base
    assert t_req * 1e9 <= first_ns and last_end_ns <= t_resp * 1e9
    # step i's span ends when the job logged step i as done (its own clock, independently)
    done = dict(log)
    for n, ts, dur in zip(numbers, steps.ts, steps.dur, strict=True):
        assert abs(int(ts + dur) + base - done[n]) < 50_000_000  # within 50 ms
    # the loop's rate before, during and after the capture window
    cap0, cap1 = first_ns / 1e9, last_end_ns / 1e9
    before = rate(log, t_req - RATE_WINDOW_S, t_req)
    during = rate(log, cap0, cap1)
    after = rate(log, t_resp + 0.5, min(t_resp + 0.5 + RATE_WINDOW_S, log[-1][1] / 1e9))
    print(f"steps/s before {before:.1f}, during {during:.1f}, after {after:.1f}")
    assert before > 0 and during > 0 and after > 0
    assert after >= 0.6 * before  # the job is not left slowed after the window


def test_second_concurrent_capture_is_refused(job: Job, tmp_path: Path) -> None:
    first = subprocess.Popen(
        [sys.executable, "-m", "xpuprof.ui.cli", "capture", job.url, "--duration", "0.5s",
         "--level", "layer", "-o", str(tmp_path / "one"), "--token", job.token],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # wait until the server reports a running capture, then hold the loop between two
        # steps: the capture cannot end before the second request is answered, however long
        # the second client takes to start
        req = urllib.request.Request(
            job.url + "/status", headers={"Authorization": f"Bearer {job.token}"}
        )
        deadline = time.time() + 20
        while not json.load(urllib.request.urlopen(req))["capturing"]:
            assert first.poll() is None, first.communicate()
            assert time.time() < deadline
            time.sleep(0.02)
        job.hold_file.write_text("")
        second = cli("capture", job.url, "--duration", "1s", "-o", tmp_path / "two",
                     "--token", job.token)  # fmt: skip
        job.hold_file.unlink()
        assert second.returncode == 2 and "HTTP 409" in second.stderr
        assert "already running" in second.stderr
        assert not (tmp_path / "two").exists()
        assert first.wait(timeout=60) == 0, first.stderr.read()
    finally:
        job.hold_file.unlink(missing_ok=True)
        if first.poll() is None:
            first.kill()
    job.quiet_since = time.time()
    assert (tmp_path / "one" / "manifest.json").is_file()
    with xpuprof.load(tmp_path / "one") as trace:  # the level asked for, not the server's
        levels = set(trace.sql("select distinct level from events").level)
    assert "layer" in levels and "op" not in levels


def test_missing_token_gets_401(tmp_path) -> None:
    server = xpuprof.serve(0, token="s3cret")
    try:
        req = urllib.request.Request(server.url + "/capture", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req)
        assert e.value.code == 401
        assert server.host == "127.0.0.1"  # local only unless asked otherwise
    finally:
        server.close()


def test_port_in_use_is_a_clear_error() -> None:
    server = xpuprof.serve(0, token="x")
    try:
        with pytest.raises(xpuprof.XpuprofError, match="in use"):
            xpuprof.serve(server.port, token="y")
    finally:
        server.close()


def test_server_closed_on_the_jobs_thread_ends_the_capture_with_what_it_recorded(tmp_path):
    """A job that ends (``server.close()`` on its own thread) while a capture records will
    never step again: the capture ends there, and its client gets the steps recorded so far."""
    import threading

    import torch

    from xpuprof.workloads.demo import Trainer

    trainer = Trainer(layers=1, d=32, seq=16)
    server = xpuprof.serve(0, token="t", model=trainer.model, finish_nice=0)
    outcome: list[str] = []

    def ask() -> None:
        try:
            xpuprof.request_capture(server.url, tmp_path / "c", duration=60, token="t")
            outcome.append("ok")
        except xpuprof.XpuprofError as e:
            outcome.append(str(e))

    client = threading.Thread(target=ask)
    client.start()
    i, recorded, deadline = 0, 0, time.time() + 30
    while recorded < 3:  # the loop runs until three steps are recorded
        assert time.time() < deadline and client.is_alive(), outcome
        xpuprof.step(i)
        trainer.step()
        recorded += server.state == "recording"
        i += 1
    t0 = time.time()
    server.close()
    took = time.time() - t0
    client.join(timeout=60)
    assert outcome == ["ok"] and took < 30  # not the 60 s asked for, nor close()'s 120 s wait
    assert not torch.autograd._profiler_enabled() and server.state == "idle"
    with xpuprof.load(tmp_path / "c") as trace:
        names = trace.sql("select name from events where level = 'step' order by ts").name
    numbers = [int(n.split("#")[1]) for n in names]
    assert len(numbers) >= 3 and numbers == list(range(numbers[0], i))

"""On-demand capture of a running training loop from a second process.

The job is a real process (a PyTorch loop calling ``xpuprof.step``) that logs the wall time of
every step; the client is the CLI. The step log, written by the job itself, is the independent
record the checks use: which steps the store holds, and the loop's rate before, during and
after the capture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")

import xpuprof  # noqa: E402

JOB = textwrap.dedent(
    """
    import sys, time
    import torch
    import xpuprof
    from xpuprof.workloads.demo import Trainer

    # one intra-op thread: on a 2-core machine shared with the test, OpenMP barriers of tiny
    # ops would otherwise make the step rate swing by 10x and say nothing about the capture
    torch.set_num_threads(1)

    token, base, level, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    trainer = Trainer(layers=1, d=32, seq=16)
    server = xpuprof.serve(0, token=token, level=level, model=trainer.model)
    with open(base + ".url", "w") as f:
        f.write(server.url)
    log = open(base + ".steps", "w")
    end = time.time() + seconds
    stop = base + ".stop"
    i = 0
    import os
    while time.time() < end and not os.path.exists(stop):
        xpuprof.step(i)
        trainer.step()
        log.write(f"{i} {time.time_ns()}\\n")
        log.flush()
        i += 1
    server.close()
    """
)


def start_job(tmp_path: Path, token: str, level: str, seconds: float) -> tuple:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    base = tmp_path / "job"
    proc = subprocess.Popen(
        [sys.executable, str(script), token, str(base), level, str(seconds)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url_file = Path(str(base) + ".url")
    deadline = time.time() + 60
    while not url_file.exists() or not url_file.read_text():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the job did not start its server"
        time.sleep(0.05)
    return proc, url_file.read_text(), Path(str(base) + ".steps")


def stop_job(proc: subprocess.Popen, steps_file: Path) -> None:
    Path(str(steps_file).replace(".steps", ".stop")).write_text("")
    proc.wait(timeout=60)


def steps_log(path: Path) -> list[tuple[int, int]]:
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines() if line]


def rate(log: list[tuple[int, int]], t0: float, t1: float) -> float:
    n = sum(1 for _, t in log if t0 * 1e9 <= t < t1 * 1e9)
    return n / (t1 - t0)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xpuprof.ui.cli", *args],
        capture_output=True, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_capture_a_running_loop_from_another_process(tmp_path) -> None:
    token = "t0ken-for-the-test"
    proc, url, steps_file = start_job(tmp_path, token, "op", seconds=120)
    try:
        time.sleep(3)  # the loop runs unprofiled
        # a wrong token is refused with 401 and starts nothing
        bad = cli("capture", url, "--duration", "1s", "-o", str(tmp_path / "bad"),
                  "--token", "nope")  # fmt: skip
        assert bad.returncode == 2 and "HTTP 401" in bad.stderr
        assert not (tmp_path / "bad").exists()
        t_req = time.time()
        out = cli("capture", url, "--duration", "2s", "-o", str(tmp_path / "cap"), "--json",
                  env={"XPUPROF_TOKEN": token})  # fmt: skip
        t_resp = time.time()
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        time.sleep(5)  # the loop runs on after the capture
        stop_job(proc, steps_file)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = steps_log(steps_file)
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
    before = rate(log, t_req - 2.5, t_req)
    during = rate(log, cap0, cap1)
    after = rate(log, t_resp + 0.5, min(t_resp + 4.5, log[-1][1] / 1e9))
    print(f"steps/s before {before:.1f}, during {during:.1f}, after {after:.1f}")
    assert before > 0 and during > 0 and after > 0
    assert after >= 0.6 * before  # the job is not left slowed after the window


def test_second_concurrent_capture_is_refused(tmp_path) -> None:
    token = "another-token"
    proc, url, steps_file = start_job(tmp_path, token, "layer", seconds=120)
    try:
        first = subprocess.Popen(
            [sys.executable, "-m", "xpuprof.ui.cli", "capture", url, "--duration", "3s",
             "-o", str(tmp_path / "one"), "--token", token],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # wait until the server reports a running capture, then ask again
        req = urllib.request.Request(url + "/status", headers={"Authorization": f"Bearer {token}"})
        deadline = time.time() + 20
        while not json.load(urllib.request.urlopen(req))["capturing"]:
            assert time.time() < deadline
            time.sleep(0.05)
        second = cli("capture", url, "--duration", "1s", "-o", str(tmp_path / "two"),
                     "--token", token)  # fmt: skip
        assert second.returncode == 2 and "HTTP 409" in second.stderr
        assert "already running" in second.stderr
        assert not (tmp_path / "two").exists()
        assert first.wait(timeout=60) == 0, first.stderr.read()
        assert (tmp_path / "one" / "manifest.json").is_file()
        stop_job(proc, steps_file)
    finally:
        if proc.poll() is None:
            proc.kill()


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

"""A real training job serving captures, run in a second process for the remote-capture tests.

The job is a PyTorch loop calling ``xpuprof.step`` with ``xpuprof.serve`` running. It logs
every step itself — the independent record the tests check against: when the step was done,
how long the ``xpuprof.step()`` call and the whole iteration took, whether torch's profiler was
on in the job's thread and how many forward hooks the model carried. Files next to its log let
a test hold the loop between two steps (as a job pausing for evaluation or a checkpoint would)
or stop it. Its stderr goes to a file the tests read, and its temporary folder (``TMPDIR``) is
its own, so that anything a capture leaves behind is seen.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

JOB = textwrap.dedent(
    """
    import os, resource, sys, time
    import torch
    import xpuprof
    from xpuprof.live import remote
    from xpuprof.workloads.demo import Trainer

    # one intra-op thread: on a 2-core machine shared with the test, OpenMP barriers of tiny
    # ops would otherwise make the step rate swing by 10x and say nothing about the capture
    torch.set_num_threads(1)
    token, base, level, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    if os.environ.get("JOB_NOFILE"):  # a job with few file descriptors to spare
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(os.environ["JOB_NOFILE"]), hard))
    if os.environ.get("JOB_TIMEOUTS"):  # shorter waits, so that the tests stay short
        remote.STEP_TIMEOUT_S = remote.REQUEST_TIMEOUT_S = float(os.environ["JOB_TIMEOUTS"])
    # steps of ~15 ms: few enough events per captured second that the capture is read and
    # written in about a second, and the step rate is steady
    trainer = Trainer(layers=1, d=128, seq=64)
    for _ in range(3):  # warm up before anyone measures the rate
        trainer.step()
    server = xpuprof.serve(0, token=token, level=level, model=trainer.model, finish_nice=0)
    modules = list(trainer.model.modules())
    log = open(base + ".steps", "w")
    stop, hold = base + ".stop", base + ".hold"
    with open(base + ".url", "w") as f:
        f.write(server.url)
    end = time.time() + seconds
    i = 0
    while time.time() < end and not os.path.exists(stop):
        while os.path.exists(hold):  # the test can hold the loop between two steps
            time.sleep(0.005)
        t0 = time.perf_counter_ns()
        xpuprof.step(i)
        t1 = time.perf_counter_ns()
        trainer.step()
        t2 = time.perf_counter_ns()
        on = int(torch.autograd._profiler_enabled())
        hooks = sum(len(m._forward_pre_hooks) for m in modules)
        log.write(f"{i} {time.time_ns()} {t1 - t0} {t2 - t0} {on} {hooks}\\n")
        log.flush()
        i += 1
    server.close()
    """
)


@dataclass
class Step:
    """One logged step of the job."""

    n: int
    done_ns: int  # wall clock when the step was done
    call_ns: int  # the xpuprof.step() call
    iter_ns: int  # the whole iteration, xpuprof.step() included
    profiler_on: bool  # torch's profiler was on in the job's thread after the step
    hooks: int  # forward pre-hooks on the model's modules


@dataclass
class Job:
    """The running job: its server's URL and token, its step log, and the files the test uses
    to stop it or to hold its loop between two steps."""

    proc: subprocess.Popen
    url: str
    token: str
    base: Path
    tmp: Path
    #: When the loop last ran with nothing else asking anything of it (wall clock, seconds).
    quiet_since: float
    #: What the temporary folder held when the server started.
    tmp_before: frozenset[str] = frozenset()

    @property
    def steps_file(self) -> Path:
        return self.base.with_suffix(".steps")

    @property
    def hold_file(self) -> Path:
        return self.base.with_suffix(".hold")

    @property
    def stderr_file(self) -> Path:
        return self.base.with_suffix(".stderr")

    def stderr(self) -> str:
        return self.stderr_file.read_text(errors="replace")

    def steps(self) -> list[Step]:
        """Every logged step; a line the job is still writing is left out."""
        lines = self.steps_file.read_text().split("\n")[:-1]
        return [Step(*(int(v) for v in line.split())) for line in lines if line]

    def wait_steps(self, n: int = 3, timeout: float = 20.0) -> list[Step]:
        """Wait until the job has done ``n`` more steps; returns the log then."""
        start = len(self.steps())
        deadline = time.time() + timeout
        while True:
            log = self.steps()
            if len(log) >= start + n:
                return log
            assert self.proc.poll() is None, f"the job died: {self.stderr()[-2000:]}"
            assert time.time() < deadline, "the job stopped stepping"
            time.sleep(0.02)

    def leftovers(self) -> list[str]:
        """What appeared in the job's temporary folder since its server started (torch itself
        leaves a cache folder there when the model first trains, before that)."""
        return sorted({p.name for p in self.tmp.iterdir()} - self.tmp_before)

    def stop(self) -> None:
        self.base.with_suffix(".stop").write_text("")
        self.hold_file.unlink(missing_ok=True)
        try:
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def start_job(d: Path, *, level: str = "op", seconds: float = 300, **env: str) -> Job:
    """Start the job in folder ``d`` (``env``: JOB_NOFILE, JOB_TIMEOUTS) and wait for its
    server."""
    script = d / "job.py"
    script.write_text(JOB)
    base = d / "job"
    tmp = d / "tmp"
    tmp.mkdir()
    token = "t0ken-for-the-test"
    with open(base.with_suffix(".stderr"), "w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(script), token, str(base), level, str(seconds)],
            stdout=subprocess.DEVNULL, stderr=err,
            env={**os.environ, "TMPDIR": str(tmp), **env},
        )  # fmt: skip
    url_file = base.with_suffix(".url")
    deadline = time.time() + 60
    while not url_file.exists() or not url_file.read_text():
        assert proc.poll() is None, base.with_suffix(".stderr").read_text()
        assert time.time() < deadline, "the job did not start its server"
        time.sleep(0.02)
    before = frozenset(p.name for p in tmp.iterdir())
    return Job(proc, url_file.read_text(), token, base, tmp, time.time(), before)

"""The capture server is safe to attach to a production job (issue 8, items 1-5).

Each test drives the real training job of ``remote_job.py`` in a second process and checks what
happens *to the job* against the job's own records — its step log (how long each step and each
``xpuprof.step()`` call took, whether torch's profiler was on in its thread, how many hooks its
model carried), its stderr, its temporary folder — and psutil's view of the process (memory,
threads, file descriptors). The job runs with 128 file descriptors and 1 s timeouts (what it
waits for a step, what a client gets to send its request), so that every case is seconds long.
"""

from __future__ import annotations

import contextlib
import json
import re
import resource
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import cli
from remote_job import Job, start_job

pytest.importorskip("torch", reason="torch is an optional extra: pip install torch")
psutil = pytest.importorskip("psutil")

import xpuprof  # noqa: E402
from xpuprof.live.remote import MAX_CONNECTIONS, request_capture  # noqa: E402

#: The job's file-descriptor limit: the unbounded server of before died with 253 idle
#: connections under a limit of 256.
JOB_NOFILE = 128


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Iterator[Job]:
    job = start_job(tmp_path_factory.mktemp("hjob"), JOB_NOFILE=str(JOB_NOFILE), JOB_TIMEOUTS="1")
    # one capture first: torch's profiler starts its own thread the first time it runs, and
    # the tests compare the job's threads and memory with what they were after a capture
    capture(job, tmp_path_factory.mktemp("warm") / "s", 0.2)
    yield job
    job.stop()


def capture(job: Job, out: Path, duration: float) -> list[int]:
    """One capture through the client API; returns the step numbers the store holds."""
    request_capture(job.url, out, duration=duration, token=job.token)
    with xpuprof.load(out) as trace:
        names = trace.sql("select name from events where level = 'step' order by ts").name
    return [int(n.split("#")[1]) for n in names]


def status(job: Job) -> dict:
    reply = raw(job, f"GET /status HTTP/1.1\r\nAuthorization: Bearer {job.token}\r\n\r\n")
    assert code(reply) == 200, reply[:200]
    return json.loads(reply.split(b"\r\n\r\n", 1)[1])


def code(reply: bytes) -> int | None:
    """The status code of a raw HTTP reply (None: not an HTTP reply)."""
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", reply)
    return int(m.group(1)) if m else None


def wait_state(job: Job, state: str, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while (now := status(job)["state"]) != state:
        assert time.time() < deadline, f"the server stayed {now!r}, not {state!r}"
        time.sleep(0.02)


def raw(job: Job, request: str | bytes, timeout: float = 5.0) -> bytes:
    """Send ``request`` as is and return everything the server answers until it closes."""
    host, port = job.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request.encode("latin-1") if isinstance(request, str) else request)
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def post(job: Job, body: bytes, *, token: str | None = None, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {token or job.token}\r\n"
    head = f"POST /capture HTTP/1.1\r\n{auth}Content-Length: {len(body)}\r\n{extra}\r\n"
    return raw(job, head.encode() + body)


def assert_released(job: Job) -> None:
    """The job's thread runs with torch's profiler off and no hooks on its model, and the
    capture's temporary folder is gone."""
    log = job.wait_steps(3)
    assert not log[-1].profiler_on and log[-1].hooks == 0
    assert job.leftovers() == []


def test_capture_abandoned_while_the_job_pauses_releases_the_profiler(job: Job, tmp_path):
    proc = psutil.Process(job.proc.pid)
    threads = proc.num_threads()
    failed: list[str] = []

    def ask() -> None:
        try:
            request_capture(job.url, tmp_path / "a", duration=0.5, token=job.token)
        except xpuprof.XpuprofError as e:
            failed.append(str(e))

    client = threading.Thread(target=ask)
    client.start()
    wait_state(job, "recording")
    assert job.wait_steps(1)[-1].profiler_on  # the job's own view: torch's profiler is on
    job.hold_file.write_text("")  # the job pauses mid-capture (evaluation, a checkpoint...)
    client.join(timeout=20)
    assert failed and "HTTP 504" in failed[0] and "stopped calling xpuprof.step()" in failed[0]
    assert not (tmp_path / "a").exists()
    # only the job's thread can stop torch's profiler: it is released at the next step, and
    # until then a new capture is refused with the reason
    assert status(job)["state"] == "releasing"
    with pytest.raises(xpuprof.XpuprofError, match="HTTP 409.*next xpuprof.step"):
        request_capture(job.url, tmp_path / "b", duration=0.2, token=job.token)
    job.hold_file.unlink()
    wait_state(job, "idle")
    assert_released(job)
    assert proc.num_threads() <= threads  # the telemetry sampler and the capture's thread ended
    # and the next capture works
    steps = capture(job, tmp_path / "c", 0.3)
    assert len(steps) >= 2 and steps == list(range(steps[0], steps[0] + len(steps)))
    wait_state(job, "idle")
    assert_released(job)


def test_job_that_does_not_step_before_the_window_is_never_profiled(job: Job, tmp_path):
    job.hold_file.write_text("")
    try:
        with pytest.raises(xpuprof.XpuprofError, match="HTTP 504.*did not reach"):
            request_capture(job.url, tmp_path / "a", duration=0.3, token=job.token)
        assert status(job)["state"] == "idle"  # nothing was started: nothing to release
    finally:
        job.hold_file.unlink()
    log = job.wait_steps(5)
    assert not any(s.profiler_on or s.hooks for s in log[-5:])
    assert job.leftovers() == []


def test_client_that_leaves_mid_capture_releases_it(job: Job):
    host, port = job.url.removeprefix("http://").rsplit(":", 1)
    body = b'{"duration_s": 30}'
    s = socket.create_connection((host, int(port)), timeout=5)
    s.sendall(
        f"POST /capture HTTP/1.1\r\nAuthorization: Bearer {job.token}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    wait_state(job, "recording")
    t0 = time.time()
    s.close()  # the client is gone, 29 s before the window would end
    wait_state(job, "idle")
    assert time.time() - t0 < 5
    assert_released(job)


def test_repeated_captures_free_their_memory_and_end_in_a_short_step(job: Job, tmp_path):
    """Item 2: the job's RSS stays flat (each capture of the unfixed server kept 70-600 MB);
    item 3: the step that ends the window is short (it stopped and exported the profiler's
    whole trace: about 0.2 s per second of window)."""
    proc = psutil.Process(job.proc.pid)
    rss0 = proc.memory_info().rss
    rss, closing = [], []
    for k in range(4):
        steps = capture(job, tmp_path / f"c{k}", 0.5)
        wait_state(job, "idle")
        rss.append(proc.memory_info().rss)
        closing.append(steps[-1] + 1)  # the xpuprof.step() call that ended the window
    log = {s.n: s for s in job.wait_steps(1)}
    grew = [(r - rss0) / 2**20 for r in rss]
    call_ms = [log[n].call_ns / 1e6 for n in closing]
    usual_ms = statistics.median(s.iter_ns for s in log.values()) / 1e6
    print(f"RSS growth per capture (MiB): {[f'{g:.1f}' for g in grew]}; closing step "
          f"{[f'{c:.1f}' for c in call_ms]} ms; a usual iteration {usual_ms:.1f} ms")  # fmt: skip
    assert max(grew) < 50
    # the closing xpuprof.step() call: under 50 ms (the median of four: one step of a busy
    # machine's scheduler does not decide); unfixed, it took 120-130 ms for these windows
    assert statistics.median(call_ms) < 50
    assert job.leftovers() == []


def test_idle_connections_cannot_exhaust_the_job(job: Job, tmp_path):
    """Item 4: 1,000 idle connections (half of them with half a request) against a job that has
    128 file descriptors: the job keeps stepping at its rate, holds a bounded number of
    descriptors and threads, drops idle clients after its request timeout, and still serves
    an authorised capture while they are connected."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1000
    if soft < want + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, want + 200), hard))
    n = min(want, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 100)
    proc = psutil.Process(job.proc.pid)
    threads = proc.num_threads()
    before = job.wait_steps(20)[-20:]
    host, port = job.url.removeprefix("http://").rsplit(":", 1)
    held: list[socket.socket] = []
    most_fds = 0
    try:
        for i in range(n):
            s = socket.create_connection((host, int(port)), timeout=5)
            if i % 2:
                s.sendall(b"POST /capture HTTP/1.1\r\nAuthorization: Bea")
            held.append(s)
            if i % 100 == 0:
                most_fds = max(most_fds, proc.num_fds())
        during = job.wait_steps(20)[-20:]
        most_fds = max(most_fds, proc.num_fds())
        assert proc.is_running() and job.proc.poll() is None
        assert most_fds <= MAX_CONNECTIONS + 40 < JOB_NOFILE
        assert proc.num_threads() <= threads
        assert status(job)["connections"] <= MAX_CONNECTIONS
        steps = capture(job, tmp_path / "c", 0.3)  # while all of them are still connected
        assert len(steps) >= 2
        # an idle client is dropped after the job's request timeout (1 s here)
        idle = socket.create_connection((host, int(port)), timeout=5)
        t0 = time.time()
        assert idle.recv(1) == b""
        assert time.time() - t0 < 3
        idle.close()
    finally:
        for s in held:
            s.close()
    usual = statistics.median(s.iter_ns for s in before)
    flooded = statistics.median(s.iter_ns for s in during)
    print(f"{n} idle connections: job fds at most {most_fds}, iteration {usual / 1e6:.1f} ms "
          f"before, {flooded / 1e6:.1f} ms during")  # fmt: skip
    assert flooded < 1.5 * usual
    wait_state(job, "idle")
    assert job.leftovers() == []


@pytest.mark.parametrize(
    "request_bytes, status_code",
    [
        (b"POST /capture HTTP/1.1\r\nAuthorization: Bearer TOKEN\r\nContent-Length: -1\r\n\r\n",
         400),
        (b"POST /capture HTTP/1.1\r\nAuthorization: Bearer TOKEN\r\nContent-Length: 1000000000"
         b"\r\n\r\n", 413),
        (b"POST /capture HTTP/1.1\r\nAuthorization: Bearer TOKEN\r\nTransfer-Encoding: chunked"
         b"\r\n\r\n", 411),
        (b"POST /capture HTTP/1.1\r\nAuthorization: Bearer nope\r\nContent-Length: 2\r\n\r\n{}",
         401),
        (b"POST /capture HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 401),
        (b"GET /nowhere HTTP/1.1\r\nAuthorization: Bearer TOKEN\r\n\r\n", 404),
        (b"GARBAGE\r\n\r\n", 400),
        (b"\x00\xff" * 200 + b"\r\n\r\n", 400),
        (b"GET /status HTTP/1.1\r\nX: " + b"a" * 10_000 + b"\r\n\r\n", 431),
    ],
)  # fmt: skip
def test_malformed_requests_are_refused(job: Job, request_bytes: bytes, status_code: int) -> None:
    reply = raw(job, request_bytes.replace(b"TOKEN", job.token.encode()))
    assert code(reply) == status_code, reply[:200]


@pytest.mark.parametrize(
    "body",
    [b"[1, 2]", b"{", b'{"duration_s": NaN}', b'{"duration_s": Infinity}',
     b'{"duration_s": "2"}', b'{"duration_s": true}', b'{"duration_s": -1}',
     b'{"duration_s": 1e9}', b'{"level": "bogus"}', b'"text"'],
)  # fmt: skip
def test_bad_bodies_get_400(job: Job, body: bytes) -> None:
    reply = post(job, body)
    assert code(reply) == 400, reply[:200]
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]


def test_hostile_clients_leave_no_trace_on_the_jobs_stderr(job: Job) -> None:
    """Item 5: clients that leave mid-request or before reading the reply, reset
    connections, junk: the job prints nothing (and every test before this one drove the job
    through abandoned, refused and successful captures: nothing printed then either)."""
    host, port = job.url.removeprefix("http://").rsplit(":", 1)
    status_req = f"GET /status HTTP/1.1\r\nAuthorization: Bearer {job.token}\r\n\r\n".encode()
    for i in range(30):
        s = socket.create_connection((host, int(port)), timeout=5)
        if i % 3 == 0:  # reset the connection right after the request: no reply can be sent
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.sendall(status_req)
        elif i % 3 == 1:  # half a request, then gone
            s.sendall(status_req[:20])
        else:  # a whole request and a reply nobody reads
            s.sendall(status_req + b"junk after the request" * 100)
        s.close()
    body = b'{"duration_s": 5}'
    for _ in range(3):  # captures whose client resets at once
        s = socket.create_connection((host, int(port)), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.sendall(
            f"POST /capture HTTP/1.1\r\nAuthorization: Bearer {job.token}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        s.close()
        wait_state(job, "idle")
    assert_released(job)
    doc = status(job)
    assert doc["errors"] == 0, doc
    err = job.stderr()
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    assert err.strip() == "", err[-3000:]


def test_capture_arguments_are_checked_before_the_job_is_asked(tmp_path) -> None:
    """Item 5: a duration that is not a finite positive number, or an output that cannot be
    created, is one clear error, and the job is never contacted."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        for bad in (float("nan"), float("inf"), -1.0, 0, True):
            with pytest.raises(xpuprof.XpuprofError, match="finite number of seconds"):
                request_capture(url, tmp_path / "x", duration=bad, token="t")
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        with pytest.raises(xpuprof.XpuprofError, match="a-file"):
            request_capture(url, blocker / "store", duration=1.0, token="t")
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
        for text in ("nan", "inf", "-1s"):
            out = cli("capture", url, "--duration", text, "-o", tmp_path / "y", "--token", "t")
            assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
            assert "finite number of seconds" in out.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]

"""On-demand capture of a running job (XProf's ProfileRequest): ``xpuprof.serve`` in the job,
``xpuprof capture URL --duration 2s -o STORE`` from another shell.

How it keeps its promise never to hurt the job (``docs/capture.md`` has the state machine,
the limits and the measurements):

* the server (``live/httpd.py``) is one thread with fixed limits on connections, time and
  request size; it sleeps in the kernel between requests and never prints;
* a capture starts and stops on the job's own thread, at ``xpuprof.step()`` (one check per
  step when no capture is pending): hooks and the framework profiler are only ever touched from
  the thread that runs the model, and the window is whole steps. torch's profiler is cut into
  short segments (``capture/torch.py``), so the step that ends the window only stops the last
  one;
* converting the recorders' spans runs on the capture's own thread, reading the profiler's
  trace, normalising and writing Parquet in a separate, lower-priority process;
* every capture ends in ``idle`` with the profiler released and its temporary folder removed:
  on success, on error, when the client goes away, and when the job stops calling
  ``xpuprof.step()`` (then the profiler is released at its next step: only that thread can).

Security: the server binds 127.0.0.1 unless told otherwise and every request must carry the
token (``Authorization: Bearer TOKEN``); a wrong or missing token gets HTTP 401 and nothing else
happens. A second capture while one runs gets HTTP 409.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hmac
import json
import math
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from xpuprof.core.errors import XpuprofError
from xpuprof.live.client import request_capture
from xpuprof.live.httpd import HANDED_OFF, BoundedHTTPServer, Reply, Request, reply_head

__all__ = ["CaptureServer", "request_capture", "serve"]

#: Longest capture a server accepts (seconds).
MAX_DURATION_S = 600.0
#: How long a capture waits for the job's next ``xpuprof.step()``, to start and to end.
STEP_TIMEOUT_S = 30.0
#: The most that stopping torch's profiler may stall the job at one step (ms): the profiler
#: is restarted at step boundaries to keep each segment this cheap to stop.
SEGMENT_MS = 20.0
#: Limits of the server (``live/httpd.py``).
MAX_CONNECTIONS = 64
REQUEST_TIMEOUT_S = 5.0
#: How long a client may take to receive the store (seconds per send).
SEND_TIMEOUT_S = 60.0
#: Replies of finished captures that may still be on their way when a new capture starts.
MAX_SENDING = 2


class _Capture:
    """One capture's life, moved under ``cond`` by two threads: the capture's own thread
    (:meth:`run`, which answers the client) and the job's thread (:meth:`on_step`).

    ``pending`` → (job steps) ``recording`` → (window over) ``stopping`` → (job steps)
    ``finishing`` → (store sent) ``done``. Every other path also ends in ``done``: from
    ``pending`` when the job does not step in time or the client leaves; through ``releasing``
    (the job's next step stops and discards everything) when the client leaves or the job stops
    stepping while the profiler runs. A capture is over when it is ``done`` and its own thread
    has ended; then its folder is removed and the server is idle again.
    """

    def __init__(self, server: CaptureServer, sock: socket.socket, level: str, duration: float):
        self.server = server
        self.sock = sock
        self.level = level
        self.duration = duration
        self.cond = threading.Condition()
        self.state = "pending"
        self.error = ""
        self.profile: Any = None
        self.halted: Any = None
        self.job_thread: int | None = None
        self.thread_done = False
        self.ending = False
        #: Set once the capture is over: folder removed, the server idle.
        self.over = threading.Event()
        self.workdir = Path(tempfile.mkdtemp(prefix="xpuprof-capture-"))

    # -- the job's thread --------------------------------------------------------------------

    def on_step(self) -> None:
        """Called by ``xpuprof.step()`` on the job's thread; never raises an ``Exception``
        into the job (a capture that fails is reported to its client)."""
        with self.cond:
            state = self.state
            if state not in ("pending", "stopping", "releasing"):
                return
            try:
                if state == "pending":
                    self._start()
                elif state == "stopping":
                    self._halt()
                else:
                    self._abandon()
            except Exception as e:  # the job goes on; the client hears of it
                self._fail(f"{type(e).__name__}: {e}")
            except BaseException:  # KeyboardInterrupt and the like are the job's own
                self._fail("interrupted")
                raise
            finally:
                self.cond.notify_all()
        self._maybe_over()

    def _start(self) -> None:
        from xpuprof.live import profile as prof_mod

        self.job_thread = threading.get_ident()
        p = prof_mod.Profile(
            None,
            level=self.level,
            model=self.server.model,
            workdir=self.workdir / "recorders",
            segment_ms=SEGMENT_MS,
        )
        p.__enter__()
        self.profile = p
        self.state = "recording"

    def _halt(self) -> None:
        self.halted = self.profile.halt()
        self.state = "finishing"
        self._unhook()

    def _abandon(self) -> None:
        self.profile.abandon()
        self.state = "done"
        self._unhook()

    def _fail(self, message: str) -> None:
        """Release whatever was started (under ``cond``) and end in ``done``."""
        self.error = self.error or message
        if self.profile is not None:
            self.profile.abandon()
        self.state = "done"
        self._unhook()

    def _unhook(self) -> None:
        from xpuprof.live import profile as prof_mod

        prof_mod.clear_pending_request(self)

    # -- the capture's own thread ------------------------------------------------------------

    def run(self) -> None:
        """The capture's thread: nothing escapes it (an uncaught error would print a
        traceback into the job's stderr); unexpected errors are counted in ``/status``."""
        try:
            self._run()
        except BaseException as e:
            self.server.http.errors += 1
            self.server.http.last_error = f"capture: {type(e).__name__}: {e}"[:500]

    def _run(self) -> None:
        """Answer the client: wait for the window, have the store written, send it. The
        capture is over (the server idle again) before its reply goes out, so that a client
        may ask for the next one as soon as it has this one."""
        reply: Reply | tuple[int, Path] | None = None
        try:
            reply = self._serve()
        except Exception as e:
            self.server.http.errors += 1
            self.server.http.last_error = f"capture: {type(e).__name__}: {e}"[:500]
            reply = Reply(500, _error(f"the capture failed: {type(e).__name__}: {e}"))
        finally:
            with self.cond:
                if self.state == "pending":  # never started: the job's thread is not needed
                    self.state = "done"
                    self._unhook()
                elif self.state in ("recording", "stopping"):  # give up; the job releases it
                    self._give_up()
                elif self.state == "finishing":
                    self.state = "done"
        store = None
        with self.server.lock:
            self.server.sending += 1
        try:
            if isinstance(reply, tuple):  # open before the folder goes: it stays readable
                store = open(reply[1], "rb")  # noqa: SIM115 - closed below, after sending
            with self.cond:
                self.thread_done = True
            self._maybe_over()
            if store is not None:
                _send(self.sock, (reply[0], store))  # type: ignore[index]
            elif reply is not None:
                _send(self.sock, reply)
        finally:
            with contextlib.suppress(OSError):
                self.sock.close()
            if store is not None:
                store.close()
            with self.server.lock:
                self.server.sending -= 1
            with self.cond:
                self.thread_done = True
            self._maybe_over()

    def _serve(self) -> Reply | tuple[int, Path] | None:
        from xpuprof.live import profile as prof_mod

        prof_mod.set_pending_request(self)
        started = self._wait_while("pending", STEP_TIMEOUT_S)
        if started is None:
            return None  # the client left
        if not started:
            return Reply(504, _error(
                f"the job did not reach xpuprof.step() within {STEP_TIMEOUT_S:g} s; call "
                "xpuprof.step() once per training step to allow captures"))  # fmt: skip
        if self.state == "done":
            return Reply(500, _error(f"the capture could not start: {self.error}"))
        if self._wait_while("recording", self.duration, until_timeout=True) is None:
            return None
        with self.cond:
            if self.state == "recording":
                self.state = "stopping"
        ended = self._wait_while("stopping", STEP_TIMEOUT_S)
        if ended is None:
            return None
        if not ended:
            return Reply(504, _error(
                f"the job stopped calling xpuprof.step() for {STEP_TIMEOUT_S:g} s; capture "
                "abandoned (the profiler is released at the job's next step)"))  # fmt: skip
        if self.state == "done":
            return Reply(500, _error(f"the capture failed: {self.error}"))
        return self._write_store()

    def _wait_while(self, state: str, limit: float, until_timeout: bool = False) -> bool | None:
        """Wait while the capture is in ``state``, at most ``limit`` s: True if it moved on
        (or the time ran out, with ``until_timeout``), False if the time ran out, None if the
        client left (the capture is then given up)."""
        end = time.monotonic() + limit
        with self.cond:
            while self.state == state:
                left = end - time.monotonic()
                if left <= 0:
                    if until_timeout:
                        return True
                    if state == "pending":
                        self.state = "done"
                        self._unhook()
                    elif state == "stopping":
                        self._give_up()
                    return False
                self.cond.wait(min(left, 0.1))
                if _gone(self.sock):
                    self._give_up()
                    return None
        return True

    def _give_up(self) -> None:
        """The client left or the job stopped stepping (under ``cond``): whatever other threads
        may stop stops now; the rest is released at the job's next step."""
        if self.state == "pending":
            self.state = "done"
            self._unhook()
        elif self.state in ("recording", "stopping"):
            self.state = "releasing"
            with contextlib.suppress(Exception):
                self.profile.quiesce()

    def _write_store(self) -> Reply | tuple[int, Path] | None:
        """Convert the recorders' tables here, then normalise and write the store, and tar it,
        in a child process at lower priority: the job keeps its cores."""
        halted = self.halted
        halted.save()
        store, tar = self.workdir / "store", self.workdir / "store.tar"
        child = subprocess.Popen(
            [sys.executable, "-m", "xpuprof.live.remote", "finish", str(halted.workdir),
             str(store), str(tar), str(self.server.finish_nice)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            end = time.monotonic() + 600 + 10 * self.duration
            while True:
                try:
                    _, err = child.communicate(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    if _gone(self.sock) or time.monotonic() > end:
                        child.kill()
                        child.communicate()
                        return None if _gone(self.sock) else Reply(500, _error(
                            "writing the store took too long"))  # fmt: skip
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        if child.returncode != 0:
            text = err.decode(errors="replace").strip()[-500:]
            return Reply(500, _error(f"writing the store failed: {text}"))
        return (200, tar)

    def _maybe_over(self) -> None:
        """Whichever thread finishes last (the capture's or the job's) ends the capture; on
        the job's thread, removing the folder (one file per profiler segment) is left to a
        short-lived thread of its own."""
        with self.cond:
            if self.state != "done" or not self.thread_done or self.ending:
                return
            self.ending = True
        if threading.get_ident() == self.job_thread:
            threading.Thread(target=self._end, name="xpuprof-capture-end", daemon=True).start()
        else:
            self._end()

    def _end(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.server._capture_over(self)
        self.over.set()

    # -- the server closing ------------------------------------------------------------------

    def close_from_job(self) -> None:
        """``server.close()`` on the job's thread: no step will come, so do now what the next
        step would (deliver what was recorded so far, or release)."""
        with self.cond:
            if self.state == "pending":
                self.error = "the job closed its capture server"
                self.state = "done"
                self._unhook()
            elif self.state == "recording":
                self.state = "stopping"
        self.on_step()


def _send(sock: socket.socket, reply: Reply | tuple[int, Any]) -> None:
    """Send a reply (or a status and an open file) on a blocking socket; a client that left
    is nobody's concern."""
    with contextlib.suppress(OSError, ValueError):
        sock.settimeout(SEND_TIMEOUT_S)
        if isinstance(reply, Reply):
            sock.sendall(reply_head(reply.status, len(reply.body), reply.content_type))
            sock.sendall(reply.body)
        else:
            status, f = reply
            size = os.fstat(f.fileno()).st_size
            sock.sendall(reply_head(status, size, "application/x-tar"))
            sock.sendfile(f)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(1.0)  # let the client read the reply before the socket closes
        while sock.recv(65536):
            pass


def _gone(sock: socket.socket) -> bool:
    """Whether the client has closed its side (or the connection broke)."""
    import select

    if hasattr(select, "poll"):  # no FD_SETSIZE limit: a job may hold thousands of files
        p = select.poll()
        p.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        if not p.poll(0):
            return False
    elif not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class CaptureServer:
    """The job's side: the capture server (``xpuprof.serve``). One capture at a time."""

    def __init__(
        self,
        port: int,
        token: str,
        host: str,
        level: str,
        model: Any,
        max_duration: float,
        finish_nice: int = 10,
    ) -> None:
        self.token = token
        self.level = level
        self.model = model
        self.max_duration = max_duration
        self.finish_nice = finish_nice
        self.lock = threading.Lock()
        self._current: _Capture | None = None
        #: Capture threads still sending a reply (their captures are over).
        self.sending = 0
        try:
            self.http = BoundedHTTPServer(
                host, port, authorize=self._authorized, handle=self._handle,
                max_connections=MAX_CONNECTIONS, request_timeout=REQUEST_TIMEOUT_S,
                name="xpuprof-capture-server",
            )  # fmt: skip
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise XpuprofError(
                    f"cannot serve captures: port {port} on {host} is in use"
                ) from None
            raise XpuprofError(f"cannot serve captures on {host}:{port}: {e}") from None
        self.host, self.port = self.http.host, self.http.port
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        """The job exits with a capture in flight: its folder goes with it."""
        cap = self._current
        if cap is not None:
            shutil.rmtree(cap.workdir, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def state(self) -> str:
        """``idle``, or the running capture's state (``pending``, ``recording``,
        ``stopping``, ``finishing``, ``releasing``, ``done``)."""
        cap = self._current
        return "idle" if cap is None else cap.state

    def close(self, wait: float = 120.0) -> None:
        """Stop serving. A capture in flight gets ``wait`` seconds to end; called on the job's
        thread, which no step will follow, it ends at once with what was recorded so far."""
        cap = self._current
        if cap is not None:
            if cap.job_thread in (None, threading.get_ident()):  # no step will start or end it
                cap.close_from_job()
            if not cap.over.wait(wait):
                with cap.cond:
                    cap._give_up()
        self.http.close()
        atexit.unregister(self._at_exit)

    def __enter__(self) -> CaptureServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests (on the server thread: quick) ----------------------------------------------

    def _authorized(self, headers: dict[str, str]) -> bool:
        got = headers.get("authorization", "").encode("utf-8", "replace")
        return hmac.compare_digest(got, f"Bearer {self.token}".encode())

    def _handle(self, req: Request) -> Any:
        if req.method == "GET" and req.path == "/status":
            cap = self._current
            return Reply(200, json.dumps({
                "capturing": cap is not None, "state": self.state, "pid": os.getpid(),
                "connections": self.http.connections, "errors": self.http.errors,
            }).encode())  # fmt: skip
        if req.method != "POST" or req.path != "/capture":
            return Reply(404, _error("unknown request; POST /capture or GET /status"))
        try:
            body = json.loads(req.body or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return Reply(400, _error('the body must be a JSON object: {"duration_s": 2.0}'))
        duration = body.get("duration_s", 2.0)
        if (
            isinstance(duration, bool)
            or not isinstance(duration, int | float)
            or not math.isfinite(duration)
            or not 0 < duration <= self.max_duration
        ):
            return Reply(400, _error(f"duration_s must be a number in (0, {self.max_duration:g}]"))
        level = body.get("level") or self.level
        from xpuprof.live.profile import CAPTURE_LEVELS

        if level not in CAPTURE_LEVELS:
            return Reply(400, _error(f"unknown capture level {level!r}; levels: {CAPTURE_LEVELS}"))
        if level == "layer" and self.model is None:
            return Reply(400, _error("level 'layer' needs the model: xpuprof.serve(model=...)"))
        with self.lock:
            cap = self._current
            if cap is None and self.sending >= MAX_SENDING:
                return Reply(409, _error("earlier captures are still being sent; try again"))
            if cap is not None:
                if cap.state == "releasing":
                    why = ("the last capture was abandoned; the profiler is released at the "
                           "job's next xpuprof.step()")  # fmt: skip
                else:
                    why = "a capture is already running in this job"
                return Reply(409, _error(f"{why}; try again after it"))
            cap = _Capture(self, req.sock, str(level), float(duration))
            self._current = cap
        threading.Thread(target=cap.run, name="xpuprof-capture", daemon=True).start()
        return HANDED_OFF

    def _capture_over(self, cap: _Capture) -> None:
        with self.lock:
            if self._current is cap:
                self._current = None


def serve(
    port: int = 0,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    level: str = "op",
    model: Any = None,
    max_duration: float = MAX_DURATION_S,
    finish_nice: int = 10,
) -> CaptureServer:
    """Serve on-demand captures of this process. Returns the server (``.url``, ``.token``).

    ``token`` defaults to a fresh random one (read it from the returned object); ``port`` 0
    picks a free port. ``model`` enables layer spans in captures. The job must call
    ``xpuprof.step()`` once per step: captures start and stop there. ``finish_nice``: the
    niceness added to the child process that writes each store (the job's steps come first;
    0 writes it sooner on a busy machine).

    What a capture needs in the job is imported here, once, so that no capture imports
    anything on the job's time (pyarrow and xpuprof's recorders: about 0.3 s and 40 MB).

    Kineto (torch's profiler) writes two lines to stderr each time it starts or stops, and a
    remote capture restarts it every few steps: the recorder keeps them out of the job's log
    (:func:`xpuprof.capture.torch.quiet_kineto`), leaving the job's environment as it was.
    """
    _import_what_captures_need()
    return CaptureServer(
        port, token or secrets.token_urlsafe(24), host, level, model, max_duration, finish_nice
    )


def _import_what_captures_need() -> None:
    import importlib

    for name in (
        "pyarrow", "pyarrow.compute", "pyarrow.ipc", "msgspec", "psutil", "tarfile",
        "xpuprof.core.raw", "xpuprof.capture.annotate", "xpuprof.capture.records",
        "xpuprof.capture.telemetry", "xpuprof.live.assemble", "xpuprof.live.profile",
    ):  # fmt: skip
        importlib.import_module(name)
    import pyarrow as pa

    pa.array(["x"], pa.string())  # pyarrow imports pandas on its first conversion of a list
    if "torch" in sys.modules:
        importlib.import_module("xpuprof.capture.torch")


def _main(argv: list[str]) -> int:
    """``python -m xpuprof.live.remote finish WORKDIR STORE TAR NICE``: the out-of-process
    half."""
    if len(argv) != 5 or argv[0] != "finish":
        print("usage: python -m xpuprof.live.remote finish WORKDIR STORE TAR NICE",
              file=sys.stderr)  # fmt: skip
        return 2
    if int(argv[4]) > 0:
        with contextlib.suppress(OSError, AttributeError):
            os.nice(int(argv[4]))  # the job's steps come first
    import tarfile

    from xpuprof.live.assemble import Halted, finish

    finish(Halted.load(Path(argv[1])), argv[2])
    with tarfile.open(argv[3], "w") as tar:
        tar.add(argv[2], arcname="store")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

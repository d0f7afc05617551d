"""On-demand capture of a running job (XProf's ProfileRequest): ``xpuprof.serve`` in the job,
``xpuprof capture URL --duration 2s -o STORE`` from another shell.

How it keeps its promise never to stop or slow the job outside the capture window:

* the server is a thread waiting on its socket (waking twice a second to see whether it should
  stop): it costs the job nothing measurable until a request comes;
* a capture starts and stops on the job's own thread, at the next ``xpuprof.step()`` (one flag
  check per step when no request is pending): hooks and the framework profiler are only ever
  touched from the thread that runs the model, and the window is whole steps;
* after the window the job's thread only stops the recorders; reading the profiler's trace,
  normalising and writing Parquet run in a separate process, so the job keeps its core.

Security: the server binds 127.0.0.1 unless told otherwise and every request must carry the
token (``Authorization: Bearer TOKEN``); a wrong or missing token gets HTTP 401 and nothing else
happens. A second capture while one runs gets HTTP 409.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib import error as urlerror
from urllib import request as urlrequest

from xpuprof.core.errors import XpuprofError

#: Longest capture a server accepts (seconds).
MAX_DURATION_S = 600.0
#: How long a request waits for the job's next step to start the capture.
START_TIMEOUT_S = 30.0


class _Request:
    """One capture, handed from the server thread to the job's thread through ``step()``."""

    def __init__(self, level: str, model: Any) -> None:
        self.level = level
        self.model = model
        self.started = threading.Event()
        self.halted = threading.Event()
        self.stop_requested = False
        self.cancelled = False
        self.profile: Any = None
        self.result: Any = None
        self.error: BaseException | None = None

    def on_step(self) -> None:
        """Called by ``xpuprof.step()`` on the job's thread."""
        from xpuprof.live import profile as prof_mod

        try:
            if self.profile is None:
                if self.cancelled:
                    prof_mod.set_pending_request(None)
                    return
                p = prof_mod.Profile(None, level=self.level, model=self.model)
                p.__enter__()
                self.profile = p
                self.started.set()
            elif self.stop_requested:
                prof_mod.set_pending_request(None)
                self.result = self.profile.halt()
                self.halted.set()
        except BaseException as e:  # reported to the client; the job goes on
            # (a capture that failed to start or to stop has already let go of xpuprof.step)
            self.error = e
            prof_mod.set_pending_request(None)
            self.started.set()
            self.halted.set()


class CaptureServer:
    """The job's side: an HTTP server thread answering capture requests."""

    def __init__(
        self, port: int, token: str, host: str, level: str, model: Any, max_duration: float
    ) -> None:
        self.token = token
        self.level = level
        self.model = model
        self.max_duration = max_duration
        self.busy = threading.Lock()
        handler = _make_handler(self)
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise XpuprofError(
                    f"cannot serve captures: port {port} on {host} is in use"
                ) from None
            raise XpuprofError(f"cannot serve captures on {host}:{port}: {e}") from None
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, name="xpuprof-capture-server", daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self, wait: float = 120.0) -> None:
        """Stop serving; a capture in flight is given ``wait`` seconds to finish first (it
        needs the job to keep calling ``xpuprof.step()`` until its window ends)."""
        if self.busy.acquire(timeout=wait):
            self.busy.release()
        # serve_forever sees a shutdown request only when its select() returns, at the next
        # poll (half a second): wake it with a connection (read as an empty request) instead
        stopper = threading.Thread(target=self.httpd.shutdown, daemon=True)
        stopper.start()
        wake = ("127.0.0.1" if self.host in ("", "0.0.0.0") else self.host, self.port)
        while stopper.is_alive():
            with contextlib.suppress(OSError):
                socket.create_connection(wake, timeout=0.5).close()
            stopper.join(0.05)
        self.httpd.server_close()

    def __enter__(self) -> CaptureServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- a capture ---------------------------------------------------------------------------

    def capture(self, duration: float, level: str) -> bytes:
        """Run one capture on the job's steps and return the store as a tar archive."""
        from xpuprof.live import profile as prof_mod

        req = _Request(level, self.model)
        prof_mod.set_pending_request(req)
        if not req.started.wait(START_TIMEOUT_S):
            req.cancelled = True
            prof_mod.set_pending_request(None)
            if not req.started.is_set():
                raise _HTTPError(
                    504,
                    f"the job did not reach xpuprof.step() within {START_TIMEOUT_S:.0f} s; "
                    "call xpuprof.step() once per training step to allow captures",
                )
        if req.error is not None:
            raise _HTTPError(500, f"the capture could not start: {req.error}")
        threading.Event().wait(duration)
        req.stop_requested = True
        if not req.halted.wait(START_TIMEOUT_S + duration):
            raise _HTTPError(504, "the job stopped calling xpuprof.step(); capture abandoned")
        if req.error is not None:
            raise _HTTPError(500, f"the capture failed: {req.error}")
        halted = req.result
        work = halted.save()
        out = Path(tempfile.mkdtemp(prefix="xpuprof-remote-")) / "store"
        try:
            # normalise and write in another process: the job keeps its core and its GIL
            done = subprocess.run(
                [sys.executable, "-m", "xpuprof.live.remote", "finish", str(work), str(out)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise _HTTPError(500, f"writing the store failed: {done.stderr.strip()[-500:]}")
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(out, arcname="store")
            return buf.getvalue()
        finally:
            halted.cleanup()
            shutil.rmtree(out.parent, ignore_errors=True)


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _make_handler(server: CaptureServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: Any) -> None:  # the job's stderr is not ours
            pass

        def _reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status: int, message: str) -> None:
            self._reply(status, json.dumps({"error": message}).encode())

        def _authorized(self) -> bool:
            got = self.headers.get("Authorization", "")
            want = f"Bearer {server.token}"
            if not hmac.compare_digest(got.encode(), want.encode()):
                self._error(401, "missing or wrong token")
                return False
            return True

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path != "/status":
                self._error(404, "unknown path; POST /capture or GET /status")
                return
            busy = not server.busy.acquire(blocking=False)
            if not busy:
                server.busy.release()
            self._reply(200, json.dumps({"capturing": busy, "pid": os.getpid()}).encode())

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if self.path != "/capture":
                self._error(404, "unknown path; POST /capture or GET /status")
                return
            try:
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n) or b"{}")
                duration = float(body.get("duration_s", 2.0))
                level = str(body.get("level", server.level))
            except (ValueError, TypeError):
                self._error(400, 'the body must be JSON: {"duration_s": 2.0, "level": "op"}')
                return
            if not 0 < duration <= server.max_duration:
                self._error(400, f"duration_s must be in (0, {server.max_duration:g}]")
                return
            if not server.busy.acquire(blocking=False):
                self._error(409, "a capture is already running in this job; try again after it")
                return
            try:
                data = server.capture(duration, level)
            except _HTTPError as e:
                self._error(e.status, str(e))
                return
            finally:
                server.busy.release()
            self._reply(200, data, "application/x-tar")

    return Handler


def serve(
    port: int = 0,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    level: str = "op",
    model: Any = None,
    max_duration: float = MAX_DURATION_S,
) -> CaptureServer:
    """Serve on-demand captures of this process. Returns the server (``.url``, ``.token``).

    ``token`` defaults to a fresh random one (read it from the returned object); ``port`` 0
    picks a free port. ``model`` enables layer spans in captures. The job must call
    ``xpuprof.step()`` once per step: captures start and stop there.
    """
    return CaptureServer(port, token or secrets.token_urlsafe(24), host, level, model, max_duration)


def request_capture(
    url: str,
    out: str | Path,
    *,
    duration: float,
    token: str | None,
    level: str | None = None,
    timeout: float | None = None,
) -> Path:
    """The client's side: ask the job at ``url`` for a capture and unpack it as store ``out``."""
    from xpuprof.trace.store import read_manifest

    root = Path(out).resolve()
    if root.exists() and (root.is_file() or any(root.iterdir())):
        raise XpuprofError(f"{root}: exists and is not empty; not overwriting it")
    if not token:
        raise XpuprofError("a capture needs the job's token: --token TOKEN or XPUPROF_TOKEN")
    body = {"duration_s": duration}
    if level:
        body["level"] = level
    req = urlrequest.Request(
        url.rstrip("/") + "/capture",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urlrequest.urlopen(req, timeout=timeout or duration + 2 * START_TIMEOUT_S + 60) as r:
            data = r.read()
    except urlerror.HTTPError as e:
        try:
            msg = json.loads(e.read()).get("error", "")
        except ValueError:
            msg = ""
        raise XpuprofError(f"{url}: HTTP {e.code}: {msg or e.reason}") from None
    except (urlerror.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise XpuprofError(f"{url}: cannot reach the capture server ({reason})") from None
    from xpuprof.trace.ingest import abandon_staging, begin_staging

    staging, made = begin_staging(root)
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(staging, filter="data")
        read_manifest(staging / "store")  # a complete store, or an error
        if root.exists():
            root.rmdir()
        os.replace(staging / "store", root)
    except BaseException:
        abandon_staging(staging, made)
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return root


def _main(argv: list[str]) -> int:
    """``python -m xpuprof.live.remote finish WORKDIR STORE``: the out-of-process half."""
    if len(argv) != 3 or argv[0] != "finish":
        print("usage: python -m xpuprof.live.remote finish WORKDIR STORE", file=sys.stderr)
        return 2
    from xpuprof.live.profile import Halted, finish

    finish(Halted.load(Path(argv[1])), argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

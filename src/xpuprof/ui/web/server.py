"""Running the web UI: :func:`serve` (``xpuprof ui``; blocks until Ctrl-C) and
:func:`running` (a server in a background thread, for tests and benchmarks).

The address is checked before anything listens (:func:`xpuprof.ui.web.security.check_bind`):
a non-loopback address without a token is an error. Port 0 picks a free port; the address the
server listens on is printed (with ``?token=…`` when there is a token, so it can be opened).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from xpuprof.core.errors import XpuprofError
from xpuprof.core.text import plural
from xpuprof.ui.web.security import check_bind


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); a port in use is one clear error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise XpuprofError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise XpuprofError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket, token: str | None = None) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={quote(token, safe='')}" if token else "")


def _server(app: Any) -> Any:
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=3, limit_concurrency=256,
                            server_header=False)  # fmt: skip
    return uvicorn.Server(config)


def serve(root: str | Path, *, host: str = "127.0.0.1", port: int = 8765,
          token: str | None = None, prefetch: int = 1) -> None:  # fmt: skip
    """Serve the web UI over ``root`` (a store, or a directory of stores) until interrupted;
    :class:`XpuprofError` for a non-loopback ``host`` without ``token``, a root that holds no
    store, or a port that cannot be listened on. ``prefetch``: how many stores' overviews to
    compute in the background as the server starts (0: none)."""
    from xpuprof.ui.web.app import create_app

    check_bind(host, token)
    app = create_app(Path(root), token=token)
    n = len(app.state.catalog.names())
    if not n:
        raise XpuprofError(f"{root}: no store here (a store, or a directory of stores)")
    sock = _bind(host, port)
    print(f"xpuprof ui: {plural(n, 'store')} at {url_of(sock, token)}  (Ctrl-C stops)",
          flush=True)  # fmt: skip
    if prefetch > 0:
        app.state.prefetch(prefetch)
    try:
        _server(app).run(sockets=[sock])
    finally:
        sock.close()


@contextlib.contextmanager
def running(root: str | Path, *, host: str = "127.0.0.1", port: int = 0,
            token: str | None = None, app: Any = None) -> Iterator[str]:  # fmt: skip
    """A server in a background thread, for tests and benchmarks: yields its base URL
    (``http://127.0.0.1:PORT/``) and stops it, on every path, when the block ends."""
    from xpuprof.ui.web.app import create_app

    check_bind(host, token)
    app = app or create_app(Path(root), token=token)
    sock = _bind(host, port)
    server = _server(app)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as e:  # reported to the caller below
            failed.append(e)

    thread = threading.Thread(target=run, name="xpuprof-ui", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if failed or not thread.is_alive():
                raise XpuprofError(f"the web UI did not start: {failed[:1]}")
            if time.monotonic() > deadline:
                raise XpuprofError("the web UI did not start within 30 s")
            time.sleep(0.01)
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        if thread.is_alive():
            print("xpuprof ui: the server thread did not stop", file=sys.stderr)

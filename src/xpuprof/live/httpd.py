"""A small HTTP/1.1 server that is safe to run inside someone else's process.

``xpuprof.serve`` runs in a training job, so its server must not be able to take the job's
threads, file descriptors or memory, whatever clients do. ``http.server`` holds one thread per
connection for as long as the client likes (no timeout), so idle connections exhaust the job's
descriptors; this server is one thread over ``selectors`` with fixed limits instead:

* at most ``max_connections`` connections are open; a new one beyond that replaces the
  oldest connection that has not yet sent a whole request (an idle client is dropped, a
  client that has sent its request is never dropped for a newcomer);
* a client has ``request_timeout`` seconds from connecting to send its whole request, and as
  long again to take the reply; then it is dropped;
* the request head is at most ``max_head`` bytes and the body at most ``max_body`` bytes
  (``Content-Length`` must be a plain decimal number); anything else is refused with 4xx;
* the token is checked on the head, before any body is read;
* nothing is ever printed: the job's stderr is not ours. Unexpected errors are counted in
  :attr:`BoundedHTTPServer.errors` (with the last one's text) and the connection is closed.

A handler that needs time (a capture) takes the connection over (:data:`HANDED_OFF`) and
answers it from its own thread; everything else is answered by the server thread at once.
When no connection is open the thread sleeps in the kernel: nothing wakes it periodically.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

#: What a handler returns when it has taken the connection over.
HANDED_OFF = object()

#: accept() errors that mean "out of descriptors or memory now": accepting pauses a moment.
_NO_ROOM = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: After a reply, how long the server keeps reading (and discarding) what the client still
#: sends before closing: closing with unread data resets the connection, and the client could
#: lose the reply.
LINGER_S = 1.0


@dataclass
class Request:
    """One complete request; ``sock`` is the connection (a handler that returns
    :data:`HANDED_OFF` owns it from then on, in blocking mode)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    sock: socket.socket


@dataclass
class Reply:
    status: int
    body: bytes = b""
    content_type: str = "application/json"


def reply_head(status: int, length: int, content_type: str) -> bytes:
    """The status line and headers of a reply that closes the connection after its body."""
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
    return (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode("latin-1")


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    head: tuple[str, str, dict[str, str]] | None = None
    need: int = 0  # body bytes expected
    out: memoryview | None = None
    lingering: bool = False


class BoundedHTTPServer:
    """The server thread. ``authorize(headers)`` decides on the head alone (False: 401);
    ``handle(request)`` returns a :class:`Reply` or :data:`HANDED_OFF`. Both run on the
    server thread and must be quick."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        authorize: Callable[[dict[str, str]], bool],
        handle: Callable[[Request], Any],
        max_connections: int = 64,
        request_timeout: float = 5.0,
        max_head: int = 8192,
        max_body: int = 4096,
        name: str = "xpuprof-http",
    ) -> None:
        self.authorize = authorize
        self.handle = handle
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.max_head = max_head
        self.max_body = max_body
        #: Unexpected errors met (the connection concerned was closed), and the last one.
        self.errors = 0
        self.last_error = ""
        #: Connections accepted, and dropped (idle too long, replaced, or refused).
        self.accepted = 0
        self.dropped = 0
        self._conns: dict[socket.socket, _Conn] = {}
        self._closing = False
        self._paused_until = 0.0
        self._listener = socket.create_server((host, port), backlog=128)
        try:
            self._listener.setblocking(False)
            self._sel = selectors.DefaultSelector()
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._sel.register(self._listener, selectors.EVENT_READ, "listen")
            self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        except BaseException:
            self._listener.close()
            raise
        self.host, self.port = self._listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        """Connections open now (a handed-off one no longer counts)."""
        return len(self._conns)

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving: every open connection is closed, the port released."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout)

    # -- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closing:
                for key, mask in self._sel.select(self._timeout()):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(64)
                    else:
                        self._guarded(key.data, mask)
                self._expire()
        except BaseException as e:  # never print into the job's stderr
            self._note(e)
        finally:
            self._shutdown()

    def _timeout(self) -> float | None:
        now = time.monotonic()
        times = [c.deadline for c in self._conns.values()]
        if self._paused_until:
            times.append(self._paused_until)
        return max(0.0, min(times) - now) if times else None

    def _guarded(self, conn: _Conn, mask: int) -> None:
        try:
            if mask & selectors.EVENT_READ:
                self._read(conn)
            if mask & selectors.EVENT_WRITE and conn.sock in self._conns:
                self._write(conn)
        except Exception as e:  # one connection's trouble never stops the server
            self._note(e)
            self._drop(conn)

    def _note(self, e: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(e).__name__}: {e}"[:500]

    # -- connections -------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(64):  # then let the other connections have their turn
            try:
                sock, _addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in _NO_ROOM:  # the process is out of descriptors: back off
                    self._sel.unregister(self._listener)
                    self._paused_until = time.monotonic() + 0.1
                    return
                continue  # ECONNABORTED and the like: that client only
            self.accepted += 1
            if len(self._conns) >= self.max_connections and not self._evict():
                self.dropped += 1
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic() + self.request_timeout)
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _evict(self) -> bool:
        """Drop the oldest connection that has not sent a whole request (or is lingering)."""
        for conn in self._conns.values():
            if conn.lingering or conn.out is None:
                self._drop(conn)
                return True
        return False

    def _expire(self) -> None:
        if self._paused_until and time.monotonic() >= self._paused_until:
            self._paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._drop(conn)

    def _drop(self, conn: _Conn, counted: bool = True) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        if counted and not conn.lingering:
            self.dropped += 1
        with contextlib.suppress(Exception):
            self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _shutdown(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn, counted=False)
        for s in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(Exception):
                s.close()
        with contextlib.suppress(Exception):
            self._sel.close()

    # -- reading a request -------------------------------------------------------------------

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        if not data:  # the client is gone (or done, after a reply)
            self._drop(conn, counted=not conn.lingering)
            return
        if conn.lingering or conn.out is not None:
            return  # after the request: read and discarded
        conn.buf += data
        if conn.head is None:
            end = conn.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.buf) > self.max_head:
                    self._reply(conn, Reply(431, _json("the request head is too large")))
                return
            if end > self.max_head:
                self._reply(conn, Reply(431, _json("the request head is too large")))
                return
            head = bytes(conn.buf[:end])
            del conn.buf[: end + 4]
            early = self._parse_head(conn, head)
            if early is not None:
                self._reply(conn, early)
                return
        if len(conn.buf) >= conn.need:
            self._dispatch(conn)

    def _parse_head(self, conn: _Conn, head: bytes) -> Reply | None:
        """Parse the head into ``conn``; a reply to send instead when it is refused."""
        bad = Reply(400, _json("malformed HTTP request"))
        try:
            lines = head.decode("latin-1").split("\r\n")
        except ValueError:
            return bad
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
            return bad
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or line[:1] in (" ", "\t"):
                return bad
            key = name.lower()
            value = value.strip()
            if key in headers and key == "content-length" and headers[key] != value:
                return bad
            headers[key] = value
        conn.head = (parts[0].upper(), parts[1], headers)
        if not self.authorize(headers):
            return Reply(401, _json("missing or wrong token"))
        if "transfer-encoding" in headers:
            return Reply(411, _json("send the body with a Content-Length, not chunked"))
        length = headers.get("content-length", "0")
        if not (length.isascii() and length.isdigit()) or len(length) > 12:
            return Reply(400, _json("Content-Length must be a non-negative decimal number"))
        conn.need = int(length)
        if conn.need > self.max_body:
            return Reply(413, _json(f"the body may be at most {self.max_body} bytes"))
        return None

    def _dispatch(self, conn: _Conn) -> None:
        assert conn.head is not None
        method, path, headers = conn.head
        body = bytes(conn.buf[: conn.need])
        request = Request(method, path, headers, body, conn.sock)
        try:
            answer = self.handle(request)
        except Exception as e:
            self._note(e)
            answer = Reply(500, _json("internal error in the capture server"))
        if answer is HANDED_OFF:
            self._conns.pop(conn.sock, None)
            self._sel.unregister(conn.sock)
            conn.sock.setblocking(True)
            return
        self._reply(conn, answer)

    # -- writing a reply ---------------------------------------------------------------------

    def _reply(self, conn: _Conn, reply: Reply) -> None:
        data = reply_head(reply.status, len(reply.body), reply.content_type) + reply.body
        conn.out = memoryview(data)
        conn.deadline = time.monotonic() + self.request_timeout
        self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return
        except OSError:  # the client left: nothing to tell anyone
            self._drop(conn, counted=False)
            return
        conn.out = conn.out[sent:]
        if len(conn.out):
            return
        # all sent: close our side, and read what the client still sends until it closes
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)
        conn.lingering = True
        conn.deadline = time.monotonic() + LINGER_S
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)


def _json(message: str) -> bytes:
    import json

    return json.dumps({"error": message}).encode()

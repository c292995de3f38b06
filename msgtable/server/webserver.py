"""A WSGI app on ``HOST:PORT``: the dashboard (``--http``) and the metrics
(``--metrics-listen``) are each one.

cheroot serves the app from a small pool of threads (no thread made per request; keep-alive
connections, as Prometheus's scrapes use) on a thread of its own. ``open()`` binds the port,
so a bad address or a port in use is one line naming the flag, before anything is served;
``open()`` and ``close()`` are idempotent, and ``close()`` waits for the serving thread.

Each answer goes to the socket in one write, its headers with its body (cheroot writes each
as it comes): a server killed while it answers leaves its client the whole answer (one that
fits the socket's buffer, as every answer but a large ReceiveMessage does) or nothing, never
the headers alone, which botocore takes for an answer with an empty body (a
DeleteMessageBatch that committed, naming no entry). Every app here answers whole; a
streamed answer would be held until its end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from cheroot import wsgi

from msgtable.errors import InvalidArgument

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
SHUTDOWN_S = 1  # how long close() lets a request in progress finish


def parse_listen(listen: str, flag: str, example: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6; an empty host is every address) as (host,
    port); InvalidArgument naming ``flag`` otherwise."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"{flag} {listen!r}: expected HOST:PORT, e.g. {example}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)


class _Held:
    """What an answer writes, held to go to the socket at once (_WholeAnswers)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)


class _WholeAnswers(wsgi.Gateway_10):
    """cheroot's WSGI gateway, its writes held until the answer is whole (module
    docstring). An app that fails writes nothing: cheroot closes the connection."""

    def respond(self) -> None:
        conn = self.req.conn
        out, held = conn.wfile, _Held()
        conn.wfile = held
        try:
            super().respond()
        finally:
            conn.wfile = out
        out.write(b"".join(held.parts))


class WebServer:
    """``app`` served on (host, port) while open (see the module docstring)."""

    def __init__(
        self, app: WsgiApp, host: str, port: int, flag: str, threads: int, name: str
    ) -> None:
        self.app = app
        self.host, self.port = host, port
        self.flag = flag  # what an error names: the command-line flag of the address
        self.threads = threads
        self.name = name  # the serving thread's
        self._lock = threading.Lock()
        self._server: wsgi.Server | None = None
        self._thread: threading.Thread | None = None
        self._bound = port

    @property
    def address(self) -> str:
        """Where it listens (the port bound, when asked for port 0)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self._bound}"

    def open(self) -> None:
        """Listen (InvalidArgument, one line, when it cannot) and start serving."""
        with self._lock:
            if self._server is not None:
                return
            server = wsgi.Server((self.host, self.port), self.app, numthreads=self.threads)
            server.shutdown_timeout = SHUTDOWN_S
            server.gateway = _WholeAnswers
            try:
                server.prepare()  # binds: a bad address or a port in use fails here
            except (OSError, ValueError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                why = why.rsplit("] ", 1)[-1].rstrip(")") if "[Errno" in why else why
                raise InvalidArgument(
                    f"{self.flag} {self.host}:{self.port}: cannot listen there ({why})"
                ) from None
            assert server.socket is not None
            self._bound = int(server.socket.getsockname()[1])
            self._server = server
            self._thread = threading.Thread(target=server.serve, daemon=True, name=self.name)
            self._thread.start()

    def close(self) -> None:
        with self._lock:
            server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is not None:
            server.stop()
        if thread is not None:
            thread.join()


class Served:
    """A server built on a WebServer (its ``web``): where it listens, through it."""

    web: WebServer

    @property
    def host(self) -> str:
        return self.web.host

    @property
    def port(self) -> int:
        return self.web.port

    @property
    def address(self) -> str:
        """Where it listens (the port bound, when asked for port 0)."""
        return self.web.address

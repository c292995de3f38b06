"""A push endpoint for the tests: a real threaded HTTP server on 127.0.0.1.

It verifies each request's Standard Webhooks signature with its own HMAC code (independent
of msgtable.features.push.body), parses the CloudEvents batch, records every event, and on command
answers 500 / any status (with headers) / hangs / goes away (closes its socket and every
connection) / comes back on the same port.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOLERANCE_S = 300  # Standard Webhooks: a timestamp this far off is refused


def secret_key(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[6:])
    return secret.encode()


def expected_signature(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """The spec's recipe, written out: base64(HMAC-SHA256(key, id.timestamp.body))."""
    mac = hmac.new(
        secret_key(secret),
        msg_id.encode() + b"." + timestamp.encode() + b"." + body,
        hashlib.sha256,
    )
    return "v1," + base64.b64encode(mac.digest()).decode()


@dataclass
class Received:
    """One event as it arrived."""

    event: dict[str, Any]
    at_ns: int
    webhook_id: str
    path: str
    at_mono: float = 0.0  # time.monotonic() (one clock for every process of the machine)


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class Receiver:
    """See the module docstring. ``answer`` decides each reply (thread-safe to change)."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.lock = threading.Lock()
        self.events: list[Received] = []
        self.requests = 0
        self.bad_signatures: list[str] = []
        self.bad_bodies: list[str] = []
        self.answers: dict[str, Answer] = {}  # path -> answer (default: 200)
        self.hang_paths: set[str] = set()
        self.slow_s: dict[str, float] = {}  # path -> seconds before it answers
        self._unhang = threading.Event()
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self.content_types: set[str] = set()
        self.connections = 0  # TCP connections accepted (keep-alive: few)

    # -- control ---------------------------------------------------------------------------
    def start(self, tls: tuple[str, str] | None = None) -> Receiver:
        """Serve (HTTPS with ``tls``: a certificate file and its key file)."""
        receiver = self
        self._tls = tls if tls is not None else getattr(self, "_tls", None)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with receiver.lock:
                    receiver._conns.add(self.connection)
                    receiver.connections += 1

            def finish(self) -> None:
                with receiver.lock:
                    receiver._conns.discard(self.connection)
                super().finish()

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                receiver._handle(self)

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        if self._tls is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(*self._tls)
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        scheme = "https" if getattr(self, "_tls", None) else "http"
        return f"{scheme}://{host}:{self.port}{path}"

    def answer(self, status: int, path: str = "/hook", body: bytes = b"", **headers: str) -> None:
        with self.lock:
            self.answers[path] = Answer(
                status, {k.replace("_", "-"): v for k, v in headers.items()}, body
            )

    def answer_ok(self, path: str = "/hook") -> None:
        with self.lock:
            self.answers.pop(path, None)

    def slow(self, seconds: float, path: str = "/hook") -> None:
        with self.lock:
            self.slow_s[path] = seconds

    def hang(self, path: str = "/hook") -> None:
        self._unhang.clear()
        with self.lock:
            self.hang_paths.add(path)

    def unhang(self) -> None:
        with self.lock:
            self.hang_paths.clear()
        self._unhang.set()

    def go_away(self) -> None:
        """Close the listening socket and every connection: connections are refused."""
        server = self._server
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self.lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        self._server = None

    def come_back(self) -> None:
        self.start()

    def stop(self) -> None:
        self.unhang()
        self.go_away()

    # -- what arrived ------------------------------------------------------------------------
    def ids(self, path: str | None = None) -> list[int]:
        with self.lock:
            return [
                int(r.event["data"]["id"]) for r in self.events if path is None or r.path == path
            ]

    def received(self) -> list[Received]:
        with self.lock:
            return list(self.events)

    # -- a request ---------------------------------------------------------------------------
    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("content-length", "0"))
        body = h.rfile.read(length)
        path = h.path
        with self.lock:
            self.requests += 1
            hang = path in self.hang_paths
            answer = self.answers.get(path, Answer())
            slow_s = self.slow_s.get(path, 0.0)
        if slow_s:
            time.sleep(slow_s)  # then answers as it would have
        if hang:
            self._unhang.wait(120)
            self._reply(h, 503)
            return
        msg_id = h.headers.get("webhook-id", "")
        ts = h.headers.get("webhook-timestamp", "")
        sigs = h.headers.get("webhook-signature", "").split()
        want = expected_signature(self.secret, msg_id, ts, body)
        if (
            not msg_id
            or not ts.isdigit()
            or abs(time.time() - int(ts)) > TOLERANCE_S
            or (want not in sigs)
        ):
            with self.lock:
                self.bad_signatures.append(msg_id)
            self._reply(h, 401, b"bad signature")
            return
        try:
            events = json.loads(body)
            assert isinstance(events, list) and events
            for e in events:
                for attr in ("specversion", "id", "source", "type", "time", "data"):
                    assert attr in e, attr
                assert e["specversion"] == "1.0"
        except (ValueError, AssertionError) as exc:
            with self.lock:
                self.bad_bodies.append(repr(exc))
            self._reply(h, 400, b"bad body")
            return
        if answer.status < 300:
            now, mono = time.time_ns(), time.monotonic()
            with self.lock:
                self.content_types.add(h.headers.get("content-type", ""))
                self.events.extend(Received(e, now, msg_id, path, mono) for e in events)
        self._reply(h, answer.status, answer.body, answer.headers)

    @staticmethod
    def _reply(
        h: BaseHTTPRequestHandler,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> None:
        try:
            h.send_response(status)
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.send_header("content-length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except OSError:
            pass

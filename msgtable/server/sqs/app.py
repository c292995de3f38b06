"""The SQS API on ``--sqs-listen HOST:PORT``: the WSGI app (one request, one action) and the
server that runs it beside the gRPC server.

Every request is answered in SQS's JSON (errors in SQS's shape, msgtable.server.sqs.protocol)
and counted by action and outcome (``ok`` or the error code; ``forwarded`` for a call
answered by the table's sender, msgtable.server.sqs.forward) for /metrics, ``msgtable
tables`` and the dashboard. With an auth file (``--auth``), each request must be signed
(SigV4) by an access key of its ``[access_keys]``; without one every caller is anonymous and
allowed everything, as over gRPC.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa

from msgtable.errors import MsgtableError
from msgtable.server.auth import ANONYMOUS, Authorizer
from msgtable.server.sqs import signature
from msgtable.server.sqs.actions import DEFAULT_MAX_MESSAGE_BYTES, Actions, Caller, Engine
from msgtable.server.sqs.forward import Answer, Elsewhere, forward, forwarded
from msgtable.server.sqs.protocol import (
    JSON_CONTENT_TYPE,
    MAX_REQUEST_BODY_BYTES,
    TARGET_PREFIX,
    Params,
    SqsError,
    parse_body,
    sqs_error,
)
from msgtable.server.sqs.sender import Sender
from msgtable.server.webserver import Served, WebServer, parse_listen
from msgtable.store.sqsqueues import QueueTables

log = logging.getLogger(__name__)

FLAG = "--sqs-listen"
THREADS = 64  # requests served at once (a long-polling receive holds one for its wait)
_STATUS_TEXT = {
    200: "200 OK",
    400: "400 Bad Request",
    403: "403 Forbidden",
    404: "404 Not Found",
    413: "413 Payload Too Large",
    500: "500 Internal Server Error",
    503: "503 Service Unavailable",
}


class SqsApp:
    """The WSGI app of the API (see the module docstring)."""

    def __init__(self, actions: Actions, authorizer: Authorizer | None) -> None:
        self.actions = actions
        self.authorizer = authorizer
        self._lock = threading.Lock()
        self.calls: Counter[tuple[str, str]] = Counter()  # (action, outcome) -> requests

    def counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.calls)

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        action = self._action(environ)
        content: list[tuple[str, str]] = [("Content-Type", JSON_CONTENT_TYPE)]
        try:
            body = self._answer(environ, action)
            if isinstance(body, Answer):
                status, payload, extra, content = body.status, body.body, body.headers, []
                outcome = "forwarded"
            else:
                status, payload, extra = 200, json.dumps(body).encode(), []
                outcome = "ok"
        except SqsError as exc:
            status, payload, extra, outcome = exc.status, exc.body(), exc.headers(), exc.code
        except MsgtableError as exc:
            err = sqs_error(exc)
            status, payload, extra, outcome = err.status, err.body(), err.headers(), err.code
        except Exception:
            log.exception("sqs: %s failed", action)
            err = SqsError(
                "InternalFailure", "internal server error (details are in the server log)", 500
            )
            status, payload, extra, outcome = err.status, err.body(), err.headers(), err.code
        with self._lock:
            self.calls[(action, outcome)] += 1
        headers = [*content, ("Content-Length", str(len(payload))), *extra]
        if not any(k.lower() == "x-amzn-requestid" for k, _ in extra):
            headers.append(("x-amzn-RequestId", str(uuid.uuid4())))
        start_response(_STATUS_TEXT.get(status, f"{status} Error"), headers)
        return [payload]

    def _action(self, environ: dict[str, Any]) -> str:
        """The action a request names ("unknown" for none the API has: metrics' label)."""
        target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
        action = target[len(TARGET_PREFIX) :] if target.startswith(TARGET_PREFIX) else ""
        return action if action in self.actions.handlers else "unknown"

    def _answer(self, environ: dict[str, Any], action: str) -> dict[str, Any] | Answer:
        target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
        known = action != "unknown"
        if environ.get("REQUEST_METHOD") != "POST":
            raise SqsError("InvalidAction", "the SQS API takes POST requests (the JSON protocol)")
        body = _read_body(environ)
        if not known:
            raise SqsError(
                "UnknownOperationException",
                f"unknown operation {target[:100]!r}: expected X-Amz-Target AmazonSQS.<Action>",
            )
        principal = self._principal(environ, body)
        host = (
            environ.get("HTTP_HOST") or f"{environ.get('SERVER_NAME')}:{environ.get('SERVER_PORT')}"
        )
        params = Params(parse_body(body))
        caller = Caller(principal, host, forwarded(environ))
        try:
            return self.actions.handlers[action](params, caller)
        except Elsewhere as to:  # the table's sender answers it
            return forward(to, environ, body)

    def _principal(self, environ: dict[str, Any], body: bytes) -> str:
        if self.authorizer is None:
            return ANONYMOUS
        raw_uri = (
            environ.get("REQUEST_URI") or environ.get("RAW_URI") or environ.get("PATH_INFO", "/")
        )
        path, _, query = str(raw_uri).partition("?")
        request = signature.Request(
            environ.get("REQUEST_METHOD", ""), path, query, _headers(environ), body
        )
        now = datetime.datetime.now(datetime.UTC)
        return signature.verify(request, self.authorizer.access_keys, now)


def _headers(environ: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            out[key[5:].replace("_", "-").lower()] = str(value)
    for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(key):
            out[key.replace("_", "-").lower()] = str(environ[key])
    return out


def _read_body(environ: dict[str, Any]) -> bytes:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise SqsError("InvalidParameterValue", "Content-Length is not a number") from None
    if length < 0:
        raise SqsError("InvalidParameterValue", "Content-Length is negative")
    if length > MAX_REQUEST_BODY_BYTES:
        raise SqsError(
            "RequestEntityTooLarge",
            f"a request may be at most {MAX_REQUEST_BODY_BYTES} bytes, not {length}",
            413,
        )
    data: bytes = environ["wsgi.input"].read(length) if length else b""
    return data


class SqsServer(Served):
    """The SQS API served on ``listen`` while open (its actions over ``engine``)."""

    def __init__(
        self,
        engine: Engine,
        dsn: str,
        listen: str,
        authorizer: Authorizer | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        threads: int = THREADS,
        manage: bool = False,
    ) -> None:
        host, port = parse_listen(listen, FLAG, "127.0.0.1:9324")
        self.sender = Sender(dsn, lambda table: engine.binlog_insert(table, 0))
        # CreateQueue, DeleteQueue, PurgeQueue: only with --sqs-manage (DDL in the database)
        self.tables = QueueTables(sa.create_engine(dsn, pool_pre_ping=True)) if manage else None
        self.actions = Actions(
            engine, self.sender, authorizer, max_message_bytes, tables=self.tables
        )
        self.app = SqsApp(self.actions, authorizer)
        self.web = WebServer(self.app, host, port, FLAG, threads, "msgtable-sqs")

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def calls(self) -> dict[tuple[str, str], int]:
        """Requests answered, by (action, outcome): "ok" or the SQS error code."""
        return self.app.counts()

    def calls_by_action(self) -> dict[str, int]:
        """Requests answered since the server started, by action (every outcome)."""
        out: Counter[str] = Counter()
        for (action, _), n in self.app.counts().items():
            out[action] += n
        return dict(out)

    def receives_waiting(self) -> int:
        return self.actions.consumer.receivers()

    def open(self) -> None:
        self.actions.open()
        try:
            self.web.open()
        except Exception:
            self.actions.close()
            raise

    def close(self) -> None:
        self.actions.close()  # waiting receives end first, then the server stops
        self.web.close()
        self.sender.close()
        if self.tables is not None:
            self.tables.close()


def open_sqs(
    engine: Engine, dsn: str, args: Any, authorizer: Authorizer | None, out: Any
) -> SqsServer | None:
    """``msgtable serve``'s SQS API, when ``--sqs-listen`` asks for it: open (a port in use is
    one line naming the flag), and said where on ``out``; None without the flag."""
    listen = getattr(args, "sqs_listen", None)
    if not listen:
        return None
    server = SqsServer(
        engine,
        dsn,
        listen,
        authorizer,
        args.sqs_max_message_bytes,
        manage=getattr(args, "sqs_manage", False),
    )
    server.open()
    print(f"sqs on {server.url}", file=out, flush=True)
    if authorizer is None and not _loopback(server.host):
        log.warning(
            "sqs: anyone who reaches %s may send, receive and delete messages of every table "
            "(no --auth): bind it to a private address",
            server.address,
        )
    return server


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")

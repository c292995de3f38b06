"""One endpoint's HTTP connections: a urllib3 pool (thread-safe, keep-alive), no redirects,
no retries (the table's backoff retries), connect and read time-outs, certificates verified
(the system's CAs, or ``--push-ca-file``), and every connection only to an address the
allow-list allows (msgtable.features.push.allow: checked after resolving, so a name that comes to
resolve to an internal address gets no connection).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import NewConnectionError
from urllib3.util import connection as u3conn

from msgtable.features.push.allow import AllowList, Target

MAX_ANSWER_BYTES = 4096  # of an answer's body, read for the reason of a failure


class AddressNotAllowed(NewConnectionError):
    """The endpoint's name resolved to no address the allow-list allows."""


def _checked_conn(conn: Any) -> socket.socket:
    """urllib3's ``_new_conn``, connecting only to allowed addresses."""
    allow: AllowList = conn.msgtable_allow
    target: Target = conn.msgtable_target
    try:
        infos = socket.getaddrinfo(conn._dns_host, conn.port, 0, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise NewConnectionError(conn, f"cannot resolve {conn.host}: {exc}") from exc
    addresses = [str(info[4][0]) for info in infos]
    allowed = [a for a in dict.fromkeys(addresses) if allow.address_allowed(target, a)]
    if not allowed:
        raise AddressNotAllowed(
            conn,
            f"{conn.host} resolves to {', '.join(dict.fromkeys(addresses))}, "
            "outside the server's --push-allow",
        )
    last: OSError | None = None
    for address in allowed:
        try:
            return u3conn.create_connection(
                (address, conn.port),
                conn.timeout,
                source_address=conn.source_address,
                socket_options=conn.socket_options,
            )
        except TimeoutError as exc:
            last = exc
        except OSError as exc:
            last = exc
    raise NewConnectionError(conn, f"cannot connect to {conn.host}:{conn.port}: {last}")


class _Conn(HTTPConnection):
    msgtable_allow: AllowList
    msgtable_target: Target

    def _new_conn(self) -> socket.socket:
        return _checked_conn(self)


class _TlsConn(HTTPSConnection):
    msgtable_allow: AllowList
    msgtable_target: Target

    def _new_conn(self) -> socket.socket:
        return _checked_conn(self)


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    retry_after: str | None
    location: str | None


class Transport:
    """The connections of one endpoint (see the module docstring)."""

    def __init__(
        self,
        target: Target,
        allow: AllowList,
        *,
        max_connections: int,
        timeout_s: float,
        ca_file: str | None = None,
    ) -> None:
        self.target = target
        timeout = urllib3.Timeout(connect=min(timeout_s, 5.0), read=timeout_s)
        common: dict[str, Any] = {
            "maxsize": max_connections,
            "block": False,
            "timeout": timeout,
            "retries": False,
        }
        pool: HTTPConnectionPool
        if target.scheme == "https":
            conn_cls: type[HTTPConnection] = type(
                "PushTlsConnection",
                (_TlsConn,),
                {"msgtable_allow": allow, "msgtable_target": target},
            )
            pool = HTTPSConnectionPool(
                target.host, target.port, cert_reqs="CERT_REQUIRED", ca_certs=ca_file, **common
            )
        else:
            conn_cls = type(
                "PushConnection", (_Conn,), {"msgtable_allow": allow, "msgtable_target": target}
            )
            pool = HTTPConnectionPool(target.host, target.port, **common)
        pool.ConnectionCls = conn_cls
        self._pool = pool

    def post(self, body: bytes, headers: dict[str, str]) -> Answer:
        """POST ``body``; raises urllib3's errors when no answer came."""
        r = self._pool.urlopen(
            "POST",
            self.target.path,
            body=body,
            headers=headers,
            redirect=False,
            retries=False,
            preload_content=False,
            assert_same_host=False,
        )
        try:
            data = r.read(MAX_ANSWER_BYTES) if not 200 <= r.status < 300 else b""
            r.drain_conn()  # the rest, so the connection is kept alive
        finally:
            r.release_conn()
        return Answer(r.status, data, r.headers.get("retry-after"), r.headers.get("location"))

    def close(self) -> None:
        self._pool.close()


def failure_text(exc: BaseException) -> tuple[str, bool]:
    """A request's failure as one line, and whether it was the allow-list's refusal."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, AddressNotAllowed):
            return _message(e), True
        reason = getattr(e, "reason", None)  # urllib3's wrapped error (ssl's is a str)
        e = reason if isinstance(reason, BaseException) else (e.__cause__ or e.__context__)
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return "timed out waiting for the answer", False
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError) and not isinstance(
        exc, NewConnectionError
    ):
        return "timed out connecting", False
    return _message(exc), False


def _message(exc: BaseException) -> str:
    text = str(getattr(exc, "_message", "") or (exc.args[-1] if exc.args else exc))
    return " ".join(text.split())[:300]

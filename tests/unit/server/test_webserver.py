"""msgtable.server.webserver over a real loopback socket: what a client receives when the
server dies right after one of its writes (a SIGKILL while it answers)."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from msgtable.server.webserver import WebServer

ANSWER = b'{"Successful": [{"Id": "1"}, {"Id": "2"}], "Failed": []}'


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response(
        "200 OK",
        [("Content-Type", "application/x-amz-json-1.0"), ("Content-Length", str(len(ANSWER)))],
    )
    return [ANSWER]


@pytest.fixture
def web() -> Iterator[WebServer]:
    server = WebServer(app, "127.0.0.1", 0, "--test-listen", 2, "test-web")
    server.open()
    try:
        yield server
    finally:
        server.close()


def test_a_server_dying_right_after_a_write_leaves_its_client_the_whole_answer(
    web: WebServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer is one write, its headers with its body: a server killed between two
    writes left a client the headers alone, which botocore takes for an answer with an
    empty body (a DeleteMessageBatch that committed, naming no entry)."""
    port = int(web.address.rsplit(":", 1)[1])
    send = socket.socket.send
    writes: list[bytes] = []

    def send_then_die(sock: socket.socket, data: Any, *args: Any) -> int:
        server_end = sock.getsockname()[1] == port
        if server_end:  # (noted before the send: the client may read it all at once)
            writes.append(bytes(data))
        n = send(sock, data, *args)
        if server_end:
            sock.shutdown(socket.SHUT_WR)  # as the kernel does for a process killed now
        return n

    monkeypatch.setattr(socket.socket, "send", send_then_die)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/", b"{}", {"Content-Type": "application/x-amz-json-1.0"})
        response = conn.getresponse()
        assert response.status == 200
        got = response.read()  # http.client raises IncompleteRead on a short body
    finally:
        conn.close()
    assert got == ANSWER
    assert writes and writes[0].endswith(ANSWER), f"the server's first write: {writes}"

"""The fault proxy of the network tests (tests/netfault.py) itself: a connection made after
a reset passes bytes as the first one did."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from .netfault import FaultProxy


@contextlib.contextmanager
def echo_server() -> Iterator[int]:
    """A TCP server on loopback that sends back what it gets; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        listener.close()


def test_connections_made_after_resets_pass_bytes_both_ways() -> None:
    """Each round: a connection echoes through the proxy, then every connection is reset.
    The proxy's sockets come and go by the hundred, as a server's do in the fault suite; not
    one new connection may go silent (a socket of an old, reset connection must not stand
    for a new one)."""
    with echo_server() as port, FaultProxy("127.0.0.1", port) as proxy:
        for n in range(200):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
                s.sendall(b"ping %d" % n)
                try:
                    got = s.recv(64)
                except TimeoutError:
                    got = b"nothing within 5 s"
                assert got == b"ping %d" % n, f"connection {n} after {n} resets: {got!r}"
                assert proxy.reset() == 1

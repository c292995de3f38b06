"""The fault proxy of the network tests (tests/netfault.py) itself: a connection made after
a reset passes bytes as the first one did."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

from .netfault import FaultProxy
from .waiting import wait_until


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


def test_a_healed_link_resets_what_went_silent_and_passes_new_connections() -> None:
    """A connection made while the link was silent lost its bytes: healing resets it (the
    peer hears of it), and the next connection echoes."""
    with echo_server() as port, FaultProxy("127.0.0.1", port) as proxy:
        proxy.blackhole = True
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as silent:
            silent.sendall(b"lost")
            wait_until(lambda: proxy.connections == 1, what="the proxy accepting it")
            assert proxy.heal() == 1
            try:
                got = silent.recv(64)
            except ConnectionResetError:
                got = b""
            assert got == b"", f"a connection of the silent link answered {got!r}"
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
            s.sendall(b"back")
            assert s.recv(64) == b"back"


def test_a_reset_by_one_peer_reaches_the_other() -> None:
    """The client's side ends with a RST (a killed process with unread data): the proxy's
    upstream connection ends too, as it would without a proxy (the echo server sees its
    connection end), rather than stay open with the upstream waiting."""
    ended = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):
            while conn.recv(4096):
                pass
        ended.set()

    threading.Thread(target=serve, daemon=True).start()
    try:
        with FaultProxy("127.0.0.1", int(listener.getsockname()[1])) as proxy:
            s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
            s.sendall(b"hello")
            wait_until(lambda: proxy.connections == 1, what="the proxy accepting it")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # RST
            assert ended.wait(5), "the upstream's connection stayed open after the client's RST"
    finally:
        listener.close()


def test_held_bytes_wait_in_order_and_pass_on_at_the_release() -> None:
    """A hold keeps what the client sends (nothing echoes); the release passes it on in
    order, before what the client sends after it."""
    with (
        echo_server() as port,
        FaultProxy("127.0.0.1", port) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s,
    ):
        s.sendall(b"a")
        assert s.recv(8) == b"a"
        proxy.hold()
        s.sendall(b"b")
        s.sendall(b"c")
        s.settimeout(0.5)
        try:
            leaked = s.recv(8)
        except TimeoutError:
            leaked = b"(nothing)"
        assert leaked == b"(nothing)", "a byte passed during the hold"
        wait_until(lambda: proxy.held_bytes == 2, what="both bytes held")
        assert proxy.release() == 2
        s.sendall(b"d")
        s.settimeout(5)
        got = b""
        while len(got) < 3:
            got += s.recv(8)
        assert got == b"bcd"

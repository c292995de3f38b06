"""Settlement calls lost in a fault, with auto-renewal (msgtable.client.leaser).

A handler that releases a message and sees the call fail (the network between it and the
server was cut for a moment) has let go of it: like an ack that failed, the message must come
again after its ack wait (the safety net the leaser's docstring names). The client once took a
message off its lease only after a settle call succeeded, so a failed release left it leased,
and the leaser renewed it as soon as the server answered again, for max_lease_s (an hour by
default): held by nobody, sent to nobody. The same held for a failed sync ack or reject. This
test failed then; the client now lets go before the call, whatever becomes of it.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

import pytest

from msgtable.client import Client, Message
from msgtable.errors import MsgtableError

from ..integration.helpers import serve
from ..waiting import wait_until

ACK_WAIT_S = 6.0  # auto-renewal renews every third of it, for one ack wait
# After the cut, the message is due again at most an ack wait after its last renewal
# (a backoff shorter than the renewal's extension), and a poll later it is sent.
COMES_AGAIN_WITHIN_S = ACK_WAIT_S + 3.0


class Proxy:
    """A TCP proxy to ``port`` that can cut every connection, and refuse new ones, at will."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.cut = False
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            if self.cut:
                down.close()
                continue
            try:
                up = socket.create_connection(("127.0.0.1", self.port))
            except OSError:
                down.close()
                continue
            with self._lock:
                self._open += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut_off(self) -> None:
        self.cut = True
        with self._lock:
            conns, self._open = self._open, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.cut_off()
        self.listener.close()


def test_a_message_whose_release_failed_in_a_network_cut_comes_again_under_auto_renew(
    db_dsn: str,
) -> None:
    with serve(db_dsn) as s:
        s.create_table("jobs", vt_ack_wait=ACK_WAIT_S, vt_min_backoff=0.5, vt_max_backoff=0.5)
        s.sql("insert into jobs(id, message) values (1, 'm1')")
        proxy = Proxy(int(s.server.address.rsplit(":", 1)[1]))
        client = Client(proxy.address, timeout_s=1.0, retry_for_s=60)
        batches: queue.Queue[list[Message]] = queue.Queue()
        try:
            sub = client.subscribe("jobs", auto_renew=True)
            leaser = sub.leaser
            assert leaser is not None

            def read() -> None:
                with contextlib.suppress(MsgtableError):
                    for batch in sub.batches():
                        batches.put(batch)

            threading.Thread(target=read, daemon=True).start()
            (m,) = batches.get(timeout=30)
            wait_until(lambda: leaser.renewed >= 1, what="a first renewal")
            proxy.cut_off()
            with pytest.raises(MsgtableError):  # the handler gives up on it: not now
                m.release(reason="not now")
            proxy.cut = False  # the network is back
            failed_at = time.monotonic()
            try:
                again = batches.get(timeout=COMES_AGAIN_WITHIN_S)
            except queue.Empty:
                pytest.fail(
                    f"message 1 not sent again {time.monotonic() - failed_at:.0f}s after its "
                    f"release failed in a network cut (its ack wait is {ACK_WAIT_S:g}s): the "
                    f"client's auto-renewal still leases {leaser.leased} message(s) and "
                    f"renewed {leaser.renewed} so far",
                    pytrace=False,
                )
            assert [x.id for x in again] == [1]
        finally:
            client.close()
            proxy.close()

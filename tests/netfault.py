"""A TCP proxy on loopback that misbehaves on demand, for the network fault tests: put it
between msgtable's server and its database, or between a client and the server.

- ``latency_s``: every chunk waits this long before it is passed on (each direction);
- ``reset()``: every open connection ends with a reset (RST) on both sides, mid-statement or
  mid-stream, whatever was in flight;
- ``blackhole``: nothing is passed on and nothing is closed: each side's writes vanish and
  its reads wait (a half-open connection, a peer whose packets are dropped);
- ``drop_answers``: the upstream's bytes are dropped, the client's still pass on (a request
  arrives and is carried out; its answer is lost on the way back);
- ``slow_bytes_s``: the upstream's bytes reach the client at most this fast (a slow reader,
  seen from the upstream: its writes back up);
- ``hold()`` and ``release()``: the client's bytes wait in the proxy, in order, until the
  release passes them on (a statement stuck in a slow network that reaches the database
  late); the upstream's bytes still pass.

Threads, one pair per connection; ``close()`` ends them all.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

CHUNK = 65536
SLOW_CHUNK = 1024


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.latency_s = 0.0
        self.blackhole = False
        self.drop_answers = False
        self.slow_bytes_s: float | None = None
        self.holding = False  # see hold()
        self.held_bytes = 0  # how many bytes the holds kept, all told
        self.connections = 0  # accepted so far
        self.resets = 0  # connections ended by reset()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.address = f"127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._closed = False
        self.refused = 0  # connections whose upstream could not be reached
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="netfault-accept")
        self._acceptor.start()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                self.refused += 1
                _abort(client)  # no pump reads it: closed here
                with contextlib.suppress(OSError):
                    client.close()
                continue
            pair = _Pair(client, upstream)
            with self._lock:
                self.connections += 1
                self._pairs.append(pair)
            for src, dst, up in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(
                    target=self._pump, args=(pair, src, dst, up), daemon=True, name="netfault-pump"
                ).start()

    def _pump(
        self, pair: _Pair, src: socket.socket, dst: socket.socket, from_upstream: bool
    ) -> None:
        try:
            while True:
                slow = self.slow_bytes_s if from_upstream else None
                data = src.recv(SLOW_CHUNK if slow else CHUNK)
                if pair.reset:
                    return  # reset: no FIN after it
                if not data:
                    if not self.blackhole:  # a half-open peer never hears of the end
                        with contextlib.suppress(OSError):
                            dst.shutdown(socket.SHUT_WR)
                    return
                if self.blackhole or (from_upstream and self.drop_answers):
                    continue  # dropped: no answer, no reset
                if self.latency_s:
                    time.sleep(self.latency_s)
                if not from_upstream and self._held(pair, data):
                    continue
                dst.sendall(data)
                if slow:
                    time.sleep(len(data) / slow)
        except OSError:  # a peer reset it: so is the other side (as with no proxy between)
            pair.reset = True
            _abort(src)
            _abort(dst)
            return
        finally:
            if pair.pump_ended():  # the last of its two: nobody uses its sockets now
                with self._lock:
                    if pair in self._pairs:
                        self._pairs.remove(pair)
                pair.close()

    def state(self) -> str:
        """For a test's verdict: what the proxy did so far."""
        with self._lock:
            open_now = len(self._pairs)
        alive = self._acceptor.is_alive()
        return (
            f"{self.address}->{self.upstream[1]}: {self.connections} accepted, {open_now} open, "
            f"{self.resets} reset, upstream refused {self.refused}, accepting {alive}"
        )

    def hold(self) -> None:
        """From now on the client's bytes wait in the proxy until ``release()``."""
        self.holding = True

    def release(self) -> int:
        """Pass on every byte held, in order, and the client's bytes from now on as they
        come. Returns how many bytes were held."""
        self.holding = False
        with self._lock:
            pairs = list(self._pairs)
        held = 0
        for pair in pairs:
            with pair.held_lock:
                held += pair.flush()
        return held

    def _held(self, pair: _Pair, data: bytes) -> bool:
        """Keep ``data`` while holding, or while bytes held before it wait to go on (a
        release flushing them then takes it too, in order)."""
        with pair.held_lock:
            if not self.holding and not pair.held:
                return False
            pair.held.append(data)
            if self.holding:
                self.held_bytes += len(data)
            else:
                pair.flush()
            return True

    def reset(self) -> int:
        """End every open connection with a reset on both sides; how many there were."""
        return self._end_all(heal=False)

    def heal(self) -> int:
        """The silent link comes back (``blackhole`` off): every connection made before, or
        while it was silent, ends with a reset on both sides (their bytes were dropped:
        the peers' streams no longer match), and connections made from now on pass bytes.
        One step under the lock: a connection accepted in between would have lost its
        first bytes and never been reset. Returns how many connections were reset."""
        return self._end_all(heal=True)

    def _end_all(self, heal: bool) -> int:
        with self._lock:
            if heal:
                self.blackhole = False
            pairs, self._pairs = self._pairs, []
            self.resets += len(pairs)
            for pair in pairs:
                pair.reset = True
        for pair in pairs:
            _abort(pair.client)
            _abort(pair.upstream)
        return len(pairs)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.reset()


class _Pair:
    """One proxied connection: the client's socket, the upstream's, whether it was reset
    (its pumps then pass nothing more on), and how many of its two pumps still run.

    Only the last pump to end closes the sockets. A socket closed while a pump may be about
    to read it frees its descriptor number for the next socket opened in this process (the
    next connection, of any proxy), and that read would take the new connection's bytes."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.reset = False
        self._pumps = 2
        self._lock = threading.Lock()
        self.held: list[bytes] = []  # the client's bytes a hold keeps (FaultProxy.hold)
        self.held_lock = threading.Lock()

    def flush(self) -> int:
        """Send the held bytes upstream (the caller holds ``held_lock``); how many."""
        data, self.held = b"".join(self.held), []
        with contextlib.suppress(OSError):  # reset meanwhile: lost, as any byte then
            self.upstream.sendall(data)
        return len(data)

    def pump_ended(self) -> bool:
        """A pump ended; whether it was the last."""
        with self._lock:
            self._pumps -= 1
            return self._pumps == 0

    def close(self) -> None:
        for s in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                s.close()


def _abort(s: socket.socket) -> None:
    """Set SO_LINGER 0, so that closing the socket sends a RST, not a FIN, and shut its read
    side (on TCP that sends nothing): a pump blocked reading it returns, and the last pump
    of its connection closes it (the kernel resets the connection then)."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RD)

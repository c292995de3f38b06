"""Automatic renewal of the messages a subscriber holds: a lease while a handler runs.

Modelled on google-cloud-pubsub's lease management: every message the subscriber received is
leased until it is acked, released or rejected (through the subscriber or the message), and
a background thread renews all leased messages every third of the table's ack wait, so a
handler slower than the ack wait keeps its message (it is not sent to another subscriber).
A message is renewed for at most ``max_lease_s`` after it arrived (a handler stuck for ever
must not hold its message for ever); then it is left to its ack wait like any other. A failed
renewal is logged and tried again at the next round: the message's own ack wait is the
safety net.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Protocol

from msgtable.client import requests
from msgtable.errors import MsgtableError
from msgtable.limits import MAX_ACK_IDS
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

log = logging.getLogger(__name__)

DEFAULT_MAX_LEASE_S = 3600.0
MIN_RENEW_EVERY_S = 0.05


class Leased(Protocol):
    @property
    def id(self) -> object: ...

    @property
    def id_value(self) -> pb.Value: ...

    @property
    def attempt(self) -> int: ...

    @property
    def sent_ns(self) -> int: ...


class Leases:
    """The messages a subscriber holds and since when: what a renewal round renews. Shared by
    the sync Leaser's thread and the asyncio subscriber's task (msgtable.aio). Thread-safe."""

    def __init__(
        self, max_lease_s: float = DEFAULT_MAX_LEASE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_lease_s = max_lease_s
        self._clock = clock
        self._lock = threading.Lock()
        # id -> (the id as received, the delivery's attempt (0: not known), since when)
        self._leased: dict[Hashable, tuple[pb.Value, int, float]] = {}

    def add(self, messages: Iterable[Leased]) -> None:
        now = self._clock()
        with self._lock:
            for m in messages:
                self._leased[_key(m.id)] = (m.id_value, requests.attempt_of(m), now)

    def remove(self, messages: Iterable[Leased]) -> None:
        with self._lock:
            for m in messages:
                self._leased.pop(_key(m.id), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._leased)

    def due(self) -> list[tuple[list[pb.Value], list[int]]]:
        """One round's renewals, MAX_ACK_IDS ids a call, each with the attempts of their
        deliveries (dropping messages held too long)."""
        now = self._clock()
        with self._lock:
            for key, (_, _, since) in list(self._leased.items()):
                if now - since > self.max_lease_s:
                    del self._leased[key]
            held = list(self._leased.values())
        return [
            ([v for v, _, _ in chunk], [a for _, a, _ in chunk])
            for chunk in (held[i : i + MAX_ACK_IDS] for i in range(0, len(held), MAX_ACK_IDS))
        ]

    def clear(self) -> None:
        with self._lock:
            self._leased.clear()


class Leaser:
    """Renews leased messages every ``every_s`` with ``renew(ids) -> count``."""

    def __init__(
        self,
        name: str,
        renew: Callable[[list[pb.Value], list[int]], int],
        every_s: float,
        max_lease_s: float = DEFAULT_MAX_LEASE_S,
        clock: Callable[[], float] = time.monotonic,
        closed: Callable[[], bool] = lambda: False,
    ) -> None:
        """``closed``: whether the client is closed (then renewing stops, quietly)."""
        self.name = name
        self._renew = renew
        self._closed = closed
        self.every_s = max(MIN_RENEW_EVERY_S, every_s)
        self.max_lease_s = max_lease_s
        self._leases = Leases(max_lease_s, clock)
        self._stop = threading.Event()
        self.renewed = 0  # messages the server said it renewed
        self.rounds = 0
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"msgtable-lease-{name}"
        )
        self._thread.start()

    def add(self, messages: Iterable[Leased]) -> None:
        self._leases.add(messages)

    def remove(self, messages: Iterable[Leased]) -> None:
        self._leases.remove(messages)

    @property
    def leased(self) -> int:
        return len(self._leases)

    def renew_now(self) -> int:
        """One round: renew every leased message (dropping those leased too long)."""
        n = sum(self._renew(ids, attempts) for ids, attempts in self._leases.due())
        self.renewed += n
        self.rounds += 1
        return n

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            if self._closed():  # the client was closed before its subscriber
                return
            try:
                self.renew_now()
            except MsgtableError as exc:
                if self._closed():
                    return
                log.warning(
                    "table %s: renewing held messages failed (%s); next round", self.name, exc
                )
            except Exception:  # the thread must not die: the ack wait is the safety net
                log.exception("table %s: renewing held messages failed", self.name)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._leases.clear()


def _key(value: object) -> Hashable:
    return value if isinstance(value, Hashable) else repr(value)

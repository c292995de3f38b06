"""An independent judge of flow control (issue 45) from what subscribers saw: whether a cap
was exceeded at any instant, and whether a rate window overshot.

Each delivery is recorded as the server's hand-over time (``Message.sent_ns``, the instant
the sender counted it) and the instant its subscriber began to settle it (the ack call's
start). The server counts a message in flight from its hand-over until its settlement is
written, which is after the call began, so the recorded interval lies inside the server's:
more overlapping here than the cap is a real excess, never an artefact of the measure. A
message whose ack never came (a killed subscriber) is in flight until its ack wait ends,
which the judge takes as its end (``open_until_s``). Rates are judged on the hand-over
times themselves, against the token bucket's bound ``burst + rate * T`` in every interval
(msgtable.core.flow.rate_violations).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from msgtable.core.flow import rate_violations


@dataclass
class Delivery:
    id: object
    key: Hashable  # the value of the column the limit keys on (None: none)
    sent_ns: int  # the server's hand-over
    attempt: int
    subscriber: str
    end_ns: int | None = None  # when its settlement began (None: never)


@dataclass
class FlowLog:
    """Deliveries as subscribers on several threads record them."""

    deliveries: list[Delivery] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def received(
        self, subscriber: str, messages: Iterable[object], key: str = ""
    ) -> list[Delivery]:
        out = [
            Delivery(
                m.id,  # type: ignore[attr-defined]
                m.values.get(key) if key else None,  # type: ignore[attr-defined]
                m.sent_ns,  # type: ignore[attr-defined]
                m.attempt,  # type: ignore[attr-defined]
                subscriber,
            )
            for m in messages
        ]
        with self._lock:
            self.deliveries += out
        return out

    @staticmethod
    def settling(deliveries: Iterable[Delivery]) -> None:
        now = time.time_ns()
        for d in deliveries:
            d.end_ns = now


def most_in_flight(
    deliveries: Iterable[Delivery], open_until_s: float, by_key: bool = False
) -> dict[Hashable, tuple[int, int]]:
    """The most deliveries in flight at one instant (and that instant), in all (key None)
    or per key: ends before starts at one instant (a settlement then a send is no overlap)."""
    events: dict[Hashable, list[tuple[int, int]]] = {}
    for d in deliveries:
        if by_key and d.key is None:
            continue
        end = d.end_ns if d.end_ns is not None else d.sent_ns + round(open_until_s * 1e9)
        group = events.setdefault(d.key if by_key else None, [])
        group += [(d.sent_ns, 1), (end, -1)]
    out: dict[Hashable, tuple[int, int]] = {}
    for key, evs in events.items():
        evs.sort(key=lambda e: (e[0], e[1]))
        n = most = at = 0
        for t, step in evs:
            n += step
            if n > most:
                most, at = n, t
        out[key] = (most, at)
    return out


def cap_violations(
    deliveries: Iterable[Delivery], cap: int, open_until_s: float, by_key: bool = False
) -> list[str]:
    """What exceeded ``cap`` (the group's, or each key's), one line each."""
    return [
        f"{'key ' + repr(k) if by_key else 'the group'}: {n} in flight at {at} (cap {cap})"
        for k, (n, at) in most_in_flight(deliveries, open_until_s, by_key).items()
        if n > cap
    ]


def rate_overshoots(
    deliveries: Iterable[Delivery],
    rate_per_s: float,
    burst: int,
    slack: int = 0,
    by_key: bool = False,
) -> list[str]:
    """The intervals a rate (the group's, or each key's) overshot, one line each."""
    times: dict[Hashable, list[int]] = {}
    for d in deliveries:
        if by_key and d.key is None:
            continue
        times.setdefault(d.key if by_key else None, []).append(d.sent_ns)
    out = []
    for key, sent in times.items():
        sent.sort()
        for first, last, n in rate_violations(sent, rate_per_s, burst, slack)[:3]:
            out.append(
                f"{'key ' + repr(key) if by_key else 'the group'}: {n} sent in "
                f"{(last - first) / 1e9:.3f}s (at most {burst} + {rate_per_s:g}/s)"
            )
    return out

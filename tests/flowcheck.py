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

Each group (the default one, a subscription) is judged by its OWN limits
(:class:`GroupLimits`, :func:`group_violations`): a subscription with limits of its own
holds those, not its table's, and the others hold the table's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterable, Mapping
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
    group: str = ""  # the subscription it was sent to ("": the default group)


@dataclass
class FlowLog:
    """Deliveries as subscribers on several threads record them."""

    deliveries: list[Delivery] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def received(
        self, subscriber: str, messages: Iterable[object], key: str = "", group: str = ""
    ) -> list[Delivery]:
        out = [
            Delivery(
                m.id,  # type: ignore[attr-defined]
                m.values.get(key) if key else None,  # type: ignore[attr-defined]
                m.sent_ns,  # type: ignore[attr-defined]
                m.attempt,  # type: ignore[attr-defined]
                subscriber,
                group=group,
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


@dataclass(frozen=True)
class GroupLimits:
    """One group's limits as the checker judges them (0: none): its table's, or a
    subscription's own (msgtable.core.flow.own_flow)."""

    rate_per_s: float = 0.0
    burst: int = 0
    max_in_flight: int = 0
    key_rate_per_s: float = 0.0
    key_burst: int = 0
    key_concurrency: int = 0


def group_violations(
    deliveries: Iterable[Delivery], limits: Mapping[str, GroupLimits], open_until_s: float
) -> list[str]:
    """What exceeded a group's OWN limits (``limits`` by group name, "": the default group),
    each group judged on its own deliveries, one line each, named by its group. A delivery
    to a group the mapping does not name is a problem too (its limits were not judged)."""
    by_group: dict[str, list[Delivery]] = {}
    for d in deliveries:
        by_group.setdefault(d.group, []).append(d)
    out = []
    for group, ds in sorted(by_group.items()):
        name = f"subscription {group!r}" if group else "the default group"
        lim = limits.get(group)
        if lim is None:
            out.append(f"{name}: {len(ds)} deliveries, but no limits to judge them by")
            continue
        problems = []
        if lim.rate_per_s:
            problems += rate_overshoots(ds, lim.rate_per_s, lim.burst)
        if lim.key_rate_per_s:
            problems += rate_overshoots(ds, lim.key_rate_per_s, lim.key_burst, by_key=True)
        if lim.max_in_flight:
            problems += cap_violations(ds, lim.max_in_flight, open_until_s)
        if lim.key_concurrency:
            problems += cap_violations(ds, lim.key_concurrency, open_until_s, by_key=True)
        out += [f"{name}: {p}" for p in problems]
    return out

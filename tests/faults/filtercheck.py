"""The fault suite's judgement of filters (issue 39): every message a filter passes is
delivered to that filter's group within its ack wait once a matching subscriber is connected
and has room.

A group's subscribers each read with a **stream filter** (a key: its text, "" for none, which
passes every message of the group; the group's own filter, a subscription's, chose the
group's messages already). Each subscriber says when it is **ready** (connected, with room:
it subscribed, and reads and acks) and when it stops being (killed, stalled, closed, done).
From the producer's commits and the deliveries the judge finds, for each key, the stretches
in which

- a subscriber with that key was ready,
- a message of the group that the key passes was committed and not sent yet (one whose
  first delivery seen said attempt 1: a send the faults kept from every subscriber leaves a
  message in flight, not waiting),
- no message the key passes was delivered to the group (to any of its subscribers), while
  the group delivered others (a pause of the whole group is no filter's: a takeover when a
  lease renewal came late on a busy machine, say; the stall checks judge those),
- no fault of a server, the database or the network was under way, nor over less than
  SETTLE_S ago or without a message the key passes delivered since (its recovery: a
  takeover, its hold, the database answering the servers again, the streams' reconnects; at
  most RECOVERY_S), nor a change of the table's sender that no fault caused, judged as such
  a fault is (a lease that ran out on a busy machine, taken over by the other server; the
  scrapes see when: a subscriber is ready from its subscribe on, wherever its stream is, and
  one still on the old sender, which cannot send and has not noticed its loss yet, gets
  nothing until that sender ends its stream and it follows the table, while one that
  connected meanwhile, a new subscriber, is served by the new sender already), and
- fewer than ``stranded_limit`` messages waited that no ready subscriber's key passes (those
  wait in the server's cache and may fill it, as the README says; then the others wait in the
  table: not this fault),

and reports every such stretch longer than the group's ack wait and SLACK_S (a poll, the
wire). An ordered group is not judged so: a message waits there for its key's earlier ones
(a release, a backoff, a batch in flight), which the order checker judges. The check works
on a grid of STEP_S, from the first commit to the judgement.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

# at most this long after a server's, the database's or the network's fault, until a message
# the key passes is delivered: what a recovery may take (a takeover and its hold after the
# database came back, the streams' reconnects)
RECOVERY_S = 20.0
# and at least this long (a batch that was on the wire before it says nothing of recovery):
# a takeover's two lease periods and its hold of an ack wait
SETTLE_S = 5.0
SLACK_S = 1.0  # beyond the ack wait: a poll, the wire
STEP_S = 0.1


@dataclass(frozen=True)
class Stall:
    """A stretch in which a ready subscriber's filter passed waiting messages and the group
    delivered none of them."""

    key: str  # the stream filter ("": none)
    began: float
    lasted_s: float
    waiting: list[int]  # some of the messages it passed that waited

    def __str__(self) -> str:
        what = repr(self.key) if self.key else "no filter"
        return f"{what} from {self.began:.1f} for {self.lasted_s:.1f}s: waiting {self.waiting}"


@dataclass(frozen=True)
class Readiness:
    """When a subscriber became ready (connected, with room) or stopped being, with its key."""

    at: float
    sub: str
    key: str | None  # None: not ready from then on


def stalls(
    keys: Mapping[str, Callable[[int], bool]],
    readiness: Sequence[Readiness],
    inserted_at: Mapping[int, float],
    deliveries: Mapping[int, Sequence[tuple[float, str, int]]],
    blackouts: Iterable[tuple[float, float]],
    ack_wait_s: float,
    end: float,
    stranded_limit: int = 0,
) -> list[Stall]:
    """The stalls (see the module docstring). ``keys``: each stream filter's test of an id
    (one of the group's); ``blackouts``: (began, over) of each server's, database's or
    network's fault and of each change of the table's sender; ``stranded_limit``: 0 for
    none."""
    if not inserted_at or not keys or not readiness:
        return []  # (a suite whose subscribers do not say when they are ready: not judged)
    limit_s = ack_wait_s + SLACK_S
    faults = sorted(blackouts)
    # each id's class: the keys that pass it (of the ids whose first send was seen)
    classes: dict[frozenset[str], list[int]] = {}
    for i in inserted_at:
        ds = deliveries.get(i)
        if not ds or ds[0][2] > 1:
            continue
        cls = frozenset(k for k, passes in keys.items() if k == "" or passes(i))
        classes.setdefault(cls, []).append(i)
    # per class: commit times, first delivery times (pending = committed - delivered)
    if not classes:
        return []
    committed = {c: sorted(inserted_at[i] for i in ids) for c, ids in classes.items()}
    first = {
        c: sorted(deliveries[i][0][0] for i in ids if deliveries.get(i))
        for c, ids in classes.items()
    }
    sent: dict[str, list[float]] = {}  # per key: every delivery of an id it passes
    for cls, ids in classes.items():
        for k in cls:
            sent.setdefault(k, []).extend(t for i in ids for t, _, _ in deliveries.get(i, ()))
    for times in sent.values():
        times.sort()
    # per key: each fault, until a message it passes was delivered after it (or RECOVERY_S)
    windows = {k: [(b, _recovered(sent.get(k, []), o)) for b, o in faults] for k in keys}
    out: list[Stall] = []
    began: dict[str, float | None] = dict.fromkeys(keys)
    current: dict[str, int] = {}  # key -> its stall in ``out`` going on now
    ready: dict[str, str] = {}  # sub -> key, of those ready now
    events = sorted(readiness, key=lambda r: r.at)
    e = 0
    group = sorted(t for ds in deliveries.values() for t, _, _ in ds)
    t = min(inserted_at.values())
    while t <= end:
        while e < len(events) and events[e].at <= t:
            r = events[e]
            if r.key is None:
                ready.pop(r.sub, None)
            else:
                ready[r.sub] = r.key
            e += 1
        keys_ready = set(ready.values())
        pending = {
            c: bisect.bisect_right(committed[c], t) - bisect.bisect_right(first[c], t)
            for c in classes
        }
        stranded = sum(n for c, n in pending.items() if not c & keys_ready)
        crowded = stranded_limit and stranded >= stranded_limit
        for k in keys:
            waiting = sum(n for c, n in pending.items() if k in c)
            if crowded or _inside(windows[k], t) or k not in keys_ready or not waiting:
                began[k] = None
                current.pop(k, None)
                continue
            start = began[k] = t if began[k] is None else began[k]
            times = sent.get(k, [])
            n = bisect.bisect_right(times, t)
            since = max(start, times[n - 1]) if n else start
            if t - since <= limit_s:
                current.pop(k, None)
                continue
            stall = Stall(k, since, round(t - since, 1), [])
            if k in current and out[current[k]].began == since:
                out[current[k]] = stall  # going on: as long as it went
            else:
                current[k] = len(out)
                out.append(stall)
        t += STEP_S
    return [
        dataclasses.replace(
            s,
            waiting=_waiting(
                classes, s.key, s.began + s.lasted_s - STEP_S, inserted_at, deliveries
            ),
        )
        for s in out
        # the group delivered others while it waited: not a pause of the whole group
        if bisect.bisect_left(group, s.began + s.lasted_s - limit_s)
        > bisect.bisect_right(group, s.began)
    ]


def _recovered(times: list[float], over: float) -> float:
    """When a key recovered from a fault over at ``over``: its first delivery SETTLE_S after
    that, at most RECOVERY_S after it."""
    n = bisect.bisect_right(times, over + SETTLE_S)
    return min(times[n], over + RECOVERY_S) if n < len(times) else over + RECOVERY_S


def _inside(windows: list[tuple[float, float]], t: float) -> bool:
    return any(b <= t <= o for b, o in windows)


def _waiting(
    classes: Mapping[frozenset[str], list[int]],
    k: str,
    t: float,
    inserted_at: Mapping[int, float],
    deliveries: Mapping[int, Sequence[tuple[float, str, int]]],
    n: int = 5,
) -> list[int]:
    """Some ids ``k`` passes that were committed by ``t`` and not delivered then."""
    out: list[int] = []
    for cls, ids in classes.items():
        if k not in cls:
            continue
        for i in sorted(ids):
            ds = deliveries.get(i)
            if inserted_at[i] <= t and (not ds or ds[0][0] > t):
                out.append(i)
                if len(out) >= n:
                    return out
    return out

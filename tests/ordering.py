"""An independent checker of ordering per key (README: Ordering per key), from what the
subscribers saw, not from the server's state.

A delivery is one message as a subscriber got it: its key, when the server sent it (the
batch's ``sent_ns``), when the subscriber got it, and when the subscriber began to settle it
(ack, release or reject; None if it never did). Messages of one response of one subscriber
are one batch. Two rules, per key:

* **order**: the messages' first deliveries come in enqueue order;
* **one batch at a time**: a batch of a key arrives only after every message of the key's
  batch before it left flight: a subscriber began to settle it, or its ack wait (from the
  server's send) was over. Times are this machine's clock: a settlement begins before the
  server writes it, and the server frees a key only after that, so no slack is needed.

A message is settled by whoever settles it: besides the subscriber of a delivery, another
that held the message before (its ack wait over, it was sent again) may ack it late, and
that ack frees the key too. So a delivery leaves flight at the first settlement of its
message that began after its send, or raced it: began less than an ack wait before the send
and had not returned by then (so it may have been written after it). A call that began
longer before and returned after the send (a settlement retried across a database restart)
may have been written after it too: the delivery may have left flight from the send on. A
settlement that returned before the send (the release that made the message due again), or
began long before and never returned, does not count.

Rows with a NULL key (None) are unordered and not checked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class Delivery:
    id: Hashable
    key: Hashable
    subscriber: str
    sent_ns: int
    received_ns: int
    settled_ns: int | None = None  # when its subscriber began to ack / release / reject it
    done_ns: int | None = None  # when that call returned (None: it never did, or unknown)


@dataclass
class OrderLog:
    """What subscribers record as they go (thread-safe)."""

    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self, subscriber: str, batch: Sequence[object], key_column: str) -> list[Delivery]:
        """Record a batch of client Messages; returns their deliveries (settle them later)."""
        now = time.time_ns()
        out = [
            Delivery(m.id, m.values[key_column], subscriber, m.sent_ns, now)  # type: ignore[attr-defined]
            for m in batch
        ]
        with self.lock:
            self.deliveries.extend(out)
        return out

    @staticmethod
    def settling(deliveries: Iterable[Delivery]) -> None:
        now = time.time_ns()
        for d in deliveries:
            d.settled_ns = now

    @staticmethod
    def settled(deliveries: Iterable[Delivery]) -> None:
        """The settlement call begun by ``settling`` returned (whatever it answered)."""
        now = time.time_ns()
        for d in deliveries:
            d.done_ns = now


def check_order(
    enqueued: dict[Hashable, list[Hashable]],
    deliveries: Sequence[Delivery],
    ack_wait_s: float,
) -> list[str]:
    """Every violation of the two rules, one line each (empty: none). ``enqueued``: each
    key's ids in enqueue order."""
    problems: list[str] = []
    ack_wait_ns = round(ack_wait_s * 1e9)
    by_key: dict[Hashable, list[Delivery]] = {}
    for d in deliveries:
        if d.key is not None:
            by_key.setdefault(d.key, []).append(d)
    for key, ds in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        position = {rid: n for n, rid in enumerate(enqueued.get(key, []))}
        unknown = {d.id for d in ds if d.id not in position}
        if unknown:
            problems.append(f"key {key!r}: ids {sorted(map(str, unknown))} were not enqueued")
            continue
        ds = sorted(ds, key=lambda d: (d.received_ns, position[d.id]))
        first: dict[Hashable, None] = {}
        for d in ds:
            first.setdefault(d.id, None)
        got = list(first)
        want = sorted(got, key=position.__getitem__)
        if got != want:
            at = next(n for n, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
            problems.append(
                f"key {key!r}: first deliveries out of order at #{at}: got {got[at : at + 5]}, "
                f"expected {want[at : at + 5]}"
            )
        batches: dict[tuple[str, int], list[Delivery]] = {}
        for d in ds:
            batches.setdefault((d.subscriber, d.sent_ns), []).append(d)
        ordered = sorted(batches.values(), key=lambda b: min(d.received_ns for d in b))
        # id -> (when a settlement of it began, when it returned: None if it never did)
        settles: dict[Hashable, list[tuple[int, int | None]]] = {}
        for d in ds:
            if d.settled_ns is not None:
                settles.setdefault(d.id, []).append((d.settled_ns, d.done_ns))
        end, before = 0, ordered[0]
        for after in ordered:
            start = min(d.received_ns for d in after)
            if start < end:
                problems.append(
                    f"key {key!r}: batch {[d.id for d in after]} to {after[0].subscriber} "
                    f"arrived {(end - start) / 1e6:.1f} ms before batch "
                    f"{[d.id for d in before]} to {before[0].subscriber} left flight"
                )
            batch_end = max(_end(d, ack_wait_ns, settles.get(d.id, [])) for d in after)
            if batch_end > end:
                end, before = batch_end, after
    return problems


def _end(d: Delivery, ack_wait_ns: int, settles: Sequence[tuple[int, int | None]]) -> int:
    """When ``d`` left flight: its ack wait over, or the first settlement of its message (by
    any subscriber: ``settles``) that began after its send or raced it."""
    since = d.sent_ns - ack_wait_ns
    raced = (
        began
        for began, done in settles
        if began >= since and (done is None or done >= d.sent_ns or began >= d.sent_ns)
    )
    # a call that returned after the send, however long before it began (retried across a
    # database restart), may have been written after the send: from the send on
    spanning = (
        d.sent_ns
        for began, done in settles
        if began < since and done is not None and done >= d.sent_ns
    )
    return min([d.sent_ns + ack_wait_ns, *raced, *spanning])

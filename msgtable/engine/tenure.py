"""What this server sends, as the placement (msgtable.engine.placement) last said.

Each unit of the placement (a table with its subscriptions, or CAPTURE) is sent by one
server at a time. This server's tenure of a unit runs from a gain to a loss; while it runs
the unit's managers send. After a takeover they hold back what the old sender may have had
in flight (the hold, ``hold_s`` and ``hold_floor_ns``); a sent row's postpone is written
only while the lease allows (``may_postpone``); and a request for a unit another server
sends is answered NotLeader naming it, once a unit being placed or handed over has had its
time to come here (``await_sending``). A server without a lease period sends every unit.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from msgtable.core.assignment import CAPTURE
from msgtable.core.clock import Clock
from msgtable.core.tables import TableConfig
from msgtable.engine.lease import Takeover
from msgtable.engine.placement import Placement
from msgtable.errors import NotLeader

if TYPE_CHECKING:
    from msgtable.store.protocol import Connections

# After an unclean takeover: how far the old holder's clock may have been ahead of this
# server's (time_next and time_created are unix ns; see hold_floor_ns)
TAKEOVER_CLOCK_MARGIN_S = 1.0
# A stream (or a release, reject, renew) of a table being placed or handed over waits this
# many lease periods at most for this server to send it or for a live sender to be known
# (a takeover after a crash comes within two), then answers NotLeader
PLACING_WAIT_PERIODS = 2


class Tenure:
    """The units this server sends and what it learnt taking them (see the module
    docstring). ``lease_period_s``: None when it is the only server; ``stop``: set when the
    engine closes. The engine sets ``lease`` when it campaigns (``campaigned`` then)."""

    def __init__(
        self, lease_period_s: float | None, keyspace: str, clock: Clock, stop: threading.Event
    ) -> None:
        self.lease_period_s = lease_period_s
        self.keyspace = keyspace
        self._clock = clock
        self._stop = stop
        self.lease: Placement | None = None
        self.campaigned = threading.Event()  # the placement was made (or never will be)
        self.sending: set[str] = set()  # the units this server sends, with a lease to share
        # by unit: when this server gained its lease, and what it learnt of the one before
        self.takeovers: dict[str, tuple[float, Takeover]] = {}
        self.clean_demotion: dict[str, bool] = {}  # by unit: its last loss wrote every postpone
        self.sender_hints: dict[str, str] = {}  # by unit: the sender named when it was lost
        # by unit: sent rows whose postpones a loss noticed too late did not write (skip)
        self._skipped: dict[str, int] = {}
        self.fenced: Connections | None = None  # the store the lease fences (fence_as)

    def skip(self, unit: str, n: int) -> None:
        """A loss of ``unit`` closed its managers without writing ``n`` postpones."""
        if n:  # (a new dict: a scrape reads it on another thread)
            self._skipped = {**self._skipped, unit: self._skipped.get(unit, 0) + n}

    def skipped(self) -> dict[str, int]:
        """Sent rows whose postpone was not written, so their sends are not counted, by
        unit (message table): a loss noticed too late for it (``skip``), or the store's
        fence kept it out (msgtable.store.mysqlstore.MySQLStore.fence_as)."""
        out = dict(self._skipped)
        if self.fenced is not None:
            for unit, n in self.fenced.postpones_fenced.items():
                out[unit] = out.get(unit, 0) + n
        return out

    @property
    def leading(self) -> bool:
        """Whether this server sends any unit now (or has no lease to share)."""
        return self.lease_period_s is None or bool(self.sending)

    def sends(self, unit: str) -> bool:
        return self.lease_period_s is None or unit in self.sending

    def sender(self, unit: str) -> str:
        """The address of the server that sends ``unit`` as this one last read the
        placement ("": unknown, or no server sends it now); "this server" when it has no
        lease to share."""
        lease = self.lease
        if lease is None:
            return "" if self.lease_period_s is not None else "this server"
        return lease.last_sender(unit)  # what this server shows: see Placement.last_sender

    def may_send(self, unit: str) -> bool:
        """Whether this server may send ``unit`` at this instant (its lease is valid)."""
        lease = self.lease
        return lease.valid(unit) if lease is not None else self.sends(unit)

    def may_postpone(self, unit: str, ack_wait_s: float) -> bool:
        """Whether a sent row's postpone (its count, its ack wait) may still be written:
        while the table's lease is valid, and until half an ack wait after it ended. The
        next sender holds back what this one may have sent until a whole ack wait after the
        lease ended on the database's clock (no earlier than here); a postpone written later
        could land after the next sender sent the row again, match the epoch that send has
        not counted yet, and make the row due at once while it is in flight. Not written,
        the count is lost, and the row is sent again after the next sender's hold."""
        lease = self.lease
        if lease is None:
            return True
        return time.monotonic() < lease.held_until_s(unit) + ack_wait_s / 2

    def gained(self, unit: str, takeover: Takeover) -> None:
        self.takeovers[unit] = (time.monotonic(), takeover)
        self.sending.add(unit)

    def lost(self, unit: str, sender: str) -> None:
        self.sending.discard(unit)
        self.sender_hints[unit] = sender

    def hold_s(self, cfg: TableConfig) -> float:
        """How long a table's sends wait after a takeover: until vt_ack_wait after the
        old sender's lease ended, when that sender may have sent messages whose postpone
        (their ack wait in the table) it never wrote. Nothing to wait for when it gave the
        lease back cleanly, when there was none, or with vt_postpone_after=0 (the postpone
        is written before the send), unless the table is ordered: then a head the old sender
        sent may fall due again (a backoff shorter than the ack wait) while its subscriber
        still holds the key's batch, which only the old sender knew (msgtable.engine.ordered).
        A table with a cap (vt_max_in_flight, vt_key_concurrency) waits after every takeover,
        a clean one too: what the old sender has in flight counts under the caps, and only
        it knew (msgtable.engine.flow)."""
        unit = unit_of(cfg)
        taken = self.takeovers.get(unit)
        capped = cfg.flow is not None and cfg.flow.capped
        if taken is None or (cfg.postpone_after_ns == 0 and not cfg.ordered and not capped):
            return 0.0
        at, t = taken
        if not t.previous:
            return 0.0
        if not capped and (t.released or (t.by_me and self.clean_demotion.get(unit, True))):
            return 0.0
        return max(0.0, cfg.ack_wait_s - t.ended_s_ago - (time.monotonic() - at))

    def hold_floor_ns(self, cfg: TableConfig) -> int | None:
        """During a hold, what the old sender cannot have sent goes out at once: a row it
        sent was due (time_next) and there (time_created) by its clock when it sent, before
        its lease ended. The floor is that end on this server's clock, plus
        TAKEOVER_CLOCK_MARGIN_S for the servers' clocks' disagreement. None (hold every
        send) for an ordered table: a key's newer rows must not pass its held head; nor for a
        table with a cap: the old sender's messages in flight fill it."""
        taken = self.takeovers.get(unit_of(cfg))
        if taken is None or cfg.ordered or (cfg.flow is not None and cfg.flow.capped):
            return None
        at, t = taken
        ended_ns = self._clock.now_ns() - round((t.ended_s_ago + time.monotonic() - at) * 1e9)
        return ended_ns + round(TAKEOVER_CLOCK_MARGIN_S * 1e9)

    def others_sent_before_ns(self, unit: str) -> int:
        """Rows created after this (this server's clock, ns) were not there while another
        server sent ``unit``: when this server gained it, plus TAKEOVER_CLOCK_MARGIN_S. 0
        without a lease (no other server sends); the largest bigint while it does not send
        the unit (any row may be another's)."""
        if self.lease is None:
            return 0
        taken = self.takeovers.get(unit)
        if taken is None or unit not in self.sending:
            return 2**63 - 1
        gained_ns = self._clock.now_ns() - round((time.monotonic() - taken[0]) * 1e9)
        return gained_ns + round(TAKEOVER_CLOCK_MARGIN_S * 1e9)

    def await_sending(self, unit: str, opened: bool) -> bool:
        """Wait until this server sends ``unit`` (True), or raise NotLeader naming the live
        server that does. A unit being placed or handed over (on its way here, or nobody's
        for a moment: just discovered, its holder gone or giving it back) is waited for, at
        most PLACING_WAIT_PERIODS lease periods, step by step of the placement: a client
        without retries is served, not sent away by a transition of the servers' own
        (DESIGN.md, principle 10). False past that, or once the engine stops. ``opened``:
        the engine serves (else, never opened, no placement will come)."""
        period_s = self.lease_period_s or 0.0
        deadline = time.monotonic() + PLACING_WAIT_PERIODS * period_s
        wake = True  # the first step at once (one step more per request, no more)
        while not self.sends(unit):
            lease = self.lease
            if lease is not None:
                sender = lease.sender(unit)
                if sender and sender != lease.address and not lease.coming(unit):
                    raise self.not_leader(unit, sender)
            left = deadline - time.monotonic()
            if left <= 0 or self._stop.is_set():
                break
            if lease is not None:
                lease.await_step(left, wake)
                wake = False
            elif self.campaigned.is_set() or not opened:
                break  # no placement (closed; or an engine driven by hand, never opened)
            else:  # serving already, the placement not made yet (msgtable serve's start)
                self.campaigned.wait(left)
        return self.sends(unit)

    def not_leader(self, unit: str, sender: str | None = None) -> NotLeader:
        """The answer for ``unit`` while another server (``sender``: as last known) sends it."""
        lease = self.lease
        if sender is None:
            sender = lease.sender(unit) if lease is not None else self.sender_hints.get(unit, "")
        if lease is not None and sender == lease.address:
            sender = ""  # never this server itself: it does not send the unit now
        what = "the table events" if unit == CAPTURE else f"table {unit}"
        where = (
            f"the leader is at {sender}"
            if sender
            else "no server holds its lease now (it is being placed or handed over); retry"
        )
        return NotLeader(
            f"this server does not send {what} of keyspace {self.keyspace!r}: {where}",
            leader=sender,
        )


def unit_of(cfg: TableConfig) -> str:
    """The unit of the placement a table's manager goes with: a subscription's state table
    with its source table."""
    return cfg.source or cfg.name

"""The fault suite's judge: it knows nothing of the engine's bookkeeping.

It records every id the producer committed (and which are poison), every delivery (id,
subscriber, the attempt the message said, when it came off the stream, the server whose
stream it came off), every ack call (ids, when it began and when it returned: by then the
ack was committed), every settlement call (release, reject, renew: ids, when it started and
returned, what it answered, the reason given) and every fault (when it began and ended, the
server it hit), all on this process's monotonic clock. At the end it reads the message table
and its dead-letter table with its own SQL (:func:`read_tables`) and judges:

- every id was delivered; every ordinary id was acked (in the table, time_acked set, by an
  ack call that returned, or that failed in a fault after its commit) and is not a dead
  letter, unless its own delivery log explains the death (below); every poison id is in the
  dead-letter table exactly once and not in the table; no id is in both tables or in neither
  (but with ``subscribed``, the default group of a table with subscriptions, a dead letter's
  row stays in the table, acked, until every subscription settled it too);
- no id was delivered after it was acked (an ack call returned, or its time_acked: the ack's
  stamp as its call began, so the return of an ack call in flight then), nor
  after it died (a reject that answered 1, or the dead letter's time_dead), nor before a
  release's delay or a renew's extension (that answered 1) ended, nor at an attempt past
  vt_max_attempts;
- two deliveries of one id are at least vt_ack_wait apart (a message is never in flight to two
  subscribers at once, whatever was killed): their sends as the server stamped them (the
  message's sent_ns, from which its ack wait runs and a client's renewals count; a delivery
  received late, its subscriber slow to read, leaves its handler less of the wait), or their
  receipts when a send is not stamped; unless a release of it came between them (a
  release call running at some moment between them: one that started, or even returned,
  shortly before the first delivery came off the stream may have landed after its send,
  releasing it);
- an id's deliveries never count back: each says which delivery it is (``attempt``, at least
  1), and a later delivery's attempt is never below an earlier one's (equal is allowed: a
  server killed between the send and the epoch's write sends the same attempt again);
- a dead letter's ``attempts`` is at least the highest attempt seen, at most vt_max_attempts,
  and exactly vt_max_attempts when nobody rejected it; it may be below the highest attempt
  seen only by as many deliveries (at an attempt above it) as were followed, before it died,
  by a fault that can lose a send's count: a SIGKILL or SIGTERM of the server that sent it
  (any server's, if the sender is not known), or a database restart, or that server's loss
  of the table noticed too late to write its postpones (a lease that ran out on a busy
  machine: msgtable.engine.tenure.may_postpone), or a postpone of its that the placement
  row's fence kept out (the server counts both in msgtable_postpones_skipped_total{table},
  which the scrapes see rise: scrapecheck.count_losses). With vt_postpone_after
  > 0 a send is counted only by its deferred postpone or by its own server's ack or
  settlement, so a server that dies (or cannot reach the database as it closes) before
  writing either loses that count, as README "How delivery works" documents, and a reject
  answered by another server then writes the lower epoch. Its ``last_error`` is a reason a
  subscriber gave that id in a call that changed it (or may have: the call failed, or it
  answered 0 while a server or the database went down, its retry finding the first
  attempt's work done), or (none such) not empty;
- duplicates are counted, each with the reason its first delivery was not acked in time.
- every message a filter passes is delivered to the group within its ack wait once a
  subscriber with that filter (a stream filter, or none) is ready: connected, with room
  (tests/faults/filtercheck.py says when that is judged; subscribers say when they are ready
  with :meth:`Checker.ready` and :meth:`Checker.unready`).

One Checker judges one **group** of the table: its default group (the message table's own
columns; dead letters move to the dead-letter table), or a subscription (its state table
``<table>__<name>``, read by :func:`read_state_table`; dead letters stay in place there,
``time_next = 9223372036854775807`` and ``time_acked IS NULL``). A subscription's checker is
given its filter as a predicate on the id (``selects``): the ids inserted outside it must
never reach the group (not delivered, no state row). With ``purges`` the table purges acked
rows during the run: an id gone from the group's table is fine when this checker's own log
says the group acked it (an ack call returned, or failed in doubt: the purge is then taken as
proof that it committed, and counted). Given the message table's ids at the end
(``message_ids``), a subscription's checker also judges the purge rule: no row leaves the
message table while the group holds it (a state row not acked: unsettled, or dead, as dead
letters are kept), nor before the group got it (matched, no state row, never acked).

An ordinary id may die legitimately: vt_max_attempts counts sends, and faults eat them. The
checker accepts such a death only when its log shows it: a delivery at the last attempt that
was not acked within its ack wait (and why), or, when some sends never reached a subscriber
(a stream cut by a kill), every delivery it saw unacked for a known reason, no ack that
returned before it died, and at least as many faults around as sends it did not see. Each
is reported, with its story.

An **ordered** group (a table with vt_order_key; ``order_key`` gives each id's key as the
producer wrote it) is also judged by the independent order checker, tests/ordering.py, from
what its subscribers recorded in ``order`` (an OrderLog: each message's key as streamed, the
server's send time, when it came off the stream, when its subscriber began to settle it: an
ack, a release or a reject; a renewal does not settle). Per key, with enqueue order = id
order (the producer commits ascending ids): first deliveries in enqueue order, and a batch
of the key only after every message of the key's batch before it left flight (its
subscriber began to settle it, or its ack wait from the send was over: a renewal keeps a
message in flight longer, so the checker is lenient there, never strict). Besides, a batch's
messages of one key come in enqueue order, and a batch of a key begins at the key's head:
every message of the key before the batch's first was settled for good (an ack or a reject
of it began, or its dead letter's time_dead) before the batch arrived, so a released,
backing-off or timed-out message parks its key (check_order alone does not see a key's later
message overtake its released head: the head is not in flight meanwhile). Faults need no
exception here: a killed, stalled or late subscriber's batch leaves flight when its ack wait
is over; a new lease holder waits the old one's ack waits out.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

from ..ordering import Delivery, OrderLog, check_order
from .filtercheck import Readiness, Stall, stalls

WIRE_SLACK_S = 0.5  # a delivery this soon after an ack returned was on the wire already
LATE_RECEIPT_S = 1.0  # a delivery received this long after its send is counted as late
FAULT_WINDOW_S = 10.0  # faults this long before an id's first delivery may have eaten a send
LISTED = 20  # ids listed per finding in a report
# The faults that can lose the count of a send not yet postponed (vt_postpone_after > 0): its
# server killed, or stopped without reaching the database, and a database restart (every
# server's postpones fail meanwhile).
SERVER_FAULTS = frozenset({"msgtable SIGKILL", "msgtable SIGTERM under load"})
DATABASE_FAULTS = frozenset({"database restart", "database SIGKILL"})
# the network's faults (tests/netfault.FaultProxy): a database link's hit one server's
# connections to the database (or, without a server named, both servers'); the clients'
# reset every client connection to both servers
DATABASE_LINK_FAULTS = frozenset(
    {"database links reset", "database link slow", "database link cut"}
)
CLIENT_LINK_FAULTS = frozenset({"client links reset"})
NETWORK_FAULTS = DATABASE_LINK_FAULTS | CLIENT_LINK_FAULTS
# faults that can fail a call's one try, or lose its answer after it changed rows
CALL_FAULTS = SERVER_FAULTS | DATABASE_FAULTS | NETWORK_FAULTS
# faults that can lose a lazy subscription's window, where its acks live until its cursor
# passes them (msgtable.features.subscriptions.lazy): its sender killed or stopped, or cut
# off from the database (its lease lost, its flush on letting go failing)
WINDOW_FAULTS = SERVER_FAULTS | DATABASE_FAULTS | DATABASE_LINK_FAULTS
DEAD_TIME_NEXT = 9223372036854775807  # a message dead in place (the largest BIGINT)


@dataclass(frozen=True)
class Settled:
    """One settlement call as one id saw it."""

    verb: str  # "release", "reject" or "renew"
    sub: str
    start: float
    end: float
    # the call changed this id: True; did not: False; unknown (the call failed, or a batch's
    # count was between 0 and its size): None
    ok: bool | None
    span_s: float  # a release's delay, a renew's extension
    reason: str | None = None
    attempt: int = 0  # the delivery a release or renew named (0: none, by id alone)


@dataclass(frozen=True)
class Fault:
    """A fault, on this process's monotonic clock."""

    what: str
    at: float  # when it was over (recorded)
    began: float
    server: str = ""  # the server it hit ("": not known, or every server)
    # how long it may go on eating sends after ``at`` (a stalled subscriber: its stall)
    lasts_s: float = 0.0

    def loses_counts_of(self, server: str) -> bool:
        """Whether it can lose the count of a send by ``server`` ("": not known)."""
        if self.what in DATABASE_FAULTS:
            return True
        return self.what in SERVER_FAULTS | DATABASE_LINK_FAULTS and (
            not self.server or not server or server == self.server
        )

    def sends_it_may_eat(self, ack_wait_s: float) -> int:
        """How many sends of one id it may have kept from every subscriber: one, or, for a
        fault that lasts (a stalled subscriber, whose window gives its credit back as each
        ack wait ends, so the server goes on sending to it), one every ack wait."""
        if self.lasts_s <= 0 or ack_wait_s <= 0:
            return 1
        return 1 + int(self.lasts_s // ack_wait_s)

    def __str__(self) -> str:
        server = f" of {self.server}" if self.server else ""
        began = f" (began {self.began:.3f})" if self.at - self.began >= 0.001 else ""
        return f"{self.what}{server}{began}"


@dataclass(frozen=True)
class Close:
    """A subscriber closed mid-batch (Checker.closed_mid_batch)."""

    began: float
    ended: float
    rest: list[int]  # received, never handed out: what close() releases
    found: set[int] | None  # of those, the table showed released right after (None: not read)
    received: float  # when the client received them
    shown: Mapping[int, object]  # what the table showed of the others (for the report)


@dataclass(frozen=True)
class DeadRow:
    id: int
    attempts: int | None
    last_error: str | None
    time_dead_ns: int | None


@dataclass
class Tables:
    """A group's rows at the end, as the checker's SQL read them: the message table and its
    dead-letter table (the default group), or a subscription's state table (its live rows in
    ``source``, its dead-in-place rows in ``dead``)."""

    source: dict[int, int | None]  # id -> time_acked
    dead: list[DeadRow]


def committed_by(stamp: float, calls: Iterable[tuple[float, float]], slack: float) -> float:
    """The latest a change the server stamped at ``stamp`` (as its call began) committed: a
    statement may wait for a row that a send holds locked and commit after that send, so
    when calls that could have made it (``calls``: (began, returned)) were in flight at the
    stamp, the first of them to return bounds it; else the stamp itself. One rule for acks,
    rejects and the table events' acks (any clock, ``slack`` in its unit)."""
    return min((end for began, end in calls if began - slack <= stamp <= end), default=stamp)


def read_tables(db: sa.Engine, source: str, dead: str) -> Tables:
    with db.connect() as conn:
        rows = conn.exec_driver_sql(f"select id, time_acked from {source}").fetchall()
        dead_rows = conn.exec_driver_sql(
            f"select id, attempts, last_error, time_dead from {dead}"
        ).fetchall()
    return Tables(
        {int(i): acked for i, acked in rows},
        [DeadRow(int(i), a, e, t) for i, a, e, t in dead_rows],
    )


def read_state_table(db: sa.Engine, state: str) -> Tables:
    """A subscription's state table: its dead rows (dead in place: time_next the largest
    BIGINT, time_acked NULL; their attempts are the epoch) apart from the others."""
    with db.connect() as conn:
        rows = conn.exec_driver_sql(
            f"select id, time_acked, time_next, epoch, last_error, time_dead from {state}"
        ).fetchall()
    source: dict[int, int | None] = {}
    dead: list[DeadRow] = []
    for i, acked, time_next, epoch, error, time_dead in rows:
        if acked is None and time_next == DEAD_TIME_NEXT:
            dead.append(DeadRow(int(i), epoch, error, time_dead))
        else:
            source[int(i)] = acked
    return Tables(source, dead)


def read_state_pending(db: sa.Engine, state: str) -> tuple[set[int], set[int], set[int]]:
    """(ids unacked and alive, ids dead in place, every id) of a subscription's state table."""
    with db.connect() as conn:
        rows = conn.exec_driver_sql(
            f"select id, time_next from {state} where time_acked is null"
        ).fetchall()
        every = conn.exec_driver_sql(f"select id from {state}").fetchall()
    unacked = {int(i) for i, t in rows if t != DEAD_TIME_NEXT}
    dead_ids = {int(i) for i, t in rows if t == DEAD_TIME_NEXT}
    return unacked, dead_ids, {int(r[0]) for r in every}


def read_present(db: sa.Engine, table: str, ids: Iterable[int]) -> set[int]:
    """Which of ``ids`` the table still has."""
    wanted = sorted(ids)
    found: set[int] = set()
    with db.connect() as conn:
        for k in range(0, len(wanted), 5000):
            in_ids = ",".join(str(i) for i in wanted[k : k + 5000])
            rows = conn.exec_driver_sql(f"select id from {table} where id in ({in_ids})")
            found.update(int(r[0]) for r in rows)
    return found


def read_pending(db: sa.Engine, source: str, dead: str) -> tuple[set[int], set[int]]:
    """(the ids unacked in the table, the ids in the dead-letter table): what the drain
    waits on, cheaply (by then the table's index finds few unacked rows)."""
    with db.connect() as conn:
        unacked = conn.exec_driver_sql(
            f"select id from {source} where time_acked is null"
        ).fetchall()
        dead_ids = conn.exec_driver_sql(f"select id from {dead}").fetchall()
    return {int(r[0]) for r in unacked}, {int(r[0]) for r in dead_ids}


class Checker:
    """Records what happened, from the outside, and judges it at the end."""

    def __init__(
        self,
        ack_wait_s: float,
        max_attempts: int = 0,
        group: str = "",
        selects: Callable[[int], bool] | None = None,
        purges: bool = False,
        subscribed: bool = False,
        label: str = "",
        order_key: Callable[[int], Hashable] | None = None,
        stream_filters: Mapping[str, Callable[[int], bool]] | None = None,
        stranded_limit: int = 0,
        lazy: bool = False,
    ) -> None:
        self.ack_wait_s = ack_wait_s
        # a lazy subscription's group: an ack lives in its sender's window until the cursor
        # passes it, so a fault that loses the window may send it again (counted apart)
        self.lazy = lazy
        # its subscribers' stream filters, each a test of an id ("": none; tests/faults/
        # filtercheck.py), and how many messages no ready one passes may fill the cache
        self.stream_filters = dict(stream_filters or {"": lambda i: True})
        self.stranded_limit = stranded_limit
        self.readiness: list[Readiness] = []
        # (began, over) of each change of the group's table's sender the scrapes saw
        # (scrapecheck.sender_changes): a filter's check excuses it as it does a fault
        self.moves: list[tuple[float, float]] = []
        # (server, began, over) of each loss of the table by a server that could not write
        # the postpones of its sends then (scrapecheck.count_losses): their counts are lost
        self.count_losses: list[tuple[str, float, float]] = []
        self.inserted_at: dict[int, float] = {}  # id -> when the producer committed it
        self.max_attempts = max_attempts  # vt_max_attempts (0: none)
        self.group = group  # "": the table's default group; else the subscription's name
        self.selects = selects  # the group's filter, on the id (None: every message)
        self.purges = purges  # acked rows may leave the group's table during the run
        # the default group of a table with subscriptions: a dead letter's row stays in the
        # table, acked, until they settled it too
        self.subscribed = subscribed
        self._label = label  # what reports call the group ("": by its subscription's name)
        # an ordered table's key of each id (None: not ordered), and what its subscribers saw
        self.order_key = order_key
        self.order: OrderLog | None = OrderLog() if order_key is not None else None
        # an ordered table's: id -> the first time (unix ns) an ack or reject of it began
        self.settled_for_good: dict[int, int] = {}
        self.wall_offset_s = time.time() - time.monotonic()  # time_dead -> this clock
        self._lock = threading.Lock()
        self.inserted: set[int] = set()  # the ids committed that this group should get
        self.commits: list[tuple[float, int]] = []  # (when, how many of this group's) each
        self.outside: set[int] = set()  # the ids committed outside its filter
        self.poison: set[int] = set()
        # id -> (when it came off the stream, subscriber, the attempt the message said)
        self.deliveries: dict[int, list[tuple[float, str, int]]] = defaultdict(list)
        self.senders: dict[tuple[int, float], str] = {}  # (id, that time) -> the server
        # (id, that time) -> when its server sent it (the server's stamp, on this clock)
        self.sent_at: dict[tuple[int, float], float] = {}
        self.first_ack: dict[int, float] = {}  # id -> when the first ack naming it returned
        self.unacked_on_purpose: dict[tuple[int, str], str] = {}  # (id, sub) -> why
        self.slow: set[tuple[int, str]] = set()  # held by a slow handler, renewed
        self.failed_acks: set[int] = set()
        # id -> (began, returned) of each ack call naming it whose start is known, answered
        # or failed: its UPDATE committed in between (see _acked_at)
        self.ack_spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self.late_acks: list[tuple[int, int]] = []  # (acked by the late call, ids in it)
        self.ack_calls = 0
        self.settlements: dict[int, list[Settled]] = defaultdict(list)
        # the reasons given by calls that changed the id (answered 1), and by calls whose
        # outcome is unknown (failed, or a batch's count in between): written, or not
        self.reasons_given: dict[int, set[str]] = defaultdict(set)
        self.reasons_maybe: dict[int, set[str]] = defaultdict(set)
        self.counts: Counter[str] = Counter()  # verb -> messages the calls said they changed
        # each subscriber closed mid-batch
        self.closes: list[Close] = []
        self.events: list[Fault] = []

    # -- recording -----------------------------------------------------------------------
    def event(
        self, what: str, began: float | None = None, server: str = "", lasts_s: float = 0.0
    ) -> None:
        """A fault ``what`` is over now; it began at ``began`` (default: now) and hit
        ``server`` ("": not known, or every server); or it goes on for ``lasts_s`` more."""
        now = time.monotonic()
        with self._lock:
            began = now if began is None else began
            self.events.append(Fault(what, now, began, server, lasts_s))

    @property
    def label(self) -> str:
        if self._label:
            return self._label
        return f"subscription {self.group}" if self.group else "the default group"

    def insert(self, ids: Sequence[int], poison: Iterable[int] = ()) -> None:
        """The producer committed ``ids``: those its filter selects are this group's."""
        mine = ids if self.selects is None else [i for i in ids if self.selects(i)]
        now = time.monotonic()
        with self._lock:
            self.commits.append((now, len(mine)))
            for i in mine:
                self.inserted_at.setdefault(i, now)
            self.inserted.update(mine)
            self.outside.update(set(ids) - set(mine))
            self.poison.update(set(poison) & set(mine))

    def delivered(
        self,
        batch: Sequence[tuple[int, int]],
        sub: str,
        server: str = "",
        sent_ns: Sequence[int] = (),
    ) -> None:
        """A batch came off the stream (from ``server``, "": not known): (id, attempt) of
        each message; ``sent_ns``: when the server says it sent each (unix ns; 0 or none: not
        said)."""
        now, wall = time.monotonic(), time.time_ns()
        with self._lock:
            for k, (i, attempt) in enumerate(batch):
                self.deliveries[i].append((now, sub, attempt))
                if server:
                    self.senders[(i, now)] = server
                if k < len(sent_ns) and sent_ns[k]:
                    self.sent_at[(i, now)] = now - max(0, wall - sent_ns[k]) / 1e9

    def ready(self, sub: str, stream_filter: str = "") -> None:
        """``sub`` reads with ``stream_filter`` ("": none) and has room from now on."""
        with self._lock:
            self.readiness.append(Readiness(time.monotonic(), sub, stream_filter))

    def unready(self, sub: str) -> None:
        """``sub`` stopped reading (killed, stalled, closed, done)."""
        with self._lock:
            self.readiness.append(Readiness(time.monotonic(), sub, None))

    def dropped(self, ids: Sequence[int], sub: str, why: str) -> None:
        """The subscriber will not ack these (it is killed, stalled, or acks too late)."""
        with self._lock:
            for i in ids:
                self.unacked_on_purpose[(i, sub)] = why

    def held_slowly(self, ids: Sequence[int], sub: str) -> None:
        """A slow handler holds these past the ack wait, renewing them, then acks."""
        with self._lock:
            self.slow.update((i, sub) for i in ids)

    def acked(self, ids: Sequence[int], start: float | None = None) -> None:
        """An ack call naming ``ids`` (begun at ``start``, when known) returned now."""
        now = time.monotonic()
        with self._lock:
            self.ack_calls += 1
            for i in ids:
                self.first_ack.setdefault(i, now)
                if start is not None:
                    self.ack_spans[i].append((start, now))

    def settle_began(self, ids: Sequence[int], verb: str) -> None:
        """An ordered table's subscriber begins to ``verb`` ``ids`` now (this machine's unix
        ns, the OrderLog's clock): an ack or a reject settles them for good."""
        if verb not in ("ack", "reject"):
            return
        now = time.time_ns()
        with self._lock:
            for i in ids:
                self.settled_for_good.setdefault(i, now)

    def acked_any(self, ids: Iterable[int]) -> bool:
        """Whether an ack naming any of ``ids`` has returned."""
        with self._lock:
            return any(i in self.first_ack for i in ids)

    def ack_failed(self, ids: Sequence[int], start: float | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            self.failed_acks.update(ids)
            if start is not None:
                for i in ids:
                    self.ack_spans[i].append((start, now))

    def settled(
        self,
        verb: str,
        ids: Sequence[int],
        sub: str,
        start: float,
        count: int | None,
        span_s: float = 0.0,
        reason: str | None = None,
        attempts: Sequence[int] = (),
    ) -> None:
        """A release, reject or renew call of ``ids`` started at ``start`` returned now,
        answering ``count`` (None: it failed); ``attempts``: the delivery it named for each
        id (none: by id alone)."""
        end = time.monotonic()
        ok: bool | None = None  # a failed call (None), or a batch's count in between
        if count == len(ids):
            ok = True
        elif count == 0:
            ok = False
        with self._lock:
            self.counts[verb] += count or 0
            named = list(attempts) or [0] * len(ids)
            for i, attempt in zip(ids, named, strict=True):
                self.settlements[i].append(
                    Settled(verb, sub, start, end, ok, span_s, reason, attempt)
                )
                if reason and ok:
                    self.reasons_given[i].add(reason)
                elif reason and ok is None:  # a call that answered 0 wrote nothing
                    self.reasons_maybe[i].add(reason)

    def closed_mid_batch(
        self,
        rest: Sequence[int],
        began: float,
        ended: float,
        found: set[int] | None,
        received: float | None = None,
        rows: Mapping[int, object] | None = None,
    ) -> None:
        """A subscriber's close() ran from ``began`` to ``ended`` with ``rest`` received (at
        ``received``, default ``began``) and never handed out, to be released (no answer
        told); the table then showed ``found`` of them released (None: it was not read), and
        ``rows``: what it showed of the others (for the report)."""
        with self._lock:
            at = began if received is None else received
            self.closes.append(Close(began, ended, list(rest), found, at, dict(rows or {})))

    def auto_renewed(self, count: int) -> None:
        """Messages a subscriber's auto-renewal (its leaser) renewed."""
        with self._lock:
            self.counts["renew"] += count

    # -- questions during the run -------------------------------------------------------------
    def was_released(self, i: int) -> bool:
        with self._lock:
            return any(s.verb == "release" and s.ok for s in self.settlements.get(i, ()))

    def unsettled(
        self, unacked: set[int], dead: set[int], present: set[int] | None = None
    ) -> dict[str, list[int]]:
        """What is not settled yet, given the ids unacked in the table and the dead-letter
        table's ids ({} when everything is). The tables are the truth here: an ack whose
        answer was lost (its call failed in a fault, after the commit) settles too. With
        ``present`` (every id of a subscription's state table) also the ids it should have
        and does not (not handed over yet; an acked row purged is settled)."""
        with self._lock:
            ordinary = self.inserted - self.poison
            out = {
                "ordinary ids unacked in the table": sorted(ordinary & unacked),
                "poison ids not dead": sorted(self.poison - dead),
                "unknown ids unacked in the table": sorted(unacked - self.inserted),
            }
            if present is not None:
                acked = self.first_ack.keys() | self.failed_acks
                out["ids not handed over"] = sorted(self.inserted - present - acked)
        return {what: ids for what, ids in out.items() if ids}

    def all_acked(self) -> bool:
        with self._lock:
            return bool(self.inserted) and self.inserted <= self.first_ack.keys()

    def not_acked(self) -> tuple[set[int], set[int]]:
        """The ids no returned ack named, and those of them no failed ack named either (an
        ack whose answer a fault lost may have committed: the table says)."""
        with self._lock:
            missing = self.inserted - self.first_ack.keys()
            return missing, missing - self.failed_acks

    def missing(self) -> int:
        with self._lock:
            return len(self.inserted - self.first_ack.keys())

    def history(self, i: int) -> str:
        """One id's story, with the faults around it, for a failure message."""
        with self._lock:
            ds = sorted(self.deliveries.get(i, []))
            acked = self.first_ack.get(i)
            settles = self.settlements.get(i, [])
            lines = [
                f"{t:.3f} delivered to {sub} (attempt {a}{self._from(i, t)})" for t, sub, a in ds
            ]
            if acked is not None:
                lines.append(f"{acked:.3f} first ack returned")
            for s in settles:
                answer = {True: "1", False: "0", None: "?"}[s.ok]
                lines.append(
                    f"{s.start:.3f} {s.verb} by {s.sub} ({s.span_s:g}s, returned "
                    f"{s.end:.3f}) -> {answer}"
                )
            times = [float(line.split()[0]) for line in lines]
            if times:
                lo, hi = min(times) - 5, max(times) + 5
                lines += [f"{e.at:.3f} fault: {e}" for e in self.events if lo <= e.at <= hi]
            why = {s: w for (j, s), w in self.unacked_on_purpose.items() if j == i}
            kind = "poison" if i in self.poison else "ordinary"
            if i in self.outside:
                kind += ", outside the filter"
            last = f"last delivery {ds[-1][0]:.3f} to {ds[-1][1]}" if ds else "never delivered"
        return (
            f"{self.label}: id {i} ({kind}; {last}): "
            + "; ".join(sorted(lines))
            + f"; not acked on purpose by {why}"
        )

    # -- the verdict ---------------------------------------------------------------------
    def judge(self, tables: Tables | None = None, message_ids: set[int] | None = None) -> Report:
        """The report; with ``tables`` (the group's state at the end) also where every id
        ended; with ``message_ids`` (the message table's ids at the end) also the purge rule
        (a subscription's)."""
        r = Report(
            group=self.label,
            inserted=len(self.inserted),
            events=Counter(e.what for e in self.events),
            poison=len(self.poison),
            released=self.counts["release"],
            renewed=self.counts["renew"],
            rejected=self.counts["reject"],
        )
        with self._lock:
            dead = {} if tables is None else self._dead_rows(tables, r)
            died_at = self._died_at(dead)
            acked_at = self._acked_at(tables, dead.keys())
            r.never_delivered = sorted(self.inserted - self.deliveries.keys())[:LISTED]
            ordinary = self.inserted - self.poison
            # gone from the group's tables: purged, if its own log says it was acked
            purged: set[int] = set()
            if tables is not None and self.purges:
                gone = self.inserted - tables.source.keys() - dead.keys()
                purged = gone & (self.first_ack.keys() | self.failed_acks)
                r.purged = len(purged)
                r.acks_in_doubt_purged = len(purged - self.first_ack.keys())
            # acked: its ack returned, or its ack call failed (in doubt) and the table says
            # the ack committed (the answer was lost in a fault), or it was purged since
            in_doubt = (acked_at.keys() & self.failed_acks) - self.first_ack.keys()
            r.acks_in_doubt_committed = len(in_doubt & ordinary)
            acked = self.first_ack.keys() | in_doubt | purged
            r.never_acked = sorted(ordinary - acked - dead.keys())[:LISTED]
            r.poison_acked = sorted(self.poison & self.first_ack.keys())[:LISTED]
            r.outside_filter = sorted(self.deliveries.keys() & self.outside)[:LISTED]
            r.unknown = sorted(self.deliveries.keys() - self.inserted - self.outside)[:LISTED]
            for i, ds in self.deliveries.items():
                ds.sort()
                self._judge_deliveries(r, i, ds, died_at.get(i), acked_at.get(i))
            self._judge_late_settlements(r)
            self._judge_closes(r)
            lags = [t - sent for (_, t), sent in self.sent_at.items()]
            r.received_late = sum(lag >= LATE_RECEIPT_S for lag in lags)
            r.longest_receipt_s = round(max(lags, default=0.0), 3)
            # (an ordered group's messages wait for their key: the order checker judges them)
            r.filters = len(self.stream_filters) if self.order is None else 0
            r.filter_stalls = (
                []
                if self.order is not None
                else stalls(
                    self.stream_filters,
                    self.readiness,
                    self.inserted_at,
                    self.deliveries,
                    [(e.began, e.at) for e in self.events if e.what in CALL_FAULTS] + self.moves,
                    self.ack_wait_s,
                    time.monotonic(),
                    self.stranded_limit,
                )
            )
            if tables is not None:
                self._judge_tables(r, tables, dead, died_at, purged)
                if message_ids is not None:
                    self._judge_purge(r, tables, message_ids, acked)
            if self.order is not None:
                self._judge_order(r, dead)
        return r

    # -- ordering per key ----------------------------------------------------------------------
    def _enqueued_by_key(self) -> dict[Hashable, list[int]]:
        """Each key's ids in enqueue order (= id order: the producer commits ascending ids)."""
        assert self.order_key is not None
        out: dict[Hashable, list[int]] = defaultdict(list)
        for i in sorted(self.inserted):
            out[self.order_key(i)].append(i)
        return out

    def _judge_order(self, r: Report, dead: dict[int, DeadRow]) -> None:
        """The order checker (tests/ordering.py), key by key; each batch's order within a key
        and its start at the key's head; with the figures that say the run exercised it."""
        assert self.order is not None
        with self.order.lock:
            deliveries = list(self.order.deliveries)
        enqueued = self._enqueued_by_key()
        by_key: dict[Hashable, list[Delivery]] = defaultdict(list)
        batches: dict[tuple[str, int], list[Delivery]] = defaultdict(list)
        for d in deliveries:
            by_key[d.key].append(d)
            batches[(d.subscriber, d.sent_ns)].append(d)  # in the batch's order
        for key in sorted(enqueued.keys() | by_key.keys(), key=str):
            for line in check_order({key: enqueued.get(key, [])}, by_key[key], self.ack_wait_s):
                r.order_violations.append((key, line))
        position = {i: n for ids in enqueued.values() for n, i in enumerate(ids)}
        # when each id was settled for good at the latest: an ack or reject of it began, or
        # its dead letter's time_dead
        settled = dict(self.settled_for_good)
        for i, row in dead.items():
            if row.time_dead_ns is not None:
                settled[i] = min(settled.get(i, row.time_dead_ns), row.time_dead_ns)
        for (sub, _), batch in batches.items():
            runs: dict[Hashable, list[Hashable]] = defaultdict(list)
            for d in batch:
                runs[d.key].append(d.id)
            arrived = min(d.received_ns for d in batch)
            for key, ids in runs.items():
                r.longest_run = max(r.longest_run, len(ids))
                r.batches_with_runs += int(len(ids) > 1)
                if ids != sorted(ids, key=lambda i: position.get(i, -1)):
                    line = f"key {key!r}: a batch to {sub} carried {ids}, not in enqueue order"
                    r.order_violations.append((key, line))
                line = self._off_head(key, ids, sub, arrived, enqueued, position, settled)
                if line:
                    r.order_violations.append((key, line))
        subscribers = {key: {d.subscriber for d in ds} for key, ds in by_key.items()}
        r.order_keys = len(by_key)  # keys delivered
        r.order_batches = len(batches)
        r.keys_on_several_subscribers = sum(len(s) > 1 for s in subscribers.values())
        lags = [d.received_ns - d.sent_ns for d in deliveries if d.sent_ns]
        r.longest_wire_ms = round(max(lags, default=0) / 1e6, 1)

    @staticmethod
    def _off_head(
        key: Hashable,
        ids: list[Hashable],
        sub: str,
        arrived: int,
        enqueued: dict[Hashable, list[int]],
        position: dict[int, int],
        settled: dict[int, int],
    ) -> str:
        """A batch of a key begins at its head (its first message not settled for good): a
        released, backing-off or timed-out message parks its key, so every message of the key
        before the batch's first was acked, rejected or dead by the time it arrived. (A
        settlement begins before the server writes it, and the server reads the key's head
        after that: no slack.) Returns the violation ("" for none)."""
        first = min((position[i] for i in ids if i in position), default=0)  # type: ignore[index]
        for i in enqueued.get(key, [])[:first]:
            at = settled.get(i)
            if at is None or at > arrived:
                when = "never" if at is None else f"{(at - arrived) / 1e6:.1f} ms after it arrived"
                return (
                    f"key {key!r}: batch {ids} to {sub} skipped the key's head {i} (acked, "
                    f"rejected or dead {when})"
                )
        return ""

    def key_story(self, key: Hashable, limit: int = 60) -> str:
        """An ordered key's deliveries, as its subscribers recorded them (for a verdict):
        when each came (ms since the key's first), how long after its send, when its
        subscriber began to settle it and when that call returned (a call retried across a
        database restart may return long after it began); and the faults meanwhile."""
        assert self.order is not None
        with self.order.lock:
            ds = [d for d in self.order.deliveries if d.key == key]
        ds.sort(key=lambda d: (d.received_ns, str(d.id)))
        shown = ds[:limit]
        start = shown[0].received_ns if shown else 0
        lines: list[tuple[int, str]] = []
        for d in shown:
            settled = (
                "never settled"
                if d.settled_ns is None
                else f"settle began +{(d.settled_ns - d.received_ns) / 1e6:.1f} ms"
                + (
                    f", returned +{(d.done_ns - d.received_ns) / 1e6:.1f} ms"
                    if d.done_ns is not None
                    else ", never returned"
                )
            )
            lines.append(
                (
                    d.received_ns,
                    f"id {d.id} to {d.subscriber} (sent {(d.received_ns - d.sent_ns) / 1e6:.1f}"
                    f" ms before; {settled})",
                )
            )
        if shown:
            last = shown[-1].received_ns
            for e in self.events:
                at = round((e.at + self.wall_offset_s) * 1e9)
                if start - 5e9 <= at <= last:
                    lines.append((at, f"fault over: {e}"))
        lines.sort()
        more = f"\n  ... {len(ds) - limit} more" if len(ds) > limit else ""
        return (
            f"{self.label}: key {key!r}, {len(ds)} deliveries:\n"
            + "\n".join(f"  {(t - start) / 1e6:+.1f} ms: {line}" for t, line in lines)
            + more
        )

    def _judge_purge(
        self, r: Report, tables: Tables, message_ids: set[int], acked: set[int]
    ) -> None:
        """A subscription's purge rule: every row it holds (a state row not acked: unsettled
        or dead) or has not got yet (matched, no state row, never acked) is still in the
        message table."""
        held = {i: "unacked" for i, t in tables.source.items() if t is None}
        held.update((d.id, "dead") for d in tables.dead)
        missing = self.inserted - tables.source.keys() - held.keys() - acked
        held.update((i, "never handed over") for i in missing)
        r.gone_while_held = sorted((i, why) for i, why in held.items() if i not in message_ids)[
            :LISTED
        ]

    def _dead_rows(self, tables: Tables, r: Report) -> dict[int, DeadRow]:
        seen = Counter(d.id for d in tables.dead)
        r.dead_twice = sorted(i for i, n in seen.items() if n > 1)[:LISTED]
        return {d.id: d for d in tables.dead}

    def _acked_at(self, tables: Tables | None, dead: Collection[int]) -> dict[int, float]:
        """When each id was acked at the latest, on this clock: the first ack call that
        returned, or its time_acked in the table, whichever came first (a dead letter's row
        kept for subscriptions was settled by its death, not acked). time_acked is the ack's
        own stamp, taken as its call began and before its UPDATE waited for the row (a send
        of the same message holding its lock): when an ack call naming the id was in flight
        then, the ack committed by that call's return at the latest, and that is when."""
        out = dict(self.first_ack)
        if tables is not None:
            for i, acked_ns in tables.source.items():
                if acked_ns is not None and i not in dead:
                    t = acked_ns / 1e9 - self.wall_offset_s
                    t = committed_by(t, self.ack_spans.get(i, ()), WIRE_SLACK_S)
                    out[i] = min(out.get(i, t), t)
        return out

    def _died_at(self, dead: dict[int, DeadRow]) -> dict[int, float]:
        """When each id was dead at the latest, on this clock: its dead letter's time_dead,
        or a reject of it that answered 1 (its return), whichever came first. time_dead is
        the burial's stamp as it began; when a reject that answered 1 was in flight then,
        the burial may have waited for a send's lock and committed after it: that call's
        return bounds the death instead."""
        out: dict[int, float] = {}
        for i, row in dead.items():
            if row.time_dead_ns is not None:
                stamped = row.time_dead_ns / 1e9 - self.wall_offset_s
                rejects = [
                    (s.start, s.end)
                    for s in self.settlements.get(i, [])
                    if s.verb == "reject" and s.ok
                ]
                out[i] = committed_by(stamped, rejects, WIRE_SLACK_S)
        for i, settles in self.settlements.items():
            for s in settles:
                if s.verb == "reject" and s.ok:
                    out[i] = min(out.get(i, s.end), s.end)
        return out

    def _judge_deliveries(
        self,
        r: Report,
        i: int,
        ds: list[tuple[float, str, int]],
        died: float | None,
        acked_at: float | None,
    ) -> None:
        settles = self.settlements.get(i, [])
        releases = [s for s in settles if s.verb == "release"]
        for t, sub, attempt in ds:
            r.deliveries += 1
            r.attempts[attempt] += 1
            if acked_at is not None and t > acked_at + WIRE_SLACK_S:
                age = self._window_lost(acked_at, t)
                if age is not None:
                    r.after_ack_window_lost += 1
                    r.window_lost_ack_age_s = max(r.window_lost_ack_age_s, age)
                else:
                    r.after_ack.append((i, sub, round(t - acked_at, 3)))
            if died is not None and t > died + WIRE_SLACK_S:
                r.after_dead.append((i, sub, round(t - died, 3)))
            if self.max_attempts and attempt > self.max_attempts:
                r.beyond_max.append((i, attempt))
            for s in settles:  # within a release's delay or a renew's extension
                ends = s.start + s.span_s
                if s.ok and s.end + WIRE_SLACK_S < t < ends - WIRE_SLACK_S:
                    r.early.append((i, s.verb, round(ends - t, 3)))
        if ds[0][2] < 1:
            r.attempts_back.append((i, 1, ds[0][2]))
        for (t1, s1, a1), (t2, _, a2) in itertools.pairwise(ds):
            if a2 < a1:
                r.attempts_back.append((i, a1, a2))
            r.duplicates += 1
            # a release came between: its call ran at some point between the two (one that
            # started before the first delivery may have landed after it)
            released = any(s.start <= t2 and s.end >= t1 - WIRE_SLACK_S for s in releases)
            # the ack wait runs from the server's send, as it stamped it (sent_ns), when both
            # are stamped: a delivery received late does not make the sends closer
            sent1, sent2 = self.sent_at.get((i, t1)), self.sent_at.get((i, t2))
            sent_gap = None if sent1 is None or sent2 is None else round(sent2 - sent1, 3)
            gap = t2 - t1 if sent_gap is None else sent_gap
            if gap < self.ack_wait_s - WIRE_SLACK_S and not released:
                r.in_flight_twice.append((i, round(t2 - t1, 3), sent_gap))
            r.reasons[self._unacked_why(i, s1, released)] += 1

    def _window_lost(self, acked_at: float, t: float) -> float | None:
        """A lazy group's: a fault that can lose its sender's window came between an ack
        (at ``acked_at``) and a delivery again (at ``t``): how long after the ack the
        first such fault began (0: during it); None: none came."""
        if not self.lazy:
            return None
        return min(
            (
                max(0.0, e.began - acked_at)
                for e in self.events
                if e.what in WINDOW_FAULTS and e.at + WIRE_SLACK_S >= acked_at and e.began <= t
            ),
            default=None,
        )

    def _judge_late_settlements(self, r: Report) -> None:
        """A release or renew naming a delivery that a later one had replaced before the call
        began (a later attempt came off some stream first) must not change the id: it belongs
        to that delivery, which its handler gave up by its ack wait. Unless a fault, or its
        sender's loss of the table too late to postpone (``count_losses``), may have lost the
        count of the later send (the table then cannot tell the two apart)."""
        for i, settlements in self.settlements.items():
            ds = self.deliveries.get(i, [])
            for st in settlements:
                if st.verb not in ("release", "renew") or not st.attempt:
                    continue
                later = [(t, a) for t, _, a in ds if t < st.start and a > st.attempt]
                if not later:
                    continue
                r.late_settlements += 1
                if not st.ok:
                    continue
                t, a = max(later, key=lambda d: d[1])
                if self._count_lost(self.senders.get((i, t), ""), t, st.end):
                    continue
                r.late_settled.append((i, st.verb, st.attempt, a))

    def _judge_closes(self, r: Report) -> None:
        """What a closing subscriber never handed out, the table shows released right after
        its close() (the send counted, due at once, or sent again since), unless a server,
        database or network fault overlapped the close (its one try may fail: the ack wait is the
        net). Counted too: how much came back before the ack wait would have brought it
        (not all must: a group behind its producer sends older rows first)."""
        faults = [e for e in self.events if e.what in CALL_FAULTS]
        for c in self.closes:
            r.closes += 1
            r.closed_rest += len(c.rest)
            r.close_longest_s = max(r.close_longest_s, round(c.ended - c.received, 3))
            for i in c.rest:
                later = [t for t, _, _ in self.deliveries.get(i, []) if t > c.began]
                if later and min(later) < c.began + self.ack_wait_s - WIRE_SLACK_S:
                    r.closed_rest_early += 1
            if c.found is None:
                continue
            r.closed_rest_found += len(c.found)
            amid = any(e.began <= c.ended + WIRE_SLACK_S and e.at >= c.began for e in faults)
            missing = sorted(set(c.rest) - c.found)
            if missing and not amid:
                shown = {i: c.shown.get(i) for i in missing[:LISTED]}
                r.closes_not_released.append(
                    (
                        round(c.began, 3),
                        round(c.began - c.received, 3),
                        round(c.ended - c.began, 3),
                        shown,
                    )
                )

    def _released_after(self, i: int, sub: str, t: float) -> bool:
        """Whether ``sub`` released ``i`` after its delivery at ``t``."""
        return any(
            s.verb == "release" and s.sub == sub and s.start >= t
            for s in self.settlements.get(i, [])
        )

    def _unacked_why(self, i: int, sub: str, released: bool = False) -> str:
        why = self.unacked_on_purpose.get((i, sub))
        if why is not None:
            return why
        if released:
            return "released by its subscriber"
        if (i, sub) in self.slow:
            return "slow handler's renewal missed"
        return "ack failed" if i in self.failed_acks else "ack lost in a fault"

    def _judge_tables(
        self,
        r: Report,
        tables: Tables,
        dead: dict[int, DeadRow],
        died_at: dict[int, float],
        purged: set[int],
    ) -> None:
        source = tables.source
        rows = source.keys() | dead.keys()
        r.outside_filter += sorted((rows & self.outside) - set(r.outside_filter))[:LISTED]
        r.unknown += sorted(rows - self.inserted - self.outside)[:LISTED]
        both = source.keys() & dead.keys()
        if self.subscribed:  # kept, settled for this group, while subscriptions hold it
            both = {i for i in both if source[i] is None}
        r.in_both = sorted(both)[:LISTED]
        r.in_neither = sorted(self.inserted - source.keys() - dead.keys() - purged)[:LISTED]
        for i in sorted(self.poison):
            if i in dead:
                r.dead_poison += 1
            elif i in source:
                state = "acked" if source[i] is not None else "unacked in the table"
                r.poison_not_dead.append((i, state))
        for i in sorted(self.inserted - self.poison):
            if i in source and source[i] is None:
                r.ordinary_unacked.append(i)
            if i not in dead:
                continue
            why = self._why_dead(i, died_at.get(i))
            if why is None:
                r.dead_unexplained.append(i)
            else:
                r.dead_explained.append((i, why))
        for i, row in dead.items():
            self._judge_dead_letter(r, i, row, died_at.get(i))

    def _judge_dead_letter(self, r: Report, i: int, row: DeadRow, died: float | None) -> None:
        seen = max((a for _, _, a in self.deliveries.get(i, [])), default=0)
        attempts = row.attempts if row.attempts is not None else -1
        n = self.max_attempts
        rejected = any(s.verb == "reject" for s in self.settlements.get(i, []))
        short = attempts < seen
        if short and seen - attempts <= self._maybe_uncounted(i, attempts, died):
            r.attempts_uncounted.append((i, attempts, seen))  # the documented cost
            short = False
        if short:
            r.attempts_short.append((i, attempts, seen))
        elif n and (attempts > n or (not rejected and attempts != n)):
            r.attempts_off.append((i, attempts, n))
        given = self.reasons_given.get(i)
        maybe = self.reasons_maybe.get(i, set()) | self._denied_amid_faults(i)
        if (given and row.last_error not in given | maybe) or not row.last_error:
            r.bad_reason.append((i, row.last_error))

    def _denied_amid_faults(self, i: int) -> set[str]:
        """The reasons of calls that answered 0 while a server or the database went down, or
        the network failed: the call may have changed the row before the answer was lost,
        and its retry found it done."""
        faults = [e for e in self.events if e.what in CALL_FAULTS]
        return {
            s.reason
            for s in self.settlements.get(i, [])
            if s.ok is False
            and s.reason
            and any(e.began <= s.end and e.at >= s.start for e in faults)
        }

    def _from(self, i: int, t: float) -> str:
        server = self.senders.get((i, t))
        return f" from {server}" if server else ""

    def _maybe_uncounted(self, i: int, attempts: int, died: float | None) -> int:
        """How many of ``i``'s deliveries at an attempt above its dead letter's ``attempts``
        may have gone uncounted: a fault that can lose the count of a send by their server
        came after them and before ``i`` died, or that server lost the table then without
        writing its postpones (``count_losses``: it says so)."""
        end = float("inf") if died is None else died
        n = 0
        for t, _, a in self.deliveries.get(i, []):
            if a > attempts and self._count_lost(self.senders.get((i, t), ""), t, end):
                n += 1
        return n

    def _count_lost(self, server: str, t: float, end: float) -> bool:
        """Whether the count of a send by ``server`` at ``t`` may have been lost by ``end``:
        a fault that can lose it came after the send and began by then, or that server lost
        the table then without writing its postpones (``count_losses``: it says so)."""
        return any(
            e.loses_counts_of(server) and e.at + WIRE_SLACK_S >= t and e.began <= end
            for e in self.events
        ) or any(
            at == server and over + WIRE_SLACK_S >= t and began <= end
            for at, began, over in self.count_losses
        )

    def _why_dead(self, i: int, died: float | None) -> str | None:
        """Why an ordinary id died, as the checker's own log shows it (None: it does not)."""
        n = self.max_attempts
        ds = sorted(self.deliveries.get(i, []))
        acked_at = self.first_ack.get(i)
        if not n or not ds:
            return None
        for t, sub, a in reversed(ds):  # the last attempt, not acked within its ack wait
            if a >= n and (acked_at is None or acked_at >= t + self.ack_wait_s - WIRE_SLACK_S):
                late = "" if acked_at is None else f" (first ack {acked_at - t:.1f}s after)"
                why = self._unacked_why(i, sub, self._released_after(i, sub, t))
                return f"attempt {a} of {n} to {sub}: {why}{late}"
        if died is None or (acked_at is not None and acked_at < died):
            return None  # an ack that returned before the death should have won
        # sends the checker never saw (a stream cut by a kill): every delivery it did see
        # unacked for a known reason, and at least as many faults around as sends unseen. An
        # ack that returned only after the death found the row dead (a dead row is never
        # acked): a slow subscriber's late ack, which changed nothing.
        whys = [self._unacked_why(i, sub, self._released_after(i, sub, t)) for t, sub, _ in ds]
        if "ack lost in a fault" in whys:
            return None
        unseen = n - len({a for _, _, a in ds if a <= n})
        faults = [e for e in self.events if e.at >= ds[0][0] - FAULT_WINDOW_S and e.began <= died]
        if sum(e.sends_it_may_eat(self.ack_wait_s) for e in faults) < unseen:
            return None
        seen = sorted({a for _, _, a in ds})
        late = "" if acked_at is None else f"; ack after the death ({acked_at - died:.1f}s)"
        return (
            f"attempts {seen} of {n} seen, each unacked ({', '.join(sorted(set(whys)))}); "
            f"{unseen} sends unseen, amid {len(faults)} faults{late}"
        )


@dataclass
class Report:
    inserted: int
    events: Counter[str]
    group: str = "the default group"
    poison: int = 0
    deliveries: int = 0
    duplicates: int = 0
    released: int = 0
    renewed: int = 0
    rejected: int = 0
    dead_poison: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    never_delivered: list[int] = field(default_factory=list)
    never_acked: list[int] = field(default_factory=list)  # ordinary, not dead either
    acks_in_doubt_committed: int = 0  # ack calls failed in a fault, found acked in the table
    purged: int = 0  # acked (by this checker's log) and gone from the group's table
    acks_in_doubt_purged: int = 0  # of those, acked by a call that failed: taken as committed
    unknown: list[int] = field(default_factory=list)
    outside_filter: list[int] = field(default_factory=list)  # delivered, or a state row
    # messages a ready subscriber's filter passed, none delivered for longer than the ack
    # wait (tests/faults/filtercheck.py)
    filter_stalls: list[Stall] = field(default_factory=list)
    # (id, "unacked" / "dead" / "never handed over"): held by the group, gone from the table
    gone_while_held: list[tuple[int, str]] = field(default_factory=list)
    after_ack: list[tuple[int, str, float]] = field(default_factory=list)
    # a lazy group's deliveries after an ack that a fault lost with its sender's window
    after_ack_window_lost: int = 0
    window_lost_ack_age_s: float = 0.0  # the longest from such an ack to its fault
    after_dead: list[tuple[int, str, float]] = field(default_factory=list)
    # (id, "release" / "renew", how long before the delay / extension ended)
    early: list[tuple[int, str, float]] = field(default_factory=list)
    in_flight_twice: list[tuple[int, float, float | None]] = field(default_factory=list)
    # a release or renew of a delivery replaced before the call began: how many were made,
    # and (id, verb, attempt named, the later attempt) those that changed the id anyway
    late_settlements: int = 0
    # deliveries received LATE_RECEIPT_S or more after their server's send, the longest wait
    received_late: int = 0
    longest_receipt_s: float = 0.0
    # subscribers closed mid-batch, the ids their close released, those back within the ack
    # wait; (closes, ids) when none was
    closes: int = 0
    closed_rest: int = 0
    closed_rest_found: int = 0  # of those, the table showed released right after the close
    closed_rest_early: int = 0
    close_longest_s: float = 0.0  # the longest time from a closed batch's receipt to the end
    # (when the close began, how long after the receipt, how long it took, and the ids it
    # did not release though no fault overlapped it: what the table showed of each)
    closes_not_released: list[tuple[float, float, float, dict[int, object]]] = field(
        default_factory=list
    )
    late_settled: list[tuple[int, str, int, int]] = field(default_factory=list)
    attempts: Counter[int] = field(default_factory=Counter)  # attempt -> deliveries saying it
    # (id, the attempt it had reached, the lower attempt a later delivery said)
    attempts_back: list[tuple[int, int, int]] = field(default_factory=list)
    beyond_max: list[tuple[int, int]] = field(default_factory=list)  # (id, attempt)
    # where ids ended (with the tables)
    poison_acked: list[int] = field(default_factory=list)  # an ack of poison returned
    poison_not_dead: list[tuple[int, str]] = field(default_factory=list)
    ordinary_unacked: list[int] = field(default_factory=list)
    dead_explained: list[tuple[int, str]] = field(default_factory=list)
    dead_unexplained: list[int] = field(default_factory=list)
    in_both: list[int] = field(default_factory=list)
    in_neither: list[int] = field(default_factory=list)
    dead_twice: list[int] = field(default_factory=list)
    attempts_short: list[tuple[int, int, int]] = field(default_factory=list)  # (id, col, seen)
    # (id, col, seen): below what was seen, explained by faults that can lose a send's count
    attempts_uncounted: list[tuple[int, int, int]] = field(default_factory=list)
    attempts_off: list[tuple[int, int, int]] = field(default_factory=list)  # (id, col, max)
    bad_reason: list[tuple[int, str | None]] = field(default_factory=list)
    # an ordered table (tests/ordering.py's rules): (key, what was wrong), and the figures
    order_violations: list[tuple[Hashable, str]] = field(default_factory=list)
    order_keys: int = 0
    order_batches: int = 0
    batches_with_runs: int = 0  # a batch's messages of one key, counted once a key if >= 2
    longest_run: int = 0  # the most messages of one key in one batch
    keys_on_several_subscribers: int = 0
    longest_wire_ms: float = 0.0  # the longest time from a send to its receipt
    filters: int = 0  # the stream filters judged (none: 1, the group's own)

    def violations(self) -> dict[str, list[object]]:
        """Every finding that fails the run, by what it means ({} when none)."""
        found: dict[str, list[object]] = {
            "never delivered": list(self.never_delivered),
            "ordinary ids never acked (by a call that returned, or failed and committed)": list(
                self.never_acked
            ),
            "unknown ids": list(self.unknown),
            "outside its filter, delivered or given a state row": list(self.outside_filter),
            "a filter's messages waited past the ack wait while a subscriber of that filter "
            "was ready, none delivered": [str(s) for s in self.filter_stalls],
            "gone from the message table while held (id, state in the group)": list(
                self.gone_while_held
            ),
            "delivered after their ack (id, sub, s)": list(self.after_ack),
            "delivered after they died (id, sub, s)": list(self.after_dead),
            "delivered within a release's delay or a renewal (id, verb, s)": list(self.early),
            "in flight to two subscribers at once (id, gap s, between the server's sends s)": (
                list(self.in_flight_twice)
            ),
            "a late release or renew changed a later delivery (id, verb, named, later)": list(
                self.late_settled
            ),
            "a closed subscriber's unhanded messages not released (close began, s after the "
            "receipt, s it took, {id: (attempt, epoch, time_next from now s)})": list(
                self.closes_not_released
            ),
            "attempts counting back (id, reached, then)": list(self.attempts_back),
            "delivered past vt_max_attempts (id, attempt)": list(self.beyond_max),
            "poison acked": list(self.poison_acked),
            "poison not in the dead-letter table (id, state)": list(self.poison_not_dead),
            "ordinary ids unacked in the table": list(self.ordinary_unacked),
            "ordinary ids dead without explanation": list(self.dead_unexplained),
            "in both tables": list(self.in_both),
            "in neither table (a subscription: no state row)": list(self.in_neither),
            "dead twice": list(self.dead_twice),
            "dead letter's attempts below what was seen (id, attempts, seen)": list(
                self.attempts_short
            ),
            "dead letter's attempts not vt_max_attempts (id, attempts, max)": list(
                self.attempts_off
            ),
            "dead letter's last_error not a reason given (id, last_error)": list(self.bad_reason),
            "order per key broken (key, what)": list(self.order_violations),
        }
        return {what: ids for what, ids in found.items() if ids}

    def summary(self) -> str:
        faults = ", ".join(f"{n} {what}" for what, n in sorted(self.events.items()))
        reasons = ", ".join(f"{n} {why}" for why, n in self.reasons.most_common())
        explained = len(self.dead_explained)
        return (
            f"{self.group}: {self.inserted:,} messages ({self.poison:,} poison), "
            f"{self.deliveries:,} deliveries, {self.duplicates:,} duplicates "
            f"({reasons or 'none'}); faults: {faults}; released {self.released:,}, renewed "
            f"{self.renewed:,}, rejected {self.rejected:,}; dead: {self.dead_poison:,} poison, "
            f"{explained} other (explained), {len(self.dead_unexplained)} other unexplained; "
            f"never delivered {len(self.never_delivered)}, never acked "
            f"{len(self.never_acked)} (acks in doubt found committed "
            f"{self.acks_in_doubt_committed}); purged {self.purged:,} (acks in doubt "
            f"{self.acks_in_doubt_purged}); delivered after their ack {len(self.after_ack)} "
            f"(after a fault lost the lazy window's ack: {self.after_ack_window_lost}, made "
            f"up to {self.window_lost_ack_age_s:.1f} s before it), "
            f"after they died {len(self.after_dead)}, early {len(self.early)}, "
            f"in flight to two subscribers at once {len(self.in_flight_twice)}, "
            f"received {LATE_RECEIPT_S:g} s or more after their send {self.received_late} "
            f"(longest {self.longest_receipt_s} s), "
            f"late releases or renewals of a replaced delivery {self.late_settlements} "
            f"(changed it {len(self.late_settled)}), closed mid-batch {self.closes} "
            f"({self.closed_rest} unhanded, found released {self.closed_rest_found}, back "
            f"before the ack wait {self.closed_rest_early}, longest from receipt to the end "
            f"{self.close_longest_s} s), "
            f"attempts counting back {len(self.attempts_back)}, dead letters' attempts "
            f"below what was seen after a fault {len(self.attempts_uncounted)}, outside the filter "
            f"{len(self.outside_filter)}, a filter's messages stalled "
            f"{len(self.filter_stalls)} (filters {self.filters}), gone while held "
            f"{len(self.gone_while_held)}; "
            "deliveries by attempt "
            f"{dict(sorted(self.attempts.items()))}" + self.order_summary()
        )

    def order_summary(self) -> str:
        """An ordered table's figures ("" for another)."""
        if not self.order_keys:
            return ""
        return (
            f"; order per key: {self.order_keys} keys, {self.order_batches:,} batches, "
            f"{self.batches_with_runs:,} times several messages of one key in one batch "
            f"(at most {self.longest_run}), {self.keys_on_several_subscribers} keys went to "
            f"several subscribers, longest send to receipt {self.longest_wire_ms:g} ms, "
            f"order broken {len(self.order_violations)}" + self._order_broken_kinds()
        )

    def order_broken_by_kind(self) -> Counter[str]:
        """The order violations, counted by which rule they broke."""
        return Counter(_order_rule(line) for _, line in self.order_violations)

    def _order_broken_kinds(self) -> str:
        kinds = self.order_broken_by_kind()
        if not kinds:
            return ""
        return " (" + ", ".join(f"{n} {what}" for what, n in kinds.most_common()) + ")"


# which order rule a violation line (tests/ordering.py's, or the checker's own) broke
_ORDER_RULES = (
    ("first deliveries out of order", "first deliveries out of order"),
    ("left flight", "a batch while the key's last was in flight"),
    ("skipped the key's head", "a batch that skipped the key's head"),
    ("not in enqueue order", "a batch's run out of order"),
    ("were not enqueued", "ids not enqueued"),
)


def _order_rule(line: str) -> str:
    return next((rule for phrase, rule in _ORDER_RULES if phrase in line), "other")

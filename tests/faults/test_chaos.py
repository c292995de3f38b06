"""The fault suite (`make chaos` runs it and shows the counts): 100,000 messages through two
real `msgtable serve` processes sharing one database (the lease), four subscribers (one of
them auto-renewing) and a producer, while, over and over: a subscriber is killed mid-batch,
the leading server is killed with SIGKILL, a subscriber acks after its ack wait ended, the
database restarts, a subscriber stalls without reading, the database crashes (SIGKILL: no
shutdown, InnoDB's crash recovery at the next start), and the leading server gets SIGTERM
under load. The network fails too (MSGTABLE_CHAOS_NETWORK=0 leaves that out; see
tests/netfault.py: each server reaches the database through a fault proxy of its own, and
clients reach each server through another, which the server advertises): every client
connection is reset (streams mid-batch, calls in flight); every database connection of both
servers is reset mid-statement; the leader's database link is slow (NET_LATENCY_S a packet
each way, for NET_FAULT_S); and the leader's database link goes silent for NET_FAULT_S
(packets dropped, nothing closed: its lease is not renewed, the other server takes over),
then comes back with every connection reset. The database runs with a production server's
durability (every commit flushed, the binlog's included: msgtable.testing.devdb's durable=True), so
a crash loses nothing a commit returned for, and the checker holds it to that.

The table has vt_max_attempts and a dead-letter table (vt_dead_letter, schema/dead_letter.sql)
and keeps last_error. About 1% of the messages are poison: released every time (or rejected),
they must end in the dead-letter table and nowhere else; others are released once, or held
by a slow handler that renews them, then acked (tests/faults/chaos.py says which).

Besides its default group, the table has two subscriptions, created before the producer
starts: ``all`` (no filter: every message) and ``some`` (the matcher ``bucket=1|2`` on the
table's ``bucket`` column: half the messages, of every kind). Each has two subscribers of its
own (one auto-renewing), handling each kind as the default group's do, and each subscriber
fault hits one subscriber of every group at once; the server and database faults hit all.
Some subscribers read with a stream filter: two of the default group's four, a pair
``bucket = 0`` / ``NOT (bucket = 0)`` beside two without one, and both of ``some``'s, a pair
``bucket = 1`` / ``NOT (bucket = 1)`` (a filtered subscription whose streams filter too:
what one does not pass, only the other takes). Each group's checker also judges its filters
(tests/faults/filtercheck.py): every message a filter passes is delivered to its group within
its ack wait once a subscriber with that filter is connected and has room (outside the
servers', the database's and the network's faults and their recovery, nor of a change of
the table's sender that the scrapes saw (a lease lost on a busy machine: the streams still on
the old sender wait until it notices), and unless as many messages as may fill the cache wait
for a filter nobody ready has).
Acked rows are purged after PURGE_AFTER_S, so rows leave the table during the run, once every
group settled them.

An **ordered** table, ``chaos_ordered`` (vt_order_key=k, its own dead-letter table), runs in
the same run through the same servers and faults: ORDERED_TOTAL messages of the same kinds
over KEYS keys (runs of RUN consecutive ids per key), with its own producer and three
subscribers of its default group (one auto-renewing). Its checker judges it like the
default group above and, with the independent order checker (tests/ordering.py), per key:
first deliveries in enqueue order, a key's batch only after the batch before it left
flight, and each batch from the key's head (a released, backing-off or timed-out message
parks its key; a dead one lets it go on). It has a subscription too, ``audit`` (the matcher
``bucket=0|1|3``: three messages in four, so a key's runs have gaps), with two subscribers
of its own (one auto-renewing) through the same faults: a subscription orders on its own (its
state table carries the key, with its own order index), so its own checker judges its
deliveries by the same rules, apart from the default group's (a message parked in one group
holds no other).

Push and table events run in the same run through the same servers and faults
(tests/faults/push_and_capture.py): a table pushed to a receiver that misbehaves on its own
schedule, and a capture table of source tables a producer writes, drained by subscribers
that the subscriber faults hit too; each has its own checker (tests/faults/pushcheck.py,
tests/faults/capturecheck.py) and its line in the summary.

Both servers run with --metrics-listen and --http; a scraper polls their /metrics and
/api/state every 0.5 s through every fault, and tests/faults/scrapecheck.judge says whether
a live server always answered in time (5 s), counters never went down, one server held the lease
at quiescent points, and after the drain the backlog and the dead letters are what the
checkers know.

The chaos table carries each message's producer context (a traceparent column its producer
fills), and its subscribers trace with an SDK provider each: tests/faults/tracecheck.judge says
whether every message handed out, through every fault, reached a consumer span with its own
context (a batch span's links, a message span's parent), and whether every subscriber that
closed ended every span it started (a killed one leaves its last batch's open, as a dead
process would).

The judge is tests/faults/checker.Checker, one per group, which sees only what a user sees and
reads the tables with its own SQL (a subscription's state table ``<table>__<name>``), and the
purge rule across groups: no row leaves the table while a subscription holds it. Set
MSGTABLE_CHAOS_MESSAGES for a longer (or quicker) run. The database logs every deadlock with
both transactions' statements (innodb_print_all_deadlocks): the summary lists them, one line
each, and ``deadlocks.log`` in the test's directory keeps them whole; the run has none (the
purge picks its rows without a lock: msgtable.store.statements; the send's check locks in id
order; the placement locks its own rows by key).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa

from msgtable.client import Client
from msgtable.core.tables import current_layout_ddl
from msgtable.testing.devdb import LocalServer

from ..integration.helpers import comment
from ..netfault import FaultProxy
from ..waiting import wait_until
from .chaos import ORDER_KEY, Producer, ServerProcess, Subscriber, bucket_of, key_of
from .checker import (
    NETWORK_FAULTS,
    Checker,
    Report,
    read_pending,
    read_present,
    read_state_pending,
    read_state_table,
    read_tables,
)
from .drain import DRAIN_SAMPLE_S, Drain
from .push_and_capture import PushAndCapture
from .scrapecheck import Scrape, Scraper, count_losses, judge, loss_evidence, sender_changes
from .tracecheck import SpanLedger, Traced, TraceReport
from .tracecheck import judge as judge_traces

TOTAL = int(os.environ.get("MSGTABLE_CHAOS_MESSAGES", "100000"))
# the ordered table's messages (over chaos.KEYS keys)
ORDERED_TOTAL = int(os.environ.get("MSGTABLE_CHAOS_ORDERED_MESSAGES", "3000"))
ACK_WAIT_S = 2.0
LEASE_PERIOD_S = 1.0
# a restarted database stays down this long: past scrapecheck.NOTICE_S, so the servers'
# scrapes have time to say database_up 0 before it starts again
DATABASE_DOWN_S = 2.0
# before a stall: every unordered group made an ack call within FLOWING_S, waited for at most
# FLOWING_WAIT_S (Run.wait_flowing)
FLOWING_S = 0.5
FLOWING_WAIT_S = 10.0
SUBSCRIBERS = 4
LIVE_WAIT_S = 10.0  # how long a subscriber's fault waits for a subscriber free to take it
PRODUCE_FOR_S = 40.0  # the producer spreads its inserts over this long
CHUNK = 500
PAUSE_S = 2.0  # between faults
# the network's faults: a slow or silent database link lasts this long; a slow one passes
# each packet this late, each way
NET_FAULT_S = 3.0
NET_LATENCY_S = 0.15
RESETS = ("database links reset", "database link cut", "client links reset")
# The network's faults are in the cycle unless MSGTABLE_CHAOS_NETWORK=0 (the proxies are in
# place either way)
NETWORK = os.environ.get("MSGTABLE_CHAOS_NETWORK", "1") != "0"
# Poison dies after this many sends; an ordinary message takes one for its release (some) and
# one per fault that hits it (the faults above hit one at most three times so far).
MAX_ATTEMPTS = 5
TABLE, DEAD_TABLE = "chaos", "chaos_dead"
BATCH_SIZE = 100  # the chaos table's vt_batch_size
# each chaos message's producer context (tests/faults/tracecheck.py); the dead-letter table
# has every message column, this one too
TRACE_COLUMN = "traceparent varchar(55)"
DEAD_COLUMNS = "time_dead bigint, attempts bigint, last_error varchar(1000), bucket int"
ORDERED, ORDERED_DEAD = "chaos_ordered", "chaos_ordered_dead"
ORDERED_SUBSCRIBERS = 3
ORDERED_BATCH_SIZE = 20  # several keys' runs per batch, a run of RUN fits in one
ORDERED_CHUNK = 50  # its producer's transactions: RUN ids each of 10 keys
# Acked rows leave this long after (every group's) ack: the purge runs during the faults.
PURGE_AFTER_S = 5
# The subscriptions: name -> (filter, the ids it selects, its subscribers)
SOME_BUCKETS = (1, 2)
SUBSCRIPTIONS: dict[str, tuple[str | None, Callable[[int], bool] | None, int]] = {
    "all": (None, None, 2),
    "some": (
        "bucket=" + "|".join(str(b) for b in SOME_BUCKETS),
        lambda i: bucket_of(i) in SOME_BUCKETS,
        2,
    ),
}
# The subscriptions created with state_rows="lazy" (served from their cursor: state rows only
# for what was sent and not settled in cursor order); the others are eager (a state row per
# message). The filtered one is lazy: its scan's filter and its subscribers' stream filters.
LAZY = frozenset({"some"})
# Stream filters (tests/faults/filtercheck.py): each group's subscribers by their place (the
# last, auto-renewing, included; none past the tuple's end), a pair X / NOT (X) in the default
# group beside two without a filter, and in the filtered subscription some only such a pair
# (the subscriber faults hit its first, the kills take turns): what one stream's filter does
# not pass, the other's does. The filters of the ordered table's groups are not judged.
STREAM_FILTERS: dict[str, tuple[str, ...]] = {
    "": ("", "bucket = 0", "NOT (bucket = 0)", ""),
    "some": ("bucket = 1", "NOT (bucket = 1)"),
}
FILTER_TESTS: dict[str, Callable[[int], bool]] = {
    "": lambda i: True,
    "bucket = 0": lambda i: bucket_of(i) == 0,
    "NOT (bucket = 0)": lambda i: bucket_of(i) != 0,
    "bucket = 1": lambda i: bucket_of(i) == 1,
    "NOT (bucket = 1)": lambda i: bucket_of(i) != 1,
}
CACHE_SIZE = 5000  # the tables' vt_cache_size
# a filter's messages may wait while this many no ready subscriber's filter passes wait (they
# may fill the cache, README Filters): its half, as a due message may be in it twice a pass
STRANDED_LIMIT = CACHE_SIZE // 2


def stream_filters(group: str) -> dict[str, Callable[[int], bool]]:
    """The stream filters of ``group``'s subscribers, each as a test of an id."""
    return {f: FILTER_TESTS[f] for f in STREAM_FILTERS.get(group, ("",))}


# The ordered table's subscriptions, alike: each orders on its own (its state table carries
# the key, with its own order index); its filter leaves gaps in each key's runs
AUDIT_BUCKETS = (0, 1, 3)
ORDERED_SUBSCRIPTIONS: dict[str, tuple[str | None, Callable[[int], bool] | None, int]] = {
    "audit": (
        "bucket=" + "|".join(str(b) for b in AUDIT_BUCKETS),
        lambda i: bucket_of(i) in AUDIT_BUCKETS,
        2,
    ),
}


@dataclass
class Group:
    """One group of the chaos table (its default group, or a subscription): its subscribers,
    the last of which renews automatically, and its own checker."""

    name: str  # "": the default group
    checker: Checker
    size: int
    filter: str | None = None
    stream_filters: tuple[str, ...] = ()  # its subscribers', by their place ("": none)
    state_rows: str | None = None  # a subscription's ("lazy"; None: eager, the default)
    table: str = TABLE
    dead_table: str = DEAD_TABLE
    total: int = TOTAL  # the messages its producer inserts
    producer: Producer | None = None
    subscribers: list[Subscriber] = field(default_factory=list)
    retired: list[Subscriber] = field(default_factory=list)
    stall_progress: list[int] = field(default_factory=list)  # its acks during stalls
    # (began, ended) of each stall while its producer inserted: the stalled subscriber's
    stall_windows: list[tuple[float, float]] = field(default_factory=list)
    kills: int = 0
    lates: list[tuple[float, Subscriber]] = field(default_factory=list)  # "late" orders given

    def acked_during_stalls(self) -> list[int]:
        """How many ids were first acked during each stall, over all of it."""
        acked = list(self.checker.first_ack.values())
        return [sum(began <= t <= ended for t in acked) for began, ended in self.stall_windows]

    def stall_progress_judged(self) -> list[int]:
        """The progress the verdict asks of each stall: its ack calls in the ACK_WAIT_S + 1
        after the stall began; an ordered table's, its ids acked during the whole stall (its
        keys sent to the stalled subscriber wait an ack wait; the database restart before the
        stall leaves every key's head in flight, due again only a backoff later, and the lease
        holds sends an ack wait: a few seconds with nothing due is no fault)."""
        return self.acked_during_stalls() if self.table == ORDERED else self.stall_progress

    def stall_story(self, scrapes: Sequence[Scrape] = ()) -> str:
        """What the group did during each stall (for a verdict when it did not go on): its
        deliveries and acks then, and the faults around; then second by second from the wait
        for the groups to flow before it (wait_flowing) to its end: what its producer
        committed, what was delivered (to whom, from where) and acked, and what the leader's
        /api/state said of it (``scrapes``: the scraper's)."""
        c = self.checker
        out = []
        for began, ended in self.stall_windows:
            got = sum(began <= t <= ended for ds in c.deliveries.values() for t, _, _ in ds)
            acked = sum(began <= t <= ended for t in c.first_ack.values())
            faults = [f"{e.at:.3f} {e}" for e in c.events if began - 6 <= e.at <= ended]
            out.append(
                f"{began:.3f}-{ended:.3f}: {got} deliveries, {acked} ids acked; faults "
                f"before and during: {'; '.join(faults)}"
            )
            out += self._seconds(began - FLOWING_WAIT_S - 2, ended, scrapes)
        return "\n".join(out)

    def _seconds(self, start: float, end: float, scrapes: Sequence[Scrape]) -> list[str]:
        """The stall story's lines, one a second from ``start`` to ``end`` (monotonic)."""
        c = self.checker
        delivered = [
            (t, sub, c.senders.get((i, t), "?"))
            for i, ds in c.deliveries.items()
            for t, sub, _ in ds
            if start <= t <= end
        ]
        acked = [t for t in c.first_ack.values() if start <= t <= end]
        views = []  # (when, the name of its table's sender, its entry for this group)
        for s in scrapes:
            if s.kind != "state" or not s.state or not start <= s.began <= end:
                continue
            for entry in s.state["tables"]:
                if (
                    entry["name"] == self.table
                    and entry["subscription"] == self.name
                    and entry.get("sending")
                ):
                    views.append((s.began, s.server, entry))
        lines = []
        at = start
        while at < end:
            until = at + 1.0
            committed = sum(n for t, n in c.commits if at <= t < until)
            got = Counter(f"{sub}<-{server}" for t, sub, server in delivered if at <= t < until)
            seen = [v for v in views if at <= v[0] < until]
            leader = "no sender scraped"
            if seen:
                _, server, e = seen[-1]
                b = e["backlog"]
                leader = (
                    f"{server} sends: due {b['due']}, scheduled {b['scheduled']}, in flight "
                    f"{e['in_flight']}, cached {e['cached']}, subscribers {e['subscribers']}, "
                    f"hold {e['hold_s']}, unseen {e['unseen']}, sent {e['totals']['sent']}"
                )
            lines.append(
                f"  {at:.1f}: committed {committed}, delivered {sum(got.values())} "
                f"{dict(got) or ''}, acked {sum(at <= t < until for t in acked)}; {leader}"
            )
            at = until
        return lines

    def late_story(self) -> str:
        """What became of each "late" order (for a verdict when none made a late ack)."""
        out = []
        for at, s in self.lates:
            state = "done" if s.done.is_set() else "reading"
            pending = ", order still pending" if s.order == "late" else ""
            log = "; ".join(s.late_log) or "no late batch"
            out.append(f"{at:.3f} to {s.name} ({state}{pending}): {log}")
        return "\n".join(out)

    @property
    def state_table(self) -> str:
        return f"{self.table}__{self.name}" if self.name else ""

    @property
    def prefix(self) -> str:
        """What its subscribers' names begin with."""
        if self.name:
            return f"{self.name}-"
        return "ord-" if self.table == ORDERED else ""

    def everyone(self) -> list[Subscriber]:
        return self.subscribers + self.retired


class Run:
    """The moving parts of one chaos run, and the faults it can inflict."""

    def __init__(self, database: LocalServer, tmp_path: Path) -> None:
        self.database = database
        self.dsn = database.dsn("app")
        self.default = Group(
            "",
            Checker(
                ACK_WAIT_S,
                MAX_ATTEMPTS,
                purges=True,
                subscribed=bool(SUBSCRIPTIONS),
                stream_filters=stream_filters(""),
                stranded_limit=STRANDED_LIMIT,
            ),
            SUBSCRIBERS,
            stream_filters=STREAM_FILTERS[""],
        )
        self.groups = [self.default] + [
            Group(
                name,
                Checker(
                    ACK_WAIT_S,
                    MAX_ATTEMPTS,
                    group=name,
                    selects=selects,
                    purges=True,
                    stream_filters=stream_filters(name),
                    stranded_limit=STRANDED_LIMIT,
                    label=f"subscription {name} (lazy)" if name in LAZY else "",
                    lazy=name in LAZY,
                ),
                size,
                flt,
                stream_filters=STREAM_FILTERS.get(name, ()),
                state_rows="lazy" if name in LAZY else None,
            )
            for name, (flt, selects, size) in SUBSCRIPTIONS.items()
        ]
        self.ordered = Group(
            "",
            Checker(
                ACK_WAIT_S,
                MAX_ATTEMPTS,
                purges=True,
                subscribed=bool(ORDERED_SUBSCRIPTIONS),
                label=f"the ordered table {ORDERED}",
                order_key=key_of,
            ),
            ORDERED_SUBSCRIBERS,
            table=ORDERED,
            dead_table=ORDERED_DEAD,
            total=ORDERED_TOTAL,
        )
        self.groups.append(self.ordered)
        self.groups += [
            Group(
                name,
                Checker(
                    ACK_WAIT_S,
                    MAX_ATTEMPTS,
                    group=name,
                    selects=selects,
                    purges=True,
                    label=f"subscription {name} of {ORDERED}",
                    order_key=key_of,
                ),
                size,
                flt,
                table=ORDERED,
                dead_table=ORDERED_DEAD,
                total=ORDERED_TOTAL,
            )
            for name, (flt, selects, size) in ORDERED_SUBSCRIPTIONS.items()
        ]
        # The network: each server reaches the database through a fault proxy of its own
        # (its pools, its lease, its binlog reader), and clients reach each server through
        # another, which the server advertises (the lease table names it: a redirect to the
        # leader goes through it too). The checker, the producers and the scrapers go direct.
        self.db_links = [FaultProxy("127.0.0.1", database.port) for _ in (1, 2)]
        self.servers = [
            ServerProcess(
                sa.make_url(self.dsn).set(port=link.port).render_as_string(hide_password=False),
                tmp_path,
                f"server{n}",
                LEASE_PERIOD_S,
            )
            for n, link in enumerate(self.db_links, 1)
        ]
        self.client_links = [FaultProxy("127.0.0.1", s.port) for s in self.servers]
        for server, link in zip(self.servers, self.client_links, strict=True):
            server.advertised = link.address
        self.targets = ",".join(s.advertised for s in self.servers)
        self.link_resets: Counter[str] = Counter()  # connections each network fault reset
        # each fault of a database link, (began, over): for the scrape checker
        self.database_link_faults: list[tuple[float, float]] = []
        self.graceful_exits: list[int] = []
        self.takeovers_s: list[float] = []  # SIGKILL of the leader -> the other holds the lease
        self.flowing_waits_s: list[float] = []  # before each stall (wait_flowing)
        # each database restart's down time, (its process gone, it answers again): for the
        # scrape checker
        self.database_down: list[tuple[float, float]] = []
        self._names = iter(range(1, 1_000_000))
        # the chaos table's subscribers' spans (tests/faults/tracecheck.py)
        self.ledgers: list[tuple[Group, Subscriber, SpanLedger]] = []

    @property
    def checker(self) -> Checker:
        """The default group's checker."""
        return self.default.checker

    def event(self, what: str, began: float | None = None, server: str = "") -> None:
        """A fault that hits every group, over now (it began at ``began``, and hit
        ``server``'s address, "": every server)."""
        for g in self.groups:
            g.checker.event(what, began, server)

    # -- the parts ---------------------------------------------------------------------------
    def create_subscriptions(self) -> None:
        """Create the subscriptions through the leading server, and wait until both servers
        serve them."""
        subscriptions = [g for g in self.groups if g.name]
        leader = Client(self.leader().address, timeout_s=30)
        try:
            for g in subscriptions:
                leader.create_subscription(
                    g.table, g.name, filter=g.filter, state_rows=g.state_rows
                )
        finally:
            leader.close()
        wanted = {(g.table, g.name) for g in subscriptions}
        tables = sorted({table for table, _ in wanted})
        for server in self.servers:
            client = Client(server.address, timeout_s=10)

            def served(client: Client = client) -> bool:
                listed = [t for table in tables for t in client.list_subscriptions(table)]
                return {(t.name, t.subscription) for t in listed if t.config is not None} >= wanted

            try:
                wait_until(served, timeout_s=30, what=f"{server.name} serving {sorted(wanted)}")
            finally:
                client.close()

    def start_subscribers(self) -> None:
        for g in self.groups:
            g.subscribers = [
                self.subscriber(g, n == g.size - 1, (g.stream_filters or ("",) * g.size)[n])
                for n in range(g.size)
            ]

    def subscriber(
        self, group: Group, auto_renew: bool = False, stream_filter: str = ""
    ) -> Subscriber:
        name = f"{group.prefix}sub{next(self._names)}{'-auto' if auto_renew else ''}"
        # the chaos table's subscribers trace (its producer stores each message's context)
        ledger = SpanLedger(name) if group.table == TABLE else None
        s = Subscriber(
            name,
            self.targets,
            group.table,
            group.checker,
            auto_renew,
            group.name,
            self.dsn,
            tracer_provider=ledger.provider if ledger is not None else None,
            stream_filter=stream_filter,
            lazy=group.state_rows == "lazy",
        )
        if ledger is not None:
            self.ledgers.append((group, s, ledger))
        s.start()
        return s

    def judge_traces(self) -> TraceReport:
        """tests/faults/tracecheck.judge over the chaos table's subscribers, each with the
        ids its group's checker saw delivered to it."""
        traced = []
        for group, s, ledger in self.ledgers:
            deliveries = group.checker.deliveries
            got = {i for i, ds in deliveries.items() if any(sub == s.name for _, sub, _ in ds)}
            traced.append(Traced(ledger, got - s.unhanded, s.died))
        return judge_traces(traced, BATCH_SIZE)

    def keep_subscribers(self) -> None:
        """Replace subscribers that were killed or stalled out."""
        for g in self.groups:
            for i, s in enumerate(g.subscribers):
                if s.done.is_set():
                    g.retired.append(s)
                    g.subscribers[i] = self.subscriber(g, s.auto_renew, s.stream_filter)

    def everyone(self) -> list[Subscriber]:
        return [s for g in self.groups for s in g.everyone()]

    def _lease(self, table: str = TABLE) -> tuple[str, str] | None:
        """(holder, address) of ``table``'s unexpired lease (the servers share the tables:
        msgtable.engine.placement), if any (None also while the database does not answer)."""
        db = sa.create_engine(self.dsn)
        try:
            with db.connect() as conn:
                row = conn.exec_driver_sql(
                    "select holder, address from msgtable_placement where kind = 'table' "
                    "and name = %s and released = 0 and expires > utc_timestamp(6)",
                    (table,),
                ).first()
        except sa.exc.DBAPIError:
            return None
        finally:
            db.dispose()
        return (str(row[0]), str(row[1])) if row is not None else None

    def leader(self) -> ServerProcess:
        """The server that sends the chaos table, as the placement table names it (waiting
        for one to hold it): the one a "leader" fault hits."""
        found: list[ServerProcess] = []

        def named() -> bool:
            lease = self._lease()
            found[:] = [s for s in self.servers if lease is not None and s.advertised == lease[1]]
            return bool(found)

        wait_until(named, timeout_s=30, what="a leader")
        return found[0]

    def live(self, group: Group, auto_renew: bool = False) -> Subscriber:
        """A subscriber of ``group`` reading now with no order pending (an auto-renewing one
        only if asked: its client renews what a stalled or late handler holds). Waits up to
        LIVE_WAIT_S for one (a replacement subscribing, a reconnect after a kill): an order
        given to a subscriber that is gone, or that already has one, would be lost, and the
        fault with it. One that holds a late batch goes last (a kill or a stall would lose
        its late ack). Then any that is not done, else the first."""

        def ready() -> Subscriber | None:
            candidates = [
                s
                for s in group.subscribers
                if not s.done.is_set() and s.order is None and s.sub is not None
            ]
            for s in sorted(candidates, key=lambda s: (s.late_pending, s.auto_renew != auto_renew)):
                if auto_renew or not s.auto_renew:
                    return s
            return None

        deadline = time.monotonic() + LIVE_WAIT_S
        while (found := ready()) is None and time.monotonic() < deadline:
            self.keep_subscribers()  # replace the done ones meanwhile
            time.sleep(0.05)
        if found is not None:
            return found
        alive = [s for s in group.subscribers if not s.done.is_set() and not s.auto_renew]
        return alive[0] if alive else group.subscribers[0]

    # -- the faults (a subscriber's: one of every group at once) -----------------------------
    def kill_subscriber(self) -> None:
        for g in self.groups:
            g.kills += 1  # every other kill is the auto-renewing one's (its renewals end)
            self.live(g, auto_renew=g.kills % 2 == 0).order = "kill"
            g.checker.event("subscriber killed mid-batch")

    def close_subscriber(self) -> None:
        for g in self.groups:
            self.live(g).order = "close"
            g.checker.event("subscriber closed mid-batch")

    def kill_leader(self) -> None:
        server = self.leader()
        before = self._lease()
        began = time.monotonic()
        server.kill()
        killed_at = time.monotonic()
        self.event("msgtable SIGKILL", began, server.advertised)

        def taken_over() -> bool:
            lease = self._lease()
            return lease is not None and lease != before

        wait_until(
            taken_over,
            timeout_s=30,
            what=lambda: (
                "the other server taking the lease over; database links: "
                + "; ".join(link.state() for link in self.db_links)
            ),
        )
        self.takeovers_s.append(round(time.monotonic() - killed_at, 2))
        server.start()

    def late_ack(self) -> None:
        for g in self.groups:
            s = self.live(g)
            s.order = "late"
            g.lates.append((time.monotonic(), s))
            g.checker.event("ack after its ack wait")

    def restart_database(self) -> None:
        began = time.monotonic()
        self.database.stop()
        stopped = time.monotonic()  # a graceful stop can take seconds on a busy machine
        time.sleep(DATABASE_DOWN_S)
        self.database.start()
        self.event("database restart", began)  # over once it answers again
        self.database_down.append((stopped, time.monotonic()))
        self.log_deadlocks()

    def crash_database(self) -> None:
        """SIGKILL of the database under load: no shutdown; it comes back through InnoDB's
        crash recovery (its settings are durable: what a commit returned for is there)."""
        began = time.monotonic()
        self.database.kill()
        killed = time.monotonic()
        time.sleep(DATABASE_DOWN_S)
        self.database.start()
        self.event("database SIGKILL", began)  # over once it answers again
        self.database_down.append((killed, time.monotonic()))
        self.log_deadlocks()

    def log_deadlocks(self) -> None:
        """Have the database log every deadlock, both transactions' statements (read by
        :func:`deadlocks` at the end)."""
        self.database.execute("SET GLOBAL innodb_print_all_deadlocks = ON")

    def stall_subscriber(self) -> None:
        self.wait_flowing()
        # (busy: its producer still inserts, the acks it made so far) per group
        before = []
        for g in self.groups:
            busy = g.producer is not None and not g.producer.done.is_set()
            stalled = self.live(g)
            stalled.stall_s = 2 * ACK_WAIT_S + 1
            stalled.order = "stall"
            # from its next batch on it reads nothing for stall_s: a send of an id every ack
            # wait may go to it unseen (its window's credit comes back as each ack wait ends)
            g.checker.event("subscriber stalled", lasts_s=stalled.stall_s)
            before.append((busy, g.checker.ack_calls))
        began = time.monotonic()
        time.sleep(ACK_WAIT_S + 1)
        for g, (busy, calls) in zip(self.groups, before, strict=True):
            if busy:  # messages keep coming: the others must go on acking
                g.stall_progress.append(g.checker.ack_calls - calls)
                g.stall_windows.append((began, began + 2 * ACK_WAIT_S + 1))

    def wait_flowing(self) -> None:
        """Until every unordered group whose producer still inserts made an ack call in the
        last FLOWING_S (at most FLOWING_WAIT_S): the stall check judges a stall that begins
        while the others deliver. The fault before it (a database restart) can leave the
        lease changing hands for a few seconds more (a renewal slowed by the restarted
        database, then a takeover's hold and the subscribers redirected), and a pause then
        is that fault's, not the stall's. How long it waited goes into the summary."""
        groups = [
            g
            for g in self.groups
            if g.table != ORDERED and g.producer is not None and not g.producer.done.is_set()
        ]
        began = time.monotonic()
        while time.monotonic() - began < FLOWING_WAIT_S:
            calls = [g.checker.ack_calls for g in groups]
            time.sleep(FLOWING_S)
            if all(g.checker.ack_calls > c for g, c in zip(groups, calls, strict=True)):
                break
        self.flowing_waits_s.append(round(time.monotonic() - began, 1))

    def terminate_leader(self) -> None:
        server = self.leader()
        began = time.monotonic()
        self.graceful_exits.append(server.terminate())
        self.event("msgtable SIGTERM under load", began, server.advertised)
        server.start()

    # -- the network's faults -----------------------------------------------------------------
    def reset_database_links(self) -> None:
        """Every database connection of both servers (pools, lease, binlog reader) ends with a
        reset (RST), whatever statement was on it."""
        began = time.monotonic()
        self.link_resets["database links reset"] += sum(link.reset() for link in self.db_links)
        self.event("database links reset", began)
        self.database_link_faults.append((began, time.monotonic()))

    def slow_database_link(self) -> None:
        """The leader's database link passes every packet NET_LATENCY_S late, each way, for
        NET_FAULT_S (a statement's round trips: hundreds of ms; the lease's renewal with
        them, against a lease of LEASE_PERIOD_S)."""
        server = self.leader()
        link = self.db_links[self.servers.index(server)]
        began = time.monotonic()
        link.latency_s = NET_LATENCY_S
        time.sleep(NET_FAULT_S)
        link.latency_s = 0.0
        self.event("database link slow", began, server.advertised)
        self.database_link_faults.append((began, time.monotonic()))

    def cut_database_link(self) -> None:
        """The leader's database link goes silent for NET_FAULT_S: packets dropped, no FIN,
        no RST (its statements wait, its lease is not renewed, the other server takes over);
        then the link comes back and both ends of each connection get a reset."""
        server = self.leader()
        link = self.db_links[self.servers.index(server)]
        began = time.monotonic()
        link.blackhole = True
        time.sleep(NET_FAULT_S)
        self.link_resets["database link cut"] += link.heal()
        self.event("database link cut", began, server.advertised)
        self.database_link_faults.append((began, time.monotonic()))

    def reset_client_links(self) -> None:
        """Every client connection to both servers ends with a reset: streams mid-batch,
        acks and settlement calls in flight (some written, their answers lost)."""
        began = time.monotonic()
        self.link_resets["client links reset"] += sum(link.reset() for link in self.client_links)
        self.event("client links reset", began)

    def close_links(self) -> None:
        for link in self.db_links + self.client_links:
            link.close()

    def faults(self) -> list[Callable[[], None]]:
        network = {
            self.reset_client_links,
            self.reset_database_links,
            self.slow_database_link,
            self.cut_database_link,
        }
        cycle = [
            self.kill_subscriber,
            self.close_subscriber,
            self.reset_client_links,
            self.kill_leader,
            self.late_ack,
            self.reset_database_links,
            self.restart_database,
            self.stall_subscriber,
            self.slow_database_link,
            self.crash_database,
            self.cut_database_link,
            self.terminate_leader,
        ]
        return cycle if NETWORK else [f for f in cycle if f not in network]


def deadlocks(database: LocalServer) -> list[str]:
    """The deadlocks the database logged (innodb_print_all_deadlocks), each as its log says."""
    log = (database.datadir / "error.log").read_text(errors="replace")
    found = []
    for part in log.split("Transactions deadlock detected")[1:]:
        head, _, tail = part.partition("*** WE ROLL BACK TRANSACTION")
        found.append(f"{head}*** WE ROLL BACK TRANSACTION{tail.splitlines()[0] if tail else ''}")
    return found


def is_purge(logged: str) -> bool:
    """Whether a deadlock the database logged involves a purge's DELETE."""
    return any("DELETE FROM" in line and "`time_acked` <" in line for line in logged.splitlines())


def deadlock_digest(logged: str) -> str:
    """One deadlock in a line: each transaction's statement (its first 100 characters) and
    which one the database rolled back."""
    lines = logged.splitlines()
    statements = [
        f"({n}) {lines[k + 1][:100]}"
        for n, k in enumerate((k for k, line in enumerate(lines) if "thread id" in line), 1)
        if k + 1 < len(lines)
    ]
    victim = lines[-1].strip(" *") if lines else ""
    return f"{'; '.join(statements)}; {victim.lower()}"


def rows_of(
    db: sa.Engine, ids: list[int], g: Group | None = None
) -> dict[str, list[tuple[object, ...]]]:
    """What the tables say of ``ids`` (for a verdict): the message table's rows, the dead
    letters, and a subscription's state rows, each under its table's name and columns (of
    ``g``'s tables; None: the chaos table's default group)."""
    if not ids:
        return {}
    table, dead, state = (
        (TABLE, DEAD_TABLE, "") if g is None else (g.table, g.dead_table, g.state_table)
    )
    extra = f"{ORDER_KEY}, time_fanout" if table == ORDERED else "time_fanout"
    key = f", {ORDER_KEY}" if table == ORDERED else ""  # a state row carries the key
    in_ids = ",".join(str(i) for i in ids)
    queries = {
        f"{table} (id, epoch, time_next, time_acked, {extra}, last_error)": (
            f"select id, epoch, time_next, time_acked, {extra}, last_error from {table}"
        ),
        f"{dead} (id, attempts, time_dead, last_error)": (
            f"select id, attempts, time_dead, last_error from {dead}"
        ),
    }
    if state:
        queries[f"{state} (id, epoch, time_next, time_acked, time_dead, last_error{key})"] = (
            f"select id, epoch, time_next, time_acked, time_dead, last_error{key} from {state}"
        )
    out: dict[str, list[tuple[object, ...]]] = {}
    try:
        with db.connect() as conn:
            for what, sql in queries.items():
                rows = conn.exec_driver_sql(f"{sql} where id in ({in_ids}) order by id")
                out[what] = [tuple(r) for r in rows]
    except sa.exc.DBAPIError as exc:
        out["the database does not answer"] = [(str(exc)[:200],)]
    return out


def stories(db: sa.Engine, group: Group, ids: list[int], keys: Sequence[object] = ()) -> str:
    """The ids' stories as ``group``'s checker saw them, and their rows in the tables; and
    an ordered table's ``keys``' deliveries."""
    lines = [group.checker.history(i) for i in ids]
    if ids:
        lines.append(f"in the tables: {rows_of(db, ids, group)}")
    lines += [group.checker.key_story(k) for k in keys]
    return "\n".join(lines)


def first_ids(findings: dict[str, list[object]], n: int = 8) -> list[int]:
    """The first id of each finding that names its id first, at most ``n``."""
    out: list[int] = []
    for found in findings.values():
        first = found[0]
        i = first[0] if isinstance(first, tuple) else first
        if isinstance(i, int) and i not in out:
            out.append(i)
    return out[:n]


def first_keys(r: Report, n: int = 3) -> list[object]:
    """The first keys whose order was broken, at most ``n``."""
    out: list[object] = []
    for key, _ in r.order_violations:
        if key not in out:
            out.append(key)
    return out[:n]


def group_pending(db: sa.Engine, g: Group) -> dict[str, list[int]]:
    """What ``g`` has not settled yet, per its checker and the tables."""
    if not g.name:
        unacked, dead = read_pending(db, g.table, g.dead_table)
        return g.checker.unsettled(unacked, dead)
    unacked, dead, present = read_state_pending(db, g.state_table)
    return g.checker.unsettled(unacked, dead, present)


@pytest.fixture
def busy_machine() -> Iterator[int]:
    """MSGTABLE_CHAOS_HOGS busy processes (0 by default; `make chaos-busy`: 2, one a core
    here) spinning at normal priority for the whole run: a machine busy with other work."""
    n = int(os.environ.get("MSGTABLE_CHAOS_HOGS", "0"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield n
    finally:
        for h in hogs:
            h.kill()
            h.wait()


@pytest.mark.timeout(600)  # the faults (about 2 minutes), the drain (at most DRAIN_CAP_S)
def test_no_message_is_lost_or_in_flight_twice_and_poison_dies_under_faults(
    own_durable_server: LocalServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    busy_machine: int,
) -> None:
    own_server = own_durable_server
    run = Run(own_server, tmp_path)
    run.log_deadlocks()
    fields = dict(
        vt_ack_wait=ACK_WAIT_S,
        vt_min_backoff=0.5,
        vt_max_backoff=2,
        vt_poller_interval=0.5,
        vt_batch_size=BATCH_SIZE,
        vt_cache_size=CACHE_SIZE,
        vt_purge_after=3600,
    )
    dead_ddl = current_layout_ddl(DEAD_TABLE, comment(**fields))
    dead_ddl = dead_ddl.replace(
        "  primary key(id)", f"  {DEAD_COLUMNS},\n  {TRACE_COLUMN},\n  primary key(id)"
    )
    fields["vt_purge_after"] = PURGE_AFTER_S
    ddl = current_layout_ddl(
        TABLE, comment(**fields, vt_max_attempts=MAX_ATTEMPTS, vt_dead_letter=DEAD_TABLE)
    )
    ddl = ddl.replace(
        "  primary key(id)",
        f"  last_error varchar(1000),\n  bucket int not null,\n  {TRACE_COLUMN},\n"
        "  primary key(id)",
    )
    # the ordered table: the same comment, smaller batches, ordered by k (the order index)
    ordered_fields = dict(fields, vt_batch_size=ORDERED_BATCH_SIZE)
    ordered_dead_ddl = current_layout_ddl(
        ORDERED_DEAD, comment(**dict(ordered_fields, vt_purge_after=3600))
    )
    ordered_dead_ddl = ordered_dead_ddl.replace(
        "  primary key(id)", f"  {DEAD_COLUMNS}, {ORDER_KEY} varchar(32),\n  primary key(id)"
    )
    ordered_ddl = current_layout_ddl(
        ORDERED,
        comment(
            **ordered_fields,
            vt_max_attempts=MAX_ATTEMPTS,
            vt_dead_letter=ORDERED_DEAD,
            vt_order_key=ORDER_KEY,
        ),
    )
    ordered_ddl = ordered_ddl.replace(
        "  primary key(id)",
        f"  last_error varchar(1000),\n  bucket int not null,\n  {ORDER_KEY} varchar(32),\n"
        f"  primary key(id),\n  index order_idx({ORDER_KEY}, time_acked, id)",
    )
    extra = PushAndCapture(run.dsn, run.targets, TOTAL, PRODUCE_FOR_S, fields)
    db = sa.create_engine(run.dsn, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with db.connect() as conn:
        for statement in (dead_ddl, ddl, ordered_dead_ddl, ordered_ddl, *extra.ddl()):
            conn.exec_driver_sql(statement)
    for server in run.servers:
        server.start()
    # both servers' /metrics and /api/state, every 0.5 s, through every fault
    scraper = Scraper(run.servers)
    scraper.start()
    producer = Producer(
        run.dsn,
        TABLE,
        TOTAL,
        CHUNK,
        PRODUCE_FOR_S / max(1, TOTAL // CHUNK),
        [g.checker for g in run.groups if g.table == TABLE],
        traced=True,
    )
    ordered_producer = Producer(
        run.dsn,
        ORDERED,
        ORDERED_TOTAL,
        ORDERED_CHUNK,
        PRODUCE_FOR_S / max(1, ORDERED_TOTAL // ORDERED_CHUNK),
        [g.checker for g in run.groups if g.table == ORDERED],
        keyed=True,
    )
    producers = [producer, ordered_producer]
    for g in run.groups:
        g.producer = ordered_producer if g.table == ORDERED else producer
    pending: dict[str, list[int]] = {"everything": []}
    faults_s = 0.0
    drained_s: dict[str, float] = {}  # by part: how long after the faults it last had pending
    # by subscription (its label): its pending ids no longer in its message table, which
    # cannot settle
    gone_for_good: dict[str, set[int]] = {}

    def unsettled() -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        try:
            out.update(extra.pending(db))
            by_group: dict[str, tuple[Group, set[int]]] = {}
            for g in run.groups:
                found = group_pending(db, g)
                out.update((f"{g.checker.label}: {what}", ids) for what, ids in found.items())
                if found:
                    ids = {i for ids in found.values() for i in ids}
                    by_group[g.checker.label] = (g, ids)
            # a late ack still to come (it comes once another subscriber acked one of its
            # batch, which the drain brings about): the verdict needs it made
            late = [s.name for g in run.groups for s in g.subscribers if s.late_pending]
            if late:
                out[f"late acks still to come ({', '.join(late)})"] = []
            gone_for_good.clear()
            if by_group and all(g.name for g, _ in by_group.values()):
                for label, (g, ids) in by_group.items():
                    gone_for_good[label] = ids - read_present(db, g.table, ids)
        except sa.exc.DBAPIError as exc:
            return {f"the database ({exc.__class__.__name__})": []}
        return out

    def cannot_settle(pending: dict[str, list[int]]) -> bool:
        """Only subscriptions' ids are pending, and every one is gone from its table."""
        if not pending:
            return False
        for what, ids in pending.items():
            label = next((k for k in gone_for_good if what.startswith(f"{k}: ")), None)
            if label is None or not set(ids) <= gone_for_good[label]:
                return False
        return True

    try:
        run.create_subscriptions()
        extra.start(run.leader().address)
        run.start_subscribers()
        for p in producers:
            p.start()
        began = time.monotonic()
        cycles = 0
        while not all(p.done.is_set() for p in producers) or not extra.producers_done or cycles < 1:
            for fault in run.faults():
                time.sleep(PAUSE_S)
                run.keep_subscribers()
                extra.keep()
                extra.before_fault(fault)
                fault()
            cycles += 1
        faults_s = time.monotonic() - began
        drain = Drain(time.monotonic())
        while (pending := unsettled()) and drain.goes_on(time.monotonic(), pending):
            for what in pending:  # how long each part took to settle (for the summary)
                drained_s[what.split(":")[0]] = time.monotonic() - began - faults_s
            if cannot_settle(pending):
                break
            run.keep_subscribers()
            extra.keep()
            time.sleep(0.5)
        took = time.monotonic() - began
        if not pending:  # (d): what the leader reports once everything settled
            scraper.settled([(g.table, g.name) for g in run.groups], [TABLE, ORDERED])
    finally:
        scraper.stop()
        extra.finish()
        for s in run.everyone():
            s.finish()
        for server in run.servers:
            server.stop()
        run.close_links()
    if pending and not cannot_settle(pending):
        lines = []
        for g in run.groups:  # each group's first stuck ids: their stories and rows
            label = f"{g.checker.label}: "
            stuck = sorted(
                {i for what, ids in pending.items() if what.startswith(label) for i in ids[:3]}
            )
            if stuck:
                ordered = g.checker.order is not None
                keys = sorted({key_of(i) for i in stuck})[:2] if ordered else []
                lines.append(stories(db, g, stuck, keys))
        pytest.fail(
            f"not settled {drain.why}: "
            + "; ".join(f"{what}: {len(ids)} {ids[:10]}" for what, ids in pending.items())
            + f"\npending ids every {DRAIN_SAMPLE_S:g}s of the drain, by part: {drain.samples}"
            + "\nsubscribers: "
            + "; ".join(s.state() for g in run.groups for s in g.subscribers)
            + "\n"
            + "\n".join(lines + extra.stuck_stories(db, pending)),
            pytrace=False,
        )
    for g in run.groups:
        g.checker.auto_renewed(
            sum(s.sub.leaser.renewed for s in g.everyone() if s.sub is not None and s.sub.leaser)
        )
    # each message table's rows and dead letters (the default group's), by table
    tables = {
        t: read_tables(db, t, dead) for t, dead in ((TABLE, DEAD_TABLE), (ORDERED, ORDERED_DEAD))
    }
    reports: dict[str, Report] = {}  # by group label
    for g in run.groups:
        g.checker.moves = sender_changes(scraper.rounds, g.table)  # (its filters' check)
        address = {s.name: s.advertised for s in run.servers}
        g.checker.count_losses = [
            (address[name], began, over)
            for name, began, over in count_losses(scraper.rounds, g.table)
        ]
        if g.name:
            message_ids = set(tables[g.table].source)
            r = g.checker.judge(read_state_table(db, g.state_table), message_ids)
        else:
            r = g.checker.judge(tables[g.table])
        reports[g.checker.label] = r
    report = reports[run.checker.label]
    push_report, capture_report = extra.judge(db)
    scrape_report = judge(
        scraper,
        run.database_down,
        {  # a table's, and a subscription's as "TABLE/SUBSCRIPTION"
            f"{g.table}/{g.name}" if g.name else g.table: (
                r := reports[g.checker.label]
            ).dead_poison
            + len(r.dead_explained)
            + len(r.dead_unexplained)
            for g in run.groups
        },
        unquiet=run.database_link_faults,
    )
    trace_report = run.judge_traces()
    everyone = run.everyone()
    reconnects = sum(s.sub.reconnects for s in everyone if s.sub is not None)
    summary = (
        "chaos:\n"
        + "\n".join(
            f"{r.summary()}; late acks (acked, of) {run.groups[n].checker.late_acks}; "
            f"its acks during each stall {run.groups[n].stall_progress}"
            + (
                f" (ids acked during each whole stall {run.groups[n].acked_during_stalls()})"
                if run.groups[n].table == ORDERED
                else ""
            )
            for n, r in enumerate(reports.values())
        )
        + f"\n{push_report.summary()}\n{capture_report.summary()}"
        + f"\n{scrape_report.summary()}"
        + f"\n{trace_report.summary()}"
        + f"\n{cycles} fault cycles in {took:.0f}s"
        + (f" beside {busy_machine} CPU hogs" if busy_machine else "")
        + f" (the faults {faults_s:.0f}s, then the drain: "
        + ", ".join(f"{what} {t:.0f}s" for what, t in drained_s.items())
        + "); "
        f"{reconnects} stream reconnects; producer retries {[p.retries for p in producers]}; "
        f"SIGTERM exit codes {run.graceful_exits}; takeovers after SIGKILL "
        f"{run.takeovers_s}s; waits for the groups to flow before each stall "
        f"{run.flowing_waits_s}s; connections reset by the network's faults "
        f"{dict(run.link_resets)}"
    )
    found = deadlocks(own_server)
    (tmp_path / "deadlocks.log").write_text("\n".join(found))
    summary += f"\ndeadlocks the database logged: {len(found)} ({tmp_path / 'deadlocks.log'})"
    summary += "".join(f"\n  {deadlock_digest(d)}" for d in found)
    if pending:
        summary += "\nleft unsettled, gone from the table: " + "; ".join(
            f"{what}: {len(ids)} {ids[:10]}" for what, ids in pending.items()
        )
    explained = [
        f"  {r.group}: {i}: {why}" for r in reports.values() for i, why in r.dead_explained
    ]
    if explained:
        summary += "\nordinary messages dead, and why:\n" + "\n".join(explained)
    (tmp_path / "chaos-report.json").write_text(
        json.dumps(
            {
                "summary": summary,
                "reasons": {r.group: dict(r.reasons) for r in reports.values()},
                "dead_explained": {r.group: r.dead_explained for r in reports.values()},
                # what each group did during its stalls (the stall check's evidence, kept
                # beside the servers' logs whether or not the check fails)
                "stalls": {
                    r.group: g.stall_story(scraper.scrapes)
                    for g, r in zip(run.groups, reports.values(), strict=True)
                },
                # the excuses' evidence: each group's losses of its table without their
                # postpones, and the scrapes they were read from (scrapecheck.count_losses)
                "count_losses": {
                    r.group: g.checker.count_losses
                    for g, r in zip(run.groups, reports.values(), strict=True)
                },
                "loss_scrapes": {t: loss_evidence(scraper.rounds, t) for t in (TABLE, ORDERED)},
            },
            indent=2,
        )
    )
    with capsys.disabled():
        print(f"\n{summary}")

    verdicts = []
    for g, r in zip(run.groups, reports.values(), strict=True):
        violations = r.violations()
        if violations:
            verdicts.append(
                f"{r.group}:\n"
                + "\n".join(f"  {what}: {len(ids)} {ids[:10]}" for what, ids in violations.items())
                + "\n"
                + stories(db, g, first_ids(violations), first_keys(r))
            )
    verdicts += extra.verdicts(db, push_report, capture_report)
    if scrape_report.violations:
        verdicts.append(
            "the servers' metrics and dashboard:\n"
            + "\n".join(
                f"  {what}: {len(found)} {found[:5]}"
                for what, found in scrape_report.violations.items()
            )
        )
    if trace_report.problems:
        verdicts.append("tracing:\n" + "\n".join(f"  {p}" for p in trace_report.problems[:20]))
    db.dispose()
    if verdicts:
        pytest.fail("\n".join(verdicts) + f"\n{summary}", pytrace=False)
    assert pending == {}, summary
    # no deadlock of the purge (issue 42, item 5: 2-6 a run before it picked its rows with a
    # plain read), nor any other: the send's check read its rows one epoch at a time against
    # a renew (tests/integration/test_deadlocks.py), the placement's renewal locked a range
    # of msgtable_placement against a server giving its tables back at SIGTERM
    assert [d for d in found if is_purge(d)] == [], summary
    assert found == [], f"deadlocks the database logged:\n{summary}"
    assert extra.counts_ok(push_report, capture_report) == [], summary
    assert extra.errors() == [], summary
    for g in run.groups:  # each stream filter's subscribers were sent messages
        by_sub = {s.name: s.stream_filter for s in g.everyone()}
        got = {by_sub.get(sub) for ds in g.checker.deliveries.values() for _, sub, _ in ds}
        assert set(g.stream_filters) <= got, f"{g.checker.label}: filters {got}\n{summary}"
    for g, r in zip(run.groups, reports.values(), strict=True):
        selects = g.checker.selects
        assert r.inserted == sum(1 for i in range(1, g.total + 1) if selects is None or selects(i))
        # the faults made redeliveries, and they said so
        assert max(r.attempts) > 1, summary
        # settlement happened: poison died both ways, renewals kept slow handlers' messages
        assert r.dead_poison == r.poison > 0, summary
        assert r.released > 0 and r.rejected > 0 and r.renewed > 0, summary
        assert r.attempts[MAX_ATTEMPTS] > 0, summary  # poison reached its last attempt
        progress = g.stall_progress_judged()
        assert progress and all(p > 0 for p in progress), (
            f"{r.group}: a stalled stream held the others up:\n{g.stall_story(scraper.scrapes)}"
        )
    # the default group's late acks came for messages another subscriber had been sent and
    # acked by then (a late subscriber acks once that happened, LATE_BY_S at the soonest and
    # LATE_MAX_S at the latest: the poll takes rows by time_next, and fresh rows, at 0, go
    # before redeliveries, so a group that lags the producer sends a late batch again only
    # once it caught up; a subscription's late acks are only counted)
    default = next(g for g in run.groups if not g.name)
    late_story = f"the default group's late orders:\n{default.late_story()}"
    assert report.reasons["ack too late"] > 0, f"{late_story}\n{summary}"
    assert any(acked < of for acked, of in run.checker.late_acks), f"{late_story}\n{summary}"
    assert all(code == 0 for code in run.graceful_exits), run.graceful_exits
    # within two lease periods (and a poll of the lease table); the database restart
    # counts no takeover: the kill does not overlap it
    assert run.takeovers_s and max(run.takeovers_s) <= 2 * LEASE_PERIOD_S + 0.5, summary
    assert [s.error for s in everyone if s.error is not None] == []
    assert [s.handler.error for s in everyone if s.handler.error is not None] == []
    assert reconnects > 0
    network = NETWORK_FAULTS if NETWORK else ()
    for fault in ("database restart", "database SIGKILL", "msgtable SIGKILL", *network):
        assert report.events[fault] >= 1, f"no {fault}: {summary}"
    # the network's resets cut live connections (both servers' database links, the clients')
    assert not NETWORK or all(run.link_resets[f] > 0 for f in RESETS), summary
    # rows left the table during the run: the purge ran (and held what it had to)
    assert report.purged > 0, summary
    # the ordered table's order was exercised: every key delivered, runs of a key sent
    # together, keys spread over subscribers
    # (the default group's and each subscription's, on their own)
    for g in run.groups:
        if g.table != ORDERED:
            continue
        ordered = reports[g.checker.label]
        selects = g.checker.selects
        keys = {key_of(i) for i in range(1, ORDERED_TOTAL + 1) if selects is None or selects(i)}
        assert ordered.order_keys == len(keys), f"{ordered.group}\n{summary}"
        assert ordered.batches_with_runs > 0, f"{ordered.group}\n{summary}"
        assert ordered.keys_on_several_subscribers > 0, f"{ordered.group}\n{summary}"

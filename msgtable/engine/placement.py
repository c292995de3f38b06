"""Which server sends which table: the message tables of one database spread over the
msgtable servers that share it (and the SQL of it, all of it: the one table it owns).

Every server that shares the database keeps rows in ``msgtable_placement`` (created on first
use), all in the database's own clock (UTC_TIMESTAMP), so the servers' clocks never meet:

- its presence (kind ``server``, named by its id): its address and when it ends;
- a lease per unit it sends (kind ``table``, named by the table; kind ``capture``, named
  ``''``: the table-event follower, one per database): its id, its address, when the lease
  ends, and whether it was given back cleanly;
- the address of each other service it serves (kind ``service:NAME``, named by its id,
  renewed with its presence and written released, which no step counts as a unit: the SQS
  API's, so that a server forwards a call to the API of the table's sender).

Each step (a third of the period) renews the server's presence and its leases in one
transaction and reads every row. From what it read every server works out the same
assignment (msgtable.core.assignment): the live servers share the units, each unit going to
the server that ranks it highest (rendezvous hashing of server and unit) among those below
their share (every server has the units over the servers, rounded down, or one more), units
in name order, except that a unit stays with the live server that holds it while that server is
below its share. So a server that joins takes its share and nothing else moves, and the
tables of one that leaves or dies are spread over the others. Then it takes each unit
assigned to it that is free (no row, its lease ended or given back), hands over each unit
it holds that is assigned elsewhere now, and notes who sends the others.

A take is one transaction that reads the unit's row FOR UPDATE, so two servers never both
win; which server ought to send a unit is only ever a wish, the row decides. Servers that
disagree for a moment (one has discovered a table the other has not yet) only delay a
hand-over, never double a sender.

Fencing is the single lease's (msgtable.engine.lease), per unit: a renewal that began at local time
t makes the unit's lease valid until t + period on this server's monotonic clock, which ends
no later than the end the database wrote. A hand-over stops the unit's sends first
(``on_loss``: the engine closes the table's subscriptions and writes its postpones), then
gives the row back, released when every postpone was written, so the next sender need not
wait for the ack waits. ``Takeover`` tells the next sender how long ago the lease ended and
whether it was given back cleanly.

While a server of the versions before this one holds the old single lease
(``msgtable_lease``, a live row ``sender``), this server takes nothing: the old server sends
every table. Upgrade by stopping the old servers; the new ones take over within a period.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from msgtable.core.assignment import (
    SERVER,
    TABLE,
    assign,
    kind_of,
    unit_names,
    what,
)
from msgtable.core.latency import Timed, untimed
from msgtable.core.retry import Backoff, Outage, Retry
from msgtable.engine.lease import (
    LATE_LOG_EVERY,
    LEASE_NAME,
    LEASE_TABLE,
    LOCK_WAIT_TIMEOUT_S,
    MIN_LEASE_PERIOD_S,
    Takeover,
    session_wait_timeout_s,
)
from msgtable.errors import MsgtableError, Unavailable
from msgtable.limits import DEFAULT_LEASE_PERIOD_S
from msgtable.store.mysql import ACCESS_DENIED, database_error, error_code, sorted_error
from msgtable.store.statements import PLACEMENT_TABLE

log = logging.getLogger(__name__)

PLACEMENT_DDL = f"""CREATE TABLE IF NOT EXISTS {PLACEMENT_TABLE} (
  kind VARCHAR(16) NOT NULL,
  name VARCHAR(64) NOT NULL,
  holder VARCHAR(64) NOT NULL,
  address VARCHAR(255) NOT NULL,
  expires DATETIME(6) NOT NULL,
  released TINYINT NOT NULL DEFAULT 0,
  PRIMARY KEY (kind, name)
) COMMENT='msgtable: which server sends which message table of this database'"""
SERVICE = "service:"  # the kinds of a server's other services' rows: service:NAME
# Rows of units whose lease ended this long ago, and of servers gone this long, are deleted
# (by whichever server notices; nobody holds them): dropped tables, restarted servers.
FORGET_AFTER_S = 3600.0
FORGET_EVERY = 100  # steps between two such deletions


@dataclass(frozen=True)
class Row:
    """A row of the placement table as a step read it."""

    kind: str
    name: str
    holder: str
    address: str
    released: bool
    over_us: int  # how long ago it ended (negative: it has not)

    @property
    def live(self) -> bool:
        return self.over_us < 0 and not self.released


class Placement:
    """This server's share of the database's units: campaigns on its own connection.

    ``units()`` says which units this server can send (the tables it has loaded, and
    CAPTURE while some capture table is loaded); it is called on the placement's thread.
    Each unit gets a row as soon as one server knows it (unheld until its sender takes
    it), so a table one server discovered shows to the others at their next step:
    ``on_unknown(tables)`` tells of tables this server does not know yet (the engine
    discovers at once), at most once a period, so a table assigned to a server that has
    not discovered it yet waits a step, not a discovery interval.
    ``on_gain(unit, takeover)`` and ``on_loss(unit, sender) -> clean`` run there too; a
    hand-over gives the row back released when ``on_loss`` returns True (every postpone of
    the unit was written).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        address: str,
        period_s: float = DEFAULT_LEASE_PERIOD_S,
        *,
        units: Callable[[], Collection[str]],
        on_gain: Callable[[str, Takeover], None],
        on_loss: Callable[[str, str], bool],
        on_unknown: Callable[[set[str]], None] = lambda _units: None,
        holder: str | None = None,
        outage: Outage | None = None,
        timed: Timed = untimed,
        services: Mapping[str, str] | None = None,
    ) -> None:
        if period_s < MIN_LEASE_PERIOD_S:
            raise MsgtableError(f"the lease period must be at least {MIN_LEASE_PERIOD_S}s")
        self.holder = holder or uuid.uuid4().hex
        self.address = address
        self.period_s = period_s
        self._connect = connect
        self._units = units
        self._on_gain, self._on_loss = on_gain, on_loss
        self._on_unknown = on_unknown
        self._unknown_told = 0.0  # when on_unknown was last called (monotonic)
        self._outage = outage
        self._timed = timed
        self._conn: Any = None
        self._valid_until: dict[str, float] = {}  # monotonic, by unit held
        self._held_until: dict[str, float] = {}  # kept after a loss (see held_until_s)
        self._renewed_at: dict[str, float] = {}  # when the last step that renewed it began
        # unit -> another server's live lease of it as last read: (its address, when it ends
        # on this server's monotonic clock, at the latest); see sender()
        self._holders: dict[str, tuple[str, float]] = {}
        self._assigned: dict[str, str] = {}  # unit -> its server's id, as the last step decided
        self._servers: dict[str, str] = {}  # live server id -> address, as last read
        self.services = dict(services or {})  # this server's other services: name -> address
        self._services: dict[tuple[str, str], str] = {}  # (name, server address) -> address
        self.late_renewals = 0
        self.old_lease_holder = ""  # an old server's address while it holds msgtable_lease
        self._old_lease = False  # msgtable_lease exists: read its row each step
        self._prepared = False
        self._steps = 0
        # steps begun and done (their gains told), for await_step()
        self._steps_begun = self._steps_done = 0
        self._stepped = threading.Condition()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- what others ask -------------------------------------------------------------------
    def valid(self, unit: str) -> bool:
        """Whether this server sends ``unit`` now (by its own clock, conservatively)."""
        return time.monotonic() < self._valid_until.get(unit, 0.0)

    def held(self) -> list[str]:
        return sorted(self._valid_until)

    def held_until_s(self, unit: str) -> float:
        """When this server's last lease of ``unit`` ends or ended (monotonic; 0: never)."""
        return self._held_until.get(unit, 0.0)

    def sender(self, unit: str) -> str:
        """The address of the server that sends ``unit``, as last read ("": none or
        unknown); this server's own while it holds it. Never another server whose lease of
        it has run out since (by this server's clock), nor another holder at this server's
        own address (a predecessor killed at it)."""
        if unit in self._valid_until:
            return self.address
        if self.old_lease_holder:
            return self.old_lease_holder
        address, until = self._holders.get(unit, ("", 0.0))
        if address == self.address or time.monotonic() >= until:
            return ""
        return address

    def last_sender(self, unit: str) -> str:
        """The address of the server that sends ``unit`` as the last step read it ("": none
        or unknown), even if its lease, as read then, has run out since by this server's
        clock: what this server shows (ListTables, the dashboard), not where it sends a
        client (:meth:`sender`). On a loaded machine a step comes late, and every server
        still names the same sender until the next step tells otherwise."""
        if unit in self._valid_until:
            return self.address
        if self.old_lease_holder:
            return self.old_lease_holder
        address = self._holders.get(unit, ("", 0.0))[0]
        return "" if address == self.address else address

    def coming(self, unit: str) -> bool:
        """Whether ``unit`` is on its way to this server: the last step assigned it here
        (a step takes it once it is free: given back, or its lease ended), or took it and
        is telling the engine (on_gain)."""
        return unit in self._valid_until or self._assigned.get(unit) == self.holder

    def await_step(self, timeout_s: float, wake: bool = False) -> bool:
        """Wait until a step that begins after this call is done, its gains told (on_gain):
        what it read and decided is known then. ``wake``: that step begins at once (after
        the one in progress, if any), not at its time. False when ``timeout_s`` passed
        first, or the placement stopped."""
        with self._stepped:
            target = self._steps_begun + 1
            if wake:
                self._wake.set()
            done = self._stepped.wait_for(
                lambda: self._steps_done >= target or self._stop.is_set(), timeout_s
            )
        return done and not self._stop.is_set()

    def servers(self) -> dict[str, str]:
        """The live servers (id -> address) as the last step read them, this one included."""
        return dict(self._servers)

    def service(self, name: str, server: str) -> str:
        """The address of service ``name`` of the live server at ``server`` (its address),
        as the last step read it ("": none)."""
        return self._services.get((name, server), "")

    def wake(self) -> None:
        """Step soon (the units changed)."""
        self._wake.set()

    # -- set-up ----------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the placement table if it is missing; raise a clear error if we cannot
        (and Unavailable if the database does not answer)."""
        with self._timed("lease_prepare"):
            self._prepare()

    def _prepare(self) -> None:
        created = self._try(PLACEMENT_DDL)
        if created is not None:  # it may exist already, made by a user who may CREATE
            probed = self._try(f"SELECT 1 FROM {PLACEMENT_TABLE} LIMIT 1")
            if probed is not None:
                raise self._denied(probed if error_code(probed) in ACCESS_DENIED else created)
        # missing (or not ours to read): no server of an earlier version here
        self._old_lease = self._try(f"SELECT 1 FROM {LEASE_TABLE} LIMIT 1") is None
        self._rollback()
        self._prepared = True

    def _try(self, sql: str) -> BaseException | None:
        """Run ``sql`` (reading what it returns); the error it failed with (None: it ran).
        A database that does not answer raises Unavailable."""
        try:
            with self._cursor() as cur:
                cur.execute(sql)
                cur.fetchall()
            return None
        except MsgtableError:  # Unavailable, or a package the driver lacks
            raise
        except Exception as exc:
            error = database_error(exc)
            if isinstance(error, Unavailable):
                raise error from None
            return exc

    def _denied(self, exc: BaseException) -> MsgtableError:
        return MsgtableError(
            f"cannot use the placement table {PLACEMENT_TABLE} ({exc}); create it once with "
            "schema/msgtable_placement.sql and grant SELECT, INSERT, UPDATE, DELETE on it, or "
            "run one server alone with --no-lease"
        )

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, daemon=True, name="msgtable-placement"
            )
            self._thread.start()

    def close(self, released: Callable[[str], bool] = lambda _unit: True) -> None:
        """Stop campaigning; give back every unit held (``released(unit)``: every message
        of it sent has its postpone written) and this server's presence."""
        self._stop.set()
        self._wake.set()
        with self._stepped:
            self._stepped.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.period_s + 10)
        with self._lock:
            units = list(self._valid_until)
            for u in units:
                self._valid_until.pop(u, None)
            try:
                with self._timed("lease_release"), self._cursor() as cur:
                    for u in sorted(units, key=lambda u: (kind_of(u), u)):  # in key order
                        self._give_back(cur, u, released(u))
                    kinds = [SERVER, *(SERVICE + n for n in self.services)]
                    cur.execute(
                        f"UPDATE {PLACEMENT_TABLE} SET expires = UTC_TIMESTAMP(6) WHERE name = "
                        f"%s AND kind IN ({', '.join(['%s'] * len(kinds))})",
                        (self.holder, *kinds),
                    )
                    self._conn.commit()
            except Exception as exc:
                if units:
                    log.warning(
                        "placement: could not give its tables back (they end by themselves): %s",
                        exc,
                    )
            self._close_connection()

    # -- the campaign ----------------------------------------------------------------------
    def _run(self) -> None:
        step_s = self.period_s / 3
        retry = Retry("lease", log, Backoff(step_s, step_s), outage=self._outage)
        while not self._stop.is_set():
            self._wake.clear()
            with self._stepped:
                self._steps_begun += 1
            began = time.monotonic()
            again = False
            unknown: set[str] = set()
            # what the step did before any failure: each take is its own transaction
            took: list[tuple[str, Takeover]] = []
            handovers: list[tuple[str, str]] = []
            try:
                with self._lock:
                    if self._stop.is_set():
                        break
                    if not self._prepared:
                        self.prepare()
                    mine = set(self._units())
                    with self._timed("lease"):
                        rows = self._renew_and_read(began, mine)
                    again = self._late(began)
                    gains, handovers = self._decide(rows, mine, began)
                    unknown = _unknown(rows, mine, self.period_s)
                    for u in gains:
                        t = self._take(u)
                        if t is not None:
                            took.append((u, t))
                retry.succeeded()
                if self._outage is not None:
                    self._outage.up()
            except Exception as exc:
                retry.failed(sorted_error(exc))
                self._drop_connection()
            if handovers:
                log.info(
                    "placement: this server hands over %s (to %s)",
                    unit_names([u for u, _ in handovers]),
                    ", ".join(sorted({s or "another server" for _, s in handovers})),
                )
            for unit, sender in handovers:
                self._hand_over(unit, sender)
            if unknown and time.monotonic() - self._unknown_told >= self.period_s:
                self._unknown_told = time.monotonic()
                self._on_unknown(unknown)
            if took:
                log.info(
                    "placement: this server (%s) now sends %s",
                    self.address,
                    unit_names([u for u, _ in took]),
                )
            for unit, takeover in took:
                self._on_gain(unit, takeover)
            self._lose_ended(began)
            with self._stepped:
                self._steps_done += 1
                self._stepped.notify_all()
            if again:
                continue  # a late renewal: renew again at once
            self._wake.wait(max(0.0, step_s - (time.monotonic() - began)))

    def _late(self, began: float) -> bool:
        """Whether the step that began at ``began`` renewed units but came back after the
        validity it gave: no other server can have taken them meanwhile (a take writes its
        holder, and the renewal found this one's), so this is no loss, only a pause."""
        if not self._valid_until or time.monotonic() < began + self.period_s:
            return False
        self.late_renewals += 1
        late = self.late_renewals
        if late == 1 or late % LATE_LOG_EVERY == 0:
            log.warning(
                "placement: a renewal took %.2fs, past the %gs period: sends paused until the "
                "next one (the tables are still this server's; %d such so far)",
                time.monotonic() - began,
                self.period_s,
                late,
            )
        return True

    def _lose_ended(self, began: float) -> None:
        """Units whose validity ended without a renewal (the database did not answer, or
        another server holds the row now): this server stops sending them."""
        now = time.monotonic()
        lost = []
        for unit, until in list(self._valid_until.items()):
            late = self._renewed_at.get(unit) == began and now - began < 2 * self.period_s
            if now < until or late:
                continue
            del self._valid_until[unit]
            lost.append(unit)
        if lost:
            log.warning(
                "placement: lost %s (not renewed within %gs); this server stops sending them",
                unit_names(lost),
                self.period_s,
            )
        for unit in lost:
            self._on_loss(unit, self.sender(unit))

    def _renew_and_read(self, began: float, mine: set[str]) -> list[Row]:
        """One transaction: renew this server's presence and the units it holds, read every
        row (and the old single lease's, when there is one), and give a row (unheld) to each
        unit of ``mine`` that has none yet."""
        period_us = round(self.period_s * 1e6)
        held = list(self._valid_until)
        with self._cursor() as cur:
            # each of its rows by its whole primary key, in key order: it locks those rows
            # alone (``kind <> 'server'``, a range, locked every server's leases; a range per
            # kind locks the row past its end in REPEATABLE READ: another server's)
            for kind, name in sorted((kind_of(u), u) for u in held):
                cur.execute(
                    f"UPDATE {PLACEMENT_TABLE} SET expires = UTC_TIMESTAMP(6) + INTERVAL %s "
                    "MICROSECOND WHERE kind = %s AND name = %s AND holder = %s AND released = 0",
                    (period_us, kind, name, self.holder),
                )
            self._renew_presence(cur, period_us)
            cur.execute(
                "SELECT kind, name, holder, address, released, "
                "TIMESTAMPDIFF(MICROSECOND, expires, UTC_TIMESTAMP(6)) "
                f"FROM {PLACEMENT_TABLE}"
            )
            rows = [
                Row(str(k), str(n), str(h), str(a), bool(r), int(o))
                for k, n, h, a, r, o in cur.fetchall()
            ]
            new = sorted(mine - {r.name for r in rows if r.kind != SERVER})
            if new:  # rows others see (held by nobody yet), in one statement
                cur.execute(
                    f"INSERT IGNORE INTO {PLACEMENT_TABLE} (kind, name, holder, address, "
                    "expires, released) VALUES "
                    + ", ".join(["(%s, %s, '', '', UTC_TIMESTAMP(6), 0)"] * len(new)),
                    [v for unit in new for v in (kind_of(unit), unit)],
                )
            old = self._old_lease_address(cur) if self._old_lease else ""
            self._steps += 1
            if self._steps % FORGET_EVERY == 0:
                # rows picked by the plain read above, deleted by primary key: a DELETE by
                # ``expires`` would lock every row of the table, other servers' too
                for r in sorted((r for r in rows if r.over_us > FORGET_AFTER_S * 1e6), key=_key):
                    cur.execute(
                        f"DELETE FROM {PLACEMENT_TABLE} WHERE kind = %s AND name = %s "
                        "AND expires < UTC_TIMESTAMP(6) - INTERVAL %s SECOND",
                        (r.kind, r.name, round(FORGET_AFTER_S)),
                    )
            self._conn.commit()
        for r in rows:
            if r.kind != SERVER and r.holder == self.holder and not r.released and r.name in held:
                self._renewed_at[r.name] = began
                self._valid_until[r.name] = self._held_until[r.name] = began + self.period_s
        if old and not self.old_lease_holder:
            log.warning(
                "placement: a server of an earlier version (%s) holds the single lease "
                "(%s): this server sends nothing until it stops",
                old,
                LEASE_TABLE,
            )
        self.old_lease_holder = old
        return rows

    def _renew_presence(self, cur: Any, period_us: int) -> None:
        """This server's row (its presence and address) and its services' rows, renewed."""
        cur.execute(
            f"INSERT INTO {PLACEMENT_TABLE} (kind, name, holder, address, expires, released) "
            "VALUES (%s, %s, %s, %s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, 0) "
            "ON DUPLICATE KEY UPDATE address = %s, "
            "expires = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND",
            (
                SERVER,
                self.holder,
                self.holder,
                self.address,
                period_us,
                self.address,
                period_us,
            ),
        )
        for name, address in self.services.items():
            cur.execute(
                f"INSERT INTO {PLACEMENT_TABLE} (kind, name, holder, address, expires, "
                "released) VALUES (%s, %s, %s, %s, UTC_TIMESTAMP(6) + INTERVAL %s "
                "MICROSECOND, 1) ON DUPLICATE KEY UPDATE address = %s, "
                "expires = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND",
                (SERVICE + name, self.holder, self.holder, *(address, period_us) * 2),
            )

    def _old_lease_address(self, cur: Any) -> str:
        """The address of a live holder of the old single lease ("" none)."""
        cur.execute(
            f"SELECT address, released, TIMESTAMPDIFF(MICROSECOND, expires, "
            f"UTC_TIMESTAMP(6)) FROM {LEASE_TABLE} WHERE name = %s",
            (LEASE_NAME,),
        )
        got = cur.fetchone()
        if got is not None and not got[1] and int(got[2]) < 0:
            return str(got[0])
        return ""

    def _decide(
        self, rows: list[Row], mine: set[str], began: float
    ) -> tuple[list[str], list[tuple[str, str]]]:
        """From the rows a step that began at ``began`` read: the units to take, and those
        to hand over (with the address of the server they go to)."""
        servers = {r.name: r.address for r in rows if r.kind == SERVER and r.over_us < 0}
        servers[self.holder] = self.address
        self._servers = servers
        self._services = {
            (r.kind[len(SERVICE) :], servers[r.name]): r.address
            for r in rows
            if r.kind.startswith(SERVICE) and r.over_us < 0 and r.name in servers
        }
        leases = {r.name: r for r in rows if r.kind != SERVER and not r.kind.startswith(SERVICE)}
        # a lease read as ending in d ends at began + d at the latest on this clock
        self._holders = {
            n: (r.address, began - r.over_us / 1e6)
            for n, r in leases.items()
            if r.live and r.holder != self.holder
        }
        if self.old_lease_holder:  # an old server sends everything
            self._assigned = {}
            return [], [(u, self.old_lease_holder) for u in self._valid_until]
        # every server's units: those it knows, those held, and those another server gave a
        # row lately (it discovered them first): the same set everywhere within a step
        recent_us = 2 * self.period_s * 1e6
        units = mine | {
            n for n, r in leases.items() if r.live or (not r.holder and r.over_us < recent_us)
        }
        holders = {n: r.holder for n, r in leases.items() if r.live}
        owner = assign(units, servers, holders)
        self._assigned = owner
        take = []
        for u in sorted(mine - self._valid_until.keys()):
            r = leases.get(u)
            if owner.get(u) == self.holder and (r is None or not r.live or r.holder == self.holder):
                take.append(u)
        hand = [
            (u, servers.get(owner.get(u, ""), ""))
            for u in sorted(self._valid_until)
            if u not in mine or owner.get(u) != self.holder
        ]
        return take, hand

    def _take(self, unit: str) -> Takeover | None:
        """One transaction: take ``unit`` if it is still free. The Takeover, or None when
        another server took it first."""
        period_us = round(self.period_s * 1e6)
        began = time.monotonic()
        kind = kind_of(unit)
        with self._cursor() as cur:
            cur.execute(
                f"SELECT holder, address, released, "
                "TIMESTAMPDIFF(MICROSECOND, expires, UTC_TIMESTAMP(6)) "
                f"FROM {PLACEMENT_TABLE} WHERE kind = %s AND name = %s FOR UPDATE",
                (kind, unit),
            )
            row = cur.fetchone()
            if row is None:
                cur.execute(
                    f"INSERT INTO {PLACEMENT_TABLE} (kind, name, holder, address, expires, "
                    "released) VALUES (%s, %s, %s, %s, "
                    "UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, 0)",
                    (kind, unit, self.holder, self.address, period_us),
                )
                takeover = Takeover("", float("inf"), True, False)
            else:
                holder, address = str(row[0]), str(row[1])
                released, over_us = bool(row[2]), int(row[3])
                mine = holder == self.holder
                if not (mine or over_us >= 0 or released):
                    self._conn.rollback()
                    self._holders[unit] = (address, began - over_us / 1e6)
                    return None
                cur.execute(
                    f"UPDATE {PLACEMENT_TABLE} SET holder = %s, address = %s, released = 0, "
                    "expires = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND "
                    "WHERE kind = %s AND name = %s",
                    (self.holder, self.address, period_us, kind, unit),
                )
                takeover = Takeover(holder, max(0.0, over_us / 1e6), released, mine)
            self._conn.commit()
        self._valid_until[unit] = self._held_until[unit] = began + self.period_s
        self._renewed_at[unit] = began
        self._holders.pop(unit, None)
        return takeover

    def _hand_over(self, unit: str, sender: str) -> None:
        """Give ``unit`` to the server it is assigned to now: stop its sends, then give the
        row back (released when every postpone was written)."""
        if unit not in self._valid_until:
            return
        self._valid_until.pop(unit, None)
        clean = self._on_loss(unit, sender)
        try:
            with self._lock, self._timed("lease_release"), self._cursor() as cur:
                self._give_back(cur, unit, clean)
                self._conn.commit()
        except Exception as exc:
            log.warning(
                "placement: could not give %s back (it ends by itself): %s", what(unit), exc
            )
            self._drop_connection()

    def _give_back(self, cur: Any, unit: str, released: bool) -> None:
        cur.execute(
            f"UPDATE {PLACEMENT_TABLE} SET expires = UTC_TIMESTAMP(6), released = %s "
            "WHERE kind = %s AND name = %s AND holder = %s",
            (1 if released else 0, kind_of(unit), unit, self.holder),
        )

    # -- the connection --------------------------------------------------------------------
    def _cursor(self) -> Any:
        if self._conn is None:
            try:
                conn = self._connect()
                try:
                    with conn.cursor() as cur:  # a dead step's lock ends with its session
                        cur.execute(
                            "SET SESSION wait_timeout = %s, innodb_lock_wait_timeout = %s",
                            (session_wait_timeout_s(self.period_s), LOCK_WAIT_TIMEOUT_S),
                        )
                except BaseException:
                    with contextlib.suppress(Exception):
                        conn.close()
                    raise
                self._conn = conn
            except MsgtableError:
                raise
            except Exception as exc:
                raise sorted_error(exc) from None
        return self._conn.cursor()

    def _rollback(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.rollback()

    def _drop_connection(self) -> None:
        with self._lock:
            self._close_connection()

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


def _key(r: Row) -> tuple[str, str]:
    return r.kind, r.name


def _unknown(rows: list[Row], mine: set[str], period_s: float) -> set[str]:
    """Tables of the rows this server does not know: held by another server, or given a row
    lately (within two periods) by one that discovered them."""
    recent_us = 2 * period_s * 1e6
    return {
        r.name
        for r in rows
        if r.kind == TABLE and r.name not in mine and (r.live or r.over_us < recent_us)
    }

"""The lease: which of the msgtable servers on one database sends its messages (and the
lease's SQL, all of it: the one table it owns).

Several ``msgtable serve`` processes may point at one database. One row of the table
``msgtable_lease`` (created on first use) names the holder, its address and when its lease
ends, in the database's own clock (UTC_TIMESTAMP), so the servers' clocks never meet. The
holder renews it every third of the period; another server takes it over once it has ended
(a crashed holder) or was given back (a clean shutdown). Every step is one transaction
that reads the row FOR UPDATE, so two servers never both win.

The holder fences itself without asking anyone: a renewal that began at local time t makes
the lease valid until t + period on this server's monotonic clock, which ends no later than
the end the database wrote. A send hands messages over only while the lease is valid
(``valid()``), so once another server holds the lease the old holder sends nothing more.

What the new holder must still wait for is the old holder's messages in flight whose postpone
(their ack wait, in the table) was not written yet (vt_postpone_after > 0). ``Takeover``
tells the engine how long ago the old lease ended, and whether it was given back cleanly
(every postpone written); the engine holds each such table's sends until vt_ack_wait after
that end.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from msgtable.errors import MsgtableError, Unavailable
from msgtable.latency import Timed, untimed
from msgtable.mysql import (
    ACCESS_DENIED,
    database_error,
    error_code,
    open_connection,
    pymysql_args,
    sorted_error,
)
from msgtable.retry import Backoff, Outage, Retry

log = logging.getLogger(__name__)

LEASE_TABLE = "msgtable_lease"
# A renewal that comes back after its validity is logged the first time and every this many
LATE_LOG_EVERY = 100
DEFAULT_LEASE_PERIOD_S = 5.0
MIN_LEASE_PERIOD_S = 0.3
LEASE_DDL = f"""CREATE TABLE IF NOT EXISTS {LEASE_TABLE} (
  name VARCHAR(64) NOT NULL,
  holder VARCHAR(64) NOT NULL,
  address VARCHAR(255) NOT NULL,
  expires DATETIME(6) NOT NULL,
  released TINYINT NOT NULL DEFAULT 0,
  PRIMARY KEY (name)
) COMMENT='msgtable: which server sends this database''s messages'"""
LEASE_NAME = "sender"  # the one row: one holder sends every message table of the database
# A step's reads and writes: a hung step is retried soon (the holder's own clock ends its
# lease on time whatever a step does).
IO_TIMEOUT_S = 5


# A step waits this long at most for the lease row's lock (the database's default: 50 s):
# a step that cannot have it soon is tried again, as a hung one is.
LOCK_WAIT_TIMEOUT_S = IO_TIMEOUT_S - 1


def session_wait_timeout_s(period_s: float) -> int:
    """The lease connection's ``wait_timeout`` on the database's side: two lease periods
    (whole seconds, at least 2). A step holds the lease row's lock from its SELECT ... FOR
    UPDATE to its COMMIT; a holder whose link dies in between (a half-open connection: no
    FIN, no RST) leaves its session waiting for the rest, the lock held, until the database
    ends the session: by default after 8 hours, with every other server's takeover waiting
    on that lock. A holder renews every third of a period, so its connection is never idle
    that long while it is well."""
    return max(2, math.ceil(2 * period_s))


def connector(url: sa.URL, database: str) -> Callable[[], Any]:
    """How the lease opens its connection of its own (transactions, short time-outs)."""

    def connect() -> Any:
        import pymysql

        return open_connection(
            pymysql.connect,
            **pymysql_args(url),
            database=database,
            autocommit=False,
            read_timeout=IO_TIMEOUT_S,
            write_timeout=IO_TIMEOUT_S,
        )

    return connect


@dataclass(frozen=True)
class Takeover:
    """What a new holder learns about the one before it."""

    previous: str  # the previous holder's id ("" if there was none)
    ended_s_ago: float  # how long ago, in the database's clock, its lease ended
    released: bool  # it gave the lease back after writing its postpones
    by_me: bool  # the previous holder was this very server (it lost the lease and got it back)


class Lease:
    """Campaigns for the lease on its own connection and keeps it while it can.

    ``on_gain(takeover)`` and ``on_loss(leader_address)`` run on the lease's thread; the
    engine promotes and demotes itself there.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        address: str,
        period_s: float = DEFAULT_LEASE_PERIOD_S,
        *,
        on_gain: Callable[[Takeover], None],
        on_loss: Callable[[str], None],
        holder: str | None = None,
        outage: Outage | None = None,
        timed: Timed = untimed,
    ) -> None:
        """``timed``: how its statements are timed by kind (the store's: msgtable.metrics)."""
        if period_s < MIN_LEASE_PERIOD_S:
            raise MsgtableError(f"the lease period must be at least {MIN_LEASE_PERIOD_S}s")
        self.holder = holder or uuid.uuid4().hex
        self.address = address
        self.period_s = period_s
        self.leader_address = ""  # the holder's address as last read ("" if none)
        self._connect = connect
        self._outage = outage  # the database's: it tells of an outage, not the lease
        self._timed = timed
        self._conn: Any = None
        self._on_gain, self._on_loss = on_gain, on_loss
        self._valid_until = 0.0  # monotonic; 0: not held
        self._renewed_at = -1.0  # when the last step that wrote the row as ours began
        # renewals that came back after the validity they gave (msgtable.metrics)
        self.late_renewals = 0
        # when the last tenure's validity ends or ended (monotonic; kept after a loss)
        self.held_until_s = 0.0
        self._held = False
        self._prepared = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- what others ask -------------------------------------------------------------------
    def valid(self) -> bool:
        """Whether this server holds the lease now (by its own clock, conservatively)."""
        return time.monotonic() < self._valid_until

    @property
    def held(self) -> bool:
        return self._held

    # -- set-up ----------------------------------------------------------------------------
    def prepare(self) -> None:
        """Create the lease table if it is missing; raise a clear error if we cannot (and
        Unavailable if the database does not answer)."""
        with self._timed("lease_prepare"):
            self._prepare()

    def _prepare(self) -> None:
        try:
            with self._cursor() as cur:
                cur.execute(f"SELECT 1 FROM {LEASE_TABLE} LIMIT 1")
                cur.fetchall()
            self._prepared = True
            return
        except MsgtableError:  # Unavailable, or a package the driver lacks
            raise
        except Exception as exc:
            error = database_error(exc)
            if isinstance(error, Unavailable):
                raise error from None
            if error_code(exc) in ACCESS_DENIED:
                raise self._denied(exc) from None
            # else it is missing (1146): create it
        try:
            with self._cursor() as cur:
                cur.execute(LEASE_DDL)
        except MsgtableError:  # Unavailable, or a package the driver lacks
            raise
        except Exception as exc:
            error = database_error(exc)
            raise (error if isinstance(error, Unavailable) else self._denied(exc)) from None
        self._prepared = True

    def _denied(self, exc: BaseException) -> MsgtableError:
        return MsgtableError(
            f"cannot use the lease table {LEASE_TABLE} ({exc}); create it once with "
            f"schema/msgtable_lease.sql and grant SELECT, INSERT, UPDATE on it, or run one "
            "server alone with --no-lease"
        )

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="msgtable-lease")
            self._thread.start()

    def close(self, released: bool) -> None:
        """Stop campaigning; give the lease back if held (``released``: every message sent
        has its postpone written, so the next holder need not wait for their ack waits)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.period_s + 10)
        with self._lock:
            if self._held:
                self._valid_until = 0.0
                try:
                    with self._timed("lease_release"), self._cursor() as cur:
                        cur.execute(
                            f"UPDATE {LEASE_TABLE} SET expires = UTC_TIMESTAMP(6), released = %s "
                            "WHERE name = %s AND holder = %s",
                            (1 if released else 0, LEASE_NAME, self.holder),
                        )
                        self._conn.commit()
                except Exception as exc:
                    log.warning("lease: could not give it back (it ends by itself): %s", exc)
                self._held = False
            self._close_connection()

    # -- the campaign ----------------------------------------------------------------------
    def _run(self) -> None:
        step_s = self.period_s / 3
        retry = Retry("lease", log, Backoff(step_s, step_s), outage=self._outage)
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                with self._lock:
                    if self._stop.is_set():
                        break
                    if not self._prepared:
                        self.prepare()
                    with self._timed("lease"):
                        takeover = self._step(began)
                retry.succeeded()
                if self._outage is not None:
                    self._outage.up()  # the lease's own connection answered
            except Exception as exc:
                takeover = None
                retry.failed(sorted_error(exc))
                self._drop_connection()
            if takeover is not None:
                log.info("lease: this server (%s) now sends", self.address)
                self._on_gain(takeover)
            elif self._held and not self.valid() and self._renewed_late(began):
                self.late_renewals += 1
                late = self.late_renewals
                if late == 1 or late % LATE_LOG_EVERY == 0:
                    log.warning(
                        "lease: a renewal took %.2fs, past the %gs period: sends paused until "
                        "the next one (the row is still this server's; %d such so far)",
                        time.monotonic() - began,
                        self.period_s,
                        late,
                    )
                continue  # renew again at once
            elif self._held and not self.valid():
                self._held = False
                log.warning(
                    "lease: lost (not renewed within %gs: the last renewal began %.2fs ago, "
                    "this step took %.2fs); this server stops sending",
                    self.period_s,
                    time.monotonic() - self.held_until_s + self.period_s,
                    time.monotonic() - began,
                )
                self._on_loss(self.leader_address if self.leader_address != self.address else "")
            self._stop.wait(max(0.0, step_s - (time.monotonic() - began)))

    def _renewed_late(self, began: float) -> bool:
        """Whether the step that began at ``began`` renewed the row for this server but came
        back after the validity it gave, not long after (a loaded machine): no other server
        can have held the lease meanwhile (a takeover writes its holder, and the renewal
        found this one's), so this is no loss, only a pause in sending."""
        return self._renewed_at == began and time.monotonic() - began < 2 * self.period_s

    def _step(self, began: float) -> Takeover | None:
        """One transaction: renew, take over, or read who holds it. Returns the Takeover
        when this step gained the lease (None when it renewed it, or another holds it).

        A holder renews with one conditional UPDATE and its commit (the hot path, every
        third of the period): no row lock held across round trips. When it matches no row
        (another server took the lease over, or it was given back) the full step reads
        the row FOR UPDATE and decides."""
        period_us = round(self.period_s * 1e6)
        if self._held:
            with self._cursor() as cur:
                cur.execute(
                    f"UPDATE {LEASE_TABLE} SET expires = UTC_TIMESTAMP(6) + INTERVAL %s "
                    "MICROSECOND WHERE name = %s AND holder = %s AND released = 0",
                    (period_us, LEASE_NAME, self.holder),
                )
                renewed = cur.rowcount == 1
                self._conn.commit()
            if renewed:
                self._renewed_at = began
                self._valid_until = self.held_until_s = began + self.period_s
                return None
        with self._cursor() as cur:
            cur.execute(
                f"SELECT holder, address, released, "
                "TIMESTAMPDIFF(MICROSECOND, expires, UTC_TIMESTAMP(6)) "
                f"FROM {LEASE_TABLE} WHERE name = %s FOR UPDATE",
                (LEASE_NAME,),
            )
            row = cur.fetchone()
            set_me = (
                f"UPDATE {LEASE_TABLE} SET holder = %s, address = %s, released = 0, "
                "expires = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND WHERE name = %s"
            )
            if row is None:
                cur.execute(
                    f"INSERT INTO {LEASE_TABLE} (name, holder, address, expires, released) "
                    "VALUES (%s, %s, %s, UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND, 0)",
                    (LEASE_NAME, self.holder, self.address, period_us),
                )
                takeover = Takeover("", float("inf"), True, False)
            else:
                holder, address, released, over_us = row[0], row[1], bool(row[2]), int(row[3])
                mine = holder == self.holder
                if not (mine or over_us >= 0 or released):  # another holds it
                    self._conn.rollback()
                    self.leader_address = address
                    self._valid_until = 0.0  # if we thought we held it: we do not
                    return None
                cur.execute(set_me, (self.holder, self.address, period_us, LEASE_NAME))
                takeover = Takeover(holder, max(0.0, over_us / 1e6), released, mine)
            self._conn.commit()
        self._valid_until = self.held_until_s = began + self.period_s
        self._renewed_at = began
        self.leader_address = self.address
        if self._held:
            return None
        self._held = True
        return takeover

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

    def _drop_connection(self) -> None:
        with self._lock:
            self._close_connection()

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # it is broken already: nothing to say
                conn.close()

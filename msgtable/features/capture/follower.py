"""The capture follower: table events read from the binlog and written into capture tables
(message tables with vt_capture; the pure part is msgtable.core.events, the SQL
msgtable.store.capture).

One thread, one binlog stream for every capture table of the database, on the lease holder
only (the engine opens it when it gains the lease and closes it when it loses it). It reads
the row events of the database (the library parses a row only for a table some capture
table wants) and its DDL statements, and keeps the events of the transaction being read.
When the transaction commits (its Xid event; a DDL statement is a transaction of its own)
its events join the pending ones; the pending events are written, with the position after
their last transaction, in ONE database transaction (msgtable.store.capture), once there are
FLUSH_ROWS of them or the oldest has waited FLUSH_S, or the stream went quiet (a
heartbeat). So a restart resumes from the stored position: whatever was written is not read
again and whatever was not is; nothing is lost and nothing repeated.

Where the position is: on MariaDB the GTID state (``gtid:0-1-100``; its binlog dump takes
no file position), on MySQL the binlog file and offset (``file:binlog.000002:4567``). With
nothing stored yet, the follower starts from where the binlog is now: changes committed
before a capture table (and msgtable) existed are not events.

Column names come from the binlog's row metadata: the database needs
binlog_row_metadata=FULL (MariaDB 10.5+, MySQL 8.0+), besides the binlog on, ROW format and
the replication privileges. Without them the follower logs once why and does nothing.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from msgtable.core.events import (
    Capture,
    ddl_tables,
    excluded,
    pk_of,
    primary_key_columns,
    row_json,
    row_key,
)
from msgtable.core.latency import Timed, untimed
from msgtable.core.retry import Backoff, Outage, Retry
from msgtable.core.tables import is_message_comment
from msgtable.engine.binlog import close_stream, gtid_state, read_status, reading_again
from msgtable.store.capture import CaptureSQL, PositionMoved
from msgtable.store.mysql import replication_refused, sorted_error
from msgtable.store.protocol import CaptureStore

log = logging.getLogger(__name__)

FLUSH_ROWS = 5000  # pending events written together (one transaction) once this many wait
FLUSH_S = 0.05  # ... or once the oldest has waited this long
IDLE_POSITION_S = 1.0  # a position that moved past other tables' changes only: this often
FL_STANDALONE = 0x1  # MariaDB GTID event flag: a statement without an Xid (a DDL)
HEARTBEAT_S = 0.1  # the stream says it is quiet this often (the pending events go then)
RETRY_MIN_S = 0.2
RETRY_MAX_S = 5.0

Event = tuple[Any, ...]  # the values of msgtable.core.events.EVENT_COLUMNS


@dataclass(frozen=True)
class CaptureTarget:
    """A capture table as the follower sees it."""

    table: str
    capture: Capture


class CaptureFollower:
    """The thread described in the module docstring; ``open()`` / ``close()``.

    ``targets()`` says which capture tables there are now (asked as events arrive, so a
    capture table or source table created later is picked up); ``exclude(table)`` whether a
    table is never captured (message tables: events about events would loop);
    ``written(tables)`` is told which capture tables got new rows (their managers poll)."""

    def __init__(
        self,
        settings: dict[str, Any],
        database: str,
        targets: Callable[[], Sequence[CaptureTarget]],
        *,
        exclude: Callable[[str], bool] = lambda t: False,
        written: Callable[[Sequence[str]], None] = lambda t: None,
        outage: Outage | None = None,
        server_id: int | None = None,
        timed: Timed = untimed,
        store: CaptureStore | None = None,
    ) -> None:
        self._settings = settings
        self._database = database
        self._targets = targets
        self._exclude = exclude
        self._written = written
        self._outage = outage
        self._server_id = server_id or random.randrange(2**30, 2**31)
        # what it writes through (None: a connection of its own, CaptureSQL)
        self._store: CaptureStore = store or CaptureSQL(settings, database, timed)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None
        self._thread: threading.Thread | None = None
        self.following = threading.Event()
        self.disabled_because: str | None = None
        # what operators see (read by other threads; written by the follower's only)
        self.position = ""  # the stored position: everything before it is written
        self.events = 0  # events written since open
        self.last_commit_s = 0.0  # the commit time of the last transaction read
        self.caught_up = False  # the stream was quiet since the last event
        self.conflicts = 0  # times another follower had moved the stored position

    @property
    def lag_s(self) -> float:
        """How far behind the binlog the written events are, in seconds (0 when caught up)."""
        if self.caught_up or not self.last_commit_s:
            return 0.0
        return max(0.0, time.time() - self.last_commit_s)

    def open(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, daemon=True, name="msgtable-capture")
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._close_stream()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)
        self._store.close()

    def _close_stream(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            close_stream(stream)
        self.following.clear()

    def _disable(self, why: str) -> None:
        self.disabled_because = why
        log.warning("capture: table events are not captured (%s)", why)

    def _run(self) -> None:
        retry = Retry("capture: following", log, Backoff(RETRY_MIN_S, RETRY_MAX_S))
        while not self._stop.is_set():
            try:
                status = read_status(self._settings)
                why = status.unusable_because()
                if why is None and self._store.row_metadata().upper() != "FULL":
                    why = "binlog_row_metadata is not FULL (column names are needed)"
                if why is not None:
                    self._disable(why)
                    return
                if status.mariadb:
                    here = "gtid:" + status.gtid
                else:
                    here = f"file:{status.file}:{status.position}"
                self.position = self._store.start(here, time.time_ns())
                self._follow(self.position, retry)
                return
            except Exception as exc:
                if self._stop.is_set():
                    return
                refused = replication_refused(exc)
                if refused is not None:
                    self._disable(refused)
                    return
                if isinstance(exc, PositionMoved):  # not a failure of this follower's
                    self.conflicts += 1
                    log.info("capture: %s (another server wrote): reading from there", exc)
                    delay = RETRY_MIN_S
                else:
                    delay = retry.failed(sorted_error(exc))
                self._close_stream()
                self._store.close()
                self._stop.wait(delay)

    def _follow(self, start: str, retry: Retry) -> None:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import (
            HeartbeatLogEvent,
            MariadbGtidEvent,
            QueryEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        where: dict[str, Any]
        mariadb = start.startswith("gtid:")
        if mariadb:
            where = {"auto_position": start[len("gtid:") :] or None}
        else:
            _, file, pos = start.split(":", 2)
            where = {"log_file": file, "log_pos": int(pos), "resume_stream": True}
        stream = BinLogStreamReader(
            connection_settings=self._settings,
            server_id=self._server_id,
            blocking=True,
            only_schemas=[self._database],
            only_events=[
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
                QueryEvent,
                XidEvent,
                MariadbGtidEvent,
                HeartbeatLogEvent,
            ],
            is_mariadb=mariadb,
            slave_heartbeat=HEARTBEAT_S,
            **where,
        )
        with self._lock:
            if self._stop.is_set():
                stream.close()
                return
            self._stream = stream
        _Reader(self, stream, mariadb, start, retry).read()


class _Reader:
    """One stream's events, transaction by transaction (see the module docstring)."""

    def __init__(
        self, follower: CaptureFollower, stream: Any, mariadb: bool, start: str, retry: Retry
    ) -> None:
        self.f = follower
        self.stream = stream
        self.mariadb = mariadb
        self.gtids = gtid_state(start[len("gtid:") :]) if mariadb else {}
        self.written = start  # the stored position
        self.reached = start  # the position after the last transaction read
        self.trx: list[tuple[str, str, Event]] = []  # (table, kind, event) being read
        self.trx_ddl: list[tuple[str, Event]] = []  # (capture table, event) being read
        self.trx_gtid: str | None = None
        # MariaDB: whether the transaction being read is a lone statement (a DDL, which has
        # no Xid) or ends with an Xid (CREATE TABLE ... SELECT: its DDL, then its rows)
        self.standalone = True
        self.pending: dict[str, list[Event]] = {}  # committed, not written yet
        self.pending_rows = 0
        self.pending_since = 0.0
        self.retry = retry
        self.message_tables: dict[str, bool] = {}  # whether a source table is one, as read

    def excluded(self, table: str) -> bool:
        """msgtable's tables and message tables are never captured (events of events would
        loop): the engine's discovery knows those it loaded; a table created since is asked
        about once (until a DDL names it)."""
        if excluded(table) or self.f._exclude(table):
            return True
        known = self.message_tables.get(table)
        if known is None:
            comment = self.f._store.comment(table)
            known = self.message_tables[table] = comment is not None and is_message_comment(comment)
        return known

    def read(self) -> None:
        from pymysqlreplication.event import (
            HeartbeatLogEvent,
            MariadbGtidEvent,
            QueryEvent,
            XidEvent,
        )

        f = self.f
        for event in self.stream:
            if f._stop.is_set():
                return
            if not f.following.is_set():
                f.following.set()
                reading_again(self.retry)
            if isinstance(event, HeartbeatLogEvent):
                f.caught_up = True
                self.flush(quiet=True)
                continue
            f.caught_up = False
            if isinstance(event, MariadbGtidEvent):
                self.trx, self.trx_ddl, self.trx_gtid = [], [], event.gtid
                self.standalone = bool(event.flags & FL_STANDALONE)
            elif isinstance(event, XidEvent):
                self.commit(event)
            elif isinstance(event, QueryEvent):
                self.query(event)
            else:
                self.rows(event)
        if not f._stop.is_set():
            raise ConnectionError("the binlog stream ended")

    # -- events ------------------------------------------------------------------------------
    def here(self, event: Any, index: int) -> str:
        return f"{self.stream.log_file}:{event.packet.log_pos}:{index}"

    def rows(self, event: Any) -> None:
        table = event.table
        targets = [t for t in self.f._targets() if t.capture.wants_table(table)]
        if not targets or self.excluded(table):
            return
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent

        kind = (
            "update"
            if isinstance(event, UpdateRowsEvent)
            else "delete"
            if isinstance(event, DeleteRowsEvent)
            else "insert"
        )
        if not any(kind in t.capture.kinds for t in targets):
            return
        keys = primary_key_columns(event.primary_key)
        when = event.timestamp * 10**9
        for i, row in enumerate(event.rows):
            if kind == "update":
                before, after = row["before_values"], row["after_values"]
            elif kind == "delete":
                before, after = row["values"], None
            else:
                before, after = None, row["values"]
            pk = pk_of(after if after is not None else before, keys)
            self.trx.append(
                (
                    table,
                    kind,
                    (
                        table,
                        kind,
                        pk,
                        row_key(table, pk),
                        None if before is None else row_json(before),
                        None if after is None else row_json(after),
                        when,
                        self.here(event, i),
                    ),
                )
            )

    def query(self, event: Any) -> None:
        text = event.query
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        head = text.lstrip()[:8].upper()
        if head.startswith("BEGIN") or head.startswith("XA "):
            return
        if head.startswith("COMMIT"):  # a non-transactional table's statement ends
            self.commit(event)
            return
        schema = event.schema.decode("utf-8", "replace") if isinstance(event.schema, bytes) else ""
        statement = json.dumps(text, ensure_ascii=False)
        when = event.timestamp * 10**9
        targets = self.f._targets()
        for i, (kind, names) in enumerate(ddl_tables(text, schema)):
            ours = [t for s, t in names if s == self.f._database]
            for t in ours:
                self.message_tables.pop(t, None)  # its comment may have changed
            ours = [t for t in ours if not self.excluded(t)]
            for target in targets:
                # a RENAME: one event for a capture table, under the first name it wants
                name = next((n for n in ours if target.capture.wants(n, kind)), None)
                if name is not None:
                    row = (name, kind, None, name, None, statement, when, self.here(event, i))
                    self.trx_ddl.append((target.table, row))
        # A DDL is a transaction of its own, but CREATE TABLE ... SELECT, whose Xid commits
        # it with its rows (MariaDB: its GTID is not standalone; MySQL 8.0.21+ logs it ending
        # "START TRANSACTION", not run here)
        if self.mariadb and not self.standalone:
            return
        if not self.mariadb and text.rstrip().upper().endswith("START TRANSACTION"):
            return
        self.commit(event)

    def commit(self, event: Any) -> None:
        """The transaction being read committed: its events join the pending ones."""
        for table, row in self.trx_ddl:
            self.pending.setdefault(table, []).append(row)
            self.pending_rows += 1
        targets = self.f._targets()
        for source, kind, row in self.trx:
            for target in targets:
                if target.capture.wants(source, kind):
                    self.pending.setdefault(target.table, []).append(row)
                    self.pending_rows += 1
        self.trx, self.trx_ddl = [], []
        if self.mariadb:
            if self.trx_gtid is not None:
                self.gtids[self.trx_gtid.split("-", 1)[0]] = self.trx_gtid
                self.trx_gtid = None
            self.reached = "gtid:" + ",".join(self.gtids.values())
        else:
            self.reached = f"file:{self.stream.log_file}:{event.packet.log_pos}"
        self.f.last_commit_s = float(event.timestamp)
        if self.pending_rows and not self.pending_since:
            self.pending_since = time.monotonic()
        self.flush()

    def flush(self, quiet: bool = False) -> None:
        if self.reached == self.written:
            return
        now = time.monotonic()
        if self.pending_rows:
            if not quiet and self.pending_rows < FLUSH_ROWS and now - self.pending_since < FLUSH_S:
                return
        elif not quiet and now - self.pending_since < IDLE_POSITION_S:
            return
        self.f._store.write(self.pending, self.written, self.reached, time.time_ns())
        tables = list(self.pending)
        self.f.events += self.pending_rows
        self.written = self.f.position = self.reached
        self.pending, self.pending_rows = {}, 0
        self.pending_since = now
        if tables:
            self.f._written(tables)

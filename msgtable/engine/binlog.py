"""Following the database's row-based binary log, so that a row written by any client reaches
a subscriber at once, not at the next poll (and the one SQL statement it needs: where the
binlog is now).

The follower is a replica client (python-mysql-replication) reading the binlog of the served
database from the position it had when the follower started (on MariaDB a GTID state: the
library's MariaDB dump would otherwise start at the binlog's very beginning, replaying all
of its history first). It reads row events of message
tables only, and turns them into hints for the tables' managers; it never puts a value from
the binlog into a message (the poll and the send's check stay the only readers of rows):

* an INSERT into a table: poll now (a new pass), unless the table's cache is full or behind
  a backlog, where the poller is reading anyway;
* an UPDATE or DELETE by another client: rows acked or deleted leave the cache, and rows
  whose time_next, epoch or priority changed make the table poll now; a row this server
  sent and has not postponed yet, changed by someone else, is no longer held back (it goes
  at its new time). msgtable's own writes carry the comment STATEMENT_MARK, which the
  binlog shows in the statement's annotation (MariaDB's binlog_annotate_row_events, on by
  default; MySQL's binlog_rows_query_log_events), and are not parsed: parsing row images is
  pure Python, and the acks alone come by the thousand a second. Where the binlog has no
  annotations, an event larger than PARSE_MAX_BYTES is taken for msgtable's merged acks.

It needs binlog on, binlog_format=ROW, and the REPLICATION SLAVE and REPLICATION CLIENT
privileges; without them it logs once why, and the engine polls as before. After an error
(the database restarted, the network broke) it reconnects with backoff from the last
position it read, and asks every table for a new pass, so nothing written meanwhile waits for
the poll interval. The poller stays the safety net throughout: a row is cached once by id,
however many times it is hinted or read.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from msgtable.core.retry import Backoff, Outage, Retry
from msgtable.core.rows import PollKey, RowChange
from msgtable.core.sql import STATEMENT_MARK
from msgtable.engine.binlogrows import Shape, count_rows, row_keys, table_shape
from msgtable.engine.tail import InsertKeys
from msgtable.store.mysql import (
    ANNOTATIONS_VARIABLE,
    PARSE_MAX_BYTES,
    BinlogStatus,
    open_connection,
    replication_refused,
    server_text,
    sorted_error,
)

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.2
RETRY_MAX_S = 5.0
STMT_END_F = 0x1  # rows event flag: the last event of its statement


class BinlogSink(Protocol):
    """What the follower tells the engine."""

    def binlog_tables(self) -> dict[str, Sequence[str]]:
        """The message tables served now, with their column names in table order."""
        ...

    def binlog_insert(self, table: str, rows: int = 0, keys: InsertKeys | None = None) -> None:
        """Another client inserted into ``table``: ``rows`` of them when the follower counts
        them (``count_rows``), else 0 (a hint only); ``keys``: their poll keys, read
        from the event when asked (msgtable.engine.tail)."""
        ...

    def binlog_changes(self, table: str, changes: list[RowChange]) -> None: ...

    def binlog_resync(self) -> None:
        """Something may have been missed: every table should start a new pass now."""
        ...


def read_status(settings: dict[str, Any]) -> BinlogStatus:
    """Whether the database's binlog is on, its format, and where it is now (the follower's
    own SQL, on a connection of its own: ``settings`` are pymysql.connect() arguments)."""
    import pymysql

    conn = open_connection(pymysql.connect, **settings)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@log_bin, @@binlog_format, VERSION()")
            log_bin, row_format, version = cur.fetchone()
            file, position = "", 0
            if int(log_bin):
                try:
                    cur.execute("SHOW MASTER STATUS")
                except pymysql.err.ProgrammingError:  # MySQL 8.4 renamed it
                    cur.execute("SHOW BINARY LOG STATUS")
                row = cur.fetchone()
                if row:
                    file, position = server_text(row[0]), int(row[1])
            mariadb = "mariadb" in server_text(version).lower()
            cur.execute(f"SELECT @@global.{ANNOTATIONS_VARIABLE[mariadb]}")
            annotated = bool(int(cur.fetchone()[0]))
            gtid = ""
            if mariadb and file:
                cur.execute("SELECT @@gtid_binlog_pos")
                gtid = server_text(cur.fetchone()[0] or "")
    finally:
        conn.close()
    return BinlogStatus(
        enabled=bool(int(log_bin)) and bool(file),
        row_format=server_text(row_format),
        file=file,
        position=position,
        mariadb=mariadb,
        gtid=gtid,
        annotated=annotated,
    )


class BinlogFollower:
    """A thread following the binlog (see the module docstring); ``open()`` / ``close()``.

    ``settings``: pymysql.connect() arguments; ``status``: how it learns where the binlog is
    (read_status, unless a test says otherwise)."""

    def __init__(
        self,
        settings: dict[str, Any],
        database: str,
        sink: BinlogSink,
        *,
        status: Callable[[], BinlogStatus] | None = None,
        server_id: int | None = None,
        outage: Outage | None = None,
    ) -> None:
        self._settings = settings
        self._database = database
        self._status = status or (lambda: read_status(settings))
        self._outage = outage  # the database's: it tells of an outage, not this loop
        self._sink = sink
        self._server_id = server_id or random.randrange(2**30, 2**31)  # unique among replicas
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stream: Any = None
        self._thread: threading.Thread | None = None
        self._position: tuple[str, int] | None = None  # after the last event read (MySQL)
        # MariaDB: the last GTID read to its end, per replication domain (where a new stream
        # starts), and the GTID of the transaction being read.
        self._gtids: dict[str, str] = {}
        self._reading: str | None = None
        self._ours: bool | None = None  # the statement's annotation: ours, theirs, or none
        self._table_ids: dict[bytes, tuple[str, str]] = {}  # binlog table id -> schema, name
        self.following = threading.Event()  # set while a stream is open
        self.disabled_because: str | None = None  # why the engine polls only
        self.unannotated_because: str | None = None  # what it misses without annotations
        self.events = 0
        # Whether inserts by other clients are counted by the row (the metrics server turns
        # it on: msgtable_messages_enqueued_total): their events then go to the library,
        # which parses each row, instead of the fast path, which reads only their table.
        self.count_rows = False
        self.checksum = False  # whether events end with a CRC32 (the library knows: the hook)
        self._shapes: dict[bytes, Shape] = {}  # binlog table id -> its columns' types
        self.counted_fast = 0  # INSERT events whose rows the fast path counted (tests)
        # The binlog timestamp (unix seconds, the statement's on the source) of the last
        # event read, and whether the source has sent everything since: a heartbeat comes
        # only once the source has nothing more to send (slave_heartbeat), so the follower
        # is caught up until the next event. (msgtable_binlog_lag_seconds)
        self._event_s = 0
        self._caught_up = True

    @property
    def lag_s(self) -> float | None:
        """How far behind the binlog the follower is: now minus the last event's timestamp
        (whole seconds, as the binlog has them), 0 once a heartbeat said it is caught up;
        None while it does not follow."""
        if not self.following.is_set():
            return None
        if self._caught_up or not self._event_s:
            return 0.0
        return max(0.0, time.time() - self._event_s)

    def _seen(self, timestamp: int, heartbeat: bool) -> None:
        if heartbeat:
            self._caught_up = True
        elif timestamp:
            self._event_s, self._caught_up = timestamp, False

    def open(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="msgtable-binlog")
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._close_stream()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def _close_stream(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            close_stream(stream)
        self.following.clear()

    def _disable(self, why: str) -> None:
        self.disabled_because = why
        log.warning("binlog: not following it (%s); new rows wait for the next poll", why)

    def _run(self) -> None:
        position: tuple[str, int] | None = None
        mariadb = False
        retry = Retry(
            "binlog: following", log, Backoff(RETRY_MIN_S, RETRY_MAX_S), outage=self._outage
        )
        while not self._stop.is_set():
            try:
                if position is None:
                    status = self._status()
                    why = status.unusable_because()
                    if why is not None:
                        self._disable(why)
                        return
                    unannotated = status.unannotated_because()
                    if unannotated is not None and self.unannotated_because is None:
                        self.unannotated_because = unannotated
                        log.warning("binlog: %s", unannotated)
                    position, mariadb = (status.file, status.position), status.mariadb
                    self._gtids = gtid_state(status.gtid)
                    # a row committed after a table's first poll and before this position is
                    # in neither: every table polls again, now that what follows is followed
                    self._sink.binlog_resync()
                self._follow(position, mariadb, retry)
                return  # closed
            except Exception as exc:
                if self._stop.is_set():
                    return
                refused = replication_refused(exc)
                if refused is not None:
                    self._disable(refused)
                    return
                delay = retry.failed(sorted_error(exc))
                self._close_stream()
                self._stop.wait(delay)
                position = self._position or position
                self._sink.binlog_resync()

    def _follow(self, start: tuple[str, int], mariadb: bool, retry: Retry) -> None:
        """Read from ``start`` (MySQL: binlog file and position) or, on MariaDB, from the
        GTID state read so far (MariaDB's binlog dump takes no file position: it would start
        at the binlog's very beginning)."""
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import (
            HeartbeatLogEvent,
            MariadbAnnotateRowsEvent,
            MariadbGtidEvent,
            RowsQueryLogEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import (
            DeleteRowsEvent,
            UpdateRowsEvent,
            WriteRowsEvent,
        )

        rows_events = [WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent]
        notes = [MariadbAnnotateRowsEvent, RowsQueryLogEvent]
        where: dict[str, Any]
        if mariadb:
            where = {"auto_position": ",".join(self._gtids.values())}
            notes += [MariadbGtidEvent, XidEvent]
        else:
            where = {"log_file": start[0], "log_pos": start[1], "resume_stream": True}

        stream = BinLogStreamReader(
            connection_settings=self._settings,
            server_id=self._server_id,
            blocking=True,
            only_schemas=[self._database],
            only_events=[*rows_events, *notes, HeartbeatLogEvent],
            is_mariadb=mariadb,
            annotate_rows_event=mariadb,
            slave_heartbeat=1.0,
            freeze_schema=True,  # a table id's columns never change: ALTER TABLE gets a new id
            pymysql_wrapper=dump_connection(),
            **where,
        )
        with self._lock:
            if self._stop.is_set():
                stream.close()
                return
            self._stream = stream
        self._ours = None
        self._table_ids.clear()  # table ids are the server's, and may change when it restarts
        self._shapes.clear()
        _reader.follower = self if install_fast_path() else None
        try:
            self._read(stream, retry)
        finally:
            _reader.follower = None

    def _read(self, stream: Any, retry: Retry) -> None:
        """The events the fast path (:meth:`fast`) leaves to the library."""
        from pymysqlreplication.event import (
            HeartbeatLogEvent,
            MariadbAnnotateRowsEvent,
            MariadbGtidEvent,
            RowsQueryLogEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

        for event in stream:  # heartbeats come every second while nothing else does
            if self._stop.is_set():
                break
            if not self.following.is_set():
                self.following.set()
                reading_again(retry)
            heartbeat = isinstance(event, HeartbeatLogEvent)
            self._seen(getattr(event, "timestamp", 0) or 0, heartbeat)
            if heartbeat:
                continue
            if isinstance(event, MariadbGtidEvent):  # a transaction begins
                self._read_to_end()  # (the one before had no Xid: a DDL)
                self._reading = event.gtid
                continue
            if isinstance(event, XidEvent):  # and commits
                self._read_to_end()
                continue
            if isinstance(event, MariadbAnnotateRowsEvent | RowsQueryLogEvent):
                text = getattr(event, "sql_statement", None) or getattr(event, "query", None) or ""
                head = text[: len(STATEMENT_MARK)]  # statements with long IN lists: no copy
                if isinstance(head, bytes):
                    head = head.decode("utf-8", "replace")
                self._ours = head == STATEMENT_MARK
                continue
            self.events += 1
            tables = self._sink.binlog_tables()
            columns = tables.get(event.table)
            ours = self._ours
            if columns is not None and not ours:
                if isinstance(event, WriteRowsEvent):
                    keys = functools.partial(library_keys, event.rows, columns)
                    n = len(event.rows) if self.count_rows else 0
                    self._sink.binlog_insert(event.table, n, keys)
                elif ours is False or event.event_size <= PARSE_MAX_BYTES:
                    update = isinstance(event, UpdateRowsEvent)
                    changes = row_changes(event.rows, columns, update, theirs=ours is False)
                    if changes is None:  # the table's columns changed: read it all again
                        self._sink.binlog_resync()
                    elif changes:
                        self._sink.binlog_changes(event.table, changes)
            if getattr(event, "flags", 0) & STMT_END_F:
                self._ours = None  # the next statement says for itself, or has no annotation
            self._position = (stream.log_file, stream.log_pos)
            if self._stop.is_set():
                break
        if not self._stop.is_set():
            raise ConnectionError("the binlog stream ended")

    def fast(self, data: bytes) -> bool:
        """Handle one binlog event from its raw packet (``data``: the OK byte, the 19-byte
        event header, the event) where its bytes say enough: annotations, GTIDs and
        commits, table maps, the row events of msgtable's own statements and of other
        schemas, and INSERTs (only the table matters). True: handled, the library need not
        build the event; False: the library parses it (another client's UPDATE or DELETE,
        and every other kind). The library's event objects cost about ten times more, and
        a busy table writes thousands of these a second."""
        kind = data[5]
        self._seen(int.from_bytes(data[1:5], "little"), kind == _HEARTBEAT_EVENT)
        if kind in _ROWS_EVENTS:
            table = self._table_ids.get(data[20:26])
            if table is None:
                return False  # its table map went to the library
            if table[0] == self._database:
                ours = self._ours
                if not ours and kind not in _WRITE_EVENTS:
                    size = int.from_bytes(data[10:14], "little")
                    if ours is False or size <= PARSE_MAX_BYTES:
                        return False  # another client's UPDATE or DELETE: its rows matter
                rows = 0
                if not ours and self.count_rows and kind in _WRITE_EVENTS:
                    shape = self._shapes.get(data[20:26])
                    counted = None if shape is None else count_rows(data, shape, self.checksum)
                    if counted is None:
                        return False  # the library counts its rows
                    rows = counted
                    self.counted_fast += 1
                self.events += 1
                if not ours and kind in _WRITE_EVENTS:
                    columns = self._sink.binlog_tables().get(table[1])
                    if columns is not None:
                        shape = self._shapes.get(data[20:26])
                        keys = functools.partial(fast_keys, data, shape, self.checksum, columns)
                        self._sink.binlog_insert(table[1], rows, keys)
            if data[26] & STMT_END_F:
                self._ours = None
        elif kind == _TABLE_MAP_EVENT:
            n = data[28]
            m = data[30 + n]
            schema = data[29 : 29 + n].decode("utf-8", "replace")
            name = data[31 + n : 31 + n + m].decode("utf-8", "replace")
            self._table_ids[data[20:26]] = (schema, name)
            if schema == self._database and not self._ours:
                # the columns its INSERTs' rows are counted and read the keys of by
                shape = table_shape(data)
                if shape is None:
                    self._shapes.pop(data[20:26], None)
                else:
                    self._shapes[data[20:26]] = shape
                return False  # the library maps it too, for the rows it may have to parse
        elif kind == _MARIADB_ANNOTATE_ROWS_EVENT:
            self._ours = data[20 : 20 + len(_MARK)] == _MARK
        elif kind == _ROWS_QUERY_LOG_EVENT:
            self._ours = data[21 : 21 + len(_MARK)] == _MARK
        elif kind == _MARIADB_GTID_EVENT:
            self._read_to_end()  # (the transaction before had no Xid: a DDL)
            seq = int.from_bytes(data[20:28], "little")
            domain = int.from_bytes(data[28:32], "little")
            self._reading = f"{domain}-{int.from_bytes(data[6:10], 'little')}-{seq}"
        elif kind == _XID_EVENT:
            self._read_to_end()
        else:
            return False
        stream = self._stream
        if stream is not None:
            position = int.from_bytes(data[14:18], "little")
            self._position = (stream.log_file, position)
            stream.log_pos = position  # the library's, as its own loop would set it
        return True

    def _read_to_end(self) -> None:
        """The transaction being read is read: a new stream starts after it."""
        if self._reading is not None:
            self._gtids[self._reading.split("-", 1)[0]] = self._reading
            self._reading = None


# Binlog event types (the event header's byte 4; the packet's byte 5, after the OK byte).
_XID_EVENT = 0x10
_HEARTBEAT_EVENT = 0x1B
_TABLE_MAP_EVENT = 0x13
_ROWS_QUERY_LOG_EVENT = 0x1D
_MARIADB_ANNOTATE_ROWS_EVENT = 0xA0
_MARIADB_GTID_EVENT = 0xA2
_WRITE_EVENTS = frozenset({0x17, 0x1E})  # WRITE_ROWS v1, v2
_ROWS_EVENTS = _WRITE_EVENTS | {0x18, 0x19, 0x1F, 0x20}  # and UPDATE_ROWS, DELETE_ROWS
_MARK = STATEMENT_MARK.encode()
_reader = threading.local()  # .follower: the follower reading on this thread, for the hook


def install_fast_path() -> bool:
    """Route the library's packets through BinlogFollower.fast (the follower reading on
    the current thread) before it builds an event object. Returns whether the hook is in
    place: where the library's internals differ from what it expects, events all go the
    library's way, as before."""
    from pymysqlreplication import binlogstream, packet

    current = getattr(binlogstream, "BinLogPacketWrapper", None)
    if getattr(current, "msgtable_fast_path", False):
        return True
    if current is not packet.BinLogPacketWrapper:
        return False

    class FastPathPacket(packet.BinLogPacketWrapper):  # type: ignore[misc]
        msgtable_fast_path = True

        def __init__(self, from_packet: Any, *args: Any, **kwargs: Any) -> None:
            follower = getattr(_reader, "follower", None)
            if follower is not None:
                # the library's own arguments: table_map, ctl_connection, mysql_version,
                # use_checksum, ... (BinLogStreamReader passes them by position)
                follower.checksum = bool(args[3]) if len(args) > 3 else False
                data = from_packet.get_all_data()
                left = getattr(from_packet, "msgtable_left", False)  # fast() said no already
                if not left and len(data) >= 28 and follower.fast(data):
                    self.event = None  # the library skips it
                    self.event_type = data[5]
                    self.timestamp = int.from_bytes(data[1:5], "little")
                    self.log_pos = int.from_bytes(data[14:18], "little")
                    return
            super().__init__(from_packet, *args, **kwargs)

    binlogstream.BinLogPacketWrapper = FastPathPacket
    return True


# COM_BINLOG_DUMP and COM_BINLOG_DUMP_GTID: the command byte after a packet's 4-byte header
_DUMP_COMMANDS = frozenset({0x12, 0x1E})


@functools.cache
def dump_connection() -> type:
    """pymysql's Connection for the binlog stream (BinLogStreamReader's ``pymysql_wrapper``):
    once it has sent the dump command on a following thread, each packet it reads goes to the
    follower's fast path first (:meth:`BinlogFollower.fast`), and only the events it leaves
    reach the library, as packets the hook does not look at again. An event the fast path
    takes costs no packet object, no library wrapper and no turn of the library's loop (most
    of a busy table's events are msgtable's own statements and the INSERTs: the follower's
    CPU for a batch-10 mix fell by about a seventh, 233 -> 200 us for an INSERT of 10 rows
    and their send, ack and purge). Without a following thread it is pymysql's Connection."""
    from pymysql import connections, err
    from pymysql.constants import CR
    from pymysql.protocol import MysqlPacket

    class LeftPacket(MysqlPacket):  # type: ignore[misc]
        __slots__ = ()
        msgtable_left = True  # the fast path saw it and left it to the library

    class DumpConnection(connections.Connection):  # type: ignore[misc]
        _follower: BinlogFollower | None = None
        _primed = False  # a packet went to the library: its wrapper told the checksum
        _next_seq_id: int  # pymysql's own state, as its reader keeps it
        _current_timeout: float | None

        def _write_bytes(self, data: bytes) -> None:
            super()._write_bytes(data)
            if len(data) > 4 and data[4] in _DUMP_COMMANDS:
                self._follower = getattr(_reader, "follower", None)
                self._primed = False

        def _read_packet(self, packet_type: Any = MysqlPacket) -> Any:
            follower = self._follower
            if follower is None or packet_type is not MysqlPacket:
                return super()._read_packet(packet_type)
            if self._current_timeout != self._read_timeout:
                self._sock.settimeout(self._read_timeout)
                self._current_timeout = self._read_timeout
            while True:
                data = self._read_whole()
                if self._primed and data[0] == 0 and len(data) >= 28 and follower.fast(data):
                    continue
                packet = LeftPacket(data, self.encoding)
                if packet.is_error_packet():
                    packet.raise_for_error()
                self._primed = True
                return packet

        def _read_whole(self) -> bytes:
            """One packet's payload (a payload of 16 MB or more comes in several)."""
            parts: list[bytes] = []
            while True:
                header = self._read_bytes(4)
                if header[3] != self._next_seq_id:  # as pymysql's own reader
                    self._force_close()
                    if header[3] == 0:  # MariaDB's error packet when it shuts down
                        raise err.OperationalError(
                            CR.CR_SERVER_LOST, "Lost connection to MySQL server during query"
                        )
                    raise err.InternalError(
                        f"Packet sequence number wrong - got {header[3]}"
                        f" expected {self._next_seq_id}"
                    )
                self._next_seq_id = (self._next_seq_id + 1) % 256
                size = header[0] | header[1] << 8 | header[2] << 16
                part = self._read_bytes(size)
                if size < connections.MAX_PACKET_LEN and not parts:
                    return part  # type: ignore[no-any-return]
                parts.append(part)
                if size < connections.MAX_PACKET_LEN:
                    return b"".join(parts)

    return DumpConnection


def reading_again(retry: Retry) -> None:
    """A new stream gave its first event: end ``retry``'s run of failures, and after one
    free what it left in reference cycles. The stream that broke and every attempt that
    failed left garbage the collector alone frees (the library's stream, its connections
    and events hold each other; PyMySQL's connect error holds its frame, the frame its
    connection), each connection with an SSL context of the system's CA certificates: about
    0.7 MB of OpenSSL memory that Python's collector does not count. A long-lived server
    makes full collections rarely, and a soak's server grew by several MB after every
    database fault. Collected here, on the follower's thread once its failed attempts are
    out of scope: one full collection per run of failures (not timed here)."""
    if retry.failures:
        gc.collect()
    retry.succeeded()


def close_stream(stream: Any) -> None:
    """Close a python-mysql-replication stream from another thread than its reader's: a read
    blocked there wakes only when the socket is shut down (closing it would not wake it); a
    broken stream may fail to close, which is fine."""
    sock = getattr(getattr(stream, "_stream_connection", None), "_sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        stream.close()


def gtid_state(text: str) -> dict[str, str]:
    """A MariaDB GTID position ("0-1-100,1-2-7") as its GTID per replication domain."""
    out: dict[str, str] = {}
    for gtid in text.split(","):
        gtid = gtid.strip()
        if gtid:
            out[gtid.split("-", 1)[0]] = gtid
    return out


def row_changes(
    rows: Sequence[dict[str, Any]], columns: Sequence[str], update: bool, theirs: bool = False
) -> list[RowChange] | None:
    """The rows of an UPDATE (``update``) or DELETE event as RowChange; None when the
    event's rows do not have the table's columns (an ALTER TABLE the engine has not seen).
    ``theirs``: the statement's annotation says another client wrote it, so its acks count
    (without annotations msgtable's own small acks are parsed too, and would count twice)."""
    out: list[RowChange] = []
    for row in rows:
        after = _named(row["after_values"] if update else row["values"], columns)
        if after is None:
            return None
        if not update:
            out.append(RowChange(after["id"], gone=True, moved=False))
            continue
        before = _named(row["before_values"], columns)
        if before is None:
            return None
        acked = after.get("time_acked") is not None and before.get("time_acked") is None
        moved = any(before.get(k) != after.get(k) for k in ("time_next", "epoch", "priority"))
        if acked or moved:
            out.append(RowChange(after["id"], acked, moved and not acked, acked and theirs))
    return out


def key_columns(columns: Sequence[str]) -> tuple[int, int, int] | None:
    """Where a table's priority, time_next and id are among its columns (None: it has not
    all three, the 2018 layout)."""
    try:
        return columns.index("priority"), columns.index("time_next"), columns.index("id")
    except ValueError:
        return None


def fast_keys(
    data: bytes, shape: Shape | None, checksum: bool, columns: Sequence[str]
) -> list[PollKey] | None:
    """The poll keys of an INSERT's rows from its raw packet (None: not known here)."""
    at = key_columns(columns)
    if shape is None or at is None:
        return None
    return row_keys(data, shape, checksum, at)


def library_keys(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> list[PollKey] | None:
    """The poll keys of an INSERT's rows as the library parsed them (None: not known)."""
    if key_columns(columns) is None:
        return None
    keys: list[PollKey] = []
    for row in rows:
        values = _named(row["values"], columns)
        if values is None or not isinstance(values.get("id"), int) or values["priority"] is None:
            return None
        keys.append((values["priority"], values["time_next"], values["id"]))
    return keys


def _named(values: dict[str, Any], columns: Sequence[str]) -> dict[str, Any] | None:
    """Values by column name. Without binlog_row_metadata=FULL the library names them
    UNKNOWN_COL0, UNKNOWN_COL1, ... in table order."""
    if len(values) != len(columns):
        return None
    if "id" in values:
        return values
    return {name: values.get(f"UNKNOWN_COL{i}") for i, name in enumerate(columns)}

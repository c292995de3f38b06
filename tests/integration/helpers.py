"""Shared pieces of the integration tests: a served engine, tables, and a stream collector."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from msgtable.client import Client, Message
from msgtable.core.tables import current_layout_ddl
from msgtable.engine.engine import MessageEngine
from msgtable.features.assembly import assemble_dsn
from msgtable.server.servicer import MessagingServer

NS = 10**9


def is_mariadb(cur: Any) -> bool:
    """Whether a DB-API cursor's server is MariaDB (else MySQL)."""
    cur.execute("SELECT VERSION()")
    return "mariadb" in str(cur.fetchone()[0]).lower()


def explain(cur: Any, sql: str, params: Sequence[object] = ()) -> list[dict[str, Any]]:
    """A statement's plan in EXPLAIN's table format, one dict (by column name) a row: the
    column sets differ (MySQL has `partitions`), and MySQL 9 explains as a tree unless asked."""
    prefix = "EXPLAIN " if is_mariadb(cur) else "EXPLAIN FORMAT=TRADITIONAL "
    cur.execute(prefix + sql, tuple(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def comment(**fields: Any) -> str:
    """A vitess_message comment with fast test defaults, overridable per field."""
    values: dict[str, Any] = dict(
        vt_ack_wait=30,
        vt_purge_after=86400,
        vt_batch_size=10,
        vt_cache_size=10000,
        vt_poller_interval=30,
    )
    values.update(fields)
    return "vitess_message," + ",".join(f"{k}={v}" for k, v in values.items())


@dataclass
class Served:
    engine: MessageEngine
    server: MessagingServer
    client: Client
    db: sa.Engine  # the application's own connection (autocommit)

    def sql(self, statement: str, **params: Any) -> Any:
        with self.db.connect() as conn:
            result = conn.execute(sa.text(statement), params)
            return result.fetchall() if result.returns_rows else result.rowcount

    def create_table(self, name: str, extra_columns: str = "", **fields: Any) -> None:
        ddl = current_layout_ddl(name, comment(**fields))
        if extra_columns:
            ddl = ddl.replace("  primary key(id)", f"  {extra_columns},\n  primary key(id)")
        self.sql(ddl)

    def now_ns(self) -> int:
        return time.time_ns()

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        """A real transaction of the application's (the autocommit engine has none)."""
        with self.db.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn


@contextmanager
def serve(dsn: str, **engine_kwargs: Any) -> Iterator[Served]:
    engine_kwargs.setdefault("discovery_interval_s", 0.5)
    engine = assemble_dsn(dsn, **engine_kwargs)
    engine.open()
    server = MessagingServer(engine, "127.0.0.1:0")
    server.start()
    engine.campaign(server.address)  # with a lease_period_s: compete for the lease
    client = Client(server.address)
    db = sa.create_engine(dsn, isolation_level="AUTOCOMMIT")
    try:
        yield Served(engine, server, client, db)
    finally:
        client.close()
        server.stop(1.0)
        engine.close()
        db.dispose()


class Collector:
    """Reads a subscription on a thread so tests can wait for messages with a timeout."""

    def __init__(self, client: Client, table: str, **kwargs: Any) -> None:
        self.subscription = client.subscribe(table, **kwargs)
        self.messages: queue.Queue[Message] = queue.Queue()
        self.arrived_ns: dict[object, list[int]] = {}  # id -> wall-clock times it arrived
        self.batch_sizes: list[int] = []  # of each response, in order
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for batch in self.subscription.batches():
                now = time.time_ns()
                self.batch_sizes.append(len(batch))
                for m in batch:
                    self.arrived_ns.setdefault(m.id, []).append(now)
                    self.messages.put(m)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def take(self, n: int, timeout_s: float = 10.0) -> list[Message]:
        out: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"got {len(out)} of {n} messages in {timeout_s}s: "
                    f"{[m.id for m in out]} (stream error: {self.error!r})"
                )
            try:
                out.append(self.messages.get(timeout=min(left, 0.1)))
            except queue.Empty:
                if self.done.is_set() and self.messages.empty():
                    raise AssertionError(
                        f"stream ended after {len(out)} of {n}: {self.error!r}"
                    ) from None
        return out

    def nothing_for(self, seconds: float) -> None:
        try:
            m = self.messages.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message {m.id!r}: {m.values!r}")

    def close(self) -> None:
        self.subscription.close()
        self._thread.join(5)

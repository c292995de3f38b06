"""A bad network, on loopback through a fault proxy (tests/netfault.py): between msgtable's
server and its database (latency, connections reset mid-statement), and between a client and
the server (a stream reset mid-batch, a subscriber that reads slowly). Nothing is lost, and a
slow or broken path slows only what goes over it."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from msgtable.client import Client
from msgtable.core.tables import current_layout_ddl
from msgtable.engine.engine import MessageEngine
from msgtable.features.assembly import assemble_dsn
from msgtable.server.servicer import MessagingServer

from ..netfault import FaultProxy
from ..waiting import wait_until
from .helpers import Collector, comment


@contextmanager
def through(db_dsn: str) -> Iterator[tuple[FaultProxy, MessagingServer, MessageEngine]]:
    """A msgtable server whose every database connection (the binlog's too) goes through a
    fault proxy."""
    url = sa.make_url(db_dsn)
    with FaultProxy(url.host or "127.0.0.1", url.port or 3306) as proxy:
        proxied = url.set(host="127.0.0.1", port=proxy.port)
        engine = assemble_dsn(
            proxied.render_as_string(hide_password=False), discovery_interval_s=0.5
        )
        engine.open()
        server = MessagingServer(engine, "127.0.0.1:0")
        server.start()
        try:
            yield proxy, server, engine
        finally:
            server.stop(1.0)
            engine.close()


def unacked(sql, table: str = "jobs") -> int:
    return int(sql.scalar(f"select count(*) from {table} where time_acked is null"))


def insert(sql, first: int, n: int, table: str = "jobs") -> None:
    sql.execute(
        f"insert into {table}(id, message) values "
        + ",".join(f"({i}, 'm{i}')" for i in range(first, first + n))
    )


class Acker(threading.Thread):
    """Acks every batch it gets; keeps the ids its acks said were acked."""

    def __init__(self, client: Client, table: str = "jobs") -> None:
        super().__init__(daemon=True)
        self.sub = client.subscribe(table)
        self.acked: set[int] = set()
        self.received = 0
        self.start()

    def run(self) -> None:
        try:
            for batch in self.sub.batches():
                self.received += len(batch)
                try:
                    self.sub.ack(batch)
                except Exception:
                    continue  # not acked: the messages come back after their ack wait
                self.acked.update(int(m.id) for m in batch)
        except Exception:
            pass  # closed


def test_a_slow_database_link_delays_but_delivers_and_acks_everything(sql, db_dsn):
    sql.execute(current_layout_ddl("jobs", comment(vt_ack_wait=5, vt_poller_interval=0.5)))
    with through(db_dsn) as (proxy, server, _), Client(server.address) as client:
        proxy.latency_s = 0.05  # each way, every packet: tens of ms per round trip
        acker = Acker(client)
        insert(sql, 1, 300)
        wait_until(
            lambda: unacked(sql) == 0,
            timeout_s=60,
            what=lambda: f"300 acked over a 50 ms link ({unacked(sql)} left)",
        )
        wait_until(lambda: acker.acked == set(range(1, 301)), what="each ack's answer")
        acker.sub.close()


def test_database_connections_reset_mid_statement_lose_nothing(sql, db_dsn):
    sql.execute(
        current_layout_ddl("jobs", comment(vt_ack_wait=2, vt_poller_interval=0.3, vt_batch_size=20))
    )
    with through(db_dsn) as (proxy, server, _), Client(server.address) as client:
        acker = Acker(client)
        total = 0
        resets = 0
        for _ in range(12):  # a chunk inserted, then every server connection reset
            insert(sql, total + 1, 100)
            total += 100
            time.sleep(0.25)
            resets += proxy.reset()
        wait_until(
            lambda: unacked(sql) == 0,
            timeout_s=90,
            what=lambda: f"{total} acked after {resets} resets ({unacked(sql)} left)",
        )
        assert resets >= 12
        assert sql.scalar("select count(*) from jobs") == total
        # every message acked once in the table; the acks that said so cover all but those
        # whose answer a reset lost (acked in the table all the same)
        assert len(acker.acked) <= total
        acker.sub.close()


def test_a_stream_reset_mid_batch_reconnects_and_delivers_the_rest(sql, db_dsn):
    sql.execute(current_layout_ddl("jobs", comment(vt_ack_wait=2, vt_poller_interval=0.3)))
    with through(db_dsn) as (_, server, _):
        host, port = server.address.rsplit(":", 1)
        with FaultProxy(host, int(port)) as proxy, Client(proxy.address) as client:
            acker = Acker(client)
            total = 0
            for _ in range(6):
                insert(sql, total + 1, 100)
                total += 100
                time.sleep(0.3)
                proxy.reset()  # the client's stream and its unary calls, cut with a RST
            wait_until(
                lambda: unacked(sql) == 0,
                timeout_s=60,
                what=lambda: f"{total} acked through 6 stream resets ({unacked(sql)} left)",
            )
            assert acker.sub.reconnects >= 1
            acker.sub.close()


def test_an_ack_whose_answer_was_lost_is_written_and_counted_once(sql, db_dsn):
    """The ack reaches the server and is written, and its answer is lost on the way back;
    then the connection is reset. The client tries the ack again, and that acks nothing:
    the server counts each message acked once, the table keeps the first ack's time, the
    client's count is not inflated by the retry, and no message is sent again."""
    sql.execute(
        current_layout_ddl("jobs", comment(vt_ack_wait=2, vt_poller_interval=0.3, vt_batch_size=10))
    )
    with through(db_dsn) as (_, server, _):
        host, port = server.address.rsplit(":", 1)
        with FaultProxy(host, int(port)) as proxy, Client(proxy.address, timeout_s=30) as client:
            insert(sql, 1, 10)
            sub = client.subscribe("jobs")
            batch = sub.next_batch()
            assert sorted(int(m.id) for m in batch) == list(range(1, 11))
            proxy.drop_answers = True
            answered: list[int] = []
            failed: list[BaseException] = []

            def ack() -> None:
                try:
                    answered.append(sub.ack(batch))
                except BaseException as exc:
                    failed.append(exc)

            acking = threading.Thread(target=ack, daemon=True)
            acking.start()
            wait_until(
                lambda: unacked(sql) == 0,
                timeout_s=30,
                what=lambda: f"the ack written while its answer is dropped ({unacked(sql)} left)",
            )
            first = sql.execute("select id, time_acked from jobs order by id").all()
            time.sleep(0.5)
            assert not answered and not failed, "the ack's answer got through the proxy"
            proxy.drop_answers = False
            assert proxy.reset() >= 1  # the call's connection, its answer never sent on
            acking.join(30)
            assert not acking.is_alive(), "the ack call did not return within 30 s of the reset"
            assert not failed, f"the retried ack failed: {failed[0]!r}"
            # the retry found every message acked: it acked none, and the client counts that
            assert answered == [0]
            assert sub.acked == 0
            assert sql.execute("select id, time_acked from jobs order by id").all() == first
            # the server counts each ack once, the write the lost answer was for
            assert [t.acked for t in client.list_tables() if t.name == "jobs"] == [10]
            # and sends none of them again past their ack wait (the stream still works)
            insert(sql, 11, 1)
            again = sub.next_batch()
            assert [int(m.id) for m in again] == [11]
            assert sub.ack(again) == 1
            time.sleep(2 * 2 + 0.5)
            [jobs] = [t for t in client.list_tables() if t.name == "jobs"]
            assert (jobs.sent, jobs.acked) == (11, 11)  # 1-10 sent once, 11 once
            sub.close()


def test_a_subscriber_that_reads_slowly_does_not_hold_up_another(sql, db_dsn):
    """One subscriber's path passes 20 KB a second; the other, direct, still gets every
    message the slow one does not hold, at once: the sender never waits on a stream (a
    subscriber whose batches back up is skipped by the round-robin; what its transport
    absorbed stays in flight to it, at most its window of 1,000).

    The fast one's window is wider than the table, so only the slow one's window or a
    sender held up by the slow stream can keep a message from it; how many the slow one
    took (about half, by round-robin, while its transport absorbs them) is not the test's
    business. The fast client does not retry: its one stream must do it."""
    sql.execute(
        current_layout_ddl("jobs", comment(vt_ack_wait=30, vt_poller_interval=0.3)).replace(
            "message varchar(128)", "message varchar(2000)"
        )
    )
    with through(db_dsn) as (_, server, _):
        host, port = server.address.rsplit(":", 1)
        with (
            FaultProxy(host, int(port)) as slow_path,
            Client(slow_path.address) as slow_client,
            Client(server.address) as fast_client,
        ):
            slow_path.slow_bytes_s = 20_000
            slow = Collector(slow_client, "jobs")
            fast = Collector(fast_client, "jobs", max_in_flight=5_000, retry=False)
            time.sleep(0.5)  # both subscribed
            pad = "x" * 1500
            sql.execute(
                "insert into jobs(id, message) values "
                + ",".join(f"({i}, '{pad}')" for i in range(1, 2001))
            )
            began = time.monotonic()
            # the slow one holds at most its window (1,000) of the 2,000
            got = fast.take(1000, timeout_s=30)
            fast_s = time.monotonic() - began
            # 1.5 MB at 20 KB/s would take 75 s: the fast one did not wait for the slow one
            assert len(got) == 1000 and fast_s < 20, f"{fast_s:.1f} s for 1,000 on the fast path"
            slow_got = slow.messages.qsize()
            assert slow_got < 500, f"the slow path passed {slow_got} already"
            slow.subscription.close()
            fast.subscription.close()


def test_a_half_open_subscriber_is_dropped_by_the_servers_keepalive(sql, db_dsn, monkeypatch):
    """A subscriber whose packets vanish (no FIN, no RST): the server's keepalive pings go
    unanswered, the server ends the stream and the subscriber leaves the round-robin; what it
    held comes back to another after its ack wait. (The pings' period is shortened here:
    by default 60 s, 20 s to answer.)"""
    from msgtable.server import servicer as server_module

    monkeypatch.setattr(server_module, "KEEPALIVE_TIME_MS", 1000)
    monkeypatch.setattr(server_module, "KEEPALIVE_TIMEOUT_MS", 1000)
    sql.execute(current_layout_ddl("jobs", comment(vt_ack_wait=3, vt_poller_interval=0.3)))
    with through(db_dsn) as (_, server, engine):
        host, port = server.address.rsplit(":", 1)
        with FaultProxy(host, int(port)) as proxy, Client(proxy.address) as lost_client:
            lost = Collector(lost_client, "jobs")
            insert(sql, 1, 5)
            assert len(lost.take(5)) == 5
            proxy.blackhole = True  # its packets vanish from now on, both ways

            def subscribers() -> int:
                (t,) = [t for t in engine.list_tables() if t.name == "jobs"]
                return t.subscribers

            wait_until(
                lambda: subscribers() == 0,
                timeout_s=15,
                what=lambda: f"the server to drop the half-open stream ({subscribers()} left)",
            )
            with Client(server.address) as client:
                acker = Acker(client)
                wait_until(lambda: acker.acked == set(range(1, 6)), what="the 5 sent again")
                acker.sub.close()


def test_a_subscriber_notices_a_half_open_server_and_goes_to_the_next(sql, db_dsn, monkeypatch):
    """The path to the server the subscriber streams from goes silent (no FIN, no RST): its
    keepalive pings go unanswered, the client ends that connection and subscribes again at
    its next target. (The pings' period is shortened here: by default 60 s, 20 s to answer.)"""
    from msgtable.client import router
    from msgtable.server import servicer as server_module

    monkeypatch.setattr(router, "KEEPALIVE_TIME_MS", 1000)
    monkeypatch.setattr(router, "KEEPALIVE_TIMEOUT_MS", 1000)
    monkeypatch.setattr(server_module, "MIN_CLIENT_PING_MS", 500)
    sql.execute(current_layout_ddl("jobs", comment(vt_ack_wait=3, vt_poller_interval=0.3)))
    with through(db_dsn) as (_, server, _):
        host, port = server.address.rsplit(":", 1)
        with (
            FaultProxy(host, int(port)) as proxy,
            Client(f"{proxy.address},{server.address}") as client,
        ):
            c = Collector(client, "jobs")
            assert c.subscription.target == proxy.address
            insert(sql, 1, 5)
            assert len(c.take(5)) == 5
            proxy.blackhole = True
            insert(sql, 6, 5)
            got = c.take(5, timeout_s=20)  # 6-10, or 1-5 again after their ack wait
            assert len(got) == 5 and c.subscription.target == server.address
            c.subscription.close()


def test_a_half_open_database_connection_lets_go_of_its_row_locks(sql, db_dsn, monkeypatch):
    """The server gives up on a connection whose packets vanish (its read time-out) while its
    transaction holds row locks; the database never hears the close. The session's own
    wait_timeout (msgtable.store.dbpool.SESSION_WAIT_TIMEOUT_S, 60 s; 2 s here) ends it on the
    database's side and the locks go, instead of after the server's default (8 hours)."""
    import pymysql

    from msgtable.store import dbpool
    from msgtable.store.mysql import SESSION_SETUP

    monkeypatch.setattr(dbpool, "SESSION_WAIT_TIMEOUT_S", 2)
    sql.execute(current_layout_ddl("jobs", comment()))
    insert(sql, 1, 1)
    url = sa.make_url(db_dsn)
    with FaultProxy(url.host or "127.0.0.1", url.port or 3306) as proxy:
        pool = dbpool.ConnectionPool(
            url.set(host="127.0.0.1", port=proxy.port),
            {"connect_timeout": 5, "read_timeout": 5},
            autocommit=False,
            init_command=SESSION_SETUP,
            max_idle=1,
            max_connections=1,
            wait_s=5,
        )
        with contextlib.suppress(RuntimeError), pool.connection() as conn:
            with conn.cursor() as cur:
                cur.execute("select id from jobs where id = 1 for update")
            proxy.blackhole = True  # from here its packets vanish, its close too
            raise RuntimeError("the server gives up on it")

        def locked() -> bool:
            direct = pymysql.connect(
                host=url.host, port=url.port, user=url.username, password=url.password,
                database=url.database, autocommit=False,
            )  # fmt: skip
            try:
                with direct.cursor() as cur:
                    cur.execute("set session innodb_lock_wait_timeout = 1")
                    try:
                        cur.execute("select id from jobs where id = 1 for update")
                    except pymysql.err.OperationalError:
                        return True  # 1205: lock wait timeout
                    return False
            finally:
                direct.close()

        assert locked()
        wait_until(lambda: not locked(), timeout_s=15, what="the half-open session's locks")
        pool.close()

"""Failover that keeps delivering (`make chaos` prints its figures): two real `msgtable serve`
processes on one database with the default lease (5 s) and a table with the schema's default
comment (vt_ack_wait=30, vt_postpone_after at its default), the leader SIGKILLed while its
subscriber holds a batch it has not acked.

The new holder must not send the dead holder's batch again before its ack wait is over (its
postpones were not written: the table still shows those rows due, and the old subscriber
may still be working on them). Everything else flows at once: a message inserted after the
old lease ended is delivered within two lease periods of the kill.
Timed: SIGKILL -> the first delivery of a message inserted after the kill, and -> the first
redelivery of one the dead holder had sent.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from msgtable.client import Client, Message
from msgtable.core.tables import DEMO_COMMENT, current_layout_ddl
from msgtable.limits import DEFAULT_LEASE_PERIOD_S

from ..acceptance.helpers import Cli
from ..waiting import wait_until

HELD = 20  # the batch the dead holder sent and its subscriber holds
ACK_WAIT_S = 30.0  # DEMO_COMMENT's
INSERT_EVERY_S = 0.2

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]


@pytest.fixture
def cli(tmp_path):
    runner = Cli(tmp_path)
    try:
        yield runner
    finally:
        runner.stop_all()


def leases(sql) -> list:
    """The placement table's rows ([] before the first server made it)."""
    if not sql.scalar(
        "select count(*) from information_schema.tables "
        "where table_schema = database() and table_name = 'msgtable_placement'"
    ):
        return []
    return list(sql.execute("select *, expires > utc_timestamp(6) as live from msgtable_placement"))


def sender_of_jobs(sql) -> str:
    """The address of the server that holds the lease of table jobs now ("": none)."""
    rows = [
        r
        for r in leases(sql)
        if r.kind == "table" and r.name == "jobs" and not r.released and r.live
    ]
    return str(rows[0].address) if rows else ""


def live_servers(sql) -> int:
    return sum(1 for r in leases(sql) if r.kind == "server" and r.live)


class Receiver:
    """A subscriber on its own thread that keeps what it gets (never acks) with the
    monotonic time it came; it follows the leader on its own (the client's redirect)."""

    def __init__(self, client: Client) -> None:
        self.got: list[tuple[float, Message]] = []
        self.error = ""
        self._client = client
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self._client.subscribe("jobs") as sub:
                for m in sub:
                    self.got.append((time.monotonic(), m))
        except Exception as exc:  # the client closed at the end of the test
            self.error = f"{type(exc).__name__}: {exc}"

    def first(self, ids: set[int], after: float) -> float | None:
        """When the first of ``ids`` came at or after ``after`` (None: none yet)."""
        return next((t for t, m in list(self.got) if int(m.id) in ids and t >= after), None)


def test_after_the_leader_is_killed_new_messages_flow_and_its_batch_waits_its_ack_wait(
    cli: Cli, sql, db_dsn: str
):
    assert "vt_ack_wait=30," in DEMO_COMMENT
    sql.execute(current_layout_ddl("jobs", DEMO_COMMENT))
    first = cli.serve("--dsn", db_dsn, "--discovery-interval", "0.5")
    wait_until(lambda: sender_of_jobs(sql), what="the first server's lease of jobs")
    second = cli.serve("--dsn", db_dsn, "--discovery-interval", "0.5")
    # both servers present, and jobs sent by one of them (it may move to the second: the
    # servers share the tables); the one that sends it is the one killed
    wait_until(lambda: live_servers(sql) == 2, what="both servers in the placement")
    time.sleep(DEFAULT_LEASE_PERIOD_S)  # a hand-over of jobs in progress ends within a step
    wait_until(lambda: sender_of_jobs(sql), what="a sender of jobs")
    sender = first if sender_of_jobs(sql) == first.address else second
    assert sender_of_jobs(sql) == sender.address, (sender_of_jobs(sql), first.address)
    other = second if sender is first else first
    with Client(f"{first.address},{second.address}") as client:
        receiver = Receiver(client)
        sql.execute(
            "insert into jobs(id, message) values "
            + ",".join(f"({i}, 'held {i}')" for i in range(1, HELD + 1))
        )
        held = set(range(1, HELD + 1))
        wait_until(
            lambda: {int(m.id) for _, m in receiver.got} >= held,
            timeout_s=30,
            what=lambda: f"the first batch ({len(receiver.got)} of {HELD}): {receiver.error}",
        )
        sent_at = max(t for t, _ in receiver.got)  # the last of the held batch came then
        assert sender_of_jobs(sql) == sender.address, "jobs moved while its batch was sent"
        sender.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        sender.wait(timeout_s=15)
        # a producer inserts a message every INSERT_EVERY_S from the kill on
        inserted: dict[int, float] = {}
        next_id = 1000
        while time.monotonic() - killed < 2 * DEFAULT_LEASE_PERIOD_S + 5:
            sql.execute(f"insert into jobs(id, message) values ({next_id}, 'new')")
            inserted[next_id] = time.monotonic()
            next_id += 1
            if receiver.first(set(inserted), killed) is not None:
                break
            time.sleep(INSERT_EVERY_S)
        new_at = receiver.first(set(inserted), killed)
        assert new_at is not None, (
            f"no message inserted after the kill delivered in {time.monotonic() - killed:.1f} s "
            f"({len(inserted)} inserted); leases: {leases(sql)}; "
            f"subscriber: {receiver.error}\n--- the other server:\n{other.describe()}"
        )
        first_new = new_at - killed
        assert first_new <= 2 * DEFAULT_LEASE_PERIOD_S, (
            f"the first new message came {first_new:.1f} s after the kill"
        )
        # the dead holder's batch: not again before its ack wait is over, then again
        wait_until(
            lambda: receiver.first(held, killed) is not None,
            timeout_s=ACK_WAIT_S + 2 * DEFAULT_LEASE_PERIOD_S + 15,
            what=lambda: f"a redelivery of the dead holder's batch:\n{other.describe()}",
        )
        again_at = receiver.first(held, killed)
        assert again_at is not None
        assert again_at - sent_at >= ACK_WAIT_S - 0.5, (
            f"the dead holder's batch came again {again_at - sent_at:.1f} s after it was sent, "
            f"inside its ack wait ({ACK_WAIT_S:g} s)"
        )
        print(
            f"\nfailover (lease {DEFAULT_LEASE_PERIOD_S:g} s, vt_ack_wait {ACK_WAIT_S:g} s): "
            f"SIGKILL -> first delivery of a message inserted after it {first_new:.1f} s; "
            f"-> first redelivery of one the dead holder sent {again_at - killed:.1f} s "
            f"({again_at - sent_at:.1f} s after its send)"
        )

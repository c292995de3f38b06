"""The SQS-compatible API (msgtable.server.sqs) through boto3, the AWS SDK for Python (the
``sqs`` section of ``python -m bench.run``).

One server of its own (``--sqs-listen``, ``--binlog``, ``--no-lease``) serves both runs.

Throughput (``sqs_msgs_s``; ``sqs_ratio`` against the Python gRPC client, target >= 0.5):
the same loop through both, SIZES[mode] messages, ten at a time and each step waiting for
the last: boto3 sends a batch of ten (SendMessageBatch), receives them (ReceiveMessage,
MaxNumberOfMessages 10, long polling) and deletes them (DeleteMessageBatch); the gRPC client
enqueues ten in one transaction (msgtable.enqueue, as an application does; gRPC has no
send), takes them from its subscriber and acks them in one call. The two take turns on the
same table, ROUNDS[mode] rounds of each (gRPC, SQS, gRPC, SQS, ...), so that a shared
machine's slow spell falls on both: ``sqs_ratio`` is the median of the rounds' ratios (their
spread is in the ``sqs`` details), ``sqs_msgs_s`` the SQS rounds' total rate. A round
begins once the table has no subscriber (the API's closes LINGER_S after its last
receive): the engine shares a table's sends among its subscribers.

Long polling (``sqs_longpoll_p99_ms``, target <= 20): a receive waits (WaitTimeSeconds 20)
while one row is INSERTed by SQL; the figure is the time from that INSERT's commit to the
receive's answer (``time.monotonic()``, one clock), LONGPOLLS[mode] times.
"""

from __future__ import annotations

import contextlib
import threading
import time
from array import array
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from bench import smoke
from bench.database import connect, create_table, execute, message_comment
from bench.errors import BenchError
from bench.measure import percentile
from bench.processes import ServerProcess
from msgtable.client import Client
from msgtable.enqueue import enqueue_many
from msgtable.testing.devdb import free_port

BATCH = 10
SIZES = {"quick": 3_000, "full": 10_000, "smoke": smoke.SQS_MESSAGES}
LONGPOLLS = {"quick": 100, "full": 300, "smoke": smoke.SQS_LONGPOLLS}
ROUNDS = {"quick": 3, "full": 5, "smoke": 1}
TARGET_RATIO = 0.5
TARGET_LONGPOLL_P99_MS = 20.0
TABLE = "sqs_bench"


@dataclass(frozen=True)
class SqsResult:
    messages: int
    sqs_seconds: float
    grpc_seconds: float
    longpolls: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    ratios: tuple[float, ...] = ()  # each round's, SQS / gRPC

    @property
    def msgs_s(self) -> float:
        return self.messages / self.sqs_seconds

    @property
    def grpc_msgs_s(self) -> float:
        return self.messages / self.grpc_seconds

    @property
    def ratio(self) -> float:
        if not self.ratios:
            return self.msgs_s / self.grpc_msgs_s
        return percentile(array("d", sorted(self.ratios)), 50)

    def as_dict(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "batch_size": BATCH,
            "sqs_msgs_s": round(self.msgs_s),
            "grpc_msgs_s": round(self.grpc_msgs_s),
            "ratio_rounds": [round(r, 3) for r in self.ratios],
            "ratio_spread": round(max(self.ratios) - min(self.ratios), 3) if self.ratios else None,
            "longpolls": self.longpolls,
            "longpoll_p50_ms": round(self.p50_ms, 2),
            "longpoll_p99_ms": round(self.p99_ms, 2),
            "longpoll_max_ms": round(self.max_ms, 2),
        }


def sqs_client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="bench-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench-secret",
        config=Config(retries={"max_attempts": 1}, read_timeout=60, max_pool_connections=4),
    )


def grpc_loop(address: str, dsn: str, n: int, first_id: int = 1) -> float:
    """Seconds the gRPC client takes to enqueue, receive and ack ``n`` messages, ten a time
    (ids from ``first_id``)."""
    db = sa.create_engine(dsn)
    try:
        with Client(address, timeout_s=30) as client:
            sub = client.subscribe(TABLE, max_in_flight=BATCH * 4)
            try:
                began = time.monotonic()
                next_id = first_id
                for _ in range(n // BATCH):
                    rows = [{"id": next_id + i, "message": "m"} for i in range(BATCH)]
                    next_id += BATCH
                    with db.begin() as conn:
                        enqueue_many(conn, TABLE, rows)
                    got = [next(sub) for _ in range(BATCH)]
                    if sub.ack(got) != BATCH:
                        raise BenchError("sqs: the gRPC client's ack counted fewer than sent")
                return time.monotonic() - began
            finally:
                sub.close()
    finally:
        db.dispose()


def quiet(address: str, timeout_s: float = 60.0) -> None:
    """Return once the table has no subscriber (not timed)."""
    deadline = time.monotonic() + timeout_s
    with Client(address, timeout_s=30) as client:
        while time.monotonic() < deadline:
            tables = [t for t in client.list_tables() if t.name == TABLE and not t.subscription]
            if tables and tables[0].subscribers == 0:
                return
            time.sleep(0.2)  # a bench's pause between rounds, nothing to wake it
    raise BenchError(f"sqs: table {TABLE} still had subscribers after {timeout_s:g}s")


def sqs_loop(endpoint: str, n: int) -> float:
    """Seconds boto3 takes to send, receive and delete ``n`` messages, ten a time."""
    sqs = sqs_client(endpoint)
    url = sqs.get_queue_url(QueueName=TABLE)["QueueUrl"]
    entries = [{"Id": str(i), "MessageBody": "m"} for i in range(BATCH)]
    began = time.monotonic()
    for _ in range(n // BATCH):
        sent = sqs.send_message_batch(QueueUrl=url, Entries=entries)
        if len(sent["Successful"]) != BATCH:
            raise BenchError(f"sqs: a batch was not sent whole: {sent['Failed'][:1]}")
        got: list[dict[str, Any]] = []
        while len(got) < BATCH:
            got += sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=BATCH - len(got), WaitTimeSeconds=10
            ).get("Messages", [])
        done = sqs.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
            ],
        )
        if done["Failed"]:
            raise BenchError(f"sqs: a delete failed: {done['Failed'][:1]}")
    return time.monotonic() - began


def longpolls(endpoint: str, dsn: str, count: int) -> array[float]:
    """INSERT commit -> long-polling receive's answer, ms, sorted."""
    sqs = sqs_client(endpoint)
    url = sqs.get_queue_url(QueueName=TABLE)["QueueUrl"]
    out = array("d")
    with contextlib.closing(connect(dsn)) as conn, conn.cursor() as cur:
        for i in range(count):
            answer: list[tuple[list[Any], float]] = []

            t = threading.Thread(target=_poll, args=(sqs, url, answer))
            t.start()
            time.sleep(0.05)  # the receive is waiting
            cur.execute(f"insert into {TABLE} (id, message) values (%s, 'lp')", (10_000_000 + i,))
            committed = time.monotonic()
            t.join(30)
            if not answer or not answer[0][0]:
                raise BenchError("sqs: a long poll did not get the row INSERTed under it")
            got, returned = answer[0]
            out.append((returned - committed) * 1000)
            sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    return array("d", sorted(out))


def _poll(sqs: Any, url: str, answer: list[tuple[list[Any], float]]) -> None:
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=20).get("Messages", [])
    answer.append((got, time.monotonic()))


def run(dsn: str, mode: str, postpone_after_s: float | None) -> SqsResult:
    n = SIZES[mode]
    create_table(dsn, TABLE, message_comment(BATCH, 1.0, postpone_after_s=postpone_after_s))
    listen = f"127.0.0.1:{free_port()}"
    extra = ("--sqs-listen", listen)
    try:
        with ServerProcess(dsn, binlog=True, lease=False, extra=extra) as server:
            time.sleep(1.0)  # its binlog follower connects after it serves
            endpoint = f"http://{listen}"
            rounds = ROUNDS[mode]
            each = max(BATCH, n // rounds // BATCH * BATCH)
            timed = []
            for r in range(rounds):
                quiet(server.address)
                grpc_s = grpc_loop(server.address, dsn, each, 1 + r * each)
                quiet(server.address)
                timed.append((grpc_s, sqs_loop(endpoint, each)))
            lat = longpolls(endpoint, dsn, LONGPOLLS[mode])
            server.check_alive()
    finally:
        execute(dsn, f"drop table if exists {TABLE}")
    return SqsResult(
        messages=each * rounds,
        sqs_seconds=sum(s for _, s in timed),
        grpc_seconds=sum(g for g, _ in timed),
        ratios=tuple(g / s for g, s in timed),
        longpolls=len(lat),
        p50_ms=percentile(lat, 50),
        p99_ms=percentile(lat, 99),
        max_ms=lat[-1],
    )

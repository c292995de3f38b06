"""The raw-SQL limit of the message lifecycle: what the database can do with no engine at all.

A message engine cannot avoid four statements: the producer's multi-row INSERT, a SELECT of
due rows, a batched postpone UPDATE (the claim) and a batched ack UPDATE. Here plain PyMySQL
connections run exactly those, in the shapes of msgtable/store/mysqlstore.py, on a table made with
msgtable.core.tables.current_layout_ddl, in tight loops:

    poll      select priority, time_next, epoch, id, message from T
              where time_acked is null and priority = :k
                and (time_next is null or time_next <= :now)
              order by priority, time_next, id limit :batch
    postpone  update T set time_next = :next, epoch = coalesce(epoch, 0) + 1
              where id in (...) and epoch <=> :epoch and time_acked is null
                and (time_next is null or time_next <= :now)
    ack       update T set time_acked = :now, time_next = null
              where id in (...) and time_acked is null

How it is made fair (the point is "what the database can do for this lifecycle here"):

* one producer process inserts the same rows as the msgtable run (bench.producer.producer_rows
  rows per INSERT), concurrently with the consumers; the clock runs from its first INSERT to
  the last ack, as for msgtable;
* there are as many consumer connections as msgtable has subscribers, each in a process of its
  own, each doing poll -> postpone -> ack, every statement its own autocommit transaction (an
  engine must commit the claim before a message leaves, and an ack is a transaction of the
  subscriber's), at the same batch size as msgtable's vt_batch_size;
* consumers never contend for rows and need no coordination: the producer gives the rows of
  its k-th INSERT priority k % consumers (whole INSERTs, so a consumer finds full batches),
  and consumer k polls with ``priority = k`` (an equality on the second column of
  poller_idx, so the plan is the same index range scan as the engine's poll). This is the
  best a hand-written SQL queue can do with that many connections; msgtable instead polls
  up to vt_cache_size rows at once and claims batch by batch. (The msgtable run uses the
  same producer, so its rows carry the same priorities; that changes only their order);
* a consumer whose poll finds nothing sleeps, IDLE_SLEEP_S doubling up to IDLE_MAX_S while it
  keeps finding nothing, so idle consumers do not take the CPU the producer needs (this
  matters at 16 consumers on 2 cores).

Correctness is checked as for msgtable: every row acked, each claimed exactly once (epoch 1).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from bench.database import NS, check_lifecycle, connect, create_table, execute
from bench.errors import BenchError
from bench.measure import Throughput, cpu_meter, run_timeout_s
from bench.processes import Workers, report
from bench.producer import ProducerSpec, partition_sizes, producer_rows, producer_worker

IDLE_SLEEP_S = 0.001
IDLE_MAX_S = 0.016
POSTPONE_S = 60  # any future time: the row must not be due again during the run
RAW_COMMENT = "bench raw lifecycle"  # not a message table: the msgtable server ignores it


@dataclass(frozen=True)
class ConsumerSpec:
    dsn: str
    table: str
    partition: int
    expected: int  # rows of priority == partition (bench.producer.partition_sizes)
    batch_size: int
    idle_sleep_s: float = IDLE_SLEEP_S


def consumer_worker(spec: ConsumerSpec, name: str, ready: Any, go: Any, results: Any) -> None:
    """Poll, postpone and ack batches of partition ``spec.partition`` until all are acked."""

    def work() -> dict[str, Any]:
        t = spec.table
        poll = (
            f"select priority, time_next, epoch, id, message from {t} "
            f"where time_acked is null and priority = %s "
            f"and (time_next is null or time_next <= %s) "
            f"order by priority, time_next, id limit %s"
        )
        acked = batches = empty_polls = empty_run = 0
        last = 0.0
        with contextlib.closing(connect(spec.dsn)) as conn, conn.cursor() as cur:
            ready.put(name)
            go.wait()
            while acked < spec.expected:
                now = time.time_ns()
                cur.execute(poll, (spec.partition, now, spec.batch_size))
                rows = cur.fetchall()
                if not rows:
                    # back off while the partition is empty, so that idle consumers do not
                    # take the CPU the producer needs: idle_sleep_s doubling to IDLE_MAX_S
                    time.sleep(min(IDLE_MAX_S, spec.idle_sleep_s * 2 ** min(empty_run, 10)))
                    empty_polls += 1
                    empty_run += 1
                    continue
                empty_run = 0
                by_epoch: dict[int | None, list[int]] = {}
                for row in rows:
                    by_epoch.setdefault(row[2], []).append(row[3])
                claimed: list[int] = []
                for epoch, ids in by_epoch.items():
                    marks = ",".join(["%s"] * len(ids))
                    done = cur.execute(
                        f"update {t} set time_next = %s, epoch = coalesce(epoch, 0) + 1 "
                        f"where id in ({marks}) and epoch <=> %s and time_acked is null "
                        f"and (time_next is null or time_next <= %s)",
                        (now + POSTPONE_S * NS, *ids, epoch, now),
                    )
                    if done == len(ids):  # nobody else touches this partition
                        claimed.extend(ids)
                marks = ",".join(["%s"] * len(claimed))
                acked += cur.execute(
                    f"update {t} set time_acked = %s, time_next = null "
                    f"where id in ({marks}) and time_acked is null",
                    (time.time_ns(), *claimed),
                )
                batches += 1
                last = time.monotonic()
        return {"acked": acked, "last": last, "batches": batches, "empty_polls": empty_polls}

    report(name, results, work)


def run(
    dsn: str,
    n: int,
    batch_size: int,
    consumers: int,
    idle_sleep_s: float = IDLE_SLEEP_S,
    db_pid: int | None = None,
) -> Throughput:
    """One raw run: a producer and ``consumers`` consumer connections, ``n`` messages."""
    table = f"raw_b{batch_size}_c{consumers}"
    create_table(dsn, table, RAW_COMMENT)
    try:
        with Workers() as workers:
            rows = producer_rows(batch_size)
            for k, expected in enumerate(partition_sizes(n, rows, consumers)):
                spec = ConsumerSpec(dsn, table, k, expected, batch_size, idle_sleep_s)
                workers.start(f"consumer{k}", consumer_worker, spec)
            producer = ProducerSpec(dsn, table, 0, n, rows, consumers)
            workers.start("producer", producer_worker, producer)
            workers.wait_ready()
            with cpu_meter(database=db_pid) as cpu:
                workers.go.set()
                results = workers.collect(run_timeout_s(n))
        start = results["producer"]["start"]
        end = max(r["last"] for name, r in results.items() if name != "producer")
        acked = sum(r.get("acked", 0) for r in results.values())
        if acked != n:
            raise BenchError(f"{table}: {acked} acks for {n} messages")
        check_lifecycle(dsn, table, n)
        insert_s = results["producer"]["end"] - start
        cpu["producer"] = results["producer"]["cpu_s"]
        cpu["consumers"] = sum(r["cpu_s"] for name, r in results.items() if name != "producer")
        return Throughput(
            "raw",
            batch_size,
            consumers,
            n,
            end - start,
            note=f"producer inserted at {n / insert_s:,.0f} rows/s",
            cpu_s=cpu if db_pid else {k: v for k, v in cpu.items() if k != "database"},
        )
    finally:
        execute(dsn, f"drop table if exists {table}")

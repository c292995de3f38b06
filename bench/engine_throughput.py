"""Rough end-to-end deliveries per second: SQL INSERT -> MessageStream -> MessageAck.

A producer inserts N messages with multi-row INSERTs while K subscribers stream them over
gRPC (loopback) and ack every batch with MessageAck. The figure is N divided by the time
from the first INSERT to the last ack; every message must be acked exactly once.

    python bench/engine_throughput.py [--messages 20000] [--batch-sizes 10,100]
                                      [--subscribers 1,4] [--poller-interval 0.1]

Uses MSGTABLE_TEST_DSN when set (a server where the account may create databases), else a
throwaway local server (msgtable.devdb). The full benchmark suite is a later piece of work;
this script gives the engine's first numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import Counter

import sqlalchemy as sa

from msgtable.client import Client
from msgtable.devdb import ExternalServer, LocalServer, ServerHandle
from msgtable.engine import MessageEngine
from msgtable.errors import MsgtableError
from msgtable.server import MessagingServer
from msgtable.tables import current_layout_ddl

PAYLOAD = '{"order": 123456, "sku": "ABC-123", "qty": 2, "note": "ship fast"}'  # ~60 bytes
INSERT_ROWS = 500


def run_once(
    server: ServerHandle, n: int, batch: int, subscribers: int, poller_interval: float
) -> dict[str, float]:
    db = f"bench_b{batch}_s{subscribers}"
    server.drop_database(db)
    server.create_database(db)
    dsn = server.dsn(db)
    app = sa.create_engine(dsn, isolation_level="AUTOCOMMIT")
    comment = (
        f"vitess_message,vt_ack_wait=30,vt_purge_after=86400,vt_batch_size={batch},"
        f"vt_cache_size=10000,vt_poller_interval={poller_interval}"
    )
    with app.connect() as conn:
        conn.execute(sa.text(current_layout_ddl("bench", comment)))
    engine = MessageEngine.from_dsn(dsn)
    engine.open()
    grpc_server = MessagingServer(engine, "127.0.0.1:0")
    grpc_server.start()
    acked: Counter[object] = Counter()
    lock = threading.Lock()
    done = threading.Event()
    last_ack = [0.0]

    def consume() -> None:
        with Client(grpc_server.address) as client, client.subscribe("bench") as sub:
            try:
                for msgs in sub.batches():
                    sub.ack(msgs)
                    with lock:
                        acked.update(m.id for m in msgs)
                        if sum(acked.values()) >= n:
                            last_ack[0] = time.perf_counter()
                            done.set()
                    if done.is_set():
                        return
            except MsgtableError:  # the server stopped under a subscriber that was idle
                return

    threads = [threading.Thread(target=consume, daemon=True) for _ in range(subscribers)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # subscribed before the first insert
    start = time.perf_counter()
    with app.connect() as conn:
        for lo in range(0, n, INSERT_ROWS):
            ids = range(lo, min(n, lo + INSERT_ROWS))
            conn.execute(
                sa.text(
                    "insert into bench(id, message) values " + ",".join(f"({i}, :p)" for i in ids)
                ),
                {"p": PAYLOAD},
            )
    inserted = time.perf_counter()
    finished = done.wait(300)
    grpc_server.stop(1.0)
    engine.close()
    app.dispose()
    server.drop_database(db)
    if not finished:
        raise SystemExit(f"only {sum(acked.values())} of {n} acked within 300 s")
    dupes = sum(c - 1 for c in acked.values() if c > 1)
    if len(acked) != n or dupes:
        raise SystemExit(f"acked {len(acked)} distinct of {n}, {dupes} duplicates")
    elapsed = last_ack[0] - start
    return {
        "batch_size": batch,
        "subscribers": subscribers,
        "messages": n,
        "insert_s": round(inserted - start, 3),
        "elapsed_s": round(elapsed, 3),
        "msgs_s": round(n / elapsed),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--batch-sizes", default="10,100")
    p.add_argument("--subscribers", default="1,4")
    p.add_argument("--poller-interval", type=float, default=0.1)
    args = p.parse_args()
    dsn = os.environ.get("MSGTABLE_TEST_DSN")
    server: ServerHandle
    local = None
    if dsn:
        server = ExternalServer(dsn)
    else:
        local = LocalServer()
        local.start()
        server = local
    try:
        rows = [
            run_once(server, args.messages, b, k, args.poller_interval)
            for b in map(int, args.batch_sizes.split(","))
            for k in map(int, args.subscribers.split(","))
        ]
    finally:
        if local is not None:
            local.stop()
    print(f"{'batch':>6} {'subs':>5} {'msgs':>7} {'seconds':>8} {'msgs/s':>8}")
    for r in rows:
        print(
            f"{r['batch_size']:>6} {r['subscribers']:>5} {r['messages']:>7} "
            f"{r['elapsed_s']:>8} {r['msgs_s']:>8}"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()

"""Streams with filters, as a client without retries uses them (issue 39, item 1): a plain
generated gRPC stub that subscribes with a filter and acks what it gets, against the real
server and a real MySQL-family database.

Every message a connected stream's filter passes must reach that stream while it has room,
however many messages no stream passes (a NULL in the filtered column: neither ``X`` nor
``NOT (X)`` passes it) sit before it in the cache.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc

from ..waiting import wait_until
from .helpers import Served, serve

REGION = "region varchar(16) null"


@pytest.fixture
def served(db_dsn: str) -> Iterator[Served]:
    with serve(db_dsn) as s:
        yield s


class StubStream:
    """One MessageStream through a generated stub: no retries, acks each batch it gets."""

    def __init__(
        self,
        stub: pb_grpc.MessagingStub,
        table: str,
        filter: str = "",
        subscription: str = "",
        ack: bool = True,
        max_in_flight: int = 0,
    ) -> None:
        self.stub, self.table, self.subscription, self.ack = stub, table, subscription, ack
        self.call = stub.MessageStream(
            pb.MessageStreamRequest(
                name=table, filter=filter, subscription=subscription, max_in_flight=max_in_flight
            )
        )
        self.ids: list[int] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for response in self.call:
                ids = [row.values[0].int_value for row in response.rows]
                self.ids.extend(ids)
                if ids and self.ack:
                    self.stub.MessageAck(
                        pb.MessageAckRequest(
                            name=self.table,
                            ids=[pb.Value(int_value=i) for i in ids],
                            subscription=self.subscription,
                        ),
                        timeout=10,
                    )
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.CANCELLED:
                self.error = exc

    def close(self) -> None:
        self.call.cancel()
        self._thread.join(5)


@contextmanager
def stub_of(s: Served) -> Iterator[pb_grpc.MessagingStub]:
    with grpc.insecure_channel(s.server.address) as channel:
        yield pb_grpc.MessagingStub(channel)


def insert_regions(s: Served, table: str, regions: list[str | None]) -> None:
    values = ",".join(
        f"({i}, 'm{i}', {'NULL' if r is None else repr(r)})" for i, r in enumerate(regions, 1)
    )
    s.sql(f"insert into {table}(id, message, region) values {values}")


def expect_all(streams: dict[str, tuple[StubStream, set[int]]], timeout_s: float) -> None:
    def missing() -> dict[str, list[int]]:
        return {
            name: sorted(want - set(stream.ids))
            for name, (stream, want) in streams.items()
            if want - set(stream.ids)
        }

    def said() -> str:
        got = {name: f"{len(set(st.ids))}/{len(w)}" for name, (st, w) in streams.items()}
        errors = {name: st.error for name, (st, _) in streams.items() if st.error}
        return f"every stream's messages; got {got}, never sent {missing()} (errors {errors})"

    wait_until(lambda: not missing(), timeout_s, said)


def test_two_filtered_streams_get_every_message_they_pass_behind_rows_neither_passes(
    served: Served,
):
    # A quarter 'a', a quarter 'b', half NULL (neither filter passes those), interleaved:
    # the rows no stream takes gather at the head of the cache as the others go out.
    served.create_table("regions", REGION, vt_batch_size=10, vt_poller_interval=30)
    regions: list[str | None] = [("a", "b", None, None)[i % 4] for i in range(200)]
    insert_regions(served, "regions", regions)
    served.engine.refresh()
    want_a = {i for i, r in enumerate(regions, 1) if r == "a"}
    want_b = {i for i, r in enumerate(regions, 1) if r == "b"}
    with stub_of(served) as stub:
        a = StubStream(stub, "regions", filter="region = 'a'")
        b = StubStream(stub, "regions", filter="region = 'b'")
        try:
            expect_all({"region = 'a'": (a, want_a), "region = 'b'": (b, want_b)}, 10)
        finally:
            a.close()
            b.close()
    assert not set(a.ids) - want_a and not set(b.ids) - want_b


def test_a_filter_and_its_negation_get_every_message_they_pass_with_nulls_in_between(
    served: Served,
):
    # X and NOT (X): a row whose region is NULL passes neither.
    served.create_table("split", REGION, vt_batch_size=4, vt_poller_interval=30)
    regions: list[str | None] = [
        ("eu", None, "us", None, None, "eu", "us")[i % 7] for i in range(210)
    ]
    insert_regions(served, "split", regions)
    served.engine.refresh()
    x = "region = 'eu'"
    want_x = {i for i, r in enumerate(regions, 1) if r == "eu"}
    want_not = {i for i, r in enumerate(regions, 1) if r is not None and r != "eu"}
    with stub_of(served) as stub:
        yes = StubStream(stub, "split", filter=x)
        no = StubStream(stub, "split", filter=f"NOT ({x})")
        try:
            expect_all({x: (yes, want_x), f"NOT ({x})": (no, want_not)}, 10)
        finally:
            yes.close()
            no.close()


def test_a_filtered_stream_gets_its_messages_behind_many_another_full_stream_passes(
    served: Served,
):
    # 'a' holds the head of the queue, a hundred rows deep; its stream has a window of 5 and
    # never acks, so it is full. The 'b' stream has room: its rows behind are its at once.
    served.create_table("full", REGION, vt_batch_size=5, vt_poller_interval=30, vt_ack_wait=60)
    regions: list[str | None] = ["a"] * 100 + ["b"] * 10
    insert_regions(served, "full", regions)
    served.engine.refresh()
    want_b = {i for i, r in enumerate(regions, 1) if r == "b"}
    with stub_of(served) as stub:
        a = StubStream(stub, "full", filter="region = 'a'", ack=False, max_in_flight=5)
        wait_until(lambda: len(a.ids) == 5, 10, "the full stream's window of 5")
        b = StubStream(stub, "full", filter="region = 'b'")
        try:
            expect_all({"region = 'b'": (b, want_b)}, 10)
        finally:
            a.close()
            b.close()
    assert len(a.ids) == 5


def test_an_insert_a_filter_passes_goes_out_at_once_with_rows_no_filter_passes_queued(
    db_dsn: str,
):
    # The binlog shows an INSERT; a new pass reads it at once when the sender is dry. Rows no
    # stream's filter passes (15, more than a batch) are queued: the sender is dry all the same.
    with serve(db_dsn, follow_binlog=True) as s:
        s.create_table("late", REGION, vt_batch_size=10, vt_poller_interval=30)
        insert_regions(s, "late", [None] * 15)
        s.engine.refresh()
        with stub_of(s) as stub:
            a = StubStream(stub, "late", filter="region = 'a'")
            try:
                m = s.engine._manager("late", "")
                wait_until(lambda: m.cache.cached == 15, 10, "the first poll's 15 rows")
                s.sql("insert into late(id, message, region) values (16, 'm16', 'a')")
                expect_all({"region = 'a'": (a, {16})}, 10)
            finally:
                a.close()


def test_a_filtered_subscriptions_streams_get_every_message_their_filters_pass(db_dsn: str):
    # A subscription whose filter passes 'a', 'b' and 'c' (not 'z', nor NULL), and two streams
    # of it with filters 'a' and 'b': the 'c' rows pass the subscription but neither stream.
    with serve(db_dsn, follow_binlog=True) as s:
        s.create_table("subbed", REGION, vt_batch_size=5, vt_poller_interval=30)
        s.engine.refresh()
        s.client.create_subscription("subbed", "abc", filter="region <> 'z'")
        regions: list[str | None] = [("a", "c", "b", None, "c", "z")[i % 6] for i in range(240)]
        insert_regions(s, "subbed", regions)
        want_a = {i for i, r in enumerate(regions, 1) if r == "a"}
        want_b = {i for i, r in enumerate(regions, 1) if r == "b"}
        with stub_of(s) as stub:
            a = StubStream(stub, "subbed", filter="region = 'a'", subscription="abc")
            b = StubStream(stub, "subbed", filter="region = 'b'", subscription="abc")
            try:
                expect_all({"abc: region = 'a'": (a, want_a), "abc: region = 'b'": (b, want_b)}, 15)
            finally:
                a.close()
                b.close()
        state = s.sql("select id from subbed__abc")
        assert {r[0] for r in state} == {
            i for i, r in enumerate(regions, 1) if r in ("a", "b", "c")
        }

"""A keyspace of shards on a real MariaDB (each shard a database of its own, served by its own
server), behind one gateway: the shards' streams merged, each ack routed to the shard that
holds its id, one shard's stream or a key range's, ListTables of every shard, a shard away
while the others deliver, and a misdescribed keyspace named by its shard."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

from msgtable.client import Client
from msgtable.core.keyspace import KeyRange, Keyspace, Shard
from msgtable.core.tables import current_layout_ddl
from msgtable.engine.engine import MessageEngine
from msgtable.enqueue.sharded import ShardedEnqueue
from msgtable.errors import InvalidArgument, PartlySettled, TableNotFound, Unavailable
from msgtable.features.assembly import assemble_dsn
from msgtable.gateway.clients import AsyncKeyspaceClient, KeyspaceClient
from msgtable.gateway.gateway import GatewayServicer, KeyspaceGateway
from msgtable.server.servicer import MessagingServer

from ..waiting import wait_until
from .helpers import Collector, comment

RANGES = {2: ("-80", "80-"), 4: ("-40", "40-80", "80-c0", "c0-")}


@dataclass
class ShardServer:
    name: str
    dsn: str
    db: sa.Engine
    engine: MessageEngine | None = None
    server: MessagingServer | None = None
    port: int = 0

    def start(self) -> None:
        self.engine = assemble_dsn(
            self.dsn,
            discovery_interval_s=0.5,
            keyspace="app",
            shard=KeyRange.parse(self.name),
        )
        self.engine.open()
        self.server = MessagingServer(self.engine, f"127.0.0.1:{self.port}")
        self.server.start()
        self.port = self.server.port

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0.5)
        if self.engine is not None:
            self.engine.close()
        self.server = self.engine = None

    def sql(self, statement: str, **params: object) -> list[tuple[object, ...]]:
        with self.db.connect() as conn:
            result = conn.execute(sa.text(statement), params)
            return [tuple(r) for r in result] if result.returns_rows else []


@dataclass
class Cluster:
    keyspace: Keyspace
    shards: dict[str, ShardServer]
    gateway: KeyspaceGateway
    server: MessagingServer
    client: Client

    def enqueue(self, table: str, ids: list[int]) -> None:
        """Each id into the shard that holds it, as msgtable.enqueue's keyspace helper does."""
        for shard, id_ in zip(self.keyspace.shards_of(ids), ids, strict=True):
            self.shards[shard.name].sql(
                f"INSERT INTO {table} (id, message) VALUES (:id, :m)",
                id=id_,
                m=f"m{id_}",
            )

    def acked(self, table: str) -> dict[str, set[int]]:
        return {
            name: {int(r[0]) for r in s.sql(f"SELECT id FROM {table} WHERE time_acked IS NOT NULL")}
            for name, s in self.shards.items()
        }


@contextlib.contextmanager
def keyspace_of(
    mysql_server, db_name: str, n: int, tables: tuple[str, ...] = ("q",)
) -> Iterator[Cluster]:
    shards: dict[str, ShardServer] = {}
    names = []
    try:
        for k, rng in enumerate(RANGES[n]):
            name = f"{db_name}_s{k}"
            mysql_server.drop_database(name)
            mysql_server.create_database(name)
            names.append(name)
            dsn = mysql_server.dsn(name)
            s = shards[rng] = ShardServer(
                rng, dsn, sa.create_engine(dsn, isolation_level="AUTOCOMMIT")
            )
            for t in tables:
                s.sql(current_layout_ddl(t, comment(vt_batch_size=20, vt_poller_interval=0.5)))
            s.start()
        keyspace = Keyspace(
            "app",
            tuple(
                Shard(KeyRange.parse(rng), s.dsn, (f"127.0.0.1:{s.port}",))
                for rng, s in shards.items()
            ),
        )
        gateway = KeyspaceGateway(keyspace, timeout_s=3.0)
        server = MessagingServer(gateway, "127.0.0.1:0", servicer=GatewayServicer)
        server.start()
        client = Client(server.address)
        try:
            yield Cluster(keyspace, shards, gateway, server, client)
        finally:
            client.close()
            server.stop(0.5)
            gateway.close()
    finally:
        for s in shards.values():
            s.stop()
            s.db.dispose()
        for name in names:
            mysql_server.drop_database(name)


@pytest.mark.parametrize("n", [2, 4])
def test_a_keyspace_stream_merges_its_shards_and_each_ack_reaches_the_shard_of_its_id(
    mysql_server, db_name: str, n: int
):
    with keyspace_of(mysql_server, db_name, n) as c:
        ids = list(range(1, 401))
        c.enqueue("q", ids)
        per_shard = {s.name: set() for s in c.keyspace.shards}
        for shard, id_ in zip(c.keyspace.shards_of(ids), ids, strict=True):
            per_shard[shard.name].add(id_)
        assert all(per_shard.values()), per_shard  # the hash spreads 400 ids over every shard
        got = Collector(c.client, "q")
        try:
            messages = got.take(400, timeout_s=30)
            assert sorted(m.id for m in messages) == ids  # each once
            assert {m.values["message"] for m in messages} == {f"m{i}" for i in ids}
            assert c.client.ack("q", [m.id for m in messages]) == 400
            assert c.acked("q") == per_shard  # each ack went to the shard of its id
            got.nothing_for(0.5)
        finally:
            got.close()


def test_one_shard_or_a_key_range_streams_only_its_shards(mysql_server, db_name: str):
    with keyspace_of(mysql_server, db_name, 4) as c:
        ids = list(range(1, 201))
        c.enqueue("q", ids)
        shard_of = {i: s.name for i, s in zip(ids, c.keyspace.shards_of(ids), strict=True)}
        one = Collector(c.client, "q", shard="40-80")
        try:
            want = sorted(i for i in ids if shard_of[i] == "40-80")
            assert sorted(m.id for m in one.take(len(want), timeout_s=20)) == want
            one.nothing_for(0.5)
        finally:
            one.close()
        half = Collector(c.client, "q", key_range=(b"\x80", b""), max_in_flight=1000)
        try:
            want = sorted(i for i in ids if shard_of[i] in ("80-c0", "c0-"))
            assert sorted(m.id for m in half.take(len(want), timeout_s=20)) == want
            half.nothing_for(0.5)
        finally:
            half.close()
        with pytest.raises(InvalidArgument, match="key range 60- cuts shard 40-80"):
            c.client.subscribe("q", key_range=(b"\x60", b""), retry=False)


def test_list_tables_names_each_shard_and_a_verb_reaches_the_shard_of_each_id(
    mysql_server, db_name: str
):
    with keyspace_of(mysql_server, db_name, 2) as c:
        tables = c.client.list_tables()
        assert [(t.name, t.keyspace, t.shard) for t in tables] == [
            ("q", "app", "-80"),
            ("q", "app", "80-"),
        ]
        ids = list(range(1, 41))
        c.enqueue("q", ids)
        got = Collector(c.client, "q")
        try:
            got.take(40, timeout_s=20)
            assert c.client.reject("q", ids, reason="bad") == 40
        finally:
            got.close()
        dead, total = c.client.dead_letters("q")
        assert [d.id for d in dead] == ids and total == 40  # merged by id
        dead, _ = c.client.dead_letters("q", limit=5, after=10)
        assert [d.id for d in dead] == [11, 12, 13, 14, 15]
        assert c.client.redrive("q", ids=ids[:10]).moved == 10
        moved, after, batches = 0, None, 0
        while True:  # batches of 4 a shard, as msgtable redrive pages
            batch = c.client.redrive("q", limit=4, after=after)
            moved, after, batches = moved + batch.moved, batch.last, batches + 1
            if after is None:
                break
        assert moved == 30 and batches > 4
        assert c.client.dead_letters("q")[1] == 0


def test_a_shard_away_stops_only_its_own_messages_and_they_come_when_it_is_back(
    mysql_server, db_name: str
):
    with keyspace_of(mysql_server, db_name, 2) as c:
        got = Collector(c.client, "q")
        try:
            c.enqueue("q", list(range(1, 21)))
            first = got.take(20, timeout_s=20)
            c.client.ack("q", [m.id for m in first])
            away = c.shards["80-"]
            away.stop()
            ids = list(range(100, 200))
            c.enqueue("q", ids)
            shard_of = {i: s.name for i, s in zip(ids, c.keyspace.shards_of(ids), strict=True)}
            here = sorted(i for i in ids if shard_of[i] == "-80")
            assert sorted(m.id for m in got.take(len(here), timeout_s=20)) == here
            away.start()  # the same port: the gateway's stream to it opens again
            there = sorted(i for i in ids if shard_of[i] == "80-")
            assert sorted(m.id for m in got.take(len(there), timeout_s=30)) == there
        finally:
            got.close()


def test_a_misdescribed_keyspace_is_named_by_its_shard(mysql_server, db_name: str):
    with keyspace_of(mysql_server, db_name, 2, tables=("q",)) as c:
        c.shards["80-"].sql(current_layout_ddl("only_here", comment()))
        wait_until(
            lambda: any(t.name == "only_here" for t in c.shards["80-"].engine.list_tables()),
            timeout_s=10,
            what="the shard's server to find the table",
        )
        with pytest.raises(TableNotFound, match="shard -80 has no message table 'only_here'"):
            c.gateway.check()
        with pytest.raises(TableNotFound, match=r"shard -80 of keyspace 'app': .*only_here"):
            c.client.subscribe("only_here", retry=False)
        c.shards["-80"].stop()
        with pytest.raises(Unavailable, match="shard -80 of keyspace 'app'"):
            c.gateway.check()
    unreachable = Keyspace(
        "app",
        (
            Shard(KeyRange.parse("-80"), "x", ("127.0.0.1:1",)),
            Shard(KeyRange.parse("80-"), "y", ()),
        ),
    )
    with pytest.raises(InvalidArgument, match="shard 80- names no servers"):
        KeyspaceGateway(unreachable)


def test_an_id_that_has_no_shard_is_refused(mysql_server, db_name: str):
    with keyspace_of(mysql_server, db_name, 2) as c:
        with pytest.raises(InvalidArgument, match="id 'x' has no shard"):
            c.client.ack("q", ["x"])
        with pytest.raises(InvalidArgument, match="id -1 has no keyspace id"):
            c.client.ack("q", [-1])


def test_the_python_client_of_a_keyspace_reaches_the_shards_itself(mysql_server, db_name: str):
    with keyspace_of(mysql_server, db_name, 4) as c:
        ids = list(range(1, 201))
        shards = ShardedEnqueue(c.keyspace)
        try:
            with shards.begin() as tx:
                assert tx.enqueue_many("q", [{"id": i, "message": f"m{i}"} for i in ids]) == 200
            with pytest.raises(RuntimeError), shards.begin() as tx:
                tx.enqueue("q", {"id": 1000, "message": "rolled back"})
                raise RuntimeError("the application's own failure")
            with pytest.raises(InvalidArgument, match="id 'x' has no shard"), shards.begin() as tx:
                tx.enqueue("q", {"id": "x", "message": "no"})
        finally:
            shards.close()
        want = {s.name: set() for s in c.keyspace.shards}
        for shard, i in zip(c.keyspace.shards_of(ids), ids, strict=True):
            want[shard.name].add(i)
        stored = {
            name: {int(r[0]) for r in s.sql("SELECT id FROM q")} for name, s in c.shards.items()
        }
        assert stored == want  # each row in the shard of its id; the rolled-back one nowhere

        with KeyspaceClient(c.keyspace, timeout_s=3.0) as client:
            assert {t.shard for t in client.list_tables()} == set(RANGES[4])
            with client.subscribe("q", auto_renew=True) as sub:
                got = []
                for m in sub:
                    got.append(m)
                    m.ack()
                    if len(got) == 200:
                        break
            assert sorted(m.id for m in got) == ids
        wait_until(lambda: c.acked("q") == want, timeout_s=10, what="every ack in its shard")


def test_a_relayed_stream_keeps_its_projection_and_each_message_s_attempt(
    mysql_server, db_name: str
):
    with keyspace_of(mysql_server, db_name, 2) as c:
        ids = list(range(1, 21))
        c.enqueue("q", ids)
        got = Collector(c.client, "q", columns=["message"])
        try:
            first = got.take(20, timeout_s=20)
            assert {tuple(m.values) for m in first} == {("id", "message")}
            assert {m.values["message"] for m in first} == {f"m{i}" for i in ids}
            assert {m.attempt for m in first} == {1}
            assert c.client.release("q", ids) == 20  # each to its shard, due again at once
            again = got.take(20, timeout_s=20)
            assert sorted(m.id for m in again) == ids
            assert {m.attempt for m in again} == {2}  # sent_before came through the relay
        finally:
            got.close()


def test_a_message_in_a_shard_it_does_not_belong_to_is_acked_where_it_is(
    mysql_server, db_name: str, caplog
):
    caplog.set_level("WARNING", logger="msgtable.gateway.gateway")
    with keyspace_of(mysql_server, db_name, 2) as c:
        stray = next(i for i in range(1, 100) if c.keyspace.shard_of(i).name == "80-")
        c.shards["-80"].sql("INSERT INTO q (id, message) VALUES (:id, 'by hand')", id=stray)
        got = Collector(c.client, "q")
        try:
            (m,) = got.take(1, timeout_s=20)
            assert m.id == stray
            assert len(c.gateway.strays) == 1
            assert c.client.ack("q", [stray]) == 1  # to the shard that sent it
            assert c.acked("q") == {"-80": {stray}, "80-": set()}
            assert len(c.gateway.strays) == 0  # forgotten once acked
        finally:
            got.close()
        warned = [r.getMessage() for r in caplog.records if "belong" in r.getMessage()]
        assert len(warned) == 1 and "shard -80 of keyspace 'app' sent 1" in warned[0]


def test_the_asyncio_client_of_a_keyspace_reaches_the_shards_itself(mysql_server, db_name: str):
    with keyspace_of(mysql_server, db_name, 2) as c:
        ids = list(range(1, 51))
        c.enqueue("q", ids)

        async def consume() -> list[int]:
            got = []
            async with (
                AsyncKeyspaceClient(c.keyspace, timeout_s=3.0) as client,
                client.subscribe("q") as sub,
            ):
                async for m in sub:
                    got.append(m.id)
                    await m.ack()
                    if len(got) == len(ids):
                        break
            return got

        assert sorted(asyncio.run(asyncio.wait_for(consume(), 60))) == ids
        want = {s.name: set() for s in c.keyspace.shards}
        for shard, i in zip(c.keyspace.shards_of(ids), ids, strict=True):
            want[shard.name].add(i)
        wait_until(lambda: c.acked("q") == want, timeout_s=10, what="every ack in its shard")


def test_the_gateway_s_metrics_count_what_it_relayed_and_settled_by_shard(
    mysql_server, db_name: str
):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    with keyspace_of(mysql_server, db_name, 2) as c:
        c.gateway.metrics.watch(c.server.servicer.streams, lambda: len(c.gateway.strays))
        ids = list(range(1, 31))
        c.enqueue("q", ids)
        per_shard = {s.name: 0 for s in c.keyspace.shards}
        for s in c.keyspace.shards_of(ids):
            per_shard[s.name] += 1
        got = Collector(c.client, "q")
        try:
            messages = got.take(30, timeout_s=20)
            assert c.client.ack("q", [m.id for m in messages[:10]]) == 10
            acked = {s.name: 0 for s in c.keyspace.shards}
            for s in c.keyspace.shards_of([m.id for m in messages[:10]]):
                acked[s.name] += 1
            samples = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(
                    generate_latest(c.gateway.metrics.registry).decode()
                )
                for s in f.samples
            }
        finally:
            got.close()
        for shard, n in per_shard.items():
            key = ("msgtable_gateway_messages_relayed_total", (("shard", shard), ("table", "q")))
            assert samples[key] == n
        for shard, n in acked.items():
            if n:
                key = (
                    "msgtable_gateway_messages_settled_total",
                    (("method", "MessageAck"), ("shard", shard)),
                )
                assert samples[key] == n
        assert samples[("msgtable_gateway_streams", ())] == 1
        assert samples[("msgtable_gateway_strays", ())] == 0


def test_an_ack_settles_what_its_shards_answered_and_names_the_ids_of_a_shard_away(
    mysql_server, db_name: str
):
    with keyspace_of(mysql_server, db_name, 2) as c:
        ids = list(range(1, 41))
        c.enqueue("q", ids)
        got = Collector(c.client, "q")
        try:
            got.take(40, timeout_s=20)
        finally:
            got.close()
        shard_of = {i: s.name for i, s in zip(ids, c.keyspace.shards_of(ids), strict=True)}
        away = [i for i in ids if shard_of[i] == "80-"]
        c.shards["80-"].stop()
        with pytest.raises(PartlySettled) as raised:
            c.client.ack("q", ids)
        assert sorted(raised.value.unreached) == away
        assert raised.value.count == len(ids) - len(away)
        assert f"{len(away)} id(s) not settled" in str(raised.value)
        assert c.acked("q")["-80"] == {i for i in ids if shard_of[i] == "-80"}

        async def release() -> None:
            async with AsyncKeyspaceClient(c.keyspace, timeout_s=3.0) as client:
                await client.release("q", away)

        with pytest.raises(PartlySettled) as raised:  # the asyncio client says it alike
            asyncio.run(release())
        assert sorted(raised.value.unreached) == away and raised.value.count == 0


def test_a_key_lives_in_one_shard_and_its_messages_come_in_order_through_the_gateway(
    mysql_server, db_name: str
):
    with keyspace_of(mysql_server, db_name, 2) as c:
        keyed = "k varchar(64), index order_idx (k, time_acked, id)"
        ddl = current_layout_ddl("ordered", comment(vt_poller_interval=0.5, vt_order_key="k"))
        for s in c.shards.values():
            s.sql(ddl.replace("  primary key(id)", f"  {keyed},\n  primary key(id)"))
        wait_until(
            lambda: all(
                any(t.name == "ordered" for t in s.engine.list_tables()) for s in c.shards.values()
            ),
            timeout_s=10,
            what="both shards' servers to find the ordered table",
        )
        keys = [f"customer-{k}" for k in range(8)]
        assert {c.keyspace.shard_of_key(k).name for k in keys} == {"-80", "80-"}
        shards = ShardedEnqueue(c.keyspace)
        sent: dict[str, list[int]] = {k: [] for k in keys}
        try:
            at = 1
            with shards.begin() as tx:
                for n in range(10):  # each key's ids ascending, all in its shard
                    for k in keys:
                        i = c.keyspace.id_for(k, at)
                        at = i + 1
                        tx.enqueue("ordered", {"id": i, "message": f"{k}#{n}"}, order_key=k)
                        sent[k].append(i)
            wrong = next(i for i in range(1, 100) if c.keyspace.shard_of(i).name == "-80")
            key = next(k for k in keys if c.keyspace.shard_of_key(k).name == "80-")
            with (
                pytest.raises(InvalidArgument, match=r"lives in shard -80 and its key"),
                shards.begin() as tx,
            ):
                tx.enqueue("ordered", {"id": wrong, "message": "x"}, order_key=key)
        finally:
            shards.close()
        for k, ids in sent.items():
            home = c.shards[c.keyspace.shard_of_key(k).name]
            stored = [int(r[0]) for r in home.sql("SELECT id FROM ordered WHERE k = :k", k=k)]
            assert sorted(stored) == ids  # the whole key in its shard
        got = Collector(c.client, "ordered")
        seen: dict[str, list[int]] = {k: [] for k in keys}
        try:
            for m in got.take(80, timeout_s=30):
                seen[m.values["message"].split("#")[0]].append(m.id)
                m.ack()
        finally:
            got.close()
        assert seen == sent  # each key's messages in enqueue (id) order


def test_sharded_enqueue_into_one_shard_needs_no_other_shard(mysql_server, db_name: str):
    with keyspace_of(mysql_server, db_name, 2) as c:
        away = Shard(KeyRange.parse("-80"), "mysql+pymysql://u:p@127.0.0.1:1/gone", ())
        here = next(s for s in c.keyspace.shards if s.name == "80-")
        keyspace = Keyspace("app", (away, here))
        mine = [i for i in range(1, 60) if keyspace.shard_of(i).name == "80-"][:5]
        shards = ShardedEnqueue(keyspace, connect_args={"connect_timeout": 2})
        try:
            with shards.begin() as tx:  # shard -80's database does not answer at all
                assert tx.enqueue_many("q", [{"id": i, "message": "m"} for i in mine]) == 5
        finally:
            shards.close()
        assert sorted(int(r[0]) for r in c.shards["80-"].sql("SELECT id FROM q")) == mine


def test_a_keyspace_stream_with_a_limit_hands_out_no_more_and_strands_nothing(
    mysql_server, db_name: str
):
    with keyspace_of(mysql_server, db_name, 2) as c:
        ids = list(range(1, 41))
        c.enqueue("q", ids)
        first = Collector(c.client, "q", max_in_flight=5, max_messages=5, retry=False)
        try:
            taken = first.take(5, timeout_s=10)
            assert c.client.ack("q", [m.id for m in taken]) == 5
            first.nothing_for(1.0)  # its limit is spent, whatever the acks gave back
        finally:
            first.close()
        # what the shards sent past the limit was released: it comes to the next subscriber
        # at once, not after its ack wait (30 s)
        rest = Collector(c.client, "q")
        try:
            got = rest.take(35, timeout_s=10)
            assert sorted(m.id for m in got + taken) == ids
        finally:
            rest.close()


def test_list_tables_at_the_gateway_sums_the_shards_sqs_calls_and_names_no_sqs_api(
    mysql_server, db_name: str
):
    """Each shard's server serves the SQS API; calls at each are summed by action in the
    gateway's ListTables; its sqs_listen is "" (the gateway serves no SQS API: a queue is
    one shard's table, reached at that shard's server)."""
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    from msgtable.server.sqs.app import SqsServer

    with keyspace_of(mysql_server, db_name, 2) as c:
        apis = []
        try:
            for s in c.shards.values():
                assert s.engine is not None and s.server is not None
                api = SqsServer(s.engine, s.dsn, "127.0.0.1:0")
                api.open()
                apis.append(api)
                s.server.servicer.sqs = api
            for n, api in enumerate(apis, start=1):
                sqs = boto3.client(
                    "sqs",
                    endpoint_url=api.url,
                    region_name="eu-test-1",
                    aws_access_key_id="any",
                    aws_secret_access_key="anything-at-all",
                    config=Config(retries={"max_attempts": 1}),
                )
                url = sqs.get_queue_url(QueueName="q")["QueueUrl"]
                for _ in range(n):
                    sqs.send_message(QueueUrl=url, MessageBody="x")
            status = c.client.status()
            assert status.sqs_listen == "", status
            assert status.sqs_calls == {"GetQueueUrl": 2, "SendMessage": 3}, status
        finally:
            for s in c.shards.values():
                if s.server is not None:
                    s.server.servicer.sqs = None
            for api in apis:
                api.close()

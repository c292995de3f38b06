"""TLS, bearer tokens, client certificates and per-table ACLs over a real TLS channel, and the
per-client and per-table stream limits, against a real server."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from msgtable.client import Client
from msgtable.core.tables import current_layout_ddl
from msgtable.engine.placement import PLACEMENT_DDL
from msgtable.errors import PermissionDenied, ResourceExhausted, Unauthenticated, Unavailable
from msgtable.features.assembly import assemble_dsn
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc
from msgtable.server.auth import Authorizer
from msgtable.server.servicer import MessagingServer, TlsFiles

from ..waiting import wait_until
from .helpers import Collector, comment, serve

WORKER = "token-of-the-billing-worker"
OPS = "token-of-the-ops-dashboard"
AUTH = {
    "tokens": {WORKER: "billing", OPS: "ops"},
    "certificates": {"worker-1": "billing"},
    "allow": [
        {"principal": "billing", "tables": ["invoice_*"], "actions": ["subscribe", "ack"]},
        {"principal": "ops", "tables": ["*"], "actions": ["list"]},
        {"principal": "billing", "tables": ["invoice_in"], "actions": ["list"]},
    ],
}


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1, and a client certificate (CN worker-1)."""
    d = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.pem", "-days", "2", "-subj", "/CN=test-ca", cwd=d)  # fmt: skip
    (d / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, cn in (("server", "localhost"), ("client", "worker-1")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
                *(["-extfile", "san.cnf"] if name == "server" else []), cwd=d)  # fmt: skip
    return d


@contextmanager
def secured(dsn: str, pki: Path, **server_kwargs) -> Iterator[MessagingServer]:
    db = sa.create_engine(dsn, isolation_level="AUTOCOMMIT")
    with db.connect() as conn:
        for t in ("invoice_in", "invoice_out", "payroll"):
            conn.execute(sa.text(current_layout_ddl(t, comment(vt_poller_interval=0.2))))
        conn.execute(sa.text("insert into invoice_in(id, message) values (1, 'i'), (2, 'j')"))
        conn.execute(sa.text("insert into payroll(id, message) values (1, 'secret')"))
    db.dispose()
    engine = assemble_dsn(dsn, discovery_interval_s=0.5)
    engine.open()
    engine.refresh()
    server_kwargs.setdefault("authorizer", Authorizer.from_dict(AUTH))
    server_kwargs.setdefault(
        "tls", TlsFiles(str(pki / "server.pem"), str(pki / "server.key"), str(pki / "ca.pem"))
    )
    server = MessagingServer(engine, "127.0.0.1:0", **server_kwargs)
    server.start()
    try:
        yield server
    finally:
        server.stop(1.0)
        engine.close()


def client(server: MessagingServer, pki: Path, token: str | None = None, cert: bool = False):
    files = {"tls_cert": str(pki / "client.pem"), "tls_key": str(pki / "client.key")}
    return Client(
        server.address, token=token, tls_ca=str(pki / "ca.pem"), **(files if cert else {})
    )


def test_a_token_s_principal_may_do_what_the_rules_allow_and_nothing_else(db_dsn, pki):
    with secured(db_dsn, pki, tls=TlsFiles(str(pki / "server.pem"), str(pki / "server.key"))) as s:
        with client(s, pki, WORKER) as worker:
            c = Collector(worker, "invoice_in")
            got = c.take(2)
            assert worker.ack("invoice_in", [m.id for m in got]) == 2
            c.close()
            with pytest.raises(PermissionDenied, match=r"billing may not subscribe.*payroll"):
                next(iter(worker.subscribe("payroll")))
            with pytest.raises(PermissionDenied):
                worker.ack("payroll", [1])
            with pytest.raises(PermissionDenied):  # the same answer for a table that is not
                next(iter(worker.subscribe("nope")))
            assert [t.name for t in worker.list_tables()] == ["invoice_in"]
        with client(s, pki, OPS) as ops:
            assert [t.name for t in ops.list_tables()] == ["invoice_in", "invoice_out", "payroll"]
            with pytest.raises(PermissionDenied):
                ops.ack("invoice_in", [1])


def test_settlement_is_the_ack_action_and_redrive_its_own(db_dsn, pki):
    with secured(db_dsn, pki, tls=TlsFiles(str(pki / "server.pem"), str(pki / "server.key"))) as s:
        with client(s, pki, WORKER) as worker:
            assert worker.release("invoice_in", [1]) == 0  # allowed (never sent: not counted)
            assert worker.renew("invoice_in", [1]) == 0
            assert worker.reject("invoice_in", [2], reason="bad") == 1
            for call in (
                lambda: worker.release("payroll", [1]),
                lambda: worker.reject("payroll", [1]),
                lambda: worker.renew("payroll", [1]),
                lambda: worker.redrive("invoice_in"),
                lambda: worker.dead_letters("payroll"),
            ):
                with pytest.raises(PermissionDenied):
                    call()
            assert [d.id for d in worker.dead_letters("invoice_in")[0]] == [2]  # list
        with client(s, pki, OPS) as ops:
            with pytest.raises(PermissionDenied):
                ops.reject("invoice_in", [1])
            with pytest.raises(PermissionDenied, match="ops may not redrive"):
                ops.redrive("invoice_in")


def test_calls_without_valid_credentials_are_unauthenticated(db_dsn, pki):
    with secured(db_dsn, pki, tls=TlsFiles(str(pki / "server.pem"), str(pki / "server.key"))) as s:
        for token in (None, "not-a-token-of-this-server"):
            with client(s, pki, token) as anonymous:
                with pytest.raises(Unauthenticated):
                    anonymous.list_tables()
                with pytest.raises(Unauthenticated):
                    next(iter(anonymous.subscribe("invoice_in")))
                with pytest.raises(Unauthenticated):
                    anonymous.ack("invoice_in", [1])
        plaintext = Client(s.address, token=WORKER)  # no TLS: no connection
        with plaintext, pytest.raises(Unavailable):
            plaintext.list_tables()


def test_a_client_certificate_is_a_principal_with_mutual_tls(db_dsn, pki):
    with secured(db_dsn, pki) as s:  # the server requires client certificates
        with client(s, pki, cert=True) as worker:
            assert [t.name for t in worker.list_tables()] == ["invoice_in"]
            c = Collector(worker, "invoice_in")
            assert len(c.take(2)) == 2
            c.close()
        no_cert = client(s, pki, WORKER)  # a token, but no certificate: refused
        with no_cert, pytest.raises(Unavailable):
            no_cert.list_tables()


def test_streams_per_client_and_subscribers_per_table_are_bounded(db_dsn, pki):
    limits = {"max_streams_per_client": 2, "max_subscribers_per_table": 1}
    with (
        secured(db_dsn, pki, authorizer=None, tls=None, **limits) as s,
        Client(s.address) as c,
    ):
        first = Collector(c, "invoice_in")
        first.take(1)
        with pytest.raises(ResourceExhausted, match="invoice_in already has 1 subscribers"):
            next(iter(c.subscribe("invoice_in", retry=False)))
        second = Collector(c, "payroll")
        second.take(1)
        with pytest.raises(ResourceExhausted, match="already has 2 streams"):
            next(iter(c.subscribe("invoice_out", retry=False)))
        first.close()
        second.close()
        third = Collector(c, "invoice_out")  # the slots came back
        third.nothing_for(0.3)
        assert third.error is None
        third.close()


@pytest.mark.parametrize(
    ("secure", "warned"),
    [({}, "without TLS (--tls-cert/--tls-key) and authentication (--auth)"), (None, "")],
)
def test_listening_beyond_loopback_without_tls_and_auth_warns(db_dsn, pki, caplog, secure, warned):
    engine = assemble_dsn(db_dsn, discovery_interval_s=60)
    kwargs = {"authorizer": None, "tls": None} if secure is not None else {
        "authorizer": Authorizer.from_dict(AUTH),
        "tls": TlsFiles(str(pki / "server.pem"), str(pki / "server.key")),
    }  # fmt: skip
    server = MessagingServer(engine, "0.0.0.0:0", **kwargs)
    with caplog.at_level("WARNING", logger="msgtable.server.servicer"):
        server.start()
    server.stop(0)
    engine.close()
    messages = [r.getMessage() for r in caplog.records if "reachable" in r.getMessage()]
    if warned:
        assert len(messages) == 1 and warned in messages[0]
    else:
        assert messages == []


def placement_ddl_file() -> str:
    """The statement of schema/msgtable_placement.sql (its comment lines dropped)."""
    text = (Path(__file__).parents[2] / "schema" / "msgtable_placement.sql").read_text()
    lines = [line for line in text.splitlines() if not line.startswith("--")]
    return "\n".join(lines).strip().rstrip(";")


def test_the_schema_file_holds_the_placement_ddl_msgtable_runs():
    assert placement_ddl_file() == PLACEMENT_DDL


def test_the_documented_minimal_grants_are_enough_to_serve(db_dsn):
    """README, Database user: SELECT, UPDATE, DELETE on the database, INSERT on the placement
    table (created once by an administrator from schema/msgtable_placement.sql), and REPLICATION
    SLAVE, REPLICATION CLIENT for the binlog follower; nothing else."""
    url = sa.engine.make_url(db_dsn)
    user, password = f"mt_{url.database}"[-32:], "a-password-for-msgtable"
    admin = sa.create_engine(db_dsn, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"drop user if exists '{user}'@'%'"))
        conn.execute(sa.text(f"create user '{user}'@'%' identified by '{password}'"))
        conn.execute(sa.text(f"grant select, update, delete on `{url.database}`.* to '{user}'@'%'"))
        conn.execute(sa.text(placement_ddl_file()))
        conn.execute(
            sa.text(f"grant insert on `{url.database}`.msgtable_placement to '{user}'@'%'")
        )
        conn.execute(sa.text(f"grant replication slave, replication client on *.* to '{user}'@'%'"))
        conn.execute(
            sa.text(current_layout_ddl("jobs", comment(vt_poller_interval=0.2, vt_purge_after=0)))
        )
        conn.execute(sa.text("insert into jobs(id, message) values (1, 'a'), (2, 'b')"))
    restricted = url.set(username=user, password=password).render_as_string(hide_password=False)
    try:
        with serve(restricted, follow_binlog=True, lease_period_s=1.0) as s:
            wait_until(lambda: s.engine.leading, what="the lease")
            follower = s.engine.binlog
            assert follower is not None
            wait_until(follower.following.is_set, what="the binlog follower")
            c = Collector(s.client, "jobs")
            got = c.take(2)
            assert s.client.ack("jobs", [m.id for m in got]) == 2
            with admin.connect() as conn:
                conn.execute(sa.text("insert into jobs(id, message) values (3, 'c')"))
            assert c.take(1)[0].id == 3
            c.close()
            assert follower.disabled_because is None

            def purged() -> bool:
                with admin.connect() as conn:
                    return conn.execute(sa.text("select count(*) from jobs")).scalar() == 1

            wait_until(purged, timeout_s=15, what="the purge of the acked rows")
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"drop user if exists '{user}'@'%'"))
        admin.dispose()


def test_a_request_over_4_mib_is_resource_exhausted(db_dsn, pki):
    with (
        secured(db_dsn, pki, authorizer=None, tls=None) as s,
        grpc.insecure_channel(
            s.address, options=[("grpc.max_send_message_length", 16 * 1024 * 1024)]
        ) as channel,
    ):
        stub = pb_grpc.MessagingStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.MessageAck(pb.MessageAckRequest(name="x" * (5 * 1024 * 1024)), timeout=10)
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (
            stub.MessageAck(  # and it goes on serving
                pb.MessageAckRequest(name="invoice_in", ids=[pb.Value(int_value=99)]), timeout=10
            ).count
            == 0
        )


def test_subscriptions_are_named_table_slash_name_and_managing_them_is_its_own_action(db_dsn, pki):
    rules = {
        **AUTH,
        "allow": [
            *AUTH["allow"],
            {"principal": "ops", "tables": ["invoice_in/*"], "actions": ["manage"]},
            {"principal": "billing", "tables": ["payroll"], "actions": ["subscribe"]},
        ],
    }
    tls = TlsFiles(str(pki / "server.pem"), str(pki / "server.key"))
    with (
        secured(db_dsn, pki, tls=tls, authorizer=Authorizer.from_dict(rules)) as s,
        client(s, pki, OPS) as ops,
        client(s, pki, WORKER) as worker,
    ):
        with pytest.raises(PermissionDenied, match="may not manage"):
            worker.create_subscription("invoice_in", "mine")
        with pytest.raises(PermissionDenied):
            ops.create_subscription("payroll", "leak")  # manage on invoice_in/* only
        ops.create_subscription("invoice_in", "books")
        ops.create_subscription("invoice_in", "other")
        with worker.subscribe("invoice_in", subscription="books") as sub:  # invoice_*
            assert sub.field_names == ("id", "message")
        with pytest.raises(PermissionDenied):  # payroll alone does not reach payroll/x
            next(iter(worker.subscribe("payroll", subscription="x", retry=False)))
        listed = [(t.name, t.subscription) for t in ops.list_subscriptions()]
        assert listed == [("invoice_in", "books"), ("invoice_in", "other")]
        ops.drop_subscription("invoice_in", "other")


def test_a_gateway_reaches_a_shard_s_servers_over_mutual_tls_with_its_token(db_dsn, pki):
    from msgtable.core.keyspace import KeyRange, Keyspace, Shard
    from msgtable.gateway.gateway import GatewayServicer, KeyspaceGateway

    with secured(db_dsn, pki) as s:  # TLS with client certificates, and --auth
        database = sa.engine.make_url(db_dsn).database
        keyspace = Keyspace(database, (Shard(KeyRange(), db_dsn, (s.address,)),))
        files = {
            "tls_ca": str(pki / "ca.pem"),
            "tls_cert": str(pki / "client.pem"),
            "tls_key": str(pki / "client.key"),
        }
        gateway = KeyspaceGateway(keyspace, timeout_s=3.0, token=WORKER, **files)
        front = MessagingServer(gateway, "127.0.0.1:0", servicer=GatewayServicer)
        front.start()
        try:
            with Client(front.address) as c:
                got = Collector(c, "invoice_in")
                try:
                    assert sorted(m.id for m in got.take(2)) == [1, 2]
                    assert c.ack("invoice_in", [1, 2]) == 2
                finally:
                    got.close()
                with pytest.raises(PermissionDenied, match=r"shard - of keyspace .*billing"):
                    c.ack("payroll", [1])  # the token's rules hold through the gateway
        finally:
            front.stop(0.5)
            gateway.close()
        # without a client certificate the shard's server refuses the connection: named
        anonymous = KeyspaceGateway(keyspace, timeout_s=2.0, tls_ca=str(pki / "ca.pem"))
        try:
            with pytest.raises(Unavailable, match="shard - of keyspace"):
                anonymous.check()
        finally:
            anonymous.close()

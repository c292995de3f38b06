"""Hostile requests to a keyspace gateway of two real shards (hypothesis): streams of hostile
table names, shard names (unparsable, huge, unknown) and key ranges (random bytes, ranges that
cut a shard or hold none); acks and settlement verbs with ids that have no shard (text,
bytes, floats, negative, past 2**64, valueless) mixed with real ones; dead-letter listings,
redrives and subscription calls with hostile names and cursors. Each gets a clean status
(never INTERNAL or UNKNOWN) of bounded size, the gateway keeps serving, and the canary rows
on both shards stay as they were. And a keyspace file of hostile text is one line naming the
cause, never another exception."""

from __future__ import annotations

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc

from .test_fuzz import CLEAN, MAX_DETAILS, NASTY, values
from .test_gateway import keyspace_of

EXAMPLES = 1_500
CANARY = 1, 2, 3, 4  # enqueued in their shards, never acked by a hostile request

names = st.one_of(st.sampled_from(NASTY), st.text(max_size=40))
shard_names = st.one_of(
    st.sampled_from(["", "-", "0", "-80", "80-", "-40", "40-80", "8000-", "-8", "zz-", "80"]),
    st.sampled_from(["x" * 100_000, "-" * 5_000, "\x00", "ça-😀"]),
    st.text(max_size=12),
)
key_ranges = st.builds(
    lambda a, b: pb.KeyRange(start=a, end=b), st.binary(max_size=9), st.binary(max_size=9)
)
hostile_ids = st.lists(values, min_size=1, max_size=12).filter(
    lambda vs: (
        not any(
            v.WhichOneof("kind") in ("int_value", "uint_value")
            and 0 < (v.int_value or v.uint_value) <= 4
            for v in vs
        )
    )
)
requests = st.one_of(
    st.tuples(st.just("stream"), names, shard_names, st.one_of(st.none(), key_ranges)),
    st.tuples(
        st.just("stream_canary"), st.just("q"), shard_names, st.one_of(st.none(), key_ranges)
    ),
    st.tuples(st.just("ack"), st.sampled_from(["q", *NASTY[:6]]), hostile_ids),
    st.tuples(st.just("reject"), st.just("q"), hostile_ids),
    st.tuples(st.just("dead"), names, st.one_of(st.none(), values)),
    st.tuples(st.just("redrive"), names, hostile_ids),
    st.tuples(st.just("subs"), names, names),
)


def send(stub: pb_grpc.MessagingStub, request: tuple) -> tuple[grpc.StatusCode, str]:
    kind = request[0]
    try:
        if kind.startswith("stream"):
            _, name, shard, key_range = request
            r = pb.MessageStreamRequest(name=name, shard=shard, max_in_flight=1)
            if key_range is not None:
                r.key_range.CopyFrom(key_range)
            call = stub.MessageStream(r, timeout=20)
            try:
                next(call)
            finally:
                call.cancel()
        elif kind == "ack":
            stub.MessageAck(pb.MessageAckRequest(name=request[1], ids=request[2]), timeout=20)
        elif kind == "reject":
            stub.MessageReject(
                pb.MessageRejectRequest(name=request[1], ids=request[2], reason="fuzz"), timeout=20
            )
        elif kind == "dead":
            r = pb.ListDeadLettersRequest(name=request[1])
            if request[2] is not None:
                r.after.CopyFrom(request[2])
            stub.ListDeadLetters(r, timeout=20)
        elif kind == "redrive":
            stub.Redrive(pb.RedriveRequest(name=request[1], ids=request[2]), timeout=20)
        else:
            stub.CreateSubscription(
                pb.CreateSubscriptionRequest(table=request[1], name=request[2]), timeout=20
            )
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""


def test_hostile_requests_to_a_gateway_get_clean_bounded_statuses(mysql_server, db_name):
    with keyspace_of(mysql_server, db_name, 2) as c:
        c.enqueue("q", list(CANARY))

        def canary() -> dict[str, list[tuple[object, ...]]]:
            return {
                n: s.sql("SELECT id, epoch, time_acked, message FROM q ORDER BY id")
                for n, s in c.shards.items()
            }

        before = canary()
        assert sum(len(rows) for rows in before.values()) == len(CANARY)
        seen: dict[str, int] = {}
        with grpc.insecure_channel(
            c.server.address, options=[("grpc.max_send_message_length", 8 * 1024 * 1024)]
        ) as channel:
            stub = pb_grpc.MessagingStub(channel)

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(requests)
            def hostile(request: tuple) -> None:
                code, details = send(stub, request)
                seen[code.name] = seen.get(code.name, 0) + 1
                assert code in CLEAN or code is grpc.StatusCode.OK, (request[0], code, details)
                assert len(details) <= MAX_DETAILS, (request[0], len(details))

            hostile()
        print(f"gateway fuzz: statuses {dict(sorted(seen.items()))}")
        assert sum(seen.values()) >= EXAMPLES
        assert seen.get("INVALID_ARGUMENT", 0) > 0 and seen.get("OK", 0) > 0, seen

        # still serving, and every canary where it was, not acked, not dead, its message
        # intact (its epoch counts the sends to the canary streams, which are legitimate)
        def kept(rows: dict[str, list[tuple[object, ...]]]) -> dict[str, list[tuple[object, ...]]]:
            return {n: [(r[0], r[2], r[3]) for r in shard] for n, shard in rows.items()}

        assert kept(canary()) == kept(before)
        assert {t.shard for t in c.client.list_tables() if not t.subscription} == {"-80", "80-"}

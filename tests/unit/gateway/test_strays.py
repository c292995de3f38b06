"""msgtable.gateway.strays: the gateway's memory of messages a shard sent that are not its own."""

from __future__ import annotations

import pytest

from msgtable.core import codec
from msgtable.core.keyspace import KeyRange, Keyspace, Shard
from msgtable.errors import InvalidArgument
from msgtable.gateway.strays import Strays
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

KS = Keyspace("app", (Shard(KeyRange.parse("-80"), "a"), Shard(KeyRange.parse("80-"), "b")))


def batch(*ids: object) -> pb.MessageStreamResponse:
    response = pb.MessageStreamResponse()
    for i in ids:
        response.rows.add().values.append(codec.encode_value(i))
    return response


def own(shard: str, n: int) -> list[int]:
    return [i for i in range(1, 200) if KS.shard_of(i).name == shard][:n]


def test_a_shard_s_own_messages_are_not_remembered_and_go_by_their_hash():
    s = Strays(KS)
    ids = own("-80", 3)
    s.check("q", "", "-80", batch(*ids))
    assert len(s) == 0
    assert s.shards("q", "", ids + own("80-", 1), settled=True) == ["-80"] * 3 + ["80-"]


def test_a_stray_goes_back_to_its_sender_until_it_is_acked():
    s = Strays(KS)
    (stray,) = own("80-", 1)
    s.check("q", "", "-80", batch(stray, *own("-80", 2)))
    assert len(s) == 1
    assert s.shards("q", "", [stray], settled=False) == ["-80"]  # a release: still known
    assert s.shards("q", "other", [stray], settled=False) == ["80-"]  # another group's
    assert s.shards("q", "", [stray], settled=True) == ["-80"]  # an ack: then forgotten
    assert s.shards("q", "", [stray], settled=False) == ["80-"]


def test_ids_without_a_keyspace_id_go_to_the_shard_that_sent_them():
    s = Strays(KS)
    s.check("q", "", "80-", batch("order-7", "order-8"))
    assert s.shards("q", "", ["order-8", "order-7"], settled=False) == ["80-", "80-"]
    with pytest.raises(InvalidArgument, match="id 'order-9' has no shard"):
        s.shards("q", "", ["order-9"], settled=False)


def test_at_most_so_many_strays_are_remembered_the_oldest_forgotten_first():
    s = Strays(KS, most=2)
    strays = own("80-", 3)
    for i in strays:
        s.check("q", "", "-80", batch(i))
    assert len(s) == 2
    assert s.shards("q", "", strays, settled=False) == ["80-", "-80", "-80"]

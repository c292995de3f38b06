"""A server of one shard of a keyspace (msgtable serve --keyspace FILE --shard NAME): the
keyspace's name, its shard, and what it answers to a request for another shard."""

from __future__ import annotations

import random

import pytest

from msgtable.core.clock import FakeClock
from msgtable.core.keyspace import KeyRange
from msgtable.engine.engine import MessageEngine
from msgtable.errors import InvalidArgument, TableNotFound
from msgtable.testing import InMemoryStore


def shard_engine(shard: str | None) -> MessageEngine:
    store = InMemoryStore()
    store.create_table("q")
    e = MessageEngine(
        store,
        clock=FakeClock(),
        rng=random.Random(1),
        discovery_interval_s=3600,
        run_loops=False,
        keyspace="app" if shard is not None else None,
        shard=KeyRange.parse(shard) if shard is not None else None,
    )
    e.refresh()
    return e


def test_a_shard_s_server_names_its_keyspace_and_shard_in_its_tables():
    e = shard_engine("-80")
    try:
        (q,) = e.list_tables()
        assert (q.keyspace, q.shard) == ("app", "-80")
    finally:
        e.close()


def test_an_unsharded_server_names_its_database_and_no_shard():
    e = shard_engine(None)
    try:
        (q,) = e.list_tables()
        assert (q.keyspace, q.shard) == (e.store.database, "")
    finally:
        e.close()


@pytest.mark.parametrize(
    "shard, key_range",
    [
        ("-80", (b"", b"")),
        ("", (b"", b"")),
        ("-8000", (b"", b"")),  # the same bound, written longer
        ("", (b"", b"\x80")),
        ("", (b"", b"\xc0")),  # a range that holds the whole shard
    ],
)
def test_a_shard_s_server_streams_its_own_shard(shard: str, key_range: tuple[bytes, bytes]):
    e = shard_engine("-80")
    try:
        sub = e.subscribe("q", "app", shard, key_range, 10)
        sub.close()
    finally:
        e.close()


@pytest.mark.parametrize(
    "keyspace, shard, key_range, error, why",
    [
        ("other", "", (b"", b""), TableNotFound, "keyspace 'other' not found: .* 'app'"),
        ("app", "80-", (b"", b""), InvalidArgument, "this server sends shard -80 of keyspace"),
        ("app", "x", (b"", b""), InvalidArgument, "key range 'x'"),
        ("app", "", (b"\x80", b""), InvalidArgument, "key range 80- does not hold shard -80"),
        ("app", "", (b"", b"\x40"), InvalidArgument, "key range -40 does not hold shard -80"),
    ],
)
def test_a_request_for_another_shard_is_refused_naming_this_one(
    keyspace: str,
    shard: str,
    key_range: tuple[bytes, bytes],
    error: type[Exception],
    why: str,
):
    e = shard_engine("-80")
    try:
        with pytest.raises(error, match=why):
            e.subscribe("q", keyspace, shard, key_range, 10)
    finally:
        e.close()

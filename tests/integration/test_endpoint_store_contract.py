"""The EndpointStore contract: every case runs on the in-memory endpoints
(msgtable.testing.endpoints, InMemoryStore's endpoint_store) and on MySQL's
(msgtable.store.endpoints.EndpointSQL, MySQLStore's). A case failing on one side is a drift:
fix the fake, never the case."""

from __future__ import annotations

import pytest

from msgtable.core.endpoints import Endpoint
from msgtable.errors import Unavailable
from msgtable.store.protocol import EndpointStore, Store

from .contract_tables import (
    Tables,
    both_stores,  # noqa: F401 (the tables fixture)
)

NOW = 1_700_000_000 * 10**9


def endpoints_of(store: Store) -> EndpointStore:
    endpoints = store.endpoint_store
    assert endpoints is not None, "the store offers no push endpoints"
    return endpoints


def test_a_database_without_endpoints_has_none_and_drops_none(tables: Tables):
    store = endpoints_of(tables.store)
    assert store.endpoints() == []
    assert store.drop_endpoint("q", "") == 0


def test_endpoints_are_listed_by_table_then_subscription_with_every_field(tables: Tables):
    store = endpoints_of(tables.store)
    b = Endpoint("b", "", "https://b.example/hook", "whsec_c2VjcmV0", 8, 2.5)
    a_sub = Endpoint("a", "s", "http://127.0.0.1:9/x", "s3cr\u00e9t")
    a = Endpoint("a", "", "https://a.example/", "plain secret", 1, 300.0)
    for ep in (b, a_sub, a):
        store.set_endpoint(ep, NOW)
    assert store.endpoints() == [a, a_sub, b]


def test_a_new_definition_replaces_the_old_one(tables: Tables):
    store = endpoints_of(tables.store)
    store.set_endpoint(Endpoint("q", "", "https://old.example/", "one"), NOW)
    new = Endpoint("q", "", "https://new.example/", "two", 3, 7.0)
    store.set_endpoint(new, NOW + 1)
    assert store.endpoints() == [new]


def test_a_drop_removes_only_its_own_definition(tables: Tables):
    store = endpoints_of(tables.store)
    default = Endpoint("q", "", "https://a.example/", "x")
    sub = Endpoint("q", "s", "https://b.example/", "y")
    store.set_endpoint(default, NOW)
    store.set_endpoint(sub, NOW)
    assert store.drop_endpoint("q", "") == 1
    assert store.drop_endpoint("q", "") == 0
    assert store.drop_endpoint("other", "s") == 0
    assert store.endpoints() == [sub]


def test_a_database_that_does_not_answer_is_unavailable(tables: Tables):
    down = tables.unreachable()
    try:
        with pytest.raises(Unavailable):
            endpoints_of(down).endpoints()
    finally:
        down.close()

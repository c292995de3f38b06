"""The bench's database reports its durability (bench.database.durability): `--durable`
figures say they were measured with every commit flushed."""

from __future__ import annotations

import pytest

from bench.database import durability
from msgtable.testing import ServerHandle
from msgtable.testing.devdb import LocalServer


def test_a_durable_server_is_reported_durable(own_durable_server: LocalServer) -> None:
    assert durability(own_durable_server) == (
        True,
        "durable: innodb_flush_log_at_trx_commit=1, sync_binlog=1",
    )


def test_the_throwaway_server_is_reported_not_durable(mysql_server: ServerHandle) -> None:
    if not isinstance(mysql_server, LocalServer):
        pytest.skip("the session's server is not the throwaway one (MSGTABLE_TEST_DSN)")
    durable, text = durability(mysql_server)
    assert not durable
    assert text.startswith("not durable: innodb_flush_log_at_trx_commit=")

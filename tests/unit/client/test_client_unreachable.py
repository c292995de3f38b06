"""A client made with ``wait_for_server=False`` (the command line's) fails a unary call at once
when no server can be connected to, over real sockets: nothing listens at the address."""

from __future__ import annotations

import logging
import time

import pytest

from msgtable.client import Client
from msgtable.errors import ServerUnreachable
from msgtable.testing.devdb import free_port

WAITED_S = 1.0  # the client's time-out: what a client that waits spends retrying


def nowhere() -> str:
    return f"127.0.0.1:{free_port()}"


def test_a_client_that_does_not_wait_tries_each_server_once():
    targets = f"{nowhere()},{nowhere()}"
    with Client(targets, timeout_s=30, wait_for_server=False) as client:
        began = time.monotonic()
        with pytest.raises(ServerUnreachable, match="cannot reach the msgtable server at"):
            client.list_tables()
        took_s = time.monotonic() - began
    assert took_s < 5, f"retried for {took_s:.1f}s"


def test_a_client_waits_for_a_server_within_its_time_out_by_default(caplog):
    # it retries (its retry helper says so once), rather than failing at the first refusal;
    # counted, not timed: on a loaded machine the time-out's share left for a retry varies
    caplog.set_level(logging.INFO, logger="msgtable.client")
    with Client(nowhere(), timeout_s=WAITED_S) as client, pytest.raises(ServerUnreachable):
        client.list_tables()
    retries = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
    assert retries, "the client gave up at the first refusal, without retrying"

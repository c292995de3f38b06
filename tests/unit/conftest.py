"""Fixtures shared by the unit tests of the servicer and the client: a FakeEngine behind a
real gRPC server on a free loopback port (modules with an ``engine`` of their own, such as
test_manager's, override these)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from msgtable.server.servicer import MessagingServer
from tests.unit.server.test_server import FakeEngine


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def server(engine: FakeEngine) -> Iterator[MessagingServer]:
    s = MessagingServer(engine, "127.0.0.1:0", max_workers=16, stream_poll_s=0.05)
    s.start()
    yield s
    s.stop(0)

"""One endpoint's pusher against a fake engine and a real receiver on loopback: what each
answer makes it call (ack, release with which delay, reject with which reason)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from msgtable.core.backoff import backoff_s, draw_jitter
from msgtable.core.rows import Batch
from msgtable.core.tables import DEMO_COMMENT, TableConfig, load_table
from msgtable.core.window import Window
from msgtable.engine.subscriber import Subscriber
from msgtable.features.push.allow import AllowList
from msgtable.features.push.endpoints import Endpoint
from msgtable.features.push.pusher import Pusher
from msgtable.testing.memory import CURRENT_COLUMNS
from tests.push_receiver import Receiver
from tests.waiting import wait_until

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
CONFIG = load_table(
    "jobs",
    DEMO_COMMENT + ",vt_min_backoff=1,vt_max_backoff=60",
    CURRENT_COLUMNS,
    [("id",)],
    [],
)


class FakeEngine:
    """What a pusher calls, recorded; one subscriber the test feeds."""

    keyspace = "db"
    leading = True

    def sends(self, table: str) -> bool:
        return self.leading

    def __init__(self, config: TableConfig) -> None:
        self.sub = Subscriber(config.message_columns, Window(10_000), lambda _: None, self._closed)
        self.calls: list[tuple[Any, ...]] = []
        self.closed = False

    def _closed(self, sub: Subscriber, unsent: list[Batch]) -> None:
        self.closed = True

    def subscribe(self, name: str, **kwargs: Any) -> Subscriber:
        return self.sub

    def ack(self, name: str, keyspace: str, ids: Any, subscription: str = "") -> int:
        self.calls.append(("ack", list(ids)))
        return len(ids)

    def release(self, name: str, keyspace: str, ids: Any, delay_s: float, reason: Any,
                subscription: str = "") -> int:  # fmt: skip
        self.calls.append(("release", list(ids), delay_s, reason))
        return len(ids)

    def reject(
        self, name: str, keyspace: str, ids: Any, reason: Any, subscription: str = ""
    ) -> int:
        self.calls.append(("reject", list(ids), reason))
        return len(ids)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET).start()
    yield r
    r.stop()


def pusher(engine: FakeEngine, receiver: Receiver, seed: int = 7) -> Pusher:
    ep = Endpoint("jobs", "", receiver.url(), SECRET, max_in_flight=1, timeout_s=2)
    p = Pusher(
        engine,  # type: ignore[arg-type]
        ep,
        lambda: CONFIG,
        AllowList.parse("http://127.0.0.0/8"),
        rng=random.Random(seed),
    )
    p.open()
    return p


def test_a_2xx_acks_the_batch(receiver: Receiver) -> None:
    engine = FakeEngine(CONFIG)
    p = pusher(engine, receiver)
    try:
        engine.sub.put(Batch([(1, "a"), (2, "b")]))
        wait_until(lambda: engine.calls, what="a settlement")
        assert engine.calls == [("ack", [1, 2])]
        assert receiver.ids() == [1, 2]
        assert p.status().pushed == 2 and p.status().state == "pushing"
    finally:
        p.close()
    assert engine.closed  # its subscriber went with it


def test_a_5xx_releases_each_attempt_with_its_own_backoff(receiver: Receiver) -> None:
    engine = FakeEngine(CONFIG)
    receiver.answer(503, body=b"busy")
    p = pusher(engine, receiver, seed=7)
    try:
        # ids 1 and 3 sent once before (attempt 2), id 2 three times (attempt 4)
        engine.sub.put(Batch([(1, "a"), (2, "b"), (3, "c")], [1, 3, 1]))
        wait_until(lambda: len(engine.calls) == 2, what="two releases")
    finally:
        p.close()
    rng = random.Random(7)
    first = backoff_s(1, 1.0, 60.0, draw_jitter(rng))
    second = backoff_s(3, 1.0, 60.0, draw_jitter(rng))
    assert engine.calls == [
        ("release", [1, 3], pytest.approx(first), "HTTP 503: busy"),
        ("release", [2], pytest.approx(second), "HTTP 503: busy"),
    ]
    assert p.status().failed == 3


def test_retry_after_is_the_delay_and_a_4xx_is_a_reject(receiver: Receiver) -> None:
    engine = FakeEngine(CONFIG)
    receiver.answer(429, retry_after="17")
    p = pusher(engine, receiver)
    try:
        engine.sub.put(Batch([(1, "a")]))
        wait_until(lambda: engine.calls, what="a release")
        receiver.answer(404, body=b"no such hook")
        engine.sub.put(Batch([(2, "b")]))
        wait_until(lambda: len(engine.calls) == 2, what="a reject")
    finally:
        p.close()
    assert engine.calls == [
        ("release", [1], 17.0, "HTTP 429"),
        ("reject", [2], "HTTP 404: no such hook"),
    ]


def test_a_url_outside_the_allow_list_never_subscribes(receiver: Receiver) -> None:
    engine = FakeEngine(CONFIG)
    ep = Endpoint("jobs", "", receiver.url(), SECRET)
    p = Pusher(engine, ep, lambda: CONFIG, AllowList.parse("https://*.example.com"))  # type: ignore[arg-type]
    p.open()
    try:
        engine.sub.put(Batch([(1, "a")]))
        assert p.status().state.startswith("not allowed: http://127.0.0.1:")
        assert engine.sub.next_batch(0.3) == [(1, "a")]  # nobody took it
    finally:
        p.close()
    assert engine.calls == [] and receiver.requests == 0

"""A thin sync face over the asyncio client (msgtable.aio), its event loop on a thread, so
the sync client's behaviour tests (and tests/integration/helpers.Collector) run unchanged
against it: ``SyncAio(target)`` answers subscribe / ack / release / reject / renew /
list_tables as msgtable.client.Client does, each by running the aio coroutine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from msgtable import aio

T = TypeVar("T")


class SyncAio:
    """msgtable.aio.Client behind the sync client's calls."""

    def __init__(self, target: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.aio = aio.Client(target, **kwargs)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def leader(self) -> str:
        return self.aio.leader

    def subscribe(self, name: str, **kwargs: Any) -> SyncSubscriber:
        sub = self.aio.subscribe(name, **kwargs)
        self.call(sub.open())
        return SyncSubscriber(self, sub)

    def ack(self, name: str, ids: Any, **kwargs: Any) -> int:
        return self.call(self.aio.ack(name, ids, **kwargs))

    def release(self, name: str, ids: Any, **kwargs: Any) -> int:
        return self.call(self.aio.release(name, ids, **kwargs))

    def reject(self, name: str, ids: Any, **kwargs: Any) -> int:
        return self.call(self.aio.reject(name, ids, **kwargs))

    def renew(self, name: str, ids: Any, **kwargs: Any) -> int:
        return self.call(self.aio.renew(name, ids, **kwargs))

    def list_tables(self) -> Any:
        return self.call(self.aio.list_tables())

    def dead_letters(self, name: str, **kwargs: Any) -> Any:
        return self.call(self.aio.dead_letters(name, **kwargs))

    def __getattr__(self, name: str) -> Any:
        """Any other call of the aio client (create_subscription, redrive, status, ...)."""
        method = getattr(self.aio, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            return self.call(method(*args, **kwargs))

        return run

    def close(self) -> None:
        if not self._loop.is_closed():
            self.call(self.aio.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()

    def __enter__(self) -> SyncAio:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncMessage:
    """An aio Message with the sync Message's calls."""

    def __init__(self, face: SyncAio, message: aio.Message, subscriber: SyncSubscriber) -> None:
        self._face, self.message = face, message
        self._subscriber = subscriber  # as the sync Message's (tests/integration/test_ordering)
        self.id, self.row, self.values = message.id, message.row, message.values
        self.attempt, self.sent_ns = message.attempt, message.sent_ns

    def ack(self) -> int:
        return self._face.call(self.message.ack())

    def release(self, delay_s: float = 0.0, reason: str | None = None) -> int:
        return self._face.call(self.message.release(delay_s, reason))

    def reject(self, reason: str | None = None) -> int:
        return self._face.call(self.message.reject(reason))

    def renew(self, extend_s: float = 0.0, reason: str | None = None) -> int:
        return self._face.call(self.message.renew(extend_s, reason))


class SyncSubscriber:
    """An aio Subscriber with the sync Subscriber's calls."""

    def __init__(self, face: SyncAio, sub: aio.Subscriber) -> None:
        self._face, self.sub = face, sub

    @property
    def target(self) -> str:
        return self.sub.target

    @property
    def reconnects(self) -> int:
        return self.sub.reconnects

    @property
    def field_names(self) -> tuple[str, ...]:
        return self.sub.field_names

    @property
    def fields(self) -> Any:
        return self.sub.fields

    def next_batch(self) -> list[SyncMessage]:
        return [SyncMessage(self._face, m, self) for m in self._face.call(self.sub.next_batch())]

    def batches(self) -> Iterator[list[SyncMessage]]:
        while batch := self.next_batch():
            yield batch

    def __iter__(self) -> Iterator[SyncMessage]:
        while True:  # the aio Subscriber's own iteration (its pending rest of a batch)
            try:
                message = self._face.call(self.sub.__anext__())
            except StopAsyncIteration:
                return
            yield SyncMessage(self._face, message, self)

    def _unwrap(self, messages: Iterable[SyncMessage]) -> list[aio.Message]:
        return [m.message for m in messages]

    def ack(self, messages: Iterable[SyncMessage]) -> int:
        return self._face.call(self.sub.ack(self._unwrap(messages)))

    def release(
        self, messages: Iterable[SyncMessage], delay_s: float = 0.0, reason: str | None = None
    ) -> int:
        return self._face.call(self.sub.release(self._unwrap(messages), delay_s, reason))

    def reject(self, messages: Iterable[SyncMessage], reason: str | None = None) -> int:
        return self._face.call(self.sub.reject(self._unwrap(messages), reason))

    def renew(
        self, messages: Iterable[SyncMessage], extend_s: float = 0.0, reason: str | None = None
    ) -> int:
        return self._face.call(self.sub.renew(self._unwrap(messages), extend_s, reason))

    def close(self) -> None:
        self._face.call(self.sub.close())

    def __enter__(self) -> SyncSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

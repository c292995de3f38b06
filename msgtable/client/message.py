"""One message a subscriber received: its values, and its settlement (ack, release, reject,
renew)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

from msgtable.client import effects
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb


class Named(Protocol):
    """What a message's data needs of its subscriber (both clients')."""

    name: str
    subscription: str  # "": the table's default group
    field_names: tuple[str, ...]


class Receiver(Named, Protocol):
    """What a message needs of the subscriber that received it (msgtable.client.subscriber)."""

    def ack(self, messages: Iterable[Message]) -> int: ...

    def release(
        self, messages: Iterable[Message], delay_s: float = 0.0, reason: str | None = None
    ) -> int: ...

    def reject(self, messages: Iterable[Message], reason: str | None = None) -> int: ...

    def renew(
        self, messages: Iterable[Message], extend_s: float = 0.0, reason: str | None = None
    ) -> int: ...


S = TypeVar("S", bound=Named)  # the subscriber class of a client


class Received(Generic[S]):
    """A received message's data, the same in both clients: its row, id, attempt and send
    time. Each client's Message adds the settlement calls (sync here, coroutines in
    msgtable.aio), on its subscriber ``S``."""

    __slots__ = ("_id_value", "_subscriber", "_values", "attempt", "row", "sent_ns")

    def __init__(
        self,
        subscriber: S,
        row: tuple[object, ...],
        id_value: pb.Value,
        attempt: int = 1,
        sent_ns: int = 0,
    ) -> None:
        self.row = row  # values in the order of subscriber.fields, id first
        # Which delivery of the message this is: 1 the first, n the n-th (from its epoch: how
        # many times it was sent before, plus one). An older server says nothing: 1.
        self.attempt = attempt
        self.sent_ns = sent_ns  # when the server sent it, unix ns (0: the server did not say)
        self._subscriber = subscriber
        self._id_value = id_value  # the id as it came, to ack it as it came
        self._values: dict[str, object] | None = None

    @property
    def id(self) -> object:
        return self.row[0]

    @property
    def id_value(self) -> pb.Value:
        """The id as the server sent it (what an ack sends back)."""
        return self._id_value

    @property
    def table(self) -> str:
        """The table whose row this message is: its table's, or for a subscription its state
        table (where an ack by DML goes; msgtable.client.effects)."""
        return effects.row_table(self._subscriber.name, self._subscriber.subscription)

    @property
    def message_table(self) -> str:
        """The message table it came from (for a subscription: not its state table)."""
        return self._subscriber.name

    @property
    def subscription(self) -> str:
        """The subscription it was delivered to ("": the table's default group)."""
        return self._subscriber.subscription

    @property
    def values(self) -> dict[str, object]:
        """Column name -> value, id included."""
        if self._values is None:
            self._values = dict(zip(self._subscriber.field_names, self.row, strict=True))
        return self._values

    def __repr__(self) -> str:
        return f"Message({self._subscriber.name}, {self.values!r})"


class Message(Received[Receiver]):
    """One message received by a subscriber."""

    __slots__ = ()

    def ack(self) -> int:
        """Acknowledge this message; returns 1 if this call acked it, 0 if it was already."""
        return self._subscriber.ack([self])

    def release(self, delay_s: float = 0.0, reason: str | None = None) -> int:
        """Not now: due again ``delay_s`` from now (0: at once), to any subscriber; this
        delivery counts as an attempt. Returns 1 if released, 0 if it was not (acked, dead)."""
        return self._subscriber.release([self], delay_s, reason)

    def reject(self, reason: str | None = None) -> int:
        """Never: dead now (moved to the table's dead-letter table, or dead in place), with
        ``reason`` as its last error. Returns 1 if rejected, 0 if it was acked or dead."""
        return self._subscriber.reject([self], reason)

    def renew(self, extend_s: float = 0.0, reason: str | None = None) -> int:
        """Still working: not sent again before ``extend_s`` from now (0: the table's ack
        wait). Returns 1 if renewed, 0 if not (acked, dead, or due again already)."""
        return self._subscriber.renew([self], extend_s, reason)

    def in_transaction(self, engine: Any, handler: Callable[[Any], object]) -> bool:
        """Run ``handler(conn)`` and this message's ack in one transaction of ``engine`` (the
        application's SQLAlchemy Engine): their writes commit together or not at all, so the
        effect happens once (msgtable.client.effects). Returns False, without running the
        handler, when an earlier delivery's transaction already acked it (or it is dead)."""
        return effects.run(self, engine, handler)

    def in_session(self, sessions: Any, handler: Callable[[Any], object]) -> bool:
        """:meth:`in_transaction` with a SQLAlchemy ``sessionmaker``: ``handler(session)``."""
        return effects.run_in_session(self, sessions, handler)

"""A subscriber's window: how many of the messages sent to it may be in flight at once.

A subscriber (one MessageStream) has at most its window (``max_in_flight``) of the messages
sent to it in flight at once: it is sent a batch only while the window has room, and the batch
is cut to that room. Without a window, gRPC's stream buffers let a busy server push tens
of thousands of messages to a subscriber ahead of its acks: each waits longer for its ack (so
more postpones are written), and a stalled or crashed subscriber strands them all until their
ack wait ends while other subscribers idle.

A message gives its credit back when it leaves flight: acked through this server, its ack wait
over, due again, or found acked or deleted by another client (the binlog shows it at once).
Without the binlog an ack by DML is not seen, so a window that has been full for
``RECHECK_S`` with no credit back asks the database which of its messages are still unacked
(:meth:`Window.recheck_due`); msgtable.engine.inflight knows which messages each window holds.

A stream may also ask for a limit (``max_messages``): the most messages it is sent in all. Its
window then has no room once it was sent that many, whatever credit comes back: a client that
takes N messages, acks them and leaves is sent no more in between (its acks would otherwise
give the window room again before its stream's end reached the server).
"""

from __future__ import annotations

from collections.abc import Callable

from msgtable.errors import InvalidArgument
from msgtable.limits import DEFAULT_MAX_IN_FLIGHT, MAX_IN_FLIGHT, MAX_MESSAGES

RECHECK_S = 1.0
RECHECK_NS = round(RECHECK_S * 1e9)


def check_limit(max_messages: int) -> int:
    """The limit a MessageStream asks for (0: none), checked."""
    if not 0 <= max_messages <= MAX_MESSAGES:
        raise InvalidArgument(
            f"max_messages must be between 0 (no limit) and {MAX_MESSAGES}, not {max_messages}"
        )
    return max_messages


def window_size(max_in_flight: int) -> int:
    """The window a MessageStream asks for (0: the default), checked."""
    if not 0 <= max_in_flight <= MAX_IN_FLIGHT:
        raise InvalidArgument(
            f"max_in_flight must be between 0 (the default, {DEFAULT_MAX_IN_FLIGHT}) and "
            f"{MAX_IN_FLIGHT}, not {max_in_flight}"
        )
    return max_in_flight or DEFAULT_MAX_IN_FLIGHT


class Window:
    """One subscriber's flow control (see the module docstring). Not thread-safe: the table's
    manager guards it with its lock. ``on_open`` runs when a full window gets room again (the
    sender may have a batch for it)."""

    __slots__ = ("_on_open", "left", "outstanding", "size", "stalled_ns")

    def __init__(
        self, size: int, on_open: Callable[[], object] = lambda: None, limit: int = 0
    ) -> None:
        self.size = size
        self.outstanding = 0  # messages sent to it and in flight
        self.left = limit or None  # messages it may still be sent in all (None: no limit)
        self.stalled_ns: int | None = None  # full since, with no credit back (None: not)
        self._on_open = on_open

    @property
    def room(self) -> int:
        """How many messages it may be sent now: a batch is cut to this."""
        room = self.size - self.outstanding
        if self.left is not None and self.left < room:
            room = self.left
        return max(0, room)

    def take(self, n: int) -> None:
        """``n`` messages were sent to it."""
        self.outstanding += n
        if self.left is not None:
            self.left -= n

    def give_back(self, n: int = 1) -> None:
        """``n`` of its messages left flight: their credit comes back."""
        full = self.outstanding >= self.size
        self.outstanding -= n
        self.stalled_ns = None
        if full and self.outstanding < self.size:
            self._on_open()

    def recheck_due(self, now_ns: int) -> bool:
        """Whether to ask the database which of its messages are still unacked: it has been
        full for RECHECK_S with no credit back (and then not again for RECHECK_S)."""
        if self.outstanding < self.size:
            return False
        if self.stalled_ns is None:
            self.stalled_ns = now_ns
            return False
        if now_ns - self.stalled_ns < RECHECK_NS:
            return False
        self.stalled_ns = now_ns
        return True

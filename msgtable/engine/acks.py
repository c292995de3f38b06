"""Group commit for acks: concurrent MessageAck calls on one table share one UPDATE.

Subscribers ack batch after batch, often at the same moment. The first caller runs the
statement for every ack waiting at that moment; callers arriving meanwhile wait and then go
together in the next statement. Each caller still gets its own exact count: when the merged
UPDATE changed fewer rows than it named, one SELECT tells which ids this UPDATE acked (their
time_acked is its timestamp). Nothing is acknowledged to a caller before its UPDATE returned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence

from msgtable.limits import MAX_ACK_IDS


class _Request:
    __slots__ = ("count", "done", "error", "ids")

    def __init__(self, ids: Sequence[Hashable]) -> None:
        self.ids = ids
        self.count = 0
        self.done = False
        self.error: BaseException | None = None


class AckCombiner:
    """Runs ``ack(ids, now) -> rows changed`` for merged requests of many threads.

    ``acked(ids, now) -> set`` answers which of ``ids`` carry that ack timestamp; ``now``
    gives a fresh timestamp per statement.
    """

    def __init__(
        self,
        ack: Callable[[list[Hashable], int], int],
        acked: Callable[[list[Hashable], int], set[Hashable]],
        now: Callable[[], int],
    ) -> None:
        self._ack, self._acked, self._now = ack, acked, now
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._flushing = False

    def ack(self, ids: Sequence[Hashable]) -> int:
        """Ack these (distinct) ids, together with whatever else is waiting."""
        req = _Request(ids)
        with self._cond:
            self._pending.append(req)
            while True:
                while not req.done and self._flushing:
                    self._cond.wait()
                if req.done:
                    return self._result(req)
                self._flushing = True  # this thread runs the next statement
                group = self._take()
                self._cond.release()
                try:
                    self._flush(group)
                finally:
                    self._cond.acquire()
                    self._flushing = False
                    self._cond.notify_all()

    def _take(self) -> list[_Request]:
        group: list[_Request] = []
        total = 0
        while self._pending and (not group or total + len(self._pending[0].ids) <= MAX_ACK_IDS):
            r = self._pending.pop(0)
            group.append(r)
            total += len(r.ids)
        return group

    def _flush(self, group: list[_Request]) -> None:
        owner: dict[Hashable, _Request] = {}  # an id named twice counts for its first caller
        for r in group:
            for i in r.ids:
                owner.setdefault(i, r)
        ids = list(owner)
        try:
            now = self._now()
            changed = self._ack(ids, now)
            done = ids if changed == len(ids) else self._acked(ids, now) if changed else ()
            for i in done:
                owner[i].count += 1
        except BaseException as exc:
            for r in group:
                r.error = exc
        for r in group:
            r.done = True  # read by the waiters under the lock, after notify_all

    @staticmethod
    def _result(req: _Request) -> int:
        if req.error is not None:
            # Every caller of the group raises; give each its own exception object.
            try:
                copy = type(req.error)(*req.error.args)
            except Exception:
                raise req.error from None
            raise copy from req.error
        return req.count

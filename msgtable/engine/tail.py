"""Where a plain table's passes got to, so that a poll the binlog's INSERT hint begins reads on
after it instead of from the table's head (issue 42, item 1).

A pass from the head reads again every row sent and not postponed yet (its postpone is lazy,
vt_postpone_after: the row is still due in the table, at its head): with a subscriber that
keeps up, each hint's pass read all of the last second's messages again to find a few new
ones. Once a pass has read to the end of what is due, every row before its last key is in
the cache, in flight or seen; a hinted poll continues after that key (the tail) when every
row the INSERT wrote sorts after it (its keys come from the binlog event,
msgtable.engine.binlog). A row that would sort before it (a better priority, a lower id
committed late) makes the poll a pass from the head, as any hint did before.

The binlog shows a transaction a moment before other sessions see its rows: a continued
poll can pass over a hinted row it cannot see yet, reading one after it. The hinted ids are
kept until a poll reads them; one a continued poll passed over makes the next poll a pass from
the head (soon: msgtable.engine.rechecks). A head pass forgets them all, as before. Under the
table manager's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from msgtable.core.rows import PolledRow, PollKey, poll_key

# The poll keys of an INSERT's rows, worked out when asked (None: not known)
InsertKeys = Callable[[], list[PollKey] | None]

HINTED_MAX = 10_000  # hinted ids kept at most; more make the next poll a pass from the head


def order(key: PollKey) -> tuple[int, int, Hashable]:
    """A key as the poll orders it: a NULL time_next first."""
    return (key[0], -1 if key[1] is None else key[1], key[2])


class Tail:
    """The tail of a plain table's passes, and the hinted rows a continued poll must read."""

    def __init__(self) -> None:
        self.key: PollKey | None = None  # the last row a pass read to its end (None: unknown)
        self.wanted = False  # the next poll continues after ``key`` (a hint allowed it)
        self.began_ns = 0  # when the last pass from the head began
        self._dirty_ns: int | None = None  # a hint was ignored then (see ignored)
        self._hinted: dict[Hashable, tuple[int, int, Hashable]] = {}  # id -> order(key)

    def ignored(self, now_ns: int) -> None:
        """An INSERT's hint left to the polls under way (the cache has work): its rows may
        sort before the tail, so no poll continues after it before a pass from the head
        that begins from now on."""
        if self._dirty_ns is None:
            self._dirty_ns = now_ns
        self.wanted = False

    def hint(self, keys: InsertKeys | None) -> bool:
        """An INSERT's rows: whether a poll after the tail reads them all (else a pass from
        the head must)."""
        if self.key is None or keys is None or self._dirty_ns is not None:
            return False
        got = keys()
        if got is None or len(self._hinted) + len(got) > HINTED_MAX:
            return False
        tail = order(self.key)
        ordered = [order(k) for k in got]
        if any(k <= tail for k in ordered):
            return False
        for k in ordered:
            self._hinted[k[2]] = k
        self.wanted = True
        return True

    def after(self, now_ns: int, every_ns: int) -> PollKey | None:
        """Where the next poll (not continuing a page of its pass) begins: after the tail
        if a hint allowed it, else at the head (None); at the head at least ``every_ns``
        (the poll interval: rows that fall due before the tail, a postponed row of a better
        priority, are read by then, however often hints wake the poller)."""
        if not self.wanted or now_ns - self.began_ns >= every_ns:
            return None
        return self.key

    def read(
        self, rows: Sequence[PolledRow], after: PollKey | None, ended: bool, now_ns: int
    ) -> bool:
        """A poll at ``now_ns`` after ``after`` (None: from the head) read ``rows``
        (``ended``: to the end of what is due). Returns whether a hinted row was passed
        over unseen: the next poll must be a pass from the head."""
        if after is None:
            self._hinted.clear()
            self.began_ns = now_ns
            if self._dirty_ns is not None and now_ns >= self._dirty_ns:
                self._dirty_ns = None
        elif self._hinted:
            for r in rows:
                self._hinted.pop(r[3], None)
        if not ended:
            self.key, self.wanted = None, False  # a page of a pass: it continues by its cursor
            return False
        # (nothing read: up to where it began; from the head, nothing is due at all)
        self.key = (rows[-1][0], rows[-1][1], rows[-1][3]) if rows else after
        if self._hinted and self.key is not None:
            tail = order(self.key)
            passed = [i for i, k in self._hinted.items() if k <= tail]
            if passed:
                self._hinted.clear()
                self.wanted = False
                return True
        self.wanted = bool(self._hinted)
        return False


def cursor(
    rows: Sequence[PolledRow],
    taken: int,
    limit: int,
    last: PollKey | None,
    after: PollKey | None,
    follows: bool,
) -> tuple[bool, PollKey | None]:
    """After a poll after ``after`` read ``rows`` (up to ``limit``; the last one's key
    ``last``) and the cache took ``taken`` of them: whether more may be due (the poll
    filled its page or the cache), and where the next poll of the pass continues (None:
    the pass ended). ``follows``: a fair table reads on from where it is
    (msgtable.engine.flow.follows_tail)."""
    if taken < len(rows):  # the cache filled up: continue after the last row taken
        return True, poll_key(rows[taken - 1]) if taken else after
    full = len(rows) >= limit
    if full:
        return True, last
    return False, (last or after) if follows else None

"""A lazy subscription's store (design.md next to this module, layer 2): the Store its
MessageManager serves the state table through, with the subscription's cursor and window
(msgtable.features.subscriptions.window) in front of the state table's verbs.

A subscription created with ``state_rows=lazy`` gets no state row from the fan-out: the
messages it was never sent are read from the message table behind its cursor (the scan,
SubscriptionStore.unsent_rows), and a state row is written only when the window can no longer
stand for a message alone. Verb by verb, for a message of the window (read by the scan, no
state row):

* poll: the state table's due rows (redeliveries) first, then, in the room left, the scan:
  from where the last scan ended, or from below a message the cache let go of before a
  subscriber got it (it filled up, the last subscriber left, a stream ended before it took
  its batch: the manager says which, ``read_again``), or, as a net, on a new pass at most
  once every REWIND_NET_S, from the cursor (what the window settled is skipped). A message
  due later than the poll reads (a delayed one) gets its state row now (parked) and is
  served by the state table from then on;
* send: the window's rows that another server may have sent (created before this server
  gained the table) read by primary key in the state table first (one plain read: a row
  another server wrote since the scan, such as the last sender's late ack, makes the
  message the state table's, not sent from the window); the state table's rows are checked
  as before; marked sent in the window before the hand-over, so its ack finds it;
* ack (gRPC): acked in the window, no statement; while its postpone is being written (the
  cache holds it), or once this server no longer sends the table (its lease ended: no
  flush here moves the cursor any more), an acked state row is upserted instead;
* postpone (vt_postpone_after after the send, unacked): its state row INSERTed, epoch 1,
  time_next by the backoff: held; with vt_postpone_after=0 the claim writes it before the
  hand-over, and what the fence kept out (this server no longer sends the table) is not
  handed over;
* release, renew, reject: its state row written as the eager fan-out's (epoch 0), then the
  verb as on any state row, counting the send;
* the flush: the cursor moved over the window's settled prefix, one conditional UPDATE
  (SubscriptionStore.advance_cursor), at each poll, after postpones, and every FLUSH_ACKS
  acks; a cursor another sender moved drops the window, its acks beyond that cursor
  written first as acked state rows;
* a cursor held: a message read and never sent (no subscriber's stream filter passes it, its
  subscriber gone) keeps the cursor below it, and the acks behind it would live in the window
  alone. Once the same message has held the cursor vt_postpone_after, each flush writes the
  acks behind it that the window alone knows as acked state rows (one multi-row upsert: an
  ack already there is kept, a dead row stays dead), as does a sender that lets go; only
  messages sent and acked get one, so no state row races a send. A message read and not
  sent that a scan over its number no longer finds (the application deleted it, acked it by
  its upsert, or changed it past the filter) stops holding the cursor (Window.read_scan).

A crash loses the window and nothing else: the cursor passes only messages acked here or
held by a committed state row; the next sender scans from it and sends the rest again (what
was sent and not acked, and the acks of the last flush interval, or of the last
vt_postpone_after while the cursor is held).
Besides: a settled state row stays until the cursor passed its message (the purge waits: the
scan tells a message never sent only by its missing state row); a sender that lets go
(``let_go``: close, a lost lease) flushes; an expired subscription active again starts from the
sequence's last (``reset``); a takeover's hold keeps back, unsent and unpassed, what the old
sender may have sent; an ack by the application's DML (the upsert) of a message read or
sent, which the binlog shows as an INSERT into the state table (``acked_by_dml``, from the
registry's ``state_acked``), is held in the window and leaves the cache unsent. Not yet
(design.md, layer 3): an ordered table's subscription (refused at load),
release/renew/reject as one upsert each.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from typing import Any

from msgtable.core.clock import Clock
from msgtable.core.rows import CachedRow, PolledRow, PollKey
from msgtable.core.subscriptions import LoadedSubscription, StateRow
from msgtable.core.tables import TableConfig
from msgtable.errors import MsgtableError
from msgtable.features.subscriptions.window import Window
from msgtable.store.protocol import (
    NONE_UNCOUNTED,
    Deliver,
    Keep,
    Store,
    SubscriptionStore,
    Uncounted,
)

log = logging.getLogger(__name__)
_UNKNOWN: PolledRow = (0, None, 0, None, None)  # a row not read by the scan: its age unknown

FLUSH_ACKS = 1_000  # acks settled in the window since the last flush: the cursor moves now
# A scan from the cursor at least this often (and at most once a poll interval): a net for a
# message the cache dropped unsent by a path that did not say so (read_again). Each re-reads
# the window's messages, so not each poll interval: a backlog drain read every row twice.
REWIND_NET_S = 5.0


class LazyCounts:
    """A lazy subscription's counters over its server process's life: its store is made
    anew each time its table is loaded again, its counters are not (the registry keeps
    them by state table)."""

    __slots__ = ("acks_written", "cursor_writes")

    def __init__(self) -> None:
        self.cursor_writes = 0  # cursor moves written (flushes)
        self.acks_written = 0  # acked state rows written behind a held cursor or a lost window


class LazyStore:
    """The Store of one lazy subscription's manager (see the module docstring): the
    database's store, with the scan, the window and the cursor in front of its state-row
    verbs; everything else is the store's own. ``table()`` and ``loaded()`` give the message
    table's config and the subscription as loaded now (None: not loaded)."""

    def __init__(
        self,
        store: Store,
        subs: SubscriptionStore,
        table: Callable[[], TableConfig | None],
        loaded: Callable[[], LoadedSubscription | None],
        clock: Clock,
        state_table: str = "",
        may_send: Callable[[], bool] = lambda: True,
        others_before: Callable[[], int] = lambda: 0,
        counts: LazyCounts | None = None,
    ) -> None:
        self.state_table = state_table
        self._may_send = may_send  # whether this server sends the table now (its lease)
        # rows created up to then (ns) may have been sent by another server (Tenure)
        self._others_before = others_before
        self._store = store
        self._subs = subs
        self._table = table
        self._loaded = loaded
        self._clock = clock
        self._lock = threading.Lock()  # the window and what goes with it; no statement under it
        self._window: Window | None = None  # from the durable cursor, at the first poll
        # each message's row as the scan read it (priority first, time_created last), while
        # it is in the window: its state row's values (_state_row)
        self._rows: dict[Hashable, PolledRow] = {}
        self._acked: tuple[int, set[Hashable]] = (0, set())  # the last ack's, by its time
        self._settled = 0  # acks settled in the window since the last flush
        self._flush_lock = threading.Lock()  # one flush at a time; statements under it
        self._rewound_ns: int | None = None  # when a scan last began from the cursor
        self._held: tuple[int, int] | None = None  # where the cursor is held, since when
        self._floored = False  # the last poll held back what an old sender may have sent
        self._cfg: TableConfig | None = None  # the state table's, as last polled
        self.counts = counts if counts is not None else LazyCounts()

    @property
    def cursor_writes(self) -> int:
        return self.counts.cursor_writes

    @property
    def acks_written(self) -> int:
        return self.counts.acks_written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    # -- the window ------------------------------------------------------------------------
    def _open(self, cfg: TableConfig) -> Window | None:
        """The window, from the durable cursor the first time (None: it has no cursor)."""
        with self._lock:
            if self._window is not None:
                return self._window
        cursor = self._subs.subscription_cursor(cfg.source, cfg.subscription)
        if cursor is None:
            log.warning("subscription %s/%s has no cursor", cfg.source, cfg.subscription)
            return None
        with self._lock:
            if self._window is None:
                self._window = Window(cursor)
            return self._window

    def _state_row(self, rid: Hashable, time_next: int | None, epoch: int) -> StateRow:
        row = self._rows.get(rid)
        priority, created = (0, None) if row is None else (row[0] or 0, row[-1])
        return (rid, priority, time_next, epoch, created)

    def _split(self, batch: Sequence[CachedRow]) -> tuple[list[CachedRow], list[CachedRow]]:
        """The rows the window stands for (no state row), and the others."""
        with self._lock:
            w = self._window
            ids = set() if w is None else w.open_of([r.id for r in batch])
        if not ids:
            return [], list(batch)
        return [r for r in batch if r.id in ids], [r for r in batch if r.id not in ids]

    def _flying(self, ids: Sequence[Hashable], first: Collection[Hashable]) -> list[Hashable]:
        """Those of ``ids`` sent from the window and not settled, among ``first``."""
        with self._lock:
            w = self._window
            if w is None:
                return []
            flying = w.flying_of(ids)
        return [i for i in ids if i in flying and i in first]

    def _hold(
        self, cfg: TableConfig, ids: list[Hashable], time_next: int | None, epoch: int
    ) -> bool:
        """Write their state rows; the window holds them from then on. Rows the store's
        fence kept from being written (this server no longer sends the table: MySQLStore.
        fence_as; False) stay unsettled in the window, so the cursor never passes them from
        here: the next sender sends them from the cursor."""
        if not ids:
            return True
        with self._lock:
            rows = [self._state_row(i, time_next, epoch) for i in ids]
        if not self._subs.write_state_rows(cfg, rows):
            return False
        with self._lock:
            if self._window is not None:
                self._window.settle_all(ids, unsent=True)
        return True

    # -- polls -----------------------------------------------------------------------------
    def poll(
        self,
        cfg: TableConfig,
        now_ns: int,
        limit: int,
        after: PollKey | None = None,
        created: bool = False,
        floor_ns: int | None = None,
        skip_keys: Sequence[Hashable] = (),
    ) -> tuple[list[PolledRow], PollKey | None]:
        """The state table's due rows, then the scan's in the room left. While a takeover
        holds back what the old sender may have sent (``floor_ns``: due and there at or
        before it, as the state table's poll), the scan's such rows are read into the window
        (the cursor may not pass them) and not sent; the first poll after the hold reads
        again from the cursor."""
        self._cfg = cfg
        self.flush(cfg, now_ns)
        rows, last = self._store.poll(cfg, now_ns, limit, after, created, floor_ns, skip_keys)
        room = limit - len(rows)
        table, loaded = self._table(), self._loaded()
        if room <= 0 or table is None or loaded is None:
            return rows, last
        window = self._open(cfg)
        if window is None:
            return rows, last
        now = self._clock.now_ns()
        with self._lock:
            every_ns = round(max(cfg.poller_interval_s, REWIND_NET_S) * 1e9)
            rewind = after is None and (
                self._rewound_ns is None
                or now - self._rewound_ns >= every_ns
                or (self._floored and floor_ns is None)
            )
            if rewind:
                self._rewound_ns = now
            self._floored = floor_ns is not None
            start = window.cursor if rewind else window.scan_after
        scanned = self._subs.unsent_rows(table, cfg, loaded.filter, start, room)
        fresh, later = self._read(
            window, scanned, now_ns, created, floor_ns, (start, len(scanned) < room, rewind)
        )
        for time_next, ids in later.items():
            self._hold(cfg, ids, time_next, 0)
        return [*rows, *fresh], last

    def read_again(self, ids: Iterable[Hashable]) -> None:
        """The cache let these go before a subscriber got them: the next scan reads them
        again (Window.unread_all; the cursor may not pass them meanwhile)."""
        with self._lock:
            if self._window is not None:
                self._window.unread_all(ids)

    def _read(
        self,
        window: Window,
        scanned: Sequence[PolledRow],
        horizon_ns: int,
        created: bool,
        floor_ns: int | None = None,
        began: tuple[int, bool, bool] | None = None,
    ) -> tuple[list[PolledRow], dict[int, list[Hashable]]]:
        """The scan's rows into the window: those for the cache, and those due later than
        ``horizon_ns`` (by their time_next) to park; those an old sender may have sent
        (``floor_ns``) neither. ``began``: where the scan began, whether it read all above
        that, whether from the cursor (Window.read_scan: what it no longer finds)."""
        fresh: list[PolledRow] = []
        later: dict[int, list[Hashable]] = {}
        with self._lock:
            if self._window is not window:  # another sender moved the cursor meanwhile
                return [], {}
            rows = self._rows
            after, complete, net = began if began is not None else (None, False, False)
            # (not passed, nor acked here since)
            for row in window.read_scan(scanned, after, complete, net):
                rid = row[3]
                rows[rid] = row
                if floor_ns is not None and max(row[1] or 0, row[-1] or 0) <= floor_ns:
                    continue  # held back: read again from the cursor after the hold
                if row[1] is not None and row[1] > horizon_ns:
                    later.setdefault(row[1], []).append(rid)
                else:
                    fresh.append(row if created else row[:-1])
        return fresh, later

    # -- sends -----------------------------------------------------------------------------
    def send(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        deliver: Deliver,
        keep: Keep | None = None,
    ) -> list[CachedRow]:
        mine, others = self._split(batch)
        mine = self._unwritten(cfg, mine)
        if not mine:
            return self._store.send(cfg, others, now_ns, deliver, keep)
        return self._hand(
            mine, others, now_ns, deliver, lambda d: self._store.send(cfg, others, now_ns, d, keep)
        )

    def claim(
        self,
        cfg: TableConfig,
        batch: Sequence[CachedRow],
        now_ns: int,
        next_ns: Callable[[int], int],
        deliver: Deliver,
        keep: Keep | None = None,
    ) -> list[CachedRow]:
        """vt_postpone_after=0: the window's rows get their state rows (the postpone)
        before the hand-over, as the claim UPDATE is the others' postpone. Those the fence
        kept out are not handed over (the next sender sends them from the cursor; a
        hand-over here would have two subscribers hold them at once): unsent again."""
        mine, others = self._split(batch)
        mine = self._unwritten(cfg, mine)
        if mine:
            self._mark_sent(mine, now_ns)
            if not self._hold(cfg, [r.id for r in mine], next_ns(0), 1):
                self.read_again(r.id for r in mine)
                mine = []
        if not mine:
            return self._store.claim(cfg, others, now_ns, next_ns, deliver, keep)
        return self._hand(
            mine,
            others,
            now_ns,
            deliver,
            lambda d: self._store.claim(cfg, others, now_ns, next_ns, d, keep),
        )

    def _unwritten(self, cfg: TableConfig, rows: list[CachedRow]) -> list[CachedRow]:
        """Those of the window's rows that still have no state row. A row another server
        may have sent (one created before this server gained the table, or of unknown
        age) is looked up by primary key (one plain read): one written since the scan read
        it (by the last sender: a late ack of what it sent, its letting go, its postpone)
        is the state table's from now on, held in the window, not sent from it. A row
        created since this server sends the table was never another's: no read."""
        if not rows:
            return rows
        before = self._others_before()
        with self._lock:  # (each row's time_created as the scan read it; 0: unknown)
            made = self._rows
            old = [r.id for r in rows if ((made.get(r.id) or _UNKNOWN)[-1] or 0) <= before]
        if not old:
            return rows
        written = self._subs.written_of(cfg, old)
        if not written:
            return rows
        with self._lock:
            if self._window is not None:
                self._window.settle_all(list(written), unsent=True)
        return [r for r in rows if r.id not in written]

    def _mark_sent(self, rows: Sequence[CachedRow], now_ns: int) -> None:
        with self._lock:
            if self._window is not None:
                self._window.sent_all([r.id for r in rows], now_ns)

    def _hand(
        self,
        mine: list[CachedRow],
        others: list[CachedRow],
        now_ns: int,
        deliver: Deliver,
        checked: Callable[[Deliver], list[CachedRow]],
    ) -> list[CachedRow]:
        """Deliver the window's rows with the state table's that ``checked`` finds due
        (in its transaction), or alone if there are none."""
        called = False

        def both(claimed: list[CachedRow]) -> None:
            nonlocal called
            called = True
            self._mark_sent(mine, now_ns)  # before the hand-over: an ack may come at once
            deliver([*claimed, *mine])

        got = checked(both) if others else []
        if not called:
            both([])
        return [*got, *mine]

    def postpone(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        epoch: int | None,
        sent_ns: int,
        next_ns: int,
    ) -> int:
        """The window's rows: their state rows INSERTed (epoch 1); the others' UPDATE."""
        mine = self._flying(ids, ids)
        self._hold(cfg, mine, next_ns, 1)
        held = set(mine)
        rest = [i for i in ids if i not in held]
        n = len(mine)
        if rest:
            n += self._store.postpone(cfg, rest, epoch, sent_ns, next_ns)
        if mine:
            self.flush(cfg)
        return n

    # -- acks ------------------------------------------------------------------------------
    def ack(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        first: Uncounted = NONE_UNCOUNTED,
    ) -> int:
        """The window's rows sent and not postponed: acked there, nothing written; those
        being postponed now, or all the window's once this server no longer sends the table
        (no flush here moves the cursor over them any more; the next sender scans from it):
        an acked state row upserted; the others' UPDATE."""
        sending = self._may_send()  # (not under the lock: the lease's letting go takes it)
        with self._lock:
            w = self._window
            quiet: list[Hashable] = []
            loud: list[Hashable] = []
            if w is not None:
                flying = w.flying_of(ids)
                if flying:
                    if sending:
                        quiet = [i for i in ids if i in flying and i in first]
                    calm = set(quiet)
                    if len(calm) < len(flying):
                        loud = [i for i in ids if i in flying and i not in calm]
                    w.settle_all(quiet, written=False)
            mine = {*quiet, *loud}
            self._acked = (now_ns, mine)
            self._settled += len(quiet)
            flush = self._settled >= FLUSH_ACKS
            rows = [self._state_row(i, None, 1) for i in loud]
        if rows:
            self._subs.write_state_rows(cfg, rows, now_ns)
            with self._lock:
                if self._window is not None:
                    self._window.settle_all(loud)
        rest = [i for i in ids if i not in mine]
        n = len(mine)
        if rest:
            n += self._ack_rows(cfg, rest, now_ns, first)
        if flush:
            self.flush(cfg, now_ns)
        return n

    def _ack_rows(
        self, cfg: TableConfig, ids: list[Hashable], now_ns: int, first: Uncounted
    ) -> int:
        """The ack UPDATE of their state rows; those it did not find (sent by a sender that
        crashed: neither in this window nor in the state table) get an acked state row, so
        the cursor's scan does not send them again (a dead or acked row is left as it is)."""
        n = self._store.ack(cfg, ids, now_ns, {i: first[i] for i in ids if i in first})
        if n >= len(ids):
            return n
        with self._lock:
            rows = [self._state_row(i, None, 1) for i in ids]
        self._subs.write_state_rows(cfg, rows, now_ns)
        with self._lock:
            if self._window is not None:
                self._window.settle_all(ids, unsent=True)
        return len(self._store.acked_ids(cfg, ids, now_ns))

    def acked_by_dml(self, ids: Sequence[Hashable]) -> None:
        """The application acked them by the upsert (the binlog showed their acked state
        rows): held, read or sent, so the cursor may pass them and the send skips them."""
        with self._lock:
            if self._window is not None and ids:
                self._window.settle_all(ids, unsent=True)

    def acked_ids(self, cfg: TableConfig, ids: Sequence[Hashable], now_ns: int) -> set[Hashable]:
        at, acked = self._acked
        ours = {i for i in ids if at == now_ns and i in acked}
        rest = [i for i in ids if i not in ours]
        return ours | (self._store.acked_ids(cfg, rest, now_ns) if rest else set())

    def unacked_ids(self, cfg: TableConfig, ids: Sequence[Hashable]) -> set[Hashable]:
        ours = set(self._flying(ids, ids))
        rest = [i for i in ids if i not in ours]
        return ours | (self._store.unacked_ids(cfg, rest) if rest else set())

    # -- settlement: the state row first, then the verb as on any ---------------------------
    def _materialize(self, cfg: TableConfig, ids: Sequence[Hashable], first: Uncounted) -> None:
        self._hold(cfg, self._flying(ids, first), None, 0)

    def release(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        next_ns: int,
        reason: str | None,
        first: Uncounted = NONE_UNCOUNTED,
        attempts: Sequence[int] | None = None,
    ) -> int:
        self._materialize(cfg, ids, first)
        return self._store.release(cfg, ids, next_ns, reason, first, attempts)

    def renew(
        self,
        cfg: TableConfig,
        ids: Sequence[Hashable],
        now_ns: int,
        until_ns: int,
        reason: str | None,
        first: Uncounted = NONE_UNCOUNTED,
        attempts: Sequence[int] | None = None,
        first_until_ns: int | None = None,
        exact: bool = False,
    ) -> int:
        self._materialize(cfg, ids, first)
        return self._store.renew(
            cfg, ids, now_ns, until_ns, reason, first, attempts, first_until_ns, exact
        )

    def bury(
        self,
        cfg: TableConfig,
        dead: TableConfig | None,
        ids: Sequence[Hashable],
        now_ns: int,
        reason: str | None,
        first: Uncounted = NONE_UNCOUNTED,
        due_at_epoch: tuple[int | None] | None = None,
    ) -> list[Hashable]:
        self._materialize(cfg, ids, first)
        return self._store.bury(cfg, dead, ids, now_ns, reason, first, due_at_epoch)

    # -- the cursor --------------------------------------------------------------------------
    @property
    def source(self) -> str:
        """The message table (\"\": not polled yet)."""
        return self._cfg.source if self._cfg is not None else ""

    def let_go(self) -> None:
        """Its sender lets go of the subscription (close, a lost lease): the cursor over
        what was settled since the last flush, so the next sender does not send it again (a
        failure is logged: the next sender sends those again, at least once)."""
        cfg = self._cfg
        if cfg is None:
            return
        try:
            self.flush(cfg, self._clock.now_ns(), durable=True)
        except MsgtableError as exc:
            log.warning(
                "subscription %s/%s: its cursor not moved on letting go (%s); the next sender "
                "sends again what was acked since the last poll",
                cfg.source,
                cfg.subscription,
                exc,
            )

    def reset(self) -> None:
        """Its cursor was moved from under it (an expired subscription active again): the
        window goes, the next poll reads the cursor again."""
        with self._lock:
            self._window = None
            self._rows.clear()
            self._rewound_ns = self._held = None

    def flush(self, cfg: TableConfig, now_ns: int | None = None, durable: bool = False) -> None:
        """Move the cursor over the window's settled prefix (nothing to do: no statement).
        With ``now_ns``: if the cursor has been held by the same message vt_postpone_after or
        longer (read and never sent: no subscriber's stream filter passes it, its subscriber
        is gone), or with ``durable`` (letting go, which waits for a flush under way), the
        acks behind it that live in the window alone are written (``_write_acked``). A
        cursor another sender moved drops the window, its acks beyond that cursor written
        first (``_write_lost``)."""
        if not self._flush_lock.acquire(blocking=durable):
            return  # a flush under way (the poll's, an ack's): it moves the cursor
        try:
            self._flush(cfg, now_ns, durable)
        finally:
            self._flush_lock.release()

    def _flush(self, cfg: TableConfig, now_ns: int | None, durable: bool) -> None:
        with self._lock:
            w = self._window
            if w is None:
                return
            new = w.advance()
            held, since = w.held_at, self._held
            if now_ns is not None and (held is None or since is None or since[0] != held):
                self._held = since = None if held is None else (held, now_ns)
            durable = durable or (
                since is not None
                and now_ns is not None
                and now_ns - since[1] >= cfg.postpone_after_ns
            )
            if new is None and not durable:
                return
            old = w.cursor
            if new is not None:
                self._settled = 0
        cursor: int | None = new
        if new is not None and not self._subs.advance_cursor(
            cfg.source, cfg.subscription, old, new
        ):
            cursor = self._subs.subscription_cursor(cfg.source, cfg.subscription)
            log.warning(
                "subscription %s/%s: another server moved its cursor (to %s); its window "
                "here is dropped, its acks beyond that written",
                cfg.source,
                cfg.subscription,
                cursor,
            )
        lost: list[StateRow] = []
        with self._lock:
            if new is not None and self._window is w:
                self.counts.cursor_writes += 1
                if cursor == new:
                    rows = self._rows  # (a message's, while in the window: _state_row)
                    for gone in w.moved(new):
                        rows.pop(gone, None)
                else:
                    if cursor is not None:  # (None: the subscription is gone)
                        lost = [self._state_row(i, None, 1) for i in w.acked_only(cursor)]
                    w.lost(old if cursor is None else cursor)
                    self._rows = {}
        if lost:
            self._write_lost(cfg, lost, now_ns)
        elif durable and now_ns is not None:
            self._write_acked(cfg, w, now_ns)

    def _write_lost(self, cfg: TableConfig, rows: list[StateRow], now_ns: int | None) -> None:
        """The acks of a window dropped for a cursor another sender moved, beyond that
        cursor, written as acked state rows (as ``_write_acked``): the other sender's scan
        skips them, the next one here too."""
        at = self._clock.now_ns() if now_ns is None else now_ns
        self._subs.write_state_rows(cfg, rows, at)
        with self._lock:
            self.counts.acks_written += len(rows)

    def _write_acked(self, cfg: TableConfig, w: Window, now_ns: int) -> None:
        """The acks the window alone knows (behind the message holding the cursor) written
        as acked state rows, one multi-row upsert (a row there keeps its ack; a dead one
        stays dead): a crash no longer loses them. Only messages sent and acked: no state
        row for one still to send, so no race with a send."""
        with self._lock:
            if self._window is not w:
                return
            ids = w.acked_only()
            rows = [self._state_row(i, None, 1) for i in ids]
        if not rows:
            return
        self._subs.write_state_rows(cfg, rows, now_ns)
        with self._lock:
            self.counts.acks_written += len(rows)
            if self._window is w:
                w.written(ids)

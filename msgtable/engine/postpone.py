"""The postpone of a sent message: what it writes, when, and when the cache waits for it.

Every send postpones the messages it hands over: time_next by the backoff formula from the
send (msgtable.core.backoff), epoch + 1. With vt_postpone_after=0 the check before the send is the
postpone UPDATE itself, as in Vitess; otherwise the postpone is written vt_postpone_after after
the send, and only for the messages whose ack has not come first (an ack that comes first
counts the send in its own UPDATE): :func:`write`, one UPDATE per (epoch, send).

A message postponed to a time before the next poll would read it (a backoff shorter than
vt_poller_interval) waits in the cache for its time instead (MessageManager._reschedule), so
a redelivery after a short backoff goes out at its time, not a poll later.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING

from msgtable.core.backoff import next_delivery_ns
from msgtable.core.rows import CachedRow
from msgtable.core.tables import TableConfig

if TYPE_CHECKING:
    from msgtable.engine.cache import Hold
    from msgtable.engine.inflight import Sent
    from msgtable.store.protocol import Store

# A row just postponed: the row, the epoch written, the time_next written.
Postponed = tuple[CachedRow, int, int]


def next_delivery(cfg: TableConfig, sent_ns: int, jitter: float) -> Callable[[int], int]:
    """time_next by the epoch a row was sent at, for rows sent at ``sent_ns``. The last
    attempt of a table with vt_max_attempts has no backoff: it is due (and dies, unacked) when
    its ack wait ends (msgtable.core.deadletters)."""
    last = cfg.max_attempts - 1 if cfg.max_attempts else -1
    ack_wait_ns = round(cfg.ack_wait_s * 1e9)

    def next_ns(epoch: int) -> int:
        if epoch >= last >= 0:
            return sent_ns + ack_wait_ns
        return next_delivery_ns(
            sent_ns, epoch, cfg.ack_wait_s, cfg.min_backoff_s, cfg.max_backoff_s, jitter
        )

    return next_ns


def may_end_before_next_poll(cfg: TableConfig) -> bool:
    """Whether a row postponed at a send can fall due before the poll after it: a postpone
    is at least vt_ack_wait + vt_min_backoff away (the backoff formula's lower bound)."""
    return cfg.ack_wait_s + cfg.min_backoff_s <= cfg.poller_interval_s


def claimed(
    cfg: TableConfig, rows: Sequence[CachedRow], next_ns: Callable[[int], int]
) -> list[Postponed]:
    """The rows a claim postponed (vt_postpone_after=0) as written, if any of them can fall
    due before the next poll ([] when none can)."""
    if not may_end_before_next_poll(cfg):
        return []
    nxt = {e: next_ns(e or 0) for e in {r.epoch for r in rows}}
    return [(r, (r.epoch or 0) + 1, nxt[r.epoch]) for r in rows]


def write(store: Store, cfg: TableConfig, hold: Hold, jitter: float) -> list[Postponed]:
    """Write the postpones of the held rows (sent, their ack not come): one UPDATE per
    (epoch, send), each marked written in ``hold`` once it is. Returns what it wrote."""
    groups: dict[tuple[int | None, int], list[Hashable]] = {}
    for rid, (epoch, sent_ns, _) in hold.rows.items():
        groups.setdefault((epoch, sent_ns), []).append(rid)
    written: list[Postponed] = []
    for (epoch, sent_ns), ids in groups.items():
        nxt = next_delivery(cfg, sent_ns, jitter)(epoch or 0)
        store.postpone(cfg, ids, epoch, sent_ns, nxt)
        hold.written(ids)
        written.extend((hold.rows[i][2], (epoch or 0) + 1, nxt) for i in ids)
    return written


def renew(
    store: Store,
    cfg: TableConfig,
    ids: Sequence[Hashable],
    attempts: Sequence[int] | None,
    now_ns: int,
    until_ns: int,
    reason: str | None,
    first: Mapping[Hashable, Sent],
    jitter: float,
    exact: bool = False,
) -> int:
    """A renew's UPDATEs; returns how many rows it renewed. A renew never brings a due time
    in: the ``first`` rows (sent, not postponed: the renew counts their send) are due at the
    later of ``until_ns`` and what their postpone would write, as a row postponed already keeps
    its later time_next. One statement unless the first rows come from several sends (then
    one for each, and one for the others). ``exact`` (SQS's visibility timeout): every row
    due at ``until_ns``, sooner or later."""
    if not ids:
        return 0
    if exact:
        counts = {rid: sent[0] for rid, sent in first.items()}
        return store.renew(cfg, ids, now_ns, until_ns, reason, counts, attempts, None, True)
    groups: dict[tuple[int | None, int], dict[Hashable, int | None]] = {}
    for rid in ids:
        if rid in first:
            epoch, sent_ns, _ = first[rid]
            groups.setdefault((epoch, sent_ns), {})[rid] = epoch
    dues = [
        (rids, max(until_ns, next_delivery(cfg, sent_ns, jitter)(epoch or 0)))
        for (epoch, sent_ns), rids in groups.items()
    ]
    if len(dues) <= 1:
        rids, due = dues[0] if dues else ({}, until_ns)
        return store.renew(cfg, ids, now_ns, until_ns, reason, rids, attempts, due)
    n = 0
    for rids, due in [*dues, ({}, until_ns)]:
        part = [k for k, rid in enumerate(ids) if (rid in rids if rids else rid not in first)]
        if part:
            named = [attempts[k] for k in part] if attempts is not None else None
            some = [ids[k] for k in part]
            n += store.renew(cfg, some, now_ns, until_ns, reason, rids, named, due)
    return n

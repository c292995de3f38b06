"""One send's dispatch: which due rows each subscriber with room gets, in turn.

The manager's sender (msgtable.engine.manager.MessageManager.send_once) asks for a plan under
the table's lock, then checks the plan's rows in the database and hands each batch over. A
plan takes the subscribers with room in round-robin order from where the last send stopped
(msgtable.engine.subscriber.select_subscribers), each a batch of up to vt_batch_size rows its
window has room for:

* a stream without a filter pops the best due rows;
* an unordered table's filtered stream pops only the rows its filter passes
  (msgtable.engine.routes); one with room that finds none is named in the plan (``dry``:
  while the pass lags, msgtable.engine.redeliveries reads on for it);
* otherwise (an ordered table, or rows an earlier stream's filter refused in this send) rows
  are taken from those refused first, then popped, looking at most FILTER_LOOKAHEAD batches
  ahead; an ordered table's key goes to one subscriber, from its head
  (msgtable.engine.ordered.KeyOwners).

Rows sent vt_max_attempts times already are not sent again: the plan lists them as expired
(the manager buries them), and an ordered key's later rows wait for that death to be written.
Rows no stream took go back to the queue for a later send.

A table with limits (msgtable.engine.flow) cuts the batches to the send's budget; a table
whose due rows are kept by key pops only rows of keys their limits let go (its streams with
a filter look for theirs among those, as an ordered table's do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from msgtable.core.rows import CachedRow, Values
from msgtable.core.tables import TableConfig
from msgtable.engine.cache import Sending
from msgtable.engine.flow import Limiter
from msgtable.engine.ordered import KeyOwners, OrderedDue, cut_at_gaps
from msgtable.engine.subscriber import Subscriber, select_subscribers

# An ordered table's stream with a filter looks at most this many times its batch among the
# due runs per send (the rows it refuses go to the next subscriber, or back to the queue); an
# unordered table's pops only rows its filter passes (msgtable.engine.routes).
FILTER_LOOKAHEAD = 4


@dataclass
class Plan:
    """One send's batches, by subscriber, and the rows it found out of attempts."""

    next: int  # where the next send's round-robin starts
    batches: list[tuple[Subscriber, list[CachedRow]]] = field(default_factory=list)
    expired: list[CachedRow] = field(default_factory=list)  # dead, not sent
    # the filters of streams with room that found no row they pass (unordered, not keyed)
    dry: list[Callable[[Values], bool]] = field(default_factory=list)


def plan(
    cfg: TableConfig,
    subscribers: Sequence[Subscriber],
    start: int,
    sending: Sending,
    ordered: OrderedDue | None,
    limiter: Limiter | None = None,
) -> Plan:
    """The batches of one send (under the table's lock; see the module docstring)."""
    out = Plan(start)
    owners = KeyOwners(ordered) if ordered is not None else None
    keyed = limiter is not None and limiter.keyed  # its pops charge the limiter themselves
    spare: list[CachedRow] = []  # popped, refused by a stream's filter so far
    for i in select_subscribers(subscribers, start):
        sub = subscribers[i]
        want = min(cfg.batch_size, sub.window.room)
        if limiter is not None:
            want = min(want, limiter.left + (len(spare) if keyed else 0))
            if want <= 0:
                break
        if sub.accepts is None and not spare:
            batch = sending.pop(want)
        elif owners is None and sub.accepts is not None and not keyed:  # msgtable.engine.routes
            batch = sending.pop_for(sub.accepts, want)  # the rows it passes only
            if not batch:
                out.dry.append(sub.accepts)
        else:
            if owners is not None:
                owners.start(i)
            batch, spare = _take(sending, sub.accepts, want, spare, owners)
        if limiter is not None and not keyed:
            limiter.charge_all(batch)
        if not batch:
            if spare or sub.accepts is not None:
                continue  # the others' filters may pass rows this one does not
            break
        if cfg.max_attempts:  # sent that often: dead, not sent again
            live = [r for r in batch if (r.epoch or 0) < cfg.max_attempts]
            if len(live) < len(batch):
                out.expired += [r for r in batch if (r.epoch or 0) >= cfg.max_attempts]
                # an ordered key's later rows wait for the death to be written
                batch = live if ordered is None else cut_at_gaps(batch, live, ordered)
                if not batch:
                    continue
        out.batches.append((sub, batch))
        out.next = i + 1
    sending.put_back(spare)  # nobody's filter took them: for a later send
    return out


def _take(
    sending: Sending,
    accepts: Callable[[Values], bool] | None,
    want: int,
    spare: list[CachedRow],
    owners: KeyOwners | None = None,
) -> tuple[list[CachedRow], list[CachedRow]]:
    """A batch of up to ``want`` rows ``accepts`` takes: from ``spare`` first (rows an
    earlier stream's filter refused), then popped; returns it and the rows still spare.
    With ``owners`` (an ordered table) a key's rows go to one subscriber, from its head."""
    if owners is not None:
        accepts = owners.admits(accepts)
    batch: list[CachedRow] = []
    left: list[CachedRow] = []
    for row in spare:
        if len(batch) < want and (accepts is None or accepts(row.values)):
            batch.append(row)
        else:
            left.append(row)
    budget = want * FILTER_LOOKAHEAD
    while len(batch) < want and budget > 0:
        popped = sending.pop(min(want - len(batch), budget))
        if not popped:
            break
        budget -= len(popped)
        for row in popped:
            if accepts is None or accepts(row.values):
                batch.append(row)
            else:
                left.append(row)
    return batch, left

"""What operators see of a table: its config or load error, and live counters."""

from __future__ import annotations

from dataclasses import dataclass

from msgtable.core.schedules import Schedule
from msgtable.core.tables import TableConfig


@dataclass(frozen=True)
class PushStatus:
    """What ListTables shows of a group's push endpoint (msgtable.features.push; never its
    secret)."""

    url: str
    state: str  # "pushing", "idle: ...", "not allowed: ...", "failing: ..."
    in_flight: int
    pushed: int
    failed: int
    max_in_flight: int
    timeout_s: float


@dataclass(frozen=True)
class TableStatus:
    """One message table as the engine sees it right now."""

    name: str
    keyspace: str
    config: TableConfig | None  # None when the table failed to load
    load_error: str | None
    cached: int = 0  # rows queued in memory, waiting to be sent
    in_flight: int = 0  # sent by this server, not acked (as far as it saw), ack wait not over
    subscribers: int = 0
    sent: int = 0  # messages sent since the table was opened
    # rows other clients inserted since it was opened, as the binlog follower counted them
    # (only while it counts: with the metrics server on)
    enqueued: int = 0
    redelivered: int = 0  # of those, sends of messages sent before (epoch > 0 when read)
    # reads on past the cache for filtered streams that found nothing while the group lagged
    # (msgtable.engine.redeliveries: the read for dry filters)
    filter_reads: int = 0
    acked: int = 0  # acked since the table was opened: MessageAck, and DML the binlog showed
    acked_dml: int = 0  # of those, by DML (the rest: MessageAck)
    released: int = 0  # since the table was opened (msgtable.core.settlement)
    rejected: int = 0
    renewed: int = 0
    dead_lettered: int = 0  # died since the table was opened: rejected or out of attempts
    dead: int | None = None  # dead messages now, in place or in vt_dead_letter (None: unknown)
    # A subscription's entry (msgtable.core.subscriptions): ``name`` is its table's
    subscription: str = ""
    state: str = ""  # active | expired
    filter: str = ""
    lag: int | None = None  # unsettled messages (counted up to limits.LAG_CAP; None: unknown)
    oldest_ns: int | None = None  # time_created of the oldest unsettled one
    holding: bool = True  # whether it holds its table's purge
    not_holding: str = ""  # why not
    max_lag: int | None = None  # its settings beyond the config's (msgtable.core.subscriptions)
    expire_after_s: float | None = None
    state_rows: str = ""  # eager or lazy (msgtable.core.subscriptions)
    # a lazy subscription's: the messages above its cursor never sent (None: eager, unknown)
    cursor_lag: int | None = None
    # a lazy subscription's with a filter: what its table lacks for the cursor's scan to read
    # its matches alone, in one line ("": nothing; msgtable.core.subscriptions)
    advice: str = ""
    # A table's entry: rows not handed to its subscriptions yet (None: it has none)
    unseen: int | None = None
    # An ordered table's (msgtable.engine.ordered): keys with a batch in flight, keys whose next
    # messages wait in the cache
    keys_in_flight: int = 0
    keys_waiting: int = 0
    # Its push endpoint (msgtable.features.push): url, state, counts; never the secret (None: none)
    push: PushStatus | None = None
    # A capture table's (msgtable.features.capture.follower): the follower's stored position ("":
    # not followed
    # here), its lag in seconds (None: unknown), events written since it started, and why
    # this server does not capture now
    capture_position: str = ""
    capture_lag_s: float | None = None
    capture_events: int = 0
    capture_problem: str = ""
    # The backlog read from the database (msgtable.store.backlog): unacked messages due now and
    # due later, the oldest one's age in seconds (None: not read, or no time_created)
    due: int | None = None
    scheduled: int | None = None
    oldest_unacked_age_s: float | None = None
    # After an unclean takeover (msgtable.engine.lease): seconds left of the hold on what the old
    # holder may have had in flight (0: none), and whether it holds every send of the table
    # (no floor: a table without time_created, an ordered table) or only the rows due and
    # there before the old lease ended (the rest flow)
    hold_s: float = 0.0
    hold_whole: bool = False
    # Flow control (msgtable.engine.flow): the limits ("": none), sends each limit held
    # messages back in, by reason (msgtable.engine.flow.REASONS), keys at their cap now
    limits: str = ""
    throttled: tuple[tuple[str, int], ...] = ()
    keys_at_cap: int = 0
    # The address of the server that sends the table (and its subscriptions) now, as this
    # one last read the placement (msgtable.engine.placement; "": none now or unknown; "this
    # server" for one that shares its database with none)
    sender: str = ""
    shard: str = (
        ""  # the keyspace's shard this server sends (msgtable.core.keyspace; "": unsharded)
    )
    # the schedules that enqueue into the table, with their last and next tick
    # (msgtable.features.schedules)
    schedules: tuple[Schedule, ...] = ()

"""The dashboard's JSON API, without HTTP: what ``/api/state``, ``/api/dead`` and
``/api/redrive`` answer (msgtable.observe.dashboard.web puts it on a socket).

Auth is msgtable.server.auth's, exactly as over gRPC: with an authorizer every call needs
``Authorization: Bearer TOKEN`` (:class:`ApiError` 401 otherwise); a table or subscription
the token may not ``list`` is absent from the state and answers 404 like a table that does
not exist; a redrive needs ``redrive`` on it (403). The token travels in a header, never a
cookie, so another site cannot make a browser send it (no CSRF); a POST must also be JSON,
which a cross-site form cannot send without the browser asking first.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from msgtable.core.deadletters import DeadLetter, RedriveBatch
from msgtable.core.latency import LatencySnapshot
from msgtable.core.schedules import Schedule
from msgtable.core.status import TableStatus
from msgtable.core.words import counted
from msgtable.errors import (
    InvalidArgument,
    MsgtableError,
    PermissionDenied,
    TableLoadError,
    TableNotFound,
    Unauthenticated,
    Unavailable,
)
from msgtable.limits import MAX_DEAD_LETTERS_LISTED, MAX_REDRIVE_BATCH
from msgtable.server.auth import Authorizer
from msgtable.store.backlog import Backlog

from .history import FIELDS, RateHistory

if TYPE_CHECKING:
    from msgtable.server.sqs.app import SqsServer

log = logging.getLogger("msgtable.observe.dashboard")

Series = Mapping[tuple[str, str], dict[str, list[float]]]
DEAD_LETTERS_SHOWN = 50  # per table on the page; the CLI (msgtable dead) pages further
BACKLOG_MAX_AGE_S = 5.0  # the page polls every 2 s; the backlog is read at most this often
# What /api/state shows from the database (discovery, dead letters, lag, the backlog) is read
# on the dashboard's own thread this often (after the last read ended), never while a
# request waits: a database slow under load slows the figures, not the page's answer.
REFRESH_S = 1.0
# The counters the engine keeps in memory (no statement): each answer reads them live.
LIVE_FIELDS = (
    "cached", "in_flight", "subscribers", "sent", "enqueued", "redelivered", "acked",
    "acked_dml", "released", "rejected", "renewed", "dead_lettered", "keys_in_flight",
    "keys_waiting", "hold_s", "hold_whole",
    "throttled", "keys_at_cap",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What the last refresh read: every table and subscription as list_tables says, and
    their backlogs; when it ended (unix seconds)."""

    statuses: list[TableStatus]
    backlogs: dict[tuple[str, str], Backlog]
    read_at_s: float


class DashboardSource(Protocol):
    """What the dashboard reads and does (msgtable.engine.engine.MessageEngine)."""

    keyspace: str
    binlog: Any  # msgtable.engine.binlog.BinlogFollower | None

    @property
    def leading(self) -> bool: ...

    @property
    def lease_holder(self) -> str: ...

    def sender(self, table: str) -> str: ...

    def sends(self, table: str) -> bool: ...

    def database_error(self) -> str: ...

    def list_tables(self) -> list[TableStatus]: ...

    def live_statuses(self) -> list[tuple[TableStatus, LatencySnapshot]]: ...

    def backlog(self, max_age_s: float = ...) -> list[Backlog]: ...

    def dead_letters(
        self, name: str, keyspace: str, after: object | None, limit: int, subscription: str = ""
    ) -> tuple[list[DeadLetter], int]: ...

    def redrive(
        self,
        name: str,
        keyspace: str,
        to: str,
        ids: Sequence[object] | None,
        after: object | None,
        limit: int,
        subscription: str = "",
    ) -> RedriveBatch: ...


class ApiError(Exception):
    """An answer other than 200: its HTTP status and one line saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def resource(table: str, subscription: str) -> str:
    """How auth rules name a subscription (as msgtable.server.servicer does)."""
    return f"{table}/{subscription}" if subscription else table


class DashboardApi:
    """Builds the dashboard's answers from the engine, its rate history and the auth file."""

    def __init__(
        self,
        engine: DashboardSource,
        history: RateHistory,
        authorizer: Authorizer | None = None,
        clock: Any = time.time,
    ) -> None:
        self.engine = engine
        self.history = history
        self.authorizer = authorizer
        self._now = clock
        self._snapshot: Snapshot | None = None
        self._refreshing = threading.Lock()  # one refresh at a time
        self.sqs: SqsServer | None = None  # the SQS API beside it (msgtable serve --sqs-listen)

    # -- auth ----------------------------------------------------------------------------
    def principal(self, authorization: str | None) -> str:
        """The caller's principal ("" without an auth file); ApiError 401 without a valid
        bearer token."""
        if self.authorizer is None:
            return ""
        if not authorization:
            raise ApiError(401, "this dashboard needs a token: Authorization: Bearer TOKEN")
        try:
            return self.authorizer.authenticate([("authorization", authorization)], ())
        except Unauthenticated as exc:
            raise ApiError(401, str(exc)) from None

    def _may(self, principal: str, action: str, table: str, subscription: str) -> bool:
        return self.authorizer is None or self.authorizer.allows(
            principal, action, resource(table, subscription)
        )

    # -- the rate history ----------------------------------------------------------------
    def sample(self) -> None:
        """One sample of every table's counters into the history (no statement)."""
        self.history.sample(self._now(), (s for s, _ in self.engine.live_statuses()))

    # -- what the database says, off the request path ------------------------------------
    def refresh(self) -> Snapshot:
        """Read the tables (discovery, dead letters, lag: engine.list_tables) and their
        backlogs now (the refresher's thread, every REFRESH_S; or the first answer)."""
        with self._refreshing:
            statuses = self.engine.list_tables()
            backlog = self.engine.backlog(BACKLOG_MAX_AGE_S)
            snapshot = Snapshot(
                statuses, {(b.table, b.subscription): b for b in backlog}, self._now()
            )
            self._snapshot = snapshot
            return snapshot

    def _statuses(self) -> tuple[list[TableStatus], Snapshot]:
        """The last snapshot's tables with the engine's live counters (LIVE_FIELDS)."""
        snapshot = self._snapshot or self.refresh()
        live = {(s.name, s.subscription): s for s, _ in self.engine.live_statuses()}
        out = []
        for s in snapshot.statuses:
            now = live.get((s.name, s.subscription))
            if now is not None and s.config is not None:
                s = dataclasses.replace(s, **{f: getattr(now, f) for f in LIVE_FIELDS})
            out.append(s)
        return out, snapshot

    # -- answers -------------------------------------------------------------------------
    def state(self, principal: str, after_s: float | None = None) -> dict[str, Any]:
        """Everything the page shows but dead letters: the server, and each table and
        subscription the caller may list; the rate history's samples after ``after_s``
        (all of the last hour when None: the page asks for the rest as it polls).

        No statement runs here (the first answer aside): the tables and what the database
        says of them are the last refresh's (``read_at_s``), the counters live."""
        engine = self.engine
        now = self._now()
        times, series = self.history.view(after_s)
        current, snapshot = self._statuses()
        backlogs = snapshot.backlogs
        statuses = [s for s in current if self._may(principal, "list", s.name, s.subscription)]
        error = engine.database_error()
        binlog = engine.binlog
        return {
            "keyspace": engine.keyspace,
            "now_s": now,
            "read_at_s": snapshot.read_at_s,
            "server": {
                "leading": engine.leading,
                "lease_holder": engine.lease_holder,
                "database": {"up": not error, "error": error},
                "binlog": None
                if binlog is None
                else {"following": binlog.following.is_set(), "events": int(binlog.events)},
                "sqs": self._sqs(),
            },
            "history": {
                "interval_s": self.history.interval_s,
                "window_s": self.history.interval_s * self.history.slots,
                "after_s": after_s,
                "times": times,
            },
            "tables": [
                self._table(s, now, series, len(times), backlogs.get((s.name, s.subscription)))
                for s in statuses
            ],
        }

    def _sqs(self) -> dict[str, Any] | None:
        """The SQS API's address and calls since the server started, by action (None: not
        served)."""
        sqs = self.sqs
        return None if sqs is None else {"listen": sqs.address, "calls": sqs.calls_by_action()}

    def _table(
        self, s: TableStatus, now_s: float, series: Series, n: int, backlog: Backlog | None
    ) -> dict[str, Any]:
        push = s.push
        oldest_age_s = None
        if s.oldest_ns is not None:
            oldest_age_s = max(0.0, now_s - s.oldest_ns / 1e9)
        return {
            "name": s.name,
            "subscription": s.subscription,
            "kind": "subscription" if s.subscription else "table",
            "load_error": s.load_error,
            "state": s.state,
            "filter": s.filter,
            "cached": s.cached,
            "in_flight": s.in_flight,
            "subscribers": s.subscribers,
            "dead": s.dead,
            "lag": s.lag,
            # a subscription's: eager or lazy; a lazy one's messages above its cursor never sent
            "state_rows": s.state_rows,
            "cursor_lag": s.cursor_lag,
            # a lazy one's filter that reads every message above its cursor: the index it lacks
            "advice": s.advice,
            "unseen": s.unseen,
            # a takeover's hold: seconds left (0: none), every send or the old holder's rows
            "hold_s": round(s.hold_s, 3),
            "hold_whole": s.hold_whole,
            # flow control (msgtable.engine.flow): the limits ("": none), the sends each
            # limit held messages back in, by reason, and the keys at their cap now
            "limits": s.limits,
            "throttled": dict(s.throttled),
            "keys_at_cap": s.keys_at_cap,
            # the server that sends the table now (msgtable.engine.placement; "": none or unknown),
            # and whether it is this one
            "sender": self.engine.sender(s.name),
            "sending": self.engine.sends(s.name),
            "totals": {f: getattr(s, f) for f in FIELDS},
            "push": None
            if push is None
            else {
                "url": push.url,
                "state": push.state,
                "in_flight": push.in_flight,
                "pushed": push.pushed,
                "failed": push.failed,
            },
            "backlog": _backlog(s, backlog, oldest_age_s),
            "rates": _rates(series, s, n) if s.config else None,
            # idempotent enqueue (msgtable.core.dedup) and schedules (msgtable.core.schedules)
            "dedup": _dedup(s),
            "schedules": [_schedule(x) for x in s.schedules],
        }

    def dead(self, principal: str, query: Mapping[str, str]) -> dict[str, Any]:
        """Up to ``limit`` dead letters of one table or subscription, and how many there are."""
        table, subscription = self._target(principal, "list", query)
        limit = _int(query.get("limit", str(DEAD_LETTERS_SHOWN)), "limit")
        if not 0 < limit <= MAX_DEAD_LETTERS_LISTED:
            raise ApiError(400, f"limit must be 1 to {MAX_DEAD_LETTERS_LISTED}, not {limit}")
        rows, count = self._call(
            self.engine.dead_letters, table, self.engine.keyspace, None, limit, subscription
        )
        return {
            "table": table,
            "subscription": subscription,
            "count": count,
            "dead_letters": [
                {
                    "id": _json_id(d.id),
                    "time_dead_s": None if d.time_dead_ns is None else d.time_dead_ns / 1e9,
                    "attempts": d.attempts,
                    "last_error": d.last_error,
                }
                for d in rows
            ],
        }

    def redrive(self, principal: str, body: Any) -> dict[str, Any]:
        """Redrive the dead letters ``ids`` (all, when none is given: one batch) of one
        table or subscription; the caller needs ``redrive`` on it."""
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object {table, subscription, ids}")
        query = {k: body.get(k, "") for k in ("table", "subscription")}
        if not all(isinstance(v, str) for v in query.values()):
            raise ApiError(400, "table and subscription must be strings")
        table, subscription = self._target(principal, "redrive", query)
        ids = body.get("ids")
        if ids is not None and (
            not isinstance(ids, list)
            or not all(isinstance(i, (int, str)) and not isinstance(i, bool) for i in ids)
        ):
            raise ApiError(400, "ids must be a list of message ids")
        if ids is not None and not 0 < len(ids) <= MAX_REDRIVE_BATCH:
            raise ApiError(400, f"give 1 to {MAX_REDRIVE_BATCH} ids (or none for one batch)")
        batch = self._call(
            self.engine.redrive,
            table,
            self.engine.keyspace,
            "",
            ids,
            None,
            len(ids) if ids else MAX_REDRIVE_BATCH,
            subscription,
        )
        log.info(
            "dashboard: %s redrove %s of %s",
            principal or "anonymous",
            counted(batch.moved, "dead letter"),
            resource(table, subscription),
        )
        return {"moved": batch.moved, "skipped": [_json_id(i) for i in batch.skipped]}

    def _target(self, principal: str, action: str, query: Mapping[str, str]) -> tuple[str, str]:
        table, subscription = query.get("table", ""), query.get("subscription", "")
        if not table:
            raise ApiError(400, "which table? (table=NAME)")
        if not self._may(principal, "list", table, subscription):
            # the same answer as a table that does not exist: no hint either way
            raise ApiError(404, f"no message table {resource(table, subscription)!r}")
        if not self._may(principal, action, table, subscription):
            raise ApiError(403, f"{principal} may not {action} {resource(table, subscription)!r}")
        return table, subscription

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except MsgtableError as exc:
            raise ApiError(status_of(exc), str(exc)) from None


def status_of(exc: MsgtableError) -> int:
    """The HTTP status of a domain error (the one table, as msgtable.server.servicer's for gRPC)."""
    for kind, status in (
        (TableNotFound, 404),
        (InvalidArgument, 400),
        (TableLoadError, 400),
        (PermissionDenied, 403),
        (Unauthenticated, 401),
        (Unavailable, 503),
    ):
        if isinstance(exc, kind):
            return status
    return 500


def _backlog(s: TableStatus, b: Backlog | None, oldest_age_s: float | None) -> dict[str, Any]:
    """The backlog as msgtable.store.backlog reads it (the database's counts, at most
    BACKLOG_MAX_AGE_S old); before its first read, what the manager counts in memory."""
    if b is None:
        return {
            "due": s.cached,
            "scheduled": None,
            "in_flight": s.in_flight,
            "unsettled": s.lag,
            "oldest_unacked_age_s": oldest_age_s,
            "by_age": [],
        }
    return {
        "due": b.due,
        "scheduled": b.scheduled,
        "in_flight": s.in_flight,
        "unsettled": s.lag,
        "oldest_unacked_age_s": b.oldest_unacked_age_s,
        # JSON has no infinity: the last bucket (every unacked message) has bound null
        "by_age": [[None if math.isinf(u) else u, n] for u, n in b.by_age],
    }


def _dedup(s: TableStatus) -> dict[str, Any] | None:
    """A table's vt_dedup column and window (None: it does not deduplicate)."""
    c = s.config
    if c is None or s.subscription or not c.dedup:
        return None
    return {"column": c.dedup, "window_s": c.dedup_window_s}


def _schedule(x: Schedule) -> dict[str, Any]:
    """A schedule of the table: its definition, its last and next tick (unix s; None: none
    yet) and how many messages it enqueued."""
    return {
        "name": x.name,
        "cron": x.cron,
        "timezone": x.timezone,
        "missed": x.missed.value,
        "last_tick_s": x.last_tick_ns / 1e9 if x.last_tick_ns else None,
        "next_tick_s": x.next_tick_ns / 1e9 if x.next_tick_ns else None,
        "ticks": x.ticks,
    }


def _rates(series: Series, s: TableStatus, n: int) -> dict[str, list[float]]:
    """A key's deltas at the view's ``n`` times (zeros for one loaded since the last sample)."""
    found = series.get((s.name, s.subscription))
    return found if found is not None else {f: [0.0] * n for f in FIELDS}


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ApiError(400, f"{name} must be a whole number, not {text!r}") from None


def _json_id(value: object) -> object:
    """A message id as JSON: numbers stay numbers (JavaScript's doubles are exact to 2**53;
    bigger ones go as text), anything else as text."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return value if abs(value) <= 2**53 else str(value)
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)

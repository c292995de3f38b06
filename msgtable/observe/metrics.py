"""Prometheus metrics: a collector that reads the engine's own counters at scrape time.

Nothing here runs per message: the managers already count what they send, ack, release,
reject, renew and dead-letter (msgtable.core.status.TableStatus), and fill two histograms that
are always on and cheap (msgtable.core.latency: send -> ack per ack batch under the manager's
lock; the store's statements by kind, one observation a statement); :class:`EngineCollector`
turns those into metric families only when Prometheus scrapes, without a statement, so a
server nobody scrapes pays nothing more.

Names follow Prometheus's conventions: one ``msgtable_`` prefix, base units, ``_total`` on
counters; labels ``keyspace``, ``table`` and ``subscription`` ("" for a table's
default group), never one per message. The counters start at zero when a table (or
subscription) is opened here; Prometheus's ``rate()`` takes such resets in its stride.

:class:`MetricsServer` serves them on ``--metrics-listen HOST:PORT`` (msgtable.server.webserver,
on threads of its own), with idempotent ``open()`` / ``close()``, rendered by
msgtable.observe.exposition: byte for byte what prometheus_client would write, and several times
cheaper (a scrape of 100 tables' 5,000 lines took 140 ms of the server's CPU through
prometheus_client's generate_latest and HTTP server on a 2-core machine).
"""

from __future__ import annotations

import functools
import gzip
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from msgtable.core.latency import LatencySnapshot
from msgtable.core.status import PushStatus, TableStatus
from msgtable.observe.exposition import CONTENT_TYPE, COUNTER, GAUGE, HISTOGRAM, Family, render
from msgtable.server import webserver
from msgtable.server.webserver import WebServer
from msgtable.store.backlog import DEFAULT_MAX_AGE_S, SCRAPE_WAIT_S, Backlog
from msgtable.store.protocol import Store

log = logging.getLogger(__name__)

PREFIX = "msgtable_"
LABELS = ("keyspace", "table", "subscription")
THREADS = 2  # Prometheus keeps one connection a target; a second for a person or a test
GZIP_LEVEL = 1  # text compresses about tenfold at the fastest level; 9 costs several times more

# (family name without prefix and suffix, TableStatus field, help)
COUNTERS = (
    ("messages_sent", "sent", "Messages sent to subscribers (each send of a message counts)."),
    ("messages_redelivered", "redelivered", "Sends of messages that had been sent before."),
    ("messages_released", "released", "Messages released back to be sent again."),
    ("messages_rejected", "rejected", "Messages rejected by a subscriber."),
    ("messages_renewed", "renewed", "Messages whose ack wait a subscriber renewed."),
    ("messages_dead_lettered", "dead_lettered", "Messages that died: rejected or out of attempts."),
    (
        "filter_reads",
        "filter_reads",
        "Reads on past the cache for filtered streams that found nothing while the group "
        "lagged (at most one every 250 ms).",
    ),
)
GAUGES = (
    ("messages_in_flight", "in_flight", "Messages sent here and not acked, ack wait not over."),
    ("messages_cached", "cached", "Due messages queued in memory, waiting to be sent."),
    ("subscribers", "subscribers", "Subscribers streaming from the table or subscription."),
)
PUSH_COUNTERS = (
    ("push_deliveries", "pushed", "Batches an endpoint accepted (2xx)."),
    ("push_failures", "failed", "Pushes that failed (an error status, a timeout, no answer)."),
)


class SqsSource(Protocol):
    """What the collector reads of the SQS API (msgtable.server.sqs.app.SqsServer)."""

    def calls(self) -> dict[tuple[str, str], int]: ...

    def receives_waiting(self) -> int: ...


class MetricsSource(Protocol):
    """What the collector reads (msgtable.engine.engine.MessageEngine)."""

    keyspace: str
    lease_gains: int  # times it gained the lease: each a tenure whose counters start at 0
    lease_losses: int  # odd while a loss replaces a table's managers (a seqlock)
    binlog: Any  # msgtable.engine.binlog.BinlogFollower | None
    capture: Any  # msgtable.features.capture.follower.CaptureFollower | None
    store: Store  # its statement_stats: failed statements and latencies (MySQL only)

    @property
    def leading(self) -> bool: ...

    @property
    def postpones_skipped(self) -> Mapping[str, int]: ...  # by table: not written, see help

    @property
    def lease_late_renewals(self) -> int: ...

    def sends(self, table: str) -> bool: ...

    def database_error(self) -> str: ...

    def live_statuses(self) -> list[tuple[TableStatus, LatencySnapshot]]: ...

    def push_status(self, table: str, subscription: str) -> PushStatus | None: ...

    def backlog(self, max_age_s: float = ..., wait_s: float | None = ...) -> list[Backlog]: ...

    def delivery_delays(self) -> dict[tuple[str, str], LatencySnapshot]: ...

    def cursor_flushes(self) -> dict[tuple[str, str], int]: ...

    def held_acks_written(self) -> dict[tuple[str, str], int]: ...


def _flow_families(statuses: list[TableStatus], labels: list[tuple[str, str, str]]) -> list[Family]:
    """Flow control's (msgtable.engine.flow): the sends each limit held messages back
    in, and the keys at their cap, of the tables and subscriptions with limits."""
    held = Family(
        PREFIX + "sends_throttled",
        COUNTER,
        "Sends a limit held messages back in (reason: rate, in_flight, key_rate, "
        "key_cap); the messages keep their place and are not counted as attempts.",
        (*LABELS, "reason"),
    )
    capped = Family(
        PREFIX + "keys_at_cap",
        GAUGE,
        "Keys with vt_key_concurrency messages in flight now.",
        LABELS,
    )
    for s, ls in zip(statuses, labels, strict=True):
        if s.limits:
            for reason, n in s.throttled:
                held.add((*ls, reason), n)
            capped.add(ls, s.keys_at_cap)
    return [held, capped]


class EngineCollector(Collector):
    """The engine's metric families, built from its counters when scraped."""

    def __init__(
        self,
        engine: MetricsSource,
        streams: Callable[[], int] | None = None,
        sqs: SqsSource | None = None,
    ) -> None:
        self.engine = engine
        self.streams = streams  # the gRPC server's open MessageStream calls (None: no server)
        self.sqs = sqs  # the SQS API's requests (None: not served)
        self.backlog_max_age_s = DEFAULT_MAX_AGE_S

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the families are only known at scrape time

    def collect(self) -> Iterator[Metric]:
        """prometheus_client's families (a registry's collector): the same as exposition()."""
        for family in self.families():
            yield family.metric()

    def exposition(self) -> bytes:
        """What /metrics answers: Prometheus's text format, rendered by msgtable.observe.exposition
        (byte for byte what prometheus_client would write, several times faster)."""
        return render(self.families())

    def families(self) -> list[Family]:
        """Every family, read from the engine's counters now (no statement, except the
        backlog's read at most once per backlog_max_age_s)."""
        leading, gains_now, live, sending = self._tenure()
        live.sort(key=lambda x: (x[0].name, x[0].subscription))
        statuses = [s for s, _ in live]
        labels = [_labels(s) for s in statuses]
        out = self._message_families(live, labels)
        out.extend(self._push_families(statuses, labels))
        out.extend(_flow_families(statuses, labels))
        out.extend(self._backlog_families())
        c = Family(
            PREFIX + "subscription_cursor_flushes",
            COUNTER,
            "A lazy subscription's cursor writes: one UPDATE moves it over what was settled.",
            LABELS,
        )
        for (table, sub), n in sorted(self.engine.cursor_flushes().items()):
            c.add((self.engine.keyspace, table, sub), n)
        out.append(c)
        h = Family(
            PREFIX + "subscription_held_acks_written",
            COUNTER,
            "A lazy subscription's acks written as acked state rows behind a cursor held by "
            "a message never sent, on letting go, or beyond a cursor another server moved.",
            LABELS,
        )
        for (table, sub), n in sorted(self.engine.held_acks_written().items()):
            h.add((self.engine.keyspace, table, sub), n)
        out.append(h)
        g = Family(
            PREFIX + "table_sender",
            GAUGE,
            "1 while this server sends the table (it holds the table's lease), else 0.",
            LABELS,
        )
        for st, ls in zip(statuses, labels, strict=True):
            if not st.subscription:
                g.add(ls, 1 if sending.get(st.name) else 0)
        out.append(g)
        out.extend(self._lease_families(leading, gains_now))
        out.extend(self._server_families())
        return out

    def _tenure(
        self,
    ) -> tuple[bool, int, list[tuple[TableStatus, LatencySnapshot]], dict[str, bool]]:
        """Whether this server leads, its lease gains, the live statuses and whether it sends
        each table, all of one tenure: a loss (its tables reopened, counters at 0) or a gain
        while the tables are read means reading them again."""
        engine = self.engine
        for _ in range(10):  # a loss's odd window is a few dict operations long
            tenure = (engine.leading, engine.lease_gains, engine.lease_losses)
            live = engine.live_statuses()
            sending = {s.name: engine.sends(s.name) for s, _ in live if not s.subscription}
            steady = tenure[2] % 2 == 0  # no loss was half done when it began
            if steady and (engine.leading, engine.lease_gains, engine.lease_losses) == tenure:
                break
        return tenure[0], tenure[1], live, sending

    def _message_families(
        self, live: list[tuple[TableStatus, LatencySnapshot]], labels: list[tuple[str, str, str]]
    ) -> list[Family]:
        """The counters, gauges and histograms of each table's and subscription's messages."""
        statuses = [s for s, _ in live]
        out: list[Family] = []
        for name, field, doc in COUNTERS:
            c = Family(PREFIX + name, COUNTER, doc, LABELS)
            for s, ls in zip(statuses, labels, strict=True):
                c.add(ls, getattr(s, field))
            out.append(c)
        c = Family(
            PREFIX + "messages_acked",
            COUNTER,
            "Messages acked: via grpc (MessageAck) or dml (another client's UPDATE, as the "
            "binlog showed it).",
            (*LABELS, "via"),
        )
        for s, ls in zip(statuses, labels, strict=True):
            c.add((*ls, "grpc"), s.acked - s.acked_dml)
            c.add((*ls, "dml"), s.acked_dml)
        out.append(c)
        c = Family(
            PREFIX + "messages_enqueued",
            COUNTER,
            "Rows other clients inserted into the table, as the binlog follower counted them.",
            LABELS,
        )
        if self.engine.binlog is not None:
            for s, ls in zip(statuses, labels, strict=True):
                if not s.subscription:  # a subscription's rows are the table's
                    c.add(ls, s.enqueued)
        out.append(c)
        for name, field, doc in GAUGES:
            g = Family(PREFIX + name, GAUGE, doc, LABELS)
            for s, ls in zip(statuses, labels, strict=True):
                g.add(ls, getattr(s, field))
            out.append(g)
        h = Family(
            PREFIX + "message_ack_latency_seconds",
            HISTOGRAM,
            "Time from a message's send to its ack (by MessageAck or DML) while in flight.",
            LABELS,
        )
        for (_, latency), ls in zip(live, labels, strict=True):
            h.add_histogram(ls, latency)
        out.append(h)
        h = Family(
            PREFIX + "message_delivery_delay_seconds",
            HISTOGRAM,
            "Time from a message's time_created to its first send.",
            LABELS,
        )
        delays = self.engine.delivery_delays()
        for s, ls in zip(statuses, labels, strict=True):
            d = delays.get((s.name, s.subscription))
            cfg = s.config
            if d is not None and cfg is not None and cfg.has_column("time_created"):
                h.add_histogram(ls, d)
        out.append(h)
        return out

    def _push_families(
        self, statuses: list[TableStatus], labels: list[tuple[str, str, str]]
    ) -> list[Family]:
        """Each endpoint's pushes (msgtable.features.push)."""
        out: list[Family] = []
        pushes = [self.engine.push_status(s.name, s.subscription) for s in statuses]
        for name, field, doc in PUSH_COUNTERS:
            c = Family(PREFIX + name, COUNTER, doc, LABELS)
            for p, ls in zip(pushes, labels, strict=True):
                if p is not None:
                    c.add(ls, getattr(p, field))
            out.append(c)
        g = Family(
            PREFIX + "push_in_flight",
            GAUGE,
            "Pushes waiting for their endpoint's answer.",
            LABELS,
        )
        for p, ls in zip(pushes, labels, strict=True):
            if p is not None:
                g.add(ls, p.in_flight)
        out.append(g)
        return out

    def _lease_families(self, leading: bool, gains_now: int) -> list[Family]:
        """The keyspace's lease gauges and counters."""
        engine, ks = self.engine, self.engine.keyspace
        skipped = Family(
            PREFIX + "postpones_skipped",
            COUNTER,
            "Sent messages whose postpone a lost lease noticed too late did not write, or the "
            "placement row's fence kept out, by message table (none yet: no sample): their "
            "send is not counted in the table (epoch), and they go out again after the next "
            "holder's hold.",
            ("keyspace", "table"),
        )
        for table, n in sorted(engine.postpones_skipped.items()):
            skipped.add((ks, table), n)
        return [
            _per_keyspace(
                GAUGE,
                "lease_holder",
                "1 while this server sends any table (it holds a table's lease), else 0.",
                ks,
                1 if leading else 0,
            ),
            _per_keyspace(
                COUNTER,
                "lease_gains",
                "Times this server gained a table's lease: each starts a tenure of the table "
                "whose counters start again at 0.",
                ks,
                gains_now,
            ),
            _per_keyspace(
                COUNTER,
                "lease_late_renewals",
                "Lease renewals that came back after the validity they gave: sends paused "
                "until the next one (a loaded machine, or a --lease-period too short for it).",
                ks,
                engine.lease_late_renewals,
            ),
            skipped,
        ]

    def _backlog_families(self) -> list[Family]:
        """The backlog gauges: read from the database at most once per backlog_max_age_s
        (msgtable.store.backlog), whatever the scrape interval; the last read while it is away, or
        while a read takes longer than SCRAPE_WAIT_S (the read goes on for the next scrape)."""
        backlog = self.engine.backlog(self.backlog_max_age_s, wait_s=SCRAPE_WAIT_S)
        ks = self.engine.keyspace
        due = Family(
            PREFIX + "messages_due",
            GAUGE,
            "Unacked messages due now (time_next <= now), waiting to be sent.",
            LABELS,
        )
        scheduled = Family(
            PREFIX + "messages_scheduled",
            GAUGE,
            "Unacked messages due later: delayed, or backing off after a send.",
            LABELS,
        )
        oldest = Family(
            PREFIX + "oldest_unacked_age_seconds",
            GAUGE,
            "Age (now - time_created) of the oldest unacked message; 0 when none.",
            LABELS,
        )
        for b in backlog:
            labels = (ks, b.table, b.subscription)
            due.add(labels, b.due)
            scheduled.add(labels, b.scheduled)
            if b.by_age:  # a table without time_created has no age
                oldest.add(labels, b.oldest_unacked_age_s or 0.0)
        return [due, scheduled, oldest]

    def _server_families(self) -> list[Family]:
        engine, ks = self.engine, (self.engine.keyspace,)
        out: list[Family] = []
        up = Family(
            PREFIX + "database_up",
            GAUGE,
            "1 while the database answers, 0 while the server waits for it.",
            ("keyspace",),
        )
        up.add(ks, 0 if engine.database_error() else 1)
        out.append(up)
        stats = engine.store.statement_stats()
        if stats is not None:
            h = Family(
                PREFIX + "database_statement_duration_seconds",
                HISTOGRAM,
                "How long the server's database statements took, by kind (poll, claim, ack...).",
                ("keyspace", "kind"),
            )
            for kind, snapshot in sorted(stats.statement_latency_snapshot().items()):
                h.add_histogram((engine.keyspace, kind), snapshot)
            out.append(h)
            errors = Family(
                PREFIX + "database_errors",
                COUNTER,
                "Statements that failed: the database away, a deadlock, a lock wait timeout...",
                ("keyspace",),
            )
            errors.add(ks, stats.database_errors)
            out.append(errors)
        if self.streams is not None:
            streams = Family(
                PREFIX + "streams",
                GAUGE,
                "MessageStream calls open on this server.",
                ("keyspace",),
            )
            streams.add(ks, self.streams())
            out.append(streams)
        if engine.binlog is not None:
            out.extend(_binlog_families(engine.binlog, ks))
        f = engine.capture
        if f is not None and f.following.is_set():
            lag = Family(
                PREFIX + "capture_lag_seconds",
                GAUGE,
                "How far the table-events follower is behind the binlog's newest event.",
                ("keyspace",),
            )
            lag.add(ks, float(f.lag_s))
            out.append(lag)
        if self.sqs is not None:
            out.extend(_sqs_families(self.sqs, engine.keyspace))
        schedules = getattr(engine, "schedules", None)
        if schedules is not None and schedules.listed:
            out.extend(_schedule_families(schedules, engine.keyspace))
        return out


def _schedule_families(schedules: Any, keyspace: str) -> list[Family]:
    """Each schedule's next and last tick and its messages so far (as the last discovery
    read msgtable_schedules), and how late this server enqueued its recent ticks
    (msgtable.features.schedules)."""
    labels = ("keyspace", "schedule", "table")
    next_tick = Family(
        PREFIX + "schedule_next_tick_seconds",
        GAUGE,
        "When the schedule's next tick is due (unix seconds).",
        labels,
    )
    last_tick = Family(
        PREFIX + "schedule_last_tick_seconds",
        GAUGE,
        "The schedule's last tick enqueued (unix seconds; absent before its first).",
        labels,
    )
    ticks = Family(
        PREFIX + "schedule_ticks",
        COUNTER,
        "Messages the schedule has enqueued, by every server of the database.",
        labels,
    )
    for s in schedules.listed:
        at = (keyspace, s.name, s.table)
        next_tick.add(at, s.next_tick_ns / 1e9)
        if s.last_tick_ns:
            last_tick.add(at, s.last_tick_ns / 1e9)
        ticks.add(at, s.ticks)
    out = [next_tick, last_tick, ticks]
    ticker = schedules.ticker
    if ticker is not None and ticker.late_ns:
        late = sorted(ticker.late_ns)
        out.append(
            _per_keyspace(
                GAUGE,
                "schedule_late_p99_seconds",
                "How late this server enqueued the last ticks it enqueued (their 99th "
                "percentile, seconds after each tick's time).",
                keyspace,
                late[min(len(late) - 1, int(len(late) * 0.99))] / 1e9,
            )
        )
    return out


def _sqs_families(sqs: SqsSource, keyspace: str) -> list[Family]:
    """The SQS API's requests by action and outcome ("ok" or SQS's error code), and the
    receives waiting now (msgtable.server.sqs)."""
    requests = Family(
        PREFIX + "sqs_requests",
        COUNTER,
        "Requests to the SQS API, by action and outcome (ok, or the SQS error code answered).",
        ("keyspace", "action", "outcome"),
    )
    for (action, outcome), n in sorted(sqs.calls().items()):
        requests.add((keyspace, action, outcome), n)
    waiting = _per_keyspace(
        GAUGE,
        "sqs_receives_waiting",
        "ReceiveMessage calls of the SQS API waiting now (long polling).",
        keyspace,
        sqs.receives_waiting(),
    )
    return [requests, waiting]


def _per_keyspace(kind: str, name: str, doc: str, keyspace: str, value: float) -> Family:
    """A family of one sample, labelled with the server's keyspace."""
    f = Family(PREFIX + name, kind, doc, ("keyspace",))
    f.add((keyspace,), value)
    return f


def _labels(s: TableStatus) -> tuple[str, str, str]:
    return (s.keyspace, s.name, s.subscription)


def registry_for(
    engine: MetricsSource, streams: Callable[[], int] | None = None
) -> CollectorRegistry:
    """A registry with the engine's families only (not the process's default collectors,
    which a test or a second engine in one process would share)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, streams))
    return registry


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9464`` for IPv6) as (host, port); InvalidArgument otherwise."""
    return webserver.parse_listen(listen, "--metrics-listen", "0.0.0.0:9464")


class MetricsServer(webserver.Served):
    """``/metrics`` over HTTP (msgtable.server.webserver: cheroot, threads of its own): the engine's
    families rendered by msgtable.observe.exposition, or a registry's by prometheus_client."""

    def __init__(
        self,
        engine: MetricsSource | None,
        listen: str,
        streams: Callable[[], int] | None = None,
        registry: CollectorRegistry | None = None,
        sqs: SqsSource | None = None,
    ) -> None:
        """The engine's families; or, with ``registry`` (msgtable.gateway.gateway's), those."""
        host, port = parse_listen(listen)
        self.engine = engine
        if registry is None:
            assert engine is not None
            collector = EngineCollector(engine, streams, sqs)
            registry = CollectorRegistry(auto_describe=False)
            registry.register(collector)
            self._render: Callable[[], bytes] = collector.exposition
        else:
            self._render = functools.partial(generate_latest, registry)
        self.registry = registry
        self.web = WebServer(self._app, host, port, "--metrics-listen", THREADS, "msgtable-metrics")

    def open(self) -> None:
        binlog = getattr(self.engine, "binlog", None)
        if binlog is not None:  # msgtable_messages_enqueued_total counts rows from now on
            binlog.count_rows = True
        self.web.open()

    def close(self) -> None:
        self.web.close()

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        """Every path but /favicon.ico answers the metrics, as prometheus_client's server
        does; gzipped when the scraper accepts it (Prometheus does)."""
        if environ.get("REQUEST_METHOD") == "OPTIONS":
            start_response("200 OK", [("Allow", "OPTIONS,GET"), ("Content-Length", "0")])
            return [b""]
        if environ.get("PATH_INFO") == "/favicon.ico":
            start_response("200 OK", [("Content-Length", "0")])
            return [b""]
        try:
            body = self._render()
        except Exception:  # a bug: told in the log, not in the answer
            log.exception("/metrics: the families could not be read")
            body = b"msgtable: the metrics could not be read; see the server's log\n"
            start_response(
                "500 Internal Server Error",
                [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
            )
            return [body]
        headers = [("Content-Type", CONTENT_TYPE)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=GZIP_LEVEL)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [body]


def _binlog_families(binlog: Any, ks: tuple[str]) -> list[Family]:
    """The binlog follower's families: whether it follows, the row events it read, its lag."""
    out: list[Family] = []
    b = Family(
        PREFIX + "binlog_following",
        GAUGE,
        "1 while the binlog follower reads the binlog, 0 while it polls only or retries.",
        ("keyspace",),
    )
    b.add(ks, 1 if binlog.following.is_set() else 0)
    out.append(b)
    events = Family(
        PREFIX + "binlog_row_events",
        COUNTER,
        "Row events the binlog follower read.",
        ("keyspace",),
    )
    events.add(ks, binlog.events)
    out.append(events)
    lag_s = binlog.lag_s
    if lag_s is not None:
        lag = Family(
            PREFIX + "binlog_lag_seconds",
            GAUGE,
            "How far the binlog follower is behind: now - its last event's time, 0 when caught up.",
            ("keyspace",),
        )
        lag.add(ks, lag_s)
        out.append(lag)
    return out

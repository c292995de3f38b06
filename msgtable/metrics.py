"""Prometheus metrics: a collector that reads the engine's own counters at scrape time.

Nothing here runs per message: the managers already count what they send, ack, release,
reject, renew and dead-letter (msgtable.status.TableStatus), and fill two histograms that
are always on and cheap (msgtable.latency: send -> ack per ack batch under the manager's
lock; the store's statements by kind, one observation a statement); :class:`EngineCollector`
turns those into metric families only when Prometheus scrapes, without a statement, so a
server nobody scrapes pays nothing more.

Names follow Prometheus's conventions: one ``msgtable_`` prefix, base units, ``_total`` on
counters; labels ``keyspace``, ``table`` and ``subscription`` ("" for a table's
default group), never one per message. The counters start at zero when a table (or
subscription) is opened here; Prometheus's ``rate()`` takes such resets in its stride.

:class:`MetricsServer` serves them on ``--metrics-listen HOST:PORT`` (prometheus_client's
HTTP server, on its own thread), with idempotent ``open()`` / ``close()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from msgtable.backlog import DEFAULT_MAX_AGE_S, SCRAPE_WAIT_S, Backlog
from msgtable.errors import InvalidArgument
from msgtable.latency import LatencySnapshot
from msgtable.status import PushStatus, TableStatus

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

PREFIX = "msgtable_"
LABELS = ("keyspace", "table", "subscription")

# (family name without prefix and suffix, TableStatus field, help)
COUNTERS = (
    ("messages_sent", "sent", "Messages sent to subscribers (each send of a message counts)."),
    ("messages_redelivered", "redelivered", "Sends of messages that had been sent before."),
    ("messages_released", "released", "Messages released back to be sent again."),
    ("messages_rejected", "rejected", "Messages rejected by a subscriber."),
    ("messages_renewed", "renewed", "Messages whose ack wait a subscriber renewed."),
    ("messages_dead_lettered", "dead_lettered", "Messages that died: rejected or out of attempts."),
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


class MetricsSource(Protocol):
    """What the collector reads (msgtable.engine.MessageEngine)."""

    keyspace: str
    lease_gains: int  # times it gained the lease: each a tenure whose counters start at 0
    lease_losses: int  # odd while a loss replaces a table's managers (a seqlock)
    postpones_skipped: int  # postpones a demotion noticed too late did not write
    binlog: Any  # msgtable.binlog.BinlogFollower | None
    capture: Any  # msgtable.capture.CaptureFollower | None
    store: Any  # msgtable.store.MySQLStore counts its failed statements

    @property
    def leading(self) -> bool: ...

    @property
    def lease_late_renewals(self) -> int: ...

    def sends(self, table: str) -> bool: ...

    def database_error(self) -> str: ...

    def live_statuses(self) -> list[tuple[TableStatus, LatencySnapshot]]: ...

    def push_status(self, table: str, subscription: str) -> PushStatus | None: ...

    def backlog(self, max_age_s: float = ..., wait_s: float | None = ...) -> list[Backlog]: ...

    def delivery_delays(self) -> dict[tuple[str, str], LatencySnapshot]: ...


class EngineCollector(Collector):
    """The engine's metric families, built from its counters when scraped."""

    def __init__(self, engine: MetricsSource, streams: Callable[[], int] | None = None) -> None:
        self.engine = engine
        self.streams = streams  # the gRPC server's open MessageStream calls (None: no server)
        self.backlog_max_age_s = DEFAULT_MAX_AGE_S

    def describe(self) -> Iterator[Metric]:
        return iter(())  # the families are only known at scrape time

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        # the counters and the lease gauges of one tenure: a loss (its tables reopened,
        # counters at 0) or a gain while the tables are read means reading them again
        for _ in range(10):  # a loss's odd window is a few dict operations long
            tenure = (engine.leading, engine.lease_gains, engine.lease_losses)
            live = engine.live_statuses()
            sending = {s.name: engine.sends(s.name) for s, _ in live if not s.subscription}
            steady = tenure[2] % 2 == 0  # no loss was half done when it began
            if steady and (engine.leading, engine.lease_gains, engine.lease_losses) == tenure:
                break
        leading, gains_now, _ = tenure
        live.sort(key=lambda x: (x[0].name, x[0].subscription))
        statuses = [s for s, _ in live]
        for name, field, doc in COUNTERS:
            c = CounterMetricFamily(PREFIX + name, doc, labels=LABELS)
            for s in statuses:
                c.add_metric(_labels(s), getattr(s, field))
            yield c
        c = CounterMetricFamily(
            PREFIX + "messages_acked",
            "Messages acked: via grpc (MessageAck) or dml (another client's UPDATE, as the "
            "binlog showed it).",
            labels=(*LABELS, "via"),
        )
        for s in statuses:
            c.add_metric((*_labels(s), "grpc"), s.acked - s.acked_dml)
            c.add_metric((*_labels(s), "dml"), s.acked_dml)
        yield c
        c = CounterMetricFamily(
            PREFIX + "messages_enqueued",
            "Rows other clients inserted into the table, as the binlog follower counted them.",
            labels=LABELS,
        )
        if engine.binlog is not None:
            for s in statuses:
                if not s.subscription:  # a subscription's rows are the table's
                    c.add_metric(_labels(s), s.enqueued)
        yield c
        for name, field, doc in GAUGES:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=LABELS)
            for s in statuses:
                g.add_metric(_labels(s), getattr(s, field))
            yield g
        h = HistogramMetricFamily(
            PREFIX + "message_ack_latency_seconds",
            "Time from a message's send to its ack (by MessageAck or DML) while in flight.",
            labels=LABELS,
        )
        for s, (buckets, sum_s) in live:
            h.add_metric(_labels(s), buckets, sum_s)
        yield h
        h = HistogramMetricFamily(
            PREFIX + "message_delivery_delay_seconds",
            "Time from a message's time_created to its first send.",
            labels=LABELS,
        )
        delays = engine.delivery_delays()
        for s in statuses:
            d = delays.get((s.name, s.subscription))
            cfg = s.config
            if d is not None and cfg is not None and cfg.has_column("time_created"):
                h.add_metric(_labels(s), *d)
        yield h
        pushes = [(s, engine.push_status(s.name, s.subscription)) for s in statuses]
        for name, field, doc in PUSH_COUNTERS:
            c = CounterMetricFamily(PREFIX + name, doc, labels=LABELS)
            for s, p in pushes:
                if p is not None:
                    c.add_metric(_labels(s), getattr(p, field))
            yield c
        g = GaugeMetricFamily(
            PREFIX + "push_in_flight", "Pushes waiting for their endpoint's answer.", labels=LABELS
        )
        for s, p in pushes:
            if p is not None:
                g.add_metric(_labels(s), p.in_flight)
        yield g
        yield from self._backlog_families()
        g = GaugeMetricFamily(
            PREFIX + "table_sender",
            "1 while this server sends the table (it holds the table's lease), else 0.",
            labels=LABELS,
        )
        for st in statuses:
            if not st.subscription:
                g.add_metric(_labels(st), 1 if sending.get(st.name) else 0)
        yield g
        ks = engine.keyspace
        yield _per_keyspace(
            GaugeMetricFamily,
            "lease_holder",
            "1 while this server sends any table (it holds a table's lease), else 0.",
            ks,
            1 if leading else 0,
        )
        yield _per_keyspace(
            CounterMetricFamily,
            "lease_gains",
            "Times this server gained a table's lease: each starts a tenure of the table whose "
            "counters start again at 0.",
            ks,
            gains_now,
        )
        yield _per_keyspace(
            CounterMetricFamily,
            "lease_late_renewals",
            "Lease renewals that came back after the validity they gave: sends paused until "
            "the next one (a loaded machine, or a --lease-period too short for it).",
            ks,
            engine.lease_late_renewals,
        )
        yield _per_keyspace(
            CounterMetricFamily,
            "postpones_skipped",
            "Sent messages whose postpone a lost lease noticed too late did not write: their "
            "send is not counted in the table (epoch), and they go out again after the next "
            "holder's hold.",
            ks,
            engine.postpones_skipped,
        )
        yield from self._server_families()

    def _backlog_families(self) -> Iterator[Metric]:
        """The backlog gauges: read from the database at most once per backlog_max_age_s
        (msgtable.backlog), whatever the scrape interval; the last read while it is away, or
        while a read takes longer than SCRAPE_WAIT_S (the read goes on for the next scrape)."""
        backlog = self.engine.backlog(self.backlog_max_age_s, wait_s=SCRAPE_WAIT_S)
        ks = self.engine.keyspace
        due = GaugeMetricFamily(
            PREFIX + "messages_due",
            "Unacked messages due now (time_next <= now), waiting to be sent.",
            labels=LABELS,
        )
        scheduled = GaugeMetricFamily(
            PREFIX + "messages_scheduled",
            "Unacked messages due later: delayed, or backing off after a send.",
            labels=LABELS,
        )
        oldest = GaugeMetricFamily(
            PREFIX + "oldest_unacked_age_seconds",
            "Age (now - time_created) of the oldest unacked message; 0 when none.",
            labels=LABELS,
        )
        for b in backlog:
            labels = (ks, b.table, b.subscription)
            due.add_metric(labels, b.due)
            scheduled.add_metric(labels, b.scheduled)
            if b.by_age:  # a table without time_created has no age
                oldest.add_metric(labels, b.oldest_unacked_age_s or 0.0)
        yield due
        yield scheduled
        yield oldest

    def _server_families(self) -> Iterator[Metric]:
        engine, ks = self.engine, (self.engine.keyspace,)
        up = GaugeMetricFamily(
            PREFIX + "database_up",
            "1 while the database answers, 0 while the server waits for it.",
            labels=("keyspace",),
        )
        up.add_metric(ks, 0 if engine.database_error() else 1)
        yield up
        latency = getattr(engine.store, "statement_latency_snapshot", None)
        if latency is not None:
            h = HistogramMetricFamily(
                PREFIX + "database_statement_duration_seconds",
                "How long the server's database statements took, by kind (poll, claim, ack...).",
                labels=("keyspace", "kind"),
            )
            for kind, (buckets, sum_s) in sorted(latency().items()):
                h.add_metric((engine.keyspace, kind), buckets, sum_s)
            yield h
        failed = getattr(engine.store, "database_errors", None)
        if failed is not None:
            errors = CounterMetricFamily(
                PREFIX + "database_errors",
                "Statements that failed: the database away, a deadlock, a lock wait timeout...",
                labels=("keyspace",),
            )
            errors.add_metric(ks, failed)
            yield errors
        if self.streams is not None:
            streams = GaugeMetricFamily(
                PREFIX + "streams", "MessageStream calls open on this server.", labels=("keyspace",)
            )
            streams.add_metric(ks, self.streams())
            yield streams
        if engine.binlog is not None:
            b = GaugeMetricFamily(
                PREFIX + "binlog_following",
                "1 while the binlog follower reads the binlog, 0 while it polls only or retries.",
                labels=("keyspace",),
            )
            b.add_metric(ks, 1 if engine.binlog.following.is_set() else 0)
            yield b
            events = CounterMetricFamily(
                PREFIX + "binlog_row_events",
                "Row events the binlog follower read.",
                labels=("keyspace",),
            )
            events.add_metric(ks, engine.binlog.events)
            yield events
            lag_s = engine.binlog.lag_s
            if lag_s is not None:
                lag = GaugeMetricFamily(
                    PREFIX + "binlog_lag_seconds",
                    "How far the binlog follower is behind: now - its last event's time, "
                    "0 when caught up.",
                    labels=("keyspace",),
                )
                lag.add_metric(ks, lag_s)
                yield lag
        f = engine.capture
        if f is not None and f.following.is_set():
            lag = GaugeMetricFamily(
                PREFIX + "capture_lag_seconds",
                "How far the table-events follower is behind the binlog's newest event.",
                labels=("keyspace",),
            )
            lag.add_metric(ks, float(f.lag_s))
            yield lag


def _per_keyspace(
    family: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    doc: str,
    keyspace: str,
    value: float,
) -> Metric:
    """A family of one sample, labelled with the server's keyspace."""
    f = family(PREFIX + name, doc, labels=("keyspace",))
    f.add_metric((keyspace,), value)
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
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"--metrics-listen {listen!r}: expected HOST:PORT, e.g. 0.0.0.0:9464")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)


class MetricsServer:
    """``/metrics`` over HTTP on its own thread (prometheus_client's server)."""

    def __init__(
        self,
        engine: MetricsSource | None,
        listen: str,
        streams: Callable[[], int] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """The engine's families; or, with ``registry`` (msgtable.gateway's), those."""
        self.host, self.port = parse_listen(listen)
        self.engine = engine
        if registry is None:
            assert engine is not None
            registry = registry_for(engine, streams)
        self.registry = registry
        self._lock = threading.Lock()
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """Where it listens (the port bound, when asked for port 0)."""
        server = self._server
        port = server.server_port if server is not None else self.port
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{port}"

    def open(self) -> None:
        from prometheus_client import start_http_server

        with self._lock:
            if self._server is not None:
                return
            binlog = getattr(self.engine, "binlog", None)
            if binlog is not None:  # msgtable_messages_enqueued_total counts rows from now on
                binlog.count_rows = True
            try:
                self._server, self._thread = start_http_server(
                    self.port, addr=self.host, registry=self.registry
                )
            except (OSError, ValueError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise InvalidArgument(
                    f"--metrics-listen {self.host}:{self.port}: cannot listen there ({why})"
                ) from None

    def close(self) -> None:
        with self._lock:
            server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join()

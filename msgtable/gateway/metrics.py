"""What ``msgtable gateway --metrics-listen HOST:PORT`` serves at /metrics (Prometheus text).

The gateway keeps no state of the messages, so its families are about its own work: what it
relayed from each shard, what each shard's settlement calls changed, the calls a shard
failed, the streams open and the strays remembered (msgtable.gateway.strays). The tables' own
figures (backlog, in flight, latencies) are each shard's servers' (msgtable.observe.metrics). Labels
name only real tables (those a shard sent a batch of), the keyspace file's shards and the
API's methods.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge
from prometheus_client.registry import CollectorRegistry

SETTLE_METHODS = ("MessageAck", "MessageRelease", "MessageReject", "MessageRenew")


class GatewayMetrics:
    """The gateway's counters, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.relayed = Counter(
            "msgtable_gateway_messages_relayed",
            "Messages the gateway relayed from a shard's stream to a subscriber.",
            ("table", "shard"),
            registry=self.registry,
        )
        self.settled = Counter(
            "msgtable_gateway_messages_settled",
            "Messages a shard said a settlement call through the gateway changed, by method "
            "(MessageAck: acked).",
            ("method", "shard"),
            registry=self.registry,
        )
        self.shard_errors = Counter(
            "msgtable_gateway_shard_errors",
            "Calls to a shard's servers that failed (after their retries), by method.",
            ("method", "shard"),
            registry=self.registry,
        )
        self._streams = Gauge(
            "msgtable_gateway_streams",
            "MessageStream calls open on the gateway.",
            registry=self.registry,
        )
        self._strays = Gauge(
            "msgtable_gateway_strays",
            "Messages a shard sent that are not its own, remembered for their acks.",
            registry=self.registry,
        )

    def watch(self, streams: Callable[[], int], strays: Callable[[], int]) -> None:
        """Read the open streams and the strays at each scrape."""
        self._streams.set_function(lambda: float(streams()))
        self._strays.set_function(lambda: float(strays()))

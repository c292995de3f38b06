"""What msgtable allows, and where it listens, at its edges: one home for each limit and
default that more than one module (or the README's Limits table) names."""

from __future__ import annotations

# Where the server listens and the clients connect by default (loopback: see Security).
DEFAULT_ADDRESS = "127.0.0.1:50051"

# Ids in one MessageAck; the client's ack_async and the Spark stream send at most this many a
# call, and the server merges concurrent acks up to it (group commit).
MAX_ACK_IDS = 10_000

# A request's size; larger ones are RESOURCE_EXHAUSTED (by gRPC).
MAX_REQUEST_BYTES = 4 * 1024 * 1024

# A subscriber's window (MessageStreamRequest.max_in_flight, msgtable.core.window).
DEFAULT_MAX_IN_FLIGHT = 1_000
MAX_IN_FLIGHT = 1_000_000
# the most messages one stream may ask to be sent in all (MessageStreamRequest.max_messages)
MAX_MESSAGES = 2**32 - 1

# Batches claimed for a subscriber but not yet taken by its stream; with more, the next
# subscriber gets the batch.
SUBSCRIBER_BUFFER_BATCHES = 2

# Streams a server takes before RESOURCE_EXHAUSTED (msgtable serve flags).
DEFAULT_MAX_SUBSCRIBERS_PER_TABLE = 1_000
DEFAULT_MAX_STREAMS_PER_CLIENT = 64

# A server's lease period (msgtable serve --lease-period, msgtable.engine.lease), and the
# grace a stopping server gives its streams (msgtable.server.servicer).
DEFAULT_LEASE_PERIOD_S = 5.0
DEFAULT_GRACE_S = 5.0

# How long a stopping server waits for the database's part of its way out (the postpones of
# what it sent, the lease given back): past that it ends anyway and says what it left.
SHUTDOWN_DATABASE_S = 10.0

# Rows a statement of the purger deletes, and sent rows whose postpone one pass writes.
PURGE_BATCH_ROWS = 500
MAX_POSTPONE_IDS = 10_000

# Settlement (msgtable.core.settlement): a reason's length, a release's delay and a renew's
# extension (at most 12 hours, as SQS's visibility timeout).
MAX_REASON_CHARS = 1_000
MAX_SETTLE_DELAY_S = 12 * 3600.0

# msgtable.enqueue's delay_s: about 100 years (time_next, in unix ns, must fit a bigint).
MAX_ENQUEUE_DELAY_S = 100 * 365 * 86400.0

# Dead letters one Redrive call moves (one transaction), and msgtable redrive's batch.
MAX_REDRIVE_BATCH = 10_000
DEFAULT_REDRIVE_BATCH = 500
# Dead letters one ListDeadLetters call returns (and without a limit).
MAX_DEAD_LETTERS_LISTED = 10_000
DEFAULT_DEAD_LISTED = 100
# ListTables and ListDeadLetters count at most this many dead messages of a table (then
# "at least"): the count reads an index range of the unacked rows.
COUNT_DEAD_CAP = 100_000
# A subscription's lag (its unsettled messages) is counted up to this many (then "at least").
LAG_CAP = 1_000_000
# The clean-up of a subscription's state rows whose message row was purged while it did not
# hold its table reads this many of its unsettled rows each discovery.
ORPHAN_STEP_ROWS = 5_000

# A name in a request (table, keyspace, subscription, shard: msgtable.server.wire): MySQL's
# identifier limit; a longer one names nothing and is refused before any lookup.
MAX_NAME_CHARS = 64
# A status message's length (msgtable.server.wire.bounded): user text quoted in it is cut, so a
# reply's metadata stays within HTTP/2's header limits (8 KB by default in gRPC clients).
MAX_STATUS_CHARS = 1_000

# msgtable gateway: seconds a shard's servers have to answer a call or open a stream
DEFAULT_GATEWAY_TIMEOUT_S = 10.0
# msgtable gateway: seconds a shard has to answer its part of an ack or settlement call;
# past it those ids are answered unreached, so a shard away holds up no other shard's acks
GATEWAY_SETTLE_TIMEOUT_S = 2.0

"""The Python client of a msgtable server: subscribe to a message table, ack, list tables.

    with Client("127.0.0.1:50051") as client:
        with client.subscribe("my_message") as sub:
            for message in sub:
                handle(message.values)
                message.ack()

For throughput, ack whole batches without waiting: ``ack_async`` queues the ids and a
background thread sends them, merging the acks queued while one MessageAck is on the wire
into the next call (at most MAX_ACK_IDS ids a call), so a busy subscriber makes far fewer
calls than it acks batches::

    for batch in sub.batches():
        handle(batch)
        sub.ack_async(batch)     # returns at once; sub.flush_acks() waits for all of them

Errors come back as the server's classes (msgtable.errors): TableNotFound, TableLoadError,
InvalidArgument, Unavailable (unreachable server, shutdown, time-out, too many streams),
and MsgtableError for anything else. Values are decoded by column type as described in
msgtable.core.codec: dates and times stay text.

The package: client.py (Client), subscriber.py (Subscriber: messages and acks), stream.py
(its MessageStream, opened again when it breaks), acks.py (ack_async's queue), message.py
(Message), router.py (channels, the leader, retries), credentials.py (TLS, tokens), codes.py
(status codes back to errors), requests.py (the requests, built once for both clients).
The asyncio client (msgtable.aio) shares router.Route, requests, codes and leaser.Leases.

Modules:
    acks         Acks sent without waiting
    client       The Client
    codes        Status codes back to msgtable's errors
    credentials  What a client's channels carry to prove who it is
    effects      Effects exactly once
    leaser       Automatic renewal of the messages a subscriber holds
    message      One message a subscriber received
    requests     The requests both clients send, built in one place
    router       Where a client's calls go
    stream       A subscriber's MessageStream, opened again by itself when it breaks for a
    subscriber   A subscriber as the client holds it
"""

from __future__ import annotations

from msgtable.client.acks import DEFAULT_ACK_LINGER_S, AckQueue
from msgtable.client.client import DEFAULT_RETRY_FOR_S, DEFAULT_TIMEOUT_S, Client
from msgtable.client.codes import ERRORS_BY_CODE, error_from_rpc
from msgtable.client.message import Message
from msgtable.client.subscriber import Subscriber
from msgtable.core.codec import Field, ServerStatus, TableInfo, TableSettings
from msgtable.limits import DEFAULT_ADDRESS, MAX_ACK_IDS

# The former name of Subscriber (what client.subscribe() returns), kept for code written
# against msgtable 0.1; "subscription" is kept free for subscriptions to come.
Subscription = Subscriber

__all__ = [
    "DEFAULT_ACK_LINGER_S",
    "DEFAULT_ADDRESS",
    "DEFAULT_RETRY_FOR_S",
    "DEFAULT_TIMEOUT_S",
    "ERRORS_BY_CODE",
    "MAX_ACK_IDS",
    "AckQueue",
    "Client",
    "Field",
    "Message",
    "ServerStatus",
    "Subscriber",
    "Subscription",
    "TableInfo",
    "TableSettings",
    "error_from_rpc",
]

"""The asyncio client of a msgtable server, on grpc.aio:

    async with Client("127.0.0.1:50051") as client:
        async with client.subscribe("my_message") as sub:
            async for message in sub:
                handle(message.values)
                await message.ack()

What the sync client (msgtable.client) offers, as coroutines, with the same arguments, the
same retries and leader following (the shared msgtable.client.router.Route), the same
requests (msgtable.client.requests) and the same errors (msgtable.client.codes maps status
codes to msgtable.errors for both).

Modules:
    client      The asyncio Client
    router      Where the asyncio client's calls go
    subscriber  An asyncio subscriber
"""

from __future__ import annotations

from msgtable.aio.client import Client
from msgtable.aio.subscriber import Message, Subscriber

__all__ = ["Client", "Message", "Subscriber"]

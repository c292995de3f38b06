"""A subscriber's MessageStream, opened again by itself when it breaks for a passing reason.

When the stream breaks for a reason that passes (the server restarted or shut down, the
database is away, a limit, another server became the leader: the router's ``should_retry``)
it is opened again with backoff (msgtable.client.router), going to the leader a NotLeader
answer names. After ``retry_for_s`` without a stream, or for any other error (table dropped or
not found, not allowed), the error is raised. Closing the client ends it quietly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from msgtable.client.codes import error_from_rpc
from msgtable.client.router import Router, table_key
from msgtable.core.retry import Retry
from msgtable.errors import MsgtableError, Unavailable
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

log = logging.getLogger("msgtable.client")


class Stream:
    """One MessageStream that opens itself again (see the module docstring). ``on_open``
    gets the first response of each stream opened (its fields)."""

    def __init__(
        self,
        router: Router,
        request: pb.MessageStreamRequest,
        *,
        first_timeout_s: float | None,
        retry: bool,
        retry_for_s: float | None,
        on_open: Callable[[pb.MessageStreamResponse], None],
        follow: bool = False,
    ) -> None:
        self.name = request.name
        self.reconnects = 0  # how many times the stream was opened again
        self.target = ""  # the server the current stream goes to
        self.closed = False  # no more responses wanted (close() of the subscriber)
        self._router = router
        self._request = request
        self._first_timeout_s = first_timeout_s
        self._retry = retry
        self._follow = follow  # without retry: still go where the servers send it
        self._retry_for_s = retry_for_s
        self._on_open = on_open
        self._closing = threading.Event()
        self._call: Any = None
        # what the stream's limit (max_messages) leaves to receive; None: no limit. A stream
        # opened again asks for what is left, and none once nothing is.
        self._left: int | None = request.max_messages or None

    def open(self, broken: MsgtableError | None = None) -> pb.MessageStreamResponse | None:
        """Open the stream (again, after ``broken``), retrying what passes; its first
        response (None: closed meanwhile). Raises the error that does not pass, or the last
        one after retry_for_s."""
        if broken is not None and self._left is not None:
            if self._left <= 0:  # every message it asked for came: nothing more will
                self.closed = True
                return None
            self._request.max_messages = self._left
        router = self._router
        retry = Retry(f"stream of {self.name}", log, router.backoff)
        error = broken
        started = time.monotonic()
        target = self.target  # where the last attempt went
        while True:
            if error is not None:
                if router.closed:  # closing the client ends its subscribers
                    if broken is None:
                        raise error
                    self.closed = True
                    return None
                delay = router.reopen_delay(
                    error,
                    target,
                    retry,
                    retrying=self._retry,
                    following=self._follow,
                    started=started,
                    retry_for_s=self._retry_for_s,
                    key=table_key(self._request),
                )
                if self._closing.wait(delay):
                    return None
            target = router.next_target(table_key(self._request))
            try:
                call = router.invoke(target, "MessageStream", self._request)
                first = self._first_response(call, target)
            except MsgtableError as exc:
                error = exc
                continue
            if self.closed:
                call.cancel()
                return None
            self._call, self.target = call, target
            router.succeeded(target)
            retry.succeeded()
            if broken is not None:
                self.reconnects += 1
            self._on_open(first)
            return first

    def _first_response(self, call: Any, target: str) -> pb.MessageStreamResponse:
        timeout_s = self._first_timeout_s
        timed_out = threading.Event()

        def give_up() -> None:
            timed_out.set()
            call.cancel()

        timer = threading.Timer(timeout_s, give_up) if timeout_s is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            first: pb.MessageStreamResponse = next(call)
        except StopIteration:
            raise Unavailable(f"the server ended the stream of {self.name} at once") from None
        except grpc.RpcError as exc:
            if timed_out.is_set():
                raise Unavailable(
                    f"no answer from the msgtable server at {target} within {timeout_s}s"
                ) from None
            raise error_from_rpc(exc, target) from None
        finally:
            if timer is not None:
                timer.cancel()
        if not first.fields:
            call.cancel()
            raise MsgtableError("the server's first stream response carried no fields")
        return first

    def next(self) -> pb.MessageStreamResponse | None:
        """The next response (a new stream's first one after a reconnect), or None when the
        stream ended because it was closed."""
        try:
            response: pb.MessageStreamResponse = next(self._call)
            if self._left is not None:
                self._left -= len(response.rows)
            return response
        except StopIteration:
            if self.closed:
                return None
            error: MsgtableError = Unavailable(f"the server ended the stream of {self.name}")
        except grpc.RpcError as exc:
            if self.closed:
                return None
            error = error_from_rpc(exc, self.target)
        return self.open(error)

    def cancel(self) -> None:
        """End the stream now (after ``closed`` was set): a retry's wait ends too."""
        self.closed = True
        self._closing.set()
        if self._call is not None:
            self._call.cancel()

"""SQS's JSON protocol as the current AWS SDKs speak it: a request, its parameters checked,
and SQS's error shapes, with the one table from msgtable's errors to SQS's codes.

A request is ``POST /`` with ``X-Amz-Target: AmazonSQS.<Action>``, a body of
``application/x-amz-json-1.0`` holding one JSON object of the action's parameters. An error
is HTTP 4xx/5xx with ``{"__type": "com.amazonaws.sqs#<Code>", "message": ...}`` and the
header ``x-amzn-query-error: <query code>;Sender`` (SQS's older query protocol's code: the
SDKs, being query-compatible for SQS, name the exception by it), as SQS answers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from msgtable.errors import (
    InvalidArgument,
    MsgtableError,
    NotLeader,
    PermissionDenied,
    ResourceExhausted,
    TableLoadError,
    TableNotFound,
    Unauthenticated,
    Unavailable,
)

JSON_CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
ERROR_NAMESPACE = "com.amazonaws.sqs#"
MAX_REQUEST_BODY_BYTES = 2 * 1024 * 1024  # a batch of ten of the largest bodies, and room

# SQS's error codes and the query protocol's codes the x-amzn-query-error header carries
# (where they differ); every other code is its own query code.
QUERY_CODES = {
    "QueueDoesNotExist": "AWS.SimpleQueueService.NonExistentQueue",
    "TooManyEntriesInBatchRequest": "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
    "EmptyBatchRequest": "AWS.SimpleQueueService.EmptyBatchRequest",
    "BatchEntryIdsNotDistinct": "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
    "InvalidBatchEntryId": "AWS.SimpleQueueService.InvalidBatchEntryId",
    "BatchRequestTooLong": "AWS.SimpleQueueService.BatchRequestTooLong",
    "MessageNotInflight": "AWS.SimpleQueueService.MessageNotInflight",
    "UnsupportedOperation": "AWS.SimpleQueueService.UnsupportedOperation",
    "PurgeQueueInProgress": "AWS.SimpleQueueService.PurgeQueueInProgress",
    "QueueNameExists": "QueueAlreadyExists",
}
NO_QUEUE = "The specified queue does not exist."


class SqsError(Exception):
    """An answer in SQS's error shape: its code, message and HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    @property
    def fault(self) -> str:
        return "Sender" if self.status < 500 else "Receiver"

    def body(self) -> bytes:
        return json.dumps({"__type": ERROR_NAMESPACE + self.code, "message": self.message}).encode()

    def headers(self) -> list[tuple[str, str]]:
        return [("x-amzn-query-error", f"{QUERY_CODES.get(self.code, self.code)};{self.fault}")]


def invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


# The one mapping from msgtable's errors to SQS's (the first class in an error's MRO wins).
ERROR_CODES: dict[type[MsgtableError], tuple[str, int]] = {
    TableNotFound: ("QueueDoesNotExist", 400),
    TableLoadError: ("QueueDoesNotExist", 400),
    InvalidArgument: ("InvalidParameterValue", 400),
    Unauthenticated: ("InvalidClientTokenId", 403),
    PermissionDenied: ("AccessDenied", 403),
    ResourceExhausted: ("OverLimit", 403),
    NotLeader: ("ServiceUnavailable", 503),
    Unavailable: ("ServiceUnavailable", 503),
    MsgtableError: ("InternalFailure", 500),
}


def sqs_error(error: MsgtableError) -> SqsError:
    """A domain error as SQS answers it (its message is meant for users, as over gRPC)."""
    for cls in type(error).__mro__:
        if cls in ERROR_CODES:
            code, status = ERROR_CODES[cls]
            message = str(error)
            if code == "QueueDoesNotExist" and isinstance(error, TableNotFound):
                message = f"{NO_QUEUE} ({error})"
            return SqsError(code, message, status)
    return SqsError("InternalFailure", "internal server error", 500)


class Params:
    """One request's parameters, read with SQS's checks (InvalidParameterValue, or
    MissingParameter for a required one that is absent)."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw

    def has(self, name: str) -> bool:
        return self.raw.get(name) is not None

    def text(self, name: str, required: bool = False, default: str = "") -> str:
        value = self.raw.get(name)
        if value is None:
            if required:
                raise SqsError(
                    "MissingParameter", f"The request must contain the parameter {name}."
                )
            return default
        if not isinstance(value, str):
            raise invalid(f"Value for parameter {name} is invalid. Reason: must be a string.")
        return value

    def integer(self, name: str, low: int, high: int, default: int | None = None) -> int | None:
        value = self.raw.get(name)
        if value is None:
            return default
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (isinstance(value, float) and (not math.isfinite(value) or value != int(value)))
        ):
            raise invalid(
                f"Value {_shown(value)} for parameter {name} is invalid. Reason: must be an "
                "integer."
            )
        if not low <= int(value) <= high:
            raise invalid(
                f"Value {int(value)} for parameter {name} is invalid. Reason: Must be between "
                f"{low} and {high}, if provided."
            )
        return int(value)

    def strings(self, name: str) -> list[str]:
        value = self.raw.get(name)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise invalid(
                f"Value for parameter {name} is invalid. Reason: must be a list of strings."
            )
        return value

    def mapping(self, name: str) -> dict[str, Any]:
        value = self.raw.get(name)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise invalid(f"Value for parameter {name} is invalid. Reason: must be a map.")
        return value

    def entries(self, name: str = "Entries") -> list[Params]:
        """A batch's entries, with SQS's checks of their number and ids."""
        value = self.raw.get(name)
        if not value:
            raise SqsError(
                "EmptyBatchRequest",
                "There should be at least one SendMessageBatchRequestEntry in the request.",
            )
        if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
            raise invalid(
                f"Value for parameter {name} is invalid. Reason: must be a list of entries."
            )
        if len(value) > 10:
            raise SqsError(
                "TooManyEntriesInBatchRequest",
                f"Maximum number of entries per request are 10. You have sent {len(value)}.",
            )
        ids = [e.get("Id") for e in value]
        for i in ids:
            if not isinstance(i, str) or not _batch_id_ok(i):
                raise SqsError(
                    "InvalidBatchEntryId",
                    "A batch entry id can only contain alphanumeric characters, hyphens and "
                    "underscores. It can be at most 80 letters long.",
                )
        if len(set(ids)) != len(ids):
            raise SqsError(
                "BatchEntryIdsNotDistinct",
                "Two or more batch entries in the request have the same Id.",
            )
        return [Params(e) for e in value]


def _batch_id_ok(text: str) -> bool:
    return 0 < len(text) <= 80 and all(c.isascii() and (c.isalnum() or c in "-_") for c in text)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_body(body: bytes) -> dict[str, Any]:
    """A request's JSON object (SerializationException for anything else, as SQS)."""
    try:
        doc = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        raise SqsError("SerializationException", "the request body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise SqsError("SerializationException", "the request body must be a JSON object")
    return doc

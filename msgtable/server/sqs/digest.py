"""The digests SQS answers with, exactly as SQS computes them (the SDKs check them).

``MD5OfBody`` / ``MD5OfMessageBody`` is the hex MD5 of the body's UTF-8 bytes (the AWS SDK
for JavaScript v3 refuses an answer whose digest differs; botocore checked it too in the
query protocol's days). ``MD5OfMessageAttributes`` is the hex MD5 of the attributes in a
canonical binary form: sorted by name, each as its name, its data type and its value, every
one of those a 4-byte big-endian length and the bytes, the value preceded by one byte of its
transport type (1: a string, which String and Number types carry; 2: binary).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

STRING_TRANSPORT = 1
BINARY_TRANSPORT = 2


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def md5_of_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> str:
    """The MD5 of message attributes as the wire carries them: ``{name: {"DataType": ...,
    "StringValue": str} or {"DataType": ..., "BinaryValue": bytes}}``."""
    h = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        attr = attributes[name]
        _field(h, name.encode("utf-8"))
        _field(h, str(attr["DataType"]).encode("utf-8"))
        if "BinaryValue" in attr:
            h.update(bytes([BINARY_TRANSPORT]))
            _field(h, bytes(attr["BinaryValue"]))
        else:
            h.update(bytes([STRING_TRANSPORT]))
            _field(h, str(attr["StringValue"]).encode("utf-8"))
    return h.hexdigest()


def _field(h: Any, data: bytes) -> None:
    h.update(struct.pack(">I", len(data)))
    h.update(data)

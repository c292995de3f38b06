"""An SQS message as a row of a message table, and back.

Sending (SendMessage, SendMessageBatch):

* ``MessageBody`` -> the ``message`` column (BODY_COLUMN);
* a message attribute named like one of the table's message columns -> that column (its
  StringValue, or its BinaryValue's bytes);
* any other attribute -> the JSON column ``message_attributes`` (ATTRIBUTES_COLUMN), as SQS
  carries it (``{"name": {"DataType": ..., "StringValue": ...}}``, binary values in base64),
  where the table has one; a table without it refuses such an attribute
  (InvalidParameterValue naming the column to add);
* ``MessageGroupId`` -> the table's vt_order_key column (a ``.fifo`` queue is an ordered
  table); ``MessageDeduplicationId`` -> the table's vt_dedup column (msgtable.core.dedup: a
  duplicate within its window is answered as sent and left out; after the window the id may
  be used again), or else the column ``message_deduplication_id`` (DEDUP_COLUMN) where the
  table has it (its unique index deduplicates for as long as the earlier row is there);
* ``DelaySeconds`` -> ``time_next`` (msgtable.enqueue's delay);
* the id: a new one, made here: a BIGINT id column gets a time-ordered 63-bit id (the
  milliseconds since 2020 in its high bits, then 22 random bits: ids a server makes a
  millisecond apart sort in time, and plain INSERTs' small ids never meet them); a text id
  column a UUID; a binary one a UUID's 16 bytes.

Receiving, a row becomes: ``Body`` the ``message`` column (as text: bytes are decoded as
UTF-8); ``MessageAttributes`` every other message column that is not NULL (Number for a
numeric column, Binary for a binary one, else String) and the attributes kept in
``message_attributes``, as the request's MessageAttributeNames ask; ``MessageId`` the id
(as text; a binary id in hex). A row inserted by plain SQL is a message like any other.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from msgtable.core.tables import Column, TableConfig
from msgtable.server.sqs.protocol import SqsError, invalid

BODY_COLUMN = "message"
ATTRIBUTES_COLUMN = "message_attributes"
DEDUP_COLUMN = "message_deduplication_id"
MAX_ATTRIBUTES = 10
# SQS's: a body's characters (XML 1.0's, as SQS allows them)
_BODY_CHARS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_\-.]{1,256}")
_NUMERIC_TYPES = frozenset(
    {
        "tinyint",
        "smallint",
        "mediumint",
        "int",
        "integer",
        "bigint",
        "decimal",
        "numeric",
        "float",
        "double",
        "real",
        "bit",
        "year",
    }
)
ID_EPOCH_MS = 1_577_836_800_000  # 2020-01-01T00:00:00Z: the time in the ids made here
_RANDOM_BITS = 22


@dataclass(frozen=True)
class Outgoing:
    """One message to send, checked."""

    body: str
    attributes: dict[str, dict[str, Any]]  # as the wire carried them, BinaryValue as bytes
    delay_s: int
    group_id: str | None = None
    dedup_id: str | None = None


@dataclass
class Shape:
    """What the SQS API needs of one table's columns (built once per config)."""

    config: TableConfig
    names: tuple[str, ...] = field(init=False)
    id_column: Column = field(init=False)
    body_index: int | None = field(init=False)
    attributes_index: int | None = field(init=False)
    group_index: int | None = field(init=False)
    dedup_index: int | None = field(init=False)
    attribute_columns: tuple[tuple[int, Column], ...] = field(init=False)

    def __post_init__(self) -> None:
        cols = self.config.message_columns
        self.names = tuple(c.name for c in cols)
        self.id_column = cols[0]
        index = {c.name: i for i, c in enumerate(cols)}
        self.body_index = index.get(BODY_COLUMN)
        self.attributes_index = index.get(ATTRIBUTES_COLUMN)
        self.group_index = index.get(self.config.order_key) if self.config.order_key else None
        self.dedup_index = index.get(dedup_column(self.config))
        special = {0, self.body_index, self.attributes_index, self.group_index, self.dedup_index}
        self.attribute_columns = tuple((i, c) for i, c in enumerate(cols) if i not in special)

    @property
    def has_dedup(self) -> bool:
        return self.config.has_column(dedup_column(self.config))

    # -- sending -------------------------------------------------------------------------
    def row(self, out: Outgoing, new_id: Hashable) -> dict[str, Any]:
        """The columns of one message's row (its group id is msgtable.enqueue's order key)."""
        cfg = self.config
        row: dict[str, Any] = {self.id_column.name: new_id}
        if out.body or cfg.has_column(BODY_COLUMN):
            if not cfg.has_column(BODY_COLUMN):
                raise invalid(f"table {cfg.name} has no {BODY_COLUMN} column for the body")
            row[BODY_COLUMN] = out.body
        extra: dict[str, Any] = {}
        for name, attr in out.attributes.items():
            if name in self.names and name not in row and name not in _RESERVED(cfg):
                value = attr.get("BinaryValue", attr.get("StringValue"))
                row[name] = value
            else:
                extra[name] = _stored(attr)
        if extra:
            if not cfg.has_column(ATTRIBUTES_COLUMN):
                raise invalid(
                    f"table {cfg.name} has no column {next(iter(extra))!r} and no "
                    f"{ATTRIBUTES_COLUMN} column (JSON) for other message attributes"
                )
            row[ATTRIBUTES_COLUMN] = json.dumps(extra, separators=(",", ":"))
        if out.dedup_id is not None:
            row[dedup_column(cfg)] = out.dedup_id
        return row

    def new_id(self, rng: random.Random) -> Hashable:
        col = self.id_column
        if col.is_integer:
            return time_ordered_id(rng)
        if col.is_binary:
            return uuid.UUID(int=rng.getrandbits(128), version=4).bytes
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    # -- receiving -----------------------------------------------------------------------
    def body(self, values: Sequence[object]) -> str:
        if self.body_index is None:
            return ""
        return _text(values[self.body_index])

    def group_id(self, values: Sequence[object]) -> str | None:
        if self.group_index is None or values[self.group_index] is None:
            return None
        return _text(values[self.group_index])

    def dedup_id(self, values: Sequence[object]) -> str | None:
        if self.dedup_index is None or values[self.dedup_index] is None:
            return None
        return _text(values[self.dedup_index])

    def attributes(self, values: Sequence[object], wanted: Sequence[str]) -> dict[str, Any]:
        """The message attributes of a row that ``wanted`` (MessageAttributeNames) asks for,
        as the wire carries them (BinaryValue as bytes)."""
        if not wanted:
            return {}
        out: dict[str, Any] = {}
        for i, col in self.attribute_columns:
            value = values[i]
            if value is not None and _asked(col.name, wanted):
                out[col.name] = _attribute_of(col, value)
        if self.attributes_index is not None and values[self.attributes_index] is not None:
            for name, attr in _kept(values[self.attributes_index]).items():
                if _asked(name, wanted) and name not in out:
                    out[name] = attr
        return out


def _RESERVED(cfg: TableConfig) -> tuple[str, ...]:
    return (BODY_COLUMN, ATTRIBUTES_COLUMN, dedup_column(cfg), cfg.order_key)


def dedup_column(cfg: TableConfig) -> str:
    """Where MessageDeduplicationId goes: the table's vt_dedup column, else DEDUP_COLUMN."""
    return cfg.dedup or DEDUP_COLUMN


def message_id(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        b = bytes(value)
        return str(uuid.UUID(bytes=b)) if len(b) == 16 else b.hex()
    return str(value)


def time_ordered_id(rng: random.Random) -> int:
    """A new BIGINT id (see the module docstring)."""
    ms = int(time.time() * 1000) - ID_EPOCH_MS
    return (ms << _RANDOM_BITS) | rng.getrandbits(_RANDOM_BITS)


def sent_ms_of(value: object) -> int | None:
    """The time in unix ms an id made here was made at (None: not one of them)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    ms = (value >> _RANDOM_BITS) + ID_EPOCH_MS
    now = int(time.time() * 1000)
    return ms if ID_EPOCH_MS + 86_400_000 < ms <= now + 60_000 else None


# -- checks of what a request sends ------------------------------------------------------
def check_body(body: str) -> None:
    bad = _BODY_CHARS.search(body)
    if bad is not None:
        raise SqsError(
            "InvalidMessageContents",
            f"Invalid binary character '#x{ord(bad.group()):X}' was found in the message body, "
            "the set of allowed characters is #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to "
            "#xFFFD | #x10000 to #x10FFFF",
        )


def check_attributes(raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """MessageAttributes as a request sends them, checked; BinaryValue decoded to bytes."""
    if len(raw) > MAX_ATTRIBUTES:
        raise invalid(
            f"Number of message attributes [{len(raw)}] exceeds the allowed maximum "
            f"[{MAX_ATTRIBUTES}]."
        )
    out: dict[str, dict[str, Any]] = {}
    for name, attr in raw.items():
        if (
            not _ATTRIBUTE_NAME.fullmatch(name)
            or ".." in name
            or name.startswith(".")
            or name.endswith(".")
            or name.lower().startswith(("aws.", "amazon."))
        ):
            raise invalid(f"Message attribute name '{name[:256]}' is invalid.")
        if not isinstance(attr, dict):
            raise invalid(f"Message attribute '{name}' must be a map.")
        kind = attr.get("DataType")
        if not isinstance(kind, str) or kind.split(".", 1)[0] not in ("String", "Number", "Binary"):
            raise invalid(
                f"The message attribute '{name}' has an invalid message attribute type, the "
                "set of supported type prefixes is Binary, Number, and String."
            )
        base = kind.split(".", 1)[0]
        if base == "Binary":
            value = attr.get("BinaryValue")
            try:
                data = base64.b64decode(value, validate=True) if isinstance(value, str) else None
            except (binascii.Error, ValueError):
                data = None
            if not data:
                raise invalid(
                    f"The message attribute '{name}' must contain a non-empty value of type "
                    "'Binary'."
                )
            out[name] = {"DataType": kind, "BinaryValue": data}
            continue
        text = attr.get("StringValue")
        if not isinstance(text, str) or not text:
            raise invalid(
                f"The message attribute '{name}' must contain a non-empty message attribute "
                f"value for message attribute type '{base}'."
            )
        if base == "Number":
            try:
                decimal.Decimal(text)
                ok = decimal.Decimal(text).is_finite()
            except decimal.InvalidOperation:
                ok = False
            if not ok:
                raise invalid(
                    f"Can't cast the value of message (user) attribute '{name}' to a number."
                )
        check_body(text)
        out[name] = {"DataType": kind, "StringValue": text}
    return out


def size_of(body: str, attributes: Mapping[str, Mapping[str, Any]]) -> int:
    """A message's size as SQS counts it: the body's bytes and each attribute's name, type
    and value."""
    n = len(body.encode("utf-8"))
    for name, attr in attributes.items():
        n += len(name.encode()) + len(str(attr["DataType"]).encode())
        value = attr.get("BinaryValue")
        n += len(value) if value is not None else len(str(attr["StringValue"]).encode())
    return n


def wire(attributes: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Attributes as the JSON answer carries them (binary values in base64)."""
    out: dict[str, dict[str, str]] = {}
    for name, attr in attributes.items():
        if "BinaryValue" in attr:
            out[name] = {
                "DataType": attr["DataType"],
                "BinaryValue": base64.b64encode(attr["BinaryValue"]).decode(),
            }
        else:
            out[name] = {"DataType": attr["DataType"], "StringValue": attr["StringValue"]}
    return out


# -- helpers -------------------------------------------------------------------------------
def _asked(name: str, wanted: Sequence[str]) -> bool:
    for w in wanted:
        if w in ("All", ".*") or w == name or (w.endswith(".*") and name.startswith(w[:-1])):
            return True
    return False


def _stored(attr: Mapping[str, Any]) -> dict[str, str]:
    if "BinaryValue" in attr:
        return {
            "DataType": attr["DataType"],
            "BinaryValue": base64.b64encode(attr["BinaryValue"]).decode(),
        }
    return {"DataType": attr["DataType"], "StringValue": attr["StringValue"]}


def _kept(value: object) -> dict[str, dict[str, Any]]:
    """The attributes kept in the JSON column (what another writer put there that is not
    an attribute is left out)."""
    try:
        doc = json.loads(value) if isinstance(value, str | bytes | bytearray) else value
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    out: dict[str, dict[str, Any]] = {}
    for name, attr in doc.items():
        if not isinstance(attr, dict) or not isinstance(attr.get("DataType"), str):
            continue
        if isinstance(attr.get("BinaryValue"), str):
            try:
                data = base64.b64decode(attr["BinaryValue"])
            except (binascii.Error, ValueError):
                continue
            out[str(name)] = {"DataType": attr["DataType"], "BinaryValue": data}
        elif isinstance(attr.get("StringValue"), str):
            out[str(name)] = {"DataType": attr["DataType"], "StringValue": attr["StringValue"]}
    return out


def _attribute_of(col: Column, value: object) -> dict[str, Any]:
    if isinstance(value, bytes | bytearray):
        return {"DataType": "Binary", "BinaryValue": bytes(value)}
    if col.data_type in _NUMERIC_TYPES and isinstance(value, int | float | decimal.Decimal):
        return {
            "DataType": "Number",
            "StringValue": str(int(value) if isinstance(value, bool) else value),
        }
    return {"DataType": "String", "StringValue": _text(value)}


def _text(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


_shapes: dict[int, Shape] = {}
_shapes_lock = threading.Lock()


def shape_of(cfg: TableConfig) -> Shape:
    """The shape of a table's config (cached while the config lives)."""
    key = id(cfg)
    with _shapes_lock:
        s = _shapes.get(key)
        if s is not None and s.config is cfg:
            return s
        s = Shape(cfg)
        if len(_shapes) > 4096:
            _shapes.clear()
        _shapes[key] = s
        return s

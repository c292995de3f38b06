"""Pure conversions between Python values and the wire types of msgtable.v1, both ways: the
server's encoders and the client's decoders (rows, ack ids, table status) sit together.

Rows travel as tuples of the values PyMySQL returns (int, float, Decimal, str, bytes,
datetime/date/timedelta, None). Each column gets one encoder, chosen once from its MySQL
type, so the hot path is a loop over ``zip(encoders, row)`` with no per-value type dispatch;
a value of an unexpected Python type (a zero date PyMySQL leaves as text, say) falls back to
the dynamic encoder for that row only.

The client side reads values by FieldType: integers as int, floats as float, DECIMAL as
:class:`decimal.Decimal`, text and JSON as str, binary as bytes, NULL as None. Dates and
times stay in their MySQL text form (``"2024-05-01 12:00:00.250000"``), which is exact
(MySQL allows zero dates and TIME values beyond 24 hours that Python's types cannot hold).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from msgtable.core import sqltypes as mysql
from msgtable.core.deadletters import DeadLetter
from msgtable.core.flow import OWN_LIMITS, REASONS
from msgtable.core.schedules import Missed, Schedule
from msgtable.core.status import PushStatus, TableStatus
from msgtable.core.tables import Column
from msgtable.errors import InvalidArgument
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


class FieldType(enum.IntEnum):
    """How to read a column's values; mirrors the proto enum msgtable.v1.FieldType."""

    UNSPECIFIED = 0
    INT = 1
    UINT = 2
    FLOAT = 3
    DECIMAL = 4
    TEXT = 5
    BYTES = 6
    JSON = 7
    DATETIME = 8
    TIMESTAMP = 9
    DATE = 10
    TIME = 11


_TYPE_BY_DATA_TYPE: dict[str, FieldType] = {
    **dict.fromkeys(mysql.INTEGER_TYPES | {mysql.YEAR}, FieldType.INT),
    **dict.fromkeys(mysql.FLOAT_TYPES, FieldType.FLOAT),
    **dict.fromkeys(mysql.DECIMAL_TYPES, FieldType.DECIMAL),
    **dict.fromkeys(
        mysql.TEXT_TYPES | mysql.CHOICE_TYPES | mysql.MARIADB_TEXT_TYPES, FieldType.TEXT
    ),
    **dict.fromkeys(
        mysql.BINARY_TYPES | mysql.SPATIAL_TYPES | {mysql.BIT, mysql.VECTOR}, FieldType.BYTES
    ),
    mysql.JSON: FieldType.JSON,
    mysql.DATETIME: FieldType.DATETIME,
    mysql.TIMESTAMP: FieldType.TIMESTAMP,
    mysql.DATE: FieldType.DATE,
    mysql.TIME: FieldType.TIME,
}


def field_type(column: Column) -> FieldType:
    """The FieldType of a column, from information_schema's data_type and column_type."""
    kind = _TYPE_BY_DATA_TYPE.get(column.data_type.lower(), FieldType.UNSPECIFIED)
    if kind is FieldType.INT and "unsigned" in column.column_type.lower():
        return FieldType.UINT
    return kind


# -- encoding: Python -> Value ------------------------------------------------------------
# An encoder appends one non-NULL value to a repeated Value field through its ``add``.
Add = Callable[..., Any]
Encoder = Callable[[Add, Any], None]


def format_time(value: datetime.timedelta) -> str:
    """A TIME value (PyMySQL returns a timedelta) in MySQL's ``[-]hh:mm:ss[.ffffff]`` form."""
    micros = (value.days * 86400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    seconds, frac = divmod(abs(micros), 1_000_000)
    minutes, sec = divmod(seconds, 60)
    hours, minute = divmod(minutes, 60)
    text = f"{sign}{hours:02d}:{minute:02d}:{sec:02d}"
    return f"{text}.{frac:06d}" if frac else text


def _add_int(add: Add, v: Any) -> None:
    add(int_value=v)


def _add_uint(add: Add, v: Any) -> None:
    if v > INT64_MAX:
        add(uint_value=v)
    else:
        add(int_value=v)


def _add_double(add: Add, v: Any) -> None:
    add(double_value=v)


def _add_decimal(add: Add, v: Any) -> None:
    add(text_value=format(v, "f"))  # "f": never exponent notation, every digit kept


def _add_text(add: Add, v: Any) -> None:
    add(text_value=v)


def _add_bytes(add: Add, v: Any) -> None:
    add(bytes_value=v)


def _add_datetime(add: Add, v: Any) -> None:
    add(text_value=v.isoformat(" "))


def _add_date(add: Add, v: Any) -> None:
    add(text_value=v.isoformat())


def _add_time(add: Add, v: Any) -> None:
    add(text_value=format_time(v))


def add_any(add: Add, v: object) -> None:
    """Append any supported Python value, dispatching on its type (the slow, general path)."""
    if v is None:
        add(null_value=0)
    elif isinstance(v, bool):
        add(int_value=int(v))
    elif isinstance(v, int):
        if not INT64_MIN <= v <= UINT64_MAX:
            raise ValueError(f"integer {v} does not fit 64 bits")
        _add_uint(add, v)
    elif isinstance(v, float):
        add(double_value=v)
    elif isinstance(v, str):
        add(text_value=v)
    elif isinstance(v, bytes | bytearray | memoryview):
        add(bytes_value=bytes(v))
    elif isinstance(v, decimal.Decimal):
        _add_decimal(add, v)
    elif isinstance(v, datetime.datetime):
        _add_datetime(add, v)
    elif isinstance(v, datetime.date):
        _add_date(add, v)
    elif isinstance(v, datetime.timedelta):
        _add_time(add, v)
    elif isinstance(v, datetime.time):
        add(text_value=v.isoformat())
    elif isinstance(v, set | frozenset):  # a MySQL SET, if the driver split it
        add(text_value=",".join(sorted(str(x) for x in v)))
    else:
        raise TypeError(f"cannot send a value of type {type(v).__name__}")


_ENCODERS: dict[FieldType, Encoder] = {
    FieldType.INT: _add_int,
    FieldType.UINT: _add_uint,
    FieldType.FLOAT: _add_double,
    FieldType.DECIMAL: _add_decimal,
    FieldType.TEXT: _add_text,
    FieldType.BYTES: _add_bytes,
    FieldType.JSON: _add_text,
    FieldType.DATETIME: _add_datetime,
    FieldType.TIMESTAMP: _add_datetime,
    FieldType.DATE: _add_date,
    FieldType.TIME: _add_time,
}


def encode_value(v: object) -> pb.Value:
    """One Python value as a Value (ack ids; tests). Raises TypeError/ValueError."""
    holder = pb.Row()
    add_any(holder.values.add, v)
    return holder.values[0]


# The wire value of each FieldType; built by name, so a FieldType missing from the proto
# fails at import.
_WIRE_TYPES = {t: pb.FieldType.Value(f"FIELD_TYPE_{t.name}") for t in FieldType}


def field_to_proto(column: Column) -> pb.Field:
    return pb.Field(
        name=column.name, type=_WIRE_TYPES[field_type(column)], column_type=column.column_type
    )


class RowEncoder:
    """Encodes the rows of one subscription; built once from its columns."""

    def __init__(self, columns: Sequence[Column]) -> None:
        self.columns = tuple(columns)
        self._encoders = tuple(_ENCODERS.get(field_type(c), add_any) for c in self.columns)

    def fields_response(self, ack_wait_s: float = 0.0) -> pb.MessageStreamResponse:
        """The first response of a stream: the fields and the ack wait, no rows."""
        return pb.MessageStreamResponse(
            fields=[field_to_proto(c) for c in self.columns], ack_wait_s=ack_wait_s
        )

    def rows_response(
        self,
        rows: Iterable[Sequence[object]],
        sent_before: Sequence[int] | None = None,
        sent_ns: int = 0,
    ) -> pb.MessageStreamResponse:
        """One batch of rows (values in column order) as a response; ``sent_before``: how
        many times each was sent before (None: none was); ``sent_ns``: when it is sent."""
        response = pb.MessageStreamResponse(sent_ns=sent_ns)
        add_row = response.rows.add
        encoders = self._encoders
        width = len(encoders)
        for row in rows:
            if len(row) != width:
                raise ValueError(f"row has {len(row)} values for {width} fields")
            add = add_row().values.add
            try:
                for encode, v in zip(encoders, row, strict=True):
                    if v is None:
                        add(null_value=0)
                    else:
                        encode(add, v)
            except (TypeError, ValueError, AttributeError):
                # An unexpected Python type for a column: redo this row the general way.
                del response.rows[-1]
                add = add_row().values.add
                for v in row:
                    add_any(add, v)
        if sent_before is not None:
            for message, n in zip(response.rows, sent_before, strict=True):
                if n:
                    message.sent_before = n
        return response


# -- decoding: Value -> Python ------------------------------------------------------------
Decoder = Callable[[Any], object]


def decode_value(value: pb.Value) -> object:
    """The Python value of a Value by its kind alone; ValueError if no kind is set."""
    kind = value.WhichOneof("kind")
    if kind is None:
        raise ValueError("value has no kind set")
    if kind == "null_value":
        return None
    result: object = getattr(value, kind)
    return result


def _decode_decimal(value: pb.Value) -> object:
    if value.WhichOneof("kind") == "text_value":
        return decimal.Decimal(value.text_value)
    return decode_value(value)


_DECODERS: dict[FieldType, Decoder] = {FieldType.DECIMAL: _decode_decimal}


def decoder_for(kind: FieldType) -> Decoder:
    return _DECODERS.get(kind, decode_value)


def to_field_type(raw: int) -> FieldType:
    """A wire FieldType; values from a newer server read as UNSPECIFIED."""
    try:
        return FieldType(raw)
    except ValueError:
        return FieldType.UNSPECIFIED


class RowDecoder:
    """Decodes the rows of one subscription; built once from the first response's fields."""

    def __init__(self, field_types: Sequence[FieldType]) -> None:
        self._decoders = tuple(decoder_for(t) for t in field_types)

    def decode(self, row: pb.Row) -> tuple[object, ...]:
        values = row.values
        if len(values) != len(self._decoders):
            raise ValueError(f"row has {len(values)} values for {len(self._decoders)} fields")
        return tuple(d(v) for d, v in zip(self._decoders, values, strict=True))


def decode_ids(values: Sequence[pb.Value]) -> list[object]:
    """Ack ids as Python values; ValueError naming the first malformed one."""
    out: list[object] = []
    for i, value in enumerate(values):
        try:
            out.append(decode_value(value))
        except ValueError:
            raise ValueError(f"ids[{i}] has no value set") from None
    return out


# -- table status: the server's encoder and the client's decoder, side by side ------------------
# The settings and counters ListTables carries, by name: the same on both sides of the wire.
_SETTINGS = (
    "ack_wait_s",
    "purge_after_s",
    "batch_size",
    "cache_size",
    "poller_interval_s",
    "min_backoff_s",
    "max_backoff_s",
    "postpone_after_s",
    "max_attempts",
    "dead_letter",
    "order_key",
    "order_by",
    "dedup",
    "dedup_window_s",
)
_COUNTERS = (
    "cached",
    "in_flight",
    "subscribers",
    "sent",
    "acked",
    "released",
    "rejected",
    "renewed",
    "dead_lettered",
    "keys_in_flight",
    "keys_waiting",
    "capture_position",
    "capture_events",
    "capture_problem",
    "hold_s",
    "hold_whole",
    "limits",
    "keys_at_cap",
    "sender",
    "shard",
)

_BACKLOG = ("due", "scheduled", "oldest_unacked_age_s")  # optional: unset when not read


def table_status_to_proto(status: TableStatus) -> pb.TableStatus:
    message = pb.TableStatus(
        name=status.name,
        keyspace=status.keyspace,
        load_error=status.load_error or "",
        dead=-1 if status.dead is None else status.dead,
        subscription=status.subscription,
        state=status.state,
        filter=status.filter,
        lag=-1 if status.lag is None else status.lag,
        oldest_ns=status.oldest_ns or 0,
        holding=status.holding,
        not_holding=status.not_holding,
        unseen=-1 if status.unseen is None else status.unseen,
        capture_lag_s=-1.0 if status.capture_lag_s is None else status.capture_lag_s,
        **{name: getattr(status, name) for name in _COUNTERS},
    )
    if status.cursor_lag is not None:
        message.cursor_lag = status.cursor_lag
    if status.advice:
        message.advice = status.advice
    for name in _BACKLOG:
        if getattr(status, name) is not None:
            setattr(message, name, getattr(status, name))
    for reason, n in status.throttled:  # flow control (msgtable.core.flow)
        setattr(message, "throttled_" + reason, n)
    if status.push is not None:
        message.push.CopyFrom(pb.PushStatus(**dataclasses.asdict(status.push)))
    if status.subscription and status.config is not None:
        message.settings.CopyFrom(
            settings_to_proto(
                filter=status.filter,
                columns=[c.name for c in status.config.message_columns],
                ack_wait_s=status.config.ack_wait_s,
                max_attempts=status.config.max_attempts,
                max_lag=status.max_lag,
                expire_after_s=status.expire_after_s,
                state_rows=status.state_rows or None,
            )
        )
    if status.schedules:
        message.schedules.extend(schedule_to_proto(x) for x in status.schedules)
    config = status.config
    if config is not None:
        message.config.CopyFrom(
            pb.TableConfig(
                layout=config.layout.value,
                message_columns=[field_to_proto(c) for c in config.message_columns],
                capture=config.capture.patterns if config.capture else (),
                capture_kinds=sorted(config.capture.kinds) if config.capture else (),
                **{name: getattr(config, name) for name in _SETTINGS},
            )
        )
    return message


def schedule_to_proto(s: Schedule) -> pb.Schedule:
    return pb.Schedule(
        name=s.name,
        table=s.table,
        cron=s.cron,
        timezone=s.timezone,
        values=json.dumps(dict(s.values), separators=(",", ":")) if s.values else "",
        missed=s.missed.value,
        next_tick_ns=s.next_tick_ns,
        last_tick_ns=s.last_tick_ns or 0,
        last_enqueued_ns=s.last_enqueued_ns or 0,
        ticks=s.ticks,
    )


def schedule_from_proto(message: pb.Schedule) -> Schedule:
    """A schedule as the wire carries it (its values not checked: the server does that)."""
    try:
        values = json.loads(message.values) if message.values else {}
    except ValueError:
        values = {}
    return Schedule(
        name=message.name,
        table=message.table,
        cron=message.cron,
        timezone=message.timezone or "UTC",
        values=values if isinstance(values, dict) else {},
        missed=Missed.ONCE if message.missed == Missed.ONCE.value else Missed.SKIP,
        next_tick_ns=message.next_tick_ns,
        last_tick_ns=message.last_tick_ns or None,
        last_enqueued_ns=message.last_enqueued_ns or None,
        ticks=message.ticks,
    )


def dead_letter_to_proto(dead: DeadLetter) -> pb.DeadLetter:
    return pb.DeadLetter(
        id=encode_value(dead.id),
        time_dead_ns=dead.time_dead_ns or 0,
        attempts=dead.attempts,
        last_error=dead.last_error or "",
    )


def dead_letter_from_proto(message: pb.DeadLetter) -> DeadLetter:
    return DeadLetter(
        id=decode_value(message.id),
        time_dead_ns=message.time_dead_ns or None,
        attempts=message.attempts,
        last_error=message.last_error or None,
    )


@dataclass(frozen=True)
class Field:
    """One streamed column, as a client sees it: its name, how its values are read, and its
    MySQL type."""

    name: str
    type: FieldType
    column_type: str


@dataclass(frozen=True)
class TableSettings:
    """The configuration of a loaded message table, as the server reports it."""

    ack_wait_s: float
    purge_after_s: float
    batch_size: int
    cache_size: int
    poller_interval_s: float
    min_backoff_s: float
    max_backoff_s: float  # 0 means unbounded
    layout: str  # "current" or "2018"
    message_columns: tuple[Field, ...]
    postpone_after_s: float  # vt_postpone_after (0: postponed before the send)
    max_attempts: int = 0  # vt_max_attempts (0: no limit)
    dead_letter: str = ""  # vt_dead_letter ("": dead messages stay in place)
    order_key: str = ""  # vt_order_key ("": not ordered)
    order_by: str = ""  # vt_order_by (id by default when ordered)
    capture: tuple[str, ...] = ()  # vt_capture (): not a capture table)
    capture_kinds: tuple[str, ...] = ()  # vt_capture_kinds
    dedup: str = ""  # vt_dedup, the key column ("": the table does not deduplicate)
    dedup_window_s: float = 0.0  # vt_dedup_window (msgtable.core.dedup)


@dataclass(frozen=True)
class TableInfo:
    """One message table as a server sees it (msgtable.core.status.TableStatus, remotely)."""

    name: str
    keyspace: str
    config: TableSettings | None  # None when the table failed to load
    load_error: str  # "" when the table is loaded
    cached: int
    in_flight: int
    subscribers: int
    sent: int
    acked: int
    released: int = 0
    rejected: int = 0
    renewed: int = 0
    dead_lettered: int = 0  # died since the table was opened: rejected or out of attempts
    dead: int | None = None  # dead messages now (None: not counted, or an older server)
    # a subscription's entry (``name`` is its table): msgtable.core.status.TableStatus says what
    subscription: str = ""
    state: str = ""
    filter: str = ""
    lag: int | None = None
    oldest_ns: int | None = None
    holding: bool = True
    not_holding: str = ""
    unseen: int | None = None  # a table's: rows not handed to its subscriptions yet
    max_lag: int | None = None  # a subscription's (None: no limit)
    expire_after_s: float | None = None
    state_rows: str = ""  # a subscription's: eager or lazy (msgtable.core.subscriptions)
    cursor_lag: int | None = None  # a lazy subscription's: above its cursor, never sent
    advice: str = ""  # a lazy subscription's: what its filter lacks (msgtable.core.status)
    keys_in_flight: int = 0  # an ordered table's keys with a batch in flight
    keys_waiting: int = 0  # and keys whose next messages wait in the server's cache
    push: PushStatus | None = None  # its push endpoint (msgtable.features.push; never the secret)
    # a capture table's (msgtable.core.status.TableStatus says what)
    capture_position: str = ""
    capture_lag_s: float | None = None
    capture_events: int = 0
    capture_problem: str = ""
    due: int | None = None  # the backlog read from the database (None: not read)
    scheduled: int | None = None
    oldest_unacked_age_s: float | None = None
    # seconds left of a takeover's hold (0: none; msgtable.core.status.TableStatus says what)
    hold_s: float = 0.0
    hold_whole: bool = False
    # flow control (msgtable.core.status.TableStatus says what)
    limits: str = ""
    keys_at_cap: int = 0
    throttled: dict[str, int] = dataclasses.field(default_factory=dict)
    sender: str = ""  # the server that sends the table now (msgtable.core.status.TableStatus)
    shard: str = ""  # the keyspace's shard it is in ("": unsharded; msgtable.core.keyspace)
    schedules: tuple[Schedule, ...] = ()  # that enqueue into it (msgtable.core.schedules)

    @property
    def loaded(self) -> bool:
        return not self.load_error


@dataclass(frozen=True)
class ServerStatus:
    """What a server says of itself (ListTables): its tables, and why it cannot reach its
    database now ("" while it can); its SQS API's address ("": not served) and calls by
    action."""

    tables: list[TableInfo]
    database_error: str
    sqs_listen: str = ""
    sqs_calls: dict[str, int] = dataclasses.field(default_factory=dict)


def field_from_proto(message: pb.Field) -> Field:
    return Field(message.name, to_field_type(message.type), message.column_type)


def table_info_from_proto(message: pb.TableStatus) -> TableInfo:
    config = None
    if message.HasField("config"):
        c = message.config
        config = TableSettings(
            layout=c.layout,
            message_columns=tuple(field_from_proto(f) for f in c.message_columns),
            capture=tuple(c.capture),
            capture_kinds=tuple(c.capture_kinds),
            **{name: getattr(c, name) for name in _SETTINGS},
        )
    return TableInfo(
        name=message.name,
        keyspace=message.keyspace,
        config=config,
        load_error=message.load_error,
        dead=message.dead if message.dead >= 0 else None,
        subscription=message.subscription,
        state=message.state,
        filter=message.filter,
        lag=message.lag if message.lag >= 0 and message.subscription else None,
        oldest_ns=message.oldest_ns or None,
        holding=message.holding or not message.subscription,
        not_holding=message.not_holding,
        unseen=message.unseen if message.unseen >= 0 and message.config.ListFields() else None,
        max_lag=message.settings.max_lag if message.settings.HasField("max_lag") else None,
        expire_after_s=(
            message.settings.expire_after_s if message.settings.HasField("expire_after_s") else None
        ),
        state_rows=message.settings.state_rows if message.subscription else "",
        cursor_lag=message.cursor_lag if message.HasField("cursor_lag") else None,
        advice=message.advice,
        push=push_status_from_proto(message.push) if message.HasField("push") else None,
        capture_lag_s=message.capture_lag_s if message.capture_lag_s >= 0 else None,
        **{name: getattr(message, name) for name in _COUNTERS},
        throttled={r: getattr(message, "throttled_" + r) for r in REASONS}
        if message.limits
        else {},
        due=message.due if message.HasField("due") else None,
        scheduled=message.scheduled if message.HasField("scheduled") else None,
        oldest_unacked_age_s=(
            message.oldest_unacked_age_s if message.HasField("oldest_unacked_age_s") else None
        ),
        schedules=tuple(schedule_from_proto(x) for x in message.schedules),
    )


def push_status_from_proto(message: pb.PushStatus) -> PushStatus:
    return PushStatus(
        url=message.url,
        state=message.state,
        in_flight=message.in_flight,
        pushed=message.pushed,
        failed=message.failed,
        max_in_flight=message.max_in_flight,
        timeout_s=message.timeout_s,
    )


def settings_from_proto(settings: pb.SubscriptionSettings, alter: bool = False) -> dict[str, Any]:
    """A request's subscription settings as Subscription fields: create takes every field
    (unset: default); alter only the fields set (0 or "" clears one)."""
    out: dict[str, Any] = {}
    if settings.HasField("filter"):
        out["filter"] = settings.filter.strip()
    if settings.columns or settings.set_columns or not alter:
        out["columns"] = tuple(c.strip() for c in settings.columns if c.strip())
    if settings.HasField("ack_wait_s"):
        out["ack_wait_s"] = settings.ack_wait_s or None
    if settings.HasField("max_attempts"):
        out["max_attempts"] = settings.max_attempts
    if settings.HasField("max_lag"):
        out["max_lag"] = settings.max_lag or None
    if settings.HasField("expire_after_s"):
        out["expire_after_s"] = settings.expire_after_s or None
    given = {f.name for f, _ in settings.ListFields()}  # set, "" included (optional fields)
    if "state_rows" in given:
        if alter:
            raise InvalidArgument(
                "state_rows is chosen when a subscription is created; drop and create it "
                "to change it"
            )
        out["state_rows"] = settings.state_rows.strip().lower() or "eager"
    limits = tuple((k, getattr(settings, k)) for k in OWN_LIMITS if k in given)
    if limits or not alter:  # alter: "" puts one back to the table's
        out["limits"] = limits
    return out


def settings_to_proto(**fields: Any) -> pb.SubscriptionSettings:
    """Subscription settings for a request: the fields given (None: not set)."""
    message = pb.SubscriptionSettings()
    for name in (
        "filter",
        "ack_wait_s",
        "max_attempts",
        "max_lag",
        "expire_after_s",
        "state_rows",
    ):
        if fields.get(name) is not None:
            setattr(message, name, fields[name])
    if fields.get("columns") is not None:
        message.columns.extend(fields["columns"])
        message.set_columns = True
    for name, value in dict(fields.get("limits") or {}).items():
        if name not in OWN_LIMITS:
            raise InvalidArgument(f"unknown limit {name!r} (one of {', '.join(OWN_LIMITS)})")
        setattr(message, name, str(value))
    return message

from __future__ import annotations

import dataclasses
import datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from msgtable.cli import output
from msgtable.core import codec
from msgtable.core.codec import FieldType, RowDecoder, RowEncoder
from msgtable.core.status import PushStatus, TableStatus
from msgtable.core.tables import Column, Layout, TableConfig
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb

COLUMNS = (
    Column("id", "bigint", "bigint(20)"),
    Column("u", "bigint", "bigint(20) unsigned"),
    Column("f", "double", "double"),
    Column("d", "decimal", "decimal(30,9)"),
    Column("t", "varchar", "varchar(128)"),
    Column("b", "varbinary", "varbinary(16)"),
    Column("j", "json", "json"),
    Column("dt", "datetime", "datetime(6)"),
    Column("ts", "timestamp", "timestamp"),
    Column("dd", "date", "date"),
    Column("tm", "time", "time(6)"),
)


def round_trip(
    columns: tuple[Column, ...], rows: list[tuple[object, ...]]
) -> list[tuple[object, ...]]:
    """Encode as the server does, go over the wire, decode as the client does."""
    encoder = RowEncoder(columns)
    fields = pb.MessageStreamResponse.FromString(
        encoder.fields_response().SerializeToString()
    ).fields
    wire = pb.MessageStreamResponse.FromString(encoder.rows_response(rows).SerializeToString())
    decoder = RowDecoder([codec.to_field_type(f.type) for f in fields])
    return [decoder.decode(r) for r in wire.rows]


def test_the_python_field_type_enum_mirrors_the_proto_enum():
    assert {f"FIELD_TYPE_{t.name}": t.value for t in FieldType} == dict(pb.FieldType.items())


@pytest.mark.parametrize(
    ("data_type", "column_type", "expected"),
    [
        ("bigint", "bigint(20)", FieldType.INT),
        ("int", "int(10) unsigned", FieldType.UINT),
        ("tinyint", "tinyint(1)", FieldType.INT),
        ("year", "year(4)", FieldType.INT),
        ("double", "double", FieldType.FLOAT),
        ("decimal", "decimal(10,2)", FieldType.DECIMAL),
        ("varchar", "varchar(10)", FieldType.TEXT),
        ("enum", "enum('a','b')", FieldType.TEXT),
        ("longblob", "longblob", FieldType.BYTES),
        ("bit", "bit(3)", FieldType.BYTES),
        ("json", "json", FieldType.JSON),
        ("datetime", "datetime(6)", FieldType.DATETIME),
        ("timestamp", "timestamp", FieldType.TIMESTAMP),
        ("date", "date", FieldType.DATE),
        ("time", "time", FieldType.TIME),
        ("mystery", "mystery", FieldType.UNSPECIFIED),
    ],
)
def test_a_column_type_maps_to_its_field_type(data_type, column_type, expected):
    assert codec.field_type(Column("c", data_type, column_type)) is expected


def test_the_fields_response_carries_names_types_and_column_types_in_order():
    response = RowEncoder(COLUMNS[:3]).fields_response()
    assert not response.rows
    assert [(f.name, f.type, f.column_type) for f in response.fields] == [
        ("id", pb.FIELD_TYPE_INT, "bigint(20)"),
        ("u", pb.FIELD_TYPE_UINT, "bigint(20) unsigned"),
        ("f", pb.FIELD_TYPE_FLOAT, "double"),
    ]


def test_values_of_every_family_round_trip():
    row = (
        -(2**63),
        2**64 - 1,
        1.5,
        Decimal("12345678901234567890.123456789"),
        "héllo ✓",
        b"\xff\xfe\x00\x80",
        '{"a": [1, 2]}',
        datetime.datetime(2024, 5, 1, 12, 0, 0, 250000),
        datetime.datetime(2024, 5, 1, 12, 0),
        datetime.date(2024, 2, 29),
        datetime.timedelta(hours=-838, seconds=-1, microseconds=-5),
    )
    assert round_trip(COLUMNS, [row]) == [
        (
            -(2**63),
            2**64 - 1,
            1.5,
            Decimal("12345678901234567890.123456789"),
            "héllo ✓",
            b"\xff\xfe\x00\x80",
            '{"a": [1, 2]}',
            "2024-05-01 12:00:00.250000",
            "2024-05-01 12:00:00",
            "2024-02-29",
            "-838:00:01.000005",
        )
    ]


def test_null_round_trips_in_every_column():
    nulls = (None,) * len(COLUMNS)
    assert round_trip(COLUMNS, [nulls]) == [nulls]


def test_unsigned_values_use_uint_only_above_the_signed_range():
    encoder = RowEncoder([Column("u", "bigint", "bigint unsigned")])
    values = [r.values[0] for r in encoder.rows_response([(2**63 - 1,), (2**63,)]).rows]
    assert [v.WhichOneof("kind") for v in values] == ["int_value", "uint_value"]


def test_decimal_keeps_every_digit_and_never_uses_an_exponent():
    column = (Column("d", "decimal", "decimal(65,30)"),)
    rows = [(Decimal("0.10"),), (Decimal("1E+2"),), (Decimal("-1E-7"),)]
    wire = RowEncoder(column).rows_response(rows)
    assert [r.values[0].text_value for r in wire.rows] == ["0.10", "100", "-0.0000001"]
    assert round_trip(column, rows) == [
        (Decimal("0.10"),),
        (Decimal("100"),),
        (Decimal("-0.0000001"),),
    ]


def test_time_values_beyond_a_day_keep_mysql_form():
    assert codec.format_time(datetime.timedelta(hours=838, minutes=59, seconds=59)) == "838:59:59"
    assert codec.format_time(datetime.timedelta(0)) == "00:00:00"
    assert codec.format_time(datetime.timedelta(minutes=-1)) == "-00:01:00"


def test_a_value_of_an_unexpected_type_is_still_sent_by_its_own_type():
    # PyMySQL leaves MySQL's zero date as text; an int column may hold a float by accident.
    columns = (Column("dt", "datetime", "datetime"), Column("n", "int", "int"))
    assert round_trip(
        columns, [("0000-00-00 00:00:00", 2.5), (datetime.datetime(2000, 1, 1), 3)]
    ) == [("0000-00-00 00:00:00", 2.5), ("2000-01-01 00:00:00", 3)]


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="2 values for 1 fields"):
        RowEncoder([Column("id", "bigint", "bigint")]).rows_response([(1, 2)])


def test_a_value_that_cannot_be_sent_raises():
    with pytest.raises(TypeError, match="object"):
        RowEncoder([Column("x", "mystery", "mystery")]).rows_response([(object(),)])
    with pytest.raises(ValueError, match="64 bits"):
        codec.encode_value(2**64)


@given(st.integers(min_value=-(2**63), max_value=2**64 - 1))
def test_any_64_bit_integer_round_trips_as_a_value(n):
    assert codec.decode_value(pb.Value.FromString(codec.encode_value(n).SerializeToString())) == n


@given(st.one_of(st.none(), st.text(), st.binary(), st.floats(allow_nan=False)))
def test_ids_of_every_kind_round_trip(value):
    assert codec.decode_ids([codec.encode_value(value)]) == [value]


def test_an_id_value_with_no_kind_is_reported_by_position():
    with pytest.raises(ValueError, match=r"ids\[1\] has no value set"):
        codec.decode_ids([pb.Value(int_value=1), pb.Value()])


def test_a_decimal_field_sent_as_another_kind_is_read_by_its_kind():
    assert RowDecoder([FieldType.DECIMAL]).decode(pb.Row(values=[pb.Value(null_value=0)])) == (
        None,
    )


def test_an_unknown_wire_field_type_reads_as_unspecified():
    assert codec.to_field_type(99) is FieldType.UNSPECIFIED


def config_of(columns: tuple[Column, ...], **fields: Any) -> TableConfig:
    """The demo comment's settings over ``columns`` (all streamed), with ``fields``."""
    return TableConfig(
        name="t",
        ack_wait_s=30,
        purge_after_s=86400,
        batch_size=10,
        cache_size=10000,
        poller_interval_s=30,
        min_backoff_s=30,
        max_backoff_s=0,
        layout=Layout.CURRENT,
        columns=columns,
        message_columns=columns,
        **fields,
    )


def test_table_status_of_a_loaded_table_carries_its_config():
    columns = (Column("id", "bigint", "bigint"), Column("message", "varchar", "varchar(128)"))
    config = config_of(columns)
    message = codec.table_status_to_proto(
        TableStatus(
            name="t",
            keyspace="ks",
            config=config,
            load_error=None,
            cached=3,
            in_flight=2,
            subscribers=1,
            sent=7,
            acked=4,
        )
    )
    assert message.load_error == ""
    assert (
        message.cached,
        message.in_flight,
        message.subscribers,
        message.sent,
        message.acked,
    ) == (3, 2, 1, 7, 4)
    assert message.config.layout == "current" and message.config.batch_size == 10
    assert [f.name for f in message.config.message_columns] == ["id", "message"]


def test_table_status_of_a_failed_table_has_no_config():
    message = codec.table_status_to_proto(
        TableStatus(
            name="bad", keyspace="ks", config=None, load_error="table bad: missing vt_ack_wait"
        )
    )
    assert not message.HasField("config")
    assert message.load_error == "table bad: missing vt_ack_wait"


def test_a_batch_says_when_it_was_sent_and_which_rows_were_sent_before():
    encoder = RowEncoder([Column("id", "bigint", "bigint")])
    response = encoder.rows_response([(1,), (2,)], [0, 2], 123)
    assert response.sent_ns == 123
    assert [r.sent_before for r in response.rows] == [0, 2]
    assert encoder.rows_response([(3,)]).rows[0].sent_before == 0  # a first delivery


def test_an_ordered_tables_status_carries_its_ordering_and_key_counts_both_ways():
    columns = (Column("id", "bigint", "bigint"), Column("k", "varchar", "varchar(64)"))
    config = config_of(columns, order_key="k", order_by="id", order_index="order_idx")
    status = TableStatus(
        name="t", keyspace="ks", config=config, load_error=None, keys_in_flight=4, keys_waiting=9
    )
    info = codec.table_info_from_proto(codec.table_status_to_proto(status))
    assert info.config is not None
    assert (info.config.order_key, info.config.order_by) == ("k", "id")
    assert (info.keys_in_flight, info.keys_waiting) == (4, 9)
    text = output.format_tables([info])
    assert "ordered per key:\n  t: by k in id order; keys in flight 4, keys waiting 9" in text


def test_a_capture_tables_status_carries_its_patterns_kinds_and_follower_both_ways():
    from msgtable.core.events import Capture

    columns = (Column("id", "bigint", "bigint"), Column("kind", "varchar", "varchar(16)"))
    config = config_of(columns, capture=Capture(("orders_*", "c"), frozenset({"insert", "drop"})))
    status = TableStatus(
        name="ev",
        keyspace="ks",
        config=config,
        load_error=None,
        capture_position="gtid:0-1-9",
        capture_lag_s=1.25,
        capture_events=42,
    )
    info = codec.table_info_from_proto(codec.table_status_to_proto(status))
    assert info.config is not None
    assert (info.config.capture, info.config.capture_kinds) == (
        ("orders_*", "c"),
        ("drop", "insert"),
    )
    assert (info.capture_position, info.capture_lag_s, info.capture_events) == (
        "gtid:0-1-9",
        1.25,
        42,
    )
    text = output.format_tables([info])
    assert (
        "table events:\n  ev <- orders_*|c (drop|insert); at gtid:0-1-9, lag 1.2s, 42 written"
        in text
    )
    unknown = TableStatus(
        name="ev", keyspace="ks", config=config, load_error=None, capture_problem="why"
    )
    info = codec.table_info_from_proto(codec.table_status_to_proto(unknown))
    assert info.capture_lag_s is None and info.capture_problem == "why"
    assert "  ev <- orders_*|c (drop|insert); why" in output.format_tables([info])
    plain = codec.table_info_from_proto(
        codec.table_status_to_proto(
            TableStatus(name="t", keyspace="ks", config=config_of(columns), load_error=None)
        )
    )
    assert plain.config is not None and plain.config.capture == () and plain.capture_lag_s is None
    assert "table events" not in output.format_tables([plain])


def test_a_groups_push_endpoint_shows_under_pushed_to_in_msgtable_tables_without_its_secret():
    columns = (Column("id", "bigint", "bigint"),)
    push = PushStatus("https://hooks.example.com/in", "pushing", 2, 1_234, 5, 4, 10.0)
    table = TableStatus(name="t", keyspace="ks", config=config_of(columns), load_error=None)
    sub = dataclasses.replace(table, subscription="billing", push=push)
    infos = [codec.table_info_from_proto(codec.table_status_to_proto(s)) for s in (table, sub)]
    assert infos[1].push == push
    text = output.format_tables(infos)
    assert (
        "pushed to:\n  t/billing -> https://hooks.example.com/in: pushing; in flight 2/4, "
        "pushed 1,234, failed 5"
    ) in text


def test_the_backlog_travels_in_list_tables_and_shows_under_backlog_in_msgtable_tables():
    columns = (Column("id", "bigint", "bigint"),)
    table = TableStatus(
        name="t",
        keyspace="ks",
        config=config_of(columns),
        load_error=None,
        due=1_500,
        scheduled=20,
        oldest_unacked_age_s=125.25,
    )
    sub = dataclasses.replace(table, subscription="billing", due=0, scheduled=0)
    sub = dataclasses.replace(sub, oldest_unacked_age_s=None)
    infos = [codec.table_info_from_proto(codec.table_status_to_proto(s)) for s in (table, sub)]
    assert (infos[0].due, infos[0].scheduled, infos[0].oldest_unacked_age_s) == (1_500, 20, 125.25)
    assert (infos[1].due, infos[1].scheduled, infos[1].oldest_unacked_age_s) == (0, 0, None)
    text = output.format_tables(infos)
    assert (
        "backlog (read from the database):\n"
        "  t: 1,500 due, 20 scheduled, oldest unacked 2.1m\n"
        "  t/billing: 0 due, 0 scheduled"
    ) in text
    unread = dataclasses.replace(table, due=None, scheduled=None, oldest_unacked_age_s=None)
    info = codec.table_info_from_proto(codec.table_status_to_proto(unread))
    assert (info.due, info.scheduled, info.oldest_unacked_age_s) == (None, None, None)
    assert "backlog" not in output.format_tables([info])


def test_a_lazy_subscriptions_cursor_lag_travels_both_ways_unset_for_the_others():
    columns = (Column("id", "bigint", "bigint"),)
    table = TableStatus(name="t", keyspace="ks", config=config_of(columns), load_error=None)
    lazy = dataclasses.replace(table, subscription="feed", state_rows="lazy", cursor_lag=0)
    eager = dataclasses.replace(table, subscription="billing", state_rows="eager")
    infos = [
        codec.table_info_from_proto(codec.table_status_to_proto(s)) for s in (table, lazy, eager)
    ]
    assert [(i.state_rows, i.cursor_lag) for i in infos] == [
        ("", None),
        ("lazy", 0),
        ("eager", None),
    ]


def test_a_lazy_subscriptions_advice_travels_both_ways_empty_for_the_others():
    columns = (Column("id", "bigint", "bigint"),)
    table = TableStatus(name="t", keyspace="ks", config=config_of(columns), load_error=None)
    lazy = dataclasses.replace(
        table, subscription="feed", state_rows="lazy", advice="its filter reads every message"
    )
    eager = dataclasses.replace(table, subscription="billing", state_rows="eager")
    infos = [
        codec.table_info_from_proto(codec.table_status_to_proto(s)) for s in (table, lazy, eager)
    ]
    assert [i.advice for i in infos] == ["", "its filter reads every message", ""]


def test_a_takeovers_hold_travels_both_ways_and_shows_in_msgtable_tables():
    columns = (Column("id", "bigint", "bigint"),)
    held = [
        TableStatus(
            name="a", keyspace="ks", config=config_of(columns), load_error=None, hold_s=7.5
        ),
        TableStatus(
            name="b",
            keyspace="ks",
            config=config_of(columns),
            load_error=None,
            hold_s=12.25,
            hold_whole=True,
        ),
        TableStatus(name="c", keyspace="ks", config=config_of(columns), load_error=None),
    ]
    a, b, c = (codec.table_info_from_proto(codec.table_status_to_proto(s)) for s in held)
    assert (a.hold_s, a.hold_whole) == (7.5, False)
    assert (b.hold_s, b.hold_whole) == (12.25, True)
    assert (c.hold_s, c.hold_whole) == (0.0, False)
    text = output.format_tables([a, b, c])
    assert (
        "held after a takeover (the old lease holder's last sends may be in flight):\n"
        "  a: 7.5s more; only messages due before the old lease ended, the rest flow\n"
        "  b: 12s more; every send of the table\n"
    ) in text + "\n"
    assert "  c:" not in text


def test_each_tables_sender_travels_and_shows_in_msgtable_tables():
    """Servers that share a database name each table's sender (msgtable.engine.placement); one
    alone says "this server" and msgtable tables then says nothing of it; a server of an
    earlier version sends no sender at all, nor does msgtable tables say one."""
    columns = (Column("id", "bigint", "bigint"),)

    def status(name: str, sender: str) -> TableStatus:
        s = TableStatus(
            name=name, keyspace="ks", config=config_of(columns), load_error=None, sender=sender
        )
        return codec.table_info_from_proto(codec.table_status_to_proto(s))

    shared = [status("a", "10.0.0.1:50051"), status("b", "10.0.0.2:50051"), status("c", "")]
    assert [t.sender for t in shared] == ["10.0.0.1:50051", "10.0.0.2:50051", ""]
    assert (
        "sent by (the servers of the database share its tables):\n"
        "  a: 10.0.0.1:50051\n"
        "  b: 10.0.0.2:50051\n"
        "  c: no server now\n"
    ) in output.format_tables(shared) + "\n"
    assert "sent by" not in output.format_tables([status("a", "this server")])
    assert "sent by" not in output.format_tables([status("a", ""), status("b", "")])


def test_the_shard_a_table_is_in_travels():
    columns = (Column("id", "bigint", "bigint"),)
    s = TableStatus(
        name="q", keyspace="app", config=config_of(columns), load_error=None, shard="80-c0"
    )
    assert codec.table_info_from_proto(codec.table_status_to_proto(s)).shard == "80-c0"
    unsharded = dataclasses.replace(s, shard="")
    assert codec.table_status_to_proto(unsharded).shard == ""


def test_msgtable_tables_names_each_entry_s_shard():
    columns = (Column("id", "bigint", "bigint"),)
    shards = [
        codec.table_info_from_proto(
            codec.table_status_to_proto(
                TableStatus(
                    name="q",
                    keyspace="app",
                    config=config_of(columns),
                    load_error=None,
                    shard=shard,
                    sender=sender,
                )
            )
        )
        for shard, sender in (("-80", "10.0.0.1:50051"), ("80-", "10.0.0.2:50051"))
    ]
    text = output.format_tables(shards)
    assert [line.split()[:2] for line in text.splitlines()[1:3]] == [
        ["q", "app/-80"],
        ["q", "app/80-"],
    ]
    assert "  q (shard -80): 10.0.0.1:50051\n  q (shard 80-): 10.0.0.2:50051" in text

"""The SQS API's managed queues' SQL (msgtable.store.sqsqueues), as exact strings; a name or
a comment value that is not one is refused before any SQL is written."""

from __future__ import annotations

import pytest

from msgtable.store.sqsqueues import check_name, comment, create_ddl


def test_a_fifo_queue_is_an_ordered_table_with_the_sqs_columns():
    assert create_ddl("steps", {"vt_ack_wait": "5"}, fifo=True) == (
        "create table `steps`(\n"
        "  id bigint not null,\n"
        "  priority bigint not null default 0,\n"
        "  time_next bigint default 0,\n"
        "  epoch bigint not null default 0,\n"
        "  time_acked bigint,\n"
        "  time_created bigint default (unix_timestamp(now(6)) * 1000000000),\n"
        "  message mediumtext,\n"
        "  message_attributes json,\n"
        "  last_error varchar(1000),\n"
        "  time_dead bigint,\n"
        "  attempts bigint,\n"
        "  message_group_id varchar(128),\n"
        "  message_deduplication_id varbinary(128),\n"
        "  unique key dedup_idx(message_deduplication_id),\n"
        "  index order_idx(message_group_id, time_acked, id),\n"
        "  primary key(id),\n"
        "  index poller_idx(time_acked, priority, time_next)\n"
        ") engine=InnoDB comment 'vitess_message,vt_ack_wait=5,vt_purge_after=86400,"
        "vt_batch_size=10,vt_cache_size=10000,vt_poller_interval=30,"
        "vt_order_key=message_group_id'"
    )


@pytest.mark.parametrize("name", ["", "a-b", "x`y", "a b", "n" * 65, "t;drop", "é"])
def test_a_name_that_is_not_letters_digits_and_underscores_is_refused(name: str):
    with pytest.raises(ValueError):
        check_name(name)
    with pytest.raises(ValueError):
        create_ddl(name, {}, fifo=False)


@pytest.mark.parametrize(
    "fields", [{"vt_ack_wait": "1',x='"}, {"vt_x y": "1"}, {"other": "1"}, {"vt_a": ""}]
)
def test_a_comment_value_that_is_not_a_number_or_a_name_is_refused(fields: dict[str, str]):
    with pytest.raises(ValueError):
        comment(fields)

"""The SQS API's CreateQueue / DeleteQueue / PurgeQueue rules (msgtable.server.sqs.manage)
over an in-memory fake of the tables' SQL (the real one: tests/acceptance/test_sqs_manage.py):
the flag, SQS's 60 s purge rule with time passed in, the attributes -> COMMENT fields."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping

import pytest

from msgtable.core.status import TableStatus
from msgtable.server.sqs.manage import PURGE_GAP_S, Manager
from msgtable.server.sqs.protocol import Params, SqsError
from msgtable.server.sqs.queues import Directory

from .test_server import loaded_table


class FakeTables:
    """QueueTables in memory: what was created, dropped and purged."""

    def __init__(self, statuses: list[TableStatus]) -> None:
        self.statuses = statuses
        self.created: dict[str, tuple[dict[str, str], bool]] = {}
        self.dropped: list[str] = []
        self.purged: list[str] = []

    def create(self, name: str, fields: Mapping[str, str], fifo: bool) -> None:
        self.created[name] = (dict(fields), fifo)
        base = loaded_table(name)
        assert base.config is not None
        cfg = dataclasses.replace(base.config, ack_wait_s=float(fields.get("vt_ack_wait", 30)))
        self.statuses.append(dataclasses.replace(base, keyspace="app", config=cfg))

    def drop(self, name: str) -> None:
        self.dropped.append(name)
        self.statuses[:] = [s for s in self.statuses if s.name != name]

    def purge(self, name: str) -> int:
        self.purged.append(name)
        return 0


def manager(enabled: bool = True) -> tuple[Manager, FakeTables]:
    statuses = [loaded_table("jobs"), loaded_table("jobs_dead")]
    tables = FakeTables(statuses)
    directory = Directory("app", lambda: [(s, None) for s in statuses], lambda: None)
    m = Manager(tables if enabled else None, directory, lambda: directory.reload(), None)
    return m, tables


def code(call: Callable[[], object]) -> str:
    with pytest.raises(SqsError) as caught:
        call()
    return caught.value.code


def test_without_the_flag_each_action_names_it_and_an_existing_queue_is_still_found():
    m, tables = manager(enabled=False)
    q = m.directory.find("jobs")
    assert m.create(Params({"QueueName": "jobs"}), "").label == "jobs"
    for call in (
        lambda: m.create(Params({"QueueName": "new"}), ""),
        lambda: m.delete(q, ""),
        lambda: m.purge(q, "", now=0.0),
    ):
        with pytest.raises(SqsError) as caught:
            call()
        assert caught.value.code == "UnsupportedOperation"
        assert "--sqs-manage" in caught.value.message
    assert (tables.created, tables.dropped, tables.purged) == ({}, [], [])


def test_a_queue_is_purged_once_per_60_seconds():
    m, tables = manager()
    q = m.directory.find("jobs")
    m.purge(q, "", now=100.0)
    assert code(lambda: m.purge(q, "", now=100.0 + PURGE_GAP_S - 0.1)) == "PurgeQueueInProgress"
    m.purge(q, "", now=100.0 + PURGE_GAP_S)
    assert tables.purged == ["jobs", "jobs"]


def test_the_attributes_become_the_comments_fields():
    m, tables = manager()
    policy = {"deadLetterTargetArn": "arn:aws:sqs:msgtable:app:jobs_dead", "maxReceiveCount": 4}
    m.create(
        Params(
            {
                "QueueName": "orders",
                "Attributes": {
                    "VisibilityTimeout": "12",
                    "MessageRetentionPeriod": "600",
                    "RedrivePolicy": json.dumps(policy),
                    "DelaySeconds": "0",
                },
            }
        ),
        "",
    )
    assert tables.created["orders"] == (
        {
            "vt_ack_wait": "12",
            "vt_purge_after": "600",
            "vt_max_attempts": "4",
            "vt_dead_letter": "jobs_dead",
        },
        False,
    )


def redrive(arn: str) -> str:
    return json.dumps({"maxReceiveCount": 2, "deadLetterTargetArn": arn})


@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        ({"VisibilityTimeout": "0"}, "InvalidAttributeValue"),
        ({"VisibilityTimeout": "x"}, "InvalidAttributeValue"),
        ({"MessageRetentionPeriod": "59"}, "InvalidAttributeValue"),
        ({"DelaySeconds": "5"}, "InvalidAttributeValue"),
        ({"RedrivePolicy": '{"maxReceiveCount": 0}'}, "InvalidAttributeValue"),
        ({"RedrivePolicy": redrive("arn:aws:sqs:msgtable:app:nope")}, "InvalidParameterValue"),
        ({"RedrivePolicy": redrive("arn:aws:sqs:r:other:jobs_dead")}, "InvalidAttributeValue"),
        ({"Policy": "{}"}, "InvalidAttributeName"),
        ({"FifoQueue": "true"}, "InvalidParameterValue"),
    ],
)  # fmt: skip
def test_a_bad_attribute_is_sqs_error_and_nothing_is_created(
    attributes: dict[str, str], expected: str
):
    m, tables = manager()
    assert code(lambda: m.create(Params({"QueueName": "q", "Attributes": attributes}), "")) == (
        expected
    )
    assert tables.created == {}


def test_a_dead_letter_queue_in_use_is_not_deleted():
    m, tables = manager()
    jobs = m.directory.find("jobs")
    statuses = tables.statuses
    base = statuses[0]
    assert base.config is not None
    statuses[0] = dataclasses.replace(
        base, config=dataclasses.replace(base.config, dead_letter="jobs_dead")
    )
    m.directory.reload()
    dead = m.directory.find("jobs_dead")
    with pytest.raises(SqsError) as caught:
        m.delete(dead, "")
    assert caught.value.code == "UnsupportedOperation" and "jobs" in caught.value.message
    m.delete(jobs, "")
    assert tables.dropped == ["jobs"]

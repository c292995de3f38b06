"""Issue 46's hostile inputs against a real server (hypothesis): dedup keys of every shape
(quotes, backticks, NUL, unicode, collation twins, 1 MB, bytes, numbers, the wrong type)
through msgtable.enqueue on a vt_dedup table: each goes in once, is left out as a duplicate,
or is refused with one clear line, and the table then holds each accepted key once; cron
expressions, time zones, names and values of every shape through CreateSchedule: a clean
status (never INTERNAL or UNKNOWN) whose detail is one line, naming the field or character
by its position where the expression is the fault, and nothing written but valid schedules
(dropped at once)."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgtable.errors import MsgtableError
from msgtable.proto.msgtable.v1 import messaging_pb2 as pb
from msgtable.proto.msgtable.v1 import messaging_pb2_grpc as pb_grpc

from .helpers import serve
from .test_fuzz import NASTY

KEY_EXAMPLES = 1_500
CRON_EXAMPLES = 1_500
KEYED = (
    "dedup_key varchar(128),\n  unique index dedup_idx(dedup_key),\n"
    "  index dedup_created_idx(time_created, dedup_key)"
)
keys = st.one_of(
    st.sampled_from([*NASTY, "A", "a", "a ", "ä", "A\t", "\x00", "x" * 128, "x" * 129]),
    st.text(max_size=140),
    st.binary(max_size=140),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.sampled_from([None, True, [1], {"k": 1}, object()]),
)
FIELD = ["*", "0", "59", "60", "61", "-1", "*/0", "*/61", "1-", "5-1", "1,,2", "?", "L", "W"]
FIELD += ["JAN", "MON", "SUN-SAT", "#", "1#6", "0x10", "\uff11", "'", "`", ";", "%s", "\x00", "H"]
crons = st.one_of(
    st.lists(st.sampled_from(FIELD), min_size=0, max_size=9).map(" ".join),
    st.sampled_from(["@hourly", "@reboot", "@nope", "@", "0 0 31 2 *", "0 0 30 2 *", "x" * 300]),
    st.sampled_from(NASTY),
    st.text(max_size=60),
)
zones = st.one_of(
    st.sampled_from(["", "UTC", "Europe/Paris", "../../etc/passwd", "Mars/Base", "utc", "\x00"]),
    st.text(max_size=70),
)
names = st.one_of(st.sampled_from(["ok", *NASTY]), st.text(max_size=70))
values = st.one_of(
    st.sampled_from(["", "{}", '{"message": "m"}', "{bad", "[]", "1", '{"id": 1}', "null"]),
    st.sampled_from(['{"message": "' + "x" * 70_000 + '"}', '{"message": {"a": 1}}']),
    st.text(max_size=40),
)
missed = st.sampled_from(["", "skip", "once", "SKIP", "twice", "\x00"])


def test_hostile_dedup_keys_go_in_once_are_left_out_or_are_refused_in_one_line(db_dsn):
    from msgtable.enqueue import enqueue

    with serve(db_dsn) as s:
        s.create_table("jobs", KEYED, vt_dedup="dedup_key")
        s.engine.refresh()
        ids = iter(range(1, 10_000_000))
        accepted: set[object] = set()
        outcomes: dict[str, int] = {}

        @settings(
            max_examples=KEY_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(keys)
        def hostile(key):
            try:
                with s.db.connect() as conn, conn.begin():
                    first = enqueue(conn, "jobs", {"id": next(ids), "dedup_key": key})
                    again = enqueue(conn, "jobs", {"id": next(ids), "dedup_key": key})
            except MsgtableError as exc:
                assert "\n" not in str(exc) and str(exc).startswith("table jobs: "), (key, exc)
                outcomes["refused"] = outcomes.get("refused", 0) + 1
                return
            if key is None:
                assert (first, again) == (1, 1)  # no key: never a duplicate
            else:
                assert again == 0, key  # the second is a duplicate, whatever the first was
                outcomes["once" if first else "held"] = (
                    outcomes.get("once" if first else "held", 0) + 1
                )
                if first:
                    accepted.add(key)

        hostile()
        assert outcomes.get("once", 0) > 100, outcomes
        (held,) = s.sql("select count(*) from jobs where dedup_key is not null")[0]
        assert held == outcomes.get("once", 0)  # each accepted key once
        assert not s.client.list_tables()[0].load_error


def test_hostile_schedules_get_a_clean_one_line_status_and_write_nothing_bad(db_dsn):
    with serve(db_dsn) as s:
        s.create_table("jobs", vt_poller_interval=0.2)
        s.engine.refresh()
        seen: dict[str, int] = {}
        with grpc.insecure_channel(s.server.address) as channel:
            stub = pb_grpc.MessagingStub(channel)

            @settings(
                max_examples=CRON_EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(names, crons, zones, values, missed, st.sampled_from(["jobs", "nope", "`"]))
            def hostile(name, cron, tz, vals, how, table):
                wanted = pb.Schedule(
                    name=name, table=table, cron=cron, timezone=tz, values=vals, missed=how
                )
                try:
                    made = stub.CreateSchedule(
                        pb.CreateScheduleRequest(schedule=wanted), timeout=10
                    )
                except grpc.RpcError as exc:
                    code, detail = exc.code(), exc.details() or ""
                    assert code in (
                        grpc.StatusCode.INVALID_ARGUMENT,
                        grpc.StatusCode.NOT_FOUND,
                    ), (wanted, code, detail)
                    assert "\n" not in detail and len(detail) < 400, (wanted, detail)
                    if code is grpc.StatusCode.INVALID_ARGUMENT and detail.startswith("cron"):
                        assert (
                            any(
                                w in detail
                                for w in ("field ", "character ", "fields", "never comes")
                            )
                            or "characters: at most" in detail
                            or "is not valid" in detail
                        ), detail
                    seen[code.name] = seen.get(code.name, 0) + 1
                    return
                seen["OK"] = seen.get("OK", 0) + 1
                assert made.schedule.next_tick_ns > 0
                dropped = stub.DropSchedule(pb.DropScheduleRequest(name=made.schedule.name))
                assert dropped.dropped

            hostile()
        assert seen.get("INVALID_ARGUMENT", 0) > 100, seen
        assert s.client.list_schedules() == []
        assert [r[0] for r in s.sql("select count(*) from jobs")] == [0]


@pytest.mark.parametrize(
    ("cron", "said"),
    [
        ("61 * * * *", "field 1 (minute) '61'"),
        ("* 24 * * *", "field 2 (hour) '24'"),
        ("* * 32 * *", "field 3 (day of month) '32'"),
        ("* * * 13 *", "field 4 (month) '13'"),
        ("* * * * 8", "field 5 (day of week) '8'"),
        ("* * * * * 61", "field 6 (second) '61'"),
        ("* * \x00 * *", "character 5"),
        ("* *", "has 2 fields"),
    ],
)
def test_a_bad_cron_field_is_named_by_its_position(cron, said):
    from msgtable.core.schedules import check_cron
    from msgtable.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as e:
        check_cron(cron)
    assert said in str(e.value) and "\n" not in str(e.value), str(e.value)

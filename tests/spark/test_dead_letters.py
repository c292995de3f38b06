"""Dead letters on a real local Spark session and a real MySQL-family server: the reader's
``state=dead`` (rows dead in place; every unacked row of a dead-letter table, which is also
what it reads for the table whose vt_dead_letter it is; bad options fail at load() in one
line) and ``msgtable report``'s dead letters (by reason and by attempts, in
place and in the dead-letter table, of a dead-letter table itself; one line when none).

The tables are made with the DDL of schema/dead_letter.sql; the dead rows are written with
SQL, as the engine leaves them."""

from __future__ import annotations

import subprocess
import sys

from msgtable.core.tables import DEAD_TIME_NEXT
from msgtable.errors import InvalidArgument, TableLoadError
from msgtable.spark.errors import spark_error
from msgtable.spark.report import build_report
from msgtable.spark.report_dead import Place
from msgtable.spark.report_html import page

from ..integration.helpers import comment

T0_S = 1_767_225_600  # 2026-01-01 00:00:00 UTC
T0 = T0_S * 10**9
MINUTE = 60 * 10**9
NOW = T0 + 3600 * 10**9
EXHAUSTED = "no ack after 5 attempts (vt_max_attempts=5)"

SOURCE = """create table {name}(
  id bigint not null,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint default (unix_timestamp(now(6)) * 1000000000),
  message varchar(128),
  last_error varchar(1000),{extra}
  primary key(id),
  index poller_idx(time_acked, priority, time_next)
) engine=InnoDB comment '{comment}'"""

DEAD_LETTER = """create table {name}(
  id bigint not null,
  priority bigint not null default 0,
  time_next bigint default 0,
  epoch bigint not null default 0,
  time_acked bigint,
  time_created bigint default (unix_timestamp(now(6)) * 1000000000),
  message varchar(128),
  time_dead bigint not null,
  attempts bigint not null,
  last_error varchar(1000),
  primary key(id),
  index poller_idx(time_acked, priority, time_next),
  index dead_idx(time_dead)
) engine=InnoDB comment '{comment}'"""


def source_table(sql, name: str, extra: str = "", **fields: object) -> None:
    sql.execute(SOURCE.format(name=name, extra=extra, comment=comment(**fields)))


def dead_letter_table(sql, name: str) -> None:
    sql.execute(DEAD_LETTER.format(name=name, comment=comment(vt_purge_after=604800)))


def insert(sql, table: str, rows: list[dict[str, object]]) -> None:
    names = list(rows[0])
    sql.execute(
        f"insert into {table}({', '.join(names)}) values ({', '.join(':' + n for n in names)})",
        rows,
    )


def row(id: int, **values: object) -> dict[str, object]:
    out: dict[str, object] = dict(
        id=id,
        time_next=0,
        epoch=0,
        time_acked=None,
        time_created=T0,
        message=f"m{id}",
        last_error=None,
    )
    out.update(values)
    return out


def dead_in_place(id: int, epoch: int, error: str | None, **values: object) -> dict[str, object]:
    return row(id, time_next=DEAD_TIME_NEXT, epoch=epoch, last_error=error, **values)


def orders(sql) -> None:
    """orders moves its dead messages to orders_dead, which holds three (and one a handler
    acked); orders itself has a live row, an acked one, and one that died in place before it
    had vt_dead_letter."""
    source_table(sql, "orders", vt_max_attempts=5, vt_dead_letter="orders_dead")
    dead_letter_table(sql, "orders_dead")
    insert(sql, "orders", [
        row(1),
        row(2, epoch=1, time_acked=T0 + MINUTE, last_error=None),
        dead_in_place(3, 2, "bad payload"),
    ])  # fmt: skip
    base = dict(time_next=T0, epoch=0, time_created=T0)
    insert(sql, "orders_dead", [
        dict(id=10, message="a", time_dead=T0 + MINUTE, attempts=5, last_error=EXHAUSTED,
             time_acked=None, **base),
        dict(id=11, message="b", time_dead=T0 + 2 * MINUTE, attempts=5, last_error=EXHAUSTED,
             time_acked=None, **{**base, "epoch": 1, "time_next": NOW + 3600 * 10**9}),
        dict(id=12, message="c", time_dead=T0 + 3 * MINUTE, attempts=1, last_error="bad payload",
             time_acked=None, **base),
        dict(id=13, message="d", time_dead=T0 + 4 * MINUTE, attempts=2, last_error="bad payload",
             time_acked=T0 + 5 * MINUTE, **base),
    ])  # fmt: skip


def read(spark, dsn: str, table: str, state: str):
    return spark.read.format("msgtable").option("dsn", dsn).option("state", state).load(table)


# -- the reader ------------------------------------------------------------------------------
def test_dead_reads_the_rows_dead_in_place_with_their_reasons(spark, sql, db_dsn):
    source_table(sql, "inplace", "\n  time_dead bigint,", vt_max_attempts=3)
    insert(sql, "inplace", [
        row(1, last_error=None, time_dead=None),
        dead_in_place(2, 3, "no ack after 3 attempts (vt_max_attempts=3)", time_dead=T0),
        dead_in_place(3, 1, "bad payload", time_dead=T0 + MINUTE),
        {**dead_in_place(4, 3, "dead, then acked", time_dead=T0), "time_acked": T0 + MINUTE},
    ])  # fmt: skip
    got = read(spark, db_dsn, "inplace", "dead").orderBy("id").collect()
    assert [(r.id, r.epoch, r.last_error, r.time_dead) for r in got] == [
        (2, 3, "no ack after 3 attempts (vt_max_attempts=3)", T0),
        (3, 1, "bad payload", T0 + MINUTE),
    ]
    assert all(r.time_next == DEAD_TIME_NEXT and r.time_acked is None for r in got)


def test_dead_of_a_table_with_a_dead_letter_table_reads_that_table_s_unacked_rows(
    spark, sql, db_dsn
):
    orders(sql)
    want = [
        (10, 5, EXHAUSTED),
        (11, 5, EXHAUSTED),  # in flight to orders_dead's own subscriber: still dead
        (12, 1, "bad payload"),
    ]
    for table in ("orders_dead", "orders"):  # where they are, or the table they died in
        moved = read(spark, db_dsn, table, "dead")
        assert moved.columns[-3:] == ["time_dead", "attempts", "last_error"]
        got = moved.select("id", "attempts", "last_error").orderBy("id").collect()
        assert [tuple(r) for r in got] == want, table
    # every other state of orders reads orders itself (3 died in place before vt_dead_letter)
    unacked = read(spark, db_dsn, "orders", "unacked").orderBy("id").collect()
    assert [(r.id, r.time_next) for r in unacked] == [(1, 0), (3, DEAD_TIME_NEXT)]
    assert [r.id for r in read(spark, db_dsn, "orders", "due").collect()] == [1]


def test_dead_of_a_table_whose_dead_letter_table_is_missing_fails_at_load(spark, sql, db_dsn):
    source_table(sql, "lost", vt_dead_letter="gone")
    try:
        read(spark, db_dsn, "lost", "dead")
    except Exception as exc:
        meant = spark_error(exc)
    else:
        raise AssertionError("state=dead of lost did not fail at load()")
    assert isinstance(meant, TableLoadError)
    assert str(meant) == (
        "table lost: vt_dead_letter=gone: no message table gone in this database "
        "(create it: schema/dead_letter.sql)"
    )


def test_a_bad_read_option_fails_at_load_in_one_line(spark, sql, db_dsn):
    source_table(sql, "picky")
    for option, value, message in [
        ("state", "undead", "state must be one of all, unacked, due, scheduled, in_flight, "
                            "dead, acked, not 'undead'"),
        ("partitions", "0", "option partitions must be at least 1, not 0"),
        ("partitions", "many", "option partitions must be a whole number, not 'many'"),
    ]:  # fmt: skip
        try:
            reader = spark.read.format("msgtable").option("dsn", db_dsn)  # a reader keeps options
            reader.option(option, value).load("picky")  # load(): no job has run
        except Exception as exc:
            meant = spark_error(exc)
        else:
            raise AssertionError(f"{option}={value} did not fail at load()")
        assert isinstance(meant, InvalidArgument) and str(meant) == message


# -- the report ------------------------------------------------------------------------------
def test_the_report_counts_the_dead_in_place_by_reason_and_attempts_and_not_as_backlog(
    spark, sql, db_dsn
):
    source_table(sql, "inplace", "\n  time_dead bigint,", vt_max_attempts=3)
    exhausted = "no ack after 3 attempts (vt_max_attempts=3)"
    insert(sql, "inplace", [
        *[row(i, epoch=1, time_acked=T0 + i * MINUTE, last_error=None, time_dead=None)
          for i in range(1, 11)],
        row(11, last_error=None, time_dead=None, time_created=NOW - 30 * 10**9),
        row(12, last_error=None, time_dead=None, time_created=NOW - 30 * 10**9),
        dead_in_place(13, 3, exhausted, time_dead=T0 + 10 * MINUTE),
        dead_in_place(14, 3, exhausted, time_dead=T0 + 20 * MINUTE),
        dead_in_place(15, 1, "bad payload", time_dead=T0 + 30 * MINUTE),
        dead_in_place(16, 2, None, time_dead=T0 + 40 * MINUTE),
    ])  # fmt: skip
    report = build_report(spark, "inplace", dsn=db_dsn, now_ns=NOW)
    dead = report.dead
    assert dead.places == [Place("inplace", moved=False, dead=4)]
    assert dead.by_reason == [
        (exhausted, "in place", 2),
        ("(none recorded)", "in place", 1),
        ("bad payload", "in place", 1),
    ]
    assert dead.by_attempts == [(1, "in place", 1), (2, "in place", 1), (3, "in place", 2)]
    assert (dead.first_ns, dead.last_ns) == (T0 + 10 * MINUTE, T0 + 40 * MINUTE)
    assert report.backlog == [("< 1 min", 0, 2)]  # the two waiting, none of the dead
    text = report.text()
    assert "inplace: 16 rows (10 acked, 6 unacked, 4 of them dead) from table inplace" in text
    assert (
        "dead letters: 4 in place; died 2026-01-01 00:10:00 to 2026-01-01 00:40:00 UTC; "
        "vt_max_attempts=3\n"
        "\n"
        "last error                                   dead\n"
        "-------------------------------------------  ----\n"
        "no ack after 3 attempts (vt_max_attempts=3)     2\n"
        "(none recorded)                                 1\n"
        "bad payload                                     1\n"
        "\n"
        "attempts  dead\n"
        "--------  ----\n"
        "       1     1\n"
        "       2     1\n"
        "       3     2\n"
    ) in text

    html = page(report)
    assert "<h2>Dead letters: messages never sent again</h2>" in html
    assert "<td>no ack after 3 attempts (vt_max_attempts=3)</td><td>2</td>" in html
    assert "<td>3</td><td>2</td>" in html  # by attempts
    assert '<div class="sub">2 waiting, 4 dead</div>' in html
    # latency, throughput, redeliveries, backlog; dead letters by reason and by attempts
    assert html.count('src="data:image/png;base64,') == 6


def test_the_report_of_a_table_with_a_dead_letter_table_counts_both_places(
    spark, sql, db_dsn, tmp_path
):
    orders(sql)
    report = build_report(spark, "orders", dsn=db_dsn, now_ns=NOW)
    dead = report.dead
    assert dead.places == [
        Place("orders", moved=False, dead=1),
        Place("orders_dead", moved=True, dead=3),
    ]
    assert dead.by_reason == [
        ("bad payload", "in orders_dead", 1),
        ("bad payload", "in place", 1),
        (EXHAUSTED, "in orders_dead", 2),
    ]
    assert dead.by_attempts == [
        (1, "in orders_dead", 1),
        (2, "in place", 1),
        (5, "in orders_dead", 2),
    ]
    assert (dead.first_ns, dead.last_ns) == (T0 + MINUTE, T0 + 3 * MINUTE)  # 3 has no time_dead
    assert report.backlog == [("1-24 h", 0, 1)]  # row 1 only, created an hour before NOW

    # as the command prints it, and its page
    html = tmp_path / "orders.html"
    done = subprocess.run(
        [sys.executable, "-m", "msgtable", "report", "orders", "--dsn", db_dsn,
         "--html", str(html), "--master", "local[1]"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "orders: 3 rows (1 acked, 2 unacked, 1 of them dead) from table orders" in done.stdout
    assert (
        "dead letters: 4 (1 in place, 3 in orders_dead); died 2026-01-01 00:01:00 to "
        "2026-01-01 00:03:00 UTC; vt_max_attempts=5\n"
        "\n"
        "last error                                   in place  in orders_dead  all\n"
        "-------------------------------------------  --------  --------------  ---\n"
        "bad payload                                         1               1    2\n"
        "no ack after 5 attempts (vt_max_attempts=5)         0               2    2\n"
        "\n"
        "attempts  in place  in orders_dead  all\n"
        "--------  --------  --------------  ---\n"
        "       1         0               1    1\n"
        "       2         1               0    1\n"
        "       5         0               2    2\n"
    ) in done.stdout
    text = html.read_text()
    assert "<th>in place</th><th>in orders_dead</th><th>all</th>" in text
    assert "<td>bad payload</td><td>1</td><td>1</td><td>2</td>" in text
    assert '<div class="label">Dead letters</div><div class="value">4</div>' in text
    assert '<div class="sub">1 in place, 3 in orders_dead</div>' in text


def test_the_report_of_a_dead_letter_table_reads_its_attempts_and_reasons(spark, sql, db_dsn):
    orders(sql)
    report = build_report(spark, "orders_dead", dsn=db_dsn, now_ns=NOW)
    dead = report.dead
    assert dead.places == [Place("orders_dead", moved=True, dead=3)]
    # attempts: the sends in orders (the attempts column), not orders_dead's own epoch
    assert dead.by_attempts == [(1, "in orders_dead", 1), (5, "in orders_dead", 2)]
    assert dead.by_reason == [
        (EXHAUSTED, "in orders_dead", 2),
        ("bad payload", "in orders_dead", 1),
    ]
    assert dead.max_attempts == 0  # orders_dead's own, which says nothing of these
    text = report.text()
    assert "orders_dead: 4 rows (1 acked, 3 unacked, 3 of them dead) from table orders_dead" in text
    assert "dead letters: 3 in orders_dead; died 2026-01-01 00:01:00 to 2026-01-01 00:03:00 UTC\n" \
        in text  # fmt: skip


def test_a_table_without_dead_letters_says_so_in_one_line(spark, sql, db_dsn):
    source_table(sql, "calm", vt_dead_letter="calm_dead")
    dead_letter_table(sql, "calm_dead")
    insert(sql, "calm", [row(1, last_error=None), row(2, last_error=None, time_acked=T0)])
    report = build_report(spark, "calm", dsn=db_dsn, now_ns=NOW)
    text = report.text()
    assert "\ndead letters: none (in place or in calm_dead)\n\n" in text
    assert "last error" not in text and "attempts" not in text
    assert "calm: 2 rows (1 acked, 1 unacked) from table calm" in text
    html = page(report)
    assert '<p class="empty">Dead letters: none (in place or in calm_dead).</p>' in html
    assert html.count('src="data:image/png;base64,') == 4  # no plot of nothing

    source_table(sql, "plain")
    insert(sql, "plain", [row(1, last_error=None)])
    assert "\ndead letters: none\n\n" in build_report(spark, "plain", dsn=db_dsn).text()


def test_a_missing_dead_letter_table_is_said_and_the_rest_is_reported(spark, sql, db_dsn):
    source_table(sql, "lost", vt_dead_letter="gone")
    insert(sql, "lost", [row(1, last_error=None), dead_in_place(2, 1, "bad payload")])
    report = build_report(spark, "lost", dsn=db_dsn, now_ns=NOW)
    assert report.dead.places == [Place("lost", moved=False, dead=1)]
    assert report.dead.summary() == (
        "1 in place; not read: table lost: vt_dead_letter=gone: no message table gone in this "
        "database (create it: schema/dead_letter.sql)"
    )


def test_many_reasons_are_the_ten_most_common_and_one_row_for_the_rest(spark, sql, db_dsn):
    source_table(sql, "noisy")
    rows = [dead_in_place(i, 1, "timeout") for i in range(1, 6)]
    rows += [dead_in_place(100 + i, 1, f"error {i:02d}") for i in range(12)]
    insert(sql, "noisy", rows)
    dead = build_report(spark, "noisy", dsn=db_dsn, now_ns=NOW).dead
    assert dead.by_reason == [
        ("timeout", "in place", 5),
        *[(f"error {i:02d}", "in place", 1) for i in range(9)],
        ("(3 other reasons)", "in place", 3),
    ]
    assert dead.places[0].dead == 17 and dead.first_ns is None  # no time_dead column

"""The scrape checker's verdicts on made-up scrapes: it passes a healthy run and names each
kind of breakage (tests/faults/scrapecheck.py)."""

from __future__ import annotations

from typing import Any

from .scrapecheck import (
    BOUND_S,
    NOTICE_S,
    QUIET_S,
    Scrape,
    count_losses,
    judge,
    loss_evidence,
    sender_changes,
)

SENT = ("msgtable_messages_sent_total", (("table", "chaos"),))
GAINS = ("msgtable_lease_gains_total", (("keyspace", "app"),))
SKIPPED = ("msgtable_postpones_skipped_total", (("keyspace", "app"), ("table", "chaos")))
OTHER_SKIPPED = ("msgtable_postpones_skipped_total", (("keyspace", "app"), ("table", "other")))


class Recorded:
    """What a Scraper recorded (no servers, no threads)."""

    def __init__(self) -> None:
        self.scrapes: list[Scrape] = []
        self.rounds: list[list[Scrape]] = []
        self.settled_found: dict[str, Any] = {
            "leader": "server1",
            "groups": [("chaos", "")],
            "backlog": {("chaos", ""): (0, 0)},
            "metrics_backlog": {("chaos", ""): 0},
            "dead": {"chaos": 3},
        }

    def round(
        self,
        at: float,
        sent: tuple[float, float] = (1, 0),
        holders: tuple[int, int] = (1, 0),
        named: tuple[str, str] = ("a", "a"),
        took_s: float = 0.01,
        error: str | None = None,
        database_up: float = 1,
        pids: tuple[int, int] = (11, 22),
        gains: tuple[float, float] = (1, 0),
        skipped: tuple[float, float] = (0, 0),
        other_skipped: float = 0,
    ) -> None:
        found = []
        for n, name in enumerate(("server1", "server2")):
            m = Scrape(name, "metrics", at, took_s, pids[n], True, error if n == 0 else None)
            m.counters = {SENT: sent[n], GAINS: gains[n]}
            if skipped[n]:  # (a table's sample once it skipped some)
                m.counters[SKIPPED] = skipped[n]
            if other_skipped and n == 0:
                m.counters[OTHER_SKIPPED] = other_skipped
            m.lease_holder, m.database_up = holders[n], database_up
            m.senders = {"chaos": holders[n]}
            s = Scrape(name, "state", at, 0.01, pids[n], True)
            chaos = {"name": "chaos", "subscription": "", "sender": named[n]}
            s.state = {"server": {"lease_holder": named[n]}, "tables": [chaos]}
            found += [m, s]
        self.scrapes += found
        self.rounds.append(found)


def healthy() -> Recorded:
    r = Recorded()
    for i in range(20):
        r.round(i * 0.5, sent=(i, 0))
    return r


def test_a_healthy_run_passes_and_counts_its_quiescent_rounds():
    report = judge(healthy(), [], {"chaos": 3})  # type: ignore[arg-type]
    assert report.violations == {}
    assert report.live_scrapes == 80 and report.quiescent_rounds == 20 - int(QUIET_S / 0.5)


def test_a_slow_or_failed_scrape_of_a_live_server_is_named():
    r = healthy()
    r.round(10.0, sent=(30, 0), took_s=BOUND_S + 0.5)
    r.round(10.5, sent=(30, 0), error="URLError: refused")
    report = judge(r, [], {"chaos": 3})  # type: ignore[arg-type]
    assert set(report.violations) == {
        "(a) a live server answered too late",
        "(a) a live server did not answer",
    }


def test_a_database_restart_nobody_noticed_is_named():
    r = healthy()
    report = judge(r, [(1.0, 9.0)], {"chaos": 3})  # type: ignore[arg-type]
    assert "(a) no live server said database_up 0 while the database was down" in (
        report.violations
    )
    r = healthy()
    r.round(10.0, sent=(30, 0), database_up=0)
    assert judge(r, [(8.0, 11.0)], {"chaos": 3}).violations == {}  # type: ignore[arg-type]


def test_a_counter_going_down_in_one_process_and_tenure_is_named_not_after_a_restart():
    r = healthy()
    r.round(10.0, sent=(3, 0))
    report = judge(r, [], {"chaos": 3})  # type: ignore[arg-type]
    assert list(report.violations) == ["(b) a counter went down"]
    r = healthy()
    r.round(10.0, sent=(3, 0), pids=(33, 22))  # a new process starts at zero
    assert "(b) a counter went down" not in judge(r, [], {"chaos": 3}).violations  # type: ignore[arg-type]
    r = healthy()
    r.round(10.0, sent=(3, 0), gains=(2, 0))  # lost and gained back between two scrapes
    assert "(b) a counter went down" not in judge(r, [], {"chaos": 3}).violations  # type: ignore[arg-type]
    r = healthy()
    r.round(10.0, sent=(3, 0), holders=(0, 1))  # the table handed over to the other server
    assert "(b) a counter went down" not in judge(r, [], {"chaos": 3}).violations  # type: ignore[arg-type]
    r = healthy()  # another table handed over: this table's counters must still not go down
    r.round(10.0, sent=(3, 0))
    r.rounds[-1][0].senders["orders"] = 0
    r.rounds[-2][0].senders["orders"] = 1
    assert "(b) a counter went down" in judge(r, [], {"chaos": 3}).violations  # type: ignore[arg-type]


def test_two_senders_of_a_table_or_two_named_at_a_quiescent_point_are_named():
    """Judged once the senders have not changed for QUIET_S: two senders of a table that
    last, or servers that name different senders of it while they stay as they are."""
    r = healthy()
    for i in range(10):
        r.round(10.0 + i * 0.5, sent=(30, 0), holders=(1, 1), named=("a", "b"))
    report = judge(r, [], {"chaos": 3})  # type: ignore[arg-type]
    assert set(report.violations) == {
        "(c) not exactly one sender of a table at a quiescent point",
        "(c) the servers name different senders of a table",
    }
    assert report.lease_changes == 1


def test_a_table_changing_hands_is_judged_once_it_settles():
    """A lease lost on a stall and taken again (a busy machine): the rounds while it moves,
    with no holder or holders named apart (a server's gauge or its /api/state may show it
    first), are counted, not judged; QUIET_S after, the one holder is, and a disagreement
    that lasts."""
    r = healthy()
    r.round(10.0, sent=(30, 0), holders=(0, 0), named=("", "a"))
    r.round(10.5, sent=(30, 0), holders=(0, 1), named=("b", ""))
    for i in range(10):
        r.round(11.0 + i * 0.5, sent=(30, 0), holders=(0, 1), named=("b", "b"))
    report = judge(r, [], {"chaos": 3})  # type: ignore[arg-type]
    assert report.violations == {}
    assert report.lease_changes == 3
    assert "3 changes of the tables' senders seen" in report.summary()
    for i in range(10):
        r.round(16.0 + i * 0.5, sent=(30, 0), holders=(0, 1), named=("b", ""))
    report = judge(r, [], {"chaos": 3})  # type: ignore[arg-type]
    assert set(report.violations) == {"(c) the servers name different senders of a table"}


def test_a_database_link_fault_near_a_round_makes_it_no_quiescent_point():
    """A server cut off from the database (its link silent, slow or reset) cannot read who
    holds the lease: within QUIET_S of such a fault a round is not quiescent; beyond, the
    same rounds are judged."""
    r = healthy()
    r.round(10.0, sent=(30, 0), holders=(1, 0), named=("a", ""))
    for i in range(11):
        r.round(10.5 + i * 0.5, sent=(30, 0), holders=(0, 0), named=("a", ""))
    quiet = judge(r, [], {"chaos": 3}, unquiet=[(9.0, 15.0)])  # type: ignore[arg-type]
    assert quiet.violations == {}
    report = judge(r, [], {"chaos": 3}, unquiet=[(1.0, 10.0 - QUIET_S - 1)])  # type: ignore[arg-type]
    assert set(report.violations) == {
        "(c) not exactly one sender of a table at a quiescent point",
        "(c) the servers name different senders of a table",
    }


def test_a_backlog_or_other_dead_letters_after_the_drain_are_named():
    r = healthy()
    r.settled_found["backlog"] = {("chaos", ""): (0, 2)}
    r.settled_found["dead"] = {"chaos": 2}
    report = judge(r, [], {"chaos": 3})  # type: ignore[arg-type]
    assert set(report.violations) == {
        "(d) a backlog after the drain (due, scheduled)",
        "(d) the dashboard's dead letters differ from the checker's",
    }


def test_a_subscriptions_dead_count_that_differs_from_its_checkers_is_named():
    r = healthy()
    r.settled_found["dead"] = {"chaos": 3, "chaos/all": 4}
    assert judge(r, [], {"chaos": 3, "chaos/all": 4}).violations == {}  # type: ignore[arg-type]
    report = judge(r, [], {"chaos": 3, "chaos/all": 5})  # type: ignore[arg-type]
    assert report.violations == {
        "(d) the dashboard's dead letters differ from the checker's": [
            "chaos/all: the dashboard 4, the checker 5"
        ]
    }


def test_a_server_may_take_notice_s_to_see_the_database_down():
    """The windows are the database's down time (from the moment it stopped); a scrape in
    the first NOTICE_S of one may still say database_up 1 (a server learns of an outage from
    a statement that fails: the lease holder's next poll, the other's next lease attempt).
    A window whose every later scrape says up is named: CI saw one restart's only scrape
    fall in that first moment and fail the run."""
    r = healthy()  # rounds at 0, 0.5, ..., 9.5
    report = judge(r, [(9.5 - NOTICE_S + 0.1, 9.6)], {"chaos": 3})  # type: ignore[arg-type]
    assert report.violations == {}
    report = judge(r, [(9.0 - NOTICE_S, 9.6)], {"chaos": 3})  # type: ignore[arg-type]
    assert "(a) no live server said database_up 0 while the database was down" in (
        report.violations
    )


def test_late_renewals_and_skipped_postpones_are_summed_over_every_process():
    late = ("msgtable_lease_late_renewals_total", (("keyspace", "app"),))
    skipped = ("msgtable_postpones_skipped_total", (("keyspace", "app"),))
    r = healthy()
    for i, (pids, values) in enumerate(
        [((11, 22), (2, 1)), ((11, 22), (5, 1)), ((33, 22), (1, 4))]  # server1 restarted
    ):
        r.round(10.0 + i * 0.5, pids=pids)
        for s, v in zip(r.scrapes[-4::2], values, strict=True):
            s.counters[late] = v
            s.counters[skipped] = 10 * v
    report = judge(r, [], {"chaos": 3})  # type: ignore[arg-type]
    # the last of each process: pid 11 said 5, pid 33 said 1, pid 22 said 4
    assert (report.late_renewals, report.postpones_skipped) == (10, 100)
    assert "10 late lease renewals, 100 postpones skipped" in report.summary()


def test_tables_sent_by_different_servers_pass_and_a_table_with_no_sender_is_named():
    """The servers share the tables (msgtable.engine.placement): each table one sender, named
    alike by both servers, whichever server it is; a table no server sends is not."""
    r = Recorded()
    for i in range(20):
        found = []
        for n, name in enumerate(("server1", "server2")):
            m = Scrape(name, "metrics", i * 0.5, 0.01, 11 + n, True)
            m.counters = {SENT: float(i), GAINS: 1}
            m.lease_holder, m.database_up = 1, 1
            # chaos sent by server1, orders by server2; mail by nobody after 5 s
            m.senders = {"chaos": 1 - n, "orders": n, "mail": 1 - n if i < 10 else 0}
            s = Scrape(name, "state", i * 0.5, 0.01, 11 + n, True)
            s.state = {
                "server": {},
                "tables": [
                    {"name": "chaos", "subscription": "", "sender": "a"},
                    {"name": "chaos", "subscription": "all", "sender": "a"},
                    {"name": "orders", "subscription": "", "sender": "b"},
                    {"name": "mail", "subscription": "", "sender": "a" if i < 10 else ""},
                ],
            }
            found += [m, s]
        r.scrapes += found
        r.rounds.append(found)
    report = judge(r, [], {"chaos": 3})  # type: ignore[arg-type]
    assert set(report.violations) == {
        "(c) not exactly one sender of a table at a quiescent point",
        "(c) the servers name different senders of a table",
    }
    assert all("mail" in v for vs in report.violations.values() for v in vs), report.violations


def test_the_changes_of_a_tables_sender_are_when_the_scrapes_saw_them():
    r = healthy()  # server1 sends chaos from 0 to 9.5
    assert sender_changes(r.rounds, "chaos") == []
    r.round(10.0, holders=(0, 0), error="URLError: timed out")  # server1's: not seen
    r.round(10.5, holders=(1, 1), took_s=0.2)  # server2 took it over; server1 not told yet
    r.round(11.0, holders=(1, 1))
    r.round(11.5, holders=(0, 1))  # server1 noticed its loss
    # from the last scrape that saw the server as before to the end of the one that saw it
    # changed
    assert sender_changes(r.rounds, "chaos") == [(10.0, 10.7), (11.0, 11.51)]
    assert sender_changes(r.rounds, "other") == []


def test_a_loss_without_its_postpones_is_when_the_scrapes_saw_the_skipped_ones_rise():
    """server1 sends chaos until 10.0 (as last seen), noticed its loss (a lease run out) at
    10.5, and closed it at 11.5 without writing 40 postpones: their sends' counts are lost,
    from when its lease may have ended on. The counter is by table: another table's rise
    is not chaos's; a rise of chaos's long after the loss (a close that waited on the
    database) still is, from the last scrape that saw it send chaos; across a restart
    (the counter starts again) it is not."""
    r = healthy()
    r.round(10.0)
    r.round(10.5, holders=(0, 1))  # the loss
    r.round(11.0, holders=(0, 1))
    r.round(11.5, holders=(0, 1), skipped=(40, 0), took_s=0.2)  # the close
    r.round(12.0, holders=(0, 1), skipped=(40, 0))
    assert count_losses(r.rounds, "chaos") == [("server1", 10.0, 11.7)]
    assert count_losses(r.rounds, "other") == []
    r.round(12.5, holders=(0, 1), skipped=(40, 0), other_skipped=5)  # another table's
    assert count_losses(r.rounds, "chaos") == [("server1", 10.0, 11.7)]
    assert count_losses(r.rounds, "other") == [("server1", 12.0, 12.51)]
    r.round(20.0, holders=(0, 1), skipped=(45, 0), other_skipped=5)  # long after the loss
    r.round(30.0, holders=(0, 1), skipped=(50, 0), pids=(33, 22))  # a new process
    assert count_losses(r.rounds, "chaos") == [("server1", 10.0, 11.7), ("server1", 10.0, 20.01)]


def test_the_loss_evidence_is_each_metrics_scrape_of_the_sender_and_its_skipped_postpones():
    r = healthy()
    r.round(10.0)
    r.round(10.5, holders=(0, 1), skipped=(40, 0), took_s=0.2)
    rows = loss_evidence(r.rounds, "chaos")
    assert [row for row in rows if row[2] == 10.5] == [
        ["server1", 11, 10.5, 0.2, 0, 40],
        ["server2", 22, 10.5, 0.2, 1, 0],
    ]
    assert all(row[4] is None for row in loss_evidence(r.rounds, "other"))


def test_a_rise_of_the_skipped_postpones_while_the_scrapes_still_see_the_server_send_is_a_loss():
    """server1 lost chaos too late and took it again (or its loss shows only in the next
    scrape) between two scrapes that both see it send chaos; the skipped postpones rose in
    the second: their sends' counts are lost from the first on (as the 100,000-message run
    of /tmp/redeliver-runs/bt-100k-d saw: 544 -> 731 with the sender gauge at 1 in both)."""
    r = healthy()
    r.round(10.0)
    r.round(10.5, skipped=(40, 0), took_s=0.2)
    r.round(11.0, holders=(0, 1), skipped=(40, 0))
    assert count_losses(r.rounds, "chaos") == [("server1", 10.0, 10.7)]
    assert count_losses(r.rounds, "other") == []

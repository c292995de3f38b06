"""The fault suite's checker judges what it was told, without a server: the attempt invariant,
where each id ended (acked, dead, and why), and a subscription's own rules (its filter, its
state table, the purge rule)."""

from __future__ import annotations

import time
from collections.abc import Hashable

import pytest
import sqlalchemy as sa

from ..ordering import Delivery, OrderLog
from .checker import (
    DEAD_TIME_NEXT,
    Checker,
    DeadRow,
    Fault,
    Report,
    Settled,
    Tables,
    read_state_pending,
    read_state_table,
)
from .filtercheck import Readiness


def judged(*deliveries: tuple[int, int]) -> Checker:
    """One id (7), delivered once per (attempt) given, an ack wait apart in recorded time."""
    c = Checker(ack_wait_s=0.0)
    c.insert([7])
    for n, (_, attempt) in enumerate(deliveries):
        c.delivered([(7, attempt)], f"s{n}")
    return c


def test_attempts_that_only_climb_or_repeat_pass() -> None:
    report = judged((7, 1), (7, 1), (7, 2), (7, 3)).judge()
    assert report.attempts_back == []
    assert report.attempts == {1: 2, 2: 1, 3: 1}


def test_an_attempt_that_counts_back_is_reported() -> None:
    c = judged((7, 1), (7, 3), (7, 2))
    report = c.judge()
    assert report.attempts_back == [(7, 3, 2)]
    assert "attempts counting back 1" in report.summary()
    assert "(attempt 3)" in c.history(7)


def test_a_first_delivery_below_attempt_one_is_reported() -> None:
    assert judged((7, 0)).judge().attempts_back == [(7, 1, 0)]


# -- where ids end: the message table and its dead-letter table ------------------------------
MAX = 3  # vt_max_attempts of these cases


def now_ns() -> int:
    """time_acked of a row acked just now."""
    return time.time_ns()


def settling(ack_wait_s: float = 0.0) -> Checker:
    """Ids 7 (poison) and 8 (ordinary) inserted, with vt_max_attempts=MAX."""
    c = Checker(ack_wait_s=ack_wait_s, max_attempts=MAX)
    c.insert([7, 8], poison=[7])
    return c


def dead(i: int, attempts: int = MAX, error: str | None = "no ack", ago_s: float = 0.0) -> DeadRow:
    """A dead letter of ``i``, dead ``ago_s`` ago."""
    return DeadRow(i, attempts, error, time.time_ns() - round(ago_s * 1e9))


def poison_released_to_death(c: Checker) -> None:
    """Poison 7 sent MAX times, released each time; ordinary 8 sent once and acked."""
    for attempt in range(1, MAX + 1):
        c.delivered([(7, attempt)], "s1")
        c.settled("release", [7], "s1", time.monotonic(), 1, 0.0, "poison")
    c.delivered([(8, 1)], "s2")
    c.acked([8])


def test_poison_dead_and_the_rest_acked_pass() -> None:
    c = settling()
    poison_released_to_death(c)
    report = c.judge(Tables({8: now_ns()}, [dead(7, error="poison")]))
    assert report.violations() == {}
    assert (report.dead_poison, report.released, report.dead_explained) == (1, MAX, [])
    assert "dead: 1 poison, 0 other (explained)" in report.summary()


def test_a_poison_id_acked_instead_of_dead_is_reported() -> None:
    c = settling()
    c.delivered([(7, 1), (8, 1)], "s1")
    c.acked([7, 8])
    report = c.judge(Tables({7: now_ns(), 8: now_ns()}, []))
    assert report.poison_not_dead == [(7, "acked")]
    assert report.poison_acked == [7]
    assert set(report.violations()) == {
        "poison acked",
        "poison not in the dead-letter table (id, state)",
    }


def test_an_id_in_both_tables_is_reported() -> None:
    c = settling()
    poison_released_to_death(c)
    report = c.judge(Tables({7: None, 8: now_ns()}, [dead(7, error="poison")]))
    assert report.in_both == [7]
    assert "in both tables" in report.violations()


def test_a_dead_letters_row_kept_acked_for_subscriptions_is_not_in_both_tables() -> None:
    """On a table with subscriptions the default group's dead letter stays in the table,
    settled for it (time_acked set) until they settled it too: fine there, not elsewhere,
    and never unacked."""
    c = settling()
    poison_released_to_death(c)
    kept = Tables({7: now_ns(), 8: now_ns()}, [dead(7, error="poison")])
    assert c.judge(kept).in_both == [7]
    c.subscribed = True
    report = c.judge(kept)
    assert report.violations() == {}
    assert c.judge(Tables({7: None, 8: now_ns()}, [dead(7, error="poison")])).in_both == [7]


def test_an_id_in_neither_table_or_dead_twice_is_reported() -> None:
    c = settling()
    poison_released_to_death(c)
    report = c.judge(Tables({}, [dead(7, error="poison"), dead(7, error="poison")]))
    assert report.in_neither == [8]
    assert report.dead_twice == [7]


def test_an_ordinary_id_dead_without_explanation_is_reported() -> None:
    """Seen once, at attempt 1, and nothing says why it was not acked: no fault, no drop."""
    c = settling()
    poison_released_to_death(c)
    c.delivered([(9, 1)], "s3")
    c.insert([9])
    report = c.judge(Tables({8: now_ns()}, [dead(7, error="poison"), dead(9)]))
    assert report.dead_unexplained == [9]
    assert report.dead_explained == []
    assert report.violations() == {"ordinary ids dead without explanation": [9]}
    assert "1 other unexplained" in report.summary()


def test_an_ordinary_id_acked_in_time_at_its_last_attempt_yet_dead_is_unexplained() -> None:
    c = settling(ack_wait_s=2.0)
    c.delivered([(8, MAX)], "s1")
    c.acked([8])
    assert c.judge(Tables({}, [dead(8)])).dead_unexplained == [8]


def test_an_ordinary_id_unacked_at_its_last_attempt_dies_explained() -> None:
    c = settling()
    c.delivered([(8, 1)], "s1")
    c.dropped([8], "s1", "subscriber killed")
    c.delivered([(8, MAX)], "s2")
    c.dropped([8], "s2", "subscriber stalled")
    report = c.judge(Tables({}, [dead(8)]))
    assert report.dead_explained == [(8, f"attempt {MAX} of {MAX} to s2: subscriber stalled")]
    assert "ordinary ids dead without explanation" not in report.violations()


def test_an_ordinary_id_whose_last_sends_went_unseen_dies_explained_only_amid_faults() -> None:
    """Seen at attempt 1 only, dropped; the other sends never reached a subscriber: as many
    faults as sends unseen explain it, fewer do not."""
    c = settling()
    c.delivered([(8, 1)], "s1")
    c.dropped([8], "s1", "subscriber killed")
    assert c.judge(Tables({}, [dead(8)])).dead_unexplained == [8]
    for _ in range(MAX - 1):
        c.event("msgtable SIGKILL")
    (explained,) = c.judge(Tables({}, [dead(8)])).dead_explained
    assert explained[0] == 8 and f"{MAX - 1} sends unseen" in explained[1]


def test_an_ack_that_came_after_an_unseen_send_death_does_not_unexplain_it() -> None:
    """A slow subscriber's late ack that returned after the id died (the ack found it dead:
    a dead row cannot be acked) does not make its death by sends unseen amid faults
    unexplained; an ack that returned before the death does (the ack should have won)."""
    c = settling()
    c.delivered([(8, 1)], "s1")
    c.dropped([8], "s1", "subscriber killed")
    for _ in range(MAX - 1):
        c.event("msgtable SIGTERM under load")
    row = dead(8)  # dead now, after the faults
    time.sleep(0.01)
    c.acked([8])  # and the ack returned after that
    (explained,) = c.judge(Tables({}, [row])).dead_explained
    assert explained[0] == 8 and f"{MAX - 1} sends unseen" in explained[1]
    assert "ack after the death" in explained[1]
    # the same ack, returned 1 s before the row died: that ack was lost
    c.first_ack[8] = time.monotonic() - 1.0
    assert c.judge(Tables({}, [row])).dead_unexplained == [8]


def test_a_delivery_after_death_is_reported() -> None:
    c = settling()
    poison_released_to_death(c)
    report = c.judge(Tables({8: now_ns()}, [dead(7, error="poison", ago_s=10)]))
    assert [(i, sub) for i, sub, _ in report.after_dead] == [(7, "s1")] * MAX


def test_a_delivery_after_a_reject_that_answered_one_is_reported() -> None:
    c = settling()
    now = time.monotonic()
    c.deliveries[7] = [(now - 11, "s1", 1)]
    c.settlements[7] = [Settled("reject", "s1", now - 10, now - 9.9, True, 0.0)]
    c.delivered([(7, 2)], "s2")
    assert [(i, sub) for i, sub, _ in c.judge().after_dead] == [(7, "s2")]


def test_a_delivery_during_the_reject_that_stamped_time_dead_is_not_after_the_death() -> None:
    """time_dead is the burial's stamp as the reject began writing; its transaction may wait
    for the row that a send of the same message holds locked, and commit after that send
    (the fault suite's 71310: delivered 0.508 s after its time_dead, 0.116 s before the
    reject returned). A reject call that answered 1 and was in flight at time_dead bounds
    the death by its return; a delivery after that is reported still."""
    c = settling()
    now = time.monotonic()
    c.deliveries[7] = [(now - 11, "s1", 1), (now - 9.2, "s2", 2)]  # 0.8 s after time_dead
    c.settlements[7] = [Settled("reject", "s1", now - 10.1, now - 9.0, True, 0.0)]
    row = dead(7, error="poison", ago_s=10)
    assert c.judge(Tables({8: now_ns()}, [row])).after_dead == []
    c.deliveries[7].append((now - 8.0, "s3", 3))  # 1 s after the reject returned
    report = c.judge(Tables({8: now_ns()}, [row]))
    assert [(i, sub) for i, sub, _ in report.after_dead] == [(7, "s3")]


def test_a_delivery_past_max_attempts_is_reported() -> None:
    c = settling()
    c.delivered([(7, MAX + 1)], "s1")
    assert c.judge().beyond_max == [(7, MAX + 1)]


def test_a_delivery_within_a_release_delay_or_a_renewal_is_reported() -> None:
    c = settling()
    now = time.monotonic()
    c.settlements[8] = [
        Settled("release", "s1", now - 3, now - 2.9, True, 10.0),
        Settled("renew", "s1", now - 3, now - 2.9, None, 10.0),  # not known to be renewed
    ]
    c.delivered([(8, 2)], "s2")
    assert [(i, verb) for i, verb, _ in c.judge().early] == [(8, "release")]


def test_a_quick_redelivery_after_a_release_is_not_in_flight_twice() -> None:
    c = settling(ack_wait_s=30.0)
    now = time.monotonic()
    c.deliveries[7] = [(now - 5, "s1", 1), (now - 4, "s2", 2)]
    c.settlements[7] = [Settled("release", "s1", now - 4.9, now - 4.8, True, 0.0)]
    c.delivered([(7, 2)], "s3")  # no release since s2's: in flight twice
    report = c.judge()
    assert [i for i, *_ in report.in_flight_twice] == [7]
    assert report.reasons["released by its subscriber"] == 1


def test_dead_letter_attempts_and_last_error_are_judged() -> None:
    c = settling()
    poison_released_to_death(c)
    report = c.judge(Tables({8: now_ns()}, [dead(7, attempts=MAX - 1, error="other")]))
    assert report.attempts_short == [(7, MAX - 1, MAX)]
    assert report.bad_reason == [(7, "other")]
    c = settling()
    c.delivered([(7, 1)], "s1")
    report = c.judge(Tables({}, [dead(7, attempts=1, error=None)]))
    # nobody rejected it: it died of its attempts, all MAX of them; and some error is kept
    assert report.attempts_off == [(7, 1, MAX)]
    assert report.bad_reason == [(7, None)]


# -- a dead letter's attempts below what was seen: only a fault that can lose a send's count --
A, B = "127.0.0.1:1001", "127.0.0.1:1002"  # the two servers


def rejected_at_attempt_2(
    *faults: tuple[str, float, str], attempts: int = 1, sender: str = A
) -> Report:
    """Poison 7 sent by ``sender`` at attempt 1 (10 s ago) and 2 (6 s ago, to s2), rejected
    by s2 (the call ran 3 s ago, answered 1: by the other server if ``sender`` died), dead
    with ``attempts``, amid ``faults`` (what, when it was over, s ago, server)."""
    c = Checker(ack_wait_s=0.0, max_attempts=MAX)
    c.insert([7], poison=[7])
    now = time.monotonic()
    c.deliveries[7] = [(now - 10, "s1", 1), (now - 6, "s2", 2)]
    c.senders.update({(7, now - 10): sender, (7, now - 6): sender})
    c.settlements[7] = [Settled("reject", "s2", now - 3.0, now - 2.9, True, 0.0)]
    c.events = [Fault(what, now - ago, now - ago - 0.05, server) for what, ago, server in faults]
    return c.judge(Tables({}, [dead(7, attempts=attempts, error="poison", ago_s=2.9)]))


def test_a_dead_letters_attempts_one_below_what_was_seen_pass_after_its_senders_kill() -> None:
    """7's send at attempt 2 was never counted: its server was killed before its postpone,
    and the reject, answered by the other server, wrote the epoch (1). A database restart,
    or a kill of a server not known, explains it too."""
    for fault in [
        ("msgtable SIGKILL", 5.0, A),
        ("msgtable SIGTERM under load", 4.0, A),
        ("database restart", 4.0, ""),
        ("msgtable SIGKILL", 5.0, ""),
    ]:
        report = rejected_at_attempt_2(fault)
        assert report.violations() == {}, fault
        assert report.attempts_uncounted == [(7, 1, 2)]
        assert "attempts below what was seen after a fault 1" in report.summary()
    assert rejected_at_attempt_2(("msgtable SIGKILL", 5.0, B), sender="").violations() == {}
    # by two: both deliveries above the attempts were followed by their sender's kill
    assert rejected_at_attempt_2(("msgtable SIGKILL", 5.0, A), attempts=0).violations() == {}


def test_a_dead_letters_attempts_below_what_was_seen_pass_after_its_senders_link_fault() -> None:
    """The network's faults on a database link lose a send's count as a kill does: the
    sender's link cut or slow (its lease lost, its postpone never written), or every
    server's links reset."""
    for fault in [
        ("database link cut", 5.0, A),
        ("database link slow", 4.0, A),
        ("database links reset", 4.0, ""),
    ]:
        report = rejected_at_attempt_2(fault)
        assert report.violations() == {}, fault
        assert report.attempts_uncounted == [(7, 1, 2)]


def test_a_dead_letters_attempts_below_what_was_seen_pass_after_its_sender_lost_them() -> None:
    """Its sender lost the table after the send at attempt 2 (a lease run out on a busy
    machine, no fault) and could not write its postpones any more (it counts them: the
    scrapes saw them rise); the other server's such loss, or one before the send, does not
    explain it."""

    def lost(server: str, ago_s: float) -> Report:
        c = Checker(ack_wait_s=0.0, max_attempts=MAX)
        c.insert([7], poison=[7])
        now = time.monotonic()
        c.deliveries[7] = [(now - 10, "s1", 1), (now - 6, "s2", 2)]
        c.senders.update({(7, now - 10): A, (7, now - 6): A})
        c.settlements[7] = [Settled("reject", "s2", now - 3.0, now - 2.9, True, 0.0)]
        c.count_losses = [(server, now - ago_s - 0.5, now - ago_s)]
        return c.judge(Tables({}, [dead(7, attempts=1, error="poison", ago_s=2.9)]))

    report = lost(A, 4.0)
    assert report.violations() == {}
    assert report.attempts_uncounted == [(7, 1, 2)]
    assert short(lost(B, 4.0)) == [(7, 1, 2)]
    assert short(lost(A, 7.5)) == [(7, 1, 2)]  # before the send
    assert short(lost(A, 1.0)) == [(7, 1, 2)]  # after the reject


def test_a_fault_of_the_other_servers_or_the_clients_links_loses_no_count() -> None:
    """The other server's database link cut, or the clients' connections reset (the server
    writes its counts over its own database link), explain no undercount."""
    assert short(rejected_at_attempt_2(("database link cut", 5.0, B))) == [(7, 1, 2)]
    assert short(rejected_at_attempt_2(("database link slow", 5.0, B))) == [(7, 1, 2)]
    assert short(rejected_at_attempt_2(("client links reset", 5.0, ""))) == [(7, 1, 2)]


def short(report: Report) -> list[tuple[int, int, int]]:
    assert report.attempts_uncounted == []
    return report.attempts_short


def test_a_dead_letters_attempts_below_what_was_seen_without_such_a_fault_are_reported() -> None:
    """No fault; one that loses no count (a subscriber killed); the other server killed;
    the sender killed before the send at attempt 2 (7.5 s ago), or after the reject; and an
    undercount by two that only one delivery was followed by a kill of its sender."""
    assert short(rejected_at_attempt_2()) == [(7, 1, 2)]
    assert short(rejected_at_attempt_2(("subscriber killed mid-batch", 5.0, ""))) == [(7, 1, 2)]
    assert short(rejected_at_attempt_2(("msgtable SIGKILL", 5.0, B))) == [(7, 1, 2)]
    assert short(rejected_at_attempt_2(("msgtable SIGKILL", 7.5, A))) == [(7, 1, 2)]
    assert short(rejected_at_attempt_2(("msgtable SIGKILL", 1.0, A))) == [(7, 1, 2)]
    report = rejected_at_attempt_2(("msgtable SIGKILL", 7.5, A), attempts=0)
    assert report.attempts_short == [(7, 0, 2)]
    assert "dead letter's attempts below what was seen (id, attempts, seen)" in (
        report.violations()
    )


def test_a_reason_of_a_call_that_answered_zero_amid_a_server_kill_may_be_in_last_error() -> None:
    """7 was released once (its reason kept), then s2's reject reached its server, which was
    killed before it answered: the retry, answered by the other server, found 7 dead and
    said 0. Its reason is kept, as it may be; the same answer with no fault during the call
    wrote nothing."""
    c = settling()
    c.delivered([(7, 1)], "s1")
    c.settled("release", [7], "s1", time.monotonic(), 1, 0.1, "poison: failed")
    c.delivered([(7, 2)], "s2")
    start = time.monotonic()
    c.event("msgtable SIGKILL", server=A)
    c.settled("reject", [7], "s2", start, 0, 0.0, "poison 7: rejected")
    report = c.judge(Tables({}, [dead(7, attempts=MAX, error="poison 7: rejected")]))
    assert report.bad_reason == []
    c.events.clear()
    report = c.judge(Tables({}, [dead(7, attempts=MAX, error="poison 7: rejected")]))
    assert report.bad_reason == [(7, "poison 7: rejected")]
    # a reset of the client's connections during the call lost its answer the same way
    c.event("client links reset", began=start)
    report = c.judge(Tables({}, [dead(7, attempts=MAX, error="poison 7: rejected")]))
    assert report.bad_reason == []


def test_an_ack_in_doubt_that_committed_counts_as_acked_and_one_never_sent_does_not() -> None:
    """8's ack call failed (the answer lost in a fault) but the table has it acked: acked.
    9 is acked in the table though no ack call ever named it: reported."""
    c = settling()
    poison_released_to_death(c)
    c.first_ack.pop(8)
    c.ack_failed([8])
    c.insert([9])
    c.delivered([(9, 1)], "s3")
    report = c.judge(Tables({8: now_ns(), 9: now_ns()}, [dead(7, error="poison")]))
    assert report.acks_in_doubt_committed == 1
    assert report.never_acked == [9]


def test_a_delivery_while_the_ack_that_wrote_time_acked_was_in_flight_is_not_after_it() -> None:
    """time_acked is the ack's own timestamp, taken before its UPDATE waited for the row's
    lock (a send of the same message held it): the ack committed somewhere between that
    and its call's return. A delivery in between is not after the ack; one after the call
    returned is (the chaos run's false "delivered after their ack" 0.617 s after a time_acked
    whose call returned 0.79 s after it)."""
    c = settling()
    c.delivered([(8, 1)], "s1")
    start = time.monotonic()
    acked_ns = time.time_ns()  # the server's stamp as the call began
    c.delivered([(8, 2)], "s2")  # sent before the ack's UPDATE got the row
    time.sleep(0.6)  # past WIRE_SLACK_S: the call waited for the lock
    c.delivered([(8, 3)], "s3")
    c.acked([8], start)
    report = c.judge(Tables({8: acked_ns}, []))
    assert report.after_ack == []
    c.delivered([(8, 4)], "s4")  # and one after the call returned: after the ack
    time.sleep(0.6)
    c.delivered([(8, 5)], "s5")
    report = c.judge(Tables({8: acked_ns}, []))
    assert [(i, sub) for i, sub, _ in report.after_ack] == [(8, "s5")]


def test_a_delivery_after_the_tables_time_acked_is_after_its_ack() -> None:
    c = settling()
    poison_released_to_death(c)
    c.first_ack.pop(8)
    c.ack_failed([8])
    acked_ns = time.time_ns() - 10 * 10**9  # committed 10 s ago; its answer was lost
    c.delivered([(8, 2)], "s3")
    report = c.judge(Tables({8: acked_ns}, [dead(7, error="poison")]))
    assert [(i, sub) for i, sub, _ in report.after_ack] == [(8, "s2"), (8, "s3")]


# -- a subscription's checker: its filter, its state table, the purge rule --------------------
def odd(i: int) -> bool:
    """The filter of these cases: the odd ids."""
    return i % 2 == 1


def subscription(ack_wait_s: float = 0.0, purges: bool = False) -> Checker:
    """Subscription "odd" of ids 1..6 (5 poison); it gets 1, 3 and 5."""
    c = Checker(ack_wait_s, MAX, group="odd", selects=odd, purges=purges)
    c.insert([1, 2, 3, 4, 5, 6], poison=[5, 6])
    return c


def settled_by_odd(c: Checker) -> Tables:
    """1 and 3 delivered and acked, poison 5 released to death: its state table."""
    c.delivered([(1, 1), (3, 1)], "odd-s1")
    c.acked([1, 3])
    for attempt in range(1, MAX + 1):
        c.delivered([(5, attempt)], "odd-s2")
        c.settled("release", [5], "odd-s2", time.monotonic(), 1, 0.0, "poison")
    return Tables({1: now_ns(), 3: now_ns()}, [dead(5, error="poison")])


def test_a_subscription_that_got_its_matches_once_and_killed_its_poison_passes() -> None:
    c = subscription()
    report = c.judge(settled_by_odd(c), message_ids={1, 2, 3, 4, 5, 6})
    assert (report.inserted, report.poison, report.dead_poison) == (3, 1, 1)
    assert report.violations() == {}
    assert report.summary().startswith("subscription odd: 3 messages (1 poison)")


def test_a_subscriptions_duplicate_in_flight_or_after_its_ack_is_reported() -> None:
    c = subscription(ack_wait_s=30.0)
    tables = settled_by_odd(c)
    now = time.monotonic()  # 1 was delivered 11 s ago and acked 10 s ago
    c.deliveries[1] = [(now - 11, "odd-s1", 1)]
    c.first_ack[1] = now - 10
    tables.source[1] = time.time_ns() - 10 * 10**9
    c.delivered([(1, 2)], "odd-s2")  # after its ack, within the ack wait
    report = c.judge(tables)
    assert [i for i, *_ in report.in_flight_twice] == [1]
    assert [(i, sub) for i, sub, _ in report.after_ack] == [(1, "odd-s2")]


def test_a_lazy_subscriptions_ack_lost_with_its_senders_window_is_counted_not_a_violation() -> None:
    """A lazy subscription's ack lives in its sender's window until the cursor passes it:
    sent again after a fault that can lose that window (a server killed or stopped, its
    database link or the database down) came between the ack and the send, it is counted
    apart; sent again after its ack with no such fault between, or by an eager group, it is
    a violation as before."""
    for lazy, fault, expected in (
        (True, "msgtable SIGKILL", ([], 1)),
        (True, "subscriber killed mid-batch", ([1], 0)),  # loses no window
        (False, "msgtable SIGKILL", ([1], 0)),  # an eager group's ack is a committed row
    ):
        c = Checker(30.0, MAX, group="odd", selects=odd, lazy=lazy)
        c.insert([1, 2, 3, 4, 5, 6], poison=[5, 6])
        tables = settled_by_odd(c)
        now = time.monotonic()  # 1 was delivered 11 s ago, acked 10 s ago, then the fault
        c.deliveries[1] = [(now - 11, "odd-s1", 1)]
        c.first_ack[1] = now - 10
        tables.source.pop(1)  # no state row: acked in the window
        c.events.append(Fault(fault, now - 5, now - 5))
        c.delivered([(1, 1)], "odd-s2")
        report = c.judge(tables)
        got = ([i for i, _, _ in report.after_ack], report.after_ack_window_lost)
        assert got == expected, (lazy, fault)
        assert ("delivered after their ack (id, sub, s)" in report.violations()) == bool(
            expected[0]
        )
        # how long before the fault the lost ack was made: acked 10 s ago, the fault 5 s ago
        assert report.window_lost_ack_age_s == pytest.approx(5.0 if expected[1] else 0.0)


def test_a_delivery_or_a_state_row_outside_the_filter_is_reported() -> None:
    c = subscription()
    tables = settled_by_odd(c)
    c.delivered([(2, 1)], "odd-s1")
    tables.source[4] = None  # the fan-out handed 4 over: it does not match
    report = c.judge(tables)
    assert report.outside_filter == [2, 4]
    assert report.unknown == []
    assert "outside its filter, delivered or given a state row" in report.violations()
    assert "outside the filter" in c.history(2)


def test_a_message_a_subscription_never_got_is_reported_even_with_purges() -> None:
    c = subscription(purges=True)
    tables = settled_by_odd(c)
    del tables.source[3]  # acked: purged, fine
    c.insert([7])  # matches, never handed over, never delivered
    report = c.judge(tables, message_ids={2, 4, 5, 6, 7})
    assert (report.never_delivered, report.never_acked, report.in_neither) == ([7], [7], [7])
    assert report.purged == 1
    assert report.gone_while_held == []


def test_a_row_gone_from_the_message_table_before_every_holder_settled_it_is_reported() -> None:
    """The message table lost 3 (unacked in the state table), 5 (dead in place: dead letters
    hold their row) and 7 (matched, never handed over); 1 went after its ack, as it may."""
    c = subscription()
    tables = settled_by_odd(c)
    tables.source[3] = None
    c.first_ack.pop(3)
    c.insert([7])
    report = c.judge(tables, message_ids={2, 4, 6})
    assert report.gone_while_held == [(3, "unacked"), (5, "dead"), (7, "never handed over")]
    assert "gone from the message table while held (id, state in the group)" in (
        report.violations()
    )


def test_an_ack_in_doubt_whose_row_was_purged_counts_as_acked_only_with_purges() -> None:
    c = subscription(purges=True)
    tables = settled_by_odd(c)
    c.first_ack.pop(3)
    c.ack_failed([3])
    del tables.source[3]
    report = c.judge(tables)
    assert (report.purged, report.acks_in_doubt_purged, report.never_acked) == (1, 1, [])
    c.purges = False
    report = c.judge(tables)
    assert (report.never_acked, report.in_neither) == ([3], [3])


def test_what_a_subscription_has_not_settled_includes_what_it_was_not_handed() -> None:
    c = subscription()
    c.delivered([(1, 1)], "odd-s1")
    c.acked([1])  # and purged from the state table
    pending = c.unsettled(unacked={3}, dead=set(), present={3})
    assert pending == {
        "ordinary ids unacked in the table": [3],
        "poison ids not dead": [5],
        "ids not handed over": [5],
    }


def test_a_state_table_is_read_with_its_dead_in_place_apart() -> None:
    db = sa.create_engine("sqlite://")
    with db.begin() as conn:
        conn.exec_driver_sql(
            "create table t__odd (id bigint, time_acked bigint, time_next bigint, epoch bigint, "
            "last_error varchar(100), time_dead bigint)"
        )
        conn.exec_driver_sql(
            f"insert into t__odd values (1, 10, null, 1, null, null), "
            f"(3, null, 20, 2, null, null), (5, null, {DEAD_TIME_NEXT}, 5, 'poison', 30), "
            f"(7, 40, {DEAD_TIME_NEXT}, 1, null, null)"
        )
    tables = read_state_table(db, "t__odd")
    assert tables.source == {1: 10, 3: None, 7: 40}  # 7 was acked: not dead
    assert tables.dead == [DeadRow(5, 5, "poison", 30)]
    assert read_state_pending(db, "t__odd") == ({3}, {5}, {1, 3, 5, 7})


def test_a_release_running_when_the_next_delivery_came_explains_a_quick_redelivery() -> None:
    """s1's release of 7 started just before the send to s2 and landed after it: the message
    was due again at once, and s3 got it while s2 held it. A release that returned well
    before the send to s2 came off the stream (more than WIRE_SLACK_S) explains nothing."""
    c = settling(ack_wait_s=30.0)
    now = time.monotonic()
    c.deliveries[7] = [(now - 5, "s1", 1), (now - 1.00, "s2", 2), (now - 0.9, "s3", 3)]
    c.settlements[7] = [Settled("release", "s1", now - 1.01, now - 0.95, True, 0.0)]
    assert c.judge().in_flight_twice == []
    c.settlements[7] = [Settled("release", "s1", now - 1.2, now - 1.1, True, 0.0)]
    assert c.judge().in_flight_twice == []  # returned 0.1 s before: on the wire already
    c.settlements[7] = [Settled("release", "s1", now - 2.2, now - 2.1, True, 0.0)]
    assert [i for i, *_ in c.judge().in_flight_twice] == [7]


def test_a_quick_redelivery_reports_the_gap_between_the_servers_sends_too() -> None:
    """Each delivery's send as its server stamped it (the message's sent_ns) is kept: a
    redelivery reported in flight twice says how far apart the sends were as well as the
    receipts (a first delivery received late makes the receipts' gap the shorter)."""
    c = settling(ack_wait_s=30.0)
    wall = time.time_ns()
    c.delivered([(7, 1)], "s1", "server1", [wall - 3 * 10**9])  # sent 3 s before its receipt
    c.delivered([(7, 2)], "s2", "server1", [wall])
    c.delivered([(8, 1)], "s1", "server1")  # no stamp: the sends' gap is not known
    c.delivered([(8, 2)], "s2", "server1", [wall])
    got = {i: (gap, sent_gap) for i, gap, sent_gap in c.judge().in_flight_twice}
    assert set(got) == {7, 8}
    assert got[7][0] < 1 and 2.9 < (got[7][1] or 0) < 3.5
    assert got[8][1] is None
    report = c.judge()  # and the first delivery of 7 counts as received late
    assert report.received_late == 1 and 2.9 < report.longest_receipt_s < 3.5


def test_in_flight_twice_is_judged_by_the_servers_sends_when_they_are_stamped() -> None:
    """The ack wait runs from the server's send (the message's sent_ns: what the client's
    renewals count from too), not from the receipt: a first delivery received 1.4 s after
    its send and the redelivery 2.5 s after that send (ack wait 2 s, backoff 0.5 s) are 1.1 s
    apart as received, and no message was in flight twice. Sends closer than the ack wait
    still are, and without stamps the receipts decide, as before."""
    c = settling(ack_wait_s=2.0)
    wall = time.time_ns()
    c.delivered([(8, 1)], "s1", "server1", [wall - 1_400_000_000])  # received 1.4 s late
    time.sleep(1.1)
    c.delivered([(8, 2)], "s1", "server1", [time.time_ns()])
    assert c.judge().in_flight_twice == []
    c = settling(ack_wait_s=2.0)
    c.delivered([(8, 1)], "s1", "server1", [time.time_ns() - 200_000_000])
    time.sleep(1.1)
    c.delivered([(8, 2)], "s1", "server1", [time.time_ns()])  # sent 1.3 s after the first
    assert [i for i, *_ in c.judge().in_flight_twice] == [8]
    c = settling(ack_wait_s=2.0)
    c.delivered([(8, 1)], "s1", "server1")
    time.sleep(1.1)
    c.delivered([(8, 2)], "s1", "server1")
    assert [i for i, *_ in c.judge().in_flight_twice] == [8]


def test_a_duplicate_keeps_its_first_subscribers_reason_when_the_sends_are_stamped() -> None:
    """The reason a duplicate is counted under is its first subscriber's (here, an ack on
    purpose too late), whether or not the server stamped the sends (a variable of the sends'
    gap once shadowed the subscriber's name: every such duplicate fell to "ack lost in a
    fault", and the chaos test's "ack too late" count to 0)."""
    c = settling(ack_wait_s=0.0)
    c.dropped([8], "s1", "ack too late")
    wall = time.time_ns()
    c.delivered([(8, 1)], "s1", "server1", [wall])
    c.delivered([(8, 2)], "s2", "server1", [wall])
    assert c.judge().reasons["ack too late"] == 1


def test_a_reason_given_by_a_call_that_changed_nothing_is_not_expected_in_last_error() -> None:
    """Poison 7 died of its attempts before its subscriber's late release (which answered 0):
    that release's reason was never written; the default one is right."""
    c = settling()
    c.delivered([(7, MAX)], "s1")
    c.settled("release", [7], "s1", time.monotonic(), 0, 0.1, "poison: failed")
    report = c.judge(Tables({}, [dead(7, error="no ack after 3 attempts")]))
    assert report.bad_reason == []
    c.settled("release", [7], "s1", time.monotonic(), None, 0.1, "poison: failed again")
    report = c.judge(Tables({}, [dead(7, error="no ack after 3 attempts")]))
    assert report.bad_reason == []  # the failed call may not have written it either
    c.settled("release", [7], "s1", time.monotonic(), 1, 0.1, "poison: failed at last")
    for error in ("poison: failed again", "poison: failed at last"):
        assert c.judge(Tables({}, [dead(7, error=error)])).bad_reason == []
    report = c.judge(Tables({}, [dead(7, error="no ack after 3 attempts")]))
    assert report.bad_reason == [(7, "no ack after 3 attempts")]


# -- an ordered table: the order checker's rules, through the suite's checker -----------------
class Sent:
    """A message as an ordered table's subscriber gets it (what OrderLog.received reads)."""

    def __init__(self, i: int, sent_ns: int) -> None:
        self.id, self.sent_ns = i, sent_ns
        self.values = {"k": "a" if i <= 4 else "b"}


def ordered() -> Checker:
    """Ids 1..4 of key "a" and 5..6 of key "b", with an ack wait of 10 s."""
    c = Checker(ack_wait_s=10.0, order_key=lambda i: "a" if i <= 4 else "b", label="ordered")
    c.insert([1, 2, 3, 4, 5, 6])
    return c


def batch(c: Checker, sub: str, ids: list[int], settle: str = "ack") -> None:
    """``sub`` gets ``ids`` in one batch sent now, and begins to ``settle`` them (ack,
    release, reject; "": it does not)."""
    assert c.order is not None
    sent_ns = time.time_ns()
    ds = c.order.received(sub, [Sent(i, sent_ns) for i in ids], "k")
    if settle:
        time.sleep(0.001)
        c.settle_began(ids, settle)
        c.order.settling(ds)
    time.sleep(0.001)


def test_an_ordered_tables_keys_one_batch_at_a_time_in_order_pass_with_figures() -> None:
    c = ordered()
    batch(c, "s1", [1, 2, 5])  # a run of key a and key b's head, one batch
    batch(c, "s2", [3, 6])
    batch(c, "s1", [4])
    report = c.judge()
    assert report.order_violations == []
    assert (report.order_keys, report.order_batches) == (2, 3)
    assert (report.batches_with_runs, report.longest_run) == (1, 2)
    assert report.keys_on_several_subscribers == 2
    assert "order per key: 2 keys, 3 batches" in report.summary()
    assert "key 'a', 4 deliveries" in c.key_story("a")


def test_a_keys_batch_while_its_last_batch_is_in_flight_is_reported() -> None:
    c = ordered()
    batch(c, "s1", [1, 2], settle="")  # in flight for its ack wait (10 s)
    batch(c, "s2", [3])
    report = c.judge()
    (flight, head) = report.order_violations
    assert flight[0] == "a" and "left flight" in flight[1]
    assert head == (
        "a",
        "key 'a': batch [3] to s2 skipped the key's head 1 (acked, rejected or dead never)",
    )
    assert "order per key broken (key, what)" in report.violations()
    assert report.order_broken_by_kind() == {
        "a batch while the key's last was in flight": 1,
        "a batch that skipped the key's head": 1,
    }
    assert "order broken 2 (1 a batch while the key's last was in flight, 1 a batch" in (
        report.summary()
    )


def test_first_deliveries_out_of_enqueue_order_are_reported() -> None:
    c = ordered()
    batch(c, "s1", [2])
    batch(c, "s1", [1])
    problems = [line for key, line in c.judge().order_violations if key == "a"]
    assert any("first deliveries out of order" in line for line in problems), problems


def test_a_batch_carrying_a_keys_messages_out_of_order_is_reported() -> None:
    c = ordered()
    batch(c, "s1", [2, 1, 5])
    (problem,) = c.judge().order_violations
    assert problem == ("a", "key 'a': a batch to s1 carried [2, 1], not in enqueue order")


def test_a_late_ack_by_an_earlier_holder_frees_the_key_but_an_old_failed_one_does_not() -> None:
    """s1 held 1 past its ack wait, s2 was sent it again, and s1's late ack (which acks the
    message whoever holds it now) freed key a: its next batch to s2 is in order. A settlement
    that began over an ack wait before the send again (an ack that failed) frees nothing."""
    c = ordered()
    assert c.order is not None
    s, ms = time.time_ns(), 1_000_000

    def log(
        late_settle_ms: int, resend_ms: int, returned_ms: int | None = None
    ) -> list[tuple[Hashable, str]]:
        c.settled_for_good = {1: s + late_settle_ms * ms}
        done = None if returned_ms is None else s + returned_ms * ms
        c.order.deliveries[:] = [
            Delivery(1, "a", "s1", s, s + ms, s + late_settle_ms * ms, done),
            Delivery(1, "a", "s2", s + resend_ms * ms, s + (resend_ms + 1) * ms),
            Delivery(2, "a", "s2", s + (resend_ms + 1100) * ms, s + (resend_ms + 1101) * ms),
        ]
        return c.judge().order_violations

    # the ack wait is 10 s: s2 got 1 again at 10.5 s
    assert log(late_settle_ms=11_500, resend_ms=10_500) == []  # the late ack came after
    assert log(late_settle_ms=10_490, resend_ms=10_500) == []  # it raced the resend
    assert log(late_settle_ms=10_490, resend_ms=10_500, returned_ms=10_501) == []
    # a settlement that returned before the resend (say, the release that made 1 due again)
    # did not end the resend's flight
    (problem,) = log(late_settle_ms=10_490, resend_ms=10_500, returned_ms=10_495)
    assert problem[0] == "a" and "before batch [1] to s2 left flight" in problem[1]
    (problem,) = log(late_settle_ms=10, resend_ms=12_500)  # an ack that failed, long before
    assert problem[0] == "a" and "before batch [1] to s2 left flight" in problem[1]
    # a call begun long before that returned only after the resend (a release retried across
    # a database restart) may have been written after it: it frees the key from the resend on
    assert log(late_settle_ms=100, resend_ms=10_500, returned_ms=10_600) == []


def test_a_batch_that_skips_its_keys_released_head_is_reported() -> None:
    """A released message parks its key: the key's next batch begins with it again. One
    that begins after it (its key's later message went first) skipped the head, though no
    batch of the key was in flight; an ack, a reject or a death before the batch is fine."""
    c = ordered()
    batch(c, "s1", [1], settle="release")
    batch(c, "s2", [2, 3])
    (problem,) = c.judge().order_violations
    assert problem == (
        "a",
        "key 'a': batch [2, 3] to s2 skipped the key's head 1 (acked, rejected or dead never)",
    )
    for settle in ("ack", "reject"):
        c = ordered()
        batch(c, "s1", [1], settle=settle)
        batch(c, "s2", [2, 3])
        assert c.judge().order_violations == []
    c = ordered()
    batch(c, "s1", [1], settle="release")
    died = time.time_ns()  # dead of its attempts before [2, 3] came
    batch(c, "s2", [2, 3])
    assert c.judge(Tables({2: 1, 3: 1}, [DeadRow(1, 5, "poison", died)])).order_violations == []


def test_a_stalled_subscriber_can_eat_several_sends_of_one_id() -> None:
    """A stalled subscriber's window gives its credit back as each ack wait ends, so the
    server goes on sending to it: one stall of ``lasts_s`` may eat a send of one id every ack
    wait (CI saw attempts 4 and 5 of an id go unseen in one 5 s stall with a 2 s ack wait).
    A short stall eats one send, like any other fault."""
    c = Checker(ack_wait_s=2.0, max_attempts=5)
    c.insert([8])
    c.delivered([(8, 2)], "s1")
    c.dropped([8], "s1", "subscriber killed")
    c.delivered([(8, 3)], "s2")
    c.dropped([8], "s2", "subscriber killed")
    c.event("msgtable SIGKILL")  # ate attempt 1
    c.event("subscriber stalled", lasts_s=1.0)  # may eat one: 3 unseen, 2 explained
    assert c.judge(Tables({}, [dead(8, attempts=5)])).dead_unexplained == [8]
    c.events.pop()
    c.event("subscriber stalled", lasts_s=5.0)  # sends at t, t+2, t+4: three
    (explained,) = c.judge(Tables({}, [dead(8, attempts=5)])).dead_explained
    assert explained[0] == 8 and "3 sends unseen, amid 2 faults" in explained[1]


def test_a_late_release_or_renew_that_changed_a_later_delivery_is_reported() -> None:
    """7 went out at attempt 2 before s1's handler, holding attempt 1, released and renewed
    it: those calls name attempt 1 and must change nothing. A call by id alone (attempt 0),
    or one that began before the later delivery came off a stream, may."""
    c = settling()
    now = time.monotonic()
    c.deliveries[7] = [(now - 9, "s1", 1), (now - 5, "s2", 2)]
    c.settlements[7] = [
        Settled("renew", "s1", now - 4, now - 3.9, False, 2.0, None, 1),  # left alone: fine
        Settled("release", "s1", now - 3, now - 2.9, True, 0.0, None, 1),  # released it
        Settled("release", "s1", now - 6, now - 5.9, True, 0.0, None, 1),  # before attempt 2
        Settled("release", "x", now - 2, now - 1.9, True, 0.0, None, 0),  # by id alone
    ]
    report = c.judge()
    assert report.late_settlements == 2
    assert report.late_settled == [(7, "release", 1, 2)]
    assert "a late release or renew changed a later delivery" in " ".join(report.violations())
    assert "late releases or renewals of a replaced delivery 2 (changed it 1)" in report.summary()


def test_a_late_release_may_change_a_later_delivery_whose_count_a_fault_lost() -> None:
    """Attempt 2's sender was killed before it counted the send: the table still says one
    send, so a release naming attempt 1 matches it (the table cannot tell them apart)."""
    c = settling()
    now = time.monotonic()
    c.deliveries[7] = [(now - 9, "s1", 1), (now - 5, "s2", 2)]
    c.senders[(7, now - 5)] = A
    c.events.append(Fault("msgtable SIGKILL", now - 4, now - 4.1, A))
    c.settlements[7] = [Settled("release", "s1", now - 3, now - 2.9, True, 0.0, None, 1)]
    report = c.judge()
    assert (report.late_settlements, report.late_settled) == (1, [])


def test_a_late_release_may_change_a_later_delivery_whose_sender_lost_its_count() -> None:
    """Attempt 2's sender lost the table too late to write its postpones (a lease run out on
    a busy machine, no fault: the scrapes saw its skipped postpones rise): the table still
    says one send, so a release naming attempt 1 matches it, as after a kill. The other
    server's such loss, or one before the send or after the release, does not explain it."""

    def lost(server: str, began_ago_s: float, over_ago_s: float) -> list[object]:
        c = settling()
        now = time.monotonic()
        c.deliveries[7] = [(now - 9, "s1", 1), (now - 5, "s2", 2)]
        c.senders[(7, now - 5)] = A
        c.count_losses = [(server, now - began_ago_s, now - over_ago_s)]
        c.settlements[7] = [Settled("release", "s1", now - 3, now - 2.9, True, 0.0, None, 1)]
        return list(c.judge().late_settled)

    assert lost(A, 4.5, 4.0) == []
    assert lost(B, 4.5, 4.0) == [(7, "release", 1, 2)]
    assert lost(A, 8.0, 7.5) == [(7, "release", 1, 2)]  # before the send
    assert lost(A, 2.0, 1.5) == [(7, "release", 1, 2)]  # after the release


def test_a_close_whose_unhanded_messages_the_table_does_not_show_released_is_reported() -> None:
    """Ack wait 2 s. The first close released 7 and 8 (the table says so); 8 came back 0.1 s
    later (early), 7 after the ack wait. The second left 9 unreleased with no fault around
    it: reported; a third, amid a database restart, is excused."""
    c = settling(ack_wait_s=2.0)
    c.insert([9])
    now = time.monotonic()
    c.deliveries[7] = [(now - 9, "s1", 1), (now - 6, "s2", 2)]
    c.deliveries[8] = [(now - 9, "s1", 1), (now - 8.9, "s2", 2)]
    c.closed_mid_batch([7, 8], now - 9, now - 8.95, {7, 8})
    c.closed_mid_batch([9], now - 5, now - 4.95, set())
    c.events.append(Fault("database restart", now - 1, now - 3))
    c.closed_mid_batch([9], now - 2, now - 1.95, set())
    report = c.judge()
    assert (report.closes, report.closed_rest, report.closed_rest_found) == (3, 4, 2)
    assert report.closed_rest_early == 1
    assert report.closes_not_released == [(round(now - 5, 3), 0.0, 0.05, {9: None})]
    assert "closed mid-batch 3 (4 unhanded, found released 2, back before the ack wait 1, " in (
        report.summary()
    )


def test_a_stall_story_tells_each_second_from_the_wait_before_it() -> None:
    """The stall check's evidence: what was committed, delivered (to whom, from where) and
    acked each second, and what its table's sender's /api/state said of the group then."""
    from .scrapecheck import Scrape
    from .test_chaos import FLOWING_WAIT_S, Group

    c = Checker(ack_wait_s=2.0)
    g = Group("", c, size=2)
    began = time.monotonic()
    start = began - FLOWING_WAIT_S - 2
    c.commits.append((start + 0.5, 7))
    c.deliveries[1].append((start + 1.2, "sub1", 1))
    c.senders[(1, start + 1.2)] = "127.0.0.1:1"
    c.first_ack[1] = start + 1.4
    entry = {
        "name": g.table,
        "subscription": "",
        "backlog": {"due": 5, "scheduled": 0},
        "in_flight": 3,
        "cached": 4,
        "subscribers": 2,
        "hold_s": 0.0,
        "unseen": 0,
        "totals": {"sent": 9},
    }
    leading = Scrape("server2", "state", start + 2.5, 0.01, 1, True)
    leading.state = {"server": {}, "tables": [dict(entry, sending=True)]}
    other = Scrape("server1", "state", start + 2.6, 0.01, 2, True)
    other.state = {"server": {}, "tables": [dict(entry, cached=99, sending=False)]}
    g.stall_windows.append((began, began + 5))

    lines = g.stall_story([leading, other]).splitlines()

    assert lines[0].startswith(f"{began:.3f}-{began + 5:.3f}: 0 deliveries, 0 ids acked")
    seconds = lines[1:]
    assert len(seconds) == int(FLOWING_WAIT_S) + 2 + 5
    assert "committed 7, delivered 0" in seconds[0] and "no sender scraped" in seconds[0]
    assert "delivered 1 {'sub1<-127.0.0.1:1': 1}, acked 1" in seconds[1]
    assert "server2 sends: due 5, scheduled 0, in flight 3, cached 4, subscribers 2" in seconds[2]
    assert "cached 99" not in "\n".join(seconds)


# -- filters: a ready subscriber's filter's messages go out (tests/faults/filtercheck.py) -------
EVEN, ODD = "id % 2 = 0", "NOT (id % 2 = 0)"  # a stream filter pair, X and NOT (X), by id


def filtered(ready_odd: bool = True, odd_sent_after_s: float = 19.5) -> Checker:
    """Ids 1-20, and 102-140 even, committed 20 s ago; a subscriber of each filter ready from
    then on (the odd one unless ``ready_odd`` is False). The even ids 2-20 are sent a second
    later, a few each half second, 102-140 one a second to the end (the group flows); the
    odd ones ``odd_sent_after_s`` after their commit."""
    c = Checker(
        ack_wait_s=2.0,
        stream_filters={EVEN: lambda i: i % 2 == 0, ODD: lambda i: i % 2 == 1},
    )
    flow = list(range(102, 141, 2))
    c.insert([*range(1, 21), *flow])
    t0 = time.monotonic() - 20
    c.inserted_at = dict.fromkeys([*range(1, 21), *flow], t0)
    c.readiness = [Readiness(t0, "even", EVEN)]
    if ready_odd:
        c.readiness.append(Readiness(t0, "odd", ODD))
    for n, i in enumerate(range(2, 21, 2)):
        c.deliveries[i].append((t0 + 1 + n * 0.5, "even", 1))
    for n, i in enumerate(flow):
        c.deliveries[i].append((t0 + 1 + n, "even", 1))
    for i in range(1, 21, 2):
        c.deliveries[i].append((t0 + odd_sent_after_s, "odd", 1))
    return c


def test_messages_a_ready_subscribers_filter_passes_stalled_past_the_ack_wait_are_reported():
    report = filtered().judge()
    (stall,) = report.filter_stalls
    assert stall.key == ODD and stall.lasted_s > 15 and stall.waiting == [1, 3, 5, 7, 9]
    assert "a filter's messages waited past the ack wait" in " ".join(report.violations())
    assert "a filter's messages stalled 1 (filters 2)" in report.summary()
    # the other filter's stream went on: the stall is its own
    assert filtered(odd_sent_after_s=1.0).judge().filter_stalls == []
    # a message whose first send no subscriber saw (a fault ate it) was in flight: not waiting
    c = filtered()
    for i in range(1, 21, 2):
        c.deliveries[i] = [(c.inserted_at[i] + 19.5, "odd", 2)]
    assert c.judge().filter_stalls == []


def test_a_pause_of_the_whole_group_is_no_filters_stall():
    c = filtered()
    for i in range(2, 141, 2):
        if i in c.deliveries:
            c.deliveries[i] = [(c.inserted_at[i] + 19.6, "even", 1)]
    assert c.judge().filter_stalls == []


def test_a_filters_messages_are_not_judged_while_no_subscriber_of_it_is_ready():
    assert filtered(ready_odd=False).judge().filter_stalls == []


def test_a_filters_messages_delivered_within_the_ack_wait_pass():
    assert filtered(odd_sent_after_s=2.5).judge().filter_stalls == []
    assert filtered(odd_sent_after_s=6.0).judge().filter_stalls[0].lasted_s >= 3


def test_a_filters_stall_during_and_just_after_a_server_fault_is_not_reported():
    c = filtered(odd_sent_after_s=6.0)
    t0 = c.inserted_at[1]
    c.events.append(Fault("msgtable SIGKILL", t0 + 0.5, t0, "server1"))
    assert c.judge().filter_stalls == []
    c = filtered(odd_sent_after_s=6.0)  # a subscriber's own fault excuses no other
    c.events.append(Fault("subscriber killed mid-batch", t0 + 0.5, t0))
    assert len(c.judge().filter_stalls) == 1
    c = filtered()  # once the filter's messages flowed again after the fault, it counts
    c.events.append(Fault("database restart", t0 + 0.5, t0))
    c.deliveries[1] = [(t0 + 7, "odd", 1)]
    (stall,) = c.judge().filter_stalls
    assert stall.key == ODD and abs(stall.began - (t0 + 7)) < 0.2 and stall.waiting[:2] == [3, 5]


def test_a_filters_stall_while_messages_no_ready_filter_passes_may_fill_the_cache_is_excused():
    c = filtered()
    c.stranded_limit = 5
    c.readiness = [Readiness(c.inserted_at[1], "odd", ODD)]  # the even ids' reader is gone
    for i in range(2, 21, 2):
        c.deliveries[i] = [(c.inserted_at[i] + 19.9, "even", 1)]  # they wait till the end
    assert c.judge().filter_stalls == []  # 10 even ids waited to the end: they may fill it
    c.stranded_limit = 31  # (and the 20 others the group flows with, early on)
    assert [s.key for s in c.judge().filter_stalls] == [ODD]


def test_an_ordered_groups_messages_waiting_for_their_key_are_not_judged_as_a_filters():
    c = filtered()
    c.order_key = lambda i: i % 3
    c.order = OrderLog()
    report = c.judge()
    assert report.filter_stalls == [] and report.filters == 0


def test_a_filters_stall_while_its_table_changed_senders_is_excused_as_a_fault_is():
    # The chaos run's two failures of 40,000 messages: the table's lease ran out on a busy
    # machine (no fault injected) and the other server took it over; a filter's subscribers
    # still sat on the old sender, which could not send and had not noticed yet, while
    # another filter's came to the new one first. The scrapes saw the sender change: a
    # recovery window as after a fault, no longer.
    c = filtered(odd_sent_after_s=6.0)
    t0 = c.inserted_at[1]
    c.moves = [(t0 + 0.5, t0 + 1.0)]  # (last seen before, first seen after) the change
    assert c.judge().filter_stalls == []
    c = filtered()  # once the filter's messages flowed again after the change, it counts
    c.moves = [(t0 + 0.5, t0 + 1.0)]
    c.deliveries[1] = [(t0 + 7, "odd", 1)]
    (stall,) = c.judge().filter_stalls
    assert stall.key == ODD and abs(stall.began - (t0 + 7)) < 0.2 and stall.waiting[:2] == [3, 5]

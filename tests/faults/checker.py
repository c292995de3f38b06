"""The fault suite's judge: it knows nothing of the engine's bookkeeping.

It records every id the producer committed (and which are poison), every delivery (id,
subscriber, the attempt the message said, when it came off the stream), every ack call (ids,
and when it returned: by then the ack was committed) and every settlement call (release,
reject, renew: ids, when it started and returned, what it answered, the reason given), all on
this process's monotonic clock. At the end it reads the message table and its dead-letter
table with its own SQL (:func:`read_tables`) and judges:

- every id was delivered; every ordinary id was acked (in the table, time_acked set, by an
  ack call that returned, or that failed in a fault after its commit) and is not a dead
  letter, unless its own delivery log explains the death (below); every poison id is in the
  dead-letter table exactly once and not in the table; no id is in both tables or in neither;
- no id was delivered after it was acked (an ack call returned, or its time_acked), nor
  after it died (a reject that answered 1, or the dead letter's time_dead), nor before a
  release's delay or a renew's extension (that answered 1) ended, nor at an attempt past
  vt_max_attempts;
- two deliveries of one id are at least vt_ack_wait apart (a message is never in flight to two
  subscribers at once, whatever was killed), unless a release of it came between them;
- an id's deliveries never count back: each says which delivery it is (``attempt``, at least
  1), and a later delivery's attempt is never below an earlier one's (equal is allowed: a
  server killed between the send and the epoch's write sends the same attempt again);
- a dead letter's ``attempts`` is at least the highest attempt seen, at most vt_max_attempts,
  and exactly vt_max_attempts when nobody rejected it; its ``last_error`` is a reason a
  subscriber gave that id, or (none given) not empty;
- duplicates are counted, each with the reason its first delivery was not acked in time.

An ordinary id may die legitimately: vt_max_attempts counts sends, and faults eat them. The
checker accepts such a death only when its log shows it: a delivery at the last attempt that
was not acked within its ack wait (and why), or, when some sends never reached a subscriber
(a stream cut by a kill), every delivery it saw unacked for a known reason, no ack ever, and
at least as many faults around as sends it did not see. Each is reported, with its story.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

WIRE_SLACK_S = 0.5  # a delivery this soon after an ack returned was on the wire already
FAULT_WINDOW_S = 10.0  # faults this long before an id's first delivery may have eaten a send
LISTED = 20  # ids listed per finding in a report


@dataclass(frozen=True)
class Settled:
    """One settlement call as one id saw it."""

    verb: str  # "release", "reject" or "renew"
    sub: str
    start: float
    end: float
    # the call changed this id: True; did not: False; unknown (the call failed, or a batch's
    # count was between 0 and its size): None
    ok: bool | None
    span_s: float  # a release's delay, a renew's extension


@dataclass(frozen=True)
class DeadRow:
    id: int
    attempts: int | None
    last_error: str | None
    time_dead_ns: int | None


@dataclass
class Tables:
    """The message table and its dead-letter table at the end, as the checker's SQL read them."""

    source: dict[int, int | None]  # id -> time_acked
    dead: list[DeadRow]


def read_tables(db: sa.Engine, source: str, dead: str) -> Tables:
    with db.connect() as conn:
        rows = conn.exec_driver_sql(f"select id, time_acked from {source}").fetchall()
        dead_rows = conn.exec_driver_sql(
            f"select id, attempts, last_error, time_dead from {dead}"
        ).fetchall()
    return Tables(
        {int(i): acked for i, acked in rows},
        [DeadRow(int(i), a, e, t) for i, a, e, t in dead_rows],
    )


def read_pending(db: sa.Engine, source: str, dead: str) -> tuple[set[int], set[int]]:
    """(the ids unacked in the table, the ids in the dead-letter table): what the drain
    waits on, cheaply (by then the table's index finds few unacked rows)."""
    with db.connect() as conn:
        unacked = conn.exec_driver_sql(
            f"select id from {source} where time_acked is null"
        ).fetchall()
        dead_ids = conn.exec_driver_sql(f"select id from {dead}").fetchall()
    return {int(r[0]) for r in unacked}, {int(r[0]) for r in dead_ids}


class Checker:
    """Records what happened, from the outside, and judges it at the end."""

    def __init__(self, ack_wait_s: float, max_attempts: int = 0) -> None:
        self.ack_wait_s = ack_wait_s
        self.max_attempts = max_attempts  # vt_max_attempts (0: none)
        self.wall_offset_s = time.time() - time.monotonic()  # time_dead -> this clock
        self._lock = threading.Lock()
        self.inserted: set[int] = set()
        self.poison: set[int] = set()
        # id -> (when it came off the stream, subscriber, the attempt the message said)
        self.deliveries: dict[int, list[tuple[float, str, int]]] = defaultdict(list)
        self.first_ack: dict[int, float] = {}  # id -> when the first ack naming it returned
        self.unacked_on_purpose: dict[tuple[int, str], str] = {}  # (id, sub) -> why
        self.slow: set[tuple[int, str]] = set()  # held by a slow handler, renewed
        self.failed_acks: set[int] = set()
        self.late_acks: list[tuple[int, int]] = []  # (acked by the late call, ids in it)
        self.ack_calls = 0
        self.settlements: dict[int, list[Settled]] = defaultdict(list)
        self.reasons_given: dict[int, set[str]] = defaultdict(set)
        self.counts: Counter[str] = Counter()  # verb -> messages the calls said they changed
        self.events: list[tuple[float, str]] = []

    # -- recording -----------------------------------------------------------------------
    def event(self, what: str) -> None:
        with self._lock:
            self.events.append((time.monotonic(), what))

    def insert(self, ids: Sequence[int], poison: Iterable[int] = ()) -> None:
        with self._lock:
            self.inserted.update(ids)
            self.poison.update(poison)

    def delivered(self, batch: Sequence[tuple[int, int]], sub: str) -> None:
        """A batch came off the stream: (id, attempt) of each message."""
        now = time.monotonic()
        with self._lock:
            for i, attempt in batch:
                self.deliveries[i].append((now, sub, attempt))

    def dropped(self, ids: Sequence[int], sub: str, why: str) -> None:
        """The subscriber will not ack these (it is killed, stalled, or acks too late)."""
        with self._lock:
            for i in ids:
                self.unacked_on_purpose[(i, sub)] = why

    def held_slowly(self, ids: Sequence[int], sub: str) -> None:
        """A slow handler holds these past the ack wait, renewing them, then acks."""
        with self._lock:
            self.slow.update((i, sub) for i in ids)

    def acked(self, ids: Sequence[int]) -> None:
        now = time.monotonic()
        with self._lock:
            self.ack_calls += 1
            for i in ids:
                self.first_ack.setdefault(i, now)

    def ack_failed(self, ids: Sequence[int]) -> None:
        with self._lock:
            self.failed_acks.update(ids)

    def settled(
        self,
        verb: str,
        ids: Sequence[int],
        sub: str,
        start: float,
        count: int | None,
        span_s: float = 0.0,
        reason: str | None = None,
    ) -> None:
        """A release, reject or renew call of ``ids`` started at ``start`` returned now,
        answering ``count`` (None: it failed)."""
        end = time.monotonic()
        ok: bool | None = None  # a failed call (None), or a batch's count in between
        if count == len(ids):
            ok = True
        elif count == 0:
            ok = False
        with self._lock:
            self.counts[verb] += count or 0
            for i in ids:
                self.settlements[i].append(Settled(verb, sub, start, end, ok, span_s))
                if reason:
                    self.reasons_given[i].add(reason)

    def auto_renewed(self, count: int) -> None:
        """Messages a subscriber's auto-renewal (its leaser) renewed."""
        with self._lock:
            self.counts["renew"] += count

    # -- questions during the run -------------------------------------------------------------
    def was_released(self, i: int) -> bool:
        with self._lock:
            return any(s.verb == "release" and s.ok for s in self.settlements.get(i, ()))

    def unsettled(self, unacked: set[int], dead: set[int]) -> dict[str, list[int]]:
        """What is not settled yet, given the ids unacked in the table and the dead-letter
        table's ids ({} when everything is). The tables are the truth here: an ack whose
        answer was lost (its call failed in a fault, after the commit) settles too."""
        with self._lock:
            ordinary = self.inserted - self.poison
            out = {
                "ordinary ids unacked in the table": sorted(ordinary & unacked),
                "poison ids not dead": sorted(self.poison - dead),
                "unknown ids unacked in the table": sorted(unacked - self.inserted),
            }
        return {what: ids for what, ids in out.items() if ids}

    def all_acked(self) -> bool:
        with self._lock:
            return bool(self.inserted) and self.inserted <= self.first_ack.keys()

    def missing(self) -> int:
        with self._lock:
            return len(self.inserted - self.first_ack.keys())

    def history(self, i: int) -> str:
        """One id's story, with the faults around it, for a failure message."""
        with self._lock:
            ds = sorted(self.deliveries.get(i, []))
            acked = self.first_ack.get(i)
            settles = self.settlements.get(i, [])
            lines = [f"{t:.3f} delivered to {sub} (attempt {a})" for t, sub, a in ds]
            if acked is not None:
                lines.append(f"{acked:.3f} first ack returned")
            for s in settles:
                answer = {True: "1", False: "0", None: "?"}[s.ok]
                lines.append(f"{s.start:.3f} {s.verb} by {s.sub} ({s.span_s:g}s) -> {answer}")
            times = [float(line.split()[0]) for line in lines]
            if times:
                lo, hi = min(times) - 5, max(times) + 5
                lines += [f"{t:.3f} fault: {e}" for t, e in self.events if lo <= t <= hi]
            why = {s: w for (j, s), w in self.unacked_on_purpose.items() if j == i}
            kind = "poison" if i in self.poison else "ordinary"
        return f"id {i} ({kind}): " + "; ".join(sorted(lines)) + f"; not acked on purpose by {why}"

    # -- the verdict ---------------------------------------------------------------------
    def judge(self, tables: Tables | None = None) -> Report:
        """The report; with ``tables`` (the state at the end) also where every id ended."""
        r = Report(
            inserted=len(self.inserted),
            events=Counter(e for _, e in self.events),
            poison=len(self.poison),
            released=self.counts["release"],
            renewed=self.counts["renew"],
            rejected=self.counts["reject"],
        )
        with self._lock:
            dead = {} if tables is None else self._dead_rows(tables, r)
            died_at = self._died_at(dead)
            acked_at = self._acked_at(tables)
            r.never_delivered = sorted(self.inserted - self.deliveries.keys())[:LISTED]
            ordinary = self.inserted - self.poison
            # acked: its ack returned, or its ack call failed (in doubt) and the table says
            # the ack committed (the answer was lost in a fault)
            in_doubt = (acked_at.keys() & self.failed_acks) - self.first_ack.keys()
            r.acks_in_doubt_committed = len(in_doubt & ordinary)
            acked = self.first_ack.keys() | in_doubt
            r.never_acked = sorted(ordinary - acked - dead.keys())[:LISTED]
            r.poison_acked = sorted(self.poison & self.first_ack.keys())[:LISTED]
            r.unknown = sorted(self.deliveries.keys() - self.inserted)[:LISTED]
            for i, ds in self.deliveries.items():
                ds.sort()
                self._judge_deliveries(r, i, ds, died_at.get(i), acked_at.get(i))
            if tables is not None:
                self._judge_tables(r, tables, dead, died_at)
        return r

    def _dead_rows(self, tables: Tables, r: Report) -> dict[int, DeadRow]:
        seen = Counter(d.id for d in tables.dead)
        r.dead_twice = sorted(i for i, n in seen.items() if n > 1)[:LISTED]
        return {d.id: d for d in tables.dead}

    def _acked_at(self, tables: Tables | None) -> dict[int, float]:
        """When each id was acked at the latest, on this clock: the first ack call that
        returned, or its time_acked in the table, whichever came first."""
        out = dict(self.first_ack)
        if tables is not None:
            for i, acked_ns in tables.source.items():
                if acked_ns is not None:
                    t = acked_ns / 1e9 - self.wall_offset_s
                    out[i] = min(out.get(i, t), t)
        return out

    def _died_at(self, dead: dict[int, DeadRow]) -> dict[int, float]:
        """When each id was dead at the latest, on this clock: its dead letter's time_dead,
        or a reject of it that answered 1, whichever came first."""
        out: dict[int, float] = {}
        for i, row in dead.items():
            if row.time_dead_ns is not None:
                out[i] = row.time_dead_ns / 1e9 - self.wall_offset_s
        for i, settles in self.settlements.items():
            for s in settles:
                if s.verb == "reject" and s.ok:
                    out[i] = min(out.get(i, s.end), s.end)
        return out

    def _judge_deliveries(
        self,
        r: Report,
        i: int,
        ds: list[tuple[float, str, int]],
        died: float | None,
        acked_at: float | None,
    ) -> None:
        settles = self.settlements.get(i, [])
        releases = [s for s in settles if s.verb == "release"]
        for t, sub, attempt in ds:
            r.deliveries += 1
            r.attempts[attempt] += 1
            if acked_at is not None and t > acked_at + WIRE_SLACK_S:
                r.after_ack.append((i, sub, round(t - acked_at, 3)))
            if died is not None and t > died + WIRE_SLACK_S:
                r.after_dead.append((i, sub, round(t - died, 3)))
            if self.max_attempts and attempt > self.max_attempts:
                r.beyond_max.append((i, attempt))
            for s in settles:  # within a release's delay or a renew's extension
                ends = s.start + s.span_s
                if s.ok and s.end + WIRE_SLACK_S < t < ends - WIRE_SLACK_S:
                    r.early.append((i, s.verb, round(ends - t, 3)))
        if ds[0][2] < 1:
            r.attempts_back.append((i, 1, ds[0][2]))
        for (t1, s1, a1), (t2, _, a2) in itertools.pairwise(ds):
            if a2 < a1:
                r.attempts_back.append((i, a1, a2))
            r.duplicates += 1
            released = any(t1 <= s.start <= t2 for s in releases)
            if t2 - t1 < self.ack_wait_s - WIRE_SLACK_S and not released:
                r.in_flight_twice.append((i, round(t2 - t1, 3)))
            r.reasons[self._unacked_why(i, s1, released)] += 1

    def _released_after(self, i: int, sub: str, t: float) -> bool:
        """Whether ``sub`` released ``i`` after its delivery at ``t``."""
        return any(
            s.verb == "release" and s.sub == sub and s.start >= t
            for s in self.settlements.get(i, [])
        )

    def _unacked_why(self, i: int, sub: str, released: bool = False) -> str:
        why = self.unacked_on_purpose.get((i, sub))
        if why is not None:
            return why
        if released:
            return "released by its subscriber"
        if (i, sub) in self.slow:
            return "slow handler's renewal missed"
        return "ack failed" if i in self.failed_acks else "ack lost in a fault"

    def _judge_tables(
        self, r: Report, tables: Tables, dead: dict[int, DeadRow], died_at: dict[int, float]
    ) -> None:
        source = tables.source
        r.unknown += sorted((source.keys() | dead.keys()) - self.inserted)[:LISTED]
        r.in_both = sorted(source.keys() & dead.keys())[:LISTED]
        r.in_neither = sorted(self.inserted - source.keys() - dead.keys())[:LISTED]
        for i in sorted(self.poison):
            if i in dead:
                r.dead_poison += 1
            elif i in source:
                state = "acked" if source[i] is not None else "unacked in the table"
                r.poison_not_dead.append((i, state))
        for i in sorted(self.inserted - self.poison):
            if i in source and source[i] is None:
                r.ordinary_unacked.append(i)
            if i not in dead:
                continue
            why = self._why_dead(i, died_at.get(i))
            if why is None:
                r.dead_unexplained.append(i)
            else:
                r.dead_explained.append((i, why))
        for i, row in dead.items():
            self._judge_dead_letter(r, i, row)

    def _judge_dead_letter(self, r: Report, i: int, row: DeadRow) -> None:
        seen = max((a for _, _, a in self.deliveries.get(i, [])), default=0)
        attempts = row.attempts if row.attempts is not None else -1
        n = self.max_attempts
        rejected = any(s.verb == "reject" for s in self.settlements.get(i, []))
        if attempts < seen:
            r.attempts_short.append((i, attempts, seen))
        elif n and (attempts > n or (not rejected and attempts != n)):
            r.attempts_off.append((i, attempts, n))
        given = self.reasons_given.get(i)
        if (given and row.last_error not in given) or not row.last_error:
            r.bad_reason.append((i, row.last_error))

    def _why_dead(self, i: int, died: float | None) -> str | None:
        """Why an ordinary id died, as the checker's own log shows it (None: it does not)."""
        n = self.max_attempts
        ds = sorted(self.deliveries.get(i, []))
        acked_at = self.first_ack.get(i)
        if not n or not ds:
            return None
        for t, sub, a in reversed(ds):  # the last attempt, not acked within its ack wait
            if a >= n and (acked_at is None or acked_at >= t + self.ack_wait_s - WIRE_SLACK_S):
                late = "" if acked_at is None else f" (first ack {acked_at - t:.1f}s after)"
                why = self._unacked_why(i, sub, self._released_after(i, sub, t))
                return f"attempt {a} of {n} to {sub}: {why}{late}"
        if acked_at is not None or died is None:
            return None
        # sends the checker never saw (a stream cut by a kill): every delivery it did see
        # unacked for a known reason, and at least as many faults around as sends unseen
        whys = [self._unacked_why(i, sub, self._released_after(i, sub, t)) for t, sub, _ in ds]
        if "ack lost in a fault" in whys:
            return None
        unseen = n - len({a for _, _, a in ds if a <= n})
        faults = [e for t, e in self.events if ds[0][0] - FAULT_WINDOW_S <= t <= died]
        if len(faults) < unseen:
            return None
        seen = sorted({a for _, _, a in ds})
        return (
            f"attempts {seen} of {n} seen, each unacked ({', '.join(sorted(set(whys)))}); "
            f"{unseen} sends unseen, amid {len(faults)} faults"
        )


@dataclass
class Report:
    inserted: int
    events: Counter[str]
    poison: int = 0
    deliveries: int = 0
    duplicates: int = 0
    released: int = 0
    renewed: int = 0
    rejected: int = 0
    dead_poison: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    never_delivered: list[int] = field(default_factory=list)
    never_acked: list[int] = field(default_factory=list)  # ordinary, not dead either
    acks_in_doubt_committed: int = 0  # ack calls failed in a fault, found acked in the table
    unknown: list[int] = field(default_factory=list)
    after_ack: list[tuple[int, str, float]] = field(default_factory=list)
    after_dead: list[tuple[int, str, float]] = field(default_factory=list)
    # (id, "release" / "renew", how long before the delay / extension ended)
    early: list[tuple[int, str, float]] = field(default_factory=list)
    in_flight_twice: list[tuple[int, float]] = field(default_factory=list)
    attempts: Counter[int] = field(default_factory=Counter)  # attempt -> deliveries saying it
    # (id, the attempt it had reached, the lower attempt a later delivery said)
    attempts_back: list[tuple[int, int, int]] = field(default_factory=list)
    beyond_max: list[tuple[int, int]] = field(default_factory=list)  # (id, attempt)
    # where ids ended (with the tables)
    poison_acked: list[int] = field(default_factory=list)  # an ack of poison returned
    poison_not_dead: list[tuple[int, str]] = field(default_factory=list)
    ordinary_unacked: list[int] = field(default_factory=list)
    dead_explained: list[tuple[int, str]] = field(default_factory=list)
    dead_unexplained: list[int] = field(default_factory=list)
    in_both: list[int] = field(default_factory=list)
    in_neither: list[int] = field(default_factory=list)
    dead_twice: list[int] = field(default_factory=list)
    attempts_short: list[tuple[int, int, int]] = field(default_factory=list)  # (id, col, seen)
    attempts_off: list[tuple[int, int, int]] = field(default_factory=list)  # (id, col, max)
    bad_reason: list[tuple[int, str | None]] = field(default_factory=list)

    def violations(self) -> dict[str, list[object]]:
        """Every finding that fails the run, by what it means ({} when none)."""
        found: dict[str, list[object]] = {
            "never delivered": list(self.never_delivered),
            "ordinary ids never acked (by a call that returned, or failed and committed)": list(
                self.never_acked
            ),
            "unknown ids": list(self.unknown),
            "delivered after their ack (id, sub, s)": list(self.after_ack),
            "delivered after they died (id, sub, s)": list(self.after_dead),
            "delivered within a release's delay or a renewal (id, verb, s)": list(self.early),
            "in flight to two subscribers at once (id, gap s)": list(self.in_flight_twice),
            "attempts counting back (id, reached, then)": list(self.attempts_back),
            "delivered past vt_max_attempts (id, attempt)": list(self.beyond_max),
            "poison acked": list(self.poison_acked),
            "poison not in the dead-letter table (id, state)": list(self.poison_not_dead),
            "ordinary ids unacked in the table": list(self.ordinary_unacked),
            "ordinary ids dead without explanation": list(self.dead_unexplained),
            "in both tables": list(self.in_both),
            "in neither table": list(self.in_neither),
            "dead twice": list(self.dead_twice),
            "dead letter's attempts below what was seen (id, attempts, seen)": list(
                self.attempts_short
            ),
            "dead letter's attempts not vt_max_attempts (id, attempts, max)": list(
                self.attempts_off
            ),
            "dead letter's last_error not a reason given (id, last_error)": list(self.bad_reason),
        }
        return {what: ids for what, ids in found.items() if ids}

    def summary(self) -> str:
        faults = ", ".join(f"{n} {what}" for what, n in sorted(self.events.items()))
        reasons = ", ".join(f"{n} {why}" for why, n in self.reasons.most_common())
        explained = len(self.dead_explained)
        return (
            f"{self.inserted:,} messages inserted ({self.poison:,} poison), "
            f"{self.deliveries:,} deliveries, {self.duplicates:,} duplicates "
            f"({reasons or 'none'}); faults: {faults}; released {self.released:,}, renewed "
            f"{self.renewed:,}, rejected {self.rejected:,}; dead: {self.dead_poison:,} poison, "
            f"{explained} other (explained), {len(self.dead_unexplained)} other unexplained; "
            f"never delivered {len(self.never_delivered)}, never acked "
            f"{len(self.never_acked)} (acks in doubt found committed "
            f"{self.acks_in_doubt_committed}), delivered after their ack {len(self.after_ack)}, "
            f"after they died {len(self.after_dead)}, early {len(self.early)}, "
            f"in flight to two subscribers at once {len(self.in_flight_twice)}, "
            f"attempts counting back {len(self.attempts_back)}; deliveries by attempt "
            f"{dict(sorted(self.attempts.items()))}"
        )

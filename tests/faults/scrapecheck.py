"""The fault suite's operator view (issue 19): a scraper polls both servers' ``/metrics``
(--metrics-listen) and ``/api/state`` (--http) every SCRAPE_EVERY_S through the whole run,
SIGKILLs, SIGTERMs and database restarts included, and :func:`judge` decides afterwards,
from what it recorded only:

(a) a live server (chaos.ServerProcess.live_pid: from the moment it answers until just before
    it is signalled) answers each scrape within BOUND_S, valid Prometheus text, even while
    the database is down (and says so: database_up 0 at least once during a restart);
(b) within one server process and one lease tenure (msgtable_lease_gains_total unchanged,
    and the series' table's msgtable_table_sender, or for a series of no table
    msgtable_lease_holder),
    no counter goes down (a series that vanished from a scrape starts again at zero: its
    table was opened again);
(c) at quiescent points (both servers live for QUIET_S, no database restart, fault of a
    database link or change of the tables' senders in it: a state that lasts is judged)
    exactly one server reports msgtable_table_sender 1 for each table (the servers share the
    tables: msgtable.engine.placement), and both /api/state name the same sender of each;
(d) after the drain, each table's sender's backlog (due + scheduled, its /api/state and its
    metrics) is what the checkers know is unacked (0), and the dashboard counts the dead
    letters the checkers know of, each table's and each subscription's
    (:meth:`Scraper.settled`).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# A live server answers a scrape within this long: the slowest seen was 1.1 s at load
# average 5 and 2.5 s at load average 12 on the shared 2-core machine (a margin of 2x)
BOUND_S = 5.0
SCRAPE_EVERY_S = 0.5
TIMEOUT_S = 10.0  # a scrape's own time-out: past BOUND_S, so a slow answer is measured
QUIET_S = 4.0  # two lease periods and a margin: a quiescent point's calm before it
# A server learns the database is down from a statement that fails: the lease holder's next
# poll, the other server's next lease attempt (every third of the fault suite's 1 s lease
# period); a scrape this soon after the database stopped may still say database_up 1
NOTICE_S = 1.0
SETTLE_TIMEOUT_S = 30.0  # the backlog is read at most every 5 s: (d) waits this long


@dataclass
class Scrape:
    """One scrape of one server's /metrics or /api/state."""

    server: str
    kind: str  # "metrics" | "state"
    began: float
    took_s: float
    pid: int | None  # the live pid when it began (None: not live)
    live: bool  # live from its start to its end, the same process
    error: str | None = None
    counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    lease_holder: float | None = None
    senders: dict[str, float] = field(default_factory=dict)  # msgtable_table_sender by table
    database_up: float | None = None
    state: dict[str, Any] | None = None


def _gains(s: Scrape) -> float:
    """msgtable_lease_gains_total as the scrape read it: a new value, a new lease tenure."""
    return _total(s, "msgtable_lease_gains_total")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
        if answer.status != 200:
            raise OSError(f"status {answer.status}")
        return bytes(answer.read())


def _total(s: Scrape, name: str) -> float:
    """A counter's value in a scrape, summed over its labels (0 when absent)."""
    return sum(v for (n, _), v in s.counters.items() if n == name)


def scrape_metrics(server: Any) -> Scrape:
    pid = server.live_pid
    began = time.monotonic()
    s = Scrape(server.name, "metrics", began, 0.0, pid, False)
    try:
        text = _get(f"http://{server.metrics_address}/metrics").decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if family.type == "counter" and sample.name.endswith("_total"):
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    s.counters[key] = sample.value
                elif sample.name == "msgtable_lease_holder":
                    s.lease_holder = sample.value
                elif sample.name == "msgtable_table_sender":
                    s.senders[sample.labels["table"]] = sample.value
                elif sample.name == "msgtable_database_up":
                    s.database_up = sample.value
                elif sample.name in ("msgtable_messages_due", "msgtable_messages_scheduled"):
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    s.counters[key] = sample.value  # gauges: (d) reads them, (b) skips them
    except Exception as exc:  # any failure is the verdict's to judge
        s.error = f"{type(exc).__name__}: {str(exc)[:200]}"
    s.took_s = time.monotonic() - began
    s.live = pid is not None and server.live_pid == pid
    return s


def scrape_state(server: Any) -> Scrape:
    pid = server.live_pid
    began = time.monotonic()
    s = Scrape(server.name, "state", began, 0.0, pid, False)
    try:
        s.state = json.loads(_get(f"http://{server.http_address}/api/state"))
    except Exception as exc:
        s.error = f"{type(exc).__name__}: {str(exc)[:200]}"
    s.took_s = time.monotonic() - began
    s.live = pid is not None and server.live_pid == pid
    return s


class Scraper(threading.Thread):
    """Scrapes every server every SCRAPE_EVERY_S until :meth:`stop`; records each scrape."""

    def __init__(self, servers: Sequence[Any]) -> None:
        super().__init__(daemon=True, name="chaos-scraper")
        self.servers = list(servers)
        self.scrapes: list[Scrape] = []
        self.rounds: list[list[Scrape]] = []
        self._halt = threading.Event()
        self.settled_found: dict[str, Any] = {}

    def run(self) -> None:
        while not self._halt.is_set():
            found: list[Scrape] = []
            for server in self.servers:
                found += [scrape_metrics(server), scrape_state(server)]
            self.scrapes += found
            self.rounds.append(found)
            self._halt.wait(SCRAPE_EVERY_S)

    def stop(self) -> None:
        self._halt.set()
        self.join(TIMEOUT_S * 4 + 5)

    def settled(self, groups: Sequence[tuple[str, str]], dead_tables: Sequence[str]) -> None:
        """(d), after the drain: wait (up to SETTLE_TIMEOUT_S) until each table's sender
        reports no backlog for every (table, subscription) in ``groups``; record what they
        reported, the dashboard's dead-letter count of each of ``dead_tables``' tables, and
        the dead count the sender's state gives each subscription in ``groups`` (as
        "TABLE/SUBSCRIPTION": counted in the database, as ListTables counts it)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        found: dict[str, Any] = {}
        while True:
            found = {
                "leader": None,  # a server that answered (the dead letters are asked there)
                "senders": {},  # table -> the server that sends it, as its state says
                "groups": list(groups),
                "backlog": {},
                "metrics_backlog": {},
                "dead": {},
            }
            for server in self.servers:
                state = scrape_state(server).state
                if state is None:
                    continue
                found["leader"] = found["leader"] or server.name
                sent = {t["name"] for t in state["tables"] if t.get("sending")}
                for table in sent:
                    found["senders"][table] = server.name
                for t in state["tables"]:
                    key = (t["name"], t["subscription"])
                    if key in groups and t["name"] in sent:
                        b = t["backlog"]
                        found["backlog"][key] = (b["due"], b["scheduled"])
                        if t["subscription"]:
                            found["dead"][f"{t['name']}/{t['subscription']}"] = t["dead"]
                m = scrape_metrics(server)
                for (name, labels), value in m.counters.items():
                    d = dict(labels)
                    key = (d.get("table", ""), d.get("subscription", ""))
                    if (
                        key in groups
                        and key[0] in sent
                        and name
                        in (
                            "msgtable_messages_due",
                            "msgtable_messages_scheduled",
                        )
                    ):
                        found["metrics_backlog"][key] = found["metrics_backlog"].get(key, 0) + value
            if (
                found["leader"] is not None
                and all(found["backlog"].get(g) == (0, 0) for g in groups)
                and all(found["metrics_backlog"].get(g) == 0 for g in groups)
            ) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        for server in self.servers:
            if server.name != found["leader"]:
                continue
            for table in dead_tables:
                try:
                    body = _get(f"http://{server.http_address}/api/dead?table={table}&limit=1")
                    found["dead"][table] = json.loads(body)["count"]
                except Exception as exc:
                    found["dead"][table] = f"{type(exc).__name__}: {exc}"
        self.settled_found = found


@dataclass
class ScrapeReport:
    """What the scrapes showed, and what broke."""

    scrapes: int = 0
    live_scrapes: int = 0
    slowest_live_s: float = 0.0
    slowest: str = ""  # which scrape that was
    slowest_by_kind: dict[str, float] = field(default_factory=dict)  # metrics, state
    down_answers: int = 0  # live scrapes that said database_up 0
    quiescent_rounds: int = 0
    # rounds whose tables' senders (each server's msgtable_table_sender, and whom its
    # /api/state names) differ from the round before: a takeover, a table handed over or
    # given back, or lost on a stall (a busy machine)
    lease_changes: int = 0
    # over every server process (its last scrape): lease renewals back after their validity
    # (sends paused, no loss) and postpones a late demotion did not write
    late_renewals: int = 0
    postpones_skipped: int = 0
    processes: int = 0
    settled_judged: bool = False  # (d) asked after the drain
    violations: dict[str, list[str]] = field(default_factory=dict)

    def add(self, what: str, detail: str) -> None:
        self.violations.setdefault(what, []).append(detail)

    def summary(self) -> str:
        return (
            f"scrapes: {self.scrapes} ({self.live_scrapes} of live servers, the slowest "
            f"{self.slowest_live_s:.2f}s: {self.slowest}; by kind "
            + ", ".join(f"{k} {v:.2f}s" for k, v in sorted(self.slowest_by_kind.items()))
            + f"; bound {BOUND_S:g}s); "
            f"{self.down_answers} said the "
            f"database was down; {self.quiescent_rounds} quiescent rounds; "
            f"{self.lease_changes} changes of the tables' senders seen; "
            f"{self.late_renewals} late lease renewals, {self.postpones_skipped} postpones "
            "skipped; "
            f"{self.processes} server processes"
            + ("" if self.settled_judged else "; (d) not judged: the drain did not end")
        )


def judge(
    scraper: Scraper,
    database_down: Sequence[tuple[float, float]],
    expected_dead: dict[str, int],
    unquiet: Sequence[tuple[float, float]] = (),
) -> ScrapeReport:
    """The verdict on (a) to (d); ``database_down`` the times (stopped, answering again) of
    each database restart: from the moment its process was gone, not from the restart's start
    (a graceful stop of the database can take seconds on a busy machine);
    ``expected_dead`` the checkers' dead messages by table; ``unquiet`` the times (began,
    over) of faults of a server's database link (silent, slow, reset): no quiescent point
    within QUIET_S of one, as of a restart (a server cut off cannot read the lease)."""
    r = ScrapeReport(scrapes=len(scraper.scrapes))
    # (a)
    for s in scraper.scrapes:
        if not s.live:
            continue
        r.live_scrapes += 1
        r.slowest_by_kind[s.kind] = max(s.took_s, r.slowest_by_kind.get(s.kind, 0.0))
        restart = any(b <= s.began <= o for b, o in database_down)
        linked = any(b <= s.began + s.took_s and s.began <= o for b, o in unquiet)
        why = " (database down)" if restart else " (database link fault)" if linked else ""
        if s.took_s > r.slowest_live_s:
            r.slowest_live_s = s.took_s
            r.slowest = f"{s.server} {s.kind}{why}"
        if s.error is not None:
            what = f"{s.server} {s.kind} {s.began:.3f}: {s.error}"
            r.add("(a) a live server did not answer", what)
        elif s.took_s > BOUND_S:
            what = f"{s.server} {s.kind} {s.took_s:.2f}s{why}"
            r.add("(a) a live server answered too late", what)
        if s.database_up == 0:
            r.down_answers += 1
    during = [
        s
        for s in scraper.scrapes
        if s.live
        and s.kind == "metrics"
        and any(b + NOTICE_S <= s.began and s.began + s.took_s <= o for b, o in database_down)
    ]
    if during and not any(s.database_up == 0 for s in during):
        r.add(
            "(a) no live server said database_up 0 while the database was down",
            f"{len(during)} scrapes during restarts, all database_up 1",
        )
    # (b): by (server, pid, lease tenure)
    last: dict[tuple[str, int], Scrape] = {}
    pids = set()
    for s in scraper.scrapes:
        if s.kind != "metrics" or s.error is not None or s.pid is None:
            continue
        pids.add((s.server, s.pid))
        before = last.get((s.server, s.pid))
        last[(s.server, s.pid)] = s
        if before is None or _gains(before) != _gains(s):  # a table gained since
            continue  # a new process, or a new tenure: counters may start again
        for key, value in s.counters.items():
            if not key[0].endswith("_total"):
                continue
            table = dict(key[1]).get("table")
            if table is None and before.lease_holder != s.lease_holder:
                continue  # a server-wide series over a change of what this server sends
            if table is not None and before.senders.get(table) != s.senders.get(table):
                continue  # its table was lost or handed over: its counters start again
            old = before.counters.get(key)
            if old is not None and value < old:
                r.add(
                    "(b) a counter went down",
                    f"{s.server} pid {s.pid} {key[0]}{dict(key[1])}: {old:g} -> {value:g} "
                    f"at {s.began:.3f}",
                )
    r.processes = len(pids)
    for s in last.values():  # each process's last word: counters since it started
        r.late_renewals += int(_total(s, "msgtable_lease_late_renewals_total"))
        r.postpones_skipped += int(_total(s, "msgtable_postpones_skipped_total"))
    # (c)
    calm_since: dict[str, float] = {}
    seen: tuple[tuple[str, str, object], ...] | None = None
    changed_at = float("-inf")  # when the holders last differed from the round before
    for found in scraper.rounds:
        at = min(s.began for s in found)
        # each server's table sender gauges, and whom its /api/state names the senders of
        # the tables (scraped a moment apart: either may show a change first)
        now = tuple(
            sorted(
                (s.server, s.kind, repr(sorted(s.senders.items())))
                if s.kind == "metrics"
                else (s.server, s.kind, repr(_senders_of(s.state)))
                for s in found
            )
        )
        if seen is not None and now != seen:
            r.lease_changes += 1
            changed_at = at
        seen = now
        for name in {s.server for s in found}:
            mine = [s for s in found if s.server == name]
            if not all(s.live and s.error is None for s in mine):
                calm_since.pop(name, None)
            else:
                calm_since.setdefault(name, at)
        names = {s.server for s in found}
        calm = all(name in calm_since and at - calm_since[name] >= QUIET_S for name in names)
        restarts = any(b - QUIET_S <= at <= o + QUIET_S for b, o in [*database_down, *unquiet])
        moving = at - changed_at < QUIET_S  # a lease changing hands: judged once it settles
        if not calm or restarts or moving:
            continue
        r.quiescent_rounds += 1
        metrics = [s for s in found if s.kind == "metrics"]
        for table in sorted({t for s in metrics for t in s.senders}):
            holders = [s.server for s in metrics if s.senders.get(table) == 1]
            if len(holders) != 1:
                r.add(
                    "(c) not exactly one sender of a table at a quiescent point",
                    f"{at:.3f}: {table}: {holders}",
                )
        states = [s for s in found if s.kind == "state" and s.state]
        for table in sorted({t for s in states for t in _senders_of(s.state)}):
            named = {_senders_of(s.state).get(table) for s in states}
            if len(named) != 1 or "" in named or None in named:
                who = sorted((s.server, _senders_of(s.state).get(table)) for s in states)
                r.add(
                    "(c) the servers name different senders of a table",
                    f"{at:.3f}: {table}: {who}",
                )
    # (d)
    found = scraper.settled_found
    r.settled_judged = bool(found)
    if not found:
        pass  # not asked (the drain left ids that cannot settle: the suite says which)
    elif found.get("leader") is None:
        r.add("(d) no server answered after the drain", repr(found))
    else:
        for key in found["groups"]:
            if key not in found["backlog"] or key not in found["metrics_backlog"]:
                r.add("(d) no sender of the table reports the backlog of", f"{key}: {found}")
        for key, backlog in found["backlog"].items():
            if backlog != (0, 0):
                r.add("(d) a backlog after the drain (due, scheduled)", f"{key}: {backlog}")
        for key, n in found["metrics_backlog"].items():
            if n != 0:
                r.add("(d) a backlog in the metrics after the drain", f"{key}: {n:g}")
        for table, n in expected_dead.items():
            if found["dead"].get(table) != n:
                r.add(
                    "(d) the dashboard's dead letters differ from the checker's",
                    f"{table}: the dashboard {found['dead'].get(table)}, the checker {n}",
                )
    return r


def sender_changes(rounds: Sequence[Sequence[Scrape]], table: str) -> list[tuple[float, float]]:
    """When the scrapes saw ``table``'s sender change (each server's msgtable_table_sender):
    (began, over) of each change, from the last scrape that saw the server as before to the
    end of the one that saw it changed (a takeover, a hand-over, a lease lost on a busy
    machine). A failed scrape saw nothing; a server's first scrape is where it starts."""
    seen: dict[str, tuple[float, float]] = {}  # server -> (its gauge, when last read)
    out: list[tuple[float, float]] = []
    for found in rounds:
        began = over = None
        for s in found:
            if s.kind != "metrics" or s.error is not None:
                continue
            value = s.senders.get(table, 0.0)
            before, last = seen.get(s.server, (value, s.began))
            seen[s.server] = (value, s.began)
            if value != before:
                began = last if began is None else min(began, last)
                over = max(over or 0.0, round(s.began + s.took_s, 6))
        if began is not None and over is not None:
            out.append((began, over))
    return out


def _skipped(s: Scrape, table: str) -> float:
    """msgtable_postpones_skipped_total of ``table`` in a scrape (0: none skipped yet)."""
    return s.counters.get(("msgtable_postpones_skipped_total", _keyed(s, table)), 0.0)


def _keyed(s: Scrape, table: str) -> tuple[tuple[str, str], ...]:
    """The labels of ``table``'s sample of msgtable_postpones_skipped_total in ``s``."""
    for name, labels in s.counters:
        if name == "msgtable_postpones_skipped_total" and ("table", table) in labels:
            return labels
    return ()


def count_losses(rounds: Sequence[Sequence[Scrape]], table: str) -> list[tuple[str, float, float]]:
    """When a server did not write the postpones of its sends of ``table``
    (msgtable_postpones_skipped_total{table} rose: it lost the table with its lease ended
    too long before its close, as msgtable.engine.tenure.may_postpone says, or the placement
    row's fence kept a postpone out; the counts of those sends are lost): (the server,
    began, over), from the last scrape that saw it send ``table`` before the rise (its
    lease may have ended any time after: another server may settle its messages from then
    on; the scrape before the rise if none did) to the end of the one that saw the rise, in
    the same process (a restart starts the counter again)."""
    last: dict[str, Scrape] = {}  # server -> its previous metrics scrape
    sending: dict[str, float] = {}  # server -> the last scrape that saw it send ``table``
    out: list[tuple[str, float, float]] = []
    for found in rounds:
        for s in found:
            if s.kind != "metrics" or s.error is not None:
                continue
            before = last.get(s.server)
            last[s.server] = s
            if before is None or before.pid != s.pid:
                sending.pop(s.server, None)
                continue
            if before.senders.get(table) == 1.0:
                sending[s.server] = before.began
            if _skipped(s, table) > _skipped(before, table):
                out.append((s.server, sending.get(s.server, before.began), s.began + s.took_s))
    return [(server, began, round(over, 6)) for server, began, over in out]


def loss_evidence(rounds: Sequence[Sequence[Scrape]], table: str) -> list[list[object]]:
    """What count_losses reads, kept in the run's report: each metrics scrape's server, pid,
    began, took_s, whether it sent ``table`` and its msgtable_postpones_skipped_total{table}."""
    return [
        [
            s.server,
            s.pid,
            round(s.began, 3),
            round(s.took_s, 3),
            s.senders.get(table),
            _skipped(s, table),
        ]
        for found in rounds
        for s in found
        if s.kind == "metrics" and s.error is None
    ]


def _senders_of(state: dict[str, Any] | None) -> dict[str, object]:
    """The sender a server's /api/state answer names of each table (subscriptions go with
    their table)."""
    if not state:
        return {}
    return {t["name"]: t.get("sender") for t in state.get("tables", []) if not t["subscription"]}
